"""How the auditor reads a server: its routes, prompt tokenization, and scoring a continuation.

Owns: probing a server once — its flavour (``/v1/models`` ``owned_by``, then the names on
``/metrics``; ``--*-flavour`` overrides), whether it takes token-id prompts, whether echo
scoring works — and the two ways to *score* a continuation, i.e. get the server's top-n
distribution at every generated position of a token sequence:

* **echo** — one request, ``echo`` + ``logprobs`` over prompt + continuation (vLLM, SGLang,
  spectest). One forward; reports the continuation's own logprob even outside the top-n.
* **generation** — for servers that refuse or ignore ``echo`` (llama.cpp). The server
  generates greedily after a prefix with top-n logprobs: its first position is its
  distribution at that prefix, and each later one is too for as long as its own token equals
  the continuation's; the next request starts after the first mismatch. A greedy
  continuation usually costs one request — none when the server's own greedy run (``known``)
  already agrees — and sampled tokens about 1 / (1 − p_top1) positions per request; prompt
  caching (llama.cpp's ``cache_prompt``, vLLM's prefix cache) makes each request cost its new
  tokens only. A token outside the reported top-n gets logprob −inf: under top-k sampling
  with k ≤ n a correct server never emits one.

Prompts go to a server as token ids when it takes them (both sides then see the same tokens
whatever their front-ends). A server that refuses them gets text: the prompt's text, and for a
scoring prefix the prompt's text plus the continuation's tokens as bytes. The server then
*re-tokenises*: where its tokenization of a prefix does not have exactly the expected number of
tokens (a merge across the boundary), the position is not scored and is counted, so the report
says how much re-tokenisation cost.

Does not know: the checks, or report files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from spectest import flavours
from spectest.audit.client import Client, Routes, first_choice
from spectest.audit.samples import (
    AuditError,
    Completion,
    Position,
    PromptCase,
    parse_logprobs,
    parse_token,
    whole_tokens,
)

PROBE_TEXT = "The capital of France is Paris. The capital of Italy is"
SCORING_ROUTES = ("auto", "echo", "generation")
PROMPT_FORMATS = ("auto", "token-ids", "text")


async def detect_flavour(client: Client, listed: list[dict]) -> flavours.Flavour | None:
    if client.endpoint.flavour:
        return flavours.get(client.endpoint.flavour)
    owners = {m.get("owned_by") for m in listed}
    for f in flavours.FLAVOURS:
        if f.key in owners:
            return f
    text = await client.get_text("/metrics")
    if not text:
        return None
    try:
        names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    except ValueError:
        return None
    return flavours.detect(names)


async def probe(client: Client, listed: list[dict], scoring: str = "auto",
                prompt_format: str = "auto", probe_ids: list[int] | None = None) -> list[int]:
    """Decide (and verify) how to talk to ``client``'s server; sets ``client.routes``.

    Returns the probe text's token ids (this server's, or ``probe_ids`` when given: the
    candidate is probed with the baseline's ids, since the baseline tokenizes prompts)."""
    flavour = await detect_flavour(client, listed)
    client.routes = Routes(flavour)
    echo_ok, why = False, ""
    if scoring != "generation" and (flavour is None or flavour.echo_scoring):
        echo_ok, why = await _echo_works(client)
    elif scoring == "generation":
        why = "--scoring generation"
    else:
        why = f"{flavour.display} does not support echo (it refuses or ignores the field)"
    if scoring == "echo" and not echo_ok:
        raise AuditError(f"{client.where} cannot score by echo ({why}); use --scoring auto")
    client.routes = replace(client.routes, echo=echo_ok, echo_refusal=why,
                            tokenize="echo" if echo_ok else "endpoint")
    ids = probe_ids
    if ids is None:
        try:
            ids = await tokenize(client, PROBE_TEXT)
        except AuditError as exc:
            raise AuditError(f"{client.where} gives no way to turn prompts into token ids: "
                             f"{why or 'echo not tried'}; and {exc}") from None
    refused = "--prompt-format text" if prompt_format == "text" else ""
    if not refused:
        answer = await client.call("POST", "/v1/completions", client.body(
            ids, max_tokens=1, temperature=0, logprobs=1), quiet_status=(400, 422))
        if "_status" in answer:
            refused = answer["_message"]
            if prompt_format == "token-ids":
                raise AuditError(f"{client.where} refuses token-id prompts: {refused}")
        else:
            parse_logprobs(first_choice(answer, client.role).get("logprobs"),
                           f"the {client.role}", 1)
    client.routes = replace(client.routes, token_ids=not refused, token_id_refusal=refused)
    if refused:  # text prompts: their generations must still name token ids
        answer = await client.call("POST", "/v1/completions", client.body(
            PROBE_TEXT, max_tokens=1, temperature=0, logprobs=1))
        parse_logprobs(first_choice(answer, client.role).get("logprobs"),
                       f"the {client.role} (it refuses token-id prompts: {refused})", 1)
    return ids


