"""Stop strings: the output ends just before the first one, whichever way the tokens arrive.

A stop string usually spans several tokens. Decoding one token a round (target-only), the
first tokens of a stop string come out before the rest shows it is one; speculating, they
come in the same round. Both must emit exactly the text before the stop string — so text that
could begin one is held back until it does not (the audit's params condition found
target-only output leaking a stop string's first characters).
"""

from __future__ import annotations

import pytest
import torch

from spectest.engine.api import Engine

PROMPT = "import logging\nimport os\n\n\ndef main(argv):\n    \"\"\"Run the tool.\"\"\"\n"


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(1)
    return Engine.from_pretrained("embedded")


def test_output_ends_just_before_the_stop_string_with_and_without_speculation(engine):
    plain = engine.generate(PROMPT, max_tokens=48, ignore_eos=True)
    text = plain.text
    ends = []  # token boundaries inside the text
    for tok in plain.token_ids:
        ends.append((ends[-1] if ends else 0) + len(engine.tokenizer.decode([tok])))
    stops = []
    for start in range(4, len(text) - 6):  # stops that begin mid-way and span a boundary
        stop = text[start:start + 5]
        if stop.strip() == stop and text.find(stop) == start and \
                any(start < e < start + 5 for e in ends):
            stops.append(stop)
        if len(stops) == 6:
            break
    assert stops
    for stop in stops:
        for speculative in (True, False):
            got = engine.generate(PROMPT, max_tokens=48, ignore_eos=True, stop=(stop,),
                                  speculative=speculative)
            assert got.text == text[:text.find(stop)], (stop, speculative)
            assert got.finish_reason == "stop"


def test_held_text_comes_out_when_the_output_ends_otherwise(engine):
    plain = engine.generate(PROMPT, max_tokens=20, ignore_eos=True)
    last = plain.text[-2:]  # a stop that would begin with the output's last characters
    got = engine.generate(PROMPT, max_tokens=20, ignore_eos=True, stop=(last + "\x00zz",))
    assert got.text == plain.text and got.finish_reason == "length"
