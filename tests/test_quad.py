"""CROWN-Quad (crown_cli.certification.methods.quad): soundness against brute force, the QP solver against
QPs with known minima, never below CROWN, and the CLI."""
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import model_path
from crown_cli.certification.certifier import Certifier
from crown_cli.cli import cli
from crown_cli.engine.dense_crown import Network, margin_lower_bound
from crown_cli.engine.input_sets import NORMS
from crown_cli.certification.methods.quad import (FirstLayer, MarginRows, QuadBound, Quadratic,
                                                  crown_quad_lower_bound, linear_certificate,
                                                  minimize_qp, project, quadratic_terms)
from crown_cli.io.models import load_model, save_npz
from crown_cli.engine.relaxations import get_relaxation
from oracles import (exact_margin_min, margins, mlp_forward, pgd_attack, project_l1, random_mlp,
                     sample_ball)

SMALL = model_path("mnist_2x20.h5")
RNG = np.random.default_rng


def _instance(seed, sizes=(8, 12, 4)):
    weights, biases = random_mlp(list(sizes), seed)
    x0 = RNG(100 + seed).uniform(-0.5, 0.5, sizes[0])
    c = int(np.argmax(mlp_forward(weights, biases, "relu", x0)))
    targets = [t for t in range(sizes[-1]) if t != c]
    C = np.zeros((len(targets), sizes[-1]))
    C[np.arange(len(targets)), c] = 1.0
    C[np.arange(len(targets)), targets] = -1.0
    return weights, biases, x0, c, targets, C


def _crown(weights, biases, x0, eps, norm, C):
    net = Network(weights, biases)
    return margin_lower_bound(net, x0, eps, NORMS[norm], get_relaxation("relu", "crown"), C)


# --- (1) soundness against sampling, PGD and the exact MILP ---------------------------------


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_quad_bound_below_true_min_margin(norm):
    wins = 0
    for seed in range(4):
        weights, biases, x0, c, targets, C = _instance(seed)
        eps_crown = Certifier(weights, biases, "relu", norm=norm, rtol=1e-3).certify(
            x0, c, targets).eps
        qb = QuadBound(weights, biases, norm)
        rough = QuadBound(weights, biases, norm, max_iter=1)  # PGD stopped far from the minimum
        for eps in (eps_crown, 1.5 * eps_crown, 3.0 * eps_crown):
            lb = qb.lower_bound(x0, eps, C)
            quad_only = qb.last_info["quad"]  # the quadratic certificate alone, before the max
            lb_rough = rough.lower_bound(x0, eps, C)
            quad_rough = rough.last_info["quad"]
            pts = sample_ball(x0, eps, norm, 4000, RNG(seed))
            for j, t in enumerate(targets):
                true_min = margins(weights, biases, "relu", pts, c, [t]).min()
                _, attacked = pgd_attack(weights, biases, "relu", x0, c, t, eps, norm, steps=60,
                                         restarts=4, rng=RNG(seed))
                true_min = min(true_min, attacked)
                if norm != "2":  # the MILP oracle handles the polyhedral balls
                    exact = exact_margin_min(weights, biases, x0, c, t, eps, norm, time_limit=20)
                    assert exact.status == "optimal"
                    # value: the numpy margin at the MILP's optimal point inside the ball
                    true_min = min(true_min, exact.value)
                assert lb[j] <= true_min and lb_rough[j] <= true_min
                assert quad_only[j] <= true_min and quad_rough[j] <= true_min
                wins += quad_only[j] > qb.last_info["crown"][j]
    assert wins > 0  # the quadratic part is exercised, not just the CROWN fallback


def test_linear_certificate_sound_for_any_slopes():
    """The certificate is a valid relaxation whatever slopes PGD hands it."""
    weights, biases, x0, c, targets, C = _instance(7, (6, 10, 3))
    net = Network(weights, biases)
    W1, b1 = net.W[0], net.b[0]
    for norm in ("inf", "2", "1"):
        eps = 0.3
        qb = QuadBound(weights, biases, norm)
        qb.lower_bound(x0, eps, C)
        n1 = {"inf": np.abs(W1).sum(1), "2": np.linalg.norm(W1, axis=1),
              "1": np.abs(W1).max(1)}[norm]
        l, u = W1 @ x0 + b1 - eps * n1, W1 @ x0 + b1 + eps * n1
        Lam, cst = C @ net.W[1], C @ net.b[1]
        pts = sample_ball(x0, eps, norm, 3000, RNG(1))
        true_min = np.array([margins(weights, biases, "relu", pts, c, [t]).min() for t in targets])
        for k in range(20):
            S = 3.0 * RNG(k).standard_normal(Lam.shape)
            lb = linear_certificate(S, MarginRows(Lam, np.abs(Lam), cst, np.abs(cst)),
                                    FirstLayer(W1, np.abs(W1), b1), l, u, x0, eps, NORMS[norm])
            assert np.all(lb <= true_min)


