"""Convex-hull bounds of one-hidden-layer ReLU networks (crown_cli.engine.hull) and the
input-splitting search on them (crown_cli.verification.bab.hull_split): every choice of lines
sound (sampling, exact rational arithmetic), the optimised bound against the hull's LP (an
independent disjunctive formulation), verdicts against an exact MILP."""
import time
from fractions import Fraction as F

import numpy as np
import pytest

from crown_cli.engine import hull
from crown_cli.engine.kernels import using_kernels
from crown_cli.verification.bab import hull_split as hs
from oracles import ideal_relu_lp, mlp_forward, random_mlp
from test_bab import exact_min_max_rows


def one_layer(d, n, seed, scale=1.0):
    ws, bs = random_mlp([d, n, 3], seed, scale=scale)
    rng = np.random.default_rng(500 + seed)
    lo = rng.uniform(-1.0, 0.0, d)
    hi = lo + rng.uniform(0.2, 1.0, d)
    A = rng.standard_normal((2, 3))
    b = rng.standard_normal(2)
    return ws, bs, lo, hi, A, b


def net_of(ws, bs):
    return hull.HullNet(ws[0], bs[0])


def row_problem(ws, bs, A, b, lo, hi, i=0):
    """The rows' (v, c, errors) and the box as batches of one, row i."""
    v, c, ve, ce = hull.margin_rows(ws[1], bs[1], A, b)
    return (v[i:i + 1], c[i:i + 1], ve[i:i + 1], ce[i:i + 1], lo[None], hi[None])


def margin(ws, bs, A, b, X, i=0):
    return mlp_forward(ws, bs, "relu", X) @ A[i] - b[i]


def box_points(lo, hi, rng, n=4000):
    d = lo.size
    X = lo + (hi - lo) * rng.random((n, d))
    corners = lo + (hi - lo) * rng.integers(0, 2, (2 ** min(d, 10), d))
    return np.concatenate([X, corners])


@pytest.mark.parametrize("seed", range(6))
def test_any_lines_give_a_bound_below_the_margin_on_samples(seed):
    """Random slopes in [0, 1] and random upper lines (theta in and outside [0, 1]): the
    bound lies below the margin at every sampled point and corner."""
    rng = np.random.default_rng(seed)
    ws, bs, lo, hi, A, b = one_layer(3 + seed % 3, 10, seed)
    v, c, ve, ce, L, H = row_problem(ws, bs, A, b, lo, hi, seed % 2)
    X = box_points(lo, hi, rng)
    m = margin(ws, bs, A, b, X, seed % 2)
    net = net_of(ws, bs)
    n, d = ws[0].shape
    for trial in range(20):
        s = rng.random((1, n))
        # theta anywhere (the upper lines theta * W1 are valid for any theta), not only in
        # [0, 1] where the optimiser keeps it
        theta = rng.normal(scale=[0.0, 0.5, 3.0][trial % 3], size=(1, net.nnz)) + \
            (trial % 2) * rng.random((1, net.nnz))
        lb = hull.hull_bounds(net, v, c, ve, ce, L, H, s, theta)[0]
        assert np.isfinite(lb)
        assert lb <= m.min(), (trial, lb, m.min())


def exact_bound(W1, b1, v, c, lo, hi, s, C):
    """The exact (rational) minimum over the box of the linear lower bound that the float
    lines s, C define: what hull_bounds must not exceed."""
    n, d = W1.shape
    Wf = [[F(float(w)) for w in row] for row in W1]
    bf = [F(float(x)) for x in b1]
    L = [F(float(x)) for x in lo]
    H = [F(float(x)) for x in hi]
    G = [F(0)] * d
    K = F(float(c))
    for j in range(n):
        vj = F(float(v[j]))
        if v[j] >= 0.0:
            # the float product v_j s_j is the slope used, as in the code
            p = F(float(v[j] * min(max(s[j], 0.0), 1.0)))
            G = [g + p * w for g, w in zip(G, Wf[j])]
            K += p * bf[j]
        else:
            Cj = [F(float(x)) for x in C[j]]
            m1 = sum(max(-x * l_, -x * h) for x, l_, h in zip(Cj, L, H))
            m2 = sum(max((w - x) * l_, (w - x) * h) for w, x, l_, h in zip(Wf[j], Cj, L, H)) \
                + bf[j]
            e = max(m1, m2)
            G = [g + vj * x for g, x in zip(G, Cj)]
            K += vj * e
    return sum(min(g * l_, g * h) for g, l_, h in zip(G, L, H)) + K


