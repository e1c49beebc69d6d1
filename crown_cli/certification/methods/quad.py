"""CROWN-Quad: quadratic lower bounds of ReLU for 2-layer networks (paper Sec. 3.3, App. D).

The bound
---------
The network is ``f(x) = W2 relu(W1 x + b1) + b2``; the margins are the rows of ``C f(x)``:
``m_j(x) = sum_i Lam_ji relu(z_i) + cst_j`` with ``Lam = C W2``, ``cst = C b2`` and the
pre-activations ``z = W1 x + b1``. Over the l_p ball ``||x - x0||_p <= eps`` each ``z_i`` lies
in ``[l_i, u_i] = W1_i x0 + b1_i -/+ eps ||W1_i||_q`` (exact for one hidden layer; widened for
rounding as in :mod:`crown_cli.engine.dense_crown`).

For row j every term ``Lam_ji relu(z_i)`` is bounded from below on ``[l_i, u_i]`` by a
scalar function ``phi_ji(z) = a_ji z^2 + b_ji z + c_ji``:

- stable neurons (``l >= 0`` or ``u <= 0``): the term itself (linear);
- unstable, ``Lam_ji < 0``: ``Lam_ji`` times the chord through ``(l, 0)`` and ``(u, u)``,
  an upper bound of relu (the paper's ``eta_U = 0`` on negative weights);
- unstable, ``Lam_ji >= 0``: ``Lam_ji`` times a lower bound of relu, either the CROWN-Ada
  line (``z`` if ``u >= -l`` else ``0``) or the quadratic ``h(z) = z (z - l) / (u - l)``, the
  convex parabola through ``(l, 0)``, ``(0, 0)`` and ``(u, u)`` (``eta_L = 1/(u - l) > 0``).
  ``h <= relu`` on ``[l, u]``: on ``[l, 0]`` and on ``[0, u]`` the difference ``h - relu``
  is convex and vanishes at both ends. Of the convex quadratics through ``(0, 0)`` below relu
  on ``[l, u]``, ``h`` has the largest curvature, and the area between it and relu is
  ``(l^2 - |l| u + u^2) / 6``, less than the CROWN-Ada line's ``min(l^2, u^2) / 2`` exactly
  when ``|l| < u < 2 |l|``. ``quad="adaptive"`` (default) takes the parabola there and the
  line elsewhere, as CROWN-Ada picks its line by area; ``quad="all"`` takes it everywhere.

Summing gives the paper's ``f^L_j(x) = x^T Q_j x + 2 p_j^T x + s_j`` with
``Q_j = W1^T diag(a_j) W1``. All ``a_ji >= 0`` by construction, so ``Q_j`` is positive
semidefinite and minimising ``f^L_j`` over the ball is a convex QP (the paper's indefinite
case never arises here; soundness below does not even rely on convexity, only tightness does).
It is solved by projected gradient descent with Armijo backtracking along the projection arc
(l_inf: clip, l_2: rescale, l_1: Duchi et al.'s sorting projection).

Why the reported value is sound
-------------------------------
The objective value at PGD's iterate is an UPPER estimate of the QP's minimum (any feasible
point is), so reporting it (as the paper's published code does) would not be a certificate.
Instead we use convexity: every ``phi_ji`` lies above its tangent at any point ``zhat``, so

    min_ball f^L_j  >=  min_ball sum_i [phi_ji(zhat_i) + phi_ji'(zhat_i) (z_i(x) - zhat_i)]

and the right-hand side is a linear function of x minimised in closed form over the ball
(Cor. 3.3, dual norm). With ``zhat = W1 x_k + b1`` this is the Frank-Wolfe duality-gap bound
``f^L_j(x_k) - [grad^T (x_k - x0) + eps ||grad||_q]``, which tends to the QP's minimum as x_k
converges. We evaluate it per neuron, which makes it robust: the slopes
``s_ji = phi_ji'(zhat_i)`` are kept, and each intercept is recomputed as the tightest one for
which ``s z + w <= Lam_ji relu(z)`` on ``[l_i, u_i]`` (``w = min`` over z in {l, 0, u}, the
kinks of a piecewise-linear difference). That line is a valid relaxation whatever the slope,
so neither the iterate's feasibility nor the accuracy of the tangent matters, and its
intercept is at least the tangent's (``phi <= Lam relu``): the value is >= the Frank-Wolfe
bound. The PGD solution only *chooses* the slopes; the certificate is a linear relaxation
checked from scratch. Finally each row takes ``max(CROWN bound, quadratic bound)``, both
sound, so CROWN-Quad is never below CROWN at the same radius.

Floating point: intercepts and the final value are widened outward by ``FP_RTOL`` times the
sums of absolute values of the terms they come from, with ``|S| @ |W1|`` in place of
``|S @ W1|`` so that cancellation in the matrix product is covered, as in engine/dense_crown.py.

Cost: one bound is a CROWN pass plus, per row with a quadratic term, PGD iterations of two
``(r, n) x (n, d)`` products and a projection each (l_1: a sort of d values). For 784-20-10
that is tens of microseconds per iteration; iterations stop when the gap between the
objective and the certified value falls below ``qp_rtol`` of the objective's scale, or when
the objective is already below the CROWN bound (the quadratic bound cannot win then).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from crown_cli.engine.dense_crown import (Charges, Network, back_substitute, hidden_layer_bounds,
                                      product_rounding)
from crown_cli.engine.rounding import FP_ATOL, FP_RTOL
from crown_cli.engine.input_sets import NORMS, dual_norms
from crown_cli.errors import InputError
from crown_cli.engine.relaxations import get_relaxation

QUAD_CHOICES = ("adaptive", "all")
ARMIJO_SIGMA = 1e-4  # sufficient-decrease constant of the Armijo rule


def check_applicable(num_layers: int, activation: str) -> None:
    """InputError unless the network is 2-layer (one hidden layer) ReLU."""
    if num_layers != 2:
        raise InputError(f"--method: crown-quad supports only 2-layer ReLU networks "
                         f"(model has {num_layers} weight layers)")
    if activation != "relu":
        raise InputError(f"--method: crown-quad supports only 2-layer ReLU networks "
                         f"(model activation is {activation})")


# ---------------------------------------------------------------------------------------------
# projections onto the l_p ball (rows of D are offsets x - x0)
# ---------------------------------------------------------------------------------------------


def _project_l1(D: np.ndarray, eps: float) -> np.ndarray:
    """Euclidean projection of each row of D onto {||d||_1 <= eps} (sort and soft-threshold)."""
    A = np.abs(D)
    out = D.copy()
    over = A.sum(axis=1) > eps
    if not over.any():
        return out
    U = -np.sort(-A[over], axis=1)  # descending
    css = np.cumsum(U, axis=1) - eps
    k = np.arange(1, U.shape[1] + 1)
    rho = np.sum(U * k > css, axis=1)  # the condition holds exactly for the first rho entries
    theta = css[np.arange(U.shape[0]), rho - 1] / rho
    out[over] = np.sign(D[over]) * np.maximum(A[over] - theta[:, None], 0.0)
    return out


def project(D: np.ndarray, eps: float, norm: str) -> np.ndarray:
    """Rows of D (r, d) projected onto the l_p ball of radius eps around 0."""
    if norm == "inf":
        return np.clip(D, -eps, eps)
    if norm == "2":
        n = np.sqrt(np.einsum("ij,ij->i", D, D))
        return D * np.minimum(1.0, eps / np.maximum(n, 1e-300))[:, None]
    return _project_l1(D, eps)


def _dual(G: np.ndarray, norm: str) -> np.ndarray:
    """Row-wise dual norm ||g||_q of G (r, d), 1/p + 1/q = 1 (unverified; for steering only)."""
    if norm == "inf":
        return np.abs(G).sum(axis=1)
    if norm == "2":
        return np.sqrt(np.einsum("ij,ij->i", G, G))
    return np.abs(G).max(axis=1)


# ---------------------------------------------------------------------------------------------
# the quadratic relaxation and its certified value
# ---------------------------------------------------------------------------------------------


def quadratic_terms(Lam: np.ndarray, l: np.ndarray, u: np.ndarray, quad: str = "adaptive"):
    """Coefficients (a, b, c), each (r, n), of phi_ji(z) = a z^2 + b z + c <= Lam_ji relu(z).

    Valid on [l_i, u_i] (up to rounding; the certified value never relies on them, see
    :func:`linear_certificate`). ``a >= 0`` everywhere, so sum_i phi_ji(W1_i x + b1_i) is convex.
    """
    r, n = Lam.shape
    a = np.zeros((r, n))
    b = np.zeros((r, n))
    c = np.zeros((r, n))
    active = l >= 0.0
    unstable = (l < 0.0) & (u > 0.0)
    b[:, active] = Lam[:, active]
    width = np.where(unstable, u - l, 1.0)  # > 0 on unstable neurons
    chord = np.where(unstable, u / width, 0.0)
    pos = Lam >= 0.0
    neg = unstable[None, :] & ~pos
    b[neg] = (Lam * chord[None, :])[neg]
    c[neg] = (-Lam * (chord * l)[None, :])[neg]
    if quad == "all":
        use_quad = unstable
    else:  # the parabola's gap area is below the CROWN-Ada line's iff |l| < u < 2|l|
        use_quad = unstable & (u > -l) & (u < -2.0 * l)
    line_slope = np.where(unstable & (u >= -l) & ~use_quad, 1.0, 0.0)
    qpos = pos & use_quad[None, :]
    lpos = pos & (unstable & ~use_quad)[None, :]
    a[qpos] = (Lam / width[None, :])[qpos]  # h(z) = (z^2 - l z) / (u - l)
    b[qpos] = (-Lam * (l / width)[None, :])[qpos]
    b[lpos] = (Lam * line_slope[None, :])[lpos]
    return a, b, c


@dataclass(frozen=True, eq=False)
class FirstLayer:
    """The hidden layer ``z = W x + b`` of a 2-layer network, with ``W_abs`` = |W|."""

    W: np.ndarray
    W_abs: np.ndarray
    b: np.ndarray


@dataclass(frozen=True, eq=False)
class MarginRows:
    """Rows ``Lam relu(z) + cst`` over the hidden layer, with bounds ``Lam_mag``, ``cst_mag``
    of |Lam|, |cst| that have the rounding of their own computation in mind (e.g. |C| @ |W2|)."""

    Lam: np.ndarray
    Lam_mag: np.ndarray
    cst: np.ndarray
    cst_mag: np.ndarray


@dataclass(frozen=True, eq=False)
class Quadratic:
    """Per row j the convex objective ``q_j(x) = sum_i (a z_i^2 + b z_i + c)_ji + cst_j`` of
    the hidden layer's z (:func:`quadratic_terms`)."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    cst: np.ndarray


