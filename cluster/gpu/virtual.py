"""The ``virtual-ranks`` placement for the jobs: a correctness group run in
one process on one GPU (:class:`kernels.lamport.all_reduce_norm.VirtualRanks`:
tp ranks, each with its own mailbox, stage state and stream; every peer store
lands in the same GPU's memory, so no timing from here is a collective's
speed).

:func:`run_group` is what a Ray task holding one GPU runs (``jobs
correctness`` with ``placement = "virtual-ranks"``). The group's cases run in
order on one set of mailboxes (an M sequence), each case ``len(seeds)``
calls, each with new data:

- call 0 is eager, with a zero residual: residual_out is then BF16(sum) bit
  for bit, so the reduced sum itself is checked;
- the later calls replay one CUDA graph captured for that M over static
  input buffers, new inputs copied in before each replay (graph replay with
  new data must give what an eager call gives).

Outputs are poisoned before every call. After each call every rank's
outputs are checked with :func:`cluster.cases.check_outputs` (sum and
residual bit-exact, norm within 1 BF16 ULP, NaN never passes), the
mailboxes must be all sentinel, and the watchdog's error buffers empty; a
non-empty one makes the call a ``hang`` with
:func:`kernels.lamport.mailbox.diagnose`'s summary. After the first bad
call (hang, wrong output or a dirty mailbox) the mailboxes are recovered
and the case stops there; the next case starts clean.

Result (plain data, it crosses Ray)::

    {"device": name, "cases": [{"tokens": M, "calls": [
        {"graph": bool, "checks": [check_outputs dict per rank],
         "mailbox_clean": bool, "diagnosis": str | None,
         "missing_ranks": [...]}]}]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SPEC_FIELDS = ("tp", "hidden", "capacity", "eps", "watchdog_ns", "cases")
CASE_FIELDS = ("tokens", "inputs", "seeds")


def validate_spec(spec: Mapping) -> None:
    """ValueError naming what is missing or out of range, before any CUDA work."""
    missing = [f for f in SPEC_FIELDS if f not in spec]
    if missing:
        raise ValueError(f"virtual-ranks spec lacks {missing}")
    if spec["tp"] not in (1, 2, 4, 8):
        raise ValueError(f"tp must be one of 1, 2, 4, 8, got {spec['tp']}")
    if spec["watchdog_ns"] < 0:
        raise ValueError(f"watchdog_ns must be >= 0, got {spec['watchdog_ns']}")
    for c in spec["cases"]:
        lacking = [f for f in CASE_FIELDS if f not in c]
        if lacking:
            raise ValueError(f"virtual-ranks case {dict(c)} lacks {lacking}")
        if not 1 <= c["tokens"] <= spec["capacity"]:
            raise ValueError(f"tokens must be in 1..capacity={spec['capacity']}, "
                             f"got {c['tokens']}")
        if not c["seeds"]:
            raise ValueError("a case needs at least one seed (one call)")


def run_group(spec: Mapping) -> dict:
    """See the module docstring. ``spec``: ``tp``, ``hidden``, ``capacity``,
    ``eps``, ``watchdog_ns`` (0: the plain consumer), ``cases``: a list of
    ``{"tokens", "inputs", "seeds": [one per call]}``."""
    import torch

    from cluster.cases import make_case
    from kernels.lamport.all_reduce_norm import VirtualRanks

    validate_spec(spec)
    tp, hidden, capacity = int(spec["tp"]), int(spec["hidden"]), int(spec["capacity"])
    ranks = VirtualRanks(tp=tp, hidden_size=hidden, max_num_tokens=capacity,
                         eps=float(spec["eps"]), watchdog_ns=int(spec["watchdog_ns"]))
    results = []
    for c in spec["cases"]:
        calls = []
        cases = [make_case(capacity=capacity, tokens=int(c["tokens"]), inputs=c["inputs"],
                           seed=int(seed), eps=float(spec["eps"]),
                           residual="zeros" if i == 0 else "random")
                 for i, seed in enumerate(c["seeds"])]
        for call in _calls(ranks, cases, tp=tp, hidden=hidden):
            calls.append(call)
            if call["diagnosis"] is not None or not call["mailbox_clean"] \
                    or not all(c["ok"] for c in call["checks"]):
                ranks.recover()  # the next case starts from clean mailboxes
                break
        results.append({"tokens": int(c["tokens"]), "calls": calls})
    return {"device": torch.cuda.get_device_name(), "cases": results}


def _calls(ranks, cases: Sequence[dict], *, tp: int, hidden: int):
    """Yield one result per case dict (the first eager, then graph replays)."""
    import torch

    from cluster.cases import bits_from_bf16, case_inputs, check_outputs
    from kernels.reference.numerics import poison_

    m = int(cases[0]["tokens"])
    dev = ranks.device
    bf16 = torch.bfloat16
    xs = [torch.empty(m, hidden, dtype=bf16, device=dev) for _ in range(tp)]
    residuals = [torch.empty(m, hidden, dtype=bf16, device=dev) for _ in range(tp)]
    weight = torch.empty(hidden, dtype=bf16, device=dev)
    outs = [(torch.empty(m, hidden, dtype=bf16, device=dev),
             torch.empty(m, hidden, dtype=bf16, device=dev)) for _ in range(tp)]
    graph = None
    for i, case in enumerate(cases):
        partials, residual, w = case_inputs(case, tp=tp, hidden=hidden)
        for r in range(tp):
            xs[r].copy_(partials[r])
            residuals[r].copy_(residual)
        weight.copy_(w)
        for norm_out, residual_out in outs:
            poison_(norm_out)
            poison_(residual_out)
        if i == 0:
            ranks(xs, residuals, weight, outs=outs)
        else:
            if graph is None:
                torch.cuda.synchronize(dev)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    ranks(xs, residuals, weight, outs=outs)
            graph.replay()
        torch.cuda.synchronize(dev)
        diagnosis = ranks.diagnose()
        checks = []
        for norm_out, residual_out in outs:
            outputs = {"residual": bits_from_bf16(residual_out.cpu()),
                       "norm": bits_from_bf16(norm_out.cpu())}
            outputs["sum"] = outputs["residual"].copy() if case["residual"] == "zeros" else None
            checks.append(check_outputs(case, tp=tp, hidden=hidden, outputs=outputs))
        yield {"graph": i > 0, "checks": checks, "mailbox_clean": ranks.is_all_sentinel(),
               "diagnosis": None if diagnosis.ok else diagnosis.message,
               "missing_ranks": sorted(diagnosis.missing_ranks)}
