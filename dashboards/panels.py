"""The vocabulary the dashboards are written in: panel specs and the PromQL shapes they use.

This module owns the frozen dataclasses a dashboard is described with (``DashboardSpec`` → rows
→ panels → queries), the handful of PromQL shapes every panel is made of (summed rates, ratios,
histogram quantiles, SLO shares), the thresholds drawn on panels, and ``row``, which leaves out
every panel that queries a series the flavour lacks.  The panels themselves live in
``dashboards.speculative`` and ``dashboards.serving``; Grafana JSON in ``dashboards.build``.

The thresholds are the ones the alert rules use (``alerts/catalogue.py`` imports them from here;
``tests/alerts`` checks the generated rules carry them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from prometheus_client.utils import floatToGoString

from spectest.telemetry import names
from spectest.telemetry.names import MetricSpec

from dashboards.flavours import RATE_WINDOW, Flavour, MissingMetric

# Shared with the alert rules (tests/alerts checks they match).
ACCEPTANCE_RATE_FLOOR = 0.6
ACCEPTED_LENGTH_FLOOR = 1.2
TTFT_SLO_SECONDS = 0.5  # a TTFT_BUCKETS edge
TPOT_SLO_SECONDS = 0.1  # a TOKEN_LATENCY_BUCKETS edge
SLO_OBJECTIVE = 0.9  # share of requests that must meet each latency SLO


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # "timeseries" | "stat" | "text" (Markdown ``content``, no queries)
    width: int = 12
    min: float | None = None
    max: float | None = None
    # Colour steps (value the colour starts at, colour); the first step starts at -inf.
    steps: tuple[tuple[float | None, str], ...] = ()
    stacked: bool = False
    content: str = ""  # text panels only


@dataclass(frozen=True)
class RowSpec:
    title: str
    panels: tuple[PanelSpec, ...]


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    rows: tuple[RowSpec, ...]


# --- PromQL shapes -------------------------------------------------------------------------

def _sum(by: str, inner: str) -> str:
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def rate(f: Flavour, spec: MetricSpec | str, part: str = "", by: str | None = None,
         window: str = RATE_WINDOW, **match: str) -> str:
    """``sum by (deployment) (rate(metric{filters}[window]))``; ``spec`` may be an extra role."""
    selector = f.select(spec, part, **match)
    return _sum(f.by() if by is None else by, f"rate({selector}[{window}])")


def quantile(f: Flavour, spec: MetricSpec, q: float, window: str = RATE_WINDOW,
             by: str | None = None) -> str:
    by = f.by("le") if by is None else ", ".join(x for x in ("le", by) if x)
    return f"histogram_quantile({q}, {rate(f, spec, '_bucket', by, window)})"


def mean(f: Flavour, spec: MetricSpec, by: str | None = None) -> str:
    return f"{rate(f, spec, '_sum', by)} / {rate(f, spec, '_count', by)}"


def percentiles(f: Flavour, spec: MetricSpec, qs=(0.5, 0.9, 0.99)) -> tuple[Query, ...]:
    return tuple(Query(quantile(f, spec, q), f"p{round(q * 100)} {f.legend()}") for q in qs)


def acceptance_rate(f: Flavour, by: str | None = None, window: str = RATE_WINDOW) -> str:
    return (f"{rate(f, names.SPEC_NUM_ACCEPTED_TOKENS, by=by, window=window)} / "
            f"{rate(f, names.SPEC_NUM_DRAFT_TOKENS, by=by, window=window)}")


def accepted_length(f: Flavour, by: str | None = None, window: str = RATE_WINDOW) -> str:
    return (f"1 + {rate(f, names.SPEC_NUM_ACCEPTED_TOKENS, by=by, window=window)} / "
            f"{rate(f, names.SPEC_NUM_DRAFTS, by=by, window=window)}")


def slo_share(f: Flavour, spec: MetricSpec, edge: float) -> str:
    """Share of requests at or under a bucket edge (``le`` written as the client writes it)."""
    le = floatToGoString(edge)
    return f"{rate(f, spec, '_bucket', le=le)} / {rate(f, spec, '_count')}"


def failed_share(f: Flavour, by: str | None = None, window: str = RATE_WINDOW) -> str:
    """Share of requests that failed on the server side.

    spectest: 5xx refusals (``request_errors``) plus requests that finished with reason
    ``error``, over all finished or refused requests; ``or`` unions the two counters (their label
    sets differ) so that either may be missing.  vLLM has no error counter: requests that did not
    finish with ``stop`` or ``length``.  ``or total * 0`` makes "no failures" read 0, not no data.
    """
    by = f.by() if by is None else by

    def raw(spec: MetricSpec, **match: str) -> str:
        return f"rate({f.select(spec, **match)}[{window}])"

    if f.has(names.REQUEST_ERRORS):
        failed = _sum(by, f"{raw(names.REQUEST_ERRORS, code='=~5..')} or "
                          f"{raw(names.REQUEST_SUCCESS, finished_reason='error')}")
        total = _sum(by, f"{raw(names.REQUEST_SUCCESS)} or {raw(names.REQUEST_ERRORS)}")
    else:
        failed = _sum(by, raw(names.REQUEST_SUCCESS, finished_reason="!~stop|length"))
        total = _sum(by, raw(names.REQUEST_SUCCESS))
    return f"({failed} or {total} * 0) / {total}"


def red_below(floor: float) -> tuple[tuple[float | None, str], ...]:
    """Colour steps: red under ``floor``, green from it up."""
    return ((None, "red"), (floor, "green"))


def at_request_end(f: Flavour) -> str:
    """A sentence for panels on counters a server only adds to when a request finishes."""
    if not f.server.counters_at_request_end:
        return ""
    return (f" {f.display} adds a request's counts when the request finishes, so rates step up "
            f"at request ends and read low while long requests run: compare over long ranges.")


PanelMaker = Callable[[], PanelSpec]


def row(title: str, *makers: PanelMaker, per_line: int = 3) -> RowSpec | None:
    """A row of the panels whose series the flavour exposes, spread over the width.

    A maker that queries a missing metric (``MissingMetric``) is left out; a row left with no
    panel is None.  Panels share a line ``per_line`` at a time (stats: all on one line).
    """
    panels = []
    for make in makers:
        try:
            panels.append(make())
        except MissingMetric:
            continue
    if not panels:
        return None
    n = len(panels) if panels[0].kind == "stat" else min(len(panels), per_line)
    return RowSpec(title, tuple(replace(p, width=24 // n) for p in panels))


def rows(*candidates: RowSpec | None) -> tuple[RowSpec, ...]:
    return tuple(r for r in candidates if r is not None)
