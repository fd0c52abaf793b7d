"""Bad input to a live server: every case gets a 4xx with an OpenAI-style error body, and the
server stays healthy and keeps serving afterwards.

Covers the issue's list — malformed JSON, unknown fields, wrong types, out-of-range values,
prompts longer than the context, unknown model, missing or wrong API key — plus what HTTP
itself can send wrong (unknown route, wrong method, oversized body, deeply nested JSON).
"""

from __future__ import annotations

import openai
import pytest
import requests

from live_server import MODEL, LiveServer, make_server, metric_sum, scrape

CTX = 128
OK_COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def live(pair):
    with LiveServer(make_server(pair, max_model_len=CTX)) as live:
        yield live


def assert_openai_error(resp: requests.Response, status: int, code: str | None = None,
                        param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


def with_(base: dict, **changes) -> dict:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not ...}


# (name, path, body, status, code, param); body is a dict (sent as JSON) or raw bytes
CASES = [
    ("malformed json", "/v1/completions", b'{"model": "x", ', 400, "invalid_json", None),
    ("empty body", "/v1/chat/completions", b"", 400, "invalid_json", None),
    ("not utf-8", "/v1/completions", b"\xff\xfe\xfa", 400, "invalid_json", None),
    ("json array", "/v1/completions", b"[1, 2]", 400, "invalid_json", None),
    ("json string", "/v1/chat/completions", b'"hi"', 400, "invalid_json", None),
    ("deeply nested", "/v1/completions", b"[" * 200_000 + b"]" * 200_000, 400, None, None),
    ("nested in a field", "/v1/completions",
     b'{"model": "%s", "prompt": ' % MODEL.encode() + b"[" * 50_000 + b"]" * 50_000 + b"}",
     400, None, None),
    ("unknown field", "/v1/completions", with_(OK_COMPLETION, best_of=2), 400,
     "invalid_request", "best_of"),
    ("unknown nested field", "/v1/chat/completions",
     with_(OK_CHAT, messages=[{"role": "user", "content": "x", "mood": "sad"}]), 400,
     "invalid_request", "messages[0].mood"),
    ("missing prompt", "/v1/completions", with_(OK_COMPLETION, prompt=...), 400,
     "invalid_request", "prompt"),
    ("missing model", "/v1/chat/completions", with_(OK_CHAT, model=...), 400,
     "invalid_request", "model"),
    ("max_tokens wrong type", "/v1/completions", with_(OK_COMPLETION, max_tokens="ten"), 400,
     "invalid_request", "max_tokens"),
    ("temperature wrong type", "/v1/chat/completions", with_(OK_CHAT, temperature="hot"), 400,
     "invalid_request", "temperature"),
    ("prompt wrong type", "/v1/completions", with_(OK_COMPLETION, prompt=123), 400,
     "invalid_request", None),
    ("messages wrong type", "/v1/chat/completions", with_(OK_CHAT, messages="hi"), 400,
     "invalid_request", "messages"),
    ("stream wrong type", "/v1/completions", with_(OK_COMPLETION, stream=[1]), 400,
     "invalid_request", "stream"),
    ("negative max_tokens", "/v1/completions", with_(OK_COMPLETION, max_tokens=-1), 400,
     "invalid_request", "max_tokens"),
    ("negative max_tokens chat", "/v1/chat/completions", with_(OK_CHAT, max_tokens=-5), 400,
     "invalid_request", "max_tokens"),
    ("zero max_tokens chat", "/v1/chat/completions", with_(OK_CHAT, max_tokens=0), 400,
     "invalid_request", None),
    ("zero max_tokens without echo", "/v1/completions", with_(OK_COMPLETION, max_tokens=0), 400,
     "invalid_request", None),
    ("temperature < 0", "/v1/completions", with_(OK_COMPLETION, temperature=-0.1), 400,
     "invalid_request", "temperature"),
    ("temperature > 2", "/v1/chat/completions", with_(OK_CHAT, temperature=2.5), 400,
     "invalid_request", "temperature"),
    ("top_p = 0", "/v1/completions", with_(OK_COMPLETION, top_p=0), 400, "invalid_request",
     "top_p"),
    ("top_p > 1", "/v1/chat/completions", with_(OK_CHAT, top_p=1.01), 400, "invalid_request",
     "top_p"),
    ("top_p negative", "/v1/completions", with_(OK_COMPLETION, top_p=-1), 400,
     "invalid_request", "top_p"),
    ("temperature NaN", "/v1/completions",
     b'{"model": "%s", "prompt": "x", "temperature": NaN}' % MODEL.encode(), 400,
     "invalid_request", "temperature"),
    ("top_p Infinity", "/v1/chat/completions",
     b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "top_p": Infinity}'
     % MODEL.encode(), 400, "invalid_request", "top_p"),
    ("top_k < -1", "/v1/completions", with_(OK_COMPLETION, top_k=-2), 400, "invalid_request",
     "top_k"),
    ("n = 9", "/v1/completions", with_(OK_COMPLETION, n=9), 400, "invalid_request", "n"),
    ("n > 1 streamed", "/v1/completions", with_(OK_COMPLETION, n=2, stream=True), 400,
     "invalid_request", None),
    ("negative seed", "/v1/completions", with_(OK_COMPLETION, seed=-1), 400,
     "invalid_request", "seed"),
    ("huge seed", "/v1/completions", with_(OK_COMPLETION, seed=2**64), 400,
     "invalid_request", "seed"),
    ("logprobs > 20", "/v1/completions", with_(OK_COMPLETION, logprobs=21), 400,
     "invalid_request", "logprobs"),
    ("top_logprobs > 20", "/v1/chat/completions",
     with_(OK_CHAT, logprobs=True, top_logprobs=21), 400, "invalid_request", "top_logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", with_(OK_CHAT, top_logprobs=2),
     400, "invalid_request", None),
    ("stream_options without stream", "/v1/completions",
     with_(OK_COMPLETION, stream_options={"include_usage": True}), 400, "invalid_request",
     None),
    ("empty messages", "/v1/chat/completions", with_(OK_CHAT, messages=[]), 400,
     "invalid_request", "messages"),
    ("unknown role", "/v1/chat/completions",
     with_(OK_CHAT, messages=[{"role": "wizard", "content": "x"}]), 400, "invalid_request",
     "messages[0].role"),
    ("empty prompt list", "/v1/completions", with_(OK_COMPLETION, prompt=[]), 400,
     "invalid_request", "prompt"),
    ("batch of prompts", "/v1/completions", with_(OK_COMPLETION, prompt=["a", "b"]), 400,
     "invalid_request", None),
    ("prompt of zero tokens", "/v1/completions", with_(OK_COMPLETION, prompt=""), 400,
     "invalid_request", "prompt"),
    ("token id outside vocab", "/v1/completions", with_(OK_COMPLETION, prompt=[1, 10**9]),
     400, "invalid_token", "prompt"),
    ("negative token id", "/v1/completions", with_(OK_COMPLETION, prompt=[-3]), 400,
     "invalid_token", "prompt"),
    ("too many stop strings", "/v1/completions", with_(OK_COMPLETION, stop=["a"] * 9), 400,
     "invalid_request", None),
    ("empty stop string", "/v1/completions", with_(OK_COMPLETION, stop=[""]), 400,
     "invalid_request", None),
    ("presence_penalty > 2", "/v1/chat/completions", with_(OK_CHAT, presence_penalty=2.5), 400,
     "invalid_request", "presence_penalty"),
    ("repetition_penalty 0", "/v1/completions", with_(OK_COMPLETION, repetition_penalty=0),
     400, "invalid_request", "repetition_penalty"),
    ("min_p > 1", "/v1/completions", with_(OK_COMPLETION, min_p=1.5), 400, "invalid_request",
     "min_p"),
    ("logit_bias key not a token id", "/v1/completions",
     with_(OK_COMPLETION, logit_bias={"x": 1}), 400, "invalid_request", None),
    ("logit_bias > 100", "/v1/completions", with_(OK_COMPLETION, logit_bias={"5": 101}), 400,
     "invalid_request", None),
    ("logit_bias token outside vocab", "/v1/completions",
     with_(OK_COMPLETION, logit_bias={"999999999": 1}), 400, "invalid_token", "logit_bias"),
    ("prompt longer than the context", "/v1/completions",
     with_(OK_COMPLETION, prompt=[5] * (CTX + 10)), 400, "context_length_exceeded", "prompt"),
    ("chat longer than the context", "/v1/chat/completions",
     with_(OK_CHAT, messages=[{"role": "user", "content": "word " * 400}]), 400,
     "context_length_exceeded", "prompt"),
    ("max_tokens beyond the context", "/v1/completions", with_(OK_COMPLETION, max_tokens=CTX),
     400, "context_length_exceeded", "max_tokens"),
    ("max_tokens huge", "/v1/chat/completions", with_(OK_CHAT, max_tokens=10**6), 400,
     "invalid_request", "max_tokens"),
    ("unknown model", "/v1/completions", with_(OK_COMPLETION, model="gpt-4"), 404,
     "model_not_found", "model"),
    ("unknown model chat", "/v1/chat/completions", with_(OK_CHAT, model=""), 404,
     "model_not_found", "model"),
]


