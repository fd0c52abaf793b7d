"""The per-request JSONL and the per-step CSV contract (what the report module reads)."""

import json

import numpy as np
import pandas as pd
import pytest

from spectest.loadgen.client import StreamResult
from spectest.loadgen.results import COLUMNS, ResultsSink, request_row
from spectest.loadgen.scrape import Snapshot, SpecCounters


def result(t, workload="chat", ok=True, ttft=0.1, tpot=0.01, n=11, spec=None, chunks=None):
    e2el = ttft + tpot * (n - 1)
    if not ok:
        return StreamResult(ok=False, workload=workload, record_id="r", turn=0, started_at=t,
                            status=503, error="HTTP 503: busy")
    chunks = chunks or n
    return StreamResult(ok=True, workload=workload, record_id="r", turn=0, started_at=t,
                        status=200, ttft_s=ttft, e2el_s=e2el, tpot_s=tpot,
                        itl_s=tuple([(e2el - ttft) / (chunks - 1)] * (chunks - 1)),
                        chunks=chunks, output_tokens=n, usage_reported=True, spec=spec)


def row(r, slo_ok=True):
    return request_row(r, worker="w1", speculative="on", slo_ok=slo_ok)


def snap(t, **by_workload):
    counters = {w: SpecCounters(*v) for w, v in by_workload.items()}
    total = SpecCounters()
    for c in counters.values():
        total = total + c
    return Snapshot(t, "spectest", {**counters, "all": total})


@pytest.fixture
def sink(tmp_path):
    return ResultsSink(tmp_path / "out", speculative="on", run_info={"host": "h"})


def test_rows_go_to_the_step_they_were_sent_in(sink, tmp_path):
    sink.begin_step(2, None, snap(100.0, chat=(0, 0, 0, ())), at=100.0)
    sink.add([row(result(100.5)), row(result(109.9))])
    sink.begin_step(4, None, snap(110.0, chat=(10, 40, 20, (8, 6, 4, 2))), at=110.0)
    sink.add([row(result(110.1)), row(result(105.0))])  # a straggler from step 0 arrives late
    sink.finish(snap(120.0, chat=(30, 120, 90, (28, 24, 20, 18))))
    lines = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 0, 1, 0]
    df = pd.read_csv(tmp_path / "out" / "steps.csv")
    assert list(df.columns) == COLUMNS + [f"acceptance_pos_{i}" for i in range(4)]
    all_rows = df[df.workload == "all"].set_index("step")
    assert all_rows.loc[0, "requests"] == 3 and all_rows.loc[1, "requests"] == 1
    assert all_rows.loc[0, "users"] == 2 and all_rows.loc[1, "users"] == 4
    assert all_rows.loc[0, "duration_s"] == pytest.approx(10.0)
    # server figures are the counter deltas between the step's boundaries
    assert all_rows.loc[0, "acceptance_rate"] == pytest.approx(20 / 40)
    assert all_rows.loc[1, "acceptance_rate"] == pytest.approx(70 / 80)
    assert all_rows.loc[1, "mean_accepted_length"] == pytest.approx(1 + 70 / 20)
    assert all_rows.loc[1, "acceptance_pos_3"] == pytest.approx(16 / 20)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["status"] == "finished" and len(run["steps"]) == 2 and run["host"] == "h"


def test_a_workload_whose_counters_moved_without_a_new_request_still_gets_its_row(sink, tmp_path):
    """A long RAG request starts in step 0 and finishes in step 1, where no RAG request
    starts: the accepted tokens it adds in step 1 are on a (step 1, rag) row, so the sum over
    steps equals the server's growth (test_locust_bundled[mixed] lost them: 600 vs 833)."""
    sink.begin_step(2, None, snap(100.0, chat=(0, 0, 0, ()), rag=(0, 0, 0, ())), at=100.0)
    sink.add([row(result(100.5)), row(result(101.0, workload="rag"))])
    sink.begin_step(3, None, snap(110.0, chat=(5, 20, 10, ()), rag=(4, 16, 6, ())), at=110.0)
    sink.add([row(result(111.0))])
    sink.finish(snap(120.0, chat=(9, 36, 18, ()), rag=(10, 40, 16, ())))
    df = pd.read_csv(tmp_path / "out" / "steps.csv")
    rag = df[df.workload == "rag"].set_index("step")
    assert list(rag.index) == [0, 1] and rag.loc[1, "requests"] == 0
    assert rag.accepted_tokens.sum() == 16 and rag.loc[1, "accepted_tokens"] == 10
    assert df[df.workload == "all"].accepted_tokens.sum() == 34
    assert "code" not in set(df.workload)  # only the run's own workloads get rows


