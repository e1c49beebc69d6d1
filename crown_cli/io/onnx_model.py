"""ONNX models of MLPs, read with the ``onnx`` package (optional extra ``crown-cli[onnx]``).

Accepted graphs are chains along one tensor from the single graph input to the single output.
Between two activations (and before the first, after the last) every node must be affine in
the data with constant other operands, and is folded exactly into one affine layer:

- ``MatMul`` by a constant of rank <= 2 on either side (``x @ W`` or ``W @ x``);
- ``Gemm`` with the data as A or B, any ``transA``/``transB``/``alpha``/``beta``, bias ``C``
  optional;
- elementwise ``Add``, ``Sub``, ``Mul``, ``Div`` by constants (scalars or broadcastable
  tensors; ``c - x`` negates, ``x / c`` divides; ``c / x`` is not affine and is refused);
- ``Flatten``, ``Reshape``, ``Transpose``, ``Squeeze``, ``Unsqueeze``, ``Identity``: the
  elements are tracked, so a transpose that reorders features is folded too.

The activations between layers are ``Relu``, ``Tanh`` or ``Sigmoid``, the same for all. After
the last layer one may follow (``MLP.output_activation``; a ReLU on the logits is bounded as a
layer by ``crown verify``), or an order-preserving ``Softmax``/``LogSoftmax``. Constants are
initializers (also when old files list them among the graph inputs) or ``Constant`` nodes. The
batch dimension (the first of an input of rank >= 2) must be 1 or symbolic; the graph is
traced for one input.

Anything else is refused naming the operator and its node. A 4-D input (batch, C, H, W) with
C > 1 is flattened channel-first by the graph; the first layer's columns are permuted so the
model takes crown's row-major (height, width, channel) image vectors.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from crown_cli.errors import InputError
from crown_cli.graph.onnx_file import attributes as _attrs
from crown_cli.graph.onnx_file import import_onnx as _import_onnx
from crown_cli.graph.onnx_file import input_shape as _input_shape
from crown_cli.graph.onnx_file import node_name as _node_name
from crown_cli.graph.onnx_file import opset as _opset
from crown_cli.graph.onnx_file import read_onnx, unsupported
from crown_cli.network import MLP

ACTIVATIONS = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}
VECTOR_OUTPUTS = {"Softmax": "softmax", "LogSoftmax": "log_softmax"}
ELEMENTWISE = ("Add", "Sub", "Mul", "Div")
SHAPE_OPS = ("Identity", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze")

class _Affine:
    """The current tensor as an affine function of the segment's input h (n values):
    ``tensor = lin(h) + off``.

    ``off`` has the tensor's shape S (batch dimension included, as 1). ``lin`` is either an
    array of shape (n,) + S (lin[j] is the image of the j-th unit vector) or, while only
    elementwise scalings and reshapes were applied, the diagonal ``diag`` of shape S.
    """

    def __init__(self, shape: Tuple[int, ...]):
        self.n = int(np.prod(shape, dtype=np.int64))
        self.off = np.zeros(shape)
        self.diag: Optional[np.ndarray] = np.ones(shape)
        self.lin: Optional[np.ndarray] = None
        self.affine_ops: List[str] = []  # names of the nodes that were not mere reshapes
        self.dense: List[str] = []  # names of the MatMul/Gemm nodes

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.off.shape

    @property
    def size(self) -> int:
        return int(self.off.size)

    def full(self) -> np.ndarray:
        if self.lin is None:
            lin = np.zeros((self.n, self.n))
            lin[np.arange(self.n), np.arange(self.n)] = self.diag.reshape(-1)
            self.lin, self.diag = lin.reshape((self.n,) + self.shape), None
        return self.lin

    def reshape(self, new_off: np.ndarray) -> None:
        """A reshape (no reordering): ``new_off`` is the offset in its new shape."""
        self.off = new_off
        if self.lin is None:
            self.diag = self.diag.reshape(new_off.shape)
        else:
            self.lin = self.lin.reshape((self.n,) + new_off.shape)

    def transpose(self, perm) -> None:
        self.lin = np.transpose(self.full(), [0] + [p + 1 for p in perm])
        self.off = np.transpose(self.off, perm)

    def scale(self, k: np.ndarray) -> None:
        """Multiply elementwise by ``k``, already broadcast to the tensor's shape."""
        self.off = self.off * k
        if self.lin is None:
            self.diag = self.diag * k
        else:
            self.lin = self.lin * k

    def matmul_right(self, w: np.ndarray) -> None:
        """tensor @ w for a constant w of rank 1 or 2."""
        s = self.shape
        new_off = self.off @ w
        if self.lin is None and w.ndim == 2 and s[-1] == self.n:
            # the tensor is (1, ..., 1, n) scaled: unit vector j times w is diag_j * w[j]
            self.lin = (self.diag.reshape(-1)[:, None] * w).reshape((self.n,) + new_off.shape)
            self.diag = None
        else:
            self.lin = np.matmul(self.full(), w)
        self.off = new_off

    def matmul_left(self, w: np.ndarray) -> None:
        """w @ tensor for a constant w of rank 1 or 2."""
        new_off = w @ self.off
        lin = self.full()
        self.lin = lin @ w.T if self.off.ndim == 1 else np.matmul(w, lin)
        self.off = new_off

    def layer(self) -> Tuple[np.ndarray, np.ndarray]:
        """(W, b) of the affine map from h to the flattened tensor."""
        if self.lin is None:
            return np.diag(self.diag.reshape(-1)), self.off.reshape(-1).copy()
        return np.ascontiguousarray(self.lin.reshape(self.n, -1).T), self.off.reshape(-1).copy()


