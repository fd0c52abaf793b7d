"""``spectest.procs``: a script that owns servers and is killed with SIGTERM leaves none behind.

Real processes: a parent script starts a child that shrugs off SIGTERM (as a server busy with a
graceful shutdown does; vLLM's API server forks its engine and workers and outlived a killed
example script), then the parent is sent SIGTERM. With ``exit_on_sigterm`` the parent's
``with`` block stops the child's whole process group (SIGKILL after the grace); without it the
child survives its parent — the control that shows the test can fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from spectest import procs
from spectest.procs import REPO_ROOT

STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)")

PARENT = """
import sys, time
from spectest import procs
if sys.argv[1] == "on":
    procs.exit_on_sigterm()
with procs.Child([sys.executable, "-c", {stubborn!r}], name="stubborn", log_path=sys.argv[2],
                 ready_pattern="(?m)^ready$", stop_timeout_s=1.0) as child:
    print(child.proc.pid, flush=True)
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def run_and_terminate(mode: str, log) -> int:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(stubborn=STUBBORN), mode, str(log)],
        stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.send_signal(signal.SIGTERM)
    parent.wait(30)
    return child


@pytest.mark.parametrize("mode", ["on", "off"])
def test_sigterm_to_a_script_stops_the_servers_it_owns(mode, tmp_path):
    child = run_and_terminate(mode, tmp_path / "child.log")
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        if mode == "on":
            assert not alive(child), "the child outlived its parent"
        else:  # the control: SIGTERM's default action skips the with block
            assert alive(child), "the control no longer shows the orphan: the test proves nothing"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_start_up_time_counts_from_spawn_when_children_are_waited_for_in_turn(tmp_path):
    """Servers started together and then waited for one by one: the second one's start-up is
    its own, not the time left after the first was ready."""
    from spectest.procs import Child

    # the command line heads the log and holds the pattern: only the child's output counts
    slow = "import time; time.sleep(1.5); print('UPNOW', flush=True); time.sleep(30)"
    children = [Child([sys.executable, "-c", slow], name=f"c{i}", log_path=tmp_path / f"{i}.log",
                      ready_pattern="UPNOW") for i in range(2)]
    try:
        for child in children:
            child.start()
        for child in children:
            child.wait_ready()
        assert all(child.started_s >= 1.5 for child in children), \
            [child.started_s for child in children]
    finally:
        for child in children:
            child.stop()


def test_sigterm_inside_the_block_is_ctrl_c_even_where_sigint_is_ignored():
    """A cancelled CI job's SIGTERM stops a command as Ctrl-C does, whatever SIGINT's
    disposition (a job a script started in the background ignores SIGINT), and the handler
    before the block is back after it."""
    before_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    before_term = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            with procs.sigterm_as_interrupt():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises before this ends
        assert signal.getsignal(signal.SIGTERM) is before_term
    finally:
        signal.signal(signal.SIGINT, before_int)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop
def test_a_sigterm_python_dropped_in_a_finalizer_is_raised_again_by_check():
    """Python drops an exception raised while a ``__del__`` runs: the handler's interrupt is
    lost there, and the flag it set is what a loop's ``check`` raises again."""
    class Finalizer:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)  # the handler runs here; its KeyboardInterrupt is dropped

    with procs.sigterm_as_interrupt() as terminated:
        Finalizer()  # collected at once
        assert terminated.signalled
        with pytest.raises(KeyboardInterrupt):
            terminated.check()
