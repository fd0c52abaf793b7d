"""Benchmark: a fuzz campaign against a real ``spectest serve`` — no input may get a 5xx.

Starts ``spectest serve`` (the embedded pair, one torch thread, a short context so that a valid
request generates a few tokens at most) on a free port and sends it, over HTTP on 127.0.0.1:

* Schemathesis cases generated from the server's own ``GET /openapi.json`` — positive
  (schema-valid bodies, most of which reach the engine, streaming included) and negative
  (bodies, JSON and bytes that violate the schema) for both generation endpoints, and the GET
  routes. Each answer goes through Schemathesis's ``not_a_server_error``,
  ``status_code_conformance``, ``content_type_conformance`` and ``response_schema_conformance``
  checks: besides "no 5xx", the published schema has to describe what the server sends.
* hand-written cases (:func:`hand_written`): Unicode edge cases in every text field — lone
  surrogates (400 naming the field), noncharacters, NUL, BOM, RTL, combining marks, 4-byte
  emoji, huge strings —, invalid UTF-8 in the raw body (overlong forms, encoded surrogates,
  beyond U+10FFFF, truncated sequences), huge numbers (1e308, 1e309, 2**64, -0, NaN/Infinity,
  5000-digit integers), deep nesting, wrong types in every field, duplicate keys, wrong
  content types, truncated JSON, wrong methods and paths, odd headers, a body over the 4 MiB
  limit, and streams the client drops after the first chunk.

Requests go out ``--concurrency`` at a time, so the engine batches fuzzed requests together.
Below twice as many ``--cases`` as there are hand-written ones (a CI run), an even sample of
those is sent. Printed: cases sent (by source), answers by status class, answers >= 500 (0
expected), check failures, hand-written cases answered other than expected, schema-invalid
cases the server served anyway (pydantic's lax coercion; information, not a failure), whether
the server is alive and still serving at the end (process running, ``/health``, a real
completion, nothing left running or waiting, its own count of 500s, no error in its log
besides aiohttp's notes on malformed HTTP), its RSS before, after each part and at the end,
and the wall time. ``--strict`` exits 1 if any of those is wrong.

    python benchmarks/fuzz_api.py [--cases 10000] [--concurrency 4] [--max-model-len 48]
        [--seed 0] [--out fuzz.json] [--strict]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
import schemathesis
import schemathesis.checks as checks
from hypothesis import HealthCheck, Phase, given, seed, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode
from schemathesis.errors import FailureGroup

from spectest.audit.servers import ServerProcess, ServerSpec
from spectest.http_errors import ErrorResponse

MODEL = "spectest-demo"  # what `spectest serve --model embedded` serves
CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_schema_conformance]
JSON = {"Content-Type": "application/json"}
COMPLETION = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@dataclass(frozen=True)
class Raw:
    """One hand-written request; ``expect``: the statuses it may get (None: any below 500);
    ``param``: the error's ``param`` it must name; ``drop``: read one chunk, then hang up;
    ``protocol``: malformed HTTP that aiohttp's parser answers (a plain-text 400) before any
    handler runs, so no OpenAI error body is expected."""
    name: str
    path: str
    body: bytes | None
    headers: dict = field(default_factory=lambda: dict(JSON))
    method: str = "POST"
    expect: frozenset | None = None
    param: str | None = None
    drop: bool = False
    protocol: bool = False


def dumps(obj) -> bytes:
    """JSON as Python writes it: lone surrogates become ``\\udxxx`` escapes (valid JSON)."""
    return json.dumps(obj).encode()


# --- hand-written cases ------------------------------------------------------------------------
SURROGATES = {"lone high": "\ud800", "lone low": "\udfff", "lone low dcff": "\udcff",
              "high at end": "ok \ud83d", "low at start": "\ude00 ok",
              "reversed pair": "\udc00\ud800", "two highs": "a\ud800\udbffb"}
VALID_TEXT = {"escaped pair (emoji)": "\ud83d\ude00", "noncharacters": "\ufffe\uffff\U0010ffff",
              "NUL": "\x00", "NULs inside": "a\x00b\x00" * 8, "BOM": "\ufeffhello",
              "RTL override": "\u202eabc\u202c", "RTL scripts": "שלום عليكم",
              "combining marks": "e" + "\u0301" * 200, "4-byte emoji": "👨‍👩‍👧‍👦🏳️‍🌈😀𝕏",
              "CJK": "你好世界", "controls": "\x01\x07\x1b[31m\x7f\x9f",
              "line separators": "\u2028\u2029", "whitespace": " \t\n\r ", "empty": "",
              "long 40k": "ab " * 13_000}
# (slot, JSON path named in `param`, body builder)
SLOTS = [
    ("/v1/completions", "prompt", lambda v: {**COMPLETION, "prompt": v}),
    ("/v1/completions", "prompt[0]", lambda v: {**COMPLETION, "prompt": [v]}),
    ("/v1/completions", "stop", lambda v: {**COMPLETION, "stop": v}),
    ("/v1/completions", "stop[1]", lambda v: {**COMPLETION, "stop": ["\n\n", v]}),
    ("/v1/completions", "model", lambda v: {**COMPLETION, "model": v}),
    ("/v1/completions", "user", lambda v: {**COMPLETION, "user": v}),
    ("/v1/chat/completions", "messages[0].content",
     lambda v: {**CHAT, "messages": [{"role": "user", "content": v}]}),
    ("/v1/chat/completions", "messages[0].content",  # a system prompt
     lambda v: {**CHAT, "messages": [{"role": "system", "content": v},
                                     {"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", "messages[1].content[1].text",
     lambda v: {**CHAT, "messages": [{"role": "user", "content": "hi"},
                                     {"role": "user", "content": [
                                         {"type": "text", "text": "a"},
                                         {"type": "text", "text": v}]}]}),
    ("/v1/chat/completions", "messages[0].name",
     lambda v: {**CHAT, "messages": [{"role": "user", "content": "hi", "name": v}]}),
    ("/v1/chat/completions", "stop", lambda v: {**CHAT, "stop": v}),
    ("/v1/chat/completions", "model", lambda v: {**CHAT, "model": v}),
]
NUMBERS = ["NaN", "Infinity", "-Infinity", "1e308", "1e309", "-1e309", "-0", "-0.0", "0.0",
           "5e-324", "18446744073709551616", "-9223372036854775809", "9223372036854775807",
           "1" + "0" * 400, "1" + "0" * 5000, "1.5", "1e2", "true", '"5"', "null", "[]", "{}"]
NUMERIC = {"/v1/completions": ["max_tokens", "temperature", "top_p", "top_k", "seed", "logprobs",
                               "presence_penalty", "n"],
           "/v1/chat/completions": ["max_tokens", "max_completion_tokens", "top_logprobs",
                                    "temperature", "top_p", "top_k", "seed",
                                    "frequency_penalty"]}
WRONG_TYPES = [None, True, 0, -1, 1.5, "", "x", [], [1], ["x", 2], {}, {"a": 1}]


def _with_raw(base: dict, key: str, literal: str) -> bytes:
    """``base`` as JSON with ``key`` set to a raw JSON literal (NaN, 1e309, 5000 digits...)."""
    return dumps({**base, key: "@@"}).replace(b'"@@"', literal.encode())


def _nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def hand_written() -> list[Raw]:
    bad = frozenset({400})
    cases: list[Raw] = []
    for path, slot, build in SLOTS:
        for label, text in SURROGATES.items():
            cases.append(Raw(f"{slot}: {label}", path, dumps(build(text)), expect=bad,
                             param=slot))
            cases.append(Raw(f"{slot}: {label} as raw bytes", path,  # json.loads decodes
                             json.dumps(build(text), ensure_ascii=False)  # surrogatepass
                             .encode("utf-8", "surrogatepass"), expect=bad, param=slot))
        for label, text in VALID_TEXT.items():
            cases.append(Raw(f"{slot}: {label}", path, dumps(build(text))))
            joined = text.encode("utf-16", "surrogatepass").decode("utf-16")  # pairs -> chars
            cases.append(Raw(f"{slot}: {label} (UTF-8)", path,
                             json.dumps(build(joined), ensure_ascii=False).encode()))
    comp = dumps(COMPLETION)[:-1]  # '{... "max_tokens": 2' — splice raw bytes in before '}'
    for label, raw in {"invalid byte": b"\xff", "overlong /": b"\xc0\xaf",
                       "overlong NUL": b"\xc0\x80", "overlong 3-byte": b"\xe0\x80\xaf",
                       "encoded surrogate": b"\xed\xa0\x80", "beyond U+10FFFF": b"\xf4\x90\x80\x80",
                       "truncated 3-byte": b"\xe2\x82", "lone continuation": b"\x80",
                       "5-byte form": b"\xf8\x88\x80\x80\x80"}.items():
        cases.append(Raw(f"raw UTF-8: {label} in a string", "/v1/completions",
                         comp + b', "user": "a' + raw + b'"}', expect=bad))
        cases.append(Raw(f"raw UTF-8: {label} as a key", "/v1/chat/completions",
                         dumps(CHAT)[:-1] + b', "' + raw + b'": 1}', expect=bad))
    cases += [Raw("BOM before the body", "/v1/completions", b"\xef\xbb\xbf" + dumps(COMPLETION)),
              Raw("UTF-16 body", "/v1/completions", json.dumps(COMPLETION).encode("utf-16")),
              Raw("UTF-32 body", "/v1/chat/completions", json.dumps(CHAT).encode("utf-32"))]
    for path, keys in NUMERIC.items():
        base = COMPLETION if path == "/v1/completions" else CHAT
        for key in keys:
            for literal in NUMBERS:
                cases.append(Raw(f"{key} = {literal[:24]}", path, _with_raw(base, key, literal)))
        for literal in NUMBERS:
            if path == "/v1/completions":
                cases.append(Raw(f"token id {literal[:24]}", path,
                                 _with_raw(base, "prompt", f"[1, {literal}]")))
        for key in sorted({*base, "stop", "stream", "stream_options", "user", "speculative",
                           "ignore_eos", "logprobs", "n", "echo", "suffix"}):
            for value in WRONG_TYPES:
                cases.append(Raw(f"{key} = {json.dumps(value)}", path, dumps({**base, key: value})))
    for depth in (10, 100, 900, 1000, 5000, 100_000):
        cases.append(Raw(f"prompt nested {depth} deep", "/v1/completions",
                         _with_raw(COMPLETION, "prompt", _nested(depth).decode())))
        cases.append(Raw(f"content nested {depth} deep", "/v1/chat/completions",
                         _with_raw(CHAT, "messages", '[{"role": "user", "content": '
                                   + _nested(depth, b'"x"').decode() + "}]")))
        cases.append(Raw(f"object nested {depth} deep", "/v1/completions",
                         b'{"a": ' * depth + b"1" + b"}" * depth))
    cases += [
        Raw("duplicate model, last valid", "/v1/completions",
            b'{"model": "nope", "model": "%s", "prompt": "x", "max_tokens": 1}' % MODEL.encode()),
        Raw("duplicate prompt, first a surrogate", "/v1/completions",
            b'{"model": "%s", "prompt": "\\ud800", "prompt": "x", "max_tokens": 1}'
            % MODEL.encode()),
        Raw("duplicate prompt, last a surrogate", "/v1/completions",
            b'{"model": "%s", "prompt": "x", "prompt": "\\ud800", "max_tokens": 1}'
            % MODEL.encode(), expect=bad, param="prompt"),
        Raw("duplicate messages, last wrong type", "/v1/chat/completions",
            dumps(CHAT)[:-1] + b', "messages": 5}', expect=bad),
        Raw("duplicate keys in a message", "/v1/chat/completions",
            b'{"model": "%s", "messages": [{"role": "user", "role": "wizard", "content": "x"}]}'
            % MODEL.encode(), expect=bad),
    ]
    for label, ctype in {"text/plain": "text/plain", "form": "application/x-www-form-urlencoded",
                         "multipart": "multipart/form-data; boundary=x", "none": None,
                         "latin-1 charset": "application/json; charset=latin-1",
                         "xml": "application/xml"}.items():
        headers = {} if ctype is None else {"Content-Type": ctype}
        cases.append(Raw(f"content-type {label}", "/v1/completions", dumps(COMPLETION), headers))
    cases.append(Raw("content-type control chars", "/v1/completions", dumps(COMPLETION),
                     {"Content-Type": "\x01;;="}, expect=frozenset({400}), protocol=True))
    cases.append(Raw("form-encoded body", "/v1/completions", b"model=x&prompt=y",
                     {"Content-Type": "application/x-www-form-urlencoded"}, expect=bad))
    for path, base in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        whole = dumps({**base, "stream": True})
        for cut in range(0, len(whole), 5):
            cases.append(Raw(f"truncated at {cut}", path, whole[:cut], expect=bad))
        for body in (b"", b" ", b"null", b"[]", b"{}", b"1", b'"s"', b"{" * 10, b"\x00"):
            cases.append(Raw(f"body {body[:10]!r}", path, body, expect=bad))
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            cases.append(Raw(f"{method} {path}", path, None, {}, method, frozenset({405})))
        cases.append(Raw(f"{path} dropped stream", path, dumps({**base, "stream": True,
                                                                "max_tokens": 8}), drop=True))
    for path in ("/health", "/metrics", "/v1/models", "/openapi.json"):
        for method in ("POST", "PUT", "DELETE"):
            cases.append(Raw(f"{method} {path}", path, b"{}", method=method,
                             expect=frozenset({405})))
        cases.append(Raw(f"HEAD {path}", path, None, {}, "HEAD"))
        cases.append(Raw(f"GET {path}?junk", path + "?a=%ff&b", None, {}, "GET"))
    for path in ("/v1/completions/", "//v1/completions", "/v1/%63ompletions", "/v1/completions%00",
                 "/v2/completions", "/v1/chat/completions/../completions"):
        cases.append(Raw(f"path {path[:40]}", path, dumps(COMPLETION)))
    cases.append(Raw("path of 10 kB", "/v1/" + "x" * 10_000, dumps(COMPLETION),
                     expect=frozenset({400, 414}), protocol=True))
    big = "word " * 200_000  # 1 MB of text: tokenized, then too long for the context
    cases += [
        Raw("1 MB prompt", "/v1/completions", dumps({**COMPLETION, "prompt": big}), expect=bad),
        Raw("1 MB chat message", "/v1/chat/completions",
            dumps({**CHAT, "messages": [{"role": "user", "content": big}]}), expect=bad),
        Raw("1 MB stop string", "/v1/completions", dumps({**COMPLETION, "stop": big}),
            expect=bad),
        Raw("100k token ids", "/v1/completions", dumps({**COMPLETION, "prompt": [1] * 100_000}),
            expect=bad),
        Raw("10k messages", "/v1/chat/completions",
            dumps({**CHAT, "messages": [{"role": "user", "content": "x"}] * 10_000}),
            expect=bad),
        Raw("5 MB body", "/v1/completions", dumps({**COMPLETION, "prompt": "a" * (5 << 20)}),
            expect=frozenset({413})),
        Raw("header: workload not UTF-8", "/v1/completions", dumps(COMPLETION),
            {**JSON, "X-Spectest-Workload": b"\xff\xfe\xed\xa0\x80"}),
        Raw("header: traceparent garbage", "/v1/chat/completions", dumps(CHAT),
            {**JSON, "traceparent": "00-" + "z" * 300}),
        Raw("header: 10 kB", "/v1/completions", dumps(COMPLETION), {**JSON, "X-Big": "a" * 10_000},
            expect=frozenset({400, 431}), protocol=True),
        Raw("header: Authorization with NUL", "/v1/completions", dumps(COMPLETION),
            {**JSON, "Authorization": b"Bearer \xff\x00"}, expect=frozenset({400}),
            protocol=True),
        Raw("header: Authorization not UTF-8", "/v1/completions", dumps(COMPLETION),
            {**JSON, "Authorization": b"Bearer \xff\xfe"}),
    ]
    return cases


# --- running cases -----------------------------------------------------------------------------
class Campaign:
    """Sends cases from a thread pool and tallies what came back."""

    def __init__(self, url: str, concurrency: int):
        self.url, self.concurrency = url, concurrency
        self.sent: collections.Counter = collections.Counter()  # source -> n
        self.status: collections.Counter = collections.Counter()  # (source, status) -> n
        self.failures: dict[str, list] = {}  # title -> [count, first reproduction]
        self.unexpected: list[str] = []
        self.transport: list[str] = []
        self.lax: collections.Counter = collections.Counter()  # negative cases answered 2xx
        self.lock = threading.Lock()
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(concurrency)
        self.slots = threading.BoundedSemaphore(concurrency * 2)

    def session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session

    def submit(self, fn, *args) -> None:
        self.slots.acquire()

        def run():
            try:
                fn(*args)
            except Exception as exc:  # the fuzzer's own bug: report it, never hide it
                with self.lock:
                    self.unexpected.append(f"fuzzer error: {exc!r}"[:300])
            finally:
                self.slots.release()
        self.pool.submit(run)

    def wait(self) -> None:
        for _ in range(self.concurrency * 2):
            self.slots.acquire()
        for _ in range(self.concurrency * 2):
            self.slots.release()

    def _record(self, source: str, status: int) -> None:
        with self.lock:
            self.sent[source] += 1
            self.status[(source, status)] += 1

    def _fail(self, title: str, repro: str) -> None:
        with self.lock:
            entry = self.failures.setdefault(title, [0, repro[:2000]])
            entry[0] += 1

    def schemathesis_case(self, source: str, case) -> None:
        try:
            resp = case.call(session=self.session(), base_url=self.url, timeout=120)
        except requests.RequestException as exc:
            with self.lock:
                self.transport.append(f"{source}: {exc!r}"[:300])
            return
        self._record(source, resp.status_code)
        if source.endswith("negative") and resp.status_code < 300:
            with self.lock:  # schema-invalid yet served: pydantic's lax coercion ("5" -> 5)
                self.lax[_shape(case.body)] += 1
        try:
            case.validate_response(resp, checks=CHECKS)
        except FailureGroup as group:
            for failure in group.exceptions:
                self._fail(f"{failure.title} [{source}]", f"{failure.message}\n"
                           f"{case.as_curl_command()[:1500]}")

    def raw_case(self, raw: Raw) -> None:
        try:
            if raw.drop:  # a client that hangs up after the first chunk of a stream
                with requests.post(self.url + raw.path, data=raw.body, headers=raw.headers,
                                   stream=True, timeout=120) as resp:
                    next(resp.iter_lines(), None)
            else:
                resp = self.session().request(raw.method, self.url + raw.path, data=raw.body,
                                              headers=raw.headers, timeout=120)
        except requests.RequestException as exc:
            with self.lock:
                self.transport.append(f"{raw.name}: {exc!r}"[:300])
            return
        self._record("hand-written", resp.status_code)
        problem = None
        if raw.expect is not None and resp.status_code not in raw.expect:
            problem = f"status {resp.status_code}, expected {sorted(raw.expect)}"
        elif resp.status_code >= 400 and raw.method != "HEAD" and not raw.protocol:
            try:
                err = ErrorResponse.model_validate(resp.json()).error
                if raw.param is not None and err.param != raw.param:
                    problem = f"param {err.param!r}, expected {raw.param!r}"
            except ValueError:
                problem = f"status {resp.status_code} without an OpenAI error body"
        if problem:
            with self.lock:
                self.unexpected.append(f"{raw.name}: {problem}: {resp.text[:160]!r}")
        if resp.status_code >= 500:
            self._fail(f"5xx [hand-written] {raw.name}", resp.text[:500])


def _shape(body) -> str:
    """A JSON body with its strings and numbers replaced by their types (for grouping)."""
    if isinstance(body, dict):
        return "{" + ", ".join(f"{k}: {_shape(v)}" for k, v in sorted(body.items())) + "}"
    if isinstance(body, list):
        return "[" + ", ".join(sorted({_shape(v) for v in body})) + "]"
    return type(body).__name__ if not isinstance(body, bool) else json.dumps(body)


def drive(campaign: Campaign, source: str, strategy, n: int, base_seed: int) -> int:
    """Draw ``n`` cases from a Schemathesis strategy and submit each; rounds with new seeds
    until ``n`` went out or a round draws nothing (an operation without inputs). Returns the
    number submitted."""
    submitted = 0
    for attempt in range(20):
        if submitted >= n:
            break
        drawn = [0]

        @seed(base_seed + attempt)
        @settings(max_examples=n - submitted, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def generate(case):
            drawn[0] += 1
            campaign.submit(campaign.schemathesis_case, source, case)

        generate()
        submitted += drawn[0]
        if drawn[0] == 0 or (attempt and drawn[0] < 2):
            break
    return submitted


# --- the server's state ------------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def log_errors(log: str) -> tuple[list[str], int]:
    """The server log's ERROR/CRITICAL records other than aiohttp's for malformed HTTP (a
    handler bug, an engine failure), and how many of the latter there were."""
    errors, protocol = [], 0
    for record in re.split(r"\n(?=[A-Z]+ [\w.]+: )", log):
        if not record.startswith(("ERROR", "CRITICAL")):
            continue
        if record.startswith("ERROR aiohttp.server") and "aiohttp.http_exceptions." in record:
            protocol += 1
        else:
            errors.append(record)
    return errors, protocol


def server_metrics(url: str) -> dict[str, float]:
    text = requests.get(url + "/metrics", timeout=30).text
    out: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if key == "spectest:request_errors_total":
                key += "{code=" + sample.labels.get("code", "") + "}"
            out[key] += sample.value
    return out


def still_serving(url: str) -> dict:
    health = requests.get(url + "/health", timeout=30).status_code
    resp = requests.post(url + "/v1/completions", json={**COMPLETION, "max_tokens": 4},
                         timeout=120)
    tokens = resp.json().get("usage", {}).get("completion_tokens", 0) if resp.ok else 0
    deadline = time.monotonic() + 15
    while True:  # dropped streams and the last requests may still be finishing
        m = server_metrics(url)
        busy = m["spectest:num_requests_running"] + m["spectest:num_requests_waiting"]
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    errors_5xx = sum(v for k, v in m.items() if k.startswith("spectest:request_errors_total"
                                                             "{code=5"))
    return {"health": health, "completion_status": resp.status_code,
            "completion_tokens": tokens, "left_running_or_waiting": busy,
            "server_counted_5xx": errors_5xx}


# --- main --------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000,
                    help="total cases to send (below twice the hand-written ones, an even "
                         "sample of those makes half)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-model-len", type=int, default=48,
                    help="the server's context: bounds what a valid request generates")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    ap.add_argument("--strict", action="store_true", help="exit 1 unless everything held")
    args = ap.parse_args()

    hand = hand_written()
    if args.cases < 2 * len(hand):  # a short run (CI): an even sample, half of the cases
        hand = hand[::-(-len(hand) // max(1, args.cases // 2))]
    spec = ServerSpec(extra_args=("--max-model-len", str(args.max_model_len),
                                  "--max-num-seqs", "4", "--max-waiting", "256"))
    t_start = time.perf_counter()
    server = ServerProcess(spec)
    with server as url:
        pid = server.proc.pid
        requests.post(url + "/v1/completions", json=COMPLETION, timeout=120)  # warm up
        rss_before = rss_mib(pid)
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        campaign = Campaign(url, args.concurrency)
        t0 = time.perf_counter()
        timings, rss = {}, {"start": rss_before}
        for raw in hand:
            campaign.submit(campaign.raw_case, raw)
        campaign.wait()
        timings["hand-written"] = time.perf_counter() - t0
        rss["hand-written"] = rss_mib(pid)
        ops = [r.ok() for r in schema.get_all_operations()]
        posts = [op for op in ops if op.method.upper() == "POST"]
        gets = [op for op in ops if op.method.upper() != "POST"]
        for op in gets:
            t = time.perf_counter()
            drive(campaign, f"schemathesis {op.label} positive",
                  op.as_strategy(generation_mode=GenerationMode.POSITIVE), 20, args.seed)
            campaign.wait()
            timings[f"{op.label} positive"] = time.perf_counter() - t
        left = max(0, args.cases - sum(campaign.sent.values()) - len(campaign.transport))
        per = -(-left // (2 * len(posts)))  # ceil: positive and negative for each POST route
        for op in posts:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                t = time.perf_counter()
                drive(campaign, f"schemathesis {op.label} {mode.value}",
                      op.as_strategy(generation_mode=mode), per, args.seed)
                campaign.wait()
                timings[f"{op.label} {mode.value}"] = time.perf_counter() - t
                rss[f"{op.label} {mode.value}"] = rss_mib(pid)
        fuzz_wall = time.perf_counter() - t0
        end = still_serving(url)
        end["process_running"] = server.proc.poll() is None
        rss_after = rss_mib(pid)
        log = server.log_path.read_text(errors="replace")
    campaign.pool.shutdown()
    total_wall = time.perf_counter() - t_start

    classes = collections.Counter()
    for (_, status), n in campaign.status.items():
        classes[f"{status // 100}xx"] += n
    five = sum(n for (_, status), n in campaign.status.items() if status >= 500)
    app_errors, protocol_errors = log_errors(log)
    alive = (end["process_running"] and end["health"] == 200 and end["completion_status"] == 200
             and end["completion_tokens"] >= 1 and not end["left_running_or_waiting"])
    ok = (five == 0 and not campaign.failures and not campaign.unexpected
          and not campaign.transport and alive and not end["server_counted_5xx"]
          and not app_errors)
    result = {
        "schemathesis": schemathesis.__version__, "cases_sent": sum(campaign.sent.values()),
        "by_source": dict(campaign.sent), "by_status_class": dict(sorted(classes.items())),
        "by_source_and_status": {f"{src} {st}": n for (src, st), n
                                 in sorted(campaign.status.items())},
        "responses_5xx": five, "check_failures": {k: v[0] for k, v in campaign.failures.items()},
        "unexpected": campaign.unexpected, "transport_errors": campaign.transport,
        "negative_cases_served": sum(campaign.lax.values()),
        "server_log_errors": app_errors, "malformed_http_logged": protocol_errors,
        "end": end, "alive": alive,
        "rss_mib_before": round(rss_before, 1), "rss_mib_after": round(rss_after, 1),
        "rss_mib_after_part": {k: round(v, 1) for k, v in rss.items()},
        "fuzz_wall_s": round(fuzz_wall, 1), "total_wall_s": round(total_wall, 1),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "concurrency": args.concurrency, "max_model_len": args.max_model_len, "seed": args.seed,
        "ok": ok}
    report(result, campaign)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 1 if args.strict and not ok else 0


def report(r: dict, campaign: Campaign) -> None:
    print(f"fuzz campaign against spectest serve (schemathesis {r['schemathesis']}, "
          f"concurrency {r['concurrency']}, max-model-len {r['max_model_len']}, "
          f"seed {r['seed']})")
    print(f"cases sent: {r['cases_sent']}")
    for source, n in sorted(r["by_source"].items()):
        statuses = {st: k for (src, st), k in campaign.status.items() if src == source}
        print(f"  {source:<52} {n:>6}  {dict(sorted(statuses.items()))}")
    print(f"responses by status class: {r['by_status_class']}")
    print(f"responses >= 500: {r['responses_5xx']} (expected 0); server's own 5xx count: "
          f"{r['end']['server_counted_5xx']:.0f}; errors in its log: "
          f"{len(r['server_log_errors'])} (besides {r['malformed_http_logged']} malformed-HTTP "
          f"requests aiohttp logged)")
    print(f"schemathesis check failures: {sum(r['check_failures'].values())}")
    for title, (n, repro) in campaign.failures.items():
        print(f"  {n} x {title}\n    " + repro[:600].replace("\n", "\n    "))
    print(f"schema-invalid (negative) cases the server served anyway: "
          f"{r['negative_cases_served']} (lax coercion, not a failure); most common shapes:")
    for shape, n in campaign.lax.most_common(5):
        print(f"  {n} x {shape[:300]}")
    print(f"hand-written cases answered other than expected: {len(r['unexpected'])}")
    for line in r["unexpected"][:20]:
        print(f"  {line}")
    print(f"transport errors (no HTTP answer): {len(r['transport_errors'])}")
    for line in r["transport_errors"][:10]:
        print(f"  {line}")
    e = r["end"]
    print(f"server alive at the end: {r['alive']} (process running {e['process_running']}, "
          f"/health {e['health']}, a completion {e['completion_status']} with "
          f"{e['completion_tokens']} tokens, {e['left_running_or_waiting']:.0f} requests left "
          f"running or waiting)")
    print(f"server RSS: {r['rss_mib_before']} MiB before, {r['rss_mib_after']} MiB after; "
          f"after each part: {r['rss_mib_after_part']}")
    print(f"wall time: {r['fuzz_wall_s']} s fuzzing ({r['cases_sent'] / r['fuzz_wall_s']:.0f} "
          f"cases/s), {r['total_wall_s']} s with server start-up; per part: {r['timings_s']}")
    for record in r["server_log_errors"][:3]:
        print("server log:\n" + record[:2500])
    print("verdict: " + ("OK — no 5xx, every check held, the server kept serving" if r["ok"]
                         else "FAILED"))


if __name__ == "__main__":
    sys.exit(main())
