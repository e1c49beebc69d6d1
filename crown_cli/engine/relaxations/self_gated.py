"""Linear relaxations of the self-gated activations ``z g(s z)``: GELU, ``z (1 + erf(s z)) / 2``
(s = 1 / sqrt 2 for the standard GELU; a graph's own constant where PyTorch's exported pattern
was fused: graph/onnx_fusion.py), SiLU (swish), ``z sigmoid(s z)`` (s = 1 for SiLU), and
hard swish, ``z clip(z / 6 + 1 / 2, 0, 1)`` (ONNX HardSwish: 0 up to -3, ``z (z + 3) / 6`` to
3, then z; s is 1), Mish, ``z tanh(softplus(z))`` (s is 1), and GELU's tanh form,
``z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3))) / 2`` (ONNX Gelu with approximate='tanh';
evaluated as ``z sigmoid(2 sqrt(2 / pi) (z + 0.044715 z^3))``; s is 1).

Neither is monotone nor convex: with x = s z, f' is a function of x alone that falls on
(-inf, -c], rises on [-c, c] and falls on [c, inf) (GELU: f'' has the sign of 1 - x^2, c = 1;
SiLU: c = 2.39936), from 0 down to -0.1289 (SiLU -0.0998) and up to 1.1289 (1.0998), then
down to 1; f has one minimum, at x = -0.5316 (SiLU -1.2785), of -0.12019 / s (-0.27846 / s).
Hard swish: f' is 0, then (2 z + 3) / 6 from -1/2 to 3/2, then 1; its minimum -3/8 at -3/2.
Mish: the same shape with pieces cut at -2.25638 and 1.49057 (f' from 0 down to -0.1125, up to
1.0885, down to 1), its minimum -0.30884 at -1.19243. GELU's tanh form: pieces cut at
+-1.41850, f' down to -0.12899 and up to 1.12899, its minimum -0.170041 at -0.752461.

The lines follow sigmoid_family's rule: only the slope is a choice; the intercept is the
tightest one for it, the max (upper) or min (lower) of ``f(t) - k t`` over [l, u], which is
reached at l, u or a point where f'(t) = k. f' is monotone on each of the three pieces, so
each piece, cut to [l, u], holds at most one such point, found by bisection (a point found
only to within rounding moves ``f(t) - k t`` by a second-order amount, far inside the slack).
The intercept is then moved outward by sigmoid_family's ``_slack``, which here also covers
the rounding of ``s z`` (erfc's argument; in the far negative tail its relative effect on f
is hundreds of ulps). Slopes tried: the chord
and the tangents' slopes at l, u and the quarter points; each line is the one of least area
(its mean over [l, u], its value at the midpoint, smallest above / largest below).
Infinite bounds give constant lines: f >= its minimum, f <= max(0, f(u)).
"""
import math

import numpy as np
from numba import njit

from crown_cli.engine.relaxations.sigmoid_family import _slack

GELU = 0
SILU = 1
HARDSWISH = 2
MISH = 3
GELU_TANH = 4
SQRT_2_OVER_PI = 0.7978845608028654
INV_SQRT_PI = 0.5641895835477563  # 1 / sqrt(pi)
# per kind, in x = s z: the inflection points (f' rises between them); min_x of f's scaled
# form (x g(x)), rounded down, and where it is reached (f's minimum is this / s, at this / s)
INFLECTION_LO = (-1.0, -2.3993572805154677, -3.0, -2.256376396360793, -1.4185040087908284)
INFLECTION_HI = (1.0, 2.3993572805154677, 3.0, 1.4905711794854285, 1.4185040087908284)
SCALED_MIN = (-0.12018779341550552, -0.2784645427610738, -0.375, -0.3088434130172505,
              -0.1700407505712541)
SCALED_ARGMIN = (-0.5315968851493932, -1.2784645427610738, -1.5, -1.1924312145154952,
                 -0.7524614220710163)
BISECT = 200


