"""The speculative-decoding dashboard: acceptance, accepted length, draft cost, traffic split,
and the runtime speculation switch.

This module owns the panel list and the "what healthy looks like" text of that dashboard, for any
``Flavour``.  Every panel is written once; a panel whose metrics a server does not expose (vLLM
and llama.cpp have no K gauge, round timings or A/B split) drops out of that server's build by
construction (``panels.row``).  It knows nothing about Grafana JSON.

To chart a new metric: add it to ``spectest/telemetry/names.py`` (and to the rows of the servers
in ``spectest/flavours.py`` that expose it), then add one panel maker below; servers without the
metric simply do not get the panel.
"""

from __future__ import annotations

from spectest.telemetry import names

from dashboards.flavours import RANGE_WINDOW, RATE_WINDOW, Flavour
from dashboards.panels import (ACCEPTANCE_RATE_FLOOR, ACCEPTED_LENGTH_FLOOR, DashboardSpec,
                               PanelSpec, Query, acceptance_rate, accepted_length,
                               at_request_end, mean, quantile, rate, red_below, row, rows)


def _overview(f: Flavour):
    R = RANGE_WINDOW
    late = at_request_end(f)
    return row(
        "Overview (whole time range)",
        lambda: PanelSpec(
            "Acceptance rate", "Accepted draft tokens / proposed draft tokens over the "
            "selected time range (vLLM's definition: the bonus token is not counted). "
            "Healthy: above 0.6 (0.7–0.9 is typical for a same-family draft model on "
            "chat). No data means no drafts were proposed, not zero acceptance." + late,
            "percentunit", (Query(acceptance_rate(f, by="", window=R)),), kind="stat",
            steps=red_below(ACCEPTANCE_RATE_FLOOR)),
        lambda: PanelSpec(
            "Mean accepted length", "Tokens emitted per request per round over the "
            "range: 1 + accepted / drafts (counts the bonus token). Healthy: well above "
            "1; the ceiling is K+1. Near 1.0 speculation is pure overhead." + late, "short",
            (Query(accepted_length(f, by="", window=R)),), kind="stat",
            steps=red_below(ACCEPTED_LENGTH_FLOOR)),
        lambda: PanelSpec(
            "Generated tokens/s", "Output tokens per second over the range, all "
            "requests. Healthy: tracks offered load; compare with speculation off.",
            "suffix: tok/s", (Query(rate(f, names.GENERATION_TOKENS, by="", window=R)),),
            kind="stat"),
        lambda: PanelSpec(
            "Speculative share of requests", "Share of finished requests that ran with "
            "speculation on (the per-request `speculative` switch). Healthy: whatever the A/B "
            "plan says; 100% on a speculative-only deployment.", "percentunit",
            (Query(f"{rate(f, names.SPEC_REQUESTS, by='', window=R, speculative='true')} / "
                   f"{rate(f, names.SPEC_REQUESTS, by='', window=R)}"),), kind="stat"),
    )


def _switch(f: Flavour):
    by = f.by()
    return row(
        "Speculation switch (per engine, changed at runtime)",
        lambda: PanelSpec(
            "Speculation switch", "1 while speculation is on for the whole server, 0 after "
            "it was switched off at runtime (POST /admin/speculation {\"enabled\": false}: "
            "every request then decodes target-only), with the configured K and the switches "
            "applied per interval. Healthy: 1 at the deployed K, no switches outside a change "
            "window. 0 means someone pulled the kill switch (the acceptance alerts' runbook "
            "says when to): compare TPOT on the serving dashboard either side of the switch, "
            "and switch back with {\"enabled\": true} once the drafter is fixed.", "short",
            (Query(f"max by ({by}) ({f.select(names.SPECULATION_ENABLED)})",
                   f"on (1) / off (0) {f.legend()}"),
             Query(f"max by ({by}) ({f.select(names.SPECULATION_K)})",
                   f"configured K {f.legend()}"),
             Query(f"sum by ({by}) (increase({f.select(names.SPECULATION_SWITCHES)}"
                   f"[{RATE_WINDOW}]))", f"switches {f.legend()}")), min=0),
    )


