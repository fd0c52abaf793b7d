"""One audit run: start embedded servers if asked, collect, run the three checks.

Owns: the order of work — preflight (both servers answer, their routes are probed — see
``scoring`` — and they serve the same model), prompts → token ids, the temperature-0 phase
(candidate and baseline generate, the baseline scores the candidate's output), the sampled
phase (the candidate samples ``samples_per_prompt`` continuations per prompt with distinct
seeds, the baseline scores each) — and feeding the collected data to ``greedy``, ``logprobs``
and ``distribution``, with a record per check of the route it ran on and the positions it
could not use (``AuditRun.routes``, ``AuditRun.coverage``).  Results of finished phases are
kept when the run is interrupted or a later phase fails.

Does not know: report formats or exit codes (``gate``), statistics (the check modules).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from tqdm import tqdm

from spectest.audit import distribution_check, failures, greedy, logprobs, noise, scoring
from spectest.audit.client import Client, Endpoint, Routes
from spectest.audit.prompts import load_records, tokenize
from spectest.audit.samples import AuditError, Completion, PromptCase, ServerFailure
from spectest.audit.servers import ServerProcess, ServerSpec
from spectest.audit.settings import EMBEDDED, AuditSettings

SPEC_FIELDS = ("drafts", "draft_tokens", "accepted_tokens")
SAMPLED_CHUNK = 4  # tokens per generation-scoring request for sampled continuations


@dataclass
class AuditRun:
    """Everything the report needs; filled phase by phase."""

    settings: AuditSettings
    endpoints: dict = field(default_factory=dict)
    cases: list[PromptCase] = field(default_factory=list)
    greedy: greedy.GreedyResult | None = None
    logprobs: logprobs.LogprobResult | None = None
    distribution: distribution_check.DistributionResult | None = None
    error: str | None = None  # why the audit could not run (exit 2)
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    speculation: dict = field(default_factory=dict)  # the candidate's spec totals by phase
    diffs: list[logprobs.PositionDiff] = field(default_factory=list)
    routes: dict = field(default_factory=dict)  # per check: how it ran, in words
    noise_floor: noise.NoiseFloor | None = None  # the baseline against itself
    tolerances: dict = field(default_factory=dict)  # the ones applied (after widening)
    coverage: dict = field(default_factory=dict)  # positions seen / left out, and why
    failure: failures.CandidateFailure | None = None  # a request the baseline served, failed


def endpoints_for(settings: AuditSettings, urls: dict[str, str]) -> tuple[Endpoint, Endpoint]:
    """The two endpoints; one server for both sides gets the ``speculative`` A/B switch."""
    cand_extra, base_extra = dict(settings.candidate_extra), dict(settings.baseline_extra)
    if urls["candidate"] == urls["baseline"] and not cand_extra and not base_extra:
        cand_extra, base_extra = {"speculative": True}, {"speculative": False}
    return (Endpoint("candidate", urls["candidate"], settings.candidate_model, cand_extra,
                     settings.api_key, settings.candidate_flavour),
            Endpoint("baseline", urls["baseline"], settings.baseline_model, base_extra,
                     settings.api_key, settings.baseline_flavour))


def run(settings: AuditSettings) -> AuditRun:
    """Run the audit (synchronously). Never raises AuditError: it lands in ``run.error``."""
    result = AuditRun(settings)
    with contextlib.ExitStack() as stack:
        try:
            records = load_records(settings.prompts, settings.num_prompts, settings.seed)
            urls = _start_embedded(settings, stack, result)
            cand, base = endpoints_for(settings, urls)
            result.endpoints = {e.role: {"url": e.url, "model": e.model, "extra": dict(e.extra)}
                                for e in (cand, base)}
            asyncio.run(_collect(settings, cand, base, records, result))
        except AuditError as exc:
            result.error = str(exc)
        except KeyboardInterrupt:
            result.interrupted = True
            result.error = "interrupted; the checks that finished are kept"
            _logprobs_so_far(result, settings)
    return result


def _start_embedded(settings: AuditSettings, stack: contextlib.ExitStack,
                    result: AuditRun) -> dict[str, str]:
    urls = {"candidate": settings.candidate, "baseline": settings.baseline}
    wanted = [role for role, url in urls.items() if url == EMBEDDED]
    if not wanted:
        return urls
    both = len(wanted) == 2
    for role in wanted:
        drafter = settings.embedded_drafter if role == "candidate" or both else "none"
        spec = ServerSpec(settings.embedded_model, settings.embedded_draft, drafter,
                          settings.embedded_k, settings.embedded_threads,
                          device=settings.embedded_device)
        t0 = time.perf_counter()
        urls[role] = stack.enter_context(ServerProcess(spec))
        result.notes.append(f"embedded {role}: spectest serve --model {spec.model} "
                            f"--drafter {drafter} at {urls[role]} (started in "
                            f"{time.perf_counter() - t0:.1f} s)")
        if both:
            urls["baseline"] = urls["candidate"]
            break
    return urls


def _bar(settings: AuditSettings, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="req", disable=not settings.progress,
                leave=False, dynamic_ncols=True)


def _ticked(bar: tqdm, coro) -> asyncio.Task:
    """A task that ticks the progress bar when it ends (a task, so that cancelling it on
    Ctrl-C/SIGTERM also closes its coroutine cleanly)."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda t: t.cancelled() or bar.update(1))
    return task


