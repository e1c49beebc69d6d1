"""Property tests of every activation relaxation: soundness on a dense float64 grid with exact
comparison, and the geometry of each construction (which points the lines pass through, which
slopes they have), with the tangent points checked against scipy.optimize.brentq.

Soundness is checked with NO tolerance: ``aL*z + bL <= act(z) <= aU*z + bU`` evaluated in
float64 as written, against two evaluations of act (an independent accurate one and the
project's crown_cli.activations), at 2001 evenly spaced points of each interval plus the end-
points, 0, the kinks, the tangent points and their float neighbours. The relaxations carry
their own outward slack of a few ulps for this (sigmoid_family._slack).
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import erf, expit

from crown_cli.activations import apply_activation
from crown_cli.engine.relaxations import extra as ex
from crown_cli.engine.relaxations import sigmoid_family as sf
from crown_cli.engine.relaxations.relu import relu_relaxation

TOUCH_TOL = 1e-9  # geometry checks (not soundness): line vs act at touch points, slopes
GRID = 2001


# ----------------------------------------------------------------------------- intervals

def make_intervals(seed, kinks=(0.0,)):
    """(l, u) float64 arrays covering all regimes; ``kinks`` get extra intervals around them."""
    rng = np.random.default_rng(seed)
    ls, us = [], []

    def add(lo, hi):
        lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))
        hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))
        lo, hi = np.broadcast_arrays(lo, hi)
        ls.append(np.minimum(lo, hi))
        us.append(np.maximum(lo, hi))

    # tiny widths 1e-12..1e-6 around moderate, large and special centres
    centres = np.concatenate([rng.uniform(-5, 5, 25), rng.uniform(-1e3, 1e3, 10),
                              np.repeat(np.asarray(kinks, dtype=np.float64), 5)])
    w = 10.0 ** rng.uniform(-12, -6, centres.size)
    n = centres.size
    add(centres - w * rng.uniform(0, 1, n), centres + w * rng.uniform(0, 1, n))
    # huge: |l|, |u| up to 1e3, and saturated / extreme regions
    add(rng.uniform(-1e3, 1e3, 25), rng.uniform(-1e3, 1e3, 25))
    add([20, -40, 700, -750, 999, -1000, -1000, -1e3, 1e-3, 30, -1e3, -1e-3],
        [40, -20, 750, -700, 1000, -999, 1000, -1e-3, 1e3, 1e3, -30, 1e3])
    # one-sided, positive and negative, widths over many orders
    lo = 10.0 ** rng.uniform(-4, 2, 25)
    hi = lo + 10.0 ** rng.uniform(-6, 2.5, 25)
    add(lo, hi)
    add(-hi, -lo)
    # straddling zero, asymmetric over many orders
    add(-(10.0 ** rng.uniform(-6, 3, 40)), 10.0 ** rng.uniform(-6, 3, 40))
    add([-1.0, -3.0, -0.1, -1e-300, -1.0, -2.0], [1.0, 0.1, 3.0, 1.0, 1e-300, 2.0])
    # widths spanning 1e-12..1e3 around random centres
    c = rng.uniform(-10, 10, 40)
    w = 10.0 ** rng.uniform(-12, 3, 40)
    add(c - w / 2, c + w / 2)
    # degenerate l == u, including 0 and the kinks, and subnormal
    pts = np.concatenate([rng.uniform(-20, 20, 10), [0.0, 5e-324, -5e-324, 1e-300, 40.0, -40.0],
                          np.asarray(kinks, dtype=np.float64)])
    add(pts, pts)
    # intervals ending exactly at a kink, on either side, or straddling it
    for k in kinks:
        x = 10.0 ** rng.uniform(-8, 2, 6)
        add(k - x, np.full(6, k))
        add(np.full(6, k), k + x)
        add(k - x, k + x[::-1])
    return np.ascontiguousarray(np.concatenate(ls)), np.ascontiguousarray(np.concatenate(us))


# ----------------------------------------------------------------------------- constructions

def tangent_or_chord(f, df, anchor, lo, hi, upper):
    """Touch points of the line through (anchor, f(anchor)) tangent at d in [lo, hi] (paper's
    I+- case); the chord to the far end-point if d would lie beyond it (footnotes)."""
    def H(t):
        return df(t) * (t - anchor) - (f(t) - f(anchor))

    far = hi if upper else lo
    if (H(far) >= 0) if upper else (H(far) <= 0):
        return [(far, None)]
    near = lo if upper else hi  # the zero end, where H >= 0 (upper) / <= 0 (lower) exactly;
    if (H(near) <= 0) if upper else (H(near) >= 0):  # rounding can flip its sign when |l| or u
        d = near  # is tiny, then d is within rounding of 0
    else:
        d = brentq(H, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    return [(d, float(df(d)))]


def is_degenerate(l, u):
    return u - l <= sf.DEGENERATE_REL * max(1.0, abs(l), abs(u))


def family_oracle(f, df, paper=False):
    """Expected (upper, lower) touch lists for one interval: Tables 1-2 of the paper
    (``paper``), or the default, which differs where l < 0 < u: the tangent at max(mid, d_U)
    above (min(mid, d_L) below), d_U / d_L the paper's tangent points."""
    def oracle(l, u):
        m = l + 0.5 * (u - l)
        tangent_m = [(m, float(df(m)))]
        chord = [(l, None), (u, None)]
        if is_degenerate(l, u):
            return tangent_m, tangent_m
        if l >= 0:
            return tangent_m, chord
        if u <= 0:
            return chord, tangent_m
        up = tangent_or_chord(f, df, l, 0.0, u, True)
        lo = tangent_or_chord(f, df, u, l, 0.0, False)
        if paper:
            return [(l, None)] + up, [(u, None)] + lo
        out = []
        for (d, slope), anchor, pick in ((up[0], l, max), (lo[0], u, min)):
            if slope is None:  # the chord (footnotes)
                out.append(chord)
                continue
            t = pick(d, m)
            out.append([(t, float(df(t)))] + ([(anchor, None)] if t == d else []))
        return tuple(out)
    return oracle


