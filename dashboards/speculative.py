"""The speculative-decoding dashboard: acceptance, accepted length, draft cost, traffic split.

This module owns the panel list and the "what healthy looks like" text of that dashboard, for any
``Flavour``; panels whose metrics the engine does not expose (vLLM has no K gauge, round timings
or A/B split) are left out of that engine's build.  It knows nothing about Grafana JSON.
"""

from __future__ import annotations

from dataclasses import replace

from spectest.telemetry import names

from dashboards.flavours import RANGE_WINDOW, Flavour
from dashboards.panels import (ACCEPTANCE_RATE_FLOOR, ACCEPTED_LENGTH_FLOOR, DashboardSpec,
                               PanelSpec, Query, RowSpec, acceptance_rate, accepted_length,
                               mean, quantile, rate, red_below)


def speculative_dashboard(f: Flavour) -> DashboardSpec:
    R = RANGE_WINDOW
    stats = [
        PanelSpec("Acceptance rate", "Accepted draft tokens / proposed draft tokens over the "
                  "selected time range (vLLM's definition: the bonus token is not counted). "
                  "Healthy: above 0.6 (0.7–0.9 is typical for a same-family draft model on "
                  "chat). No data means no drafts were proposed, not zero acceptance.",
                  "percentunit", (Query(acceptance_rate(f, by="", window=R)),), kind="stat",
                  steps=red_below(ACCEPTANCE_RATE_FLOOR)),
        PanelSpec("Mean accepted length", "Tokens emitted per request per round over the "
                  "range: 1 + accepted / drafts (counts the bonus token). Healthy: well above "
                  "1; the ceiling is K+1. Near 1.0 speculation is pure overhead.", "short",
                  (Query(accepted_length(f, by="", window=R)),), kind="stat",
                  steps=red_below(ACCEPTED_LENGTH_FLOOR)),
        PanelSpec("Generated tokens/s", "Output tokens per second over the range, all "
                  "requests. Healthy: tracks offered load; compare with speculation off.",
                  "suffix: tok/s", (Query(rate(f, names.GENERATION_TOKENS, by="", window=R)),),
                  kind="stat"),
    ]
    if f.has(names.SPEC_REQUESTS):
        stats.append(PanelSpec(
            "Speculative share of requests", "Share of finished requests that ran with "
            "speculation on (the per-request `speculative` switch). Healthy: whatever the A/B "
            "plan says; 100% on a speculative-only deployment.", "percentunit",
            (Query(f"{rate(f, names.SPEC_REQUESTS, by='', window=R, speculative='true')} / "
                   f"{rate(f, names.SPEC_REQUESTS, by='', window=R)}"),), kind="stat"))
    stats = [replace(p, width=24 // len(stats)) for p in stats]

    acceptance = [
        PanelSpec("Acceptance rate", "Δaccepted / Δdraft tokens per deployment. Healthy: "
                  "steady above the 0.6 line (alert SpecDecodeAcceptanceRateLow fires below it "
                  "for 10 minutes). A drop after a deploy points at the drafter, a drop with a "
                  "traffic change at the workload mix.", "percentunit",
                  (Query(acceptance_rate(f), f.legend()),), min=0, max=1,
                  steps=red_below(ACCEPTANCE_RATE_FLOOR)),
    ]
    if "workload" in f.variables:
        acceptance.append(PanelSpec(
            "Acceptance rate by workload", "Acceptance per X-Spectest-Workload tag. Healthy: "
            "code and RAG (copy-heavy) usually above chat; one workload far below the others "
            "means the drafter was not trained for it.", "percentunit",
            (Query(acceptance_rate(f, by="workload"), "{{workload}}"),), min=0, max=1,
            steps=red_below(ACCEPTANCE_RATE_FLOOR)))
    acceptance += [
        PanelSpec("Mean accepted length", "Tokens per request per round, 1 + Δaccepted / "
                  "Δdrafts. Healthy: well above 1.2 (the SpecDecodeAcceptedLengthNearOne line); "
                  "speculation pays only while this exceeds 1 + c·K, c = draft / verify time.",
                  "short", (Query(accepted_length(f), f.legend()),), min=1,
                  steps=red_below(ACCEPTED_LENGTH_FLOOR)),
        PanelSpec("Per-position acceptance", "Share of drafts whose token at position i "
                  "(0-based) was accepted: Δaccepted_per_pos[i] / Δdrafts. Healthy: a smooth "
                  "decay with position. Position 0 below ~0.5 means the drafter disagrees on "
                  "the very next token (check tokenizer and sampling alignment); a long tail "
                  "near 0 means K is too large.", "percentunit",
                  (Query(f"{rate(f, names.SPEC_NUM_ACCEPTED_PER_POS, by=f.by('position'))} / "
                         f"on ({f.by()}) group_left "
                         f"{rate(f, names.SPEC_NUM_DRAFTS)}",
                         f"pos {{{{position}}}} {f.legend()}"),), min=0, max=1),
    ]
    throughput = [
        PanelSpec("Draft vs accepted tokens/s", "Draft tokens proposed and accepted per "
                  "second. Healthy: accepted close to proposed; the gap is draft and verify "
                  "work thrown away.", "suffix: tok/s",
                  (Query(rate(f, names.SPEC_NUM_DRAFT_TOKENS), f"proposed {f.legend()}"),
                   Query(rate(f, names.SPEC_NUM_ACCEPTED_TOKENS), f"accepted {f.legend()}")),
                  min=0),
    ]
    if f.has(names.SPEC_ACCEPTED_LENGTH, names.SPEC_ROUNDS):
        throughput.append(PanelSpec(
            "Effective tokens per target forward", "Tokens one target forward produces: per "
            "request (mean of the accepted-length histogram, 1 without speculation) and for "
            "the whole batch (generated tokens / rounds, ≈ batch size × per-request value). "
            "Healthy: per request well above 1; without speculation it is exactly 1.",
            "short",
            (Query(mean(f, names.SPEC_ACCEPTED_LENGTH), f"per request {f.legend()}"),
             Query(f"{rate(f, names.GENERATION_TOKENS)} / {rate(f, names.SPEC_ROUNDS)}",
                   f"whole batch {f.legend()}")), min=0))
    rows = [RowSpec("Overview (whole time range)", tuple(stats)),
            RowSpec("Acceptance", tuple(acceptance)),
            RowSpec("Draft and accepted tokens", tuple(throughput))]

    if f.has(names.SPEC_K, names.SPEC_DRAFT_TIME, names.SPEC_VERIFY_TIME):
        rows.append(RowSpec("Draft length and round timing (per engine, not per workload)", (
            PanelSpec("Current K", "Draft length chosen for the latest round. Healthy: stable "
                      "at the configured K; an adaptive K falling to 0 under load means "
                      "speculation was judged unprofitable at that batch size.", "short",
                      (Query(f"max by ({f.by()}) ({f.select(names.SPEC_K)})", f.legend()),),
                      width=8, min=0),
            PanelSpec("Draft and verify time per round", "Wall time of the drafting phase and "
                      "of the target verify forward, p50 and p99. Healthy: draft time a small "
                      "fraction of verify time; verify time grows with batch × (K+1).", "s",
                      tuple(Query(quantile(f, spec, q), f"{what} p{round(q * 100)} "
                                  f"{f.legend()}")
                            for spec, what in ((names.SPEC_DRAFT_TIME, "draft"),
                                               (names.SPEC_VERIFY_TIME, "verify"))
                            for q in (0.5, 0.99)), width=8, min=0),
            PanelSpec("Draft cost ratio c", "Mean draft time / mean verify time per round. "
                      "Healthy: below ~0.1 for a small draft model (lower for n-gram or EAGLE "
                      "heads); speculation pays only while mean accepted length > 1 + c·K.",
                      "short", (Query(f"({mean(f, names.SPEC_DRAFT_TIME)}) / "
                                      f"({mean(f, names.SPEC_VERIFY_TIME)})", f.legend()),),
                      width=8, min=0),
        )))
    if f.has(names.SPEC_REQUESTS):
        rows.append(RowSpec("Traffic split", (
            PanelSpec("Speculation on/off traffic", "Finished requests per second with "
                      "speculation on (true) and off (false). Healthy: matches the intended "
                      "A/B split; compare the latency panels of the serving dashboard.",
                      "reqps", (Query(rate(f, names.SPEC_REQUESTS, by="speculative"),
                                      "speculative={{speculative}}"),),
                      width=24, min=0, stacked=True),
        )))
    return DashboardSpec(
        uid=f"{f.key}-speculative-decoding",
        title=f"Speculative decoding ({f.display})",
        description="Acceptance, accepted length, per-position acceptance, draft cost and "
                    "traffic split of speculative decoding. Generated by dashboards/build.py.",
        tags=("spectest", f.key, "speculative-decoding"),
        rows=tuple(rows))