async def _collect(s: AuditSettings, cand_ep: Endpoint, base_ep: Endpoint,
                   records: list, result: AuditRun) -> None:
    async with Client(cand_ep, s.concurrency, s.timeout) as cand, \
            Client(base_ep, s.concurrency, s.timeout) as base:
        phase = ["preflight"]
        try:
            await _phases(s, cand, base, records, result, phase)
        except ServerFailure as exc:
            if exc.role != "candidate":
                raise
            result.failure = await failures.confirm(exc, cand, base, phase[0])
        if result.failure is not None:
            _logprobs_so_far(result, s)


def _logprobs_so_far(result: AuditRun, s: AuditSettings) -> None:
    """The logprob check over the positions collected before the run stopped early."""
    if result.logprobs is None and result.diffs and "logprobs" in s.checks:
        applied = {k: v for k, v in result.tolerances.items() if k != "tie_tolerance"}
        result.logprobs = logprobs.check(
            result.diffs, logprobs.Thresholds(**applied) if applied else s.logprob_thresholds)
        result.notes.append(f"the logprob check covers the {len(result.diffs)} positions "
                            f"collected before the audit stopped")


async def _phases(s: AuditSettings, cand: Client, base: Client, records: list,
                  result: AuditRun, phase: list[str]) -> None:
    """The audit's phases in order; ``phase[0]`` names the one running (for a finding)."""
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
    result.cases = cases = await tokenize(records, base, s.max_prompt_tokens)
    await _same_model(cand, base, cases[:3], s)
    result.timings["preflight_s"] = time.perf_counter() - t0
    _record_routes(result, cand.routes, base.routes, s)

    thresholds, tie_tol = s.logprob_thresholds, s.tie_tolerance
    c_out: list[Completion] = []  # the candidate's greedy runs
    if "greedy" in s.checks or "logprobs" in s.checks:
        phase[0] = "greedy"
        t0 = time.perf_counter()
        bar = _bar(s, len(cases) * 3, "greedy")
        runs = await asyncio.gather(*(_greedy_one(cand, base, c, s, bar) for c in cases))
        bar.close()
        c_out, b_out, scored = (list(x) for x in zip(*runs))
        result.speculation["greedy"] = _spec_totals(c_out)
        _count(result.coverage, "left_out_tokens", sum(c.left_out for c in c_out + b_out))
        if s.noise_floor:
            result.noise_floor = await noise.measure(base, cases, b_out, s.logprobs,
                                                     s.tie_tolerance)
            thresholds, tie_tol = result.noise_floor.widen(thresholds, tie_tol)
        result.tolerances = {"tie_tolerance": tie_tol, **asdict(thresholds)}
        if "greedy" in s.checks:
            result.greedy = greedy.check(cases, c_out, b_out, scored, tie_tol,
                                         thresholds.max_abs_logprob,
                                         s.max_greedy_divergences)
        result.diffs += _diffs(cases, [(i, c, sc) for i, (c, sc) in
                                       enumerate(zip(c_out, scored))], tie_tol,
                               result.coverage)
        result.timings["greedy_s"] = time.perf_counter() - t0
        if "distribution" not in s.checks and "logprobs" in s.checks:
            result.logprobs = logprobs.check(result.diffs, thresholds)

    if "distribution" in s.checks:
        phase[0] = "sampling ladder"
        t0 = time.perf_counter()
        result.failure, rung = await failures.sampling_ladder(
            cand, base, scoring.prompt_for(cand, result.cases[0]), temperature=s.temperature,
            top_p=s.top_p, top_k=s.top_k, max_tokens=s.sample_tokens, logprobs=s.logprobs,
            ignore_eos=s.ignore_eos, seed=s.seed)
        if result.failure is not None:
            return
        processed = bool(c_out and rung and rung.positions and c_out[0].positions and
                         scoring.processed_logprobs(rung.positions[0], c_out[0].positions[0],
                                                    tie_tol))
        if processed and "logprobs" in s.checks:
            result.routes["logprobs"] += ("; at temperature > 0 the candidate reports logprobs "
                                          "after its sampling settings (vLLM: --logprobs-mode "
                                          "processed_logprobs), so its sampled positions are "
                                          "left out: the check covers its greedy runs")
        phase[0] = "sampling"
        why = _control_reason(s, result.noise_floor)
        if why:
            result.routes["distribution"] += ("; judged against continuations the baseline "
                                              f"sampled itself (two-sample permutation "
                                              f"test: {why})")
        if why and own_scoring(base):
            result.routes["distribution"] += ("; the baseline's own continuations are scored "
                                              "by the logprobs it reported while decoding "
                                              "them, the candidate's by decoding them the "
                                              "same way under a constraint that allows only "
                                              "their text")
        triples, control = await sampled_phase(cand, base, cases, s, bool(why))
        result.speculation["sampled"] = _spec_totals([c for _, _, c, _ in triples])
        _count(result.coverage, "left_out_tokens",
               sum(c.left_out for _, _, c, _ in triples + (control or [])))
        if "logprobs" in s.checks:
            if not processed:
                result.diffs += _diffs(cases, [(i, c, sc) for i, _, c, sc in triples], tie_tol,
                                       result.coverage)
            result.logprobs = logprobs.check(result.diffs, thresholds)
        items = _sampled_items(cases, triples, result.coverage)
        control_items = (None if control is None else
                         _sampled_items(cases, control, result.coverage))
        spec = replace(s.sampling, order=_sampling_order(cand.routes))
        # A baseline that disagrees with itself (noise floor) ranks tokens at the top-k
        # edge differently from one computation to the next: edge ties widen with it.
        edge_tol = max(s.support_tolerance, tie_tol) if tie_tol > s.tie_tolerance \
            else s.support_tolerance
        result.distribution = distribution_check.check(
            items, spec, s.alpha, len(cases), s.seed, edge_tol,
            edge_noise=0.0 if base.routes.echo else tie_tol, control=control_items)
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


