"""Branch and bound by ReLU splitting (crown_cli.verification.bab.relu_split): the batched bound and its gradient,
soundness of subdomain bounds on sampled points, and verdicts against an exact MILP."""
import time
import warnings
from fractions import Fraction

import numpy as np
import pytest

from conftest import slow_if
from crown_cli.verification.bab import domain_bounds, relu_split as bab_relu
from crown_cli.verification.outcome import violations
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.input_sets import Box
from crown_cli.engine.kernels import using_kernels
from crown_cli.engine.relaxations import get_relaxation
from oracles import exact_margin_min, mlp_forward, random_mlp


def _case(seed, sizes=(6, 20, 20, 3), eps=0.3):
    w, b = random_mlp(list(sizes), seed=seed)
    rng = np.random.default_rng(seed + 100)
    x0 = rng.uniform(-1.0, 1.0, sizes[0])
    return w, b, x0, x0 - eps, x0 + eps


def _bounder(*args, **kw):
    """The Bounder of ``ReluSplitProblem(*args, **kw)``."""
    return bab_relu.Bounder(bab_relu.ReluSplitProblem(*args, **kw))


def _random_params(bd, rng, B, leak=0.0):
    split = rng.integers(-1, 2, (B, bd.nU)).astype(np.int8)
    alpha = rng.uniform(leak, 1.0, (B, bd.m, bd.nU))
    beta = rng.uniform(0.0, 1.0, (B, bd.m, bd.nU)) * (split != 0)[:, None, :]
    return split, alpha, beta


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
def test_gradient_matches_finite_differences(activation):
    w, b, x0, lo, hi = _case(1)
    A = np.array([[1.0, -1.0, 0.0], [0.5, 0.0, -1.0]])
    bd = _bounder(w, b, lo, hi, A, np.zeros(2), activation=activation)
    assert bd.nU > 5
    rng = np.random.default_rng(2)
    leak = bd.leak
    split, alpha, beta = _random_params(bd, rng, 3, leak)
    beta = rng.uniform(0.0, 1.0, beta.shape)  # also on unsplit neurons: gradient must be 0
    _, state = bd.evaluate(split, alpha, beta, np.float64, keep=True)
    gA, gB = bd.gradient(state)
    gA = gA.reshape(alpha.shape)
    gB = gB.reshape(beta.shape)
    h = 1e-6
    checked = 0
    for j in range(bd.nU):
        for name, P, g in (("alpha", alpha, gA), ("beta", beta, gB)):
            Pp, Pm = P.copy(), P.copy()
            Pp[:, :, j] += h
            Pm[:, :, j] -= h
            args_p = (split, Pp, beta) if name == "alpha" else (split, alpha, Pp)
            args_m = (split, Pm, beta) if name == "alpha" else (split, alpha, Pm)
            # each (domain, row)'s bound depends only on its own parameters
            fd = (bd.evaluate(*args_p) - bd.evaluate(*args_m)) / (2 * h)
            np.testing.assert_allclose(g[:, :, j], fd, rtol=1e-5, atol=1e-7)
            checked += np.count_nonzero(np.abs(fd) > 1e-3)
    assert checked > 10  # the comparison is not all zeros


def test_float32_gradient_close_to_float64():
    w, b, x0, lo, hi = _case(3)
    A = np.array([[1.0, 0.0, -1.0]])
    bd = _bounder(w, b, lo, hi, A, np.zeros(1))
    split, alpha, beta = _random_params(bd, np.random.default_rng(4), 4)
    v64, s64 = bd.evaluate(split, alpha, beta, np.float64, keep=True)
    v32, s32 = bd.evaluate(split, alpha.astype(np.float32), beta.astype(np.float32),
                           np.float32, keep=True)
    np.testing.assert_allclose(v32, v64, rtol=1e-4, atol=1e-4)
    for g64, g32 in zip(bd.gradient(s64), bd.gradient(s32)):
        np.testing.assert_allclose(g32, g64, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("seed", [0, 5])
def test_root_bound_equals_crown(seed):
    w, b, x0, lo, hi = _case(seed, sizes=(8, 30, 30, 20, 4), eps=0.2)
    A = np.array([[1.0, -1.0, 0.0, 0.0], [0.0, 1.0, 0.0, -1.0], [-0.5, 0.0, 2.0, 0.0]])
    bvec = np.array([0.1, -0.2, 0.3])
    bd = _bounder(w, b, lo, hi, A, bvec)
    assert bd.nU > 10
    split = np.zeros((2, bd.nU), np.int8)
    alpha = np.broadcast_to(bd.initial_alpha().astype(np.float64), (2, 3, bd.nU)).copy()
    v = bd.evaluate(split, alpha, np.zeros_like(alpha))
    box = Box(lo, hi)
    ref = crown.margin_lower_bound(crown.Network(w, b), *box.args(),
                                   get_relaxation("relu", "crown"), A)
    for d in range(2):
        np.testing.assert_allclose(v[d], ref - np.nextafter(bvec, np.inf), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
def test_subdomain_bounds_sound_on_samples(activation):
    """Splits taken from a sampled point's signs; every sample whose signs match the splits
    has A f(x) - b at least the subdomain's float64 bound, for random alpha and beta >= 0."""
    w, b, x0, lo, hi = _case(7, eps=0.4)
    A = np.array([[1.0, -1.0, 0.0], [0.0, -1.0, 1.0]])
    bvec = np.array([0.05, -0.1])
    bd = _bounder(w, b, lo, hi, A, bvec, activation=activation)
    rng = np.random.default_rng(8)
    X = lo + (hi - lo) * rng.uniform(size=(20000, lo.size))
    # pre-activations of the unstable neurons at every sample
    Z, a = [], X
    for k in range(bd.L):
        z = a @ w[k].T + b[k]
        Z.append(z[:, bd.ucols[k]])
        a = np.maximum(z, 0.0) if activation == "relu" else np.where(z >= 0, z, 0.2 * z)
    Zu = np.concatenate(Z, axis=1)
    margin = mlp_forward(w, b, activation, X) @ A.T - bvec
    B = 24
    split = np.zeros((B, bd.nU), np.int8)
    for d in range(B):
        ref = np.sign(Zu[rng.integers(X.shape[0])]).astype(np.int8)
        pick = rng.uniform(size=bd.nU) < rng.uniform(0.1, 0.6)
        split[d, pick] = ref[pick]
    alpha = rng.uniform(bd.leak, 1.0, (B, 2, bd.nU))
    beta = rng.uniform(0.0, 3.0, (B, 2, bd.nU)) * (split != 0)[:, None, :]
    v = bd.evaluate(split, alpha, beta)
    matched = 0
    for d in range(B):
        s = split[d]
        inside = np.all((s == 0) | (np.sign(Zu) == s) | (Zu == 0), axis=1)
        matched += inside.sum()
        if inside.any():
            assert np.all(margin[inside] >= v[d] - 1e-12)
    assert matched > 100
    # beta pulls the bound down on the full box but never below on the subdomain: a
    # nonzero beta changes the bound
    v0 = bd.evaluate(split, alpha, np.zeros_like(beta))
    assert not np.allclose(v0, v)


def test_charge_hook_lowers_bound():
    w, b, x0, lo, hi = _case(2)
    A = np.array([[1.0, -1.0, 0.0]])
    bd = _bounder(w, b, lo, hi, A, np.zeros(1))
    split, alpha, beta = _random_params(bd, np.random.default_rng(3), 2)
    seen = []

    def charge(k, absD):
        seen.append(k)
        return np.full(absD.shape[0], 1e-3)

    v = bd.evaluate(split, alpha, beta)
    vc = bd.evaluate(split, alpha, beta, charge=charge)
    assert sorted(seen) == list(range(bd.L))
    np.testing.assert_allclose(v - vc, 1e-3 * bd.L, rtol=1e-6)


def _exact(w, b, x0, eps, c, t):
    res = exact_margin_min(w, b, x0, c, t, eps, time_limit=30.0)
    assert res.status == "optimal"
    return res


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("branching", ["babsr", "fsb"])
def test_verdicts_against_exact_milp(seed, branching):
    eps = 0.15
    w, b, x0, lo, hi = _case(seed, eps=eps)
    c, t = 0, 1 + seed % 2
    res = _exact(w, b, x0, eps, c, t)
    A = np.zeros((1, 3))
    A[0, c], A[0, t] = 1.0, -1.0  # case: f_c - f_t <= b
    gap = 0.01 * (1.0 + abs(res.value))
    # just true: b below the minimum -> empty case
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.dual_bound - gap]),
                            time.monotonic() + 60, branching=branching, batch=16)
    assert r.verdict == "unsat"  # small nets: decided well within the default cap
    assert r.x is None
    # just false: b above the minimum -> a counterexample exists; found with the root PGD
    # attack and without it (by the corners of the domains' bounds and the leaves' LPs)
    for restarts in (16, 0):
        r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.value + gap]),
                                time.monotonic() + 60, branching=branching, batch=16,
                                attack_restarts=restarts)
        assert r.verdict == "sat"
        assert np.all(r.x >= lo) and np.all(r.x <= hi)
        y = mlp_forward(w, b, "relu", r.x)
        assert y[c] - y[t] <= res.value + gap


