"""Exact: the minimum adversarial distortion of a ReLU network by mixed-integer LP (HiGHS).

The paper's Reluplex column: the least ||x - x0||_p (p = inf or 1) such that f_t(x) >= f_c(x),
for a target t (for several targets, the minimum over them: one MILP per target, each capped
by the best distance found so far). No domain clipping, like the bounds.

For one target:

1. A quick attack finds an adversarial point: DeepFool-style steps on the linear region of the
   current point (the margin is affine there), each the least l_p step that zeroes the
   linearised margin (times 1.02), then a bisection along the segment from x0.
2. Region LP: with that point's activation pattern fixed the network is affine, so an LP gives
   the least distortion U of a flip inside that linear region, and a real adversarial point at
   distance U (checked by the forward pass: f_c - f_t <= 1e-9).
3. Margin MILP on the ball of radius r = U (1 - 1e-6): minimise f_c - f_t with big-M ReLU
   encoding (a >= z, a >= 0, a <= u s, a <= z - l (1 - s), s binary), the big-M constants
   from LP-Full bounds on that ball (:func:`crown_cli.certification.methods.lp_full.lp_full_bounds`);
   neurons stable on the ball need no binary. If HiGHS proves the minimum > 0, nothing flips
   within r and the answer is U (the minimum lies in [r, U]). Otherwise its minimiser flips
   closer than U: back to step 2 from there.
   If the attack fails, margin MILPs on balls doubling from ``eps0`` look for a first flip
   (status ``capped`` at eps_max when none is found).

The single-MILP model (minimise the distortion t with -t <= x - x0 <= t and f_c - f_t <= 0) is
kept in :func:`_solve_direct` as a cross-check: for l_inf on 784 inputs HiGHS is far slower on
it (the 2d coupling rows), tens of seconds to minutes against seconds.

Status: ``optimal`` (HiGHS proved optimality with ``mip_rel_gap`` = 1e-6), ``timeout``
(the time limit ``--timeout`` for the row was hit before every target was solved: no eps is
reported), ``capped`` (nothing flips within eps_max; eps = eps_max is then a lower bound).

Soundness: the value is the distance of a real adversarial point (up to 1e-9 of margin), so
it is an upper bound of the minimum distortion; that it is the minimum holds only within the
solver's tolerances (MIP gap 1e-6, primal feasibility 1e-7) and the 1e-6 relative step: an
upper bound of every certified radius up to those tolerances, not a rigorous certificate.
The big-M bounds themselves are rigorous (LP-Full).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from crown_cli.engine.deadline import DeadlineExceeded
from crown_cli.engine.dense_crown import Network
from crown_cli.certification.methods.lp_full import lp_full_bounds

NORMS_SUPPORTED = ("inf", "1")
MIP_REL_GAP = 1e-6
RTOL = 1e-6  # the minimum is located to this relative width
FLIP_TOL = 1e-9  # a point "flips" when f_c - f_t <= FLIP_TOL (LP solutions land on the boundary)
ATTACK_STEPS = 200
OVERSHOOT = 1.02


@dataclass
class ExactResult:
    eps: Optional[float]  # minimum distortion (None on timeout; eps_max when capped)
    status: str  # optimal | timeout | capped
    solves: int  # MILPs solved
    adversarial: Optional[np.ndarray]  # an input at (about) distance eps that flips, if any
    dual_bound: float  # HiGHS' proven lower bound of the minimum (nan if none)


def _dist(v, norm):
    return float(np.max(np.abs(v))) if norm == "inf" else float(np.sum(np.abs(v)))


def _margin_grad(W, b, x, c, t):
    """Margin f_c - f_t at x and its gradient on x's linear region (ReLU network)."""
    a = x
    masks = []
    for Wk, bk in zip(W[:-1], b[:-1]):
        z = Wk @ a + bk
        masks.append(z > 0.0)
        a = np.maximum(z, 0.0)
    row = W[-1][c] - W[-1][t]
    m = float(row @ a + b[-1][c] - b[-1][t])
    g = row
    for k in range(len(masks) - 1, -1, -1):
        g = (g * masks[k]) @ W[k]
    return m, g


