"""What every condition shares: its context, its result, and the checks it runs with.

Owns: :class:`Context` (the two clients, the tolerances the base audit settled, the share of
the false-alarm rate each statistical check gets, the settings known to break the candidate,
where reproducers go), :class:`CheckResult` / :class:`ConditionResult` (what a condition found,
whether it was reached and why not), and the checks in the shape conditions use them —
greedy equality and logprob agreement over greedy pairs (:func:`judge_greedy`), the sampled
distribution test (:func:`sampled_check`) — each saving a reproducer when it fails; and
:func:`guarded`, which turns a candidate that fails a request the baseline serves into a
finding, gets it back (waits for it, or runs ``--candidate-restart``) and lets the audit go on.

Does not know: which conditions exist (``conditions``) or report files (``gate``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from spectest import procs
from spectest.audit import collect, distribution_check, failures, greedy, logprobs, reproducer
from spectest.audit.client import Client
from spectest.audit.distribution import SamplingSpec
from spectest.audit.samples import AuditError, Completion, PromptCase, ServerFailure
from spectest.audit.settings import AuditSettings

PASS, FAIL, NOT_RUN, NOT_REACHED = "pass", "fail", "not run", "not reached"


@dataclass(frozen=True)
class CheckResult:
    check: str  # greedy | logprobs | distribution | cold vs warm | stop | seed | serving | …
    status: str  # pass | fail | not run
    summary: str
    cause: str = ""
    p_value: float | None = None  # statistical checks: their raw p-value …
    alpha: float | None = None  # … and the level it was judged at
    reproducer: str | None = None  # the saved reproducer of a failure (a path)
    details: Mapping = field(default_factory=dict)


@dataclass
class ConditionResult:
    name: str
    title: str
    status: str = NOT_RUN
    reason: str = ""  # why it was not run / not reached
    checks: list[CheckResult] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # what shows the condition was met
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def settle(self, reached: bool = True, why: str = "") -> ConditionResult:
        """The status from the checks: a failed check fails the condition; checks that all
        passed on a condition not met are 'not reached' (they proved nothing about it)."""
        ran = [c for c in self.checks if c.status != NOT_RUN]
        if any(c.status == FAIL for c in ran):
            self.status = FAIL
        elif not ran:
            self.status, self.reason = NOT_RUN, why or self.reason or "no check could run"
        elif not reached:
            self.status, self.reason = NOT_REACHED, why
        else:
            self.status = PASS
        return self

    def public(self) -> dict:
        return {"name": self.name, "title": self.title, "status": self.status,
                "reason": self.reason, "evidence": self.evidence, "notes": self.notes,
                "seconds": round(self.seconds, 1),
                "checks": [asdict(c) for c in self.checks]}


@dataclass
class Context:
    s: AuditSettings
    cand: Client
    base: Client
    cases: list[PromptCase]  # the base audit's prompts, as token ids
    tie_tolerance: float
    thresholds: logprobs.Thresholds
    control: bool  # sampled checks against the baseline's own samples (``two_sample``)
    alpha: float  # the level of each statistical check (the audit's alpha, Bonferroni)
    saver: reproducer.Saver
    edge_noise: float = 0.0
    avoid: dict[str, str] = field(default_factory=dict)  # setting → the finding it broke in
    failures: list[failures.CandidateFailure] = field(default_factory=list)
    restart: procs.Child | None = None  # the last --candidate-restart command started
    restarts: int = 0
    dead: str = ""  # set when the candidate is gone for good: what is left is not run

    def sampling(self) -> SamplingSpec | None:
        """The distribution test's sampling, less what is known to break the candidate (None:
        sampling at all breaks it)."""
        s = self.s
        if "temperature" in self.avoid:
            return None
        if "top_k" in self.avoid:  # without top-k the distribution is known at T = 1 only
            return SamplingSpec(1.0, 1.0, 0)
        if "top_p" in self.avoid:
            return SamplingSpec(s.temperature, 1.0, s.top_k)
        return SamplingSpec(s.temperature, s.top_p, s.top_k)


async def greedy_runs(ctx: Context, cases: Sequence[PromptCase], tokens: int, *,
                      fields: Mapping | None = None, cand_salt: str | None = None,
                      desc: str = "greedy") -> list[tuple[Completion, Completion, tuple]]:
    """Candidate and baseline greedy runs of ``cases`` (the baseline's fresh, the candidate's
    fresh unless ``cand_salt`` puts it in a prefix-cache namespace) with the baseline's
    scoring of the candidate's tokens."""
    s = replace(ctx.s, greedy_tokens=tokens)
    bar = collect.progress_bar(s, len(cases) * 3, desc)
    try:
        return list(await asyncio.gather(*(
            collect.greedy_pair(ctx.cand, ctx.base, c, s, bar, fields=fields,
                                cand_salt=cand_salt) for c in cases)))
    finally:
        bar.close()


