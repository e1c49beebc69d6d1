"""Time and peak memory of one CROWN bound of a small conv net at several image sizes.

    python scripts/graph_cost.py [SIZE ...] [--memory-budget GB]     (default: 16 32)

The net (built in memory, random weights, seed 0): input (1, 3, S, S) -> Conv 3->8 3x3 pad 1
-> ReLU -> Conv 8->16 3x3 stride 2 pad 1 -> ReLU -> Flatten -> Gemm 10. One
``GraphBounds`` (CROWN intermediate bounds of every unstable ReLU input, then the 10 output
rows) on an l_inf ball of radius 0.01 around a random image in [0, 1]. Peak memory is the
largest numpy / Python allocation tracemalloc saw during the bound; the rows count is the
neurons whose intermediate bounds were back-substituted (2 rows each). ``--memory-budget``:
the row budget ``crown --memory-budget`` gives (default: the engine's, 256 MiB).
"""
import sys
import time
import tracemalloc

import numpy as np

from crown_cli.engine.graph_bounds import GraphBounds, fixed_bytes, row_budget_for, row_bytes
from crown_cli.graph.network import Graph, Node
from crown_cli.graph.ops import ActivationOp, Conv, Dense, InputOp


def net(S, rng):
    c1 = Conv(rng.normal(0, 0.3, (8, 3, 3, 3)), rng.normal(0, 0.1, 8), (3, S, S), pads=(1, 1, 1, 1))
    c2 = Conv(rng.normal(0, 0.2, (16, 8, 3, 3)), rng.normal(0, 0.1, 16), c1.out_shape,
              strides=(2, 2), pads=(1, 1, 1, 1))
    n = c2.size
    nodes = [Node("x", InputOp(0, 0, 3 * S * S), (), (1, 3, S, S)),
             Node("c1", c1, (0,), (1,) + c1.out_shape), Node("r1", ActivationOp("relu"), (1,), (1,) + c1.out_shape),
             Node("c2", c2, (2,), (1,) + c2.out_shape), Node("r2", ActivationOp("relu"), (3,), (1,) + c2.out_shape),
             Node("fc", Dense(rng.normal(0, 0.05, (10, n)), rng.normal(0, 0.1, 10)), (4,), (1, 10))]
    return Graph(nodes, 5)


def main(sizes, budget=None):
    print("size  nodes-elements  unstable-rows  widest  fixed-MiB  rows-MiB/neuron  time-s  peak-MiB")
    for S in sizes:
        g = net(S, np.random.default_rng(0))
        x0 = np.random.default_rng(1).uniform(0, 1, g.input_size)
        if budget is not None:
            g.row_budget = row_budget_for(g, budget * 2 ** 30)
        tracemalloc.start()
        t0 = time.perf_counter()
        gb = GraphBounds(g, x0, 0.01, 0)
        gb.bounds()
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        unstable = sum(int(np.sum((gb.lo[n.inputs[0]] < 0) & (gb.hi[n.inputs[0]] > 0)))
                       for n in g.nodes if n.kind == "activation")
        print(f"{S:>4}  {sum(n.size for n in g.nodes):>14}  {unstable:>13}  "
              f"{max(n.size for n in g.nodes):>6}  {fixed_bytes(g) / 2 ** 20:>9.2f}  "
              f"{row_bytes(g) / 2 ** 20:>15.4f}  {dt:>6.2f}  {peak / 2 ** 20:>8.1f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    gb = None
    if "--memory-budget" in args:
        k = args.index("--memory-budget")
        gb = float(args[k + 1])
        del args[k:k + 2]
    main([int(a) for a in args] or [16, 32], gb)