def test_two_rows_each_infeasible_alone():
    """A point violates the case only if it meets both rows; with each row's b just below
    that row's minimum no point meets either, so the case is empty (domains may be proven by
    different rows). With the second row's b far away the first row decides (sat)."""
    eps = 0.15
    w, b, x0, lo, hi = _case(11, eps=eps)
    r1 = _exact(w, b, x0, eps, 0, 1)
    r2 = _exact(w, b, x0, eps, 0, 2)
    A = np.array([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]])
    bvec = np.array([r1.dual_bound - 0.01, r2.dual_bound - 0.01])
    r = bab_relu.relu_split(w, b, lo, hi, A, bvec, time.monotonic() + 60, batch=8)
    assert r.verdict == "unsat"
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([r1.value + 0.01, 1e6]),
                            time.monotonic() + 60, batch=8, attack_restarts=0)
    assert r.verdict == "sat"
    y = mlp_forward(w, b, "relu", r.x)
    assert np.all(A @ y <= np.array([r1.value + 0.01, 1e6]))


def test_caps_give_unknown_or_timeout_not_errors():
    eps = 0.3
    w, b, x0, lo, hi = _case(2, eps=eps)
    res = _exact(w, b, x0, eps, 0, 1)
    A = np.array([[1.0, -1.0, 0.0]])
    bvec = np.array([res.dual_bound - 1e-3])
    r = bab_relu.relu_split(w, b, lo, hi, A, bvec, time.monotonic() + 60, max_domains=0)
    assert r.verdict == "unknown"  # the root does not prove it (~5e4 domains needed)
    assert r.domains == 1 and r.x is None
    r = bab_relu.relu_split(w, b, lo, hi, A, bvec, time.monotonic() - 1.0)
    assert r.verdict == "timeout"


def test_no_hidden_layer_and_no_rows():
    rng = np.random.default_rng(0)
    w, b = [rng.standard_normal((3, 4))], [rng.standard_normal(3)]
    lo, hi = -np.ones(4), np.ones(4)
    A = np.array([[1.0, -1.0, 0.0]])
    row = w[0][0] - w[0][1]
    exact_min = -np.abs(row).sum() + b[0][0] - b[0][1]
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([exact_min - 1e-6]), time.monotonic() + 5)
    assert r.verdict == "unsat"
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([exact_min + 1e-6]), time.monotonic() + 5)
    assert r.verdict == "sat"
    r = bab_relu.relu_split(w, b, lo, hi, np.zeros((0, 3)), np.zeros(0), time.monotonic() + 5)
    assert r.verdict == "sat"


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
def test_root_layer_bounds_sound_and_tighter(activation):
    w, b, x0, lo, hi = _case(4, sizes=(6, 30, 30, 30, 3), eps=0.4)
    crown_b = _bounder(w, b, lo, hi, np.zeros((0, 3)), np.zeros(0), activation).bounds
    tight = bab_relu.root_layer_bounds(w, b, lo, hi, activation)
    rng = np.random.default_rng(5)
    X = lo + (hi - lo) * rng.uniform(size=(20000, lo.size))
    X[:64] = np.where(rng.integers(0, 2, (64, lo.size)) == 1, hi, lo)  # corners too
    a = X
    gained = 0.0
    for k, ((l0, u0), (l, u)) in enumerate(zip(crown_b, tight)):
        z = a @ w[k].T + b[k]
        assert np.all(z >= l) and np.all(z <= u)
        assert np.all(l >= l0) and np.all(u <= u0)
        gained += np.sum(l - l0) + np.sum(u0 - u)
        a = np.maximum(z, 0.0) if activation == "relu" else np.where(z >= 0, z, 0.2 * z)
    assert gained > 0.0


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
def test_float32_kernels_match_numpy_path(activation):
    w, b, x0, lo, hi = _case(6, sizes=(6, 20, 20, 20, 3), eps=0.3)
    A = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
    bd = _bounder(w, b, lo, hi, A, np.zeros(2), activation=activation)
    split, alpha, beta = _random_params(bd, np.random.default_rng(9), 5, bd.leak)
    alpha, beta = alpha.astype(np.float32), beta.astype(np.float32)
    v1, s1 = bd.evaluate(split, alpha, beta, np.float32, keep=True)
    g1 = bd.gradient(s1)
    with using_kernels("numpy"):
        v2, s2 = bd.evaluate(split, alpha, beta, np.float32, keep=True)
        g2 = bd.gradient(s2)
    np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)
    for a, c in zip(g1, g2):
        assert np.count_nonzero(c) > 10
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interm", [False, True])
def test_memory_cap_gives_unknown(interm):
    eps = 0.3
    w, b, x0, lo, hi = _case(2, eps=eps)
    res = _exact(w, b, x0, eps, 0, 1)
    A = np.array([[1.0, -1.0, 0.0]])
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.dual_bound - 1e-3]),
                            time.monotonic() + 60, max_memory=20_000, attack_restarts=0,
                            interm=interm, layer_window=0)
    # ~360 bytes per open domain here: the cap (~55 domains) stops the search long before
    # the ~5e4 domains the proof needs; open domains exceed it by at most one batch
    assert r.verdict == "unknown"
    assert r.peak_open <= 20_000 // 300 + 256


