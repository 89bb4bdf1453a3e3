"""The emulated backend in one process (threads stand in for rank processes;
the mailboxes are real shared-memory segments), and the backend seam."""

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from cluster.backend import make_backend, require_backend
from cluster.cases import bf16_from_bits, bits_from_bf16, case_inputs, make_case
from cluster.emulated import EmulatedRank
from cluster.emulated.host import HostHalf, run_threads
from cluster.emulated.lamport import consume, launch, publish
from cluster.emulated.segment import HostMailbox, segment_name, unlink_segment
from cluster.group import TPGroup
from kernels.lamport.protocol import ACTIVE_STAGE, NEXT_STAGE, slot_index
from kernels.reference.allreduce import all_reduce_norm, all_reduce_sum
from kernels.reference.numerics import assert_bit_exact

HIDDEN, CAPACITY = 64, 8


@pytest.fixture
def ranks(request):
    """tp set-up EmulatedRanks of one fresh group (tp from the test's param)."""
    tp = request.param
    group_id = uuid.uuid4().hex[:12]
    ranks = [EmulatedRank() for _ in range(tp)]
    with ThreadPoolExecutor(tp) as pool:
        setups = list(pool.map(lambda r: ranks[r].setup(group_id=group_id, rank=r, tp=tp,
                                                        capacity=CAPACITY, hidden=HIDDEN,
                                                        timeout_s=5), range(tp)))
    assert all(s["created"] and s["start_check"]["non_sentinel"] == 0 for s in setups)
    yield ranks
    for r in ranks:
        r.close()
        r.close()  # idempotent


def run_all(ranks, case, faults=None):
    return run_threads(ranks, case, faults, hidden=HIDDEN)


