"""One decoder-only transformer of the Llama family (Llama, Qwen2, SmolLM, Mistral-without-SWA).

Owns: the config (read from a Hugging Face ``config.json`` dict), the forward pass (RMSNorm,
RoPE with the checkpoint's theta and scaling, SwiGLU MLP, grouped-query attention, optional
tied embeddings and qkv biases) over a :class:`~spectest.engine.kv_cache.KVCache`, and
:func:`fuse_projections` (q/k/v and gate/up as one GEMM each, for inference). What a forward
attends to (positions, masks, cache writes) is ``engine.attention``'s; a forward on a GPU may
replay a captured graph (``engine.graphs``).

Does not know: files, tokenizers, sampling, speculation. A forward writes K/V for the new
tokens at each row's current length and advances that length; callers that speculate rewind
rows afterwards (``cache.lengths[slot] = n``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from spectest.engine.attention import (CAUSAL, GroupedMask, RowSpans, StepInputs,
                                      attention_inputs, group_mask, host_slots)
from spectest.engine.kv_cache import KVCache

__all__ = ["CAUSAL", "ModelConfig", "RowSpans", "Transformer", "restrict_head"]
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


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [B, T, n, hd] rotated by ``rope`` = (cos, sin_rot) [B, T, 1, hd], where sin_rot is
    sin with its first half negated: ``x·cos + swap_halves(x)·sin_rot`` is HF's
    ``x·cos + rotate_half(x)·sin`` bit for bit (a negation is exact), in four operations."""
    cos, sin_rot = rope
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin_rot


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
        self.qkv_proj = None  # q, k, v fused into one layer (fuse_projections, engine.int8)

    def forward(self, x, rope, layer_cache, mask):
        # x [B, T, D]; rope: (cos, sin_rot) [B, T, 1, hd]; layer_cache: write(k, v) ->
        # (keys, values)
        B, T, _ = x.shape
        H, H_kv, hd = self.n_heads, self.n_kv, self.head_dim
        if self.qkv_proj is not None:
            return self.o_proj(attend_fused(self.qkv_proj(x), H, H_kv, hd, rope, layer_cache,
                                            mask))
        q = apply_rope(self.q_proj(x).view(B, T, H, hd), rope)  # [B, T, H, hd]
        k = apply_rope(self.k_proj(x).view(B, T, H_kv, hd), rope)  # [B, T, H_kv, hd]
        v = self.v_proj(x).view(B, T, H_kv, hd)
        return self.o_proj(attend(q, k, v, layer_cache, mask))


