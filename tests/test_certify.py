"""Certifier: the fast path (mixed precision, interpolation, reuse) against the plain one."""
import numpy as np
import pytest

from conftest import model_path, random_network
from crown_cli.certify import Certifier
from crown_cli.model_io import load_model


def _instances(weights, biases, x, n):
    cert = Certifier(weights, biases, "relu")
    z = cert.logits(x)
    return [(i, int(np.argmax(z[i])), int(np.argsort(z[i])[-2])) for i in range(n)]


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_fast_path_matches_plain_float64_bisection(mnist100, norm):
    mlp = load_model(model_path("mnist_3x20.h5"))
    x, _ = mnist100
    fast = Certifier(mlp.weights, mlp.biases, "relu", norm=norm)
    plain = Certifier(mlp.weights, mlp.biases, "relu", norm=norm, search="bisect", rtol=1e-5,
                      precision="float64")
    ev_fast, ev_plain = [], []
    for i, c, t in _instances(mlp.weights, mlp.biases, x, 12):
        a, b = fast.certify(x[i], c, [t]), plain.certify(x[i], c, [t])
        assert a.status == b.status == "certified"
        assert a.eps == pytest.approx(b.eps, rel=1e-4)
        # both are verified radii; the plain lower bound at the fast eps must be positive too
        assert plain.lower_bound(x[i], a.eps, plain.margin_rows(c, [t]))[0] > 0
        ev_fast.append(a.evaluations)
        ev_plain.append(b.evaluations)
    assert np.mean(ev_fast) < np.mean(ev_plain)


def test_reported_eps_is_verified_in_float64_and_bound_reported(mnist100):
    mlp = load_model(model_path("mnist_2x20.h5"))
    x, _ = mnist100
    cert = Certifier(mlp.weights, mlp.biases, "relu")
    for i, c, t in _instances(mlp.weights, mlp.biases, x, 6):
        res = cert.certify(x[i], c, [t])
        lb = cert.lower_bound(x[i], res.eps, cert.margin_rows(c, [t]))[0]
        assert lb > 0 and lb == res.lower_bound


def test_untargeted_is_the_minimum_over_targets():
    W, b = random_network([20, 16, 16, 5], 11)
    x0 = np.random.default_rng(4).uniform(-0.5, 0.5, 20)
    cert = Certifier(W, b, "relu", rtol=1e-6)
    c = int(np.argmax(cert.logits(x0)))
    others = [t for t in range(5) if t != c]
    each = [cert.certify(x0, c, [t]).eps for t in others]
    assert cert.certify(x0, c, others).eps == pytest.approx(min(each), rel=2e-6)
