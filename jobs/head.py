"""A local Ray head for ``ray job submit`` (``python -m jobs head start|stop``)
and what ``python -m jobs submit`` needs to reach one.

``start`` runs ``ray start --head --block`` in its own session with token
authentication (``RAY_AUTH_MODE=token``; the token is a 0600 file in the
head directory, passed to Ray as ``RAY_AUTH_TOKEN_PATH``), every server on
127.0.0.1 (Ray's loopback switch, :data:`jobs.embedded.LOOPBACK_ENV`, as for
the embedded cluster: without it the GCS, raylet and agents listen on every
interface), or, with ``host``, on that address of this machine (for nodes
and submitters elsewhere; the token is then what keeps the cluster yours),
and every port free when it starts (none of Ray's fixed defaults:
6379, 8265, 52365, 10001 may belong to another cluster on the machine;
chosen together, so distinct, and a start whose port was taken before Ray
bound it started again on fresh ports: :func:`start`). It
returns once the head's job agent answers (the agent, not the dashboard,
takes a submitted job: a submit before it is up fails with "No available
agent"), and records the head in ``DIR/head.json``. Without Ray's
dashboard packages (a minimal ``ray`` install; ``dashboard``: auto, on,
off) the head runs without the dashboard and so without a job server: it is
ready once its GCS answers, its state records why
(:func:`no_job_server`), and what needs the job server refuses it
(:func:`job_server_url`) while what joins the GCS (pools, ``--pool NAME``)
does not care. ``stop`` ends that
process group (SIGTERM, then SIGKILL), never ``ray stop``, which stops every
Ray on the machine.

Auth, as Ray 2.60 does it (``ray._private.authentication``): the mode comes
from ``RAY_AUTH_MODE`` (``token`` or ``disabled``); the token from
``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``, else
``~/.ray/auth_token``; HTTP clients send ``Authorization: Bearer <token>``.
``/api/version`` and the ``*healthz`` paths answer without a token.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cluster import procs
from jobs import ray_token
from jobs.config import ConfigError
from jobs.embedded import LOOPBACK_ENV, START_ATTEMPTS, WORKER_ENV
from jobs.exits import InfraError

HEAD_DIR_ENV = "LAMPORT_HEAD_DIR"
DEFAULT_HEAD_DIR = Path(".ray-head")
TOKEN_FILE = "auth_token"
STATE_FILE = "head.json"
LOG_FILE = "head.log"
LOG_HEADER = "# lamport-lab: log of `python -m jobs head start` (ray start --head)\n"
"""The first line of every head log: a head.log without it is someone
else's file, which ``start`` refuses to write over."""


DASHBOARD_MODES = ("auto", "on", "off")


def dashboard_dependency_error() -> ImportError | None:
    """Why Ray's dashboard cannot run here (the ImportError of its
    packages, as Ray itself checks before ``--include-dashboard true``),
    None when it can."""
    from ray._private.utils import get_dashboard_dependency_error
    return get_dashboard_dependency_error()


def decide_dashboard(mode: str) -> str | None:
    """Whether the head runs the dashboard (and with it the job server):
    None when it does, else why not, in words. ``auto``: where Ray's
    dashboard packages import; ``on``: always, ConfigError (exit 2) where
    they do not; ``off``: never."""
    if mode not in DASHBOARD_MODES:
        raise ConfigError(f"--dashboard {mode!r}: one of {', '.join(DASHBOARD_MODES)}")
    if mode == "off":
        return "--dashboard off"
    error = dashboard_dependency_error()
    if error is None:
        return None
    if mode == "on":
        raise ConfigError(f"--dashboard on: Ray's dashboard packages do not import here "
                          f"({error}); install them (ray[default]) or give --dashboard "
                          f"auto|off for a head without the job server")
    return f"ray minimal: {error}"


def no_job_server(state: dict) -> str | None:
    """Why the recorded head ``state`` has no job server (it runs without
    the dashboard), None when it has one."""
    return None if state.get("dashboard") else (state.get("no_dashboard") or "no dashboard")


