"""Build the static site: ``build_site(results_dir, out_dir) -> index path``.

The site opens from disk (file://) or any web server with no internet:
plotly.js is copied once from the installed plotly package into
``SITE/assets/plotly.min.js`` and every page refers to it relatively. Pages
are written to a temporary folder beside ``out_dir`` and swapped in at the
end, so a failed build leaves the previous site whole.

A built site holds the marker file ``MARKER``; an existing ``out_dir`` is
replaced only when it holds that marker (a site this builder made) or is an
empty directory. Anything else, an ``index.html`` of someone else's
included, is refused with FileExistsError and left untouched.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from pathlib import Path

from dashboards import model
from dashboards.pages import (Site, compare, correctness, environment, faults, latency,
                              overview, stragglers, trends)
from dashboards.regression import judge_all
from jobs.outputs import SITE_MARKER, site_refusal

ASSETS = Path(__file__).with_name("assets")
MARKER = SITE_MARKER
"""The file that marks a directory as a site this builder made (its name
and the rule for replacing a site live in jobs.outputs, which the nightly
checks before it starts)."""
PAGES = (overview, trends, latency, correctness, faults, stragglers, environment, compare)


def plotly_js() -> Path:
    """The plotly.min.js bundled in the installed plotly package."""
    import plotly
    path = Path(plotly.__file__).with_name("package_data") / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the plotly package (plotly>=5.20) ships "
                                "plotly.min.js there; reinstall plotly")
    return path


def render_pages(results: model.Results, built: str) -> dict[str, str]:
    """Every page of the site as {file name: html}."""
    site = Site(results, judge_all(results), built)
    pages: dict[str, str] = {}
    for module in PAGES:
        pages.update(module.render(site))
    return pages


def build_site(results_dir: Path, out_dir: Path) -> Path:
    """Build the site for the results dataset under ``results_dir`` into
    ``out_dir`` (replaced whole) and return the path of its index.html.

    An existing ``results_dir`` without rows gives a site whose pages say
    there is no data; a missing one raises FileNotFoundError.
    """
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    results = model.load(results_dir)
    now = dt.datetime.now(dt.timezone.utc)
    built = f"built {now:%Y-%m-%d %H:%M} UTC · {len(results.rows)} rows · {len(results.runs)} runs"
    pages = render_pages(results, built)
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
    return out_dir / "index.html"


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
