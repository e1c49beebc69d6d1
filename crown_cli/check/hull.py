"""Hull leaves (kind 4 of docs/proofs.md), checked in exact rational arithmetic: networks of
one hidden layer, where the leaves are few and small."""
from fractions import Fraction

import numpy as np

from .bounds import U, _sizes, _through, down, gamma, up

_F = np.vectorize(Fraction, otypes=[object])


def _take_matrix(op):
    """A ("take", idx, n) operation's matrix P (n, len(idx)): y = x @ P."""
    idx, n = op[1], op[2]
    P = np.zeros((n, idx.size))
    P[idx[idx >= 0], np.flatnonzero(idx >= 0)] = 1.0
    return P


def _affine(ops, n_in):
    """G_1 as (M, t), z = x M + t exactly (M (n_in, n) and t (n,) of Fractions)."""
    M, scale, t = None, Fraction(1), np.array([Fraction(0)] * n_in, dtype=object)
    for op in ops:
        if op[0] == "take":  # the element move as its 0/1 matrix (exact)
            op = ("mat", _take_matrix(op))
        if op[0] == "mat":
            W = _F(op[1])
            M = scale * W if M is None else M.dot(W)
            t = t.dot(W)
        elif op[0] in ("scale", "div") and np.ndim(op[1]):  # elementwise: x diag(a)
            a = _F(op[1]) if op[0] == "scale" else 1 / _F(op[1])
            if M is None:
                M = np.diag(scale * a).astype(object)
                M[M == 0] = Fraction(0)
            else:
                M = M * a
            t = t * a
        elif op[0] == "scale":
            a = Fraction(op[1])
            scale, t = (scale * a, a * t) if M is None else (scale, a * t)
            if M is not None:
                M = a * M
        else:
            t = t + Fraction(op[2]) * _F(op[1])
    if M is None:
        M = np.diag([scale] * n_in).astype(object)
        M[M == 0] = Fraction(0)
    return M, t


def _row_back(ops, row):
    """A row on the output of ``ops`` as (row on their input, constant), exactly."""
    const = Fraction(0)
    for op in reversed(ops):
        if op[0] == "take":
            op = ("mat", _take_matrix(op))
        if op[0] == "mat":
            row = _F(op[1]).dot(row)
        elif op[0] == "scale":
            row = (_F(op[1]) if np.ndim(op[1]) else Fraction(op[1])) * row
        elif op[0] == "div":
            row = row / _F(op[1])
        else:
            const += row.dot(Fraction(op[2]) * _F(op[1]))
    return row, const


def hull_holds(net, lo, hi, a_row, b, s, theta):
    """'' when the hull leaf's bound of ``a_row . y - b`` over the box [lo, hi] is > 0, else
    the reason (network outside the scope, a slope outside [0, 1], the bound)."""
    if net.K != 1 or not net.chain or net.identity or \
            any(op[0] in ("maxpool", "divr") for ops in net.layers for op in ops):
        return "a hull leaf needs a network of one hidden layer and affine operations"
    if not np.all((s >= 0) & (s <= 1)):
        return "a hull slope outside [0, 1]"
    if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        return "a hull line or the box is not finite"
    bound = hull_exact(net, lo, hi, a_row, b, s, theta)
    if bound > 0:
        return ""
    return f"hull bound {float(bound)!r} of A_i y - b_i is not > 0"


def hull_exact(net, lo, hi, a_row, b, s, theta):
    """The hull leaf's bound of ``a_row . y - b`` over the box, an exact Fraction."""
    n_in = net.sizes[0]
    M, t = _affine(net.layers[0], n_in)
    v, c = _row_back(net.layers[1], _F(np.asarray(a_row, dtype=np.float64)))
    c -= Fraction(b)
    L, H = _F(lo), _F(hi)
    G = np.array([Fraction(0)] * n_in, dtype=object)
    K = c
    for j in range(net.sizes[1]):
        w, vj = M[:, j], v[j]
        if vj >= 0:
            k = vj * Fraction(float(s[j]))
            G = G + k * w
            K += k * t[j]
        else:
            C = _F(theta[j]) * w
            D = w - C
            e1 = sum(max(-ci * li, -ci * hi_) for ci, li, hi_ in zip(C, L, H))
            e2 = sum(max(di * li, di * hi_) for di, li, hi_ in zip(D, L, H)) + t[j]
            G = G + vj * C
            K += vj * max(e1, e2)
    return sum(min(g * li, g * hi_) for g, li, hi_ in zip(G, L, H)) + K


def hull_float(net, lo, hi, l1, u1, a_row, s, theta):
    """A float64 lower bound of :func:`hull_exact` with b = 0 (compare it with b), every
    rounding charged (the charges of bounds.py; ``l1``, ``u1``: the node's bounds of the
    hidden layer, valid on the box). None where the first layer is not one product followed by
    one addition (then only the exact check applies)."""
    if not net.chain or net.identity:
        return None
    ops = net.layers[0]
    if net.K != 1 or [op[0] for op in ops] != ["mat", "add"] or ops[1][2] != 1.0 or \
            any(op[0] == "maxpool" for op in net.layers[1]):
        return None
    W1, b1 = ops[0][1].T, ops[1][1]  # z = W1 x + b1 exactly
    lo, hi = lo[None], hi[None]
    X = np.maximum(np.abs(lo), np.abs(hi))[0]
    top = np.maximum(u1, 0.0)[None]
    v, c, q = _through(net.layers[1], np.asarray(a_row, np.float64)[None], np.zeros(1),
                       np.zeros(1), _sizes(net.layers[1], np.zeros_like(top), top),
                       np.zeros(1, np.int64))
    v, c, q = v[0], c[0], q[0]
    Z = np.maximum(np.abs(l1), np.abs(u1))
    pos = v >= 0
    n, d = W1.shape
    with np.errstate(all="ignore"):
        k = np.where(pos, v * s, 0.0)  # the lower lines' coefficients on z
        q += up(U * np.sum(np.abs(k) * Z))
        C = theta * W1  # a float line C_j x + e_j above relu(z_j) on the box
        D = W1 - C
        Dm = np.abs(D) * X
        e1 = -np.minimum(C * lo, C * hi).sum(1)
        e2 = np.maximum(D * lo, D * hi).sum(1) + b1
        err = gamma(d + 2) * (np.abs(C) * X).sum(1)
        e = np.nextafter(np.maximum(e1 + up(err), e2 + up(err + 2 * U * Dm.sum(1) +
                                                          gamma(2) * np.abs(b1))), np.inf)
        vn = np.where(pos, 0.0, v)
        G = k @ W1 + (vn[:, None] * C).sum(0)
        q += up(gamma(n + 1) * ((np.abs(k) @ np.abs(W1)) * X).sum()
                + gamma(n + 1) * ((np.abs(vn)[:, None] * np.abs(C)).sum(0) * X).sum())
        Kt = np.concatenate([k * b1, vn * e])  # <= 0 terms from vn * e: e rounded up
        K = down(c + down(Kt.sum() - up(gamma(2 * n + 1) * np.abs(Kt).sum())))
        p = np.minimum(G * lo[0], G * hi[0])
        bound = down(down(p.sum() + K) - up(gamma(d + 1) * np.abs(p).sum() + q))
    return float(bound) if np.isfinite(bound) else -np.inf
