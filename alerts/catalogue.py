"""The alert catalogue: one definition per alert, written once for every server flavour.

This module owns each alert's expression template (over a flavour's sample names and labels,
``Ctx``), threshold, window, ``for``, severity, summary, description and name, and how a
flavour's row becomes the alerts' view of a deployment (``DEPLOYMENTS``: which labels an alert
fires per, how the annotations name the target and the drafter, the alert-name prefixes — all
from the row's ``deployment_labels`` … fields).  ``Alert.needs`` lists the table's metrics an
expression reads: ``alerts.build`` writes an alert only for the flavours whose row in
``spectest/flavours.py`` has them.  Thresholds are the dashboards' lines (``dashboards.panels``).
It writes no file (``alerts.build`` does).

Adding an alert (e.g. on the ``speculation_switches`` counter): one ``Alert`` in ``ALERTS`` with
``needs=(its metric,)``, a runbook section in alerts/README.md and a promtool unit test.  Adding a
server: its row in ``spectest/flavours.py``, with its ``deployment_labels``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from dashboards.panels import (ACCEPTANCE_RATE_FLOOR, ACCEPTED_LENGTH_FLOOR, SLO_OBJECTIVE,
                               TPOT_SLO_SECONDS, TTFT_SLO_SECONDS)
from spectest import flavours
from spectest.telemetry import names as N
from spectest.telemetry.names import MetricSpec

PCT = "{{ $value | humanizePercentage }}"
VALUE = "{{ $value }}"
TWO_DECIMALS = '{{ $value | printf "%.2f" }}'


@dataclass(frozen=True)
class Deployment:
    """How one flavour's alerts group its series and name what they fire on."""

    speculative_by: tuple[str, ...]  # acceptance alerts fire once per these labels
    serving_by: tuple[str, ...]  # latency and error alerts
    engine_by: tuple[str, ...]  # alerts on engine gauges (the waiting queue)
    target: str  # the target model / server, as annotation text
    drafter: str = ""  # the drafter, where a label names it
    prefix: str = ""  # alert-name prefix
    speculative_prefix: str = ""  # alert-name prefix of the SpecDecode* alerts
    absent_hint: str = ""  # appended to the metrics-absent description
    switch_off: str = ""  # how to switch speculation off server-wide at runtime, if it can

    def act_now(self) -> str:
        """The speculative alerts' first move, where the server has a runtime switch."""
        return (f" Rollback: switch speculation off: {self.switch_off}; the runbook says "
                f"when." if self.switch_off else "")

    def short(self, by: tuple[str, ...]) -> str:
        """``m1 / d1`` for a series grouped by ``by``."""
        return (f"{self.target} / {self.drafter}"
                if self.drafter and "drafter" in by else self.target)

    @classmethod
    def of(cls, f: flavours.Flavour) -> Deployment:
        """A flavour's row as the alerts see it: speculative and engine alerts per drafter."""
        return cls(f.drafter_labels, f.deployment_labels, f.drafter_labels, f.deployment_text,
                   "{{ $labels.%s }}" % f.drafter_label if f.drafter_label else "",
                   prefix=f.alert_prefix, speculative_prefix=f.speculative_alert_prefix,
                   absent_hint=f" {f.metrics_hint}" if f.metrics_hint else "",
                   switch_off=f.runtime_switch)


DEPLOYMENTS: dict[str, Deployment] = {f.key: Deployment.of(f) for f in flavours.FLAVOURS
                                      if f.deployment_labels}


def _minutes(window: str) -> str:
    assert window.endswith("m"), window
    return f"{window[:-1]} minutes"


@dataclass(frozen=True)
class Ctx:
    """One alert being written for one flavour: names, labels, window."""

    flavour: flavours.Flavour
    where: Deployment
    window: str
    for_: str

    def sample(self, spec: MetricSpec, part: str = "") -> str:
        return self.flavour.samples[spec.name] + part

    def sel(self, spec: MetricSpec, part: str = "", **match: str) -> str:
        matchers = []
        for label, value in match.items():
            op, value = (value[:2], value[2:]) if value[:2] in ("=~", "!~", "!=") else ("=", value)
            matchers.append(f'{label}{op}"{value}"')
        return self.sample(spec, part) + (f"{{{', '.join(matchers)}}}" if matchers else "")

    def rate(self, spec: MetricSpec, part: str = "", **match: str) -> str:
        return f"rate({self.sel(spec, part, **match)}[{self.window}])"

    def sum_rate(self, by: tuple[str, ...], spec: MetricSpec, part: str = "",
                 **match: str) -> str:
        return f"sum by ({', '.join(by)}) ({self.rate(spec, part, **match)})"

    def union(self, by: tuple[str, ...], *rates: str) -> str:
        """``sum by (...) (a or b)``, one operand a line: label sets differ, either may lack."""
        inner = "\n  or\n".join(f"    {r}" for r in rates)
        return f"sum by ({', '.join(by)}) (\n{inner}\n)"

    @property
    def minutes(self) -> str:
        return _minutes(self.window)

    @property
    def for_minutes(self) -> str:
        return _minutes(self.for_)

    @property
    def late(self) -> str:
        if not self.flavour.counters_at_request_end:
            return ""
        return (f" {self.flavour.display} adds a request's draft counts to its counters when the "
                f"request finishes, hence the {self.window[:-1]}-minute window.")


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.split("\n"))


