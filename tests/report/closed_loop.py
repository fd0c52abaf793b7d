"""Closed loops of users against servers of known speed: the ground truth that the interval
tests and ``benchmarks/interval_coverage.py`` check the report's estimators against.

A sweep step is a closed loop: ``c`` users, each sending its next request as soon as the last
one ends, measured over a window after a warm-up. Two models of the server, both with a known
long-run throughput and a known TPOT median:

* ``independent`` — each request's TPOT is drawn on its own (log-normal around the arm's
  median), its output length from a workload-like mix (most requests hit ``max_tokens``, the
  rest stop early), its TTFT around a median. Users do not slow each other. True throughput:
  c · E[tokens] / E[request time], computed once from a large sample (renewal-reward).
* ``batched`` — one server runs the active requests in rounds: a round costs
  ``round_ms · (1 + batch_cost · (b − 1))`` (b requests in the batch) with noise, gives each
  request 1 token (plain) or 1 + the accepted drafts (speculation: each request has its own
  acceptance rate, drawn per request, so some prompts speculate well and some badly). Users
  interact through the batch, as on a real server. Truth from one long run.

Each returns the step's requests as ``requests.jsonl`` rows (the columns ``summarize`` and
``evidence`` read) plus the window, so the estimators run on exactly what a sweep gives them.
Nothing here is used by the product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

GAP_S = 0.002  # the client's own time between one request's end and the next send


@dataclass(frozen=True)
class Arm:
    """One arm of the ``independent`` model."""

    tpot_ms: float  # median per-request TPOT
    tpot_sigma: float = 0.2  # log-normal spread of per-request TPOT
    ttft_ms: float = 25.0
    ttft_sigma: float = 0.4
    max_tokens: int = 96
    early_share: float = 0.3  # requests that stop before max_tokens (uniform 8..max)
    # a shared, slowly varying machine speed (other jobs on the host): log-normal AR(1)
    # with this standard deviation and correlation time; it scales every request's TPOT
    machine_sigma: float = 0.0
    machine_corr_s: float = 2.0

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        """(output tokens, TPOT ms, TTFT ms) of ``n`` requests."""
        tokens = np.where(rng.random(n) < self.early_share,
                          rng.integers(8, self.max_tokens, n), self.max_tokens)
        tpot = self.tpot_ms * np.exp(rng.normal(0, self.tpot_sigma, n))
        ttft = self.ttft_ms * np.exp(rng.normal(0, self.ttft_sigma, n))
        return tokens.astype(float), tpot, ttft

    def true_rate(self, c: int) -> float:
        """Long-run tokens/s of ``c`` users (with machine noise: from one long run)."""
        if not self.machine_sigma:
            return c * _per_user_rate(self)
        return c * _long_run_rate(self)


@lru_cache(maxsize=64)
def _per_user_rate(arm: Arm) -> float:
    y, tpot, ttft = arm.draw(np.random.default_rng(12345), 2_000_000)
    x = (ttft + tpot * (y - 1)) / 1e3 + GAP_S
    return float(y.mean() / x.mean())


@lru_cache(maxsize=64)
def _long_run_rate(arm: Arm) -> float:
    from spectest.sweep.summary import tokens_in

    req, t1, t2 = independent(np.random.default_rng(54321), arm, 1, 20_000.0)
    return tokens_in(req, t1, t2) / (t2 - t1)


def independent(rng: np.random.Generator, arm: Arm, c: int, seconds: float,
                warmup_s: float = 3.0) -> tuple[pd.DataFrame, float, float]:
    """One step: (requests, window start, window end); the window is [0, seconds]."""
    rows = []
    per_user = int(1.5 * (seconds + warmup_s) * _per_user_rate(arm) / arm.max_tokens) + 10
    speed = _machine(rng, arm, seconds + warmup_s + 30)
    for _ in range(c):
        y, tpot, ttft = arm.draw(rng, per_user)
        if arm.machine_sigma:  # the machine's speed when the request starts
            begin = np.concatenate([[0.0], np.cumsum((ttft + tpot * (y - 1)) / 1e3)[:-1]])
            tpot = tpot * speed[np.minimum((begin / 0.1).astype(int), len(speed) - 1)]
        e2el = ttft + tpot * (y - 1)
        start = -warmup_s - rng.random() * 0.05 + np.concatenate(
            [[0.0], np.cumsum(e2el / 1e3 + GAP_S)[:-1]])
        keep = start < seconds
        if keep.all():
            raise RuntimeError("draw more requests per user")
        rows.append(pd.DataFrame({"started_at": start[keep], "ttft_ms": ttft[keep],
                                  "tpot_ms": tpot[keep], "e2el_ms": e2el[keep],
                                  "output_tokens": y[keep]}))
    return _frame(pd.concat(rows, ignore_index=True)), 0.0, seconds


def _machine(rng: np.random.Generator, arm: Arm, seconds: float) -> np.ndarray:
    """The machine's speed factor every 0.1 s (mean 1 in the log): AR(1), stationary."""
    n = int(seconds / 0.1) + 1
    if not arm.machine_sigma:
        return np.ones(n)
    phi = math.exp(-0.1 / arm.machine_corr_s)
    z = np.empty(n)
    z[0] = rng.normal(0, arm.machine_sigma)
    shocks = rng.normal(0, arm.machine_sigma * math.sqrt(1 - phi * phi), n)
    for i in range(1, n):
        z[i] = phi * z[i - 1] + shocks[i]
    return np.exp(z)