def test_float64_bound_charges_product_rounding_on_cancelling_networks():
    """Networks whose products cancel (tests/test_fp64_rounding.py): the float64 bound of a
    domain (no splits, CROWN's slopes) must lie below the exact minimum, which the final
    sums' allowance alone misses."""
    from fractions import Fraction as F

    from crown_cli.engine import dense_crown as crown
    from crown_cli.engine.relaxations import get_relaxation
    from test_fp64_rounding import InputSet, _exact_stable, cancelling_network, exact_chain

    fn = get_relaxation("relu", "crown")
    for seed in range(6):
        W, b, x0, eps, w = cancelling_network(seed)
        lo, hi = x0 - eps, x0 + 0.5 * eps
        bd = _bounder(W, b, lo, hi, np.array([[1.0]]), np.array([0.0]))
        B = 1
        split = np.zeros((B, bd.nU), np.int8)
        alpha = np.zeros((B, 1, bd.nU))
        beta = np.zeros((B, 1, bd.nU))
        val = bd.evaluate(split, alpha, beta, np.float64)[0, 0]
        S = InputSet(x0, box=Box(lo, hi))
        net = crown.Network(W, b)
        assert _exact_stable(net, S)
        _, relax = crown.hidden_layer_bounds(net, *S.args(), fn)
        coef, c = exact_chain(net, relax, [[F(float(v)) for v in w[0]]], [F(0)], -1)[0]
        b_up = float(np.nextafter(0.0, 1.0))
        assert S.covers(val + b_up, coef, c, -1), seed


def _exact_split_bound(bd, split, alpha, beta, pos):
    """The exact rational value of the bound :meth:`Bounder.evaluate` computes for one
    (domain, row) of a batch of one row (``split`` (nU,), ``alpha``, ``beta`` (nU,)): the
    same lines (root chords above, alpha below, split neurons fixed, stable slopes), the same
    multipliers beta, each unstable coefficient on the side the code took (``pos``, per
    hidden layer, from the float64 tape), back-substituted in fractions from the exact
    margin row ``A W[-1]`` and minimised over the box."""
    F = Fraction
    Ws = [[[F(float(v)) for v in row] for row in w] for w in bd.weights]
    bs = [[F(float(v)) for v in v_] for v_ in bd.biases]
    A = [F(float(v)) for v in bd.A[0]]
    lam = [sum((a * r[j] for a, r in zip(A, Ws[-1])), F(0)) for j in range(len(Ws[-1][0]))]
    const = sum((a * v for a, v in zip(A, bs[-1])), F(0)) - F(float(bd.b_up[0]))
    cs, ct = bd.root_chords()
    leak = F(bd.leak)
    for k in range(bd.L - 1, -1, -1):
        o0 = bd.offsets[k]
        where = {int(c): o0 + i for i, c in enumerate(bd.ucols[k])}
        D = []
        for j, v in enumerate(lam):
            q = where.get(j)
            if q is None:
                D.append(v * F(float(bd.stable_slope[k][j])))
            elif split[q] != 0:
                D.append(v * (F(1) if split[q] > 0 else leak) - int(split[q]) * F(float(beta[q])))
            elif pos[k][q - o0]:
                D.append(v * F(float(alpha[q])))
            else:
                D.append(v * F(float(cs[q])))
                const += v * F(float(ct[q]))
        const += sum((d * c for d, c in zip(D, bs[k])), F(0))
        lam = [sum((d * r[i] for d, r in zip(D, Ws[k])), F(0)) for i in range(len(Ws[k][0]))]
    return const + sum((min(v * F(float(l)), v * F(float(h)))
                        for v, l, h in zip(lam, bd.box.lo, bd.box.hi)), F(0))


def _cancel_betas(bd, split, alpha, beta):
    """beta of every split-inactive neuron whose computed coefficient Lu is < 0 set to
    -fl(Lu * leak), layer by last layer (a layer's Lu depends on the later layers' beta only):
    the split step's sum fl(fl(Lu * leak) + beta) is then exactly 0 while the exact one is
    the product's rounding error."""
    beta = beta.copy()
    for k in range(bd.L - 1, -1, -1):
        _, (tape, _, _, _) = bd.evaluate(split[None], alpha[None, None], beta[None, None],
                                         np.float64, keep=True)
        Lu = tape[k][0][0, bd.ucols[k]]
        o0, o1 = bd.offsets[k], bd.offsets[k + 1]
        cancel = (split[o0:o1] < 0) & (Lu < 0.0)
        beta[o0:o1] = np.where(cancel, -(Lu * bd.leak), beta[o0:o1])
    return beta


def _split_case_holds(bd, split, alpha, beta):
    val, (tape, _, _, _) = bd.evaluate(split[None], alpha[None, None], beta[None, None],
                                       np.float64, keep=True)
    pos = [t[1][0] for t in tape]
    exact = _exact_split_bound(bd, split, alpha, beta, pos)
    return Fraction(float(val[0, 0])) <= exact, float(val[0, 0]), exact