@njit(cache=True)
def _sigmoid(x):
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@njit(cache=True)
def _mish_gate(t):
    """(tanh(softplus(t)), 1 - that) without cancellation: with e = exp(t), n = e (e + 2),
    tanh(softplus(t)) = n / (n + 2); for large t in powers of exp(-t)."""
    if t > 20.0:
        e = math.exp(-t)
        d = 1.0 + 2.0 * e + 2.0 * e * e
        return (1.0 + 2.0 * e) / d, 2.0 * e * e / d
    e = math.exp(t)
    n = e * (e + 2.0)
    return n / (n + 2.0), 2.0 / (n + 2.0)


@njit(cache=True)
def _gelu_tanh_arg(t):
    """2 sqrt(2 / pi) (t + 0.044715 t^3) (GELU's tanh form is t sigmoid of it)."""
    return 2.0 * SQRT_2_OVER_PI * (t + 0.044715 * t * t * t)


@njit(cache=True)
def _f(kind, s, t):
    if kind == GELU_TANH:
        return t * _sigmoid(_gelu_tanh_arg(t))
    if kind == MISH:
        return t * _mish_gate(t)[0]
    if kind == SILU:
        return t * _sigmoid(s * t)
    if kind == HARDSWISH:
        if t <= -3.0:
            return 0.0
        return t if t >= 3.0 else t * (t + 3.0) / 6.0
    return 0.5 * t * math.erfc(-s * t)  # 1 + erf(x) = erfc(-x), without cancellation


@njit(cache=True)
def _df(kind, s, t):
    x = s * t
    if kind == GELU_TANH:
        y = _gelu_tanh_arg(t)
        g = _sigmoid(y)
        d = g * _sigmoid(-y)
        if d == 0.0:  # far tails: t times an underflowed 0 (t^2 may be inf)
            return g
        return g + t * d * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * t * t)
    if kind == MISH:  # g + t g' with g' = (1 - g^2) sigmoid(t)
        g, h = _mish_gate(t)
        return g + t * h * (1.0 + g) * _sigmoid(t)
    if kind == SILU:
        g = _sigmoid(x)
        return g + x * g * _sigmoid(-x)
    if kind == HARDSWISH:  # the middle piece's on [-3, 3] closed (its roots are bracketed)
        if t < -3.0:
            return 0.0
        return 1.0 if t > 3.0 else (2.0 * t + 3.0) / 6.0
    return 0.5 * math.erfc(-x) + x * INV_SQRT_PI * math.exp(-x * x)


@njit(cache=True)
def _root(kind, s, a, b, k):
    """The t in [a, b] with f'(t) = k where f' is monotone on [a, b] and f'(a) - k, f'(b) - k
    differ in sign (else a or b: the end with f' nearer k)."""
    fa = _df(kind, s, a) - k
    fb = _df(kind, s, b) - k
    if fa == 0.0:
        return a
    if fb == 0.0:
        return b
    if (fa > 0.0) == (fb > 0.0):
        return a if abs(fa) <= abs(fb) else b
    for _ in range(BISECT):
        m = 0.5 * a + 0.5 * b
        if m <= a or m >= b:
            break
        fm = _df(kind, s, m) - k
        if fm == 0.0:
            return m
        if (fm > 0.0) == (fa > 0.0):
            a, fa = m, fm
        else:
            b = m
    return a


@njit(cache=True)
def _intercept(kind, s, l, u, k, upper):
    """The tightest sound intercept of a line of slope k above (``upper``) or below f on
    [l, u] (finite), slack included."""
    best = 0.0
    S = 0.0
    # candidates: l, u, the pieces' ends inside [l, u] and one point per piece with f' = k
    cuts = (-np.inf, INFLECTION_LO[kind] / s, INFLECTION_HI[kind] / s, np.inf)
    pts = [l, u]
    for j in range(3):
        a = max(cuts[j], l)
        b = min(cuts[j + 1], u)
        if a < b:
            pts.append(a)
            pts.append(b)
            pts.append(_root(kind, s, a, b, k))
    for j in range(len(pts)):
        t = pts[j]
        v = _f(kind, s, t)
        g = v - k * t
        if j == 0 or (upper and g > best) or ((not upper) and g < best):
            best = g
        # |f| and the rounding of s t: erfc's relative error from it is ~2 x^2 u, which in
        # the far negative tail (f ~ 1e-100) is hundreds of ulps of f; it is at most about
        # |t f'(t)| u, covered here with room
        S = max(S, abs(v), 2.0 * abs(t * _df(kind, s, t)))
    sl = _slack(k, best, max(abs(l), abs(u)), S)
    return best + sl if upper else best - sl