def relu_like_oracle(alpha, adaptive):
    """ReLU (alpha = 0) and leaky ReLU: exact pieces, chord, line through the origin."""
    def oracle(l, u):
        if l >= 0:
            return [(l, 1.0), (u, 1.0)], [(l, 1.0), (u, 1.0)]
        if u <= 0:
            return [(l, alpha), (u, alpha)], [(l, alpha), (u, alpha)]
        chord = [(l, None), (u, None)]
        s = (u - alpha * l) / (u - l)
        a = (1.0 if u >= -l else alpha) if adaptive else s
        origin = [(0.0, a)]
        return (chord, origin) if alpha <= 1 else (origin, chord)
    return oracle


def elu_oracle(alpha):
    f = lambda t: t if t > 0 else alpha * math.expm1(t)
    df = lambda t: 1.0 if t > 0 else alpha * math.exp(t)

    def oracle(l, u):
        m = l + 0.5 * (u - l)
        if l >= 0:
            return [(l, 1.0), (u, 1.0)], [(l, 1.0), (u, 1.0)]
        if u <= 0 and is_degenerate(l, u):
            return [(m, df(m))], [(m, df(m))]
        if u <= 0 or alpha <= 1:
            return [(l, None), (u, None)], [(m, df(m))]
        # alpha > 1, the least-area lines: the convex hull's supporting lines at m
        if f(l) >= l:
            upper = [(l, None), (u, None)]
        else:
            upper = [(l, None), (0.0, None)] if m < 0 else [(0.0, 1.0), (u, 1.0)]
        (d, slope), = tangent_or_chord(f, df, u, l, 0.0, False)
        if slope is None:  # the chord (the tangent point at or left of l)
            return upper, [(l, None), (u, None)]
        return upper, ([(m, df(m))] if m < d else [(u, None), (d, slope)])
    return oracle


def softplus_oracle(l, u):
    m = l + 0.5 * (u - l)
    tangent_m = [(m, float(expit(m)))]
    if is_degenerate(l, u):
        return tangent_m, tangent_m
    return [(l, None), (u, None)], tangent_m


