"""alpha-CROWN on products of data (issue 36): each row's mix of McCormick's planes
(crown_cli.engine.node_rules.mixed_planes) is a valid plane at every mix, checked in exact
rational arithmetic; its gradient is the derivative of the row's term; optimising the mixes
raises bounds above CROWN's averaged planes and never above sampled values."""
import os
from fractions import Fraction

import numpy as np
import onnx
import pytest

import crown_cli.engine.graph_alpha as ga
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.engine.node_rules import mix_gradient, mixed_planes, product_planes
from crown_cli.graph.onnx_graph import load_graph
from graph_models import BUILDERS, G


def _boxes(rng, n):
    """Boxes of every sign pattern and scale, some nearly degenerate."""
    c1, c2 = rng.normal(0, 3, n), rng.normal(0, 3, n)
    w1, w2 = rng.exponential(1.0, n) * 10.0 ** rng.integers(-6, 3, n), \
        rng.exponential(1.0, n) * 10.0 ** rng.integers(-6, 3, n)
    return c1 - w1, c1 + w1, c2 - w2, c2 + w2


def test_every_mix_gives_a_valid_plane_in_exact_arithmetic():
    """At random mixes (0 and 1 included) and both sides, the float plane ``a x1 + b x2 +
    ic`` lies below (lower side) or above (upper side) ``x1 x2`` at the box's four corners in
    exact rationals (a bilinear gap takes its extremes there), so no rounding of the slopes or
    intercept makes it invalid. At t = 1/2 it is CROWN's averaged plane; at 0 and 1 its
    slopes are McCormick's."""
    rng = np.random.default_rng(0)
    l1, u1, l2, u2 = _boxes(rng, 400)
    t = rng.uniform(0, 1, (3, 400))
    t[0, :50], t[1, :50] = 0.0, 1.0
    for pos in (np.ones((3, 400), bool), np.zeros((3, 400), bool)):
        a, b, ic, c1, c2 = mixed_planes(l1, u1, l2, u2, t, pos)
        for r in range(3):
            for j in range(400):
                A, B, C = Fraction(a[r, j]), Fraction(b[r, j]), Fraction(ic[r, j])
                for x in (l1[j], u1[j]):
                    for y in (l2[j], u2[j]):
                        gap = Fraction(x) * Fraction(y) - (A * Fraction(x) + B * Fraction(y) + C)
                        assert (gap >= 0) if pos[r, j] else (gap <= 0), (r, j, pos[r, j])
                # the corner reported attains the intercept (up to its rounding charge)
                got = Fraction(c1[r, j]) * Fraction(c2[r, j]) - A * Fraction(c1[r, j]) \
                    - B * Fraction(c2[r, j])
                assert abs(float(got - C)) <= 1e-12 * (1 + abs(float(C)) + abs(a[r, j] * c1[r, j])
                                                       + abs(b[r, j] * c2[r, j]))
    (a0, b0, icL, icU), _, _ = product_planes(l1, u1, l2, u2)
    half = np.full((1, 400), 0.5)
    for pos, ic0 in ((True, icL), (False, icU)):
        a, b, ic, _, _ = mixed_planes(l1, u1, l2, u2, half, np.full((1, 400), pos))
        assert np.array_equal(a[0], a0) and np.array_equal(b[0], b0) and np.array_equal(ic[0], ic0)
    a, b, _, _, _ = mixed_planes(l1, u1, l2, u2, np.ones((1, 400)), np.ones((1, 400), bool))
    assert np.array_equal(a[0], l2) and np.array_equal(b[0], l1)  # P1 = l2 x1 + l1 x2 - l1 l2
    a, b, _, _, _ = mixed_planes(l1, u1, l2, u2, np.ones((1, 400)), np.zeros((1, 400), bool))
    assert np.array_equal(a[0], u2) and np.array_equal(b[0], l1)  # P3 = u2 x1 + l1 x2 - l1 u2


