"""Linear relaxations of tanh, sigmoid, arctan and erf (CROWN, Section 3.2, Tables 1-2).

All four functions are increasing, convex on (-inf, 0] and concave on [0, inf), with an even
derivative. Following the paper's partition by the signs of the pre-activation bounds:

* ``l >= 0`` (concave side): upper = tangent at d in [l, u] (we take the midpoint, as the
  paper's code does); lower = chord through both end-points.
* ``u <= 0`` (convex side): upper = chord; lower = tangent at the midpoint.
* ``l < 0 < u``: the paper's upper line is the tangent at the d_U >= 0 that passes through
  the left end-point (l, act(l)); its lower line the tangent at the d_L <= 0 through the right
  end-point (u, act(u)). d solves ``(act(d) - act(p)) / (d - p) = act'(d)`` (p the
  end-point); footnotes (diamond) and (dagger): when that d falls beyond the other end-point,
  the chord is the bound. Every tangent at d in [d_U, u] is a valid upper line (and at d in
  [l, d_L] a valid lower one); by default (``paper=False``) we take the one of least area
  between line and function over [l, u], the tangent at max(mid, d_U) (min(mid, d_L) below),
  mid = (l + u) / 2: the line's mean over [l, u] is act(d) + act'(d) (mid - d), whose
  derivative in d is act''(d) (mid - d), so on the concave side it is smallest at d = mid.
  Where the midpoint's tangent is valid this is auto_LiRPA's choice for these functions; where
  it is not, the paper's. ``paper=True`` gives the paper's lines (``--method crown-paper``).

How the lines are made exact and sound in float64
-------------------------------------------------
Only the *slope* of each line follows the table. The intercept is then computed as the
tightest valid one for that slope: for an upper line ``max_{t in [l,u]} act(t) - k t``, for a
lower line the min. Because act is convex on [l,u]∩(-inf,0] and concave on [l,u]∩[0,inf), the
function ``act(t) - k t`` reaches its max on [l, u] at one of l, u, 0 (clipped) or the
concave-side point where act'(t) = k, and its min at l, u, 0 or the convex-side point where
act'(t) = k (= minus the former, act' being even). Evaluating these <= 5 points therefore gives
the exact intercept for *any* slope, so a tangent point found only approximately by the
solver can never make a line unsound, and for the paper's slopes the line passes through the
end-point / touches at d exactly as the tables say (Table 1 footnote *: the intercept
``a*b = act(d) - a*d`` is computed directly, never by dividing by a near-zero slope ``a``).
Finally the intercept is moved outward by ``_slack`` (8 ulps of the terms, ~2e-15 relative)
so that the inequality also holds when act and the line are evaluated in float64. The search
over those points (``_exact_intercept``) serves the ELU, softplus and hard sigmoid relaxations
of extra.py too, so their values (``_elu``, ``_softplus``, ``_hsig``) are defined here.

Near-zero slopes (Table 1 footnote *): derivatives are computed without cancellation
(sech^2 from exp(-2|t|), s(t) s(-t)), so in saturation they are tiny but accurate instead of
0, and they never divide anything. Degenerate intervals (u - l <= DEGENERATE_REL * scale,
including u == l) use the derivative at the midpoint for both lines; the exact intercepts
then bracket act(l), act(u). Infinite bounds give the constant bounds act(l), act(u).
"""
import math

import numpy as np
from numba import njit

TANH = 0
SIGMOID = 1
ARCTAN = 2
# extra.py's activations, as kinds of _value / _exact_intercept only
ELU = 3
SOFTPLUS = 4
HARD_SIGMOID = 5
# elementary.py's functions, likewise
SIN = 6
COS = 7
EXP = 8
RECIPROCAL = 9
SQUARE = 10  # ONNX Pow with exponent 2 and 3
CUBE = 11
ERF = 12  # the S-shaped family's fourth member (ONNX Erf; PyTorch's exported GELU uses it)
SQRT = 13  # elementary.py's square root (ONNX Sqrt of data: layer normalisation)
TWO_OVER_SQRT_PI = 1.1283791670955126  # erf'(0) = 2 / sqrt(pi), within half an ulp
LOG_TWO_OVER_SQRT_PI = 0.12078223763524522  # its logarithm, likewise

