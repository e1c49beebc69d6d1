"""One handler per ONNX operator for :func:`crown_cli.graph.onnx_graph.load_graph`.

``handler(builder, node, inputs, attrs)`` returns the node's outputs as
:class:`~crown_cli.graph.tensors.Const` or :class:`~crown_cli.graph.tensors.Data`.
"""
from __future__ import annotations

import numpy as np

from crown_cli.activations import (ACTIVATIONS, apply_activation, param_ok, param_range,
                                   range_text)
from crown_cli.graph import tensors as T
from crown_cli.graph.onnx_moves import (_cast, _concat, _const_fn, _constant,
                                        _constant_of_shape, _expand, _flatten, _gather,
                                        _identity, _moved, _pad, _range, _reshape, _resize,
                                        _shape, _slice, _split, _squeeze, _transpose,
                                        _unsqueeze)
from crown_cli.graph import onnx_relu_forms as relu_forms
from crown_cli.graph.ops import (SPARSE_LOAD_DENSITY, SPARSE_MIN_SIZE, ActivationOp, Conv, Dense,
                                  Product, Sum)
from crown_cli.graph.pooling import MaxPool, pool_windows
from crown_cli.graph.tensors import Const, Data


def _label(node) -> str:
    return node.name or node.op_type


def _resize_any(b, node, ins, attrs):
    """Resize: mode ``linear`` as an affine node (:mod:`crown_cli.graph.onnx_resize`), else
    (nearest) an element move."""
    from crown_cli.graph.onnx_moves import _text
    from crown_cli.graph.onnx_resize import resize_linear

    if _text(attrs.get("mode", "nearest")) == "linear":
        return resize_linear(b, node, ins, attrs)
    return _moved(_resize)(b, node, ins, attrs)


# -- affine operators ----------------------------------------------------------------------

def _binary(b, node, ins, attrs):
    op = node.op_type
    x, y = ins
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        b.fail(node, f"inputs of shapes {x.shape} and {y.shape} do not broadcast")
    b.room(node, shape, given=[x.shape, y.shape])
    if isinstance(x, Const) and isinstance(y, Const):
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}.get(op)
        if fn is not None:
            return [Const(fn(x.value, y.value))]
        if x.value.dtype.kind in "iu" and y.value.dtype.kind in "iu":
            return [Const((np.trunc(x.value / y.value)).astype(x.value.dtype))]
        return [Const(x.value / y.value)]
    bc = lambda v: T.view(v, lambda a: T.onnx_expand(a, shape))  # noqa: E731
    if isinstance(x, Data) and isinstance(y, Data):
        ids = [b.node_of(bc(v), _label(node)) for v in (x, y)]
        n = int(np.prod(shape, dtype=np.int64))
        if op == "Div":  # x / y = x * (1 / y)
            b.add(_label(node) + "/reciprocal", ActivationOp("reciprocal"), (ids[1],), shape)
            ids[1] = len(b.nodes) - 1
        if op in ("Mul", "Div"):
            return [b.add(_label(node), Product(n), ids, shape)]
        signs = (1.0, 1.0 if op == "Add" else -1.0)
        return [b.add(_label(node), Sum(signs, n), ids, shape)]
    data_first = isinstance(x, Data)
    d, k = (x, y) if data_first else (y, x)
    tensor = node.input[0] if data_first else node.input[1]
    k = b.fconst(node, k, "the constant operand")
    same_shape = d.shape == tuple(shape)
    d = bc(d)
    if not same_shape:
        tensor = None  # a broadcast view is not the producer's output
    if op == "Add":
        return [b.scale(node, d, 1.0, k, tensor)]
    if op == "Sub":
        return [b.scale(node, d, 1.0, -k, tensor) if data_first else b.scale(node, d, -1.0, k, tensor)]
    if op == "Mul":
        return [b.scale(node, d, k, None, tensor)]
    if not data_first:  # k / d = k * (1 / d)
        nid = b.node_of(d, _label(node))
        r = b.add(_label(node) + "/reciprocal", ActivationOp("reciprocal"), (nid,), d.shape)
        return [b.scale(node, r, k, None, None)]
    if np.any(k == 0):
        b.fail(node, "divides by zero")
    return [b.scale(node, d, 1.0 / k, None, tensor)]


def _neg(b, node, ins, attrs):
    x = ins[0]
    if isinstance(x, Const):
        return [Const(-x.value)]
    return [b.scale(node, x, -1.0, None, node.input[0])]


def _dense(b, node, d: Data, W: np.ndarray, left: bool, bias, label: str, tensor=None):
    """``d @ W`` (or ``W @ d`` when ``left``) for a constant W of rank 1 or 2, as a Dense node
    (sparse when W is large and mostly zero, or when it repeats over leading dimensions)."""
    import scipy.sparse as sp

    if W.ndim not in (1, 2):
        b.fail(node, f"the constant has shape {W.shape}; only matrices and vectors are supported")
    xs = d.shape
    out_shape = _matmul_shape(xs, W.shape, left)
    if out_shape is None:
        b.fail(node, f"data of shape {xs} and a constant of shape {W.shape} do not match")
    W2 = W.reshape(-1, 1) if W.ndim == 1 and not left else W.reshape(1, -1) if W.ndim == 1 else W
    if not left:  # x (..., n) @ W (n, m): rep copies of W^T
        rep = int(np.prod(xs[:-1], dtype=np.int64)) if len(xs) > 1 else 1
        core, inner = W2.T, 1
    else:  # W (m, p) @ x (..., p, k)
        inner = xs[-1] if len(xs) > 1 else 1
        rep = int(np.prod(xs[:-2], dtype=np.int64)) if len(xs) > 2 else 1
        core = W2
    nnz = int(np.count_nonzero(core))
    sparse = rep > 1 or inner > 1 or (core.size >= SPARSE_MIN_SIZE
                                        and nnz <= SPARSE_LOAD_DENSITY * core.size)
    need = nnz * rep * inner * 16 if sparse else core.size * 8
    if need > b.budget:
        b.fail(node, f"its weights need {need / 2 ** 30:.3g} GiB as float64 "
                     f"({'sparse' if sparse else 'dense'}, shape {tuple(core.shape)}), over the "
                     f"budget of {b.budget / 2 ** 30:g} GiB (--memory-budget)")
    if sparse:
        M = sp.csr_matrix(core).astype(np.float64)
        if inner > 1:
            M = sp.kron(M, sp.identity(inner, format="csr"), format="csr")
        if rep > 1:
            M = sp.kron(sp.identity(rep, format="csr"), M, format="csr")
    else:
        M = np.ascontiguousarray(core, dtype=np.float64)
    if bias is not None:
        try:
            bias = np.broadcast_to(bias, out_shape).reshape(-1)
        except ValueError:
            b.fail(node, f"bias of shape {bias.shape} does not broadcast to {out_shape}")
    nid = b.node_of(d, label)
    out = b.add(label, Dense(M, bias), (nid,), out_shape)
    b.absorb_scale(b.fresh, tensor)
    return out


