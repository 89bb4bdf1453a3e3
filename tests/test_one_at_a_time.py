"""cluster.procs.one_at_a_time: the host-wide turn a pooled GPU worker takes
to make its CUDA context (cluster.actors.RankActor.warm)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

from cluster.procs import one_at_a_time


def _name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_a_free_turn_is_taken_at_once_and_given_back():
    name = _name()
    with one_at_a_time(name, timeout_s=5) as waited:
        assert waited < 0.5
    with one_at_a_time(name, timeout_s=5) as waited:  # given back on leaving the block
        assert waited < 0.5


def test_a_held_turn_is_waited_for_then_gone_ahead_without_past_the_timeout():
    name = _name()
    with one_at_a_time(name, timeout_s=5):
        t0 = time.monotonic()
        with one_at_a_time(name, timeout_s=0.3) as waited:  # another open file: a rival
            assert 0.3 <= waited < 3.0
        assert time.monotonic() - t0 >= 0.3


def test_a_holder_that_dies_frees_the_turn():
    name = _name()
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from cluster.procs import one_at_a_time
        with one_at_a_time({name!r}, timeout_s=5):
            print("held", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with one_at_a_time(name, timeout_s=0.2) as waited:  # the child holds it
            assert waited >= 0.2
        child.kill()
        child.wait()
        with one_at_a_time(name, timeout_s=5) as waited:  # the kernel freed it with its holder
            assert waited < 1.0
    finally:
        child.kill()
        child.wait()
