"""Run the documentation's commands as written, and keep the list of what ran.

Owns: one scratch folder for the whole session (links to the checkout's tracked files and to the
virtual environment running the tests as ``.venv``, so a command's outputs never land in the
checkout), one shell state per page (the variables, exports and folder its lines leave behind, as
in the reader's terminal), the servers a page's commands start, and the ledger.

What the harness changes, and nothing else:

* ports — every ``127.0.0.1:N``, ``localhost:N`` and ``--port N`` of a page moves to a free port
  (one per page and number); a server written without ``--port`` gets one;
* paths a page's ``replace`` marker names (:mod:`tests.docs.pages`);
* ``SPECTEST_SMOKE=1`` in the environment: token sizes for sweeps, Locust steps, audits
  (:mod:`spectest.smoke`);
* servers (``spectest serve``, vLLM, llama-server, SGLang: :data:`SERVERS`) start in the
  background whether written with ``&`` or not (a reader gives a foreground server its own
  terminal); servers on consecutive lines start together, and the next other line waits until
  each answers ``/health``; a server is stopped when a later line starts another on its port
  (the reader's Ctrl-C) and when the page ends.

A command must exit 0 — ``spectest audit`` 0 or 1, which are verdicts (pass, drift found or
candidate failed); 2 is "could not run". A command that fails ends its block; the page's later
blocks still run, except the commands whose server failed to start.

**Same command, same servers.** The quick starts repeat the README's lines on purpose. A command
whose text, variables and servers (the text of the lines that started the servers it talks to)
are exactly those of a command that already ran clean in this session is listed as the same, not
run again; a server line is then started only when a command that does run needs it. Change one
copy and it no longer matches, so it runs. Pages run in :data:`PAGES` order.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from spectest import procs
from spectest.smoke import ENV as SMOKE_ENV
from spectest.thirdparty.llama_server import find_llama_server
from spectest.thirdparty.vllm_server import find_vllm_python
from tests.docs.pages import Block, read_page

ROOT = Path(__file__).resolve().parents[2]
# the quick starts before the README, whose vLLM and llama.cpp lines they repeat
PAGES = ("docs/llamacpp.md", "docs/vllm.md", "docs/quickstart.md", "README.md")
# name, pattern on the command (after its VAR=value prefixes, variables expanded), default port
SERVERS = (("spectest serve", re.compile(r"^spectest serve(\s|$)"), 8000),
           ("vLLM", re.compile(r"vllm\.entrypoints\.openai\.api_server|^vllm serve\s"), 8000),
           ("llama-server", re.compile(r"^\S*llama-server(\s|$)"), 8080),
           ("SGLang", re.compile(r"sglang\.launch_server"), 30000))
# third-party servers a block may need, how to tell it is installed, how to install it
THIRD_PARTY = {"vLLM": (find_vllm_python, "scripts/install_vllm.sh"),
               "llama-server": (find_llama_server, "scripts/install_llama_server.sh")}
VERDICT_EXITS = {"spectest audit": (0, 1)}
VERDICT = re.compile(r"\b(PASS \(exit 0\)|DRIFT FOUND \(exit 1\)|CANDIDATE FAILED \(exit 1\)|"
                     r"COULD NOT RUN \(exit 2\))")
COMMAND_TIMEOUT_S = 900.0
SERVER_TIMEOUT_S = 600.0  # vLLM compiles its model at start-up: minutes on 2 busy cores
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
CLIENT_PORT = re.compile(r"(?:127\.0\.0\.1|localhost):(\d{2,5})\b")
SERVER_PORT = re.compile(r"--port[ =](\d{2,5})\b")
SHELL_STATE = (".", "source", "cd", "export")
COMPOUND = re.compile(r"\s(?:&&|\|\||;)\s")
HIDDEN_ENV = {"_", "SHLVL", "PWD", "OLDPWD"}
SETUP = re.compile(r"scripts/(setup|demo)\.sh")


@dataclass
class Record:
    """One command's line in the ledger."""
    where: str  # page:line
    block: str  # page:line of the block's fence
    text: str  # as written
    status: str  # ran | failed | skipped | same | not reached
    rc: int | None = None
    seconds: float = 0.0
    note: str = ""

    def line(self) -> str:
        head = f"{self.status:<11} {self.where:<24}"
        rc = "" if self.rc is None else f"exit {self.rc}, "
        timing = f"{rc}{self.seconds:.1f} s" if self.status in ("ran", "failed") else ""
        note = f" — {self.note}" if self.note else ""
        cut = self.text if len(self.text) <= 90 else self.text[:87] + "..."
        return f"{head} {timing:<16} {cut}{note}"


