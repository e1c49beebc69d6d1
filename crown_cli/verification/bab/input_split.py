"""Input-splitting branch and bound for low-dimensional inputs (issue 14).

Two parts:

- :func:`batch_lower_bounds`: CROWN over many boxes at once for ReLU / leaky ReLU MLPs. The
  pre-activation bounds of every hidden layer are computed per box by back-substitution with
  the relaxations of :mod:`crown_cli.engine.relaxations.relu_numpy` (the same float64 operations as
  the engine's ReLU relaxation: upper chord, adaptive lower slope), then the lower bound of
  ``A f(x)`` per box. The weight matrices are shared by all boxes, so each back-substitution
  step is one large GEMM ``(N * rows, n_i) @ W_i`` over every box and row at once; only the
  slope scaling is per box.
- :func:`alpha_row_bound`: one row per box re-bounded with the unstable ReLUs' lower slopes
  optimised (alpha-CROWN on the last layer, the hidden bounds kept), then verified like the
  rows of :func:`batch_lower_bounds`.
- :func:`input_split`: branch and bound on the input box. Open sub-boxes are bounded in
  batches; a sub-box is closed when some row of ``A f(x) <= b`` has a lower bound above
  ``b`` (rounded up one ulp); for the others a few candidate points (centre, minimising
  corners of the linear bounds) are checked by a float64 forward pass; the rest are split in
  two along one input dimension.

Floating point, as in :mod:`crown_cli.engine.backsub`: the box is centre +/- radius with the radius
rounded up one ulp (:func:`crown_cli.engine.input_sets.centre_radius`); every bound is widened outward by (1) per
back-substitution step the a-posteriori charge of its products' rounding, ``|D| @ v_i`` per
box (:func:`_step_weights`, the engine's ``step_weights`` with unit 2**-53 from the box's
own intervals), (2) the rounding of ``A @ W[-1]`` (as ``product_rounding``), (3) the
network's final-sum allowance (``final_sum_rtol``) times the sum of the absolute values
of the terms (``|Lam| |c| + |Lam| r`` plus the accumulated ``|D| |b_i|`` and
``|Lam| |intercepts|`` of every step), plus ``FP_ATOL``.

Arrays in, arrays out: no files and no printing here.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from crown_cli.activations import default_alpha, supporting
from crown_cli.engine.input_sets import centre_radius
from crown_cli.engine.kernels import kernels_backend
from crown_cli.engine.rounding import (ERR_SAFETY, U64, final_sum_rtol, margin_rows_rounding,
                                       step_weights, widen)
from crown_cli.engine.relaxations import relu_numpy
from crown_cli.verification.outcome import BabResult, violations

SPLIT_RULES = ("sensitivity", "trial")
FULL_ROWS = 0.6
FLAT = 0.0  # skip_stable: above this share of unstable rows, back-substitute all rows


def _relaxation(activation: str, alpha, adaptive: bool):
    """(l, u) of any shape -> (aU, bU, aL, bL) of that shape, via the numpy relaxations."""
    if activation == "relu":
        fn = lambda l, u: relu_numpy.relu_relaxation(l, u, adaptive)  # noqa: E731
    elif activation == "leaky_relu":
        a = default_alpha("leaky_relu") if alpha is None else float(alpha)
        fn = lambda l, u: relu_numpy.leaky_relu_relaxation(l, u, a, adaptive)  # noqa: E731
    else:
        raise ValueError(f"batch_lower_bounds: activation '{activation}' is not supported "
                         f"(choose from {', '.join(supporting('bab'))})")

    def relax(l, u):
        shape = l.shape
        out = fn(np.ascontiguousarray(l).ravel(), np.ascontiguousarray(u).ravel())
        return tuple(o.reshape(shape) for o in out)

    return relax


def _scale_numpy(Lam, aU, bU, aL, bL, b_i, absb_i, zero_bL):
    """D = Lam * (aU where Lam < 0 else aL) and the constant / magnitude it picks up."""
    N, r, n = Lam.shape
    neg = Lam < 0.0
    D = Lam * np.where(neg, aU[:, None, :], aL[:, None, :])
    Df = D.reshape(N * r, n)
    const = (Df @ b_i).reshape(N, r)
    mag = (np.abs(Df) @ absb_i).reshape(N, r)
    # intercepts: Lam_j * bU_j where Lam_j < 0, Lam_j * bL_j elsewhere
    Lneg = np.minimum(Lam, 0.0)
    const += np.matmul(Lneg, bU[:, :, None])[..., 0]
    mag -= np.matmul(Lneg, np.abs(bU)[:, :, None])[..., 0]
    if not zero_bL:
        Lpos = np.maximum(Lam, 0.0)
        const += np.matmul(Lpos, bL[:, :, None])[..., 0]
        mag += np.matmul(Lpos, np.abs(bL)[:, :, None])[..., 0]
    return D, const, mag


_SCALE_NUMBA = None


def _scale_numba_kernel():
    """The fused numba twin of :func:`_scale_numpy` (one pass over Lam; compiled on first
    use, cached on disk). Same products, sums in another order."""
    global _SCALE_NUMBA
    if _SCALE_NUMBA is None:
        from numba import njit

        @njit(cache=True)
        def scale(Lam, aU, bU, aL, bL, b_i, absb_i, cols, D, const, mag):
            N, r, _ = Lam.shape
            for j in range(N):
                for i in range(r):
                    c = 0.0
                    m = 0.0
                    for kk in range(cols.shape[0]):
                        k = cols[kk]
                        v = Lam[j, i, k]
                        if v < 0.0:
                            s = aU[j, k]
                            t = bU[j, k]
                        else:
                            s = aL[j, k]
                            t = bL[j, k]
                        dv = v * s
                        D[j, i, kk] = dv
                        vt = v * t
                        c += dv * b_i[k] + vt
                        m += abs(dv) * absb_i[k] + abs(vt)
                    const[j, i] = c
                    mag[j, i] = m

        _SCALE_NUMBA = scale
    return _SCALE_NUMBA


def _scale(Lam, aU, bU, aL, bL, b_i, absb_i, zero_bL, cols):
    """D restricted to the columns ``cols`` (the others have zero slopes and intercepts in
    every box), its constant and magnitude."""
    if kernels_backend() == "numpy":
        if cols.shape[0] < Lam.shape[2]:
            Lam, aU, bU, aL, bL = (v[..., cols] for v in (Lam, aU, bU, aL, bL))
            b_i, absb_i = b_i[cols], absb_i[cols]
        return _scale_numpy(Lam, aU, bU, aL, bL, b_i, absb_i, zero_bL)
    N, r, n = Lam.shape
    D = np.empty((N, r, cols.shape[0]))
    const, mag = np.empty((N, r)), np.empty((N, r))
    _scale_numba_kernel()(Lam, aU, bU, aL, bL, b_i, absb_i, cols, D, const, mag)
    return D, const, mag


def _step(Lam, relax_i, W_i, b_i, absb_i, zero_bL):
    """One back-substitution step of the lower-bound chain through hidden layer i.

    Lam (N, r, n_i) holds the rows over a_i = act(z_i); entries >= 0 take the lower
    relaxation line, negative ones the upper. Returns the rows over a_{i-1} (N, r, n_{i-1}),
    the constant picked up (N, r), the sum of its absolute terms (N, r), and D, the
    slope-scaled rows that were multiplied by W_i (where a per-step rounding charge
    ``|D| @ v_i[cols]`` would be added; D holds only the columns ``cols`` of neurons not
    inactive in every box, the others being zero). The scaling runs in the kernels chosen by
    ``set_kernels`` (a fused numba loop, or numpy).
    """
    aU, bU, aL, bL = relax_i
    N, r, n = Lam.shape
    # columns whose neuron is inactive (zero slopes and intercepts) in every box drop out
    cols = np.flatnonzero(np.any((aU != 0.0) | (aL != 0.0) | (bU != 0.0) | (bL != 0.0), axis=0))
    D, const, mag = _scale(Lam, aU, bU, aL, bL, b_i, absb_i, zero_bL, cols)
    Wc = W_i if cols.shape[0] == n else W_i[cols]
    nxt = (D.reshape(N * r, cols.shape[0]) @ Wc).reshape(N, r, W_i.shape[1])
    return nxt, const, mag, D, cols


def _step_weights(net, i, a_prev, l, u):
    """The float64 rounding weights of the step through hidden layer i, per box: v (N, n_i)
    and t (N,) (:func:`crown_cli.engine.rounding.step_weights`, unit 2**-53), for
    |a_{i-1}| <= a_prev (N, n_{i-1}) and z_i in [l, u]. |W_i| a_prev is bounded by the rows'
    l1 norms times max a_prev, as the engine does."""
    amax = a_prev.max(axis=1, initial=0.0)
    Wa = net.rowsum[i][None, :] * amax[:, None]
    return step_weights(net.W[i].shape[0], Wa, net.absb[i], a_prev.sum(axis=1), l, u, U64)


def _act_abs(net, l, u):
    """A bound on |act(z)| for z in [l, u]: |z| scaled by the largest slope (ReLU, leaky)."""
    return np.maximum(np.abs(l), np.abs(u)) * net.act_scale


def _lower(Ws, bs, absbs, relax, zero_bL, Lam, const, c, rad, steps, rtol, lam_err=None):
    """Lower bound over the boxes (c +/- rad) of ``Lam @ a_h + const``, h = len(relax) - 1,
    and the final rows over the input. Lam (N, r, n_h), const (N, r). ``steps[i]`` = (v, t)
    of :func:`_step_weights`: each step's product rounding ``|D| @ v_i`` is charged to the
    bound (as ``crown.back_substitute`` does), with ``lam_err`` (N, r) for the rounding made
    forming Lam and const, and ``rtol`` of the final sums' magnitude."""
    cst = const.copy()
    mag = np.abs(const)
    charge = np.zeros(cst.shape) if lam_err is None else lam_err.copy()
    for i in range(len(relax) - 1, -1, -1):
        Lam, dc, dm, D, cols = _step(Lam, relax[i], Ws[i], bs[i], absbs[i], zero_bL)
        cst += dc
        mag += dm
        v, t = steps[i]
        charge += np.matmul(np.abs(D), v[:, cols, None])[..., 0] + t[:, None]
    absL = np.abs(Lam)
    lin = np.matmul(Lam, c[:, :, None])[..., 0]
    norm = np.matmul(absL, rad[:, :, None])[..., 0]
    xm = np.matmul(absL, np.abs(c)[:, :, None])[..., 0]
    lower = widen(lin - norm + cst, xm + norm + mag, -1.0, rtol, ERR_SAFETY * charge)
    return lower, Lam, cst