def test_bound_below_the_exact_value_of_its_own_lines():
    """hull_bounds charges every float64 sum: below the exact rational minimum of the same
    lines' linear bound, on weights of mixed magnitudes whose products cancel, and not far
    below it (the charge is a rounding allowance, not a slack). The uncharged float64 value
    passes the exact one on some of these cases, so the charge is needed."""
    rng = np.random.default_rng(40)
    d, n = 4, 8
    above = 0
    for trial in range(60):
        W1 = rng.normal(size=(n, d)) * 10.0 ** rng.integers(-3, 6, (n, d))
        b1 = rng.normal(size=n) * 10.0 ** rng.integers(-3, 6, n)
        lo = rng.uniform(-1.0, 0.0, d)
        hi = lo + rng.uniform(1e-3, 1.0, d)
        v = rng.normal(size=n) * 10.0 ** rng.integers(-2, 3, n)
        v[0] = -abs(v[0])
        c = float(rng.normal() * 1e4)
        s = rng.random(n)
        theta = rng.random(n * d) * (1 + 1e-9 * rng.normal(size=n * d))
        net = hull.HullNet(W1, b1)
        C = (theta * net.w).reshape(n, d)  # every entry nonzero: the dense layout
        args = (net, v[None], np.array([c]))
        lb = hull.hull_bounds(*args, np.zeros((1, n)), np.zeros(1), lo[None], hi[None],
                              s[None], theta[None])[0]
        plain = hull.hull_value_and_grad(*args, lo[None], hi[None], s[None], theta[None])[0][0]
        ex = exact_bound(W1, b1, v, c, lo, hi, s, C)
        assert F(float(lb)) <= ex, trial
        above += F(float(plain)) > ex
        mag = float(np.abs(v) @ (np.abs(W1) @ np.maximum(np.abs(lo), np.abs(hi)) + np.abs(b1)))
        assert float(ex) - lb <= 1e-10 * (mag + abs(c))
    assert above > 0


def test_margin_rows_charge_their_own_rounding():
    """v = A W2 and c = A b2 - b in float64 differ from the exact ones by at most their
    stated errors (rational arithmetic, cancelling rows)."""
    rng = np.random.default_rng(3)
    W2 = rng.normal(size=(3, 6)) * 1e8
    W2[1] = W2[0] * (1 + 1e-12)
    b2 = rng.normal(size=3) * 1e8
    A = np.array([[1.0, -1.0, 1e-8], [0.3, 0.7, -1.0]])
    b = np.array([0.1, -0.2])
    v, c, ve, ce = hull.margin_rows(W2, b2, A, b)
    for i in range(2):
        for j in range(6):
            ex = sum(F(float(A[i, k])) * F(float(W2[k, j])) for k in range(3))
            assert abs(F(float(v[i, j])) - ex) <= F(float(ve[i, j]))
        ex = sum(F(float(A[i, k])) * F(float(b2[k])) for k in range(3)) - F(float(b[i]))
        assert abs(F(float(c[i])) - ex) <= F(float(ce[i]))


