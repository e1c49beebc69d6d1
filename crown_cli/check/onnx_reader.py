"""A minimal ONNX reader: the protobuf wire format decoded by hand (onnx.proto's field numbers),
for networks of the operators of docs/proofs.md's scope: affine operations, ReLUs and sums of
data tensors (residual connections)."""
import math
from fractions import Fraction

import numpy as np

from .network import Network, Reject

# TensorProto data types: numpy dtype and the repeated field holding the values
_TYPES = {1: ("<f4", 4), 11: ("<f8", 10), 7: ("<i8", 7), 6: ("<i4", 5), 9: ("|u1", 5)}
_WINDOW = {"auto_pad", "kernel_shape", "pads", "strides"}
_ATTRS = {"Gemm": {"alpha", "beta", "transA", "transB"}, "Flatten": {"axis"},
          "Reshape": {"allowzero"}, "Conv": _WINDOW | {"dilations", "group"},
          "AveragePool": _WINDOW | {"ceil_mode", "count_include_pad"},
          "MaxPool": _WINDOW | {"ceil_mode", "dilations", "storage_order"},
          "Pad": {"mode", "pads", "value"}, "Dropout": {"seed", "ratio", "is_test"},
          "Transpose": {"perm"}, "Slice": {"starts", "ends", "axes"}, "Gather": {"axis"},
          "Concat": {"axis"}, "Squeeze": {"axes"}, "Unsqueeze": {"axes"},
          "Split": {"axis", "split", "num_outputs"},
          "BatchNormalization": {"epsilon", "momentum", "training_mode", "spatial"}}
_OPS = {"Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Flatten", "Reshape", "Identity",
        "Conv", "AveragePool", "MaxPool", "Pad", "Dropout", "Transpose", "Slice", "Gather",
        "Concat", "Squeeze", "Unsqueeze", "BatchNormalization", "Split"}
# element moves: each output element a copy of one input element or 0 ("take" operations)
_MOVES = {"Transpose", "Slice", "Gather"}


def _varint(buf, i):
    value = shift = 0
    while shift < 70:
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _fields(buf):
    """{field number: [values]} of one message: ints (varints) or memoryviews (other wire types)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire in (1, 2, 5):
            size = {1: 8, 5: 4}.get(wire)
            if size is None:
                size, i = _varint(buf, i)
            if i + size > len(buf):
                raise ValueError("truncated field")
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(key >> 3, []).append(value)
    return out


def _ints(values):
    """A repeated int64 field, packed or not, as signed ints."""
    out = []
    for v in values:
        if isinstance(v, int):
            out.append(v)
        else:
            i = 0
            while i < len(v):
                x, i = _varint(v, i)
                out.append(x)
    return [x - (1 << 64) if x >= 1 << 63 else x for x in out]


def _str(values, default=""):
    return bytes(values[0]).decode("utf-8") if values else default


def _tensor(buf):
    f = _fields(buf)
    dims, dtype, name = _ints(f.get(1, [])), f.get(2, [0])[0], _str(f.get(8))
    if 13 in f or f.get(14, [0])[0] == 1:
        raise Reject(f"tensor {name}: external data is not supported")
    if dtype not in _TYPES:
        raise Reject(f"tensor {name}: data type {dtype} is not supported")
    fmt, field = _TYPES[dtype]
    if 9 in f:
        a = np.frombuffer(bytes(f[9][0]), fmt)
    elif fmt[1] == "f":  # float_data / double_data: fixed-size values, packed or not
        a = np.frombuffer(b"".join(bytes(v) for v in f.get(field, [])), fmt)
    else:
        a = np.array(_ints(f.get(field, [])), dtype=np.int64)
    if a.size != int(np.prod(dims)):
        raise Reject(f"tensor {name}: {a.size} values for shape {dims}")
    a = a.reshape(dims)
    return name, (a.astype(np.float64) if fmt[1] == "f" else a.astype(np.int64))


def _attribute(buf):
    f = _fields(buf)
    kind = f.get(20, [0])[0]
    if kind == 1 or (kind == 0 and 2 in f):
        value = float(np.frombuffer(bytes(f[2][0]), "<f4")[0]) if 2 in f else 0.0
    elif kind == 2 or (kind == 0 and 3 in f):
        value = _ints(f.get(3, [0]))[0]
    elif kind == 3 or (kind == 0 and 4 in f):
        value = bytes(f.get(4, [b""])[0]).decode("utf-8", "replace")
    elif kind == 4 or (kind == 0 and 5 in f):
        value = _tensor(f[5][0])[1]
    elif kind == 7 or (kind == 0 and 8 in f):
        value = np.array(_ints(f.get(8, [])), dtype=np.int64)
    elif kind == 6 or (kind == 0 and 7 in f):
        value = np.frombuffer(b"".join(bytes(v) for v in f.get(7, [])), "<f4").astype(np.float64)
    else:
        value = None  # graphs, lists of strings: no operator in scope reads them
    return _str(f.get(1)), value


def _shape(buf):
    """Dims of a ValueInfoProto's tensor type; a symbolic or missing first dim is 1."""
    t = _fields(_fields(_fields(buf).get(2, [b""])[0]).get(1, [b""])[0])
    dims = []
    for d in _fields(t.get(2, [b""])[0]).get(1, []):
        dims.append(_ints(_fields(d).get(1, [0]))[0])
    if dims and dims[0] <= 0:
        dims[0] = 1
    if any(d <= 0 for d in dims):
        raise Reject(f"input shape {dims}: only the first dimension may be symbolic")
    return tuple(dims)