def _interval_step(net, k, l, u):
    """Bounds of z_k = W_k act(z_{k-1}) + b_k from z_{k-1} in [l, u] (N, n_{k-1}) by interval
    arithmetic, widened by the floating-point allowance (the activations are monotone)."""
    al, au = net.act(l), net.act(u)
    lo = al @ net.WposT[k] + au @ net.WnegT[k] + net.b[k]
    hi = au @ net.WposT[k] + al @ net.WnegT[k] + net.b[k]
    mag = np.maximum(np.abs(al), np.abs(au)) @ net.absWT[k] + net.absb[k]
    return widen(lo, mag, -1.0, net.fp_rtol), widen(hi, mag, 1.0, net.fp_rtol)


class BatchNet:
    """An MLP prepared for :func:`batch_lower_bounds` (float64 weights, |b|, relaxation)."""

    def __init__(self, weights, biases, activation="relu", alpha=None, adaptive=True):
        self.W = [np.ascontiguousarray(w, dtype=np.float64) for w in weights]
        self.b = [np.ascontiguousarray(b, dtype=np.float64) for b in biases]
        self.WT = [np.ascontiguousarray(w.T) for w in self.W]
        self.absb = [np.abs(b) for b in self.b]
        self.absW0T = np.abs(self.WT[0])
        self.absWT = [np.abs(w) for w in self.WT]
        self.WposT = [np.maximum(w, 0.0) for w in self.WT]
        self.WnegT = [np.minimum(w, 0.0) for w in self.WT]
        if activation == "leaky_relu":
            a = default_alpha("leaky_relu") if alpha is None else float(alpha)
            # the interval step needs a monotone activation (alpha >= 0)
            self.act = None if a < 0.0 else (lambda z: np.where(z >= 0.0, z, a * z))  # noqa: E731
        else:
            self.act = lambda z: np.maximum(z, 0.0)  # noqa: E731
        self.activation, self.alpha = activation, alpha
        self.relax = _relaxation(activation, alpha, adaptive)
        self.zero_bL = activation == "relu"  # ReLU's lower lines pass through 0
        # rows [W_k; -W_k]: lower bounds of both give z_k's lower and (negated) upper bound
        self.pm = [np.concatenate([w, -w]) for w in self.W]
        self.pmb = [np.concatenate([b, -b]) for b in self.b]
        self.rowsum = [np.abs(w).sum(axis=1) for w in self.W]
        self.fp_rtol = final_sum_rtol(self.W)
        self.act_scale = max(1.0, abs(float(default_alpha("leaky_relu") if alpha is None else alpha))) \
            if activation == "leaky_relu" else 1.0

    @property
    def num_hidden(self):
        return len(self.W) - 1


