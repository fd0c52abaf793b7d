"""``server.responses.sse``: one server-sent event per chunk, encoded with orjson on the
engine thread.

Proves: for any JSON-able chunk (any text, including emoji, NUL and lone surrogates that
orjson refuses, which go through ``json``) the event is ``data: <JSON>\\n\\n`` and decodes to the
same object, as a standard JSON parser reads it.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from spectest.server.responses import sse

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=500, deadline=None)
@given(JSON)
def test_an_event_decodes_to_its_chunk(obj):
    event = sse({"choices": [{"text": obj}]})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert b"\n" not in event[:-2]  # one line: an SSE parser splits events on blank lines
    assert json.loads(event[6:-2]) == {"choices": [{"text": obj}]}


def test_a_lone_surrogate_falls_back_to_json():
    assert sse({"text": "a\udcffb"}) == b'data: {"text":"a\\udcffb"}\n\n'
    assert sse({"text": "é🙂"}) == 'data: {"text":"é🙂"}\n\n'.encode()