def attack(W, b, x0, c, t, norm, steps=ATTACK_STEPS) -> Optional[np.ndarray]:
    """An x with f_t(x) > f_c(x) found by linearised steps, pulled back toward x0; or None."""
    x = x0.copy()
    found = None
    for _ in range(steps):
        m, g = _margin_grad(W, b, x, c, t)
        if m < 0.0:
            found = x
            break
        if norm == "inf":
            gn = float(np.abs(g).sum())
            if not gn > 0:
                return None
            x = x - OVERSHOOT * (m / gn) * np.sign(g) - 1e-9 * np.sign(g)
        else:
            i = int(np.argmax(np.abs(g)))
            if g[i] == 0.0:
                return None
            x = x.copy()
            x[i] -= OVERSHOOT * m / g[i] + 1e-9 * np.sign(g[i])
    if found is None:
        return None
    lo, hi = 0.0, 1.0  # bisect the segment x0 + s (found - x0) for the first flip
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if _margin_grad(W, b, x0 + mid * (found - x0), c, t)[0] < 0.0:
            hi = mid
        else:
            lo = mid
    return x0 + hi * (found - x0)


class _Rows:
    """COO rows lb <= A y <= ub."""

    def __init__(self):
        self.r, self.c, self.v, self.lb, self.ub = [], [], [], [], []
        self.n = 0

    def add(self, cols, vals, lb, ub):
        self.r.append(np.full(len(cols), self.n))
        self.c.append(np.asarray(cols))
        self.v.append(np.asarray(vals, dtype=np.float64))
        self.lb.append(lb)
        self.ub.append(ub)
        self.n += 1

    def constraint(self, nvar):
        A = sp.csr_matrix((np.concatenate(self.v), (np.concatenate(self.r), np.concatenate(self.c))),
                          shape=(self.n, nvar))
        return LinearConstraint(A, np.array(self.lb), np.array(self.ub))


class _Model:
    """Variables with bounds and integrality, plus rows: the MILP/LP under construction."""

    def __init__(self):
        self.lo, self.hi, self.integ = [], [], []
        self.nvar = 0
        self.rows = _Rows()

    def new(self, lo_v, hi_v, integer=False):
        lo_v = np.atleast_1d(np.asarray(lo_v, dtype=np.float64))
        hi_v = np.broadcast_to(np.asarray(hi_v, dtype=np.float64), lo_v.shape)
        self.lo.append(lo_v)
        self.hi.append(np.array(hi_v))
        self.integ.append(np.full(lo_v.size, 1 if integer else 0))
        idx = np.arange(self.nvar, self.nvar + lo_v.size)
        self.nvar += lo_v.size
        return idx

    def solve(self, cost, time_limit, relax=False):
        integ = np.zeros(self.nvar) if relax else np.concatenate(self.integ)
        rows = [self.rows.constraint(self.nvar)] if self.rows.n else []  # (none: a dead net)
        return milp(cost, integrality=integ,
                    bounds=Bounds(np.concatenate(self.lo), np.concatenate(self.hi)),
                    constraints=rows,
                    options={"time_limit": max(float(time_limit), 0.01),
                             "mip_rel_gap": MIP_REL_GAP, "disp": False})


def _input(M: _Model, x0, norm, radius):
    """Input offset variables on the l_p ball of ``radius``; returns (cols, P0 multiplier)."""
    d = x0.size
    if norm == "inf":
        return M.new(np.full(d, -radius), np.full(d, radius)), 1.0
    pn = M.new(np.zeros(2 * d), np.full(2 * d, radius))
    M.rows.add(pn, np.ones(2 * d), -np.inf, radius)
    return pn, 2.0


def _first_layer(net, in_cols, d):
    """z_0 = P delta + q over the input columns."""
    P = net.W[0] if in_cols.size == d else np.hstack([net.W[0], -net.W[0]])
    return P


