"""The embedding publish and the embed-norm consumer without a GPU: compiles
for sm_90a and sm_100a, PTX checks, and input validation."""

import pytest
import torch

from cluster import ops
from jobs import compile_check as cc
from kernels import ptx_checks as ptx
from kernels.lamport import compile_variants as cv
from kernels.lamport.all_reduce_norm import validate_embedding_inputs, validate_embedding_shard

H, CAP = 7168, 16


@pytest.fixture(scope="module", params=["sm_90a", "sm_100a"])
def rows(request, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ptx"))
    variants = ops.get("embed_norm").variants([H], [2])
    out = [cc.run_variant(v, request.param, root, i) for i, v in enumerate(variants)]
    cc.check_pairs(out)
    return {(r.variant.kernel, r.variant.transport, r.variant.budget_ns): r for r in out}


def test_embed_variants_compile_and_pass(rows):
    assert len(rows) == 7  # publish twins, consumer plain / watchdog, 3 single-kernel builds
    for key, r in rows.items():
        assert not r.errors, (key, r.errors)
    assert rows[("publish", "unicast", 0)].variant.entry == "EmbedPublishKernel"


def test_embed_publish_gathers_after_the_wait(rows):
    lines = rows[("publish", "unicast", 0)].lines
    wait = lines.index("griddepcontrol.wait;")
    ids = next(i for i, ln in enumerate(lines) if ln.startswith("ld.global.s32"))
    gather = next(i for i, ln in enumerate(lines) if ln.startswith("ld.global.v4"))
    assert wait < ids < gather
    assert sum(ln.startswith("st.relaxed.sys.global.v4") for ln in lines) == 2
    mc = rows[("publish", "multicast", 0)].lines
    assert sum("multimem.st" in ln for ln in mc) == 1


def test_embed_norm_order_and_watchdog(rows):
    plain = rows[("consumer", "-", 0)]
    wd = rows[("consumer", "-", cv.CHECK_BUDGET_NS)]
    assert not ptx.check_consumer(plain.lines, plain.variant)
    assert any("%globaltimer" in ln for ln in wd.lines)
    assert not any("%globaltimer" in ln for ln in plain.lines)
    # enorm/hnorm before the wait; previous and positions after it
    wait = plain.lines.index("griddepcontrol.wait;")
    loads = [i for i, ln in enumerate(plain.lines) if ln.startswith("ld.global.v4")]
    assert len(loads) == 3 and loads[1] < wait < loads[2]
    pos = next(i for i, ln in enumerate(plain.lines) if ln.startswith("ld.global.u64"))
    assert pos > wait
    # two 16-byte output stores a thread (embedding half, previous half)
    assert sum(ln.startswith("st.global.v4") and "{s, s" not in ln for ln in plain.lines) == 2
    # mutation: a spin on plain loads is caught
    mutated = [ln.replace("ld.volatile.global.v4", "ld.global.v4") for ln in plain.lines]
    assert ptx.check_consumer(mutated, plain.variant)


# ---------------------------------------------------------------- validation
def bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def call(m=4, **kw):
    args = dict(ids=torch.zeros(m, dtype=torch.int32), positions=torch.zeros(m, dtype=torch.int64),
                previous=bf16(m, H), enorm=bf16(H), hnorm=bf16(H), out=None)
    args.update(kw)
    return validate_embedding_inputs(**args, hidden=H, capacity=CAP, device="cpu")


def test_valid_embedding_call():
    assert call() == 4
    assert call(out=bf16(4, 2 * H)) == 4


@pytest.mark.parametrize("kw, match", [
    (dict(ids=torch.zeros(4, dtype=torch.int64)), "ids must be torch.int32"),
    (dict(ids=torch.zeros(4, 1, dtype=torch.int32)), r"ids must have shape \[\*\]"),
    (dict(ids=torch.zeros(0, dtype=torch.int32)), r"ids.shape\[0\] \(tokens\) must be in \[1, 16\], got 0"),
    (dict(positions=torch.zeros(4, dtype=torch.int32)), "positions must be torch.int64"),
    (dict(positions=torch.zeros(5, dtype=torch.int64)), r"positions must have shape \[4\]"),
    (dict(previous=bf16(4, H // 2)), r"previous must have shape \[4, 7168\]"),
    (dict(enorm=torch.zeros(H)), "enorm must be torch.bfloat16"),
    (dict(hnorm=bf16(H + 8)), r"hnorm must have shape \[7168\]"),
    (dict(out=bf16(4, H)), r"out must have shape \[4, 14336\]"),
])
def test_bad_embedding_inputs_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        call(**kw)


def test_shard_validation():
    w = bf16(100, H)
    assert validate_embedding_shard(w, 300, None, 1e-6, hidden=H) == (300, 100, 1e-6)
    assert validate_embedding_shard(w, 0, 40, 1e-5, hidden=H) == (0, 40, 1e-5)
    with pytest.raises(ValueError, match=r"rows must be in \[0, 100\], got 101"):
        validate_embedding_shard(w, 0, 101, 1e-6, hidden=H)
    with pytest.raises(ValueError, match=r"start must be in \[0, .*\], got -1"):
        validate_embedding_shard(w, -1, None, 1e-6, hidden=H)
    with pytest.raises(ValueError, match=r"weight must have shape \[\*, 7168\]"):
        validate_embedding_shard(bf16(100, 4096), 0, None, 1e-6, hidden=H)
    with pytest.raises(ValueError, match="weight must be torch.bfloat16"):
        validate_embedding_shard(torch.zeros(100, H), 0, None, 1e-6, hidden=H)
    with pytest.raises(ValueError, match="eps must be > 0"):
        validate_embedding_shard(w, 0, None, 0.0, hidden=H)
    with pytest.raises(ValueError, match="start must be an int"):
        validate_embedding_shard(w, 1.5, None, 1e-6, hidden=H)


def test_single_embed_order_and_its_check_catches_mutations(rows):
    """The single-kernel embedding (kernels/lamport/embed_single.py): enorm,
    hnorm before the wait; previous, the id and its row after the stage
    load; one store a peer; the PTX check refuses broken copies."""
    row = rows[("single", "unicast", cv.CHECK_BUDGET_NS)]
    lines, check = row.lines, row.variant.check
    assert not check(lines, row.variant)
    assert sum(ln.startswith("st.relaxed.sys.global.v4") for ln in lines) == 2
    assert not rows[("single", "unicast", 0)].errors
    assert not rows[("single", "multicast", cv.CHECK_BUDGET_NS)].errors
    wait = lines.index("griddepcontrol.wait;")
    stage = next(i for i in range(wait, len(lines)) if lines[i].startswith("ld.volatile.global.u32"))
    ids = next(i for i, ln in enumerate(lines) if ln.startswith("ld.global.s32"))
    early = lines[:wait] + [lines[ids]] + lines[wait:ids] + lines[ids + 1:]
    assert any("the id load" in e for e in check(early, row.variant))
    enorm = next(i for i, ln in enumerate(lines) if ln.startswith("ld.global.v4"))
    late = lines[:enorm] + lines[enorm + 1:stage] + [lines[enorm]] + lines[stage:]
    assert any("16-byte loads" in e for e in check(late, row.variant))
    arrive = next(i for i, ln in enumerate(lines) if ln.startswith("barrier.cluster.arrive"))
    assert any("cluster barrier out of place" in e
               for e in check(lines[:arrive] + lines[arrive + 1:], row.variant))
