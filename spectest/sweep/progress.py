"""What a person watching a sweep sees: which workload, arm and step, live acceptance and TPOT.

On a terminal a rich progress bar shows the running step (``chat · spec · c=4 · 3/8``), its
elapsed time and the live figures; every finished step leaves one permanent line with its
results. When the output is not a terminal (CI, a log file) only the permanent lines are
printed, so logs stay readable. It formats; it decides nothing.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spectest.loadgen import cpu
from spectest.sweep.step import Live


def _f(v, spec: str, unit: str = "") -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    return "-" if not math.isfinite(x) else format(x, spec) + unit


class Display:
    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self._progress: Progress | None = None
        self._task = None

    # --- a step ---------------------------------------------------------------------------
    def start_step(self, workload: str, arm: str, concurrency: int, index: int, total: int,
                   planned_s: float) -> None:
        self._label = f"{workload} · {arm} · c={concurrency} · step {index}/{total}"
        if not self.console.is_terminal:
            return
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24),
                                  TimeElapsedColumn(), TextColumn("{task.fields[live]}"),
                                  console=self.console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(self._label, total=planned_s, live="starting")

    def live(self, live: Live) -> None:
        if self._progress is None:
            return
        phase = "measuring" if live.measuring else "warm-up"
        text = (f"{phase} · {live.requests} req · acceptance {_f(live.acceptance_rate, '.2f')}"
                f" · TPOT p50 {_f(live.tpot_p50_ms, '.1f', ' ms')}")
        if live.failures:
            text += f" · [red]{live.failures} failed[/red]"
        self._progress.update(self._task, completed=min(live.elapsed_s, live.planned_s),
                              live=text)

    def end_step(self, row: dict | None, note: str = "") -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if row is None:
            self.console.print(f"  {self._label}: no measurement {note}".rstrip())
            return
        fail = f" [red]{row['failures']} failed[/red]" if row.get("failures") else ""
        acc = (f" · acceptance {_f(row.get('acceptance_rate'), '.2f')} · mean accepted length "
               f"{_f(row.get('mean_accepted_length'), '.2f')}"
               if row.get("acceptance_rate") is not None else "")
        self.console.print(
            f"  {self._label}: TPOT p50 {_f(row.get('tpot_p50_ms'), '.1f')} / p99 "
            f"{_f(row.get('tpot_p99_ms'), '.1f')} ms · TTFT p99 "
            f"{_f(row.get('ttft_p99_ms'), '.0f')} ms · {_f(row.get('output_tokens_per_s'), '.0f')}"
            f" tok/s · {row.get('requests', 0)} req{fail}{acc}"
            + (f" · {note}" if note else ""))
        flag = cpu.flag_text(row.get("client_cpu"))
        if flag:
            self.console.print(f"    [yellow]warning: {flag}[/yellow]")

    # --- everything else ------------------------------------------------------------------
    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            self.console.print(text)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
