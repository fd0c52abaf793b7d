"""What the auditor collects: prompts, completions and per-token logprob records.

Owns: the plain frozen records every check reads — :class:`Position` (one token with its
logprob and the top-n alternatives, as a server reported them), :class:`Completion` (one
generated continuation) and :class:`PromptCase` (one prompt as token ids) — plus the parsing of
OpenAI ``/v1/completions`` ``logprobs`` objects into them.

Does not know: HTTP, statistics or verdicts. Tokens are compared by id. Two ``logprobs`` layouts
are read: the OpenAI completions one (``tokens`` / ``token_logprobs`` / ``top_logprobs``) with
``return_tokens_as_token_ids`` (vLLM's extension: entries read ``token_id:N``), and the chat-style
one llama.cpp returns on both endpoints (``content: [{id, logprob, top_logprobs: [{id,
logprob}]}]``). llama.cpp reports logprob 0 and no alternatives for a token it accepted from a
draft; such a position is kept as *not reported* (``reported=False``), never read as p = 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


class AuditError(Exception):
    """The audit could not run (exit 2): unreachable server, bad input, missing features."""


class ServerFailure(AuditError):
    """A server that was up failed a request: an HTTP 5xx, a dropped connection, a timeout,
    or no longer reachable. ``body`` is the request it failed, so the runner can send the
    same request to the other side: a candidate that fails what the baseline serves is a
    finding (exit 1), not "could not run"."""

    def __init__(self, message: str, role: str, path: str, body: dict | None,
                 status: int = 0):
        super().__init__(message)
        self.role, self.path, self.body, self.status = role, path, body, status


@dataclass(frozen=True)
class Position:
    """One token as a server saw it at a given prefix.

    ``logprob`` is the token's log-probability and ``top`` the top-n ``(token, logprob)`` pairs,
    sorted by logprob descending (ties by token id). Both are the model's raw distribution
    (log_softmax of the logits before temperature/top-k/top-p), vLLM's default.
    """

    token: int
    logprob: float  # -inf: the token is not in the reported top-n (scoring by generation)
    top: tuple[tuple[int, float], ...]
    reported: bool = True  # False: the server gave no figures for this token (see above)

    def logprob_of(self, token: int) -> float | None:
        if token == self.token:
            return self.logprob
        for t, lp in self.top:
            if t == token:
                return lp
        return None

    @property
    def argmax(self) -> int | None:
        return self.top[0][0] if self.top else None


@dataclass(frozen=True)
class Completion:
    """A generated continuation: its tokens, the server's per-token logprobs, its spec stats."""

    tokens: tuple[int, ...]
    positions: tuple[Position, ...]
    finish_reason: str | None = None
    spec: Mapping | None = None  # per-response speculation stats (spectest's shape), if any
    pieces: tuple[bytes, ...] | None = None  # each token's bytes, where the server says them
    left_out: int = 0  # generated tokens past the last aligned logprobs entry (``whole_tokens``)
    text: str = ""  # the choice's text, as the server wrote it
    cached_tokens: int | None = None  # prompt tokens its prefix cache served (where it says)
    body: Mapping | None = None  # the request that made it, exactly as sent (reproducers)

    @property
    def drafts(self) -> int | None:
        return None if not self.spec else self.spec.get("drafts")


@dataclass(frozen=True)
class PromptCase:
    """One audited prompt: where it came from and the exact token ids sent to both servers."""

    id: str
    category: str
    ids: tuple[int, ...]
    text: str = ""  # the prompt as text (what a server without token-id prompts is sent)


def parse_token(text: str, where: str) -> int:
    """``"token_id:42"`` → 42; anything else: the server ignored return_tokens_as_token_ids."""
    if isinstance(text, str) and text.startswith("token_id:"):
        try:
            return int(text[len("token_id:"):])
        except ValueError:
            pass
    raise AuditError(f"{where} returned logprob token {str(text)[:20]!r} instead of "
                     f"'token_id:N': it must support return_tokens_as_token_ids (vLLM, SGLang "
                     f"and spectest serve do)")


def _finite(x, where: str) -> float:
    if not isinstance(x, (int, float)) or math.isnan(x):
        raise AuditError(f"{where} returned a logprob that is not a number: {x!r}")
    return float(x)


