"""Prometheus metrics of a live server, scraped from ``/metrics`` and parsed.

Proves: every metric of ``names.ALL`` is exposed with its type and labels (colons intact);
the spec-decode counters equal the sums of the per-response ``spec`` objects (per position too)
over a mix of speculative and non-speculative, streamed and plain, concurrent requests, and the
other counters and histograms agree with the responses' ``usage``; the gauges show load while a
request runs and return to zero; ``X-Spectest-Workload`` maps onto the bounded label set; no
prompt text or request id ever becomes a label value.
"""

from __future__ import annotations

import collections
import json
import threading

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from live_server import MODEL, LiveServer, make_server, metric_sum, scrape, wait_until
from spectest.telemetry import names as N

SPEC_COUNTERS = {"drafts": N.SPEC_NUM_DRAFTS, "draft_tokens": N.SPEC_NUM_DRAFT_TOKENS,
                 "accepted_tokens": N.SPEC_NUM_ACCEPTED_TOKENS}


@pytest.fixture(scope="module")
def live(pair):
    with LiveServer(make_server(pair, max_num_seqs=4, max_model_len=512)) as live:
        yield live


def test_every_named_metric_is_exposed_with_its_type_and_labels(live):
    live.post("/v1/completions", {"model": MODEL, "prompt": "warm up", "max_tokens": 4})
    text = live.get("/metrics").text
    assert live.get("/metrics").headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for spec in N.ALL:
        fam = families.get(spec.name)
        assert fam is not None, f"{spec.name} is not exposed"
        assert fam.type == spec.kind, spec.name
        assert fam.samples, f"{spec.name} has no series"
        for sample in fam.samples:
            assert set(spec.labels) <= set(sample.labels), (spec.name, sample.labels)
    # (``*_created`` series exist unless disable_created_metrics() ran, as `spectest serve`
    # does — test_server_cli checks the real command exposes none)
    ours = {name for name in families
            if name.startswith(N.PREFIX) and not name.endswith("_created")}
    assert ours == {spec.name for spec in N.ALL}, "metrics outside the name table"


def run_mix(live) -> list[dict]:
    """Eight concurrent requests — speculative or not, streamed or not, chat or completion —
    and their final usage + spec objects."""
    finals: list[dict] = []
    lock = threading.Lock()

    def one(i: int):
        speculative, stream, chat = i % 3 != 0, i % 2 == 0, i % 4 == 1
        body = {"model": MODEL, "max_tokens": 6 + 3 * i, "ignore_eos": True,
                "speculative": speculative, "temperature": 0 if i < 4 else 0.8, "seed": i}
        if chat:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user",
                                                                "content": f"q{i}"}]
        else:
            path, body["prompt"] = "/v1/completions", f"request number {i}"
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        resp = live.post(path, body)
        assert resp.status_code == 200
        if stream:
            events = [json.loads(line[6:]) for line in resp.text.split("\n")
                      if line.startswith("data: {")]
            final = events[-1]
        else:
            final = resp.json()
        with lock:
            finals.append(final)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(finals) == 8
    return finals


def delta(after: dict, before: dict, name: str, **labels) -> float:
    return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)


