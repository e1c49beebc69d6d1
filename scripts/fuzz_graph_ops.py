"""Fuzz the bounds of the graph-only operators (issue 36): random small ONNX graphs mixing
Gemm, Relu, Sin, Cos, Exp, Sign, Tanh, Sigmoid, Atan, Erf, Floor, Pow by 2 and 3, Clip, Abs,
PRelu, Max and Min with constants, GELU (both exported forms), SiLU, HardSwish, Mish, Selu,
Celu, products and quotients of data, MatMul of data and a Softmax inside the graph; for
each, every node's interval (CROWN, alpha-CROWN, forward and interval intermediate bounds)
must enclose its values at sampled points of a random box and at the points a sign-guided
search reaches, and alpha-CROWN's bounds of random output rows (its slopes, pool weights
and products' mixes optimised) must lie below the rows' sampled values. Prints one line per
violation and a summary; exit 1 on any violation.

    python scripts/fuzz_graph_ops.py [--graphs 200] [--seed 0]
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from graph_models import G  # noqa: E402

from crown_cli.engine.graph_alpha import alpha_lower  # noqa: E402
from crown_cli.engine.graph_bounds import GraphBounds  # noqa: E402
from crown_cli.engine.input_sets import Box  # noqa: E402
from crown_cli.graph.onnx_graph import load_graph  # noqa: E402

UNARY = ["Relu", "Sin", "Cos", "Exp", "Sign", "Tanh", "Sigmoid", "Atan", "Erf", "Floor", "Pow2",
         "Pow3", "Clip", "Abs", "PRelu", "Max", "Min", "GELU", "SiLU", "HardSwish",
         "Mish", "Selu", "Celu", "GELUtanh"]


def unary(g, rng, h, width):
    """A random elementwise function of h (PowN: Pow with the constant exponent N; Clip,
    PRelu, Max and Min with random constants)."""
    name = str(rng.choice(UNARY))
    if name.startswith("Pow"):
        return g.op("Pow", [h, g.const(np.array(float(name[3:]), np.float32))])
    if name == "Clip":
        lo = float(rng.normal())
        return g.op("Clip", [h, g.const(np.array(lo)), g.const(np.array(lo + rng.uniform(0, 2)))])
    if name == "PRelu":
        return g.op("PRelu", [h, g.const(rng.normal(size=width))])
    if name in ("Max", "Min"):
        return g.op(name, [h, g.const(rng.normal(size=width))])
    if name == "GELU":  # PyTorch's export, fused at load
        e = g.op("Erf", [g.op("Div", [h, g.const(np.array(1.4142135))])])
        return g.op("Mul", [g.op("Mul", [h, g.op("Add", [e, g.const(np.array(1.0))])]),
                            g.const(np.array(0.5))])
    if name == "Selu":
        return g.op("Selu", [h], alpha=float(rng.uniform(0.5, 3.0)),
                    gamma=float(rng.uniform(0.5, 2.0)))
    if name == "Celu":
        return g.op("Celu", [h], alpha=float(rng.uniform(0.3, 2.0)))
    if name == "GELUtanh":  # the TorchScript exporter's chain, fused at load
        cube = g.op("Mul", [g.op("Mul", [h, h]), h])
        inner = g.op("Add", [h, g.op("Mul", [g.const(np.array(0.044715)), cube])])
        t = g.op("Tanh", [g.op("Mul", [g.const(np.array(0.7978845834732056)), inner])])
        return g.op("Mul", [g.op("Mul", [h, g.op("Add", [g.const(np.array(1.0)), t])]),
                            g.const(np.array(0.5))])
    if name == "SiLU":
        return g.op("Mul", [h, g.op("Sigmoid", [h])])
    if name == "Mish":
        return g.op("Mul", [h, g.op("Tanh", [g.op("Softplus", [h])])])
    return g.op(name, [h])


def random_model(rng, d=4):
    """A random graph on x (1, d): a few layers of Gemm, an elementwise function, and now and
    then a product or quotient of two branches, an attention-like block, a final Gemm."""
    g = G(rng)
    x, width = "x", d
    for _ in range(rng.integers(1, 4)):
        w = int(rng.integers(2, 6))
        h = g.op("Gemm", [x, g.rand(w, width, scale=float(rng.uniform(0.3, 1.5))), g.rand(w)],
                 transB=1)
        kind = rng.integers(0, 4)
        if kind == 0:
            h = unary(g, rng, h, w)
        elif kind == 1:  # a product of two branches
            k = g.op("Gemm", [x, g.rand(w, width), g.rand(w)], transB=1)
            h = g.op("Mul", [unary(g, rng, h, w), k])
        elif kind == 2:  # a quotient by a positive branch
            k = g.op("Exp", [g.op("Gemm", [x, g.rand(w, width, scale=0.3), g.rand(w)], transB=1)])
            h = g.op("Div", [h, k])
        else:  # attention on (w, 1) x (1, w), softmax along the last axis
            q = g.op("Reshape", [h, g.const([1, w, 1], np.int64)])
            k = g.op("Reshape", [g.op("Gemm", [x, g.rand(w, width), g.rand(w)], transB=1),
                                 g.const([1, 1, w], np.int64)])
            s = g.op("Softmax", [g.op("MatMul", [q, k])], axis=-1)
            h = g.op("Flatten", [g.op("MatMul", [s, q])], axis=1)
        x, width = h, w
    return g.model([("x", (1, d))], [g.op("Gemm", [x, g.rand(2, width), g.rand(2)], transB=1)])


def check(graph, box, rng, mode):
    """Violations of the intervals of ``mode`` intermediate bounds on the box."""
    gb = GraphBounds(graph, *box.args(), intermediate=mode)
    xs = rng.uniform(box.lo, box.hi, size=(3000, box.lo.size))
    xs[:300] = np.where(rng.random((300, box.lo.size)) < 0.5, box.lo, box.hi)
    with np.errstate(over="ignore", invalid="ignore"):  # an Exp far out: inf, as it is
        _, vals = graph.forward(xs, return_all=True)
    bad = []
    for i, v in enumerate(vals):
        if np.isnan(gb.lo[i]).any() or np.isnan(gb.hi[i]).any():
            bad.append((graph.nodes[i].name + " (nan bound)", np.nan, np.nan))
        elif np.any(v < gb.lo[i]) or np.any(v > gb.hi[i]):
            bad.append((graph.nodes[i].name, float(np.min(v - gb.lo[i])),
                        float(np.min(gb.hi[i] - v))))
    lo, hi = gb.bounds()
    y = vals[graph.output]
    if np.isnan(lo).any() or np.isnan(hi).any() or np.any(y < lo) or np.any(y > hi):
        bad.append(("output (CROWN)", float(np.min(y - lo)), float(np.min(hi - y))))
    if mode == "alpha":
        rows = rng.normal(size=(4, y.shape[1]))
        low = alpha_lower(gb, graph.output, rows)
        # the rows' values at the samples whose outputs are finite (an overflowed sample
        # holds inf: inf - inf would be nan, which no comparison flags)
        finite = np.all(np.isfinite(y), axis=1)
        gap = (y[finite] @ rows.T).min(axis=0, initial=np.inf) - low
        if np.isnan(low).any() or np.any(gap < 0.0):
            bad.append(("output rows (alpha-CROWN)", float(np.min(gap)), np.inf))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    found = checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(a.graphs):
            path = os.path.join(tmp, "g.onnx")
            onnx.save(random_model(rng), path)
            graph = load_graph(path)
            c = rng.normal(size=graph.input_size)
            box = Box(c - rng.uniform(0.0, 1.0, c.size), c + rng.uniform(0.0, 1.0, c.size))
            for mode in ("crown", "alpha", "forward", "interval"):
                checked += 1
                for name, below, above in check(graph, box, rng, mode):
                    found += 1
                    print(f"graph {n} ({mode}): {name} violated by {min(below, above):.3g}")
    print(f"{checked} bounds checked on {a.graphs} graphs, {found} violations")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