def describe(state: dict) -> str:
    """The recorded head in a few words: its job server, else its GCS."""
    return state["dashboard"] or f"GCS {state['address']}, no dashboard"


def head_dir(given: Path | None = None) -> Path:
    """``--dir``, else ``$LAMPORT_HEAD_DIR``, else ``.ray-head``."""
    return Path(given or os.environ.get(HEAD_DIR_ENV) or DEFAULT_HEAD_DIR)


LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports free on ``host`` now. Every socket is held
    until all are chosen: a port picked by binding port 0 and closing the
    socket may be picked again by the next bind, and two of a head's servers
    given one port is a head that does not start (Ray refuses it, issue
    64). A choice, not a reservation: another process may take a port
    before its server binds it (:func:`start` retries such a head)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            s = held.enter_context(socket.socket(family))
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
        return ports


def free_port(host: str = LOOPBACK) -> int:
    """One port free on ``host`` now (:func:`free_ports`)."""
    return free_ports(1, host)[0]


def check_host(host: str) -> str:
    """``host`` if it is an IP address of this machine (a server can listen
    on it), else ConfigError naming it."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"--host {host!r}: give an IP address of this machine, e.g. "
                          f"{LOOPBACK} (the default) or its address on the cluster's "
                          f"network") from None
    try:
        free_port(host)
    except OSError as err:
        raise ConfigError(f"--host {host}: nothing can listen there ({err.strerror or err}); "
                          f"give an address of this machine") from None
    return host


def url_host(host: str) -> str:
    """``host`` as it goes in a URL or a host:port address."""
    return f"[{host}]" if ":" in host else host


# --------------------------------------------------------------------- HTTP
def http_status(url: str, token: str | None = None, timeout_s: float = 5.0) -> int:
    """The HTTP status of GET ``url`` (with the bearer token when given);
    OSError when nothing answers."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@dataclass(frozen=True)
class Auth:
    """How to talk to a job server: ``env`` for the ``ray`` CLI
    (RAY_AUTH_MODE and where the token is), ``why`` in words, ``token``
    for this side's own HTTP requests (None: none needed)."""

    env: dict[str, str]
    why: str
    token: str | None = None


def token_sources(head: Path | None) -> list[tuple[str, dict[str, str], str]]:
    """(description, env for Ray, token) of every token this side has, in
    Ray's order (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token),
    the head directory's token first when ``head`` is given."""
    found = []

    def from_file(label: str, path: Path) -> None:
        with contextlib.suppress(ConfigError):  # not a token file: not a token of ours
            token = ray_token.read(path, label, private=False)
            found.append((f"{label} {path}", {"RAY_AUTH_TOKEN_PATH": str(path.resolve())},
                          token))

    if head is not None:
        from_file("the head's token file", head / TOKEN_FILE)
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        found.append(("RAY_AUTH_TOKEN", {"RAY_AUTH_TOKEN": os.environ["RAY_AUTH_TOKEN"].strip()},
                      os.environ["RAY_AUTH_TOKEN"].strip()))
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        from_file("RAY_AUTH_TOKEN_PATH", Path(os.environ["RAY_AUTH_TOKEN_PATH"]))
    from_file("Ray's default token file", Path.home() / ".ray" / TOKEN_FILE)
    return found