def hard_sigmoid_oracle(alpha):
    p, q = -0.5 / alpha, 0.5 / alpha

    def oracle(l, u):
        vl, vu = alpha * l + 0.5, alpha * u + 0.5
        if vu <= 0 or vl >= 1:
            return [(l, 0.0), (u, 0.0)], [(l, 0.0), (u, 0.0)]
        if vl >= 0 and vu <= 1:
            return [(l, alpha), (u, alpha)], [(l, alpha), (u, alpha)]
        chord = [(l, None), (u, None)]
        if vu <= 1:
            return chord, [(p, alpha if u - p >= p - l else 0.0)]
        if vl >= 0:
            return [(q, alpha if q - l >= u - q else 0.0)], chord
        return ([(q, 1.0 / (q - l) if q - l >= u - q else 0.0)],
                [(p, 1.0 / (u - p) if u - p >= p - l else 0.0)])
    return oracle


# ----------------------------------------------------------------------------- cases

@dataclass
class Case:
    id: str
    name: str  # activation name in crown_cli.activations
    alpha: Optional[float]
    relax: Callable  # (l, u) -> (aU, bU, aL, bL)
    act: Callable  # independent accurate float64 evaluation, vectorised
    oracle: Callable  # (l, u) -> (upper touches, lower touches), touch = (z, slope or None)
    kinks: Sequence[float] = (0.0,)
    # allowed float error of the line, in ulps of |a z| + |b|: 0 (exact comparison) for every
    # relaxation here except relu.py's, whose chord carries no outward slack, so a*z + b can
    # round 1 ulp below the ReLU at z = u (the engine's FP_RTOL widening absorbs that)
    tol_ulps: float = 0.0


def _softplus(z):
    return np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z)))


def _tanh_d(t):
    return 1.0 / math.cosh(t) ** 2 if abs(t) < 300 else 0.0


def _sigmoid_d(t):
    return float(expit(t) * expit(-t))


def _erf_d(t):
    return 2.0 / math.sqrt(math.pi) * math.exp(-t * t)


def _relu_case(adaptive):
    return Case(f"relu-{'ada' if adaptive else 'fastlin'}", "relu", None,
                lambda l, u: relu_relaxation(l, u, adaptive), lambda z: np.maximum(z, 0.0),
                relu_like_oracle(0.0, adaptive))


def _leaky_case(a, adaptive):
    return Case(f"leaky_relu-{a:g}-{'ada' if adaptive else 'chord'}", "leaky_relu", a,
                lambda l, u: ex.leaky_relu_relaxation(l, u, a, adaptive),
                lambda z: np.where(z >= 0, z, a * z), relu_like_oracle(a, adaptive))


def _elu_case(a):
    return Case(f"elu-{a:g}", "elu", a, lambda l, u: ex.elu_relaxation(l, u, a),
                lambda z: np.where(z > 0, z, a * np.expm1(np.minimum(z, 0.0))), elu_oracle(a))


def _hard_sigmoid_case(a):
    return Case(f"hard_sigmoid-{a:.3g}", "hard_sigmoid", a,
                lambda l, u: ex.hard_sigmoid_relaxation(l, u, a),
                lambda z: np.clip(a * z + 0.5, 0.0, 1.0), hard_sigmoid_oracle(a),
                kinks=(-0.5 / a, 0.5 / a))


CASES = [
    _relu_case(True),
    _relu_case(False),
    Case("tanh", "tanh", None, sf.tanh_relaxation, np.tanh, family_oracle(math.tanh, _tanh_d)),
    Case("sigmoid", "sigmoid", None, sf.sigmoid_relaxation, expit,
         family_oracle(lambda t: float(expit(t)), _sigmoid_d)),
    Case("arctan", "arctan", None, sf.arctan_relaxation, np.arctan,
         family_oracle(math.atan, lambda t: 1.0 / (1.0 + t * t))),
    Case("erf", "erf", None, sf.erf_relaxation, erf, family_oracle(math.erf, _erf_d)),
    Case("erf-paper", "erf", None, lambda l, u: sf.erf_relaxation(l, u, True), erf,
         family_oracle(math.erf, _erf_d, paper=True)),
    Case("tanh-paper", "tanh", None, lambda l, u: sf.tanh_relaxation(l, u, True), np.tanh,
         family_oracle(math.tanh, _tanh_d, paper=True)),
    Case("sigmoid-paper", "sigmoid", None, lambda l, u: sf.sigmoid_relaxation(l, u, True), expit,
         family_oracle(lambda t: float(expit(t)), _sigmoid_d, paper=True)),
    Case("arctan-paper", "arctan", None, lambda l, u: sf.arctan_relaxation(l, u, True), np.arctan,
         family_oracle(math.atan, lambda t: 1.0 / (1.0 + t * t), paper=True)),
    Case("softplus", "softplus", None, ex.softplus_relaxation, _softplus, softplus_oracle),
    *[_leaky_case(a, ad) for a in (0.2, 0.01, 0.0, 1.5, -0.3) for ad in (True, False)],
    *[_elu_case(a) for a in (1.0, 0.5, 0.0, 1.7, 1.6732632423543772, 4.0)],
    *[_hard_sigmoid_case(a) for a in (0.2, 1.0 / 6.0)],
]


