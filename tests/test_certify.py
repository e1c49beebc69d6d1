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


def _layer1_f32_vs_f64(W, b, x0, eps, norm):
    from crown_cli.crown import NORMS, Relaxation, float32_allowance, hidden_layer_bounds

    cert = Certifier(W, b, "relu", norm=norm)
    q = NORMS[cert.norm]
    b32, _ = hidden_layer_bounds(cert.net, x0, eps, q, cert.relax_fn, dtype=np.float32)
    b64, _ = hidden_layer_bounds(cert.net, x0, eps, q, cert.relax_fn, dtype=np.float64)
    l0, u0 = b64[0]
    slack = float32_allowance(cert.net, x0, eps, l0, u0, Relaxation(*cert.relax_fn(l0, u0)),
                              np.maximum(u0, 0.0))
    return b32[1], b64[1], slack


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_float32_allowance_covers_float32_rounding(norm, scale):
    # weights not representable in float32 and, at scale 1e4, large terms that cancel
    W, b = random_network([300, 200, 100, 10], 21)
    W = [w * scale * (1.0 + 1e-9) for w in W]
    x0 = np.random.default_rng(5).uniform(-0.5, 0.5, 300)
    for eps in (1e-3, 1e-2, 1e-1):
        (l32, u32), (l64, u64), slack = _layer1_f32_vs_f64(W, b, x0, eps, norm)
        err = np.maximum(np.abs(l32 - l64), np.abs(u32 - u64))
        assert np.all(err <= slack)
        assert np.max(err) > 0  # float32 does round here, so the comparison means something


def test_verification_reuses_rigorously_stable_float32_neurons(mnist100):
    from crown_cli.crown import margin_lower_bound

    mlp = load_model(model_path("mnist_3x20.h5"))
    x, _ = mnist100
    cert = Certifier(mlp.weights, mlp.biases, "relu")
    skipped = 0
    for i, c, t in _instances(mlp.weights, mlp.biases, x, 6):
        C = cert.margin_rows(c, [t])
        eps = cert.certify(x[i], c, [t]).eps
        _, b32 = margin_lower_bound(cert.net, x[i], 1.01 * eps, 0, cert.relax_fn, C,
                                    dtype=np.float32, return_bounds=True)
        done = {np.float32: [(1.01 * eps, b32)], np.float64: []}
        known = cert._known_from_larger_ball(done, eps, x[i])
        _, b64 = margin_lower_bound(cert.net, x[i], eps, 0, cert.relax_fn, C, return_bounds=True)
        mask, kl, ku = known[1]
        l64, u64 = b64[1]
        # every neuron taken from float32 is stable in the float64 bounds, on the same side
        assert np.all((ku[mask] < 0) == (u64[mask] < 0)) and np.all((l64[mask] > 0) | (u64[mask] < 0))
        assert not known[0][0].any()
        skipped += int(mask.sum())
        with_known = margin_lower_bound(cert.net, x[i], eps, 0, cert.relax_fn, C, known=known)
        plain = margin_lower_bound(cert.net, x[i], eps, 0, cert.relax_fn, C)
        assert with_known[0] == pytest.approx(plain[0], rel=1e-12, abs=1e-12)
    assert skipped > 0
