"""The loader's view of an ONNX tensor: a constant, or data as an index map over graph nodes.

Reshapes, transposes, slices, gathers, splits, concatenations, pads and broadcasts move
elements without arithmetic. The loader applies them to an integer array ``idx`` of the
tensor's shape instead of creating nodes: ``idx`` holds, per element, its position in the
concatenated flat values of ``sources`` (graph node ids), or ``-1 - k`` for the constant
``table[k]`` (a padding value, a constant concatenated to data). A view becomes a node
(:class:`crown_cli.graph.ops.IndexMap`) only when an operation needs it as input, and not at
all when it is the identity of one node. The same numpy functions act on a constant's values,
so PyTorch's shape arithmetic (``Shape``, ``Gather``, ``Concat``, ...) folds at load time.
"""
from __future__ import annotations

from typing import Callable, List, Sequence, Tuple, Union

import numpy as np


class Const:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = np.asarray(value)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.value.shape)


class Data:
    __slots__ = ("sources", "idx", "table")

    def __init__(self, sources: Sequence[int], idx: np.ndarray, table=None):
        self.sources = tuple(int(s) for s in sources)
        self.idx = np.ascontiguousarray(idx, dtype=np.int64)
        self.table = np.zeros(0) if table is None else np.asarray(table, np.float64)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.idx.shape)

    @staticmethod
    def of_node(nid: int, shape) -> "Data":
        return Data((nid,), np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape))


Value = Union[Const, Data]


def view(x: Value, fn: Callable[[np.ndarray], np.ndarray]) -> Value:
    """``fn`` (an element-moving numpy function) applied to a constant or to data."""
    if isinstance(x, Const):
        return Const(fn(x.value))
    return Data(x.sources, fn(x.idx), x.table)


def merge(values: List[Value], sizes) -> Tuple[Tuple[int, ...], List[np.ndarray], np.ndarray]:
    """Data and constants over one common list of sources: (sources, the idx array of each
    value in those terms, the common constant table). ``sizes[nid]``: flat size of node nid."""
    sources: List[int] = []
    for v in values:
        if isinstance(v, Data):
            for s in v.sources:
                if s not in sources:
                    sources.append(s)
    offset = dict(zip(sources, np.concatenate([[0], np.cumsum([sizes[s] for s in sources])])))
    table: List[np.ndarray] = []
    ntab = 0
    out = []
    for v in values:
        if isinstance(v, Const):
            vals = np.asarray(v.value, np.float64)
            out.append(-1 - (ntab + np.arange(vals.size)).reshape(vals.shape))
            table.append(vals.reshape(-1))
            ntab += vals.size
            continue
        starts = np.concatenate([[0], np.cumsum([sizes[s] for s in v.sources])])
        idx = v.idx.copy()
        pos = idx >= 0
        which = np.searchsorted(starts, idx[pos], side="right") - 1
        shift = np.array([offset[s] for s in v.sources]) - starts[:-1]
        idx[pos] = idx[pos] + shift[which]
        neg = ~pos
        idx[neg] = idx[neg] - ntab  # -1 - k -> -1 - (k + ntab)
        out.append(idx)
        table.append(v.table)
        ntab += v.table.size
    tab = np.concatenate(table) if table else np.zeros(0)
    return tuple(sources), out, tab


def onnx_slice(a: np.ndarray, starts, ends, axes, steps) -> np.ndarray:
    """ONNX Slice semantics (clamping, negative indices and steps) on any array."""
    for st, en, ax, sp_ in zip(starts, ends, axes, steps):
        dim = a.shape[ax]
        st, en, sp_ = int(st), int(en), int(sp_)
        if sp_ == 0:
            raise ValueError("step 0")
        st = st + dim if st < 0 else st
        en = en + dim if en < 0 else en
        if sp_ > 0:
            st, en = min(max(st, 0), dim), min(max(en, 0), dim)
        else:
            st, en = min(max(st, 0), dim - 1), min(max(en, -1), dim - 1)
        a = np.take(a, np.arange(st, en, sp_, dtype=np.int64), axis=ax)
    return a


def onnx_reshape(a: np.ndarray, target, allowzero: bool) -> np.ndarray:
    target = [int(v) for v in np.asarray(target).reshape(-1)]
    if not allowzero:
        target = [a.shape[i] if v == 0 and i < a.ndim else v for i, v in enumerate(target)]
    return a.reshape(target)


def onnx_flatten(a: np.ndarray, axis: int) -> np.ndarray:
    axis = axis + a.ndim if axis < 0 else axis
    return a.reshape(int(np.prod(a.shape[:axis], dtype=np.int64)), -1)


def onnx_expand(a: np.ndarray, shape) -> np.ndarray:
    target = np.broadcast_shapes(a.shape, tuple(int(v) for v in np.asarray(shape).reshape(-1)))
    return np.ascontiguousarray(np.broadcast_to(a, target))


def onnx_pad(x: Value, pads, mode: str, value: float, axes=None) -> Value:
    """ONNX Pad (non-negative pads) of a constant or of data; constant padding of data adds
    ``value`` to the table. The modes are numpy's of the same names (ONNX's ``wrap``, opset
    19: the tensor as a torus, e.g. PyTorch's circular padding, is numpy's ``wrap``)."""
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [int(a) + rank if a < 0 else int(a) for a in axes]
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    width = [(0, 0)] * rank
    for k, ax in enumerate(axes):
        width[ax] = (pads[k], pads[k + len(axes)])
    kw = {}
    if mode == "constant":
        if isinstance(x, Const):
            kw = dict(constant_values=value)
        else:
            kw = dict(constant_values=-1 - x.table.size)
    if isinstance(x, Const):
        return Const(np.pad(x.value, width, mode=mode, **kw))
    table = np.concatenate([x.table, [value]]) if mode == "constant" else x.table
    return Data(x.sources, np.pad(x.idx, width, mode=mode, **kw), table)