def test_slot_layout_is_the_protocol_index():
    box, created = HostMailbox.open_own(f"ll-{uuid.uuid4().hex[:12]}-r0", tp=3, capacity=5, hidden=16)
    try:
        strides = [s // box.slots.itemsize for s in box.slots.strides]
        for stage, source, token, column in [(0, 0, 0, 0), (2, 1, 4, 15), (1, 2, 3, 7)]:
            flat = int(np.dot(strides, (stage, source, token, column)))
            assert flat == slot_index(stage, 3, source, 5, token, 16, column)
    finally:
        box.close()
        box.unlink()


@pytest.mark.parametrize("ranks", [4], indirect=True)
def test_calls_match_reference_and_rotate_stages(ranks):
    for seq, (tokens, inputs) in enumerate([(1, "random"), (3, "order_sensitive"),
                                            (8, "sentinel_pattern"), (2, "random")]):
        case = make_case(capacity=CAPACITY, tokens=tokens, inputs=inputs, seed=seq)
        results = run_all(ranks, case.replace(seq=seq))
        i = case_inputs(case, tp=len(ranks), hidden=HIDDEN)
        partials, residual, weight = i["partials"], i["residual"], i["norm_weight"]
        norm_ref, residual_ref = all_reduce_norm(partials, residual, weight, case.eps)
        for res in results:
            assert res["consumed_stage"] == seq % 3 and res["record_count"] == 0
            assert res["mailbox_clean"] and not res["header_mismatch"]
            assert_bit_exact(bf16_from_bits(res["outputs"]["sum"]), all_reduce_sum(partials), "sum")
            assert_bit_exact(bf16_from_bits(res["outputs"]["residual"]), residual_ref, "residual")
            assert_bit_exact(bf16_from_bits(res["outputs"]["norm"]), norm_ref, "norm")
        assert all(r.state()["check"]["stage_state"] == (seq % 3, (seq + 1) % 3) for r in ranks)


OP_CASES = [("finalize_publish", {"top_k": 3}, ("random", "bf16_weights", "no_route",
                                             "order_sensitive", "sentinel_pattern")),
            ("embed_norm", {}, ("random", "shard_edges", "sentinel_pattern")),
            ("all_reduce_mhc", {"hc": 2}, ("random", "order_sensitive", "sentinel_pattern")),
            ("all_reduce_mhc", {"hc": 4, "finalize": True, "top_k": 2},
             ("random", "sentinel_pattern"))]


@pytest.mark.parametrize("ranks", [4], indirect=True)
@pytest.mark.parametrize("op, fields, kinds", OP_CASES)
def test_every_collective_op_matches_its_reference(ranks, op, fields, kinds):
    """Each registered collective op through the emulated protocol: the
    payload from its reference, the consumer's epilogue, every output
    within its bound on every rank (cluster.cases.check_outputs), the
    mailbox clean, the stage rotating; a wrong rank order is caught."""
    from cluster.cases import check_outputs
    for seq, (tokens, kind) in enumerate(zip((1, 5, 8, 2, 3), kinds)):
        case = make_case(capacity=CAPACITY, op=op, tokens=tokens, inputs=kind, seed=seq,
                         **fields)
        results = run_all(ranks, case.replace(seq=seq))
        for res in results:
            assert res["record_count"] == 0 and res["mailbox_clean"]
            report = check_outputs(case, tp=len(ranks), hidden=HIDDEN, outputs=res["outputs"])
            assert report["ok"], (op, kind, report)
            assert all(v["elements"] > 0 for k, v in report.items() if k != "ok")
        swapped = dict(results[0]["outputs"])
        swapped[next(iter(swapped))] = swapped[next(iter(swapped))] ^ np.uint16(1)
        assert not check_outputs(case, tp=len(ranks), hidden=HIDDEN, outputs=swapped)["ok"]


def test_case_fields_are_validated_per_op():
    with pytest.raises(ValueError, match="unknown case fields \\['hc'\\] for op all_reduce_norm"):
        make_case(capacity=8, tokens=1, hc=4)
    with pytest.raises(ValueError, match="hc = 9"):
        make_case(capacity=8, tokens=1, op="all_reduce_mhc", hc=9)
    with pytest.raises(ValueError, match="unknown inputs 'order_sensitive'"):
        make_case(capacity=8, tokens=1, op="embed_norm", inputs="order_sensitive")
    with pytest.raises(ValueError, match="unknown op 'nope'; known"):
        make_case(capacity=8, tokens=1, op="nope")
    assert make_case(capacity=8, tokens=1, op="finalize_publish").params.top_k == 8


def test_publish_sanitizes_and_keeps_negative_subnormals():
    name = f"ll-{uuid.uuid4().hex[:12]}-r0"
    box, _ = HostMailbox.open_own(name, tp=1, capacity=1, hidden=8)
    try:
        payload = np.array([[0x8000, 0x8001, 0x807F, 0x0000, 0x3F80, 0x8000, 0xBF80, 0x8040]],
                           dtype=np.uint16)
        assert publish([box], rank=0, seq=1, payload=payload).stage == 0
        assert box.slots[0, 0, 0].tolist() == [0, 0x8001, 0x807F, 0, 0x3F80, 0, 0xBF80, 0x8040]
        got = consume(box, seq=1, tokens=1, budget_ns=10**9)
        assert got.record_count == 0 and got.headers == ((1, 1),)
        assert got.sum_bits.tolist() == [[0, 0x8001, 0x807F, 0, 0x3F80, 0, 0xBF80, 0x8040]]
        assert box.check(0).non_sentinel == 0 and box.check(0).headers_set == 0
        assert box.check(0).stage_state == (0, 1)
    finally:
        box.close()
        box.unlink()


@pytest.fixture
def two_boxes():
    """The two fresh mailboxes (tp=2, capacity 2, hidden 8) of a group, no ranks."""
    group = uuid.uuid4().hex[:12]
    boxes = [HostMailbox.open_own(segment_name(group, r), tp=2, capacity=2, hidden=8)[0]
             for r in range(2)]
    yield boxes
    for b in boxes:
        b.close()
        b.unlink()


def test_out_of_range_stage_stores_nothing(two_boxes):
    boxes = two_boxes
    boxes[1].stage_state[NEXT_STAGE] = 7
    out = publish(boxes, rank=1, seq=1, payload=np.ones((2, 8), dtype=np.uint16))
    assert out.stage is None and out.bad_stage == 7
    assert boxes[1].stage_state[ACTIVE_STAGE] == 7
    assert all(b.check(r).non_sentinel == 0 for r, b in enumerate(boxes))
    got = consume(boxes[1], seq=1, tokens=2, budget_ns=10**9)
    assert got.bad_stage == 7 and torch.isnan(bf16_from_bits(got.sum_bits).float()).all()


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_watchdog_records_missing_source_and_writes_nan(ranks):
    case = make_case(capacity=CAPACITY, tokens=2, budget_ns=50_000_000)
    results = run_all(ranks, case.replace(seq=1), faults={1: {"kind": "skip_publish"}})
    r0 = results[0]
    assert r0["missing_sources"] == [1] and r0["record_count"] == 2 * HIDDEN // 8
    token, source, fragment, stage, words = r0["records"][0]
    assert (token, source, fragment, stage, words) == (0, 1, 0, 0, [0x80008000] * 4)
    assert r0["consume_ns"] < 1_000_000_000
    assert r0["headers"] == [[1, 2], None]
    assert torch.isnan(bf16_from_bits(r0["outputs"]["sum"]).float()).all()


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_host_start_skew_beyond_the_budget_is_not_a_timeout(ranks):
    """The launch rendezvous: rank 1's call starts 1.2 budgets after rank
    0's (a loaded host's dispatch skew), and the call still passes: rank 0
    waits a budget at the launch, then its watchdog a budget more, so rank
    1 has 0.8 s to publish (without the rendezvous rank 0's watchdog fires
    0.2 s before rank 1 even starts). A 1.5-budget skew of a 400 ms budget
    left 200 ms, and two threads of one process beside a busy core and
    another test worker once needed more."""
    budget_ns = 1_000_000_000
    case = make_case(capacity=CAPACITY, tokens=2, budget_ns=budget_ns).replace(seq=1)
    half = HostHalf(case, tp=len(ranks), hidden=HIDDEN)

    def late(r):
        if r == 1:
            time.sleep(1.2 * budget_ns / 1e9)
        return ranks[r].run_case(case, half.payload(r))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(late, range(2)))
    assert all(res["missing_sources"] == [] and not res["header_mismatch"] for res in results)


