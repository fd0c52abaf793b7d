r"""The report's document model and its two writers: Markdown and self-contained HTML.

A document is a list of ``Section``s whose blocks are text (Markdown-ish: ``**bold**`` and
``\`code\```), ``Bullets``, ``Table``s and ``Image``s. It is built once and written twice, so
``report.md`` and ``report.html`` (images inlined as base64, nothing fetched) never disagree.
Also the number formats every page shares (and ``atomic_write``, which is ``spectest.files``').
It knows nothing about sweeps or break points.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from spectest.files import write_atomic as atomic_write  # noqa: F401  (the pages' writer)


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Image:
    path: Path
    caption: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list = field(default_factory=list)


def fmt(v, spec: str = ".3g", unit: str = "", none: str = "–") -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return none
    return none if not math.isfinite(x) else format(x, spec) + unit


def _x(v) -> str:
    return fmt(v, ".2f", "×")


def to_markdown(title: str, sections: list[Section], base: Path) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, str):
                out += [b, ""]
            elif isinstance(b, Bullets):
                out += [f"- {x}" for x in b.items] + [""]
            elif isinstance(b, Table):
                out += ["| " + " | ".join(b.header) + " |",
                        "|" + "|".join("---" for _ in b.header) + "|"]
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |"
                        for r in b.rows] + [""]
            elif isinstance(b, Image):
                out += [f"![{b.caption}]({os.path.relpath(b.path, base)})", "", f"*{b.caption}*",
                        ""]
    return "\n".join(out)


def _inline(text: str) -> str:
    s = html.escape(text)
    s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", s)


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;
margin:2em auto;padding:0 1em;color:#222;line-height:1.45}h1{font-size:1.6em}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}th,td{border:1px solid #ccc;
padding:.25em .55em;text-align:left}th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}figcaption{color:#555;
font-size:.9em}code{background:#f3f3f3;padding:0 .25em}li{margin:.25em 0}"""


def to_html(title: str, sections: list[Section]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, str):
                out.append(f"<p>{_inline(b)}</p>")
            elif isinstance(b, Bullets):
                out.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b.items) + "</ul>")
            elif isinstance(b, Table):
                head = "".join(f"<th>{html.escape(h)}</th>" for h in b.header)
                body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r)
                               + "</tr>" for r in b.rows)
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif isinstance(b, Image):
                data = base64.b64encode(b.path.read_bytes()).decode("ascii")
                out.append(f'<figure><img alt="{html.escape(b.caption)}" '
                           f'src="data:image/png;base64,{data}"><figcaption>'
                           f"{html.escape(b.caption)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)
