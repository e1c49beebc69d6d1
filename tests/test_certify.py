"""Certifier: the fast path (mixed precision, interpolation, reuse) against the plain one."""
import numpy as np
import pytest

from conftest import model_path, random_network, slow_if
from crown_cli.certification.certifier import Certifier
from crown_cli.io.models import load_model


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


def _float32_vs_float64(W, b, x0, eps, norm):
    """Per hidden layer k >= 1: its bounds computed in float32 with their rounding bound, and
    in float64 from the same (float32-built) relaxations of layers < k."""
    from crown_cli.engine.dense_crown import back_substitute, hidden_layer_bounds
    from crown_cli.engine.input_sets import NORMS

    cert = Certifier(W, b, "relu", norm=norm)
    q = NORMS[cert.norm]
    errors = [np.zeros(w.shape[0]) for w in cert.net.W[:-1]]
    b32, relax = hidden_layer_bounds(cert.net, x0, eps, q, cert.relax_fn, dtype=np.float32,
                                     errors=errors, act_bound=cert._act_bound)
    out = []
    for k in range(1, cert.net.num_hidden):
        b64 = back_substitute(cert.net, relax[:k], cert.net.W[k], cert.net.b[k], x0, eps, q)
        out.append((b32[k], b64, errors[k]))
    return out


@pytest.mark.parametrize("norm", ["inf", "2", "1"])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_float32_rounding_bound_covers_float32_rounding(norm, scale):
    # weights not representable in float32 and, at scale 1e4, large terms that cancel; the
    # same relaxations in both precisions, so rounding is all that separates the two bounds
    W, b = random_network([300, 200, 150, 100, 10], 21)
    W = [w * scale * (1.0 + 1e-9) for w in W]
    x0 = np.random.default_rng(5).uniform(-0.5, 0.5, 300)
    for eps in (1e-3, 1e-2, 1e-1):
        for (l32, u32), (l64, u64), E in _float32_vs_float64(W, b, x0, eps, norm):
            err = np.maximum(np.abs(l32 - l64), np.abs(u32 - u64))
            assert np.all(err <= E)
            assert np.max(err) > 0  # float32 does round here, so the comparison means something
            # a worst-case bound (~1e4 times the rounding seen here), still ~1e-3 of the bounds
            assert np.median(E / (np.abs(l64) + np.abs(u64))) < 5e-3


def test_float32_rounding_bound_stays_small_through_depth():
    # an a-priori bound multiplies |W| over the layers (about 0.8 sqrt(2 n) ~ 14 per layer
    # here); the tracked one follows the computed matrices and stays ~1e-3 of the bounds
    W, b = random_network([200] + [150] * 7 + [10], 8)
    x0 = np.random.default_rng(6).uniform(0, 1, 200)
    ratios = [np.median(E / (np.abs(l64) + np.abs(u64)))
              for _, (l64, u64), E in _float32_vs_float64(W, b, x0, 1e-2, "inf")]
    assert len(ratios) == 6 and max(ratios) < 5e-3


