"""A :class:`~spectest.engine.model.Transformer` → a GGUF file llama.cpp loads (``-m`` / ``-md``).

Owns: llama-architecture metadata from the model's config, the tokenizer metadata copied
verbatim from a reference GGUF (the target's: llama-server checks that a draft's vocabulary
matches its target's token for token), HF → GGUF tensor names, the row permutation llama.cpp's
converter applies to Q and K (the inverse of ``gguf_loader._unpermute_rows``), and Q8_0 blocks
for the 2-D weights (norms stay F32), with the ``gguf`` package's quantizer.

Does not know: training. Written to a temporary file and renamed into place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType
from gguf.quants import quantize

from spectest.engine.model import Transformer

_BLOCK = {"input_layernorm.weight": "attn_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight",
          "self_attn.o_proj.weight": "attn_output.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                   "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                   "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                   "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix",
                   "tokenizer.chat_template")


def permute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's ``permute``: per head, rows (2, d/2) become interleaved (d/2, 2)."""
    half = w.shape[0] // n_heads // 2
    return np.ascontiguousarray(
        w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def gguf_name(hf_name: str) -> str | None:
    if hf_name == "embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return None  # tied: llama.cpp uses token_embd when output.weight is absent
    _, index, rest = hf_name.split(".", 2)
    return f"blk.{index}.{_BLOCK[rest]}"


def write_gguf(path: Path, model: Transformer, tokenizer_from: Path, name: str = "") -> None:
    cfg = model.config
    tmp = path.with_name(path.name + ".tmp")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name(name or path.stem)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    reference = GGUFReader(tokenizer_from)
    for key in _TOKENIZER_KEYS:
        field = reference.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[-1] if len(field.types) > 1 else None
        writer.add_key_value(key, value, kind, sub_type=sub)
    for hf_name, tensor in model.state_dict().items():
        name_ = gguf_name(hf_name)
        if name_ is None:
            continue
        array = tensor.detach().float().numpy()
        if hf_name.endswith("q_proj.weight"):
            array = permute_rows(array, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            array = permute_rows(array, cfg.num_key_value_heads)
        if array.ndim == 2:
            writer.add_tensor(name_, quantize(array, GGMLQuantizationType.Q8_0),
                              raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name_, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
