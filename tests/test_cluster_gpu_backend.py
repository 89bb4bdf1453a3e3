"""The gpu backend's CPU-testable parts: registry, the error buffer → group
diagnosis path, CUDA IPC handle plumbing, setup errors, and the shared-GPU
placement on a local Ray cluster with fake GPUs (emulated ranks: the
placement, not the kernels)."""

import os

import numpy as np
import pytest
import ray

from cluster.backend import BACKENDS, make_backend, needs_rendezvous, release_rank, require_backend
from cluster.cases import check_outputs, make_case
from kernels.lamport.diagnosis import RankReport, diagnose
from cluster.gpu import GpuRank
from cluster.gpu.ipc import IpcHandle, check_handles, peer_addresses
from cluster.gpu.report import mask_ranks, result_fields
from cluster.group import TPGroup
from jobs.correctness import SETUP_TIMEOUT_S
from kernels.lamport.mailbox import RankErrors
from kernels.lamport.protocol import (ERR_BAD_STAGE, ERR_COUNT, ERR_HEADER_WORDS,
                                      ERR_MISSING_MASK, ERR_RECORD_WORDS, ERR_UNSANITIZED_MASK,
                                      SENTINEL_WORD, error_buffer_words)
from tests.ray_local import local_ray_cluster

pytestmark = pytest.mark.xdist_group("ray")  # starts Ray clusters: one at a time (conftest)

HIDDEN, CAPACITY = 64, 4


# ---------------------------------------------------------------- registry
def test_gpu_backend_is_registered():
    assert require_backend("gpu") == "gpu" and BACKENDS["gpu"] == "cluster.gpu"
    assert needs_rendezvous("gpu") and not needs_rendezvous("emulated")
    assert isinstance(make_backend("gpu"), GpuRank)
    release_rank("gpu", group_id="g", rank=0)  # nothing on the node: a no-op


def test_gpu_setup_errors_name_the_values():
    rank = GpuRank()
    with pytest.raises(ValueError, match=r"unknown gpu backend options \['colour'\]"):
        rank.setup(group_id="g", rank=0, tp=1, capacity=1, hidden=64, timeout_s=1,
                   options={"colour": 1})
    with pytest.raises(ValueError, match="unknown placement 'mps'"):
        rank.setup(group_id="g", rank=0, tp=1, capacity=1, hidden=64, timeout_s=1,
                   options={"placement": "mps", "master_addr": "x", "master_port": 1})
    with pytest.raises(ValueError, match="needs master_addr and master_port"):
        rank.setup(group_id="g", rank=0, tp=1, capacity=1, hidden=64, timeout_s=1, options={})
    with pytest.raises(RuntimeError, match="no CUDA device visible"):
        rank.setup(group_id="g", rank=0, tp=1, capacity=1, hidden=64, timeout_s=1,
                   options={"master_addr": "127.0.0.1", "master_port": 1})
    with pytest.raises(RuntimeError, match="not set up"):
        rank.run_case({"tokens": 1})
    rank.close()
    rank.close()  # idempotent


# ---------------------------------------------------------------- error buffer -> diagnosis
def errors(rank, *, stage_state, missing=(), unsanitized=(), bad=None, records=()):
    """A decoded error buffer built from raw words, as the kernel leaves it."""
    words = [0] * error_buffer_words(4)
    words[ERR_COUNT] = len(records)
    words[ERR_MISSING_MASK] = sum(1 << s for s in missing)
    words[ERR_UNSANITIZED_MASK] = sum(1 << s for s in unsanitized)
    words[ERR_BAD_STAGE] = 0 if bad is None else bad + 1
    for i, rec in enumerate(records[:4]):
        at = ERR_HEADER_WORDS + i * ERR_RECORD_WORDS
        words[at:at + ERR_RECORD_WORDS] = list(rec)
    words = [w - (1 << 32) if w >= 1 << 31 else w for w in words]  # int32 as read back
    return RankErrors.decode(rank, stage_state, words)


def rec(token, source, stage):
    return (token, source, 0, stage, SENTINEL_WORD, SENTINEL_WORD, SENTINEL_WORD, SENTINEL_WORD)


