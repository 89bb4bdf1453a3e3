"""Golden cases of the indexer references, in the registry's shape:
``CASES[name] = (op, make, compute)`` with ``make() -> (inputs, params)`` and
``compute(inputs, params) -> outputs`` (register them in
``kernels.reference.cases`` as ``GoldenCase(name, op, make, compute)``).

Small shapes (K 128/256), deterministic inputs, FP8 outputs pinned as bits.
The projection case holds an order-sensitive token (products 2^24, +1,
-2^24 in different warps / CTAs), so a changed reduction order fails it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.indexer.layout import DIM, Tactic, head_weight_scale
from kernels.reference.indexer import indexer_fused, indexer_projection

Tensors = dict[str, torch.Tensor]


def _normal(shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def _tactic(p) -> Tactic | None:
    return None if p is None else Tactic(*p)


def _tactic_name(p) -> str:
    return "exact" if p is None else f"w{p[0]}s{p[1]}"


# --- projection under several reduction trees -------------------------------

def projection_make() -> tuple[Tensors, dict]:
    m, k, key, heads, gate = 3, 256, 3, 2, 3
    x = _normal((m, k), 101)
    w = _normal((key + heads + gate, k), 102, 0.05)
    # Token 2 is order-sensitive against weight row 0: the products 2^24, +1
    # and -2^24 at K 0, 64, 128 (different warps, or CTAs of the cluster for
    # split 2 and 4) sum to 0 in every modelled tree and to 1 exactly; in
    # reverse cluster order (split 4) to 1.
    x[2] = 0.0
    x[2, 0], x[2, 64], x[2, 128] = 2.0**12, 1.0, -(2.0**12)
    w[0, 0], w[0, 64], w[0, 128] = 2.0**12, 1.0, 2.0**12
    return ({"x": x.to(torch.bfloat16), "weight": w.to(torch.bfloat16)},
            {"key": key, "heads": heads, "tactics": [None, [1, 1], [4, 1], [2, 2], [1, 4]]})


def projection_compute(inputs: Tensors, params: dict) -> Tensors:
    out = {}
    for p in params["tactics"]:
        key, weights, gate = indexer_projection(inputs["x"], inputs["weight"], key=params["key"],
                                                heads=params["heads"], tactic=_tactic(p))
        name = _tactic_name(p)
        out |= {f"key_{name}": key, f"weights_{name}": weights, f"gate_{name}": gate}
    return out


# --- the fused op (projection + query epilogue) -------------------------------

def _fused_make(ue8m0: bool, weights_dtype: str, tactic, partitions) -> Callable[[], tuple[Tensors, dict]]:
    def make() -> tuple[Tensors, dict]:
        m, k, key, heads, gate = 2, 128, 16, 3, 5
        q = _normal((m, heads, DIM), 203, 2.0)
        q[1, 2] = 0.0  # an all-zero head: the amax floor sets its scale
        q[0, 1, ::7] *= 64  # a spiky head: most values quantize small
        inputs = {
            "x": _normal((m, k), 201).to(torch.bfloat16),
            "weight": _normal((key + heads + gate, k), 202, 0.1).to(torch.bfloat16),
            "q": q.to(torch.bfloat16),
            "norm_weight": _normal((key,), 204, 0.2) + 1,
            "norm_bias": _normal((key,), 205, 0.1),
        }
        params = {"key": key, "heads": heads, "eps": 1e-6,
                  "scale": head_weight_scale(DIM ** -0.5, heads), "padded": 5,
                  "weights_dtype": weights_dtype, "ue8m0": ue8m0, "tactic": tactic,
                  "partitions": partitions}
        return inputs, params
    return make


def fused_compute(inputs: Tensors, params: dict) -> Tensors:
    q_fp8, weights, key, gate = indexer_fused(
        inputs["x"], inputs["weight"], inputs["q"], inputs["norm_weight"], inputs["norm_bias"],
        key=params["key"], heads=params["heads"], eps=params["eps"], scale=params["scale"],
        padded=params["padded"], weights_dtype=getattr(torch, params["weights_dtype"]),
        ue8m0=params["ue8m0"], tactic=_tactic(params["tactic"]), partitions=params["partitions"],
    )
    return {"q_fp8": q_fp8, "weights": weights, "key": key, "gate": gate}


CASES: dict[str, tuple[str, Callable, Callable]] = {
    "indexer_projection_tactics": ("indexer_projection", projection_make, projection_compute),
    "indexer_fused_fp32_w2s2": ("indexer_fused", _fused_make(False, "float32", [2, 2], None), fused_compute),
    "indexer_fused_ue8m0_bf16": ("indexer_fused", _fused_make(True, "bfloat16", None, 1), fused_compute),
}
