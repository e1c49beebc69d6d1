"""The comparison methods (crown_cli/methods/): fast-lip, op-norm, lp-full, exact.

The paper's ordering on ReLU networks, per image: every certified radius is at most the
exact minimum distortion, CROWN <= LP-Full <= exact, and Op-norm is far below CROWN. Checked
on the trained 2x[20] and 3x[20] MNIST models and on random small networks, against the
independent MILP oracles of tests/oracles.py where they apply; the bounds' soundness is
checked by sampling and PGD; bad inputs by their messages.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import model_path, slow_if
from crown_cli.certification.certifier import Certifier
from crown_cli.cli import cli
from crown_cli.engine.dense_crown import Network
from crown_cli.errors import InputError
from crown_cli.io.images import load_images
from crown_cli.certification.methods import bind_method, names
from crown_cli.certification.methods._common import center_margins
from crown_cli.certification.methods.exact import min_distortion
from crown_cli.certification.methods.fast_lip import fast_lip_lower_bound, jacobian_bound
from crown_cli.certification.methods.lp_full import Polytope, lp_full_lower_bound, safe_dual_bound
from crown_cli.certification.methods.op_norm import lipschitz_bounds, op_norm_radius
from crown_cli.io.models import load_model
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.engine.dense_crown import hidden_layer_bounds
from oracles import (
    _margin_and_grad,
    exact_margin_min,
    exact_min_linf_distortion,
    lp_norm,
    margins,
    mlp_forward,
    pgd_min_margin,
    random_mlp,
    sample_ball,
)

EXACT_RTOL = 1e-5  # exact is located to 1e-6 relative; solver tolerances on top
ALL = ("crown", "fast-lin", "fast-lip", "op-norm", "lp-full", "exact")


@functools.lru_cache(maxsize=None)
def _model(name):
    m = load_model(model_path(name))
    return m.weights, m.biases


@functools.lru_cache(maxsize=None)
def _images():
    return load_images(None)


def _order(weights, biases, x0, activation="relu"):
    return [int(j) for j in np.argsort(-mlp_forward(weights, biases, activation, x0))]


@functools.lru_cache(maxsize=None)
def _radii(source, key, norm):
    """Certified radius / exact distortion of every method for one instance (runner-up)."""
    weights, biases, x0 = _instance(source, key)
    order = _order(weights, biases, x0)
    c, t = order[0], order[1]
    out = {}
    for m in ALL:
        if m == "exact" and norm == "2":
            continue
        if m == "lp-full" and norm == "2":
            continue
        cert = Certifier(weights, biases, "relu", norm=norm, method=m, timeout=120)
        res = cert.certify(x0, c, [t])
        assert res.status in ("certified", "optimal"), (m, res)
        out[m] = res.eps
    return out


def _instance(source, key):
    if source == "random":
        sizes, seed = key
        weights, biases = random_mlp(list(sizes), seed)
        x0 = np.random.default_rng(seed + 7).standard_normal(sizes[0])
        return weights, biases, x0
    weights, biases = _model(source)
    return weights, biases, _images()[0][key]


# (model, image index): images the model classifies correctly and where the exact MILP is
# quick (a second or two)
TRAINED = [("mnist_2x20.h5", 0), ("mnist_2x20.h5", 1), ("mnist_3x20.h5", 1)]
RANDOM = [((10, 20, 10), 0), ((10, 20, 10), 1), ((10, 20, 20, 10), 3), ((10, 20, 20, 10), 5),
          ((12, 12, 12, 12, 10), 4)]


def _check_chain(r, label):
    ex = r["exact"]
    for m, eps in r.items():
        assert eps <= ex * (1 + EXACT_RTOL) + 1e-12, f"{label}: {m} {eps} > exact {ex}"
    assert r["crown"] <= r["lp-full"] * (1 + 2e-4), f"{label}: crown {r['crown']} > lp-full"
    assert r["lp-full"] <= ex * (1 + EXACT_RTOL), label
    assert r["fast-lin"] <= r["lp-full"] * (1 + 2e-4), label
    assert 0 < r["op-norm"] < r["crown"], label


# l_1 (the slower LPs) in the slow tier
@pytest.mark.parametrize("model,image,norm", [(m, i, "inf") for m, i in TRAINED]
                         + [slow_if(True, m, i, "1") for m, i in TRAINED[1:]])
def test_show_chain_on_trained_models(model, image, norm):
    weights, biases = _model(model)
    x, y = _images()
    assert _order(weights, biases, x[image])[0] == y[image]
    _check_chain(_radii(model, image, norm), f"{model} image {image} l_{norm}")


@pytest.mark.parametrize("key", RANDOM, ids=lambda k: f"{'-'.join(map(str, k[0]))}_s{k[1]}")
@pytest.mark.parametrize("norm", ["inf", "1"])
def test_show_chain_on_random_networks(key, norm):
    _check_chain(_radii("random", key, norm), f"random {key} l_{norm}")


def test_op_norm_orders_of_magnitude_below_crown_on_3x20():
    """On the deeper trained net Op-norm is more than an order of magnitude below CROWN in l_inf
    and l_1; in l_2 (spectral norms) it is closer, as in the paper's tables, but still below."""
    weights, biases = _model("mnist_3x20.h5")
    x, _ = _images()
    for i in range(3):
        order = _order(weights, biases, x[i])
        for norm in ("inf", "2", "1"):
            eps = {m: Certifier(weights, biases, "relu", norm=norm, method=m)
                   .certify(x[i], order[0], [order[1]]).eps for m in ("crown", "op-norm")}
            factor = 1.0 if norm == "2" else 10.0
            assert 0 < eps["op-norm"] < eps["crown"] / factor, (i, norm, eps)