def _acceptance(f: Flavour):
    late = at_request_end(f)
    by_workload = []
    if "workload" in f.variables:
        by_workload.append(lambda: PanelSpec(
            "Acceptance rate by workload", "Acceptance per X-Spectest-Workload tag. Healthy: "
            "code and RAG (copy-heavy) usually above chat; one workload far below the others "
            "means the drafter was not trained for it.", "percentunit",
            (Query(acceptance_rate(f, by="workload"), "{{workload}}"),), min=0, max=1,
            steps=red_below(ACCEPTANCE_RATE_FLOOR)))
    return row(
        "Acceptance",
        lambda: PanelSpec(
            "Acceptance rate", "Δaccepted / Δdraft tokens per deployment. Healthy: steady "
            "above the 0.6 line (the acceptance-rate alert fires below it). A drop after a "
            "deploy points at the drafter, a drop with a traffic change at the workload mix."
            + late, "percentunit", (Query(acceptance_rate(f), f.legend()),), min=0, max=1,
            steps=red_below(ACCEPTANCE_RATE_FLOOR)),
        *by_workload,
        lambda: PanelSpec(
            "Mean accepted length", "Tokens per request per round, 1 + Δaccepted / Δdrafts. "
            "Healthy: well above 1.2 (the accepted-length alert's line); speculation pays only "
            "while this exceeds 1 + c·K, c = draft / verify time." + late,
            "short", (Query(accepted_length(f), f.legend()),), min=1,
            steps=red_below(ACCEPTED_LENGTH_FLOOR)),
        lambda: PanelSpec(
            "Per-position acceptance", "Share of drafts whose token at position i "
            "(0-based) was accepted: Δaccepted_per_pos[i] / Δdrafts. Healthy: a smooth "
            "decay with position. Position 0 below ~0.5 means the drafter disagrees on "
            "the very next token (check tokenizer and sampling alignment); a long tail "
            "near 0 means K is too large." + late, "percentunit",
            (Query(f"{rate(f, names.SPEC_NUM_ACCEPTED_PER_POS, by=f.by('position'))} / "
                   f"on ({f.by()}) group_left "
                   f"{rate(f, names.SPEC_NUM_DRAFTS)}",
                   f"pos {{{{position}}}} {f.legend()}"),), min=0, max=1),
        per_line=2)


def _throughput(f: Flavour):
    late = at_request_end(f)
    return row(
        "Draft and accepted tokens",
        lambda: PanelSpec(
            "Draft vs accepted tokens/s", "Draft tokens proposed and accepted per "
            "second. Healthy: accepted close to proposed; the gap is draft and verify "
            "work thrown away." + late, "suffix: tok/s",
            (Query(rate(f, names.SPEC_NUM_DRAFT_TOKENS), f"proposed {f.legend()}"),
             Query(rate(f, names.SPEC_NUM_ACCEPTED_TOKENS), f"accepted {f.legend()}")),
            min=0),
        lambda: PanelSpec(
            "Drafts and generated tokens/s", "Verification steps that carried drafts "
            "(+1 per request per step) and generated tokens, per second. Healthy: generated "
            "tokens/s ≈ drafts/s × mean accepted length while every step drafts; generated "
            "tokens/s falling while drafts/s holds means acceptance fell." + late, "short",
            (Query(rate(f, names.SPEC_NUM_DRAFTS), f"drafts {f.legend()}"),
             Query(rate(f, names.GENERATION_TOKENS), f"generated tokens {f.legend()}")),
            min=0),
        lambda: PanelSpec(
            "Effective tokens per target forward", "Tokens one target forward produces: per "
            "request (mean of the accepted-length histogram, 1 without speculation) and for "
            "the whole batch (generated tokens / rounds, ≈ batch size × per-request value). "
            "Healthy: per request well above 1; without speculation it is exactly 1.",
            "short",
            (Query(mean(f, names.SPEC_ACCEPTED_LENGTH), f"per request {f.legend()}"),
             Query(f"{rate(f, names.GENERATION_TOKENS)} / {rate(f, names.SPEC_ROUNDS)}",
                   f"whole batch {f.legend()}")), min=0),
    )