@dataclass
class Server:
    doc_port: int
    port: int
    record: Record
    key: tuple
    text: str  # the command that starts it, ports moved, without its &
    name: str = "server"
    state: str = "pending"  # pending | starting | live | failed | skipped | stopped
    child: procs.Child | None = None
    why: str = ""  # skipped / failed: the reason
    t0: float = 0.0  # when it was spawned


def words(text: str) -> list[str]:
    """Shell words, split on blanks outside quotes, ``$( )`` and backquotes (enough to tell an
    assignment, a command word and its arguments apart; nothing is expanded)."""
    out, cur, quote, depth, escaped = [], "", "", 0, False
    for i, ch in enumerate(text):
        if escaped:
            cur, escaped = cur + ch, False
            continue
        if ch == "\\" and quote != "'":
            cur, escaped = cur + ch, True
            continue
        if quote:
            cur += ch
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"`":
            quote = ch
        elif ch == "(" and (depth or text[i - 1:i] == "$"):
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif ch.isspace() and not depth:
            if cur:
                out.append(cur)
            cur = ""
            continue
        cur += ch
    if cur:
        out.append(cur)
    return out


def fresh_terminal(env: dict[str, str]) -> dict[str, str]:
    """``env`` as a new terminal has it: no virtual environment active."""
    out = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT")}
    venv_bin = os.path.join(sys.prefix, "bin")
    if sys.prefix != sys.base_prefix:
        out["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if os.path.realpath(p) != os.path.realpath(venv_bin))
    return out


def scratch_folder(work: Path, root: Path = ROOT) -> Path:
    """A folder whose entries link to the checkout's tracked top-level files, plus ``.venv``
    linking to the environment running the tests."""
    scratch = work / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                                 check=True).stdout.split()
        names = sorted({t.split("/")[0] for t in tracked})
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything
        names = sorted(p.name for p in root.iterdir() if p.name not in (".git", ".venv"))
    for name in names:
        if (root / name).exists() and not (scratch / name).exists():
            (scratch / name).symlink_to(root / name)
    if sys.prefix != sys.base_prefix and not (scratch / ".venv").exists():
        (scratch / ".venv").symlink_to(Path(sys.prefix))
    return scratch


class Session:
    """The harness for one test session: the scratch folder, the ledger, the commands that
    already ran clean (by key)."""

    def __init__(self, work: Path, in_ci: bool, root: Path = ROOT):
        self.work, self.root = Path(work), Path(root)
        self.scratch = scratch_folder(self.work, self.root)
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.in_ci = in_ci
        self.records: list[Record] = []
        self.clean: dict[tuple, Record] = {}
        # scripts run where the tests run; a page starts in a terminal of its own, without the
        # virtual environment: a page that needs it activates it, as its reader must
        self.script_env = {**os.environ, SMOKE_ENV: "1", "PYTHONUNBUFFERED": "1"}
        self.env = fresh_terminal(self.script_env)
        # scripts/setup.sh (demo.sh runs it) must find the environment set up for this checkout,
        # or it would reinstall spectest from the scratch folder into it
        ready = subprocess.run([sys.executable, str(ROOT / "scripts" / "venv_ready.py")],
                               capture_output=True, text=True, env=self.script_env)
        self.setup_refused = "" if ready.returncode == 0 else (
            f"the tests' environment is not set up for this checkout ({ready.stdout.strip()}): "
            f"scripts/setup.sh would reinstall spectest into it from the scratch folder")
        self._n = 0

    def log_path(self, where: str) -> Path:
        self._n += 1
        return self.logs / f"{self._n:03d}-{re.sub(r'[^A-Za-z0-9]+', '-', where)}.log"

    def run_page(self, page: str) -> list[Record]:
        """Every shell block of ``page``, in order; returns the page's records."""
        first = len(self.records)
        run = PageRun(self, page)
        try:
            for block in read_page(self.root, page):
                run.block(block)
        finally:
            run.stop_servers()
        return self.records[first:]

    def run_script(self, script: str, command: str, needs: str = "") -> Record:
        """A script the docs name, in its short mode (``{out}``: a folder of its own)."""
        out = self.work / "scripts" / Path(script).stem
        text = command.format(out=out)
        rec = Record(script, script, text, "")
        self.records.append(rec)
        if needs and not self.in_ci and THIRD_PARTY[needs][0]() is None:
            rec.status = "skipped"
            rec.note = f"{needs} is not installed here: run {THIRD_PARTY[needs][1]} (CI does)"
            return rec
        run = PageRun(self, script)
        run.env = dict(self.script_env)
        run.execute(text, rec, state=False)
        return rec