def attend_fused(qkv: torch.Tensor, H: int, H_kv: int, hd: int, rope, layer_cache,
                 mask) -> torch.Tensor:
    """Attention from one fused projection qkv [B, T, (H + 2·H_kv)·hd]: q and k rotated in
    one pass → [B, T, H·hd] (before the output projection)."""
    B, T, _ = qkv.shape
    qkv = qkv.view(B, T, H + 2 * H_kv, hd)
    q, k = apply_rope(qkv[:, :, :H + H_kv], rope).split((H, H_kv), dim=2)
    return attend(q, k, qkv[:, :, H + H_kv:], layer_cache, mask)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_cache,
           mask) -> torch.Tensor:
    """q [B, T, H, hd], k / v [B, T, H_kv, hd] (rotated) → [B, T, H·hd]: k and v go to the
    cache, q attends over what it returns."""
    B, T, H, hd = q.shape
    keys, values = layer_cache(k, v)  # [B, S, H_kv, hd] each
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # [B, H_kv, S, hd]
    if isinstance(mask, GroupedMask):  # G query heads a kv head, as G·T rows of it
        H_kv = keys.shape[1]
        grouped = q.transpose(1, 2).reshape(B, H_kv, mask.groups * T, hd)
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask.additive)
        # reshape, not view: a GPU kernel may return its output [B, H_kv, G·T, hd] laid out
        # as [B, G·T, H_kv, hd], where G and H_kv cannot merge without a copy
        return out.reshape(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
    q = q.transpose(1, 2)
    gqa = keys.shape[1] != H
    # mask: CAUSAL (training, no cache), None (attend every cached key), bool [B,1,T,S],
    # or RowSpans (each query attends exactly its own keys, in its own call)
    if isinstance(mask, RowSpans):
        out = mask.attend(q, keys, values, gqa)
    else:
        causal = isinstance(mask, str)
        out = F.scaled_dot_product_attention(q, keys, values,
                                             attn_mask=None if causal else mask,
                                             is_causal=causal, enable_gqa=gqa)  # [B,H,T,hd]
    return out.transpose(1, 2).reshape(B, T, H * hd)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj = None  # gate and up fused (fuse_projections, engine.int8)

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
        self.plan: LayerPlan | None = None  # the inference fast path (engine.inference)

    def forward(self, x, rope, layer_cache, mask):
        if self.plan is not None and not self.training:
            return self.plan(x, rope, layer_cache, mask)
        x = x + self.self_attn(self.input_layernorm(x), rope, layer_cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass(frozen=True)
class LayerPlan:
    """A prepared layer's forward as plain calls: its fused projections' ``forward`` methods
    and norm weights taken out of the module tree once, so a decode step pays no
    ``nn.Module`` call machinery (12 module calls a layer; a few µs each, most of a small
    model's step on a CPU). The same operations as :meth:`DecoderLayer.forward` on fused
    projections."""

    norm1: torch.Tensor
    norm2: torch.Tensor
    eps: float
    qkv: object  # callables: [.., D] → [.., (H + 2·H_kv)·hd] …
    o: object
    gate_up: object
    down: object
    H: int
    H_kv: int
    hd: int

    @classmethod
    def of(cls, layer: DecoderLayer) -> LayerPlan:
        attn, mlp = layer.self_attn, layer.mlp
        return cls(layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                   layer.input_layernorm.eps, _plain(attn.qkv_proj), _plain(attn.o_proj),
                   _plain(mlp.gate_up_proj), _plain(mlp.down_proj), attn.n_heads, attn.n_kv,
                   attn.head_dim)

    def __call__(self, x, rope, layer_cache, mask):
        D = x.shape[-1]
        h = F.rms_norm(x, (D,), self.norm1, self.eps)
        x = x + self.o(attend_fused(self.qkv(h), self.H, self.H_kv, self.hd, rope,
                                    layer_cache, mask))
        gate, up = self.gate_up(F.rms_norm(x, (D,), self.norm2, self.eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def _plain(module: nn.Module):
    """A projection as a plain callable (no ``nn.Module.__call__``)."""
    if isinstance(module, nn.Linear):
        return functools.partial(F.linear, weight=module.weight, bias=module.bias)
    return module.forward


def fuse_projections(layer: DecoderLayer) -> None:
    """q/k/v into one linear and gate/up into another (in place; inference only: the
    checkpoint names stay those of the separate layers, which training and export read).
    Three GEMM calls a layer fewer; each output is the same dot product as before."""
    attn, mlp = layer.self_attn, layer.mlp
    layer.plan = None  # built again from the fused modules (Transformer.freeze_plans)
    if attn.qkv_proj is None and attn.q_proj is not None:
        attn.qkv_proj = _concat_linears(attn.q_proj, attn.k_proj, attn.v_proj)
        attn.q_proj = attn.k_proj = attn.v_proj = None
    if mlp.gate_up_proj is None and mlp.gate_proj is not None:
        mlp.gate_up_proj = _concat_linears(mlp.gate_proj, mlp.up_proj)
        mlp.gate_proj = mlp.up_proj = None


def freeze_layer(layer: DecoderLayer) -> None:
    """``layer``'s projections fused and its fast path (:class:`LayerPlan`) taken out."""
    fuse_projections(layer)
    layer.plan = LayerPlan.of(layer)


def _concat_linears(*linears: nn.Linear) -> nn.Linear:
    weight = torch.cat([lin.weight.detach() for lin in linears])
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=linears[0].bias is not None,
                      device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([lin.bias.detach() for lin in linears]))
    return fused.requires_grad_(False)


class Rotary:
    """RoPE tables for a module with ``inv_freq`` [head_dim/2] and ``config``: shared by the
    :class:`Transformer` and heads built from its layers (``engine.eagle``)."""

    def rope_tables(self, need: int) -> None:
        """Make the cached cos / sin_rot tables cover positions [0, need) (host-known: no
        device read). Grown before a capture (``engine.graphs``), never during one."""
        if need <= self._rope_len:
            return
        length = max(need, 2 * self._rope_len, self.config.max_position_embeddings)
        freqs = torch.arange(length, dtype=torch.float32,
                             device=self.inv_freq.device)[:, None] * self.inv_freq  # [L, hd/2]
        self._cos = torch.cat((freqs, freqs), dim=-1).cos()  # [L, hd]
        sin = freqs.sin()
        self._sin_rot = torch.cat((-sin, sin), dim=-1)
        self._rope_len = length

    def rope(self, positions: torch.Tensor, need: int, dtype: torch.dtype,
             first: int | None = None):
        """(cos, sin_rot) [B, T, 1, hd] in ``dtype`` for absolute ``positions`` [B, T] (device)
        whose largest is below ``need``; ``first``: one row whose positions run from it (the
        tables are then sliced, not gathered)."""
        self.rope_tables(need)
        if first is not None:
            T = positions.shape[1]
            cos = self._cos[first:first + T][None, :, None]  # [1, T, 1, hd]
            sin_rot = self._sin_rot[first:first + T][None, :, None]
        else:
            cos = self._cos[positions].unsqueeze(2)  # [B, T, 1, hd]
            sin_rot = self._sin_rot[positions].unsqueeze(2)
        if cos.dtype != dtype:
            cos, sin_rot = cos.to(dtype), sin_rot.to(dtype)
        return cos, sin_rot

    def rotary(self, positions: torch.Tensor, tables: bool = True):
        """cos, sin [B, T, head_dim] computed afresh (training: tensors made under inference
        mode cannot be saved for backward; ``tables`` is kept for callers' clarity)."""
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
        self.graphs = None  # engine.graphs.CapturedForwards, when decode runs captured

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def new_cache(self, n_slots: int, max_len: int, dtype=None) -> KVCache:
        """A KV cache on the model's device, in its activations' dtype by default (with a
        scratch slot for padding rows when its forwards replay captured graphs)."""
        cfg = self.config
        weight = self.embed_tokens.weight
        return KVCache(cfg.num_hidden_layers, n_slots, max_len, cfg.num_key_value_heads,
                       cfg.head_dim, dtype=dtype or weight.dtype, device=weight.device,
                       scratch=1 if self.graphs is not None else 0)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None,
                slots=None, last_only: bool = False,
                hidden_only: bool = False, row_exact: bool | None = None,
                with_hidden: bool = False):
        """Logits for ``input_ids`` [B, T] appended after each row's cached prefix.

        ``slots`` [B] (host: a list or NumPy array) picks the cache rows (default 0..B-1).
        Without a cache the call is a plain causal forward from position 0 (training). Returns
        [B, T, V], or [B, 1, V] with ``last_only``; ``hidden_only``: the final-norm hidden
        states [B, T, D] instead (training that needs the LM head at a few positions only).
        ``row_exact``: attend through :class:`RowSpans` (default: the model's own
        ``row_exact``; False for batch decoding that does not need batch-invariant rows, e.g.
        making training data). ``with_hidden``: return ``(logits, hidden)`` with the
        final-norm hidden states of every position [B, T, D] (an EAGLE head drafts from them;
        ``last_only`` still cuts the logits). Nothing here reads the device: positions and
        spans come from the cache's host lengths.
        """
        B, T = input_ids.shape
        slots = host_slots(slots, B) if cache is not None else None
        exact = self.row_exact if row_exact is None else row_exact
        if self.graphs is not None and cache is not None and not exact:
            out = self.graphs.run(self, input_ids, cache, slots, last_only, hidden_only,
                                  with_hidden)
            if out is not None:
                return out
        inputs, start = attention_inputs(len(self.layers), cache, slots, B, T, exact,
                                         input_ids.device)
        out = self.run(input_ids, inputs, last_only, hidden_only, with_hidden,
                       tables=not (self.training and cache is None))
        if cache is not None:
            cache.lengths[slots] = start + T
        return out

    def run(self, input_ids: torch.Tensor, inputs: StepInputs, last_only: bool = False,
            hidden_only: bool = False, with_hidden: bool = False, tables: bool = True):
        """The device side of :meth:`forward` (what ``engine.graphs`` captures)."""
        fast = not self.training and self.layers[0].plan is not None
        x = F.embedding(input_ids, self.embed_tokens.weight) if fast else \
            self.embed_tokens(input_ids)
        if tables:
            rope = self.rope(inputs.positions, inputs.need, x.dtype, inputs.first)
        else:  # training: computed afresh, differentiable
            cos, sin = self.rotary(inputs.positions)
            half = cos.shape[-1] // 2
            sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
            rope = cos.unsqueeze(2).to(x.dtype), sin.unsqueeze(2).to(x.dtype)
        cfg = self.config
        mask = group_mask(inputs.mask, cfg.num_attention_heads // cfg.num_key_value_heads,
                          x.dtype)
        if fast:  # prepared layers: plain calls (LayerPlan)
            for layer, layer_cache in zip(self.layers, inputs.writers):
                x = layer.plan(x, rope, layer_cache, mask)
            norm, head = self._final_norm, _plain(self.lm_head)
        else:
            for layer, layer_cache in zip(self.layers, inputs.writers):
                x = layer(x, rope, layer_cache, mask)
            norm, head = self.norm, self.lm_head
        if with_hidden:
            hidden = norm(x)  # [B, T, D]
            return head(hidden[:, -1:] if last_only else hidden), hidden
        if last_only:
            x = x[:, -1:]
        x = norm(x)
        return x if hidden_only else head(x)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.norm.weight, self.norm.eps)

    def freeze_plans(self) -> None:
        """Take every layer's fast path (:class:`LayerPlan`) out of its modules: call after
        the last change to them (fusing, int8, CPU linears, placement)."""
        for layer in self.layers:
            freeze_layer(layer)


def restrict_head(model: Transformer, token_ids: tuple[int, ...]) -> Transformer:
    """Keep only ``token_ids`` [N] rows of ``model``'s LM head (in place; returns the model):
    its logits then come back over those N tokens, in that order ([B, T, N]), and
    ``model.head_ids`` [N] maps a column to its token id. For a draft whose vocabulary-wide
    head is most of its cost; tokens outside get draft probability 0, which rejection
    sampling allows (a draft never proposes them). Call before ``engine.int8.quantize_int8``."""
    weight = model.lm_head.weight
    ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=weight.device)
    head = nn.Linear(model.config.hidden_size, len(ids), bias=False, device=weight.device,
                     dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight[ids])
    model.lm_head = head.requires_grad_(False)
    model.head_ids = ids
    return model

