"""One entry point for every network file, and one network type: every file loads into a
:class:`~crown_cli.graph.network.Graph`. A chain of dense layers with one activation also
carries its form on the dense engine (``Graph.dense``, an :class:`~crown_cli.network.MLP`),
which :func:`engine_form` chooses for it.

``crown inspect``, ``crown certify``, ``crown verify`` and the Python API use it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from crown_cli.errors import InputError, read_header
from crown_cli.network import MLP

if TYPE_CHECKING:
    from crown_cli.graph.network import Graph

GiB = 2 ** 30


def load_network(path: str, activation: Optional[str] = None, min_outputs: int = 2,
                 memory_budget: Optional[float] = None) -> "Graph":
    """The :class:`crown_cli.graph.network.Graph` of a model file. NPZ, HDF5 and Keras files
    of dense layers with one activation are read by ``io.models.load_model`` into an MLP,
    whose graph (:func:`crown_cli.graph.network.dense_graph`) keeps it as ``Graph.dense``;
    ONNX files by :func:`crown_cli.graph.onnx_graph.load_graph`, a chain of dense layers with
    one activation getting its ``dense`` form from :func:`dense_chain`; Keras models the MLP
    loader refuses (convolutions, pooling, branches, ...) by the Keras graph loader.
    InputError otherwise (the graph loader's message, which names the operator or layer).
    ``min_outputs``: the MLP loader's (2 for a classifier, 1 for ``verify``); a graph may
    have any number. ``memory_budget`` (GiB, default 4): the most a graph's weight may take as
    float64, and the memory of its bounds (:func:`check_memory`). A graph that is a chain of
    affine segments between activations of one type also gets its exact dense form
    (``graph.lowering``, :func:`crown_cli.graph.lower.lowered`), which ``certify``, ``verify``
    and the API run on the dense engine. Running out of memory while reading the file is an
    InputError naming it too."""
    try:
        return _load_network(path, activation, min_outputs, memory_budget)
    except MemoryError as exc:  # a file whose arrays do not fit: bad input, not a crash
        raise InputError(f"{path}: not enough memory to load the model ("
                         f"{str(exc) or 'its arrays do not fit in the free memory'})") from None


def _load_network(path: str, activation: Optional[str], min_outputs: int,
                  memory_budget: Optional[float]) -> "Graph":
    from crown_cli.graph.network import dense_graph
    from crown_cli.io.models import checked, load_model

    budget = None if memory_budget is None else float(memory_budget) * GiB
    if not path.lower().endswith(".onnx"):
        try:
            return dense_graph(load_model(path, activation, min_outputs))
        except InputError as mlp_error:
            if str(mlp_error).startswith("--activation"):  # the option's value, not the file
                raise
            from crown_cli.graph.keras_graph import load_keras_graph

            graph = load_keras_graph(path, budget)
            if graph is None:  # not a Keras model file: the MLP loader's message
                raise mlp_error from None
    else:
        read_header(path, "model")
        from crown_cli.graph.onnx_graph import load_graph

        graph = load_graph(path, budget)
        mlp = dense_chain(graph, budget)
        if mlp is not None:
            try:
                graph.dense = checked(mlp, path, activation, min_outputs)
                if activation is not None:
                    _override(graph, graph.dense)
                return graph
            except InputError as exc:  # e.g. one output for a classifier: as any graph
                if str(exc).startswith("--activation"):
                    raise
        # a graph with a final Softmax/LogSoftmax (Graph.vector_output) keeps its logits as
        # its output: certify's margins are the logits' (the order is the same); verify takes
        # only properties that compare two outputs (GraphVerifier.verify, order_only)
    if activation is not None:
        raise InputError(f"{path}: --activation applies to chains of dense layers only; this "
                         "graph has its activation per node")
    check_memory(graph, memory_budget, path)
    from crown_cli.graph.lower import lowered

    lowered(graph, budget)  # a chain of affine segments: its MLP, kept in graph.lowering
    return graph


def _override(graph, mlp) -> None:
    """``--activation`` on an ONNX chain: its hidden activation nodes become the dense
    form's activation (an activation on the output stays, as the MLP's output activation);
    the lowering is computed again for the changed graph."""
    from crown_cli.graph.ops import ActivationOp

    for i, n in enumerate(graph.nodes):
        if n.kind == "activation" and i != graph.output:
            n.op = ActivationOp(mlp.activation, mlp.alpha)
    graph.lowering = None


def dense_chain(graph, budget: Optional[float] = None) -> Optional[MLP]:
    """The MLP of an ONNX graph that is a chain of dense layers with one activation
    (:meth:`Graph.is_chain`), as the dense engine runs it: its exact lowering
    (:func:`crown_cli.graph.lower.lowered`; ``budget`` in bytes) with the first layer's
    columns in crown's (H, W, C) image order for a channel-first image input
    (``MLP.input_order``; :func:`crown_cli.graph.onnx_file.hwc_order`), a final
    Softmax/LogSoftmax as its output activation, and a layer of an unnamed node named by its
    operator and position (``gemm_0``). None when the graph is no such chain, is not lowered
    or its input layout is ambiguous."""
    from crown_cli.graph.lower import lowered
    from crown_cli.graph.onnx_file import hwc_order
    from crown_cli.graph.onnx_ops import HANDLERS

    if not graph.is_chain() or lowered(graph, budget) is None:
        return None
    low = graph.lowering[0]
    out = low.output_activation
    if graph.vector_output is not None:
        if out is not None:  # an activation, then the softmax
            return None
        out = graph.vector_output[0]
    try:
        order = hwc_order(graph.nodes[graph.inputs[0]].shape, graph.source)
    except InputError:
        return None
    weights = list(low.weights)
    if order is not None:
        weights[0] = np.ascontiguousarray(weights[0][:, order])
    names = [f"{n.lower()}_{k}" if n in HANDLERS else n for k, n in enumerate(low.layer_names)]
    return MLP(weights, list(low.biases), low.activation, low.source, names, low.alpha, out,
               input_order=order)


def check_memory(graph, memory_budget: Optional[float], where: str) -> None:
    """Set ``graph.row_budget`` so that a CROWN bound of the graph stays within
    ``memory_budget`` GiB (None: the default, 4 GiB), or refuse the graph in one line when
    even one neuron's rows do not fit (:func:`crown_cli.engine.graph_bounds.row_budget_for`)."""
    from crown_cli.engine.graph_bounds import least_bytes, row_budget_for
    from crown_cli.graph.onnx_file import MEMORY_BUDGET

    budget = MEMORY_BUDGET if memory_budget is None else float(memory_budget) * GiB
    rows = row_budget_for(graph, budget)
    if rows is None:
        need = least_bytes(graph) / GiB
        widest = max(n.size for n in graph.nodes)
        raise InputError(f"{where}: a CROWN bound of this graph needs at least {need:.3g} GiB "
                         f"({len(graph.nodes)} nodes, widest {widest} values, "
                         f"{graph.num_parameters:,} parameters), over the memory budget of "
                         f"{budget / GiB:g} GiB (--memory-budget)")
    graph.row_budget = rows


def engine_form(net):
    """Where a loaded network is certified: (mlp, graph, layout). A graph with a ``dense``
    form (a chain of dense layers), or an :class:`MLP` itself: (that MLP, None, None); a graph
    with an exact dense form (:func:`crown_cli.graph.lower.lowered`): that MLP on the dense
    engine, the graph being the layout its images are given in (crown's (H, W, C) images go
    to the model's own order); any other graph: (None, graph, None), the graph engine."""
    if isinstance(net, MLP):
        return net, None, None
    if net.dense is not None:
        return net.dense, None, None
    from crown_cli.graph.lower import lowered

    mlp = lowered(net)
    return (mlp, None, net) if mlp is not None else (None, net, None)
