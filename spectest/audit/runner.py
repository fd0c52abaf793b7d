"""One audit run: start embedded servers if asked, run the planned conditions, keep the results.

Owns: the order of work — the preflight and the base condition (``base``: the greedy and
sampled phases that settle the tolerances), then each further condition the profile or the
user names (``conditions``: load, prefix reuse, long sequences, sampling parameters,
preemption) — with a candidate that fails a request the baseline serves recorded as a finding
and brought back (``conditions.common.revive``) so that one crash does not hide what else is
wrong; the share of the false-alarm rate each statistical test gets (Bonferroni over the
audit's tests); the reproducers of every finding (``reproducer``); progress with an ETA.
Results of finished phases are kept when the run is interrupted or a later phase fails.

Does not know: report formats or exit codes (``gate``), statistics (the check modules), what a
condition sends (``conditions``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

from spectest.audit import base as base_condition
from spectest.audit import conditions, failures, logprobs
from spectest.audit.client import Client, Endpoint
from spectest.audit.conditions.common import Context, revive
from spectest.audit.prompts import load_records
from spectest.audit.reproducer import Saver
from spectest.audit.run import AuditRun
from spectest.audit.samples import AuditError, ServerFailure
from spectest.audit.servers import ServerProcess, ServerSpec
from spectest.audit.settings import EMBEDDED, AuditSettings
from spectest.loops import cancelled_on

CALIBRATION_PROMPTS = 8  # greedy runs that measure the noise floor when base is not run
# how long each condition takes against the base one (bundled engine, default sizes): the ETA
WEIGHT = {"base": 1.0, "load": 0.6, "prefix-reuse": 0.4, "long": 0.8, "params": 1.0,
          "preemption": 0.5}


def endpoints_for(settings: AuditSettings, urls: dict[str, str]) -> tuple[Endpoint, Endpoint]:
    """The two endpoints; one server for both sides gets the ``speculative`` A/B switch."""
    cand_extra, base_extra = dict(settings.candidate_extra), dict(settings.baseline_extra)
    if urls["candidate"] == urls["baseline"] and not cand_extra and not base_extra:
        cand_extra, base_extra = {"speculative": True}, {"speculative": False}
    return (Endpoint("candidate", urls["candidate"], settings.candidate_model, cand_extra,
                     settings.api_key, settings.candidate_flavour),
            Endpoint("baseline", urls["baseline"], settings.baseline_model, base_extra,
                     settings.api_key, settings.baseline_flavour))


def _check_load_workload(settings: AuditSettings) -> None:
    try:
        load_records(settings.load_workload, 1, settings.seed)
    except AuditError as exc:
        raise AuditError(f"--load-workload: {str(exc).removeprefix('prompt set: ')}") from None


def run(settings: AuditSettings, stop_signals: tuple[int, ...] = ()) -> AuditRun:
    """Run the audit (synchronously). Never raises AuditError: it lands in ``run.error``.
    Ctrl-C, or one of ``stop_signals`` (the main thread's: the CLI passes SIGTERM) while the
    audit talks to the servers, ends it keeping the checks that finished."""
    result = AuditRun(settings)
    result.tests = conditions.statistical_tests(settings)
    result.alpha = settings.alpha / max(1, result.tests)
    with contextlib.ExitStack() as stack:
        try:
            records = load_records(settings.prompts, settings.num_prompts, settings.seed)
            if "load" in settings.planned:  # a bad background dataset fails before any server
                _check_load_workload(settings)
            urls = _start_embedded(settings, stack, result)
            cand, base = endpoints_for(settings, urls)
            result.endpoints = {e.role: {"url": e.url, "model": e.model, "extra": dict(e.extra)}
                                for e in (cand, base)}
            asyncio.run(cancelled_on(stop_signals,
                                     _collect(settings, cand, base, records, result)))
        except AuditError as exc:
            result.error = str(exc)
        except (KeyboardInterrupt, asyncio.CancelledError):
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
        budget = settings.embedded_kv_budget
        spec = ServerSpec(settings.embedded_model, settings.embedded_draft, drafter,
                          settings.embedded_k, settings.embedded_threads,
                          ("--kv-budget-tokens", str(budget)) if budget else (),
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


async def _collect(s: AuditSettings, cand_ep: Endpoint, base_ep: Endpoint,
                   records: list, result: AuditRun) -> None:
    started = time.perf_counter()
    async with Client(cand_ep, s.concurrency, s.timeout) as cand, \
            Client(base_ep, s.concurrency, s.timeout) as base:
        saver = Saver(s.out, result.endpoints)
        result.reproducers = saver.paths
        phase = ["preflight"]
        try:
            await base_condition.preflight(s, cand, base, records, result)
            if "base" in s.planned:
                phase[0] = "greedy"
                if "greedy" in s.checks or "logprobs" in s.checks:
                    await base_condition.greedy_phase(s, cand, base, result, saver)
                if "distribution" in s.checks:
                    await base_condition.sampled_phase(s, cand, base, result, phase, saver,
                                                       result.alpha)
            else:  # the other conditions still need the tolerances the noise floor sets
                await base_condition.greedy_phase(s, cand, base, result, saver,
                                                  result.cases[:CALIBRATION_PROMPTS], False)
        except ServerFailure as exc:
            if exc.role != "candidate":
                raise
            result.failure = await failures.confirm(exc, cand, base, phase[0])
            saver.serving("base", result.failure, exc.path, exc.body)
        if result.failure is not None:
            result.findings.append(result.failure)
            _logprobs_so_far(result, s)
        rest = [c for c in s.planned if c != "base"]
        if rest and result.cases:
            await _conditions(s, cand, base, result, saver, rest, phase, started)


async def _conditions(s: AuditSettings, cand: Client, base: Client, result: AuditRun,
                      saver: Saver, names: list[str], phase: list[str], started: float) -> None:
    """The conditions after base; a candidate that failed base is brought back first, and
    the sampled phase the sampling ladder cut short is run without the setting that broke
    it."""
    thresholds, tie_tol = base_condition.tolerances(result, s)
    ctx = Context(s, cand, base, result.cases, tie_tol, thresholds,
                  bool(base_condition.control_reason(s, result.noise_floor)), result.alpha,
                  saver, edge_noise=0.0 if base.routes.echo else tie_tol)
    try:
        if result.failure is not None:
            if result.failure.breaking:
                ctx.avoid[result.failure.breaking.split(" ")[0]] = result.failure.summary()
            if await revive(ctx) and result.failure.phase == "sampling ladder" and \
                    "base" in s.planned:
                spec = ctx.sampling()
                if spec is not None and spec != s.sampling:
                    result.notes.append(
                        f"the base sampled phase ran at temperature {spec.temperature:g}, "
                        f"top-p {spec.top_p:g}, top-k {spec.top_k or 'off'}: "
                        f"{', '.join(ctx.avoid)} breaks the candidate")
                    failed, result.failure = result.failure, None
                    try:
                        await base_condition.sampled_phase(s, cand, base, result, phase, saver,
                                                           result.alpha, spec)
                    except ServerFailure as exc:
                        if exc.role != "candidate":
                            raise
                        ctx.failures.append(await failures.confirm(exc, cand, base, phase[0]))
                    result.failure = result.failure or failed
        result.conditions = await conditions.run_all(
            ctx, names, lambda i, name, done: _eta(s, names, i, name, started))
    finally:
        result.findings += [f for f in ctx.failures if f not in result.findings]
        if ctx.restart is not None:
            ctx.restart.stop()


def _eta(s: AuditSettings, names: list[str], i: int, name: str, started: float) -> None:
    """One line on stderr before each condition: where the audit is, and about how long the
    rest takes (the time so far, shared out by the conditions' weights)."""
    if not s.progress:
        return
    elapsed = time.perf_counter() - started
    done = ["base"] * ("base" in s.planned) + names[:i]
    left = names[i:]
    rate = elapsed / max(sum(WEIGHT[n] for n in done), 0.25)
    eta = rate * sum(WEIGHT[n] for n in left)
    print(f"spectest audit: condition {len(done) + 1}/{len(done) + len(left)}: {name} "
          f"({elapsed / 60:.1f} min so far, about {eta / 60:.0f} min left)",
          file=sys.stderr, flush=True)


def _logprobs_so_far(result: AuditRun, s: AuditSettings) -> None:
    """The logprob check over the positions collected before the run stopped early."""
    if result.logprobs is None and result.diffs and "logprobs" in s.checks:
        applied = {k: v for k, v in result.tolerances.items() if k != "tie_tolerance"}
        result.logprobs = logprobs.check(
            result.diffs, logprobs.Thresholds(**applied) if applied else s.logprob_thresholds)
        result.notes.append(f"the logprob check covers the {len(result.diffs)} positions "
                            f"collected before the audit stopped")