EPS = 2.0 ** -52  # float64 machine epsilon (spacing of floats at 1.0)
TINY = 5e-324  # smallest positive subnormal
SLACK_ULPS = 8.0
# Intervals with u - l <= DEGENERATE_REL * max(1, |l|, |u|) are treated as (almost) points: the
# chord (act(u) - act(l)) / (u - l) would lose most of its digits to cancellation (or divide
# by 0 when u == l), while the curvature gap ~ |act''| (u-l)^2 / 8 is already at rounding
# level, so both lines use the derivative at the midpoint (and the exact intercepts).
DEGENERATE_REL = 2.0 ** -24
MAX_ITER = 200


@njit(cache=True)
def _slack(k, b, M, S):
    """Outward shift making a line with slope k, intercept b sound in float64 on |z| <= M.

    Error budget, each term <= 1 ulp of the largest magnitude involved, |k|*M + |b| + S where
    S bounds |act| on the interval: act(t) in this kernel (<= 1-2 ulp), the reference act(z)
    the line is compared with (libm/numpy, <= 2 ulp), act(t) - k*t when the intercept was
    computed (2 roundings), k*z + b when the line is evaluated (2 roundings). 8 ulps covers the
    sum with margin; the TINY term covers absolute errors of subnormal results.
    """
    return SLACK_ULPS * EPS * (abs(k) * M + abs(b) + S) + SLACK_ULPS * TINY


@njit(cache=True)
def _is_degenerate(l, u):
    return u - l <= DEGENERATE_REL * max(1.0, abs(l), abs(u))


@njit(cache=True)
def _sigmoid(t):
    """1 / (1 + exp(-t)) without overflow, accurate in both tails."""
    if t >= 0.0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


@njit(cache=True)
def _act(kind, t):
    if kind == TANH:
        return math.tanh(t)
    if kind == SIGMOID:
        return _sigmoid(t)
    if kind == ERF:
        return math.erf(t)
    return math.atan(t)


@njit(cache=True)
def _act_diff(kind, t, p):
    """act(t) - act(p); for sigmoid as (tanh(t/2) - tanh(p/2)) / 2, which keeps the digits
    of a small difference near 0 where 1/(1+e^-t) ~ 0.5 would cancel them."""
    if kind == SIGMOID:
        return 0.5 * (math.tanh(0.5 * t) - math.tanh(0.5 * p))
    return _act(kind, t) - _act(kind, p)


@njit(cache=True)
def _dact(kind, t):
    """act'(t), computed without cancellation (so it stays accurate, not 0, in saturation)."""
    if kind == TANH:
        # 1 - tanh^2 = sech^2 = 4 e^{-2|t|} / (1 + e^{-2|t|})^2 ; 1 - tanh^2 would round to 0
        # for |t| > ~19 although sech^2 is still ~1e-16
        e = math.exp(-2.0 * abs(t))
        return 4.0 * e / ((1.0 + e) * (1.0 + e))
    if kind == SIGMOID:
        return _sigmoid(t) * _sigmoid(-t)  # s (1 - s) with 1 - s = s(-t) computed directly
    if kind == ERF:
        return TWO_OVER_SQRT_PI * math.exp(-t * t)
    w = 1.0 / (1.0 + t * t)
    return w


@njit(cache=True)
def _d2act(kind, t):
    if kind == TANH:
        return -2.0 * math.tanh(t) * _dact(TANH, t)
    if kind == SIGMOID:
        s = _sigmoid(t)
        sm = _sigmoid(-t)
        return s * sm * (sm - s)
    if kind == ERF:
        return -2.0 * t * _dact(ERF, t)
    w = 1.0 / (1.0 + t * t)
    return -2.0 * t * w * w


