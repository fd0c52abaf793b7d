"""The params condition: a ladder of sampling settings, each checked for what it must do.

Owns: the rungs — temperature, top-p, top-k and min-p alone; presence, frequency and
repetition penalties; ``logit_bias``; ``stop``; ``seed``; ``n`` > 1; prompt logprobs — and,
on ``--params-prompts`` prompts, the check each needs:

* a **distribution** test of both servers' samples under the setting (``--params-samples``
  continuations a prompt and side, the baseline's own samples as the control: exact whatever
  the setting does to the distribution, so nothing about the server's sampler is modelled);
* **greedy** equality under the settings that change greedy output (penalties, bias), with
  ties judged by the margin the server decided on (raw logprobs adjusted by the penalties);
* ``stop``: both servers stop at the same text (a speculative server that accepts several
  tokens at once can run past a stop string); ``seed``: the candidate repeats its own seeded
  samples wherever the baseline does; ``n``: as many choices, from the same distribution;
  prompt logprobs: the candidate's echo agrees with the baseline's.

A rung the baseline does not honour either (its greedy output does not move) is "not
reached"; one the baseline refuses is "not run", naming its answer; a rung the candidate fails
while the baseline serves it is a finding that names the setting, and the audit goes on
without it (``common.guarded``). Sampling parameters not applied to the target's
probabilities, or applied to the draft only, pass the base audit and fail here.

Does not know: the statistics (``conditions.common``) or report files.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from spectest.audit import collect, distribution_check, logprobs, scoring
from spectest.audit.conditions.common import (FAIL, NOT_REACHED, NOT_RUN, PASS, CheckResult,
                                              ConditionResult, Context, greedy_runs, guarded,
                                              judge_greedy, sampled_check, timed)
from spectest.audit.distribution import SamplingSpec
from spectest.audit.samples import AuditError, PromptCase, ServerFailure, parse_logprobs

TITLE = ("sampling parameters: temperature, top-p, top-k, min-p, penalties, logit_bias, stop, "
         "seed, n and prompt logprobs, each checked for what it must do")
N_CHOICES = 4


@dataclass(frozen=True)
class Rung:
    name: str  # the setting it adds: a finding names it
    fields: Mapping  # request fields, in vLLM's names
    greedy: bool  # compare greedy output under it
    spec: SamplingSpec | None  # temperature / top-p / top-k of its sampled test, if any


RUNGS = (
    Rung("temperature", {}, False, SamplingSpec(1.0, 1.0, 0)),
    Rung("top_p", {}, False, SamplingSpec(1.0, 0.8, 0)),
    Rung("top_k", {}, False, SamplingSpec(1.0, 1.0, 8)),
    Rung("min_p", {"min_p": 0.1}, False, SamplingSpec(1.0, 1.0, 0)),
    Rung("presence_penalty", {"presence_penalty": 1.0}, True, SamplingSpec(0.8, 1.0, 0)),
    Rung("frequency_penalty", {"frequency_penalty": 1.0}, True, SamplingSpec(0.8, 1.0, 0)),
    Rung("repetition_penalty", {"repetition_penalty": 1.3}, True, SamplingSpec(0.8, 1.0, 0)),
    Rung("logit_bias", {}, True, SamplingSpec(0.8, 1.0, 0)),  # the bias: from the prompts
)
STATISTICAL = len(RUNGS) + 1  # the sampled tests of the ladder (the rungs' and n's)


@timed
async def run(ctx: Context, result: ConditionResult) -> None:
    s = ctx.s
    cases = ctx.cases[:s.params_prompts]
    plain = await guarded(ctx, result, "params", greedy_runs(
        ctx, cases, 2 * s.params_tokens, desc="params: plain"))
    if plain is None:
        return result.settle(why=ctx.dead)
    for rung in RUNGS:
        if not ctx.dead:
            await _rung(ctx, result, rung, cases, plain)
    for special in (_stop, _seed, _n, _prompt_logprobs):
        if not ctx.dead:
            await special(ctx, result, cases, plain)
    ran = [c for c in result.checks if c.status in (PASS, FAIL)]
    result.evidence.append(f"{len(ran)} checks on {len(cases)} prompts over "
                           f"{len(RUNGS) + 4} settings")
    result.settle(bool(ran))


async def _rung(ctx: Context, result: ConditionResult, rung: Rung, cases, plain) -> None:
    s = ctx.s
    if rung.name in ctx.avoid:
        result.checks.append(CheckResult(rung.name, NOT_RUN, f"not sent: {rung.name} breaks "
                                         f"the candidate ({ctx.avoid[rung.name]})"))
        return
    fields = dict(rung.fields) or ({"logit_bias": _bias(plain)} if rung.name == "logit_bias"
                                   else {})
    tag = f" ({rung.name})"
    window = ctx.cand.routes.flavour.penalty_window if ctx.cand.routes.flavour else 0
    if rung.greedy:
        runs = await _refused(ctx, result, rung.name, greedy_runs(
            ctx, cases, 2 * s.params_tokens, fields=fields, desc=f"params: {rung.name}"))
        if runs is None:
            return
        moved = sum(b.tokens != p.tokens for (_, b, _), (_, p, _) in zip(runs, plain))
        if not moved:
            result.checks.append(CheckResult(f"greedy{tag}", NOT_REACHED,
                                             f"the baseline's greedy output did not change "
                                             f"with {rung.name} (it ignores it?)"))
        else:
            result.checks += judge_greedy(ctx, f"params ({rung.name})", cases, runs, tag=tag,
                                          retie=lambda c, x, d: _margin(window, c, x, d,
                                                                        fields))
    if rung.spec is not None and "distribution" in s.checks and not ctx.dead:
        spec = rung.spec if "top_k" not in ctx.avoid or rung.spec.top_k <= 0 else \
            replace(rung.spec, top_k=0)
        check = await _refused(ctx, result, rung.name, sampled_check(
            ctx, f"params ({rung.name})", cases, samples=s.params_samples,
            tokens=s.params_tokens, spec=spec, fields=fields, control=True, tag=tag))
        if check is not None:
            result.checks.append(check)


async def _refused(ctx: Context, result: ConditionResult, name: str, work):
    """``guarded`` work whose AuditError (both servers refused the setting: a 4xx) leaves the
    rung not run, naming the answer, instead of ending the condition."""
    try:
        return await guarded(ctx, result, f"params ({name})", work, breaking=name)
    except ServerFailure:
        raise
    except AuditError as exc:
        result.checks.append(CheckResult(name, NOT_RUN, f"refused: {exc}"))
        return None


def _bias(plain) -> dict[str, float]:
    """Ban the three tokens the baseline's plain greedy runs use most: every run moves."""
    counts = Counter(t for _, b, _ in plain for t in b.tokens)
    return {str(t): -100.0 for t, _ in counts.most_common(3)}


