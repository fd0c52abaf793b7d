"""End to end: every locustfile against the bundled server (``python -m spectest serve``).

The server is started once on a free loopback port with no flags (a newcomer's server); each
locustfile then runs headless for about 12 s at 2–3 users, sending every record as it is — its
whole prompt and its ``expected_output_tokens`` — so a record that does not fit the default
context would come back refused (400). Asserted per run: zero failures (so zero context
refusals), sane latencies, and acceptance
figures that equal the server's own ``/metrics`` counters — the sum over steps of the
per-step deltas in ``steps.csv`` equals the counter increase the test scrapes itself before and
after the run, and equals the sum of the per-response ``spec`` objects.
"""

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spectest.engine.api import model_context_length  # noqa: E402
from spectest.engine.loader import load_hf_tokenizer  # noqa: E402
from spectest.loadgen.datasets import load_dataset  # noqa: E402
from spectest.loadgen.runner import LocustRun, run_locust  # noqa: E402
from spectest.procs import free_port, python_env  # noqa: E402
from spectest.loadgen.scrape import ALL, SpecCounters, parse_metrics  # noqa: E402

START_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = python_env()
    proc = subprocess.Popen([sys.executable, "-m", "spectest", "serve", "--host", "127.0.0.1",
                             "--port", str(port)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output: deque[str] = deque(maxlen=200)
    reader = threading.Thread(target=output.extend, args=(proc.stdout,), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail("`python -m spectest serve` exited with code "
                            f"{proc.returncode}:\n" + "".join(output)[-3000:])
            if any(url in line for line in list(output)):
                try:
                    urllib.request.urlopen(url + "/health", timeout=2).read()
                    break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                pytest.fail(f"spectest serve did not answer /health within {START_TIMEOUT_S} s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)


def counters(url: str) -> dict[str, SpecCounters]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        snap = parse_metrics(r.read().decode())
    assert snap.source == "spectest", "the bundled server must expose spectest: counters"
    return snap.counters


SPEC_SLOTS = 9  # the default server's room for drafts: max(--k 4, --k-max 8) + 1


@pytest.mark.parametrize("workload", ["chat", "code", "rag"])
def test_every_bundled_record_fits_the_default_server(workload):
    """Every record, every turn: the chat-templated prompt (later turns with earlier answers of
    ``expected_output_tokens`` tokens each) + its output + the draft room fits the default
    server's context — the model's own, 4,096 positions for the embedded pair."""
    tok = load_hf_tokenizer(ROOT / "spectest" / "models" / "target")
    context = model_context_length("embedded")
    assert context >= 4096
    longest = 0
    for record in load_dataset(workload).records:
        messages = [dict(m) for m in record.messages or ()]
        grown = 0  # tokens of earlier answers, counted at their worst (full length)
        for turn in range(1 + len(record.turns)):
            prompt = len(tok.encode(record.prompt if record.prompt is not None else
                                    tok.apply_chat_template(messages)))
            need = prompt + grown + record.expected_output_tokens + SPEC_SLOTS
            assert need <= context, f"{record.id} turn {turn}: {need} > {context}"
            longest = max(longest, need)
            if turn < len(record.turns):
                grown += record.expected_output_tokens + 8  # the answer and its template
                messages.append({"role": "user", "content": record.turns[turn]})
    assert longest > 1024  # the old default context would have refused some


@pytest.mark.parametrize("workload", ["chat", "code", "rag", "mixed"])
def test_locustfile_against_the_bundled_server(server, tmp_path, workload):
    before = counters(server)
    out = tmp_path / "out"
    outcome = run_locust(LocustRun(workload, host=server, results_dir=out, steps=(2, 3),
                                   step_time_s=6, speculative="on", stop_timeout_s=90),
                         timeout_s=240)
    after = counters(server)
    assert outcome.returncode == 0, outcome.log_path.read_text()[-3000:]
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    df = pd.read_csv(outcome.steps_csv)
    assert rows and all(r["ok"] for r in rows) and df.failures.sum() == 0
    total = df[df.workload == ALL]
    assert list(total.users) == [2, 3]
    ok = total[total.requests > 0]
    assert (ok.ttft_p50_ms > 0).all() and (ok.ttft_p99_ms < 60_000).all()
    assert (ok.e2el_p50_ms >= ok.ttft_p50_ms).all()
    assert all(r["output_tokens"] >= 1 and r["spec"] is not None for r in rows)
    categories = {r["workload"] for r in rows}
    for key in categories | {ALL}:
        grown = after[key].since(before.get(key, SpecCounters()))
        part = df[df.workload == key]
        assert part.accepted_tokens.sum() == grown.accepted
        assert part.draft_tokens.sum() == grown.draft_tokens
        assert part.drafts.sum() == grown.drafts
        specs = [r["spec"] for r in rows if key in (ALL, r["workload"])]
        assert sum(s["accepted_tokens"] for s in specs) == grown.accepted
        assert sum(s["drafts"] for s in specs) == grown.drafts