def job_server_auth(url: str, head: Path | None = None, timeout_s: float = 10.0) -> Auth:
    """Reach the job server at ``url`` and find how to authenticate: none
    when it takes requests without a token, else the first token this side
    has that it accepts. InfraError (exit 3) in one line when nothing
    answers at ``url``; ConfigError (exit 2) when no token is accepted."""
    try:
        http_status(f"{url}/api/version", timeout_s=timeout_s)
        status = http_status(f"{url}/api/jobs/", timeout_s=timeout_s)
    except OSError as err:
        reason = getattr(err, "reason", None) or err
        raise InfraError(
            f"no Ray job server answers at {url} ({reason}); start a head with "
            f"`python -m jobs head start` or give the address of one (--address "
            f"http://HEAD:8265 or RAY_ADDRESS)") from None
    if status not in (401, 403):
        return Auth({"RAY_AUTH_MODE": "disabled"}, "the job server takes requests without a token")
    tried = []
    for label, env, token in token_sources(head):
        if http_status(f"{url}/api/jobs/", token=token, timeout_s=timeout_s) < 400:
            return Auth({"RAY_AUTH_MODE": "token", **env}, f"token authentication ({label})",
                        token)
        tried.append(label)
    raise ConfigError(
        f"the Ray job server at {url} requires a token and "
        + (f"refused every one this side has ({'; '.join(tried)})" if tried else
           "none was found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)")
        + "; give the head's token in RAY_AUTH_TOKEN_PATH")


def job_server_url(address: str | None, head: Path, use: str = "submit") -> str:
    """The job server to talk to: ``address`` (``--address``), else
    RAY_ADDRESS, else the head ``head start`` recorded in ``head``; a URL
    without a trailing slash. ConfigError (exit 2) when there is none (no
    head recorded, or one without the dashboard: ``use`` names what needed
    it), or it is not an http(s) URL."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        state = read_state(head)
        if state is None:
            raise ConfigError(f"no head to talk to: none recorded in {head} (start one with "
                              f"`python -m jobs head start`), no --address, no RAY_ADDRESS")
        why = no_job_server(state)
        if why:
            raise ConfigError(f"the head at {head} runs without the dashboard ({why}): no job "
                              f"server for {use}; start it with the dashboard packages "
                              f"installed (python -m jobs head start --dashboard on), or give "
                              f"--address")
        address = state["dashboard"]
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"--address {address!r}: give the job server's URL, "
                          f"e.g. http://HEAD:8265 (the head's dashboard port)")
    return address.rstrip("/")


JOB_ID_FORM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A job id this side sends or accepts: what ``submit`` picks
(``lamport-UTCTIME-RANDOM``), Ray's own (``raysubmit_...``, hex driver
ids), a name given with ``--submission-id``; nothing that changes the URL
it goes in."""


def check_job_id(job_id: str, what: str = "JOB_ID") -> str:
    """``job_id`` if it has :data:`JOB_ID_FORM`, else ConfigError naming it
    (before any request is sent)."""
    if not JOB_ID_FORM.fullmatch(job_id):
        raise ConfigError(f"{what} {job_id!r}: not a job id (letters, digits, '_', '.', '-', "
                          f"at most 128, starting with a letter or digit; e.g. the id "
                          f"`submit` printed)")
    return job_id


def _job_get(url: str, job_id: str, auth: Auth, path: str = "",
             timeout_s: float = 10.0, method: str = "GET") -> dict | None:
    """The JSON object of ``GET /api/jobs/ID{path}`` (or ``method``), None
    on 404 (no such job); InfraError (exit 3) in one line when the server
    answers anything else, or not at all."""
    from urllib.parse import quote
    request = urllib.request.Request(f"{url}/api/jobs/{quote(job_id, safe='')}{path}",
                                     method=method)
    if auth.token:
        request.add_header("Authorization", f"Bearer {auth.token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise InfraError(f"the Ray job server at {url} answered {err.code} for job "
                         f"{job_id!r}") from None
    except (OSError, ValueError) as err:
        raise InfraError(f"the Ray job server at {url} did not answer for job {job_id!r} "
                         f"({getattr(err, 'reason', None) or err})") from None
    if not isinstance(answer, dict):
        raise InfraError(f"the Ray job server at {url} answered for job {job_id!r} with "
                         f"{type(answer).__name__}, not a job's record")
    return answer


def job_info(url: str, job_id: str, auth: Auth, timeout_s: float = 10.0) -> dict | None:
    """Ray's record of job ``job_id`` (``GET /api/jobs/ID``: ``status``,
    ``driver_exit_code``, ``message``, ...), None when the server has no
    such job; InfraError when the server does not answer, or answers an
    error."""
    return _job_get(url, job_id, auth, timeout_s=timeout_s)


