"""CROWN bound propagation for an MLP over an l_p ball (Zhang et al. 2018, Thm 3.2, Cor 3.3).

Layer k's pre-activation ``z_k = W_k a_{k-1} + b_k`` is bounded by back-substituting linear
relaxations ``aL*z + bL <= act(z) <= aU*z + bU`` of every earlier hidden layer down to the
input, then maximising/minimising the resulting linear function of x over
``||x - x0||_p <= eps`` in closed form: ``Lam x0 +/- eps * ||Lam_row||_q`` with 1/p + 1/q = 1.

Arrays in, arrays out: no files and no printing here. All inputs are assumed validated.

Floating point: in float64 every bound is widened outward by the allowances of
:mod:`crown_cli.engine.rounding` (each step's product rounding, the margin rows' rounding, the
final sums' relative allowance); float32 results only steer a search.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from crown_cli.engine.batch_steps import GemmCount, _mm  # noqa: F401 (GemmCount: scripts/bench.py)
from crown_cli.engine.input_sets import Box, dual_norms, input_abs_bound, input_terms
from crown_cli.engine.kernels import kernels
from crown_cli.engine.rounding import (ERR_SAFETY, U32, U64, final_sum_rtol, margin_rows_rounding,
                                       rounding_weights, widen)


class Relaxation:
    """Slopes/intercepts of one hidden layer plus the column sets the kernels iterate over.

    ``l``, ``u``: the interval [l, u] of the layer's pre-activation z the relaxation was built
    from (rigorous bounds on the input set). Float64 back-substitution needs them to bound
    its rounding (:func:`back_substitute`): |z| <= max(|l|, |u|), and the activation's
    magnitude follows from the lines themselves (:meth:`abs_bound`).
    """

    __slots__ = ("aU", "bU", "aL", "bL", "agree", "diff", "cols", "icols", "l", "u", "_abs",
                 "_rw")

    def __init__(self, aU, bU, aL, bL, l=None, u=None):
        self.aU, self.bU, self.aL, self.bL = aU, bU, aL, bL
        self.l, self.u = l, u
        self._abs = None  # abs_bound, cached
        self._rw = None  # (key, v, t): the float64 rounding weights of the step through it
        nonzero = (aU != 0.0) | (aL != 0.0)
        same = aU == aL
        # columns with both slopes 0 (inactive ReLUs) drop out of every product
        self.agree = np.flatnonzero(nonzero & same)
        self.diff = np.flatnonzero(nonzero & ~same)
        self.cols = np.flatnonzero(nonzero)
        self.icols = np.flatnonzero((bU != 0.0) | (bL != 0.0))

    def abs_bound(self) -> np.ndarray:
        """A bound on |act(z)| for z in [l, u], from the relaxation itself: act(z) lies
        between the two lines, and |a z + b| <= |a| max(|l|, |u|) + |b| on [l, u]. Computed
        with non-negative operations only (relative rounding, covered by ERR_SAFETY where it
        is used)."""
        if self._abs is None:
            if self.l is None:
                raise ValueError("Relaxation: float64 back-substitution needs the interval "
                                 "(l, u) the relaxation was built from")
            z = np.maximum(np.abs(self.l), np.abs(self.u))
            self._abs = np.maximum(np.abs(self.aU) * z + np.abs(self.bU),
                                   np.abs(self.aL) * z + np.abs(self.bL))
        return self._abs


class Network:
    """Weights of an MLP in float64 (and float32 on demand) plus per-norm caches."""

    TAKE_BUDGET = 192 * 2 ** 20  # bytes of cached row gathers (see take)

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray]):
        self.W = [np.ascontiguousarray(w, dtype=np.float64) for w in weights]
        self.b = [np.ascontiguousarray(b, dtype=np.float64) for b in biases]
        self._W32 = None
        self._absW = {}
        self._first_norms = {}
        self._taken = OrderedDict()  # (layer, dtype, row indices) -> gathered rows, LRU
        self._taken_bytes = 0
        # the final sums' allowance: FP_RTOL unless the network is too large for it to cover
        # gamma_N of the longest sum (see final_sum_rtol)
        self.fp_rtol = final_sum_rtol(self.W)

    @property
    def num_hidden(self) -> int:
        return len(self.W) - 1

    def weights(self, dtype) -> List[np.ndarray]:
        """The weight matrices in ``dtype`` (float64, or float32 for the fast unverified search)."""
        if np.dtype(dtype) == np.float64:
            return self.W
        if self._W32 is None:
            self._W32 = [w.astype(np.float32) for w in self.W]
        return self._W32

    def take(self, k: int, dtype, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of W[k] in ``dtype``, contiguous for BLAS.

        Cached across evaluations: the radii a search tries near its end share their sets of
        active/unstable neurons and of rows still to compute, so the same gathers recur. Kept
        as an LRU of at most ``TAKE_BUDGET`` bytes; every row in order is W[k] itself.
        """
        W = self.weights(dtype)[k]
        if idx.shape[0] == W.shape[0]:
            return W
        key = (k, W.dtype.char, idx.tobytes())
        hit = self._taken.get(key)
        if hit is not None:
            self._taken.move_to_end(key)
            return hit
        out = W[idx]
        self._taken[key] = out
        self._taken_bytes += out.nbytes
        while self._taken_bytes > self.TAKE_BUDGET and len(self._taken) > 1:
            _, old = self._taken.popitem(last=False)
            self._taken_bytes -= old.nbytes
        return out

    def abs_weights(self, k: int) -> np.ndarray:
        """|W[k]| in float64, cached."""
        if k not in self._absW:
            self._absW[k] = np.abs(self.W[k])
        return self._absW[k]

    def abs_row_sums(self, k: int) -> np.ndarray:
        """The l1 norms of W[k]'s rows (|W[k]| @ 1), cached."""
        key = ("rows", k)
        if key not in self._absW:
            self._absW[key] = np.abs(self.W[k]).sum(axis=1)  # |W[k]| itself is not kept
        return self._absW[key]

    def first_layer_norms(self, qcode) -> np.ndarray:
        if isinstance(qcode, Box):  # one per box: not cached
            return dual_norms(self.W[0], qcode)
        if qcode not in self._first_norms:
            self._first_norms[qcode] = dual_norms(self.W[0], qcode)
        return self._first_norms[qcode]


