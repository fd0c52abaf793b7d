"""An OpenAI-compatible SSE stub server that streams tokens on a known, stamped schedule.

It exists to test and benchmark the load generator without a model: the first token leaves
``ttft`` after the request arrives and one decode *round* leaves every ``itl`` after that,
scheduled against cumulative time (no drift). Under speculation a round carries the accepted
drafts plus one token in one SSE chunk; acceptance is drawn per position with probability
``accept_prob`` from a seeded RNG, so counters and per-response ``spec`` objects agree exactly.

``--burst`` (capacity benchmarks) writes each response's events in one write and adds its
metrics once: the least a server can cost per request, so that the client saturates first.

Every event carries ``stub_sent_at`` (the stub's monotonic clock just before the write) and
``GET /stub/timings`` returns, per response id, the arrival time and the send time of every
token chunk — the ground truth the timing-accuracy test and the capacity benchmark compare the
client against (nominal sleeps are not trusted: asyncio wakes ~1 ms late).

``/metrics`` exposes the spec-decode counters as one flavour's row in ``spectest.flavours``
names and labels them — spectest's own, vLLM's (``vllm:`` prefix, ``engine`` label) or SGLang's
(a mean accepted length gauge instead of counters) — so the scraper can be tested against each.
It is a test double for the serving contract in docs/ARCHITECTURE.md, not a server to deploy.

    python -m spectest.loadgen.stub --port 0 --ttft-ms 20 --itl-ms 5 --metrics spectest
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError

from spectest import flavours
from spectest.loops import run_loop
from spectest.telemetry import names as N

MetricsFlavour = Literal["spectest", "vllm", "sglang"]  # the flavours the stub can imitate


@dataclass(frozen=True)
class StubConfig:
    ttft_s: float = 0.02
    itl_s: float = 0.005
    output_tokens: int = 0  # 0: serve the request's max_tokens
    spec_k: int = 4  # draft tokens per round when speculating (0: never speculate)
    accept_prob: float = 0.7
    speculative_default: bool = True
    model: str = "stub-model"
    drafter: str = "stub-drafter"
    metrics: MetricsFlavour = "spectest"
    seed: int = 0
    keep_timings: int = 20000
    # Faults of third-party servers, for the client's tests: a request field answered with a
    # 400, streams without `usage`, streams cut off after N token chunks (connection closed).
    refuse_field: str = ""
    no_usage: bool = False
    drop_after_chunks: int = 0
    metrics_delay_s: float = 0.0  # a busy server: /metrics answers this late
    # Capacity benchmarks: every event of a response in one write, metrics added once per
    # response — the least a server can cost per request, so the client is what saturates.
    burst: bool = False


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    speculative: bool | None = None
    stop: str | list[str] | None = None
    user: str | None = None


class _ChatRequest(_Common):
    messages: list[_Message]
    max_completion_tokens: int | None = None


class _CompletionRequest(_Common):
    prompt: str | list[str]


class _Metrics:
    """The stub's counters named and labelled as a flavour's row says, on an injected
    registry: the four spec-decode counters and generated tokens, or (a row with an
    ``accept_length_gauge``) SGLang's two gauges instead."""

    def __init__(self, cfg: StubConfig, registry: CollectorRegistry):
        self.cfg, self.registry = cfg, registry
        self.flavour = f = flavours.get(cfg.metrics)
        self.gauges = bool(f.accept_length_gauge)
        self.sum_len = self.rounds = 0
        # label values by label name: the engine index is vLLM's (one engine here)
        self._values = {"model_name": cfg.model, "drafter": cfg.drafter, "engine": "0"}
        if self.gauges:
            self.accept_length = Gauge(f.accept_length_gauge, "Mean accept length.",
                                       list(f.labels), registry=registry)
            self.accept_rate = Gauge(f.accept_rate_gauge, "Accept rate (bonus counted).",
                                     list(f.labels), registry=registry)
            return

        def counter(spec: N.MetricSpec, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f.samples[spec.name].removesuffix("_total"), spec.help,
                           list(f.labels + extra), registry=registry)

        self.running = (Gauge(f.samples[N.RUNNING.name], N.RUNNING.help,
                              [x for x in f.labels if x != "workload"], registry=registry)
                        .labels(*(self._values[x] for x in f.labels if x != "workload"))
                        if N.RUNNING.name in f.samples else None)
        self.drafts = counter(N.SPEC_NUM_DRAFTS)
        self.draft_tokens = counter(N.SPEC_NUM_DRAFT_TOKENS)
        self.accepted = counter(N.SPEC_NUM_ACCEPTED_TOKENS)
        self.per_pos = counter(N.SPEC_NUM_ACCEPTED_PER_POS, ("position",))
        self.generation = counter(N.GENERATION_TOKENS)

    def _labels(self, workload: str) -> tuple[str, ...]:
        return tuple(workload if label == "workload" else self._values[label]
                     for label in self.flavour.labels)

    def round(self, workload: str, k: int, accepted: int, emitted: int) -> None:
        if self.gauges:
            self.rounds += 1
            self.sum_len += accepted + 1
            lab = self._labels(workload)
            self.accept_length.labels(*lab).set(self.sum_len / self.rounds)
            self.accept_rate.labels(*lab).set(
                self.sum_len / (self.rounds * (self.cfg.spec_k + 1)))
            return
        lab = self._labels(workload)
        self.generation.labels(*lab).inc(emitted)
        if k:
            self.drafts.labels(*lab).inc()
            self.draft_tokens.labels(*lab).inc(k)
            self.accepted.labels(*lab).inc(accepted)
            for pos in range(accepted):
                self.per_pos.labels(*lab, str(pos)).inc()

    def response(self, workload: str, k: int, chunks: list[tuple[int, int]], tokens: int) -> None:
        """A whole response's chunks at once (burst mode): the same totals as chunk by chunk."""
        if self.gauges:
            for n, accepted in chunks:
                if accepted >= 0:
                    self.round(workload, k, accepted, n)
            return
        lab = self._labels(workload)
        self.generation.labels(*lab).inc(tokens)
        if not k:
            return
        rounds = [a for _, a in chunks if a >= 0]
        if rounds:
            self.drafts.labels(*lab).inc(len(rounds))
            self.draft_tokens.labels(*lab).inc(k * len(rounds))
            self.accepted.labels(*lab).inc(sum(rounds))
            for pos in range(max(rounds)):
                hits = sum(1 for a in rounds if a > pos)
                if hits:
                    self.per_pos.labels(*lab, str(pos)).inc(hits)

    def first_token(self, workload: str) -> None:
        if not self.gauges:
            self.generation.labels(*self._labels(workload)).inc()


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