# the default tier: the trained network and the first random one; the slow tier the others
@pytest.mark.parametrize("source,key,n_targets", [("mnist_2x20.h5", 0, 1)] + [
    slow_if(j > 0, "random", k, 2) for j, k in enumerate(RANDOM[:3])])
def test_exact_matches_the_independent_milp_oracle(source, key, n_targets):
    """l_inf: our exact distortion equals the oracle's (different algorithm and encoding)."""
    weights, biases, x0 = _instance(source, key)
    order = _order(weights, biases, x0)
    for t in order[1:1 + n_targets]:
        ours = min_distortion(Network(weights, biases), x0, order[0], [t], "inf", timeout=60)
        oracle = exact_min_linf_distortion(weights, biases, x0, order[0], t, time_limit=60)
        assert ours.status == "optimal" and oracle.status == "optimal", (ours, oracle)
        assert abs(ours.eps - oracle.value) <= 1e-5 * oracle.value, (source, key, t, ours,
                                                                      oracle.value)
        # the reported distance belongs to a real adversarial point
        assert lp_norm(ours.adversarial - x0, "inf") <= ours.eps * (1 + 1e-12)
        assert margins(weights, biases, "relu", ours.adversarial, order[0], [t]) <= 1e-8


def test_exact_l1_against_the_oracle_margin_milp():
    """l_1: nothing flips just inside the exact distance (oracle's margin MILP), and the
    returned point flips at it."""
    for key in RANDOM[:3]:
        weights, biases, x0 = _instance("random", key)
        order = _order(weights, biases, x0)
        c, t = order[0], order[1]
        ours = min_distortion(Network(weights, biases), x0, c, [t], "1", timeout=60)
        assert ours.status == "optimal"
        inside = exact_margin_min(weights, biases, x0, c, t, ours.eps * (1 - 1e-4), norm="1")
        assert inside.status == "optimal" and inside.dual_bound > -1e-7, (key, inside)
        assert lp_norm(ours.adversarial - x0, "1") <= ours.eps * (1 + 1e-9)
        assert margins(weights, biases, "relu", ours.adversarial, c, [t]) <= 1e-8


def test_exact_untargeted_is_the_minimum_over_targets():
    weights, biases, x0 = _instance("random", RANDOM[0])
    order = _order(weights, biases, x0)
    targets = order[1:4]
    net = Network(weights, biases)
    each = [min_distortion(net, x0, order[0], [t], "inf").eps for t in targets]
    allt = min_distortion(net, x0, order[0], targets, "inf")
    assert allt.status == "optimal"
    assert abs(allt.eps - min(each)) <= 1e-6 * min(each)


