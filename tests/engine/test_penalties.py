"""Logit bias, presence / frequency / repetition penalties and min-p: vLLM's semantics, and
speculation that stays exact with them.

The pure functions are checked against a plain per-token loop written from vLLM's sampler
(bias, then repetition on prompt + output tokens, then frequency and presence on output
tokens). Through the whole engine: greedy speculative output equals target-only output with
each adjustment, and sampled speculative output follows the target's adjusted distribution
(the pooled G-test of ``test_engine_sampling`` at alpha = 1e-3, tiny random pair); the fault
that verifies without the penalties fails both.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch

from spectest.engine.penalties import Penalties, apply_penalties, position_counts
from spectest.engine.policies import FixedK
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams, probs_from_logits

from pairs import pooled_pvalue, load_embedded, make_engine, tiny_model, tiny_tokenizer

V, ALPHA = 8, 1e-3
PROMPT = (1, 2, 3)
ADJUSTED = dict(temperature=0.8, min_p=0.05, presence_penalty=0.6, frequency_penalty=0.3,
                repetition_penalty=1.5, logit_bias=((4, 1.2), (0, -2.0)))


def _reference(logits: list[float], params: SamplingParams, prompt, output) -> list[float]:
    """vLLM's order, one token at a time."""
    out = list(logits)
    for token, bias in params.logit_bias:
        out[token] += bias
    seen = set(prompt) | set(output)
    counts = Counter(output)
    for t in range(len(out)):
        if t in seen:
            out[t] = out[t] / params.repetition_penalty if out[t] > 0 else \
                out[t] * params.repetition_penalty
        out[t] -= params.frequency_penalty * counts[t]
        out[t] -= params.presence_penalty * (counts[t] > 0)
    return out


def test_apply_penalties_matches_a_per_token_reference():
    torch.manual_seed(0)
    params = [SamplingParams(**{k: v for k, v in ADJUSTED.items() if k != "temperature"}),
              SamplingParams(),  # a row without adjustments is left exactly as it was
              SamplingParams(repetition_penalty=0.7, logit_bias=((7, 3.0),))]
    tokens = [[1, 2, 3, 4, 4, 5], [0, 1, 2], [6, 6, 2, 1]]
    prompt_lens = [3, 2, 2]
    pen = Penalties.of(params, tokens, prompt_lens, V)
    drafts = torch.tensor([[5, 4], [1, 1], [7, 0]])
    logits = torch.randn(3, 3, V) * 2  # [B, K+1, V]
    got = apply_penalties(logits, pen, position_counts(pen.output_counts, drafts))
    for b in range(3):
        for j in range(3):
            output = tokens[b][prompt_lens[b]:] + drafts[b, :j].tolist()
            want = _reference(logits[b, j].tolist(), params[b], tokens[b][:prompt_lens[b]],
                              output)
            assert torch.allclose(got[b, j], torch.tensor(want), atol=1e-5), (b, j)
    assert torch.equal(got[1], logits[1])
    # a head cut to some tokens gets the same adjustments on its columns
    columns = torch.tensor([0, 4, 5, 7])
    cut = apply_penalties(logits[..., columns], pen,
                          position_counts(pen.output_counts, drafts), columns)
    assert torch.allclose(cut, got[..., columns])


def test_min_p_drops_tokens_below_its_share_of_the_top():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    probs = probs_from_logits(logits, torch.tensor([1.0]), torch.tensor([0]),
                              torch.tensor([1.0]), torch.tensor([0.2]))[0, 0]
    assert probs[3] == 0 and probs[2] > 0  # 0.05 < 0.2 × 0.5 <= 0.15
    assert torch.allclose(probs[:3], torch.tensor([0.5, 0.3, 0.15]) / 0.95)
    assert not Penalties.of([SamplingParams(min_p=0.3)], [[1]], [1], V)  # no logit change


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(1)
    return load_embedded()


@pytest.mark.parametrize("adjust", [dict(presence_penalty=1.0), dict(frequency_penalty=0.7),
                                    dict(repetition_penalty=1.3),
                                    dict(logit_bias=((10, 4.0), (11, -100.0)))],
                         ids=["presence", "frequency", "repetition", "logit_bias"])
def test_greedy_speculation_with_adjustments_equals_target_only(embedded, adjust):
    target, draft = embedded
    tok = target.tokenizer
    prompts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
               "The :mod:`json` module can be used to", "import os\nimport sys\n\n"]
    outs = {}
    for drafter in ("draft-model", "none"):
        engine = make_engine(target.model, tok, drafter, draft.model, FixedK(4))
        got = defaultdict(list)
        for i, p in enumerate(prompts):
            req = GenerationRequest(f"r{i}", tuple(tok.encode(p)),
                                    SamplingParams(max_tokens=48, ignore_eos=True, **adjust))
            engine.submit(req, lambda o: got[o.request_id].extend(o.token_ids))
        engine.run_until_idle()
        outs[drafter] = [got[f"r{i}"] for i in range(len(prompts))]
    assert outs["draft-model"] == outs["none"]
    plain = make_engine(target.model, tok, "none")
    got = defaultdict(list)
    plain.submit(GenerationRequest("x", tuple(tok.encode(prompts[0])),
                                   SamplingParams(max_tokens=48, ignore_eos=True)),
                 lambda o: got["x"].extend(o.token_ids))
    plain.run_until_idle()
    assert got["x"] != outs["none"][0], "the adjustment changed nothing: the test is void"


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return tiny_model(V, seed=0, scale=0.6), tiny_model(V, seed=1, scale=0.6), tiny_tokenizer(V)


def _sample(models, faults=frozenset(), n=2500):
    target, draft, tok = models
    engine = make_engine(target, tok, "draft-model", draft, FixedK(2), max_num_seqs=32,
                         faults=faults)
    outs = defaultdict(list)
    for i in range(n):
        req = GenerationRequest(f"r{i}", PROMPT, SamplingParams(
            max_tokens=3, seed=i, ignore_eos=True, **ADJUSTED))
        engine.submit(req, lambda o: outs[o.request_id].extend(o.token_ids))
    engine.run_until_idle()
    return [outs[f"r{i}"] for i in range(n)]


@torch.no_grad()
def _target_dist(target, prefix) -> torch.Tensor:
    params = SamplingParams(**ADJUSTED)
    raw = target(torch.tensor([list(PROMPT) + list(prefix)]))[0, -1].tolist()
    logits = torch.tensor([[_reference(raw, params, PROMPT, list(prefix))]])
    return probs_from_logits(logits, torch.tensor([params.temperature]), torch.tensor([0]),
                             torch.tensor([1.0]), torch.tensor([params.min_p]))[0, 0].double()


def _pooled_pvalue(target, sequences, position) -> float:
    return pooled_pvalue(lambda prefix: _target_dist(target, prefix), sequences, position, V)


def test_sampled_speculation_follows_the_adjusted_target(tiny):
    sequences = _sample(tiny)
    assert _pooled_pvalue(tiny[0], sequences, 1) > ALPHA
    assert _pooled_pvalue(tiny[0], sequences, 2) > ALPHA


def test_verifying_without_the_penalties_is_caught(tiny):
    sequences = _sample(tiny, frozenset({"draft-only-penalties"}))
    p = min(_pooled_pvalue(tiny[0], sequences, 1), _pooled_pvalue(tiny[0], sequences, 2))
    assert p < ALPHA, f"draft-only-penalties not detected (p = {p:.3g})"