def _matmul_shape(xs, ws, left):
    """The shape of ``x @ W`` (or ``W @ x``) for a constant W of rank 1 or 2, or None."""
    if not xs:
        return None
    if not left:
        if xs[-1] != ws[0]:
            return None
        return tuple(xs[:-1]) + tuple(ws[1:])
    p = ws[-1]
    if len(xs) == 1:
        return tuple(ws[:-1]) if xs[0] == p else None
    if xs[-2] != p:
        return None
    return tuple(xs[:-2]) + tuple(ws[:-1]) + (xs[-1],)


def _matmul(b, node, ins, attrs):
    x, y = ins
    if isinstance(x, Const) and isinstance(y, Const):
        return [Const(np.matmul(x.value, y.value))]
    if isinstance(x, Data) and isinstance(y, Data):
        return [_matmul_data(b, node, x, y)]
    if isinstance(x, Data):
        return [_dense(b, node, x, b.fconst(node, y, "B"), False, None, _label(node), node.input[0])]
    return [_dense(b, node, y, b.fconst(node, x, "A"), True, None, _label(node), node.input[1])]


def _sum_rows(b, label: str, nid: int, rows: np.ndarray, shape):
    """A sparse Dense node summing, for each row of the index array ``rows`` (m, k), the k
    elements of node ``nid``: its output (m,) has ONNX shape ``shape``."""
    import scipy.sparse as sp

    m, k = rows.shape
    size = b.nodes[nid].size
    M = sp.csr_matrix((np.ones(m * k), (np.repeat(np.arange(m), k), rows.reshape(-1))),
                      shape=(m, size))
    return b.add(label, Dense(M, None, f"sum of {k}"), (nid,), shape)


def _matmul_data(b, node, x: Data, y: Data) -> Data:
    """``x @ y`` of two data tensors (rank >= 2, batch dimensions broadcast; attention's
    Q K^T and its weights times V): every product ``x[.., i, t] * y[.., t, j]`` a product
    node (index maps bring both factors to shape (.., m, k, n)), then a sum over t."""
    label = _label(node)
    if len(x.shape) < 2 or len(y.shape) < 2:
        b.fail(node, "a product of two data tensors of rank 1 is not supported")
    (m, k), (k2, n) = x.shape[-2:], y.shape[-2:]
    if k != k2:
        b.fail(node, f"inputs of shapes {x.shape} and {y.shape} do not multiply")
    try:
        batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    except ValueError:
        b.fail(node, f"inputs of shapes {x.shape} and {y.shape} do not broadcast")
    big = tuple(batch) + (m, k, n)
    b.room(node, big, given=[x.shape, y.shape])
    xs = T.view(x, lambda a: np.ascontiguousarray(np.broadcast_to(a[..., :, :, None], big)))
    ys = T.view(y, lambda a: np.ascontiguousarray(np.broadcast_to(a[..., None, :, :], big)))
    ids = [b.node_of(v, label) for v in (xs, ys)]
    size = int(np.prod(big, dtype=np.int64))
    b.add(label + "/products", Product(size), ids, big)
    pid = len(b.nodes) - 1
    rows = np.moveaxis(np.arange(size).reshape(big), -2, -1).reshape(-1, k)
    return _sum_rows(b, label, pid, rows, tuple(batch) + (m, n))


def _softmax_inside(b, node, d: Data, axis: int, along: int) -> Data:
    """Softmax along ``axis`` inside a graph (attention weights) in the form
    ``y_i = 1 / sum_j exp(x_j - x_i)``: the differences (a sparse Dense node, exact
    coefficients), exp, the sums, the reciprocal. Its bounds never see a product, and
    ``exp(0) = 1`` on the diagonal keeps each sum at least 1."""
    import scipy.sparse as sp

    label = _label(node)
    size = int(np.prod(d.shape, dtype=np.int64))
    nid = b.node_of(d, label)
    if b.opset >= 13:
        rows = np.moveaxis(np.arange(size).reshape(d.shape), axis, -1).reshape(-1, along)
    else:  # opset < 13: the input coerced to 2-D at axis
        rows = np.arange(size).reshape(-1, along)
    R, m = rows.shape
    b.room(node, (R, m, m), given=[d.shape])
    i = np.repeat(rows, m, axis=1).reshape(-1)  # (r, i, j) -> element x_i of row r
    j = np.tile(rows, (1, m)).reshape(-1)  # (r, i, j) -> element x_j
    off = i != j
    k = np.flatnonzero(off)
    M = sp.csr_matrix((np.concatenate([np.ones(k.size), -np.ones(k.size)]),
                       (np.concatenate([k, k]), np.concatenate([j[off], i[off]]))),
                      shape=(R * m * m, size))
    diff = b.add(label + "/differences", Dense(M, None, "x_j - x_i"), (nid,), (R, m, m))
    e = b.add(label + "/exp", ActivationOp("exp"), (diff.sources[0],), (R, m, m))
    sums = _sum_rows(b, label + "/sums", e.sources[0], np.arange(R * m * m).reshape(R * m, m),
                     (R, m))
    r = b.add(label + "/reciprocal", ActivationOp("reciprocal"), (sums.sources[0],), (R, m))
    # back to the input's layout: element (row, i) of r is rows[row, i] of the input
    src = np.empty(size, np.int64)
    src[rows.reshape(-1)] = np.arange(R * m)
    return T.view(r, lambda a: a.reshape(-1)[src].reshape(d.shape))


def _gemm(b, node, ins, attrs):
    A, B = ins[0], ins[1]
    C = ins[2] if len(ins) > 2 else None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    if isinstance(C, Data):
        b.fail(node, "the data cannot be the bias C")
    bias = None if C is None else beta * b.fconst(node, C, "C")
    if isinstance(A, Data) == isinstance(B, Data):
        b.fail(node, "exactly one of A and B must be data, the other a constant")
    for v in (A, B):
        if len(v.shape) != 2:
            b.fail(node, f"an operand has shape {v.shape}, expected 2-D")
    if isinstance(A, Data):
        d = T.view(A, np.transpose) if ta else A
        W = b.fconst(node, B, "B")
        W = alpha * (W.T if tb else W)
        return [_dense(b, node, d, W, False, bias, _label(node), None if ta else node.input[0])]
    d = T.view(B, np.transpose) if tb else B
    W = b.fconst(node, A, "A")
    W = alpha * (W.T if ta else W)
    return [_dense(b, node, d, W, True, bias, _label(node))]


