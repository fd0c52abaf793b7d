"""One decoder-only transformer of the Llama family (Llama, Qwen2, SmolLM, Mistral-without-SWA).

Owns: the config (read from a Hugging Face ``config.json`` dict), the forward pass (RMSNorm,
RoPE with the checkpoint's theta and scaling, SwiGLU MLP, grouped-query attention, optional
tied embeddings and qkv biases) over a :class:`~spectest.engine.kv_cache.KVCache`.

Does not know: files, tokenizers, sampling, speculation. A forward writes K/V for the new
tokens at each row's current length and advances that length; callers that speculate rewind
rows afterwards (``cache.lengths[slot] = n``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from spectest.engine.kv_cache import KVCache

CAUSAL = "causal"  # mask marker: plain causal attention from position 0
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: True for q/k/v (not o)
    model_type: str = "llama"

    @property
    def parameter_count(self) -> int:
        """Weights a model of this shape holds (norms included), from the shape alone."""
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        bias = (q + 2 * kv) if self.attention_bias else 0
        layer = h * (q + 2 * kv) + bias + q * h + 3 * h * self.intermediate_size + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embed + h

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        heads = cfg["num_attention_heads"]
        model_type = cfg.get("model_type", "llama")
        rope_scaling = cfg.get("rope_scaling") or (cfg.get("rope_parameters") or None)
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None and isinstance(rope_scaling, dict):
            rope_theta = rope_scaling.get("rope_theta")
        if isinstance(rope_scaling, dict) and rope_scaling.get("rope_type", "default") == "default":
            rope_scaling = None
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            model_type=model_type,
        )

    def to_hf(self, architecture: str = "LlamaForCausalLM") -> dict:
        out = {
            "architectures": [architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "mlp_bias": False,
        }
        return out


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2], with HF's "linear" and "llama3" scaling."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.rope_scaling
    if not scaling:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float()
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_ctx = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled).float()
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3)")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (cfg.num_attention_heads,
                                                  cfg.num_key_value_heads, cfg.head_dim)
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.qkv_proj = None  # q, k, v fused into one layer (engine.int8 sets it)

    def forward(self, x, cos, sin, layer_cache, mask):
        # x [B, T, D]; cos/sin [B, T, hd]; layer_cache: (write(k, v) -> (keys, values))
        B, T, _ = x.shape
        if self.qkv_proj is not None:
            kv_width = self.n_kv * self.head_dim
            q, k, v = self.qkv_proj(x).split(  # [B, T, (H + 2·H_kv)·hd] → three
                (self.n_heads * self.head_dim, kv_width, kv_width), dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.unflatten(-1, (self.n_heads, self.head_dim))  # [B, T, H, hd]
        k = k.unflatten(-1, (self.n_kv, self.head_dim))  # [B, T, H_kv, hd]
        v = v.unflatten(-1, (self.n_kv, self.head_dim))
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, T, 1, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys, values = layer_cache(k, v)  # [B, S, H_kv, hd] each
        q, keys, values = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        gqa = self.n_kv != self.n_heads
        # mask: CAUSAL (training, no cache), None (attend every cached key), bool [B,1,T,S],
        # or RowSpans (each query attends exactly its own keys, in its own call)
        if isinstance(mask, RowSpans):
            out = mask.attend(q, keys, values, gqa)
        else:
            causal = isinstance(mask, str)
            out = F.scaled_dot_product_attention(q, keys, values,
                                                 attn_mask=None if causal else mask,
                                                 is_causal=causal, enable_gqa=gqa)  # [B,H,T,hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


@dataclass(frozen=True)
class RowSpans:
    """Batch-invariant attention: every decode query in its own call over exactly its keys.

    A fused attention call sums over the batch's widest span with masked keys in it, and its
    BLAS calls block by the number of queries, so the same query gets last-bit-different
    results in a verify of K+1 tokens, in a one-token step, or beside longer rows (measured:
    batched matmuls are not row-invariant either — MKL picks kernels by row count). Int8 models
    (``engine.int8``) turn those last bits into whole quantization steps, which can flip a
    greedy choice; with this every decode query computes what a one-token step of its row
    computes, bit for bit (:func:`decode_queries`). A row that starts at position 0 (a prefill)
    attends in one causal call of its own — the same call whichever batch it is in, so the
    target's prompt KV is the same in every arm (a draft model prefills the whole prompt the
    same way).
    """
    counts: tuple[tuple[int, ...], ...]  # [B][T]: keys each query sees (its position + 1)

    def attend(self, q, keys, values, gqa: bool) -> torch.Tensor:
        # q [B, H, T, hd]; keys/values [B, H_kv, S, hd] → [B, H, T, hd]
        rows = []
        for b, counts in enumerate(self.counts):
            qb, kb, vb = q[b:b + 1], keys[b:b + 1], values[b:b + 1]
            if counts[0] == 1 and len(counts) > 1:  # prefill from position 0
                span = counts[-1]
                rows.append(F.scaled_dot_product_attention(
                    qb[:, :, :span], kb[:, :, :span], vb[:, :, :span], is_causal=True,
                    enable_gqa=gqa))
                continue
            rows.append(decode_queries(qb, kb, vb, counts))
        return rows[0] if len(rows) == 1 else torch.cat(rows)


def decode_queries(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   counts: tuple[int, ...]) -> torch.Tensor:
    """One row's decode queries, each over its own keys: q [1, H, T, hd]; keys/values
    [1, H_kv, S, hd]; ``counts`` [T]: keys query t sees → [1, H, T, hd].

    The G = H / H_kv query heads that share a kv head go in as that head's G query rows
    (query heads are grouped by kv head, as ``enable_gqa`` groups them), so the kernel reads
    each kv head once and never expands the keys (faster than ``enable_gqa`` per call), and a
    call's shape and strides depend on nothing but its count. The views are cut once for all T
    queries (one ``unbind``, a ``narrow`` per key span) rather than indexed per query, which
    lowers int8 SmolLM2's verify / step ratio (measured with
    ``benchmarks/models.py --pair smollm2 --threads 1``; figures in docs/results.md).
    """
    _, H, T, hd = q.shape
    n_kv = keys.shape[1]
    queries = q[0].transpose(0, 1).view(T, 1, n_kv, H // n_kv, hd).unbind(0)  # T × [1,H_kv,G,hd]
    outs = [F.scaled_dot_product_attention(query, keys.narrow(2, 0, n), values.narrow(2, 0, n))
            for query, n in zip(queries, counts)]  # T × [1, H_kv, G, hd]
    out = outs[0].unsqueeze(1) if T == 1 else torch.stack(outs, dim=1)  # [1, T, H_kv, G, hd]
    return out.view(1, T, H, hd).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj = None  # gate and up fused into one layer (engine.int8 sets it)

    def forward(self, x):
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [B, T, 2·I] → [B, T, I] × 2
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layer_cache, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer_cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Rotary:
    """RoPE tables for a module with ``inv_freq`` [head_dim/2] and ``config``: shared by the
    :class:`Transformer` and heads built from its layers (``engine.eagle``)."""

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, head_dim] for absolute ``positions`` [B, T], from cached tables."""
        need = int(positions.max()) + 1
        if need > self._rope_len:
            length = max(need, 2 * self._rope_len, self.config.max_position_embeddings)
            freqs = torch.arange(length, dtype=torch.float32)[:, None] * self.inv_freq  # [L, hd/2]
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos, self._sin, self._rope_len = emb.cos(), emb.sin(), length
        return self._cos[positions], self._sin[positions]

    def rotary(self, positions: torch.Tensor, tables: bool = True):
        """cos, sin [B, T, head_dim]: from the cached tables, or computed afresh (training:
        tensors made under inference mode cannot be saved for backward)."""
        if tables:
            return self._rope(positions)
        freqs = positions[..., None].float() * self.inv_freq  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class Transformer(Rotary, nn.Module):
    """Parameter names match HF's ``model.*`` / ``lm_head.*`` so checkpoints load as they are."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.quantization = "none"  # "int8" after engine.int8.quantize_int8
        self.row_exact = False  # attention through RowSpans (engine.int8 turns it on)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.register_buffer("head_ids", None, persistent=False)  # [N]: restrict_head
        self._rope_len = 0  # cos/sin tables cover positions [0, _rope_len)

    def new_cache(self, n_slots: int, max_len: int, dtype=torch.float32) -> KVCache:
        cfg = self.config
        return KVCache(cfg.num_hidden_layers, n_slots, max_len, cfg.num_key_value_heads,
                       cfg.head_dim, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None,
                slots: torch.Tensor | None = None, last_only: bool = False,
                hidden_only: bool = False, row_exact: bool | None = None,
                with_hidden: bool = False):
        """Logits for ``input_ids`` [B, T] appended after each row's cached prefix.

        ``slots`` [B] picks the cache rows (default 0..B-1). Without a cache the call is a
        plain causal forward from position 0 (training). Returns [B, T, V], or [B, 1, V]
        with ``last_only``; ``hidden_only``: the final-norm hidden states [B, T, D] instead
        (training that needs the LM head at a few positions only). ``row_exact``: attend
        through :class:`RowSpans` (default: the model's own ``row_exact``; False for batch
        decoding that does not need batch-invariant rows, e.g. making training data).
        ``with_hidden``: return ``(logits, hidden)`` with the final-norm hidden states of every
        position [B, T, D] (an EAGLE head drafts from them; ``last_only`` still cuts the
        logits).
        """
        B, T = input_ids.shape
        if cache is not None and slots is None:
            slots = torch.arange(B)
        positions, mask, layer_caches, start = attention_inputs(
            self, cache, slots, B, T, self.row_exact if row_exact is None else row_exact)
        cos, sin = self.rotary(positions, tables=not (self.training and cache is None))
        x = self.embed_tokens(input_ids)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # fp16/bf16 weights: keep q/k in dtype
        for layer, layer_cache in zip(self.layers, layer_caches):
            x = layer(x, cos, sin, layer_cache, mask)
        if cache is not None:
            cache.lengths[slots] = start + T
        if with_hidden:
            hidden = self.norm(x)  # [B, T, D]
            return self.lm_head(hidden[:, -1:] if last_only else hidden), hidden
        if last_only:
            x = x[:, -1:]
        x = self.norm(x)
        return x if hidden_only else self.lm_head(x)


def attention_inputs(model, cache: KVCache | None, slots, B: int, T: int,
                     row_exact: bool) -> tuple[torch.Tensor, object, list, torch.Tensor | None]:
    """Positions [B, T], the attention mask, each layer's cache writer and each row's start
    length [B] (None without a cache) for ``T`` new tokens of ``B`` rows of ``model``."""
    if cache is None:
        return torch.arange(T).expand(B, T), CAUSAL, [_no_cache] * len(model.layers), None
    if slots is None:
        slots = torch.arange(B)
    start = cache.lengths[slots]  # [B]
    positions = start[:, None] + torch.arange(T)  # [B, T]
    span = int(start.max()) + T
    if span > cache.max_len:
        raise ValueError(f"KV cache overflow: need {span} positions, have {cache.max_len}")
    if row_exact:
        mask = RowSpans(tuple(map(tuple, (positions + 1).tolist())))
    elif B == 1 and T == 1:
        mask = None  # one query, every cached key is in its past
    else:
        key_pos = torch.arange(span)
        mask = (key_pos[None, None, :] <= positions[:, :, None]).unsqueeze(1)  # [B,1,T,S]
    return positions, mask, cache.writers(slots, positions, span), start


def restrict_head(model: Transformer, token_ids: tuple[int, ...]) -> Transformer:
    """Keep only ``token_ids`` [N] rows of ``model``'s LM head (in place; returns the model):
    its logits then come back over those N tokens, in that order ([B, T, N]), and
    ``model.head_ids`` [N] maps a column to its token id. For a draft whose vocabulary-wide
    head is most of its cost; tokens outside get draft probability 0, which rejection
    sampling allows (a draft never proposes them). Call before ``engine.int8.quantize_int8``."""
    ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long)
    head = nn.Linear(model.config.hidden_size, len(ids), bias=False)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight[ids])
    model.lm_head = head.requires_grad_(False)
    model.head_ids = ids
    return model


def _no_cache(k, v):
    return k, v
