"""Load built pages in Debian's headless chromium and report what rendered.

For the browser tests and the docs' screenshots. Drives ``/usr/bin/chromium``
(or ``$LAMPORT_CHROMIUM``) through playwright (a dev dependency; its own
browser download is never used). ``scripts/setup --dev`` installs chromium.

``python -m dashboards.browser SITE OUTDIR [page.html ...]`` saves a
full-page screenshot of each page (default: every page) to OUTDIR and prints
its console errors; with ``--viewport WxH`` only the first screen, that size.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Headless flags for this project's CPU machines (shared/notes/cpu-machine.md).
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--no-first-run", "--disable-quic", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage")

# What the page reports once dashboard.js has run: every plotly chart's
# traces (name, point count) and whether its SVG exists.
_PROBE = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
  id: gd.id,
  svg: !!gd.querySelector('svg.main-svg'),
  traces: (gd.data || []).map(t => ({name: t.name,
      points: (t.x || t.y || []).length, yaxis: t.yaxis || 'y'}))
}))"""


def find_chromium() -> str | None:
    """The chromium executable: $LAMPORT_CHROMIUM, else chromium on PATH."""
    path = os.environ.get("LAMPORT_CHROMIUM")
    if path:
        return path if os.access(path, os.X_OK) else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageReport:
    url: str
    errors: list[str] = field(default_factory=list)   # console errors, page errors, failed loads
    charts: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    extra: Any = None  # what ``load(..., extra_js=)`` returned

    def chart(self, chart_id: str) -> dict[str, Any]:
        for c in self.charts:
            if c["id"] == chart_id:
                return c
        raise KeyError(f"no chart {chart_id!r}; charts: {[c['id'] for c in self.charts]}")


class Browser:
    """One headless chromium; ``load`` opens a page in a fresh tab."""

    def __init__(self, playwright_browser, width: int = 1400, height: int = 900) -> None:
        self._browser = playwright_browser
        self.width, self.height = width, height

    def load(self, url: str, *, screenshot: Path | None = None, extra_js: str | None = None,
             full_page: bool = True, timeout_ms: int = 30000) -> PageReport:
        report = PageReport(url)
        page = self._browser.new_page(viewport={"width": self.width, "height": self.height})
        page.on("console", lambda m: report.errors.append(f"console.{m.type}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: report.errors.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: report.errors.append(
            f"request failed: {r.url} ({r.failure})"))
        page.on("dialog", lambda d: (report.errors.append(f"dialog: {d.message}"), d.dismiss()))
        try:
            page.goto(url, wait_until="load", timeout=timeout_ms)
            page.wait_for_selector("body[data-ready='1']", timeout=timeout_ms)
            report.title = page.title()
            report.charts = page.evaluate(_PROBE)
            if extra_js is not None:
                report.extra = page.evaluate(extra_js)
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=full_page)
        finally:
            page.close()
        return report

    def evaluate(self, url: str, script: str, *, timeout_ms: int = 30000) -> Any:
        """Load ``url`` and return ``script`` (a JS function) evaluated in it."""
        page = self._browser.new_page(viewport={"width": self.width, "height": self.height})
        try:
            page.goto(url, wait_until="load", timeout=timeout_ms)
            page.wait_for_selector("body[data-ready='1']", timeout=timeout_ms)
            return page.evaluate(script)
        finally:
            page.close()


@contextlib.contextmanager
def open_browser(executable: str | None = None, width: int = 1400) -> Iterator[Browser]:
    """A headless chromium for loading pages; RuntimeError when none is found."""
    executable = executable or find_chromium()
    if executable is None:
        raise RuntimeError("chromium not found (install it: scripts/setup --dev as root, or "
                           "apt-get install chromium; or set LAMPORT_CHROMIUM)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True,
                                    args=list(CHROMIUM_ARGS))
        try:
            yield Browser(browser, width)
        finally:
            browser.close()


def main(argv: list[str]) -> int:
    viewport = None
    if argv[:1] == ["--viewport"] and len(argv) > 1:
        viewport, argv = [int(v) for v in argv[1].split("x")], argv[2:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    site, out = Path(argv[0]).resolve(), Path(argv[1])
    names = argv[2:] or sorted(p.name for p in site.glob("*.html"))
    with open_browser(width=viewport[0] if viewport else 1400) as browser:
        if viewport:
            browser.height = viewport[1]
        for name in names:
            report = browser.load((site / name).as_uri(), screenshot=out / f"{Path(name).stem}.png",
                                  full_page=viewport is None)
            print(f"{name}: {len(report.charts)} chart(s), {len(report.errors)} error(s)"
                  + "".join(f"\n  {e}" for e in report.errors))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