def job_log(url: str, job_id: str, auth: Auth, timeout_s: float = 10.0) -> str | None:
    """The log of job ``job_id`` so far (``GET /api/jobs/ID/logs``), None
    when the server has no such job; InfraError as :func:`job_info`."""
    answer = _job_get(url, job_id, auth, "/logs", timeout_s=timeout_s)
    return None if answer is None else str(answer.get("logs") or "")


def stop_job(url: str, job_id: str, auth: Auth, timeout_s: float = 10.0) -> bool:
    """Ask the job server to stop job ``job_id`` (``POST /api/jobs/ID/stop``,
    what ``ray job stop`` sends: SIGTERM to its driver); whether it was
    still running to be stopped. ConfigError when the server has no such
    job; InfraError as :func:`job_info`."""
    answer = _job_get(url, job_id, auth, "/stop", timeout_s=timeout_s, method="POST")
    if answer is None:
        raise ConfigError(f"JOB_ID {job_id!r}: no such job at {url}")
    return bool(answer.get("stopped"))


def first_case_line(log: str) -> str | None:
    """The first case's line of a job's log: the first row under a results
    table's rule (jobs.table.Table: a header, a line of '-', then a line per
    case, each starting with its job's name); None before any."""
    from jobs.results.schema import JOBS
    under_rule = False
    for line in log.splitlines():
        if line.startswith("---") and not line.strip("-"):
            under_rule = True
        elif under_rule and line.split(" ", 1)[0] in JOBS:
            return line.rstrip()
    return None


ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
"""Ray's statuses of a job that has ended."""


