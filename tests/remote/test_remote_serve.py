"""``spectest serve --draft-url`` as users run it: the network term on /metrics and in the
round spans, a draft server killed under traffic (every request 200, the failed rounds counted),
and a refusal in one line when the draft speaks another tokenizer or is not there.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from draft_servers import MODELS, draft_server, free_port, other_tokenizer_draft

from spectest.engine.gguf_loader import find_smollm2
from spectest.remote.service import load_draft
from spectest.sweep.embedded import EmbeddedServer
from spectest.telemetry import names as N


def serve(log, draft_url, *extra) -> EmbeddedServer:
    return EmbeddedServer(["--model", str(MODELS / "target"), "--draft-url", draft_url,
                           "--threads", "1", "--max-model-len", "512",
                           "--served-model-name", "spectest-demo", *extra], log,
                          start_timeout_s=120)


def complete(url, prompt, n=48):
    r = requests.post(f"{url}/v1/completions", timeout=60, json={
        "model": "spectest-demo", "prompt": prompt, "max_tokens": n, "temperature": 0})
    return r.status_code, r.json()


def metric(url, name) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = requests.get(f"{url}/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)


def test_serve_with_a_remote_draft_counts_network_time_and_survives_its_death(tmp_path):
    traces = tmp_path / "spans.jsonl"
    draft = draft_server(tmp_path / "draft.log")
    draft_url = draft.__enter__()
    try:
        with serve(tmp_path / "serve.log", draft_url, "--trace-file", str(traces)) as url:
            status, body = complete(url, "def parse(line):")
            assert status == 200 and body["spec"]["drafter"] == "remote-draft-model"
            assert body["spec"]["draft_tokens"] > 0
            assert metric(url, N.SPEC_NETWORK_TIME.name + "_count") > 0
            assert metric(url, N.SPEC_DRAFT_ERRORS.sample_name) == 0

            prompts = [f"def handler_{i}(request):" for i in range(12)]
            with ThreadPoolExecutor(4) as pool:
                running = [pool.submit(complete, url, p, 64) for p in prompts]
                time.sleep(1.0)
                draft.proc.send_signal(signal.SIGKILL)  # mid-traffic
                results = [f.result() for f in running]
            assert [s for s, _ in results] == [200] * len(prompts)
            assert all(b["usage"]["completion_tokens"] == 64 for _, b in results)
            status, body = complete(url, "def after_the_outage():")
            assert status == 200 and body["spec"]["draft_tokens"] == 0  # target-only now
            assert metric(url, N.SPEC_DRAFT_ERRORS.sample_name) > 0
            assert "rounds run without drafts" in (tmp_path / "serve.log").read_text()
    finally:
        draft.__exit__(None, None, None)
    spans = [json.loads(line) for line in traces.read_text().splitlines()]
    rounds = [s for s in spans if s["name"] == "spec.round"]
    assert any(s["attributes"]["spec.network_ms"] > 0 for s in rounds)
    assert any("spec.draft_error" in s["attributes"] for s in rounds)


def refused(draft_url: str) -> str:
    """``spectest serve --draft-url``'s one stderr line; it must exit 2 without starting."""
    argv = [sys.executable, "-m", "spectest", "serve", "--port", "0", "--threads", "1",
            "--model", str(MODELS / "target"), "--draft-url", draft_url]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "spectest serving" not in proc.stdout, proc.stderr
    return lines[0]


def test_serve_refuses_another_tokenizer_or_no_draft_server_in_one_line(tmp_path):
    assert "no draft server at" in refused(f"http://127.0.0.1:{free_port()}")
    with draft_server(tmp_path / "other.log", draft=other_tokenizer_draft(tmp_path)) as url:
        line = refused(url)
    assert "whose tokenizer differs from the target's" in line, line


def test_a_draft_server_quantizes_as_its_target_and_names_a_mismatch(tmp_path):
    """``serve-draft --quantize auto`` gives a bundled draft the weights ``spectest serve``
    gives it beside its target (int8 beside SmolLM2's 135M parameters, float beside the
    embedded target's 7M); a target whose draft server differs serves, and says so."""
    assert load_draft("embedded-draft").model.quantization == "none"
    if find_smollm2() is not None and (MODELS / "smollm2-draft").is_dir():
        assert load_draft("smollm2-draft").model.quantization == "int8"
        assert load_draft("smollm2-draft", "none").model.quantization == "none"
    draft = draft_server(tmp_path / "draft.log")
    draft.serve_args += ["--quantize", "int8"]
    with draft as draft_url:
        assert requests.get(f"{draft_url}/v1/draft/info", timeout=10).json()[
            "quantization"] == "int8"
        with serve(tmp_path / "serve.log", draft_url) as url:
            status, body = complete(url, "def parse(line):")
            assert status == 200 and body["spec"]["draft_tokens"] > 0
    log = (tmp_path / "serve.log").read_text()
    assert "the draft server's weights are int8, the target's none" in log
