"""The sampling parameters beyond temperature / top-k / top-p, over HTTP with the ``openai``
client: ``n`` choices, penalties, ``min_p``, ``logit_bias``, ``cache_salt`` with the prefix
cache's ``usage.prompt_tokens_details.cached_tokens``, and vLLM's ``/tokenize`` /
``/detokenize``."""

from __future__ import annotations

import openai
import pytest
import requests

from live_server import MODEL, LiveServer, make_server

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
FIXED = {"ignore_eos": True}


@pytest.fixture(scope="module")
def live(pair):
    with LiveServer(make_server(pair, max_num_seqs=4, max_model_len=256,
                                prefix_cache_tokens=2048)) as live:
        yield live


@pytest.fixture(scope="module")
def client(live):
    with openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0,
                       timeout=60) as client:
        yield client


def test_n_choices_come_with_their_own_seeds(client):
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, n=3,
                                     temperature=1.0, seed=7, extra_body=FIXED)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert resp.usage.completion_tokens == 36
    single = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                       temperature=1.0, seed=8, extra_body=FIXED)
    assert resp.choices[1].text == single.choices[0].text  # choice i samples with seed + i
    chat = client.chat.completions.create(model=MODEL, max_tokens=5, n=2, temperature=0,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert len(chat.choices) == 2 and chat.choices[0].message.content == \
        chat.choices[1].message.content


def test_penalties_min_p_and_logit_bias_change_greedy_output_the_same_with_speculation(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                      temperature=0, extra_body=FIXED).choices[0].text
    for extra in ({"presence_penalty": 1.5}, {"frequency_penalty": 1.0},
                  {"repetition_penalty": 1.4}, {"logit_bias": {"10": 6.0}}):
        kw = {k: v for k, v in extra.items() if k in ("presence_penalty", "frequency_penalty",
                                                      "logit_bias")}
        body = {**FIXED, **{k: v for k, v in extra.items() if k not in kw}}
        texts = [client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                           temperature=0, **kw,
                                           extra_body={**body, "speculative": spec}
                                           ).choices[0].text for spec in (True, False)]
        assert texts[0] == texts[1], extra
        assert texts[0] != plain, f"{extra} changed nothing"
    sampled = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                        temperature=1.0, seed=1,
                                        extra_body={**FIXED, "min_p": 0.2})
    assert sampled.choices[0].text


def test_a_salted_prompt_is_cached_within_its_salt_only(live):
    def complete(salt):
        body = {"model": MODEL, "prompt": PROMPT * 3, "max_tokens": 4, "temperature": 0}
        if salt:
            body["cache_salt"] = salt
        return requests.post(live.url + "/v1/completions", json=body, timeout=60).json()

    first = complete("a")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = complete("a")
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert complete("b")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    metrics = requests.get(live.url + "/metrics", timeout=10).text
    hits = [line for line in metrics.splitlines()
            if line.startswith("spectest:prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= cached


def test_tokenize_and_detokenize_round_trip(live):
    ids = requests.post(live.url + "/tokenize", json={"model": MODEL, "prompt": PROMPT},
                        timeout=10).json()
    assert ids["count"] == len(ids["tokens"]) > 5
    back = requests.post(live.url + "/detokenize", json={"model": MODEL,
                                                          "tokens": ids["tokens"]}, timeout=10)
    assert back.json()["prompt"].endswith(PROMPT.strip("\n")) or PROMPT in back.json()["prompt"]
    bad = requests.post(live.url + "/detokenize", json={"model": MODEL, "tokens": [10**8]},
                        timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
