"""Benchmark: a fuzz campaign against a real ``spectest serve`` — no input may get a 5xx.

Starts ``spectest serve`` (the embedded pair, one torch thread, a short context so that a valid
request generates a few tokens at most) on a free port and sends it, over HTTP on 127.0.0.1:

* Schemathesis cases generated from the server's own ``GET /openapi.json`` — positive
  (schema-valid bodies, most of which reach the engine, streaming included) and negative
  (bodies, JSON and bytes that violate the schema) for both generation endpoints, and the GET
  routes. Each answer goes through Schemathesis's ``not_a_server_error``,
  ``status_code_conformance``, ``content_type_conformance`` and ``response_schema_conformance``
  checks: besides "no 5xx", the published schema has to describe what the server sends.
* hand-written cases (``fuzz_cases.py``): Unicode edge cases in every text field — lone
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
from pathlib import Path

import requests
import schemathesis
import schemathesis.checks as checks
from hypothesis import HealthCheck, Phase, given, seed, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode
from schemathesis.errors import FailureGroup

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path[:0] = [str(REPO), str(BENCH)]

from fuzz_cases import COMPLETION, Raw, hand_written  # noqa: E402
from spectest.audit.servers import ServerProcess, ServerSpec  # noqa: E402
from spectest.http_errors import ErrorResponse  # noqa: E402

CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_schema_conformance]


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
