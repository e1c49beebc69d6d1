"""A feed-forward graph network: nodes in topological order, each an input, an affine
operation, an elementwise activation (its own type per node) or a max pool
(:mod:`crown_cli.graph.ops`).

The network's input is one flat vector x: the graph inputs in order, each flattened in
row-major order of its ONNX shape (VNN-LIB's X_0, X_1, ...). Its output is the flat value of
one node (several ONNX outputs are concatenated in order: Y_0, Y_1, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np


@dataclass
class Node:
    """One node: its operation, the ids of the nodes it reads (in the operation's order), its
    ONNX shape (batch dimension included, as 1) and the ONNX nodes it stands for."""

    name: str
    op: object
    inputs: Tuple[int, ...]
    shape: Tuple[int, ...]
    folded: List[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.op.kind

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class Graph:
    """Every network crown reads (NPZ, HDF5, Keras, ONNX: :func:`crown_cli.io.networks.load_network`).

    Nodes in topological order (every node's inputs come before it); ``inputs`` the ids of
    the input nodes in order, ``output`` the id of the output node; ``channels_last``: the
    input's layout (see :func:`crown_cli.certification.graph_certifier.channel_first`).
    ``dense``: for a chain of dense layers with one activation, its form on the dense engine
    (a :class:`crown_cli.network.MLP`, crown's (H, W, C) image order; the file's own layers
    for NPZ, HDF5 and Keras dense models, :func:`crown_cli.io.networks.dense_chain` for an
    ONNX chain), else None; ``weights``, ``biases``, ``activation`` are its."""

    def __init__(self, nodes: List[Node], output: int, source: str = "",
                 output_shapes: Optional[List[Tuple[int, ...]]] = None):
        self.nodes = nodes
        self.output = int(output)
        self.source = source
        self.inputs = [i for i, n in enumerate(nodes) if n.kind == "input"]
        self.output_shapes = output_shapes or [nodes[output].shape]
        # True when an image input is channels-last (Keras: (1, H, W, C), crown's image
        # order); False for ONNX's channel-first (1, C, H, W)
        self.channels_last = False
        # bytes of rows per back-substitution pass of its bounds (None: the engine's default;
        # io.networks.load_network sets it from --memory-budget)
        self.row_budget = None
        # (MLP or None, reason): crown_cli.graph.lower.lowered's answer, once computed
        self.lowering = None
        # ("softmax" or "log_softmax", the ONNX node): an order-preserving function of the
        # whole output applied after it (the MLP of a chain keeps it as its output activation;
        # the graph engine does not bound it)
        self.vector_output: Optional[Tuple[str, str]] = None
        self.dense = None  # the MLP the dense engine runs for a chain of dense layers
        for i, n in enumerate(nodes):
            if any(j >= i or j < 0 for j in n.inputs):
                raise ValueError(f"graph: node {i} ({n.name}) reads a later node")
            sizes = [nodes[j].size for j in n.inputs]
            if n.kind == "activation":
                expect_in, expect = [n.size], n.size
            else:
                expect_in, expect = list(n.op.n_in), n.op.size
            if sizes != expect_in or n.size != expect:
                raise ValueError(f"graph: node {i} ({n.name}) reads sizes {sizes} and has size "
                                 f"{n.size}; its operation takes {expect_in} and gives {expect}")
        self.consumers: List[List[int]] = [[] for _ in nodes]
        for i, n in enumerate(nodes):
            for j in n.inputs:
                self.consumers[j].append(i)

    @property
    def input_size(self) -> int:
        return int(sum(self.nodes[i].size for i in self.inputs))

    @property
    def output_size(self) -> int:
        return self.nodes[self.output].size

    @property
    def num_classes(self) -> int:
        return self.output_size

    @property
    def weights(self) -> list:
        return self._dense_part("weights")

    @property
    def biases(self) -> list:
        return self._dense_part("biases")

    @property
    def activation(self) -> str:
        return self._dense_part("activation")

    def _dense_part(self, name: str):
        if self.dense is None:
            raise AttributeError(f"{self.source or 'graph'}: '{name}' belongs to a chain of "
                                 "dense layers; this network's layers are its nodes")
        return getattr(self.dense, name)

    @property
    def num_parameters(self) -> int:
        return int(sum(n.op.parameters() for n in self.nodes))

    def activations(self) -> List[str]:
        return [n.op.name for n in self.nodes if n.kind == "activation"]

    def forward(self, x: np.ndarray, return_all: bool = False):
        """Outputs (N, output_size) for inputs x (N, input_size) or (input_size,), float64;
        with ``return_all`` the list of every node's values too."""
        x = np.asarray(x, dtype=np.float64)
        one = x.ndim == 1
        x = np.atleast_2d(x)
        if x.shape[1] != self.input_size:
            raise ValueError(f"graph.forward: inputs have {x.shape[1]} values, the graph "
                             f"{self.input_size}")
        vals: List[Optional[np.ndarray]] = [None] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            if n.kind == "input":
                vals[i] = x[:, n.op.offset:n.op.offset + n.op.size]
            else:
                vals[i] = n.op.forward([vals[j] for j in n.inputs])
        out = vals[self.output]
        out = out[0] if one else out
        return (out, vals) if return_all else out

    def vjp(self, vals: List[np.ndarray], G: np.ndarray, relu_leak=None) -> np.ndarray:
        """Input gradients (N, input_size): for each of N points, its row of G (N, outputs)
        times the Jacobian of the output at that point. ``vals``: every node's values at the
        points (:meth:`forward` with ``return_all``). Each operation's ``vjp`` pulls the rows
        back: affine nodes by their ``transpose`` (linear, so row n stays point n's),
        activations multiply by their derivative at the point, a max pool routes each row to
        its window's largest input (the first of ties). ``vals`` of one point serve N rows
        at that point.
        ``relu_leak`` (N,): slopes used instead of 0 on the inactive
        side of every ReLU, per point (the attack's surrogate gradient; the forward pass is
        not changed)."""
        G = np.asarray(G, dtype=np.float64)
        N = G.shape[0]
        pending = {self.output: G}
        dx = np.zeros((N, self.input_size))
        for i in range(self.output, -1, -1):
            L = pending.pop(i, None)
            if L is None:
                continue
            n = self.nodes[i]
            if n.kind == "input":
                dx[:, n.op.offset:n.op.offset + n.op.size] += L
                continue
            parts = n.op.vjp(L, [vals[j] for j in n.inputs], relu_leak)
            for j, P in zip(n.inputs, parts):
                pending[j] = P if j not in pending else pending[j] + P
        return dx

    def is_chain(self) -> bool:
        """True for a chain from one input through dense layers, elementwise scalings, index
        maps and activations of one type, without sparse weights: an ONNX graph that loads as
        an MLP when it is lowered (:func:`crown_cli.io.networks.dense_chain`)."""
        from crown_cli.graph.ops import Dense, IndexMap, Scale

        if len(self.inputs) != 1:
            return False
        acts = set()
        for i, n in enumerate(self.nodes):
            if len(self.consumers[i]) > 1 or (i != self.output and not self.consumers[i]):
                return False
            if n.kind == "input":
                continue
            if len(n.inputs) != 1 or n.inputs[0] != i - 1:
                return False
            if n.kind == "activation":
                acts.add(n.op.name)
            elif isinstance(n.op, Dense):
                if n.op.sparse:
                    return False
            elif not isinstance(n.op, (Scale, IndexMap)):
                return False
        return len(acts) <= 1 and any(isinstance(n.op, Dense) for n in self.nodes)

    def summary(self) -> List[str]:
        """One line per node: id, name, operation, shape, inputs, parameters, folded ONNX
        nodes (for ``crown inspect``)."""
        lines = []
        for i, n in enumerate(self.nodes):
            shape = "x".join(str(d) for d in n.shape)
            ins = ",".join(str(j) for j in n.inputs) or "-"
            line = f"  {i:>3} {n.name:<20} {n.op.describe():<44} [{shape}] <- {ins}"
            p = n.op.parameters()
            if p:
                line += f"  {p:,} params"
            if n.folded:
                line += f"  (folded: {', '.join(n.folded)})"
            lines.append(line)
        return lines


def dense_graph(mlp):
    """The graph of a chain of dense layers (the other way round from
    :func:`crown_cli.graph.lower.lower`): input,
    then each layer a ``Dense`` node followed by an activation node (none after the last
    layer; an elementwise output activation as a last node, softmax / log-softmax as
    ``Graph.vector_output``). Its ``dense`` and ``lowering`` are ``mlp`` itself: the dense
    engine runs the very arrays the file gave (no number changes; the nodes share them).
    ``mlp.input_order`` must be None (the graph's input is the MLP's)."""
    from crown_cli.graph.ops import ActivationOp, Dense, InputOp
    from crown_cli.network import VECTOR_OUTPUTS

    if mlp.input_order is not None:
        raise ValueError("dense_graph: an MLP whose columns were reordered has its graph")
    n = mlp.input_size
    nodes = [Node("input", InputOp(0, 0, n), (), (1, n))]
    names = list(mlp.layer_names) or [f"dense_{k}" for k in range(len(mlp.weights))]
    last = len(mlp.weights) - 1
    for k, (W, b) in enumerate(zip(mlp.weights, mlp.biases)):
        nodes.append(Node(names[k], Dense(W, b), (len(nodes) - 1,), (1, W.shape[0])))
        act = mlp.activation if k < last else mlp.output_activation
        if act is not None and act not in VECTOR_OUTPUTS:
            nodes.append(Node(f"{names[k]}_{act}", ActivationOp(act, mlp.alpha), (len(nodes) - 1,),
                              (1, W.shape[0])))
    graph = Graph(nodes, len(nodes) - 1, mlp.source)
    if mlp.output_activation in VECTOR_OUTPUTS:
        graph.vector_output = (mlp.output_activation, "output activation")
    graph.dense, graph.lowering = mlp, (mlp, None)
    return graph