class PageRun:
    """One page, as one reader's terminal: its variables, folder, ports and servers."""

    def __init__(self, session: Session, page: str):
        self.s = session
        self.page = page
        self.env = dict(session.env)
        self.cwd = session.scratch
        self.ports: dict[int, int] = {}
        self.servers: dict[int, Server] = {}
        self.assigned: dict[str, str] = {}  # variable → the line that set it (for keys)
        self.starting: list[Server] = []  # spawned, /health not waited for yet

    # --- the text of a command -------------------------------------------------------------
    def port(self, doc_port: int) -> int:
        if doc_port not in self.ports:
            self.ports[doc_port] = procs.free_port()
        return self.ports[doc_port]

    def moved(self, text: str) -> str:
        text = CLIENT_PORT.sub(lambda m: m.group(0).replace(m.group(1),
                                                            str(self.port(int(m.group(1))))),
                               text)
        return SERVER_PORT.sub(lambda m: m.group(0).replace(m.group(1),
                                                            str(self.port(int(m.group(1))))),
                               text)

    def server_kind(self, text: str, env: dict | None = None) -> tuple[str, int] | None:
        env = self.env if env is None else env
        rest = words(text)
        while rest and ASSIGNMENT.match(rest[0]):
            rest = rest[1:]
        if not rest or rest[0] in SHELL_STATE:
            return None
        command = VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), " ".join(rest))
        for name, pattern, default in SERVERS:
            if pattern.search(command):
                found = SERVER_PORT.search(text)
                return name, int(found.group(1)) if found else default
        return None

    def is_state(self, text: str) -> bool:
        """Does the line (or a part of a ``&&`` / ``;`` list) set variables or the folder for
        the lines after it? Such a line always runs, and what it leaves is kept."""
        for part in COMPOUND.split(text):
            w = words(part)
            if w and (w[0] in SHELL_STATE or all(ASSIGNMENT.match(x) for x in w)):
                return True
        return False

    def key(self, text: str) -> tuple:
        names = sorted(set(VARIABLE.findall(text)))
        variables = tuple((n, self.assigned.get(n, "")) for n in names)
        ports = sorted({int(p) for p in CLIENT_PORT.findall(text)})
        servers = tuple((p, self.servers[p].key if p in self.servers else None) for p in ports)
        here = os.path.relpath(self.cwd, self.s.scratch)
        return " ".join(text.split()), here, variables, servers

    # --- running ---------------------------------------------------------------------------
    def block(self, block: Block) -> None:
        where = block.where
        why = block.skip or self.missing_third_party(block)
        failed = ""
        for cmd in block.commands:
            text = cmd.foreground_text
            for old, new in block.replace:
                text = text.replace(old, new)
            rec = Record(f"{self.page}:{cmd.line}", where, cmd.text, "")
            self.s.records.append(rec)
            kind = self.server_kind(text)
            parts = COMPOUND.split(text)
            if not (why or cmd.skip or failed) and len(parts) > 1 and any(
                    self.server_kind(p) for p in parts):
                rec.status = "failed"
                rec.note = "a server inside a compound command: give it a line of its own"
                failed = f"line {cmd.line} failed"
            elif why or cmd.skip:
                rec.status, rec.note = "skipped", why or cmd.skip
                if kind:
                    self.claim(kind[1], text, rec, state="skipped", why=rec.note)
            elif failed:
                rec.status, rec.note = "not reached", failed
            elif kind:
                self.server(kind, text, rec)
            else:
                failed = self.settle()  # servers started by the lines above answer first
                if failed:
                    rec.status, rec.note = "not reached", failed
                    continue
                self.command(text, rec)
                if rec.status == "failed":
                    failed = f"line {cmd.line} failed"
        self.settle()

    def missing_third_party(self, block: Block) -> str:
        if self.s.in_ci:
            return ""  # CI installs them: missing means broken, and the commands say so
        seen = dict(self.env)  # the block's own plain assignments, read before it runs
        for cmd in block.commands:
            for w in words(cmd.text) if self.is_state(cmd.text) else ():
                if ASSIGNMENT.match(w) and "$(" not in w:
                    name, value = w.split("=", 1)
                    seen[name] = os.path.expanduser(value.strip("'\""))
            kind = self.server_kind(cmd.foreground_text, seen)
            for name, (find, install) in THIRD_PARTY.items():
                if (kind and kind[0] == name or install in cmd.text) and find() is None:
                    return f"{name} is not installed here: run {install} (CI does)"
        return ""

    def claim(self, doc_port: int, text: str, rec: Record, state: str = "pending",
              why: str = "") -> Server:
        """A server line takes its port: the one that held it stops (the reader's Ctrl-C)."""
        old = self.servers.get(doc_port)
        if old is not None and old.state == "starting":
            self.settle()  # it answers (or fails) before the reader stops it
        if old is not None and old.child is not None:
            old.child.stop()
            old.state = "stopped"
        server = Server(doc_port, self.port(doc_port), rec, self.key(text), self.moved(text),
                        state=state, why=why)
        self.servers[doc_port] = server
        return server

    def server(self, kind: tuple[str, int], text: str, rec: Record) -> None:
        name, doc_port = kind
        if not SERVER_PORT.search(text):
            text = f"{text} --port {doc_port}"  # the default port, written out to be moved
        server = self.claim(doc_port, text, rec)
        server.name = name
        same = self.s.clean.get(server.key)
        if same is not None:
            rec.status, rec.note = "same", (f"same command as {same.where}, which started "
                                            f"there; started here only when a line needs it")
            return
        self.spawn(server)

    def spawn(self, server: Server) -> None:
        """Start a server without waiting: servers on consecutive lines start together, as
        the reader's ``&`` lines do; :meth:`settle` waits for them."""
        rec = server.record
        log = self.s.log_path(rec.where)
        server.child = procs.Child(["bash", "-c", server.text],
                                   name=f"{server.name} ({rec.where})", log_path=log,
                                   env=self.env, cwd=self.cwd,
                                   url=f"http://127.0.0.1:{server.port}", health_path="/health",
                                   start_timeout_s=SERVER_TIMEOUT_S)
        server.t0, server.state = time.monotonic(), "starting"
        self.starting.append(server)
        try:
            server.child.start()
        except procs.ChildError as exc:
            self._failed(server, str(exc))

    def settle(self) -> str:
        """Wait until every server spawned so far answers ``/health``; "" or what failed."""
        failed = []
        for server in self.starting:
            rec = server.record
            if server.state == "starting":
                try:
                    server.child.wait_ready()
                except procs.ChildError as exc:
                    self._failed(server, str(exc))
                else:
                    server.state = "live"
                    took = time.monotonic() - server.t0
                    ready = (f"{server.name} answered /health after {took:.0f} s "
                             f"(log: {server.child.log_path.name})")
                    if rec.status == "same":
                        rec.note += f"; {ready}"
                    else:
                        rec.status, rec.seconds, rec.note = "ran", took, ready
                        self.s.clean[server.key] = rec
            if server.state == "failed":
                failed.append(f"the server of {rec.where} did not start")
        self.starting = []
        return "; ".join(failed)

    def _failed(self, server: Server, why: str) -> None:
        server.state, server.why = "failed", why
        if server.record.status != "same":
            server.record.status, server.record.note = "failed", why
            server.record.seconds = time.monotonic() - server.t0

    def command(self, text: str, rec: Record) -> None:
        if self.s.setup_refused and SETUP.search(text):
            rec.status = "failed" if self.s.in_ci else "skipped"
            rec.note = self.s.setup_refused
            return
        ports = sorted({int(p) for p in CLIENT_PORT.findall(text)})
        state = self.is_state(text)
        key = self.key(text)
        same = None if state else self.s.clean.get(key)
        if same is not None:
            rec.status, rec.note = "same", f"same command and servers as {same.where}"
            return
        for p in ports:  # the servers it talks to: started now if they were left pending
            server = self.servers.get(p)
            if server is None:
                continue
            if server.state == "skipped":
                rec.status, rec.note = "skipped", f"its server ({server.record.where}) is " \
                                                  f"skipped: {server.why}"
                return
            if server.state == "pending":
                server.record.note += f"; started for {rec.where}"
                self.spawn(server)
        self.settle()
        for p in ports:
            server = self.servers.get(p)
            if server is not None and server.state == "failed":
                rec.status, rec.note = "not reached", (f"its server ({server.record.where}) "
                                                       f"did not start: {server.why}")
                return
        self.execute(self.moved(text), rec, state)
        if rec.status == "ran" and not state:
            self.s.clean[key] = rec
        if rec.status == "ran" and state:
            for w in words(text):
                if ASSIGNMENT.match(w):
                    self.assigned[w.split("=", 1)[0]] = text

    def execute(self, text: str, rec: Record, state: bool) -> None:
        log = self.s.log_path(rec.where)
        dump = log.with_suffix(".env")
        script = f"set -a\n{text}\nrc=$?\npwd > {dump}.pwd\nenv -0 > {dump}\nexit $rc" \
            if state else text
        t0 = time.monotonic()
        with open(log, "w", encoding="utf-8") as out:
            out.write(f"$ {text}\n")
            out.flush()
            proc = subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd,
                                    start_new_session=True)
            try:
                rc = proc.wait(COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = None
        rec.seconds, rec.rc = time.monotonic() - t0, rc
        _kill_group(proc)  # what it left running in the background
        output = log.read_text(errors="replace")
        allowed = next((codes for prefix, codes in VERDICT_EXITS.items()
                        if text.startswith(prefix)), (0,))
        verdict = VERDICT.search(output)
        if rc in allowed:
            rec.status = "ran"
            rec.note = verdict.group(1) if verdict else ""
        else:
            rec.status = "failed"
            why = "timed out" if rc is None else f"exit {rc}"
            rec.note = f"{why}: {procs.log_tail(log, 8)} (log: {log})"
        if state and rec.status == "ran":
            self.env = dict(x.split("=", 1) for x in dump.read_text().split("\0") if "=" in x
                            and x.split("=", 1)[0] not in HIDDEN_ENV)
            self.cwd = Path(Path(f"{dump}.pwd").read_text().strip())

    def stop_servers(self) -> None:
        for server in self.servers.values():
            if server.child is not None:
                server.child.stop()
                server.state = "stopped"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(10)


def ledger(records: list[Record]) -> str:
    """The list of every command: blocks in page order, each with its commands."""
    lines, block = [], None
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.status] = counts.get(rec.status, 0) + 1
        if rec.block != block:
            block = rec.block
            statuses = {r.status for r in records if r.block == block}
            verdict = ("FAILED" if statuses & {"failed", "not reached"} else
                       "skipped" if statuses == {"skipped"} else "ran")
            lines.append(f"block {block}: {verdict}")
        lines.append("  " + rec.line())
    total = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return "\n".join(lines + [f"{len(records)} commands: {total}"])
