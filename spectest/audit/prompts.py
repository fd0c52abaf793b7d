"""The audited prompt set: a bundled workload dataset or a user's JSONL, as token ids.

Owns: choosing the prompts (a seeded sample of ``--num-prompts`` records from
``spectest.loadgen.datasets``, which reads the bundled ``chat``/``code``/``rag``/``mixed`` sets
and user files in the spectest, plain ``prompt``/``messages``, ShareGPT and Spec-Bench layouts),
rendering chat records to one completion prompt, and turning each into the exact token ids that
both servers will receive (tokenized once, by the baseline: echo or its ``/tokenize``, see
``scoring``).

Sending token ids rather than text means both sides see the same prompt even when their
tokenizer front-ends differ, and the baseline can score the candidate's outputs position by
position.  Chat records are rendered as plain ``role: content`` lines ending in ``assistant:``:
the audit tests decoding, not chat templates.

Does not know: the checks.
"""

from __future__ import annotations

import asyncio

from spectest.audit import scoring
from spectest.audit.client import Client
from spectest.audit.samples import AuditError, PromptCase
from spectest.loadgen.datasets import DatasetError, Record, load_dataset


def load_records(source: str, n: int, seed: int) -> list[Record]:
    """The first ``n`` records of the dataset's seeded permutation (all, if it has fewer)."""
    try:
        dataset = load_dataset(source, seed=seed)
    except DatasetError as exc:
        raise AuditError(f"prompt set: {exc}") from None
    except OSError as exc:
        raise AuditError(f"prompt set {source}: {exc.strerror or exc}") from None
    records = list(dataset.records[:n])
    if not records:
        raise AuditError(f"prompt set {source!r} has no prompts")
    return records


def render(record: Record) -> str:
    if record.prompt is not None:
        return record.prompt
    lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in record.messages or ()]
    return "\n".join(lines) + "\nassistant:"


async def tokenize(records: list[Record], client: Client, max_tokens: int) -> list[PromptCase]:
    """Token ids per record (at most ``max_tokens``, cut where a character ends); empty prompts
    are refused."""
    # Cut long texts before tokenizing, so that a long RAG prompt never exceeds the server's
    # context; >= 1 character per token holds for byte-level BPE, ~4 is typical.
    texts = [render(r)[:4 * max_tokens] for r in records]
    empty = [r.id for r, t in zip(records, texts) if not t.strip()]
    if empty:
        raise AuditError(f"prompt set: record {empty[0]!r} has an empty prompt")
    limit = max_tokens if client.routes.token_ids else None  # text is sent whole: keep it
    ids = await asyncio.gather(*(_head(client, t, limit) for t in texts))
    cases = []
    for record, text, toks in zip(records, texts, ids):
        if not toks:
            raise AuditError(f"prompt set: record {record.id!r} tokenizes to zero tokens")
        cases.append(PromptCase(record.id, record.category, tuple(toks), text))
    return cases


async def _head(client: Client, text: str, max_tokens: int | None) -> list[int]:
    """The ids of the longest head of ``text`` found (by shrinking) to fit ``max_tokens``.

    The text is cut, not the ids: the first ``max_tokens`` ids can end inside a character that
    byte-level BPE spreads over several tokens (a Korean name in a RAG passage did), and then
    the model's first token finishes a character the prompt began — a prompt no user sends,
    and one where servers that report logprobs per character (llama.cpp) hold the first
    position's logprobs back."""
    return (await head(client, text, max_tokens))[1]


async def head(client: Client, text: str, max_tokens: int | None) -> tuple[str, list[int]]:
    """The longest head of ``text`` (cut on a character) within ``max_tokens`` tokens as
    ``client``'s server tokenizes it, and its ids (``max_tokens`` None: all of it)."""
    toks = await scoring.tokenize(client, text)
    while max_tokens is not None and len(toks) > max_tokens:
        text = text[:max(1, min(len(text) - 1, len(text) * max_tokens // len(toks)))]
        toks = await scoring.tokenize(client, text)
    return text, toks
