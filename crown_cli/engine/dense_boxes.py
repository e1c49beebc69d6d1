"""CROWN over many input boxes at once (ReLU / leaky ReLU MLPs): the batched engine of
input splitting.

- :func:`batch_lower_bounds`: the pre-activation bounds of every hidden layer are computed
  per box by back-substitution with the relaxations of
  :mod:`crown_cli.engine.relaxations.relu_numpy` (the same float64 operations as the
  engine's ReLU relaxation: upper chord, adaptive lower slope), then the lower bound of
  ``A f(x)`` per box. The weight matrices are shared by all boxes, so each back-substitution
  step is one large GEMM ``(N * rows, n_i) @ W_i`` over every box and row at once; only the
  slope scaling is per box. Each step is the engine's batched back-substitution
  (:mod:`crown_cli.engine.batch_steps`), its scaling fused into a numba kernel
  (:mod:`crown_cli.engine.kernels.box_steps`).
- :func:`alpha_row_bound`: one row per box re-bounded with the unstable ReLUs' lower slopes
  optimised (alpha-CROWN on the last layer, the hidden bounds kept), then verified like the
  rows of :func:`batch_lower_bounds`.

Floating point, as :mod:`crown_cli.engine.dense_crown`: the box is centre +/- radius with the
radius rounded up one ulp (:func:`crown_cli.engine.input_sets.centre_radius`); every bound is
widened outward by (1) per back-substitution step the a-posteriori charge of its products'
rounding, ``|D| @ v_i`` per box (:func:`_step_weights`, the engine's
:func:`~crown_cli.engine.rounding.step_weights` with unit 2**-53 from the box's own
intervals), (2) the rounding of ``A @ W[-1]``
(:func:`~crown_cli.engine.rounding.margin_rows_rounding`), (3) the network's final-sum
allowance (:func:`~crown_cli.engine.rounding.final_sum_rtol`) times the sum of the absolute
values of the terms (``|Lam| |c| + |Lam| r`` plus the accumulated ``|D| |b_i|`` and
``|Lam| |intercepts|`` of every step), plus ``FP_ATOL``.

Arrays in, arrays out: no files and no printing here.
"""
from __future__ import annotations

import numpy as np

from crown_cli.activations import default_alpha, supporting
from crown_cli.engine.batch_steps import Lines, Rows, relax
from crown_cli.engine.input_sets import box_lower, centre_radius
from crown_cli.engine.kernels import box_step_kernels
from crown_cli.engine.optim import Adam, AdamSettings, BestIterate
from crown_cli.engine.relaxations import relu_numpy
from crown_cli.engine.rounding import (U64, final_sum_rtol, margin_rows_rounding, step_weights,
                                       widen)

# the last-layer slope steering's Adam (float64; its own denominator guard)
STEER_ADAM = AdamSettings(eps=1e-12)
FULL_ROWS = 0.6  # skip_stable: above this share of unstable rows, back-substitute all rows


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


def _step(acc: Rows, relax_i, W_i, b_i, absb_i, zero_bL, v, t):
    """One back-substitution step of the lower-bound chain through hidden layer i, for rows
    ``acc`` (N, r, n_i) over a_i = act(z_i): entries >= 0 take the lower relaxation line,
    negative ones the upper (per box, ``relax_i`` = (aU, bU, aL, bL) each (N, n_i)); the
    step's product rounding ``|D| @ v`` + t (:func:`_step_weights`, per box) is charged.
    Columns whose neuron is inactive (zero slopes and intercepts) in every box drop out. The
    scaling runs in the kernels chosen by ``set_kernels``: the fused numba loop
    (:mod:`crown_cli.engine.kernels.box_steps`), or the engine's :func:`~crown_cli.engine.batch_steps.relax`
    (its twin)."""
    aU, bU, aL, bL = relax_i
    Lam = acc.Lam
    N, r, n = Lam.shape
    cols = np.flatnonzero(np.any((aU != 0.0) | (aL != 0.0) | (bU != 0.0) | (bL != 0.0), axis=0))
    Wc = W_i if cols.shape[0] == n else W_i[cols]
    kern = box_step_kernels()
    if kern is None:
        lines = Lines(cols, aL[:, None, cols], aU[:, None, cols], bU[:, None, cols],
                      None if zero_bL else bL[:, None, cols])
        D, icpt, _, _ = relax(Lam, lines)
        acc.step(D, icpt, b_i[cols], Wc, (v[:, cols], t), absbias=absb_i[cols])
        return
    D = np.empty((N, r, cols.shape[0]))
    const, mag = np.empty((N, r)), np.empty((N, r))
    kern.scale(Lam, aU, bU, aL, bL, b_i, absb_i, cols, D, const, mag)
    acc.add(const, mag, 0.0)
    acc.add_charge(np.abs(D), v[:, cols], t)
    acc.product(D, Wc)


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