def report(err, *, expected, next_before, published, tokens=3, seq=5):
    return RankReport.from_result(result_fields(err, seq=seq, tokens=tokens,
                                                expected_stage=expected,
                                                next_stage_before=next_before,
                                                published=published))


def test_skipped_publish_from_kernel_records_names_the_rank():
    # The H200 pattern (tp=4, rank 2 skipped on the second call): ranks 0, 1, 3
    # consumed stage 1 and miss source 2; rank 2's ACTIVE_STAGE stayed 0, so
    # it read the old generation and blames everyone.
    reports = []
    for r in range(4):
        if r == 2:
            err = errors(2, stage_state=(0, 1), missing=range(4),
                         records=[rec(0, s, 0) for s in range(4)])
            reports.append(report(err, expected=1, next_before=1, published=False))
        else:
            err = errors(r, stage_state=(1, 2), missing=(2,), records=[rec(0, 2, 1)])
            reports.append(report(err, expected=1, next_before=1, published=True))
    d = diagnose(reports, tp=4)
    assert d.kind == "missing_ranks" and d.missing_ranks == {2}
    assert d.stale_ranks == {2} and d.timed_out_ranks == {0, 1, 2, 3}
    assert d.summary().startswith("missing ranks: {2}; rank 2 did not publish")
    assert d.first_record.source == 2


def test_skipped_publish_right_after_recovery_is_not_stale_but_missing():
    reports = [report(errors(0, stage_state=(0, 1), missing=(1,), records=[rec(0, 1, 0)]),
                      expected=0, next_before=0, published=True),
               report(errors(1, stage_state=(0, 1), missing=(1,), records=[rec(0, 1, 0)]),
                      expected=0, next_before=0, published=False)]
    d = diagnose(reports, tp=2)
    assert d.missing_ranks == {1} and not d.stale_ranks


def test_corrupt_stage_and_token_mismatch_from_kernel_state():
    bad = errors(1, stage_state=(7, 7), bad=7)
    r1 = report(bad, expected=0, next_before=7, published=True)
    assert r1.published_stage is None and r1.bad_stage == 7
    r0 = report(errors(0, stage_state=(0, 1), missing=(1,), records=[rec(0, 1, 0)]),
                expected=0, next_before=0, published=True)
    d = diagnose([r0, r1], tp=2)
    assert d.kind == "bad_stage" and d.bad_stage_ranks == {1} and not d.missing_ranks
    # Rank 1 published and consumed one token fewer: the GPU kernels publish
    # no (seq, M) header, so the ranks' own token counts name it (the
    # majority; a 1:1 split names both).
    short = report(errors(1, stage_state=(0, 1)), expected=0, next_before=0, published=True,
                   tokens=2)
    full = [report(errors(r, stage_state=(0, 1), missing=(1,), records=[rec(2, 1, 0)]),
                   expected=0, next_before=0, published=True, tokens=3) for r in (0, 2)]
    d = diagnose([full[0], short, full[1]], tp=3)
    assert d.kind == "token_count_mismatch" and d.token_mismatch_ranks == {1}
    assert diagnose([full[0], short], tp=2).token_mismatch_ranks == {0, 1}
    # With the (seq, M) the driver asked for (TPGroup passes it), tp=2 names rank 1.
    d = diagnose([full[0], short], tp=2, expected=(5, 3))
    assert d.kind == "token_count_mismatch" and d.token_mismatch_ranks == {1}


def test_result_fields_follow_the_backend_contract():
    err = errors(3, stage_state=(2, 0), unsanitized=(1,),
                 records=[(1, 1, 1, 2, 0x3F803F80, 0x80003F80, 0x3F803F80, 0x3F803F80)])
    fields = result_fields(err, seq=9, tokens=2, expected_stage=2, next_stage_before=2,
                           published=True)
    assert fields["partial_sources"] == [1] and fields["missing_sources"] == []
    assert fields["records"] == [[1, 1, 1, 2, [0x3F803F80, 0x80003F80, 0x3F803F80, 0x3F803F80]]]
    assert fields["headers"] == [] and fields["record_count"] == 1
    d = diagnose([RankReport.from_result(fields)], tp=4, absent={0: "x", 1: "y", 2: "z"})
    assert d.unsanitized_ranks == {1}
    assert mask_ranks(0b1011) == [0, 1, 3]


