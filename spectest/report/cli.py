"""``spectest report DIR`` and ``spectest compare DIR_A DIR_B``: command lines over the renderers.

Two pairs for ``spectest.cli`` to wire in: ``add_report_arguments`` / ``report_main`` and
``add_compare_arguments`` / ``compare_main``. A folder that is not a sweep, or an unreadable
one, prints one line and exits 2. ``report`` renders whatever steps a folder holds, so an
interrupted sweep renders too (its status says so); SLO flags re-judge the steps against other
objectives without re-running anything. ``add_analysis_arguments`` (the minimum of requests per
step, prices and target load) is shared with ``spectest sweep``; ``analysis_options`` checks
them (one readable line on bad input).

Peer runs: ``spectest report --spec DIR… --baseline DIR… [--out OUT]`` reads result folders of
NVIDIA AIPerf or GuideLLM (detected from their files; ``peers``) as the two arms, writes the
converted table into OUT as ``steps.csv`` + ``sweep.json`` (so OUT is a sweep folder that
``report`` re-renders and ``compare`` takes) and renders it there. ``spectest compare`` takes a
side as a folder or as ``--a-spec/--a-baseline`` (``--b-…``) peer runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spectest.report.cost import CostInputs
from spectest.report.evidence import MIN_REQUESTS_PER_STEP
from spectest.report.schedule import OBJECTIVES, MixError, parse_mix
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
    p.add_argument("--objective", choices=OBJECTIVES, default=None,
                   help="what the advised speculation schedule follows: the TPOT crossover, "
                        "the throughput crossover, or both — off where either says "
                        "speculation stops paying (default: both)" + keep)
    p.add_argument("--mix", default=None, metavar="WORKLOAD=WEIGHT,…",
                   help="your traffic mix, e.g. chat=0.6,code=0.3,rag=0.1: the report also "
                        "advises one schedule for it (default: equal weights)" + keep)
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="the candidate vLLM server's --speculative-config, so the advice "
                        "prints the whole value with the schedule in it" + keep)


def advice_options(args, workloads: list[str] | None = None) -> dict:
    """The advice's options from the flags (only those given); SweepError when invalid."""
    import json

    out: dict = {}
    if getattr(args, "objective", None):
        out["objective"] = args.objective
    if getattr(args, "mix", None):
        try:
            parse_mix(args.mix, workloads)
        except MixError as e:
            raise SweepError(str(e)) from None
        out["mix"] = args.mix
    text = getattr(args, "speculative_config", None)
    if text:
        try:
            if not isinstance(json.loads(text), dict):
                raise ValueError
        except ValueError:
            raise SweepError("--speculative-config must be a JSON object, as given to "
                             "vLLM") from None
        out["speculative_config"] = text
    return out


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


def add_peer_arguments(p, prefix: str = "", side: str = "") -> None:
    """``--spec DIR…`` / ``--baseline DIR…`` (``--a-spec`` … with a prefix) and the options of
    peer runs."""
    dest = prefix.replace("-", "_")
    p.add_argument(f"--{prefix}spec", dest=f"{dest}spec", type=Path, nargs="+", default=None,
                   metavar="DIR", help=f"{side}AIPerf or GuideLLM result folder(s) of the "
                                       f"speculative server, one run per concurrency or the "
                                       f"tool's own sweep (format detected from the files)")
    p.add_argument(f"--{prefix}baseline", dest=f"{dest}baseline", type=Path, nargs="+",
                   default=None, metavar="DIR",
                   help=f"{side}… of the plain (speculation-free) server")
    if prefix:
        return
    p.add_argument("--peer", choices=("aiperf", "guidellm"), default=None,
                   help="with --spec/--baseline: insist on this tool's format (default: detect)")
    p.add_argument("--workload", default=None,
                   help="with --spec/--baseline: the workload's name in the report (default: "
                        "from the runs' inputs, e.g. synthetic-isl64-osl64)")
    p.add_argument("--label", default=None,
                   help="with --spec/--baseline: the report's title (default: the tools)")


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path, nargs="?", default=None,
                   help="a sweep folder (the --out of spectest sweep); or give peer runs with "
                        "--spec and --baseline instead")
    p.add_argument("--out", type=Path, default=None,
                   help="write here (default: the folder; with --spec/--baseline: "
                        "spectest-report-SPEC-vs-BASELINE)")
    add_peer_arguments(p)
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
    p.add_argument("folders", type=Path, nargs="*", metavar="FOLDER",
                   help="the earlier sweep (A) and the later one (B); a side given as peer "
                        "runs (--a-spec/--a-baseline, --b-spec/--b-baseline) takes no folder")
    add_peer_arguments(p, "a-", "side A: ")
    add_peer_arguments(p, "b-", "side B: ")
    for name in ("ttft", "tpot", "e2el"):
        p.add_argument(f"--slo-{name}-ms", type=float, default=None,
                       help=f"{name.upper()} objective (p99, and per request for goodput) of a "
                            f"side given as peer runs (a sweep keeps its own)")
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
    if getattr(args, "spec", None) or getattr(args, "baseline", None):
        return _peer_report(args)
    try:
        if args.folder is None:
            raise SweepError("give a sweep folder, or peer runs with --spec DIR… and "
                             "--baseline DIR…")
        sweep = _load_or_explain(args.folder)
        slo = _slo(args, sweep.slo)
        m, cost = analysis_options(args)
        if args.network_ms is not None and args.network_ms < 0:
            raise SweepError("--network-ms must be at least 0")
        advice = advice_options(args, sweep.workloads)
        out = render_report(args.folder, args.out, slo, m, cost, args.network_ms, advice)
    except SweepError as e:
        print(f"spectest report: {e}", file=sys.stderr)
        return 2
    status = sweep.info.get("status", "unknown")
    if status != "finished":
        print(f"note: this sweep's status is {status!r}; the report shows its "
              f"{len(sweep.table)} finished steps")
    for line in summary_lines(args.folder, slo, m, cost, sweep=sweep, advice=advice):
        print(line)
    print(f"report: {out.html}  (Markdown: {out.markdown})")
    return 0


