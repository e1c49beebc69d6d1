"""Counterexample search inside a box for VNN-LIB cases: found points are real, proved-safe cases
yield nothing, the check refuses points outside the box."""
import os
import time
import warnings

import numpy as np
import onnx
import pytest

from conftest import random_network
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.input_sets import Box
from crown_cli.activations import forward
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.verification.attack import check_counterexample, find_counterexample


def box_and_net(seed, act="relu", sizes=(5, 24, 24, 4)):
    ws, bs = random_network(list(sizes), seed)
    rng = np.random.default_rng(100 + seed)
    lo = rng.normal(size=sizes[0])
    hi = lo + rng.uniform(0.2, 1.0, size=sizes[0])
    return ws, bs, lo, hi, rng


@pytest.mark.parametrize("act", ["relu", "tanh", "leaky_relu"])
@pytest.mark.parametrize("seed", range(4))
def test_finds_counterexample_of_a_sat_case(act, seed):
    ws, bs, lo, hi, rng = box_and_net(seed, act)
    x_star = lo + rng.uniform(size=lo.size) * (hi - lo)
    A = rng.normal(size=(2, 4))
    b = A @ forward(ws, bs, act, x_star) + 1e-3  # x_star satisfies both rows, barely
    x = find_counterexample(ws, bs, act, None, lo, hi, A, b, seed=seed)
    assert x is not None
    assert np.all(lo <= x) and np.all(x <= hi)
    assert np.all(A @ forward(ws, bs, act, x) <= b)
    assert check_counterexample(ws, bs, act, None, lo, hi, A, b, x)


@pytest.mark.parametrize("seed", range(4))
def test_beats_random_sampling(seed):
    """A single row whose b lies below the minimum over 2000 random points of the box."""
    ws, bs, lo, hi, rng = box_and_net(seed)
    A = np.array([[1.0, -1.0, 0.0, 0.0]])
    X = lo + rng.uniform(size=(2000, lo.size)) * (hi - lo)
    sampled = (forward(ws, bs, "relu", X) @ A.T).min()
    b = np.array([sampled - 1e-3])
    x = find_counterexample(ws, bs, "relu", None, lo, hi, A, b, seed=seed)
    assert x is not None and check_counterexample(ws, bs, "relu", None, lo, hi, A, b, x)
    assert (A @ forward(ws, bs, "relu", x))[0] < sampled


@pytest.mark.parametrize("act", ["relu", "tanh"])
@pytest.mark.parametrize("seed", range(4))
def test_no_counterexample_below_a_crown_lower_bound(act, seed):
    ws, bs, lo, hi, rng = box_and_net(seed, act)
    A = rng.normal(size=(3, 4))
    box = Box(lo, hi)
    lb = crown.margin_lower_bound(crown.Network(ws, bs), *box.args(), get_relaxation(act, "crown"), A)
    # any single row below its lower bound is unsatisfiable; check one row at a time too
    b = lb - 1e-3
    assert find_counterexample(ws, bs, act, None, lo, hi, A, b, seed=seed) is None
    for i in range(3):
        assert find_counterexample(ws, bs, act, None, lo, hi, A[i:i + 1], b[i:i + 1],
                                   seed=seed) is None
    # and the same search does find points once the bound is loosened well past the values
    X = lo + rng.uniform(size=(200, lo.size)) * (hi - lo)
    top = (forward(ws, bs, act, X) @ A.T).max(axis=0)
    x = find_counterexample(ws, bs, act, None, lo, hi, A, top + 1.0, seed=seed)
    assert x is not None and check_counterexample(ws, bs, act, None, lo, hi, A, top + 1.0, x)


