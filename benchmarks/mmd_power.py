"""Benchmark: the audit's sampled test against Model Equality Testing's MMD, at equal budgets.

Two tests of "does the candidate sample what the baseline samples":

* **the audit's** (``spectest.audit.distribution``): the candidate's tokens scored by the
  baseline — a randomized PIT, surprise z, KS and probability-bin calibration, Bonferroni —
  or, where the baseline's scoring cannot model the setting (penalties), the same figures
  against the baseline's own samples by a permutation test (``two_sample``);
* **MMD** (``spectest.audit.mmd``, Gao, Liang and Guestrin, ICLR 2025): the unbiased MMD² between
  the two servers' completions with a Hamming string kernel, permutation within prompts. It
  needs no logprobs; it needs as many baseline samples as candidate ones.

For each scenario a pool is collected once from a real ``spectest serve`` (the embedded pair,
one server, candidate and baseline through the per-request switch): ``--prompts`` prompts ×
``--pool`` sampled continuations of ``--tokens`` tokens from the candidate and as many from the
baseline, every one scored by the baseline (echo). Then ``--reps`` simulated audits draw
``--budget`` continuations per prompt from each pool (without replacement, fresh for every
rep) and run each test at alpha ``--alpha``: the share of audits that reject is the power (or,
for ``correct``, the false-alarm rate), with a 95 % Clopper-Pearson interval. Equal budget:
the same candidate continuations for every test; the baseline's budget is scoring requests
for the one-sample test and as many baseline samples for the two-sample tests.

Scenarios: ``correct`` (speculation, no fault); the always-on impostors
``greedy-verify-sampled``, ``draft-only-temperature``, ``draft-only-top-p``,
``lossy-threshold``; and the conditional faults under their condition:
``mixed-batch-greedy`` (greedy background requests alongside), ``prefix-hit-stale-kv`` (warm
prompts), ``draft-only-penalties`` (presence penalty 1.0 on both sides: only the two-sample
tests apply), ``rewind-past-256`` (prompts past 256 tokens), ``decay-after-requests``
(after the server served ``--fault-after`` requests).

    python benchmarks/mmd_power.py --scenarios all --reps 100 --json mmd-power.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest import files  # noqa: E402
from spectest.audit import collect, distribution_check, mmd, scoring  # noqa: E402
from spectest.audit.background import Background  # noqa: E402
from spectest.audit.client import Client  # noqa: E402
from spectest.audit.conditions.long import long_prompts  # noqa: E402
from spectest.audit.prompts import load_records, tokenize  # noqa: E402
from spectest.audit.runner import endpoints_for  # noqa: E402
from spectest.audit.servers import ServerProcess, ServerSpec, fault_args  # noqa: E402
from spectest.audit.settings import AuditSettings  # noqa: E402

SCENARIOS = ("correct", "greedy-verify-sampled", "draft-only-temperature", "draft-only-top-p",
             "lossy-threshold", "mixed-batch-greedy", "prefix-hit-stale-kv",
             "draft-only-penalties", "rewind-past-256", "decay-after-requests")
PENALTY = {"presence_penalty": 1.0}


async def collect_pool(name: str, args) -> dict:
    """One scenario's pool: per prompt, the candidate's and the baseline's samples (tokens),
    each scored by the baseline."""
    fault = () if name == "correct" else (name,)
    spec = ServerSpec(threads=1, extra_args=fault_args(fault) + (
        "--fault-after", str(args.fault_after)))
    s = AuditSettings(samples_per_prompt=args.pool, sample_tokens=args.tokens, seed=args.seed,
                      progress=False)
    with ServerProcess(spec) as url:
        cand_ep, base_ep = endpoints_for(s, {"candidate": url, "baseline": url})
        async with Client(cand_ep, 8) as cand, Client(base_ep, 8) as base:
            listed = await base.models()
            await cand.resolve_model(listed)
            await base.resolve_model(listed)
            ids = await scoring.probe(base, listed)
            await scoring.probe(cand, listed, probe_ids=ids)
            records = load_records("mixed", args.prompts, args.seed)
            cases = await tokenize(records, base, 192)
            if name == "rewind-past-256":
                cases = await long_prompts(base, args.seed, 320, args.prompts)
            kw = {}
            if name == "prefix-hit-stale-kv":  # warm: every prompt computed once first
                kw["cand_salt"] = uuid.uuid4().hex
                await asyncio.gather(*(cand.complete(scoring.prompt_for(cand, c), max_tokens=1,
                                                     temperature=0, logprobs=1,
                                                     salt=kw["cand_salt"]) for c in cases))
            if name == "draft-only-penalties":
                kw["fields"] = PENALTY
            if name == "decay-after-requests":  # serve past --fault-after first
                async with Background(cand, load_records("mixed", 10**6, 1), 8, 1) as bg:
                    await bg.wait_for(args.fault_after + 100, timeout=3600)
            if name == "mixed-batch-greedy":
                greedy = Client(cand_ep, 4)
                greedy.routes, greedy.model = cand.routes, cand.model
                async with greedy, Background(greedy, load_records("mixed", 10**6, 2), 4, 2,
                                              settings=({"temperature": 0.0},)):
                    ours, theirs = await collect.sampled_phase(cand, base, cases, s, True, **kw)
            else:
                ours, theirs = await collect.sampled_phase(cand, base, cases, s, True, **kw)
    return {"name": name, "cases": cases, "ours": ours, "theirs": theirs}


def simulate(pool: dict, args, rng: np.random.Generator) -> dict:
    cases, ours, theirs = pool["cases"], pool["ours"], pool["theirs"]
    by_prompt = {i: ([t for t in ours if t[0] == i], [t for t in theirs if t[0] == i])
                 for i in range(len(cases))}
    spec = replace(AuditSettings().sampling)
    one_sample = pool["name"] != "draft-only-penalties"  # the scoring models the rest
    rejected = {"audit (one-sample)": 0, "audit (two-sample)": 0, "MMD": 0}
    for rep in range(args.reps):
        mine, control = [], []
        for i, (c, b) in by_prompt.items():
            for arr, out in ((c, mine), (b, control)):
                pick = rng.choice(len(arr), size=min(args.budget, len(arr)), replace=False)
                out += [(i, k, arr[j][2], arr[j][3]) for k, j in enumerate(pick)]
        items = collect.sampled_items(cases, mine, {})
        ctrl = collect.sampled_items(cases, control, {})
        if one_sample:
            res = distribution_check.check(items, spec, args.alpha, len(cases), rep, 1e-4)
            rejected["audit (one-sample)"] += not res.passed
        res = distribution_check.check(items, spec, args.alpha, len(cases), rep, 1e-4,
                                       control=ctrl)
        rejected["audit (two-sample)"] += not res.passed
        test = mmd.test([(i, c.tokens) for i, _, c, _ in mine],
                        [(i, c.tokens) for i, _, c, _ in control], args.tokens, seed=rep,
                        permutations=args.permutations)
        rejected["MMD"] += test.p_value < args.alpha
    out = {}
    for test, k in rejected.items():
        if test == "audit (one-sample)" and not one_sample:
            continue
        ci = stats.binomtest(k, args.reps).proportion_ci(method="exact")
        out[test] = {"rejected": k, "reps": args.reps, "rate": k / args.reps,
                     "ci": [ci.low, ci.high]}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default="all")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--pool", type=int, default=24, help="samples per prompt and side")
    p.add_argument("--budget", type=int, default=8, help="samples per prompt an audit uses")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--alpha", type=float, default=0.01)
    p.add_argument("--permutations", type=int, default=999)
    p.add_argument("--fault-after", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=Path("mmd-power.json"))
    args = p.parse_args()
    names = SCENARIOS if args.scenarios == "all" else tuple(args.scenarios.split(","))
    rng = np.random.default_rng(args.seed)
    results = {}
    print(f"{args.reps} simulated audits per scenario, {args.budget} continuations of "
          f"{args.tokens} tokens per prompt and side, {args.prompts} prompts, alpha "
          f"{args.alpha}", flush=True)
    for name in names:
        t0 = time.perf_counter()
        pool = asyncio.run(collect_pool(name, args))
        collected = time.perf_counter() - t0
        results[name] = simulate(pool, args, rng)
        row = "  ".join(f"{t}: {r['rejected']}/{r['reps']} ({100 * r['ci'][0]:.0f}–"
                        f"{100 * r['ci'][1]:.0f} %)" for t, r in results[name].items())
        print(f"{name:>24}  {row}   (pool {collected:.0f} s)", flush=True)
    files.write_atomic(args.json, json.dumps({"args": vars(args) | {"json": str(args.json)},
                                              "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