def _lower(net, relax, Lam, const, c, rad, steps, lam_err=None):
    """Lower bound over the boxes (c +/- rad) of ``Lam @ a_h + const``, h = len(relax) - 1,
    and the final rows over the input. Lam (N, r, n_h), const (N, r). ``steps[i]`` = (v, t)
    of :func:`_step_weights`: each step's product rounding ``|D| @ v_i`` is charged to the
    bound (as ``crown.back_substitute`` does), with ``lam_err`` (N, r) for the rounding made
    forming Lam and const, and the net's ``fp_rtol`` of the final sums' magnitude."""
    acc = Rows(Lam, const.copy(), np.abs(const),
               np.zeros(const.shape) if lam_err is None else lam_err.copy())
    for i in range(len(relax) - 1, -1, -1):
        _step(acc, relax[i], net.W[i], net.b[i], net.absb[i], net.zero_bL, *steps[i])
    return box_lower(acc.Lam, acc.const, acc.mag, acc.charge, c, rad, net.fp_rtol), acc.Lam, \
        acc.const


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


def batch_lower_bounds(net: BatchNet, lo, hi, A, parent_bounds=None,
                       skip_stable: bool = False):
    """CROWN lower bounds of ``A @ f(x)`` over each box ``[lo[j], hi[j]]``.

    ``net``: the :class:`BatchNet` of a ReLU (or leaky ReLU) MLP; lo, hi (N, d); A (m, n_out).
    Returns ``(lb (N, m), info)`` with info:

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
    lo = np.atleast_2d(np.asarray(lo, dtype=np.float64))
    hi = np.atleast_2d(np.asarray(hi, dtype=np.float64))
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    c, rad = centre_radius(lo, hi)
    skip_stable = skip_stable and net.act is not None
    bounds, relax, steps = [], [], []
    if net.num_hidden:
        l, u = _first_layer(net, c, rad)
        if parent_bounds is not None:
            l, u = np.maximum(l, parent_bounds[0][0]), np.minimum(u, parent_bounds[0][1])
        bounds.append((l, u))
        relax.append(net.relax(l, u))
        steps.append(_step_weights(net, 0, np.abs(c) + rad, l, u))
    for k in range(1, net.num_hidden):
        if skip_stable:
            l, u = _interval_step(net, k, *bounds[-1])
            if parent_bounds is not None:
                l, u = np.maximum(l, parent_bounds[k][0]), np.minimum(u, parent_bounds[k][1])
            l, u = _crown_on_unstable(net, k, l, u, (relax, steps, c, rad))
        else:
            n = net.W[k].shape[0]
            low, _, _ = _lower(net, relax, *_both_sides(net, k, c.shape[0]), c, rad, steps)
            l, u = low[:, :n], -low[:, n:]
            if parent_bounds is not None:
                l, u = np.maximum(l, parent_bounds[k][0]), np.minimum(u, parent_bounds[k][1])
        bounds.append((l, u))
        relax.append(net.relax(l, u))
        steps.append(_step_weights(net, k, _act_abs(net, *bounds[-2]), l, u))
    return _margin_rows(net, A, bounds, (relax, steps, c, rad))


def _first_layer(net: BatchNet, c, rad):
    """Hidden layer 0's bounds over the boxes c +/- rad (exact up to the widening)."""
    center = c @ net.WT[0] + net.b[0]
    cmag = np.abs(c) @ net.absW0T + net.absb[0]
    n1 = rad @ net.absW0T
    mag = cmag + n1
    l = widen(center - n1, mag, -1.0, net.fp_rtol)
    u = widen(center + n1, mag, 1.0, net.fp_rtol)
    return l, u


def _both_sides(net: BatchNet, k: int, N: int):
    """Hidden layer k's rows [W_k; -W_k] and constants for each of N boxes."""
    n = net.W[k].shape[0]
    Lam = np.broadcast_to(net.pm[k][None], (N,) + net.pm[k].shape)
    const = np.broadcast_to(net.pmb[k][None], (N, 2 * n))
    return Lam, const


