"""Checkpoint files → a ready :class:`~spectest.engine.model.Transformer` plus its tokenizer.

Owns: reading a Hugging Face checkpoint directory (``config.json``, ``model.safetensors`` or a
sharded ``model.safetensors.index.json``, ``tokenizer.json``, optional
``tokenizer_config.json`` / ``chat_template.jinja`` / ``generation_config.json``) into a config,
named tensors and a tokenizer. A path ending in ``.gguf`` is handed to
:mod:`spectest.engine.gguf_loader`. Both build the model with :mod:`spectest.engine.weights`
(tensors checked against the model's parameters by name and shape, cast to the requested dtype:
fp32 by default, whatever the storage dtype), which also holds :class:`CheckpointError` and
:class:`LoadedModel` (importable from here too).

Does not know: the forward pass, sampling or serving. Every problem with the files raises
:class:`CheckpointError`, whose message names the path and what is missing or wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from spectest.engine.model import SUPPORTED_ARCHITECTURES, ModelConfig
from spectest.engine.tokenizer import Tokenizer
from spectest.engine.weights import CheckpointError, LoadedModel, build_model, short_list

INDEX_FILE = "model.safetensors.index.json"
# spectest's own, optional: the token ids a draft's head drafts over (its most frequent answer
# tokens); the others get draft probability 0. Other loaders (transformers, llama.cpp) ignore it.
HEAD_TOKENS_FILE = "head_tokens.json"


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a HF checkpoint directory or a ``.gguf`` file (weights cast to ``dtype``)."""
    path = Path(path)
    if path.suffix == ".gguf":
        from spectest.engine import gguf_loader  # the gguf package: loaded on demand
        return gguf_loader.load_gguf(path, dtype)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory or .gguf file")
    if not path.is_dir():
        raise CheckpointError(f"{path}: expected a Hugging Face checkpoint directory or a "
                              f".gguf file")
    hf_config = _read_json(path / "config.json", required=True)
    cfg = config_from_hf(hf_config, path)
    tokenizer = load_hf_tokenizer(path, hf_config)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{path}: tokenizer.json has {tokenizer.vocab_size} tokens but "
                              f"config.json's vocab_size is {cfg.vocab_size}")
    model = build_model(cfg, _read_safetensors(path), dtype, path)
    head = _read_json(path / HEAD_TOKENS_FILE, required=False).get("token_ids")
    if head is not None and not (head and all(
            isinstance(i, int) and 0 <= i < cfg.vocab_size for i in head)):
        raise CheckpointError(f"{path / HEAD_TOKENS_FILE}: token_ids must be a non-empty list "
                              f"of ids below the vocabulary size {cfg.vocab_size}")
    return LoadedModel(model=model, tokenizer=tokenizer, name=path.name,
                       head_token_ids=tuple(head) if head is not None else None)


def peek_config(path: str | Path) -> ModelConfig:
    """A checkpoint's shape (HF ``config.json``, or GGUF metadata and tensor names), read
    without loading its weights: the trained context (``max_position_embeddings``,
    the default KV length per sequence, as vLLM defaults ``max_model_len`` to the model's) and
    the parameter count (``--quantize auto``)."""
    path = Path(path)
    if path.suffix == ".gguf":
        from spectest.engine import gguf_loader
        return gguf_loader.gguf_peek_config(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory or .gguf file")
    return config_from_hf(_read_json(path / "config.json", required=True), path)


def config_from_hf(hf_config: dict, path: Path) -> ModelConfig:
    archs = hf_config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(f"{path / 'config.json'}: unsupported architecture {arch!r} "
                              f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    if hf_config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path / 'config.json'}: unsupported hidden_act "
                              f"{hf_config['hidden_act']!r} (supported: silu)")
    try:
        return ModelConfig.from_hf(hf_config)
    except KeyError as exc:
        raise CheckpointError(f"{path / 'config.json'}: missing key {exc.args[0]!r}") from None


def load_hf_tokenizer(path: Path, hf_config: dict | None = None) -> Tokenizer:
    """``tokenizer.json`` plus the special-token facts from the optional config files."""
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise CheckpointError(f"{path}: missing tokenizer.json (a fast tokenizer file, as "
                              f"written by tokenizers / transformers' save_pretrained)")
    try:
        backend = tokenizers.Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # the Rust side raises a bare Exception on bad JSON
        raise CheckpointError(f"{tok_file}: cannot be read by tokenizers: {exc}") from None
    tok_config = _read_json(path / "tokenizer_config.json", required=False)
    gen_config = _read_json(path / "generation_config.json", required=False)
    hf_config = hf_config or {}

    bos_text = _token_text(tok_config.get("bos_token"))
    eos_text = _token_text(tok_config.get("eos_token"))
    eos_ids: list[int] = []
    for source in (gen_config.get("eos_token_id"), hf_config.get("eos_token_id"),
                   backend.token_to_id(eos_text) if eos_text else None):
        for token_id in source if isinstance(source, list) else [source]:
            if token_id is not None and token_id not in eos_ids:
                eos_ids.append(int(token_id))
    bos_id = gen_config.get("bos_token_id", hf_config.get("bos_token_id"))
    if bos_id is None and bos_text:
        bos_id = backend.token_to_id(bos_text)

    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    jinja_file = path / "chat_template.jinja"
    if not template and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    return Tokenizer(backend=backend, eos_token_ids=tuple(eos_ids), bos_token_id=bos_id,
                     chat_template=template or None, name=path.name,
                     bos_token=bos_text, eos_token=eos_text)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    single, index = path / "model.safetensors", path / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index, required=True).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no 'weight_map' object")
        shards = sorted(set(weight_map.values()))
        absent = [s for s in shards if not (path / s).is_file()]
        if absent:
            raise CheckpointError(f"{index}: missing shard files: {short_list(absent)}")
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(_load_safetensors_file(path / shard))
        not_found = sorted(set(weight_map) - set(tensors))
        if not_found:
            raise CheckpointError(f"{index}: tensors listed in the index but absent from "
                                  f"their shards: {short_list(not_found)}")
        return tensors
    if single.is_file():
        return _load_safetensors_file(single)
    others = sorted(p.name for p in path.glob("*.bin")) + sorted(
        p.name for p in path.glob("*.safetensors"))
    hint = f" (found {', '.join(others)}; convert to model.safetensors)" if others else ""
    raise CheckpointError(f"{path}: missing model.safetensors or {INDEX_FILE}{hint}")


def _load_safetensors_file(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{file}: corrupt or truncated safetensors file ({exc})") from None


def _read_json(file: Path, required: bool) -> dict:
    if not file.is_file():
        if required:
            raise CheckpointError(f"{file.parent}: missing {file.name}")
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return data


def _token_text(value) -> str | None:
    """tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
