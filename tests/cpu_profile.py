"""Where the test command's CPU goes: a pytest plugin (loaded by
tests/conftest.py; ``--cpu-profile FILE`` turns it on) and its report
(``python -m tests.cpu_profile FILE``).

On the 2-core box the README's test command is CPU-bound (both cores busy
for most of its wall time), so its wall time is its CPU seconds over two, and
``--durations`` (wall per test, under contention, without the processes a
test starts) does not say what to cut. This plugin measures CPU seconds and
charges each to the test that caused them:

- each test's own CPU in its xdist worker (``time.process_time`` around the
  test's setup, call and teardown);
- every other process of the machine, sampled from ``/proc`` every
  ``SAMPLE_S`` by a thread of the controller: its CPU (``utime + stime``, at
  its last sample) and the test it was started under, read from the
  ``PYTEST_CURRENT_TEST`` its environment was created with. A Ray worker
  inherits its raylet's, so it is charged to the test that started the
  cluster (a module-scoped fixture: the module's first test); a process that
  lives less than ``SAMPLE_S`` can be missed, and one started outside any
  test (the machine's own) is reported apart, not charged.

The FILE is JSON: ``{"wall_s", "cores", "tests": [[nodeid, worker, cpu_s,
wall_s, start_unix]], "processes": [[pid, test, worker, cmdline, cpu_s]]}``;
a ``tests`` row with an empty nodeid is one pytest process's whole CPU
(collection and imports included). CPU seconds of processes that ran before
the run are counted from its start. ``--split MODULE,...`` reports instead
those modules against the rest, and with ``--target-s S`` how many CPU
seconds a run of S seconds would leave for the rest.
Linux only (``/proc``); without ``--cpu-profile`` the plugin does nothing.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

SAMPLE_S = 0.5
"""Seconds between two scans of /proc."""
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_WORKER_FILE = "cpu-profile.{worker}.jsonl"


def pytest_addoption(parser):
    parser.addoption("--cpu-profile", metavar="FILE", default=None,
                     help="write the CPU seconds of every test and of every process it started "
                          "to FILE (JSON; `python -m tests.cpu_profile FILE` reports them by "
                          "module, xdist group and process kind; Linux only)")


def _proc_cpu(pid: str) -> tuple[float, int] | None:
    """(CPU seconds, start tick) of /proc/PID, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[19])


