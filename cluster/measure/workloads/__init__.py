"""One workload builder per timed op: ``cluster.measure.workloads.<op>(ctx,
spec) -> Workload`` (contract: :mod:`cluster.measure.workload`). The op
registry's ``OpSpec.workload`` names these; :func:`builder` resolves such a
dotted name. Builders import torch and the kernels only when called.

Baselines (every op: ``unfused`` is what a model runs without the fused
kernel; at tp=1 the all-reduce is the identity):

- all_reduce_norm: ``unfused`` NCCL all_reduce + add + RMSNorm, ``symm_mem``
  torch symmetric memory one_shot_all_reduce (unicast) + add + RMSNorm,
  ``flashinfer`` FlashInfer's trtllm_allreduce_fusion (rows
  ``flashinfer_oneshot`` and ``flashinfer_twoshot``, tp >= 2);
- finalize_publish: the torch MoE finalize (gather, FP32 weighted sum, +
  shared expert, BF16) then the all_reduce_norm baselines' all-reduce + epilogue;
- embed_norm: the masked gather of this rank's vocabulary shard, all-reduce,
  position-0 zeroing, enorm / hnorm RMSNorms, concatenation;
- all_reduce_mhc: the all-reduce then the torch mHC path (:func:`.mhc.torch_mhc`);
- indexer (not a collective): ``stock`` the stock chain (three GEMMs and
  ``stock_indexer_query``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from cluster import ops as _registry

PROFILED_OPS = tuple(name for name, spec in _registry.OPS.items() if spec.workload)
"""The ops the profile job times: every registered op that declares a
workload (``OpSpec.workload``, resolved by :func:`builder`)."""


def all_reduce_norm(ctx, spec):
    from cluster.measure.workloads.norm import all_reduce_norm_workload
    return all_reduce_norm_workload(ctx, spec)


def finalize_publish(ctx, spec):
    from cluster.measure.workloads.norm import finalize_publish_workload
    return finalize_publish_workload(ctx, spec)


def embed_norm(ctx, spec):
    from cluster.measure.workloads.embed import embed_norm_workload
    return embed_norm_workload(ctx, spec)


def all_reduce_mhc(ctx, spec):
    from cluster.measure.workloads.mhc import all_reduce_mhc_workload
    return all_reduce_mhc_workload(ctx, spec)


def indexer(ctx, spec):
    from cluster.measure.workloads.projection import indexer_workload
    return indexer_workload(ctx, spec)


# The builders' modules are named apart from the ops: importing a submodule
# sets the package attribute of its name, which would replace a builder of
# that name (the indexer's did, from its second case in a process on).


def builder(op: str, path: str | None = None) -> Callable:
    """The builder of ``op``: ``path`` (a dotted ``package.module.attr``
    name, e.g. an OpSpec's ``workload``) or ``cluster.measure.workloads.<op>``."""
    path = path or f"{__name__}.{op}"
    module, _, attr = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attr, None)
    except ModuleNotFoundError as err:
        if err.name is None or not (module == err.name or module.startswith(err.name + ".")):
            raise  # the module exists; something it imports does not
        found = None
    if not callable(found):
        raise ValueError(f"no timing workload for op {op!r} at {path!r}; "
                         f"profiled ops: {list(PROFILED_OPS)}")
    return found
