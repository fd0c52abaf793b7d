"""A step's row from a hand-written Locust results folder, and engine-round figures from a real
Prometheus exposition — every expected number is worked out in the comments."""

import json
import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from spectest.sweep import engine_metrics
from spectest.sweep.summary import read_requests, summarize, tokens_in
from spectest.telemetry import names as N


def request(step, started, ttft_ms, e2el_ms, tokens, ok=True, slo_ok=True):
    return {"step": step, "started_at": started, "ok": ok, "ttft_ms": ttft_ms if ok else None,
            "tpot_ms": (e2el_ms - ttft_ms) / max(1, tokens - 1) if ok else None,
            "e2el_ms": e2el_ms if ok else None, "itl_ms": [5.0, 7.0] if ok else [],
            "chunks": tokens if ok else 0, "output_tokens": tokens if ok else 0,
            "slo_ok": slo_ok and ok, "error": None if ok else "HTTP 500", "spec": None}


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "c2"
    d.mkdir()
    # Locust steps: warm-up [100, 102], windows [102, 104] and [104, 106]
    (d / "run.json").write_text(json.dumps({"status": "finished", "ended_at": 107, "steps": [
        {"index": 0, "started_at": 100, "ended_at": 102},
        {"index": 1, "started_at": 102, "ended_at": 104},
        {"index": 2, "started_at": 104, "ended_at": 106}]}))
    rows = [request(0, 101.0, 500, 2500, 20),  # tokens over [101.5, 103.5]: 1.5/2 inside
            request(1, 102.5, 100, 1100, 10),  # [102.6, 103.6]: all 10 inside
            request(2, 105.0, 200, 2200, 10, slo_ok=False),  # [105.2, 107.2]: 0.8/2 inside
            request(2, 105.5, 0, 0, 0, ok=False)]
    with open(d / "requests.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + '\n{"step": 2, "started_')  # torn
    header = "step,workload,drafts,draft_tokens,accepted_tokens,acceptance_source," \
             "acceptance_rate,client_acceptance_rate,tpot_p50_ms,requests,failures," \
             "acceptance_pos_0,acceptance_pos_1\n"
    (d / "steps.csv").write_text(header + "\n".join([
        "0,all,10,40,20,spectest,0.5,,1,1,0,0.8,0.5",
        "1,all,20,80,30,spectest,0.375,,1,1,0,0.6,0.3",
        "2,all,30,120,60,spectest,0.5,,1,2,1,0.9,0.6"]) + "\n")
    return d


def test_step_row_uses_only_the_measured_windows(run_dir):
    row = summarize(run_dir, workload="chat", arm="spec", concurrency=2, warmup_steps=1,
                    engine={"k": 4.0, "rounds": 50.0, "draft_ms_per_round": 1.5},
                    rel_to=run_dir.parent)
    assert (row["started_at"], row["duration_s"], row["windows"]) == (102, 4, 2)
    assert (row["requests"], row["failures"]) == (3, 1)  # the warm-up request is not counted
    assert row["error_rate"] == pytest.approx(1 / 3)
    assert row["ttft_p50_ms"] == pytest.approx(150.0)  # median of 100 and 200
    # 15 (warm-up request's share) + 10 + 4 tokens inside [102, 106]
    assert row["output_tokens_per_s"] == pytest.approx(29 / 4)
    # windows: (15 + 10) / 2 s = 12.5 and 4 / 2 s = 2 tok/s → rse = sd/√2/mean
    assert row["output_tokens_per_s_rse"] == pytest.approx(7.424621 / 2 ** 0.5 / 7.25, rel=1e-5)
    assert row["goodput_rps"] == pytest.approx(1 / 4) and row["slo_attainment"] == 0.5
    # server counters over steps 1 and 2 only; positions weighted by drafts
    assert (row["drafts"], row["draft_tokens"], row["accepted_tokens"]) == (50, 200, 90)
    assert row["acceptance_rate"] == pytest.approx(0.45)
    assert row["mean_accepted_length"] == pytest.approx(2.8)
    assert row["acceptance_pos_0"] == pytest.approx((0.6 * 20 + 0.9 * 30) / 50)
    assert row["acceptance_pos_1"] == pytest.approx((0.3 * 20 + 0.6 * 30) / 50)
    assert (row["k"], row["rounds"], row["draft_ms_per_round"]) == (4.0, 50.0, 1.5)
    assert row["run_dir"] == "c2" and row["itl_p50_ms"] == 6.0
    # goodput tokens: the SLO-meeting requests' 15 + 10 tokens inside [102, 106]
    assert row["goodput_tokens_per_s"] == pytest.approx(25 / 4)


def test_interval_columns_are_standard_errors_of_the_logs(run_dir):
    row = summarize(run_dir, workload="chat", arm="spec", concurrency=1, warmup_steps=1)
    # TPOT of the two measured successes: 1000/9 and 2000/9 ms. Resampling two values gives
    # medians a, (a+b)/2, b with probabilities 1/4, 1/2, 1/4: SD of the log ≈ 0.245.
    a, b = math.log(1000 / 9), math.log(2000 / 9)
    m = math.log(1500 / 9)
    mean = (a + 2 * m + b) / 4
    sd = math.sqrt(((a - mean) ** 2 + 2 * (m - mean) ** 2 + (b - mean) ** 2) / 4)
    assert row["tpot_p50_log_se"] == pytest.approx(sd, rel=0.1)
    # throughput: the ratio estimator over the two successes (10 tokens in 1.1 s, 10 in 2.2 s):
    # r = 20 / 3.3, residuals ±10/3, two clusters of one: se = √(2·(10/3)²·2) / 20 = 1/3,
    # times t(0.975, 1 df) / z = 12.706 / 1.96 for the small sample
    t1 = 12.7062047 / 1.959964
    assert row["output_tokens_per_s_log_se"] == pytest.approx(t1 / 3, rel=1e-5)
    # goodput: the second missed its SLO (0 tokens): residuals ±20/3 → se = 4/3
    assert row["goodput_tokens_per_s_log_se"] == pytest.approx(t1 * 4 / 3, rel=1e-5)
    # at concurrency 2 the two requests ran together: one cluster, no interval
    two = summarize(run_dir, workload="chat", arm="spec", concurrency=2, warmup_steps=1)
    assert two["output_tokens_per_s_log_se"] is None and two["tpot_p50_log_se"] > 0
    # a step with a single success has nothing to resample: the columns stay empty
    lines = (run_dir / "requests.jsonl").read_text().splitlines()
    (run_dir / "requests.jsonl").write_text("\n".join(lines[:2]) + "\n")
    one = summarize(run_dir, workload="chat", arm="spec", concurrency=2, warmup_steps=1)
    assert one["tpot_p50_log_se"] is None


def test_no_measured_window_means_no_row(run_dir):
    info = json.loads((run_dir / "run.json").read_text())
    info["steps"] = info["steps"][:1]
    (run_dir / "run.json").write_text(json.dumps(info))
    assert summarize(run_dir, workload="chat", arm="spec", concurrency=2, warmup_steps=1) is None


def test_tokens_of_a_one_token_answer_count_when_it_ends_inside(run_dir):
    req = read_requests(run_dir / "requests.jsonl")
    assert len(req) == 4  # the torn line is skipped
    one = req.iloc[[1]].assign(ttft_ms=100, e2el_ms=100, output_tokens=1)  # ends at 102.6
    assert tokens_in(one, 102, 103) == 1 and tokens_in(one, 103, 104) == 0


def test_engine_round_figures_from_a_real_exposition():
    def exposition(draft_s, verify_s, rounds, drafts, generated, k):
        reg = CollectorRegistry()
        eng = {"model_name": "m", "drafter": "d"}
        h = Histogram(N.SPEC_DRAFT_TIME.name, "", list(N.ENGINE_LABELS), registry=reg)
        h.labels(**eng).observe(draft_s)
        h = Histogram(N.SPEC_VERIFY_TIME.name, "", list(N.ENGINE_LABELS), registry=reg)
        h.labels(**eng).observe(verify_s)
        Counter(N.SPEC_ROUNDS.name, "", list(N.ENGINE_LABELS), registry=reg) \
            .labels(**eng).inc(rounds)
        c = Counter(N.SPEC_NUM_DRAFTS.name, "", list(N.REQUEST_LABELS), registry=reg)
        c.labels(workload="chat", **eng).inc(drafts * 0.75)
        c.labels(workload="code", **eng).inc(drafts * 0.25)
        Counter(N.GENERATION_TOKENS.name, "", list(N.REQUEST_LABELS), registry=reg) \
            .labels(workload="chat", **eng).inc(generated)
        Gauge(N.SPEC_K.name, "", list(N.ENGINE_LABELS), registry=reg).labels(**eng).set(k)
        return engine_metrics.parse(generate_latest(reg).decode())

    a = exposition(1.0, 2.0, 100, 200, 300, 4)
    b = exposition(1.5, 3.0, 150, 400, 500, 5)
    got = engine_metrics.round_figures(a, b, speculative=True)
    assert got["rounds"] == 50 and got["k"] == 5
    assert got["draft_ms_per_round"] == pytest.approx(500 / 50)
    assert got["verify_ms_per_round"] == pytest.approx(1000 / 50)
    assert got["mean_batch"] == pytest.approx(200 / 50)  # Δdrafts per round
    base = engine_metrics.round_figures(a, b, speculative=False)
    assert base["mean_batch"] == pytest.approx(200 / 50) and base["k"] is None  # Δtokens
    # a vLLM-style exposition has none of these: figures are absent, not zero
    none = engine_metrics.parse("vllm:num_requests_running 3\n")
    assert engine_metrics.round_figures(none, none, True)["draft_ms_per_round"] is None
