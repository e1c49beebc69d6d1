"""alpha-CROWN (crown_cli/engine/alpha_crown.py, --method alpha-crown).

- the slope gradient of the hand-written reverse pass against central finite differences
  (float64, random networks, every norm, a box, ReLU and leaky ReLU on both sides of 1);
- at CROWN's slopes the back-substitution is CROWN's (crown.margin_lower_bound);
- one hidden layer: the optimum is the LP relaxation, so alpha-crown's radius is within 1% of
  lp-full's (HiGHS) and never above the exact MILP distortion;
- alpha-crown's radius is never below CROWN's on the shipped MNIST models;
- soundness: sampling and PGD inside the certified balls and below the verified bounds;
- leaky ReLU slopes stay in [alpha, 1] (or [1, alpha]); bad options give one-line errors.
"""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import model_path
from crown_cli.engine.alpha_crown import AlphaBounds, LayerRelax, chain, chain_backward
from crown_cli.certification.certifier import Certifier
from crown_cli.cli import cli
from crown_cli.engine.dense_crown import Network, first_layer_center, margin_lower_bound
from crown_cli.engine.input_sets import Box
from crown_cli.errors import InputError
from crown_cli.io.images import load_images
from crown_cli.io.models import load_model
from crown_cli.engine.relaxations import get_relaxation
from oracles import exact_min_linf_distortion, mlp_forward, pgd_attack, random_mlp, sample_ball

QCODES = {"inf": 0, "2": 1, "1": 2}
EPS_FD = {"inf": 0.3, "2": 1.0, "1": 2.0}


def central_difference(ab, S, idx, block, j, h, eps):
    """(bound(s + h) - bound(s - h)) / 2h for the slope block[j] of store S at idx (the sum of
    ab's float64 bounds at eps); the slope is restored."""
    old = block[j]
    vals = []
    for d in (h, -h):
        block[j] = old + d
        S[idx] = block
        vals.append(float(np.sum(ab.evaluate(eps, np.float64))))
    block[j] = old
    S[idx] = block
    return (vals[0] - vals[1]) / (2 * h)


def _act(leak):
    return ("relu", 0.0) if leak == 0.0 else ("leaky_relu", leak)


def _forward(weights, biases, leak, X):
    a = np.atleast_2d(X)
    for W, b in zip(weights[:-1], biases[:-1]):
        z = a @ W.T + b
        a = np.where(z >= 0.0, z, leak * z)
    return a @ weights[-1].T + biases[-1]


def margin_problem(sizes, seed, logits, nrows=2):
    """(weights, biases, x0, C, rng): a random network (oracles.random_mlp), a random centre x0
    and the margin rows C of its class under ``logits(weights, biases, x)`` against the first
    ``nrows`` others; rng (seed + 100, x0 drawn from it) for what the test draws next."""
    weights, biases = random_mlp(sizes, seed)
    rng = np.random.default_rng(seed + 100)
    x0 = rng.standard_normal(sizes[0])
    c = int(np.argmax(logits(weights, biases, x0)))
    others = [k for k in range(sizes[-1]) if k != c][:nrows]
    C = np.zeros((len(others), sizes[-1]))
    C[:, c] = 1.0
    C[np.arange(len(others)), others] = -1.0
    return weights, biases, x0, C, rng


def _setup(sizes, seed, leak=0.0, nrows=2):
    weights, biases, x0, C, rng = margin_problem(
        sizes, seed, lambda w, b, x: _forward(w, b, leak, x), nrows)
    act, alpha = _act(leak)
    return weights, biases, x0, C, get_relaxation(act, "crown", alpha), rng


def input_set(x0, norm, rng):
    """The input set of the finite-difference checks, as crown's (centre, eps, qcode): the
    ball of norm ``norm`` with radius EPS_FD[norm], or for "box" a random box around x0."""
    if norm == "box":
        box = Box(x0 - 0.4 * rng.random(x0.size), x0 + 0.4 * rng.random(x0.size))
        return box.args()
    return x0, EPS_FD[norm], QCODES[norm]


