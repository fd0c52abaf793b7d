"""The serving dashboard: latency percentiles, SLO attainment, throughput, capacity, errors.

This module owns the panel list and the "what healthy looks like" text of that dashboard, for any
``Flavour`` (the metric names are vLLM's, so both builds show the same panels; only the error
panels differ, because vLLM has no error counter).  It knows nothing about Grafana JSON.
"""

from __future__ import annotations

from spectest.telemetry import names

from dashboards.flavours import RANGE_WINDOW, Flavour
from dashboards.panels import (SLO_OBJECTIVE, TPOT_SLO_SECONDS, TTFT_SLO_SECONDS, DashboardSpec,
                               PanelSpec, Query, RowSpec, failed_share, mean, percentiles,
                               quantile, rate, red_below, slo_share)


def _overview(f: Flavour) -> RowSpec:
    R = RANGE_WINDOW
    return RowSpec("Overview (whole time range)", (
        PanelSpec("Requests/s", "Finished requests per second over the range. Healthy: tracks "
                  "offered load; a drop with steady load means refusals or stalls.", "reqps",
                  (Query(rate(f, names.REQUEST_SUCCESS, by="", window=R)),), kind="stat",
                  width=6),
        PanelSpec("TTFT p99", f"99th percentile time to first token over the range. Healthy: "
                  f"under the TTFT SLO ({TTFT_SLO_SECONDS} s here).", "s",
                  (Query(quantile(f, names.TTFT, 0.99, window=R, by="")),), kind="stat",
                  width=6),
        PanelSpec("TPOT p99", f"99th percentile time per output token over the range. "
                  f"Healthy: under the TPOT SLO ({TPOT_SLO_SECONDS} s here).", "s",
                  (Query(quantile(f, names.TPOT, 0.99, window=R, by="")),), kind="stat",
                  width=6),
        PanelSpec("Failed share", "Share of requests that failed on the server side over the "
                  "range. Healthy: 0; above 5% for 5 minutes fires SpectestHighErrorRate.",
                  "percentunit", (Query(failed_share(f, by="", window=R)),), kind="stat",
                  width=6, steps=((None, "green"), (0.01, "orange"), (0.05, "red"))),
    ))


def _latency(f: Flavour) -> RowSpec:
    return RowSpec("Latency", (
        PanelSpec("Time to first token", f"TTFT p50/p90/p99 (server side: arrival to first "
                  f"token). Healthy: p99 under the SLO ({TTFT_SLO_SECONDS} s here); TTFT grows "
                  f"with prompt length and queue time, not with speculation.", "s",
                  percentiles(f, names.TTFT), width=8, min=0),
        PanelSpec("Time per output token", f"TPOT p50/p90/p99: per request, decode time / "
                  f"(output tokens − 1). Healthy: p99 under the SLO ({TPOT_SLO_SECONDS} s "
                  f"here); speculation should lower it at low batch and may raise it at high "
                  f"batch.", "s", percentiles(f, names.TPOT), width=8, min=0),
        PanelSpec("Inter-token latency (per engine step)", "Time between engine steps that "
                  "emitted tokens for a request. One sample per step, not per token: under "
                  "speculation it is about mean accepted length × TPOT. Healthy: steady; spikes "
                  "mean preemption or prefill interference.", "s",
                  percentiles(f, names.ITL, (0.5, 0.99)), width=8, min=0),
        PanelSpec("End-to-end request latency", "Arrival to last token, p50/p90/p99. Healthy: "
                  "about queue + prefill + output tokens × TPOT; long tails with short queue "
                  "time point at long outputs.", "s", percentiles(f, names.E2E), width=8, min=0),
        PanelSpec("Queue time", "Time waiting for a slot before prefill, p50/p99. Healthy: near "
                  "0. It grows when the running batch is full; then the waiting gauge grows "
                  "too.", "s", percentiles(f, names.QUEUE, (0.5, 0.99)), width=8, min=0),
        PanelSpec("Prefill and decode time (mean)", "Mean prefill time and mean decode time "
                  "(first to last token) per request. Healthy: prefill small next to decode for "
                  "chat; RAG prompts make prefill dominate.", "s",
                  (Query(mean(f, names.PREFILL), f"prefill {f.legend()}"),
                   Query(mean(f, names.DECODE), f"decode {f.legend()}")), width=8, min=0),
    ))