@njit(cache=True)
def _floor(kind, s):
    """f's minimum, SCALED_MIN / s, rounded down (a bound below f everywhere)."""
    fmin = SCALED_MIN[kind] / s
    return fmin - 4.0 * 2.0 ** -52 * abs(fmin)


@njit(cache=True)
def _relax(kind, l, u, s):
    n = l.shape[0]
    aU = np.empty(n)
    bU = np.empty(n)
    aL = np.empty(n)
    bL = np.empty(n)
    fmin = _floor(kind, s)
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
            aU[i] = 0.0
            aL[i] = 0.0
            bL[i] = fmin
            if math.isfinite(ui):  # f < 0 left of 0 and rises on [0, u]
                top = max(0.0, _f(kind, s, ui))
                bU[i] = top + _slack(0.0, top, 0.0, top)
            else:
                bU[i] = np.inf
            continue
        aU[i] = 0.0  # replaced below unless no slope is finite (an overflowing width)
        bU[i] = np.inf
        aL[i] = 0.0
        bL[i] = fmin
        w = ui - li
        mid = li + 0.5 * w
        bestU = np.inf
        bestL = -np.inf
        for j in range(6):
            if j < 5:
                k = _df(kind, s, li + 0.25 * j * w)
            elif w > 0.0:
                k = (_f(kind, s, ui) - _f(kind, s, li)) / w
            else:
                continue
            if not math.isfinite(k):
                continue
            b = _intercept(kind, s, li, ui, k, True)
            if k * mid + b < bestU:
                bestU = k * mid + b
                aU[i] = k
                bU[i] = b
            b = _intercept(kind, s, li, ui, k, False)
            if k * mid + b > bestL:
                bestL = k * mid + b
                aL[i] = k
                bL[i] = b
    return aU, bU, aL, bL


@njit(cache=True)
def gelu_relaxation(l, u, s=0.7071067811865476):
    """(aU, bU, aL, bL) with aL*z + bL <= z (1 + erf(s z)) / 2 <= aU*z + bU on [l, u]
    (1-D float64; s > 0)."""
    return _relax(GELU, l, u, s)


@njit(cache=True)
def silu_relaxation(l, u, s=1.0):
    """(aU, bU, aL, bL) with aL*z + bL <= z sigmoid(s z) <= aU*z + bU on [l, u] (1-D
    float64; s > 0)."""
    return _relax(SILU, l, u, s)


@njit(cache=True)
def hardswish_relaxation(l, u):
    """(aU, bU, aL, bL) with aL*z + bL <= z clip(z / 6 + 1 / 2, 0, 1) <= aU*z + bU on [l, u]
    (1-D float64)."""
    return _relax(HARDSWISH, l, u, 1.0)


@njit(cache=True)
def mish_relaxation(l, u):
    """(aU, bU, aL, bL) with aL*z + bL <= z tanh(softplus(z)) <= aU*z + bU on [l, u] (1-D
    float64)."""
    return _relax(MISH, l, u, 1.0)


@njit(cache=True)
def _widen(lo, hi, allowance):
    """lo - allowance and hi + allowance, rounded outward (in place)."""
    if allowance > 0.0:
        pad = allowance * (1.0 + 4.0 * 2.0 ** -52)
        for i in range(lo.shape[0]):
            lo[i] = lo[i] - pad - 4.0 * 2.0 ** -52 * abs(lo[i])
            hi[i] = hi[i] + pad + 4.0 * 2.0 ** -52 * abs(hi[i])