@pytest.mark.parametrize("leak", [0.0, 0.1, 2.0])
@pytest.mark.parametrize("norm", ["inf", "2", "1", "box"])
@pytest.mark.parametrize("sizes,seed", [([6, 9, 8, 7, 4], 0), ([5, 10, 10, 3], 1)])
def test_slope_gradient_matches_finite_differences(sizes, seed, norm, leak):
    weights, biases, x0, C, rf, rng = _setup(sizes, seed, leak)
    net = Network(weights, biases)
    xc, eps, q = input_set(x0, norm, rng)
    ab = AlphaBounds(net, rf, leak, xc, q, C, store_dtype=np.float64)
    lo, hi = min(leak, 1.0), max(leak, 1.0)
    for S in ab.store.values():
        S[...] = lo + (hi - lo) * rng.random(S.shape)
    _, grads = ab.evaluate(eps, np.float64, grad=True)
    assert grads, "no unstable neuron: the test would test nothing"
    checked = 0
    h = 1e-6
    for key, idx, g, rl in grads:
        S = ab.store[key]
        block = S[idx]
        g = g.reshape(block.shape)
        for _ in range(4):
            j = tuple(int(rng.integers(s)) for s in block.shape)
            fd = central_difference(ab, S, idx, block, j, h, eps)
            assert abs(fd - g[j]) <= 1e-5 * (1.0 + abs(fd)), (key, j, fd, g[j])
            checked += 1
    assert checked >= 4


def test_chain_gradient_with_respect_to_bounds_matches_finite_differences():
    """The chord's dependence on (l, u): d lower / d u_j of one hidden layer."""
    weights, biases, x0, C, rf, rng = _setup([5, 12, 3], 3)
    net = Network(weights, biases)
    eps = 0.8
    center = weights[0] @ x0 + biases[0]
    n1 = np.abs(weights[0]).sum(axis=1)
    l, u = center - eps * n1, center + eps * n1
    Lam = C @ weights[1]
    rl = LayerRelax(l, u, rf, 0.0)
    assert rl.unst.size >= 3
    A = rng.random((C.shape[0], rl.unst.size))
    lower, tape = chain(net, [rl], Lam, C @ biases[1], [A], x0, eps, 0, dtype=np.float64,
                        tape=True)
    _, gl, gu = chain_backward(net, [rl], tape, np.ones(C.shape[0]))
    for j in rl.unst[:3]:
        for arr, g in ((l, gl[0]), (u, gu[0])):
            vals = []
            for d in (1e-6, -1e-6):
                arr[j] += d
                vals.append(chain(net, [LayerRelax(l, u, rf, 0.0)], Lam, C @ biases[1], [A], x0,
                                  eps, 0, dtype=np.float64)[0].sum())
                arr[j] -= d
            fd = (vals[0] - vals[1]) / 2e-6
            assert abs(fd - g[j]) <= 1e-4 * (1.0 + abs(fd)), (j, fd, g[j])


@pytest.mark.parametrize("norm", ["inf", "2", "1", "box"])
@pytest.mark.parametrize("sizes,seed,leak", [([6, 9, 8, 7, 4], 0, 0.0), ([5, 10, 10, 3], 1, 0.0),
                                             ([5, 10, 10, 3], 2, 0.3)])
def test_crown_slopes_give_crowns_bound(sizes, seed, leak, norm):
    weights, biases, x0, C, rf, rng = _setup(sizes, seed, leak)
    net = Network(weights, biases)
    xc, eps, q = input_set(x0, norm, rng)
    ab = AlphaBounds(net, rf, leak, xc, q, C, store_dtype=np.float64)  # NaN: CROWN's slopes
    ours = ab.evaluate(eps, np.float64)
    ref = margin_lower_bound(net, xc, eps, q, rf, C)
    # engine/dense_crown.py widens by 2**-32 of the magnitude sums; the unwidened float64 value agrees
    assert np.allclose(ours, ref, rtol=1e-8, atol=1e-8), (ours, ref)
    ver = ab.evaluate(eps, verify=True)
    assert np.all(ver <= ours + 1e-12) and np.all(ver >= ref)  # max(alpha, crown), widened


