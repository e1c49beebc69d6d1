"""Stable neurons proven from float32 evaluations, so the float64 verification can skip them.

The mixed-precision search evaluates CROWN in float32 at several radii, then verifies its
answer eps_v in float64. For ReLU-like activations a stable neuron's relaxation does not depend
on its bounds, so the verification only needs the bounds of the neurons that are not stable.
Float32 bounds are not rigorous as computed; they become rigorous here, layer by layer:

* A float32 evaluation G at radius eps_G >= eps_v computed hidden layer k's bounds from
  relaxations of layers < k built from its own (float32) bounds. Those relaxations are valid on
  the eps_v ball when, for each neuron, the rigorous float64 bounds B_i already established at
  eps_v agree: a neuron G treated as stable is stable in B_i on the same side, and a neuron G
  relaxed as unstable on [l_G, u_G] has B_i inside [l_G, u_G] (a ReLU chord valid on an
  interval is valid on every sub-interval; the lower lines are valid everywhere).
* Then G's bounds of layer k hold on the eps_v ball (a subset of the eps_G ball) up to the
  float32 rounding of G's products, bounded by :func:`float32_allowance`.
* A neuron whose widened float32 interval is stable is stable on the eps_v ball.

Arrays in, arrays out.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from .activations import apply_activation
from .crown import Network, _widen

U32 = 2.0 ** -24  # unit roundoff of float32

Bounds = List[Tuple[np.ndarray, np.ndarray]]


def float32_allowance(net: Network, x0: np.ndarray, eps: float, k: int, rigorous: Bounds,
                      act_max: Sequence[np.ndarray], slopes: Sequence[np.ndarray]) -> np.ndarray:
    """Bound on |float32 result - exact result| for hidden layer k's bounds, per neuron.

    The float32 computation back-substitutes the rows of W_k through layers k-1 .. 0 with
    relaxation slopes whose magnitudes are at most ``slopes[i]`` (per neuron of layer i). Over
    the eps ball, ``rigorous[i]`` bounds z_i and ``act_max[i]`` bounds |act(z_i)|; |x_j| <=
    |x0_j| + eps for every l_p ball. At the step through layer i three things round: the scaled
    row D = Lam * slope (|dD| <= 2u|D|, times |z_i - b_i| <= Z_i + |b_i|), the weights W_i
    (u|W_i|) and the product D @ W_i (gamma_n |D| |W_i|), both times |a_{i-1}|; and W_k itself at
    the start (u |W_k| |a_{k-1}|). With |D_i| <= c^k |W_k| S_{k-1} |W_{k-1}| ... |W_{i+1}| S_i
    (S = slope magnitudes, c = 1 + gamma + 3u for the growth of the computed matrices), the sum
    over steps is a Horner chain of float64 matrix-vector products:

        v = S_0 w_0;  v = S_i (w_i + |W_i| v) for i = 1 .. k-1;  E = c^k |W_k| v + u |W_k| A_{k-1}

    with w_i = 2u (Z_i + |b_i|) + (gamma + 2u) |W_i| A_{i-1}, A_{-1} = |x0| + eps. Scaled by
    1 + 1e-6 (plus 1e-30) for the float64 rounding of this computation itself. A worst-case
    bound, orders of magnitude above the errors seen in practice: it proves neurons stable,
    it never tightens a bound.
    """
    n = max(w.shape[0] for w in net.W) + 2
    gamma = n * U32 / (1.0 - n * U32)
    a_prev = np.abs(x0) + eps
    v = None
    for i in range(k):
        l, u = rigorous[i]
        # a zero slope multiplies nothing, not even the unbounded z (l = -inf) of an inactive
        # neuron whose lower bound was never computed
        z = np.where(slopes[i] > 0.0, np.maximum(np.abs(l), np.abs(u)), 0.0)
        w = 2.0 * U32 * (z + np.abs(net.b[i])) + (gamma + 2.0 * U32) * (net.abs_weights(i) @ a_prev)
        v = slopes[i] * (w if v is None else w + net.abs_weights(i) @ v)
        a_prev = act_max[i]
    c = (1.0 + gamma + 3.0 * U32) ** k
    e = c * (net.abs_weights(k) @ v) + U32 * (net.abs_weights(k) @ a_prev)
    return e * (1.0 + 1e-6) + 1e-30


def relaxation_valid(lg: np.ndarray, ug: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> bool:
    """Is a ReLU-like relaxation built from [lg, ug] valid on the rigorous interval [lb, ub]?

    Stable in G (identity or the negative-side line) needs the same sign in [lb, ub];
    unstable in G (upper chord of [lg, ug]) needs [lb, ub] inside [lg, ug].
    """
    active, inactive = lg >= 0.0, ug <= 0.0
    ok = np.where(active, lb >= 0.0, np.where(inactive, ub <= 0.0, (lb >= lg) & (ub <= ug)))
    return bool(np.all(ok))


class StableFromFloat32:
    """``known(k, rigorous)`` for :func:`crown_cli.crown.hidden_layer_bounds` at radius eps,
    for the activations of :data:`crown_cli.relaxations.SIGN_STABLE` (ReLU, leaky ReLU).

    ``evaluations`` lists the float32 evaluations (eps_G, bounds_G, fresh_G): every hidden
    layer's (l, u) as that evaluation used them and, per layer, the mask of rows it computed
    itself (the others it took from a larger ball). Only evaluations with eps_G >= eps count.
    """

    def __init__(self, net: Network, x0: np.ndarray, eps: float, evaluations, relax_fn: Callable,
                 interval_free: Callable, activation: str, alpha=None):
        self.net, self.x0, self.eps = net, x0, eps
        self.relax_fn, self.interval_free = relax_fn, interval_free
        self.activation, self.alpha = activation, alpha
        self.evals = sorted((e for e in evaluations if e[0] >= eps), key=lambda e: e[0])
        self.valid_below = [None] * len(self.evals)  # layers < this have valid relaxations
        self.slopes = [dict() for _ in self.evals]
        self.act_max: List[np.ndarray] = []
        self.skipped = 0

    def _slope(self, g: int, i: int) -> np.ndarray:
        if i not in self.slopes[g]:
            aU, _, aL, _ = self.relax_fn(*self.evals[g][1][i])
            self.slopes[g][i] = np.maximum(np.abs(aU), np.abs(aL))
        return self.slopes[g][i]

    def __call__(self, k: int, rigorous: Bounds) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        while len(self.act_max) < k:  # |act(z_i)| on the rigorous intervals, layers < k
            l, u = rigorous[len(self.act_max)]
            self.act_max.append(np.maximum(np.abs(apply_activation(self.activation, l, self.alpha)),
                                           np.abs(apply_activation(self.activation, u, self.alpha)))
                                * (1.0 + 1e-6))
        n = self.net.W[k].shape[0]
        mask = np.zeros(n, bool)
        kl, ku = np.empty(n), np.empty(n)
        for g, (_, bounds, fresh) in enumerate(self.evals):
            if not (fresh[k] & ~mask).any():
                continue
            if self.valid_below[g] is None:
                self.valid_below[g] = 0
            while self.valid_below[g] < k and relaxation_valid(
                    *bounds[self.valid_below[g]], *rigorous[self.valid_below[g]]):
                self.valid_below[g] += 1
            if self.valid_below[g] < k:
                continue
            slack = float32_allowance(self.net, self.x0, self.eps, k, rigorous, self.act_max,
                                      [self._slope(g, i) for i in range(k)])
            lo, hi = bounds[k][0] - slack, bounds[k][1] + slack
            new = fresh[k] & ~mask & self.interval_free(lo, hi)
            mask |= new
            kl[new], ku[new] = lo[new], hi[new]
        self.skipped += int(mask.sum())
        return (mask, kl, ku) + self._hint(k, rigorous, int(mask.sum()))

    # a layer whose float32 bounds proved fewer than this fraction of its neurons stable: the
    # allowance has outgrown the intervals, later layers will prove nothing either
    HINT_BELOW = 0.1

    def _hint(self, k: int, rigorous: Bounds, proved: int) -> tuple:
        """() or a one-item tuple: the sign hint of :func:`crown_cli.crown._row_bounds`.

        ReLU only. The signs are those of the float32 evaluation at the smallest radius >= eps;
        the interval is interval arithmetic through W_k from the rigorous bounds of layer
        k-1. Given where later layers need no tight upper bound of an active neuron (nor lower
        of an inactive one): the last hidden layer, and layers where float32 proved (almost)
        nothing, so later layers will not use these bounds for proofs either.
        """
        n = self.net.W[k].shape[0]
        if (self.activation != "relu" or not self.evals
                or (k < self.net.num_hidden - 1 and proved >= self.HINT_BELOW * n)):
            return ()
        lg, ug = self.evals[0][1][k]
        sign = np.where(lg > 0.0, 1, np.where(ug < 0.0, -1, 0)).astype(np.int8)
        l, u = rigorous[k - 1]
        al, au = np.maximum(l, 0.0), np.maximum(u, 0.0)
        absW = self.net.abs_weights(k)
        center = self.net.W[k] @ (0.5 * (al + au)) + self.net.b[k]
        radius = absW @ (0.5 * (au - al))
        mag = absW @ au + np.abs(self.net.b[k])  # al, au >= 0
        return ((sign, _widen(center - radius, mag, -1.0), _widen(center + radius, mag, 1.0)),)
