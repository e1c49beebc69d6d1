"""Independent oracles for testing the CROWN engine: random networks, ball sampling, a PGD
attack and exact MILP solutions for ReLU networks.

Nothing here imports the bound engine (``crown_cli.engine.dense_crown`` / ``crown_cli.certification.certifier``): the
oracles must stay independent of the code they check. Conventions follow the engine:
``weights[k]`` has shape (outputs, inputs), ``biases[k]`` shape (outputs,), the activation is
applied after every layer but the last, inputs are float64 vectors of length d, and a
"margin" is ``f_c(x) - f_t(x)`` (positive while the prediction c beats the target t).
Radii (eps, delta) are in the units of the input, measured in the stated l_p norm. The balls
are never clipped to an input domain, matching the engine.

No tests live in this module.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

NORMS = ("inf", "2", "1")

# ---------------------------------------------------------------------------------------------
# networks
# ---------------------------------------------------------------------------------------------


def random_mlp(sizes: Sequence[int], seed: int, scale: float = 1.0, bias_scale: float = 0.1):
    """Random MLP with layer widths ``sizes`` = [d, h1, ..., classes].

    Returns (weights, biases): weights[k] of shape (sizes[k+1], sizes[k]) with entries
    ``scale * N(0, 1) / sqrt(sizes[k])`` (so pre-activations keep roughly the scale of the
    input), biases[k] of shape (sizes[k+1],) with entries ``bias_scale * N(0, 1)``. float64.
    """
    rng = np.random.default_rng(seed)
    weights, biases = [], []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        weights.append(scale * rng.standard_normal((n_out, n_in)) / np.sqrt(n_in))
        biases.append(bias_scale * rng.standard_normal(n_out))
    return weights, biases


_ACT = {
    # name -> (act(z), d act / dz as a function of z)
    "relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0.0).astype(np.float64)),
    "tanh": (np.tanh, lambda z: 1.0 - np.tanh(z) ** 2),
    "sigmoid": (lambda z: 0.5 * (1.0 + np.tanh(0.5 * z)),
                lambda z: 0.25 * (1.0 - np.tanh(0.5 * z) ** 2)),
    "arctan": (np.arctan, lambda z: 1.0 / (1.0 + z * z)),
    "linear": (lambda z: z, lambda z: np.ones_like(z)),
    # parametrised ones at crown_cli's defaults (leaky ReLU 0.2, ELU 1.0, hard sigmoid 0.2)
    "leaky_relu": (lambda z: np.where(z >= 0.0, z, 0.2 * z), lambda z: np.where(z >= 0.0, 1.0, 0.2)),
    "elu": (lambda z: np.where(z > 0.0, z, np.expm1(np.minimum(z, 0.0))),
            lambda z: np.where(z > 0.0, 1.0, np.exp(np.minimum(z, 0.0)))),
    "softplus": (lambda z: np.logaddexp(0.0, z), lambda z: 0.5 * (1.0 + np.tanh(0.5 * z))),
    "hard_sigmoid": (lambda z: np.clip(0.2 * z + 0.5, 0.0, 1.0),
                     lambda z: np.where(np.abs(z) < 2.5, 0.2, 0.0)),
}


def mlp_forward(weights, biases, activation: str, x: np.ndarray) -> np.ndarray:
    """Logits for x of shape (N, d) or (d,); returns (N, classes) or (classes,), float64."""
    act = _ACT[activation][0]
    a = np.asarray(x, dtype=np.float64)
    last = len(weights) - 1
    for k, (w, b) in enumerate(zip(weights, biases)):
        z = a @ np.asarray(w, dtype=np.float64).T + b
        a = z if k == last else act(z)
    return a


def margins(weights, biases, activation: str, x: np.ndarray, c: int, targets: Sequence[int]):
    """min over t in ``targets`` of f_c(x) - f_t(x), for x (N, d) -> (N,) or (d,) -> scalar."""
    f = mlp_forward(weights, biases, activation, x)
    t = np.asarray(list(targets), dtype=int)
    return np.min(f[..., [c]] - f[..., t], axis=-1)


def _margin_and_grad(weights, biases, activation, X, c, t):
    """Margins f_c - f_t at the rows of X (R, d) and their gradients w.r.t. x, (R,), (R, d)."""
    act, dact = _ACT[activation]
    zs = []
    a = X
    for w, b in zip(weights[:-1], biases[:-1]):
        z = a @ w.T + b
        zs.append(z)
        a = act(z)
    row = weights[-1][c] - weights[-1][t]  # the margin is linear in the last hidden layer
    m = a @ row + (biases[-1][c] - biases[-1][t])
    g = np.broadcast_to(row, a.shape).copy()
    # manual backprop: d m / d a_{k-1} = (g * act'(z_k)) @ W_k
    for k in range(len(zs) - 1, -1, -1):
        g = (g * dact(zs[k])) @ weights[k]
    return m, g


# ---------------------------------------------------------------------------------------------
# l_p balls
# ---------------------------------------------------------------------------------------------


def lp_norm(v: np.ndarray, norm: str) -> np.ndarray:
    """Row-wise l_p norm of v (..., d) for norm in {'inf', '2', '1'}."""
    if norm == "inf":
        return np.max(np.abs(v), axis=-1)
    if norm == "2":
        return np.sqrt(np.sum(v * v, axis=-1))
    if norm == "1":
        return np.sum(np.abs(v), axis=-1)
    raise ValueError(f"unknown norm {norm!r}")


def project_l1(V: np.ndarray, radius: float) -> np.ndarray:
    """Euclidean projection of every row of V (R, d) onto the l1 ball {||w||_1 <= radius}.

    Sorting algorithm of Duchi, Shalev-Shwartz, Singer and Chandra (ICML 2008), Fig. 1:
    project |v| onto the simplex of size ``radius`` by soft-thresholding with the threshold
    theta = (sum of the rho largest |v_i| - radius) / rho, where rho is the largest index
    whose sorted value still exceeds the running threshold; restore the signs.
    """
    V = np.atleast_2d(np.asarray(V, dtype=np.float64))
    out = V.copy()
    absV = np.abs(V)
    inside = absV.sum(axis=1) <= radius
    if np.all(inside):
        return out
    rows = np.flatnonzero(~inside)
    U = -np.sort(-absV[rows], axis=1)  # descending
    css = np.cumsum(U, axis=1)
    j = np.arange(1, U.shape[1] + 1)
    cond = U - (css - radius) / j > 0
    rho = U.shape[1] - np.argmax(cond[:, ::-1], axis=1)  # last index (1-based) where cond holds
    theta = (css[np.arange(rows.size), rho - 1] - radius) / rho
    W = np.sign(V[rows]) * np.maximum(absV[rows] - theta[:, None], 0.0)
    # guard against rounding pushing the result a few ulps outside the ball
    n1 = np.abs(W).sum(axis=1)
    W *= np.minimum(1.0, radius / np.maximum(n1, 1e-300))[:, None]
    out[rows] = W
    return out


def project_ball(X: np.ndarray, x0: np.ndarray, eps: float, norm: str) -> np.ndarray:
    """Project the rows of X (R, d) onto the l_p ball of radius eps around x0 (d,)."""
    D = X - x0
    if norm == "inf":
        D = np.clip(D, -eps, eps)
    elif norm == "2":
        n = lp_norm(D, "2")
        D = D * np.minimum(1.0, eps / np.maximum(n, 1e-300))[:, None]
    elif norm == "1":
        D = project_l1(D, eps)
    else:
        raise ValueError(f"unknown norm {norm!r}")
    return x0 + D


def sample_ball(x0: np.ndarray, eps: float, norm: str, n: int, rng: np.random.Generator):
    """About n points of the closed l_p ball of radius eps around x0 (d,); returns (m, d).

    Half are spread through the interior and the rest lie on the boundary, where the margin
    of a piecewise-linear network attains its minimum:
      inf: uniform in the box, then random corners x0 + eps * sign vector;
      2:   uniform in the ball (radius eps * U^(1/d)), then uniform on the sphere;
      1:   uniform in the ball (Dirichlet trick), uniform on the surface, and all 2d
           vertices x0 +/- eps e_i (these come on top of n).
    """
    x0 = np.asarray(x0, dtype=np.float64)
    d = x0.size
    n_in = n // 2
    n_bd = n - n_in
    if norm == "inf":
        inner = rng.uniform(-eps, eps, size=(n_in, d))
        bd = eps * rng.choice([-1.0, 1.0], size=(n_bd, d))
        D = np.vstack([inner, bd])
    elif norm == "2":
        G = rng.standard_normal((n, d))
        G /= np.linalg.norm(G, axis=1, keepdims=True)
        r = np.ones(n)
        r[:n_in] = rng.uniform(size=n_in) ** (1.0 / d)
        D = eps * G * r[:, None]
    elif norm == "1":
        # (E_1..E_d, E_{d+1}) i.i.d. exponential: E_{1..d} / sum(all) is uniform in the simplex,
        # dropping E_{d+1} from the sum puts the point on the simplex's outer face.
        E = rng.exponential(size=(n, d + 1))
        tot = E.sum(axis=1)
        tot[n_in:] -= E[n_in:, d]
        S = rng.choice([-1.0, 1.0], size=(n, d))
        D = eps * S * E[:, :d] / tot[:, None]
        V = eps * np.vstack([np.eye(d), -np.eye(d)])
        D = np.vstack([D, V])
    else:
        raise ValueError(f"unknown norm {norm!r}")
    return x0 + D


# ---------------------------------------------------------------------------------------------
# PGD attack
# ---------------------------------------------------------------------------------------------


def _ascent_direction(G: np.ndarray, norm: str) -> np.ndarray:
    """Steepest-ascent direction of unit l_p norm for gradients G (R, d) (rows)."""
    if norm == "inf":
        return np.sign(G)
    if norm == "2":
        return G / np.maximum(np.linalg.norm(G, axis=1, keepdims=True), 1e-300)
    # l1: the exact maximiser of <g, v> over the unit l1 ball is a single coordinate; moving a
    # few of the largest coordinates at once explores faster and still lands near vertices.
    k = max(1, int(np.ceil(0.02 * G.shape[1])))
    idx = np.argpartition(-np.abs(G), k - 1, axis=1)[:, :k]
    D = np.zeros_like(G)
    rows = np.arange(G.shape[0])[:, None]
    D[rows, idx] = np.sign(G[rows, idx]) / k
    return D


def pgd_attack(weights, biases, activation: str, x0: np.ndarray, c: int, t: int, eps: float,
               norm: str, steps: int = 100, restarts: int = 8,
               rng: Optional[np.random.Generator] = None,
               momentum: float = 0.75) -> Tuple[np.ndarray, float]:
    """Targeted PGD: maximise f_t - f_c over the l_p ball of radius eps around x0 (d,).

    All restarts run as one batch: restart 0 starts at x0, restart 1 at the point the
    linearisation at x0 says is worst (x0 + eps * steepest direction), the rest at random
    points of the ball. Steps follow the steepest-ascent direction of the norm applied to a
    momentum average of the gradients, with a cosine step-size schedule from eps/2 down to
    eps/200, each followed by projection onto the ball.
    Returns (x_best (d,), margin f_c(x_best) - f_t(x_best)), the lowest margin seen.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    weights = [np.asarray(w, dtype=np.float64) for w in weights]
    biases = [np.asarray(b, dtype=np.float64) for b in biases]
    x0 = np.asarray(x0, dtype=np.float64)
    restarts = max(1, restarts)
    X = np.repeat(x0[None, :], restarts, axis=0)
    m0, g0 = _margin_and_grad(weights, biases, activation, x0[None, :], c, t)
    if restarts > 1:
        X[1] = project_ball(x0 - eps * _ascent_direction(g0, norm), x0, eps, norm)[0]
    if restarts > 2:
        pts = sample_ball(x0, eps, norm, 2 * (restarts - 2), rng)
        X[2:] = pts[rng.choice(pts.shape[0], restarts - 2, replace=False)]
    best_x, best_m = x0.copy(), float(m0[0])
    V = np.zeros_like(X)
    for k in range(steps + 1):
        m, G = _margin_and_grad(weights, biases, activation, X, c, t)
        i = int(np.argmin(m))
        if m[i] < best_m:
            best_m, best_x = float(m[i]), X[i].copy()
        if k == steps:
            break
        # momentum on l1-normalised gradients (as in MI-FGSM): on piecewise-linear nets it
        # carries the iterate across region boundaries where the raw gradient flips; in our
        # trials it raised the share of flips found at 1.01 x the exact l_inf distortion from
        # about 60% to about 90%
        V = momentum * V + G / np.maximum(np.abs(G).sum(axis=1, keepdims=True), 1e-300)
        alpha = eps * (0.005 + 0.495 * 0.5 * (1.0 + np.cos(np.pi * k / steps)))
        X = project_ball(X - alpha * _ascent_direction(V, norm), x0, eps, norm)  # descend margin
    # report the margin exactly as the plain forward pass computes it at the returned point
    best_m = float(margins(weights, biases, activation, best_x, c, [t]))
    return best_x, best_m


