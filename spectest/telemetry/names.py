"""The one table of metric names spectest exposes, scrapes, charts and alerts on.

This module owns *names, types, labels and help text* only; it imports nothing from
prometheus_client so that the Locust side (``spectest.loadgen``), the dashboard builder and the
alert-rule checker can read it without pulling in the server.  ``telemetry.metrics`` turns the
table into real collectors on an injected registry.

Names follow vLLM's v1 metrics with the ``spectest:`` prefix (docs/metrics.md), so a
dashboard or a scraper written for one works for the other by swapping the prefix.  Counters
are declared without the ``_total`` suffix; Prometheus exposition appends it.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "spectest:"

# Fixed, low-cardinality label sets.  Never a request id, never prompt text.
REQUEST_LABELS = ("model_name", "drafter", "workload")
ENGINE_LABELS = ("model_name", "drafter")

# The bounded set of workload tags a client may send in ``X-Spectest-Workload``; anything else
# is recorded as "other" so label cardinality stays fixed.
WORKLOADS = ("chat", "code", "rag", "mixed", "audit", "other", "none")

# Finished reasons (OpenAI) plus the engine's own terminal states.
FINISHED_REASONS = ("stop", "length", "abort", "error")

# Bucket edges (seconds) — vLLM's, so SLO thresholds line up on the same edges.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                         0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,
                           10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                           960.0, 1920.0, 7680.0)
ROUND_TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05,
                      0.075, 0.1, 0.2, 0.5, 1.0)
ACCEPTED_LENGTH_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16)
# per-request acceptance rate: fine at both ends, where garbled output (near 0) and repetition
# loops (near 1) sit
REQUEST_ACCEPTANCE_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95,
                              0.99, 1.0)


@dataclass(frozen=True)
class MetricSpec:
    name: str  # full name, with prefix, without _total
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()
    unit: str = ""

    @property
    def sample_name(self) -> str:
        """The name as scraped: counters gain ``_total``."""
        return self.name + "_total" if self.kind == "counter" else self.name


def _m(short: str, kind: str, help: str, labels=REQUEST_LABELS, buckets=()) -> MetricSpec:
    return MetricSpec(PREFIX + short, kind, help, tuple(labels), tuple(buckets))


# --- speculative decoding (vLLM semantics) -------------------------------------------------
SPEC_NUM_DRAFTS = _m("spec_decode_num_drafts", "counter",
                     "Requests-rounds that carried drafts (+1 per request per round with K>0).")
SPEC_NUM_DRAFT_TOKENS = _m("spec_decode_num_draft_tokens", "counter", "Draft tokens proposed.")
SPEC_NUM_ACCEPTED_TOKENS = _m("spec_decode_num_accepted_tokens", "counter",
                              "Draft tokens accepted by the target.")
SPEC_NUM_ACCEPTED_PER_POS = _m("spec_decode_num_accepted_tokens_per_pos", "counter",
                               "Accepted draft tokens by draft position (0-based); +1 for each of "
                               "the first n_accepted positions.",
                               labels=REQUEST_LABELS + ("position",))
SPEC_ACCEPTED_LENGTH = _m("spec_decode_accepted_length", "histogram",
                          "Tokens emitted per request per round (accepted drafts + 1).",
                          buckets=ACCEPTED_LENGTH_BUCKETS)
SPEC_REQUEST_ACCEPTANCE = _m("spec_decode_request_acceptance_rate", "histogram",
                             "Each finished request's own acceptance rate (its accepted / draft "
                             "tokens; requests without drafts not observed). A shift of this "
                             "distribution is a quality signal: requests near 0 are often "
                             "garbled or off-distribution output, near 1 repetition loops.",
                             buckets=REQUEST_ACCEPTANCE_BUCKETS)
SPEC_REQUESTS = _m("spec_decode_requests", "counter",
                   "Finished requests by speculation mode (A/B traffic split).",
                   labels=REQUEST_LABELS + ("speculative",))
SPEC_K = _m("spec_decode_k", "gauge", "Draft length K chosen for the latest round.",
            labels=ENGINE_LABELS)
SPEC_DRAFT_TIME = _m("spec_decode_draft_time_seconds", "histogram",
                     "Wall time of the drafting phase of one round.", labels=ENGINE_LABELS,
                     buckets=ROUND_TIME_BUCKETS)
SPEC_VERIFY_TIME = _m("spec_decode_verify_time_seconds", "histogram",
                      "Wall time of the target verify forward (and acceptance) of one round.",
                      labels=ENGINE_LABELS, buckets=ROUND_TIME_BUCKETS)
SPEC_ROUNDS = _m("spec_decode_rounds", "counter", "Engine rounds (one target forward each).",
                 labels=ENGINE_LABELS)
SPEC_NETWORK_TIME = _m("spec_decode_draft_network_seconds", "histogram",
                       "Part of one round's drafting phase spent outside the draft model when "
                       "drafts come from another process (`spectest serve --draft-url`): "
                       "transport, encoding, the draft server's queue. Not observed when the "
                       "draft is co-located.", labels=ENGINE_LABELS, buckets=ROUND_TIME_BUCKETS)
SPEC_DRAFT_ERRORS = _m("spec_decode_draft_errors", "counter",
                       "Rounds that ran without drafts because the drafter failed (a remote "
                       "draft server down, timing out or answering garbage); requests go on "
                       "target-only meanwhile.", labels=ENGINE_LABELS)

# --- the runtime speculation switch (POST /admin/speculation; spectest only) ----------------
SPECULATION_ENABLED = _m("speculation_enabled", "gauge",
                         "1 while speculation is switched on for the whole server, 0 while it is "
                         "switched off at runtime (every request then decodes target-only).",
                         labels=ENGINE_LABELS)
SPECULATION_K = _m("speculation_k", "gauge",
                   "The configured draft length K (the runtime setting; spec_decode_k is the K "
                   "the policy chose for the latest round).", labels=ENGINE_LABELS)
SPECULATION_SWITCHES = _m("speculation_switches", "counter",
                          "Runtime changes of the speculation settings (on/off, K, K policy) "
                          "the engine applied.", labels=ENGINE_LABELS)

# --- serving (vLLM names) ------------------------------------------------------------------
TTFT = _m("time_to_first_token_seconds", "histogram", "Time to first token.",
          buckets=TTFT_BUCKETS)
ITL = _m("inter_token_latency_seconds", "histogram",
         "Time between consecutive engine steps that emitted tokens for a request (one sample "
         "per step, not per token, under speculation).", buckets=TOKEN_LATENCY_BUCKETS)
TPOT = _m("request_time_per_output_token_seconds", "histogram",
          "Per-request decode_time / (output_tokens - 1).", buckets=TOKEN_LATENCY_BUCKETS)
E2E = _m("e2e_request_latency_seconds", "histogram", "End-to-end request latency.",
         buckets=REQUEST_LATENCY_BUCKETS)
QUEUE = _m("request_queue_time_seconds", "histogram", "Time spent waiting for a slot.",
           buckets=REQUEST_LATENCY_BUCKETS)
PREFILL = _m("request_prefill_time_seconds", "histogram", "Prefill time of a request.",
             buckets=REQUEST_LATENCY_BUCKETS)
DECODE = _m("request_decode_time_seconds", "histogram",
            "Time from first to last token of a request.", buckets=REQUEST_LATENCY_BUCKETS)
RUNNING = _m("num_requests_running", "gauge", "Requests in the running batch.",
             labels=ENGINE_LABELS)
WAITING = _m("num_requests_waiting", "gauge", "Requests waiting for a slot.",
             labels=ENGINE_LABELS)
KV_USAGE = _m("kv_cache_usage_perc", "gauge", "KV cache usage, 0 to 1 (target model).",
              labels=ENGINE_LABELS)
PROMPT_TOKENS = _m("prompt_tokens", "counter", "Prefill tokens processed.")
GENERATION_TOKENS = _m("generation_tokens", "counter", "Generated tokens.")
PREEMPTIONS = _m("num_preemptions", "counter", "Preempted requests.", labels=ENGINE_LABELS)
PREFIX_CACHE_QUERIES = _m("prefix_cache_queries", "counter",
                          "Prompt tokens of finished requests, each looked up in the prefix "
                          "cache.", labels=ENGINE_LABELS)
PREFIX_CACHE_HITS = _m("prefix_cache_hits", "counter",
                       "Prompt tokens restored from the prefix cache instead of computed.",
                       labels=ENGINE_LABELS)
REQUEST_SUCCESS = _m("request_success", "counter", "Finished requests by finished reason.",
                     labels=REQUEST_LABELS + ("finished_reason",))
REQUEST_ERRORS = _m("request_errors", "counter",
                    "Requests refused or failed, by HTTP status code.",
                    labels=("model_name", "drafter", "code"))

ALL: tuple[MetricSpec, ...] = (
    SPEC_NUM_DRAFTS, SPEC_NUM_DRAFT_TOKENS, SPEC_NUM_ACCEPTED_TOKENS, SPEC_NUM_ACCEPTED_PER_POS,
    SPEC_ACCEPTED_LENGTH, SPEC_REQUEST_ACCEPTANCE, SPEC_REQUESTS, SPEC_K, SPEC_DRAFT_TIME, SPEC_VERIFY_TIME, SPEC_ROUNDS,
    SPEC_NETWORK_TIME, SPEC_DRAFT_ERRORS, SPECULATION_ENABLED, SPECULATION_K,
    SPECULATION_SWITCHES, TTFT, ITL, TPOT, E2E, QUEUE, PREFILL, DECODE, RUNNING, WAITING,
    KV_USAGE, PROMPT_TOKENS, GENERATION_TOKENS, PREEMPTIONS, PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS, REQUEST_SUCCESS, REQUEST_ERRORS,
)
BY_NAME = {m.name: m for m in ALL}


def renamed(spec: MetricSpec, prefix: str) -> str:
    """The same metric under another engine's prefix (``vllm:``): dashboards built for both."""
    return prefix + spec.name[len(PREFIX):]
