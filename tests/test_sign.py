"""ONNX Sign (binarised networks, issue 36): its relaxation (sound on a dense grid around the
jump, in exact arithmetic at the end-points and at 0), the loader (Sign of constants folded,
of data an activation node; the forward pass against onnx.reference), CROWN bounds on sampled
points, the attack's surrogate gradient, the check that refuses a counterexample whose Sign
inputs are within rounding of 0, and the softmax output's pairwise properties."""
import math
import os
from fractions import Fraction

import numpy as np
import onnx
import pytest

from crown_cli.engine.graph_bounds import graph_bounds
from crown_cli.engine.input_sets import Box
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.engine.relaxations.sign import sign_relaxation
from crown_cli.errors import InputError
from crown_cli.graph.network import Graph, Node
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.graph.ops import ActivationOp, Dense, InputOp
from crown_cli.graph.sign_check import decided, decided_outputs
from crown_cli.verification.graph_verifier import graph_counterexample, order_only

from graph_models import G
from graph_oracles import onnx_outputs

TINY = 5e-324
ENDS = [-1e6, -3.0, -1.0, -0.5, -1e-3, -1e-150, -1e-152, -1e-300, -TINY, 0.0, TINY, 1e-300,
        1e-152, 1e-150, 1e-3, 0.5, 1.0, 2.5,
        1e6]


def _intervals():
    e = np.array(ENDS)
    L, U = np.meshgrid(e, e, indexing="ij")
    keep = L <= U
    return L[keep], U[keep]


def _grid(l, u):
    """Points of [l, u]: the ends, 0 and its float neighbours, a uniform grid."""
    z = np.concatenate([[l, u, 0.0, TINY, -TINY, 1e-300, -1e-300],
                        np.linspace(l, u, 201), l + (u - l) * np.linspace(0, 1e-9, 11)])
    return z[(z >= l) & (z <= u)]


def test_relaxation_sound_on_a_dense_grid_including_the_jump():
    l, u = _intervals()
    aU, bU, aL, bL = sign_relaxation(l, u)
    for i in range(l.size):
        z = _grid(l[i], u[i])
        s = np.sign(z)
        assert np.all(aL[i] * z + bL[i] <= s), (l[i], u[i])
        assert np.all(s <= aU[i] * z + bU[i]), (l[i], u[i])


def test_relaxation_sound_in_exact_arithmetic():
    """Lines are linear, sign is constant on [l, 0), {0}, (0, u]: checking the exact values at
    l, u, 0 and the limits at 0 from each side covers every point."""
    l, u = _intervals()
    aU, bU, aL, bL = sign_relaxation(l, u)
    for i in range(l.size):
        F = Fraction
        au, bu, al, bl = F(aU[i]), F(bU[i]), F(aL[i]), F(bL[i])
        pts = [(F(l[i]), int(np.sign(l[i]))), (F(u[i]), int(np.sign(u[i])))]
        if l[i] <= 0.0 <= u[i]:
            pts.append((F(0), 0))
        if l[i] < 0.0:  # approaching 0 from the left: -1
            pts.append((F(min(u[i], 0.0)), -1))
        if u[i] > 0.0:
            pts.append((F(max(l[i], 0.0)), 1))
        for z, s in pts:
            assert al * z + bl <= s <= au * z + bu, (l[i], u[i], z)