def test_leaky_split_multiplier_cancellation_is_charged():
    """A split-inactive leaky ReLU neuron's coefficient is D = fl(fl(Lu * leak) + beta)
    (chain.relax): when beta cancels the product, D is 0 (nothing proportional to |D| is
    charged) while the exact coefficient Lu * leak + beta is the product's rounding error,
    up to u |Lu| leak. Here (leak 0.9, one output row 0.737... whose product with the last
    weight rounds too) the exact bound of the same lines and multipliers is -2.06e-16, and
    the only other charge (the margin row's rounding, gamma_1 |A| |W| Z) is 1.34e-16: the
    float64 bound must charge the product's rounding, u |fl(Lu leak)| Z, to stay below."""
    F = Fraction
    leak, c, w = 0.9, 0.7376249627272775, -1.637272040936716
    bd = _bounder([np.array([[1.0]]), np.array([[w]])], [np.zeros(1), np.zeros(1)],
                          np.array([-1.0]), np.array([0.5]), np.array([[c]]), np.zeros(1),
                          activation="leaky_relu", leak=leak)
    assert bd.nU == 1
    split, alpha = np.array([-1], np.int8), np.array([0.5])
    lam = bd.Lam_top[0, 0]
    beta = np.array([-(lam * leak)])
    assert lam * leak + beta[0] == 0.0  # the computed coefficient cancels exactly
    kappa = F(c) * F(w) * F(leak) + F(float(beta[0]))  # the exact one
    assert kappa > F(float(bd.lam_err[0]))  # beyond the margin row's charge (z = -1)
    ok, val, exact = _split_case_holds(bd, split, alpha, beta)
    assert exact == -kappa - F(float(bd.b_up[0]))  # b_up: 0 rounded up one ulp
    assert ok, (val, float(exact))
    # one hidden layer more (leak 0.9 and the default 0.2), random splits, every
    # split-inactive neuron with Lu < 0 cancelled; the oracle is the bound's own function
    # (within the final sums' allowance, ~1e-9 here)
    for leak in (0.9, 0.2):
        for seed in range(4):
            w_, b_ = random_mlp([3, 5, 4, 1], seed=seed)
            lo, hi = -np.ones(3), np.ones(3)
            bd = _bounder(w_, b_, lo, hi, np.array([[0.7376249627272775]]),
                                  np.zeros(1), activation="leaky_relu", leak=leak)
            rng = np.random.default_rng(seed)
            split = rng.choice(np.array([-1, -1, 0, 1], np.int8), bd.nU)
            alpha = rng.uniform(leak, 1.0, bd.nU)
            beta = _cancel_betas(bd, split, alpha, rng.uniform(0.0, 1.0, bd.nU) * (split != 0))
            ok, val, exact = _split_case_holds(bd, split, alpha, beta)
            assert ok and val > float(exact) - 1e-8, (leak, seed, val, float(exact))


# ------------------------------------------------------------------ per-domain bounds


def _forward_z(w, b, X, activation="relu"):
    """Pre-activations of every hidden layer at the rows of X."""
    Z, a = [], X
    for k in range(len(w) - 1):
        z = a @ w[k].T + b[k]
        Z.append(z)
        a = np.maximum(z, 0.0) if activation == "relu" else np.where(z >= 0, z, 0.2 * z)
    return Z


