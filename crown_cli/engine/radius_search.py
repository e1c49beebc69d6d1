"""Search for the certified radius: the largest eps at which the margin's lower bound is > 0.

``lower_bound(eps)`` must be a sound lower bound of the margin over the eps-ball. Only radii
at which it returned a value > 0 are ever reported, so the result is a certificate whether or
not the bound is monotone in eps. ``lower_bound(0)`` is never called: at eps = 0 the ball is
the single point x0 and the margin itself (> 0 for a correct prediction) is passed as ``g0``.

Two strategies, both stopping when the bracket [lo, hi] (lo certified, hi not) satisfies
hi - lo <= rtol * lo:

- ``interp`` (default): bracketing steered by a power law of the drop g0 - bound (of a lower
  degree going up than going down), then quadratic interpolation through the three
  evaluated points nearest the bracket, on log-log axes of the drop against eps (where the
  drop, linear near 0 and a high power once neurons turn unstable, is nearly straight), with
  the same on linear axes as the fallback. Once successive
  estimates of the root agree to within PAIR_STEP * rtol (near the root the error of an
  estimate is of the order of its last change squared), it probes just below and just above the
  estimate, which usually closes the bracket in two evaluations; while one end of the bracket
  keeps moving, probes aim past the estimate by its last change. Safeguards: every probe stays
  inside the bracket, and a bracket that does not halve within three steps is bisected
  (geometrically when hi > 4 lo), so the worst case stays within a constant of bisection.
  Every step of the bracketing moves by at least a factor (going up 1.05, going down 1/0.9
  and then 2) that is squared after each step that failed to bracket, so a poor ``eps0``
  costs only a few evaluations.
- ``bisect``: the paper's procedure without its early stop: multiply or divide by 10 until
  bracketed, then plain bisection.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np

SEARCHES = ("interp", "bisect")
UP_FACTOR = 1.05  # the smallest first step up from a certified start (squared after each miss)
PAIR_STEP = 20.0  # near the root the estimate error is ~ its last change squared: probe both sides once it moved by <= PAIR_STEP tol


@dataclass
class SearchResult:
    eps: float  # largest radius verified (lower_bound(eps) > 0); 0.0 if none
    lower_bound: float  # the margin lower bound at eps (g0 if eps == 0)
    evaluations: int  # calls to lower_bound
    status: str  # "certified", "capped" (still certified at eps_max) or "not-certified"
    upper: float  # smallest radius found not certified (inf if none)
    # stop_at_estimate only: a radius just below an accurate root estimate, NOT evaluated,
    # and the probe just above the estimate that would close the bracket with it
    candidate: Optional[float] = None
    probe: Optional[float] = None
    upper_value: Optional[float] = None  # lower_bound(upper) (set with candidate)


class _Counter:
    """Counts calls, records every (eps, value) and maps NaN to -inf (not certified)."""

    def __init__(self, fn, g0):
        self.fn = fn
        self.n = 0
        self.points: List[Tuple[float, float]] = [(0.0, g0)]

    def __call__(self, eps):
        self.n += 1
        v = float(self.fn(eps))
        v = v if not math.isnan(v) else -math.inf
        self.points.append((eps, v))
        return v


def certified_radius(
    lower_bound: Callable[[float], float],
    g0: float,
    eps0: float,
    rtol: float = 1e-4,
    eps_max: float = 1e4,
    eps_min: float = 1e-12,
    method: str = "interp",
    max_evals: int = 200,
    power: float = 2.0,
    stop_at_estimate: bool = False,
) -> SearchResult:
    """Largest eps in (0, eps_max] with ``lower_bound(eps) > 0``, to relative tolerance rtol.

    ``power`` (interp only) is the growth assumed for the drop g0 - lower_bound(eps) when the
    first radius is not certified: the next radius tried is eps0 * (g0 / drop)^(1/power).
    Deeper networks have faster-growing drops (the certifier passes the hidden depth, min 2).
    Going up from a certified first radius the degree is half of it, at least 1.5; a pair
    ``(down, up)`` gives both.

    ``stop_at_estimate`` (interp only): once successive root estimates agree and the estimate
    lies within the same distance above the certified end of the bracket (where the search
    would probe both sides of the estimate), stop and return, besides the verified bracket, a
    ``candidate`` just below the estimate and the ``probe`` just above it, neither evaluated
    (the search would evaluate both to close the bracket). A caller that verifies the
    candidate with another bound anyway (the float32 search of the mixed precision
    certifier) saves an evaluation; it must still evaluate the probe to close the bracket.
    """
    if not (rtol > 0 and eps0 > 0 and eps_max >= eps0 and eps_min > 0):
        raise ValueError("certified_radius: need rtol > 0 and 0 < eps_min, 0 < eps0 <= eps_max")
    if method not in SEARCHES:
        raise ValueError(f"unknown search method '{method}' (choose from {', '.join(SEARCHES)})")
    f = _Counter(lower_bound, g0)
    if not g0 > 0:
        return SearchResult(0.0, g0, 0, "not-certified", 0.0)
    if method == "bisect":
        lo, flo, hi, fhi = _bracket_decimal(f, g0, eps0, eps_max, eps_min, max_evals)
    else:
        lo, flo, hi, fhi = _bracket_secant(f, g0, eps0, eps_max, eps_min, max_evals, power)
    if hi is None:  # certified all the way to eps_max
        return SearchResult(lo, flo, f.n, "capped", math.inf)
    if lo == 0.0:  # nothing certified down to eps_min
        return SearchResult(0.0, g0, f.n, "not-certified", hi)
    if method == "bisect":
        lo, flo, hi = _bisect(f, lo, flo, hi, rtol, max_evals)
    else:
        lo, flo, hi, pair = _interpolate(f, lo, flo, hi, fhi, rtol, max_evals, stop_at_estimate)
        if pair is not None:
            return SearchResult(lo, flo, f.n, "certified", hi, candidate=pair[0], probe=pair[1],
                                upper_value=dict(f.points)[hi])
    return SearchResult(lo, flo, f.n, "certified", hi)


def refine_bracket(lower_bound: Callable[[float], float], g0: float, lo: float, flo: float,
                   hi: float, fhi: float, rtol: float = 1e-4, max_evals: int = 200) -> SearchResult:
    """Shrink a known bracket (lower_bound(lo) = flo > 0 >= fhi, at hi) to relative width rtol
    by the ``interp`` strategy; the bracket's two points seed the interpolation."""
    f = _Counter(lower_bound, g0)
    f.points += [(lo, flo), (hi, fhi)]
    lo, flo, hi, _ = _interpolate(f, lo, flo, hi, fhi, rtol, max_evals)
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


