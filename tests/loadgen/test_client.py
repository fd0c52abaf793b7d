"""One streamed completion against the stub: timings, usage, spec, headers, errors, events."""

import json
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
from locust.contrib.fasthttp import FastHttpSession
from locust.event import EventHook

from spectest.loadgen.client import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    CompletionRequest,
    build_body,
    decode_event,
    stream_completion,
)


@pytest.fixture
def events():
    fired = []
    hook = EventHook()
    hook.add_listener(lambda **kw: fired.append(kw))
    return hook, fired


def session(url, hook):
    return FastHttpSession(url, request_event=hook, user=None)


def chat_request(workload="rag", max_tokens=12, speculative=None, model="stub-model"):
    body = build_body(model, messages=[{"role": "user", "content": "one two three"}],
                      max_tokens=max_tokens, temperature=0.0, speculative=speculative)
    return CompletionRequest(CHAT_PATH, body, workload=workload, record_id="rec-1")


def truth(url):
    with urllib.request.urlopen(url + "/stub/timings") as r:
        return {t["id"]: t for t in json.loads(r.read())}


def test_chat_stream_timings_match_the_stub_stamps(stub, events):
    url = stub("--ttft-ms", "40", "--itl-ms", "5", "--spec-k", "3", "--accept-prob", "0.7")
    hook, fired = events
    r = stream_completion(session(url, hook), chat_request(max_tokens=30))
    assert r.ok and r.status == 200 and r.usage_reported and r.output_tokens == 30
    t = truth(url)[r.response_id]
    sent = t["chunk_sent_at"]
    # the role-only first chunk carries no text, so TTFT starts at the first token chunk
    assert r.ttft_s >= 0.040
    assert r.ttft_s == pytest.approx(sent[0] - r.sent_mono, abs=0.005)
    assert r.e2el_s == pytest.approx(sent[-1] - r.sent_mono, abs=0.005)
    assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 29)
    assert r.chunks == len(sent) and len(r.itl_s) == len(sent) - 1
    assert r.tokens_per_chunk == pytest.approx(30 / len(sent)) and r.tokens_per_chunk > 1
    assert r.spec == t["spec"] and r.spec["drafts"] == len(sent) - 1
    # the workload tag and the W3C trace context reached the server
    assert t["workload"] == "rag"
    assert t["traceparent"].startswith(f"00-{r.trace_id}-") and len(t["traceparent"]) == 55
    # one Locust event: name = category, response_length = output tokens, time = E2EL
    [ev] = fired
    assert ev["name"] == "rag" and ev["response_length"] == 30 and ev["exception"] is None
    assert ev["response_time"] == pytest.approx(r.e2el_s * 1e3)


def test_completions_endpoint_and_speculation_off(stub, events):
    url = stub("--ttft-ms", "0", "--itl-ms", "1")
    hook, _ = events
    body = build_body("stub-model", prompt="def add(a, b):", max_tokens=8, temperature=0.0,
                      speculative=False)
    r = stream_completion(session(url, hook),
                          CompletionRequest(COMPLETIONS_PATH, body, workload="code", record_id="x"))
    assert r.ok and r.output_tokens == 8 and r.chunks == 8
    assert r.spec["speculative"] is False and r.spec["drafts"] == 0


def test_the_stream_is_read_to_the_end_so_the_connection_is_reused(stub, events):
    url = stub("--ttft-ms", "0", "--itl-ms", "0")
    hook, _ = events
    s = session(url, hook)
    ids = [stream_completion(s, chat_request()).response_id for _ in range(3)]
    t = truth(url)
    assert len({t[i]["client_port"] for i in ids}) == 1


def test_multi_turn_needs_the_answer_text(stub, events):
    url = stub("--ttft-ms", "0", "--itl-ms", "0", "--spec-k", "0")
    hook, _ = events
    req = chat_request(max_tokens=4)
    r = stream_completion(session(url, hook), CompletionRequest(
        req.path, req.body, req.workload, req.record_id, keep_text=True))
    assert r.text == "one two three one "


def test_http_error_is_a_failure_with_the_servers_message(stub, events):
    url = stub()
    hook, fired = events
    r = stream_completion(session(url, hook), chat_request(model="nope"))
    assert not r.ok and r.status == 404 and not r.connection_error
    assert r.error == "HTTP 404: model 'nope' not found"
    assert fired[0]["exception"] is not None and fired[0]["name"] == "rag"


def test_server_down_is_a_connection_error(events):
    hook, fired = events
    r = stream_completion(session("http://127.0.0.1:9", hook), chat_request())
    assert not r.ok and r.connection_error and r.status == 0 and "refused" in r.error.lower()
    assert fired[0]["exception"] is not None


