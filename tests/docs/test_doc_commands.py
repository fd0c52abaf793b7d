"""Every command of the README and the quick starts runs as written (tests/docs/harness.py says
what the harness may change: ports, marked paths, SPECTEST_SMOKE's token sizes, waiting for and
stopping servers), and so does each script those pages name, in its short mode.

The pages run in ``PAGES`` order, each as one reader's terminal; a page fails when one of its
commands fails. The list of every block and command — ran, skipped with its reason, failed — is
printed at the end of the test run.
"""

from __future__ import annotations

import re

import pytest

from tests.docs.harness import PAGES, ROOT, Record, Session
from tests.docs.pages import read_page

# The scripts the docs name, each in its short mode (SPECTEST_SMOKE=1 is set for every command):
# the command, and the third-party server it needs. {out} is a scratch folder.
SCRIPTS = {
    "scripts/vllm_example.py": ("python scripts/vllm_example.py --out {out}", "vLLM"),
    "scripts/llamacpp_example.py": ("python scripts/llamacpp_example.py --quick --kinds draft "
                                    "--out {out}", "llama-server"),
    "scripts/smollm2_example.sh": ("scripts/smollm2_example.sh {out} ngram+eagle", ""),
}
# scripts a page names that no block runs and that need no short mode of their own
COVERED = {"scripts/setup.sh": "scripts/demo.sh runs it (README), scripts/test.sh in CI",
           "scripts/vllm_schedule_example.py": "tests/thirdparty/test_vllm_schedule.py runs its "
                                               "steps (three vLLM servers: too long to run twice)"}
SCRIPT_NAME = re.compile(r"scripts/[A-Za-z0-9_.-]+\.(?:sh|py)")


def _failures(records: list[Record]) -> list[str]:
    return [r.line() for r in records if r.status in ("failed", "not reached")]


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(docs: Session, page: str):
    records = docs.run_page(page)
    assert records, f"{page} has no shell block"
    bad = _failures(records)
    assert not bad, f"{page}: commands that did not run as written:\n" + "\n".join(bad)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_script_short_mode(docs: Session, script: str):
    command, needs = SCRIPTS[script]
    rec = docs.run_script(script, command, needs)
    if rec.status == "skipped":
        pytest.skip(rec.note)
    assert rec.status == "ran", rec.line()


def test_every_script_the_pages_name_runs():
    run_by_blocks = {name for page in PAGES for block in read_page(ROOT, page)
                     for cmd in block.commands for name in SCRIPT_NAME.findall(cmd.text)}
    named = {(name, page) for page in PAGES
             for name in SCRIPT_NAME.findall((ROOT / page).read_text(encoding="utf-8"))}
    missing = sorted(f"{name} (named on {page})" for name, page in named
                     if name not in run_by_blocks | set(SCRIPTS) | set(COVERED))
    assert not missing, ("scripts the docs name that nothing here runs: give each a short mode "
                         "in SCRIPTS: " + ", ".join(missing))
    for name in SCRIPTS:
        assert (ROOT / name).is_file(), name
