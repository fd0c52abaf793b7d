"""The K advisor: which draft length K to run at each concurrency, and the speedup to expect.

From a sweep it takes, per workload:

* **acceptance per position** p_i = P(at least i+1 drafts accepted) (vLLM's
  Δaccepted_per_pos[i] / Δdrafts), pooled over the speculative steps weighted by drafts, and
  continued geometrically past the K that was run (ratio p_{K−1}/p_{K−2});
* **costs per concurrency c** as multiples of one plain target step T0(c) (the baseline arm's
  round): a speculative round at the K that ran costs R(c) = draft + verify, i.e.
  R/T0 = 1 + c_eff·K, so c_eff(c) is the overhead per draft token *at that load* (drafting plus
  the extra verify work, which grows with batch × K). From engine round timings when the server
  exposes ``spec_decode_{draft,verify}_time_seconds``, else from client TPOT:
  R/T0 ≈ TPOT_spec · E[tokens per round] / TPOT_base.

and predicts the speedup with the seeds' formula, generalised from one α to per-position
acceptance and with c measured per load:

    speedup(K, c) = E_K / (1 + c_eff(c) · K + ν(c)),   E_K = 1 + Σ_{i<K} p_i

ν is the **network term** of a disaggregated drafter (``spectest serve --draft-url``): the
measured network milliseconds per round (``spec_decode_draft_network_seconds``) over T0. It is
paid once per round whatever K is (ν = 0 at K = 0 and for a co-located draft), so it is taken
out of the round cost before c_eff is derived; a large ν favours longer K, or no speculation.
``network_ms`` asks "what if" — the advice as if every round paid that many milliseconds (plan
a disaggregation from a co-located sweep, or another network from a measured one).

(with p_i = α^{i+1} this is exactly (1 − α^{K+1}) / ((1 − α)(1 + cK))). Costs are assumed
linear in K around the K that ran. K = 0 (speculation off) has speedup 1, so the advisor says
"off" where nothing beats it. ``profile_json`` writes the result in the format of
``spectest.engine.policies.Profile`` so ``spectest serve --k-policy goodput --profile`` can run
the recommendation.

Evidence: each row carries the measured speedup at the K that ran with its successful requests
per arm and 95 % interval (``evidence.Ratio``). Costs taken from client TPOT rest on those
requests, so a load level with fewer than ``min_requests`` in an arm gives "not enough data"
instead of a best K and stays out of the profile; costs from engine rounds rest on the server's
round counters (the row says how many rounds).

This module reads the step table only; it imports no engine code (no torch).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from spectest.report import evidence as ev
from spectest.report.evidence import MIN_REQUESTS_PER_STEP

K_MAX = 8
MAX_CONTINUATION = 0.95  # a geometric continuation never assumes a better rate than this


def seeds_speedup(alpha: float, c: float, k: int) -> float:
    """The seeds' formula: (1 − α^{K+1}) / ((1 − α)(1 + cK))."""
    if alpha >= 1.0:
        return (k + 1) / (1 + c * k)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (1 + c * k))


def expected_tokens(p: tuple[float, ...], k: int) -> float:
    """E[tokens per round] at K = k: 1 + Σ_{i<k} P(at least i+1 accepted)."""
    return 1.0 + float(sum(p[:k]))


def predict(p: tuple[float, ...], c_eff: float, k: int, nu: float = 0.0) -> float:
    """Speedup at K = k; ``nu``: the per-round network term in target steps (0 at k = 0)."""
    return expected_tokens(p, k) / (1 + c_eff * k + (nu if k > 0 else 0.0))


def extend(p: tuple[float, ...], k_max: int) -> tuple[float, ...]:
    """Per-position acceptance up to ``k_max``, continued geometrically past what was measured."""
    p = tuple(max(0.0, min(1.0, float(x))) for x in p)
    if not p:
        return (0.0,) * k_max
    if len(p) >= 2 and p[-2] > 0:
        q = p[-1] / p[-2]
    else:
        q = p[0]
    q = min(MAX_CONTINUATION, max(0.0, q))
    out = list(p[:k_max])
    while len(out) < k_max:
        out.append(out[-1] * q)
    return tuple(out)


