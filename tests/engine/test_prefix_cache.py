"""Prefix caching: a warm prompt decodes as a cold one, salts keep requests apart, the cache
stays within its capacity, and an EAGLE drafter gets the cached prefix's hidden states.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from spectest.engine.policies import FixedK
from spectest.engine.inference import prepare_for_inference
from spectest.engine.prefix_cache import BLOCK, CHUNK, PrefixCache
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

from pairs import load_embedded, make_engine, random_eagle, tiny_model, tiny_tokenizer

SHARED = ("Answer the question using the context.\n\nContext:\nThe tuple is an immutable "
          "sequence. Tuples are written with parentheses, and lists with square brackets. "
          "A set holds each element once. A dictionary maps keys to values; its keys must be "
          "hashable, and it keeps them in the order they were inserted. Strings are immutable "
          "sequences of Unicode code points, and bytes objects hold raw 8-bit values. A list "
          "can grow and shrink; slicing one makes a shallow copy.\n\n")  # two chunks and more
QUESTIONS = ["Question: How are tuples written?", "Question: What does a set hold?",
             "Question: Are lists mutable?"]


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(1)
    return load_embedded()


def _run(engine, tok, prompts, salt=None, speculative=True, max_tokens=32):
    out, stats = defaultdict(list), {}

    def take(o):
        out[o.request_id].extend(o.token_ids)
        if o.finished:
            stats[o.request_id] = o.stats
    for i, p in enumerate(prompts):  # one at a time: each sees what the one before cached
        engine.submit(GenerationRequest(f"r{i}", tuple(tok.encode(p)),
                                        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                        speculative=speculative, cache_salt=salt), take)
        engine.run_until_idle()
    return [out[f"r{i}"] for i in range(len(prompts))], [stats[f"r{i}"] for i in
                                                          range(len(prompts))]


def test_warm_prompts_decode_as_cold_ones(embedded):
    target, draft = embedded
    tok = target.tokenizer
    prompts = [SHARED + q for q in QUESTIONS]
    cold, cold_stats = _run(make_engine(target.model, tok, "draft-model", draft.model,
                                        FixedK(4)), tok, prompts)
    engine = make_engine(target.model, tok, "draft-model", draft.model, FixedK(4),
                         prefix_cache_tokens=4096)
    first, first_stats = _run(engine, tok, prompts)
    again, again_stats = _run(engine, tok, prompts)
    assert first == cold == again
    shared_chunks = len(tok.encode(SHARED)) // CHUNK
    assert shared_chunks >= 2
    assert first_stats[0].cached_tokens == 0 and all(s.cached_tokens == 0 for s in cold_stats)
    assert all(s.cached_tokens >= shared_chunks * CHUNK for s in first_stats[1:])
    # a hit ends on a chunk boundary: the forwards after it are the cold prompt's
    assert all(s.cached_tokens == (len(tok.encode(p)) - 1) // CHUNK * CHUNK
               for s, p in zip(again_stats, prompts))
    # another salt shares nothing
    _, salted = _run(engine, tok, prompts[:1], salt="another")
    assert salted[0].cached_tokens == 0


def test_the_cache_keeps_within_its_capacity_and_counts_lookups():
    cache = PrefixCache(capacity_tokens=4 * BLOCK, align=BLOCK)
    target = tiny_model(8, seed=0)
    kv = target.new_cache(2, 512)
    ids = tuple(range(1, 8)) * 20  # 140 tokens: 8 full blocks
    target(torch.tensor([ids]), kv, torch.tensor([0]))
    cache.store(None, ids, kv, 0)
    assert len(cache) == 4  # the least recently stored blocks went first
    assert cache.match(None, ids) == []  # its first blocks are gone: no chain starts
    assert cache.queries == len(ids) and cache.hits == 0
    short = ids[:3 * BLOCK + 1]
    small = PrefixCache(capacity_tokens=8 * BLOCK, align=BLOCK)
    small.store(None, short, kv, 0)
    found = small.match(None, short)
    assert len(found) == 3 and small.hits == 3 * BLOCK
    PrefixCache.restore(kv, 1, found, 3 * BLOCK)
    assert int(kv.lengths[1]) == 3 * BLOCK
    assert torch.equal(kv.k[:, 1, :3 * BLOCK], kv.k[:, 0, :3 * BLOCK])


def test_an_eagle_drafter_sees_the_cached_prefix_features():
    torch.set_num_threads(1)
    V = 64
    target, tok = tiny_model(V, seed=0, layers=2), tiny_tokenizer(V)
    prompt = " ".join(f"t{i % 50 + 1}" for i in range(70))
    outs = []
    for cache_tokens in (0, 1024):
        engine = make_engine(target, tok, random_eagle(target, seed=1), policy=FixedK(3),
                             prefix_cache_tokens=cache_tokens)
        got, stats = _run(engine, tok, [prompt, prompt], max_tokens=24)
        outs.append((got, [s.accepted_tokens for s in stats], [s.cached_tokens for s in stats]))
    (cold, cold_acc, _), (warm, warm_acc, cached) = outs
    assert cold == warm and cached == [0, 64]
    assert warm_acc == cold_acc  # the head drafted from the same features either way


def _logprobs(engine, tok, prompts, max_tokens=24):
    """Each prompt's (token, logprob, top-5) records, one request at a time."""
    got = defaultdict(list)
    for i, p in enumerate(prompts):
        engine.submit(GenerationRequest(f"r{i}", tuple(tok.encode(p)),
                                        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                        logprobs=5),
                      lambda o: got[o.request_id].extend(o.logprobs or ()))
        engine.run_until_idle()
    return [got[f"r{i}"] for i in range(len(prompts))]


def test_int8_warm_logprobs_equal_cold_ones_bit_for_bit():
    """Int8 weights turn last-bit differences into quantization steps, so a prefill that ran
    the warm remainder in other call shapes than the cold prompt flipped greedy choices
    (SmolLM2 answered a chat differently the second time it was asked). Every prefill runs
    in chunk-aligned forwards: warm logprobs equal cold ones exactly, for prompts ending
    anywhere in a chunk."""
    torch.set_num_threads(1)
    target, draft = load_embedded()  # fresh copies: quantized in place
    prepare_for_inference(target.model, int8=True)
    tok = target.tokenizer
    prompts = [SHARED + q + " " * extra for q in QUESTIONS for extra in (0, 7)]
    cold = _logprobs(make_engine(target.model, tok, "draft-model", draft.model, FixedK(4)),
                     tok, prompts)
    warm_engine = make_engine(target.model, tok, "draft-model", draft.model, FixedK(4),
                              prefix_cache_tokens=4096)
    warm = _logprobs(warm_engine, tok, prompts)
    assert warm_engine.prefix.hits >= len(prompts[1:]) * CHUNK
    assert warm == cold


def test_a_hit_ends_on_a_chunk_boundary():
    """Blocks past the last whole chunk stay uncomputed: the prefill after a hit then runs the
    forwards the cold prompt ran."""
    target = tiny_model(8, seed=0)
    kv = target.new_cache(2, 512)
    ids = tuple(range(1, 8)) * 20  # 140 tokens: 8 blocks, 2 chunks of 64
    target(torch.tensor([ids]), kv, torch.tensor([0]))
    cache = PrefixCache(capacity_tokens=1024)
    cache.store(None, ids, kv, 0)
    assert len(cache) == 8 and len(cache.match(None, ids)) == 2 * CHUNK // BLOCK
    assert cache.match(None, ids[:CHUNK]) == []  # its last token must stay uncomputed
    with pytest.raises(ValueError, match="multiple"):
        PrefixCache(1024, block=16, align=40)