def wait_running(url: str, job_id: str, auth: Auth, timeout_s: float,
                 poll_s: float = 0.5) -> tuple[dict, str | None]:
    """Wait until job ``job_id`` runs and its log shows its first case's
    line (:func:`first_case_line`), or it has ended; returns (its record,
    that line; None when it ended before one). ConfigError when the server
    has no such job; InfraError (exit 3) in one line when neither comes
    within ``timeout_s`` (naming the job's status then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = job_info(url, job_id, auth)
        if info is None:
            raise ConfigError(f"JOB_ID {job_id!r}: no such job at {url}")
        if info.get("status") in ENDED:
            return info, None
        if info.get("status") == "RUNNING":
            line = first_case_line(job_log(url, job_id, auth) or "")
            if line:
                return info, line
        if time.monotonic() >= deadline:
            raise InfraError(f"job {job_id} at {url}: no case started within {timeout_s:g} s "
                             f"(status {info.get('status')}); it goes on (--timeout to wait "
                             f"longer)")
        time.sleep(poll_s)


# --------------------------------------------------------------------- head
@contextlib.contextmanager
def recorded_auth(address: str):
    """For a session with the cluster at ``address`` (a GCS address): where
    this side has no Ray token of its own (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH) and ``address`` is the GCS of the head
    ``python -m jobs head start`` recorded (``head_dir()``), that head's
    token, in the environment for the block (Ray reads it there, and caches
    it: jobs.embedded.reread_auth), so a user never sets Ray's auth
    variables by hand for their own head. Yields whether it did."""
    state = read_state(head_dir())
    if (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
            or state is None or state.get("address") != address):
        yield False
        return
    with head_token(state["token_path"]):
        yield True


@contextlib.contextmanager
def head_token(token_path: str):
    """Ray's auth variables set to the token file ``token_path`` (and no
    RAY_AUTH_TOKEN) for the block, re-read by Ray on the way in and out."""
    from jobs.embedded import reread_auth
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path, "RAY_AUTH_TOKEN": None}
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    reread_auth()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reread_auth()


def read_state(head: Path) -> dict | None:
    try:
        state = json.loads((head / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and {"pid", "dashboard"} <= set(state) else None


def check_dir(head: Path) -> None:
    """ConfigError unless ``start`` may write its files in ``head``: a
    head.json or head.log there is one it wrote (a state it can read, a log
    with its header), never someone else's; ``head`` itself a folder (or
    nothing yet)."""
    if (head.exists() or head.is_symlink()) and not head.is_dir():
        raise ConfigError(f"--dir {head}: not a folder (the head's token, log and state go "
                          f"in a folder); give a folder, new or one `head start` used")
    state, log = head / STATE_FILE, head / LOG_FILE
    if (state.exists() or state.is_symlink()) and read_state(head) is None:
        raise ConfigError(f"--dir {head}: {state} is not a head's state written by "
                          f"`python -m jobs head start`; refusing to write over it (give "
                          f"another --dir)")
    if log.exists() or log.is_symlink():
        try:
            with open(log, "rb") as f:
                ours = log.is_file() and f.read(len(LOG_HEADER)) == LOG_HEADER.encode()
        except OSError:
            ours = False
        if not ours:
            raise ConfigError(f"--dir {head}: {log} is not a head log written by `python -m "
                              f"jobs head start`; refusing to write over it (give another "
                              f"--dir)")


def _alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


PORT_OPTIONS = ("port", "dashboard-port", "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
                "ray-client-server-port")
"""The ``ray start`` options of the ports :func:`start` chooses, all of them
(dashboard-port too without the dashboard: Ray still binds it to check it)."""

NODE_TIMEOUT = "the current node timed out during startup"
"""Ray's words (lowercased) for a raylet that missed its 30 s to register
with the GCS: a loaded machine, not a broken head (jobs.embedded retries
it too)."""

_CLASH_SIGNS = (
    "address already in use",       # EADDRINUSE, as most servers say it (GCS, raylet, aiohttp)
    "failed to bind",               # the dashboard (Ray's check), the agent's last attempt
    "failed to start the grpc server",  # GCS, raylet: the cause is in their own logs
    "that is used by other components",  # Ray's own check of the ports it is given
)
_NOT_YET = "retrying in"
"""A bind the server tries again (the agent's first attempts): not a clash yet."""


def port_clash(log: str, ports) -> str | None:
    """The first line of a head's log that says a server could not have one
    of ``ports`` (the ports chosen for it: taken since), None when none
    does. Another port's bind failing (the autoscaler monitor's fixed
    metrics port, held by another cluster on the machine) is not a clash of
    ours, and a retry by the server itself not yet one."""
    mine = re.compile(r"(?<!\d)(%s)(?!\d)" % "|".join(str(p) for p in ports))
    for line in log.splitlines():
        low = line.lower()
        if (any(sign in low for sign in _CLASH_SIGNS) and _NOT_YET not in low
                and mine.search(line)):
            return line.strip()
    return None


def _session_clash(temp_dir: str, ports) -> str | None:
    """:func:`port_clash` of the Ray session's own logs under ``temp_dir``
    (where the GCS, raylet and agents log a bind that failed; ``ray start``
    prints only some of them)."""
    logs = Path(temp_dir) / "session_latest" / "logs"
    with contextlib.suppress(OSError):
        for path in sorted(logs.iterdir()):
            if path.suffix in (".log", ".out", ".err") and path.is_file():
                with contextlib.suppress(OSError), open(path, errors="replace") as f:
                    clash = port_clash(f.read(1 << 20), ports)
                if clash:
                    return f"{path.name}: {clash}"
    return None


class _Retry(Exception):
    """One start attempt ended on what another may not meet (why, in words,
    with its log's line): a port clash, Ray's node start timing out."""


def start(head: Path, *, num_cpus: int | None = None, wait_s: float = 180.0,
          host: str = LOOPBACK, dashboard: str = "auto") -> dict:
    """Start a local head (see the module docstring); returns its state
    (``dashboard``: the job server's URL, None without one, then
    ``no_dashboard`` says why; ``address``: the GCS address, ``pid``,
    ``temp_dir``, ``log``). ``host``: the address its servers listen on
    (:func:`check_host`); ``dashboard``: :func:`decide_dashboard`.
    ConfigError when ``--dir`` is not a folder, ``--dashboard on`` cannot
    be, one recorded in ``head`` still runs, the token file there is not one
    (:mod:`jobs.ray_token`) or a head.json or head.log there is someone
    else's (:func:`check_dir`); InfraError (exit 3) when it does not come up
    within ``wait_s`` (the end of Ray's log printed on stderr first). A head
    whose log says a port was taken between choosing it and its server
    binding it (:func:`port_clash`), or that Ray's node did not start in
    time (:data:`NODE_TIMEOUT`), is stopped and started again with fresh
    ports, one line on stderr saying so, up to ``START_ATTEMPTS`` in all
    (jobs.embedded's, as for the embedded cluster)."""
    check_dir(head)
    state = read_state(head)
    if state and _alive(state["pid"]):
        raise ConfigError(f"a head started from {head} still runs (pid {state['pid']}, "
                          f"{describe(state)}); stop it first: python -m jobs head stop")
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError(f"--num-cpus {num_cpus}: must be >= 1")
    check_host(host)
    without = decide_dashboard(dashboard)
    try:
        head.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--dir {head}: cannot make the folder ({err.strerror or err})") from None
    token_path = ray_token.ensure((head / TOKEN_FILE).resolve(), "the head's token file")
    log_path = (head / LOG_FILE).resolve()
    log_path.write_text(LOG_HEADER)
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return _start_once(head, token_path, log_path, num_cpus=num_cpus, wait_s=wait_s,
                               host=host, without=without)
        except _Retry as why:
            if attempt == START_ATTEMPTS:
                raise InfraError(f"the Ray head did not start in {START_ATTEMPTS} attempts (the "
                                 f"last: {why}; its log: {log_path})") from None
            print(f"head start: {why}; starting again with fresh ports (attempt {attempt + 1} "
                  f"of {START_ATTEMPTS})", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def _start_once(head: Path, token_path: Path, log_path: Path, *, num_cpus: int | None,
                wait_s: float, host: str, without: str | None) -> dict:
    """One attempt of :func:`start`, its output appended to ``log_path``;
    _Retry (the head stopped) when its logs say a port was taken, or that
    Ray's node did not start in time."""
    # Ray's unix sockets live under the temp dir: keep its path short.
    temp_dir = tempfile.mkdtemp(prefix="lamport-ray-", dir="/tmp")
    ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS), host)))
    cpus = num_cpus or max(2, os.cpu_count() or 2)
    ray_bin = Path(sys.executable).with_name("ray")
    argv = [str(ray_bin) if ray_bin.exists() else "ray", "start", "--head", "--block",
            "--node-ip-address", host, "--dashboard-host", host,
            "--include-dashboard", "false" if without else "true", "--num-cpus", str(cpus),
            "--disable-usage-stats",
            "--temp-dir", temp_dir, *[a for k, v in ports.items() for a in (f"--{k}", str(v))]]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", *LOOPBACK_ENV)}
    if ipaddress.ip_address(host).is_loopback:
        env.update(LOOPBACK_ENV)
    env.update(WORKER_ENV)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    with open(log_path, "a") as log:
        offset = log.tell()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    where = url_host(host)
    state = {"pid": proc.pid, "start": procs.process_start(proc.pid),  # tells a reused pid apart
             "host": host, "address": f"{where}:{ports['port']}",
             "dashboard": None if without else f"http://{where}:{ports['dashboard-port']}",
             "agent": None if without else f"http://{where}:{ports['dashboard-agent-listen-port']}",
             "no_dashboard": without,
             "temp_dir": temp_dir, "log": str(log_path), "token_path": str(token_path),
             "num_cpus": cpus}
    (head / STATE_FILE).write_text(json.dumps(state, indent=1))
    token = ray_token.read(token_path, "the head's token file")
    deadline = time.monotonic() + wait_s
    for tick in itertools.count():
        ready, waiting_for = _ready(state, token)
        if ready:
            return state
        # A server that lost its port may leave the head up without it (the
        # agent): its session log says so, long before the deadline.
        clash = _session_clash(temp_dir, ports.values()) if tick % 4 == 3 else None
        if clash or proc.poll() is not None or time.monotonic() > deadline:
            with open(log_path, errors="replace") as log:
                log.seek(offset)
                this = log.read()
            clash = (clash or port_clash(this, ports.values())
                     or _session_clash(temp_dir, ports.values()))
            stop(head)
            if clash:
                raise _Retry(f"a port was taken before the head's server bound it ({clash})")
            slow = next((ln.strip() for ln in this.splitlines() if NODE_TIMEOUT in ln.lower()),
                        None)
            if slow and proc.returncode is not None:
                raise _Retry(f"Ray's node did not start in time ({slow})")
            why = (f"exited with {proc.returncode}" if proc.returncode is not None
                   else f"{waiting_for} did not answer within {wait_s:.0f} s")
            print(f"end of {log_path}:\n{this[-3000:]}", file=sys.stderr)
            raise InfraError(f"the Ray head {why} (its log: {log_path})")
        time.sleep(0.5)


