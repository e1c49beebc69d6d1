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

from crown_cli.engine.batch_steps import Lines
from crown_cli.engine.deadline import check_deadline
from crown_cli.engine.input_sets import box_lower, input_abs_bound
from crown_cli.engine.rounding import TINY64, U64, gamma_n, sum_rtol
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


def _rows_op(f, Xs):
    """An affine operation's ``f`` (its ``linear`` or ``forward_abs``) on arrays Xs[j] of
    shape (..., k, size_j) (rows over the inputs): the result (..., k, size_out)."""
    lead = Xs[0].shape[:-1]
    out = f([X.reshape(-1, X.shape[-1]) for X in Xs])
    return out.reshape(*lead, out.shape[-1])


def _mv(M, v):
    """``M @ v`` on the last axis: M (..., s, k), v (..., k) -> (..., s)."""
    return np.matmul(M, v[..., None])[..., 0]


class ForwardPass:
    """The linear functions of every node visited so far (:meth:`step`, in graph order).
    Shapes: a node's functions (size, d + 1) on one input set; :class:`ForwardBoxes` runs
    the same steps with a leading axis of boxes, (n, size, d + 1)."""

    def __init__(self, gb):
        self.gb = gb
        self.d = gb.g.input_size
        # |x| bounded on the input set, and 1 for the constant column
        self.xabs = np.append(input_abs_bound(gb.x0, gb.eps, gb.qcode), 1.0)
        self.fn = {}

    def step(self, i, node) -> Tuple[np.ndarray, np.ndarray]:
        """Node i's linear functions (its inputs' stepped before), and their range over the
        input set: (lower, upper)."""
        self.fn[i] = self.functions(i, node)
        L, U, eL, eU = self.fn[i]
        c = np.ascontiguousarray
        lo = self.gb._concretise(c(L[:, :-1]), L[:, -1], np.abs(L[:, -1]), eL)
        hi = -self.gb._concretise(c(-U[:, :-1]), -U[:, -1], np.abs(U[:, -1]), eU)
        return lo, hi

    def functions(self, i, node):
        """Node i's (L, U, eL, eU) from its inputs' (:meth:`step` before) and the node's
        lines or planes (``gb.lines``, ``gb.planes``)."""
        op = node.op
        if isinstance(op, InputOp):
            A = np.zeros(self.xabs.shape[:-1] + (op.size, self.d + 1))
            A[..., np.arange(op.size), op.offset + np.arange(op.size)] = 1.0
            z = np.zeros(A.shape[:-1])
            return A, A, z, z
        if isinstance(op, Affine):
            return self._affine(op, [self.fn[j] for j in node.inputs])
        if isinstance(op, ActivationOp):
            return self._activation(self.gb.lines[i], self.fn[node.inputs[0]])
        return self._product(self.gb.planes[i], *[self.fn[j] for j in node.inputs])

    def _affine(self, op, ins):
        half = [np.swapaxes((L + U) * 0.5, -1, -2) for L, U, _, _ in ins]
        diff = [np.swapaxes((L - U) * 0.5, -1, -2) for L, U, _, _ in ins]
        mags = [np.swapaxes(np.abs(L) + np.abs(U), -1, -2) for L, U, _, _ in ins]
        Wl, Wa = _rows_op(op.linear, half), _rows_op(op.forward_abs, diff)
        L, U = np.swapaxes(Wl + Wa, -1, -2), np.swapaxes(Wl - Wa, -1, -2)
        L, U = np.ascontiguousarray(L), np.ascontiguousarray(U)
        b = getattr(op, "bias", None)
        if b is not None:
            L[..., -1] += b
            U[..., -1] += b
        T = max(int(getattr(op, "terms_fwd", 0) or 0), 1)
        e = gamma_n(T + 4, U64) * _mv(np.swapaxes(_rows_op(op.forward_abs, mags), -1, -2),
                                     self.xabs) + TINY64 * (T + 4)
        if b is not None:
            e = e + U64 * (np.abs(L[..., -1]) + np.abs(U[..., -1]))
        carried = _rows_op(op.forward_abs, [(eL + eU)[..., None, :] for _, _, eL, eU in ins])
        carried = carried[..., 0, :] * (1.0 + gamma_n(T + 2, U64))
        return L, U, e + carried, e + carried

    def _side(self, a, lower, upper, e_lo, e_up):
        """``a`` times the input's lower function where a >= 0, its upper one elsewhere, and
        the allowance that follows: the input's, scaled, plus the products' rounding."""
        pos = (a >= 0.0)[..., None]
        A = np.where(pos, a[..., None] * lower, a[..., None] * upper)
        e_in = np.where(a >= 0.0, e_lo, e_up)
        with np.errstate(invalid="ignore"):
            e = np.abs(a) * e_in * (1.0 + 2.0 * U64) + U64 * _mv(np.abs(A), self.xabs)
        return A, np.where(np.isnan(e), np.inf, e)

    def _activation(self, ln, fin):
        L0, U0, eL0, eU0 = fin
        shape = L0.shape[:-1]
        zero = np.zeros(shape)
        bL = zero if ln.lower_icpt is None else np.broadcast_to(ln.lower_icpt, shape)
        bU = zero if ln.upper_icpt is None else np.broadcast_to(ln.upper_icpt, shape)
        aL, aU = np.broadcast_to(ln.lower, shape), np.broadcast_to(ln.upper, shape)
        L, eL = self._side(aL, L0, U0, eL0, eU0)
        U, eU = self._side(aU, U0, L0, eU0, eL0)
        L[..., -1] += bL
        U[..., -1] += bU
        return L, U, eL + U64 * np.abs(L[..., -1]), eU + U64 * np.abs(U[..., -1])

    def _product(self, planes, fx, fy):
        a, b, icL, icU = planes
        Lx, Ux, eLx, eUx = fx
        Ly, Uy, eLy, eUy = fy
        A1, e1 = self._side(a, Lx, Ux, eLx, eUx)
        B1, f1 = self._side(b, Ly, Uy, eLy, eUy)
        A2, e2 = self._side(a, Ux, Lx, eUx, eLx)
        B2, f2 = self._side(b, Uy, Ly, eUy, eLy)
        L, U = A1 + B1, A2 + B2
        L[..., -1] += icL
        U[..., -1] += icU
        with np.errstate(invalid="ignore"):
            eL = e1 + f1 + 2.0 * U64 * _mv(np.abs(L), self.xabs)
            eU = e2 + f2 + 2.0 * U64 * _mv(np.abs(U), self.xabs)
        return L, U, np.where(np.isnan(eL), np.inf, eL), np.where(np.isnan(eU), np.inf, eU)


