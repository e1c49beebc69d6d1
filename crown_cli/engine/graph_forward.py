"""Forward linear bounds: every node's value bounded by two linear functions of the input,
carried forward node by node (the forward mode of linear bound propagation). For a graph
with few inputs (a generator's latent vector, a controller's state) this gives every node's
interval at the cost of d + 1 columns per neuron, where back-substitution
(:meth:`~crown_cli.engine.graph_bounds.GraphBounds.node_bounds`) costs a row per neuron
through every node below it: ``GraphBounds(intermediate="forward")`` takes its
intermediate bounds from here, and the bounds of the output stay back-substitution's.

Node i holds ``L`` and ``U`` (n, d + 1): rows of coefficients of the input x and a constant
(the last column), with ``L x + c_L - e_L <= z_i <= U x + c_U + e_U`` for every x of the input
set, e_L, e_U >= 0 the rounding allowances so far (``eL``, ``eU``). Steps:

- an affine node ``y = W x + b``: ``L' = W+ L + W- U`` computed as ``W (L + U)/2 + |W| (L - U)/2``
  (the operation's ``linear`` and ``forward_abs``); every entry errs by at most
  gamma_{T+4} of ``|W| (|L| + |U|)`` (T the products per sum), charged against a bound on |x|
  (and 1 for the constant column); the inputs' allowances pass through ``|W|``;
- an activation: each neuron's line from its relaxation (the lines ``GraphBounds`` keeps),
  ``a L + b`` for a slope a >= 0 (``a U + b`` below 0), the product and the sum charged;
- a product x * y: the planes of :class:`~crown_cli.engine.node_rules.ProductRule`,
  ``a (x's L or U) + b (y's L or U) + ic``;
- an input: the identity.

A node's interval is the intersection of its own rule's and the linear functions' range over
the input set (:meth:`GraphBounds._concretise`, the same float64 allowances as a
back-substituted bound). Max pools have no forward rule: graphs with one take the
back-substituted bounds (:func:`supported`).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from crown_cli.engine.input_sets import input_abs_bound
from crown_cli.engine.rounding import TINY64, U64, gamma_n
from crown_cli.graph.ops import ActivationOp, Affine, InputOp, Product

# the largest input for which verify takes forward intermediate bounds (d + 1 columns)
FORWARD_MAX_INPUTS = 32


def supported(graph) -> bool:
    """Whether every node has a forward rule (inputs, affine nodes, activations, products)."""
    return all(isinstance(n.op, (InputOp, Affine, ActivationOp, Product)) for n in graph.nodes)


def prefer_forward(graph) -> bool:
    """The verifier's choice of intermediate bounds: forward ones for graphs of at most
    :data:`FORWARD_MAX_INPUTS` inputs whose nodes all have a forward rule."""
    return graph.input_size <= FORWARD_MAX_INPUTS and supported(graph)


class ForwardPass:
    """The linear functions of every node visited so far (:meth:`step`, in graph order)."""

    def __init__(self, gb):
        self.gb = gb
        self.d = gb.g.input_size
        # |x| bounded on the input set, and 1 for the constant column
        self.xabs = np.append(input_abs_bound(gb.x0, gb.eps, gb.qcode), 1.0)
        self.fn = {}

    def step(self, i, node) -> Tuple[np.ndarray, np.ndarray]:
        """Node i's linear functions (its inputs' stepped before), and their range over the
        input set: (lower, upper)."""
        op = node.op
        if isinstance(op, InputOp):
            A = np.zeros((op.size, self.d + 1))
            A[np.arange(op.size), op.offset + np.arange(op.size)] = 1.0
            z = np.zeros(op.size)
            self.fn[i] = (A, A, z, z)
        elif isinstance(op, Affine):
            self.fn[i] = self._affine(op, [self.fn[j] for j in node.inputs])
        elif isinstance(op, ActivationOp):
            self.fn[i] = self._activation(self.gb.lines[i], self.fn[node.inputs[0]])
        else:
            self.fn[i] = self._product(self.gb.planes[i], *[self.fn[j] for j in node.inputs])
        L, U, eL, eU = self.fn[i]
        c = np.ascontiguousarray
        lo = self.gb._concretise(c(L[:, :-1]), L[:, -1], np.abs(L[:, -1]), eL)
        hi = -self.gb._concretise(c(-U[:, :-1]), -U[:, -1], np.abs(U[:, -1]), eU)
        return lo, hi

    def _affine(self, op, ins):
        half = [((L + U) * 0.5).T for L, U, _, _ in ins]
        diff = [((L - U) * 0.5).T for L, U, _, _ in ins]
        mags = [(np.abs(L) + np.abs(U)).T for L, U, _, _ in ins]
        Wl, Wa = op.linear(half), op.forward_abs(diff)
        L, U = (Wl + Wa).T, (Wl - Wa).T
        b = getattr(op, "bias", None)
        if b is not None:
            L[:, -1] += b
            U[:, -1] += b
        T = max(int(getattr(op, "terms_fwd", 0) or 0), 1)
        e = gamma_n(T + 4, U64) * (op.forward_abs(mags).T @ self.xabs) + TINY64 * (T + 4)
        if b is not None:
            e = e + U64 * (np.abs(L[:, -1]) + np.abs(U[:, -1]))
        carried = op.forward_abs([(eL + eU)[None] for _, _, eL, eU in ins])[0]
        carried = carried * (1.0 + gamma_n(T + 2, U64))
        return L, U, e + carried, e + carried

    def _side(self, a, lower, upper, e_lo, e_up):
        """``a`` times the input's lower function where a >= 0, its upper one elsewhere, and
        the allowance that follows: the input's, scaled, plus the products' rounding."""
        pos = (a >= 0.0)[:, None]
        A = np.where(pos, a[:, None] * lower, a[:, None] * upper)
        e_in = np.where(a >= 0.0, e_lo, e_up)
        with np.errstate(invalid="ignore"):
            e = np.abs(a) * e_in * (1.0 + 2.0 * U64) + U64 * (np.abs(A) @ self.xabs)
        return A, np.where(np.isnan(e), np.inf, e)

    def _activation(self, ln, fin):
        L0, U0, eL0, eU0 = fin
        n = L0.shape[0]
        zero = np.zeros(n)
        bL = zero if ln.lower_icpt is None else np.broadcast_to(ln.lower_icpt, (n,))
        bU = zero if ln.upper_icpt is None else np.broadcast_to(ln.upper_icpt, (n,))
        aL, aU = np.broadcast_to(ln.lower, (n,)), np.broadcast_to(ln.upper, (n,))
        L, eL = self._side(aL, L0, U0, eL0, eU0)
        U, eU = self._side(aU, U0, L0, eU0, eL0)
        L[:, -1] += bL
        U[:, -1] += bU
        return L, U, eL + U64 * np.abs(L[:, -1]), eU + U64 * np.abs(U[:, -1])

    def _product(self, planes, fx, fy):
        a, b, icL, icU = planes
        Lx, Ux, eLx, eUx = fx
        Ly, Uy, eLy, eUy = fy
        A1, e1 = self._side(a, Lx, Ux, eLx, eUx)
        B1, f1 = self._side(b, Ly, Uy, eLy, eUy)
        A2, e2 = self._side(a, Ux, Lx, eUx, eLx)
        B2, f2 = self._side(b, Uy, Ly, eUy, eLy)
        L, U = A1 + B1, A2 + B2
        L[:, -1] += icL
        U[:, -1] += icU
        with np.errstate(invalid="ignore"):
            eL = e1 + f1 + 2.0 * U64 * (np.abs(L) @ self.xabs)
            eU = e2 + f2 + 2.0 * U64 * (np.abs(U) @ self.xabs)
        return L, U, np.where(np.isnan(eL), np.inf, eL), np.where(np.isnan(eU), np.inf, eU)
