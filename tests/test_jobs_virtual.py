"""The correctness job's ``virtual-ranks`` placement, host side: the spec a
group sends to its GPU task, the spec's validation, and the rows made from
the task's result (pass, hang and wrong-answer calls). The task itself
(cluster.gpu.virtual.run_group) runs in tests/gpu/test_cluster_virtual_gpu.py."""

import dataclasses
import json

import pytest

from cluster.gpu.virtual import validate_spec
from jobs.config import load_suite, suite_path
from jobs.correctness import record_virtual, virtual_spec
from jobs.cluster_view import PlacementOffer
from jobs.recorder import Run, case_seed, now
from jobs.results import read_results

SUITE = load_suite(suite_path("smoke"))
GROUP = [c for c in SUITE.of("correctness") if c.placement == "virtual-ranks" and c.tp == 4
         and c.inputs == "random"]


def _check(ok=True, mismatches=0, ulp=0.0):
    part = {"elements": 1024, "mismatches": mismatches, "max_ulp": ulp, "nan": False,
            "bound_ulp": 0, "ok": ok}
    return {"ok": ok, "sum": {"observed": False}, "residual": part,
            "norm": dict(part, bound_ulp=1)}


def _call(graph, *, tp=4, ok=True, clean=True, diagnosis=None, missing=()):
    checks = [_check() for _ in range(tp)]
    if not ok:
        checks[2] = _check(ok=False, mismatches=5, ulp=3.0)
    return {"graph": graph, "checks": checks, "mailbox_clean": clean, "diagnosis": diagnosis,
            "missing_ranks": list(missing)}


def test_spec_carries_the_m_sequence_and_one_seed_per_repeat():
    spec = virtual_spec(GROUP)
    validate_spec(spec)
    assert (spec["tp"], spec["hidden"], spec["capacity"]) == (4, 1024, 8)
    assert [c["tokens"] for c in spec["cases"]] == [1, 3, 8, 2]
    assert spec["budget_ns"] == 1_000_000_000  # the suite's budget_ns, variant watchdog
    for case, c in zip(GROUP, spec["cases"]):
        assert c["seeds"] == [case_seed(case, r) for r in range(case.repeats)]
        assert len(set(c["seeds"])) == case.repeats == 3  # new data every call
    plain = virtual_spec([dataclasses.replace(c, variant="plain") for c in GROUP])
    assert plain["budget_ns"] == 0


@pytest.mark.parametrize("op, fields", [("finalize_publish", {"top_k": 6}), ("embed_norm", {}),
                                        ("all_reduce_mhc", {"hc": 4, "finalize": True})])
def test_every_collective_op_has_a_virtual_ranks_spec(op, fields):
    group = [dataclasses.replace(c, op=op, top_k=fields.get("top_k"), hc=fields.get("hc"),
                                 op_args=tuple((k, v) for k, v in fields.items()
                                               if k not in ("top_k", "hc")))
             for c in GROUP]
    spec = virtual_spec(group)
    validate_spec(spec)
    assert spec["op"] == op and spec["fields"] == fields


def test_the_indexer_has_no_virtual_ranks_form():
    spec = dict(virtual_spec(GROUP), op="indexer", fields={})
    with pytest.raises(ValueError, match="op indexer has no virtual-ranks form"):
        validate_spec(spec)
    spec = dict(virtual_spec(GROUP), fields={"hc": 4})
    with pytest.raises(ValueError, match=r"op all_reduce_norm has no fields \[.hc.\]"):
        validate_spec(spec)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("hidden"), "lacks"),
    (lambda s: s.update(tp=3), "tp must be one of"),
    (lambda s: s["cases"][0].update(tokens=9), "tokens must be in 1..capacity=8"),
    (lambda s: s["cases"][0].update(seeds=[]), "at least one seed"),
    (lambda s: s["cases"][0].pop("inputs"), "lacks"),
])
def test_bad_specs_are_refused_before_any_cuda_work(change, message):
    spec = virtual_spec(GROUP)
    change(spec)
    with pytest.raises(ValueError, match=message):
        validate_spec(spec)


