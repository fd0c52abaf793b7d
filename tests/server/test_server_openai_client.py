"""The official ``openai`` Python client, unmodified, against a live spectest server.

Proves the API speaks OpenAI's wire format as the client parses it: completions, chat,
streaming with ``include_usage``, logprobs in both APIs' shapes, ``echo`` prompt scoring (text
and token-id prompts) that agrees with the logprobs of a generation, the per-response ``spec``
object, the ``speculative`` A/B switch through ``extra_body``, and that greedy output does not
change when speculation is switched off.
"""

from __future__ import annotations

import math

import openai
import pytest

from live_server import MODEL, LiveServer, make_server

FIXED = {"ignore_eos": True}  # fixed-length generations: like for like


@pytest.fixture(scope="module")
def live(pair):
    with LiveServer(make_server(pair, max_num_seqs=4, max_model_len=256)) as live:
        yield live


@pytest.fixture(scope="module")
def client(live):
    with openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0,
                       timeout=60) as client:
        yield client


def spec_of(resp) -> dict:
    return resp.model_extra["spec"]


def check_spec(spec: dict, completion_tokens: int) -> None:
    assert set(spec) >= {"drafts", "draft_tokens", "accepted_tokens", "mean_accepted_length",
                         "speculative", "drafter"}
    assert spec["drafter"] == "draft-model" and spec["speculative"] is True
    assert spec["drafts"] >= 1
    assert 0 <= spec["accepted_tokens"] <= spec["draft_tokens"] <= 4 * spec["drafts"]
    assert spec["mean_accepted_length"] == pytest.approx(
        1 + spec["accepted_tokens"] / spec["drafts"])
    per_pos = spec["accepted_per_position"]
    assert sum(per_pos) == spec["accepted_tokens"]
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # acceptance stops at a rejection
    # one token from prefill, then each round emits accepted + 1 (the last may be truncated)
    assert completion_tokens <= 1 + spec["drafts"] + spec["accepted_tokens"] + 1


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_with_usage_and_spec(client):
    resp = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=12,
                                     temperature=0, extra_body=FIXED)
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    choice = resp.choices[0]
    assert isinstance(choice.text, str) and choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 12 and resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 12
    check_spec(spec_of(resp), 12)


def test_chat_completion(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Say hi."}],
        max_tokens=10, temperature=0, extra_body=FIXED)
    assert resp.object == "chat.completion"
    msg = resp.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert resp.usage.completion_tokens == 10
    check_spec(spec_of(resp), 10)


def test_chat_max_completion_tokens(client):
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                          max_completion_tokens=5, extra_body=FIXED)
    assert resp.usage.completion_tokens == 5 and resp.choices[0].finish_reason == "length"


def test_streaming_completion_matches_non_streaming(client):
    kw = dict(model=MODEL, prompt="The quick brown fox", max_tokens=16, temperature=0,
              extra_body=FIXED)
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == full.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in text_chunks)
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 16
    check_spec(spec_of(last), 16)
    assert spec_of(text_chunks[-1]) == spec_of(last)  # the last choice chunk carries it too
    assert spec_of(last)["drafts"] == spec_of(full)["drafts"]  # greedy: same rounds


def test_streaming_chat_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=9,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=FIXED)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=9,
        temperature=0, extra_body=FIXED)
    assert content == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 9
    # no usage chunk unless asked for
    plain = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True,
        extra_body=FIXED))
    assert all(c.usage is None for c in plain) and plain[-1].choices


def test_chat_logprobs_and_top_logprobs(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8,
        temperature=0, logprobs=True, top_logprobs=3, extra_body=FIXED)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens == 8
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        tops = [t.logprob for t in item.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # greedy: the chosen token is the most likely one
        assert item.logprob == pytest.approx(tops[0], abs=1e-6)
        assert item.bytes == list(item.token.encode()) or "\ufffd" in item.token


def test_completion_logprobs(client):
    resp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6,
                                     temperature=0, logprobs=2, extra_body=FIXED)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_echo_scores_the_prompt_as_text_and_as_token_ids(client, live):
    text = "Speculative decoding drafts tokens and the target verifies them."
    ids = live.server.engine.tokenizer.encode(text)
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True,
                                        logprobs=1)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True,
                                       logprobs=1)
    for resp in (by_text, by_ids):
        lp = resp.choices[0].logprobs
        assert resp.usage.prompt_tokens == len(ids) and resp.usage.completion_tokens == 0
        assert len(lp.token_logprobs) == len(ids)
        assert lp.token_logprobs[0] is None  # the first token has no context to score it
        assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert by_text.choices[0].text == text
    assert by_text.choices[0].logprobs.token_logprobs == by_ids.choices[0].logprobs.token_logprobs