@pytest.mark.parametrize("name,path,body,status,code,param", CASES, ids=[c[0] for c in CASES])
def test_bad_body_gets_openai_error(live, name, path, body, status, code, param):
    if isinstance(body, bytes):
        resp = requests.post(live.url + path, data=body, timeout=30,
                             headers={"Content-Type": "application/json"})
    else:
        resp = live.post(path, body)
    assert_openai_error(resp, status, code, param)


def test_http_level_errors_have_openai_bodies(live):
    assert_openai_error(live.get("/v1/nope"), 404)
    assert_openai_error(live.get("/v1/completions"), 405)
    too_big = b'{"model": "x", "prompt": "' + b"a" * (5 * 1024 * 1024) + b'"}'
    resp = requests.post(live.url + "/v1/completions", data=too_big, timeout=30)
    assert_openai_error(resp, 413)


def test_server_is_healthy_and_serving_after_bad_input(live):
    for _ in range(3):  # a second round of the nastiest inputs
        for _name, path, body, *_ in CASES[:7]:
            requests.post(live.url + path, data=body, timeout=30)
    assert live.healthy()
    resp = live.post("/v1/completions", OK_COMPLETION)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
    resp = live.post("/v1/chat/completions", OK_CHAT)
    assert resp.status_code == 200


