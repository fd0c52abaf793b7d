"""``SPECTEST_SMOKE=1``: run a command as written, at token sizes — to check that it runs.

The documentation's test harness (``tests/docs``) runs every command of the README and the
quick starts as written; a sweep of the documented size takes minutes per server. With
``SPECTEST_SMOKE=1`` in the environment the long-running commands keep every flag they were
given but shrink what they measure:

* ``spectest sweep`` — the last workload given only (rag by default: the longest prompts, where
  a server's context is too short), the first concurrency step only, 2 s per step and arm, no
  warm-up, at most 16 output tokens per request, a step ends once 2 measured requests have
  finished, one look per step (no sequential looks), no K-validation arm;
* Locust with spectest's flags (``--steps`` / ``--request-rates``) — 2 s per step;
* ``spectest audit`` — 2 prompts, 8 greedy tokens, 2 sampled continuations of 8 tokens each;
* ``spectest profile`` — batch sizes 1 and 2, K up to 2, 2 timed rounds;
* ``spectest generate`` — at most 16 tokens.

Each says so in one line on stderr: such a run's figures are not measurements (its report
says "not enough data" where it has too few requests, as for any short run). Scripts that
wrap these commands (``scripts/*_example.*``) get their short mode from it.

Owns the variable's name and the sizes; imports nothing heavy (Locust loads it).
"""

from __future__ import annotations

import os
import sys

ENV = "SPECTEST_SMOKE"
STEP_S = 2.0  # seconds per sweep / Locust step
SWEEP_REQUESTS = 2  # a sweep step ends once this many measured requests have finished
SWEEP_TOKENS = 16  # output tokens per sweep request, at most
AUDIT = {"num_prompts": 2, "greedy_tokens": 8, "samples_per_prompt": 2, "sample_tokens": 8}
PROFILE = {"batch_sizes": "1,2", "k_max": 2, "rounds": 2}
GENERATE_TOKENS = 16

_told: set[str] = set()


def active() -> bool:
    return os.environ.get(ENV, "").strip() not in ("", "0")


def note(command: str, what: str) -> None:
    """One line on stderr, once per command and process."""
    if command not in _told:
        _told.add(command)
        print(f"{command}: {ENV} is set: a smoke run ({what}); its figures are not "
              f"measurements", file=sys.stderr, flush=True)


def sweep_args(args) -> None:
    """Shrink a parsed ``spectest sweep`` namespace in place (when active)."""
    if not active():
        return
    first = (args.steps.replace(" ", "").split(",")[0] if args.steps.strip() else "1")
    given = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if given:
        args.workloads = given[-1]
    args.steps, args.max_concurrency = first, 0
    args.step_time, args.warmup = min(args.step_time, STEP_S), 0.0
    args.max_step_time = args.step_time  # one look: a smoke run settles nothing
    args.requests_per_step = SWEEP_REQUESTS
    args.max_tokens = min(args.max_tokens or SWEEP_TOKENS, SWEEP_TOKENS)
    args.verify_advice = "off"
    note("spectest sweep", f"workload {args.workloads} and concurrency {first} only, "
                           f"one look of {STEP_S:g} s per step, no warm-up, {args.max_tokens} "
                           f"tokens per request")


def audit_overrides() -> dict:
    """Settings that replace the audit's sizes (when active; else nothing)."""
    if not active():
        return {}
    note("spectest audit", ", ".join(f"{k.replace('_', '-')} {v}" for k, v in AUDIT.items()))
    return dict(AUDIT)


def locust_step_time(step_time: float) -> float:
    return min(step_time, STEP_S) if active() else step_time


def profile_args(args) -> None:
    if active():
        for name, value in PROFILE.items():
            setattr(args, name, value)
        note("spectest profile", "batch sizes 1,2, K up to 2, 2 rounds")


def generate_tokens(max_tokens: int) -> int:
    if active():
        note("spectest generate", f"at most {GENERATE_TOKENS} tokens")
        return min(max_tokens, GENERATE_TOKENS)
    return max_tokens
