"""The graph back-substitution's fast path: :meth:`GraphBounds.lower
<crown_cli.engine.graph_bounds.GraphBounds.lower>` with the relaxation's own lines, on the
numba kernels of :mod:`crown_cli.engine.kernels.graph_steps`.

Rows are held transposed and on their live elements only: over a node of n elements,
``(idx, Lt)`` with ``Lt`` (k, r) the coefficients of the k elements ``idx`` (every other
element's coefficient is 0 in every row; ``idx`` None: all n). A row of an intermediate
neuron's bound touches only that neuron's receptive field, and
:meth:`GraphBounds.node_bounds` groups neurons by position, so that a chunk's rows stay on a
small part of each node below. Every step is then a loop over the live elements whose body
runs along the r rows (contiguous, vectorised):

- a convolution's transpose gathers, for each input element its live outputs reach, the
  products of those outputs (at most (O / group) kh kw of them);
- an activation applies its lines element by element; a sum passes the rows on (negated);
- a dense layer is one BLAS product; other nodes (element moves, scales, pools) take the
  whole rows and run their numpy steps.

The arithmetic is that of ``GraphBounds._rows`` (the numpy path, this path's twin): the same
products, the sums in another order, which no charge depends on; the charges are the same
methods of ``GraphBounds`` (``activation_charge``, ``affine_charge``, ``pool_step``); a dead
element contributes 0 to every sum and charge.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from crown_cli.engine.deadline import check_deadline
from crown_cli.engine.rounding import U64
from crown_cli.graph.ops import Conv, Dense, Sum

Rows = Tuple[Optional[np.ndarray], np.ndarray]  # (live element indices or None, Lt (k, r))


def _full(rows: Rows, n: int) -> np.ndarray:
    idx, Lt = rows
    if idx is None:
        return Lt
    out = np.zeros((n, Lt.shape[1]))
    out[idx] = Lt
    return out


def _take(vec, idx):
    return vec if idx is None else np.ascontiguousarray(vec[idx])


def _on(rows: Rows, idx, n: int) -> np.ndarray:
    """The rows on the elements ``idx`` (a superset of theirs; None: all n)."""
    own, Lt = rows
    if idx is None:
        return _full(rows, n)
    if own is not None and own.size == idx.size:
        return Lt  # the same set (idx is a superset of own)
    out = np.zeros((idx.size, Lt.shape[1]))
    out[np.searchsorted(idx, own)] = Lt
    return out


def _conv_live(op: Conv, idx):
    """The input elements (flat indices, sorted) a convolution's transpose reaches from the
    output elements ``idx``, every channel of each input position; None: (nearly) all."""
    if idx is None:
        return None
    O, OH, OW = op.out_shape
    C, H, W = op.in_shape
    (sh, sw), (dh, dw) = op.strides, op.dilations
    pt, pl = op.pads[:2]
    kh, kw = op.weight.shape[2:]
    pos = idx % (OH * OW)
    y, x = pos // OW, pos % OW
    hit = np.zeros((H, W), bool)
    for i in range(kh):
        yy = y * sh + i * dh - pt
        for j in range(kw):
            xx = x * sw + j * dw - pl
            ok = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
            hit[yy[ok], xx[ok]] = True
    spatial = np.flatnonzero(hit.reshape(-1))
    if spatial.size > 0.75 * H * W:
        return None
    return (np.arange(C)[:, None] * (H * W) + spatial[None, :]).reshape(-1)


def fused_rows(gb, target: int, Lam: np.ndarray, kernels):
    """The rows ``Lam`` (r, size) over node ``target`` carried to the input with the
    relaxation's own lines: (rows over the flat input (r, d), constant, magnitude, charge)
    per row, as ``GraphBounds._rows`` accumulates them."""
    g = gb.g
    r = Lam.shape[0]
    const, mag, charge = np.zeros(r), np.zeros(r), np.zeros(r)
    Lx = np.zeros((r, g.input_size))
    Lam = np.asarray(Lam, np.float64)
    live = np.flatnonzero(np.any(Lam != 0.0, axis=0))
    idx0 = None if live.size > 0.75 * Lam.shape[1] else live
    pending: Dict[int, Rows] = {target: (idx0, np.ascontiguousarray(
        (Lam if idx0 is None else Lam[:, idx0]).T))}

    def give(j, rows: Rows):
        nonlocal charge
        if j not in pending:
            pending[j] = rows
            return
        n = g.nodes[j].size
        a, b = pending[j], rows
        idx = None if a[0] is None or b[0] is None else np.union1d(a[0], b[0])
        St = np.array(_on(a, idx, n), order="C")  # added into in place: our own copy
        sums = np.zeros(r)
        kernels.add_rows_t(St, np.ascontiguousarray(_on(b, idx, n)), _take(gb.absval[j], idx),
                           sums)
        charge = charge + 2.0 * U64 * sums
        pending[j] = (idx, St)

    for i in range(target, -1, -1):
        rows = pending.pop(i, None)
        if rows is None:
            continue
        check_deadline(gb.deadline)
        node = g.nodes[i]
        idx, Lt = rows
        if node.kind == "input":
            Lx[:, node.op.offset:node.op.offset + node.op.size] = _full(rows, node.size).T
        elif node.kind == "activation":
            p = node.inputs[0]
            ln, z = gb.lines[i], _take(gb.absval[p], idx)
            Dt, sums = np.empty_like(Lt), np.empty((r, 3))
            kernels.activation_step_t(np.ascontiguousarray(Lt), _take(ln.lower, idx),
                                      _take(ln.upper, idx), _take(ln.lower_icpt, idx),
                                      _take(ln.upper_icpt, idx), z, Dt, sums)
            const, mag = const + sums[:, 0], mag + sums[:, 1]
            charge = charge + gb.activation_charge(sums[:, 2], z)
            give(p, (idx, Dt))
        elif node.kind == "maxpool":
            D, dconst, dmag, dcharge = gb.pool_step(i, _full(rows, node.size).T)
            const, mag, charge = const + dconst, mag + dmag, charge + dcharge
            give(node.inputs[0], (None, np.ascontiguousarray(D.T)))
        elif isinstance(node.op, Sum):  # a negation at most, exact
            for j, s in zip(node.inputs, node.op.signs):
                give(j, (idx, Lt if s == 1.0 else -Lt))
        else:
            op = node.op
            Lt = np.ascontiguousarray(Lt)
            sums = np.empty((r, 3))
            b = np.zeros(node.size) if op.bias is None else op.bias
            kernels.affine_terms_t(Lt, _take(b, idx), _take(np.abs(b), idx),
                                   _take(gb.absfwd[i], idx), sums)
            const, mag = const + sums[:, 0], mag + sums[:, 1]
            charge = charge + gb.affine_charge(i, sums[:, 2])
            for j, moved in zip(node.inputs, _transpose(op, (idx, Lt), kernels)):
                give(j, moved)
    return Lx, const, mag, charge


def _transpose(op, rows: Rows, kernels):
    """The rows pulled back through the affine ``op``: one (idx, Lt) per input."""
    idx, Lt = rows
    r = Lt.shape[1]
    if isinstance(op, Conv):
        n_out = op.size
        src = np.full(n_out, -1, np.int64)
        if idx is None:
            src[:] = np.arange(n_out)
        else:
            src[idx] = np.arange(idx.size)
        in_idx = _conv_live(op, idx)
        targets = np.arange(op.n_in[0]) if in_idx is None else in_idx
        Gt = np.empty((targets.size, r))
        kernels.conv_transpose_t(Lt, src, targets, op.weight, np.asarray(op.in_shape, np.int64),
                                 np.asarray(op.out_shape, np.int64),
                                 *kernels.conv_args(op.strides, op.dilations, op.pads, op.group),
                                 Gt)
        return [(in_idx, Gt)]
    if isinstance(op, Dense) and not op.sparse:  # W^T Lt: one BLAS product
        W = op.W if idx is None else op.W[idx]
        return [(None, W.T @ Lt)]
    L = np.ascontiguousarray(_full(rows, op.size).T)
    return [(None, np.ascontiguousarray(P.T)) for P in op.transpose(L)]
