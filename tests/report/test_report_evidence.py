"""Request counts and intervals behind every verdict, on request files of known answers.

Steps are built as Locust results folders (``run.json`` + ``requests.jsonl``) and summarised by
the sweep's own ``summarize``, so the whole path — bootstrap at summary time, interval columns
in the table, ratio intervals and the "not enough data" status in the report — is exercised:

* one request per arm and step (the llama.cpp case of issue 11): no speedup, no crossover, but
  "not enough data" with the counts;
* a few requests: still not enough, now with a real interval;
* 200 requests per arm with per-request TPOT drawn around known medians: the crossover is
  found and each step's interval contains the true ratio.
"""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from spectest.report import breakpoints as bp
from spectest.report import evidence as ev
from spectest.report.render import render_report
from spectest.report.table import COLUMNS
from spectest.sweep.summary import summarize

T0 = 1000.0  # the measured window starts here (unix seconds, synthetic)
TOKENS = 50


def step_dir(folder: Path, tpot_ms: list[float], concurrency: int) -> Path:
    """A one-window Locust folder: ``concurrency`` users send back to back, each request
    generating TOKENS tokens at its TPOT (TTFT 20 ms); the window ends with the last one."""
    folder.mkdir(parents=True)
    clocks = [T0] * concurrency
    rows = []
    for i, tpot in enumerate(tpot_ms):
        u = i % concurrency
        e2el = 20 + tpot * (TOKENS - 1)
        rows.append({"step": 0, "started_at": clocks[u], "ok": True, "ttft_ms": 20.0,
                     "tpot_ms": tpot, "e2el_ms": e2el, "itl_ms": [tpot], "chunks": TOKENS,
                     "output_tokens": TOKENS, "slo_ok": True, "error": None, "spec": None})
        clocks[u] += e2el / 1e3
    (folder / "run.json").write_text(json.dumps({"status": "finished", "steps": [
        {"index": 0, "started_at": T0, "ended_at": max(clocks) + 1e-3}]}))
    (folder / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def sweep_folder(root: Path, tpot: dict[tuple[str, int], list[float]]) -> Path:
    """A sweep folder (steps.csv from ``summarize``, sweep.json) from per-step TPOT lists."""
    rows = []
    for (arm, c), values in tpot.items():
        run = step_dir(root / "runs" / "rag" / arm / f"c{c}", values, c)
        rows.append(summarize(run, workload="rag", arm=arm, concurrency=c, warmup_steps=0,
                              rel_to=root))
    pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(root / "steps.csv", index=False)
    (root / "sweep.json").write_text(json.dumps({
        "label": "evidence", "status": "finished", "workloads": ["rag"],
        "config": {"steps": sorted({c for _, c in tpot})},
        "slo": {"ttft_p99_ms": None, "tpot_p99_ms": None, "e2el_p99_ms": None}}))
    return root


def test_one_request_per_step_is_not_enough_data(tmp_path):
    # issue 11: llama-server, RAG, c = 1, 2, one request per step. The point figures alone would
    # place a TPOT crossover at c ≈ 1.6 (advantage +50 % at c=1, −33 % at c=2).
    folder = sweep_folder(tmp_path / "s", {("spec", 1): [10.0], ("base", 1): [15.0],
                                           ("spec", 2): [15.0], ("base", 2): [10.0]})
    table = pd.read_csv(folder / "steps.csv")
    assert table.tpot_p50_log_se.isna().all()  # one request has no spread to resample
    got = bp.crossover(table, "rag", "tpot")
    assert got.status == bp.NOT_ENOUGH and got.concurrency is None
    assert "c=1: n = 1 spec / 1 base" in got.basis and "c=2: n = 1 spec / 1 base" in got.basis
    s = bp.speedup_at(table, "rag")
    assert not s.enough and s.tpot_ratio.judgement == ev.THIN
    assert s.tpot_ratio.text() == (
        "not enough data (n = 1 spec / 1 base; no interval: an arm has fewer than 2 successful "
        "requests; fewer than 20 successful requests in an arm)")
    render_report(folder)
    md = (folder / "report.md").read_text()
    assert "stops paying" not in md
    assert "On TPOT, not enough data to place a crossover (c=1: n = 1 spec / 1 base" in md
    assert "TPOT speedup: not enough data (n = 1 spec / 1 base" in md
    bps = pd.read_csv(folder / "breakpoints.csv")
    assert set(bps[bps.kind.str.startswith("crossover")].status) == {bp.NOT_ENOUGH}


def test_a_few_requests_get_an_interval_but_still_no_verdict(tmp_path):
    rng = np.random.default_rng(3)
    draw = lambda median, n: list(median * np.exp(rng.normal(0, 0.3, n)))  # noqa: E731
    folder = sweep_folder(tmp_path / "s", {("spec", 1): draw(10, 3), ("base", 1): draw(15, 3)})
    table = pd.read_csv(folder / "steps.csv")
    s = bp.speedup_at(table, "rag")
    r = s.tpot_ratio
    assert (r.n_spec, r.n_base) == (3, 3) and r.has_interval and r.low < r.value < r.high
    assert r.text().startswith(f"not enough data (n = 3 spec / 3 base; 95% interval "
                               f"{r.low:.2f}×–{r.high:.2f}×; fewer than 20")
    # with the minimum lowered to 3 the same step is judged on its interval alone
    assert ev.ratio(table.iloc[0], table.iloc[1], "tpot_p50_ms", False, 1, 3).judgement in (
        ev.AHEAD, ev.UNRESOLVED)


def test_plenty_of_separated_requests_give_a_crossover_whose_intervals_hold_the_truth(
        tmp_path):
    # True medians: c=1 spec 5 ms vs base 10 ms (2×); c=2 spec 20 ms vs base 10 ms (0.5×).
    rng = np.random.default_rng(11)
    draw = lambda median: list(median * np.exp(rng.normal(0, 0.3, 200)))  # noqa: E731
    folder = sweep_folder(tmp_path / "s", {("spec", 1): draw(5), ("base", 1): draw(10),
                                           ("spec", 2): draw(20), ("base", 2): draw(10)})
    table = pd.read_csv(folder / "steps.csv")
    assert (table.requests == 200).all() and table.tpot_p50_log_se.notna().all()
    # the bootstrap SE of a log-median of lognormal(σ = 0.3) data: √(π/2)·σ/√n ≈ 0.0266
    assert table.tpot_p50_log_se.mean() == pytest.approx(math.sqrt(math.pi / 2) * 0.3
                                                          / math.sqrt(200), rel=0.3)
    rs = {r.concurrency: r for r in bp.ratios(table, "rag", "tpot")}
    assert rs[1].low < 2.0 < rs[1].high and rs[1].judgement == ev.AHEAD
    assert rs[2].low < 0.5 < rs[2].high and rs[2].judgement == ev.BEHIND
    got = bp.crossover(table, "rag", "tpot")
    assert got.status == bp.FOUND and (got.lower, got.upper) == (1, 2)
    assert 1 < got.concurrency < 2
    assert "c=1: " in got.basis and "n = 200 spec / 200 base; 95% interval" in got.basis
    render_report(folder)
    md = (folder / "report.md").read_text()
    assert f"On TPOT it stops paying at **c ≈ {got.concurrency:.1f}** (between 1 and 2; c=1: " \
           f"{rs[1].value:.2f}× (n = 200 spec / 200 base; 95% interval {rs[1].low:.2f}×" in md


@pytest.mark.parametrize("value,low,high,n,want", [
    (1.5, 1.3, 1.7, 40, ev.AHEAD),
    (0.7, 0.6, 0.8, 40, ev.BEHIND),
    (1.02, 0.95, 1.08, 40, ev.EVEN),  # inside ±10 %: no difference that matters
    (1.02, 1.005, 1.04, 40, ev.EVEN),  # clear but under MIN_TOL
    (1.3, 0.8, 2.1, 40, ev.UNRESOLVED),  # cannot tell from 1.0×
    (2.0, 1.8, 2.2, 19, ev.THIN),  # a clear ratio on too few requests says nothing
])
def test_judgement_of_a_ratio(value, low, high, n, want):
    r = ev.Ratio(1, value, low, high, n, 40, min_requests=20)
    assert r.judgement == want
    assert r.text().startswith("not enough data") == (want in (ev.THIN, ev.UNRESOLVED))


def test_without_an_interval_the_window_band_judges_and_says_so():
    r = ev.Ratio(1, 1.2, None, None, 40, 40, tol=0.25)
    assert r.judgement == ev.UNRESOLVED and "interval unavailable; sub-window noise ±25%" in \
        r.text()
    assert ev.Ratio(1, 1.2, None, None, 40, 40, tol=0.05).judgement == ev.AHEAD
    assert ev.Ratio(1, 1.02, None, None, 40, 40, tol=0.05).judgement == ev.EVEN


def test_the_throughput_standard_error_is_a_closed_loops_ratio_and_the_poisson_interval():
    # requests whose tokens are proportional to their time: the rate has no noise at all,
    # however different their lengths (the fixed-window bootstrap saw a large spread here)
    tokens = np.array([10.0, 90.0, 40.0, 60.0])
    assert ev.throughput_log_se(tokens, tokens / 50.0) == pytest.approx(0.0, abs=1e-12)
    # independent requests: ≈ sd(y − r·x) / (√n · ȳ), times t(n−1)/z
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 1.5, 400)
    y = 50 * x * np.exp(rng.normal(0, 0.2, 400))
    r = y.sum() / x.sum()
    want = np.std(y - r * x, ddof=1) / (20 * y.mean()) * stats.t.ppf(0.975, 399) / ev.Z
    assert ev.throughput_log_se(y, x) == pytest.approx(want, rel=0.01)
    # c = 4: residuals summed over the four requests sent together before they are squared
    assert ev.throughput_log_se(y, x, 4) != pytest.approx(want, rel=1e-3)
    assert ev.throughput_log_se([5.0, 6.0], [1.0, 1.0], 2) is None  # one cluster
    assert ev.throughput_log_se([0.0, 0.0], [1.0, 1.0]) is None  # no tokens
    assert ev.median_log_se([]) is None
    assert ev.median_log_se([3.0] * 30) == pytest.approx(0.0, abs=1e-12)  # no spread
    lo, hi = ev.poisson_rate_interval(10, 2.0)  # Garwood: 4.795–18.39 events → per 2 s
    assert (lo, hi) == pytest.approx((4.7954 / 2, 18.3904 / 2), rel=1e-3)
    assert ev.poisson_rate_interval(0, 1.0)[0] == 0.0
