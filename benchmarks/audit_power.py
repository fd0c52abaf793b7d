"""Benchmark: the auditor's false-positive rate, its power, and the runtime of a default audit.

1. Runtime (end to end, on this CPU): ``spectest audit --candidate embedded --baseline
   embedded`` at default settings, server start included; then ``--e2e-runs`` more default
   audits (seeds 1, 2, …) against one running server, A/B through the ``speculative`` switch.
   Baseline measured in the same run: generating the same tokens once, target-only, on the same
   server, with the same client concurrency (audit time / generation time is printed).
   The verdicts of these correct-engine audits are an end-to-end false-positive sample.
2. False-positive rate and power (statistics level, many seeds): one default sampled phase
   of the correct engine is captured — the baseline's sampling distributions p_t at every
   prefix the candidate visited (real model, real prefixes).  Then, for each of ``--reps``
   seeds, a simulated audit draws as many positions as a default audit tests and a token at
   each from p_t (the null) or from a *shifted sampler* q_t = (1-λ)p_t + λ r_t with λ chosen
   so that TV(p_t, q_t) = 0.05 (capped where r_t is closer than 0.05).  The shift is simulated
   at the statistics level, not through HTTP.  Seven directions r_t: toward the argmax (greedy-
   like), toward uniform over the support, hotter (p^0.5), colder (p^2), top-2 swapped, a
   random permutation of p_t, and toward the tokens with 0.1 <= p < 0.4 (what a lossy
   acceptance threshold does).  The auditor's test (surprise z + KS on the PIT + probability-
   bin calibration, Bonferroni) is applied as ``spectest.audit.distribution`` does;
   alternatives measured on the same draws: each statistic alone, a 20-bin chi-square on the
   PIT, and the two-sample G-test (the method
   often proposed: k draws per prompt from each server, G-test per prompt, Bonferroni over
   prompts) given the same candidate-token budget plus as many baseline tokens, in its best
   case (all draws at one prefix per prompt, one token each).  And the check the auditor runs
   where the baseline's scoring is not exactly what it samples from (``--sampled-control``,
   ``audit.two_sample``): the same candidate tokens against as many tokens the baseline
   sampled itself, cut into continuations of --sample-tokens, permutation p-values
   (``--two-reps`` audits per sampler, 999 permutations each).

    python benchmarks/audit_power.py [--models DIR] [--reps 500] [--null-reps 4000]
                                     [--two-reps 100] [--e2e-runs 3] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest.audit import collect, distribution, runner, two_sample
from spectest.audit.client import Client
from spectest.audit.prompts import load_records, tokenize
from spectest.audit.servers import ServerProcess, ServerSpec
from spectest.audit.settings import AuditSettings
from spectest.procs import python_env

FAMILIES = ("toward-argmax", "toward-uniform", "hotter", "colder", "swap-top2", "permute",
            "toward-mid")
TV = 0.05


# --- capture -------------------------------------------------------------------------------
async def capture(url: str, s: AuditSettings) -> tuple[np.ndarray, np.ndarray, int]:
    """One default sampled phase → padded sampling distributions [M, k] of the informative
    positions, the row indices of first-token positions (one per prompt), and M_total."""
    cand_ep, base_ep = runner.endpoints_for(s, {"candidate": url, "baseline": url})
    async with Client(cand_ep, s.concurrency) as cand, Client(base_ep, s.concurrency) as base:
        await cand.resolve_model()
        await base.resolve_model()
        cases = await tokenize(load_records(s.prompts, s.num_prompts, s.seed), base,
                               s.max_prompt_tokens)
        triples, _ = await collect.sampled_phase(cand, base, cases, s)
    rows, firsts, seen, total = [], [], set(), 0
    for i, _, comp, scored in triples:
        for j in range(len(comp.tokens)):
            total += 1
            d = distribution.sampling_dist(scored[len(cases[i].ids) + j].top, s.sampling)
            if len(d.probs) < 2:
                continue
            if j == 0 and i not in seen:
                seen.add(i)
                firsts.append(len(rows))
            rows.append(d.probs)
    width = max(len(r) for r in rows)
    pool = np.zeros((len(rows), width))
    for k, r in enumerate(rows):
        pool[k, :len(r)] = r
    return pool, np.array(firsts), total


# --- shifted samplers ------------------------------------------------------------------------
def shifted(p: np.ndarray, family: str, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """q = (1-λ)p + λr with TV(p, q) = min(0.05, TV(p, r)) per row; returns (q, mean TV)."""
    mask = p > 0
    if family == "toward-argmax":
        r = np.zeros_like(p)
        r[:, 0] = 1
    elif family == "toward-uniform":
        r = mask / mask.sum(1, keepdims=True)
    elif family in ("hotter", "colder"):
        r = np.where(mask, p ** (0.5 if family == "hotter" else 2.0), 0)
        r /= r.sum(1, keepdims=True)
    elif family == "toward-mid":  # what a lossy acceptance threshold does: 0.1 <= p < 0.4
        r = np.where((p >= 0.1) & (p < 0.4), p, 0)
        r = np.where(r.sum(1, keepdims=True) > 0, r, p)
        r /= r.sum(1, keepdims=True)
    elif family == "swap-top2":
        r = p.copy()
        r[:, [0, 1]] = p[:, [1, 0]]
    else:  # a random permutation of each row's support
        r = np.zeros_like(p)
        for i, row in enumerate(p):
            n = int(mask[i].sum())
            r[i, :n] = rng.permutation(row[:n])
    tv_pr = 0.5 * np.abs(p - r).sum(1)
    lam = np.where(tv_pr > 1e-12, np.minimum(1.0, TV / np.maximum(tv_pr, 1e-12)), 0.0)
    return (1 - lam[:, None]) * p + lam[:, None] * r, float((lam * tv_pr).mean())


def draw(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    cdf = np.cumsum(q, 1)
    u = rng.random(len(q))[:, None] * cdf[:, -1:]
    return np.minimum((cdf < u).sum(1), (q > 0).sum(1) - 1)


def pit_pvalues(p: np.ndarray, j: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """The auditor's statistics on one simulated audit (the same math as distribution.py)."""
    rows = np.arange(len(p))
    pj = p[rows, j]
    u = (np.cumsum(p, 1) - p)[rows, j] + rng.random(len(p)) * pj
    logs = np.where(p > 0, np.log(np.where(p > 0, p, 1)), 0)
    neg_h = (p * logs).sum(1)
    var = np.maximum((p * logs ** 2).sum(1) - neg_h ** 2, 0)
    z = (logs[rows, j] - neg_h).sum() / np.sqrt(var.sum())
    p_z = float(2 * stats.norm.sf(abs(z)))
    p_ks = float(stats.kstest(u, "uniform").pvalue)
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    edges = np.array(distribution.PROB_BINS)
    bins = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)
    mass = np.zeros((len(p), len(edges) - 1))
    for b in range(len(edges) - 1):
        mass[:, b] = np.where((bins == b) & (p > 0), p, 0).sum(1)
    observed = np.bincount(bins[rows, j], minlength=len(edges) - 1)
    expected = mass.sum(0)
    keep = np.nonzero(expected > 5)[0][:-1]
    d = (observed - expected)[keep]
    cov = (np.diag(expected) - mass.T @ mass)[np.ix_(keep, keep)]
    p_cal = float(stats.chi2.sf(d @ np.linalg.lstsq(cov, d, rcond=None)[0], len(keep)))
    return {"auditor": min(1.0, 3 * min(p_z, p_ks, p_cal)), "z only": p_z, "KS only": p_ks,
            "calibration only": p_cal, "chi2 20 PIT bins": float(stats.chisquare(counts).pvalue)}


