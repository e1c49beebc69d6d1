"""Linear relaxations of elementary functions the 2022-2024 competition networks apply
elementwise: sin, cos (dynamics of control systems), exp (softmax), the reciprocal 1/z
(division by data), and the powers z^2 and z^3 (ONNX ``Pow`` with a constant exponent:
power-flow equations, throughput models).

Same contract as the other relaxations: 1-D float64 arrays (l, u), l <= u, in; four arrays
(aU, bU, aL, bL) out with ``aL*z + bL <= f(z) <= aU*z + bU`` for every real z in [l, u].

A line's slope is chosen by the rule stated beside it; its intercept is then the tightest
valid one for that slope whatever the slope: the max (min) of ``f(t) - k t`` over [l, u],
found among the end-points and every point of [l, u] where ``f'(t) = k`` (:func:`_critical`
lists them all: for sin and cos both solutions in each period the interval meets), moved
outward by sigmoid_family's ``_slack`` (8 ulps of the terms involved, with |f| <= S). So the
choice of slope only decides how tight a line is, never whether it is sound. A computed
critical point is off the real one by a few ulps of t, which changes f(t) - k t there by
O(ulp^2) (its derivative is 0 there): far below the slack.

- sin, cos: where [l, u] spans a full period (or is not finite), the constant lines -1 and
  1. Else where f is concave on all of [l, u] (its second derivative -f keeps one sign) the
  chord below and the tangent at the midpoint above, where convex the mirror image, and
  otherwise two lines with the chord's slope.
- exp (convex, increasing): the chord above, the tangent at the midpoint below (the tangent
  of least area between it and f, as for softplus); past exp's overflow the upper line is
  the constant +inf.
- square (convex): the chord above, the tangent at the midpoint below. Where max(|l|, |u|)
  passes 1e150 (the square would overflow), the constant lines 0 and +inf.
- cube (concave for z < 0, convex for z > 0): on one side of 0 as the convex or concave
  functions above, across 0 two lines with the chord's slope; past 1e100 the constant lines
  of the end-points' cubes (monotone), moved out.
- reciprocal: on l > 0 convex and decreasing (chord above, tangent at the midpoint below), on
  u < 0 the mirror image; an interval holding 0 has no bound (constant lines -inf, +inf).
- sqrt (concave, increasing, on z >= 0): the tangent at the midpoint above, the chord below;
  an interval reaching below 0 (where the network's own value would be NaN) has no bound,
  one ending at 0 the constant lines of sqrt's values there, an unbounded one the constant
  lines sqrt(l) below and +inf above.
"""
import math

import numpy as np
from numba import njit

from crown_cli.engine.relaxations.sigmoid_family import (COS, CUBE, EXP, RECIPROCAL, SIN,
                                                        SQRT, SQUARE, _exact_intercept,
                                                        _is_degenerate, _slack, _value)

TWO_PI = 2.0 * math.pi


@njit(cache=True)
def _f(kind, t):
    return _value(kind, 0.0, t)


@njit(cache=True)
def _df(kind, t):
    if kind == SIN:
        return math.cos(t)
    if kind == COS:
        return -math.sin(t)
    if kind == EXP:
        return math.exp(t)
    if kind == SQUARE:
        return 2.0 * t
    if kind == CUBE:
        return 3.0 * t * t
    if kind == SQRT:
        return 0.5 / math.sqrt(t)
    return -1.0 / (t * t)


@njit(cache=True)
def _critical(kind, l, u, k):
    """Every t in [l, u] with f'(t) = k (computed; up to 8), as an array."""
    out = np.empty(8)
    m = 0
    if kind == SIN or kind == COS:
        if k < -1.0 or k > 1.0:
            return out[:0]
        if kind == SIN:  # cos t = k: t = +-acos(k) + 2 pi n
            a = math.acos(k)
            base = (a, -a)
        else:  # -sin t = k: t = asin(-k) or pi - asin(-k), + 2 pi n
            a = math.asin(-k)
            base = (a, math.pi - a)
        n0 = math.floor(l / TWO_PI) - 1.0
        for j in range(4):
            for b in base:
                t = b + (n0 + j) * TWO_PI
                if l <= t <= u and m < 8:
                    out[m] = t
                    m += 1
        return out[:m]
    if kind == EXP:
        if k > 0.0:
            t = math.log(k)
            if l <= t <= u:
                out[0] = t
                m = 1
        return out[:m]
    if kind == SQUARE:  # 2 t = k
        t = 0.5 * k
        if l <= t <= u:
            out[0] = t
            m = 1
        return out[:m]
    if kind == SQRT:  # 1 / (2 sqrt t) = k: t = 1 / (4 k^2)
        if k > 0.0:
            t = 0.25 / (k * k)
            if l <= t <= u:
                out[0] = t
                m = 1
        return out[:m]
    if kind == CUBE:  # 3 t^2 = k: t = +-sqrt(k / 3)
        if k >= 0.0:
            t = math.sqrt(k / 3.0)
            for c in (t, -t):
                if l <= c <= u:
                    out[m] = c
                    m += 1
        return out[:m]
    if k < 0.0:  # reciprocal: -1 / t^2 = k, t of the interval's sign
        t = math.sqrt(-1.0 / k)
        if u < 0.0:
            t = -t
        if l <= t <= u:
            out[0] = t
            m = 1
    return out[:m]


@njit(cache=True)
def _intercept(kind, l, u, k, upper, S):
    """Tightest sound intercept for slope k above (``upper``) or below f on [l, u], slack
    included (module docstring): the extremes over the end-points and :func:`_critical`'s
    points; S bounds |f| beyond the points evaluated."""
    return _exact_intercept(kind, 0.0, l, u, k, upper, _critical(kind, l, u, k), S)


