"""The model card (``README.md`` beside the embedded pair), written from the training figures.

Owns: the card's text — corpus, sizes, held-out loss, draft/target agreement, how to rebuild.
Does not know: how the figures were measured (``train.py`` measures them).
"""

from __future__ import annotations

import json
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

Greedy per-token agreement of draft and target on held-out text (teacher-forced: the
per-token acceptance a greedy speculative decoder sees):
code **{agree['code']}**, prose **{agree['prose']}** (before distillation: code
{before['code']}, prose {before['prose']}).

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
3. Draft: {r['draft_steps']} steps of plain training, then {r['distill_steps']} steps of
   forward-KL distillation on the target's logits (plain training followed by KL fine-tuning
   beat distillation from scratch in earlier measurements).
4. Weights stored in fp16; every figure above is measured on the stored weights.

## Rebuild
```
spectest train-demo-models --seed {f['seed']} --out spectest/models   # about {f['total_minutes']} min here
python benchmarks/models.py        # sizes, speed, cost ratio c, agreement by domain
```
Same seed and thread count → the same tokenizer and closely matching losses
(`tests/training/test_training_reproducible.py`). Engine-level acceptance:
`python benchmarks/engine_speedup.py`.
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
