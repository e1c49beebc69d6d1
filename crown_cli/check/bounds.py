"""The linear bound of docs/proofs.md, in float64 with every rounding error charged.

A batch of rows is kept as (L, c, q): float64 rows L, taken as exact; constants c <= the real
constants of those rows; charges q >= 0. Each step replaces the rows by computed ones and adds
to q a bound on what the difference can change on the node's set: a product's rounding
|fl(L W) - L W| <= gamma_n |L| |W| (Higham: any summation order, FMA or not) times a bound M
of |w| for the variable w the new rows multiply, an elementwise product's u |result| times M.
The bounds M come from the node's bounds (|relu(z)| <= max(u, 0), |z| <= max(|l|, |u|)), the
box, and interval bounds through a layer's operations. At the box the rows are minimised
exactly up to their sums' rounding, and q subtracted: the float value is <= the
real-arithmetic bound of the same lines, which is <= the row on the node's set.
"""
from fractions import Fraction

import numpy as np

from .network import window_values

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


_PARTS = {}  # id(W) -> (W, W^T, |W|, max(W, 0), min(W, 0)), computed once per weight


def parts(W):
    """W, its transpose, |W| and its positive and negative parts (cached per array)."""
    got = _PARTS.get(id(W))
    if got is None or got[0] is not W:
        got = _PARTS[id(W)] = (W, np.ascontiguousarray(W.T), np.abs(W), np.maximum(W, 0.0),
                               np.minimum(W, 0.0))
    return got


def _sizes(ops, lo, hi):
    """Bounds (lo_i, hi_i), each (B, n_i), of the input w_0 in [lo, hi] of ``ops`` and after
    each operation up to the last that is not an addition (interval bounds)."""
    need = max([i for i, op in enumerate(ops) if op[0] != "add"], default=0)
    out = [(lo, hi)]
    for op in ops[:need]:  # (an addition's rows need no bound of its input)
        lo, hi = interval([op], lo, hi)
        out.append((lo, hi))
    return out


def _mag(b):
    """max(|lo|, |hi|): a bound of |w| for w in [lo, hi]."""
    return np.maximum(np.abs(b[0]), np.abs(b[1]))


def _dense(j, v, n):
    """Rows of one nonzero each (v_r at column j_r) written out, (len(j), n)."""
    L = np.zeros((len(j), n))
    L[np.arange(len(j)), j] = v
    return L


def _pool_back(win, L, c, q, lo, hi, at):
    """Rows on a max pool's output -> rows on its input (input bounds lo, hi per node). Per
    window the input k* with the largest lower bound (the first of ties): ``y >= x_k*`` for a
    coefficient >= 0, ``y <= max_k hi_k`` for one < 0, ``y = x_k*`` where lo_k* is at least
    every other input's hi (no arithmetic but the constant's products, and sums where windows
    overlap)."""
    rows = np.arange(win.shape[0])
    lw, hw = window_values(lo, win), window_values(hi, win)  # (B, m, K)
    best = np.argmax(lw, axis=2)
    src = win[rows, best]  # (B, m)
    lbest = np.take_along_axis(lw, best[..., None], axis=2)[..., 0]
    others = hw.copy()
    np.put_along_axis(others, best[..., None], -np.inf, axis=2)
    exact = lbest >= others.max(axis=2)
    use = (L >= 0) | exact[at]
    with np.errstate(invalid="ignore"):
        t = np.where(use, 0.0, L * hw.max(axis=2)[at])  # <= 0 terms: L < 0, y <= max hi
        d = t.sum(1) - up(gamma(L.shape[1]) * np.abs(t).sum(1))
    c = down(c + down(d))
    Lu = np.where(use, L, 0.0)
    Lin = np.zeros((L.shape[0], lo.shape[1]))
    np.add.at(Lin, (np.repeat(np.arange(L.shape[0]), L.shape[1]), src[at].reshape(-1)),
              Lu.reshape(-1))
    share = np.bincount(win[win >= 0], minlength=lo.shape[1]).max(initial=0)
    if share > 1:  # overlapping windows: an input's coefficient may be a sum of several
        mag = np.take_along_axis(_mag((lo, hi)), src, axis=1)  # (B, m): |x_k*| <= mag
        with np.errstate(invalid="ignore"):
            q = q + up(gamma(share) * (np.abs(Lu) * mag[at]).sum(1))
    return Lin, c, q


def _inv_gap(lo, hi):
    """Floats >= 1/lo - 1/hi = (hi - lo) / (lo hi) (0 < lo <= hi), elementwise: the
    difference and the product's square lo^2 each rounded toward the larger bound."""
    return up(np.nextafter(hi - lo, np.inf) / np.nextafter(lo * lo, 0.0))


