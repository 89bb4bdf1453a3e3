"""Writers, readers and compactions of one results dataset at once, with
``kill -9`` at random points: every row a writer reported committed is
read exactly once by every read that began after it, and no read holds a
row twice or a row nobody wrote (jobs.results.compaction states the
protocol this checks).

Processes (each replaced when killed): 3 writers appending 1 to 3 rows a
file to two runs and two suites, 2 compactions compacting a random one of
the runs every 0.1 s (so two compactions of one run meet, and compactions
of two runs in one folder: two nightlies into one results folder), 2
readers (``read_results``) and 1 plain pyarrow reader, whose count is a
figure only (plain readers know no lock: see the compaction module). The
test process kills one of them with SIGKILL every 0.5 to 2.5 s (a seeded
choice of a writer, reader, compaction or the plain reader by ``KILL_ODDS``;
the moments it lands at are the machine's).

Bounded: ``LAMPORT_RACE_S`` seconds of racing (default 20; e.g. 300 for a
long run), longer only until two compactions have swapped and three reads
ended (a slow machine), then a final read. The assertions do not depend on
timing: 0 lost, 0 doubled, 0 phantom, and no process dying by itself (a
reader or compaction that crashes is restarted, counted and fails the
test), whatever the interleaving.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RACE_S = float(os.environ.get("LAMPORT_RACE_S", "20"))
RUNS = ("race-a", "race-b")
BATCH = 3
"""Most rows one append writes (one file)."""
WRITER_ID = 10_000_000
"""Row seq = writer id * WRITER_ID + n: unique over every writer ever started."""
KILL_ODDS = {"writer": 4, "reader": 3, "compactor": 2, "plain": 1}
"""Which kind a kill hits: a compaction killed too often never ends one
(it reads the whole folder first), and then reads slow down as files pile up."""

pytestmark = pytest.mark.timeout(int(300 + 2 * RACE_S))

WRITER = """
import datetime as dt, random, sys, time
from jobs.results import ResultsWriter
root, wid = sys.argv[1], int(sys.argv[2])
rng = random.Random(wid)
writers = [ResultsWriter(root, suite=s, run_id=r, trigger="nightly")
           for r in ("race-a", "race-b") for s in ("smoke", "nightly")]
print("ready", flush=True)
n = 0
while True:
    rows = []
    for _ in range(rng.randint(1, %(batch)d)):
        rows.append({"op": "x", "outcome": "pass", "extra": {"seq": wid * %(wid)d + n},
                     "started_at": dt.datetime.now(dt.timezone.utc)})
        n += 1
    rng.choice(writers).append(rows)
    print("c", *(r["extra"]["seq"] for r in rows), flush=True)
    time.sleep(rng.random() * 0.1)
""" % {"batch": BATCH, "wid": WRITER_ID}

COMPACTOR = """
import random, sys, time
from jobs.results import compact_run
root, me = sys.argv[1], int(sys.argv[2])
rng = random.Random(me)
print("ready", flush=True)
while True:
    t0 = time.monotonic()
    written = compact_run(root, rng.choice(("race-a", "race-b")))
    if written:
        print("k", len(written), t0, time.monotonic(), flush=True)
    time.sleep(0.1)
"""

READER = """
import json, sys, time
from jobs.results import read_results
root = sys.argv[1]
print("ready", flush=True)
while True:
    t0 = time.monotonic()
    extras = read_results(root, columns=["extra"]).column("extra").to_pylist()
    t1 = time.monotonic()
    print(json.dumps({"t0": t0, "t1": t1, "seqs": [json.loads(e)["seq"] for e in extras]}),
          flush=True)
"""

PLAIN = """
import json, sys, collections
import pyarrow.parquet as pq
root = sys.argv[1]
print("ready", flush=True)
while True:
    try:
        extras = pq.read_table(root, columns=["extra"]).column("extra").to_pylist()
    except Exception as err:  # a file unlinked under it: plain readers know no lock
        print(json.dumps({"error": type(err).__name__}), flush=True)
        continue
    seen = collections.Counter(json.loads(e)["seq"] for e in extras)
    print(json.dumps({"rows": len(extras), "doubled": sum(n > 1 for n in seen.values())}),
          flush=True)
