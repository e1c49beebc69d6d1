"""Float64 rounding of the CROWN engine against exact rational arithmetic (issue 12).

The oracle back-substitutes the engine's own relaxations (its slopes and intercepts, read as
exact rationals, lines chosen by the sign of the *exact* coefficients) in fractions.Fraction
and minimises/maximises the resulting linear function over the input set exactly. Wherever the
exact coefficients have the signs the engine's computed ones have, that is the value the
float64 computation approximates, so a rigorous float64 bound must lie on the outer side of
it. On networks whose neurons are all stable (proven by exact interval arithmetic) the oracle
is the exact range of the network itself.

The cancelling networks show why a posteriori charging is needed: their products W_{k+1} W_k
cancel (the last row is orthogonal to the columns of the network's linear map), so the
back-substituted coefficients are rounding noise of size u |D| |W|, far above 2**-32 times
the magnitude of the computed coefficients, which is all the old allowance charged.
"""
from fractions import Fraction as F

import numpy as np
import pytest

from conftest import random_network
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.input_sets import Box, NORMS, input_abs_bound
from crown_cli.engine.rounding import FP_RTOL, final_sum_rtol, rounding_weights
from crown_cli.engine.kernels import KERNELS, using_kernels
from crown_cli.activations import default_alpha
from crown_cli.engine.relaxations import get_relaxation

U64 = 2.0 ** -53


# ----------------------------------------------------------------------------- exact oracle

class InputSet:
    """An l_p ball (x0, eps, norm) or a box [lo, hi], with the engine's arguments and exact
    extremes of linear functions."""

    def __init__(self, x0, eps=None, norm=None, box=None):
        self.x0, self.eps, self.norm, self.box = x0, eps, norm, box
        if box is not None:
            self.lo = [F(float(v)) for v in box.lo]
            self.hi = [F(float(v)) for v in box.hi]
        else:
            self.fx0 = [F(float(v)) for v in x0]
            self.feps = F(float(eps))

    def args(self):
        if self.box is not None:
            return self.box.args()
        return self.x0, self.eps, NORMS[self.norm]

    def covers(self, value, coef, const, side):
        """Is the float ``value`` <= min (side -1) / >= max (side +1) of coef . x + const over
        the set, exactly?"""
        v = F(float(value))
        s = F(side)
        if self.box is not None:  # extreme per coordinate
            ext = sum((max(c * l, c * h) if side > 0 else min(c * l, c * h))
                      for c, l, h in zip(coef, self.lo, self.hi))
            return (v - const - ext) * s >= 0
        lin = sum(c * x for c, x in zip(coef, self.fx0)) + const
        gap = (v - lin) * s  # must be >= eps ||coef||_q
        if self.norm == "inf":
            return gap >= self.feps * sum(abs(c) for c in coef)
        if self.norm == "1":
            return gap >= self.feps * max((abs(c) for c in coef), default=F(0))
        return gap >= 0 and gap * gap >= self.feps ** 2 * sum(c * c for c in coef)

    def extreme(self, coef, const, side):
        """The extreme as a float (reporting only; l_2 through a float square root)."""
        if self.box is not None:
            return float(const + sum((max(c * l, c * h) if side > 0 else min(c * l, c * h))
                                     for c, l, h in zip(coef, self.lo, self.hi)))
        lin = sum(c * x for c, x in zip(coef, self.fx0)) + const
        q = {"inf": float(sum(abs(c) for c in coef)), "1": float(max(abs(c) for c in coef)),
             "2": float(sum(c * c for c in coef)) ** 0.5}[self.norm]
        return float(lin) + side * float(self.feps) * q


def exact_chain(net, relax, lam, const, side):
    """Exact back-substitution of the rows ``lam`` (list of lists of Fraction) through the
    engine's relaxations: per row the coefficients on x and the constant of a linear function
    below (side -1) / above (+1) ``lam . a_h + const`` wherever the relaxations hold."""
    Ws = [[[F(float(v)) for v in row] for row in w] for w in net.W]
    bs = [[F(float(v)) for v in b] for b in net.b]
    lines = [[(F(float(a)), F(float(c))) for a, c in zip(r.aU, r.bU)] for r in relax]
    lower = [[(F(float(a)), F(float(c))) for a, c in zip(r.aL, r.bL)] for r in relax]
    out = []
    for row, c0 in zip(lam, const):
        L, c = list(row), F(c0)
        for i in range(len(relax) - 1, -1, -1):
            new = [F(0)] * len(Ws[i][0])
            for j, v in enumerate(L):
                if v == 0:
                    continue
                upper_side = (v > 0) == (side > 0)
                a, t = lines[i][j] if upper_side else lower[i][j]
                d = v * a
                c += v * t + d * bs[i][j]
                if d:
                    for k, w in enumerate(Ws[i][j]):
                        new[k] += d * w
            L = new
        out.append((L, c))
    return out