def gtest_pvalue(p_first: np.ndarray, q_first: np.ndarray, m: int,
                 rng: np.random.Generator) -> float:
    """Two-sample G-test per prompt (m draws from each side), Bonferroni over prompts."""
    pvals = []
    for p, q in zip(p_first, q_first):
        a = np.bincount(draw(np.repeat(q[None], m, 0), rng), minlength=len(p))
        b = np.bincount(draw(np.repeat(p[None], m, 0), rng), minlength=len(p))
        table = np.array([a, b], dtype=float)
        big = table.sum(0) / 2 >= 5
        table = np.concatenate([table[:, big], table[:, ~big].sum(1, keepdims=True)], 1)
        table = table[:, table.sum(0) > 0]
        pvals.append(1.0 if table.shape[1] < 2 else float(
            stats.chi2_contingency(table, lambda_="log-likelihood").pvalue))
    return min(1.0, len(pvals) * min(pvals))


def as_draws(p: np.ndarray, j: np.ndarray, rng: np.random.Generator, tokens: int,
             samples: int) -> list[distribution.Draw]:
    """Simulated tokens j [M] at distributions p [M, k] as the auditor's Draws, cut into
    continuations of ``tokens`` positions, ``samples`` continuations per prompt."""
    rows = np.arange(len(p))
    u = (np.cumsum(p, 1) - p)[rows, j] + rng.random(len(p)) * p[rows, j]
    logs = np.where(p > 0, np.log(np.where(p > 0, p, 1)), 0)
    neg_h = (p * logs).sum(1)
    var = np.maximum((p * logs ** 2).sum(1) - neg_h ** 2, 0)
    edges = np.array(distribution.PROB_BINS)
    bins = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)
    mass = np.stack([np.where((bins == b) & (p > 0), p, 0).sum(1)
                     for b in range(len(edges) - 1)], 1)
    seq = rows // tokens
    return [distribution.Draw(int(s // samples), int(k % tokens), float(u[k]),
                              float(logs[k, j[k]]), float(neg_h[k]), float(var[k]),
                              float(p[k, 0]), bool(j[k] == 0), int(bins[k, j[k]]),
                              tuple(mass[k].tolist()), int(s % samples))
            for k, s in enumerate(seq)]


def two_sample_pvalue(p: np.ndarray, q: np.ndarray, rng: np.random.Generator, tokens: int,
                      samples: int, permutations: int) -> float:
    """The calibrated check (``audit.two_sample``): candidate tokens from q, as many control
    tokens from p at other prefixes of the same pool, both judged under p."""
    cand = as_draws(p, draw(q, rng), rng, tokens, samples)
    ctrl_p = p[rng.permutation(len(p))]
    ctrl = as_draws(ctrl_p, draw(ctrl_p, rng), rng, tokens, samples)
    return two_sample.test(cand, [d.sample for d in cand], ctrl, [d.sample for d in ctrl],
                           int(rng.integers(1 << 30)), permutations).p_value


def simulate(pool, firsts, n, reps, null_reps, alpha, g_reps, seed, two_reps=0,
             tokens=32, samples=8, permutations=999) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = []
    for family in ("null",) + FAMILIES:
        rejections = {k: 0 for k in ("auditor", "z only", "KS only", "calibration only",
                                     "chi2 20 PIT bins")}
        tvs = []
        n_reps = null_reps if family == "null" else reps
        for _ in range(n_reps):
            p = pool[rng.integers(len(pool), size=n)]
            q, tv = (p, 0.0) if family == "null" else shifted(p, family, rng)
            tvs.append(tv)
            for k, v in pit_pvalues(p, draw(q, rng), rng).items():
                rejections[k] += v < alpha
        g = 0
        m = max(1, n // len(firsts))
        for _ in range(g_reps):
            p = pool[firsts]
            q = p if family == "null" else shifted(p, family, rng)[0]
            g += gtest_pvalue(p, q, m, rng) < alpha
        row = {"sampler": family, "mean TV": float(np.mean(tvs))}
        row.update({k: v / n_reps for k, v in rejections.items()})
        row["two-sample G-test"] = g / g_reps if g_reps else float("nan")
        t = 0
        for _ in range(two_reps):
            p = pool[rng.integers(len(pool), size=n)]
            q = p if family == "null" else shifted(p, family, rng)[0]
            t += two_sample_pvalue(p, q, rng, tokens, samples, permutations) < alpha
        row["against own samples"] = t / two_reps if two_reps else float("nan")
        out.append(row)
    return pd.DataFrame(out)


# --- end to end ----------------------------------------------------------------------------
async def generate_once(url: str, s: AuditSettings) -> float:
    """Seconds to generate the audited tokens once, target-only (the runtime baseline)."""
    _, base_ep = runner.endpoints_for(s, {"candidate": url, "baseline": url})
    async with Client(base_ep, s.concurrency) as base:
        await base.resolve_model()
        cases = await tokenize(load_records(s.prompts, s.num_prompts, s.seed), base,
                               s.max_prompt_tokens)
        t0 = time.perf_counter()
        jobs = [base.complete(list(c.ids), max_tokens=s.greedy_tokens, temperature=0,
                              logprobs=s.logprobs) for c in cases]
        jobs += [base.complete(list(c.ids), max_tokens=s.sample_tokens,
                               temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                               seed=k, logprobs=s.logprobs)
                 for c in cases for k in range(s.samples_per_prompt)]
        await asyncio.gather(*jobs)
        return time.perf_counter() - t0


def cli_audit(models: Path, out: Path) -> tuple[float, int]:
    argv = [sys.executable, "-m", "spectest.audit", "--candidate", "embedded", "--baseline",
            "embedded", "--embedded-model", str(models / "target"), "--embedded-draft",
            str(models / "draft"), "--out", str(out), "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False,
                          env=python_env())
    return time.perf_counter() - t0, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=Path(os.environ.get(
        "SPECTEST_TEST_MODELS", ROOT / "spectest" / "models")))
    ap.add_argument("--reps", type=int, default=500, help="simulated audits per shifted sampler")
    ap.add_argument("--null-reps", type=int, default=4000, help="simulated audits of the null")
    ap.add_argument("--g-reps", type=int, default=200, help="simulated G-tests per sampler")
    ap.add_argument("--two-reps", type=int, default=100, help="simulated audits per sampler "
                    "of the check against the baseline's own samples (--sampled-control)")
    ap.add_argument("--e2e-runs", type=int, default=3, help="default audits, end to end")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    if not (args.models / "target").is_dir():
        print(f"audit_power: no models in {args.models} (target/, draft/)", file=sys.stderr)
        return 2
    s = AuditSettings(candidate="x", baseline="x", progress=False)
    results: dict = {"models": str(args.models), "settings": s.public()}
    spec = ServerSpec(str(args.models / "target"), str(args.models / "draft"))

    t_cli, rc = cli_audit(args.models, Path("/tmp/spectest-audit-power/cli"))
    print(f"default audit, embedded, server start included: {t_cli:.1f} s (exit {rc})")
    results["cli_audit_s"], results["cli_exit"] = t_cli, rc
    with ServerProcess(spec) as url:
        t_gen = asyncio.run(generate_once(url, s))
        runs = []
        for seed in range(1, args.e2e_runs + 1):
            t0 = time.perf_counter()
            r = runner.run(replace(s, candidate=url, baseline=url, seed=seed))
            dt = time.perf_counter() - t0
            ok = all(x is not None and x.passed for x in (r.greedy, r.logprobs, r.distribution))
            runs.append({"seed": seed, "seconds": dt, "passed": ok, "error": r.error,
                         "distribution_p": r.distribution.pit.p_value if r.distribution else None})
            print(f"  audit seed {seed}: {dt:.1f} s, {'pass' if ok else 'FAIL'}"
                  f"{'' if not r.error else ' — ' + r.error}")
        t0 = time.perf_counter()
        pool, firsts, total = asyncio.run(capture(url, replace(s, seed=10_000)))
        t_capture = time.perf_counter() - t0
    t_audit = statistics.median(r["seconds"] for r in runs) if runs else float("nan")
    print(f"default audit on a running server: median {t_audit:.1f} s over {len(runs)} runs; "
          f"generating the same tokens once target-only: {t_gen:.1f} s "
          f"(ratio {t_audit / t_gen:.2f}x)")
    results.update(e2e_runs=runs, audit_median_s=t_audit, generate_once_s=t_gen,
                   e2e_false_positives=sum(not r["passed"] for r in runs))

    n = len(pool)
    print(f"captured {total} sampled positions in {t_capture:.1f} s; {n} informative "
          f"(support >= 2); mean p_max {pool[:, 0].mean():.2f}; simulating {args.null_reps} "
          f"null and {args.reps} shifted audits of {n} tokens per sampler at alpha {s.alpha}")
    t0 = time.perf_counter()
    df = simulate(pool, firsts, n, args.reps, args.null_reps, s.alpha, args.g_reps, seed=0,
                  two_reps=args.two_reps, tokens=s.sample_tokens, samples=s.samples_per_prompt)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    fpr = df.loc[df.sampler == "null", "auditor"].item()
    k = round(fpr * args.null_reps)  # Clopper-Pearson upper bound
    hi = float(stats.beta.ppf(0.975, k + 1, args.null_reps - k)) if k < args.null_reps else 1.0
    power = df.loc[df.sampler != "null", "auditor"]
    g_power = df.loc[df.sampler != "null", "two-sample G-test"]
    print(f"false-positive rate {100 * fpr:.2f}% (95% upper bound {100 * hi:.2f}%, target <= 1%)"
          f"; detection at TV {TV}: min {100 * power.min():.1f}% / mean {100 * power.mean():.1f}%"
          f" (target >= 95%); two-sample G-test at the same budget: mean "
          f"{100 * g_power.mean():.1f}% (auditor/G-test ratio "
          f"{power.mean() / max(g_power.mean(), 1e-9):.1f}x); simulated in "
          f"{time.perf_counter() - t0:.0f} s")
    if args.two_reps:
        two = df.loc[df.sampler != "null", "against own samples"]
        t_fp = df.loc[df.sampler == "null", "against own samples"].item()
        k2 = round(t_fp * args.two_reps)
        hi2 = float(stats.beta.ppf(0.975, k2 + 1, args.two_reps - k2)) \
            if k2 < args.two_reps else 1.0
        print(f"against the baseline's own samples (the check where the scoring is not exact, "
              f"{args.two_reps} simulated audits per sampler, as many control tokens): false-"
              f"positive rate {100 * t_fp:.1f}% (95% upper bound {100 * hi2:.1f}%), detection "
              f"at TV {TV}: min {100 * two.min():.1f}% / mean {100 * two.mean():.1f}%")
        results.update(two_sample_false_positive_rate=t_fp, two_sample_fpr_upper_95=hi2)
    results.update(false_positive_rate=fpr, fpr_upper_95=hi, power=df.to_dict("records"),
                   informative_positions=n)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
