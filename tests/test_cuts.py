"""Cutting planes of ReLU splitting (crown_cli.verification.bab.cuts): the line of one neuron
with a cut coefficient in exact arithmetic, the float64 bound with cuts against an exact MILP
that holds the cuts and splits as constraints, its gradient, and the search with cuts against
the MILP's verdicts."""
from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from conftest import slow_if
from crown_cli.verification.bab import relu_split as bab_relu
from crown_cli.verification.bab.cuts import Cuts, cut_lines, evaluate_cuts, weaker_sets
from oracles import random_mlp


def _bounder(sizes=(4, 8, 8, 3), seed=0, eps=0.4, A=None):
    w, b = random_mlp(list(sizes), seed=seed)
    rng = np.random.default_rng(seed + 7)
    x0 = rng.uniform(-1.0, 1.0, sizes[0])
    if A is None:
        A = np.array([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]])
    bd = bab_relu.Bounder(bab_relu.ReluSplitProblem(w, b, x0 - eps, x0 + eps, A,
                                                    np.zeros(A.shape[0])))
    return bd


def _states(bd, X):
    """The unstable neurons' states (+1 active, -1 inactive) at the points X (n, d)."""
    h, out = X, []
    for k in range(bd.L):
        pre = h @ bd.weights[k].T + bd.biases[k]
        out.append(np.where(pre[:, bd.ucols[k]] >= 0.0, 1, -1))
        h = np.maximum(pre, 0.0)
    return np.concatenate(out, axis=1).astype(np.int8)


def _random_cuts(bd, rng, n, X=None):
    """n cuts of 1-3 decisions; with points X, only cuts every point meets."""
    cuts = Cuts(bd.nU)
    st = None if X is None else _states(bd, X)
    while len(cuts) < n:
        s = np.zeros(bd.nU, np.int8)
        j = rng.choice(bd.nU, size=min(bd.nU, rng.integers(1, 4)), replace=False)
        s[j] = rng.choice([-1, 1], size=j.size)
        if st is not None and not np.all(np.any(st[:, j] != s[j], axis=1)):
            continue
        cuts.add(s)
    return cuts


def _milp_min(bd, split_row, cuts, row):
    """min of row ``row`` of A f(x) - b_up over the box's points whose neuron states meet
    ``split_row`` and every cut (big-M MILP on the bounder's root bounds, scipy HiGHS);
    None when infeasible."""
    d = bd.box.lo.size
    lo, hi = list(bd.box.lo), list(bd.box.hi)
    integ = [0] * d
    rows = []  # (dict col -> coef, lb, ub)
    prev = list(range(d))
    vcols = list(range(d))  # the input's and every hidden neuron's value, in layer order
    zcol = {}
    g = 0
    for k in range(bd.L):
        W, b = bd.weights[k], bd.biases[k]
        l, u = bd.bounds[k]
        ycols = []
        for j in range(W.shape[0]):
            y = len(lo)
            lo.append(0.0)
            hi.append(max(float(u[j]), 0.0))
            integ.append(0)
            ycols.append(y)
            pre = {c: -W[j, i] for i, c in enumerate(prev)}
            if u[j] <= 0.0:
                hi[y] = 0.0
            elif l[j] >= 0.0:
                rows.append(({y: 1.0, **pre}, b[j], b[j]))
            else:
                z = len(lo)
                gi = g
                g += 1
                sv = split_row[gi]
                lo.append(1.0 if sv > 0 else 0.0)
                hi.append(0.0 if sv < 0 else 1.0)
                integ.append(1)
                zcol[gi] = z
                rows.append(({y: 1.0, **pre}, b[j], np.inf))
                rows.append(({y: 1.0, z: -u[j]}, -np.inf, 0.0))
                rows.append(({y: 1.0, **pre, z: -l[j]}, -np.inf, b[j] - l[j]))
        prev = ycols
        vcols += ycols
    assert g == bd.nU
    for kk in range(len(cuts)):
        coef = {zcol[j]: cuts.K[kk, j] for j in np.flatnonzero(cuts.K[kk])}
        if cuts.P is not None:
            Pk = cuts.P.toarray()[kk]
            for j in np.flatnonzero(Pk):
                coef[vcols[j]] = coef.get(vcols[j], 0.0) + Pk[j]
        rows.append((coef, -np.inf, -cuts.e[kk]))
    n = len(lo)
    Amat = np.zeros((len(rows), n))
    lb, ub = np.zeros(len(rows)), np.zeros(len(rows))
    for i, (coef, a, bb) in enumerate(rows):
        for c, v in coef.items():
            Amat[i, c] += v
        lb[i], ub[i] = a, bb
    cost = np.zeros(n)
    cost[prev] = bd.Lam_top[row]
    res = milp(cost, constraints=[LinearConstraint(Amat, lb, ub)], integrality=np.array(integ),
               bounds=Bounds(np.array(lo), np.array(hi)),
               options={"mip_rel_gap": 1e-9, "time_limit": 60})
    if res.status == 2 or res.x is None:
        return None
    assert res.status == 0
    return res.fun + bd.const_top[row]


def _vertices_value(a, c, s, b, l, u, x, y, z):
    return a * y + c * z - (s * x + b)