def read_onnx(data):
    """The Network of an ONNX file's bytes (Reject with the reason for anything else)."""
    try:
        model = _fields(memoryview(data))
        graph = _fields(model[7][0])
    except (ValueError, IndexError, KeyError) as exc:
        raise Reject(f"not an ONNX model ({exc})") from None
    if graph.get(15):
        raise Reject("sparse initializers are not supported")
    consts = dict(_tensor(t) for t in graph.get(5, []))
    inputs = [(_str(_fields(v).get(1)), v) for v in graph.get(11, [])]
    inputs = [(n, v) for n, v in inputs if n not in consts]
    outputs = [_str(_fields(v).get(1)) for v in graph.get(12, [])]
    if len(inputs) != 1 or len(outputs) != 1:
        raise Reject(f"{len(inputs)} data inputs and {len(outputs)} outputs; one of each expected")
    shape = _shape(inputs[0][1])
    # every data tensor as (terms, shape): a sum of terms (src, ops), the operations ops
    # applied to a_src (0: the input, j: the output of the j-th Relu); a Relu starts a layer
    tensors = {inputs[0][0]: ([(0, [])], shape)}
    terms_of, sizes, identity = [], [int(np.prod(shape))], []
    uses = {}  # how many nodes read each tensor
    for nb in graph.get(1, []):
        for v in _fields(nb).get(1, []):
            uses[_str([v])] = uses.get(_str([v]), 0) + 1

    def layer(terms, shape, relu):
        """A hidden layer of these terms: a ReLU's, or (relu False) an identity layer, a max
        pool's input that is no ReLU's output or a tensor after a max pool that several nodes
        read (the pool's lines take the bounds step 1b gives its neurons, and rows from all
        its readers are relaxed once); the terms of its output."""
        terms_of.append(terms)
        sizes.append(int(np.prod(shape)))
        if not relu:
            identity.append(len(sizes) - 1)
        return [(len(sizes) - 1, [])]

    def shared(name, terms, shape):
        """The terms of tensor ``name``, or an identity layer's where several nodes read it
        and a max pool lies in its terms (each reader would otherwise relax the pool on its
        own rows: once, as the engine does, on the sum of theirs)."""
        if uses.get(name, 0) > 1 and any(o[0] == "maxpool" for _, ops in terms for o in ops):
            return layer(terms, shape, False)
        return terms

    for pos, nb in enumerate(graph.get(1, [])):
        nf = _fields(nb)
        ins, outs = [_str([v]) for v in nf.get(1, [])], [_str([v]) for v in nf.get(2, [])]
        op, name = _str(nf.get(4)), _str(nf.get(3)) or f"#{pos}"
        attrs = dict(_attribute(a) for a in nf.get(5, []))
        where = f"{op} node {name}"
        if _str(nf.get(7)) not in ("", "ai.onnx"):
            raise Reject(f"{where}: operator domain {_str(nf.get(7))} is not supported")
        if op == "Constant":
            (key, value), = attrs.items()
            consts[outs[0]] = np.array(value, dtype=np.float64 if key.startswith("value_f")
                                       else None)
            continue
        if op not in _OPS:
            raise Reject(f"{where}: operator {op} is outside the checker's scope (affine "
                         "operators, ReLUs and sums of them)")
        if set(attrs) - _ATTRS.get(op, set()):
            raise Reject(f"{where}: attributes {sorted(set(attrs) - _ATTRS.get(op, set()))} not supported")
        if op == "Dropout":  # at inference the identity (ONNX), unless training_mode is true
            mode = ins[2] if len(ins) > 2 else ""  # (opset 6 and below: is_test 0 trains)
            if mode and (mode not in consts or np.any(consts[mode])) or \
                    attrs.get("is_test", 1) == 0:
                raise Reject(f"{where}: a Dropout whose training_mode is not a constant false "
                             "is not the identity")
            ins = ins[:1]
        const = [consts[x] for x in ins if x in consts]
        data = [x for x in ins if x not in consts]
        if op in ("Slice", "Gather", "Squeeze", "Unsqueeze", "Pad", "Split"):
            data = data[:1]  # (their other inputs: shapes and indices, constants)
        if op == "Split" and data and data[0] in tensors:  # each output a slice of the input
            for name, part in zip(outs, _split(tensors[data[0]], const, attrs, len(outs), where)):
                tensors[name] = (shared(name, part[0], part[1]), part[1])
            continue
        if len(outs) != 1 or not data or any(x not in tensors for x in data):
            raise Reject(f"{where}: an input that is neither a constant nor an earlier node's "
                         "output, or several outputs")
        if op == "Concat":  # each input's terms placed in the output; constants added
            terms, out_shape = _concat(ins, tensors, consts, attrs, where)
            tensors[outs[0]] = (shared(outs[0], terms, out_shape), out_shape)
            continue
        if op in ("Add", "Sub") and len(data) == 2:  # a sum of two data tensors
            (ta, sa), (tb, sb) = tensors[data[0]], tensors[data[1]]
            if tuple(sa) != tuple(sb):
                raise Reject(f"{where}: data of shapes {sa} and {sb} (a broadcast)")
            if op == "Sub":
                tb = [(src, ops + [("scale", -1.0)]) for src, ops in tb]
            tensors[outs[0]] = (shared(outs[0], ta + tb, sa), sa)
            continue
        if len(data) != 1:
            raise Reject(f"{where}: {len(data)} data inputs")
        terms, shape = tensors[data[0]]
        if op == "Relu":
            tensors[outs[0]] = (layer(terms, shape, True), shape)
            continue
        if op == "MaxPool" and not (len(terms) == 1 and not terms[0][1]):
            terms = layer(terms, shape, False)  # its input: an identity layer
        new = []  # the node's operations, applied to every term (its constants to the first)
        shape = _apply(op, ins[0] == data[0], const, attrs, shape, new, where)
        terms = [(src, ops + (new if i == 0 else [o for o in new if o[0] != "add"]))
                 for i, (src, ops) in enumerate(terms)]
        tensors[outs[0]] = (shared(outs[0], terms, shape), shape)
    if outputs[0] not in tensors:
        raise Reject(f"the graph output {outputs[0]} is not computed from the data input")
    terms, shape = tensors[outputs[0]]
    net = Network(None, sizes + [int(np.prod(shape))], terms_of + [terms], identity)
    net.input_shape = tuple(_shape(inputs[0][1]))
    return net


