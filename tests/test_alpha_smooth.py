"""alpha-CROWN for tanh, sigmoid and arctan (free tangent points, crown_cli/alpha.SmoothRelax).

- the lines: for random intervals of every regime and random tangent-point variables (and the
  ends of their ranges, and values outside), the sound float64 lines hold on dense grids (and
  at the end-points and their float neighbours) against two references; the steering tangent
  ``act(d) - act'(d) d`` holds to rounding, i.e. the ranges themselves are valid, and the
  sound line is that tangent up to its rounding slack;
- at CROWN's tangent points the lines are CROWN's and the bound is crown.margin_lower_bound;
- the steering kernels (lines and their reverse pass) against numpy; the gradient with
  respect to the tangent-point variables against central finite differences (float64, every
  norm and a box; the joint objective, whose gradient reaches the intermediate variables
  through (l, u); multi-layer chains; d bound / d l, d u);
- alpha-crown's radius is at least CROWN's per image (random 784-20-20-10 networks on MNIST
  images) and above it on average, also with the early stop forced at once; the radius
  search optimises jointly with the smooth activations' patience; sampling and PGD find no
  flipping point in the certified balls and no margin below the verified bounds.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import slow_if
from scipy.special import expit

from crown_cli.engine.alpha_crown import AlphaBounds, SmoothRelax, chain, chain_backward
from crown_cli.activations import apply_activation, forward
from crown_cli.certification.certifier import Certifier
from crown_cli.engine.dense_crown import Network, first_layer_center, margin_lower_bound
from crown_cli.errors import InputError
from crown_cli.io.images import load_images
from crown_cli.engine.relaxations import get_relaxation
from oracles import pgd_attack, random_mlp, sample_ball
from test_alpha import QCODES, central_difference, input_set, margin_problem
from test_relaxations import make_intervals

ACTS = ["tanh", "sigmoid", "arctan"]
ACCURATE = {"tanh": np.tanh, "sigmoid": expit, "arctan": np.arctan}


def _relax(act, l, u):
    return SmoothRelax(l, u, get_relaxation(act, "crown"), act)


def _signs(pu):
    """Row coefficients whose signs pick the lower line where pu."""
    return np.where(pu, 1.0, -1.0)


def _grid(l, u, n=801):
    t = np.linspace(0.0, 1.0, n)
    Z = l[:, None] + (u - l)[:, None] * t[None, :]
    ends = np.stack([l, u], axis=1)
    ends = np.concatenate([ends, np.nextafter(ends, -np.inf), np.nextafter(ends, np.inf)], axis=1)
    Z = np.concatenate([Z, ends], axis=1)
    return np.minimum(np.maximum(Z, l[:, None]), u[:, None])


def _thetas(rng, shape):
    """Random variables in [0, 1] with both ends and some values outside (clipped by chain,
    but the sound lines must hold for any tangent point)."""
    A = rng.random(shape)
    A[..., 0::7] = 0.0
    A[..., 1::7] = 1.0
    A[..., 2::11] = rng.uniform(-3.0, 4.0, A[..., 2::11].shape)
    return A


# tanh in the slow tier (since 2026-11-29): sigmoid and arctan keep the check in the default
@pytest.mark.parametrize("act", [slow_if(a == "tanh", a) for a in ACTS])
def test_tangent_lines_valid_on_grids(act):
    rng = np.random.default_rng(ACTS.index(act))
    l, u = make_intervals(7 + ACTS.index(act))
    ok = np.isfinite(l) & np.isfinite(u)
    l, u = l[ok], u[ok]
    rl = _relax(act, l, u)
    assert rl.freeU.sum() > 50 and rl.freeL.sum() > 50  # not vacuous
    assert np.any(rl.freeU & rl.freeL)  # crossing intervals with both lines free
    Z = _grid(l, u)
    refs = (ACCURATE[act](Z), apply_activation(act, Z))
    for _ in range(6):
        A = _thetas(rng, (1, l.size))
        for pu in (np.ones((1, l.size), bool), np.zeros((1, l.size), bool)):
            S, B = rl.lines(_signs(pu), A, np.float64, True)[:2]
            line = S[0][:, None] * Z + B[0][:, None]
            for Y in refs:
                if pu[0, 0]:  # lower lines
                    assert np.all(line <= Y), np.argwhere(~(line <= Y))[:3]
                else:
                    assert np.all(line >= Y), np.argwhere(~(line >= Y))[:3]


@pytest.mark.parametrize("act", ACTS)
def test_ranges_are_valid_tangent_families(act):
    """Within their ranges the plain tangents are valid (to rounding) and the sound lines are
    those tangents up to the slack: the ranges, not the exact intercept, make them valid."""
    rng = np.random.default_rng(10 + ACTS.index(act))
    # moderate intervals of all three regimes, where the tangents are well conditioned
    a, b = rng.uniform(-6, 6, 400), rng.uniform(-6, 6, 400)
    l, u = np.minimum(a, b), np.maximum(a, b)
    rl = _relax(act, l, u)
    Z = _grid(l, u)
    Y = ACCURATE[act](Z)
    checked = 0
    for A in (rng.random((1, l.size)), np.zeros((1, l.size)), np.ones((1, l.size))):
        for lower in (True, False):
            pu = np.full((1, l.size), lower)
            S, B, aux = rl.lines(_signs(pu), A, np.float64, False)[:3]
            Ss, Bs = rl.lines(_signs(pu), A, np.float64, True)[:2]
            free = aux[0][0]
            line = S[0][:, None] * Z + B[0][:, None]
            tol = 1e-12 * (1.0 + np.abs(Z))
            if lower:
                assert np.all(line[free] <= Y[free] + tol[free])
            else:
                assert np.all(line[free] >= Y[free] - tol[free])
            assert np.allclose(S[0][free], Ss[0][free], rtol=1e-12, atol=0)
            # (at theta = 0 when crossing, d solves the tangent equation to ~1e-13 only)
            assert np.allclose(B[0][free], Bs[0][free], rtol=0, atol=1e-11)
            # the tangent touches the function at d (the ranges lie inside [l, u])
            d = rl.tangent_points(A, pu)[0][0][free]
            assert np.all((d >= l[free] - 1e-12) & (d <= u[free] + 1e-12))
            fd = ACCURATE[act](d)
            assert np.allclose(S[0][free] * d + B[0][free], fd, rtol=0, atol=1e-12)
            checked += free.sum()
    assert checked > 1000


def _kernel_case(act, dtype, seed):
    """For the kernel-vs-numpy checks: (rng, the relaxation of finite intervals of every
    regime, row coefficients Lu (7, n) in dtype with every fifth column 0 (0 picks the lower
    line), tangent-point variables A in [0, 1))."""
    rng = np.random.default_rng(seed)
    l, u = make_intervals(5)
    ok = np.isfinite(l) & np.isfinite(u) & (np.abs(l) < 50) & (np.abs(u) < 50)
    l, u = l[ok], u[ok]
    rl = _relax(act, l, u)
    Lu = rng.standard_normal((7, l.size)).astype(dtype)
    Lu[:, ::5] = 0.0
    A = rng.random(Lu.shape).astype(dtype)
    return rng, rl, Lu, A


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_steering_kernel_matches_numpy(act, dtype):
    rng, rl, Lu, A = _kernel_case(act, dtype, 30)
    S, B, (free, dS, dB, *_), tsum, _ = rl.lines(Lu, A, dtype, False)
    Sn, Bn, (fn, dSn, dBn) = rl.lines_numpy(Lu, A, dtype)
    assert S.dtype == dtype and free.any() and (~free).any()
    assert np.array_equal(free, fn)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    for x, y in ((S, Sn), (B, Bn), (dS, dSn), (dB, dBn)):
        assert np.allclose(x, y, **tol)
    assert np.allclose(tsum, (Lu.astype(np.float64) * Bn).sum(axis=1), **tol)


def _backward_numpy(rl, gSu, wLu, aux):
    """SmoothRelax.backward in plain numpy (as it was before the kernel)."""
    free, dS, dB, pu, A, Dt, F2 = aux
    ga = np.where(free, gSu * dS + wLu * dB, 0.0)
    E = ((gSu - wLu * Dt) * F2).astype(np.float64)
    A64 = A.astype(np.float64)
    low = A64 <= 0.5
    c0 = np.where(low, 1.0 - 2.0 * A64, 0.0)
    cm = np.where(low, 2.0 * A64, 2.0 - 2.0 * A64)
    c1 = np.where(low, 0.0, 2.0 * A64 - 1.0)
    de, gl, gu = rl.dends, 0.0, 0.0
    for side, rows in ((pu, (2, 3, 9, 6, 7, 11)), (~pu, (0, 1, 8, 4, 5, 10))):
        Es = np.where(side, E, 0.0)
        E0, Em, E1 = (Es * c0).sum(axis=0), (Es * cm).sum(axis=0), (Es * c1).sum(axis=0)
        gl = gl + E0 * de[rows[0]] + E1 * de[rows[1]] + Em * de[rows[2]]
        gu = gu + E0 * de[rows[3]] + E1 * de[rows[4]] + Em * de[rows[5]]
    fixed = ~free & rl.chord
    gs = np.where(fixed, gSu, 0.0).sum(axis=0, dtype=np.float64)
    gb = np.where(fixed, wLu, 0.0).sum(axis=0, dtype=np.float64)
    return ga, gl + gs * rl.ds_dl + gb * rl.db_dl, gu + gs * rl.ds_du + gb * rl.db_du


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_kernel_matches_numpy(act, dtype):
    """SmoothRelax.backward (sigmoid_family.steer_tangent_backward) against its numpy form,
    on intervals of every regime (free lines on both sides, fixed chords)."""
    rng, rl, Lu, A = _kernel_case(act, dtype, 31)
    _, _, aux, _, _ = rl.lines(Lu, A, dtype, False)
    gSu = rng.standard_normal(Lu.shape).astype(dtype)
    wLu = (rng.uniform(0.5, 1.5, (Lu.shape[0], 1)) * Lu).astype(dtype)
    got, want = rl.backward(gSu, wLu, aux), _backward_numpy(rl, gSu, wLu, aux)
    assert aux[0].any() and (~aux[0] & rl.chord).any() and got[0].dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-12)
    for x, y in zip(got, want):
        assert np.allclose(x, y, **tol)


@pytest.mark.parametrize("act", ACTS)
def test_default_variables_give_crowns_lines(act):
    l, u = make_intervals(3)
    ok = np.isfinite(l) & np.isfinite(u)
    l, u = l[ok], u[ok]
    rl = _relax(act, l, u)
    aU, bU, aL, bL = get_relaxation(act, "crown")(l, u)
    A = rl.default[None, :]
    for lower, (a, b) in ((True, (aL, bL)), (False, (aU, bU))):
        S, B = rl.lines(_signs(np.full((1, l.size), lower)), A, np.float64, True)[:2]
        assert np.array_equal(S[0], a) and np.array_equal(B[0], b)
    # degenerate and infinite intervals: no free line
    l2 = np.array([0.3, -np.inf, -2.0, 1.0])
    u2 = np.array([0.3, 1.0, np.inf, 1.0 + 1e-12])
    rl2 = _relax(act, l2, u2)
    assert not rl2.freeU.any() and not rl2.freeL.any()


def _setup(act, sizes, seed, nrows=2):
    weights, biases, x0, C, rng = margin_problem(
        sizes, seed, lambda w, b, x: forward(w, b, act, x), nrows)
    return weights, biases, x0, C, get_relaxation(act, "crown"), rng


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("norm", ["inf", "2", "1", "box"])
def test_crown_tangent_points_give_crowns_bound(act, norm):
    weights, biases, x0, C, rf, rng = _setup(act, [6, 9, 8, 7, 4], 0)
    net = Network(weights, biases)
    xc, eps, q = input_set(x0, norm, rng)
    ab = AlphaBounds(net, rf, 0.0, xc, q, C, store_dtype=np.float64, activation=act)
    ours = ab.evaluate(eps, np.float64)  # NaN store: CROWN's tangent points
    ref = margin_lower_bound(net, xc, eps, q, rf, C)
    assert np.allclose(ours, ref, rtol=1e-8, atol=1e-8), (ours, ref)
    ver = ab.evaluate(eps, verify=True)
    assert np.all(ver >= ref) and np.all(ver <= ours + 1e-12)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("norm", ["inf", "2", "1", "box"])
def test_joint_gradient_matches_finite_differences(act, norm):
    weights, biases, x0, C, rf, rng = _setup(act, [6, 9, 8, 7, 4], 1)
    net = Network(weights, biases)
    xc, eps, q = input_set(x0, norm, rng)
    # joint: the margin's gradient reaches the intermediate variables through (l, u)
    ab = AlphaBounds(net, rf, 0.0, xc, q, C, store_dtype=np.float64, activation=act,
                     joint=True)
    for S in ab.store.values():
        S[...] = 0.05 + 0.9 * rng.random(S.shape)
    _, grads = ab.evaluate(eps, np.float64, grad=True)
    h, checked, nonzero, inner = 1e-6, 0, 0, 0
    for key, idx, g, _ in grads:
        S = ab.store[key]
        block = S[idx]
        g = g.reshape(block.shape)
        nz = np.argwhere(g != 0.0)  # half the samples where the gradient says it moves
        picks = [tuple(int(v) for v in nz[k]) for k in rng.permutation(len(nz))[:5]]
        picks += [tuple(int(rng.integers(s)) for s in block.shape) for _ in range(5)]
        for j in picks:
            fd = central_difference(ab, S, idx, block, j, h, eps)
            assert abs(fd - g[j]) <= 1e-5 * (1.0 + abs(fd)), (key, j, fd, g[j])
            checked += 1
            nonzero += abs(fd) > 1e-8
            inner += key[0] != "m" and abs(fd) > 1e-8
    # the intermediate variables act on the margin through the bounds' lines (joint)
    assert checked >= 20 and nonzero >= 3 and inner >= 1


@pytest.mark.parametrize("act", ACTS)
def test_gradient_with_respect_to_bounds_matches_finite_differences(act):
    """d lower / d l_j, d u_j through the lines (chords, tangent ranges), one hidden layer,
    intervals on both sides of 0 and crossing it."""
    weights, biases, x0, C, rf, rng = _setup(act, [5, 14, 3], 3)
    net = Network(weights, biases)
    eps = 0.6
    center = weights[0] @ x0 + biases[0]
    n1 = np.abs(weights[0]).sum(axis=1)
    l, u = center - eps * n1, center + eps * n1
    l[:3], u[:3] = np.array([0.2, -2.5, 0.1]), np.array([1.7, -0.3, 2.0])  # one-sided too
    Lam = np.vstack([C @ weights[1], -(C @ weights[1])])
    const = np.concatenate([C @ biases[1], -(C @ biases[1])])
    A = rng.uniform(0.05, 0.95, (Lam.shape[0], 14))
    rl = _relax(act, l, u)
    assert rl.freeU.any() and rl.freeL.any() and (rl.freeU & rl.freeL).any()
    _, tape = chain(net, [rl], Lam, const, [A], x0, eps, 0, dtype=np.float64, tape=True)
    _, gl, gu = chain_backward(net, [rl], tape, np.ones(Lam.shape[0]))
    nonzero = 0
    for j in range(14):
        for arr, g in ((l, gl[0]), (u, gu[0])):
            vals = []
            for d in (1e-6, -1e-6):
                arr[j] += d
                vals.append(chain(net, [_relax(act, l, u)], Lam, const, [A], x0, eps, 0,
                                  dtype=np.float64)[0].sum())
                arr[j] -= d
            fd = (vals[0] - vals[1]) / 2e-6
            assert abs(fd - g[j]) <= 1e-4 * (1.0 + abs(fd)), (j, fd, g[j], l[j], u[j])
            nonzero += abs(fd) > 1e-6
    assert nonzero >= 10


@pytest.mark.parametrize("act", ACTS)
def test_chain_gradient_through_layers_matches_finite_differences(act):
    """Rows of layer 2 back-substituted through two layers with random variables."""
    weights, biases, x0, C, rf, rng = _setup(act, [5, 10, 9, 8, 3], 2)
    net = Network(weights, biases)
    eps = 0.5
    from crown_cli.engine.dense_crown import hidden_layer_bounds

    bounds, _ = hidden_layer_bounds(net, x0, eps, 0, rf)
    relax = [_relax(act, *bounds[0]), _relax(act, *bounds[1])]
    Lam = np.vstack([weights[2], -weights[2]])
    const = np.concatenate([biases[2], -biases[2]])
    alphas = [rng.random((Lam.shape[0], 10)), rng.random((Lam.shape[0], 9))]
    w = rng.uniform(0.5, 1.5, Lam.shape[0])
    _, tape = chain(net, relax, Lam, const, alphas, x0, eps, 0, dtype=np.float64,
                    tape=True)
    ga, _, _ = chain_backward(net, relax, tape, w)
    h, nonzero = 1e-6, 0
    for i in (0, 1):
        for _ in range(8):
            r, j = int(rng.integers(Lam.shape[0])), int(rng.integers(alphas[i].shape[1]))
            vals = []
            for d in (h, -h):
                alphas[i][r, j] += d
                vals.append(float(w @ chain(net, relax, Lam, const, alphas, x0, eps, 0,
                                            dtype=np.float64)[0]))
                alphas[i][r, j] -= d
            fd = (vals[0] - vals[1]) / (2 * h)
            assert abs(fd - ga[i][r, j]) <= 1e-5 * (1.0 + abs(fd)), (i, r, j, fd, ga[i][r, j])
            nonzero += abs(fd) > 1e-7
    assert nonzero >= 4


@pytest.mark.parametrize("act", ACTS)
def test_optimised_variables_stay_in_range_and_improve_the_bound(act):
    weights, biases, x0, C, rf, _ = _setup(act, [6, 12, 12, 4], 5)
    ab = AlphaBounds(Network(weights, biases), rf, 0.0, x0, 0, C, activation=act)
    before = ab.evaluate(0.4)
    ab.optimise(0.4, 15, 0.1)
    after = ab.evaluate(0.4)
    assert np.sum(after) > np.sum(before)
    vals = np.concatenate([S[~np.isnan(S)] for S in ab.store.values()])
    assert vals.size and vals.min() >= 0.0 and vals.max() <= 1.0
    ver = ab.evaluate(0.4, verify=True)
    assert np.all(ver >= margin_lower_bound(Network(weights, biases), x0, 0.4, 0, rf, C))


# ---------------------------------------------------------------------------------------------
# radii
# ---------------------------------------------------------------------------------------------


def _runner_up(weights, biases, act, x0):
    order = np.argsort(-forward(weights, biases, act, x0))
    return int(order[0]), int(order[1])


@pytest.mark.parametrize("act", ACTS)
def test_at_least_crown_per_image_on_784_20_20_10(act):
    weights, biases = random_mlp([784, 20, 20, 10], 3 + ACTS.index(act))
    x, _ = load_images(None)
    ca = Certifier(weights, biases, act, method="alpha-crown")
    cc = Certifier(weights, biases, act)
    gains = []
    for i in range(3):
        c, t = _runner_up(weights, biases, act, x[i])
        a, r = ca.certify(x[i], c, [t]), cc.certify(x[i], c, [t])
        assert r.status == "certified" and r.eps > 0
        assert a.eps >= r.eps and a.lower_bound > 0, (i, a, r)
        gains.append(a.eps / r.eps - 1.0)
    assert np.mean(gains) > 0.0, gains


@pytest.mark.parametrize("act", ACTS)
def test_radius_search_optimises_jointly_and_outlasts_the_dip(act):
    """The certifier's alpha-crown on a smooth network: every variable for the margin's
    bound (joint), and an early stop patient enough for the objective's dip (at least
    ALPHA_PATIENCE_SMOOTH steps), on small and large networks; ReLU keeps its rule.
    Its radius is at least crown's also with the early stop forced at once (patience 1)."""
    from crown_cli.certification import certifier as cm

    weights, biases = random_mlp([784, 20, 20, 10], 3 + ACTS.index(act))
    ca = Certifier(weights, biases, act, method="alpha-crown")
    x, _ = load_images(None)
    assert ca._alpha_bounds(x[0], np.eye(10)[:1] - np.eye(10)[1:2]).joint
    assert ca._alpha_stopping() == (max(cm.ALPHA_PATIENCE, cm.ALPHA_PATIENCE_SMOOTH),
                                    cm.ALPHA_TOL)
    big = random_mlp([10, 1025, 3], 1)
    assert Certifier(*big, act, method="alpha-crown")._alpha_stopping() == \
        (max(cm.ALPHA_PATIENCE_LARGE, cm.ALPHA_PATIENCE_SMOOTH), cm.ALPHA_TOL_LARGE)
    assert Certifier(*big, "relu", method="alpha-crown")._alpha_stopping() == \
        (cm.ALPHA_PATIENCE_LARGE, cm.ALPHA_TOL_LARGE)
    assert cm.ALPHA_PATIENCE_SMOOTH > cm.ALPHA_PATIENCE_LARGE
    c, t = _runner_up(weights, biases, act, x[1])
    r = Certifier(weights, biases, act).certify(x[1], c, [t])
    ca._alpha_stopping = lambda: (1, 1e3)
    a = ca.certify(x[1], c, [t])
    assert r.status == a.status == "certified" and a.eps >= r.eps