def _spatial(b, node, attrs, d: Data, kernel):
    """strides, pads (top, left, bottom, right), dilations of a 2-D Conv or pool."""
    if len(d.shape) != 4 or d.shape[0] != 1:
        b.fail(node, f"needs data of shape (1, C, H, W), got {d.shape}")
    if len(kernel) != 2:
        b.fail(node, f"only 2-D kernels are supported, got {list(kernel)}")
    strides = [int(s) for s in attrs.get("strides", [1, 1])]
    dil = [int(s) for s in attrs.get("dilations", [1, 1])]
    pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0, 0, 0, 0]
        for ax in range(2):
            dim = d.shape[2 + ax]
            total = max((-(-dim // strides[ax]) - 1) * strides[ax] + (kernel[ax] - 1) * dil[ax]
                        + 1 - dim, 0)
            small = total // 2
            pads[ax], pads[ax + 2] = (small, total - small) if auto == "SAME_UPPER" else (total - small, small)
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    elif auto != "NOTSET":
        b.fail(node, f"auto_pad {auto} is not supported")
    # ONNX order: (top, left, bottom, right) = (x1_begin, x2_begin, x1_end, x2_end)
    return strides, pads, dil


def _as_2d(b, node, attrs, d: Data, W):
    """A 1-D convolution (data (1, C, L), weights (O, C/group, k)) as the 2-D one of height 1
    on the same flat layout: (1, C, 1, L) data, (O, C/group, 1, k) weights, the attributes
    with a height axis of stride 1, dilation 1 and no padding."""
    if len(d.shape) != 3 or d.shape[0] != 1:
        b.fail(node, f"a 1-D convolution needs data of shape (1, C, L), got {d.shape}")
    two = dict(attrs)
    two["strides"] = [1] + [int(s) for s in attrs.get("strides", [1])]
    two["dilations"] = [1] + [int(s) for s in attrs.get("dilations", [1])]
    pads = [int(p) for p in attrs.get("pads", [0, 0])]
    two["pads"] = [0, pads[0], 0, pads[1]]
    if "kernel_shape" in attrs:
        two["kernel_shape"] = [1] + list(attrs["kernel_shape"])
    d4 = T.view(d, lambda a: a.reshape(a.shape[:2] + (1,) + a.shape[2:]))
    return two, d4, W[:, :, None, :]


def _zero_padding(b, d):
    """(the unpadded image as data, pads (top, left, bottom, right)) when ``d`` (1, C, H, W)
    is one node's whole image with rows and columns of zeros around it (an ONNX ``Pad``,
    PyTorch's ``ZeroPad2d``), else None: a convolution reading it takes the padding as its
    own where no window then lies wholly in the padding, so that no element-moving node
    stands before it (rows on windows then cross it)."""
    if not isinstance(d, T.Data) or len(d.sources) != 1 or d.idx.ndim != 4 or d.idx.shape[0] != 1:
        return None
    s = d.sources[0]
    node_shape = tuple(b.nodes[s].shape)
    inside = d.idx[0] >= 0
    rows, cols = np.flatnonzero(inside.any(axis=(0, 2))), np.flatnonzero(inside.any(axis=(0, 1)))
    if rows.size == 0 or cols.size == 0 or len(node_shape) != 4:
        return None
    C, Hp, Wp = d.idx.shape[1:]
    t, bo, le, ri = int(rows[0]), Hp - 1 - int(rows[-1]), int(cols[0]), Wp - 1 - int(cols[-1])
    H, W = Hp - t - bo, Wp - le - ri
    if node_shape != (1, C, H, W) or t + bo + le + ri == 0:
        return None
    core = d.idx[0, :, t:Hp - bo, le:Wp - ri]
    ring = np.ones((C, Hp, Wp), bool)
    ring[:, t:Hp - bo, le:Wp - ri] = False
    consts = d.idx[0][ring]
    if not np.array_equal(core.reshape(-1), np.arange(C * H * W)) or np.any(consts >= 0) or \
            not np.all(d.table[-1 - consts] == 0.0):
        return None
    return T.Data.of_node(s, node_shape), (t, le, bo, ri)


def _conv(b, node, ins, attrs):
    d = b.data(node, ins[0])
    W = b.fconst(node, ins[1], "the weights")
    bias = b.fconst(node, ins[2], "the bias") if len(ins) > 2 and ins[2] is not None else None
    if W.ndim == 3:  # 1-D: as 2-D of height 1, the output's height axis dropped
        attrs, d4, W4 = _as_2d(b, node, attrs, d, W)
        out = _conv(b, node, [d4, Const(W4)] + list(ins[2:]), attrs)[0]
        return [T.view(out, lambda a: a.reshape(a.shape[:2] + a.shape[3:]))]
    if W.ndim != 4:
        b.fail(node, f"only 1-D and 2-D convolutions are supported (weights of shape {W.shape})")
    if "kernel_shape" in attrs and list(attrs["kernel_shape"]) != list(W.shape[2:]):
        b.fail(node, f"kernel_shape {list(attrs['kernel_shape'])} differs from the weights' {W.shape}")
    strides, pads, dil = _spatial(b, node, attrs, d, W.shape[2:])
    padded = _zero_padding(b, d)
    if padded is not None:  # a Pad with zeros before: the convolution's own padding
        total = [int(p) + int(e) for p, e in zip(pads, padded[1])]
        reach = [(int(k) - 1) * int(r) for k, r in zip(W.shape[2:], dil)] * 2
        if all(t <= m for t, m in zip(total, reach)):  # no window wholly in the padding
            d, pads = padded[0], tuple(total)
    try:
        op = Conv(W, bias, d.shape[1:], strides, pads, dil, int(attrs.get("group", 1)))
    except ValueError as exc:
        b.fail(node, str(exc))
    nid = b.node_of(d, _label(node))
    out = b.add(_label(node), op, (nid,), (1,) + op.out_shape)
    b.absorb_scale(b.fresh, node.input[0])
    return [out]


def _convt_pads(b, node, attrs, hw, kernel, strides, dil):
    """A ConvTranspose's pads (top, left, bottom, right) and output_padding: from ``pads``, or
    from ``auto_pad`` SAME_UPPER / SAME_LOWER (the output ``strides`` times the input, or
    ``output_shape``); an ``output_shape`` must agree with the output they give."""
    outpad = [int(p) for p in attrs.get("output_padding", [0, 0])]
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if len(strides) != 2 or len(dil) != 2 or len(outpad) != 2 or min(strides + dil) < 1 \
            or min(outpad) < 0:
        b.fail(node, f"strides {strides}, dilations {dil} and output_padding {outpad} must be "
                     "two positive (output_padding: non-negative) numbers each")
    # the output before padding is taken off, per axis
    full = [strides[a] * (hw[a] - 1) + outpad[a] + (kernel[a] - 1) * dil[a] + 1 for a in (0, 1)]
    shape = attrs.get("output_shape")
    shape = None if shape is None else [int(v) for v in shape][-2:]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [full[a] - (shape[a] if shape else hw[a] * strides[a]) for a in (0, 1)]
        small = [t // 2 for t in total]
        big = [t - s for t, s in zip(total, small)]
        pads = small + big if auto == "SAME_UPPER" else big + small
    elif auto in ("NOTSET", "VALID"):
        pads = [0, 0, 0, 0] if auto == "VALID" else [int(p) for p in attrs.get("pads", [0] * 4)]
        if len(pads) != 4:
            b.fail(node, f"pads {pads} are not (top, left, bottom, right)")
        if shape is not None and shape != [full[a] - pads[a] - pads[a + 2] for a in (0, 1)]:
            b.fail(node, f"output_shape {list(attrs['output_shape'])} differs from the output "
                         "its pads give; only an output_shape that agrees with them is supported")
    else:
        b.fail(node, f"auto_pad {auto} is not supported")
    return pads, outpad


def _conv_transpose(b, node, ins, attrs):
    """ConvTranspose as an element move and a Conv: the input's pixels spread ``strides``
    apart with zeros between them (a view with constant-0 entries: no node when the strides
    are 1), padded by ``dilation * (kernel - 1) - pads`` on each side (``output_padding`` more
    at the end; a negative amount crops), then a stride-1 Conv with the same dilations and
    the kernel flipped spatially, its input and output channels swapped within each group.
    ONNX's weights are (C, O / group, kh, kw); the Conv's are (O, C / group, kh, kw)."""
    d = b.data(node, ins[0])
    W = b.fconst(node, ins[1], "the weights")
    bias = b.fconst(node, ins[2], "the bias") if len(ins) > 2 and ins[2] is not None else None
    group = int(attrs.get("group", 1))
    if len(d.shape) != 4 or d.shape[0] != 1:
        b.fail(node, f"needs data of shape (1, C, H, W), got {d.shape}")
    C, H, Wd = d.shape[1:]
    if W.ndim != 4 or group < 1 or C % group or W.shape[0] != C:
        b.fail(node, f"weights of shape {W.shape} do not fit {C} input channels in {group} "
                     "groups (only 2-D transposed convolutions are supported)")
    kernel = list(W.shape[2:])
    if "kernel_shape" in attrs and list(attrs["kernel_shape"]) != kernel:
        b.fail(node, f"kernel_shape {list(attrs['kernel_shape'])} differs from the weights' {W.shape}")
    strides = [int(s) for s in attrs.get("strides", [1, 1])]
    dil = [int(s) for s in attrs.get("dilations", [1, 1])]
    pads, outpad = _convt_pads(b, node, attrs, (H, Wd), kernel, strides, dil)
    before = [dil[a] * (kernel[a] - 1) - pads[a] for a in (0, 1)]
    after = [dil[a] * (kernel[a] - 1) - pads[a + 2] + outpad[a] for a in (0, 1)]
    spread = (1, C, (H - 1) * strides[0] + 1, (Wd - 1) * strides[1] + 1)
    b.room(node, spread, "its spread input", given=[d.shape])
    idx, table = d.idx, d.table
    if strides != [1, 1]:
        idx = np.full(spread, -1 - table.size, np.int64)  # the constant 0 appended below
        idx[:, :, ::strides[0], ::strides[1]] = d.idx
        table = np.concatenate([table, [0.0]])
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0))
                 for lo, hi, n in zip(before, after, idx.shape[2:]))
    idx = idx[(slice(None), slice(None)) + crop]
    Og = W.shape[1]
    Cg = C // group
    weight = W.reshape(group, Cg, Og, *kernel).transpose(0, 2, 1, 3, 4)
    weight = weight.reshape(group * Og, Cg, *kernel)[:, :, ::-1, ::-1]
    conv_pads = [max(v, 0) for v in before] + [max(v, 0) for v in after]
    try:
        if 0 in idx.shape:
            raise ValueError(f"pads {pads} leave no output of the {H}x{Wd} input")
        op = Conv(weight, bias, idx.shape[1:], (1, 1), conv_pads, dil, group)
    except ValueError as exc:
        b.fail(node, str(exc))
    nid = b.node_of(Data(d.sources, idx, table), _label(node))
    out = b.add(_label(node), op, (nid,), (1,) + op.out_shape)
    b.absorb_scale(b.fresh, node.input[0])
    return [out]


