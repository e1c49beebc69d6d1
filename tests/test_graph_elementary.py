"""The elementary functions and products of data of the competitions' graphs (issue 36):
their relaxations hold on dense grids and are not loose, a product's planes give McCormick's
bound, a division by data whose interval holds 0 gives infinite (not nan) bounds, and
constant subgraphs fold at load."""
import os
import warnings

import numpy as np
import onnx
import pytest

from crown_cli.activations import apply_activation
from crown_cli.engine.graph_bounds import GraphBounds, graph_bounds
from crown_cli.engine.input_sets import Box
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.graph.onnx_graph import load_graph
from graph_models import G, elementary
from graph_oracles import onnx_outputs

# |f''| on an interval of width <= 1 around c (a bound for the tightness check)
CURV = {"sin": lambda l, u: 1.0, "cos": lambda l, u: 1.0, "exp": lambda l, u: np.exp(u),
        "reciprocal": lambda l, u: 2.0 / min(abs(l), abs(u)) ** 3,
        "square": lambda l, u: 2.0, "cube": lambda l, u: 6.0 * max(abs(l), abs(u)),
        "sqrt": lambda l, u: 1e300 if l <= 1e-100 else 0.25 / l ** 1.5}
FUNCTIONS = ["sin", "cos", "exp", "reciprocal", "square", "cube", "sqrt"]


def _intervals(name, rng, n=400):
    c = rng.normal(size=n) * rng.choice([0.1, 1.0, 4.0, 40.0], size=n)
    w = np.abs(rng.normal(size=n)) * rng.choice([0.0, 1e-9, 0.01, 0.5, 3.0, 10.0], size=n)
    l, u = c - w, c + w
    if name == "exp":
        l, u = np.minimum(l, 20.0), np.minimum(u, 20.0)
    if name == "sqrt":  # its domain z >= 0, from 0 itself up
        a = np.abs(c) * rng.choice([0.0, 1e-6, 1.0], size=n)
        l, u = a, a + 2 * w
    if name == "reciprocal":  # one side of 0, sometimes very close to it
        side = np.where(rng.random(n) < 0.5, 1.0, -1.0)
        a = np.abs(l) * 0.1 + rng.choice([1e-3, 0.1, 1.0], size=n)
        l, u = np.where(side > 0, a, -(a + 2 * w)), np.where(side > 0, a + 2 * w, -a)
    return l, u


@pytest.mark.parametrize("name", FUNCTIONS)
def test_relaxation_holds_on_a_dense_grid_and_is_tight(name):
    rng = np.random.default_rng(FUNCTIONS.index(name))
    l, u = _intervals(name, rng)
    aU, bU, aL, bL = get_relaxation(name, "crown")(l, u)
    for i in range(l.size):
        z = np.linspace(l[i], u[i], 4001)
        f = apply_activation(name, z)
        assert np.all(aL[i] * z + bL[i] <= f), (name, l[i], u[i])
        assert np.all(f <= aU[i] * z + bU[i]), (name, l[i], u[i])
        w = u[i] - l[i]
        if w <= 1.0:  # not loose: within the curvature's gap of the function
            gap = max(np.max(aU[i] * z + bU[i] - f), np.max(f - aL[i] * z - bL[i]))
            assert gap <= CURV[name](l[i], u[i]) * w * w / 2 + 1e-12 * (1 + np.abs(f).max()), \
                (name, l[i], u[i], gap)


@pytest.mark.parametrize("name", ["square", "cube"])
def test_powers_hold_in_exact_arithmetic(name):
    """z^2 and z^3 are polynomials: each line's worst gap over [l, u] is at an end-point or
    where the derivative equals the slope, all exactly computable in rationals from the
    floats. No line may cross the function by even one rational point; intervals near 0,
    across it, tiny, huge and at overflow included."""
    from fractions import Fraction as F

    rng = np.random.default_rng(11)
    c = rng.normal(size=300) * rng.choice([1e-3, 1.0, 30.0, 1e40], size=300)
    w = np.abs(rng.normal(size=300)) * rng.choice([0.0, 1e-12, 0.3, 5.0], size=300) * \
        np.maximum(1.0, np.abs(c))
    l = np.concatenate([c - w, [-1e160, -1e120, 0.0, -2.0]])
    u = np.concatenate([c + w, [1.0, 1e110, 1e-300, -2.0]])
    p = 2 if name == "square" else 3
    aU, bU, aL, bL = get_relaxation(name, "crown")(l, u)
    for i in range(l.size):
        lo, hi = F(float(l[i])), F(float(u[i]))
        for a, b, upper in ((aU[i], bU[i], True), (aL[i], bL[i], False)):
            if not np.isfinite(b):
                assert (b == np.inf) == upper
                continue
            k = F(float(a))
            pts = [lo, hi]  # f'(t) = k: t = k / 2, or t^2 = k / 3 (checked on a grid of
            if p == 2:      # rationals around the float root too)
                pts.append(k / 2)
            elif k >= 0:
                r = F(float(np.sqrt(float(k) / 3.0)))
                pts += [s * (r + d * r / 2**40) for s in (1, -1) for d in (-1, 0, 1)]
            for t in pts:
                if lo <= t <= hi:
                    gap = k * t + F(float(b)) - t ** p
                    assert (gap >= 0) if upper else (gap <= 0), (name, l[i], u[i], upper)


