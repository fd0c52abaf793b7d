"""An HTTP client for the OpenAI-compatible servers under audit (spectest, vLLM, SGLang, llama.cpp).

Owns: the requests the auditor sends — ``GET /v1/models``, generation on ``/v1/completions``
with token-id prompts and ``logprobs`` — with timeouts, bounded retries on 429/503, a
concurrency limit, and errors turned into one readable :class:`AuditError` line each (a
:class:`ServerFailure` where a server that was up failed a request: 5xx, dropped, timed out,
gone); and the
*routes* a server supports, probed once (:class:`Routes`, see ``scoring.py`` for how they are
chosen and used).

Does not know: what the checks do with the answers. ``extra`` fields (for example
``{"speculative": false}``, spectest's per-request A/B switch) are merged into every
generation body, which is how one server can be both candidate and baseline; the flavour's
``sampling_overrides`` (llama.cpp: ``min_p: 0``) are merged into sampled requests so that the
server samples from exactly the distribution the distribution test models.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from spectest import flavours
from spectest.audit.samples import (AuditError, Completion, ServerFailure, parse_logprobs,
                                   whole_tokens)

WORKLOAD_HEADER = "X-Spectest-Workload"
# what a kept-alive connection closed under a request raises (sent again once)
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


@dataclass(frozen=True)
class Endpoint:
    """One side of the audit."""

    role: str  # "candidate" | "baseline"
    url: str  # base URL, without /v1
    model: str | None = None  # None: the first id of GET /v1/models
    extra: Mapping = field(default_factory=dict)
    api_key: str | None = None
    flavour: str | None = None  # None: detected from /v1/models and /metrics


@dataclass(frozen=True)
class Routes:
    """How the auditor talks to one server, decided by probing it (``scoring.probe``)."""

    flavour: flavours.Flavour | None  # None: not recognised (treated as vLLM-compatible)
    token_ids: bool = True  # prompts go as token ids (else text: re-tokenised by the server)
    echo: bool = True  # scoring by echo + logprobs (else by generation after each prefix)
    tokenize: str = "echo"  # echo | endpoint | text (how prompt text becomes token ids)
    echo_refusal: str = ""  # why echo scoring is not used, in the server's words
    token_id_refusal: str = ""

    @property
    def name(self) -> str:
        return self.flavour.display if self.flavour else "an OpenAI-compatible server"


class Client:
    """Async client for one endpoint; use as ``async with Client(endpoint) as c``."""

    def __init__(self, endpoint: Endpoint, concurrency: int = 8, timeout_s: float = 120.0,
                 retries: int = 3):
        self.endpoint = endpoint
        self.base = endpoint.url.rstrip("/")
        self.base = self.base.removesuffix("/v1")
        self.model = endpoint.model
        self._sem, self.concurrency = asyncio.Semaphore(concurrency), concurrency
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._retries = retries
        self._session: aiohttp.ClientSession | None = None
        self._echo_tokens = 0  # max_tokens for echo scoring: 0, or 1 where 0 is refused
        self.routes = Routes(None)
        self.requests = 0
        self.requests_ok = 0  # answered without an error
        self.resent = 0  # requests sent again after a kept-alive connection was closed

    @property
    def role(self) -> str:
        return self.endpoint.role

    @property
    def where(self) -> str:
        return f"the {self.role} ({self.base})"

    async def __aenter__(self) -> Client:
        headers = {WORKLOAD_HEADER: "audit"}
        if self.endpoint.api_key:
            headers["Authorization"] = f"Bearer {self.endpoint.api_key}"
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=headers)
        return self

    def sibling(self, concurrency: int | None = None, timeout_s: float | None = None) -> Client:
        """A client of the same server, as probed (routes, model, scoring route), with its
        own connection pool and request timeout: for bursts and long requests."""
        twin = Client(self.endpoint, concurrency or self.concurrency,
                      timeout_s or self._timeout.total, self._retries)
        twin.routes, twin.model, twin._echo_tokens = self.routes, self.model, self._echo_tokens
        twin.requests_ok = self.requests_ok
        return twin

    async def reset_session(self) -> None:
        """After the server came back from a crash: drop the connections to the old one."""
        old = self._session
        await self.__aenter__()
        if old is not None:
            await old.close()

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()

    # --- transport -----------------------------------------------------------------------
    async def call(self, method: str, path: str, body: dict | None = None,
                   quiet_status: tuple[int, ...] = ()) -> dict:
        """One JSON request; ``quiet_status``: statuses returned as ``{"_status": N, ...}``
        instead of raised (probes read a refusal as an answer)."""
        url = self.base + path
        attempt, resent = 0, False
        while True:
            try:
                async with self._sem:
                    self.requests += 1
                    async with self._session.request(method, url, json=body) as resp:
                        text = await resp.text()
                        status = resp.status
                        retry_after = resp.headers.get("Retry-After")
            except aiohttp.ClientConnectorError as exc:
                message = (f"cannot reach {self.where}: {exc.os_error.strerror or exc}; "
                           f"is it running?")
                if not self.requests_ok:  # never answered: nothing to compare
                    raise AuditError(message) from None
                raise ServerFailure(message + " (it answered before: it stopped or died)",
                                    self.role, path, body) from None
            except TimeoutError:
                raise ServerFailure(f"{self.where} did not answer {method} {path} within "
                                    f"{self._timeout.total:.0f} s", self.role, path,
                                    body) from None
            except aiohttp.ClientError as exc:
                if isinstance(exc, STALE_CONNECTION) and not resent:
                    # a kept-alive connection the server closed as the request went out
                    # (uvicorn drops idle ones after 5 s): sent once more on a new one; a
                    # server that breaks the connection on the request itself does it again
                    resent = True
                    self.resent += 1
                    continue
                raise ServerFailure(f"{self.where} broke the connection on {path}: "
                                    f"{type(exc).__name__}", self.role, path, body) from None
            if status in (429, 503) and attempt < self._retries:
                await asyncio.sleep(min(5.0, float(retry_after or 0.5 * 2 ** attempt)))
                attempt += 1
                continue
            break
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if status >= 400:
            message = error_message(data, text)
            if status in quiet_status:
                return {"_status": status, "_message": message}
            if status >= 500:
                raise ServerFailure(f"{self.where} answered {path} with HTTP {status}: "
                                    f"{message}", self.role, path, body, status)
            raise AuditError(f"{self.where} answered {path} with HTTP {status}: {message}")
        self.requests_ok += 1
        if not isinstance(data, dict):
            raise AuditError(f"{self.where} answered {path} with something that is not a JSON "
                             f"object: {text[:80]!r}")
        return data

    async def metric(self, spec) -> float | None:
        """The sum over labels of one metric of the table (``telemetry.names``) on this
        server's ``/metrics``, under its flavour's name; None where the flavour has no such
        metric or the server does not expose it."""
        name = self.routes.flavour.sample(spec) if self.routes.flavour else None
        text = await self.get_text("/metrics") if name else None
        try:
            values = [s.value for fam in text_string_to_metric_families(text or "")
                      for s in fam.samples if s.name == name]
        except ValueError:
            return None
        return sum(values) if values else None

    async def label(self, metric: str, label: str) -> str | None:
        """The value of ``label`` on the first series of ``metric`` on ``/metrics`` (an info
        metric's fact, such as vLLM's KV cache size), or None."""
        text = await self.get_text("/metrics")
        try:
            for fam in text_string_to_metric_families(text or ""):
                for sample in fam.samples:
                    if sample.name == metric and label in sample.labels:
                        return sample.labels[label]
        except ValueError:
            return None
        return None

    async def get_text(self, path: str) -> str | None:
        """A plain GET (``/metrics``); None when it is not there."""
        try:
            async with self._sem, self._session.get(self.base + path) as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def fit_to_server(self) -> int | None:
        """Cap the requests in flight at what the server runs at once, where its flavour says how
        to read that (llama.cpp: ``/props`` → ``total_slots``, its ``-np``): more only wait in
        its queue, and the wait counts against the per-request timeout — a slow speculative
        server with 2 slots and 8 requests in flight timed out. Call before any request is
        in flight; returns the new cap, or None where nothing changed."""
        flavour = self.routes.flavour
        if flavour is None or not flavour.parallel_probe:
            return None
        path, key = flavour.parallel_probe
        try:
            slots = (await self.call("GET", path)).get(key)
        except AuditError:
            return None
        if not isinstance(slots, int) or isinstance(slots, bool) or \
                not 1 <= slots < self.concurrency:
            return None
        self._sem, self.concurrency = asyncio.Semaphore(slots), slots
        return slots

    # --- API ---------------------------------------------------------------------------------
    async def models(self) -> list[dict]:
        data = await self.call("GET", "/v1/models")
        return [m for m in data.get("data") or [] if isinstance(m, dict)]

    async def resolve_model(self, listed: list[dict] | None = None) -> str:
        ids = [m.get("id") for m in (listed if listed is not None else await self.models())]
        if self.model is None:
            if not ids:
                raise AuditError(f"the {self.role} ({self.base}) lists no model in /v1/models")
            self.model = ids[0]
        elif ids and self.model not in ids:
            raise AuditError(f"the {self.role} does not serve model {self.model!r} "
                             f"(it serves {', '.join(map(repr, ids))})")
        return self.model

    def body(self, prompt: list[int] | str, **fields) -> dict:
        return {"model": self.model, "prompt": prompt, "return_tokens_as_token_ids": True,
                "stream": False, **fields}

    async def complete(self, prompt: list[int] | str, *, max_tokens: int, temperature: float,
                       logprobs: int, top_p: float = 1.0, top_k: int = -1,
                       seed: int | None = None, ignore_eos: bool = True,
                       fresh: bool = False, salt: str | None = None,
                       fields: Mapping | None = None) -> Completion:
        """One completion; ``fresh`` asks the server to recompute the whole prompt instead of
        reusing its prefix cache (the flavour's ``no_prefix_cache`` fields, or a salt of its
        own), so that the result does not depend on what the server computed before; ``salt``
        puts the request in that prefix-cache namespace (where the server has one); ``fields``:
        more request fields (penalties, ``stop``, ``logit_bias`` …), in the server's names."""
        return (await self.complete_all(prompt, max_tokens=max_tokens, temperature=temperature,
                                        logprobs=logprobs, top_p=top_p, top_k=top_k, seed=seed,
                                        ignore_eos=ignore_eos, fresh=fresh, salt=salt,
                                        fields=fields))[0]

    async def complete_all(self, prompt: list[int] | str, *, max_tokens: int,
                           temperature: float, logprobs: int, top_p: float = 1.0,
                           top_k: int = -1, seed: int | None = None, ignore_eos: bool = True,
                           fresh: bool = False, salt: str | None = None,
                           fields: Mapping | None = None) -> list[Completion]:
        """:meth:`complete`, every choice (``fields`` may ask for ``n`` > 1)."""
        body = self.body(prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                         logprobs=logprobs)
        if top_k > 0:
            body["top_k"] = top_k
        if seed is not None:
            body["seed"] = seed
        if ignore_eos:
            body["ignore_eos"] = True
        flavour = self.routes.flavour
        if temperature > 0 and flavour is not None:
            body.update(flavour.sampling_overrides)
        if fresh:
            body.update(flavour.no_prefix_cache if flavour is not None else {})
            if flavour is not None and flavour.cache_salt_field:
                body[flavour.cache_salt_field] = uuid.uuid4().hex
        if salt is not None and flavour is not None and flavour.cache_salt_field:
            body[flavour.cache_salt_field] = salt
        body.update(fields or {})
        body.update(self.endpoint.extra)
        data = await self.call("POST", "/v1/completions", body)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            first_choice(data, self.role)  # raises the readable error
        usage = data.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") \
            if isinstance(usage.get("prompt_tokens_details"), dict) else None
        if cached is None and flavour is not None and flavour.cached_tokens_field:
            cached = (data.get("timings") or {}).get(flavour.cached_tokens_field)
        spec = flavours.response_stats(data)
        out = []
        for choice in sorted((c for c in choices if isinstance(c, dict)),
                             key=lambda c: c.get("index") or 0):
            lp, left_out = whole_tokens(choice.get("logprobs"),
                                        usage.get("completion_tokens") if len(choices) == 1
                                        else None)
            positions = parse_logprobs(lp, f"the {self.role}", logprobs)
            if len(positions) > max_tokens:
                raise AuditError(f"the {self.role} returned {len(positions)} tokens for "
                                 f"max_tokens {max_tokens}")
            out.append(Completion(tuple(p.token for p in positions), positions,
                                  choice.get("finish_reason"),
                                  {**(data.get("spec") or {}), **spec.as_spec()} if spec
                                  else None, pieces=_pieces(lp), left_out=left_out,
                                  text=choice.get("text") or "",
                                  cached_tokens=cached if isinstance(cached, int) else None,
                                  body=body))
        return out

    async def echo(self, prompt, logprobs: int,
                   own_fields: bool = False) -> tuple[dict | None, int | None]:
        """An echo request that generates nothing (``max_tokens: 0``, the OpenAI scoring idiom);
        servers that insist on ``max_tokens >= 1`` get 1, and the extra token is dropped.
        ``own_fields``: with this side's extra fields (the candidate's prompt logprobs, as
        its users would get them). Returns (the choice's logprobs object, the prompt's token
        count if reported)."""
        body = self.body(prompt, max_tokens=self._echo_tokens, echo=True, logprobs=logprobs,
                         temperature=0)
        if own_fields:
            body.update(self.endpoint.extra)
        try:
            data = await self.call("POST", "/v1/completions", body)
        except AuditError as exc:
            if self._echo_tokens or "max_tokens" not in str(exc):
                raise
            self._echo_tokens = 1
            return await self.echo(prompt, logprobs, own_fields)
        usage = data.get("usage") or {}
        return first_choice(data, self.role).get("logprobs"), usage.get("prompt_tokens")


def _pieces(obj) -> tuple[bytes, ...] | None:
    """Each generated token's bytes, where the layout carries them (llama.cpp's ``bytes``)."""
    if isinstance(obj, Mapping) and isinstance(obj.get("content"), list):
        try:
            return tuple(bytes(e["bytes"]) for e in obj["content"])
        except (KeyError, TypeError, ValueError):
            return None
    return None


def error_message(data, text: str) -> str:
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


def first_choice(data: dict, role: str) -> dict:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AuditError(f"the {role} answered without choices: {str(data)[:120]}")
    return choices[0]
