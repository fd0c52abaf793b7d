"""The base condition: the audit every profile runs, and the preflight before it.

Owns: the preflight (both servers answer, their routes are probed — see ``scoring`` — and they
serve the same model; prompts → token ids), the temperature-0 phase (candidate and baseline
generate, the baseline scores the candidate's output, the noise floor widens the tolerances)
and the sampled phase (the sampling ladder, then ``samples_per_prompt`` seeded continuations per
prompt from the candidate, each scored by the baseline, and where needed as many from the
baseline itself), feeding ``greedy``, ``logprobs`` and ``distribution``, with a record per
check of the route it ran on and the positions it could not use; a reproducer for each check
that fails. Fresh prompts of at most ``--max-prompt-tokens`` tokens, ``--greedy-tokens`` greedy
tokens, one sampling setting, no other traffic: the other conditions (``conditions``) start
from what this one settles.

Does not know: report formats or exit codes (``gate``), statistics (the check modules), the
other conditions.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, replace

import numpy as np

from spectest.audit import collect, distribution_check, failures, greedy, logprobs, noise, scoring
from spectest.audit.client import Client, Routes
from spectest.audit.distribution import SamplingSpec
from spectest.audit.prompts import tokenize
from spectest.audit.run import AuditRun
from spectest.audit.samples import AuditError, PromptCase
from spectest.audit.settings import AuditSettings


async def preflight(s: AuditSettings, cand: Client, base: Client, records: list,
                    result: AuditRun) -> None:
    """Both servers answer and serve the same model; their routes; the prompts as ids."""
    t0 = time.perf_counter()
    listed = await asyncio.gather(cand.models(), base.models())
    await asyncio.gather(cand.resolve_model(listed[0]), base.resolve_model(listed[1]))
    ids = await scoring.probe(base, listed[1], s.scoring, s.prompt_format)
    await scoring.probe(cand, listed[0], s.scoring, s.prompt_format, probe_ids=ids)
    for c in (cand, base):
        slots = await c.fit_to_server()
        if slots is not None:
            result.notes.append(f"the {c.role} ({c.routes.name}) runs {slots} request(s) at "
                                f"once: {slots} in flight to it, not --concurrency "
                                f"{s.concurrency} (queued requests would wait out the "
                                f"{s.timeout:g} s timeout)")
        result.endpoints[c.role]["model"] = c.model
        result.endpoints[c.role]["server"] = c.routes.name
        result.endpoints[c.role]["routes"] = _describe(c.routes)
    result.cases = await tokenize(records, base, s.max_prompt_tokens)
    await _same_model(cand, base, result.cases[:3], s)
    result.timings["preflight_s"] = time.perf_counter() - t0
    _record_routes(result, cand.routes, base.routes, s)
    result.tolerances = {"tie_tolerance": s.tie_tolerance, **asdict(s.logprob_thresholds)}


def tolerances(result: AuditRun, s: AuditSettings) -> tuple[logprobs.Thresholds, float]:
    """The thresholds and tie tolerance the audit settled (after the noise floor)."""
    applied = {k: v for k, v in result.tolerances.items() if k != "tie_tolerance"}
    return (logprobs.Thresholds(**applied) if applied else s.logprob_thresholds,
            result.tolerances.get("tie_tolerance", s.tie_tolerance))


async def greedy_phase(s: AuditSettings, cand: Client, base: Client, result: AuditRun, saver,
                       cases: list[PromptCase] | None = None, judge: bool = True) -> None:
    """Both servers' greedy runs, the noise floor and the tolerances it widens; with
    ``judge``, the greedy check (and its reproducer). ``cases``: these prompts (default: all;
    fewer when the base condition is not run and only the tolerances are wanted)."""
    cases = result.cases if cases is None else cases
    t0 = time.perf_counter()
    bar = collect.progress_bar(s, len(cases) * 3, "greedy")
    runs = await asyncio.gather(*(collect.greedy_pair(cand, base, c, s, bar) for c in cases))
    bar.close()
    c_out, b_out, scored = (list(x) for x in zip(*runs))
    result.greedy_runs = c_out
    thresholds, tie_tol = s.logprob_thresholds, s.tie_tolerance
    if s.noise_floor:
        result.noise_floor = await noise.measure(base, cases, b_out, s.logprobs,
                                                 s.tie_tolerance)
        thresholds, tie_tol = result.noise_floor.widen(thresholds, tie_tol)
    result.tolerances = {"tie_tolerance": tie_tol, **asdict(thresholds)}
    if not judge:
        return
    result.speculation["greedy"] = collect.spec_totals(c_out)
    collect.count(result.coverage, "left_out_tokens", sum(c.left_out for c in c_out + b_out))
    if "greedy" in s.checks:
        result.greedy = greedy.check(cases, c_out, b_out, scored, tie_tol,
                                     thresholds.max_abs_logprob, s.max_greedy_divergences)
        if not result.greedy.passed:
            d = result.greedy.failures[0]
            i = next(k for k, c in enumerate(cases) if c.id == d.prompt_id)
            saver.greedy("base", d, c_out[i], b_out[i])
    result.diffs += collect.diffs(cases, [(i, c, sc) for i, (c, sc) in
                                          enumerate(zip(c_out, scored))], tie_tol,
                                  result.coverage)
    result.timings["greedy_s"] = time.perf_counter() - t0
    if "distribution" not in s.checks and "logprobs" in s.checks:
        judge_logprobs(result, thresholds, saver)


def judge_logprobs(result: AuditRun, thresholds: logprobs.Thresholds, saver) -> None:
    result.logprobs = logprobs.check(result.diffs, thresholds)
    if not result.logprobs.passed and result.logprobs.worst:
        w = result.logprobs.worst[0]
        made = [c for c in result.greedy_runs + result.sampled_runs
                if len(c.tokens) > w.index and c.tokens[w.index] == w.token]
        case = next((i for i, c in enumerate(result.cases) if c.id == w.prompt_id), None)
        if made and case is not None:
            saver.logprobs("base", w, made[0])


async def sampled_phase(s: AuditSettings, cand: Client, base: Client, result: AuditRun,
                        phase: list[str],
                        saver, alpha: float, spec: SamplingSpec | None = None) -> None:
    """The sampling ladder, then the sampled continuations and the distribution test at
    ``alpha``; ``spec``: sample with these settings instead of the audit's (the ones the
    candidate survives, after the ladder found one that breaks it)."""
    cases = result.cases
    thresholds, tie_tol = tolerances(result, s)
    spec = spec or s.sampling
    phase[0] = "sampling ladder"
    t0 = time.perf_counter()
    result.failure, rung, failed = await failures.sampling_ladder(
        cand, base, scoring.prompt_for(cand, cases[0]), temperature=spec.temperature,
        top_p=spec.top_p, top_k=spec.top_k, max_tokens=s.sample_tokens, logprobs=s.logprobs,
        ignore_eos=s.ignore_eos, seed=s.seed)
    if result.failure is not None:
        saver.serving("base", result.failure, failed.path, failed.body)
        return
    c_out = result.greedy_runs
    processed = bool(c_out and rung and rung.positions and c_out[0].positions and
                     scoring.processed_logprobs(rung.positions[0], c_out[0].positions[0],
                                                tie_tol))
    if processed and "logprobs" in s.checks:
        result.routes["logprobs"] += ("; at temperature > 0 the candidate reports logprobs "
                                      "after its sampling settings (vLLM: --logprobs-mode "
                                      "processed_logprobs), so its sampled positions are "
                                      "left out: the check covers its greedy runs")
    phase[0] = "sampling"
    why = control_reason(s, result.noise_floor)
    if why:
        result.routes["distribution"] += ("; judged against continuations the baseline "
                                          f"sampled itself (two-sample permutation "
                                          f"test: {why})")
    if why and collect.own_scoring(base):
        result.routes["distribution"] += ("; the baseline's own continuations are scored "
                                          "by the logprobs it reported while decoding "
                                          "them, the candidate's by decoding them the "
                                          "same way under a constraint that allows only "
                                          "their text")
    triples, control = await collect.sampled_phase(cand, base, cases, s, bool(why), spec=spec)
    result.sampled_runs = [c for _, _, c, _ in triples]
    result.speculation["sampled"] = collect.spec_totals(result.sampled_runs)
    collect.count(result.coverage, "left_out_tokens",
                  sum(c.left_out for _, _, c, _ in triples + (control or [])))
    if "logprobs" in s.checks:
        if not processed:
            result.diffs += collect.diffs(
                cases, [(i, c, sc) for i, _, c, sc in triples], tie_tol, result.coverage)
        judge_logprobs(result, thresholds, saver)
    items = collect.sampled_items(cases, triples, result.coverage)
    control_items = (None if control is None else
                     collect.sampled_items(cases, control, result.coverage))
    # A baseline that disagrees with itself (noise floor) ranks tokens at the top-k
    # edge differently from one computation to the next: edge ties widen with it.
    edge_tol = max(s.support_tolerance, tie_tol) if tie_tol > s.tie_tolerance \
        else s.support_tolerance
    result.distribution = distribution_check.check(
        items, replace(spec, order=_sampling_order(cand.routes)), alpha, len(cases), s.seed,
        edge_tol, edge_noise=0.0 if base.routes.echo else tie_tol, control=control_items)
    if not result.distribution.passed:
        saver.sampled("base", [c.body for c in result.sampled_runs],
                      None if control is None else [c.body for _, _, c, _ in control],
                      result.distribution.pit.p_value, result.distribution.reason())
    result.timings["sampled_s"] = time.perf_counter() - t0


def _describe(routes: Routes) -> dict:
    return {"prompts": "token ids" if routes.token_ids else
            f"text, re-tokenised by the server ({routes.token_id_refusal})",
            "scoring": "echo + logprobs" if routes.echo else
            f"generation after each prefix ({routes.echo_refusal or 'echo not used'})",
            "tokenize": routes.tokenize}


def _record_routes(result: AuditRun, cand: Routes, base: Routes, s: AuditSettings) -> None:
    scoring_route = ("the baseline scores the candidate's tokens by echo" if base.echo else
                     "the baseline scores the candidate's tokens by generating after each "
                     "prefix (no echo: " + (base.echo_refusal or "not used") + ")")
    prompts = ("token-id prompts" if cand.token_ids and base.token_ids else
               "text prompts re-tokenised by the server (positions whose prefix re-tokenises "
               "differently are left out and counted)")
    fresh = list(dict.fromkeys(
        f"{r.flavour.display}: " + ", ".join(f"{k}={json.dumps(v)}"
                                             for k, v in r.flavour.no_prefix_cache.items())
        for r in (cand, base) if r.flavour is not None and r.flavour.no_prefix_cache))
    fresh_note = (f"; prompts recomputed without the prefix cache ({'; '.join(fresh)})"
                  if fresh else "")
    result.routes = {
        "greedy": (f"{prompts}; tokens compared by id; ties judged by {scoring_route}"
                   + fresh_note),
        "logprobs": (f"the candidate's reported logprobs vs {scoring_route}"
                     + ("" if cand.flavour is None or cand.flavour.draft_token_logprobs else
                        f"; {cand.flavour.display} reports no logprobs for tokens it accepted "
                        f"from a draft (logprob 0, no alternatives): those positions are left "
                        f"out and counted, never read as p = 1")),
        "distribution": (f"{prompts}; {scoring_route}; sampling modelled in "
                         f"{_sampling_order(cand)} order{_overrides_sent(cand)}"),
    }


def _overrides_sent(routes: Routes) -> str:
    """The flavour's sampling overrides sent to the candidate, as a clause ('' if none)."""
    overrides = routes.flavour.sampling_overrides if routes.flavour else None
    if not overrides:
        return ""
    pairs = ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    return f" with {pairs} sent to the candidate"


