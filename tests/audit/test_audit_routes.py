"""Pure pieces of how the auditor reads a server: llama.cpp's grammar literal that forces a
continuation, and telling raw logprobs from processed ones."""

from __future__ import annotations

import math

from spectest.audit.samples import Position
from spectest.audit.scoring import gbnf_literal, processed_logprobs


def test_a_grammar_literal_escapes_everything_but_letters_digits_and_spaces():
    text = 'say "hi"\n\\ é 😀 x1'
    grammar = gbnf_literal(text)
    assert grammar.startswith('root ::= "') and grammar.endswith('"')
    body = grammar[len('root ::= "'):-1]
    assert '"' not in body and "\n" not in body and "é" not in body
    assert "\\x22" in body and "\\x0A" in body and "\\x5C" in body
    assert "\\u00E9" in body and "\\U0001F600" in body and "say " in body and " x1" in body


def _position(logprobs: dict[int, float]) -> Position:
    top = tuple(sorted(logprobs.items(), key=lambda kv: -kv[1]))
    return Position(top[0][0], top[0][1], top)


def test_processed_logprobs_are_told_from_raw_ones_and_from_noise():
    raw = {1: -0.5, 2: -1.5, 3: -2.5, 4: -3.0, 5: -4.0}
    t = 0.5  # what a server reports after temperature: log softmax(raw / t)
    scaled = {k: v / t for k, v in raw.items()}
    z = math.log(sum(math.exp(v) for v in scaled.values()))
    processed = {k: v - z for k, v in scaled.items()}
    noisy = {k: v + (0.3 if k == 3 else 0.02) for k, v in raw.items()}
    assert processed_logprobs(_position(processed), _position(raw))
    assert not processed_logprobs(_position(raw), _position(raw))
    # one token moved by llama.cpp's cache-state noise decides nothing (the median does)
    assert not processed_logprobs(_position(noisy), _position(raw))
    # a server whose noise floor is tenths of a nat: its tolerance rises with it
    assert not processed_logprobs(_position(noisy), _position(raw), noise=0.8)
