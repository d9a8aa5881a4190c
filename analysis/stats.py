"""The statistics behind every number a report prints: fidelity, bootstrap CI, exact McNemar, Holm.

Pure functions over plain numbers and numpy arrays, so each one is tested against known values
and the SQL side only has to count. numpy only: scipy is a heavy dependency for three formulas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

RESAMPLES = 10_000
CONFIDENCE = 0.95
# Bootstrap count matrices are drawn in blocks of at most this many cells, so 10,000 resamples of
# a run with many distinct rates stay within a few tens of MB instead of resamples x rates at once.
_BLOCK_CELLS = 1 << 22
# One multinomial cell costs about as much as this many index draws (numpy 2, measured).
_MULTINOMIAL_COST = 10


def rate(numerator: int, denominator: int) -> float | None:
    """A share, or None when there is nothing to share: 0 of 0 is undefined, not 0%."""
    return numerator / denominator if denominator else None


def _means_by_index(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The textbook draw: m episode indices with replacement per resample."""
    means = np.empty(resamples)
    rows = max(1, _BLOCK_CELLS // x.size)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        means[start:stop] = x[rng.integers(0, x.size, size=(stop - start, x.size))].mean(axis=1)
    return means


def _means_by_counts(distinct: np.ndarray, counts: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The same bootstrap drawn as how many times each distinct value is picked (a multinomial)."""
    m = int(counts.sum())
    means = np.empty(resamples)
    rows = max(1, _BLOCK_CELLS // distinct.size)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        means[start:stop] = rng.multinomial(m, counts / m, size=stop - start) @ distinct / m
    return means


def bootstrap_mean_ci(values: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                      confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of `values` (one value per episode).

    Episodes, not turns, are resampled: turns of one episode are not independent (one looping
    episode is many correlated turns), so the episode is the unit that could have come out
    differently. A resample is a multinomial draw of how often each episode is picked, and
    episodes with equal rates pool their cells, so when rates repeat (they are ratios of small
    counts: 100,000 episodes hold a few dozen distinct rates) counts over the distinct rates are
    drawn instead of indices: the same bootstrap at a fraction of the cost. The draw depends only
    on (values, resamples, seed): reports are reproducible.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    rng = np.random.default_rng(seed)
    distinct, counts = np.unique(x, return_counts=True)
    if distinct.size * _MULTINOMIAL_COST < x.size:
        means = _means_by_counts(distinct, counts, rng, resamples)
    else:
        means = _means_by_index(x, rng, resamples)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Fidelity:
    """Protocol fidelity of one run: valid_call turns over the turns the model produced.

    Non-responses (the model never answered: refusals, 5xx, timeouts) are kept out of the
    denominator and reported as their own rate, so a serving failure never reads as a model
    that made no call. Every rate is None when its denominator is empty ("rej" when the model
    produced nothing at all).
    """

    turns: int
    produced: int
    valid: int
    non_responses: int
    pooled: float | None
    non_response_rate: float | None
    episode_mean: float | None
    ci_low: float | None
    ci_high: float | None
    episodes_rated: int
    episodes_unrated: int


def fidelity(valid: Sequence[int] | np.ndarray, produced: Sequence[int] | np.ndarray,
             non_responses: Sequence[int] | np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> Fidelity:
    """Fidelity from per-episode counts (three aligned arrays, one entry per episode).

    The per-episode mean weighs each episode equally; episodes in which the model produced no
    turn have no rate and are left out of that mean (and counted in `episodes_unrated`).
    """
    v = np.asarray(valid, dtype=np.int64)
    p = np.asarray(produced, dtype=np.int64)
    n = np.asarray(non_responses, dtype=np.int64)
    if not (v.shape == p.shape == n.shape) or v.ndim != 1:
        raise ValueError("valid, produced and non_responses must be 1-D arrays of equal length")
    if np.any(v > p) or np.any(v < 0) or np.any(n < 0):
        raise ValueError("counts must be non-negative and valid <= produced in every episode")
    rated = p > 0
    per_episode = v[rated] / p[rated]
    ci = bootstrap_mean_ci(per_episode, resamples=resamples, seed=seed)
    total_valid, total_produced, total_nr = int(v.sum()), int(p.sum()), int(n.sum())
    return Fidelity(
        turns=total_produced + total_nr,
        produced=total_produced,
        valid=total_valid,
        non_responses=total_nr,
        pooled=rate(total_valid, total_produced),
        non_response_rate=rate(total_nr, total_produced + total_nr),
        episode_mean=float(per_episode.mean()) if per_episode.size else None,
        ci_low=ci[0] if ci else None,
        ci_high=ci[1] if ci else None,
        episodes_rated=int(rated.sum()),
        episodes_unrated=int((~rated).sum()),
    )


def _log_binom_pmf_half(n: int, k_max: int) -> np.ndarray:
    """log P(X = i) for X ~ Binomial(n, 1/2), i = 0..k_max, without factorials.

    log C(n, i) is a running sum of log((n - j + 1) / j), so nothing overflows for n in the
    millions and the whole vector is computed at once.
    """
    j = np.arange(1, k_max + 1, dtype=float)
    log_comb = np.concatenate(([0.0], np.cumsum(np.log(n - j + 1) - np.log(j))))
    return log_comb - n * np.log(2.0)


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p from the two discordant counts.

    Under the null each discordant pair is a fair coin, so p = min(1, 2 * P(X <= min(b, c))) with
    X ~ Binomial(b + c, 1/2). The tail is summed in log space (log-sum-exp), which stays exact to
    float precision where the chi-square approximation or naive factorials would not.
    """
    if b < 0 or c < 0 or int(b) != b or int(c) != c:
        raise ValueError(f"discordant counts must be non-negative integers, got b={b}, c={c}")
    n, k = int(b) + int(c), int(min(b, c))
    if n == 0:
        return 1.0
    logs = _log_binom_pmf_half(n, k)
    top = logs.max()
    log_tail = top + np.log(np.exp(logs - top).sum())
    return float(min(1.0, 2.0 * np.exp(log_tail)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order.

    Controls the family-wise error when several categories are compared at once, and is never
    less powerful than Bonferroni. The k-th smallest p is multiplied by (m - k + 1), then made
    monotone so an adjusted p never falls below the one before it.
    """
    p = np.asarray(pvalues, dtype=float)
    m = p.size
    if m == 0:
        return []
    if np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError("p-values must lie in [0, 1]")
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted.tolist()
