"""llama.cpp's ``llama-server`` runs SmolLM2-135M-Instruct with spectest's in-repo draft
(``-md spectest/models/smollm2-draft/smollm2-draft.gguf``): llama.cpp accepts the draft's
vocabulary as SmolLM2's, drafts with it, and its acceptance counters grow.
"""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT
from spectest.thirdparty.llama_server import LlamaServer, LlamaServerSpec

DRAFT = ROOT / "spectest" / "models" / "smollm2-draft" / "smollm2-draft.gguf"


def _counter(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name == name)


def test_llama_server_drafts_with_the_in_repo_draft(llama_binary, smollm2_gguf, tmp_path):
    assert DRAFT.is_file(), "run `spectest train-draft` (the draft is committed)"
    spec = LlamaServerSpec(smollm2_gguf, spec_type="draft-simple", draft=DRAFT, draft_max=4)
    with LlamaServer(spec, tmp_path / "llama-server.log") as url:
        for question in ("How do I read a file line by line in Python?",
                         "Explain what a Python dictionary is."):
            r = requests.post(url + "/v1/chat/completions", timeout=120, json={
                "model": "smollm2", "max_tokens": 48, "temperature": 0,
                "messages": [{"role": "user", "content": question}]})
            assert r.status_code == 200, r.text
            timings = r.json()["timings"]
            assert timings["draft_n"] > 0
        drafted = _counter(url, "llamacpp:spec_decode_num_draft_tokens_total")
        accepted = _counter(url, "llamacpp:spec_decode_num_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted <= drafted
