"""One meaning of ``--suite`` (issue 67): on the jobs that are not sweeps
(compile-check, selfcheck) it selects what the suite's section names, as on
the sweep jobs it selects the suite's cases; the rows' results partition has
its own flag, ``--partition``. The compiles are replaced by a recorder
(what is checked is the selection, not the PTX: tests/test_lamport_compile.py
compiles)."""

import pytest

from jobs import compile_check as cc
from jobs import compile_selection
from jobs.__main__ import main as cli_main
from jobs.config import load_suite, suite_path
from jobs.results import read_results


@pytest.fixture
def compiled(monkeypatch):
    """The (variant, arch) pairs compile-check runs, none compiled."""
    seen = []

    def run_variant(v, arch, dump_root, index):
        seen.append((v, arch))
        return cc.Row(v, arch, started_at=cc._now(), finished_at=cc._now())
    monkeypatch.setattr(cc, "run_variant", run_variant)
    monkeypatch.setattr(cc, "check_pairs", lambda rows: None)
    return seen


def _rows(root):
    return read_results(root).to_pylist()


def test_compile_check_of_the_smoke_suite_compiles_its_subset(compiled, tmp_path, capsys):
    smoke = load_suite(suite_path("smoke")).compile_check
    assert cc.main(["--suite", "smoke", "--results", str(tmp_path / "r")]) == 0
    every = compile_selection.variants(compile_selection.registered_ops(),
                                       compile_selection.DEFAULT_HIDDEN,
                                       compile_selection.DEFAULT_TP)
    assert 0 < len(compiled) < len(every) * len(compile_selection.DEFAULT_ARCHS)
    assert {arch for _, arch in compiled} == set(smoke["arch"]) == {"sm_90a"}
    def ident(v):
        return v.op, v.kernel, v.transport, v.budget_ns, v.hidden, v.tp, v.detail
    mine = compile_selection.variants(compile_selection.registered_ops(),  # ops = "*"
                                      smoke["hidden"], smoke["tp"])
    assert sorted(map(ident, (v for v, _ in compiled)), key=repr) == sorted(map(ident, mine),
                                                                            key=repr)
    rows = _rows(tmp_path / "r")
    assert len(rows) == len(compiled) and {r["suite"] for r in rows} == {"smoke"}
    assert f"{len(compiled)} variants:" in capsys.readouterr().out


def test_the_command_line_replaces_a_suite_value_and_partition_names_the_rows(compiled,
                                                                              tmp_path):
    assert cc.main(["--suite", "smoke", "--arch", "sm_100a", "--ops", "embed_norm",
                    "--partition", "night", "--results", str(tmp_path / "r")]) == 0
    assert {(v.op, arch) for v, arch in compiled} == {("embed_norm", "sm_100a")}
    assert {(v.hidden, v.tp) for v, _ in compiled} <= {(2048, 2), (None, 2), (2048, None),
                                                       (None, None)}  # the suite's stay
    assert {r["suite"] for r in _rows(tmp_path / "r")} == {"night"}


def test_without_a_suite_every_arch_and_its_own_partition(compiled, tmp_path):
    assert cc.main(["--ops", "embed_norm", "--hidden", "2048", "--tp", "2",
                    "--results", str(tmp_path / "r")]) == 0
    assert {arch for _, arch in compiled} == set(compile_selection.DEFAULT_ARCHS)
    assert {r["suite"] for r in _rows(tmp_path / "r")} == {"compile-check"}


def test_a_suite_file_selects_its_compile_check(compiled, tmp_path):
    suite = tmp_path / "mine.toml"
    suite.write_text('format = 1\nname = "mine"\nversion = 1\n[compile_check]\n'
                     'arch = ["sm_100a"]\nhidden = [4096]\ntp = [4]\nops = ["embed_norm"]\n')
    assert cc.main(["--config", str(suite), "--results", str(tmp_path / "r")]) == 0
    assert compiled and {(v.op, arch) for v, arch in compiled} == {("embed_norm", "sm_100a")}
    assert {v.hidden for v, _ in compiled} <= {4096, None}
    assert {r["suite"] for r in _rows(tmp_path / "r")} == {"mine"}


@pytest.mark.parametrize("job", ["compile-check", "selfcheck"])
@pytest.mark.parametrize("argv, said", [
    (["--suite", "nosuch"], "unknown suite 'nosuch'"),
    (["--config", "{none}"], "the suite has no ["),
    (["--suite", "smoke", "--config", "x.toml"], "not allowed with argument"),
    (["--partition", "../x"], "--partition: must be an ASCII word"),
])
def test_a_bad_selection_exits_2_before_anything_is_written(job, argv, said, compiled,
                                                              tmp_path, capsys):
    bare = tmp_path / "bare.toml"
    bare.write_text('format = 1\nname = "bare"\nversion = 1\n')
    argv = [a.replace("{none}", str(bare)) for a in argv]
    assert cli_main([job, *argv, "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert not compiled and not (tmp_path / "r").exists()


def test_selfcheck_of_a_suite_checks_its_cases_in_its_partition(tmp_path, capsys):
    suite = tmp_path / "one.toml"
    suite.write_text('format = 1\nname = "one"\nversion = 1\n[selfcheck]\n'
                     'cases = ["all_reduce_norm_sentinel_tp2"]\n')
    assert cli_main(["selfcheck", "--config", str(suite), "--results", str(tmp_path / "r")]) == 0
    rows = _rows(tmp_path / "r")
    assert [(r["variant"], r["suite"]) for r in rows] == [("all_reduce_norm_sentinel_tp2", "one")]
    assert cli_main(["selfcheck", "--case", "all_reduce_norm_sentinel_tp2",
                     "--results", str(tmp_path / "s")]) == 0
    assert {r["suite"] for r in _rows(tmp_path / "s")} == {"selfcheck"}


def test_every_job_s_suite_help_says_it_selects():
    """Every job's ``--suite`` selects (bisect's also names the partition of
    its verdict rows, from the same suite); ``--partition`` alone only names one."""
    from jobs.__main__ import build_parser
    subs = next(a for a in build_parser()._actions if a.choices and "nightly" in a.choices)
    parsers = {**subs.choices, "compile-check": cc.build_parser()}
    helps = {name: a.help for name, p in parsers.items() for a in p._actions
             if "--suite" in a.option_strings}
    assert {"compile-check", "selfcheck", "correctness", "nightly", "bisect"} <= set(helps)
    for name, text in helps.items():
        assert "results partition" not in text and ("suite" in text), (name, text)
    (partition,) = [a for a in cc.build_parser()._actions if "--partition" in a.option_strings]
    assert "selects nothing" in partition.help
