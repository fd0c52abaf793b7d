"""OpenAI request bodies as pydantic models (extra fields forbidden) — the HTTP edge.

Owns: validation of ``/v1/completions`` and ``/v1/chat/completions`` bodies, including
spectest's extensions (``speculative``, ``top_k``, ``ignore_eos``) and the conversion of a valid
body to the engine's :class:`~spectest.engine.sampling.SamplingParams`.

Does not know: the engine, tokenizers or aiohttp. Anything these models reject becomes a 400
with an OpenAI-style error body naming the offending field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spectest.engine.sampling import SamplingParams

MAX_STOP = 8
GREEDY_BELOW = 1e-5


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=0, le=65536)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    user: str | None = Field(default=None, max_length=256)
    speculative: bool | None = None  # spectest extension: per-request A/B switch
    ignore_eos: bool = False  # vLLM extension (fixed-length benchmarks)
    return_tokens_as_token_ids: bool = False  # vLLM extension: logprob tokens as "token_id:N"

    @model_validator(mode="after")
    def _check_stop(self):
        stops = self.stop_list()
        if len(stops) > MAX_STOP or any(not s or len(s) > 256 for s in stops):
            raise ValueError(f"stop: at most {MAX_STOP} non-empty strings of <= 256 chars")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self, max_tokens: int, stop_token_ids: tuple[int, ...] = ()) -> SamplingParams:
        # Below 1e-5 (vLLM's epsilon) sampling is greedy in all but name, and a temperature
        # that underflows float32 (1e-300) would turn the logits into NaN: treat it as greedy.
        temperature = 0.0 if self.temperature < GREEDY_BELOW else self.temperature
        return SamplingParams(max_tokens=max_tokens, temperature=temperature,
                              top_p=self.top_p, top_k=max(self.top_k, 0), seed=self.seed,
                              stop=self.stop_list(), stop_token_ids=stop_token_ids,
                              ignore_eos=self.ignore_eos)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] = Field(min_length=1)
    max_tokens: int | None = Field(default=16, ge=0, le=65536)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: None = None

    @model_validator(mode="after")
    def _check(self):
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise ValueError("prompt: batches of prompts are not supported; send one")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: must be >= 1 unless echo is true (prompt scoring)")
        return self

    def prompt_value(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return self.prompt


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=65536)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _check(self):
        if self.max_tokens == 0:
            raise ValueError("max_tokens: must be >= 1 for chat completions")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        return self

    def wanted_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def chat_messages(self) -> list[dict]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]
