"""The conditional faults: each breaks speculation only under its condition (``engine.faults``).

They are the positive controls of the audit's conditions, so each must be silent where its
condition does not hold — else an audit without that condition would catch it and prove
nothing — and wrong where it does. Greedy output is compared with target-only output (which
the faults never touch) on the embedded pair.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from spectest.engine.faults import CONDITIONAL, FAULTS
from spectest.engine.policies import FixedK
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

from pairs import load_embedded, make_engine

SHORT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(1)
    return load_embedded()


def _greedy(engine, tok, prompt, speculative=True, max_tokens=64, **params):
    out, stats = [], []
    engine.submit(GenerationRequest(f"r{engine.rounds}-{speculative}", tuple(tok.encode(prompt)),
                                    SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                   **params), speculative=speculative),
                  lambda o: (out.extend(o.token_ids), o.finished and stats.append(o.stats)))
    engine.run_until_idle()
    return out, stats[0]


def _engine(embedded, fault, **kw):
    target, draft = embedded
    return make_engine(target.model, target.tokenizer, "draft-model", draft.model, FixedK(4),
                       faults={fault}, max_model_len=1024, **kw)


def test_every_conditional_fault_is_described():
    assert set(CONDITIONAL) <= set(FAULTS)


def test_rewind_past_256_breaks_long_sequences_only(embedded):
    engine = _engine(embedded, "rewind-past-256")
    tok = embedded[0].tokenizer
    assert _greedy(engine, tok, SHORT)[0] == _greedy(engine, tok, SHORT, False)[0]
    long = open(__file__).read()[:1200]  # about 350 tokens
    assert len(tok.encode(long)) > 256
    assert _greedy(engine, tok, long)[0] != _greedy(engine, tok, long, False)[0]


def test_prefix_hit_breaks_warm_speculative_requests_only(embedded):
    engine = _engine(embedded, "prefix-hit-stale-kv", prefix_cache_tokens=4096)
    tok = embedded[0].tokenizer
    prompt = open(__file__).read()[:500]  # over one 64-token chunk: a hit restores one
    assert len(tok.encode(prompt)) > 64
    cold, stats = _greedy(engine, tok, prompt)
    assert stats.cached_tokens == 0
    assert cold == _greedy(engine, tok, prompt, False)[0]  # plain requests hit, and are right
    warm, stats = _greedy(engine, tok, prompt)
    assert stats.cached_tokens > 0 and warm != cold


def test_draft_only_penalties_break_penalized_requests_only(embedded):
    engine = _engine(embedded, "draft-only-penalties")
    tok = embedded[0].tokenizer
    assert _greedy(engine, tok, SHORT)[0] == _greedy(engine, tok, SHORT, False)[0]
    assert _greedy(engine, tok, SHORT, presence_penalty=1.0)[0] != \
        _greedy(engine, tok, SHORT, False, presence_penalty=1.0)[0]


def test_decay_starts_after_its_requests_and_lowers_acceptance(embedded):
    engine = _engine(embedded, "decay-after-requests", fault_after=4)
    tok = embedded[0].tokenizer
    right = _greedy(engine, tok, SHORT, False)[0]
    early = [_greedy(engine, tok, SHORT) for _ in range(3)]  # requests 2-4
    assert all(out == right for out, _ in early)
    late = [_greedy(engine, tok, SHORT) for _ in range(6)]  # 5-10: wrong, more and more often
    assert sum(out != right for out, _ in late) >= 4
    rate = [s.accepted_tokens / s.draft_tokens for _, s in early + late]
    assert sum(rate[-3:]) < sum(rate[:3])


def test_mixed_batches_break_sampled_rows_only_beside_greedy_ones(embedded):
    target, draft = embedded
    tok = target.tokenizer
    ids = tuple(tok.encode(SHORT))

    def sampled(fault, with_greedy):
        engine = make_engine(target.model, tok, "draft-model", draft.model, FixedK(4),
                             faults={fault} if fault else ())
        out = defaultdict(list)
        for i in range(4):
            engine.submit(GenerationRequest(f"s{i}", ids, SamplingParams(
                max_tokens=40, temperature=1.0, seed=i, ignore_eos=True)),
                lambda o: out[o.request_id].extend(o.token_ids))
        if with_greedy:
            engine.submit(GenerationRequest("g", ids, SamplingParams(max_tokens=60,
                                                                     ignore_eos=True)),
                          lambda o: out[o.request_id].extend(o.token_ids))
        engine.run_until_idle()
        return [out[f"s{i}"] for i in range(4)]

    assert sampled("mixed-batch-greedy", False) == sampled(None, False)
    assert sampled("mixed-batch-greedy", True) != sampled(None, True)
