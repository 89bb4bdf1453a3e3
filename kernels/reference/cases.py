"""The registry of golden cases: one entry per pinned reference computation.

Each case knows how to make its inputs (deterministically) and how to compute
its outputs from them. ``tests/test_golden.py`` pins every case against its
committed file, and ``python -m jobs selfcheck`` recomputes every committed
file and records the verdicts in the results store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.reference import numerics
from kernels.reference.allreduce import all_reduce_norm, all_reduce_sum
from kernels.reference.embed import embed_norm

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class GoldenCase:
    name: str
    op: str
    make: Callable[[], tuple[Tensors, dict]]
    compute: Callable[[Tensors, dict], Tensors]


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


register(GoldenCase("all_reduce_norm_random_tp4", "all_reduce_norm",
                    _arn_make(numerics.random_partials(4, 3, 64, seed=11), 11), _arn_compute))
register(GoldenCase("all_reduce_norm_order_tp3", "all_reduce_norm",
                    _arn_make(numerics.order_sensitive_partials(3, 2, 32), 12), _arn_compute))
register(GoldenCase("all_reduce_norm_sentinel_tp2", "all_reduce_norm",
                    _arn_make(numerics.sentinel_pattern_partials(2, 2, 64, seed=13), 13), _arn_compute))


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


register(GoldenCase("embed_norm_tp3", "embed_norm", _embed_make, _embed_compute))