def batch_lower_bounds(weights, biases, lo, hi, A, activation="relu", alpha=None,
                       adaptive=True, net: Optional[BatchNet] = None, parent_bounds=None,
                       skip_stable: bool = False):
    """CROWN lower bounds of ``A @ f(x)`` over each box ``[lo[j], hi[j]]``.

    weights[k] (n_{k+1}, n_k), biases[k] (n_{k+1},) of a ReLU (or leaky ReLU, negative slope
    ``alpha``) MLP; lo, hi (N, d); A (m, n_out). Returns ``(lb (N, m), info)`` with info:

    - ``"Lam"`` (N, m, d): the final linear coefficients over the input of each row's bound
      (the bound is ``Lam x + const`` minimised over the box, attained at the corner
      ``x_i = lo_i`` where ``Lam_i > 0`` else ``hi_i``);
    - ``"const"`` (N, m): its constant: ``A f(x) >= Lam x + const`` on the box, up to the
      floating-point allowance by which ``lb`` lies below ``min (Lam x + const)``;
    - ``"bounds"``: per hidden layer (l, u), each (N, n_k): the pre-activation bounds used;
    - ``"state"``: (relaxations, rounding weights per step, |a_h| bound, box centres, radii),
      what :func:`alpha_row_bound` needs to re-bound a row on the same boxes.

    Per box the result is what ``crown.margin_lower_bound(net, *Box(lo, hi).args(),
    relax_fn, A)`` computes (same relaxations, same widening rule; only the order of float
    sums differs). ``parent_bounds`` (optional, list of (l, u) per hidden layer, each (N, n_k))
    holds bounds known to hold on each box (e.g. a parent box's): the new bounds are
    intersected with them, which only tightens.

    ``skip_stable``: first bound each hidden layer by one interval step from the previous
    layer's bounds (:func:`_interval_step`); only the rows unstable under it (per box, padded
    to the batch's largest count) are back-substituted, and their CROWN bounds intersected
    with the interval ones. A stable neuron's relaxation depends only on its sign, so this
    gives the engine's bound or a tighter one (when the interval proves a neuron stable that
    CROWN does not), at a fraction of the rows once most neurons are stable.

    Floating point: see the module docstring; every step passes through :func:`_step`, where
    the slope-scaled matrix D is formed before the product with W_i.
    """
    if net is None:
        net = BatchNet(weights, biases, activation, alpha, adaptive)
    lo = np.atleast_2d(np.asarray(lo, dtype=np.float64))
    hi = np.atleast_2d(np.asarray(hi, dtype=np.float64))
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    N = lo.shape[0]
    c, rad = centre_radius(lo, hi)
    skip_stable = skip_stable and net.act is not None
    bounds, relax, steps = [], [], []
    if net.num_hidden:
        center = c @ net.WT[0] + net.b[0]
        cmag = np.abs(c) @ net.absW0T + net.absb[0]
        n1 = rad @ net.absW0T
        mag = cmag + n1
        l = widen(center - n1, mag, -1.0, net.fp_rtol)
        u = widen(center + n1, mag, 1.0, net.fp_rtol)
        if parent_bounds is not None:
            l, u = np.maximum(l, parent_bounds[0][0]), np.minimum(u, parent_bounds[0][1])
        bounds.append((l, u))
        relax.append(net.relax(l, u))
        steps.append(_step_weights(net, 0, np.abs(c) + rad, l, u))
    for k in range(1, net.num_hidden):
        n = net.W[k].shape[0]
        if skip_stable:
            l, u = _interval_step(net, k, *bounds[-1])
            if parent_bounds is not None:
                l, u = np.maximum(l, parent_bounds[k][0]), np.minimum(u, parent_bounds[k][1])
            unstable = (l < 0.0) & (u > 0.0)
            R = int(unstable.sum(axis=1).max()) if N else 0
            if R > FULL_ROWS * n:  # gathering rows per box would not pay: all rows
                Lam = np.broadcast_to(net.pm[k][None], (N,) + net.pm[k].shape)
                const = np.broadcast_to(net.pmb[k][None], (N, 2 * n))
                low, _, _ = _lower(net.W, net.b, net.absb, relax, net.zero_bL, Lam, const, c,
                                   rad, steps, net.fp_rtol)
                l, u = np.maximum(l, low[:, :n]), np.minimum(u, -low[:, n:])
            elif R:
                # per box the rows still unstable first (padded with others: any row's CROWN
                # bound is valid, so padding only recomputes a stable row)
                idx = np.argsort(~unstable, axis=1, kind="stable")[:, :R]
                Wr = net.W[k][idx]  # (N, R, n_{k-1})
                Lam = np.concatenate([Wr, -Wr], axis=1)
                br = net.b[k][idx]
                const = np.concatenate([br, -br], axis=1)
                low, _, _ = _lower(net.W, net.b, net.absb, relax, net.zero_bL, Lam, const, c,
                                   rad, steps, net.fp_rtol)
                rows = np.arange(N)[:, None]
                l[rows, idx] = np.maximum(l[rows, idx], low[:, :R])
                u[rows, idx] = np.minimum(u[rows, idx], -low[:, R:])
        else:
            Lam = np.broadcast_to(net.pm[k][None], (N,) + net.pm[k].shape)
            const = np.broadcast_to(net.pmb[k][None], (N, 2 * n))
            low, _, _ = _lower(net.W, net.b, net.absb, relax, net.zero_bL, Lam, const, c, rad,
                               steps, net.fp_rtol)
            l, u = low[:, :n], -low[:, n:]
            if parent_bounds is not None:
                l, u = np.maximum(l, parent_bounds[k][0]), np.minimum(u, parent_bounds[k][1])
        bounds.append((l, u))
        relax.append(net.relax(l, u))
        steps.append(_step_weights(net, k, _act_abs(net, *bounds[-2]), l, u))
    Lam = A @ net.W[-1]
    const = A @ net.b[-1]
    # the rounding of A @ W[-1] and A @ b[-1] as they act on the last layer (as
    # product_rounding): gamma_m (|A| |W[-1]| |a_h| + |A| |b[-1]|) per box and row
    a_h = _act_abs(net, *bounds[-1]) if bounds else np.abs(c) + rad
    absA = np.abs(A)
    lam_err = margin_rows_rounding(A.shape[1], (a_h @ net.absWT[-1]) @ absA.T,
                                   (absA @ net.absb[-1])[None, :])
    lb, LamX, cst = _lower(net.W, net.b, net.absb, relax, net.zero_bL,
                           np.broadcast_to(Lam[None], (N,) + Lam.shape),
                           np.broadcast_to(const[None], (N, A.shape[0])), c, rad, steps,
                           net.fp_rtol, lam_err)
    return lb, {"Lam": LamX, "const": cst, "bounds": bounds,
                "state": (relax, steps, a_h, c, rad)}