# ----------------------------------------------------------------------------- the shared check

def check_relaxation(case: Case, l, u):
    out = case.relax(l, u)
    assert len(out) == 4
    aU, bU, aL, bL = (np.asarray(x) for x in out)
    for x in (aU, bU, aL, bL):
        assert x.dtype == np.float64 and x.shape == l.shape
        assert np.all(np.isfinite(x))

    oracles = [case.oracle(float(a), float(b)) for a, b in zip(l, u)]

    # grid: evenly spaced points, end-points, kinks, touch points, and their float neighbours
    t = np.linspace(0.0, 1.0, GRID)
    Z = l[:, None] + (u - l)[:, None] * t[None, :]
    special = [np.broadcast_to(np.asarray(k, dtype=np.float64), l.shape) for k in case.kinks]
    n_touch = max(len(up) + len(lo) for up, lo in oracles)
    touch = np.array([[z for z, _ in up + lo] + [l[i]] * (n_touch - len(up) - len(lo))
                      for i, (up, lo) in enumerate(oracles)], dtype=np.float64).T
    extra = np.stack([l, u, *special, *touch], axis=1)
    extra = np.concatenate([extra, np.nextafter(extra, -np.inf), np.nextafter(extra, np.inf)],
                           axis=1)
    Z = np.concatenate([Z, extra], axis=1)
    Z = np.minimum(np.maximum(Z, l[:, None]), u[:, None])

    upper = aU[:, None] * Z + bU[:, None]
    lower = aL[:, None] * Z + bL[:, None]
    if case.tol_ulps:
        eps = np.finfo(np.float64).eps
        upper = upper + case.tol_ulps * eps * (np.abs(aU[:, None] * Z) + np.abs(bU[:, None]))
        lower = lower - case.tol_ulps * eps * (np.abs(aL[:, None] * Z) + np.abs(bL[:, None]))
    references = (("accurate", case.act(Z)),
                  ("project", apply_activation(case.name, Z, case.alpha)))
    for label, Y in references:
        bad_u = np.argwhere(~(Y <= upper))
        bad_l = np.argwhere(~(lower <= Y))
        for bad, what in ((bad_u, "upper"), (bad_l, "lower")):
            if bad.size:
                i, j = bad[0]
                pytest.fail(f"{label} {what} bound violated {len(bad)}x, e.g. [{l[i]!r}, {u[i]!r}]"
                            f" z={Z[i, j]!r} act={Y[i, j]!r} upper={upper[i, j]!r}"
                            f" lower={lower[i, j]!r}")

    # geometry: the lines pass through / are tangent where the construction says
    for i, (up, lo) in enumerate(oracles):
        for side, touches, a, b in (("upper", up, aU[i], bU[i]), ("lower", lo, aL[i], bL[i])):
            for z, slope in touches:
                fz = float(case.act(np.float64(z)))
                err = abs(a * z + b - fz)
                assert err <= TOUCH_TOL * max(1.0, abs(a * z)), \
                    f"{side} line misses ({z!r}, {fz!r}) by {err:.3g} on [{l[i]!r}, {u[i]!r}]"
                if slope is not None:
                    assert abs(a - slope) <= TOUCH_TOL * max(1.0, abs(slope)), \
                        f"{side} slope {a!r} != {slope!r} at {z!r} on [{l[i]!r}, {u[i]!r}]"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_relaxation_sound_and_touching(case):
    seed = sum(map(ord, case.id))
    l, u = make_intervals(seed, kinks=case.kinks)
    check_relaxation(case, l, u)