def test_cut_line_is_below_the_neuron_in_exact_arithmetic():
    """s x + b <= a y + c z at the 4 vertices of one ReLU's exact relaxation, in rational
    arithmetic on the floats cut_lines used, for random and extreme coefficients; with c = 0
    the line is CROWN's."""
    rng = np.random.default_rng(0)
    n = 4000
    a = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
    c = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
    c[::7] = 0.0
    a[::11] = 0.0
    l = -np.abs(rng.standard_normal(n)) * 10.0 ** rng.integers(-5, 3, n)
    u = np.abs(rng.standard_normal(n)) * 10.0 ** rng.integers(-5, 3, n)
    t = rng.uniform(0.0, 1.0, n)
    t[::5] = 0.0
    t[::6] = 1.0
    s, bcut, piece, lo_s, hi_s = cut_lines(a, c, t, l, u, True)
    for i in range(n):
        F = Fraction
        ai, ci, si, bi, li, ui = (F(float(v)) for v in (a[i], c[i], s[i], bcut[i], l[i], u[i]))
        for x, y, z in ((li, F(0), F(0)), (F(0), F(0), F(0)), (F(0), F(0), F(1)),
                        (ui, ui, F(1))):
            assert _vertices_value(ai, ci, si, bi, li, ui, x, y, z) >= 0, (i, x, y, z)
    # c = 0: CROWN's lines (slope t a for a >= 0, the chord below 0)
    z = c == 0.0
    chord = u / (u - l)
    want = np.where(a >= 0.0, t * a, a * chord)
    assert np.allclose(s[z], want[z], rtol=1e-12, atol=1e-300)


def test_cut_line_is_tight_where_the_relaxation_touches():
    """The estimate's intercept is h(0) and both ends of the slope range touch h at l or u."""
    rng = np.random.default_rng(1)
    a, c = rng.standard_normal(200), rng.standard_normal(200)
    l, u = -rng.uniform(0.1, 2, 200), rng.uniform(0.1, 2, 200)
    for t in (0.0, 1.0):
        s, h0, piece, lo_s, hi_s = cut_lines(a, c, np.full(200, t), l, u, False)
        h0_exact = np.minimum(np.minimum(0.0, c), (a * u + c) * (-l) / (u - l))
        assert np.allclose(h0, h0_exact)
        assert np.all(lo_s <= hi_s + 1e-12)
        end = np.where(t == 0.0, s * l + h0, s * u + h0)  # the line at l (t 0) or u (t 1)
        h_end = 0.0 if t == 0.0 else a * u + c
        assert np.allclose(end, h_end)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bound_with_cuts_is_below_the_milp_with_them(seed):
    """Random cuts (valid or not: the Lagrangian bounds the problem that holds them), random
    multipliers, slopes, splits and split multipliers: every float64 row bound is at most the
    exact MILP minimum over the box's points meeting the splits and the cuts."""
    bd = _bounder(seed=seed)
    assert bd.nU >= 6
    rng = np.random.default_rng(seed)
    B = 4
    X = rng.uniform(bd.box.lo, bd.box.hi, (B, bd.box.lo.size))
    bd.cuts = _random_cuts(bd, rng, 4, X)  # every X meets them: the MILPs are feasible
    st = _states(bd, X)
    split = np.zeros((B, bd.nU), np.int8)
    for i in range(1, B - 1):  # decisions X[i] meets
        j = rng.choice(bd.nU, size=2 * i, replace=False)
        split[i, j] = st[i, j]
    split[B - 1] = st[B - 1]  # every neuron split: each cut's term a constant
    alpha = rng.uniform(0.0, 1.0, (B, bd.m, bd.nU))
    beta = rng.uniform(0.0, 2.0, (B, bd.m, bd.nU)) * (split != 0)[:, None, :]
    checked = 0
    for scale in (0.0, 0.3, 3.0):
        mu = rng.uniform(0.0, scale, (B, bd.m, len(bd.cuts)))
        v = bd.evaluate(split, alpha, beta, np.float64, mu=mu)
        for i in range(B):
            for r in range(bd.m):
                exact = _milp_min(bd, split[i], bd.cuts, r)
                if exact is not None:
                    assert v[i, r] <= exact + 1e-12 * (1 + abs(exact)), (i, r, v[i, r], exact)
                    checked += 1
    assert checked == 3 * B * bd.m


def test_bound_without_multipliers_is_the_plain_bound():
    """mu = 0: the cut path's float64 bound equals Bounder.evaluate's within the cut lines'
    extra rounding allowance; its float32 estimate equals the plain estimate's."""
    bd = _bounder(seed=3)
    rng = np.random.default_rng(3)
    bd.cuts = _random_cuts(bd, rng, 3)
    split = rng.integers(-1, 2, (3, bd.nU)).astype(np.int8)
    alpha = rng.uniform(0.0, 1.0, (3, bd.m, bd.nU))
    beta = rng.uniform(0.0, 1.0, (3, bd.m, bd.nU)) * (split != 0)[:, None, :]
    mu = np.zeros((3, bd.m, 3))
    plain = bd.evaluate(split, alpha, beta, np.float64)
    cut = bd.evaluate(split, alpha, beta, np.float64, mu=mu)
    assert np.all(cut <= plain + 1e-12)
    assert np.allclose(cut, plain, rtol=0, atol=1e-9)
    p32 = bd.evaluate(split, alpha.astype(np.float32), beta.astype(np.float32), np.float32)
    c32 = evaluate_cuts(bd, split, alpha.astype(np.float32), beta.astype(np.float32), mu,
                        np.float32)
    assert np.allclose(c32, p32, rtol=1e-5, atol=1e-5)


