"""ReLU and leaky ReLU relaxations in vectorised numpy: the numba-free twins of
:func:`crown_cli.engine.relaxations.relu.relu_relaxation` and
:func:`crown_cli.engine.relaxations.extra.leaky_relu_relaxation`, used with the numpy kernels
(``crown_cli.engine.kernels.set_kernels("numpy")``).

Each output element is computed by the same float64 operations in the same order as in the
numba function, so both give bit-identical slopes and intercepts (tests/test_kernels.py);
the derivations are in the docstrings there.
"""
import math

import numpy as np

EPS = 2.0 ** -52  # as in relu.py and sigmoid_family.py
TINY = 5e-324
SLACK_ULPS = 8.0


def _slack(k, b, M, S):
    """sigmoid_family._slack, elementwise: 8 ulps of |k| M + |b| + S, plus 8 subnormals."""
    return SLACK_ULPS * EPS * (np.abs(k) * M + np.abs(b) + S) + SLACK_ULPS * TINY


def relu_relaxation(l, u, adaptive):
    """Slopes/intercepts (aU, bU, aL, bL), each of shape l.shape (see relu.relu_relaxation)."""
    n = l.shape[0]
    aU, bU, aL, bL = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    active = l >= 0.0
    aU[active] = 1.0
    aL[active] = 1.0
    unstable = ~active & ~(u <= 0.0)
    li, ui = l[unstable], u[unstable]
    s = ui / (ui - li)  # u - l > 0 strictly here
    b = -s * li
    aU[unstable] = s
    # up by a few ulps so that s*z + b >= relu(z) also holds when evaluated in float64
    bU[unstable] = b + 4.0 * EPS * (s * np.maximum(ui, -li) + b) + 4.0 * TINY
    aL[unstable] = np.where(ui >= -li, 1.0, 0.0) if adaptive else s
    return aU, bU, aL, bL


def leaky_relu_relaxation(l, u, alpha, adaptive):
    """Leaky ReLU z (z >= 0), alpha*z (z < 0), finite alpha (see extra.leaky_relu_relaxation)."""
    if not math.isfinite(alpha):
        raise ValueError("leaky_relu_relaxation: alpha must be finite")
    n = l.shape[0]
    aU, bU, aL, bL = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    active = l >= 0.0
    inactive = ~active & (u <= 0.0)
    aU[active] = aL[active] = 1.0
    aU[inactive] = aL[inactive] = alpha
    unstable = ~active & ~inactive
    li, ui = l[unstable], u[unstable]
    fl = alpha * li
    s = (ui - fl) / (ui - li)  # u - l >= u > 0: no division by ~0
    if adaptive:
        a = np.where(ui >= -li, 1.0, alpha)
    else:
        a = np.minimum(np.maximum(s, min(alpha, 1.0)), max(alpha, 1.0))  # chord slope in [alpha, 1]
    # chord: f - s z is convex (concave) so its max (min) is at an end-point
    g1 = fl - s * li
    g2 = ui - s * ui
    S = np.maximum(np.abs(fl), np.abs(ui))
    M = np.maximum(-li, ui)
    if alpha <= 1.0:
        b = np.maximum(g1, g2)
        aU[unstable] = s
        bU[unstable] = b + _slack(s, b, M, S)
        aL[unstable] = a
    else:
        b = np.minimum(g1, g2)
        aL[unstable] = s
        bL[unstable] = b - _slack(s, b, M, S)
        aU[unstable] = a
    return aU, bU, aL, bL
