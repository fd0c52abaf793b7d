"""OpenAI response bodies and SSE chunks for completions and chat completions.

Owns: turning the engine's :class:`RequestOutput` deltas into OpenAI JSON — non-streaming
bodies, streaming chunks (one chunk per engine round, so a chunk may carry several tokens under
speculation), ``logprobs`` in both APIs' shapes (with ``echo`` prompt scoring for completions),
``usage``, spectest's per-response ``spec`` object and the same speculation in vLLM's
per-request shape (``metrics.speculative_decoding``).

Does not know: HTTP or the engine's internals.
"""

from __future__ import annotations

import json
import time

import orjson

from spectest.engine.requests import RequestOutput, RequestStats, TokenLogprob


def sse(obj: dict) -> bytes:
    """One server-sent event. orjson (0.2 µs for a token chunk against json's 3 µs, and a
    streamed chunk is encoded on the engine thread, between two rounds) writes UTF-8 instead
    of ``\\u`` escapes; a string orjson refuses (a lone surrogate) goes through json."""
    try:
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    except TypeError:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def spec_object(stats: RequestStats | None, drafter: str) -> dict | None:
    if stats is None:
        return None
    return {"drafts": stats.drafts, "draft_tokens": stats.draft_tokens,
            "accepted_tokens": stats.accepted_tokens,
            "mean_accepted_length": stats.mean_accepted_length,
            "acceptance_rate": (stats.accepted_tokens / stats.draft_tokens
                                if stats.draft_tokens else None),
            "accepted_per_position": list(stats.accepted_per_pos),
            "speculative": stats.speculative, "drafter": drafter}


SPEC_METRICS = ("none", "summary", "detailed")  # --per-request-spec-decode-metrics


def spec_decode_metrics(stats: RequestStats | None, level: str) -> dict | None:
    """The request's speculation in vLLM's per-request shape (``metrics.speculative_decoding``,
    vLLM's ``--per-request-spec-decode-metrics summary|detailed``), so tools that read vLLM's
    (NVIDIA AIPerf's "Spec Decode" section) read spectest's too: verify steps, draft tokens,
    accepted draft tokens, the histogram of accepted drafts per step (``[j]``: steps that
    accepted exactly ``j``; the bonus token not counted), and at ``detailed`` the per-step
    arrays. vLLM's conventions kept: ``mean_acceptance_length`` 1.0 and
    ``draft_acceptance_rate`` 0.0 for a request without a verify step."""
    if stats is None or level == "none":
        return None
    k = max([len(stats.accepted_per_pos)] + [d for d, _ in stats.steps])
    histogram = [0] * (k + 1)
    for _, accepted in stats.steps:
        histogram[accepted] += 1
    out = {"mean_acceptance_length": (1 + stats.accepted_tokens / stats.drafts
                                      if stats.drafts else 1.0),
           "draft_acceptance_rate": (stats.accepted_tokens / stats.draft_tokens
                                     if stats.draft_tokens else 0.0),
           "acceptance_histogram": histogram, "num_spec_steps": stats.drafts,
           "num_accepted_draft_tokens": stats.accepted_tokens,
           "num_draft_tokens": stats.draft_tokens, "num_spec_tokens": k}
    if level == "detailed" and stats.steps:
        out["per_step_accepted"] = [a for _, a in stats.steps]
        out["per_step_drafted"] = [d for d, _ in stats.steps]
    return {"speculative_decoding": out}


def usage(stats: RequestStats | None, *more: RequestStats | None) -> dict | None:
    """OpenAI's usage of a request (``more``: its other choices, n > 1: their completion
    tokens are added), with ``prompt_tokens_details.cached_tokens``, the prompt tokens the
    prefix cache served (vLLM's ``--enable-prompt-tokens-details``)."""
    if stats is None:
        return None
    completion = stats.completion_tokens + sum(m.completion_tokens for m in more if m)
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": completion,
            "total_tokens": stats.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def summed_stats(stats: list[RequestStats | None]) -> RequestStats | None:
    """One request's speculation over its n choices (the ``spec`` object of an n > 1 reply)."""
    real = [s for s in stats if s is not None]
    if not real:
        return None
    first = real[0]
    return RequestStats(first.prompt_tokens, sum(s.completion_tokens for s in real),
                        first.arrival_time, first.queue_time, first.prefill_time, first.ttft,
                        max(s.decode_time for s in real), max(s.e2e for s in real),
                        sum(s.drafts for s in real), sum(s.draft_tokens for s in real),
                        sum(s.accepted_tokens for s in real), (), first.speculative,
                        cached_tokens=first.cached_tokens)