def test_errors_are_counted_by_status(live):
    before = scrape(live.url)
    for _ in range(3):
        live.post("/v1/completions", with_(OK_COMPLETION, top_p=5))
    live.post("/v1/completions", with_(OK_COMPLETION, model="nope"))
    after = scrape(live.url)
    name = "spectest:request_errors_total"
    assert metric_sum(after, name, code="400") - metric_sum(before, name, code="400") == 3
    assert metric_sum(after, name, code="404") - metric_sum(before, name, code="404") == 1
    assert metric_sum(after, name, code="500") == 0


# --- API key --------------------------------------------------------------------------------
KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def keyed(pair):
    with LiveServer(make_server(pair, api_key=KEY, max_model_len=CTX)) as live:
        yield live


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": f"Bearer {KEY[:-1]}"},
                                     {"Authorization": f"Bearer {KEY}0"},
                                     {"Authorization": b"Bearer \xc3\xa9\xff\xfe"}],
                         ids=["missing", "wrong", "no scheme", "basic", "prefix", "longer",
                              "not utf-8"])
def test_missing_or_wrong_api_key_is_401(keyed, headers):
    for path, body in (("/v1/completions", OK_COMPLETION), ("/v1/chat/completions", OK_CHAT)):
        assert_openai_error(keyed.post(path, body, headers=headers), 401, "invalid_api_key")
    assert_openai_error(keyed.get("/v1/models", headers=headers), 401, "invalid_api_key")
    # auth is checked before the body is even parsed
    resp = requests.post(keyed.url + "/v1/completions", data=b"{", headers=headers, timeout=30)
    assert_openai_error(resp, 401)


def test_right_api_key_works_with_the_openai_client(keyed):
    with openai.OpenAI(base_url=keyed.base_url, api_key=KEY, max_retries=0) as good:
        resp = good.completions.create(model=MODEL, prompt="hi", max_tokens=3)
        assert resp.usage.completion_tokens >= 1
    with openai.OpenAI(base_url=keyed.base_url, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as exc:
            bad.chat.completions.create(model=MODEL, max_tokens=3,
                                        messages=[{"role": "user", "content": "x"}])
        assert exc.value.status_code == 401
        assert exc.value.body["code"] == "invalid_api_key"


def test_health_and_metrics_stay_open_for_probes_and_scrapers(keyed):
    assert keyed.get("/health").status_code == 200
    assert keyed.get("/metrics").status_code == 200
