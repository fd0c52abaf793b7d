"""Our Transformer, loaded by our loader, gives ``transformers``' logits (fp32, ≤ 1e-4).

Covers random small Llama (GQA, MHA, llama3 RoPE scaling + tied embeddings) and Qwen2 (q/k/v
biases, tied) checkpoints written by ``save_pretrained``, and the embedded demo checkpoints in
``spectest/models/{target,draft}`` once they exist. Each is checked for a full prefill, for
step-by-step decode through the KV cache, for verify-sized chunks, and for a batch whose cache
slots hold different lengths — as loaded (module by module), as the engine runs it
(``engine.inference``: fused projections, CPU GEMM kernels, plain-call layers) and through the
fixed-shape forwards a GPU captures (``engine.graphs``, replayed eagerly here).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from spectest.engine.graphs import CapturedForwards
from spectest.engine.inference import prepare_for_inference
from spectest.engine.loader import load_checkpoint
from spectest.engine.model import Transformer

from checkpoint_factory import CONFIGS, hf_logits

pytestmark = pytest.mark.usefixtures("single_thread")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
TEXT = ("The capital of France is Paris. Speculative decoding drafts tokens and the target "
        "verifies them. naïve café — 東京 😀")
MODELS_DIR = Path(__file__).resolve().parents[2] / "spectest" / "models"


def decode_through_cache(model: Transformer, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """Feed ``ids`` in pieces of the given sizes (the rest one by one) through a fresh cache;
    returns the logits [T, V] of every position."""
    cache = model.new_cache(1, len(ids) + 4)
    out, pos = [], 0
    with torch.no_grad():
        for size in chunks + [1] * len(ids):
            if pos >= len(ids):
                break
            out.append(model(torch.tensor([ids[pos:pos + size]]), cache)[0])
            pos += size
    assert int(cache.lengths[0]) == len(ids)
    return torch.cat(out)


def as_run(model: Transformer, kind: str) -> Transformer:
    """``modules``: as loaded; ``prepared``: as build_engine prepares it; ``static``: prepared,
    with every cached forward of up to 16 tokens going through a fixed-shape replay."""
    if kind != "modules":
        prepare_for_inference(model)
    if kind == "static":
        model.graphs = CapturedForwards(capture=False)
    return model


def assert_matches(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff <= TOL, f"max abs logit difference {diff:.3g} > {TOL}"


@pytest.mark.parametrize("kind", ["modules", "prepared", "static"])
@pytest.mark.parametrize("name", CONFIGS)
def test_prefill_and_decode_match_transformers(hf_checkpoints, name, kind):
    path, reference = hf_checkpoints[name]
    loaded = load_checkpoint(path)
    as_run(loaded.model, kind)
    ids = loaded.tokenizer.encode(TEXT)
    assert len(ids) >= 30
    expected = hf_logits(reference, ids)
    assert expected.std() > 0.5, "logits too flat for the comparison to mean anything"

    with torch.no_grad():
        assert_matches(loaded.model(torch.tensor([ids]))[0], expected)  # no cache
    assert_matches(decode_through_cache(loaded.model, ids, [len(ids)]), expected)  # prefill
    assert_matches(decode_through_cache(loaded.model, ids, [12]), expected)  # then 1 by 1
    assert_matches(decode_through_cache(loaded.model, ids, [7, 5, 1, 5, 3]), expected)  # verify


@pytest.mark.parametrize("kind", ["modules", "prepared", "static"])
@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-bias-tied"])
def test_batched_slots_with_different_lengths(hf_checkpoints, name, kind):
    path, reference = hf_checkpoints[name]
    model = as_run(load_checkpoint(path).model, kind)
    ids = load_checkpoint(path).tokenizer.encode(TEXT)
    rows = {0: ids[:24], 2: ids[5:16]}  # slot → sequence; slot 1 stays empty
    prompt_len = {0: 17, 2: 3}
    expected = {slot: hf_logits(reference, seq) for slot, seq in rows.items()}
    got = {slot: [] for slot in rows}
    cache = model.new_cache(3, 32)
    with torch.no_grad():
        for slot, seq in rows.items():  # prefill each slot alone
            logits = model(torch.tensor([seq[:prompt_len[slot]]]), cache, torch.tensor([slot]))
            got[slot].append(logits[0])
        slots = torch.tensor(list(rows))
        for chunk in (1, 1, 3, 2):  # both rows together, at different positions
            batch = []
            for slot, seq in rows.items():
                start = int(cache.lengths[slot])
                batch.append(seq[start:start + chunk])
            logits = model(torch.tensor(batch), cache, slots)
            for row, slot in enumerate(rows):
                got[slot].append(logits[row])
    if kind == "static":  # the decode chunks (and the 3-token prefill) replayed
        assert model.graphs.stats()["replayed"] >= 4
    assert int(cache.lengths[1]) == 0
    for slot, seq in rows.items():
        n = int(cache.lengths[slot])
        assert n == prompt_len[slot] + 7
        assert_matches(torch.cat(got[slot]), expected[slot][:n])


def test_comparison_catches_a_missing_rope_scaling(hf_checkpoints):
    """Negative control: the same weights without llama3 scaling are far outside TOL."""
    path, reference = hf_checkpoints["llama3-rope-tied"]
    loaded = load_checkpoint(path)
    wrong = Transformer(replace(loaded.model.config, rope_scaling=None)).eval()
    wrong.load_state_dict(loaded.model.state_dict())
    ids = loaded.tokenizer.encode(TEXT)
    with torch.no_grad():
        diff = (wrong(torch.tensor([ids]))[0] - hf_logits(reference, ids)).abs().max().item()
    assert diff > 100 * TOL


@pytest.mark.parametrize("which", ["target", "draft"])
def test_embedded_checkpoints_match_transformers(which):
    path = MODELS_DIR / which
    if not path.is_dir():
        pytest.skip(f"embedded checkpoint {path} not built yet")
    loaded = load_checkpoint(path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    ids = loaded.tokenizer.encode(TEXT)[:48]
    expected = hf_logits(reference, ids)
    assert_matches(decode_through_cache(loaded.model, ids, [len(ids)]), expected)
    assert_matches(decode_through_cache(loaded.model, ids, [10, 4]), expected)
