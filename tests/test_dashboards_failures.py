"""A bad night's dashboards (issue 64): the Inf row builds, a page that
still fails becomes an error page while the rest of the site is built
(``python -m dashboards build`` names it and exits 3; the nightly reports
it and keeps its cases' exit status), ``serve`` serves only files inside
the site and names a port in use, ``build`` refuses an --out it cannot
write and a --results that is not a dataset, each with one line, exit 2,
nothing written."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import socket
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dashboards import build as site_build
from dashboards.__main__ import main as cli
from dashboards.regression import verdict
from dashboards.serve import serve
from jobs.results import ResultsWriter
from jobs.results.dataset import MARKER, looks_like_dataset
from tests import dashboards_sample as sample

REPO = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)


def inf_night(root: Path) -> None:
    """The night of issue 64 item 1: a kernel wrote an infinite ``max_ulp``."""
    ResultsWriter(root, suite="smoke", run_id="inf-night", trigger="nightly").append(
        [dict(op="all_reduce_norm", tp=2, tokens=t, job="correctness", backend="emulated",
              outcome="fail" if t == 16 else "pass", started_at=T0,
              max_ulp=math.inf if t == 16 else 0.5, mismatches=3 if t == 16 else 0,
              t_median_us=math.inf if t == 16 else 12.0, ratio=math.nan)
         for t in (1, 16)])


def test_the_inf_row_builds_every_page_and_shows_inf(tmp_path, capsys):
    inf_night(tmp_path / "results")
    assert cli(["build", "--results", str(tmp_path / "results"),
                "--out", str(tmp_path / "site")]) == 0
    assert capsys.readouterr().err == ""
    details = (tmp_path / "site" / "details-all_reduce_norm.html").read_text()
    assert ">inf<" in details and "page-error" not in details


def _raise(site):
    raise RuntimeError("planted failure\nsecond line")


Boom = types.ModuleType("dashboards.pages.boom", "A page that raises (planted in the build).")
Boom.render = _raise


def test_a_failing_page_is_an_error_page_and_the_rest_is_built(tmp_path, monkeypatch, capsys):
    sample.write_sample(tmp_path / "results")
    pages = tuple(Boom if m is site_build.trends else m for m in site_build.PAGES)
    monkeypatch.setattr(site_build, "PAGES", pages)
    monkeypatch.setitem(site_build.FILES, Boom, "trends.html")
    status = cli(["build", "--results", str(tmp_path / "results"),
                  "--out", str(tmp_path / "site")])
    out, err = capsys.readouterr()
    assert status == site_build.PAGES_FAILED == 3
    assert out.strip() == f"site: {tmp_path / 'site' / 'index.html'}"
    assert err.splitlines() == ["python -m dashboards build: page trends.html failed: "
                                "RuntimeError: planted failure second line (built as an error "
                                "page naming it)"]
    error = (tmp_path / "site" / "trends.html").read_text()
    assert 'class="page-error"' in error
    assert "dashboards.pages.boom.render raised RuntimeError: planted failure" in error
    for name in ("index.html", "latency.html", "correctness.html", "faults.html",
                 "stragglers.html", "environment.html", "compare.html"):
        assert "page-error" not in (tmp_path / "site" / name).read_text(), name
    assert (tmp_path / "site" / "assets" / "plotly.min.js").is_file()
    # The failed page's per-op files, linked from the overview: error pages, no 404
    # (at c31321b these links were dead).
    linked = set(site_build.LOCAL_LINK.findall((tmp_path / "site" / "index.html").read_text()))
    per_op = sorted(n for n in linked if n.startswith("trends-"))
    assert per_op, linked
    for html in (tmp_path / "site").glob("*.html"):
        for name in site_build.LOCAL_LINK.findall(html.read_text()):
            assert (tmp_path / "site" / name).is_file(), f"{html.name} links {name}: 404"
    for name in per_op:
        page = (tmp_path / "site" / name).read_text()
        assert 'class="page-error"' in page and "This page was not built" in page, name
        assert "page trends.html failed: RuntimeError: planted failure" in page, name


def test_the_nightly_names_failed_pages_and_keeps_its_exit_status(tmp_path, monkeypatch,
                                                                  capsys):
    """The real ``python -m dashboards build`` subprocess, a page planted to
    fail through a sitecustomize on its path: the nightly's dashboard part
    says which page failed and returns 0 (the run's status is its cases')."""
    from jobs import __main__ as jobs_cli
    sample.write_sample(tmp_path / "results")
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(
        "import dashboards.build as b, dashboards.pages.faults as f\n"
        "def render(site):\n    raise ZeroDivisionError('planted')\n"
        "f.render = render\n")
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{plant}")
    args = argparse.Namespace(no_results=False, no_dashboard=False, results=tmp_path / "results",
                              site=tmp_path / "site")
    assert jobs_cli._dashboard_part(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"dashboard: built {tmp_path / 'site' / 'index.html'}, but 1 "
                               f"page(s) failed (infrastructure")
    assert lines[1] == ("dashboard: page faults.html failed: ZeroDivisionError: planted (built "
                        "as an error page naming it)")
    assert "page-error" in (tmp_path / "site" / "faults.html").read_text()


def test_verdicts_are_total_over_non_finite_and_huge_latencies():
    assert verdict(math.inf, [10.0] * 5).status == "no-timing"
    assert verdict(math.nan, [10.0] * 5).status == "no-timing"
    assert verdict(13.0, [10.0, math.inf, math.nan, 10.0, 10.0, 10.0, 10.0]).status == "regressed"
    assert verdict(1e308, [1e308] * 6).status == "no-timing"  # the mean overflows


def test_build_refuses_a_folder_that_is_not_a_dataset(tmp_path, capsys):
    assert cli(["build", "--results", "/etc", "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"python -m dashboards build: --results /etc is not a "
                                f"lamport-lab results dataset (no date=*/suite=* partitions, "
                                f"no _runs folder, no dataset marker) and not empty; give the "
                                f"folder the jobs write with --results"]
    assert not (tmp_path / "site").exists() and not list(tmp_path.iterdir())
    link = tmp_path / "link"
    link.symlink_to("/etc")
    assert cli(["build", "--results", str(link), "--out", str(tmp_path / "site")]) == 2
    # an empty folder, a marked one, one with partitions or manifests: datasets
    for name, make in (("empty", None), ("marked", MARKER), ("runs", "_runs/"),
                       ("parts", "date=2026-12-01/suite=smoke/")):
        root = tmp_path / name
        root.mkdir()
        if make is not None:
            (root / make).mkdir(parents=True) if make.endswith("/") else (root / make).write_text("{}")
        assert looks_like_dataset(root) == (make is not None)
        assert cli(["build", "--results", str(root), "--out", str(tmp_path / f"s-{name}")]) == 0


def test_build_into_a_folder_it_cannot_write_is_one_line_and_nothing_written(tmp_path, capsys):
    sample.write_sample(tmp_path / "results")
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    out = blocker / "site"
    assert cli(["build", "--results", str(tmp_path / "results"), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"python -m dashboards build: --out {out}: {blocker} exists and is not a "
                    f"directory")
    assert blocker.read_text() == "mine"
    # A system folder is refused as such, before any attempt to write (root could).
    assert cli(["build", "--results", str(tmp_path / "results"), "--out", "/sys/site"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == ("python -m dashboards build: --out /sys/site is inside the system folder "
                    "/sys; give a folder of your own")
    assert not os.path.exists("/sys/site")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_build_into_a_read_only_folder(tmp_path, capsys):
    sample.write_sample(tmp_path / "results")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert cli(["build", "--results", str(tmp_path / "results"),
                    "--out", str(ro / "site")]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert f"--out {ro / 'site'}: cannot create a directory under {ro}" in line
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


@pytest.fixture
def site(tmp_path) -> Path:
    inf_night(tmp_path / "results")
    out = tmp_path / "site"
    site_build.build_site(tmp_path / "results", out)
    (tmp_path / "secret.txt").write_text("outside the site")
    (out / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (out / "up").symlink_to(tmp_path)
    return out


def test_serve_only_serves_files_inside_the_site(site):
    ready, urls = threading.Event(), []
    thread = threading.Thread(target=serve, args=(site, 0, 3.0), daemon=True,
                              kwargs={"on_ready": lambda u: (urls.append(u), ready.set())})
    thread.start()
    assert ready.wait(10)
    with urllib.request.urlopen(urls[0] + "index.html", timeout=5) as response:
        assert response.status == 200
    for path in ("leak.txt", "up/secret.txt", "assets/", "../secret.txt", "%2e%2e/secret.txt"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urls[0] + path, timeout=5)
        assert refused.value.code == 404, path
    thread.join(15)


def test_serve_on_a_port_in_use_is_one_line_exit_2(site, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli(["serve", "--site", str(site), "--port", str(port), "--seconds", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m dashboards serve: --port {port}: already in use on 127.0.0.1; give another "
        f"port, or 0 for any free one"]


def test_cli_in_a_subprocess_has_no_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dashboards", "build", "--results", "/etc",
                           "--out", str(tmp_path / "s")], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_path_options_expand_the_home_folder_and_refuse_names_too_long(tmp_path, monkeypatch,
                                                                        capsys):
    home = tmp_path / "home"
    sample.write_sample(home / "results")
    monkeypatch.setenv("HOME", str(home))
    assert cli(["build", "--results", "~/results", "--out", "~/site"]) == 0
    assert (home / "site" / "index.html").is_file() and not (tmp_path / "~").exists()
    with pytest.raises(SystemExit) as exit_:
        cli(["build", "--results", str(tmp_path / ("a" * 300)), "--out", "~/site"])
    assert exit_.value.code == 2
    assert "a component of 300 bytes" in capsys.readouterr().err
