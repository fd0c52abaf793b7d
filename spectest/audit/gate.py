"""The verdict and what it is written to: exit code, JSON report, JUnit XML, human summary.

Owns: turning an :class:`~spectest.audit.run.AuditRun` into one outcome per check
(pass / fail / not run, a one-line summary and, on failure, a pointer at the likely cause) —
the base condition's checks, then each further condition's, named ``condition: check`` — the
"serving" outcome (the candidate failed a request the baseline served: a finding), the exit
code (0 pass, 1 drift found or the candidate failed, 2 could not run), the "worst prompts"
table, and the three files — ``report.json``, ``junit.xml`` (one test case per check, so any CI
shows which check failed) and ``summary.md`` (``summary``) — each written atomically.

Does not know: HTTP or statistics.
"""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spectest.audit import noise
from spectest.audit.run import AuditRun
from spectest.audit.summary import summary_text

SCHEMA = 1
TITLES = {"serving": "the candidate serves every request the baseline serves",
          "greedy": "greedy equality (temperature 0)",
          "logprobs": "logprob/KL agreement",
          "distribution": "sampled distribution (temperature > 0)"}
EXIT_PASS, EXIT_DRIFT, EXIT_CANNOT_RUN = 0, 1, 2


@dataclass(frozen=True)
class Outcome:
    check: str  # a base check's name, or "condition: check"
    status: str  # "pass" | "fail" | "not run" | "not reached"
    summary: str
    cause: str = ""
    details: dict = field(default_factory=dict)
    condition: str = "base"

    @property
    def title(self) -> str:
        return TITLES.get(self.check, self.check)


def outcomes(run: AuditRun) -> list[Outcome]:
    findings = run.findings or ([run.failure] if run.failure else [])
    out = [Outcome("serving", "fail", "; ".join(f.summary() for f in findings), "",
                   {**asdict(findings[0]), "findings": [asdict(f) for f in findings]})
           if findings else
           Outcome("serving", "pass", "every request was served") if run.cases and not run.error
           else Outcome("serving", "not run", run.error or "not run")]
    based = "base" in run.settings.planned
    for name in run.settings.checks:
        result = getattr(run, name)
        if result is None:
            why = ("not run: base is not among the conditions asked for" if not based else
                   "not run: the candidate failed a request (see serving)" if run.failure
                   else run.error or "not run")
            out.append(Outcome(name, "not run", why))
            continue
        cause = "" if result.passed else _cause(name, result)
        out.append(Outcome(name, "pass" if result.passed else "fail", result.reason(), cause,
                           _details(name, result)))
    for cond in run.conditions:
        checks = [c for c in cond.checks if c.check != "serving"]  # findings: in serving
        if not checks or cond.status in ("not run", "not reached"):
            out.append(Outcome(cond.name, cond.status, cond.reason or cond.status,
                               condition=cond.name, details={"evidence": cond.evidence}))
        for c in checks:
            out.append(Outcome(f"{cond.name}: {c.check}", c.status, c.summary, c.cause,
                               {"p_value": c.p_value, "alpha": c.alpha,
                                "reproducer": c.reproducer, **dict(c.details)}, cond.name))
    return out


def _cause(name: str, result) -> str:
    if name == "greedy":
        return result.failures[0].cause if result.failures else ""
    return result.cause()