def test_check_refuses_points_outside_the_box_and_non_violations():
    ws, bs, lo, hi, rng = box_and_net(0)
    A = np.array([[1.0, 0.0, 0.0, 0.0]])
    mid = 0.5 * (lo + hi)
    b = A @ forward(ws, bs, "relu", mid) + 10.0  # loose: every point near the box satisfies it
    assert check_counterexample(ws, bs, "relu", None, lo, hi, A, b, mid)
    assert check_counterexample(ws, bs, "relu", None, lo, hi, A, b, lo)
    assert check_counterexample(ws, bs, "relu", None, lo, hi, A, b, hi)
    for i in range(lo.size):
        below, above = mid.copy(), mid.copy()
        below[i] = np.nextafter(lo[i], -np.inf)
        above[i] = np.nextafter(hi[i], np.inf)
        assert not check_counterexample(ws, bs, "relu", None, lo, hi, A, b, below)
        assert not check_counterexample(ws, bs, "relu", None, lo, hi, A, b, above)
    bad = mid.copy()
    bad[0] = np.nan
    assert not check_counterexample(ws, bs, "relu", None, lo, hi, A, b, bad)
    assert not check_counterexample(ws, bs, "relu", None, lo, hi, A, b, mid[:-1])
    # inside the box but not a violation: b just below the value at mid
    tight = A @ forward(ws, bs, "relu", mid) - 1e-9
    assert not check_counterexample(ws, bs, "relu", None, lo, hi, A, tight, mid)


def test_degenerate_coordinates_and_no_output_rows():
    ws, bs, lo, hi, rng = box_and_net(1)
    hi[[0, 2]] = lo[[0, 2]]  # fixed inputs
    x_star = lo + rng.uniform(size=lo.size) * (hi - lo)
    A = np.array([[0.0, 1.0, -1.0, 0.0]])
    b = A @ forward(ws, bs, "relu", x_star) + 1e-4
    x = find_counterexample(ws, bs, "relu", None, lo, hi, A, b, seed=3)
    assert x is not None and x[0] == lo[0] and x[2] == lo[2]
    assert check_counterexample(ws, bs, "relu", None, lo, hi, A, b, x)
    # no output constraint: any point of the box is a counterexample
    x = find_counterexample(ws, bs, "relu", None, lo, hi, np.zeros((0, 4)), np.zeros(0))
    assert x is not None and np.all(lo <= x) and np.all(x <= hi)


def test_deterministic_and_deadline():
    ws, bs, lo, hi, rng = box_and_net(2, sizes=(8, 64, 64, 4))
    x_star = lo + rng.uniform(size=lo.size) * (hi - lo)
    A = rng.normal(size=(1, 4))
    b = A @ forward(ws, bs, "relu", x_star) + 1e-3
    x1 = find_counterexample(ws, bs, "relu", None, lo, hi, A, b, seed=5)
    x2 = find_counterexample(ws, bs, "relu", None, lo, hi, A, b, seed=5)
    assert x1 is not None and np.array_equal(x1, x2)
    # an unsatisfiable case with a huge step budget stops at the deadline
    t = time.monotonic()
    out = find_counterexample(ws, bs, "relu", None, lo, hi, A, b - 1e6, steps=10 ** 7,
                              deadline=t + 0.3)
    assert out is None and time.monotonic() - t < 3.0


def test_conjunctions_of_four_rows_need_the_descent():
    """4-row conjunctions satisfied (with 1e-3 to spare) at a random point of the box: the random
    starts alone find about half, the descent on the largest row nearly all (seeded: 14 vs 27
    of 30 when written)."""
    found = {0: 0, 50: 0}
    for seed in range(30):
        ws, bs = random_network([6, 32, 32, 5], seed)
        rng = np.random.default_rng(seed)
        lo = rng.normal(size=6)
        hi = lo + 1.0
        x_star = lo + rng.uniform(size=6) * (hi - lo)
        A = rng.normal(size=(4, 5))
        b = A @ forward(ws, bs, "relu", x_star) + 1e-3
        for steps in found:
            x = find_counterexample(ws, bs, "relu", None, lo, hi, A, b, steps=steps, seed=seed)
            if x is not None:
                assert check_counterexample(ws, bs, "relu", None, lo, hi, A, b, x)
                found[steps] += 1
    assert found[50] >= 24 and found[50] >= found[0] + 8, found


