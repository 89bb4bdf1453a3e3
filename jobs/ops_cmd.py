"""``python -m jobs ops`` (every registered op: its origin, facts and the
parts it has) and ``python -m jobs check-op NAME`` (an op held to the
contract: one line per check, pass / fail / skip, with what to fix).

check-op's checks, in order:

- ``declaration``: the typed contract with everything resolved
  (:func:`cluster.ops.contract.resolve_all`), its fault kinds in the fault
  table (``cluster.faults``) and the input kinds they ask for among its own;
- ``goldens``: every golden case of the op (:func:`cluster.ops.contract.golden_cases`)
  recomputes its committed file bit for bit, and where it makes its own
  inputs, those inputs reproduce the file; an op with none fails;
- ``references refuse bad input``: each golden case's reference, with one
  input made wrong (float64, an empty last dimension, a 0-d tensor), raises
  ValueError or TypeError, never an answer;
- ``emulated tp=N`` for N in 1, 2, 4: every input kind through N emulated
  ranks (threads here, the rank code of the emulated backend), each rank
  checked against the reference; with fault kinds, at the largest tp a
  ``skip_publish`` of the last rank must time out naming it missing, and the
  next call after recovery must pass. An op that needs a GPU is skipped with
  its reason.

Exit status: 0 every check passed or was skipped, 1 one failed, 2 an unknown op.
"""

from __future__ import annotations

import argparse
import uuid
from concurrent.futures import ThreadPoolExecutor

from jobs import exits

TPS = (1, 2, 4)
HIDDEN, TOKENS, BUDGET_NS = 256, 3, 300_000_000


def add_ops_parser(sub) -> None:
    p = sub.add_parser("ops", help="every registered op: its origin, case fields, input kinds, "
                                   "fault kinds, placements, baselines and parts")
    p.set_defaults(func=list_ops)
    p = sub.add_parser("check-op", help="hold one op to the op contract: its declaration, "
                                        "goldens, references and an emulated smoke at tp 1, 2, 4")
    p.add_argument("name", help="a registered op (python -m jobs ops lists them)")
    p.set_defaults(func=check_op)


def describe(name: str) -> list[str]:
    """The lines ``jobs ops`` prints for one op."""
    from cluster import ops
    from cluster.ops import contract

    spec = ops.get(name)
    has = contract.parts(spec)
    placements = ["process-per-gpu", "shared-gpu"] + (["virtual-ranks"] if has["virtual_kernel"]
                                                      else [])
    fields = ", ".join(f"{k}={f.default!r}" for k, f in spec.fields.items()) or "-"
    parts = ", ".join(f"{k.replace('_', ' ')}: {'yes' if v else 'no'}" for k, v in has.items())
    return [f"{name}  ({'collective' if spec.collective else 'not a collective'}) "
            f"{spec.summary}",
            f"  origin      {ops.ORIGINS.get(name, '?')}",
            f"  fields      {fields}",
            f"  inputs      {', '.join(spec.inputs)}",
            f"  faults      {', '.join(spec.faults) or '-'}",
            f"  placements  {', '.join(placements) if has['gpu_kernel'] else '-'} (gpu); "
            f"{'emulated: ' + spec.needs_gpu if spec.needs_gpu else 'emulated'}",
            f"  baselines   {', '.join(spec.baselines) or '-'}",
            f"  parts       {parts}"]


def list_ops(args: argparse.Namespace) -> int:
    from cluster import ops
    for name in ops.names():
        print("\n".join(describe(name)))
    return exits.OK


def _line(status: str, check: str, detail: str = "", fix: str = "") -> str:
    return f"{status:4}  {check}" + (f": {detail}" if detail else "") + \
        (f"\n      fix: {fix}" if fix else "")


def declaration(spec) -> list[str]:
    """Problems of the declaration (empty: complete)."""
    from cluster.faults import FAULT_KINDS
    from cluster.ops import contract

    found = contract.resolve_all(spec)
    found += [f"faults: {k!r} is no fault kind (cluster.faults.FAULT_KINDS)"
              for k in spec.faults if k not in FAULT_KINDS]
    for kind in spec.faults:
        wanted = FAULT_KINDS[kind].case.get("inputs") if kind in FAULT_KINDS else None
        if wanted is not None and wanted not in spec.inputs:
            found.append(f"faults: {kind} runs on inputs {wanted!r}, which is not one of "
                         f"inputs {list(spec.inputs)}")
    return found


def goldens(spec) -> tuple[list[str], dict]:
    """(problems, the op's golden cases)."""
    from cluster.ops import contract
    from kernels.reference import golden

    cases = contract.golden_cases(spec)
    if not cases:
        return [f"op {spec.name} has no golden case"], cases
    out = []
    for name, case in sorted(cases.items()):
        if not golden.golden_path(name).exists():
            out.append(f"{name}: no file {golden.golden_path(name)}")
            continue
        verdict = golden.verify_golden(name, case.compute)
        if not verdict.passed:
            out.append(f"{name}: the reference does not recompute its file: "
                       f"{'; '.join(verdict.problems)}")
        if case.make is not None:
            inputs, params = case.make()
            try:
                golden.check_golden(name, inputs, case.compute(inputs, params), params)
            except AssertionError as err:
                out.append(f"{name}: {err}")
    return out, cases