def pgd_min_margin(weights, biases, activation, x0, c, targets, eps, norm, steps=100,
                   restarts=8, rng=None) -> Tuple[np.ndarray, float]:
    """Lowest min-over-targets margin PGD finds in the ball: attacks each target in turn."""
    best_x, best_m = None, np.inf
    for t in targets:
        x, _ = pgd_attack(weights, biases, activation, x0, c, t, eps, norm, steps, restarts, rng)
        m = float(margins(weights, biases, activation, x, c, targets))
        if m < best_m:
            best_x, best_m = x, m
    return best_x, best_m


def pgd_min_distortion(weights, biases, activation, x0, c, t, norm, eps_start=1e-3,
                       eps_max=100.0, steps=100, restarts=8, rng=None, rounds=12):
    """An upper bound on the minimum l_p distortion that makes f_t >= f_c, found by PGD.

    Doubles the radius until PGD flips the decision, then bisects between the last failure
    and success. Returns (radius, x) with ``||x - x0||_p <= radius`` and f_t(x) >= f_c(x),
    or (inf, None) if no flip is found up to ``eps_max``.
    """
    lo, hi, hx = 0.0, None, None
    e = eps_start
    while e <= eps_max:
        x, m = pgd_attack(weights, biases, activation, x0, c, t, e, norm, steps, restarts, rng)
        if m <= 0:
            hi, hx = e, x
            break
        lo, e = e, 2.0 * e
    if hi is None:
        return np.inf, None
    for _ in range(rounds):
        mid = 0.5 * (lo + hi)
        x, m = pgd_attack(weights, biases, activation, x0, c, t, mid, norm, steps, restarts, rng)
        if m <= 0:
            hi, hx = mid, x
        else:
            lo = mid
    return float(lp_norm(hx - x0, norm)), hx