def test_spec_counters_equal_the_sum_of_spec_objects(live):
    before = scrape(live.url)
    finals = run_mix(live)
    specs = [f["spec"] for f in finals]
    want = {key: sum(s[key] for s in specs) for key in SPEC_COUNTERS}
    per_pos = collections.Counter()
    for s in specs:
        per_pos.update({str(p): n for p, n in enumerate(s["accepted_per_position"])})

    def counters_caught_up():  # the engine traces a round just after its tokens go out
        now = scrape(live.url)
        return all(delta(now, before, spec.sample_name) == want[key]
                   for key, spec in SPEC_COUNTERS.items())
    assert wait_until(counters_caught_up, 10)
    after = scrape(live.url)
    for key, spec in SPEC_COUNTERS.items():
        assert delta(after, before, spec.sample_name) == want[key], key
    assert want["drafts"] > 0 and want["accepted_tokens"] > 0
    for pos, n in per_pos.items():
        assert delta(after, before, N.SPEC_NUM_ACCEPTED_PER_POS.sample_name, position=pos) == n
    # accepted length per request-round: one sample per draft, sum = accepted + drafts
    assert delta(after, before, N.SPEC_ACCEPTED_LENGTH.name + "_count") == want["drafts"]
    assert delta(after, before, N.SPEC_ACCEPTED_LENGTH.name + "_sum") == \
        want["accepted_tokens"] + want["drafts"]
    usage = [f["usage"] for f in finals]
    assert delta(after, before, N.GENERATION_TOKENS.sample_name) == \
        sum(u["completion_tokens"] for u in usage)
    assert delta(after, before, N.PROMPT_TOKENS.sample_name) == \
        sum(u["prompt_tokens"] for u in usage)
    assert delta(after, before, N.REQUEST_SUCCESS.sample_name, finished_reason="length") == 8
    n_spec = sum(s["speculative"] for s in specs)
    assert delta(after, before, N.SPEC_REQUESTS.sample_name, speculative="true") == n_spec
    assert delta(after, before, N.SPEC_REQUESTS.sample_name, speculative="false") == 8 - n_spec
    for hist in (N.TTFT, N.E2E, N.QUEUE, N.PREFILL, N.DECODE, N.TPOT):
        assert delta(after, before, hist.name + "_count") == 8, hist.name
    assert delta(after, before, N.ITL.name + "_count") > 0
    assert delta(after, before, N.SPEC_ROUNDS.sample_name) > 0
    assert metric_sum(after, N.SPEC_K.name) == 4


def test_gauges_show_load_then_return_to_zero(live):
    seen = []
    with requests.post(live.url + "/v1/completions", stream=True, timeout=60, json={
            "model": MODEL, "prompt": "go", "max_tokens": 400, "ignore_eos": True,
            "stream": True, "speculative": False}) as resp:
        for i, _line in enumerate(resp.iter_lines()):
            if i == 20:
                now = scrape(live.url)
                seen.append((metric_sum(now, N.RUNNING.name), metric_sum(now, N.KV_USAGE.name)))
    running, kv = seen[0]
    assert running == 1 and 0 < kv < 1
    assert wait_until(lambda: metric_sum(scrape(live.url), N.RUNNING.name) == 0, 10)
    idle = scrape(live.url)
    assert metric_sum(idle, N.WAITING.name) == 0 and metric_sum(idle, N.KV_USAGE.name) == 0


@pytest.mark.parametrize("header,label", [("code", "code"), ("CHAT", "chat"), ("Rag ", "rag"),
                                          ("audit", "audit"), ("no-such-workload", "other"),
                                          ("", "other"), (None, "none")])
def test_workload_header_maps_to_the_bounded_label(live, header, label):
    headers = {} if header is None else {"X-Spectest-Workload": header}
    before = scrape(live.url)
    resp = live.post("/v1/completions", {"model": MODEL, "prompt": "w", "max_tokens": 3},
                     headers=headers)
    assert resp.status_code == 200
    after = scrape(live.url)
    assert delta(after, before, N.REQUEST_SUCCESS.sample_name, workload=label) == 1
    assert delta(after, before, N.GENERATION_TOKENS.sample_name, workload=label) == 3


def test_label_values_stay_bounded_and_free_of_prompt_text(live):
    canary = "zebra-canary-7391"
    ids = []
    for i in range(20):
        resp = live.post("/v1/completions", {"model": MODEL, "prompt": f"{canary} {i}",
                                             "max_tokens": 2, "user": canary, "stop": [canary]},
                         headers={"X-Spectest-Workload": f"{canary}-{i}"})
        ids.append(resp.json()["id"])
    live.post("/v1/completions", {"model": canary, "prompt": canary})  # a 404 naming it
    text = live.get("/metrics").text
    assert canary not in text
    assert not any(rid in text for rid in ids)
    samples = scrape(live.url)
    values = collections.defaultdict(set)
    for _name, labels in samples:
        for key, value in labels:
            values[key].add(value)
    assert values["workload"] <= set(N.WORKLOADS)
    assert values["model_name"] == {MODEL} and values["drafter"] == {"draft-model"}
    assert values["finished_reason"] <= set(N.FINISHED_REASONS)
    assert values["speculative"] <= {"true", "false"}
    assert all(p.isdigit() for p in values["position"])
    assert set(values) <= {"workload", "model_name", "drafter", "finished_reason", "speculative",
                           "position", "code", "le"}