def check_engine_against_exact(net, fn, S, C):
    """Every hidden bound and the margin bounds of the engine on the outer side of the exact
    value of its own relaxations (l_2: compared through squares)."""
    x0, eps, q = S.args()
    bounds, relax = crown.hidden_layer_bounds(net, x0, eps, q, fn)
    Ws = [[[F(float(v)) for v in row] for row in w] for w in net.W]
    for k, (l, u) in enumerate(bounds):
        for side, val in ((-1, l), (1, u)):
            rows = exact_chain(net, relax[:k], Ws[k], [F(float(v)) for v in net.b[k]], side)
            for j, (coef, c) in enumerate(rows):
                assert S.covers(val[j], coef, c, side), (k, j, side)
    lb = crown.margin_lower_bound(net, x0, eps, q, fn, C)
    Cf = [[F(float(v)) for v in row] for row in C]
    lam = [[sum(c * w for c, w in zip(crow, col)) for col in zip(*Ws[-1])] for crow in Cf]
    bl = [F(float(v)) for v in net.b[-1]]
    const = [sum(c * v for c, v in zip(crow, bl)) for crow in Cf]
    for j, (coef, c) in enumerate(exact_chain(net, relax, lam, const, -1)):
        assert S.covers(lb[j], coef, c, -1), ("margin", j)


def _sets(rng, d, eps):
    x0 = rng.uniform(-0.5, 0.5, d)
    lo = x0 - rng.uniform(0.0, 2 * eps, d)
    hi = x0 + rng.uniform(0.0, 2 * eps, d)
    return [InputSet(x0, eps, "inf"), InputSet(x0, 4 * eps, "2"), InputSet(x0, 8 * eps, "1"),
            InputSet(x0, box=Box(lo, hi))]


# ----------------------------------------------------------------------------- random networks

@pytest.mark.parametrize("kern", KERNELS)
@pytest.mark.parametrize("activation,method", [("relu", "crown"), ("relu", "fast-lin"),
                                               ("leaky_relu", "crown"), ("tanh", "crown")])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_networks_cover_the_exact_relaxation_bound(kern, activation, method, seed):
    rng = np.random.default_rng(100 + seed)
    sizes = [5, 6, 5, 4, 3]
    W, b = random_network(sizes, seed)
    net = crown.Network(W, b)
    C = rng.normal(size=(2, 3))  # general rows: C @ W[-1] rounds (product_rounding)
    with using_kernels(kern):
        fn = get_relaxation(activation, method, default_alpha(activation))
        for S in _sets(rng, sizes[0], 0.05):
            check_engine_against_exact(net, fn, S, C)


# ----------------------------------------------------------------------------- cancelling

def cancelling_network(seed, d=2, width=4, depth=4, scale=1e4):
    """All-active ReLU network on a ball around x0 > 0 whose last row cancels the product of
    the others: returns (weights, biases, x0, eps, w) with w (1, width) the cancelling row
    (also the network's last layer). Biases are 0, so the bound's constant terms are 0."""
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(0.5, 1.0, d)
    a, Ws, n_in = x0, [], d
    for _ in range(depth):
        W = np.empty((width, n_in))
        for j in range(width):  # rows with W a >= 0.3 |W| a (active with room to spare)
            while True:
                row = rng.uniform(-1.0, 1.0, n_in) * scale
                if abs(row @ a) >= 0.3 * (np.abs(row) @ a):
                    W[j] = row if row @ a > 0 else -row
                    break
        Ws.append(W)
        a, n_in = W @ a, width
    P = Ws[0]
    for W in Ws[1:]:
        P = W @ P
    w = np.linalg.svd(P)[0][:, -1][None, :] * scale  # orthogonal to P's columns
    return Ws + [w], [np.zeros(W.shape[0]) for W in Ws] + [np.zeros(1)], x0, 1e-3, w