def test_gradient_with_cuts_matches_finite_differences():
    bd = _bounder(seed=4)
    rng = np.random.default_rng(4)
    bd.cuts = _random_cuts(bd, rng, 3)
    B = 2
    split = np.zeros((B, bd.nU), np.int8)
    split[1, :2] = [1, -1]
    alpha = rng.uniform(0.1, 0.9, (B, bd.m, bd.nU))
    beta = rng.uniform(0.1, 1.0, (B, bd.m, bd.nU)) * (split != 0)[:, None, :]
    mu = rng.uniform(0.1, 1.0, (B, bd.m, 3))

    def f(a, be, m_):
        return evaluate_cuts(bd, split, a, be, m_, np.float64, keep=False, verified=False).sum()

    _, state = evaluate_cuts(bd, split, alpha, beta, mu, np.float64, keep=True,
                             verified=False)
    gA, gB, gM = bd.gradient(state)
    h = 1e-6
    checked = 0
    for name, P, g in (("alpha", alpha, gA), ("beta", beta, gB), ("mu", mu, gM)):
        g = g.reshape(P.shape)
        for idx in list(np.ndindex(P.shape))[::3]:
            if name == "beta" and split[idx[0], idx[2]] == 0:
                continue
            Pp, Pm = P.copy(), P.copy()
            Pp[idx] += h
            Pm[idx] -= h
            args_p = {"alpha": (Pp, beta, mu), "beta": (alpha, Pp, mu), "mu": (alpha, beta, Pp)}
            args_m = {"alpha": (Pm, beta, mu), "beta": (alpha, Pm, mu), "mu": (alpha, beta, Pm)}
            fd = (f(*args_p[name]) - f(*args_m[name])) / (2 * h)
            assert abs(fd - g[idx]) <= 1e-5 * (1 + abs(fd)), (name, idx, fd, g[idx])
            checked += 1
    assert checked > 20


def test_cuts_container_and_weaker_sets():
    cuts = Cuts(5, cap=2)
    s = np.array([1, 0, -1, 0, 0], np.int8)
    assert cuts.add(s) and not cuts.add(s) and not cuts.add(np.zeros(5, np.int8))
    assert cuts.K.tolist() == [[1, 0, -1, 0, 0]] and cuts.e.tolist() == [0.0]
    dom = np.array([[1, 1, -1, 0, 0], [1, 0, 1, 0, 0], [1, 0, 0, 0, 0]], np.int8)
    assert cuts.contains(dom).tolist() == [True, False, False]
    cuts.add(np.array([0, 1, 0, 0, 0], np.int8))
    cuts.add(np.array([0, 0, 0, 1, 1], np.int8))  # cap 2: the first one goes
    assert len(cuts) == 2 and cuts.e.tolist() == [0.0, -1.0]
    assert cuts.contains(dom).tolist() == [True, False, False]
    out = weaker_sets(np.array([1, -1, 1, 1, 0], np.int8), np.array([0.5, 0, 0, 2.0, 0]),
                      depth_order=[0, 1, 2, 3], keep_last=2)
    assert [o.tolist() for o in out] == [[1, 0, 0, 1, 0], [0, 0, 1, 1, 0]]


def test_fully_split_domain_adds_the_cuts_term_exactly():
    """On a domain with every unstable neuron split, z is fixed: the bound with cuts is the
    plain bound plus mu . (K z + e) (within rounding), whatever the signs of the terms."""
    bd = _bounder(seed=5)
    rng = np.random.default_rng(5)
    bd.cuts = _random_cuts(bd, rng, 5)
    split = rng.choice(np.array([-1, 1], np.int8), (4, bd.nU))
    alpha = rng.uniform(0.0, 1.0, (4, bd.m, bd.nU))
    beta = rng.uniform(0.0, 1.0, (4, bd.m, bd.nU))
    mu = rng.uniform(0.0, 2.0, (4, bd.m, len(bd.cuts)))
    plain = bd.evaluate(split, alpha, beta, np.float64)
    cut = bd.evaluate(split, alpha, beta, np.float64, mu=mu)
    z = (split > 0).astype(np.float64)
    term = np.einsum("bmk,bk->bm", mu, z @ bd.cuts.K.T + bd.cuts.e)
    assert np.abs(term).max() > 0.5
    assert np.allclose(cut, plain + term, rtol=0, atol=1e-8)


@pytest.mark.parametrize("seed,kind,point", [(2, "neurons", "plain"), (2, "neurons", "cuts"),
                                             slow_if(True, 2, "decisions", "plain"),
                                             slow_if(True, 4, "both", "plain")])