class ForwardBoxes(ForwardPass):
    """Forward linear bounds of a graph on many boxes at once (input splitting on graphs
    with few inputs): every node's functions with a leading axis of boxes, (n, size, d + 1),
    the same steps and allowances as :class:`ForwardPass` on one box. Every node's interval
    is its functions' range over its box (:func:`~crown_cli.engine.input_sets.box_lower`),
    intersected with its rule's interval on its inputs' (the relaxation's lines and planes
    come from those intervals), as on one box; :meth:`lower` bounds rows of the output by
    back-substitution, as :meth:`~crown_cli.engine.graph_bounds.GraphBounds.lower` on one
    box (``GraphBounds(intermediate="forward")``).
    Only graphs :func:`supported` (no max pools). ``deadline``: checked at every node, in
    :meth:`lower` too."""

    def __init__(self, graph, lo, hi, method: str = "crown", deadline=None):
        from crown_cli.engine.input_sets import centre_radius
        from crown_cli.engine.node_rules import (activation_interval, affine_interval,
                                                 product_planes)

        if not supported(graph):
            raise ValueError("ForwardBoxes: the graph has nodes without a forward rule")
        self.g, self.d, self.deadline = graph, graph.input_size, deadline
        self.L = np.ascontiguousarray(lo, dtype=np.float64)
        self.H = np.ascontiguousarray(hi, dtype=np.float64)
        self.c, self.r = centre_radius(self.L, self.H)
        self.rtol = sum_rtol(graph)
        n = self.L.shape[0]
        self.xabs = np.concatenate([np.abs(self.c) + self.r, np.ones((n, 1))], axis=1)
        self.fn, self.lines, self.planes, self.lo, self.hi, self.absval = {}, {}, {}, {}, {}, {}
        self.gb = self  # ForwardPass reads lines and planes from here
        last = [max(c, default=-1) for c in graph.consumers]
        for i, node in enumerate(graph.nodes):
            check_deadline(deadline)
            op = node.op
            rule = None
            with np.errstate(invalid="ignore", over="ignore"):
                if isinstance(op, InputOp):
                    sl = slice(op.offset, op.offset + op.size)
                    rule = (self.L[:, sl], self.H[:, sl])
                elif isinstance(op, ActivationOp):
                    p = node.inputs[0]
                    (aU, bU, aL, bL), *rule = activation_interval(op, method, self.lo[p],
                                                                  self.hi[p], self.absval[p])
                    self.lines[i] = Lines(np.arange(node.size), aL, aU, bU, bL)
                elif isinstance(op, Affine):
                    rule = affine_interval(op, [self.lo[j] for j in node.inputs],
                                           [self.hi[j] for j in node.inputs])
                elif isinstance(op, Product):
                    p, q = node.inputs
                    self.planes[i], *rule = product_planes(self.lo[p], self.hi[p],
                                                           self.lo[q], self.hi[q])
                self.fn[i] = self.functions(i, node)
                L, U, eL, eU = self.fn[i]
                lo, hi = self._range(L, eL), -self._range(-U, eU)
            for j in node.inputs:  # functions no later node reads (the output's are kept)
                if last[j] == i and j != graph.output:
                    del self.fn[j]
            if rule is not None:
                lo, hi = np.fmax(lo, rule[0]), np.fmin(hi, rule[1])
            self.lo[i] = np.where(np.isnan(lo), -np.inf, lo)
            self.hi[i] = np.where(np.isnan(hi), np.inf, hi)
            self.absval[i] = np.maximum(np.abs(self.lo[i]), np.abs(self.hi[i]))

    @staticmethod
    def box_bytes(graph) -> int:
        """About the bytes one box takes while its functions are carried (every node's two
        function arrays, at most, and its intervals and lines)."""
        return 8 * sum(n.size for n in graph.nodes) * (2 * (graph.input_size + 1) + 8)

    def _range(self, F, e, sel=slice(None)):
        """The verified minimum of the functions F (n, k, d + 1), allowance e (n, k), over
        each one's box (boxes ``sel``)."""
        return box_lower(np.ascontiguousarray(F[..., :-1]), F[..., -1], np.abs(F[..., -1]),
                         e, self.c[sel], self.r[sel], self.rtol)

    def lower(self, C, sel=None):
        """Verified lower bounds of the rows ``C`` of the output over each box: C (r, out)
        for every box, or (len(sel), r, out) a box's own rows (boxes ``sel``, default all).
        Returns the bounds (boxes, r) and the rows' input coefficients (boxes, r, d)."""
        sel = np.arange(self.L.shape[0]) if sel is None else np.asarray(sel)
        Lx, const, mag, charge = self.terms(C, sel)
        with np.errstate(invalid="ignore", over="ignore"):
            low = box_lower(Lx, const, mag, charge, self.c[sel], self.r[sel], self.rtol)
        return np.where(np.isnan(low), -np.inf, low), Lx

    def terms(self, C, sel):
        """The rows ``C`` back-substituted to the input on the boxes ``sel`` (CROWN on the
        node intervals above, each box its own lines and planes): (rows over the input
        (boxes, r, d), constant, intercepts' magnitude, rounding charge (boxes, r)), the
        steps and charges of :meth:`~crown_cli.engine.graph_bounds.GraphBounds.lower`'s
        numpy path (:mod:`crown_cli.engine.node_rules`' ``back``) with a leading axis of
        boxes."""
        C = np.asarray(C, dtype=np.float64)
        R = np.ascontiguousarray(np.broadcast_to(C, (sel.size,) + C.shape[-2:]))
        walk = _BoxWalk(self, sel, R.shape[1])
        walk.pending[self.g.output] = R
        with np.errstate(invalid="ignore", over="ignore"):
            for i in range(self.g.output, -1, -1):
                R = walk.pending.pop(i, None)
                if R is not None:
                    check_deadline(self.deadline)
                    walk.step(i, self.g.nodes[i], R)
        return walk.Lx, walk.const, walk.mag, walk.charge


