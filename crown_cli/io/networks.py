"""One entry point for every network file: the MLP type where the file is a chain of dense
layers with one activation (so everything that reads MLPs is unchanged), a graph otherwise.

``crown inspect``, ``crown certify`` and ``crown verify`` use it; the Python API still loads
MLPs with :func:`crown_cli.io.models.load_model`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from crown_cli.errors import InputError, read_header
from crown_cli.network import MLP

if TYPE_CHECKING:
    from crown_cli.graph.network import Graph


def load_network(path: str, activation: Optional[str] = None,
                 min_outputs: int = 2) -> Union[MLP, "Graph"]:
    """An :class:`~crown_cli.network.MLP` (``load_model``'s) for NPZ, HDF5, Keras files and
    ONNX chains of dense layers with one activation; a :class:`crown_cli.graph.network.Graph`
    for any other ONNX graph the graph loader reads. InputError otherwise (the graph
    loader's message, which names the operator and node). ``min_outputs``: the MLP loader's
    (2 for a classifier, 1 for ``verify``); a graph may have any number."""
    from crown_cli.io.models import load_model

    if not path.lower().endswith(".onnx"):
        return load_model(path, activation, min_outputs)
    read_header(path, "model")
    from crown_cli.graph.onnx_graph import load_graph

    try:
        graph = load_graph(path)
    except InputError as graph_error:  # e.g. a Softmax output, which only the MLP loader reads
        try:
            return load_model(path, activation, min_outputs)
        except InputError:
            raise graph_error from None
    if graph.is_chain():
        try:
            return load_model(path, activation, min_outputs)
        except InputError:
            pass
    if activation is not None:
        raise InputError(f"{path}: --activation applies to chains of dense layers only; this "
                         "graph has its activation per node")
    return graph
