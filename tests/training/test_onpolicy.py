"""The draft's on-policy stage (``training.onpolicy``) on the quick recipe's pair: the target's
continuations of training-split prompts only, a loss that is zero where the draft is the target,
and a rewritten draft whose figures and card say what the stage did."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from spectest.engine.loader import load_checkpoint
from spectest.training import corpus
from spectest.training.onpolicy import ASSISTANT, OnPolicyConfig, corpus_prompts, rag_prompts
from spectest.training.train import TrainConfig, distill_loss, train_pair

pytestmark = pytest.mark.skipif(not corpus.DOC_ROOT.exists(),
                                reason="needs Debian's python3.11-doc (scripts/test.sh installs it)")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("pair")
    train_pair(out, TrainConfig.quick(0))
    return out


def test_prompts_come_from_the_training_split_only(pair):
    tok = load_checkpoint(pair / "target").tokenizer
    marker = "HELDOUTMARKER"
    docs = [corpus.Document(f"def f():\n    return '{marker}'\n" * 20, "code", "held.py", True),
            corpus.Document("def g(x):\n    return x + 1\n" * 20, "code", "a.py", False),
            corpus.Document("Some prose about the json module. " * 20, "prose", "b.rst", False),
            corpus.Document(corpus.chat([("user", "Explain json."), ("assistant", "It is.")])
                            * 1, "prose", "c.rst", False)]
    cfg = OnPolicyConfig(prompts=9, context=16)
    prompts = corpus_prompts(tok, docs, cfg, seed=0)
    assert len(prompts) == 9
    text = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert not any(marker in text(p) for p in prompts)
    assert text(prompts[2]).endswith(ASSISTANT)  # a chat turn, cut where the reply starts
    long_docs = [corpus.Document(docs[3].text + marker, "long", "x", True), docs[3]]
    assert [text(p) for p in rag_prompts(tok, long_docs, cfg)] == [
        docs[3].text[:docs[3].text.index(ASSISTANT) + len(ASSISTANT)]]


def test_the_loss_is_zero_where_the_draft_is_the_target(pair):
    target = load_checkpoint(pair / "target").model.float().eval()
    draft = load_checkpoint(pair / "draft").model.float().eval()
    inputs = torch.randint(0, 500, (2, 24))
    assert distill_loss(target, target, inputs, tail=8).item() == pytest.approx(0.0, abs=1e-3)
    assert distill_loss(draft, target, inputs, tail=8).item() > 0.05


def test_the_stage_rewrites_the_draft_and_says_what_it_did(pair, tmp_path):
    """Through the CLI, as the model card's rebuild command runs it."""
    before = load_checkpoint(pair / "draft").model.state_dict()
    proc = subprocess.run([sys.executable, "-m", "spectest", "train-demo-models", "--quick",
                           "--onpolicy-only", "--threads", "1", "--out", str(pair)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = load_checkpoint(pair / "draft").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    figures = json.loads((pair / "training_figures.json").read_text())
    o = figures["onpolicy"]
    assert o["short_rows"] == 12 and o["config"]["steps"] == 6
    assert set(o["before"]["greedy_agreement"]) == {"code", "prose"}
    assert figures["greedy_agreement"] != o["before"]["greedy_agreement"]
    card = (pair / "README.md").read_text()
    assert "on the target's own outputs" in card and "--onpolicy-only" in card
    assert load_checkpoint(pair / "target").tokenizer.encode("def f():")  # the pair still loads