def bad_inputs_accepted(cases: dict) -> list[str]:
    """Each golden case's reference with one input made wrong: what it
    accepted or failed on with another error."""
    import torch

    from kernels.reference import golden

    out = []
    for name, case in sorted(cases.items()):
        inputs, _, params = golden.load_golden(name)
        for key, t in inputs.items():
            wrong = torch.float32 if t.dtype == torch.float64 else torch.float64
            for what, bad in ((str(wrong).removeprefix("torch."), t.to(wrong)),
                              ("an empty last dimension", t[..., :0] if t.dim() else t[None][:0]),
                              ("a 0-d tensor", t.reshape(-1)[:1].reshape(()))):
                try:
                    case.compute({**inputs, key: bad}, params)
                    out.append(f"{name}: input {key} as {what} was accepted")
                except (ValueError, TypeError):
                    pass
                except Exception as err:  # noqa: BLE001 -- the check names any other error
                    out.append(f"{name}: input {key} as {what}: {type(err).__name__}: {err}")
    return out


def emulated(spec, tp: int, *, fault: bool) -> list[str]:
    """Every input kind of ``spec`` through ``tp`` emulated ranks (threads),
    then (``fault``) a skip_publish of the last rank and a clean call after
    recovery; the problems found."""
    from cluster.cases import make_case
    from cluster.emulated import EmulatedRank
    from cluster.emulated.host import run_threads
    from kernels.lamport.diagnosis import RankReport, diagnose

    group_id = uuid.uuid4().hex[:12]
    ranks = [EmulatedRank() for _ in range(tp)]
    out: list[str] = []
    seq = 0

    def call(case, pool) -> list[dict]:
        """One call of every rank (``case``: a cluster.cases.Case);
        ``case.fault``, if any, on the last rank only."""
        nonlocal seq
        seq += 1
        return run_threads(ranks, case.replace(seq=seq, fault=None), {tp - 1: case.fault},
                           hidden=HIDDEN, pool=pool)

    with ThreadPoolExecutor(tp) as pool:
        list(pool.map(lambda r: ranks[r].setup(group_id=group_id, rank=r, tp=tp,
                                               capacity=TOKENS, hidden=HIDDEN, timeout_s=30),
                      range(tp)))
        try:
            for kind in spec.inputs:
                case = make_case(capacity=TOKENS, tokens=TOKENS, op=spec.name, inputs=kind,
                                 budget_ns=BUDGET_NS)
                for res in call(case, pool):
                    if not res["check"]["ok"]:
                        wrong = {k: v for k, v in res["check"].items()
                                 if isinstance(v, dict) and not v.get("ok", True)}
                        out.append(f"inputs {kind}: rank {res['rank']}: {wrong}")
            if fault:
                case = make_case(capacity=TOKENS, tokens=TOKENS, op=spec.name,
                                 inputs=spec.inputs[0], budget_ns=BUDGET_NS)
                got = call(case.replace(fault={"kind": "skip_publish"}), pool)
                seen = diagnose([RankReport.from_result(r) for r in got], tp=tp,
                                expected=(seq, TOKENS))
                if seen.missing_ranks != {tp - 1}:
                    out.append(f"skip_publish of rank {tp - 1}: the group diagnosis says "
                               f"{seen.summary()}; expected missing ranks = {tp - 1}")
                list(pool.map(lambda r: ranks[r].recover(), range(tp)))
                after = call(case, pool)
                if not all(r["check"]["ok"] for r in after):
                    out.append("the call after skip_publish and recovery is not bit-exact")
        finally:
            for r in ranks:
                r.close()
    return out


def check_op(args: argparse.Namespace) -> int:
    from cluster import ops
    from jobs.config import ConfigError

    try:
        spec = ops.get(args.name)
    except ValueError as err:
        raise ConfigError(f"check-op {args.name!r}: {err}") from None
    failed = False

    def report(check: str, problems: list[str], fix: str, ok_detail: str = "") -> None:
        nonlocal failed
        failed |= bool(problems)
        print(_line("fail", check, "; ".join(problems), fix) if problems
              else _line("pass", check, ok_detail), flush=True)

    print(f"check-op {spec.name} ({ops.ORIGINS[spec.name]})")
    found = declaration(spec)
    report("declaration", found, "complete the declaration and its impl module "
                                 "(cluster/ops/contract.py, docs/adding-an-op.md)")
    if found:
        return exits.FAILED
    problems, cases = goldens(spec)
    report("goldens reproduce with the reference", problems,
           "declare golden = its provider module and write the files "
           "(LAMPORT_UPDATE_GOLDEN=1, kernels/reference/golden.py), or fix the reference",
           f"{len(cases)} case(s)")
    if cases:
        report("references refuse bad input", bad_inputs_accepted(cases),
               "validate every argument with kernels.validation (require_tensor: dtype, shape)")
    for tp in TPS:
        check = f"emulated correctness tp={tp}"
        if spec.needs_gpu:
            print(_line("skip", check, f"op {spec.name}: {spec.needs_gpu}"))
            continue
        fault = bool(spec.faults) and tp == TPS[-1]
        report(check + (" + fault skip_publish" if fault else ""), emulated(spec, tp, fault=fault),
               "make payload / epilogue / expected agree (the emulated backend runs them)",
               f"inputs {', '.join(spec.inputs)}")
    return exits.FAILED if failed else exits.OK
