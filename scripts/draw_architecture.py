"""Draw docs/img/architecture.svg: the data path from a suite to a page.

    python3 scripts/draw_architecture.py            # (re)write the picture
    python3 scripts/draw_architecture.py --check    # exit 1 if it is out of date
    python3 scripts/draw_architecture.py --out FILE # write it elsewhere

Pure Python writing SVG text (no dependency, no fonts read): the output is
a function of ``STAGES``, ``FANOUT`` and ``LAYERS`` below alone, byte for
byte the same on every machine, so tests/test_architecture_picture.py
regenerates it and compares it with the committed file. Change the path
here, never by hand in the SVG. Every module a box names must exist (the
test checks that too), so the picture stays true of the tree.

Text is set in a monospace font and boxes are sized from the longest line
(``CHAR_W`` per character), so no label overflows its box whatever the
viewer's font.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("docs/img/architecture.svg")


@dataclass(frozen=True)
class Stage:
    """One box of the data path: what flows there, the layer that owns it
    (a key of ``LAYERS``) and the repo paths that implement it."""
    title: str
    layer: str
    lines: tuple[str, ...]
    paths: tuple[str, ...]


LAYERS = {
    "kernels": ("kernels/", "#fde7c8", "#b36b00"),
    "cluster": ("cluster/", "#d8e8f8", "#2463a6"),
    "jobs": ("jobs/", "#dcefd9", "#2f7a2a"),
    "dashboards": ("dashboards/", "#eadff4", "#6b3fa0"),
}
"""Layer -> (folder, fill, stroke). Layers import only downward (kernels <-
cluster <- jobs <- dashboards; tests/test_layering.py)."""

STAGES = (
    Stage("suite TOML", "jobs", ("jobs/suites/*.toml", "--suite / --config,", "filters: --ops --tp ..."),
          ("jobs/suites", "jobs/config.py")),
    Stage("cases", "jobs", ("jobs/config.py: Case per", "op x tp x hidden x M x", "inputs / fault",
                            "cluster/ops/: the op registry"),
          ("jobs/config.py", "cluster/ops")),
    Stage("plan", "jobs", ("jobs/session.py: backend,", "jobs/cluster_view.py:", "placement per case",
                           "cluster/topology.py: groups", "cluster/fanout.py: at once"),
          ("jobs/session.py", "jobs/cluster_view.py", "cluster/topology.py", "cluster/fanout.py")),
    Stage("rank workers", "cluster", ("cluster/pool.py: warm workers", "cluster/group.py: TP groups",
                                      "cluster/actors.py: one a rank", "cluster/emulated/ | gpu/"),
          ("cluster/pool.py", "cluster/group.py", "cluster/actors.py", "cluster/emulated",
           "cluster/gpu")),
    Stage("rows", "jobs", ("jobs/recorder.py: one row", "per case as it ends,", "failing: repro command",
                           "jobs/results/schema.py"),
          ("jobs/recorder.py", "jobs/results/schema.py")),
    Stage("Arrow store", "jobs", ("jobs/results/store.py:", "date=/suite=/ Parquet", "_runs/ manifests",
                                  "compaction, lock"),
          ("jobs/results/store.py", "jobs/results/runs.py", "jobs/results/compaction.py",
           "jobs/results/lock.py")),
)
"""The path, in order: the first four on the top row, the rest below."""

FANOUT = (
    Stage("report", "jobs", ("jobs/report.py: a run,", "or two compared"), ("jobs/report.py",)),
    Stage("regression", "jobs", ("jobs/regression.py:", "Conbench's rule"), ("jobs/regression.py",)),
    Stage("pages", "dashboards", ("dashboards/build.py", "dashboards/pages/"),
          ("dashboards/build.py", "dashboards/pages")),
)
"""What reads the store: each an arrow from the last stage."""

KERNELS = Stage("kernels", "kernels", ("kernels/lamport/: protocol, kernels,", "mailbox, diagnosis",
                                       "kernels/reference/: torch references"),
                ("kernels/lamport", "kernels/reference"))
"""Below the rank workers: what every rank runs."""

FONT = 12
CHAR_W = 7.2
"""Advance of one monospace character at FONT px (0.6 em)."""
LINE_H = 16
PAD = 10
GAP = 46
MARGIN = 20


def box_size(stage: Stage) -> tuple[int, int]:
    chars = max(len(stage.title), *(len(line) for line in stage.lines))
    return round(chars * CHAR_W + 2 * PAD), (1 + len(stage.lines)) * LINE_H + 2 * PAD + 4


def rect(x: float, y: float, stage: Stage, w: int, h: int) -> list[str]:
    _, fill, stroke = LAYERS[stage.layer]
    out = [f'<rect x="{x:.0f}" y="{y:.0f}" width="{w}" height="{h}" rx="6" fill="{fill}" '
           f'stroke="{stroke}" stroke-width="1.5"/>',
           f'<text x="{x + PAD:.0f}" y="{y + PAD + FONT:.0f}" font-weight="bold" '
           f'fill="{stroke}">{escape(stage.title)}</text>']
    for i, line in enumerate(stage.lines):
        out.append(f'<text x="{x + PAD:.0f}" y="{y + PAD + FONT + (i + 1) * LINE_H + 4:.0f}">'
                   f'{escape(line)}</text>')
    return out


def arrow(x1: float, y1: float, x2: float, y2: float, dashed: bool = False) -> str:
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    return (f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="#444" '
            f'stroke-width="1.5" marker-end="url(#head)"{dash}/>')


def render() -> str:
    """The SVG text (deterministic: a function of the tables above)."""
    sizes = [box_size(s) for s in (*STAGES, *FANOUT, KERNELS)]
    w = max(s[0] for s in sizes)
    h = max(s[1] for s in sizes)
    top, bottom = STAGES[:4], STAGES[4:]
    body: list[str] = []
    # Top row, left to right: suite -> cases -> plan -> rank workers.
    y1 = MARGIN + 30
    xs = [MARGIN + i * (w + GAP) for i in range(len(top))]
    for i, (x, stage) in enumerate(zip(xs, top)):
        body += rect(x, y1, stage, w, h)
        if i:
            body.append(arrow(xs[i - 1] + w, y1 + h / 2, x - 4, y1 + h / 2))
    # Under the rank workers: the kernels they run.
    kx, ky = xs[-1], y1 + h + GAP
    body += rect(kx, ky, KERNELS, w, h)
    body.append(arrow(kx + w / 2, y1 + h, kx + w / 2, ky - 4, dashed=True))
    body.append(f'<text x="{kx + w / 2 + 6:.0f}" y="{y1 + h + GAP / 2 + 4:.0f}" '
                f'font-style="italic">runs</text>')
    # Second row, left to right under the first three: rows -> store -> readers.
    y2 = ky
    rows_x = [xs[0], xs[1]]
    (ax, ay), (bx, by) = (kx, y1 + h * 0.85), (rows_x[0] + w / 2, y2 - 4)
    body.append(arrow(ax, ay, bx, by))
    lx = xs[2] + w / 2  # the label sits under the line, half-way along the plan column
    body.append(f'<text x="{lx:.0f}" y="{ay + (by - ay) * (ax - lx) / (ax - bx) + 18:.0f}" '
                f'font-style="italic" text-anchor="middle">results, per case</text>')
    for i, (x, stage) in enumerate(zip(rows_x, bottom)):
        body += rect(x, y2, stage, w, h)
        if i:
            body.append(arrow(rows_x[i - 1] + w, y2 + h / 2, x - 4, y2 + h / 2))
    # Readers of the store: stacked under the store and the plan column.
    fy = y2 + h + GAP
    fan_x = [xs[0], xs[1], xs[2]]
    store_x = rows_x[-1]
    for x, stage in zip(fan_x, FANOUT):
        body += rect(x, fy, stage, w, h)
        body.append(arrow(store_x + w / 2, y2 + h, x + w / 2, fy - 4))
    # Legend: one swatch a layer.
    ly = fy + h + GAP / 2
    lx = MARGIN
    for name, (folder, fill, stroke) in LAYERS.items():
        body.append(f'<rect x="{lx}" y="{ly:.0f}" width="14" height="14" fill="{fill}" '
                    f'stroke="{stroke}"/>')
        body.append(f'<text x="{lx + 20}" y="{ly + 12:.0f}">{escape(folder)}</text>')
        lx += round((len(folder) + 4) * CHAR_W + 20)
    body.append(f'<text x="{lx + 10}" y="{ly + 12:.0f}">layers import only downward: '
                f'kernels &lt;- cluster &lt;- jobs &lt;- dashboards</text>')
    width = max(MARGIN + len(top) * (w + GAP) - GAP + MARGIN,
                round(lx + 10 + 70 * CHAR_W + MARGIN))
    height = round(ly + 14 + MARGIN)
    head = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<!-- Generated by scripts/draw_architecture.py; edit that script, not this file. -->',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" '
        f'font-size="{FONT}" fill="#222">',
        '<defs><marker id="head" markerWidth="8" markerHeight="8" refX="7" refY="4" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#444"/></marker></defs>',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{MARGIN}" y="{MARGIN + 8}" font-size="{FONT + 2}" font-weight="bold">'
        'lamport-lab: from a suite to a row and a page</text>',
    ]
    return "\n".join(head + body + ["</svg>", ""])


def cited_paths() -> list[str]:
    """Every repo path a box names (the test checks each exists)."""
    return [p for s in (*STAGES, *FANOUT, KERNELS) for p in s.paths]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/draw_architecture.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / OUT, help=f"where to write (default {OUT})")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the file differs from what this script draws")
    args = p.parse_args(argv)
    svg = render()
    if args.check:
        current = args.out.read_text() if args.out.is_file() else None
        if current != svg:
            print(f"{args.out} is out of date: run python3 scripts/draw_architecture.py",
                  file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(svg)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
