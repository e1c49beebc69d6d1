"""Helpers shared by the comparison methods: a rigorous lower bound of the margin at x0,
activation Lipschitz constants and derivative ranges, norm helpers.

Floating point: values are widened outward by ``FP_RTOL`` (2^-32) times the sum of the
absolute values of the terms they came from, one operation at a time (a product against
|A| |B|, so cancellation is covered), which covers gamma_N of a float64 sum of N <= 2^20 terms
(``methods.MAX_TERMS``; larger networks are refused).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from crown_cli.activations import apply_activation
from crown_cli.engine.rounding import FP_ATOL, FP_RTOL

# dual exponent of each input norm: the l_p ball's support function is eps * ||.||_q
DUAL = {"inf": "1", "2": "2", "1": "inf"}


def vec_norms(A: np.ndarray, norm: str) -> np.ndarray:
    """Row-wise l_p norms of A (r, n) (p in 'inf', '2', '1'), rounded up by the allowance."""
    A = np.abs(np.atleast_2d(A))
    if norm == "inf":
        v = A.max(axis=1)
    elif norm == "2":
        v = np.sqrt(np.einsum("ij,ij->i", A, A))
    else:
        v = A.sum(axis=1)
    return v * (1.0 + FP_RTOL) + FP_ATOL


def lipschitz_constant(activation: str, alpha) -> Optional[float]:
    """The activation's global Lipschitz constant (sup |act'|), or None if unknown."""
    a = 0.0 if alpha is None else abs(float(alpha))
    table = {
        "relu": 1.0, "tanh": 1.0, "arctan": 1.0, "softplus": 1.0, "linear": 1.0,
        "sigmoid": 0.25,
        "erf": 1.1283791670955128,  # 2 / sqrt(pi), rounded up
        "leaky_relu": max(1.0, a),
        "elu": max(1.0, a),  # alpha e^z <= alpha for z <= 0
        "hard_sigmoid": a,
    }
    return table.get(activation)


def derivative_range(activation: str, alpha, l: np.ndarray, u: np.ndarray):
    """Bounds [dl, du] of act'(z) for z in [l, u] (ReLU-type activations only).

    ReLU: 1 on stable-active neurons (l >= 0), 0 on stable-inactive ones (u <= 0), [0, 1] on
    unstable ones (Clarke's generalised derivative at the kink). Leaky ReLU the same with
    alpha in place of 0.
    """
    neg = 0.0 if activation == "relu" else float(alpha)
    lo_s, hi_s = min(neg, 1.0), max(neg, 1.0)
    dl = np.where(l >= 0.0, 1.0, np.where(u <= 0.0, neg, lo_s))
    du = np.where(l >= 0.0, 1.0, np.where(u <= 0.0, neg, hi_s))
    return dl, du


def center_margins(weights, biases, activation: str, alpha, C: np.ndarray,
                   x0: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Margins ``C @ f(x0)`` (r,) and a rigorous lower bound of them (r,).

    The forward pass's rounding error is bounded by propagating, with the activation's
    Lipschitz constant ``Lphi``, err_z = |W| err_a + FP_RTOL (|W| |a| + |b|) and
    err_a = Lphi err_z + FP_RTOL |a|; the margins are lowered by |C W_m| err_a plus the
    allowance of their own terms.
    """
    lphi = lipschitz_constant(activation, alpha)
    lphi = 1.0 if lphi is None else lphi
    a = np.asarray(x0, dtype=np.float64)
    err = np.zeros_like(a)
    for W, b in zip(weights[:-1], biases[:-1]):
        aW = np.abs(W)
        z = W @ a + b
        err_z = aW @ err + FP_RTOL * (aW @ np.abs(a) + np.abs(b)) + FP_ATOL
        a = apply_activation(activation, z, alpha)
        err = lphi * err_z + FP_RTOL * np.abs(a) + FP_ATOL
    R = C @ weights[-1]
    g = R @ a + C @ biases[-1]
    aR = np.abs(R)
    mag = aR @ np.abs(a) + np.abs(C) @ np.abs(biases[-1]) + (np.abs(C) @ np.abs(weights[-1])) @ np.abs(a)
    low = g - (aR @ err) * (1.0 + FP_RTOL) - FP_RTOL * (mag + np.abs(g)) - FP_ATOL
    return g, low