@dataclass(frozen=True)
class Charges:
    """Rounding :func:`back_substitute` is told of besides what it charges by itself.

    ``steps``: per hidden layer i the weight vector of :func:`rounding_weights` for the step
    through it (float32: unit 2**-24): the chain's rounding bound comes back as two more items
    (eL, eU) per row, NOT applied. ``lam_err`` (per row, >= 0): the rounding the caller made
    forming ``Lam`` and ``const`` (:func:`product_rounding`), charged with the float64 steps'.
    """

    steps: Optional[list] = None
    lam_err: Optional[np.ndarray] = None


def back_substitute(
    net: Network,
    relax: List[Relaxation],
    Lam: np.ndarray,
    const: np.ndarray,
    x0: np.ndarray,
    eps: float,
    qcode: int,
    want_upper: bool = True,
    dtype=np.float64,
    charges: Optional[Charges] = None,
):
    """Bounds over the ball of ``Lam @ a_h + const`` where a_h = act(z_h), h = len(relax) - 1.

    ``relax[i]`` relaxes hidden layer i (0-based), ``z_i = W[i] a_{i-1} + b[i]``, ``a_{-1} = x``.
    Returns (lower, upper) of shape (r,); ``upper`` is None unless ``want_upper``.
    With ``dtype=float32`` the matrix products run in single precision: faster, but the
    result is only an estimate (used to steer the search, never reported).

    In float64 (and no ``charges.steps``) the result is rigorous: besides the allowance of the
    final sums (``net.fp_rtol`` of their magnitude), each step's product rounding is charged a
    posteriori, ``|D| @ v_i`` for the scaled matrix D it multiplied by W[i], with v_i the
    :func:`rounding_weights` of unit 2**-53 for the interval each relaxation was built from
    (``Relaxation.l``, ``.u``) and the previous layer's |a| bound (the input layer's from
    (x0, eps, qcode)). ``charges.lam_err`` (optional, per row, >= 0) adds the rounding the
    caller made forming ``Lam`` and ``const`` (see :func:`product_rounding`).

    ``charges.steps`` (``err`` below) asks for a bound on the rounding of the chain, returned
    as two more items (eL, eU) per row, which are then NOT applied: ``lower - eL`` and
    ``upper + eU`` bound ``Lam @ a_h + const`` on the ball wherever the relaxations hold and
    the magnitudes ``err`` was built from do. ``err[i]`` is the weight vector of
    :func:`rounding_weights` for the step through hidden layer i (float32: unit 2**-24): that
    step's rounding moves the bound by at most ``|D| @ err[i]`` for the scaled matrix D it
    multiplies by W[i]. Each step is charged where it happens, against the true activations,
    so the bound does not compound through the later steps.
    """
    err = None if charges is None else charges.steps
    lam_err = None if charges is None else charges.lam_err
    b = net.b
    LU = LL = np.ascontiguousarray(Lam, dtype=dtype)
    cU = const.astype(np.float64).copy()
    cL = cU.copy()
    mU = np.abs(cU)
    mL = mU.copy()
    steps, tiny = err, 0.0
    if err is None and np.dtype(dtype) == np.float64:
        steps, tiny = _float64_steps(net, relax, x0, eps, qcode)
    if steps is not None:
        eL = np.zeros(LL.shape[0])
        eU = np.zeros(LL.shape[0]) if want_upper else None
    shared = True
    for i in range(len(relax) - 1, -1, -1):
        rl = relax[i]
        if shared:
            DS, DU, DL, dcU, dcL, dmU, dmL = kernels().relax_shared(
                LU, rl.aU, rl.bU, rl.aL, rl.bL, b[i], rl.agree, rl.diff, rl.icols
            )
            if steps is not None:
                e = kernels().absdot(DS, steps[i][rl.agree]) if rl.agree.shape[0] else 0.0
                eL += e + (kernels().absdot(DL, steps[i][rl.diff]) if rl.diff.shape[0] else 0.0)
                if want_upper:
                    eU += e + (kernels().absdot(DU, steps[i][rl.diff]) if rl.diff.shape[0] else 0.0)
            if rl.diff.shape[0]:
                Wd = net.take(i, dtype, rl.diff)
                LL = _mm(DL, Wd)
                LU = _mm(DU, Wd) if want_upper else LL
                if rl.agree.shape[0]:  # the columns both chains share: one product for both
                    P = _mm(DS, net.take(i, dtype, rl.agree))
                    LL += P
                    if want_upper:
                        LU += P
                shared = False
            else:
                LU = LL = _mm(DS, net.take(i, dtype, rl.agree))
        else:
            Wc = net.take(i, dtype, rl.cols)
            DL, dcL, dmL = kernels().relax_chain(LL, rl.aL, rl.bL, rl.aU, rl.bU, b[i], rl.cols, rl.icols)
            if steps is not None:
                eL += kernels().absdot(DL, steps[i][rl.cols])
            LL = _mm(DL, Wc)
            if want_upper:
                DU, dcU, dmU = kernels().relax_chain(LU, rl.aU, rl.bU, rl.aL, rl.bL, b[i], rl.cols, rl.icols)
                if steps is not None:
                    eU += kernels().absdot(DU, steps[i][rl.cols])
                LU = _mm(DU, Wc)
        cL += dcL
        mL += dmL
        if want_upper:
            cU += dcU
            mU += dmU
    xL = xU = 0.0  # the charges applied here (float64 without err)
    if err is None and steps is not None:
        extra = tiny if lam_err is None else lam_err + tiny
        xL = ERR_SAFETY * (eL + extra)
        if want_upper:
            xU = ERR_SAFETY * (eU + extra)
    rtol = net.fp_rtol
    linL, nL, xmL = input_terms(LL, x0, qcode)
    lower = widen(linL - eps * nL + cL, xmL + eps * nL + mL, -1.0, rtol, xL)
    upper = None
    if want_upper:
        if shared:  # both chains are the same matrix: reuse its input terms
            linU, nU, xmU = linL, nL, xmL
        else:
            linU, nU, xmU = input_terms(LU, x0, qcode)
        upper = widen(linU + eps * nU + cU, xmU + eps * nU + mU, 1.0, rtol, xU)
    if err is not None:
        return lower, upper, eL, eU
    return lower, upper


