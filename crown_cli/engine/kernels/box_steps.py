"""numba kernel of the batched back-substitution over boxes (:mod:`crown_cli.engine.dense_boxes`):
the slope scaling of one step, fused into one pass over Lam. Its numpy twin is
:func:`crown_cli.engine.batch_steps.relax` with :meth:`~crown_cli.engine.batch_steps.Rows.step` (same products, sums in another order).
"""
from numba import njit


@njit(cache=True)
def scale(Lam, aU, bU, aL, bL, b_i, absb_i, cols, D, const, mag):
    """D[j, i, kk] = Lam[j, i, k] * (aU[j, k] if Lam < 0 else aL[j, k]) for the columns
    k = cols[kk], and per (box, row) the constant and magnitude the step picks up
    (``D @ b_i`` plus the intercepts, and the same of absolute values)."""
    N, r, _ = Lam.shape
    for j in range(N):
        for i in range(r):
            c = 0.0
            m = 0.0
            for kk in range(cols.shape[0]):
                k = cols[kk]
                v = Lam[j, i, k]
                if v < 0.0:
                    s = aU[j, k]
                    t = bU[j, k]
                else:
                    s = aL[j, k]
                    t = bL[j, k]
                dv = v * s
                D[j, i, kk] = dv
                vt = v * t
                c += dv * b_i[k] + vt
                m += abs(dv) * absb_i[k] + abs(vt)
            const[j, i] = c
            mag[j, i] = m
