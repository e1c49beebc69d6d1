"""alpha-CROWN: CROWN's back-substitution with the free relaxation slopes as inputs, their
gradient, and the optimisation of the slopes (Xu et al., ICLR 2021).

CROWN relaxes an unstable ReLU (l < 0 < u) by the chord of [l, u] above and a line a*z
below with a fixed rule (a = 1 if u >= -l else 0); any a in [0, 1] is valid (leaky ReLU with
slope alpha <= 1: a in [alpha, 1]; alpha > 1: the chord is below and a z, a in [1, alpha],
above). Here the free slope is an input, one per (bounded row, unstable neuron): every
intermediate neuron's lower and upper bound and every margin row has its own slopes, so
CROWN and Fast-Lin are this back-substitution at particular slopes.

Engine side: arrays in, arrays out. :func:`chain` is the back-substitution of a matrix of rows
``Lam`` (r, n_m) over hidden layers 0..m with per-row free slopes; with ``tape`` it records
what :func:`chain_backward` needs to return the gradient of ``w . lower`` with respect to the
slopes and to each layer's (l, u) (through the chord). :class:`AlphaBounds` runs all
intermediate layers and the margin for one image (jointly: the margin's gradient flows into
the intermediate bounds through the chords), keeps the slopes across radii (warm start), and
evaluates in float32 (steering) or float64 (sound, widened like engine/dense_crown.py plus the charged
rounding of every step).

tanh, sigmoid and arctan (:class:`SmoothRelax`): the free variable of a (row, neuron) is the
position theta in [0, 1] of the tangent point within the range where every tangent is a valid
line (``sigmoid_family.tangent_ranges``); slopes act'(d) and intercepts act(d) - act'(d) d
with their derivatives in theta for steering, and in the sound evaluation the slope act'(d)
with the exact, rounding-padded intercept CROWN itself uses (valid for any d).

Shapes keep a door open for branch and bound: every function takes the rows of one domain;
a batch of domains is a batch of row blocks with their own (l, u) and slopes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import numpy as np

from crown_cli.activations import ACTIVATIONS
from crown_cli.engine.deadline import check_deadline
from crown_cli.engine.optim import AdamSettings, KeyedAdam
from crown_cli.engine.dense_crown import Network, _mm, back_substitute, first_layer_center, hidden_layer_bounds
from crown_cli.engine.batch_steps import Rows
from crown_cli.engine.input_sets import Box, input_terms
from crown_cli.engine.rounding import ERR_SAFETY, widen as _widen, rounding_weights

U64 = 2.0 ** -53  # unit roundoff of float64


def first_bounds(net: Network, x0, eps, qcode, first=None):
    """Bounds of the first hidden layer's pre-activations (closed form, as engine/dense_crown.py)."""
    center, cmag = first_layer_center(net, x0) if first is None else first
    n1 = net.first_layer_norms(qcode)
    mag = cmag + eps * n1
    return _widen(center - eps * n1, mag, -1.0), _widen(center + eps * n1, mag, 1.0)