def _abs_dot_boxes(D, z):
    """``|D| @ z`` per box and row (D (boxes, r, size), z (boxes, size)) where z may hold
    +inf (a node without a bound): a 0 coefficient contributes 0 there, not nan."""
    inf = ~np.isfinite(z)
    out = _mv(np.abs(D), np.where(inf, 0.0, z))
    if inf.any():
        out = np.where(np.any((D != 0.0) & inf[:, None, :], axis=-1), np.inf, out)
    return out


class _BoxWalk:
    """:meth:`ForwardBoxes.lower`'s back-substitution state: rows pending per node
    (boxes, r, size), and per row the constant, the intercepts' magnitude and the rounding
    charge (boxes, r); each node kind's step as :mod:`crown_cli.engine.node_rules`' ``back``
    on one box."""

    def __init__(self, fb, sel, r):
        self.fb, self.sel = fb, sel
        n = sel.size
        self.Lx = np.zeros((n, r, fb.d))
        self.const, self.mag, self.charge = np.zeros((n, r)), np.zeros((n, r)), np.zeros((n, r))
        self.pending = {}

    def z(self, j):
        """Node j's magnitudes on the boxes (boxes, size)."""
        return self.fb.absval[j][self.sel]

    def give(self, j, P):
        """Rows P for node j, added to what it has (the sum's rounding charged)."""
        if j not in self.pending:
            self.pending[j] = P
            return
        S = self.pending[j] + P
        self.charge += 2.0 * U64 * _abs_dot_boxes(S, self.z(j))
        self.pending[j] = S

    def step(self, i, node, R):
        fb, op = self.fb, node.op
        n, r = R.shape[:2]
        if isinstance(op, InputOp):
            self.Lx[..., op.offset:op.offset + op.size] = R
        elif isinstance(op, Affine):
            if op.bias is not None:
                self.const += R @ op.bias
                self.mag += np.abs(R) @ np.abs(op.bias)
            T = op.terms
            if T:
                ins = [self.z(j) for j in node.inputs]
                absfwd = op.forward_abs(ins)  # (boxes, size)
                ain = sum(z.sum(axis=1) for z in ins)
                self.charge += gamma_n(T + 1, U64) * _abs_dot_boxes(R, absfwd) \
                    + TINY64 * T * ain[:, None]
            for j, P in zip(node.inputs, op.transpose(R.reshape(n * r, -1))):
                self.give(j, P.reshape(n, r, -1))
        elif isinstance(op, ActivationOp):
            p = node.inputs[0]
            ln = fb.lines[i]
            shape = fb.lo[i].shape
            aL, aU = (np.broadcast_to(v, shape)[self.sel][:, None] for v in (ln.lower, ln.upper))
            pos = R >= 0.0
            D = R * np.where(pos, aL, aU)
            icpt = np.zeros_like(R)
            for side, b in ((pos, ln.lower_icpt), (~pos, ln.upper_icpt)):
                if b is not None:
                    b = np.broadcast_to(b, shape)[self.sel][:, None]
                    icpt = np.where(side & (R != 0.0), R * b, icpt)
            self._charge_step(icpt, [(p, D)])
            self.give(p, D)
        else:  # a product of two data nodes (ProductRule's planes)
            p, q = node.inputs
            a, b, icL, icU = (v[self.sel][:, None] for v in fb.planes[i])
            icpt = np.where(R != 0.0, R * np.where(R >= 0.0, icL, icU), 0.0)
            D1, D2 = R * a, R * b
            self._charge_step(icpt, [(p, D1), (q, D2)])
            self.give(p, D1)
            self.give(q, D2)

    def _charge_step(self, icpt, steps):
        """An activation's or product's step: the intercepts' sum and magnitude, and each
        ``D = fl(L * slope)``'s rounding, 2u |D| @ z plus underflow (ActivationRule.charge)."""
        self.const += icpt.sum(axis=-1)
        self.mag += np.abs(icpt).sum(axis=-1)
        for j, D in steps:
            z = self.z(j)
            self.charge += 2.0 * U64 * _abs_dot_boxes(D, z) \
                + TINY64 * (z.sum(axis=1) + z.shape[1])[:, None]
