"""The human summary of an audit (``summary.md``): the verdict first, then why.

Owns: :func:`summary_text` — the verdict line (with the profile's conditions, and which could
not run or were not reached), the endpoints, the candidate's speculation, the noise floor, the
false-alarm rate over the audit's statistical tests, one line per base check with its figures,
likely cause and route, a section per condition (its evidence, its checks, the reproducer of
each failure), the findings, the reproducers and how to replay them, and the worst prompts.

Does not know: how checks are made; it reads the report dict ``gate.build_report`` built.
"""

from __future__ import annotations

import json

def summary_text(report: dict) -> str:
    verdict = {"pass": "PASS", "drift": "DRIFT FOUND", "could not run": "COULD NOT RUN",
               "candidate failed": "CANDIDATE FAILED"}
    lines = [f"# spectest audit: {verdict[report['verdict']]} (exit {report['exit_code']})"
             f"{_profile_line(report)}", ""]
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
    tests = report.get("statistical_tests") or 0
    if tests > 1:
        lines.append(f"- {tests} statistical tests, each at alpha {report['alpha_each']:.2g} "
                     f"(= {report['settings']['alpha']:g} / {tests}, Bonferroni): a correct "
                     f"candidate fails at most {report['settings']['alpha']:g} of audits")
    lines.append("")
    routes = report.get("routes") or {}
    for name, c in report["checks"].items():
        if c.get("condition", "base") != "base":
            continue
        if c["status"] == "not run":
            lines.append(f"- **[NOT RUN]** {c['title']}")
            continue
        lines.append(f"- **[{c['status'].upper()}]** {c['title']}: {c['summary']}")
        if c["cause"]:
            lines.append(f"  - likely cause: {c['cause']}")
        if routes.get(name):
            lines.append(f"  - route: {routes[name]}")
    lines += _conditions(report)
    if report["verdict"] == "could not run":
        lines += ["", f"Could not run: {report['reason']}"]
    if report.get("reproducers"):
        lines += ["", f"Reproducers ({len(report['reproducers'])}; replay them against both "
                      f"servers with `spectest replay FILE`):"]
        lines += [f"- `{path}`" for path in report["reproducers"]]
    worst = [w for w in report["worst_prompts"] if w["problems"]]
    if worst:
        lines += ["", "Worst prompts:"]
        for w in worst:
            lines.append(f"1. `{w['id']}` ({w['category']}): {'; '.join(w['problems'])}")
    return "\n".join(lines) + "\n"




def _profile_line(report: dict) -> str:
    planned = report.get("conditions_planned") or ["base"]
    if planned == ["base"]:
        return ""
    short = [c["name"] for c in report.get("conditions") or []
             if c["status"] in ("not run", "not reached")]
    return (f" — {len(planned)} conditions ({', '.join(planned)})"
            + (f"; {', '.join(short)} not run or not reached: see below" if short else ""))


def _conditions(report: dict) -> list[str]:
    conditions = report.get("conditions") or []
    if not conditions:
        return []
    lines = ["", "## Conditions", ""]
    for cond in conditions:
        head = f"### [{cond['status'].upper()}] {cond['name']} — {cond['title']}"
        lines.append(head)
        if cond["reason"]:
            lines.append(f"- why: {cond['reason']}")
        for item in cond["evidence"]:
            lines.append(f"- reached: {item}")
        for note in cond["notes"]:
            lines.append(f"- note: {note}")
        for check in cond["checks"]:
            p = "" if check["p_value"] is None else \
                f" (p = {check['p_value']:.3g} at {check['alpha']:.2g})"
            lines.append(f"- **[{check['status'].upper()}]** {check['check']}: "
                         f"{check['summary']}{p}")
            if check["cause"]:
                lines.append(f"  - likely cause: {check['cause']}")
            if check["reproducer"]:
                lines.append(f"  - reproducer: `{check['reproducer']}`")
        lines.append(f"- ({cond['seconds']:.0f} s)")
        lines.append("")
    return lines