def _bracket_secant(f, g0, eps0, eps_max, eps_min, max_evals, power=2.0):
    """Bracket the root, each step aimed by the secant through the last two points."""
    power, up = power if isinstance(power, tuple) else (power, max(1.5, 0.5 * power))
    e = eps0
    v = f(e)
    if v > 0:
        lo, flo = e, v
        factor = UP_FACTOR
        while f.n < max_evals:
            if lo >= eps_max:
                return lo, flo, None, None
            # the power law of the drop, at half the degree used going down: below the root
            # the drop grows more slowly than above it (measured on MNIST and CIFAR MLPs:
            # this lands 0-10% above the root, the smallest failing radius the later
            # evaluations can reuse stable neurons from)
            drop = g0 - flo
            guess = lo * (g0 / drop) ** (1.0 / up) if drop > 0 else math.inf
            e = min(max(guess, factor * lo), 1e4 * lo, eps_max)
            v = f(e)
            if v > 0:
                lo, flo = e, v
                factor = min(factor * factor, 1e4)  # the guesses keep falling short: speed up
            else:
                return lo, flo, e, v
        return lo, flo, None, None
    hi, fhi = e, v
    factor = 1.0 / 0.9  # first step: the secant's root itself (below the root if concave)
    while f.n < max_evals and hi > eps_min:
        # the drop g0 - bound grows at least linearly in eps, and faster (a power of eps) once
        # neurons turn unstable: aim at the root of that power law
        guess = hi * (g0 / (g0 - fhi)) ** (1.0 / power) if -math.inf < fhi <= 0 else 0.0
        e = min(max(guess, hi / 1e4), hi / factor)
        v = f(e)
        if v > 0:
            return e, v, hi, fhi
        hi, fhi = e, v
        factor = max(2.0, factor * factor)  # the secant keeps overshooting: speed up
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