def _alpha_steer(net, relax, unst, lam_h, const_h, lo, hi, iters, lr):
    """Projected Adam ascent (float64, steering only: nothing here is sound) of the lower
    bound of one row per box, ``lam_h a_h + const_h`` (N, n_h), N, over the free lower slopes
    in [0, 1] of the unstable ReLUs (``unst[k]`` (N, n_k)), the other slopes and every
    intermediate bound fixed. Returns the best slopes seen per layer (N, n_k) (CROWN's where
    nothing improved).

    The bound is ``Lam_x . x* + const`` with x* the minimising corner; its derivative in the
    lower slope of neuron j of layer k (used where the row's coefficient Lam_kj >= 0) is
    ``Lam_kj z_kj(x*)``, z_k the layer's pre-activation through the chosen relaxation lines
    (one forward pass at x*)."""
    H = len(relax)
    alpha = [np.where(unst[k], relax[k][2], 0.0) for k in range(H)]
    best_a = [a.copy() for a in alpha]
    best = np.full(lam_h.shape[0], -np.inf)
    m1 = [np.zeros_like(a) for a in alpha]
    m2 = [np.zeros_like(a) for a in alpha]
    b1, b2, eps = 0.9, 0.999, 1e-12
    for it in range(iters + 1):
        Lam, const = lam_h, const_h.copy()
        lams, slopes, icpts = [None] * H, [None] * H, [None] * H
        for k in range(H - 1, -1, -1):
            aU, bU, aL, bL = relax[k]
            neg = Lam < 0.0
            sl = np.where(neg, aU, np.where(unst[k], alpha[k], aL))
            ic = np.where(neg, bU, bL)
            lams[k], slopes[k], icpts[k] = Lam, sl, ic
            D = Lam * sl
            const = const + np.sum(Lam * ic, axis=1) + D @ net.b[k]
            Lam = D @ net.W[k]
        x = np.where(Lam > 0.0, lo, hi)
        val = np.sum(Lam * x, axis=1) + const
        better = val > best
        best[better] = val[better]
        for k in range(H):
            best_a[k][better] = alpha[k][better]
        if it == iters:
            break
        g = x
        for k in range(H):
            z = g @ net.WT[k] + net.b[k]
            grad = np.where(unst[k] & (lams[k] >= 0.0), lams[k] * z, 0.0)
            g = slopes[k] * z + icpts[k]
            m1[k] = b1 * m1[k] + (1 - b1) * grad
            m2[k] = b2 * m2[k] + (1 - b2) * grad * grad
            mh = m1[k] / (1 - b1 ** (it + 1))
            vh = m2[k] / (1 - b2 ** (it + 1))
            step = np.clip(alpha[k] + lr * mh / (np.sqrt(vh) + eps), 0.0, 1.0)
            alpha[k] = np.where(unst[k] & np.isfinite(step), step, alpha[k])
    return best_a


