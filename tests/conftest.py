"""Markers: `gpu` tests skip where no CUDA GPU is present, `multigpu` tests
where fewer than two are; CPU tests never need a GPU."""

import os
import tempfile

import pytest


def pytest_configure(config):
    """A compile cache of the test session's own (kernels.compile_cache), so
    tests neither read nor fill the user's; an explicit LAMPORT_COMPILE_CACHE
    is kept."""
    if "LAMPORT_COMPILE_CACHE" not in os.environ:
        os.environ["LAMPORT_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="lamport-compile-cache-")


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    devices = _cuda_devices()
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    few_gpus = pytest.mark.skip(reason=f"needs 2+ CUDA GPUs; {devices} present")
    for item in items:
        if "multigpu" in item.keywords and devices < 2:
            item.add_marker(few_gpus)
        elif "gpu" in item.keywords and devices < 1:
            item.add_marker(no_gpu)
