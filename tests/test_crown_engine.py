"""The numba CROWN engine: hand-computed examples and agreement with the numpy twin."""
import numpy as np
import pytest

from conftest import random_network
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.input_sets import NORMS
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.engine.relaxations.relu import relu_relaxation
from reference_crown import reference_bounds, relu_relaxation_numpy

CODES = NORMS


def engine_bounds(weights, biases, x0, eps, norm, method, C):
    net = crown.Network(weights, biases)
    fn = get_relaxation("relu", method)
    hidden, _ = crown.hidden_layer_bounds(net, x0, eps, CODES[norm], fn)
    lb = crown.margin_lower_bound(net, x0, eps, CODES[norm], fn, C)
    return hidden, lb


def close(a, b, rel=1e-8):
    """Equal up to rounding and the engine's floating-point widening (~2e-10 relative)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.allclose(a, b, rtol=rel, atol=rel * max(1.0, np.abs(b).max()))


# ----------------------------------------------------------------------------- by hand


def test_one_layer_margin_is_exact_by_hand():
    # margin = (2 x1 - x2 + 0.5) - (x2) = 2 x1 - 2 x2 + 0.5; at x0 = (1, 0.5) it is 1.5
    W = [np.array([[2.0, -1.0], [0.0, 1.0]])]
    b = [np.array([0.5, 0.0])]
    x0 = np.array([1.0, 0.5])
    C = np.array([[1.0, -1.0]])
    for norm, dual in (("inf", 4.0), ("2", np.sqrt(8.0)), ("1", 2.0)):
        _, lb = engine_bounds(W, b, x0, 0.1, norm, "crown", C)
        assert lb[0] == pytest.approx(1.5 - 0.1 * dual, rel=1e-9)
        assert lb[0] <= 1.5 - 0.1 * dual  # widened outward, never inward


def _two_layer():
    # z1 = x1 - x2 in [-1.5, 2.5], z2 = x1 + x2 in [-0.5, 3.5] at x0 = (1, .5), eps = 1 (l_inf);
    # margin = relu(z1) - relu(z2)
    W = [np.array([[1.0, -1.0], [1.0, 1.0]]), np.array([[1.0, -1.0], [0.0, 0.0]])]
    b = [np.zeros(2), np.zeros(2)]
    return W, b, np.array([1.0, 0.5]), np.array([[1.0, -1.0]])


def test_two_layer_by_hand_crown():
    W, b, x0, C = _two_layer()
    hidden, lb = engine_bounds(W, b, x0, 1.0, "inf", "crown", C)
    assert close(hidden[0][0], [-1.5, -0.5]) and close(hidden[0][1], [2.5, 3.5])
    # lower: relu(z1) >= z1 (u=2.5 >= 1.5), relu(z2) <= 0.875 z2 + 0.4375
    #   => 0.125 x1 - 1.875 x2 - 0.4375 >= -1.25 - 1 * (0.125 + 1.875) = -3.25
    assert lb[0] == pytest.approx(-3.25, rel=1e-9)


def test_two_layer_by_hand_fast_lin():
    W, b, x0, C = _two_layer()
    _, lb = engine_bounds(W, b, x0, 1.0, "inf", "fast-lin", C)
    # relu(z1) >= 0.625 z1  =>  -0.25 x1 - 1.5 x2 - 0.4375 >= -1.4375 - 1.75 = -3.1875
    assert lb[0] == pytest.approx(-3.1875, rel=1e-9)


def test_two_layer_by_hand_as_hidden_layer():
    # the same function as the pre-activation of a second hidden layer: upper bound by hand:
    # relu(z1) <= 0.625 z1 + 0.9375, relu(z2) >= z2  =>  -0.375 x1 - 1.625 x2 + 0.9375 <= 1.75
    W, b, x0, _ = _two_layer()
    W = [W[0], np.array([[1.0, -1.0]]), np.array([[1.0], [-1.0]])]
    b = [b[0], np.zeros(1), np.zeros(2)]
    hidden, _ = engine_bounds(W, b, x0, 1.0, "inf", "crown", np.array([[1.0, -1.0]]))
    assert hidden[1][0][0] == pytest.approx(-3.25, rel=1e-9)
    assert hidden[1][1][0] == pytest.approx(1.75, rel=1e-9)


def test_eps_zero_is_the_exact_margin():
    W, b = random_network([12, 9, 7, 4], seed=3)
    x0 = np.random.default_rng(0).uniform(-0.5, 0.5, 12)
    C = np.array([[1.0, 0, -1.0, 0]])
    _, lb = engine_bounds(W, b, x0, 0.0, "inf", "crown", C)
    from crown_cli.activations import forward

    z = forward(W, b, "relu", x0)
    assert lb[0] == pytest.approx(z[0] - z[2], rel=1e-9, abs=1e-12)


# ----------------------------------------------------------------------------- relaxation


@pytest.mark.parametrize("adaptive", [True, False])
def test_relu_relaxation_encloses_relu_on_grid(adaptive):
    rng = np.random.default_rng(7)
    l = np.concatenate([rng.normal(size=200) * 3, [-1e-300, 0.0, -2.0, 1.0, -5.0, 0.0]])
    u = np.concatenate([l[:200] + np.abs(rng.normal(size=200)) * 3, [1e-300, 0.0, 2.0, 1.0, 0.0, 3.0]])
    aU, bU, aL, bL = relu_relaxation(l, u, adaptive)
    for i in range(l.size):
        z = np.linspace(l[i], u[i], 101)
        r = np.maximum(z, 0)
        slack = 1e-12 * (1 + np.abs(z))
        assert np.all(aL[i] * z + bL[i] <= r + slack)
        assert np.all(aU[i] * z + bU[i] >= r - slack)
    ref = relu_relaxation_numpy(l, u, "crown" if adaptive else "fast-lin")
    for mine, theirs in zip((aU, bU, aL, bL), ref):
        assert np.allclose(mine, theirs, rtol=1e-12, atol=1e-300)  # relu.py adds ulps of slack


# ----------------------------------------------------------------------------- numba vs numpy

CASES = [
    ([5, 3], 0), ([6, 8, 3], 1), ([10, 16, 16, 4], 2), ([8, 12, 12, 12, 3], 3),
    ([20, 30, 10, 25, 8, 5], 4), ([784, 64, 48, 10], 5),
]


@pytest.mark.parametrize("sizes,seed", CASES)
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
@pytest.mark.parametrize("method", ["crown", "fast-lin"])
def test_engine_matches_numpy_twin(sizes, seed, norm, method):
    W, b = random_network(sizes, seed)
    rng = np.random.default_rng(seed + 100)
    x0 = rng.uniform(-0.5, 0.5, sizes[0])
    k = sizes[-1]
    C = np.zeros((k - 1, k))
    C[:, 0] = 1.0
    C[np.arange(k - 1), np.arange(1, k)] = -1.0
    scale = {"inf": 0.02, "2": 0.3, "1": 1.0}[norm]
    for eps in (0.25 * scale, scale, 4 * scale):
        hidden, lb = engine_bounds(W, b, x0, eps, norm, method, C)
        ref = reference_bounds(W, b, x0, eps, norm, method, C)
        for (l, u), (rl, ru) in zip(hidden, ref[:-1]):
            assert close(l, rl) and close(u, ru)
            assert np.all(l <= rl) and np.all(u >= ru)  # widening goes outward
        assert close(lb, ref[-1][0])
        assert np.all(lb <= ref[-1][0])


def test_network_without_hidden_layers():
    W, b = random_network([6, 3], seed=9)
    x0 = np.zeros(6)
    C = np.array([[1.0, -1.0, 0.0]])
    _, lb = engine_bounds(W, b, x0, 0.1, "2", "crown", C)
    ref = reference_bounds(W, b, x0, 0.1, "2", "crown", C)
    assert close(lb, ref[-1][0])


@pytest.mark.parametrize("sizes,seed,eps", [([10, 16, 16, 4], 2, 0.02), ([8, 12, 12, 12, 3], 3, 0.02),
                                            ([784, 64, 48, 10], 5, 0.003)])
def test_bounds_from_a_larger_ball_give_the_same_result(sizes, seed, eps):
    """Stable neurons taken from a larger radius instead of recomputed: same margin bound."""
    W, b = random_network(sizes, seed)
    x0 = np.random.default_rng(seed).uniform(-0.5, 0.5, sizes[0])
    net = crown.Network(W, b)
    fn = get_relaxation("relu", "crown")
    C = np.array([[1.0, -1.0] + [0.0] * (sizes[-1] - 2)])
    from crown_cli.engine.relaxations import get_interval_free

    stable = get_interval_free("relu")
    _, big = crown.margin_lower_bound(net, x0, 1.5 * eps, 0, fn, C, return_bounds=True)
    known = [(stable(l, u), l, u) for l, u in big]
    assert any(k[0].any() for k in known[1:])  # the shortcut is actually exercised
    plain, pb = crown.margin_lower_bound(net, x0, eps, 0, fn, C, return_bounds=True)
    fast, fb = crown.margin_lower_bound(net, x0, eps, 0, fn, C, known=known, return_bounds=True)
    for (l, u), (fl, fu), (m, _, _) in zip(pb, fb, known):
        # recomputed rows: the same chains, only their float64 rounding charge differs (it
        # uses the intervals of the taken-over neurons, the larger ball's); taken-over rows
        # keep the larger ball's (valid) bounds
        assert close(l[~m], fl[~m], 1e-12) and close(u[~m], fu[~m], 1e-12)
        assert np.all(fl[~m] <= l[~m]) and np.all(fu[~m] >= u[~m])  # wider intervals: more
        assert np.array_equal(stable(l, u) & m, m)  # same stability verdict as recomputing
    assert fast[0] == pytest.approx(plain[0], rel=1e-12, abs=1e-12)


def test_float32_estimate_is_close_to_float64():
    W, b = random_network([784, 64, 48, 10], 5)
    x0 = np.random.default_rng(0).uniform(-0.5, 0.5, 784)
    net = crown.Network(W, b)
    fn = get_relaxation("relu", "crown")
    C = np.array([[1.0, -1.0] + [0.0] * 8])
    lb64 = crown.margin_lower_bound(net, x0, 0.01, 0, fn, C)
    lb32 = crown.margin_lower_bound(net, x0, 0.01, 0, fn, C, dtype=np.float32)
    assert lb32[0] == pytest.approx(lb64[0], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("activation", ["tanh", "sigmoid", "arctan", "leaky_relu", "elu", "softplus",
                                        "hard_sigmoid"])
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_engine_matches_numpy_twin_for_general_activations(activation, norm):
    from crown_cli.activations import default_alpha

    W, b = random_network([10, 16, 12, 9, 4], 8)
    x0 = np.random.default_rng(8).uniform(-0.5, 0.5, 10)
    relax = get_relaxation(activation, "crown", default_alpha(activation))
    net = crown.Network(W, b)
    C = np.array([[1.0, -1.0, 0.0, 0.0], [1.0, 0.0, 0.0, -1.0]])
    q = CODES[norm]
    for eps in (0.01, 0.1, 0.5):
        hidden, _ = crown.hidden_layer_bounds(net, x0, eps, q, relax)
        lb = crown.margin_lower_bound(net, x0, eps, q, relax, C)
        ref = reference_bounds(W, b, x0, eps, norm, C=C, relaxation=relax)
        for (l, u), (rl, ru) in zip(hidden, ref[:-1]):
            assert close(l, rl) and close(u, ru)
        assert close(lb, ref[-1][0]) and np.all(lb <= ref[-1][0])


@pytest.mark.parametrize("sizes,seed,eps", [([10, 16, 16, 4], 2, 0.05), ([784, 64, 48, 10], 5, 0.004)])
@pytest.mark.parametrize("wrong", [0.0, 0.3])
def test_sign_hints_compute_one_side_and_keep_the_margin_bound(sizes, seed, eps, wrong):
    """Rows hinted active/inactive get one chain; wrong hints fall back to both chains."""
    W, b = random_network(sizes, seed)
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(-0.5, 0.5, sizes[0])
    net = crown.Network(W, b)
    fn = get_relaxation("relu", "crown")
    C = np.array([[1.0, -1.0] + [0.0] * (sizes[-1] - 2)])
    plain, pb = crown.margin_lower_bound(net, x0, eps, 0, fn, C, return_bounds=True)
    calls = []

    def known(k, bounds):
        l, u = pb[k]
        sign = np.where(l > 0, 1, np.where(u < 0, -1, 0)).astype(np.int8)
        flip = rng.random(sign.shape) < wrong
        sign[flip] = -sign[flip]  # wrong guesses, and unstable ones guessed stable
        sign[flip & (sign == 0)] = 1
        lo, hi = l - 1.0, u + 1.0  # any valid interval
        calls.append(sign)
        return np.zeros(l.shape, bool), l, u, (sign, lo, hi)

    fast, fb = crown.margin_lower_bound(net, x0, eps, 0, fn, C, known=known, return_bounds=True)
    assert fast[0] == pytest.approx(plain[0], rel=1e-12, abs=1e-12)
    for k in range(1, len(pb)):
        (l, u), (fl, fu), sign = pb[k], fb[k], calls[k - 1]
        act, ina = l > 0, u < 0
        # the same chains on other subsets of rows: equal up to the products' rounding
        assert close(fl[act], l[act], 1e-12) and close(fu[ina], u[ina], 1e-12)
        # a neuron hinted on its true side keeps only the interval on the other side
        assert np.all(fu[act & (sign > 0)] == u[act & (sign > 0)] + 1.0)
        unst = ~act & ~ina
        assert close(fl[unst], l[unst], 1e-12) and close(fu[unst], u[unst], 1e-12)
    assert any((s != 0).any() for s in calls)