@njit(cache=True)
def _curvature_sign(kind, l, u):
    """+1 where f is convex on all of [l, u], -1 where concave, 0 otherwise (or unknown)."""
    if kind == EXP or kind == SQUARE:
        return 1
    if kind == CUBE:
        return 1 if l >= 0.0 else (-1 if u <= 0.0 else 0)
    if kind == RECIPROCAL:
        return 1 if l > 0.0 else (-1 if u < 0.0 else 0)
    if kind == SQRT:
        return -1
    # f'' = -f: sin is concave on [2 pi n, 2 pi n + pi], cos on [2 pi n - pi/2, 2 pi n + pi/2]
    shift = 0.0 if kind == SIN else 0.5 * math.pi
    a = (l + shift) / math.pi
    b = (u + shift) / math.pi
    n = math.floor(a)
    if b > n + 1.0:  # [l, u] meets two half periods: f'' changes sign
        return 0
    return -1 if n % 2.0 == 0.0 else 1


@njit(cache=True)
def elementary_relaxation(kind, l, u):
    """(aU, bU, aL, bL) of f = sin, cos, exp, 1/z, z^2, z^3 or sqrt (``kind``) on [l, u]
    (1-D float64)."""
    n = l.shape[0]
    aU = np.zeros(n)
    bU = np.empty(n)
    aL = np.zeros(n)
    bL = np.empty(n)
    periodic = kind == SIN or kind == COS
    for i in range(n):
        li = l[i]
        ui = u[i]
        if li != li or ui != ui:
            aU[i] = np.nan
            bU[i] = np.nan
            aL[i] = np.nan
            bL[i] = np.nan
            continue
        if periodic and (not (math.isfinite(li) and math.isfinite(ui)) or ui - li >= TWO_PI):
            bU[i] = 1.0
            bL[i] = -1.0
            continue
        if kind == RECIPROCAL and li <= 0.0 <= ui:
            bU[i] = np.inf
            bL[i] = -np.inf
            continue
        if kind == SQRT and (li < 0.0 or ui <= 0.0 or not math.isfinite(ui)):
            if li < 0.0:  # below 0 sqrt is NaN: no bound
                bU[i] = np.inf
                bL[i] = -np.inf
            else:  # [0, 0]: the constant 0; [l, inf]: sqrt(l) below (increasing)
                bU[i] = 0.0 if ui <= 0.0 else np.inf
                s0 = math.sqrt(li)
                bL[i] = max(0.0, s0 - _slack(0.0, s0, 0.0, s0))
            continue
        if kind == EXP and (ui > 709.0 or not math.isfinite(li)):
            # the chord would overflow: constants (exp increasing)
            bU[i] = np.inf if ui > 709.0 else math.exp(ui) * (1.0 + 8.0 * 2.0 ** -52)
            bL[i] = 0.0 if not math.isfinite(li) else max(0.0, math.exp(li) * (1.0 - 8.0 * 2.0 ** -52))
            continue
        if kind == SQUARE and not max(abs(li), abs(ui)) <= 1e150:
            bU[i] = np.inf  # the square would overflow: its range [0, inf]
            bL[i] = 0.0
            continue
        if kind == CUBE and not max(abs(li), abs(ui)) <= 1e100:
            # monotone: constants between the end-points' cubes (inf past overflow)
            cl = li * li * li
            cu = ui * ui * ui
            bU[i] = cu + _slack(0.0, cu, 0.0, abs(cu)) if math.isfinite(cu) else np.inf
            bL[i] = cl - _slack(0.0, cl, 0.0, abs(cl)) if math.isfinite(cl) else -np.inf
            continue
        if kind == RECIPROCAL and not (math.isfinite(li) and math.isfinite(ui)):
            # 1/z is monotone decreasing on each side of 0: constants between its end values
            fl = 0.0 if not math.isfinite(li) else 1.0 / li
            fu = 0.0 if not math.isfinite(ui) else 1.0 / ui
            lo_v, hi_v = min(fl, fu), max(fl, fu)
            bU[i] = hi_v + _slack(0.0, hi_v, 0.0, abs(hi_v))
            bL[i] = lo_v - _slack(0.0, lo_v, 0.0, abs(lo_v))
            continue
        w = ui - li
        mid = li + 0.5 * w
        tangent = _df(kind, mid)
        chord = tangent if _is_degenerate(li, ui) else (_f(kind, ui) - _f(kind, li)) / w
        c = _curvature_sign(kind, li, ui)
        if c > 0:  # convex: chord above, tangent below
            kU, kL = chord, tangent
        elif c < 0:  # concave: tangent above, chord below
            kU, kL = tangent, chord
        else:
            kU, kL = chord, chord
        S = 1.0 if periodic else 0.0
        aU[i] = kU
        bU[i] = _intercept(kind, li, ui, kU, True, S)
        aL[i] = kL
        bL[i] = _intercept(kind, li, ui, kL, False, S)
    return aU, bU, aL, bL


@njit(cache=True)
def sin_relaxation(l, u):
    return elementary_relaxation(SIN, l, u)


@njit(cache=True)
def cos_relaxation(l, u):
    return elementary_relaxation(COS, l, u)


@njit(cache=True)
def exp_relaxation(l, u):
    return elementary_relaxation(EXP, l, u)


@njit(cache=True)
def reciprocal_relaxation(l, u):
    return elementary_relaxation(RECIPROCAL, l, u)


@njit(cache=True)
def square_relaxation(l, u):
    return elementary_relaxation(SQUARE, l, u)


@njit(cache=True)
def cube_relaxation(l, u):
    return elementary_relaxation(CUBE, l, u)


@njit(cache=True)
def sqrt_relaxation(l, u):
    return elementary_relaxation(SQRT, l, u)