def test_optimised_slopes_stay_in_range_and_improve_the_bound():
    for leak in (0.0, 0.1, 2.0):
        weights, biases, x0, C, rf, rng = _setup([6, 12, 12, 4], 5, leak)
        net = Network(weights, biases)
        ab = AlphaBounds(net, rf, leak, x0, 0, C)
        before = ab.evaluate(0.3)
        ab.optimise(0.3, 15, 0.5)
        after = ab.evaluate(0.3)
        assert np.sum(after) >= np.sum(before) - 1e-5
        lo, hi = min(leak, 1.0), max(leak, 1.0)
        vals = np.concatenate([S[~np.isnan(S)] for S in ab.store.values()])
        assert vals.size > 0
        assert vals.min() >= lo and vals.max() <= hi, (leak, vals.min(), vals.max())
        if leak == 0.1:
            assert np.any((vals > lo) & (vals < hi)) or np.any(vals == lo)


# ---------------------------------------------------------------------------------------------
# radii against oracles
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _model(name):
    m = load_model(model_path(name))
    return m.weights, m.biases, m.activation


@functools.lru_cache(maxsize=None)
def _images():
    return load_images(None)


def _runner_up(weights, biases, x0):
    order = np.argsort(-mlp_forward(weights, biases, "relu", x0))
    return int(order[0]), int(order[1])


def _eps(weights, biases, act, norm, method, x0, c, t, **kw):
    cert = Certifier(weights, biases, act, norm=norm, method=method, **kw)
    return cert.certify(x0, c, [t])


ONE_HIDDEN = [("mnist_2x20.h5", 0, "inf"), ("mnist_2x20.h5", 1, "inf"), ("mnist_2x20.h5", 2, "1"),
              ((784, 20, 10), 0, "inf"), ((784, 20, 10), 1, "1"), ((30, 20, 10), 2, "inf")]


@pytest.mark.parametrize("source,key,norm", ONE_HIDDEN)
def test_one_hidden_layer_matches_lp_full(source, key, norm):
    """With one hidden layer, optimal slopes give the LP relaxation's bound: alpha-crown's
    radius is within 1% of lp-full's (and at least CROWN's)."""
    if isinstance(source, tuple):
        weights, biases = random_mlp(list(source), key)
        x0 = np.random.default_rng(key + 11).random(source[0])
    else:
        weights, biases, _ = _model(source)
        x0 = _images()[0][key]
    c, t = _runner_up(weights, biases, x0)
    a = _eps(weights, biases, "relu", norm, "alpha-crown", x0, c, t)
    lp = _eps(weights, biases, "relu", norm, "lp-full", x0, c, t)
    cr = _eps(weights, biases, "relu", norm, "crown", x0, c, t)
    assert a.status == "certified" and lp.status == "certified"
    assert a.eps >= cr.eps
    assert abs(a.eps / lp.eps - 1.0) <= 0.01, (a.eps, lp.eps, cr.eps)


@pytest.mark.parametrize("sizes,seed", [((10, 20, 10), 0), ((10, 20, 20, 10), 3),
                                        ((10, 16, 16, 4), 1), ((12, 12, 12, 12, 10), 4)])
