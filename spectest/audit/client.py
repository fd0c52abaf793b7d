"""An HTTP client for the OpenAI-compatible servers under audit (vLLM, SGLang, spectest serve).

Owns: the requests the auditor sends — ``GET /v1/models``, generation on ``/v1/completions``
with token-id prompts, ``logprobs`` and ``return_tokens_as_token_ids``, and prompt scoring
(``echo`` + ``logprobs`` + ``max_tokens: 0``) — with timeouts, bounded retries on 429/503, a
concurrency limit, and errors turned into one readable :class:`AuditError` line each.

Does not know: what the checks do with the answers. ``extra`` fields (for example
``{"speculative": false}``, spectest's per-request A/B switch) are merged into every
generation body, which is how one server can be both candidate and baseline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from spectest.audit.samples import AuditError, Completion, Position, parse_logprobs, parse_token

WORKLOAD_HEADER = "X-Spectest-Workload"
# Request fields the auditor relies on; a 400 naming one means the server lacks the feature.
_FEATURES = ("logprobs", "echo", "return_tokens_as_token_ids", "top_k", "ignore_eos", "seed")


@dataclass(frozen=True)
class Endpoint:
    """One side of the audit."""

    role: str  # "candidate" | "baseline"
    url: str  # base URL, without /v1
    model: str | None = None  # None: the first id of GET /v1/models
    extra: Mapping = field(default_factory=dict)
    api_key: str | None = None


class Client:
    """Async client for one endpoint; use as ``async with Client(endpoint) as c``."""

    def __init__(self, endpoint: Endpoint, concurrency: int = 8, timeout_s: float = 120.0,
                 retries: int = 3):
        self.endpoint = endpoint
        self.base = endpoint.url.rstrip("/")
        self.base = self.base.removesuffix("/v1")
        self.model = endpoint.model
        self._sem = asyncio.Semaphore(concurrency)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._retries = retries
        self._session: aiohttp.ClientSession | None = None
        self._echo_tokens = 0  # max_tokens for echo scoring: 0, or 1 where 0 is refused
        self.requests = 0

    @property
    def role(self) -> str:
        return self.endpoint.role

    async def __aenter__(self) -> Client:
        headers = {WORKLOAD_HEADER: "audit"}
        if self.endpoint.api_key:
            headers["Authorization"] = f"Bearer {self.endpoint.api_key}"
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=headers)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()

    # --- transport -----------------------------------------------------------------------
    async def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        url = self.base + path
        where = f"{self.role} ({self.base})"
        for attempt in range(self._retries + 1):
            try:
                async with self._sem:
                    self.requests += 1
                    async with self._session.request(method, url, json=body) as resp:
                        text = await resp.text()
                        status = resp.status
                        retry_after = resp.headers.get("Retry-After")
            except aiohttp.ClientConnectorError as exc:
                raise AuditError(f"cannot reach the {where}: {exc.os_error.strerror or exc}; "
                                 f"is it running?") from None
            except TimeoutError:
                raise AuditError(f"the {where} did not answer {method} {path} within "
                                 f"{self._timeout.total:.0f} s") from None
            except aiohttp.ClientError as exc:
                raise AuditError(f"the {where} broke the connection on {path}: "
                                 f"{type(exc).__name__}") from None
            if status in (429, 503) and attempt < self._retries:
                await asyncio.sleep(min(5.0, float(retry_after or 0.5 * 2 ** attempt)))
                continue
            break
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if status >= 400:
            message = _error_message(data, text)
            hint = ""
            if status == 400 and any(w in message for w in _FEATURES):
                hint = ("; the auditor needs logprobs, echo scoring and "
                        "return_tokens_as_token_ids on /v1/completions (vLLM-compatible)")
            raise AuditError(f"the {where} answered {path} with HTTP {status}: {message}{hint}")
        if not isinstance(data, dict):
            raise AuditError(f"the {where} answered {path} with something that is not a JSON "
                             f"object: {text[:80]!r}")
        return data

    # --- API ---------------------------------------------------------------------------------
    async def resolve_model(self) -> str:
        data = await self._call("GET", "/v1/models")
        ids = [m.get("id") for m in data.get("data") or [] if isinstance(m, dict)]
        if self.model is None:
            if not ids:
                raise AuditError(f"the {self.role} ({self.base}) lists no model in /v1/models")
            self.model = ids[0]
        elif ids and self.model not in ids:
            raise AuditError(f"the {self.role} does not serve model {self.model!r} "
                             f"(it serves {', '.join(map(repr, ids))})")
        return self.model

    async def complete(self, prompt: list[int] | str, *, max_tokens: int, temperature: float,
                       logprobs: int, top_p: float = 1.0, top_k: int = -1,
                       seed: int | None = None, ignore_eos: bool = True) -> Completion:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "logprobs": logprobs,
                "return_tokens_as_token_ids": True, "stream": False}
        if top_k > 0:
            body["top_k"] = top_k
        if seed is not None:
            body["seed"] = seed
        if ignore_eos:
            body["ignore_eos"] = True
        body.update(self.endpoint.extra)
        data = await self._call("POST", "/v1/completions", body)
        choice = _choice(data, self.role)
        positions = parse_logprobs(choice.get("logprobs"), f"the {self.role}", logprobs)
        if len(positions) > max_tokens:
            raise AuditError(f"the {self.role} returned {len(positions)} tokens for max_tokens "
                             f"{max_tokens}")
        return Completion(tuple(p.token for p in positions), positions,
                          choice.get("finish_reason"), data.get("spec"))

    async def _echo(self, prompt, logprobs: int) -> tuple[dict, int | None]:
        """An echo request that generates nothing (``max_tokens: 0``, the OpenAI scoring idiom);
        servers that insist on ``max_tokens >= 1`` get 1, and the extra token is dropped.
        Returns (the choice's logprobs object, the prompt's token count if reported)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": self._echo_tokens,
                "echo": True, "logprobs": logprobs, "return_tokens_as_token_ids": True,
                "temperature": 0}
        try:
            data = await self._call("POST", "/v1/completions", body)
        except AuditError as exc:
            if self._echo_tokens or "max_tokens" not in str(exc):
                raise
            self._echo_tokens = 1
            return await self._echo(prompt, logprobs)
        usage = data.get("usage") or {}
        return _choice(data, self.role).get("logprobs"), usage.get("prompt_tokens")

    async def score(self, ids: list[int], logprobs: int) -> tuple[Position | None, ...]:
        """Echo scoring: each token's logprob (and top-n) given the tokens before it."""
        lp, _ = await self._echo(ids, logprobs)
        out = parse_logprobs(lp, f"the {self.role} (echo scoring)",
                             logprobs if len(ids) > 1 else 0, skip_first_none=True)
        if len(out) < len(ids) or [p.token for p in out[1:len(ids)]] != list(ids[1:]):
            raise AuditError(f"the {self.role} does not support echo scoring of token-id "
                             f"prompts (echo + logprobs + max_tokens 0 returned "
                             f"{len(out)} positions for {len(ids)} tokens)")
        return out[:len(ids)]

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` as this server tokenizes it (echo, nothing generated)."""
        lp, n_prompt = await self._echo(text, 0)
        if not isinstance(lp, dict) or not lp.get("tokens"):
            raise AuditError(f"the {self.role} returned no tokens for an echo request; the "
                             f"auditor needs echo + logprobs on /v1/completions")
        tokens = [parse_token(t, f"the {self.role}") for t in lp["tokens"]]
        return tokens[:n_prompt] if self._echo_tokens and n_prompt else tokens


def _error_message(data, text: str) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
        if data.get("detail"):
            return str(data["detail"])[:300]
        if data.get("message"):
            return str(data["message"])[:300]
    return text.strip()[:300] or "(empty body)"


def _choice(data: dict, role: str) -> dict:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AuditError(f"the {role} answered without choices: {str(data)[:120]}")
    return choices[0]
