"""Which throughput interval covers at its stated 95 % with the narrowest width, and whether the
sequential rule keeps its error rate: simulated closed loops of known speed.

Part 1 — estimators of the standard error of log(output tokens/s) of one step, on the same
simulated requests (``tests/report/closed_loop.py``: independent users with workload-like
lengths, with and without a shared, slowly varying machine speed; and a batched server whose
users share its rounds, plain and speculative):

* ``window+poisson`` — the estimator spectest used before: resample the requests' in-window
  token shares with the window fixed, plus a Poisson term for their number;
* ``window`` — the same without the Poisson term;
* ``ratio iid`` — the ratio estimator (tokens over the time the requests took), bootstrapped
  over requests;
* ``ratio clustered`` — spectest's (``evidence.throughput_log_se``): the delta method with the
  residuals of the c requests sent together summed, t quantile.

For each: the share of simulated steps whose 95 % interval covers the true long-run throughput,
and the median half-width of the interval on the log scale.

Part 2 — the sequential rule: simulated steps with known TPOT and throughput ratios (A/A,
inside the even band, clearly ahead, clearly behind), looked at up to L times with the sweep's
estimators, stopped by ``sequential.judge`` — against the same looks judged at z = 1.96 each
time (naive optional stopping). Coverage of the interval at the stopping look and the share of
wrong verdicts.

    python benchmarks/interval_coverage.py            # ~2-4 min on 2 cores
    python benchmarks/interval_coverage.py --quick    # fewer replicates
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "report")]

from closed_loop import (  # noqa: E402
    Arm,
    Server,
    batched,
    batched_truth,
    independent,
    wrong_verdict,
)

from spectest.report import evidence as ev  # noqa: E402
from spectest.report import sequential  # noqa: E402
from spectest.sweep.summary import Look, figures, token_shares  # noqa: E402

Z = ev.Z


def window_poisson(shares, seconds):
    """The estimator before: bootstrap of the in-window shares (window fixed) + Poisson."""
    boot = ev.bootstrap_log_se(shares, lambda x, axis: np.sum(x, axis=axis) / seconds)
    return None if boot is None else math.sqrt(boot * boot + 1.0 / len(shares))


def window_only(shares, seconds):
    return ev.bootstrap_log_se(shares, lambda x, axis: np.sum(x, axis=axis) / seconds)


def ratio_iid(y, x, rng):
    idx = rng.integers(0, len(y), (2000, len(y)))
    return float(np.std(np.log(y[idx].sum(1) / x[idx].sum(1)), ddof=1))


def estimators(req, t1, t2, c, rng) -> tuple[float, dict]:
    seconds = t2 - t1
    shares = token_shares(req, t1, t2)
    point = float(shares.sum()) / seconds
    inside = shares[shares > 0]
    m = req[req.step == 1].sort_values("started_at")
    y = m.output_tokens.to_numpy(float)
    x = m.e2el_ms.to_numpy(float) / 1e3
    return point, {"window+poisson": window_poisson(inside, seconds),
                   "window": window_only(inside, seconds),
                   "ratio iid": ratio_iid(y, x, rng),
                   "ratio clustered": ev.throughput_log_se(y, x, c)}


def part1(reps: int) -> None:
    print("Part 1: throughput intervals of one 10 s step (coverage of the true throughput / "
          "median half-width of the 95 % interval, log scale)")
    models = []
    for c in (1, 4):
        for sigma, corr in ((0.0, 1.0), (0.05, 0.5), (0.1, 2.0)):
            arm = Arm(5.0, 0.12, machine_sigma=sigma, machine_corr_s=corr)
            label = f"independent c={c}" + (f", machine ±{sigma:.0%}/{corr:g} s"
                                              if sigma else "")
            models.append((label, c, lambda rng, a=arm, c=c: independent(rng, a, c, 10.0),
                           arm.true_rate(c), reps))
    for c in (1, 4):
        for k in (0, 4):
            srv = Server(k=k)
            truth = batched_truth(srv, c, 600.0)[0]
            models.append((f"batched c={c} {'speculative' if k else 'plain'}", c,
                           lambda rng, s=srv, c=c: batched(rng, s, c, 10.0), truth,
                           max(100, reps // 3)))
    names = ("window+poisson", "window", "ratio iid", "ratio clustered")
    print(f"{'model':40s} {'n':>4s} " + " ".join(f"{n:>22s}" for n in names))
    for label, c, make, truth, n_reps in models:
        cover = dict.fromkeys(names, 0)
        width = {n: [] for n in names}
        ns = []
        for i in range(n_reps):
            rng = np.random.default_rng(i)
            req, t1, t2 = make(rng)
            point, se = estimators(req, t1, t2, c, rng)
            ns.append(int((req.step == 1).sum()))
            for n, v in se.items():
                if v is None:
                    continue
                cover[n] += point * math.exp(-Z * v) <= truth <= point * math.exp(Z * v)
                width[n].append(Z * v)
        print(f"{label:40s} {np.median(ns):4.0f} "
              + " ".join(f"{cover[n] / n_reps:10.3f} / {np.median(width[n]):9.4f}"
                         for n in names), flush=True)


BASE = Arm(5.0, tpot_sigma=0.06)
CASES = {"A/A": BASE, "4.5 % ahead (even band)": Arm(4.75, tpot_sigma=0.12),
         "clearly ahead": Arm(3.4, tpot_sigma=0.12), "clearly behind": Arm(6.0, tpot_sigma=0.12)}


def part2(steps: int, looks: int) -> None:
    print(f"\nPart 2: the sequential rule, up to {looks} looks of 10 s, c = 1 "
          f"({steps} simulated steps per case)")
    print(f"{'case':26s} {'rule':>8s} {'coverage':>9s} {'wrong':>7s} {'verdicts':>9s} "
          f"{'mean looks':>11s}")
    for name, spec in CASES.items():
        truth = {"tpot": BASE.tpot_ms / spec.tpot_ms,
                 "throughput": spec.true_rate(1) / BASE.true_rate(1)}
        stats = {rule: {"cov": 0, "wrong": 0, "verdicts": 0, "looks": []}
                 for rule in ("spending", "naive")}
        rng = np.random.default_rng(7)
        for _ in range(steps):
            data = {"spec": [], "base": []}
            done = dict.fromkeys(stats, False)
            for k in range(1, looks + 1):
                for arm, model in (("spec", spec), ("base", BASE)):
                    data[arm].append(Look.from_frame(*independent(rng, model, 1, 10.0)))
                rows = {a: figures(v, 1) for a, v in data.items()}
                for rule in stats:
                    if done[rule]:
                        continue
                    look = sequential.judge(rows["spec"], rows["base"], k, looks, 1)
                    if rule == "naive":  # the same looks, each at z = 1.96
                        look = sequential.Look(k, looks, Z, {
                            m: ev.ratio(rows["spec"], rows["base"], col, hi, 1, z=Z)
                            for m, (col, hi) in sequential.METRICS.items()})
                    if look.final:
                        done[rule] = True
                        st = stats[rule]
                        st["looks"].append(k)
                        for m, r in look.ratios.items():
                            st["cov"] += r.has_interval and r.low <= truth[m] <= r.high
                            if r.resolved:
                                st["verdicts"] += 1
                                st["wrong"] += wrong_verdict(r.judgement, truth[m])
                if all(done.values()):
                    break
        for rule, st in stats.items():
            total = 2 * steps
            print(f"{name:26s} {rule:>8s} {st['cov'] / total:9.3f} "
                  f"{st['wrong'] / total:7.3f} {st['verdicts'] / total:9.3f} "
                  f"{np.mean(st['looks']):11.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--looks", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    part1(150 if a.quick else 600)
    part2(80 if a.quick else 300, a.looks)
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
