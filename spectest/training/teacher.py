"""What SmolLM2 says: the prompts a draft for it learns from, and SmolLM2's answers to them.

Owns: the prompt set — the bundled chat / code / RAG workload records, split train / held-out
by a hash of each record's id (held-out records are never trained on; the agreement figures
use only them), plus code and prose windows from the embedded corpus as extra chat and
completion prompts — and :func:`generate`, which decodes SmolLM2 (int8) greedily in batches and
keeps, at every generated position, the token and SmolLM2's top-k log-probabilities (the
logits a draft is distilled against). :class:`TeacherData` saves and loads them.

Does not know: the draft or its training (``training.distill``).
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from spectest.engine.tokenizer import Tokenizer
from spectest.loadgen.datasets import load_dataset
from spectest.training import corpus

WORKLOADS = ("chat", "code", "rag")
HELD_OUT_PERCENT = 20


def held_out(record_id: str) -> bool:
    """A workload record is held out (never trained on) by a hash of its id: ~20 %."""
    digest = hashlib.sha256(f"spectest-draft:{record_id}".encode()).digest()
    return digest[0] * 100 // 256 < HELD_OUT_PERCENT


@dataclass(frozen=True)
class Prompt:
    source: str  # "chat" / "code" / "rag" (workload records) or "corpus-code" / "corpus-prose"
    record_id: str
    ids: tuple[int, ...]


def workload_prompts(tokenizer: Tokenizer, workload: str, *, held: bool,
                     max_prompt_tokens: int = 1536) -> list[Prompt]:
    """The workload's records on one side of the split, rendered as their first request is
    sent (the record's opening message through the chat template — every bundled chat, code
    and RAG record opens with one user message; follow-up turns, which need the model's own
    earlier answers, are not used — completion prompts as they are)."""
    out = []
    for rec in load_dataset(workload).records:
        if held_out(rec.id) != held:
            continue
        if rec.messages is not None:
            text = tokenizer.apply_chat_template(list(rec.messages)[:1],
                                                 add_generation_prompt=True)
        else:
            text = rec.prompt
        ids = tokenizer.encode(text)
        if 0 < len(ids) <= max_prompt_tokens:
            out.append(Prompt(workload, rec.id, tuple(ids)))
    return out


def corpus_prompts(tokenizer: Tokenizer, n: int, seed: int) -> list[Prompt]:
    """Extra training prompts from the embedded corpus (stdlib source, Python docs): half as
    chat questions about a window of text, half as raw code to continue."""
    rng = random.Random(f"spectest-draft:corpus:{seed}")
    docs = [d for d in corpus.build_documents(seed=0) if not d.held_out]
    rng.shuffle(docs)
    asks = ("Explain what this code does.", "Summarise this passage in two sentences.",
            "What are the key points here?", "Write a short example that uses this.",
            "Rewrite this more simply.", "What could go wrong with this?")
    out: list[Prompt] = []
    for i, doc in enumerate(docs):
        if len(out) >= n:
            break
        text = doc.text
        start = rng.randrange(max(1, len(text) - 1200))
        window = text[start:start + rng.randrange(300, 1200)]
        if len(window.strip()) < 200:
            continue
        if doc.domain == "code" and i % 2:
            out.append(Prompt("corpus-code", f"corpus-{i}", tuple(tokenizer.encode(window))))
        else:
            question = rng.choice(asks)
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": f"{question}\n\n{window}"}],
                add_generation_prompt=True)
            out.append(Prompt(f"corpus-{doc.domain}", f"corpus-{i}",
                              tuple(tokenizer.encode(rendered))))
    return out


@dataclass
class TeacherData:
    """SmolLM2's greedy answers: per sequence the prompt length, the full token ids, and at
    each generated position the top-k token ids and log-probabilities."""
    prompts: list[Prompt]
    tokens: list[torch.Tensor]  # [len] int32: prompt + answer
    top_ids: list[torch.Tensor]  # [answer_len, k] int32
    top_logprobs: list[torch.Tensor]  # [answer_len, k] float16

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save({"prompts": [(p.source, p.record_id, p.ids) for p in self.prompts],
                    "tokens": self.tokens, "top_ids": self.top_ids,
                    "top_logprobs": self.top_logprobs}, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "TeacherData":
        raw = torch.load(path, weights_only=True)
        return cls([Prompt(*p) for p in raw["prompts"]], raw["tokens"], raw["top_ids"],
                   raw["top_logprobs"])

    @property
    def answer_tokens(self) -> int:
        return sum(len(t) for t in self.top_ids)


@torch.inference_mode()
def generate(model, prompts: list[Prompt], eos_ids: tuple[int, ...], max_new: int,
             top_k: int = 16, batch: int = 16, progress=print) -> TeacherData:
    """Greedy answers of ``model`` to every prompt, ``batch`` rows decoding in lock-step
    (fused attention: batch-invariant rows are for serving, not for making data)."""
    data = TeacherData([], [], [], [])
    started, done_tokens = time.perf_counter(), 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].ids))  # similar lengths
    for first in range(0, len(order), batch):
        group = [prompts[i] for i in order[first:first + batch]]
        longest = max(len(p.ids) for p in group)
        cache = model.new_cache(len(group), longest + max_new + 1)
        for row, p in enumerate(group):  # prefill alone (all but the last prompt token)
            if len(p.ids) > 1:
                model(torch.tensor([p.ids[:-1]]), cache, torch.tensor([row]), last_only=True,
                      row_exact=False)
        answers: list[list[int]] = [[] for _ in group]
        tops_i: list[list[torch.Tensor]] = [[] for _ in group]
        tops_v: list[list[torch.Tensor]] = [[] for _ in group]
        alive = torch.ones(len(group), dtype=torch.bool)
        logits = model(torch.tensor([[p.ids[-1]] for p in group]), cache,
                       row_exact=False)[:, -1]  # [B, V]
        for step in range(max_new):
            values, ids = logits.float().log_softmax(-1).topk(top_k, dim=-1)  # [B, k]
            pick = ids[:, 0]
            for row in range(len(group)):
                if alive[row]:
                    answers[row].append(int(pick[row]))
                    tops_i[row].append(ids[row].to(torch.int32))
                    tops_v[row].append(values[row].to(torch.float16))
                    if int(pick[row]) in eos_ids:
                        alive[row] = False
            if not bool(alive.any()) or step == max_new - 1:
                break
            logits = model(pick[:, None], cache, row_exact=False)[:, -1]
        for row, p in enumerate(group):
            data.prompts.append(p)
            data.tokens.append(torch.tensor(p.ids + tuple(answers[row]), dtype=torch.int32))
            data.top_ids.append(torch.stack(tops_i[row]))
            data.top_logprobs.append(torch.stack(tops_v[row]))
            done_tokens += len(answers[row])
        elapsed = time.perf_counter() - started
        progress(f"teacher: {len(data.prompts)}/{len(prompts)} prompts, {done_tokens} answer "
                 f"tokens, {done_tokens / max(elapsed, 1e-9):.0f} tok/s, {elapsed:.0f} s")
    return data