class StubServer:
    def __init__(self, cfg: StubConfig, registry: CollectorRegistry | None = None):
        self.cfg = cfg
        self.registry = registry or CollectorRegistry()
        self.metrics = _Metrics(cfg, self.registry)
        self.timings: deque[dict] = deque(maxlen=cfg.keep_timings)
        self.served = 0
        self._piece_cache: dict[tuple, list[str] | str] = {}

    def _pieces(self, text: str, words: list[str], n_tokens: int) -> list[str]:
        """Each token's JSON-encoded text (the prompt's words, cycled); cached, because a load
        test sends the same few prompts again and again and the stub should cost little."""
        key = (text, n_tokens)
        pieces = self._piece_cache.get(key)
        if pieces is None:
            if len(self._piece_cache) >= 1024:
                self._piece_cache.clear()
            pieces = [json.dumps(words[i % len(words)] + " ") for i in range(n_tokens)]
            self._piece_cache[key] = pieces
        return pieces

    def _burst_body(self, text: str, pieces: list[str], chunks) -> str:
        """Every token chunk's event with the head (id, created) as ``\\x01`` and the end
        (send stamp) as ``\\x02`` — JSON escapes both in text; cached when there is one token
        per chunk (no speculation: the same for every request with this prompt)."""
        key = (text, len(pieces), "body")
        if len(chunks) == len(pieces) and key in self._piece_cache:
            return self._piece_cache[key]
        body = "".join(f"\x01{piece}\x02" for piece in _merged(pieces, chunks))
        if len(chunks) == len(pieces):
            self._piece_cache[key] = body
        return body

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.post("/v1/chat/completions", self.chat), web.post("/v1/completions", self.complete),
            web.get("/v1/models", self.models), web.get("/health", self.health),
            web.get("/metrics", self.metrics_text), web.get("/stub/timings", self.get_timings),
        ])
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.cfg.model, "object": "model", "owned_by": "spectest-stub"}]})

    async def metrics_text(self, request: web.Request) -> web.Response:
        if self.cfg.metrics_delay_s:
            await asyncio.sleep(self.cfg.metrics_delay_s)
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    async def get_timings(self, request: web.Request) -> web.Response:
        out = list(self.timings)
        if request.query.get("clear"):
            self.timings.clear()
        return web.json_response(out)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        with self._running():
            return await self._serve(request, _ChatRequest, chat=True)

    async def complete(self, request: web.Request) -> web.StreamResponse:
        with self._running():
            return await self._serve(request, _CompletionRequest, chat=False)

    @contextlib.contextmanager
    def _running(self):
        """The running-requests gauge (where the imitated flavour has one): up while a
        request is served."""
        gauge = getattr(self.metrics, "running", None)
        if gauge is not None:
            gauge.inc()
        try:
            yield
        finally:
            if gauge is not None:
                gauge.dec()

    async def _serve(self, request: web.Request, model, chat: bool) -> web.StreamResponse:
        received = time.monotonic()
        raw = await request.read()
        if self.cfg.refuse_field and self.cfg.refuse_field in json.loads(raw or b"{}"):
            return _error(400, f"Unsupported param: {self.cfg.refuse_field}")
        try:
            req = model.model_validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            return _error(400, f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
        if req.model != self.cfg.model:
            return _error(404, f"model {req.model!r} not found", "NotFoundError")
        workload = request.headers.get("X-Spectest-Workload", "none")
        workload = workload if workload in N.WORKLOADS else "other"
        if chat:
            text = req.messages[-1].content
            max_tokens = req.max_completion_tokens or req.max_tokens or 16
        else:
            text = req.prompt if isinstance(req.prompt, str) else " ".join(req.prompt)
            max_tokens = req.max_tokens or 16
        n_tokens = self.cfg.output_tokens or max_tokens
        speculative = self.cfg.speculative_default if req.speculative is None else req.speculative
        k = self.cfg.spec_k if speculative else 0
        self.served += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-stub{self.served}"
        rng = random.Random(f"{self.cfg.seed}:{self.served}")
        words = text.split() or ["token"]
        pieces = self._pieces(text, words, n_tokens)
        chunks = _plan_rounds(n_tokens, k, self.cfg.accept_prob, rng)
        if not req.stream:
            return await self._non_streaming(rid, chat, pieces, chunks, k, workload, received,
                                             speculative)
        sse_headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        burst: list[bytes] | None = [] if self.cfg.burst else None
        if burst is None:
            resp = web.StreamResponse(headers=sse_headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            send = resp.write
        else:  # one plain response with every event in its body, sent at the end
            async def send(data: bytes) -> None:
                burst.append(data)
        created = int(time.time())
        if chat:
            head = (f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{created},'
                    f'"model":"{self.cfg.model}","choices":[{{"index":0,"delta":{{')
            await send(f'{head}"role":"assistant","content":""}},"finish_reason":null}}],'
                       f'"stub_sent_at":{time.monotonic():.6f}}}\n\n'.encode())
            head += '"content":'
            tail = '},"finish_reason":null}],"stub_sent_at":'
        else:
            head = (f'data: {{"id":"{rid}","object":"text_completion","created":{created},'
                    f'"model":"{self.cfg.model}","choices":[{{"index":0,"text":')
            tail = ',"finish_reason":null}],"stub_sent_at":'
        sent, due = [], received + self.cfg.ttft_s
        if burst is not None:  # every token chunk at once, one stamp: the cheapest stream
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            stamp = time.monotonic()
            end = f"{tail}{stamp:.6f}}}\n\n"
            burst.append(self._burst_body(text, pieces, chunks)
                         .replace("\x01", head).replace("\x02", end).encode())
            sent = [stamp] * len(chunks)
            chunks_left = ()
        else:
            chunks_left = chunks
        for (n, accepted), piece in zip(chunks_left, _merged(pieces, chunks_left)):
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.cfg.drop_after_chunks and len(sent) >= self.cfg.drop_after_chunks:
                request.transport.close()  # a dropped stream: no terminating chunk
                return resp
            stamp = time.monotonic()
            sent.append(stamp)
            await resp.write(f"{head}{piece}{tail}{stamp:.6f}}}\n\n".encode())
            due += self.cfg.itl_s
            if accepted < 0:
                self.metrics.first_token(workload)
            else:
                self.metrics.round(workload, k, accepted, n)
        spec = _spec_object(chunks, k, speculative, self.cfg.drafter)
        usage = {"prompt_tokens": len(words), "completion_tokens": n_tokens,
                 "total_tokens": len(words) + n_tokens}
        end_choice = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
                      else {"index": 0, "text": "", "finish_reason": "length"})
        obj = "chat.completion.chunk" if chat else "text_completion"
        base = {"id": rid, "object": obj, "created": created, "model": self.cfg.model}
        last = {**base, "choices": [end_choice], "spec": spec}
        tail_events = [last]
        if req.stream_options and req.stream_options.include_usage and not self.cfg.no_usage:
            tail_events.append({**base, "choices": [], "usage": usage, "spec": spec})
        for ev in tail_events:
            await send(f"data: {json.dumps(ev)}\n\n".encode())
        await send(b"data: [DONE]\n\n")
        if burst is None:
            await resp.write_eof()
        else:
            self.metrics.response(workload, k, chunks, n_tokens)
            resp = web.Response(body=b"".join(burst), headers=sse_headers)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.timings.append({"id": rid, "received_at": received, "chunk_sent_at": sent,
                             "tokens_per_chunk": [n for n, _ in chunks],
                             "completion_tokens": n_tokens, "workload": workload, "spec": spec,
                             "traceparent": request.headers.get("traceparent", ""),
                             "client_port": peer[1] if peer else None})
        return resp

    async def _non_streaming(self, rid, chat, pieces, chunks, k, workload, received, speculative):
        await asyncio.sleep(max(0.0, received + self.cfg.ttft_s
                                + self.cfg.itl_s * (len(chunks) - 1) - time.monotonic()))
        for n, accepted in chunks:
            (self.metrics.first_token(workload) if accepted < 0
             else self.metrics.round(workload, k, accepted, n))
        text = "".join(json.loads(p) for p in pieces)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": "length"} if chat
                  else {"index": 0, "text": text, "finish_reason": "length"})
        return web.json_response({
            "id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.cfg.model, "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(pieces),
                      "total_tokens": len(pieces)},
            "spec": _spec_object(chunks, k, speculative, self.cfg.drafter)})