def test_sqrt_holds_in_exact_arithmetic():
    """sqrt's lines against the function in rationals (squares compared, no rounding): the
    chord below and the tangent above at the end-points, at the tangent's own point
    1 / (4 k^2) and around it; intervals from 0, tiny, huge; below 0 no bound, on [0, 0]
    the constant 0, up to +inf the constant sqrt(l) below."""
    from fractions import Fraction as F

    rng = np.random.default_rng(12)
    a = np.abs(rng.normal(size=300)) * rng.choice([0.0, 1e-300, 1e-8, 1.0, 1e30], size=300)
    w = np.abs(rng.normal(size=300)) * rng.choice([0.0, 1e-12, 0.3, 5.0, 1e20], size=300) * \
        np.maximum(1.0, a)
    l, u = a, a + w
    aU, bU, aL, bL = get_relaxation("sqrt", "crown")(l, u)
    for i in range(l.size):
        lo, hi = F(float(l[i])), F(float(u[i]))
        for k, b, upper in ((aU[i], bU[i], True), (aL[i], bL[i], False)):
            k, b = F(float(k)), F(float(b))
            pts = [lo, hi]
            if k > 0:
                t0 = 1 / (4 * k * k)
                pts += [t0 + d * t0 / 2**40 for d in (-1, 0, 1)]
            for t in pts:
                if not lo <= t <= hi:
                    continue
                y = k * t + b  # the line at t against sqrt(t): compare y^2 with t
                if upper:
                    assert y >= 0 and y * y >= t, (l[i], u[i], "upper")
                else:
                    assert y <= 0 or y * y <= t, (l[i], u[i], "lower")
    aU, bU, aL, bL = get_relaxation("sqrt", "crown")(np.array([-1e-9, 0.0, 4.0]),
                                                     np.array([1.0, 0.0, np.inf]))
    np.testing.assert_array_equal(bU, [np.inf, 0.0, np.inf])
    np.testing.assert_array_equal(aU, 0.0)
    assert bL[0] == -np.inf and bL[1] == 0.0 and 1.99 < bL[2] <= 2.0


def test_pow_refuses_what_it_cannot_bound(tmp_path):
    """Pow of data by an exponent other than 0.5, 1, 2, 3, or by data: one line naming the node
    and the problem. Pow of constants folds."""
    from crown_cli.errors import InputError

    for exponent, want in ((1.5, "exponent 1.5 (supported for data: 0.5, 1, 2, 3)"),
                           ("x", "the exponent must be a constant, not data"),
                           (np.array([2.0, 3.0]), "the exponent must be one number"),
                           (np.full(3, 2.0), "the exponent of shape (3,) does not fit the "
                                             "data's (1, 2)"),
                           (np.full((2, 1, 2), 2.0), "the exponent of shape (2, 1, 2) does "
                                                     "not fit")):
        g = G(np.random.default_rng(0))
        e = exponent if isinstance(exponent, str) else g.const(np.asarray(exponent))
        path = _save(tmp_path, g.model([("x", (1, 2))], [g.op("Pow", ["x", e])]))
        with pytest.raises(InputError, match="Pow node") as info:
            load_graph(path)
        assert want in str(info.value) and path in str(info.value)
    g = G(np.random.default_rng(0))
    k = g.op("Pow", [g.const(np.array([2.0, -3.0])), g.const(np.array(3.0))])
    graph = load_graph(_save(tmp_path, g.model([("x", (1, 2))], [g.op("Add", ["x", k])])))
    np.testing.assert_allclose(graph.forward(np.array([1.0, 1.0])), [9.0, -26.0])


def test_periodic_relaxation_over_a_full_period_is_the_range():
    l, u = np.array([-3.0, 100.0]), np.array([3.5, 107.0])
    for name in ("sin", "cos"):
        aU, bU, aL, bL = get_relaxation(name, "crown")(l, u)
        np.testing.assert_array_equal(aU, 0.0)
        np.testing.assert_array_equal(bU, 1.0)
        np.testing.assert_array_equal(bL, -1.0)