def test_nan_lines_prove_nothing():
    ws, bs, lo, hi, A, b = one_layer(3, 6, 1)
    v, c, ve, ce, L, H = row_problem(ws, bs, A, b, lo, hi)
    net = net_of(ws, bs)
    s, T = hull.initial(net, v, L, H)
    T[0, 0] = np.nan
    assert hull.hull_bounds(net, v, c, ve, ce, L, H, s, T)[0] == -np.inf


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_gradient_matches_finite_differences(backend):
    rng = np.random.default_rng(8)
    ws, bs, lo, hi, A, b = one_layer(4, 10, 8)
    v, c, ve, ce, L, H = row_problem(ws, bs, A, b, lo, hi)
    net = net_of(ws, bs)
    n = ws[0].shape[0]
    s = rng.uniform(0.1, 0.9, (1, n))
    T = rng.uniform(0.1, 0.9, (1, net.nnz))

    def value(s_, T_):
        return hull.hull_value_and_grad(net, v, c, L, H, s_, T_)[0][0]

    with using_kernels(backend):
        _, gs, gt, _ = hull.hull_value_and_grad(net, v, c, L, H, s, T)
        h = 1e-7
        for j in range(n):
            e = np.zeros_like(s)
            e[0, j] = h
            fd = (value(s + e, T) - value(s - e, T)) / (2 * h)
            assert abs(fd - gs[0, j]) <= 1e-5 * (1 + abs(fd)), ("s", j)
        for k in range(net.nnz):
            e = np.zeros_like(T)
            e[0, k] = h
            fd = (value(s, T + e) - value(s, T - e)) / (2 * h)
            assert abs(fd - gt[0, k]) <= 1e-5 * (1 + abs(fd)), ("theta", k)
    assert np.any(v < 0) and np.any(v >= 0)


@pytest.mark.parametrize("density", [1.0, 0.15])
def test_numba_kernel_equals_its_numpy_twin(density):
    """The optimiser's kernel against the numpy code, on a dense layer and on a mostly-zero
    one (the sparse layout), over a batch of boxes and rows."""
    rng = np.random.default_rng(9)
    d, n, N = 7, 30, 5
    W1 = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    b1 = rng.normal(size=n)
    net = hull.HullNet(W1, b1)
    assert net.dense == (density == 1.0)
    v = rng.normal(size=(N, n))
    c = rng.normal(size=N)
    L = rng.uniform(-1, 0, (N, d))
    H = L + rng.uniform(0, 1, (N, d))
    s = rng.random((N, n))
    T = rng.random((N, net.nnz))
    with using_kernels("numba"):
        a = hull.hull_value_and_grad(net, v, c, L, H, s, T)
    with using_kernels("numpy"):
        z = hull.hull_value_and_grad(net, v, c, L, H, s, T)
    for x, y in zip(a, z):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


def test_sparse_layout_equals_dense():
    """A mostly-zero W1 kept as its nonzeros gives the same value, gradient and proven bound
    at the same lines as the same W1 with every entry kept."""
    rng = np.random.default_rng(10)
    d, n, N = 9, 40, 3
    W1 = rng.normal(size=(n, d)) * (rng.random((n, d)) < 0.2)
    b1 = rng.normal(size=n)
    sparse = hull.HullNet(W1, b1)
    old = hull.HullNet.DENSE
    try:
        hull.HullNet.DENSE = 0.0
        dense = hull.HullNet(W1, b1)
    finally:
        hull.HullNet.DENSE = old
    assert dense.dense and not sparse.dense
    v = rng.normal(size=(N, n))
    c = rng.normal(size=N)
    L = rng.uniform(-1, 0, (N, d))
    H = L + rng.uniform(0, 1, (N, d))
    s = rng.random((N, n))
    Td = rng.random((N, n * d))
    Ts = Td[:, (W1 != 0).ravel()]
    zero = np.zeros((N, n)), np.zeros(N)
    np.testing.assert_allclose(hull.hull_bounds(sparse, v, c, *zero, L, H, s, Ts),
                               hull.hull_bounds(dense, v, c, *zero, L, H, s, Td), rtol=1e-12)
    for backend in ("numba", "numpy"):
        with using_kernels(backend):
            a = hull.hull_value_and_grad(sparse, v, c, L, H, s, Ts)
            z = hull.hull_value_and_grad(dense, v, c, L, H, s, Td)
        for k, (x, y) in enumerate(zip(a, z)):
            if k == 2:
                y = y[:, (W1 != 0).ravel()]
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_optimised_bound_reaches_the_hull_lp(seed):
    """The optimised lines reach the LP over the neurons' convex hulls (an independent
    disjunctive formulation) to 1% of the margin's scale, never pass it (each choice of lines
    is a feasible dual), improve on CROWN's lines, and the hull LP lies below the MILP's
    exact minimum."""
    ws, bs, lo, hi, A, b = one_layer(3 + seed % 3, 12, 20 + seed)
    v, c, ve, ce, L, H = row_problem(ws, bs, A, b, lo, hi)
    net = net_of(ws, bs)
    s0, T0 = hull.initial(net, v, L, H)
    crown_lines = hull.hull_bounds(net, v, c, ve, ce, L, H, s0, T0)[0]
    s, T, val, _ = hull.hull_optimise(net, v, c, L, H, s0, T0, hull.Ascent(400, 0.1))
    lb = hull.hull_bounds(net, v, c, ve, ce, L, H, s, T)[0]
    lp = ideal_relu_lp(ws[0], bs[0], v[0], c[0], lo, hi)
    exact, _ = exact_min_max_rows(ws, bs, lo, hi, A[:1], time_limit=60.0)
    exact -= b[0]
    scale = float(np.abs(v[0]) @ (np.abs(ws[0]) @ np.maximum(np.abs(lo), np.abs(hi)) + np.abs(bs[0])))
    assert lb <= lp + 1e-7 * scale
    assert lb >= lp - 0.01 * scale, (lb, lp)
    assert lb >= crown_lines - 1e-12 * scale
    assert lp <= exact + 1e-6 * scale


