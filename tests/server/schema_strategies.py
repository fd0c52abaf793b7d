"""Hypothesis strategies for fuzzing the HTTP API: JSON-schema-valid bodies, then mutations.

Owns: :func:`from_schema`, a translator from the JSON Schema subset that pydantic emits
(``type``, ``anyOf``/``oneOf``, ``$ref``/``$defs``, ``enum``/``const``, numeric and length
bounds, ``properties``/``required``; cross-field ``allOf``/``if``/``then`` rules are ignored)
to strategies that generate *valid* bodies, and
:func:`fuzz_request`, which takes such a body and applies one random mutation (drop a field,
add an unknown one, wrong type, extreme number, replace the whole body, truncate or corrupt
the bytes, put a lone surrogate into a string) — so the fuzzer explores both the generation
path and every rejection path.
(``hypothesis-jsonschema`` would do the first half but does not run on this hypothesis.)

Does not know: HTTP or the server; it returns ``(mutation name, body bytes, headers)``.
"""

from __future__ import annotations

import json
import math

from hypothesis import strategies as st

# any JSON value Python's json module writes (NaN and Infinity included: json.loads reads them)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=10)
EXTREME_NUMBERS = st.sampled_from([-1, 0, 1, -1.5, 2**31, 2**63, 2**64, -2**63, 10**30, 1e308,
                                   -1e308, 5e-324, math.nan, math.inf, -math.inf, 0.5, 65537])


def from_schema(schema: dict, overrides: dict[str, st.SearchStrategy] | None = None,
                max_items: int = 4) -> st.SearchStrategy:
    """Valid instances of ``schema``; ``overrides`` maps a dotted property path ("model",
    "messages.content") to a strategy used there instead of the schema's."""
    defs = schema.get("$defs", {})
    overrides = overrides or {}

    def build(node: dict, path: str) -> st.SearchStrategy:
        if path in overrides:
            return overrides[path]
        if "$ref" in node:
            return build(defs[node["$ref"].rsplit("/", 1)[-1]], path)
        if "anyOf" in node or "oneOf" in node:  # oneOf: pydantic's tagged unions (disjoint)
            return st.one_of([build(option, path) for option in node.get("anyOf",
                                                                            node.get("oneOf"))])
        if "const" in node:
            return st.just(node["const"])
        if "enum" in node:
            return st.sampled_from(node["enum"])
        kind = node.get("type")
        if kind == "string":
            return st.text(min_size=node.get("minLength", 0),
                           max_size=min(node.get("maxLength", 24), 24))
        if kind == "integer":
            lo, hi = node.get("minimum"), node.get("maximum")
            small_lo = lo if lo is not None else -4
            small_hi = small_lo + 20 if hi is None else min(hi, small_lo + 20)
            return st.integers(small_lo, small_hi) | st.integers(lo, hi)  # small values often
        if kind == "number":
            lo, hi = node.get("minimum", node.get("exclusiveMinimum")), node.get("maximum")
            return st.floats(lo, hi, exclude_min="exclusiveMinimum" in node,
                             allow_nan=False, allow_infinity=False)
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        if kind == "array":
            lo = node.get("minItems", 0)
            return st.lists(build(node.get("items", {}), path), min_size=lo,
                            max_size=max(lo, min(node.get("maxItems", max_items), max_items)))
        if kind == "object":
            props = node.get("properties", {})
            required = set(node.get("required", ()))
            strategies = {k: build(v, f"{path}.{k}" if path else k) for k, v in props.items()}
            return st.fixed_dictionaries(
                {k: s for k, s in strategies.items() if k in required},
                optional={k: s for k, s in strategies.items() if k not in required})
        return JSON_VALUES  # an unconstrained schema node

    return build(schema, "")


MUTATIONS = ("valid", "drop field", "unknown field", "wrong type", "extreme number",
             "lone surrogate", "other json", "truncated", "corrupted bytes", "random bytes")
# st.text() never draws a surrogate, but JSON can carry lone ones ("\udcff" is valid JSON)
SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])


def _string_leaves(node, path=()):
    """Paths to every string in a JSON value (dict keys and list indices)."""
    if isinstance(node, str):
        yield path
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _string_leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _string_leaves(value, (*path, i))


@st.composite
def fuzz_request(draw, valid: st.SearchStrategy[dict]) -> tuple[str, bytes, dict]:
    body = draw(valid)
    mutation = draw(st.sampled_from(MUTATIONS))
    if mutation == "drop field" and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    elif mutation == "unknown field":
        body[draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in body))] = \
            draw(JSON_VALUES)
    elif mutation == "wrong type" and body:
        body[draw(st.sampled_from(sorted(body)))] = draw(JSON_VALUES)
    elif mutation == "extreme number" and body:
        body[draw(st.sampled_from(sorted(body)))] = draw(EXTREME_NUMBERS)
    elif mutation == "lone surrogate" and body:
        leaves = list(_string_leaves(body))
        path = draw(st.sampled_from(leaves)) if leaves else (draw(st.sampled_from(sorted(body))),)
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        text = parent[path[-1]] if isinstance(parent[path[-1]], str) else ""
        at = draw(st.integers(0, len(text)))
        parent[path[-1]] = text[:at] + draw(SURROGATE) + text[at:]
    elif mutation == "other json":
        body = draw(JSON_VALUES)
    raw = json.dumps(body).encode()
    if mutation == "truncated":
        raw = raw[:draw(st.integers(0, max(0, len(raw) - 1)))]
    elif mutation == "corrupted bytes" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at + 1:]
    elif mutation == "random bytes":
        raw = draw(st.binary(max_size=64))
    headers = {"Content-Type": "application/json"}
    header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126),
                          max_size=60).map(str.lstrip)  # clients may not send leading spaces
    if draw(st.booleans()):
        headers["X-Spectest-Workload"] = draw(st.sampled_from(["chat", "CODE", "rag  "])
                                              | header_text)
    if draw(st.booleans()):
        headers["traceparent"] = draw(st.sampled_from(
            ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
             "00-00000000000000000000000000000000-0000000000000000-01",
             "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]) | header_text)
    return mutation, raw, headers
