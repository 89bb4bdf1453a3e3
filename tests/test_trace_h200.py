"""The merged trace of a tp=2 group recorded on two H200s, opened and
checked: ``tests/data/trace_h200x2_tp2_2026-11-30.json.gz`` is the output
of ``python -m jobs trace ... --placement process-per-gpu`` (command, date
and GPUs in docs/results/service_h200x2_2026-11-30.md, section 3): four
all_reduce_norm cases (hidden 1024, M 1/3/8/2), two calls each.

It predates the fix that puts every batched call under its
``lamport.call`` range (the trace holds none); the CPU test of a traced
emulated group (test_jobs_trace.py) covers the ranges, this one what only
the GPUs can show: two rank tracks on two GPUs, every call's kernels on
both, and the clock alignment right to within the microseconds a Lamport
wait makes visible."""

import gzip
import json
from pathlib import Path

import pytest

from cluster.tracing import KERNEL_CATEGORY, summary

TRACE = Path(__file__).parent / "data" / "trace_h200x2_tp2_2026-11-30.json.gz"
CALLS = 8


@pytest.fixture(scope="module")
def trace():
    with gzip.open(TRACE, "rt") as f:
        return json.load(f)


def _spans(trace, pid, name):
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                  if e.get("cat") == KERNEL_CATEGORY and e["pid"] == pid and name in e["name"])


def test_two_rank_tracks_on_two_gpus_with_every_calls_kernels(trace):
    s = summary(trace)
    assert s["tracks"] == ["rank 0 (vm, GPU 0)", "rank 1 (vm, GPU 1)"], s["tracks"]
    for label, counts in s["per_rank"].items():
        assert counts["kernels"] == 56, (label, counts)  # 8 publish + 8 norm + the inputs' torch kernels
    for pid in (0, 1):
        assert len(_spans(trace, pid, "PublishKernel")) == CALLS
        assert len(_spans(trace, pid, "NormKernel")) == CALLS


def test_clock_alignment_respects_the_lamport_wait(trace):
    """A rank's norm kernel of call i cannot end before its peer's publish
    of call i began (it spins until the peer's fragments land): on the
    merged timeline every such pair is in that order."""
    for rank in (0, 1):
        norms, peer_publishes = _spans(trace, rank, "NormKernel"), _spans(trace, 1 - rank, "PublishKernel")
        for i, ((_, norm_end), (publish_start, _)) in enumerate(zip(norms, peer_publishes)):
            assert norm_end > publish_start, (rank, i, norm_end - publish_start)
    assert trace["otherData"]["lamport"]["ranks"] == ["rank 0 (vm, GPU 0)", "rank 1 (vm, GPU 1)"]