# ---------------------------------------------------------------------------------------------
# exact MILP solutions for ReLU networks
# ---------------------------------------------------------------------------------------------

# HiGHS defaults stop at a 1e-4 relative gap; the oracle must be exact up to solver tolerances.
MIP_REL_GAP = 1e-9
# A point counts as adversarial if f_c - f_t <= FLIP_TOL: LP solutions land on f_c = f_t only
# up to rounding, and 1e-9 of margin is worth ~1e-10 of distortion on these networks.
FLIP_TOL = 1e-9
DISP = False  # set True to see the HiGHS logs while debugging


@dataclass
class MilpResult:
    """Outcome of an exact MILP query.

    value: the optimum. For :func:`exact_min_linf_distortion` the l_inf distortion
        ``max |x - x0|`` of the returned adversarial point; for :func:`exact_margin_min` the
        minimum of f_c - f_t over the ball (the margin of the returned point).
    x: (d,) an optimal input, or None if none was found.
    status: 'optimal', 'capped' (distortion: nothing flips within eps_hi, value = eps_hi is
        then only a lower bound), 'time-limit' (value is the best found, maybe not optimal),
        'stalled' (distortion: the refinement stopped making progress) or 'failed'.
    dual_bound: a proven bound on the optimum (the optimum is >= dual_bound), nan if none.
    eps_hi: radius of the ball the big-M constants were computed on (distortion problem:
        the largest distortion searched).
    margin_np: f_c(x) - f_t(x) recomputed with the numpy forward pass at x.
    solves: number of MILPs solved.
    message: the last solver message.
    """

    value: float
    x: Optional[np.ndarray]
    status: str
    dual_bound: float
    eps_hi: float
    margin_np: float
    solves: int
    message: str


