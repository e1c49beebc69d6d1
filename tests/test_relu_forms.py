"""Clip, Max, Min, Abs and PRelu of data read as ReLU nodes (graph/onnx_relu_forms.py): the
forward pass is the ONNX reference evaluator's, the bounds hold at sampled points, ReLU splitting
decides a property just true or just false on them, and bad operands get one-line errors."""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.errors import InputError
from crown_cli.graph.onnx_graph import load_graph
from graph_models import G
from graph_oracles import onnx_outputs


def _load(tmp_path, model, name="g.onnx"):
    path = os.path.join(tmp_path, name)
    onnx.save(model, path)
    return load_graph(path)


def _check(tmp_path, model, d, relus, seed=0):
    """Forward pass = onnx's reference at random points; CROWN's node intervals and output
    bounds on a box hold at 2000 points of it; ``relus`` ReLU nodes (one per tensor; leaky
    ones counted)."""
    graph = _load(tmp_path, model)
    acts = [n.op.name for n in graph.nodes if n.kind == "activation"]
    assert len(acts) == relus and set(acts) <= {"relu", "leaky_relu"}, acts
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(20, d)) * 2.0
    want = np.array([onnx_outputs(model, row, [(1, d)]) for row in x])
    np.testing.assert_allclose(graph.forward(x), want, rtol=1e-5, atol=1e-5)
    lo, hi = -np.ones(d), np.ones(d)
    gb = GraphBounds(graph, *Box(lo, hi).args(), intermediate="crown")
    xs = rng.uniform(lo, hi, size=(2000, d))
    xs[:200] = np.where(rng.random((200, d)) < 0.5, lo, hi)
    y, vals = graph.forward(xs, return_all=True)
    for i, v in enumerate(vals):
        assert np.all(v >= gb.lo[i]) and np.all(v <= gb.hi[i]), graph.nodes[i].name
    blo, bhi = gb.bounds()
    assert np.all(y >= blo) and np.all(y <= bhi)
    return graph


@pytest.mark.parametrize("form", ["both", "min", "max", "neither", "attributes", "infinite",
                                  "float_max"])
def test_clip_forms(tmp_path, form):
    g = G(np.random.default_rng(1))
    h = g.op("Gemm", ["x", g.rand(4, 3, scale=1.5), g.rand(1, 4)], transB=1)  # (1, n) biases:
    lo, hi = g.const(np.array(-0.3)), g.const(np.array(0.5))
    if form == "attributes":  # opset 6
        c = g.op("Clip", [h], min=-0.3, max=0.5)
    else:
        inf = g.const(np.array(np.inf))
        ins = {"both": [h, lo, hi], "min": [h, lo], "max": [h, "", hi], "neither": [h],
               "infinite": [h, lo, inf],  # max = +inf: no upper clip
               # +-float32's largest, as exporters write an unbounded side: no clip at all
               # (lo + relu(x - lo) would round x away there)
               "float_max": [h, g.const(np.array(-3.4028234663852886e38)),
                             g.const(np.array(3.4028234663852886e38))]}[form]
        c = g.op("Clip", ins)
    y = g.op("Gemm", [c, g.rand(2, 4), g.rand(1, 2)], transB=1)  # opset 6's Gemm broadcasts none
    model = g.model([("x", (1, 3))], [y], opset=6 if form == "attributes" else 17)
    relus = {"both": 2, "min": 1, "max": 1, "neither": 0, "attributes": 2, "infinite": 1,
             "float_max": 0}[form]
    _check(tmp_path, model, 3, relus)


def test_max_min_of_several_inputs_and_broadcasts(tmp_path):
    """Max of two data tensors and two constants (one broadcast along a row), Min of data and
    a constant, in both operand orders."""
    g = G(np.random.default_rng(2))
    a = g.op("Gemm", ["x", g.rand(4, 3, scale=1.5), g.rand(4)], transB=1)
    b = g.op("Gemm", ["x", g.rand(4, 3, scale=1.5), g.rand(4)], transB=1)
    m = g.op("Max", [g.const(np.array([[0.2, -0.1, 0.0, 0.4]])), a, b, g.const(np.array(-0.3))])
    n = g.op("Min", [g.const(np.array(0.25)), m])
    y = g.op("Gemm", [n, g.rand(2, 4), g.rand(2)], transB=1)
    _check(tmp_path, g.model([("x", (1, 3))], [y]), 3, 3)


