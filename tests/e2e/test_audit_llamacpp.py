"""``spectest audit`` against llama.cpp's llama-server: a server without ``echo``.

The baseline scores the candidate's tokens by generating after each prefix (``scoring.py``);
the candidate reports no logprobs for tokens it accepted from a draft, and those positions are
counted, not compared; llama.cpp's own batch-shape noise is measured (the baseline against
itself) and the tolerances widen to it. Asserted: speculative vs plain llama-server passes all
three checks, with every route named in the report; two lossy candidates fail — llama.cpp's
synthetic-acceptance benchmarking mode, and a proxy that quietly lowers the temperature of
sampled requests (a sampling setting applied to only one side); and text prompts (for servers
that refuse token ids) still pass, with the re-tokenisation cost counted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import requests

from conftest import ROOT, draft_spec

from spectest.audit import scoring
from spectest.audit.client import Client, Endpoint, Routes
from spectest.audit.samples import PromptCase
from spectest.flavours import LLAMACPP
from spectest.thirdparty.llama_server import LlamaServer
from tests.proxies import TemperatureProxy

# One request at a time per server: llama-server batches the requests of its slots together and
# its logits depend on the batch's shape, so at concurrency > 1 a greedy near-tie can go either
# way depending on what else was in flight (seen once in CI: a 0.23-nat margin). What these
# tests claim is about speculation and about the auditor, so that noise is kept out.
SMALL = ["--num-prompts", "6", "--greedy-tokens", "24", "--samples-per-prompt", "4",
         "--sample-tokens", "16", "--prompts", "mixed", "--no-progress", "--concurrency", "1"]


def audit(out, candidate: str, baseline: str, *args: str):
    proc = subprocess.run([sys.executable, "-m", "spectest", "audit", "--candidate", candidate,
                           "--baseline", baseline, "--out", str(out), *SMALL, *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    return proc, report


def test_speculative_llama_server_passes_every_check_on_its_routes(llama_pair, tmp_path):
    spec_url, base_url = llama_pair
    proc, report = audit(tmp_path, spec_url, base_url)
    assert proc.returncode == 0, (tmp_path / "summary.md").read_text()
    assert {c["status"] for c in report["checks"].values()} == {"pass"}
    assert report["endpoints"]["candidate"]["server"] == "llama.cpp"
    assert "generation after each prefix" in report["endpoints"]["baseline"]["routes"]["scoring"]
    assert set(report["routes"]) == {"greedy", "logprobs", "distribution"}
    spec = report["candidate_speculation"]["greedy"]
    assert spec["draft_tokens"] > 0 and spec["drafts"] is None
    # tokens taken from drafts carry no logprobs in llama.cpp: counted, never read as p = 1
    assert report["coverage"]["candidate_unreported"] > 0
    assert report["noise_floor"]["positions"] > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "noise floor" in summary and "route:" in summary


# chat traffic as the background: mixed records' 2k-token RAG prompts take SmolLM2 on two cores
# tens of seconds each to prefill
FULL = ["--profile", "full", "--load-prompts", "2", "--load-concurrency", "2",
        "--load-workload", "chat", "--prefix-prompts", "3", "--prefix-tokens", "200",
        "--long-tokens", "280", "--long-prompts", "1", "--long-prompt-tokens", "400",
        "--turns", "2", "--params-prompts", "2", "--params-samples", "3", "--params-tokens", "12",
        "--preemption-requests", "2", "--preemption-tokens", "16"]


def test_speculative_llama_server_passes_every_condition_of_the_full_profile(llama_pair,
                                                                             tmp_path):
    """Nothing fails; what llama.cpp has no means for is said, not passed: it exposes no
    preemption counter, and prompt logprobs need echo."""
    spec_url, base_url = llama_pair
    proc, report = audit(tmp_path, spec_url, base_url, *FULL)
    assert proc.returncode == 0, (tmp_path / "summary.md").read_text()
    statuses = {c["name"]: c["status"] for c in report["conditions"]}
    assert statuses["preemption"] in ("not run", "not reached")
    assert "preemption counter" in next(c["reason"] for c in report["conditions"]
                                        if c["name"] == "preemption")
    assert all(statuses[c] == "pass" for c in ("load", "prefix-reuse", "long", "params"))
    load = next(c for c in report["conditions"] if c["name"] == "load")
    assert "background requests of chat" in load["evidence"][0], load
    params = next(c for c in report["conditions"] if c["name"] == "params")
    assert any(c["check"] == "prompt logprobs" and c["status"] == "not run"
               for c in params["checks"])


def test_synthetic_acceptance_mode_is_caught(llama_pair, smollm2_gguf, tmp_path):
    """--spec-synth-rates accepts drafts with fixed per-position odds whatever the target says:
    llama.cpp itself declares the output invalid. The audit must not pass it."""
    _, base_url = llama_pair
    lossy = draft_spec(smollm2_gguf, synth_rates=(0.9, 0.7, 0.5, 0.3))
    with LlamaServer(lossy, tmp_path / "synth.log") as synth_url:
        proc, report = audit(tmp_path / "out", synth_url, base_url, "--checks", "distribution")
    assert proc.returncode == 1, (tmp_path / "out" / "summary.md").read_text()
    assert report["checks"]["distribution"]["status"] == "fail"


def test_a_proxy_that_lowers_the_temperature_is_caught(llama_pair, tmp_path):
    spec_url, base_url = llama_pair
    with TemperatureProxy(spec_url, factor=0.6) as lossy:
        proc, report = audit(tmp_path, lossy, base_url, "--candidate-flavour", "llamacpp",
                             "--checks", "distribution")
    assert proc.returncode == 1, (tmp_path / "summary.md").read_text()
    dist = report["checks"]["distribution"]
    assert dist["status"] == "fail" and dist["test"]["z"] > 0  # sharper than asked


def test_text_prompts_still_audit_and_count_the_retokenisation(llama_pair, tmp_path):
    spec_url, base_url = llama_pair
    proc, report = audit(tmp_path, spec_url, base_url, "--prompt-format", "text",
                         "--checks", "greedy")
    assert proc.returncode == 0, (tmp_path / "summary.md").read_text()
    for role in ("candidate", "baseline"):
        assert report["endpoints"][role]["routes"]["prompts"].startswith("text")
    assert "re-tokenised" in report["routes"]["greedy"]


# A bundled RAG prompt plus a sampled continuation (token ids), after which SmolLM2's greedy
# next token is one byte of a multi-byte character. llama.cpp withholds a token's logprobs until
# its text is whole UTF-8, so a one-token generation there reports none — the default audit
# stopped on it ("the baseline (scoring) returned no logprobs").
PARTIAL_UTF8_PREFIX = [
    4093, 42, 19842, 260, 1962, 1015, 805, 260, 14471, 30, 3069, 1520, 28, 2229, 327, 2229, 28,
    897, 6330, 346, 6654, 335, 28, 965, 1928, 253, 1890, 2988, 30, 198, 198, 17911, 969, 42,
    198, 198, 75, 33, 77, 27069, 974, 39185, 198, 1393, 954, 974, 39185, 27145, 314, 253, 2582,
    10916, 2004, 4368, 3251, 281, 216, 34, 32, 32, 40, 411, 13440, 23607, 422, 2296, 30, 31501,
    318, 1478, 288, 8180, 1528, 334, 363, 280, 28, 357, 4112, 20567, 4936, 715, 347, 659, 30,
    20314, 28, 28241, 279, 28, 14088, 8100, 28, 7473, 340, 683, 94, 28, 12355, 1057, 15751, 28,
    530, 568, 34700, 28, 3692, 40966, 2273, 28, 718, 568, 1268, 2280, 29, 103, 568, 28, 17006,
    2746, 28, 43812, 23025, 28, 907, 55, 419, 28, 9793, 514, 28, 13300, 305, 1141, 284, 5816,
    516, 1268, 29, 103, 2509, 30, 533, 4745, 216, 34, 32, 33, 35, 28, 357, 2163, 354, 4791,
    35273, 4368, 282, 16887, 2680, 39185, 30, 198, 198, 75, 34, 77, 19414, 4173, 198, 58, 341,
    4173, 365, 59, 30306, 1462, 42, 4173, 530, 2296, 29, 1425, 300, 28, 36794, 336, 42, 25947,
    125, 239, 183, 248, 234, 118, 28, 4931, 42, 216, 112, 111, 227, 248, 234, 114, 121, 28,
    4097, 42, 216, 28589,
]


def test_scoring_survives_a_token_that_ends_inside_a_character(llama_pair):
    """After this prefix SmolLM2's greedy token is one byte of a multi-byte character.
    llama.cpp reports one logprobs entry for the whole character, with the figures of the
    token that completed it — not of the first position — so nothing it reports can be tied
    to that position: the auditor leaves it out (counted) instead of misreading it, and
    scoring a continuation through it goes on past it."""
    _, base_url = llama_pair
    body = {"model": "smollm2", "prompt": PARTIAL_UTF8_PREFIX, "max_tokens": 1,
            "temperature": 0, "logprobs": 20, "ignore_eos": True}
    plain = requests.post(base_url + "/v1/completions", json=body, timeout=120).json()
    if plain["choices"][0]["logprobs"]:
        pytest.skip("on this build the greedy token after the prefix is whole UTF-8; the "
                    "case under test does not arise")
    case = PromptCase("utf8", "rag", tuple(PARTIAL_UTF8_PREFIX))

    async def generate():
        async with Client(Endpoint("baseline", base_url, "smollm2")) as client:
            client.routes = Routes(LLAMACPP, echo=False)
            one = await scoring._generate(client, PARTIAL_UTF8_PREFIX, 1, 20)
            run = await client.complete(PARTIAL_UTF8_PREFIX, max_tokens=8, temperature=0,
                                        logprobs=20)
            # any continuation: the scoring walks past the positions it cannot read
            scored = await scoring.score(client, case, (216, 28, 4097, 42), 20, chunk=4)
        return one, run, scored

    (comp, n_prompt), run, scored = asyncio.run(generate())
    assert n_prompt == len(PARTIAL_UTF8_PREFIX)
    assert not comp.positions and comp.left_out >= 1
    assert run.left_out > 0 and len(run.tokens) + run.left_out == 8
    assert len(scored) == len(PARTIAL_UTF8_PREFIX) + 4


def test_requests_in_flight_are_capped_at_the_servers_slots(llama_pair):
    """llama-server runs ``-np`` requests at once (2 here); the auditor reads that from /props
    and sends no more, so queueing there never counts against its per-request timeout."""
    spec_url, _ = llama_pair

    async def fit(routes):
        async with Client(Endpoint("candidate", spec_url, "smollm2"), concurrency=8) as client:
            client.routes = routes
            return await client.fit_to_server(), client.concurrency

    assert asyncio.run(fit(Routes(LLAMACPP, echo=False))) == (2, 2)
    assert asyncio.run(fit(Routes(None))) == (None, 8)  # no way to ask: left as configured


def test_a_truncated_prompt_ends_where_a_character_ends(llama_pair):
    """The audit cuts long prompts to --max-prompt-tokens. Cutting the token ids of this RAG
    record at 192 ends inside a Korean character; cutting its text keeps whole characters, so
    the model's first token never finishes a character the prompt began."""
    from tokenizers import Tokenizer

    from spectest.audit.prompts import load_records, render, tokenize
    _, base_url = llama_pair
    local = Tokenizer.from_file(str(ROOT / "spectest" / "models" / "smollm2-draft" /
                                    "tokenizer.json"))
    record = next(r for r in load_records("mixed", 32, 0) if r.id.startswith("hotpot-5abafb6d"))

    async def cut():
        async with Client(Endpoint("baseline", base_url, "smollm2")) as client:
            client.routes = Routes(LLAMACPP, echo=False, tokenize="endpoint")
            whole = await scoring.tokenize(client, render(record)[:4 * 192])
            (case,) = await tokenize([record], client, 192)
            return whole, case.ids

    whole, ids = asyncio.run(cut())
    assert "\ufffd" in local.decode(whole[:192][-3:])  # the naive cut: inside a character
    assert 150 <= len(ids) <= 192 and "\ufffd" not in local.decode(list(ids))