# ---------------------------------------------------------------- CUDA IPC plumbing
def handle(rank, *, uuid="GPU-a", pid=None, shape=(3, 2, 4, 64)):
    return IpcHandle(rank=rank, pid=100 + rank if pid is None else pid, device_uuid=uuid,
                     shape=shape, dtype="torch.bfloat16", payload=())


def test_ipc_handles_are_checked_by_name():
    shape = (3, 2, 4, 64)
    ok = [handle(0), handle(1)]
    check_handles(ok, tp=2, rank=1, device_uuid="GPU-a", shape=shape)
    with pytest.raises(ValueError, match=r"ranks 0..1 in order, got \[1, 0\]"):
        check_handles(ok[::-1], tp=2, rank=0, device_uuid="GPU-a", shape=shape)
    with pytest.raises(ValueError, match=r"ranks \[1\] export mailboxes on other GPUs \{1: 'GPU-b'\}"):
        check_handles([handle(0), handle(1, uuid="GPU-b")], tp=2, rank=0, device_uuid="GPU-a",
                      shape=shape)
    with pytest.raises(ValueError, match=r"distinct processes, got pids \[7, 7\]"):
        check_handles([handle(0, pid=7), handle(1, pid=7)], tp=2, rank=0, device_uuid="GPU-a",
                      shape=shape)
    with pytest.raises(ValueError, match=r"shapes differ from \[3, 2, 4, 64\]: \{1: \[3, 2, 4, 8\]\}"):
        check_handles([handle(0), handle(1, shape=(3, 2, 4, 8))], tp=2, rank=0,
                      device_uuid="GPU-a", shape=shape)


def test_peer_table_opens_every_peer_but_itself():
    opened = []

    def opener(h):
        opened.append(h.rank)
        return {"ptr": 0x10000 * (h.rank + 1)}

    hs = [handle(r) for r in range(4)]
    ptrs, keep = peer_addresses(hs, rank=2, own_ptr=0xABC0, opener=opener,
                                address=lambda o: o["ptr"])
    assert ptrs == [0x10000, 0x20000, 0xABC0, 0x40000] and opened == [0, 1, 3] and len(keep) == 3
    with pytest.raises(ValueError, match="rank 1's mailbox opened at 0x10008: not 16-byte aligned"):
        peer_addresses(hs[:2], rank=0, own_ptr=0, opener=lambda h: 0x10008, address=int)


# ---------------------------------------------------------------- cases
def test_zero_residual_case_and_unobserved_sum():
    case = make_case(capacity=4, tokens=2, residual="zeros")
    with pytest.raises(ValueError, match=r"residual = 'ones' is not valid"):
        make_case(capacity=4, tokens=2, residual="ones")
    report_ = check_outputs(case, tp=2, hidden=HIDDEN, outputs={
        "sum": None, "residual": np.zeros((2, HIDDEN), np.uint16),
        "norm": np.zeros((2, HIDDEN), np.uint16)})
    assert report_["sum"] == {"observed": False}


# ---------------------------------------------------------------- shared-GPU placement
@pytest.fixture(scope="module")
def fake_gpu_cluster():
    with local_ray_cluster(num_cpus=2, num_gpus=2):
        yield


@pytest.mark.parametrize("tp", [2, 4])
def test_shared_gpu_group_puts_every_rank_on_one_gpu(fake_gpu_cluster, tp):
    with TPGroup(tp=tp, hidden=HIDDEN, capacity=CAPACITY, gpus_per_rank=1 / tp,
                 call_timeout_s=5, setup_timeout_s=SETUP_TIMEOUT_S) as g:
        assert g.placement == "shared-gpu" and g._bundles == [{"GPU": 1.0}]
        ids = [m["gpu_ids"] for m in g.metadata]
        assert len(ids[0]) == 1 and ids == [ids[0]] * tp, ids
        assert len({m["pid"] for m in g.metadata}) == tp
        call = g.run(g.case(tokens=3, residual="zeros", budget_ns=10**9))
        assert call.outcome == "pass", call.diagnosis.summary()
        for x in call.results:
            assert np.array_equal(x["outputs"]["sum"], x["outputs"]["residual"])


