"""The drafters' names, for every command line that offers them (no torch imported here, so
the sweep and the auditor's clients can read them too).

Owns: :data:`DRAFTERS` — ``draft-model`` (a small model with its own KV cache), ``eagle`` (a
head drafting from the target's hidden states), ``ngram`` (prompt lookup), ``ngram+draft-model``
and ``ngram+eagle`` (prompt lookup where the sequence repeats itself, the model elsewhere:
``engine.drafters.HybridDrafter``) and ``none`` (the target-only baseline).

Does not know: how any of them is built (``engine.api.build_engine``).
"""

from __future__ import annotations

HYBRID = "ngram+"  # "ngram+<model drafter>": prompt lookup first, the model where none matches
MODEL_DRAFTERS = ("draft-model", "eagle")
DRAFTERS = (*MODEL_DRAFTERS, "ngram", *(HYBRID + m for m in MODEL_DRAFTERS), "none")
DRAFTING = tuple(d for d in DRAFTERS if d != "none")


def model_drafter(drafter: str) -> str:
    """The model half of a drafter name (``ngram+eagle`` → ``eagle``); others unchanged."""
    return drafter.removeprefix(HYBRID)


def needs_checkpoint(drafter: str) -> bool:
    """Whether the drafter loads a draft checkpoint or head (``--draft``)."""
    return model_drafter(drafter) in MODEL_DRAFTERS
