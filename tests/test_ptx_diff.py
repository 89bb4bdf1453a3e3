"""scripts/ptx_diff.py without compiling: how it reads compile-check's dump
folders and what it calls identical, changed, new or gone."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "ptx_diff", Path(__file__).resolve().parent.parent / "scripts" / "ptx_diff.py")
ptx_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ptx_diff)


def _dump(root: Path, folders: dict[str, str]) -> Path:
    for name, text in folders.items():
        (root / name).mkdir(parents=True)
        (root / name / "k.ptx").write_text(text)
    return root


def test_variants_match_by_name_and_order_and_comments_do_not_count(tmp_path):
    old = ptx_diff._ptx(_dump(tmp_path / "old", {
        "0000_op_a_sm_90a": "// built in /tmp/x\nadd;\n",
        "0001_op_a_sm_90a": "mul;\n",          # a repeated name: the second one
        "0002_op_b_sm_90a": "ld;\nst;\n",
        "0003_op_c_sm_90a": "ret;\n"}))
    new = ptx_diff._ptx(_dump(tmp_path / "new", {
        "0000_op_a_sm_90a": "// built in /tmp/y\nadd;\n",
        "0001_op_a_sm_90a": "mul;\n",
        "0002_op_b_sm_90a": "ld;\nld;\nst;\n",
        "0003_op_d_sm_90a": "ret;\n"}))
    assert ptx_diff.compare(old, new) == [
        ("op_a_sm_90a#0", "identical"), ("op_a_sm_90a#1", "identical"),
        ("op_b_sm_90a#0", "differs (1 lines)"), ("op_c_sm_90a#0", "gone"),
        ("op_d_sm_90a#0", "new")]


def test_a_ref_that_is_not_a_commit_is_named(capsys):
    with pytest.raises(SystemExit) as exit_:
        ptx_diff.main(["no-such-ref-xyz"])
    assert exit_.value.code == 2
    assert "REF 'no-such-ref-xyz' is not a commit" in capsys.readouterr().err
