"""Linear relaxations of activations beyond the paper: leaky ReLU, ELU, softplus, hard sigmoid.

Same contract as the other relaxations: 1-D float64 arrays (l, u), l <= u, finite, in; four
arrays (aU, bU, aL, bL) out with ``aL*z + bL <= act(z) <= aU*z + bU`` on [l, u].

Where a line is not exactly representable (chords, tangents) its slope is chosen by the rule
stated beside it and its intercept is the tightest valid one for that slope, found by
evaluating ``act(t) - k*t`` at the few points where its max / min over [l, u] can be (the end-
points, the kinks, and the point where act' = k on a convex piece), then moved outward by the
float64 allowance ``_slack`` of sigmoid_family (8 ulps of the terms involved). Lines that are
exactly the activation's own pieces (z, alpha*z, constants) carry no slack: they are
evaluated by the same float operations as the activation itself (round-to-nearest is
monotone, so e.g. fl(a*z) <= fl(alpha*z) whenever a*z <= alpha*z).

Tangent lines on convex pieces are taken at the midpoint of [l, u]: among all tangents of a
convex f it is the one that minimises the area between f and the line (d/dd of the tangent's
integral over [l, u] is f''(d) (m - d)), the same criterion as CROWN-Ada's ReLU choice.
"""
import math

import numpy as np
from numba import njit

from crown_cli.engine.relaxations.sigmoid_family import (ELU, HARD_SIGMOID, MAX_ITER, SOFTPLUS, _clip, _elu, _exact_intercept,
                             _hsig, _is_degenerate, _sigmoid, _slack, _softplus, _split)


# ----------------------------------------------------------------------------- leaky ReLU

@njit(cache=True)
def leaky_relu_relaxation(l, u, alpha, adaptive):
    """Leaky ReLU f(z) = z (z >= 0), alpha*z (z < 0), for any finite alpha.

    alpha <= 1: f = max(z, alpha z) is convex. Unstable (l < 0 < u): upper = chord through
    (l, alpha l), (u, u); lower = a z with any a in [alpha, 1] (a z <= z for z >= 0 as a <= 1,
    a z <= alpha z for z < 0 as a >= alpha). alpha >= 1: f = min(z, alpha z) is concave and
    the roles swap (lower = chord, upper = a z with a in [1, alpha]). The area between f and
    a z is (|1 - a| u^2 + |a - alpha| l^2) / 2, linear in a, so ``adaptive`` takes a = 1 if
    u >= -l else alpha (CROWN-Ada); otherwise a = the chord's slope (Fast-Lin), which lies
    between alpha and 1. alpha = 0 gives relu_relaxation's lines: the same slopes, and the
    chord's intercept differs only in its float slack (this module's 8 ulps, relu.py's 4).
    """
    if not math.isfinite(alpha):
        raise ValueError("leaky_relu_relaxation: alpha must be finite")
    n = l.shape[0]
    aU = np.zeros(n)
    bU = np.zeros(n)
    aL = np.zeros(n)
    bL = np.zeros(n)
    lo_s = min(alpha, 1.0)
    hi_s = max(alpha, 1.0)
    convex = alpha <= 1.0
    for i in range(n):
        li = l[i]
        ui = u[i]
        if li >= 0.0:
            aU[i] = 1.0
            aL[i] = 1.0
        elif ui <= 0.0:
            aU[i] = alpha
            aL[i] = alpha
        else:
            fl = alpha * li
            s = (ui - fl) / (ui - li)  # u - l >= u > 0: no division by ~0
            if adaptive:
                a = 1.0 if ui >= -li else alpha
            else:
                a = _clip(s, lo_s, hi_s)  # keep the rounded chord slope inside [alpha, 1]
            # chord: f - s z is convex (concave) so its max (min) is at an end-point
            g1 = fl - s * li
            g2 = ui - s * ui
            S = max(abs(fl), abs(ui))
            M = max(-li, ui)
            if convex:
                b = max(g1, g2)
                aU[i] = s
                bU[i] = b + _slack(s, b, M, S)
                aL[i] = a
            else:
                b = min(g1, g2)
                aL[i] = s
                bL[i] = b - _slack(s, b, M, S)
                aU[i] = a
    return aU, bU, aL, bL