@njit(cache=True)
def gelu_tanh_relaxation(l, u, allowance=0.0):
    """(aU, bU, aL, bL) with aL*z + bL <= GELU's tanh form <= aU*z + bU on [l, u] (1-D
    float64); with ``allowance`` > 0 the intercepts moved out by it, for a function within
    ``allowance`` of the tanh form (the exported chain's float32 constants)."""
    aU, bU, aL, bL = _relax(GELU_TANH, l, u, 1.0)
    _widen(bL, bU, allowance)
    return aU, bU, aL, bL


@njit(cache=True)
def _values(kind, z, s, out):
    for i in range(z.size):
        out[i] = _f(kind, s, z[i])


def values(kind: int, z, s):
    """f(z) elementwise (numpy in, numpy out; float32 stays float32), by the same libm
    functions as the lines (scipy's erfc is ~50 ulps off in GELU's far negative tail, and
    numpy's 0.5 (1 + tanh(x / 2)) sigmoid loses SiLU's)."""
    z = np.asarray(z)
    flat = np.ascontiguousarray(z, dtype=np.float64).reshape(-1)
    out = np.empty_like(flat)
    _values(kind, flat, float(s), out)
    dtype = z.dtype if z.dtype in (np.float32, np.float64) else np.float64
    return out.reshape(z.shape).astype(dtype, copy=False)


def derivatives(kind: int, z, s):
    """f'(z) elementwise (numpy; for the attacks)."""
    z = np.asarray(z, np.float64)
    x = s * z
    if kind == SILU:
        g = 0.5 * (1.0 + np.tanh(0.5 * x))
        return g + x * g * (1.0 - g)
    if kind == HARDSWISH:
        return np.where(z <= -3.0, 0.0, np.where(z >= 3.0, 1.0, (2.0 * z + 3.0) / 6.0))
    if kind == GELU_TANH:
        y = 2.0 * SQRT_2_OVER_PI * (z + 0.044715 * z ** 3)
        g = 0.5 * (1.0 + np.tanh(0.5 * y))
        with np.errstate(invalid="ignore", over="ignore"):
            d = z * g * (1.0 - g) * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * z * z)
        return g + np.nan_to_num(d, nan=0.0)
    if kind == MISH:
        sp = np.logaddexp(0.0, z)
        g = np.tanh(sp)
        return g + z * (1.0 - g * g) * 0.5 * (1.0 + np.tanh(0.5 * z))
    from scipy.special import erfc

    return 0.5 * erfc(-x) + x * INV_SQRT_PI * np.exp(-x * x)


@njit(cache=True)
def value_range(kind, l, u, s):
    """f's exact range on each [l_i, u_i], rounded outward (f falls to its one minimum,
    then rises): (lo, hi) 1-D float64."""
    n = l.shape[0]
    lo = np.empty(n)
    hi = np.empty(n)
    tmin = SCALED_ARGMIN[kind] / s
    near = 1e-9 * abs(tmin)
    fmin = _floor(kind, s)
    for i in range(n):
        li = l[i]
        ui = u[i]
        if li != li or ui != ui:
            lo[i] = np.nan
            hi[i] = np.nan
            continue
        fl = _f(kind, s, li) if math.isfinite(li) else 0.0
        fu = _f(kind, s, ui) if math.isfinite(ui) else np.inf
        pl = _slack(0.0, 0.0, 0.0, abs(fl) + 2.0 * abs(li * _df(kind, s, li))) \
            if math.isfinite(li) else 0.0
        pu = _slack(0.0, 0.0, 0.0, abs(fu) + 2.0 * abs(ui * _df(kind, s, ui))) \
            if math.isfinite(ui) else 0.0
        hi[i] = max(fl + pl, fu + pu)
        if li <= tmin + near and ui >= tmin - near:
            lo[i] = fmin
        else:  # monotone on [l, u]
            lo[i] = min(fl - pl, fu - pu)
    return lo, hi
