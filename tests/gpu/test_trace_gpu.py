"""``python -m jobs trace`` on two GPUs: a tp=2 process-per-GPU
all_reduce_norm group, both ranks under torch.profiler with CUDA
activities, merged onto one timeline: two rank tracks, each with its
lamport.call ranges and its own GPU kernels."""

import json

import pytest

from cluster.tracing import summary
from jobs.results import read_results
from tests.test_jobs_trace import run_trace

pytestmark = pytest.mark.multigpu


def test_tp2_process_per_gpu_trace_has_kernels_on_every_rank(tmp_path):
    _, out = run_trace(tmp_path, backend="gpu", placement="process-per-gpu")
    s = summary(json.loads(out.read_text()))
    rows = read_results(tmp_path / "results").to_pylist()
    calls = sum(json.loads(r["extra"])["repeats"] for r in rows)  # every call of every case
    assert len(s["tracks"]) == 2 and all("GPU" in t for t in s["tracks"]), s
    gpus = {t.split("GPU ")[1] for t in s["tracks"]}
    assert len(gpus) == 2, s  # one GPU per rank
    for label, c in s["per_rank"].items():
        # Host ranges once each (Kineto's GPU-timeline copies are gpu_calls:
        # counting both gave 16 for 8 calls on two H200s, 2026-11-30).
        assert c["calls"] == calls and c["kernels"] >= c["calls"], (label, c, calls)