def test_search_with_cuts_matches_the_milp_and_infers_cuts(seed, kind, point):
    """ReLU splitting with cuts of each kind (neuron cuts separated at either relaxed point):
    b just below the exact minimum is unsat, just above it sat with a real counterexample;
    on the unsat search cuts were added."""
    import time

    from oracles import exact_margin_min, mlp_forward

    sizes, eps = (6, 20, 20, 3), 0.3
    w, b = random_mlp(list(sizes), seed=seed)
    x0 = np.random.default_rng(seed + 100).uniform(-1.0, 1.0, sizes[0])
    lo, hi = x0 - eps, x0 + eps
    res = exact_margin_min(w, b, x0, 0, 1, eps, time_limit=30.0)
    assert res.status == "optimal"
    A = np.array([[1.0, -1.0, 0.0]])
    gap = 0.01 * (1.0 + abs(res.value))
    lines = []
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.dual_bound - gap]),
                            time.monotonic() + 60, batch=8, cuts=64, cut_checks=8,
                            cut_kinds=kind, cut_point=point, log=lines.append)
    assert r.verdict == "unsat"
    assert r.domains > 100  # a search, not the root
    last = lines[-1].split()
    assert last[0] == "cuts:" and int(last[1]) > 0, lines[-1]
    r = bab_relu.relu_split(w, b, lo, hi, A, np.array([res.value + gap]),
                            time.monotonic() + 60, batch=8, cuts=64, cut_checks=8,
                            cut_kinds=kind, cut_point=point, attack_restarts=0)
    assert r.verdict == "sat"
    assert np.all(r.x >= lo) and np.all(r.x <= hi)
    y = mlp_forward(w, b, "relu", r.x)
    assert y[0] - y[1] <= res.value + gap


def _values(bd, X):
    """The input and every hidden neuron's output at the points X (n, d), in layer order."""
    h, out = X, [X]
    for k in range(bd.L):
        h = np.maximum(h @ bd.weights[k].T + bd.biases[k], 0.0)
        out.append(h)
    return np.concatenate(out, axis=1)


def _general_cuts(bd, rng, n_random, X):
    """Cuts with terms on the neurons' values: Anderson et al.'s single-neuron inequality for
    random unstable neurons and input subsets (valid everywhere), and random cuts every point
    of X meets."""
    d = bd.box.lo.size
    hoff = np.cumsum([d] + [w.shape[0] for w in bd.weights[:-1]])
    cuts = Cuts(bd.nU, cap=64, n_terms=int(hoff[-1]))
    for k in range(bd.L):
        lo_in = bd.box.lo if k == 0 else np.maximum(bd.bounds[k - 1][0], 0.0)
        hi_in = bd.box.hi if k == 0 else np.maximum(bd.bounds[k - 1][1], 0.0)
        base = 0 if k == 0 else hoff[k - 1]
        for t, j in enumerate(bd.ucols[k][:3]):
            w, b0 = bd.weights[k][j], bd.biases[k][j]
            Lb, Ub = np.where(w >= 0, lo_in, hi_in), np.where(w >= 0, hi_in, lo_in)
            inI = rng.random(w.size) < 0.5
            p = np.zeros(cuts.P.shape[1])
            p[hoff[k] + j] = 1.0
            p[base + np.flatnonzero(inI)] = -w[inI]
            kz = np.zeros(bd.nU)
            kz[bd.offsets[k] + t] = -(np.sum(w[inI] * Lb[inI]) + b0 + np.sum(w[~inI] * Ub[~inI]))
            cuts.add_general(p, kz, np.sum(w[inI] * Lb[inI]))
    V, Z = _values(bd, X), (_states(bd, X) > 0).astype(np.float64)
    for _ in range(n_random):
        p = rng.standard_normal(cuts.P.shape[1]) * (rng.random(cuts.P.shape[1]) < 0.2)
        kz = rng.standard_normal(bd.nU) * (rng.random(bd.nU) < 0.3)
        cuts.add_general(p, kz, -np.max(V @ p + Z @ kz) - 0.01)
    return cuts


@pytest.mark.parametrize("seed", [0, 1])
def test_bound_with_general_cuts_is_below_the_milp_with_them(seed):
    """Cuts with terms on the input and the hidden neurons' values (single-neuron convex-hull
    inequalities and random cuts sampled points meet), random multipliers: every float64
    bound is at most the exact MILP minimum with the cuts and splits as constraints."""
    bd = _bounder(seed=seed)
    rng = np.random.default_rng(seed + 20)
    B = 3
    X = rng.uniform(bd.box.lo, bd.box.hi, (B, bd.box.lo.size))
    bd.cuts = _general_cuts(bd, rng, 3, X)
    assert len(bd.cuts) >= 6
    st = _states(bd, X)
    split = np.zeros((B, bd.nU), np.int8)
    j = rng.choice(bd.nU, size=3, replace=False)
    split[1, j] = st[1, j]
    split[2] = st[2]
    alpha = rng.uniform(0.0, 1.0, (B, bd.m, bd.nU))
    beta = rng.uniform(0.0, 2.0, (B, bd.m, bd.nU)) * (split != 0)[:, None, :]
    checked = 0
    for scale in (0.3, 3.0):
        mu = rng.uniform(0.0, scale, (B, bd.m, len(bd.cuts)))
        v = bd.evaluate(split, alpha, beta, np.float64, mu=mu)
        for i in range(B):
            for r in range(bd.m):
                exact = _milp_min(bd, split[i], bd.cuts, r)
                assert exact is not None
                assert v[i, r] <= exact + 1e-12 * (1 + abs(exact)), (i, r, v[i, r], exact)
                checked += 1
    assert checked == 2 * B * bd.m


