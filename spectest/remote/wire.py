"""The wire between ``spectest serve`` and ``spectest serve-draft``: one HTTP round trip a round.

Owns: the request and response of a draft round and of a session, as pydantic models (extra
fields forbidden) and one binary layout. A round request is JSON — the queued cache operations
(``admit`` a slot with its prompt, ``rewind`` a slot to its valid length, ``release`` a slot),
then one row per sequence that wants drafts: the committed tokens the draft side has not seen
yet, K and the request's sampling settings with its uniforms (so a sampled draft is the same
draw it would be in-process), and the confidence floor of the K policy. A round answer is::

    4-byte big-endian header length | header JSON | float32 draft probabilities

where the header holds the drafted tokens, their count per row, the draft model's own time, and
which rows carry probabilities: only sampled rows do ([rows, K, V] float32, C order), because
rejection sampling needs the exact distribution each draft was drawn from, and greedy
verification needs none.

Does not know: sockets, aiohttp, the draft model. Both sides import it; nothing here runs a
model or opens a connection.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Annotated, Literal, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from spectest.engine.sampling import SamplingParams

PROTOCOL = "spectest-draft/1"
MAX_K = 64
MAX_POSITIONS = 1 << 22  # slots × positions one session may hold (a bound, not a target)

Token = Annotated[int, Field(ge=0)]
Slot = Annotated[int, Field(ge=0, le=4096)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdmitOp(_Strict):
    op: Literal["admit"]
    slot: Slot
    tokens: list[Token] = Field(min_length=1)  # committed tokens; the last is not cached yet


class RewindOp(_Strict):
    op: Literal["rewind"]
    slot: Slot
    n_valid: Annotated[int, Field(ge=0)]


class ReleaseOp(_Strict):
    op: Literal["release"]
    slot: Slot


Op = Annotated[Union[AdmitOp, RewindOp, ReleaseOp], Field(discriminator="op")]


class RowIn(_Strict):
    slot: Slot
    append: list[Token]  # committed tokens since the last round this side saw
    k: Annotated[int, Field(ge=1, le=MAX_K)]
    greedy: bool
    temperature: Annotated[float, Field(ge=0)]
    top_k: Annotated[int, Field(ge=-1)]
    top_p: Annotated[float, Field(gt=0, le=1)]
    uniforms: list[Annotated[float, Field(ge=0, le=1)]] | None = None  # [k] for sampled rows
    # the rest of the request's sampling (engine.penalties): the draft adjusts as the target
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: Annotated[float, Field(gt=0)] = 1.0
    logit_bias: list[tuple[Token, float]] = []
    prompt_len: Annotated[int, Field(ge=0)] = 0

    def params(self) -> SamplingParams:
        """The row's sampling as the engine's record (max_tokens does not matter here)."""
        return SamplingParams(temperature=0.0 if self.greedy else self.temperature,
                              top_p=self.top_p, top_k=max(self.top_k, 0), min_p=self.min_p,
                              presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty,
                              logit_bias=tuple(self.logit_bias))


class RoundIn(_Strict):
    ops: list[Op] = []
    rows: list[RowIn] = []
    stop_threshold: Annotated[float, Field(ge=0, le=1)] | None = None


class SessionIn(_Strict):
    n_slots: Annotated[int, Field(ge=1, le=4096)]
    max_len: Annotated[int, Field(ge=2, le=1 << 20)]


class DraftInfo(_Strict):
    """``GET /v1/draft/info``: what the draft server holds."""
    protocol: str
    model: str
    vocab_size: int
    tokenizer_fingerprint: str
    quantization: str  # the draft's weights: none (float) or int8
    sessions: int


class SessionOut(DraftInfo):
    session: str


class WireError(ValueError):
    """A message that does not follow this layout."""


@dataclass(frozen=True)
class DraftAnswer:
    tokens: torch.Tensor  # [B, K] long
    lens: torch.Tensor  # [B] long
    probs: torch.Tensor | None  # [B, K, V] float32, zeros on greedy rows; None: no sampled row
    draft_seconds: float  # the draft side's own time for this round (ops + model)


def encode_answer(tokens: torch.Tensor, lens: torch.Tensor, probs: torch.Tensor | None,
                  sampled_rows: list[int], draft_seconds: float) -> bytes:
    """tokens [B, K], lens [B], probs [B, K, V] or None → the binary answer."""
    K = int(tokens.shape[1])
    send = probs is not None and bool(sampled_rows) and K > 0
    header = {"tokens": tokens.tolist(), "lens": lens.tolist(),
              "prob_rows": sampled_rows if send else [],
              "vocab_size": int(probs.shape[-1]) if send else 0,
              "draft_seconds": draft_seconds}
    head = json.dumps(header, separators=(",", ":")).encode()
    body = probs[sampled_rows].contiguous().numpy().astype("<f4", copy=False).tobytes() \
        if send else b""
    return struct.pack(">I", len(head)) + head + body


def decode_answer(data: bytes, batch: int) -> DraftAnswer:
    """The binary answer → tensors; raises :class:`WireError` on anything inconsistent."""
    try:
        (n,) = struct.unpack(">I", data[:4])
        header = json.loads(data[4:4 + n])
        tokens = torch.tensor(header["tokens"], dtype=torch.long).reshape(batch, -1)
        lens = torch.tensor(header["lens"], dtype=torch.long).reshape(batch)
        prob_rows, V = list(header["prob_rows"]), int(header["vocab_size"])
        draft_seconds = float(header["draft_seconds"])
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise WireError(f"malformed draft answer: {exc}") from exc
    K = tokens.shape[1]
    if bool((lens < 0).any()) or bool((lens > K).any()):
        raise WireError("malformed draft answer: draft lengths outside [0, K]")
    body = data[4 + n:]
    probs = None
    if prob_rows:
        expect = len(prob_rows) * K * V * 4
        if len(body) != expect or V <= 0 or not all(0 <= r < batch for r in prob_rows):
            raise WireError(f"malformed draft answer: {len(body)} probability bytes, "
                            f"expected {expect}")
        sent = torch.from_numpy(np.frombuffer(body, dtype="<f4").reshape(len(prob_rows), K, V)
                                .copy())
        probs = torch.zeros(batch, K, V)
        probs[prob_rows] = sent
    elif body:
        raise WireError("malformed draft answer: probabilities without rows")
    return DraftAnswer(tokens, lens, probs, draft_seconds)