def _float64_steps(net: Network, relax: List[Relaxation], x0, eps, qcode):
    """Per hidden layer i, the float64 :func:`rounding_weights` v_i of the step through it,
    and the sum of their underflow terms.

    |W_i| |a_{i-1}| is bounded by the rows' l1 norms times max |a_{i-1}| (cached norms: no
    matrix-vector product per evaluation; looser by at most max / mean of the |a| bound).
    For i >= 1, v_i depends only on relax[i]'s interval and relax[i - 1]'s |a| bound, so it
    is cached on relax[i] keyed by that predecessor; v_0 follows the input set of the call."""
    steps, tiny = [], 0.0
    for i, rl in enumerate(relax):
        if rl.l is None:
            raise ValueError("back_substitute: float64 needs the interval (l, u) each "
                             "Relaxation was built from (Relaxation(..., l=l, u=u))")
        key = relax[i - 1] if i else None
        if i == 0 or rl._rw is None or rl._rw[0] is not key:
            a_prev = key.abs_bound() if i else input_abs_bound(x0, eps, qcode)
            Wa = net.abs_row_sums(i) * (float(np.max(a_prev)) if a_prev.size else 0.0)
            v, t = rounding_weights(net, i, a_prev, rl.l, rl.u, Wa, unit=U64)
            rl._rw = (key, v, t)
        steps.append(rl._rw[1])
        tiny += rl._rw[2]
    return steps, tiny


