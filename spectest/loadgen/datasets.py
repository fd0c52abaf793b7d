"""Workload records: loading, format detection and seeded replay.

This module owns the *record* — one prompt (or conversation) that a load-test user sends — and
the ways of getting records: the bundled datasets under ``workloads/data`` (``chat``, ``code``,
``rag``, ``mixed``) and user files in four layouts, told apart line by line:

* spectest JSONL: ``{"id", "category", "messages" | "prompt", "expected_output_tokens",
  "turns"?, "source"?, "license"?}`` (the layout of the bundled files);
* plain JSONL with just ``prompt`` or ``messages`` (defaults fill the rest);
* ShareGPT: ``{"id", "conversations": [{"from": "human"|"gpt"|"system", "value"}]}``, as JSONL
  or as one JSON array;
* Spec-Bench / MT-Bench ``question.jsonl``: ``{"question_id", "category", "turns": [...]}``.

Replay is seeded: ``Dataset.stream(seed, worker)`` yields the same record sequence every run.
It knows nothing about HTTP, Locust or the server; other tools (the auditor) import
``load_dataset`` and read ``Dataset.records``.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from spectest import files

CATEGORIES = ("chat", "code", "rag")
BUILTIN = ("chat", "code", "rag", "mixed")
DEFAULT_EXPECTED_TOKENS = 256
# Spec-Bench categories that are retrieval tasks; everything else in that layout is chat.
_SPEC_BENCH_RAG = {"rag"}


class DatasetError(ValueError):
    """A dataset file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class Record:
    """One unit of traffic: the first request plus optional follow-up user turns.

    Exactly one of ``messages`` (OpenAI chat messages, sent to ``/v1/chat/completions``) and
    ``prompt`` (sent to ``/v1/completions``) is set. ``turns`` are later user messages of a
    multi-turn conversation, each sent after the model's previous answer.
    """

    id: str
    category: str
    expected_output_tokens: int
    messages: tuple[Mapping[str, str], ...] | None = None
    prompt: str | None = None
    turns: tuple[str, ...] = ()
    source: str = ""
    license: str = ""

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise DatasetError(f"record {self.id!r}: needs exactly one of messages and prompt")
        if self.expected_output_tokens < 1:
            raise DatasetError(f"record {self.id!r}: expected_output_tokens must be >= 1")

    @property
    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.get("content", "")) for m in self.messages or ())

    def to_json(self) -> dict:
        out: dict = {"id": self.id, "category": self.category}
        if self.messages is not None:
            out["messages"] = [dict(m) for m in self.messages]
        else:
            out["prompt"] = self.prompt
        out["expected_output_tokens"] = self.expected_output_tokens
        if self.turns:
            out["turns"] = list(self.turns)
        if self.source:
            out["source"] = self.source
        if self.license:
            out["license"] = self.license
        return out


@dataclass(frozen=True)
class Dataset:
    name: str
    records: tuple[Record, ...] = field(repr=False)

    def __len__(self) -> int:
        return len(self.records)

    def stream(self, seed: int, worker: int = 0) -> Iterator[Record]:
        """Endless seeded replay: a fresh permutation per epoch, same sequence every run.

        ``worker`` gives each distributed Locust worker its own (still reproducible) sequence.
        """
        if not self.records:
            raise DatasetError(f"dataset {self.name!r} is empty")
        epoch = 0
        while True:
            rng = random.Random(f"spectest:{seed}:{worker}:{epoch}")
            for i in rng.sample(range(len(self.records)), len(self.records)):
                yield self.records[i]
            epoch += 1

    def with_system_prompt(self, text: str) -> Dataset:
        """Every chat record gets the same leading system message (prefix-cache realistic)."""
        if not text:
            return self
        out = []
        for r in self.records:
            has_system = bool(r.messages) and r.messages[0].get("role") == "system"
            if r.messages is not None and not has_system:
                r = replace(r, messages=({"role": "system", "content": text},) + r.messages)
            out.append(r)
        return replace(self, records=tuple(out))

    def with_max_prompt_chars(self, limit: int) -> Dataset:
        """Only records whose first request fits ``limit`` characters (0: no limit)."""
        if not limit:
            return self
        kept = tuple(r for r in self.records if r.prompt_chars <= limit)
        if not kept:
            raise DatasetError(f"dataset {self.name!r}: no record is shorter than {limit} chars")
        return replace(self, records=kept)

    def filter(self, category: str) -> Dataset:
        return replace(self, name=f"{self.name}[{category}]",
                       records=tuple(r for r in self.records if r.category == category))


def estimate_tokens(text: str) -> int:
    """Rough token count (about four characters per token, the usual English BPE figure)."""
    return max(1, math.ceil(len(text) / 4))


def data_dir() -> Path:
    """The bundled datasets: ``$SPECTEST_WORKLOADS_DATA``, else ``workloads/data`` of the
    checkout or of the installed package (``spectest.files``)."""
    env = os.environ.get("SPECTEST_WORKLOADS_DATA")
    return Path(env) if env else files.ROOT / "workloads" / "data"


