"""GELU (both forms), SiLU, hard swish and Mish (engine/relaxations/self_gated.py): their lines
and ranges hold against 40-digit mpmath (tails included) and on dense float grids, are not
loose, and PyTorch's exported patterns fuse into one node at load (not where their parts are
read elsewhere); ONNX Gelu's approximate forms other than 'tanh' are refused in one line."""
import os

import numpy as np
import onnx
import pytest

from conftest import slow_if
from crown_cli.activations import apply_activation
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.engine.relaxations import self_gated as sg
from crown_cli.errors import InputError
from crown_cli.graph.onnx_graph import load_graph
from graph_models import G

S = 0.7071067811865476  # 1 / sqrt 2
KINDS = {"gelu": (sg.GELU, sg.gelu_relaxation), "silu": (sg.SILU, sg.silu_relaxation),
         "hardswish": (sg.HARDSWISH, lambda l, u, s: sg.hardswish_relaxation(l, u)),
         "mish": (sg.MISH, lambda l, u, s: sg.mish_relaxation(l, u)),
         "gelu_tanh": (sg.GELU_TANH, lambda l, u, s: sg.gelu_tanh_relaxation(l, u))}


def _exact(name, Z, ms):
    import mpmath

    if name == "gelu":
        return Z / 2 * mpmath.erfc(-ms * Z)
    if name == "hardswish":
        return 0 if Z <= -3 else Z if Z >= 3 else Z * (Z + 3) / 6
    if name == "mish":
        return Z * mpmath.tanh(mpmath.log1p(mpmath.exp(Z)))
    if name == "gelu_tanh":
        c = mpmath.sqrt(2 / mpmath.pi)
        # (1 + tanh(y)) / 2 = 1 / (1 + exp(-2y)): no cancellation where tanh(y) ~ -1
        return Z / (1 + mpmath.exp(-2 * c * (Z + mpmath.mpf("0.044715") * Z ** 3)))
    return Z / (1 + mpmath.exp(-ms * Z))


def _intervals(seed, n):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=n) * rng.choice([0.01, 1.0, 3.0, 12.0, 30.0], size=n)
    w = np.abs(rng.normal(size=n)) * rng.choice([0.0, 1e-9, 0.1, 1.0, 5.0], size=n)
    return c - w, c + w


# scales 0.3 and 2 in the slow tier
@pytest.mark.parametrize("name,s", [slow_if(s in (0.3, 2.0), n, s) for n in ("gelu", "silu")
                                    for s in (S, 1.0, 0.3, 2.0)]
                         + [("hardswish", 1.0), ("mish", 1.0), ("gelu_tanh", 1.0)])
def test_lines_and_range_hold_in_exact_arithmetic(name, s):
    """At 33 points of each interval, the real function (mpmath, 40 digits, with the float s)
    lies between the lines and inside the range, where GELU runs from 1e-190 (the rounding
    of erfc's argument is hundreds of ulps of f there) to 150."""
    import mpmath

    mpmath.mp.dps = 40
    kind, relax = KINDS[name]
    l, u = _intervals(int(s * 10), 150)
    aU, bU, aL, bL = relax(l, u, s)
    lo, hi = sg.value_range(kind, l, u, s)
    ms = mpmath.mpf(s)
    for i in range(l.size):
        for z in np.linspace(l[i], u[i], 33):
            Z = mpmath.mpf(z)
            f = _exact(name, Z, ms)
            assert mpmath.mpf(aL[i]) * Z + mpmath.mpf(bL[i]) <= f, (l[i], u[i], z)
            assert f <= mpmath.mpf(aU[i]) * Z + mpmath.mpf(bU[i]), (l[i], u[i], z)
            assert mpmath.mpf(lo[i]) <= f <= mpmath.mpf(hi[i]), (l[i], u[i], z)


@pytest.mark.parametrize("name,s", [(n, s) for n in ("gelu", "silu") for s in (S, 2.0)]
                         + [("hardswish", 1.0), ("mish", 1.0), ("gelu_tanh", 1.0)])