class LayerRelax:
    """The relaxation of one hidden layer at bounds (l, u), split into the part CROWN fixes
    and the free slopes of the unstable neurons.

    ``aL, bL, aU, bU``: CROWN's relaxation (``relax_fn``), sound (chord padded for rounding).
    ``unst``: unstable neurons; ``cols``: neurons with a nonzero slope on either side;
    ``upos``: positions of ``unst`` within ``cols``. ``free_lower``: the free line is the
    lower one (leak <= 1). ``lo, hi``: range of the free slope. ``default``: CROWN's free
    slope of each unstable neuron. ``cs, cb``: the chord's slope and intercept (padded);
    ``ds_dl, ds_du, db_dl, db_du``: their derivatives (of the unpadded chord).
    """

    def __init__(self, l, u, relax_fn, leak: float):
        self.l, self.u = l, u
        aU, bU, aL, bL = relax_fn(l, u)
        self.aU, self.bU, self.aL, self.bL = aU, bU, aL, bL
        self.free_lower = leak <= 1.0
        self.lo, self.hi = min(leak, 1.0), max(leak, 1.0)
        unstable = (l < 0.0) & (u > 0.0)
        self.unst = np.flatnonzero(unstable)
        self.cols = np.flatnonzero((aU != 0.0) | (aL != 0.0) | unstable)
        self.upos = np.searchsorted(self.cols, self.unst)
        lu, uu = l[self.unst], u[self.unst]
        if self.free_lower:
            self.default = aL[self.unst].copy()
            self.cs, self.cb = aU[self.unst], bU[self.unst]
        else:
            self.default = aU[self.unst].copy()
            self.cs, self.cb = aL[self.unst], bL[self.unst]
        d2 = (uu - lu) ** 2
        # chord through (l, leak l) and (u, u): s = (u - leak l)/(u - l), b = (leak - 1) l u/(u - l)
        self.ds_dl = uu * (1.0 - leak) / d2
        self.ds_du = (leak - 1.0) * lu / d2
        self.db_dl = (leak - 1.0) * uu * uu / d2
        self.db_du = -(leak - 1.0) * lu * lu / d2

    def lines(self, Lu, A, dtype, sound):
        """The lines the rows ``Lu`` (their coefficients of the unstable neurons) use at the
        variables ``A``: the free line ``A z`` on its side, the chord on the other.

        Returns (slopes (dtype), intercepts, what :meth:`backward` needs, the rows' sums of
        ``Lu * intercept`` (float64) and, if ``sound``, of their magnitudes)."""
        free = (Lu >= 0.0) if self.free_lower else (Lu < 0.0)
        Su = np.where(free, A, self.cs.astype(dtype))
        Bu = np.where(free, 0.0, np.broadcast_to(self.cb, A.shape))
        T = Lu.astype(np.float64, copy=False) * Bu
        return Su, Bu, free, T.sum(axis=1), (np.abs(T).sum(axis=1) if sound else None)

    def backward(self, gSu, wLu, aux):
        """Gradients with respect to the free slopes (r, len(unst)) and to (l, u) of the
        unstable neurons (through the chord), from those with respect to the rows' slopes
        ``gSu`` and intercepts ``wLu``."""
        free = aux
        ga = np.where(free, gSu, 0.0)
        gs = np.where(free, 0.0, gSu).sum(axis=0, dtype=np.float64)
        gb = np.where(free, 0.0, wLu).sum(axis=0, dtype=np.float64)
        return ga, gs * self.ds_dl + gb * self.db_dl, gs * self.ds_du + gb * self.db_du




def _smooth_fns(kind, t):
    """act(t), act'(t), act''(t) elementwise in t's dtype (steering: no rounding control)."""
    if kind == "tanh":
        f = np.tanh(t)
        e = np.exp(-2.0 * np.abs(t))
        f1 = 4.0 * e / ((1.0 + e) * (1.0 + e))  # sech^2 without cancellation
        return f, f1, -2.0 * f * f1
    if kind == "sigmoid":
        e = np.exp(-np.abs(t))
        big = 1.0 / (1.0 + e)  # sigmoid(|t|)
        small = e / (1.0 + e)  # sigmoid(-|t|)
        f = np.where(t >= 0.0, big, small)
        f1 = big * small
        return f, f1, f1 * (1.0 - 2.0 * f)
    w = 1.0 / (1.0 + t * t)
    return np.arctan(t), w, -2.0 * t * w * w


