"""Plain records that cross the engine's boundary: requests in, outputs and round records out.

Owns: :class:`GenerationRequest`, :class:`RequestOutput` (a streamed delta), :class:`RequestStats`
(per-request timings and speculation counts), :class:`RoundRecord` / :class:`RowRecord` (what
observers see after every draft/verify round) and the engine's error types.

Does not know: HTTP, Prometheus, OpenTelemetry. These are frozen dataclasses so observers can
keep them without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spectest.engine.sampling import SamplingParams


class EngineError(Exception):
    """Base for errors the engine reports to a caller (the server maps them to 4xx)."""


class CapacityError(EngineError):
    """The request can never fit (prompt + max_tokens + draft slots > per-sequence KV)."""


class QueueFullError(EngineError):
    """Too many requests are already waiting; retry later."""


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    speculative: bool = True
    logprobs: int | None = None  # None: off; n >= 0: chosen token logprob + top-n
    prompt_logprobs: bool = False  # logprob of each prompt token given its prefix (echo)
    tag: str = ""  # opaque to the engine (the server's workload label); copied to records
    cache_salt: str | None = None  # prefix-cache namespace: other salts never share blocks


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestStats:
    prompt_tokens: int
    completion_tokens: int
    arrival_time: float
    queue_time: float  # arrival → admitted to a slot
    prefill_time: float
    ttft: float  # arrival → first token
    decode_time: float  # first token → last token
    e2e: float
    drafts: int  # rounds in which this request had drafts (vLLM num_drafts)
    draft_tokens: int
    accepted_tokens: int
    accepted_per_pos: tuple[int, ...]
    speculative: bool
    steps: tuple[tuple[int, int], ...] = ()  # (drafted, accepted) of each round that drafted
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache
    preemptions: int = 0  # times the request lost its KV to others and was recomputed

    @property
    def mean_accepted_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None


@dataclass(frozen=True)
class RequestOutput:
    """A delta for one request: new tokens since the previous output."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # first output only
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stats: RequestStats | None = None  # on the finished output
    error: str | None = None


@dataclass(frozen=True)
class RowRecord:
    request_id: str
    tag: str
    k_proposed: int
    accepted: int
    bonus: bool  # all proposed drafts accepted and the target's bonus token emitted
    emitted: int  # tokens emitted to the request this round (after truncation)
    speculative: bool


@dataclass(frozen=True)
class RoundRecord:
    index: int
    started_at: float  # time.time()
    batch_size: int
    k: int  # policy's K for this round
    decision: str
    draft_seconds: float
    verify_seconds: float
    rows: tuple[RowRecord, ...]
    drafter: str
    running: int
    waiting: int
    kv_usage: float  # 0..1 of the target's KV positions in use
    network_seconds: float = 0.0  # part of draft_seconds outside the draft model (remote drafter)
    draft_error: str | None = None  # the drafter failed this round; it ran without drafts
