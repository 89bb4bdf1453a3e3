"""Build the static site: ``build_site(results_dir, out_dir) -> index path``.

The site opens from disk (file://) or any web server with no internet:
plotly.js is copied once from the installed plotly package into
``SITE/assets/plotly.min.js`` and every page refers to it relatively. Pages
are written to a temporary folder beside ``out_dir`` and swapped in at the
end, so a failed build leaves the previous site whole.

A built site holds the marker file ``MARKER``; an existing ``out_dir`` is
replaced only when it holds that marker (a site this builder made) or is an
empty directory. Anything else, an ``index.html`` of someone else's
included, is refused with FileExistsError and left untouched. Before
anything is read or written, ``out_dir`` must be one this process can
write (:func:`jobs.outputs.check_dir`, a ValueError naming ``--out``) and
``results_dir`` a lamport-lab dataset or an empty folder
(:func:`check_results`).

A page whose ``render`` raises does not stop the build: it becomes an error
page naming the page and the exception (type and message), the rest of the
site is built, and :func:`build` returns the failures (``python -m
dashboards build`` prints one line each and exits ``PAGES_FAILED``).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dashboards import html as h
from dashboards import model
from dashboards.pages import (Site, compare, correctness, environment, faults, latency,
                              overview, stragglers, trends)
from dashboards.regression import Verdict, judge_all
from jobs.outputs import SITE_MARKER, check_dir, site_refusal
from jobs.results.dataset import looks_like_dataset

ASSETS = Path(__file__).with_name("assets")
MARKER = SITE_MARKER
"""The file that marks a directory as a site this builder made (its name
and the rule for replacing a site live in jobs.outputs, which the nightly
checks before it starts)."""
PAGES = (overview, trends, latency, correctness, faults, stragglers, environment, compare)
FILES = {overview: "index.html", trends: "trends.html", latency: "latency.html",
         correctness: "correctness.html", faults: "faults.html", stragglers: "stragglers.html",
         environment: "environment.html", compare: "compare.html"}
"""Each page module's top file: the one its error page takes when it fails."""
PAGES_FAILED = 3
"""``python -m dashboards build``'s exit status when the site was built but
some page failed and is an error page (the dashboards' fault on this data,
not the data's verdict: the nightly reports it as infrastructure and keeps
its own exit status)."""


@dataclass(frozen=True)
class PageFailure:
    """A page that failed to render: its file and the exception, one line."""
    page: str
    error: str

    def line(self) -> str:
        return f"page {self.page} failed: {self.error} (built as an error page naming it)"


@dataclass
class Built:
    """What :func:`build` made: the index and the pages that failed."""
    index: Path
    failures: list[PageFailure] = field(default_factory=list)


def _cause(err: BaseException) -> str:
    """``Type: message`` on one line (at most 300 characters of message)."""
    message = " ".join(str(err).split())
    return f"{type(err).__name__}: {message[:300]}" if message else type(err).__name__


def plotly_js() -> Path:
    """The plotly.min.js bundled in the installed plotly package."""
    import plotly
    path = Path(plotly.__file__).with_name("package_data") / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the plotly package (plotly>=5.20) ships "
                                "plotly.min.js there; reinstall plotly")
    return path


LOCAL_LINK = re.compile(r'href="([\w.-]+\.html)')
"""A link from one page of the site to another (a file name, no folder)."""


def render_pages(results: model.Results, built: str,
                 pages: tuple | None = None) -> tuple[dict[str, str], list[PageFailure]]:
    """Every page of the site as {file name: html}, and the pages that
    failed (each then an error page). Verdicts that cannot be computed are
    a failure too; every row's latency status is then ``no-timing``."""
    failures = []
    try:
        verdicts = judge_all(results)
    except Exception as err:  # noqa: BLE001 - any bug on any data: named, never fatal
        failures.append(PageFailure("regression verdicts (every page's latency status)",
                                    _cause(err)))
        verdicts = {row["_index"]: Verdict("no-timing") for row in results.rows}
    site = Site(results, verdicts, built)
    out: dict[str, str] = {}
    for module in PAGES if pages is None else pages:
        try:
            out.update(module.render(site))
        except Exception as err:  # noqa: BLE001 - the rest of the site is still built
            name = FILES.get(module) or f"{module.__name__.rpartition('.')[2]}.html"
            failures.append(PageFailure(name, _cause(err)))
            out[name] = error_page(site, name, module.__name__, err)
    if failures:  # a failed page's per-op files (details-*, trends-*): linked, never built
        for name in sorted(set(LOCAL_LINK.findall("".join(out.values()))) - out.keys()):
            out[name] = unbuilt_page(site, name, failures)
    return out, failures


