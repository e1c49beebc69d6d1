"""ONNX files to :class:`crown_cli.graph.network.Graph` (needs the optional ``onnx`` package).

Operators (the handlers of :mod:`crown_cli.graph.onnx_ops`): ``Gemm``, ``MatMul`` by a
constant, ``Conv`` (2-D), ``ConvTranspose`` (2-D: an element move spreading the input, then a
``Conv``), ``BatchNormalization`` (folded into the Conv, Gemm/MatMul or
scaling that produces its input when nothing else reads that tensor, else a scaling node),
``AveragePool``, ``GlobalAveragePool`` and ``ReduceMean`` over constant axes (sparse dense
layers), ``MaxPool`` and ``GlobalMaxPool`` (a max pool node), ``Pad``, ``Flatten``,
``Reshape``, ``Transpose``, ``Squeeze``, ``Unsqueeze``, ``Slice``, ``Split``, ``Gather``,
``Concat``, ``Expand``, ``Upsample`` / ``Resize`` (nearest, whole scales) (element moves:
:mod:`crown_cli.graph.tensors`, no node unless needed),
``Add``/``Sub`` of two tensors, ``Add``/``Sub``/``Mul``/``Div``/``Neg`` with constants,
``Dropout``, ``Identity``, ``Cast``, the activations of :mod:`crown_cli.activations`,
``Softmax``/``LogSoftmax`` over all values of the graph's one output, followed by reshapes
only (``Graph.vector_output``; the graph's output is the logits), and the shape arithmetic
of PyTorch exports on constants (``Shape``, ``Constant``, ``ConstantOfShape``, ``Gather``,
``Unsqueeze``, ``Concat``, ``Equal``, ``Where``, ...), folded at load time. Anything else:
one InputError naming the operator and the node.

Inputs are the graph inputs that are not initializers, in order; the batch dimension (first
of rank >= 2) must be 1 or symbolic. Values are float64; weights are converted once.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from crown_cli.errors import InputError
from crown_cli.graph.network import Graph, Node
from crown_cli.graph.onnx_ops import (FUSED_DOMAIN, FUSED_HANDLERS, HANDLERS, SHAPE_OPS,
                                     VECTOR_OUTPUTS)
from crown_cli.graph.ops import IndexMap, InputOp
from crown_cli.graph.tensors import Const, Data, Value, merge
from crown_cli.graph.onnx_fusion import fuse_activations
from crown_cli.graph.onnx_file import (MEMORY_BUDGET, attributes, input_shape, node_name, opset,
                                       read_onnx, unsupported)

# MEMORY_BUDGET: a weight converted to float64 must fit in this many bytes (dense) or its
# nonzeros (sparse); so must every constant or data view the loader computes (Builder.room)

def _count(shape) -> int:
    count = 1
    for d in shape:
        count *= int(d)  # Python ints: no overflow
    return count


def over_budget(shape, budget: float, what: str) -> str:
    """Why a tensor of ``shape`` cannot be allocated within ``budget`` bytes as float64 (or
    has a negative dimension); "" when it can."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        return f"{what} would have the negative shape {shape}"
    count = _count(shape)
    if 8 * count <= budget:
        return ""
    return (f"{what} of shape {shape} would take {8 * count / 2 ** 30:.3g} GiB as float64, "
            f"over the memory budget of {budget / 2 ** 30:g} GiB (--memory-budget)")


