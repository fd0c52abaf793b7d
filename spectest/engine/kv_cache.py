"""Preallocated key/value cache with one length per slot (batch row) and per-slot rewind.

Owns: the K/V tensors ``[layers, slots, max_len, kv_heads, head_dim]`` (on the model's device)
and ``lengths`` [slots] — a NumPy array on the host: the engine always knows how long each row
is without asking the device (``engine.device``). A slot is a row that one request holds for
its lifetime; the scheduler hands slots out. ``scratch`` extra slots past ``n_slots`` take the
writes of padding rows when a forward runs at a fixed batch size (``engine.graphs``).

Does not know: requests, models or speculation. Rewinding is just lowering a slot's length;
entries past a length are garbage that the attention mask never reads and the next write
overwrites.
"""

from __future__ import annotations

import numpy as np
import torch

from spectest.engine.device import to_device


class KVCache:
    def __init__(self, n_layers: int, n_slots: int, max_len: int, n_kv_heads: int,
                 head_dim: int, dtype=torch.float32, device: torch.device | str = "cpu",
                 scratch: int = 0):
        shape = (n_layers, n_slots + scratch, max_len, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = np.zeros(n_slots + scratch, dtype=np.int64)  # host
        self.n_slots, self.max_len = n_slots, max_len

    @property
    def device(self) -> torch.device:
        return self.k.device

    def rewind(self, slot: int, length: int) -> None:
        """Forget everything in ``slot`` from position ``length`` on."""
        if not 0 <= length <= int(self.lengths[slot]):
            raise ValueError(f"cannot rewind slot {slot} from {int(self.lengths[slot])} "
                             f"to {length}")
        self.lengths[slot] = length

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0

    def used_positions(self) -> int:
        return int(self.lengths[:self.n_slots].sum())

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def row_writers(self, slot: int, first: int, T: int, span: int):
        """:meth:`writers` for one row whose ``T`` new positions start at ``first``."""
        def make(k_layer, v_layer):  # [S, M, H, hd] each
            def write(k: torch.Tensor, v: torch.Tensor):  # [1, T, H, hd] each
                k_layer[slot, first:first + T] = k[0]
                v_layer[slot, first:first + T] = v[0]
                return k_layer[slot:slot + 1, :span], v_layer[slot:slot + 1, :span]
            return write

        return [make(self.k[i], self.v[i]) for i in range(self.k.shape[0])]

    def writers(self, slots: np.ndarray, positions: np.ndarray, span: int,
                positions_dev: torch.Tensor | None = None):
        """One function per layer that stores new K/V and returns the keys/values to attend.

        ``slots`` [B] and ``positions`` [B, T] (absolute positions of the new tokens) on the
        host; ``span``: how many leading positions attention reads. Each returns
        ([B, span, H, hd], same). Consecutive slots (the engine sorts rows by slot and the
        scheduler packs them low) attend over a view of the cache; others gather B × span rows.
        """
        slots = np.asarray(slots, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        B, T = positions.shape
        lo = int(slots[0])
        consecutive = bool((slots == np.arange(lo, lo + B)).all())
        # one row's positions run pos0, pos0 + 1, …: a slice, not an index_put
        pos0 = int(positions[0, 0])
        one_row = B == 1 and bool((positions[0] == np.arange(pos0, pos0 + T)).all())
        device = self.k.device
        if one_row:
            rows = cols = slot_index = None
        else:
            cols = positions_dev if positions_dev is not None else to_device(positions, device)
            rows = to_device(np.repeat(slots[:, None], T, axis=1), device)
            slot_index = None if consecutive else to_device(slots, device)

        def make(k_layer, v_layer):  # [S, M, H, hd] each
            def write(k: torch.Tensor, v: torch.Tensor):
                # k, v: [B, T, H, hd]
                if one_row:
                    k_layer[lo, pos0:pos0 + T] = k[0]
                    v_layer[lo, pos0:pos0 + T] = v[0]
                else:
                    k_layer.index_put_((rows, cols), k.to(k_layer.dtype))
                    v_layer.index_put_((rows, cols), v.to(v_layer.dtype))
                if consecutive:
                    return k_layer[lo:lo + B, :span], v_layer[lo:lo + B, :span]
                return k_layer[slot_index, :span], v_layer[slot_index, :span]
            return write

        return [make(self.k[i], self.v[i]) for i in range(self.k.shape[0])]
