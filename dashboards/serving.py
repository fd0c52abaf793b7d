"""The serving dashboard: latency percentiles, SLO attainment, throughput, capacity, errors.

This module owns the panel list and the "what healthy looks like" text of that dashboard, for any
``Flavour``.  Every panel is written once; one that queries a series a server lacks drops out of
that server's build (``panels.row``): llama.cpp, with no latency histograms, gets throughput,
cached-prompt share, mean time per token and capacity panels, plus a text panel that sends the
reader to spectest's client-side latency results.  The error panels are the one place where the
query itself depends on the flavour (vLLM and llama.cpp have no error counter).  It knows
nothing about Grafana JSON.
"""

from __future__ import annotations

from spectest.telemetry import names

from dashboards.flavours import RANGE_WINDOW, RATE_WINDOW, Flavour
from dashboards.panels import (SLO_OBJECTIVE, TPOT_SLO_SECONDS, TTFT_SLO_SECONDS, DashboardSpec,
                               PanelSpec, Query, at_request_end, failed_share, mean,
                               percentiles, quantile, rate, red_below, row, rows, slo_share)

CLIENT_SIDE_LATENCY = (
    "{display} has no latency histograms on /metrics, so time to first token, time per output "
    "token and end-to-end latency are not on this dashboard. Measure them from the client side "
    "with spectest: `spectest sweep --host http://HOST:PORT` (or `locust -f workloads/chat.py "
    "--host http://HOST:PORT`) records TTFT and TPOT of every request (`requests.jsonl`) and "
    "their percentiles per concurrency step (the step CSV); `spectest report` turns them into "
    "SLO attainment, break points and speculation on/off comparisons.")
MEAN_IS_NOT_LATENCY = (" The mean time per token panel below is the server's own token-weighted "
                       "mean, not a percentile.")


def _overview(f: Flavour):
    R = RANGE_WINDOW
    return row(
        "Overview (whole time range)",
        lambda: PanelSpec(
            "Requests/s", "Finished requests per second over the range. Healthy: tracks "
            "offered load; a drop with steady load means refusals or stalls.", "reqps",
            (Query(rate(f, names.REQUEST_SUCCESS, by="", window=R)),), kind="stat"),
        lambda: PanelSpec(
            "TTFT p99", f"99th percentile time to first token over the range. Healthy: "
            f"under the TTFT SLO ({TTFT_SLO_SECONDS} s here).", "s",
            (Query(quantile(f, names.TTFT, 0.99, window=R, by="")),), kind="stat"),
        lambda: PanelSpec(
            "TPOT p99", f"99th percentile time per output token over the range. "
            f"Healthy: under the TPOT SLO ({TPOT_SLO_SECONDS} s here).", "s",
            (Query(quantile(f, names.TPOT, 0.99, window=R, by="")),), kind="stat"),
        lambda: PanelSpec(
            "Failed share", "Share of requests that failed on the server side over the "
            "range. Healthy: 0; above 5% for 5 minutes fires the high-error-rate alert.",
            "percentunit", (Query(failed_share(f, by="", window=R)),), kind="stat",
            steps=((None, "green"), (0.01, "orange"), (0.05, "red"))),
    )


def _latency(f: Flavour):
    if not f.server.histograms:
        return row("Latency", lambda: PanelSpec(
            "Latency comes from the client side", "Why this dashboard has no latency panels.",
            "", (), kind="text",
            content=CLIENT_SIDE_LATENCY.format(display=f.display)
            + MEAN_IS_NOT_LATENCY * f.has_extra("prompt_seconds", "generation_seconds")))
    return row(
        "Latency",
        lambda: PanelSpec(
            "Time to first token", f"TTFT p50/p90/p99 (server side: arrival to first "
            f"token). Healthy: p99 under the SLO ({TTFT_SLO_SECONDS} s here); TTFT grows "
            f"with prompt length and queue time, not with speculation.", "s",
            percentiles(f, names.TTFT), min=0),
        lambda: PanelSpec(
            "Time per output token", f"TPOT p50/p90/p99: per request, decode time / "
            f"(output tokens − 1). Healthy: p99 under the SLO ({TPOT_SLO_SECONDS} s "
            f"here); speculation should lower it at low batch and may raise it at high "
            f"batch.", "s", percentiles(f, names.TPOT), min=0),
        lambda: PanelSpec(
            "Inter-token latency (per engine step)", "Time between engine steps that "
            "emitted tokens for a request. One sample per step, not per token: under "
            "speculation it is about mean accepted length × TPOT. Healthy: steady; spikes "
            "mean preemption or prefill interference.", "s",
            percentiles(f, names.ITL, (0.5, 0.99)), min=0),
        lambda: PanelSpec(
            "End-to-end request latency", "Arrival to last token, p50/p90/p99. Healthy: "
            "about queue + prefill + output tokens × TPOT; long tails with short queue "
            "time point at long outputs.", "s", percentiles(f, names.E2E), min=0),
        lambda: PanelSpec(
            "Queue time", "Time waiting for a slot before prefill, p50/p99. Healthy: near "
            "0. It grows when the running batch is full; then the waiting gauge grows "
            "too.", "s", percentiles(f, names.QUEUE, (0.5, 0.99)), min=0),
        lambda: PanelSpec(
            "Prefill and decode time (mean)", "Mean prefill time and mean decode time "
            "(first to last token) per request. Healthy: prefill small next to decode for "
            "chat; RAG prompts make prefill dominate.", "s",
            (Query(mean(f, names.PREFILL), f"prefill {f.legend()}"),
             Query(mean(f, names.DECODE), f"decode {f.legend()}")), min=0),
    )