class Builder:
    """The graph being built, and the ONNX tensors seen so far (constants or data views)."""

    def __init__(self, path: str, onnx, numpy_helper, opset: int, uses: Dict[str, int]):
        self.path, self.onnx, self.numpy_helper, self.opset = path, onnx, numpy_helper, opset
        self.nodes: List[Node] = []
        self.tensors: Dict[str, Value] = {}
        self.uses = uses  # ONNX tensor name -> number of readers (graph outputs included)
        self.produced: Dict[int, str] = {}  # node id -> the ONNX tensor that is its output
        self.fresh: Optional[int] = None  # the node the current handler created or changed
        self._views: Dict[int, Tuple[Data, int]] = {}
        self.budget = MEMORY_BUDGET  # bytes a weight may take as float64 (--memory-budget)
        self.position = 0  # of the node being read, in the ONNX graph's node list
        # (node, position) of a Softmax/LogSoftmax, and the tensors that are its result
        self.vector_out: Optional[Tuple[object, int]] = None
        self.after_vector_out: set = set()

    # -- errors ----------------------------------------------------------------------------
    def fail(self, node, problem: str):
        raise InputError(f"{self.path}: {node_name(node, self.position)}: {problem}")

    def room(self, node, shape, what: str = "the result", given=()) -> None:
        """Refuse, before it is allocated, a tensor of ``shape`` (a constant, or the index
        array of a data view: 8 bytes per element either way) over the memory budget; not
        when it is no larger than one of the tensors of shapes ``given`` it is made from (a
        weight the file holds, which may fit as a sparse layer, moved or scaled)."""
        size = _count(shape)
        if any(size <= _count(g) for g in given):
            return
        problem = over_budget(shape, self.budget, what)
        if problem:
            self.fail(node, problem)

    # -- nodes -----------------------------------------------------------------------------
    def add(self, name: str, op, inputs, shape, folded=None) -> Data:
        shape = tuple(int(d) for d in shape)
        self.nodes.append(Node(name, op, tuple(inputs), shape, list(folded or [])))
        nid = len(self.nodes) - 1
        self.fresh = nid
        return Data.of_node(nid, shape)

    def sizes(self):
        return [n.size for n in self.nodes]

    def identity_of(self, d: Data) -> Optional[int]:
        """The node whose whole output ``d`` is, in order, or None."""
        if len(d.sources) != 1:
            return None
        s = d.sources[0]
        if d.idx.size != self.nodes[s].size or not np.array_equal(d.idx.reshape(-1),
                                                                  np.arange(d.idx.size)):
            return None
        return s

    def node_of(self, d: Data, label: str) -> int:
        """A node whose output is ``d`` (flattened): the source itself, or an IndexMap."""
        s = self.identity_of(d)
        if s is not None:
            return s
        hit = self._views.get(id(d))
        if hit is not None and hit[0] is d:
            return hit[1]
        op = IndexMap(d.idx.reshape(-1), [self.nodes[j].size for j in d.sources], d.table)
        self.add(f"{label}/view", op, d.sources, d.shape)
        nid = len(self.nodes) - 1
        self._views[id(d)] = (d, nid)
        return nid

    def foldable(self, node, tensor: str) -> Optional[int]:
        """The node producing ``tensor`` when an elementwise scaling of it may be folded into
        that node: ``tensor`` is the node's whole output and has no other reader."""
        d = self.tensors.get(tensor)
        if not isinstance(d, Data) or self.uses.get(tensor, 0) != 1:
            return None
        s = self.identity_of(d)
        if s is None or self.produced.get(s) != tensor or self.nodes[s].kind != "affine":
            return None
        return s if hasattr(self.nodes[s].op, "scaled") else None

    def absorb_scale(self, nid: int, tensor: Optional[str]) -> int:
        """Node ``nid`` (an affine node just added, reading ``tensor``) with the scaling node
        that produced ``tensor`` folded into it, when nothing else reads that tensor; the
        scaling node is then left unread (and pruned). Returns nid."""
        from crown_cli.graph.ops import Scale, after_scale

        d = self.tensors.get(tensor) if tensor else None
        if not isinstance(d, Data) or self.uses.get(tensor, 0) != 1:
            return nid
        s = self.identity_of(d)
        node = self.nodes[nid]
        if s is None or self.produced.get(s) != tensor or not isinstance(self.nodes[s].op, Scale) \
                or node.inputs != (s,):
            return nid
        sc = self.nodes[s]
        c = sc.op.bias if sc.op.bias is not None else np.zeros(sc.size)
        op = after_scale(node.op, sc.op.a, c)
        if op is not None:
            node.op = op
            node.inputs = sc.inputs
            node.folded[:0] = [sc.name] + sc.folded
        return nid

    def scale(self, node, d: Data, a, c, tensor: str) -> Data:
        """``a * d + c`` elementwise (a, c broadcast to d's shape; c may be None): folded into
        the producing node when :meth:`foldable`, else a Scale node."""
        from crown_cli.graph.ops import Scale

        shape = d.shape
        a = np.broadcast_to(np.asarray(a, np.float64), shape).reshape(-1)
        c = None if c is None else np.broadcast_to(np.asarray(c, np.float64), shape).reshape(-1)
        if not np.all(np.isfinite(a)) or (c is not None and not np.all(np.isfinite(c))):
            self.fail(node, "the constant operand has NaN or infinite values")
        if np.all(a == 1.0) and (c is None or np.all(c == 0.0)):
            return d
        label = node.name or node.op_type
        s = self.foldable(node, tensor)
        if s is not None:
            folded = self.nodes[s].op.scaled(a, np.zeros_like(a) if c is None else c)
            if folded is not None:
                self.nodes[s].op = folded
                self.nodes[s].folded.append(label)
                self.fresh = s
                return Data.of_node(s, shape)  # d's shape: it may be a reshape of node s
        nid = self.node_of(d, label)
        return self.add(label, Scale(a, c), (nid,), shape)

    # -- constants -------------------------------------------------------------------------
    def const(self, node, v: Optional[Value], what: str) -> np.ndarray:
        if not isinstance(v, Const):
            self.fail(node, f"{what} must be a constant (initializer, Constant node or shape "
                            "arithmetic)")
        return v.value

    def fconst(self, node, v: Optional[Value], what: str) -> np.ndarray:
        a = self.const(node, v, what)
        if a.dtype.kind not in "fiub":
            self.fail(node, f"{what} has dtype {a.dtype}, expected numbers")
        a = a.astype(np.float64)
        if not np.all(np.isfinite(a)):
            self.fail(node, f"{what} contains NaN or infinite values")
        return a

    def data(self, node, v: Optional[Value], what: str = "the input") -> Data:
        if not isinstance(v, Data):
            self.fail(node, f"{what} must be data, not a constant")
        return v


