"""Benchmark: the rollback drill — speculation switched off, then on again, under live load.

Starts the bundled server with the defaults a newcomer gets (``spectest serve``, draft-model
speculation, K = 4), runs the chat workload in Locust, and during the run sends
``POST /admin/speculation {"enabled": false}`` and later ``{"enabled": true}``. Printed: the
requests and failures of the run (a rollback must lose none), for each flip the time the server
took to apply it (request → round boundary), the switch gauges read back from ``/metrics``, the
TPOT users saw before and after with the requests behind each level, how long after the flip that
TPOT settled at the new level, and that no request started after "off" drafted. The figure
(``drill.png``) shows TPOT over time with the flips marked; ``drill.json`` holds every number.

    python benchmarks/rollback_drill.py [--users 4] [--run-time 45] [--off-at 15] [--on-at 30]
                                        [--out .cache/rollback-drill]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from spectest.sweep.drill import Flip, run_drill  # noqa: E402


def plot(result: dict, path: Path) -> None:
    fig = Figure(figsize=(8, 3.2), dpi=110)
    ax = fig.subplots()
    t0 = result["started_at"]
    xs = [t for t, _ in result["timeline"]]
    ys = [v for _, v in result["timeline"]]
    ax.step(xs, ys, where="post", color="#1f77b4", label=f"TPOT per {result['bin_s']} s bin")
    for flip in result["flips"]:
        x = flip["requested_at"] - t0
        ax.axvline(x, color="#d62728" if not flip["enabled"] else "#2ca02c", ls="--",
                   label=f"speculation {'off' if not flip['enabled'] else 'on'} at {x:.1f} s")
    ax.set_xlabel("seconds into the Locust run")
    ax.set_ylabel("ms per output token")
    ax.set_title(f"rollback drill: {result['workload']}, {result['users']} users, "
                 f"{result['requests']} requests, {result['failures']} failed")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--workload", default="chat")
    ap.add_argument("--run-time", type=float, default=45.0)
    ap.add_argument("--off-at", type=float, default=15.0)
    ap.add_argument("--on-at", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path(".cache/rollback-drill"))
    ap.add_argument("serve_args", nargs="*", help="extra `spectest serve` flags (after --)")
    args = ap.parse_args()
    serve_args = args.serve_args  # none: the model's context, as `spectest sweep --embedded`
    result = run_drill(args.out, serve_args, args.workload, args.users, args.run_time,
                       (Flip(args.off_at, False), Flip(args.on_at, True)))
    plot(result, args.out / "drill.png")
    print(f"{result['workload']}, {result['users']} users, {args.run_time:.0f} s: "
          f"{result['requests']} requests, {result['failures']} failed")
    for flip, effect in zip(result["flips"], result["effects"]):
        state = "on" if flip["enabled"] else "off"
        settle = ("not seen" if effect["changed_after_s"] is None
                  else f"{effect['changed_after_s']:.1f} s")
        print(f"speculation {state:3s} at {flip['requested_at'] - result['started_at']:5.1f} s: "
              f"applied after {flip['effective_after_s'] or 0:.3f} s (round {flip['round']}); "
              f"gauge enabled={flip['gauge_enabled']} switches={flip['switches_total']}; "
              f"TPOT {effect['tpot_before_ms'] or float('nan'):.1f} ms "
              f"({effect['requests_before']} requests) → {effect['tpot_after_ms'] or float('nan'):.1f} ms "
              f"({effect['requests_after']} requests, {effect['drafted_after']} drafted); "
              f"TPOT settled {settle} after the flip")
    print(f"figure: {args.out / 'drill.png'}  numbers: {args.out / 'drill.json'}")
    return 0 if result["failures"] == 0 and result["locust_returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