def _slos(f: Flavour):
    return row(
        "SLOs",
        lambda: PanelSpec(
            "SLO attainment", f"Share of requests with TTFT ≤ {TTFT_SLO_SECONDS} s and "
            f"with TPOT ≤ {TPOT_SLO_SECONDS} s (histogram bucket edges, the ones the "
            f"alerts use). Healthy: above {SLO_OBJECTIVE:.0%}; below it for 10 minutes fires "
            f"the TTFT / TPOT SLO alerts.", "percentunit",
            (Query(slo_share(f, names.TTFT, TTFT_SLO_SECONDS),
                   f"TTFT ≤ {TTFT_SLO_SECONDS}s {f.legend()}"),
             Query(slo_share(f, names.TPOT, TPOT_SLO_SECONDS),
                   f"TPOT ≤ {TPOT_SLO_SECONDS}s {f.legend()}")),
            min=0, max=1, steps=red_below(SLO_OBJECTIVE)),
        lambda: PanelSpec(
            "Failed share", "Share of requests that failed on the server side"
            + (" (5xx refusals and finished_reason=error)" if f.has(names.REQUEST_ERRORS)
               else " (finished neither by stop nor by length)")
            + ". Healthy: 0.", "percentunit", (Query(failed_share(f), f.legend()),),
            min=0, steps=((None, "green"), (0.05, "red"))),
    )


def _throughput(f: Flavour):
    late = at_request_end(f)
    return row(
        "Throughput",
        lambda: PanelSpec(
            "Requests/s by finished reason", "Finished requests per second. Healthy: "
            "mostly stop; many length means max_tokens cuts answers; abort is the "
            "client going away.", "reqps",
            (Query(rate(f, names.REQUEST_SUCCESS, by="finished_reason"),
                   "{{finished_reason}}"),), min=0, stacked=True),
        lambda: PanelSpec(
            "Tokens/s", "Prompt (prefill) and generated tokens per second. Healthy: "
            "generated tokens/s rises with load until the knee, then flattens while "
            "latency climbs." + late, "suffix: tok/s",
            (Query(rate(f, names.PROMPT_TOKENS), f"prompt {f.legend()}"),
             Query(rate(f, names.GENERATION_TOKENS), f"generated {f.legend()}")), min=0),
        lambda: PanelSpec(
            "Cached prompt share", "Share of prompt tokens reused from the prefix cache "
            "instead of prefilled: cached / (cached + processed). Healthy: high for multi-turn "
            "chat and RAG with shared context (prefill skipped), near 0 for one-shot prompts; "
            "a sudden drop raises prefill time and TTFT.", "percentunit",
            (Query(f"{rate(f, 'prompt_tokens_cached')} / ({rate(f, 'prompt_tokens_cached')} "
                   f"+ {rate(f, names.PROMPT_TOKENS)})", f.legend()),), min=0, max=1),
        lambda: PanelSpec(
            "Mean time per token", "Server-side time spent per prompt token (prefill) and "
            "per generated token (decode), token-weighted means over all requests: seconds "
            "spent / tokens. Not a percentile and not TTFT. Healthy: generation time per "
            "token steady under load and lower with speculation on than off; rising with "
            "busy slots means the batch is compute-bound." + late, "s",
            (Query(f"{rate(f, 'prompt_seconds')} / {rate(f, names.PROMPT_TOKENS)}",
                   f"prefill {f.legend()}"),
             Query(f"{rate(f, 'generation_seconds')} / {rate(f, names.GENERATION_TOKENS)}",
                   f"generation {f.legend()}")), min=0),
        per_line=2)


