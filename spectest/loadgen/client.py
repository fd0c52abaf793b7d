"""A gevent-friendly streaming OpenAI client that times every chunk of one completion.

It rides on Locust's ``FastHttpSession`` (geventhttpclient): one request, ``stream=True``,
and the SSE body read with ``resp.stream.readline(b"\\n")`` — the read that hands data to the
client as soon as a line arrives (``iter_lines()`` reads 1 KiB blocks and adds ~95 ms to TTFT,
``readline()``'s default ``b"\\r\\n"`` waits for the whole body) — plus
every further complete line the same socket read already buffered (:func:`_lines`): one call per
read from the socket, not one per event, which was the largest per-event cost left in the
Locust user (a response's 64 events came in about 5 reads). Lines that arrive in one read get
one arrival time: the client could not have seen them apart.
The stream is read to EOF, not abandoned at ``[DONE]``, so the keep-alive connection is reused.

Servers close kept-alive connections (llama-server after every streamed response, although it
answered ``Keep-Alive: timeout=5``; uvicorn under vLLM/SGLang after 5 s idle). A request written
to such a connection fails before a single response byte arrives: the server never read it. That
is not a server failure, so a request that may have gone out on a reused connection and failed
that way (closed/reset, no status line) is resent once on a fresh connection and the reconnect is
counted (``reconnects``); its latencies are measured from the first send, as a user would feel
them. A refused connection, a timeout or a stream that breaks after the headers is never resent.

Timing (client clock, ``time.perf_counter`` — CLOCK_MONOTONIC on Linux, so a server on the
same host can stamp comparable times; vLLM-bench naming):

* TTFT — request sent → first SSE event that carries output text;
* E2EL — request sent → last event that carries output text (not ``[DONE]``);
* TPOT — (E2EL − TTFT) / (N − 1) with N = ``usage.completion_tokens``;
* chunk ITL — the gap between consecutive text-bearing events (one event may hold several
  tokens under speculation, so tokens per chunk = N / chunks).

Each call fires exactly one Locust ``request`` event: name = workload category, response_time
= E2EL in ms, response_length = output tokens. It does not know about datasets, steps or files.
"""

from __future__ import annotations

import errno
import json
import random
import time
from dataclasses import dataclass, field

import orjson
from geventhttpclient.response import HTTPConnectionClosed
from locust.contrib.fasthttp import FastHttpSession

from spectest.flavours import response_stats

HEAD_CHARS = 80
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True)
class CompletionRequest:
    """A ready-to-send request: the body is already JSON-encoded."""

    path: str
    body: bytes
    workload: str
    record_id: str
    turn: int = 0
    keep_text: bool = False  # collect the answer (needed to send a follow-up turn)


@dataclass(frozen=True)
class StreamResult:
    ok: bool
    workload: str
    record_id: str
    turn: int
    started_at: float  # wall clock (time.time()) when the request was sent
    sent_mono: float = 0.0  # the same instant on CLOCK_MONOTONIC (joins server-side stamps)
    status: int = 0
    error: str = ""
    connection_error: bool = False  # refused / reset / closed: the server is not there
    reconnects: int = 0  # resent after the server closed a kept-alive connection unread
    response_id: str = ""
    trace_id: str = ""
    ttft_s: float | None = None
    e2el_s: float | None = None
    tpot_s: float | None = None
    itl_s: tuple[float, ...] = ()
    chunks: int = 0
    output_tokens: int = 0
    prompt_tokens: int | None = None
    usage_reported: bool = False
    spec: dict | None = None
    text: str = field(default="", repr=False)
    head: str = ""  # the output's first HEAD_CHARS characters (outlier reports quote them)

    @property
    def tokens_per_chunk(self) -> float | None:
        return self.output_tokens / self.chunks if self.chunks else None


def build_body(model: str, *, messages: list[dict] | None = None, prompt: str | None = None,
               max_tokens: int, temperature: float, speculative: bool | None,
               extra: dict | None = None) -> bytes:
    """The OpenAI request body (plus spectest's optional ``speculative`` switch)."""
    body: dict = {"model": model}
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    body.update(max_tokens=max_tokens, temperature=temperature, stream=True,
                stream_options={"include_usage": True})
    if speculative is not None:
        body["speculative"] = speculative
    if extra:
        body.update(extra)
    return json.dumps(body).encode()


class TraceIds:
    """W3C trace-context ids; a private RNG so the workload's seeded RNG is untouched."""

    def __init__(self) -> None:
        self._rng = random.Random()

    def traceparent(self) -> tuple[str, str]:
        trace_id = f"{self._rng.getrandbits(128) or 1:032x}"
        return trace_id, f"00-{trace_id}-{self._rng.getrandbits(64) or 1:016x}-01"


def stream_completion(session: FastHttpSession, req: CompletionRequest, *, api_key: str = "",
                      trace: TraceIds | None = None, reused: bool = True) -> StreamResult:
    """Send ``req``, read its stream, fire one Locust request event; ``reused``: the session
    may hold a kept-alive connection from an earlier request (then one resend is allowed)."""
    trace_id, traceparent = (trace or TraceIds()).traceparent()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
               "Accept-Encoding": "identity", "X-Spectest-Workload": req.workload,
               "traceparent": traceparent}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    started_at = time.time()
    t0 = time.perf_counter()
    reconnects = 0
    while True:
        resp = session.request("POST", req.path, name=req.workload, data=req.body,
                               headers=headers, stream=True, catch_response=True)
        error = getattr(resp, "error", None)
        status = getattr(resp, "status_code", 0) or 0
        if status == 0 and reused and not reconnects and closed_unread(error):
            reconnects += 1  # not entering `with resp` fires no Locust event for it
            continue
        break
    base = dict(workload=req.workload, record_id=req.record_id, turn=req.turn,
                started_at=started_at, sent_mono=t0, trace_id=trace_id, reconnects=reconnects)
    with resp:
        if error is not None or status != 200:
            result = StreamResult(ok=False, status=status, connection_error=status == 0,
                                  error=_http_error(resp, status, error), **base)
        else:
            result = _read_stream(resp.stream, t0, req.keep_text, base)
        meta = resp.request_meta
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        meta["response_time"] = result.e2el_s * 1e3 if result.e2el_s is not None else elapsed_ms
        meta["response_length"] = result.output_tokens
        meta["context"] = {**meta.get("context", {}), "record_id": req.record_id,
                           "ttft_ms": None if result.ttft_s is None else result.ttft_s * 1e3}
        if result.ok:
            resp.success()
        else:
            resp.failure(result.error)
    return result


