"""Fuzzing both generation endpoints of a live server: no input yields a 5xx or kills it.

Bodies come from the JSON schema of the pydantic request models (so valid requests reach the
engine, streaming included) and then get one random mutation (see ``schema_strategies``), with
random ``X-Spectest-Workload`` and ``traceparent`` headers. Every answer must be a 2xx whose
body or stream is well formed, or a 4xx with an OpenAI error body; after the run the server is
healthy, has no request left running or waiting, and counted no 500. The case counts are
printed (``pytest -s``).
"""

from __future__ import annotations

import collections
import json

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from live_server import MODEL, LiveServer, make_server, metric_sum, scrape, wait_until
from schema_strategies import fuzz_request, from_schema
from spectest.server.schemas import ChatCompletionRequest, CompletionRequest

EXAMPLES = 150  # per endpoint
CTX = 96  # keeps every valid generation short
# short generations; None (the server's default: the rest of the context) about 1 time in 8
SHORT = st.integers(-1, 6).map(lambda n: None if n < 0 else n)
OVERRIDES = {
    "model": st.sampled_from([MODEL] * 5 + ["", "gpt-4o", MODEL.upper()]),  # mostly ours
    "max_tokens": SHORT, "max_completion_tokens": SHORT.map(lambda n: n or None),
    # prompts that mostly tokenize to something (ids below 256 exist in any vocabulary)
    "prompt": st.text(min_size=1, max_size=40) | st.lists(st.integers(0, 255), min_size=1,
                                                           max_size=24)
    | st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=1),
}
ENDPOINTS = {
    "/v1/completions": from_schema(CompletionRequest.model_json_schema(), OVERRIDES),
    "/v1/chat/completions": from_schema(ChatCompletionRequest.model_json_schema(), OVERRIDES),
}


@pytest.fixture(scope="module")
def live(pair, tmp_path_factory):
    trace = tmp_path_factory.mktemp("fuzz") / "spans.jsonl"
    with LiveServer(make_server(pair, max_model_len=CTX, max_num_seqs=4, trace_file=trace)) \
            as live:
        yield live


def check_answer(resp: requests.Response) -> None:
    assert resp.status_code < 500, resp.text[:500]
    if resp.status_code >= 400:
        err = resp.json()["error"]
        assert err["message"] and err["type"]
        return
    assert resp.status_code == 200
    if resp.headers["Content-Type"].startswith("text/event-stream"):
        lines = [line for line in resp.iter_lines() if line.startswith(b"data: ")]
        assert lines and lines[-1] == b"data: [DONE]"
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert not [e for e in events if "error" in e], events
        finals = [c for e in events for c in e["choices"] if c.get("finish_reason")]
        assert len(finals) == 1 and finals[0]["finish_reason"] in ("stop", "length")
    else:
        body = resp.json()
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        assert body["usage"]["completion_tokens"] >= 0


# The live server's tracer draws span ids from ``random`` on its own thread while hypothesis
# generates data here; hypothesis mistakes that for a strategy using ``random``.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_fuzz_never_5xx(live, path):
    seen: collections.Counter = collections.Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=fuzz_request(ENDPOINTS[path]))
    def one_case(case):
        mutation, raw, headers = case
        with requests.post(live.url + path, data=raw, headers=headers, timeout=60,
                           stream=True) as resp:
            seen[(mutation, resp.status_code)] += 1
            check_answer(resp)

    one_case()
    total = sum(seen.values())
    by_status = collections.Counter()
    for (_, status), n in seen.items():
        by_status[status] += n
    print(f"\nfuzz {path}: {total} cases, by status {dict(sorted(by_status.items()))}, "
          f"valid bodies answered 200: {seen[('valid', 200)]}")
    assert total >= EXAMPLES
    assert by_status[200] >= 10, "the fuzzer never reached the engine"
    assert sum(n for s, n in by_status.items() if 400 <= s < 500) >= 10
    assert live.healthy()
    samples = scrape(live.url)
    assert metric_sum(samples, "spectest:request_errors_total", code="500") == 0
    assert wait_until(lambda: live.server.engine.scheduler.counts() == (0, 0), 10)
    assert set(v for (n, lab), v in samples.items()
               if n == "spectest:request_success_total" and ("finished_reason", "error") in lab
               ) == {0.0}
