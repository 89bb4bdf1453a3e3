"""The perf team's pages: a static site built from the Arrow results.

``python -m dashboards build --results DIR --out SITE`` or
``dashboards.build.build_site(results_dir, out_dir) -> index path``;
``python -m dashboards serve`` for a quick local look. Reads only the rows
(``jobs.results``); the regression rule is ``jobs.regression``'s. See
docs/dashboard.md.
"""
