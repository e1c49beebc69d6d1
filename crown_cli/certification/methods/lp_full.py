"""LP-Full: per-neuron bounds and the margin bound from the LP relaxation solved exactly.

The paper's LP-Full column (after Wong and Kolter 2018): layer by layer, each hidden neuron's
lower and upper pre-activation bounds are the minimum and maximum of its pre-activation over
the LP in which every earlier ReLU is replaced by its triangle relaxation
(a >= 0, a >= z, a <= u (z - l) / (u - l) when l < 0 < u; a = z or a = 0 when stable), and the
input ranges over the l_inf box or the l_1 ball (x = x0 + p - n, p, n >= 0, sum(p + n) <= eps).
The final margin bound is the minimum of the margin over the same LP with all hidden layers.
The first layer's bounds are the closed form (the LP optimum) of the CROWN engine. Neurons
that CROWN already proves stable keep CROWN's bounds (their relaxation is exact whatever the
bounds, so the LP is the same); every other bound is intersected with CROWN's, which is valid
and can only tighten. In exact arithmetic LP-Full is at least CROWN's bound, since CROWN's
linear bounds are one feasible choice inside the triangle relaxation.

l_2 would need a second-order-cone solver; it is refused (``supports``).

Solving: scipy's HiGHS (``linprog(method="highs")``), one LP per bound; the constraint matrix of
a layer is built once and only the objective changes. Soundness does not rest on the solver's
tolerances: every bound is recomputed from the solver's dual multipliers lambda (clipped to
the valid sign) as the weak-duality bound
``lambda . b + sum_i min(r_i lo_i, r_i hi_i)`` with reduced costs r = c - A^T lambda over the
box of the (all bounded) variables, which is a valid lower bound for any lambda <= 0, and then
widened by the engine's allowance (2^-32 of its magnitude). Constraint data computed in
floating point are padded outward by the same allowance. An LP that fails falls back to
CROWN's bound. It is slow by nature (an LP with ~d variables per unstable neuron and radius
evaluation): use it on small networks. It always computes in float64 (``--precision`` is
ignored).
"""
from __future__ import annotations

import time
from typing import List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from crown_cli.engine.dense_crown import Network, hidden_layer_bounds, margin_lower_bound
from crown_cli.engine.rounding import FP_ATOL, FP_RTOL
from crown_cli.engine.input_sets import NORMS
from crown_cli.engine.deadline import check_deadline
from crown_cli.engine.relaxations import get_relaxation

NORMS_SUPPORTED = ("inf", "1")
# HiGHS' presolve costs more than it saves on these small dense LPs (about 2x slower here)
LP_OPTIONS = {"presolve": False}