def _subdomain_range(w, b, lo, hi, bounds, signs, k, j):
    """Exact (min, max) of z_kj over {x in [lo, hi]: sign conditions} by MILP (HiGHS), or None
    if no point meets them. ``bounds``: valid (l, u) per hidden layer (big-M); ``signs``:
    per hidden layer an int array, +1 z >= 0, -1 z <= 0, 0 free. ReLU only."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    d = lo.size
    sizes = [wk.shape[0] for wk in w[:-1]]
    # variables: x, then per layer z_k, a_k, delta_k
    off, at = [], d
    for n in sizes:
        off.append(at)
        at += 3 * n
    nv = at
    vlo, vhi = np.full(nv, -np.inf), np.full(nv, np.inf)
    vlo[:d], vhi[:d] = lo, hi
    integ = np.zeros(nv)
    rows, rlo, rhi = [], [], []

    def row(coef, lb, ub):
        rows.append(coef)
        rlo.append(lb)
        rhi.append(ub)

    prev = np.arange(d)
    for q, n in enumerate(sizes):
        z, a, dl = off[q] + np.arange(n), off[q] + n + np.arange(n), off[q] + 2 * n + np.arange(n)
        l, u = bounds[q]
        vlo[z], vhi[z] = l, u
        vlo[a], vhi[a] = 0.0, np.maximum(u, 0.0)
        vlo[dl], vhi[dl] = 0.0, 1.0
        integ[dl] = 1
        for i in range(n):
            c = np.zeros(nv)
            c[z[i]] = 1.0
            c[prev] = -w[q][i]
            row(c, b[q][i], b[q][i])  # z = W a_prev + b
            s = signs[q][i]
            if u[i] <= 0.0:
                s = -1
            elif l[i] >= 0.0:
                s = 1
            if s != 0:
                vlo[dl[i]] = vhi[dl[i]] = 1.0 if s > 0 else 0.0
            c = np.zeros(nv); c[a[i]] = 1.0; c[z[i]] = -1.0
            row(c, 0.0, np.inf)  # a >= z
            c = np.zeros(nv); c[a[i]] = 1.0; c[dl[i]] = -max(u[i], 0.0)
            row(c, -np.inf, 0.0)  # a <= u delta
            c = np.zeros(nv); c[a[i]] = 1.0; c[z[i]] = -1.0; c[dl[i]] = -min(l[i], 0.0)
            row(c, -np.inf, -min(l[i], 0.0))  # a <= z - l (1 - delta)
        prev = a
    cons = LinearConstraint(np.array(rows), rlo, rhi)
    out = []
    for sign in (1.0, -1.0):
        cost = np.zeros(nv)
        cost[off[k] + j] = sign
        r = milp(cost, constraints=cons, integrality=integ, bounds=Bounds(vlo, vhi),
                 options={"mip_rel_gap": 1e-9})
        if r.status == 2:
            return None
        assert r.status == 0, r.message
        out.append(sign * r.fun)
    return out[0], out[1]


def _split_domains(bd, w, b, lo, hi, rng, n, layers=(0, 1), share=0.5, activation="relu"):
    """Split patterns taken from sampled points' signs (non-empty domains) on the unstable
    neurons of ``layers``."""
    X = lo + (hi - lo) * rng.uniform(size=(n, lo.size))
    Z = _forward_z(w, b, X, activation)
    Zu = np.concatenate([Z[k][:, bd.ucols[k]] for k in range(bd.L)], axis=1)
    split = np.zeros((n, bd.nU), np.int8)
    for d in range(n):
        pick = np.isin(bd.layer_of, layers) & (rng.uniform(size=bd.nU) < share)
        split[d, pick] = np.where(Zu[d, pick] >= 0.0, 1, -1)
    return split


def _slopes_bounder(w, b, lo, hi, A, bvec, activation, slopes, rng):
    """A Bounder whose per-domain bounds use no root slopes (adaptive), the root's optimised
    ones (with the root's bounds), or random ones in [leak, 1] of the same layout."""
    if slopes is None:
        return _bounder(w, b, lo, hi, A, bvec, activation)
    bounds, sl = bab_relu.root_layer_bounds(w, b, lo, hi, activation, slopes=True)
    assert any(e is not None for e in sl)
    if slopes == "random":
        leak = 0.0 if activation == "relu" else 0.2
        sl = [None if e is None else (e[0], rng.uniform(leak, 1.0, e[1].shape)) for e in sl]
    bd = _bounder(w, b, lo, hi, A, bvec, activation, layer_bounds=bounds,
                          layer_slopes=sl)
    assert any(x is not None for x in bd.islopes)
    return bd


def test_interm_slopes_must_match_the_layer_bounds():
    """Root slopes computed for other bounds (other box) are refused with the layer named;
    slopes given without their bounds too (CROWN's bounds number neurons differently)."""
    w, b, x0, lo, hi = _case(24, sizes=(5, 10, 10, 10, 3), eps=0.3)
    bounds, sl = bab_relu.root_layer_bounds(w, b, lo, hi, slopes=True)
    _, other = bab_relu.root_layer_bounds(w, b, lo - 0.2, hi + 0.2, slopes=True)
    with pytest.raises(ValueError, match="layer_slopes: layer [12] does not match"):
        _bounder(w, b, lo, hi, np.zeros((0, 3)), np.zeros(0), layer_bounds=bounds,
                         layer_slopes=other)
    bd = _bounder(w, b, lo, hi, np.zeros((0, 3)), np.zeros(0), layer_bounds=bounds,
                          layer_slopes=sl)
    k = next(k for k, e in enumerate(sl) if e is not None)
    assert bd.islopes[k].shape == (2 * bd.ucols[k].size, bd.offsets[k])
    assert np.all((bd.islopes[k] >= 0.0) & (bd.islopes[k] <= 1.0))


@pytest.mark.parametrize("slopes,opt,warm", [slow_if(True, None, 0, 0.0), ("root", 0, 0.0),
                                             slow_if(True, "random", 0, 0.0),
                                             slow_if(True, None, 3, 0.0),
                                             slow_if(True, "root", 5, 0.0), ("root", 3, 0.5)])
def test_tighten_contains_exact_subdomain_ranges(slopes, opt, warm):
    """The per-domain bounds of every later layer's unstable neurons contain the exact range
    of the pre-activation over the subdomain (MILP), improve on the root's, and a neuron they
    fix (implied split) has that sign on the whole subdomain; with CROWN's adaptive lower
    slopes, the root's optimised ones, or random ones; with ``opt`` steps of optimised
    slopes and split multipliers (:meth:`Bounder.tighten_opt`), narrower than without; with
    ``warm``, from the running start earlier calls left (the second call is checked)."""
    w, b, x0, lo, hi = _case(24, sizes=(5, 10, 10, 10, 3), eps=0.3)
    bd = _slopes_bounder(w, b, lo, hi, np.zeros((0, 3)), np.zeros(0), "relu", slopes,
                         np.random.default_rng(26))
    rng = np.random.default_rng(25)
    split = _split_domains(bd, w, b, lo, hi, rng, 4)
    rl, ru = bd.root_domain_bounds()
    B = split.shape[0]
    s2, dl, du, empty = bd.tighten(split, np.tile(rl, (B, 1)), np.tile(ru, (B, 1)),
                                   np.full(B, -1))
    if opt:
        s0, dl0, du0 = s2, dl, du
        for _ in range(2 if warm else 1):
            s2, dl, du, empty = bd.tighten_opt(split, np.tile(rl, (B, 1)),
                                               np.tile(ru, (B, 1)), np.full(B, -1),
                                               iters=opt, warm=warm)
        if warm:
            a_tab, b_tab = bd._warm[bd.L - 1]
            assert np.all((a_tab >= 0.0) & (a_tab <= 1.0)) and np.all(b_tab >= 0.0)
            assert np.any(b_tab > 0.0)  # the multipliers' start moved off 0
        free = (s0 == 0) & (bd.layer_of >= 1)[None, :]
        assert np.sum((du - dl)[free]) < 0.98 * np.sum((du0 - dl0)[free])
    assert not empty.any()
    assert np.all(dl >= rl) and np.all(du <= ru)
    assert np.sum(ru - du) + np.sum(dl - rl) > 1.0  # splits tightened later layers
    implied = 0
    for d in range(B):
        signs = [np.zeros(wk.shape[0], int) for wk in w[:-1]]
        for q in range(bd.nU):
            k = bd.layer_of[q]
            signs[k][bd.ucols[k][q - bd.offsets[k]]] = split[d, q]
        for q in np.flatnonzero(bd.layer_of >= 1):
            k = bd.layer_of[q]
            lo_ex, hi_ex = _subdomain_range(w, b, lo, hi, bd.bounds, signs, k,
                                            bd.ucols[k][q - bd.offsets[k]])
            tol = 1e-7 * (1.0 + abs(lo_ex) + abs(hi_ex))
            assert dl[d, q] <= lo_ex + tol and du[d, q] >= hi_ex - tol
            if split[d, q] == 0 and s2[d, q] != 0:
                implied += 1
                assert (lo_ex >= -tol) if s2[d, q] > 0 else (hi_ex <= tol)
    assert implied > 0


@pytest.mark.parametrize("activation,slopes,opt,warm", [
    ("relu", None, 0, 0.0), ("leaky_relu", None, 0, 0.0), ("relu", "root", 0, 0.0),
    ("leaky_relu", "random", 0, 0.0), ("relu", "root", 3, 0.0), ("leaky_relu", None, 4, 0.0),
    ("relu", "root", 3, 0.5), ("leaky_relu", None, 3, 1.0)])
def test_tighten_sound_on_samples(activation, slopes, opt, warm):
    """Dense samples: every sample meeting a domain's splits has each pre-activation within
    the domain's bounds; a domain flagged empty has no such sample (random signs, many of
    them contradictory); numba step and numpy twin agree, with or without root slopes; with
    ``opt`` steps of optimised slopes and multipliers (:meth:`Bounder.tighten_opt`) too,
    with ``warm`` from the running start a first call left."""
    w, b, x0, lo, hi = _case(23, sizes=(4, 12, 12, 12, 12, 3), eps=0.5)
    A = np.array([[1.0, -1.0, 0.0], [0.0, -1.0, 1.0]])
    bvec = np.array([0.05, -0.1])
    rng = np.random.default_rng(24)
    bd = _slopes_bounder(w, b, lo, hi, A, bvec, activation, slopes, rng)
    X = lo + (hi - lo) * rng.uniform(size=(40000, lo.size))
    X[:256] = np.where(rng.integers(0, 2, (256, lo.size)) == 1, hi, lo)
    Z = _forward_z(w, b, X, activation)
    Zu = np.concatenate([Z[k][:, bd.ucols[k]] for k in range(bd.L)], axis=1)
    split = np.concatenate([
        _split_domains(bd, w, b, lo, hi, rng, 12, layers=(0, 1, 2), share=0.4,
                       activation=activation),
        (rng.integers(-1, 2, (24, bd.nU)) * (rng.uniform(size=(24, bd.nU)) < 0.7)
         * (bd.layer_of < 2)).astype(np.int8)])
    B = split.shape[0]
    rl, ru = bd.root_domain_bounds()
    start = np.where(np.arange(B) < 12, rng.integers(-1, 2, B), -1)
    s2, dl, du, empty = bd.tighten(split, np.tile(rl, (B, 1)), np.tile(ru, (B, 1)), start)
    with using_kernels("numpy"):  # the numba step's numpy twin
        t2 = bd.tighten(split, np.tile(rl, (B, 1)), np.tile(ru, (B, 1)), start)
    np.testing.assert_array_equal(t2[0], s2)
    np.testing.assert_array_equal(t2[3], empty)
    np.testing.assert_allclose(t2[1], dl, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(t2[2], du, rtol=1e-12, atol=1e-12)
    if opt:
        s0, dl0, du0, empty0 = s2, dl, du, empty
        for _ in range(2 if warm else 1):
            s2, dl, du, empty = bd.tighten_opt(split, np.tile(rl, (B, 1)),
                                               np.tile(ru, (B, 1)), start, iters=opt,
                                               warm=warm)
        assert np.all(empty[empty0])  # a domain tighten finds empty stays so
        ok = ~empty
        free = (s0 == 0) & (dl0 < 0.0) & (du0 > 0.0) & ok[:, None]
        assert np.sum((du - dl)[free]) < np.sum((du0 - dl0)[free])
    matched = 0
    for d in range(B):
        s = split[d]
        inside = np.all((s == 0) | (np.sign(Zu) == s) | (Zu == 0), axis=1)
        if empty[d]:
            assert not inside.any()
            continue
        matched += inside.sum()
        Zi = Zu[inside]
        assert np.all(Zi >= dl[d]) and np.all(Zi <= du[d])
        # an implied split is the sign every matching sample has
        imp = (s == 0) & (s2[d] != 0)
        assert np.all(Zi[:, imp] * s2[d, imp] >= 0.0)
        # layers up to start[d] are not recomputed
        keep = bd.layer_of <= max(start[d], 0)
        assert np.all(dl[d, keep & (s == 0)] == rl[keep & (s == 0)])
    assert matched > 1000
    assert empty.any() and not empty.all()
    # the final rows' bound with the domains' chords (and their implied splits, with beta on
    # them) holds on the matching samples, and is mostly above the root chords' bound (not
    # everywhere: at fixed slopes a narrower chord need not give a higher bound)
    margin = mlp_forward(w, b, activation, X) @ A.T - bvec
    alpha = rng.uniform(bd.leak, 1.0, (B, 2, bd.nU))
    beta = rng.uniform(0.0, 1.0, (B, 2, bd.nU)) * (s2 != 0)[:, None, :]
    ch = bd.chords(dl, du)
    v = bd.evaluate(s2, alpha, beta, chords=ch)
    v_root = bd.evaluate(s2, alpha, beta)
    # (less to gain over root bounds already tightened by alpha, or with random slopes)
    assert np.mean(v[~empty] - v_root[~empty]) > (0.01 if slopes is None else 0.002)
    for d in np.flatnonzero(~empty):
        inside = np.all((split[d] == 0) | (np.sign(Zu) == split[d]) | (Zu == 0), axis=1)
        assert np.all(margin[inside] >= v[d] - 1e-12)
    # the float32 kernels with per-domain chords match the numpy path
    a32, b32 = alpha.astype(np.float32), beta.astype(np.float32)
    v1, st1 = bd.evaluate(s2, a32, b32, np.float32, keep=True, chords=ch)
    g1 = bd.gradient(st1)
    with using_kernels("numpy"):
        v2, st2 = bd.evaluate(s2, a32, b32, np.float32, keep=True, chords=ch)
        g2 = bd.gradient(st2)
    np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)
    for g, h in zip(g1, g2):
        np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-5)