def _load_or_explain(folder: Path):
    """``load_sweep``, or one line saying how to read a peer tool's folder given as a sweep."""
    from spectest.report import peers
    try:
        return load_sweep(folder)
    except SweepError as original:
        try:
            tool = peers.detect(folder)
        except SweepError:
            raise original from None
        raise SweepError(f"{folder} holds {peers.TOOL_NAMES[tool]} results, not a spectest "
                         f"sweep: give the speculative server's runs with --spec DIR… and the "
                         f"plain server's with --baseline DIR…") from None


def _peer_runs(spec, baseline, out: Path, args, where: str = ""):
    """The sweep folder made from peer runs (written into ``out``)."""
    from spectest.report import peers
    if not spec or not baseline:
        raise SweepError(f"peer runs need both arms{where}: --{where and where[1:] + '-'}spec "
                         f"DIR… (the speculative server) and --{where and where[1:] + '-'}"
                         f"baseline DIR… (the plain one)")
    slo = _slo(args, SLO()) or SLO()
    return peers.build(spec, baseline, out, slo, getattr(args, "peer", None),
                       getattr(args, "workload", None), getattr(args, "label", None))


def _peer_report(args: argparse.Namespace) -> int:
    from spectest.report.render import render_report, summary_lines
    try:
        if args.folder is not None:
            raise SweepError("give a sweep folder or peer runs (--spec/--baseline), not both")
        m, cost = analysis_options(args)
        if args.network_ms is not None and args.network_ms < 0:
            raise SweepError("--network-ms must be at least 0")
        out = args.out or Path(f"spectest-report-{(args.spec or [Path('spec')])[0].resolve().name}"
                               f"-vs-{(args.baseline or [Path('base')])[0].resolve().name}")
        sweep = _peer_runs(args.spec, args.baseline, out, args)
        rendered = render_report(out, out, None, m, cost, args.network_ms,
                                 advice_options(args, sweep.workloads))
        lines = summary_lines(out, None, m, cost)
    except SweepError as e:
        print(f"spectest report: {e}", file=sys.stderr)
        return 2
    for note in sweep.info.get("notes") or []:
        print(f"note: {note}")
    for line in lines:
        print(line)
    print(f"report: {rendered.html}  (Markdown: {rendered.markdown}; the converted runs: "
          f"{out / 'steps.csv'})")
    return 0


def _compare_sides(args: argparse.Namespace) -> tuple[list[Path], Path]:
    """(the two sweep folders, the output folder): positional folders fill the sides that are
    not given as peer runs; peer sides are converted under the output folder."""
    folders = list(args.folders)
    peer = {side: (getattr(args, f"{side}_spec"), getattr(args, f"{side}_baseline"))
            for side in ("a", "b")}
    given = [side for side, (s, b) in peer.items() if s or b]
    if len(folders) + len(given) != 2:
        raise SweepError(f"compare needs two sides (A and B): got {len(folders)} folder(s) and "
                         f"{len(given)} side(s) of peer runs")
    names, sides = {}, {}
    for side in ("a", "b"):
        if side in given:
            names[side] = peer[side][0][0].resolve().name if peer[side][0] else "peer"
        else:
            sides[side] = folders.pop(0)
            names[side] = sides[side].resolve().name
    out = args.out or Path(f"spectest-compare-{names['a']}-vs-{names['b']}")
    for side in given:
        folder = out / f"{side.upper()}-peer-runs"
        _peer_runs(*peer[side], folder, args, f" of side {side.upper()}")
        sides[side] = folder
    for side in ("a", "b"):
        if side not in given:
            _load_or_explain(sides[side])
    return [sides["a"], sides["b"]], out


def compare_main(args: argparse.Namespace) -> int:
    from spectest.report.compare import compare
    try:
        m, cost = analysis_options(args)
        sides, out = _compare_sides(args)
        result = compare(sides[0], sides[1], out, m, cost)
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