def test_relaxation_is_the_function_where_it_is_constant_and_tight_across_the_jump():
    l = np.array([0.5, -2.0, 0.0, 0.0, -1.0, -1.0, -3.0, -1.0])
    u = np.array([2.0, -0.5, 0.0, 2.0, 0.0, 3.0, 1.0, 1.0])
    aU, bU, aL, bL = sign_relaxation(l, u)
    assert list(aU[:3]) == [0, 0, 0] and list(bU[:3]) == [1, -1, 0]
    assert list(aL[:3]) == [0, 0, 0] and list(bL[:3]) == [1, -1, 0]
    # l = 0 < u: upper 1, lower the chord through (0, 0) and (u, 1)
    assert (aU[3], bU[3]) == (0.0, 1.0) and aL[3] == 0.5 and bL[3] == pytest.approx(0, abs=1e-14)
    # l < 0 = u: lower -1, upper the chord through (l, -1) and (0, 0)
    assert (aL[4], bL[4]) == (0.0, -1.0) and aU[4] == 1.0 and bU[4] == pytest.approx(0, abs=1e-14)
    # u > -l: upper the constant 1, lower through (0, -1) and (u, 1)
    assert (aU[5], bU[5]) == (0.0, 1.0)
    assert aL[5] == pytest.approx(2 / 3) and bL[5] == pytest.approx(-1, abs=1e-14)
    # u < -l: lower the constant -1, upper through (l, -1) and (0, 1)
    assert (aL[6], bL[6]) == (0.0, -1.0)
    assert aU[6] == pytest.approx(2 / 3) and bU[6] == pytest.approx(1, abs=1e-14)
    # u = -l: the constants
    assert (aU[7], bU[7], aL[7], bL[7]) == (0.0, 1.0, 0.0, -1.0)


def test_registry_and_record():
    fn = get_relaxation("sign", "crown")
    out = fn(np.array([-1.0]), np.array([2.0]))
    np.testing.assert_array_equal(np.concatenate(out), np.concatenate(
        sign_relaxation(np.array([-1.0]), np.array([2.0]))))
    with pytest.raises(InputError, match="fast-lin"):
        get_relaxation("sign", "fast-lin")


# -- ONNX --------------------------------------------------------------------------------

def _binarised(rng, double=True, first_sign=False):
    """x (1, 6) [-> Sign] -> MatMul Sign(W1) + b1 -> Sign [-> +0.1 -> Sign] -> MatMul
    Sign(W2) -> (1, 3): binarised weights by Sign of constants, as Larq's exports."""
    g = G(rng)
    x = g.op("Sign", ["x"]) if first_sign else "x"
    w1 = g.op("Sign", [g.rand(6, 8)])
    h = g.op("Add", [g.op("MatMul", [x, w1]), g.rand(1, 8)])
    h = g.op("Sign", [h])
    if double:
        h = g.op("Sign", [g.op("Add", [h, g.const(np.full((1, 8), 0.1))])])
    y = g.op("MatMul", [h, g.op("Sign", [g.rand(8, 3)])])
    return g.model([("x", (1, 6))], [y])


def _load(tmp_path, model, name="s.onnx"):
    path = os.path.join(str(tmp_path), name)
    onnx.save(model, path)
    return load_graph(path)


@pytest.mark.parametrize("double", [False, True])
def test_onnx_sign_forward_matches_reference_and_folds_constants(tmp_path, double):
    model = _binarised(np.random.default_rng(0), double)
    g = _load(tmp_path, model)
    signs = [n for n in g.nodes if n.kind == "activation"]
    assert [n.op.name for n in signs] == ["sign"] * (2 if double else 1)  # weights folded
    dense = [n.op for n in g.nodes if isinstance(n.op, Dense)]
    assert all(set(np.unique(d.W)) <= {-1.0, 1.0} for d in dense)
    rng = np.random.default_rng(1)
    for x in rng.normal(0, 1, (20, 6)):
        np.testing.assert_allclose(g.forward(x), onnx_outputs(model, x, [(1, 6)]), rtol=0,
                                   atol=1e-5)


def test_crown_bounds_sound_on_sampled_points_and_boxes_touching_zero(tmp_path):
    g = _load(tmp_path, _binarised(np.random.default_rng(2), True, first_sign=True))
    rng = np.random.default_rng(3)
    for trial in range(30):
        a = rng.uniform(-1, 1, 6)
        lo, hi = a - rng.uniform(0, 0.6, 6), a + rng.uniform(0, 0.6, 6)
        lo[trial % 6], hi[(trial + 1) % 6] = 0.0, 0.0  # the first Sign's intervals end at 0
        lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
        blo, bhi = graph_bounds(g, *Box(lo, hi).args())
        xs = rng.uniform(lo, hi, (2000, 6))
        xs[:500] = np.where(rng.random((500, 6)) < 0.5, lo, hi)
        xs[500:700, trial % 6] = 0.0
        y = g.forward(xs)
        assert np.all(y >= blo) and np.all(y <= bhi), trial