def interval_bounds(weights, biases, x0, eps, norm="inf"):
    """Pre-activation bounds [(l_k, u_k)] of every hidden layer over the l_p ball (k = 0..).

    The first layer is exact for the norm (W x0 + b +/- eps * dual norm of each row); later
    layers use plain interval arithmetic, which is looser than CROWN but valid, and does not
    depend on the engine under test. Each (l_k, u_k) has shape (n_k,).
    """
    x0 = np.asarray(x0, dtype=np.float64)
    W0 = weights[0]
    dual = {"inf": lambda A: np.abs(A).sum(1), "2": lambda A: np.sqrt((A * A).sum(1)),
            "1": lambda A: np.abs(A).max(1)}[norm](W0)
    center = W0 @ x0 + biases[0]
    # widen by a relative hair so the big-M constants are never cut by rounding
    pad = 1e-9 * (np.abs(W0) @ np.abs(x0) + np.abs(biases[0]) + eps * dual) + 1e-12
    l, u = center - eps * dual - pad, center + eps * dual + pad
    out = [(l, u)]
    for W, b in zip(weights[1:-1], biases[1:-1]):
        out.append(_interval_step(W, b, l, u))
        l, u = out[-1]
    return out


def _interval_step(W, b, l, u):
    """Interval arithmetic for z = W relu(a) + b with a in [l, u]; returns padded (l', u')."""
    al, au = np.maximum(l, 0.0), np.maximum(u, 0.0)
    Wp, Wn = np.maximum(W, 0.0), np.minimum(W, 0.0)
    pad = 1e-9 * (np.abs(W) @ au + np.abs(b)) + 1e-12
    return Wp @ al + Wn @ au + b - pad, Wp @ au + Wn @ al + b + pad


class _Builder:
    """Variables with bounds and sparse constraint rows lb <= A v <= ub."""

    def __init__(self):
        self.nvar = 0
        self.lo: List[float] = []
        self.hi: List[float] = []
        self.integ: List[int] = []
        self.rows: List[Tuple[np.ndarray, np.ndarray, float, float]] = []

    def add_vars(self, lo, hi, integer=False):
        lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))
        hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))
        idx = np.arange(self.nvar, self.nvar + lo.size)
        self.nvar += lo.size
        self.lo.extend(lo)
        self.hi.extend(hi)
        self.integ.extend([1 if integer else 0] * lo.size)
        return idx

    def add_row(self, cols, coefs, lb, ub):
        self.rows.append((np.asarray(cols, dtype=int), np.asarray(coefs, dtype=np.float64),
                          float(lb), float(ub)))

    def matrix(self):
        """(A (rows, nvar) CSR, lb (rows,), ub (rows,))."""
        if not self.rows:
            return sp.csr_matrix((0, self.nvar)), np.zeros(0), np.zeros(0)
        r = np.concatenate([np.full(len(c), i) for i, (c, _, _, _) in enumerate(self.rows)])
        c = np.concatenate([c for c, _, _, _ in self.rows])
        v = np.concatenate([v for _, v, _, _ in self.rows])
        A = sp.csr_matrix((v, (r, c)), shape=(len(self.rows), self.nvar))
        lb = np.array([row[2] for row in self.rows])
        ub = np.array([row[3] for row in self.rows])
        return A, lb, ub

    def solve_milp(self, cost, time_limit):
        A, lb, ub = self.matrix()
        return milp(
            c=cost,
            constraints=[LinearConstraint(A, lb, ub)],
            integrality=np.array(self.integ),
            bounds=Bounds(np.array(self.lo), np.array(self.hi)),
            options={"time_limit": max(float(time_limit), 1.0), "mip_rel_gap": MIP_REL_GAP,
                     "disp": DISP},
        )

    def lp_form(self):
        """The rows as linprog's (A_ub, b_ub, A_eq, b_eq) and the variable bounds."""
        A, lb, ub = self.matrix()
        eq = lb == ub
        up = ~eq & np.isfinite(ub)
        dn = ~eq & np.isfinite(lb)
        A_ub = sp.vstack([A[up], -A[dn]]).tocsr()
        b_ub = np.r_[ub[up], -lb[dn]]
        return A_ub, b_ub, A[eq], lb[eq], list(zip(self.lo, self.hi))


