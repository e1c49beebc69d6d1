"""Boxes as input sets of the CROWN engine: containment, agreement with the l_inf ball, soundness."""
import numpy as np
import pytest

from conftest import random_network
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.input_sets import Box, NORMS
from crown_cli.activations import forward
from crown_cli.engine.relaxations import get_relaxation


def test_box_center_radius_contain_the_box():
    rng = np.random.default_rng(0)
    lo = rng.normal(size=1000) * 10.0 ** rng.integers(-8, 8, 1000)
    hi = lo + np.abs(rng.normal(size=1000)) * 10.0 ** rng.integers(-12, 4, 1000)
    hi[:5] = lo[:5]  # degenerate coordinates
    box = Box(lo, hi)
    assert np.all(box.center - box.radius <= lo) and np.all(box.center + box.radius >= hi)
    # exactly: no float64 rounding in the check (Fraction arithmetic)
    from fractions import Fraction
    for i in range(0, 1000, 37):
        c, r = Fraction(box.center[i]), Fraction(box.radius[i])
        assert c - r <= Fraction(lo[i]) and c + r >= Fraction(hi[i])
    assert np.all(box.radius[:5] == 0.0) or np.all(box.radius[:5] <= np.spacing(np.abs(lo[:5])))


@pytest.mark.parametrize("bad", [(np.zeros(3), -np.ones(3)), (np.zeros(3), np.full(3, np.inf)),
                                 (np.zeros(3), np.ones(4))])
def test_box_rejects_bad_bounds(bad):
    with pytest.raises(ValueError):
        Box(*bad)


@pytest.mark.parametrize("seed", range(4))
def test_uniform_box_equals_linf_ball(seed):
    ws, bs = random_network([6, 12, 12, 3], seed)
    net = crown.Network(ws, bs)
    fn = get_relaxation("relu", "crown")
    rng = np.random.default_rng(seed)
    x0, eps = rng.normal(size=6), 0.15
    C = np.array([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]])
    ball = crown.margin_lower_bound(net, x0, eps, NORMS["inf"], fn, C)
    box = Box(x0 - eps, x0 + eps)
    viabox = crown.margin_lower_bound(net, *box.args(), fn, C)
    assert np.allclose(ball, viabox, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("seed", range(3))
def test_box_bounds_hold_on_samples(act, seed):
    ws, bs = random_network([5, 16, 16, 16, 4], seed)
    net = crown.Network(ws, bs)
    fn = get_relaxation(act, "crown")
    rng = np.random.default_rng(10 + seed)
    lo = rng.normal(size=5)
    hi = lo + rng.uniform(0.0, 0.6, size=5)
    hi[0] = lo[0]  # one fixed input
    box = Box(lo, hi)
    C = rng.normal(size=(3, 4))
    lb = crown.margin_lower_bound(net, *box.args(), fn, C)
    hidden, _ = crown.hidden_layer_bounds(net, *box.args(), fn)
    X = lo + rng.uniform(size=(20000, 5)) * (hi - lo)
    X[:32] = np.where(rng.uniform(size=(32, 5)) < 0.5, lo, hi)  # corners
    vals = forward(ws, bs, act, X) @ C.T
    assert np.all(vals.min(axis=0) >= lb)
    assert np.min(vals.min(axis=0) - lb) < 0.5 * np.abs(lb).max() + 1.0  # not vacuous
    z = X
    for k, (l, u) in enumerate(hidden):
        z = z @ ws[k].T + bs[k]
        assert np.all(z >= l) and np.all(z <= u)
        z = forward([np.eye(z.shape[1]), np.eye(z.shape[1])], [np.zeros(z.shape[1])] * 2, act, z)
