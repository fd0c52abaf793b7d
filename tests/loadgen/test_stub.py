"""The stub server keeps the serving contract and its own schedule (it is the test's truth)."""

import json
import urllib.error
import urllib.request

import pytest


def call(url, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_bad_requests_get_openai_errors(stub):
    url = stub()
    status, text = call(url, "/v1/chat/completions",
                        {"model": "stub-model", "messages": [], "bogus": 1})
    assert status == 400
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"} and "bogus" in err["message"]
    status, text = call(url, "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and "other" in json.loads(text)["error"]["message"]


def test_models_health_and_a_non_streaming_answer(stub):
    url = stub("--ttft-ms", "0", "--itl-ms", "0", "--model", "m1")
    assert json.loads(call(url, "/v1/models")[1])["data"][0]["id"] == "m1"
    assert call(url, "/health")[0] == 200
    status, text = call(url, "/v1/completions", {"model": "m1", "prompt": "a b", "max_tokens": 6})
    body = json.loads(text)
    assert status == 200 and body["usage"]["completion_tokens"] == 6
    spec = body["spec"]
    expected = 1 + spec["accepted_tokens"] / spec["drafts"]
    assert spec["mean_accepted_length"] == pytest.approx(expected)


def test_schedule_is_cumulative_and_rounds_add_up(stub):
    url = stub("--ttft-ms", "30", "--itl-ms", "10", "--spec-k", "2", "--accept-prob", "0.5")
    status, _ = call(url, "/v1/chat/completions", {
        "model": "stub-model", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 40, "stream": True})
    [t] = json.loads(call(url, "/stub/timings")[1])
    sent, per_chunk = t["chunk_sent_at"], t["tokens_per_chunk"]
    assert status == 200 and sum(per_chunk) == 40 and max(per_chunk) <= 3
    assert t["spec"]["drafts"] == len(sent) - 1
    assert t["spec"]["accepted_tokens"] == 40 - len(sent)
    # the last chunk is due at ttft + (chunks - 1) * itl after arrival: lateness does not add up
    due = 0.030 + 0.010 * (len(sent) - 1)
    assert sent[-1] - t["received_at"] == pytest.approx(due, abs=0.008)


def test_burst_mode_sends_the_same_stream_and_counts_the_same(stub):
    """``--burst`` (capacity benchmarks) writes a response at once: same events, same metrics."""
    bodies, metrics = [], []
    for args in ((), ("--burst",)):
        url = stub("--ttft-ms", "0", "--itl-ms", "0", "--spec-k", "3", "--accept-prob", "0.6",
                   *args)
        status, text = call(url, "/v1/chat/completions", {
            "model": "stub-model", "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": 30, "stream": True, "stream_options": {"include_usage": True}})
        assert status == 200
        events = [json.loads(line[5:]) for line in text.split("\n")
                  if line.startswith("data: {")]
        for ev in events:
            ev.pop("stub_sent_at", None)
            ev.pop("created", None)
        bodies.append(events)
        metrics.append(sorted(line for line in call(url, "/metrics")[1].splitlines()
                              if line.startswith(("spectest:spec_decode",
                                                  "spectest:generation_tokens"))
                              and "_created" not in line))
        assert text.rstrip().endswith("data: [DONE]")
    assert bodies[0] == bodies[1]
    assert metrics[0] == metrics[1] and any("accepted_tokens" in m for m in metrics[0])