def test_fast_lip_below_fast_lin_on_average():
    """Fast-Lip is the weaker method (the paper's tables) in l_inf and l_2."""
    weights, biases = _model("mnist_3x20.h5")
    x, _ = _images()
    for norm in ("inf", "2"):
        means = {}
        for m in ("fast-lin", "fast-lip"):
            cert = Certifier(weights, biases, "relu", norm=norm, method=m)
            means[m] = np.mean([cert.certify(x[i], *_ct(weights, biases, x[i])).eps
                                for i in range(4)])
        assert means["fast-lip"] < means["fast-lin"], (norm, means)


def _ct(weights, biases, x0):
    order = _order(weights, biases, x0)
    return order[0], [order[1]]


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_fast_lip_bound_is_sound(activation, norm):
    """The Fast-Lip margin bound at eps never exceeds a margin found by sampling or PGD, and
    its Jacobian bound covers the true gradient at sampled points."""
    rng = np.random.default_rng(3)
    weights, biases = random_mlp([12, 16, 16, 10], 5)
    x0 = rng.standard_normal(12)
    alpha = 0.2 if activation == "leaky_relu" else None
    order = _order(weights, biases, x0, activation)
    c, targets = order[0], order[1:4]
    C = np.zeros((len(targets), 10))
    for r, t in enumerate(targets):
        C[r, c], C[r, t] = 1.0, -1.0
    cert = Certifier(weights, biases, activation, norm=norm, method="fast-lip")
    eps = cert.certify(x0, c, targets).eps
    assert eps > 0
    net = Network(weights, biases)
    for e in (0.5 * eps, eps, 2 * eps):
        lb = fast_lip_lower_bound(weights, biases, x0, e, norm, C, activation, alpha)
        pts = sample_ball(x0, e, norm, 400, rng)
        for r, t in enumerate(targets):
            sampled = float(np.min(margins(weights, biases, activation, pts, c, [t])))
            _, pgd = pgd_min_margin(weights, biases, activation, x0, c, [t], e, norm, steps=40,
                                    restarts=3, rng=rng)
            assert lb[r] <= min(sampled, pgd) + 1e-12, (e, r, lb[r], sampled, pgd)
        bounds, _ = hidden_layer_bounds(net, x0, e, {"inf": 0, "2": 1, "1": 2}[norm],
                                        get_relaxation(activation, "fast-lin", alpha))
        J = jacobian_bound(net.W, bounds, C, activation, alpha)
        if activation == "relu":
            for r, t in enumerate(targets):
                _, G = _margin_and_grad(weights, biases, "relu", pts, c, t)
                assert np.all(np.abs(G) <= J[r] + 1e-12)


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "leaky_relu", "elu"])
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_op_norm_lipschitz_bound_holds_on_samples(activation, norm):
    """g(x) >= g(x0) - L ||x - x0||_p for sampled x, near and far; eps is g(x0) / L."""
    rng = np.random.default_rng(11)
    weights, biases = random_mlp([8, 12, 12, 6], 9, scale=1.5)
    x0 = rng.standard_normal(8)
    order = _order(weights, biases, x0, activation)
    c, t = order[0], order[1]
    C = np.zeros((1, 6))
    C[0, c], C[0, t] = 1.0, -1.0
    from crown_cli.activations import default_alpha

    alpha = default_alpha(activation)
    L = float(lipschitz_bounds(weights, activation, alpha, C, norm)[0])
    g0 = float(margins(weights, biases, activation, x0, c, [t]))
    ratio = 0.0
    for radius in (0.01, 0.3, 3.0):
        pts = sample_ball(x0, radius, norm, 500, rng)
        g = margins(weights, biases, activation, pts, c, [t])
        dist = lp_norm(pts - x0, norm)
        assert np.all(g >= g0 - L * dist - 1e-12)
        ratio = max(ratio, float(np.max((g0 - g) / np.maximum(dist, 1e-300))))
    assert ratio > 0  # the samples do probe the slope
    eps, lb = op_norm_radius(weights, biases, x0, norm, C, activation, alpha)
    assert eps > 0 and lb > 0
    assert eps <= g0 / L and eps >= 0.999 * g0 / L


def test_op_norm_uses_the_activation_lipschitz_constant():
    """Sigmoid is 1/4-Lipschitz: its bound is (1/4)^hidden layers of ReLU's on the same weights."""
    weights, biases = random_mlp([8, 12, 12, 6], 9)
    C = np.zeros((1, 6))
    C[0, 0], C[0, 1] = 1.0, -1.0
    relu = lipschitz_bounds(weights, "relu", None, C, "2")[0]
    sig = lipschitz_bounds(weights, "sigmoid", None, C, "2")[0]
    assert sig == pytest.approx(relu / 16, rel=1e-8)


