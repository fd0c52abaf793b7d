"""``/admin/speculation`` on a live server: the runtime speculation switch.

Proves: GET shows the settings; POST switches speculation off and on (and changes K) while a
stream is in flight — the stream finishes normally, requests sent after the switch carry no
drafts, drafts resume when it is switched back on, and the answer says at which round it took
effect; the ``speculation_*`` gauges and the switch counter follow; bad bodies, a K above the
server's reservation and a policy it cannot build are OpenAI-style 400s, never 500s.

Access: a non-loopback peer gets a 403 without an admin key even on a server bound to every
address (``--host 0.0.0.0``); with an admin key, the key is needed from any peer (the API key
does not open it). The peer check is also tested as a function, for IPv6 and mapped addresses.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest
import requests

from live_server import MODEL, LiveServer, make_server, metric_sum, scrape
from spectest.server.admin import check_access, is_loopback
from spectest.http_errors import APIError
from spectest.telemetry import names as N

PATH = "/admin/speculation"
ADMIN_KEY = "admin-secret"
API_KEY = "api-secret"


@pytest.fixture(scope="module")
def live(pair):
    with LiveServer(make_server(pair, max_num_seqs=4, max_model_len=256)) as live:
        yield live


def gauges(url: str) -> tuple[float, float, float]:
    samples = scrape(url)
    return (metric_sum(samples, N.SPECULATION_ENABLED.sample_name),
            metric_sum(samples, N.SPECULATION_K.sample_name),
            metric_sum(samples, N.SPECULATION_SWITCHES.sample_name))


def completion(live, **extra) -> dict:
    resp = live.post("/v1/completions", {"model": MODEL, "prompt": "def add(a, b):",
                                         "max_tokens": 16, "ignore_eos": True,
                                         "temperature": 0, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def switch(live, **body) -> dict:
    resp = live.post(PATH, body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_get_shows_the_start_up_settings(live):
    state = live.get(PATH).json()
    assert {k: state[k] for k in ("enabled", "k", "k_policy", "k_limit", "drafter")} == \
        {"enabled": True, "k": 4, "k_policy": "fixed", "k_limit": 4, "drafter": "draft-model"}
    assert state["pending"] is None


def test_switch_off_and_on_under_a_stream_in_flight(live):
    before = gauges(live.url)
    assert before[:2] == (1, 4)
    chunks: list[bytes] = []
    started = threading.Event()

    def stream():
        body = {"model": MODEL, "prompt": "import os\n", "max_tokens": 120, "ignore_eos": True,
                "temperature": 0, "stream": True}
        with requests.post(live.url + "/v1/completions", json=body, stream=True,
                           timeout=120) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line:
                    chunks.append(line)
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    off = switch(live, enabled=False)
    change = off["change"]
    assert off["enabled"] is False and change["new"]["enabled"] is False
    assert change["old"]["enabled"] is True
    assert change["effective"] == "applied" and change["round"] is not None
    assert 0 <= change["effective_after_s"] < 2
    assert gauges(live.url) == (0, 4, before[2] + 1)
    assert completion(live)["spec"]["drafts"] == 0
    t.join(120)
    assert chunks[-1] == b"data: [DONE]"
    final = json.loads(chunks[-2][6:])
    assert final["choices"][0]["finish_reason"] == "length"  # finished normally, all 120
    assert final["spec"]["drafts"] > 0  # drafted before the switch, not after
    on = switch(live, enabled=True, k=2)
    assert on["enabled"] is True and on["k"] == 2 and on["switches"] == off["switches"] + 1
    assert gauges(live.url) == (1, 2, before[2] + 2)
    spec = completion(live)["spec"]
    assert spec["drafts"] > 0 and spec["draft_tokens"] <= 2 * spec["drafts"]
    again = switch(live, enabled=True, k=2)  # no change: not a switch
    assert again["change"]["effective"] == "unchanged" and again["switches"] == on["switches"]
    switch(live, k=4)
    assert live.get(PATH).json()["change"]["new"] == {"enabled": True, "k": 4,
                                                      "k_policy": "fixed"}


@pytest.mark.parametrize("body, param", [
    ({}, None), ({"k": 0}, "k"), ({"k": 5}, "k"), ({"k": 1.5}, "k"), ({"k": None}, "k"),
    ({"k_policy": "sometimes"}, "k_policy"), ({"k_policy": "goodput"}, "k_policy"),
    ({"enabled": "perhaps"}, "enabled"), ({"enabled": None}, "enabled"),
    ({"enabled": False, "K": 3}, "K"), (b"{not json", None), (b"[true]", None),
    (b"\xff\xfe", None), (b"", None)])
def test_bad_bodies_are_openai_style_400s(live, body, param):
    if isinstance(body, bytes):
        resp = requests.post(live.url + PATH, data=body, timeout=30,
                             headers={"Content-Type": "application/json"})
    else:
        resp = live.post(PATH, body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    state = live.get(PATH).json()
    assert (state["enabled"], state["k"], state["pending"]) == (True, 4, None)


def test_wrong_method_is_a_405_in_the_api_shape(live):
    resp = requests.delete(live.url + PATH, timeout=30)
    assert resp.status_code == 405 and "error" in resp.json()


@pytest.mark.parametrize("peer, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("192.0.2.2", False), ("::ffff:10.0.0.1", False), ("fd00::2", False),
    ("fe80::1%eth0", False), ("", False), (None, False), ("not an address", False)])
def test_peer_check(peer, loopback):
    assert is_loopback(peer) is loopback


def test_access_rules():
    check_access("127.0.0.1", "", None)
    with pytest.raises(APIError) as err:
        check_access("203.0.113.9", "", None)
    assert err.value.status == 403
    for peer in ("127.0.0.1", "203.0.113.9"):
        check_access(peer, f"Bearer {ADMIN_KEY}", ADMIN_KEY)
        for header in ("", f"Bearer {API_KEY}", f"Bearer {ADMIN_KEY}x", ADMIN_KEY):
            with pytest.raises(APIError) as err:
                check_access(peer, header, ADMIN_KEY)
            assert err.value.status == 401


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks a route
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if is_loopback(address) else address


def test_bound_to_every_address_admin_stays_loopback_only(pair):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    with LiveServer(make_server(pair, max_model_len=128), host="0.0.0.0") as live:
        outside = f"http://{address}:{live.port}"
        assert requests.get(outside + "/health", timeout=10).status_code == 200
        for resp in (requests.get(outside + PATH, timeout=10),
                     requests.post(outside + PATH, json={"enabled": False}, timeout=10)):
            assert resp.status_code == 403, resp.text
            assert resp.json()["error"]["code"] == "admin_loopback_only"
        assert live.get(PATH).json()["enabled"] is True  # nothing changed; loopback may read


def test_with_an_admin_key_it_is_required_and_the_api_key_is_not_it(pair):
    server = make_server(pair, api_key=API_KEY, admin_key=ADMIN_KEY, max_model_len=128)
    with LiveServer(server) as live:
        for headers in ({}, {"Authorization": f"Bearer {API_KEY}"}):
            assert live.get(PATH, headers=headers).status_code == 401
            assert live.post(PATH, {"enabled": False}, headers=headers).status_code == 401
        ok = live.post(PATH, {"enabled": False},
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert ok.status_code == 200 and ok.json()["enabled"] is False
        # the admin key does not open the API either
        resp = live.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2},
                         headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert resp.status_code == 401