def alpha_row_bound(net, info, lo, hi, A, rows, iters: int = 10, lr: float = 0.3):
    """A float64-verified lower bound of ``A[rows[j]] f(x)`` over box j with the unstable
    ReLUs' lower slopes optimised for that row (alpha-CROWN on the last layer: the hidden
    layers' bounds are those of ``info``, from :func:`batch_lower_bounds` on the same boxes
    and A). ReLU networks only. The slopes come from :func:`_alpha_steer`; the bound is then
    computed by :func:`_lower` exactly as :func:`batch_lower_bounds` computes the rows' (any
    slope in [0, 1] gives a valid lower line ``a z <= relu(z)``; the rounding charges hold for
    any slopes, as for the chord's). Returns (lb (N,), the row's input coefficients (N, d),
    the relaxation used: per hidden layer (aU, bU, aL, bL), each (N, n_k))."""
    relax, steps, a_h, c, rad = info["state"]
    lo = np.broadcast_to(lo, c.shape)
    hi = np.broadcast_to(hi, c.shape)
    unst = [(l < 0.0) & (u > 0.0) for l, u in info["bounds"]]
    a = A[rows]  # (N, n_out)
    lam_h = a @ net.W[-1]
    const_h = a @ net.b[-1]
    alpha = _alpha_steer(net, relax, unst, lam_h, const_h, lo, hi, iters, lr)
    relax2 = [(aU, bU, np.where(un, al, aL), bL)
              for (aU, bU, aL, bL), un, al in zip(relax, unst, alpha)]
    absa = np.abs(a)
    lam_err = margin_rows_rounding(A.shape[1], np.sum((a_h @ net.absWT[-1]) * absa, axis=1),
                                   absa @ net.absb[-1])
    lb, LamX, _ = _lower(net.W, net.b, net.absb, relax2, net.zero_bL, lam_h[:, None, :],
                            const_h[:, None], c, rad, steps, net.fp_rtol, lam_err[:, None])
    return lb[:, 0], LamX[:, 0], relax2


# ------------------------------------------------------------------------------------------
# branch and bound
# ------------------------------------------------------------------------------------------

def _concat_info(infos):
    """The infos of :func:`batch_lower_bounds` on consecutive blocks of boxes, as one."""
    if len(infos) == 1:
        return infos[0]
    cat = np.concatenate
    out = {k: cat([i[k] for i in infos]) for k in ("Lam", "const")}
    out["bounds"] = [(cat([i["bounds"][k][0] for i in infos]),
                      cat([i["bounds"][k][1] for i in infos]))
                     for k in range(len(infos[0]["bounds"]))]
    st = [i["state"] for i in infos]
    relax = [tuple(cat([s[0][k][q] for s in st]) for q in range(4)) for k in range(len(st[0][0]))]
    steps = [tuple(cat([s[1][k][q] for s in st]) for q in range(2)) for k in range(len(st[0][1]))]
    out["state"] = (relax, steps) + tuple(cat([s[q] for s in st]) for q in (2, 3, 4))
    return out