def ratio(num: str, den: str, cmp: str, by: tuple[str, ...] = (), guard: str = "",
          floor: float = 0) -> str:
    """``(num / den) cmp``, optionally ``and on (by) guard > floor`` (a minimum traffic)."""
    expr = f"(\n{_indent(num, 4)}\n  /\n{_indent(den, 4)}\n) {cmp}\n"
    if guard:
        expr += f"and on ({', '.join(by)})\n{_indent(guard, 2)} > {floor:g}\n"
    return expr


@dataclass(frozen=True)
class Alert:
    name: str  # the name without its flavour prefix
    group: str  # "speculative-decoding" | "serving"
    needs: tuple[MetricSpec, ...]  # the table's metrics the expression reads
    expr: Callable[[Ctx], str]
    severity: str
    summary: Callable[[Ctx], str]
    description: Callable[[Ctx], str]
    window: str = "5m"
    for_: str = "10m"
    # Where a server adds counts only when a request finishes: a longer window and ``for``.
    late_window: str = ""
    late_for: str = ""

    def full_name(self, where: Deployment) -> str:
        prefix = where.speculative_prefix if self.group == "speculative-decoding" else where.prefix
        return prefix + self.name

    def ctx(self, f: flavours.Flavour) -> Ctx:
        late = f.counters_at_request_end and self.late_window
        return Ctx(f, DEPLOYMENTS[f.key], self.late_window if late else self.window,
                   self.late_for if late else self.for_)


def _acceptance_low(c: Ctx) -> str:
    by = c.where.speculative_by
    proposed = c.sum_rate(by, N.SPEC_NUM_DRAFT_TOKENS)
    return ratio(c.sum_rate(by, N.SPEC_NUM_ACCEPTED_TOKENS), proposed,
                 f"< {ACCEPTANCE_RATE_FLOOR:g}", by, proposed, 1)


def _accepted_length_low(c: Ctx) -> str:
    by = c.where.speculative_by
    drafts = c.sum_rate(by, N.SPEC_NUM_DRAFTS)
    return (f"1 +\n    {c.sum_rate(by, N.SPEC_NUM_ACCEPTED_TOKENS)}\n  /\n    {drafts}\n"
            f"< {ACCEPTED_LENGTH_FLOOR:g}\nand on ({', '.join(by)})\n  {drafts} > 0.5\n")


NEAR_ZERO, NEAR_FULL = 0.05, 0.95  # per-request acceptance at the distribution's two ends
NEAR_ZERO_SHARE, NEAR_FULL_SHARE = 0.25, 0.5  # share of requests there that is a shift


def _request_acceptance_tail(side: str) -> Callable[[Ctx], str]:
    """The share of finished requests whose own acceptance sits at one end of the range."""
    def expr(c: Ctx) -> str:
        by = c.where.speculative_by
        count = c.sum_rate(by, N.SPEC_REQUEST_ACCEPTANCE, "_count")
        if side == "low":
            share = c.sum_rate(by, N.SPEC_REQUEST_ACCEPTANCE, "_bucket",
                               le=floatToGoString(NEAR_ZERO))
            return ratio(share, count, f"> {NEAR_ZERO_SHARE:g}", by, count, 0.01)
        below = c.sum_rate(by, N.SPEC_REQUEST_ACCEPTANCE, "_bucket",
                           le=floatToGoString(NEAR_FULL))
        above = f"(\n{_indent(count, 2)}\n  -\n{_indent(below, 2)}\n)"  # (a - b) / c
        return ratio(above, count, f"> {NEAR_FULL_SHARE:g}", by, count, 0.01)
    return expr


def _slo_breach(spec: MetricSpec, edge: float) -> Callable[[Ctx], str]:
    def expr(c: Ctx) -> str:
        by = c.where.serving_by
        count = c.sum_rate(by, spec, "_count")
        return ratio(c.sum_rate(by, spec, "_bucket", le=floatToGoString(edge)), count,
                     f"< {SLO_OBJECTIVE:g}", by, count, 0.05)
    return expr


