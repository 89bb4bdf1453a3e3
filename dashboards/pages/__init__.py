"""One module per page; each has ``render(site) -> {file name: html}``.

``Site`` carries what every page needs: the results, the regression verdict
of every row and the build stamp.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards import html as h
from dashboards.model import Results, Row, case_label, slug
from dashboards.regression import Verdict


@dataclass
class Site:
    results: Results
    verdicts: dict[int, Verdict]
    built: str

    def page(self, title: str, current: str, body, *, charts: bool = False,
             subtitle=None) -> str:
        return h.page(title, current, body, built=self.built, charts=charts, subtitle=subtitle)

    def status(self, row: Row) -> str:
        return self.verdicts[row["_index"]].status


def details_href(row: Row) -> str:
    """Link to the row's line on its op's details page."""
    return f"details-{slug(row['op'])}.html#r{row['_index']}"


def trend_href(row: Row) -> str:
    return f"trends-{slug(row['op'])}.html#{row['_case']}"


def run_label(run) -> str:
    return f"{run.run_id} ({run.trigger}, {h.fmt(run.started_at)})"


def no_results(site: Site) -> h.Markup:
    return h.no_data(f"no results rows under {site.results.root}: run a job with "
                     f"--results {site.results.root} first.")


__all__ = ["Site", "case_label", "details_href", "no_results", "run_label", "trend_href"]