def _proc_origin(pid: str) -> tuple[str, str, str]:
    """(test, xdist worker, command line) a process started under."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").strip()[:600]
    except OSError:
        return "", "", ""
    return (env.get(b"PYTEST_CURRENT_TEST", b"").decode(errors="replace"),
            env.get(b"PYTEST_XDIST_WORKER", b"").decode(), cmd.decode(errors="replace"))


class Sampler(threading.Thread):
    """Scans /proc every ``SAMPLE_S`` until :meth:`stop`; ``processes``:
    one entry a process seen, keyed by (pid, start tick)."""

    def __init__(self):
        super().__init__(name="cpu-profile", daemon=True)
        self.processes: dict[tuple[int, int], list] = {}
        self._done = threading.Event()
        self.scan(baseline=True)

    def scan(self, baseline: bool = False) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            got = _proc_cpu(pid)
            if got is None:
                continue
            key = (int(pid), got[1])
            if baseline:  # the machine's own processes: their CPU so far is not the run's
                self.processes[key] = [*_proc_origin(pid), got[0], got[0]]
            elif key in self.processes:
                self.processes[key][3] = got[0]
            else:
                self.processes[key] = [*_proc_origin(pid), got[0], 0.0]

    def run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self.scan()

    def stop(self) -> list[list]:
        self._done.set()
        self.join()
        self.scan()
        return [[pid, test, worker, cmd, round(cpu - base, 3)]
                for (pid, _), (test, worker, cmd, cpu, base) in self.processes.items()
                if cpu - base > 0]


class _Plugin:
    def __init__(self, config, out: Path):
        self.out = out
        # an xdist worker has its workerinput (not the environment: a pytest this
        # run starts inherits PYTEST_XDIST_WORKER, and is a run of its own)
        self.worker = getattr(config, "workerinput", {}).get("workerid", "")
        self.sampler = None if self.worker else Sampler()
        self.started = time.time()
        self.parts = out.with_name(out.name + ".parts")
        if not self.worker:
            self.parts.mkdir(parents=True, exist_ok=True)
            for old in self.parts.glob("*.jsonl"):
                old.unlink()
            self.sampler.start()
        self._rows = open(self.parts / _WORKER_FILE.format(worker=self.worker or "main"), "a")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        cpu, wall, start = time.process_time(), time.monotonic(), time.time()
        yield
        self._rows.write(json.dumps([item.nodeid, self.worker or "main",
                                     round(time.process_time() - cpu, 3),
                                     round(time.monotonic() - wall, 3), round(start, 3)]) + "\n")
        self._rows.flush()

    def pytest_unconfigure(self, config):
        # the process's whole CPU (collection and imports too), as a row of no test
        self._rows.write(json.dumps(["", self.worker or "main", round(time.process_time(), 3),
                                     round(time.time() - self.started, 3),
                                     round(self.started, 3)]) + "\n")
        self._rows.close()
        if self.sampler is None:
            return
        processes = self.sampler.stop()
        tests = [json.loads(line) for part in sorted(self.parts.glob("*.jsonl"))
                 for line in part.read_text().splitlines() if line]
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps({"wall_s": round(time.time() - self.started, 1),
                                   "cores": os.cpu_count(), "tests": tests,
                                   "processes": processes}))
        os.replace(tmp, self.out)
        for part in self.parts.glob("*.jsonl"):
            part.unlink()
        self.parts.rmdir()


def pytest_configure(config):
    out = config.getoption("cpu_profile", default=None)
    if out:
        if not Path("/proc/self/stat").exists():
            raise pytest.UsageError("--cpu-profile reads /proc: Linux only")
        config.pluginmanager.register(_Plugin(config, Path(out).resolve()), "cpu-profile-run")


# -- the report

def _module(test: str) -> str:
    return test.split("::", 1)[0]


def _group(nodeid: str) -> str:
    """A test's xdist group: the ``@group`` that ``--dist loadgroup`` ends
    its node id with, else its module (a group of its own)."""
    head, at, group = nodeid.rpartition("@")
    return group if at and "::" in head and "]" not in group else _module(nodeid)


def _kind(cmd: str) -> str:
    """A process's kind: the executable, or for Python the script or module it runs."""
    words = cmd.split()
    if not words:
        return "?"
    exe = os.path.basename(words[0])
    if not exe.startswith("python"):
        return exe
    rest = [w for w in words[1:] if not w.startswith("-") or w == "-m" or w == "-c"]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return f"python -m {rest[1]}"
    if rest[:1] == ["-c"]:
        return "python -c ..."
    return f"python {os.path.basename(rest[0])}" if rest else "python"


def report(profile: dict, top: int = 25) -> str:
    """The profile as text: CPU seconds by module (own and of the processes
    its tests started), by xdist group and by process kind."""
    own, wall, by_group = collections.Counter(), collections.Counter(), collections.Counter()
    workers = 0.0
    for nodeid, _, cpu, took, _ in profile["tests"]:
        if not nodeid:  # a pytest process's whole CPU
            workers += cpu
            continue
        own[_module(nodeid)] += cpu
        wall[_module(nodeid)] += took
        by_group[_group(nodeid)] += cpu
    started, count, kinds = collections.Counter(), collections.Counter(), collections.Counter()
    outside = 0.0
    for _, test, _, cmd, cpu in profile["processes"]:
        if not test:
            outside += cpu
            continue
        test = test.rsplit(" (", 1)[0]  # PYTEST_CURRENT_TEST ends with " (setup|call|teardown)"
        started[_module(test)] += cpu
        count[_module(test)] += 1
        by_group[_group(test)] += cpu
        kinds[_kind(cmd)] += cpu
    mods = set(own) | set(started)
    total = sum(own.values()) + sum(started.values())
    lines = [f"{profile['wall_s']:.0f} s wall on {profile['cores']} cores "
             f"({profile['wall_s'] * profile['cores']:.0f} core-s); charged to tests: "
             f"{total:.0f} CPU-s; the pytest processes' own, all told (collection "
             f"included): {workers:.0f}; processes started outside any test (pytest's own, "
             f"and the machine's: not charged): {outside:.0f}", "",
             f"{'CPU-s':>7} {'own':>6} {'started':>8} {'procs':>6} {'wall-s':>7}  module"]
    for mod in sorted(mods, key=lambda m: -(own[m] + started[m]))[:top]:
        lines.append(f"{own[mod] + started[mod]:7.0f} {own[mod]:6.0f} {started[mod]:8.0f} "
                     f"{count[mod]:6d} {wall[mod]:7.0f}  {mod}")
    lines += ["", f"{'CPU-s':>7}  xdist group (a module's own name: a group of its own)"]
    lines += [f"{cpu:7.0f}  {g}" for g, cpu in by_group.most_common(8)]
    lines += ["", f"{'CPU-s':>7}  process kind (started by tests)"]
    lines += [f"{cpu:7.0f}  {k}" for k, cpu in kinds.most_common(12)]
    return "\n".join(lines)