class SmoothRelax:
    """The relaxation of one tanh / sigmoid / arctan layer at bounds (l, u) with free
    tangent points (the alpha-CROWN counterpart of :class:`LayerRelax`).

    Every neuron is a column with a variable ``theta`` in [0, 1] per row: the row's line on
    the side its coefficient picks (lower if >= 0) is, when that side is free
    (``sigmoid_family.tangent_ranges``), the tangent at the point of theta on the range;
    otherwise CROWN's line. theta = ``default`` = 1/2 gives CROWN's lines on every side
    (``sigmoid_family.theta_point``: theta maps piecewise linearly onto the side's range,
    1/2 onto CROWN's tangent point; when l < 0 < u, theta = 0 is the paper's tangent through
    the end-point and growing theta moves the point outward, flatter, on either side), so one
    variable per (row, neuron) serves whichever side the row's sign picks.

    Sound evaluation (``sound``): slope act'(d) and the exact intercept of that slope
    (``sigmoid_family.sound_tangent_lines``, CROWN's own intercept routine with its rounding
    slack), valid in float64 for any d. Steering: the tangent ``act(d) - act'(d) d``
    (``sigmoid_family.steer_tangent_lines``), differentiated in theta and, for the joint
    objective, in (l, u) (:meth:`backward`).
    """

    lo, hi = 0.0, 1.0

    def __init__(self, l, u, relax_fn, activation: str):
        from crown_cli.engine.relaxations import sigmoid_family as sf

        self.l, self.u = l, u
        self.kind = activation
        self._code = {"tanh": sf.TANH, "sigmoid": sf.SIGMOID, "arctan": sf.ARCTAN}[activation]
        self._sound, self._steer = sf.sound_tangent_lines, sf.steer_tangent_lines
        self._back = sf.steer_tangent_backward
        aU, bU, aL, bL = relax_fn(l, u)
        self.aU, self.bU, self.aL, self.bL = aU, bU, aL, bL
        n = l.shape[0]
        self.unst = self.cols = self.upos = np.arange(n)
        (self.freeU, self.a0U, self.amU, self.a1U, self.freeL, self.a0L, self.amL, self.a1L,
         self.dends, self.chord) = sf.tangent_ranges(self._code, l, u)
        self.default = np.full(n, 0.5)  # theta = 1/2: CROWN's line on either side
        # the chord's slope s and intercept b = act(l) - s l, differentiated in (l, u)
        self.ds_dl = np.zeros(n)
        self.ds_du = np.zeros(n)
        self.db_dl = np.zeros(n)
        self.db_du = np.zeros(n)
        j = np.flatnonzero(self.chord)
        if j.size:
            lj, uj = l[j], u[j]
            fl, f1l, _ = _smooth_fns(activation, lj)
            fu, f1u, _ = _smooth_fns(activation, uj)
            w = uj - lj
            sl = (fu - fl) / w
            self.ds_dl[j] = (sl - f1l) / w
            self.ds_du[j] = (f1u - sl) / w
            self.db_dl[j] = f1l - sl - lj * self.ds_dl[j]
            self.db_du[j] = -lj * self.ds_du[j]

    def tangent_points(self, A, pu):
        """(d, free, span): the tangent point of each (row, neuron) at theta ``A`` on the side
        ``pu`` picks (lower where True; ``sigmoid_family.theta_point``), whether that side is
        free, and dd/dtheta."""
        a0 = np.where(pu, self.a0L, self.a0U)
        am = np.where(pu, self.amL, self.amU)
        a1 = np.where(pu, self.a1L, self.a1U)
        low = A <= 0.5
        d = np.where(low, am - (1.0 - 2.0 * A) * (am - a0), am + (2.0 * A - 1.0) * (a1 - am))
        span = np.where(low, 2.0 * (am - a0), 2.0 * (a1 - am))
        free = np.where(pu, self.freeL, self.freeU)
        return d, free, span

    def lines(self, Lu, A, dtype, sound):
        """As :meth:`LayerRelax.lines`: the side is picked by the sign of ``Lu``."""
        if not sound:
            A = A.astype(Lu.dtype, copy=False)
            S, B, dS, dB, free, tsum, Dt, F2 = self._steer(
                self._code, Lu, A, self.a0L, self.amL, self.a1L, self.freeL, self.aL, self.bL,
                self.a0U, self.amU, self.a1U, self.freeU, self.aU, self.bU)
            return S, B, (free, dS, dB, Lu >= 0.0, A, Dt, F2), tsum, None
        pu = Lu >= 0.0
        S0 = np.where(pu, self.aL, self.aU)  # CROWN's lines (fixed sides, sound)
        B0 = np.where(pu, self.bL, self.bU)
        d, free, _ = self.tangent_points(A.astype(np.float64), pu)
        r, j = np.nonzero(free)
        k, b = self._sound(self._code, self.l[j], self.u[j], d[r, j], ~pu[r, j])
        S0[r, j] = k
        B0[r, j] = b
        T = Lu.astype(np.float64, copy=False) * B0
        return S0.astype(dtype, copy=False), B0, None, T.sum(axis=1), np.abs(T).sum(axis=1)

    def lines_numpy(self, Lu, A, dtype):
        """The steering lines of :meth:`lines` in plain numpy (a cross-check of the kernel)."""
        pu = Lu >= 0.0
        S0 = np.where(pu, self.aL, self.aU)
        B0 = np.where(pu, self.bL, self.bU)
        d, free, span = self.tangent_points(A, pu)
        d = d.astype(dtype, copy=False)
        f, f1, f2 = _smooth_fns(self.kind, d)
        Su = np.where(free, f1, S0.astype(dtype))
        Bu = np.where(free, f - f1 * d, B0)
        dk = f2 * span.astype(dtype)  # d slope / d theta
        return Su, Bu, (free, np.where(free, dk, 0.0), np.where(free, -d * dk, 0.0))

    def backward(self, gSu, wLu, aux):
        """As :meth:`LayerRelax.backward`. Through (l, u): a free line's tangent point
        d = c0 a0 + cm am + c1 a1 (``theta_point``: c0 = 1 - 2 theta, cm = 2 theta up to
        theta = 1/2, then cm = 2 - 2 theta, c1 = 2 theta - 1) moves with its range's points
        (``dends``), its slope act'(d) and intercept act(d) - act'(d) d by act''(d) dd and
        -d act''(d) dd; a fixed chord by its derivatives. (A degenerate interval's midpoint
        lines are not differentiated.)"""
        free, dS, dB, pu, A, Dt, F2 = aux
        ga, sm = self._back(gSu, wLu, free, dS, dB, pu, A, Dt, F2, self.chord)
        de = self.dends
        # rows of dends per side: (a0 dl, a1 dl, am dl, a0 du, a1 du, am du); sm per side:
        # (E c0, E cm, E c1), lower side (pu) first
        gl = gu = 0.0
        for s, rows in ((0, (2, 3, 9, 6, 7, 11)), (3, (0, 1, 8, 4, 5, 10))):
            E0, Em, E1 = sm[s], sm[s + 1], sm[s + 2]
            gl = gl + E0 * de[rows[0]] + E1 * de[rows[1]] + Em * de[rows[2]]
            gu = gu + E0 * de[rows[3]] + E1 * de[rows[4]] + Em * de[rows[5]]
        gs, gb = sm[6], sm[7]
        return ga, gl + gs * self.ds_dl + gb * self.db_dl, gu + gs * self.ds_du + gb * self.db_du


