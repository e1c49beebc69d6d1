"""numba kernels of the graph engine's steps: a 2-D convolution and its transpose
(:meth:`crown_cli.graph.ops.Conv.transpose`, the step every back-substitution through a
convolution takes; :meth:`~crown_cli.graph.ops.Conv.linear` on a batch), an activation's
relaxation applied to rows, and the per-row sums :meth:`crown_cli.engine.graph_bounds.
GraphBounds.lower` charges. Their numpy twins: ``Conv._conv_numpy`` and
``Conv._transpose_numpy`` (offset-by-offset products, the same products summed in another
order) and the numpy path of ``GraphBounds.lower``.

Rows carried down a convolutional network are sparse: a row over an intermediate neuron
touches only that neuron's receptive field, so the kernel visits each nonzero coefficient
once and skips the zeros (adding ``0 * w`` changes no sum). A sum gathers at most
``(O / group) * kh * kw`` products, in whatever order, which is the count the rounding charge
of :mod:`crown_cli.engine.graph_bounds` assumes.
"""
import os

import numba
import numpy as np
from numba import njit, prange

# The kernels run their rows on every core (prange). numba's default threading layer here
# is GNU OpenMP, which a forked child cannot use once the parent has started its threads
# (verify's second worker is forked); the workqueue layer can. A user's own choice
# (NUMBA_THREADING_LAYER) stands.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"