def _encode_relu(M: _Model, net: Network, x0, in_cols, bounds):
    """Big-M encoding of the hidden ReLU layers with pre-activation bounds ``bounds``
    (a >= z, a >= 0, a <= u s, a <= z - l (1 - s), s binary; stable neurons exactly).
    Returns the last hidden layer's columns."""
    prev = in_cols
    for k, (l, u) in enumerate(bounds):
        Wk = _first_layer(net, in_cols, x0.size) if k == 0 else net.W[k]
        q = net.W[0] @ x0 + net.b[0] if k == 0 else net.b[k]
        a = M.new(np.zeros(l.size), np.maximum(u, 0.0))
        for j in range(l.size):
            if u[j] <= 0.0:
                continue  # a = 0 by its bounds
            w = Wk[j]
            nz = np.flatnonzero(w)
            if l[j] >= 0.0:  # a = z
                M.rows.add(np.r_[a[j], prev[nz]], np.r_[1.0, -w[nz]], q[j], q[j])
                continue
            s = M.new(0.0, 1.0, integer=True)[0]
            M.rows.add(np.r_[a[j], prev[nz]], np.r_[1.0, -w[nz]], q[j], np.inf)  # a >= z
            M.rows.add([a[j], s], [1.0, -u[j]], -np.inf, 0.0)  # a <= u s
            # a <= z - l (1 - s)  <=>  a - w.prev - l s <= q - l
            M.rows.add(np.r_[a[j], prev[nz], s], np.r_[1.0, -w[nz], -l[j]], -np.inf, q[j] - l[j])
        prev = a
    return prev


def _distortion_objective(M: _Model, in_cols, norm, radius):
    """Cost vector of the distortion (l_inf: a variable t >= |delta_i|; l_1: sum(p + n))."""
    if norm == "inf":
        tcol = M.new(0.0, radius)[0]
        for i in in_cols:
            M.rows.add([i, tcol], [1.0, -1.0], -np.inf, 0.0)
            M.rows.add([i, tcol], [1.0, 1.0], 0.0, np.inf)
        cols = np.array([tcol])
    else:
        cols = in_cols
    cost = np.zeros(M.nvar)
    cost[cols] = 1.0
    return cost


def _solve_direct(net: Network, x0, c, t, norm, radius, bounds, time_limit):
    """One MILP: min distortion s.t. f_c - f_t <= 0 within ``radius`` (the textbook
    formulation; slow for l_inf on 784 inputs, kept as a cross-check)."""
    M = _Model()
    in_cols, _ = _input(M, x0, norm, radius)
    last = _encode_relu(M, net, x0, in_cols, bounds)
    row = net.W[-1][c] - net.W[-1][t]
    M.rows.add(last, row, -np.inf, -(net.b[-1][c] - net.b[-1][t]))  # f_c - f_t <= 0
    cost = _distortion_objective(M, in_cols, norm, radius)
    return M.solve(cost, time_limit), in_cols


def _solve_margin(net: Network, x0, c, t, norm, radius, bounds, time_limit):
    """One MILP: min f_c - f_t over the ball of ``radius`` (objective without b_c - b_t)."""
    M = _Model()
    in_cols, _ = _input(M, x0, norm, radius)
    last = _encode_relu(M, net, x0, in_cols, bounds)
    cost = np.zeros(M.nvar)
    cost[last] = net.W[-1][c] - net.W[-1][t]
    return M.solve(cost, time_limit), in_cols


