"""One arm's figures for ``benchmarks/engine_speedup.py``: from the engine's round records and
its requests' stats, the arm's tokens/s (wall clock and decode), acceptance and mean accepted
length, step and round times; the bootstrap intervals of a speedup (paired requests) and of an
acceptance rate; the share of answer tokens prompt lookup could copy; and the speedup the
formula predicts from the measured acceptance and step times.

Pure functions of what a run recorded: knows nothing of how engines are built or run, of the
prompts, or of what is printed.
"""

from __future__ import annotations

import statistics

import numpy as np
from scipy import stats as stats_lib


def summarize(name, category, temperature, tokens, seconds, records, k, stats):
    """One arm's figures. ``tok_s`` is wall clock, prefill included; ``decode_tok_s`` and
    ``round_ms`` count decode only (first token → last, per request), what speculation speeds
    up and the formula models — on RAG's 1–3k-token prompts prefill is most of the wall time."""
    decode_s = sum(st.decode_time for st in stats)
    decode_tokens = tokens - len(stats)  # each request's first token comes from its prefill
    rows = [r for rec in records for r in rec.rows]
    drafted = [r for r in rows if r.k_proposed]
    proposed = sum(r.k_proposed for r in drafted)
    accepted = sum(r.accepted for r in drafted)
    spec_rounds = [rec for rec in records if any(r.k_proposed for r in rec.rows)]
    return {
        "arm": name, "workload": category, "temperature": temperature, "tokens": tokens,
        "seconds": round(seconds, 3), "tok_s": round(tokens / seconds, 1),
        "decode_tok_s": round(decode_tokens / decode_s, 1),
        "acceptance_rate": round(accepted / proposed, 3) if proposed else None,
        "mean_accepted_length": round(1 + accepted / len(drafted), 3) if drafted else None,
        "draft_ms_per_token": round(statistics.mean(r.draft_seconds / max(1, max(
            x.k_proposed for x in r.rows)) for r in spec_rounds) * 1e3, 3) if spec_rounds else None,
        "verify_ms": round(statistics.mean(r.verify_seconds for r in records) * 1e3, 3),
        # n-gram drafting proposes only where a suffix matches: the rest are plain steps
        "draft_share": round(len(spec_rounds) / len(records), 3) if records else None,
        "verify_ms_drafting": _mean_ms(r.verify_seconds for r in spec_rounds),
        "verify_ms_plain": _mean_ms(r.verify_seconds for r in records
                                    if not any(x.k_proposed for x in r.rows)),
        "draft_ms_round": _mean_ms(r.draft_seconds for r in records),
        "round_ms": round(decode_s / max(1, len(records)) * 1e3, 3),
        "k": k if name != "target-only" else 0,
    }


def copied_share(answers, n: int = 4) -> tuple[float, int]:
    """Share of answer tokens inside an n-token span that occurred earlier in the prompt or the
    answer (what prompt lookup can copy at best), and the answer tokens counted."""
    covered = total = 0
    for prompt, answer in answers:
        seq = prompt + answer
        seen: set[tuple[int, ...]] = set()
        hit = [False] * len(answer)
        for i in range(len(seq) - n + 1):
            gram = tuple(seq[i:i + n])
            if gram in seen and i + n > len(prompt):  # a repeat that reaches into the answer
                for j in range(max(i, len(prompt)), i + n):
                    hit[j - len(prompt)] = True
            seen.add(gram)
        covered += sum(hit)
        total += len(answer)
    return (covered / total if total else float("nan")), total


def _bootstrap(samples, statistic, confidence: float) -> tuple[float, float]:
    """A percentile bootstrap interval of ``statistic`` over paired (per-request) samples."""
    res = stats_lib.bootstrap(samples, statistic, paired=True, vectorized=True,
                              confidence_level=confidence, n_resamples=4000,
                              method="percentile", random_state=0)
    return round(float(res.confidence_interval.low), 3), \
        round(float(res.confidence_interval.high), 3)


def paired_interval(stats, base_stats, confidence: float = 0.95) -> tuple[float, float]:
    """A bootstrap interval of the decode speedup, resampling (prompt, repeat) pairs: each
    request of an arm is paired with the baseline's request for the same prompt and repeat, and
    the statistic is the ratio of pooled decode rates, as the headline figure is."""
    spec_tok = np.array([st.completion_tokens - 1 for st in stats], dtype=float)
    spec_s = np.array([st.decode_time for st in stats])
    base_tok = np.array([st.completion_tokens - 1 for st in base_stats], dtype=float)
    base_s = np.array([st.decode_time for st in base_stats])
    if len(spec_tok) < 2 or len(spec_tok) != len(base_tok):
        return float("nan"), float("nan")

    def ratio(st, ss, bt, bs, axis=-1):
        return (st.sum(axis) / ss.sum(axis)) / (bt.sum(axis) / bs.sum(axis))

    return _bootstrap((spec_tok, spec_s, base_tok, base_s), ratio, confidence)


def acceptance_interval(stats, confidence: float = 0.95) -> tuple[float, float]:
    """A bootstrap interval of the acceptance rate (accepted / proposed draft tokens, pooled as
    the headline figure is), resampling requests: a short answer proposes few drafts, so
    comparing workloads' acceptance needs to know how many stand behind each."""
    proposed = np.array([st.draft_tokens for st in stats], dtype=float)
    accepted = np.array([st.accepted_tokens for st in stats], dtype=float)
    if len(stats) < 2 or proposed.sum() == 0:
        return float("nan"), float("nan")

    def rate(acc, prop, axis=-1):
        return acc.sum(axis) / np.maximum(prop.sum(axis), 1)

    return _bootstrap((accepted, proposed), rate, confidence)


def _mean_ms(seconds) -> float | None:
    seconds = list(seconds)
    return round(statistics.mean(seconds) * 1e3, 3) if seconds else None


def implied_alpha(mean_accepted_length: float, k: int) -> float:
    """The i.i.d. per-position acceptance α whose (1 − α^(K+1)) / (1 − α) equals the measured
    mean accepted length (bisection). vLLM's rate accepted/proposed is not that α: it counts
    the drafts after the first rejection as rejected, so it understates α."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if (1 - mid ** (k + 1)) / (1 - mid) < mean_accepted_length:
            lo = mid
        else:
            hi = mid
    return lo


def predicted_speedup(row, base_row, k):
    """E × T_target_step / (T_draft + T_verify(K+1) + per-round overhead), over the share f of
    rounds that drafted; the other rounds are plain steps (1 token, a one-token verify):

        tokens/round = f·E + (1 − f),  round = f·T_verify(K+1) + (1 − f)·T_verify(1)
                                               + T_draft (every round, a failed lookup too)
                                               + overhead

    α is the i.i.d. acceptance implied by the measured mean accepted length of the drafting
    rounds; T_target_step is the baseline's round time; the per-round bookkeeping (sampling,
    emission) measured on the baseline (round − verify) is charged to every round as well.
    With f = 1 this is the textbook E × T_step / (K·T_draft + T_verify(K+1)).
    """
    if row["mean_accepted_length"] is None:
        return None
    alpha = implied_alpha(row["mean_accepted_length"], k)
    row["alpha_iid"] = round(alpha, 3)
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    share = row["draft_share"]
    overhead = base_row["round_ms"] - base_row["verify_ms"]
    plain_verify = row["verify_ms_plain"] or base_row["verify_ms"]
    cost = (share * row["verify_ms_drafting"] + (1 - share) * plain_verify
            + (row["draft_ms_round"] or 0) + overhead)
    tokens = share * expected + (1 - share)
    return round(tokens * base_row["round_ms"] / cost, 3)
