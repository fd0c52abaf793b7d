"""A drafter in another process: the engine's :class:`Drafter` protocol over HTTP.

Owns: :class:`RemoteDrafter`, which the target server's engine uses like any drafter. It keeps
what the draft side must know and sends it once a round: cache operations (admit, rewind,
release) are queued as the engine calls them and travel with the next round's request, and
each drafting row carries only the committed tokens the draft side has not seen. One round is
one POST on a kept-alive connection; the answer's time minus the draft side's own time is the
round's *network term* (``Proposal.network_seconds``: transport, encoding and the draft
server's queue), which the engine records per round.

Failure is a round without drafts, never a failed request: a refused connection, a timeout, a
dropped connection or a malformed answer returns an empty proposal with ``error`` set (counted
by the server's metrics, logged once per outage), the next tries wait ``retry_s`` (doubling up
to ``max_retry_s``), and when the draft server answers again a new session is opened and every
sequence that drafts is re-admitted with its committed tokens. A kept-alive connection the
other side closed is retried once on a fresh one before it counts as a failure.

Does not know: HTTP servers, Prometheus, verification. It imports the wire format and the
engine's drafter records only.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from urllib.parse import urlsplit

from spectest.engine.drafters import DraftRow, Proposal
from spectest.engine.policies import ConfidenceStop
from spectest.remote import wire

log = logging.getLogger("spectest.remote")


class RemoteDraftError(ValueError):
    """The draft server cannot serve this target (unreachable at start, or another tokenizer)."""


class _Retry(Exception):
    """The draft side lost our session or a slot: open a new session and resend once."""


class RemoteDrafter:
    name = "remote-draft-model"

    def __init__(self, url: str, n_slots: int, max_len: int, timeout_s: float = 5.0,
                 retry_s: float = 0.5, max_retry_s: float = 8.0):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise RemoteDraftError(f"--draft-url {url!r}: expected http://HOST:PORT")
        self.url = f"http://{parts.hostname}:{parts.port or 80}"
        self.host, self.port = parts.hostname, parts.port or 80
        self.n_slots, self.max_len = n_slots, max_len
        self.timeout_s, self.retry_s, self.max_retry_s = timeout_s, retry_s, max_retry_s
        self.info: wire.DraftInfo | None = None
        self.session: str | None = None
        self.failures = 0  # rounds that lost their drafts to the draft server
        self.last_error: str | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._sent: dict[int, int] = {}  # slot → committed tokens the draft side holds
        self._ops: list[dict] = []  # admit/release, in order
        self._rewinds: dict[int, int] = {}  # slot → n_valid, applied after the ops
        self._down_since: float | None = None
        self._next_try = 0.0
        self._backoff = retry_s

    # --- start-up ---------------------------------------------------------------------------
    def connect(self, tokenizer_fingerprint: str | None = None) -> wire.DraftInfo:
        """Check the draft server is there and drafts in this tokenizer; open a session.
        Raises :class:`RemoteDraftError` (one readable line) otherwise."""
        try:
            info = wire.DraftInfo.model_validate(self._json("GET", "/v1/draft/info"))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise RemoteDraftError(f"no draft server at {self.url}: {_describe(exc)}") from None
        if info.protocol != wire.PROTOCOL:
            raise RemoteDraftError(f"draft server at {self.url} speaks {info.protocol!r}, "
                                   f"not {wire.PROTOCOL!r}")
        if tokenizer_fingerprint and info.tokenizer_fingerprint != tokenizer_fingerprint:
            raise RemoteDraftError(
                f"draft server at {self.url} serves {info.model!r}, whose tokenizer differs "
                f"from the target's (fingerprint {info.tokenizer_fingerprint[:12]}… vs "
                f"{tokenizer_fingerprint[:12]}…): its drafts would be other tokens")
        self.info = info
        try:
            self._open_session()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise RemoteDraftError(f"draft server at {self.url} refused a session: "
                                   f"{_describe(exc)}") from None
        return info

    def close(self) -> None:
        if self.session is not None:
            try:
                self._json("DELETE", f"/v1/draft/sessions/{self.session}")
            except (OSError, http.client.HTTPException, ValueError):
                pass
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- the Drafter protocol ------------------------------------------------------------------
    def admit(self, slot: int, prompt: list[int]) -> None:
        self._forget(slot)
        self._ops.append({"op": "admit", "slot": slot, "tokens": list(prompt)})
        self._sent[slot] = len(prompt)

    def release(self, slot: int) -> None:
        self._forget(slot)
        if self.session is not None:
            self._ops.append({"op": "release", "slot": slot})

    def rewind(self, slot: int, n_valid: int) -> None:
        if slot in self._sent:
            self._rewinds[slot] = min(n_valid, self._rewinds.get(slot, n_valid))

    def propose(self, rows: list[DraftRow], stop=None) -> Proposal:
        B = len(rows)
        t0 = time.perf_counter()
        if self._down_since is not None and time.monotonic() < self._next_try:
            return self._lost(B, t0, None)
        if stop is not None and not isinstance(stop, ConfidenceStop):
            raise TypeError(f"a remote drafter can apply ConfidenceStop rules only, not {stop!r}")
        try:
            try:
                answer = self._round(rows, stop)
            except _Retry:
                self._open_session()
                answer = self._round(rows, stop)
        except (OSError, http.client.HTTPException, wire.WireError, _Retry,
                RemoteDraftError) as exc:
            return self._lost(B, t0, exc)
        if self._down_since is not None:
            log.warning("draft server %s is back after %.1f s; drafting again", self.url,
                        time.monotonic() - self._down_since)
            self._down_since, self._backoff = None, self.retry_s
        total = time.perf_counter() - t0
        return Proposal(answer.tokens, answer.lens, answer.probs,
                        network_seconds=max(0.0, total - answer.draft_seconds))

    # --- internals ----------------------------------------------------------------------------
    def _forget(self, slot: int) -> None:
        self._sent.pop(slot, None)
        self._rewinds.pop(slot, None)
        self._ops = [op for op in self._ops if op["slot"] != slot]

    def _round(self, rows: list[DraftRow], stop) -> wire.DraftAnswer:
        if self.session is None:
            self._open_session()
        ops = list(self._ops) + [{"op": "rewind", "slot": s, "n_valid": n}
                                 for s, n in self._rewinds.items()]
        body_rows = []
        for r in rows:
            seen = self._sent.get(r.slot)
            if seen is None:  # new to this session (a restart, or drafting resumed): all of it
                ops.append({"op": "admit", "slot": r.slot, "tokens": list(r.tokens)})
                seen = len(r.tokens)
            p = r.params
            row = {"slot": r.slot, "append": r.tokens[seen:], "k": r.k, "greedy": r.greedy,
                   "temperature": r.temperature, "top_k": p.top_k, "top_p": p.top_p,
                   "uniforms": None if r.greedy or r.uniforms is None else r.uniforms.tolist()}
            if p.min_p:
                row["min_p"] = p.min_p
            if p.penalized:
                row.update(presence_penalty=p.presence_penalty,
                           frequency_penalty=p.frequency_penalty,
                           repetition_penalty=p.repetition_penalty,
                           logit_bias=[list(x) for x in p.logit_bias], prompt_len=r.prompt_len)
            body_rows.append(row)
        body = json.dumps({"ops": ops, "rows": body_rows,
                           "stop_threshold": stop.threshold if stop is not None else None},
                          separators=(",", ":")).encode()
        status, data = self._request("POST", f"/v1/draft/sessions/{self.session}/round", body)
        if status in (404, 409):  # the draft side does not know our session or a slot
            raise _Retry(_error_message(data))
        if status != 200:
            raise http.client.HTTPException(f"HTTP {status}: {_error_message(data)}")
        answer = wire.decode_answer(data, len(rows))
        self._ops.clear()
        self._rewinds.clear()
        for r in rows:
            self._sent[r.slot] = len(r.tokens)
        return answer

    def _open_session(self) -> None:
        old, self.session = self.session, None
        self._sent.clear()
        self._ops.clear()
        self._rewinds.clear()
        out = wire.SessionOut.model_validate(self._json(
            "POST", "/v1/draft/sessions",
            json.dumps({"n_slots": self.n_slots, "max_len": self.max_len}).encode()))
        if self.info is not None and out.tokenizer_fingerprint != self.info.tokenizer_fingerprint:
            raise RemoteDraftError(f"the draft server at {self.url} now serves another "
                                   f"tokenizer ({out.model!r})")
        self.session = out.session
        if old is not None:  # best effort: free the lost session's caches over there
            try:
                self._request("DELETE", f"/v1/draft/sessions/{old}")
            except (OSError, http.client.HTTPException):
                pass

    def _lost(self, batch: int, t0: float, exc: BaseException | None) -> Proposal:
        now = time.monotonic()
        self.failures += 1
        if exc is not None:
            self.last_error = _describe(exc)
            self.session = None  # whatever happened over there, start clean next time
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._down_since is None:
                self._down_since = now
                log.warning("draft server %s failed (%s): rounds run without drafts until it "
                            "answers again", self.url, self.last_error)
            else:
                self._backoff = min(self.max_retry_s, self._backoff * 2)
            self._next_try = now + self._backoff
        return Proposal.empty(batch, error=f"draft server {self.url}: {self.last_error}",
                              network_seconds=time.perf_counter() - t0)

    def _json(self, method: str, path: str, body: bytes | None = None) -> dict:
        status, data = self._request(method, path, body)
        if status != 200:
            raise http.client.HTTPException(f"HTTP {status}: {_error_message(data)}")
        return json.loads(data)

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                conn.connect()  # raises (refused, timed out) before we keep it
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._conn = conn
            try:
                self._conn.request(method, path, body=body, headers=headers)
                resp = self._conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._conn.close()
                self._conn = None
                if fresh or attempt:  # a new connection that fails is a real failure
                    raise
            except BaseException:
                self._conn.close()
                self._conn = None
                raise
        raise AssertionError("unreachable")


def _error_message(data: bytes) -> str:
    try:
        return json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return data[:200].decode("utf-8", "replace")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