def test_lines_hold_on_a_dense_grid_and_are_not_loose(name, s):
    """On 2001 float points of each interval against the forward pass's GELU: no crossing;
    each line's mean gap over [l, u] within Taylor's max|f''| w^2 / 2 (the midpoint tangent's
    bound; the least-area choice can only be closer); the range that of the grid, up to the
    grid's spacing."""
    kind, relax = KINDS[name]
    l, u = _intervals(3, 600)
    aU, bU, aL, bL = relax(l, u, s)
    lo, hi = sg.value_range(kind, l, u, s)
    curv = s * {"gelu": 1.1283791670955126, "silu": 0.5, "hardswish": 1.0 / 3.0,
                "mish": 0.6443, "gelu_tanh": 0.7979}[name]
    # Mish, GELU's tanh form: 0.64420 and 0.79788 at most (2001-point mpmath scans)
    # max |f''|: 2 s / sqrt(pi), s / 2 (SiLU's f'' in x is sigmoid' (2 + x tanh(-x / 2)), at
    # most 1 / 2 at 0), 1 / 3 (hard swish's middle piece; its kinks at -3 and 3 each add at
    # most their jump in f', 1/2, times the width)
    jump = 1.0 if name == "hardswish" else 0.0
    for i in range(l.size):
        z = np.linspace(l[i], u[i], 2001)
        f = apply_activation(name, z, s)
        up, down = aU[i] * z + bU[i], aL[i] * z + bL[i]
        assert np.all(down <= f) and np.all(f <= up), (l[i], u[i])
        assert lo[i] <= f.min() and f.max() <= hi[i]
        w = u[i] - l[i]
        tol = 1e-12 * (1.0 + np.abs(f).max())
        assert np.mean(up - f) <= curv * w * w / 2 + jump * w + tol, (l[i], u[i])
        assert np.mean(f - down) <= curv * w * w / 2 + jump * w + tol, (l[i], u[i])
        near = curv * (w / 2000) ** 2 + tol  # the grid's distance to the minimum's point
        assert f.min() - lo[i] <= near and hi[i] - f.max() <= tol, (l[i], u[i])


def _pattern(g, h, div=True):
    """PyTorch's GELU export of h."""
    arg = g.op("Div", [h, g.const(np.array(1.4142135381698608))]) if div else \
        g.op("Mul", [g.const(np.array(0.7071067690849304)), h])
    e = g.op("Add", [g.const(np.array(1.0)), g.op("Erf", [arg])])
    return g.op("Mul", [g.op("Mul", [e, h]), g.const(np.array(0.5))])


def _save(tmp_path, model, name="g.onnx"):
    path = os.path.join(tmp_path, name)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("div", [True, False], ids=["div", "mul"])
def test_pytorch_pattern_fuses_into_one_gelu_node(tmp_path, div):
    """Either form of erf's argument, either operand order: one gelu node whose scale is
    1 / c (or the multiplier), the forward pass equal to the pattern's, and the node's
    interval on [-1, 2] GELU's range (-0.170, 1.954), not the product's (-1.42, 2.11)."""
    g = G(np.random.default_rng(0))
    h = g.op("Gemm", ["x", g.const(np.eye(1)), g.const(np.zeros(1))], transB=1)
    out = g.op("Gemm", [_pattern(g, h, div), g.const(np.eye(1)), g.const(np.zeros(1))], transB=1)
    graph = load_graph(_save(tmp_path, g.model([("x", (1, 1))], [out])))
    acts = [n.op for n in graph.nodes if n.kind == "activation"]
    assert [a.name for a in acts] == ["gelu"]
    want = 1.0 / 1.4142135381698608 if div else 0.7071067690849304
    assert acts[0].alpha == want
    x = np.linspace(-6.0, 6.0, 101)[:, None]
    z = x[:, 0]
    c = 1.4142135381698608
    from scipy.special import erf
    ref = 0.5 * z * (1.0 + erf(z / c if div else z * 0.7071067690849304))
    np.testing.assert_allclose(graph.forward(x)[:, 0], ref, rtol=1e-12, atol=1e-15)
    gb = GraphBounds(graph, *Box(np.array([-1.0]), np.array([2.0])).args(), intermediate="crown")
    k = next(i for i, n in enumerate(graph.nodes) if n.kind == "activation")
    assert -0.1701 <= gb.lo[k][0] <= -0.1699 and 1.9544 <= gb.hi[k][0] <= 1.9546


