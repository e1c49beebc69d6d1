"""The PGD minimum-distortion attack (crown_cli/attack.py) and `crown certify --attack pgd`.

The attack's distortions are upper bounds on the minimum adversarial distortion, so they must
be real: the point is adversarial when recomputed by an independent forward pass, its distance
is the reported number, it is never below the exact MILP minimum, and no certified radius on
the shipped models exceeds it.
"""
import functools

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import model_path, slow_if
from oracles import exact_min_linf_distortion, lp_norm as oracle_norm, mlp_forward, random_mlp

from crown_cli.activations import ACTIVATIONS, supporting
from crown_cli.certification.attack import (PGDAttack, descent_direction, lp_norm, project_ball,
                              project_l1_ball)
from crown_cli.certification.certifier import Certifier
from crown_cli.cli import cli
from crown_cli.io.models import load_model
from crown_cli.io.results import read_rows
from crown_cli.certification.targets import select_all

NORMS = ("inf", "2", "1")
ORACLE_ACTIVATIONS = ("relu", "tanh", "sigmoid", "arctan", "leaky_relu", "elu", "softplus",
                      "hard_sigmoid")


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_record_has_a_derivative_matching_its_function(name):
    """The record's derivative equals a central difference of its function (points away from
    the kinks at 0 and, for hard sigmoid, at +-2.5)."""
    act = ACTIVATIONS[name]
    z = np.array([-3.7, -1.3, -0.4, 0.3, 1.1, 2.2, 4.5])
    p = act.default_param
    h = 1e-6
    fd = (act.function(z + h, p) - act.function(z - h, p)) / (2 * h)
    np.testing.assert_allclose(act.derivative(z, p), fd, rtol=1e-6, atol=1e-8)


# (sign's attack descends on a surrogate, not on its derivative: tests/test_sign.py)
@pytest.mark.parametrize("activation", sorted(a for a in supporting("mlp")
                                              if ACTIVATIONS[a].surrogate is None))
def test_margin_gradient_matches_finite_differences(activation):
    weights, biases = random_mlp([6, 9, 7, 4], seed=3)
    att = PGDAttack(weights, biases, activation)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((5, 6))
    targets = np.array([1, 3])
    m, G = att.margin_and_grad(X, 0, targets)
    h = 1e-3
    for r in range(X.shape[0]):
        num = np.empty(6)
        for j in range(6):
            e = np.zeros(6)
            e[j] = h
            fp = att.margins((X[r] + e)[None, :], 0, targets).min()
            fm = att.margins((X[r] - e)[None, :], 0, targets).min()
            num[j] = (fp - fm) / (2 * h)
        # float32 gradients; central differences are exact up to O(h^2) off kinks
        np.testing.assert_allclose(G[r], num, rtol=2e-2, atol=2e-3, err_msg=f"row {r}")
        assert m[r] == pytest.approx(att.margins(X[r][None, :], 0, targets).min(), abs=1e-4)


def _l1_projection_by_bisection(v, radius):
    """Reference: soft-threshold theta found by bisection on sum(max(|v| - theta, 0)) = radius."""
    if np.abs(v).sum() <= radius:
        return v.copy()
    lo, hi = 0.0, np.abs(v).max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.maximum(np.abs(v) - mid, 0).sum() > radius:
            lo = mid
        else:
            hi = mid
    return np.sign(v) * np.maximum(np.abs(v) - hi, 0)


def test_l1_projection_against_bisection_reference():
    rng = np.random.default_rng(0)
    V = rng.standard_normal((40, 30)) * rng.uniform(0.1, 3.0, size=(40, 1))
    radii = rng.uniform(0.05, 20.0, size=40)
    P = project_l1_ball(V, radii)
    for v, r, p in zip(V, radii, P):
        ref = _l1_projection_by_bisection(v, r)
        np.testing.assert_allclose(p, ref, atol=1e-9)
        assert np.abs(p).sum() <= r * (1 + 1e-14)
    inside = V[0] * 1e-3
    np.testing.assert_array_equal(project_l1_ball(inside[None, :], 1.0)[0], inside)