def _count(coverage: dict, key: str, n: int = 1) -> None:
    coverage[key] = coverage.get(key, 0) + n


def _control_reason(s: AuditSettings, floor: noise.NoiseFloor | None) -> str | None:
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


Sample = tuple[int, int, Completion, tuple]  # (prompt, continuation, completion, scoring)


async def sampled_phase(cand: Client, base: Client, cases: list[PromptCase], s: AuditSettings,
                        control: bool = False) -> tuple[list[Sample], list[Sample] | None]:
    """``samples_per_prompt`` seeded samples per prompt from the candidate, each scored by the
    baseline; with ``control``, as many from the baseline itself (other seeds), scored the
    same way: [(prompt index, continuation, completion, baseline scoring of prompt + output)]
    for each."""
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
    bar = _bar(s, len(jobs) * 2, "sampling" + (" (and the baseline's own)" if control else ""))
    # One continuation is scored from start to end before the next one starts, at most as many
    # at once as the baseline runs requests. Without this every continuation's scoring was in
    # flight at once and the baseline's requests served them round-robin: none finished until
    # nearly all did (the progress stalled half-way for minutes), and each request came after
    # another continuation's, so a prefix-caching server (llama.cpp) recomputed the whole
    # prompt for every request instead of the few tokens it had not seen.
    scorers = asyncio.Semaphore(base.concurrency)
    own = own_scoring(base)
    runs = await asyncio.gather(*(_sampled_one(cand if j < n else base, base, cases[i], seed, s,
                                               bar, scorers, own and j >= n)
                                  for j, (i, _, seed) in enumerate(jobs)))
    bar.close()
    out = [(i, k, c, sc) for (i, k, _), (c, sc) in zip(jobs, runs)]
    return out[:n], (out[n:] if control else None)