def _crown_on_unstable(net: BatchNet, k: int, l, u, below):
    """``skip_stable``: hidden layer k's interval bounds (l, u) (N, n_k) intersected with
    CROWN's on the rows they leave unstable (in place, or new arrays when every row is
    bounded); ``below``: the layers below (relaxations, rounding weights, box centres and
    radii)."""
    relax, steps, c, rad = below
    N, n = l.shape
    unstable = (l < 0.0) & (u > 0.0)
    R = int(unstable.sum(axis=1).max()) if N else 0
    if R > FULL_ROWS * n:  # gathering rows per box would not pay: all rows, but only the
        # unstable ones' bounds taken (what docs/proofs.md's checker re-derives)
        low, _, _ = _lower(net, relax, *_both_sides(net, k, N), c, rad, steps)
        return (np.where(unstable, np.maximum(l, low[:, :n]), l),
                np.where(unstable, np.minimum(u, -low[:, n:]), u))
    if R:
        # per box the rows still unstable first (padded with others, whose bounds stay the
        # interval's: a box's bounds do not depend on the batch it is bounded in)
        idx = np.argsort(~unstable, axis=1, kind="stable")[:, :R]
        Wr = net.W[k][idx]  # (N, R, n_{k-1})
        Lam = np.concatenate([Wr, -Wr], axis=1)
        br = net.b[k][idx]
        const = np.concatenate([br, -br], axis=1)
        low, _, _ = _lower(net, relax, Lam, const, c, rad, steps)
        rows = np.arange(N)[:, None]
        live = np.take_along_axis(unstable, idx, axis=1)  # the padding's rows left as they were
        l[rows, idx] = np.where(live, np.maximum(l[rows, idx], low[:, :R]), l[rows, idx])
        u[rows, idx] = np.where(live, np.minimum(u[rows, idx], -low[:, R:]), u[rows, idx])
    return l, u


def _margin_rows(net: BatchNet, A, bounds, below):
    """The rows ``A @ f(x)`` bounded through every hidden layer: (lb, info) of
    :func:`batch_lower_bounds`."""
    relax, steps, c, rad = below
    N = c.shape[0]
    Lam = A @ net.W[-1]
    const = A @ net.b[-1]
    # the rounding of A @ W[-1] and A @ b[-1] as they act on the last layer (as
    # product_rounding): gamma_m (|A| |W[-1]| |a_h| + |A| |b[-1]|) per box and row
    a_h = _act_abs(net, *bounds[-1]) if bounds else np.abs(c) + rad
    absA = np.abs(A)
    lam_err = margin_rows_rounding(A.shape[1], (a_h @ net.absWT[-1]) @ absA.T,
                                   (absA @ net.absb[-1])[None, :])
    lb, LamX, cst = _lower(net, relax, np.broadcast_to(Lam[None], (N,) + Lam.shape),
                           np.broadcast_to(const[None], (N, A.shape[0])), c, rad, steps,
                           lam_err)
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
    best = BestIterate(lam_h.shape[0], *alpha)
    opt = [Adam(a, STEER_ADAM, lo=0.0, hi=1.0) for a in alpha]
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
        best.offer(val, *alpha)
        if it == iters:
            break
        g = x
        for k in range(H):
            z = g @ net.WT[k] + net.b[k]
            grad = np.where(unst[k] & (lams[k] >= 0.0), lams[k] * z, 0.0)
            g = slopes[k] * z + icpts[k]
            step = opt[k].propose(alpha[k], grad, it + 1, lr)
            alpha[k] = np.where(unst[k] & np.isfinite(step), step, alpha[k])
    return best.params


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
    # the slopes as float32 values (any slope in [0, 1] holds): what a certificate stores
    alpha = [np.asarray(a).astype(np.float32).astype(np.float64) for a in alpha]
    relax2 = [(aU, bU, np.where(un, al, aL), bL)
              for (aU, bU, aL, bL), un, al in zip(relax, unst, alpha)]
    absa = np.abs(a)
    lam_err = margin_rows_rounding(A.shape[1], np.sum((a_h @ net.absWT[-1]) * absa, axis=1),
                                   absa @ net.absb[-1])
    lb, LamX, _ = _lower(net, relax2, lam_h[:, None, :], const_h[:, None], c, rad, steps,
                         lam_err[:, None])
    return lb[:, 0], LamX[:, 0], relax2


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
        return batch_lower_bounds(net, lo, hi, A, parent_bounds=parent_bounds,
                                  skip_stable=skip_stable)
    lbs, infos = [], []
    for s in range(0, N, block):
        sl = slice(s, min(N, s + block))
        pb = None if parent_bounds is None else [(l[sl], u[sl]) for l, u in parent_bounds]
        lb, info = batch_lower_bounds(net, lo[sl], hi[sl], A, parent_bounds=pb,
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