CASES = [(3, 12, 3, 1, 0), (4, 16, 4, 2, 1), (6, 20, 3, 2, 3), (8, 24, 3, 1, 4),
         (12, 32, 2, 1, 5)]


def hull_case(d, n, n_out, m, seed):
    rng = np.random.default_rng(100 + seed)
    ws, bs = random_mlp([d, n, n_out], seed)
    lo = rng.uniform(-1.0, 0.0, d)
    hi = lo + rng.uniform(0.2, 1.0, d)
    A = rng.standard_normal((m, n_out))
    v_dual, x_star = exact_min_max_rows(ws, bs, lo, hi, A)
    v_at = float(np.max(A @ mlp_forward(ws, bs, "relu", x_star)))
    return ws, bs, lo, hi, A, v_dual, v_at, 0.02 * (1.0 + abs(v_at))


@pytest.mark.parametrize("d,n,n_out,m,seed", CASES)
def test_hull_split_against_milp(d, n, n_out, m, seed):
    ws, bs, lo, hi, A, v_dual, v_at, delta = hull_case(d, n, n_out, m, seed)
    deadline = time.monotonic() + 600.0  # a safety net only; the verdicts are asserted
    res = hs.hull_split(ws, bs, lo, hi, A, np.full(m, v_dual - delta), deadline)
    assert res.verdict == "unsat", res
    assert res.x is None and res.domains >= 1
    b = np.full(m, v_at + delta)
    res = hs.hull_split(ws, bs, lo, hi, A, b, deadline)
    assert res.verdict == "sat", res
    assert np.all(res.x >= lo) and np.all(res.x <= hi)
    assert np.all(A @ mlp_forward(ws, bs, "relu", res.x) <= b)


@pytest.mark.slow
def test_hull_split_never_contradicts_on_tight_thresholds():
    """Thresholds right at the exact minimum: any verdict but the contradicting one."""
    for d, n, n_out, m, seed in CASES[:3]:
        ws, bs, lo, hi, A, v_dual, v_at, _ = hull_case(d, n, n_out, m, seed)
        res = hs.hull_split(ws, bs, lo, hi, A, np.full(m, v_at + 1e-9),
                            time.monotonic() + 1.5)
        assert res.verdict != "unsat", res  # the MILP's point violates
        res = hs.hull_split(ws, bs, lo, hi, A, np.full(m, v_dual - 1e-9),
                            time.monotonic() + 1.5)
        assert res.verdict != "sat" or np.all(A @ mlp_forward(ws, bs, "relu", res.x)
                                              <= v_dual - 1e-9)


def test_hull_split_deadline_and_cap():
    ws, bs, lo, hi, A, v_dual, v_at, delta = hull_case(*CASES[2])
    b = np.full(A.shape[0], v_dual - 1e-3)
    res = hs.hull_split(ws, bs, lo, hi, A, b, time.monotonic() - 1.0)
    assert res.verdict == "timeout" and res.worst_bound < 0.0
    res = hs.hull_split(ws, bs, lo, hi, A, b, time.monotonic() + 60.0, max_domains=0)
    assert res.verdict == "unknown" and res.note == "domain cap"


