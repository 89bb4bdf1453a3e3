"""A warm candidate driver for ``jobs bisect`` (jobs/bisect.py, ``Runner``).

Not imported: its source is run as ``python -c SOURCE ADDRESS POOL WARM LOG
WARMUP`` with a candidate commit's worktree as working directory and PYTHONPATH, so
everything it imports (``jobs.__main__.main``, ``jobs.session.ray_session``)
is that commit's code, and so are its rank workers (Ray puts the driver's
working directory first on their ``sys.path``). It joins the cluster at
ADDRESS once, starts a standing pool named POOL with WARM workers through
the commit's own ``python -m jobs pool start`` (POOL ``-``: none), runs the
warm-up request WARMUP (a request as below, as JSON; ``-``: none; what it
does on first use, e.g. the topology discovery's task worker, is done
before the driver says it is ready), then runs one ``python -m jobs``
command line per request, in this process, while Ray and the pool's workers
stay up: a later run of the same commit pays neither the driver's start nor
its ranks' imports again.

Protocol (one JSON object a line): stdin brings requests ``{"argv": [...],
"output": PATH}``; the original stdout answers, first ``{"ready": true}``
(or ``{"ready": false, "error": ...}``, then the process exits), then one
``{"code": EXIT, "error": TEXT | null}`` a request. Everything the commit's
code writes to fd 1 and 2 goes to the request's ``output`` file (to LOG
outside requests). EOF on stdin stops the pool and leaves Ray.
"""

import json
import os
import sys
import traceback


def _to(path: str) -> None:
    """fds 1 and 2 (Python's and any C library's writes) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _run(main, request: dict, log: str) -> tuple[int | None, str | None]:
    """``main(request["argv"])`` with its output in ``request["output"]``:
    (its exit status, None; or None and the traceback where it raised)."""
    _to(request["output"])
    code, error = None, None
    try:
        code = main(request["argv"])
    except BaseException:  # noqa: BLE001 - answered; the bisect decides
        error = traceback.format_exc(limit=5)
        print(error, flush=True)
    _to(log)
    return code, error


def serve(address: str, pool: str, warm: int, log: str, warmup: str) -> int:
    """Serve until EOF on stdin (the module's docstring); the exit status."""
    answer = os.fdopen(os.dup(1), "w", buffering=1)
    _to(log)

    def say(**what) -> None:
        answer.write(json.dumps(what) + "\n")
        answer.flush()

    try:
        from jobs.__main__ import main
        from jobs.session import ray_session
    except Exception:  # noqa: BLE001 - this commit cannot be driven warm
        say(ready=False, error=traceback.format_exc(limit=3))
        return 1
    with ray_session(address):
        pooled = pool != "-"
        if pooled:
            code = main(["pool", "start", "--name", pool, "--address", address,
                         "--warm", str(warm)])
            if code != 0:
                say(ready=False, error=f"python -m jobs pool start --name {pool}: exit {code} "
                                       f"(its output: {log})")
                return 1
        try:
            if warmup != "-":
                _run(main, json.loads(warmup), log)
            say(ready=True)
            for line in sys.stdin:
                code, error = _run(main, json.loads(line), log)
                say(code=code, error=error)
        finally:
            if pooled:
                main(["pool", "stop", "--name", pool, "--address", address])
    return 0


if __name__ == "__main__":
    address, pool, warm, log, warmup = sys.argv[1:6]
    sys.exit(serve(address, pool, int(warm), log, warmup))