def test_gradient_with_general_cuts_matches_finite_differences():
    bd = _bounder(seed=6)
    rng = np.random.default_rng(6)
    X = rng.uniform(bd.box.lo, bd.box.hi, (2, bd.box.lo.size))
    bd.cuts = _general_cuts(bd, rng, 2, X)
    split = np.zeros((2, bd.nU), np.int8)
    split[1, :2] = [1, -1]
    alpha = rng.uniform(0.1, 0.9, (2, bd.m, bd.nU))
    beta = rng.uniform(0.1, 1.0, (2, bd.m, bd.nU)) * (split != 0)[:, None, :]
    mu = rng.uniform(0.1, 1.0, (2, bd.m, len(bd.cuts)))
    _, state = evaluate_cuts(bd, split, alpha, beta, mu, np.float64, keep=True, verified=False)
    gM = bd.gradient(state)[2].reshape(mu.shape)
    h = 1e-6
    for idx in list(np.ndindex(mu.shape))[::2]:
        Pp, Pm = mu.copy(), mu.copy()
        Pp[idx] += h
        Pm[idx] -= h
        fd = (evaluate_cuts(bd, split, alpha, beta, Pp, np.float64, verified=False).sum()
              - evaluate_cuts(bd, split, alpha, beta, Pm, np.float64, verified=False).sum()) / (2 * h)
        assert abs(fd - gM[idx]) <= 1e-5 * (1 + abs(fd)), (idx, fd, gM[idx])


def test_float32_bound_and_gradient_follow_float64():
    """The search steers in float32: the cut path's float32 bound and its gradient (the
    cuts' sparse K and P blocks, the float32 weights) equal the float64 ones (unrounded)
    to float32 accuracy, and come out as float32."""
    bd = _bounder(seed=9, eps=0.15)
    assert 0 < bd.ucols[0].size < 8 and 0 < bd.ucols[1].size < 8  # stable neurons too
    rng = np.random.default_rng(8)
    X = rng.uniform(bd.box.lo, bd.box.hi, (2, bd.box.lo.size))
    bd.cuts = _general_cuts(bd, rng, 2, X)
    for row in rng.integers(-1, 2, (2, bd.nU)):
        bd.cuts.add(row)
    split = np.zeros((2, bd.nU), np.int8)
    split[1, :2] = [1, -1]
    alpha = rng.uniform(0.1, 0.9, (2, bd.m, bd.nU))
    beta = rng.uniform(0.1, 1.0, (2, bd.m, bd.nU)) * (split != 0)[:, None, :]
    mu = rng.uniform(0.1, 1.0, (2, bd.m, len(bd.cuts)))
    v64, s64 = evaluate_cuts(bd, split, alpha, beta, mu, np.float64, keep=True,
                             verified=False)
    v32, s32 = evaluate_cuts(bd, split, alpha.astype(np.float32), beta.astype(np.float32),
                             mu.astype(np.float32), np.float32, keep=True)
    assert np.allclose(v32, v64, rtol=1e-4, atol=1e-4)
    for g64, g32 in zip(bd.gradient(s64), bd.gradient(s32)):
        assert g32.dtype == np.float32
        assert np.any(g64 != 0.0)
        scale = 1.0 + np.abs(g64).max()
        assert np.allclose(g32, g64, rtol=1e-4, atol=1e-4 * scale)


def test_products_skip_dead_neurons_with_the_same_values(monkeypatch):
    """Dead neurons (inactive on the whole box) meet only zeros of the rows: the products
    that skip their rows of W (``Bounder.live``, on CSR weights) give the same bounds and
    gradients, bit for bit, with and without cuts, in float64 and float32."""
    from crown_cli.graph import ops  # the sparse policy
    from crown_cli.verification.bab import bounder as bounder_mod

    monkeypatch.setattr(ops, "SPARSE_MIN_SIZE", 0)  # every layer as CSR
    monkeypatch.setattr(ops, "SPARSE_PRODUCT_DENSITY", 1.0)
    sizes = (6, 16, 16, 3)
    bd = _bounder(sizes, seed=9, eps=0.15)
    assert [lv is not None for lv in bd.live] == [True, True]
    assert all(lv.size < 16 for lv in bd.live)
    monkeypatch.setattr(bounder_mod, "LIVE_MAX_SHARE", -1.0)  # no layer skips any row
    full = _bounder(sizes, seed=9, eps=0.15)
    assert full.live == [None, None]
    rng = np.random.default_rng(9)
    X = rng.uniform(bd.box.lo, bd.box.hi, (2, bd.box.lo.size))
    cuts = _general_cuts(bd, rng, 2, X)
    bd.cuts = full.cuts = cuts
    split = rng.integers(-1, 2, (3, bd.nU)).astype(np.int8)
    alpha = rng.uniform(0.0, 1.0, (3, bd.m, bd.nU))
    beta = rng.uniform(0.0, 1.0, (3, bd.m, bd.nU)) * (split != 0)[:, None, :]
    mu = rng.uniform(0.0, 1.0, (3, bd.m, len(cuts)))
    for dt in (np.float64, np.float32):
        a, be, m_ = alpha.astype(dt), beta.astype(dt), mu.astype(dt)
        for kw in ({}, {"mu": m_}):
            got, s_got = bd.evaluate(split, a, be, dt, keep=True, **kw)
            want, s_want = full.evaluate(split, a, be, dt, keep=True, **kw)
            assert np.array_equal(got, want), (dt, kw.keys())
            for g, w in zip(bd.gradient(s_got), full.gradient(s_want)):
                assert np.array_equal(g, w), (dt, kw.keys())


