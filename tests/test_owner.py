"""Owner mode (reduce-scatter + RMSNorm) without a GPU: the owner slot
formula, the token <-> owned-row map, the write set == read set argument of
the protocol (padding tokens included), the owner reference against the
one-shot reference's rows, option and input validation, and the compiled
owner kernels' PTX (and that the checks catch mutations)."""

import pytest
import torch

from cluster import ops
from jobs import compile_check as cc
from kernels import ptx_checks as ptx
from kernels.lamport import compile_variants as cv
from kernels.lamport import protocol as P
from kernels.lamport.all_reduce_norm import (AllReduceNorm, AllReduceNormOptions, VirtualRanks,
                                             validate_inputs)
from kernels.reference.allreduce import all_reduce_norm, owner_all_reduce_norm, owner_view
from kernels.reference.moe import all_reduce_norm_finalize, finalize_payloads, MoEPartial
from kernels.reference.numerics import order_sensitive_partials, random_partials

TPS = (1, 2, 4, 8)
EPS = 1e-6


# ---------------------------------------------------------------- slot formula
@pytest.mark.parametrize("tp", TPS)
def test_owner_slot_index_matches_a_contiguous_owner_mailbox(tp):
    capacity, hidden = 13, 24
    rows = P.owner_capacity(capacity, tp)
    mailbox = torch.arange(P.LAMPORT_GENERATIONS * tp * rows * hidden).reshape(
        P.mailbox_shape(tp, rows, hidden))
    flat = mailbox.flatten()
    for stage in range(P.LAMPORT_GENERATIONS):
        for source in range(tp):
            for token in range(P.owner_published_tokens(capacity, tp)):
                for column in (0, hidden - 8):
                    i = P.owner_slot_index(stage, tp, source, rows, token, hidden, column)
                    assert flat[i] == mailbox[stage, source, token // tp, column]


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("capacity", [1, 2, 7, 8, 13, 64])
def test_every_owned_token_has_its_own_slot(tp, capacity):
    """For each owner, the (source, token) pairs it receives map one to one
    onto its mailbox rows, all inside the owner capacity."""
    rows = P.owner_capacity(capacity, tp)
    tokens = P.owner_published_tokens(capacity, tp)
    for owner in range(tp):
        mine = [t for t in range(tokens) if t % tp == owner]
        slots = {P.owner_slot_index(0, tp, s, rows, t, 8, 0) for s in range(tp) for t in mine}
        assert len(slots) == tp * len(mine)
        assert max(slots) < tp * rows * 8


def test_owner_capacity_values():
    assert [P.owner_capacity(c, 4) for c in (1, 3, 4, 5, 8, 256)] == [1, 1, 1, 2, 2, 64]
    assert P.owner_capacity(96, 1) == 96
    for bad in ((0, 2), (4, 0)):
        with pytest.raises(ValueError, match=f"capacity={bad[0]}, tp={bad[1]}"):
            P.owner_capacity(*bad)


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 16, 17, 64])
def test_owned_rows_partition_the_tokens(tp, m):
    """Row j of owner o is token j * tp + o; the owners' rows cover every
    token once; every owner has ceil(M / tp) rows."""
    seen = []
    for owner in range(tp):
        tokens = P.owned_tokens(m, tp, owner)
        assert len(tokens) <= P.owner_rows(m, tp)
        assert list(tokens) == [j * tp + owner for j in range(len(tokens))]
        seen += tokens
    assert sorted(seen) == list(range(m))


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 7, 8, 9, 16, 17, 33])
def test_slots_written_are_the_slots_read(tp, m):
    """The publish (grid max(M, tp) tokens, token t -> owner t % tp, row t //
    tp) writes exactly the slots the consumers read (owner o, CTA j reads row
    j when j * tp + o < M or j == 0), so the sentinel is restored everywhere,
    and every owner reads every source in every call (the three-generation
    rotation stays in lockstep even for M < tp)."""
    written = {(t % tp, s, t // tp) for s in range(tp)
               for t in range(P.owner_published_tokens(m, tp))}
    read = set()
    for owner in range(tp):
        for j in range(P.owner_rows(m, tp)):
            if j * tp + owner < m or j == 0:
                read |= {(owner, s, j) for s in range(tp)}
    assert written == read
    for owner in range(tp):
        assert {s for (o, s, _) in read if o == owner} == set(range(tp))


# ---------------------------------------------------------------- reference
def _inputs(tp, m, hidden, seed, kind="random"):
    xs = (random_partials(tp, m, hidden, seed=seed) if kind == "random"
          else order_sensitive_partials(tp, m, hidden))
    g = torch.Generator().manual_seed(seed)
    residual = torch.randn(m, hidden, generator=g).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)
    return xs, residual, weight


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("m", [1, 2, 7, 16, 17])
@pytest.mark.parametrize("kind", ["random", "order"])
def test_owner_reference_is_the_one_shot_rows(tp, m, kind):
    hidden = 64
    xs, residual, weight = _inputs(tp, m, hidden, seed=10 * tp + m, kind=kind)
    norm, res = all_reduce_norm(xs, residual, weight, EPS)
    for owner in range(tp):
        o_norm, o_res = owner_all_reduce_norm(xs, owner_view(residual, tp, owner), weight,
                                              EPS, owner=owner)
        assert o_norm.shape == (P.owner_rows(m, tp), hidden)
        assert torch.equal(o_norm.view(torch.int16), owner_view(norm, tp, owner).view(torch.int16))
        assert torch.equal(o_res.view(torch.int16), owner_view(res, tp, owner).view(torch.int16))
        count = len(P.owned_tokens(m, tp, owner))
        for j in range(count):
            assert torch.equal(o_res[j], res[j * tp + owner])
        assert not o_res[count:].any() and not o_norm[count:].any()