@njit(cache=True)
def _inv_dact(kind, k):
    """The t >= 0 with act'(t) = k (act' is even and decreasing on [0, inf)).

    0 if k >= act'(0), +inf if k <= 0. Branches keep each formula well conditioned.
    """
    if k <= 0.0:
        return np.inf
    if kind == TANH:
        if k >= 1.0:
            return 0.0
        if k > 0.5:
            return math.atanh(math.sqrt(1.0 - k))  # tanh^2 t = 1 - k
        return math.acosh(1.0 / math.sqrt(k))  # cosh t = 1 / sqrt(k)
    if kind == SIGMOID:
        if k >= 0.25:
            return 0.0
        q = math.sqrt(1.0 - 4.0 * k)  # s = (1 + q) / 2, t = log(s / (1 - s))
        if q < 0.5:
            return 2.0 * math.atanh(q)
        return 2.0 * math.log1p(q) - math.log(4.0 * k)
    if kind == ERF:
        if k >= TWO_OVER_SQRT_PI:
            return 0.0
        r = k / TWO_OVER_SQRT_PI  # exp(-t^2) = r; near r = 1, -log1p(r - 1) keeps the digits
        if r > 0.5:
            return math.sqrt(-math.log1p(r - 1.0))
        return math.sqrt(LOG_TWO_OVER_SQRT_PI - math.log(k))  # k may be subnormal
    if k >= 1.0:
        return 0.0
    return math.sqrt((1.0 - k) / k)  # 1 / (1 + t^2) = k


@njit(cache=True)
def _clip(t, l, u):
    return min(max(t, l), u)


@njit(cache=True)
def _elu(t, alpha):
    return t if t > 0.0 else alpha * math.expm1(t)


@njit(cache=True)
def _softplus(t):
    return max(t, 0.0) + math.log1p(math.exp(-abs(t)))  # log(1 + e^t) without overflow


@njit(cache=True)
def _hsig(t, alpha):
    return min(max(alpha * t + 0.5, 0.0), 1.0)  # same operations as np.clip(a*z + 0.5, 0, 1)


@njit(cache=True)
def _value(kind, p, t):
    """Activation ``kind`` at t (the sigmoid family, extra.py's and elementary.py's); p is
    the alpha of ELU and hard sigmoid (unused otherwise)."""
    if kind <= ARCTAN or kind == ERF:
        return _act(kind, t)
    if kind == ELU:
        return _elu(t, p)
    if kind == SOFTPLUS:
        return _softplus(t)
    if kind == HARD_SIGMOID:
        return _hsig(t, p)
    if kind == SIN:
        return math.sin(t)
    if kind == COS:
        return math.cos(t)
    if kind == EXP:
        return math.exp(t)
    if kind == SQUARE:
        return t * t
    if kind == CUBE:
        return t * t * t
    if kind == SQRT:
        return math.sqrt(max(t, 0.0))
    return 1.0 / t


@njit(cache=True)
def _exact_intercept(kind, p, l, u, k, upper, inner, S):
    """Tightest sound intercept for slope k of a line above (``upper``) or below
    act = _value(kind, p, .) on [l, u], slack included: the max (min) of act(t) - k t over
    t = l, u and the points of the tuple ``inner`` clipped into [l, u], which must hold every
    other point where that max (min) can be reached; then moved outward by ``_slack``, with S
    the larger of ``S`` and |act| at those points."""
    best = 0.0
    for j in range(2 + len(inner)):
        if j == 0:
            t = l
        elif j == 1:
            t = u
        else:
            t = _clip(inner[j - 2], l, u)
        f = _value(kind, p, t)
        g = f - k * t
        if j == 0 or (upper and g > best) or ((not upper) and g < best):
            best = g
        S = max(S, abs(f))
    s = _slack(k, best, max(abs(l), abs(u)), S)
    return best + s if upper else best - s


@njit(cache=True)
def _intercept(kind, l, u, k, upper):
    """Tightest sound intercept for slope k on [l, u] (see module docstring), slack included."""
    tk = _inv_dact(kind, k)
    # for sigmoid S >= 1: the terms of 1/(1+e^-z) or 0.5*(1+tanh(z/2)) (crown_cli.activations)
    # are O(1): an evaluation can be off by ~1 ulp of 1 where sigmoid itself is tiny (both that
    # form and scipy's expit return 0 around z = -717, where sigmoid is ~4e-312)
    S = 1.0 if kind == SIGMOID else 0.0
    return _exact_intercept(kind, 0.0, l, u, k, upper, (0.0, tk, -tk), S)


