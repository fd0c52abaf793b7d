"""The ``spectest`` command line: one sub-command per job, each implemented in its package.

Owns: argument parsing and the error contract — a known failure prints one readable line to
stderr and exits non-zero, never a traceback (set SPECTEST_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from spectest import smoke
from spectest.engine.device import DEVICE_CHOICES, DTYPE_CHOICES
from spectest.engine.drafter_names import DRAFTERS
from spectest.engine.int8 import QUANTIZE_CHOICES


def _train(args) -> int:
    from spectest.training.onpolicy import OnPolicyConfig, onpolicy_stage
    from spectest.training.train import TrainConfig, train_pair
    cfg = TrainConfig.quick(args.seed) if args.quick else TrainConfig(seed=args.seed)
    if not args.onpolicy_only:
        train_pair(args.out, cfg, threads=args.threads)
    elif args.threads:
        import torch
        torch.set_num_threads(args.threads)
    onpolicy_stage(args.out, cfg, OnPolicyConfig.quick() if args.quick else OnPolicyConfig())
    return 0


def _train_draft(args) -> int:
    from spectest.training.distill import DraftRecipe, train_smollm2_draft
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = DraftRecipe.quick(args.seed) if args.quick else DraftRecipe(seed=args.seed)
    train_smollm2_draft(args.out, recipe, args.teacher_cache)
    return 0


def _train_eagle(args) -> int:
    from spectest.training.eagle import EagleRecipe, train_smollm2_eagle
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = EagleRecipe.quick(args.seed) if args.quick else EagleRecipe(seed=args.seed)
    train_smollm2_eagle(args.out, recipe, args.teacher_cache, args.feature_cache)
    return 0


def _generate(args) -> int:
    from spectest.engine.api import Engine, default_k
    k = default_k(args.model, args.drafter) if args.k is None else args.k
    engine = Engine.from_pretrained(args.model, args.draft, drafter=args.drafter, k=k,
                                    quantize=args.quantize, device=args.device,
                                    dtype=args.dtype)
    for prompt in args.prompt or ["def fibonacci(n):"]:
        g = engine.generate(prompt, chat=args.chat,
                            max_tokens=smoke.generate_tokens(args.max_tokens),
                            temperature=args.temperature, seed=args.seed,
                            speculative=args.drafter != "none")
        s = g.stats
        print(f"--- prompt: {prompt!r}\n{g.text}\n--- {s.completion_tokens} tokens, "
              f"{s.drafts} drafts, {s.accepted_tokens}/{s.draft_tokens} drafts accepted, "
              f"mean accepted length {s.mean_accepted_length or 1:.2f}, "
              f"{s.completion_tokens / max(s.e2e, 1e-9):.1f} tokens/s")
    return 0


def _generated_argv(args) -> list[str]:
    """``--out-dir``/``--check`` for a generator (dashboards, alerts). Without ``--out-dir`` it
    writes the checkout's committed files; an installed copy is only checked, never written."""
    from spectest import files
    if args.out_dir is None:
        if files.checkout_root() is None and not args.check:
            raise ValueError(f"pass --out-dir DIR: spectest is installed, and its own copy "
                             f"(under {files.ROOT}) is not written to")
        return ["--check"] if args.check else []
    if not args.check:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    return ["--out-dir", str(args.out_dir)] + (["--check"] if args.check else [])


def _dashboards(args) -> int:
    from dashboards import build
    return build.main(_generated_argv(args))


def _alerts(args) -> int:
    from alerts import build
    return build.main(_generated_argv(args) + ["--with-tests"])


def _locustfile(args) -> int:
    from spectest import files
    print(files.locustfile(args.name))
    return 0


def _export_hf(args) -> int:
    from spectest.engine.hf_export import export_hf
    out = export_hf(args.model, args.out, args.dtype)
    print(f"wrote {args.model} as a Hugging Face checkpoint to {out} "
          f"(serve it with vLLM: --model {out})")
    return 0


