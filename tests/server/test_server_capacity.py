"""Over capacity and client disconnects, against ``spectest serve`` in a subprocess (so its RSS
is the server's alone).

* Over capacity: with every slot busy and the queue at ``--max-waiting``, further requests get
  429 with ``Retry-After`` and an OpenAI error body at once; the queue never grows past its
  bound, RSS stays flat through a burst of refusals, and the queued requests are served when
  slots free up.
* Disconnects: 1,000 streams aborted by the client after their first token free their slots at
  once — afterwards nothing is running or waiting, the server counted them as ``abort``, RSS is
  back where it was, and full capacity is available again.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from live_server import ServeProcess, metric_sum, scrape, wait_until

SLOTS, QUEUE = 4, 8
MODEL = "capacity-test"
RUNNING = "spectest:num_requests_running"
WAITING = "spectest:num_requests_waiting"
SUCCESS = "spectest:request_success_total"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def proc():
    with ServeProcess("--max-num-seqs", str(SLOTS), "--max-waiting", str(QUEUE),
                      "--max-model-len", "1024", "--served-model-name", MODEL) as proc:
        yield proc


def load(url: str) -> tuple[float, float]:
    samples = scrape(url)
    return metric_sum(samples, RUNNING), metric_sum(samples, WAITING)


def body(max_tokens: int, speculative: bool = True) -> dict:
    return {"model": MODEL, "prompt": "count: 1 2 3", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "speculative": speculative}


async def first_token(resp: aiohttp.ClientResponse) -> None:
    """Read the stream until the first chunk that carries text."""
    async for line in resp.content:
        if line.startswith(b"data: {") and b'"text":"' in line and b'"text":""' not in line:
            return
    raise AssertionError("stream ended before its first token")


def test_over_capacity_gets_429_with_retry_after(proc):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            url = proc.url + "/v1/completions"
            # fill every slot and the whole queue with long, slow (non-speculative) streams
            holders = []
            for n, want in ((SLOTS, (SLOTS, 0)), (QUEUE, (SLOTS, QUEUE))):
                holders += [await session.post(url, json=body(1000, speculative=False))
                            for _ in range(n)]
                assert wait_until(lambda: load(proc.url) == want, 10)
            assert [h.status for h in holders] == [200] * (SLOTS + QUEUE)
            done_before = metric_sum(scrape(proc.url), SUCCESS)
            rss_before = proc.rss_bytes()

            async def refused():
                async with session.post(url, json=body(4)) as resp:
                    return resp.status, resp.headers.get("Retry-After"), await resp.json()

            answers = []
            for _ in range(6):  # 300 refusals, 50 at a time
                answers += await asyncio.gather(*(refused() for _ in range(50)))
            samples = scrape(proc.url)
            assert metric_sum(samples, SUCCESS) == done_before, "a holder finished too soon"
            assert (metric_sum(samples, RUNNING), metric_sum(samples, WAITING)) == (SLOTS, QUEUE)
            assert proc.rss_bytes() - rss_before < 10 * MiB
            for status, retry_after, payload in answers:
                assert status == 429
                assert retry_after is not None and int(retry_after) >= 1
                assert payload["error"]["code"] == "over_capacity"
                assert payload["error"]["type"] == "rate_limit_exceeded"
            # the queued requests are served once the running ones go away
            for h in holders[:SLOTS]:
                h.close()

            async def served_then_dropped(h):
                await first_token(h)
                h.close()  # makes room for the next queued one
            await asyncio.wait_for(asyncio.gather(*map(served_then_dropped, holders[SLOTS:])),
                                   60)
        assert metric_sum(scrape(proc.url), "spectest:request_errors_total", code="429") >= 300

    asyncio.run(scenario())
    assert wait_until(lambda: load(proc.url) == (0, 0), 10)


def test_aborted_streams_free_their_slots(proc):
    async def abort_many(n: int, concurrency: int = 8) -> int:
        """Open n streams, read each to its first token, then drop the connection."""
        refused = 0
        todo = iter(range(n))
        async with aiohttp.ClientSession() as session:
            async def worker():
                nonlocal refused
                for _ in todo:
                    while True:
                        resp = await session.post(proc.url + "/v1/completions",
                                                  json=body(200))
                        if resp.status == 429:  # aborts not yet noticed: wait, retry
                            refused += 1
                            resp.release()
                            await asyncio.sleep(0.05)
                            continue
                        assert resp.status == 200
                        await first_token(resp)
                        resp.close()  # closes the connection mid-stream
                        break
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return refused

    def aborted() -> float:
        return metric_sum(scrape(proc.url), SUCCESS, finished_reason="abort")

    asyncio.run(abort_many(50))  # warm-up: allocator pools, connection handling
    assert wait_until(lambda: load(proc.url) == (0, 0), 10)
    rss_before, aborts_before = proc.rss_bytes(), aborted()

    refused = asyncio.run(abort_many(1000))

    assert wait_until(lambda: load(proc.url) == (0, 0), 10), "slots still held after aborts"
    assert wait_until(lambda: aborted() - aborts_before >= 950, 10), \
        f"only {aborted() - aborts_before} of 1000 disconnects were seen as aborts"
    growth = proc.rss_bytes() - rss_before
    print(f"\n1000 aborted streams: RSS {growth / MiB:+.1f} MiB, 429s while aborting {refused}")
    assert growth < 20 * MiB

    async def full_capacity():
        async with aiohttp.ClientSession() as session:
            async def one():
                async with session.post(proc.url + "/v1/completions",
                                        json={**body(8), "stream": False}) as resp:
                    assert resp.status == 200
                    return (await resp.json())["usage"]["completion_tokens"]
            # (QUEUE at once, not SLOTS + QUEUE: the scheduler counts requests that arrive
            # between two rounds as waiting even when slots are free)
            return await asyncio.gather(*(one() for _ in range(QUEUE)))

    assert asyncio.run(full_capacity()) == [8] * QUEUE
