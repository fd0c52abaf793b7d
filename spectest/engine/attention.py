"""What one forward over a KV cache attends to: positions, masks and cache writers.

Owns: :class:`StepInputs` (the device-side inputs of a forward: positions, the mask, each
layer's cache writer), built two ways —

* :func:`attention_inputs` from the host's lengths (``KVCache.lengths`` is NumPy): the exact
  key span, a view of the cache when the rows' slots are consecutive, a slice write for one
  row, no mask for one query; nothing in it reads the device;
* :func:`static_inputs` from device tensors and a fixed span: the same shapes whatever the
  lengths, so a forward can be captured once and replayed (``engine.graphs``);

and :class:`RowSpans` / :func:`decode_queries`: batch-invariant attention for int8 models
(``engine.int8``, CPU only).

Does not know: weights, sampling or speculation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from spectest.engine.device import to_device
from spectest.engine.kv_cache import KVCache

CAUSAL = "causal"  # mask marker: plain causal attention from position 0


@dataclass(frozen=True)
class StepInputs:
    positions: torch.Tensor  # [B, T] absolute positions of the new tokens (device)
    need: int  # RoPE positions the tables must cover (largest position + 1; host-known)
    mask: object  # CAUSAL, None (every cached key), bool [B, 1, T, S] or RowSpans
    writers: list[Callable]  # per layer: write(k, v) -> (keys, values)
    first: int | None = None  # one row at positions first … first+T-1: tables are sliced


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
    return out.reshape(1, T, H, hd).transpose(1, 2)  # reshape: a GPU kernel's layout may differ


def host_slots(slots, batch: int) -> np.ndarray:
    """Slot numbers [B] as a host array (default 0..B-1); a tensor passed by a caller outside
    the engine is read once."""
    if slots is None:
        return np.arange(batch, dtype=np.int64)
    return np.asarray(slots, dtype=np.int64).reshape(batch)


def attention_inputs(n_layers: int, cache: KVCache | None, slots: np.ndarray | None, B: int,
                     T: int, row_exact: bool,
                     device: torch.device) -> tuple[StepInputs, np.ndarray | None]:
    """The inputs of ``T`` new tokens for each of ``B`` rows (``slots`` [B], host) and each
    row's start length [B] (None without a cache), from the host's lengths alone."""
    if cache is None:
        positions = torch.arange(T, device=device).expand(B, T)
        return StepInputs(positions, T, CAUSAL, [_no_cache] * n_layers), None
    if B == 1 and not row_exact:  # the usual decode call, on host ints alone
        slot = int(slots[0])
        first = int(cache.lengths[slot])
        span = first + T
        if span > cache.max_len:
            raise ValueError(f"KV cache overflow: need {span} positions, have {cache.max_len}")
        positions = torch.arange(first, span, device=device).unsqueeze(0)  # [1, T]
        mask = None if T == 1 else causal_mask(positions, span)
        return StepInputs(positions, span, mask, cache.row_writers(slot, first, T, span),
                          first), np.array([first], dtype=np.int64)
    start = cache.lengths[slots].copy()  # [B]
    positions = start[:, None] + np.arange(T)  # [B, T]
    span = int(start.max()) + T
    if span > cache.max_len:
        raise ValueError(f"KV cache overflow: need {span} positions, have {cache.max_len}")
    positions_dev = to_device(positions, device)
    if row_exact:
        mask = RowSpans(tuple(map(tuple, (positions + 1).tolist())))
    elif B == 1 and T == 1:
        mask = None  # one query, every cached key is in its past
    else:
        mask = causal_mask(positions_dev, span)
    return StepInputs(positions_dev, span, mask,
                      cache.writers(slots, positions, span, positions_dev)), start


@dataclass(frozen=True)
class GroupedMask:
    """An additive mask [B, 1, G·T, S] for queries grouped by kv head (:func:`group_mask`)."""

    additive: torch.Tensor
    groups: int


def group_mask(mask, groups: int, dtype: torch.dtype):
    """A bool mask [B, 1, T, S] made once per forward into the mask of G = H / H_kv query heads
    attending as G·T rows of their kv head: one attention call per kv head instead of an
    expanded ``enable_gqa`` one, bit for bit the same result and ~30 % cheaper for a
    (K+1)-token verify on the CPU (measured: 52 → 37 µs a layer at 305 keys). Other masks pass
    through."""
    if not isinstance(mask, torch.Tensor) or groups == 1:
        return mask
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf"))
    return GroupedMask(additive.repeat(1, 1, groups, 1), groups)


def causal_mask(positions: torch.Tensor, span: int) -> torch.Tensor:
    """Which of the first ``span`` keys each query sees: positions [B, T] → [B, 1, T, span]."""
    key_pos = torch.arange(span, device=positions.device)
    return (key_pos[None, None, :] <= positions[:, :, None]).unsqueeze(1)


def static_inputs(cache: KVCache, slots: torch.Tensor, positions: torch.Tensor,
                  span: int) -> StepInputs:
    """Fixed-shape inputs from device tensors (slots [B], positions [B, T]): K/V written by
    index, keys gathered by slot over ``span`` positions, an explicit mask. Nothing depends on
    the lengths but through ``positions``' values, so a capture replays for any of them."""
    B, T = positions.shape
    rows = slots[:, None].expand(B, T)
    mask = causal_mask(positions, span)

    def make(k_layer, v_layer):  # [S, M, H, hd] each
        def write(k, v):
            k_layer.index_put_((rows, positions), k.to(k_layer.dtype))
            v_layer.index_put_((rows, positions), v.to(v_layer.dtype))
            return k_layer[:, :span].index_select(0, slots), \
                v_layer[:, :span].index_select(0, slots)
        return write

    writers = [make(cache.k[i], cache.v[i]) for i in range(cache.k.shape[0])]
    return StepInputs(positions, cache.max_len, mask, writers)


def _no_cache(k, v):
    return k, v