def _ready(state: dict, token: str) -> tuple[bool, str]:
    """Whether the head just started takes work, else (False, what it waits
    for): with a job server, once the job server and the job agent answer
    (a submit before the agent is up fails); without, once the GCS answers
    with the head's node alive (what a driver joining it needs)."""
    if no_job_server(state):
        from ray._raylet import GcsClient
        from ray.core.generated.gcs_pb2 import GcsNodeInfo
        try:
            with head_token(state["token_path"]):
                alive = GcsClient(address=state["address"]).get_all_node_info(
                    timeout=2, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
            return bool(alive), "the head's node"
        except Exception:  # noqa: BLE001 (not up yet: Ray's RPC errors vary)
            return False, "the GCS"
    try:
        if http_status(f"{state['dashboard']}/api/jobs/", token=token) != 200:
            return False, "the job server"
        return http_status(f"{state['agent']}/api/healthz") == 200, "the job agent"
    except OSError:
        return False, "the job server"


def status(head: Path) -> tuple[bool, str]:
    """(whether the head recorded in ``head`` runs, what it is, in words)."""
    state = read_state(head)
    if state is None:
        return False, f"no head recorded in {head}"
    leader = procs.process_start(state["pid"])
    alive = _alive(state["pid"]) and state.get("start") in (None, leader)
    why = no_job_server(state)
    what = (f"GCS {state['address']}, "
            + (f"no dashboard, no job server ({why})" if why else
               f"job server {state['dashboard']}")
            + f", pid {state['pid']}, log {state['log']}")
    return alive, (f"head at {head} runs: {what}" if alive else
                   f"head at {head} not running (recorded: {what}); forget it with "
                   f"`python -m jobs head stop`")


def stop(head: Path, grace_s: float = 3.0) -> str:
    """End the head recorded in ``head`` (its whole process group); returns
    what happened, in words."""
    state = read_state(head)
    if state is None:
        return f"no head recorded in {head}"
    pgid = state["pid"]
    outcome = f"no head running (pid {pgid} already gone)"
    leader = procs.process_start(pgid)
    if leader is not None and state.get("start") not in (None, leader):
        # The head is gone and its pid names another process now: its group
        # (if that process leads one) is not ours to signal.
        pgid = None
        outcome = f"no head running (pid {state['pid']} now names another process)"
    # `ray start --block` does not act on SIGTERM promptly: a short grace,
    # then SIGKILL for the whole group (gcs, raylet, dashboard, workers).
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if not _alive(pgid):
            break
        outcome = f"stopped the head (pid {pgid}, {describe(state)})"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, os.WNOHANG)
        deadline = time.monotonic() + wait_s
        while _alive(pgid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pgid, os.WNOHANG)
            time.sleep(0.2)
    if _alive(pgid):
        raise RuntimeError(f"the head's process group {pgid} survived SIGKILL")
    shutil.rmtree(state["temp_dir"], ignore_errors=True)
    (head / STATE_FILE).unlink(missing_ok=True)
    return outcome