@njit(cache=True)
def _split(lo, hi):
    """Bisection point of a bracket lying on one side of 0: while it spans more than a factor
    4 beyond |t| = 1, the geometric mean, so a bracket like [0, 1e300] reaches the root's
    order of magnitude in ~10 steps instead of ~1000; otherwise the arithmetic mean."""
    if lo >= 0.0:
        x = max(lo, 1.0)
        if hi > 4.0 * x:
            return math.sqrt(x) * math.sqrt(hi)
    elif hi <= 0.0:
        x = max(-hi, 1.0)
        if -lo > 4.0 * x:
            return -(math.sqrt(x) * math.sqrt(-lo))
    return 0.5 * (lo + hi)


@njit(cache=True)
def _tangent_point(kind, p, a, b):
    """Root of H(t) = act'(t) (t - p) - (act(t) - act(p)) on [a, b], H decreasing there.

    Requires H(a) >= 0 >= H(b) mathematically. Safeguarded Newton: the bracket [lo, hi] is
    kept from the signs of H; a Newton step is taken when it lands inside the bracket and |H|
    shrank at least 4x on the previous step, otherwise the bracket is split (``_split``).
    Stops when the Newton correction is below 1e-13 relative (or the bracket cannot shrink).
    Where |p| is tiny H is pure rounding noise near its root, which is then only located to
    within that noise; act'(d) is flat there, so the slope is still right to ~1 ulp.
    Soundness never depends on the accuracy of the result (the intercept is exact).
    """
    lo = a
    hi = b
    t = _split(lo, hi)
    prev = np.inf
    for _ in range(MAX_ITER):
        h = _dact(kind, t) * (t - p) - _act_diff(kind, t, p)
        if h > 0.0:
            lo = t
        elif h < 0.0:
            hi = t
        else:
            return t
        dh = _d2act(kind, t) * (t - p)
        tn = _split(lo, hi)
        if dh != 0.0:
            step = h / dh
            if abs(step) <= 1e-13 * abs(t):
                return t
            cand = t - step
            if abs(h) <= 0.25 * prev and lo < cand < hi:
                tn = cand
        prev = abs(h)
        if tn <= lo or tn >= hi or hi - lo <= 1e-13 * max(abs(lo), abs(hi)):
            return t  # the bracket cannot (or need not) shrink any further
        t = tn
    return t


@njit(cache=True)
def tangent_point(kind, l, u, upper):
    """Tangent point of the l < 0 < u case: returns (d, use_chord).

    upper: d >= 0 with the tangent at d through (l, act(l)) (Table 1, d >= 0);
    lower: d <= 0 with the tangent at d through (u, act(u)) (Table 2, d <= 0).
    use_chord is True when d lies at or beyond the other end-point (footnotes diamond /
    dagger), then d is that end-point and the chord is the bound.
    """
    if upper:
        # H(t) = act'(t)(t-l) - (act(t)-act(l)) is decreasing on [0, inf) (act'' < 0, t > l)
        # and H(0) >= 0 by convexity on [l, 0]; no sign change on [0, u] means d >= u.
        if _dact(kind, u) * (u - l) - _act_diff(kind, u, l) >= 0.0:
            return u, True
        return _tangent_point(kind, l, 0.0, u), False
    # mirror image: H(t) = act'(t)(t-u) - (act(t)-act(u)) is decreasing on (-inf, 0]
    # (act'' > 0, t < u) and H(0) <= 0 by concavity on [0, u]; H(l) <= 0 means d <= l.
    if _dact(kind, l) * (l - u) - _act_diff(kind, l, u) <= 0.0:
        return l, True
    return _tangent_point(kind, u, l, 0.0), False


