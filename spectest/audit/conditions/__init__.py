"""The conditions an audit's checks run under, and the profiles that choose them.

Speculative-decoding bugs that reach production are conditional: a server exact on a fresh
prompt in an idle batch goes wrong only in mixed batches under load, after a prefix-cache hit,
deep into long outputs or conversations, for one sampling parameter, or when its KV cache
preempts. The base audit (``runner``: fresh prompts of at most 192 tokens, 48 greedy tokens,
one sampling setting, no other traffic) reaches none of these; each condition here puts the
checks where one of them lives:

* ``load`` — under background workload traffic (``conditions.load``);
* ``prefix-reuse`` — prompts sharing a long prefix, cold and warm (``conditions.prefix``);
* ``long`` — long outputs, long prompts, multi-turn histories (``conditions.long``);
* ``params`` — a ladder of sampling settings (``conditions.params``);
* ``preemption`` — more than the KV cache holds (``conditions.preemption``).

Owns: the table of conditions (:data:`TABLE`), running the planned ones in order
(:func:`run_all`) and the number of statistical tests an audit runs (:func:`statistical_tests`),
over which the audit's false-alarm rate is split (Bonferroni: each test at alpha / m, so the
audit as a whole alarms on a correct candidate at most alpha of the time).

Does not know: report files (``gate``) or the base audit's phases (``runner``).
"""

from __future__ import annotations

from spectest.audit.conditions import load, long, params, prefix, preemption
from spectest.audit.conditions.common import ConditionResult, Context
from spectest.audit.settings import AuditSettings

BASE_TITLE = ("base: fresh prompts of at most --max-prompt-tokens tokens, --greedy-tokens greedy "
              "tokens, one sampling setting, no other traffic")
TABLE = {  # name → (title, run, statistical tests it runs when the distribution check is on)
    "load": (load.TITLE, load.run, 1),
    "prefix-reuse": (prefix.TITLE, prefix.run, 1),
    "long": (long.TITLE, long.run, 0),
    "params": (params.TITLE, params.run, params.STATISTICAL),
    "preemption": (preemption.TITLE, preemption.run, 0),
}


def statistical_tests(s: AuditSettings) -> int:
    """How many sampled-distribution tests the planned conditions run (base included)."""
    if "distribution" not in s.checks:
        return 0
    return ("base" in s.planned) + sum(TABLE[c][2] for c in s.planned if c in TABLE)


async def run_all(ctx: Context, names, progress=None) -> list[ConditionResult]:
    """Each named condition in turn (``progress(i, name, results)`` before each: the ETA)."""
    results = []
    for i, name in enumerate(names):
        if progress is not None:
            progress(i, name, results)
        title, run, _ = TABLE[name]
        results.append(await run(ctx, ConditionResult(name, title)))
    return results