def _ok(v) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _positions(table: pd.DataFrame) -> list[str]:
    cols = [c for c in table.columns if c.startswith("acceptance_pos_")]
    return sorted(cols, key=lambda c: int(c.rsplit("_", 1)[1]))


def k_run(table: pd.DataFrame, workload: str | None = None, arm: str = "spec") -> int | None:
    """The K the speculative arm ran (the server's gauge; the most frequent value)."""
    t = table[table.arm == arm]
    if workload is not None:
        t = t[t.workload == workload]
    ks = t["k"].dropna() if "k" in t else pd.Series(dtype=float)
    ks = ks[ks > 0]
    if not len(ks) and {"drafts", "draft_tokens"} <= set(t.columns):  # vLLM: no K gauge,
        d = t[t.drafts.fillna(0) > 0]  # but draft tokens per draft is K for a fixed K
        ks = (d.draft_tokens / d.drafts).round()
    return int(ks.mode().iloc[0]) if len(ks) else None


def position_acceptance(table: pd.DataFrame, workload: str | None = None,
                        arm: str = "spec") -> tuple[float, ...]:
    """Drafts-weighted per-position acceptance over the arm's steps (positions < K run)."""
    t = table[table.arm == arm]
    if workload is not None:
        t = t[t.workload == workload]
    cols = _positions(t)
    if t.empty or not cols:
        return ()
    w = t["drafts"].fillna(0).astype(float).to_numpy() if "drafts" in t else np.ones(len(t))
    vals = t[cols].astype(float).to_numpy()
    keep = ~np.isnan(vals).all(axis=1) & (w > 0)
    if not keep.any():
        return ()
    p = np.nansum(vals[keep] * w[keep, None], axis=0) / w[keep].sum()
    k = k_run(table, workload, arm)
    if k:
        p = p[:k]
    else:
        nz = np.flatnonzero(p > 0)
        p = p[:nz[-1] + 1] if len(nz) else p[:0]
    return tuple(float(x) for x in p)


@dataclass(frozen=True)
class Costs:
    concurrency: float
    k: int
    target_ms: float  # T0: one round without drafts (baseline arm), or baseline TPOT
    round_ms: float  # R: one speculative round at K = k, or its client-side estimate
    draft_ms: float | None
    verify_ms: float | None
    source: str  # "engine rounds" | "client TPOT"
    n_spec: int | None = None  # successful requests per arm at this load
    n_base: int | None = None
    rounds: float | None = None  # speculative engine rounds behind the round timings
    network_ms: float | None = None  # per round, inside round_ms (disaggregated drafter)
    network_source: str = ""  # "measured" | "assumed" (a what-if) | "" (co-located)

    def supported(self, min_requests: int = MIN_REQUESTS_PER_STEP) -> bool:
        """Engine rounds rest on the server's counters; client TPOT on enough requests."""
        return self.source == "engine rounds" or not (
            ev.thin(self.n_spec, min_requests) or ev.thin(self.n_base, min_requests))

    @property
    def plausible(self) -> bool:
        """A speculative round cannot cost less than a plain one; if it measured so, noise."""
        return self.round_ms >= self.target_ms

    @property
    def c_eff(self) -> float:
        """Overhead per draft token in units of a target step: ((R − net)/T0 − 1) / K, where
        net is the network time the measured round paid (0 co-located)."""
        paid = self.network_ms if self.network_source == "measured" else 0.0
        return max(0.0, ((self.round_ms - (paid or 0.0)) / self.target_ms - 1) / self.k)

    @property
    def nu(self) -> float:
        """The network term per round in target steps (0 without one)."""
        return (self.network_ms or 0.0) / self.target_ms