def _dead_neuron_net(d=20):
    """y0 = 1, y1 = 10 relu(sum(x) - (d - 0.5)) on [0, 1]^d: the hidden neuron is off except
    near the all-ones corner, so the true gradient of y0 - y1 is 0 at every start."""
    w1 = np.vstack([np.ones((1, d)), np.zeros((1, d))])
    b1 = np.array([-(d - 0.5), 1.0])
    w2 = np.array([[0.0, 1.0], [10.0, 0.0]])
    b2 = np.zeros(2)
    # the second hidden neuron is relu(1) = 1, a constant carrying y0's 1
    return [w1, w2], [b1, b2], np.zeros(d), np.ones(d)


@pytest.mark.parametrize("seed", range(3))
def test_surrogate_slopes_reach_a_violation_behind_a_dead_neuron(monkeypatch, seed):
    import crown_cli.verification.attack as va

    ws, bs, lo, hi = _dead_neuron_net()
    A, b = np.array([[1.0, -1.0]]), np.zeros(1)  # unsafe: y0 - y1 <= 0
    x = find_counterexample(ws, bs, "relu", None, lo, hi, A, b, restarts=16, steps=50,
                            seed=seed)
    assert x is not None and check_counterexample(ws, bs, "relu", None, lo, hi, A, b, x)
    # with the true gradient alone no start moves: the attack finds nothing
    monkeypatch.setattr(va, "SURROGATE_LEAKS", (0.0,))
    assert find_counterexample(ws, bs, "relu", None, lo, hi, A, b, restarts=16, steps=50,
                               seed=seed) is None


def _identity_relu_models(tmp_path):
    """y = relu(x) on one input: as a Gemm-Relu-Gemm chain (lowered to the dense engine) and
    as a graph with a branch, relu(x) + (0.5 x - 0.5 x) (the graph engine)."""
    from graph_models import G

    paths = []
    for name in ("chain", "branch"):
        g = G(np.random.default_rng(0))
        if name == "chain":
            h = g.op("Gemm", ["x", g.const([[1.0]]), g.const([0.0])], transB=1)
            y = g.op("Gemm", [g.op("Relu", [h]), g.const([[1.0]]), g.const([0.0])], transB=1)
        else:
            a = g.op("Mul", ["x", g.const([0.5])])
            y = g.op("Add", [g.op("Relu", ["x"]), g.op("Sub", [a, a])])
        path = os.path.join(str(tmp_path), f"{name}.onnx")
        onnx.save(g.model([("x", (1, 1))], [y]), path)
        paths.append(path)
    return paths


def test_sat_points_lie_in_the_exact_decimal_box(tmp_path):
    """The searches run on the box widened by one ulp where a VNN-LIB bound is inexact; a
    ``sat`` point must lie in the real box (and meet the exact right-hand side). y = relu(x),
    x in [0.1, 0.3]: ``Y_0 <= 0.09999999999999999`` holds for every real x there (y >= 0.1),
    though the widened box's lower corner (the float below 0.1) violates it; ``Y_0 <= 0.2``
    is violated, and the point reported is inside [0.1, 0.3] exactly."""
    from fractions import Fraction

    import crown_cli
    from crown_cli.graph.lower import lowered
    from crown_cli.graph.onnx_graph import load_graph

    head = "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n" \
           "(assert (>= X_0 0.1))\n(assert (<= X_0 0.3))\n"
    holds = os.path.join(str(tmp_path), "holds.vnnlib")
    with open(holds, "w") as fh:
        fh.write(head + "(assert (<= Y_0 0.09999999999999999))\n")
    violated = os.path.join(str(tmp_path), "violated.vnnlib")
    with open(violated, "w") as fh:
        fh.write(head + "(assert (<= Y_0 0.2))\n")
    chain, branch = _identity_relu_models(tmp_path)
    assert lowered(load_graph(chain)) is not None and lowered(load_graph(branch)) is None
    for path in (chain, branch):
        v = crown_cli.verify(path, holds, timeout=5, workers=1)
        assert v.result in ("unsat", "unknown", "timeout"), (path, v.result, v.x)
        v = crown_cli.verify(path, violated, timeout=5, workers=1)
        assert v.result == "sat", (path, v.result)
        assert Fraction("0.1") <= Fraction(float(v.x[0])) <= Fraction("0.3")
        assert Fraction(float(v.y[0])) <= Fraction("0.2")