def test_one_forced_request_scores_a_continuation_as_one_request_per_prefix_does(llama_pair):
    """llama.cpp has no echo. The baseline scores a sampled continuation by generating it
    greedily under a grammar that allows only its text: one request reports the distribution
    at every position (read before the samplers), the same figures as asking after each
    prefix, in a fraction of the requests."""
    spec_url, base_url = llama_pair
    from spectest.audit.prompts import load_records, tokenize

    async def both():
        async with Client(Endpoint("candidate", spec_url, "smollm2"), 2) as cand, \
                Client(Endpoint("baseline", base_url, "smollm2"), 2) as base:
            for c in (cand, base):
                listed = await c.models()
                await c.resolve_model(listed)
                await scoring.probe(c, listed)
            cases = await tokenize(load_records("mixed", 4, 3), base, 192)
            out = []
            for i, case in enumerate(cases):
                comp = await cand.complete(scoring.prompt_for(cand, case), max_tokens=24,
                                           temperature=0.5, top_p=0.95, top_k=20, seed=i,
                                           logprobs=20)
                before = base.requests
                forced = await scoring.score(base, case, comp.tokens, 20, chunk=4,
                                             pieces=comp.pieces)
                forced_requests = base.requests - before
                base.routes = replace(base.routes, flavour=replace(LLAMACPP,
                                                                   forced_text_field=""))
                before = base.requests
                stepwise = await scoring.score(base, case, comp.tokens, 20, chunk=4,
                                               pieces=comp.pieces)
                out.append((forced, stepwise, forced_requests, base.requests - before))
                base.routes = replace(base.routes, flavour=LLAMACPP)
            return out

    results = asyncio.run(both())
    gaps = []
    for forced, stepwise, _, _ in results:
        for a, b in zip(forced, stepwise):
            assert (a is None) == (b is None)
            if a is not None:  # the same position; llama.cpp's readings of a prefix move by
                assert a.token == b.token  # tenths of a nat with its cache state, no more
                if a.logprob > float("-inf") and b.logprob > float("-inf"):
                    gaps.append(abs(a.logprob - b.logprob))
    assert len(gaps) >= 60 and max(gaps) < 0.5 and sum(gaps) / len(gaps) < 0.05
    assert sum(r[2] for r in results) * 2 <= sum(r[3] for r in results)


def test_the_noise_floor_reads_prefixes_in_verification_shaped_batches(llama_pair):
    """Where speculation puts a position — the last of a few tokens verified in one batch on a
    cached prefix — the baseline reads it too (``noise.verify_shaped``), one cache slot per
    request pair, and the floor counts those readings."""
    from spectest.audit import noise
    from spectest.audit.prompts import load_records, tokenize
    _, base_url = llama_pair

    async def shaped():
        async with Client(Endpoint("baseline", base_url, "smollm2"), 2) as base:
            listed = await base.models()
            await base.resolve_model(listed)
            await scoring.probe(base, listed)
            await base.fit_to_server()
            cases = await tokenize(load_records("mixed", 6, 2), base, 192)
            runs = await asyncio.gather(*(base.complete(c.ids, max_tokens=32, temperature=0,
                                                        logprobs=20, fresh=True)
                                          for c in cases))
            return await noise.measure(base, cases, runs, 20, 0.01)

    floor = asyncio.run(shaped())
    assert floor.shaped_positions >= 6 and floor.positions > floor.shaped_positions
    assert floor.shaped_max_kl < 0.1  # numeric noise, not a misread position
    assert "verification-shaped" in floor.summary()