def _ball_vars(B: _Builder, x0, eps, norm):
    """Input variables x constrained to the l_p ball (norm 'inf' or '1'); returns their indices."""
    d = x0.size
    x = B.add_vars(x0 - eps, x0 + eps)
    if norm == "1":  # x = x0 + p - n with p, n >= 0 and sum(p + n) <= eps
        p = B.add_vars(np.zeros(d), np.full(d, eps))
        n = B.add_vars(np.zeros(d), np.full(d, eps))
        for i in range(d):
            B.add_row([x[i], p[i], n[i]], [1.0, -1.0, 1.0], x0[i], x0[i])
        B.add_row(np.r_[p, n], np.ones(2 * d), -np.inf, eps)
    elif norm != "inf":
        raise ValueError("the MILP oracles support norm 'inf' and '1' only (the l2 ball is not "
                         "polyhedral)")
    return x


def _encode_relu_layers(B: _Builder, layers, x_idx, bounds, relaxed=False):
    """Encode the hidden ReLU layers ``layers`` = [(W_k, b_k)]; returns the last layer's vars.

    For a neuron z = w . a_prev + b with bounds l < 0 < u: a >= z, a >= 0, a <= u s,
    a <= z - l (1 - s), s binary (big-M). relaxed=True replaces the binary by the triangle
    relaxation a <= u (z - l) / (u - l), the tightest convex relaxation of one neuron.
    Stable neurons need neither: a = z if l >= 0, a = 0 if u <= 0 (the bounds are valid on the
    whole ball, so z's sign is known there).
    """
    prev = x_idx
    for (W, b), (l, u) in zip(layers, bounds):
        n = W.shape[0]
        a_idx = B.add_vars(np.zeros(n), np.maximum(u, 0.0))
        for j in range(n):
            w = W[j]
            aj = a_idx[j]
            if u[j] <= 0.0:
                B.hi[aj] = 0.0
            elif l[j] >= 0.0:
                B.lo[aj] = l[j]
                B.add_row(np.r_[aj, prev], np.r_[1.0, -w], b[j], b[j])  # a - w.a_prev = b
            else:
                B.add_row(np.r_[aj, prev], np.r_[1.0, -w], b[j], np.inf)  # a >= z
                if relaxed:
                    s = u[j] / (u[j] - l[j])
                    # a <= s (z - l)  <=>  a - s w.a_prev <= s (b - l)
                    B.add_row(np.r_[aj, prev], np.r_[1.0, -s * w], -np.inf, s * (b[j] - l[j]))
                else:
                    s = B.add_vars(0.0, 1.0, integer=True)[0]
                    B.add_row([aj, s], [1.0, -u[j]], -np.inf, 0.0)  # a <= u s
                    # a <= z - l (1 - s)  <=>  a - w.a_prev - l s <= b - l
                    B.add_row(np.r_[aj, prev, s], np.r_[1.0, -w, -l[j]], -np.inf, b[j] - l[j])
        prev = a_idx
    return prev


def neuron_bounds(weights, biases, x0, eps, norm="inf", tighten=True):
    """Valid pre-activation bounds [(l_k, u_k)] of the hidden layers over the l_p ball.

    Layer 0 is exact; each later layer takes interval arithmetic on the previous bounds and,
    if ``tighten``, intersects it with the LP bound over the triangle relaxation of all
    earlier layers (2 LPs per neuron). The LP values are widened by 1e-6 (1 + |v|), far more
    than HiGHS' feasibility tolerances, because a bound that cuts off a real point would make
    the "exact" MILP answers wrong. norm 'inf' or '1' when tightening.
    """
    x0 = np.asarray(x0, dtype=np.float64)
    bounds = interval_bounds(weights, biases, x0, eps, norm)[:1]
    for k in range(1, len(weights) - 1):
        l, u = _interval_step(weights[k], biases[k], *bounds[-1])
        if tighten:
            B = _Builder()
            x = _ball_vars(B, x0, eps, norm)
            last = _encode_relu_layers(B, list(zip(weights[:k], biases[:k])), x, bounds,
                                       relaxed=True)
            A_ub, b_ub, A_eq, b_eq, vb = B.lp_form()
            for j in range(weights[k].shape[0]):
                for sign in (1.0, -1.0):
                    cost = np.zeros(B.nvar)
                    cost[last] = sign * weights[k][j]
                    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq if A_eq.shape[0] else None,
                                  b_eq=b_eq if A_eq.shape[0] else None, bounds=vb, method="highs")
                    if res.status != 0:
                        continue  # keep the interval bound
                    v = sign * res.fun + biases[k][j]
                    pad = 1e-6 * (1.0 + abs(v))
                    if sign > 0:
                        l[j] = max(l[j], v - pad)
                    else:
                        u[j] = min(u[j], v + pad)
        bounds.append((l, u))
    return bounds


