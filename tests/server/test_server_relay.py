"""The relay from the engine thread to the client: who writes a stream's rounds, and in what
order, when the engine thread writes to the socket itself (``server.relay``) — on real
sockets: a socketpair for the relay alone, a live server for the whole path."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time

import pytest
import requests

from live_server import MODEL, LiveServer, make_server
from spectest.engine.requests import RequestOutput
from spectest.server.relay import Relay, Unsent


class Recorder:
    """An Outbox that keeps what was posted, for the test to deliver as the loop would."""

    def __init__(self):
        self.items: list = []

    def post(self, deliver, item):
        self.items.append((deliver, item))

    def run(self):
        items, self.items = self.items, []
        for deliver, item in items:
            deliver(item)


def out(i: int, *, finished: bool = False, size: int = 10) -> RequestOutput:
    return RequestOutput("r", (i,), f"{i:0{size}d}", finished=finished,
                         finish_reason="length" if finished else None)


def encode(o: RequestOutput) -> bytes:
    return o.text.encode() + b"|"


@pytest.fixture
def pipe():
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_a_direct_stream_writes_rounds_on_the_calling_thread_and_leaves_the_last_to_the_loop(pipe):
    server_end, client_end = pipe
    outbox, loop_got, arrived = Recorder(), [], []
    relay = Relay(outbox, loop_got.append, arrived.append)
    relay.on_output(out(0))  # before go_direct: the loop's
    assert not relay.go_direct(server_end.fileno(), encode)  # one output still queued
    outbox.run()
    assert relay.go_direct(server_end.fileno(), encode)
    for i in range(1, 4):
        relay.on_output(out(i))
    relay.on_output(out(4, finished=True))
    outbox.run()
    assert relay.direct_writes == 3
    assert client_end.recv(4096) == b"0000000001|0000000002|0000000003|"
    assert [o.token_ids for o in loop_got] == [(0,), (4,)]
    assert len(arrived) == 5  # every output passes the arrival hook, whoever writes it
    relay.close()


def test_a_full_socket_hands_the_stream_back_to_the_loop_without_losing_or_reordering_bytes(pipe):
    server_end, client_end = pipe
    server_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client_end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    outbox, loop_got = Recorder(), []
    relay = Relay(outbox, loop_got.append, lambda o: None)
    assert relay.go_direct(server_end.fileno(), encode)
    n = 0
    while not outbox.items:  # write until the socket refuses (all or part of a round)
        relay.on_output(out(n, size=3000))
        n += 1
    for i in range(n, n + 3):  # later rounds queue behind, in order
        relay.on_output(out(i, size=3000))
    outbox.run()
    assert relay.direct_writes < n
    received = b""
    client_end.setblocking(False)
    while True:
        try:
            chunk = client_end.recv(65536)
        except BlockingIOError:
            break
        received += chunk
    for item in loop_got:  # what the loop would write next, in order
        received += item.data if isinstance(item, Unsent) else encode(item)
    assert received == b"".join(encode(out(i, size=3000)) for i in range(n + 3))
    relay.close()


def test_after_close_the_relay_never_writes_and_its_descriptor_is_gone(pipe):
    server_end, client_end = pipe
    outbox, loop_got = Recorder(), []
    relay = Relay(outbox, loop_got.append, lambda o: None)
    assert relay.go_direct(server_end.fileno(), encode)
    fd = relay._fd
    relay.close()
    relay.on_output(out(1))
    outbox.run()
    assert [o.token_ids for o in loop_got] == [(1,)] and relay.direct_writes == 0
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_non_streaming_request_reaches_the_loop_once_at_the_end():
    outbox, loop_got, arrived = Recorder(), [], []
    relay = Relay(outbox, loop_got.append, arrived.append, collect=True)
    for i in range(5):
        relay.on_output(out(i))
        assert not outbox.items
    relay.on_output(out(5, finished=True))
    assert len(outbox.items) == 6 and len(arrived) == 6
    outbox.run()
    assert [o.token_ids[0] for o in loop_got] == list(range(6))
    assert not relay.go_direct(0, encode)  # nothing to write directly


# --- through the server --------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(pair):
    server = make_server(pair, max_model_len=512)
    with LiveServer(server, sndbuf=8192) as running:  # a socket that a slow reader fills
        yield running.url, server


def stream_text(resp_lines) -> tuple[str, dict | None]:
    text, usage = "", None
    for line in resp_lines:
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            if event["choices"]:
                text += event["choices"][0]["text"]
            usage = event.get("usage") or usage
    return text, usage


def test_a_stream_is_written_by_the_engine_thread_and_says_what_the_loop_would(live):
    """The loop hands a stream over only when nothing of it is queued; on a busy machine the
    engine can stay ahead of the loop for a whole stream, so up to five streams are tried."""
    url, server = live
    body = {"model": MODEL, "prompt": "def parse(line):\n", "max_tokens": 120,
            "temperature": 0, "ignore_eos": True}
    full = requests.post(f"{url}/v1/completions", json=body, timeout=60).json()
    before = server.direct_writes
    for _ in range(5):
        with requests.post(f"{url}/v1/completions", json={**body, "stream": True,
                           "stream_options": {"include_usage": True}}, stream=True,
                           timeout=60) as resp:
            text, usage = stream_text(resp.iter_lines())
        assert text == full["choices"][0]["text"]
        assert usage["completion_tokens"] == 120
        if server.direct_writes - before >= 10:
            break
    assert server.direct_writes - before >= 10  # rounds that never woke the event loop


def test_a_client_that_stops_reading_gets_every_byte_in_order_when_it_reads_again(live):
    """With logprobs each round's chunk is large; a client whose receive window is tiny and
    who reads nothing for a while fills the socket, so the engine thread must hand the stream
    back to the loop mid-way. The stream still decodes (chunked framing intact) to the same
    text and logprobs as the non-streaming answer."""
    url, server = live
    handbacks = server.handbacks
    body = {"model": MODEL, "prompt": "import os\n", "max_tokens": 400, "temperature": 0,
            "ignore_eos": True, "logprobs": 20}
    full = requests.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect((host, int(port)))
    payload = json.dumps({**body, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    time.sleep(2.0)  # the server generates ~400 tokens, ~0.6 kB each, meanwhile
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    lines = resp.read().split(b"\n")
    sock.close()
    text, tokens = "", []
    for line in lines:
        if line.startswith(b"data: {"):
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            tokens += choice["logprobs"]["tokens"]
    assert lines.count(b"data: [DONE]") == 1
    assert text == full["text"] and tokens == full["logprobs"]["tokens"]
    assert server.handbacks > handbacks  # the engine thread did find the socket full


def test_an_encoding_error_on_the_engine_thread_leaves_that_output_to_the_loop(pipe):
    """A formatting bug must not raise into the engine's round (which would fail every row
    of the batch): the output goes to the loop, whose request then fails on its own."""
    server_end, _ = pipe
    outbox, loop_got = Recorder(), []

    def broken(o):
        raise TypeError("boom")

    relay = Relay(outbox, loop_got.append, lambda o: None)
    assert relay.go_direct(server_end.fileno(), broken)
    relay.on_output(out(1))
    relay.on_output(out(2))
    outbox.run()
    assert [o.token_ids for o in loop_got] == [(1,), (2,)] and relay.direct_writes == 0
    relay.close()