def test_echo_scoring_agrees_with_generation_logprobs(client, live):
    """Score prompt + generated continuation with echo: the continuation's prompt logprobs must
    equal the logprobs the server reported while generating it (same target, same context)."""
    tok = live.server.engine.tokenizer
    prompt_ids = tok.encode("In the beginning")
    gen = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=10,
                                    temperature=0, logprobs=0,
                                    extra_body={**FIXED, "return_tokens_as_token_ids": True})
    gen_ids = [int(t.split(":")[1]) for t in gen.choices[0].logprobs.tokens]
    assert len(gen_ids) == 10
    scored = client.completions.create(model=MODEL, prompt=prompt_ids + gen_ids, max_tokens=0,
                                       echo=True, logprobs=0)
    tail = scored.choices[0].logprobs.token_logprobs[len(prompt_ids):]
    for got, want in zip(tail, gen.choices[0].logprobs.token_logprobs):
        assert math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-3)


def test_speculative_false_in_extra_body_means_no_drafts(client):
    resp = client.completions.create(model=MODEL, prompt="abc", max_tokens=8, temperature=0,
                                     extra_body={**FIXED, "speculative": False})
    spec = spec_of(resp)
    assert spec["speculative"] is False
    assert spec["drafts"] == spec["draft_tokens"] == spec["accepted_tokens"] == 0
    assert spec["mean_accepted_length"] is None
    assert resp.usage.completion_tokens == 8


@pytest.mark.parametrize("prompt", ["def add(a, b):", "Hello, my name is", "1, 2, 3, 4,"])
def test_greedy_text_is_identical_with_and_without_speculation(client, prompt):
    kw = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    on = client.completions.create(**kw, extra_body={**FIXED, "speculative": True})
    off = client.completions.create(**kw, extra_body={**FIXED, "speculative": False})
    assert spec_of(on)["drafts"] > 0 and spec_of(off)["drafts"] == 0
    assert on.choices[0].text == off.choices[0].text


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model=MODEL, prompt="Random words:", max_tokens=12, temperature=0.9, top_p=0.95,
              seed=1234, extra_body={**FIXED, "top_k": 50})
    first = client.completions.create(**kw).choices[0].text
    assert client.completions.create(**kw).choices[0].text == first


def test_stop_string_ends_the_completion(client):
    kw = dict(model=MODEL, prompt="abc", max_tokens=12, temperature=0)
    base = client.completions.create(**kw, logprobs=0, extra_body=FIXED).choices[0]
    # a token whose text is in the output (special tokens such as <|im_end|> are not)
    usable = [t for t in base.logprobs.tokens[1:]
              if t and "\ufffd" not in t and t in base.text]
    assert usable, f"no token of {base.logprobs.tokens} can serve as a stop string"
    stop = usable[0]
    resp = client.completions.create(**kw, stop=[stop], extra_body=FIXED).choices[0]
    assert resp.finish_reason == "stop"
    assert resp.text == base.text[:base.text.find(stop)]


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-7])
def test_vanishing_temperature_is_greedy(client, temperature):
    """A temperature that underflows float32 must not turn the distribution into NaN."""
    kw = dict(model=MODEL, prompt="Hello", max_tokens=12, extra_body=FIXED)
    greedy = client.completions.create(**kw, temperature=0).choices[0].text
    assert client.completions.create(**kw, temperature=temperature).choices[0].text == greedy


def test_vllm_shaped_per_request_metrics_agree_with_spec_streamed_and_not(client):
    """``metrics.speculative_decoding`` (vLLM's per-request shape, what AIPerf reads) on the
    full response and, streamed, on the usage chunk only — as vLLM sends it — with the same
    figures as spectest's own ``spec`` object."""
    full = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=16,
                                     temperature=0, extra_body=FIXED)
    sd, spec = full.model_extra["metrics"]["speculative_decoding"], spec_of(full)
    assert sd["num_spec_steps"] == spec["drafts"] and sd["num_draft_tokens"] == \
        spec["draft_tokens"] and sd["num_accepted_draft_tokens"] == spec["accepted_tokens"]
    assert sum(sd["acceptance_histogram"]) == spec["drafts"]
    assert sd["mean_acceptance_length"] == pytest.approx(spec["mean_accepted_length"])
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=9,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=FIXED))
    carrying = [c for c in chunks if (c.model_extra or {}).get("metrics")]
    assert carrying == [chunks[-1]] and chunks[-1].usage is not None
    sd = chunks[-1].model_extra["metrics"]["speculative_decoding"]
    assert sd["num_accepted_draft_tokens"] == spec_of(chunks[-1])["accepted_tokens"]
