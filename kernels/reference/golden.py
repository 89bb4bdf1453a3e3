"""Golden vectors: inputs and expected output bits, committed as hex.

A golden file pins a reference: ``tests/golden/<name>.json`` holds the
parameters, every input tensor and every expected output tensor as
``{"dtype", "shape", "hex"}`` (the raw little-endian bytes). A test loads the
inputs, recomputes the outputs with the current reference and demands the
same bits. Regenerate deliberately with ``LAMPORT_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels.reference.numerics import Comparison

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "golden"
UPDATE_ENV = "LAMPORT_UPDATE_GOLDEN"

_DTYPES = {
    str(d): d
    for d in (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32,
              torch.int64, torch.int16, torch.uint8, torch.float8_e4m3fn, torch.bool)
}


def tensor_to_json(t: torch.Tensor) -> dict:
    """``{"dtype", "shape", "hex"}`` of a tensor's raw bytes."""
    raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return {"dtype": str(t.dtype), "shape": list(t.shape), "hex": bytes(raw.tolist()).hex()}


def tensor_from_json(d: dict) -> torch.Tensor:
    """Inverse of :func:`tensor_to_json`."""
    dtype = _DTYPES[d["dtype"]]
    raw = torch.tensor(list(bytes.fromhex(d["hex"])), dtype=torch.uint8)
    return raw.view(dtype).reshape(d["shape"]).clone()


def golden_path(name: str) -> Path:
    """The file of golden case ``name``: in its registered case's
    ``directory`` (an op from another package), else under :data:`GOLDEN_DIR`."""
    from kernels.reference.cases import GOLDEN_CASES
    case = GOLDEN_CASES.get(name)
    directory = case.directory if case is not None and case.directory is not None else GOLDEN_DIR
    return Path(directory) / f"{name}.json"


def save_golden(name: str, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor],
                params: dict) -> Path:
    """Write the golden file (only done deliberately, see module docstring)."""
    path = golden_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": name,
        "params": params,
        "inputs": {k: tensor_to_json(v) for k, v in inputs.items()},
        "outputs": {k: tensor_to_json(v) for k, v in outputs.items()},
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def verify_golden(name: str, compute) -> Verdict:
    """Recompute the committed file's outputs from its inputs with
    ``compute(inputs, params) -> outputs`` and compare them bit for bit."""
    inputs, outputs, params = load_golden(name)
    return compare_outputs(outputs, compute(inputs, params))


def load_golden(name: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """``(inputs, outputs, params)`` of a committed golden file."""
    doc = json.loads(golden_path(name).read_text())
    inputs = {k: tensor_from_json(v) for k, v in doc["inputs"].items()}
    outputs = {k: tensor_from_json(v) for k, v in doc["outputs"].items()}
    return inputs, outputs, doc["params"]


@dataclass
class Verdict:
    """How a set of tensors compares with its golden bits."""

    elements: int = 0
    mismatches: int = 0  # elements whose bits differ (all of a misshapen output)
    max_ulp: float = 0.0  # BF16 ULPs, over floating outputs of 16+ bits
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def compare_outputs(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> Verdict:
    """Compare tensors by name, bit for bit; ``problems`` names what differs."""
    verdict = Verdict()
    if set(expected) != set(actual):
        verdict.problems.append(f"names differ: {sorted(expected)} vs {sorted(actual)}")
    for key in sorted(expected):
        e = expected[key]
        verdict.elements += e.numel()
        a = actual.get(key)
        if a is None:
            verdict.mismatches += e.numel()
            continue
        a = a.detach().cpu().contiguous()
        if e.dtype != a.dtype or e.shape != a.shape:
            verdict.mismatches += e.numel()
            verdict.problems.append(f"{key}: {a.dtype}{list(a.shape)} vs golden {e.dtype}{list(e.shape)}")
            continue
        width = e.element_size()
        raw_e = e.reshape(-1).view(torch.uint8).reshape(-1, width)
        raw_a = a.reshape(-1).view(torch.uint8).reshape(-1, width)
        wrong = int((raw_e != raw_a).any(dim=1).sum())
        verdict.mismatches += wrong
        if e.is_floating_point() and width > 1:
            verdict.max_ulp = max(verdict.max_ulp, Comparison(a, e).max_ulp)
        if wrong:
            detail = Comparison(a, e) if e.is_floating_point() and width > 1 else f"{wrong} elements differ"
            verdict.problems.append(f"{key}: {detail}")
    return verdict


def check_golden(name: str, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor],
                 params: dict) -> None:
    """Pin ``outputs`` (computed from ``inputs``) against the committed file.

    With ``LAMPORT_UPDATE_GOLDEN=1`` the file is (re)written. Otherwise the
    stored inputs must equal ``inputs`` bit for bit (the generator is
    deterministic), the stored params must equal ``params``, and the stored
    outputs must equal ``outputs`` bit for bit; any difference raises
    AssertionError naming what differs.
    """
    if os.environ.get(UPDATE_ENV) == "1":
        save_golden(name, inputs, outputs, params)
        return
    if not golden_path(name).exists():
        raise AssertionError(f"golden file {golden_path(name)} is missing; "
                             f"generate it with {UPDATE_ENV}=1")
    g_inputs, g_outputs, g_params = load_golden(name)
    problems = [f"params: {params} vs golden {g_params}"] if params != g_params else []
    problems += [f"input {p}" for p in compare_outputs(g_inputs, inputs).problems]
    problems += [f"output {p}" for p in compare_outputs(g_outputs, outputs).problems]
    if problems:
        raise AssertionError(f"golden {name!r} differs:\n  " + "\n  ".join(problems))
