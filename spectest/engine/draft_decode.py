"""A draft model's one-token step on the CPU, in as few tensor operations as it takes.

Owns: :class:`RowDecoder` — built from a prepared float32 CPU :class:`~spectest.engine.model.
Transformer` (:func:`row_decoder` says whether one can be), it holds folded copies of the
model's weights and computes the next-token logits of rows that each add one token, writing
those tokens' keys and values into the model's own KV cache, as the model's forward would.

Why: a draft model is small so that its step is cheap, but on a CPU a small model's step costs
what its operations cost, not its FLOPs. The embedded draft (one layer, 128 wide) does about
0.5 MFLOP a token, and its forward runs ~60 tensor operations, each a few microseconds of
dispatch: ~0.29 ms a step, and ~0.47 ms inside a round, where the target's verify has just
pushed its weights out of the caches. A K = 4 round spends a quarter of its time drafting. This
step does the same arithmetic in ~20 operations:

* every RMSNorm's gain (and its ``sqrt(D)``) is folded into the projection after it, so a norm
  is a ``vector_norm``, a ``hypot`` with its epsilon's share and an in-place division of that
  projection's output;
* the residual adds ride on ``addmm``;
* RoPE is one ``addcmul`` on the query and key heads together; a cache write is a slice
  assignment; attention is one call a row over exactly its keys (no mask to build), the G
  query heads of a kv head as G rows of it.

Exactness: the folded arithmetic differs from the model's forward in the last bits. A
draft's numbers decide only what is proposed; verification against the target decides what
is emitted, and a sampled draft's probabilities are those it sampled from. So this changes at
most which drafts are accepted, never the output. Everything else a draft does — prefill,
catch-up after rounds without drafts, several tokens a row — runs the model's own forward into
the same cache.

Does not know: int8 (its own kernels, row-exact), GPUs (captured graphs do this job there),
sampling or speculation.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from spectest.engine.kv_cache import KVCache
from spectest.engine.model import Transformer


def row_decoder(model: Transformer) -> RowDecoder | None:
    """A :class:`RowDecoder` for ``model`` where one applies: a prepared float32 model on the
    CPU, not int8, not row-exact, not replaying captured graphs; else None."""
    weight = model.embed_tokens.weight
    prepared = all(layer.plan is not None for layer in model.layers)
    if (weight.device.type != "cpu" or weight.dtype != torch.float32 or not prepared
            or model.quantization != "none" or model.row_exact or model.graphs is not None):
        return None
    return RowDecoder(model)


def _folded(gain: torch.Tensor, weight_t: torch.Tensor, dim: int) -> torch.Tensor:
    """weight_t [D, out] with row d scaled by gain[d]·sqrt(D): ``rms_norm(x, gain) @ weight_t``
    is then ``(x @ folded) / sqrt(||x||² + D·eps)``."""
    return (gain.float()[:, None] * math.sqrt(dim) * weight_t).contiguous()


def _transposed(linear) -> torch.Tensor:
    """A projection's weight as [in, out] (``CpuLinear`` keeps one; ``nn.Linear`` does not)."""
    weight_t = getattr(linear, "weight_t", None)
    return weight_t if weight_t is not None else linear.weight.detach().t().contiguous()