"""


class Child:
    def __init__(self, kind: str, script: str, *args) -> None:
        self.kind = kind
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        self.buffer = b""
        self.id = args[1]


def test_writers_readers_and_compactions_killed_at_random_lose_and_double_nothing(tmp_path):
    root = tmp_path / "results"
    rng = random.Random(32)
    selector = selectors.DefaultSelector()
    children: list[Child] = []
    committed: dict[int, float] = {}  # seq -> when the test process learnt of it
    last: dict[int, int] = {}  # writer id -> its last reported seq
    reads, plain = [], Counter()
    swaps: list[tuple[float, float]] = []
    kills: Counter = Counter()
    crashes: Counter = Counter()  # children that died by themselves (a traceback on stderr)
    next_id = iter(range(1, 10_000))
    stopping = False
    writers: list[int] = []

    def start(kind: str) -> Child:
        script = {"writer": WRITER, "compactor": COMPACTOR, "reader": READER,
                  "plain": PLAIN}[kind]
        child = Child(kind, script, root, next(next_id))
        os.set_blocking(child.process.stdout.fileno(), False)
        selector.register(child.process.stdout, selectors.EVENT_READ, child)
        children.append(child)
        if kind == "writer":
            writers.append(child.id)
        return child

    def take(line: str, child: Child, now: float) -> None:
        if line == "ready":
            return
        if line.startswith("c "):
            for seq in map(int, line.split()[1:]):
                committed[seq] = now
                last[seq // WRITER_ID] = seq
        elif line.startswith("k "):
            swaps.append(tuple(map(float, line.split()[2:])))
        elif child.kind == "reader":
            reads.append(json.loads(line))
        else:
            answer = json.loads(line)
            plain["reads"] += 1
            plain["errors"] += "error" in answer
            plain["doubled"] += bool(answer.get("doubled"))

    def pump(timeout: float) -> None:
        for key, _ in selector.select(timeout):
            child = key.data
            data = os.read(child.process.stdout.fileno(), 1 << 20)
            now = time.monotonic()
            if not data:
                selector.unregister(child.process.stdout)
                if child in children:  # not one the test killed: it crashed
                    children.remove(child)
                    crashes[child.kind] += 1
                    if not stopping:
                        start(child.kind)
                continue
            child.buffer += data
            *lines, child.buffer = child.buffer.split(b"\n")
            for line in lines:
                take(line.decode(), child, now)

    def kill(child: Child) -> None:
        children.remove(child)
        child.process.send_signal(signal.SIGKILL)
        child.process.wait()
        pump(0)  # what it said before it died (the pipe's rest comes with EOF)

    root.mkdir()
    for kind, n in (("writer", 3), ("compactor", 2), ("reader", 2), ("plain", 1)):
        for _ in range(n):
            start(kind)
    started = time.monotonic()
    while not committed or not reads:  # everyone has imported and begun
        assert time.monotonic() - started < 120, "the race never got going"
        pump(0.1)
    t_begin = time.monotonic()
    next_kill = t_begin + rng.uniform(0.5, 2.5)
    try:
        # RACE_S seconds, and on until the race has happened (a slow machine
        # takes longer to get there; the outcome never depends on it).
        while time.monotonic() - t_begin < RACE_S or len(swaps) < 2 or len(reads) < 3:
            assert time.monotonic() - t_begin < RACE_S + 240, \
                f"no race in {RACE_S + 240:.0f} s: {len(swaps)} swaps, {len(reads)} reads"
            pump(0.05)
            if time.monotonic() >= next_kill:
                kind = rng.choices(list(KILL_ODDS), weights=list(KILL_ODDS.values()))[0]
                victim = rng.choice([c for c in children if c.kind == kind])
                kills[victim.kind] += 1
                kill(victim)
                start(victim.kind)
                next_kill = time.monotonic() + rng.uniform(0.5, 2.5)
    finally:
        stopping = True
        for child in list(children):
            kill(child)
        while selector.get_map():
            pump(0.1)
    raced = time.monotonic() - t_begin

    from jobs.results import read_results
    final = Counter(json.loads(e)["seq"] for e in
                    read_results(root, columns=["extra"]).column("extra").to_pylist())
    # What a writer killed after its rename but before its report may have added.
    unreported = {n for w in writers
                  for n in range(last.get(w, w * WRITER_ID - 1) + 1,
                                 last.get(w, w * WRITER_ID - 1) + 1 + BATCH)}
    possible = set(committed) | unreported
    lost = [s for s in committed if s not in final]
    doubled = [s for s, n in final.items() if n > 1]
    phantom = [s for s in final if s not in possible]
    stale_reads = doubled_reads = phantom_reads = overlapped = 0
    by_time = sorted(committed.items(), key=lambda item: item[1])
    before, i = set(), 0
    for read in sorted(reads, key=lambda r: r["t0"]):
        while i < len(by_time) and by_time[i][1] <= read["t0"]:
            before.add(by_time[i][0])
            i += 1
        seen = Counter(read["seqs"])
        doubled_reads += any(n > 1 for n in seen.values())
        stale_reads += not before <= seen.keys()
        phantom_reads += not seen.keys() <= possible
        overlapped += any(t0 <= read["t1"] and read["t0"] <= t1 for t0, t1 in swaps)
    temps = list(root.rglob(".*.tmp"))
    from jobs.results.store import data_files, partitions
    leftovers = sum(len({n for f in data_files(d) for n in f.covers} & set(os.listdir(d)))
                    for d in partitions(root))
    print(f"\nfigure: race: {raced:.0f} s raced; {len(committed)} rows committed by "
          f"{len(last)} writers, {sum(final.values())} read back at the end "
          f"({len(final)} distinct); lost {len(lost)}, doubled {len(doubled)}, phantom "
          f"{len(phantom)}")
    print(f"figure: race: {len(reads)} reads by read_results, {overlapped} of them while a "
          f"compaction ran that swapped a file in; reads missing a row committed before they began "
          f"{stale_reads}, holding a row twice {doubled_reads}, a phantom {phantom_reads}")
    print(f"figure: race: crashed by themselves (a traceback): {dict(crashes) or 0}")
    print(f"figure: race: {len(swaps)} compactions swapped in; kill -9: {dict(kills)}; "
          f"{len(temps)} hidden temporary files left by kills mid-write, {leftovers} covered "
          f"files left by a compaction killed mid-swap (neither is read)")
    print(f"figure: race: plain pyarrow reads {plain['reads']}, {plain['doubled']} counting a "
          f"row twice, {plain['errors']} failing (a file unlinked under them): plain readers "
          f"know no lock")
    assert (lost, doubled, phantom) == ([], [], [])
    assert not crashes, f"processes that crashed: {dict(crashes)} (their tracebacks above)"
    assert stale_reads == doubled_reads == phantom_reads == 0
    assert len(committed) > 20 and sum(kills.values()) >= 3  # the race happened