def linear_certificate(S, rows: MarginRows, layer: FirstLayer, l, u, x0, eps, qcode,
                       rtol=FP_RTOL):
    """Sound lower bound of ``Lam relu(W1 x + b1) + cst`` over the ball, one per row, given slopes.

    S (r, n) are arbitrary slopes; for each (j, i) the intercept is the tightest w with
    ``S_ji z + w <= Lam_ji relu(z)`` on [l_i, u_i] (checked at l, u and 0, the kinks of the
    piecewise-linear difference), widened down. The resulting linear function of x is
    minimised over the ball in closed form. ``rows``: Lam, cst and their magnitudes;
    ``layer``: W1, |W1|, b1. ``rtol``: the relative allowance (the network's ``fp_rtol``:
    FP_RTOL unless it is too large for it).
    """
    Lam, Lam_mag, cst, cst_mag = rows.Lam, rows.Lam_mag, rows.cst, rows.cst_mag
    W1, W1_abs, b1 = layer.W, layer.W_abs, layer.b
    rl, ru = np.maximum(l, 0.0), np.maximum(u, 0.0)
    w = np.minimum(Lam * rl - S * l, Lam * ru - S * u)
    straddle = (l <= 0.0) & (u >= 0.0)
    w = np.where(straddle[None, :], np.minimum(w, 0.0), w)
    zmax = np.maximum(np.abs(l), np.abs(u))
    w = w - (rtol * (Lam_mag + np.abs(S)) * zmax[None, :] + FP_ATOL)
    const = cst + S @ b1 + w.sum(axis=1)
    const_mag = cst_mag + np.abs(S) @ np.abs(b1) + np.abs(w).sum(axis=1)
    A = S @ W1
    A_abs = np.abs(S) @ W1_abs  # >= |A| entrywise, covers the product's rounding
    lin = A @ x0
    nrm = dual_norms(np.ascontiguousarray(A), qcode)
    mag = A_abs @ np.abs(x0) + eps * dual_norms(np.ascontiguousarray(A_abs), qcode) + const_mag
    lb = lin - eps * nrm + const - (rtol * mag + FP_ATOL)
    return np.where(np.isfinite(lb), lb, -np.inf)