@njit(cache=True)
def _relax_family(kind, l, u, paper):
    n = l.shape[0]
    aU = np.empty(n)
    bU = np.empty(n)
    aL = np.empty(n)
    bL = np.empty(n)
    for i in range(n):
        li = l[i]
        ui = u[i]
        if li != li or ui != ui:
            aU[i] = np.nan
            bU[i] = np.nan
            aL[i] = np.nan
            bL[i] = np.nan
            continue
        if not (math.isfinite(li) and math.isfinite(ui)):
            # act is increasing and bounded: act(l) <= act(z) <= act(u) holds on any interval
            fl = _act(kind, li)
            fu = _act(kind, ui)
            S = 1.0 if kind == SIGMOID else max(abs(fl), abs(fu))
            aU[i] = 0.0
            bU[i] = fu + _slack(0.0, fu, 0.0, S)
            aL[i] = 0.0
            bL[i] = fl - _slack(0.0, fl, 0.0, S)
            continue
        w = ui - li
        if _is_degenerate(li, ui):
            kU = _dact(kind, li + 0.5 * w)
            kL = kU
        elif li >= 0.0:
            kU = _dact(kind, li + 0.5 * w)  # Table 1, I+: tangent at d = midpoint
            kL = (_act(kind, ui) - _act(kind, li)) / w  # Table 2, I+: chord
        elif ui <= 0.0:
            kU = (_act(kind, ui) - _act(kind, li)) / w  # Table 1, I-: chord
            kL = _dact(kind, li + 0.5 * w)  # Table 2, I-: tangent at d = midpoint
        else:
            chord = (_act(kind, ui) - _act(kind, li)) / w
            mid = li + 0.5 * w
            # every tangent at d in [d_U, u] is a valid upper line (tangent_ranges); the one
            # at the midpoint has the least area above act on [l, u] (the line's mean over
            # [l, u] is act(d) + act'(d) (mid - d), smallest at d = mid on the concave side),
            # so the default takes d = max(mid, d_U); the paper's line is d = d_U
            d, use_chord = tangent_point(kind, li, ui, True)
            if not use_chord and not paper:
                d = max(d, mid)
            kU = chord if use_chord else _dact(kind, d)  # Table 1, I+-, footnote diamond
            d, use_chord = tangent_point(kind, li, ui, False)
            if not use_chord and not paper:
                d = min(d, mid)  # mirrored: valid lower tangents at d in [l, d_L]
            kL = chord if use_chord else _dact(kind, d)  # Table 2, I+-, footnote dagger
        aU[i] = kU
        bU[i] = _intercept(kind, li, ui, kU, True)
        aL[i] = kL
        bL[i] = _intercept(kind, li, ui, kL, False)
    return aU, bU, aL, bL


@njit(cache=True)
def tanh_relaxation(l, u, paper=False):
    """(aU, bU, aL, bL) with aL*z + bL <= tanh(z) <= aU*z + bU on [l, u] (1-D float64);
    ``paper``: the paper's lines where l < 0 < u (else the least-area tangents)."""
    return _relax_family(TANH, l, u, paper)


@njit(cache=True)
def sigmoid_relaxation(l, u, paper=False):
    """(aU, bU, aL, bL) with aL*z + bL <= sigmoid(z) <= aU*z + bU on [l, u] (1-D float64);
    ``paper``: the paper's lines where l < 0 < u (else the least-area tangents)."""
    return _relax_family(SIGMOID, l, u, paper)


@njit(cache=True)
def arctan_relaxation(l, u, paper=False):
    """(aU, bU, aL, bL) with aL*z + bL <= arctan(z) <= aU*z + bU on [l, u] (1-D float64);
    ``paper``: the paper's lines where l < 0 < u (else the least-area tangents)."""
    return _relax_family(ARCTAN, l, u, paper)


@njit(cache=True)
def erf_relaxation(l, u, paper=False):
    """(aU, bU, aL, bL) with aL*z + bL <= erf(z) <= aU*z + bU on [l, u] (1-D float64);
    ``paper``: the paper's construction where l < 0 < u (else the least-area tangents)."""
    return _relax_family(ERF, l, u, paper)


# ---------------------------------------------------------------------------------------------
# alpha-CROWN: the families of valid tangent lines (crown_cli.engine.alpha_crown.SmoothRelax)
# ---------------------------------------------------------------------------------------------