def _uses(graph) -> Dict[str, int]:
    uses: Dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                uses[name] = uses.get(name, 0) + 1
    for out in graph.output:
        uses[out.name] = uses.get(out.name, 0) + 1
    return uses


def load_graph(path: str, memory_budget: Optional[float] = None) -> Graph:
    """The :class:`Graph` of an ONNX file, or an InputError naming the problem.
    ``memory_budget``: bytes a weight may take as float64 (default :data:`MEMORY_BUDGET`)."""
    onnx, numpy_helper, model = read_onnx(path, memory_budget)
    graph = model.graph
    fuse_activations(onnx, numpy_helper, graph)  # PyTorch's GELU, SiLU, Mish: one node each
    handlers = []
    # operators first: an LSTM's input (sequence, batch, features) is refused for its
    # operator, not for a "batch dimension" that is its sequence length
    for k, node in enumerate(graph.node):
        handler = HANDLERS.get(node.op_type) if node.domain in ("", "ai.onnx") else \
            FUSED_HANDLERS.get(node.op_type) if node.domain == FUSED_DOMAIN else None
        if handler is None:
            raise unsupported(path, node, k)
        handlers.append(handler)
    b = Builder(path, onnx, numpy_helper, opset(model), _uses(graph))
    if memory_budget is not None:
        b.budget = float(memory_budget)
    for init in graph.initializer:
        b.tensors[init.name] = Const(numpy_helper.to_array(init))
    inputs = [i for i in graph.input if i.name not in b.tensors]
    if not inputs:
        raise InputError(f"{path}: the graph has no data input")
    offset = 0
    for k, vi in enumerate(inputs):
        _, shape = input_shape(path, vi)
        size = int(np.prod(shape, dtype=np.int64))
        b.tensors[vi.name] = b.add(vi.name, InputOp(k, offset, size), (), shape)
        offset += size
    for k, (node, handler) in enumerate(zip(graph.node, handlers)):
        b.position = k
        ins = []
        for name in node.input:
            if name and name not in b.tensors:
                b.fail(node, f"its input '{name}' is not produced by any earlier node")
            ins.append(b.tensors[name] if name else None)
        b.fresh = None
        after = any(name in b.after_vector_out for name in node.input)
        if after and node.op_type not in SHAPE_OPS:
            b.fail(node, f"{b.vector_out[0].op_type} is supported only at the output")
        try:
            outs = handler(b, node, ins, attributes(onnx, node))
        except MemoryError as exc:  # a size no handler checked beforehand
            b.fail(node, "out of memory computing it ("
                         f"{str(exc) or 'what it makes does not fit in the free memory'})")
        # a Softmax inside the graph (not over all values) was built out (onnx_ops)
        if after or (b.vector_out is not None and b.vector_out[0] is node):
            b.after_vector_out.update(node.output)
        given = [v.shape for v in ins if v is not None]
        for name, v in zip(node.output, outs):
            # what no handler checked beforehand, before a later node multiplies it
            b.room(node, v.shape, f"its output '{name}'", given)
            if name:
                b.tensors[name] = v
                s = b.identity_of(v) if isinstance(v, Data) else None
                # a node's whole output, or its only reader's reshape of it (a Flatten between
                # a normalisation and the first Gemm): scalings fold across it
                if s is not None and (s == b.fresh if b.fresh is not None else
                                      b.produced.get(s) == node.input[0]
                                      and b.uses.get(node.input[0], 0) == 1):
                    b.produced[s] = name
        for name in list(node.output)[len(outs):]:
            if name and b.uses.get(name):
                b.fail(node, f"its output '{name}' is not supported")
    outs = []
    for out in graph.output:
        v = b.tensors.get(out.name)
        if not isinstance(v, Data):
            raise InputError(f"{path}: the graph output '{out.name}' is "
                             + ("a constant" if v is not None else "not produced by any node"))
        outs.append(v)
    if len(outs) == 1:
        out_id = b.node_of(outs[0], "output")
    else:  # several outputs: one flat vector, in order (VNN-LIB's Y_0, Y_1, ...)
        sources, idxs, table = merge(outs, b.sizes())
        flat = np.concatenate([i.reshape(-1) for i in idxs])
        out_id = b.node_of(Data(sources, flat, table), "outputs")
    g = _pruned(b.nodes, out_id, path, [v.shape for v in outs])
    if any(out.name in b.after_vector_out for out in graph.output):
        node, k = b.vector_out
        if len(outs) > 1:
            raise InputError(f"{path}: {node_name(node, k)}: {node.op_type} is supported only "
                             "on a graph's one output")
        g.vector_output = (VECTOR_OUTPUTS[node.op_type], node_name(node, k))
    return g


def _pruned(nodes: List[Node], out_id: int, path: str, shapes) -> Graph:
    """The graph of the nodes the output depends on (and every input), renumbered."""
    keep = np.zeros(len(nodes), bool)
    keep[out_id] = True
    for i in range(out_id, -1, -1):
        if keep[i]:
            keep[list(nodes[i].inputs)] = True
    keep |= np.array([n.kind == "input" for n in nodes])
    new = np.cumsum(keep) - 1
    kept = []
    for i in np.flatnonzero(keep):
        n = nodes[i]
        kept.append(Node(n.name, n.op, tuple(int(new[j]) for j in n.inputs), n.shape, n.folded))
    return Graph(kept, int(new[out_id]), path, shapes)