def test_rows_from_a_result_with_a_pass_a_hang_and_a_wrong_answer(tmp_path):
    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    where = PlacementOffer("virtual-ranks", 1.0, False)
    spec = virtual_spec(GROUP)
    out = {"device": "NVIDIA H200", "cases": [
        {"tokens": 1, "calls": [_call(False), _call(True), _call(True)]},
        {"tokens": 3, "calls": [_call(False), _call(True, diagnosis="missing ranks: {2}",
                                                    missing=[2])]},
        {"tokens": 8, "calls": [_call(False, ok=False)]},
        {"tokens": 2, "calls": [_call(False), _call(True, clean=False)]},
    ]}
    record_virtual(run, SUITE, GROUP, where, spec, out, now())
    rows = {r["tokens"]: r for r in read_results(tmp_path).to_pylist()}
    assert [rows[m]["outcome"] for m in (1, 3, 8, 2)] == ["pass", "hang", "fail", "fail"]
    ok = rows[1]
    extra = json.loads(ok["extra"])
    assert ok["placement"] == "virtual-ranks" and ok["mismatches"] == 0
    assert ok["elements"] == 3 * 4 * 2 * 1 * 1024  # calls x ranks x (residual, norm) x M x H
    assert extra["graph_replays"] == 2 and extra["collective_speed"] is False
    hang = rows[3]
    assert hang["missing_ranks"] == [2] and "repeat 1 (graph replay): hang" in hang["reason"]
    assert hang["repro_command"].endswith("--placement virtual-ranks --inputs random")
    wrong = rows[8]
    assert wrong["mismatches"] == 10 and wrong["max_ulp"] == 3.0  # residual 5 + norm 5
    assert "repeat 0 (eager): fail; outputs outside the contract on ranks [2]" in wrong["reason"]
    assert "mailbox not all sentinel" in rows[2]["reason"]
    assert run.counts == {"pass": 1, "hang": 1, "fail": 2}


def test_one_virtual_task_carries_both_modes_each_case_its_own():
    """A mixed-mode group (mode is kernel-only) is one task: the spec's
    fields leave the mode out, each case carries its own, and the task
    validates each case's fields before any CUDA work."""
    group = [dataclasses.replace(c, op_args=(("mode", mode),))
             for c in GROUP for mode in ("one_shot", "owner")]
    assert len({c.group_key for c in group}) == 1
    spec = virtual_spec(group)
    validate_spec(spec)
    assert "mode" not in spec["fields"]
    assert [c["fields"]["mode"] for c in spec["cases"]] == ["one_shot", "owner"] * len(GROUP)
    spec["cases"][1]["fields"] = {"mode": "two_shot"}
    with pytest.raises(ValueError, match="mode = 'two_shot' is not valid"):
        validate_spec(spec)


def test_the_task_s_set_up_is_the_group_s_build_and_preparation(tmp_path, capsys):
    """The task's start (submit to entry), imports and kernel builds go to
    the job's accounting and to its first row, not to the cases' phases."""
    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    spec = virtual_spec(GROUP)
    out = {"device": "NVIDIA H200", "entered_unix": 1000.0 + 2.5,
           "setup_s": {"imports": 1.5, "prepare": 4.0},
           "cases": [{"tokens": c["tokens"], "calls": [_call(False)]} for c in spec["cases"]]}
    with run.section("correctness: test", len(GROUP)):
        record_virtual(run, SUITE, GROUP, PlacementOffer("virtual-ranks", 1.0, False), spec, out,
                       now(), submitted_unix=1000.0)
    entry = run.accounting[-1]
    assert entry["build_s"] == pytest.approx(2.5 + 1.5) and entry["prepare_s"] == 4.0
    assert "group builds 4.0 s, kernel preparation 4.0 s" in capsys.readouterr().out
    extras = {r["tokens"]: json.loads(r["extra"]) for r in read_results(tmp_path).to_pylist()}
    first = extras.pop(GROUP[0].tokens)
    assert (first["task_start_s"], first["imports_s"], first["prepare_s"]) == (2.5, 1.5, 4.0)
    assert not any("task_start_s" in x or "prepare_s" in x for x in extras.values())