def parse_logprobs(obj: Mapping | None, where: str, want_top: int,
                   skip_first_none: bool = False) -> tuple[Position | None, ...]:
    """A ``logprobs`` object (either layout) → one :class:`Position` per token.

    ``skip_first_none``: echo scoring reports ``None`` for the first prompt token (it has no
    prefix); that entry becomes ``None`` instead of an error.
    """
    if isinstance(obj, Mapping) and isinstance(obj.get("content"), list):
        return tuple(_content_position(e, where, want_top) for e in obj["content"])
    if not obj or "tokens" not in obj or "token_logprobs" not in obj:
        raise AuditError(f"{where} returned no logprobs; the auditor needs a server that "
                         f"supports `logprobs` (top {want_top}) on /v1/completions")
    tokens, lps = obj["tokens"], obj["token_logprobs"]
    tops = obj.get("top_logprobs") or [None] * len(tokens)
    if not (len(tokens) == len(lps) == len(tops)):
        raise AuditError(f"{where} returned logprob lists of different lengths")
    out: list[Position | None] = []
    for i, (tok, lp, top) in enumerate(zip(tokens, lps, tops)):
        token = parse_token(tok, where)
        if lp is None and i == 0 and skip_first_none:
            out.append(None)
            continue
        if lp is None:
            raise AuditError(f"{where} returned no logprob for token {i}")
        pairs = [(parse_token(t, where), _finite(v, where)) for t, v in (top or {}).items()]
        out.append(_position(token, _finite(lp, where), pairs, where, want_top))
    return tuple(out)


def whole_tokens(obj, completion_tokens: int | None) -> tuple[object, int]:
    """Cut a llama.cpp ``content`` list where it stops lining up with the generated tokens.

    llama.cpp reports one logprobs entry per whole UTF-8 character: a character spread over
    several tokens gets one entry, the whole character as text with the id and logprobs of
    the token that completed it (its *last*: measured on llama-server, the entry of a Korean
    character begun at the first position carried the figures of its third), and the other
    tokens get none, so from that entry on entry i is no longer token i. When there are fewer
    entries than generated tokens, the entries are kept up to, not including, the first one
    whose text is not ASCII (the earliest a character can span tokens); entries missing only
    at the end (a character not yet complete) shift nothing.
    Returns the logprobs object to parse and how many generated tokens it leaves out."""
    if not (isinstance(obj, Mapping) and isinstance(obj.get("content"), list)):
        return obj, 0
    content = obj["content"]
    if not completion_tokens or len(content) >= completion_tokens:
        return obj, 0
    for i, entry in enumerate(content):
        text = entry.get("token") if isinstance(entry, Mapping) else None
        if isinstance(text, str) and not text.isascii():
            return {**obj, "content": content[:i]}, completion_tokens - i
    return obj, completion_tokens - len(content)


def _content_position(entry, where: str, want_top: int) -> Position:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), int):
        raise AuditError(f"{where} returned a logprobs entry without a token id: "
                         f"{str(entry)[:80]}")
    pairs = []
    for alt in entry.get("top_logprobs") or ():
        if not isinstance(alt, Mapping) or not isinstance(alt.get("id"), int):
            raise AuditError(f"{where} returned a top_logprobs entry without a token id")
        pairs.append((alt["id"], _finite(alt.get("logprob"), where)))
    return _position(entry["id"], _finite(entry.get("logprob"), where), pairs, where, want_top)


def _position(token: int, lp: float, pairs: list[tuple[int, float]], where: str,
              want_top: int) -> Position:
    if want_top and not pairs:  # llama.cpp, a token accepted from a draft: nothing computed
        return Position(token, lp, (), reported=False)
    if want_top and len(pairs) < want_top:
        raise AuditError(f"{where} returned {len(pairs)} top logprobs where {want_top} were "
                         f"asked; it must support `logprobs: {want_top}`")
    # vLLM adds the chosen token to ``top_logprobs`` when it is not among the top n (n + 1
    # entries): that extra entry is the chosen token's own figure, not part of the top n, and
    # counting it there would move the token out of the unreported tail whenever it was
    # outside the top n — sampled tokens would then look improbable (at temperature 1 with
    # top-k off, plain vLLM's own samples failed the test at p = 1e-60). Its logprob stays in
    # ``logprob``.
    ranked = sorted(pairs, key=lambda p: (-p[1], p[0]))
    return Position(token, lp, tuple(ranked[:want_top] if want_top else ranked))