@njit(cache=True, parallel=True)
def conv_transpose(L, weight, strides, dilations, pads, group, bias, absfwd, G, out):
    """Add the transposed convolution of the rows ``L`` (r, O, OH, OW) with ``weight``
    (O, C / group, kh, kw) into ``G`` (r, C, H, W), the input without its padding (``pads``:
    top, left; a product that lands on padding is dropped). With ``out`` (r, 3), in the same
    pass per row: ``L @ bias`` (``bias`` (O,) per output channel), ``|L| @ |bias|`` and
    ``|L| @ absfwd`` (``absfwd`` (O, OH, OW)), as :func:`affine_terms`."""
    r, O, OH, OW = L.shape
    _, Cg, kh, kw = weight.shape
    H, W = G.shape[2], G.shape[3]
    Og = O // group
    sh, sw = strides[0], strides[1]
    dh, dw = dilations[0], dilations[1]
    pt, pl = pads[0], pads[1]
    for row in prange(r):
        c_sum = 0.0
        a_sum = 0.0
        w_sum = 0.0
        for o in range(O):
            c0 = (o // Og) * Cg
            b = bias[o]
            ab = abs(b)
            for y in range(OH):
                for x in range(OW):
                    v = L[row, o, y, x]
                    if v == 0.0:
                        continue
                    av = abs(v)
                    c_sum += v * b
                    a_sum += av * ab
                    w_sum += av * absfwd[o, y, x]
                    for c in range(Cg):
                        for i in range(kh):
                            yy = y * sh + i * dh - pt
                            if yy < 0 or yy >= H:
                                continue
                            for j in range(kw):
                                xx = x * sw + j * dw - pl
                                if xx < 0 or xx >= W:
                                    continue
                                G[row, c0 + c, yy, xx] += weight[o, c, i, j] * v
        out[row, 0] = c_sum
        out[row, 1] = a_sum
        out[row, 2] = w_sum


def transpose_rows(L, weight, strides, dilations, pads, group, in_shape, bias=None, absfwd=None):
    """The transposed convolution (r, C, H, W) of ``L`` (r, O, OH, OW), and the per-row sums
    (r, 3) of :func:`conv_transpose` (zeros where ``bias``/``absfwd`` are None)."""
    r, O = L.shape[:2]
    G = np.zeros((r,) + tuple(in_shape))
    out = np.empty((r, 3))
    bias = np.zeros(O) if bias is None else bias
    absfwd = np.zeros(L.shape[1:]) if absfwd is None else absfwd.reshape(L.shape[1:])
    conv_transpose(np.ascontiguousarray(L), weight, np.asarray(strides, np.int64),
                   np.asarray(dilations, np.int64), np.asarray(pads[:2], np.int64), int(group),
                   bias, absfwd, G, out)
    return G, out


@njit(cache=True, parallel=True)
def activation_step(L, lower, upper, lower_icpt, upper_icpt, absval, D, out):
    """One activation node's step of a graph back-substitution, fused: for the rows ``L``
    (r, n), ``D = L * slope`` (the lower line's where L >= 0, the upper line's elsewhere);
    per row ``out[row] = (sum of the intercept terms, sum of their magnitudes,
    sum |D| * absval)``. Twin: :func:`crown_cli.engine.chain.relax` and the sums in
    :meth:`crown_cli.engine.graph_bounds.GraphBounds.lower`."""
    r, n = L.shape
    for row in prange(r):
        c = 0.0
        m = 0.0
        ch = 0.0
        for k in range(n):
            v = L[row, k]
            if v == 0.0:
                D[row, k] = 0.0
                continue
            if v >= 0.0:
                d = v * lower[k]
                t = v * lower_icpt[k]
            else:
                d = v * upper[k]
                t = v * upper_icpt[k]
            D[row, k] = d
            c += t
            m += abs(t)
            ch += abs(d) * absval[k]
        out[row, 0] = c
        out[row, 1] = m
        out[row, 2] = ch


@njit(cache=True, parallel=True)
def affine_terms(L, bias, absbias, absfwd, out):
    """Per row of ``L`` (r, m): ``out[row] = (L @ bias, |L| @ |bias|, |L| @ absfwd)`` in one
    pass (an affine node's constant, its magnitude and the product rounding's weight)."""
    r, m = L.shape
    for row in prange(r):
        c = 0.0
        a = 0.0
        w = 0.0
        for k in range(m):
            v = L[row, k]
            if v == 0.0:
                continue
            av = abs(v)
            c += v * bias[k]
            a += av * absbias[k]
            w += av * absfwd[k]
        out[row, 0] = c
        out[row, 1] = a
        out[row, 2] = w


@njit(cache=True, parallel=True)
def add_rows(S, P, absval, charge):
    """``S += P`` in place and ``charge[row] += sum |S| * absval`` (a node receiving rows
    from a second consumer)."""
    r, n = S.shape
    for row in prange(r):
        ch = 0.0
        for k in range(n):
            s = S[row, k] + P[row, k]
            S[row, k] = s
            ch += abs(s) * absval[k]
        charge[row] += ch


@njit(cache=True, parallel=True)
def conv_forward(X, weight, strides, dilations, pads, group, Y):
    """``Y`` (N, O, OH, OW) = the convolution (no bias) of the batch ``X`` (N, C, H, W) with
    ``weight`` (O, C / group, kh, kw); ``pads``: top, left (the rest of the padding is
    implied by Y's size). Each output sums its Cg * kh * kw products in some order."""
    N, O, OH, OW = Y.shape
    _, Cg, kh, kw = weight.shape
    H, W = X.shape[2], X.shape[3]
    Og = O // group
    sh, sw = strides[0], strides[1]
    dh, dw = dilations[0], dilations[1]
    pt, pl = pads[0], pads[1]
    for n in prange(N):
        for o in range(O):
            c0 = (o // Og) * Cg
            for y in range(OH):
                for x in range(OW):
                    Y[n, o, y, x] = 0.0
            for c in range(Cg):
                for i in range(kh):
                    for j in range(kw):
                        w = weight[o, c, i, j]
                        if w == 0.0:
                            continue
                        # the x with 0 <= x * sw + j * dw - pl < W
                        off = j * dw - pl
                        xa = 0 if off >= 0 else (-off + sw - 1) // sw
                        xb = min(OW, (W - 1 - off) // sw + 1) if W - 1 - off >= 0 else 0
                        for y in range(OH):
                            yy = y * sh + i * dh - pt
                            if yy < 0 or yy >= H:
                                continue
                            for x in range(xa, xb):
                                Y[n, o, y, x] += w * X[n, c0 + c, yy, x * sw + off]


def forward_rows(X, weight, strides, dilations, pads, group, out_shape):
    """The convolution (N, O * OH * OW) of the batch ``X`` (N, C, H, W), without bias."""
    Y = np.empty((X.shape[0],) + tuple(out_shape))
    conv_forward(np.ascontiguousarray(X), weight, np.asarray(strides, np.int64),
                 np.asarray(dilations, np.int64), np.asarray(pads[:2], np.int64), int(group), Y)
    return Y.reshape(X.shape[0], -1)