def _details(name: str, result) -> dict:
    if name == "greedy":
        return {"prompts": result.prompts, "exact": result.exact,
                "exact_match_rate": result.exact_match_rate,
                "tie_tolerance_nats": result.tie_tolerance,
                "max_divergences": result.max_failures,
                "candidate_drafts": result.candidate_drafts,
                "ties": [asdict(d) for d in result.ties],
                "divergences": [asdict(d) for d in result.failures]}
    if name == "logprobs":
        return {"kl": "KL(baseline || candidate) on the shared top-n tokens plus one rest "
                      "bucket (a lower bound on the full-vocabulary KL)",
                "thresholds": asdict(result.thresholds), "all": asdict(result.all),
                "first_token": asdict(result.first), "later_tokens": asdict(result.later),
                "worst_positions": [asdict(d) for d in result.worst]}
    two = result.control is not None
    return {"method": ("the candidate's tokens against continuations the baseline sampled "
                       "itself, both scored by the baseline: permutation test over whole "
                       "continuations within each prompt of the surprise shift, the two-sample "
                       "Kolmogorov-Smirnov distance of the PIT values, the probability-bin "
                       "calibration difference and the rate of tokens outside the support, "
                       "Bonferroni" if two else
                       "randomized PIT of the candidate's tokens under the baseline's sampling "
                       "distribution; surprise z-test + Kolmogorov-Smirnov + probability-bin "
                       "calibration (Wald), Bonferroni over the three"),
            "control": None if not two else {
                "why": "the baseline's scoring route is not exactly the distribution it samples "
                       "from (noise floor), so the test compares like with like",
                "baseline_tokens_vs_its_scoring": asdict(result.control),
                "baseline_violations": result.control_violations},
            "sampling": asdict(result.spec), "alpha": result.alpha,
            "tested_tokens": result.tested, "skipped_tokens": result.skipped,
            "test": asdict(result.pit), "first_token": asdict(result.first),
            "later_tokens": asdict(result.later),
            "effective_temperature": result.temperature_fit,
            "expected_effective_temperature": result.temperature_reference,
            "violations": len(result.violations),
            "violation_examples": [asdict(v) for v in result.violations[:20]]}


def exit_code(run: AuditRun, outs: list[Outcome]) -> int:
    """1 when anything failed; 2 when the audit, a base check or a condition the user named
    could not run (a profile's condition the server cannot meet is reported, not failed)."""
    if any(o.status == "fail" for o in outs):
        return EXIT_DRIFT
    named = set(run.settings.conditions)
    blocking = [o for o in outs if o.check != "serving" and (
        o.condition == "base" and "base" in run.settings.planned or o.condition in named)]
    if run.error or any(o.status not in ("pass",) for o in blocking):
        return EXIT_CANNOT_RUN
    return EXIT_PASS


def reason(run: AuditRun, outs: list[Outcome]) -> str:
    failed = [o for o in outs if o.status == "fail"]
    if failed:
        return "; ".join(f"{o.check}: {o.summary}" for o in failed)
    if run.error:
        return run.error
    return "all checks passed"


def worst_prompts(run: AuditRun, n: int = 5) -> list[dict]:
    """Prompts ranked by how badly they fail: real greedy divergence, support violations,
    largest KL, then the smallest per-prompt distribution p-value (descriptive, not a test:
    a diffuse drift fails the pooled test without any single prompt standing out)."""
    rows = {c.id: {"id": c.id, "category": c.category, "problems": [], "key": [0, 0, 0.0, 0.0]}
            for c in run.cases}
    if run.greedy:
        for d in run.greedy.failures:
            rows[d.prompt_id]["key"][0] = 1
            margin = "?" if d.margin is None else f"{d.margin:.3g}"
            rows[d.prompt_id]["problems"].append(
                f"greedy diverges at position {d.index + 1} (margin {margin} nats)")
    if run.distribution:
        for v in run.distribution.violations:
            rid = run.cases[v.prompt].id
            rows[rid]["key"][1] += 1
        for i, p in enumerate(run.distribution.prompt_p):
            if i < len(run.cases):
                rows[run.cases[i].id]["key"][3] = -math.log10(max(p, 1e-300))
                if p < 1e-3:
                    rows[run.cases[i].id]["problems"].append(
                        f"its sampled tokens alone: p = {p:.2g}")
    for d in run.diffs:  # KL counts only above its threshold; below it is float noise
        row = rows.get(d.prompt_id)
        if row is not None and d.kl > max(row["key"][2], run.settings.max_kl):
            row["key"][2] = d.kl
    out = []
    for row in sorted(rows.values(), key=lambda r: tuple(-x for x in r["key"]))[:n]:
        key = row.pop("key")
        if key[1]:
            row["problems"].append(f"{key[1]} token(s) outside the baseline's support")
        if key[2]:
            row["problems"].append(f"max KL {key[2]:.3g}")
        row["max_kl_above_threshold"], row["distribution_p"] = key[2], 10 ** -key[3]
        out.append(row)
    return out