def _quadratic_root(points, lo, hi) -> Optional[float]:
    """Root in (lo, hi) of the parabola through three points, or None."""
    (x0, y0), (x1, y1), (x2, y2) = points
    try:
        d01 = (y1 - y0) / (x1 - x0)
        d12 = (y2 - y1) / (x2 - x1)
        a = (d12 - d01) / (x2 - x0)  # Newton form: y = y0 + d01 (x-x0) + a (x-x0)(x-x1)
    except ZeroDivisionError:
        return None
    if not all(math.isfinite(t) for t in (d01, d12, a)):
        return None
    # in t = x - x0: a t^2 + (d01 - a (x1 - x0)) t + y0 = 0
    b = d01 - a * (x1 - x0)
    if a == 0.0:
        roots = [-y0 / b] if b != 0.0 else []
    else:
        disc = b * b - 4.0 * a * y0
        if disc < 0.0:
            return None
        sq = math.sqrt(disc)
        q = -0.5 * (b + math.copysign(sq, b))  # stable quadratic formula
        roots = [q / a] + ([y0 / q] if q != 0.0 else [])
    inside = [x0 + t for t in roots if lo < x0 + t < hi]
    return min(inside) if inside else None


def _estimate(points, lo, flo, hi, fhi) -> float:
    """Root estimate inside (lo, hi): quadratic through lo, hi and the nearest other point."""
    others = [p for p in points if p[0] not in (lo, hi) and math.isfinite(p[1])]
    if others and math.isfinite(fhi):
        third = min(others, key=lambda p: min(abs(p[0] - lo), abs(p[0] - hi)))
        r = _quadratic_root(sorted([(lo, flo), (hi, fhi), third]), lo, hi)
        if r is not None:
            return r
    if math.isfinite(fhi) and flo > fhi:
        return lo + (hi - lo) * flo / (flo - fhi)  # secant
    return math.sqrt(lo * hi) if hi > 4.0 * lo else 0.5 * (lo + hi)




def _estimate_loglog(points, lo, flo, hi, fhi) -> Optional[float]:
    """Root estimate from the drop d(eps) = g0 - lower_bound(eps) on log-log axes.

    The drop grows like eps near 0 and like a high power of eps once neurons turn unstable
    (deep networks: powers of 5 to 10), so log d against log eps is close to a line over wide
    ranges where the bound itself is not; the root is where d = g0. None if a drop is <= 0.
    """
    g0 = points[0][1]
    if not (g0 > 0 and math.isfinite(fhi) and g0 - flo > 0 and g0 - fhi > 0):
        return None
    pts = [(math.log(e), math.log((g0 - v) / g0)) for e, v in points[1:]
           if e > 0 and math.isfinite(v) and g0 - v > 0]
    ll, lh = math.log(lo), math.log(hi)
    ends = [(ll, math.log((g0 - flo) / g0)), (lh, math.log((g0 - fhi) / g0))]
    others = [p for p in pts if p[0] not in (ll, lh)]
    if others:
        third = min(others, key=lambda p: min(abs(p[0] - ll), abs(p[0] - lh)))
        r = _quadratic_root(sorted(ends + [third]), ll, lh)
        if r is not None:
            return math.exp(r)
    (x0, y0), (x1, y1) = ends
    if y1 > y0:
        return math.exp(x0 + (x1 - x0) * (-y0) / (y1 - y0))
    return None