def test_request_body_is_the_openai_shape_plus_the_speculative_switch():
    body = json.loads(build_body("m", prompt="p", max_tokens=5, temperature=0.5,
                                 speculative=True, extra={"top_k": 4}))
    assert body == {"model": "m", "prompt": "p", "max_tokens": 5, "temperature": 0.5,
                    "stream": True, "stream_options": {"include_usage": True},
                    "speculative": True, "top_k": 4}
    assert "speculative" not in json.loads(build_body("m", prompt="p", max_tokens=5,
                                                      temperature=0, speculative=None))


class FramedSSE:
    """A real aiohttp server on loopback that streams one completion in a given SSE framing:
    ``lf`` (``data: …\\n\\n``, as vLLM, SGLang, llama-server and spectest write), ``crlf``
    (``\\r\\n`` line ends, as sse-starlette does), ``fields`` (``event:``/``id:`` lines and
    ``: ping`` comments inside events), ``torn-end`` (the last event lacks its blank line),
    ``split`` (every event written in two halves, cut inside its JSON, so a line spans two socket
    reads) and ``burst`` (every event after the first in one write: several events per read).
    It pauses 0.3 s after the first token event, so a reader that waits for more than one
    event shows it in TTFT."""

    def __init__(self, framing: str):
        import asyncio
        import threading

        from aiohttp import web
        self.framing, self.web = framing, web
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def events(self) -> list[bytes]:
        chunks = [{"id": "cmpl-1", "object": "text_completion", "choices": [
            {"index": 0, "text": piece, "finish_reason": None}]} for piece in ("a", "b", "c")]
        chunks.append({"id": "cmpl-1", "choices": [], "usage": {
            "prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})
        nl = b"\r\n" if self.framing == "crlf" else b"\n"
        out = []
        for chunk in chunks:
            head = b"event: message" + nl + b"id: 7" + nl if self.framing == "fields" else b""
            out.append(head + b"data: " + json.dumps(chunk).encode() + nl + nl)
            if self.framing == "fields":
                out.append(b": ping" + nl + nl)
        if self.framing == "torn-end":  # no [DONE]; the usage event ends the body, torn
            out[-1] = out[-1][:-1]
        else:
            out.append(b"data: [DONE]" + nl + nl)
        return out

    async def handle(self, request):
        import asyncio
        resp = self.web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = self.events()
        if self.framing == "burst":
            events = events[:1] + [b"".join(events[1:])]
        for i, event in enumerate(events):
            if self.framing == "split":
                await resp.write(event[:len(event) // 2])
                await asyncio.sleep(0.01)
                event = event[len(event) // 2:]
            await resp.write(event)
            await asyncio.sleep(0.3 if i == 0 else 0.01)
        await resp.write_eof()
        return resp

    def __enter__(self) -> str:
        import asyncio
        app = self.web.Application()
        app.router.add_post(COMPLETIONS_PATH, self.handle)
        self.runner = self.web.AppRunner(app)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.runner.setup(), self.loop).result(10)
        site = self.web.TCPSite(self.runner, "127.0.0.1", 0)
        asyncio.run_coroutine_threadsafe(site.start(), self.loop).result(10)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        import asyncio
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.mark.parametrize("framing", ["lf", "crlf", "fields", "torn-end", "split", "burst"])
def test_every_sse_framing_gives_the_same_result_and_ttft(events, framing):
    hook, _ = events
    body = build_body("m", prompt="x", max_tokens=3, temperature=0.0, speculative=None)
    with FramedSSE(framing) as url:
        r = stream_completion(session(url, hook), CompletionRequest(
            COMPLETIONS_PATH, body, workload="code", record_id="x", keep_text=True))
    assert r.ok, r.error
    assert r.text == "abc" and r.chunks == 3 and r.output_tokens == 3
    assert r.usage_reported and r.prompt_tokens == 3
    assert r.ttft_s < 0.25 <= r.e2el_s  # the first event was timed when it came, not later


# --- the event decoder: orjson, and the standard library for what orjson refuses ------------
json_values = st.recursive(  # integers in 64 bits: orjson reads longer ones as floats
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


@given(json_values)
def test_an_event_decodes_exactly_as_the_standard_library_decodes_it(value):
    """Any JSON Python's encoder writes (NaN and ±Infinity literals, lone surrogates escaped)
    decodes to what ``json.loads`` gives, whichever decoder took it."""
    data = json.dumps(value).encode()
    decoded = decode_event(data)
    expected = json.loads(data)
    assert json.dumps(decoded) == json.dumps(expected)  # NaN != NaN: compare the encodings


@pytest.mark.parametrize("data", [b'{"a": NaN}', b'{"t": "\\udcff"}', b'{"x": -Infinity}',
                                  b'{"f": 1e400}', b'{"n": 9223372036854775807}'])
def test_what_orjson_refuses_falls_back_to_the_standard_library(data):
    assert json.dumps(decode_event(data)) == json.dumps(json.loads(data))


def test_a_torn_event_still_raises():
    with pytest.raises(ValueError):
        decode_event(b'{"choices": [{"delta": {"content": "ab')
