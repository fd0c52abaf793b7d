"""The prefix-reuse condition: prompts that share a long prefix, each cold and then warm.

Owns: building ``--prefix-prompts`` prompts that share one long prefix (a RAG passage of about
``--prefix-tokens`` tokens, then a different question each), filling the candidate's prefix
cache with the first of them, and comparing three runs of every prompt: the candidate cold
(computed whole: a fresh ``cache_salt``, or the server's field that skips its cache), the
candidate warm (the shared prefix restored from its cache) and the baseline (fresh). Cold
against warm is the sharpest comparison — one server, one prompt, only the cache differs —
and both are compared with the baseline as in the base audit; the warm requests also get a
small sampled test. A server whose speculative path reads a restored prefix wrong (a
block-table off-by-one, a draft cache not filled on a hit) passes the base audit, whose
prompts are sent cold, and fails here.

Reached when the candidate says its cache served the warm prompts: ``cached_tokens`` in
their responses (OpenAI's ``usage.prompt_tokens_details``, llama.cpp's ``timings``) or its
prefix-cache hit counter on ``/metrics``.

Does not know: the statistics (``conditions.common``) or report files.
"""

from __future__ import annotations

import asyncio
import uuid

from spectest.audit import greedy, scoring
from spectest.audit.conditions.common import (FAIL, PASS, CheckResult, ConditionResult,
                                              Context, greedy_runs, guarded, judge_greedy,
                                              sampled_check, timed)
from spectest.audit.prompts import head, load_records, render
from spectest.audit.samples import PromptCase
from spectest.telemetry import names as N

TITLE = ("prefix reuse: prompts sharing a long prefix, each computed cold and then warm from "
         "the candidate's prefix cache")
QUESTION_CHARS = 240


async def prompts(ctx: Context) -> list[PromptCase]:
    """``prefix_prompts`` prompts: one RAG passage (about ``prefix_tokens`` tokens), then a
    different chat question each, as the baseline tokenizes them."""
    s = ctx.s
    passage = next(r for r in load_records("rag", 10**6, s.seed + 2))
    text, _ = await head(ctx.base, render(passage), s.prefix_tokens)
    questions = [r for r in load_records("chat", 10**6, s.seed + 3) if r.messages]
    texts = [f"{text}\n\nuser: {q.messages[-1].get('content', '')[:QUESTION_CHARS]}\n"
             f"assistant:" for q in questions[:s.prefix_prompts]]
    ids = await asyncio.gather(*(scoring.tokenize(ctx.base, t) for t in texts))
    return [PromptCase(f"prefix-{i}", "prefix", tuple(x), t)
            for i, (x, t) in enumerate(zip(ids, texts))]


@timed
async def run(ctx: Context, result: ConditionResult) -> None:
    s = ctx.s
    cases = await prompts(ctx)
    shared = _common_prefix([c.ids for c in cases])
    salt = uuid.uuid4().hex  # this audit's own namespace: nothing earlier is in it
    flavour = ctx.cand.routes.flavour
    if not (flavour and (flavour.cache_salt_field or flavour.no_prefix_cache)):
        result.notes.append("the candidate's flavour has no way to ask for a cold computation "
                            "(a cache salt or a no-cache field): its cold runs may be warm")
    hits_before = await ctx.cand.metric(N.PREFIX_CACHE_HITS)
    prime = await guarded(ctx, result, "prefix-reuse", ctx.cand.complete(
        scoring.prompt_for(ctx.cand, cases[0]), max_tokens=s.greedy_tokens, temperature=0.0,
        logprobs=s.logprobs, ignore_eos=s.ignore_eos, salt=salt))
    if prime is None:
        return result.settle(why=ctx.dead)
    steps = [{"path": "/v1/completions", "body": prime.body}]
    cold = await guarded(ctx, result, "prefix-reuse", greedy_runs(
        ctx, cases, s.greedy_tokens, desc="prefix: cold"))
    warm = await guarded(ctx, result, "prefix-reuse", greedy_runs(
        ctx, cases, s.greedy_tokens, cand_salt=salt, desc="prefix: warm"))
    if cold:
        result.checks += judge_greedy(ctx, "prefix-reuse (cold)", cases, cold, tag=" (cold)")
    if warm:
        result.checks += judge_greedy(ctx, "prefix-reuse (warm)", cases, warm, steps,
                                      tag=" (warm)")
    if cold and warm:
        result.checks.append(cold_vs_warm(ctx, cases, cold, warm, steps))
    if "distribution" in s.checks and not ctx.dead:
        check = await guarded(ctx, result, "prefix-reuse", sampled_check(
            ctx, "prefix-reuse (warm)", cases, samples=max(2, s.samples_per_prompt // 2),
            tokens=s.sample_tokens, cand_salt=salt, tag=" (warm)"))
        if check is not None:
            result.checks.append(check)
    reported = [c.cached_tokens for c, _, _ in warm or () if c.cached_tokens is not None]
    hits = await ctx.cand.metric(N.PREFIX_CACHE_HITS)
    moved = None if hits is None or hits_before is None else hits - hits_before
    result.evidence.append(
        f"{len(cases)} prompts sharing their first {shared} tokens; "
        + (f"the candidate served {sum(reported)} prompt tokens of the {len(reported)} warm "
           f"requests from its cache" if reported else "its responses say nothing of cached "
           "tokens")
        + (f"; its prefix-cache hit counter rose by {moved:.0f} tokens" if moved is not None
           else ""))
    reached = bool(sum(reported)) or bool(moved)
    result.settle(reached, "the candidate reported no prompt tokens served from its prefix "
                           "cache (is prefix caching on?)")


def cold_vs_warm(ctx: Context, cases, cold, warm, steps) -> CheckResult:
    """The candidate against itself: the same prompt cold and warm must decode the same
    greedy tokens, ties (judged by the baseline's scoring of the warm run) apart."""
    diverged, ties = [], 0
    for case, (c_cold, _, _), (c_warm, _, scored) in zip(cases, cold, warm):
        d = greedy.compare(case, c_warm, c_cold, scored, ctx.tie_tolerance,
                           ctx.thresholds.max_abs_logprob)
        if d is None:
            continue
        if d.tie:
            ties += 1
        else:
            diverged.append((case, d, c_warm, c_cold))
    if not diverged:
        return CheckResult("cold vs warm", PASS, f"{len(cases) - ties}/{len(cases)} identical"
                           + (f", {ties} floating-point tie(s)" if ties else ""))
    case, d, c_warm, c_cold = diverged[0]
    path = ctx.saver.greedy("prefix-reuse (warm vs cold)", d, c_warm, c_cold, steps,
                            against_itself=True)
    return CheckResult("cold vs warm", FAIL,
                       f"{len(diverged)} of {len(cases)} prompts decode differently warm: "
                       f"{case.id} from generated position {d.index + 1} (warm {d.candidate_token}"
                       f" vs cold {d.baseline_token})",
                       "the candidate's output depends on its prefix cache: a prefix restored "
                       "from the cache is read differently from one computed (stale or "
                       "misplaced blocks, a draft not given the cached prefix)",
                       reproducer=path)


def _common_prefix(seqs) -> int:
    first = seqs[0]
    n = len(first)
    for other in seqs[1:]:
        same = next((i for i, (a, b) in enumerate(zip(first, other)) if a != b),
                    min(len(first), len(other)))
        n = min(n, same)
    return n
