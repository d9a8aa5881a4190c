"""Statistics against known values: published figures, scipy's binomial tails, hand-worked Holm."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from toolproxy.analysis.measure.stats import (
    NO_SPREAD,
    TOO_FEW_EPISODES,
    bootstrap_mean_ci,
    holm,
    mcnemar_exact,
    proportion,
    rate,
    wilson,
)

# (b, c, expected p). Expected values: scipy.stats.binomtest(b, b + c, 0.5).pvalue (scipy 1.17),
# except the first two rows, which are the figures the published studies report.
MCNEMAR = [
    (70, 25, 4.271012269463366e-06),  # published: "p ~ 4e-6"
    (66, 40, 0.01477941051703841),  # published: "p ~ 0.015"
    (0, 0, 1.0),  # no discordant pair: no evidence either way
    (1, 0, 1.0),
    (0, 1, 1.0),
    (5, 5, 1.0),
    (100, 100, 1.0),
    (49, 51, 0.9204107626128221),
    (10, 0, 0.001953125),  # 2 * 0.5**10
    (0, 10, 0.001953125),
    (12, 3, 0.03515625),
    (3, 12, 0.03515625),
    (400, 600, 2.728464156065947e-10),
    (1000, 1100, 0.03072070786424249),
    (5000, 5300, 0.003215819673645259),
    (10, 200, 4.728263442876991e-47),
    (30000, 30500, 0.042485574410371825),
]


@pytest.mark.parametrize("b,c,expected", MCNEMAR)
def test_mcnemar_exact_matches_known_values(b, c, expected):
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9)


def test_mcnemar_published_figures_round_as_published():
    assert f"{mcnemar_exact(70, 25):.0e}" == "4e-06"
    assert round(mcnemar_exact(66, 40), 3) == 0.015


def test_mcnemar_is_symmetric_and_tiny_tails_stay_finite():
    assert mcnemar_exact(7, 31) == mcnemar_exact(31, 7)
    tiny = mcnemar_exact(2, 2000)  # true p ~ 1e-597: underflows to 0, never NaN or an error
    assert 0.0 <= tiny < 1e-300 and not math.isnan(tiny)
    assert mcnemar_exact(2_000_000, 2_000_000) == 1.0


@pytest.mark.parametrize("b,c", [(-1, 3), (2.5, 1), (3, -4)])
def test_mcnemar_rejects_impossible_counts(b, c):
    with pytest.raises(ValueError):
        mcnemar_exact(b, c)


@pytest.mark.parametrize("b,c", [(0, 7), (13, 29), (250, 190), (1, 999), (37, 37), (0, 1074)])
def test_mcnemar_agrees_with_exact_integer_binomial_tail(b, c):
    """Always runs (scipy is not installed here): the two-sided tail worked in exact integers."""
    n, k = b + c, min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    expected = min(1.0, 2 * tail / 2**n)
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=0.0)


def test_mcnemar_agrees_with_scipy_when_installed():
    stats = pytest.importorskip("scipy.stats", reason="scipy is not a dependency; cross-check only")
    for b, c in [(0, 7), (13, 29), (250, 190), (1, 999)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


# (raw p-values, Holm-adjusted), worked by hand: sort, multiply the k-th smallest by (m - k + 1),
# carry the running maximum, cap at 1, restore the input order.
HOLM = [
    ([], []),
    ([0.2], [0.2]),
    ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),
    ([0.01, 0.02, 0.03], [0.03, 0.04, 0.04]),
    ([0.5, 0.6], [1.0, 1.0]),
    ([4.271012269463366e-06, 0.01477941051703841], [8.542024538926732e-06, 0.01477941051703841]),
    ([0.04, 0.04, 0.04], [0.12, 0.12, 0.12]),
]


@pytest.mark.parametrize("raw,adjusted", HOLM)
def test_holm(raw, adjusted):
    assert holm(raw) == pytest.approx(adjusted)


def test_holm_rejects_non_probabilities():
    with pytest.raises(ValueError):
        holm([0.1, 1.5])


@pytest.mark.parametrize("num,den,expected", [(3, 4, 0.75), (0, 5, 0.0), (0, 0, None), (2, 0, None)])
def test_rate(num, den, expected):
    assert rate(num, den) == expected


def test_bootstrap_is_reproducible_and_seed_dependent():
    values = [0.0, 1.0, 0.5, 1.0, 1.0, 0.2, 0.9, 0.75]
    first = bootstrap_mean_ci(values, seed=0)
    assert first == bootstrap_mean_ci(values, seed=0)
    assert first != bootstrap_mean_ci(values, seed=1)
    low, high = first
    assert low < np.mean(values) < high
    assert 0.0 <= low and high <= 1.0


def test_bootstrap_agrees_with_the_textbook_index_bootstrap():
    """Drawing counts over distinct rates is the same bootstrap as drawing episode indices."""
    rng = np.random.default_rng(11)
    produced = rng.integers(1, 9, size=400)
    values = rng.binomial(produced, 0.7) / produced
    idx = np.random.default_rng(99).integers(0, values.size, size=(20_000, values.size))
    textbook = np.percentile(values[idx].mean(axis=1), [2.5, 97.5])
    low, high = bootstrap_mean_ci(values, seed=7)
    # both are Monte Carlo estimates of the same quantiles; their error at 10,000 resamples is ~0.002 here
    assert low == pytest.approx(textbook[0], abs=0.006)
    assert high == pytest.approx(textbook[1], abs=0.006)


def test_bootstrap_of_many_episodes_is_fast():
    rng = np.random.default_rng(5)
    produced = rng.integers(1, 12, size=200_000)
    values = rng.binomial(produced, 0.6) / produced
    started = time.perf_counter()
    low, high = bootstrap_mean_ci(values)
    assert time.perf_counter() - started < 2.0
    assert low < values.mean() < high


def test_bootstrap_width_shrinks_like_one_over_root_n():
    rng = np.random.default_rng(3)
    small = rng.random(100)
    large = rng.random(10_000)  # 10,000 distinct values: also exercises the blocked draw
    w_small = np.subtract(*bootstrap_mean_ci(small)[::-1])
    w_large = np.subtract(*bootstrap_mean_ci(large)[::-1])
    assert w_large == pytest.approx(w_small / 10, rel=0.25)
    # normal-theory 95% width of a U(0,1) mean over 10,000 values: 2 * 1.96 * sqrt(1/12 / 1e4)
    assert w_large == pytest.approx(2 * 1.96 * math.sqrt(1 / 12 / 10_000), rel=0.05)


@pytest.mark.parametrize("values,expected", [([], None), ([0.4], (0.4, 0.4)), ([1.0, 1.0, 1.0], (1.0, 1.0))])
def test_bootstrap_degenerate_inputs(values, expected):
    assert bootstrap_mean_ci(values) == expected


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    """The closed form, written out independently of analysis.measure.stats (z for 95% is 1.959963984540054)."""
    z = 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = (z / (1 + z * z / n)) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


# (k, n, published interval where one exists: Newcombe 1998, Table I, method 3 / Brown, Cai & DasGupta 2001)
WILSON = [
    (81, 263, (0.2553, 0.3662)),
    (15, 148, (0.0624, 0.1605)),
    (0, 20, (0.0, 0.1611)),
    (1, 29, (0.0061, 0.1718)),
    (0, 3, None),
    (3, 3, None),
    (1, 1, None),
    (8, 10, None),
    (500, 1000, None),
]


@pytest.mark.parametrize("k,n,published", WILSON)
def test_wilson_matches_the_closed_form_and_published_values(k, n, published):
    low, high = wilson(k, n)
    ref_low, ref_high = wilson_by_hand(k, n)
    assert low == pytest.approx(max(0.0, ref_low), abs=1e-12)
    assert high == pytest.approx(min(1.0, ref_high), abs=1e-12)
    if published:
        assert (round(low, 4), round(high, 4)) == published
    assert high - low > 0.0  # never a zero-width interval, even at 0% or 100% of a handful


def test_wilson_at_the_edges_of_tiny_runs():
    assert wilson(0, 0) is None
    low, high = wilson(0, 3)
    assert low == 0.0 and f"{100 * high:.0f}" == "56"  # "0% [0-56]", never "0% [0-0]"
    low, high = wilson(3, 3)
    assert high == 1.0 and f"{100 * low:.0f}" == "44"
    with pytest.raises(ValueError):
        wilson(4, 3)


def _binomial_quantile(n: int, p: float, q: float) -> int:
    cdf = 0.0
    for x in range(n + 1):
        cdf += math.comb(n, x) * p**x * (1 - p) ** (n - x)
        if cdf >= q:
            return x
    return n


def test_bootstrap_of_pass_fail_episodes_matches_exact_binomial_quantiles():
    """With 0/1 episode rates, a resampled mean is Binomial(m, share) / m: its 2.5% and 97.5%
    quantiles are known exactly, independently of how the bootstrap draws."""
    for ones, m in ((3, 10), (6, 8), (12, 40)):
        values = [1.0] * ones + [0.0] * (m - ones)
        low, high = bootstrap_mean_ci(values, resamples=10_000, seed=7)
        assert low == _binomial_quantile(m, ones / m, 0.025) / m
        assert high == _binomial_quantile(m, ones / m, 0.975) / m


# One row per situation a real run produces: (name, numerators, denominators per episode,
# expected pooled, expected per-episode mean, rated, unrated, interval note).
PROPORTION = [
    ("all valid, two episodes", [3, 2], [3, 2], 1.0, 1.0, 2, 0, TOO_FEW_EPISODES),
    ("vLLM default: nothing to rate in any episode", [0, 0, 0], [0, 0, 0], None, None, 0, 3, None),
    ("model never calls, two episodes", [0, 0], [5, 1], 0.0, 0.0, 2, 0, TOO_FEW_EPISODES),
    ("three failing episodes: no '0% [0-0]'", [0, 0, 0], [1, 1, 1], 0.0, 0.0, 3, 0, TOO_FEW_EPISODES),
    ("five failing episodes: still no zero-width interval", [0] * 5, [2] * 5, 0.0, 0.0, 5, 0, NO_SPREAD),
    ("one long looping episode dominates pooled", [1, 1, 1, 1, 0], [1, 1, 1, 1, 96], 0.04, 0.8, 5, 0, None),
    ("refused episode left out of the mean", [1, 0], [2, 0], 0.5, 0.5, 1, 1, TOO_FEW_EPISODES),
    ("no episodes at all", [], [], None, None, 0, 0, None),
]


@pytest.mark.parametrize("name,k,n,pooled,mean,rated,unrated,note", PROPORTION, ids=[r[0] for r in PROPORTION])
def test_proportion(name, k, n, pooled, mean, rated, unrated, note):
    r = proportion(k, n)
    assert r.pooled == (pytest.approx(pooled) if pooled is not None else None)
    assert r.episode_mean == (pytest.approx(mean) if mean is not None else None)
    assert (r.episodes_rated, r.episodes_unrated) == (rated, unrated)
    assert (r.numerator, r.denominator) == (sum(k), sum(n))
    assert r.interval_note == note
    if r.pooled is None:
        assert r.wilson_low is None and r.wilson_high is None
    else:
        assert (r.wilson_low, r.wilson_high) == wilson(sum(k), sum(n))
        assert r.wilson_high > r.wilson_low
    if note is None and r.episode_mean is not None:
        assert r.ci_low <= r.episode_mean <= r.ci_high and r.ci_high > r.ci_low
    else:
        assert r.ci_low is None and r.ci_high is None


def test_proportion_rejects_inconsistent_counts():
    with pytest.raises(ValueError):
        proportion([2], [1])
    with pytest.raises(ValueError):
        proportion([1, 1], [1])
