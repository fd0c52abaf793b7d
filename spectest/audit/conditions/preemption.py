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
what it would take. Where the KV cache holds every request at its whole context (told from its
size, before any burst) nothing is sent. Where the server does not say how many requests it runs
at once, bursts of 32, 128 and 512 tokens show it (until a scrape of its running-requests gauge
sees them), and their pace sets the long burst's timeout: the candidate is given twice the time
that pace implies, so a slow server under a deliberate overload is not reported as failing.

Does not know: the statistics (``conditions.common``) or report files.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from spectest.audit import collect, scoring
from spectest.audit.client import Client
from spectest.audit.conditions.common import (NOT_REACHED, ConditionResult, Context,
                                              context_length, guarded, judge_greedy, timed)
from spectest.telemetry import names as N

TITLE = ("preemption: more long requests at once than the candidate's KV cache holds, so it "
         "preempts and recomputes")
# the bursts that show how many requests a server runs at once: longer until a scrape sees one
PROBE_TOKENS = (32, 128, 512)


async def capacity(client: Client) -> tuple[int | None, int | None]:
    """KV positions the server's running requests may hold together, and how many requests
    it runs at once, where it says (spectest's ``/v1/models``; vLLM's KV size on
    ``/metrics``, the flavour's ``kv_size_label``)."""
    room = seqs = None
    for model in await client.models():
        if model.get("id") == client.model:
            room, seqs = model.get("kv_budget_tokens"), model.get("max_num_seqs")
    flavour = client.routes.flavour
    if not isinstance(room, int) and flavour is not None and flavour.kv_size_label:
        value = await client.label(*flavour.kv_size_label)
        room = int(value) if value and value.isdigit() else None
    return (room if isinstance(room, int) else None, seqs if isinstance(seqs, int) else None)


