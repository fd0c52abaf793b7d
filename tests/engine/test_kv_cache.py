"""KV-cache rewind: decode n, rewind m, decode again gives the logits of a fresh run.

Checked per slot while other slots hold their own sequences (their K/V, lengths and later
logits must not change), for the one-token and the verify-chunk shapes speculation uses, and
for a batch whose rows were rewound by different amounts. A fresh run that makes the same calls
must match bit for bit; one with a different call shape (batch or chunking) to 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from spectest.engine.kv_cache import KVCache
from spectest.engine.model import ModelConfig, Transformer

pytestmark = pytest.mark.usefixtures("single_thread")

CFG = ModelConfig(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=12)
MAX_LEN = 48


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CFG).eval()


def tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, CFG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)
                         ).tolist()


def feed(model, cache, slot: int, ids: list[int], chunk: int = 1) -> list[torch.Tensor]:
    """Feed ``ids`` into ``slot`` ``chunk`` tokens per call; logits of each call [T, V]."""
    out = []
    with torch.no_grad():
        for i in range(0, len(ids), chunk):
            piece = torch.tensor([ids[i:i + chunk]])
            out.append(model(piece, cache, torch.tensor([slot]))[0])
    return out


def snapshot(cache: KVCache, slot: int):
    return cache.k[:, slot].clone(), cache.v[:, slot].clone(), int(cache.lengths[slot])


@pytest.mark.parametrize("n,m,chunk", [(6, 2, 1), (6, 6, 1), (5, 1, 1), (8, 3, 4), (4, 0, 1)])
def test_rewind_then_decode_equals_fresh_run(model, n, m, chunk):
    prompt, decoded, redo = tokens(1, 10), tokens(2, n), tokens(3, 5)
    cache = model.new_cache(3, MAX_LEN)
    feed(model, cache, 0, tokens(4, 13), chunk=13)  # neighbours with their own sequences
    feed(model, cache, 2, tokens(5, 7), chunk=7)
    before = {s: snapshot(cache, s) for s in (0, 2)}

    feed(model, cache, 1, prompt, chunk=10)
    feed(model, cache, 1, decoded, chunk)
    assert int(cache.lengths[1]) == 10 + n
    cache.rewind(1, 10 + n - m)
    after_rewind = feed(model, cache, 1, redo, chunk)

    fresh = model.new_cache(3, MAX_LEN)  # same calls, nothing to rewind
    feed(model, fresh, 1, prompt, chunk=10)
    feed(model, fresh, 1, decoded[:n - m], chunk)
    expected = feed(model, fresh, 1, redo, chunk)
    if (n - m) % chunk == 0:  # identical call shapes: identical arithmetic
        for got, want in zip(after_rewind, expected):
            assert torch.equal(got, want)
    full = model.new_cache(1, MAX_LEN)  # one prefill of the final sequence
    with torch.no_grad():
        reference = model(torch.tensor([prompt + decoded[:n - m] + redo]), full)[0]
    torch.testing.assert_close(torch.cat(after_rewind), reference[10 + n - m:],
                               atol=1e-5, rtol=0)

    for slot, (k, v, length) in before.items():  # neighbours untouched
        assert int(cache.lengths[slot]) == length
        assert torch.equal(cache.k[:, slot], k) and torch.equal(cache.v[:, slot], v)


def test_neighbours_decode_the_same_after_a_rewind(model):
    a, b = tokens(6, 9), tokens(7, 12)
    cache, alone = model.new_cache(2, MAX_LEN), model.new_cache(2, MAX_LEN)
    feed(model, cache, 0, a, chunk=9)
    feed(model, alone, 0, a, chunk=9)
    feed(model, cache, 1, b, chunk=12)
    cache.rewind(1, 4)
    feed(model, cache, 1, tokens(8, 6))
    for got, want in zip(feed(model, cache, 0, tokens(9, 5)), feed(model, alone, 0, tokens(9, 5))):
        assert torch.equal(got, want)


def test_batched_rows_rewound_by_different_amounts(model):
    seqs, keep = [tokens(10, 14), tokens(11, 9)], [8, 6]
    nxt = [tokens(12, 3), tokens(13, 3)]
    cache = model.new_cache(2, MAX_LEN)
    with torch.no_grad():
        for slot, seq in enumerate(seqs):
            feed(model, cache, slot, seq, chunk=len(seq))
            cache.rewind(slot, keep[slot])
        got = model(torch.tensor(nxt), cache)  # both rows, one call, different positions
        for slot in range(2):
            fresh = model.new_cache(1, MAX_LEN)
            want = model(torch.tensor([seqs[slot][:keep[slot]] + nxt[slot]]), fresh)[0]
            torch.testing.assert_close(got[slot], want[keep[slot]:], atol=1e-5, rtol=0)
            assert int(cache.lengths[slot]) == keep[slot] + 3


def test_reset_slot_reuses_it_like_new(model):
    cache = model.new_cache(1, MAX_LEN)
    feed(model, cache, 0, tokens(14, 20), chunk=20)
    cache.reset(0)
    reused = feed(model, cache, 0, tokens(15, 6), chunk=6)[0]
    fresh = feed(model, model.new_cache(1, MAX_LEN), 0, tokens(15, 6), chunk=6)[0]
    assert torch.equal(reused, fresh)


@pytest.mark.parametrize("length", [-1, 6])
def test_rewind_outside_the_sequence_is_refused(model, length):
    cache = model.new_cache(2, MAX_LEN)
    feed(model, cache, 0, tokens(16, 5), chunk=5)
    with pytest.raises(ValueError, match="cannot rewind slot 0"):
        cache.rewind(0, length)
    assert int(cache.lengths[0]) == 5


def test_overflow_is_refused(model):
    cache = model.new_cache(1, 8)
    feed(model, cache, 0, tokens(17, 6), chunk=6)
    with pytest.raises(ValueError, match="KV cache overflow"):
        feed(model, cache, 0, tokens(18, 3), chunk=3)


@pytest.mark.parametrize("slots,viewed", [([2, 3, 4], True), ([0, 1], True), ([1, 3], False),
                                          ([3, 2], False)])
def test_consecutive_slots_attend_over_a_view_not_a_copy(slots, viewed):
    """Rows in slot order 0..B−1 (or any consecutive run) read the cache in place; others are
    gathered. Both return the same keys (a gather at batch 32 cost 7 ms a layer)."""
    cache = KVCache(1, 6, MAX_LEN, 2, 12)
    cache.k.normal_()
    cache.v.normal_()
    B = len(slots)
    positions = torch.full((B, 1), 5)
    [write] = cache.writers(torch.tensor(slots), positions, span=6)
    new = torch.randn(B, 1, 2, 12)
    keys, values = write(new, new)
    assert keys.shape == (B, 6, 2, 12)
    assert (keys.data_ptr() == cache.k[0, slots[0]].data_ptr()) == viewed
    assert torch.equal(keys, cache.k[0, slots, :6]) and torch.equal(values, cache.v[0, slots, :6])
    assert torch.equal(keys[:, 5], new[:, 0])

