"""Parameter sweeps whose less telling corners are marked ``slow``: a GPU
run without ``--slow`` (tests/conftest.py) keeps the default corner of each
sweep, one device call's worth; ``--slow`` runs every combination. Chosen
from the per-test times of the whole suite on one H200
(docs/results/gpu_suite.md, docs/results/pool_h200_2026-12-01.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import pytest


def parametrize(names: str, *axes: Iterable, default: Callable[..., bool]):
    """``pytest.mark.parametrize(names, product of axes)``, each combination
    that ``default(*combination)`` rejects marked slow. One axis: its values
    are the parameters themselves (a tuple value for several names)."""
    if len(axes) == 1:
        combos = [c if isinstance(c, tuple) else (c,) for c in axes[0]]
    else:
        combos = list(itertools.product(*axes))
    params = [pytest.param(*c, marks=() if default(*c) else pytest.mark.slow) for c in combos]
    return pytest.mark.parametrize(names, params)
