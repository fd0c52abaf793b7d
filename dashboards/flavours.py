"""Which server a dashboard is built for: the flavour's series, plus the dashboard-only choices.

Names and semantics — prefix, which metrics of the table (``spectest.telemetry.names``) a server
exposes and under which sample name, its labels, its extra series, which labels tell its
deployments apart — are one row of ``spectest.flavours``; this module does not repeat them.  It
derives from the row what a dashboard needs — the template variables (in display order: the
deployment's labels, the drafter's, ``workload`` where the server splits by it) and the labels
every curve is split by (the deployment's and the drafter's) — and builds the PromQL *selectors*
from both.  It knows nothing about panels or Grafana JSON.

Each flavour is a separate build, not a variable: vLLM exposes a subset of the table with the
labels ``model_name`` and ``engine``; llama.cpp a smaller subset with no labels at all (a
deployment is the scrape target, Prometheus's ``job`` / ``instance``).  A prefix variable alone
would leave panels querying labels and metrics that do not exist, so each flavour gets its own
JSON files, and a panel whose metric a flavour lacks is left out of its build (``MissingMetric``).

Adding a server: one row in ``spectest/flavours.py`` (with its ``deployment_labels``); a row
without them (SGLang: a gauge, not the counters) gets no dashboards.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectest import flavours as server_flavours
from spectest.telemetry import names
from spectest.telemetry.names import MetricSpec

# Grafana's rate window: at least four scrape intervals, adapts to the zoom level.
RATE_WINDOW = "$__rate_interval"
# The whole time range of the dashboard, for the summary stats in the top row.
RANGE_WINDOW = "$__range"

# Labels Prometheus attaches to every scraped series, whatever the server exposes.
SCRAPE_LABELS = ("job", "instance")
# The table's identity labels: a server has them only where the table says a metric has them.
# Any other label of a flavour's row (vLLM's ``engine``) is on every series.
_IDENTITY = frozenset(names.REQUEST_LABELS + names.ENGINE_LABELS)
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")

class MissingMetric(KeyError):
    """A panel asked for a series the flavour does not expose: the panel is left out."""


@dataclass(frozen=True)
class Flavour:
    """One server flavour as the dashboards see it."""

    server: server_flavours.Flavour
    variables: tuple[str, ...]  # label template variables, in display order
    series_by: tuple[str, ...]  # labels every curve is split by

    @property
    def key(self) -> str:  # file-name prefix and uid prefix
        return self.server.key

    @property
    def display(self) -> str:  # shown in dashboard titles
        return self.server.display

    @property
    def prefix(self) -> str:
        return self.server.prefix

    def has(self, *specs: MetricSpec) -> bool:
        return self.server.has(*specs)

    def has_extra(self, *roles: str) -> bool:
        return all(role in self.server.extras for role in roles)

    def sample_names(self) -> set[str]:
        """Every sample name of the server's series the dashboards know, as scraped."""
        out = set(self.server.extras.values())
        for spec in names.ALL:
            if self.has(spec):
                parts = _HISTOGRAM_PARTS if spec.kind == "histogram" else ("",)
                out |= {self.metric(spec, part) for part in parts}
        return out

    def labels_of(self, spec: MetricSpec) -> tuple[str, ...]:
        """The labels the server itself puts on ``spec``'s series (not Prometheus's)."""
        own = tuple(label for label in self.server.labels
                    if label not in _IDENTITY or label in spec.labels)
        return own + tuple(label for label in spec.labels if label not in _IDENTITY)

    def metric(self, spec: MetricSpec, part: str = "") -> str:
        """The scraped sample name: counters with ``_total``, histograms need a part."""
        sample = self.server.sample(spec)
        if sample is None:
            raise MissingMetric(f"{self.display} does not expose {spec.name}")
        if spec.kind == "histogram":
            if part not in _HISTOGRAM_PARTS:
                raise ValueError(f"{spec.name} is a histogram: part must be one of "
                                 f"{_HISTOGRAM_PARTS}, got {part!r}")
        elif part:
            raise ValueError(f"{spec.name} is a {spec.kind}: no part {part!r}")
        return sample + part

    def extra(self, role: str) -> str:
        """The sample name of one of the flavour's extra series (``Flavour.extras``)."""
        try:
            return self.server.extras[role]
        except KeyError:
            raise MissingMetric(f"{self.display} has no {role} series") from None

    def _selector(self, metric: str, labels: tuple[str, ...], part: str,
                  match: dict[str, str]) -> str:
        labels = labels + SCRAPE_LABELS
        matchers = [f'{v}=~"${v}"' for v in self.variables if v in labels]
        for label, value in match.items():
            if label not in labels and not (label == "le" and part == "_bucket"):
                raise ValueError(f"{metric} has no label {label!r}")
            op, value = (value[:2], value[2:]) if value[:2] in ("=~", "!~", "!=") else ("=", value)
            matchers.append(f'{label}{op}"{value}"')
        return f"{metric}{{{', '.join(matchers)}}}"

    def select(self, spec: MetricSpec | str, part: str = "", **match: str) -> str:
        """``name{var=~"$var", ..., extra}``: every template variable the series carries.

        ``spec`` is a metric of the table or the role of an extra series.  ``match`` values are
        equality matches unless they start with an operator (``code="=~5.."``,
        ``finished_reason="!~stop|length"``).
        """
        if isinstance(spec, str):
            return self._selector(self.extra(spec), (), part, match)
        return self._selector(self.metric(spec, part), self.labels_of(spec), part, match)

    def by(self, *extra: str) -> str:
        """The ``by (...)`` label list for curves split per deployment, plus ``extra``."""
        return ", ".join(self.series_by + extra)

    def legend(self, *extra: str) -> str:
        return " / ".join("{{%s}}" % label for label in self.series_by + extra)

    def variable_query(self, label: str) -> str:
        """Grafana ``label_values`` query for a template variable, chained on the ones before."""
        before = self.variables[: self.variables.index(label)]
        matchers = ", ".join(f'{v}=~"${v}"' for v in before)
        metric = self.metric(names.GENERATION_TOKENS)
        selector = f"{metric}{{{matchers}}}" if matchers else metric
        return f"label_values({selector}, {label})"


def for_server(server: server_flavours.Flavour) -> Flavour:
    series_by = server.drafter_labels
    return Flavour(server, series_by + (("workload",) if server.workload_label else ()),
                   series_by)


FLAVOURS: tuple[Flavour, ...] = tuple(for_server(f) for f in server_flavours.FLAVOURS
                                      if f.deployment_labels)
BY_KEY = {f.key: f for f in FLAVOURS}
SPECTEST, VLLM, LLAMACPP = BY_KEY["spectest"], BY_KEY["vllm"], BY_KEY["llamacpp"]
