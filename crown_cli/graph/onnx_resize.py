"""ONNX ``Resize`` in mode ``linear`` (bilinear upsampling of segmentation networks and of
PyTorch's ``nn.Upsample(mode="bilinear")``): an affine node. Each output coordinate of a
resized axis reads ``x_original`` from ONNX's coordinate transformation; its value is
``(1 - r) x[i] + r x[i + 1]`` with ``i = floor(x_original)``, ``r`` the fraction, both
neighbours clamped into the axis (ONNX's edge padding). Over several axes the weights
multiply (the Kronecker product of the axes' matrices), so the node is a sparse
:class:`~crown_cli.graph.ops.Dense` with at most 2^k terms a row for k resized axes. Mode
``nearest`` is an element move (:func:`crown_cli.graph.onnx_moves._resize`)."""
from __future__ import annotations

import numpy as np

from crown_cli.graph.onnx_moves import _text, resize_given, resize_inputs
from crown_cli.graph.ops import Dense
from crown_cli.graph.tensors import Const

# output coordinate y of an axis of n elements scaled by s -> where it reads; ONNX's
# "length_resized" is n s (unrounded when scales are given, as onnx's reference evaluator)
_LINEAR_COORDINATES = {
    "half_pixel": lambda y, n, s: (y + 0.5) / s - 0.5,
    "pytorch_half_pixel": lambda y, n, s: (y + 0.5) / s - 0.5 if n * s > 1 else 0.0 * y,
    "align_corners": lambda y, n, s: y * (n - 1) / (n * s - 1) if n * s > 1 else 0.0 * y,
    "asymmetric": lambda y, n, s: y / s,
}


def axis_weights(n: int, m: int, s: float, mode: str):
    """The (m, n) interpolation matrix of one axis as (rows, columns, weights)."""
    y = np.arange(m, dtype=np.float64)
    x = _LINEAR_COORDINATES[mode](y, n, s)
    i0 = np.floor(x)
    r = x - i0
    lo = np.clip(i0, 0, n - 1).astype(np.int64)
    hi = np.clip(i0 + 1, 0, n - 1).astype(np.int64)
    rows = np.concatenate([np.arange(m), np.arange(m)])
    cols = np.concatenate([lo, hi])
    w = np.concatenate([1.0 - r, r])
    keep = w != 0.0
    return rows[keep], cols[keep], w[keep]


def linear_matrix(shape, axes, sizes, scales, mode):
    """The sparse (prod(out), prod(shape)) matrix of the resize over the flat row-major
    tensor, and the output shape."""
    import scipy.sparse as sp

    M = sp.identity(1, format="csr")
    out = []
    for a, n in enumerate(shape):
        if a in axes:
            k = axes.index(a)
            m, s = int(sizes[k]), float(scales[k])
            r, c, w = axis_weights(n, m, s, mode)
            A = sp.csr_matrix((w, (r, c)), shape=(m, n))
        else:
            m, A = n, sp.identity(n, format="csr")
        out.append(m)
        M = sp.kron(M, A, format="csr")
    M.sum_duplicates()
    M.eliminate_zeros()
    return M, tuple(out)


def resize_linear(b, node, ins, attrs):
    """``Resize`` (opset 11+) in mode ``linear``: scales or sizes, the coordinate
    transformations of :data:`_LINEAR_COORDINATES`; antialias, ``tf_crop_and_resize`` and
    ``half_pixel_symmetric`` are refused by name."""
    x = ins[0]
    if x is None:
        b.fail(node, "missing input")
    rank = len(x.shape)
    if b.opset < 11:
        b.fail(node, "mode 'linear' is supported from opset 11 (Resize with scales or sizes)")
    mode = _text(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if mode not in _LINEAR_COORDINATES:
        b.fail(node, f"mode 'linear' with coordinate_transformation_mode '{mode}' is not "
                     f"supported ({', '.join(_LINEAR_COORDINATES)})")
    if int(attrs.get("antialias", 0)):
        b.fail(node, "antialias is not supported")
    if _text(attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":  # scales too
        b.fail(node, "only keep_aspect_ratio_policy stretch is supported")
    axes, scales, sizes = resize_inputs(b, node, ins, attrs, rank)
    given = resize_given(b, node, x.shape, axes, scales, sizes)
    dims = np.array([x.shape[a] for a in axes], np.float64)
    if sizes is not None:
        out, s = given.astype(np.int64), given / np.maximum(dims, 1.0)
    else:
        out, s = np.floor(dims * given).astype(np.int64), given
    if np.any(out < 1) or np.any(s <= 0.0) or np.any(dims < 1):
        b.fail(node, f"{'sizes' if sizes is not None else 'scales'} {given.tolist()} for an "
                     f"input of shape {x.shape}: every axis must keep at least one element")
    shape = tuple(int(n) for n in x.shape)
    M, out_shape = linear_matrix(shape, axes, out, s, mode)
    if isinstance(x, Const):
        return [Const((M @ np.asarray(x.value, np.float64).reshape(-1)).reshape(out_shape))]
    d = b.data(node, x)
    b.room(node, out_shape, given=[x.shape])
    nid = b.node_of(d, node.name or node.op_type)
    label = f"linear resize {'x'.join(map(str, shape))} -> {'x'.join(map(str, out_shape))}"
    return [b.add(node.name or node.op_type, Dense(M, None, label), (nid,), out_shape)]
