"""What SmolLM2 says: the prompts a draft for it learns from, and SmolLM2's answers to them.

Owns: the prompt set — the bundled chat / code / RAG workload records, split train / held-out
by a hash of each record's id (held-out records are never trained on; the agreement figures
use only them), plus code and prose windows from the embedded corpus as extra chat and
completion prompts, and the extra prompts of ``training.extra_prompts`` — and :func:`generate`,
which decodes SmolLM2 (int8) greedily with continuous batching and
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
from spectest.training import corpus, extra_prompts

WORKLOADS = ("chat", "code", "rag")
HELD_OUT_PERCENT = 20


def held_out(record_id: str) -> bool:
    """A workload record is held out (never trained on) by a hash of its id: ~20 %."""
    digest = hashlib.sha256(f"spectest-draft:{record_id}".encode()).digest()
    return digest[0] * 100 // 256 < HELD_OUT_PERCENT


@dataclass(frozen=True)
class Prompt:
    source: str  # "chat" / "code" / "rag" (workload records), "corpus-code" / "corpus-prose",
    # or an extra_prompts source ("qa", "passages", "open", "code-task")
    record_id: str
    ids: tuple[int, ...]

    @property
    def key(self) -> tuple:
        """What makes two prompts the same question to SmolLM2 (a cache's key)."""
        return self.record_id, self.ids


def workload_prompts(tokenizer: Tokenizer, workload: str, *, held: bool,
                     max_prompt_tokens: int = 1536) -> list[Prompt]:
    """The workload's records on one side of the split, rendered as their first request is
    sent (the record's opening message through the chat template — every bundled chat, code
    and RAG record opens with one user message; follow-up turns, which need the model's own
    earlier answers, are not used — completion prompts as they are)."""
    out = []
    held_texts = [] if held else [t[:200] for t in held_out_texts()]
    for rec in load_dataset(workload).records:
        if held_out(rec.id) != held:
            continue
        if not held:  # a training record sharing text with a held-out one (MT-Bench's one-
            # and two-turn variants, HumanEval's completion and instruction) is left out
            text = rec.prompt if rec.messages is None else rec.messages[0].get("content", "")
            if any(text[:200] in h or h in text for h in held_texts):
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


def held_out_texts() -> list[str]:
    """The text of every held-out workload record (what extra prompts must not contain)."""
    out = []
    for workload in WORKLOADS:
        for rec in load_dataset(workload).records:
            if held_out(rec.id):
                out.append(rec.prompt if rec.messages is None else
                           "\n".join(m.get("content", "") for m in rec.messages))
    return out


def rendered_extra_prompts(tokenizer: Tokenizer, counts: dict[str, int], seed: int,
                           max_prompt_tokens: int = 1536) -> list[Prompt]:
    """``extra_prompts`` (questions, passages, open tasks, code tasks) as chat prompts."""
    out = []
    for source, pid, message in extra_prompts.extra_prompts(held_out_texts(), counts, seed):
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                             add_generation_prompt=True)
        ids = tokenizer.encode(text)
        if len(ids) <= max_prompt_tokens:
            out.append(Prompt(source, pid, tuple(ids)))
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

    def pick(self, indices: list[int]) -> "TeacherData":
        """The sequences at ``indices``, in that order."""
        return TeacherData([self.prompts[i] for i in indices],
                           [self.tokens[i] for i in indices],
                           [self.top_ids[i] for i in indices],
                           [self.top_logprobs[i] for i in indices])

    def __add__(self, other: "TeacherData") -> "TeacherData":
        return TeacherData(self.prompts + other.prompts, self.tokens + other.tokens,
                           self.top_ids + other.top_ids, self.top_logprobs + other.top_logprobs)


CHUNK = 256  # prompts per KV cache (sized to the chunk's longest prompt)