def load_onnx(path: str, budget: Optional[float] = None) -> MLP:
    """An :class:`~crown_cli.network.MLP` from an ONNX file (not yet validated); ``budget``
    as :func:`read_onnx`."""
    onnx, numpy_helper, model = read_onnx(path, budget)
    graph = model.graph
    opset = _opset(model)
    consts: Dict[str, np.ndarray] = {}
    for init in graph.initializer:
        consts[init.name] = numpy_helper.to_array(init)
    # old files (e.g. the ACAS Xu networks) also list their initializers as graph inputs
    inputs = [i for i in graph.input if i.name not in consts]
    if len(inputs) != 1:
        raise InputError(f"{path}: the graph has {len(inputs)} data inputs, expected 1")
    if len(graph.output) != 1:
        raise InputError(f"{path}: the graph has {len(graph.output)} outputs, expected 1")
    dims, shape = _input_shape(path, inputs[0])

    current = inputs[0].name
    seg = _Affine(shape)
    weights: List[np.ndarray] = []
    biases: List[np.ndarray] = []
    names: List[str] = []
    acts: List[Tuple[str, str]] = []  # (ONNX operator, node) closing each layer
    vector_out: Optional[str] = None  # a Softmax/LogSoftmax node seen
    dense_nodes = 0  # MatMul and Gemm nodes seen

    position = 0  # of the node being read, in graph.node

    def fail(node, problem: str):
        raise InputError(f"{path}: {_node_name(node, position)}: {problem}")

    def const(name: str, node) -> np.ndarray:
        if name not in consts:
            fail(node, f"input '{name}' must be a constant (initializer or Constant node); "
                       "only chains of affine layers and activations are supported")
        return np.asarray(consts[name])

    def fconst(name: str, node) -> np.ndarray:
        value = const(name, node)
        if value.dtype.kind not in "fiub":
            fail(node, f"constant '{name}' has dtype {value.dtype}, expected numbers")
        value = value.astype(np.float64)
        if not np.all(np.isfinite(value)):
            fail(node, f"constant '{name}' contains NaN or infinite values")
        return value

    def other_input(node) -> Tuple[str, bool]:
        """The constant operand of a binary node and whether the data comes first."""
        if len(node.input) != 2 or list(node.input).count(current) != 1:
            fail(node, "expected the data and one constant as its two inputs")
        first = node.input[0] == current
        return node.input[1] if first else node.input[0], first

    def broadcast(k: np.ndarray, node) -> np.ndarray:
        try:
            target = np.broadcast_shapes(seg.shape, k.shape)
        except ValueError:
            fail(node, f"constant of shape {k.shape} does not broadcast to the data's shape "
                       f"{seg.shape}")
        if int(np.prod(target)) != seg.size:
            fail(node, f"constant of shape {k.shape} would broadcast the data's shape "
                       f"{seg.shape} to {target}")
        if target != seg.shape:
            seg.reshape(seg.off.reshape(target))
        return np.broadcast_to(k, target)

    def matmul_const(w: np.ndarray, node, right: bool) -> None:
        if w.ndim not in (1, 2):
            fail(node, f"the constant has shape {w.shape}; only matrices and vectors are supported")
        try:
            (seg.matmul_right if right else seg.matmul_left)(w)
        except ValueError:
            form = "x @ W" if right else "W @ x"
            fail(node, f"{form} with data of shape {seg.shape} and a constant of shape {w.shape} "
                       "do not match")

    def close_layer(node, kind: str) -> None:
        """The affine map so far becomes a layer; the next one starts at its output."""
        if not seg.affine_ops:
            fail(node, "an activation must follow a layer (Gemm, MatMul or an elementwise "
                       "affine operation)")
        w, b = seg.layer()
        weights.append(w)
        biases.append(b)
        names.append((seg.dense or seg.affine_ops)[0])
        acts.append((kind, _node_name(node, position)))

    for position, node in enumerate(graph.node):
        op = node.op_type
        if op == "Constant":
            attrs = _attrs(onnx, node)
            if "value" not in attrs:
                fail(node, "only tensor 'value' constants are supported")
            consts[node.output[0]] = numpy_helper.to_array(attrs["value"])
            continue
        if current not in node.input:
            raise InputError(f"{path}: {_node_name(node, position)} does not continue the chain "
                             f"from '{current}' (branching graphs are not supported)")
        if len(node.output) != 1 and op != "Identity":
            fail(node, "nodes with several outputs are not supported")
        label = node.name or f"{op.lower()}_{len(weights)}"
        attrs = _attrs(onnx, node)
        if vector_out is not None and op not in SHAPE_OPS:
            fail(node, f"{vector_out} is supported only at the output")
        if op == "Identity":
            pass
        elif op == "Flatten":
            axis = int(attrs.get("axis", 1))
            rank = len(seg.shape)
            if not -rank <= axis <= rank:
                fail(node, f"axis {axis} is out of range for rank {rank}")
            axis += rank if axis < 0 else 0
            outer = int(np.prod(seg.shape[:axis], dtype=np.int64))
            seg.reshape(seg.off.reshape(outer, -1))
        elif op == "Reshape":
            target = [int(v) for v in const(node.input[1], node).reshape(-1)]
            if not int(attrs.get("allowzero", 0)):
                target = [seg.shape[i] if v == 0 and i < len(seg.shape) else v
                          for i, v in enumerate(target)]
            try:
                seg.reshape(seg.off.reshape(target))
            except ValueError:
                fail(node, f"cannot reshape the data of shape {seg.shape} to {target}")
        elif op in ("Squeeze", "Unsqueeze"):
            axes = attrs.get("axes")
            if len(node.input) > 1 and node.input[1]:
                axes = const(node.input[1], node).reshape(-1)
            try:
                if op == "Squeeze":
                    new = np.squeeze(seg.off, axis=None if axes is None else tuple(int(a) for a in axes))
                else:
                    if axes is None:
                        fail(node, "Unsqueeze without axes")
                    new = np.expand_dims(seg.off, tuple(int(a) for a in axes))
            except (ValueError, IndexError) as exc:  # numpy AxisError is both
                fail(node, f"axes {list(axes) if axes is not None else None} do not fit the "
                           f"data's shape {seg.shape} ({exc})")
            seg.reshape(new)
        elif op == "Transpose":
            perm = attrs.get("perm")
            perm = list(range(len(seg.shape)))[::-1] if perm is None else [int(p) for p in perm]
            if sorted(perm) != list(range(len(seg.shape))):
                fail(node, f"perm {perm} does not fit the data's shape {seg.shape}")
            seg.transpose(perm)
        elif op in ELEMENTWISE:
            name, data_first = other_input(node)
            k = broadcast(fconst(name, node), node)
            if op == "Add":
                seg.off = seg.off + k
            elif op == "Sub":
                if data_first:
                    seg.off = seg.off - k
                else:  # c - x
                    seg.scale(-np.ones(seg.shape))
                    seg.off = seg.off + k
            elif op == "Mul":
                seg.scale(np.array(k))
            else:
                if not data_first:
                    fail(node, f"'{name}' / x is not affine in the data; only x / constant is "
                               "supported")
                if np.any(k == 0):
                    fail(node, f"divides by zero (constant '{name}')")
                seg.off = seg.off / k
                if seg.lin is None:
                    seg.diag = seg.diag / k
                else:
                    seg.lin = seg.lin / k
            seg.affine_ops.append(label)
        elif op == "MatMul":
            name, data_first = other_input(node)
            matmul_const(fconst(name, node), node, right=data_first)
            seg.affine_ops.append(label)
            seg.dense.append(label)
            dense_nodes += 1
        elif op == "Gemm":
            if len(node.input) < 2 or list(node.input[:2]).count(current) != 1:
                fail(node, "the data must be exactly one of the inputs A and B")
            if len(node.input) > 2 and node.input[2] == current:
                fail(node, "the data cannot be the bias C")
            if len(seg.shape) != 2:
                fail(node, f"Gemm needs 2-D data, got shape {seg.shape}")
            alpha = float(attrs.get("alpha", 1.0))
            beta = float(attrs.get("beta", 1.0))
            trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
            # Y = alpha * op(A) @ op(B) + beta * C with the data x as A (x @ B, the constant on
            # the right) or as B (A @ x): name, input index and transpose flag of the constant
            # operand, and the data's own transpose flag
            data_first = node.input[0] == current
            if data_first:
                which, pos, trans_c, trans_x = "B", 1, trans_b, trans_a
            else:
                which, pos, trans_c, trans_x = "A", 0, trans_a, trans_b
            m = fconst(node.input[pos], node)
            if m.ndim != 2:
                fail(node, f"{which} has shape {m.shape}, expected 2-D")
            if trans_x:
                seg.transpose([1, 0])
            matmul_const(m.T if trans_c else m, node, right=data_first)
            if alpha != 1.0:
                seg.scale(np.full(seg.shape, alpha))
            if len(node.input) > 2 and node.input[2]:
                c = fconst(node.input[2], node)
                try:
                    seg.off = seg.off + beta * np.broadcast_to(c, seg.shape)
                except ValueError:
                    fail(node, f"bias C of shape {c.shape} does not broadcast to {seg.shape}")
            seg.affine_ops.append(label)
            seg.dense.append(label)
            dense_nodes += 1
        elif op in ACTIVATIONS:
            close_layer(node, op)
            seg = _Affine(seg.shape)
        elif op in VECTOR_OUTPUTS:
            rank = len(seg.shape)
            axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
            axis += rank if axis < 0 else 0
            along = seg.shape[axis] if opset >= 13 else int(np.prod(seg.shape[axis:]))
            if along != seg.size:
                fail(node, f"axis {attrs.get('axis', 'default')} does not run over all "
                           f"{seg.size} outputs of shape {seg.shape}")
            close_layer(node, op)
            seg = _Affine(seg.shape)
            vector_out = op
        else:
            raise unsupported(path, node, position)
        current = node.output[0]

    if current != graph.output[0].name:
        raise InputError(f"{path}: the graph output '{graph.output[0].name}' is not the end of "
                         f"the layer chain ('{current}')")
    output_activation = None
    if seg.affine_ops:
        w, b = seg.layer()
        weights.append(w)
        biases.append(b)
        names.append((seg.dense or seg.affine_ops)[0])
    elif acts:
        # the graph ends in an activation, then only reshapes: a permutation of its outputs,
        # which commutes with an elementwise activation; fold it into the last layer
        perm, _ = seg.layer()
        weights[-1], biases[-1] = perm @ weights[-1], perm @ biases[-1]
        kind, _ = acts.pop()
        output_activation = ACTIVATIONS.get(kind) or VECTOR_OUTPUTS[kind]
    if not dense_nodes:
        raise InputError(f"{path}: the graph has no Gemm or MatMul layer")
    hidden = [kind for kind, _ in acts]
    for kind, where in acts:
        if kind not in ACTIVATIONS:
            raise InputError(f"{path}: {where}: {kind} is supported only at the output")
    if len(set(hidden)) > 1:
        raise InputError(f"{path}: mixed hidden activations {', '.join(hidden)}; crown needs "
                         "one activation for all hidden layers")
    activation = ACTIVATIONS[hidden[0]] if hidden else (
        output_activation if output_activation in ACTIVATIONS.values() else "relu")
    order = _hwc_order(dims, weights[0].shape[1], path)
    if order is not None:
        weights[0] = np.ascontiguousarray(weights[0][:, order])
    return MLP(weights, biases, activation, path, names, output_activation=output_activation,
               input_order=order)