@njit(cache=True)
def tangent_ranges(kind, l, u):
    """Per neuron, the range of tangent points alpha-CROWN may move each line over.

    Returns (freeU, a0U, amU, a1U, freeL, a0L, amL, a1L, grad, chord): the upper (lower) line
    may be the tangent at any d between a0 and a1 when freeU (freeL); am is CROWN's tangent
    point (``_relax_family``'s default lines). The variable theta in [0, 1] maps piecewise
    linearly onto the range (:func:`theta_point`): theta = 0 gives a0, 1/2 gives am, 1 gives
    a1, so theta = 1/2 is CROWN's line on every side, and one variable per (row, neuron)
    serves whichever side the row's sign picks. Valid ranges (every d in them gives a valid
    line; the exact intercept makes any slope sound anyway):

    * l >= 0 (concave on [l, u]): the upper line is the tangent at any d in [l, u]
      (a0 = l, am = the midpoint, a1 = u);
    * u <= 0 (convex): the lower line is the tangent at any d in [l, u];
    * l < 0 < u: the tangent at d >= 0 lies above the concave part and, at l, above act(l)
      once d >= d_U (the tangent point through (l, act(l))): act(l) <= T_d(l) and
      act(0) <= T_d(0) put it above the convex part too. So upper: d in [d_U, u]
      (am = max(mid, d_U)); lower, mirrored: d from d_L out to l (am = min(mid, d_L)). When
      d_U >= u (d_L <= l) CROWN's line is the chord: not free.

    Degenerate, infinite or NaN intervals have no free line (CROWN's lines stay).

    Also returns ``grad`` (12, n): the partial derivatives of (a0U, a1U, a0L, a1L) in l, then
    in u (rows 0-3: d/dl, rows 4-7: d/du), then of (amU, amL) in l (rows 8-9) and in u
    (rows 10-11); the crossing case's tangent point d_U depends on l through
    act'(d)(d - l) = act(d) - act(l), so d d_U/dl = (act'(d) - act'(l)) / (act''(d) (d - l)),
    and d_L on u likewise. And ``chord`` (n,): the fixed line is the chord of [l, u] (every
    non-degenerate case: the other side on one side of 0, a side that is not free when
    crossing).
    """
    n = l.shape[0]
    grad = np.zeros((12, n))
    chord = np.zeros(n, np.bool_)
    freeU = np.zeros(n, np.bool_)
    freeL = np.zeros(n, np.bool_)
    a0U = np.zeros(n)
    amU = np.zeros(n)
    a1U = np.zeros(n)
    a0L = np.zeros(n)
    amL = np.zeros(n)
    a1L = np.zeros(n)
    for i in range(n):
        li = l[i]
        ui = u[i]
        if not (math.isfinite(li) and math.isfinite(ui)):
            continue
        if _is_degenerate(li, ui):
            continue
        chord[i] = True
        mid = li + 0.5 * (ui - li)  # as _relax_family computes it
        if li >= 0.0:
            freeU[i] = True
            a0U[i] = li
            amU[i] = mid
            a1U[i] = ui
            grad[0, i] = 1.0
            grad[5, i] = 1.0
            grad[8, i] = 0.5
            grad[10, i] = 0.5
        elif ui <= 0.0:
            freeL[i] = True
            a0L[i] = li
            amL[i] = mid
            a1L[i] = ui
            grad[2, i] = 1.0
            grad[7, i] = 1.0
            grad[9, i] = 0.5
            grad[11, i] = 0.5
        else:
            freeU[i], a0U[i], a1U[i], grad[0, i], grad[5, i] = _crossing_range(kind, li, ui, True)
            freeL[i], a0L[i], a1L[i], grad[6, i], grad[3, i] = _crossing_range(kind, li, ui, False)
            if freeU[i]:
                if mid > a0U[i]:  # the midpoint's tangent: moves with both ends
                    amU[i] = mid
                    grad[8, i] = 0.5
                    grad[10, i] = 0.5
                else:  # the paper's, through (l, act(l))
                    amU[i] = a0U[i]
                    grad[8, i] = grad[0, i]
            if freeL[i]:
                if mid < a0L[i]:
                    amL[i] = mid
                    grad[9, i] = 0.5
                    grad[11, i] = 0.5
                else:
                    amL[i] = a0L[i]
                    grad[11, i] = grad[6, i]
            chord[i] = not (freeU[i] and freeL[i])
    return freeU, a0U, amU, a1U, freeL, a0L, amL, a1L, grad, chord