def _sampled_items(cases: list[PromptCase], samples: list[Sample],
                   coverage: dict) -> list[distribution_check.Sampled]:
    items = []
    for i, k, c, sc in samples:
        for j, tok in enumerate(c.tokens):
            here = sc[len(cases[i].ids) + j]
            if here is None:
                _count(coverage, "distribution_unscored")
                continue
            own = c.positions[j] if c.positions[j].reported else None
            items.append(distribution_check.Sampled(i, j, tok, here, own, k))
    return items


async def _greedy_one(cand: Client, base: Client, case: PromptCase, s: AuditSettings, bar):
    # fresh: with a prefix cache, a greedy run's prompt may be computed in pieces shaped by
    # earlier requests, and batch shape moves the logits (llama.cpp documents this for
    # ``cache_prompt``): the comparison must not depend on what each server served before.
    kw = {"max_tokens": s.greedy_tokens, "temperature": 0.0, "logprobs": s.logprobs,
          "ignore_eos": s.ignore_eos, "fresh": True}
    c, b = await asyncio.gather(
        _ticked(bar, cand.complete(scoring.prompt_for(cand, case), **kw)),
        _ticked(bar, base.complete(scoring.prompt_for(base, case), **kw)))
    scored = await _ticked(bar, scoring.score(base, case, c.tokens, s.logprobs, known=b,
                                              pieces=c.pieces))
    return c, b, scored


def own_scoring(base: Client) -> bool:
    """Does the baseline score a continuation by decoding it token by token (constrained
    generation, ``Flavour.forced_text_field``)? Then its own samples need no scoring request:
    the logprobs it reported while sampling them come from the same computation — the same
    decode steps after the same prompt — as its scoring of the candidate's tokens."""
    flavour = base.routes.flavour
    return bool(flavour and flavour.forced_text_field and not base.routes.echo)


async def _sampled_one(cand: Client, base: Client, case: PromptCase, seed: int,
                       s: AuditSettings, bar, scorers: asyncio.Semaphore, own: bool = False):
    c = await _ticked(bar, cand.complete(
        scoring.prompt_for(cand, case), max_tokens=s.sample_tokens, temperature=s.temperature,
        top_p=s.top_p, top_k=s.top_k, seed=seed, logprobs=s.logprobs, ignore_eos=s.ignore_eos))
    if own:  # the baseline's own sample, scored by the decode that produced it
        bar.update(1)
        return c, (None,) * len(case.ids) + tuple(p if p.reported else None
                                                  for p in c.positions)
    async with scorers:
        scored = await _ticked(bar, scoring.score(base, case, c.tokens, s.logprobs,
                                                  chunk=SAMPLED_CHUNK, pieces=c.pieces))
    return c, scored


def _diffs(cases: list[PromptCase], triples, tie_tolerance: float,
           coverage: dict) -> list[logprobs.PositionDiff]:
    """Per-position logprob comparisons; positions the candidate reported nothing for (llama.cpp:
    tokens accepted from a draft) or the baseline could not score are counted, not compared."""
    out = []
    for i, comp, scored in triples:
        n = len(cases[i].ids)
        for j, pos in enumerate(comp.positions):
            _count(coverage, "logprob_positions")
            if not pos.reported:
                _count(coverage, "candidate_unreported")
            elif scored[n + j] is None:
                _count(coverage, "baseline_unscored")
            else:
                diff = logprobs.compare(cases[i].id, j, pos, scored[n + j], tie_tolerance)
                if diff.unmeasured:
                    _count(coverage, "logprob_unmeasured")
                out.append(diff)
    return out


def _spec_totals(completions: list[Completion]) -> dict:
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


async def _same_model(cand: Client, base: Client, probes: list[PromptCase],
                      s: AuditSettings) -> None:
    """Refuse to audit two different models: compare next-token logprobs on a few prompts.

    The first generated token comes from the prefill, which speculation does not touch, so a
    correct candidate matches the baseline there up to float noise.  This also checks that the
    candidate reports token-id logprobs at all.
    """
    kw = {"max_tokens": 1, "temperature": 0.0, "logprobs": s.logprobs,
          "ignore_eos": s.ignore_eos}
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