def _split(tensor, const, attrs, n_out, where):
    """A Split's outputs, each (terms, shape): the input's terms each followed by a take of
    that output's part."""
    terms, shape = tensor
    axis = attrs.get("axis", 0) % len(shape)
    sizes = attrs.get("split", const[0].ravel().tolist() if const else None)
    if sizes is None:
        k = attrs.get("num_outputs", n_out)
        sizes = [-(-shape[axis] // k)] * (k - 1)
        sizes.append(shape[axis] - sum(sizes))
    if len(sizes) != n_out or sum(sizes) != shape[axis] or min(sizes) < 0:
        raise Reject(f"{where}: parts {sizes} of an axis of {shape[axis]}")
    pos, off, out = np.arange(int(np.prod(shape))).reshape(shape), 0, []
    for k in sizes:
        part = np.take(pos, np.arange(off, off + k), axis=axis)
        off += k
        take = ("take", np.ascontiguousarray(part.ravel(), np.int64), pos.size)
        out.append(([(src, ops + [take]) for src, ops in terms], part.shape))
    return out


def _concat(ins, tensors, consts, attrs, where):
    """A Concat's (terms, shape): each data input's terms followed by a take placing its
    elements, the constant inputs' values added to the first term."""
    shapes = [tensors[x][1] if x in tensors else consts[x].shape for x in ins]
    axis = attrs.get("axis", 0) % len(shapes[0])
    if any(len(sh) != len(shapes[0]) or tuple(sh[:axis]) + tuple(sh[axis + 1:]) !=
           tuple(shapes[0][:axis]) + tuple(shapes[0][axis + 1:]) for sh in shapes):
        raise Reject(f"{where}: inputs of shapes {shapes} do not join on axis {axis}")
    out_shape = list(shapes[0])
    out_shape[axis] = sum(sh[axis] for sh in shapes)
    pos = np.arange(int(np.prod(out_shape))).reshape(out_shape)
    terms, const_part, off = [], np.zeros(pos.size), 0
    for x, sh in zip(ins, shapes):
        at = np.take(pos, np.arange(off, off + sh[axis]), axis=axis).ravel()
        off += sh[axis]
        if x in tensors:
            idx = np.full(pos.size, -1, np.int64)
            idx[at] = np.arange(at.size)
            terms += [(src, ops + [("take", idx, at.size)]) for src, ops in tensors[x][0]]
        else:
            const_part[at] = np.asarray(consts[x], np.float64).ravel()
    if np.any(const_part != 0):
        terms[0] = (terms[0][0], terms[0][1] + [("add", const_part, 1.0)])
    return terms, tuple(out_shape)


def _apply(op, data_first, const, attrs, shape, ops, where):
    """Append the node's affine operations to ``ops``; the data's shape after it."""
    n = int(np.prod(shape))
    if op in ("Relu", "Identity", "Dropout"):
        return shape
    if op in _MOVES or op == "Pad":
        return _move(op, const, attrs, shape, ops, where)
    if op == "BatchNormalization":
        return _batch_norm(const, attrs, shape, ops, where)
    if op in ("Squeeze", "Unsqueeze"):  # the shape only (row-major order kept)
        axes = attrs.get("axes", const[0].ravel().tolist() if const else [])
        if op == "Squeeze":
            axes = [a % len(shape) for a in axes] or [i for i, d in enumerate(shape) if d == 1]
            if any(shape[a] != 1 for a in axes):
                raise Reject(f"{where}: squeezes an axis of size > 1 of {shape}")
            return tuple(d for i, d in enumerate(shape) if i not in axes)
        out = list(shape)
        for a in sorted(int(a) % (len(shape) + len(axes)) for a in axes):
            out.insert(a, 1)
        return tuple(out)
    if op in ("Conv", "AveragePool", "MaxPool", "Pad"):
        if not data_first:
            raise Reject(f"{where}: the data must be the first input")
        return _window(op, const, attrs, shape, ops, where)
    if op == "Flatten":
        axis = attrs.get("axis", 1) % (len(shape) + 1) if shape else 0
        return (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    if op == "Reshape":
        spec = [int(d) for d in const[0].ravel()]
        spec = [shape[i] if d == 0 and not attrs.get("allowzero") else d for i, d in enumerate(spec)]
        if spec.count(-1) == 1:
            rest = int(np.prod([d for d in spec if d != -1]))
            spec[spec.index(-1)] = n // rest if rest and n % rest == 0 else -2
        if int(np.prod(spec)) != n or min(spec, default=1) < 0:
            raise Reject(f"{where}: cannot reshape {shape} to {spec}")
        return tuple(spec)
    if op in ("Add", "Sub"):
        c = const[0]
        if np.broadcast_shapes(shape, c.shape) != tuple(shape):
            raise Reject(f"{where}: the constant {c.shape} would broadcast the data {shape}")
        if op == "Sub" and not data_first:
            ops.append(("scale", -1.0))
        ops.append(("add", np.broadcast_to(c, shape).ravel().copy(),
                    -1.0 if op == "Sub" and data_first else 1.0))
        return shape
    if op in ("Mul", "Div"):  # elementwise by a constant (an input normalisation's 1 / std)
        c = np.asarray(const[0], np.float64)
        if (op == "Div" and not data_first) or np.broadcast_shapes(shape, c.shape) != tuple(shape):
            raise Reject(f"{where}: not the data {'divided' if op == 'Div' else 'multiplied'} "
                         f"by a constant of its shape or fewer dimensions ({c.shape})")
        c = np.broadcast_to(c, shape).ravel().copy()
        if op == "Div" and not np.all(c != 0):
            raise Reject(f"{where}: a division by 0")
        ops.append(("scale" if op == "Mul" else "div", c))
        return shape
    w = const[0]
    if op == "Gemm":
        if attrs.get("transA", 0) or len(shape) != 2:
            raise Reject(f"{where}: transA or a data input {shape} that is not (1, n)")
        w = w.T if attrs.get("transB", 0) else w
    if not data_first or w.ndim != 2 or not shape or n != shape[-1] or w.shape[0] != n:
        raise Reject(f"{where}: the data {shape} is not a vector times a constant matrix {w.shape}")
    ops.append(("mat", np.ascontiguousarray(w)))
    shape = tuple(shape[:-1]) + (w.shape[1],)
    if op == "Gemm" and attrs.get("alpha", 1.0) != 1.0:
        ops.append(("scale", attrs["alpha"]))
    if op == "Gemm" and len(const) > 1:
        _apply("Add", True, const[1:], {}, shape, ops, where)
        if attrs.get("beta", 1.0) != 1.0:
            ops[-1] = ("add", ops[-1][1], attrs["beta"])
    return shape


class Taps:
    """A convolution's matrix by kernel position: ``weight`` (Co, C / group, kh, kw),
    ``group``, and the geometry: input (C, H, W), output (Co, Ho, Wo), strides, top and left
    pads, dilations. Kernel position (ky, kx) joins output (oy, ox) to input
    (oy sh - pt + ky dh, ox sw - pl + kx dw) where that lies inside the data: for each
    position a strided rectangle of outputs and one of inputs (``self.rects``)."""

    def __init__(self, weight, group, chw, out, strides, pads, dilations):
        self.weight, self.group, self.chw, self.out = weight, group, chw, out
        (_, H, W), (_, Ho, Wo) = chw, out
        (sh, sw), (pt, pl), (dh, dw) = strides, pads, dilations
        kh, kw = weight.shape[2:]

        def span(k, s, p, d, n_in, n_out):  # outputs o with 0 <= o s - p + k d < n_in
            o0 = max(0, -(-(p - k * d) // s))
            o1 = min(n_out, (n_in - 1 + p - k * d) // s + 1)
            return o0, o1, o0 * s - p + k * d

        self.rects = []
        for ky in range(kh):
            y0, y1, iy = span(ky, sh, pt, dh, H, Ho)
            for kx in range(kw):
                x0, x1, ix = span(kx, sw, pl, dw, W, Wo)
                if y1 > y0 and x1 > x0:
                    self.rects.append((ky, kx, slice(y0, y1), slice(x0, x1),
                                       slice(iy, iy + sh * (y1 - y0 - 1) + 1, sh),
                                       slice(ix, ix + sw * (x1 - x0 - 1) + 1, sw)))

    def back(self, L):
        """``L @ M.T`` for rows L (R, Co Ho Wo) over the output: every output position's rows
        times the weight of each kernel position (one product per group), then each kernel
        position's results added at the input positions it joins (one strided rectangle
        each, at most one output per input). Each entry of the result is a sum of the same
        products as ``L @ M.T``'s, in another order (Higham's bound holds for any)."""
        (C, H, W), (Co, Ho, Wo) = self.chw, self.out
        R = L.shape[0]
        Lr = L.reshape(R, Co, Ho * Wo).transpose(0, 2, 1)  # (R, Ho Wo, Co)
        out = np.zeros((R, H, W, C))
        per, Cg = Co // self.group, C // self.group
        kh, kw = self.weight.shape[2:]
        for gi in range(self.group):
            w = self.weight[gi * per:(gi + 1) * per].reshape(per, Cg * kh * kw)
            cols = (Lr[:, :, gi * per:(gi + 1) * per] @ w).reshape(R, Ho, Wo, Cg, kh, kw)
            for ky, kx, oy, ox, iy, ix in self.rects:
                out[:, iy, ix, gi * Cg:(gi + 1) * Cg] += cols[:, oy, ox, :, ky, kx]
        return np.ascontiguousarray(out.transpose(0, 3, 1, 2)).reshape(R, C * H * W)


MAX_ENTRIES = 2 ** 27  # the largest dense matrix a convolution or a pool is written as (1 GiB)


def sqrt_between(v):
    """Floats (lo, hi), 0 < lo <= sqrt(v) <= hi, for a Fraction v > 0 (checked exactly)."""
    r = math.sqrt(float(v))
    lo, hi = r, r
    while lo > 0 and Fraction(lo) ** 2 > v:
        lo = float(np.nextafter(lo, 0.0))
    while Fraction(hi) ** 2 < v:
        hi = float(np.nextafter(hi, np.inf))
    return lo, hi


def _batch_norm(const, attrs, shape, ops, where):
    """BatchNormalization at inference, ``scale (x - mean) / sqrt(var + epsilon) + B`` per
    channel (axis 1): the mean subtracted, a division by a real number known to lie in
    [lo, hi] (("divr", lo, hi): sqrt(var + epsilon) is irrational in general), the scale,
    the bias."""
    if attrs.get("training_mode", 0) or len(const) != 4 or len(shape) < 2:
        raise Reject(f"{where}: only a BatchNormalization at inference (constant statistics)")
    scale, bias, mean, var = (np.asarray(c, np.float64).ravel() for c in const)
    C = shape[1]
    if not all(a.size == C for a in (scale, bias, mean, var)):
        raise Reject(f"{where}: statistics of {[a.size for a in (scale, bias, mean, var)]} "
                     f"values for {C} channels")
    eps = Fraction(float(np.float32(attrs.get("epsilon", 1e-5))))  # (a float attribute)
    v = [Fraction(float(a)) + eps for a in var]
    if any(x <= 0 for x in v):
        raise Reject(f"{where}: var + epsilon <= 0")
    lo, hi = np.array([sqrt_between(x) for x in v]).T
    per = lambda a: np.broadcast_to(a.reshape((1, C) + (1,) * (len(shape) - 2)),  # noqa: E731
                                    shape).ravel().copy()
    ops += [("add", per(mean), -1.0), ("divr", per(lo), per(hi)), ("scale", per(scale)),
            ("add", per(bias), 1.0)]
    return shape


def _move(op, const, attrs, shape, ops, where):
    """Transpose, Slice, Gather (constant indices) and a constant-mode Pad as one ("take",
    idx) operation: output element i is input element idx[i], or 0 where idx[i] is -1 (a
    Pad's value added after it where not 0)."""
    pos = np.arange(int(np.prod(shape))).reshape(shape)
    if op == "Transpose":
        perm = attrs.get("perm", list(range(len(shape)))[::-1])
        out = pos.transpose(perm)
    elif op == "Gather":
        ind = np.asarray(const[0]).astype(np.int64)
        out = np.take(pos, ind, axis=attrs.get("axis", 0) % len(shape), mode="raise")
    elif op == "Slice":
        if "starts" in attrs:  # opset < 10
            starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
        else:
            starts, ends = const[0].ravel(), const[1].ravel()
            axes = const[2].ravel() if len(const) > 2 else None
            steps = const[3].ravel() if len(const) > 3 else None
        axes = list(range(len(starts))) if axes is None else [int(a) % len(shape) for a in axes]
        steps = [1] * len(starts) if steps is None else [int(t) for t in steps]
        sl = [slice(None)] * len(shape)
        for a, b, e, t in zip(axes, starts, ends, steps):
            if t == 0:
                raise Reject(f"{where}: a step of 0")
            sl[a] = slice(*slice(int(b), int(e), t).indices(shape[a]))
        out = pos[tuple(sl)]
    else:  # Pad, constant mode
        pads = np.asarray(attrs["pads"] if "pads" in attrs else const[0]).astype(np.int64).ravel()
        value = float(attrs.get("value", np.asarray(const[1]).ravel()[0] if len(const) > 1
                                and np.size(const[1]) else 0.0))
        if attrs.get("mode", "constant") != "constant" or pads.size != 2 * len(shape) or \
                np.any(pads < 0):
            raise Reject(f"{where}: only a constant Pad of nonnegative widths is in scope")
        out = np.pad(pos, list(zip(pads[:len(shape)], pads[len(shape):])), constant_values=-1)
        if not np.any(pads):  # zero width: the identity
            return shape
        ops.append(("take", out.ravel().astype(np.int64), pos.size))
        if value != 0.0:
            ops.append(("add", np.where(out.ravel() < 0, value, 0.0), 1.0))
        return out.shape
    if out.shape == pos.shape and np.array_equal(out.ravel(), pos.ravel()):
        return shape  # (a transpose or slice that moves nothing)
    ops.append(("take", np.ascontiguousarray(out.ravel(), np.int64), pos.size))
    return out.shape


def _window(op, const, attrs, shape, ops, where):
    """Conv, AveragePool, MaxPool, Pad on (1, C, H, W) data: dense matrices of the linear maps
    (each entry a copy of a weight, 1/count of an average pool's window where every count is
    a power of two, else 1 followed by a division by the counts: exact), the windows of a
    max pool."""
    if len(shape) != 4 or shape[0] != 1:
        raise Reject(f"{where}: data of shape {shape}; (1, C, H, W) expected")
    _, C, H, W = shape
    if op == "Pad":  # opset < 11: pads/value attributes; later: inputs
        pads = attrs["pads"] if "pads" in attrs else const[0] if const else [1]
        if attrs.get("mode", "constant") != "constant" or np.any(np.asarray(pads) != 0):
            raise Reject(f"{where}: only a Pad of zero width (an identity) is in scope")
        return shape
    if attrs.get("auto_pad", "NOTSET") != "NOTSET" or attrs.get("ceil_mode", 0) or \
            attrs.get("storage_order", 0):
        raise Reject(f"{where}: auto_pad, ceil_mode and storage_order are not supported")
    k = tuple(const[0].shape[2:]) if op == "Conv" else tuple(attrs.get("kernel_shape", ()))
    if len(k) != 2 or tuple(attrs.get("kernel_shape", k)) != k:
        raise Reject(f"{where}: a 2-D kernel expected, found {k}")
    (sh, sw), (dh, dw) = attrs.get("strides", (1, 1)), attrs.get("dilations", (1, 1))
    pt, pl, pb, pr = attrs.get("pads", (0, 0, 0, 0))
    Ho, Wo = (H + pt + pb - dh * (k[0] - 1) - 1) // sh + 1, (W + pl + pr - dw * (k[1] - 1) - 1) // sw + 1
    if min(sh, sw, dh, dw, Ho, Wo) < 1 or min(pt, pl, pb, pr) < 0:
        raise Reject(f"{where}: strides, dilations or pads leave no output")
    oy, ox = [a.ravel() for a in np.meshgrid(np.arange(Ho), np.arange(Wo), indexing="ij")]
    taps = []  # per kernel position: (input positions, output positions) inside the data
    for ky in range(k[0]):
        for kx in range(k[1]):
            iy, ix = oy * sh - pt + ky * dh, ox * sw - pl + kx * dw
            ok = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
            taps.append((ky, kx, (iy * W + ix)[ok], (oy * Wo + ox)[ok]))
    Co = const[0].shape[0] if op == "Conv" else C
    if op == "MaxPool":  # windows (C Ho Wo, kh kw) of input indices, -1 in the padding
        win = np.full((C, Ho * Wo, len(taps)), -1, np.int64)
        for t, (_, _, inp, out) in enumerate(taps):
            win[:, out, t] = np.arange(C)[:, None] * H * W + inp
        if np.any(np.all(win < 0, axis=2)):
            raise Reject(f"{where}: a window lies in the padding only")
        ops.append(("maxpool", win.reshape(C * Ho * Wo, len(taps))))
        return (1, C, Ho, Wo)
    if C * H * W * Co * Ho * Wo > MAX_ENTRIES:
        raise Reject(f"{where}: its dense matrix of {C * H * W} x {Co * Ho * Wo} entries is larger "
                     f"than the checker's {MAX_ENTRIES}")
    M = np.zeros((C * H * W, Co * Ho * Wo))
    if op == "AveragePool":
        count = np.zeros(Ho * Wo) + (k[0] * k[1] if attrs.get("count_include_pad", 0) else 0)
        if not attrs.get("count_include_pad", 0):
            for _, _, _, out in taps:
                count[out] += 1
        if np.any(count < 1):
            raise Reject(f"{where}: a window without values")
        # 1/count is a float for powers of two (the matrix of 1/count exact); otherwise the
        # window's sum (a matrix of ones), then a division by its count
        exact = np.all(np.frexp(count)[0] == 0.5)
        ch = np.arange(C)[:, None]
        for _, _, inp, out in taps:
            M[ch * H * W + inp, ch * Ho * Wo + out] = 1.0 / count[out] if exact else 1.0
        ops.append(("mat", M))
        if not exact:
            ops.append(("div", np.tile(count, C)))
        return (1, C, Ho, Wo)
    w, g = const[0], attrs.get("group", 1)
    Cg = w.shape[1]
    if w.ndim != 4 or Cg * g != C or Co % g:
        raise Reject(f"{where}: weights {w.shape} with group {g} do not fit data {shape}")
    per = Co // g
    for gi in range(g):
        cos = np.arange(gi * per, (gi + 1) * per)[:, None]
        for cg in range(Cg):
            for ky, kx, inp, out in taps:
                M[(gi * Cg + cg) * H * W + inp[None, :], cos * Ho * Wo + out[None, :]] = \
                    w[cos[:, 0], cg, ky, kx][:, None]
    # the taps, with which bounds.py takes rows back through M a kernel position at a time
    # (the same products as rows @ M.T, summed in another order)
    ops.append(("mat", M, Taps(np.asarray(w, np.float64), g, (C, H, W), (Co, Ho, Wo),
                               (sh, sw), (pt, pl), (dh, dw))))
    if len(const) > 1:
        if const[1].size != Co:
            raise Reject(f"{where}: a bias of {const[1].size} values for {Co} channels")
        ops.append(("add", np.repeat(const[1].ravel(), Ho * Wo), 1.0))
    return (1, Co, Ho, Wo)
