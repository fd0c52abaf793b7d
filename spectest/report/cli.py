"""``spectest report DIR`` and ``spectest compare DIR_A DIR_B``: command lines over the renderers.

Two pairs for ``spectest.cli`` to wire in: ``add_report_arguments`` / ``report_main`` and
``add_compare_arguments`` / ``compare_main``. A folder that is not a sweep, or an unreadable
one, prints one line and exits 2. ``report`` renders whatever steps a folder holds, so an
interrupted sweep renders too (its status says so); SLO flags re-judge the steps against other
objectives without re-running anything. ``add_analysis_arguments`` (the minimum of requests per
step, prices and target load) is shared with ``spectest sweep``; ``analysis_options`` checks
them (one readable line on bad input).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spectest.report.cost import CostInputs
from spectest.report.evidence import MIN_REQUESTS_PER_STEP
from spectest.report.table import SLO, SweepError, load_sweep


def add_analysis_arguments(p, defaults: bool = False) -> None:
    """``--min-requests-per-step``, prices and target load. ``defaults``: show the default
    (``spectest sweep``); else unset flags keep what the sweep ran with."""
    keep = " (default: what the sweep ran with)" if not defaults else ""
    p.add_argument("--min-requests-per-step", type=int, default=None,
                   help=f"successful requests per arm and step below which no speedup, "
                        f"crossover, knee or cost is stated (default {MIN_REQUESTS_PER_STEP})")
    p.add_argument("--price-per-hour", type=float, default=None,
                   help="price of one replica (the measured server) per hour, for cost per 1M "
                        "output tokens" + keep)
    p.add_argument("--spec-price-per-hour", type=float, default=None,
                   help="price per hour with speculation on, when it needs a bigger instance "
                        "(default: --price-per-hour)")
    p.add_argument("--target-rps", type=float, default=None,
                   help="load to plan replicas for, in SLO-meeting requests/s" + keep)
    p.add_argument("--target-output-tps", type=float, default=None,
                   help="load to plan replicas for, in SLO-meeting output tokens/s" + keep)


def analysis_options(args) -> tuple[int | None, CostInputs | None]:
    """(min requests or None, cost inputs or None) from the flags; SweepError when invalid."""
    m = getattr(args, "min_requests_per_step", None)
    if m is not None and m < 1:
        raise SweepError("--min-requests-per-step must be at least 1")
    names = ("price_per_hour", "spec_price_per_hour", "target_rps", "target_output_tps")
    vals = {k: getattr(args, k, None) for k in names}
    for k, v in vals.items():
        if v is not None and not v > 0:
            raise SweepError(f"--{k.replace('_', '-')} must be positive")
    if vals["spec_price_per_hour"] is not None and vals["price_per_hour"] is None:
        raise SweepError("--spec-price-per-hour needs --price-per-hour (the baseline's price)")
    if vals["target_rps"] is not None and vals["target_output_tps"] is not None:
        raise SweepError("give --target-rps or --target-output-tps, not both")
    cost = CostInputs(**vals) if any(v is not None for v in vals.values()) else None
    return m, cost


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path, help="a sweep folder (the --out of spectest sweep)")
    p.add_argument("--out", type=Path, default=None, help="write here (default: the folder)")
    p.add_argument("--slo-ttft-ms", type=float, default=None,
                   help="judge steps against this TTFT p99 instead of the sweep's")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="… TPOT p99")
    p.add_argument("--slo-e2el-ms", type=float, default=None,
                   help="… E2EL p99 (goodput keeps the per-request SLOs the sweep ran with)")
    p.add_argument("--network-ms", type=float, default=None,
                   help="K advice as if every draft round paid this network time (plan a "
                        "disaggregated drafter from a co-located sweep; default: the measured "
                        "network term, none when the draft is co-located)")
    add_analysis_arguments(p)


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder_a", type=Path, help="the earlier sweep (A)")
    p.add_argument("folder_b", type=Path, help="the later sweep (B)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: spectest-compare-A-vs-B)")
    add_analysis_arguments(p)


def _slo(args, base: SLO) -> SLO | None:
    new = {k: getattr(args, f"slo_{k.split('_p99')[0]}_ms") for k in
           ("ttft_p99_ms", "tpot_p99_ms", "e2el_p99_ms")}
    if all(v is None for v in new.values()):
        return None
    for k, v in new.items():
        if v is not None and v <= 0:
            raise SweepError(f"--slo-{k.split('_p99')[0]}-ms must be positive")
    merged = {**base.to_json(), **{k: v for k, v in new.items() if v is not None}}
    return SLO.from_json(merged)


def report_main(args: argparse.Namespace) -> int:
    from spectest.report.render import render_report, summary_lines
    try:
        sweep = load_sweep(args.folder)
        slo = _slo(args, sweep.slo)
        m, cost = analysis_options(args)
        if args.network_ms is not None and args.network_ms < 0:
            raise SweepError("--network-ms must be at least 0")
        out = render_report(args.folder, args.out, slo, m, cost, args.network_ms)
    except SweepError as e:
        print(f"spectest report: {e}", file=sys.stderr)
        return 2
    status = sweep.info.get("status", "unknown")
    if status != "finished":
        print(f"note: this sweep's status is {status!r}; the report shows its "
              f"{len(sweep.table)} finished steps")
    for line in summary_lines(args.folder, slo, m, cost, sweep=sweep):
        print(line)
    print(f"report: {out.html}  (Markdown: {out.markdown})")
    return 0


def compare_main(args: argparse.Namespace) -> int:
    from spectest.report.compare import compare
    out = args.out or Path(f"spectest-compare-{args.folder_a.resolve().name}-vs-"
                           f"{args.folder_b.resolve().name}")
    try:
        m, cost = analysis_options(args)
        result = compare(args.folder_a, args.folder_b, out, m, cost)
    except SweepError as e:
        print(f"spectest compare: {e}", file=sys.stderr)
        return 2
    for line in result.lines:
        print(line)
    print(f"comparison: {result.html}  (Markdown: {result.markdown})")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="spectest")
    sub = parser.add_subparsers(dest="command", required=True)
    add_report_arguments(sub.add_parser("report"))
    add_compare_arguments(sub.add_parser("compare"))
    ns = parser.parse_args()
    sys.exit(report_main(ns) if ns.command == "report" else compare_main(ns))
