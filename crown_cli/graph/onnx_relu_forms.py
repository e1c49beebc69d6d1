"""Operators of data that are ReLUs in disguise, read as ReLU nodes and affine nodes, so every
bound, alpha-CROWN and ReLU splitting (a complete search) apply to them unchanged. Each identity
is exact in real arithmetic:

- ``Clip(x, lo, hi)`` (ReLU6, hard tanh, ``torch.clamp``): ``lo + relu(x - lo) - relu(x - hi)``;
  with only ``lo``: ``lo + relu(x - lo)``; with only ``hi``: ``hi - relu(hi - x)``;
- ``Max(x, y)``: ``y + relu(x - y)``; ``Min(x, y)``: ``y - relu(y - x)`` (y data or a
  constant; more inputs pairwise);
- ``Abs(x)``: ``relu(x) + relu(-x)``;
- ``PRelu(x, a)``: a leaky ReLU node where the slope is one number in [0, 1], else
  ``relu(x) - a relu(-x)`` (a per channel).

Of constants only, each is computed (float64) at load as before.
"""
from __future__ import annotations

import numpy as np

from crown_cli.graph import tensors as T
from crown_cli.graph.ops import ActivationOp, Sum
from crown_cli.graph.tensors import Const, Data


def _label(node) -> str:
    return node.name or node.op_type


def _relu(b, node, d: Data, a, c, tag: str) -> Data:
    """relu(a * d + c) (a, c broadcast to d's shape)."""
    inner = b.scale(node, d, a, c, None)
    label = f"{_label(node)}/{tag}"
    return b.add(label, ActivationOp("relu"), (b.node_of(inner, label),), d.shape)


def _sum(b, node, parts, signs, tag: str) -> Data:
    label = f"{_label(node)}/{tag}"
    shape = parts[0].shape
    ids = [b.node_of(p, label) for p in parts]
    return b.add(label, Sum(signs, int(np.prod(shape, dtype=np.int64))), ids, shape)


def _expand(v, shape):
    if isinstance(v, Const):
        return Const(np.broadcast_to(v.value, shape))
    return T.view(v, lambda a: T.onnx_expand(a, shape))


FLT_MAX = 3.4028234663852886e38  # float32's largest: a bound beyond it bounds no float32 value


def _bound(b, node, v, what, absent: float):
    """A Clip bound: None where absent (or ``absent``, the infinity that bounds nothing, or a
    bound at or beyond float32's largest value on that side: exporters write Clip(x, -FLT_MAX,
    FLT_MAX), and ``lo + relu(x - lo)`` would lose x to rounding there), else a finite float
    (a one-element constant)."""
    if v is None:
        return None
    a = np.asarray(b.const(node, v, what))
    if a.dtype.kind not in "fiu":
        b.fail(node, f"{what} has dtype {a.dtype}, expected numbers")
    if a.size != 1:
        b.fail(node, f"{what} has {a.size} values; ONNX Clip takes one number")
    value = float(a.reshape(-1)[0])
    if value * absent > 0 and abs(value) >= FLT_MAX:
        return None
    if not np.isfinite(value):
        b.fail(node, f"{what} is {value}")
    return value


def clip(b, node, ins, attrs):
    x = ins[0]
    if len(ins) > 1 or "min" not in attrs and "max" not in attrs:  # opset 11+: inputs
        lo = _bound(b, node, ins[1] if len(ins) > 1 else None, "the min input", -np.inf)
        hi = _bound(b, node, ins[2] if len(ins) > 2 else None, "the max input", np.inf)
    else:  # opset 6: attributes
        lo = float(attrs["min"]) if "min" in attrs else None
        hi = float(attrs["max"]) if "max" in attrs else None
        lo = None if lo is not None and lo <= -FLT_MAX else lo
        hi = None if hi is not None and hi >= FLT_MAX else hi
    if isinstance(x, Const):
        v = np.asarray(x.value, np.float64)
        if lo is not None:
            v = np.maximum(v, lo)
        if hi is not None:
            v = np.minimum(v, hi)
        return [Const(v)]
    d = b.data(node, x)
    if lo is not None and hi is not None and lo > hi:
        b.fail(node, f"min {lo:g} is above max {hi:g}")
    if lo is None and hi is None:
        return [d]
    if hi is None:
        return [b.scale(node, _relu(b, node, d, 1.0, -lo, "relu"), 1.0, lo, None)]
    if lo is None:
        return [b.scale(node, _relu(b, node, d, -1.0, hi, "relu"), -1.0, hi, None)]
    low = _relu(b, node, d, 1.0, -lo, "relu_low")
    high = _relu(b, node, d, 1.0, -hi, "relu_high")
    return [b.scale(node, _sum(b, node, [low, high], (1.0, -1.0), "sum"), 1.0, lo, None)]


