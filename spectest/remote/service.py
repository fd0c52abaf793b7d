"""``spectest serve-draft``: a draft model and its per-request KV caches, behind HTTP.

Owns: :class:`DraftService` — one *session* per connected target server (its own
:class:`~spectest.engine.drafters.DraftModelDrafter`, i.e. its own KV cache, and the committed
tokens of each of its slots), evicting the least recently used session past ``max_sessions``
— and the aiohttp app in front of it:

* ``GET /health``, ``GET /v1/draft/info`` (model, vocabulary size, tokenizer fingerprint),
* ``POST /v1/draft/sessions`` (``{"n_slots", "max_len"}`` → a session id),
* ``POST /v1/draft/sessions/{id}/round`` (see :mod:`spectest.remote.wire`),
* ``DELETE /v1/draft/sessions/{id}``.

An unknown session answers 404 and a row for a slot the session never admitted answers 409:
the target side then opens a new session and re-admits its sequences (after a restart of this
process, or an eviction). The model runs on one worker thread, so ``/health`` answers while a
round drafts; rounds of one session run in order.

Does not know: the target, verification or scheduling — the target side tells it which tokens
are committed and how far to rewind.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from aiohttp import web
from pydantic import ValidationError

from spectest.engine.api import companion_target, prepare_draft, resolve_model_path
from spectest.engine.drafters import DraftModelDrafter, DraftRow
from spectest.engine.int8 import QUANTIZE_CHOICES, should_quantize
from spectest.engine.loader import LoadedModel, load_checkpoint, peek_config
from spectest.engine.policies import ConfidenceStop
from spectest.remote import wire
from spectest.http_errors import APIError, error_middleware, validation_error
from spectest.loops import until_signalled

log = logging.getLogger("spectest.remote")
MAX_BODY = 16 * 1024 * 1024


@dataclass
class Session:
    drafter: DraftModelDrafter
    n_slots: int
    max_len: int
    tokens: dict[int, list[int]] = field(default_factory=dict)  # slot → committed tokens
    lock: threading.Lock = field(default_factory=threading.Lock)


class DraftService:
    def __init__(self, loaded: LoadedModel, name: str, max_sessions: int = 8):
        self.loaded, self.name, self.max_sessions = loaded, name, max_sessions
        self.vocab_size = loaded.model.config.vocab_size
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def info(self) -> dict:
        return {"protocol": wire.PROTOCOL, "model": self.name, "vocab_size": self.vocab_size,
                "tokenizer_fingerprint": self.loaded.tokenizer.fingerprint,
                "quantization": self.loaded.model.quantization, "sessions": len(self.sessions)}

    def open_session(self, spec: wire.SessionIn) -> dict:
        if spec.n_slots * spec.max_len > wire.MAX_POSITIONS:
            raise APIError(400, f"n_slots × max_len = {spec.n_slots * spec.max_len} positions "
                                f"is more than one session may hold ({wire.MAX_POSITIONS})",
                           "session_too_large")
        session_id = uuid.uuid4().hex
        session = Session(DraftModelDrafter(self.loaded.model, spec.n_slots, spec.max_len),
                          spec.n_slots, spec.max_len)
        with self._lock:
            self.sessions[session_id] = session
            while len(self.sessions) > self.max_sessions:
                evicted, _ = self.sessions.popitem(last=False)
                log.warning("draft session %s evicted (more than %d sessions)", evicted,
                            self.max_sessions)
        return {**self.info(), "session": session_id}

    def close_session(self, session_id: str) -> bool:
        with self._lock:
            return self.sessions.pop(session_id, None) is not None

    def session(self, session_id: str) -> Session:
        with self._lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise APIError(404, f"unknown draft session {session_id!r} (this draft server "
                                    "restarted, or evicted it): open a new one",
                               "unknown_session")
            self.sessions.move_to_end(session_id)
            return session

    @torch.inference_mode()
    def run_round(self, session: Session, req: wire.RoundIn) -> bytes:
        """Apply the queued cache operations, then draft for every row (worker thread)."""
        t0 = time.perf_counter()
        with session.lock:
            self._apply_ops(session, req.ops)
            rows = [self._row(session, r) for r in req.rows]
            stop = ConfidenceStop(req.stop_threshold) if req.stop_threshold is not None else None
            if rows:
                proposal = session.drafter.propose(rows, stop=stop)
                tokens, lens, probs = proposal.tokens, proposal.lens, proposal.probs
            else:
                tokens, lens, probs = torch.zeros(0, 0, dtype=torch.long), \
                    torch.zeros(0, dtype=torch.long), None
        sampled = [i for i, r in enumerate(req.rows) if not r.greedy]
        return wire.encode_answer(tokens, lens, probs, sampled, time.perf_counter() - t0)

    def _apply_ops(self, session: Session, ops: list) -> None:
        for op in ops:
            self._check_slot(session, op.slot)
            if op.op == "admit":
                self._check_tokens(session, op.tokens, 0)
                session.tokens[op.slot] = list(op.tokens)
                session.drafter.admit(op.slot, list(op.tokens))
            elif op.op == "release":
                session.tokens.pop(op.slot, None)
                session.drafter.release(op.slot)
            else:
                session.drafter.rewind(op.slot, op.n_valid)

    def _row(self, session: Session, r: wire.RowIn) -> DraftRow:
        self._check_slot(session, r.slot)
        if r.slot not in session.tokens:
            raise APIError(409, f"slot {r.slot} has no admitted sequence in this session: "
                                "re-admit it", "resync")
        tokens = session.tokens[r.slot]
        self._check_tokens(session, r.append, len(tokens) + r.k)
        tokens.extend(r.append)
        uniforms = None
        if not r.greedy:
            if r.uniforms is None or len(r.uniforms) < r.k:
                raise APIError(400, f"rows[slot {r.slot}]: a sampled row needs k={r.k} "
                                    "uniforms", "invalid_request", "uniforms")
            uniforms = torch.tensor(r.uniforms[:r.k], dtype=torch.float32)
        return DraftRow(r.slot, tokens, r.k, r.params(), uniforms, r.prompt_len)

    def _check_slot(self, session: Session, slot: int) -> None:
        if slot >= session.n_slots:
            raise APIError(400, f"slot {slot} is outside this session's {session.n_slots} "
                                "slots", "invalid_request", "slot")

    def _check_tokens(self, session: Session, tokens: list[int], extra: int) -> None:
        if tokens and max(tokens) >= self.vocab_size:
            raise APIError(400, f"token id {max(tokens)} is outside the draft's vocabulary "
                                f"({self.vocab_size})", "invalid_request", "tokens")
        if len(tokens) + extra > session.max_len:
            raise APIError(400, f"{len(tokens) + extra} positions exceed the session's "
                                f"max_len {session.max_len}", "invalid_request", "tokens")


class DraftApp:
    """The HTTP face of a :class:`DraftService`."""

    def __init__(self, service: DraftService):
        self.service = service
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spectest-draft")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY,
                              middlewares=[error_middleware(lambda status: None)])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/draft/info", self.info)
        app.router.add_post("/v1/draft/sessions", self.open_session)
        app.router.add_post("/v1/draft/sessions/{session}/round", self.round)
        app.router.add_delete("/v1/draft/sessions/{session}", self.close_session)
        app.on_cleanup.append(self._shutdown)
        return app

    async def _shutdown(self, app) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.info())

    async def open_session(self, request: web.Request) -> web.Response:
        spec = await _parse(request, wire.SessionIn)
        return web.json_response(self.service.open_session(spec))

    async def close_session(self, request: web.Request) -> web.Response:
        if not self.service.close_session(request.match_info["session"]):
            raise APIError(404, "unknown draft session", "unknown_session")
        return web.json_response({"deleted": True})

    async def round(self, request: web.Request) -> web.Response:
        session = self.service.session(request.match_info["session"])
        req = await _parse(request, wire.RoundIn)
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(self._pool, self.service.run_round, session, req)
        return web.Response(body=body, content_type="application/octet-stream")


async def _parse(request: web.Request, model):
    raw = await request.read()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None


# --- the command ---------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--draft", default="embedded-draft",
                   help="draft checkpoint: 'embedded-draft', a HF directory or a .gguf file")
    p.add_argument("--max-sessions", type=int, default=8,
                   help="target servers served at once (the least recently used is evicted)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default="auto",
                   help="int8, none, or auto = as `spectest serve` quantizes the draft beside "
                        "its target: int8 when the target has >= 50M parameters (a bundled "
                        "draft's target is known: smollm2-draft → smollm2; else the draft's "
                        "own size decides)")


def load_draft(draft: str, quantize: str = "auto") -> LoadedModel:
    """The draft, with the weights ``spectest serve`` would give it beside its target."""
    loaded = load_checkpoint(resolve_model_path(draft))
    target = companion_target(draft)
    target_params = peek_config(resolve_model_path(target)).parameter_count if target else None
    return prepare_draft(loaded, should_quantize(quantize, loaded.model, target_params))


def main(args) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(max(1, args.threads))
    loaded = load_draft(args.draft, args.quantize)
    service = DraftService(loaded, str(args.draft), args.max_sessions)
    try:
        asyncio.run(_run(DraftApp(service), args.host, args.port, loaded))
    except OSError as exc:
        print(f"spectest serve-draft: cannot listen on {args.host}:{args.port}: "
              f"{exc.strerror}", file=sys.stderr)
        return 2
    return 0


async def _run(draft_app: DraftApp, host: str, port: int, loaded: LoadedModel) -> None:
    runner = web.AppRunner(draft_app.app(), handler_cancellation=True, shutdown_timeout=2)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server else port
    print(f"spectest draft server {draft_app.service.name!r} "
          f"({loaded.model.config.vocab_size}-token vocabulary, {loaded.model.quantization} "
          f"weights, {torch.get_num_threads()} torch "
          f"thread(s)) at http://{host}:{bound}  — `spectest serve --draft-url "
          f"http://{host}:{bound}` drafts from here", flush=True)
    await until_signalled()
    await runner.cleanup()
    print("spectest draft server: stopped", flush=True)