@njit(cache=True)
def _crossing_range(kind, l, u, upper):
    """One line of tangent_ranges' crossing case l < 0 < u: (free, a0, a1, da0, da1).

    Free: the tangent at any d in [a0, a1] = [d_U, u] (upper) or [d_L, l] (lower); da0 is the
    derivative of a0 = d_U (d_L) in the end-point p = l (u) it passes through,
    (act'(d) - act'(p)) / (act''(d) (d - p)) (0 where that denominator is 0), and da1 = 1 that
    of a1 in the other end-point. Not free (the chord): all zero.
    """
    d, use_chord = tangent_point(kind, l, u, upper)
    if use_chord:
        return False, 0.0, 0.0, 0.0, 0.0
    p = l if upper else u
    h = _d2act(kind, d) * (d - p)
    da0 = (_dact(kind, d) - _dact(kind, p)) / h if h != 0.0 else 0.0
    return True, d, u if upper else l, da0, 1.0


@njit(cache=True)
def theta_point(a0, am, a1, theta):
    """The tangent point of variable theta in [0, 1] on a range (a0, am, a1) and its
    derivative in theta: a0 + 2 theta (am - a0) up to theta = 1/2 (exactly am there), then
    am + (2 theta - 1) (a1 - am)."""
    if theta <= 0.5:
        return am - (1.0 - 2.0 * theta) * (am - a0), 2.0 * (am - a0)
    return am + (2.0 * theta - 1.0) * (a1 - am), 2.0 * (a1 - am)


@njit(cache=True)
def sound_tangent_lines(kind, l, u, d, upper):
    """(slope, intercept) of the tangent at d[i] as a sound bound on [l[i], u[i]] (upper or
    lower per upper[i]), all 1-D float64: the slope is act'(d[i]) and the intercept the exact
    one of ``_intercept`` for that slope (slack included), so the line is valid in float64
    whatever d is, even outside its range or computed inexactly."""
    n = d.shape[0]
    k = np.empty(n)
    b = np.empty(n)
    for i in range(n):
        k[i] = _dact(kind, d[i])
        b[i] = _intercept(kind, l[i], u[i], k[i], upper[i])
    return k, b


@njit(cache=True)
def steer_tangent_lines(kind, Lu, A, a0L, amL, a1L, freeL, aL, bL, a0U, amU, a1U, freeU, aU,
                        bU):
    """The lines of the rows ``Lu`` (r, n) at variables ``A`` (r, n) for steering (no rounding
    control; float32 or float64 in, the same out): per element the side the sign of Lu picks
    (lower if >= 0), the tangent at the point d of variable A when that side is free (d the
    :func:`theta_point` of the side's range), else CROWN's line (aL, bL / aU, bU). Returns
    (S, B, dS, dB, free, c, Dt, F2): slopes, intercepts, their
    derivatives in A (0 where not free), the free mask, the rows' intercept sums sum_j Lu B
    (float64), and the tangent points d and act''(d) (0 where not free).
    One pass for what ``SmoothRelax.lines`` would do with a dozen numpy temporaries."""
    r, n = Lu.shape
    S = np.empty_like(Lu)
    B = np.empty_like(Lu)
    dS = np.zeros_like(Lu)
    dB = np.zeros_like(Lu)
    free = np.zeros((r, n), np.bool_)
    Dt = np.zeros_like(Lu)
    F2 = np.zeros_like(Lu)
    c = np.zeros(r)
    for i in range(r):
        acc = 0.0
        for j in range(n):
            x = Lu[i, j]
            lower = x >= 0.0
            if lower:
                fr = freeL[j]
            else:
                fr = freeU[j]
            if fr:
                if lower:
                    d, sp = theta_point(a0L[j], amL[j], a1L[j], float(A[i, j]))
                else:
                    d, sp = theta_point(a0U[j], amU[j], a1U[j], float(A[i, j]))
                k = _dact(kind, d)
                b = _act(kind, d) - k * d
                f2 = _d2act(kind, d)
                dk = f2 * sp
                Dt[i, j] = d
                F2[i, j] = f2
                S[i, j] = k
                B[i, j] = b
                dS[i, j] = dk
                dB[i, j] = -d * dk
                free[i, j] = True
            elif lower:
                S[i, j] = aL[j]
                B[i, j] = bL[j]
                b = bL[j]
            else:
                S[i, j] = aU[j]
                B[i, j] = bU[j]
                b = bU[j]
            acc += float(x) * b
        c[i] = acc
    return S, B, dS, dB, free, c, Dt, F2