def _pool(b, node, ins, attrs):
    import scipy.sparse as sp

    d = b.data(node, ins[0])
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides, pads, dil = _spatial(b, node, attrs, d, kernel)
    ceil = bool(attrs.get("ceil_mode", 0))
    if int(attrs.get("storage_order", 0)):
        b.fail(node, "storage_order 1 is not supported")
    out, win, padded = pool_windows(d.shape[1:], kernel, strides, pads, dil, ceil)
    nid = b.node_of(d, _label(node))
    if node.op_type in ("MaxPool", "GlobalMaxPool"):
        if np.any(np.all(win < 0, axis=1)):
            b.fail(node, "a window lies entirely in the padding")
        pool = MaxPool(win, d.idx.size, "x".join(map(str, kernel)),
                       geometry=(tuple(d.shape[1:]), kernel, strides, pads[:2], dil))
        return [b.add(_label(node), pool, (nid,), (1,) + out)]
    valid = win >= 0
    if int(attrs.get("count_include_pad", 0)):
        count = padded
    else:
        count = valid.sum(axis=1)
    label = f"average pool {kernel[0]}x{kernel[1]}"
    C, H, W = d.shape[1:]
    if count.size and np.all(count == count[0]) and (kernel[0] < H or kernel[1] < W):
        # one divisor for every window: a convolution of each channel by 1 / count (the
        # same products), whose transpose keeps the bound's rows on their windows
        op = Conv(np.full((C, 1) + tuple(kernel), 1.0 / count[0]), None, (C, H, W),
                  strides, pads, dil, C, label)
        if op.out_shape == tuple(out):
            return [b.add(_label(node), op, (nid,), (1,) + out)]
    rows = np.repeat(np.arange(win.shape[0]), valid.sum(axis=1))
    M = sp.csr_matrix((1.0 / np.repeat(count, valid.sum(axis=1)), (rows, win[valid])),
                      shape=(win.shape[0], d.idx.size))
    return [b.add(_label(node), Dense(M, None, label), (nid,), (1,) + out)]


