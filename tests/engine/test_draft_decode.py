"""The draft's one-token steps on folded weights compute what the model's own forward computes.

RowDecoder's arithmetic differs from the model's forward only in rounding: its logits and the
keys and values it writes match the forward's to float32 precision, on the embedded draft and
on a random model with grouped-query attention, several layers, an untied head and a restricted
head, for one row and for rows of different lengths in slots out of order; each slot's length
grows by one; a full cache refuses. It applies only where it may (prepared float32 CPU models),
and the drafter proposes the same greedy drafts with it, one row or several.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spectest import procs
from spectest.engine.draft_decode import row_decoder
from spectest.engine.drafters import DraftModelDrafter, DraftRow
from spectest.engine.inference import prepare_for_inference
from spectest.engine.model import ModelConfig, Transformer, restrict_head
from spectest.engine.sampling import SamplingParams
from tests.engine.pairs import load_embedded


def random_model(seed: int = 0, tied: bool = False) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=256, tie_word_embeddings=tied)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() >= 2 else p.uniform_(0.5, 1.5)
    return model.eval()


def models():
    _, draft = load_embedded()
    restricted = restrict_head(random_model(2), tuple(range(0, 97, 3)))
    return {"embedded draft": draft.model, "gqa, untied": random_model(1),
            "tied": random_model(3, tied=True), "restricted head": restricted}


@pytest.mark.parametrize("name", ["embedded draft", "gqa, untied", "tied", "restricted head"])
def test_row_step_matches_the_models_forward(name):
    model = prepare_for_inference(models()[name])
    decoder = row_decoder(model)
    assert decoder is not None
    V = model.config.vocab_size
    prompt = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(7))
    reference, fast = model.new_cache(2, 128), model.new_cache(2, 128)
    with torch.inference_mode():
        for cache in (reference, fast):
            model(prompt, cache, [1])
        for token in (5, 17, 3, 60 % V):
            ids = torch.tensor([[token]])
            want = model(ids, reference, [1])[0, -1]  # [N]
            got = decoder.step(ids, fast, 1)  # [1, N]
            assert got.shape == (1, want.shape[0])
            torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)
            assert fast.lengths[1] == reference.lengths[1]
        n = int(reference.lengths[1])
        # rounding carried through the layers: a few units in the 4th significant digit
        torch.testing.assert_close(fast.k[:, 1, :n], reference.k[:, 1, :n], rtol=1e-3,
                                   atol=1e-4)
        torch.testing.assert_close(fast.v[:, 1, :n], reference.v[:, 1, :n], rtol=1e-3,
                                   atol=1e-4)
    assert fast.lengths[0] == 0  # other slots untouched


def test_rows_of_different_lengths_match_their_own_forwards():
    model = prepare_for_inference(random_model(5))
    decoder = row_decoder(model)
    reference, fast = model.new_cache(4, 128), model.new_cache(4, 128)
    gen = torch.Generator().manual_seed(1)
    slots, lengths = [3, 0, 2], [9, 33, 20]
    with torch.inference_mode():
        for slot, n in zip(slots, lengths):
            prompt = torch.randint(0, 97, (1, n), generator=gen)
            for cache in (reference, fast):
                model(prompt, cache, [slot])
        for _ in range(3):
            tokens = torch.randint(0, 97, (3,), generator=gen)
            got = decoder.step(tokens, fast, np.array(slots))  # [3, V]
            for b, slot in enumerate(slots):
                want = model(tokens[b].view(1, 1), reference, [slot])[0, -1]
                torch.testing.assert_close(got[b], want, rtol=1e-4, atol=1e-4)
        assert fast.lengths.tolist() == reference.lengths.tolist() == [36, 0, 23, 12]
        for slot, n in zip(slots, (36, 23, 12)):
            torch.testing.assert_close(fast.k[:, slot, :n], reference.k[:, slot, :n],
                                       rtol=1e-3, atol=1e-4)


def test_a_full_cache_refuses():
    model = prepare_for_inference(random_model())
    cache = model.new_cache(1, 8)
    with torch.inference_mode():
        model(torch.zeros(1, 8, dtype=torch.long), cache, [0])
    with pytest.raises(ValueError, match="KV cache overflow"):
        row_decoder(model).step(torch.tensor([1]), cache, 0)


def test_only_prepared_float_cpu_models_get_one():
    assert row_decoder(random_model()) is None  # not prepared: no fused projections
    assert row_decoder(prepare_for_inference(random_model())) is not None
    assert row_decoder(prepare_for_inference(random_model(), int8=True)) is None
    exact = prepare_for_inference(random_model())
    exact.row_exact = True
    assert row_decoder(exact) is None


@pytest.mark.parametrize("n_rows", [1, 3])
def test_the_drafter_proposes_what_the_models_forward_proposes(n_rows):
    model = prepare_for_inference(random_model(4))
    fast = DraftModelDrafter(model, n_slots=4, max_len=128)
    plain = DraftModelDrafter(model, n_slots=4, max_len=128)
    plain.row = None
    assert fast.row is not None
    rng = np.random.default_rng(n_rows)
    seqs = {slot: rng.integers(0, 97, 20 + 7 * slot).tolist() for slot in range(n_rows)}
    for slot, tokens in seqs.items():
        for drafter in (fast, plain):
            drafter.admit(slot, tokens[:-1])
    for _ in range(6):
        rows = [DraftRow(slot, tokens, 4, SamplingParams(temperature=0.0))
                for slot, tokens in seqs.items()]
        got, want = fast.propose(rows), plain.propose(rows)
        assert got.tokens.tolist() == want.tokens.tolist()
        for i, slot in enumerate(seqs):
            accepted = int(rng.integers(0, 5))  # as if verification kept this many, + a bonus
            seqs[slot] = seqs[slot] + got.tokens[i, :accepted].tolist() + \
                [int(rng.integers(0, 97))]
            for drafter in (fast, plain):
                drafter.rewind(slot, len(seqs[slot]) - 1)


def test_the_benchmark_runs():
    """``benchmarks/draft_step.py`` (the figures in docs/results.md) runs, briefly."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "draft_step.py"),
                          "--batches", "1,3", "--repeats", "3"], capture_output=True,
                         text=True, timeout=300, env=procs.python_env(), check=False)
    assert out.returncode == 0, out.stderr
    assert "row decoder" in out.stdout and "same argmax: True" in out.stdout