@njit(cache=True)
def steer_tangent_backward(gS, wL, free, dS, dB, lower, A, Dt, F2, chord):
    """The reverse pass of :func:`steer_tangent_lines` for ``SmoothRelax.backward``, from the
    gradients with respect to the rows' slopes ``gS`` and intercepts ``wL`` (r, n). Returns
    (ga, sums): the gradient in the variables (gS dS + wL dB where free, else 0; gS's dtype),
    and float64 column sums (8, n): for the free elements on the lower side (rows 0-2) and
    on the upper side (rows 3-5) those of E c0, E cm, E c1, with E = (gS - wL d) act''(d)
    and (c0, cm, c1) the weights of the range's points in d (:func:`theta_point`: 1 - 2
    theta, 2 theta, 0 up to theta = 1/2, then 0, 2 - 2 theta, 2 theta - 1); for the fixed
    chords (not free, ``chord[j]``) those of gS (row 6) and wL (row 7)."""
    r, n = gS.shape
    ga = np.zeros_like(gS)
    sums = np.zeros((8, n))
    for i in range(r):
        for j in range(n):
            g = gS[i, j]
            w = wL[i, j]
            if free[i, j]:
                ga[i, j] = g * dS[i, j] + w * dB[i, j]
                e = (float(g) - float(w) * float(Dt[i, j])) * float(F2[i, j])
                a = float(A[i, j])
                s = 0 if lower[i, j] else 3
                if a <= 0.5:
                    sums[s, j] += e * (1.0 - 2.0 * a)
                    sums[s + 1, j] += e * (2.0 * a)
                else:
                    sums[s + 1, j] += e * (2.0 - 2.0 * a)
                    sums[s + 2, j] += e * (2.0 * a - 1.0)
            elif chord[j]:
                sums[6, j] += float(g)
                sums[7, j] += float(w)
    return ga, sums


@njit(cache=True)
def tangent_rows(kind, theta, cols, free, ranges, bounds, sound, out):
    """Both lines of every row at its variables ``theta`` (r, k) on the columns ``cols``
    (graph alpha-CROWN's :class:`~crown_cli.engine.graph_alpha.Tangents`): where a side is
    free (``free`` (2, k): lower, upper) the tangent at the :func:`theta_point` d of the
    side's range (``ranges`` (6, k): a0, am, a1 of the lower side, then of the upper),
    written into ``out`` (4, r, n): lower slopes, lower intercepts, upper slopes, upper
    intercepts; elsewhere they keep what they hold (CROWN's lines). Steering: the intercept
    ``act(d) - act'(d) d``; ``sound``: the slope act'(d) with the exact intercept of
    :func:`sound_tangent_lines` on the neuron's interval (``bounds`` (2, k): l, u), valid
    in float64 whatever d is."""
    r, k = theta.shape
    for i in range(r):
        for q in range(k):
            j = cols[q]
            t = float(theta[i, q])
            for s in range(2):
                if not free[s, q]:
                    continue
                d, _ = theta_point(ranges[3 * s, q], ranges[3 * s + 1, q], ranges[3 * s + 2, q],
                                   t)
                slope = _dact(kind, d)
                if sound:
                    icpt = _intercept(kind, bounds[0, q], bounds[1, q], slope, s == 1)
                else:
                    icpt = _act(kind, d) - slope * d
                out[2 * s, i, j] = slope
                out[2 * s + 1, i, j] = icpt


@njit(cache=True)
def tangent_gradient_rows(kind, theta, cols, free, ranges, L, pos, z, grad):
    """d bound / d theta (r, k) into ``grad`` for :func:`tangent_rows`' lines: the row's
    coefficient L times act''(d) dd/dtheta (z - d) on the side the row took (``pos``: the
    lower), 0 where that side is not free; ``L``, ``pos`` and the relaxed inputs ``z`` (r, n)."""
    r, k = theta.shape
    for i in range(r):
        for q in range(k):
            j = cols[q]
            s = 0 if pos[i, j] else 1
            if not free[s, q]:
                grad[i, q] = 0.0
                continue
            d, span = theta_point(ranges[3 * s, q], ranges[3 * s + 1, q], ranges[3 * s + 2, q],
                                  float(theta[i, q]))
            grad[i, q] = float(L[i, j]) * _d2act(kind, d) * span * (float(z[i, j]) - d)
