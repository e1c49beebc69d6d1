"""Stable neurons proven from float32 evaluations, so the float64 verification can skip them.

The mixed-precision search evaluates CROWN in float32 at several radii, then verifies its
answer eps_v in float64. For ReLU-like activations a stable neuron's relaxation does not depend
on its bounds, so the verification only needs the bounds of the neurons that are not stable.
Float32 bounds are not rigorous as computed; they become rigorous here, layer by layer:

* A float32 evaluation G at radius eps_G >= eps_v computed hidden layer k's bounds from
  relaxations of layers < k built from its own (float32) bounds, and with them a bound E_G on
  their rounding (:func:`crown_cli.engine.rounding.rounding_weights`): [l_G - E_G, u_G + E_G] encloses
  z_k on a ball inside G's wherever those relaxations hold and every earlier layer's z stays
  in its widened interval [l_G - E_G, u_G + E_G] (the magnitudes G charged its rounding to).
* G's relaxations and those magnitudes hold on the eps_v ball when, for each neuron, the
  rigorous float64 bounds B_i already established at eps_v agree (:func:`relaxation_valid`):
  a neuron G treated as stable is stable in B_i on the same side and B_i stays inside G's
  widened interval (where its slope is not 0), and a neuron G relaxed as unstable on
  [l_G, u_G] has B_i inside [l_G, u_G] (a ReLU chord valid on an interval is valid on every
  sub-interval; the lower lines are valid everywhere).
* Then G's widened bounds of layer k hold on the eps_v ball (a subset of the eps_G ball), and
  a neuron whose widened interval is stable is stable on the eps_v ball.

The rounding bound is computed with the float32 evaluation from the matrices it actually
formed (|D| times a weight vector per step), so it grows with the bounds themselves, not with
products of |W| over the depth as an a-priori bound would. Arrays in, arrays out.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import numpy as np

from crown_cli.engine.dense_crown import Network
from crown_cli.engine.rounding import widen as _widen

Bounds = List[Tuple[np.ndarray, np.ndarray]]


def relaxation_valid(lg: np.ndarray, ug: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                     err: np.ndarray, slope: np.ndarray) -> bool:
    """Does a ReLU-like relaxation built from float32 bounds [lg, ug] (rounding bound ``err``)
    hold on the rigorous interval [lb, ub], with the magnitudes the float32 evaluation assumed?

    Stable in G (identity or the negative-side line) needs the same sign in [lb, ub] and |z|
    within G's widened interval: ub <= ug + err if active, lb >= lg - err if inactive (unless
    its slope is 0: then z multiplies nothing); unstable in G (upper chord of [lg, ug]) needs
    [lb, ub] inside [lg, ug].
    """
    active, inactive = lg >= 0.0, ug <= 0.0
    ok = np.where(active, (lb >= 0.0) & (ub <= ug + err),
                  np.where(inactive, (ub <= 0.0) & ((slope == 0.0) | (lb >= lg - err)),
                           (lb >= lg) & (ub <= ug)))
    return bool(np.all(ok))


class StableFromFloat32:
    """``known(k, rigorous)`` for :func:`crown_cli.engine.dense_crown.hidden_layer_bounds` at radius eps,
    for the activations of ``sign_stable`` activations (:mod:`crown_cli.activations`: ReLU, leaky ReLU).

    ``evaluations`` lists the float32 evaluations (eps_G, bounds_G, fresh_G, errors_G): every
    hidden layer's (l, u) as that evaluation used them, per layer the mask of rows it computed
    itself (the others it took from a larger ball) and the rounding bound of every neuron's
    bounds (``errors`` of :func:`crown_cli.engine.dense_crown.hidden_layer_bounds`). Only evaluations with
    eps_G >= eps count.
    """

    def __init__(self, net: Network, x0: np.ndarray, eps: float, evaluations, relax_fn: Callable,
                 interval_free: Callable, activation: str, alpha=None):
        self.net, self.x0, self.eps = net, x0, eps
        self.relax_fn, self.interval_free = relax_fn, interval_free
        self.activation, self.alpha = activation, alpha
        self.evals = sorted((e for e in evaluations if e[0] >= eps), key=lambda e: e[0])
        self.valid_below = [None] * len(self.evals)  # layers < this have valid relaxations
        self.skipped = 0
        self.proved = {}  # hidden layer -> neurons taken over from float32

    def _slope(self, g: int, i: int) -> np.ndarray:
        aU, _, aL, _ = self.relax_fn(*self.evals[g][1][i])
        return np.maximum(np.abs(aU), np.abs(aL))

    def __call__(self, k: int, rigorous: Bounds) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        n = self.net.W[k].shape[0]
        mask = np.zeros(n, bool)
        kl, ku = np.empty(n), np.empty(n)
        for g, (_, bounds, fresh, errors) in enumerate(self.evals):
            if not (fresh[k] & ~mask).any():
                continue
            if self.valid_below[g] is None:
                self.valid_below[g] = 0
            while self.valid_below[g] < k:
                i = self.valid_below[g]
                if not relaxation_valid(*bounds[i], *rigorous[i], errors[i], self._slope(g, i)):
                    break
                self.valid_below[g] += 1
            if self.valid_below[g] < k:
                continue
            lo, hi = bounds[k][0] - errors[k], bounds[k][1] + errors[k]
            new = fresh[k] & ~mask & self.interval_free(lo, hi)
            mask |= new
            kl[new], ku[new] = lo[new], hi[new]
        self.skipped += int(mask.sum())
        self.proved[k] = int(mask.sum())
        return (mask, kl, ku) + self._hint(k, rigorous, int(mask.sum()))

    # a layer whose float32 bounds proved fewer than this fraction of its neurons stable: the
    # rounding bounds have outgrown the intervals, later layers will prove little either
    HINT_BELOW = 0.1

    def _hint(self, k: int, rigorous: Bounds, proved: int) -> tuple:
        """() or a one-item tuple: the sign hint of :func:`crown_cli.engine.dense_crown._row_bounds`.

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
        rtol = self.net.fp_rtol  # one sum of at most n_{k-1} + 3 roundings per term
        return ((sign, _widen(center - radius, mag, -1.0, rtol), _widen(center + radius, mag, 1.0, rtol)),)
