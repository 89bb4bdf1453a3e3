"""The timed workload builders, ``builder(ctx, spec) -> Workload`` (contract:
:mod:`cluster.measure.workload`), one module per family: :mod:`.norm`
(all_reduce_norm, finalize_publish), :mod:`.embed`, :mod:`.mhc`,
:mod:`.projection` (indexer). Each op's declaration names its builder
(``OpSpec.workload``, resolved by ``OpSpec.workload_builder``); this package
imports nothing, so the registry and the builders do not import each other.

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