def minimize_qp(q: Quadratic, layer: FirstLayer, x0, eps, norm, stop_below=None,
                qp_rtol=1e-4, max_iter=300):
    """Projected gradient descent with Armijo backtracking on the rows' convex objectives.

    Row j minimises ``q_j(x) = sum_i (a z_i^2 + b z_i + c)_ji + cst_j``, z = W1 x + b1 (of
    ``layer``), over the ball. Returns (S, upper, lower_est, iterations): the slopes
    ``2 a zhat + b`` at the iterate with the best Frank-Wolfe bound, the lowest objective seen
    (an upper estimate of the minimum), that Frank-Wolfe bound (an unverified estimate of a
    lower bound) and the iteration count. A row stops when objective - bound <= qp_rtol *
    scale, or when its objective drops below ``stop_below`` (then the quadratic bound cannot
    beat that value).
    """
    a, b, c, cst = q.a, q.b, q.c, q.cst
    W1, b1 = layer.W, layer.b
    r, d = a.shape[0], x0.shape[0]
    D = np.zeros((r, d))  # offsets x - x0
    z0 = W1 @ x0 + b1

    def objective(rows, Dr):
        Z = Dr @ W1.T + z0
        f = np.einsum("ij,ij->i", (a[rows] * Z + b[rows]), Z) + c[rows].sum(axis=1) + cst[rows]
        return f, Z

    # step 1 / L with L >= the Hessian's spectral norm 2 ||W1^T diag(a) W1||
    L = 2.0 * a @ np.einsum("ij,ij->i", W1, W1)
    linear = ~(L > 0.0)  # no quadratic term: the first Frank-Wolfe bound is the exact minimum
    step = 1.0 / np.where(linear, 1.0, L)
    all_rows = np.arange(r)
    f, Z = objective(all_rows, D)
    best_lb = np.full(r, -np.inf)
    S_best = b.copy()
    upper = f.copy()
    live = np.ones(r, dtype=bool)
    it = 0
    for it in range(1, max_iter + 1):
        rows = np.flatnonzero(live)
        if rows.size == 0:
            break
        S = 2.0 * a[rows] * Z[rows] + b[rows]
        G = S @ W1
        gap = np.einsum("ij,ij->i", G, D[rows]) + eps * _dual(G, norm)
        lb = f[rows] - gap
        better = lb > best_lb[rows]
        best_lb[rows[better]] = lb[better]
        S_best[rows[better]] = S[better]
        scale = np.abs(f[rows]) + eps * _dual(G, norm) + 1e-300
        done = (f[rows] - best_lb[rows] <= qp_rtol * scale) | linear[rows]
        if stop_below is not None:
            done |= f[rows] < stop_below[rows]
        live[rows[done]] = False
        rows, G = rows[~done], G[~done]
        # Armijo backtracking along the projection arc, per row
        pending = np.ones(rows.size, dtype=bool)
        for _ in range(60):
            if not pending.any():
                break
            pr = rows[pending]
            t = step[pr][:, None]
            Dn = project(D[pr] - t * G[pending], eps, norm)
            fn, Zn = objective(pr, Dn)
            ok = fn <= f[pr] + ARMIJO_SIGMA * np.einsum("ij,ij->i", G[pending], Dn - D[pr])
            acc = pr[ok]
            D[acc], f[acc], Z[acc] = Dn[ok], fn[ok], Zn[ok]
            step[acc] *= 2.0  # let the step grow again next iteration
            step[pr[~ok]] *= 0.5
            idx = np.flatnonzero(pending)
            pending[idx[ok]] = False
        if pending.any():  # no decrease found at any step: converged to rounding
            live[rows[pending]] = False
        upper = np.minimum(upper, f)
    return S_best, upper, best_lb, it


