"""The torch reference of ``scaled_allreduce`` and its golden cases.

``scaled_all_reduce(partials, scale)`` is lamport-lab's all-reduce sum
(:func:`kernels.reference.allreduce.all_reduce_sum`: FP32 in rank order
from +0.0, rounded once to BF16) times ``scale`` in FP32, rounded to BF16:
``BF16(FP32(BF16 sum) * FP32(scale))``, what the kernel computes, bit for
bit (bound 0).

Importing this module registers the golden cases (the op's ``golden``
provider); their files are in ``golden/`` beside it
(``GoldenCase.directory``), shipped with the package. Regenerate them with
``LAMPORT_UPDATE_GOLDEN=1 python -m scaled_allreduce.reference``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from kernels.reference import numerics
from kernels.reference.allreduce import all_reduce_sum
from kernels.reference.cases import GoldenCase, register
from kernels.validation import require_number, require_tensor

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"


def scale_sum(reduced: torch.Tensor, scale: float) -> torch.Tensor:
    """``BF16(FP32(reduced) * FP32(scale))`` of a BF16 ``[M, H]`` sum; the
    consumer's epilogue on the all-reduced value."""
    require_tensor("reduced", reduced, dtype=torch.bfloat16, shape=(None, None),
                   contiguous=False)
    if reduced.shape[-1] < 1:
        raise ValueError(f"reduced must hold at least one element a token, got shape "
                         f"{list(reduced.shape)}")
    factor = torch.tensor(require_number("scale", scale), dtype=torch.float32)
    return (reduced.float() * factor).to(torch.bfloat16)


def scaled_all_reduce(partials, scale: float) -> torch.Tensor:
    """BF16 ``[M, H]``: the rank-ordered all-reduce sum of the BF16 partials
    (``[tp, M, H]`` or a list of ``[M, H]``), scaled by ``scale``."""
    return scale_sum(all_reduce_sum(partials), scale)


def _compute(inputs: dict, params: dict) -> dict:
    return {"out": scaled_all_reduce(inputs["partials"], params["scale"])}


def _make(tp: int, tokens: int, hidden: int, seed: int, scale: float):
    def make():
        return ({"partials": numerics.random_partials(tp, tokens, hidden, seed=seed)},
                {"scale": scale})
    return make


CASES = (
    register(GoldenCase("scaled_allreduce_random_tp2", "scaled_allreduce", _compute,
                        _make(2, 3, 64, 21, 0.5), GOLDEN_DIR)),
    register(GoldenCase("scaled_allreduce_random_tp4_scale3", "scaled_allreduce", _compute,
                        _make(4, 2, 64, 22, 3.0), GOLDEN_DIR)),
)


if __name__ == "__main__":
    from kernels.reference.golden import UPDATE_ENV, check_golden

    if os.environ.get(UPDATE_ENV) != "1":
        raise SystemExit(f"set {UPDATE_ENV}=1 to rewrite the golden files")
    for case in CASES:
        inputs, params = case.make()
        check_golden(case.name, inputs, case.compute(inputs, params), params)
        print(f"wrote {GOLDEN_DIR / case.name}.json")
