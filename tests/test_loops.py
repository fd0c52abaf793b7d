"""``loops.cancelled_on``: a signal cancels a command's coroutine as Ctrl-C does — its
``finally`` runs, the caller gets ``CancelledError`` — and the handlers before are back after."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from spectest.loops import cancelled_on


def test_a_signal_cancels_the_coroutine_and_its_finally_runs():
    seen = []
    before = signal.getsignal(signal.SIGUSR1)

    async def work():
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            await asyncio.sleep(10)
            seen.append("ran on")
        finally:
            seen.append("finally")

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled_on((signal.SIGUSR1,), work()))
    assert seen == ["finally"]
    assert signal.getsignal(signal.SIGUSR1) is before


def test_without_the_signal_the_result_comes_back_and_nothing_is_left_installed():
    before = signal.getsignal(signal.SIGUSR1)

    async def work():
        await asyncio.sleep(0)
        return 42

    assert asyncio.run(cancelled_on((signal.SIGUSR1,), work())) == 42
    assert asyncio.run(cancelled_on((), work())) == 42
    assert signal.getsignal(signal.SIGUSR1) is before