def _margins(weights, biases, act, X, c, targets):
    f = forward(weights, biases, act, np.atleast_2d(X))
    return f[:, [c]] - f[:, targets]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_certificates_and_bounds_survive_attack(act, norm):
    sizes = [10, 16, 16, 4]
    weights, biases = random_mlp(sizes, 20 + ACTS.index(act))
    rng = np.random.default_rng(60)
    x0 = rng.standard_normal(sizes[0])
    f = forward(weights, biases, act, x0)
    c = int(np.argmax(f))
    others = [int(k) for k in np.argsort(-f) if k != c]
    cert = Certifier(weights, biases, act, norm=norm, method="alpha-crown")
    crown = Certifier(weights, biases, act, norm=norm)
    for targets in ([others[0]], others):
        res = cert.certify(x0, c, targets)
        assert res.status == "certified" and res.eps > 0 and res.lower_bound > 0
        assert res.eps >= crown.certify(x0, c, targets).eps
        pts = [x0[None, :], sample_ball(x0, res.eps, norm, 1500, rng)]
        for t in targets:
            xa, _ = pgd_attack(weights, biases, act, x0, c, t, res.eps, norm, steps=60,
                               restarts=4, rng=rng)
            pts.append(xa[None, :])
        M = _margins(weights, biases, act, np.vstack(pts), c, targets)
        assert M.min() > 0.0, f"a point of the certified ball flips: {M.min()}"
        C = cert.margin_rows(c, targets)
        ab = AlphaBounds(cert.net, cert.relax_fn, 0.0, x0, QCODES[norm], C,
                         first_layer_center(cert.net, x0), act_bound=cert._act_bound,
                         activation=act)
        for k in (0.5, 1.0, 2.0):
            ab.optimise(k * res.eps, 10, 0.1)
            lb = ab.evaluate(k * res.eps, verify=True)
            M = _margins(weights, biases, act,
                         np.vstack([x0[None, :], sample_ball(x0, k * res.eps, norm, 1500, rng)]),
                         c, targets)
            assert np.all(lb <= M.min(axis=0) + 1e-9), (k, lb, M.min(axis=0))


def test_alpha_crown_refuses_other_smooth_activations():
    w, b = random_mlp([4, 5, 2], 0)
    with pytest.raises(InputError, match="tanh, sigmoid, arctan networks only"):
        Certifier(w, b, "elu", method="alpha-crown")