@pytest.mark.parametrize("model", ["mnist_3x20.h5", "random4", "random7"])
def test_verification_reuses_rigorously_stable_float32_neurons(mnist100, model):
    from crown_cli.engine.dense_crown import hidden_layer_bounds, margin_lower_bound
    from crown_cli.engine.stability import StableFromFloat32

    if model == "random4":
        W, b = random_network([784, 40, 40, 40, 10], 3)
    elif model == "random7":
        W, b = random_network([784] + [60] * 6 + [10], 4)
    else:
        mlp = load_model(model_path(model))
        W, b = mlp.weights, mlp.biases
    x, _ = mnist100
    cert = Certifier(W, b, "relu")
    skipped = 0
    for i, c, t in _instances(W, b, x, 6):
        C = cert.margin_rows(c, [t])
        eps = cert.certify(x[i], c, [t]).eps
        evals = []
        for f in (1.3, 1.01):  # the second one reuses stable rows of the first, as the search does
            known = None
            errors = [np.zeros(w.shape[0]) for w in cert.net.W[:-1]]
            if evals:
                known = [(cert.interval_free(l, u), l, u) for l, u in evals[-1][1]]
                errors = [e.copy() for e in evals[-1][3]]
            _, b32 = margin_lower_bound(cert.net, x[i], f * eps, 0, cert.relax_fn, C,
                                        dtype=np.float32, known=known, return_bounds=True,
                                        errors=errors, act_bound=cert._act_bound)
            fresh = [np.ones(l.shape, bool) if known is None else ~known[k][0]
                     for k, (l, _) in enumerate(b32)]
            evals.append((f * eps, b32, fresh, errors))
        stable = StableFromFloat32(cert.net, x[i], eps, evals, cert.relax_fn, cert.interval_free,
                                   "relu")
        b_known, _ = hidden_layer_bounds(cert.net, x[i], eps, 0, cert.relax_fn, known=stable)
        b_plain, _ = hidden_layer_bounds(cert.net, x[i], eps, 0, cert.relax_fn)
        for (lk, uk), (lp, up) in zip(b_known, b_plain):
            # every neuron is either recomputed (the float64 bounds) or taken from float32 and
            # stable on the same side in the float64 bounds (its float32 interval, from other
            # relaxations on a larger ball, may be wider or narrower than the float64 one)
            assert np.array_equal(lk >= 0, lp >= 0) and np.array_equal(uk <= 0, up <= 0)
            same = np.isclose(lk, lp, rtol=1e-9, atol=1e-12) & np.isclose(uk, up, rtol=1e-9, atol=1e-12)
            assert np.all(same | (lp >= 0) | (up <= 0))
        skipped += stable.skipped
        # the rounding bound stays small enough to take over neurons in every layer
        assert len(stable.proved) == cert.net.num_hidden - 1 and min(stable.proved.values()) > 0
        with_known = margin_lower_bound(cert.net, x[i], eps, 0, cert.relax_fn, C, known=stable)
        plain = margin_lower_bound(cert.net, x[i], eps, 0, cert.relax_fn, C)
        assert with_known[0] == pytest.approx(plain[0], rel=1e-12, abs=1e-12)
    assert skipped > 0


def test_relaxation_valid_needs_same_sign_and_the_assumed_magnitudes():
    from crown_cli.engine.stability import relaxation_valid

    lg, ug = np.array([0.5, -3.0, -1.0]), np.array([2.0, -0.5, 1.0])  # active, inactive, unstable
    E = np.full(3, 0.01)
    relu = np.array([1.0, 0.0, 1.0])  # slopes: the inactive ReLU multiplies nothing
    leaky = np.array([1.0, 0.1, 1.0])

    def ok(lb, ub, slope=relu):
        return relaxation_valid(lg, ug, np.array(lb), np.array(ub), E, slope)

    assert ok([0.1, -9.0, -0.9], [2.005, -0.1, 0.9])
    # an active neuron whose rigorous interval reaches below 0: the identity is not valid there
    assert not ok([-0.1, -9.0, -0.9], [2.0, -0.1, 0.9])
    # ... or above the magnitude float32 charged its rounding to
    assert not ok([0.1, -9.0, -0.9], [2.02, -0.1, 0.9])
    # an inactive one that may turn positive
    assert not ok([0.1, -9.0, -0.9], [2.0, 0.1, 0.9])
    # an inactive leaky ReLU (slope 0.1) must stay within its magnitude too
    assert not ok([0.1, -9.0, -0.9], [2.0, -0.1, 0.9], leaky)
    assert ok([0.1, -3.005, -0.9], [2.0, -0.1, 0.9], leaky)
    # an unstable one whose interval leaves the chord's [l, u] on either side
    assert not ok([0.1, -9.0, -1.001], [2.0, -0.1, 0.9])
    assert not ok([0.1, -9.0, -0.9], [2.0, -0.1, 1.001])


