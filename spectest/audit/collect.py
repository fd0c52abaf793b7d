"""Collecting what the checks compare: greedy pairs, sampled continuations, their scoring.

Owns: the request patterns every part of the audit repeats — a prompt's greedy run on both
servers with the baseline's scoring of the candidate's tokens (:func:`greedy_pair`), seeded
sampled continuations from the candidate (and, for the two-sample test, from the baseline
itself) each scored by the baseline (:func:`sampled_phase`), and turning those into the checks'
inputs (:func:`diffs` for the logprob check, :func:`sampled_items` for the distribution check),
with the positions that could not be used counted in a coverage dict; plus the progress bar
helpers and the candidate's speculation totals. The base audit (``runner``) and each condition
(``conditions``) call these with their own prompts and settings.

Does not know: which checks run, verdicts or report files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
from tqdm import tqdm

from spectest.audit import distribution_check, logprobs, scoring
from spectest.audit.client import Client
from spectest.audit.distribution import SamplingSpec
from spectest.audit.samples import Completion, PromptCase
from spectest.audit.settings import AuditSettings

SPEC_FIELDS = ("drafts", "draft_tokens", "accepted_tokens")
SAMPLED_CHUNK = 4  # tokens per generation-scoring request for sampled continuations


def progress_bar(settings: AuditSettings, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="req", disable=not settings.progress,
                leave=False, dynamic_ncols=True)


def ticked(bar: tqdm, coro) -> asyncio.Task:
    """A task that ticks the progress bar when it ends (a task, so that cancelling it on
    Ctrl-C/SIGTERM also closes its coroutine cleanly)."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda t: t.cancelled() or bar.update(1))
    return task


def count(coverage: dict, key: str, n: int = 1) -> None:
    coverage[key] = coverage.get(key, 0) + n


Sample = tuple[int, int, Completion, tuple]  # (prompt, continuation, completion, scoring)


async def sampled_phase(cand: Client, base: Client, cases: list[PromptCase], s: AuditSettings,
                        control: bool = False, fields: Mapping | None = None,
                        cand_salt: str | None = None, spec: SamplingSpec | None = None
                        ) -> tuple[list[Sample], list[Sample] | None]:
    """``samples_per_prompt`` seeded samples per prompt from the candidate, each scored by the
    baseline; with ``control``, as many from the baseline itself (other seeds), scored the
    same way: [(prompt index, continuation, completion, baseline scoring of prompt + output)]
    for each. ``fields``: more sampling fields for both sides' samples (in each server's own
    names); ``cand_salt``: the candidate's prefix-cache namespace; ``spec``: sample with this
    temperature / top-p / top-k instead of the settings' (a setting the one-sample test cannot
    model, judged against the control)."""
    rng = np.random.default_rng(s.seed)
    shape = (len(cases), s.samples_per_prompt)
    seeds = rng.integers(0, 2**31 - 1, shape)
    jobs = [(i, k, int(seeds[i, k])) for i in range(len(cases))
            for k in range(s.samples_per_prompt)]
    if control:
        other = rng.integers(0, 2**31 - 1, shape)
        jobs += [(i, k, int(other[i, k])) for i in range(len(cases))
                 for k in range(s.samples_per_prompt)]
    n = len(cases) * s.samples_per_prompt
    bar = progress_bar(s, len(jobs) * 2,
                       "sampling" + (" (and the baseline's own)" if control else ""))
    # One continuation is scored from start to end before the next one starts, at most as many
    # at once as the baseline runs requests. Without this every continuation's scoring was in
    # flight at once and the baseline's requests served them round-robin: none finished until
    # nearly all did (the progress stalled half-way for minutes), and each request came after
    # another continuation's, so a prefix-caching server (llama.cpp) recomputed the whole
    # prompt for every request instead of the few tokens it had not seen.
    scorers = asyncio.Semaphore(base.concurrency)
    own = own_scoring(base)
    spec = spec or s.sampling
    runs = await asyncio.gather(*(_sampled_one(cand if j < n else base, base, cases[i], seed, s,
                                               bar, scorers, own and j >= n, fields,
                                               cand_salt if j < n else None, spec)
                                  for j, (i, _, seed) in enumerate(jobs)))
    bar.close()
    out = [(i, k, c, sc) for (i, k, _), (c, sc) in zip(jobs, runs)]
    return out[:n], (out[n:] if control else None)


def sampled_items(cases: list[PromptCase], samples: list[Sample],
                   coverage: dict) -> list[distribution_check.Sampled]:
    items = []
    for i, k, c, sc in samples:
        for j, tok in enumerate(c.tokens):
            here = sc[len(cases[i].ids) + j]
            if here is None:
                count(coverage, "distribution_unscored")
                continue
            own = c.positions[j] if c.positions[j].reported else None
            items.append(distribution_check.Sampled(i, j, tok, here, own, k))
    return items