def _bound_blocked(net, lo, hi, A, block, parent_bounds=None, skip_stable=True):
    """batch_lower_bounds over blocks of ``block`` boxes (keeps the temporaries small); the
    blocks' infos concatenated."""
    N = lo.shape[0]
    if N <= block:
        return batch_lower_bounds(None, None, lo, hi, A, net=net, parent_bounds=parent_bounds,
                                  skip_stable=skip_stable)
    lbs, infos = [], []
    for s in range(0, N, block):
        sl = slice(s, min(N, s + block))
        pb = None if parent_bounds is None else [(l[sl], u[sl]) for l, u in parent_bounds]
        lb, info = batch_lower_bounds(None, None, lo[sl], hi[sl], A, net=net, parent_bounds=pb,
                                      skip_stable=skip_stable)
        lbs.append(lb)
        infos.append(info)
    return np.concatenate(lbs), _concat_info(infos)


def _take_info(info, idx):
    """The info of the boxes ``idx`` (an index array or mask) only."""
    relax, steps, a_h, c, rad = info["state"]
    return {"Lam": info["Lam"][idx], "const": info["const"][idx],
            "bounds": [(l[idx], u[idx]) for l, u in info["bounds"]],
            "state": ([tuple(v[idx] for v in r) for r in relax],
                      [tuple(v[idx] for v in t) for t in steps], a_h[idx], c[idx], rad[idx])}


def _split(lo, hi, dim):
    """Children of each box (rows) halved along dim[j]: (lo1, hi1, lo2, hi2). The midpoint
    0.5 lo + 0.5 hi lies in [lo, hi], so the two halves cover the box exactly."""
    rows = np.arange(lo.shape[0])
    mid = 0.5 * lo[rows, dim] + 0.5 * hi[rows, dim]
    hi1 = hi.copy()
    hi1[rows, dim] = mid
    lo2 = lo.copy()
    lo2[rows, dim] = mid
    return lo, hi1, lo2, hi


def _splittable(lo, hi):
    """Dimensions whose midpoint differs from both ends (a split makes progress)."""
    mid = 0.5 * lo + 0.5 * hi
    return (mid > lo) & (mid < hi)