def test_percentiles_rates_and_goodput(sink, tmp_path):
    rng = np.random.default_rng(0)
    ttfts, tpots = rng.uniform(0.05, 0.5, 200), rng.uniform(0.005, 0.05, 200)
    sink.begin_step(8, None, None, at=0.0)
    rows = [row(result(1.0 + i * 0.01, ttft=a, tpot=b), slo_ok=a < 0.3)
            for i, (a, b) in enumerate(zip(ttfts, tpots))]
    rows += [row(result(2.0, ok=False)) for _ in range(5)]
    sink.add(rows)
    sink.finish(None)
    df = pd.read_csv(tmp_path / "out" / "steps.csv")
    r = df[df.workload == "chat"].iloc[0]
    for p in (50, 90, 99):
        assert r[f"ttft_p{p}_ms"] == pytest.approx(np.percentile(ttfts * 1e3, p), abs=1e-3)
        assert r[f"tpot_p{p}_ms"] == pytest.approx(np.percentile(tpots * 1e3, p), abs=1e-3)
    assert r.requests == 205 and r.failures == 5
    duration = r.duration_s  # to the last byte (the CSV keeps it to the millisecond)
    last_byte = max(1.0 + i * 0.01 + a + b * 10 for i, (a, b) in enumerate(zip(ttfts, tpots)))
    assert duration == pytest.approx(last_byte, abs=1e-3)
    assert r.requests_per_s == pytest.approx(200 / duration, rel=1e-3)
    assert r.output_tokens == 200 * 11
    assert r.output_tokens_per_s == pytest.approx(2200 / duration, rel=1e-3)
    assert r.goodput_rps == pytest.approx((ttfts < 0.3).sum() / duration, rel=1e-3)
    assert r.slo_attainment == pytest.approx((ttfts < 0.3).mean())
    assert pd.isna(r.acceptance_rate)  # no /metrics: empty, not zero


def test_per_workload_rows_client_acceptance_and_tokens_per_chunk(sink, tmp_path):
    spec = {"drafts": 4, "draft_tokens": 16, "accepted_tokens": 8}
    sink.begin_step(2, None, None, at=0.0)
    sink.add([row(result(1.0, "rag", spec=spec, n=13, chunks=5)),
              row(result(1.0, "code", n=11))])
    sink.flush()
    df = pd.read_csv(tmp_path / "out" / "steps.csv").set_index("workload")
    assert list(df.index) == ["code", "rag", "all"]
    assert df.loc["rag", "client_acceptance_rate"] == pytest.approx(0.5)
    assert df.loc["rag", "client_mean_accepted_length"] == pytest.approx(3.0)
    assert df.loc["rag", "tokens_per_chunk"] == pytest.approx(13 / 5)
    assert df.loc["all", "tokens_per_chunk"] == pytest.approx(24 / 16)
    assert pd.isna(df.loc["code", "client_acceptance_rate"])


def test_files_are_complete_before_the_run_ends(sink, tmp_path):
    """An interrupted run keeps what it measured: every flush leaves readable files."""
    sink.begin_step(1, None, None, at=0.0)
    for i in range(3):
        sink.add([row(result(float(i)))])
        sink.flush()
        df = pd.read_csv(tmp_path / "out" / "steps.csv")
        assert df[df.workload == "all"].requests.item() == i + 1
        assert len((tmp_path / "out" / "requests.jsonl").read_text().splitlines()) == i + 1
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "running"
    assert not list((tmp_path / "out").glob(".*.tmp"))
    sink.finish(None, status="interrupted")
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "interrupted"