def _pair(b, node, x, y, larger: bool, k: int):
    """max(x, y) or min(x, y) of two values of one shape, at least one of them data."""
    tag = f"{k}"
    if isinstance(y, Data) and isinstance(x, Const):
        x, y = y, x
    if isinstance(y, Const):  # max: c + relu(x - c); min: c - relu(c - x)
        c = np.asarray(y.value, np.float64)
        if np.all(c <= -FLT_MAX) if larger else np.all(c >= FLT_MAX):
            return x  # bounds no float32 value (and c + relu(x - c) would round x away)
        r = _relu(b, node, x, 1.0 if larger else -1.0, -c if larger else c, "relu" + tag)
        return b.scale(node, r, 1.0 if larger else -1.0, c, None)
    diff = _sum(b, node, [x, y], (1.0, -1.0) if larger else (-1.0, 1.0), "diff" + tag)
    r = _relu(b, node, diff, 1.0, None, "relu" + tag)
    return _sum(b, node, [y, r], (1.0, 1.0) if larger else (1.0, -1.0), "sum" + tag)


def max_min(b, node, ins, attrs):
    ins = [v for v in ins if v is not None]
    fn = np.maximum if node.op_type == "Max" else np.minimum
    if all(isinstance(v, Const) for v in ins):
        values = [b.const(node, v, "every input") for v in ins]
        try:
            shape = np.broadcast_shapes(*[v.shape for v in values])
        except ValueError:
            b.fail(node, "the inputs' shapes do not broadcast")
        b.room(node, shape, given=[v.shape for v in values])
        out = values[0]
        for v in values[1:]:
            out = fn(out, v)
        return [Const(out)]
    try:
        shape = np.broadcast_shapes(*[v.shape for v in ins])
    except ValueError:
        b.fail(node, f"inputs of shapes {[v.shape for v in ins]} do not broadcast")
    b.room(node, shape, given=[v.shape for v in ins])
    for v in ins:
        if isinstance(v, Const):
            b.fconst(node, v, "a constant input")
    ins = [_expand(v, shape) for v in ins]
    # constants first combined among themselves, then data pairwise
    consts = [v for v in ins if isinstance(v, Const)]
    data = [v for v in ins if isinstance(v, Data)]
    acc = data[0]
    if consts:
        c = consts[0].value
        for v in consts[1:]:
            c = fn(c, v.value)
        data = data + [Const(np.asarray(c, np.float64))]
    for k, v in enumerate(data[1:]):
        acc = _pair(b, node, acc, v, node.op_type == "Max", k)
    return [acc]


def absolute(b, node, ins, attrs):
    x = ins[0]
    if isinstance(x, Const):
        return [Const(np.abs(x.value))]
    d = b.data(node, x)
    pos = _relu(b, node, d, 1.0, None, "relu_pos")
    neg = _relu(b, node, d, -1.0, None, "relu_neg")
    return [_sum(b, node, [pos, neg], (1.0, 1.0), "sum")]


def prelu(b, node, ins, attrs):
    x, slope = ins
    a = b.fconst(node, slope, "the slope")
    if isinstance(x, Const):
        v = np.asarray(x.value, np.float64)
        return [Const(np.where(v >= 0.0, v, a * v))]
    d = b.data(node, x)
    try:
        a = np.broadcast_to(a, d.shape)
    except ValueError:
        b.fail(node, f"the slope of shape {a.shape} does not broadcast to the input's "
                     f"{d.shape}")
    first = float(a.reshape(-1)[0]) if a.size else 0.0
    label = _label(node)
    if a.size and np.all(a == first) and 0.0 <= first <= 1.0:
        return [b.add(label, ActivationOp("leaky_relu", first), (b.node_of(d, label),),
                      d.shape)]
    pos = _relu(b, node, d, 1.0, None, "relu_pos")
    neg = b.scale(node, _relu(b, node, d, -1.0, None, "relu_neg"), -a, None, None)
    return [_sum(b, node, [pos, neg], (1.0, 1.0), "sum")]