def error_page(site: Site, name: str, module: str, err: BaseException) -> str:
    """The page ``name`` as an error page naming why it failed."""
    title = dict(h.NAV).get(name, name)
    body = h.tag("div", h.join([
        h.tag("p", h.join([h.tag("strong", "This page failed to build. "),
                           f"{module}.render raised {_cause(err)}."])),
        h.tag("p", "The rest of the site was built; python -m dashboards build named this page "
                   f"and exited {PAGES_FAILED}. Please report it with the line above.",
              cls="note")]), cls="page-error", id="page-error")
    return site.page(f"{title}: failed to build", name, body)


def unbuilt_page(site: Site, name: str, failures: list[PageFailure]) -> str:
    """The page ``name``, linked from a built page but not built because a
    page module failed: an error page naming the failures (never a 404)."""
    body = h.tag("div", h.join([
        h.tag("p", h.join([h.tag("strong", "This page was not built: "),
                           "the page that makes it failed."])),
        h.tag("ul", h.join([h.tag("li", f.line()) for f in failures])),
        h.tag("p", f"python -m dashboards build exited {PAGES_FAILED}. Please report it with "
                   f"the lines above.", cls="note")]), cls="page-error", id="page-error")
    return site.page(f"{name}: not built", name, body)


def check_results(results_dir: Path) -> None:
    """ValueError naming ``results_dir`` unless it is a lamport-lab dataset
    (:func:`jobs.results.dataset.looks_like_dataset`) or an empty folder;
    FileNotFoundError when it is no directory. So ``--results /etc`` is
    refused rather than built into a site of no rows."""
    if not results_dir.is_dir():
        raise FileNotFoundError(f"--results {results_dir} is not a directory")
    if not looks_like_dataset(results_dir) and any(results_dir.iterdir()):
        raise ValueError(f"--results {results_dir} is not a lamport-lab results dataset (no "
                         f"date=*/suite=* partitions, no _runs folder, no dataset marker) "
                         f"and not empty; give the folder the jobs write with --results")


def build_site(results_dir: Path, out_dir: Path) -> Path:
    """Build the site for the results dataset under ``results_dir`` into
    ``out_dir`` (replaced whole) and return the path of its index.html
    (:func:`build`, whose failed pages are error pages)."""
    return build(results_dir, out_dir).index


def build(results_dir: Path, out_dir: Path, pages: tuple | None = None) -> Built:
    """Build the site for the results dataset under ``results_dir`` into
    ``out_dir`` (replaced whole): its index and the pages that failed.
    ``pages``: the page modules (default ``PAGES``).

    An existing empty ``results_dir`` gives a site whose pages say there is
    no data; a missing one raises FileNotFoundError, one that is not a
    dataset and an ``out_dir`` that cannot be written ValueError, before
    anything is written.
    """
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    check_results(results_dir)
    why = site_refusal(out_dir)
    if why is not None:
        raise FileExistsError(f"--out {why}")
    check_dir("--out", out_dir)  # ConfigError (a ValueError) naming --out
    check_dir(f"--out {out_dir}: its folder", out_dir.parent)
    results = model.load(results_dir)
    now = dt.datetime.now(dt.timezone.utc)
    built = f"built {now:%Y-%m-%d %H:%M} UTC · {len(results.rows)} rows · {len(results.runs)} runs"
    pages, failures = render_pages(results, built, pages)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        (staging / "assets").mkdir()
        shutil.copyfile(plotly_js(), staging / "assets" / "plotly.min.js")
        for name in ("dashboard.css", "dashboard.js"):
            shutil.copyfile(ASSETS / name, staging / "assets" / name)
        for name, text in pages.items():
            (staging / name).write_text(text, encoding="utf-8")
        for row in results.rows:  # the traces the pages link (details-<op>.html)
            trace = model.trace_file(row)
            if trace is not None:
                (staging / model.TRACES_DIR).mkdir(exist_ok=True)
                shutil.copyfile(trace, staging / model.trace_href(row))
        (staging / MARKER).write_text("built by python -m dashboards build; this directory "
                                      "is replaced whole on the next build\n")
        os.chmod(staging, 0o755)
        _swap_in(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Built(out_dir / "index.html", failures)


def _swap_in(staging: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by ``staging`` (the old site is removed after)."""
    old = None
    why = site_refusal(out_dir)
    if why is not None:
        raise FileExistsError(f"--out {why}")
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}-old-{os.getpid()}")
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
