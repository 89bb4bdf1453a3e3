"""The registry of golden cases: one entry per pinned reference computation.

Each case knows how to make its inputs (deterministically) and how to compute
its outputs from them. ``tests/test_golden.py`` pins every case against its
committed file, and ``python -m jobs selfcheck`` recomputes every committed
file and records the verdicts in the results store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.reference import numerics
from kernels.reference.allreduce import all_reduce_norm, all_reduce_sum
from kernels.reference.embed import embed_norm
from kernels.reference.mhc import all_reduce_mhc
from kernels.reference.mhc import finalize as mhc_finalize
from kernels.reference.moe import MoEPartial, all_reduce_norm_finalize, finalize_payloads, moe_finalize

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class GoldenCase:
    name: str
    op: str
    compute: Callable[[Tensors, dict], Tensors]
    #: Makes (inputs, params) deterministically; None where the case's inputs
    #: are crafted in its op's test file, which pins them with check_golden.
    make: Callable[[], tuple[Tensors, dict]] | None = None
    #: The folder of its golden file; None: the repository's tests/golden/
    #: (an op from another package keeps its files in that package).
    directory: Path | None = None


GOLDEN_CASES: dict[str, GoldenCase] = {}


def register(case: GoldenCase) -> GoldenCase:
    if case.name in GOLDEN_CASES:
        raise ValueError(f"golden case {case.name!r} registered twice")
    GOLDEN_CASES[case.name] = case
    return case


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bf16_normal(shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=_gen(seed)) * scale).to(torch.bfloat16)


# --- all_reduce_norm -------------------------------------------------------

def _arn_compute(inputs: Tensors, params: dict) -> Tensors:
    norm_out, residual_out = all_reduce_norm(
        inputs["partials"], inputs["residual"], inputs["norm_weight"], params["eps"],
        order=params.get("order"))
    return {"norm_out": norm_out, "residual_out": residual_out,
            "sum": all_reduce_sum(inputs["partials"], order=params.get("order"))}


def _arn_make(partials: torch.Tensor, seed: int) -> Callable[[], tuple[Tensors, dict]]:
    def make():
        tp, m, h = partials.shape
        return ({"partials": partials,
                 "residual": _bf16_normal((m, h), seed + 1),
                 "norm_weight": _bf16_normal((h,), seed + 2, 0.5) + 1},
                {"eps": 1e-6})
    return make


register(GoldenCase("all_reduce_norm_random_tp4", "all_reduce_norm", _arn_compute,
                    _arn_make(numerics.random_partials(4, 3, 64, seed=11), 11)))
register(GoldenCase("all_reduce_norm_order_tp3", "all_reduce_norm", _arn_compute,
                    _arn_make(numerics.order_sensitive_partials(3, 2, 32), 12)))
register(GoldenCase("all_reduce_norm_sentinel_tp2", "all_reduce_norm", _arn_compute,
                    _arn_make(numerics.sentinel_pattern_partials(2, 2, 64, seed=13), 13)))


# --- embed_norm ------------------------------------------------------------

def _embed_make() -> tuple[Tensors, dict]:
    hidden, rows, tp = 32, 5, 3
    inputs = {f"weight{r}": _bf16_normal((rows, hidden), 20 + r) for r in range(tp)}
    # Shard edges (0, 4, 5, 9, 10, 14), an id nobody owns (15) and position 0.
    inputs["ids"] = torch.tensor([0, 4, 5, 9, 10, 14, 15, 7], dtype=torch.int32)
    inputs["positions"] = torch.tensor([0, 1, 2, 3, 0, 5, 6, 7], dtype=torch.int64)
    inputs["previous"] = _bf16_normal((8, hidden), 30)
    inputs["enorm"] = _bf16_normal((hidden,), 31, 0.5) + 1
    inputs["hnorm"] = _bf16_normal((hidden,), 32, 0.5) + 1
    return inputs, {"eps": 1e-5, "tp": tp, "rows": rows}


def _embed_compute(inputs: Tensors, params: dict) -> Tensors:
    shards = [(inputs[f"weight{r}"], r * params["rows"]) for r in range(params["tp"])]
    out = embed_norm(inputs["ids"], inputs["positions"], inputs["previous"], shards,
                     inputs["enorm"], inputs["hnorm"], params["eps"])
    return {"output": out}


register(GoldenCase("embed_norm_tp3", "embed_norm", _embed_compute, _embed_make))


# --- MoE finalize and mHC (inputs crafted in tests/test_reference_{moe,mhc}.py) --

def _moe_partials(inputs: Tensors) -> list[MoEPartial]:
    """Per-rank MoEPartial from ``<field>.<rank>`` input names."""
    ranks = sorted(int(k.rsplit(".", 1)[1]) for k in inputs if k.startswith("gemm2_permuted."))
    return [MoEPartial(inputs[f"gemm2_permuted.{r}"], inputs[f"expert_weights.{r}"],
                       inputs[f"expanded_idx_to_permuted_idx.{r}"], inputs.get(f"shared_output.{r}"))
            for r in ranks]


def _moe_finalize_compute(inputs: Tensors, params: dict) -> Tensors:
    (p,) = _moe_partials(inputs)
    return {"payload": moe_finalize(p.gemm2_permuted, p.expert_weights, p.expanded_idx_to_permuted_idx,
                                    p.shared_output, routed_scaling_factor=params["routed_scaling_factor"],
                                    fma=params["fma"])}


def _moe_arn_compute(inputs: Tensors, params: dict) -> Tensors:
    partials = _moe_partials(inputs)
    norm_out, residual_out = all_reduce_norm_finalize(
        partials, inputs["residual"], inputs["norm_weight"], params["eps"], order=params["order"],
        fma=params["fma"])
    return {"payloads": finalize_payloads(partials, fma=params["fma"]), "norm_out": norm_out,
            "residual_out": residual_out}


def _mhc_compute(inputs: Tensors, params: dict) -> Tensors:
    residual_out, layer_input = all_reduce_mhc(
        inputs["partials"], inputs["residual"], inputs["post"], inputs["comb"], inputs["pre"],
        inputs["norm_weight"], params["eps"], order=params["order"], rank_lanes=params["rank_lanes"],
        fma=params["fma"], post_fma=params["post_fma"])
    return {"residual_out": residual_out, "layer_input": layer_input}


def _mhc_finalize_compute(inputs: Tensors, params: dict) -> Tensors:
    residual_out, layer_input = mhc_finalize(
        _moe_partials(inputs), inputs["residual"], inputs["post"], inputs["comb"], inputs["pre"],
        inputs["norm_weight"], params["eps"], fma=params["fma"], post_fma=params["post_fma"])
    return {"residual_out": residual_out, "layer_input": layer_input}


register(GoldenCase("moe_finalize_bf16_scaled", "finalize_publish", _moe_finalize_compute))
register(GoldenCase("moe_all_reduce_norm_finalize_tp3", "finalize_publish", _moe_arn_compute))
register(GoldenCase("mhc_all_reduce_tp3", "all_reduce_mhc", _mhc_compute))
register(GoldenCase("mhc_finalize_tp2", "all_reduce_mhc", _mhc_finalize_compute))


# --- DSA indexer (cases in kernels/reference/indexer_cases.py) ----------------

def _register_indexer_cases() -> None:
    from kernels.reference import indexer_cases
    for name, (op, make, compute) in indexer_cases.CASES.items():
        register(GoldenCase(name, op, compute, make))


_register_indexer_cases()