def test_a_cut_that_is_an_identity_leaves_the_bound():
    """The cut ``y_j - (w_j . v + b_j) <= 0`` of a neuron active on the whole box holds with
    equality everywhere, and CROWN's step through such a neuron is exact: whatever its
    multiplier, the bound stays the plain one (each layer's terms, the input's included,
    must enter the rows exactly)."""
    bd = _bounder(seed=7, eps=0.2)
    rng = np.random.default_rng(7)
    d = bd.box.lo.size
    hoff = np.cumsum([d] + [w.shape[0] for w in bd.weights[:-1]])
    cuts = Cuts(bd.nU, n_terms=int(hoff[-1]))
    for k in range(bd.L):
        active = np.flatnonzero(bd.bounds[k][0] > 0.0)
        assert active.size, k
        j = active[0]
        p = np.zeros(cuts.P.shape[1])
        p[hoff[k] + j] = 1.0
        base = 0 if k == 0 else hoff[k - 1]
        p[base:base + bd.weights[k].shape[1]] = -bd.weights[k][j]
        cuts.add_general(p, np.zeros(bd.nU), -bd.biases[k][j])
    bd.cuts = cuts
    split = np.zeros((2, bd.nU), np.int8)
    split[1, 0] = 1
    alpha = rng.uniform(0.0, 1.0, (2, bd.m, bd.nU))
    beta = rng.uniform(0.0, 1.0, (2, bd.m, bd.nU)) * (split != 0)[:, None, :]
    plain = bd.evaluate(split, alpha, beta, np.float64)
    mu = rng.uniform(0.5, 3.0, (2, bd.m, len(cuts)))
    cut = bd.evaluate(split, alpha, beta, np.float64, mu=mu)
    assert np.all(cut <= plain + 1e-12)
    assert np.allclose(cut, plain, rtol=0, atol=1e-8)


@pytest.mark.parametrize("seed", [0, slow_if(True, 1)])
def test_separated_neuron_cuts_hold_and_tighten_the_root(seed):
    """Single-neuron cuts separated at the root's relaxed points: the bound with them stays
    under the MILP that holds them, and optimising their multipliers raises the root bound
    (the cuts are violated where the relaxation's optimum lies)."""
    from crown_cli.verification.bab.cuts import separate_neuron_cuts, value_offsets
    from crown_cli.verification.bab.optimise import CutParams, optimise

    bd = _bounder(sizes=(4, 12, 12, 3), seed=seed, eps=0.5)
    split = np.zeros((1, bd.nU), np.int8)
    alpha = np.broadcast_to(bd.initial_alpha(), (1, bd.m, bd.nU)).copy()
    beta = np.zeros((1, bd.m, bd.nU), np.float32)
    _, state = optimise(bd, split, alpha, beta, iters=40, stop=False)
    plain = bd.evaluate(split, alpha.astype(np.float64), beta.astype(np.float64), np.float64)
    found = separate_neuron_cuts(bd, state, None, 32)
    assert len(found) >= 4
    bd.cuts = Cuts(bd.nU, 64, n_terms=int(value_offsets(bd)[-1]))
    for p, kz, e, key in found:
        assert bd.cuts.add_general(p, kz, e, key)
    assert not bd.cuts.add_general(*found[0])  # the same key again
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.0, 1.0, (1, bd.m, len(bd.cuts)))
    v = bd.evaluate(split, alpha.astype(np.float64), beta.astype(np.float64), np.float64, mu=mu)
    for r in range(bd.m):
        assert v[0, r] <= _milp_min(bd, split[0], bd.cuts, r) + 1e-12
    mu = np.zeros((1, bd.m, len(bd.cuts)), np.float32)
    a2, b2 = alpha.copy(), beta.copy()
    optimise(bd, split, a2, b2, iters=40, stop=False, cut=CutParams(mu))
    tight = bd.evaluate(split, a2.astype(np.float64), b2.astype(np.float64), np.float64, mu=mu)
    assert np.all(tight >= plain - 1e-9) and np.any(tight > plain + 1e-4), (plain, tight)


def test_separated_neuron_cuts_hold_in_exact_arithmetic():
    """Each separated cut y_j - sum_I w_i v_i - C z_j + D <= 0, read back from the pool in
    rational arithmetic: at z = 0 (y = 0) it holds for every input in the root's box of the
    inputs iff D <= sum_I w_i Lb_i, at z = 1 (y = w . v + b) iff C >= D + b + sum_not-I w_i
    Ub_i (Lb/Ub: the input's bounds on w_i's side)."""
    from crown_cli.verification.bab.cuts import separate_neuron_cuts, value_offsets
    from crown_cli.verification.bab.optimise import optimise

    bd = _bounder(sizes=(4, 12, 12, 3), seed=2, eps=0.5)
    split = np.zeros((1, bd.nU), np.int8)
    alpha = np.broadcast_to(bd.initial_alpha(), (1, bd.m, bd.nU)).copy()
    beta = np.zeros((1, bd.m, bd.nU), np.float32)
    _, state = optimise(bd, split, alpha, beta, iters=20, stop=False)
    found = separate_neuron_cuts(bd, state, None, 64)
    assert len(found) >= 4
    hoff = value_offsets(bd)
    F = Fraction
    for (cols, vals), kz, e, key in found:
        _, k, j, _ = key
        lo_in = bd.box.lo if k == 0 else np.maximum(bd.bounds[k - 1][0], 0.0)
        hi_in = bd.box.hi if k == 0 else np.maximum(bd.bounds[k - 1][1], 0.0)
        base = 0 if k == 0 else hoff[k - 1]
        assert cols[0] == hoff[k] + j and vals[0] == 1.0
        w = bd.weights[k][j]
        inI = np.zeros(w.size, bool)
        inI[cols[1:] - base] = True
        assert np.array_equal(-vals[1:], w[cols[1:] - base])
        g = int(np.flatnonzero(kz)[0])
        C, D = F(-float(kz[g])), F(e)
        Lb = np.where(w >= 0, lo_in, hi_in)
        Ub = np.where(w >= 0, hi_in, lo_in)
        assert D <= sum(F(float(w[i])) * F(float(Lb[i])) for i in np.flatnonzero(inI))
        assert C >= D + F(float(bd.biases[k][j])) + sum(
            F(float(w[i])) * F(float(Ub[i])) for i in np.flatnonzero(~inI))


