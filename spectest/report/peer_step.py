"""What every peer reader returns: one measured run of another tool at one concurrency.

Owns the shared vocabulary of ``peers``, ``peer_aiperf``, ``peer_guidellm`` and ``peer_notes``:
the :class:`PeerStep` record, the per-request columns a reader fills, the error a reader
raises, and per-position acceptance from acceptance histograms. Reads no file itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.report.table import SweepError

REQUEST_COLUMNS = ("started_at", "ended_at", "ok", "ttft_ms", "tpot_ms", "e2el_ms",
                   "output_tokens", "chunks", "itl_ms", "drafts", "draft_tokens",
                   "accepted_tokens", "k", "histogram")
ARM_NAMES = {"spec": "speculative", "base": "baseline"}
NO_SPECULATION = ("no acceptance: the responses carried no per-request speculation (vLLM's "
                  "metrics.speculative_decoding), so acceptance, mean accepted length, "
                  "per-position acceptance and the K advisor are empty")  # not said of a baseline


class PeerError(SweepError):
    """A peer folder that cannot be read; the message is one line for the user."""


@dataclass(frozen=True)
class PeerStep:
    """One run of a peer tool at one concurrency, as its files describe it."""

    tool: str  # "AIPerf 0.13.0", "GuideLLM 0.8.1"
    path: Path  # the run's folder (AIPerf) or results file (GuideLLM)
    concurrency: float | None  # None: a rate-based run (see ``left_out``)
    workload: str  # what was sent: "synthetic-isl64-osl64", a dataset's name
    requests: pd.DataFrame | None  # REQUEST_COLUMNS of the measured phase, or None
    aggregates: dict = field(default_factory=dict)  # table columns from the tool's summary
    setup: dict = field(default_factory=dict)  # host, model, max_tokens, temperature, seed, …
    lacks: tuple[str, ...] = ()  # what the file does not carry, one phrase each
    left_out: str = ""  # why this run cannot be a step of the table ("" when it can)

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"


def positions(histograms: list) -> dict:
    """``acceptance_pos_i`` = share of verify steps that accepted at least i+1 drafts, from
    per-step histograms (``[j]``: steps that accepted exactly j drafts)."""
    if not histograms:
        return {}
    width = max(len(h) for h in histograms)
    pooled = np.zeros(width)
    for h in histograms:
        pooled[:len(h)] += np.asarray(h, dtype=float)
    steps = pooled.sum()
    if not steps:
        return {}
    return {f"acceptance_pos_{i}": float(pooled[i + 1:].sum() / steps) for i in range(width - 1)}