def _global_pool(b, node, ins, attrs):
    """GlobalAveragePool / GlobalMaxPool: the pool whose window is the whole image."""
    d = b.data(node, ins[0])
    if len(d.shape) != 4:
        b.fail(node, f"needs data of shape (1, C, H, W), got {d.shape}")
    return _pool(b, node, ins, {"kernel_shape": list(d.shape[2:])})


def _reduce_mean(b, node, ins, attrs):
    """ReduceMean (ReduceSum) over constant axes (PyTorch's ``x.mean(dim)``, and its export
    of ``AdaptiveAvgPool2d(1)``): a sparse averaging (summing) Dense node."""
    import scipy.sparse as sp

    x = ins[0]
    rank = len(x.shape)
    if len(ins) > 1 and ins[1] is not None:  # opset 18: axes as an input
        axes = [int(a) for a in np.asarray(b.const(node, ins[1], "axes")).reshape(-1)]
    else:
        axes = None if attrs.get("axes") is None else [int(a) for a in attrs["axes"]]
    keep = bool(int(attrs.get("keepdims", 1)))
    if not axes:
        if int(attrs.get("noop_with_empty_axes", 0)):
            return [x]
        axes = list(range(rank))
    axes = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in axes):
        b.fail(node, f"axes {axes} are out of range for rank {rank}")
    mean = node.op_type == "ReduceMean"
    if isinstance(x, Const):
        fn = np.mean if mean else np.sum
        return [Const(fn(x.value, axis=tuple(axes), keepdims=keep))]
    d = b.data(node, x)
    size = int(np.prod(d.shape, dtype=np.int64))
    moved = np.moveaxis(np.arange(size).reshape(d.shape), axes,
                        list(range(rank - len(axes), rank)))
    k = int(np.prod([d.shape[a] for a in axes], dtype=np.int64))
    cols = moved.reshape(-1, k)
    rows = np.repeat(np.arange(cols.shape[0]), k)
    M = sp.csr_matrix((np.full(cols.size, 1.0 / k if mean else 1.0), (rows, cols.reshape(-1))),
                      shape=(cols.shape[0], size))
    shape = tuple(1 if a in axes else n for a, n in enumerate(d.shape)) if keep else \
        tuple(n for a, n in enumerate(d.shape) if a not in axes)
    nid = b.node_of(d, _label(node))
    label = f"{'mean' if mean else 'sum'} over axes {','.join(map(str, axes))}"
    return [b.add(_label(node), Dense(M, None, label), (nid,), shape)]


class _Part:
    """A node of one step of a composite operator, as the handlers take nodes: its name,
    the operator it plays, and its inputs (no tensor of its own: nothing folds into it)."""

    def __init__(self, node, suffix: str, op_type: str, n: int):
        self.name, self.op_type = f"{_label(node)}/{suffix}", op_type
        self.input = [""] * n


def normalize(b, node, d: Data, axes, eps: float, scale=None, bias=None) -> Data:
    """``(d - mean) / sqrt(var + eps) * scale + bias`` with the mean and the (biased) variance
    over ``axes`` (layer normalisation): averaging Dense nodes, a square, a sqrt, a division
    by data (reciprocal and product nodes); ``scale`` and ``bias`` arrays broadcast to d's
    shape (or None)."""
    if not (eps > 0.0 and np.isfinite(eps)):
        b.fail(node, f"epsilon {eps:g}: a positive number needed")
    mean = _reduce_mean(b, _Part(node, "mean", "ReduceMean", 1), [d],
                        {"axes": list(axes), "keepdims": 1})[0]
    c = _binary(b, _Part(node, "centred", "Sub", 2), [d, mean], {})[0]
    sq = _pow(b, _Part(node, "square", "Pow", 2), [c, Const(np.array(2.0))], {})[0]
    var = _reduce_mean(b, _Part(node, "variance", "ReduceMean", 1), [sq],
                       {"axes": list(axes), "keepdims": 1})[0]
    v = _binary(b, _Part(node, "plus_eps", "Add", 2), [var, Const(np.array(float(eps)))], {})[0]
    s = _activation(b, _Part(node, "std", "Sqrt", 1), [v], {})[0]
    y = _binary(b, _Part(node, "normed", "Div", 2), [c, s], {})[0]
    if scale is not None:
        y = _binary(b, _Part(node, "scale", "Mul", 2), [y, Const(scale)], {})[0]
    if bias is not None:
        y = _binary(b, _Part(node, "bias", "Add", 2), [y, Const(bias)], {})[0]
    return y


def _layer_norm(b, node, ins, attrs):
    """LayerNormalization (opset 17): over the axes from ``axis`` to the last, by
    :func:`normalize`."""
    d = b.data(node, ins[0])
    rank = len(d.shape)
    axis = int(attrs.get("axis", -1))
    axis = axis + rank if axis < 0 else axis
    if not 0 < axis < rank:
        b.fail(node, f"axis {attrs.get('axis', -1)} is out of range for rank {rank} (the batch "
                     "axis is not normalised)")
    scale = b.fconst(node, ins[1], "the scale") if len(ins) > 1 and ins[1] is not None else None
    bias = b.fconst(node, ins[2], "the bias") if len(ins) > 2 and ins[2] is not None else None
    for what, v in (("scale", scale), ("bias", bias)):
        if v is not None:
            try:
                np.broadcast_shapes(v.shape, d.shape[axis:])
            except ValueError:
                b.fail(node, f"the {what} of shape {v.shape} does not fit {d.shape[axis:]}")
    return [normalize(b, node, d, range(axis, rank), float(attrs.get("epsilon", 1e-5)),
                      scale, bias)]


def _mod(b, node, ins, attrs):
    """Mod of constants (shape arithmetic, e.g. PyTorch's attention export checking its head
    size): numpy's ``mod`` (the divisor's sign, ONNX fmod 0) or ``fmod`` (fmod 1)."""
    fn = np.fmod if int(attrs.get("fmod", 0)) else np.mod
    return _const_fn(fn)(b, node, ins, attrs)