def _take_back(idx, L, q, n_in, bounds, at):
    """Rows over y (y_i = x_{idx_i}, 0 where idx_i = -1) as rows over x: each coefficient
    added at its source element. Exact where no element is taken twice; else each sum of up
    to ``share`` coefficients is charged gamma_share of their magnitudes times |x|."""
    ok = idx >= 0
    src = idx[ok]
    Lx = np.zeros((L.shape[0], n_in))
    share = np.bincount(src, minlength=n_in).max(initial=0)
    if share <= 1:
        Lx[:, src] = L[:, ok]
        return Lx, q
    np.add.at(Lx.T, src, L[:, ok].T)
    with np.errstate(invalid="ignore"):
        mag = _mag(bounds)[at][:, src]  # |x_src| per row
        q = q + up(gamma(share) * (np.abs(L[:, ok]) * mag).sum(1))
    return Lx, q


def _through(ops, L, c, q, M, at):
    """Rows on the output of ``ops`` taken back to their input; M[i][at[r]]: the bound of |w_i|
    at row r's node. ``L`` may be given as ``(j, v, n)``: rows of one nonzero each, v_r at
    column j_r of n (step 1b's e_j); they are taken through the operations up to the first
    product by that entry alone, the same numbers as the full products (one product plus
    exact zeros) without a mostly-zero matrix."""
    hot = L[:2] if isinstance(L, tuple) else None
    width = L[2] if hot is not None else None  # the hot rows' width (a move's input changes it)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op[0] == "maxpool":
            if hot is not None:
                L, hot = _dense(*hot, op[1].shape[0]), None
            L, c, q = _pool_back(op[1], L, c, q, M[i][0], M[i][1], at)
        elif op[0] == "mat":  # sum_k (gamma |L| |W^T|)_rk M_k = gamma sum_j |L_rj| (M |W|)_j
            _, WT, aW, _, _ = parts(op[1])
            with np.errstate(invalid="ignore"):
                reach = _mag(M[i]) @ aW  # per node; row r's: reach[at[r]]
                if hot is None:
                    q = q + up(gamma(len(WT)) * (np.abs(L) * reach[at]).sum(1))
                    # columns that are zero in every row (inactive neurons) add exact zeros:
                    # left out of the product (the charge holds for any order of the sum)
                    keep = np.flatnonzero(np.any(L != 0, axis=0))
                    if len(op) > 2 and L.shape[0] > 1:  # a convolution: kernel position by position
                        L = op[2].back(L)
                    else:
                        L = L[:, keep] @ WT[keep] if keep.size < 0.75 * len(WT) else L @ WT
                else:
                    j, v = hot
                    q = q + up(gamma(len(WT)) * (np.abs(v) * reach[at, j]))
                    L, hot = v[:, None] * WT[j], None
        elif op[0] == "take":  # an element move: each coefficient to its source element
            idx, n_in = op[1], op[2]
            if hot is not None:
                j, v = hot
                src = idx[j]
                hot = (np.maximum(src, 0), np.where(src >= 0, v, 0.0))
                width = n_in
                continue
            L, q = _take_back(idx, L, q, n_in, M[i], at)
        elif op[0] == "divr":  # over a real d in [lo, hi] (0 < lo): the rows over the midpoint,
            # |L / d - fl(L / m)| <= |L| (1/lo - 1/hi) + u |fl(L / m)| (1 + u), times |w|
            lo_d, hi_d = op[1], op[2]
            m = 0.5 * (lo_d + hi_d)
            gap = _inv_gap(lo_d, hi_d)
            with np.errstate(invalid="ignore"):
                if hot is None:
                    new = L / m
                    q = q + up(((np.abs(L) * gap + U * np.abs(new)) * _mag(M[i])[at]).sum(1))
                    L = new
                else:
                    j, v = hot
                    new = v / m[j]
                    q = q + up((np.abs(v) * gap[j] + U * np.abs(new)) * _mag(M[i])[at, j])
                    hot = (j, new)
        elif op[0] in ("scale", "div"):  # rows times a (or over d), each entry rounded once:
            a = op[1]  # |fl(L a) - L a| <= u |fl(L a)| (1 + u), which up() covers
            if hot is None:
                L = a * L if op[0] == "scale" else L / a
                with np.errstate(invalid="ignore"):
                    q = q + up(U * (np.abs(L) * _mag(M[i])[at]).sum(1))
            else:
                a = a if np.ndim(a) == 0 else a[hot[0]]
                hot = (hot[0], a * hot[1] if op[0] == "scale" else hot[1] / a)
                with np.errstate(invalid="ignore"):
                    q = q + up(U * (np.abs(hot[1]) * _mag(M[i])[at, hot[0]]))
        elif op[2] != 0.0:  # + s v: L . (s v) >= |s| (lower bound of sign(s) L . v)
            v, s = op[1], op[2]
            if hot is None:
                Lv, aLv = L @ v, np.abs(L) @ np.abs(v)
            else:
                Lv = hot[1] * v[hot[0]]
                aLv = np.abs(Lv)
            d = np.sign(s) * Lv - up(gamma(len(v)) * aLv)
            c = down(c + down(abs(s) * down(d)))
    if hot is not None:  # no product in ops: the rows as a matrix
        L = _dense(*hot, width)
    return L, c, q


