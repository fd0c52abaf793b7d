"""Turning a dataset record into a request for the chosen endpoint."""

import json

from spectest.loadgen.datasets import Record
from spectest.loadgen.options import SpecOptions
from spectest.loadgen.users import build_request

CHAT = Record("c1", "chat", 100, messages=({"role": "user", "content": "hi"},), turns=("more",))
CODE = Record("k1", "code", 50, prompt="def f():")


def test_auto_endpoint_follows_the_record():
    chat = build_request(CHAT, SpecOptions(), "m", 0, [dict(m) for m in CHAT.messages])
    code = build_request(CODE, SpecOptions(), "m", 0, None)
    assert chat.path == "/v1/chat/completions" and code.path == "/v1/completions"
    assert json.loads(chat.body)["max_tokens"] == 100 and json.loads(code.body)["max_tokens"] == 50
    assert chat.workload == "chat" and chat.keep_text and not code.keep_text


def test_forced_endpoints_and_flag_overrides():
    opts = SpecOptions(endpoint="chat", max_tokens=7, temperature=0.3, speculative=True)
    body = json.loads(build_request(CODE, opts, "m", 0, None).body)
    assert body["messages"] == [{"role": "user", "content": "def f():"}]
    assert (body["max_tokens"], body["temperature"], body["speculative"]) == (7, 0.3, True)
    req = build_request(CHAT, SpecOptions(endpoint="completions"), "m", 1,
                        [{"role": "user", "content": "hi"}])
    assert json.loads(req.body)["prompt"].endswith("user: hi\n\nassistant:")
    assert req.turn == 1 and not req.keep_text