def test_request_row_keeps_every_chunk_gap_in_ms():
    r = row(result(5.0, n=4, ttft=0.02, tpot=0.005))
    assert r["ttft_ms"] == 20.0 and r["tpot_ms"] == 5.0 and r["itl_ms"] == [5.0, 5.0, 5.0]
    assert r["e2el_ms"] == 35.0 and r["slo_ok"] is True and r["speculative"] == "on"
    failed = row(result(5.0, ok=False))
    assert failed["slo_ok"] is False and failed["error"] == "HTTP 503: busy"


def vllm_snap(t, drafts, draft_tokens, accepted):
    """vLLM's counters: no workload label, so only the "all" entry."""
    return Snapshot(t, "vllm", {"all": SpecCounters(drafts, draft_tokens, accepted, ())})


def test_workload_rows_take_acceptance_from_the_responses_where_counters_cannot_say(sink,
                                                                                    tmp_path):
    """vLLM's counters have no workload label: each workload's row sums its responses'
    per-request stats (``metrics.speculative_decoding``, normalised into ``spec``), the all
    row keeps the counter deltas, and the two agree when every request finished in the step."""
    sink.begin_step(2, None, vllm_snap(100.0, 0, 0, 0), at=100.0)
    sink.add([row(result(100.5, spec={"drafts": 4, "draft_tokens": 16, "accepted_tokens": 8})),
              row(result(101.0, workload="code",
                         spec={"drafts": 6, "draft_tokens": 24, "accepted_tokens": 18}))])
    sink.finish(vllm_snap(110.0, 10, 40, 26))
    df = pd.read_csv(tmp_path / "out" / "steps.csv").set_index("workload")
    assert df.loc["chat", "acceptance_source"] == "responses"
    assert df.loc["chat", "acceptance_rate"] == pytest.approx(8 / 16)
    assert df.loc["code", "mean_accepted_length"] == pytest.approx(1 + 18 / 6)
    assert df.loc["all", "acceptance_source"] == "vllm"
    assert df.loc[["chat", "code"], "accepted_tokens"].sum() == df.loc["all", "accepted_tokens"]
    assert df.acceptance_note.isna().all()


def test_a_workload_row_without_acceptance_says_why(sink, tmp_path):
    """A vLLM started without per-request stats: the workload rows say what to do instead of
    an unexplained '-'; llama.cpp's timings give a rate but no rounds."""
    from spectest.loadgen.results import summary_line
    sink.begin_step(1, None, vllm_snap(100.0, 0, 0, 0), at=100.0)
    sink.add([row(result(100.5))])
    sink.finish(vllm_snap(110.0, 5, 20, 10))
    rows = {r["workload"]: r for r in sink.rows()}
    assert rows["all"]["acceptance_rate"] == pytest.approx(0.5)
    assert rows["chat"]["acceptance_rate"] is None
    assert "--per-request-spec-decode-metrics summary" in rows["chat"]["acceptance_note"]
    assert "--per-request-spec-decode-metrics" in summary_line(rows["chat"])

    other = ResultsSink(tmp_path / "llama", speculative="on", run_info={})
    llama = Snapshot(100.0, "llamacpp", {"all": SpecCounters(0, 0, 0, ())})
    other.begin_step(1, None, llama, at=100.0)
    other.add([row(result(100.5, spec={"drafts": None, "draft_tokens": 10,
                                       "accepted_tokens": 7}))])
    other.finish(Snapshot(110.0, "llamacpp", {"all": SpecCounters(3, 10, 7, ())}))
    rows = {r["workload"]: r for r in other.rows()}
    assert rows["chat"]["acceptance_rate"] == pytest.approx(0.7)
    assert rows["chat"]["mean_accepted_length"] is None
    assert "no draft rounds per request" in rows["chat"]["acceptance_note"]
    assert "(from responses)" in summary_line(rows["chat"])