def closed_unread(error: BaseException | None) -> bool:
    """The server closed or reset the connection before answering anything (status 0)."""
    if isinstance(error, (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError)):
        return True
    return isinstance(error, OSError) and error.errno in (errno.ECONNRESET, errno.EPIPE)


def _http_error(resp, status: int, error: Exception | None) -> str:
    if status == 0:
        return f"connection failed: {type(error).__name__}: {error}"
    text = ""
    try:
        text = resp.text or ""
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        text = json.loads(text)["error"]["message"]
    except Exception:
        text = text[:200] if isinstance(text, str) else ""
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def _lines(stream):
    """Yield the body as blocks of whole lines, each as soon as it is in: ``readline`` blocks
    until one line is there, then the complete lines that read also buffered come with it
    (geventhttpclient keeps them in ``_body_buffer``; without that attribute, one line a
    call). At the end, a last line that lacks its newline."""
    readline, rest = stream.readline, stream.read
    buffered = getattr(stream, "_body_buffer", None)
    if not isinstance(buffered, bytearray):
        buffered = None
    while True:
        block = readline(b"\n")
        if not block:
            block = rest()
            if block:
                yield block
            return
        if buffered:
            end = buffered.rfind(b"\n") + 1
            if end:
                block += buffered[:end]
                del buffered[:end]
        yield block


def decode_event(data: bytes):
    """One SSE event's JSON. orjson decodes a token event in ~0.5 µs where ``json.loads``
    takes ~1.7 (a Locust process decodes 60+ a request: measured, it was a fifth of the
    process's time). What orjson refuses and the standard library takes (``NaN``/``Infinity``
    literals, a lone surrogate escape) goes to ``json.loads``. One difference is left: orjson
    reads an integer outside 64 bits as a float — no field of an OpenAI stream (counts,
    timestamps, logprobs) comes near one, and checking every event for long digit runs cost
    more than orjson saved."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode())


def _read_stream(stream, t0: float, keep_text: bool, base: dict) -> StreamResult:
    """Read SSE events to EOF. A stream that breaks midway (connection dropped, a torn event)
    gives a failed result that keeps what arrived: its TTFT, chunks and tokens so far."""
    loads = decode_event
    perf = time.perf_counter
    times: list[float] = []
    pieces: list[str] = []
    usage = spec = None
    response_id = ""
    error = ""
    head_left = HEAD_CHARS
    try:
        for block in _lines(stream):
            now = perf()
            for line in block.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # the blank line, comments (": ping"), event:/id: fields
                data = line[5:].strip()  # also the \r of a CRLF line
                if data == b"[DONE]" or not data:
                    continue
                event = loads(data)
                if "error" in event and event["error"]:
                    err = event["error"]
                    error = ("stream error: "
                             f"{err.get('message', err) if isinstance(err, dict) else err}")
                    continue
                if not response_id:
                    response_id = event.get("id", "")
                if event.get("usage"):
                    usage = event["usage"]
                stats = response_stats(event)  # spectest spec, llama.cpp timings, vLLM metrics
                if stats is not None:
                    spec = {**(event.get("spec") or {}), **stats.as_spec()}
                for choice in event.get("choices") or ():
                    src = choice.get("delta") or choice  # chat delta, or the completions choice
                    text = (src.get("content") or src.get("text")
                            or src.get("reasoning_content") or src.get("reasoning"))
                    if text:
                        times.append(now)
                        if keep_text or head_left > 0:
                            pieces.append(text)
                            head_left -= len(text)
                        break
    except Exception as e:  # socket reset, truncated chunked body, a torn JSON event
        error = (f"stream broken after {len(times)} token chunk(s): "
                 f"{type(e).__name__}: {e}")
        base = {**base, "connection_error": True}
    text = "".join(pieces)
    if error or not times:
        partial = _timed(times, t0, len(times), usage) if times else {}
        return StreamResult(ok=False, status=200, error=error or "no tokens in the stream",
                            response_id=response_id, spec=spec, head=text[:HEAD_CHARS],
                            **partial, **base)
    n = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else len(times)
    return StreamResult(ok=True, status=200, response_id=response_id, spec=spec,
                        text=text if keep_text else "", head=text[:HEAD_CHARS],
                        **_timed(times, t0, n, usage), **base)


def _timed(times: list[float], t0: float, n: int, usage: dict | None) -> dict:
    """The latency fields of a stream whose token chunks arrived at ``times``."""
    ttft, e2el = times[0] - t0, times[-1] - t0
    return dict(ttft_s=ttft, e2el_s=e2el, tpot_s=(e2el - ttft) / (n - 1) if n > 1 else None,
                itl_s=tuple(b - a for a, b in zip(times, times[1:])), chunks=len(times),
                output_tokens=n, prompt_tokens=usage.get("prompt_tokens") if usage else None,
                usage_reported=usage is not None)