def _instance_norm(b, node, ins, attrs):
    """InstanceNormalization: each (sample, channel)'s values over the spatial axes, then the
    channel's scale and bias, by :func:`normalize` (PyTorch exports GroupNorm as this between
    two reshapes)."""
    d = b.data(node, ins[0])
    if len(d.shape) < 3:
        b.fail(node, f"needs data of shape (N, C, ...), got {d.shape}")
    C = d.shape[1]
    scale, bias = (b.fconst(node, v, w) for v, w in zip(ins[1:3], ("the scale", "the bias")))
    if scale.size != C or bias.size != C:
        b.fail(node, f"scale and bias of {scale.size} and {bias.size} values for {C} channels")
    bshape = (1, C) + (1,) * (len(d.shape) - 2)
    return [normalize(b, node, d, range(2, len(d.shape)), float(attrs.get("epsilon", 1e-5)),
                      scale.reshape(bshape), bias.reshape(bshape))]


def _batchnorm(b, node, ins, attrs):
    d = b.data(node, ins[0])
    if int(attrs.get("training_mode", 0)):
        b.fail(node, "training_mode 1 is not supported (inference only)")
    scale, bias, mean, var = (b.fconst(node, v, w) for v, w in
                              zip(ins[1:5], ("scale", "B", "mean", "var")))
    eps = float(attrs.get("epsilon", 1e-5))
    if len(d.shape) < 2 or np.any(var + eps <= 0):
        b.fail(node, "needs data with a channel axis and var + epsilon > 0")
    a = scale / np.sqrt(var + eps)
    c = bias - mean * a
    bshape = (1, d.shape[1]) + (1,) * (len(d.shape) - 2)
    return [b.scale(node, d, a.reshape(bshape), c.reshape(bshape), node.input[0])]


_ACT = {"Relu": "relu", "LeakyRelu": "leaky_relu", "Sigmoid": "sigmoid", "Tanh": "tanh",
        "Atan": "arctan", "Erf": "erf", "Elu": "elu", "Softplus": "softplus",
        "HardSigmoid": "hard_sigmoid", "HardSwish": "hardswish", "Mish": "mish", "Sin": "sin", "Cos": "cos", "Exp": "exp", "Reciprocal": "reciprocal",
        "Sqrt": "sqrt"}
_ACT_DEFAULT = {"LeakyRelu": 0.01, "Elu": 1.0, "HardSigmoid": 0.2}


def _activation(b, node, ins, attrs):
    name = _ACT[node.op_type]
    if isinstance(ins[0], Const):  # a subgraph of constants: folded (float64)
        alpha = attrs.get("alpha", _ACT_DEFAULT.get(node.op_type))
        value = np.asarray(ins[0].value, np.float64)
        return [Const(apply_activation(name, value, None if alpha is None else float(alpha)))]
    d = b.data(node, ins[0])
    alpha = None
    if node.op_type in _ACT_DEFAULT:
        alpha = float(attrs.get("alpha", _ACT_DEFAULT[node.op_type]))
        _check_param(b, node, name, alpha)
    if node.op_type == "HardSigmoid" and float(attrs.get("beta", 0.5)) != 0.5:
        b.fail(node, "only beta 0.5 is supported")
    nid = b.node_of(d, _label(node))
    return [b.add(_label(node), ActivationOp(name, alpha), (nid,), d.shape)]


def _check_param(b, node, name: str, alpha: float) -> None:
    """Refuse (one line naming the node) a parameter outside the range a graph's activation
    ``name`` is bounded for."""
    rng = param_range(name, graph=True)
    if not param_ok(rng, alpha):
        b.fail(node, f"alpha {alpha:g} is outside the range the bounds hold for "
                     f"{range_text(rng)}")


def _act_node(b, node, x, name: str, param):
    """Activation ``name`` (crown_cli.activations) with parameter ``param`` of x: folded
    (float64) where x is a constant, else an activation node."""
    if isinstance(x, Const):
        return Const(apply_activation(name, np.asarray(x.value, np.float64), param))
    d = b.data(node, x)
    return b.add(_label(node), ActivationOp(name, param), (b.node_of(d, _label(node)),), d.shape)