def test_owner_reference_sees_a_wrong_rank_order():
    tp, m, hidden = 4, 8, 64
    xs, residual, weight = _inputs(tp, m, hidden, seed=1, kind="order")
    own = owner_view(residual, tp, 1)
    _, a = owner_all_reduce_norm(xs, own, weight, EPS, owner=1)
    _, b = owner_all_reduce_norm(xs, own, weight, EPS, owner=1, order=[3, 2, 1, 0])
    assert not torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_owner_reference_on_finalize_payloads():
    """The owner finalize path: the finalize payloads through the owner
    reference equal the one-shot finalize reference's owned rows."""
    tp, m, hidden, top_k = 2, 5, 32, 4
    g = torch.Generator().manual_seed(3)
    parts = []
    for _ in range(tp):
        idx = torch.randperm(m * top_k, generator=g).to(torch.int32).view(m, top_k)
        idx[0, 1] = -1
        parts.append(MoEPartial(torch.randn(m * top_k, hidden, generator=g).to(torch.bfloat16),
                                torch.rand(m, top_k, generator=g), idx,
                                torch.randn(m, hidden, generator=g).to(torch.bfloat16)))
    residual = torch.randn(m, hidden, generator=g).to(torch.bfloat16)
    weight = torch.ones(hidden, dtype=torch.bfloat16)
    norm, res = all_reduce_norm_finalize(parts, residual, weight, EPS)
    payloads = finalize_payloads(parts)
    for owner in range(tp):
        o_norm, o_res = owner_all_reduce_norm(payloads, owner_view(residual, tp, owner),
                                              weight, EPS, owner=owner)
        assert torch.equal(o_res, owner_view(res, tp, owner))
        assert torch.equal(o_norm, owner_view(norm, tp, owner))


@pytest.mark.parametrize("kwargs, match", [
    (dict(owner=4), r"owner must be in \[0, 3\], got 4"),
    (dict(residual=torch.zeros(7, 64, dtype=torch.bfloat16)),
     r"residual must have shape \[2, 64\]"),
])
def test_owner_reference_validates(kwargs, match):
    xs, _, weight = _inputs(4, 7, 64, seed=2)
    args = dict(owner=1, residual=torch.zeros(2, 64, dtype=torch.bfloat16))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        owner_all_reduce_norm(xs, args["residual"], weight, EPS, owner=args["owner"])


# ---------------------------------------------------------------- host validation
H, CAP = 2560, 16


def bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize("tp, m, rows", [(1, 7, 7), (2, 7, 4), (4, 7, 2), (8, 7, 1), (8, 16, 2)])
def test_owner_inputs_hold_the_owned_rows(tp, m, rows):
    assert validate_inputs(bf16(m, H), bf16(rows, H), bf16(H), (bf16(rows, H), bf16(rows, H)),
                           hidden=H, capacity=CAP, mode="owner", tp=tp) == m
    with pytest.raises(ValueError, match=rf"residual must have shape \[{rows}, 2560\]"):
        validate_inputs(bf16(m, H), bf16(m + 1, H), bf16(H), hidden=H, capacity=CAP,
                        mode="owner", tp=tp)
    with pytest.raises(ValueError, match=rf"out\[0\] \(norm_out\) must have shape \[{rows}, "):
        validate_inputs(bf16(m, H), bf16(rows, H), bf16(H), (bf16(m + 1, H), bf16(rows, H)),
                        hidden=H, capacity=CAP, mode="owner", tp=tp)


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="reduce_scatter"), r"mode must be one of \['one_shot', 'owner'\], got "
                                  r"'reduce_scatter'"),
    (dict(mode="owner", transport="multicast"),
     r"mode='owner' .*unicast by nature.*got 'multicast'"),
])
def test_bad_mode_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AllReduceNormOptions(4096, 16, 1e-6, **kwargs).validate()
    # The host classes refuse before touching a device or a compiler.
    with pytest.raises(ValueError, match=match):
        AllReduceNorm(hidden_size=4096, max_num_tokens=16, eps=1e-6, **kwargs)