def test_the_mix_gradient_is_the_derivative_of_the_row_term():
    """``mix_gradient`` against central differences of ``L (a z1 + b z2 + ic)`` in t. (The
    extreme of a mix's gap is at the two corners where both of McCormick's planes are tight,
    whichever the rounding picks: the term is smooth in t.)"""
    rng = np.random.default_rng(1)
    l1, u1, l2, u2 = _boxes(rng, 300)
    l1, u1, l2, u2 = (v[None] for v in (l1, u1, l2, u2))
    t = rng.uniform(0.05, 0.95, (1, 300))
    L = rng.normal(size=(1, 300))
    z1, z2 = rng.uniform(l1, u1), rng.uniform(l2, u2)
    h = 1e-6

    def term(tt):
        a, b, ic, c1, c2 = mixed_planes(l1, u1, l2, u2, tt, L >= 0.0)
        return L * (a * z1 + b * z2 + ic), c1, c2

    _, c1, c2 = term(t)
    fd = (term(t + h)[0] - term(t - h)[0]) / (2 * h)
    g = mix_gradient(l1, u1, l2, u2, L, z1, z2, c1, c2)
    scale = 1e-4 * (1 + np.abs(L) * (np.abs(l1) + np.abs(u1)) * (np.abs(l2) + np.abs(u2)))
    assert np.all(np.abs(g - fd) <= scale)
    assert np.mean(np.abs(g)) > 1e-2  # not a test of zeros


def _graph_and_box(tmp_path, model, rng, eps):
    """The model saved and loaded as a graph, and an l_inf box of radius eps around a random
    point: (graph, lo, hi)."""
    path = os.path.join(str(tmp_path), "m.onnx")
    onnx.save(model, path)
    g = load_graph(path)
    x0 = rng.uniform(-1.0, 1.0, g.input_size)
    return g, x0 - eps, x0 + eps


def _products(rng):
    """x (1, 3) -> two Gemms -> Tanh and an affine branch -> their product -> Gemm -> the
    square of a Gemm (a product of one node with itself) added -> Gemm (3 outputs)."""
    g = G(rng)
    h1 = g.op("Tanh", [g.op("Gemm", ["x", g.rand(6, 3, scale=1.0), g.rand(6)], transB=1)])
    h2 = g.op("Gemm", ["x", g.rand(6, 3, scale=1.0), g.rand(6)], transB=1)
    p = g.op("Mul", [h1, h2])
    k = g.op("Gemm", [p, g.rand(5, 6, scale=1.0), g.rand(5)], transB=1)
    s = g.op("Mul", [k, k])
    return g.model([("x", (1, 3))], [g.op("Gemm", [g.op("Add", [k, s]), g.rand(3, 5), g.rand(3)],
                                          transB=1)])


@pytest.mark.parametrize("kind,seed,eps", [("products", 0, 0.3), ("products", 1, 0.3),
                                           ("attention", 1, 0.1)])
def test_optimised_mixes_tighten_and_stay_sound(tmp_path, monkeypatch, kind, seed, eps):
    """With any ReLU slopes held at CROWN's, optimising the products' mixes raises some row's
    bound above CROWN's, never lowers one, and no sampled or corner point of the box lies
    below it."""
    rng = np.random.default_rng(seed)
    model = _products(rng) if kind == "products" else BUILDERS[kind](rng)
    g, lo, hi = _graph_and_box(tmp_path, model, rng, eps)
    gb = GraphBounds(g, *Box(lo, hi).args())
    assert ga.free_mixes(gb, g.output), "no product with a free mix: the test shows nothing"
    monkeypatch.setattr(ga, "free_slopes", lambda gb, upto=None: {})
    rows = rng.standard_normal((6, g.output_size))
    crown = gb.lower(g.output, rows)
    alpha = ga.alpha_lower(gb, g.output, rows, iters=30)
    assert np.all(alpha >= crown)
    assert np.any(alpha > crown + 1e-3 * (1 + np.abs(crown)))
    X = lo + (hi - lo) * rng.uniform(size=(20000, g.input_size))
    X[:8] = np.where(np.arange(8)[:, None] % 2 == 0, lo, hi)[:, :g.input_size]
    assert np.all((g.forward(X) @ rows.T).min(axis=0) >= alpha)