def _save(tmp_path, model, name="m"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(model, path)
    return path


def test_product_bound_is_mccormick(tmp_path):
    """y = x0 * x1 on a box: the lower bound lies below the true minimum (a corner) by at
    most the averaged planes' largest gap (u0 - l0)(u1 - l1) / 2 (x0 x1 minus the plane is
    (x0 - m0)(x1 - m1) + h0 h1 with h the half widths), and above it by nothing; the same
    for the upper bound."""
    g = G(np.random.default_rng(0))
    s0 = g.op("Gather", ["x", g.const(np.array([0]), np.int64)], axis=1)
    s1 = g.op("Gather", ["x", g.const(np.array([1]), np.int64)], axis=1)
    graph = load_graph(_save(tmp_path, g.model([("x", (1, 2))], [g.op("Mul", [s0, s1])])))
    rng = np.random.default_rng(1)
    for _ in range(50):
        a = rng.normal(size=2) * 2
        lo, hi = a - rng.uniform(0, 2, 2), a + rng.uniform(0, 2, 2)
        corners = [p * q for p in (lo[0], hi[0]) for q in (lo[1], hi[1])]
        low, up = graph_bounds(graph, *Box(lo, hi).args())
        gap = (hi[0] - lo[0]) * (hi[1] - lo[1]) / 2
        tol = 1e-8 * (1.0 + max(abs(c) for c in corners))  # the final sums' allowance
        assert min(corners) - gap - tol <= low[0] <= min(corners)
        assert max(corners) <= up[0] <= max(corners) + gap + tol


def test_division_by_an_interval_holding_zero_is_unbounded_not_nan(tmp_path):
    g = G(np.random.default_rng(0))
    y = g.op("Gemm", ["x", g.rand(2, 3), g.rand(2)], transB=1)
    q = g.op("Div", [g.op("Relu", [y]), g.op("Gemm", ["x", g.rand(2, 3), g.rand(2)],
                                              transB=1)])
    out = g.op("Gemm", [g.op("Relu", [q]), g.rand(2, 2), g.rand(2)], transB=1)
    graph = load_graph(_save(tmp_path, g.model([("x", (1, 3))], [out])))
    for mode in ("crown", "interval", "forward"):
        with warnings.catch_warnings():  # nan met on the way is handled, not printed
            warnings.simplefilter("error", RuntimeWarning)
            gb = GraphBounds(graph, np.zeros(3), 5.0, 0, intermediate=mode)
            lo, hi = gb.bounds()
        assert not np.any(np.isnan(lo)) and not np.any(np.isnan(hi))
        assert np.all(np.isinf(lo) | np.isinf(hi))
        # every node past the unbounded one has an interval, infinite maybe, never nan
        assert not any(np.isnan(gb.lo[i]).any() or np.isnan(gb.hi[i]).any()
                       for i in range(len(graph.nodes)))


def test_a_quotient_by_exp_keeps_its_denominator_positive(tmp_path):
    """exp's interval is [e^l, e^u] (rounded out), not the lines' range, which goes below 0 on
    a wide interval: x / exp(w x) on a wide box stays bounded (its reciprocal's input never
    holds 0)."""
    g = G(np.random.default_rng(3))
    e = g.op("Exp", [g.op("Gemm", ["x", g.const(np.full((2, 2), 2.0)), g.const(np.zeros(2))],
                            transB=1)])
    model = g.model([("x", (1, 2))], [g.op("Div", ["x", e])])
    graph = load_graph(_save(tmp_path, model))
    box = Box(np.array([-3.0, -2.0]), np.array([2.0, 3.0]))
    lo, hi = graph_bounds(graph, *box.args())
    assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))
    xs = np.random.default_rng(4).uniform(box.lo, box.hi, size=(2000, 2))
    ys = graph.forward(xs)
    assert np.all(ys >= lo) and np.all(ys <= hi)


def test_constant_over_data_is_a_scaled_reciprocal(tmp_path):
    g = G(np.random.default_rng(0))
    y = g.op("Div", [g.const(np.array([1.0, -2.0, 3.0])), g.op("Exp", ["x"])])
    model = g.model([("x", (1, 3))], [y])
    graph = load_graph(_save(tmp_path, model))
    x = np.array([0.3, -1.2, 2.0])
    np.testing.assert_allclose(graph.forward(x), onnx_outputs(model, x, [(1, 3)]), rtol=1e-6)
    lo, hi = graph_bounds(graph, *Box(x - 0.1, x + 0.1).args())
    xs = np.random.default_rng(1).uniform(x - 0.1, x + 0.1, size=(500, 3))
    ys = graph.forward(xs)
    assert np.all(ys >= lo) and np.all(ys <= hi)


