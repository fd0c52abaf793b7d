"""The record of one audit run, filled phase by phase: what the report needs.

Owns the :class:`AuditRun` dataclass only. The runner (``runner``) fills it, the base
condition (``base``) writes its phases into it, the gate (``gate``) reads it; it knows none of
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spectest.audit import distribution_check, failures, greedy, logprobs, noise
from spectest.audit.samples import Completion, PromptCase
from spectest.audit.settings import AuditSettings


@dataclass
class AuditRun:
    """Everything the report needs; filled phase by phase."""

    settings: AuditSettings
    endpoints: dict = field(default_factory=dict)
    cases: list[PromptCase] = field(default_factory=list)
    greedy: greedy.GreedyResult | None = None
    logprobs: logprobs.LogprobResult | None = None
    distribution: distribution_check.DistributionResult | None = None
    error: str | None = None  # why the audit could not run (exit 2)
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    speculation: dict = field(default_factory=dict)  # the candidate's spec totals by phase
    diffs: list[logprobs.PositionDiff] = field(default_factory=list)
    routes: dict = field(default_factory=dict)  # per check: how it ran, in words
    noise_floor: noise.NoiseFloor | None = None  # the baseline against itself
    tolerances: dict = field(default_factory=dict)  # the ones applied (after widening)
    coverage: dict = field(default_factory=dict)  # positions seen / left out, and why
    failure: failures.CandidateFailure | None = None  # a request the baseline served, failed
    greedy_runs: list[Completion] = field(default_factory=list)  # the candidate's, base
    sampled_runs: list[Completion] = field(default_factory=list)
    alpha: float = 0.0  # the level of each statistical test (alpha / their number)
    tests: int = 0  # statistical tests planned
    conditions: list = field(default_factory=list)  # ConditionResult, after base
    findings: list[failures.CandidateFailure] = field(default_factory=list)  # all of them
    reproducers: list[str] = field(default_factory=list)
