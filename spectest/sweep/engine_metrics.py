"""Engine-round figures of one sweep step from two ``/metrics`` scrapes of a spectest server.

The load generator's scraper (``spectest.loadgen.scrape``) already turns the spec-decode
*counters* into acceptance per step. What the K advisor also needs is the cost side, which only
a spectest server exposes: the ``spec_decode_draft_time_seconds`` and
``spec_decode_verify_time_seconds`` histograms, the ``spec_decode_rounds`` counter and the
``spec_decode_k`` gauge (names from ``spectest.telemetry.names``). ``scrape`` reads them,
``round_figures`` differences two readings into mean draft / verify milliseconds per round
(and, for a disaggregated drafter, the network milliseconds per round within drafting and the
rounds that lost their drafts), rounds, requests per round and the K the server ran. Against
vLLM or SGLang the figures are simply absent (None), never zero.

It does HTTP GET and arithmetic only; it knows nothing of Locust or the report.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from spectest.telemetry import names as N

_SUMS = {N.SPEC_DRAFT_TIME.name + "_sum": "draft_s", N.SPEC_VERIFY_TIME.name + "_sum": "verify_s",
         N.SPEC_NETWORK_TIME.name + "_sum": "network_s",
         N.SPEC_DRAFT_ERRORS.sample_name: "draft_errors",
         N.SPEC_ROUNDS.sample_name: "rounds", N.SPEC_NUM_DRAFTS.sample_name: "drafts",
         N.GENERATION_TOKENS.sample_name: "generated", N.SPEC_K.name: "k"}


@dataclass(frozen=True)
class EngineReading:
    taken_at: float
    draft_s: float | None = None
    verify_s: float | None = None
    network_s: float | None = None  # a remote drafter's network term (serve --draft-url)
    draft_errors: float | None = None
    rounds: float | None = None
    drafts: float | None = None
    generated: float | None = None
    k: float | None = None


def parse(text: str, taken_at: float | None = None) -> EngineReading:
    """Sum each figure over its label sets (one engine; workloads summed)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _SUMS.get(sample.name)
            if key is not None:
                found[key] = found.get(key, 0.0) + sample.value
    return EngineReading(time.time() if taken_at is None else taken_at, **found)


def scrape(metrics_url: str, timeout: float = 5.0) -> EngineReading | None:
    """One reading of ``metrics_url``; None when the server cannot be read."""
    req = urllib.request.Request(metrics_url, headers={"Accept": "text/plain;version=0.0.4"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", errors="replace")
        return parse(text)
    except (OSError, ValueError):
        return None


def round_figures(start: EngineReading | None, end: EngineReading | None,
                  speculative: bool) -> dict:
    """Mean ms per round of drafting and verifying, rounds, requests per round, K.

    Requests per round: Δdrafts / Δrounds when speculating (one draft per request per round),
    else Δgenerated tokens / Δrounds (one token per request per round).
    """
    out = {"rounds": None, "draft_ms_per_round": None, "verify_ms_per_round": None,
           "network_ms_per_round": None, "draft_errors": None, "mean_batch": None, "k": None}
    if end is not None and end.k is not None and speculative:
        out["k"] = end.k
    if start is None or end is None or start.rounds is None or end.rounds is None:
        return out
    rounds = end.rounds - start.rounds
    if rounds <= 0:
        return out
    out["rounds"] = rounds

    def per_round(a, b, scale=1.0):
        return None if a is None or b is None or b < a else (b - a) * scale / rounds
    out["draft_ms_per_round"] = per_round(start.draft_s, end.draft_s, 1e3)
    out["verify_ms_per_round"] = per_round(start.verify_s, end.verify_s, 1e3)
    if end.network_s is not None:  # a disaggregated drafter: part of draft_ms_per_round
        out["network_ms_per_round"] = per_round(start.network_s or 0.0, end.network_s, 1e3)
    if end.draft_errors is not None and start.draft_errors is not None:
        out["draft_errors"] = end.draft_errors - start.draft_errors
    out["mean_batch"] = (per_round(start.drafts, end.drafts) if speculative
                         else per_round(start.generated, end.generated))
    return out


def combine(looks: list[dict | None]) -> dict:
    """The round figures of several looks of one step as one: rounds and draft errors summed,
    per-round times and requests per round weighted by each look's rounds, the last K."""
    looks = [x for x in looks if x]
    if not looks:
        return {}
    if len(looks) == 1:
        return dict(looks[0])
    out = dict(looks[-1])
    weights = [x.get("rounds") or 0.0 for x in looks]
    total = sum(weights)
    out["rounds"] = total or None
    for key in ("draft_ms_per_round", "verify_ms_per_round", "network_ms_per_round",
                "mean_batch"):
        pairs = [(x.get(key), w) for x, w in zip(looks, weights) if x.get(key) is not None and w]
        out[key] = (sum(v * w for v, w in pairs) / sum(w for _, w in pairs)) if pairs else None
    errors = [x.get("draft_errors") for x in looks if x.get("draft_errors") is not None]
    out["draft_errors"] = sum(errors) if errors else None
    return out
