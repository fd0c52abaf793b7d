"""Prefix caching: a warm prompt decodes as a cold one, salts keep requests apart, the cache
stays within its capacity, and an EAGLE drafter gets the cached prefix's hidden states.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from spectest.engine.policies import FixedK
from spectest.engine.prefix_cache import BLOCK, PrefixCache
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

from pairs import load_embedded, make_engine, random_eagle, tiny_model, tiny_tokenizer

SHARED = ("Answer the question using the context.\n\nContext:\nThe tuple is an immutable "
          "sequence. Tuples are written with parentheses, and lists with square brackets. "
          "A set holds each element once.\n\n")
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
    shared_blocks = len(tok.encode(SHARED)) // BLOCK
    assert first_stats[0].cached_tokens == 0 and all(s.cached_tokens == 0 for s in cold_stats)
    assert all(s.cached_tokens >= shared_blocks * BLOCK for s in first_stats[1:])
    assert all(s.cached_tokens == (len(tok.encode(p)) - 1) // BLOCK * BLOCK
               for s, p in zip(again_stats, prompts))
    # another salt shares nothing
    _, salted = _run(engine, tok, prompts[:1], salt="another")
    assert salted[0].cached_tokens == 0


def test_the_cache_keeps_within_its_capacity_and_counts_lookups():
    cache = PrefixCache(capacity_tokens=4 * BLOCK)
    target = tiny_model(8, seed=0)
    kv = target.new_cache(2, 512)
    ids = tuple(range(1, 8)) * 20  # 140 tokens: 8 full blocks
    target(torch.tensor([ids]), kv, torch.tensor([0]))
    cache.store(None, ids, kv, 0)
    assert len(cache) == 4  # the least recently stored blocks went first
    assert cache.match(None, ids) == []  # its first blocks are gone: no chain starts
    assert cache.queries == len(ids) and cache.hits == 0
    short = ids[:3 * BLOCK + 1]
    small = PrefixCache(capacity_tokens=8 * BLOCK)
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