# ----------------------------------------------------------------------------- tangent point

FAMILY = [(sf.TANH, math.tanh, _tanh_d),
          (sf.SIGMOID, lambda t: float(expit(t)), _sigmoid_d),
          (sf.ARCTAN, math.atan, lambda t: 1.0 / (1.0 + t * t)),
          (sf.ERF, math.erf, _erf_d)]
NAMES = ["tanh", "sigmoid", "arctan", "erf"]


@pytest.mark.parametrize("kind,f,df", FAMILY, ids=NAMES)
@pytest.mark.parametrize("upper", [True, False], ids=["upper", "lower"])
def test_tangent_point_matches_brentq(kind, f, df, upper):
    """Independent root of the tables' equation (act(d) - act(p)) / (d - p) = act'(d)."""
    rng = np.random.default_rng(kind * 2 + upper)
    l = -(10.0 ** rng.uniform(-3, 3, 200))
    u = 10.0 ** rng.uniform(-3, 3, 200)
    n_tangent = n_chord = 0
    for li, ui in zip(l, u):
        d, use_chord = sf.tangent_point(kind, li, ui, upper)
        expect = tangent_or_chord(f, df, li if upper else ui, 0.0 if upper else li,
                                  ui if upper else 0.0, upper)
        (dd, slope), = expect
        if slope is None:
            n_chord += 1
            assert use_chord and d == dd
        else:
            n_tangent += 1
            assert not use_chord
            assert abs(d - dd) <= 1e-9 * max(1.0, abs(dd)), (li, ui, d, dd)
            assert (d >= 0) if upper else (d <= 0)
    assert n_tangent > 20 and n_chord > 20  # both branches of the footnotes exercised


@pytest.mark.parametrize("relax,kind", [(sf.tanh_relaxation, sf.TANH),
                                        (sf.sigmoid_relaxation, sf.SIGMOID),
                                        (sf.arctan_relaxation, sf.ARCTAN),
                                        (sf.erf_relaxation, sf.ERF)], ids=NAMES)
def test_footnote_chord_fallbacks(relax, kind):
    """Footnotes diamond / dagger: tangent point beyond the far end-point -> the chord."""
    l = np.array([-3.0, -0.1])
    u = np.array([0.1, 3.0])
    aU, bU, aL, bL = relax(l, u)
    act = np.vectorize(lambda x: sf._act(kind, x))
    chord = (act(u) - act(l)) / (u - l)
    assert sf.tangent_point(kind, -3.0, 0.1, True) == (0.1, True)
    assert sf.tangent_point(kind, -0.1, 3.0, False) == (-0.1, True)
    assert abs(aU[0] - chord[0]) <= 1e-12 and abs(aL[1] - chord[1]) <= 1e-12
    # and the other side of each interval uses a genuine tangent
    assert not sf.tangent_point(kind, -3.0, 0.1, False)[1]
    assert not sf.tangent_point(kind, -0.1, 3.0, True)[1]


@pytest.mark.parametrize("kind", [sf.TANH, sf.SIGMOID, sf.ARCTAN, sf.ERF], ids=NAMES)
def test_inverse_derivative(kind):
    """The intercepts' critical point: t >= 0 with act'(t) = k for the float k given, checked
    against 700-digit mpmath (soundness of the exact intercepts relies on it)."""
    import mpmath  # in the [test] extra: the high-precision reference
    with mpmath.workdps(700):  # 1 - 4k for k ~ 1e-300 needs ~300 digits
        exact = {sf.TANH: lambda k: mpmath.acosh(1 / mpmath.sqrt(k)),
                 sf.SIGMOID: lambda k: 2 * mpmath.atanh(mpmath.sqrt(1 - 4 * k)),
                 sf.ARCTAN: lambda k: mpmath.sqrt(1 / k - 1),
                 sf.ERF: lambda k: mpmath.sqrt(-mpmath.log(k * mpmath.sqrt(mpmath.pi) / 2))
                 }[kind]
        top = {sf.SIGMOID: 0.25, sf.ERF: sf.TWO_OVER_SQRT_PI}.get(kind, 1.0)
        ks = np.concatenate([top * (1 - 10.0 ** -np.linspace(1, 15.5, 60)),
                             top * 10.0 ** -np.linspace(0.01, 300, 200),
                             [sf._dact(kind, t) for t in 10.0 ** np.linspace(-8, 2.5, 60)]])
        for k in ks:
            if not 0 < k < top:
                continue
            got = sf._inv_dact(kind, k)
            want = exact(mpmath.mpf(float(k)))
            # erf: k / erf'(0) carries the rounding of the constant 2/sqrt(pi), ~1e-16 of
            # exp(-t^2), which moves t by ~1e-16 / t (the intercepts' slack covers the
            # resulting gap, ~1e-32 / t, many times over)
            slack = 2e-16 / want if kind == sf.ERF else 0.0
            assert abs(got - want) <= 1e-13 * want + slack, (kind, k, got, want)
    assert sf._inv_dact(kind, 0.0) == np.inf and sf._inv_dact(kind, top) == 0.0
    assert sf._inv_dact(kind, 2.0) == 0.0


