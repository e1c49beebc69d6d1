"""Lower bounds of a one-hidden-layer ReLU network's margin over a box with each neuron's
convex hull over that box: :func:`hull_bounds`, :func:`hull_optimise`.

The margin of a network ``f(x) = W2 relu(W1 x + b1) + b2`` along a row ``(a, beta)`` of a
property is ``m(x) = a . f(x) - beta = sum_j v_j relu(z_j(x)) + c`` with ``v = a W2``,
``c = a . b2 - beta`` and ``z_j(x) = W1_j x + b1_j``. Over a box ``[L, H]``:

- a neuron with ``v_j >= 0`` is bounded below by ``relu(z) >= s_j z`` for any ``s_j`` in
  [0, 1] (CROWN's lower line, alpha-CROWN's free slope);
- a neuron with ``v_j < 0`` is bounded above by *any* affine function of the input that lies
  above ``relu(z_j(x))`` on the box: ``relu(z_j(x)) <= C_j . x + e_j`` with ``C_j`` free in
  R^d and ``e_j = max(max_box(-C_j . x), max_box((W1_j - C_j) . x) + b1_j)`` (a function
  lies above ``max(0, z)`` iff it lies above both). CROWN's chord is the member
  ``C_j = u/(u - l) W1_j``; the others may lean on each input differently, and together they
  describe the neuron's convex hull over the box (the "ideal" single-neuron relaxation of
  Anderson et al. 2020), which is tighter than the triangle relaxation whenever the
  neuron's inputs are the box's own coordinates: on VNN-COMP 2024 safenlp's 30-128-2
  network the triangle relaxation's LP bound -1.28 of hyperrectangle_369 becomes -0.049.

The bound is then ``min_box (G . x) + K``, in closed form. Every choice of ``(s, C)`` gives a
sound bound; :func:`hull_optimise` picks them by projected Adam ascent on the bound (a
concave function of them), and :func:`hull_bounds` evaluates a choice in float64 with the
rounding of every sum charged (so the value is a proven lower bound whatever the optimiser
did). Arrays in, arrays out.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

U = 2.0 ** -53


def _gamma(n: int) -> float:
    """A generous bound of the relative error of a float64 sum of n products (twice the
    textbook gamma_n of n + 4 operations)."""
    k = (n + 4) * U
    return 2.0 * k / (1.0 - k)


def margin_rows(W2, b2, A, b):
    """The property's rows as (v, c, v_err, c_err): ``v = A W2`` (R, n), ``c = A b2 - b`` (R,),
    with bounds of their float64 rounding errors."""
    W2 = np.asarray(W2, dtype=np.float64)
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    v = A @ W2
    c = A @ np.asarray(b2, dtype=np.float64) - np.asarray(b, dtype=np.float64).ravel()
    m = W2.shape[0]
    v_err = _gamma(m) * (np.abs(A) @ np.abs(W2))
    c_err = _gamma(m + 1) * (np.abs(A) @ np.abs(b2) + np.abs(np.asarray(b, np.float64).ravel()))
    return v, c, v_err, c_err


def pre_bounds(W1, b1, L, H):
    """Interval bounds (l, u) of ``W1 x + b1`` over each box (N, d): (N, n) each, not charged
    for rounding (they only pick the starting lines and the neurons left fixed)."""
    mid, rad = 0.5 * (L + H), 0.5 * (H - L)
    c = mid @ W1.T + b1
    r = rad @ np.abs(W1).T
    return c - r, c + r


def initial(W1, b1, v, L, H) -> Tuple[np.ndarray, np.ndarray]:
    """CROWN's lines as a starting point: (s (N, n), theta (N, n, d)) for boxes L, H (N, d)
    and row coefficients v (N, n); the upper lines are ``C = theta * W1`` (the chord:
    theta = u / (u - l) on every input)."""
    l, u = pre_bounds(W1, b1, L, H)
    unstable = (l < 0.0) & (u > 0.0)
    s = np.where(l >= 0.0, 1.0, np.where(unstable & (u > -l), 1.0, 0.0))
    chord = np.where(unstable, u / np.where(unstable, u - l, 1.0), np.where(l >= 0.0, 1.0, 0.0))
    theta = np.broadcast_to(chord[:, :, None], chord.shape + (W1.shape[1],)).copy()
    return s, theta


def _parts(W1, b1, v, c, L, H, s, C):
    """The float64 bound pieces of every box: G (N, d), K (N,), e (N, n), M1, M2, D."""
    pos = v >= 0.0
    D = W1[None] - C
    Lb, Hb = L[:, None, :], H[:, None, :]
    M1 = np.where(C > 0.0, -C * Lb, -C * Hb).sum(axis=2)
    M2 = np.where(D > 0.0, D * Hb, D * Lb).sum(axis=2) + b1
    e = np.maximum(M1, M2)
    ps = np.where(pos, v * np.clip(s, 0.0, 1.0), 0.0)
    neg = np.where(pos, 0.0, v)
    G = ps @ W1 + np.einsum("bn,bnd->bd", neg, C)
    K = c + ps @ b1 + np.sum(neg * e, axis=1)
    return G, K, e, M1, M2, D, ps, neg


def hull_bounds(W1, b1, v, c, v_err, c_err, L, H, s, C) -> np.ndarray:
    """Proven lower bounds (N,) of ``sum_j v_j relu(W1_j x + b1_j) + c`` over each box
    ``[L_k, H_k]`` for the true (unrounded) rows of which ``v, c`` (N, n), (N,) are the float64
    values within ``v_err, c_err``, at the lines ``s`` (N, n; clipped to [0, 1]) and ``C``
    (N, n, d). Every float64 sum is charged its rounding; NaN anywhere gives -inf."""
    W1 = np.asarray(W1, dtype=np.float64)
    b1 = np.asarray(b1, dtype=np.float64)
    n, d = W1.shape
    G, K, e, _, _, _, ps, neg = _parts(W1, b1, v, c, L, H, s, C)
    Mx = np.maximum(np.abs(L), np.abs(H))  # |x_i| on the box
    # e_j rounded up: its two sums over d products (plus the subtraction W1 - C)
    e_mag = np.einsum("bnd,bd->bn", 2.0 * np.abs(C) + np.abs(W1)[None], Mx) + np.abs(b1)
    e = e + _gamma(d + 2) * e_mag
    K = c + ps @ b1 + np.sum(neg * e, axis=1)
    # G's error per coordinate and K's, then the final sum's
    G_err = _gamma(n + 2) * (np.abs(ps) @ np.abs(W1) + np.einsum("bn,bnd->bd", np.abs(neg),
                                                                  np.abs(C)))
    K_err = _gamma(n + 2) * (np.abs(c) + np.abs(ps) @ np.abs(b1) + np.sum(np.abs(neg * e), 1))
    terms = np.minimum(G * L, G * H)
    val = terms.sum(axis=1) + K
    fin_err = _gamma(d + 1) * (np.abs(terms).sum(axis=1) + np.abs(K))
    # the rows' own rounding: |v_true - v| <= v_err times relu(z) <= max(u, 0)
    ubar = Mx @ np.abs(W1).T + np.abs(b1)
    ubar = ubar * (1.0 + _gamma(d + 1))
    row_err = np.sum(v_err * ubar, axis=1) + c_err
    charge = (G_err * Mx).sum(axis=1) + K_err + fin_err + row_err
    out = val - charge * (1.0 + 2.0 ** -20)
    return np.where(np.isnan(out), -np.inf, out)


def hull_value_and_grad(W1, b1, v, c, L, H, s, C):
    """The float64 bound (N,) (rounding not charged) and its (sub)gradient in s and C, and
    the minimising corners x* (N, d) of its linear form."""
    G, K, e, M1, M2, D, ps, neg = _parts(W1, b1, v, c, L, H, s, C)
    xs = np.where(G > 0.0, L, H)
    val = np.sum(G * xs, axis=1) + K
    pos = v >= 0.0
    gs = np.where(pos, v * (xs @ W1.T + b1), 0.0)
    Lb, Hb = L[:, None, :], H[:, None, :]
    dM1 = np.where(C > 0.0, -Lb, -Hb)
    dM2 = np.where(D > 0.0, -Hb, -Lb)
    gC = neg[:, :, None] * (xs[:, None, :] + np.where((M1 >= M2)[:, :, None], dM1, dM2))
    return val, gs, gC, xs


def hull_optimise(W1, b1, v, c, L, H, s, theta, steps: int, lr: float, decay: float = 0.98,
                  fixed=None):
    """Projected Adam ascent on the bound from the lines (s, theta) (both in [0, 1]; the upper
    lines ``C = theta * W1``: each input's share of the neuron's weight, the chord giving
    every input the same share) for ``steps`` steps. Returns the best (s, theta) seen per
    box, its float64 value (rounding not charged) and that point's x*. ``fixed`` (N, n)
    bool: neurons whose lines stay as given (the stable ones when None)."""
    W1 = np.asarray(W1, dtype=np.float64)
    s, theta = s.copy(), theta.copy()
    if fixed is None:
        l, u = pre_bounds(W1, b1, L, H)
        fixed = (l >= 0.0) | (u <= 0.0)
    free = ~fixed
    best_s, best_t = s.copy(), theta.copy()
    best = np.full(L.shape[0], -np.inf)
    best_x = 0.5 * (L + H)
    ms, vs = np.zeros_like(s), np.zeros_like(s)
    mt, vt = np.zeros_like(theta), np.zeros_like(theta)
    b1m, b2m, eps = 0.9, 0.999, 1e-12
    for t in range(1, steps + 1):
        val, gs, gC, xs = hull_value_and_grad(W1, b1, v, c, L, H, s, theta * W1[None])
        up = val > best
        if up.any():
            best[up] = val[up]
            best_s[up], best_t[up], best_x[up] = s[up], theta[up], xs[up]
        if t == steps:
            break
        gs = np.where(free, gs, 0.0)
        gt = np.where(free[:, :, None], gC * W1[None], 0.0)
        ms = b1m * ms + (1 - b1m) * gs
        vs = b2m * vs + (1 - b2m) * gs * gs
        mt = b1m * mt + (1 - b1m) * gt
        vt = b2m * vt + (1 - b2m) * gt * gt
        step = lr * decay ** (t - 1)
        c1, c2 = 1 - b1m ** t, 1 - b2m ** t
        s = np.clip(s + step * (ms / c1) / (np.sqrt(vs / c2) + eps), 0.0, 1.0)
        theta = np.clip(theta + step * (mt / c1) / (np.sqrt(vt / c2) + eps), 0.0, 1.0)
    return best_s, best_t, best, best_x


def split_scores(W1, b1, v, c, L, H, s, theta, xs) -> np.ndarray:
    """Per box (N, d): how much of the bound's loss at its minimiser ``xs`` each input's width
    causes. Each neuron with ``v_j < 0`` loses ``|v_j| (C_j . x + e_j - relu(z_j(x)))`` there
    (its upper line's height above the ReLU), shared among the inputs in proportion to
    ``|W1_ji| (H_i - L_i)``, the input's part in the neuron's range over the box: the input
    to halve is the one that owes the most."""
    C = theta * W1[None]
    _, _, e, _, _, _, _, neg = _parts(W1, b1, v, c, L, H, s, C)
    z = xs @ W1.T + b1
    gap = np.maximum(-neg * (np.einsum("bnd,bd->bn", C, xs) + e - np.maximum(z, 0.0)), 0.0)
    share = np.abs(W1)[None] * (H - L)[:, None, :]  # (N, n, d)
    total = share.sum(axis=2, keepdims=True)
    share = share / np.where(total > 0.0, total, 1.0)
    return np.einsum("bn,bnd->bd", gap, share)
