"""The case dict a TP group runs, its deterministic inputs, and its check.

A case is a plain dict (it crosses process boundaries through Ray):

``op``        ``"all_reduce_norm"`` (the only op the cluster runs so far)
``tokens``    M, 1..capacity: every rank publishes and consumes M tokens
``inputs``    ``"random"``, ``"order_sensitive"`` or ``"sentinel_pattern"``
              (:mod:`kernels.reference.numerics` generators)
``seed``      int; partials, residual and norm weight derive from it
``eps``       RMSNorm epsilon, > 0
``budget_ns`` the consumer watchdog's budget for the whole consume, > 0
``residual``  ``"random"`` (default) or ``"zeros"``: with a zero residual,
              residual_out is BF16(sum) bit for bit, which lets a backend
              whose kernel does not output the sum (gpu) report it

Every rank regenerates the group's inputs from these fields and takes its own
partial, so no tensor is shipped; the driver regenerates them to check the
outputs against the torch reference.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from kernels.reference import numerics
from kernels.reference.allreduce import all_reduce_norm, all_reduce_sum
from kernels.validation import require_choice, require_int, require_number

OPS = ("all_reduce_norm",)
INPUTS = {
    "random": lambda tp, m, h, seed: numerics.random_partials(tp, m, h, seed=seed),
    "order_sensitive": lambda tp, m, h, seed: numerics.order_sensitive_partials(tp, m, h),
    "sentinel_pattern": lambda tp, m, h, seed: numerics.sentinel_pattern_partials(tp, m, h, seed=seed),
}
DEFAULTS = {"op": "all_reduce_norm", "inputs": "random", "seed": 0, "eps": 1e-6,
            "budget_ns": 2_000_000_000, "residual": "random"}
RESIDUALS = ("random", "zeros")
NORM_MAX_ULP = 1
"""DESIGN.md: RMSNorm outputs within 1 BF16 ULP of the FP32 reference."""


def make_case(*, capacity: int, **fields) -> dict:
    """A validated case dict: DEFAULTS overlaid with ``fields``; ValueError
    names any unknown field or bad value."""
    unknown = set(fields) - set(DEFAULTS) - {"tokens"}
    if unknown:
        raise ValueError(f"unknown case fields {sorted(unknown)}; known: {sorted([*DEFAULTS, 'tokens'])}")
    case = {**DEFAULTS, **fields}
    require_int("capacity", capacity, low=1)
    require_choice("op", case["op"], OPS)
    require_choice("inputs", case["inputs"], sorted(INPUTS))
    if "tokens" not in case:
        raise ValueError(f"tokens must be in 1..capacity={capacity}, got None")
    try:
        require_int("tokens", case["tokens"], low=1, high=capacity)
    except ValueError:
        raise ValueError(f"tokens must be in 1..capacity={capacity}, got {case['tokens']}") from None
    require_choice("residual", case["residual"], RESIDUALS)
    require_int("seed", case["seed"], low=0, high=2**31 - 2)
    require_number("eps", case["eps"], positive=True)
    require_int("budget_ns", case["budget_ns"], low=1, high=2**63 - 1)
    return case


def case_inputs(case: Mapping, *, tp: int, hidden: int, tokens: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(partials [tp, M, H], residual [M, H], norm_weight [H])`` BF16 on CPU,
    deterministic in the case's inputs kind and seed; ``tokens`` overrides M."""
    m = int(case["tokens"] if tokens is None else tokens)
    seed = int(case["seed"])
    partials = INPUTS[case["inputs"]](tp, m, hidden, seed)
    g = torch.Generator().manual_seed(seed + 1)
    residual = torch.randn(m, hidden, generator=g).to(torch.bfloat16)
    if case.get("residual", "random") == "zeros":
        residual = torch.zeros_like(residual)
    weight = (torch.randn(hidden, generator=g) * 0.5 + 1).to(torch.bfloat16)
    return partials, residual, weight


def bf16_from_bits(a: np.ndarray) -> torch.Tensor:
    """BF16 tensor (a copy) from a uint16 array of bit patterns."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)


def bits_from_bf16(t: torch.Tensor) -> np.ndarray:
    """uint16 array of the bit patterns of a BF16 tensor."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16).copy()


def check_outputs(case: Mapping, *, tp: int, hidden: int, outputs: Mapping[str, np.ndarray]) -> dict:
    """Compare one rank's outputs (``sum``, ``residual``, ``norm`` as uint16
    bit arrays ``[M, H]``) with the torch reference: sum and residual bit for
    bit, norm within NORM_MAX_ULP; NaN never passes. A ``sum`` that is
    missing or None (the backend could not observe it) is reported as
    ``{"observed": False}`` and does not decide ``ok``. Returns a plain dict
    with ``ok`` and, per output, mismatches and max ULP."""
    partials, residual, weight = case_inputs(case, tp=tp, hidden=hidden)
    norm_ref, residual_ref = all_reduce_norm(partials, residual, weight, case["eps"])
    expected = {"sum": all_reduce_sum(partials), "residual": residual_ref, "norm": norm_ref}
    report: dict = {"ok": True}
    for name, ref in expected.items():
        if name == "sum" and outputs.get("sum") is None:
            report[name] = {"observed": False}
            continue
        got = bf16_from_bits(outputs[name])
        if tuple(got.shape) != tuple(ref.shape):
            report[name] = {"mismatches": ref.numel(), "max_ulp": float("inf"),
                            "error": f"shape {list(got.shape)}, expected {list(ref.shape)}"}
            report["ok"] = False
            continue
        cmp = numerics.Comparison(got, ref)
        has_nan = bool(torch.isnan(got.float()).any())
        ok = (cmp.max_ulp <= NORM_MAX_ULP if name == "norm" else cmp.bit_exact) and not has_nan
        report[name] = {"mismatches": cmp.mismatches, "max_ulp": cmp.max_ulp, "nan": has_nan}
        report["ok"] &= ok
    return report