def test_virtual_ranks_refuse_bad_mode_before_allocating():
    with pytest.raises(ValueError, match="mode must be one of"):
        VirtualRanks(tp=2, hidden_size=4096, max_num_tokens=16, eps=1e-6, mode="owners")
    with pytest.raises(ValueError, match="tp must be one of 1, 2, 4, 8, got 3"):
        VirtualRanks(tp=3, hidden_size=4096, max_num_tokens=16, eps=1e-6, mode="owner")


def test_owner_mailbox_rows():
    o = AllReduceNormOptions(4096, 13, 1e-6, mode="owner")
    assert [o.mailbox_rows(tp) for tp in TPS] == [13, 7, 4, 2]
    assert AllReduceNormOptions(4096, 13, 1e-6).mailbox_rows(8) == 13


# ---------------------------------------------------------------- compiled kernels
@pytest.fixture(scope="module")
def owner_rows_ptx(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ptx"))
    variants = [v for v in ops.get("all_reduce_norm").variants([2560], [4])
                + ops.get("finalize_publish").variants([], [4]) if v.mode == "owner"]
    return [cc.run_variant(v, "sm_90a", root, i) for i, v in enumerate(variants)]


def test_owner_variants_compile_and_pass(owner_rows_ptx):
    # 1 publish + 2 consumers + the finalize owner configs
    assert len(owner_rows_ptx) == 3 + len(cv.FINALIZE_OWNER_CHECK_CONFIGS)
    assert all(not r.errors for r in owner_rows_ptx), [r.errors for r in owner_rows_ptx]


def test_owner_publish_stores_once(owner_rows_ptx):
    for row in owner_rows_ptx:
        if row.variant.kernel != "publish":
            continue
        stores = [ln for ln in row.lines if ln.startswith("st.relaxed.sys")]
        assert len(stores) == 1, (row.variant.detail, stores)
        # The same lines checked as a one-shot publish of tp=4 fail: one store, not 4.
        one_shot = ptx.Variant(row.variant.op, "publish", row.variant.entry, None,
                               transport="unicast", tp=4)
        if row.variant.check is None:
            assert ptx.check_publish(row.lines, one_shot)
            assert ptx.check_publish(row.lines + [stores[0]], row.variant)
        else:
            assert row.variant.check(row.lines + [stores[0]], row.variant)


def test_owner_consumer_order_and_watchdog(owner_rows_ptx):
    consumers = {r.variant.budget_ns: r for r in owner_rows_ptx
                 if r.variant.kernel == "consumer"}
    assert set(consumers) == {0, cv.CHECK_BUDGET_NS}
    wd = consumers[cv.CHECK_BUDGET_NS]
    assert any("%globaltimer" in ln for ln in wd.lines)
    assert not any("%globaltimer" in ln for ln in consumers[0].lines)
    plain = [ln.replace("ld.volatile.global.v4", "ld.global.v4") for ln in wd.lines]
    assert any("volatile" in e for e in ptx.check_consumer(plain, wd.variant))


# ---------------------------------------------------------------- crossover benchmark
def test_crossover_summary():
    from benchmarks.owner_crossover import summarize

    def row(m, one_shot, owner, hidden=5120):
        return {"hidden": hidden, "m": m, "one_shot": [one_shot] * 10, "owner": [owner] * 10}

    rows = [row(1, 4.0, 5.0), row(64, 6.0, 5.9), row(128, 8.0, 8.5), row(256, 12.0, 8.0),
            row(512, 20.0, 10.0), row(512, 5.0, 6.0, hidden=7168)]
    assert summarize(rows) == [
        "hidden 5120: owner mode faster from M=256 on (speedup one_shot/owner M=256: 1.50x, "
        "M=512: 2.00x)",
        "hidden 7168: owner mode not faster at the largest M measured (speedup one_shot/owner "
        "M=512: 0.83x)"]


def test_crossover_needs_gpus(capsys):
    from benchmarks.owner_crossover import main

    if torch.cuda.device_count() >= 2:
        pytest.skip("GPUs present")
    assert main(["--tp", "2"]) == 2
    assert "needs 2 GPUs" in capsys.readouterr().err


# ---------------------------------------------------------------- emulated backend
def _owner_boxes(tp, capacity, hidden):
    import uuid

    from cluster.emulated.segment import HostMailbox, segment_name

    group = uuid.uuid4().hex[:12]
    return [HostMailbox.open_own(segment_name(group, r), tp=tp,
                                 capacity=P.owner_capacity(capacity, tp), hidden=hidden)[0]
            for r in range(tp)]


def _close(boxes):
    for b in boxes:
        b.close()
        b.unlink()


@pytest.mark.parametrize("tp", [2, 4])
def test_emulated_owner_calls_match_the_owner_reference(tp):
    """The numpy owner protocol (cluster.emulated.lamport, mode="owner") over
    host mailboxes of owner capacity: every owner's rows bit-exact against
    the one-shot sum's owned rows, mailboxes clean and stages in lockstep
    after each call, M below, at and above tp."""
    from cluster.cases import bf16_from_bits, bits_from_bf16
    from cluster.emulated.lamport import consume, publish
    from kernels.reference.allreduce import all_reduce_sum
    from kernels.reference.numerics import sentinel_pattern_partials

    capacity, hidden = 9, 16
    boxes = _owner_boxes(tp, capacity, hidden)
    try:
        for seq, m in enumerate([1, 3, tp, 9, 5, 2]):
            xs = (sentinel_pattern_partials(tp, m, hidden, seed=seq) if seq % 2
                  else random_partials(tp, m, hidden, seed=seq))
            for r in range(tp):
                assert publish(boxes, rank=r, seq=seq, payload=bits_from_bf16(xs[r]),
                               mode="owner").stage == seq % 3
            total = all_reduce_sum(xs)
            for r in range(tp):
                got = consume(boxes[r], seq=seq, tokens=m, budget_ns=10**9, mode="owner",
                              rank=r)
                assert got.record_count == 0 and not got.header_mismatch
                assert got.sum_bits.shape == (P.owner_rows(m, tp), hidden)
                assert torch.equal(bf16_from_bits(got.sum_bits).view(torch.int16),
                                   owner_view(total, tp, r).view(torch.int16)), (seq, m, r)
            for r, b in enumerate(boxes):
                assert b.check(r).non_sentinel == 0 and b.check(r).headers_set == 0
                assert b.check(r).stage_state == (seq % 3, (seq + 1) % 3)
    finally:
        _close(boxes)


def test_emulated_owner_skipped_publish_names_the_rank():
    from cluster.cases import bf16_from_bits, bits_from_bf16
    from cluster.emulated.lamport import consume, publish

    tp, m, hidden = 4, 6, 16
    boxes = _owner_boxes(tp, 8, hidden)
    try:
        xs = random_partials(tp, m, hidden, seed=1)
        for r in (0, 1, 3):
            publish(boxes, rank=r, seq=0, payload=bits_from_bf16(xs[r]), mode="owner")
        for r in (0, 1, 3):
            got = consume(boxes[r], seq=0, tokens=m, budget_ns=20_000_000, mode="owner", rank=r)
            assert got.missing_sources == {2}, (r, got.missing_sources)
            assert all(t % tp == r and s == 2 for t, s, *_ in got.records), got.records
            count = len(P.owned_tokens(m, tp, r))
            out = bf16_from_bits(got.sum_bits).float()
            assert torch.isnan(out[:count]).all() and not out[count:].any()
    finally:
        _close(boxes)


def test_emulated_bad_mode_is_named():
    from cluster.emulated.lamport import publish

    with pytest.raises(ValueError, match="mode must be one of .*'owners'"):
        publish([], rank=0, seq=0, payload=None, mode="owners")


def test_mailbox_fit_per_mode():
    owner = AllReduceNormOptions(4096, 13, 1e-6, mode="owner")
    owner.check_mailbox(4, 4, 4096)
    owner.check_mailbox(4, 13, 4096)  # a one-shot-sized mailbox serves owner calls
    with pytest.raises(ValueError, match=r"capacity=3 hidden=4096, expected capacity >= 4 "
                                         r"hidden=4096 \(mode='owner', max_num_tokens=13, tp=4\)"):
        owner.check_mailbox(4, 3, 4096)
    one_shot = AllReduceNormOptions(4096, 13, 1e-6)
    one_shot.check_mailbox(4, 13, 4096)
    for capacity, hidden in ((14, 4096), (13, 2048)):
        with pytest.raises(ValueError, match=f"capacity={capacity} hidden={hidden}, expected "
                                             "capacity 13 hidden=4096"):
            one_shot.check_mailbox(4, capacity, hidden)


def test_timing_spec_takes_the_mode():
    from cluster.measure.workload import Spec

    base = dict(op="all_reduce_norm", hidden=5120, tokens=64, calls=10, replays=5, rotate_mb=1.0,
                eps=1e-6, baselines=["one_shot"], seed=0, budget_ns=0)
    assert Spec.of(base).mode == "one_shot"
    assert Spec.of({**base, "mode": "owner"}).mode == "owner"
    with pytest.raises(ValueError, match=r"mode must be one of \['one_shot', 'owner'\], got 'rs'"):
        Spec.of({**base, "mode": "rs"})
