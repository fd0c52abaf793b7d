"""``server.responses``: the SSE bytes a stream sends, built on the engine thread.

Proves: for any JSON-able chunk (any text, including emoji, NUL and lone surrogates that
orjson refuses, which go through ``json``) the event is ``data: <JSON>\\n\\n`` and decodes to the
same object, as a standard JSON parser reads it; and ``stream_events`` — a request's cut
template around the text for plain deltas — gives exactly the bytes of the general path
(``stream_chunks`` → ``sse``) for every output, both APIs, any id, model name and text, with
and without logprobs, echo, usage, and on the last output.
"""

from __future__ import annotations

import json

import pytest
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from spectest.engine.requests import RequestOutput, RequestStats, TokenLogprob
from spectest.server.responses import ChatFormat, CompletionFormat, sse

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=500, deadline=None)
@given(JSON)
def test_an_event_decodes_to_its_chunk(obj):
    event = sse({"choices": [{"text": obj}]})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert b"\n" not in event[:-2]  # one line: an SSE parser splits events on blank lines
    assert json.loads(event[6:-2]) == {"choices": [{"text": obj}]}


def test_a_lone_surrogate_falls_back_to_json():
    assert sse({"text": "a\udcffb"}) == b'data: {"text":"a\\udcffb"}\n\n'
    assert sse({"text": "é🙂"}) == 'data: {"text":"é🙂"}\n\n'.encode()


class Tok:
    def token_text(self, token_id: int) -> str:
        return f"<{token_id}>"

    def decode(self, ids, skip_special_tokens=False) -> str:
        return "".join(self.token_text(i) for i in ids)


STATS = RequestStats(3, 2, 0.0, 0.0, 0.1, 0.1, 0.2, 0.3, 1, 4, 2, (1, 1, 0, 0), True)


@settings(max_examples=400, deadline=None)
@given(chat=st.booleans(), rid=st.text(min_size=1, max_size=12), model=st.text(max_size=12),
       texts=st.lists(st.text(max_size=8), min_size=1, max_size=4),
       logprobs=st.sampled_from([None, 0, 2]), echo=st.booleans(), usage=st.booleans(),
       with_prompt_logprobs=st.booleans())
def test_stream_events_are_the_general_paths_bytes(chat, rid, model, texts, logprobs, echo,
                                                    usage, with_prompt_logprobs):
    body = SimpleNamespace(logprobs=bool(logprobs) if chat else logprobs, echo=echo,
                           return_tokens_as_token_ids=False)
    def new():  # a format keeps state over a stream (text offsets): one per path
        return (ChatFormat(Tok(), model, body) if chat
                else CompletionFormat(Tok(), model, body, prompt_ids=(5, 6)))
    fmt, reference = new(), new()
    reference.created = fmt.created
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        lps = (TokenLogprob(7, -0.5, ((7, -0.5), (8, -1.5))),) if logprobs is not None else None
        out = RequestOutput(rid, (7,), text, logprobs=lps,
                            prompt_logprobs=(None, TokenLogprob(6, -2.0)) if (
                                i == 0 and with_prompt_logprobs and not chat) else None,
                            finished=last, finish_reason="length" if last else None,
                            stats=STATS if last else None)
        general = b"".join(sse(c) for c in reference.stream_chunks(rid, out, usage))
        assert fmt.stream_events(rid, out, usage) == general


def test_plain_deltas_skip_the_general_path(monkeypatch):
    body = SimpleNamespace(logprobs=None, echo=False, return_tokens_as_token_ids=False)
    for fmt in (ChatFormat(Tok(), "m", body), CompletionFormat(Tok(), "m", body, (5,))):
        expected = b"".join(sse(c) for c in fmt.stream_chunks("r", RequestOutput(
            "r", (7,), ' "é\n'), False))
        monkeypatch.setattr(fmt, "stream_chunks", None)  # calling it would raise
        assert fmt.stream_events("r", RequestOutput("r", (7,), ' "é\n'), False) == expected
        assert fmt._template is not None


def test_a_model_name_holding_the_slot_marker_takes_the_general_path():
    body = SimpleNamespace(logprobs=None, echo=False, return_tokens_as_token_ids=False)
    model = "\x00spectest-text\x00"  # the whole string: its JSON token is the slot's
    fmt, reference = ChatFormat(Tok(), model, body), ChatFormat(Tok(), model, body)
    reference.created = fmt.created
    out = RequestOutput("r", (7,), "hi")
    assert fmt.stream_events("r", out, False) == b"".join(
        sse(c) for c in reference.stream_chunks("r", out, False))
    assert fmt._template == ()


def test_speculation_in_vllms_per_request_shape():
    """``metrics.speculative_decoding`` as vLLM 0.32 writes it: the histogram of accepted drafts
    per verify step (bonus not counted), sums equal to spectest's own ``spec`` object, the
    per-step arrays only at ``detailed``, vLLM's 1.0 / 0.0 for a request without a step."""
    from spectest.server.responses import spec_decode_metrics, spec_object
    stats = RequestStats(3, 9, 0.0, 0.0, 0.1, 0.1, 0.2, 0.3, 3, 10, 5, (2, 2, 1, 0), True,
                         steps=((4, 0), (4, 3), (2, 2)))
    summary = spec_decode_metrics(stats, "summary")["speculative_decoding"]
    assert summary["acceptance_histogram"] == [1, 0, 1, 1, 0]  # one step each of 0, 2, 3
    assert summary["num_spec_steps"] == 3 and summary["num_draft_tokens"] == 10
    assert summary["num_accepted_draft_tokens"] == 5 and summary["num_spec_tokens"] == 4
    assert summary["mean_acceptance_length"] == pytest.approx(1 + 5 / 3)
    assert summary["draft_acceptance_rate"] == pytest.approx(0.5)
    assert "per_step_accepted" not in summary
    spec = spec_object(stats, "ngram")
    assert spec["drafts"] == summary["num_spec_steps"]
    assert spec["accepted_tokens"] == sum(j * n for j, n in
                                          enumerate(summary["acceptance_histogram"]))
    detailed = spec_decode_metrics(stats, "detailed")["speculative_decoding"]
    assert detailed["per_step_accepted"] == [0, 3, 2]
    assert detailed["per_step_drafted"] == [4, 4, 2]
    no_step = RequestStats(3, 2, 0.0, 0.0, 0.1, 0.1, 0.2, 0.3, 0, 0, 0, (), True)
    none = spec_decode_metrics(no_step, "summary")["speculative_decoding"]
    assert none["mean_acceptance_length"] == 1.0 and none["draft_acceptance_rate"] == 0.0
    assert spec_decode_metrics(stats, "none") is None and spec_decode_metrics(None, "summary") \
        is None
