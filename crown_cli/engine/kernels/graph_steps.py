"""numba kernels of the graph engine's steps: a 2-D convolution's transpose
(:meth:`crown_cli.graph.ops.Conv.transpose`, the step every back-substitution through a
convolution takes; the forward map is BLAS products, ``Conv._conv_gemm``), an activation's
relaxation applied to rows, and the per-row sums :meth:`crown_cli.engine.graph_bounds.
GraphBounds.lower` charges. Their numpy twins: ``Conv._conv_numpy`` and
``Conv._transpose_numpy`` (offset-by-offset products, the same products summed in another
order) and the numpy path of ``GraphBounds.lower``.

Rows carried down a convolutional network are sparse: a row over an intermediate neuron
touches only that neuron's receptive field, so a transpose runs on the output elements some
row touches and the input elements they reach (an element no row touches adds ``0 * w`` to
no sum). A sum gathers at most ``(O / group) * kh * kw`` products, in whatever order, which is
the count the rounding charge of :mod:`crown_cli.engine.graph_bounds` assumes.

The kernels spread their loops over numba's threads (prange); :data:`SERIAL` holds their
serial twins, the same functions compiled without threads, which a forked helper process
runs (:func:`crown_cli.engine.kernels.use_serial_kernels`).
"""
import types

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def conv_transpose(L, weight, strides, dilations, pads, group, G):
    """Add the transposed convolution of the rows ``L`` (r, O, OH, OW) with ``weight``
    (O, C / group, kh, kw) into ``G`` (r, C, H, W), the input without its padding (``pads``:
    top, left; a product that lands on padding is dropped), skipping zero coefficients.
    Each input element sums at most (O / group) * kh * kw products."""
    r, O, OH, OW = L.shape
    _, Cg, kh, kw = weight.shape
    H, W = G.shape[2], G.shape[3]
    Og = O // group
    sh, sw = strides[0], strides[1]
    dh, dw = dilations[0], dilations[1]
    pt, pl = pads[0], pads[1]
    for row in prange(r):
        for o in range(O):
            c0 = (o // Og) * Cg
            for y in range(OH):
                for x in range(OW):
                    v = L[row, o, y, x]
                    if v == 0.0:
                        continue
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


def transpose_rows(L, weight, strides, dilations, pads, group, in_shape):
    """The transposed convolution (r, C, H, W) of the rows ``L`` (r, O, OH, OW), row by row
    (for rows sparse within the elements they touch together)."""
    G = np.zeros((L.shape[0],) + tuple(in_shape), L.dtype)
    conv_transpose(np.ascontiguousarray(L), weight, *conv_args(strides, dilations, pads, group),
                   G)
    return G


def conv_args(strides, dilations, pads, group):
    """A convolution's geometry as the kernels take it: strides, dilations, (top, left) pads
    as int64 arrays, and the group count."""
    return (np.asarray(strides, np.int64), np.asarray(dilations, np.int64),
            np.asarray(pads[:2], np.int64), int(group))


# -- rows held transposed: the fast path's layout (crown_cli/engine/graph_rows.py) ------------
# Lt (k, r): one column per row, so that every step is a loop over a node's elements whose body
# runs along the r rows (contiguous, vectorised). Where a step sums per row, blocks of
# ROW_BLOCK rows are spread over the threads.
ROW_BLOCK = 64


@njit(cache=True)
def _axpy(a, w, row):
    """``a += w * row``."""
    for k in range(row.shape[0]):
        a[k] += w * row[k]


@njit(cache=True)
def _add_products(acc, weight, L, rows, wo, wi, wj, n, on):
    """``acc[cc] += sum_m weight[wo[m], cc, wi[m], wj[m]] * L[rows[m]]`` over the first n
    (row, kernel offset) pairs, for every channel cc of the group that is ``on``: one
    position's sums in a transpose (:func:`conv_transpose_t`, :func:`win_conv_transpose_t`).
    Four products per pass over ``acc[cc]`` (1.3-1.45x one pass each: fewer loads and stores
    of the sums per product), and two channels per pass where both are on and their eight
    weights nonzero (each row read once for both: 1.1-1.2x); a zero weight's product skipped
    (as one pass each). The same products, summed in another order (each channel's sums in
    the same order whether paired or not)."""
    r = acc.shape[1]
    C = acc.shape[0]
    m = 0
    while m + 4 <= n:
        R0, R1, R2, R3 = L[rows[m]], L[rows[m + 1]], L[rows[m + 2]], L[rows[m + 3]]
        cc = 0
        while cc < C:
            if not on[cc]:
                cc += 1
                continue
            w0 = weight[wo[m], cc, wi[m], wj[m]]
            w1 = weight[wo[m + 1], cc, wi[m + 1], wj[m + 1]]
            w2 = weight[wo[m + 2], cc, wi[m + 2], wj[m + 2]]
            w3 = weight[wo[m + 3], cc, wi[m + 3], wj[m + 3]]
            full = w0 != 0.0 and w1 != 0.0 and w2 != 0.0 and w3 != 0.0
            if full and cc + 1 < C and on[cc + 1]:
                v0 = weight[wo[m], cc + 1, wi[m], wj[m]]
                v1 = weight[wo[m + 1], cc + 1, wi[m + 1], wj[m + 1]]
                v2 = weight[wo[m + 2], cc + 1, wi[m + 2], wj[m + 2]]
                v3 = weight[wo[m + 3], cc + 1, wi[m + 3], wj[m + 3]]
                if v0 != 0.0 and v1 != 0.0 and v2 != 0.0 and v3 != 0.0:
                    a, b = acc[cc], acc[cc + 1]
                    for k in range(r):
                        x0, x1, x2, x3 = R0[k], R1[k], R2[k], R3[k]
                        a[k] += w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3
                        b[k] += v0 * x0 + v1 * x1 + v2 * x2 + v3 * x3
                    cc += 2
                    continue
            a = acc[cc]
            if full:
                for k in range(r):
                    a[k] += w0 * R0[k] + w1 * R1[k] + w2 * R2[k] + w3 * R3[k]
            else:
                if w0 != 0.0:
                    _axpy(a, w0, R0)
                if w1 != 0.0:
                    _axpy(a, w1, R1)
                if w2 != 0.0:
                    _axpy(a, w2, R2)
                if w3 != 0.0:
                    _axpy(a, w3, R3)
            cc += 1
        m += 4
    while m < n:
        R0 = L[rows[m]]
        for cc in range(C):
            w0 = weight[wo[m], cc, wi[m], wj[m]]
            if on[cc] and w0 != 0.0:
                _axpy(acc[cc], w0, R0)
        m += 1


@njit(cache=True)
def _put_sums(out, q0, s0, s1, s2, col):
    """``out[q0 + q, col:col + 3] = (s0[q], s1[q], s2[q])``: a block of rows' three sums
    written out (the row kernels below)."""
    for q in range(s0.shape[0]):
        out[q0 + q, col] = s0[q]
        out[q0 + q, col + 1] = s1[q]
        out[q0 + q, col + 2] = s2[q]


@njit(cache=True, parallel=True)
def conv_transpose_t(Lt, src, pos, dst, weight, in_shape, out_shape, strides, dilations,
                     pads, group, Gt):
    """The transposed convolution of rows held transposed on the live output elements:
    ``Lt`` (k, r) holds output element e's rows at ``Lt[src[e]]`` (``src`` (O * OH * OW,),
    -1 where every row is 0). For every channel c and input position ``pos[t]`` (flat (H, W)
    index) with ``dst[c * P + t] >= 0``, ``Gt[dst[c * P + t]]`` (r,) = the rows over input
    element (c, pos[t]), which gathers its at most (O / group) * kh * kw products; elements
    of ``dst`` -1 are skipped. Position by position: each output row read serves every
    channel of its group (1.1-1.7x the element-by-element loop's speed).
    ``weight`` (O, C / group, kh, kw); ``pads``: top, left."""
    r = Gt.shape[1]
    P = pos.shape[0]
    _, Cg, kh, kw = weight.shape
    W = in_shape[2]
    O, OH, OW = out_shape[0], out_shape[1], out_shape[2]
    Og = O // group
    sh, sw = strides[0], strides[1]
    dh, dw = dilations[0], dilations[1]
    pt, pl = pads[0], pads[1]
    for tg in prange(P * group):
        t = tg // group
        g = tg % group
        on = np.empty(Cg, np.bool_)
        for cc in range(Cg):
            on[cc] = dst[(g * Cg + cc) * P + t] >= 0
        if not on.any():
            continue
        yy = pos[t] // W
        xx = pos[t] % W
        pairs = np.empty((4, Og * kh * kw), np.int64)  # row, output channel, offset i, j
        rows, wo, wi, wj = pairs[0], pairs[1], pairs[2], pairs[3]
        n = 0
        for i in range(kh):
            ty = yy + pt - i * dh
            if ty < 0 or ty % sh != 0 or ty // sh >= OH:
                continue
            y = ty // sh
            for j in range(kw):
                tx = xx + pl - j * dw
                if tx < 0 or tx % sw != 0 or tx // sw >= OW:
                    continue
                x = tx // sw
                for o in range(g * Og, (g + 1) * Og):
                    s = src[(o * OH + y) * OW + x]
                    if s < 0:
                        continue
                    rows[n], wo[n], wi[n], wj[n] = s, o, i, j
                    n += 1
        acc = np.zeros((Cg, r), Gt.dtype)
        _add_products(acc, weight, Lt, rows, wo, wi, wj, n, on)
        for cc in range(Cg):
            d = dst[(g * Cg + cc) * P + t]
            if d < 0:
                continue
            out = Gt[d]
            a = acc[cc]
            for k in range(r):
                out[k] = a[k]


@njit(cache=True, parallel=True)
def weight_rows_t(W, idx, sign, Lt):
    """``Lt[:, q] = sign[q] * W[idx[q]]``: a dense weight's rows taken as rows held
    transposed (``graph_rows.weight_rows``), in tiles of 32 elements by 32 rows (2-3x a
    transposed copy through numpy). Exact: each value times +-1."""
    n = W.shape[1]
    k = idx.size
    nb = (n + 31) // 32
    for b in prange(nb):
        e0 = b * 32
        e1 = min(n, e0 + 32)
        for q0 in range(0, k, 32):
            q1 = min(k, q0 + 32)
            for e in range(e0, e1):
                out = Lt[e]
                for q in range(q0, q1):
                    out[q] = W[idx[q], e] * sign[q]


@njit(cache=True, parallel=True)
def add_pairs_t(P, A):
    """``P[:, :h] += A`` and ``P[:, h:] -= A`` in one pass (P (n, 2h), A (n, h)): the shared
    products of rows that are pairs (``graph_rows._paired_product``; twin: those two numpy
    updates)."""
    n, h = A.shape
    for i in prange(n):
        top = P[i, :h]
        bottom = P[i, h:]
        a = A[i]
        for q in range(h):
            top[q] += a[q]
            bottom[q] -= a[q]


@njit(cache=True, parallel=True)
def affine_terms_t(Lt, bias, absbias, absfwd, out):
    """Per row of the rows held transposed, Lt (m, r): ``out[row] = (L @ bias, |L| @ |bias|,
    |L| @ absfwd)`` (an affine node's constant, its magnitude and the product rounding's
    weight); ``out`` (r, 1): the constant alone (a steering pass)."""
    m, r = Lt.shape
    charged = out.shape[1] >= 3
    nb = (r + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(nb):
        a0 = blk * ROW_BLOCK
        a1 = min(r, a0 + ROW_BLOCK)
        n = a1 - a0
        c = np.zeros(n)
        a = np.zeros(n)
        w = np.zeros(n)
        for k in range(m):
            bk = bias[k]
            ak = absbias[k]
            fk = absfwd[k]
            row = Lt[k, a0:a1]  # a slice and a loop from 0: vectorised (see activation_step_t)
            if charged:
                for q in range(n):
                    v = row[q]
                    av = abs(v)
                    c[q] += v * bk
                    a[q] += av * ak
                    w[q] += av * fk
            else:
                for q in range(n):
                    c[q] += row[q] * bk
        _put_all(out, a0, c, a, w, c, c, c, False, charged)


@njit(cache=True, parallel=True)
def input_terms_t(Lt, x0, qcode, out):
    """The rows held transposed over (some of) the flat input, Lt (n, r), concretised as
    ``input_sets.input_terms`` does: ``out[row] = (a . x0, ||a||_q (qcode 0: l1, 1: l2,
    2: l_inf), sum |a_k x0_k|)`` of each row a (x0 (n,) the input's elements the rows are
    on), the sums along the rows."""
    n, r = Lt.shape
    nb = (r + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(nb):
        a0 = blk * ROW_BLOCK
        a1 = min(r, a0 + ROW_BLOCK)
        w = a1 - a0
        lin = np.zeros(w)
        nrm = np.zeros(w)
        mag = np.zeros(w)
        for k in range(n):
            xk = x0[k]
            axk = abs(xk)
            row = Lt[k, a0:a1]  # a slice and a loop from 0: vectorised (see activation_step_t)
            if qcode == 0:
                for q in range(w):
                    v = np.float64(row[q])
                    av = abs(v)
                    lin[q] += v * xk
                    mag[q] += av * axk
                    nrm[q] += av
            elif qcode == 1:
                for q in range(w):
                    v = np.float64(row[q])
                    lin[q] += v * xk
                    mag[q] += abs(v) * axk
                    nrm[q] += row[q] * row[q]  # squared in the rows' dtype
            else:
                for q in range(w):
                    v = np.float64(row[q])
                    av = abs(v)
                    lin[q] += v * xk
                    mag[q] += av * axk
                    nrm[q] = av if av > nrm[q] else nrm[q]
        for q in range(w):
            out[a0 + q, 0] = lin[q]
            out[a0 + q, 1] = np.sqrt(nrm[q]) if qcode == 1 else nrm[q]
            out[a0 + q, 2] = mag[q]


@njit(cache=True, parallel=True)
def activation_step_t(Lt, read, lower, upper, lower_icpt, upper_icpt, absval, terms, Dt, out):
    """One activation node's step on rows held transposed, of the elements ``Lt[read]``
    (``Lt`` (m, r); ``read`` (n,), the others' lines are 0): ``Dt = Lt[read] * slope`` (the
    lower line's where the coefficient is >= 0, the upper line's elsewhere; the lines (n,)
    in ``read``'s order); per row ``out[row, :3] = (sum of the intercept terms, sum of their
    magnitudes, sum |D| * absval)``. With ``terms`` (3, n) (not (3, 0)), also the affine
    input's sums over the rows D, as :func:`affine_terms_t` would take them:
    ``out[row, 3:] = (D @ terms[0], |D| @ terms[1], |D| @ terms[2])``. ``Lt`` of r/2
    columns: the rows are ``[L; -L]`` (both sides of each neuron, ``graph_rows.WeightRows``),
    the second half read as the first negated (exact). Twin:
    :func:`crown_cli.engine.batch_steps.relax` and the sums of ``GraphBounds._rows``."""
    n, r = Dt.shape
    fuse = terms.shape[1] > 0
    charged = out.shape[1] >= 3  # else a steering pass's: the constants alone
    h = Lt.shape[1]  # r, or r / 2 for rows [L; -L]
    halves = 1 if h == r else 2
    nbh = (h + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(halves * nbh):
        half = blk // nbh
        s0 = (blk - half * nbh) * ROW_BLOCK
        w = min(h, s0 + ROW_BLOCK) - s0
        a0 = s0 + half * h
        sg = np.ones(1, Lt.dtype)
        if half:
            sg[0] = -sg[0]
        sgn = sg[0]
        c = np.zeros(w)
        m = np.zeros(w)
        ch = np.zeros(w)
        f0 = np.zeros(w)
        f1 = np.zeros(w)
        f2 = np.zeros(w)
        for k in range(n):
            sl, su = lower[k], upper[k]
            tl, tu = lower_icpt[k], upper_icpt[k]
            z = absval[k]
            row = Lt[read[k], s0:s0 + w]
            drow = Dt[k, a0:a0 + w]
            # one loop per case, the case chosen outside: each then runs vectorised, the
            # line chosen by a select (2x the one loop with the branch inside, measured)
            if fuse and charged:
                b0, b1, b2 = terms[0, k], terms[1, k], terms[2, k]
                for q in range(w):
                    v = row[q] * sgn
                    pos = v >= 0.0
                    d = v * (sl if pos else su)
                    t = v * (tl if pos else tu)
                    drow[q] = d
                    ad = abs(d)
                    c[q] += t
                    m[q] += abs(t)
                    ch[q] += ad * z
                    f0[q] += d * b0
                    f1[q] += ad * b1
                    f2[q] += ad * b2
            elif charged:
                for q in range(w):
                    v = row[q] * sgn
                    pos = v >= 0.0
                    d = v * (sl if pos else su)
                    t = v * (tl if pos else tu)
                    drow[q] = d
                    c[q] += t
                    m[q] += abs(t)
                    ch[q] += abs(d) * z
            elif fuse:
                b0 = terms[0, k]
                for q in range(w):
                    v = row[q] * sgn
                    pos = v >= 0.0
                    d = v * (sl if pos else su)
                    drow[q] = d
                    c[q] += v * (tl if pos else tu)
                    f0[q] += d * b0
            else:
                for q in range(w):
                    v = row[q] * sgn
                    pos = v >= 0.0
                    drow[q] = v * (sl if pos else su)
                    c[q] += v * (tl if pos else tu)
        _put_all(out, a0, c, m, ch, f0, f1, f2, fuse, charged)


@njit(cache=True)
def _put_all(out, q0, c, m, ch, f0, f1, f2, fuse, charged):
    """An activation step's sums written out: ``out[q0 + q]`` = (c, m, ch) and with
    ``fuse`` (f0, f1, f2) after them; a steering pass's (not ``charged``) c and with
    ``fuse`` f0."""
    if charged:
        _put_sums(out, q0, c, m, ch, 0)
        if fuse:
            _put_sums(out, q0, f0, f1, f2, 3)
        return
    for q in range(c.shape[0]):
        out[q0 + q, 0] = c[q]
        if fuse:
            out[q0 + q, 1] = f0[q]


@njit(cache=True, parallel=True)
def product_step_t(Lt, a, b, icL, icU, z1, z2, D1t, D2t, out):
    """One product node's step (x1 * x2, planes ``a x1 + b x2 + ic``) on rows held
    transposed, Lt (n, r): ``D1t = Lt * a``, ``D2t = Lt * b``; per row ``out[row] = (sum of
    the intercept terms (icL where the coefficient is >= 0, icU elsewhere), sum of their
    magnitudes, sum |L| (|a| z1 + |b| z2))``. Twin: ``ProductRule.back`` (numpy rows)
    (crown_cli/engine/node_rules.py)."""
    n, r = Lt.shape
    nb = (r + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(nb):
        a0 = blk * ROW_BLOCK
        a1 = min(r, a0 + ROW_BLOCK)
        nq = a1 - a0
        c = np.zeros(nq)
        m = np.zeros(nq)
        ch = np.zeros(nq)
        for k in range(n):
            ak, bk = a[k], b[k]
            tl, tu = icL[k], icU[k]
            w = abs(ak) * z1[k] + abs(bk) * z2[k]
            row, d1, d2 = Lt[k, a0:a1], D1t[k, a0:a1], D2t[k, a0:a1]
            for q in range(nq):  # slices, selects: vectorised (see activation_step_t)
                v = row[q]
                d1[q] = v * ak
                d2[q] = v * bk
                t = v * (tl if v >= 0.0 else tu)
                c[q] += t
                m[q] += abs(t)
                ch[q] += abs(v) * w
        _put_sums(out, a0, c, m, ch, 0)


@njit(cache=True, parallel=True)
def merge_rows_t(La, ma, Lb, mb, absval, St, charge):
    """Two sets of rows held transposed summed onto the union of their elements (a node
    receiving rows from a second consumer): ``St[k] = La[ma[k]] + Lb[mb[k]]`` (n, r), a
    term 0 where its index is -1, and ``charge[q] += sum_k |St[k, q]| absval[k]``. Each
    input read once, each sum written once."""
    n, r = St.shape
    zero = np.zeros(1, St.dtype)[0]  # (of the rows' type: a float32 sum stays float32)
    nb = (r + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(nb):
        a0 = blk * ROW_BLOCK
        a1 = min(r, a0 + ROW_BLOCK)
        w = a1 - a0
        ch = np.zeros(w)
        for k in range(n):
            z = absval[k]
            srow = St[k, a0:a1]
            ia, ib = ma[k], mb[k]
            if ia >= 0 and ib >= 0:
                ra, rb = La[ia, a0:a1], Lb[ib, a0:a1]
                for q in range(w):
                    v = ra[q] + rb[q]
                    srow[q] = v
                    ch[q] += abs(v) * z
            elif ia >= 0 or ib >= 0:  # one term: itself (+ 0, as the sum with a 0 row)
                ra = La[ia, a0:a1] if ia >= 0 else Lb[ib, a0:a1]
                for q in range(w):
                    v = ra[q] + zero
                    srow[q] = v
                    ch[q] += abs(v) * z
            else:
                srow[:] = 0.0
        for q in range(a0, a1):
            charge[q] += ch[q - a0]


# -- rows as numpy arrays, (r, n) row-major: GraphBounds._rows (any lines) under these kernels ----
# Each row is a loop along its n coefficients, rows spread over the threads; four partial
# sums per quantity (independent chains; the charges do not depend on the order of a sum).


@njit(cache=True, parallel=True)
def affine_terms_rows(L, bias, absbias, absfwd, out):
    """Per row of L (r, n): ``out[row] = (L @ bias, |L| @ absbias, |L| @ absfwd)``."""
    r, n = L.shape
    for q in prange(r):
        row = L[q]
        c = np.zeros(4)
        a = np.zeros(4)
        w = np.zeros(4)
        k = 0
        while k + 4 <= n:
            for j in range(4):
                v = row[k + j]
                av = abs(v)
                c[j] += v * bias[k + j]
                a[j] += av * absbias[k + j]
                w[j] += av * absfwd[k + j]
            k += 4
        while k < n:
            v = row[k]
            av = abs(v)
            c[0] += v * bias[k]
            a[0] += av * absbias[k]
            w[0] += av * absfwd[k]
            k += 1
        out[q, 0] = (c[0] + c[1]) + (c[2] + c[3])
        out[q, 1] = (a[0] + a[1]) + (a[2] + a[3])
        out[q, 2] = (w[0] + w[1]) + (w[2] + w[3])


@njit(cache=True, parallel=True)
def add_rows(A, B, absval, S, charge):
    """``S = A + B`` (r, n) and ``charge[q] = sum_k |S[q, k]| absval[k]`` (a node receiving
    rows from a second consumer)."""
    r, n = A.shape
    for q in prange(r):
        s = np.zeros(4)
        k = 0
        while k + 4 <= n:
            for j in range(4):
                v = A[q, k + j] + B[q, k + j]
                S[q, k + j] = v
                s[j] += abs(v) * absval[k + j]
            k += 4
        while k < n:
            v = A[q, k] + B[q, k]
            S[q, k] = v
            s[0] += abs(v) * absval[k]
            k += 1
        charge[q] = (s[0] + s[1]) + (s[2] + s[3])


@njit(cache=True, parallel=True)
def activation_rows(L, lines, has_extra, z, D, keep, tape, out):
    """One activation node's step on rows L (r, n) with lines given per row or shared:
    ``lines`` = (lower, upper, lower_icpt, upper_icpt, extra), each (r, n) or (1, n).
    ``D = L * slope + extra`` (slope and intercept the lower line's where the coefficient is
    >= 0, the upper's elsewhere; ``extra`` only when ``has_extra``); per row ``out[row] =
    (sum of the intercept terms, their magnitudes, sum |D| z, sum (|L slope| + |extra|) z)``;
    with ``keep`` the side, slope and intercept each coefficient took into ``tape`` = (pos,
    slope, intercept) arrays (r, n)."""
    lower, upper, lower_icpt, upper_icpt, extra = lines
    tape_pos, tape_slope, tape_icpt = tape
    r, n = L.shape
    # per-row arrays are read at the row, shared ones (one row) at row 0
    ml, mu = min(lower.shape[0] - 1, 1), min(upper.shape[0] - 1, 1)
    ma, mb = min(lower_icpt.shape[0] - 1, 1), min(upper_icpt.shape[0] - 1, 1)
    me = min(extra.shape[0] - 1, 1)
    for q in prange(r):
        ql, qu, qa, qb, qe = q * ml, q * mu, q * ma, q * mb, q * me
        isum = 0.0
        iabs = 0.0
        dz = 0.0
        ez = 0.0
        for k in range(n):
            v = L[q, k]
            pos = v >= 0.0
            if pos:
                s = lower[ql, k]
                ic = lower_icpt[qa, k]
            else:
                s = upper[qu, k]
                ic = upper_icpt[qb, k]
            p = v * s
            d = p
            if has_extra:
                e = extra[qe, k]
                d = p + e
                ez += (abs(p) + abs(e)) * z[k]
            D[q, k] = d
            t = v * ic
            isum += t
            iabs += abs(t)
            dz += abs(d) * z[k]
            if keep:
                tape_pos[q, k] = pos
                tape_slope[q, k] = s
                tape_icpt[q, k] = ic
        out[q, 0] = isum
        out[q, 1] = iabs
        out[q, 2] = dz
        out[q, 3] = ez


# -- rows on per-row windows (crown_cli/engine/graph_rows.py, ``Win``) -------------------------
# A row over an image-shaped node (C, H, W) that touches only a small part of the image is held
# on its own window: Pt (C, h, w, r), row q's window at (oy[q], ox[q]) in the node's (H, W)
# coordinates (it may reach past the border; every coefficient there is 0). All rows of a
# chunk have windows of one size; a convolution's transpose of windows does not depend on
# where they lie, so it runs along the r rows; the steps that read a node's values (lines,
# bias, magnitudes) gather them at each row's own position.


@njit(cache=True, parallel=True)
def win_conv_transpose_t(Pt, oy, ox, weight, strides, dilations, group, in_hw, Gt):
    """``Gt`` (C, h2, w2, r) = the transposed convolution of the windows ``Pt`` (O, h, w, r),
    ``Gt``'s window of row q at (oy[q], ox[q]) in the input's (H, W) = ``in_hw`` coordinates
    (its output window's origin times the stride, less the padding); coefficients that land
    outside the input (on padding) are 0. Each sum gathers at most (O / group) kh kw
    products; position by position, each output row read serving every channel of its
    group."""
    O, h, w, r = Pt.shape
    P2 = Pt.reshape(O * h * w, r)  # window element (o, y, x)'s rows at (o * h + y) * w + x
    _, Cg, kh, kw = weight.shape
    h2, w2 = Gt.shape[1], Gt.shape[2]
    H, W = in_hw[0], in_hw[1]
    Og = O // group
    sh, sw = strides[0], strides[1]
    dh, dw = dilations[0], dilations[1]
    for abg in prange(h2 * w2 * group):
        g = abg % group
        a = (abg // group) // w2
        b = (abg // group) % w2
        on = np.ones(Cg, np.bool_)
        pairs = np.empty((4, Og * kh * kw), np.int64)  # row, output channel, offset i, j
        rows, wo, wi, wj = pairs[0], pairs[1], pairs[2], pairs[3]
        n = 0
        for i in range(kh):
            ty = a - i * dh
            if ty < 0 or ty % sh != 0 or ty // sh >= h:
                continue
            y = ty // sh
            for j in range(kw):
                tx = b - j * dw
                if tx < 0 or tx % sw != 0 or tx // sw >= w:
                    continue
                x = tx // sw
                for o in range(g * Og, (g + 1) * Og):
                    rows[n], wo[n], wi[n], wj[n] = (o * h + y) * w + x, o, i, j
                    n += 1
        acc = np.zeros((Cg, r), Gt.dtype)
        _add_products(acc, weight, P2, rows, wo, wi, wj, n, on)
        for cc in range(Cg):
            out = Gt[g * Cg + cc, a, b]
            s = acc[cc]
            for k in range(r):
                yy = oy[k] + a
                xx = ox[k] + b
                out[k] = 0.0 if yy < 0 or yy >= H or xx < 0 or xx >= W else s[k]


@njit(cache=True, parallel=True)
def win_activation_t(Pt, oy, ox, runs, lower, upper, lower_icpt, upper_icpt, absval, terms,
                     Dt, out):
    """:func:`activation_step_t` on windows: ``Pt`` (C, h, w, r) at (oy, ox), the lines and
    ``absval`` as (C, H, W) arrays read at each row's own positions; ``Dt`` the rows' new
    windows (same place), ``out[q, :3]`` = (intercept sum, its magnitude, sum |D| absval);
    with ``terms`` (3, C, H, W) (not (3, 0, 0, 0)) also ``out[q, 3:]``, the affine input's
    sums over D as :func:`win_sums_t` would take them. ``runs``: the rows in runs
    ``runs[g] .. runs[g + 1]`` of one window place each
    (:func:`crown_cli.engine.graph_rows.window_runs`), so that a position's lines are read
    once for the run."""
    C, h, w, r = Pt.shape
    H, W = lower.shape[1], lower.shape[2]
    fuse = terms.shape[1] > 0
    charged = out.shape[1] >= 3  # else a steering pass's: the constants alone
    for g in prange(runs.size - 1):
        q0, q1 = runs[g], runs[g + 1]
        cs = np.zeros(q1 - q0)
        ms = np.zeros(q1 - q0)
        ch = np.zeros(q1 - q0)
        f0 = np.zeros(q1 - q0)
        f1 = np.zeros(q1 - q0)
        f2 = np.zeros(q1 - q0)
        for c in range(C):
            for a in range(h):
                yy = oy[q0] + a
                for b in range(w):
                    xx = ox[q0] + b
                    if yy < 0 or yy >= H or xx < 0 or xx >= W:
                        for q in range(q0, q1):
                            Dt[c, a, b, q] = 0.0
                        continue
                    sl, su = lower[c, yy, xx], upper[c, yy, xx]
                    tl, tu = lower_icpt[c, yy, xx], upper_icpt[c, yy, xx]
                    z = absval[c, yy, xx]
                    prow = Pt[c, a, b, q0:q1]
                    drow = Dt[c, a, b, q0:q1]
                    # selects, not branches, and the case chosen outside the loop: vectorised
                    # (see activation_step_t); a coefficient 0 adds nothing (not 0 * inf)
                    if fuse and charged:
                        b0 = terms[0, c, yy, xx]
                        b1 = terms[1, c, yy, xx]
                        b2 = terms[2, c, yy, xx]
                        for q in range(q1 - q0):
                            v = prow[q]
                            pos = v >= 0.0
                            nz = v != 0.0
                            d = v * (sl if pos else su) if nz else 0.0
                            t = v * (tl if pos else tu) if nz else 0.0
                            drow[q] = d
                            ad = abs(d)
                            cs[q] += t
                            ms[q] += abs(t)
                            ch[q] += ad * z if nz else 0.0
                            f0[q] += d * b0 if d != 0.0 else 0.0
                            f1[q] += ad * b1 if d != 0.0 else 0.0
                            f2[q] += ad * b2 if d != 0.0 else 0.0
                    elif charged:
                        for q in range(q1 - q0):
                            v = prow[q]
                            pos = v >= 0.0
                            nz = v != 0.0
                            d = v * (sl if pos else su) if nz else 0.0
                            t = v * (tl if pos else tu) if nz else 0.0
                            drow[q] = d
                            cs[q] += t
                            ms[q] += abs(t)
                            ch[q] += abs(d) * z if nz else 0.0
                    elif fuse:
                        b0 = terms[0, c, yy, xx]
                        for q in range(q1 - q0):
                            v = prow[q]
                            pos = v >= 0.0
                            nz = v != 0.0
                            d = v * (sl if pos else su) if nz else 0.0
                            drow[q] = d
                            cs[q] += v * (tl if pos else tu) if nz else 0.0
                            f0[q] += d * b0 if d != 0.0 else 0.0
                    else:
                        for q in range(q1 - q0):
                            v = prow[q]
                            pos = v >= 0.0
                            nz = v != 0.0
                            drow[q] = v * (sl if pos else su) if nz else 0.0
                            cs[q] += v * (tl if pos else tu) if nz else 0.0
        _put_all(out, q0, cs, ms, ch, f0, f1, f2, fuse, charged)


@njit(cache=True, parallel=True)
def win_pool_t(Pt, oy, ox, runs, chosen, lines, origin, Dt, out):
    """A max pool's step (its default lines, ``node_rules.PoolLines``) on windows: ``Pt``
    (C, h, w, r) at (oy, ox) over the pool's (C, OH, OW) output; each coefficient v at an
    output position goes, where v >= 0 or the window is exact, to the position's chosen
    input (``chosen`` (2, C, OH, OW): its input row and column) in the row's window over
    the input, ``Dt`` (C, h', w', r) at ``origin`` (2, r), zeros on entry; elsewhere into
    the constant, v * hi. ``lines`` (3, C, OH, OW): hi, 1 where the window is exact, the
    chosen input's magnitude. ``out[q] = (constant, its magnitude, sum |v| magnitude)``,
    the last over the coefficients handed on (the overlap charge's weight). Positions past
    the output's border carry nothing. Twin: ``PoolRule.back_t`` on the rows written
    out."""
    C, h, w, r = Pt.shape
    OH, OW = chosen.shape[2], chosen.shape[3]
    for g in prange(runs.size - 1):
        q0, q1 = runs[g], runs[g + 1]
        n = q1 - q0
        cs = np.zeros(n)
        ms = np.zeros(n)
        ch = np.zeros(n)
        for c in range(C):
            for a in range(h):
                yy = oy[q0] + a
                if yy < 0 or yy >= OH:
                    continue
                for b in range(w):
                    xx = ox[q0] + b
                    if xx < 0 or xx >= OW:
                        continue
                    ly = chosen[0, c, yy, xx] - origin[0, q0]
                    lx = chosen[1, c, yy, xx] - origin[1, q0]
                    hv = lines[0, c, yy, xx]
                    ex = lines[1, c, yy, xx] != 0.0
                    z = lines[2, c, yy, xx]
                    prow = Pt[c, a, b, q0:q1]
                    drow = Dt[c, ly, lx, q0:q1]
                    for q in range(n):
                        v = prow[q]
                        if v >= 0.0 or ex:
                            drow[q] += v
                            ch[q] += abs(v) * z
                        else:
                            t = np.float64(v) * hv
                            cs[q] += t
                            ms[q] += abs(t)
        _put_sums(out, q0, cs, ms, ch, 0)


@njit(cache=True, parallel=True)
def win_sums_t(Pt, oy, ox, runs, v0, v1, v2, out):
    """Per row of the windows ``Pt`` (C, h, w, r) at (oy, ox): ``out[q] = (sum P v0,
    sum |P| v1, sum |P| v2)`` with the (C, H, W) arrays read at the row's own positions (an
    affine node's constant, magnitude and rounding weight: ``v0`` its bias, ``v1`` |bias|,
    ``v2`` its forward magnitude; or a sum's charge: ``v2`` the node's absval; or the input's
    terms). ``runs`` as :func:`win_activation_t`'s. ``out`` (r, 1): the first sum alone (a
    steering pass's constant)."""
    C, h, w, r = Pt.shape
    H, W = v0.shape[1], v0.shape[2]
    charged = out.shape[1] >= 3
    for g in prange(runs.size - 1):
        q0, q1 = runs[g], runs[g + 1]
        s0 = np.zeros(q1 - q0)
        s1 = np.zeros(q1 - q0)
        s2 = np.zeros(q1 - q0)
        for c in range(C):
            for a in range(h):
                yy = oy[q0] + a
                if yy < 0 or yy >= H:
                    continue
                for b in range(w):
                    xx = ox[q0] + b
                    if xx < 0 or xx >= W:
                        continue
                    e0, e1, e2 = v0[c, yy, xx], v1[c, yy, xx], v2[c, yy, xx]
                    prow = Pt[c, a, b, q0:q1]
                    if charged:
                        for q in range(q1 - q0):  # selects: vectorised (see win_activation_t)
                            v = prow[q]
                            nz = v != 0.0
                            av = abs(v)
                            s0[q] += v * e0 if nz else 0.0
                            s1[q] += av * e1 if nz else 0.0
                            s2[q] += av * e2 if nz else 0.0
                    else:
                        for q in range(q1 - q0):
                            v = prow[q]
                            s0[q] += v * e0 if v != 0.0 else 0.0
        _put_all(out, q0, s0, s1, s2, s0, s0, s0, False, charged)


@njit(cache=True, parallel=True)
def win_scatter_t(Pt, oy, ox, where, H, W, Lt):
    """The windows ``Pt`` (C, h, w, r) at (oy, ox) written into rows held transposed on live
    elements: element e (flat (C, H, W) index) of row q goes to ``Lt[where[e], q]`` (``Lt``
    zero where no window reaches, which the caller provides; ``where`` covers every element
    a window reaches inside the image)."""
    C, h, w, r = Pt.shape
    for c in prange(C):
        for a in range(h):
            for b in range(w):
                for q in range(r):
                    yy = oy[q] + a
                    xx = ox[q] + b
                    if yy >= 0 and yy < H and xx >= 0 and xx < W:
                        Lt[where[(c * H + yy) * W + xx], q] = Pt[c, a, b, q]


def _serial_twins(namespace: dict) -> types.SimpleNamespace:
    """This module's contents with every parallel kernel compiled again without threads
    (named ``<kernel>_serial``, so that numba caches it in a file of its own) and every plain
    function bound to those twins (``transpose_rows``): the kernels
    :func:`~crown_cli.engine.kernels.graph_kernels` hands a forked helper."""
    from numba.core.registry import CPUDispatcher

    twins = dict(namespace)  # the copies' globals: a twin calls twins
    for name, obj in namespace.items():
        if isinstance(obj, CPUDispatcher) and obj.targetoptions.get("parallel"):
            f = obj.py_func
            copy = types.FunctionType(f.__code__, twins, f.__name__ + "_serial",
                                      f.__defaults__, f.__closure__)
            copy.__qualname__, copy.__doc__ = f.__qualname__ + "_serial", f.__doc__
            twins[name] = njit(cache=True)(copy)
        elif isinstance(obj, types.FunctionType) and obj.__module__ == __name__:
            twins[name] = types.FunctionType(obj.__code__, twins, obj.__name__,
                                             obj.__defaults__, obj.__closure__)
    return types.SimpleNamespace(**{k: v for k, v in twins.items() if not k.startswith("__")})


SERIAL = _serial_twins(dict(globals()))