class Tape:
    """What :func:`chain` keeps for :func:`chain_backward`."""

    __slots__ = ("steps", "x0", "eps", "qcode", "lam_in", "dtype", "r")


def _norm_subgradient(A, qcode, eps):
    """A subgradient of eps * (dual norm of each row of A) with respect to A."""
    if isinstance(qcode, Box):
        return (eps * np.sign(A)) * qcode.radius.astype(A.dtype)
    if qcode == 0:  # l1 (l_inf ball)
        return eps * np.sign(A)
    if qcode == 1:  # l2
        n = np.sqrt(np.einsum("ij,ij->i", A, A, dtype=np.float64))
        n[n == 0.0] = np.inf
        return (eps / n)[:, None].astype(A.dtype) * A
    G = np.zeros_like(A)  # l_inf (l_1 ball): one-hot at the largest |entry|
    j = np.argmax(np.abs(A), axis=1)
    rows = np.arange(A.shape[0])
    G[rows, j] = eps * np.sign(A[rows, j])
    return G


@dataclass(frozen=True)
class ChainSettings:
    """How :func:`chain` runs: its precision ``dtype``, whether it records the ``tape`` of
    :func:`chain_backward`, and (sound float64) the ``rounding`` weights it charges."""

    dtype: type = np.float32
    tape: bool = False
    rounding: Optional[list] = None


def chain(net: Network, relax: List[LayerRelax], Lam, const, alphas, x0, eps, qcode,
          **settings):
    """Lower bounds of ``Lam @ a_m + const`` (a_m: hidden layer m = len(relax) - 1) over the
    input set, with the free slopes ``alphas[i]`` (r, len(relax[i].unst)) for hidden layer i
    (None: CROWN's). Returns (lower (r,), tape or None). ``settings``: the fields of
    :class:`ChainSettings` (keywords).

    In float64 with ``rounding`` (a list of per-layer weight vectors v_i, see
    :func:`crown.rounding_weights`), the bound is widened like crown.back_substitute (magnitude
    sums) and lowered by ``|D_i| @ v_i`` for every step through hidden layer i (D_i: the
    scaled rows multiplied by W_i): sound. Without it it is an estimate for steering.

    Stable neurons have one slope for both sides, so the rows are scaled column-wise; only the
    unstable columns pick a side by the sign of the coefficient (and carry an intercept).
    """
    o = ChainSettings(**settings)
    dtype, tape, rounding = o.dtype, o.tape, o.rounding
    r = Lam.shape[0]
    sound = rounding is not None
    c = np.asarray(const, dtype=np.float64).copy()
    rows = Rows(np.ascontiguousarray(Lam, dtype=dtype), c, np.abs(c) if sound else None,
                np.zeros(r) if sound else None)
    steps = [] if tape else None
    for i in range(len(relax) - 1, -1, -1):
        rl = relax[i]
        cols, upos = rl.cols, rl.upos
        D = rows.Lam[:, cols]
        Lu = D[:, upos]  # a copy (fancy index)
        D *= rl.aL[cols].astype(dtype)  # stable columns (aL == aU); unstable ones set below
        Su = Bu = aux = None
        tsum, tmag = 0.0, 0.0
        if upos.size:
            # clipped in the working precision: a float32 slope may round just outside
            # [leak, 1] (float32(0.01) < 0.01), where a z is no longer a valid line
            A = (np.broadcast_to(rl.default.astype(dtype), Lu.shape) if alphas[i] is None
                 else np.clip(alphas[i].astype(dtype), rl.lo, rl.hi))
            Su, Bu, aux, tsum, tmag = rl.lines(Lu, A, dtype, sound)
            D[:, upos] = Lu * Su  # the intercepts (the chord's for ReLU) are tsum
        Wc = net.take(i, dtype, cols)
        if tape:
            steps.append((i, Lu, Su, Bu, aux, Wc))
        # the engine's batched step (the rows' lines are the ones just chosen)
        rows.step(D, None, net.b[i][cols], Wc, (rounding[i][cols], 0.0) if sound else None,
                  isum=tsum, iabs=tmag)
    L, c = rows.Lam, rows.const
    lin, nrm, xm = input_terms(L, x0, qcode)
    lower = lin - eps * nrm + c
    if sound:  # widened like every verified bound (rounding.widen, the charges' own rounding)
        lower = _widen(lower, xm + eps * nrm + rows.mag, -1.0, net.fp_rtol,
                       ERR_SAFETY * rows.charge)
    t = None
    if tape:
        t = Tape()
        t.steps, t.x0, t.eps, t.qcode, t.lam_in, t.dtype, t.r = steps, x0, eps, qcode, L, dtype, r
    return lower, t