def test_center_margin_lower_bound_is_below_and_close():
    weights, biases = _model("mnist_3x20.h5")
    x0 = _images()[0][0]
    C = np.eye(10)[[7]] - np.eye(10)[[3]]
    g, low = center_margins(weights, biases, "relu", None, C, x0)
    exact = float(C[0] @ mlp_forward(weights, biases, "relu", x0))
    assert low[0] < exact and exact - low[0] < 1e-6 and g[0] == pytest.approx(exact, abs=1e-12)


def test_lp_full_safe_dual_bound_is_valid_for_any_multipliers():
    """Weak duality: zero multipliers give the box bound; the solver's give the LP optimum
    within its tolerance; perturbed ones stay below the optimum."""
    from scipy.optimize import linprog

    weights, biases, x0 = _instance("random", RANDOM[2])
    net = Network(weights, biases)
    relax = get_relaxation("relu", "crown")
    bounds, _ = hidden_layer_bounds(net, x0, 0.3, 0, relax)
    poly = Polytope(net.W, net.b, x0, 0.3, "inf", bounds)
    v = net.W[-1][0] - net.W[-1][1]
    c = np.zeros(poly.nvar)
    c[poly.out] = v
    res = linprog(c, A_ub=poly.A, b_ub=poly.b, bounds=np.column_stack([poly.lo, poly.hi]),
                  method="highs")
    assert res.status == 0
    lam = np.minimum(res.ineqlin.marginals, 0.0)
    best = safe_dual_bound(c, poly.A, poly.absA_T, poly.b, lam, poly.lo, poly.hi, poly.vmax)
    assert best <= res.fun and res.fun - best < 1e-7 * (1 + abs(res.fun))
    assert poly.minimize(v) == pytest.approx(best, abs=1e-7 * (1 + abs(best)))
    rng = np.random.default_rng(0)
    for scale in (0.0, 0.5, 2.0):
        lam2 = np.minimum(lam * scale + 0.01 * rng.standard_normal(lam.size), 0.0)
        assert safe_dual_bound(c, poly.A, poly.absA_T, poly.b, lam2, poly.lo, poly.hi,
                               poly.vmax) <= res.fun + 1e-12


def test_lp_full_bound_below_sampled_and_exact_margins():
    weights, biases, x0 = _instance("random", RANDOM[3])
    order = _order(weights, biases, x0)
    c, t = order[0], order[1]
    C = np.zeros((1, 10))
    C[0, c], C[0, t] = 1.0, -1.0
    rng = np.random.default_rng(2)
    for norm in ("inf", "1"):
        for eps in (0.1, 0.4):
            lb = float(lp_full_lower_bound(weights, biases, x0, eps, norm, C)[0])
            exact = exact_margin_min(weights, biases, x0, c, t, eps, norm=norm)
            assert exact.status == "optimal"
            assert lb <= exact.value + 1e-9, (norm, eps, lb, exact.value)
            sampled = np.min(margins(weights, biases, "relu", sample_ball(x0, eps, norm, 300, rng),
                                     c, [t]))
            assert lb <= sampled


# --------------------------------------------------------------------------------------------
# bad input and the CLI
# --------------------------------------------------------------------------------------------

TANH = model_path("mnist_3x1024_tanh.h5")
SMALL = model_path("mnist_2x20.h5")


@pytest.mark.parametrize("method,norm,activation,message", [
    ("exact", "2", "relu", "--method exact: norm l_2 is not supported (the MILP needs a "
                           "polyhedral ball: --norm inf or 1)"),
    ("lp-full", "2", "relu", "--method lp-full: the l_2 ball makes the LP a second-order-cone "
                             "program, and no conic solver is available; use --norm inf or 1"),
    ("exact", "inf", "tanh", "--method exact: activation 'tanh' is not supported (relu networks "
                             "only)"),
    ("lp-full", "1", "sigmoid", "--method lp-full: activation 'sigmoid' is not supported (relu "
                                "networks only)"),
    ("fast-lip", "inf", "tanh", "--method fast-lip: activation 'tanh' is not supported (relu and "
                                "leaky_relu networks only)"),
])
def test_unsupported_combinations_are_refused(method, norm, activation, message):
    weights, biases = random_mlp([4, 5, 3], 0)
    with pytest.raises(InputError) as err:
        Certifier(weights, biases, activation, norm=norm, method=method)
    assert str(err.value) == message


