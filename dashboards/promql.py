"""Read PromQL back out of the generated dashboards and the alert rule files, for the checks.

This module owns: listing every panel query and template-variable query of a dashboard JSON,
listing every expression of a Prometheus rule file, substituting Grafana variables so that an
expression can be sent to a plain Prometheus, and finding the metric names an expression uses.
It does not evaluate anything (``tests/e2e/prometheus_harness.py`` does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import yaml

from spectest.flavours import FLAVOURS

# $var, ${var}, ${var:format}, [[var]] — Grafana's variable syntaxes.
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
# A metric name under any flavour's prefix (spectest:, vllm:, sglang:, llamacpp:).
PREFIXES = tuple(f.prefix for f in FLAVOURS)
_METRIC = re.compile(r"(?<![\w:])((?:%s)[A-Za-z0-9_:]+)" % "|".join(map(re.escape, PREFIXES)))
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$", re.S)


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # uid
    panel: str  # title
    ref_id: str
    expr: str
    instant: bool


@dataclass(frozen=True)
class RuleExpr:
    group: str
    name: str  # alert or record name
    expr: str
    is_alert: bool
    rule: dict  # the rule as written (labels, annotations, for)


def _walk_panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels") or [])  # collapsed rows nest panels


def panel_queries(board: dict) -> list[PanelQuery]:
    """Every Prometheus target of every panel, rows included."""
    out = []
    for panel in _walk_panels(board.get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                out.append(PanelQuery(board["uid"], panel["title"], target.get("refId", ""),
                                      target["expr"], bool(target.get("instant"))))
    return out


def variable_queries(board: dict) -> dict[str, str]:
    """``{variable name: query}`` for the query-type template variables."""
    return {v["name"]: v["query"] for v in board.get("templating", {}).get("list", [])
            if v.get("type") == "query"}


def parse_label_values(query: str) -> tuple[str, str]:
    """``label_values(selector, label)`` → (selector, label)."""
    m = _LABEL_VALUES.match(query)
    if not m:
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return m.group(1).strip(), m.group(2)


def rule_expressions(path: Path) -> list[RuleExpr]:
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    out = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            out.append(RuleExpr(group["name"], name, rule["expr"], "alert" in rule, rule))
    return out


def variables_in(expr: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(expr)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace Grafana variables by ``values``; an unknown variable is an error, not a guess."""
    def one(m: re.Match) -> str:
        name = next(g for g in m.groups() if g)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return values[name]
    return _VARIABLE.sub(one, expr)


def metric_names(expr: str) -> set[str]:
    """Prefixed metric names an expression mentions (``spectest:…``, ``llamacpp:…``, …)."""
    return set(_METRIC.findall(expr))
