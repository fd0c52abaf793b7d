"""The verdict and what it is written to: exit code, JSON report, JUnit XML, human summary.

Owns: turning an :class:`~spectest.audit.runner.AuditRun` into one outcome per check
(pass / fail / not run, a one-line summary and, on failure, a pointer at the likely cause),
the "serving" outcome (the candidate failed a request the baseline served: a finding), the exit
code (0 pass, 1 drift found or the candidate failed, 2 could not run), the "worst prompts" table, and the
three files — ``report.json``, ``junit.xml`` (one test case per check, so any CI shows which
check failed) and ``summary.md`` — each written atomically (temp file + ``os.replace``).

Does not know: HTTP or statistics.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spectest.audit import noise
from spectest.audit.runner import AuditRun

SCHEMA = 1
TITLES = {"serving": "the candidate serves every request the baseline serves",
          "greedy": "greedy equality (temperature 0)",
          "logprobs": "logprob/KL agreement",
          "distribution": "sampled distribution (temperature > 0)"}
EXIT_PASS, EXIT_DRIFT, EXIT_CANNOT_RUN = 0, 1, 2


@dataclass(frozen=True)
class Outcome:
    check: str
    status: str  # "pass" | "fail" | "not run"
    summary: str
    cause: str = ""
    details: dict = field(default_factory=dict)


def outcomes(run: AuditRun) -> list[Outcome]:
    failure = run.failure
    out = [Outcome("serving", "fail", failure.summary(), "", asdict(failure)) if failure else
           Outcome("serving", "pass", "every request was served") if run.cases and not run.error
           else Outcome("serving", "not run", run.error or "not run")]
    for name in run.settings.checks:
        result = getattr(run, name)
        if result is None:
            why = ("not run: the candidate failed a request (see serving)" if failure
                   else run.error or "not run")
            out.append(Outcome(name, "not run", why))
            continue
        cause = "" if result.passed else _cause(name, result)
        out.append(Outcome(name, "pass" if result.passed else "fail", result.reason(), cause,
                           _details(name, result)))
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
    if any(o.status == "fail" for o in outs):
        return EXIT_DRIFT
    outs = [o for o in outs if o.check != "serving"]
    if run.error or any(o.status != "pass" for o in outs):
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
            "verdict": ("candidate failed" if run.failure else
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
            "checks": {o.check: {"title": TITLES[o.check], "status": o.status,
                                 "summary": o.summary, "cause": o.cause, **o.details}
                       for o in outs},
            "worst_prompts": worst_prompts(run) if run.cases else []}


def summary_text(report: dict) -> str:
    verdict = {"pass": "PASS", "drift": "DRIFT FOUND", "could not run": "COULD NOT RUN",
               "candidate failed": "CANDIDATE FAILED"}
    lines = [f"# spectest audit: {verdict[report['verdict']]} (exit {report['exit_code']})", ""]
    for role, ep in report["endpoints"].items():
        extra = f" {json.dumps(ep['extra'])}" if ep.get("extra") else ""
        lines.append(f"- {role}: {ep['url']} model {ep.get('model')!r}{extra}")
    spec = report["candidate_speculation"]
    for phase, t in spec.items():
        if t.get("reported"):
            rate = t["acceptance_rate"]
            rounds = ("rounds not reported" if t["drafts"] is None
                      else f"{t['drafts']} draft rounds")
            lines.append(f"- candidate speculation ({phase}): {t['draft_tokens']} draft tokens, "
                         f"{t['accepted_tokens']} accepted "
                         f"({'n/a' if rate is None else f'{100 * rate:.1f}%'}), {rounds}")
            if not t["draft_tokens"]:
                lines.append("  - WARNING: the candidate never speculated; the audit compared "
                             "the target with itself")
    floor = report.get("noise_floor")
    if floor and floor["positions"]:
        tol = report.get("tolerances_applied") or {}
        shaped = (f" ({floor['shaped_positions']} of them read in verification-shaped "
                  f"batches: max KL {floor['shaped_max_kl']:.2g})"
                  if floor.get("shaped_positions") else "")
        lines.append(f"- baseline noise floor (the baseline re-scoring its own greedy runs): "
                     f"{floor['positions']} positions{shaped}, max |Δlogprob| "
                     f"{floor['max_abs_logprob']:.3g}, max KL {floor['max_kl']:.2g}; tolerances "
                     f"applied: tie {tol.get('tie_tolerance', 0):.3g} nats, max |Δlogprob| "
                     f"{tol.get('max_abs_logprob', 0):.3g}, max KL {tol.get('max_kl', 0):.2g}")
    coverage = report.get("coverage") or {}
    if coverage.get("candidate_unreported"):
        lines.append(f"- the candidate reported no logprobs for "
                     f"{coverage['candidate_unreported']} of {coverage['logprob_positions']} "
                     f"generated positions (tokens accepted from a draft); the logprob check "
                     f"covers the rest")
    if coverage.get("logprob_unmeasured"):
        lines.append(f"- {coverage['logprob_unmeasured']} sampled tokens were past the top-n the "
                     f"baseline reports when it scores by generation: their logprob difference "
                     f"is not measured (KL on the shared top-n still is)")
    if coverage.get("left_out_tokens"):
        lines.append(f"- {coverage['left_out_tokens']} generated tokens were left out: from a "
                     f"character the server reported as one logprobs entry although it spans "
                     f"several tokens (llama.cpp: the entry carries the figures of the token "
                     f"that completed it) on, its entries no longer line up with the tokens")
    for key, what in (("baseline_unscored", "logprob positions"),
                      ("distribution_unscored", "sampled tokens")):
        if coverage.get(key):
            lines.append(f"- {coverage[key]} {what} could not be scored by the baseline "
                         f"(a prefix re-tokenised differently or not sendable as text)")
    lines.append("")
    routes = report.get("routes") or {}
    for name, c in report["checks"].items():
        if c["status"] == "not run":
            lines.append(f"- **[NOT RUN]** {c['title']}")
            continue
        lines.append(f"- **[{c['status'].upper()}]** {c['title']}: {c['summary']}")
        if c["cause"]:
            lines.append(f"  - likely cause: {c['cause']}")
        if routes.get(name):
            lines.append(f"  - route: {routes[name]}")
    if report["verdict"] == "could not run":
        lines += ["", f"Could not run: {report['reason']}"]
    worst = [w for w in report["worst_prompts"] if w["problems"]]
    if worst:
        lines += ["", "Worst prompts:"]
        for w in worst:
            lines.append(f"1. `{w['id']}` ({w['category']}): {'; '.join(w['problems'])}")
    return "\n".join(lines) + "\n"


def junit_xml(report: dict, outs: list[Outcome]) -> bytes:
    suite = ET.Element("testsuite", name="spectest-audit", tests=str(len(outs)),
                       failures=str(sum(o.status == "fail" for o in outs)),
                       errors=str(sum(o.status == "not run" for o in outs)),
                       time=f"{report['duration_s']:.3f}", timestamp=report["started_at"])
    for o in outs:
        case = ET.SubElement(suite, "testcase", classname="spectest.audit", name=o.check)
        if o.status == "fail":
            el = ET.SubElement(case, "failure", message=o.summary, type="drift")
            el.text = f"{TITLES[o.check]}: {o.summary}\nlikely cause: {o.cause}"
        elif o.status == "not run":
            ET.SubElement(case, "error", message=o.summary, type="could-not-run")
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
