"""alpha-CROWN on a graph network: the lower slopes of the unstable ReLU (and leaky ReLU,
slope <= 1) neurons, max pools' lower lines and products' planes optimised for each bounded
row, over the intermediate bounds a
:class:`~crown_cli.engine.graph_bounds.GraphBounds` holds (CROWN's, or themselves optimised
this way with ``intermediate="alpha"``).

Any slope a in [leak, 1] gives a valid lower line ``a z <= act(z)`` of an unstable neuron
(z in [l, u], l < 0 < u), so the bound at any slopes is a bound; CROWN's own choice is one
point of that box. :func:`alpha_lower` ascends the bound over the slopes (projected Adam)
with float32 steering passes (:meth:`GraphBounds.lower` with ``steer=np.float32``: the rows,
products and relaxed forward pass in float32, no rounding analysis), keeps each row's best
iterate, and bounds the rows again in float64 at those parameters, every rounding charged:
that bound, or CROWN's where it is higher, is what it returns. The slopes change which lines
are used, never how a bound is verified.

The bound of a row at fixed slopes is ``Lam_x . x* + const``, with ``Lam_x`` the row carried
back to the input and x* its minimiser over the input set; its derivative in the lower slope
of neuron j of an activation node is ``L_j z_j(x*)`` where ``L_j >= 0`` is the coefficient the
row reached that neuron with and ``z_j(x*)`` the neuron's input under the lines the row
chose below it (a forward pass of the relaxed network at x*). That is the dense engine's
last-layer steering (:func:`crown_cli.engine.dense_boxes.alpha_row_bound`) on a graph. The
intermediate bounds are optimised the same way when the :class:`GraphBounds` is built with
``intermediate="alpha"`` (each unstable neuron's rows ``z_j`` and ``-z_j``).

A max pool's lower line ``y >= x_k*`` is likewise one point of a family: any weights w >= 0
summing to 1 over a window give ``y >= sum_k w_k x_k``; each row's weights start at CROWN's
(1 on k*) and ascend along ``L_j x_k(x*)`` by exponentiated-gradient steps, which stay on
the simplex.

A product's planes are a third family: for each sign of a row's coefficient, McCormick's two
planes on the factors' box mix as ``t P + (1 - t) P'`` with t in [0, 1] (t = 1/2: CROWN's
averaged plane); the row keeps the slopes of the mix and the intercept is the exact extreme
of the bilinear gap over the box's corners (:func:`~crown_cli.engine.node_rules.mixed_planes`),
so every t gives a valid plane. Its derivative in t is the coefficient times the slopes'
derivative applied to the factors' relaxed values less the corner's.

tanh, sigmoid and arctan nodes are a fourth (:class:`Tangents`), as in the dense engine's
alpha-CROWN (:class:`crown_cli.engine.alpha_crown.SmoothRelax`): each (row, neuron) has a
variable theta in [0, 1] that places the tangent point of the line the row's coefficient
picks (the lower where it is >= 0) within the range where every tangent is a valid line
(``sigmoid_family.tangent_ranges``; theta = 1/2 is CROWN's point). Steering passes take the
tangent ``act(d) - act'(d) d``; its derivative in theta is the coefficient times
``act''(d) dd/dtheta (z(x*) - d)``. The float64 bound takes the slope act'(d) with the exact,
rounding-padded intercept CROWN itself uses for a slope (``sound_tangent_lines``), valid for
any d, through :meth:`GraphBounds.lower`'s per-row ``lines``.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from crown_cli.engine.batch_steps import Lines
from crown_cli.engine.deadline import check_deadline
from crown_cli.engine.input_sets import Box
from crown_cli.engine.optim import Adam, AdamSettings, BestIterate
from crown_cli.engine.relaxations import sigmoid_family as sf
from crown_cli.engine.rounding import steering_quiet

STEER = AdamSettings(eps=1e-12)
# the iterations' bounds, tapes and relaxed forward passes; the best iterate's parameters
# are bounded again in float64 (every rounding charged), which is what is returned
STEER_DTYPE = np.float32
# step 0.5 shrinking by LR_DECAY a step, the dense engine's (docs/cli.md): on the resnet bench
# case's three images 20 steps end higher than at a constant 0.1 and stop 1.7x sooner
# (docs/benchmarks.md); the decay lets long runs settle (a constant 0.5 oscillates)
ITERS, LR, LR_DECAY = 20, 0.5, 0.98
# tangent points step at this share of the step size: the dense engine's defaults (0.5 for
# slopes, 0.05 for tanh, sigmoid and arctan); on an MNIST tanh / sigmoid CNN's margin rows
# 0.05 ended higher than 0.1, 0.2 and 0.5 (docs/benchmarks.md)
TANGENT_LR_RATIO = 0.1
# max pool weights: mirror ascent (Adam's per-coordinate steps spread a window's weight over
# all its inputs at once and lowered the bound on verivital's Convnet_maxpool)
POOL_LR, POOL_FLOOR = 3.0, 1e-6


def _per_node(gb, upto: Optional[int], rule: str) -> dict:
    """Node -> what the node's rule method ``rule`` (``free_slopes``, ``free_mix``) says of
    it, for the nodes up to ``upto`` where that is not None."""
    out = {}
    for i, node in enumerate(gb.g.nodes[:None if upto is None else upto + 1]):
        free = getattr(gb.plan[i], rule)(gb, i, node)
        if free is not None:
            out[i] = free
    return out


def free_slopes(gb, upto: Optional[int] = None) -> Dict[int, Tuple[np.ndarray, float]]:
    """Per activation node (up to node ``upto``) with free lower slopes: (mask of its
    unstable neurons, the least slope, leak), for ReLU and leaky ReLU with slope <= 1 (above
    1 the free line is the upper one; those keep CROWN's lines)."""
    return _per_node(gb, upto, "free_slopes")


def _minimiser(gb, Lx):
    """Per row of Lx (r, d): the point of the input set minimising ``Lx . x``."""
    q = gb.qcode
    if isinstance(q, Box):
        return np.where(Lx > 0.0, q.lo[None], q.hi[None])
    x0, eps = gb.x0[None], gb.eps
    if q == 0:
        return np.where(Lx > 0.0, x0 - eps, x0 + eps)
    if q == 1:
        n = np.linalg.norm(Lx, axis=1, keepdims=True)
        return x0 - eps * np.divide(Lx, n, out=np.zeros_like(Lx), where=n > 0.0)
    k = np.argmax(np.abs(Lx), axis=1)
    x = np.repeat(x0, Lx.shape[0], axis=0)
    rows = np.arange(Lx.shape[0])
    x[rows, k] -= eps * np.sign(Lx[rows, k])
    return x


def free_pools(gb, target: int) -> Dict[int, object]:
    """The max pool nodes up to ``target`` with a window no input dominates (their lower
    line ``y >= sum_k w_k x_k`` has free weights on the simplex): node -> its PoolLines."""
    return {i: pl for i, pl in gb.pools.items()
            if i <= target and np.any(~pl.exact & (np.sum(pl.windows >= 0, axis=1) > 1))}


def free_mixes(gb, upto: Optional[int] = None) -> Dict[int, np.ndarray]:
    """Per product node (up to node ``upto``) whose planes have a free mix: the mask of
    its free neurons (:meth:`~crown_cli.engine.node_rules.ProductRule.free_mix`)."""
    return _per_node(gb, upto, "free_mix")


TANGENT_KINDS = {"tanh": sf.TANH, "sigmoid": sf.SIGMOID, "arctan": sf.ARCTAN}


class Tangents:
    """An S-shaped activation node's valid lines as tangents: per neuron the range of
    tangent points of each side (``sigmoid_family.tangent_ranges`` on its input's bounds),
    ``cols`` the neurons with a free side, CROWN's own lines for the rest."""

    def __init__(self, gb, i: int):
        node = gb.g.nodes[i]
        p = node.inputs[0]
        self.kind, self.code = node.op.name, TANGENT_KINDS[node.op.name]
        l = np.ascontiguousarray(gb.lo[p], np.float64)
        u = np.ascontiguousarray(gb.hi[p], np.float64)
        fU, a0U, amU, a1U, fL, a0L, amL, a1L, _, _ = sf.tangent_ranges(self.code, l, u)
        self.cols = np.flatnonzero(fL | fU)
        c = self.cols
        self.bounds = np.ascontiguousarray(np.stack([l[c], u[c]]))  # (2, k): the intervals
        self.free = np.ascontiguousarray(np.stack([fL[c], fU[c]]))  # (2, k): lower, upper
        # (6, k): the lower side's range (a0, am, a1), then the upper's
        self.ranges = np.ascontiguousarray(np.stack([a0L[c], amL[c], a1L[c],
                                                     a0U[c], amU[c], a1U[c]]))
        self.crown = gb.lines[i]  # CROWN's lines (sound): the sides that are not free

    def lines(self, theta, sound: bool) -> Lines:
        """Each row's lines at its variables ``theta`` (r, k) on :attr:`cols`
        (``sigmoid_family.tangent_rows``): steering tangents in theta's dtype, or
        (``sound``) float64 lines valid on every neuron's interval: the slope act'(d) with
        the exact intercept for it, whatever d is."""
        r = theta.shape[0]
        cr = self.crown
        out = np.empty((4, r, cr.cols.size), np.float64 if sound else theta.dtype)
        for a, line in enumerate((cr.lower, cr.lower_icpt, cr.upper, cr.upper_icpt)):
            out[a] = line  # CROWN's, on every row
        sf.tangent_rows(self.code, np.ascontiguousarray(theta), self.cols, self.free,
                        self.ranges, self.bounds, sound, out)
        return Lines(cr.cols, out[0], out[2], upper_icpt=out[3], lower_icpt=out[1])

    def gradient(self, L, pos, z, theta):
        """d bound / d theta (r, k): the coefficient ``L`` times act''(d) dd/dtheta (z - d)
        on the side each row took (``pos``: the lower), 0 where that side is not free
        (``sigmoid_family.tangent_gradient_rows``)."""
        grad = np.empty_like(theta)
        sf.tangent_gradient_rows(self.code, np.ascontiguousarray(theta), self.cols, self.free,
                                 self.ranges, np.ascontiguousarray(L), np.ascontiguousarray(pos),
                                 np.ascontiguousarray(z), grad)
        return grad


def free_tangents(gb, upto: Optional[int] = None) -> Dict[int, Tangents]:
    """Per tanh, sigmoid or arctan node (up to node ``upto``) with some neuron whose line
    may move along the function: its :class:`Tangents`."""
    out = {}
    for i, node in enumerate(gb.g.nodes[:None if upto is None else upto + 1]):
        if node.kind == "activation" and node.op.name in TANGENT_KINDS \
                and gb.lines.get(i) is not None:
            t = Tangents(gb, i)
            if t.cols.size:
                out[i] = t
    return out


def free_below(gb, p: int) -> bool:
    """Whether alpha-CROWN can tighten the bounds of node p over CROWN's: some node up to p
    has free lower slopes (:func:`free_slopes`), free max pool weights (:func:`free_pools`),
    a free mix of a product's planes (:func:`free_mixes`) or free tangents
    (:func:`free_tangents`)."""
    return bool(free_slopes(gb, p) or free_pools(gb, p) or free_mixes(gb, p)
                or free_tangents(gb, p))


def simplex_ascent(w: np.ndarray, grad: np.ndarray, valid: np.ndarray,
                   lr: float = POOL_LR) -> np.ndarray:
    """One exponentiated-gradient (mirror) ascent step of weights on the simplex of each
    window's valid entries: ``w_k exp(lr g_k / max|g|)``, renormalised (a weight at 0 restarts
    from ``POOL_FLOOR``). Any result is a valid lower line; only the verified bound counts."""
    sc = np.max(np.abs(grad), axis=-1, keepdims=True)
    g = np.divide(grad, sc, out=np.zeros_like(grad), where=sc > 0.0)
    v = np.where(valid, np.maximum(w, POOL_FLOOR) * np.exp(lr * g), 0.0)
    return v / v.sum(axis=-1, keepdims=True)


def _steer_pass(gb, target, Lam, free, lines):
    """The rows' bounds at their own free parameters (:meth:`GraphBounds.lower` in
    :data:`STEER_DTYPE`: an estimate that steers; ``lines``: the tangent nodes' per-row
    lines), each row's minimiser over the input set (in that dtype), and the tape of the
    back-substitution (per visited node the rows that reached it and their lines)."""
    tape = {}
    val = gb.lower(target, Lam, free=free, tape=tape, steer=STEER_DTYPE, lines=lines or None)
    return val, _minimiser(gb, tape.pop("Lx")).astype(STEER_DTYPE, copy=False), tape


def _relaxed_forward(gb, target, x, tape, free=None, upto: Optional[int] = None):
    """Every visited node's value (up to node ``upto``, default ``target``) at the rows'
    minimisers x (r, d) through the lines each row chose (affine nodes exactly, activations
    by their chosen line, a max pool by its lower input (or the rows' weighted sum of its
    window) or its upper constant, a product by its plane)."""
    g = gb.g
    vals = [None] * (target + 1)
    # a float32 (steering) pass may overflow where float64 does not; its gradients are
    # filtered for finiteness by the callers
    with steering_quiet(x.dtype == np.float32):
        for i in range(target + 1 if upto is None else upto + 1):
            if i not in tape:
                continue
            check_deadline(gb.deadline)
            vals[i] = gb.plan[i].relaxed(gb, i, g.nodes[i], vals, x, tape, free)
    return vals


def _pool_step(gb, i, pl, L, vals, w):
    """A max pool's weights after one mirror step: d bound / d w_jk = L_j x_k(x*) on the
    rows using the lower line."""
    xin = vals[gb.g.nodes[i].inputs[0]][:, np.maximum(pl.windows, 0)]
    on = ((L >= 0.0) & ~pl.exact[None])[:, :, None]
    grad = np.where(on, L[:, :, None] * xin, 0.0)
    step = simplex_ascent(w, grad, (pl.windows >= 0)[None])
    return np.where(on & np.isfinite(step), step, w)


def _mix_gradient(gb, i, tape_i, vals):
    """A product's d bound / d mix per row (0 off its free neurons)."""
    from crown_cli.engine.node_rules import mix_gradient

    L, _, _, _, corner = tape_i
    (l1, u1, l2, u2), c1, c2 = corner
    p, q = gb.g.nodes[i].inputs
    with np.errstate(invalid="ignore"):
        grad = mix_gradient(l1, u1, l2, u2, L, vals[p], vals[q], c1, c2)
    return np.where(np.isfinite(grad), grad, 0.0)


def _steps(gb, keys, tape, vals, state, kinds, step):
    """One ascent step of every free node's parameters from a steering pass: ``state`` =
    (free, own, cols, opt) as :func:`alpha_lower` keeps them (updated in place), ``kinds`` =
    (slopes, pools, tangents), ``step`` = (iteration, learning rate)."""
    free, own, cols, opt = state
    slopes, pools, tangents = kinds
    it, lr = step
    for i in keys:
        if i not in tape:
            continue
        if i in pools:
            free[i] = own[i] = _pool_step(gb, i, pools[i], tape[i], vals, free[i])
            continue
        c = cols[i]
        z = vals[gb.g.nodes[i].inputs[0]]
        if i in slopes:  # d bound / d slope_j = L_j z_j(x*) where the lower line is taken
            L, pos = tape[i][0][:, c], tape[i][1][:, c]
            grad = np.where(pos, L * z[:, c], 0.0)
        elif i in tangents:
            grad = tangents[i].gradient(tape[i][0], tape[i][1], z, own[i])
        else:
            grad = _mix_gradient(gb, i, tape[i], vals)[:, c]
        step = opt[i].propose(own[i], grad, it + 1,
                              lr * TANGENT_LR_RATIO if i in tangents else lr)
        own[i] = np.where(np.isfinite(step), step, own[i])
        if i in free:
            free[i][:, c] = own[i]


def _float64_params(gb, i, p, cols, slope, r):
    """Node i's parameters for the float64 bound, (r, size): CROWN's own float64 values off
    the free columns ``cols``, the float32 iterate ``p`` on them, projected in float64 onto
    the valid range (``slope``: free_slopes' (mask, least slope), else a mix in [0, 1]). A
    float32 value may lie outside it: the leak 0.01 rounds below itself, and a lower slope
    below the leak is no lower line of a leaky ReLU."""
    base = gb.lines[i].lower if slope is not None else 0.5
    full = np.tile(np.broadcast_to(np.asarray(base, np.float64), gb.g.nodes[i].size), (r, 1))
    full[:, cols] = np.clip(p.astype(np.float64), 0.0 if slope is None else slope[1], 1.0)
    return full


def alpha_lower(gb, target: int, Lam: np.ndarray, iters: int = ITERS, lr: float = LR,
                patience: Optional[int] = None, tol: float = 1e-3, keep: bool = False,
                crown: Optional[np.ndarray] = None):
    """Verified float64 lower bounds of ``Lam @ value(target)`` (rows (r, size)), each the
    larger of CROWN's and the bound at the free parameters optimised for that row: the lower
    slopes of ReLU and leaky ReLU neurons, the mixes of products' McCormick planes and the
    tangent points of tanh, sigmoid and arctan neurons (projected Adam, step ``lr`` times
    :data:`LR_DECAY` per step), the max pool lower-line
    weights (mirror ascent on the simplex of each window). With ``patience``: fewer steps
    once the sum of the rows' best bounds has gained less than ``tol`` times its first size
    in ``patience`` consecutive steps (as the dense engine's alpha-CROWN stops). ``keep``:
    also the parameters of each row's best bound ({node: (r, ...)}, as
    :meth:`GraphBounds.lower` takes them as ``free``; CROWN's where nothing beat it; {}
    where nothing is free; not the tangents', which ``free`` does not take). ``crown``:
    verified lower bounds of the rows the caller already has (CROWN's), in place of
    computing them."""
    Lam = np.ascontiguousarray(Lam, dtype=np.float64)
    crown = gb.lower(target, Lam) if crown is None else crown
    slopes, pools, mixes = free_slopes(gb, target), free_pools(gb, target), \
        free_mixes(gb, target)
    tangents = free_tangents(gb, target)
    if not (slopes or pools or mixes or tangents) or iters <= 0:
        return (crown, {}) if keep else crown
    r = Lam.shape[0]
    free = {i: np.repeat(gb.lines[i].lower[None].astype(STEER_DTYPE), r, axis=0)
            for i in slopes}
    free.update({i: pl.one_hot(r) for i, pl in pools.items()})
    free.update({i: np.full((r, on.size), 0.5, STEER_DTYPE) for i, on in mixes.items()})
    keys = sorted(list(free) + list(tangents))
    # slopes and mixes are stepped on their free neurons' columns only (``cols``): the rest
    # of each (r, size) array keeps CROWN's value; pools step their whole (r, m, K) weights;
    # tangents their variables theta (r, k) on their free columns (1/2: CROWN's lines)
    cols = {i: np.flatnonzero(slopes[i][0] if i in slopes else mixes[i]) for i in free
            if i not in pools}
    own = {i: np.ascontiguousarray(free[i][:, cols[i]]) if i in cols else free[i]
           for i in free}
    for i, t in tangents.items():
        cols[i], own[i] = t.cols, np.full((r, t.cols.size), 0.5, STEER_DTYPE)
    best = BestIterate(r, *[own[i] for i in keys])
    # projected Adam on the slopes (in [least slope, 1]), the mixes and tangents (in [0, 1])
    opt = {i: Adam(own[i], STEER, lo=slopes[i][1] if i in slopes else 0.0, hi=1.0)
           for i in cols}
    top, stale, scale = -np.inf, 0, None
    # the gradients read the values of the free nodes' inputs only: the relaxed forward
    # pass stops at the last of them
    upto = max(j for i in keys for j in gb.g.nodes[i].inputs)
    for it in range(iters + 1):
        check_deadline(gb.deadline)
        lines = {i: t.lines(own[i], sound=False) for i, t in tangents.items()}
        val, x, tape = _steer_pass(gb, target, Lam, free, lines)
        best.offer(np.where(np.isfinite(val), val, -np.inf), *[own[i] for i in keys])
        if it == iters:
            break
        if patience is not None:
            obj = float(np.sum(np.fmax(best.best, crown)))
            scale = max(abs(obj), 1e-12) if scale is None else scale
            if obj > top + tol * scale:
                top, stale = obj, 0
            else:
                stale += 1
                if stale >= patience:
                    break
        vals = _relaxed_forward(gb, target, x, tape, free, upto)
        with np.errstate(over="ignore", invalid="ignore"):  # float32: steps kept if finite
            _steps(gb, keys, tape, vals, (free, own, cols, opt), (slopes, pools, tangents),
                   (it, lr * LR_DECAY ** it))
    kept, lines = {}, {}
    for i, p in zip(keys, best.params):
        if i in tangents:  # the sound lines at the best variables (projected onto [0, 1])
            lines[i] = tangents[i].lines(np.clip(p.astype(np.float64), 0.0, 1.0), sound=True)
        elif i in cols:  # CROWN's values off the free columns, the best iterate's on them
            kept[i] = _float64_params(gb, i, p, cols[i], slopes.get(i), r)
        else:
            kept[i] = p
    # the verified float64 bound at each row's best parameters; CROWN's where it is higher
    low = np.fmax(crown, gb.lower(target, Lam, free=kept, lines=lines or None))
    return (low, kept) if keep else low