class Polytope:
    """The LP relaxation of the first ``len(bounds)`` hidden layers over the l_p ball.

    Variables: the input offset (l_inf: delta in [-eps, eps]^d; l_1: p, n in [0, eps]^d with
    x = x0 + p - n), then the activations a_i of each hidden layer i (a_i in [0, max(u_i, 0)]).
    Constraints A y <= b (equalities of stable neurons as two padded rows).
    ``out`` holds the column indices of the last encoded layer's activations (or of the
    input offset if no layer is encoded).
    """

    def __init__(self, weights, biases, x0, eps: float, norm: str,
                 bounds: Sequence[Tuple[np.ndarray, np.ndarray]]):
        d = x0.size
        eps = float(eps)
        rows: List[sp.spmatrix] = []
        rhs: List[np.ndarray] = []
        if norm == "inf":
            ncols_in = d
            lo = [np.full(d, -eps)]
            hi = [np.full(d, eps)]
            P0 = weights[0]
        else:
            ncols_in = 2 * d
            lo = [np.zeros(2 * d)]
            hi = [np.full(2 * d, eps)]
            P0 = np.hstack([weights[0], -weights[0]])
        blocks_in = ncols_in
        col = blocks_in
        prev_cols = np.arange(blocks_in)
        prev_max = np.full(blocks_in, eps)
        layer_cols = []
        for i, (l, u) in enumerate(bounds):
            n = l.size
            cols = np.arange(col, col + n)
            col += n
            lo.append(np.zeros(n))
            hi.append(np.maximum(u, 0.0))
            layer_cols.append(cols)
            if i == 0:
                P = P0
                q = weights[0] @ x0 + biases[0]
                qmag = np.abs(weights[0]) @ np.abs(x0) + np.abs(biases[0])
            else:
                P = weights[i]
                q = biases[i].copy()
                qmag = np.abs(q)
            pmag = np.abs(P) @ prev_max
            rows_i, rhs_i = _layer_rows(P, q, qmag + pmag, l, u, prev_cols, cols)
            rows.extend(rows_i)
            rhs.extend(rhs_i)
            prev_cols, prev_max = cols, np.maximum(u, 0.0)
        self.nvar = col
        # assemble with the right number of columns
        mats = [sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], self.nvar))
                if m.shape[1] != self.nvar else m for m in (r.tocsr() for r in rows)]
        if norm == "1":
            mats.append(sp.csr_matrix((np.ones(ncols_in), (np.zeros(ncols_in, int),
                                       np.arange(ncols_in))), shape=(1, self.nvar)))
            rhs.append(np.array([eps]))
        self.A = sp.vstack(mats, format="csr") if mats else sp.csr_matrix((0, self.nvar))
        self.b = np.concatenate(rhs) if rhs else np.zeros(0)
        self.lo = np.concatenate(lo)
        self.hi = np.concatenate(hi)
        self.absA_T = abs(self.A).T.tocsr()
        self.vmax = np.maximum(np.abs(self.lo), np.abs(self.hi))
        self.out = prev_cols
        self.layer_cols = layer_cols
        self.ncols_in = ncols_in

    def minimize(self, v: np.ndarray, deadline: Optional[float] = None) -> Optional[float]:
        """A rigorous lower bound of min v . a_out over the polytope, or None on failure.

        Raises DeadlineExceeded past ``deadline`` (time.monotonic()); HiGHS is given the time
        left, and an LP it stops early counts as failed (no bound from it)."""
        check_deadline(deadline)
        c = np.zeros(self.nvar)
        c[self.out] = v
        bounds = np.column_stack([self.lo, self.hi])
        options = LP_OPTIONS if deadline is None else \
            dict(LP_OPTIONS, time_limit=max(deadline - time.monotonic(), 1e-3))
        try:
            res = linprog(c, A_ub=self.A if self.A.shape[0] else None,
                          b_ub=self.b if self.A.shape[0] else None, bounds=bounds,
                          method="highs", options=options)
        except ValueError:
            return None
        if res.status != 0 or res.get("ineqlin") is None:
            return None
        lam = np.minimum(np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0) \
            if self.A.shape[0] else np.zeros(0)
        return safe_dual_bound(c, self.A, self.absA_T, self.b, lam, self.lo, self.hi, self.vmax)


def safe_dual_bound(c, A, absA_T, b, lam, lo, hi, vmax) -> float:
    """Weak-duality lower bound of min c.y over {A y <= b, lo <= y <= hi} for multipliers lam <= 0,
    widened down by the floating-point allowance."""
    r = c - A.T @ lam if lam.size else c.copy()
    box = np.minimum(r * lo, r * hi)
    val = float(lam @ b) + float(box.sum()) if lam.size else float(box.sum())
    mag = (float(np.abs(lam) @ np.abs(b)) if lam.size else 0.0) + \
        float((np.abs(c) + (absA_T @ np.abs(lam) if lam.size else 0.0)) @ vmax)
    if not np.isfinite(val):
        return -np.inf
    return val - FP_RTOL * (mag + abs(val)) - FP_ATOL


def _layer_rows(P, q, mag, l, u, prev_cols, cols):
    """Constraint rows of one hidden ReLU layer z = P prev + q with bounds [l, u]."""
    pad = FP_RTOL * mag + FP_ATOL
    act = np.flatnonzero(l >= 0.0)
    unst = np.flatnonzero((l < 0.0) & (u > 0.0))
    rows, rhs = [], []

    def block(coef_prev, coef_self, idx):
        # rows: coef_prev * P[idx] on prev_cols, coef_self on cols[idx]
        m = idx.size
        Pp = sp.csr_matrix(P[idx] * coef_prev[:, None])
        Pp = sp.csr_matrix((Pp.data, prev_cols[Pp.indices], Pp.indptr),
                           shape=(m, int(max(prev_cols.max(), cols.max())) + 1))
        S = sp.csr_matrix((coef_self, (np.arange(m), cols[idx])), shape=Pp.shape)
        return Pp + S

    if act.size:  # a = z  ->  a - P prev <= q + pad  and  -a + P prev <= -q + pad
        one = np.ones(act.size)
        rows.append(block(-one, one, act))
        rhs.append(q[act] + pad[act])
        rows.append(block(one, -one, act))
        rhs.append(-q[act] + pad[act])
    if unst.size:
        one = np.ones(unst.size)
        # a >= z  ->  P prev - a <= -q
        rows.append(block(one, -one, unst))
        rhs.append(-q[unst] + pad[unst])
        # a <= s (z - l)  ->  a - s P prev <= s (q - l); s rounded up keeps the line above the
        # chord for z >= l
        lu, uu = l[unst], u[unst]
        s = (uu / (uu - lu)) * (1.0 + 4 * FP_RTOL)
        rows.append(block(-s, one, unst))
        rhs.append(s * (q[unst] - lu) + s * (pad[unst] + FP_RTOL * np.abs(lu)) + FP_ATOL)
    return rows, rhs


