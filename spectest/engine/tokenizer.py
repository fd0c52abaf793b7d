"""Text ⇄ token ids for one checkpoint, streaming detokenization and chat templates.

Owns: a :class:`Tokenizer` wrapping a ``tokenizers.Tokenizer`` with the special-token facts the
engine needs (BOS, every EOS id), the chat template (rendered with jinja2 in a sandbox, the way
Hugging Face ``apply_chat_template`` does), and :class:`StreamDecoder`, which turns a growing
list of ids into text deltas without ever splitting a multi-byte UTF-8 character (what SSE
streaming needs).

Does not know: files or formats. ``spectest.engine.loader`` (HF directories) and
``spectest.engine.gguf_loader`` (GGUF metadata) build the backend and pass the facts in.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import jinja2
import tokenizers
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers.decoders import DecodeStream


class ChatTemplateError(ValueError):
    """The model has no chat template, or the template rejected the messages."""


@dataclass(frozen=True)
class Tokenizer:
    backend: tokenizers.Tokenizer
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    chat_template: str | None = None
    name: str = "model"
    # The strings a chat template sees as ``bos_token`` / ``eos_token`` (tokenizer_config.json's
    # values; they may differ from the first EOS id, e.g. Llama 3 Instruct). Default: from ids.
    bos_token: str | None = None
    eos_token: str | None = None

    def __post_init__(self):
        if self.bos_token is None and self.bos_token_id is not None:
            object.__setattr__(self, "bos_token", self.backend.id_to_token(self.bos_token_id))
        if self.eos_token is None and self.eos_token_ids:
            object.__setattr__(self, "eos_token", self.backend.id_to_token(self.eos_token_ids[0]))

    # -- ids ----------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special tokens written in the text (``<|im_start|>``) map to
        their ids; ``add_special_tokens`` adds what the post-processor adds (e.g. a BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token, special tokens included (for logprob reporting). A token that
        is only part of a UTF-8 character reads as U+FFFD."""
        return self.backend.decode([token_id], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce (added tokens included). The model's
        embedding may be larger (padded); never smaller."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the id ⇄ token map (added tokens included): two tokenizers with the same
        fingerprint give every token the same id, which is what a draft and its target share."""
        vocab = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda t: t[1])
        return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()

    def stream_decoder(self, skip_special_tokens: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens)

    # -- chat ---------------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **template_kwargs: Any) -> str:
        """Render ``messages`` ([{"role", "content"}, ...]) to the prompt text.

        The text already contains the template's special tokens (BOS included if the template
        writes it), so encode it with ``add_special_tokens=False``. Raises
        :class:`ChatTemplateError` when the model has no template or the template calls
        ``raise_exception``.
        """
        if not self.chat_template:
            raise ChatTemplateError(
                f"model {self.name!r} has no chat template (tokenizer_config.json "
                f"'chat_template', chat_template.jinja or GGUF 'tokenizer.chat_template'); "
                f"use /v1/completions with a plain prompt instead")
        try:
            return self._compiled_template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                **template_kwargs)
        except jinja2.TemplateError as exc:  # includes raise_exception() and sandbox violations
            raise ChatTemplateError(f"chat template of {self.name!r}: {exc}") from exc

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template of {self.name!r} does not parse: {exc}") \
                from exc


class StreamDecoder:
    """Text deltas for a growing token sequence, one instance per streamed response.

    ``delta(ids)`` takes *all* ids generated so far and returns the text they add since the
    previous call. Bytes of an unfinished UTF-8 character are held back until the character
    completes, so concatenated deltas never contain a split character. Ids are never
    un-generated (speculation rewinds happen before tokens reach here).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._backend = tokenizer.backend
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._seen = 0

    def delta(self, ids: list[int]) -> str:
        if len(ids) < self._seen:
            raise ValueError(f"token list shrank from {self._seen} to {len(ids)} ids")
        parts = []
        for token_id in ids[self._seen:]:
            piece = self._stream.step(self._backend, token_id)
            if piece:
                parts.append(piece)
        self._seen = len(ids)
        return "".join(parts)


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False,
            ensure_ascii: bool = False) -> str:
    # HF overrides jinja's tojson so that non-ASCII text and key order survive.
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                      ensure_ascii=ensure_ascii)


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)