async def greedy_pair(cand: Client, base: Client, case: PromptCase, s: AuditSettings, bar,
                      fields: Mapping | None = None, cand_salt: str | None = None):
    """Both servers' greedy run of ``case`` and the baseline's scoring of the candidate's
    tokens. ``fields``: more request fields for both (each in its server's names, see
    :func:`named`); ``cand_salt``: the candidate runs in that prefix-cache
    namespace instead of fresh."""
    # fresh: with a prefix cache, a greedy run's prompt may be computed in pieces shaped by
    # earlier requests, and batch shape moves the logits (llama.cpp documents this for
    # ``cache_prompt``): the comparison must not depend on what each server served before.
    kw = {"max_tokens": s.greedy_tokens, "temperature": 0.0, "logprobs": s.logprobs,
          "ignore_eos": s.ignore_eos}
    c, b = await asyncio.gather(
        ticked(bar, cand.complete(scoring.prompt_for(cand, case), **kw,
                                  fresh=cand_salt is None, salt=cand_salt,
                                  fields=named(cand, fields))),
        ticked(bar, base.complete(scoring.prompt_for(base, case), **kw, fresh=True,
                                  fields=named(base, fields))))
    scored = await ticked(bar, scoring.score(base, case, c.tokens, s.logprobs, known=b,
                                              pieces=c.pieces))
    return c, b, scored


def own_scoring(base: Client) -> bool:
    """Does the baseline score a continuation by decoding it token by token (constrained
    generation, ``Flavour.forced_text_field``)? Then its own samples need no scoring request:
    the logprobs it reported while sampling them come from the same computation — the same
    decode steps after the same prompt — as its scoring of the candidate's tokens."""
    flavour = base.routes.flavour
    return bool(flavour and flavour.forced_text_field and not base.routes.echo)


def named(client: Client, fields: Mapping | None) -> dict | None:
    """``fields`` (vLLM's names) in the server's own (``Flavour.param_names``)."""
    if not fields:
        return None
    names = client.routes.flavour.param_names if client.routes.flavour else {}
    return {names.get(k, k): v for k, v in fields.items()}


async def _sampled_one(cand: Client, base: Client, case: PromptCase, seed: int,
                       s: AuditSettings, bar, scorers: asyncio.Semaphore, own: bool = False,
                       fields: Mapping | None = None, salt: str | None = None,
                       spec: SamplingSpec | None = None):
    spec = spec or s.sampling
    c = await ticked(bar, cand.complete(
        scoring.prompt_for(cand, case), max_tokens=s.sample_tokens, temperature=spec.temperature,
        top_p=spec.top_p, top_k=spec.top_k, seed=seed, logprobs=s.logprobs,
        ignore_eos=s.ignore_eos, salt=salt, fields=named(cand, fields)))
    if own:  # the baseline's own sample, scored by the decode that produced it
        bar.update(1)
        return c, (None,) * len(case.ids) + tuple(p if p.reported else None
                                                  for p in c.positions)
    async with scorers:
        scored = await ticked(bar, scoring.score(base, case, c.tokens, s.logprobs,
                                                  chunk=SAMPLED_CHUNK, pieces=c.pieces))
    return c, scored


def diffs(cases: list[PromptCase], triples, tie_tolerance: float,
           coverage: dict) -> list[logprobs.PositionDiff]:
    """Per-position logprob comparisons; positions the candidate reported nothing for (llama.cpp:
    tokens accepted from a draft) or the baseline could not score are counted, not compared."""
    out = []
    for i, comp, scored in triples:
        n = len(cases[i].ids)
        for j, pos in enumerate(comp.positions):
            count(coverage, "logprob_positions")
            if not pos.reported:
                count(coverage, "candidate_unreported")
            elif scored[n + j] is None:
                count(coverage, "baseline_unscored")
            else:
                diff = logprobs.compare(cases[i].id, j, pos, scored[n + j], tie_tolerance)
                if diff.unmeasured:
                    count(coverage, "logprob_unmeasured")
                out.append(diff)
    return out


def spec_totals(completions: list[Completion]) -> dict:
    """The candidate's own draft statistics summed over a phase (``drafts`` None where the
    server reports draft tokens but not rounds, as llama.cpp does)."""
    specs = [c.spec for c in completions if c.spec]
    if not specs:
        return {"reported": False}
    totals = {k: sum(int(sp.get(k) or 0) for sp in specs) for k in SPEC_FIELDS}
    if any(sp.get("drafts") is None for sp in specs):
        totals["drafts"] = None
    totals["reported"] = True
    totals["acceptance_rate"] = (totals["accepted_tokens"] / totals["draft_tokens"]
                                 if totals["draft_tokens"] else None)
    return totals
