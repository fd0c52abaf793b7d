"""The OpenAI-compatible HTTP server in front of the speculative engine.

Owns: routes (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
``/metrics``, ``/openapi.json`` — built by ``server.openapi`` — and ``/admin/speculation``,
handled by ``server.admin``, whose applied changes it feeds to the metrics), SSE streaming,
request → engine
translation (tokenizing, chat template, limits), the per-response ``spec`` object, the
``X-Spectest-Workload`` label, API-key auth, client-disconnect cancellation and graceful drain
on shutdown. A request's metrics and span (W3C trace context included) sit behind one
``RequestTelemetry`` (``server.request_telemetry``) that the handler starts, feeds and ends.

Does not know: how the engine drafts or verifies. It submits :class:`GenerationRequest`s to a
running :class:`SpecEngine` (its own thread) and receives outputs through a thread-safe
callback routed by a :class:`Relay` (``server.relay``: non-streaming outputs reach the loop
once, at the end; a stream's rounds are written by the engine thread itself once the loop has
started the response) into an ``asyncio.Queue`` per request; a streamed response the loop
writes writes every output already queued in one write.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from functools import cached_property

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from pydantic import ValidationError

from spectest.engine.control import SpeculationChange
from spectest.engine.engine import SpecEngine
from spectest.engine.requests import (CapacityError, EngineError, GenerationRequest,
                                      QueueFullError)
from spectest.engine.tokenizer import ChatTemplateError
from spectest.http_errors import APIError, error_middleware, validation_error
from spectest.server import responses as R
from spectest.server.admin import Admin
from spectest.server.openapi import openapi_document
from spectest.server.relay import Outbox, Relay, Unsent
from spectest.server.request_telemetry import Telemetry
from spectest.server.schemas import (ChatCompletionRequest, CompletionRequest,
                                     DetokenizeRequest, TokenizeRequest)
from spectest.telemetry import tracing as T
from spectest.telemetry.metrics import ServingMetrics

log = logging.getLogger("spectest.server")
WORKLOAD_HEADER = "X-Spectest-Workload"
MAX_BODY = 4 * 1024 * 1024
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    api_key: str | None = None
    trace_content: bool = False
    drain_seconds: float = 10.0
    retry_after_seconds: int = 1
    admin_key: str | None = None  # None: /admin/* answers loopback peers only
    spec_metrics: str = "summary"  # vLLM-shaped per-request speculation: none|summary|detailed


class Server:
    def __init__(self, engine: SpecEngine, config: ServerConfig, registry: CollectorRegistry,
                 tracer_provider: TracerProvider | None = None):
        self.engine, self.config, self.registry = engine, config, registry
        self.metrics = ServingMetrics(registry, config.model_name, engine.drafter.name)
        engine.add_observer(self.metrics.observe_round)
        control = engine.control
        self.admin = Admin(control, engine.drafter.name, config.admin_key)
        self.metrics.observe_speculation(control.settings().enabled, control.settings().k)
        control.listeners.append(self._speculation_changed)
        self.provider = tracer_provider
        self.round_tracer = None
        if tracer_provider is not None:
            self.round_tracer = T.RoundTracer(tracer_provider, background=True)
            engine.add_observer(self.round_tracer)
        self.telemetry = Telemetry(
            self.metrics, tracer_provider.get_tracer("spectest.server") if tracer_provider
            else None, self.round_tracer, engine.drafter.name, config.trace_content)
        self.active = 0
        self._outbox: Outbox | None = None
        self.direct_writes = self.handbacks = 0  # streamed rounds the engine thread wrote
        self.draining = False
        self.created = int(time.time())

    # --- app ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY,
                              middlewares=[error_middleware(self.metrics.observe_error)])
        app.add_routes([
            web.get("/health", self.health),
            web.get("/metrics", self.metrics_endpoint),
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/openapi.json", self.openapi),
            *self.admin.routes(),
        ])
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._drain)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app):
        if self.engine._thread is None:
            self.engine.start()

    async def _drain(self, app):
        """Refuse new work; let in-flight requests finish for up to ``drain_seconds``, then
        stop the engine so that the rest end with an error event (streams) or a 503 — not
        with a connection cut mid-stream when aiohttp's shutdown timeout cancels them."""
        self.draining = True
        deadline = time.monotonic() + self.config.drain_seconds
        while self.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.active:
            await asyncio.to_thread(self.engine.stop)  # aborts what is left, with an error
            deadline = time.monotonic() + 2.0
            while self.active and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

    def _speculation_changed(self, change: SpeculationChange) -> None:  # engine thread
        self.metrics.observe_speculation(change.new.enabled, change.new.k, change.changed)

    async def _stop(self, app):
        await asyncio.to_thread(self.engine.stop)
        if self.round_tracer is not None:
            await asyncio.to_thread(self.round_tracer.shutdown)  # the last rounds' spans
        if self.provider is not None:
            self.provider.shutdown()

    # --- small endpoints ---------------------------------------------------------------------
    async def health(self, request):
        status = "draining" if self.draining else "ok"
        return web.json_response({"status": status}, status=503 if self.draining else 200)

    async def metrics_endpoint(self, request):
        running, waiting = self.engine.scheduler.counts()
        self.metrics.flush()  # the queued rounds first: their load gauges are older than these
        self.metrics.set_load(running, waiting, self.engine.kv_usage())
        # Always the 0.0.4 text format: prometheus_client's OpenMetrics output rewrites the
        # colons of ``spectest:`` names (prometheus/client_python#1177).
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    async def models(self, request):
        self._auth(request)
        return web.json_response({"object": "list", "data": [{
            "id": self.config.model_name, "object": "model", "created": self.created,
            "owned_by": "spectest", "max_model_len": self.engine.config.scheduler.max_model_len,
            "max_num_seqs": self.engine.config.scheduler.max_num_seqs,
            "kv_budget_tokens": self.engine.config.scheduler.budget,
            "drafter": self.engine.drafter.name}]})

    @cached_property
    def openapi_document(self) -> dict:
        return openapi_document(self.config.model_name, self.engine.tokenizer.vocab_size,
                                api_key=bool(self.config.api_key),
                                admin_key=bool(self.config.admin_key),
                                k_limit=self.engine.control.k_limit)

    async def openapi(self, request):
        self._auth(request)
        return web.json_response(self.openapi_document)

    async def tokenize(self, request):
        """vLLM's ``POST /tokenize``: ``{"model", "prompt"}`` → ``{"tokens", "count"}``."""
        body = await self._parse(request, TokenizeRequest)
        ids = self.engine.tokenizer.encode(body.prompt)
        return web.json_response({"tokens": ids, "count": len(ids),
                                  "max_model_len": self.engine.config.scheduler.max_model_len})

    async def detokenize(self, request):
        """vLLM's ``POST /detokenize``: ``{"model", "tokens"}`` → ``{"prompt"}``."""
        body = await self._parse(request, DetokenizeRequest)
        self._check_ids(body.tokens, "tokens")
        return web.json_response({"prompt": self.engine.tokenizer.decode(
            list(body.tokens), skip_special_tokens=False)})

    def _check_ids(self, ids, param: str) -> None:
        vocab = self.engine.tokenizer.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise APIError(400, f"{param}: token id {bad[0]} is outside the vocabulary "
                           f"(0..{vocab - 1})", "invalid_token", param)

    # --- generation --------------------------------------------------------------------------
    async def completions(self, request):
        body = await self._parse(request, CompletionRequest)
        tok = self.engine.tokenizer
        prompt = body.prompt_value()
        if isinstance(prompt, str):
            ids = tok.encode(prompt)
        else:
            self._check_ids(prompt, "prompt")
            ids = list(prompt)
        if not ids:
            raise APIError(400, "prompt: encodes to zero tokens", "invalid_request", "prompt")
        want_lp = body.logprobs is not None
        gen = self._request(request, body, ids, body.max_tokens, logprobs=body.logprobs,
                            prompt_logprobs=body.echo and want_lp)
        fmt = R.CompletionFormat(tok, self.config.model_name, body, ids, self.engine.drafter.name,
                                 self._spec_metrics)
        return await self._respond(request, body, gen, fmt, "text_completion")

    async def chat_completions(self, request):
        body = await self._parse(request, ChatCompletionRequest)
        tok = self.engine.tokenizer
        try:
            text = tok.apply_chat_template(body.chat_messages(), add_generation_prompt=True)
        except ChatTemplateError as exc:
            raise APIError(400, f"messages: {exc}", "invalid_request", "messages") from None
        ids = tok.encode(text)
        max_tokens = body.wanted_tokens(0) or None
        gen = self._request(request, body, ids, max_tokens,
                            logprobs=(body.top_logprobs or 0) if body.logprobs else None)
        fmt = R.ChatFormat(tok, self.config.model_name, body, self.engine.drafter.name,
                           self._spec_metrics)
        return await self._respond(request, body, gen, fmt, "chat")

    # --- helpers -----------------------------------------------------------------------------
    @property
    def _spec_metrics(self) -> str:
        """vLLM reports per-request speculation only where it speculates: so does spectest."""
        return "none" if self.engine.drafter.name == "none" else self.config.spec_metrics

    def _auth(self, request):
        key = self.config.api_key
        if key and not hmac.compare_digest(  # constant time: no key guessing by timing
                request.headers.get("Authorization", "").encode("utf-8", "surrogatepass"),
                f"Bearer {key}".encode("utf-8", "surrogatepass")):
            raise APIError(401, "missing or invalid API key (Authorization: Bearer <key>)",
                           "invalid_api_key")

    async def _parse(self, request, model):
        self._auth(request)
        if self.draining:
            raise APIError(503, "server is shutting down", "shutting_down")
        try:
            raw = await request.read()
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "request body is not valid JSON", "invalid_json") from None
        except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits() digits
            raise APIError(400, f"request body: {exc}", "invalid_json") from None
        except RecursionError:  # "[[[[…" nested deeper than the decoder's stack allows
            raise APIError(400, "request body is nested too deeply", "invalid_json") from None
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object", "invalid_json")
        try:
            body = model.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc) from None
        if body.model != self.config.model_name:
            raise APIError(404, f"model {body.model!r} does not exist; this server serves "
                           f"{self.config.model_name!r}", "model_not_found", "model")
        return body

    def _request(self, request, body, ids, max_tokens, logprobs=None, prompt_logprobs=False):
        sched = self.engine.config.scheduler
        room = sched.max_model_len - len(ids) - sched.spec_slots
        if max_tokens is None:
            max_tokens = max(1, min(DEFAULT_MAX_TOKENS, room))
        if len(ids) + max_tokens + sched.spec_slots > sched.max_model_len:
            raise APIError(400, f"this model's maximum context length is {sched.max_model_len}"
                           f" tokens; the prompt has {len(ids)} and max_tokens is {max_tokens} "
                           f"(+{sched.spec_slots} reserved for speculation)",
                           "context_length_exceeded", "max_tokens" if len(ids) < room
                           else "prompt")
        params = body.sampling(max_tokens)
        self._check_ids([t for t, _ in params.logit_bias], "logit_bias")
        tag = request.headers.get(WORKLOAD_HEADER, "none").strip().lower()
        speculative = True if body.speculative is None else body.speculative
        return GenerationRequest(
            request_id=f"{'chatcmpl' if isinstance(body, ChatCompletionRequest) else 'cmpl'}-"
                       f"{uuid.uuid4().hex}", prompt_ids=tuple(ids),
            params=params, speculative=speculative, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, tag=self.metrics.workload_of(tag) if tag != "none"
            else "none", cache_salt=body.cache_salt)

    async def _respond(self, request, body, gen: GenerationRequest, fmt, operation):
        if body.n == 1:
            return await self._serve(request, body, gen, fmt, operation, respond=True)
        # n > 1 (never streamed): one engine request a choice, seeds seed, seed + 1, …
        gens = [gen] + [replace(gen, request_id=f"{gen.request_id}-{i}", params=replace(
            gen.params, seed=None if gen.params.seed is None else gen.params.seed + i))
            for i in range(1, body.n)]
        tasks = [asyncio.ensure_future(self._serve(request, body, g, fmt, operation))
                 for g in gens]
        try:
            choices = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return web.json_response(fmt.full_choices(gen.request_id, choices))

    async def _serve(self, request, body, gen: GenerationRequest, fmt, operation,
                     respond: bool = False):
        """Run one engine request: the HTTP response (``respond``, streamed or not), or the
        list of its outputs (one choice of an n > 1 request)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        telemetry = self.telemetry.start(request, body, gen, operation)
        abandoned = False  # the client went away: the engine's last word still goes to metrics

        def deliver(out) -> None:  # on the loop, called from the engine thread
            if not abandoned:
                queue.put_nowait(out)
            elif getattr(out, "finished", False):
                telemetry.finish(out)

        if self._outbox is None or self._outbox.loop is not loop:
            self._outbox = Outbox(loop)
        relay = Relay(self._outbox, deliver, telemetry.token, collect=not body.stream)
        try:
            self.engine.submit(gen, relay.on_output)
        except QueueFullError as exc:
            telemetry.refused(str(exc))
            raise APIError(429, f"server over capacity: {exc}", "over_capacity",
                           headers={"Retry-After": str(self.config.retry_after_seconds)})
        except (CapacityError, EngineError) as exc:
            telemetry.refused(str(exc))
            raise APIError(400, str(exc), "context_length_exceeded", "prompt") from None
        self.active += 1
        finished = None
        try:
            if body.stream:
                finished = await self._stream(request, body, gen, fmt, queue, relay, telemetry)
                return finished[1]
            outputs = []
            while True:
                out = await queue.get()
                outputs.append(out)
                if out.finished:
                    break
            finished = (out, None)
            telemetry.finish(out)
            if out.error:
                raise APIError(500 if out.finish_reason == "error" else 503, out.error,
                               "engine_error")
            return web.json_response(fmt.full(gen.request_id, outputs)) if respond else outputs
        finally:
            relay.close()
            self.direct_writes += relay.direct_writes
            self.handbacks += relay.handbacks
            self.active -= 1
            if finished is None:  # client went away or we were cancelled: free the slot now
                abandoned = True
                while not queue.empty():  # a final output may already be here, unread
                    out = queue.get_nowait()
                    if getattr(out, "finished", False):
                        telemetry.finish(out)
                self.engine.cancel(gen.request_id)
            telemetry.end(finished[0] if finished else None)

    async def _stream(self, request, body, gen, fmt, queue, relay: Relay, telemetry):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Request-Id": gen.request_id})
        await resp.prepare(request)
        include_usage = body.include_usage()
        chunked = resp.headers.get("Transfer-Encoding") == "chunked"

        def events_of(out) -> bytes:
            return fmt.stream_events(gen.request_id, out, include_usage)

        def encode(out) -> bytes:  # on the engine thread, while the stream is direct
            data = events_of(out)
            return b"%x\r\n%s\r\n" % (len(data), data) if chunked else data

        transport = request.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if resp.compression:
            sock = None  # aiohttp compresses what it writes: the loop writes everything
        started = False  # aiohttp sends the headers with the first body bytes
        for chunk in fmt.stream_start(gen.request_id):
            await resp.write(R.sse(chunk))
            started = True
        while True:
            item = await queue.get()
            events = []  # every output already here goes out in one write (one syscall)
            while True:
                if isinstance(item, Unsent):  # framed bytes the engine thread began to send
                    await resp.write(b"".join(events))
                    events = []
                    transport.write(item.data)
                elif item.finished or item.error:
                    out = item
                    if out.finished:
                        telemetry.finish(out)
                    if out.error:
                        events.append(R.sse({"error": {"message": out.error,
                                                       "type": "server_error",
                                                       "code": out.finish_reason}}))
                        await resp.write(b"".join(events) + b"data: [DONE]\n\n")
                        return out, resp
                    events.append(events_of(out))
                    await resp.write(b"".join(events) + b"data: [DONE]\n\n")
                    await resp.write_eof()
                    return out, resp
                else:
                    events.append(events_of(item))
                if queue.empty():
                    break
                item = queue.get_nowait()
            if events:
                await resp.write(b"".join(events))
                started = True
            if (started and sock is not None and queue.empty() and not transport.is_closing()
                    and transport.get_write_buffer_size() == 0):
                relay.go_direct(sock.fileno(), encode)  # the engine thread writes the rest