def split(profile: dict, modules: set[str], target_s: float | None = None) -> str:
    """The run's CPU in three parts: the tests of ``modules`` (own and
    started), pytest's own outside any test (collection, xdist), and the
    rest (every other test, and the machine's processes); with
    ``target_s``: how many CPU seconds a run of that wall holds at this
    run's use of its cores, and what it leaves for the rest."""
    total = sum(cpu for *_, cpu in profile["processes"])
    named = sum(cpu for nodeid, _, cpu, _, _ in profile["tests"]
                if nodeid and _module(nodeid) in modules)
    named += sum(cpu for _, test, _, _, cpu in profile["processes"]
                 if test and _module(test.rsplit(" (", 1)[0]) in modules)
    tests_own = sum(cpu for nodeid, _, cpu, _, _ in profile["tests"] if nodeid)
    pytest_own = sum(cpu for nodeid, _, cpu, _, _ in profile["tests"] if not nodeid) - tests_own
    rest = total - named - pytest_own
    use = total / (profile["wall_s"] * profile["cores"])
    lines = [f"{total:7.0f} CPU-s in all: {use:.0%} of {profile['cores']} cores over "
             f"{profile['wall_s']:.0f} s",
             f"{named:7.0f}  the {len(modules)} named modules (own and started)",
             f"{pytest_own:7.0f}  pytest's own outside any test (collection, xdist)",
             f"{rest:7.0f}  the rest (the other tests, the machine's processes)"]
    if target_s:
        holds = target_s * profile["cores"] * use
        lines.append(f"{holds:7.0f}  what {target_s:.0f} s holds at {use:.0%} use: "
                     f"{holds - named - pytest_own:.0f} left for the rest "
                     f"({(holds - named - pytest_own) / rest:.0%} of what it took)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cpu_profile", description=report.__doc__)
    p.add_argument("profile", type=Path, help="the FILE a `--cpu-profile FILE` run wrote "
                   "(gzipped: FILE.gz)")
    p.add_argument("--top", type=int, default=25, help="modules listed (default 25)")
    p.add_argument("--split", metavar="MODULE[,MODULE...]", default=None,
                   help="instead: the CPU of these test modules (tests/test_x.py), pytest's "
                        "own and the rest")
    p.add_argument("--target-s", type=float, default=None,
                   help="with --split: what a run of this wall would leave for the rest")
    args = p.parse_args(argv)
    if args.target_s is not None and (not args.split or not args.target_s > 0):
        p.error(f"--target-s {args.target_s}: a positive number of seconds, with --split")
    try:
        opener = gzip.open if args.profile.suffix == ".gz" else open
        with opener(args.profile, "rt") as f:
            profile = json.load(f)
    except (OSError, ValueError, EOFError) as e:
        print(f"python -m tests.cpu_profile: profile {str(args.profile)!r}: {e}", file=sys.stderr)
        return 2
    if args.split:
        modules = set(args.split.split(","))
        known = {_module(t[0]) for t in profile["tests"] if t[0]}
        if modules - known:
            print(f"python -m tests.cpu_profile: --split {args.split!r}: no test of "
                  f"{', '.join(sorted(modules - known))} in the profile", file=sys.stderr)
            return 2
        print(split(profile, modules, args.target_s))
    else:
        print(report(profile, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
