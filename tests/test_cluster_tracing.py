"""cluster.tracing.merge on synthetic per-rank traces: one process track per
rank with its label, every event kept, clocks aligned through each rank's
clock mark, threads and flow ids kept apart between ranks; the summary
counts calls and GPU kernels per rank."""

import pytest

from cluster.tracing import CALL_EVENT, CLOCK_EVENT, merge, summary


def rank_trace(rank: int, *, skew_us: float, kernels: int, pid: int = 4242) -> dict:
    """A rank's trace whose profiler clock runs ``skew_us`` ahead of the
    wall clock's; its calls start at wall times 1000, 2000 (+ 50 us for
    rank 1, the straggler)."""
    late = 50.0 * rank

    def at(wall):  # wall us -> this rank's profiler us
        return wall + skew_us

    events = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 77, "args": {"name": "thread 77"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        {"ph": "X", "name": CLOCK_EVENT, "pid": pid, "tid": 77, "ts": at(10.0), "dur": 2.0},
    ]
    for n, wall in enumerate((1000.0, 2000.0), 1):
        events.append({"ph": "X", "name": f"{CALL_EVENT} {n}", "pid": pid, "tid": 77,
                       "ts": at(wall + late), "dur": 100.0, "cat": "user_annotation"})
    # Kineto's GPU-timeline copy of call 1's range (same name): not a second call.
    events.append({"ph": "X", "name": f"{CALL_EVENT} 1", "pid": 0, "tid": 7,
                   "ts": at(1008.0 + late), "dur": 40.0, "cat": "gpu_user_annotation"})
    for k in range(kernels):
        events += [{"ph": "X", "cat": "kernel", "name": f"lamport_publish_{k}", "pid": 0,
                    "tid": 7, "ts": at(1010.0 + 10 * k + late), "dur": 5.0},
                   {"ph": "s", "cat": "ac2g", "id": k, "pid": pid, "tid": 77,
                    "ts": at(1005.0 + late)},
                   {"ph": "f", "cat": "ac2g", "id": k, "pid": 0, "tid": 7,
                    "ts": at(1010.0 + 10 * k + late), "bp": "e"}]
    return {"traceEvents": events, "lamport_clock": 10.0}  # wall us as the mark opened


def test_each_rank_is_one_labelled_track_on_rank_0s_clock():
    traces = [rank_trace(0, skew_us=5_000.0, kernels=3), rank_trace(1, skew_us=-700.0, kernels=3)]
    labels = ["rank 0 (h200-a, GPU 0)", "rank 1 (h200-a, GPU 1)"]
    merged = merge(traces, labels)
    s = summary(merged)
    assert s["tracks"] == labels
    assert s["per_rank"] == {label: {"events": 3 * 3 + 4, "calls": 2, "gpu_calls": 1,
                                     "kernels": 3} for label in labels}
    calls = {(e["pid"], e["name"]): e["ts"] for e in merged["traceEvents"]
             if str(e.get("name", "")).startswith(CALL_EVENT)
             and e.get("cat") != "gpu_user_annotation"}
    # Rank 1's clock was 5.7 ms behind: on one timeline its calls are the
    # 50 us late they really were.
    for n in (1, 2):
        assert calls[(1, f"{CALL_EVENT} {n}")] - calls[(0, f"{CALL_EVENT} {n}")] == 50.0
    assert merged["otherData"]["lamport"]["clock_shift_us"] == [0.0, 5_700.0]
    # Both ranks had pid 4242 / device 0: now pid r, threads numbered per
    # rank with their names kept, flow ids distinct.
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in merged["traceEvents"]
               if e.get("name") == "thread_name"}
    assert threads == {(0, 1): "thread 77", (0, 2): "stream 7",
                       (1, 1): "thread 77", (1, 2): "stream 7"}
    flows = [(e["pid"], e["id"]) for e in merged["traceEvents"] if e["ph"] in ("s", "f")]
    assert len({i for _, i in flows}) == 6 and all(p == i >> 40 for p, i in flows)
    sort = {e["pid"]: e["args"]["sort_index"] for e in merged["traceEvents"]
            if e.get("name") == "process_sort_index"}
    assert sort == {0: 0, 1: 1}


def test_the_named_clock_mark_aligns_the_rank():
    """A rank with several clock marks is aligned through the one its
    tracer chose (``lamport_clock_mark``, in time order), not the first."""
    trace = rank_trace(1, skew_us=-700.0, kernels=0)
    first = next(e for e in trace["traceEvents"] if e.get("name") == CLOCK_EVENT)
    # two earlier marks whose wall readings were not kept (a deschedule
    # widened their brackets); listed out of time order on purpose
    trace["traceEvents"] += [dict(first, ts=first["ts"] - 300.0),
                             dict(first, ts=first["ts"] - 600.0)]
    trace.update(lamport_clock_mark=2, lamport_clock_bracket_us=3.0)
    merged = merge([rank_trace(0, skew_us=0.0, kernels=0), trace], ["rank 0", "rank 1"])
    assert merged["otherData"]["lamport"]["clock_shift_us"] == [0.0, 700.0]
    assert merged["otherData"]["lamport"]["clock_bracket_us"] == [None, 3.0]
    trace["lamport_clock_mark"] = 3
    with pytest.raises(ValueError, match="event number 3 of 3"):
        merge([rank_trace(0, skew_us=0.0, kernels=0), trace], ["rank 0", "rank 1"])


def test_the_tracer_keeps_its_tightest_clock_reading():
    from cluster.tracing import CLOCK_SAMPLES, RankTracer, clock_offset_us
    tracer = RankTracer(cuda=False)
    tracer.start()
    trace = tracer.stop()
    marks = [e for e in trace["traceEvents"] if e.get("name") == CLOCK_EVENT]
    assert len(marks) == CLOCK_SAMPLES and 0 <= trace["lamport_clock_mark"] < CLOCK_SAMPLES
    assert 0 <= trace["lamport_clock_bracket_us"] < 1e6
    clock_offset_us(trace)


def test_a_rank_without_its_clock_mark_is_refused():
    bad = rank_trace(1, skew_us=0.0, kernels=0)
    bad["traceEvents"] = [e for e in bad["traceEvents"] if e.get("name") != CLOCK_EVENT]
    with pytest.raises(ValueError, match="clock mark"):
        merge([rank_trace(0, skew_us=0.0, kernels=0), bad], ["rank 0", "rank 1"])
    with pytest.raises(ValueError, match="2 trace"):
        merge([rank_trace(0, skew_us=0.0, kernels=0)] * 2, ["rank 0"])