def test_cli_refuses_before_writing(tmp_path):
    out = tmp_path / "r.csv"
    for args, message in [
        (["--model", SMALL, "--method", "crown,exact", "--norm", "inf,2"],
         "crown: error: --method exact: norm l_2 is not supported"),
        (["--model", TANH, "--method", "lp-full"],
         "crown: error: --method lp-full: activation 'tanh' is not supported"),
        (["--model", SMALL, "--method", "exact", "--timeout", "0"],
         "crown: error: --timeout: must be > 0, got 0.0"),
    ]:
        res = CliRunner().invoke(cli, ["certify", *args, "-n", "1", "-o", str(out)])
        assert res.exit_code == 2, res.output
        assert res.output.strip().splitlines()[-1].startswith(message), res.output
        assert not out.exists()


def test_cli_runs_every_method(tmp_path):
    from crown_cli.io.results import read_rows

    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", SMALL, "-n", "2", "--method",
                                   ",".join(ALL), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    rows = read_rows(str(out))
    assert [r["method"] for r in rows] == list(ALL) * 2
    by = {(int(r["image"]), r["method"]): r for r in rows}
    for i in range(2):
        for m in ALL:
            r = by[(i, m)]
            assert r["status"] == ("optimal" if m == "exact" else "certified"), r
            assert float(r["eps"]) > 0
        assert float(by[(i, "op-norm")]["eps"]) < float(by[(i, "crown")]["eps"]) <= \
            float(by[(i, "lp-full")]["eps"]) * (1 + 2e-4)
        assert float(by[(i, "lp-full")]["eps"]) <= float(by[(i, "exact")]["eps"]) * (1 + 1e-5)
        assert by[(i, "exact")]["lower_bound"] == ""
        assert float(by[(i, "fast-lip")]["lower_bound"]) > 0
        assert by[(i, "lp-full")]["precision"] == "float64"
    # the CSV's radius is what the engine gives
    weights, biases = _model("mnist_2x20.h5")
    x0 = _images()[0][0]
    c, ts = _ct(weights, biases, x0)
    assert float(by[(0, "op-norm")]["eps"]) == Certifier(weights, biases, "relu",
                                                         method="op-norm").certify(x0, c, ts).eps


def test_cli_exact_timeout_status(tmp_path):
    from crown_cli.io.results import read_rows

    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", SMALL, "-n", "1", "--method", "exact",
                                   "--timeout", "1e-6", "-o", str(out)])
    assert res.exit_code == 3, res.output  # cron: finished, but some rows failed
    (row,) = read_rows(str(out))
    assert row["status"] == "timeout" and row["eps"] == "" and row["method"] == "exact"
    assert "mean certified eps n/a over 0 rows" in res.output


def test_exact_deadline_holds_inside_its_lp_full_bounds():
    """--method exact's deadline is checked between the LP-Full bounds' LPs (one per hidden
    neuron, before each margin MILP) and bounds its region LPs: on a network whose LP-Full
    bounds take seconds, a deadline of 1 s (its first margin MILP starts after about 0.4 s)
    ends the search with status timeout well before them (before: after the whole LP-Full
    pass, 6-8 s)."""
    import time

    weights, biases = random_mlp([784, 100, 100, 10], 0)
    x0 = np.random.default_rng(0).uniform(0, 1, 784)
    order = _order(weights, biases, x0)
    t = time.perf_counter()
    res = min_distortion(Network(weights, biases), x0, order[0], [order[1]], "inf", timeout=1.0)
    took = time.perf_counter() - t
    assert res.status == "timeout" and res.eps is None
    assert took < 1.0 + 1.0, took


