"""Fast-Lip (Weng et al., ICML 2018): a certified margin bound from a local Lipschitz constant.

With Fast-Lin's pre-activation bounds [l, u] at radius eps, every hidden ReLU is active
(derivative 1), inactive (0) or unstable (derivative somewhere in [0, 1]) on the whole ball.
The gradient of the margin g = f_c - f_t is ``(W_m[c] - W_m[t]) D_{m-1} W_{m-1} ... D_0 W_0``
with D_k = diag(act'(z_k)); propagating interval bounds of that product backwards from the
last layer's row gives, per input coordinate i, |dg/dx_i| <= J_i over the ball. By the mean
value theorem along the segment from x0 (g is piecewise linear, its derivative along the
segment lies in the same intervals almost everywhere),

    g(x) >= g(x0) - ||x - x0||_p * ||J||_q,   1/p + 1/q = 1,

so ``g(x0) - eps * ||J||_q`` is a lower bound of the margin on the eps-ball, searched over eps
exactly like CROWN's bound. Leaky ReLU works the same way (derivatives alpha, 1 or between).

Fast-Lip is known to be looser than Fast-Lin (it drops the sign structure of the Jacobian),
which the tests check on average.

Floating point: the interval Jacobian is kept in centre-radius form and its radius widened by
the engine's allowance (2^-32 of the magnitudes) at every product; the margin at x0 is a
rigorous lower bound (``_common.center_margins``), so the result is sound like CROWN's.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from crown_cli.engine.dense_crown import Network, hidden_layer_bounds
from crown_cli.engine.rounding import FP_ATOL, FP_RTOL
from crown_cli.engine.input_sets import NORMS
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.certification.methods._common import DUAL, center_margins, derivative_range, vec_norms



def jacobian_bound(weights, bounds, C, activation="relu", alpha=None) -> np.ndarray:
    """J (r, d) >= |d (C f) / dx| elementwise over every x whose hidden pre-activations lie in
    ``bounds`` = [(l_k, u_k)] (one pair per hidden layer)."""
    W_last = weights[-1]
    Jc = C @ W_last
    Jr = FP_RTOL * (np.abs(C) @ np.abs(W_last)) + FP_ATOL
    for k in range(len(weights) - 2, -1, -1):
        l, u = bounds[k]
        dl, du = derivative_range(activation, alpha, l, u)
        lo_j, hi_j = Jc - Jr, Jc + Jr
        prods = (lo_j * dl, lo_j * du, hi_j * dl, hi_j * du)
        lo = np.minimum(np.minimum(prods[0], prods[1]), np.minimum(prods[2], prods[3]))
        hi = np.maximum(np.maximum(prods[0], prods[1]), np.maximum(prods[2], prods[3]))
        c = 0.5 * (lo + hi)
        rad = 0.5 * (hi - lo) + FP_RTOL * (np.abs(lo) + np.abs(hi)) + FP_ATOL
        aW = np.abs(weights[k])
        Jc = c @ weights[k]
        Jr = (rad @ aW) * (1.0 + FP_RTOL) + FP_RTOL * (np.abs(c) @ aW) + FP_ATOL
    return np.abs(Jc) + Jr


def fast_lip_lower_bound(weights, biases, x0, eps, norm, C, activation: str = "relu",
                         alpha=None, net: Optional[Network] = None) -> np.ndarray:
    """Lower bounds (r,) of the margins ``C @ f(x)`` over the l_p ball of radius eps around x0.

    ``net`` may pass a prebuilt :class:`crown_cli.engine.dense_crown.Network` of the same weights.
    """
    net = Network(weights, biases) if net is None else net
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    C = np.atleast_2d(np.asarray(C, dtype=np.float64))
    relax_fn = get_relaxation(activation, "fast-lin", alpha)
    bounds, _ = hidden_layer_bounds(net, x0, float(eps), NORMS[norm], relax_fn)
    _, g_low = center_margins(net.W, net.b, activation, alpha, C, x0)
    L = vec_norms(jacobian_bound(net.W, bounds, C, activation, alpha), DUAL[norm])
    drop = eps * L
    return g_low - drop - FP_RTOL * (np.abs(g_low) + drop) - FP_ATOL
