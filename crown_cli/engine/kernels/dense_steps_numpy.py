"""The kernels of :mod:`crown_cli.engine.kernels.dense_steps` in vectorised numpy, for runs too short to repay
numba's start-up (``crown_cli.engine.kernels.set_kernels("numpy")``; about 1 s saved, paid back by slower
evaluations after a few images of a large network).

Same signatures, same return values and dtypes: D matrices in the dtype of Lam; constants,
magnitudes and norms in float64. Every entry of D and every term of a constant is the same
float64 product as in the numba kernel (a float32 Lam promoted to float64 first, D rounded to
Lam's dtype only when stored; the l2 norm squares a float32 row in float32, as numba does), so
the D matrices are bit-identical. Only the float64 sums differ: BLAS or pairwise order instead
of left to right, and BLAS may fuse a product into its addition. Any such sum is within
~n * 2**-53 of its magnitude sum of the exact one, which the engine's widening (FP_RTOL of the
magnitude sum, three orders larger) covers for both alike.

Rows are processed in blocks of ``BLOCK`` elements so that the float64 temporaries stay in
cache (whole-matrix temporaries made these kernels ~3x slower).
"""
import numpy as np

BLOCK = 1 << 15  # elements per block of rows: 256 KB float64 temporaries


def _blocks(r, n):
    """Slices of consecutive rows of an (r, n) matrix, about BLOCK elements each."""
    step = max(1, BLOCK // max(n, 1))
    for j0 in range(0, r, step):
        yield slice(j0, min(r, j0 + step))


def _norms(A, absA64, qcode, ones):
    """Dual norms of the rows of A given |A| in float64 (l1, l_inf); l2 squares in A's dtype,
    as the numba kernel does, and sums in float64."""
    if qcode == 0:
        return absA64 @ ones
    if qcode == 1:
        return np.sqrt(np.square(A) @ ones)
    return absA64.max(axis=1, initial=0.0)


def dual_norms(A, qcode):
    """Row-wise dual norm of A (r, n): l1 for qcode 0, l2 for 1, l_inf for 2."""
    r, n = A.shape
    out = np.empty(r)
    ones = np.ones(n)
    for s in _blocks(r, n):
        absA = None if qcode == 1 else np.abs(A[s], dtype=np.float64)
        out[s] = _norms(A[s], absA, qcode, ones)
    return out


def input_terms(A, x0, qcode):
    """For each row a of A: (a.x0, ||a||_q, sum |a_i x0_i|)."""
    r, n = A.shape
    lin, norm, mag = np.empty(r), np.empty(r), np.empty(r)
    ones, ax0 = np.ones(n), np.abs(x0)
    for s in _blocks(r, n):
        A64 = A[s].astype(np.float64)
        lin[s] = A64 @ x0
        absA = np.abs(A64, out=A64)
        mag[s] = absA @ ax0  # |a_i x0_i| = |a_i| |x0_i| exactly
        norm[s] = _norms(A[s], absA, qcode, ones)
    return lin, norm, mag


def _scale(V, slope, out, bias, abs_bias):
    """out[...] = V * slope (float64 products, rounded to out's dtype when stored);
    returns the constant D @ bias and its magnitude |D| @ |bias| of the float64 D."""
    if out.dtype == np.float64:
        D = np.multiply(V, slope, out=out)
        return D @ bias, np.abs(D) @ abs_bias
    D = np.multiply(V, slope, dtype=np.float64)
    out[...] = D
    c = D @ bias
    return c, np.abs(D, out=D) @ abs_bias


def _intercepts(V, pos, bS, bO):
    """Constant and magnitude of the intercept terms: v * bS where v >= 0, else v * bO."""
    T = np.multiply(V, np.where(pos, bS, bO), dtype=np.float64)
    c = T.sum(axis=1)
    return c, np.abs(T, out=T).sum(axis=1)


def relax_shared(Lam, aU, bU, aL, bL, bias, agree, diff, icols):
    """:func:`crown_cli.engine.kernels.dense_steps.relax_shared` (same arguments, results and dtypes) in numpy."""
    r, n = Lam.shape
    DS = np.empty((r, agree.shape[0]), Lam.dtype)
    DU = np.empty((r, diff.shape[0]), Lam.dtype)
    DL = np.empty((r, diff.shape[0]), Lam.dtype)
    cU, cL, mU, mL = np.empty(r), np.empty(r), np.empty(r), np.empty(r)
    aA, bA = aU[agree], bias[agree]
    aUd, aLd, bD = aU[diff], aL[diff], bias[diff]
    bUi, bLi = bU[icols], bL[icols]
    abA, abD = np.abs(bA), np.abs(bD)
    for s in _blocks(r, n):
        L = Lam[s]
        c, m = _scale(np.take(L, agree, axis=1), aA, DS[s], bA, abA)
        V = np.take(L, diff, axis=1)
        pos = V >= 0.0
        cu, mu = _scale(V, np.where(pos, aUd, aLd), DU[s], bD, abD)
        cl, ml = _scale(V, np.where(pos, aLd, aUd), DL[s], bD, abD)
        V = np.take(L, icols, axis=1)
        pos = V >= 0.0
        ci, mi = _intercepts(V, pos, bUi, bLi)
        cU[s], mU[s] = c + cu + ci, m + mu + mi
        ci, mi = _intercepts(V, pos, bLi, bUi)
        cL[s], mL[s] = c + cl + ci, m + ml + mi
    return DS, DU, DL, cU, cL, mU, mL


def relax_chain(Lam, aS, bS, aO, bO, bias, cols, icols):
    """One back-substitution step of a single chain.

    Entries of Lam >= 0 take the (aS, bS) side of the relaxation, negative ones (aO, bO):
    pass (aU, bU, aL, bL) for an upper bound and (aL, bL, aU, bU) for a lower bound.
    Returns D (r, |cols|) = sign-selected slopes on ``cols``, the constant picked up and the
    sum of its absolute terms.
    """
    r, n = Lam.shape
    D = np.empty((r, cols.shape[0]), Lam.dtype)
    const, mag = np.empty(r), np.empty(r)
    aSc, aOc, bC = aS[cols], aO[cols], bias[cols]
    bSi, bOi, abC = bS[icols], bO[icols], np.abs(bC)
    for s in _blocks(r, n):
        L = Lam[s]
        V = np.take(L, cols, axis=1)
        c, m = _scale(V, np.where(V >= 0.0, aSc, aOc), D[s], bC, abC)
        V = np.take(L, icols, axis=1)
        ci, mi = _intercepts(V, V >= 0.0, bSi, bOi)
        const[s], mag[s] = c + ci, m + mi
    return D, const, mag


def absdot(D, w):
    """For each row d of D: sum_c |d_c| w_c, summed in float64 (w >= 0)."""
    r, n = D.shape
    out = np.empty(r)
    for s in _blocks(r, n):
        out[s] = np.abs(D[s], dtype=np.float64) @ w
    return out
