"""Which engine a dashboard is built for: metric prefix, label set, template variables.

This module owns the mapping from the one metric table (``spectest.telemetry.names``) to the
series an engine actually exposes, and the PromQL *selectors* built from it.  It knows nothing
about panels or Grafana JSON.

The vLLM flavour is a second build, not a variable: vLLM exposes a subset of the table, under the
``vllm:`` prefix and with the labels ``model_name`` and ``engine`` instead of spectest's
``model_name`` / ``drafter`` / ``workload``.  A prefix variable alone would leave panels querying
labels and metrics that do not exist, so each flavour gets its own JSON files.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectest.telemetry import names
from spectest.telemetry.names import MetricSpec

# Grafana's rate window: at least four scrape intervals, adapts to the zoom level.
RATE_WINDOW = "$__rate_interval"
# The whole time range of the dashboard, for the summary stats in the top row.
RANGE_WINDOW = "$__range"

# The documented ``vllm:`` counterparts (shared/REFERENCE.md, "Speculative-decoding metrics as
# vLLM exposes them" and "Serving metrics").  Every other entry of names.ALL is spectest-only.
VLLM_METRICS: tuple[MetricSpec, ...] = (
    names.SPEC_NUM_DRAFTS, names.SPEC_NUM_DRAFT_TOKENS, names.SPEC_NUM_ACCEPTED_TOKENS,
    names.SPEC_NUM_ACCEPTED_PER_POS,
    names.TTFT, names.ITL, names.TPOT, names.E2E, names.QUEUE, names.PREFILL, names.DECODE,
    names.RUNNING, names.WAITING, names.KV_USAGE,
    names.PROMPT_TOKENS, names.GENERATION_TOKENS, names.PREEMPTIONS, names.REQUEST_SUCCESS,
)
VLLM_BASE_LABELS = ("model_name", "engine")

_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Flavour:
    """One engine's view of the metric table."""

    key: str  # file-name prefix and uid prefix
    display: str  # shown in dashboard titles
    prefix: str  # metric-name prefix, with the colon
    metrics: frozenset[str]  # names.py names (``spectest:`` form) this engine exposes
    variables: tuple[str, ...]  # label template variables, in display order
    series_by: tuple[str, ...]  # labels every curve is split by
    base_labels: tuple[str, ...] | None  # replaces the table's identity labels (vLLM)

    def has(self, *specs: MetricSpec) -> bool:
        return all(s.name in self.metrics for s in specs)

    def labels_of(self, spec: MetricSpec) -> tuple[str, ...]:
        """The labels the engine puts on ``spec``'s series."""
        if self.base_labels is None:
            return spec.labels
        extra = tuple(label for label in spec.labels if label not in names.REQUEST_LABELS)
        return self.base_labels + extra

    def metric(self, spec: MetricSpec, part: str = "") -> str:
        """The scraped sample name: counters gain ``_total``, histograms need a part."""
        if not self.has(spec):
            raise KeyError(f"{self.display} does not expose {spec.name}")
        if spec.kind == "histogram":
            if part not in _HISTOGRAM_PARTS:
                raise ValueError(f"{spec.name} is a histogram: part must be one of "
                                 f"{_HISTOGRAM_PARTS}, got {part!r}")
        elif part:
            raise ValueError(f"{spec.name} is a {spec.kind}: no part {part!r}")
        return names.renamed(spec, self.prefix) + ("_total" if spec.kind == "counter" else part)

    def select(self, spec: MetricSpec, part: str = "", **match: str) -> str:
        """``name{var=~"$var", ..., extra}``: every template variable the series carries.

        ``match`` values are equality matches unless they start with an operator
        (``code="=~5.."``, ``finished_reason="!~stop|length"``).
        """
        matchers = [f'{v}=~"${v}"' for v in self.variables if v in self.labels_of(spec)]
        for label, value in match.items():
            if label not in self.labels_of(spec) and not (label == "le" and part == "_bucket"):
                raise ValueError(f"{spec.name} has no label {label!r}")
            op, value = (value[:2], value[2:]) if value[:2] in ("=~", "!~", "!=") else ("=", value)
            matchers.append(f'{label}{op}"{value}"')
        return f"{self.metric(spec, part)}{{{', '.join(matchers)}}}"

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


SPECTEST = Flavour(
    key="spectest",
    display="spectest",
    prefix=names.PREFIX,
    metrics=frozenset(m.name for m in names.ALL),
    variables=("model_name", "drafter", "workload"),
    series_by=("model_name", "drafter"),
    base_labels=None,
)

VLLM = Flavour(
    key="vllm",
    display="vLLM",
    prefix="vllm:",
    metrics=frozenset(m.name for m in VLLM_METRICS),
    variables=("model_name",),
    series_by=("model_name",),
    base_labels=VLLM_BASE_LABELS,
)

FLAVOURS: tuple[Flavour, ...] = (SPECTEST, VLLM)
