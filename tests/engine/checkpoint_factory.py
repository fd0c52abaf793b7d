"""Tiny random HF checkpoints for the engine tests (helpers; fixtures live in conftest.py).

A checkpoint here is what ``transformers``' ``save_pretrained`` writes for a randomly
initialised small Llama or Qwen2, plus a byte-level BPE ``tokenizer.json`` trained with
``tokenizers`` on a few lines (so merges cross UTF-8 character boundaries) and a ChatML
``tokenizer_config.json``. ``transformers`` is a test-only dependency.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] "
          "+ '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b\n",
          "Speculative decoding drafts tokens and the target verifies them.",
          "naïve café — 東京 😀 Ünïcödé ½ ∑"]
TOKENIZER_VOCAB = 320

# Weights drawn with std 0.2 (not HF's 0.02) so attention is far from uniform and logits
# spread over several units: a wrong RoPE, mask or bias shows up far above 1e-4.
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
            bos_token_id=1, eos_token_id=2, vocab_size=TOKENIZER_VOCAB + 16)
CONFIGS = {
    "llama-gqa": ("llama", dict(rope_theta=10000.0, tie_word_embeddings=False)),
    "llama3-rope-tied": ("llama", dict(
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen2-bias-tied": ("qwen2", dict(rope_theta=1000000.0, tie_word_embeddings=True,
                                      rms_norm_eps=1e-6)),
    "llama-mha": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=False)),
}


def write_tokenizer(directory: Path, chat_template: str | None = CHATML) -> None:
    """tokenizer.json (byte-level BPE) and tokenizer_config.json into ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 10, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    if chat_template:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def save_random_hf(directory: Path, name: str, seed: int = 0, dtype=torch.float32,
                   **save_kwargs):
    """A random ``transformers`` model of config ``name`` (see CONFIGS) saved with its
    tokenizer into ``directory``; returns the model (fp32, eval)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    family, overrides = CONFIGS[name]
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[family]
    config = config_cls(**{**BASE, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    model.to(dtype).save_pretrained(directory, **save_kwargs)
    write_tokenizer(directory)
    if dtype == torch.float32:
        return model
    # Half-precision storage: transformers' own fp32 load of what was written is the reference.
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """``transformers``' logits [T, V] for one sequence, full causal forward."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()