def _relax(L, c, q, l, u, alpha, bs):
    """Rows on relu(z) -> rows on z (node bounds l, u, lower slopes alpha, beta * s bs). The
    stable neurons' slopes 1 and 0 are exact products; only the columns where some row's
    neuron is unstable are relaxed and charged."""
    act = l >= 0
    mu = L * act  # slope 1 (active) or 0 (inactive): exact
    C = np.flatnonzero(np.any(~act & (u > 0), axis=0))
    Lc, lc, uc = L[:, C], l[:, C], u[:, C]
    uns = lc < 0  # (u > 0 or not: inactive where u <= 0)
    uns &= uc > 0
    neg = uns & (Lc < 0)
    with np.errstate(all="ignore"):
        # an upper line s z + t of relu on [l, u]: at l at least 0, at u at least u
        s = np.where(neg, uc / (uc - lc), 0.0)
        su = s * uc
        t = np.where(neg, np.maximum(np.nextafter(-s * lc, np.inf),
                                     np.nextafter((uc - su) + 4 * U * (np.abs(su) + np.abs(uc)),
                                                  np.inf)), 0.0)
        t = np.where(neg & ~np.isfinite(t), np.inf, t)
        slope = np.where(lc >= 0, 1.0, np.where(neg, s, np.where(uns, alpha[:, C], 0.0)))
        mu[:, C] = muc = Lc * slope
        d = (Lc * t).sum(1)  # <= 0 terms, L < 0 and t >= 0
        e = gamma(L.shape[1]) * np.abs(d)
    c = down(down(c + d) - up(e))
    with np.errstate(all="ignore"):
        if bs is None:  # each rounding of a coefficient: u times its result
            q = q + up(U * (np.abs(muc) * np.maximum(np.abs(lc), np.abs(uc))).sum(1))
        else:
            size = np.abs(mu)
            mu = mu - bs
            size = size + np.abs(mu)
            q = q + up(U * (size * np.maximum(np.abs(l), np.abs(u))).sum(1))
    return mu, c, q


def _source(net, st, idx, j):
    """Bounds of a_j (a_0 = x: the box; a_j = relu(z_j)) at the nodes ``idx`` of ``st``."""
    if j == 0:
        return st.lo[idx], st.hi[idx]
    sl = slice(net.offsets[j - 1], net.offsets[j])
    if j in net.identity:
        return st.l[idx, sl], st.u[idx, sl]
    return np.maximum(st.l[idx, sl], 0.0), np.maximum(st.u[idx, sl], 0.0)


def pre_interval(net, k, st, idx):
    """Interval bounds of z_k at the nodes ``idx`` from the bounds of its terms' sources:
    each term's :func:`interval`, the terms' sums rounded outward."""
    lo = hi = None
    for src, ops in net.terms[k - 1]:
        tl, th = interval(ops, *_source(net, st, idx, src))
        if lo is None:
            lo, hi = tl, th
        else:
            with np.errstate(invalid="ignore"):
                lo, hi = down(lo + tl), -down(-(hi + th))
    return lo, hi