def _margin(window: int, case: PromptCase, cand, d, fields: Mapping) -> float | None:
    """The divergence's margin as the server decided it: the raw logprob margin plus what
    the bias and penalties did to the two tokens at that position, counting the last
    ``window`` generated tokens (0: all; llama.cpp counts 64) — a repetition penalty can only
    be bounded: the margin is divided by it, the conservative end."""
    if d.margin is None or d.candidate_token is None or d.baseline_token is None:
        return None
    b, c = d.baseline_token, d.candidate_token
    out = list(cand.tokens[:d.index])[-window:] if window else list(cand.tokens[:d.index])
    counts = Counter(out)
    bias = {int(k): v for k, v in (fields.get("logit_bias") or {}).items()}
    margin = d.margin + bias.get(b, 0.0) - bias.get(c, 0.0)
    presence, frequency = fields.get("presence_penalty", 0.0), fields.get("frequency_penalty",
                                                                         0.0)
    margin += -presence * (counts[b] > 0) - frequency * counts[b] \
        + presence * (counts[c] > 0) + frequency * counts[c]
    if fields.get("repetition_penalty", 1.0) != 1.0:
        margin /= max(fields["repetition_penalty"], 1 / fields["repetition_penalty"])
    return abs(margin)


async def _stop(ctx: Context, result: ConditionResult, cases, plain) -> None:
    """Greedy with a stop string from each prompt's own greedy output: both stop there."""
    s = ctx.s
    jobs = []
    for case, (_, p, _) in zip(cases, plain):
        text = p.text
        cut = next((i for i in range(max(8, len(text) // 3), len(text) - 4)
                    if text[i:i + 4].strip() == text[i:i + 4] and text[i:i + 4].strip()), None)
        if cut is not None:
            jobs.append((case, text[cut:cut + 4]))
    if not jobs:
        result.checks.append(CheckResult("stop", NOT_RUN, "no greedy output long enough"))
        return
    kw = {"max_tokens": 2 * s.params_tokens, "temperature": 0.0, "logprobs": 1,
          "ignore_eos": s.ignore_eos, "fresh": True}

    async def pair(case, stop):
        c, b = await asyncio.gather(
            ctx.cand.complete(scoring.prompt_for(ctx.cand, case), **kw, fields={"stop": [stop]}),
            ctx.base.complete(scoring.prompt_for(ctx.base, case), **kw, fields={"stop": [stop]}))
        return case, stop, c, b

    done = await _refused(ctx, result, "stop", asyncio.gather(*(pair(*j) for j in jobs)))
    if done is None:
        return
    wrong = [(case, stop, c, b) for case, stop, c, b in done
             if c.text != b.text or c.finish_reason != b.finish_reason]
    honoured = sum(b.finish_reason == "stop" for _, _, _, b in done)
    if not honoured:
        result.checks.append(CheckResult("stop", NOT_REACHED, "the baseline stopped at none "
                                         "of the stop strings (it ignores stop?)"))
    elif not wrong:
        result.checks.append(CheckResult("stop", PASS, f"{len(done)} prompts: both stopped at "
                                         f"the same text ({honoured} at the stop string)"))
    else:
        case, stop, c, b = wrong[0]
        past = stop in c.text or len(c.text) > len(b.text)
        path = ctx.saver.text("params (stop)", f"with stop {stop!r} the candidate returned "
                              f"{c.text[-60:]!r} ({c.finish_reason}), the baseline "
                              f"{b.text[-60:]!r} ({b.finish_reason})", c.body, b.body)
        result.checks.append(CheckResult(
            "stop", FAIL, f"{len(wrong)} of {len(done)} prompts end differently: {case.id} "
            f"stop {stop!r}: candidate {c.text[-40:]!r} vs baseline {b.text[-40:]!r}",
            "the candidate emits text past the stop string: tokens accepted together are not "
            "checked against it one by one" if past else
            "the candidate stops elsewhere than the baseline", reproducer=path))


async def _seed(ctx: Context, result: ConditionResult, cases, plain) -> None:
    """The same seeded request twice to each server, one after the other."""
    s = ctx.s
    kw = {"max_tokens": s.params_tokens, "temperature": 1.0, "logprobs": 1, "seed": 1234,
          "ignore_eos": s.ignore_eos, "fresh": True}
    same = {"candidate": 0, "baseline": 0}
    picked = cases[:3]
    for case in picked:
        for side, client in (("candidate", ctx.cand), ("baseline", ctx.base)):
            first = await _refused(ctx, result, "seed", client.complete(
                scoring.prompt_for(client, case), **kw))
            again = await _refused(ctx, result, "seed", client.complete(
                scoring.prompt_for(client, case), **kw))
            if first is None or again is None:
                return
            same[side] += first.tokens == again.tokens
    n = len(picked)
    if same["baseline"] < n:
        result.checks.append(CheckResult("seed", NOT_REACHED, f"the baseline repeats its own "
                                         f"seeded samples {same['baseline']}/{n} times: "
                                         f"nothing to hold the candidate to"))
    elif same["candidate"] < n:
        result.checks.append(CheckResult("seed", FAIL, f"the candidate repeats its seeded "
                                         f"samples {same['candidate']}/{n} times, the baseline "
                                         f"{n}/{n}", "the candidate's sampled output depends on "
                                         "more than the seed (what else it ran, batch state)"))
    else:
        result.checks.append(CheckResult("seed", PASS, f"both repeat their seeded samples "
                                         f"{n}/{n} times"))


async def _n(ctx: Context, result: ConditionResult, cases, plain) -> None:
    """``n`` > 1: as many choices, sampled as the baseline samples them (two-sample test)."""
    s = ctx.s
    kw = {"max_tokens": s.params_tokens, "temperature": 1.0, "logprobs": s.logprobs,
          "ignore_eos": s.ignore_eos, "fresh": True, "fields": {"n": N_CHOICES}}

    async def both(i, case):
        c, b = await asyncio.gather(
            ctx.cand.complete_all(scoring.prompt_for(ctx.cand, case), **kw, seed=100 + i),
            ctx.base.complete_all(scoring.prompt_for(ctx.base, case), **kw, seed=900 + i))
        return c, b

    got = await _refused(ctx, result, "n", asyncio.gather(*(both(i, c)
                                                           for i, c in enumerate(cases))))
    if got is None:
        return
    if any(len(b) != N_CHOICES for _, b in got):
        result.checks.append(CheckResult("n", NOT_RUN, f"the baseline does not return n = "
                                         f"{N_CHOICES} choices"))
        return
    short = [len(c) for c, _ in got if len(c) != N_CHOICES]
    if short:
        result.checks.append(CheckResult("n", FAIL, f"the candidate returned {short[0]} "
                                         f"choice(s) for n = {N_CHOICES}, the baseline "
                                         f"{N_CHOICES}"))
        return
    arms = []
    for side in (0, 1):
        triples = []
        for i, (case, pair) in enumerate(zip(cases, got)):
            for k, comp in enumerate(pair[side]):
                scored = await scoring.score(ctx.base, case, comp.tokens, s.logprobs,
                                             chunk=collect.SAMPLED_CHUNK, pieces=comp.pieces)
                triples.append((i, k, comp, scored))
        arms.append(collect.sampled_items(list(cases), triples, {}))
    spec = SamplingSpec(1.0, 1.0, 0)
    res = distribution_check.check(arms[0], spec, ctx.alpha, len(cases), s.seed,
                                   s.support_tolerance, control=arms[1])
    path = None if res.passed else ctx.saver.sampled(
        "params (n)", [pair[0][0].body for pair in got], [pair[1][0].body for pair in got],
        res.pit.p_value, res.reason())
    result.checks.append(CheckResult("distribution (n)", PASS if res.passed else FAIL,
                                     res.reason(), "" if res.passed else res.cause(),
                                     p_value=res.pit.p_value, alpha=ctx.alpha,
                                     reproducer=path))


async def _prompt_logprobs(ctx: Context, result: ConditionResult, cases, plain) -> None:
    """Echo scoring of the prompts on both servers (the candidate's with its own fields)."""
    if not (ctx.cand.routes.echo and ctx.base.routes.echo and ctx.cand.routes.token_ids):
        why = ctx.cand.routes.echo_refusal or ctx.base.routes.echo_refusal or "no echo"
        result.checks.append(CheckResult("prompt logprobs", NOT_RUN, why))
        return
    diffs = []
    for case in cases:
        got = []
        for client in (ctx.cand, ctx.base):
            answer = await _refused(ctx, result, "prompt logprobs",
                                    client.echo(list(case.ids), ctx.s.logprobs, True))
            if answer is None:
                return
            got.append(parse_logprobs(answer[0], f"the {client.role}", ctx.s.logprobs,
                                      skip_first_none=True)[:len(case.ids)])
        for j, (c, b) in enumerate(zip(*got)):
            if c is not None and b is not None:
                diffs.append(logprobs.compare(case.id, j, c, b, ctx.tie_tolerance))
    res = logprobs.check(diffs, ctx.thresholds)
    result.checks.append(CheckResult("prompt logprobs", PASS if res.passed else FAIL,
                                     res.reason(), "" if res.passed else
                                     "the candidate's prompt logprobs differ from the "
                                     "baseline's (prompt scoring takes another path with "
                                     "speculation on)"))
