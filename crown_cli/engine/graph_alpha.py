"""alpha-CROWN's last stage on a graph network: the lower slopes of the unstable ReLU (and
leaky ReLU, slope <= 1) neurons optimised for each bounded row, the bounds of every
intermediate node kept as CROWN computed them (:class:`~crown_cli.engine.graph_bounds.GraphBounds`).

Any slope a in [leak, 1] gives a valid lower line ``a z <= act(z)`` of an unstable neuron
(z in [l, u], l < 0 < u), so the bound at any slopes is a bound; CROWN's own choice is one
point of that box. :func:`alpha_lower` ascends the bound over the slopes (projected Adam,
float64); every iterate's bound is computed by :meth:`GraphBounds.lower` with every rounding
charged, and it returns per row the best of them (CROWN's is the first): the slopes change
which lines are used, never how a bound is verified.

The bound of a row at fixed slopes is ``Lam_x . x* + const``, with ``Lam_x`` the row carried
back to the input and x* its minimiser over the input set; its derivative in the lower slope
of neuron j of an activation node is ``L_j z_j(x*)`` where ``L_j >= 0`` is the coefficient the
row reached that neuron with and ``z_j(x*)`` the neuron's input under the lines the row
chose below it (a forward pass of the relaxed network at x*). That is the dense engine's
last-layer steering (:func:`crown_cli.engine.batched.alpha_row_bound`) on a graph; unlike the
dense ``alpha-crown`` the intermediate bounds are not optimised.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from crown_cli.activations import default_alpha
from crown_cli.engine.input_sets import Box
from crown_cli.engine.optim import Adam, AdamSettings, BestIterate

STEER = AdamSettings(eps=1e-12)
ITERS, LR = 20, 0.1


def free_slopes(gb) -> Dict[int, Tuple[np.ndarray, float]]:
    """Per activation node with free lower slopes: (mask of its unstable neurons, the least
    slope, leak), for ReLU and leaky ReLU with slope <= 1 (above 1 the free line is the
    upper one; those keep CROWN's lines)."""
    out = {}
    for i, node in enumerate(gb.g.nodes):
        if node.kind != "activation" or node.op.name not in ("relu", "leaky_relu"):
            continue
        leak = 0.0 if node.op.name == "relu" else float(
            default_alpha("leaky_relu") if node.op.alpha is None else node.op.alpha)
        if not 0.0 <= leak <= 1.0:
            continue
        p = node.inputs[0]
        unst = (gb.lo[p] < 0.0) & (gb.hi[p] > 0.0)
        icpt = gb.lines[i].lower_icpt
        if icpt is not None:  # a free slope keeps the line through 0: only where it is one
            unst &= np.asarray(icpt) == 0.0
        if unst.any():
            out[i] = (unst, leak)
    return out


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


def _steer_pass(gb, target, Lam, slopes):
    """The rows' verified bounds at their own lower slopes on the free nodes
    (:meth:`GraphBounds.lower`), each row's minimiser over the input set, and the tape of
    the back-substitution (per visited node the rows that reached it and their lines)."""
    tape = {}
    val = gb.lower(target, Lam, slopes=slopes, tape=tape)
    return val, _minimiser(gb, tape.pop("Lx")), tape


def _relaxed_forward(gb, target, x, tape):
    """Every visited node's value at the rows' minimisers x (r, d) through the lines each
    row chose (affine nodes exactly, activations by their chosen line, a max pool by its
    lower input or its upper constant)."""
    g = gb.g
    vals = [None] * (target + 1)
    for i in range(target + 1):
        if i not in tape:
            continue
        node = g.nodes[i]
        if node.kind == "input":
            vals[i] = x[:, node.op.offset:node.op.offset + node.op.size]
        elif node.kind == "activation":
            _, _, slope, icpt = tape[i]
            vals[i] = slope * vals[node.inputs[0]] + icpt
        elif node.kind == "maxpool":
            pool, L = gb.pools[i], tape[i]
            use = (L >= 0.0) | pool.exact
            vals[i] = np.where(use, vals[node.inputs[0]][:, pool.src], pool.hi)
        else:
            vals[i] = node.op.forward([vals[j] for j in node.inputs])
    return vals


def alpha_lower(gb, target: int, Lam: np.ndarray, iters: int = ITERS, lr: float = LR):
    """Verified float64 lower bounds of ``Lam @ value(target)`` (rows (r, size)), each the
    larger of CROWN's and the bound at the lower slopes optimised for that row."""
    Lam = np.ascontiguousarray(Lam, dtype=np.float64)
    crown = gb.lower(target, Lam)
    free = {i: v for i, v in free_slopes(gb).items() if i <= target}
    if not free or iters <= 0:
        return crown
    r = Lam.shape[0]
    slopes = {i: np.repeat(gb.lines[i].lower[None], r, axis=0) for i in free}
    keys = sorted(free)
    best = BestIterate(r, *[slopes[i] for i in keys])
    opt = {i: Adam(slopes[i], STEER, lo=free[i][1], hi=1.0) for i in keys}
    for it in range(iters + 1):
        val, x, tape = _steer_pass(gb, target, Lam, slopes)
        best.offer(np.where(np.isfinite(val), val, -np.inf), *[slopes[i] for i in keys])
        if it == iters:
            break
        vals = _relaxed_forward(gb, target, x, tape)
        for i in keys:
            if i not in tape:
                continue
            L, pos = tape[i][0], tape[i][1]
            z = vals[gb.g.nodes[i].inputs[0]]
            unst = free[i][0]
            grad = np.where(unst[None] & pos, L * z, 0.0)
            step = opt[i].propose(slopes[i], grad, it + 1, lr)
            slopes[i] = np.where(unst[None] & np.isfinite(step), step, slopes[i])
    return np.fmax(crown, best.best)  # each the verified bound at the slopes kept
