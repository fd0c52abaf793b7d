"""Render the dashboard specs to Grafana JSON with grafana-foundation-sdk, write or check them.

This module owns the Grafana side: template variables (a ``datasource`` variable plus one
multi-value variable per label the flavour filters on), panel layout and options, the JSON files
under ``dashboards/`` and the drift check.  What the panels show lives in ``dashboards.speculative``
and ``dashboards.serving``; which metrics and labels a server has in ``spectest.flavours`` (read
through ``dashboards.flavours``).  Every flavour with dashboard variables gets both dashboards.

    python -m dashboards.build                 # regenerate dashboards/*.json
    python -m dashboards.build --check         # exit 1 if the committed JSON is stale
    python -m dashboards.build --out-dir DIR   # write (or check) somewhere else

``build_dashboards()`` is the library entry point (``{file name: dashboard JSON}``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders.common import (GraphThresholdsStyleConfig,
                                                    ReduceDataOptions, StackingConfig,
                                                    VizLegendOptions, VizTooltipOptions)
from grafana_foundation_sdk.builders.dashboard import (DatasourceVariable, Dashboard,
                                                       QueryVariable, Row, ThresholdsConfig)
from grafana_foundation_sdk.builders.prometheus import Dataquery as PromQuery
from grafana_foundation_sdk.builders.stat import Panel as StatPanel
from grafana_foundation_sdk.builders.text import Panel as TextPanel
from grafana_foundation_sdk.builders.timeseries import Panel as TimeseriesPanel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, text
from grafana_foundation_sdk.models.dashboard import (DashboardCursorSync, DataSourceRef,
                                                     Threshold, ThresholdsMode, VariableOption,
                                                     VariableRefresh, VariableSort)

from dashboards.flavours import FLAVOURS, Flavour
from dashboards.panels import DashboardSpec, PanelSpec
from dashboards.serving import serving_dashboard
from dashboards.speculative import speculative_dashboard
from spectest import files

HERE = Path(__file__).resolve().parent
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
PANEL_HEIGHT = {"timeseries": 8, "stat": 4, "text": 5}


def _thresholds(p: PanelSpec) -> ThresholdsConfig:
    steps = p.steps or ((None, "green"),)
    return (ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=v, color=c) for v, c in steps]))


def _panel(p: PanelSpec):
    if p.kind == "text":
        return (TextPanel().title(p.title).description(p.description)
                .mode(text.TextMode.MARKDOWN).content(p.content).span(p.width)
                .height(PANEL_HEIGHT[p.kind]))
    if p.kind == "stat":
        panel = (StatPanel().graph_mode(common.BigValueGraphMode.NONE)
                 .color_mode(common.BigValueColorMode.VALUE)
                 .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    elif p.kind == "timeseries":
        panel = (TimeseriesPanel().fill_opacity(10 if p.stacked else 0).line_width(1)
                 .legend(VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                         .placement(common.LegendPlacement.BOTTOM).show_legend(True))
                 .tooltip(VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                          .sort(common.SortOrder.DESCENDING)))
        if p.stacked:
            panel = panel.stacking(StackingConfig().mode(common.StackingMode.NORMAL))
        if p.steps:
            panel = panel.thresholds_style(
                GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED))
    else:
        raise ValueError(f"unknown panel kind {p.kind!r} for {p.title!r}")
    panel = (panel.title(p.title).description(p.description).datasource(DATASOURCE)
             .unit(p.unit).span(p.width).height(PANEL_HEIGHT[p.kind]).thresholds(_thresholds(p)))
    if p.min is not None:
        panel = panel.min(p.min)
    if p.max is not None:
        panel = panel.max(p.max)
    for i, q in enumerate(p.queries):
        target = PromQuery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        target = target.instant() if p.kind == "stat" else target.range()
        panel = panel.with_target(target.legend_format(q.legend or "__auto"))
    return panel


def _variables(f: Flavour) -> list:
    out = [DatasourceVariable("datasource").label("Data source").type("prometheus")
           .description("Prometheus that scrapes the engine's /metrics.")]
    for label in f.variables:
        out.append(QueryVariable(label).label(label).datasource(DATASOURCE)
                   .query(f.variable_query(label)).description(f"Filter on the {label} label.")
                   .multi(True).include_all(True).all_value(".*")
                   .current(VariableOption(selected=True, text="All", value="$__all"))
                   .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                   .sort(VariableSort.ALPHABETICAL_ASC))
    return out


def render(spec: DashboardSpec, f: Flavour) -> dict:
    """One dashboard as the JSON model Grafana imports."""
    board = (Dashboard(spec.title).uid(spec.uid).description(spec.description)
             .tags(list(spec.tags)).editable().tooltip(DashboardCursorSync.CROSSHAIR)
             .time("now-1h", "now").refresh("30s").timezone("browser")
             .variables(_variables(f)))
    next_id = 1
    for row in spec.rows:
        board = board.with_row(Row(row.title).id(next_id))
        next_id += 1
        for p in row.panels:
            board = board.with_panel(_panel(p).id(next_id))
            next_id += 1
    return json.loads(JSONEncoder(sort_keys=True).encode(board.build()))


def build_dashboards() -> dict[str, dict]:
    """Every dashboard of every flavour, keyed by the file name it is committed under."""
    out = {}
    for f in FLAVOURS:
        for spec in (speculative_dashboard(f), serving_dashboard(f)):
            out[f"{spec.uid}.json"] = render(spec, f)
    return out


def serialise(board: dict) -> str:
    return json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def drift(out_dir: Path, boards: dict[str, dict]) -> list[str]:
    """Human-readable differences between ``out_dir`` and the builder's output; [] if none."""
    return files.drift(out_dir, {n: serialise(b) for n, b in boards.items()}, "*.json",
                       producer="the builder")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=HERE,
                        help="directory of the dashboard JSON files (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the files differ from the builder's")
    args = parser.parse_args(argv)
    if not args.out_dir.is_dir():  # before building: a typo costs no rendering time
        print(f"error: --out-dir {args.out_dir} is not a directory", file=sys.stderr)
        return 2
    boards = {name: serialise(board) for name, board in build_dashboards().items()}
    return files.write_or_check(args.out_dir, boards, args.check, label="dashboards",
                                stale_glob="*.json", producer="the builder",
                                regenerate="python -m dashboards.build")


if __name__ == "__main__":
    sys.exit(main())