@pytest.mark.parametrize("norm", NORMS)
def test_projection_and_direction_respect_the_norm(norm):
    rng = np.random.default_rng(5)
    D = rng.standard_normal((20, 50)) * 3
    radii = rng.uniform(0.01, 2.0, size=20)
    P = project_ball(D, radii, norm)
    assert np.all(lp_norm(P, norm) <= radii * (1 + 1e-12))
    assert np.allclose(lp_norm(P, norm), radii)  # all started outside
    S = descent_direction(rng.standard_normal((20, 50)), norm, l1_coords=3)
    np.testing.assert_allclose(lp_norm(S, norm), 1.0)
    if norm == "1":
        assert np.all((S != 0).sum(axis=1) == 3)


def _check_result(att, weights, biases, activation, x0, c, targets, res):
    """The reported point is adversarial by an independent forward pass, at the reported norm."""
    assert res.eps is not None and res.x_adv is not None
    assert res.eps == float(lp_norm(res.x_adv - x0, att.norm))
    assert res.eps == pytest.approx(float(oracle_norm(res.x_adv - x0, att.norm)), rel=1e-12)
    f = mlp_forward(weights, biases, activation, res.x_adv)
    assert np.min(f[c] - f[list(targets)]) <= 1e-12
    f_pkg = att.margins(res.x_adv[None, :], c, np.asarray(targets))[0]
    assert np.min(f_pkg) <= 0.0  # exactly the package's verification


@pytest.mark.parametrize("activation", ORACLE_ACTIVATIONS)
@pytest.mark.parametrize("norm", NORMS)
def test_attack_finds_real_adversarial_examples(activation, norm):
    weights, biases = random_mlp([12, 16, 16, 5], seed=11, scale=2.0)  # every target reachable
    x0 = np.random.default_rng(2).standard_normal(12)
    z = mlp_forward(weights, biases, activation, x0)
    c = int(np.argmax(z))
    att = PGDAttack(weights, biases, activation, norm=norm)
    for targets in ([int(np.argsort(z)[-2])], [t for t in range(5) if t != c]):
        res = att.min_distortion(x0, c, targets, np.random.default_rng(0))
        _check_result(att, weights, biases, activation, x0, c, targets, res)


def test_attack_is_deterministic_given_the_generator():
    weights, biases = random_mlp([20, 30, 10], seed=4)
    x0 = np.random.default_rng(3).standard_normal(20)
    att = PGDAttack(weights, biases, "relu", norm="2")
    a = att.min_distortion(x0, 0, [1, 2], np.random.default_rng(7))
    b = att.min_distortion(x0, 0, [1, 2], np.random.default_rng(7))
    assert a.eps == b.eps and np.array_equal(a.x_adv, b.x_adv)


def test_no_adversarial_example_gives_none_and_already_adversarial_gives_zero():
    # f_0 - f_1 = 1 everywhere: class 1 can never catch up
    W = [np.eye(3), np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])]
    b = [np.zeros(3), np.array([1.0, 0.0])]
    att = PGDAttack(W, b, "relu", norm="inf", eps_max=10.0)
    res = att.min_distortion(np.zeros(3), 0, [1])
    assert res.eps is None and res.x_adv is None and res.margin == 1.0
    tie = att.min_distortion(np.zeros(3), 1, [0])  # class 0 already beats "predicted" 1
    assert tie.eps == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_attack_distortion_is_at_least_the_exact_milp_minimum(seed):
    """l_inf on random ReLU nets: never below the MILP's proven lower bound, and close to it."""
    weights, biases = random_mlp([10, 12, 12, 4], seed=seed)
    x0 = np.random.default_rng(100 + seed).standard_normal(10)
    z = mlp_forward(weights, biases, "relu", x0)
    c, t = int(np.argmax(z)), int(np.argsort(z)[-2])
    att = PGDAttack(weights, biases, "relu", norm="inf")
    res = att.min_distortion(x0, c, [t], np.random.default_rng(seed))
    _check_result(att, weights, biases, "relu", x0, c, [t], res)
    exact = exact_min_linf_distortion(weights, biases, x0, c, t, eps_hi=2 * res.eps)
    assert exact.status == "optimal", exact
    assert res.eps >= exact.dual_bound
    assert res.eps <= 1.5 * exact.value  # a useful upper bound, not just a valid one


@functools.lru_cache(maxsize=None)
def _model_and_images(name):
    from crown_cli.io.images import load_images

    mlp = load_model(model_path(name))
    x, y = load_images(None)
    return mlp, x, y


