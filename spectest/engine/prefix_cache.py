"""Prefix caching: prompt blocks already computed, their KV reused by later prompts sharing them.

Owns: :class:`PrefixCache` — full blocks of ``block`` prompt tokens, each keyed by a hash of
every token up to its end and the request's ``cache_salt`` (vLLM's field: requests with
different salts never share blocks, so a client can ask for a cold computation), holding that
block's keys and values in every layer (and the target's final-norm hidden states where an
EAGLE drafter needs them), evicted least recently used beyond ``capacity_tokens``.

A hit restores the longest chain of cached blocks that ends on a multiple of ``align`` tokens
(``CHUNK``) into a slot of the engine's :class:`~spectest.engine.kv_cache.KVCache` and leaves
the rest of the prompt (always at least its last token, whose logits are needed) to the
prefill. The restored positions are the ones an earlier prefill wrote, and every prefill runs
in the same chunk-aligned forwards (:func:`prefill_spans`), so a warm prompt's logits equal a
cold one's bit for bit. Chunks of 64 tokens cost a long prompt what one forward does (16-token
ones took 1.7× as long for 1,378 tokens); a hit gives up the blocks past its last chunk.

Does not know: requests, models or drafters. Not thread-safe: the engine thread alone uses it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from spectest.engine.kv_cache import KVCache

BLOCK = 16  # tokens a block: vLLM's default block size
CHUNK = 64  # tokens a prefill forward at most; a hit ends on a multiple of it


def prefill_spans(start: int, end: int, chunk: int = CHUNK) -> list[tuple[int, int]]:
    """The forwards a prefill of positions ``start`` … ``end``-1 runs: spans of at most
    ``chunk`` tokens cut at multiples of it from position 0. A position is then computed by
    the same call shapes whether its prompt came cold or after a hit (which ends on a chunk
    boundary), so warm logits equal cold ones bit for bit."""
    return [(lo, min(end, (lo // chunk + 1) * chunk)) for lo in range(start, end, chunk)]


@dataclass(frozen=True)
class Block:
    keys: torch.Tensor  # [layers, block, kv_heads, head_dim]
    values: torch.Tensor  # same
    hidden: torch.Tensor | None  # [block, D]: the target's final-norm states (EAGLE), or None


class PrefixCache:
    def __init__(self, capacity_tokens: int, block: int = BLOCK, align: int = CHUNK):
        if block < 1 or capacity_tokens < block:
            raise ValueError(f"prefix cache: capacity {capacity_tokens} holds no block of {block}")
        if align % block:
            raise ValueError(f"prefix cache: hits aligned to {align} tokens, not a multiple of "
                             f"its {block}-token blocks")
        self.block, self.align = block, align
        self.capacity = capacity_tokens // block  # in blocks
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()
        self.queries = self.hits = 0  # prompt tokens looked up / found, since start

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, salt: str | None, ids: tuple[int, ...], n_blocks: int) -> list[bytes]:
        """The chained key of each of the first ``n_blocks`` full blocks of ``ids``."""
        keys, prev = [], hashlib.blake2b((salt or "").encode("utf-8"), digest_size=16).digest()
        for b in range(n_blocks):
            chunk = ids[b * self.block:(b + 1) * self.block]
            prev = hashlib.blake2b(prev + b"".join(t.to_bytes(4, "little") for t in chunk),
                                   digest_size=16).digest()
            keys.append(prev)
        return keys

    def match(self, salt: str | None, ids: tuple[int, ...]) -> list[Block]:
        """The longest chain of cached blocks that starts ``ids``, ends on a multiple of
        ``align`` tokens and leaves its last token uncomputed (its logits are needed); counts
        the lookup."""
        usable = (len(ids) - 1) // self.block
        keys = []
        for key in self._keys(salt, ids, usable):
            if key not in self._blocks:
                break
            keys.append(key)
        per_chunk = self.align // self.block
        keys = keys[:len(keys) // per_chunk * per_chunk]
        found = []
        for key in keys:
            self._blocks.move_to_end(key)
            found.append(self._blocks[key])
        self.queries += len(ids)
        self.hits += len(found) * self.block
        return found

    @staticmethod
    def restore(cache: KVCache, slot: int, blocks: list[Block], copied: int) -> None:
        """Write ``blocks`` into ``slot`` from position 0 and set its length to their span.
        Only the first ``copied`` positions come from the blocks (all of them, but under an
        injected fault: ``engine.faults``); the rest are zeroed, a block never written."""
        n = len(blocks) * blocks[0].keys.shape[1] if blocks else 0
        if n:
            keys = torch.cat([b.keys for b in blocks], dim=1)  # [L, n, H, hd]
            values = torch.cat([b.values for b in blocks], dim=1)
            cache.k[:, slot, :copied] = keys[:, :copied]
            cache.v[:, slot, :copied] = values[:, :copied]
            cache.k[:, slot, copied:n] = 0
            cache.v[:, slot, copied:n] = 0
        cache.lengths[slot] = n

    @staticmethod
    def hidden(blocks: list[Block]) -> torch.Tensor | None:
        """The blocks' hidden states [n, D] (None when they were stored without)."""
        if not blocks or blocks[0].hidden is None:
            return None
        return torch.cat([b.hidden for b in blocks])

    def store(self, salt: str | None, ids: tuple[int, ...], cache: KVCache, slot: int,
              hidden: torch.Tensor | None = None) -> None:
        """Keep every full block of ``ids`` (the prompt just prefilled into ``slot``) that is
        not cached yet; ``hidden`` [len(ids), D]: the target's states, for EAGLE drafters."""
        n_blocks = len(ids) // self.block
        for b, key in enumerate(self._keys(salt, ids, n_blocks)):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            span = slice(b * self.block, (b + 1) * self.block)
            self._blocks[key] = Block(cache.k[:, slot, span].clone(),
                                      cache.v[:, slot, span].clone(),
                                      None if hidden is None else hidden[span].clone())
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