def lower_bound(net, st, L, top, nodes, slopes, betas=None):
    """Float lower bounds (R,) of rows L (R, n) on z_top (y for K + 1), row r over node
    ``nodes[r]`` of the batch state ``st``; ``slopes(m, l, u)`` and ``betas(m)`` give the
    rows' alpha and beta * s (R, n_m) on hidden layer m (betas: None); L may be rows of one
    nonzero each as ``(j, v, n)`` (:func:`_through`). The rows go back through each term of
    z_m to its source; rows reaching a source from several terms are summed, each sum's
    rounding charged (``u |fl(A + B)|`` per coefficient, times the source's bound)."""
    R = len(L[0]) if isinstance(L, tuple) else L.shape[0]
    c, q = np.zeros(R), np.zeros(R)
    uniq, at = np.unique(nodes, return_inverse=True)
    pend = {}  # rows over a_j reached so far
    rows = L
    for m in range(top, 0, -1):
        if m < top:
            rows = pend.pop(m, None)
            if rows is None:  # no term reaches a_m: rows of zeros
                continue
            if m not in net.identity:  # (an identity layer: the rows over z_m as they are)
                sl = slice(net.offsets[m - 1], net.offsets[m])
                l, u = st.l[nodes, sl], st.u[nodes, sl]
                rows, c, q = _relax(rows, c, q, l, u, slopes(m, l, u), betas and betas(m))
        for src, ops in net.terms[m - 1]:
            S = _source(net, st, uniq, src)
            Ls, c, q = _through(ops, rows, c, q, _sizes(ops, *S), at)
            if src in pend:
                Ls = pend[src] + Ls
                with np.errstate(invalid="ignore"):
                    q = q + up(U * (np.abs(Ls) * _mag(S)[at]).sum(1))
            pend[src] = Ls
    L = pend.get(0)
    if L is None:
        L = np.zeros((R, net.sizes[0]))
    lo, hi = st.lo[nodes], st.hi[nodes]
    with np.errstate(all="ignore"):
        p = np.minimum(L * lo, L * hi)
        err = up(gamma(L.shape[1] + 1) * np.abs(p).sum(1) + q)
        v = down(down(p.sum(1) + c) - err)
        if st.ball is not None:  # the set lies in the ball too
            v = np.fmax(v, _ball_min(L, c, q, *st.ball))
    return np.where(np.isnan(v), -np.inf, v)


def _ball_min(L, c, q, x0, eps, p):
    """A float <= min of the rows L x + c (charges q) over the l_p ball ||x - x0||_p <= eps
    (p "2" or "1"): L x0 + c - eps ||L||_p* (the dual norm: 2, or the largest |L_i|)."""
    n, inf = L.shape[1], np.inf
    d = L @ x0
    err = up(gamma(n) * (np.abs(L) @ np.abs(x0)))  # |fl(L x0) - L x0| <= err
    if p == "2":  # sum L_i^2 <= fl(sum) (1 + 2 gamma_n) (nonnegative terms); each rounding up
        s = np.nextafter((L * L).sum(1) * (1.0 + 2.0 * gamma(n + 1)), inf)
        norm = np.nextafter(np.sqrt(s), inf)
    else:
        norm = np.abs(L).max(axis=1, initial=0.0)
    # eps ||L|| + err + q, each sum and product rounded to nearest and then one float up
    tot = np.nextafter(np.nextafter(err + q, inf) + np.nextafter(eps * norm, inf), inf)
    return down(down(d + c) - tot)


def interval(ops, lo, hi):
    """Bounds (B, n_out) of ``ops`` applied to every point of the boxes [lo, hi] (B, n_in):
    outward, each rounding charged (a product by Higham's bound, a sum by one ulp)."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    for op in ops:
        if op[0] == "maxpool":  # the max of the window's ends: no arithmetic
            lo, hi = window_values(lo, op[1]).max(axis=2), window_values(hi, op[1]).max(axis=2)
        elif op[0] == "mat":
            W, _, aW, Wp, Wn = parts(op[1])
            g = gamma(W.shape[0])
            with np.errstate(invalid="ignore"):
                err = up(g * ((np.abs(lo) + np.abs(hi)) @ aW))
                lo, hi = down(lo @ Wp + hi @ Wn - err), -down(-(hi @ Wp + lo @ Wn) - err)
        elif op[0] == "take":  # no arithmetic
            ok = op[1] >= 0
            w = np.maximum(op[1], 0)
            lo, hi = np.where(ok, lo[:, w], 0.0), np.where(ok, hi[:, w], 0.0)
        elif op[0] == "divr":  # over a real d in [lo_d, hi_d] > 0: the ends' extremes
            lo_d, hi_d = op[1], op[2]
            with np.errstate(invalid="ignore"):
                lo = down(np.minimum(lo / lo_d, lo / hi_d))
                hi = -down(-np.maximum(hi / lo_d, hi / hi_d))
        elif op[0] in ("scale", "div"):  # each end rounded once, then one float outward
            a = op[1]
            f = (lambda v: a * v) if op[0] == "scale" else (lambda v: v / a)
            with np.errstate(invalid="ignore"):
                lo, hi = np.where(a >= 0, f(lo), f(hi)), np.where(a >= 0, f(hi), f(lo))
            lo, hi = down(lo), -down(-hi)
        else:
            t = op[2] * op[1]
            e = up(2 * U * np.abs(t))
            lo, hi = down(down(lo + t) - e), -down(down(-hi - t) - e)
        lo, hi = np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)
    return lo, hi
