"""environment.html: per run, the machines and versions it ran on; a value that
changed since the run before is highlighted."""

from __future__ import annotations

from dashboards import html as h
from dashboards.model import ENV_FIELDS
from dashboards.pages import Site, no_results

MAX_RUNS = 60
NOT_FLAGGED = ("git_commit",)  # changes every run; not worth a highlight
LABELS = {"gpu_model": "GPU", "gpu_count": "GPUs/node", "multicast_supported": "multicast",
          "cute_dsl": "CuTe DSL", "git_commit": "commit", "hostname": "hosts"}


def env_text(values: list, field: str) -> str:
    if not values:
        return "—"
    if field == "git_commit":
        return ", ".join(str(v)[:12] for v in values)
    if field == "topology":
        return "; ".join(h.topology_brief(v) for v in values)
    return ", ".join(h.fmt(v) for v in values)


def render(site: Site) -> dict[str, str]:
    runs = site.results.runs[:MAX_RUNS]
    if not runs:
        return {"environment.html": site.page("Environment", "environment.html",
                                              no_results(site))}
    texts = [{f: env_text(run.env()[f], f) for f in ENV_FIELDS} for run in runs]
    rows, ids = [], []
    for i, run in enumerate(runs):
        older = texts[i + 1] if i + 1 < len(runs) else None
        cells = [h.tag("code", run.run_id, cls="run"), run.trigger, h.fmt(run.started_at)]
        for f in ENV_FIELDS:
            changed = older is not None and older[f] != texts[i][f] and f not in NOT_FLAGGED
            shown = (h.join([h.topology(v) for v in run.env()[f]] or ["—"])
                     if f == "topology" else texts[i][f])
            cells.append(h.tag("span", shown, cls="changed-value" if changed else None,
                               title="changed since the run before" if changed else None))
        rows.append(cells)
        ids.append(f"run-{run.run_id}")
    table = h.table(["run", "trigger", "started", *(LABELS.get(f, f) for f in ENV_FIELDS)],
                    rows, row_ids=ids, cls="compact env", id="environment")
    missing = [f for f in ENV_FIELDS if all(t[f] == "—" for t in texts)]
    note = "Highlighted: changed since the run below it (commits excepted). Several values: the run's hosts differed."
    if missing:
        note += f" Not recorded by any run: {', '.join(LABELS.get(f, f) for f in missing)}."
    body = h.section(f"Runs ({len(runs)})", table, note=note)
    return {"environment.html": site.page("Environment", "environment.html", body)}