def _capacity(f: Flavour):
    return row(
        "Capacity (per engine, not per workload)",
        lambda: PanelSpec(
            "Running and waiting requests", f"Requests in the running batch "
            f"({f.metric(names.RUNNING)}) and waiting for a slot ({f.metric(names.WAITING)}). "
            f"Healthy: waiting near 0; a waiting queue that keeps growing fires the "
            f"queue-growing alert.", "short",
            (Query(f"sum by ({f.by()}) ({f.select(names.RUNNING)})", f"running {f.legend()}"),
             Query(f"sum by ({f.by()}) ({f.select(names.WAITING)})", f"waiting {f.legend()}")),
            min=0),
        lambda: PanelSpec(
            "KV cache usage", "Share of the target model's KV cache in use. Healthy: "
            "below ~0.9; near 1.0 requests get preempted or wait.", "percentunit",
            (Query(f"max by ({f.by()}) ({f.select(names.KV_USAGE)})", f.legend()),),
            min=0, max=1, steps=((None, "green"), (0.9, "orange"), (0.98, "red"))),
        lambda: PanelSpec(
            "Preemptions/s", "Requests preempted (KV cache exhausted). Healthy: 0; "
            "sustained preemption wastes prefill work and inflates TPOT.", "short",
            (Query(rate(f, names.PREEMPTIONS), f.legend()),), min=0),
        lambda: PanelSpec(
            "Busy slots per decode call", "Requests (slots) batched into one target decode "
            "call, averaged over the window. The server only exposes a running mean since it "
            "started, so the window's mean is recovered as Δ(mean × decode calls) / Δdecode "
            "calls. Healthy: close to the running requests under load (continuous batching at "
            "work); near 1 while several requests run means they are decoded one by one.",
            "short", (Query(_windowed_mean(f, "busy_slots_per_decode", "decode_calls"),
                            f.legend()),), min=0),
    )


def _windowed_mean(f: Flavour, mean_role: str, count_role: str,
                   window: str = RATE_WINDOW) -> str:
    """The mean over the last ``window`` of a gauge that holds a running mean since start.

    total = running mean × count, so the window's mean is Δtotal / Δcount (``offset``, not a
    subquery: exact at every scrape interval).
    """
    mean_, count = f.select(mean_role), f.select(count_role)
    now = f"sum by ({f.by()}) ({mean_} * {count})"
    before = f"sum by ({f.by()}) (({mean_} offset {window}) * ({count} offset {window}))"
    calls = (f"(sum by ({f.by()}) ({count}) - "
             f"sum by ({f.by()}) ({count} offset {window}))")
    return f"({now} - {before}) / {calls}"


def _errors(f: Flavour):
    if f.has(names.REQUEST_ERRORS):
        return row("Errors", lambda: PanelSpec(
            "Errors by reason", "Refused or failed requests per second by HTTP status code, and "
            "finished requests that ended in error or abort. Healthy: near 0. 429 means over "
            "capacity (scale out), 400 bad client input, 5xx the server.", "reqps",
            (Query(rate(f, names.REQUEST_ERRORS, by="code"), "HTTP {{code}}"),
             Query(rate(f, names.REQUEST_SUCCESS, by="finished_reason",
                        finished_reason="=~error|abort"), "finished {{finished_reason}}")),
            min=0))
    return row("Errors", lambda: PanelSpec(
        "Errors by reason", f"Requests per second that finished neither by stop nor by length "
        f"({f.display} has no error counter). Healthy: near 0; abort is usually the client "
        f"disconnecting.", "reqps",
        (Query(rate(f, names.REQUEST_SUCCESS, by="finished_reason",
                    finished_reason="!~stop|length"), "finished {{finished_reason}}"),),
        min=0))


def serving_dashboard(f: Flavour) -> DashboardSpec:
    description = ("Latency percentiles, SLO attainment, throughput, capacity and errors. "
                   "Generated by dashboards/build.py.")
    if not f.server.histograms:
        description = (f"Throughput, prefix-cache reuse, time per token and capacity of "
                       f"{f.display}. Generated by dashboards/build.py. No latency panels: "
                       f"{f.display} exposes no latency histograms, so TTFT and TPOT come from "
                       f"spectest's client-side results (spectest sweep / report).")
    return DashboardSpec(
        uid=f"{f.key}-serving",
        title=f"Serving ({f.display})",
        description=description,
        tags=("spectest", f.key, "serving"),
        rows=rows(_overview(f), _latency(f), _slos(f), _throughput(f), _capacity(f),
                  _errors(f)))