def _slos(f: Flavour) -> RowSpec:
    return RowSpec("SLOs", (
        PanelSpec("SLO attainment", f"Share of requests with TTFT ≤ {TTFT_SLO_SECONDS} s and "
                  f"with TPOT ≤ {TPOT_SLO_SECONDS} s (histogram bucket edges, the ones the "
                  f"alerts use). Healthy: above {SLO_OBJECTIVE:.0%}; below it for 10 minutes fires "
                  f"SpectestTTFTSLOBreach / SpectestTPOTSLOBreach.", "percentunit",
                  (Query(slo_share(f, names.TTFT, TTFT_SLO_SECONDS),
                         f"TTFT ≤ {TTFT_SLO_SECONDS}s {f.legend()}"),
                   Query(slo_share(f, names.TPOT, TPOT_SLO_SECONDS),
                         f"TPOT ≤ {TPOT_SLO_SECONDS}s {f.legend()}")),
                  min=0, max=1, steps=red_below(SLO_OBJECTIVE)),
        PanelSpec("Failed share", "Share of requests that failed on the server side"
                  + (" (5xx refusals and finished_reason=error)" if f.has(names.REQUEST_ERRORS)
                     else " (finished neither by stop nor by length)")
                  + ". Healthy: 0.", "percentunit", (Query(failed_share(f), f.legend()),),
                  min=0, steps=((None, "green"), (0.05, "red"))),
    ))


def _throughput(f: Flavour) -> RowSpec:
    return RowSpec("Throughput", (
        PanelSpec("Requests/s by finished reason", "Finished requests per second. Healthy: "
                  "mostly stop; many length means max_tokens cuts answers; abort is the "
                  "client going away.", "reqps",
                  (Query(rate(f, names.REQUEST_SUCCESS, by="finished_reason"),
                         "{{finished_reason}}"),), min=0, stacked=True),
        PanelSpec("Tokens/s", "Prompt (prefill) and generated tokens per second. Healthy: "
                  "generated tokens/s rises with load until the knee, then flattens while "
                  "latency climbs.", "suffix: tok/s",
                  (Query(rate(f, names.PROMPT_TOKENS), f"prompt {f.legend()}"),
                   Query(rate(f, names.GENERATION_TOKENS), f"generated {f.legend()}")), min=0),
    ))


def _capacity(f: Flavour) -> RowSpec:
    return RowSpec("Capacity (per engine, not per workload)", (
        PanelSpec("Running and waiting requests", "Requests in the running batch and waiting "
                  "for a slot. Healthy: waiting near 0; a waiting queue that keeps growing "
                  "fires SpectestQueueGrowing.", "short",
                  (Query(f"sum by ({f.by()}) ({f.select(names.RUNNING)})",
                         f"running {f.legend()}"),
                   Query(f"sum by ({f.by()}) ({f.select(names.WAITING)})",
                         f"waiting {f.legend()}")), width=8, min=0),
        PanelSpec("KV cache usage", "Share of the target model's KV cache in use. Healthy: "
                  "below ~0.9; near 1.0 requests get preempted or wait.", "percentunit",
                  (Query(f"max by ({f.by()}) ({f.select(names.KV_USAGE)})", f.legend()),),
                  width=8, min=0, max=1,
                  steps=((None, "green"), (0.9, "orange"), (0.98, "red"))),
        PanelSpec("Preemptions/s", "Requests preempted (KV cache exhausted). Healthy: 0; "
                  "sustained preemption wastes prefill work and inflates TPOT.", "short",
                  (Query(rate(f, names.PREEMPTIONS), f.legend()),), width=8, min=0),
    ))


def _errors(f: Flavour) -> RowSpec:
    if f.has(names.REQUEST_ERRORS):
        queries = (
            Query(rate(f, names.REQUEST_ERRORS, by="code"), "HTTP {{code}}"),
            Query(rate(f, names.REQUEST_SUCCESS, by="finished_reason",
                       finished_reason="=~error|abort"), "finished {{finished_reason}}"),
        )
        text = ("Refused or failed requests per second by HTTP status code, and finished "
                "requests that ended in error or abort. Healthy: near 0. 429 means over "
                "capacity (scale out), 400 bad client input, 5xx the server.")
    else:
        queries = (Query(rate(f, names.REQUEST_SUCCESS, by="finished_reason",
                              finished_reason="!~stop|length"), "finished {{finished_reason}}"),)
        text = ("Requests per second that finished neither by stop nor by length (vLLM has no "
                "error counter). Healthy: near 0; abort is usually the client disconnecting.")
    return RowSpec("Errors", (PanelSpec("Errors by reason", text, "reqps", queries, width=24,
                                        min=0),))


def serving_dashboard(f: Flavour) -> DashboardSpec:
    return DashboardSpec(
        uid=f"{f.key}-serving",
        title=f"Serving ({f.display})",
        description="Latency percentiles, SLO attainment, throughput, capacity and errors. "
                    "Generated by dashboards/build.py.",
        tags=("spectest", f.key, "serving"),
        rows=(_overview(f), _latency(f), _slos(f), _throughput(f), _capacity(f), _errors(f)))
