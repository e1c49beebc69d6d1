"""Linear relaxation of ONNX Floor of data (the range reduction ``x - 2 pi floor(x / 2 pi)``
of VNN-COMP 2024 ml4acopf's piecewise-linear sine and cosine). Plain numpy, as sign.py.

Same contract as the other relaxations: 1-D float64 arrays (l, u), l <= u, in; four arrays
(aU, bU, aL, bL) out with ``aL*z + bL <= floor(z) <= aU*z + bU`` for every z in [l, u].

- ``floor(l) = floor(u)`` (no jump inside): both lines the constant floor(l), exact.
- An infinite end: the constant lines floor(l), floor(u) (infinite where the end is).
- Else both lines have slope 1: ``z - 1 <= floor(z) <= z``. Their gap, 1, is the least a
  pair of lines across a jump can have, and they keep the input's dependence, so a range
  reduction ``x - c floor(x / c)`` stays within its period instead of adding its input's
  range. The intercepts are the closed forms for a slope k in [0, 1]: on the step
  [n, n + 1) the function ``floor(t) - k t = n - k t`` falls, so its sup is at the step's
  left end and its inf at the right end; over the steps these are ``n (1 - k)`` (rising in n)
  and ``n (1 - k) - k``, so ``sup = max(floor(l) - k l, floor(u) (1 - k))`` and
  ``inf = min(floor(l) - k (floor(l) + 1), floor(u) - k u)``, computed in float64 and moved
  outward by the other relaxations' 8 ulps (relu_numpy._slack).
"""
import numpy as np

from crown_cli.engine.relaxations.relu_numpy import _slack


def floor_relaxation(l, u):
    """Slopes/intercepts (aU, bU, aL, bL) of floor on [l, u], elementwise (see module)."""
    l = np.asarray(l, dtype=np.float64).reshape(-1)
    u = np.asarray(u, dtype=np.float64).reshape(-1)
    fl, fu = np.floor(l), np.floor(u)
    aU, aL = np.zeros(l.size), np.zeros(l.size)
    bU, bL = fu.copy(), fl.copy()
    jump = (fl != fu) & np.isfinite(l) & np.isfinite(u)
    if np.any(jump):
        lj, uj, flj, fuj = l[jump], u[jump], fl[jump], fu[jump]
        k = np.ones(lj.size)
        M = np.maximum(np.abs(lj), np.abs(uj))
        gU = np.maximum(flj - k * lj, fuj - k * fuj)
        gL = np.minimum(flj - k * (flj + 1.0), fuj - k * uj)
        S = np.maximum(np.abs(flj), np.abs(fuj)) + 1.0
        aU[jump], aL[jump] = k, k
        bU[jump] = gU + _slack(k, gU, M, S)
        bL[jump] = gL - _slack(k, gL, M, S)
    return aU, bU, aL, bL
