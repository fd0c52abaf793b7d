"""The spectest command-line flags of a locustfile, and their validated, frozen form.

``add_arguments`` is the ``init_command_line_parser`` listener: it adds kebab-case flags to
Locust's own parser, so they work on the command line, in a ``locust.conf``, as
``LOCUST_*``-style env vars and in the web UI's custom-parameters panel, and Locust forwards
them from master to workers. ``SpecOptions.from_parsed`` turns Locust's namespace into a frozen
dataclass, raising ``OptionsError`` with one readable line on bad input.

It knows nothing about the server, the dataset contents or the results files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from spectest import smoke

SPECULATIVE = ("default", "on", "off", "ab")
ENDPOINTS = ("auto", "chat", "completions")


class OptionsError(ValueError):
    pass


def add_arguments(parser) -> None:
    class _WithEnv:  # every flag also reads LOCUST_<FLAG> (e.g. LOCUST_STEPS), like Locust's
        def add_argument(self, flag: str, **kw):
            env = "LOCUST_" + flag.lstrip("-").upper().replace("-", "_")
            return parser.add_argument(flag, env_var=env, **kw)

    g = _WithEnv()  # not an argument group: only the parser's own add_argument knows the web UI
    g.add_argument("--spectest-model", default="",
                   help="Model name to request (default: the first id of GET /v1/models)")
    g.add_argument("--max-tokens", type=int, default=0,
                   help="max_tokens per request (0: each record's expected_output_tokens)")
    g.add_argument("--temperature", type=float, default=0.0, help="Sampling temperature")
    g.add_argument("--speculative", choices=SPECULATIVE, default="default",
                   help="Send speculative=true/false per request (default: send nothing; ab: "
                        "alternate true and false, request by request, for the live "
                        "speculation-on/off comparison in the web UI)")
    g.add_argument("--dataset", default="",
                   help="Bundled name (chat, code, rag, mixed) or a JSONL/ShareGPT/Spec-Bench "
                        "file (default: the locustfile's workload)")
    g.add_argument("--seed", type=int, default=0, help="Replay seed for records and arrivals")
    g.add_argument("--max-prompt-chars", type=int, default=0,
                   help="Skip records whose prompt is longer (fit a small context; 0: keep all)")
    g.add_argument("--system-prompt", default="",
                   help="Shared system prompt prepended to every chat record")
    g.add_argument("--endpoint", choices=ENDPOINTS, default="auto",
                   help="auto: chat for records with messages, completions for prompts")
    g.add_argument("--extra-body", default="",
                   help="JSON object merged into every request body (server-specific fields)")
    g.add_argument("--api-key", default="", help="Bearer token (default: $OPENAI_API_KEY)",
                   is_secret=True)
    g.add_argument("--slo-ttft-ms", type=float, default=0.0, help="TTFT SLO for goodput (0: none)")
    g.add_argument("--slo-tpot-ms", type=float, default=0.0, help="TPOT SLO for goodput (0: none)")
    g.add_argument("--slo-e2el-ms", type=float, default=0.0, help="E2EL SLO for goodput (0: none)")
    g.add_argument("--results-dir", default="spectest-results",
                   help="Folder for requests.jsonl, steps.csv, scrapes.jsonl and run.json")
    g.add_argument("--steps", default="",
                   help="Stepped concurrency, e.g. 1,2,4,8,16,32 (users per step)")
    g.add_argument("--request-rates", default="",
                   help="Open-loop Poisson arrival rates per step, e.g. 2,4,8 (requests/s)")
    g.add_argument("--step-time", type=float, default=30.0, help="Seconds each step is held")
    g.add_argument("--max-users", type=int, default=64,
                   help="User pool that serves --request-rates arrivals")
    g.add_argument("--metrics-url", default="",
                   help="Server /metrics to scrape (default: HOST/metrics; 'off' disables)")
    g.add_argument("--scrape-interval", type=float, default=5.0,
                   help="Seconds between live /metrics scrapes (boundaries are always scraped)")
    g.add_argument("--server-down-grace", type=float, default=10.0,
                   help="Stop the run when no request has succeeded for this many seconds "
                        "while requests fail (0: never)")


def _floats(text: str, flag: str) -> tuple[float, ...]:
    if not text.strip():
        return ()
    try:
        values = tuple(float(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise OptionsError(f"{flag} must be a comma-separated list of numbers, "
                           f"got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise OptionsError(f"{flag} values must be positive, got {text!r}")
    return values


@dataclass(frozen=True)
class SpecOptions:
    model: str = ""
    max_tokens: int = 0
    temperature: float = 0.0
    speculative: bool | None = None
    alternate: bool = False  # --speculative ab: each user alternates on and off
    dataset: str = ""
    seed: int = 0
    system_prompt: str = ""
    max_prompt_chars: int = 0
    endpoint: str = "auto"
    extra_body: tuple[tuple[str, object], ...] = ()
    api_key: str = ""
    slo_ttft_ms: float = 0.0
    slo_tpot_ms: float = 0.0
    slo_e2el_ms: float = 0.0
    results_dir: str = "spectest-results"
    steps: tuple[int, ...] = ()
    request_rates: tuple[float, ...] = ()
    step_time: float = 30.0
    max_users: int = 64
    metrics_url: str = ""
    scrape_interval: float = 5.0
    server_down_grace: float = 10.0

    @classmethod
    def from_parsed(cls, ns) -> SpecOptions:
        """Locust's parsed options → SpecOptions (missing flags take their defaults)."""
        get = lambda name, default: getattr(ns, name, default)  # noqa: E731
        steps = _floats(str(get("steps", "") or ""), "--steps")
        if any(s != int(s) for s in steps):
            raise OptionsError("--steps must be whole numbers of users")
        rates = _floats(str(get("request_rates", "") or ""), "--request-rates")
        if steps and rates:
            raise OptionsError("use --steps (closed loop) or --request-rates (open loop), not both")
        extra = str(get("extra_body", "") or "")
        try:
            extra_obj = json.loads(extra) if extra else {}
        except json.JSONDecodeError as e:
            raise OptionsError(f"--extra-body is not valid JSON: {e.msg}") from None
        if not isinstance(extra_obj, dict):
            raise OptionsError("--extra-body must be a JSON object")
        spec = str(get("speculative", "default"))
        if spec not in SPECULATIVE:
            raise OptionsError(f"--speculative must be one of {', '.join(SPECULATIVE)}")
        opts = cls(
            model=str(get("spectest_model", "") or ""),
            max_tokens=int(get("max_tokens", 0) or 0),
            temperature=float(get("temperature", 0.0) or 0.0),
            speculative={"on": True, "off": False}.get(spec), alternate=spec == "ab",
            dataset=str(get("dataset", "") or ""),
            seed=int(get("seed", 0) or 0),
            system_prompt=str(get("system_prompt", "") or ""),
            max_prompt_chars=int(get("max_prompt_chars", 0) or 0),
            endpoint=str(get("endpoint", "auto") or "auto"),
            extra_body=tuple(sorted(extra_obj.items())),
            api_key=str(get("api_key", "") or os.environ.get("OPENAI_API_KEY", "")),
            slo_ttft_ms=float(get("slo_ttft_ms", 0) or 0),
            slo_tpot_ms=float(get("slo_tpot_ms", 0) or 0),
            slo_e2el_ms=float(get("slo_e2el_ms", 0) or 0),
            results_dir=str(get("results_dir", "spectest-results") or "spectest-results"),
            steps=tuple(int(s) for s in steps),
            request_rates=rates,
            step_time=smoke.locust_step_time(float(get("step_time", 30.0) or 30.0)),
            max_users=int(get("max_users", 64) or 64),
            metrics_url=str(get("metrics_url", "") or ""),
            scrape_interval=float(get("scrape_interval", 5.0) or 5.0),
            server_down_grace=float(get("server_down_grace", 10.0) or 0.0),
        )
        if opts.max_tokens < 0 or opts.max_prompt_chars < 0:
            raise OptionsError("--max-tokens and --max-prompt-chars must be >= 0")
        if opts.temperature < 0:
            raise OptionsError("--temperature must be >= 0")
        if opts.step_time <= 0 or opts.max_users < 1 or opts.scrape_interval <= 0:
            raise OptionsError("--step-time, --max-users and --scrape-interval must be positive")
        if min(opts.slo_ttft_ms, opts.slo_tpot_ms, opts.slo_e2el_ms) < 0:
            raise OptionsError("SLOs must be >= 0 ms")
        if opts.endpoint not in ENDPOINTS:
            raise OptionsError(f"--endpoint must be one of {', '.join(ENDPOINTS)}")
        return opts

    @property
    def speculative_label(self) -> str:
        if self.alternate:
            return "ab"
        return {True: "on", False: "off", None: "default"}[self.speculative]

    def slo_ok(self, ttft_s: float | None, tpot_s: float | None, e2el_s: float | None) -> bool:
        """DistServe goodput: a request counts when it meets every SLO that is set.

        A one-token answer has no TPOT, so it cannot miss a TPOT SLO.
        """
        if self.slo_ttft_ms and (ttft_s is None or ttft_s * 1e3 > self.slo_ttft_ms):
            return False
        if self.slo_tpot_ms and tpot_s is not None and tpot_s * 1e3 > self.slo_tpot_ms:
            return False
        if self.slo_e2el_ms and (e2el_s is None or e2el_s * 1e3 > self.slo_e2el_ms):
            return False
        return True
