"""The tests every comparison in an experiment report carries: the difference of two groups of runs with its 95 %
t interval, paired by seed where the runs share their seeds, Welch's otherwise, and against a constant (a floor,
or a single run such as the context-extension base) as a one-sample interval.

No SciPy: Student's t distribution is computed here, its CDF through the regularized incomplete beta function
(continued fraction, modified Lentz) and its quantile by bisection on that CDF, for any real degrees of freedom
(Welch's are not integers).

A difference whose interval contains 0 is never a ranking: :func:`phrase` writes it as
:data:`NO_DIFFERENCE`. Note what an interval here does and does not contain: the spread between seeds of this
design (a few seeds, one text, one size), nothing about other sizes or other base models.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

NO_DIFFERENCE = "no difference detected at this scale"
LEVEL = 0.95

__all__ = ["NO_DIFFERENCE", "LEVEL", "Difference", "regularized_beta", "t_cdf", "t_quantile", "paired", "welch",
           "one_sample", "compare", "phrase"]


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for ``0 <= x <= 1`` and ``a, b > 0``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"need a, b > 0, got a={a}, b={b}")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with ``df`` > 0 degrees of freedom (any real df):
    ``1 − I_{df/(df+x²)}(df/2, 1/2) / 2`` for x >= 0, by symmetry below."""
    if not df > 0:
        raise ValueError(f"need df > 0, got {df}")
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    tail = 0.5 * regularized_beta(df / (df + x * x), df / 2.0, 0.5)
    return 1.0 - tail if x >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom (bisection on :func:`t_cdf` to
    machine precision): ``t_quantile(0.975, 2)`` = 4.3027, ``t_quantile(0.975, 4)`` = 2.7764."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"need 0 < p < 1, got {p}")
    if not df > 0:
        raise ValueError(f"need df > 0, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Difference:
    """``mean(a) − mean(b)`` with its two-sided t interval.

    Attributes:
        test: ``"paired"`` (by seed: the mean and sd of the per-seed differences), ``"welch"`` (independent
            groups, Welch–Satterthwaite degrees of freedom) or ``"one-sample"`` (``a`` against a constant: a
            floor, or a single run whose own spread is unknown).
        n: pairs (paired) or runs in ``a``.
        n_other: runs in ``b`` (1 for a constant).
        estimate: the difference of the means.
        low, high: the interval.
        df: degrees of freedom of the t quantile.
        t: the statistic ``estimate / standard error`` (``inf`` when the runs agree exactly, ``nan`` for 0/0).
        level: the interval's coverage.
    """

    test: str
    n: int
    n_other: int
    estimate: float
    low: float
    high: float
    df: float
    t: float
    level: float = LEVEL

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.estimate, self.low, self.high))

    @property
    def detected(self) -> bool:
        """The interval excludes 0 (a NaN interval detects nothing)."""
        return self.finite and (self.low > 0 or self.high < 0)

    @property
    def label(self) -> str:
        """How it was tested: ``"paired by seed, n = 3"``, ``"Welch, n = 3 and 3"``, ``"one-sample, n = 3"``."""
        if self.test == "paired":
            return f"paired by seed, n = {self.n}"
        if self.test == "welch":
            return f"Welch, n = {self.n} and {self.n_other}, df = {self.df:.1f}"
        if self.test == "one-sample":
            return f"one-sample, n = {self.n}"
        return f"no test: n = {self.n} and {self.n_other}"

    def interval(self, digits: int | None = None) -> str:
        """``"+0.013 [-0.048, +0.074]"``: 3 decimals, more when the interval is narrower than ±0.005 (enough to
        show its first significant digit)."""
        if not self.finite:
            return "n/a" if not math.isfinite(self.estimate) else f"{self.estimate:+.3f} [no interval]"
        if digits is None:
            half = (self.high - self.low) / 2
            size = half if half > 0 else abs(self.estimate)
            digits = 3 if size >= 0.005 or size == 0 else min(8, max(4, -math.floor(math.log10(size))))
        return f"{self.estimate:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "detected": self.detected}


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def _nan(test: str, n: int, n_other: int, estimate: float = math.nan, level: float = LEVEL) -> Difference:
    return Difference(test, n, n_other, estimate, math.nan, math.nan, math.nan, math.nan, level)


def _interval(test: str, n: int, n_other: int, estimate: float, se: float, df: float, level: float) -> Difference:
    half = t_quantile(0.5 + level / 2, df) * se
    t = estimate / se if se > 0 else (math.nan if estimate == 0 else math.copysign(math.inf, estimate))
    return Difference(test, n, n_other, estimate, estimate - half, estimate + half, df, t, level)


