"""``spectest audit``: the command line of the KL/logprob auditor and CI quality-drift gate.

Owns: the flags (kebab-case, every one also settable in a ``--config`` TOML/JSON file; the
command line wins), running the audit, writing the report files, printing the human summary,
and the exit code — 0 pass, 1 drift found, 2 could not run (with one readable line on stderr,
never a traceback).

Does not know: how checks work (``runner``, the check modules) or how files look (``gate``).
The top-level ``spectest`` CLI calls :func:`add_arguments` and :func:`main`;
``python -m spectest.audit`` runs the same thing standalone.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

from spectest import flavours, procs, smoke
from spectest.audit import gate, runner
from spectest.audit.samples import AuditError
from spectest.audit.settings import (CHECKS, CONDITIONS, NAMES, PROFILES, AuditSettings,
                                     read_config, resolve)
from spectest.engine.drafter_names import DRAFTING

DESCRIPTION = """\
Prove that speculative decoding does not change what the model says, or show where it does.
Sends the same prompts to a CANDIDATE (speculative) and a BASELINE (target-only) server and runs
three checks: greedy equality at temperature 0, logprob/KL agreement at the same prefixes, and a
statistical test that the candidate's sampled tokens (temperature > 0) follow the baseline's
distribution. Exit 0 pass, 1 drift found, 2 could not run.

Either side may be 'embedded' (the bundled server, started on a free loopback port and stopped
afterwards). Give the same URL twice to audit one server against itself with spectest's
per-request switch: the candidate's requests then carry {"speculative": true} and the
baseline's {"speculative": false} (override with --candidate-extra / --baseline-extra, JSON
objects merged into every generation request, e.g. for other engines' switches)."""

_DEFAULTS = {f.name: f.default for f in fields(AuditSettings)}


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"speculative\": true}'")
    return value


def _checks(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in CHECKS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(CHECKS)} (comma-separated)")
    return names


def _conditions(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in CONDITIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(CONDITIONS)} "
                                         f"(comma-separated)")
    return names