def test_launch_waits_for_every_peer_and_is_bounded(two_boxes):
    boxes = two_boxes
    assert [int(b.launched[0]) for b in boxes] == [-1, -1]
    started = time.monotonic()
    assert not launch(boxes, rank=0, seq=1, wait_ns=50_000_000)  # rank 1 never came
    assert 0.05 <= time.monotonic() - started < 1.0
    assert launch(boxes, rank=1, seq=1, wait_ns=50_000_000)
    boxes[0].scrub()  # recovery leaves the launch word alone
    assert int(boxes[0].launched[0]) == 1


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_token_count_mismatch_is_never_a_silent_answer(ranks):
    case = make_case(capacity=CAPACITY, tokens=4, budget_ns=50_000_000)
    results = run_all(ranks, case.replace(seq=1), faults={1: {"kind": "tokens_delta", "delta": 1}})
    for res in results:
        assert res["header_mismatch"]
        assert torch.isnan(bf16_from_bits(res["outputs"]["sum"]).float()).all()


def test_dirty_segment_found_and_scrubbed_at_setup():
    group = uuid.uuid4().hex[:12]
    left, _ = HostMailbox.open_own(segment_name(group, 0), tp=1, capacity=2, hidden=8)
    left.slots[1, 0, 1, :3] = 0x3F80
    left.stage_state[:] = (1, 1)
    left.close()  # the process "dies": no scrub, no unlink
    rank = EmulatedRank()
    try:
        setup = rank.setup(group_id=group, rank=0, tp=1, capacity=2, hidden=8, timeout_s=1)
        assert not setup["created"]
        assert setup["start_check"] == {"rank": 0, "non_sentinel": 3, "headers_set": 0,
                                        "stage_state": (1, 1)}
        clean = {"rank": 0, "non_sentinel": 0, "headers_set": 0, "stage_state": (0, 0)}
        assert rank.state()["check"] == clean
        assert rank.scrub() == clean
        peer = HostMailbox.attach(segment_name(group, 0), tp=1, capacity=2, hidden=8, timeout_s=1)
        peer.headers[2, 0] = (5, 2)
        peer.close()
        assert rank.scrub()["headers_set"] == 1 and rank.state()["check"] == clean
    finally:
        rank.close()


def test_setup_names_the_peer_that_never_came():
    group = uuid.uuid4().hex[:12]
    rank = EmulatedRank()
    with pytest.raises(TimeoutError, match=r"ll-.*-r1 not created"):
        rank.setup(group_id=group, rank=0, tp=2, capacity=2, hidden=8, timeout_s=0.1)
    with pytest.raises(TimeoutError):  # the failed rank left nothing behind
        HostMailbox.attach(segment_name(group, 0), tp=2, capacity=2, hidden=8, timeout_s=0)
    rank.close()


@pytest.mark.parametrize("bad, error, message", [
    ({"tp": 3}, ValueError, "tp must be one of 1, 2, 4, 8, got 3"),
    ({"tp": 16}, ValueError, "tp must be one of 1, 2, 4, 8, got 16"),
    ({"group_id": "a/b"}, ValueError, "group_id must be an ASCII word"),
    ({"hidden": 64.0}, TypeError, "hidden must be an int, got float 64.0"),
    ({"capacity": True}, TypeError, "capacity must be an int, got bool"),
    ({"timeout_s": float("nan")}, ValueError, "timeout_s must be finite"),
])
def test_emulated_setup_refuses_what_the_kernels_refuse_before_allocating(bad, error, message):
    import os
    before = set(os.listdir("/dev/shm"))
    kwargs = {"group_id": uuid.uuid4().hex[:12], "rank": 0, "tp": 2, "capacity": 2,
              "hidden": HIDDEN, "timeout_s": 0.1, **bad}
    with pytest.raises(error, match=message):
        EmulatedRank().setup(**kwargs)
    assert set(os.listdir("/dev/shm")) <= before  # nothing allocated