@pytest.mark.parametrize("activation", ["relu", "tanh", "leaky_relu"])
@pytest.mark.parametrize("precision", ["mixed", "float64"])
def test_warm_up_leaves_results_unchanged(activation, precision):
    W, b = random_network([10, 8, 8, 3], 2)
    x0 = np.random.default_rng(1).uniform(-0.5, 0.5, 10)
    warm = Certifier(W, b, activation, norm="2", precision=precision)
    cold = Certifier(W, b, activation, norm="2", precision=precision)
    warm.warm_up()
    c = int(np.argmax(cold.logits(x0)))
    t = (c + 1) % 3
    assert warm.certify(x0, c, [t]).eps == cold.certify(x0, c, [t]).eps > 0


def test_mixed_search_falls_back_when_float64_rejects_the_estimate(mnist100, monkeypatch):
    """The float32 search's unevaluated candidate is only a proposal: if float64 does not
    confirm it, the certifier falls back to verified radii and still reports one."""
    from crown_cli.engine import radius_search as search

    mlp = load_model(model_path("mnist_3x20.h5"))
    x, _ = mnist100
    real = search.certified_radius

    def too_high(*args, **kwargs):  # propose a radius far above the root
        res = real(*args, **kwargs)
        if res.candidate is not None:
            res.candidate = res.upper * 1.5
        return res

    monkeypatch.setattr("crown_cli.certification.certifier.certified_radius", too_high)
    cert = Certifier(mlp.weights, mlp.biases, "relu")
    plain = Certifier(mlp.weights, mlp.biases, "relu", search="bisect", rtol=1e-5,
                      precision="float64")
    for i, c, t in _instances(mlp.weights, mlp.biases, x, 6):
        res, ref = cert.certify(x[i], c, [t]), plain.certify(x[i], c, [t])
        lb = cert.lower_bound(x[i], res.eps, cert.margin_rows(c, [t]))[0]
        assert lb > 0 and res.lower_bound > 0 and lb == pytest.approx(res.lower_bound, rel=1e-9)
        assert res.eps == pytest.approx(ref.eps, rel=1e-4)


@pytest.mark.parametrize("model", ["mnist_3x20.h5", slow_if(True, "mnist_3x1024.h5")])
def test_handing_the_float32_estimate_to_float64_saves_evaluations(mnist100, model, monkeypatch):
    mlp = load_model(model_path(model))
    x, _ = mnist100
    cert = Certifier(mlp.weights, mlp.biases, "relu")
    inst = _instances(mlp.weights, mlp.biases, x, 8)
    new = [cert.certify(x[i], c, [t]) for i, c, t in inst]
    real = Certifier._search
    monkeypatch.setattr(Certifier, "_search", lambda self, fn, g0, eps0, rtol, stop_at_estimate=False:
                        real(self, fn, g0, eps0, rtol))
    old = [cert.certify(x[i], c, [t]) for i, c, t in inst]
    for a, b in zip(new, old):
        assert a.eps == pytest.approx(b.eps, rel=1e-4)
    assert sum(a.evaluations for a in new) < sum(b.evaluations for b in old)


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_start_radius_is_a_fraction_of_the_first_order_distance(activation, norm):
    weights, biases = random_network([6, 8, 7, 3], seed=4)
    cert = Certifier(weights, biases, activation, norm=norm)
    x0 = np.random.default_rng(1).standard_normal(6)
    z = cert.logits(x0)
    c = int(np.argmax(z))
    targets = [t for t in range(3) if t != c]
    C = cert.margin_rows(c, targets)
    g0 = C @ z
    h = 1e-6  # central differences of the margins: the gradient the start radius uses
    J = np.array([[(C @ (cert.logits(x0 + h * e) - cert.logits(x0 - h * e)))[r] / (2 * h)
                   for e in np.eye(6)] for r in range(len(targets))])
    q = {"inf": 1, "2": 2, "1": np.inf}[norm]
    lin = np.min(g0 / np.linalg.norm(J, ord=q, axis=1))
    assert cert.start_radius(x0, C, g0) == pytest.approx(lin * 0.5 / 2, rel=1e-5)
    # an explicit --eps0 and the paper's bisection keep their fixed start
    assert Certifier(weights, biases, activation, norm=norm, eps0=0.3).start_radius(x0, C, g0) == 0.3
    bis = Certifier(weights, biases, activation, norm=norm, search="bisect")
    assert bis.start_radius(x0, C, g0) == bis.eps0