async def _echo_works(client: Client) -> tuple[bool, str]:
    """Does echo + logprobs return the prompt's own tokens? (llama.cpp ignores ``echo``.)"""
    body = client.body(PROBE_TEXT, max_tokens=1, echo=True, logprobs=1, temperature=0)
    data = await client.call("POST", "/v1/completions", body, quiet_status=(400, 422))
    if "_status" in data:
        return False, f"echo refused: {data['_message']}"
    lp = first_choice(data, client.role).get("logprobs")
    n_prompt = (data.get("usage") or {}).get("prompt_tokens")
    tokens = lp.get("tokens") if isinstance(lp, dict) else None
    if not tokens or not n_prompt or len(tokens) < n_prompt:
        return False, ("echo ignored: the response holds the generated token only, not the "
                       "prompt's")
    return True, ""


async def tokenize(client: Client, text: str) -> list[int]:
    """Token ids of ``text`` as this server tokenizes a text prompt."""
    if client.routes.tokenize == "echo":
        lp, n_prompt = await client.echo(text, 0)
        if not isinstance(lp, dict) or not lp.get("tokens"):
            raise AuditError(f"{client.where} returned no tokens for an echo request")
        tokens = [parse_token(t, f"the {client.role}") for t in lp["tokens"]]
        return tokens[:n_prompt] if n_prompt else tokens
    flavour = client.routes.flavour
    path = flavour.tokenize_path if flavour and flavour.tokenize_path else "/tokenize"
    data = await client.call("POST", path, flavours.tokenize_request(flavour, text, client.model))
    # (a 404 here means no tokenize endpoint: the AuditError names the path and status)
    tokens = data.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise AuditError(f"{client.where} answered {path} without a token list; the auditor "
                         f"needs echo or a /tokenize endpoint to turn prompts into token ids")
    return tokens


def prompt_for(client: Client, case: PromptCase, tokens: Sequence[int] = (),
               pieces: Sequence[bytes] | None = None) -> list[int] | str | None:
    """What to send as the prompt for ``case`` followed by ``tokens``; None when a text-only
    server cannot be sent that prefix (its bytes are not whole UTF-8 characters)."""
    if client.routes.token_ids:
        return list(case.ids) + list(tokens)
    if not tokens:
        return case.text
    if pieces is None or len(pieces) < len(tokens):
        return None
    try:
        return case.text + b"".join(pieces[:len(tokens)]).decode("utf-8")
    except UnicodeDecodeError:
        return None