def _affine_region(weights, biases, x):
    """The affine pieces of a ReLU net on the linear region containing x (d,).

    Returns (pre, (A_out, c_out)): pre is a list of (A_k, c_k, active_k) with z_k = A_k x + c_k
    and the activation pattern at x; the logits on the region are A_out x + c_out.
    """
    A = np.eye(x.size)
    c = np.zeros(x.size)
    pre = []
    for W, b in zip(weights[:-1], biases[:-1]):
        Az, cz = W @ A, W @ c + b
        active = (Az @ x + cz) > 0.0
        pre.append((Az, cz, active))
        A, c = Az * active[:, None], cz * active
    return pre, (weights[-1] @ A, weights[-1] @ c + biases[-1])


def _region_lp(weights, biases, x0, x_star, c, t, eps, norm, distortion):
    """Re-solve a problem as an LP on the linear region of x_star (its activation pattern).

    On one linear region the network is affine, so the LP is exact there: every feasible
    point is a real input with exactly the LP's margin. distortion=True: minimise delta
    s.t. ||x - x0||_inf <= delta <= eps and f_t(x) >= f_c(x); otherwise minimise f_c - f_t over
    the l_p ball of radius eps (norm 'inf' or '1'). Returns (value, x) or None if the LP fails.
    """
    d = x0.size
    pre, (Ao, co) = _affine_region(weights, biases, x_star)
    g = Ao[c] - Ao[t]
    h = co[c] - co[t]
    B = _Builder()
    x = _ball_vars(B, x0, eps, "inf" if distortion else norm)
    cost = np.zeros(0)
    if distortion:
        delta = B.add_vars(0.0, eps)[0]
        for i in range(d):
            B.add_row([x[i], delta], [1.0, -1.0], -np.inf, x0[i])  # x - delta <= x0
            B.add_row([x[i], delta], [1.0, 1.0], x0[i], np.inf)  # x + delta >= x0
        B.add_row(x, g, -np.inf, -h)  # f_c - f_t = g x + h <= 0
        cost = np.zeros(B.nvar)
        cost[delta] = 1.0
    else:
        cost = np.zeros(B.nvar)
        cost[x] = g
    for Az, cz, active in pre:
        for j in range(Az.shape[0]):  # stay in the region: z >= 0 if active, else z <= 0
            if active[j]:
                B.add_row(x, Az[j], -cz[j], np.inf)
            else:
                B.add_row(x, Az[j], -np.inf, -cz[j])
    A_ub, b_ub, A_eq, b_eq, vb = B.lp_form()
    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq if A_eq.shape[0] else None,
                  b_eq=b_eq if A_eq.shape[0] else None, bounds=vb, method="highs")
    if res.status != 0:
        return None
    xs = res.x[x]
    return (float(res.fun) if distortion else float(res.fun) + h), xs


def _clip_to_ball(x, x0, eps, norm):
    """Undo solver tolerance: put x back into the closed ball (inf or 1) around x0."""
    if norm == "inf":
        return np.clip(x, x0 - eps, x0 + eps)
    return project_ball(x[None, :], x0, eps, norm)[0]


def _margin_milp(weights, biases, x0, c, t, eps, norm, bounds, time_limit):
    """min f_c - f_t over the ball by MILP; returns (scipy result, x or None, constant).

    The MILP objective omits the constant b_c - b_t; add it to res.fun / the dual bound.
    """
    B = _Builder()
    x_idx = _ball_vars(B, x0, eps, norm)
    last = _encode_relu_layers(B, list(zip(weights[:-1], biases[:-1])), x_idx, bounds)
    row = weights[-1][c] - weights[-1][t]
    const = float(biases[-1][c] - biases[-1][t])
    cost = np.zeros(B.nvar)
    cost[last] = row
    res = B.solve_milp(cost, time_limit)
    return res, (None if res.x is None else res.x[x_idx]), const


def _dual_bound(res) -> float:
    """HiGHS' proven bound on the optimum; the primal value if presolve solved the model."""
    v = getattr(res, "mip_dual_bound", None)
    if v is None or not np.isfinite(v):
        return float(res.fun) if res.status == 0 else np.nan
    return float(v)


