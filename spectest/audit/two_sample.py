"""Check 3 calibrated: the candidate's sampled tokens against the *baseline's own* samples.

Owns: the two-sample version of :mod:`spectest.audit.distribution`'s pooled test, for servers
whose scoring route does not reproduce the distribution they decode from.

Why.  The one-sample test scores each sampled token with the baseline's echo (one prefill over
prompt and answer) and asks whether the tokens were drawn from that.  That is exact only when
the baseline's prefill computes the same distribution as its token-by-token decode.  Where the
noise floor (:mod:`spectest.audit.noise`) says it does not — int8 SmolLM2 in the bundled engine
(dynamic int8 quantises activations per batch: KL up to 0.3-0.6 nats between the two readings),
llama.cpp's Q4 CPU kernels (0.16 nats) — a few thousand tokens are enough to tell the two apart.
Measured on int8 SmolLM2: an A/A audit, the target against itself with speculation off in the
candidate (0 drafts), failed the one-sample test with p = 0.0055.  The test was measuring the
scoring route, not speculation.

How.  The baseline also samples ``samples_per_prompt`` continuations of every prompt (other
seeds, same settings) and the baseline scores them by the same route as the candidate's.  Each
token gets the same three per-token figures as in the one-sample test (PIT value u, surprise
log p + H, one-hot probability bin minus the bin masses), computed against the same, possibly
biased, scoring.  H0: the candidate samples continuations the way the baseline does.  Then the
candidate's continuations and the baseline's are exchangeable *within a prompt*, whatever the
scoring's bias, so a permutation test that reshuffles whole continuations between the two arms
within each prompt is exact: a false-positive rate of at most alpha with no model of the bias
and no independence assumption between the tokens of one continuation (under a biased scoring
they are not independent).  Statistics, Bonferroni over the three as in the one-sample test:
  * the difference in mean surprise per token (sharper or flatter than the baseline samples);
  * the two-sample Kolmogorov-Smirnov distance between the arms' PIT values;
  * the difference in probability-bin residuals per token, a quadratic form in the pooled
    per-token bin covariance (what a lossy acceptance threshold moves);
  * where either arm has tokens outside the scoring's top-k/top-p support, the difference in
    their rate (one-sided): a biased scoring puts some of the baseline's own tokens there, so
    one such token no longer proves a bug; a top-p applied to the draft only still shows as a
    higher rate than the baseline's.
The p-value of each is (1 + #{permuted >= observed}) / (1 + permutations).

Cost: the baseline's continuations double the sampled phase, and comparing two noisy arms
needs a larger shift than comparing one arm with a known distribution (about sqrt(2) in the
z-scale at equal sizes).  Measured by ``python benchmarks/audit_power.py --reps 200 --null-reps
1000 --g-reps 0 --two-reps 60 --e2e-runs 1`` (the embedded pair's sampling distributions,
default audit size, 6,604 informative tokens a side, 60 simulated audits per sampler):
detection of the seven TV-0.05 shifts min 96.7 % / mean 99.0 % (the one-sample test: 100 % /
100 %), 0 false positives in 60.  End to end, the engine's lossy-threshold fault at 16
prompts x 12 samples x 32 tokens, which the one-sample test catches, went undetected (p = 0.21:
``FAULTS["lossy-threshold"]`` of ``tests/audit/test_audit_e2e.py`` with ``--sampled-control on``).
On int8 SmolLM2 a default audit's sampled phase took 820-850 s instead of 247 s (two audits
sharing the 2 cores).  ``runner`` therefore uses it where it is needed: when the measured
noise floor widened the tolerances, or when no floor was measured (``--sampled-control auto``).

Does not know: HTTP or report files; ``distribution_check`` calls it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spectest.audit.distribution import Draw, PitResult, calibration_test

PERMUTATIONS = 1999
CHUNK = 64  # permutations evaluated at once


def test(cand: Sequence[Draw], cand_seq: Sequence[int], ctrl: Sequence[Draw],
         ctrl_seq: Sequence[int], seed: int, permutations: int = PERMUTATIONS,
         cand_outside: Sequence[tuple[int, int]] = (),
         ctrl_outside: Sequence[tuple[int, int]] = ()) -> PitResult:
    """Two-sample permutation test of candidate draws against control draws.

    ``cand`` / ``ctrl``: the informative draws of each arm; ``*_seq``: which continuation of
    its prompt each belongs to.  ``*_outside``: (prompt, continuation) of
    every token outside the scoring's support: under a biased scoring the baseline's own tokens
    land there too, so the candidate is judged by its *rate* of them against the control's
    (a fourth statistic, one-sided).  A continuation's prompt is its permutation stratum.
    """
    if not cand or not ctrl:
        return PitResult.empty()
    draws = list(cand) + list(ctrl)
    seq_index: dict[tuple[int, int, int], int] = {}  # (arm, prompt, continuation) → row

    def index(arm: int, prompt: int, sample: int) -> int:
        return seq_index.setdefault((arm, prompt, sample), len(seq_index))

    seq_of = np.array([index(0, d.prompt, k) for d, k in zip(cand, cand_seq)]
                      + [index(1, d.prompt, k) for d, k in zip(ctrl, ctrl_seq)])  # [N]
    outside = [index(0, p, k) for p, k in cand_outside] \
        + [index(1, p, k) for p, k in ctrl_outside]
    n_seq = len(seq_index)
    rows = sorted(seq_index, key=seq_index.__getitem__)
    arm = np.array([a == 0 for a, _, _ in rows])  # True: candidate [n_seq]
    stratum = np.array([prompt for _, prompt, _ in rows])  # [n_seq]
    viol = np.bincount(np.array(outside, dtype=np.int64), minlength=n_seq)  # [n_seq]
    seen = np.bincount(seq_of, minlength=n_seq) + viol  # tokens per continuation [n_seq]

    u = np.array([d.u for d in draws])  # [N]
    dev = np.array([d.logp - d.neg_entropy for d in draws])  # [N]
    mass = np.array([d.bin_mass for d in draws])  # [N, B]
    resid = np.eye(mass.shape[1])[[d.bin for d in draws]] - mass  # one-hot bin - masses [N, B]
    cov = (np.diag(mass.sum(0)) - mass.T @ mass) / len(draws)  # per-token bin covariance [B, B]
    keep = np.nonzero(mass.sum(0) > 5)[0][:-1]  # as the one-sample calibration test
    inv = np.linalg.pinv(cov[np.ix_(keep, keep)]) if len(keep) else np.zeros((0, 0))
    order = np.argsort(u, kind="stable")  # KS: the pooled PIT values in ascending order

    def stats_of(labels: np.ndarray) -> np.ndarray:
        """labels [P, n_seq] bool (True = candidate) → [P, 4]: |Δ surprise|, KS D, W, Δ rate
        of tokens outside the support."""
        tok = labels[:, seq_of].astype(np.float64)  # [P, N]
        n_c = tok.sum(1)  # [P]
        n_k = len(draws) - n_c
        shift = tok @ dev / n_c - (dev.sum() - tok @ dev) / n_k  # [P]
        d = ((tok @ resid) / n_c[:, None] - (resid.sum(0) - tok @ resid) / n_k[:, None])[:, keep]
        wald = np.einsum("pb,bc,pc->p", d, inv, d) / (1 / n_c + 1 / n_k)  # [P]
        sorted_tok = tok[:, order]  # [P, N]
        gap = (np.cumsum(sorted_tok, 1) / n_c[:, None]
               - np.cumsum(1 - sorted_tok, 1) / n_k[:, None])  # ECDF difference [P, N]
        lab = labels.astype(np.float64)  # [P, n_seq]
        rate = lab @ viol / np.maximum(lab @ seen, 1) \
            - (viol.sum() - lab @ viol) / np.maximum(seen.sum() - lab @ seen, 1)
        return np.stack([np.abs(shift), np.abs(gap).max(1), wald, rate], 1)

    observed = stats_of(arm[None])[0]  # [4]
    rng = np.random.default_rng(seed)
    exceed = np.zeros(4)
    shifts = []
    for start in range(0, permutations, CHUNK):
        perm = _shuffle_within(arm, stratum, min(CHUNK, permutations - start), rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = stats_of(perm)
        s = np.nan_to_num(s, nan=np.inf, posinf=np.inf)  # an arm with no draws: as extreme
        exceed += (s >= observed - 1e-12).sum(0)
        shifts.append(s[:, 0])
    p = (1 + exceed) / (1 + permutations)
    if not viol.any():
        p[3] = 1.0  # nothing outside the support on either side: no fourth test
    tests = 4 if viol.any() else 3
    shifts = np.concatenate(shifts)
    shifts = shifts[np.isfinite(shifts)]
    sd = float(np.sqrt(np.mean(shifts ** 2))) if len(shifts) else 0.0  # permutation sd
    mine = arm[seq_of]
    signed = float(dev[mine].mean() - dev[~mine].mean())
    return PitResult(len(cand), signed / sd if sd > 0 else 0.0, float(p[0]), float(observed[1]),
                     float(p[1]), float(observed[2]), len(keep), float(p[2]),
                     float(min(1.0, tests * p.min())), float(u[mine].mean()),
                     calibration_test(list(cand))[3], method="two-sample",
                     control_n=len(ctrl), permutations=permutations, p_support=float(p[3]),
                     tests=tests)


def _shuffle_within(arm: np.ndarray, stratum: np.ndarray, rows: int,
                    rng: np.random.Generator) -> np.ndarray:
    """``rows`` relabellings of ``arm`` [n_seq] that keep each stratum's number of candidates
    → [rows, n_seq] bool."""
    n = len(arm)
    values, counts = np.unique(stratum, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # where each stratum begins, sorted
    n_cand = np.array([arm[stratum == v].sum() for v in values])
    slot = np.repeat(np.arange(len(values)), counts)  # stratum of each sorted position [n]
    sorted_label = (np.arange(n) - first[slot]) < n_cand[slot]  # [n]
    keys = np.searchsorted(values, stratum)[None, :] + rng.random((rows, n))  # [rows, n]
    order = np.argsort(keys, 1)  # grouped by stratum, shuffled inside each
    out = np.empty((rows, n), dtype=bool)
    np.put_along_axis(out, order, np.broadcast_to(sorted_label, (rows, n)), 1)
    return out