def _opt(group, name: str, help: str, **kw) -> None:
    default = _DEFAULTS[name]
    shown = ",".join(default) if isinstance(default, tuple) else default
    kw.setdefault("type", type(default) if isinstance(default, (int, float, str)) else str)
    group.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                       help=f"{help} (default: {shown})", **kw)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--config", type=Path, default=None,
                   help="TOML or JSON file of settings, keys spelled like these flags")
    g = p.add_argument_group("servers")
    _opt(g, "candidate", "candidate base URL (http://host:port) or 'embedded'")
    _opt(g, "baseline", "baseline base URL or 'embedded'")
    _opt(g, "candidate_model", "candidate model id (default: first of /v1/models)")
    _opt(g, "baseline_model", "baseline model id (default: first of /v1/models)")
    _opt(g, "candidate_extra", "JSON object merged into candidate requests", type=_json_object)
    _opt(g, "baseline_extra", "JSON object merged into baseline requests", type=_json_object)
    _opt(g, "api_key", "Bearer key sent to both servers")
    _opt(g, "candidate_flavour", "candidate server kind (default: detected)",
         choices=list(flavours.BY_KEY))
    _opt(g, "baseline_flavour", "baseline server kind (default: detected)",
         choices=list(flavours.BY_KEY))
    _opt(g, "scoring", "how the baseline scores the candidate's tokens: echo + logprobs, or "
         "generation after each prefix (servers without echo, e.g. llama.cpp)",
         choices=["auto", "echo", "generation"])
    _opt(g, "prompt_format", "send prompts as token ids, or as text (servers that refuse "
         "token ids; the server re-tokenises)", choices=["auto", "token-ids", "text"])
    _opt(g, "embedded_model", "model for 'embedded' servers")
    _opt(g, "embedded_draft", "draft checkpoint for 'embedded' servers")
    _opt(g, "embedded_drafter", "drafter of the embedded candidate",
         choices=DRAFTING)
    _opt(g, "embedded_k", "draft length K of the embedded candidate", type=int)
    _opt(g, "embedded_threads", "torch threads of an embedded server", type=int)
    _opt(g, "embedded_device", "where an embedded server runs its engine",
         choices=["auto", "cpu", "cuda"])
    g = p.add_argument_group("prompts and sizes")
    _opt(g, "prompts", "bundled dataset (chat, code, rag, mixed) or a JSONL file with "
         "'prompt' or 'messages' per line")
    _opt(g, "num_prompts", "prompts audited")
    _opt(g, "max_prompt_tokens", "prompts are cut to this many tokens")
    _opt(g, "greedy_tokens", "tokens generated per prompt at temperature 0")
    _opt(g, "samples_per_prompt", "sampled continuations per prompt (distinct seeds)")
    _opt(g, "sample_tokens", "tokens per sampled continuation")
    _opt(g, "logprobs", "top-n logprobs requested (<= 20)")
    p.add_argument("--noise-floor", dest="noise_floor", action=argparse.BooleanOptionalAction,
                   default=argparse.SUPPRESS, help="measure the baseline against itself and "
                   "widen the tie/logprob tolerances to 2x that floor (default: on)")
    _opt(p, "sampled_control", "judge the candidate's sampled tokens against continuations the "
         "baseline samples itself (auto: where the noise floor shows the baseline's scoring "
         "is not the distribution it samples from, or was not measured)",
         choices=("auto", "on", "off"))
    p.add_argument("--ignore-eos", dest="ignore_eos", action=argparse.BooleanOptionalAction,
                   default=argparse.SUPPRESS, help="generate full lengths past EOS "
                   "(default: on)")
    g = p.add_argument_group("sampling for the distribution test")
    _opt(g, "temperature", "temperature (must not be 1, or a temperature bug can hide)")
    _opt(g, "top_p", "top-p (below 1, or a top-p bug can hide)")
    _opt(g, "top_k", "top-k (<= --logprobs, so the baseline reports every possible token)")
    g = p.add_argument_group("thresholds")
    _opt(g, "alpha", "false-positive rate of the distribution test")
    _opt(g, "tie_tolerance", "greedy divergences and top-1 swaps with a baseline margin below "
         "this many nats are floating-point ties")
    _opt(g, "support_tolerance", "tokens this close to the top-k/top-p edge are ties")
    _opt(g, "max_greedy_divergences", "real (non-tie) greedy divergences allowed")
    _opt(g, "max_kl", "largest per-position KL allowed (nats)")
    _opt(g, "mean_kl", "largest mean KL allowed (nats)")
    _opt(g, "max_abs_logprob", "largest |logprob difference| allowed (nats)")
    _opt(g, "max_top1_disagreement", "share of positions whose top-1 may differ (non-tie)")
    _opt(g, "mismatch_tolerance", "mean next-token logprob gap (nats) above which candidate "
         "and baseline count as different models")
    _opt(g, "checks", "checks to run", type=_checks)
    g = p.add_argument_group(
        "conditions", "where the checks run: base (fresh prompts, no other traffic), load "
        "(beside background traffic), prefix-reuse (cold vs warm prefix cache), long (long "
        "outputs, long prompts, multi-turn), params (a ladder of sampling settings), "
        "preemption (more than the KV cache holds)")
    _opt(g, "profile", f"which conditions run: default = base; full = all of "
         f"{', '.join(CONDITIONS)}", choices=list(PROFILES))
    _opt(g, "conditions", "run these conditions instead of the profile's (comma-separated); "
         "one named that cannot run makes the audit exit 2", type=_conditions)
    _opt(g, "load_concurrency", "background requests in flight (load)")
    _opt(g, "load_prompts", "prompts audited under load")
    _opt(g, "load_workload", "the background traffic's requests: a bundled dataset (chat, "
         "code, rag, mixed) or a JSONL file, as --prompts; your own traffic's shape (load)")
    _opt(g, "prefix_prompts", "prompts sharing one prefix (prefix-reuse)")
    _opt(g, "prefix_tokens", "the shared prefix's length in tokens (prefix-reuse)")
    _opt(g, "long_tokens", "greedy tokens of each long output (long)")
    _opt(g, "long_prompts", "prompts continued for --long-tokens (long)")
    _opt(g, "long_prompt_tokens", "length of the long prompts, context permitting (long)")
    _opt(g, "turns", "user turns of the multi-turn history (long)")
    _opt(g, "params_prompts", "prompts per sampling setting (params)")
    _opt(g, "params_samples", "sampled continuations per prompt and side (params)")
    _opt(g, "params_tokens", "tokens per sampled continuation (params)")
    _opt(g, "preemption_requests", "long requests sent at once (preemption)")
    _opt(g, "preemption_tokens", "tokens each of them generates (preemption)")
    _opt(g, "candidate_restart", "shell command that restarts the candidate when it dies "
         "(e.g. 'docker restart vllm-spec'); the audit then goes on with the rest")
    _opt(g, "revive_timeout", "seconds to wait for a dead candidate to answer again",
         type=float)
    _opt(g, "embedded_kv_budget", "KV positions an embedded server's running requests may "
         "hold (spectest serve --kv-budget-tokens), so that preemption can be reached",
         type=int)
    g = p.add_argument_group("run")
    _opt(g, "seed", "seed for prompt choice, sampling seeds and the PIT")
    _opt(g, "concurrency", "requests in flight per server")
    _opt(g, "timeout", "seconds per request")
    _opt(g, "out", "directory for report.json, junit.xml and summary.md")
    p.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction,
                   default=argparse.SUPPRESS, help="progress bar on stderr (default: on)")


def main(args: argparse.Namespace) -> int:
    try:
        config = read_config(args.config) if getattr(args, "config", None) else None
        flags = {n: getattr(args, n) for n in NAMES if hasattr(args, n)}
        flags.update(smoke.audit_overrides())  # SPECTEST_SMOKE: token sizes (the docs' tests)
        settings = resolve(config, flags)
    except AuditError as exc:
        print(f"spectest audit: {exc}", file=sys.stderr)
        return gate.EXIT_CANNOT_RUN
    started, t0 = time.time(), time.perf_counter()
    main_thread = threading.current_thread() is threading.main_thread()
    with procs.sigterm_as_interrupt():  # a cancelled CI job (SIGTERM) keeps its report
        run = runner.run(settings, (signal.SIGTERM,) if main_thread else ())
    outs = gate.outcomes(run)
    report = gate.build_report(run, outs, started, time.perf_counter() - t0)
    try:
        paths = gate.write_all(Path(settings.out), report, outs)
    except OSError as exc:
        print(f"spectest audit: cannot write the report to {settings.out}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return gate.EXIT_CANNOT_RUN
    print(gate.summary_text(report), end="")
    print(f"\nreport: {paths['json']}  junit: {paths['junit']}  summary: {paths['summary']}  "
          f"({report['duration_s']:.1f} s)")
    if report["exit_code"] == gate.EXIT_CANNOT_RUN:
        print(f"spectest audit: could not run: {report['reason']}", file=sys.stderr)
    return report["exit_code"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spectest audit")
    add_arguments(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
