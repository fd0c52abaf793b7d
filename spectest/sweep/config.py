"""The options of ``spectest sweep``: kebab-case flags in, one validated frozen config out.

``add_arguments`` declares the flags; ``SweepConfig.from_args`` checks them and raises
``ConfigError`` (one readable line) on bad input. Defaults are the README's first command: the
embedded pair, workloads chat, code and rag, concurrency 1, 2, 4, 8, a 3.3 s warm-up and 10 s
measured per look and arm, up to three looks per step until its verdicts are settled
(``--max-step-time``), then the advised schedule run as a third arm on the first workload
(``--verify-advice``).

The report's flags (``--min-requests-per-step``, ``--price-per-hour``, ``--target-rps`` …,
shared with ``spectest report``) land in ``sweep.json``'s ``config``, where the report reads them.
It knows nothing about processes, Locust or the report's internals.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from spectest.engine.drafter_names import DRAFTING
from spectest.report.cli import add_analysis_arguments, advice_options, analysis_options
from spectest.report.evidence import MIN_REQUESTS_PER_STEP
from spectest.report.table import SLO, SweepError

WORKLOADS = ("chat", "code", "rag", "mixed")
DEFAULT_WORKLOADS = ("chat", "code", "rag")
DEFAULT_STEPS = (1, 2, 4, 8)
# The embedded pair is a small CPU model: targets a person would set for a chat UI on it.
EMBEDDED_SLO = SLO(ttft_p99_ms=1000.0, tpot_p99_ms=60.0, e2el_p99_ms=None)


class ConfigError(ValueError):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to run")
    g.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help="comma-separated bundled workloads (chat, code, rag, mixed) or "
                        "locustfile paths (default: chat,code,rag)")
    g.add_argument("--steps", default="",
                   help="concurrency steps, e.g. 1,2,4,8 (default: doubling from 1 to "
                        "--max-concurrency)")
    g.add_argument("--max-concurrency", type=int, default=0,
                   help="doubling steps 1, 2, 4 … up to this (default 8)")
    g.add_argument("--step-time", type=float, default=10.0,
                   help="measured seconds per look and arm (default 10)")
    g.add_argument("--max-step-time", type=float, default=None,
                   help="cap on the measured seconds per arm at a step: a step whose TPOT or "
                        "throughput verdict is not yet settled runs another look of "
                        "--step-time, up to this (default: 3 × --step-time; equal to "
                        "--step-time: one look). The intervals keep their 95 %% under this "
                        "stopping (repeated confidence intervals)")
    g.add_argument("--warmup", type=float, default=3.0,
                   help="warm-up seconds before each step's measurement, at the step's "
                        "concurrency (default 3; 0: none). The measured time is split into "
                        "windows of this length, whose spread estimates the noise")
    g.add_argument("--requests-per-step", type=int, default=0,
                   help="end a look once this many measured requests have finished "
                        "(--step-time is then the upper bound; 0: time only)")
    g.add_argument("--arms", default="spec,base",
                   help="arms to run: spec (speculation on), base (off) (default both)")
    g.add_argument("--seed", type=int, default=0, help="replay seed for the workload records")
    g.add_argument("--max-tokens", type=int, default=96,
                   help="cap on output tokens per request (default 96; 0: each record's own "
                        "length)")
    g.add_argument("--max-prompt-chars", type=int, default=None,
                   help="skip longer prompts (default: no limit; the embedded pair's 4096-"
                        "token context holds every bundled record)")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    g.add_argument("--processes", type=int, default=1,
                   help="load-generating Locust processes per step (> 1: Locust's master with "
                        "that many workers on this machine; each step's line warns when one "
                        "process was near saturation)")
    g.add_argument("--patience", type=int, default=2,
                   help="stop a series this many steps past its saturation knee (0: never)")
    g = p.add_argument_group("servers")
    g.add_argument("--host", default="",
                   help="candidate server (OpenAI API). Without --baseline-host both arms go "
                        "here, switched by the request's `speculative` field. Without --host "
                        "the bundled server is started (--embedded)")
    g.add_argument("--baseline-host", default="",
                   help="a second server with speculation off (vLLM/SGLang: the baseline)")
    g.add_argument("--advised-host", default="",
                   help="a third server, started with the advised speculation schedule (a "
                        "previous sweep's schedule.json): run at every step beside the two "
                        "and set against the better of them in the report's Verification")
    g.add_argument("--embedded", action="store_true",
                   help="start the bundled `spectest serve` for the sweep and stop it after")
    g.add_argument("--model", default="embedded",
                   help="--embedded: target (embedded, smollm2, a checkpoint)")
    g.add_argument("--draft", default="auto",
                   help="--embedded: draft checkpoint (auto: the target's companion draft)")
    g.add_argument("--drafter", default="draft-model", choices=DRAFTING,
                   help="--embedded: how the server drafts (eagle: the target's EAGLE head, "
                        "e.g. smollm2-eagle for --model smollm2)")
    g.add_argument("--k", type=int, default=None,
                   help="--embedded: draft length K (default: the measured best for the model "
                        "and drafter, engine.api.DEFAULT_K; else 4)")
    g.add_argument("--disaggregated", action="store_true",
                   help="--embedded: run the draft in its own `spectest serve-draft` process, "
                        "reached over loopback HTTP (`serve --draft-url`); the report then "
                        "shows the network term per round")
    g.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="--embedded: where the bundled server runs its engine (auto: a GPU "
                        "when torch sees one)")
    g.add_argument("--server-arg", action="append", default=[],
                   help="--embedded: one more `spectest serve` flag (repeatable), "
                        "e.g. --server-arg=--threads=2")
    g.add_argument("--advised-schedule", default="", metavar="SCHEDULE_JSON[:NAME]",
                   help="with --advised-host: the schedule.json its server was started from "
                        "(and which schedule in it: a workload or mix; default mix, else the "
                        "first), so the report knows the K it runs at each batch size")
    g.add_argument("--verify-advice", "--validate-k", dest="verify_advice",
                   choices=("auto", "on", "off"), default="auto",
                   help="--embedded: after the sweep, start a second bundled server with the "
                        "advised schedule (--k K --disable-above B) and run it at every step of "
                        "--verify-workloads beside fresh always-on and off arms (auto: with "
                        "--embedded; an advice that is always-on or off needs no run)")
    g.add_argument("--verify-workloads", default="",
                   help="workloads the advice is verified on (default: the first; with --mix "
                        "the mix's schedule is the one run)")
    g = p.add_argument_group("SLOs (p99, milliseconds; defaults only with --embedded)")
    g.add_argument("--slo-ttft-ms", type=float, default=None)
    g.add_argument("--slo-tpot-ms", type=float, default=None)
    g.add_argument("--slo-e2el-ms", type=float, default=None)
    g.add_argument("--slo-max-error-rate", type=float, default=0.01)
    g = p.add_argument_group("report: evidence, cost and capacity (spectest report can change "
                             "them later)")
    add_analysis_arguments(g, defaults=True)
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: spectest-sweep-<date-time>)")
    p.add_argument("--no-report", action="store_true", help="do not render the report at the end")


def parse_steps(text: str, max_concurrency: int) -> tuple[int, ...]:
    """``1,2,4,8`` → (1, 2, 4, 8); empty → doubling from 1 up to ``max_concurrency`` (8)."""
    if text.strip():
        if max_concurrency:
            raise ConfigError("use --steps or --max-concurrency, not both")
        try:
            steps = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
        except ValueError:
            raise ConfigError(f"--steps must be whole numbers like 1,2,4,8, "
                              f"got {text!r}") from None
        if not steps or min(steps) < 1:
            raise ConfigError(f"--steps must be positive, got {text!r}")
        if list(steps) != sorted(set(steps)):
            raise ConfigError(f"--steps must rise strictly, got {text!r}")
        return steps
    top = max_concurrency or DEFAULT_STEPS[-1]
    if top < 1:
        raise ConfigError("--max-concurrency must be at least 1")
    steps = [2 ** i for i in range(int(math.log2(top)) + 1)]
    return tuple(steps + ([top] if steps[-1] != top else []))


@dataclass(frozen=True)
class SweepConfig:
    out: Path
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    steps: tuple[int, ...] = DEFAULT_STEPS
    step_time_s: float = 10.0
    max_step_time_s: float | None = None  # None: 3 × step_time_s
    warmup_s: float = 3.0
    requests_per_step: int = 0
    arms: tuple[str, ...] = ("spec", "base")
    seed: int = 0
    max_tokens: int = 96
    max_prompt_chars: int = 0
    temperature: float = 0.0
    patience: int = 2
    processes: int = 1
    host: str = ""
    baseline_host: str = ""
    advised_host: str = ""
    advised_schedule: dict = field(default_factory=dict)  # the schedule it runs (to_json)
    embedded: bool = True
    model: str = "embedded"
    draft: str = "auto"
    drafter: str = "draft-model"
    k: int = 4
    disaggregated: bool = False
    device: str = "auto"  # serve --device
    server_args: tuple[str, ...] = field(default_factory=tuple)
    verify_advice: bool = True
    verify_workloads: tuple[str, ...] = ()
    objective: str = "both"
    mix: str = ""
    speculative_config: str = ""
    slo: SLO = field(default_factory=SLO)
    min_requests_per_step: int = MIN_REQUESTS_PER_STEP
    price_per_hour: float | None = None
    spec_price_per_hour: float | None = None
    target_rps: float | None = None
    target_output_tps: float | None = None

    @property
    def window_s(self) -> float:
        """Length of one measured window (and of the warm-up)."""
        if 0 < self.warmup_s < self.step_time_s:
            return self.step_time_s / max(1, round(self.step_time_s / self.warmup_s))
        return self.step_time_s

    @property
    def windows(self) -> int:
        return max(1, round(self.step_time_s / self.window_s))

    @property
    def looks(self) -> int:
        """How many looks a step may take (``report.sequential``)."""
        from spectest.report.sequential import looks_for
        cap = self.max_step_time_s if self.max_step_time_s is not None else 3 * self.step_time_s
        return looks_for(self.step_time_s, cap)

    @property
    def all_arms(self) -> tuple[str, ...]:
        return self.arms + (("spec-advised",) if self.advised_host else ())

    def estimated_s(self) -> float:
        """A rough total if every step settles at its first look: every arm and workload,
        plus ~5 s start/stop each."""
        per = (self.windows + (1 if self.warmup_s > 0 else 0)) * self.window_s + 5
        n = len(self.workloads) * len(self.steps) * len(self.all_arms)
        verified = max(1, len(self.verify_workloads))
        extra = verified * len(self.steps) * per if self.verify_advice else 0
        return n * per + extra

    def serve_args(self, draft_url: str = "") -> list[str]:
        """``spectest serve`` flags: one torch thread, so on a small machine the server keeps
        one core and the load generator the other (``--server-arg=--threads=N`` overrides);
        ``draft_url``: draft from that ``spectest serve-draft`` (``--disaggregated``)."""
        remote = ["--draft-url", draft_url] if draft_url else []
        return ["--model", self.model, "--drafter", self.drafter, "--draft", self.draft,
                "--k", str(self.k),
                "--max-num-seqs", str(max(self.steps)),
                "--threads", "1", *(["--device", self.device] if self.device != "auto" else []),
                *remote, *self.server_args]

    def draft_server_args(self) -> list[str]:
        """``spectest serve-draft`` flags for ``--disaggregated`` (one torch thread)."""
        draft = self.draft
        if draft == "auto":  # only here does the sweep need the engine's table (and torch)
            from spectest.engine.api import companion_draft
            draft = companion_draft(self.model)
        return ["--draft", draft, "--threads", "1"]

    def to_json(self) -> dict:
        return {"out": str(self.out), "workloads": list(self.workloads),
                "steps": list(self.steps), "step_time_s": self.step_time_s,
                "max_step_time_s": self.max_step_time_s, "looks": self.looks,
                "warmup_s": self.warmup_s, "window_s": self.window_s, "windows": self.windows,
                "requests_per_step": self.requests_per_step, "arms": list(self.arms),
                "seed": self.seed, "max_tokens": self.max_tokens,
                "max_prompt_chars": self.max_prompt_chars, "temperature": self.temperature,
                "patience": self.patience, "processes": self.processes, "host": self.host,
                "baseline_host": self.baseline_host, "advised_host": self.advised_host,
                "advised_schedule": self.advised_schedule or None,
                "embedded": self.embedded,
                "model": self.model, "draft": self.draft, "drafter": self.drafter, "k": self.k,
                "disaggregated": self.disaggregated, "device": self.device,
                "server_args": list(self.server_args),
                "verify_advice": self.verify_advice,
                "verify_workloads": list(self.verify_workloads),
                "objective": self.objective, "mix": self.mix,
                "speculative_config": self.speculative_config,
                "min_requests_per_step": self.min_requests_per_step,
                "price_per_hour": self.price_per_hour,
                "spec_price_per_hour": self.spec_price_per_hour,
                "target_rps": self.target_rps, "target_output_tps": self.target_output_tps}

    @classmethod
    def from_args(cls, a: argparse.Namespace, now: str) -> SweepConfig:
        workloads = tuple(w.strip() for w in a.workloads.split(",") if w.strip())
        if not workloads:
            raise ConfigError("--workloads is empty")
        for w in workloads:
            if w not in WORKLOADS and not Path(w).is_file():
                raise ConfigError(f"unknown workload {w!r}: use {', '.join(WORKLOADS)} "
                                  f"or a locustfile path")
        arms = tuple(x.strip() for x in a.arms.split(",") if x.strip())
        if not arms or any(x not in ("spec", "base") for x in arms):
            raise ConfigError(f"--arms must be spec, base or both, got {a.arms!r}")
        if a.embedded and a.host:
            raise ConfigError("--embedded starts its own server: drop --host")
        if a.baseline_host and not a.host:
            raise ConfigError("--baseline-host needs --host (the candidate)")
        embedded = a.embedded or not a.host
        if a.disaggregated and not embedded:
            raise ConfigError("--disaggregated starts the bundled server and its draft server: "
                              "drop --host")
        if a.step_time <= 0 or a.warmup < 0:
            raise ConfigError("--step-time must be positive and --warmup at least 0")
        if a.max_step_time is not None and a.max_step_time < a.step_time:
            raise ConfigError("--max-step-time must be at least --step-time (equal: one look "
                              "per step)")
        if a.advised_host and not a.baseline_host:
            raise ConfigError("--advised-host needs --host and --baseline-host (the two arms "
                              "it is set against)")
        if a.advised_schedule and not a.advised_host:
            raise ConfigError("--advised-schedule describes the --advised-host server: give "
                              "both")
        advised_schedule = read_advised_schedule(a.advised_schedule)
        if a.processes < 1:
            raise ConfigError("--processes must be at least 1")
        if min(a.requests_per_step, a.max_tokens, a.patience) < 0 or (a.k is not None
                                                                       and a.k < 1):
            raise ConfigError("--requests-per-step, --max-tokens and --patience must be >= 0, "
                              "--k >= 1")
        for flag in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms"):
            v = getattr(a, flag)
            if v is not None and v <= 0:
                raise ConfigError(f"--{flag.replace('_', '-')} must be positive")
        if not 0 <= a.slo_max_error_rate <= 1:
            raise ConfigError("--slo-max-error-rate must be between 0 and 1")
        if embedded and all(getattr(a, f) is None for f in ("slo_ttft_ms", "slo_tpot_ms",
                                                              "slo_e2el_ms")):
            slo = SLO(EMBEDDED_SLO.ttft_p99_ms, EMBEDDED_SLO.tpot_p99_ms,
                      EMBEDDED_SLO.e2el_p99_ms, a.slo_max_error_rate)
        else:
            slo = SLO(a.slo_ttft_ms, a.slo_tpot_ms, a.slo_e2el_ms, a.slo_max_error_rate)
        validate = {"on": True, "off": False}.get(a.verify_advice, embedded)
        if validate and not embedded:
            raise ConfigError("--verify-advice on needs --embedded (it restarts the bundled "
                              "server with the advice); for another server start one with "
                              "the advice and pass --advised-host")
        if set(arms) != {"spec", "base"}:
            validate = False  # the advice needs both arms
        names = [Path(w).stem if w.endswith(".py") else w for w in workloads]
        verify = tuple(w.strip() for w in a.verify_workloads.split(",") if w.strip())
        if any(w not in names for w in verify):
            raise ConfigError(f"--verify-workloads must name workloads of the sweep "
                              f"({', '.join(names)}), got {a.verify_workloads!r}")
        if a.max_prompt_chars is not None and a.max_prompt_chars < 0:
            raise ConfigError("--max-prompt-chars must be >= 0")
        max_prompt = a.max_prompt_chars or 0
        try:
            min_requests, cost = analysis_options(a)
        except SweepError as e:
            raise ConfigError(str(e)) from None
        try:
            advice = advice_options(a, names)
        except SweepError as e:
            raise ConfigError(str(e)) from None
        report = {"min_requests_per_step": min_requests or MIN_REQUESTS_PER_STEP,
                  **(cost.to_json() if cost else {}), **advice}
        return cls(out=a.out or Path(f"spectest-sweep-{now}"), workloads=workloads,
                   steps=parse_steps(a.steps, a.max_concurrency), step_time_s=a.step_time,
                   max_step_time_s=a.max_step_time,
                   warmup_s=a.warmup, requests_per_step=a.requests_per_step, arms=arms,
                   seed=a.seed, max_tokens=a.max_tokens, max_prompt_chars=max_prompt,
                   temperature=a.temperature, patience=a.patience, processes=a.processes,
                   host=a.host.rstrip("/"), baseline_host=a.baseline_host.rstrip("/"),
                   advised_host=a.advised_host.rstrip("/"), advised_schedule=advised_schedule,
                   embedded=embedded, model=a.model, draft=a.draft, drafter=a.drafter,
                   k=_default_k(a.model, a.drafter) if a.k is None else a.k,
                   disaggregated=a.disaggregated, device=a.device,
                   server_args=tuple(a.server_arg),
                   verify_advice=validate, verify_workloads=verify, slo=slo, **report)


def read_advised_schedule(spec: str) -> dict:
    """``schedule.json[:name]`` → that schedule (a dict as ``Schedule.to_json`` writes it)."""
    if not spec:
        return {}
    path, _, name = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    try:
        schedules = json.loads(Path(path).read_text(encoding="utf-8"))["schedules"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--advised-schedule: cannot read a schedule.json from {path} "
                          f"({type(e).__name__})") from None
    names = [s.get("name") for s in schedules]
    pick = name or ("mix" if "mix" in names else names[0] if names else "")
    chosen = next((s for s in schedules if s.get("name") == pick), None)
    if chosen is None:
        raise ConfigError(f"--advised-schedule: {path} has no schedule named {pick!r} (it has "
                          f"{', '.join(map(str, names)) or 'none'})")
    return chosen


def _default_k(model: str, drafter: str) -> int:
    """The engine's measured default K for a short-named model and drafter (the table lives
    beside the model names in ``engine.api``; imported here only, as torch comes with it)."""
    from spectest.engine.api import default_k
    return default_k(model, drafter)