def _threshold_net(tmp_path, double):
    """y0 = s(x0 - 0.5) + s(x1 - 0.3), y1 = 1.5 with s = sign, or Larq's sign(sign(.) + 0.1):
    y0 >= y1 exactly on x0 > 0.5, x1 > 0.3 (s = sign) / x0 >= 0.5, x1 >= 0.3."""
    g = G(np.random.default_rng(0))
    h = g.op("Add", ["x", g.const([[-0.5, -0.3]])])
    h = g.op("Sign", [h])
    if double:
        h = g.op("Sign", [g.op("Add", [h, g.const([[0.1, 0.1]])])])
    y = g.op("Add", [g.op("MatMul", [h, g.const([[1.0, 0.0], [1.0, 0.0]])]),
                     g.const([[0.0, 1.5]])])
    return _load(tmp_path, g.model([("x", (1, 2))], [y]), f"t{int(double)}.onnx")


@pytest.mark.parametrize("double", [False, True])
def test_attack_finds_the_counterexample_by_the_surrogate_gradient(tmp_path, double):
    g = _threshold_net(tmp_path, double)
    lo, hi = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
    A, b = np.array([[-1.0, 1.0]]), np.zeros(1)  # y1 - y0 <= 0
    # one start, the centre (0, 0), outside the unsafe corner: only a descent reaches it
    found = graph_counterexample(g, lo, hi, [(A, b)], restarts=1, steps=20)
    assert found is not None
    x = found[1]
    assert x[0] > 0.5 and x[1] > 0.3


def _one_layer(W, b):
    m, n = W.shape
    nodes = [Node("x", InputOp(0, 0, n), (), (1, n)),
             Node("d", Dense(W, b), (0,), (1, m)),
             Node("s", ActivationOp("sign"), (1,), (1, m)),
             Node("o", Dense(np.ones((1, m)), None), (2,), (1, 1))]
    return Graph(nodes, 3)


def test_a_sign_input_within_rounding_of_zero_is_refused():
    """z = 0.1 x - 0.03 at x = 0.3: float64 gives 0, while the exact value with these
    binary coefficients is not 0 (refused); far from 0 it is decided."""
    g = _one_layer(np.array([[0.1]]), np.array([-0.03]))
    X = np.array([[0.3], [0.5], [0.2]])
    _, vals = g.forward(X, return_all=True)
    assert abs(vals[1][0, 0]) < 1e-15
    assert Fraction(0.1) * Fraction(0.3) - Fraction(0.03) != 0
    assert list(decided(g, vals)) == [False, True, True]
    Y = decided_outputs(g, X)
    assert np.isnan(Y[0]).all() and np.isfinite(Y[1:]).all()


def test_integer_layers_are_exact_zero_included():
    """Integer coefficients on integer inputs (a binarised layer on -1/+1 values) sum exactly:
    a Sign input of exactly 0 is decided (sign 0); the same 0 from non-integer inputs is not
    proven exact and is refused; a second integer layer after a Sign is exact again."""
    g = _one_layer(np.array([[1.0, -1.0], [1.0, 1.0]]), np.array([0.0, 1.0]))
    X = np.array([[7.0, 7.0], [7.5, 7.5], [-3.0, 2.0]])
    _, vals = g.forward(X, return_all=True)
    assert list(decided(g, vals)) == [True, False, True]
    nodes = list(g.nodes[:3]) + [Node("d2", Dense(np.array([[1.0, -1.0]]), None), (2,), (1, 1)),
                                 Node("s2", ActivationOp("sign"), (3,), (1, 1))]
    g2 = Graph(nodes, 4)
    X = np.array([[2.0, 1.0]])  # sign(1) - sign(3) = 0 exactly
    _, vals = g2.forward(X, return_all=True)
    assert vals[3][0, 0] == 0.0 and decided(g2, vals)[0]


