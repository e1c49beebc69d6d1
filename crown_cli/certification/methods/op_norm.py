"""Op-norm: the global Lipschitz bound from per-layer operator norms (the paper's "Op norm").

Write the margin as g(x) = w . h(x) + const with w = W_m[c] - W_m[t] (the last layer folded
into the margin, as in the paper) and h(x) = act(W_{m-1} ... act(W_0 x + b_0) ...) the last
hidden layer. For inputs x, y and the input norm p with dual q (1/p + 1/q = 1):

    |g(x) - g(y)| <= ||w||_q ||h(x) - h(y)||_p                                   (Hoelder)
    ||act(z) - act(z')||_p <= Lphi ||z - z'||_p      (elementwise, Lphi = sup |act'|)
    ||W (a - a')||_p <= ||W||_{p->p} ||a - a'||_p

so g is Lipschitz in l_p with  L = ||w||_q * prod_k (Lphi ||W_k||_{p->p})  over the hidden
layers k = 0..m-1, where ||W||_{inf->inf} is the largest row sum of |W|, ||W||_{1->1} the
largest column sum and ||W||_{2->2} the spectral norm. Then g(x) >= g(x0) - L ||x - x0||_p > 0
for ||x - x0||_p < g(x0) / L, and the certified radius is eps = g(x0) / L in closed form (the
minimum over targets for several). It ignores where x0 is, hence is far below CROWN.

Lphi: 1 for ReLU, tanh, arctan, softplus; 1/4 for sigmoid; max(1, alpha) for leaky ReLU and
ELU; alpha for hard sigmoid.

Floating point: g(x0) is replaced by a rigorous lower bound, every norm is rounded up by the
engine's allowance (2^-32 relative; the spectral norm, computed by an SVD whose backward error
is a small multiple of 2^-53 ||W||, by 1e-9 relative), and eps is taken 1e-9 below
g_low / L so that ``g_low - eps L`` stays > 0 after rounding.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from crown_cli.engine.rounding import FP_ATOL, FP_RTOL
from crown_cli.certification.methods._common import DUAL, center_margins, lipschitz_constant, vec_norms

SPECTRAL_RTOL = 1e-9


def operator_norm(W: np.ndarray, norm: str) -> float:
    """An upper bound of ||W||_{p->p} for p = norm."""
    A = np.abs(W)
    if norm == "inf":
        v = float(A.sum(axis=1).max())
    elif norm == "1":
        v = float(A.sum(axis=0).max())
    else:
        v = float(np.linalg.norm(W, 2)) * (1.0 + SPECTRAL_RTOL)
    return v * (1.0 + FP_RTOL) + FP_ATOL


def hidden_factor(weights, activation: str, alpha, norm: str) -> float:
    """prod_k Lphi ||W_k||_{p->p} over the hidden layers, rounded up (independent of x0)."""
    lphi = lipschitz_constant(activation, alpha)
    hidden = 1.0
    for W in weights[:-1]:
        hidden *= lphi * operator_norm(W, norm) * (1.0 + FP_RTOL)
    return hidden


def lipschitz_bounds(weights, activation: str, alpha, C: np.ndarray, norm: str,
                     hidden: Optional[float] = None) -> np.ndarray:
    """Upper bounds (r,) of the l_p Lipschitz constants of the margins C @ f(x); ``hidden`` may
    pass :func:`hidden_factor` of the same network (cached: an SVD per layer for l_2)."""
    if hidden is None:
        hidden = hidden_factor(weights, activation, alpha, norm)
    rows = C @ weights[-1]
    # |rows| plus the rounding of C @ W_m
    rows_up = np.abs(rows) + FP_RTOL * (np.abs(C) @ np.abs(weights[-1]))
    return vec_norms(rows_up, DUAL[norm]) * hidden * (1.0 + FP_RTOL) + FP_ATOL


def op_norm_radius(weights, biases, x0, norm: str, C, activation: str = "relu", alpha=None,
                   hidden: Optional[float] = None):
    """(eps, lower_bound): the closed-form certified radius for all rows of C at once, and the
    margin's lower bound ``min_r (g_low_r - eps L_r)`` there (> 0 when eps > 0)."""
    C = np.atleast_2d(np.asarray(C, dtype=np.float64))
    x0 = np.asarray(x0, dtype=np.float64)
    _, g_low = center_margins(weights, biases, activation, alpha, C, x0)
    L = lipschitz_bounds(weights, activation, alpha, C, norm, hidden)
    if not np.all(g_low > 0):
        return 0.0, float(np.min(g_low))
    eps = float(np.min(g_low / L)) * (1.0 - 1e-9)
    eps = float(np.nextafter(eps, 0.0))
    return eps, lower_bound_at(g_low, L, eps)


def lower_bound_at(g_low: np.ndarray, L: np.ndarray, eps: float) -> float:
    """min over rows of g_low - eps * L, rounded down."""
    drop = eps * L
    return float(np.min(g_low - drop - FP_RTOL * (np.abs(g_low) + drop) - FP_ATOL))


def supports(activation: str, alpha) -> bool:
    return lipschitz_constant(activation, alpha) is not None
