"""The HF-directory loader: storage dtypes, shards, tied weights, and one clear error per fault.

Every broken checkpoint is a copy of a good one (``save_pretrained`` output) with one thing
removed or damaged; the error must be a :class:`CheckpointError` (a ValueError) whose message
names the path and the fault.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from spectest.engine.loader import CheckpointError, load_checkpoint

from checkpoint_factory import hf_logits, save_random_hf, write_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")
pytest.importorskip("transformers")

TEXT = "The capital of France is Paris. naïve café — 東京 😀"


@pytest.fixture
def good(hf_checkpoints, tmp_path) -> Path:
    """A private copy of the random Llama checkpoint, free to break."""
    target = tmp_path / "ckpt"
    shutil.copytree(hf_checkpoints["llama-gqa"][0], target)
    return target


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def error_of(path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert isinstance(info.value, ValueError)
    return str(info.value)


@pytest.mark.parametrize("storage", [torch.float16, torch.bfloat16])
def test_half_precision_storage_loads_as_fp32(tmp_path, storage):
    reference = save_random_hf(tmp_path / "half", "llama-gqa", dtype=storage)
    stored = load_file(tmp_path / "half" / "model.safetensors")
    assert {t.dtype for t in stored.values()} == {storage}
    loaded = load_checkpoint(tmp_path / "half")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    ids = loaded.tokenizer.encode(TEXT)
    with torch.no_grad():
        got = loaded.model(torch.tensor([ids]))[0]
    diff = (got - hf_logits(reference, ids)).abs().max().item()
    assert diff <= 1e-4, diff


def test_requested_dtype_applies_to_weights(good):
    loaded = load_checkpoint(good, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.model.inv_freq.dtype == torch.float32  # RoPE frequencies keep full precision
    full = load_checkpoint(good).model
    ids = torch.tensor([loaded.tokenizer.encode(TEXT)])
    with torch.no_grad():
        half = loaded.model(ids, loaded.model.new_cache(1, 64, dtype=torch.bfloat16))[0]
        ref = full(ids)[0]
    assert half.dtype == torch.bfloat16
    assert (half.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()


def test_sharded_checkpoint_equals_single_file(tmp_path):
    reference = save_random_hf(tmp_path / "sharded", "qwen2-bias-tied", max_shard_size="40KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    assert not (tmp_path / "sharded" / "model.safetensors").exists()
    reference.save_pretrained(tmp_path / "single")
    write_tokenizer(tmp_path / "single")
    sharded = load_checkpoint(tmp_path / "sharded")
    single = load_checkpoint(tmp_path / "single")
    for (name, a), (_, b) in zip(sharded.model.state_dict().items(),
                                 single.model.state_dict().items()):
        assert torch.equal(a, b), name
    ids = sharded.tokenizer.encode(TEXT)
    with torch.no_grad():
        got = sharded.model(torch.tensor([ids]))[0]
    assert (got - hf_logits(reference, ids)).abs().max().item() <= 1e-4


def test_tied_embeddings_share_one_tensor(hf_checkpoints):
    tied = load_checkpoint(hf_checkpoints["qwen2-bias-tied"][0]).model
    untied = load_checkpoint(hf_checkpoints["llama-gqa"][0]).model
    assert tied.lm_head.weight is tied.embed_tokens.weight
    assert not torch.equal(untied.lm_head.weight, untied.embed_tokens.weight)
    assert not any(p.requires_grad for p in tied.parameters()) and not tied.training


def test_name_is_the_directory(good):
    assert load_checkpoint(good).name == "ckpt"


def test_missing_config(good):
    (good / "config.json").unlink()
    assert error_of(good) == f"{good}: missing config.json"


def test_missing_tokenizer(good):
    (good / "tokenizer.json").unlink()
    message = error_of(good)
    assert str(good) in message and "missing tokenizer.json" in message


def test_unknown_architecture(good):
    edit_json(good / "config.json", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    message = error_of(good)
    assert "unsupported architecture 'GPT2LMHeadModel'" in message
    assert "supported: LlamaForCausalLM, Qwen2ForCausalLM" in message


def test_config_without_a_required_key(good):
    data = json.loads((good / "config.json").read_text())
    del data["hidden_size"]
    (good / "config.json").write_text(json.dumps(data))
    assert "missing key 'hidden_size'" in error_of(good)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_safetensors(good, damage):
    weights = good / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00" * 64)
    message = error_of(good)
    assert f"{weights}: corrupt or truncated safetensors file" in message


def test_no_weights_file_names_what_is_there(good):
    (good / "model.safetensors").rename(good / "pytorch_model.bin")
    message = error_of(good)
    assert "missing model.safetensors or model.safetensors.index.json" in message
    assert "found pytorch_model.bin" in message


def test_missing_and_misshapen_tensors_are_listed(good):
    tensors = load_file(good / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.norm.weight"] = torch.ones(65)
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    save_file(tensors, good / "model.safetensors")
    message = error_of(good)
    assert "missing tensors: layers.1.mlp.up_proj.weight" in message
    assert "unexpected tensors: layers.0.self_attn.o_proj.bias" in message
    assert "shape mismatch: norm.weight (65,) (expected (64,))" in message


def test_config_disagreeing_with_weights(good):
    edit_json(good / "config.json", intermediate_size=96)
    message = error_of(good)
    assert "shape mismatch: layers.0.mlp.down_proj.weight (64, 128) (expected (64, 96))" \
        in message


def test_tokenizer_larger_than_the_embedding(good):
    edit_json(good / "config.json", vocab_size=300)
    assert "tokenizer.json has 320 tokens but config.json's vocab_size is 300" \
        in error_of(good)


def test_missing_shard(tmp_path):
    save_random_hf(tmp_path / "s", "llama-gqa", max_shard_size="40KB")
    index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (tmp_path / "s" / shard).unlink()
    assert f"missing shard files: {shard}" in error_of(tmp_path / "s")


def test_unreadable_tokenizer_json(good):
    (good / "tokenizer.json").write_text("{not json")
    assert f"{good / 'tokenizer.json'}: cannot be read by tokenizers" in error_of(good)


def test_paths_that_are_not_checkpoints(tmp_path):
    assert "no such checkpoint directory" in error_of(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    assert "expected a Hugging Face checkpoint directory" in error_of(tmp_path / "file.txt")
    assert "no such GGUF file" in error_of(tmp_path / "missing.gguf")


def test_head_tokens_file_cuts_a_drafts_head(good):
    """``head_tokens.json`` (spectest's own): the draft's head keeps those rows, its logits
    equal the full head's at those columns, and a bad file is one clear error."""
    from spectest.engine.api import prepare_draft
    full = load_checkpoint(good)
    assert full.head_token_ids is None
    (good / "head_tokens.json").write_text(json.dumps({"token_ids": [5, 1, 7, 3]}))
    loaded = load_checkpoint(good)
    assert loaded.head_token_ids == (5, 1, 7, 3)
    cut = prepare_draft(loaded, int8=False).model
    assert cut.head_ids.tolist() == [1, 3, 5, 7]
    ids = torch.tensor([[2, 4, 6, 8]])
    with torch.no_grad():
        assert torch.allclose(cut(ids), full.model(ids)[..., [1, 3, 5, 7]], atol=1e-5)
    for bad in ({"token_ids": []}, {"token_ids": [1, 10 ** 9]}, {"token_ids": ["a"]}):
        (good / "head_tokens.json").write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match="head_tokens.json"):
            load_checkpoint(good)
