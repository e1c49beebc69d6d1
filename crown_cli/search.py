"""Search for the certified radius: the largest eps at which the margin's lower bound is > 0.

``lower_bound(eps)`` must be a sound float64 lower bound of the margin over the eps-ball.
Only radii at which it returned a value > 0 are ever reported, so the result is a certificate
whether or not the bound is monotone in eps. ``lower_bound(0)`` is never called: at eps = 0
the ball is the single point x0 and the margin itself (> 0 for a correct prediction) is
passed in as ``g0``.

Two strategies:
- ``secant`` (default): geometric bracketing steered by secant extrapolation, then the
  Illinois variant of regula falsi with a guaranteed minimum step and bisection fallback.
- ``bisect``: the paper's procedure without its early stop: multiply/divide by 10 until
  bracketed, then plain bisection.
Both stop when the bracket [lo, hi] (lo certified, hi not) satisfies hi - lo <= rtol * lo.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

SEARCHES = ("secant", "bisect")


@dataclass
class SearchResult:
    eps: float  # largest radius verified (lower_bound(eps) > 0); 0.0 if none
    lower_bound: float  # the margin lower bound at eps (g0 if eps == 0)
    evaluations: int  # calls to lower_bound
    status: str  # "certified", "capped" (still certified at eps_max) or "not-certified"
    upper: float  # smallest radius found not certified (inf if none)


class _Counter:
    def __init__(self, fn):
        self.fn = fn
        self.n = 0

    def __call__(self, eps):
        self.n += 1
        v = float(self.fn(eps))
        return v if not math.isnan(v) else -math.inf


def certified_radius(
    lower_bound: Callable[[float], float],
    g0: float,
    eps0: float,
    rtol: float = 1e-4,
    eps_max: float = 1e4,
    eps_min: float = 1e-12,
    method: str = "secant",
    max_evals: int = 200,
) -> SearchResult:
    """Largest eps in (0, eps_max] with ``lower_bound(eps) > 0``, to relative tolerance rtol."""
    if not (rtol > 0 and eps0 > 0 and eps_max >= eps0 and eps_min > 0):
        raise ValueError("certified_radius: need rtol > 0 and 0 < eps_min, 0 < eps0 <= eps_max")
    f = _Counter(lower_bound)
    if not g0 > 0:
        return SearchResult(0.0, g0, 0, "not-certified", 0.0)
    if method == "bisect":
        lo, flo, hi, fhi = _bracket_decimal(f, g0, eps0, eps_max, eps_min, max_evals)
    elif method == "secant":
        lo, flo, hi, fhi = _bracket_secant(f, g0, eps0, eps_max, eps_min, max_evals)
    else:
        raise ValueError(f"unknown search method '{method}' (choose from {', '.join(SEARCHES)})")
    if hi is None:  # certified all the way to eps_max
        return SearchResult(lo, flo, f.n, "capped", math.inf)
    if lo == 0.0:  # nothing certified down to eps_min
        return SearchResult(0.0, g0, f.n, "not-certified", hi)
    if method == "bisect":
        lo, flo, hi = _bisect(f, lo, flo, hi, rtol, max_evals)
    else:
        lo, flo, hi = _illinois(f, lo, flo, hi, fhi, rtol, max_evals)
    return SearchResult(lo, flo, f.n, "certified", hi)


def _bracket_decimal(f, g0, eps0, eps_max, eps_min, max_evals):
    """Paper-style bracketing: x10 up while certified, /10 down while not."""
    e = eps0
    v = f(e)
    if v > 0:
        lo, flo = e, v
        while f.n < max_evals:
            if lo >= eps_max:
                return lo, flo, None, None
            e = min(lo * 10.0, eps_max)
            v = f(e)
            if v > 0:
                lo, flo = e, v
            else:
                return lo, flo, e, v
        return lo, flo, None, None
    hi, fhi = e, v
    while f.n < max_evals and hi > eps_min:
        e = hi / 10.0
        v = f(e)
        if v > 0:
            return e, v, hi, fhi
        hi, fhi = e, v
    return 0.0, g0, hi, fhi


def _bracket_secant(f, g0, eps0, eps_max, eps_min, max_evals):
    """Bracket the root steering each step by the secant through the last two points.

    Each step moves by at least a factor that starts at 2 and is squared after every step
    that failed to bracket (capped at 1e4), so the number of steps grows only like
    log log of how far eps0 is from the answer.
    """
    lo, flo = 0.0, g0
    e = eps0
    v = f(e)
    if v > 0:
        lo, flo = e, v
        prev_e, prev_v = 0.0, g0
        factor = 2.0
        while f.n < max_evals:
            if lo >= eps_max:
                return lo, flo, None, None
            slope = (flo - prev_v) / (lo - prev_e)
            guess = lo - flo / slope if -math.inf < slope < 0 else math.inf
            guess = 1.05 * guess  # aim a little past the root to bracket it
            e = min(max(guess, factor * lo), 1e4 * lo, eps_max)
            v = f(e)
            if v > 0:
                prev_e, prev_v = lo, flo
                lo, flo = e, v
                factor = min(factor * factor, 1e4)  # the secant keeps falling short: speed up
            else:
                return lo, flo, e, v
        return lo, flo, None, None
    hi, fhi = e, v
    factor = 2.0
    while f.n < max_evals and hi > eps_min:
        # secant between (0, g0) and (hi, fhi) estimates the root; aim a little below it
        guess = 0.95 * hi * g0 / (g0 - fhi) if -math.inf < fhi < 0 else 0.0
        e = min(max(guess, hi / 1e4), hi / factor)
        v = f(e)
        if v > 0:
            return e, v, hi, fhi
        hi, fhi = e, v
        factor = min(factor * factor, 1e4)  # the secant keeps overshooting: speed up
    return 0.0, g0, hi, fhi


def _bisect(f, lo, flo, hi, rtol, max_evals):
    while hi - lo > rtol * lo and f.n < max_evals:
        mid = 0.5 * (lo + hi)
        v = f(mid)
        if v > 0:
            lo, flo = mid, v
        else:
            hi = mid
    return lo, flo, hi


def _illinois(f, lo, flo, hi, fhi, rtol, max_evals):
    """Regula falsi with the Illinois modification on a bracket flo > 0 >= fhi.

    Each trial point is kept at least tol/2 from both ends (tol = rtol * lo), so once the
    root estimate is accurate one step to each side of it closes the bracket; a point
    that would not shrink the bracket by a quarter after two one-sided steps is replaced
    by the midpoint, so the worst case is within a constant of bisection.
    """
    side = 0  # +1: lo moved last, -1: hi moved last
    streak = 0
    wlo, whi = flo, fhi  # weights used for the secant (Illinois halves the stale one)
    while hi - lo > rtol * lo and f.n < max_evals:
        tol = rtol * lo
        width = hi - lo
        if wlo > 0 >= whi and math.isfinite(whi) and math.isfinite(wlo):
            e = lo + width * wlo / (wlo - whi)
        else:
            e = 0.5 * (lo + hi)
        if streak >= 3 or hi > 4.0 * lo:
            e = math.sqrt(lo * hi) if hi > 4.0 * lo else 0.5 * (lo + hi)
        e = min(max(e, lo + 0.5 * tol), hi - 0.5 * tol)
        v = f(e)
        if v > 0:
            lo, flo, wlo = e, v, v
            if side == 1:
                whi *= 0.5
                streak += 1
            else:
                streak = 0
            side = 1
        else:
            hi, fhi, whi = e, v, v
            if side == -1:
                wlo *= 0.5
                streak += 1
            else:
                streak = 0
            side = -1
    return lo, flo, hi
