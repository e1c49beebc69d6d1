"""Reading an ONNX file (the optional ``onnx`` package, ``crown-cli[onnx]``): the model within
the memory budget, its nodes' names and attributes, its inputs' shapes, the one-line refusal
of an unknown operator, and the layout of an image input (crown's (H, W, C) image order).

:func:`crown_cli.graph.onnx_graph.load_graph` is the one reader of ONNX graphs; this module is
what it needs of the file itself.
"""
from __future__ import annotations

import os
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from crown_cli.errors import InputError

GiB = 2 ** 30
# a weight (or a constant the graph loader computes) converted to float64 must fit in this many
# bytes; --memory-budget sets it
MEMORY_BUDGET = 4 * GiB


def import_onnx(path: str):
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise InputError(f"{path}: reading ONNX models needs the onnx package; install it with "
                         "pip install 'crown-cli[onnx]'") from None
    return onnx, numpy_helper


def node_name(node, index: Optional[int] = None) -> str:
    """How a message names an ONNX node: its operator and name, or for a node without a name
    its position in the graph's node list (``#3``: ``graph.node[3]``, counted from 0)."""
    if node.name:
        return f"{node.op_type} node '{node.name}'"
    return f"{node.op_type} node " + (f"#{index}" if index is not None else "(unnamed)")


def unsupported(path: str, node, index: int) -> InputError:
    """The one-line refusal of a node whose operator the loader does not read."""
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    return InputError(f"{path}: {node_name(node, index)}: unsupported operator {op} "
                      "(docs/formats.md lists the supported operators)")


def attributes(onnx, node) -> Dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def input_shape(path: str, value_info) -> Tuple[List[Optional[int]], Tuple[int, ...]]:
    """The input's dims (None when symbolic) and the shape traced (a symbolic batch
    dimension as 1)."""
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        raise InputError(f"{path}: the graph input '{value_info.name}' has no shape")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if not dims:
        raise InputError(f"{path}: the graph input '{value_info.name}' is a scalar")
    shape = list(dims)
    if len(dims) >= 2 and dims[0] is None:  # a symbolic batch is traced as 1; a fixed one
        shape[0] = 1  # (nn4sys: 12) is a dimension like any other (VNN-LIB numbers row-major)
    if any(d is None or d < 1 for d in shape):
        raise InputError(f"{path}: the graph input '{value_info.name}' has shape {dims}; only the "
                         "batch dimension may be symbolic")
    return dims, tuple(int(d) for d in shape)


def opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def read_onnx(path: str, budget: Optional[float] = None):
    """(the onnx module, its numpy_helper, the loaded model) of an ONNX file, or an
    InputError naming the file (onnx missing, a file protobuf cannot decode, a tensor in an
    external data file over ``budget`` bytes as float64 (default :data:`MEMORY_BUDGET`),
    checked before it is read, or no memory left to read it)."""
    onnx, numpy_helper = import_onnx(path)
    budget = MEMORY_BUDGET if budget is None else float(budget)
    try:
        model = onnx.load(path, load_external_data=False)
        _check_external_sizes(path, onnx, model, budget)
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, os.path.dirname(path))
    except InputError:
        raise
    except MemoryError as exc:  # its message is often empty
        raise InputError(f"{path}: cannot read ONNX file (out of memory: "
                         f"{str(exc) or 'its tensors do not fit in the free memory'})") from None
    except Exception as exc:  # noqa: BLE001 - protobuf decode errors of a corrupt file
        raise InputError(f"{path}: cannot read ONNX file ({type(exc).__name__}: {exc})") from None
    return onnx, numpy_helper, model


def _tensors(onnx, graph) -> Iterator:
    """Every TensorProto of ``graph``: initializers, and tensor attributes of its nodes (and
    of their subgraphs)."""
    A = onnx.AttributeProto
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == A.TENSOR:
                yield a.t
            elif a.type == A.TENSORS:
                yield from a.tensors
            elif a.type == A.GRAPH:
                yield from _tensors(onnx, a.g)
            elif a.type == A.GRAPHS:
                for g in a.graphs:
                    yield from _tensors(onnx, g)


def _check_external_sizes(path: str, onnx, model, budget: float) -> None:
    """Refuse, before anything is read, a tensor stored in an external data file whose bytes
    (as its shape and type say, or as many as onnx would read) exceed ``budget``. (Within it,
    a weight is held to the budget again as float64, dense or sparse, where it is used.)"""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    for t in _tensors(onnx, model.graph):
        if not uses_external_data(t):
            continue
        info = ExternalDataInfo(t)
        try:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 1
        stored = itemsize
        for d in t.dims:
            stored *= int(d)  # Python ints: no overflow
        length = info.length
        if length is None:  # onnx reads from the offset to the end of the file
            where = os.path.join(os.path.dirname(path), info.location)
            try:
                length = max(os.path.getsize(where) - (info.offset or 0), 0)
            except OSError:
                length = 0  # a missing file: onnx's own message
        need = max(stored, length)
        if need > budget:
            raise InputError(f"{path}: tensor '{t.name}' (shape {list(t.dims)}, external data "
                             f"in {info.location}) needs {need / GiB:.3g} GiB to read, over the "
                             f"memory budget of {budget / GiB:g} GiB (--memory-budget)")


def hwc_order(shape, path: str) -> Optional[np.ndarray]:
    """For a channel-first image input (1, C, H, W), C > 1, the position in the file's flat
    input of each element of crown's row-major (H, W, C) image vector; None when the flat
    input is already in crown's order (not 4-D, one channel, or channel-last (1, H, W, C)).

    The channel axis is the one of size 3 or 4 (the other end's is not); InputError when
    that does not tell it.
    """
    if len(shape) != 4 or 1 in (shape[1], shape[3]):
        return None
    if shape[3] in (3, 4) and shape[1] not in (3, 4):
        return None  # (N, H, W, C): flattening already matches crown's order
    if not (shape[1] in (3, 4) and shape[3] not in (3, 4)):
        raise InputError(f"{path}: cannot tell the channel axis of input shape {list(shape)} "
                         "(expected (N, C, H, W) or (N, H, W, C) with 1, 3 or 4 channels)")
    c, h, w = shape[1], shape[2], shape[3]
    # crown's element (i, j, channel k) is at (i * W + j) * C + k; the file's at (k, i, j)
    return np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)


def graph_feeds(path: str, x: np.ndarray,
                input_order: Optional[np.ndarray] = None) -> List[Dict[str, np.ndarray]]:
    """Input vectors ``x`` (N, n) as feeds {input name: tensor} of the ONNX graph, one per
    vector (batch dimension 1), in the graph's dtype: for comparing with an ONNX runtime.
    ``x`` is in the file's flat order, or with ``input_order`` (an MLP's
    :attr:`~crown_cli.network.MLP.input_order`) element j of a vector is the file's element
    ``input_order[j]``."""
    onnx, _ = import_onnx(path)
    model = onnx.load(path)
    consts = {i.name for i in model.graph.initializer}
    inp = [i for i in model.graph.input if i.name not in consts][0]
    _, shape = input_shape(path, inp)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
    feeds = []
    for row in np.asarray(x):
        if input_order is not None:
            flat = np.empty_like(row)
            flat[input_order] = row
            row = flat
        feeds.append({inp.name: np.asarray(row, dtype=dtype).reshape(shape)})
    return feeds