def test_pattern_read_elsewhere_is_not_fused(tmp_path):
    """Where the Erf's output is also a graph output, the pattern stays as written (Erf and
    products of data)."""
    g = G(np.random.default_rng(0))
    h = g.op("Gemm", ["x", g.rand(2, 3), g.rand(2)], transB=1)
    e = g.op("Erf", [g.op("Div", [h, g.const(np.array(1.4142135381698608))])])
    y = g.op("Mul", [g.op("Mul", [h, g.op("Add", [e, g.const(np.array(1.0))])]),
                     g.const(np.array(0.5))])
    graph = load_graph(_save(tmp_path, g.model([("x", (1, 3))], [y, e])))
    names = sorted(n.op.name for n in graph.nodes if n.kind == "activation")
    assert names == ["erf"]


def test_onnx_gelu_node_and_its_tanh_form(tmp_path):
    """ONNX Gelu (opset 20) loads as the exact GELU, approximate='tanh' as GELU's tanh form
    (onnx.reference's values); another approximate is refused in one line naming the
    node."""
    from onnx import TensorProto, helper

    def model(**attrs):
        node = helper.make_node("Gelu", ["x"], ["y"], name="act", **attrs)
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])

    graph = load_graph(_save(tmp_path, model()))
    x = np.array([[-3.0, 0.0, 1.5]])
    np.testing.assert_allclose(graph.forward(x), apply_activation("gelu", x, S), rtol=0,
                               atol=0)
    from onnx.reference import ReferenceEvaluator

    tanh_model = model(approximate="tanh")
    graph = load_graph(_save(tmp_path, tanh_model, "tanh.onnx"))
    assert [n.op.name for n in graph.nodes if n.kind == "activation"] == ["gelu_tanh"]
    x = np.linspace(-8.0, 8.0, 33).reshape(11, 3)
    want = np.concatenate([ReferenceEvaluator(tanh_model).run(None, {"x": r[None].astype(
        np.float32)})[0] for r in x])
    np.testing.assert_allclose(graph.forward(x), want, rtol=1e-6, atol=1e-7)
    path = _save(tmp_path, model(approximate="cubic"), "cubic.onnx")
    with pytest.raises(InputError) as err:
        load_graph(path)
    msg = str(err.value)
    assert "act" in msg and "approximate='cubic' is not supported" in msg and "\n" not in msg


@pytest.mark.parametrize("order", ["h_first", "sigmoid_first"])
def test_pytorch_silu_fuses_into_one_node(tmp_path, order):
    """Mul(h, Sigmoid(h)) in either order: one silu node, the forward pass h sigmoid(h), and
    the node's interval on [-3, 2] SiLU's range (-0.2785, 1.7616), where the product's
    McCormick planes give about [-3.9, 2.9]."""
    g = G(np.random.default_rng(0))
    h = g.op("Gemm", ["x", g.const(np.eye(1)), g.const(np.zeros(1))], transB=1)
    sig = g.op("Sigmoid", [h])
    act = g.op("Mul", [h, sig] if order == "h_first" else [sig, h])
    out = g.op("Gemm", [act, g.const(np.eye(1)), g.const(np.zeros(1))], transB=1)
    graph = _load_model(tmp_path, g.model([("x", (1, 1))], [out]))
    assert [n.op.name for n in graph.nodes if n.kind == "activation"] == ["silu"]
    z = np.linspace(-40.0, 8.0, 97)
    np.testing.assert_allclose(graph.forward(z[:, None])[:, 0], z / (1.0 + np.exp(-z)),
                               rtol=1e-13, atol=1e-300)
    gb = GraphBounds(graph, *Box(np.array([-3.0]), np.array([2.0])).args(), intermediate="crown")
    k = next(i for i, n in enumerate(graph.nodes) if n.kind == "activation")
    assert -0.27847 <= gb.lo[k][0] <= -0.27846 and 1.76159 <= gb.hi[k][0] <= 1.7616


def test_silu_with_its_sigmoid_read_elsewhere_is_not_fused(tmp_path):
    g = G(np.random.default_rng(0))
    h = g.op("Gemm", ["x", g.rand(2, 3), g.rand(2)], transB=1)
    sig = g.op("Sigmoid", [h])
    y = g.op("Mul", [h, sig])
    graph = _load_model(tmp_path, g.model([("x", (1, 3))], [y, sig]))
    assert [n.op.name for n in graph.nodes if n.kind == "activation"] == ["sigmoid"]


def _load_model(tmp_path, model):
    return load_graph(_save(tmp_path, model))


