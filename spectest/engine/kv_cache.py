"""Preallocated key/value cache with one length per slot (batch row) and per-slot rewind.

Owns: the K/V tensors ``[layers, slots, max_len, kv_heads, head_dim]`` and ``lengths`` [slots].
A slot is a row that one request holds for its lifetime; the scheduler hands slots out.

Does not know: requests, models or speculation. Rewinding is just lowering a slot's length;
entries past a length are garbage that the attention mask never reads and the next write
overwrites.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, n_slots: int, max_len: int, n_kv_heads: int,
                 head_dim: int, dtype=torch.float32):
        shape = (n_layers, n_slots, max_len, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.lengths = torch.zeros(n_slots, dtype=torch.long)
        self.n_slots, self.max_len = n_slots, max_len

    def rewind(self, slot: int, length: int) -> None:
        """Forget everything in ``slot`` from position ``length`` on."""
        if not 0 <= length <= int(self.lengths[slot]):
            raise ValueError(f"cannot rewind slot {slot} from {int(self.lengths[slot])} "
                             f"to {length}")
        self.lengths[slot] = length

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0

    def used_positions(self) -> int:
        return int(self.lengths.sum())

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def writers(self, slots: torch.Tensor, positions: torch.Tensor, span: int):
        """One function per layer that stores new K/V and returns the keys/values to attend.

        ``slots`` [B], ``positions`` [B, T] absolute positions of the new tokens, ``span``
        how many leading positions attention reads. Each returns ([B, span, H, hd], same).
        """
        B, T = positions.shape
        lo = int(slots[0])
        # consecutive slots (the engine sorts rows by slot; the scheduler packs them low):
        # attention reads a view of the cache; otherwise a gather copies B × span rows
        consecutive = bool((slots == torch.arange(lo, lo + B)).all())
        rows = slots[:, None].expand_as(positions)  # [B, T]
        one_row = B == 1  # its positions run pos0, pos0 + 1, …: a slice, not an index_put
        slot0, pos0 = int(slots[0]), int(positions[0, 0])

        def make(k_layer, v_layer):  # [S, M, H, hd] each
            def write(k: torch.Tensor, v: torch.Tensor):
                # k, v: [B, T, H, hd]
                if one_row:
                    k_layer[slot0, pos0:pos0 + T] = k[0]
                    v_layer[slot0, pos0:pos0 + T] = v[0]
                else:
                    k_layer[rows, positions] = k.to(k_layer.dtype)
                    v_layer[rows, positions] = v.to(v_layer.dtype)
                if consecutive:
                    return k_layer[lo:lo + B, :span], v_layer[lo:lo + B, :span]
                return k_layer[slots, :span], v_layer[slots, :span]
            return write

        return [make(self.k[i], self.v[i]) for i in range(self.k.shape[0])]