def input_split(weights, biases, activation, alpha, lo, hi, A, b, deadline: float,
                max_domains: int = 200_000, batch: int = 256, split: str = "trial",
                block: int = 32, adaptive: bool = True, skip_stable: bool = True,
                trial_dims: int = 3, alpha_iters: int = 10, widest: float = 4.0,
                inherit: bool = True,
                progress: Optional[Callable[[int, int, float], None]] = None) -> BabResult:
    """Decide whether some x in [lo, hi] has ``A f(x) <= b`` (all rows) by input splitting.

    ``unsat``: every sub-box has some row i with a float64-verified lower bound of
    ``A_i f(x)`` (CROWN's, or alpha-CROWN's on the last layer) above ``b_i`` rounded up one
    ulp. ``sat``: a point x of [lo, hi] (checked exactly) whose float64 forward pass
    satisfies every row. ``unknown``: more than ``max_domains`` open sub-boxes, or a sub-box
    that can no longer be split. ``timeout``: ``deadline`` (time.monotonic()) passed.

    Each round takes the ``batch`` open sub-boxes with the lowest score (worst bound first),
    bounds them at once, drops the proven ones, tries candidate points of the rest (centre and,
    per row, the corner minimising the row's linear bound) and splits them in two at the
    midpoint of one input dimension chosen by ``split``:

    - ``"sensitivity"``: the dimension maximising ``sum_i |Lam_i,j| (hi_j - lo_j)`` over the
      unproven rows i (how much the linear bound's range over the box owes to dimension j);
    - ``"trial"``: bound both halves for each of the ``trial_dims`` dimensions ranked first by
      the sensitivity rule and for one more, the dimension widest relative to [lo, hi], when
      it is not ranked and at least ``widest`` times as wide (relative) as every ranked one
      (0: never), all in the same batch; keep the split maximising ``min(s1, 0) + min(s2,
      0)`` for the halves' scores ``s = max_i (lb_i - b_i)`` (each at least its parent's), or
      when no split improves on the parent the sensitivity rule's first choice; the halves
      kept are already bounded. (Without the widest candidate, ACAS Xu 3_3 prop_2 halved X_1
      down to 2**-19 of its range while X_2, which the bounds needed split, stayed at 2**-5;
      trying it at every split instead cost about 1.5x the time on the easier instances.)

    ``alpha_iters`` (ReLU only; 0: off): the boxes left open (with "trial" the halves kept,
    with "sensitivity" the boxes bounded) get their best row re-bounded with the unstable
    neurons' lower slopes optimised (:func:`alpha_row_bound`, that many steps) before they
    are split, the score raised to the better bound.
    ``inherit`` ("trial"): every open box keeps its hidden layers' bounds, and its halves'
    are intersected with them (``parent_bounds`` of :func:`batch_lower_bounds`).
    ``skip_stable``: see :func:`batch_lower_bounds` (``block`` boxes are bounded at a time).

    ``progress(domains, open, worst)``: called after every round with the sub-boxes bounded so
    far, the open sub-boxes and the lowest open score (inf when none is open).
    """
    if split not in SPLIT_RULES:
        raise ValueError(f"input_split: unknown split rule '{split}'")
    lo0 = np.asarray(lo, dtype=np.float64).ravel()
    hi0 = np.asarray(hi, dtype=np.float64).ravel()
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    b = np.asarray(b, dtype=np.float64).ravel()
    b_up = np.nextafter(b, np.inf)
    weights = [np.asarray(w, dtype=np.float64) for w in weights]
    biases = [np.asarray(v, dtype=np.float64) for v in biases]
    net = BatchNet(weights, biases, activation, alpha, adaptive)
    d = lo0.size
    span = np.where(hi0 > lo0, hi0 - lo0, 1.0)
    stats = {"domains": 0, "peak": 1, "splits": 0}

    def result(res, x=None, open_scores=None, note=""):
        worst = np.nan
        if open_scores is not None and open_scores.size:
            worst = float(np.min(open_scores))
        return BabResult(res, x, stats["domains"], stats["peak"], worst, splits=stats["splits"],
                         note=note)

    def bound(L, H, PB=None):
        """Per box: the rows' bounds lb - b_up, the rows' input coefficients, the score, the
        info of batch_lower_bounds."""
        pb = None if PB is None else unpack(PB)
        lb, info = _bound_blocked(net, L, H, A, block, parent_bounds=pb, skip_stable=skip_stable)
        stats["domains"] += L.shape[0]
        lb = np.where(np.isnan(lb), -np.inf, lb - b_up)  # a NaN bound proves nothing
        s = np.max(lb, axis=1) if lb.shape[1] else np.full(lb.shape[0], -np.inf)
        return lb, info["Lam"], s, info

    widths = [w.shape[0] for w in net.W[:-1]]
    inherit = inherit and split == "trial" and net.num_hidden > 0

    def pack(bounds):  # per hidden layer (l, u) -> (N, 2 sum n_k)
        return np.concatenate([v for lu in bounds for v in lu], axis=1)

    def unpack(P):
        out, at = [], 0
        for n_k in widths:
            out.append((P[:, at:at + n_k], P[:, at + n_k:at + 2 * n_k]))
            at += 2 * n_k
        return out

    use_alpha = alpha_iters > 0 and activation == "relu" and net.num_hidden > 0 and A.shape[0]

    def refine(L, H, lb, s, info, idx):
        """alpha-CROWN on the best row of the boxes idx (unproven): their scores raised."""
        if not use_alpha or not idx.size:
            return s
        rows = np.argmax(lb[idx], axis=1)
        la, _, _ = alpha_row_bound(net, _take_info(info, idx), L[idx], H[idx], A, rows,
                                iters=alpha_iters)
        s = s.copy()
        s[idx] = np.fmax(s[idx], la - b_up[rows])  # a NaN bound proves nothing
        return s

    def attack(L, H, lb, Lam):
        """Candidate points of the boxes: centres and each row's minimising corner."""
        pts = [0.5 * L + 0.5 * H]
        for i in range(A.shape[0]):
            pts.append(np.where(Lam[:, i, :] > 0.0, L, H))
        X = np.clip(np.concatenate(pts), lo0, hi0)
        hit = violations(weights, biases, activation, alpha, lo0, hi0, A, b, X)
        return X[np.argmax(hit)].copy() if hit.any() else None

    # open boxes; in "trial" mode they carry their own bound (score = own), else the parent's
    def sensitivity(lb, Lam):  # sum over the unproven rows of |Lam_i,j|: (n, d)
        return np.sum(np.abs(Lam) * (lb <= 0.0)[:, :, None], axis=1)

    Lo, Hi = lo0[None].copy(), hi0[None].copy()
    S = np.full(1, -np.inf)
    G = np.zeros((1, d))  # trial: each open box's sensitivity (the fallback split rule)
    P = np.zeros((1, 0))  # inherit: each open box's hidden bounds (packed)
    if split == "trial":
        lb, Lam, S, info = bound(Lo, Hi)
        if inherit:
            P = pack(info["bounds"])
        S = refine(Lo, Hi, lb, S, info, np.flatnonzero(S <= 0.0))
        G = sensitivity(lb, Lam)
        x = attack(Lo, Hi, lb, Lam)
        if x is not None:
            return result("sat", x)
        if S[0] > 0.0:
            return result("unsat")
    while Lo.shape[0]:
        if time.monotonic() >= deadline:
            return result("timeout", open_scores=S)
        if Lo.shape[0] > max_domains:
            return result("unknown", open_scores=S, note="domain cap")
        n = Lo.shape[0]
        if n > batch:
            take = np.argpartition(S, batch - 1)[:batch]
            keep = np.ones(n, bool)
            keep[take] = False
            L, H, Sb, Gb, Pb = Lo[take], Hi[take], S[take], G[take], P[take]
            Lo, Hi, S, G, P = Lo[keep], Hi[keep], S[keep], G[keep], P[keep]
        else:
            L, H, Sb, Gb, Pb = Lo, Hi, S, G, P
            Lo, Hi, S, G, P = Lo[:0], Hi[:0], S[:0], G[:0], P[:0]
        ok = _splittable(L, H)
        if split == "sensitivity":
            lb, Lam, s, info = bound(L, H)
            s = refine(L, H, lb, s, info, np.flatnonzero(s <= 0.0))
            live = s <= 0.0
            L, H, lb, Lam, s, ok = L[live], H[live], lb[live], Lam[live], s[live], ok[live]
            if not L.shape[0]:
                continue
            x = attack(L, H, lb, Lam)
            if x is not None:
                return result("sat", x)
            if not ok.any(axis=1).all():
                return result("unknown", open_scores=np.r_[S, s], note="box too small to split")
            sens = sensitivity(lb, Lam) * (H - L)
            sens = np.where(ok, sens, -1.0)
            dim = np.argmax(sens, axis=1)
            l1, h1, l2, h2 = _split(L, H, dim)
            stats["splits"] += L.shape[0]
            Lo = np.concatenate([Lo, l1, l2])
            Hi = np.concatenate([Hi, h1, h2])
            S = np.concatenate([S, s, s])
            G = np.zeros((S.shape[0], d))  # unused by this rule
        else:
            if not ok.any(axis=1).all():
                return result("unknown", open_scores=np.r_[S, Sb], note="box too small to split")
            n = L.shape[0]
            # candidate dimensions: the k most sensitive splittable ones (all when k >= d)
            sens = np.where(ok, Gb * (H - L), -1.0)
            extra = widest > 0.0 and trial_dims < d
            k = min(d, trial_dims) + extra
            cand = np.argsort(-sens, axis=1, kind="stable")[:, :k]  # (n, k)
            use = np.ones((n, k), bool)  # the candidates bounded
            if extra:
                # one more candidate when some dimension is much wider (relative to the
                # case's box) than every one ranked: that one
                rel = np.where(ok, (H - L) / span, -1.0)
                wd = np.argmax(rel, axis=1)
                top = np.take_along_axis(rel, cand[:, :k - 1], axis=1).max(axis=1)
                ranked = np.any(cand[:, :k - 1] == wd[:, None], axis=1)
                use[:, k - 1] = ~ranked & (rel[np.arange(n), wd] >= widest * top)
                cand[:, k - 1] = np.where(use[:, k - 1], wd, cand[:, 0])
            cand_ok = np.take_along_axis(ok, cand, axis=1) & use
            kids_lo, kids_hi = [], []
            for t in range(k):
                l1, h1, l2, h2 = _split(L, H, cand[:, t])
                kids_lo += [l1, l2]
                kids_hi += [h1, h2]
            used = np.repeat(use.ravel(), 2)  # per (box, cand, half)
            KL = np.stack(kids_lo, axis=1).reshape(n * 2 * k, d)[used]  # box-major
            KH = np.stack(kids_hi, axis=1).reshape(n * 2 * k, d)[used]
            PK = np.repeat(Pb, 2 * k, axis=0)[used] if inherit else None
            lb, Lam, s, info = bound(KL, KH, PK)
            live = s <= 0.0
            if live.any():
                x = attack(KL[live], KH[live], lb[live], Lam[live])
                if x is not None:
                    return result("sat", x)
            sf = np.full(n * 2 * k, -np.inf)
            sf[used] = s
            # A half is never worse than its parent (the parent's bound holds on it).
            s2 = np.maximum(sf.reshape(n, k, 2), Sb[:, None, None])
            # the split leaving the least total deficit (a proven half counts 0); the worse
            # half alone would prefer a dimension that changes nothing over one that proves a half
            deficit = np.where(cand_ok, np.minimum(s2, 0.0).sum(axis=2), -np.inf)
            best = np.argmax(deficit, axis=1)
            # no split improves (all tie with the parent): the most sensitive dimension, else
            # argmax's first index could halve one dimension forever
            flat = deficit.max(axis=1) - 2.0 * np.minimum(Sb, 0.0) <= FLAT * np.abs(Sb)
            best[flat] = 0
            stats["splits"] += n
            pick = (np.arange(n)[:, None] * 2 * k + best[:, None] * 2 + np.arange(2)[None]).ravel()
            pick = (np.cumsum(used) - 1)[pick]  # candidate 0 is always bounded
            pick = pick[live[pick]]
            # the halves kept: alpha-CROWN on those still open
            s = refine(KL, KH, lb, s, info, pick)
            pick = pick[s[pick] <= 0.0]
            Lo = np.concatenate([Lo, KL[pick]])
            Hi = np.concatenate([Hi, KH[pick]])
            S = np.concatenate([S, s[pick]])
            G = np.concatenate([G, sensitivity(lb[pick], Lam[pick])])
            if inherit:
                P = np.concatenate([P, pack([(l[pick], u[pick]) for l, u in info["bounds"]])])
        stats["peak"] = max(stats["peak"], Lo.shape[0])
        if progress is not None:
            progress(stats["domains"], Lo.shape[0], float(S.min()) if S.size else np.inf)
    return result("unsat")