def test_sat_at_a_decimal_no_float_holds_is_confirmed_exactly(tmp_path):
    """X_0 pinned to 0.1, which no float holds: no float point lies in the property's set, so
    a sat needs the exact point. y = relu(x): ``Y_0 <= 0.2`` is violated at x = 0.1 exactly
    (sat, and the result file writes X_0 as the decimal 0.1); ``Y_0 >= 0.10000000000000000001``
    is not (relu(0.1) = 0.1 is below it), though the float nearest 0.1 (0.1000000000000000055...)
    would violate it: no sat. Checked on the lowered chain and on the graph."""
    from fractions import Fraction

    import crown_cli
    from crown_cli.verification.outcome import format_result

    head = "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n" \
           "(assert (>= X_0 0.1))\n(assert (<= X_0 0.1))\n"
    specs = {}
    for name, out in (("violated", "(assert (<= Y_0 0.2))"),
                      ("holds", "(assert (>= Y_0 0.10000000000000000001))")):
        specs[name] = os.path.join(str(tmp_path), f"{name}.vnnlib")
        with open(specs[name], "w") as fh:
            fh.write(head + out + "\n")
    assert Fraction(0.1) >= Fraction("0.10000000000000000001")  # the float would violate
    for path in _identity_relu_models(tmp_path):
        v = crown_cli.verify(path, specs["violated"], timeout=5, workers=1)
        assert v.result == "sat", (path, v.result, v.note)
        assert v.exact == {0: Fraction("0.1")}
        text = format_result(v)
        assert "(X_0 0.1)" in text, text
        x = Fraction(text.split("(X_0 ")[1].split(")")[0])
        assert max(x, Fraction(0)) <= Fraction("0.2")  # relu(x*) in exact arithmetic
        v = crown_cli.verify(path, specs["holds"], timeout=5, workers=1)
        assert v.result != "sat", (path, v.result, v.x)


def test_the_search_is_quiet_and_keeps_going_where_its_float32_passes_overflow():
    # outputs (x1, exp(x0)) with x0 in [90, 100]: float32's exp is inf there, and the input
    # gradient of the first output meets 0 * inf (NaN). The search must neither warn nor
    # step to a NaN point (which no check accepts): it finds x1 <= -0.9 as on any network
    from crown_cli.verification.attack import descend
    from crown_cli.verification.outcome import violations_of

    lo, hi = np.array([90.0, -1.0]), np.array([100.0, 1.0])

    def passes(X):
        z = X.astype(np.float32)
        return np.stack([z[:, 1], np.exp(z[:, 0])], axis=1), z

    def gradient(z, j, leaks):  # the row (1, 0) through the exp branch: 0 * exp(x0) = NaN
        return np.stack([np.float32(0.0) * np.exp(z[:, 0]), np.ones_like(z[:, 0])], axis=1)

    def check(X, A_j, b_j):
        return violations_of(lambda Z: np.stack([Z[:, 1], np.exp(Z[:, 0])], axis=1),
                             lo, hi, A_j, b_j, X)

    case = (lo, hi, np.array([[1.0, 0.0]]), np.array([-0.9]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = descend(passes, gradient, check, [case], restarts=4, steps=20, seed=0,
                        deadline=None, surrogate=False)
    assert found is not None
    j, x = found
    assert j == 0 and 90.0 <= x[0] <= 100.0 and x[1] <= -0.9