def test_applies_only_to_one_hidden_relu_layer_and_few_inputs():
    ws, _ = random_mlp([5, 8, 2], 0)
    assert hs.applies(ws, "relu", 5, 64)
    assert not hs.applies(ws, "leaky_relu", 5, 64)
    assert not hs.applies(ws, "relu", 65, 64)
    ws3, _ = random_mlp([5, 8, 8, 2], 0)
    assert not hs.applies(ws3, "relu", 5, 64)


def test_lower_bounds_in_row_chunks_and_with_a_past_deadline(monkeypatch):
    """Rows are independent: bounding them one chunk each gives the same bounds (to the
    BLAS's rounding); a deadline
    already passed stops after the first step with bounds that are still sound (CROWN's
    lines at least)."""
    ws, bs, lo, hi, A, b = one_layer(5, 16, 3)
    A = np.concatenate([A, -A])
    b = np.full(4, 100.0)  # no row gets proven, so no chunk stops early
    whole = hull.lower_bounds(net_of(ws, bs), ws[1], bs[1], lo, hi, A, b, steps=80)
    monkeypatch.setattr(hull, "CHUNK_ENTRIES", 1)
    chunked = hull.lower_bounds(net_of(ws, bs), ws[1], bs[1], lo, hi, A, b, steps=80)
    # the same optimisation per row (up to the BLAS's rounding, which the nonsmooth ascent
    # amplifies a little): a row mapped to the wrong chunk would be off by far more
    np.testing.assert_allclose(whole, chunked, rtol=0, atol=0.01)
    early = hull.lower_bounds(net_of(ws, bs), ws[1], bs[1], lo, hi, A, b, steps=80,
                              deadline=time.monotonic() - 1.0)
    X = box_points(lo, hi, np.random.default_rng(0))
    Y = mlp_forward(ws, bs, "relu", X) @ A.T
    assert np.all(early <= Y.min(axis=0))
    assert np.all(early <= whole + 1e-12)


def test_hull_split_caps_its_open_boxes_by_memory(monkeypatch):
    """The open boxes' stored lines stay within MAX_MEMORY: a cap that small ends the search
    with unknown (domain cap) instead of growing."""
    ws, bs, lo, hi, A, v_dual, v_at, delta = hull_case(*CASES[4])
    per_box = 4 * A.shape[0] * (ws[0].shape[0] + ws[0].size)
    monkeypatch.setattr(hs, "MAX_MEMORY", 3 * per_box)
    res = hs.hull_split(ws, bs, lo, hi, A, np.full(A.shape[0], v_dual - 1e-6),
                        time.monotonic() + 60.0)
    assert res.verdict == "unknown" and res.note == "domain cap", res
    assert res.peak_open <= 3 + 2 * hs.BATCH
    monkeypatch.setattr(hs, "MAX_MEMORY", 2.0 ** 31)  # the default: decided
    res = hs.hull_split(ws, bs, lo, hi, A, np.full(A.shape[0], v_dual - 1e-6),
                        time.monotonic() + 60.0)
    assert res.verdict == "unsat", res


def test_optimiser_steps_numba_equal_numpy():
    """A few optimiser steps with the fused kernels (value and gradient, Adam) against the
    numpy code: the same lines and values (the ascent is nonsmooth, so only a few steps,
    before rounding differences could pick other subgradients)."""
    rng = np.random.default_rng(12)
    ws, bs, lo, hi, A, b = one_layer(6, 20, 12)
    v, c, ve, ce, L, H = row_problem(ws, bs, A, b, lo, hi)
    net = net_of(ws, bs)
    s0, T0 = hull.initial(net, v, L, H)
    T0 = np.clip(T0 + 0.05 * rng.normal(size=T0.shape), 0.0, 1.0)
    out = {}
    for backend in ("numba", "numpy"):
        with using_kernels(backend):
            out[backend] = hull.hull_optimise(net, v, c, L, H, s0, T0, hull.Ascent(4, 0.1))
    for x, y in zip(out["numba"], out["numpy"]):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
    assert not np.array_equal(out["numba"][1], T0)  # the steps moved the lines
