"""Fuzz `crown verify`'s verdicts end to end on random small graphs (the operator mix of
scripts/fuzz_graph_ops.py): for each graph of two inputs on [-1, 1]^2, the largest output 0
seen at 160,000 points (a grid and random points) is m; the property "Y_0 >= m + d" may be
unsat or sat, "Y_0 >= m - d" must not be unsat (a point violates it), d = 1e-3 (1 + |m|). A
`sat` verdict's point must lie in the box and reach the threshold by the float64 forward pass.
Prints one line per violation and a summary; exit 1 on any.

    python scripts/fuzz_verify.py [--graphs 50] [--seed 0] [--timeout 5]
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzz_graph_ops import random_model  # noqa: E402

from crown_cli.graph.onnx_graph import load_graph  # noqa: E402
from crown_cli.io.vnnlib import parse_vnnlib_text  # noqa: E402
from crown_cli.verification.graph_verifier import GraphVerifier  # noqa: E402


def above(c: float, d: int = 2):
    """The property 'Y_0 >= c' on [-1, 1]^d (its unsafe set)."""
    text = "".join(f"(declare-const X_{i} Real)\n" for i in range(d))
    text += "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
    text += "".join(f"(assert (>= X_{i} -1))\n(assert (<= X_{i} 1))\n" for i in range(d))
    text += f"(assert (>= Y_0 {c!r}))\n"
    return parse_vnnlib_text(text, "<fuzz>", d, 2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=5.0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    t = np.linspace(-1.0, 1.0, 200)
    grid = np.stack(np.meshgrid(t, t), -1).reshape(-1, 2)
    bad = 0
    tally = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(a.graphs):
            path = os.path.join(tmp, "g.onnx")
            onnx.save(random_model(rng, d=2), path)
            graph = load_graph(path)
            xs = np.concatenate([grid, rng.uniform(-1.0, 1.0, size=(120000, 2))])
            y = graph.forward(xs)[:, 0]
            if not np.all(np.isfinite(y)):
                continue
            m = float(y.max())
            gap = 1e-3 * (1.0 + abs(m))
            v = GraphVerifier(graph, attack_restarts=8)
            for c, may_be_unsat in ((m + gap, True), (m - gap, False)):
                r = v.verify(above(c), a.timeout)
                tally[r.result] = tally.get(r.result, 0) + 1
                if r.result == "unsat" and not may_be_unsat:
                    bad += 1
                    print(f"graph {n}: unsat for Y_0 >= {c!r}, but {m!r} was reached")
                if r.result == "sat":
                    x = np.asarray(r.x, np.float64).reshape(1, -1)
                    ok = np.all(np.abs(x) <= 1.0) and graph.forward(x)[0, 0] >= c
                    if not ok:
                        bad += 1
                        print(f"graph {n}: sat point {x.tolist()} does not reach {c!r}")
    print(f"{a.graphs} graphs, verdicts {tally}, {bad} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
