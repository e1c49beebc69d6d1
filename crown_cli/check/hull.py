"""Hull leaves (kind 4 of docs/proofs.md), checked in exact rational arithmetic: networks of
one hidden layer, where the leaves are few and small."""
from fractions import Fraction

import numpy as np

_F = np.vectorize(Fraction, otypes=[object])


def _affine(ops, n_in):
    """G_1 as (M, t), z = x M + t exactly (M (n_in, n) and t (n,) of Fractions)."""
    M, scale, t = None, Fraction(1), np.array([Fraction(0)] * n_in, dtype=object)
    for op in ops:
        if op[0] == "mat":
            W = _F(op[1])
            M = scale * W if M is None else M.dot(W)
            t = t.dot(W)
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
        if op[0] == "mat":
            row = _F(op[1]).dot(row)
        elif op[0] == "scale":
            row = Fraction(op[1]) * row
        else:
            const += row.dot(Fraction(op[2]) * _F(op[1]))
    return row, const


def hull_holds(net, lo, hi, a_row, b, s, theta):
    """'' when the hull leaf's bound of ``a_row . y - b`` over the box [lo, hi] is > 0, else
    the reason (network outside the scope, a slope outside [0, 1], the bound)."""
    if net.K != 1:
        return "a hull leaf needs a network of one hidden layer"
    if not np.all((s >= 0) & (s <= 1)):
        return "a hull slope outside [0, 1]"
    if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        return "a hull line or the box is not finite"
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
    bound = sum(min(g * li, g * hi_) for g, li, hi_ in zip(G, L, H)) + K
    if bound > 0:
        return ""
    return f"hull bound {float(bound)!r} of A_i y - b_i is not > 0"