def exact_margin_min(weights, biases, x0, c, t, eps, norm="inf", time_limit=60.0,
                     tighten=True) -> MilpResult:
    """Exact minimum of f_c(x) - f_t(x) over the l_p ball of radius eps around x0 (ReLU net).

    norm 'inf' (box x0 +/- eps) or '1' (x = x0 + p - n, p, n >= 0, sum(p + n) <= eps).
    Big-M encoding with the bounds of :func:`neuron_bounds`. The returned point is re-optimised
    by the LP of its linear region, clipped into the ball, and ``value`` is its numpy margin,
    so ``value`` is always a true margin inside the ball (>= the true minimum); with status
    'optimal' it equals the minimum up to solver tolerance, and ``dual_bound`` <= minimum.
    """
    t_start = time.perf_counter()
    weights = [np.asarray(w, dtype=np.float64) for w in weights]
    biases = [np.asarray(b, dtype=np.float64) for b in biases]
    x0 = np.asarray(x0, dtype=np.float64)
    bounds = neuron_bounds(weights, biases, x0, eps, norm, tighten)
    remaining = time_limit - (time.perf_counter() - t_start)
    res, x, const = _margin_milp(weights, biases, x0, c, t, eps, norm, bounds, remaining)
    if x is None:
        return MilpResult(np.nan, None, "failed", np.nan, eps, np.nan, 1, res.message)
    status = "optimal" if res.status == 0 else "time-limit"
    out = _region_lp(weights, biases, x0, x, c, t, eps, norm, distortion=False)
    candidates = [_clip_to_ball(x, x0, eps, norm)]
    if out is not None:
        candidates.append(_clip_to_ball(out[1], x0, eps, norm))
    ms = [float(margins(weights, biases, "relu", z, c, [t])) for z in candidates]
    k = int(np.argmin(ms))
    dual = _dual_bound(res) + const if status == "optimal" else np.nan
    return MilpResult(ms[k], candidates[k], status, dual, eps, ms[k], 1, res.message)


def exact_min_linf_distortion(weights, biases, x0, c, t, eps_hi=None, time_limit=60.0,
                              method="region", rtol=1e-6, tighten=True) -> MilpResult:
    """Exact minimum l_inf distortion: the least delta such that some x with
    ||x - x0||_inf <= delta has f_t(x) >= f_c(x), for a ReLU network. No domain clipping.

    eps_hi must upper-bound the optimum; if None it is found by PGD (the distance of a real
    adversarial point). Both methods use big-M constants valid on the box of radius eps_hi
    (or smaller).

    method='direct': one MILP in (delta, x, hidden units, binaries) with
    x0 - delta <= x <= x0 + delta, f_t - f_c >= 0, minimising delta. Exact, but HiGHS is slow
    on it for d = 784 (the 2d coupling rows defeat its cuts), so it is used on small inputs.

    method='region' (default, same answer): start from an adversarial point, then repeat
    (1) the LP over its linear region (where the net is affine) gives the least distortion
    delta_R of a flip in that region -- a real adversarial point, whose distance is returned;
    (2) the margin MILP minimises f_c - f_t over the box of radius r = delta_R (1 - rtol), with
    big-M bounds on that smaller box and no coupling rows. If its minimiser flips, its region
    seeds the next round; if not, HiGHS has proved the minimum margin within r is >= its dual
    bound, i.e. nothing flips closer than r up to HiGHS' absolute gap tolerance (1e-6 of
    margin), and delta_R is returned with status 'optimal' and dual_bound = r.
    """
    t_start = time.perf_counter()
    weights = [np.asarray(w, dtype=np.float64) for w in weights]
    biases = [np.asarray(b, dtype=np.float64) for b in biases]
    x0 = np.asarray(x0, dtype=np.float64)
    left = lambda: time_limit - (time.perf_counter() - t_start)  # noqa: E731
    witness = None
    if eps_hi is None:
        eps_hi, witness = pgd_min_distortion(weights, biases, "relu", x0, c, t, "inf",
                                             rng=np.random.default_rng(0), rounds=8)
        if witness is None:
            eps_hi = 100.0
    if method == "direct":
        return _distortion_direct(weights, biases, x0, c, t, eps_hi, left(), tighten)
    if method != "region":
        raise ValueError(f"unknown method {method!r}")
    solves = 0
    message = ""
    if witness is None:
        bounds = neuron_bounds(weights, biases, x0, eps_hi, "inf", tighten)
        res, witness, const = _margin_milp(weights, biases, x0, c, t, eps_hi, "inf", bounds,
                                           left())
        solves += 1
        message = res.message
        if res.status == 0 and _dual_bound(res) + const > 0.0:
            return MilpResult(eps_hi, None, "capped", eps_hi, eps_hi, np.nan, solves, message)
        if witness is None:
            return MilpResult(np.nan, None, "failed", np.nan, eps_hi, np.nan, solves, message)
    best_x, best = None, np.inf

    def consider(z):
        """Keep z (and its region's least-distortion point) if it is a real flip."""
        nonlocal best_x, best
        pts = [z]
        out = _region_lp(weights, biases, x0, z, c, t, eps_hi, "inf", distortion=True)
        if out is not None:
            pts.append(out[1])
        for p in pts:
            dist = float(np.max(np.abs(p - x0)))
            if float(margins(weights, biases, "relu", p, c, [t])) <= FLIP_TOL and dist < best:
                best_x, best = p, dist

    consider(witness)
    if best_x is None:  # LP and witness both fail the exact check: nudge the witness slightly
        consider(x0 + (witness - x0) * (1 + 1e-9))
    if best_x is None:
        return MilpResult(np.nan, None, "failed", np.nan, eps_hi, np.nan, solves, message)
    status, dual = "stalled", np.nan
    for _ in range(40):
        r = best * (1.0 - rtol)
        if left() <= 0:
            status = "time-limit"
            break
        bounds = neuron_bounds(weights, biases, x0, r, "inf", tighten)
        res, z, const = _margin_milp(weights, biases, x0, c, t, r, "inf", bounds, left())
        solves += 1
        message = res.message
        if z is None:
            status = "time-limit" if res.status == 1 else "failed"
            break
        prev = best
        z = _clip_to_ball(z, x0, r, "inf")
        consider(z)
        if best < prev:
            continue  # a closer flip: refine from its region
        if res.status == 0 and float(margins(weights, biases, "relu", z, c, [t])) > 0.0:
            # HiGHS proved min margin over the r-box >= its dual bound, which sits within its
            # absolute gap tolerance (1e-6) of the positive margin of z: nothing flips within r
            # beyond that tolerance
            status, dual = "optimal", r
        elif res.status == 1:
            status = "time-limit"
        break
    m = float(margins(weights, biases, "relu", best_x, c, [t]))
    return MilpResult(best, best_x, status, dual, eps_hi, m, solves, message)