@pytest.mark.parametrize("sizes", [[20, 10], [20, 1, 10]])
def test_no_hidden_layer_or_one_unit_every_method_certifies(sizes):
    """A network without a hidden layer (affine: CROWN's bound is exact) and one with a
    single hidden unit: crown, alpha-crown (no slope to optimise without a hidden layer),
    lp-full and exact each give a radius for l_inf and l_1 (alpha-crown and exact raised
    IndexError / ValueError there before: no hidden bounds, no MILP rows), exact within the
    search's tolerance of CROWN on the affine network and at least CROWN's on both."""
    weights, biases = random_mlp(sizes, 3)
    x0 = np.random.default_rng(4).uniform(0, 1, sizes[0])
    order = _order(weights, biases, x0)
    c, t = order[0], order[1]
    for norm in ("inf", "1"):
        eps = {}
        for m in ("crown", "alpha-crown", "lp-full", "exact"):
            res = Certifier(weights, biases, "relu", norm=norm, method=m,
                            timeout=60).certify(x0, c, [t])
            assert res.eps is not None and res.eps > 0, (m, norm, res)
            eps[m] = res.eps
        assert eps["alpha-crown"] >= eps["crown"]
        assert eps["exact"] >= eps["crown"] * (1 - 1e-3)
        if len(sizes) == 2:
            assert eps["exact"] == pytest.approx(eps["crown"], rel=1e-3)
            assert eps["alpha-crown"] == eps["crown"]


def test_op_norm_capped_at_max_eps():
    weights, biases = _model("mnist_2x20.h5")
    x0 = _images()[0][0]
    c, ts = _ct(weights, biases, x0)
    res = Certifier(weights, biases, "relu", method="op-norm", eps0=1e-4,
                    eps_max=1e-4).certify(x0, c, ts)
    assert res.status == "capped" and res.eps == 1e-4 and res.lower_bound > 0


def test_registry_lists_the_methods():
    assert set(names()) >= {"fast-lip", "op-norm", "lp-full", "exact"}
    weights, biases = random_mlp([4, 5, 3], 0)
    kind, fn = bind_method("fast-lip", weights, biases, "relu", None, "2")
    assert kind == "bound" and fn(np.zeros(4), 0.1, np.array([[1.0, -1.0, 0.0]])).shape == (1,)


@pytest.mark.parametrize("norm", ["inf", "1"])
def test_exact_agrees_with_the_single_milp_formulation(norm):
    """The region-LP / margin-MILP loop gives the optimum of the textbook one-MILP model."""
    from crown_cli.certification.methods.exact import _solve_direct
    from crown_cli.certification.methods.lp_full import lp_full_bounds

    weights, biases, x0 = _instance("random", RANDOM[2])
    order = _order(weights, biases, x0)
    c, t = order[0], order[1]
    ours = min_distortion(Network(weights, biases), x0, c, [t], norm)
    net = Network(weights, biases)
    radius = 2.0 * ours.eps
    res, _ = _solve_direct(net, x0, c, t, norm, radius, lp_full_bounds(net, x0, radius, norm)[0],
                           60.0)
    assert res.status == 0
    assert abs(res.fun - ours.eps) <= 1e-5 * ours.eps, (res.fun, ours.eps)


def test_cli_lp_full_timeout_status(tmp_path):
    from crown_cli.io.results import read_rows

    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", SMALL, "-n", "1", "--method", "lp-full",
                                   "--timeout", "1e-6", "-o", str(out)])
    assert res.exit_code == 3, res.output
    (row,) = read_rows(str(out))
    assert row["status"] == "timeout" and row["eps"] == "" and row["method"] == "lp-full"


def test_lp_full_deadline_stops_within_the_time_given():
    """A deadline a little ahead stops lp-full mid-search (no radius) without solving on."""
    import time

    weights, biases = _model("mnist_3x20.h5")
    x0 = _images()[0][0]
    c, ts = _ct(weights, biases, x0)
    full = Certifier(weights, biases, "relu", method="lp-full")
    t = time.perf_counter()
    done = full.certify(x0, c, ts)
    took = time.perf_counter() - t
    assert done.status == "certified" and done.eps > 0  # no timeout set: runs to the end
    res = Certifier(weights, biases, "relu", method="lp-full", timeout=0.2 * took).certify(x0, c, ts)
    assert res.status == "timeout" and res.eps is None and res.lower_bound is None
    assert 0 < res.evaluations < done.evaluations
    assert res.time_s < 0.2 * took + 0.5


def test_cli_summary_keeps_exact_distortions_apart_from_certificates(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", SMALL, "-n", "2", "--method",
                                   "exact,crown", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "4 rows for 2 images" in res.output
    assert "over 2 rows; mean exact distortion" in res.output and res.output.count("over 2 rows") == 2
