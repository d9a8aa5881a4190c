"""The statistics behind every number a report prints: rates, Wilson and bootstrap CIs, exact McNemar, Holm.

Pure functions over plain numbers and numpy arrays, so each one is tested against known values
and the SQL side only has to count. numpy only: scipy is a heavy dependency for three formulas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

RESAMPLES = 10_000
CONFIDENCE = 0.95
# A bootstrap over fewer episodes than this says nothing (with 3 episodes there are 10 distinct
# resamples), so the per-episode mean then gets no interval and the report says why.
MIN_EPISODES = 5
TOO_FEW_EPISODES = "too few episodes"
NO_SPREAD = "every episode scored the same"
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


def bootstrap_mean_ci(
    values: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, seed: int = 0, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
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


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion; None when n is 0.

    Unlike the normal approximation it never collapses to zero width at 0% or 100% and stays
    inside [0, 1], which is what a small run needs: 0 of 3 reads [0-56], not [0-0].
    """
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n], got {successes} of {n}")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2) / (1 + z2n)
    half = z * np.sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return float(low), float(high)


@dataclass(frozen=True)
class Rate:
    """One metric of one run: numerator over denominator turns (or episodes), pooled and per episode.

    `pooled` (with its Wilson interval) is None when the denominator is empty: an undefined rate
    is never 0%. `episode_mean` weighs each episode equally over the episodes where the rate is
    defined (`episodes_rated`); its bootstrap interval `ci_low`-`ci_high` exists only for at least
    MIN_EPISODES such episodes that do not all score the same, and `interval_note` says why not.
    """

    numerator: int
    denominator: int
    pooled: float | None
    wilson_low: float | None
    wilson_high: float | None
    episode_mean: float | None
    ci_low: float | None
    ci_high: float | None
    episodes_rated: int
    episodes_unrated: int
    interval_note: str | None


def proportion(
    numerators: Sequence[int] | np.ndarray,
    denominators: Sequence[int] | np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Rate:
    """A Rate from per-episode counts (two aligned arrays, one entry per episode)."""
    k = np.asarray(numerators, dtype=np.int64)
    n = np.asarray(denominators, dtype=np.int64)
    if k.shape != n.shape or k.ndim != 1:
        raise ValueError("numerators and denominators must be 1-D arrays of equal length")
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("counts must satisfy 0 <= numerator <= denominator in every episode")
    rated = n > 0
    per_episode = k[rated] / n[rated]
    ci = note = None
    if per_episode.size < MIN_EPISODES:
        note = TOO_FEW_EPISODES if per_episode.size else None
    elif np.all(per_episode == per_episode[0]):
        note = NO_SPREAD
    else:
        ci = bootstrap_mean_ci(per_episode, resamples=resamples, seed=seed)
    total_k, total_n = int(k.sum()), int(n.sum())
    interval = wilson(total_k, total_n)
    return Rate(
        numerator=total_k,
        denominator=total_n,
        pooled=rate(total_k, total_n),
        wilson_low=interval[0] if interval else None,
        wilson_high=interval[1] if interval else None,
        episode_mean=float(per_episode.mean()) if per_episode.size else None,
        ci_low=ci[0] if ci else None,
        ci_high=ci[1] if ci else None,
        episodes_rated=int(rated.sum()),
        episodes_unrated=int((~rated).sum()),
        interval_note=note,
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