def load_dataset(path_or_name: str | os.PathLike, seed: int | None = None,
                 default_category: str = "chat") -> Dataset:
    """Load a bundled dataset by name (``chat``, ``code``, ``rag``, ``mixed``) or a file.

    With ``seed`` the records come in a seeded permutation (the same for the same seed), so
    ``load_dataset("rag", seed=0).records[:50]`` is a reproducible sample.
    """
    name = str(path_or_name)
    if name in BUILTIN and not Path(name).exists():
        parts = CATEGORIES if name == "mixed" else (name,)
        records: list[Record] = []
        for part in parts:
            records.extend(_read_file(data_dir() / f"{part}.jsonl", part))
    else:
        path = Path(name)
        if not path.is_file():
            raise DatasetError(f"dataset {name!r}: no such file (bundled names: "
                               f"{', '.join(BUILTIN)})")
        records = _read_file(path, default_category)
    if not records:
        raise DatasetError(f"dataset {name!r} has no records")
    if seed is not None:
        records = random.Random(f"spectest:load:{seed}").sample(records, len(records))
    return Dataset(name=Path(name).stem if name not in BUILTIN else name, records=tuple(records))


def _read_file(path: Path, default_category: str) -> list[Record]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"{path}: {e.strerror or e}") from None
    stripped = text.lstrip()
    if stripped.startswith("["):  # one JSON array (ShareGPT dumps are usually like this)
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        numbered = list(enumerate(items, start=1))
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    out = []
    for lineno, obj in numbered:
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}:{lineno}: expected a JSON object")
        try:
            out.append(parse_record(obj, default_category, fallback_id=f"{path.stem}-{lineno}"))
        except (DatasetError, KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path}:{lineno}: {e}") from None
    return out


def parse_record(obj: Mapping, default_category: str = "chat", fallback_id: str = "") -> Record:
    """One JSON object in any supported layout → a Record."""
    if "conversations" in obj:
        return _from_sharegpt(obj, default_category, fallback_id)
    if "question_id" in obj and "turns" in obj and "messages" not in obj:
        return _from_question(obj, fallback_id)
    if "messages" not in obj and "prompt" not in obj:
        raise DatasetError("record has none of messages, prompt, conversations, turns")
    if "messages" in obj and "prompt" in obj:
        raise DatasetError("record needs exactly one of messages and prompt, not both")
    messages = obj.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise DatasetError("messages must be a non-empty list of {role, content}")
        messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in messages)
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise DatasetError("prompt must be a string")
    turns = obj.get("turns") or ()
    if not isinstance(turns, (list, tuple)) or not all(isinstance(t, str) for t in turns):
        raise DatasetError("turns must be a list of strings")
    return Record(
        id=str(obj.get("id", fallback_id)),
        category=str(obj.get("category", default_category)),
        expected_output_tokens=int(obj.get("expected_output_tokens", DEFAULT_EXPECTED_TOKENS)),
        messages=messages,
        prompt=prompt,
        turns=tuple(turns),
        source=str(obj.get("source", "")),
        license=str(obj.get("license", "")),
    )


def _from_sharegpt(obj: Mapping, default_category: str, fallback_id: str) -> Record:
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
             "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
             "system": "system"}
    system, users, answers = [], [], []
    for turn in obj["conversations"]:
        role = roles.get(str(turn.get("from", "")).lower())
        value = str(turn.get("value", ""))
        if role == "system":
            system.append(value)
        elif role == "user":
            users.append(value)
        elif role == "assistant" and users:
            answers.append(value)
    if not users:
        raise DatasetError("ShareGPT conversation has no human turn")
    messages = tuple([{"role": "system", "content": s} for s in system]
                     + [{"role": "user", "content": users[0]}])
    expected = estimate_tokens(answers[0]) if answers else DEFAULT_EXPECTED_TOKENS
    return Record(id=str(obj.get("id", fallback_id)),
                  category=str(obj.get("category", default_category)),
                  expected_output_tokens=expected, messages=messages, turns=tuple(users[1:]),
                  source=str(obj.get("source", "sharegpt")))


def _from_question(obj: Mapping, fallback_id: str) -> Record:
    turns = [str(t) for t in obj["turns"]]
    if not turns:
        raise DatasetError("question has no turns")
    raw_category = str(obj.get("category", ""))
    category = "rag" if raw_category in _SPEC_BENCH_RAG else (
        raw_category if raw_category in CATEGORIES else "chat")
    return Record(id=str(obj.get("question_id", fallback_id)), category=category,
                  expected_output_tokens=int(obj.get("expected_output_tokens",
                                                     DEFAULT_EXPECTED_TOKENS)),
                  messages=({"role": "user", "content": turns[0]},), turns=tuple(turns[1:]),
                  source=str(obj.get("source", raw_category and f"question:{raw_category}")))