# the largest network with every option in the slow tier; the default keeps it with one
@pytest.mark.parametrize("seed,sizes,eps,window,opt,mins,warm", [
    slow_if(seed == 3 and opts != (0, 0, 0, 0.0), seed, sizes, eps, *opts)
    for seed, sizes, eps in [(1, (5, 8, 12, 8, 3), 0.3), (2, (4, 8, 8, 8, 8, 3), 0.2),
                             (2, (4, 8, 8, 8, 8, 3), 0.3), (3, (6, 12, 10, 10, 10, 3), 0.3)]
    for opts in [(1, 0, 0, 0.0), (0, 0, 0, 0.0), (1, 3, 0, 0.0), (0, 3, 2, 0.0), (0, 3, 0, 0.5)]])
def test_verdicts_with_domain_bounds_against_exact_milp(seed, sizes, eps, window, opt, mins,
                                                        warm):
    """3-4 hidden layers, per-domain hidden-layer bounds (interm), branching in the shallowest
    layer (window 1) or anywhere (0), the per-domain bounds with ``opt`` steps of optimised
    slopes and split multipliers (0: none; from a branching depth of ``mins`` on; ``warm``:
    each from the running start of the domains bounded before): unsat just
    below the exact minimum (tens to hundreds of domains), sat just above."""
    w, b, x0, lo, hi = _case(seed, sizes=sizes, eps=eps)
    c, t = 0, 1 + seed % 2
    res = _exact(w, b, x0, eps, c, t)
    A = np.zeros((1, 3))
    A[0, c], A[0, t] = 1.0, -1.0
    gap = 0.01 * (1.0 + abs(res.value))
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.dual_bound - gap]),
                            time.monotonic() + 60, batch=16, interm=True, layer_window=window,
                            interm_iters=opt, interm_min_splits=mins, interm_warm=warm)
    assert r.verdict == "unsat"
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.value + gap]),
                            time.monotonic() + 60, batch=16, interm=True, layer_window=window,
                            attack_restarts=0, interm_iters=opt, interm_min_splits=mins,
                            interm_warm=warm)
    assert r.verdict == "sat"
    assert np.all(r.x >= lo) and np.all(r.x <= hi)
    y = mlp_forward(w, b, "relu", r.x)
    assert y[c] - y[t] <= res.value + gap