def _merged(pieces: list[str], chunks: list[tuple[int, int]]) -> list[str]:
    """Each chunk's text, JSON-encoded: one piece, or the chunk's pieces joined."""
    if all(n == 1 for n, _ in chunks):  # one token per chunk
        return pieces[:len(chunks)]
    out, idx = [], 0
    for n, _ in chunks:
        out.append(pieces[idx] if n == 1 else
                   json.dumps("".join(json.loads(p) for p in pieces[idx:idx + n])))
        idx += n
    return out


def _plan_rounds(n_tokens: int, k: int, p: float, rng: random.Random) -> list[tuple[int, int]]:
    """(tokens in chunk, accepted drafts) per chunk; the first (prefill) chunk has -1."""
    if k == 0:  # no speculation: a token a round, no draws
        return [(1, -1)] + [(1, 0)] * (n_tokens - 1)
    out, left = [(1, -1)], n_tokens - 1
    while left > 0:
        accepted = 0
        while accepted < k and rng.random() < p:
            accepted += 1
        accepted = min(accepted, left - 1)
        out.append((accepted + 1, accepted))
        left -= accepted + 1
    return out


def _spec_object(chunks, k: int, speculative: bool, drafter: str) -> dict:
    drafts = sum(1 for _, a in chunks if a >= 0) if k else 0
    accepted = sum(a for _, a in chunks if a > 0) if k else 0
    return {"drafts": drafts, "draft_tokens": drafts * k, "accepted_tokens": accepted,
            "mean_accepted_length": (1 + accepted / drafts) if drafts else None,
            "speculative": speculative, "drafter": drafter if k else None}