def chain_backward(net: Network, relax: List[LayerRelax], tape: Tape, w):
    """Gradient of ``sum_rows w * lower`` (lower from :func:`chain` with this tape).

    Returns (galphas, gl, gu): per hidden layer i, the gradient with respect to the free slopes
    (r, len(unst_i)), and with respect to l_i and u_i (through the chord of the unstable
    neurons; full-length vectors, float64).
    """
    dtype = tape.dtype
    wv = np.asarray(w, dtype=dtype)[:, None]
    x0 = np.asarray(tape.x0, dtype=dtype)
    G = wv * (x0[None, :] - _norm_subgradient(tape.lam_in, tape.qcode, tape.eps).astype(dtype))
    m = len(relax)
    galphas: List[Optional[np.ndarray]] = [None] * m
    gl = [np.zeros(rl.l.shape[0]) for rl in relax]
    gu = [np.zeros(rl.l.shape[0]) for rl in relax]
    for i, Lu, Su, Bu, aux, Wc in reversed(tape.steps):
        rl = relax[i]
        gD = _mm(G, Wc.T)
        gD += wv * net.b[i][rl.cols].astype(dtype)
        upos = rl.upos
        if upos.size:
            gDu = gD[:, upos]
            galphas[i], gli, gui = rl.backward(Lu * gDu, wv * Lu, aux)
            if gli is not None:
                gl[i][rl.unst] += gli
                gu[i][rl.unst] += gui
        if i == m - 1:
            break
        G = np.zeros((gD.shape[0], rl.l.shape[0]), dtype)
        G[:, rl.cols] = gD * rl.aL[rl.cols].astype(dtype)
        if upos.size:
            G[:, rl.unst] = gDu * Su + wv * Bu.astype(dtype)
    return galphas, gl, gu


@dataclass(frozen=True)
class AlphaOptions:
    """The options of an :class:`AlphaBounds`: ``act_bound(lo, hi)`` a bound of |act(z)| on
    [lo, hi] (None: from the activation), ``store_dtype`` of the stored slopes, ``joint``
    (every variable optimised for the margin's bound; None: for ReLU-type activations)."""

    act_bound: Optional[Callable] = None
    store_dtype: type = np.float32
    joint: Optional[bool] = None