def _region_lp(net: Network, x0, x_ref, c, t, norm, radius, time_limit=1e9):
    """Least distortion of a flip inside x_ref's linear region (the activation pattern of
    x_ref fixed: the network is affine there, so the LP is exact on the region); None where
    HiGHS ends without it (``time_limit`` seconds, or none left)."""
    if time_limit <= 0:
        return None
    d = x0.size
    M = _Model()
    in_cols, _ = _input(M, x0, norm, radius)
    # affine pieces z_k = A_k x + g_k on the region
    A, g = np.eye(d), np.zeros(d)
    xr = x_ref
    for Wk, bk in zip(net.W[:-1], net.b[:-1]):
        Az, gz = Wk @ A, Wk @ g + bk
        on = (Az @ xr + gz) > 0.0
        Ad = Az if norm == "inf" else np.hstack([Az, -Az])
        q = Az @ x0 + gz
        for j in range(Az.shape[0]):
            if on[j]:
                M.rows.add(in_cols, Ad[j], -q[j], np.inf)  # z >= 0
            else:
                M.rows.add(in_cols, Ad[j], -np.inf, -q[j])  # z <= 0
        A, g = Az * on[:, None], gz * on
    Ao, go = net.W[-1] @ A, net.W[-1] @ g + net.b[-1]
    row = Ao[c] - Ao[t]
    rowd = row if norm == "inf" else np.hstack([row, -row])
    M.rows.add(in_cols, rowd, -np.inf, -(row @ x0 + go[c] - go[t]))
    cost = _distortion_objective(M, in_cols, norm, radius)
    res = M.solve(cost, time_limit, relax=True)
    if res.status != 0:
        return None
    return x0 + _offset(res.x, in_cols, norm, d)


def _offset(res_x, in_cols, norm, d):
    v = res_x[in_cols]
    return v if norm == "inf" else v[:d] - v[d:]


def _margin(W, b, x, c, t):
    return _margin_grad(W, b, x, c, t)[0]


def _clip(x, x0, radius, norm):
    """Put a solver's point back into the closed ball (it may sit outside by its tolerance)."""
    v = x - x0
    if norm == "inf":
        return x0 + np.clip(v, -radius, radius)
    n1 = float(np.abs(v).sum())
    return x0 + v * min(1.0, radius / n1) if n1 > 0 else x0.copy()


