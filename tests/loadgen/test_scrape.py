"""Scraping spec-decode counters in spectest, vLLM and SGLang dialects, and window deltas."""

import json
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from spectest.loadgen.scrape import ALL, Scraper, SpecCounters, acceptance, parse_metrics
from spectest.telemetry import names as N


def exposition(prefix, labels, rows, extra_label=None):
    """rows: {label values: (drafts, draft_tokens, accepted, [per-pos])} → Prometheus text."""
    reg = CollectorRegistry()
    mk = lambda spec, more=(): Counter(N.renamed(spec, prefix), "h", list(labels) + list(more),
                                       registry=reg)
    drafts, tokens = mk(N.SPEC_NUM_DRAFTS), mk(N.SPEC_NUM_DRAFT_TOKENS)
    acc = mk(N.SPEC_NUM_ACCEPTED_TOKENS)
    pos = mk(N.SPEC_NUM_ACCEPTED_PER_POS, ("position",))
    for lv, (d, t, a, per) in rows.items():
        drafts.labels(*lv).inc(d)
        tokens.labels(*lv).inc(t)
        acc.labels(*lv).inc(a)
        for i, v in enumerate(per):
            pos.labels(*lv, str(i)).inc(v)
    return generate_latest(reg).decode()


def test_spectest_counters_by_workload_and_total():
    text = exposition("spectest:", N.REQUEST_LABELS, {
        ("m", "d", "chat"): (10, 40, 20, [8, 6, 4, 2]),
        ("m", "d", "rag"): (5, 20, 15, [5, 4, 3, 3])})
    snap = parse_metrics(text)
    assert snap.source == "spectest"
    assert snap.counters["chat"] == SpecCounters(10, 40, 20, (8, 6, 4, 2))
    assert snap.counters[ALL] == SpecCounters(15, 60, 35, (13, 10, 7, 5))


def test_vllm_counters_have_no_workload_and_sum_over_engines():
    text = exposition("vllm:", ("model_name", "engine"), {
        ("m", "0"): (10, 30, 15, [7, 5, 3]), ("m", "1"): (2, 6, 6, [2, 2, 2])})
    snap = parse_metrics(text)
    assert snap.source == "vllm" and set(snap.counters) == {ALL}
    assert snap.counters[ALL] == SpecCounters(12, 36, 21, (9, 7, 5))


def test_spectest_wins_when_both_are_exposed():
    text = (exposition("vllm:", ("model_name", "engine"), {("m", "0"): (1, 1, 1, [1])})
            + exposition("spectest:", N.REQUEST_LABELS, {("m", "d", "code"): (2, 2, 2, [2])}))
    assert parse_metrics(text).source == "spectest"


def test_sglang_gauge_gives_mean_accepted_length_only():
    reg = CollectorRegistry()
    gauge = Gauge("sglang:spec_accept_length", "h", ["model_name", "tp_rank"], registry=reg)
    gauge.labels("m", "0").set(2.75)
    acc = acceptance(None, parse_metrics(generate_latest(reg).decode()))
    assert acc[ALL].source == "sglang" and acc[ALL].mean_accepted_length == 2.75
    assert acc[ALL].acceptance_rate is None


def test_unknown_server_has_no_figures():
    snap = parse_metrics("# HELP up x\n# TYPE up gauge\nup 1\n")
    assert snap.source == "none" and acceptance(snap, snap) == {}


def test_window_figures_are_counter_deltas():
    labels = N.REQUEST_LABELS
    chat = ("m", "d", "chat")
    start = parse_metrics(exposition("spectest:", labels, {chat: (10, 40, 20, [8, 6, 4, 2])}))
    end = parse_metrics(exposition("spectest:", labels, {chat: (30, 120, 80, [28, 24, 18, 10])}))
    a = acceptance(start, end)["chat"]
    assert (a.drafts, a.draft_tokens, a.accepted) == (20, 80, 60)
    assert a.acceptance_rate == pytest.approx(60 / 80)
    assert a.mean_accepted_length == pytest.approx(1 + 60 / 20)
    assert a.per_position == pytest.approx((1.0, 0.9, 0.7, 0.4))


def test_no_drafts_gives_none_not_zero_and_restart_counts_from_zero():
    labels = N.REQUEST_LABELS
    same = parse_metrics(exposition("spectest:", labels, {("m", "d", "chat"): (10, 40, 20, [8])}))
    a = acceptance(same, same)["chat"]
    assert a.drafts == 0 and a.acceptance_rate is None and a.mean_accepted_length is None
    restarted = parse_metrics(exposition("spectest:", labels, {("m", "d", "chat"): (2, 8, 4, [2])}))
    assert acceptance(same, restarted)["chat"].acceptance_rate == pytest.approx(0.5)


def test_a_server_without_samples_yet_is_a_zero_baseline():
    rag = {("m", "d", "rag"): (4, 16, 8, [4, 4])}
    end = parse_metrics(exposition("spectest:", N.REQUEST_LABELS, rag))
    assert acceptance(parse_metrics(""), end)["rag"].accepted == 8


def post(url, body, workload):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "X-Spectest-Workload": workload})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("flavour", ["spectest", "vllm", "sglang"])
def test_scraping_the_stub_over_http_matches_what_it_served(stub, flavour):
    url = stub("--ttft-ms", "0", "--itl-ms", "0", "--metrics", flavour, "--accept-prob", "0.6")
    scraper = Scraper(url + "/metrics")
    before = scraper.scrape()
    served = {"chat": [], "code": []}
    for i in range(6):
        workload = "chat" if i % 2 else "code"
        body = {"model": "stub-model", "messages": [{"role": "user", "content": "a b c"}],
                "max_tokens": 40}
        served[workload].append(post(url + "/v1/chat/completions", body, workload)["spec"])
    figures = acceptance(before, scraper.scrape())
    total = [s for v in served.values() for s in v]
    drafts = sum(s["drafts"] for s in total)
    accepted = sum(s["accepted_tokens"] for s in total)
    if flavour == "sglang":
        assert figures[ALL].mean_accepted_length == pytest.approx(1 + accepted / drafts)
        return
    assert figures[ALL].drafts == drafts and figures[ALL].accepted == accepted
    draft_tokens = sum(s["draft_tokens"] for s in total)
    assert figures[ALL].acceptance_rate == pytest.approx(accepted / draft_tokens)
    if flavour == "spectest":
        for workload, specs in served.items():
            assert figures[workload].accepted == sum(s["accepted_tokens"] for s in specs)
    else:
        assert set(figures) == {ALL}


def test_scrape_failure_is_reported_not_raised():
    s = Scraper("http://127.0.0.1:9/metrics", timeout=1)
    assert s.scrape() is None and "refused" in s.last_error.lower()
