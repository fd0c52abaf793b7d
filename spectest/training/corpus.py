"""Assemble the demo models' training corpus from text already on the machine.

Owns: finding the sources (the Python standard library's ``.py`` files for code; Debian's
``python3.11-doc`` reStructuredText sources for English prose), shaping some of them into the
three prompt styles spectest serves (chat turns, code instructions, RAG question + context),
long multi-passage RAG documents for the context-extension phase (``long_rag_documents``), and a
deterministic train / held-out split by file.

Does not know: tokenizers or models. Everything is sorted and seeded so two runs see the same
documents in the same order.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

DOC_ROOT = Path("/usr/share/doc/python3.11/html/_sources")
EOS = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (EOS, IM_START, IM_END)
SYSTEM_PROMPT = "You are a helpful assistant for Python programmers."
# Rendered by the chat template shipped in tokenizer_config.json (ChatML).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + SYSTEM_PROMPT + "<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Document:
    text: str
    domain: str  # "code" | "prose"
    source: str  # file path it came from
    held_out: bool


class CorpusError(RuntimeError):
    pass


def chat(messages: list[tuple[str, str]]) -> str:
    """ChatML text of a conversation, as the chat template renders it, plus the EOS marker."""
    out = []
    if messages[0][0] != "system":
        out.append(f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n")
    out += [f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in messages]
    return "".join(out)


def _held_out(path: str, fraction: float) -> bool:
    digest = hashlib.sha256(path.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "__pycache__",
            "encodings", "pydoc_data", "ensurepip", "config-")
    files = [p for p in root.rglob("*.py")
             if not any(part.startswith(skip) for part in p.relative_to(root).parts)]
    return sorted(files)


def doc_files(root: Path = DOC_ROOT) -> list[Path]:
    return sorted(root.rglob("*.rst.txt"))


_HEADING = re.compile(r"^(.+)\n([=\-~^*#]{3,})\s*$", re.MULTILINE)


def doc_sections(text: str) -> list[tuple[str, str]]:
    """(title, body) pairs of a reStructuredText file, split at underlined headings."""
    marks = [(m.start(), m.end(), m.group(1).strip()) for m in _HEADING.finditer(text)
             if len(m.group(2)) >= len(m.group(1).strip()) - 2]
    sections = []
    for i, (_, end, title) in enumerate(marks):
        body_end = marks[i + 1][0] if i + 1 < len(marks) else len(text)
        body = text[end:body_end].strip()
        if len(body) > 200 and not title.startswith(".."):
            sections.append((re.sub(r"[:`*]", "", title), body))
    return sections


def code_instructions(source: str) -> list[tuple[str, str]]:
    """(instruction, code) pairs from top-level functions with a docstring."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node):
            doc = ast.get_docstring(node).strip().splitlines()[0]
            code = "\n".join(lines[node.lineno - 1:node.end_lineno])
            if 80 < len(code) < 2500:
                out.append((f"Write a Python function `{node.name}`: {doc}", code))
    return out


def build_documents(seed: int = 0, held_out_fraction: float = 0.03,
                    doc_root: Path = DOC_ROOT, max_files: int | None = None) -> list[Document]:
    """All training documents, in a seeded order. Raises CorpusError if a source is missing."""
    py_files = stdlib_files()
    rst_files = doc_files(doc_root)
    if not py_files:
        raise CorpusError("no Python standard-library sources found")
    if not rst_files:
        raise CorpusError(f"no documentation sources under {doc_root}: install Debian's "
                          "python3.11-doc package (apt-get install python3.11-doc)")
    if max_files:
        py_files, rst_files = py_files[:max_files], rst_files[:max_files]
    rng = random.Random(seed)
    docs: list[Document] = []
    for path in py_files:
        src = path.read_text(encoding="utf-8", errors="replace")
        held = _held_out(str(path.name), held_out_fraction)
        docs.append(Document(src, "code", str(path), held))
        for instruction, code in code_instructions(src):
            text = chat([("user", instruction), ("assistant", f"```python\n{code}\n```")])
            docs.append(Document(text, "code", str(path), held))
    for path in rst_files:
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = str(path.relative_to(doc_root))
        held = _held_out(rel, held_out_fraction)
        docs.append(Document(text, "prose", rel, held))
        for title, body in doc_sections(text):
            body = body[:1500]
            style = rng.random()
            if style < 0.5:
                question = rng.choice(["Explain {t}.", "What is {t} in Python?",
                                       "Can you tell me about {t}?", "How does {t} work?"])
                text_ = chat([("user", question.format(t=title)), ("assistant", body)])
            else:
                passage = body[:900]
                first = re.split(r"(?<=[.!?])\s", passage, maxsplit=2)
                answer = " ".join(first[:2]).strip()
                prompt = (f"Answer the question using the context.\n\nContext:\n{passage}\n\n"
                          f"Question: What does the documentation say about {title}?")
                text_ = chat([("user", prompt),
                              ("assistant", f"According to the context, {answer}")])
            docs.append(Document(text_, "prose", rel, held))
    rng.shuffle(docs)
    return docs


RAG_INSTRUCTION = ("Answer the question using only the passages. First quote, word for word, "
                   "the sentence that contains the answer; then give the answer.")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def long_rag_documents(count: int, seed: int = 0, held_out_fraction: float = 0.03,
                       doc_root: Path = DOC_ROOT, max_files: int | None = None,
                       passages: tuple[int, int] = (4, 12)) -> list[Document]:
    """``count`` long RAG conversations (domain ``long``): 4–12 numbered documentation sections
    as passages, a question about one of them by title, and an answer that first quotes that
    section's opening sentence word for word — the shape of the bundled RAG workload (several
    passages, 1k–3k tokens, answers copied from the context), so that a model trained on them
    learns to attend thousands of positions back. Passages of held-out files make the held-out
    documents (every 20th), so they share no text with the training ones."""
    rng = random.Random(seed + 7)
    pools: dict[bool, list[tuple[str, str]]] = {False: [], True: []}
    files = doc_files(doc_root)
    for path in files[:max_files] if max_files else files:
        held = _held_out(str(path.relative_to(doc_root)), held_out_fraction)
        text = path.read_text(encoding="utf-8", errors="replace")
        for title, body in doc_sections(text):
            sentences = _SENTENCE.split(body.strip(), maxsplit=2)
            if len(sentences) >= 2 and 20 < len(sentences[0]) < 400:
                pools[held].append((title, body[:1500]))
    docs = []
    for i in range(count):
        held = i % 20 == 0 and len(pools[True]) >= passages[0]
        pool = pools[held]
        picks = rng.sample(pool, min(len(pool), rng.randint(*passages)))
        answer = rng.randrange(len(picks))
        title, body = picks[answer]
        first, second = _SENTENCE.split(body.strip(), maxsplit=2)[:2]
        context = "\n\n".join(f"[{j + 1}] {t}\n{b}" for j, (t, b) in enumerate(picks))
        prompt = (f"{RAG_INSTRUCTION}\n\nPassages:\n\n{context}\n\n"
                  f"Question: What does passage \"{title}\" say?")
        reply = f"\"{first}\" [{answer + 1}]\n\nAnswer: {first} {second}"
        docs.append(Document(chat([("user", prompt), ("assistant", reply)]), "long",
                             f"long-rag-{i}", held))
    return docs