async def score(client: Client, case: PromptCase, tokens: Sequence[int], logprobs: int, *,
                known: Completion | None = None, chunk: int | None = None,
                pieces: Sequence[bytes] | None = None, start: int = 0,
                fresh: bool = False) -> tuple[Position | None, ...]:
    """The server's distribution at each position of ``tokens`` after ``case``'s prompt, as a
    tuple aligned with prompt + tokens (prompt positions None; None also where a position could
    not be scored). ``known``: the server's own greedy run from the same prompt (reused as far
    as it agrees); ``chunk``: tokens generated per request (None: all that remain);
    ``start``: score from this position on (the first request's prefix ends there);
    ``fresh``: ask the server not to reuse its prefix cache (the noise-floor measurement)."""
    n = len(case.ids)
    if client.routes.echo and client.routes.token_ids:
        scored = await _score_by_echo(client, list(case.ids) + list(tokens), logprobs)
        return (None,) * (n + start) + tuple(scored[n + start:])
    out: list[Position | None] = [None] * len(tokens)
    j = _take(out, tokens, known.positions, 0) if known is not None else start
    forced = client.routes.flavour.forced_text_field if client.routes.flavour else ""
    while forced and pieces is not None and j < len(tokens) - 1 and not fresh:
        step = await _forced(client, case, tokens, pieces, j, logprobs, forced)
        moved = j if step is None else _take(out, tokens, step.positions, j)
        if moved == j:
            break  # the rest cannot be sent as text: a few positions a request, as below
        j = moved
    while j < len(tokens):
        prompt = prompt_for(client, case, tokens[:j], pieces)
        want = len(tokens) - j if chunk is None else min(chunk, len(tokens) - j)
        if prompt is None:  # a prefix that ends inside a UTF-8 character: cannot be sent
            j += 1
            continue
        comp, n_prompt = await _generate(client, prompt, want, logprobs, fresh)
        if not comp.positions:
            if comp.left_out:  # its first token begins a character spread over several tokens:
                j += 1  # llama.cpp reports no figures that can be tied to this position
                continue
            raise AuditError(f"{client.where} generated nothing after a prefix while scoring")
        if not client.routes.token_ids and n_prompt != n + j:
            j += 1  # re-tokenised differently: this prefix is not the one to score
            continue
        j = _take(out, tokens, comp.positions, j)
    return (None,) * n + tuple(out)


def _take(out: list[Position | None], tokens: Sequence[int], positions: Sequence[Position],
          j: int) -> int:
    """Fill ``out`` from position ``j`` with a greedy run's positions while the run agrees with
    ``tokens``; returns the next position to score (the one after the first mismatch)."""
    for k, pos in enumerate(positions):
        i = j + k
        if i >= len(tokens) or not pos.reported:
            return i
        token = tokens[i]
        lp = pos.logprob_of(token)
        out[i] = Position(token, float("-inf") if lp is None else lp, pos.top)
        if pos.token != token:
            return i + 1
    return j + len(positions)


UTF8_TAIL = 4  # tokens generated beyond a run that ends inside a UTF-8 character
PROCESSED_GAP = 0.05  # nats: far above float noise at a prompt's first position