# --- (2) never below CROWN, better on average -----------------------------------------------


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_quad_never_below_crown_bound(norm):
    gains = []
    for seed in range(6):
        weights, biases, x0, c, targets, C = _instance(seed, (10, 16, 5))
        for eps in (0.05, 0.1, 0.2) if norm == "inf" else (0.2, 0.5, 1.0):
            crown = _crown(weights, biases, x0, eps, norm, C)
            quad = crown_quad_lower_bound(weights, biases, x0, eps, norm, C)
            assert np.all(quad >= crown)
            gains.append(np.mean(quad - crown))
    assert np.mean(gains) > 0


# --- (3) the QP solver and the duality-gap bound on QPs with known minima -------------------


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_qp_with_known_minimum(norm):
    """q(x) = sum_i a_i z_i^2 + b_i z_i with z = x (W1 = I, b1 = 0).

    inf: separable, minimum at clip(-b / 2a) coordinate-wise. 2 and 1: a_i = alpha for all i,
    q = alpha ||x - x*||^2 + const, so the minimiser is the Euclidean projection of
    x* = -b / (2 alpha) onto the ball.
    """
    d = 12
    rng = RNG(3)
    x0 = rng.uniform(-1, 1, d)
    eps = 0.4
    a = rng.uniform(0.5, 3.0, d) if norm == "inf" else np.full(d, 1.7)
    b = rng.uniform(-8, 8, d)
    xstar = -b / (2 * a)
    if norm == "inf":
        xmin = np.clip(xstar, x0 - eps, x0 + eps)
    elif norm == "2":
        v = xstar - x0
        xmin = x0 + v * min(1.0, eps / np.linalg.norm(v))
    else:
        xmin = x0 + project_l1((xstar - x0)[None, :], eps)[0]
    qmin = np.sum(a * xmin ** 2 + b * xmin)
    size = {"inf": np.abs, "2": np.linalg.norm, "1": lambda v: np.abs(v).sum()}[norm](xstar - x0)
    assert np.max(size) > eps  # the unconstrained minimiser is outside: the ball matters
    S, upper, lower, it = minimize_qp(Quadratic(a[None, :], b[None, :], np.zeros((1, d)),
                                                np.zeros(1)),
                                      FirstLayer(np.eye(d), np.eye(d), np.zeros(d)), x0, eps,
                                      norm, qp_rtol=1e-9, max_iter=2000)
    assert lower[0] <= qmin + 1e-9 * abs(qmin)  # the Frank-Wolfe bound is a lower bound ...
    assert upper[0] >= qmin - 1e-9 * abs(qmin)  # ... the objective at the iterate an upper one
    assert upper[0] - lower[0] <= 1e-6 * abs(qmin)  # and they meet at convergence
    assert it < 2000


def test_frank_wolfe_bound_below_minimum_before_convergence():
    """Stopped after one step, the duality-gap bound is still below the true minimum."""
    d = 12
    rng = RNG(5)
    x0, a, b = rng.uniform(-1, 1, d), rng.uniform(0.5, 3.0, d), rng.uniform(-8, 8, d)
    eps = 0.4
    xmin = np.clip(-b / (2 * a), x0 - eps, x0 + eps)
    qmin = np.sum(a * xmin ** 2 + b * xmin)
    for iters in (1, 2, 3):
        _, upper, lower, _ = minimize_qp(Quadratic(a[None, :], b[None, :], np.zeros((1, d)),
                                                   np.zeros(1)),
                                         FirstLayer(np.eye(d), np.eye(d), np.zeros(d)), x0, eps,
                                         "inf", qp_rtol=0.0, max_iter=iters)
        assert lower[0] <= qmin <= upper[0]


def test_qp_matches_scipy_on_the_relaxation():
    """On a real 2-layer relaxation (l_inf), PGD's minimum agrees with L-BFGS-B's."""
    from scipy.optimize import minimize

    weights, biases, x0, c, targets, C = _instance(2, (10, 16, 5))
    net = Network(weights, biases)
    W1, b1 = net.W[0], net.b[0]
    eps = 0.15
    n1 = np.abs(W1).sum(1)
    l, u = W1 @ x0 + b1 - eps * n1, W1 @ x0 + b1 + eps * n1
    Lam, cst = C @ net.W[1], C @ net.b[1]
    a, b, cc = quadratic_terms(Lam, l, u, "all")
    rows = np.flatnonzero((a > 0).any(axis=1))
    assert rows.size
    _, upper, lower, _ = minimize_qp(Quadratic(a[rows], b[rows], cc[rows], cst[rows]),
                                     FirstLayer(W1, np.abs(W1), b1), x0, eps, "inf",
                                     qp_rtol=1e-10, max_iter=5000)
    for k, j in enumerate(rows):
        def q(x, j=j):
            z = W1 @ x + b1
            return np.sum(a[j] * z * z + b[j] * z + cc[j]) + cst[j], W1.T @ (2 * a[j] * z + b[j])
        res = minimize(q, x0, jac=True, method="L-BFGS-B",
                       bounds=list(zip(x0 - eps, x0 + eps)), options={"ftol": 1e-14, "gtol": 1e-12})
        assert upper[k] == pytest.approx(res.fun, abs=1e-6)
        assert lower[k] <= res.fun + 1e-9