def test_softmax_output_takes_pairwise_properties_only(tmp_path):
    from crown_cli.io.vnnlib import parse_vnnlib_text

    g = G(np.random.default_rng(0))
    h = g.op("Sign", [g.op("MatMul", ["x", g.rand(2, 3)])])
    y = g.op("Softmax", [g.op("MatMul", [h, g.rand(3, 3)])], axis=-1)
    graph = _load(tmp_path, g.model([("x", (1, 2))], [y]), "sm.onnx")
    assert graph.vector_output is not None
    head = "(declare-const X_0 Real)(declare-const X_1 Real)" + "".join(
        f"(declare-const Y_{i} Real)" for i in range(3)) + \
        "(assert (>= X_0 0))(assert (<= X_0 1))(assert (>= X_1 0))(assert (<= X_1 1))"
    order_only(graph, parse_vnnlib_text(head + "(assert (>= Y_1 Y_0))", n_inputs=2, n_outputs=3))
    with pytest.raises(InputError, match="comparing two outputs"):
        order_only(graph, parse_vnnlib_text(head + "(assert (>= Y_1 0.5))", n_inputs=2,
                                            n_outputs=3))


# ONNX Floor of data (VNN-COMP 2024 ml4acopf's range reduction): a jump at every integer, the
# same checks as Sign's
FLOOR_ENDS = [-1e20, -7.5, -3.0, -2.0 - 1e-12, -1.0, -0.5, -TINY, 0.0, 1e-300, 0.3, 1.0 - 1e-16,
              1.0, 1.5, 2.0, 4.999999, 1e6 + 0.5, 2.0 ** 53, 1e20]


@pytest.mark.parametrize("lo_end", FLOOR_ENDS)
def test_floor_relaxation_sound_in_exact_arithmetic(lo_end):
    """Every line checked against floor in rationals at the interval's ends and on both sides
    of every integer inside (where floor(t) - k t has its extremes), for every pair of ends."""
    from crown_cli.engine.relaxations.floor import floor_relaxation

    u = np.array([e for e in FLOOR_ENDS if e >= lo_end])
    l = np.full(u.size, lo_end)
    aU, bU, aL, bL = floor_relaxation(l, u)
    for i in range(u.size):
        lo, hi = Fraction(float(l[i])), Fraction(float(u[i]))
        pts = [lo, hi]
        n0, n1 = math.floor(lo), math.floor(hi)
        for n in {n0 + 1, n1, n0 + 2, n1 - 1}:  # the extreme steps (floor(t) - k t is
            if lo < n <= hi:                   # monotone in the step's number between them)
                pts += [Fraction(n), Fraction(n) - Fraction(1, 10**30)]
        for t in pts:
            if lo <= t <= hi:
                f = math.floor(t)
                assert Fraction(float(aL[i])) * t + Fraction(float(bL[i])) <= f, (l[i], u[i], t)
                assert f <= Fraction(float(aU[i])) * t + Fraction(float(bU[i])), (l[i], u[i], t)
        if n0 == n1:  # no jump inside: the constant itself
            assert aU[i] == aL[i] == 0.0 and bU[i] == bL[i] == n0
        else:  # across jumps: z - 1 and z, moved out by rounding only
            assert aU[i] == aL[i] == 1.0
            assert 0.0 <= bU[i] <= 1e-13 * (1 + abs(float(hi)) + abs(float(lo)))
            assert 0.0 <= -1.0 - bL[i] <= 1e-13 * (1 + abs(float(hi)) + abs(float(lo)))


def test_a_floor_input_within_rounding_of_an_integer_is_refused():
    """z = 3 x at x = float(1/3): float64 rounds the product to exactly 1.0 (floor 1), the exact
    value is below 1 (floor 0): refused; z = 3 x at 0.5 (1.5, far from an integer) and at the
    integer 2.0 (exact: an integer coefficient on an integer input) are decided."""
    nodes = [Node("x", InputOp(0, 0, 1), (), (1, 1)),
             Node("d", Dense(np.array([[3.0]]), None), (0,), (1, 1)),
             Node("f", ActivationOp("floor"), (1,), (1, 1))]
    g = Graph(nodes, 2)
    X = np.array([[1.0 / 3.0], [0.5], [2.0]])
    _, vals = g.forward(X, return_all=True)
    assert vals[1][0, 0] == 1.0 and Fraction(3) * Fraction(1.0 / 3.0) < 1
    assert list(decided(g, vals)) == [False, True, True]
    Y = decided_outputs(g, X)
    assert np.isnan(Y[0]).all() and list(Y[1:, 0]) == [1.0, 6.0]
