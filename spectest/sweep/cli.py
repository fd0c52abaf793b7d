"""``spectest sweep``: the command line around ``SweepRunner``, then the report.

    spectest sweep                      # embedded pair, chat/code/rag, c = 1, 2, 4, 8
    spectest sweep --host http://gpu:8000 --baseline-host http://gpu:8001 --max-concurrency 64 \
        --slo-ttft-ms 500 --slo-tpot-ms 50 --step-time 60

``add_arguments(parser)`` and ``main(args) -> int`` are what ``spectest.cli`` wires in. Bad
input prints one line and exits 2; Ctrl-C or SIGTERM stop the running step, keep every
finished one and exit 130; a finished sweep renders ``report.html`` / ``report.md`` and prints
where they are and the break points found. It owns the flow of the command, nothing else.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console

from spectest import procs, smoke
from spectest.sweep import config as config_mod
from spectest.sweep.embedded import ServerStartError
from spectest.sweep.progress import Display
from spectest.sweep.run import SweepRunner


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_mod.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    smoke.sweep_args(args)  # SPECTEST_SMOKE: token sizes (the docs' test harness)
    try:
        cfg = config_mod.SweepConfig.from_args(args, time.strftime("%Y%m%d-%H%M%S"))
    except config_mod.ConfigError as e:
        print(f"spectest sweep: {e}", file=sys.stderr)
        return 2
    with procs.sigterm_as_interrupt() as terminated:
        runner = SweepRunner(cfg, Display(console), terminated=terminated)
        try:
            result = runner.run()
        except ServerStartError as e:
            print(f"spectest sweep: {e}", file=sys.stderr)
            return 2
    if result.status == "failed":
        print(f"spectest sweep: {result.message}", file=sys.stderr)
        if not result.steps:
            return 2
    if result.status == "interrupted":
        console.print(f"spectest sweep: {result.message}; render it with: "
                      f"spectest report {result.folder}", markup=False)
        return 130
    if not result.steps:
        return 2
    if not getattr(args, "no_report", False):
        from spectest.report.render import render_report, summary_lines
        with procs.sigterm_as_interrupt():
            try:
                out = render_report(result.folder)
            except KeyboardInterrupt:
                console.print(f"spectest sweep: report not rendered; run: spectest report "
                              f"{result.folder}", markup=False)
                return 130
        for line in summary_lines(result.folder):
            console.print(line, markup=False)
        console.print(f"report: {out.html}  (Markdown: {out.markdown})", markup=False)
    return 0 if result.status == "finished" else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="spectest sweep")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