def test_optimise_takes_no_step_after_the_deadline(monkeypatch):
    """With its deadline passed, optimise evaluates once (and once more at the best iterate)
    and takes no gradient step; without one it takes iters - 1 steps and never ends below
    its first evaluation."""
    w, b, x0, lo, hi = _case(3)
    A = np.array([[1.0, 0.0, -1.0]])
    bd = _bounder(w, b, lo, hi, A, np.zeros(1))
    calls = {"evaluate": 0, "gradient": 0}
    evaluate, gradient = bd.evaluate, bd.gradient

    def counted(name, fn):
        def call(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return call

    monkeypatch.setattr(bd, "evaluate", counted("evaluate", evaluate))
    monkeypatch.setattr(bd, "gradient", counted("gradient", gradient))
    split = np.zeros((2, bd.nU), np.int8)
    alpha = np.broadcast_to(bd.initial_alpha(), (2, bd.m, bd.nU)).astype(np.float32)
    beta = np.zeros_like(alpha)
    first = evaluate(split, alpha, beta, np.float32)
    late, _ = bab_relu.optimise(bd, split, alpha.copy(), beta.copy(), iters=10, stop=False,
                                deadline=time.monotonic() - 1.0)
    assert calls == {"evaluate": 2, "gradient": 0}
    np.testing.assert_array_equal(late, first)
    calls.update(evaluate=0, gradient=0)
    full, _ = bab_relu.optimise(bd, split, alpha.copy(), beta.copy(), iters=10, stop=False)
    assert calls == {"evaluate": 11, "gradient": 9}
    assert np.all(full >= first)


def test_optimise_stops_before_a_step_that_would_end_past_the_deadline(monkeypatch):
    """The steps stop where the next one, as long as the last, would end past the deadline
    (not one step after it): on a clock that each evaluation moves by 100 s, a deadline 350 s
    away gets 3 evaluations and 2 gradient steps, then the final evaluation at the best
    iterate ends 50 s past it (a check after the deadline only would take 4 and 3, ending
    150 s past it)."""
    from crown_cli.verification.bab import optimise as opt_module

    w, b, x0, lo, hi = _case(3)
    bd = _bounder(w, b, lo, hi, np.array([[1.0, 0.0, -1.0]]), np.zeros(1))
    calls = {"evaluate": 0, "gradient": 0}
    base = time.monotonic()
    clock = {"t": base}
    evaluate, gradient = bd.evaluate, bd.gradient

    def slow_evaluate(*a, **k):
        calls["evaluate"] += 1
        clock["t"] += 100.0
        return evaluate(*a, **k)

    def counted_gradient(*a, **k):
        calls["gradient"] += 1
        return gradient(*a, **k)

    class FakeTime:
        @staticmethod
        def monotonic():
            return clock["t"]

    monkeypatch.setattr(bd, "evaluate", slow_evaluate)
    monkeypatch.setattr(bd, "gradient", counted_gradient)
    monkeypatch.setattr(opt_module, "time", FakeTime)
    split = np.zeros((1, bd.nU), np.int8)
    alpha = np.broadcast_to(bd.initial_alpha(), (1, bd.m, bd.nU)).astype(np.float32)
    bab_relu.optimise(bd, split, alpha, np.zeros_like(alpha), iters=10, stop=False,
                      deadline=base + 350.0)
    assert calls == {"evaluate": 4, "gradient": 2}
    assert clock["t"] == base + 400.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cases_decided_jointly_match_the_milp(seed):
    """Several cases (a disjunction) in one search (``groups``), 3 hidden layers (per-domain
    bounds on): every case just true gives unsat; one case just false gives sat with a point
    that violates that case, found by the search itself (no attack)."""
    eps = 0.2
    w, b, x0, lo, hi = _case(seed + 30, sizes=(5, 12, 12, 12, 4), eps=eps)
    c = int(np.argmax(mlp_forward(w, b, "relu", x0)))
    others = [t for t in range(4) if t != c]
    res = {t: _exact(w, b, x0, eps, c, t) for t in others}
    A = np.zeros((3, 4))
    for i, t in enumerate(others):
        A[i, c], A[i, t] = 1.0, -1.0
    groups = np.arange(3)
    gap = {t: 0.01 * (1.0 + abs(res[t].value)) for t in others}
    true_b = np.array([res[t].dual_bound - gap[t] for t in others])
    r = bab_relu.relu_split(w, b, lo, hi, A, true_b, time.monotonic() + 60, groups=groups,
                            batch=16, attack_restarts=0)
    assert r.verdict == "unsat"
    for i, t in enumerate(others):
        bvec = true_b.copy()
        bvec[i] = res[t].value + gap[t]
        r = bab_relu.relu_split(w, b, lo, hi, A, bvec, time.monotonic() + 60, groups=groups,
                                batch=16, attack_restarts=0)
        assert r.verdict == "sat"
        assert np.all(r.x >= lo) and np.all(r.x <= hi)
        y = mlp_forward(w, b, "relu", r.x)
        assert y[c] - y[t] <= bvec[i]  # the only case that can be violated
    # the same cases one at a time agree
    for i, t in enumerate(others):
        r = bab_relu.relu_split(w, b, lo, hi, A[i:i + 1], true_b[i:i + 1],
                                time.monotonic() + 60, batch=16, attack_restarts=0)
        assert r.verdict == "unsat"


def test_case_groups_score_and_unsafe_set():
    w, b, x0, lo, hi = _case(3)
    A = np.array([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])
    bd = _bounder(w, b, lo, hi, A, np.zeros(3), groups=[0, 0, 1])
    v = np.array([[-1.0, 2.0, -3.0], [1.0, -1.0, 0.5], [np.nan, 1.0, 1.0]])
    # case 0 (rows 0, 1) needs one row > 0, case 1 (row 2) its row; the worst case counts
    # a NaN row bound never proves (a numerical failure: no proof even beside a good row)
    np.testing.assert_array_equal(bd.score(v), [-3.0, 0.5, np.nan])
    assert not bd.score(v)[2] > 0.0
    np.testing.assert_array_equal(bd.score_row(v[:2]), [2, 2])
    Y = np.array([[0.0, 1.0, 2.0], [3.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    # unsafe: (y0 <= y1 and y0 <= y2) or (y1 <= y2); the shared check on a network whose
    # outputs are its inputs
    big = np.full(3, 10.0)
    got = violations([np.eye(3)], [np.zeros(3)], "relu", None, -big, big, A, np.zeros(3), Y,
                     bd.gstart)
    np.testing.assert_array_equal(got, [True, False, True])
    with pytest.raises(ValueError, match="groups"):
        _bounder(w, b, lo, hi, A, np.zeros(3), groups=[0, 1, 0])


def test_blend_matches_a_loop():
    """tighten_opt's running start: per row r, tab[r] moves by w towards the mean of the
    entries of row r (masked: per element over the entries where the mask holds; elements
    no entry covers, and rows with no entry, keep their value); twin: a plain loop."""
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 7, 40)
    rows[rows == 3] = 4  # row 3 has no entry
    X = rng.normal(size=(40, 5))
    mask = rng.uniform(size=(40, 5)) < 0.3
    for m in (None, mask):
        tab = rng.normal(size=(7, 5))
        ref = tab.copy()
        for r in range(7):
            for j in range(5):
                sel = (rows == r) & (True if m is None else m[:, j])
                if sel.any():
                    ref[r, j] = 0.7 * ref[r, j] + 0.3 * X[sel, j].mean()
        domain_bounds._blend(tab, rows, X, m, 0.3)
        np.testing.assert_allclose(tab, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("warm", [-0.1, 1.5])
def test_interm_warm_out_of_range_is_refused(warm):
    w, b, x0, lo, hi = _case(3)
    with pytest.raises(ValueError, match="interm_warm must lie in"):
        bab_relu.relu_split(w, b, lo, hi, np.array([[1.0, 0.0, -1.0]]), np.zeros(1),
                            time.monotonic() + 5, interm_warm=warm)


@pytest.mark.parametrize("opt", [0, 3])
def test_tighten_max_width_skips_wide_layers_and_stays_sound(opt):
    """``max_width``: a hidden layer wider than it keeps the bounds given (its split
    neurons only take their sign); the narrower later layer is still recomputed, tighter
    than the root's on some domain, and contains the exact range over each subdomain
    (MILP), with CROWN (``opt`` 0) or optimised rows."""
    w, b, x0, lo, hi = _case(27, sizes=(5, 8, 14, 8, 3), eps=0.3)
    bd = _slopes_bounder(w, b, lo, hi, np.zeros((0, 3)), np.zeros(0), "relu", "root",
                         np.random.default_rng(27))
    split = _split_domains(bd, w, b, lo, hi, np.random.default_rng(28), 4, layers=(0, 1))
    rl, ru = bd.root_domain_bounds()
    B = split.shape[0]
    args = (split, np.tile(rl, (B, 1)), np.tile(ru, (B, 1)), np.full(B, -1))
    s2, dl, du, empty = (bd.tighten(*args, max_width=10) if opt == 0 else
                         bd.tighten_opt(*args, iters=opt, max_width=10))
    assert not empty.any()
    wide = bd.layer_of == 1
    assert w[1].shape[0] == 14 and wide.any()
    signed_l = np.where(split > 0, np.maximum(rl, 0.0), rl)
    signed_u = np.where(split < 0, np.minimum(ru, 0.0), ru)
    np.testing.assert_array_equal(dl[:, wide], signed_l[:, wide])
    np.testing.assert_array_equal(du[:, wide], signed_u[:, wide])
    last = bd.layer_of == 2
    assert np.sum((ru - du)[:, last]) + np.sum((dl - rl)[:, last]) > 1e-3
    assert np.all(dl >= rl) and np.all(du <= ru)
    for d in range(B):
        signs = [np.zeros(wk.shape[0], int) for wk in w[:-1]]
        for q in range(bd.nU):
            k = bd.layer_of[q]
            signs[k][bd.ucols[k][q - bd.offsets[k]]] = split[d, q]
        for q in np.flatnonzero(last):
            j = bd.ucols[2][q - bd.offsets[2]]
            lo_ex, hi_ex = _subdomain_range(w, b, lo, hi, bd.bounds, signs, 2, j)
            tol = 1e-7 * (1.0 + abs(lo_ex) + abs(hi_ex))
            assert dl[d, q] <= lo_ex + tol and du[d, q] >= hi_ex - tol


def test_wide_network_defaults_against_exact_milp(monkeypatch):
    """On a network with a hidden layer wider than ``INTERM_MAX_WIDTH`` (lowered here to 10)
    the search recomputes per domain only the narrower layers, by CROWN (no optimised
    rows), adds single-neuron cuts, and still decides: unsat just below the exact minimum,
    sat just above."""
    monkeypatch.setattr(bab_relu, "INTERM_MAX_WIDTH", 10)
    seen = []
    tighten = bab_relu.Bounder.tighten

    def spy(self, *a, **k):
        seen.append(k.get("max_width"))
        return tighten(self, *a, **k)

    def no_opt(self, *a, **k):
        raise AssertionError("tighten_opt runs by default on a wide network")

    monkeypatch.setattr(bab_relu.Bounder, "tighten", spy)
    monkeypatch.setattr(bab_relu.Bounder, "tighten_opt", no_opt)
    separated = []  # single-neuron cuts are on by default there
    from crown_cli.verification.bab import cuts as cuts_mod

    sep = cuts_mod.separate_neuron_cuts

    def sep_spy(*a, **k):
        out = sep(*a, **k)
        separated.extend(out)
        return out

    monkeypatch.setattr(cuts_mod, "separate_neuron_cuts", sep_spy)
    w, b, x0, lo, hi = _case(2, sizes=(4, 8, 14, 8, 3), eps=0.3)
    c, t = 0, 1
    res = _exact(w, b, x0, 0.3, c, t)
    A = np.zeros((1, 3))
    A[0, c], A[0, t] = 1.0, -1.0
    gap = 0.01 * (1.0 + abs(res.value))
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.dual_bound - gap]),
                            time.monotonic() + 60, batch=16)
    assert r.verdict == "unsat" and r.domains > 1
    assert seen and set(seen) == {10}
    assert separated
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.value + gap]),
                            time.monotonic() + 60, batch=16, attack_restarts=0)
    assert r.verdict == "sat"
    y = mlp_forward(w, b, "relu", r.x)
    assert np.all(r.x >= lo) and np.all(r.x <= hi) and y[c] - y[t] <= res.value + gap