def test_quadratic_terms_lie_below_relu():
    """phi(z) <= Lam relu(z) on [l, u] on a grid, and the curvature is never negative."""
    rng = RNG(0)
    l = np.concatenate([rng.uniform(-3, 0, 200), [-1.0, -1.0, 0.5, -2.0]])
    u = np.concatenate([rng.uniform(0, 3, 200), [1.5, 3.0, 2.0, -0.5]])
    Lam = rng.standard_normal((3, l.size))
    for mode in ("adaptive", "all"):
        a, b, c = quadratic_terms(Lam, l, u, mode)
        assert np.all(a >= 0)
        t = np.linspace(0, 1, 301)[:, None]
        Z = l + t * (u - l)  # (301, n)
        for j in range(3):
            phi = a[j] * Z * Z + b[j] * Z + c[j]
            assert np.all(phi <= Lam[j] * np.maximum(Z, 0) + 1e-12 * (1 + np.abs(Z)))
        if mode == "all":
            assert np.any(a > 0)


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_projection_lands_in_ball_and_matches_oracle(norm):
    D = 2.0 * RNG(9).standard_normal((5, 30))
    P = project(D, 0.7, norm)
    size = {"inf": np.abs(P).max(1), "2": np.linalg.norm(P, axis=1), "1": np.abs(P).sum(1)}[norm]
    assert np.all(size <= 0.7 * (1 + 1e-12))
    if norm == "1":
        np.testing.assert_allclose(P, project_l1(D, 0.7), atol=1e-12)


# --- (4) certified radii on the shipped 2-layer MNIST model ---------------------------------


def test_mnist_2x20_crown_quad_radius_at_least_crown(mnist100):
    mlp = load_model(SMALL)
    x, y = mnist100
    for norm in ("inf", "2", "1"):
        crown = Certifier(mlp.weights, mlp.biases, "relu", norm=norm)
        quad = Certifier(mlp.weights, mlp.biases, "relu", norm=norm, method="crown-quad")
        ec, eq = [], []
        for i in range(8):
            z = crown.logits(x[i])
            c, t = int(np.argmax(z)), int(np.argsort(z)[-2])
            if c != y[i]:
                continue
            a, b = crown.certify(x[i], c, [t]), quad.certify(x[i], c, [t])
            assert b.eps >= a.eps and b.status == "certified"
            # the reported radius is verified: the bound there is positive
            lb = quad.lower_bound(x[i], b.eps, quad.margin_rows(c, [t]))
            assert lb[0] > 0
            ec.append(a.eps)
            eq.append(b.eps)
        assert np.mean(eq) > np.mean(ec)


def test_mnist_2x20_crown_quad_radius_survives_attack(mnist100):
    mlp = load_model(SMALL)
    x, _ = mnist100
    for norm in ("inf", "2"):
        quad = Certifier(mlp.weights, mlp.biases, "relu", norm=norm, method="crown-quad")
        for i in (0, 3):
            z = quad.logits(x[i])
            c, t = int(np.argmax(z)), int(np.argsort(z)[-2])
            eps = quad.certify(x[i], c, [t]).eps
            _, m = pgd_attack(mlp.weights, mlp.biases, "relu", x[i], c, t, eps, norm, steps=50,
                              restarts=4)
            assert m > 0


# --- (5) CLI ----------------------------------------------------------------------------------


def test_cli_crown_quad_rows(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", SMALL, "-n", "3", "--norm", "inf,1",
                                   "--method", "crown,crown-quad", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    import csv

    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 3 * 2 * 2
    eps = {(r["image"], r["norm"], r["method"]): float(r["eps"]) for r in rows}
    for (i, norm, method), e in eps.items():
        if method == "crown-quad":
            assert e >= eps[(i, norm, "crown")] > 0


def test_cli_crown_quad_refuses_deeper_models(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", model_path("mnist_3x20.h5"), "-n", "1",
                                   "--method", "crown-quad", "-o", str(out)])
    assert res.exit_code == 2
    assert res.output.strip() == ("crown: error: --method: crown-quad supports only 2-layer ReLU "
                                  "networks (model has 3 weight layers)")
    assert not out.exists()


def test_cli_crown_quad_refuses_other_activations(tmp_path):
    mlp = load_model(SMALL)
    path = tmp_path / "tanh.npz"
    save_npz(str(path), mlp.weights, mlp.biases, "tanh")
    res = CliRunner().invoke(cli, ["certify", "--model", str(path), "-n", "1",
                                   "--method", "crown-quad"])
    assert res.exit_code == 2
    assert res.output.strip() == ("crown: error: --method: crown-quad supports only 2-layer ReLU "
                                  "networks (model activation is tanh)")