def lp_full_bounds(net: Network, x0, eps: float, norm: str, crown_relax=None, deadline=None):
    """Hidden-layer pre-activation bounds [(l_k, u_k)] from LP-Full at radius eps.

    Returns (bounds, lps_solved, lps_failed). Raises DeadlineExceeded past ``deadline``.
    """
    relax = get_relaxation("relu", "crown") if crown_relax is None else crown_relax
    crown_bounds, _ = hidden_layer_bounds(net, x0, float(eps), NORMS[norm], relax)
    bounds = crown_bounds[:1]  # (none without a hidden layer)
    solved = failed = 0
    for k in range(1, net.num_hidden):
        cl, cu = crown_bounds[k]
        l, u = cl.copy(), cu.copy()
        poly = Polytope(net.W, net.b, x0, eps, norm, bounds)
        Wk, bk = net.W[k], net.b[k]
        for j in np.flatnonzero((cl < 0.0) & (cu > 0.0)):
            for sign in (1.0, -1.0):
                v = poly.minimize(sign * Wk[j], deadline)
                solved += 1
                if v is None:
                    failed += 1
                    continue
                val = sign * v + bk[j]
                val += sign * (-FP_RTOL * (abs(val) + abs(bk[j])) - FP_ATOL)  # outward
                if sign > 0:
                    l[j] = max(l[j], val)
                else:
                    u[j] = min(u[j], val)
        bounds.append((l, u))
    return bounds, solved, failed


def lp_full_lower_bound(weights, biases, x0, eps, norm, C, net: Optional[Network] = None,
                        stats: Optional[dict] = None, deadline=None) -> np.ndarray:
    """Lower bounds (r,) of the margins C @ f(x) over the l_p ball (norm 'inf' or '1') by
    LP-Full. ``stats`` (a dict) accumulates the numbers of LPs solved and failed. Raises
    DeadlineExceeded once time.monotonic() passes ``deadline`` (None: no limit)."""
    if norm not in NORMS_SUPPORTED:
        raise ValueError(f"lp-full supports norms {NORMS_SUPPORTED}, not {norm!r}")
    net = Network(weights, biases) if net is None else net
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    C = np.atleast_2d(np.asarray(C, dtype=np.float64))
    relax = get_relaxation("relu", "crown")
    if net.num_hidden == 0:  # an affine network: CROWN's bound is already the exact minimum
        return margin_lower_bound(net, x0, float(eps), NORMS[norm], relax, C)
    bounds, solved, failed = lp_full_bounds(net, x0, eps, norm, relax, deadline)
    crown_lb = margin_lower_bound(net, x0, float(eps), NORMS[norm], relax, C)
    poly = Polytope(net.W, net.b, x0, eps, norm, bounds)
    R = C @ net.W[-1]
    const = C @ net.b[-1]
    cmag = np.abs(C) @ np.abs(net.b[-1])
    out = crown_lb.copy()
    for r in range(C.shape[0]):
        # the rounding of R = C @ W_m is absorbed by padding the objective's value below
        rmag = (np.abs(C[r]) @ np.abs(net.W[-1])) @ poly.vmax[poly.out]
        v = poly.minimize(R[r], deadline)
        solved += 1
        if v is None:
            failed += 1
            continue
        val = v + const[r]
        val -= FP_RTOL * (abs(val) + cmag[r] + rmag) + FP_ATOL
        out[r] = max(out[r], val)
    if stats is not None:
        stats["lps"] = stats.get("lps", 0) + solved
        stats["failed"] = stats.get("failed", 0) + failed
    return out