def _round_timing(f: Flavour):
    return row(
        "Draft length and round timing (per engine, not per workload)",
        lambda: PanelSpec(
            "Current K", "Draft length chosen for the latest round. Healthy: stable "
            "at the configured K; an adaptive K falling to 0 under load means "
            "speculation was judged unprofitable at that batch size.", "short",
            (Query(f"max by ({f.by()}) ({f.select(names.SPEC_K)})", f.legend()),), min=0),
        lambda: PanelSpec(
            "Draft and verify time per round", "Wall time of the drafting phase and "
            "of the target verify forward, p50 and p99. Healthy: draft time a small "
            "fraction of verify time; verify time grows with batch × (K+1).", "s",
            tuple(Query(quantile(f, spec, q), f"{what} p{round(q * 100)} {f.legend()}")
                  for spec, what in ((names.SPEC_DRAFT_TIME, "draft"),
                                     (names.SPEC_VERIFY_TIME, "verify"))
                  for q in (0.5, 0.99)), min=0),
        lambda: PanelSpec(
            "Draft cost ratio c", "Mean draft time / mean verify time per round. "
            "Healthy: below ~0.1 for a small draft model (lower for n-gram or EAGLE "
            "heads); speculation pays only while mean accepted length > 1 + c·K.",
            "short", (Query(f"({mean(f, names.SPEC_DRAFT_TIME)}) / "
                            f"({mean(f, names.SPEC_VERIFY_TIME)})", f.legend()),), min=0),
        lambda: PanelSpec(
            "Draft network time per round", "Mean time per engine round spent reaching a "
            "draft model in another process (`spectest serve --draft-url`): transport, "
            "encoding, the draft server's queue. 0 when the draft is co-located. Healthy: "
            "a small fraction of the verify time; it is paid once per round whatever K is, "
            "so a large one favours longer drafts or no speculation.", "s",
            (Query(f"{rate(f, names.SPEC_NETWORK_TIME, '_sum')} / "
                   f"{rate(f, names.SPEC_ROUNDS)}", f.legend()),), min=0),
        lambda: PanelSpec(
            "Rounds without drafts (drafter failed)", "Engine rounds per second that ran "
            "target-only because the drafter failed (a draft server down or timing out). "
            "Healthy: 0. Requests keep being served, at the speed of no speculation; the "
            "runbook of SpecDecodeDrafterFailing says what to do.", "ops",
            (Query(rate(f, names.SPEC_DRAFT_ERRORS), f.legend()),), min=0),
    )


def _traffic_split(f: Flavour):
    return row(
        "Traffic split",
        lambda: PanelSpec(
            "Speculation on/off traffic", "Finished requests per second with "
            "speculation on (true) and off (false). Healthy: matches the intended "
            "A/B split; compare the latency panels of the serving dashboard.",
            "reqps", (Query(rate(f, names.SPEC_REQUESTS, by="speculative"),
                            "speculative={{speculative}}"),), min=0, stacked=True),
    )


def speculative_dashboard(f: Flavour) -> DashboardSpec:
    late = ""
    if f.server.counters_at_request_end:
        late = (f" {f.display} adds a request's draft counts to its counters when the request "
                f"finishes, so read these panels over ranges much longer than a request.")
    shown = ["acceptance", "accepted length", "per-position acceptance", "draft throughput"]
    shown += ["K and draft cost"] * f.has(names.SPEC_K, names.SPEC_DRAFT_TIME)
    shown += ["traffic split"] * f.has(names.SPEC_REQUESTS)
    shown += ["the runtime speculation switch"] * f.has(names.SPECULATION_ENABLED)
    what = f"{', '.join(shown[:-1])} and {shown[-1]}"
    return DashboardSpec(
        uid=f"{f.key}-speculative-decoding",
        title=f"Speculative decoding ({f.display})",
        description=f"{what[0].upper()}{what[1:]} of speculative decoding. Generated by "
                    f"dashboards/build.py." + late,
        tags=("spectest", f.key, "speculative-decoding"),
        rows=rows(_overview(f), _switch(f), _acceptance(f), _throughput(f), _round_timing(f),
                  _traffic_split(f)))
