"""numba kernel of the convex-hull bound's value and gradient
(:func:`crown_cli.engine.hull.hull_value_and_grad`, its numpy twin, which runs under
``crown_cli.engine.kernels.set_kernels("numpy")``): two passes over W1's entries per box
instead of a dozen numpy temporaries. Used by the optimiser only; the proven bound
(:func:`crown_cli.engine.hull.hull_bounds`) is always the numpy code.
"""
import numpy as np
from numba import njit


@njit(cache=True)
def value_and_grad(ptr, q, w, b1, v, c, L, H, s, theta):
    """ptr (n + 1,): each row's entries ptr[j]:ptr[j+1] of q (column) and w (value); v, s
    (N, n); c (N,); L, H (N, d); theta (N, nnz). Returns (val (N,), gs (N, n), gt (N, nnz),
    xs (N, d)), as the numpy twin."""
    N, n = v.shape
    d = L.shape[1]
    nnz = w.shape[0]
    val = np.empty(N)
    gs = np.zeros((N, n))
    gt = np.zeros((N, nnz))
    xs = np.empty((N, d))
    first = np.empty(n, np.bool_)
    G = np.empty(d)
    for i in range(N):
        for t in range(d):
            G[t] = 0.0
        K = c[i]
        for j in range(n):
            vj = v[i, j]
            M1 = 0.0
            M2 = 0.0
            if vj >= 0.0:
                sj = min(max(s[i, j], 0.0), 1.0)
                ps = vj * sj
                for k in range(ptr[j], ptr[j + 1]):
                    G[q[k]] += ps * w[k]
                K += ps * b1[j]
            else:
                for k in range(ptr[j], ptr[j + 1]):
                    ck = theta[i, k] * w[k]
                    dk = w[k] - ck
                    col = q[k]
                    M1 += -ck * L[i, col] if ck > 0.0 else -ck * H[i, col]
                    M2 += dk * H[i, col] if dk > 0.0 else dk * L[i, col]
                    G[col] += vj * ck
                M2 += b1[j]
                first[j] = M1 >= M2
                K += vj * (M1 if M1 >= M2 else M2)
        acc = 0.0
        for t in range(d):
            x = L[i, t] if G[t] > 0.0 else H[i, t]
            xs[i, t] = x
            acc += G[t] * x
        val[i] = acc + K
        for j in range(n):
            vj = v[i, j]
            if vj >= 0.0:
                z = b1[j]
                for k in range(ptr[j], ptr[j + 1]):
                    z += w[k] * xs[i, q[k]]
                gs[i, j] = vj * z
            else:
                for k in range(ptr[j], ptr[j + 1]):
                    ck = theta[i, k] * w[k]
                    dk = w[k] - ck
                    col = q[k]
                    if first[j]:
                        dm = -L[i, col] if ck > 0.0 else -H[i, col]
                    else:
                        dm = -H[i, col] if dk > 0.0 else -L[i, col]
                    gt[i, k] = vj * (xs[i, col] + dm) * w[k]
    return val, gs, gt, xs


@njit(cache=True)
def adam_step(p, g, m, v, free, t, step, lo, hi):
    """One projected Adam ascent step in place on p (N, K) with gradient g, moments m, v, only
    where ``free`` (N, K), p kept in [lo, hi]: the fused twin of
    :meth:`crown_cli.engine.optim.Adam.ascend` with ``crown_cli.engine.hull.ADAM``'s
    settings (the numpy path of :func:`crown_cli.engine.hull.hull_optimise`)."""
    b1, b2, eps = 0.9, 0.999, 1e-12
    c1 = 1.0 - b1 ** t
    c2 = 1.0 - b2 ** t
    N, K = p.shape
    for i in range(N):
        for k in range(K):
            gk = g[i, k] if free[i, k] else 0.0
            mk = b1 * m[i, k] + (1.0 - b1) * gk
            vk = b2 * v[i, k] + (1.0 - b2) * gk * gk
            m[i, k] = mk
            v[i, k] = vk
            x = p[i, k] + step * (mk / c1) / (np.sqrt(vk / c2) + eps)
            p[i, k] = min(max(x, lo), hi)