class _Target:
    """Minimum distortion for one target: attack, then alternate region LPs (which give the
    least distortion of a flip in one linear region: an upper bound U with a real adversarial
    point) and margin MILPs on the ball of radius U (1 - rtol) (which either prove nothing
    flips there, so the minimum is in [U (1 - rtol), U], or return a closer flip)."""

    def __init__(self, net, x0, c, t, norm, deadline):
        self.net, self.x0, self.c, self.t, self.norm = net, x0, c, t, norm
        self.deadline = deadline
        self.U, self.x = np.inf, None
        self.solves = 0

    def left(self):
        return self.deadline - time.perf_counter()

    def consider(self, z, radius):
        """Keep z, or the closest flip of its linear region, if it really flips (the region's
        LP within the time left: none past it)."""
        W, b = self.net.W, self.net.b
        pts = [z]
        r = _region_lp(self.net, self.x0, z, self.c, self.t, self.norm, radius, self.left())
        if r is not None:
            pts.append(r)
        for p in pts:
            dist = _dist(p - self.x0, self.norm)
            if _margin(W, b, p, self.c, self.t) <= FLIP_TOL and dist < self.U:
                self.U, self.x = dist, p

    def margin_milp(self, radius):
        """(status, point): 'clear' if nothing flips within radius, 'flip' with a point,
        'timeout'."""
        W, b = self.net.W, self.net.b
        if self.net.num_hidden == 0:  # affine: the margin's least value on the ball directly
            a = W[-1][self.c] - W[-1][self.t]
            m0 = float(a @ self.x0 + b[-1][self.c] - b[-1][self.t])
            if m0 - radius * np.linalg.norm(a, {"inf": 1, "1": np.inf}[self.norm]) > 0.0:
                return "clear", None
            z = _region_lp(self.net, self.x0, self.x0, self.c, self.t, self.norm, radius,
                           self.left())
            return ("flip", z) if z is not None else ("timeout", None)
        try:  # one LP per hidden neuron: checked against the deadline between them
            bounds, _, _ = lp_full_bounds(self.net, self.x0, radius, self.norm,
                                          deadline=time.monotonic() + self.left())
        except DeadlineExceeded:
            return "timeout", None
        if self.left() <= 0:
            return "timeout", None
        res, in_cols = _solve_margin(self.net, self.x0, self.c, self.t, self.norm, radius, bounds,
                                     self.left())
        self.solves += 1
        if res.x is None:
            if res.status == 1:
                return "timeout", None
            raise RuntimeError(f"HiGHS MILP failed: {res.message}")
        z = _clip(self.x0 + _offset(res.x, in_cols, self.norm, self.x0.size), self.x0, radius,
                  self.norm)
        if res.status == 0:
            const = b[-1][self.c] - b[-1][self.t]
            dual = getattr(res, "mip_dual_bound", None)
            dual = float(res.fun) if dual is None or not np.isfinite(dual) else float(dual)
            if dual + const > 0.0 or _margin(W, b, z, self.c, self.t) > 0.0:
                return "clear", None
            return "flip", z
        return ("flip", z) if _margin(W, b, z, self.c, self.t) <= FLIP_TOL else ("timeout", None)

    def solve(self, cap, eps_start, eps_max, rtol):
        """('optimal', U, lower) | ('none', cap) | ('capped', eps_max) | ('timeout', None)."""
        adv = attack(self.net.W, self.net.b, self.x0, self.c, self.t, self.norm)
        if adv is not None:
            self.consider(adv, _dist(adv - self.x0, self.norm) * (1 + 1e-9))
        if self.U == np.inf:  # no flip known: look further out with margin MILPs
            r = min(eps_start, cap)
            while True:
                if self.left() <= 0:
                    return "timeout", None, None
                status, z = self.margin_milp(r)
                if status == "timeout":
                    return "timeout", None, None
                if status == "flip":
                    self.consider(z, r)
                    if self.U == np.inf:
                        return "timeout", None, None  # cannot happen outside tolerance games
                    break
                if r >= cap:
                    return "none", cap, None
                if r >= eps_max:
                    return "capped", eps_max, None
                r = min(2.0 * r, cap, eps_max)
        while True:
            if self.U > cap:
                r = cap
            else:
                r = self.U * (1.0 - rtol)
            if self.left() <= 0:
                return "timeout", None, None
            status, z = self.margin_milp(r)
            if status == "timeout":
                return "timeout", None, None
            if status == "clear":
                return ("optimal", self.U, r) if self.U <= cap else ("none", cap, None)
            prev = self.U
            self.consider(z, r)
            if not self.U < prev:  # the MILP's point did not improve U: stop (tolerance)
                return "optimal", self.U, r


def min_distortion(net: Network, x0, c: int, targets: Sequence[int], norm: str,
                   timeout: Optional[float] = None, eps_start: float = 0.01,
                   eps_max: float = 1e4, rtol: float = RTOL) -> ExactResult:
    """Minimum l_p distortion (p = 'inf' or '1') making some t in ``targets`` reach f_c, on
    the network ``net`` (``Network(weights, biases)``)."""
    if norm not in NORMS_SUPPORTED:
        raise ValueError(f"exact supports norms {NORMS_SUPPORTED}, not {norm!r}")
    t_start = time.perf_counter()
    deadline = np.inf if timeout is None else t_start + float(timeout)
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    jobs = [_Target(net, x0, c, t, norm, deadline) for t in targets]
    best, best_x, lower, solves = np.inf, None, np.nan, 0
    capped = False
    for job in jobs:
        status, value, low = job.solve(best, eps_start, eps_max, rtol)
        solves += job.solves
        if status == "timeout":
            return ExactResult(None, "timeout", solves, None, np.nan)
        if status == "capped":
            capped = True
        elif status == "optimal" and value < best:
            best, best_x, lower = value, job.x, low
    if best == np.inf or (capped and best > eps_max):
        return ExactResult(eps_max, "capped", solves, None, eps_max)
    return ExactResult(best, "optimal", solves, best_x, lower)
