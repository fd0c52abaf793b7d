"""OpenTelemetry traces from a live server, read back from its JSON-lines trace file.

Proves: one SERVER span per request with GenAI semantic-convention attributes that match the
response; under it one ``spec.round`` span per round the request took part in — their
attributes add up to the response's ``spec`` object, including the request's last round and
under concurrency — each carrying the round's draft and verify milliseconds and spanning
exactly their sum; a client ``traceparent`` continues the client's trace; a client that
disconnects leaves an ERROR span; prompt text appears in no span unless ``trace_content``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import requests

from live_server import MODEL, LiveServer, make_server, wait_until

CANARY = "zebra-canary-7391"


def read_spans(live: LiveServer, path: Path, wait_for: str | None = None,
               tokens: int | None = None) -> list[dict]:
    """Flushed spans. With ``wait_for`` (a response id), until that request's server span is
    written and, with ``tokens``, its round spans account for that many completion tokens:
    the client can read the end of a response a moment before the server span ends and the
    engine thread has traced the last round."""
    def spans():
        live.server.round_tracer.flush()  # round spans are built off the engine thread
        live.server.provider.force_flush()
        return [json.loads(line) for line in path.read_text().splitlines()]

    def settled():
        now = spans()
        roots = [s for s in now if s["attributes"].get("gen_ai.response.id") == wait_for]
        if not roots or tokens is None:
            return bool(roots)
        rounds = children(now, roots[0], "spec.round") + children(now, roots[0], "spec.decode")
        return sum(r["attributes"]["spec.emitted"] for r in rounds) == tokens - 1
    if wait_for:
        wait_until(settled, 10)
    return spans()


@pytest.fixture(scope="module")
def traced(pair, tmp_path_factory):
    path = tmp_path_factory.mktemp("traces") / "spans.jsonl"
    with LiveServer(make_server(pair, trace_file=path, max_num_seqs=4)) as live:
        yield live, path


def server_span(spans: list[dict], response_id: str) -> dict:
    found = [s for s in spans if s["attributes"].get("gen_ai.response.id") == response_id]
    assert len(found) == 1, f"{len(found)} server spans for {response_id}"
    return found[0]


def children(spans: list[dict], parent: dict, name: str | None = None) -> list[dict]:
    sid = parent["context"]["span_id"]
    return [s for s in spans if s["parent_id"] == sid and (name is None or s["name"] == name)]


def check_rounds(spans: list[dict], root: dict, spec: dict, completion_tokens: int) -> None:
    rounds = children(spans, root, "spec.round")
    assert rounds, "no spec.round spans under the request"
    assert all(r["attributes"]["spec.k_proposed"] or "spec.draft_error" in r["attributes"]
               for r in rounds)
    plain = children(spans, root, "spec.decode")  # runs of rounds without drafts
    assert all(p["attributes"]["spec.rounds"] >= 1 and not p["attributes"]["spec.k_proposed"]
               for p in plain)
    rounds += plain
    attrs = [r["attributes"] for r in rounds]
    assert sum(a["spec.k_proposed"] for a in attrs) == spec["draft_tokens"]
    assert sum(a["spec.accepted"] for a in attrs) == spec["accepted_tokens"]
    assert sum(1 for a in attrs if a["spec.k_proposed"]) == spec["drafts"]
    assert sum(a["spec.emitted"] for a in attrs) == completion_tokens - 1  # 1st from prefill
    for r, a in zip(rounds, attrs):
        assert r["context"]["trace_id"] == root["context"]["trace_id"]
        assert a["spec.batch_size"] >= 1 and a["spec.accepted"] <= a["spec.k_proposed"]
        assert a["spec.draft_ms"] >= 0 and a["spec.verify_ms"] > 0
        assert a["spec.bonus"] == (a["spec.k_proposed"] > 0
                                   and a["spec.accepted"] == a["spec.k_proposed"])
        assert children(spans, r) == []  # one span per round: the phases are attributes
        assert "spec.network_ms" not in a  # the draft is co-located


def test_server_span_per_request_with_genai_attributes(traced):
    live, path = traced
    resp = live.post("/v1/completions", {"model": MODEL, "prompt": "hello there",
                                         "max_tokens": 12, "temperature": 0.7, "top_p": 0.9,
                                         "seed": 3, "ignore_eos": True}).json()
    span = server_span(read_spans(live, path, resp["id"]), resp["id"])
    assert span["name"] == f"text_completion {MODEL}"
    assert span["kind"] == "SpanKind.SERVER"
    assert span["status"]["status_code"] == "UNSET"
    a = span["attributes"]
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.request.temperature"] == 0.7 and a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.request.max_tokens"] == 12 and a["gen_ai.request.seed"] == 3
    assert a["gen_ai.usage.input_tokens"] == resp["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == resp["usage"]["completion_tokens"] == 12
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["spectest.spec.draft_tokens"] == resp["spec"]["draft_tokens"]


def test_round_spans_add_up_to_the_spec_object(traced):
    live, path = traced
    resp = live.post("/v1/completions", {"model": MODEL, "prompt": "def f(x):",
                                         "max_tokens": 20, "temperature": 0,
                                         "ignore_eos": True}).json()
    spans = read_spans(live, path, resp["id"], 20)
    check_rounds(spans, server_span(spans, resp["id"]), resp["spec"], 20)


def test_streamed_chat_rounds_add_up(traced):
    live, path = traced
    with requests.post(live.url + "/v1/chat/completions", stream=True, timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith(b"data: {")]
    last = events[-1]
    spans = read_spans(live, path, last["id"], last["usage"]["completion_tokens"])
    root = server_span(spans, last["id"])
    assert root["name"] == f"chat {MODEL}"
    check_rounds(spans, root, last["spec"], last["usage"]["completion_tokens"])


def test_concurrent_requests_get_their_own_rounds(traced):
    live, path = traced
    results = {}

    def one(i):
        results[i] = live.post("/v1/completions", {
            "model": MODEL, "prompt": f"item {i}:", "max_tokens": 16 + 4 * i,
            "ignore_eos": True, "speculative": i != 2}).json()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for resp in results.values():
        spans = read_spans(live, path, resp["id"], resp["usage"]["completion_tokens"])
    batch_sizes = set()
    for resp in results.values():
        root = server_span(spans, resp["id"])
        if resp["spec"]["drafts"]:
            check_rounds(spans, root, resp["spec"], resp["usage"]["completion_tokens"])
        rounds = children(spans, root, "spec.round") + children(spans, root, "spec.decode")
        batch_sizes |= {r["attributes"]["spec.batch_size"] for r in rounds}
        if not resp["spec"]["speculative"]:  # one span for its whole run of plain rounds
            assert [r["name"] for r in rounds] == ["spec.decode"]
            assert rounds[0]["attributes"]["spec.emitted"] == resp["usage"][
                "completion_tokens"] - 1
    assert max(batch_sizes) > 1, "the requests never shared a round"


def test_client_traceparent_continues_the_trace(traced):
    live, path = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    resp = live.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 6},
                     headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}).json()
    spans = read_spans(live, path, resp["id"], resp["usage"]["completion_tokens"])
    root = server_span(spans, resp["id"])
    assert root["context"]["trace_id"] == "0x" + trace_id
    assert root["parent_id"] == "0x" + parent_id
    assert all(s["context"]["trace_id"] == "0x" + trace_id
               for s in children(spans, root, "spec.round"))
    # without a traceparent each request starts its own trace
    other = live.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2}).json()
    alone = server_span(read_spans(live, path, other["id"]), other["id"])
    assert alone["parent_id"] is None and alone["context"]["trace_id"] != "0x" + trace_id


def test_disconnected_client_leaves_an_error_span(traced):
    live, path = traced
    with requests.post(live.url + "/v1/completions", stream=True, timeout=60, json={
            "model": MODEL, "prompt": "long", "max_tokens": 200, "ignore_eos": True,
            "stream": True}) as r:
        lines = r.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith(b"data: "))[6:])
    # the connection is closed; the server notices, cancels and ends the span

    span = server_span(read_spans(live, path, wait_for=first["id"]), first["id"])
    assert span["status"]["status_code"] == "ERROR"
    assert "disconnect" in span["status"]["description"]


def send_canaries(live: LiveServer, path: Path) -> list[dict]:
    """A completion and a streamed chat carrying CANARY everywhere a client can put text;
    returns the spans once both server spans are written."""
    first = live.post("/v1/completions", {"model": MODEL, "prompt": f"secret {CANARY}",
                                          "max_tokens": 3, "stop": [CANARY], "user": CANARY},
                      headers={"X-Spectest-Workload": CANARY}).json()
    streamed = live.post("/v1/chat/completions", {
        "model": MODEL, "max_tokens": 3, "stream": True,
        "messages": [{"role": "system", "content": CANARY}, {"role": "user", "content": CANARY}]})
    chat_id = json.loads(streamed.text.split("\n")[0][6:])["id"]
    read_spans(live, path, wait_for=first["id"])
    return read_spans(live, path, wait_for=chat_id)


def test_prompt_text_is_not_in_spans_by_default(traced):
    live, path = traced
    spans = send_canaries(live, path)
    assert sum(s["kind"] == "SpanKind.SERVER" for s in spans) >= 2
    text = path.read_text()
    assert CANARY not in text
    assert "secret" not in text


def test_trace_content_puts_the_prompt_in_spans(pair, tmp_path):
    path = tmp_path / "spans.jsonl"
    with LiveServer(make_server(pair, trace_file=path, trace_content=True)) as live:
        spans = send_canaries(live, path)
    inputs = [s["attributes"].get("gen_ai.input.messages") for s in spans
              if s["kind"] == "SpanKind.SERVER"]
    assert len(inputs) == 2 and all(CANARY in m for m in inputs)
    assert json.loads(inputs[1]) == [{"role": "system", "content": CANARY},
                                     {"role": "user", "content": CANARY}]
