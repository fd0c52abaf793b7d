"""The load condition: the audited requests run inside the candidate's busy, mixed batches.

Owns: running a short audit — greedy pairs and a sampled test on ``--load-prompts`` prompts —
while the candidate also serves background workload traffic (``audit.background``; its records
from ``--load-workload``, mixed chat, code and RAG by default) at
``--load-concurrency``: greedy and sampled requests of several temperatures and lengths, so the
audited rows are verified beside rows of every kind, and batches change shape from round to
round. A server that is exact alone and wrong in a mixed batch (a sampled row verified by the
rules of the greedy row beside it, per-row parameters mis-indexed across the batch) passes the
base audit and fails here.

Reached when the background traffic ran alongside: the condition reports how many background
requests the candidate served and the running-requests gauge it read meanwhile, and the
acceptance of the background requests in the first half against the second (a server whose
acceptance decays as it serves is worth a look even when its output is right).

Does not know: the statistics (``conditions.common``) or report files.
"""

from __future__ import annotations

import asyncio
import math
import time

from spectest.audit.background import SETTINGS, Background
from spectest.audit.conditions.common import (FAIL, CheckResult, ConditionResult, Context,
                                              greedy_runs, guarded, judge_greedy, revive,
                                              sampled_check, timed)
from spectest.audit.failures import CandidateFailure, answers, confirm
from spectest.audit.prompts import load_records
from spectest.telemetry import names as N

TITLE = ("under load: the audited requests verified inside batches the candidate shares with "
         "background workload traffic")
WARMUP_ROUNDS = 2  # background requests per slot served before the audited ones go
UNDER = " (under load)"


@timed
async def run(ctx: Context, result: ConditionResult) -> None:
    s = ctx.s
    cases = ctx.cases[:s.load_prompts]
    records = load_records(s.load_workload, 10**6, s.seed + 1)
    # a server that runs few requests at once (llama.cpp's slots: the client was fitted to
    # them) keeps half its places for the audited requests, or they would wait out the
    # background's queue
    width = s.load_concurrency if ctx.cand.concurrency >= s.concurrency else \
        max(1, ctx.cand.concurrency // 2)
    client = ctx.cand.sibling(width, s.timeout)
    settings = background_settings(ctx.avoid)
    async with client, Background(client, records, width, s.seed,
                                  settings=settings) as bg:
        await bg.wait_for(WARMUP_ROUNDS * width, timeout=s.timeout)
        before = bg.served.done
        recipe = bg.recipe()
        if bg.served.failed is None:
            runs = await guarded(ctx, result, "load", greedy_runs(
                ctx, cases, s.greedy_tokens, desc="load: greedy"))
            if runs:
                result.checks += judge_greedy(ctx, "load", cases, runs, background=recipe,
                                              tag=UNDER)
        if bg.served.failed is None and "distribution" in s.checks and not ctx.dead:
            check = await guarded(ctx, result, "load", sampled_check(
                ctx, "load", cases, samples=max(2, s.samples_per_prompt // 2),
                tokens=s.sample_tokens, background=recipe, tag=UNDER))
            if check is not None:
                result.checks.append(check)
        alongside = bg.served.done - before
        served = bg.served
    await _drained(ctx)
    if served.failed is None and not ctx.dead and not await answers(ctx.cand):
        # it died on background requests still running when the audit let go of them
        found = CandidateFailure("load (background traffic)", {}, "stopped answering while "
                                 "it finished the background requests", "served the same "
                                 "traffic", alive_after=False)
        ctx.failures.append(found)
        path = ctx.saver.background("load", found.summary(), recipe)
        result.checks.append(CheckResult("serving", FAIL, found.summary(), reproducer=path))
        await revive(ctx)
    if served.failed is not None:  # a background request the candidate failed
        found = await confirm(served.failed, ctx.cand, ctx.base, "load (background request)")
        ctx.failures.append(found)
        path = ctx.saver.serving("load", found, served.failed.path, served.failed.body)
        result.checks.append(CheckResult("serving", FAIL, found.summary(), reproducer=path))
    gauge = served.running
    result.evidence.append(
        f"{served.done} background requests of {s.load_workload} ({width} in flight), "
        f"{alongside} of them while the audited ones ran" + (
            f"; the candidate's running-requests gauge read {sum(gauge) / len(gauge):.1f} on "
            f"average (max {max(gauge):.0f}) over {len(gauge)} scrapes" if gauge else
            "; the candidate exposes no running-requests gauge"))
    trend = acceptance_trend(served.spec)
    if trend:
        result.notes.append(trend)
    reached = alongside >= width and (not gauge or max(gauge) > 1)
    result.settle(reached, "the background traffic did not overlap the audited requests "
                           f"({alongside} background requests alongside)")


async def _drained(ctx: Context, timeout: float = 60.0) -> None:
    """Until the candidate has finished the background requests the audit let go of (its
    running-requests gauge at 0), so that what they do to it shows here, not in the next
    condition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = await ctx.cand.metric(N.RUNNING)
        if not running:
            return
        await asyncio.sleep(0.5)


def background_settings(avoid) -> tuple[dict, ...]:
    """The background's sampling settings less what is known to break the candidate (its
    death would end the condition, not tell more)."""
    if "temperature" in avoid:
        return ({"temperature": 0.0},)
    kept = [{k: v for k, v in one.items() if k not in avoid} for one in SETTINGS]
    return tuple(one for i, one in enumerate(kept) if one not in kept[:i])


def acceptance_trend(spec: list[tuple[int, int]]) -> str:
    """The background requests' acceptance in the first half against the second (a two-
    proportion z-test on the draft tokens; descriptive, not a verdict)."""
    half = len(spec) // 2
    if half < 4:
        return ""
    (d1, a1), (d2, a2) = ([sum(x) for x in zip(*part)] for part in (spec[:half], spec[half:]))
    if not d1 or not d2:
        return ""
    r1, r2 = a1 / d1, a2 / d2
    pooled = (a1 + a2) / (d1 + d2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / d1 + 1 / d2)) or 1.0
    z = (r2 - r1) / se
    line = (f"background acceptance {100 * r1:.1f}% in the first {half} requests, "
            f"{100 * r2:.1f}% in the last {len(spec) - half} (z = {z:+.1f})")
    if z < -3 and r2 < 0.8 * r1:
        line += ": acceptance FELL while the candidate served — a drifting drafter or state"
    return line