# ----------------------------------------------------------------------------- ELU

@njit(cache=True)
def _delu(t, alpha):
    """f'(t); at the kink t = 0 the left derivative alpha (a subgradient when alpha <= 1)."""
    return 1.0 if t > 0.0 else alpha * math.exp(t)


@njit(cache=True)
def _elu_intercept(l, u, k, alpha, upper):
    """Tightest sound intercept for slope k.

    f - k t is convex on [l, u]∩(-inf, 0] (alpha >= 0) and linear on [l, u]∩[0, inf): its max
    is at l, u or 0; its min at l, u, 0 or log(k / alpha) (where alpha e^t = k, if in (-inf, 0)).
    """
    tk = 0.0
    if 0.0 < k < alpha:
        tk = math.log(k / alpha)
    return _exact_intercept(ELU, alpha, l, u, k, upper, (0.0, tk), 0.0)


@njit(cache=True)
def elu_tangent_point(l, u, alpha):
    """alpha > 1, l < 0 < u: (d, use_chord) for the lower line through (u, u) tangent at d < 0.

    H(t) = f'(t)(t - u) - (f(t) - u) = alpha e^t (t - u - 1) + alpha + u is decreasing on
    (-inf, 0] (derivative alpha e^t (t - u) < 0) with H(0) = u (1 - alpha) < 0; if H(l) <= 0
    the tangent point is at or left of l and the chord is the bound. Bisection.
    """
    if alpha * math.exp(l) * (l - u - 1.0) + alpha + u <= 0.0:
        return l, True
    lo = l
    hi = 0.0
    for _ in range(MAX_ITER):
        mid = _split(lo, hi)
        if mid <= lo or mid >= hi or hi - lo <= 1e-14 * max(abs(lo), abs(hi)):
            break
        if alpha * math.exp(mid) * (mid - u - 1.0) + alpha + u > 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi), False


@njit(cache=True)
def elu_relaxation(l, u, alpha=1.0):
    """ELU f(z) = z (z > 0), alpha (e^z - 1) (z <= 0), for alpha >= 0 (ValueError otherwise).

    f' is 1 on z > 0 and alpha e^z on z < 0: nondecreasing (f convex) iff alpha >= 0 (e^z
    increasing) and alpha <= 1 (no downward jump of f' at 0). So for 0 <= alpha <= 1, f is
    convex: upper = chord, lower = tangent at the midpoint (slope = subgradient alpha at 0).
    For alpha > 1 (ONNX Selu's 1.6733; graph nodes only) it is convex on z <= 0, linear on
    z >= 0 with a concave kink at 0, and for l < 0 < u each line is the one of least area,
    the supporting line of the convex hull of f's graph over [l, u] at the midpoint m (area
    = w times the line's value at m). Upper: the hull's top is the chord if f(l) >= l, else
    the segments (l, f(l)) - (0, 0) - (u, u): the line through the kink with slope f(l)/l
    if m < 0, else the identity's line (slope 1). Lower: the hull's bottom is f on [l, d],
    then the segment to (u, u) tangent at d < 0 (elu_tangent_point; the chord if d <= l):
    the tangent at min(m, d). Only the slopes are choices; the intercepts are the exact
    extremes of f(t) - k t (_elu_intercept: f - k t is convex on [l, 0] and linear on
    [0, u], so its extremes lie at l, u, 0 or where alpha e^t = k), rounded outward.
    """
    if not alpha >= 0.0:
        raise ValueError("elu_relaxation: alpha must be >= 0")
    n = l.shape[0]
    aU = np.empty(n)
    bU = np.empty(n)
    aL = np.empty(n)
    bL = np.empty(n)
    for i in range(n):
        li = l[i]
        ui = u[i]
        if li >= 0.0:  # identity, exact
            aU[i] = 1.0
            bU[i] = 0.0
            aL[i] = 1.0
            bL[i] = 0.0
            continue
        w = ui - li
        m = li + 0.5 * w
        if ui <= 0.0 and _is_degenerate(li, ui):
            # (smooth side only: across the kink the chord below has no cancellation, as
            # f(u) = u > 0 >= f(l), and is the tighter choice)
            kU = _delu(m, alpha)
            kL = kU
        elif ui <= 0.0 or alpha <= 1.0:  # convex on [l, u]
            kU = (_elu(ui, alpha) - _elu(li, alpha)) / w
            kL = _delu(m, alpha)
        else:  # alpha > 1, l < 0 < u: the least-area lines
            fl = _elu(li, alpha)
            if fl >= li:
                kU = (ui - fl) / w
            else:
                kU = fl / li if m < 0.0 else 1.0
            d, use_chord = elu_tangent_point(li, ui, alpha)
            kL = (ui - fl) / w if use_chord else _delu(min(m, d), alpha)
        aU[i] = kU
        bU[i] = _elu_intercept(li, ui, kU, alpha, True)
        aL[i] = kL
        bL[i] = _elu_intercept(li, ui, kL, alpha, False)
    return aU, bU, aL, bL


