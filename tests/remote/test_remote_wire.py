"""The draft round's binary answer: exact float32 distributions for sampled rows only, and a
clear error for anything that does not add up."""

from __future__ import annotations

import struct

import pytest
import torch
from pydantic import ValidationError

from spectest.remote import wire


def test_an_answer_round_trips_exactly_with_probabilities_for_sampled_rows_only():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (3, 4), generator=g)
    lens = torch.tensor([4, 0, 2])
    probs = torch.softmax(torch.randn(3, 4, 50, generator=g), dim=-1)  # [B, K, V]
    data = wire.encode_answer(tokens, lens, probs, [0, 2], 0.0123)
    answer = wire.decode_answer(data, 3)
    assert torch.equal(answer.tokens, tokens) and torch.equal(answer.lens, lens)
    assert torch.equal(answer.probs[[0, 2]], probs[[0, 2]])  # bit for bit
    assert not answer.probs[1].any()  # a greedy row needs no distribution
    assert answer.draft_seconds == 0.0123
    assert len(data) < 4 + 200 + 2 * 4 * 50 * 4 + 1  # only two rows' floats travel


def test_an_all_greedy_answer_carries_no_floats():
    data = wire.encode_answer(torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 1]),
                              torch.rand(2, 3, 9), [], 0.0)
    answer = wire.decode_answer(data, 2)
    assert answer.probs is None and answer.lens.tolist() == [3, 1]


@pytest.mark.parametrize("mangle", [
    lambda d: d[:3],  # no header length
    lambda d: d[:20],  # a header cut short
    lambda d: d[:-4],  # a row's floats cut short
    lambda d: d + b"\0" * 4,  # floats beyond the rows
    lambda d: struct.pack(">I", 2) + b"{}",  # fields missing
])
def test_a_malformed_answer_is_a_wire_error(mangle):
    data = wire.encode_answer(torch.ones(1, 2, dtype=torch.long), torch.tensor([2]),
                              torch.rand(1, 2, 5), [0], 0.0)
    with pytest.raises(wire.WireError, match="malformed draft answer"):
        wire.decode_answer(mangle(data), 1)


def test_lengths_past_k_are_refused():
    data = wire.encode_answer(torch.ones(1, 2, dtype=torch.long), torch.tensor([3]), None, [],
                              0.0)
    with pytest.raises(wire.WireError, match="outside"):
        wire.decode_answer(data, 1)


def test_round_requests_forbid_unknown_fields_and_unknown_operations():
    ok = wire.RoundIn.model_validate({"ops": [{"op": "rewind", "slot": 1, "n_valid": 7}]})
    assert ok.ops[0].n_valid == 7
    for bad in ({"ops": [{"op": "truncate", "slot": 1}]}, {"rows": [], "x": 1},
                {"rows": [{"slot": 0, "append": [], "k": 0, "greedy": True,
                           "temperature": 0, "top_k": 0, "top_p": 1}]}):
        with pytest.raises(ValidationError):
            wire.RoundIn.model_validate(bad)