def costs(table: pd.DataFrame, workload: str, k: int,
          network_ms: float | None = None) -> list[Costs]:
    """Costs per concurrency where both arms were measured; ``network_ms``: a what-if network
    term per round (replaces any measured one)."""
    t = table[table.workload == workload]
    s = t[t.arm == "spec"].set_index("concurrency")
    b = t[t.arm == "base"].set_index("concurrency")
    out = []
    for c in sorted(set(s.index) & set(b.index)):
        rs, rb = s.loc[c], b.loc[c]
        n = (ev.successful(rs), ev.successful(rb))
        rounds = float(rs.get("rounds")) if _ok(rs.get("rounds")) else None
        d, v, v0 = rs.get("draft_ms_per_round"), rs.get("verify_ms_per_round"), \
            rb.get("verify_ms_per_round")
        net = rs.get("network_ms_per_round")
        measured = float(net) if _ok(net) and float(net) > 0 else None  # 0: co-located
        network = ({"network_ms": network_ms, "network_source": "assumed"}
                   if network_ms is not None else
                   {"network_ms": measured, "network_source": "measured"}
                   if measured is not None else {})
        if network_ms is not None and measured is not None:  # the what-if replaces it
            d = float(d) - measured if _ok(d) else d
        if _ok(d) and _ok(v) and _ok(v0) and float(v0) > 0:
            out.append(Costs(float(c), k, float(v0), float(d) + float(v), float(d), float(v),
                             "engine rounds", *n, rounds, **network))
            continue
        ts, tb, e = rs.get("tpot_p50_ms"), rb.get("tpot_p50_ms"), rs.get("mean_accepted_length")
        if _ok(ts) and _ok(tb) and _ok(e) and float(tb) > 0:
            round_ms = float(ts) * float(e)
            if network_ms is not None and measured is not None:
                round_ms -= measured
            out.append(Costs(float(c), k, float(tb), round_ms, None, None,
                             "client TPOT", *n, **network))
    return out


@dataclass(frozen=True)
class Advice:
    workload: str
    concurrency: float
    k_run: int
    c_eff: float
    source: str
    best_k: int
    predicted_best: float  # predicted speedup at best_k
    predicted_at_run: float  # predicted speedup at the K that ran
    measured_at_run: float | None  # base TPOT p50 / spec TPOT p50
    validated_k: float | None = None  # mean K the validation arm ran (if any)
    validated: float | None = None  # base TPOT p50 / spec-advised TPOT p50
    curve: tuple[float, ...] = field(default_factory=tuple)  # predicted speedup for K = 0…k_max
    plausible: bool = True  # False: the costs at this load contradict each other (noise)
    measured: ev.Ratio | None = None  # the measured speedup with its requests and interval
    supported: bool = True  # False: costs from too few requests — no best K is stated
    rounds: float | None = None  # engine rounds behind the costs (engine-round source)
    validated_evidence: ev.Ratio | None = None  # the validation run's speedup, n, interval
    network_ms: float | None = None  # the network term per round in the prediction
    network_source: str = ""  # "measured" | "assumed" | "" (none)

    def basis(self) -> str:
        """What the row rests on: requests per arm, interval, and rounds when from the engine."""
        text = self.measured.evidence() if self.measured is not None else "n = ?"
        if self.source == "engine rounds" and self.rounds:
            text += f"; costs from {self.rounds:,.0f} engine rounds"
        return text


def advise(table: pd.DataFrame, workload: str, k_max: int = K_MAX,
           min_requests: int = MIN_REQUESTS_PER_STEP,
           network_ms: float | None = None) -> list[Advice]:
    """One Advice per concurrency with both arms measured (empty when K or acceptance unknown);
    ``network_ms``: advise as if every draft round paid this network time."""
    k = k_run(table, workload)
    p = position_acceptance(table, workload)
    if not k or not p:
        return []
    k_max = max(k_max, k)  # n-gram drafts (llama.cpp) can run longer than the default range
    p = extend(p, k_max)
    t = table[table.workload == workload]
    out = []
    for cost in costs(table, workload, k, network_ms):
        curve = tuple(predict(p, cost.c_eff, kk, cost.nu) for kk in range(k_max + 1))
        best = int(np.argmax(curve))
        s = t[(t.arm == "spec") & (t.concurrency == cost.concurrency)].iloc[0]
        b = t[(t.arm == "base") & (t.concurrency == cost.concurrency)].iloc[0]
        measured = (float(b.tpot_p50_ms) / float(s.tpot_p50_ms)
                    if _ok(b.tpot_p50_ms) and _ok(s.tpot_p50_ms) and s.tpot_p50_ms > 0 else None)
        ratio = ev.ratio(s, b, "tpot_p50_ms", False, cost.concurrency, min_requests,
                         "tpot_p50_rse")
        v = t[(t.arm == "spec-advised") & (t.concurrency == cost.concurrency)]
        beside = t[(t.arm == "verify-off") & (t.concurrency == cost.concurrency)]
        if len(beside):  # the baseline measured beside the advised arm, not minutes before
            b = beside.iloc[0]
        validated = vk = None
        v_ratio = None
        if len(v) and _ok(v.iloc[0].tpot_p50_ms) and _ok(b.tpot_p50_ms):
            validated = float(b.tpot_p50_ms) / float(v.iloc[0].tpot_p50_ms)
            vk = float(v.iloc[0].k) if _ok(v.iloc[0].get("k")) else None
            v_ratio = ev.ratio(v.iloc[0], b, "tpot_p50_ms", False, cost.concurrency,
                               min_requests, "tpot_p50_rse")
        out.append(Advice(workload, cost.concurrency, k, cost.c_eff, cost.source, best,
                          curve[best], curve[k], measured, vk, validated, curve,
                          cost.plausible, ratio if ratio.value is not None else None,
                          cost.supported(min_requests), cost.rounds, v_ratio,
                          cost.network_ms, cost.network_source))
    return out