# ----------------------------------------------------------------------------- softplus

@njit(cache=True)
def _softplus_intercept(l, u, k, upper):
    """f convex, so f - k t has its max at l or u and its min also where f' = sigmoid = k."""
    tk = 0.0
    if 0.0 < k < 1.0:
        tk = math.log(k) - math.log1p(-k)  # logit(k)
    elif k >= 1.0:
        tk = np.inf
    else:
        tk = -np.inf
    return _exact_intercept(SOFTPLUS, 0.0, l, u, k, upper, (tk,), 0.0)


@njit(cache=True)
def softplus_relaxation(l, u):
    """softplus f(z) = log(1 + e^z), convex with f' = sigmoid in (0, 1).

    upper = chord through both end-points; lower = tangent at the midpoint (minimal area).
    """
    n = l.shape[0]
    aU = np.empty(n)
    bU = np.empty(n)
    aL = np.empty(n)
    bL = np.empty(n)
    for i in range(n):
        li = l[i]
        ui = u[i]
        w = ui - li
        kL = _sigmoid(li + 0.5 * w)
        if _is_degenerate(li, ui):
            kU = kL
        else:
            kU = (_softplus(ui) - _softplus(li)) / w
        aU[i] = kU
        bU[i] = _softplus_intercept(li, ui, kU, True)
        aL[i] = kL
        bL[i] = _softplus_intercept(li, ui, kL, False)
    return aU, bU, aL, bL


@njit(cache=True)
def softplus_threshold_relaxation(l, u, T):
    """``f(z) = z if z > T else softplus(z)`` (torch's Softplus as its default exporter writes
    it: ``Where(Greater(z, T), z, Softplus(z))``, T = 20): where l > T the identity, where
    u <= T softplus's lines; across T softplus's upper line (f <= softplus everywhere) and its
    lower line moved down by log1p(exp(-T)) (rounded up), the most f falls below softplus."""
    aU, bU, aL, bL = softplus_relaxation(l, u)
    drop = math.log1p(math.exp(-T))
    drop = drop + 4.0 * 2.0 ** -52 * drop + 5e-324
    for i in range(l.shape[0]):
        if l[i] > T:
            aU[i] = 1.0
            bU[i] = 0.0
            aL[i] = 1.0
            bL[i] = 0.0
        elif u[i] > T:
            bL[i] = bL[i] - drop
    return aU, bU, aL, bL


# ----------------------------------------------------------------------------- hard sigmoid