def _distortion_direct(weights, biases, x0, c, t, eps_hi, time_limit, tighten):
    """The single-MILP formulation of :func:`exact_min_linf_distortion` (method='direct')."""
    B = _Builder()
    x_idx = B.add_vars(x0 - eps_hi, x0 + eps_hi)
    delta = B.add_vars(0.0, eps_hi)[0]
    for i, xi in enumerate(x_idx):
        B.add_row([xi, delta], [1.0, -1.0], -np.inf, x0[i])  # x - delta <= x0
        B.add_row([xi, delta], [1.0, 1.0], x0[i], np.inf)  # x + delta >= x0
    bounds = neuron_bounds(weights, biases, x0, eps_hi, "inf", tighten)
    last = _encode_relu_layers(B, list(zip(weights[:-1], biases[:-1])), x_idx, bounds)
    row = weights[-1][t] - weights[-1][c]
    B.add_row(last, row, biases[-1][c] - biases[-1][t], np.inf)  # f_t - f_c >= 0
    cost = np.zeros(B.nvar)
    cost[delta] = 1.0
    res = B.solve_milp(cost, time_limit)
    if res.x is None:
        if res.status == 2:  # infeasible: nothing flips inside the box
            return MilpResult(eps_hi, None, "capped", eps_hi, eps_hi, np.nan, 1, res.message)
        return MilpResult(np.nan, None, "failed", np.nan, eps_hi, np.nan, 1, res.message)
    status = "optimal" if res.status == 0 else "time-limit"
    x = res.x[x_idx]
    value = float(np.max(np.abs(x - x0)))
    out = _region_lp(weights, biases, x0, x, c, t, eps_hi, "inf", distortion=True)
    if out is not None and float(margins(weights, biases, "relu", out[1], c, [t])) <= FLIP_TOL:
        value, x = float(np.max(np.abs(out[1] - x0))), out[1]
    m = float(margins(weights, biases, "relu", x, c, [t]))
    dual = _dual_bound(res) if status == "optimal" else np.nan
    return MilpResult(value, x, status, dual, eps_hi, m, 1, res.message)


def ideal_relu_lp(W1, b1, v, c, lo, hi) -> float:
    """The LP bound of ``min over [lo, hi] of sum_j v_j relu(W1_j x + b1_j) + c`` with every
    neuron replaced by its exact convex hull over the box (Balas' disjunctive formulation: x
    splits into x0 + x1 with x1 in lam [lo, hi] where the neuron is on, x0 in (1 - lam)
    [lo, hi] where it is off, the neuron's value W1_j x1 + b1_j lam), an independent oracle
    for :mod:`crown_cli.engine.hull`: it never uses the affine upper lines."""
    n, d = W1.shape
    B = _Builder()
    x = B.add_vars(lo, hi)
    terms = []
    for j in range(n):
        y = B.add_vars(-np.inf, np.inf)[0]
        x1 = B.add_vars(np.full(d, -np.inf), np.full(d, np.inf))
        lam = B.add_vars(0.0, 1.0)[0]
        for i in range(d):
            B.add_row([x1[i], lam], [1.0, -lo[i]], 0.0, np.inf)  # x1 >= lam lo
            B.add_row([x1[i], lam], [1.0, -hi[i]], -np.inf, 0.0)  # x1 <= lam hi
            # x0 = x - x1 in (1 - lam) [lo, hi]
            B.add_row([x[i], x1[i], lam], [1.0, -1.0, lo[i]], lo[i], np.inf)
            B.add_row([x[i], x1[i], lam], [1.0, -1.0, hi[i]], -np.inf, hi[i])
        # on: W1 x1 + b1 lam >= 0; off: W1 (x - x1) + b1 (1 - lam) <= 0; y = W1 x1 + b1 lam
        B.add_row(np.r_[x1, lam], np.r_[W1[j], b1[j]], 0.0, np.inf)
        B.add_row(np.r_[x, x1, lam], np.r_[W1[j], -W1[j], -b1[j]], -np.inf, -b1[j])
        B.add_row(np.r_[y, x1, lam], np.r_[1.0, -W1[j], -b1[j]], 0.0, 0.0)
        terms.append((y, v[j]))
    cost = np.zeros(B.nvar)
    for y, vj in terms:
        cost[y] = vj
    A_ub, b_ub, A_eq, b_eq, bounds = B.lp_form()
    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds,
                  method="highs")
    assert res.status == 0, res.message
    return float(res.fun) + float(c)