def test_float32_steering_overflow_is_quiet_and_its_gradient_finite():
    # multipliers near float32's largest value overflow the steering bound's products (the
    # intermittent 'invalid value encountered in matmul' of CI runs came from such float32
    # evaluations): no warning, and the gradient Adam steps with is finite
    w, b, x0, lo, hi = _case(1)
    bd = _bounder(w, b, lo, hi, np.eye(3)[:2] - np.eye(3)[2], np.zeros(2))
    split, alpha, beta = _random_params(bd, np.random.default_rng(0), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, state = bd.evaluate(split, alpha, beta * 3e38, np.float32, keep=True)
        gA, gB = bd.gradient(state)
    assert np.isfinite(gA).all() and np.isfinite(gB).all()


def test_branch_scores_of_a_neuron_with_an_infinite_bound_are_not_nan():
    """BaBSR's lower-line gap max(-(alpha - leak) l, (1 - alpha) u) at alpha = leak (or 1)
    and an infinite l (or u) is the other side's gap, not 0 * inf = NaN (which sorts last
    and left the neuron unsplit)."""
    from types import SimpleNamespace

    from crown_cli.verification.bab.branching import branch_scores

    l = np.array([-np.inf, -1.0, -2.0])
    u = np.array([1.0, np.inf, 3.0])
    bd = SimpleNamespace(m=1, nU=3, L=1, offsets=[0, 3], ucols=[np.arange(3)], leak=0.0,
                         bounds=[(l, u)])
    Lu = np.array([[2.0, 1.0, 1.0]])
    state = (([Lu],), np.zeros((1, 1)), None, np.zeros((1, 3)))
    alpha = np.array([[[0.0, 1.0, 0.5]]])
    sc = branch_scores(bd, state, np.zeros((1, 3)), alpha, np.array([0]))
    assert not np.isnan(sc).any()
    assert np.allclose(sc[0], [2.0 * 1.0, 1.0 * 1.0, 1.0 * max(0.5 * 2.0, 0.5 * 3.0)])