def build_report(run: AuditRun, outs: list[Outcome], started: float, duration: float) -> dict:
    code = exit_code(run, outs)
    return {"spectest_audit": SCHEMA,
            "verdict": ("candidate failed" if run.findings or run.failure else
                        {EXIT_PASS: "pass", EXIT_DRIFT: "drift",
                         EXIT_CANNOT_RUN: "could not run"}[code]),
            "exit_code": code, "reason": reason(run, outs), "interrupted": run.interrupted,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "duration_s": round(duration, 3), "endpoints": run.endpoints,
            "settings": run.settings.public(), "notes": run.notes,
            "candidate_speculation": run.speculation, "timings_s": run.timings,
            "routes": run.routes, "coverage": run.coverage,
            "noise_floor": (None if run.noise_floor is None else
                            {**asdict(run.noise_floor), "factor": noise.FACTOR}),
            "tolerances_applied": run.tolerances,
            "prompts": [{"id": c.id, "category": c.category, "tokens": len(c.ids)}
                        for c in run.cases],
            "checks": {o.check: {"title": o.title, "status": o.status, "condition": o.condition,
                                 "summary": o.summary, "cause": o.cause, **o.details}
                       for o in outs},
            "profile": run.settings.profile, "conditions_planned": list(run.settings.planned),
            "statistical_tests": run.tests, "alpha_each": run.alpha,
            "conditions": [c.public() for c in run.conditions],
            "reproducers": list(run.reproducers),
            "worst_prompts": worst_prompts(run) if run.cases else []}


def junit_xml(report: dict, outs: list[Outcome]) -> bytes:
    suite = ET.Element("testsuite", name="spectest-audit", tests=str(len(outs)),
                       failures=str(sum(o.status == "fail" for o in outs)),
                       errors=str(sum(o.status == "not run" and o.condition == "base"
                                      for o in outs)),
                       skipped=str(sum(o.status in ("not run", "not reached") and
                                       o.condition != "base" for o in outs)),
                       time=f"{report['duration_s']:.3f}", timestamp=report["started_at"])
    for o in outs:
        case = ET.SubElement(suite, "testcase", classname="spectest.audit", name=o.check)
        if o.status == "fail":
            el = ET.SubElement(case, "failure", message=o.summary, type="drift")
            el.text = f"{o.title}: {o.summary}\nlikely cause: {o.cause}"
        elif o.status == "not run" and o.condition == "base":
            ET.SubElement(case, "error", message=o.summary, type="could-not-run")
        elif o.status in ("not run", "not reached"):  # a condition the server cannot meet
            ET.SubElement(case, "skipped", message=f"{o.status}: {o.summary}")
        if o.status != "not run":
            out = ET.SubElement(case, "system-out")
            out.text = json.dumps(_finite(report["checks"].get(o.check, {})),
                                  default=_json_default, indent=1)[:20000]
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _json_default(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def write_atomic(path: Path, data: bytes) -> None:
    from spectest import files  # the shared writer: the old file stays if writing fails
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, data)


def write_all(out_dir: Path, report: dict, outs: list[Outcome]) -> dict[str, Path]:
    paths = {"json": out_dir / "report.json", "junit": out_dir / "junit.xml",
             "summary": out_dir / "summary.md"}
    text = json.dumps(_finite(report), indent=2, default=_json_default) + "\n"
    write_atomic(paths["json"], text.encode())
    write_atomic(paths["junit"], junit_xml(report, outs))
    write_atomic(paths["summary"], summary_text(report).encode())
    return paths


def _finite(obj):
    """JSON has no inf/nan: write them as strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
