"""The documentation's shell blocks, read as the harness runs them.

Owns: finding every fenced shell block (```bash, sh, shell) of a Markdown page, its commands —
one per logical line: ``\\``-continued lines joined, comments and blank lines dropped, a
trailing ``&`` noted — and the ``doc-test`` markers written on the page just above a block:

    <!-- doc-test: skip: REASON -->                      the block cannot run here (SGLang, GPU)
    <!-- doc-test: skip "TEXT": REASON -->               its commands starting with TEXT
    <!-- doc-test: replace "OLD" with "NEW" -->          a path stands for one the reader has

What a command *is* (a server, a variable assignment, …) is :mod:`tests.docs.shell`'s. A fence
without a language is refused: it would be neither run nor knowingly left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

SHELL = ("bash", "sh", "shell")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
SKIP_BLOCK = re.compile(r"^skip:\s*(.+)$")
SKIP_LINE = re.compile(r'^skip\s+"([^"]+)":\s*(.+)$')
REPLACE = re.compile(r'^replace\s+"([^"]+)"\s+with\s+"([^"]*)"$')


class PageError(ValueError):
    """A page the harness cannot read as written (one line, naming the page and line)."""


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line of the page where the command starts
    text: str  # continuation lines joined, comment dropped; a trailing & kept
    skip: str = ""  # reason, when a marker leaves it out

    @property
    def background(self) -> bool:
        return self.text.endswith("&") and not self.text.endswith("&&")

    @property
    def foreground_text(self) -> str:
        return self.text[:-1].rstrip() if self.background else self.text


@dataclass(frozen=True)
class Block:
    page: str  # path relative to the repository
    line: int  # the opening fence's line
    commands: tuple[Command, ...]
    skip: str = ""  # reason, when the whole block is marked
    replace: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def strip_comment(line: str) -> str:
    """The line without a shell comment (``#`` starting a word, outside quotes)."""
    quote, escaped = "", False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(lines: list[str], first_line: int) -> list[tuple[int, str]]:
    """(line, text) per logical command of a block's body."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for offset, raw in enumerate(lines):
        if not parts:
            start = first_line + offset
        text = raw.rstrip()
        continued = text.endswith("\\") and not text.endswith("\\\\")
        if continued:
            text = text[:-1]
        text = strip_comment(text).strip()
        if text:
            parts.append(text)
        if not continued and parts:
            out.append((start, " ".join(parts)))
            parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def _directives(lines: list[str], fence: int, page: str) -> list[str]:
    """The markers on the lines just above the fence (index ``fence``)."""
    found = []
    i = fence - 1
    while i >= 0 and (m := MARKER.match(lines[i].strip())):
        found.append(m.group(1))
        i -= 1
    for text in found:
        if not (SKIP_BLOCK.match(text) or SKIP_LINE.match(text) or REPLACE.match(text)):
            raise PageError(f"{page}:{fence}: unknown doc-test marker {text!r} (skip: REASON, "
                            f'skip "TEXT": REASON, replace "OLD" with "NEW")')
    return list(reversed(found))


def read_page(root: Path, page: str) -> list[Block]:
    """Every shell block of ``root / page``, in page order."""
    lines = (root / page).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped.startswith("```"):
            i += 1
            continue
        lang = stripped[3:].strip().split(" ")[0].lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")),
                   None)
        if end is None:
            raise PageError(f"{page}:{i + 1}: code block never closed")
        if not lang:
            raise PageError(f"{page}:{i + 1}: code block without a language: tag it bash (the "
                            f"docs' tests run it) or text")
        if lang in SHELL:
            directives = _directives(lines, i, page)
            skip_block, skip_lines, replace = "", [], []
            for d in directives:
                if m := SKIP_LINE.match(d):
                    skip_lines.append((m.group(1), m.group(2)))
                elif m := SKIP_BLOCK.match(d):
                    skip_block = m.group(1)
                elif m := REPLACE.match(d):
                    replace.append((m.group(1), m.group(2)))
            cmds = []
            for line, text in commands(lines[i + 1:end], i + 2):
                why = next((r for t, r in skip_lines if text.startswith(t)), "")
                cmds.append(Command(line, text, why))
            for t, _ in skip_lines:
                if not any(c.text.startswith(t) for c in cmds):
                    raise PageError(f'{page}:{i + 1}: doc-test marker skips "{t}", which no '
                                    f"command of the block starts with")
            blocks.append(Block(page, i + 1, tuple(cmds), skip_block, tuple(replace)))
        i = end + 1
    return blocks