class RowDecoder:
    """One row's one-token step of a model, on folded weights (see the module doc)."""

    def __init__(self, model: Transformer):
        cfg = model.config
        D = cfg.hidden_size
        self.H, self.H_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, \
            cfg.head_dim
        self.model = model
        self.embed = model.embed_tokens.weight.detach()  # [V, D]
        self.layers = []
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.qkv_proj is None or mlp.gate_up_proj is None or \
                    getattr(attn.qkv_proj, "bias", None) is not None:
                raise ValueError("RowDecoder needs fused, bias-free projections")
            self.layers.append((
                _folded(layer.input_layernorm.weight, _transposed(attn.qkv_proj), D),
                _transposed(attn.o_proj).contiguous(),  # [H·hd, D]
                _folded(layer.post_attention_layernorm.weight, _transposed(mlp.gate_up_proj),
                        D),
                _transposed(mlp.down_proj).contiguous(),  # [I, D]
            ))
        self.head = _folded(model.norm.weight, _transposed(model.lm_head), D)  # [D, N]
        self.intermediate = cfg.intermediate_size
        # rms_norm(x) = x / sqrt(mean(x²) + eps) = sqrt(D)·x / hypot(||x||, sqrt(D·eps)), the
        # sqrt(D) folded into the weights
        self.eps_norm = torch.tensor(math.sqrt(D * cfg.rms_norm_eps))
        model.rope_tables(cfg.max_position_embeddings)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, cache: KVCache, slots) -> torch.Tensor:
        """Logits [B, N] after each row's token (``tokens`` [B] or [B, 1]) is appended to its
        slot's cached prefix (``slots`` [B], host ints); each slot's length grows by one.

        Everything but attention runs on the B rows at once; each row attends over its own
        keys in a call of its own (rows differ in length, and a call over exactly a row's keys
        needs no mask)."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)  # [B] host
        positions = cache.lengths[slots].copy()  # [B] host: where each new token goes
        B = len(slots)
        need = int(positions.max()) + 1
        if need > cache.max_len:
            raise ValueError(f"KV cache overflow: need {need} positions, have {cache.max_len}")
        model = self.model
        model.rope_tables(need)
        rows = [(i, int(slot), int(pos)) for i, (slot, pos) in enumerate(zip(slots, positions))]
        if B == 1:  # one row: its tables sliced, not gathered
            pos = rows[0][2]
            cos, sin_rot = model._cos[pos:pos + 1], model._sin_rot[pos:pos + 1]  # [1, hd]
        else:
            index = torch.from_numpy(positions)
            cos, sin_rot = model._cos[index], model._sin_rot[index]  # [B, hd]
        cos, sin_rot = cos[:, None], sin_rot[:, None]  # [B, 1, hd]
        H, H_kv, hd = self.H, self.H_kv, self.hd
        G, half = H // H_kv, hd // 2
        x = self.embed[tokens.reshape(B)]  # [B, D]
        eps = self.eps_norm

        def norm(v: torch.Tensor) -> torch.Tensor:  # [B, 1]: sqrt(||v||² + D·eps), sqrt(D)·rms
            return torch.hypot(torch.linalg.vector_norm(v, dim=-1, keepdim=True), eps)

        for i, (w_qkv, w_o, w_gate_up, w_down) in enumerate(self.layers):
            qkv = torch.mm(x, w_qkv).div_(norm(x))
            heads = qkv.view(B, H + 2 * H_kv, hd)  # q heads, k heads, v heads
            qk = heads[:, :H + H_kv]  # [B, H + H_kv, hd]
            swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
            rotated = torch.addcmul(qk * cos, swapped, sin_rot)  # [B, H + H_kv, hd]
            outs = []
            for b, slot, pos in rows:
                k_layer, v_layer = cache.k[i, slot], cache.v[i, slot]  # [M, H_kv, hd] each
                k_layer[pos] = rotated[b, H:]
                v_layer[pos] = heads[b, H + H_kv:]
                # 4-D, as the fused CPU kernel takes them (3-D falls back to unfused math)
                keys = k_layer[None, :pos + 1].transpose(1, 2)  # [1, H_kv, S, hd]
                values = v_layer[None, :pos + 1].transpose(1, 2)
                queries = rotated[b, :H].view(1, H_kv, G, hd)  # G query heads a kv head
                outs.append(F.scaled_dot_product_attention(queries, keys, values))
            out = outs[0] if B == 1 else torch.cat(outs)  # [B, H_kv, G, hd]
            x = torch.addmm(x, out.reshape(B, H * hd), w_o)  # [B, D]
            gate_up = torch.mm(x, w_gate_up).div_(norm(x))  # [B, 2·I]
            gate, up = gate_up.split(self.intermediate, dim=-1)
            x = torch.addmm(x, F.silu(gate).mul_(up), w_down)
        cache.lengths[slots] = positions + 1
        return torch.mm(x, self.head).div_(norm(x))
