"""The linear bound of docs/proofs.md, in float64 with every rounding error bounded.

A batch of rows is kept as (L, E, c): a float64 row L, an error row E >= 0 and a constant c,
with |L* - L| <= E and c <= c* for the row L* and constant c* the same back-substitution gives
in real arithmetic. Each product's rounding is charged by Higham's bound
|fl(A B) - A B| <= gamma_n |A| |B| (any summation order, FMA or not); error rows themselves are
computed in float64 from nonnegative terms and then inflated by ``up``; constants are rounded
down by ``down``. The concretised bound is therefore <= the real-arithmetic one.
"""
from fractions import Fraction

import numpy as np

U = 2.0 ** -53  # unit roundoff of float64, round to nearest
INFL, TINY = 1.0 + 2.0 ** -28, 2.0 ** -1000


def gamma(n):
    """gamma_n = n u / (1 - n u), rounded up."""
    g = Fraction(n, 2 ** 53 - n)
    return float(np.nextafter(float(g), np.inf))


def up(x):
    """An upper bound of a nonnegative quantity whose float64 value ``x`` was computed with fewer
    than 2**21 roundings on any path (each within a factor 1 +- u, plus at most 2**-1070 for
    underflow): the relative error is then below 2**-31, the absolute one below 2**-1040."""
    return x * INFL + TINY


def down(x):
    """A float <= x (x a float64 result rounded to nearest); non-finite values become -inf."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), np.nextafter(x, -np.inf), -np.inf)


def _mats(net):
    """Per mat operation: W^T and |W^T|, cached on the network."""
    if not hasattr(net, "_back"):
        net._back = {id(op[1]): (np.ascontiguousarray(op[1].T), np.abs(op[1].T))
                     for ops in net.layers for op in ops if op[0] == "mat"}
    return net._back


def _through(net, ops, L, E, c):
    """The row on the output of ``ops`` taken back to their input (the constants into c)."""
    back = _mats(net)
    for op in reversed(ops):
        if op[0] == "mat":
            wt, awt = back[id(op[1])]
            g = gamma(L.shape[1])
            L, E = L @ wt, up((g * np.abs(L) + E) @ awt)
        elif op[0] == "scale":
            a = op[1]
            L, E = a * L, up(abs(a) * (E + U * np.abs(L)))
        elif op[2] != 0.0:  # + s v: L* . (s v) >= |s| (lower bound of sign(s) L* . v)
            v, s = op[1], op[2]
            d = np.sign(s) * (L @ v) - up((gamma(len(v)) * np.abs(L) + E) @ np.abs(v))
            c = down(c + down(abs(s) * down(d)))
    return L, E, c


def _relax(L, E, c, l, u, alpha, bs):
    """Row on relu(z) -> row on z (neuron bounds l, u, lower slopes alpha, multipliers beta s)."""
    act, A = l >= 0, np.abs(L)
    uns = ~act & (u > 0)
    with np.errstate(all="ignore"):
        w = u - l
        su = np.where(uns & np.isfinite(w), u / w, np.nan)  # within 3u + eta of u/(u-l) <= 1
        sue, t = su + 4 * U, -su * l
        thi = np.nextafter(t + up(4 * U * np.abs(l) + U * t), np.inf)  # >= -l u / (u - l)
    pos, neg = uns & (L > E), uns & (L < -E)  # the exact coefficient's sign is known
    amb = uns & ~pos & ~neg & (A + E > 0)  # either line: coefficient 0, both charged
    mu = np.where(act, L, np.where(pos, L * alpha, np.where(neg, L * su, 0.0)))
    M = np.abs(mu)
    En = np.where(act, E, 0.0)
    En = np.where(pos, E * alpha + U * M, En)
    En = np.where(neg, E * sue + 4 * U * A + U * M, En)
    En = np.where(amb, (A + E) * np.maximum(alpha, sue), En)
    tn, ta = np.where(neg, thi, 0.0), np.where(amb, thi, 0.0)
    g = gamma(L.shape[1])
    err = up(((g * A + E) * tn + (A + E) * ta).sum(1))
    c = down(down(c + (L * tn).sum(1)) - err)
    if bs is not None:
        mu = mu - bs
        En = En + U * np.abs(mu)
    return mu, up(En), c


def lower_bound(net, st, L, top, nodes, slopes, betas=None):
    """Float lower bounds (R,) of rows L (R, n) on the output of G_top (z_top; y for K + 1),
    row r over node ``nodes[r]`` of the batch state ``st``; ``slopes(m, l, u)`` and
    ``betas(m)`` give the rows' alpha and beta * s (R, n_m) on hidden layer m (betas: None)."""
    E, c = np.zeros_like(L), np.zeros(L.shape[0])
    bad = np.zeros(L.shape[0], dtype=bool)
    for m in range(top, 0, -1):
        L, E, c = _through(net, net.layers[m - 1], L, E, c)
        bad |= ~(np.isfinite(L).all(1) & np.isfinite(E).all(1))
        if m > 1:
            sl = slice(net.offsets[m - 2], net.offsets[m - 1])
            l, u = st.l[nodes, sl], st.u[nodes, sl]
            L, E, c = _relax(L, E, c, l, u, slopes(m - 1, l, u), betas and betas(m - 1))
    lo, hi = st.lo[nodes], st.hi[nodes]
    p = np.minimum(L * lo, L * hi)
    err = up(gamma(L.shape[1] + 1) * np.abs(p).sum(1)
             + (E * np.maximum(np.abs(lo), np.abs(hi))).sum(1))
    v = down(down(p.sum(1) + c) - err)
    bad |= ~(np.isfinite(L).all(1) & np.isfinite(E).all(1))
    return np.where(bad, -np.inf, v)


def interval(ops, lo, hi):
    """Bounds (B, n_out) of ``ops`` applied to every point of the boxes [lo, hi] (B, n_in):
    outward, each rounding charged (a product by Higham's bound, a sum by one ulp)."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    for op in ops:
        if op[0] == "mat":
            W = op[1]
            Wp, Wn = np.maximum(W, 0.0), np.minimum(W, 0.0)
            g = gamma(W.shape[0])
            with np.errstate(invalid="ignore"):
                err = up(g * (np.abs(lo) @ np.abs(W) + np.abs(hi) @ np.abs(W)))
                lo, hi = down(lo @ Wp + hi @ Wn - err), -down(-(hi @ Wp + lo @ Wn) - err)
        elif op[0] == "scale":
            a = op[1]
            lo, hi = (a * lo, a * hi) if a >= 0 else (a * hi, a * lo)
            lo, hi = down(lo), -down(-hi)
        else:
            t = op[2] * op[1]
            e = up(2 * U * np.abs(t))
            lo, hi = down(down(lo + t) - e), -down(down(-hi - t) - e)
        lo, hi = np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)
    return lo, hi