def test_kept_multipliers_follow_their_cuts_through_the_pool():
    """A domain's sparse multipliers (its rows' largest) come back on the same cuts after
    the pool has added cuts and dropped its oldest, and in a batch's subset of the cuts: by
    serial, not by column; a dropped cut's multiplier is gone and the rest are exact."""
    from crown_cli.verification.bab.cuts import (dense_multipliers, merge_new_cuts,
                                                 sparse_multipliers)

    rng = np.random.default_rng(0)
    nU, cap = 5, 6
    cuts = Cuts(nU, cap)
    for i in range(4):
        cuts._append(None, rng.normal(size=nU), float(i), False)
    held = cuts.held()
    mu = np.where(rng.random((3, 2, 4)) < 0.6, rng.random((3, 2, 4)), 0.0).astype(np.float32)
    val, ser = sparse_multipliers(mu, held, keep=4)
    back, mask = dense_multipliers(held, val, ser, 3, 2)
    assert np.array_equal(back, mu) and np.array_equal(mask, mu > 0)
    # keep 2: each row's two largest, the rest 0
    v2, s2 = sparse_multipliers(mu, held, keep=2)
    back, _ = dense_multipliers(held, v2, s2, 3, 2)
    assert np.allclose(np.sort(back, axis=2)[..., -2:], np.sort(mu, axis=2)[..., -2:])
    assert np.all((back == mu) | (back == 0.0))
    e_before = cuts.e.copy()
    for i in range(4, 8):  # two of the first four dropped (cap 6)
        cuts._append(None, rng.normal(size=nU), float(i), False)
    held = cuts.held()
    now, mask = dense_multipliers(held, val, ser, 3, 2)
    assert now.shape == (3, 2, cap)
    # the cuts held from before are columns 0, 1 now (e 2 and 3); 4 new ones start at 0
    assert np.array_equal(cuts.e[:2], e_before[2:])
    assert np.array_equal(now[..., :2], mu[..., 2:]) and not now[..., 2:].any()
    # a subset: columns of the cuts the entries name, same values
    serials = np.unique(ser[np.isin(ser, cuts.held())])
    sub = cuts.subset(cuts.positions(serials))
    assert np.array_equal(sub.e, cuts.e[cuts.positions(serials)])
    assert np.array_equal(sub.K, cuts.K[cuts.positions(serials)])
    part, _ = dense_multipliers(serials, val, ser, 3, 2)
    assert np.array_equal(part, now[..., cuts.positions(serials)])
    # with a mask, entries at 0 that may move are kept too; new cuts fill free slots first
    m0 = np.zeros((1, 1, 3), bool)
    m0[..., :2] = True
    v3, s3 = sparse_multipliers(np.array([[[0.5, 0.0, 0.7]]], np.float32), np.array([7, 8, 9]),
                                keep=3, mask=m0)
    assert sorted(s3[0, 0].tolist()) == [-1, 7, 8]
    merge_new_cuts(v3[0], s3[0], [8, 11, 12])
    assert sorted(s3[0, 0].tolist()) == [7, 11, 12]  # 8 was at 0: 12 takes its slot
    assert 7 in s3[0, 0] and 11 in s3[0, 0] and v3[0, 0][s3[0, 0] == 7] == 0.5


def test_children_start_from_their_parents_cut_multipliers(monkeypatch):
    """With cuts held, each domain is bounded with its own cuts, from the multipliers its
    parent ended with (domain_cuts): some batch starts from nonzero multipliers, and every
    batch's cuts are a subset of the held ones; with domain_cuts 0 every batch starts at 0
    on every held cut."""
    import time

    import crown_cli.verification.bab.relu_split as rs
    from oracles import exact_margin_min

    sizes, eps, seed = (6, 20, 20, 3), 0.3, 2
    w, b = random_mlp(list(sizes), seed=seed)
    x0 = np.random.default_rng(seed + 100).uniform(-1.0, 1.0, sizes[0])
    res = exact_margin_min(w, b, x0, 0, 1, eps, time_limit=30.0)
    assert res.status == "optimal"
    A = np.array([[1.0, -1.0, 0.0]])
    starts = []
    real = rs.optimise_open

    def spy(bd, split, alpha, beta, done, iters=20, chords=None, deadline=None, cut=None):
        if cut is not None:
            starts.append((float(np.abs(cut.mu).sum()), cut.mask is not None))
        return real(bd, split, alpha, beta, done, iters, chords=chords, deadline=deadline,
                    cut=cut)

    monkeypatch.setattr(rs, "optimise_open", spy)
    for per_domain in (256, 0):
        starts.clear()
        lines = []
        r = bab_relu.relu_split(w, b, x0 - eps, x0 + eps, A,
                                np.array([res.dual_bound - 0.01 * (1.0 + abs(res.value))]),
                                time.monotonic() + 60, batch=8, cuts=64,
                                domain_cuts=per_domain, log=lines.append)
        assert r.verdict == "unsat"
        assert len(starts) > 3
        rounds = int(lines[-1].split(", ")[-1].split()[0])  # "... N domains bounded again"
        if per_domain:
            assert max(s for s, _ in starts) > 0.0 and all(m for _, m in starts)
            assert rounds > 0
        else:
            assert max(s for s, _ in starts) == 0.0 and not any(m for _, m in starts)
            assert rounds == 0


