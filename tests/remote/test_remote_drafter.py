"""A drafter in another process: same output as co-located, the network term measured, and a
draft server that dies costs speed, never a request.

Real ``spectest serve-draft`` processes on loopback; the engine steps on the test's thread.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
import requests
from draft_servers import (MAX_LEN, SLOTS, draft_server, engine, free_port,
                           other_tokenizer_draft)

from spectest.remote.drafter import RemoteDraftError, RemoteDrafter

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Parser:\n    def __init__",
           "The quick brown fox", "for i in range(10):\n    print(", "# Read a file line by"]


def greedy(eng, n_tokens=40):
    reqs = [eng.request(p, max_tokens=n_tokens, temperature=0.0) for p in PROMPTS]
    return eng.generate_many(reqs)


def sampled(eng, n_tokens=32):
    reqs = [eng.request(p, max_tokens=n_tokens, temperature=0.8, top_k=40, top_p=0.95,
                        seed=100 + i) for i, p in enumerate(PROMPTS)]
    return eng.generate_many(reqs)


def test_greedy_output_is_the_target_only_output_and_the_co_located_drafts(pair, draft_url):
    remote, local, none = (greedy(engine(pair, kind, draft_url))
                           for kind in ("remote", "local", "none"))
    for r, l, n in zip(remote, local, none):
        assert r.token_ids == n.token_ids == l.token_ids  # 6 prompts, 4 slots: a real batch
        # the draft side ran the same model on the same tokens: the same drafts were accepted
        assert (r.stats.drafts, r.stats.accepted_tokens) == (l.stats.drafts,
                                                              l.stats.accepted_tokens)
    assert sum(r.stats.accepted_tokens for r in remote) > 0


def test_sampled_output_is_the_co_located_output_draw_for_draw(pair, draft_url):
    """Same seed, same uniforms, the exact draft distributions over the wire: same tokens."""
    remote, local = (sampled(engine(pair, kind, draft_url)) for kind in ("remote", "local"))
    for r, l in zip(remote, local):
        assert r.token_ids == l.token_ids
        assert r.stats.accepted_tokens == l.stats.accepted_tokens
    assert sum(r.stats.accepted_tokens for r in remote) > 0


def test_every_drafting_round_records_its_network_term(pair, draft_url):
    rounds = []
    eng = engine(pair, "remote", draft_url, observers=[rounds.append])
    greedy(eng, 24)
    drafting = [r for r in rounds if any(row.k_proposed for row in r.rows)]
    assert drafting and all(r.draft_error is None for r in rounds)
    assert all(0 < r.network_seconds <= r.draft_seconds for r in drafting)
    net = sorted(r.network_seconds for r in drafting)[len(drafting) // 2]
    assert net < 0.05  # loopback: well under a round's budget
    assert eng.engine.drafter.failures == 0


def test_a_draft_server_that_dies_and_returns_costs_drafts_not_requests(pair, tmp_path):
    port = free_port()
    rounds = []
    lock = threading.Lock()

    def record(r):
        with lock:
            rounds.append(r)

    first = draft_server(tmp_path / "first.log", port=port)
    url = first.__enter__()
    try:
        eng = engine(pair, "remote", url, observers=[record], timeout_s=2.0, retry_s=0.2,
                     max_retry_s=0.4)
        baseline = greedy(engine(pair, "none"), 160)

        def kill_after_drafting():
            while not any(r.network_seconds > 0 for r in list(rounds)):
                time.sleep(0.005)
            first.proc.send_signal(signal.SIGKILL)  # no goodbye: the socket just dies

        killer = threading.Thread(target=kill_after_drafting)
        killer.start()
        out = greedy(eng, 160)
        killer.join(10)
    finally:
        first.__exit__(None, None, None)
    # every request finished, with the target-only output, through the outage
    assert [o.token_ids for o in out] == [b.token_ids for b in baseline]
    assert all(o.finish_reason == "length" for o in out)
    failed = [r for r in rounds if r.draft_error is not None]
    assert failed and "draft server" in failed[0].draft_error
    assert eng.engine.drafter.failures == len(failed)
    # the draft server comes back on the same port: a new session, sequences re-admitted
    before = len(rounds)
    with draft_server(tmp_path / "second.log", port=port):
        time.sleep(0.5)  # past the retry delay
        again = greedy(eng, 40)
    assert [o.token_ids for o in again] == [b.token_ids[:40] for b in baseline]
    after = rounds[before:]
    assert any(r.network_seconds > 0 and r.draft_error is None for r in after)
    assert sum(o.stats.accepted_tokens for o in again) > 0


def test_a_draft_with_another_tokenizer_is_refused_at_start(pair, tmp_path):
    with draft_server(tmp_path / "other.log", draft=other_tokenizer_draft(tmp_path)) as url:
        drafter = RemoteDrafter(url, SLOTS, MAX_LEN)
        with pytest.raises(RemoteDraftError, match="tokenizer differs from the target's"):
            drafter.connect(pair[0].tokenizer.fingerprint)
        assert drafter.session is None  # nothing opened over there


def test_no_draft_server_is_one_readable_line(pair):
    drafter = RemoteDrafter(f"http://127.0.0.1:{free_port()}", SLOTS, MAX_LEN)
    with pytest.raises(RemoteDraftError, match="no draft server at .*connection refused"):
        drafter.connect(pair[0].tokenizer.fingerprint)


def test_the_draft_server_answers_bad_input_in_the_api_shape(draft_url):
    s = requests.post(f"{draft_url}/v1/draft/sessions", json={"n_slots": 2, "max_len": 64},
                      timeout=10).json()
    round_url = f"{draft_url}/v1/draft/sessions/{s['session']}/round"
    row = {"slot": 0, "append": [5], "k": 2, "greedy": True, "temperature": 0, "top_k": 0,
           "top_p": 1.0}
    cases = [
        (f"{draft_url}/v1/draft/sessions/nope/round", {"rows": []}, 404, "unknown draft session"),
        (round_url, {"rows": [row]}, 409, "no admitted sequence"),
        (round_url, {"rows": [], "surprise": 1}, 400, "unknown field"),
        (round_url, {"ops": [{"op": "admit", "slot": 9, "tokens": [1, 2]}]}, 400,
         "outside this session's 2 slots"),
        (round_url, {"ops": [{"op": "admit", "slot": 0, "tokens": [10 ** 9]}]}, 400,
         "outside the draft's vocabulary"),
        (round_url, {"ops": [{"op": "admit", "slot": 0, "tokens": list(range(1, 80))}]}, 400,
         "exceed the session's max_len 64"),
        (round_url, {"ops": [{"op": "admit", "slot": 0, "tokens": [1, 2]}],
                     "rows": [{**row, "greedy": False, "temperature": 0.7}]}, 400,
         "needs k=2 uniforms"),
        (f"{draft_url}/v1/draft/sessions", {"n_slots": 4096, "max_len": 1 << 20}, 400,
         "more than one session may hold"),
    ]
    for url, body, status, message in cases:
        r = requests.post(url, json=body, timeout=10)
        assert r.status_code == status, (body, r.text)
        assert message in r.json()["error"]["message"]
    r = requests.post(round_url, data=b"{not json", timeout=10)
    assert r.status_code == 400 and "error" in r.json()
    assert requests.get(f"{draft_url}/health", timeout=10).json() == {"status": "ok"}
    assert requests.delete(f"{draft_url}/v1/draft/sessions/{s['session']}",
                           timeout=10).status_code == 200
