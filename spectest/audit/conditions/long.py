"""The long condition: deep positions — long outputs, long prompts, multi-turn histories.

Owns: three greedy comparisons that reach positions the base audit (prompts of at most
``--max-prompt-tokens``, 48 generated tokens) never does:

* **long outputs** — ``--long-prompts`` prompts continued for ``--long-tokens`` tokens;
* **long prompts** — RAG passages joined to ``--long-prompt-tokens`` tokens (as many as the
  server's context leaves room for, and the report says how many), continued briefly;
* **multi-turn** — a conversation of ``--turns`` user turns from the chat workload, each
  answered by the baseline (greedy), so both servers see the same history; then its last
  answer from both.

Each is judged by greedy equality and logprob agreement, with a reproducer for a failure. A
server that goes wrong only deep into a sequence — a KV-cache block boundary, a position past
some table, repetition loops late in long conversations — passes the base audit and fails
here. Reached when the sequences went past position 256.

Does not know: the statistics (``conditions.common``) or report files.
"""

from __future__ import annotations

import asyncio

from spectest.audit import scoring
from spectest.audit.client import Client
from spectest.audit.conditions.common import (ConditionResult, Context, context_length,
                                              greedy_runs, guarded, judge_greedy, timed)
from spectest.audit.prompts import head, load_records, render
from spectest.audit.samples import PromptCase

TITLE = "long: long outputs, long prompts and multi-turn histories (positions past 256)"
DEEP = 256  # the position the condition is meant to pass
SHORT_TOKENS = 64  # continuation of a long prompt
REPLY_TOKENS = 96  # each baseline reply of the multi-turn history
FINAL_TOKENS = 128  # the last answer, compared
MARGIN = 32  # context positions kept free (speculative slots)


@timed
async def run(ctx: Context, result: ConditionResult) -> None:
    s = ctx.s
    limits = [n for n in await asyncio.gather(context_length(ctx.cand),
                                              context_length(ctx.base)) if n]
    context = min(limits) if limits else s.long_prompt_tokens + s.long_tokens
    deepest = 0
    # long outputs
    cases = ctx.cases[:s.long_prompts]
    tokens = min(s.long_tokens, context - max(len(c.ids) for c in cases) - MARGIN)
    runs = await guarded(ctx, result, "long outputs", greedy_runs(
        ctx, cases, tokens, desc="long: outputs"))
    if runs:
        result.checks += judge_greedy(ctx, "long (outputs)", cases, runs, tag=" (long outputs)")
        deepest = max(deepest, max(len(c.ids) + len(x.tokens) for c, (x, _, _) in
                                   zip(cases, runs)))
        result.evidence.append(f"{len(cases)} prompts continued for {tokens} tokens")
    # long prompts
    if not ctx.dead:
        want = min(s.long_prompt_tokens, context - SHORT_TOKENS - MARGIN)
        longs = await long_prompts(ctx.base, ctx.s.seed, want)
        runs = await guarded(ctx, result, "long prompts", greedy_runs(
            ctx, longs, SHORT_TOKENS, desc="long: prompts"))
        if runs:
            result.checks += judge_greedy(ctx, "long (prompts)", longs, runs,
                                          tag=" (long prompts)")
            lengths = [len(c.ids) for c in longs]
            deepest = max(deepest, max(lengths) + SHORT_TOKENS)
            note = "" if want >= s.long_prompt_tokens else \
                f" (the servers' context of {context} tokens leaves room for no more)"
            result.evidence.append(f"{len(longs)} prompts of {min(lengths)}-{max(lengths)} "
                                   f"tokens{note}")
    # multi-turn
    if not ctx.dead and s.turns:
        conversation = await multi_turn(ctx, context - FINAL_TOKENS - MARGIN)
        runs = await guarded(ctx, result, "multi-turn", greedy_runs(
            ctx, [conversation], FINAL_TOKENS, desc="long: multi-turn"))
        if runs:
            result.checks += judge_greedy(ctx, "long (multi-turn)", [conversation], runs,
                                          tag=" (multi-turn)")
            deepest = max(deepest, len(conversation.ids) + FINAL_TOKENS)
            result.evidence.append(f"a {conversation.category} history of "
                                   f"{len(conversation.ids)} tokens, answered for "
                                   f"{FINAL_TOKENS} more")
    result.evidence.append(f"deepest position reached: {deepest}")
    result.settle(deepest > DEEP, f"no sequence went past position {DEEP} (the servers' "
                                  f"context: {context} tokens)")


async def long_prompts(client: Client, seed: int, tokens: int,
                       count: int = 2) -> list[PromptCase]:
    """``count`` prompts of about ``tokens`` tokens as ``client``'s server tokenizes them: RAG
    passages joined until long enough."""
    records = load_records("rag", 10**6, seed + 4)
    pool = iter(records)
    sample = render(records[0])
    per_token = len(sample) / max(1, len(await scoring.tokenize(client, sample)))
    texts = []
    for _ in range(count):  # a little more text than the tokens wanted, then cut by tokens
        text = ""
        while len(text) < 1.1 * per_token * tokens:
            text += render(next(pool)) + "\n\n"
        texts.append((await head(client, text[:int(1.1 * per_token * tokens)], tokens))[0])
    ids = await asyncio.gather(*(scoring.tokenize(client, t) for t in texts))
    return [PromptCase(f"long-prompt-{i}", "rag", tuple(x), t)
            for i, (x, t) in enumerate(zip(ids, texts))]


async def multi_turn(ctx: Context, budget: int) -> PromptCase:
    """A conversation of up to ``turns`` user turns (a chat record's, then other records'
    first messages), each answered greedily by the baseline, within ``budget`` tokens."""
    s = ctx.s
    records = [r for r in load_records("chat", 10**6, s.seed + 5) if r.messages]
    first = next((r for r in records if r.turns), records[0])
    users = list(first.turns) + [r.messages[-1].get("content", "") for r in records[:s.turns]]
    text = render(first)
    ids = await scoring.tokenize(ctx.base, text)
    for turn in users[:s.turns - 1]:
        reply = await ctx.base.complete(scoring.prompt_for(ctx.base, PromptCase(
            "turn", "chat", tuple(ids), text)), max_tokens=REPLY_TOKENS, temperature=0.0,
            logprobs=1, ignore_eos=False, fresh=True)
        longer = f"{text} {reply.text.strip()}\nuser: {turn}\nassistant:"
        longer_ids = await scoring.tokenize(ctx.base, longer)
        if len(longer_ids) > budget:
            break
        text, ids = longer, longer_ids
    return PromptCase("multi-turn", "chat", tuple(ids), text)
