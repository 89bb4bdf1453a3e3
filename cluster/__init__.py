"""Rank actors, TP groups, hang diagnosis and recovery.

- :mod:`cluster.group`: :class:`~cluster.group.TPGroup`, tp rank actors run as one Lamport group;
- :mod:`cluster.actors`: the RankActor (thin executor) and its metadata;
- :mod:`cluster.backend`: the RankBackend seam and its registry (``emulated``, ``gpu``);
- :mod:`cluster.emulated`: the Lamport protocol in numpy over host shared memory;
- :mod:`cluster.gpu`: the CuTe DSL kernels on GPUs (process per GPU: NCCL +
  symmetric memory; shared GPU: gloo + CUDA IPC mailboxes);
- :mod:`cluster.discovery`: hardware discovery (a node's GPUs, links, versions);
- :mod:`cluster.topology`: the cluster's topology and TP-group planning;
- :mod:`cluster.placement`: the placement names (:class:`~cluster.placement.Placement`);
- :mod:`kernels.lamport.diagnosis` (below cluster, shared with the host classes): the
  group-level diagnosis from every rank's watchdog report;
- :mod:`cluster.ops`: the op registry (one declaration per op: case fields, inputs,
  reference check, emulated payload and epilogue, GPU rank and virtual-rank kernels,
  compile variants, baselines, fault kinds, workload name);
- :mod:`cluster.cases`: the case dict, its inputs and its check (generic, over the registry);
- :mod:`cluster.injection`, :mod:`cluster.faults`: per-rank fault injections and
  the fault table with expected outcomes (docs/design.md, The fault table).
"""