@njit(cache=True)
def _hsig_intercept(l, u, k, alpha, upper):
    """h - k t is piecewise linear with kinks at p = -0.5/alpha, q = 0.5/alpha: extremes on
    [l, u] are at l, u, p or q (clipped)."""
    # S = 1 (>= |h|): the terms alpha*z + 0.5 and the clip bounds are O(1); the kinks of the
    # float function sit within a few ulps of p and q, which moves h - k t by < ulps of
    # (1 + |k| M)
    return _exact_intercept(HARD_SIGMOID, alpha, l, u, k, upper, (-0.5 / alpha, 0.5 / alpha), 1.0)


@njit(cache=True)
def hard_sigmoid_relaxation(l, u, alpha=0.2):
    """Hard sigmoid h(z) = clip(alpha z + 0.5, 0, 1), Keras 2's definition (alpha = 0.2;
    Keras 3 uses relu6(z + 3) / 6, i.e. alpha = 1/6). alpha > 0, else ValueError.

    Kinks p = -0.5/alpha (h = 0 left of it) and q = 0.5/alpha (h = 1 right of it); h is convex
    on (-inf, q], concave on [p, inf). Lines are supporting lines of the convex hull of h's
    graph over [l, u], the free slope picked to minimise the area to h (as CROWN-Ada):
      [l, u] inside one piece           both lines = that piece;
      l < p < u <= q  (convex)          upper = chord; lower through (p, 0), slope alpha if
                                        u - p >= p - l else 0;
      p <= l < q < u  (concave)         lower = chord; upper through (q, 1), slope alpha if
                                        q - l >= u - q else 0;
      l < p, q < u                      upper through (q, 1), slope 1/(q - l) (the segment
                                        from (l, 0)) if q - l >= u - q else 0; lower through
                                        (p, 0), slope 1/(u - p) if u - p >= p - l else 0.
    (For a line through a hull vertex with slope s the area is linear in s, so an end of the
    valid slope range is optimal.)
    """
    if not alpha > 0.0:
        raise ValueError("hard_sigmoid_relaxation: alpha must be > 0")
    p = -0.5 / alpha
    q = 0.5 / alpha
    n = l.shape[0]
    aU = np.empty(n)
    bU = np.empty(n)
    aL = np.empty(n)
    bL = np.empty(n)
    for i in range(n):
        li = l[i]
        ui = u[i]
        w = ui - li
        # the piece tests are made on the float values alpha*z + 0.5 that np.clip sees (h is
        # monotone in float too), so lines equal to a piece are exact and need no slack
        vl = alpha * li + 0.5
        vu = alpha * ui + 0.5
        if vu <= 0.0:
            aU[i] = 0.0
            bU[i] = 0.0
            aL[i] = 0.0
            bL[i] = 0.0
            continue
        if vl >= 1.0:
            aU[i] = 0.0
            bU[i] = 1.0
            aL[i] = 0.0
            bL[i] = 1.0
            continue
        if vl >= 0.0 and vu <= 1.0:
            aU[i] = alpha
            bU[i] = 0.5
            aL[i] = alpha
            bL[i] = 0.5
            continue
        # here [l, u] contains a kink, so w > 0; a chord's slope is in [0, alpha] mathematically
        # and is clamped there after rounding (h's float values are O(1), so a tiny w could
        # otherwise inflate it); the intercept is exact for whatever slope results
        if vu <= 1.0:  # l < p < u <= q
            kU = _clip((_hsig(ui, alpha) - _hsig(li, alpha)) / w, 0.0, alpha)
            kL = alpha if ui - p >= p - li else 0.0
        elif vl >= 0.0:  # p <= l < q < u
            kL = _clip((_hsig(ui, alpha) - _hsig(li, alpha)) / w, 0.0, alpha)
            kU = alpha if q - li >= ui - q else 0.0
        else:  # l < p < q < u
            kU = 1.0 / (q - li) if q - li >= ui - q else 0.0
            kL = 1.0 / (ui - p) if ui - p >= p - li else 0.0
        aU[i] = kU
        bU[i] = _hsig_intercept(li, ui, kU, alpha, True)
        aL[i] = kL
        bL[i] = _hsig_intercept(li, ui, kL, alpha, False)
    return aU, bU, aL, bL
