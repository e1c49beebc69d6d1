"""Linear relaxation of ONNX Sign (binarised networks): sign(z) = -1 (z < 0), 0 (z = 0),
1 (z > 0). Plain numpy (no numba): the same function under either kernel switch.

Same contract as the other relaxations: 1-D float64 arrays (l, u), l <= u, finite, in; four
arrays (aU, bU, aL, bL) out with ``aL*z + bL <= sign(z) <= aU*z + bU`` for every z in [l, u],
the jump at 0 and the value 0 there included.

Cases (the interval's end-points compared with 0 exactly, so sign(0) = 0 is never missed):

- ``l > 0``: both lines the constant 1; ``u < 0``: the constant -1; ``l = u = 0``: 0.
- ``l = 0 < u`` (values 0 at 0, 1 on (0, u]): upper the constant 1; lower the chord through
  (0, 0) and (u, 1), slope 1/u (of all lines below, those through (0, 0) with slope in
  [0, 1/u], the one of least area).
- ``l < 0 = u`` (values -1 on [l, 0), 0 at 0): lower the constant -1; upper the chord through
  (l, -1) and (0, 0), slope 1/|l|.
- ``l < 0 < u``: a line above must reach 1 as z -> 0+ and -1 at l, so the valid upper lines
  of least extent are ``1 + a z`` with a in [0, 2/|l|] (the constant 1 to the line through
  (l, -1)); the lower ones ``-1 + a z`` with a in [0, 2/u] (the constant -1 to the line through
  (u, 1)). The area between sign and the line is linear in a with coefficient (u^2 - l^2)/2,
  so an end of the range is best (as CROWN-Ada's ReLU choice): upper slope 0 if u >= -l else
  2/|l|; lower slope 2/u if u > -l else 0.

A sloped line is taken only where its end-point |l| or u is at least ``MIN_END`` = 2^-500
(slopes at most 2^501: no overflow in the slope, the intercept or the back-substitution's
products); nearer 0 the constant of the same family (1 or 0 above, -1 or 0 below) stands in.

Constant lines are exact (no slack: they are the function's own values). A sloped line's
slope is the rounded quotient; its intercept is the tightest valid one for that rounded slope
(the sup / inf of sign(t) - a t over [l, u], attained at an end-point or as t -> 0 from one
side), moved outward by the float64 allowance of the other relaxations (8 ulps of
|a| max(|l|, |u|) + |b| + 1, :func:`crown_cli.engine.relaxations.relu_numpy._slack`).
"""
import numpy as np

from crown_cli.engine.relaxations.relu_numpy import _slack

MIN_END = 2.0 ** -500


def sign_relaxation(l, u):
    """Slopes/intercepts (aU, bU, aL, bL) of sign on [l, u], elementwise (see module)."""
    l = np.asarray(l, dtype=np.float64).reshape(-1)
    u = np.asarray(u, dtype=np.float64).reshape(-1)
    n = l.size
    aU, aL = np.zeros(n), np.zeros(n)
    # constants first: 1 above everywhere but where u < 0 or u = 0; -1 below likewise
    bU = np.where(u < 0.0, -1.0, np.where(u == 0.0, 0.0, 1.0))
    bL = np.where(l > 0.0, 1.0, np.where(l == 0.0, 0.0, -1.0))
    M = np.maximum(np.abs(l), np.abs(u))
    neg, pos = l < 0.0, u > 0.0
    # upper slope: the chord through (l, -1), (0, 0) when u = 0 (a = 1/|l|); the line through
    # (l, -1) and (0, 1) when l < 0 < u and u < -l (a = 2/|l|); else none
    up = neg & (l <= -MIN_END) & ((u == 0.0) | (pos & (u < -l)))
    aU[up] = np.where(u[up] == 0.0, 1.0, 2.0) / -l[up]
    # sup over [l, u] of sign(t) - a t: -1 - a l at t = l, and sign's value just right of 0
    # (1 when u > 0, else 0 at t = 0)
    g = np.maximum(-1.0 - aU[up] * l[up], bU[up])
    bU[up] = g + _slack(aU[up], g, M[up], 1.0)
    # lower slope: the chord through (0, 0), (u, 1) when l = 0 (a = 1/u); the line through
    # (0, -1) and (u, 1) when l < 0 < u and u > -l (a = 2/u)
    lo = pos & (u >= MIN_END) & ((l == 0.0) | (neg & (u > -l)))
    aL[lo] = np.where(l[lo] == 0.0, 1.0, 2.0) / u[lo]
    g = np.minimum(1.0 - aL[lo] * u[lo], bL[lo])
    bL[lo] = g - _slack(aL[lo], g, M[lo], 1.0)
    return aU, bU, aL, bL
