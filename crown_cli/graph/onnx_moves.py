"""Handlers of the ONNX operators that move elements (reshapes, slices, gathers, concats,
pads, ...) and of the shape arithmetic on constants, for
:func:`crown_cli.graph.onnx_graph.load_graph`: each acts on a constant's values or on the
index array of a data view (:mod:`crown_cli.graph.tensors`), creating no node.
"""
from __future__ import annotations

import numpy as np

from crown_cli.graph import tensors as T
from crown_cli.graph.tensors import Const, Data


def _ints(v):
    return [int(a) for a in np.asarray(v).reshape(-1)]


def _axis(b, node, axis, rank):
    if not -rank <= axis < rank:
        b.fail(node, f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _moved(fn):
    """A handler for an element-moving operator: ``fn(b, node, ins, attrs, x)`` -> numpy
    function of one array, applied to the first input (constant or data)."""
    def handler(b, node, ins, attrs):
        x = ins[0]
        if x is None:
            b.fail(node, "missing input")
        try:
            return [T.view(x, fn(b, node, ins, attrs, x))]
        except (ValueError, IndexError) as exc:  # numpy's shape errors (AxisError is both)
            b.fail(node, f"does not fit the input of shape {x.shape} ({exc})")
    return handler


def _identity(b, node, ins, attrs):
    return [ins[0]]


def _reshape(b, node, ins, attrs, x):
    target = b.const(node, ins[1], "the shape")
    return lambda a: T.onnx_reshape(a, target, bool(attrs.get("allowzero", 0)))


def _flatten(b, node, ins, attrs, x):
    axis = _axis(b, node, int(attrs.get("axis", 1)), len(x.shape) + 1)
    return lambda a: T.onnx_flatten(a, axis)


def _transpose(b, node, ins, attrs, x):
    perm = attrs.get("perm")
    perm = None if perm is None else [int(p) for p in perm]
    return lambda a: np.transpose(a, perm)


def _axes_of(b, node, ins, attrs):
    if len(ins) > 1 and ins[1] is not None:
        return tuple(_ints(b.const(node, ins[1], "axes")))
    axes = attrs.get("axes")
    return None if axes is None else tuple(int(a) for a in axes)


def _squeeze(b, node, ins, attrs, x):
    axes = _axes_of(b, node, ins, attrs)
    return lambda a: np.squeeze(a, axis=axes)


def _unsqueeze(b, node, ins, attrs, x):
    axes = _axes_of(b, node, ins, attrs)
    if axes is None:
        b.fail(node, "Unsqueeze without axes")
    return lambda a: np.expand_dims(a, axes)


def _slice(b, node, ins, attrs, x):
    rank = len(x.shape)
    if b.opset < 10:
        starts, ends = attrs.get("starts"), attrs.get("ends")
        axes, steps = attrs.get("axes"), None
    else:
        starts = _ints(b.const(node, ins[1], "starts"))
        ends = _ints(b.const(node, ins[2], "ends"))
        axes = _ints(b.const(node, ins[3], "axes")) if len(ins) > 3 and ins[3] is not None else None
        steps = _ints(b.const(node, ins[4], "steps")) if len(ins) > 4 and ins[4] is not None else None
    axes = list(range(len(starts))) if axes is None else [_axis(b, node, a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    return lambda a: T.onnx_slice(a, starts, ends, axes, steps)


def _gather(b, node, ins, attrs, x):
    ind = np.asarray(b.const(node, ins[1], "the indices")).astype(np.int64)
    axis = _axis(b, node, int(attrs.get("axis", 0)), len(x.shape))
    dim = x.shape[axis]
    if np.any((ind < -dim) | (ind >= dim)):
        b.fail(node, f"indices out of range for dimension {dim}")
    ind = np.where(ind < 0, ind + dim, ind)
    return lambda a: np.take(a, ind, axis=axis)


def _expand(b, node, ins, attrs, x):
    shape = b.const(node, ins[1], "the shape")
    try:
        out = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    except ValueError:
        out = None  # onnx_expand's own message
    if out is not None:
        b.room(node, out, given=[x.shape])
    return lambda a: T.onnx_expand(a, shape)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# where output coordinate y of an axis of n elements scaled by s (whole) reads, before rounding
_COORDINATES = {
    "half_pixel": lambda y, n, s: (y + 0.5) / s - 0.5,
    "half_pixel_symmetric": lambda y, n, s: (y + 0.5) / s - 0.5,  # the same for whole scales
    "pytorch_half_pixel": lambda y, n, s: (y + 0.5) / s - 0.5 if n * s > 1 else 0 * y,
    "align_corners": lambda y, n, s: y * (n - 1) / (n * s - 1) if n * s > 1 else 0 * y,
    "asymmetric": lambda y, n, s: y / s,
    "tf_half_pixel_for_nn": lambda y, n, s: (y + 0.5) / s,
}
_ROUNDING = {"round_prefer_floor": lambda x: np.ceil(x - 0.5),
             "round_prefer_ceil": lambda x: np.floor(x + 0.5),
             "floor": np.floor, "ceil": np.ceil}


def _resize_factors(b, node, ins, attrs, rank):
    """(axes, whole scale per axis, coordinate transformation, nearest_mode) of an Upsample or
    Resize in mode nearest."""
    mode = _text(attrs.get("mode", "nearest"))
    if mode != "nearest":
        b.fail(node, f"mode '{mode}' is not supported; only nearest (each output element a "
                     "copy of one input element) and, for Resize, linear")
    if node.op_type == "Upsample" or b.opset < 11:  # Upsample and Resize-10: floor(y / scale)
        axes = _resize_axes(b, node, attrs, rank)
        given = attrs.get("scales") if len(ins) < 2 else b.const(node, ins[1], "the scales")
        scales, sizes, how = given, None, ("asymmetric", "floor")
    else:
        axes, scales, sizes = resize_inputs(b, node, ins, attrs, rank)
        how = (_text(attrs.get("coordinate_transformation_mode", "half_pixel")),
               _text(attrs.get("nearest_mode", "round_prefer_floor")))
        if int(attrs.get("antialias", 0)):
            b.fail(node, "antialias is not supported in mode nearest")
    if how[0] not in _COORDINATES or how[1] not in _ROUNDING:
        b.fail(node, f"coordinate_transformation_mode '{how[0]}' with nearest_mode '{how[1]}' "
                     f"is not supported ({', '.join(_COORDINATES)}; {', '.join(_ROUNDING)})")
    return axes, scales, sizes, how


def resize_inputs(b, node, ins, attrs, rank):
    """A Resize's (opset 11+) axes, and its scales and sizes (None where not given), with
    ``keep_aspect_ratio_policy`` stretch where sizes are given."""
    axes = _resize_axes(b, node, attrs, rank)
    scales, sizes = [None if len(ins) <= k or ins[k] is None
                     or b.const(node, ins[k], "the scales and sizes").size == 0
                     else ins[k].value for k in (2, 3)]
    if sizes is not None and _text(attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        b.fail(node, "only keep_aspect_ratio_policy stretch is supported")
    return axes, scales, sizes


def _resize_axes(b, node, attrs, rank):
    return list(range(rank)) if attrs.get("axes") is None else \
        [_axis(b, node, int(a), rank) for a in attrs["axes"]]


def resize_given(b, node, shape, axes, scales, sizes) -> np.ndarray:
    """The sizes (where given) or the scales, float64, one per axis of ``axes``."""
    if scales is None and sizes is None:
        b.fail(node, "has neither scales nor sizes")
    given = np.asarray(sizes if sizes is not None else scales, np.float64).reshape(-1)
    if given.size != len(axes):
        b.fail(node, f"{'sizes' if sizes is not None else 'scales'} {given.tolist()} do not "
                     f"match the {len(axes)} axes of the input of shape {tuple(shape)}")
    return given


def _resize(b, node, ins, attrs, x):
    """Upsample / Resize in mode nearest by whole factors (scales, or sizes that are multiples
    of the input's): each output element copies one input element, chosen per axis by ONNX's
    coordinate transformation and rounding, clamped to the axis."""
    axes, scales, sizes, how = _resize_factors(b, node, ins, attrs, len(x.shape))
    dims = [x.shape[a] for a in axes]
    given = resize_given(b, node, x.shape, axes, scales, sizes)
    whole = given / np.maximum(dims, 1) if sizes is not None else given
    if np.any(whole != np.round(whole)) or np.any(whole < 1) or 0 in dims:
        b.fail(node, f"{'sizes' if sizes is not None else 'scales'} {given.tolist()} for an "
                     f"input of shape {x.shape}: only whole scales of at least 1 are supported")
    out = list(x.shape)
    for a, s in zip(axes, whole):
        out[a] *= int(s)
    b.room(node, out, given=[x.shape])
    sources = []
    for n, s in zip(dims, whole.astype(np.int64)):
        y = np.arange(n * int(s), dtype=np.float64)
        at = _ROUNDING[how[1]](_COORDINATES[how[0]](y, n, float(s)))
        sources.append(np.clip(at, 0, n - 1).astype(np.int64))

    def spread(a):
        for ax, src in zip(axes, sources):
            a = np.take(a, src, axis=ax)
        return a
    return spread


def _cast(b, node, ins, attrs):
    x = ins[0]
    if isinstance(x, Const):
        dtype = b.onnx.helper.tensor_dtype_to_np_dtype(int(attrs["to"]))
        return [Const(x.value.astype(dtype))]
    dtype = b.onnx.helper.tensor_dtype_to_np_dtype(int(attrs["to"]))
    # the network is read as real-valued: a cast to float32 or float64 is the identity; one to
    # an integer or to a narrower float (float16, bfloat16) rounds the data and is refused
    if np.dtype(dtype).kind != "f" or np.dtype(dtype).itemsize < 4:
        b.fail(node, f"casts data to {np.dtype(dtype)}, which changes its values; only casts "
                     "to float32 and float64 pass")
    return [x]


def _concat(b, node, ins, attrs):
    if any(v is None for v in ins):
        b.fail(node, "missing input")
    rank = len(ins[0].shape)
    axis = _axis(b, node, int(attrs["axis"]), rank)
    try:
        if all(isinstance(v, Const) for v in ins):
            return [Const(np.concatenate([v.value for v in ins], axis=axis))]
        sources, idxs, table = T.merge(ins, b.sizes())
        return [Data(sources, np.concatenate(idxs, axis=axis), table)]
    except ValueError as exc:
        b.fail(node, f"inputs of shapes {[v.shape for v in ins]} do not concatenate ({exc})")


def _split(b, node, ins, attrs):
    x = ins[0]
    axis = _axis(b, node, int(attrs.get("axis", 0)), len(x.shape))
    split = attrs.get("split")
    if len(ins) > 1 and ins[1] is not None:
        split = _ints(b.const(node, ins[1], "split"))
    n = len(node.output)
    dim = x.shape[axis]
    if split is None:
        if "num_outputs" in attrs:
            n = int(attrs["num_outputs"])
        chunk = -(-dim // n)
        split = [min(chunk, dim - k * chunk) for k in range(n)]
    if sum(split) != dim:
        b.fail(node, f"split {list(split)} does not add up to dimension {dim}")
    cuts = np.cumsum(split)[:-1]
    return [T.view(x, lambda a, k=k: np.split(a, cuts, axis=axis)[k]) for k in range(len(split))]


def _pad(b, node, ins, attrs):
    x = ins[0]
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("constant", "reflect", "edge", "wrap"):
        b.fail(node, f"mode '{mode}' is not supported (constant, reflect, edge, wrap)")
    if b.opset < 11:
        pads, value, axes = attrs.get("pads"), float(attrs.get("value", 0.0)), None
    else:
        pads = _ints(b.const(node, ins[1], "pads"))
        value = 0.0
        if len(ins) > 2 and ins[2] is not None:
            value = float(b.fconst(node, ins[2], "the constant value").reshape(-1)[0])
        axes = _ints(b.const(node, ins[3], "axes")) if len(ins) > 3 and ins[3] is not None else None
    if any(int(p) < 0 for p in pads):
        b.fail(node, "negative pads (cropping) are not supported")
    rank = len(x.shape)
    along = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    if len(pads) == 2 * len(along) and all(0 <= a < rank for a in along):
        out = list(x.shape)
        for k, a in enumerate(along):
            out[a] += int(pads[k]) + int(pads[k + len(along)])
        b.room(node, out, given=[x.shape])  # before np.pad allocates it
    try:
        return [T.onnx_pad(x, pads, mode, value, axes)]
    except ValueError as exc:
        b.fail(node, f"pads {list(pads)} do not fit the input of shape {x.shape} ({exc})")


# -- constants only (shape arithmetic) -----------------------------------------------------

def _constant(b, node, ins, attrs):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            v = attrs[key]
            if key == "value":
                return [Const(b.numpy_helper.to_array(v))]
            return [Const(np.array(v, dtype=np.float32 if "float" in key else np.int64))]
    b.fail(node, "only tensor, float and int constants are supported")


def _shape(b, node, ins, attrs):
    shape = np.array(ins[0].shape, dtype=np.int64)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    return [Const(shape[start:None if end is None else int(end)])]


def _constant_of_shape(b, node, ins, attrs):
    v = attrs.get("value")
    fill = b.numpy_helper.to_array(v).reshape(-1) if v is not None else np.zeros(1, np.float32)
    shape = _ints(b.const(node, ins[0], "the shape"))
    b.room(node, shape, "the constant")  # from the shape alone, before it is filled
    return [Const(np.full(shape, fill[0], dtype=fill.dtype))]


def _range(b, node, ins, attrs):
    start, limit, delta = [b.const(node, v, "every input").reshape(-1)[0] for v in ins[:3]]
    if delta == 0:
        b.fail(node, "delta is 0")
    b.room(node, (max(int(np.ceil((limit - start) / delta)), 0),), "the range")
    return [Const(np.arange(start, limit, delta))]


def _const_fn(fn):
    """A handler computing ``fn`` of constant inputs that broadcast against each other."""
    def handler(b, node, ins, attrs):
        values = [b.const(node, v, "every input") for v in ins if v is not None]
        try:
            shape = np.broadcast_shapes(*[v.shape for v in values])
        except ValueError:
            shape = None  # fn's own error
        if shape is not None:
            b.room(node, shape, given=[v.shape for v in values])
        return [Const(fn(*values))]
    return handler