def test_intermediate_alpha_uses_the_mixes(tmp_path):
    """``GraphBounds(intermediate="alpha")`` on a graph whose only free parameters are the
    products' mixes: some node's bounds are tighter than CROWN's, and all enclose sampled
    values."""
    rng = np.random.default_rng(2)
    g, lo, hi = _graph_and_box(tmp_path, _products(rng), rng, 0.3)
    crown = GraphBounds(g, *Box(lo, hi).args())
    alpha = GraphBounds(g, *Box(lo, hi).args(), intermediate="alpha")
    X = lo + (hi - lo) * rng.uniform(size=(20000, g.input_size))
    _, vals = g.forward(X, return_all=True)
    gained = 0.0
    for i in range(len(g.nodes)):
        assert np.all(vals[i] >= alpha.lo[i]) and np.all(vals[i] <= alpha.hi[i])
        gained += float(np.sum((crown.hi[i] - crown.lo[i]) - (alpha.hi[i] - alpha.lo[i])))
    assert gained > 1e-3


def _relu_products(rng):
    """x (1, 3) -> Gemm -> Relu -> Gemm, times an affine branch -> Gemm -> Relu -> Gemm (2
    outputs): ReLUs to split and a product whose planes have a free mix."""
    g = G(rng)
    h = g.op("Relu", [g.op("Gemm", ["x", g.rand(8, 3, scale=1.0), g.rand(8)], transB=1)])
    h = g.op("Gemm", [h, g.rand(6, 8, scale=1.0), g.rand(6)], transB=1)
    k = g.op("Gemm", ["x", g.rand(6, 3, scale=1.0), g.rand(6)], transB=1)
    h = g.op("Relu", [g.op("Gemm", [g.op("Mul", [h, k]), g.rand(6, 6), g.rand(6)], transB=1)])
    return g.model([("x", (1, 3))], [g.op("Gemm", [h, g.rand(2, 6), g.rand(2)], transB=1)])


def test_relu_splitting_keeps_root_mixes_and_stays_sound(tmp_path):
    """ReLU splitting on a graph with a product: the bounder holds each row's mixes optimised
    at the root, its root bound with them is above the averaged planes' (CROWN slopes, no
    split), and the search says unsat just below the sampled minimum only when it holds:
    b far below: unsat; b above a sampled value: sat with a confirmed point."""
    import time

    import crown_cli.verification.bab.graph_bounder as grs

    rng = np.random.default_rng(3)
    g, lo, hi = _graph_and_box(tmp_path, _relu_products(rng), rng, 0.3)
    gb = GraphBounds(g, *Box(lo, hi).args())
    row = rng.normal(size=(1, g.output_size))
    bd = grs.GraphBounder(g, gb, lo, hi, row, np.zeros(1))
    assert bd.mixes and all(v.shape == (1, g.nodes[i].size) for i, v in bd.mixes.items())
    split = np.zeros((1, bd.nU), np.int8)
    alpha = bd.initial_alpha()[None, None].repeat(1, 0)
    beta = np.zeros_like(alpha)
    with_mix = bd.evaluate(split, alpha, beta)[0, 0]
    bd_plain = grs.GraphBounder(g, gb, lo, hi, row, np.zeros(1))
    bd_plain.mixes = {}
    plain = bd_plain.evaluate(split, alpha, beta)[0, 0]
    assert with_mix > plain + 1e-6
    X = lo + (hi - lo) * rng.uniform(size=(40000, g.input_size))
    low = float((g.forward(X) @ row[0]).min())
    assert with_mix <= low
    r = grs.graph_relu_split(g, lo, hi, row, np.array([low + 1e-3 * (1 + abs(low))]),
                             time.monotonic() + 60)
    assert r.verdict == "sat" and row[0] @ g.forward(r.x) <= low + 1e-3 * (1 + abs(low))
    # between the two root bounds: the search proves it (the mixes' root bound does)
    r = grs.graph_relu_split(g, lo, hi, row, np.array([0.5 * (plain + with_mix)]),
                             time.monotonic() + 60)
    assert r.verdict == "unsat", r
