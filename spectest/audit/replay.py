"""``spectest replay``: send a saved finding's requests again, to both servers, and show it.

Owns: reading reproducer files (``reproducer``; a bad one is one readable line), replaying
each — its ``steps`` to the candidate first (a cold request that fills the prefix cache), its
``background`` traffic alongside (the load condition's), then the request to both servers —
and printing what an upstream bug report needs:

* greedy / logprobs: the first generated position where the two servers differ, with both
  tokens (ids, and text where the server detokenizes) and each token's probability on each
  server, and the text they shared before it;
* text (``stop``): both texts' ends and finish reasons;
* serving: the candidate's error beside the baseline's answer;
* distribution: the seeded sampled requests again on both servers; the candidate's tokens
  judged as the audit judged them (the baseline scores them; against the baseline's own
  samples where the audit compared with those), and Model Equality Testing's MMD test
  (``mmd``) on the two sets of completions beside it.

A baseline request is sent fresh: its ``cache_salt`` is a new one (it was fresh when the
audit sent it). The candidate's steps and request keep sharing one salt, but a new one: the
server may still hold what the audit's later requests cached under the old one, and a hit that
reaches further than the audit's did restores other positions than the ones it found wrong.

Each file is REPRODUCED (exit 1 if any is), NOT REPRODUCED (exit 0) or COULD NOT RUN (exit 2).
``--candidate`` / ``--baseline`` point a file at other servers (their first model is used
where the recorded one is not served).

Does not know: how the audit found it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spectest.audit import collect, distribution_check, logprobs, mmd, scoring
from spectest.audit.client import Client, Endpoint, first_choice
from spectest.audit.distribution import SamplingSpec
from spectest.audit.failures import answers
from spectest.audit.samples import (AuditError, Completion, PromptCase, ServerFailure,
                                    parse_logprobs)

REPRODUCED, NOT_REPRODUCED, COULD_NOT_RUN = 1, 0, 2
ALPHA = 0.01  # a replayed sampled finding reproduces when its test fails at this level
SUPPORT_TOLERANCE = 1e-4
BACKGROUND_SECONDS = 90  # how long a death on background traffic is given to come again
KINDS = ("greedy", "logprobs", "text", "serving", "distribution")


@dataclass(frozen=True)
class Replayed:
    status: int  # REPRODUCED | NOT_REPRODUCED | COULD_NOT_RUN
    lines: tuple[str, ...]


def load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AuditError(f"{path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise AuditError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict) or doc.get("spectest_reproducer") != 1:
        raise AuditError(f"{path}: not a spectest reproducer (no \"spectest_reproducer\": 1)")
    if doc.get("check") not in KINDS:
        raise AuditError(f"{path}: unknown check {doc.get('check')!r} (one of "
                         f"{', '.join(KINDS)})")
    for role in ("candidate", "baseline"):
        if not isinstance(doc.get(role), dict) or not doc[role].get("url"):
            raise AuditError(f"{path}: no {role} URL")
    return doc


async def replay(doc: dict, urls: Mapping[str, str | None], api_key: str | None,
                 timeout: float) -> Replayed:
    doc = fresh_namespace(doc)
    eps = {role: Endpoint(role, urls.get(role) or doc[role]["url"], None, {}, api_key)
           for role in ("candidate", "baseline")}
    async with Client(eps["candidate"], 64, timeout) as cand, \
            Client(eps["baseline"], 64, timeout) as base:
        models, listed = {}, {}
        for client in (cand, base):
            listed[client.role] = await client.models()
            ids = [m.get("id") for m in listed[client.role]]
            recorded = (doc[client.role] or {}).get("model")
            models[client.role] = recorded if recorded in ids else (ids[0] if ids else recorded)
            client.model = models[client.role]
        probe_ids = await scoring.probe(base, listed["baseline"])
        await scoring.probe(cand, listed["candidate"], probe_ids=probe_ids)
        for step in doc.get("steps") or ():
            await cand.call("POST", step["path"], _for(step["body"], models["candidate"]))
        background = doc.get("background")
        task = None
        if background and background.get("bodies"):
            task = asyncio.ensure_future(_background(cand, background, models["candidate"]))
            await asyncio.sleep(2.0)  # let the batches fill before the request goes
        try:
            return await _KIND[doc["check"]](doc, cand, base, models)
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


def fresh_namespace(doc: dict) -> dict:
    """``doc`` with each ``cache_salt`` the candidate's requests carried (steps, request,
    background) replaced by a new one, the same new one wherever the old one stood."""
    new: dict[str, str] = {}

    def renamed(body):
        if not isinstance(body, dict) or not isinstance(body.get("cache_salt"), str):
            return body
        return {**body, "cache_salt": new.setdefault(body["cache_salt"], uuid.uuid4().hex)}
    out = dict(doc)
    out["steps"] = [{**step, "body": renamed(step.get("body"))} for step in doc.get("steps")
                    or ()]
    if isinstance(doc.get("request"), dict):
        out["request"] = {**doc["request"], "candidate": renamed(doc["request"].get("candidate"))}
    if isinstance(doc.get("background"), dict) and doc["background"].get("bodies"):
        out["background"] = {**doc["background"],
                             "bodies": [renamed(b) for b in doc["background"]["bodies"]]}
    return out


def _for(body: Mapping | None, model: str | None) -> dict:
    out = dict(body or {})
    if model:
        out["model"] = model
    return out


async def _background(client: Client, recipe: Mapping, model: str) -> None:
    bodies = [_for(b, model) for b in recipe["bodies"]]

    async def worker(start: int) -> None:
        i = start
        while True:
            try:
                await client.call("POST", "/v1/completions", bodies[i % len(bodies)])
            except AuditError:
                pass
            i += recipe.get("concurrency", 1)
    await asyncio.gather(*(worker(k) for k in range(recipe.get("concurrency", 1))))


def _baseline_body(doc: dict) -> dict:
    """The baseline's request — recorded, or the candidate's with the baseline's own fields —
    sent fresh (a new ``cache_salt``, where it had one)."""
    request = doc["request"]
    body = dict(request.get("baseline") or {})
    if not body:
        body = {k: v for k, v in request["candidate"].items()
                if k not in (doc["candidate"].get("extra") or {})}
        body.update(doc["baseline"].get("extra") or {})
    if "cache_salt" in body:
        body["cache_salt"] = uuid.uuid4().hex
    return body


async def _greedy(doc, cand: Client, base: Client, models) -> Replayed:
    path = doc["request"]["path"]
    c_body = _for(doc["request"]["candidate"], models["candidate"])
    b_body = _for(_baseline_body(doc), models["baseline"])
    want = int(c_body.get("logprobs") or 0)
    c_data, b_data = await asyncio.gather(cand.call("POST", path, c_body),
                                          base.call("POST", path, b_body))
    c_pos = parse_logprobs(first_choice(c_data, "candidate").get("logprobs"), "the candidate",
                           want)
    b_pos = parse_logprobs(first_choice(b_data, "baseline").get("logprobs"), "the baseline",
                           want)
    head = [f"{doc['finding']}"]
    j = next((i for i, (c, b) in enumerate(zip(c_pos, b_pos)) if c.token != b.token), None)
    if doc["check"] == "logprobs":  # where the distributions part, before any token does
        j = _worst_kl(c_pos[:j], b_pos[:j]) if j is not None else _worst_kl(c_pos, b_pos)
        if j is not None:
            head.append(f"their distributions part most at generated position {j + 1}: "
                        f"KL {_kl(c_pos[j], b_pos[j]):.3g} nats")
    if j is None:
        return Replayed(NOT_REPRODUCED, (*head, f"both servers returned the same "
                                          f"{len(c_pos)} tokens"))
    c, b = c_pos[j], b_pos[j]
    texts = await _texts(base, models["baseline"], [c.token, b.token] + [p.token for p in
                                                                        c_pos[max(0, j - 12):j]])
    lines = [*head, f"first difference at generated position {j + 1} (after "
                    f"{_prompt_len(c_body)} prompt tokens); the text before it ends "
                    f"{texts.get('tail', '')!r}"]
    for who, token in (("candidate", c.token), ("baseline", b.token)):
        lines.append(f"  {who:9} token {token:>6} {texts.get(token, '')!r:14} "
                     f"p = {_p(c, token)} on the candidate, {_p(b, token)} on the baseline")
    return Replayed(REPRODUCED, tuple(lines))


def _kl(c, b) -> float:
    return logprobs.shared_kl(b, c)


def _worst_kl(c_pos, b_pos) -> int | None:
    """The position (of a shared prefix) where the candidate's distribution leaves the
    baseline's most, by the audit's KL on their reported top tokens."""
    gaps = [(_kl(c, b), i) for i, (c, b) in enumerate(zip(c_pos, b_pos)) if c.top]
    if not gaps or max(gaps)[0] < 1e-3:
        return None
    return max(gaps)[1]


def _p(pos, token: int) -> str:
    lp = pos.logprob_of(token)
    if lp is None:
        floor = pos.top[-1][1] if pos.top else None
        return f"< {math.exp(floor):.3g} (not in its top {len(pos.top)})" if floor else "?"
    return f"{math.exp(lp):.3g}"


def _prompt_len(body: Mapping) -> str:
    prompt = body.get("prompt")
    return str(len(prompt)) if isinstance(prompt, list) else "the text prompt's"


async def _texts(client: Client, model: str, tokens: list[int]) -> dict:
    """Token id → its text, and ``tail``: the text of the tokens after the first two, where the
    server detokenizes (its flavour's ``detokenize_path``)."""
    flavour = client.routes.flavour
    path = flavour.detokenize_path if flavour and flavour.detokenize_path else "/detokenize"
    out = {}

    async def text(ids):
        try:
            data = await client.call("POST", path, {"model": model, "tokens": ids},
                                     quiet_status=(400, 404, 405, 422))
        except AuditError:
            return None
        return data.get("prompt", data.get("content")) if "_status" not in data else None

    for token in tokens[:2]:
        got = await text([token])
        if got is not None:
            out[token] = got
    tail = await text(tokens[2:]) if tokens[2:] else ""
    if tail is not None:
        out["tail"] = tail[-60:]
    return out


async def _text(doc, cand: Client, base: Client, models) -> Replayed:
    path = doc["request"]["path"]
    c_data, b_data = await asyncio.gather(
        cand.call("POST", path, _for(doc["request"]["candidate"], models["candidate"])),
        base.call("POST", path, _for(_baseline_body(doc), models["baseline"])))
    c, b = first_choice(c_data, "candidate"), first_choice(b_data, "baseline")
    same = c.get("text") == b.get("text") and c.get("finish_reason") == b.get("finish_reason")
    lines = (doc["finding"], f"  candidate ends {str(c.get('text'))[-60:]!r} "
                             f"({c.get('finish_reason')})",
             f"  baseline  ends {str(b.get('text'))[-60:]!r} ({b.get('finish_reason')})")
    return Replayed(NOT_REPRODUCED if same else REPRODUCED, lines)


async def _serving(doc, cand: Client, base: Client, models) -> Replayed:
    path, body = doc["request"]["path"], doc["request"]["candidate"]
    if body is None and doc.get("background"):  # it died on the traffic itself
        deadline = time.monotonic() + BACKGROUND_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(2.0)
            if not await answers(cand):
                return Replayed(REPRODUCED, (doc["finding"], "  the candidate stopped "
                                             "answering while it served the traffic again"))
        return Replayed(NOT_REPRODUCED, (doc["finding"], f"  the candidate served the "
                                         f"traffic for {BACKGROUND_SECONDS} s"))
    if body is None:
        return Replayed(COULD_NOT_RUN, (doc["finding"], "the failed request was not recorded"))
    try:
        await cand.call("POST", path, _for(body, models["candidate"]))
    except ServerFailure as exc:
        await base.call("POST", path, _for(_baseline_body(doc), models["baseline"]))
        return Replayed(REPRODUCED, (doc["finding"], f"  candidate: {exc}",
                                     "  baseline: served it (HTTP 200)"))
    return Replayed(NOT_REPRODUCED, (doc["finding"], "the candidate served it this time"))


async def _distribution(doc, cand: Client, base: Client, models) -> Replayed:
    requests = doc["requests"]
    c_bodies = [_for(b, models["candidate"]) for b in requests["candidate"]]
    b_bodies = [_for(b, models["baseline"]) for b in requests.get("baseline") or ()]
    first = c_bodies[0]
    spec = SamplingSpec(first.get("temperature", 1.0), first.get("top_p", 1.0),
                        max(0, first.get("top_k", 0) or 0),
                        cand.routes.flavour.sampling_order if cand.routes.flavour
                        else "temperature-first")
    if not all(isinstance(b.get("prompt"), list) for b in c_bodies + b_bodies):
        raise AuditError("its sampled requests have text prompts: only token-id prompts can "
                         "be scored again")
    cases: dict[str, PromptCase] = {}

    async def arm(client: Client, bodies) -> list:
        answers = await asyncio.gather(*(client.call("POST", requests["path"], b)
                                         for b in bodies))
        triples = []
        for k, (body, data) in enumerate(zip(bodies, answers)):
            key = json.dumps(body["prompt"])
            case = cases.setdefault(key, PromptCase(f"prompt-{len(cases)}", "replay",
                                                    tuple(body["prompt"])))
            lp = first_choice(data, client.role).get("logprobs")
            positions = parse_logprobs(lp, f"the {client.role}", int(body.get("logprobs") or 0))
            comp = Completion(tuple(p.token for p in positions), positions)
            scored = await scoring.score(base, case, comp.tokens, int(body.get("logprobs") or 20),
                                         chunk=collect.SAMPLED_CHUNK)
            triples.append((list(cases).index(key), k, comp, scored))
        return triples

    ours = await arm(cand, c_bodies)
    theirs = await arm(base, b_bodies) if b_bodies else None
    ordered = list(cases.values())
    items = collect.sampled_items(ordered, ours, {})
    control = None if theirs is None else collect.sampled_items(ordered, theirs, {})
    result = distribution_check.check(items, spec, ALPHA, len(ordered), 0,
                                      SUPPORT_TOLERANCE, control=control)
    lines = [doc["finding"], f"  {len(c_bodies)} sampled requests again: {result.reason()}"]
    if theirs is not None:
        length = max(len(c.tokens) for _, _, c, _ in ours + theirs)
        test = mmd.test([(i, c.tokens) for i, _, c, _ in ours],
                        [(i, c.tokens) for i, _, c, _ in theirs], length)
        lines.append(f"  Model Equality Testing's MMD on the same completions: {test.reason()}")
    return Replayed(NOT_REPRODUCED if result.passed else REPRODUCED, tuple(lines))


_KIND = {"greedy": _greedy, "logprobs": _greedy, "text": _text, "serving": _serving,
         "distribution": _distribution}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Replay findings saved by `spectest audit` (its --out folder's "
                     "reproducers/*.json) against both servers and print the first diverging "
                     "position with both tokens and their probabilities. Exit 1 if a finding "
                     "reproduced, 0 if none did, 2 if a file could not be replayed.")
    p.add_argument("files", nargs="+", type=Path, help="reproducer JSON files")
    p.add_argument("--candidate", default=None, help="candidate URL (default: the file's)")
    p.add_argument("--baseline", default=None, help="baseline URL (default: the file's)")
    p.add_argument("--api-key", default=None, help="Bearer key sent to both servers")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")


def main(args: argparse.Namespace) -> int:
    worst = NOT_REPRODUCED
    for path in args.files:
        try:
            doc = load(path)
            done = asyncio.run(replay(doc, {"candidate": args.candidate,
                                            "baseline": args.baseline},
                                      args.api_key, args.timeout))
        except AuditError as exc:
            done = Replayed(COULD_NOT_RUN, (str(exc),))
        word = {REPRODUCED: "REPRODUCED", NOT_REPRODUCED: "NOT REPRODUCED",
                COULD_NOT_RUN: "COULD NOT RUN"}[done.status]
        print(f"{path.name}: {word}")
        for line in done.lines:
            print(f"  {line}")
        if done.status == COULD_NOT_RUN:
            print(f"spectest replay: {path}: {done.lines[0]}", file=sys.stderr)
            worst = COULD_NOT_RUN
        elif done.status == REPRODUCED and worst != COULD_NOT_RUN:
            worst = REPRODUCED
    return worst