def _channel_first(dims, path: str) -> bool:
    """True when a 4-D input is (N, C, H, W) with C > 1 (its flattening is not crown's order).

    A 4-D input is channel-first when C is 3 or 4 and the last dimension is not;
    channel-last (N, H, W, C) or single-channel inputs need no reordering.
    """
    if len(dims) != 4 or 1 in (dims[1], dims[3]):
        return False
    if dims[3] in (3, 4) and dims[1] not in (3, 4):
        return False  # (N, H, W, C): flattening already matches crown's order
    if not (dims[1] in (3, 4) and dims[3] not in (3, 4)):
        raise InputError(f"{path}: cannot tell the channel axis of input shape {dims} "
                         "(expected (N, C, H, W) or (N, H, W, C) with 1, 3 or 4 channels)")
    return True


def _hwc_order(dims, n_in: int, path: str) -> Optional[np.ndarray]:
    """For a channel-first 4-D input, the graph's column for each column of crown's (H, W, C)
    image vector (the first layer's columns are taken in this order); None otherwise."""
    if not _channel_first(dims, path):
        return None
    c, h, wd = dims[1], dims[2], dims[3]
    if None in (h, wd) or n_in != c * h * wd:
        raise InputError(f"{path}: input shape {dims} does not match the first layer's "
                         f"{n_in} inputs")
    # column of pixel (i, j, channel k) in crown's vector is (i * W + j) * C + k
    chw = np.arange(c * h * wd).reshape(c, h, wd)  # graph column of (k, i, j)
    return chw.transpose(1, 2, 0).reshape(-1)


def graph_feeds(path: str, x: np.ndarray) -> List[Dict[str, np.ndarray]]:
    """crown's input vectors ``x`` (N, n) as feeds {input name: tensor} of the ONNX graph, one
    per vector (batch dimension 1), in the graph's dtype: for comparing with an ONNX runtime."""
    onnx, _ = _import_onnx(path)
    model = onnx.load(path)
    consts = {i.name for i in model.graph.initializer}
    inp = [i for i in model.graph.input if i.name not in consts][0]
    dims, shape = _input_shape(path, inp)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
    feeds = []
    for row in np.asarray(x):
        if _channel_first(dims, path):
            c, h, wd = dims[1], dims[2], dims[3]
            row = row.reshape(h, wd, c).transpose(2, 0, 1)
        feeds.append({inp.name: np.asarray(row, dtype=dtype).reshape(shape)})
    return feeds
