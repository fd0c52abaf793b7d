"""The Locust user: replays workload records as streamed completions, one conversation a task.

``SpecUser`` is abstract; a locustfile subclasses it and names its bundled ``workload``
(``chat``, ``code``, ``rag`` or ``mixed``; ``--dataset`` overrides it). Each task takes the next
record of the seeded replay, waits for its Poisson arrival when the step is open loop, and sends
the first request and then every follow-up turn of a multi-turn record (the model's answer is
appended to the conversation, as a chat client would). Each request becomes one row for the run
and one Locust ``request`` event (name = the record's category).

It imports no torch and no asyncio: everything here runs on Locust's gevent loop.
"""

from __future__ import annotations

import time

import gevent
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

from spectest.loadgen import results
from spectest.loadgen.client import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    CompletionRequest,
    build_body,
    stream_completion,
)
from spectest.loadgen.datasets import Record
from spectest.loadgen.options import SpecOptions

BACKOFF_S = 1.0  # after a connection failure: the server is gone, do not spin


def build_request(record: Record, opts: SpecOptions, model: str, turn: int,
                  messages: list[dict] | None,
                  speculative: bool | None = None) -> CompletionRequest:
    """The request for ``turn`` of ``record`` (``messages``: the conversation so far);
    ``speculative``: this request's switch (default: the options')."""
    endpoint = opts.endpoint
    if endpoint == "auto":
        endpoint = "chat" if messages is not None else "completions"
    if endpoint == "chat" and messages is None:
        messages = [{"role": "user", "content": record.prompt or ""}]
    prompt = None
    if endpoint == "completions":
        prompt = record.prompt if messages is None else "\n\n".join(
            f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant:"
    body = build_body(model, messages=messages if endpoint == "chat" else None, prompt=prompt,
                      max_tokens=opts.max_tokens or record.expected_output_tokens,
                      temperature=opts.temperature,
                      speculative=opts.speculative if speculative is None else speculative,
                      extra=dict(opts.extra_body))
    return CompletionRequest(path=CHAT_PATH if endpoint == "chat" else COMPLETIONS_PATH,
                             body=body, workload=record.category, record_id=record.id,
                             turn=turn, keep_text=turn < len(record.turns))


class SpecUser(FastHttpUser):
    abstract = True
    workload = "chat"
    wait_time = constant(0)
    network_timeout = 600.0  # a long generation is not a timeout
    connection_timeout = 10.0
    sent = 0  # requests this user has sent: after the first, its connection may be reused
    conversations = 0  # --speculative ab: even conversations speculate, odd ones do not

    @task
    def conversation(self) -> None:
        run = self.environment.spectest
        if not run.active or run.aborted:
            gevent.sleep(0.1)
            return
        lag = None
        due = run.pacer.next_arrival()
        if due is not None:
            delay = due - time.time()
            if delay > 0:
                gevent.sleep(delay)
            lag = max(0.0, time.time() - due)
        record = next(run.dataset(self.workload))
        messages = [dict(m) for m in record.messages] if record.messages is not None else None
        worker = getattr(run.env.runner, "client_id", "local")
        speculative, label = None, run.opts.speculative_label
        if run.opts.alternate:  # one kind per conversation, so its turns are comparable
            speculative = self.conversations % 2 == 0
            label = "on" if speculative else "off"
        self.conversations += 1
        for turn in range(1 + len(record.turns)):
            req = build_request(record, run.opts, run.model, turn, messages, speculative)
            result = stream_completion(self.client, req, api_key=run.opts.api_key,
                                       trace=run.trace, reused=self.sent > 0)
            self.sent += 1
            run.submit(results.request_row(
                result, worker=worker, speculative=label,
                slo_ok=run.opts.slo_ok(result.ttft_s, result.tpot_s, result.e2el_s),
                schedule_lag_s=lag if turn == 0 else None, client_cpu=run.cpu.fraction()))
            if not result.ok:
                if result.connection_error:
                    gevent.sleep(BACKOFF_S)
                return
            if messages is not None and turn < len(record.turns):
                messages += [{"role": "assistant", "content": result.text},
                             {"role": "user", "content": record.turns[turn]}]