def test_elementary_graph_matches_onnx_and_folds_constants(tmp_path):
    model = elementary(np.random.default_rng(3))
    graph = load_graph(_save(tmp_path, model))
    assert not any(n.kind == "activation" and n.op.name == "relu" and not n.inputs
                   for n in graph.nodes)
    kinds = {n.op.name for n in graph.nodes if n.kind == "activation"}
    assert {"sin", "cos", "exp", "reciprocal", "relu"} <= kinds
    assert sum(n.kind == "product" for n in graph.nodes) == 4  # 3 Mul + 1 Div
    rng = np.random.default_rng(4)
    for x in rng.normal(size=(5, 4)):
        np.testing.assert_allclose(graph.forward(x), onnx_outputs(model, x, [(1, 4)]),
                                   rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("axis,biased", [(-1, True), (1, True), (2, False)])
def test_layer_normalization_matches_onnx_and_its_bounds_hold(tmp_path, axis, biased):
    """ONNX LayerNormalization (opset 17) over the axes from ``axis``: the forward pass
    against onnx.reference, and CROWN's bounds against sampled points and the box's corners
    (the construction: means, a square, Sqrt, a division by data)."""
    rng = np.random.default_rng(3)
    g = G(rng)
    shape = (1, 3, 4)
    norm = shape[axis:]
    ins = ["x", g.const(rng.uniform(0.5, 1.5, norm))] + \
        ([g.const(rng.normal(0, 0.3, norm))] if biased else [])
    y = g.op("LayerNormalization", ins, axis=axis, epsilon=1e-3)
    model = g.model([("x", shape)], [g.op("Relu", [y])])
    graph = load_graph(_save(tmp_path, model))
    x = rng.normal(size=(6, 12))
    for xi in x:
        np.testing.assert_allclose(graph.forward(xi), onnx_outputs(model, xi, [shape]),
                                   atol=1e-5)
    for eps in (0.01, 0.3):
        lo, hi = GraphBounds(graph, x[0], eps, 0).bounds()
        pts = x[0] + eps * rng.uniform(-1, 1, size=(4000, 12))
        pts[:500] = x[0] + eps * np.sign(rng.normal(size=(500, 12)))
        out = graph.forward(pts)
        assert np.all(out >= lo) and np.all(out <= hi), (axis, eps)
        assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))


def test_sqrt_of_data_matches_onnx_and_refuses_nothing_it_can_bound(tmp_path):
    """Sqrt of data (and Pow by 0.5) as an activation node: the forward pass against
    onnx.reference; on an input interval reaching below 0 the node has no bound (-inf, inf),
    not nan."""
    rng = np.random.default_rng(4)
    g = G(rng)
    pos = g.op("Add", [g.op("Relu", ["x"]), g.const(np.array(0.25))])
    out = g.op("Concat", [g.op("Sqrt", [pos]), g.op("Pow", [pos, g.const(np.array(0.5))])],
               axis=1)
    model = g.model([("x", (1, 3))], [out])
    graph = load_graph(_save(tmp_path, model))
    for xi in rng.normal(size=(5, 3)):
        np.testing.assert_allclose(graph.forward(xi), onnx_outputs(model, xi, [(1, 3)]),
                                   rtol=1e-6)
    g = G(rng)
    model = g.model([("x", (1, 1))], [g.op("Sqrt", ["x"])])
    graph = load_graph(_save(tmp_path, model, "raw"))
    lo, hi = GraphBounds(graph, np.array([0.5]), 1.0, 0).bounds()
    assert lo[0] == -np.inf and hi[0] == np.inf  # [-0.5, 1.5]: below 0
    lo, hi = GraphBounds(graph, np.array([4.0]), 1.0, 0).bounds()
    assert 1.7 < lo[0] <= np.sqrt(3.0) and np.sqrt(5.0) <= hi[0] < 2.3


def test_instance_normalization_matches_onnx_and_its_bounds_hold(tmp_path):
    """ONNX InstanceNormalization (each channel over its spatial axes; PyTorch's GroupNorm
    and InstanceNorm2d exports) against onnx.reference, and CROWN's bounds against samples."""
    rng = np.random.default_rng(5)
    g = G(rng)
    shape = (1, 3, 3, 4)
    y = g.op("InstanceNormalization", ["x", g.const(rng.uniform(0.5, 1.5, 3)),
                                       g.const(rng.normal(0, 0.3, 3))], epsilon=1e-2)
    model = g.model([("x", shape)], [g.op("Relu", [y])])
    graph = load_graph(_save(tmp_path, model))
    x = rng.normal(size=(5, 36))
    for xi in x:
        np.testing.assert_allclose(graph.forward(xi), onnx_outputs(model, xi, [shape]),
                                   atol=1e-5)
    lo, hi = GraphBounds(graph, x[0], 0.05, 0).bounds()
    pts = x[0] + 0.05 * rng.uniform(-1, 1, size=(4000, 36))
    out = graph.forward(pts)
    assert np.all(out >= lo) and np.all(out <= hi) and np.all(np.isfinite(lo))
