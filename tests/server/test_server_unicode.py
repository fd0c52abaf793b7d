"""Text a tokenizer cannot take: JSON strings with lone surrogates get a 400 naming the field.

``"\\udcff"`` is valid JSON, and Python's decoder turns it into a ``str`` that cannot be encoded
as UTF-8; before the HTTP edge checked, the tokenizer raised on it and the client got a 500.
Every text field that reaches the tokenizer, the stop-string matcher, a metric label or a span
is checked — the prompt (string or list), chat contents (string or parts), system prompts,
names, stop strings, ``model`` and ``user`` — over raw HTTP and through the official
``openai`` client, and the server keeps serving. Text that *is* valid Unicode, however odd
(escaped pairs, noncharacters, NUL, BOM, RTL, combining marks, 4-byte emoji), still works.
"""

from __future__ import annotations

import json

import openai
import pytest
import requests

from live_server import MODEL, LiveServer, make_server, metric_sum, scrape

CTX = 128
COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# (endpoint, the param the error must name, body with the text put in that field)
SLOTS = [
    ("/v1/completions", "prompt", lambda t: {**COMPLETION, "prompt": t}),
    ("/v1/completions", "prompt[0]", lambda t: {**COMPLETION, "prompt": [t]}),
    ("/v1/completions", "stop", lambda t: {**COMPLETION, "stop": t}),
    ("/v1/completions", "stop[1]", lambda t: {**COMPLETION, "stop": ["\n", t]}),
    ("/v1/completions", "model", lambda t: {**COMPLETION, "model": t}),
    ("/v1/completions", "user", lambda t: {**COMPLETION, "user": t}),
    ("/v1/chat/completions", "messages[0].content",
     lambda t: {**CHAT, "messages": [{"role": "user", "content": t}]}),
    ("/v1/chat/completions", "messages[0].content",  # a system prompt
     lambda t: {**CHAT, "messages": [{"role": "system", "content": t},
                                     {"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", "messages[1].content[1].text",
     lambda t: {**CHAT, "messages": [{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": [
                                         {"type": "text", "text": "ok"},
                                         {"type": "text", "text": t}]}]}),
    ("/v1/chat/completions", "messages[0].name",
     lambda t: {**CHAT, "messages": [{"role": "user", "content": "hi", "name": t}]}),
    ("/v1/chat/completions", "stop", lambda t: {**CHAT, "stop": t}),
    ("/v1/chat/completions", "user", lambda t: {**CHAT, "user": t}),
]
LONE = {"high": ("\ud800", "U+D800"), "low": ("\udcff", "U+DCFF"),
        "high at the end": ("ok \udbff", "U+DBFF"), "reversed pair": ("\ude00\ud83d", "U+DE00")}
VALID = {"escaped pair": "\ud83d\ude00", "noncharacters": "\ufffe\uffff\U0010fffe",
         "NUL": "a\x00b", "BOM": "\ufeffhi", "RTL": "\u202eabc\u202c שלום",
         "combining": "e\u0301\u0301", "4-byte emoji": "👨‍👩‍👧😀𝕏"}


@pytest.fixture(scope="module")
def live(pair):
    with LiveServer(make_server(pair, max_model_len=CTX)) as live:
        yield live


def post_raw(live, path: str, raw: bytes) -> requests.Response:
    return requests.post(live.url + path, data=raw, timeout=60,
                         headers={"Content-Type": "application/json"})


def assert_names(resp: requests.Response, param: str, char: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_request", err
    assert err["message"].startswith(f"{param}: ") and f"lone surrogate {char}" in err["message"]


@pytest.mark.parametrize("lone", sorted(LONE))
@pytest.mark.parametrize("path,param,build", SLOTS, ids=[f"{p} {q}" for p, q, _ in SLOTS])
def test_lone_surrogate_is_a_400_naming_the_field(live, path, param, build, lone):
    text, char = LONE[lone]
    raw = json.dumps(build(text)).encode()  # ensure_ascii: the JSON holds "\udxxx" escapes
    assert b"\\ud" in raw and raw.isascii()
    assert_names(post_raw(live, path, raw), param, char)


@pytest.mark.parametrize("path,param,build", SLOTS, ids=[f"{p} {q}" for p, q, _ in SLOTS])
def test_encoded_surrogate_bytes_are_caught_too(live, path, param, build):
    """A surrogate UTF-8-encoded in the raw body (CESU-8, not UTF-8): ``json.loads`` decodes
    bytes with ``surrogatepass``, so it arrives as the same lone surrogate."""
    raw = json.dumps(build("\udcff"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert b"\xed\xb3\xbf" in raw
    assert_names(post_raw(live, path, raw), param, "U+DCFF")


def test_unknown_field_whose_name_is_a_lone_surrogate(live):
    resp = post_raw(live, "/v1/completions", json.dumps({**COMPLETION, "\udcff": 1}).encode())
    assert resp.status_code == 400
    assert "lone surrogate" in resp.json()["error"]["message"]


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_but_odd_unicode_is_served(live, name):
    for path, build in (("/v1/completions", lambda t: {**COMPLETION, "prompt": t, "stop": t}),
                        ("/v1/chat/completions", lambda t: {**CHAT, "messages": [
                            {"role": "system", "content": t},
                            {"role": "user", "content": [{"type": "text", "text": t}],
                             "name": t}]})):
        resp = post_raw(live, path, json.dumps(build(VALID[name])).encode())
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] >= 1


def test_openai_client_gets_a_400_and_the_server_keeps_serving(live):
    """The official client, as a JavaScript client's ``JSON.stringify`` would send it: lone
    surrogates as ``\\udxxx`` escapes (the Python client's typed methods cannot encode such a
    string at all, so the body goes through its documented ``client.post``)."""
    headers = {"Content-Type": "application/json"}
    with openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0) as client:
        for path, body, param in (
                ("/completions", {**COMPLETION, "prompt": "\udcff"}, "prompt"),
                ("/chat/completions", {**CHAT, "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi \ud800"}]}, "messages[1].content")):
            with pytest.raises(openai.BadRequestError) as exc:
                client.post(path, content=json.dumps(body).encode(), cast_to=object,
                            options={"headers": headers})
            assert exc.value.status_code == 400
            assert exc.value.body["param"] == param and exc.value.body["code"] == \
                "invalid_request"
        # the same client, same connection pool: ordinary requests still work
        done = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=3)
        assert done.usage.completion_tokens >= 1
        chat = client.chat.completions.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi 😀"}])
        assert chat.choices[0].finish_reason in ("stop", "length")


def test_no_500_was_counted(live):
    for path, _param, build in SLOTS:  # once more, then the server's own count
        post_raw(live, path, json.dumps(build("\udfff")).encode())
    assert live.healthy()
    assert metric_sum(scrape(live.url), "spectest:request_errors_total", code="500") == 0