def test_shared_gpu_share_must_fit_one_gpu(fake_gpu_cluster):
    with pytest.raises(ValueError, match=r"tp \* gpus_per_rank must be <= 1 \(one GPU\), got 4 \* 0.5"):
        TPGroup(tp=4, hidden=HIDDEN, capacity=CAPACITY, gpus_per_rank=0.5)


def test_gpu_backend_group_reaches_setup_with_a_rendezvous(fake_gpu_cluster):
    # Fake GPUs: the actors are placed and given rank 0's address and port,
    # then the backend finds no CUDA device and says so.
    with pytest.raises(Exception, match="no CUDA device visible") as info:
        TPGroup(tp=2, hidden=HIDDEN, capacity=CAPACITY, backend="gpu", gpus_per_rank=0.5,
                setup_timeout_s=SETUP_TIMEOUT_S)
    assert "CUDA_VISIBLE_DEVICES=" in str(info.value)
    assert not os.environ.get("MASTER_PORT")  # nothing leaked into the driver


def test_topology_discovery_answers_while_every_gpu_is_held(fake_gpu_cluster):
    # a standing pool holds every GPU of its nodes in a placement group; the
    # discovery task used to ask for all of them and waited out its timeout
    # behind it (60 s of every --pool run on the H200)
    import time

    from ray.util.placement_group import placement_group, remove_placement_group

    from cluster.topology import discover_cluster
    held = placement_group([{"GPU": 1}, {"GPU": 1}], strategy="STRICT_PACK")
    ray.get(held.ready(), timeout=30)
    try:
        assert ray.available_resources().get("GPU", 0) == 0
        started = time.monotonic()
        topo = discover_cluster(timeout_s=20)
        assert time.monotonic() - started < 20
        assert len(topo.nodes) == 1
    finally:
        remove_placement_group(held)


def test_a_discovery_past_its_timeout_is_waited_for_again_not_submitted_again(
        fake_gpu_cluster, monkeypatch, tmp_path):
    # on a loaded box a discovery task's worker took longer than the timeout
    # to start, and every job on the pool then submitted another one
    from cluster import topology
    marks = tmp_path / "ran"
    marks.mkdir()

    def slow(node_id):  # nested: Ray ships it by value
        import os
        import time
        (marks / str(os.getpid())).touch()
        time.sleep(3)
        from cluster.discovery import discover_node
        return discover_node(node_id)

    monkeypatch.setattr(topology, "discover_node", slow)
    with pytest.raises(TimeoutError, match=r"within 0.5 s; their tasks are kept"):
        topology.discover_cluster(timeout_s=0.5)
    assert len(topology._PENDING) == 1
    topo = topology.discover_cluster(timeout_s=60)
    assert len(topo.nodes) == 1 and not topology._PENDING
    assert len(list(marks.iterdir())) == 1  # one task ran, not two


def test_each_peer_gets_an_export_of_its_own():
    """torch's CUDA IPC counts one reference per export: a shared-GPU rank
    exports its mailbox once per peer (never for itself), and each rank
    opens the exports meant for it."""
    from cluster.gpu.ipc import exports_for_peers, handles_for
    made = []

    def export_of(rank):
        def export():
            made.append(rank)
            return IpcHandle(rank=rank, pid=100 + rank, device_uuid="GPU-a", shape=(3, 4, 2, 8),
                             dtype="torch.bfloat16", payload=(rank, len(made)))
        return export
    tp = 4
    own = [IpcHandle(rank=r, pid=100 + r, device_uuid="GPU-a", shape=(3, 4, 2, 8),
                     dtype="torch.bfloat16", payload=()) for r in range(tp)]
    gathered = [exports_for_peers(export_of(r), own[r], tp, r) for r in range(tp)]
    assert sorted(made) == [r for r in range(tp) for _ in range(tp - 1)]
    for rank in range(tp):
        mine = handles_for(gathered, rank)
        assert [h.rank for h in mine] == list(range(tp)) and mine[rank].payload == ()
        check_handles(mine, tp=tp, rank=rank, device_uuid="GPU-a", shape=(3, 4, 2, 8))
    payloads = [h.payload for rank in range(tp) for h in handles_for(gathered, rank) if h.payload]
    assert len(set(payloads)) == tp * (tp - 1)  # no export opened twice