def _requests(c: Ctx) -> str:
    """Every finished or refused request (refusals only where the server counts them)."""
    by = c.where.serving_by
    if c.flavour.has(N.REQUEST_ERRORS):
        return c.union(by, c.rate(N.REQUEST_SUCCESS), c.rate(N.REQUEST_ERRORS))
    return c.sum_rate(by, N.REQUEST_SUCCESS)


def _high_error_rate(c: Ctx) -> str:
    # Failed = 5xx refusals + requests that finished with reason "error" where the server has an
    # error counter (the two counters' label sets differ, so ``or`` is a union and either may be
    # absent); otherwise requests that finished neither by stop nor by length.
    by = c.where.serving_by
    if c.flavour.has(N.REQUEST_ERRORS):
        failed = c.union(by, c.rate(N.REQUEST_ERRORS, code="=~5.."),
                         c.rate(N.REQUEST_SUCCESS, finished_reason="error"))
    else:
        failed = c.sum_rate(by, N.REQUEST_SUCCESS, finished_reason="!~stop|length")
    return ratio(failed, _requests(c), "> 0.05", by, _requests(c), 0.05)


def _failed_means(c: Ctx) -> str:
    return ("failed with a 5xx status or finished with reason error"
            if c.flavour.has(N.REQUEST_ERRORS) else "finished neither by stop nor by length")


def _refused(c: Ctx) -> str:
    return ratio(c.sum_rate(c.where.serving_by, N.REQUEST_ERRORS, code="429"), _requests(c),
                 "> 0.1")


def _queue_growing(c: Ctx) -> str:
    by = ", ".join(c.where.engine_by)
    waiting = c.sample(N.WAITING)
    return (f"sum by ({by}) ({waiting}) > 5\nand on ({by})\n"
            f"  sum by ({by}) (deriv({waiting}[{c.window}])) > 0\n")


def _drafter_failing(c: Ctx) -> str:
    by = ", ".join(c.where.engine_by)
    return f"sum by ({by}) (increase({c.sel(N.SPEC_DRAFT_ERRORS)}[{c.window}])) > 0\n"


def _engine_long(c: Ctx) -> str:
    d = c.where
    return f"{d.target} (drafter {d.drafter})" if d.drafter else d.target