@torch.inference_mode()
def generate(model, prompts: list[Prompt], eos_ids: tuple[int, ...], max_new: int,
             top_k: int = 16, batch: int = 16, progress=print) -> TeacherData:
    """Greedy answers of ``model`` to every prompt, ``batch`` rows decoding together with
    continuous batching: a row that finishes is refilled with the next prompt (prefilled
    alone) before the next step, so no step computes finished rows. Prompts go shortest
    first, ``CHUNK`` at a time, each chunk with a KV cache sized to its longest prompt (and
    the allocator's freed memory handed back between chunks: a long run otherwise grew to
    the machine's 24 GB). Fused attention: batch-invariant rows are for serving, not for
    making data (so an answer can differ in a near-tie with ``batch``; for one ``batch`` and
    thread count it is deterministic). Answers are returned in prompt order."""
    started = time.perf_counter()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].ids))  # similar lengths
    results: dict[int, tuple] = {}
    progress_state = {"tokens": 0, "last": started}
    for first in range(0, len(order), CHUNK):
        _generate_chunk(model, prompts, order[first:first + CHUNK], eos_ids, max_new, top_k,
                        batch, results, progress_state, started, progress)
        _release_freed_memory()
    data = TeacherData([], [], [], [])
    for index, p in enumerate(prompts):
        answer, top_i, top_v = results[index]
        data.prompts.append(p)
        data.tokens.append(torch.tensor(p.ids + tuple(answer), dtype=torch.int32))
        data.top_ids.append(torch.stack(top_i))
        data.top_logprobs.append(torch.stack(top_v))
    return data


def _generate_chunk(model, prompts, indices, eos_ids, max_new, top_k, batch, results,
                    state, started, progress) -> None:
    """Continuous batching over ``indices`` (see :func:`generate`); answers go to
    ``results[index]`` as (tokens, top-k ids per token, top-k logprobs per token)."""
    longest = max(len(prompts[i].ids) for i in indices)
    cache = model.new_cache(batch, longest + max_new + 1)
    queue = list(reversed(indices))
    rows: list[dict | None] = [None] * batch  # slot → the answer being generated there

    def admit(slot: int) -> None:
        index = queue.pop()
        ids = prompts[index].ids
        cache.reset(slot)
        if len(ids) > 1:  # all but the last prompt token; the last is the first decode input
            model(torch.tensor([ids[:-1]]), cache, torch.tensor([slot]), last_only=True,
                  hidden_only=True, row_exact=False)
        rows[slot] = {"index": index, "answer": [], "ids": [], "lps": [], "next": ids[-1]}

    while queue or any(rows):
        for slot in range(batch):
            if rows[slot] is None and queue:
                admit(slot)
        live = [s for s in range(batch) if rows[s] is not None]
        feed = torch.tensor([[rows[s]["next"]] for s in live])  # [b, 1]
        logits = model(feed, cache, torch.tensor(live), row_exact=False)[:, -1]  # [b, V]
        values, ids = logits.float().log_softmax(-1).topk(top_k, dim=-1)  # [b, k]
        picks = ids[:, 0].tolist()
        ids, values = ids.to(torch.int32), values.to(torch.float16)
        for j, slot in enumerate(live):
            row = rows[slot]
            row["answer"].append(picks[j])
            row["ids"].append(ids[j].clone())
            row["lps"].append(values[j].clone())
            row["next"] = picks[j]
            if picks[j] in eos_ids or len(row["answer"]) >= max_new:
                results[row["index"]] = (row["answer"], row["ids"], row["lps"])
                state["tokens"] += len(row["answer"])
                rows[slot] = None
        now = time.perf_counter()
        if now - state["last"] > 30 or (not queue and not any(rows)):
            state["last"] = now
            progress(f"teacher: {len(results)}/{len(prompts)} prompts, {state['tokens']} "
                     f"answer tokens, {state['tokens'] / max(now - started, 1e-9):.0f} tok/s, "
                     f"{now - started:.0f} s, RSS {_rss_gb():.1f} GB")


def _rss_gb() -> float:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 1e9
    except OSError:
        return float("nan")


def _release_freed_memory() -> None:
    """Hand memory that was freed back to the OS (glibc keeps it otherwise)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