def test_pytorch_mish_legacy_pattern_fuses(tmp_path):
    """Mul(h, Tanh(Softplus(h))) (torch's TorchScript export of nn.Mish): one mish node, the
    forward pass h tanh(softplus(h)) (far tails included), the node's interval on [-3, 2]
    Mish's range (-0.30884, 1.94396)."""
    g = G(np.random.default_rng(0))
    h = g.op("Gemm", ["x", g.const(np.eye(1)), g.const(np.zeros(1))], transB=1)
    act = g.op("Mul", [g.op("Tanh", [g.op("Softplus", [h])]), h])
    out = g.op("Gemm", [act, g.const(np.eye(1)), g.const(np.zeros(1))], transB=1)
    graph = _load_model(tmp_path, g.model([("x", (1, 1))], [out]))
    assert [n.op.name for n in graph.nodes if n.kind == "activation"] == ["mish"]
    z = np.linspace(-60.0, 60.0, 121)
    np.testing.assert_allclose(graph.forward(z[:, None])[:, 0],
                               z * np.tanh(np.logaddexp(0.0, z)), rtol=1e-13, atol=1e-300)
    gb = GraphBounds(graph, *Box(np.array([-3.0]), np.array([2.0])).args(), intermediate="crown")
    k = next(i for i, n in enumerate(graph.nodes) if n.kind == "activation")
    assert -0.30885 <= gb.lo[k][0] <= -0.30884 and 1.94395 <= gb.hi[k][0] <= 1.94397


@pytest.mark.parametrize("T", [20.0, 5.0])
def test_softplus_threshold_lines_hold_across_the_jump(T):
    """z if z > T else softplus(z) (torch's Softplus as its default exporter writes it): the
    lines hold on dense grids plus T and its float neighbours, for intervals below, across
    and above T; across it the lower line sits at most log1p(exp(-T)) below softplus's."""
    from crown_cli.engine.relaxations.extra import (softplus_relaxation,
                                                    softplus_threshold_relaxation)

    rng = np.random.default_rng(int(T))
    c = T + rng.normal(size=300) * rng.choice([0.1, 1.0, 5.0], size=300)
    w = np.abs(rng.normal(size=300)) * rng.choice([0.0, 1e-9, 0.3, 3.0], size=300)
    l, u = c - w, c + w
    aU, bU, aL, bL = softplus_threshold_relaxation(l, u, T)
    pU, qU, pL, qL = softplus_relaxation(l, u)
    jump = np.log1p(np.exp(-T))
    for i in range(l.size):
        z = np.concatenate([np.linspace(l[i], u[i], 2001),
                            [T, np.nextafter(T, np.inf), np.nextafter(T, -np.inf)]])
        z = z[(z >= l[i]) & (z <= u[i])]
        f = apply_activation("softplus_t", z, T)
        assert np.all(aL[i] * z + bL[i] <= f) and np.all(f <= aU[i] * z + bU[i]), (l[i], u[i])
        if l[i] <= T < u[i]:
            assert qL[i] - bL[i] <= jump * (1 + 1e-12) + 1e-300 and aL[i] == pL[i]


def test_softplus_threshold_counterexample_near_its_jump_is_undecided(tmp_path):
    """graph/sign_check: a point whose softplus_t input is within the forward pass's rounding
    of T is not decided (its real value may take the other branch); one far from T is."""
    from onnx import TensorProto, helper

    from crown_cli.graph.sign_check import decided

    W = onnx.numpy_helper.from_array(np.array([[1.0]], np.float32), "W")
    B = onnx.numpy_helper.from_array(np.array([0.0], np.float32), "B")
    T = onnx.numpy_helper.from_array(np.array(20.0, np.float32), "T")
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["h"], transB=1),
             helper.make_node("Softplus", ["h"], ["s"]),
             helper.make_node("Greater", ["h", "T"], ["c"]),
             helper.make_node("Where", ["c", "h", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 1])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 1])], initializer=[W, B, T])
    g = _load_model(tmp_path, helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op.name for n in g.nodes if n.kind == "activation"] == ["softplus_t"]
    x = np.array([[20.0], [np.nextafter(20.0, 0.0)], [19.0], [21.0]])
    _, vals = g.forward(x, return_all=True)
    assert decided(g, vals).tolist() == [False, False, True, True]
