"""OpenAI request bodies as pydantic models (extra fields forbidden) — the HTTP edge.

Owns: validation of ``/v1/completions`` and ``/v1/chat/completions`` bodies, including
spectest's and vLLM's extensions (``speculative``, ``top_k``, ``min_p``, ``repetition_penalty``,
``ignore_eos``, ``cache_salt``) and the conversion of a valid body to the engine's
:class:`~spectest.engine.sampling.SamplingParams`; and of the admin endpoint's body
(``POST /admin/speculation``: :class:`SpeculationUpdate`).

Every string a client sends is :data:`Text`: valid Unicode, i.e. encodable as UTF-8. JSON may
spell lone surrogates (``"\\udcff"``) that Python's decoder turns into a ``str`` no tokenizer,
metric label or span exporter can take; they are rejected here, naming the field. Fields that
accept several JSON types (``prompt``, ``stop``, ``content``) are unions discriminated by the
JSON type of the input, so a bad value gets the error of the member it was meant for; the
members' tags are written ``<...>`` (``http_errors.param_path`` leaves them out of ``param``).

Does not know: the engine, tokenizers or aiohttp. Anything these models reject becomes a 400
with an OpenAI-style error body naming the offending field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator,
                      Field, Tag, model_validator)
from pydantic_core import PydanticCustomError

from spectest.engine.policies import POLICIES
from spectest.engine.sampling import SamplingParams

MAX_STOP = 8
MAX_STOP_CHARS = 256
GREEDY_BELOW = 1e-5
MAX_N = 8  # choices a request may ask for (non-streaming)
MAX_LOGIT_BIAS = 300  # entries of logit_bias (OpenAI's limit)


def _encodable(value: Any) -> Any:
    """``value`` unchanged if it is not a string or is valid Unicode; else a 400-to-be naming
    the first lone surrogate (runs before pydantic's own string checks, which would reject it
    with a vaguer message when the field has a length bound, and pass it through otherwise)."""
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PydanticCustomError(
                "invalid_unicode",
                "text is not valid Unicode: lone surrogate {char} at index {index} (JSON "
                "\\ud800-\\udfff escapes must come in high-low pairs)",
                {"char": f"U+{ord(value[exc.start]):04X}", "index": exc.start}) from None
    return value


# Every client string: tokenizable, printable in a metric label or a span attribute.
Text = Annotated[str, BeforeValidator(_encodable)]


def _json_type(value: Any) -> str | None:
    """The union member a value is meant for, by its JSON type (``None``: no member)."""
    if isinstance(value, str):
        return "<string>"
    return "<array>" if isinstance(value, list) else None


def _prompt_type(value: Any) -> str | None:
    if isinstance(value, list) and value and isinstance(value[0], str):
        return "<strings>"
    return _json_type(value)


def _one_of(*members, what: str, pick=_json_type):
    """A union of ``(tag, type)`` members, the one for an input chosen by ``pick``; ``what``
    says what the field takes, for the error when ``pick`` finds no member."""
    return Annotated[Union[tuple(Annotated[t, Tag(tag)] for tag, t in members)],
                     Discriminator(pick, custom_error_type="invalid_type",
                                   custom_error_message=f"Input should be {what}")]


StopText = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Stop = _one_of(("<string>", StopText),
               ("<array>", Annotated[list[StopText], Field(max_length=MAX_STOP)]),
               what=f"a string or an array of at most {MAX_STOP} strings")


def _one_prompt(prompts: list[str]) -> list[str]:
    if len(prompts) > 1:
        raise PydanticCustomError("batch_unsupported",
                                  "batches of prompts are not supported; send one")
    return prompts


Prompt = _one_of(("<string>", Annotated[Text, Field(min_length=1)]),
                 ("<array>", Annotated[list[int], Field(min_length=1)]),
                 ("<strings>", Annotated[list[Text], AfterValidator(_one_prompt),
                                         Field(min_length=1, json_schema_extra={"maxItems": 1})]),
                 what="a string, an array of token ids or an array of one string",
                 pick=_prompt_type)


def _requires(field: str, when: dict, other: str, value) -> dict:
    """JSON Schema for a cross-field rule a ``model_validator`` enforces: ``field`` matching
    ``when`` needs ``other`` == ``value`` (published so that clients and schema-driven
    generators know it)."""
    return {"if": {"required": [field], "properties": {field: when}},
            "then": {"required": [other], "properties": {other: {"const": value}}}}


STREAM_OPTIONS_NEED_STREAM = _requires("stream_options", {"type": "object"}, "stream", True)


# OpenAI's logit_bias: token ids (as JSON object keys) → a bias in [-100, 100] added to the logit
TokenKey = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]
LogitBias = Annotated[dict[TokenKey, Annotated[float, Field(ge=-100, le=100)]],
                      Field(max_length=MAX_LOGIT_BIAS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Strict):
    model: Text
    max_tokens: int | None = Field(default=None, ge=0, le=65536)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=2**63 - 1)  # int64 in the engine; >= vocab: off
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: Stop | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = None
    user: Annotated[Text, Field(max_length=256)] | None = None
    speculative: bool | None = None  # spectest extension: per-request A/B switch
    ignore_eos: bool = False  # vLLM extension (fixed-length benchmarks)
    return_tokens_as_token_ids: bool = False  # vLLM extension: logprob tokens as "token_id:N"
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # vLLM extension
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)  # vLLM extension
    cache_salt: Annotated[Text, Field(min_length=1, max_length=256)] | None = None  # vLLM's

    @model_validator(mode="after")
    def _check_stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.n > 1 and self.stream:
            raise ValueError("n > 1 is served without streaming only")
        return self

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())

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
                              ignore_eos=self.ignore_eos, min_p=self.min_p,
                              presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty,
                              logit_bias=self.logit_bias_pairs())


class CompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        STREAM_OPTIONS_NEED_STREAM, _requires("max_tokens", {"const": 0}, "echo", True)]})
    prompt: Prompt
    max_tokens: int | None = Field(default=16, ge=0, le=65536)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: None = None

    @model_validator(mode="after")
    def _check(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: must be >= 1 unless echo is true (prompt scoring)")
        return self

    def prompt_value(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return self.prompt


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


Content = _one_of(("<string>", Text), ("<array>", list[TextPart]),
                  what="a string or an array of text parts")


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: Content
    name: Text | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        STREAM_OPTIONS_NEED_STREAM, _requires("top_logprobs", {"type": "integer"}, "logprobs",
                                              True)]})
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=65536)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=65536)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _check(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        return self

    def wanted_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def chat_messages(self) -> list[dict]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


class TokenizeRequest(_Strict):
    """vLLM's ``POST /tokenize`` body (completions form)."""
    model: Text
    prompt: Text
    add_special_tokens: bool = True


class DetokenizeRequest(_Strict):
    """vLLM's ``POST /detokenize`` body."""
    model: Text
    tokens: list[int] = Field(max_length=1 << 20)


def _optional_fields(schema: dict) -> None:
    """Published as optional without a default: left out means unchanged, null is refused."""
    schema["minProperties"] = 1
    for prop in schema["properties"].values():
        prop.pop("default", None)


class SpeculationUpdate(_Strict):
    """``POST /admin/speculation``: what to change; a field left out keeps its value. The K
    bound (the server's KV reservation) and whether a policy can be built (goodput needs
    ``--profile``) are checked by the engine's control, also as 400s."""
    model_config = ConfigDict(json_schema_extra=_optional_fields)
    # Left out: unchanged (a default is not validated, so an explicit null is refused).
    enabled: bool = None
    k: int = Field(default=None, ge=1, le=64)
    k_policy: Literal[POLICIES] = None

    @model_validator(mode="after")
    def _check(self):
        if self.enabled is None and self.k is None and self.k_policy is None:
            raise ValueError("give at least one of enabled, k, k_policy")
        return self