def _profile(args) -> int:
    from spectest.engine.profiling import run_profile
    smoke.profile_args(args)
    run_profile(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectest", description="Measure, load-test and audit speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)

    from spectest.server import serve
    p = sub.add_parser("serve", help="OpenAI-compatible server on the bundled engine")
    serve.add_arguments(p)
    p.set_defaults(func=serve.main)

    from spectest.remote import service as draft_service
    p = sub.add_parser("serve-draft", help="serve a draft model to `spectest serve --draft-url` "
                                           "(disaggregated drafting)")
    draft_service.add_arguments(p)
    p.set_defaults(func=draft_service.main)

    p = sub.add_parser("train-demo-models", help="train the embedded target/draft pair")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="a tiny recipe (tests)")
    p.add_argument("--onpolicy-only", action="store_true",
                   help="only the last stage, on the pair already in --out: distil the draft "
                        "on the target's own continuations")
    p.set_defaults(func=_train)

    p = sub.add_parser("train-draft", help="train smollm2-draft, a draft for SmolLM2-135M "
                                           "distilled from its own answers (~1 h on 2 cores)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "models" / "smollm2-draft")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--teacher-cache", type=Path, default=None,
                   help="keep SmolLM2's answers in this file and reuse them if it exists")
    p.add_argument("--quick", action="store_true", help="a tiny recipe (tests)")
    p.set_defaults(func=_train_draft)

    p = sub.add_parser("train-eagle", help="train smollm2-eagle, an EAGLE head that drafts for "
                                           "SmolLM2-135M from its hidden states (~1 h)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "models" / "smollm2-eagle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--teacher-cache", type=Path, default=None,
                   help="SmolLM2's answers: reuse this file (train-draft's) or write it")
    p.add_argument("--feature-cache", type=Path, default=None,
                   help="SmolLM2's hidden states over them: reuse this file or write it")
    p.add_argument("--quick", action="store_true", help="a tiny recipe (tests)")
    p.set_defaults(func=_train_eagle)

    p = sub.add_parser("generate", help="generate with the bundled engine (a demo)")
    p.add_argument("prompt", nargs="*")
    p.add_argument("--model", default="embedded", help="embedded, smollm2, a HF directory or "
                                                       "a .gguf file")
    p.add_argument("--draft", default="auto", help="draft checkpoint (auto: the target's "
                                                   "companion draft)")
    p.add_argument("--drafter", default="draft-model", choices=DRAFTERS)
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default="auto")
    p.add_argument("--k", type=int, default=None,
                   help="draft length (default: the measured best for the model and drafter, "
                        "engine.api.DEFAULT_K; else 4)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                   help="cuda, cpu, or auto = a GPU when torch sees one")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="the weights' dtype on the device (auto: see spectest serve --help)")
    p.add_argument("--chat", action="store_true")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=_generate)

    from spectest.sweep import cli as sweep_cli
    p = sub.add_parser("sweep", help="rising-concurrency load sweep, speculation on vs off")
    sweep_cli.add_arguments(p)
    p.set_defaults(func=sweep_cli.main)

    from spectest.report import cli as report_cli
    p = sub.add_parser("report", help="render a sweep folder as HTML + Markdown + PNGs")
    report_cli.add_report_arguments(p)
    p.set_defaults(func=report_cli.report_main)
    p = sub.add_parser("compare", help="what changed between two sweeps")
    report_cli.add_compare_arguments(p)
    p.set_defaults(func=report_cli.compare_main)

    from spectest.audit import cli as audit_cli
    p = sub.add_parser("audit", help="prove speculative output matches the target-only baseline")
    audit_cli.add_arguments(p)
    p.set_defaults(func=audit_cli.main)

    from spectest.audit import replay
    p = sub.add_parser("replay", help="replay an audit's saved findings against both servers")
    replay.add_arguments(p)
    p.set_defaults(func=replay.main)

    p = sub.add_parser("dashboards", help="write (or --check) the Grafana dashboards JSON")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where to write them (created if missing; default, in a checkout: "
                        "dashboards/)")
    p.add_argument("--check", action="store_true", help="exit 1 if committed JSON is stale")
    p.set_defaults(func=_dashboards)

    p = sub.add_parser("alerts", help="write (or --check) the Prometheus alert rules and their "
                                      "promtool tests (tests/*.test.yml)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where to write them (created if missing; default, in a checkout: "
                        "alerts/)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the files there are stale")
    p.set_defaults(func=_alerts)

    p = sub.add_parser("locustfile", help="print the path of a bundled workload's locustfile: "
                                          "locust -f \"$(spectest locustfile chat)\" ...")
    p.add_argument("name", help="chat, code, rag or mixed")
    p.set_defaults(func=_locustfile)

    p = sub.add_parser("export-hf", help="write a model (smollm2, a .gguf, a short name) as a "
                                         "Hugging Face checkpoint, for servers such as vLLM "
                                         "that load no GGUF")
    p.add_argument("model", help="smollm2, smollm2-draft, embedded, embedded-draft, a .gguf "
                                 "file or an HF directory")
    p.add_argument("out", type=Path, help="the directory to write (must not exist, or be empty)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.set_defaults(func=_export_hf)

    p = sub.add_parser("profile", help="measure round latency by (batch, K) and acceptance")
    from spectest.engine import profiling
    profiling.add_arguments(p)
    p.set_defaults(func=_profile)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("spectest: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the one-line contract for known and unknown failures alike
        if os.environ.get("SPECTEST_DEBUG"):
            raise
        name = type(exc).__name__
        print(f"spectest {args.command}: {exc}" if name in _PLAIN else
              f"spectest {args.command}: {name}: {exc}", file=sys.stderr)
        return 2


_PLAIN = {"CheckpointError", "ValueError", "RemoteDraftError", "FileNotFoundError",
          "CorpusError", "ChatTemplateError", "CapacityError"}

if __name__ == "__main__":
    sys.exit(main())
