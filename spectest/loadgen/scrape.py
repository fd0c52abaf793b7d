"""Read a server's ``/metrics`` and turn its spec-decode counters into acceptance figures.

Which samples are the counters comes from the flavour table (``spectest.flavours``), so one
locustfile measures spectest, vLLM, SGLang or llama.cpp:

* counters with vLLM semantics (spectest's ``spectest:`` names, labelled by ``workload``;
  vLLM's ``vllm:`` and llama.cpp's ``llamacpp:`` names — no workload label, so figures are for
  all traffic). llama.cpp adds a request's counts only when the request finishes, so its window
  covers requests that *ended* in it;
* SGLang's ``sglang:spec_accept_length`` gauge — a mean accepted length the server recomputes
  itself; it cannot be differenced, so a window gets the gauge's value at its end, and no
  acceptance rate (SGLang's ``spec_accept_rate`` counts the bonus token; it is not vLLM's).

Figures for a window come from counter *deltas* between two snapshots (vLLM semantics):
acceptance rate = Δaccepted / Δdraft_tokens, mean accepted length = 1 + Δaccepted / Δdrafts,
per-position acceptance = Δaccepted_at_pos[i] / Δdrafts — each ``None`` (not 0) when there
were no drafts. A counter that went down means the server restarted; the window then counts
from zero. This module does HTTP GET and parsing only; it knows nothing of Locust or steps.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from spectest import flavours
from spectest.flavours import FLAVOURS
from spectest.telemetry import names as N

ALL = "all"
_FIELDS = {N.SPEC_NUM_DRAFTS: "drafts", N.SPEC_NUM_DRAFT_TOKENS: "draft_tokens",
           N.SPEC_NUM_ACCEPTED_TOKENS: "accepted", N.SPEC_NUM_ACCEPTED_PER_POS: "per_pos"}
# sample name → (flavour key, field), for every flavour that has the counters
_COUNTER_SAMPLES = {f.sample(spec): (f.key, field) for f in FLAVOURS
                    for spec, field in _FIELDS.items() if f.sample(spec)}
_GAUGES = {f.accept_length_gauge: f.key for f in FLAVOURS if f.accept_length_gauge}
# the running-requests gauge (the batch the server is running) of every flavour that has one
_RUNNING = {f.sample(N.RUNNING): f.key for f in FLAVOURS if f.sample(N.RUNNING)}


@dataclass(frozen=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: tuple[float, ...] = ()

    def __add__(self, o: SpecCounters) -> SpecCounters:
        n = max(len(self.per_pos), len(o.per_pos))
        pos = tuple(_at(self.per_pos, i) + _at(o.per_pos, i) for i in range(n))
        return SpecCounters(self.drafts + o.drafts, self.draft_tokens + o.draft_tokens,
                            self.accepted + o.accepted, pos)

    def since(self, earlier: SpecCounters) -> SpecCounters:
        """The increase from ``earlier``; a decrease means a restart, so count from zero."""
        if (self.drafts < earlier.drafts or self.draft_tokens < earlier.draft_tokens
                or self.accepted < earlier.accepted):
            return self
        n = max(len(self.per_pos), len(earlier.per_pos))
        pos = tuple(max(0.0, _at(self.per_pos, i) - _at(earlier.per_pos, i)) for i in range(n))
        return SpecCounters(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                            self.accepted - earlier.accepted, pos)


def _at(t: tuple[float, ...], i: int) -> float:
    return t[i] if i < len(t) else 0.0


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # wall clock
    source: str  # a flavour key (spectest | vllm | sglang | llamacpp) or "none"
    counters: dict[str, SpecCounters]  # by workload label, plus "all"
    accept_length_gauge: float | None = None
    running: float | None = None  # requests the server is running now (its gauge, summed)


@dataclass(frozen=True)
class Acceptance:
    source: str
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    per_position: tuple[float, ...] = ()


def parse_metrics(text: str, taken_at: float | None = None) -> Snapshot:
    """Prometheus text exposition → Snapshot (``source="none"`` if no known metric is there)."""
    taken_at = time.time() if taken_at is None else taken_at
    found: dict[str, dict[str, dict]] = defaultdict(lambda: defaultdict(dict))
    gauges: dict[str, list[float]] = defaultdict(list)
    running: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _RUNNING:
                key = _RUNNING[sample.name]
                running[key] = running.get(key, 0.0) + sample.value
                continue
            if sample.name in _GAUGES:
                gauges[_GAUGES[sample.name]].append(sample.value)
                continue
            hit = _COUNTER_SAMPLES.get(sample.name)
            if hit is None:
                continue
            flavour, field = hit
            slot = found[flavour][sample.labels.get("workload", ALL)]
            if field == "per_pos":
                pos = int(sample.labels.get("position", "0"))
                slot.setdefault("per_pos", {})
                slot["per_pos"][pos] = slot["per_pos"].get(pos, 0.0) + sample.value
            else:
                slot[field] = slot.get(field, 0.0) + sample.value
    for flavour in FLAVOURS:  # table order: spectest wins when a proxy exposes two
        if flavour.key in found:
            by_workload = {w: _counters(v) for w, v in found[flavour.key].items()}
            if ALL not in by_workload or len(by_workload) > 1:
                total = SpecCounters()
                for w, c in by_workload.items():
                    if w != ALL:
                        total = total + c
                by_workload[ALL] = total + by_workload.get(ALL, SpecCounters())
            return Snapshot(taken_at, flavour.key, by_workload, running=running.get(flavour.key))
    for key, values in gauges.items():
        return Snapshot(taken_at, key, {}, sum(values) / len(values), running.get(key))
    if running:  # a plain server: no speculative counters, but its batch
        key = next(f.key for f in FLAVOURS if f.key in running)
        return Snapshot(taken_at, "none", {}, running=running[key])
    return Snapshot(taken_at, "none", {})


def _counters(slot: dict) -> SpecCounters:
    pos = slot.get("per_pos", {})
    return SpecCounters(slot.get("drafts", 0.0), slot.get("draft_tokens", 0.0),
                        slot.get("accepted", 0.0),
                        tuple(pos.get(i, 0.0) for i in range(max(pos) + 1)) if pos else ())


def acceptance(start: Snapshot | None, end: Snapshot | None) -> dict[str, Acceptance]:
    """Acceptance per workload (and ``"all"``) over the window between two snapshots."""
    if end is None:
        return {}
    if end.accept_length_gauge is not None:
        return {ALL: Acceptance(end.source, mean_accepted_length=end.accept_length_gauge)}
    if start is None or start.source not in (end.source, "none"):
        return {}  # no baseline (a labelled counter is absent until first used: "none" is 0)
    out = {}
    for workload, now in end.counters.items():
        d = now.since(start.counters.get(workload, SpecCounters()))
        out[workload] = Acceptance(
            source=end.source, drafts=d.drafts, draft_tokens=d.draft_tokens, accepted=d.accepted,
            acceptance_rate=d.accepted / d.draft_tokens if d.draft_tokens else None,
            mean_accepted_length=1 + d.accepted / d.drafts if d.drafts else None,
            per_position=tuple(p / d.drafts for p in d.per_pos) if d.drafts else ())
    return out


class Scraper:
    """GETs one ``/metrics`` URL; under Locust the socket is gevent's (monkey-patched)."""

    def __init__(self, url: str, timeout: float = 3.0):
        self.url = url
        self.timeout = timeout
        self.last_error = ""

    def scrape(self) -> Snapshot | None:
        req = urllib.request.Request(self.url, headers={"Accept": "text/plain;version=0.0.4"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode("utf-8", errors="replace")
        except (OSError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        self.last_error = ""
        try:
            return parse_metrics(text)
        except ValueError as e:  # not Prometheus text
            self.last_error = f"unparseable /metrics: {e}"
            return None


def detect_flavour(host: str, metrics_url: str = "",
                   timeout: float = 5.0) -> flavours.Flavour | None:
    """The server flavour behind ``host``: ``/v1/models``' ``owned_by`` (llama.cpp says
    "llamacpp"), then the metric names on ``/metrics``; None when neither tells."""
    host = host.rstrip("/")
    try:
        with urllib.request.urlopen(host + "/v1/models", timeout=timeout) as resp:
            owners = {m.get("owned_by") for m in json.loads(resp.read()).get("data", [])
                      if isinstance(m, dict)}
    except (OSError, ValueError):
        owners = set()
    for f in flavours.FLAVOURS:
        if f.key in owners:
            return f
    try:
        with urllib.request.urlopen(metrics_url or host + "/metrics", timeout=timeout) as resp:
            text = resp.read().decode("utf-8", errors="replace")
        names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    except (OSError, ValueError):
        return None
    return flavours.detect(names)