# the 1024-neuron models in l_inf only in the default tier, every model in every norm in the slow
@pytest.mark.parametrize("name,count,norm", [
    slow_if(norm != "inf" and name.startswith("mnist_3x1024"), name, count, norm)
    for name, count in [("mnist_2x20.h5", 25), ("mnist_3x20.h5", 10), ("mnist_3x1024.h5", 2),
                        ("mnist_3x1024_tanh.h5", 1)] for norm in NORMS])
def test_certified_eps_never_exceeds_attack_distortion(name, count, norm):
    mlp, x, y = _model_and_images(name)
    methods = ("crown", "fast-lin") if mlp.activation == "relu" else ("crown",)
    certs = [Certifier(mlp.weights, mlp.biases, mlp.activation, norm=norm, method=m,
                       alpha=mlp.alpha) for m in methods]
    att = PGDAttack(mlp.weights, mlp.biases, mlp.activation, norm=norm, alpha=mlp.alpha)
    sel = select_all(certs[0].logits(x))
    done = 0
    for i in range(x.shape[0]):
        c = sel[i]["predicted"]
        if c != y[i]:
            continue
        t = sel[i]["runner-up"]
        res = att.min_distortion(x[i], c, [t], np.random.default_rng(i))
        _check_result(att, mlp.weights, mlp.biases, mlp.activation, x[i], c, [t], res)
        for cert in certs:
            eps = cert.certify(x[i], c, [t]).eps
            assert 0 < eps <= res.eps, (name, norm, cert.method, i, eps, res.eps)
        done += 1
        if done == count:
            break


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def test_cli_attack_adds_attack_eps(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", model_path("mnist_2x20.h5"), "-n", "9",
                                   "--norm", "inf,1", "--method", "crown,fast-lin", "--attack",
                                   "pgd", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    rows = read_rows(str(out))
    assert len(rows) == 9 * 2 * 2
    for r in rows:
        if r["status"] == "misclassified":
            assert r["attack_eps"] == "" and r["attack_time_s"] == ""
            continue
        assert float(r["eps"]) <= float(r["attack_eps"]) and float(r["attack_time_s"]) >= 0
    assert any(r["status"] == "misclassified" for r in rows)  # image 8 is misclassified
    # one attack per (image, norm, target type), shared by the methods
    by_key = {}
    for r in rows:
        by_key.setdefault((r["image"], r["norm"]), set()).add(r["attack_eps"])
    assert all(len(v) == 1 for v in by_key.values())


def test_cli_without_attack_leaves_columns_empty(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", model_path("mnist_2x20.h5"), "-n", "2",
                                   "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert all(r["attack_eps"] == "" for r in read_rows(str(out)))


def test_cli_attack_options_need_attack():
    res = CliRunner().invoke(cli, ["certify", "--model", model_path("mnist_2x20.h5"), "-n", "1",
                                   "--attack-steps", "5"])
    assert res.exit_code == 2
    assert "crown: error: --attack-steps/--attack-restarts: need --attack pgd" in res.output


def test_certified_eps_above_attack_distortion_is_reported(tmp_path, monkeypatch):
    """A (simulated) attack distortion below the certified eps: warning line, row kept."""
    from crown_cli.certification import attack as attack_mod

    real = attack_mod.PGDAttack.min_distortion

    def too_small(self, x0, c, targets, rng=None):
        res = real(self, x0, c, targets, rng)
        res.eps = 1e-6
        return res

    monkeypatch.setattr(attack_mod.PGDAttack, "min_distortion", too_small)
    out = tmp_path / "r.csv"
    # click < 8.2 mixes stderr into the output unless told not to
    mixes = "mix_stderr" in CliRunner.__init__.__code__.co_varnames
    runner = CliRunner(mix_stderr=False) if mixes else CliRunner()
    res = runner.invoke(
        cli, ["certify", "--model", model_path("mnist_2x20.h5"), "-n", "1", "--attack", "pgd",
              "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    (row,) = read_rows(str(out))
    assert row["attack_eps"] == "1e-06"
    assert res.stderr.startswith(
        f"crown: warning: image 0: certified eps {row['eps']} exceeds attack distortion 1e-06")