def test_an_empty_segment_left_by_a_failed_setup_is_removable():
    import _posixshmem
    import os
    name = f"ll-{uuid.uuid4().hex[:12]}-r0"
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.close(fd)  # created, never sized: what a setup killed before ftruncate leaves
    box, _ = HostMailbox.open_own(name, tp=1, capacity=1, hidden=8)  # replaces it
    box.close()
    unlink_segment(name)
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.close(fd)
    unlink_segment(name)
    assert not os.path.exists(f"/dev/shm/{name}")


def test_unknown_backend_and_bad_cases_are_named():
    with pytest.raises(ValueError, match=r"unknown backend 'cuda'; available: \['emulated', 'gpu'\]"):
        require_backend("cuda")
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        make_backend("cuda")
    with pytest.raises(ValueError, match="unknown backend 'nccl'"):
        TPGroup(tp=2, hidden=64, capacity=4, backend="nccl")
    with pytest.raises(ValueError, match="tokens must be in 1..capacity=8, got 9"):
        make_case(capacity=8, tokens=9)
    with pytest.raises(ValueError, match=r"unknown case fields \['colour'\]"):
        make_case(capacity=8, tokens=1, colour="red")


def test_bits_round_trip():
    x = torch.tensor([0.0, -0.0, 1.5, float("nan")], dtype=torch.bfloat16)
    assert bits_from_bf16(x).tolist() == [0, 0x8000, 0x3FC0, 0x7FC0]
    assert np.array_equal(bits_from_bf16(bf16_from_bits(bits_from_bf16(x))), bits_from_bf16(x))


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_a_payload_that_is_not_the_calls_bits_is_refused_naming_it(ranks):
    """The driver's HostHalf makes a rank's payload (cluster.emulated.host);
    one of the wrong M, dtype or kind is refused before the rank launches,
    and the group's next call is unaffected."""
    case = make_case(capacity=CAPACITY, tokens=2, budget_ns=10**9).replace(seq=1)
    for bad, what in [(None, "NoneType"), (np.zeros((3, HIDDEN), np.uint16), r"uint16 \[3, 64\]"),
                      (np.zeros((2, HIDDEN), np.float32), r"float32 \[2, 64\]")]:
        with pytest.raises(ValueError, match=rf"payload must be uint16 \[2, 64\] \(M, hidden\) "
                                             rf"BF16 bits, got {what}"):
            ranks[0].run_case(case, bad)
    assert all(r["check"]["ok"] for r in run_all(ranks, case))


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_a_mailbox_left_dirty_names_where_in_the_result_and_the_reason(ranks):
    """A call's own-mailbox check after the call says which stage, source
    and rows are not free and which header is set (its call seq and M), and
    the correctness reason carries it: a false or true "not all sentinel"
    is told apart from the row (a later call's publish, a late one)."""
    from types import SimpleNamespace

    from jobs.correctness import _reason
    case = make_case(capacity=CAPACITY, tokens=2, budget_ns=10**9)
    clean = run_all(ranks, case.replace(seq=1))
    assert [r["mailbox_clean"] for r in clean] == [True, True]
    assert [r["mailbox_dirt"] for r in clean] == [None, None]
    own = ranks[0]._own()
    own.slots[2, 1, 1:3, :5] = 0x3F80  # stage 2 (the call after next), rows 1-2 of source 1
    own.headers[2, 1] = (9, 3)
    dirty = run_all(ranks, case.replace(seq=2))
    assert not dirty[0]["mailbox_clean"] and dirty[1]["mailbox_clean"]
    assert dirty[0]["mailbox_dirt"] == "stage 2 source 1: rows 1-2 (10 lanes), header (seq 9, M 3)"
    call = SimpleNamespace(outcome="fail", diagnosis=SimpleNamespace(ok=True), errors={},
                           checks=[None, None], results=dirty)
    assert _reason(call, 0) == ("repeat 0: fail; mailbox not all sentinel after the call "
                                "(seq 2): rank 0: stage 2 source 1: rows 1-2 (10 lanes), "
                                "header (seq 9, M 3)")
    own.scrub()
    own.slots[0, 0, 0, 0] = own.slots[0, 0, 5, 1] = 1
    own.headers[1, 0] = (4, 1)
    assert own.dirt() == ("stage 0 source 0: 2 rows in 0-5 (2 lanes); "
                          "stage 1 source 0: header (seq 4, M 1)")
    assert own.dirt(limit=1) == "stage 0 source 0: 2 rows in 0-5 (2 lanes); 1 more"
    own.scrub()
    assert own.dirt() == ""