def _exact_stable(net, S):
    """Exact interval arithmetic over the set: are all hidden neurons active?"""
    if S.box is not None:
        lo, hi = S.lo, S.hi
    else:
        r = S.feps  # |x_k - x0_k| <= eps on every l_p ball
        lo, hi = [x - r for x in S.fx0], [x + r for x in S.fx0]
    for W, b in zip(net.W[:-1], net.b[:-1]):
        nlo, nhi = [], []
        for row, bj in zip(W, b):
            rowf = [F(float(v)) for v in row]
            nlo.append(F(float(bj)) + sum(min(c * l, c * h) for c, l, h in zip(rowf, lo, hi)))
            nhi.append(F(float(bj)) + sum(max(c * l, c * h) for c, l, h in zip(rowf, lo, hi)))
        if min(nlo) <= 0:
            return False
        lo, hi = nlo, nhi
    return True


def _old_and_new(net, relax, w, S):
    """(old lower, old upper, new lower, new upper) of w . a_h over the set: old = the final
    sums' allowance only (back_substitute with ``err``, which does not apply the charges:
    the computation of the engine before issue 12), new = the default float64 call."""
    x0, eps, q = S.args()
    steps = []
    for i, rl in enumerate(relax):
        a_prev = input_abs_bound(x0, eps, q) if i == 0 else relax[i - 1].abs_bound()
        steps.append(rounding_weights(net, i, a_prev, rl.l, rl.u, unit=U64)[0])
    zero = np.zeros(1)
    old_l, old_u, _, _ = crown.back_substitute(net, relax, w, zero, x0, eps, q,
                                                 charges=crown.Charges(steps=steps))
    new_l, new_u = crown.back_substitute(net, relax, w, zero, x0, eps, q)
    return old_l[0], old_u[0], new_l[0], new_u[0]


def cancelling_cases():
    out = []
    for seed in range(12):
        W, b, x0, eps, w = cancelling_network(seed)
        sets = [InputSet(x0, eps, "inf"), InputSet(x0, eps, "2"), InputSet(x0, eps, "1"),
                InputSet(x0, box=Box(x0 - eps, x0 + 0.5 * eps))]
        out += [(W, b, w, S) for S in sets]
    return out


@pytest.mark.parametrize("kern", KERNELS)
def test_cancelling_networks_old_allowance_fails_new_bound_holds(kern):
    """On stable cancelling networks the exact range of the last row is known exactly. The
    old allowance misses the products' rounding (a bound on the wrong side of the exact
    range) on most of them; the new bound never does."""
    failures, excess = 0, []
    with using_kernels(kern):
        fn = get_relaxation("relu", "crown")
        for W, b, w, S in cancelling_cases():
            net = crown.Network(W, b)
            assert _exact_stable(net, S)
            x0, eps, q = S.args()
            _, relax = crown.hidden_layer_bounds(net, x0, eps, q, fn)
            assert all(r.diff.size == 0 and r.agree.size == r.aU.size for r in relax)  # identity
            coef, c = exact_chain(net, relax, [[F(float(v)) for v in w[0]]], [F(0)], -1)[0]
            old_l, old_u, new_l, new_u = _old_and_new(net, relax, w, S)
            # the relaxations are exact here: the oracle is the exact range of w . a_h
            assert S.covers(new_l, coef, c, -1) and S.covers(new_u, coef, c, 1)
            old_ok = S.covers(old_l, coef, c, -1) and S.covers(old_u, coef, c, 1)
            failures += not old_ok
            # how far the old bounds lie inside the exact range, relative to its width
            lo_x, hi_x = S.extreme(coef, c, -1), S.extreme(coef, c, 1)
            excess.append(max(old_l - lo_x, hi_x - old_u) / (hi_x - lo_x))
            # the margin API covers it too (w is the network's last layer, C = [[1]])
            lb = crown.margin_lower_bound(net, x0, eps, q, fn, np.array([[1.0]]))
            assert S.covers(lb[0], coef, c, -1)
    assert failures >= len(excess) // 2, (failures, excess)


