"""The hand-written cases of the fuzz campaign (``benchmarks/fuzz_api.py``): each a request
as bytes on the wire (path, method, headers, body) and the answer it must get.

Owns :class:`Raw` and :func:`hand_written` — Unicode edge cases in every text field (lone
surrogates, noncharacters, NUL, BOM, RTL, 4-byte emoji, huge strings), invalid UTF-8 in the raw
body, huge and odd numbers, deep nesting, wrong types, duplicate keys, wrong content types,
truncated JSON, wrong methods and paths, odd headers, oversized bodies and dropped streams —
with the statuses each may get and the error ``param`` it must name; and the valid completion
and chat bodies they are built from (``COMPLETION``, ``CHAT``). Knows nothing of how cases are
sent or tallied, of Schemathesis, or of the server under test beyond its routes, its limits
and the model name it serves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MODEL = "spectest-demo"  # what `spectest serve --model embedded` serves
JSON = {"Content-Type": "application/json"}
COMPLETION = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@dataclass(frozen=True)
class Raw:
    """One hand-written request; ``expect``: the statuses it may get (None: any below 500);
    ``param``: the error's ``param`` it must name; ``drop``: read one chunk, then hang up;
    ``protocol``: malformed HTTP that aiohttp's parser answers (a plain-text 400) before any
    handler runs, so no OpenAI error body is expected."""
    name: str
    path: str
    body: bytes | None
    headers: dict = field(default_factory=lambda: dict(JSON))
    method: str = "POST"
    expect: frozenset | None = None
    param: str | None = None
    drop: bool = False
    protocol: bool = False


def dumps(obj) -> bytes:
    """JSON as Python writes it: lone surrogates become ``\\udxxx`` escapes (valid JSON)."""
    return json.dumps(obj).encode()


# --- hand-written cases ------------------------------------------------------------------------
SURROGATES = {"lone high": "\ud800", "lone low": "\udfff", "lone low dcff": "\udcff",
              "high at end": "ok \ud83d", "low at start": "\ude00 ok",
              "reversed pair": "\udc00\ud800", "two highs": "a\ud800\udbffb"}
VALID_TEXT = {"escaped pair (emoji)": "\ud83d\ude00", "noncharacters": "\ufffe\uffff\U0010ffff",
              "NUL": "\x00", "NULs inside": "a\x00b\x00" * 8, "BOM": "\ufeffhello",
              "RTL override": "\u202eabc\u202c", "RTL scripts": "שלום عليكم",
              "combining marks": "e" + "\u0301" * 200, "4-byte emoji": "👨‍👩‍👧‍👦🏳️‍🌈😀𝕏",
              "CJK": "你好世界", "controls": "\x01\x07\x1b[31m\x7f\x9f",
              "line separators": "\u2028\u2029", "whitespace": " \t\n\r ", "empty": "",
              "long 40k": "ab " * 13_000}
# (slot, JSON path named in `param`, body builder)
SLOTS = [
    ("/v1/completions", "prompt", lambda v: {**COMPLETION, "prompt": v}),
    ("/v1/completions", "prompt[0]", lambda v: {**COMPLETION, "prompt": [v]}),
    ("/v1/completions", "stop", lambda v: {**COMPLETION, "stop": v}),
    ("/v1/completions", "stop[1]", lambda v: {**COMPLETION, "stop": ["\n\n", v]}),
    ("/v1/completions", "model", lambda v: {**COMPLETION, "model": v}),
    ("/v1/completions", "user", lambda v: {**COMPLETION, "user": v}),
    ("/v1/chat/completions", "messages[0].content",
     lambda v: {**CHAT, "messages": [{"role": "user", "content": v}]}),
    ("/v1/chat/completions", "messages[0].content",  # a system prompt
     lambda v: {**CHAT, "messages": [{"role": "system", "content": v},
                                     {"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", "messages[1].content[1].text",
     lambda v: {**CHAT, "messages": [{"role": "user", "content": "hi"},
                                     {"role": "user", "content": [
                                         {"type": "text", "text": "a"},
                                         {"type": "text", "text": v}]}]}),
    ("/v1/chat/completions", "messages[0].name",
     lambda v: {**CHAT, "messages": [{"role": "user", "content": "hi", "name": v}]}),
    ("/v1/chat/completions", "stop", lambda v: {**CHAT, "stop": v}),
    ("/v1/chat/completions", "model", lambda v: {**CHAT, "model": v}),
]
NUMBERS = ["NaN", "Infinity", "-Infinity", "1e308", "1e309", "-1e309", "-0", "-0.0", "0.0",
           "5e-324", "18446744073709551616", "-9223372036854775809", "9223372036854775807",
           "1" + "0" * 400, "1" + "0" * 5000, "1.5", "1e2", "true", '"5"', "null", "[]", "{}"]
NUMERIC = {"/v1/completions": ["max_tokens", "temperature", "top_p", "top_k", "seed", "logprobs",
                               "presence_penalty", "n"],
           "/v1/chat/completions": ["max_tokens", "max_completion_tokens", "top_logprobs",
                                    "temperature", "top_p", "top_k", "seed",
                                    "frequency_penalty"]}
WRONG_TYPES = [None, True, 0, -1, 1.5, "", "x", [], [1], ["x", 2], {}, {"a": 1}]


def _with_raw(base: dict, key: str, literal: str) -> bytes:
    """``base`` as JSON with ``key`` set to a raw JSON literal (NaN, 1e309, 5000 digits...)."""
    return dumps({**base, key: "@@"}).replace(b'"@@"', literal.encode())


def _nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def hand_written() -> list[Raw]:
    bad = frozenset({400})
    cases: list[Raw] = []
    for path, slot, build in SLOTS:
        for label, text in SURROGATES.items():
            cases.append(Raw(f"{slot}: {label}", path, dumps(build(text)), expect=bad,
                             param=slot))
            cases.append(Raw(f"{slot}: {label} as raw bytes", path,  # json.loads decodes
                             json.dumps(build(text), ensure_ascii=False)  # surrogatepass
                             .encode("utf-8", "surrogatepass"), expect=bad, param=slot))
        for label, text in VALID_TEXT.items():
            cases.append(Raw(f"{slot}: {label}", path, dumps(build(text))))
            joined = text.encode("utf-16", "surrogatepass").decode("utf-16")  # pairs -> chars
            cases.append(Raw(f"{slot}: {label} (UTF-8)", path,
                             json.dumps(build(joined), ensure_ascii=False).encode()))
    comp = dumps(COMPLETION)[:-1]  # '{... "max_tokens": 2' — splice raw bytes in before '}'
    for label, raw in {"invalid byte": b"\xff", "overlong /": b"\xc0\xaf",
                       "overlong NUL": b"\xc0\x80", "overlong 3-byte": b"\xe0\x80\xaf",
                       "encoded surrogate": b"\xed\xa0\x80", "beyond U+10FFFF": b"\xf4\x90\x80\x80",
                       "truncated 3-byte": b"\xe2\x82", "lone continuation": b"\x80",
                       "5-byte form": b"\xf8\x88\x80\x80\x80"}.items():
        cases.append(Raw(f"raw UTF-8: {label} in a string", "/v1/completions",
                         comp + b', "user": "a' + raw + b'"}', expect=bad))
        cases.append(Raw(f"raw UTF-8: {label} as a key", "/v1/chat/completions",
                         dumps(CHAT)[:-1] + b', "' + raw + b'": 1}', expect=bad))
    cases += [Raw("BOM before the body", "/v1/completions", b"\xef\xbb\xbf" + dumps(COMPLETION)),
              Raw("UTF-16 body", "/v1/completions", json.dumps(COMPLETION).encode("utf-16")),
              Raw("UTF-32 body", "/v1/chat/completions", json.dumps(CHAT).encode("utf-32"))]
    for path, keys in NUMERIC.items():
        base = COMPLETION if path == "/v1/completions" else CHAT
        for key in keys:
            for literal in NUMBERS:
                cases.append(Raw(f"{key} = {literal[:24]}", path, _with_raw(base, key, literal)))
        for literal in NUMBERS:
            if path == "/v1/completions":
                cases.append(Raw(f"token id {literal[:24]}", path,
                                 _with_raw(base, "prompt", f"[1, {literal}]")))
        for key in sorted({*base, "stop", "stream", "stream_options", "user", "speculative",
                           "ignore_eos", "logprobs", "n", "echo", "suffix"}):
            for value in WRONG_TYPES:
                cases.append(Raw(f"{key} = {json.dumps(value)}", path, dumps({**base, key: value})))
    for depth in (10, 100, 900, 1000, 5000, 100_000):
        cases.append(Raw(f"prompt nested {depth} deep", "/v1/completions",
                         _with_raw(COMPLETION, "prompt", _nested(depth).decode())))
        cases.append(Raw(f"content nested {depth} deep", "/v1/chat/completions",
                         _with_raw(CHAT, "messages", '[{"role": "user", "content": '
                                   + _nested(depth, b'"x"').decode() + "}]")))
        cases.append(Raw(f"object nested {depth} deep", "/v1/completions",
                         b'{"a": ' * depth + b"1" + b"}" * depth))
    cases += [
        Raw("duplicate model, last valid", "/v1/completions",
            b'{"model": "nope", "model": "%s", "prompt": "x", "max_tokens": 1}' % MODEL.encode()),
        Raw("duplicate prompt, first a surrogate", "/v1/completions",
            b'{"model": "%s", "prompt": "\\ud800", "prompt": "x", "max_tokens": 1}'
            % MODEL.encode()),
        Raw("duplicate prompt, last a surrogate", "/v1/completions",
            b'{"model": "%s", "prompt": "x", "prompt": "\\ud800", "max_tokens": 1}'
            % MODEL.encode(), expect=bad, param="prompt"),
        Raw("duplicate messages, last wrong type", "/v1/chat/completions",
            dumps(CHAT)[:-1] + b', "messages": 5}', expect=bad),
        Raw("duplicate keys in a message", "/v1/chat/completions",
            b'{"model": "%s", "messages": [{"role": "user", "role": "wizard", "content": "x"}]}'
            % MODEL.encode(), expect=bad),
    ]
    for label, ctype in {"text/plain": "text/plain", "form": "application/x-www-form-urlencoded",
                         "multipart": "multipart/form-data; boundary=x", "none": None,
                         "latin-1 charset": "application/json; charset=latin-1",
                         "xml": "application/xml"}.items():
        headers = {} if ctype is None else {"Content-Type": ctype}
        cases.append(Raw(f"content-type {label}", "/v1/completions", dumps(COMPLETION), headers))
    cases.append(Raw("content-type control chars", "/v1/completions", dumps(COMPLETION),
                     {"Content-Type": "\x01;;="}, expect=frozenset({400}), protocol=True))
    cases.append(Raw("form-encoded body", "/v1/completions", b"model=x&prompt=y",
                     {"Content-Type": "application/x-www-form-urlencoded"}, expect=bad))
    for path, base in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        whole = dumps({**base, "stream": True})
        for cut in range(0, len(whole), 5):
            cases.append(Raw(f"truncated at {cut}", path, whole[:cut], expect=bad))
        for body in (b"", b" ", b"null", b"[]", b"{}", b"1", b'"s"', b"{" * 10, b"\x00"):
            cases.append(Raw(f"body {body[:10]!r}", path, body, expect=bad))
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            cases.append(Raw(f"{method} {path}", path, None, {}, method, frozenset({405})))
        cases.append(Raw(f"{path} dropped stream", path, dumps({**base, "stream": True,
                                                                "max_tokens": 8}), drop=True))
    for path in ("/health", "/metrics", "/v1/models", "/openapi.json"):
        for method in ("POST", "PUT", "DELETE"):
            cases.append(Raw(f"{method} {path}", path, b"{}", method=method,
                             expect=frozenset({405})))
        cases.append(Raw(f"HEAD {path}", path, None, {}, "HEAD"))
        cases.append(Raw(f"GET {path}?junk", path + "?a=%ff&b", None, {}, "GET"))
    for path in ("/v1/completions/", "//v1/completions", "/v1/%63ompletions", "/v1/completions%00",
                 "/v2/completions", "/v1/chat/completions/../completions"):
        cases.append(Raw(f"path {path[:40]}", path, dumps(COMPLETION)))
    cases.append(Raw("path of 10 kB", "/v1/" + "x" * 10_000, dumps(COMPLETION),
                     expect=frozenset({400, 414}), protocol=True))
    big = "word " * 200_000  # 1 MB of text: tokenized, then too long for the context
    cases += [
        Raw("1 MB prompt", "/v1/completions", dumps({**COMPLETION, "prompt": big}), expect=bad),
        Raw("1 MB chat message", "/v1/chat/completions",
            dumps({**CHAT, "messages": [{"role": "user", "content": big}]}), expect=bad),
        Raw("1 MB stop string", "/v1/completions", dumps({**COMPLETION, "stop": big}),
            expect=bad),
        Raw("100k token ids", "/v1/completions", dumps({**COMPLETION, "prompt": [1] * 100_000}),
            expect=bad),
        Raw("10k messages", "/v1/chat/completions",
            dumps({**CHAT, "messages": [{"role": "user", "content": "x"}] * 10_000}),
            expect=bad),
        Raw("5 MB body", "/v1/completions", dumps({**COMPLETION, "prompt": "a" * (5 << 20)}),
            expect=frozenset({413})),
        Raw("header: workload not UTF-8", "/v1/completions", dumps(COMPLETION),
            {**JSON, "X-Spectest-Workload": b"\xff\xfe\xed\xa0\x80"}),
        Raw("header: traceparent garbage", "/v1/chat/completions", dumps(CHAT),
            {**JSON, "traceparent": "00-" + "z" * 300}),
        Raw("header: 10 kB", "/v1/completions", dumps(COMPLETION), {**JSON, "X-Big": "a" * 10_000},
            expect=frozenset({400, 431}), protocol=True),
        Raw("header: Authorization with NUL", "/v1/completions", dumps(COMPLETION),
            {**JSON, "Authorization": b"Bearer \xff\x00"}, expect=frozenset({400}),
            protocol=True),
        Raw("header: Authorization not UTF-8", "/v1/completions", dumps(COMPLETION),
            {**JSON, "Authorization": b"Bearer \xff\xfe"}),
    ]
    return cases