class AlphaBounds:
    """alpha-CROWN bounds of the margins ``C @ f(x)`` for one image, slopes kept across radii.

    Slopes are stored densely in float32: for each hidden layer k >= 1 and each earlier layer
    i an array (2, n_k, n_i) (lower and upper bound rows of layer k's neurons), for the margin
    (r, n_i); NaN means "not optimised yet: CROWN's slope". Only unstable (row, neuron) pairs
    are ever read or written.

    Intermediate rows: the neurons CROWN finds unstable at the radius (the others keep CROWN's
    bounds, with which they are stable). In the sound float64 evaluation (``verify``) each gets
    max(alpha lower, CROWN lower) and min(alpha upper, CROWN upper) (both sound), so
    the intermediate bounds are never looser than CROWN's; the float32 optimisation uses the
    alpha bounds alone (a cut-off gradient where CROWN's were tighter would stall those rows).
    """

    COVER = 1.01  # float32 evaluations take the unstable rows from CROWN at this x the radius
    LR_DECAY = 0.98  # the step size shrinks by this per step of one optimise call

    def __init__(self, net: Network, relax_fn: Callable, leak: float, x0, qcode, C, first=None,
                 activation=None, **options):
        # activation: "tanh", "sigmoid" or "arctan" for free tangent points (SmoothRelax);
        # otherwise ReLU / leaky ReLU (slope leak) with free slopes (LayerRelax); options:
        # the fields of AlphaOptions
        o = AlphaOptions(**options)
        act_bound, store_dtype, joint = o.act_bound, o.store_dtype, o.joint
        self.smooth = activation if activation in ACTIVATIONS and ACTIVATIONS[activation].smooth \
            else None
        # smooth activations: each intermediate bound for itself by default (both are
        # implemented: SmoothRelax.backward differentiates the lines in (l, u)); the radius
        # search (Certifier) asks for joint, which measured better with enough steps: see
        # docs/methods.md, "Where the defaults come from"
        self.joint = (self.smooth is None) if joint is None else joint
        # the sound evaluation takes each intermediate bound as the tighter of alpha-CROWN's
        # and CROWN's (ReLU: a tighter interval only tightens the chord). Not for the smooth
        # activations: at fixed theta the lines move with the interval, and capping made the
        # margin bound worse than the float32 one it was optimised for (MNIST 3x[1024] tanh,
        # image 0, eps 0.0079, 12 joint steps: float32 0.19195, sound uncapped 0.19195,
        # capped 0.18574); the margin bound is still the larger of alpha-CROWN's and CROWN's
        self.cap = self.smooth is None
        self.net, self.relax_fn, self.leak = net, relax_fn, float(leak)
        self.x0, self.qcode, self.C = x0, qcode, C
        if act_bound is None:  # |act(z)| is largest at an end of [lo, hi]
            if self.smooth:
                fn = {"tanh": np.tanh, "arctan": np.arctan,
                      "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z))}[self.smooth]
                pad = 1.0 + 2.0 ** -40  # a few ulps of the library function

                def act_bound(lo, hi):
                    return pad * np.maximum(np.abs(fn(lo)), np.abs(fn(hi)))
            else:
                lk = self.leak

                def act_bound(lo, hi):
                    f = lambda z: np.where(z >= 0.0, z, lk * z)  # noqa: E731
                    return np.maximum(np.abs(f(lo)), np.abs(f(hi)))
        self.first, self.act_bound = first, act_bound
        self.H = net.num_hidden
        n = [w.shape[0] for w in net.W[:-1]]
        self.store = {}
        for k in range(1, self.H):
            for i in range(k):
                self.store[(k, i)] = np.full((2, n[k], n[i]), np.nan, store_dtype)
        for i in range(self.H):
            self.store[("m", i)] = np.full((C.shape[0], n[i]), np.nan, store_dtype)
        self.adam = KeyedAdam(AdamSettings())
        self._cover = None
        self.lam_m = C @ net.W[-1]
        self.const_m = C @ net.b[-1]

    def _relax(self, l, u):
        if self.smooth:
            return SmoothRelax(l, u, self.relax_fn, self.smooth)
        return LayerRelax(l, u, self.relax_fn, self.leak)

    # -- slopes ------------------------------------------------------------------------------
    def _gather(self, key, rows, rl: LayerRelax, sel=None):
        """(len(rows) [x2], len(unst)) slopes of quantity ``key`` for layer rl, NaN -> CROWN."""
        if rl.unst.size == 0:
            return None, None
        S = self.store[key]
        # rows and unst are sorted and distinct, so all of them is every row / column: then
        # slices (a view, where fancy indexing copies; tanh / sigmoid / arctan take every one)
        r = slice(None) if rows.size == S.shape[-2] else rows[:, None]
        c = slice(None) if rl.unst.size == S.shape[-1] else rl.unst[None, :]
        idx = (r, c) if sel is None else (slice(None), r, c)
        A = S[idx]
        bad = np.isnan(A)
        if bad.any():
            A = np.where(bad, np.broadcast_to(rl.default.astype(A.dtype), A.shape), A)
        return A.reshape(-1, rl.unst.size), idx

    # -- one evaluation ----------------------------------------------------------------------
    def evaluate(self, eps, dtype=np.float32, grad=False, verify=False, record=None):
        """Margin lower bounds at eps with the stored slopes.

        ``verify`` (float64): sound bounds, each the larger of alpha-CROWN's and CROWN's.
        ``grad``: also the gradient of their sum with respect to the slopes (float32), returned
        as a list of (key, idx, gradient block, relaxation); value first.
        ``record`` (a dict, with ``verify``): filled with the slopes the bound was verified at,
        for a certificate (:mod:`crown_cli.certification.proofs`): ``"layers"``: per hidden
        layer k >= 1 (0-based) with unstable rows, (rows, slopes per layer i < k (2 len(rows),
        len(unst_i)) float32 values, CROWN's lower bound kept (per row), CROWN's upper bound
        kept); ``"margin"``: (slopes per layer (r, len(unst_i)), the alpha-CROWN bound, CROWN's
        bound); ``"unst"``: the unstable neurons of each hidden layer; ``"bounds"``: (l, u).
        """
        net, x0, qcode = self.net, self.x0, self.qcode
        if verify:
            dtype = np.float64
        if verify:
            cb, crelax = hidden_layer_bounds(net, x0, eps, qcode, self.relax_fn, self.first)
        elif self.smooth:  # every row is recomputed: no CROWN bounds needed for steering
            cb = [first_bounds(net, x0, eps, qcode, self.first)] + [None] * (self.H - 1)
        else:
            # CROWN's bounds on a ball at least as large (cached): its unstable neurons are a
            # superset of those at eps and its stable ones are stable here with the same sign,
            # and a stable ReLU's relaxation does not depend on its interval
            if self._cover is None or self._cover[0] < eps:
                big = eps * self.COVER
                self._cover = (big, hidden_layer_bounds(net, x0, big, qcode, self.relax_fn,
                                                        self.first, dtype=np.float32)[0])
            cb = list(self._cover[1])
            cb[0] = first_bounds(net, x0, eps, qcode, self.first)
        relax = [self._relax(*cb[0])]
        rnd = None
        if verify:
            if isinstance(qcode, Box):
                a_prev = np.abs(x0) + qcode.radius
            else:
                a_prev = np.abs(x0) + eps
            rnd = [rounding_weights(net, 0, a_prev, *cb[0], unit=U64)[0]]
        inter = []  # per layer k >= 1: (rows, tape, winL, winU, idx per layer) for the gradient
        for k in range(1, self.H):
            if self.smooth:  # every neuron's relaxation depends on its interval
                rows = np.arange(net.W[k].shape[0])
                lc, uc = (None, None) if cb[k] is None else cb[k]
                l, u = np.empty(rows.size), np.empty(rows.size)
            else:
                lc, uc = cb[k]
                rows = np.flatnonzero((lc < 0.0) & (uc > 0.0))
                l, u = lc.copy(), uc.copy()
            rec = None
            if rows.size:
                Wr = net.W[k][rows]
                Lam = np.vstack([Wr, -Wr])
                const = np.concatenate([net.b[k][rows], -net.b[k][rows]])
                alphas, idxs = [], []
                for i in range(k):
                    A, idx = self._gather((k, i), rows, relax[i], sel=True)
                    alphas.append(A)
                    idxs.append(idx)
                lo, tape = chain(net, relax, Lam, const, alphas, x0, eps, qcode, dtype=dtype,
                                 tape=grad, rounding=rnd)
                n = rows.size
                la, ua = lo[:n], -lo[n:]
                if record is not None:
                    record.setdefault("layers", {})[k] = (
                        rows, [None if A is None else np.clip(A, relax[i].lo, relax[i].hi)
                               for i, A in enumerate(alphas)],
                        ~(la >= lc[rows]) if self.cap else np.zeros(n, bool),
                        ~(ua <= uc[rows]) if self.cap else np.zeros(n, bool))
                if verify and self.cap:  # both sound: keep the tighter of each
                    la, ua = np.maximum(la, lc[rows]), np.minimum(ua, uc[rows])
                # a crossing (l > u) only happens by rounding on an empty set: keep CROWN's
                # (steering without CROWN's bounds: the pair in order)
                ok = la <= ua
                if record is not None and not ok.all():  # CROWN's bounds kept on both sides
                    record["layers"][k][2][~ok] = record["layers"][k][3][~ok] = True
                if lc is None:
                    l[rows], u[rows] = np.minimum(la, ua), np.maximum(la, ua)
                else:
                    l[rows] = np.where(ok, la, lc[rows])
                    u[rows] = np.where(ok, ua, uc[rows])
                rec = (rows, tape, ok, idxs)
            inter.append(rec)
            relax.append(self._relax(l, u))
            if verify:
                a_prev = self.act_bound(relax[k - 1].l, relax[k - 1].u)
                rnd.append(rounding_weights(net, k, a_prev, l, u, unit=U64)[0])
        r = self.C.shape[0]
        alphas, idxs = [], []
        allrows = np.arange(r)
        for i in range(self.H):
            A, idx = self._gather(("m", i), allrows, relax[i])
            alphas.append(A)
            idxs.append(idx)
        lower, tape = chain(net, relax, self.lam_m, self.const_m, alphas, x0, eps, qcode,
                            dtype=dtype, tape=grad, rounding=rnd)
        if verify:
            crown_lb, _ = back_substitute(net, crelax, self.lam_m, self.const_m, x0, eps, qcode,
                                          want_upper=False)
            if record is not None:
                record["margin"] = ([None if A is None else np.clip(A, relax[i].lo, relax[i].hi)
                                     for i, A in enumerate(alphas)], lower, crown_lb)
                record["unst"] = [rl.unst for rl in relax]
                record["bounds"] = [(rl.l, rl.u) for rl in relax]
            return np.maximum(lower, crown_lb)
        if not grad:
            return lower
        grads = []
        ga, gl, gu = chain_backward(net, relax, tape, np.ones(r))
        for i in range(self.H):
            if ga[i] is not None:
                grads.append((("m", i), idxs[i], ga[i], relax[i]))
        for k in range(self.H - 1, 0, -1):
            rec = inter[k - 1]
            if rec is None:
                continue
            rows, tp, ok, kidx = rec
            if self.joint:
                w = np.concatenate([gl[k][rows] * ok, -gu[k][rows] * ok])
            else:  # each bound for itself: maximise l, minimise u
                w = np.concatenate([ok, ok]).astype(np.float64)
            if not np.any(w):
                continue
            ga, gl2, gu2 = chain_backward(net, relax[:k], tp, w)
            for i in range(k):
                gl[i] += gl2[i]
                gu[i] += gu2[i]
                if ga[i] is not None:
                    grads.append(((k, i), kidx[i], ga[i], relax[i]))
        return lower, grads

    def step(self, grads, lr):
        """One projected Adam ascent step on the slopes from :meth:`evaluate`'s gradients."""
        for key, idx, g, rl in grads:
            store = self.store[key]
            cur = store[idx]
            bad = np.isnan(cur)
            if bad.any():
                cur = np.where(bad, np.broadcast_to(rl.default.astype(store.dtype), cur.shape),
                               cur)
            g3 = g.reshape(cur.shape).astype(store.dtype, copy=False)
            self.adam.step(key, store, g3, idx, lr, rl.lo, rl.hi, current=cur)

    def optimise(self, eps, iters: int, lr: float, patience: int = 2, tol: float = 1e-3,
                 scale=None, deadline=None, reserve: float = 0.0, first_step: float = 0.0):
        """Projected Adam ascent of the sum of the margin bounds at eps (float32), from the
        stored slopes: at most ``iters`` gradient steps, fewer once the objective has gained
        less than ``tol * scale`` (default scale: the first objective's size; the search
        passes the margin at x0) in ``patience`` consecutive steps. Returns (last objective,
        steps taken, the bounds at the final slopes if the last evaluation was made at them
        (early stop) else None). ``deadline`` (``time.monotonic()``): checked before each
        step (:class:`~crown_cli.engine.deadline.DeadlineExceeded` once passed); the steps
        also stop, returning, where the next one (estimated as the longest so far, the first
        as ``first_step`` seconds) would end later than ``reserve`` seconds before it: the
        caller's time for its verified evaluation."""
        best, stale, steps, obj = -np.inf, 0, 0, None
        val = None
        longest = float(first_step)
        for _ in range(iters):
            check_deadline(deadline)
            t0 = time.monotonic()
            if deadline is not None and t0 + longest + reserve > deadline:
                return obj, steps, None
            val, grads = self.evaluate(eps, np.float32, grad=True)
            obj = float(np.sum(val))
            if scale is None:
                scale = max(abs(obj), 1e-12)
            if obj > best + tol * scale:
                best, stale = obj, 0
            else:
                stale += 1
                if stale >= patience:
                    return obj, steps, val
            self.step(grads, lr * self.LR_DECAY ** steps)
            steps += 1
            longest = max(longest, time.monotonic() - t0)
        return obj, steps, None
