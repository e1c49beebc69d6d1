"""Lower bounds of a one-hidden-layer ReLU network's margin over a box with each neuron's
convex hull over that box: :class:`HullNet`, :func:`hull_bounds`, :func:`hull_optimise`.

The margin of a network ``f(x) = W2 relu(W1 x + b1) + b2`` along a row ``(a, beta)`` of a
property is ``m(x) = a . f(x) - beta = sum_j v_j relu(z_j(x)) + c`` with ``v = a W2``,
``c = a . b2 - beta`` and ``z_j(x) = W1_j x + b1_j``. Over a box ``[L, H]``:

- a neuron with ``v_j >= 0`` is bounded below by ``relu(z) >= s_j z`` for any ``s_j`` in
  [0, 1] (CROWN's lower line, alpha-CROWN's free slope);
- a neuron with ``v_j < 0`` is bounded above by *any* affine function of the input that lies
  above ``relu(z_j(x))`` on the box: ``relu(z_j(x)) <= C_j . x + e_j`` with ``C_j`` free in
  R^d and ``e_j = max(max_box(-C_j . x), max_box((W1_j - C_j) . x) + b1_j)`` (a function
  lies above ``max(0, z)`` iff it lies above both). CROWN's chord is the member
  ``C_j = u/(u - l) W1_j``; the others lean on each input differently, ``C_j = theta_j *
  W1_j`` with ``theta_j`` in [0, 1]^d, and together they describe the neuron's convex hull
  over the box (the "ideal" single-neuron relaxation of Anderson et al. 2020), which is
  tighter than the triangle relaxation whenever the neuron's inputs are the box's own
  coordinates.

The bound is then ``min_box (G . x) + K``, in closed form. Every choice of lines gives a sound
bound; :func:`hull_optimise` picks them by projected Adam ascent on the bound (a concave
function of them), and :func:`hull_bounds` evaluates a choice in float64 with the rounding
of every sum charged (so the value is a proven lower bound whatever the optimiser did).
``theta`` lives on W1's nonzero entries only (a convolution's few per neuron), so its size is
W1's number of nonzeros. Arrays in, arrays out: boxes ``L, H`` (N, d), one row per box
``v`` (N, n), ``c`` (N,), lines ``s`` (N, n) and ``theta`` (N, nnz).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from crown_cli.engine.kernels import hull_kernels
from crown_cli.engine.optim import Adam, AdamSettings, BestIterate
from crown_cli.engine.rounding import gamma_n

U = 2.0 ** -53


def _gamma(n: int) -> float:
    """A generous bound of the relative error of a float64 sum of n products: twice
    :func:`crown_cli.engine.rounding.gamma_n` of n + 4 operations."""
    return 2.0 * gamma_n(n + 4, U)


class HullNet:
    """The hidden layer ``W1`` (n, d), ``b1`` as entries (row ``r``, column ``q``, value
    ``w``, in row order) with sums over them: ``rowsum(X)`` (N, entries) -> (N, n),
    ``colsum(X)`` -> (N, d). A mostly-zero W1 (a lowered convolution) keeps only its nonzeros
    and sums them as sparse products; a denser one keeps every entry (zeros add nothing) and
    sums by reshaping, which is faster."""

    DENSE = 0.25  # every entry kept when at least this share is nonzero

    def __init__(self, W1, b1):
        W1 = np.asarray(W1, dtype=np.float64)
        self.b1 = np.asarray(b1, dtype=np.float64)
        self.n, self.d = W1.shape
        self.dense = np.count_nonzero(W1) >= self.DENSE * W1.size
        if self.dense:
            self.Wd = W1
            self.r = np.repeat(np.arange(self.n), self.d)
            self.q = np.tile(np.arange(self.d), self.n)
            self.w = W1.ravel().copy()
            self.absW = np.abs(W1)
            self.row_len, self.col_len = self.d, self.n
        else:
            import scipy.sparse as sp  # here: verify's start-up does not pay for it

            W = sp.csr_matrix(W1)
            W.sort_indices()
            self.W = W
            self.r = np.repeat(np.arange(self.n), np.diff(W.indptr))
            self.q = W.indices.astype(np.int64)
            self.w = W.data.copy()
            nnz = self.w.size
            ones = np.ones(nnz)
            self._rows = sp.csr_matrix((ones, (np.arange(nnz), self.r)), shape=(nnz, self.n))
            self._cols = sp.csr_matrix((ones, (np.arange(nnz), self.q)), shape=(nnz, self.d))
            self.absW = abs(W)
            self.row_len = int(np.max(np.diff(W.indptr))) if self.n else 0
            self.col_len = int(np.max(np.bincount(self.q, minlength=self.d))) if nnz else 0
        self.nnz = self.w.size
        self.ptr = np.searchsorted(self.r, np.arange(self.n + 1)).astype(np.int64)

    def rowsum(self, X):
        if self.dense:
            return X.reshape(X.shape[0], self.n, self.d).sum(axis=2)
        return np.asarray(X @ self._rows)

    def colsum(self, X):
        if self.dense:
            return X.reshape(X.shape[0], self.n, self.d).sum(axis=1)
        return np.asarray(X @ self._cols)

    def apply(self, X):
        """``X W1^T + b1`` for X (N, d)."""
        if self.dense:
            return X @ self.Wd.T + self.b1
        return np.asarray(self.W @ X.T).T + self.b1

    def abs_apply(self, X):
        """``X |W1|^T`` for X (N, d)."""
        if self.dense:
            return X @ self.absW.T
        return np.asarray(self.absW @ X.T).T


def margin_rows(W2, b2, A, b):
    """The property's rows as (v, c, v_err, c_err): ``v = A W2`` (R, n), ``c = A b2 - b`` (R,),
    with bounds of their float64 rounding errors; ``c_err`` also covers one ulp of ``b``
    (a VNN-LIB decimal rounded to nearest lies within it, as the other stages' ``b`` rounded
    up one ulp)."""
    W2 = np.asarray(W2, dtype=np.float64)
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    bb = np.asarray(b, dtype=np.float64).ravel()
    b2 = np.asarray(b2, dtype=np.float64)
    v = A @ W2
    c = A @ b2 - bb
    m = W2.shape[0]
    v_err = _gamma(m) * (np.abs(A) @ np.abs(W2))
    c_err = _gamma(m + 1) * (np.abs(A) @ np.abs(b2) + np.abs(bb)) + np.spacing(np.abs(bb))
    return v, c, v_err, c_err


def pre_bounds(net: HullNet, L, H):
    """Interval bounds (l, u) of ``W1 x + b1`` over each box (N, d): (N, n) each, not charged
    for rounding (they only pick the starting lines and the neurons left fixed)."""
    mid, rad = 0.5 * (L + H), 0.5 * (H - L)
    c = net.apply(mid)
    r = net.abs_apply(rad)
    return c - r, c + r


def initial(net: HullNet, v, L, H, pre=None) -> Tuple[np.ndarray, np.ndarray]:
    """CROWN's lines as a starting point: (s (N, n), theta (N, nnz)); the chord gives every
    input of a neuron the share u / (u - l). ``pre``: :func:`pre_bounds` of the boxes when
    the caller has them."""
    l, u = pre_bounds(net, L, H) if pre is None else pre
    unstable = (l < 0.0) & (u > 0.0)
    s = np.where(l >= 0.0, 1.0, np.where(unstable & (u > -l), 1.0, 0.0))
    chord = np.where(unstable, u / np.where(unstable, u - l, 1.0), np.where(l >= 0.0, 1.0, 0.0))
    return s, chord[:, net.r]


def stable(net: HullNet, L, H, pre=None):
    """(N, n) bool: neurons whose sign is fixed on the box (their lines are exact); ``pre``
    as for :func:`initial`."""
    l, u = pre_bounds(net, L, H) if pre is None else pre
    return (l >= 0.0) | (u <= 0.0)


def _parts(net: HullNet, v, c, L, H, s, theta):
    """The float64 bound pieces of every box."""
    w, q = net.w, net.q
    pos = v >= 0.0
    Ck = theta * w
    Dk = w - Ck
    Lq, Hq = L[:, q], H[:, q]
    M1 = net.rowsum(np.where(Ck > 0.0, -Ck * Lq, -Ck * Hq))
    M2 = net.rowsum(np.where(Dk > 0.0, Dk * Hq, Dk * Lq)) + net.b1
    e = np.maximum(M1, M2)
    ps = np.where(pos, v * np.clip(s, 0.0, 1.0), 0.0)
    neg = np.where(pos, 0.0, v)
    G = net.colsum(ps[:, net.r] * w + neg[:, net.r] * Ck)
    K = c + ps @ net.b1 + np.sum(neg * e, axis=1)
    return dict(G=G, K=K, e=e, M1=M1, M2=M2, Ck=Ck, Dk=Dk, ps=ps, neg=neg, Lq=Lq, Hq=Hq)


def hull_bounds(net: HullNet, v, c, v_err, c_err, L, H, s, theta) -> np.ndarray:
    """Proven lower bounds (N,) of ``sum_j v_j relu(W1_j x + b1_j) + c`` over each box for the
    true (unrounded) rows of which ``v, c`` are the float64 values within ``v_err, c_err``,
    at the lines ``s`` (clipped to [0, 1]) and ``theta`` (any values: the upper lines
    ``theta * w`` are valid whatever they are). Every float64 sum is charged its rounding;
    NaN anywhere gives -inf."""
    P = _parts(net, v, c, L, H, s, theta)
    Ck, ps, neg = P["Ck"], P["ps"], P["neg"]
    Mx = np.maximum(np.abs(L), np.abs(H))  # |x_i| on the box
    # e_j rounded up: its two sums over a row's entries (plus the subtraction w - C)
    e_mag = net.rowsum((2.0 * np.abs(Ck) + np.abs(net.w)) * Mx[:, net.q]) + np.abs(net.b1)
    e = P["e"] + _gamma(net.row_len + 2) * e_mag
    K = c + ps @ net.b1 + np.sum(neg * e, axis=1)
    G = P["G"]
    G_err = _gamma(net.col_len + 2) * net.colsum(np.abs(ps[:, net.r] * net.w)
                                                 + np.abs(neg[:, net.r] * Ck))
    K_err = _gamma(net.n + 2) * (np.abs(c) + np.abs(ps) @ np.abs(net.b1)
                                 + np.sum(np.abs(neg * e), axis=1))
    terms = np.minimum(G * L, G * H)
    val = terms.sum(axis=1) + K
    fin_err = _gamma(net.d + 1) * (np.abs(terms).sum(axis=1) + np.abs(K))
    # the rows' own rounding: |v_true - v| <= v_err times relu(z) <= max(u, 0)
    ubar = net.abs_apply(Mx) + np.abs(net.b1)
    ubar = ubar * (1.0 + _gamma(net.row_len + 1))
    row_err = np.sum(v_err * ubar, axis=1) + c_err
    charge = (G_err * Mx).sum(axis=1) + K_err + fin_err + row_err
    out = val - charge * (1.0 + 2.0 ** -20)
    return np.where(np.isnan(out), -np.inf, out)


def hull_value_and_grad(net: HullNet, v, c, L, H, s, theta):
    """The float64 bound (N,) (rounding not charged), its (sub)gradient in s (N, n) and theta
    (N, nnz), and the minimising corners x* (N, d) of its linear form. Runs the numba kernel
    (:mod:`crown_cli.engine.kernels.hull`) unless the numpy kernels are chosen; this numpy
    code is its twin."""
    k = hull_kernels()
    if k is not None:
        f = np.ascontiguousarray
        return k.value_and_grad(net.ptr, net.q, net.w, net.b1, f(v, dtype=np.float64),
                                f(c, dtype=np.float64), f(L, dtype=np.float64),
                                f(H, dtype=np.float64), f(s, dtype=np.float64),
                                f(theta, dtype=np.float64))
    return _value_and_grad_numpy(net, v, c, L, H, s, theta)


def _value_and_grad_numpy(net: HullNet, v, c, L, H, s, theta):
    """The numpy twin of the kernel (see :func:`hull_value_and_grad`)."""
    P = _parts(net, v, c, L, H, s, theta)
    G, K, Ck, Dk, Lq, Hq = P["G"], P["K"], P["Ck"], P["Dk"], P["Lq"], P["Hq"]
    xs = np.where(G > 0.0, L, H)
    val = np.sum(G * xs, axis=1) + K
    gs = np.where(v >= 0.0, v * net.apply(xs), 0.0)
    first = (P["M1"] >= P["M2"])[:, net.r]
    dM = np.where(first, np.where(Ck > 0.0, -Lq, -Hq), np.where(Dk > 0.0, -Hq, -Lq))
    gt = P["neg"][:, net.r] * (xs[:, net.q] + dM) * net.w
    return val, gs, gt, xs


ADAM = AdamSettings(eps=1e-12)  # the fused kernel (kernels/hull.py: adam_step) takes these


@dataclass(frozen=True)
class Ascent:
    """The settings of :func:`hull_optimise`: ``steps`` steps, the step size ``lr`` times
    ``decay`` per step; stop once every box's value passes ``stop_above``, or when
    ``deadline`` (time.monotonic()) has passed."""

    steps: int
    lr: float
    decay: float = 0.98
    stop_above: Optional[float] = None
    deadline: Optional[float] = None


def hull_optimise(net: HullNet, v, c, L, H, s, theta, ascent: Ascent, fixed=None):
    """Projected Adam ascent on the bound from the lines (s, theta), both kept in [0, 1], for
    ``ascent.steps`` steps (:mod:`crown_cli.engine.optim`, or its fused twin in the numba
    kernels). Returns the best (s, theta) seen per box, its float64 value (rounding not
    charged) and that point's x*. ``fixed`` (N, n) bool: neurons whose lines stay as given
    (the stable ones when None)."""
    steps, lr, decay = ascent.steps, ascent.lr, ascent.decay
    stop_above, deadline = ascent.stop_above, ascent.deadline
    k = hull_kernels()
    s = np.array(s, dtype=np.float64, order="C")  # copies: updated in place below
    theta = np.array(theta, dtype=np.float64, order="C")
    if fixed is None:
        fixed = stable(net, L, H)
    free = np.ascontiguousarray(~fixed)
    free_t = np.ascontiguousarray(free[:, net.r])
    track = BestIterate(L.shape[0], s, theta, 0.5 * (L + H))
    opt_s, opt_t = Adam(s, ADAM, 0.0, 1.0), Adam(theta, ADAM, 0.0, 1.0)
    for t in range(1, steps + 1):
        val, gs, gt, xs = hull_value_and_grad(net, v, c, L, H, s, theta)
        track.offer(val, s, theta, xs)
        if t == steps or (stop_above is not None and np.all(track.best > stop_above)) or \
                (deadline is not None and time.monotonic() >= deadline):
            break
        step = lr * decay ** (t - 1)
        if k is not None:  # the fused twin of Adam.ascend, in place
            k.adam_step(s, gs, opt_s.m, opt_s.v, free, t, step, 0.0, 1.0)
            k.adam_step(theta, gt, opt_t.m, opt_t.v, free_t, t, step, 0.0, 1.0)
        else:
            opt_s.ascend(s, np.where(free, gs, 0.0), t, step)
            opt_t.ascend(theta, np.where(free_t, gt, 0.0), t, step)
    best_s, best_t, best_x = track.params
    return best_s, best_t, track.best, best_x


def split_scores(net: HullNet, v, c, L, H, s, theta, xs) -> np.ndarray:
    """Per box (N, d): how much of the bound's loss at its minimiser ``xs`` each input's width
    causes. Each neuron with ``v_j < 0`` loses ``|v_j| (C_j . x + e_j - relu(z_j(x)))`` there
    (its upper line's height above the ReLU), shared among the inputs in proportion to
    ``|W1_ji| (H_i - L_i)``, the input's part in the neuron's range over the box: the input
    to halve is the one that owes the most."""
    P = _parts(net, v, c, L, H, s, theta)
    z = net.apply(xs)
    lin = net.rowsum(P["Ck"] * xs[:, net.q])
    gap = np.maximum(-P["neg"] * (lin + P["e"] - np.maximum(z, 0.0)), 0.0)
    share = np.abs(net.w) * (H - L)[:, net.q]  # (N, nnz)
    total = net.rowsum(share)
    share = share / np.where(total > 0.0, total, 1.0)[:, net.r]
    return net.colsum(gap[:, net.r] * share)


CHUNK_ENTRIES = 4_000_000  # rows x entries optimised at once (each array ~32 MB)


def lower_bounds(net: HullNet, W2, b2, lo, hi, A, b, steps: int = 200, lr: float = 0.1,
                 deadline=None) -> np.ndarray:
    """Proven lower bounds (R,) of ``A_i f(x) - b_i`` over the box [lo, hi] for each row of A
    on the network of hidden layer ``net`` (``HullNet(W1, b1)``) and output layer (W2, b2),
    with the lines optimised per row (stopping early once every row's bound is positive, or
    at ``deadline``, time.monotonic()), rows in chunks of at most ``CHUNK_ENTRIES`` lines."""
    v, c, v_err, c_err = margin_rows(W2, b2, A, b)
    R = v.shape[0]
    lo = np.asarray(lo, dtype=np.float64).ravel()
    hi = np.asarray(hi, dtype=np.float64).ravel()
    out = np.empty(R)
    step = max(1, CHUNK_ENTRIES // max(1, net.nnz))
    for a in range(0, R, step):
        k = slice(a, min(R, a + step))
        N = k.stop - k.start
        L, H = np.repeat(lo[None], N, axis=0), np.repeat(hi[None], N, axis=0)
        pre = pre_bounds(net, L, H)
        s, theta = initial(net, v[k], L, H, pre)
        s, theta, _, _ = hull_optimise(net, v[k], c[k], L, H, s, theta,
                                       Ascent(steps, lr, stop_above=0.0, deadline=deadline),
                                       fixed=stable(net, L, H, pre))
        out[k] = hull_bounds(net, v[k], c[k], v_err[k], c_err[k], L, H, s, theta)
    return out