def test_cut_round_keeps_the_old_cuts_where_the_bound_did_not_improve():
    """After a cut round a domain keeps its new cut set (and the slopes it ended at) only
    where its bound improved or it was proven; the others get back the set they had before
    the new cuts joined it (their children would inherit a worse one), and every score is
    the better of the two."""
    from crown_cli.verification.bab.cut_search import CutSearch
    from crown_cli.verification.bab.domains import Domains

    B, m, nU, k = 4, 1, 5, 3
    rng = np.random.default_rng(0)
    kids = Domains(np.zeros((B, nU), np.int8), np.zeros((B, m, nU), np.float32),
                   np.zeros((B, m, nU), np.float32), None, None, np.zeros((B, 0)),
                   np.zeros((B, 0)), np.zeros((B, 1), bool), np.zeros(B, np.int64),
                   mu_val=rng.uniform(0, 1, (B, m, k)).astype(np.float32),
                   mu_ser=np.arange(B * m * k, dtype=np.int32).reshape(B, m, k))
    before = (kids.mu_val.copy(), kids.mu_ser.copy())
    kids.mu_ser[:] += 100  # the new cuts merged in
    new_sc = np.array([-0.5, 0.5, -2.0, -0.1])  # domains 0 .. 3, bounded again: idx 0, 1, 2

    class Stub(CutSearch):
        iters, stats = 1, {"cut_rounds": 0, "cut_kept": 0}

        def _assess_own_cuts(self, d, iters, chords, nodes, count=True):
            d.alpha[:] = 7.0
            d.mu_val[:] = 9.0
            sc = new_sc[:d.split.shape[0]]
            return sc, sc > 0.0, None, None, None

    score = np.array([-1.0, -1.0, -1.0, -1.0])
    proven = np.zeros(B, bool)
    Stub()._cut_round(kids, np.array([0, 1, 2]), score, proven, None, before)
    assert list(proven) == [False, True, False, False]
    assert list(score) == [-0.5, 0.5, -1.0, -1.0]
    for i in (0, 1):  # improved or proven: the new set and slopes
        assert np.all(kids.mu_val[i] == 9.0) and np.all(kids.mu_ser[i] == before[1][i] + 100)
        assert np.all(kids.alpha[i] == 7.0)
    assert np.all(kids.mu_val[2] == before[0][2]) and np.all(kids.mu_ser[2] == before[1][2])
    assert np.all(kids.alpha[2] == 0.0)
    assert np.all(kids.mu_ser[3] == before[1][3] + 100)  # not bounded again: as it was


def test_full_pool_drops_the_cuts_no_domain_holds_first():
    """Over its cap the pool drops its oldest cuts that ``in_use`` does not name (down to 7/8
    of the cap), then, if that is not enough, the oldest named ones; the cuts kept keep
    their rows and serials, and a dropped general cut's key may be added again."""
    rng = np.random.default_rng(1)
    nU, cap = 4, 16
    cuts = Cuts(nU, cap, n_terms=3)
    rows = {}
    for i in range(cap):
        k = rng.normal(size=nU)
        rows[i] = k
        cuts.add_general(np.ones(3), k, float(i), key=("c", i))
    assert np.array_equal(cuts.held(), np.arange(cap))
    cuts.in_use = lambda: np.array([0, 1, 5, 7])
    k = rng.normal(size=nU)
    rows[cap] = k
    cuts.add_general(np.ones(3), k, float(cap), key=("c", cap))  # 17 held: 3 must go
    held = cuts.held()
    assert len(cuts) == cap - cap // 8
    assert np.array_equal(held, [0, 1, 5, 6, 7] + list(range(8, cap + 1))[:len(held) - 5])
    assert {0, 1, 5, 7, cap} <= set(held.tolist())
    assert not {2, 3, 4} & set(held.tolist())  # the oldest not in use
    for j, s_ in enumerate(held.tolist()):
        assert np.allclose(cuts.K[j], rows[s_]) and cuts.e[j] == float(s_)
    assert cuts.serial_of(("c", 2)) is None and cuts.serial_of(("c", 5)) == 5
    assert np.array_equal(cuts.positions([5, cap]), [2, len(held) - 1])
    assert cuts.add_general(np.ones(3), rows[2], 2.0, key=("c", 2))  # dropped: added again
    # everything in use: the oldest go, as without in_use
    cuts.in_use = lambda: cuts.held()
    for _ in range(cap):
        cuts.add_general(np.ones(3), rng.normal(size=nU), 0.0)
    assert len(cuts) <= cap and cuts.held()[-1] == cuts.serial - 1
    assert 0 not in cuts.held().tolist()
