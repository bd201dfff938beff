"""The rational fits the accurate activation graphs use, derived again from mpmath.

``python -m bench.fits`` prints the coefficients pasted into ``service/activations.py``; a test
derives them again and checks that the shipped ones match. Two functions of a = |x| on [0, 14]
(beyond 14 every result they feed is below float32's normal range):

- the Mills ratio M(a) = Phi(-a) / phi(a), so that Phi(-a) = phi(a) M(a) has no cancellation;
- R(a) = (a - M(a)) / (a - a0), a0 the root of a = M(a) (where GELU has its minimum), so that
  GELU's derivative near that root is a product of two accurate factors, not a difference.

Each is P(a) / Q(a) with Q(0) = 1, fitted for relative error by iterated, reweighted linear
least squares on Chebyshev and uniform points; all coefficients come out positive.
"""

from __future__ import annotations

import mpmath
import numpy as np

RANGE = 14.0
DEGREES = (4, 5)  # numerator, denominator
mpmath.mp.dps = 40


def mills(a: mpmath.mpf) -> mpmath.mpf:
    return mpmath.ncdf(-a) / mpmath.npdf(a)


def gelu_root() -> mpmath.mpf:
    """a0 > 0 with a0 = M(a0): GELU'(-a0) = 0."""
    return mpmath.findroot(lambda a: a - mills(a), 0.75)


def root_quotient(a: mpmath.mpf, a0: mpmath.mpf) -> mpmath.mpf:
    if abs(a - a0) < mpmath.mpf("1e-12"):
        return mpmath.diff(lambda s: s - mills(s), a0)
    return (a - mills(a)) / (a - a0)


def rational_fit(
    values: np.ndarray, points: np.ndarray, degrees: tuple[int, int] = DEGREES
) -> tuple[list[float], list[float]]:
    """P, Q (ascending powers, Q[0] = 1) with P/Q ~ values at points, in relative error."""
    n_p, n_q = degrees
    weights = np.ones_like(points)
    vp = np.vander(points, n_p + 1, increasing=True)
    vq = np.vander(points, n_q + 1, increasing=True)[:, 1:]
    for _ in range(8):
        system = np.hstack([vp, -values[:, None] * vq]) * (weights / values)[:, None]
        solution = np.linalg.lstsq(system, weights, rcond=None)[0]
        p, q = solution[: n_p + 1], np.concatenate([[1.0], solution[n_p + 1 :]])
        weights = 1.0 / np.abs(np.polynomial.polynomial.polyval(points, q))
    return [float(c) for c in p], [float(c) for c in q]


def fit_points(n: int = 2000) -> np.ndarray:
    j = np.arange(n)
    chebyshev = (np.cos(np.pi * (j + 0.5) / n) + 1) / 2 * RANGE
    return np.concatenate([chebyshev, np.linspace(0.0, RANGE, n)])


def derive() -> dict[str, object]:
    """Every constant: a0 and the two fits, with their worst relative error in float64."""
    a0 = gelu_root()
    points = fit_points()
    check = np.linspace(0.0, RANGE, 20001)
    result: dict[str, object] = {"GELU_ROOT": float(a0)}
    for name, function in (("MILLS", mills), ("ROOT_QUOTIENT", lambda a: root_quotient(a, a0))):
        values = np.array([float(function(mpmath.mpf(float(a)))) for a in points])
        p, q = rational_fit(values, points)
        reference = np.array([float(function(mpmath.mpf(float(a)))) for a in check])
        fitted = np.polynomial.polynomial.polyval(check, p) / np.polynomial.polynomial.polyval(
            check, q
        )
        result[f"{name}_P"], result[f"{name}_Q"] = p, q
        result[f"{name}_ERROR"] = float(np.abs(fitted / reference - 1).max())
    return result


if __name__ == "__main__":
    for key, value in derive().items():
        print(f"{key} = {value!r}")
