"""Numba kernels of the CROWN engine (:mod:`crown_cli.engine.dense_crown`): row norms, input terms and
one back-substitution step through a layer's relaxation.

Compiled with ``cache=True`` (a warm process loads machine code instead of compiling) and
never with fastmath. Every kernel sums in float64 whatever the dtype of its matrices.
"""
import numpy as np
from numba import njit


@njit(cache=True)
def dual_norms(A, qcode):
    """Row-wise dual norm of A (r, n): l1 for qcode 0, l2 for 1, l_inf for 2."""
    r, n = A.shape
    out = np.empty(r)
    for j in range(r):
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        k = 0
        if qcode == 0:
            while k + 4 <= n:  # four accumulators: independent chains, same guarantees
                s0 += abs(A[j, k])
                s1 += abs(A[j, k + 1])
                s2 += abs(A[j, k + 2])
                s3 += abs(A[j, k + 3])
                k += 4
            while k < n:
                s0 += abs(A[j, k])
                k += 1
            out[j] = (s0 + s1) + (s2 + s3)
        elif qcode == 1:
            while k + 4 <= n:
                s0 += A[j, k] * A[j, k]
                s1 += A[j, k + 1] * A[j, k + 1]
                s2 += A[j, k + 2] * A[j, k + 2]
                s3 += A[j, k + 3] * A[j, k + 3]
                k += 4
            while k < n:
                s0 += A[j, k] * A[j, k]
                k += 1
            out[j] = np.sqrt((s0 + s1) + (s2 + s3))
        else:
            for k in range(n):
                v = abs(A[j, k])
                if v > s0:
                    s0 = v
            out[j] = s0
    return out


@njit(cache=True)
def input_terms(A, x0, qcode):
    """For each row a of A: (a.x0, ||a||_q, sum |a_i x0_i|)."""
    r, n = A.shape
    lin = np.empty(r)
    mag = np.empty(r)
    for j in range(r):
        s0 = 0.0
        s1 = 0.0
        m0 = 0.0
        m1 = 0.0
        k = 0
        while k + 2 <= n:
            t0 = A[j, k] * x0[k]
            t1 = A[j, k + 1] * x0[k + 1]
            s0 += t0
            s1 += t1
            m0 += abs(t0)
            m1 += abs(t1)
            k += 2
        while k < n:
            t0 = A[j, k] * x0[k]
            s0 += t0
            m0 += abs(t0)
            k += 1
        lin[j] = s0 + s1
        mag[j] = m0 + m1
    return lin, dual_norms(A, qcode), mag


@njit(cache=True)
def _pick(values, idx):
    """values[idx] as a new contiguous float64 array."""
    out = np.empty(idx.shape[0])
    for c in range(idx.shape[0]):
        out[c] = values[idx[c]]
    return out