_SLOT = "\x00spectest-text\x00"  # stands for a chunk's text while its template is cut


class _Format:
    object_full = ""
    object_chunk = ""

    spec_metrics = "none"  # the level of vLLM-shaped per-request metrics (SPEC_METRICS)

    def __init__(self, tokenizer, model: str, body):
        self.tok, self.model, self.body = tokenizer, model, body
        self.created = int(time.time())
        self.as_ids = bool(getattr(body, "return_tokens_as_token_ids", False))
        self._template: tuple[bytes, ...] | None = None

    def stream_events(self, rid: str, out: RequestOutput, include_usage: bool) -> bytes:
        """The SSE bytes of one output: ``stream_chunks`` → ``sse``. Most outputs of a stream
        are plain text deltas (not the last, no logprobs): those are the request's event
        template — cut once from ``sse(text_chunk(rid, _SLOT))`` — around the JSON of the
        text, the same bytes at a quarter of the cost (this runs on the engine thread once a
        round per streamed request)."""
        if (out.text or out.token_ids) and not out.finished and out.logprobs is None \
                and out.prompt_logprobs is None and not self.body.logprobs:
            if self._template is None:  # () when the id or model holds the slot marker
                parts = sse(self.text_chunk(rid, _SLOT)).split(orjson.dumps(_SLOT))
                self._template = tuple(parts) if len(parts) == 2 else ()
            if self._template:
                prefix, suffix = self._template
                try:
                    return prefix + orjson.dumps(out.text) + suffix
                except TypeError:  # text orjson refuses: the general path's fallback
                    pass
        return b"".join([sse(c) for c in self.stream_chunks(rid, out, include_usage)])

    def text_chunk(self, rid: str, text: str) -> dict:
        """A streamed chunk carrying only ``text``: what ``stream_chunks`` makes of a plain
        output that is not the last."""
        raise NotImplementedError

    def token_str(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else self.tok.token_text(token_id)

    def envelope(self, rid: str, obj: str, choices: list, **extra) -> dict:
        out = {"id": rid, "object": obj, "created": self.created, "model": self.model,
               "choices": choices}
        out.update({k: v for k, v in extra.items() if v is not None})
        return out

    def metrics(self, stats: RequestStats | None) -> dict | None:
        return spec_decode_metrics(stats, self.spec_metrics)

    def choice(self, outputs: list[RequestOutput], index: int = 0) -> dict:
        raise NotImplementedError

    def full(self, rid: str, outputs: list[RequestOutput]) -> dict:
        """The non-streaming body of a request's outputs."""
        last = outputs[-1]
        return self.envelope(rid, self.object_full, [self.choice(outputs)],
                             usage=usage(last.stats),
                             spec=spec_object(last.stats, self.drafter_name),
                             metrics=self.metrics(last.stats))

    def full_choices(self, rid: str, choices: list[list[RequestOutput]]) -> dict:
        """The body of an n > 1 request: one choice per run, usage and ``spec`` over all of
        them (vLLM gives no per-request speculation metrics for n > 1: neither does this)."""
        stats = [outputs[-1].stats for outputs in choices]
        return self.envelope(rid, self.object_full,
                             [self.choice(outputs, i) for i, outputs in enumerate(choices)],
                             usage=usage(stats[0], *stats[1:]),
                             spec=spec_object(summed_stats(stats), self.drafter_name))

    def final_chunks(self, rid: str, out: RequestOutput, include_usage: bool) -> list[dict]:
        spec = spec_object(out.stats, self.drafter_name)
        chunks = []
        if include_usage:
            chunks.append(self.envelope(rid, self.object_chunk, [], usage=usage(out.stats),
                                        spec=spec, metrics=self.metrics(out.stats)))
        return chunks


class CompletionFormat(_Format):
    object_full = "text_completion"
    object_chunk = "text_completion"

    def __init__(self, tokenizer, model, body, prompt_ids, drafter_name: str = "",
                 spec_metrics: str = "none"):
        super().__init__(tokenizer, model, body)
        self.spec_metrics = spec_metrics
        self.prompt_ids = prompt_ids
        self.drafter_name = drafter_name
        self.offset = 0

    def _logprobs(self, lps: tuple[TokenLogprob | None, ...], ids) -> dict:
        tokens, token_lps, tops, offsets = [], [], [], []
        for tid, lp in zip(ids, lps):
            text = self.token_str(tid)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(self.tok.token_text(tid))
            token_lps.append(None if lp is None else lp.logprob)
            tops.append(None if lp is None else {self.token_str(t): v for t, v in lp.top})
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
                "text_offset": offsets}

    def _merge(self, parts: list[dict]) -> dict | None:
        if not parts:
            return None
        return {k: [x for p in parts for x in p[k]] for k in parts[0]}

    def _choice_logprobs(self, out: RequestOutput) -> list[dict]:
        parts = []
        if out.prompt_logprobs is not None:
            parts.append(self._logprobs(out.prompt_logprobs, self.prompt_ids))
        if out.logprobs is not None:
            parts.append(self._logprobs(out.logprobs, out.token_ids))
        return parts

    def choice(self, outputs: list[RequestOutput], index: int = 0) -> dict:
        self.offset = 0
        text = "".join(o.text for o in outputs)
        if self.body.echo:
            text = self.tok.decode(self.prompt_ids, skip_special_tokens=False) + text
        parts = [p for o in outputs for p in self._choice_logprobs(o)]
        return {"index": index, "text": text,
                "logprobs": self._merge(parts) if self.body.logprobs is not None else None,
                "finish_reason": outputs[-1].finish_reason}

    def stream_start(self, rid: str) -> list[dict]:
        return []  # with echo, the prompt text goes out with the first engine output

    def text_chunk(self, rid: str, text: str) -> dict:
        return self.envelope(rid, self.object_chunk, [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": None}])

    def stream_chunks(self, rid: str, out: RequestOutput, include_usage: bool) -> list[dict]:
        text = out.text
        if self.body.echo and out.prompt_logprobs is not None:
            text = self.tok.decode(self.prompt_ids, skip_special_tokens=False) + text
        parts = self._choice_logprobs(out)
        chunks = []
        if text or out.token_ids or out.finished or parts:
            choice = {"index": 0, "text": text,
                      "logprobs": self._merge(parts) if self.body.logprobs is not None else None,
                      "finish_reason": out.finish_reason if out.finished else None}
            chunks.append(self.envelope(
                rid, self.object_chunk, [choice],
                spec=spec_object(out.stats, self.drafter_name) if out.finished else None))
        if out.finished:
            chunks += self.final_chunks(rid, out, include_usage)
        return chunks


class ChatFormat(_Format):
    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def __init__(self, tokenizer, model, body, drafter_name: str = "",
                 spec_metrics: str = "none"):
        super().__init__(tokenizer, model, body)
        self.drafter_name = drafter_name
        self.spec_metrics = spec_metrics

    def _content(self, out: RequestOutput) -> list[dict]:
        items = []
        for tid, lp in zip(out.token_ids, out.logprobs or ()):
            text = self.token_str(tid)
            items.append({"token": text, "logprob": lp.logprob,
                          "bytes": list(self.tok.token_text(tid).encode()),
                          "top_logprobs": [{"token": self.token_str(t), "logprob": v,
                                            "bytes": list(self.tok.token_text(t).encode())}
                                           for t, v in lp.top]})
        return items

    def choice(self, outputs: list[RequestOutput], index: int = 0) -> dict:
        logprobs = None
        if self.body.logprobs:
            logprobs = {"content": [c for o in outputs for c in self._content(o)]}
        return {"index": index, "message": {"role": "assistant",
                                            "content": "".join(o.text for o in outputs)},
                "logprobs": logprobs, "finish_reason": outputs[-1].finish_reason}

    def stream_start(self, rid: str) -> list[dict]:
        return [self.envelope(rid, self.object_chunk, [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}])]

    def text_chunk(self, rid: str, text: str) -> dict:
        return self.envelope(rid, self.object_chunk, [
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}])

    def stream_chunks(self, rid: str, out: RequestOutput, include_usage: bool) -> list[dict]:
        chunks = []
        if out.text or out.token_ids or out.finished:
            delta = {"content": out.text} if (out.text or out.token_ids) else {}
            logprobs = {"content": self._content(out)} if self.body.logprobs else None
            chunks.append(self.envelope(
                rid, self.object_chunk,
                [{"index": 0, "delta": delta, "logprobs": logprobs,
                  "finish_reason": out.finish_reason if out.finished else None}],
                spec=spec_object(out.stats, self.drafter_name) if out.finished else None))
        if out.finished:
            chunks += self.final_chunks(rid, out, include_usage)
        return chunks
