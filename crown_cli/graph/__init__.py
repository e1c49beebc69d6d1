"""Graph networks (issue 23): nodes in topological order, each an affine operation with its
transpose, an elementwise activation or a max pool (:mod:`.ops`, :mod:`.network`), read from
ONNX by :mod:`.onnx_graph`; bounded by :mod:`crown_cli.engine.graph_bounds`."""