def test_abs_and_prelu(tmp_path):
    """Abs of data; PRelu with one slope in [0, 1] (a leaky ReLU node) and per-channel slopes
    (one negative, one above 1)."""
    g = G(np.random.default_rng(3))
    h = g.op("Gemm", ["x", g.rand(3, 3, scale=1.5), g.rand(3)], transB=1)
    a = g.op("Abs", [h])
    p1 = g.op("PRelu", [a, g.const(np.array(0.2))])
    k = g.op("Gemm", [p1, g.rand(3, 3, scale=1.5), g.rand(3)], transB=1)
    p2 = g.op("PRelu", [k, g.const(np.array([0.1, -0.5, 1.7]))])
    y = g.op("Gemm", [g.op("Add", [p2, h]), g.rand(2, 3), g.rand(2)], transB=1)
    _check(tmp_path, g.model([("x", (1, 3))], [y]), 3, 2 + 1 + 2)


def test_relu_splitting_decides_a_relu6_network(tmp_path):
    """A ReLU6 network of two inputs: ReLU splitting proves y <= max + gap and finds a
    violation of y <= max - 0.02, max from a 401 x 401 grid (spacing 0.005), gap its distance
    to the true maximum at most (the product of the layers' spectral norms times 0.0036, plus
    0.01)."""
    from crown_cli.verification.graph_verifier import GraphVerifier

    g = G(np.random.default_rng(4))
    h = g.op("Clip", [g.op("Gemm", ["x", g.rand(8, 2, scale=2.0), g.rand(8)], transB=1),
                      g.const(np.array(0.0)), g.const(np.array(0.6))])
    k = g.op("Clip", [g.op("Gemm", [h, g.rand(6, 8, scale=1.0), g.rand(6)], transB=1),
                      g.const(np.array(0.0)), g.const(np.array(0.6))])
    model = g.model([("x", (1, 2))], [g.op("Gemm", [k, g.rand(1, 6), g.rand(1)], transB=1)])
    graph = _load(tmp_path, model)
    W = [onnx.numpy_helper.to_array(i) for i in model.graph.initializer if len(i.dims) == 2]
    gap = float(np.prod([np.linalg.norm(w, 2) for w in W])) * 0.0036 + 0.01
    t = np.linspace(-1.0, 1.0, 401)
    X = np.stack(np.meshgrid(t, t), -1).reshape(-1, 2)
    top = float(graph.forward(X).max())
    v = GraphVerifier(graph, stages=("crown",), attack_restarts=1)
    for margin, want in ((gap, "unsat"), (-0.02, "sat")):
        prop = _output_above(top + margin)
        got = v.verify(prop, 60.0).result
        assert got == want, (margin, got)


def _output_above(c):
    """The property 'y_0 >= c' on x in [-1, 1]^2 (unsafe set), parsed from VNN-LIB text."""
    from crown_cli.io.vnnlib import parse_vnnlib_text

    text = ("(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n"
            "(assert (>= X_0 -1))\n(assert (<= X_0 1))\n(assert (>= X_1 -1))\n"
            "(assert (<= X_1 1))\n" f"(assert (>= Y_0 {c!r}))\n")
    return parse_vnnlib_text(text, "<test>", 2, 1)


@pytest.mark.parametrize("case,message", [
    ("clip_reversed", "min 0.5 is above max -0.3"),
    ("clip_vector", "the min input has 2 values; ONNX Clip takes one number"),
    ("prelu_shape", "does not broadcast to the input's"),
    ("clip_nan", "the max input is nan"),
])
def test_bad_operands_get_one_line_errors(tmp_path, case, message):
    g = G(np.random.default_rng(5))
    h = g.op("Gemm", ["x", g.rand(4, 3), g.rand(4)], transB=1)
    if case == "clip_reversed":
        y = g.op("Clip", [h, g.const(np.array(0.5)), g.const(np.array(-0.3))])
    elif case == "clip_vector":
        y = g.op("Clip", [h, g.const(np.array([0.0, 1.0]))])
    elif case == "clip_nan":
        y = g.op("Clip", [h, g.const(np.array(0.0)), g.const(np.array(np.nan))])
    else:
        y = g.op("PRelu", [h, g.const(np.ones((3, 2)))])
    path = os.path.join(tmp_path, "bad.onnx")
    graph = helper.make_graph(g.nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3])], [helper.make_tensor_value_info(y, TensorProto.FLOAT,
                                                                         [])],
        initializer=g.inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(InputError) as err:
        load_graph(path)
    msg = str(err.value)
    op = "PRelu" if case == "prelu_shape" else "Clip"
    assert message in msg and path in msg and op in msg and "\n" not in msg
