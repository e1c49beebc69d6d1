"""ELU with a scale above 1 (ONNX Selu's 1.6733: a concave kink at 0).

The ELU lines (engine/relaxations/extra.py) and the node's interval (engine/node_rules.py)
hold against 40-digit mpmath and on dense float grids, over intervals on either side of 0,
across it and out in the tails; the lines are the least-area ones (no valid line of another
slope has a smaller area)."""
import numpy as np
import pytest

from crown_cli.activations import apply_activation
from crown_cli.engine.node_rules import activation_interval
from crown_cli.engine.relaxations.extra import elu_relaxation
from crown_cli.graph.ops import ActivationOp

SELU_ALPHA = 1.67326319217681884765625  # float32, as ONNX's default attribute
SELU_GAMMA = 1.05070102214813232421875
ALPHAS = [SELU_ALPHA, 1.05, 4.0]


def _intervals(seed, n):
    """n intervals: on the negative side, the positive side, across 0 (both sides longer),
    tiny around 0, and wide ones reaching -700 and 300."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=n) * rng.choice([0.01, 1.0, 3.0, 12.0, 40.0], size=n)
    w = np.abs(rng.normal(size=n)) * rng.choice([0.0, 1e-9, 0.1, 1.0, 5.0, 30.0], size=n)
    l, u = c - w, c + w
    k = n // 5  # across 0 with either side the longer one, and around 0 only
    l[:k] = -10.0 ** rng.uniform(-8, 2.5, k)
    u[:k] = 10.0 ** rng.uniform(-8, 2.5, k)
    l[k:k + 4], u[k:k + 4] = [-700.0, -1e-300, -3.0, -1.0], [300.0, 1e-300, 0.0, 1.0]
    return np.ascontiguousarray(l), np.ascontiguousarray(u)


def _interval(alpha, l, u):
    z = np.maximum(np.abs(l), np.abs(u))
    return activation_interval(ActivationOp("elu", alpha), "crown", l, u, z)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_elu_above_one_lines_and_range_hold_in_exact_arithmetic(alpha):
    """At 33 points of each interval (and 0 where it holds it) the real ELU (mpmath, 40
    digits, with the float alpha) lies between the lines and inside the node's interval."""
    import mpmath

    mpmath.mp.dps = 40
    l, u = _intervals(int(alpha * 100), 200)
    aU, bU, aL, bL = elu_relaxation(l, u, alpha)
    (_, lo, hi) = _interval(alpha, l, u)
    A = mpmath.mpf(alpha)
    for i in range(l.size):
        zs = list(np.linspace(l[i], u[i], 33)) + ([0.0] if l[i] <= 0.0 <= u[i] else [])
        for z in zs:
            Z = mpmath.mpf(float(z))
            f = Z if Z > 0 else A * mpmath.expm1(Z)
            assert mpmath.mpf(aL[i]) * Z + mpmath.mpf(bL[i]) <= f, (l[i], u[i], z)
            assert f <= mpmath.mpf(aU[i]) * Z + mpmath.mpf(bU[i]), (l[i], u[i], z)
            assert mpmath.mpf(lo[i]) <= f <= mpmath.mpf(hi[i]), (l[i], u[i], z)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_elu_above_one_lines_hold_on_a_dense_grid_and_the_range_is_exact(alpha):
    """On 2001 float points of each interval plus 0 and its neighbours, against the forward
    pass's ELU: no crossing (exact float comparison); the node's interval is [f(l), f(u)]
    within 8 ulps (the exact range, rounded outward)."""
    l, u = _intervals(7, 800)
    aU, bU, aL, bL = elu_relaxation(l, u, alpha)
    (_, lo, hi) = _interval(alpha, l, u)
    fl, fu = apply_activation("elu", l, alpha), apply_activation("elu", u, alpha)
    ulp = 8 * np.finfo(float).eps
    assert np.all(lo <= fl) and np.all(fl - lo <= ulp * np.abs(fl) + 1e-300)
    assert np.all(hi >= fu) and np.all(hi - fu <= ulp * np.abs(fu) + 1e-300)
    for i in range(l.size):
        z = np.concatenate([np.linspace(l[i], u[i], 2001), [0.0, 5e-324, -5e-324]])
        z = z[(z >= l[i]) & (z <= u[i])]
        f = apply_activation("elu", z, alpha)
        assert np.all(aL[i] * z + bL[i] <= f) and np.all(f <= aU[i] * z + bU[i]), (l[i], u[i])


def _least_offset(f, z, k, upper):
    """The tightest intercept of a line of slope k above (below) the sampled f."""
    return np.max(f - k * z) if upper else np.min(f - k * z)


@pytest.mark.parametrize("alpha", [SELU_ALPHA, 4.0])
def test_elu_above_one_lines_are_least_area(alpha):
    """Across 0 each line's area (its value at the midpoint) is, up to sampling, the least of
    any valid line of 400 slopes spanning [0, alpha] (the lines' intercepts taken on a grid
    that holds the kink and the candidates' touch points only approximately, so 1e-6 of
    slack)."""
    rng = np.random.default_rng(1)
    l = -10.0 ** rng.uniform(-2, 1.5, 120)
    u = 10.0 ** rng.uniform(-2, 1.5, 120)
    aU, bU, aL, bL = elu_relaxation(l, u, alpha)
    slopes = np.linspace(0.0, alpha, 400)
    for i in range(l.size):
        z = np.concatenate([np.linspace(l[i], u[i], 20001), [0.0]])
        f = apply_activation("elu", z, alpha)
        m = 0.5 * (l[i] + u[i])
        best_up = min(k * m + _least_offset(f, z, k, True) for k in slopes)
        best_lo = max(k * m + _least_offset(f, z, k, False) for k in slopes)
        tol = 1e-6 * (1.0 + abs(u[i]) + abs(l[i]))
        assert aU[i] * m + bU[i] <= best_up + tol, (l[i], u[i])
        assert aL[i] * m + bL[i] >= best_lo - tol, (l[i], u[i])
