"""numba kernels of ReLU splitting's back-substitution steps
(:class:`crown_cli.verification.bab.bounder.Bounder`): the elementwise relaxation of a layer
and its reverse pass, one pass over the batch instead of a dozen numpy temporaries. Same
arithmetic as the numpy code there (their twin), which runs under
``crown_cli.engine.kernels.set_kernels("numpy")``.
"""
import numpy as np
from numba import njit


@njit(cache=True)
def step32(Lam, ss, cols, sp, al, be, cs, ct, leak, o0):
    """D = relaxed coefficients of layer's z (N, n) float32, the intercept sum per row
    (float64), and the tape (pos, slope) of the unstable columns. ``cs``, ``ct`` (N, nU):
    each row's chord slope and intercept, indexed like ``sp``, ``al`` and ``be``."""
    N, n = Lam.shape
    nu = cols.shape[0]
    D = np.empty((N, n), np.float32)
    pos = np.empty((N, nu), np.bool_)
    slope = np.empty((N, nu), np.float32)
    icpt = np.zeros(N)
    lk = np.float32(leak)
    for i in range(N):
        for j in range(n):
            D[i, j] = Lam[i, j] * ss[j]
        acc = 0.0
        for q in range(nu):
            c = cols[q]
            lv = Lam[i, c]
            s = sp[i, o0 + q]
            p = lv >= 0.0
            if s == 0:
                if p:
                    sl = al[i, o0 + q]
                else:
                    sl = cs[i, o0 + q]
                    acc += lv * ct[i, o0 + q]
            elif s > 0:
                sl = np.float32(1.0)
            else:
                sl = lk
            D[i, c] = lv * sl + np.float32(-s) * be[i, o0 + q]
            pos[i, q] = p
            slope[i, q] = sl
        icpt[i] = acc
    return D, icpt, pos, slope


@njit(cache=True)
def back32(gD, Lam, cols, sp, pos, slope, ss, ct, o0, gA, gB, want_G):
    """Reverse pass of :func:`step32`: fills gA, gB (N, nU) at the layer's columns; returns
    the gradient with respect to Lam (N, n) if ``want_G``. ``ct`` (N, nU) as in step32."""
    N, n = gD.shape
    nu = cols.shape[0]
    G = np.empty((N, n if want_G else 0), np.float32)
    for i in range(N):
        if want_G:
            for j in range(n):
                G[i, j] = gD[i, j] * ss[j]
        for q in range(nu):
            c = cols[q]
            g = gD[i, c]
            s = sp[i, o0 + q]
            if s == 0:
                gB[i, o0 + q] = 0.0
                if pos[i, q]:
                    gA[i, o0 + q] = g * Lam[i, c]
                    if want_G:
                        G[i, c] = g * slope[i, q]
                else:
                    gA[i, o0 + q] = 0.0
                    if want_G:
                        G[i, c] = g * slope[i, q] + ct[i, o0 + q]
            else:
                gA[i, o0 + q] = 0.0
                gB[i, o0 + q] = np.float32(-s) * g
                if want_G:
                    G[i, c] = g * slope[i, q]
    return G


@njit(cache=True)
def interm_step64(Lam, ss, upos, sp, l, u, cs, ct, leak, bk, absbk, vk, tk, alo):
    """One float64 step of
    :meth:`crown_cli.verification.bab.domain_bounds.DomainBounds._rows_lower` through a hidden
    layer, for Lam (n, rows, w) over the layer's kept neurons: D (n * rows, w) (Lam scaled by
    each domain's slopes: stable ones ``ss``; at the unstable positions ``upos`` split
    neurons identity / ``leak``, open ones CROWN's adaptive lower slope or the chord (cs, ct)
    by the sign of Lam; ``alo`` (rows, nu), when not empty, gives each row's lower slopes of
    the open neurons instead of the adaptive ones), and per row the constant picked up
    (D . bk plus the chord intercepts), the magnitude sum of those terms (|D| . absbk plus
    |intercepts|) and the product-rounding charge |D| . vk + tk. Same products as the numpy
    path there; the sums in another order."""
    n, rows, w = Lam.shape
    nu = upos.shape[0]
    D = np.empty((n * rows, w))
    dc = np.zeros(n * rows)
    dm = np.zeros(n * rows)
    st = np.zeros(n * rows)
    s_lo = np.empty(nu)
    use_alo = alo.shape[0] > 0
    for i in range(n):
        for q in range(nu):
            s = sp[i, q]
            if s > 0:
                s_lo[q] = 1.0
            elif s < 0:
                s_lo[q] = leak
            elif u[i, q] >= -l[i, q]:
                s_lo[q] = 1.0
            else:
                s_lo[q] = leak
        for r in range(rows):
            o = i * rows + r
            for j in range(w):
                D[o, j] = Lam[i, r, j] * ss[j]
            ic = 0.0
            im = 0.0
            for q in range(nu):
                c = upos[q]
                lv = Lam[i, r, c]
                s = sp[i, q]
                if s == 0 and lv >= 0.0 and use_alo:
                    D[o, c] = lv * alo[r, q]
                elif lv >= 0.0 or s != 0:
                    D[o, c] = lv * s_lo[q]
                else:
                    D[o, c] = lv * cs[i, q]
                    t = lv * ct[i, q]
                    ic += t
                    im += abs(t)
            a = 0.0
            m = 0.0
            g = 0.0
            for j in range(w):
                dv = D[o, j]
                a += dv * bk[j]
                ad = abs(dv)
                m += ad * absbk[j]
                g += ad * vk[j]
            dc[o] = ic + a
            dm[o] = im + m
            st[o] = g + tk
    return D, dc, dm, st