def test_never_above_exact_distortion(sizes, seed):
    weights, biases = random_mlp(list(sizes), seed)
    x0 = np.random.default_rng(seed + 7).standard_normal(sizes[0])
    c, t = _runner_up(weights, biases, x0)
    a = _eps(weights, biases, "relu", "inf", "alpha-crown", x0, c, t)
    cr = _eps(weights, biases, "relu", "inf", "crown", x0, c, t)
    ex = exact_min_linf_distortion(weights, biases, x0, c, t)
    assert ex.status == "optimal", ex
    assert cr.eps <= a.eps <= ex.value * (1 + 1e-5) + 1e-12, (cr.eps, a.eps, ex.value)


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_at_least_crown_on_mnist_3x20(norm):
    weights, biases, act = _model("mnist_3x20.h5")
    x, y = _images()
    ca = Certifier(weights, biases, act, norm=norm, method="alpha-crown")
    cc = Certifier(weights, biases, act, norm=norm)
    gains = []
    for i in range(8):
        c, t = _runner_up(weights, biases, x[i])
        if c != y[i]:
            continue
        a, r = ca.certify(x[i], c, [t]), cc.certify(x[i], c, [t])
        assert a.eps >= r.eps and a.lower_bound > 0, (i, a, r)
        gains.append(a.eps / r.eps - 1.0)
    assert np.mean(gains) > 0.0  # it does gain somewhere


@pytest.mark.slow
def test_at_least_crown_on_mnist_3x1024():
    weights, biases, act = _model("mnist_3x1024.h5")
    x, _ = _images()
    ca = Certifier(weights, biases, act, norm="inf", method="alpha-crown")
    cc = Certifier(weights, biases, act, norm="inf")
    for i in (0, 1):
        c, t = _runner_up(weights, biases, x[i])
        a, r = ca.certify(x[i], c, [t]), cc.certify(x[i], c, [t])
        assert a.eps > r.eps and a.lower_bound > 0, (i, a, r)


# ---------------------------------------------------------------------------------------------
# soundness
# ---------------------------------------------------------------------------------------------


def _ball_points(weights, biases, leak, x0, c, targets, eps, norm, rng):
    act = "relu" if leak == 0.0 else "leaky_relu"
    pts = [x0[None, :], sample_ball(x0, eps, norm, 1500, rng)]
    if act == "relu":
        for t in targets:
            xa, _ = pgd_attack(weights, biases, act, x0, c, t, eps, norm, steps=60, restarts=4,
                               rng=rng)
            pts.append(xa[None, :])
    X = np.vstack(pts)
    f = _forward(weights, biases, leak, X)
    return f[:, [c]] - f[:, targets]


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
@pytest.mark.parametrize("sizes,seed,leak", [([10, 16, 16, 4], 0, 0.0),
                                             ([8, 12, 12, 12, 3], 2, 0.0),
                                             ([10, 16, 16, 4], 1, 0.2)])
def test_certificates_and_bounds_survive_attack(sizes, seed, leak, norm):
    weights, biases = random_mlp(sizes, seed)
    rng = np.random.default_rng(seed + 50)
    x0 = rng.standard_normal(sizes[0])
    f = _forward(weights, biases, leak, x0)[0]
    c = int(np.argmax(f))
    act, alpha = _act(leak)
    cert = Certifier(weights, biases, act, norm=norm, method="alpha-crown", alpha=alpha)
    others = [k for k in np.argsort(-f) if k != c]
    for targets in ([int(others[0])], [int(k) for k in others]):
        res = cert.certify(x0, c, targets)
        assert res.status == "certified" and res.eps > 0 and res.lower_bound > 0
        M = _ball_points(weights, biases, leak, x0, c, targets, res.eps, norm, rng)
        assert M.min() > 0.0, f"a point of the certified ball flips: {M.min()}"
        # the verified bounds at several radii, with slopes optimised there
        C = cert.margin_rows(c, targets)
        ab = AlphaBounds(cert.net, cert.relax_fn, leak, x0, QCODES[norm], C,
                         first_layer_center(cert.net, x0), act_bound=cert._act_bound)
        for k in (0.5, 1.0, 2.0):
            ab.optimise(k * res.eps, 10, 0.5)
            lb = ab.evaluate(k * res.eps, verify=True)
            M = _ball_points(weights, biases, leak, x0, c, targets, k * res.eps, norm, rng)
            assert np.all(lb <= M.min(axis=0) + 1e-9), (k, lb, M.min(axis=0))