def sized(room: int | None, at_once: int | None, n: int, prompt: int, least: int,
          most: int) -> int:
    """Tokens per request for requests that run ``at_once`` together to outgrow ``room`` by a
    quarter (at least ``least``, at most ``most``: the context)."""
    if not room:
        return least
    return max(least, min(most, -(-5 * room // (4 * min(n, at_once or n))) - prompt))


@timed
async def run(ctx: Context, result: ConditionResult) -> None:
    s = ctx.s
    before = await ctx.cand.metric(N.PREEMPTIONS)
    if before is None:
        result.reason = (f"{ctx.cand.routes.name} exposes no preemption counter: a preemption "
                         f"could not be told from none")
    room, at_once = await capacity(ctx.cand)
    n = s.preemption_requests
    cases = [ctx.cases[i % len(ctx.cases)] for i in range(n)]
    prompt = sum(len(c.ids) for c in cases) // n
    context = await context_length(ctx.cand) or (prompt + 4 * s.preemption_tokens)
    most = context - max(len(c.ids) for c in cases) - 32
    if room and n * context <= room:  # however many it runs at once, all of them fit
        return _cannot(result, room, n, context, "sent")
    rate = None  # seconds per generated token of a request in a burst, where measured
    if room and at_once is None:  # a short burst shows how many it runs at once
        for probe in PROBE_TOKENS:  # longer, until a scrape sees requests running
            outs, at_once, wall = await _burst(ctx, result, cases, probe)
            if outs is None:
                return result.settle(why=ctx.dead)
            rate = wall / probe
            if at_once:
                result.notes.append(f"a burst of {probe} tokens showed it runs {at_once} "
                                    f"requests at once")
                break
    if at_once:
        n = min(n, at_once + 2)  # enough to keep every place busy, no more
        cases = cases[:n]
        if room and at_once * context <= room:
            return _cannot(result, room, at_once, context, "run at once")
    tokens = sized(room, at_once, n, prompt, s.preemption_tokens, most)
    # a long burst is given the time the probe's pace implies, twice over (recomputation)
    timeout = max(s.timeout, 2 * rate * tokens) if rate else s.timeout
    outs, _, _ = await _burst(ctx, result, cases, tokens, timeout)
    after = await ctx.cand.metric(N.PREEMPTIONS)
    if outs is None:
        return result.settle(why=ctx.dead)
    moved = None if before is None or after is None else after - before
    # the baseline's runs and its scoring of the candidate's, as the base audit does them
    kw = {"max_tokens": tokens, "temperature": 0.0, "logprobs": s.logprobs,
          "ignore_eos": True, "fresh": True}
    bar = collect.progress_bar(s, 2 * n, "preemption: baseline")
    try:
        async with ctx.base.sibling(timeout_s=timeout) as base:
            base_outs = await guarded(ctx, result, "preemption", asyncio.gather(*(
                collect.ticked(bar, base.complete(scoring.prompt_for(base, c), **kw))
                for c in cases)))
            scored = await asyncio.gather(*(
                collect.ticked(bar, scoring.score(base, c, o.tokens, s.logprobs, known=b,
                                                  pieces=o.pieces))
                for c, o, b in zip(cases, outs, base_outs))) if base_outs else None
    finally:
        bar.close()
    if base_outs and scored:
        runs = [(replace(c, id=f"{c.id}#{i}"), (o, b, sc))  # a prompt may be sent twice
                for i, (c, o, b, sc) in enumerate(zip(cases, outs, base_outs, scored))]
        result.checks += judge_greedy(ctx, "preemption", [c for c, _ in runs],
                                      [r for _, r in runs], tag=" (preempted)")
    need = prompt * n + n * tokens
    held = f" (it says it holds {room})" if room else ""
    result.evidence.append(
        f"{n} requests of {tokens} tokens at once, about {need} positions together{held}; "
        + ("its preemption counter is unknown" if moved is None else
           f"its preemption counter rose by {moved:.0f}"))
    result.settle(bool(moved), result.reason or (
        f"the candidate preempted nothing: its KV cache held {n} requests of {tokens} tokens "
        f"(raise --preemption-requests, or give the server a smaller KV cache: spectest serve "
        f"--kv-budget-tokens, vLLM --num-gpu-blocks-override)"))


def _cannot(result: ConditionResult, room: int, n: int, context: int, how: str) -> None:
    """Not reached: ``n`` requests of the whole context fit in the KV cache, so the server
    cannot be made to preempt by these requests."""
    result.evidence.append(f"its KV cache holds {room} tokens; {n} requests of at most "
                           f"{context} would be {how}")
    result.status = NOT_REACHED
    result.reason = (f"the candidate cannot preempt: {n} requests of its whole context "
                     f"({context} tokens) fit in its KV cache ({room}); give it a smaller one "
                     f"(spectest serve --kv-budget-tokens, vLLM --num-gpu-blocks-override) or "
                     f"send more (--preemption-requests)")


async def _burst(ctx: Context, result: ConditionResult, cases, tokens: int,
                 timeout: float | None = None):
    """Every request at once to the candidate (its own connection pool); returns the
    completions (None if the candidate failed one), the most it was seen running at once
    (None where no scrape saw one) and the burst's wall time in seconds."""
    kw = {"max_tokens": tokens, "temperature": 0.0, "logprobs": ctx.s.logprobs,
          "ignore_eos": True, "fresh": True}
    seen: list[float] = []

    async def watch() -> None:
        while True:
            running = await ctx.cand.metric(N.RUNNING)
            if running is not None:
                seen.append(running)
            await asyncio.sleep(0.1)

    start = time.monotonic()
    async with ctx.cand.sibling(len(cases), timeout or ctx.s.timeout) as burst:
        watcher = asyncio.ensure_future(watch())
        try:
            outs = await guarded(ctx, result, "preemption", asyncio.gather(*(
                burst.complete(scoring.prompt_for(burst, c), **kw) for c in cases)))
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    return outs, (int(max(seen)) or None) if seen else None, time.monotonic() - start