def _gelu(b, node, ins, attrs):
    """ONNX Gelu (opset 20; exact or approximate='tanh'), or PyTorch's exported erf pattern
    fused at load (graph/onnx_fusion.py; attribute ``scale``: erf's multiplier, as float64
    text), or its tanh chain (attribute ``allowance``, text: how far the chain's float32
    constants put it from the tanh form; the node's parameter)."""
    approximate = attrs.get("approximate", b"none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    if approximate not in ("none", "tanh"):
        b.fail(node, f"approximate='{approximate}' is not supported ('none' or 'tanh')")
    name, s = ("gelu", attrs.get("scale", ACTIVATIONS["gelu"].default_param)) \
        if approximate == "none" else ("gelu_tanh", attrs.get("allowance"))
    if isinstance(s, bytes):
        s = float(s.decode())
    return [_act_node(b, node, ins[0], name, s)]


def _swish(b, node, ins, attrs):
    """x sigmoid(alpha x): ONNX Swish (opset 24), or PyTorch's SiLU, Mul(x, Sigmoid(x)),
    fused at load (graph/onnx_fusion.py)."""
    alpha = float(attrs.get("alpha", 1.0))
    if not alpha > 0.0:
        b.fail(node, f"alpha {alpha:g} is not supported (only alpha > 0)")
    return [_act_node(b, node, ins[0], "silu", alpha)]


SELU_ALPHA = 1.67326319217681884765625  # ONNX Selu's defaults (float32 values)
SELU_GAMMA = 1.05070102214813232421875


def _scaled_elu(b, node, x, alpha: float, inner: float, outer: float):
    """``outer * elu_alpha(inner * x)``: of a constant folded (float64), else an ELU node
    between two scalings (each left out where it is 1; the inner one folded into x's
    producer where it may be)."""
    if isinstance(x, Const):
        v = np.asarray(x.value, np.float64)
        return Const(outer * apply_activation("elu", inner * v, alpha))
    d = b.data(node, x)
    z = b.scale(node, d, inner, None, node.input[0])
    return b.scale(node, _act_node(b, node, z, "elu", alpha), outer, None, None)


def _celu(b, node, ins, attrs):
    """ONNX Celu, ``max(0, x) + min(0, alpha (exp(x / alpha) - 1))`` = ``alpha elu_1(x /
    alpha)``: a scaling by 1 / alpha, ELU (scale 1), a scaling by alpha (alpha > 0)."""
    alpha = float(attrs.get("alpha", 1.0))
    if not (np.isfinite(alpha) and alpha > 0.0):
        b.fail(node, f"alpha {alpha:g} is not supported (only alpha > 0)")
    return [_scaled_elu(b, node, ins[0], 1.0, 1.0 / alpha, alpha)]


def _selu(b, node, ins, attrs):
    """ONNX Selu, ``gamma x`` for x > 0 and ``gamma alpha (exp(x) - 1)`` for x <= 0 =
    ``gamma elu_alpha(x)``: ELU with scale alpha (a graph node: alpha > 1 has a concave kink
    at 0), then a scaling by gamma."""
    alpha = float(attrs.get("alpha", SELU_ALPHA))
    gamma = float(attrs.get("gamma", SELU_GAMMA))
    _check_param(b, node, "elu", alpha)
    if not np.isfinite(gamma):
        b.fail(node, f"gamma {gamma:g} is not supported (only finite)")
    return [_scaled_elu(b, node, ins[0], alpha, 1.0, gamma)]


def _softplus_threshold(b, node, ins, attrs):
    """Where(Greater(z, T), z, Softplus(z)) fused at load (graph/onnx_fusion.py; attribute
    ``threshold``: T as text)."""
    T = float(attrs["threshold"].decode())
    return [_act_node(b, node, ins[0], "softplus_t", T)]


_STEPS = {"Sign": ("sign", np.sign), "Floor": ("floor", np.floor)}


def _step(b, node, ins, attrs):
    """Sign and Floor: of a constant (binarised weights, shape arithmetic) folded to a
    constant; of data an activation node (relaxations: crown_cli/engine/relaxations/sign.py,
    floor.py)."""
    name, fn = _STEPS[node.op_type]
    x = ins[0]
    if isinstance(x, Const):
        if x.value.dtype.kind not in "fiub":
            b.fail(node, f"the input has dtype {x.value.dtype}, expected numbers")
        return [Const(fn(x.value))]
    nid = b.node_of(x, _label(node))
    return [b.add(_label(node), ActivationOp(name), (nid,), x.shape)]


_POWERS = {0.5: "sqrt", 2.0: "square", 3.0: "cube"}


def _pow(b, node, ins, attrs):
    """Pow by a constant exponent: of constants folded; of data 1 the data itself, 0.5, 2 and
    3 activation nodes (relaxations: crown_cli/engine/relaxations/elementary.py)."""
    x, y = ins[0], ins[1]
    if isinstance(x, Const) and isinstance(y, Const):
        return [Const(np.power(np.asarray(x.value, np.float64), np.asarray(y.value, np.float64)))]
    if not isinstance(y, Const):
        b.fail(node, "the exponent must be a constant, not data")
    d = b.data(node, x)
    e = np.asarray(y.value, np.float64)
    if e.size == 0 or np.any(e != e.reshape(-1)[0]):
        b.fail(node, f"the exponent must be one number, got {e.reshape(-1)[:4]}")
    try:
        fits = np.broadcast_shapes(d.shape, e.shape) == d.shape
    except ValueError:
        fits = False
    if not fits:
        b.fail(node, f"the exponent of shape {e.shape} does not fit the data's {d.shape}")
    p = float(e.reshape(-1)[0])
    if p == 1.0:
        return [d]
    if p not in _POWERS:
        b.fail(node, f"exponent {p:g} (supported for data: 0.5, 1, 2, 3)")
    nid = b.node_of(d, _label(node))
    return [b.add(_label(node), ActivationOp(_POWERS[p]), (nid,), d.shape)]


# order-preserving functions of the whole output: only at the graph's output (load_graph
# refuses anything but a reshape of their result), where they become Graph.vector_output
VECTOR_OUTPUTS = {"Softmax": "softmax", "LogSoftmax": "log_softmax"}
SHAPE_OPS = ("Identity", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze")


def _vector_output(b, node, ins, attrs):
    """Softmax / LogSoftmax over all of the data's values: the data itself (the logits);
    the loader records the node (``b.vector_out``)."""
    d = b.data(node, ins[0])
    rank, n = len(d.shape), int(np.prod(d.shape, dtype=np.int64))
    axis = int(attrs.get("axis", -1 if b.opset >= 13 else 1))
    axis += rank if axis < 0 else 0
    along = 0
    if 0 <= axis < rank:
        along = d.shape[axis] if b.opset >= 13 else int(np.prod(d.shape[axis:], dtype=np.int64))
    if along != n and node.op_type == "Softmax" and 0 <= axis < rank:
        return [_softmax_inside(b, node, d, axis, along)]
    if along != n:
        b.fail(node, f"axis {attrs.get('axis', 'default')} does not run over all {n} outputs "
                     f"of shape {d.shape}")
    if b.vector_out is not None:
        b.fail(node, f"{b.vector_out[0].op_type} is supported only at the output")
    b.vector_out = (node, b.position)
    return [d]


HANDLERS = {
    "Identity": _identity, "Dropout": _identity, "Cast": _cast,
    "Reshape": _moved(_reshape), "Flatten": _moved(_flatten), "Transpose": _moved(_transpose),
    "Squeeze": _moved(_squeeze), "Unsqueeze": _moved(_unsqueeze), "Slice": _moved(_slice),
    "Gather": _moved(_gather), "Expand": _moved(_expand), "Concat": _concat, "Split": _split,
    "Pad": _pad, "Upsample": _moved(_resize), "Resize": _resize_any,
    "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary, "Neg": _neg,
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "ConvTranspose": _conv_transpose,
    "AveragePool": _pool, "MaxPool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool, "ReduceMean": _reduce_mean,
    "ReduceSum": _reduce_mean,
    "BatchNormalization": _batchnorm, "LayerNormalization": _layer_norm,
    "InstanceNormalization": _instance_norm,
    "Constant": _constant, "Shape": _shape,
    "ConstantOfShape": _constant_of_shape,
    "Equal": _const_fn(np.equal), "Where": _const_fn(np.where), "Less": _const_fn(np.less),
    "Greater": _const_fn(np.greater), "Not": _const_fn(np.logical_not),
    "Range": _range, "Floor": _step,
    "Ceil": _const_fn(np.ceil), "Mod": _mod, "Abs": relu_forms.absolute,
    "Min": relu_forms.max_min, "Max": relu_forms.max_min, "Clip": relu_forms.clip,
    "PRelu": relu_forms.prelu, "Sign": _step, "Pow": _pow, "Gelu": _gelu, "Swish": _swish,
    "Celu": _celu, "Selu": _selu,
    **{op: _activation for op in _ACT}, **{op: _vector_output for op in VECTOR_OUTPUTS},
}

SUPPORTED = ", ".join(sorted(HANDLERS))
# nodes graph/onnx_fusion.py writes that are no ONNX operator, in a domain of their own
FUSED_DOMAIN = "crown.fused"
FUSED_HANDLERS = {"SoftplusThreshold": _softplus_threshold}

_AFFINE = "affine in the data (constant operands); bounds exact, rounding charged"
_MOVE = "element move (an index map: each output one input element or a constant)"
_HOW = {
    "Add": "data + constant: a scaling; data + data: a sum node", "Sub": "as Add",
    "Mul": "data * constant: a scaling; data * data: a product node (McCormick's two planes "
           "averaged, intercepts over the factors' box; alpha-CROWN optimises the mix)",
    "Div": "data / constant: a scaling; constant / data and data / data: Reciprocal, then a "
           "product", "Neg": _AFFINE,
    "MatMul": "by a constant: a dense layer; of two data tensors: products and a sum (attention)",
    "Gemm": _AFFINE, "Conv": _AFFINE + " (1-D as 2-D of height 1)",
    "ConvTranspose": "spread by the strides with zeros, padded, a stride-1 Conv (flipped kernel)",
    "AveragePool": _AFFINE, "GlobalAveragePool": _AFFINE, "ReduceMean": _AFFINE,
    "ReduceSum": _AFFINE, "BatchNormalization": "a scaling, folded where it can be",
    "MaxPool": "max pool: lines per window (the lower line's weights optimised by alpha-CROWN)",
    "GlobalMaxPool": "as MaxPool",
    "Resize": "nearest, whole scales: " + _MOVE + "; linear (any scales or sizes; "
              "half_pixel, pytorch_half_pixel, align_corners, asymmetric): an affine node of "
              "interpolation weights", "Upsample": "as Resize in mode nearest",
    "Softmax": "on the output: dropped (the logits; properties comparing outputs only); inside "
               "a graph: 1 / sum_j exp(x_j - x_i)",
    "LogSoftmax": "on the output only: dropped (the logits)",
    "Cast": "to float32 / float64: the identity; other casts of data refused",
    "Sign": "activation: constant where the sign is fixed, else least-area lines over the jump",
    "Floor": "activation: constant between two integers, else two lines of slope at most 1 "
             "(of constants: folded)",
    "Sin": "activation: tangent and chord where convex or concave, else chord-slope lines",
    "Cos": "as Sin", "Exp": "activation: chord above, midpoint tangent below",
    "Reciprocal": "activation (one side of 0): chord and midpoint tangent; across 0 no bound",
    "Pow": "by the constant 1: the identity; 2: activation, chord above and midpoint tangent "
           "below; 3: the same on one side of 0, across it chord-slope lines; 0.5: as Sqrt; "
           "other exponents of data refused",
    "LayerNormalization": "(x - mean) / sqrt(variance + epsilon) * scale + bias over the axes "
                          "from axis on: averaging Dense nodes, a square, Sqrt, a division by "
                          "data (reciprocal and product nodes)",
    "InstanceNormalization": "as LayerNormalization over each channel's spatial axes "
                             "(PyTorch's GroupNorm export: between two reshapes)",
    "Sqrt": "activation (z >= 0): midpoint tangent above, chord below; below 0 no bound "
            "(layer normalisation's 1 / sqrt(variance + eps): Sqrt, then a division)",
    "Gelu": "activation: least-area lines with exact intercepts (also PyTorch's exported "
            "pattern, Div, Erf, Add, Mul, Mul, fused at load); approximate='tanh' likewise "
            "(also the TorchScript exporter's Tanh chain, fused, its lines moved out by ~1e-8 "
            "for its float32 constants)",
    "Clip": "lo + relu(x - lo) - relu(x - hi): ReLU nodes (bounds, alpha-CROWN, ReLU "
            "splitting)",
    "Max": "of data: y + relu(x - y) (a constant y too), pairwise; of constants: folded",
    "Min": "of data: y - relu(y - x), pairwise; of constants: folded",
    "Abs": "of data: relu(x) + relu(-x); of constants: folded",
    "PRelu": "one slope in [0, 1]: a leaky ReLU; else relu(x) - a relu(-x)",
    "Swish": "activation x sigmoid(alpha x) (SiLU): as Gelu (also PyTorch's Mul(x, Sigmoid(x)), "
             "fused at load)",
    "HardSwish": "activation: as Gelu (lines of least area, exact intercepts, exact range)",
    "Mish": "activation: as Gelu (also PyTorch's legacy export, Mul(x, Tanh(Softplus(x))), "
            "fused at load)",
    "Softplus": "activation: chord above, midpoint tangent below; torch's default export, "
                "Where(Greater(z, 20), z, Softplus(z)), fused at load into one node whose "
                "lower line moves down by log1p(exp(-20)) across 20",
    "Celu": "alpha elu(x / alpha): scalings around an ELU node (scale 1): chord above, "
            "midpoint tangent below",
    "Selu": "gamma elu_alpha(x): an ELU node (scale alpha; above 1 a concave kink at 0: "
            "least-area lines, exact intercepts, exact range), then a scaling by gamma",
    "Erf": "activation: S-shaped, the tanh construction (tangent lines, exact intercepts)",
    "Relu": "activation: CROWN's adaptive lines; slopes optimised by alpha-CROWN; split by "
            "branch and bound", "LeakyRelu": "as Relu",
}


def operator_table():
    """(operator, how it is read and bounded) for every ONNX operator the loader takes."""
    rows = []
    for op in sorted(HANDLERS):
        how = _HOW.get(op)
        if how is None:
            handler = HANDLERS[op]
            if op in _ACT:
                how = f"activation ({_ACT[op]}): CROWN's lines (engine/relaxations)"
            elif op in ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice",
                        "Gather", "Expand", "Concat", "Split", "Pad", "Identity", "Dropout"):
                how = _MOVE
            elif op in ("Constant", "ConstantOfShape", "Shape", "Range") or \
                    getattr(handler, "__qualname__", "").startswith("_const_fn"):
                how = "constants only (shape arithmetic), folded at load"
            else:
                how = _AFFINE
        rows.append((op, how))
    return rows
