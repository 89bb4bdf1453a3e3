"""The one measurement harness (shaped like nccl-tests): an op supplies a
:class:`~cluster.measure.workload.Workload` (its rotating inputs, the fused
call, the check, the baselines, the bytes moved) built by
the builder its declaration names (``OpSpec.workload``, in
:mod:`cluster.measure.workloads`); the harness (:mod:`cluster.measure.timing`)
owns the rest:

- input rotation over more than the L2 (:func:`cluster.measure.graph.rotation_sets`,
  the one formula, capped at :data:`~cluster.measure.graph.MAX_SETS`);
- CUDA-graph capture of ``calls`` back-to-back calls and their replay
  (:func:`cluster.measure.graph.time_graph`), one eager call first (compile,
  load, communicator set-up) timed apart as ``compile_s``;
- at tp > 1 a barrier before every replay (NCCL barrier + device
  synchronize) so the ranks' replays start together, per-rank times, and
  the per-iteration max over ranks (:func:`cluster.measure.stats.max_over_ranks`);
- NVTX ranges in the project's one domain (:mod:`cluster.measure.nvtx`),
  named ``<op>/<impl> tp=.. hidden=.. M=..``;
- statistics in microseconds (:func:`cluster.measure.stats.stats`) and GPU
  clocks / temperature (:func:`cluster.measure.clocks.gpu_state`).

Layering: kernels <- cluster <- jobs; nothing here imports jobs/ or
benchmarks/. Modules import torch only inside the functions that need a GPU
(the jobs' emulated path and the CPU tests import this package without it).
"""