def advice_frame(advice: list[Advice]) -> pd.DataFrame:
    """The advice as a table (``k_advice.csv``)."""
    rows = [{"workload": a.workload, "concurrency": a.concurrency, "k_run": a.k_run,
             "c_eff": round(a.c_eff, 4), "cost_source": a.source,
             "network_ms_per_round": None if a.network_ms is None else round(a.network_ms, 3),
             "network_source": a.network_source or None, "best_k": a.best_k,
             "predicted_speedup_best_k": round(a.predicted_best, 4),
             "predicted_speedup_k_run": round(a.predicted_at_run, 4),
             "measured_speedup_k_run": None if a.measured_at_run is None
             else round(a.measured_at_run, 4),
             "validated_k": a.validated_k,
             "validated_speedup": None if a.validated is None else round(a.validated, 4),
             "plausible": a.plausible, "supported": a.supported,
             "n_spec": a.measured.n_spec if a.measured else None,
             "n_base": a.measured.n_base if a.measured else None,
             "measured_low": a.measured.low if a.measured else None,
             "measured_high": a.measured.high if a.measured else None}
            for a in advice]
    return pd.DataFrame(rows)


def profile_json(table: pd.DataFrame, workloads: list[str] | None = None,
                 k_max: int = K_MAX, min_requests: int = MIN_REQUESTS_PER_STEP) -> dict | None:
    """A ``Profile`` (engine/policies.py format) from the sweep, pooled over ``workloads``.

    ``step_seconds[c][k]`` = T0(c)·(1 + c_eff(c)·k + ν(c)) for k = 1…k_max and T0(c) at k = 0
    (round time at batch ≈ c), ``accept_at_least`` = pooled per-position acceptance, continued
    to k_max. Load levels whose costs are implausible (see ``Costs.plausible``) or rest on too
    few requests (client TPOT under ``min_requests`` per arm) are left out. None when the sweep
    lacks acceptance or costs.
    """
    t = table if workloads is None else table[table.workload.isin(workloads)]
    k = k_run(t)
    p = position_acceptance(t)
    if not k or not p:
        return None
    by_c: dict[float, list[Costs]] = {}
    for w in dict.fromkeys(t.workload):
        for cost in costs(t, w, k):
            if cost.plausible and cost.supported(min_requests):  # else: nearest neighbour
                by_c.setdefault(cost.concurrency, []).append(cost)
    if not by_c:
        return None
    steps = {}
    for c, cs in sorted(by_c.items()):
        t0 = float(np.mean([x.target_ms for x in cs])) / 1e3
        ce = float(np.mean([x.c_eff for x in cs]))
        nu = float(np.mean([x.nu for x in cs]))  # a disaggregated drafter's network term
        steps[str(round(c))] = {str(kk): t0 * (1 + ce * kk + (nu if kk else 0.0))
                                for kk in range(k_max + 1)}
    return {"step_seconds": steps, "accept_at_least": list(extend(p, k_max)),
            "meta": {"source": "spectest sweep K advisor", "k_run": k,
                     "workloads": list(dict.fromkeys(t.workload)),
                     "cost_source": sorted({x.source for v in by_c.values() for x in v})}}


def profile_text(profile: dict) -> str:
    return json.dumps(profile, indent=2) + "\n"