async def _serve_forever(server: StubServer, host: str, port: int) -> None:
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # the real port when --port 0
    print(f"spectest stub listening on http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectest.loadgen.stub",
                                 description="OpenAI-compatible SSE stub with stamped timings.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--output-tokens", type=int, default=0)
    ap.add_argument("--spec-k", type=int, default=4)
    ap.add_argument("--accept-prob", type=float, default=0.7)
    ap.add_argument("--no-speculative-default", action="store_true")
    ap.add_argument("--model", default="stub-model")
    ap.add_argument("--metrics", choices=list(MetricsFlavour.__args__), default="spectest")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--refuse-field", default="", help="fault: 400 when the body has this field")
    ap.add_argument("--no-usage", action="store_true", help="fault: never send usage")
    ap.add_argument("--drop-after-chunks", type=int, default=0,
                    help="fault: close the connection after N token chunks")
    ap.add_argument("--metrics-delay-ms", type=float, default=0.0,
                    help="fault: answer /metrics this late (a busy server)")
    ap.add_argument("--burst", action="store_true",
                    help="write each response's events in one write (capacity benchmarks)")
    a = ap.parse_args(argv)
    if a.ttft_ms < 0 or a.itl_ms < 0 or a.spec_k < 0 or not 0 <= a.accept_prob <= 1:
        print("stub: delays and --spec-k must be >= 0 and --accept-prob in [0, 1]", file=sys.stderr)
        return 2
    cfg = StubConfig(ttft_s=a.ttft_ms / 1e3, itl_s=a.itl_ms / 1e3, output_tokens=a.output_tokens,
                     spec_k=a.spec_k, accept_prob=a.accept_prob,
                     speculative_default=not a.no_speculative_default, model=a.model,
                     metrics=a.metrics, seed=a.seed, refuse_field=a.refuse_field,
                     no_usage=a.no_usage, drop_after_chunks=a.drop_after_chunks,
                     metrics_delay_s=a.metrics_delay_ms / 1e3, burst=a.burst)
    try:
        run_loop(_serve_forever(StubServer(cfg), a.host, a.port))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        print(f"stub: cannot listen on {a.host}:{a.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