def judge_greedy(ctx: Context, label: str, cases: Sequence[PromptCase], runs,
                 steps: Sequence[Mapping] = (), background: Mapping | None = None,
                 tag: str = "", retie: Callable | None = None) -> list[CheckResult]:
    """Greedy equality and logprob agreement over ``runs`` (:func:`greedy_runs`), named
    ``greedy{tag}`` and ``logprobs{tag}``; a failure saves a reproducer (``steps``: requests to
    send the candidate first, e.g. to warm its cache; ``background``: traffic to run
    alongside; ``retie(case, divergence, candidate completion)``: the margin between the two
    tokens as the server decided them, where its raw logprobs do not say it (penalties))."""
    c_out, b_out, scored = (list(x) for x in zip(*runs)) if runs else ([], [], [])
    t = ctx.thresholds
    g = greedy.check(cases, c_out, b_out, scored, ctx.tie_tolerance, t.max_abs_logprob,
                     ctx.s.max_greedy_divergences)
    if retie is not None and (g.failures or g.ties):  # judge every divergence again
        by_id = {c.id: (c, x) for c, x in zip(cases, c_out)}
        keep, tied = [], []
        for d in g.failures + g.ties:
            margin = retie(*by_id[d.prompt_id], d)
            tie = d.tie if margin is None else margin < ctx.tie_tolerance
            d = replace(d, margin=d.margin if margin is None else margin, tie=tie,
                        cause="floating-point tie" if tie else d.cause if not d.tie else
                        "the candidate's greedy token is not the one the setting makes the "
                        "argmax: it was not applied where the token was chosen")
            (tied if tie else keep).append(d)
        g = replace(g, ties=tuple(tied), failures=tuple(sorted(keep, key=lambda d: -d.margin)))
    coverage: dict = {}
    lp = logprobs.check(collect.diffs(cases, [(i, c, sc) for i, (c, sc) in
                                              enumerate(zip(c_out, scored))],
                                      ctx.tie_tolerance, coverage), t)
    out = []
    path = None
    if not g.passed:
        d = g.failures[0]
        i = next(k for k, c in enumerate(cases) if c.id == d.prompt_id)
        path = ctx.saver.greedy(label, d, c_out[i], b_out[i], steps, background)
    out.append(CheckResult(f"greedy{tag}", PASS if g.passed else FAIL, g.reason(),
                           "" if g.passed else g.failures[0].cause, reproducer=path,
                           details={"exact": g.exact, "prompts": g.prompts,
                                    "ties": len(g.ties), "divergences": len(g.failures)}))
    path = None
    if not lp.passed and lp.worst:
        w = lp.worst[0]
        i = next((k for k, c in enumerate(cases) if c.id == w.prompt_id), 0)
        path = ctx.saver.logprobs(label, w, c_out[i], steps, background)
    out.append(CheckResult(f"logprobs{tag}", PASS if lp.passed else FAIL, lp.reason(),
                           "" if lp.passed else lp.cause(), reproducer=path,
                           details={"positions": lp.all.positions}))
    return out


async def sampled_check(ctx: Context, label: str, cases: Sequence[PromptCase], *,
                        samples: int, tokens: int, spec: SamplingSpec | None = None,
                        fields: Mapping | None = None, cand_salt: str | None = None,
                        control: bool | None = None, seed: int | None = None,
                        background: Mapping | None = None, tag: str = "") -> CheckResult:
    """The distribution test on ``samples`` continuations of ``tokens`` per prompt, at the
    context's alpha; ``control`` (default: the context's) compares them with as many the
    baseline samples itself — exact whatever the scoring (``two_sample``), which is what a
    setting the scoring cannot model (penalties, min-p) needs."""
    spec = spec or ctx.sampling()
    if spec is None:
        return CheckResult(f"distribution{tag}", NOT_RUN, "not sampled: sampling at "
                           f"temperature > 0 breaks the candidate "
                           f"({ctx.avoid['temperature']})")
    control = ctx.control if control is None else control
    s = replace(ctx.s, samples_per_prompt=samples, sample_tokens=tokens,
                seed=ctx.s.seed if seed is None else seed)
    triples, theirs = await collect.sampled_phase(ctx.cand, ctx.base, list(cases), s, control,
                                                  fields=fields, cand_salt=cand_salt,
                                                  spec=spec)
    coverage: dict = {}
    items = collect.sampled_items(list(cases), triples, coverage)
    ctrl = None if theirs is None else collect.sampled_items(list(cases), theirs, coverage)
    edge = max(ctx.s.support_tolerance, ctx.tie_tolerance) \
        if ctx.tie_tolerance > ctx.s.tie_tolerance else ctx.s.support_tolerance
    order = ctx.cand.routes.flavour.sampling_order if ctx.cand.routes.flavour \
        else "temperature-first"
    result = distribution_check.check(items, replace(spec, order=order), ctx.alpha, len(cases),
                                      s.seed, edge, edge_noise=ctx.edge_noise, control=ctrl)
    path = None
    if not result.passed:
        path = ctx.saver.sampled(label, [c.body for _, _, c, _ in triples],
                                 None if theirs is None else [c.body for _, _, c, _ in theirs],
                                 result.pit.p_value, result.reason(), background)
    return CheckResult(f"distribution{tag}", PASS if result.passed else FAIL, result.reason(),
                       "" if result.passed else result.cause(), p_value=result.pit.p_value,
                       alpha=ctx.alpha, reproducer=path,
                       details={"tested_tokens": result.tested, "violations":
                                len(result.violations), "method": result.pit.method})