def test_mnist_certificates_survive_attack():
    weights, biases, act = _model("mnist_3x20.h5")
    x, _ = _images()
    rng = np.random.default_rng(0)
    for norm in ("inf", "2", "1"):
        cert = Certifier(weights, biases, act, norm=norm, method="alpha-crown")
        x0 = x[3]
        c, t = _runner_up(weights, biases, x0)
        res = cert.certify(x0, c, [t])
        M = _ball_points(weights, biases, 0.0, x0, c, [t], res.eps, norm, rng)
        assert M.min() > 0.0


# ---------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------


def test_certifier_rejects_bad_options():
    w, b = random_mlp([4, 5, 2], 0)
    with pytest.raises(InputError, match="--alpha-iters"):
        Certifier(w, b, "relu", method="alpha-crown", alpha_iters=-1)
    with pytest.raises(InputError, match="--alpha-lr"):
        Certifier(w, b, "relu", method="alpha-crown", alpha_lr=0.0)
    with pytest.raises(InputError, match="relu, leaky_relu, tanh, sigmoid, arctan networks"):
        Certifier(w, b, "softplus", method="alpha-crown")


@pytest.mark.parametrize("args,message", [
    (["--alpha-iters", "5"], "crown: error: --alpha-iters/--alpha-lr: need --method alpha-crown"),
    (["--method", "alpha-crown", "--alpha-iters", "-2"],
     "crown: error: --alpha-iters: must be >= 0"),
    (["--method", "alpha-crown", "--alpha-lr", "-1"], "crown: error: --alpha-lr: must be > 0"),
    (["--method", "alpha-crown", "--alpha-lr", "nan"], "crown: error: --alpha-lr: must be > 0"),
])
def test_cli_bad_options_one_line(args, message):
    res = CliRunner().invoke(cli, ["certify", "--model", model_path("mnist_3x20.h5"), "-n", "1",
                                   "-q"] + args)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), res.output


def test_cli_alpha_rows_and_resume_settings(tmp_path):
    out = tmp_path / "a.csv"
    base = ["certify", "--model", model_path("mnist_3x20.h5"), "-n", "2", "-q",
            "--method", "crown,alpha-crown", "--alpha-iters", "6", "-o", str(out)]
    res = CliRunner().invoke(cli, base)
    assert res.exit_code == 0, res.output
    rows = out.read_text().splitlines()
    assert sum(",alpha-crown," in r for r in rows) == 2
    side = json.loads((tmp_path / "a.csv.json").read_text())
    assert side["settings"]["--alpha-iters"] == 6
    res = CliRunner().invoke(cli, base[:-4] + ["--alpha-iters", "7", "-o", str(out), "--resume"])
    assert res.exit_code == 2 and "--alpha-iters" in res.output
    rep = CliRunner().invoke(cli, ["report", str(out)])
    assert "alpha-CROWN vs CROWN" in rep.output


def test_float32_slopes_are_clipped_into_the_valid_range_in_float64():
    """float32(0.01) < 0.01: a stored slope that rounded below the leak must not be used."""
    leak = 0.01
    assert np.float64(np.float32(leak)) < leak
    weights, biases, x0, C, rf, rng = _setup([5, 12, 3], 4, leak)
    net = Network(weights, biases)
    eps = 0.8
    center = weights[0] @ x0 + biases[0]
    n1 = np.abs(weights[0]).sum(axis=1)
    rl = LayerRelax(center - eps * n1, center + eps * n1, rf, leak)
    assert rl.unst.size
    low = np.full((C.shape[0], rl.unst.size), np.float32(leak))
    args = (net, [rl], C @ weights[1], C @ biases[1])
    got = chain(*args, [low], x0, eps, 0, dtype=np.float64)[0]
    exact = chain(*args, [np.full(low.shape, leak)], x0, eps, 0, dtype=np.float64)[0]
    assert np.array_equal(got, exact)
