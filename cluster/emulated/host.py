"""The host half of an emulated call: what the driver makes before and after
the ranks' Lamport exchange, so that a rank process imports no torch.

An emulated rank (:class:`cluster.emulated.rank.EmulatedRank`) runs the
protocol alone: it publishes the payload bits it is given and consumes the
reduced sum (numpy, :mod:`cluster.emulated.lamport`). The op's torch
reference, which the emulation uses as its kernel (its ``make_inputs``,
``payload`` and ``epilogue``, :mod:`cluster.ops`), and the check run here,
in the process that made the case (the driver: :class:`cluster.group.TPGroup`,
or :func:`run_threads` for ranks held in one process). A rank process then
costs Ray's start and numpy (about 1 CPU-s) instead of torch's import on top
(about 3 CPU-s).

This is the one place the emulated backend differs from the GPU one, whose
ranks regenerate their inputs from the case (:mod:`cluster.cases`): an
emulated rank's payload travels with its call (M x hidden BF16 bits).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cluster import ops
from cluster.bits import bf16_from_bits, bits_from_bf16
from cluster.cases import Case, case_inputs, check_outputs
from cluster.injection import rank_tokens


class HostHalf:
    """One call of ``case`` on a group of ``tp`` ranks with ``faults``
    (rank -> injection): each rank's payload before the call
    (:meth:`payload`), each rank's outputs and check after it
    (:meth:`finish`). The inputs are made once per M (a ``tokens_delta``
    rank has its own)."""

    def __init__(self, case: Case, faults: Mapping[int, Mapping | None] | None = None, *,
                 tp: int, hidden: int) -> None:
        spec = ops.get(case.op)
        if spec.needs_gpu:
            raise ValueError(f"op {spec.name} on the emulated backend: {spec.needs_gpu}")
        self.case, self.tp, self.hidden = case, tp, hidden
        self._faults = dict(faults or {})
        self._module = spec.module()
        self._inputs: dict[int, dict] = {}
        self._made_ns: dict[int, int] = {}

    def inputs(self, tokens: int) -> dict:
        """The group's inputs (:func:`cluster.cases.case_inputs`) at M = ``tokens``."""
        if tokens not in self._inputs:
            self._inputs[tokens] = case_inputs(self.case, tp=self.tp, hidden=self.hidden,
                                               tokens=tokens)
        return self._inputs[tokens]

    def payload(self, rank: int) -> np.ndarray | None:
        """Rank ``rank``'s payload: uint16 ``[M, hidden]`` BF16 bits (the op's
        ``payload``), or None where its M is below 1 (the rank refuses the
        call, naming M)."""
        tokens = rank_tokens(self.case.tokens, self._faults.get(rank))
        if tokens < 1:
            return None
        started = time.monotonic_ns()
        bits = bits_from_bf16(self._module.payload(self.case, self.inputs(tokens), rank))
        self._made_ns[rank] = time.monotonic_ns() - started
        return bits

    def finish(self, result: dict | None) -> dict | None:
        """A rank's result (the :mod:`cluster.backend` contract) from the
        emulated rank's, which carries the reduced sum as ``sum_bits``:
        ``outputs`` (the op's epilogue on that sum, as bits) and ``check``
        added, the host time spent here added to ``host_ns`` (``inputs``:
        the payload; ``call``: the epilogue; ``check``). None stays None."""
        if result is None or "sum_bits" not in result:
            return result
        result = dict(result)
        rank, tokens = result["rank"], result["tokens"]
        inputs = self.inputs(tokens)
        started = time.monotonic_ns()
        outputs = self._module.epilogue(self.case, inputs, bf16_from_bits(result.pop("sum_bits")),
                                        rank)
        result["outputs"] = {name: bits_from_bf16(t) for name, t in outputs.items()}
        epilogue_done = time.monotonic_ns()
        result["check"] = check_outputs(self.case, tp=self.tp, hidden=self.hidden,
                                        outputs=result["outputs"], rank=rank,
                                        inputs=inputs if tokens == self.case.tokens else None)
        host_ns = dict(result.get("host_ns") or {})
        for phase, ns in (("inputs", self._made_ns.get(rank, 0)),
                          ("call", epilogue_done - started),
                          ("check", time.monotonic_ns() - epilogue_done)):
            host_ns[phase] = host_ns.get(phase, 0) + ns
        result["host_ns"] = host_ns
        return result


def run_threads(ranks: Sequence, case: Case, faults: Mapping[int, Mapping | None] | None = None,
                *, hidden: int, pool: ThreadPoolExecutor | None = None) -> list[dict]:
    """One call of ``case`` (its ``seq`` as given) on set-up
    :class:`~cluster.emulated.rank.EmulatedRank` s held in this process, one
    thread each (``pool``, or a new one), ``faults[r]`` on rank r; every
    rank's finished result (:meth:`HostHalf.finish`), in rank order. A rank
    that raised raises here."""
    faults = dict(faults or {})
    half = HostHalf(case, faults, tp=len(ranks), hidden=hidden)
    payloads = [half.payload(r) for r in range(len(ranks))]

    def one(r: int) -> dict:
        return ranks[r].run_case(case.replace(fault=faults.get(r)), payloads[r])
    if pool is None:
        with ThreadPoolExecutor(len(ranks)) as own:
            results = list(own.map(one, range(len(ranks))))
    else:
        results = list(pool.map(one, range(len(ranks))))
    return [half.finish(x) for x in results]
