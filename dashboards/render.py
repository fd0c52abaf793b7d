"""Render the main dashboard panels from Prometheus data into one PNG (for the sweep report).

This module owns turning panel specs into matplotlib line charts: it runs each panel's queries
as range queries (through an injected ``query_range`` callable, or over HTTP with
``http_query_range``), fills in the legends, and writes the figure atomically.  It uses the same
PromQL as the Grafana dashboards, so the PNG and the dashboards cannot disagree.  It does not start
Prometheus and does not know about sweeps.

    python -m dashboards.render --prometheus http://127.0.0.1:9090 --minutes 15 --out panels.png
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from dashboards.flavours import FLAVOURS, RANGE_WINDOW, RATE_WINDOW, Flavour
from dashboards.panels import PanelSpec
from dashboards.serving import serving_dashboard
from dashboards.speculative import speculative_dashboard
from dashboards.promql import substitute
from spectest import files

# (start, end, step) → [{"metric": {...}, "values": [(t, v), ...]}]
QueryRange = Callable[[str, float, float, float], list[dict]]

MAIN_PANELS = ("Acceptance rate", "Mean accepted length", "Per-position acceptance",
               "Draft vs accepted tokens/s", "Time to first token", "Time per output token",
               "Tokens/s", "Running and waiting requests")


def http_query_range(base_url: str, timeout: float = 30) -> QueryRange:
    """A ``QueryRange`` that calls ``/api/v1/query_range`` of the Prometheus at ``base_url``."""
    def query_range(expr: str, start: float, end: float, step: float) -> list[dict]:
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        try:
            with urllib.request.urlopen(f"{base_url}/api/v1/query_range?{params}",
                                        timeout=timeout) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            raise ValueError(f"{body.get('errorType')}: {body.get('error')} — in {expr}")
        return [{"metric": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]}
                for r in body["data"]["result"]]
    return query_range


def main_panels(f: Flavour) -> list[PanelSpec]:
    """The first timeseries panel with each MAIN_PANELS title the flavour has, in that order."""
    by_title: dict[str, PanelSpec] = {}
    for board in (speculative_dashboard(f), serving_dashboard(f)):
        for row in board.rows:
            for p in row.panels:
                if p.kind == "timeseries":
                    by_title.setdefault(p.title, p)
    return [by_title[t] for t in MAIN_PANELS if t in by_title]


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def render_panels(query_range: QueryRange, out: Path, start: float, end: float,
                  flavour: Flavour, rate_window: str = "1m", title: str = "") -> dict[str, int]:
    """Draw ``main_panels(flavour)`` over [start, end] into ``out``; series drawn per panel."""
    values = {label: ".*" for label in flavour.variables}
    values |= {RATE_WINDOW.lstrip("$"): rate_window, RANGE_WINDOW.lstrip("$"): rate_window}
    step = max(1.0, (end - start) / 200)
    panels = main_panels(flavour)
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6 * cols, 3.2 * rows), layout="constrained")
    drawn = {}
    for i, p in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.set_title(p.title, fontsize=10)
        drawn[p.title] = 0
        for q in p.queries:
            for series in query_range(substitute(q.expr, values), start, end, step):
                pts = [(t - start, v) for t, v in series["values"] if math.isfinite(v)]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, linewidth=1, label=_legend(q.legend, series["metric"]))
                    drawn[p.title] += 1
        if p.unit == "percentunit":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        elif p.unit == "s":
            ax.set_ylabel("seconds", fontsize=8)
        ax.set_xlabel("seconds since start", fontsize=8)
        ax.tick_params(labelsize=7)
        if drawn[p.title]:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    files.write_atomic(out, png.getvalue())
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.render",
                                     description="Render the main panels into a PNG.")
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=15, help="time range ending now")
    parser.add_argument("--flavour", choices=[f.key for f in FLAVOURS], default="spectest")
    parser.add_argument("--rate-window", default="1m", help="stands in for $__rate_interval")
    parser.add_argument("--out", type=Path, required=True, help="PNG file to write")
    args = parser.parse_args(argv)
    if not args.out.parent.is_dir():
        print(f"error: directory of --out does not exist: {args.out.parent}", file=sys.stderr)
        return 2
    end = time.time()
    flavour = next(f for f in FLAVOURS if f.key == args.flavour)
    try:
        drawn = render_panels(http_query_range(args.prometheus), args.out,
                              end - 60 * args.minutes, end, flavour, args.rate_window)
    except (OSError, ValueError) as err:
        print(f"error: cannot query {args.prometheus}: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {sum(drawn.values())} series in {len(drawn)} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