def processed_logprobs(sampled: Position, greedy: Position, noise: float = 0.0) -> bool:
    """Does a server report logprobs *after* temperature/top-k/top-p at temperature > 0?
    ``sampled`` and ``greedy`` are its first positions after the same prompt (a prefill, which
    no draft touches), asked at temperature > 0 and at 0. Raw logprobs (vLLM's default,
    spectest's, llama.cpp's) agree there up to the server's noise (``noise``: its tie
    tolerance, widened to its noise floor — llama.cpp's readings of one prefix move by tenths
    of a nat with its cache state); vLLM started with ``--logprobs-mode processed_logprobs``
    reports the distribution it sampled from, whose logprobs are the raw ones scaled by
    1/temperature and renormalised: most of them move by nats. Judged by the median gap, so
    one noisy token decides nothing."""
    raw = dict(greedy.top)
    gaps = sorted(abs(lp - raw[t]) for t, lp in sampled.top if t in raw)
    return bool(gaps) and gaps[len(gaps) // 2] > max(PROCESSED_GAP, noise)


def gbnf_literal(text: str) -> str:
    """``root ::= "text"`` in llama.cpp's grammar language, every character but letters,
    digits and the space escaped by code point (so quotes, backslashes, newlines and any
    Unicode pass unchanged)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == " " or (ch.isascii() and ch.isalnum()):
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02X}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04X}")
        else:
            out.append(f"\\U{code:08X}")
    return 'root ::= "' + "".join(out) + '"'


async def _forced(client: Client, case: PromptCase, tokens: Sequence[int],
                  pieces: Sequence[bytes], j: int, logprobs: int,
                  field: str) -> Completion | None:
    """Generate ``tokens[j:]``'s text greedily under a constraint that allows only that text
    (``field``: the flavour's, llama.cpp's ``grammar``); the positions it reports are the
    server's distribution after prompt + ``tokens[:j]`` and after each token it generated —
    the candidate's own as long as the server split the text the same way (``_take`` stops at
    the first token it split otherwise). None when the text from ``j`` on is not whole UTF-8
    characters (llama.cpp's byte tokens) or the prefix cannot be sent."""
    prompt = prompt_for(client, case, tokens[:j], pieces)
    if prompt is None or len(pieces) < len(tokens):
        return None
    end = len(tokens)
    while end > j:  # the longest run of whole characters
        try:
            text = b"".join(pieces[j:end]).decode("utf-8")
            break
        except UnicodeDecodeError:
            end -= 1
    if end - j < 2 or not text:
        return None
    body = {**client.body(prompt, max_tokens=end - j, temperature=0, logprobs=logprobs),
            **client.endpoint.extra, field: gbnf_literal(text)}
    data = await client.call("POST", "/v1/completions", body)
    lp, _ = whole_tokens(first_choice(data, client.role).get("logprobs"),
                         (data.get("usage") or {}).get("completion_tokens"))
    if not lp:
        return None
    positions = parse_logprobs(lp, f"{client.where} (forced scoring)", logprobs)
    return Completion(tuple(p.token for p in positions), positions)


async def _generate(client: Client, prompt, max_tokens: int, logprobs: int,
                    fresh: bool = False, extra: dict | None = None
                    ) -> tuple[Completion, int | None]:
    body = {**client.body(prompt, max_tokens=max_tokens, temperature=0, logprobs=logprobs,
                          ignore_eos=True), **client.endpoint.extra, **(extra or {})}
    if fresh and client.routes.flavour is not None:
        body.update(client.routes.flavour.no_prefix_cache)
    data = await client.call("POST", "/v1/completions", body)
    choice = first_choice(data, client.role)
    for extra in (UTF8_TAIL, 2 * UTF8_TAIL):
        if choice.get("logprobs") or not (data.get("usage") or {}).get("completion_tokens"):
            break
        # llama.cpp holds a token's logprobs back until its text is whole UTF-8: a run that
        # ends inside a multi-byte character (text "\ufffd") reports none. Generate on a little
        # so the character completes; positions past the ones wanted are ignored.
        body["max_tokens"] = max_tokens + extra
        data = await client.call("POST", "/v1/completions", body)
        choice = first_choice(data, client.role)
    lp, left_out = whole_tokens(choice.get("logprobs"),
                                (data.get("usage") or {}).get("completion_tokens"))
    positions = parse_logprobs(lp, f"{client.where} (scoring)", logprobs)
    return (Completion(tuple(p.token for p in positions), positions, left_out=left_out),
            (data.get("usage") or {}).get("prompt_tokens"))


async def _score_by_echo(client: Client, ids: list[int],
                         logprobs: int) -> tuple[Position | None, ...]:
    lp, _ = await client.echo(ids, logprobs)
    out = parse_logprobs(lp, f"{client.where} (echo scoring)",
                         logprobs if len(ids) > 1 else 0, skip_first_none=True)
    if len(out) < len(ids) or [p.token for p in out[1:len(ids)]] != list(ids[1:]):
        raise AuditError(f"{client.where} does not support echo scoring of token-id prompts "
                         f"(echo + logprobs + max_tokens 0 returned {len(out)} positions for "
                         f"{len(ids)} tokens); run with --scoring generation")
    return out[:len(ids)]
