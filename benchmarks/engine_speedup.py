"""Benchmark: does speculation pay on this CPU, and does it match the formula?

On the embedded pair, for chat-, code- and RAG-shaped prompts (the workload datasets) and for
``pysrc`` — 600-character windows of aiohttp's Python source, code it never trained on — greedy
and temperature 0.7, at batch 1: tokens/s for target-only, draft-model and n-gram drafting
(decode — first token to last, what speculation speeds up — and wall clock with prefill);
acceptance rate, mean accepted length, measured decode speedup, and the speedup predicted from
the measured acceptance and step times:

    E[tokens/round] = (1 − α^(K+1)) / (1 − α)
    predicted       = E × T_target_step / (K·T_draft_step + T_verify(K+1))

Then throughput at batch 1, 4, 16, 32 with and without speculation (where does it stop
paying?), and Hugging Face ``transformers`` assisted generation on the same pair and prompts
(``assistant_model=`` and ``prompt_lookup_num_tokens=``), greedy, batch 1, as a peer measured
in the same run. Every ratio compares figures measured in this run.

``--pair smollm2``: SmolLM2-135M-Instruct (int8, ``--quantize auto``) with its in-repo draft
``smollm2-draft`` and its EAGLE head ``smollm2-eagle`` (an ``eagle`` arm), on workload records
that ``spectest train-draft`` held out (never trained on); no transformers peer (it would run
SmolLM2 in fp32). Both pairs also run prompt lookup in front of each model drafter
(``ngram+draft-model``, ``ngram+eagle``).

Each speedup comes with a 95 % bootstrap interval over paired requests (the same prompt through
an arm and through target-only); ``--repeats R`` runs every arm R times over the prompts,
interleaved with the order rotated, so slow drift of this VM lands on every arm alike.

``--confidence T[,T…]`` adds, for every arm that drafts with a model, a twin gated by the
draft's confidence (``ConfidenceK``: a round's drafting stops where the draft's top probability
falls below T, so a round whose first draft is unsure is a plain step), to measure whether
skipping unsure drafts pays.

``--device cuda`` runs the engine (and the transformers peer) on a GPU; ``--device auto`` picks
one when torch sees it.

    python benchmarks/engine_speedup.py [--pair embedded|smollm2] [--prompts 6] [--repeats 1]
                                        [--max-tokens 128] [--k K] [--workloads chat,code]
                                        [--confidence 0.3] [--device cpu|cuda|auto]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path[:0] = [str(REPO), str(BENCH)]

from spectest.engine.api import MODELS_DIR, build_engine, default_k  # noqa: E402
from spectest.engine.drafter_names import needs_checkpoint  # noqa: E402
from spectest.engine.policies import ConfidenceK, FixedK  # noqa: E402
from spectest.engine.requests import GenerationRequest  # noqa: E402
from spectest.engine.sampling import SamplingParams  # noqa: E402
from spectest.loadgen.datasets import load_dataset  # noqa: E402
from spectest.training import teacher  # noqa: E402
from speedup_figures import (  # noqa: E402
    acceptance_interval, copied_share, paired_interval, predicted_speedup, summarize)


def prompts_for(tokenizer, category: str, n: int, max_prompt: int) -> list[list[int]]:
    out = []
    for rec in load_dataset(category, seed=0).records:
        if rec.messages is not None:
            text = tokenizer.apply_chat_template(list(rec.messages), add_generation_prompt=True)
        else:
            text = rec.prompt
        ids = tokenizer.encode(text)
        if len(ids) <= max_prompt:
            out.append(ids)
        if len(out) == n:
            break
    return out


def third_party_code(tokenizer, n: int) -> list[list[int]]:
    """The held-out code prompts of ``benchmarks/default_config.py`` (600-character windows of
    aiohttp's Python source, a dependency: code the embedded pair never trained on, its corpus
    being the standard library), as token ids."""
    from default_config import held_out_code  # this folder's script, on sys.path when run
    return [tokenizer.encode(text) for text in held_out_code(n)]


def held_out_prompts(tokenizer, category: str, n: int, max_prompt: int) -> list[list[int]]:
    """Workload records the SmolLM2 draft never trained on (``training.teacher`` split)."""
    return [list(p.ids) for p in teacher.workload_prompts(tokenizer, category, held=True)
            if len(p.ids) <= max_prompt][:n]


def run(engine, prompts, max_tokens, temperature, speculative=True, batch=1, answers=None):
    """Generate every prompt (``batch`` at a time); return tokens, seconds and round records.
    ``answers``: a list to append each (prompt ids, generated ids) to."""
    records = []
    engine.observers.append(records.append)
    tokens = 0
    stats = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        outs = {}
        asked = {}
        for j, ids in enumerate(prompts[i:i + batch]):
            rid = uuid.uuid4().hex
            asked[rid] = list(ids)
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                    seed=1000 + i + j)
            engine.submit(GenerationRequest(rid, tuple(ids), params, speculative=speculative),
                          lambda o: outs.setdefault(o.request_id, []).append(o))
        engine.run_until_idle()
        for rid, outputs in outs.items():
            tokens += sum(len(o.token_ids) for o in outputs)
            stats.append(outputs[-1].stats)
            if answers is not None:
                answers.append((asked[rid], [t for o in outputs for t in o.token_ids]))
    seconds = time.perf_counter() - t0
    engine.observers.remove(records.append)
    return tokens, seconds, records, stats


def hf_peer(prompts, max_tokens, k, device: torch.device = torch.device("cpu"),
            dtype: torch.dtype = torch.float32):
    """transformers greedy, assisted (draft model) and prompt-lookup generation, batch 1, on
    the engine's device and dtype."""
    from transformers import AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained(MODELS_DIR / "target",
                                                  dtype=dtype).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(MODELS_DIR / "draft",
                                                 dtype=dtype).to(device).eval()
    eos = target.generation_config.eos_token_id
    out = {}
    for name, extra in (("hf-greedy", {}), ("hf-assisted", {"assistant_model": draft}),
                        ("hf-prompt-lookup", {"prompt_lookup_num_tokens": k})):
        if name == "hf-assisted":
            draft.generation_config.num_assistant_tokens = k
            draft.generation_config.num_assistant_tokens_schedule = "constant"
        tokens, t0 = 0, time.perf_counter()
        with torch.inference_mode():
            for ids in prompts:
                x = torch.tensor([ids], device=device)
                y = target.generate(x, max_new_tokens=max_tokens, do_sample=False,
                                    eos_token_id=eos, pad_token_id=eos[-1], **extra)
                tokens += y.shape[1] - x.shape[1]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        out[name] = tokens / (time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("embedded", "smollm2"), default="embedded")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per workload")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=None,
                    help="draft length (default: each drafter's for the pair, "
                         "engine.api.default_k)")
    ap.add_argument("--max-prompt", type=int, default=None,
                    help="longest prompt in tokens (default: all that fit the model's context "
                         "with the output, e.g. every bundled RAG record on the embedded pair)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of every arm over the prompts, interleaved (the speedup's "
                         "interval resamples prompt × repeat pairs)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"),
                    help="where the engine and the transformers peer run (default cpu)")
    ap.add_argument("--batches", default=None, help="default 1,4,16,32 (smollm2: 1,4,8)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--workloads", default=None,
                    help="comma-separated subset of chat,code,rag (and pysrc on the embedded "
                         "pair); default all")
    ap.add_argument("--arms", default=None,
                    help="comma-separated subset of the drafting arms (target-only always "
                         "runs), e.g. ngram; default all")
    ap.add_argument("--confidence", default=None,
                    help="comma-separated thresholds: add a confidence-gated twin of every "
                         "arm that drafts with a model, one per threshold")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    def k_for(drafter: str) -> int:
        return default_k(args.pair, drafter) if args.k is None else args.k
    k = k_for("draft-model")
    smollm2 = args.pair == "smollm2"
    known = ("chat", "code", "rag") + (() if smollm2 else ("pysrc",))
    unknown = sorted(set((args.workloads or "").split(",")) - set(known) - {""})
    if unknown:
        raise SystemExit(f"engine_speedup: unknown workload(s) {', '.join(unknown)} "
                         f"(choose from {', '.join(known)})")
    batches = args.batches or ("1,4,8" if smollm2 else "1,4,16,32")
    slots = max(int(b) for b in batches.split(","))
    arms = [("target-only", "none", 0), ("draft-model", "draft-model", k),
            ("ngram", "ngram", k_for("ngram")),
            ("ngram+draft-model", "ngram+draft-model", k_for("ngram+draft-model"))]
    if smollm2 and (MODELS_DIR / "smollm2-eagle").is_dir():
        arms += [("eagle", "eagle", k_for("eagle")),
                 ("ngram+eagle", "ngram+eagle", k_for("ngram+eagle"))]
    if args.arms:
        wanted = set(args.arms.split(","))
        unknown = sorted(wanted - {name for name, _, _ in arms})
        if unknown:
            raise SystemExit(f"engine_speedup: unknown arm(s) {', '.join(unknown)} (choose "
                             f"from {', '.join(name for name, _, _ in arms[1:])})")
        arms = [arm for arm in arms if arm[0] in wanted or arm[0] == "target-only"]
    policies = {name: FixedK(kk) for name, _, kk in arms}
    model_arms = [arm for arm in arms if needs_checkpoint(arm[1])]
    for threshold in (float(t) for t in (args.confidence or "").split(",") if t):
        for name, drafter, kk in model_arms:
            gated = f"{name} conf={threshold:g}"
            arms.append((gated, drafter, kk))
            policies[gated] = ConfidenceK(k_max=kk, threshold=threshold)
    engines = {name: build_engine(args.pair, drafter=drafter, policy=policies[name],
                                  max_num_seqs=slots, device=args.device)
               for name, drafter, _ in arms}
    drafting = [name for name in engines if name != "target-only"]
    tok = engines["target-only"].tokenizer
    place = engines["target-only"].place
    print(f"pair {args.pair}: {engines['target-only'].target.quantization} weights, "
          f"{torch.get_num_threads()} thread(s), on {place.describe()} "
          f"({str(place.dtype).removeprefix('torch.')})", flush=True)
    rows = []
    pick = held_out_prompts if smollm2 else prompts_for
    context = engines["target-only"].config.scheduler.max_model_len
    arm_k = {name: kk for name, _, kk in arms}
    max_prompt = args.max_prompt or context - args.max_tokens - max(arm_k.values()) - 1
    prompt_sets = {c: pick(tok, c, args.prompts, max_prompt)
                   for c in ("chat", "code", "rag")}
    if not smollm2:
        prompt_sets["pysrc"] = third_party_code(tok, args.prompts)
    if args.workloads:
        prompt_sets = {w: prompt_sets[w] for w in args.workloads.split(",")}
    names = list(engines)
    copied = {}  # workload → (share of target-only greedy answer tokens in a repeated 4-gram, n)
    for category, prompts in prompt_sets.items():
        for temperature in (0.0, 0.7):
            got = {name: [0, 0.0, [], []] for name in names}  # tokens, seconds, records, stats
            for rep in range(args.repeats):  # arms interleaved, the order rotated each repeat
                for name in names[rep % len(names):] + names[:rep % len(names)]:
                    if rep == 0:
                        run(engines[name], prompts[:1], 8, temperature)  # warm-up
                    answers = [] if (name, temperature, rep) == ("target-only", 0.0, 0) else None
                    tokens, seconds, records, stats = run(engines[name], prompts,
                                                          args.max_tokens, temperature,
                                                          answers=answers)
                    if answers is not None:
                        copied[category] = copied_share(answers)
                    acc = got[name]
                    acc[0] += tokens
                    acc[1] += seconds
                    acc[2] += records
                    acc[3] += stats
            base = summarize("target-only", category, temperature, *got["target-only"][:3],
                             0, got["target-only"][3])
            for name in names:
                tokens, seconds, records, stats = got[name]
                row = summarize(name, category, temperature, tokens, seconds, records,
                                arm_k[name], stats)
                row["speedup"] = round(row["decode_tok_s"] / base["decode_tok_s"], 3)
                row["speedup_lo"], row["speedup_hi"] = paired_interval(
                    stats, got["target-only"][3])
                row["requests"] = len(stats)
                row["acceptance_lo"], row["acceptance_hi"] = acceptance_interval(stats)
                row["draft_tokens"] = sum(st.draft_tokens for st in stats)
                row["wall_speedup"] = round(row["tok_s"] / base["tok_s"], 3)
                row["predicted"] = (predicted_speedup(row, base, arm_k[name])
                                    if name != "target-only" else 1.0)
                rows.append(row)
                print(f"{category:5s} T={temperature} {name:17s} decode "
                      f"{row['decode_tok_s']:7.1f} tok/s, speedup {row['speedup']:.2f} "
                      f"[{row['speedup_lo']:.2f}, {row['speedup_hi']:.2f}] "
                      f"(predicted {row['predicted']}); wall clock with prefill "
                      f"{row['tok_s']:7.1f} tok/s, {row['wall_speedup']:.2f}× "
                      f"α={row['acceptance_rate']} L={row['mean_accepted_length']}", flush=True)
    table = pd.DataFrame(rows)
    print("\n== batch 1, per workload ==")
    print(table.to_string(index=False))

    print("\n== throughput vs batch size (mixed prompts, greedy) ==")
    mixed = [p for ps in prompt_sets.values() for p in ps]
    thr = []
    for b in [int(x) for x in batches.split(",")]:
        reqs = (mixed * ((2 * b) // len(mixed) + 1))[:max(2 * b, len(mixed))]
        line = {"batch": b}
        for name in engines:
            tokens, seconds, _, _ = run(engines[name], reqs, args.max_tokens // 2, 0.0, batch=b)
            line[name] = round(tokens / seconds, 1)
        for name in drafting:
            line[f"{name}/target"] = round(line[name] / line["target-only"], 3)
        thr.append(line)
        print(line, flush=True)
    thr_table = pd.DataFrame(thr)
    print(thr_table.to_string(index=False))
    for name in drafting:
        losing = thr_table[thr_table[f"{name}/target"] < 1.0]["batch"].tolist()
        print(f"{name} speculation stops paying at batch: "
              f"{losing[0] if losing else 'not reached (pays at every measured batch)'}")

    peer = {}
    if not args.skip_hf and not smollm2 and {"draft-model", "ngram"} <= set(engines):
        print("\n== Hugging Face transformers on the same pair and prompts (greedy, batch 1) ==")
        code = [p for w in ("code", "chat", "rag") if w in prompt_sets for p in prompt_sets[w]]
        peer = hf_peer(code, args.max_tokens, k, place.device, place.dtype)
        ours = {}
        for name in ("target-only", "draft-model", "ngram"):
            tokens, seconds, _, _ = run(engines[name], code, args.max_tokens, 0.0)
            ours[name] = tokens / seconds
        for (mine, theirs) in (("target-only", "hf-greedy"), ("draft-model", "hf-assisted"),
                               ("ngram", "hf-prompt-lookup")):
            print(f"{mine:12s} {ours[mine]:7.1f} tok/s vs {theirs:17s} {peer[theirs]:7.1f} "
                  f"tok/s → {ours[mine] / peer[theirs]:.2f}×")
    greedy = table[table.temperature == 0.0].set_index(["workload", "arm"])
    print(f"\nSUMMARY ({args.pair}, greedy, batch 1)")
    for w in prompt_sets:
        for name in [n for n in drafting if n != "ngram"]:
            dm = greedy.loc[(w, name)]
            print(f"  {w:5s} {name} {dm.speedup:.2f}× decode (95 % interval "
                  f"{dm.speedup_lo:.2f}–{dm.speedup_hi:.2f}, {int(dm.requests)} requests), "
                  f"{dm.wall_speedup:.2f}× wall "
                  f"(predicted {dm.predicted}, error "
                  f"{abs(dm.speedup - dm.predicted) / dm.predicted:.0%}), acceptance "
                  f"{dm.acceptance_rate}, mean accepted length {dm.mean_accepted_length}")
        if "ngram" in engines:
            ng = greedy.loc[(w, "ngram")]
            print(f"  {w:5s} ngram {ng.speedup:.2f}× ({ng.speedup_lo:.2f}–{ng.speedup_hi:.2f}), "
                  f"acceptance {ng.acceptance_rate} ({ng.acceptance_lo}–{ng.acceptance_hi}, "
                  f"{int(ng.draft_tokens)} draft tokens over {int(ng.requests)} requests)")
    for name in (n for n in drafting if " conf=" in n):
        twin = name.split(" ")[0]
        for w in prompt_sets:
            gated, fixed = greedy.loc[(w, name)], greedy.loc[(w, twin)]
            print(f"  {w:5s} {name}: {gated.speedup:.2f}× ({gated.speedup_lo:.2f}–"
                  f"{gated.speedup_hi:.2f}) against {fixed.speedup:.2f}× ungated; acceptance "
                  f"{gated.acceptance_rate} against {fixed.acceptance_rate}, rounds drafted "
                  f"{gated.draft_share} against {fixed.draft_share}")
    if smollm2 and drafting:
        for w in ("chat", "code"):
            if w not in prompt_sets:
                continue
            best = greedy.loc[w].drop("target-only").speedup.idxmax()
            print(f"  {w}: fastest arm {best} {greedy.loc[(w, best)].speedup:.2f}× "
                  f"(target >= 1.8×)")
    if "pysrc" in prompt_sets and "draft-model" in engines:
        print(f"  held-out Python source (aiohttp, never trained on): draft-model "
              f"{greedy.loc[('pysrc', 'draft-model')].speedup:.2f}× (target >= 1.4×)")

    def acceptance(arm: str, workloads: tuple[str, ...]) -> dict[str, float] | None:
        if arm not in engines or not set(workloads) <= set(prompt_sets):
            return None
        rates = {w: greedy.loc[(w, arm)].acceptance_rate for w in workloads}
        return {w: 0.0 if pd.isna(r) else float(r) for w, r in rates.items()}

    print("  target-only greedy answer tokens inside a 4-token span seen earlier (what lookup "
          "can copy): " + ", ".join(f"{w} {share:.0%} of {n}" for w, (share, n) in copied.items()))
    ngram_acc = acceptance("ngram", ("chat", "code", "rag"))
    if ngram_acc:
        print(f"  RAG has the highest n-gram acceptance: "
              f"{max(ngram_acc, key=ngram_acc.get) == 'rag'} ({ngram_acc}; intervals above)")
    for arm in ("draft-model", "eagle"):
        acc = acceptance(arm, ("chat", "rag"))
        if acc:
            print(f"  {arm} acceptance on RAG >= chat: {acc['rag'] >= acc['chat']} ({acc})")
    if args.json:  # written whole, then renamed: a reader never sees half a file
        tmp = Path(args.json + ".tmp")
        tmp.write_text(json.dumps({"batch1": rows, "throughput": thr, "hf": peer,
                                   "copied_share": copied}, indent=2))
        tmp.replace(args.json)


if __name__ == "__main__":
    main()