async def guarded(ctx: Context, result: ConditionResult, what: str, work: Awaitable,
                  breaking: str = "") -> object | None:
    """Await ``work``; when the candidate fails a request in it that the baseline serves, add
    the finding (a failed ``serving`` check, with its reproducer) to ``result``, remember
    ``breaking`` (the setting that broke it) for the rest of the audit, get the candidate back
    and return None. The baseline failing too is "could not run" (AuditError)."""
    try:
        return await work
    except ServerFailure as exc:
        if exc.role != "candidate":
            raise
        failed = exc
    found = await failures.confirm(failed, ctx.cand, ctx.base, what, breaking)
    ctx.failures.append(found)
    if breaking:
        ctx.avoid[breaking] = found.summary()
    path = ctx.saver.serving(result.name, found, failed.path, failed.body)
    result.checks.append(CheckResult("serving", FAIL, found.summary(), reproducer=path))
    await revive(ctx)
    return None


async def revive(ctx: Context) -> bool:
    """The candidate answers again: at once, after ``--candidate-restart`` (started in its
    own process group, stopped with the audit), or within ``--revive-timeout``; else
    ``ctx.dead`` says why the rest of the audit is not run."""
    if await failures.answers(ctx.cand):
        return True
    command = ctx.s.candidate_restart
    if command:
        if ctx.restart is not None:
            ctx.restart.stop()
        ctx.restarts += 1
        log = Path(ctx.s.out) / f"candidate-restart-{ctx.restarts}.log"
        ctx.restart = procs.Child(["/bin/sh", "-c", command], name="--candidate-restart",
                                  log_path=log).start()
    deadline = time.monotonic() + ctx.s.revive_timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(2.0)
        if await failures.answers(ctx.cand):
            await ctx.cand.reset_session()
            return True
    how = (f"after --candidate-restart ({command})" if command
           else "(no --candidate-restart given)")
    ctx.dead = (f"the candidate stopped answering and did not come back within "
                f"{ctx.s.revive_timeout:g} s {how}")
    return False


async def context_length(client: Client) -> int | None:
    """The server's context per request, where it says (``max_model_len`` in ``/v1/models``:
    vLLM, spectest; the flavour's ``context_probe``: llama.cpp's per-slot ``n_ctx``)."""
    flavour = client.routes.flavour
    if flavour is not None and flavour.context_probe:
        path, keys = flavour.context_probe
        try:
            value = await client.call("GET", path)
            for key in keys.split("."):
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, int):
                return value
        except AuditError:
            pass
    for model in await client.models():
        if model.get("id") == client.model and isinstance(model.get("max_model_len"), int):
            return model["max_model_len"]
    return None


def timed(fn: Callable[[Context, ConditionResult], Awaitable[None]]):
    """A condition's body, timed, with the dead-candidate and could-not-run rules applied."""
    async def run(ctx: Context, result: ConditionResult) -> ConditionResult:
        t0 = time.perf_counter()
        try:
            if ctx.dead:
                result.reason = ctx.dead
                return result.settle(why=ctx.dead)
            await fn(ctx, result)
        except AuditError as exc:  # this condition could not run; the others may
            result.checks = [c for c in result.checks if c.status != NOT_RUN]
            result.reason = str(exc)
            if not any(c.status == FAIL for c in result.checks):
                result.status = NOT_RUN
                return result
            result.settle()
        finally:
            result.seconds = time.perf_counter() - t0
        return result
    return run