ALERTS: tuple[Alert, ...] = (
    Alert(
        "SpecDecodeAcceptanceRateLow", "speculative-decoding",
        (N.SPEC_NUM_ACCEPTED_TOKENS, N.SPEC_NUM_DRAFT_TOKENS), _acceptance_low, "warning",
        lambda c: f"Draft acceptance {PCT} on {c.where.short(c.where.speculative_by)}",
        lambda c: f"Only {PCT} of draft tokens proposed by {c.where.drafter or 'the drafter'} "
                  f"were accepted by {c.where.target} over the last {c.minutes} (floor "
                  f"{ACCEPTANCE_RATE_FLOOR:.0%}, for {c.for_minutes}, with more than 1 draft "
                  f"token/s).{c.late} Every rejected draft token costs draft time and verify "
                  f"compute.{c.where.act_now()}",
        window="10m", for_="10m", late_window="30m", late_for="15m"),
    Alert(
        "SpecDecodeAcceptedLengthNearOne", "speculative-decoding",
        (N.SPEC_NUM_ACCEPTED_TOKENS, N.SPEC_NUM_DRAFTS), _accepted_length_low, "warning",
        lambda c: f"Mean accepted length {TWO_DECIMALS} on "
                  f"{c.where.short(c.where.speculative_by)}: speculation is pure overhead",
        lambda c: f"Each speculative round of {c.where.target}"
                  + (f" with drafter {c.where.drafter}" if c.where.drafter else "")
                  + f" emitted {TWO_DECIMALS} tokens per request on average over the last "
                  f"{c.minutes} (floor {ACCEPTED_LENGTH_FLOOR:g}, for {c.for_minutes}).{c.late} "
                  f"Without speculation a round emits exactly 1, so the draft and the wider "
                  f"verify forward are buying almost nothing.{c.where.act_now()}",
        window="10m", for_="15m", late_window="30m", late_for="15m"),
    Alert(
        "SpecDecodeDrafterFailing", "speculative-decoding", (N.SPEC_DRAFT_ERRORS,),
        _drafter_failing, "warning",
        lambda c: f"{TWO_DECIMALS} rounds of {c.where.short(c.where.engine_by)} ran without "
                  f"drafts: the drafter is failing",
        lambda c: f"Over the last {c.minutes}, {TWO_DECIMALS} engine rounds of {_engine_long(c)} "
                  f"lost their drafts because the drafter failed (for {c.for_minutes}): with "
                  f"a disaggregated drafter (`spectest serve --draft-url`), the draft server "
                  f"is down, timing out or answering garbage. Requests are still served, "
                  f"target-only — no errors, but the speed of no speculation."
                  f"{c.where.act_now()}",
        window="5m", for_="2m"),
    Alert(
        "SpecDecodeRequestsNearZeroAcceptance", "speculative-decoding",
        (N.SPEC_REQUEST_ACCEPTANCE,), _request_acceptance_tail("low"), "warning",
        lambda c: f"{PCT} of requests on {c.where.short(c.where.speculative_by)} accept almost "
                  f"none of their drafts",
        lambda c: f"{PCT} of the requests {c.where.target} finished over the last {c.minutes} "
                  f"accepted at most {NEAR_ZERO:.0%} of their own draft tokens (threshold "
                  f"{NEAR_ZERO_SHARE:.0%} of requests, for {c.for_minutes}). A request the draft "
                  f"cannot follow at all is often producing garbled or off-distribution output "
                  f"(a broken prompt template, garbage input, a corrupted cache) — look at the "
                  f"outputs, not only at speed.{c.where.act_now()}",
        window="15m", for_="5m"),
    Alert(
        "SpecDecodeRequestsNearFullAcceptance", "speculative-decoding",
        (N.SPEC_REQUEST_ACCEPTANCE,), _request_acceptance_tail("high"), "warning",
        lambda c: f"{PCT} of requests on {c.where.short(c.where.speculative_by)} accept nearly "
                  f"every draft: repetition loops?",
        lambda c: f"{PCT} of the requests {c.where.target} finished over the last {c.minutes} "
                  f"accepted more than {NEAR_FULL:.0%} of their own draft tokens (threshold "
                  f"{NEAR_FULL_SHARE:.0%} of requests, for {c.for_minutes}). Drafts that are "
                  f"almost always right usually mean the output repeats itself — a model stuck "
                  f"in a loop until max_tokens. Fast, and wrong.",
        window="15m", for_="5m"),
    Alert(
        "TTFTSLOBreach", "serving", (N.TTFT,), _slo_breach(N.TTFT, TTFT_SLO_SECONDS), "critical",
        lambda c: f"TTFT SLO breached on {c.where.target}: {PCT} of requests within "
                  f"{TTFT_SLO_SECONDS:g} s",
        lambda c: f"Only {PCT} of requests to {c.where.target} got their first token within "
                  f"{TTFT_SLO_SECONDS:g} s over the last {c.minutes} (objective "
                  f"{SLO_OBJECTIVE:.0%}, for {c.for_minutes})."),
    Alert(
        "TPOTSLOBreach", "serving", (N.TPOT,), _slo_breach(N.TPOT, TPOT_SLO_SECONDS), "critical",
        lambda c: f"TPOT SLO breached on {c.where.target}: {PCT} of requests within "
                  f"{TPOT_SLO_SECONDS:g} s/token",
        lambda c: f"Only {PCT} of requests to {c.where.target} decoded at {TPOT_SLO_SECONDS:g} "
                  f"s per output token or faster over the last {c.minutes} (objective "
                  f"{SLO_OBJECTIVE:.0%}, for {c.for_minutes})."),
    Alert(
        "HighErrorRate", "serving", (N.REQUEST_SUCCESS,), _high_error_rate, "critical",
        lambda c: f"{PCT} of requests to {c.where.target} are failing",
        lambda c: f"{PCT} of requests to {c.where.target} {_failed_means(c)} over the last "
                  f"{c.minutes} (threshold 5%, for {c.for_minutes}).",
        for_="5m"),
    Alert(
        "RequestsRefused", "serving", (N.REQUEST_SUCCESS, N.REQUEST_ERRORS), _refused, "warning",
        lambda c: f"{PCT} of requests to {c.where.target} refused as over capacity (429)",
        lambda c: f"{c.where.target} answered 429 to {PCT} of requests over the last "
                  f"{c.minutes} (threshold 10%, for {c.for_minutes}): the waiting queue is full."),
    Alert(
        "QueueGrowing", "serving", (N.WAITING,), _queue_growing, "warning",
        lambda c: f"{VALUE} requests waiting on {c.where.short(c.where.engine_by)}, and growing",
        lambda c: f"The waiting queue of {_engine_long(c)} holds {VALUE} requests and has been "
                  f"growing for {c.for_minutes}: arrivals exceed what the engine finishes.",
        window="10m"),
    Alert(
        "MetricsAbsent", "serving", (N.RUNNING,), lambda c: f"absent({c.sample(N.RUNNING)})",
        "critical",
        lambda c: f"No {c.flavour.display} engine metrics for {c.for_minutes}",
        lambda c: f"Prometheus has no {c.sample(N.RUNNING)} series: the server is down, /metrics "
                  f"is not scraped, or the scrape fails.{c.where.absent_hint} Every other "
                  f"{c.flavour.display} alert is blind while this fires.",
        for_="5m"),
)
GROUPS = ("speculative-decoding", "serving")