def test_cancelling_network_hidden_layers_and_deep_chains():
    """The cancelling row as a hidden layer (the network continues after it): the hidden
    bounds and the margin bound cover the exact values, whose chains cross the cancellation."""
    W, b, x0, eps, w = cancelling_network(3, depth=3)
    rng = np.random.default_rng(3)
    W = W[:-1] + [np.vstack([w, rng.uniform(-1, 1, (2, w.shape[1]))]), rng.normal(size=(3, 3))]
    b = b[:-1] + [np.array([1.0, 0.0, 0.0]), np.zeros(3)]  # the cancelling neuron stays active
    net = crown.Network(W, b)
    C = np.array([[1.0, -1.0, 0.0], [0.5, 0.0, -1.0]])
    for S in (InputSet(x0, eps, "inf"), InputSet(x0, eps, "2"), InputSet(x0, eps, "1"),
              InputSet(x0, box=Box(x0 - eps, x0 + eps))):
        check_engine_against_exact(net, get_relaxation("relu", "crown"), S, C)


# ----------------------------------------------------------------------------- plumbing

def test_relaxation_without_interval_is_refused_in_float64():
    W, b = random_network([4, 5, 3], 0)
    net = crown.Network(W, b)
    x0 = np.zeros(4)
    bounds, relax = crown.hidden_layer_bounds(net, x0, 0.1, 0, get_relaxation("relu", "crown"))
    r = relax[0]
    bare = crown.Relaxation(r.aU, r.bU, r.aL, r.bL)
    with pytest.raises(ValueError, match="interval"):
        crown.back_substitute(net, [bare], W[1], b[1], x0, 0.1, 0)
    crown.back_substitute(net, [bare], W[1], b[1], x0, 0.1, 0, dtype=np.float32)  # estimate: fine


def test_relaxations_reused_with_another_set():
    """Relaxations reused with another set (the cached rounding weights of the later layers
    stay; the input layer's follow the call): the result is the one fresh relaxations give."""
    W, b = random_network([6, 7, 5, 3], 4)
    net = crown.Network(W, b)
    fn = get_relaxation("relu", "crown")
    x0 = np.random.default_rng(4).uniform(-0.5, 0.5, 6)
    _, relax = crown.hidden_layer_bounds(net, x0, 0.2, 0, fn)
    for x, eps in ((x0, 0.1), (x0 + 0.01, 0.1), (x0, 0.2)):
        fresh = [crown.Relaxation(r.aU, r.bU, r.aL, r.bL, l=r.l, u=r.u) for r in relax]
        got = crown.back_substitute(net, relax, W[2], b[2], x, eps, 0)
        want = crown.back_substitute(net, fresh, W[2], b[2], x, eps, 0)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_rounding_weights_units():
    W, b = random_network([4, 6, 3], 1)
    net = crown.Network(W, b)
    a = np.ones(4)
    lo, hi = -np.ones(6), np.ones(6)
    v32, t32 = rounding_weights(net, 0, a, lo, hi)
    v64, t64 = rounding_weights(net, 0, a, lo, hi, unit=U64)
    assert np.all(v64 > 0) and np.all(v64 * 2.0 ** 28 < v32) and t64 < t32
    with pytest.raises(ValueError):
        rounding_weights(net, 0, a, lo, hi, unit=1e-3)


def test_final_sum_allowance_grows_only_past_its_limit():
    small = [np.zeros((3, 5)), np.zeros((2, 3))]
    assert final_sum_rtol(small) == FP_RTOL
    wide = [np.zeros((1, 2 ** 21)), np.zeros((2, 1))]  # 2**21 inputs: gamma_N > 2**-32 / 2
    assert final_sum_rtol(wide) > 2 * (2 ** 21 * U64)


def test_comparison_methods_refuse_networks_past_their_allowance():
    from crown_cli.errors import InputError
    from crown_cli.certification.methods import MAX_TERMS, bind_method

    d = MAX_TERMS // 2 - 4  # 2 (d + 1) + 8 > 2**20 with the one hidden neuron
    big = ([np.zeros((1, d)), np.zeros((2, 1))], [np.zeros(1), np.zeros(2)])
    ok = ([np.zeros((1, d - 4)), np.zeros((2, 1))], [np.zeros(1), np.zeros(2)])
    for method in ("fast-lip", "op-norm", "lp-full"):
        with pytest.raises(InputError, match="too large"):
            bind_method(method, *big, "relu", None, "inf")
        bind_method(method, *ok, "relu", None, "inf")
