"""``telemetry.metrics.ServingMetrics`` fed synthetic round records and request stats.

Proves the collectors follow vLLM's semantics exactly — num_drafts +1 per request per round
with drafts, per-position counters +1 for each of the first n_accepted positions, rows with
K = 0 count nothing, accepted length = accepted + 1 — that TPOT is decode / (n − 1), that the
registry holds exactly the name table (type, labels, buckets), that rarely hit series exist at
zero from start-up, that no tag a client sends can add a label value, and that rounds and
token gaps queued on the engine thread reach every reader of the registry (a scrape,
``get_sample_value``), are folded on the spot when the queue fills, and never overwrite a
newer load reading.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from spectest.engine.requests import RequestStats, RoundRecord, RowRecord
from spectest.telemetry import names as N
from spectest.telemetry.metrics import ServingMetrics

MODEL, DRAFTER = "m", "draft-model"
ENGINE = {"model_name": MODEL, "drafter": DRAFTER}


def labels(workload: str = "none", **extra) -> dict:
    return {**ENGINE, "workload": workload, **extra}


def value(reg: CollectorRegistry, spec: N.MetricSpec, suffix: str = "", **lab) -> float:
    name = spec.sample_name if not suffix else spec.name + suffix
    got = reg.get_sample_value(name, lab)
    return 0.0 if got is None else got


def record(rows, k=4, draft=0.002, verify=0.005, index=0) -> RoundRecord:
    return RoundRecord(index, 1000.0, len(rows), k, "fixed", draft, verify, tuple(rows),
                       DRAFTER, running=len(rows), waiting=2, kv_usage=0.25)


def row(rid="r1", tag="chat", k=4, accepted=2) -> RowRecord:
    return RowRecord(rid, tag, k, accepted, k > 0 and accepted == k, accepted + 1, k > 0)


@pytest.fixture
def reg_metrics():
    reg = CollectorRegistry()
    return reg, ServingMetrics(reg, MODEL, DRAFTER)


def test_registry_holds_exactly_the_name_table(reg_metrics):
    reg, m = reg_metrics
    for spec in N.ALL:  # one series each, so every histogram shows its buckets
        m.c[spec.name].labels(**{name: "x" for name in spec.labels})
    families = {m.name: m for m in reg.collect()}
    for spec in N.ALL:
        # prometheus_client strips _total from counter family names, as the table does
        fam = families[spec.name]
        assert fam.type == spec.kind
        assert fam.documentation == spec.help
        for sample in fam.samples:
            if not sample.name.endswith("_created"):
                assert set(spec.labels) <= set(sample.labels)
        if spec.kind == "histogram":
            les = sorted({float(s.labels["le"]) for s in fam.samples if "le" in s.labels})
            assert les[:-1] == list(spec.buckets) and les[-1] == float("inf")
    assert {n for n in families} == {spec.name for spec in N.ALL}


def test_round_counters_follow_vllm_semantics(reg_metrics):
    reg, m = reg_metrics
    m.observe_round(record([row("a", "chat", 4, 2), row("b", "code", 4, 4),
                            row("c", "chat", 0, 0)]))
    m.observe_round(record([row("a", "chat", 3, 0)], k=3, index=1))
    chat, code = labels("chat"), labels("code")
    assert value(reg, N.SPEC_NUM_DRAFTS, **chat) == 2  # rounds a took part in with drafts
    assert value(reg, N.SPEC_NUM_DRAFTS, **code) == 1
    assert value(reg, N.SPEC_NUM_DRAFT_TOKENS, **chat) == 7
    assert value(reg, N.SPEC_NUM_ACCEPTED_TOKENS, **chat) == 2
    assert value(reg, N.SPEC_NUM_ACCEPTED_TOKENS, **code) == 4
    assert [value(reg, N.SPEC_NUM_ACCEPTED_PER_POS, **chat, position=str(p))
            for p in range(4)] == [1, 1, 0, 0]
    assert [value(reg, N.SPEC_NUM_ACCEPTED_PER_POS, **code, position=str(p))
            for p in range(4)] == [1, 1, 1, 1]
    # accepted length = accepted + 1 per request-round with drafts
    assert value(reg, N.SPEC_ACCEPTED_LENGTH, "_count", **chat) == 2
    assert value(reg, N.SPEC_ACCEPTED_LENGTH, "_sum", **chat) == 3 + 1
    assert value(reg, N.SPEC_ACCEPTED_LENGTH, "_bucket", **code, le="5.0") == 1
    assert value(reg, N.SPEC_ACCEPTED_LENGTH, "_bucket", **code, le="4.0") == 0
    assert value(reg, N.SPEC_ROUNDS, **ENGINE) == 2
    assert value(reg, N.SPEC_K, **ENGINE) == 3  # the latest round's K
    assert value(reg, N.SPEC_DRAFT_TIME, "_count", **ENGINE) == 2
    assert value(reg, N.SPEC_VERIFY_TIME, "_sum", **ENGINE) == pytest.approx(0.01)
    assert value(reg, N.RUNNING, **ENGINE) == 1 and value(reg, N.WAITING, **ENGINE) == 2
    assert value(reg, N.KV_USAGE, **ENGINE) == 0.25


def test_rounds_without_drafts_count_no_drafts_and_no_draft_time(reg_metrics):
    reg, m = reg_metrics
    m.observe_round(record([row("a", "chat", 0, 0), row("b", "rag", 0, 0)], k=0))
    for workload in N.WORKLOADS:
        assert value(reg, N.SPEC_NUM_DRAFTS, **labels(workload)) == 0
        assert value(reg, N.SPEC_ACCEPTED_LENGTH, "_count", **labels(workload)) == 0
    assert value(reg, N.SPEC_DRAFT_TIME, "_count", **ENGINE) == 0
    assert value(reg, N.SPEC_VERIFY_TIME, "_count", **ENGINE) == 1
    assert value(reg, N.SPEC_ROUNDS, **ENGINE) == 1


def stats(completion: int, decode: float = 0.9, speculative: bool = True) -> RequestStats:
    return RequestStats(prompt_tokens=7, completion_tokens=completion, arrival_time=0.0,
                        queue_time=0.01, prefill_time=0.02, ttft=0.05, decode_time=decode,
                        e2e=1.0, drafts=3, draft_tokens=12, accepted_tokens=6,
                        accepted_per_pos=(3, 2, 1), speculative=speculative)


def test_request_observation(reg_metrics):
    reg, m = reg_metrics
    m.observe_request("code", stats(10), "length")
    m.observe_request("code", stats(1, decode=0.0, speculative=False), "stop")
    m.observe_request("code", stats(4), "weird-reason")
    code = labels("code")
    assert value(reg, N.PROMPT_TOKENS, **code) == 21
    assert value(reg, N.GENERATION_TOKENS, **code) == 15
    assert value(reg, N.E2E, "_count", **code) == 3
    # TPOT = decode / (n - 1), only when there are at least two tokens
    assert value(reg, N.TPOT, "_count", **code) == 2
    assert value(reg, N.TPOT, "_sum", **code) == pytest.approx(0.9 / 9 + 0.9 / 3)
    assert value(reg, N.REQUEST_SUCCESS, **code, finished_reason="length") == 1
    assert value(reg, N.REQUEST_SUCCESS, **code, finished_reason="stop") == 1
    assert value(reg, N.REQUEST_SUCCESS, **code, finished_reason="error") == 1
    assert value(reg, N.SPEC_REQUESTS, **code, speculative="true") == 2
    assert value(reg, N.SPEC_REQUESTS, **code, speculative="false") == 1
    m.observe_first_token("code", 0.05)
    m.observe_token_gap("code", 0.003)
    assert value(reg, N.TTFT, "_count", **code) == 1
    assert value(reg, N.ITL, "_bucket", **code, le="0.005") == 1
    m.observe_error(429)
    assert value(reg, N.REQUEST_ERRORS, **ENGINE, code="429") == 1


def test_rarely_hit_series_exist_at_zero_from_start(reg_metrics):
    reg, _ = reg_metrics
    for workload in N.WORKLOADS:
        lab = labels(workload)
        assert reg.get_sample_value(N.SPEC_NUM_DRAFTS.sample_name, lab) == 0
        assert reg.get_sample_value(N.SPEC_NUM_ACCEPTED_PER_POS.sample_name,
                                    {**lab, "position": "0"}) == 0
        for reason in N.FINISHED_REASONS:
            assert reg.get_sample_value(N.REQUEST_SUCCESS.sample_name,
                                        {**lab, "finished_reason": reason}) == 0
    for code in ("400", "401", "404", "429", "500", "503"):
        assert reg.get_sample_value(N.REQUEST_ERRORS.sample_name, {**ENGINE, "code": code}) == 0


@settings(max_examples=200, deadline=None, database=None)
@given(tags=st.lists(st.text(max_size=30), min_size=1, max_size=10))
def test_no_client_tag_adds_a_label_value(tags):
    reg = CollectorRegistry()
    m = ServingMetrics(reg, MODEL, DRAFTER)
    for i, tag in enumerate(tags):
        workload = m.workload_of(tag)
        assert workload in N.WORKLOADS
        m.observe_round(record([row(f"r{i}", workload, 2, 1)]))
        m.observe_request(workload, stats(3), "stop")
    seen = {s.labels.get("workload") for fam in reg.collect() for s in fam.samples}
    assert seen - {None} <= set(N.WORKLOADS)


def test_queued_rounds_reach_every_way_of_reading_the_registry():
    """Rounds and token gaps are queued on the engine thread and folded in a batch: any
    collection of the registry (``get_sample_value``, a scrape) folds them first, so a reader
    never sees fewer rounds than were observed before it read."""
    reg = CollectorRegistry()
    m = ServingMetrics(reg, MODEL, DRAFTER, max_pending=1000)
    for i in range(5):
        m.observe_round(record([row("a", "code", 4, 3)], index=i))
        m.observe_token_gap("code", 0.003)
    assert len(m._pending) == 10  # nothing folded yet
    assert value(reg, N.SPEC_NUM_ACCEPTED_TOKENS, **labels("code")) == 15
    assert value(reg, N.ITL, "_count", **labels("code")) == 5
    assert not m._pending
    m.observe_round(record([row("a", "code", 4, 4)]))
    text = generate_latest(reg).decode()  # what /metrics serves
    assert f'{N.SPEC_NUM_ACCEPTED_TOKENS.sample_name}{{drafter="{DRAFTER}",model_name="{MODEL}",' \
           'workload="code"} 19.0' in text


def test_a_full_queue_is_folded_on_the_spot():
    reg = CollectorRegistry()
    m = ServingMetrics(reg, MODEL, DRAFTER, max_pending=4)
    for i in range(9):
        m.observe_round(record([row("a", "chat", 2, 1)], index=i))
    assert len(m._pending) == 1  # folded at 4 and at 8
    assert m.c[N.SPEC_NUM_DRAFTS.name].labels(**labels("chat"))._value.get() == 8


def test_the_load_gauges_show_the_newest_reading_after_a_flush(reg_metrics):
    """The server's scrape flushes the queue, then sets the load it reads now: the queued
    rounds' older load readings must not overwrite it."""
    reg, m = reg_metrics
    m.observe_round(record([row("a"), row("b")]))  # running 2, waiting 2
    m.flush()
    m.set_load(running=7, waiting=0, kv_usage=0.5)
    assert value(reg, N.RUNNING, **ENGINE) == 7 and value(reg, N.WAITING, **ENGINE) == 0