def product_rounding(net, C: np.ndarray, relax, x0, eps, qcode):
    """Per row of C, a bound on the rounding of ``Lam = C @ W[-1]`` and ``const = C @ b[-1]``
    in float64 as it acts on the set: gamma_m (|C| |W[-1]| |a_h| + |C| |b[-1]|), m = the
    number of outputs, |a_h| bounded by the last relaxation (or the input set). For
    :func:`back_substitute`'s ``lam_err``."""
    a = relax[-1].abs_bound() if relax else input_abs_bound(x0, eps, qcode)
    absC = np.abs(C)
    return margin_rows_rounding(C.shape[1], absC @ (net.abs_weights(len(net.W) - 1) @ a),
                                absC @ np.abs(net.b[-1]))


def first_layer_center(net: Network, x0: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``W0 x0 + b0`` and the sum of its absolute terms; independent of eps, so cached per image."""
    lin, _, xm = input_terms(net.W[0], x0, 0)
    return lin + net.b[0], xm + np.abs(net.b[0])


def hidden_layer_bounds(
    net: Network, x0: np.ndarray, eps: float, qcode: int, relax_fn: Callable, first=None,
    dtype=np.float64, known=None, errors=None, act_bound=None,
) -> Tuple[List[Tuple[np.ndarray, np.ndarray]], List[Relaxation]]:
    """Pre-activation bounds (l, u) and relaxations of every hidden layer at radius eps.

    ``first`` may hold :func:`first_layer_center` of x0 to skip recomputing it.
    ``known`` may hold, per hidden layer, (mask, l, u): bounds valid on this ball (e.g.
    computed for a larger radius) for the neurons in ``mask``, whose relaxation does not
    depend on the exact interval (stable ReLUs). Their rows are not back-substituted again;
    their old bounds are kept, which gives the same relaxation the recomputed ones would.
    ``known`` may also be a function (k, bounds of layers < k) -> (mask, l, u) or None; a
    function may add a fourth item, a sign hint for the other rows (see :func:`_row_bounds`).

    ``errors`` (float32 only; ``known`` then a list) is a list of one float64 array per hidden
    layer, holding for the rows in ``known`` the rounding bound that came with their bounds;
    this function fills in the other rows: [l - E, u + E] encloses z on the ball provided
    every relaxation used holds there and each earlier layer's z lies in its [l - E, u + E]
    (:mod:`crown_cli.engine.stability` checks both against rigorous bounds). ``act_bound(lo, hi)``
    bounds |act(z)| for z in [lo, hi] elementwise. Layer 0 is computed in float64 (E = 0).
    """
    if net.num_hidden == 0:
        return [], []
    center, cmag = first_layer_center(net, x0) if first is None else first
    n1 = net.first_layer_norms(qcode)
    mag = cmag + eps * n1
    l = widen(center - eps * n1, mag, -1.0, net.fp_rtol)
    u = widen(center + eps * n1, mag, 1.0, net.fp_rtol)
    bounds = [(l, u)]
    relax = [Relaxation(*relax_fn(l, u), l=l, u=u)]
    W = net.weights(dtype)
    if errors is not None:
        errors[0][:] = 0.0
        if isinstance(qcode, Box):  # |x| <= |centre| + radius on the box
            a_prev = np.abs(x0) + qcode.radius
            # cmag >= |W_0| |x0| up to its own relative rounding (cmag - |b_0| could round
            # below it by u |b_0|)
            Wa = cmag + net.first_layer_norms(qcode)
        else:
            a_prev = np.abs(x0) + eps  # |x| on every l_p ball of radius eps
            # |W_0| (|x0| + eps) from the image's cached |W_0| |x0| and the rows' l1 norms
            Wa = cmag + eps * net.first_layer_norms(0)
        steps, tiny = [], 0.0
    for k in range(1, net.num_hidden):
        if errors is not None:
            lo, hi = l - errors[k - 1], u + errors[k - 1]
            v, t = rounding_weights(net, k - 1, a_prev, lo, hi, Wa)
            steps.append(v)
            tiny += t
            a_prev = act_bound(lo, hi)
            # |W_k| |a_{k-1}|: the rounding of W_k's rows here, and the next step's weights
            Wa = net.abs_weights(k) @ a_prev
            entry = None if known is None else known[k]
            mask = entry[0] if entry is not None else np.zeros(W[k].shape[0], bool)
            l, u = (entry[1].copy(), entry[2].copy()) if entry is not None else (None, None)
            rows = np.flatnonzero(~mask)
            if rows.size:
                lr, ur, eL, eU = back_substitute(net, relax, net.take(k, dtype, rows), net.b[k][rows],
                                                 x0, eps, qcode, dtype=dtype,
                                                 charges=Charges(steps=steps))
                if l is None:
                    l, u = lr, ur
                else:
                    l[rows], u[rows] = lr, ur
                first_row = U32 * Wa[rows]  # W_k rounded to float32
                errors[k][rows] = ERR_SAFETY * (np.maximum(eL, eU) + first_row + tiny)
            bounds.append((l, u))
            relax.append(Relaxation(*relax_fn(l, u), l=l, u=u))
            continue
        entry = known(k, bounds) if callable(known) else None if known is None else known[k]
        if entry is not None and (entry[0].any() or len(entry) > 3):
            mask, kl, ku = entry[:3]
            rows = np.flatnonzero(~mask)
            l, u = kl.copy(), ku.copy()
            if rows.size:
                hint = entry[3] if len(entry) > 3 else None
                l[rows], u[rows] = _row_bounds(net, relax, k, rows, hint, x0, eps, qcode, dtype)
        else:
            l, u = back_substitute(net, relax, W[k], net.b[k], x0, eps, qcode, dtype=dtype)
        bounds.append((l, u))
        relax.append(Relaxation(*relax_fn(l, u), l=l, u=u))
    return bounds, relax


def _row_bounds(net, relax, k, rows, hint, x0, eps, qcode, dtype):
    """Bounds of the neurons ``rows`` of hidden layer k.

    ``hint`` (optional) is (sign, lo, hi): per neuron of layer k a guess of its sign
    (+1 active, -1 inactive, 0 unknown) and a rigorous interval, valid but loose. A neuron
    guessed active needs only its lower bound (> 0 proves it stable; a stable ReLU's
    relaxation does not depend on its upper bound, which is taken from the interval), one
    guessed inactive only its upper bound: one back-substitution chain instead of two. A
    wrong guess costs the other chain.
    """
    if hint is None:
        return back_substitute(net, relax, net.take(k, dtype, rows), net.b[k][rows], x0, eps,
                               qcode, dtype=dtype)
    sign, ilo, ihi = hint
    sign = sign[rows]
    l, u = ilo[rows].copy(), ihi[rows].copy()
    up, down = sign > 0, sign < 0
    if up.any():
        r = rows[up]
        l[up] = back_substitute(net, relax, net.take(k, dtype, r), net.b[k][r], x0, eps, qcode,
                                want_upper=False, dtype=dtype)[0]
    if down.any():  # the upper bound of z is minus the lower bound of -z
        r = rows[down]
        u[down] = -back_substitute(net, relax, -net.take(k, dtype, r), -net.b[k][r], x0, eps,
                                   qcode, want_upper=False, dtype=dtype)[0]
    both = ~(up & (l > 0.0)) & ~(down & (u < 0.0))
    if both.any():
        r = rows[both]
        l[both], u[both] = back_substitute(net, relax, net.take(k, dtype, r), net.b[k][r], x0,
                                           eps, qcode, dtype=dtype)
    return l, u


def margin_lower_bound(net: Network, x0: np.ndarray, eps: float, qcode: int,
                       relax_fn: Callable, C: np.ndarray, *, return_bounds: bool = False,
                       **evaluation):
    """Lower bounds over the eps-ball of the margins ``C @ logits(x)``, shape (r,).

    C (r, classes) holds rows e_c - e_t; the margin is folded into the last layer so its
    rows are back-substituted directly (paper, Section 3.1 footnote). With ``return_bounds``
    the hidden layers' (l, u) come back too. ``evaluation``: the keywords of
    :func:`hidden_layer_bounds` (``first``, ``dtype``, ``known``, ``errors``, ``act_bound``).
    """
    dtype = evaluation.get("dtype", np.float64)
    bounds, relax = hidden_layer_bounds(net, x0, eps, qcode, relax_fn, **evaluation)
    Lam = C @ net.W[-1]
    const = C @ net.b[-1]
    lam_err = (product_rounding(net, C, relax, x0, eps, qcode)
               if np.dtype(dtype) == np.float64 else None)
    lower, _ = back_substitute(net, relax, Lam, const, x0, eps, qcode, want_upper=False,
                               dtype=dtype, charges=Charges(lam_err=lam_err))
    return (lower, bounds) if return_bounds else lower