@njit(cache=True)
def relax_shared(Lam, aU, bU, aL, bL, bias, agree, diff, icols):
    """One back-substitution step while the upper and lower chains still share ``Lam``.

    Lam (r, n) multiplies the activations a = act(z) of a hidden layer with z = W a_prev + bias.
    Returns DS (r, |agree|): Lam scaled by the common slope on columns where aU == aL;
    DU, DL (r, |diff|): sign-selected slopes for the upper/lower chain on the other columns;
    cU, cL: the constants (intercepts + bias) picked up; mU, mL: sums of their absolute terms.
    ``icols`` lists the columns with a non-zero intercept.
    """
    r = Lam.shape[0]
    na = agree.shape[0]
    nd = diff.shape[0]
    ni = icols.shape[0]
    DS = np.empty((r, na), Lam.dtype)
    DU = np.empty((r, nd), Lam.dtype)
    DL = np.empty((r, nd), Lam.dtype)
    cU = np.zeros(r)
    cL = np.zeros(r)
    mU = np.zeros(r)
    mL = np.zeros(r)
    # the per-column values in column order, contiguous: only Lam is gathered in the loops
    sA, bA = _pick(aU, agree), _pick(bias, agree)
    uD, lD, bD = _pick(aU, diff), _pick(aL, diff), _pick(bias, diff)
    uI, lI = _pick(bU, icols), _pick(bL, icols)
    for j in range(r):
        s0 = 0.0
        s1 = 0.0
        a0 = 0.0
        a1 = 0.0
        for c in range(na):
            d = Lam[j, agree[c]] * sA[c]
            DS[j, c] = d
            t = d * bA[c]
            if c & 1:  # two accumulators: independent chains, same guarantees
                s1 += t
                a1 += abs(t)
            else:
                s0 += t
                a0 += abs(t)
        su = s0 + s1
        au = a0 + a1
        sl = su
        al = au
        u0 = 0.0
        l0 = 0.0
        ua = 0.0
        la = 0.0
        for c in range(nd):
            v = Lam[j, diff[c]]
            if v >= 0.0:
                du = v * uD[c]
                dl = v * lD[c]
            else:
                du = v * lD[c]
                dl = v * uD[c]
            DU[j, c] = du
            DL[j, c] = dl
            tu = du * bD[c]
            tl = dl * bD[c]
            u0 += tu
            l0 += tl
            ua += abs(tu)
            la += abs(tl)
        su += u0
        sl += l0
        au += ua
        al += la
        u0 = 0.0
        l0 = 0.0
        ua = 0.0
        la = 0.0
        for c in range(ni):
            v = Lam[j, icols[c]]
            if v >= 0.0:
                tu = v * uI[c]
                tl = v * lI[c]
            else:
                tu = v * lI[c]
                tl = v * uI[c]
            u0 += tu
            l0 += tl
            ua += abs(tu)
            la += abs(tl)
        cU[j] = su + u0
        cL[j] = sl + l0
        mU[j] = au + ua
        mL[j] = al + la
    return DS, DU, DL, cU, cL, mU, mL


@njit(cache=True)
def relax_chain(Lam, aS, bS, aO, bO, bias, cols, icols):
    """One back-substitution step of a single chain.

    Entries of Lam >= 0 take the (aS, bS) side of the relaxation, negative ones (aO, bO):
    pass (aU, bU, aL, bL) for an upper bound and (aL, bL, aU, bU) for a lower bound.
    Returns D (r, |cols|) = sign-selected slopes on ``cols``, the constant picked up and the
    sum of its absolute terms.
    """
    r = Lam.shape[0]
    nc = cols.shape[0]
    ni = icols.shape[0]
    D = np.empty((r, nc), Lam.dtype)
    const = np.zeros(r)
    mag = np.zeros(r)
    sC, oC, bC = _pick(aS, cols), _pick(aO, cols), _pick(bias, cols)
    sI, oI = _pick(bS, icols), _pick(bO, icols)
    for j in range(r):
        s0 = 0.0
        s1 = 0.0
        m0 = 0.0
        m1 = 0.0
        for c in range(nc):
            v = Lam[j, cols[c]]
            d = v * sC[c] if v >= 0.0 else v * oC[c]
            D[j, c] = d
            t = d * bC[c]
            if c & 1:
                s1 += t
                m1 += abs(t)
            else:
                s0 += t
                m0 += abs(t)
        for c in range(ni):
            v = Lam[j, icols[c]]
            t = v * sI[c] if v >= 0.0 else v * oI[c]
            s0 += t
            m0 += abs(t)
        const[j] = s0 + s1
        mag[j] = m0 + m1
    return D, const, mag


@njit(cache=True)
def absdot(D, w):
    """For each row d of D: sum_c |d_c| w_c, summed in float64 (w >= 0)."""
    r, n = D.shape
    out = np.empty(r)
    for j in range(r):
        s0 = 0.0
        s1 = 0.0
        k = 0
        while k + 2 <= n:
            s0 += abs(D[j, k]) * w[k]
            s1 += abs(D[j, k + 1]) * w[k + 1]
            k += 2
        while k < n:
            s0 += abs(D[j, k]) * w[k]
            k += 1
        out[j] = s0 + s1
    return out
