"""Retraining with the same seed reproduces the tokenizer exactly and the losses closely.

Runs the real recipe (`train_pair`) at its quick size on a slice of the real corpus, twice, and
compares: tokenizer.json byte for byte, figures within a small tolerance. A different seed must
change the losses (so the comparison can fail).
"""

from __future__ import annotations

import json

import pytest
import torch

from spectest.training import corpus
from spectest.training.train import TrainConfig, train_pair

pytestmark = pytest.mark.skipif(not corpus.DOC_ROOT.exists(),
                                reason="needs Debian's python3.11-doc (scripts/test.sh installs it)")


def _train(tmp_path, name, seed):
    torch.set_num_threads(1)
    out = tmp_path / name
    figures = train_pair(out, TrainConfig.quick(seed))
    return out, figures


def test_same_seed_same_tokenizer_and_losses(tmp_path):
    a, fa = _train(tmp_path, "a", 0)
    b, fb = _train(tmp_path, "b", 0)
    assert (a / "target" / "tokenizer.json").read_bytes() == \
        (b / "target" / "tokenizer.json").read_bytes()
    for key in ("target_heldout_loss", "draft_heldout_loss", "greedy_agreement"):
        for domain in ("code", "prose"):
            assert fa[key][domain] == pytest.approx(fb[key][domain], rel=1e-3, abs=1e-3), key
    assert fa["target_final_train_loss"] == pytest.approx(fb["target_final_train_loss"], rel=1e-3)
    card = (a / "README.md").read_text()
    assert "held-out loss" in card and "spectest train-demo-models" in card
    assert json.loads((a / "target" / "config.json").read_text())["architectures"] == \
        ["LlamaForCausalLM"]


def test_different_seed_changes_the_model(tmp_path):
    _, fa = _train(tmp_path, "a", 0)
    _, fc = _train(tmp_path, "c", 1)
    assert fa["target_final_train_loss"] != fc["target_final_train_loss"]