class QuadBound:
    """CROWN-Quad lower bounds for one 2-layer ReLU network under one norm."""

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray], norm: str,
                 quad: str = "adaptive", qp_rtol: float = 1e-4, max_iter: int = 300):
        check_applicable(len(weights), "relu")
        if norm not in NORMS:
            raise ValueError(f"unknown norm {norm!r}")
        if quad not in QUAD_CHOICES:
            raise ValueError(f"unknown quadratic choice {quad!r}")
        self.net = Network(weights, biases)
        self.norm = norm
        self.qcode = NORMS[norm]
        self.quad = quad
        self.qp_rtol = qp_rtol
        self.max_iter = max_iter
        self.relax_fn = get_relaxation("relu", "crown")
        self.layer = FirstLayer(self.net.W[0], np.abs(self.net.W[0]), self.net.b[0])
        self.last_info = {}

    def lower_bound(self, x0: np.ndarray, eps: float, C: np.ndarray, first=None) -> np.ndarray:
        """Sound lower bounds of ``C @ f(x)`` over the eps-ball around x0, shape (r,)."""
        net = self.net
        x0 = np.ascontiguousarray(x0, dtype=np.float64)
        C = np.atleast_2d(np.asarray(C, dtype=np.float64))
        bounds, relax = hidden_layer_bounds(net, x0, eps, self.qcode, self.relax_fn, first)
        l, u = bounds[0]
        Lam = C @ net.W[1]
        cst = C @ net.b[1]
        crown, _ = back_substitute(net, relax, Lam, cst, x0, eps, self.qcode, want_upper=False,
                                   charges=Charges(lam_err=product_rounding(net, C, relax, x0,
                                                                            eps, self.qcode)))
        a, b, c = quadratic_terms(Lam, l, u, self.quad)
        rows = np.flatnonzero((a > 0.0).any(axis=1))
        out = crown.copy()
        info = {"crown": crown, "quad": np.full(C.shape[0], -np.inf), "iterations": 0,
                "qp_upper": np.full(C.shape[0], np.nan)}
        if rows.size:
            S, upper, _, it = minimize_qp(Quadratic(a[rows], b[rows], c[rows], cst[rows]),
                                          self.layer, x0, eps, self.norm,
                                          stop_below=crown[rows], qp_rtol=self.qp_rtol,
                                          max_iter=self.max_iter)
            q = linear_certificate(S, MarginRows(Lam[rows], np.abs(C[rows]) @ np.abs(net.W[1]),
                                                 cst[rows], np.abs(C[rows]) @ np.abs(net.b[1])),
                                   self.layer, l, u, x0, eps, self.qcode, net.fp_rtol)
            out[rows] = np.maximum(crown[rows], q)
            info["quad"][rows] = q
            info["qp_upper"][rows] = upper
            info["iterations"] = it
        self.last_info = info
        return out


def crown_quad_lower_bound(weights, biases, x0, eps, norm, C, quad: str = "adaptive",
                           qp_rtol: float = 1e-4, max_iter: int = 300) -> np.ndarray:
    """Lower bounds (r,) of ``C @ f(x)`` over ``||x - x0||_p <= eps``, norm in {"inf", "2", "1"}.

    ``weights``/``biases`` of a 2-layer ReLU network (W shape (out, in)); C (r, classes).
    Never below the CROWN bound; see the module docstring for why it is sound.
    """
    return QuadBound(weights, biases, norm, quad, qp_rtol, max_iter).lower_bound(
        np.asarray(x0, dtype=np.float64), float(eps), C)
