"""ONNX models of MLPs, read with the ``onnx`` package (optional extra ``crown-cli[onnx]``).

Accepted graphs are chains along one tensor from the single graph input to the single output:

- at the input, before the first layer: ``Flatten`` (axis 1), ``Reshape`` to (batch, n),
  ``Identity``;
- dense layers: ``Gemm`` with the data as A (transA = 0; transB, alpha, beta honoured; bias C
  optional) or ``MatMul`` by a constant matrix, optionally followed by ``Add`` of a constant
  vector;
- between dense layers one activation, the same for all hidden layers: ``Relu``, ``Tanh``,
  ``Sigmoid``;
- after the last layer optionally an order-preserving ``Softmax``/``LogSoftmax``/``Sigmoid``/
  ``Tanh`` (the logits are certified, as for Keras files); ``Identity`` anywhere; ``Constant``
  nodes feeding the above.

Anything else is refused naming the operator and its node. A 4-D input (batch, C, H, W) with
C > 1 is flattened channel-first by the graph; the first layer's columns are permuted so the
model takes crown's row-major (height, width, channel) image vectors.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from .errors import InputError
from .mlp import MLP

ACTIVATIONS = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}
OUTPUT_ACTIVATIONS = ("Softmax", "LogSoftmax", "Sigmoid", "Tanh")
INPUT_RESHAPES = ("Flatten", "Reshape")


def _import_onnx(path: str):
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise InputError(f"{path}: reading ONNX models needs the onnx package; install it with "
                         "pip install 'crown-cli[onnx]'") from None
    return onnx, numpy_helper


def _node_name(node) -> str:
    return f"{node.op_type} node '{node.name or '(unnamed)'}'"


def _attrs(onnx, node) -> Dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def load_onnx(path: str):
    """An :class:`~crown_cli.mlp.MLP` from an ONNX file (not yet validated)."""

    onnx, numpy_helper = _import_onnx(path)
    try:
        model = onnx.load(path)
    except Exception as exc:  # noqa: BLE001 - protobuf decode errors of a corrupt file
        raise InputError(f"{path}: cannot read ONNX file ({type(exc).__name__}: {exc})") from None
    graph = model.graph
    consts: Dict[str, np.ndarray] = {}
    for init in graph.initializer:
        consts[init.name] = numpy_helper.to_array(init)
    inputs = [i for i in graph.input if i.name not in consts]
    if len(inputs) != 1:
        raise InputError(f"{path}: the graph has {len(inputs)} data inputs, expected 1")
    if len(graph.output) != 1:
        raise InputError(f"{path}: the graph has {len(graph.output)} outputs, expected 1")
    dims = [d.dim_value if d.HasField("dim_value") else None
            for d in inputs[0].type.tensor_type.shape.dim]

    current = inputs[0].name
    weights: List[np.ndarray] = []
    biases: List[np.ndarray] = []
    names: List[str] = []
    hidden_acts: List[str] = []
    state = "input"  # input -> dense -> (bias) -> act -> dense ... -> output
    pending_act: Optional[str] = None
    flattened = len(dims) <= 2

    def const(name: str, node) -> np.ndarray:
        if name not in consts:
            raise InputError(f"{path}: {_node_name(node)}: input '{name}' must be a constant "
                             "(initializer); only chains of dense layers are supported")
        return np.asarray(consts[name])

    def takes_current(node) -> None:
        if current not in node.input:
            raise InputError(f"{path}: {_node_name(node)} does not continue the chain from "
                             f"'{current}' (branching graphs are not supported)")

    for node in graph.node:
        op = node.op_type
        if op == "Constant":
            attrs = _attrs(onnx, node)
            if "value" not in attrs:
                raise InputError(f"{path}: {_node_name(node)}: only tensor 'value' constants are supported")
            consts[node.output[0]] = numpy_helper.to_array(attrs["value"])
            continue
        takes_current(node)
        attrs = _attrs(onnx, node)
        if op == "Identity" or (op in INPUT_RESHAPES and state == "input"):
            if op == "Flatten" and int(attrs.get("axis", 1)) != 1:
                raise InputError(f"{path}: {_node_name(node)}: only axis=1 is supported")
            if op == "Reshape":
                shape = const(node.input[1], node).reshape(-1)
                if shape.size != 2:
                    raise InputError(f"{path}: {_node_name(node)}: only a reshape to (batch, n) "
                                     f"is supported, got shape {shape.tolist()}")
            flattened = flattened or op in INPUT_RESHAPES
        elif op in ("Gemm", "MatMul"):
            if state == "dense":
                raise InputError(f"{path}: {_node_name(node)}: two linear layers without an "
                                 "activation between them are not supported")
            if pending_act is not None:
                hidden_acts.append(pending_act)
                pending_act = None
            if not flattened:
                raise InputError(f"{path}: {_node_name(node)}: the input of rank {len(dims)} "
                                 "must be flattened (Flatten or Reshape) before the first layer")
            if op == "Gemm":
                if node.input[0] != current or int(attrs.get("transA", 0)) != 0:
                    raise InputError(f"{path}: {_node_name(node)}: the data must be input A "
                                     "with transA=0")
                b = const(node.input[1], node).astype(np.float64)
                if b.ndim != 2:
                    raise InputError(f"{path}: {_node_name(node)}: B has shape {b.shape}, expected 2-D")
                w = float(attrs.get("alpha", 1.0)) * (b if int(attrs.get("transB", 0)) else b.T)
                if len(node.input) > 2 and node.input[2]:
                    c = const(node.input[2], node).astype(np.float64)
                    try:
                        bias = float(attrs.get("beta", 1.0)) * np.broadcast_to(c, (1, w.shape[0]))[0]
                    except ValueError:
                        raise InputError(f"{path}: {_node_name(node)}: bias C of shape {c.shape} "
                                         f"does not broadcast to ({w.shape[0]},)") from None
                else:
                    bias = np.zeros(w.shape[0])
            else:
                if node.input[0] != current:
                    raise InputError(f"{path}: {_node_name(node)}: the data must be the first input")
                b = const(node.input[1], node).astype(np.float64)
                if b.ndim != 2:
                    raise InputError(f"{path}: {_node_name(node)}: the matrix has shape {b.shape}, "
                                     "expected 2-D")
                w, bias = b.T, np.zeros(b.shape[1])
            weights.append(np.array(w))
            biases.append(np.array(bias, dtype=np.float64))
            names.append(node.name or f"{op.lower()}_{len(weights) - 1}")
            state = "dense"
        elif op == "Add":
            if not (state == "dense" and _is_fresh_matmul(graph, current)):
                raise InputError(f"{path}: {_node_name(node)}: Add is supported only as the bias "
                                 "right after a MatMul")
            other = node.input[1] if node.input[0] == current else node.input[0]
            c = const(other, node).astype(np.float64)
            try:
                biases[-1] = np.array(np.broadcast_to(c, (1, weights[-1].shape[0]))[0])
            except ValueError:
                raise InputError(f"{path}: {_node_name(node)}: bias of shape {c.shape} does not "
                                 f"broadcast to ({weights[-1].shape[0]},)") from None
            state = "biased"
        elif op in INPUT_RESHAPES:
            raise InputError(f"{path}: {_node_name(node)}: {op} is supported only before the "
                             "first layer")
        elif op in ACTIVATIONS or op in OUTPUT_ACTIVATIONS:
            if state not in ("dense", "biased"):
                raise InputError(f"{path}: {_node_name(node)}: an activation must follow a dense layer")
            pending_act = op
            state = "act"
        else:
            raise InputError(f"{path}: unsupported operator {op} (node '{node.name or '(unnamed)'}'); "
                             "supported: Gemm, MatMul, Add, Relu, Tanh, Sigmoid, Flatten, Reshape, "
                             "Identity, a final Softmax")
        current = node.output[0]

    if current != graph.output[0].name:
        raise InputError(f"{path}: the graph output '{graph.output[0].name}' is not the end of "
                         f"the layer chain ('{current}')")
    if not weights:
        raise InputError(f"{path}: the graph has no Gemm or MatMul layer")
    if pending_act is not None and pending_act not in OUTPUT_ACTIVATIONS:
        raise InputError(f"{path}: output activation {pending_act} is not order-preserving; "
                         "only Softmax, LogSoftmax, Sigmoid or Tanh may follow the last layer")
    for k, act in enumerate(hidden_acts):
        if act not in ACTIVATIONS:
            raise InputError(f"{path}: hidden activation {act} (before layer {k + 1}) is not "
                             f"supported; use one of {', '.join(ACTIVATIONS)}")
    if len(set(hidden_acts)) > 1:
        raise InputError(f"{path}: mixed hidden activations {', '.join(hidden_acts)}; crown needs "
                         "one activation for all hidden layers")
    if len(hidden_acts) != len(weights) - 1:
        raise InputError(f"{path}: {len(weights)} layers but {len(hidden_acts)} activations "
                         "between them")
    activation = ACTIVATIONS[hidden_acts[0]] if hidden_acts else "relu"
    weights[0] = _chw_to_hwc(weights[0], dims, path)
    return MLP(weights, biases, activation, path, names)


def _is_fresh_matmul(graph, tensor: str) -> bool:
    """True if ``tensor`` is the output of a MatMul (a Gemm's bias is already folded in)."""
    return any(n.op_type == "MatMul" and tensor in n.output for n in graph.node)


def _chw_to_hwc(w: np.ndarray, dims, path: str) -> np.ndarray:
    """First-layer columns reordered from (C, H, W) flattening to crown's (H, W, C).

    A 4-D input is channel-first (N, C, H, W) when C is 3 or 4 and the last dimension is not;
    channel-last (N, H, W, C) or single-channel inputs need no reordering.
    """
    if len(dims) != 4 or 1 in (dims[1], dims[3]):
        return w
    if dims[3] in (3, 4) and dims[1] not in (3, 4):
        return w  # (N, H, W, C): flattening already matches crown's order
    if not (dims[1] in (3, 4) and dims[3] not in (3, 4)):
        raise InputError(f"{path}: cannot tell the channel axis of input shape {dims} "
                         "(expected (N, C, H, W) or (N, H, W, C) with 1, 3 or 4 channels)")
    c, h, wd = dims[1], dims[2], dims[3]
    if None in (h, wd) or w.shape[1] != c * h * wd:
        raise InputError(f"{path}: input shape {dims} does not match the first layer's "
                         f"{w.shape[1]} inputs")
    # column of pixel (i, j, channel k) in crown's vector is (i * W + j) * C + k
    chw = np.arange(c * h * wd).reshape(c, h, wd)  # graph column of (k, i, j)
    order = chw.transpose(1, 2, 0).reshape(-1)  # graph column for each crown column
    return np.ascontiguousarray(w[:, order])