@pytest.mark.parametrize("relax", [sf.tanh_relaxation, sf.sigmoid_relaxation,
                                   sf.arctan_relaxation, sf.erf_relaxation], ids=NAMES)
def test_family_nonfinite_bounds(relax):
    """Infinite pre-activation bounds give the constant bounds act(l) <= act <= act(u)."""
    l = np.array([-np.inf, -np.inf, 3.0])
    u = np.array([np.inf, 1.0, np.inf])
    aU, bU, aL, bL = relax(l, u)
    assert np.all(aU == 0) and np.all(aL == 0) and np.all(bU >= bL)
    aU, bU, aL, bL = relax(np.array([np.nan]), np.array([1.0]))
    assert np.isnan(aU[0]) and np.isnan(bL[0])


def test_parameter_validation():
    x = np.array([-1.0, 1.0])
    with pytest.raises(ValueError):
        ex.elu_relaxation(x, x, -0.5)
    with pytest.raises(ValueError):
        ex.hard_sigmoid_relaxation(x, x, 0.0)
    with pytest.raises(ValueError):
        ex.leaky_relu_relaxation(x, x, np.nan, True)


@pytest.mark.parametrize("kind,f", [(sf.TANH, np.tanh), (sf.SIGMOID, expit),
                                    (sf.ARCTAN, np.arctan), (sf.ERF, erf)], ids=NAMES)
def test_default_lines_enclose_less_area_than_the_papers(kind, f):
    """Where l < 0 < u every line of the default is at least as close to the function as the
    paper's (the mean gap over [l, u] of each line, by a dense trapezoid rule), closer on
    many intervals, and never farther anywhere the function's gap decides a bound: upper line
    mean >= act's mean, and the default's upper mean <= the paper's (lower: mirrored)."""
    relax = {sf.TANH: sf.tanh_relaxation, sf.SIGMOID: sf.sigmoid_relaxation,
             sf.ARCTAN: sf.arctan_relaxation, sf.ERF: sf.erf_relaxation}[kind]
    rng = np.random.default_rng(7 + kind)
    l = -(10.0 ** rng.uniform(-2, 1, 400))
    u = 10.0 ** rng.uniform(-2, 1, 400)
    new = relax(l, u)
    old = relax(l, u, True)
    t = np.linspace(0.0, 1.0, 2001)
    Z = l[:, None] + (u - l)[:, None] * t[None, :]
    Y = f(Z).mean(axis=1)
    zbar = Z.mean(axis=1)

    def mean_line(a, b):
        return a * zbar + b

    up_new, up_old = mean_line(new[0], new[1]), mean_line(old[0], old[1])
    lo_new, lo_old = mean_line(new[2], new[3]), mean_line(old[2], old[3])
    tol = 1e-12 * (1.0 + np.abs(Y))
    assert np.all(up_new >= Y - tol) and np.all(lo_new <= Y + tol)
    assert np.all(up_new <= up_old + tol) and np.all(lo_new >= lo_old - tol)
    better = (up_new < up_old - 1e-9) | (lo_new > lo_old + 1e-9)
    assert better.sum() > 100  # the midpoint's tangent is valid on many crossing intervals