def _sampling_order(routes: Routes) -> str:
    return routes.flavour.sampling_order if routes.flavour else "temperature-first"


def control_reason(s: AuditSettings, floor: noise.NoiseFloor | None) -> str | None:
    """Why the sampled check needs the baseline's own samples (``two_sample``), or None.
    Where the noise floor widened the KL tolerance, the baseline's scoring route is measurably
    not the distribution it decodes from; where no floor was measured, nobody knows."""
    if s.sampled_control != "auto":
        return "--sampled-control on" if s.sampled_control == "on" else None
    if floor is None or not floor.measured:
        return "no noise floor measured"
    if noise.FACTOR * floor.max_kl > s.max_kl:
        return "the noise floor shows its scoring is not the distribution it samples from"
    return None


async def _same_model(cand: Client, base: Client, probes: list[PromptCase],
                      s: AuditSettings) -> None:
    """Refuse to audit two different models: compare next-token logprobs on a few prompts.

    The first generated token comes from the prefill, which speculation does not touch, so a
    correct candidate matches the baseline there up to float noise.  This also checks that the
    candidate reports token-id logprobs at all.
    """
    kw = {"max_tokens": 1, "temperature": 0.0, "logprobs": s.logprobs,
          "ignore_eos": s.ignore_eos, "fresh": True}
    pairs = await asyncio.gather(*(asyncio.gather(
        cand.complete(scoring.prompt_for(cand, p), **kw),
        base.complete(scoring.prompt_for(base, p), **kw)) for p in probes))
    gaps, shared, total = [], 0, 0
    for c, b in pairs:
        if not c.positions or not b.positions:
            raise AuditError("a server returned no token for a 1-token probe request")
        cp, bp = c.positions[0], b.positions[0]
        for tok, lp in bp.top:
            total += 1
            other = cp.logprob_of(tok)
            if other is not None:
                shared += 1
                gaps.append(abs(other - lp))
    mean_gap = float(np.mean(gaps)) if gaps else float("inf")
    if shared < total / 2 or mean_gap > s.mismatch_tolerance:
        raise AuditError(
            f"candidate ({cand.model!r}) and baseline ({base.model!r}) do not serve the same "
            f"model: on probe prompts their next-token logprobs differ by {mean_gap:.3g} nats "
            f"on average and share {shared}/{total} top tokens (tolerance "
            f"{s.mismatch_tolerance:g}; see --mismatch-tolerance)")