def paired(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Difference:
    """The paired interval of ``mean(a − b)``: ``d̄ ± t_{(1+level)/2, n−1} · sd(d)/√n`` over the pairs
    ``d_i = a_i − b_i`` (``a`` and ``b`` in the same order, one pair per seed)."""
    if len(a) != len(b):
        raise ValueError(f"paired needs as many values on each side, got {len(a)} and {len(b)}")
    n = len(a)
    if n < 2:
        raise ValueError("paired needs at least 2 pairs")
    d = [x - y for x, y in zip(a, b)]
    if not _finite(d):
        return _nan("paired", n, n)
    return _interval("paired", n, n, statistics.fmean(d), statistics.stdev(d) / math.sqrt(n), n - 1, level)


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Difference:
    """Welch's interval of ``mean(a) − mean(b)`` for independent groups: standard error
    ``√(s_a²/n_a + s_b²/n_b)``, Welch–Satterthwaite degrees of freedom
    ``(s_a²/n_a + s_b²/n_b)² / ((s_a²/n_a)²/(n_a−1) + (s_b²/n_b)²/(n_b−1))`` (``n_a + n_b − 2`` when both
    groups have no spread, where the interval is a point)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise ValueError(f"welch needs at least 2 values on each side, got {na} and {nb}")
    if not (_finite(a) and _finite(b)):
        return _nan("welch", na, nb)
    va, vb = statistics.variance(a) / na, statistics.variance(b) / nb
    se2 = va + vb
    df = se2 ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)) if se2 > 0 else float(na + nb - 2)
    return _interval("welch", na, nb, statistics.fmean(a) - statistics.fmean(b), math.sqrt(se2), df, level)


def one_sample(a: Sequence[float], value: float, level: float = LEVEL) -> Difference:
    """The interval of ``mean(a) − value`` for a constant ``value``: ``ā − value ± t_{(1+level)/2, n−1} ·
    sd(a)/√n``. Against a single run, that run's own seed spread is unknown and not in the interval."""
    n = len(a)
    if n < 2:
        raise ValueError("one_sample needs at least 2 values")
    if not (_finite(a) and math.isfinite(value)):
        return _nan("one-sample", n, 1)
    return _interval("one-sample", n, 1, statistics.fmean(a) - value, statistics.stdev(a) / math.sqrt(n), n - 1,
                     level)


def compare(a: Mapping[int, float], b: Mapping[int, float] | float, level: float = LEVEL) -> Difference:
    """``mean(a) − mean(b)`` for runs keyed by seed: paired by seed when both sides have the same seeds (at least
    2), one-sample when ``b`` is a number or either side is a single run, Welch otherwise; without spread on
    either side (one run each) the estimate comes without an interval (``test = "none"``, NaN bounds)."""
    if len(a) < 2 and (not isinstance(b, Mapping) or len(b) < 2):  # no spread on either side: no interval
        right = float(b) if not isinstance(b, Mapping) else statistics.fmean(b.values()) if b else math.nan
        return _nan("none", len(a), 1 if not isinstance(b, Mapping) else len(b),
                    (statistics.fmean(a.values()) if a else math.nan) - right, level)
    if not isinstance(b, Mapping):
        return one_sample(list(a.values()), float(b), level)
    if len(b) == 1 and len(a) >= 2:
        return one_sample(list(a.values()), next(iter(b.values())), level)
    if len(a) == 1 and len(b) >= 2:
        flipped = one_sample(list(b.values()), next(iter(a.values())), level)
        return Difference(flipped.test, flipped.n, 1, -flipped.estimate, -flipped.high, -flipped.low, flipped.df,
                          -flipped.t, level)
    if set(a) == set(b) and len(a) >= 2:
        seeds = sorted(a)
        return paired([a[s] for s in seeds], [b[s] for s in seeds], level)
    return welch(list(a.values()), list(b.values()), level)


def phrase(diff: Difference, higher: str, lower: str, negligible: float = 0.0) -> str:
    """The reading of ``diff``: :data:`NO_DIFFERENCE` when its interval contains 0, else ``higher`` (interval
    above 0) or ``lower`` (below 0), marked negligible when the difference is smaller than ``negligible`` (a
    detected difference below the precision the report prints is not worth a ranking); ``"not testable"``
    without an interval."""
    if not diff.finite:
        return "not testable (a single run on each side, or non-finite losses)"
    if not diff.detected:
        return NO_DIFFERENCE
    reading = higher if diff.low > 0 else lower
    if abs(diff.estimate) < negligible:
        reading += f", by less than {negligible:g}: negligible"
    return reading
