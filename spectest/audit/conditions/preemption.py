"""The preemption condition: more long requests at once than the candidate's KV cache holds.

Owns: sending ``--preemption-requests`` long greedy requests to the candidate at once — each a
prompt continued for ``--preemption-tokens`` tokens, together more positions than its KV cache
holds where the server says how many that is (spectest's ``kv_budget_tokens`` in
``/v1/models``) — so that it must preempt some and recompute them later; then the baseline's
greedy runs of the same prompts (fresh, at the audit's usual concurrency), and greedy equality
and logprob agreement between the two. A server whose speculative state does not survive
preemption (a draft cache not rebuilt, drafts of a recomputed request verified against stale
positions) passes every other condition and fails here.

Reached when the candidate's preemption counter (``num_preemptions``) rose while its requests
ran; a server with no such counter, or one that never preempted, leaves it "not reached", with
what it would take.

Does not know: the statistics (``conditions.common``) or report files.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from spectest.audit import collect, scoring
from spectest.audit.client import Client
from spectest.audit.conditions.common import (ConditionResult, Context, guarded, judge_greedy,
                                              timed)
from spectest.telemetry import names as N

TITLE = ("preemption: more long requests at once than the candidate's KV cache holds, so it "
         "preempts and recomputes")


async def capacity(client: Client) -> tuple[int | None, int | None]:
    """KV positions the server's running requests may hold together, and how many requests
    it runs at once, where it says (spectest's ``/v1/models``)."""
    for model in await client.models():
        if model.get("id") == client.model:
            room, seqs = model.get("kv_budget_tokens"), model.get("max_num_seqs")
            return (room if isinstance(room, int) else None,
                    seqs if isinstance(seqs, int) else None)
    return None, None


@timed
async def run(ctx: Context, result: ConditionResult) -> None:
    s = ctx.s
    before = await ctx.cand.metric(N.PREEMPTIONS)
    if before is None:
        result.reason = (f"{ctx.cand.routes.name} exposes no preemption counter: a preemption "
                         f"could not be told from none")
    room, running = await capacity(ctx.cand)
    n = s.preemption_requests
    cases = [ctx.cases[i % len(ctx.cases)] for i in range(n)]
    tokens = s.preemption_tokens
    if room:  # the requests that run at once must outgrow the room by a quarter
        at_once = min(n, running or n)
        prompt = sum(len(c.ids) for c in cases) // n
        tokens = max(tokens, -(-5 * room // (4 * at_once)) - prompt)
    need = sum(len(c.ids) for c in cases) + n * tokens
    burst = Client(ctx.cand.endpoint, n, s.timeout)  # every request in flight at once
    burst.routes, burst.model = ctx.cand.routes, ctx.cand.model
    kw = {"max_tokens": tokens, "temperature": 0.0, "logprobs": s.logprobs,
          "ignore_eos": True, "fresh": True}
    async with burst:
        outs = await guarded(ctx, result, "preemption", asyncio.gather(*(
            burst.complete(scoring.prompt_for(burst, c), **kw) for c in cases)))
    if outs is None:
        return result.settle(why=ctx.dead)
    after = await ctx.cand.metric(N.PREEMPTIONS)
    moved = None if before is None or after is None else after - before
    # the baseline's runs and its scoring of the candidate's, as the base audit does them
    base_settings = replace(s, greedy_tokens=tokens)
    bar = collect.progress_bar(base_settings, 2 * n, "preemption: baseline")
    try:
        base_outs = await guarded(ctx, result, "preemption", asyncio.gather(*(
            collect.ticked(bar, ctx.base.complete(scoring.prompt_for(ctx.base, c), **kw))
            for c in cases)))
        scored = await asyncio.gather(*(
            collect.ticked(bar, scoring.score(ctx.base, c, o.tokens, s.logprobs, known=b,
                                              pieces=o.pieces))
            for c, o, b in zip(cases, outs, base_outs or [None] * n))) if base_outs else None
    finally:
        bar.close()
    if base_outs and scored:
        unique = {}  # a prompt sent twice is judged once per run: ids must be unique
        runs = []
        for i, (c, o, b, sc) in enumerate(zip(cases, outs, base_outs, scored)):
            c = replace(c, id=f"{c.id}#{i}") if c.id in unique else c
            unique[c.id] = True
            runs.append((c, (o, b, sc)))
        result.checks += judge_greedy(ctx, "preemption", [c for c, _ in runs],
                                      [r for _, r in runs], tag=" (preempted)")
    held = f" (it says it holds {room})" if room else ""
    result.evidence.append(
        f"{n} requests of {tokens} tokens at once, {need} positions together"
        f"{held}; " + ("its preemption counter is unknown" if moved is None else
                       f"its preemption counter rose by {moved:.0f}"))
    result.settle(bool(moved), result.reason or (
        f"the candidate preempted nothing: its KV cache held {n} requests of "
        f"{tokens} tokens (raise --preemption-requests, or give the server a "
        f"smaller KV cache: spectest serve --kv-budget-tokens, vLLM --num-gpu-blocks-override "
        f"or VLLM_CPU_KVCACHE_SPACE)"))