@dataclass(frozen=True)
class Server:
    """The ``batched`` model: one server, rounds over the active requests."""

    round_ms: float = 8.0  # a plain round of one request
    batch_cost: float = 0.25  # each extra request in the batch adds this share of a round
    k: int = 0  # draft tokens per round (0: plain)
    draft_cost: float = 0.08  # each draft token adds this share of a round (× batch)
    acceptance: tuple[float, float] = (6.0, 4.0)  # Beta(a, b) of a request's acceptance
    noise: float = 0.1  # log-normal noise of one round's time
    prefill_rounds: float = 3.0  # TTFT in rounds
    max_tokens: int = 96
    early_share: float = 0.3

    def round_s(self, b: int, rng: np.random.Generator) -> float:
        cost = 1 + self.batch_cost * (b - 1) + self.draft_cost * self.k * b
        return self.round_ms * cost * math.exp(rng.normal(0, self.noise)) / 1e3


def batched(rng: np.random.Generator, server: Server, c: int, seconds: float,
            warmup_s: float = 3.0) -> tuple[pd.DataFrame, float, float]:
    """One step of the batched model: (requests, window start, window end)."""
    t = -warmup_s
    need, got, alpha, start, first = (np.zeros(c) for _ in range(5))
    rows: list[tuple] = []

    def new(i: int, now: float) -> None:
        need[i] = (server.max_tokens if rng.random() >= server.early_share
                   else rng.integers(8, server.max_tokens))
        got[i], start[i], first[i] = 0, now, np.nan
        alpha[i] = rng.beta(*server.acceptance)

    for i in range(c):
        new(i, t)
    while True:
        dt = server.round_s(c, rng)
        t += dt
        if server.k:  # accepted drafts: the run of successes before the first rejection
            acc = np.minimum(rng.geometric(1 - alpha) - 1, server.k)
        else:
            acc = np.zeros(c)
        prefilling = t - start < server.prefill_rounds * server.round_ms / 1e3
        gain = np.where(prefilling, 0, 1 + acc)
        got += gain
        first = np.where(np.isnan(first) & (got > 0), t, first)
        for i in np.flatnonzero(got >= need):
            ttft = first[i] - start[i]
            e2el = t - start[i]
            tokens = need[i]
            tpot = (e2el - ttft) / (tokens - 1) if tokens > 1 else np.nan
            rows.append((start[i], ttft * 1e3, tpot * 1e3, e2el * 1e3, tokens))
            if start[i] >= seconds:
                continue
            new(i, t + GAP_S)
        if (start >= seconds).all() or t > seconds + 600:
            break
    frame = pd.DataFrame(rows, columns=["started_at", "ttft_ms", "tpot_ms", "e2el_ms",
                                        "output_tokens"])
    return _frame(frame[frame.started_at < seconds]), 0.0, seconds


def batched_truth(server: Server, c: int, seconds: float = 3000.0) -> tuple[float, float]:
    """(throughput tokens/s, TPOT median ms) of the batched model from one long run."""
    from spectest.sweep.summary import tokens_in

    req, t1, t2 = batched(np.random.default_rng(999), server, c, seconds, warmup_s=5.0)
    return tokens_in(req, t1, t2) / (t2 - t1), float(req[req.step == 1].tpot_ms.median())


def _frame(req: pd.DataFrame) -> pd.DataFrame:
    req = req.sort_values("started_at").reset_index(drop=True)
    req["ok"] = True
    req["slo_ok"] = True
    req["step"] = np.where(req.started_at >= 0, 1, 0)
    return req


def wrong_verdict(judgement: str, truth: float) -> bool:
    """Whether a ratio's verdict contradicts the true ratio: ahead when it is at most 1, behind
    when at least 1, even when outside the even band; no verdict (thin, unresolved) is never
    wrong."""
    from spectest.report import evidence as ev

    if judgement == ev.AHEAD:
        return truth <= 1
    if judgement == ev.BEHIND:
        return truth >= 1
    if judgement == ev.EVEN:
        return not 1 / (1 + ev.EVEN_TOL) <= truth <= 1 + ev.EVEN_TOL
    return False