def _interpolate(f, lo, flo, hi, fhi, rtol, max_evals, stop_at_estimate=False):
    """Shrink [lo, hi] (flo > 0 >= fhi) to relative width rtol by interpolation.

    Returns (lo, flo, hi, pair); pair is None unless ``stop_at_estimate`` ended the search at
    an accurate estimate: then (candidate, probe) (see :func:`certified_radius`).
    """
    prev_est = None
    streak = 0  # > 0: lo moved that many times in a row; < 0: hi did
    widths = [hi - lo]
    while hi - lo > rtol * lo and f.n < max_evals:
        tol = rtol * lo
        if len(widths) >= 4 and widths[-1] > 0.5 * widths[-4]:
            est = math.sqrt(lo * hi) if hi > 4.0 * lo else 0.5 * (lo + hi)  # safeguard
            probes = [est]
            prev_est = None
        else:
            est = _estimate_loglog(f.points, lo, flo, hi, fhi)
            if est is None or not lo < est < hi:
                est = _estimate(f.points, lo, flo, hi, fhi)
            step = abs(est - prev_est) if prev_est is not None else math.inf
            prev_est = est
            if step <= PAIR_STEP * tol:
                if stop_at_estimate and est - lo <= PAIR_STEP * tol:
                    # the estimate settled and lies next to a certified radius: hand it over
                    candidate, probe = est - 0.45 * tol, est + 0.45 * tol
                    if lo < candidate and probe < hi:
                        return lo, flo, hi, (candidate, probe)
                # an accurate estimate: step just below it, then just above it
                probes = [est - 0.45 * tol, est + 0.45 * tol]
            elif abs(streak) >= 2 and math.isfinite(step):
                # one end keeps moving: aim past the estimate by its last change to catch the
                # other side of the root
                probes = [est + step if streak > 0 else est - step]
            else:
                probes = [est]
        for e in probes:
            if hi - lo <= rtol * lo:
                break
            margin = 0.45 * rtol * lo
            e = min(max(e, lo + margin), hi - margin) if hi - lo > 2 * margin else 0.5 * (lo + hi)
            v = f(e)
            if v > 0:
                lo, flo = e, v
                streak = streak + 1 if streak > 0 else 1
            else:
                hi, fhi = e, v
                streak = streak - 1 if streak < 0 else -1
                break  # the estimate was too high: re-estimate before probing again
        widths.append(hi - lo)
    return lo, flo, hi, None


def mixed_search(bound, search, g0: float, eps0: float, rtol: float, f32_rtol: float,
                 estimate: bool) -> SearchResult:
    """Search with float32 bounds, then verify the answer in float64 (``bound(dtype)`` gives
    the margin's lower bound as a function of eps; ``search(fn, g0, eps0, rtol,
    stop_at_estimate=...)`` is the certifier's radius search).

    The float32 search runs to ``f32_rtol * rtol`` and, with ``estimate`` (the interpolating
    search), stops at an accurate root estimate without closing the bracket around it:
    float32 evaluates the radius just above the estimate (closing the bracket), then float64
    verifies the one just below it (one evaluation fewer than float32 closing it and float64
    verifying; in this order a dense verification reuses the neurons float32 proved stable on
    the nearest larger ball). Otherwise float32 closes the bracket on the side the estimate
    missed; float64 then verifies the largest radius float32 certified, or one step of
    rtol/2 below it; failing those a float64 search starts from there. Only a radius whose
    float64 lower bound is > 0 is returned.
    """
    exact = bound(np.float64)
    tol = f32_rtol * rtol
    fast = search(bound(np.float32), g0, eps0, tol, stop_at_estimate=estimate)
    if fast.eps == 0.0:  # nothing certified even in float32: confirm with a float64 search
        res = search(exact, g0, eps0, rtol)
        return SearchResult(res.eps, res.lower_bound, fast.evaluations + res.evaluations,
                            res.status, res.upper)
    evals = fast.evaluations
    if fast.candidate is not None:
        # the probe first: on a dense network its neurons, proven stable just above the
        # candidate, spare float64 most of its rows (StableFromFloat32: the nearest larger ball)
        w = bound(np.float32)(fast.probe)
        evals += 1
        if w > 0:  # the root lies above the probe: float32 closes the bracket up there
            more = refine_bracket(bound(np.float32), g0, fast.probe, w, fast.upper,
                                  fast.upper_value, tol)
        else:
            v = exact(fast.candidate)
            evals += 1
            if v > 0:  # certified, and the probe closed the bracket
                return SearchResult(fast.candidate, v, evals, fast.status, fast.probe)
            # the estimate was too high after all: close the float32 bracket below it
            more = refine_bracket(bound(np.float32), g0, fast.eps, fast.lower_bound,
                                  fast.candidate, v, tol)
        evals += more.evaluations
        fast = SearchResult(more.eps, more.lower_bound, evals, fast.status, more.upper)
    for eps in (fast.eps, fast.eps * (1.0 - 0.5 * rtol)):
        v = exact(eps)
        evals += 1
        if v > 0:
            return SearchResult(eps, v, evals, fast.status if eps == fast.eps else "certified",
                                fast.upper)
    res = search(exact, g0, eps, rtol)
    return SearchResult(res.eps, res.lower_bound, evals + res.evaluations, res.status, res.upper)
