"""How the harness reads a page: commands, comments, continuations, markers, and the words and
servers it recognises — small pages, no servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.harness import PageRun, Session, words
from tests.docs.pages import PageError, read_page, strip_comment

PAGE = """\
# A page

<!-- doc-test: skip "bash scripts/test.sh": CI runs it -->
```bash
bash scripts/demo.sh    # 1. set up
bash scripts/test.sh    # 2. tests
```

```python
print("not shell")
```

<!-- doc-test: replace "path/to/model" with "spectest/models/target" -->
```bash
VLLM=~/x/python  # the CPU build
VLLM_CPU_KVCACHE_SPACE=1 $VLLM -m vllm.entrypoints.openai.api_server \\
  --model smollm2-hf --port 8001 \\
  --speculative-config '{"method":"ngram"}' &
spectest serve --model path/to/model
curl -s "http://127.0.0.1:8001/x#y" # a comment
```

<!-- doc-test: skip: no SGLang server here -->
```bash
spectest sweep --host http://SPEC:PORT
```
"""


def _page(tmp_path: Path, text: str) -> list:
    (tmp_path / "page.md").write_text(text)
    return read_page(tmp_path, "page.md")


def test_blocks_commands_and_markers(tmp_path):
    first, second, third = _page(tmp_path, PAGE)
    assert [c.text for c in first.commands] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert [c.skip for c in first.commands] == ["", "CI runs it"]
    assert (first.line, first.commands[0].line) == (4, 5)
    assert second.replace == (("path/to/model", "spectest/models/target"),)
    vllm = second.commands[1]
    assert vllm.line == 16 and vllm.background
    assert vllm.foreground_text == ("VLLM_CPU_KVCACHE_SPACE=1 $VLLM -m "
                                    "vllm.entrypoints.openai.api_server --model smollm2-hf "
                                    "--port 8001 --speculative-config '{\"method\":\"ngram\"}'")
    assert second.commands[3].text == 'curl -s "http://127.0.0.1:8001/x#y"'
    assert third.skip == "no SGLang server here"


@pytest.mark.parametrize("text, why", [
    ("```\nls\n```\n", "without a language"),
    ("```bash\nls\n", "never closed"),
    ("<!-- doc-test: run twice -->\n```bash\nls\n```\n", "unknown doc-test marker"),
    ('<!-- doc-test: skip "rm": x -->\n```bash\nls\n```\n', "no command of the block"),
])
def test_pages_the_harness_cannot_read_are_refused(tmp_path, text, why):
    with pytest.raises(PageError, match=why):
        _page(tmp_path, text)


def test_comments_and_words():
    assert strip_comment("a 'b # c' \"d # e\" f # g") == "a 'b # c' \"d # e\" f"
    assert strip_comment("x=1#not-a-comment") == "x=1#not-a-comment"
    assert words('GGUF=$(python -c "print(1)") b \'c d\'') == \
        ['GGUF=$(python -c "print(1)")', "b", "'c d'"]


def test_servers_ports_and_state_lines(tmp_path):
    run = PageRun(Session(tmp_path, in_ci=True), "page.md")
    run.env["LLAMA"] = "/cache/llama-server/bin/llama-server"
    assert run.server_kind("spectest serve --model smollm2") == ("spectest serve", 8000)
    assert run.server_kind("A=0 B=1 $PY -m vllm.entrypoints.openai.api_server --port 8002") \
        == ("vLLM", 8002)
    assert run.server_kind("$LLAMA -m m.gguf --port 8081") == ("llama-server", 8081)
    assert run.server_kind("spectest sweep --host http://127.0.0.1:8000") is None
    assert run.is_state("VLLM=~/x/python") and run.is_state(". .venv/bin/activate")
    assert not run.is_state("A=1 spectest sweep")
    moved = run.moved("spectest audit --candidate http://127.0.0.1:8001 --baseline "
                      "http://localhost:8002 --port 8001")
    a, b = run.ports[8001], run.ports[8002]
    assert moved == (f"spectest audit --candidate http://127.0.0.1:{a} --baseline "
                     f"http://localhost:{b} --port {a}")


SHELL_PAGE = """\
```bash
GREETING=hello   # a variable the next lines see
mkdir -p out && cd out
echo "$GREETING" > said.txt
```

<!-- doc-test: skip "false": a line that cannot run here -->
```bash
false
cat said.txt
```

```bash
cat no-such-file
echo never
```
"""


def test_a_page_runs_as_one_terminal(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "page.md").write_text(SHELL_PAGE)
    (root / "again.md").write_text("```bash\nGREETING=hello\ncd out\ncat said.txt\n```\n")
    session = Session(tmp_path / "work", in_ci=True, root=root)
    records = session.run_page("page.md")
    assert [r.status for r in records] == ["ran", "ran", "ran", "skipped", "ran", "failed",
                                           "not reached"]
    assert (session.scratch / "out" / "said.txt").read_text() == "hello\n"
    assert records[5].rc == 1 and "No such file" in records[5].note
    again = session.run_page("again.md")  # a new terminal: its own variables and folder
    assert [r.status for r in again] == ["ran", "ran", "same"]
    assert again[2].note == "same command and servers as page.md:10"
