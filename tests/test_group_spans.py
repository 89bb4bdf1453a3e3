"""scripts/group_spans.py on the rows of a one-H200 nightly part
(docs/results/service_h200_2026-11-30.md quotes this output)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs/results/data/h200_nightly_1gpu_part2_2026-11-30"


def _script():
    spec = importlib.util.spec_from_file_location("group_spans", REPO / "scripts/group_spans.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_group_spans_of_the_recorded_part(capsys):
    assert _script().main([str(DATA)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("324 correctness rows on 28 groups: 531 s from the first case's start "
                          "to the last one's end; 402 s inside groups, 129 s between them")
    assert "shared-gpu         8       5     57     75.8        1.33            0.76" in out


def test_no_rows_is_an_error(tmp_path, capsys):
    assert _script().main([str(DATA), "--job", "profile"]) == 1
    assert "no profile rows" in capsys.readouterr().err
