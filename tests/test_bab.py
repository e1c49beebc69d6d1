"""Input-splitting branch and bound (crown_cli.verification.bab.input_split): the batched bound against the engine's
per-box bound, soundness on samples, and BaB verdicts against an exact MILP over the box."""
import time
import warnings

import numpy as np
import pytest

from crown_cli.engine import dense_boxes
from crown_cli.verification.bab import input_split as bab
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.input_sets import Box
from crown_cli.engine.kernels import using_kernels
from crown_cli.engine.relaxations import get_relaxation
from oracles import _Builder, _encode_relu_layers, mlp_forward, neuron_bounds, random_mlp


def random_boxes(rng, n, d, degenerate=True):
    lo = rng.uniform(-1.0, 1.0, (n, d))
    hi = lo + rng.uniform(0.0, 0.6, (n, d))
    if degenerate:
        hi[0, 0] = lo[0, 0]  # a point coordinate
    return lo, hi


@pytest.mark.parametrize("activation,alpha", [("relu", None), ("leaky_relu", 0.1)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_equals_engine_per_box(activation, alpha, seed):
    rng = np.random.default_rng(seed)
    d = 3 + seed
    ws, bs = random_mlp([d, 16, 12, 16, 5], seed)
    lo, hi = random_boxes(rng, 9, d)
    A = rng.standard_normal((3, 5))
    lb, info = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs, activation, alpha), lo, hi, A)
    assert lb.shape == (9, 3) and info["Lam"].shape == (9, 3, d)
    net = crown.Network(ws, bs)
    relax = get_relaxation(activation, "crown", alpha)
    for j in range(9):  # the oracle: the engine's own per-box bound, one box at a time
        ref, bounds = crown.margin_lower_bound(net, *Box(lo[j], hi[j]).args(), relax, A,
                                               return_bounds=True)
        np.testing.assert_allclose(lb[j], ref, rtol=1e-9, atol=1e-12)
        for (l, u), (bl, bu) in zip(bounds, info["bounds"]):
            np.testing.assert_allclose(bl[j], l, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(bu[j], u, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("skip_stable", [False, True])
@pytest.mark.parametrize("activation,alpha", [("relu", None), ("leaky_relu", 0.2)])
def test_batch_sound_on_samples_and_linear_bound(activation, alpha, skip_stable):
    rng = np.random.default_rng(5)
    ws, bs = random_mlp([5, 20, 20, 20, 4], 5)
    lo, hi = random_boxes(rng, 12, 5)
    hi[6:] = lo[6:] + 0.02 * (hi[6:] - lo[6:])  # small boxes: most neurons stable
    A = rng.standard_normal((4, 4))
    lb, info = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs, activation, alpha), lo, hi, A,
                                          skip_stable=skip_stable)
    if skip_stable:  # the hidden bounds hold too, and every layer's rows are sampled
        X = np.concatenate([rng.uniform(lo[j], hi[j], (500, 5)) for j in range(12)])
        owner = np.repeat(np.arange(12), 500)
        a = X
        for k, (l, u) in enumerate(info["bounds"]):
            z = a @ ws[k].T + bs[k]
            assert np.all(z >= l[owner] - 1e-12) and np.all(z <= u[owner] + 1e-12)
            a = np.maximum(z, 0.0) if activation == "relu" else np.where(z >= 0, z, alpha * z)
    Lam, const = info["Lam"], info["const"]
    for j in range(12):
        X = rng.uniform(lo[j], hi[j], (3000, 5))
        Y = mlp_forward(ws, bs, activation, X) @ A.T  # oracles' leaky ReLU slope is 0.2
        if activation == "relu" or alpha == 0.2:
            assert np.all(Y >= lb[j] - 1e-12)
            # the returned linear function is a lower bound too, tight at its corner
            assert np.all(Y >= X @ Lam[j].T + const[j] - 1e-9)
        corner = np.where(Lam[j] > 0.0, lo[j], hi[j])  # (m, d): each row's minimiser
        at_corner = np.sum(Lam[j] * corner, axis=1) + const[j]
        assert np.all(at_corner >= lb[j])
        np.testing.assert_allclose(at_corner, lb[j], rtol=1e-8, atol=1e-9)


def test_batch_is_independent_of_batch_composition():
    rng = np.random.default_rng(7)
    ws, bs = random_mlp([4, 10, 10, 3], 7)
    lo, hi = random_boxes(rng, 6, 4)
    A = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
    lb, _ = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs), lo, hi, A)
    lb2, _ = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs), lo[3:4], hi[3:4], A)
    np.testing.assert_allclose(lb[3], lb2[0], rtol=1e-12)


def test_skip_stable_sound_and_rarely_looser():
    """With skip_stable the rows CROWN bounds are those the interval step leaves unstable;
    the bound stays sound and, on these nets, never looser than the engine's by much."""
    rng = np.random.default_rng(9)
    ws, bs = random_mlp([5, 20, 20, 20, 20, 3], 9)
    lo, hi = random_boxes(rng, 40, 5, degenerate=False)
    hi = lo + 0.05 * (hi - lo)
    A = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
    full, _ = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs), lo, hi, A)
    skip, _ = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs), lo, hi, A, skip_stable=True)
    assert np.mean(skip >= full - 1e-9 * (1 + np.abs(full))) > 0.9
    for j in range(40):
        X = rng.uniform(lo[j], hi[j], (300, 5))
        assert np.all(mlp_forward(ws, bs, "relu", X) @ A.T >= skip[j] - 1e-12)


def test_parent_bounds_only_tighten():
    rng = np.random.default_rng(8)
    ws, bs = random_mlp([3, 12, 12, 12, 2], 8)
    lo, hi = random_boxes(rng, 5, 3, degenerate=False)
    A = np.array([[1.0, -1.0]])
    lb, info = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs), lo, hi, A)
    mid = 0.5 * lo + 0.5 * hi
    lbc, infoc = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs), lo, mid, A,
                                            parent_bounds=info["bounds"])
    lbn, _ = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs), lo, mid, A)
    for (pl, pu), (cl, cu) in zip(info["bounds"], infoc["bounds"]):
        assert np.all(cl >= pl) and np.all(cu <= pu)
    X = rng.uniform(lo[0], mid[0], (2000, 3))
    assert np.all(mlp_forward(ws, bs, "relu", X) @ A.T >= lbc[0] - 1e-12)
    assert lbc.shape == lbn.shape


# ------------------------------------------------------------------------------------------
# alpha-CROWN on the last layer (alpha_row_bound)
# ------------------------------------------------------------------------------------------


def triangle_lp_min(ws, bs, lo, hi, row, bounds):
    """min over [lo, hi] of ``row . f(x)`` over the triangle relaxation of every unstable
    ReLU at the hidden bounds ``bounds`` (scipy HiGHS): the best any lower slopes in [0, 1]
    can give with these bounds."""
    from scipy.optimize import linprog

    B = _Builder()
    x = _box_input_vars(B, lo, hi)
    last = _encode_relu_layers(B, list(zip(ws[:-1], bs[:-1])), x, bounds, relaxed=True)
    cost = np.zeros(B.nvar)
    cost[last] = row @ ws[-1]
    A_ub, b_ub, A_eq, b_eq, vb = B.lp_form()
    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=vb, method="highs")
    assert res.status == 0, res.message
    return float(res.fun) + float(row @ bs[-1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alpha_row_bound_between_crown_lp_and_samples(seed):
    """Per box and row: CROWN's bound <= the alpha bound <= the triangle LP at the same hidden
    bounds (the optimum over all lower slopes) <= the sampled minimum; and the slopes close
    most of the gap between CROWN and the LP."""
    rng = np.random.default_rng(20 + seed)
    d = 4
    ws, bs = random_mlp([d, 16, 16, 16, 4], 20 + seed)
    lo, hi = random_boxes(rng, 10, d, degenerate=False)
    hi = lo + 0.3 * (hi - lo)
    A = rng.standard_normal((3, 4))
    net = dense_boxes.BatchNet(ws, bs)
    lb, info = dense_boxes.batch_lower_bounds(net, lo, hi, A, skip_stable=True)
    gains, lps = [], []
    for i in range(A.shape[0]):
        rows = np.full(10, i)
        la, lam, relax = dense_boxes.alpha_row_bound(net, info, lo, hi, A, rows, iters=20)
        assert la.shape == (10,) and lam.shape == (10, d)
        assert np.all(la >= lb[:, i] - 1e-9 * (1.0 + np.abs(lb[:, i])))
        gains.append(la - lb[:, i])
        for j in range(10):
            bounds = [(l[j], u[j]) for l, u in info["bounds"]]
            lp = triangle_lp_min(ws, bs, lo[j], hi[j], A[i], bounds)
            assert la[j] <= lp + 1e-7 * (1.0 + abs(lp)), (i, j, la[j], lp)
            X = rng.uniform(lo[j], hi[j], (2000, d))
            assert np.all(mlp_forward(ws, bs, "relu", X) @ A[i] >= la[j] - 1e-12)
            lps.append(lp)
    # the slopes close most of CROWN's gap to the LP (20 steps)
    gains, lps = np.concatenate(gains), np.array(lps)
    assert np.sum(gains) >= 0.5 * np.sum(lps - lb.T.ravel()) > 0.0


def test_alpha_row_bound_covers_the_exact_value_of_its_own_slopes():
    """The float64 alpha bound lies below the exact (rational) minimum over the box of the
    linear function its own relaxation (fractional lower slopes) gives."""
    from fractions import Fraction as F
    from types import SimpleNamespace

    from conftest import random_network
    from test_fp64_rounding import InputSet, exact_chain

    rng = np.random.default_rng(31)
    W, b = random_network([5, 6, 5, 4, 3], 31)
    lo = rng.uniform(-0.5, 0.5, (6, 5))
    hi = lo + rng.uniform(0.05, 0.4, (6, 5))
    A = rng.normal(size=(2, 3))
    net = dense_boxes.BatchNet(W, b)
    _, info = dense_boxes.batch_lower_bounds(net, lo, hi, A)
    fractional = 0
    for i in range(2):
        la, _, relax = dense_boxes.alpha_row_bound(net, info, lo, hi, A, np.full(6, i), iters=15)
        Wf = [[F(float(v)) for v in row] for row in W[-1]]
        lam = [sum(F(float(a)) * w for a, w in zip(A[i], col)) for col in zip(*Wf)]
        const = sum(F(float(a)) * F(float(v)) for a, v in zip(A[i], b[-1]))
        cnet = crown.Network(W, b)
        for j in range(6):
            rl = [SimpleNamespace(aU=aU[j], bU=bU[j], aL=aL[j], bL=bL[j])
                  for aU, bU, aL, bL in relax]
            fractional += sum(int(np.sum((r.aL > 0.0) & (r.aL < 1.0))) for r in rl)
            (coef, c), = exact_chain(cnet, rl, [lam], [const], -1)
            S = InputSet(0.5 * (lo[j] + hi[j]), box=Box(lo[j], hi[j]))
            assert S.covers(la[j], coef, c, -1), (i, j)
    assert fractional > 0  # the check has fractional slopes to cover


# ------------------------------------------------------------------------------------------
# exact oracle: min over the box of max_i (A_i f(x)) by MILP
# ------------------------------------------------------------------------------------------


def _box_input_vars(B, lo, hi):
    """Input variables with their own bounds per coordinate (not a ball around x0)."""
    return B.add_vars(lo, hi)


def exact_min_max_rows(ws, bs, lo, hi, A, time_limit=60.0):
    """(dual bound, x) for ``min over [lo, hi] of max_i A_i f(x)`` of a ReLU net.

    Neuron bounds come from oracles.neuron_bounds on the reparametrised net x = c + r y,
    y in [-1, 1]^d (the same pre-activations, so the bounds hold on the box)."""
    c, r = 0.5 * (lo + hi), 0.5 * (hi - lo)
    ws2 = [ws[0] * r[None, :]] + list(ws[1:])
    bs2 = [bs[0] + ws[0] @ c] + list(bs[1:])
    bounds = neuron_bounds(ws2, bs2, np.zeros(lo.size), 1.0, "inf")
    B = _Builder()
    x = _box_input_vars(B, lo, hi)
    last = _encode_relu_layers(B, list(zip(ws[:-1], bs[:-1])), x, bounds)
    t = B.add_vars(-np.inf, np.inf)[0]
    rows = A @ ws[-1]
    consts = A @ bs[-1]
    for i in range(A.shape[0]):  # t >= rows_i . a + consts_i
        B.add_row(np.r_[t, last], np.r_[1.0, -rows[i]], consts[i], np.inf)
    cost = np.zeros(B.nvar)
    cost[t] = 1.0
    res = B.solve_milp(cost, time_limit)
    assert res.status == 0, res.message
    dual = getattr(res, "mip_dual_bound", None)
    dual = float(res.fun) if dual is None or not np.isfinite(dual) else float(dual)
    return min(dual, float(res.fun)), np.clip(res.x[x], lo, hi)


CASES = [  # (d, hidden sizes, outputs, rows, seed)
    (3, [12, 12], 3, 1, 0),
    (4, [16, 16], 4, 2, 1),
    (5, [10, 10, 10], 5, 4, 2),
    (6, [12, 12], 3, 2, 3),
    (8, [10, 10], 3, 1, 4),
]


def milp_case(d, hidden, n_out, m, seed):
    """A random net, box and rows with the MILP's min over the box of max_i A_i f(x): (ws, bs,
    lo, hi, A, the MILP's bound v_dual, the value v_at at its point, a gap delta)."""
    rng = np.random.default_rng(100 + seed)
    ws, bs = random_mlp([d] + hidden + [n_out], seed)
    lo = rng.uniform(-1.0, 0.0, d)
    hi = lo + rng.uniform(0.2, 1.0, d)
    A = rng.standard_normal((m, n_out))
    v_dual, x_star = exact_min_max_rows(ws, bs, lo, hi, A)
    v_at = float(np.max(A @ mlp_forward(ws, bs, "relu", x_star)))
    assert v_dual <= v_at + 1e-6 * (1 + abs(v_at))
    return ws, bs, lo, hi, A, v_dual, v_at, 0.02 * (1.0 + abs(v_at))


@pytest.mark.parametrize("split", bab.SPLIT_RULES)
@pytest.mark.parametrize("d,hidden,n_out,m,seed", CASES)
def test_input_split_against_milp(d, hidden, n_out, m, seed, split):
    ws, bs, lo, hi, A, v_dual, v_at, delta = milp_case(d, hidden, n_out, m, seed)
    deadline = time.monotonic() + 600.0  # a safety net only; the verdicts are asserted
    # just true: every x has some row A_i f(x) >= v* > b
    b = np.full(m, v_dual - delta)
    res = bab.input_split(ws, bs, "relu", None, lo, hi, A, b, deadline, split=split,
                          max_domains=100_000, batch=256)
    assert res.verdict == "unsat", res
    assert res.x is None and res.domains >= 1
    # just false: the MILP's point has every row <= v_at < b
    b = np.full(m, v_at + delta)
    res = bab.input_split(ws, bs, "relu", None, lo, hi, A, b, deadline, split=split,
                          max_domains=100_000, batch=256)
    assert res.verdict == "sat", res
    x = res.x
    assert np.all(x >= lo) and np.all(x <= hi)
    assert np.all(A @ mlp_forward(ws, bs, "relu", x) <= b)


@pytest.mark.parametrize("opts", [{"alpha_iters": 0}, {"inherit": False, "widest": 0.0},
                                  {"widest": 1.0},
                                  {"trial_dims": 5},
                                  {"split": "sensitivity", "batch": 2}])
@pytest.mark.parametrize("d,hidden,n_out,m,seed", CASES[1:3])
def test_input_split_options_against_milp(d, hidden, n_out, m, seed, opts):
    """The trial rule without the alpha slopes, without inherited bounds and the widest
    candidate, and with every dimension tried: the same verdicts as the MILP."""
    ws, bs, lo, hi, A, v_dual, v_at, delta = milp_case(d, hidden, n_out, m, seed)
    for b0, want in ((v_dual - delta, "unsat"), (v_at + delta, "sat")):
        res = bab.input_split(ws, bs, "relu", None, lo, hi, A, np.full(m, b0),
                              time.monotonic() + 600.0, max_domains=100_000, **opts)
        assert res.verdict == want, res
        if want == "sat":
            assert np.all(A @ mlp_forward(ws, bs, "relu", res.x) <= b0)


@pytest.mark.slow  # slow tier since 2026-11-29 (default tier near 10 min cold)
def test_input_split_never_contradicts_on_tight_thresholds():
    """Thresholds right at the exact minimum: any verdict but the contradicting one."""
    rng = np.random.default_rng(11)
    ws, bs = random_mlp([4, 12, 12, 3], 11)
    lo, hi = -np.ones(4), np.ones(4)
    A = rng.standard_normal((2, 3))
    v_dual, x_star = exact_min_max_rows(ws, bs, lo, hi, A)
    v_at = float(np.max(A @ mlp_forward(ws, bs, "relu", x_star)))
    for b0, forbidden in ((v_dual - 1e-7 * (1 + abs(v_dual)), "sat"),
                          (v_at + 1e-7 * (1 + abs(v_at)), "unsat")):
        res = bab.input_split(ws, bs, "relu", None, lo, hi, A, np.full(2, b0),
                              time.monotonic() + 600.0, max_domains=3000, batch=128)
        assert res.verdict != forbidden
        if res.verdict == "sat":
            assert np.all(A @ mlp_forward(ws, bs, "relu", res.x) <= b0)


def test_input_split_caps_and_deadline():
    ws, bs = random_mlp([5, 16, 16, 3], 12)
    lo, hi = -np.ones(5), np.ones(5)
    A = np.array([[1.0, -1.0, 0.0]])
    X = np.random.default_rng(0).uniform(lo, hi, (5000, 5))
    v = float(np.min(mlp_forward(ws, bs, "relu", X) @ A.T))
    b = np.array([v - 1e-9])  # hard to decide: needs many boxes either way
    res = bab.input_split(ws, bs, "relu", None, lo, hi, A, b, time.monotonic() + 600.0,
                          max_domains=4, batch=2)
    assert res.verdict in ("unknown", "sat")
    if res.verdict == "unknown":
        assert res.worst_bound <= 0.0
    res = bab.input_split(ws, bs, "relu", None, lo, hi, A, b, time.monotonic() - 1.0)
    assert res.verdict == "timeout"


def test_input_split_unsplittable_box_is_unknown_not_a_crash():
    ws, bs = random_mlp([2, 8, 2], 13)
    x = np.array([0.3, -0.2])
    y = mlp_forward(ws, bs, "relu", x)
    A = np.array([[1.0, -1.0]])
    # a point box: decided by its bound or its centre, never split
    res = bab.input_split(ws, bs, "relu", None, x, x, A, [y[0] - y[1] + 1e-9],
                          time.monotonic() + 60.0)
    assert res.verdict == "sat" and np.array_equal(res.x, x)
    res = bab.input_split(ws, bs, "relu", None, x, x, A, [y[0] - y[1] - 1e-6],
                          time.monotonic() + 60.0)
    assert res.verdict == "unsat"


def test_numba_and_numpy_scaling_agree():
    """The fused numba scaling step and its numpy twin give the same bounds (the sums run
    in different orders: equal to rounding)."""
    rng = np.random.default_rng(14)
    ws, bs = random_mlp([4, 16, 16, 16, 3], 14)
    lo, hi = random_boxes(rng, 10, 4)
    A = rng.standard_normal((2, 3))
    for activation, alpha in (("relu", None), ("leaky_relu", 0.3)):
        with using_kernels("numba"):
            a, ia = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs, activation, alpha), lo,
                                               hi, A)
        with using_kernels("numpy"):
            b, ib = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(ws, bs, activation, alpha), lo,
                                               hi, A)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ia["Lam"], ib["Lam"], rtol=1e-12, atol=1e-12)


def test_batched_bounds_charge_product_rounding_on_cancelling_networks():
    """Networks whose products cancel (tests/test_fp64_rounding.py): the batched bound over
    each box must lie below the exact minimum (rational arithmetic), which a widening by the
    final sums' magnitude alone misses; every box of the batch is checked."""
    from fractions import Fraction as F

    from crown_cli.engine import dense_crown as crown
    from crown_cli.engine.relaxations import get_relaxation
    from test_fp64_rounding import InputSet, _exact_stable, cancelling_network, exact_chain

    fn = get_relaxation("relu", "crown")
    for seed in range(6):
        W, b, x0, eps, w = cancelling_network(seed)
        los = np.array([x0 - eps, x0 - 0.5 * eps, x0])
        his = np.array([x0 + 0.5 * eps, x0 + eps, x0 + eps])
        lb, _ = dense_boxes.batch_lower_bounds(dense_boxes.BatchNet(W, b), los, his, np.array([[1.0]]))
        for j in range(3):
            S = InputSet(x0, box=Box(los[j], his[j]))
            net = crown.Network(W, b)
            assert _exact_stable(net, S)
            _, relax = crown.hidden_layer_bounds(net, *S.args(), fn)
            coef, c = exact_chain(net, relax, [[F(float(v)) for v in w[0]]], [F(0)], -1)[0]
            assert S.covers(lb[j, 0], coef, c, -1), (seed, j)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # -inf scores in the split choice
def test_input_split_nan_bounds_prove_nothing(monkeypatch):
    """A NaN bound (row or alpha-CROWN) must leave the box open, never close it."""
    ws, bs = random_mlp([3, 8, 8, 2], 15)
    lo, hi = -np.ones(3), np.ones(3)
    A = np.array([[1.0, -1.0]])
    real = bab._bound_blocked

    def nan_rows(*args, **kw):
        lb, info = real(*args, **kw)
        return np.full_like(lb, np.nan), info

    monkeypatch.setattr(bab, "_bound_blocked", nan_rows)
    monkeypatch.setattr(bab, "alpha_row_bound",
                        lambda net, info, lo, hi, A, rows, iters=10: (
                            np.full(rows.shape[0], np.nan), None, None))
    res = bab.input_split(ws, bs, "relu", None, lo, hi, A, np.array([-1e6]),
                          time.monotonic() + 60.0, max_domains=50)
    assert res.verdict in ("unknown", "timeout")


@pytest.mark.parametrize("d,hidden,n_out,m,seed", CASES[3:4])
def test_input_split_two_workers_same_search(d, hidden, n_out, m, seed, monkeypatch):
    """Rounds shared with a forked helper process: the same verdicts as the MILP and, when
    the search runs to its end, the same boxes bounded as one process (each box's fate
    depends on that box alone, so the order of the rounds changes nothing)."""
    shared = []

    class Counting(bab.Helper):
        def send(self, args):
            shared.append(args[0].shape[0])
            super().send(args)

    monkeypatch.setattr(bab, "Helper", Counting)
    monkeypatch.setattr(bab, "can_fork", lambda: True)  # also where one core is allowed
    ws, bs, lo, hi, A, v_dual, v_at, delta = milp_case(d, hidden, n_out, m, seed)
    b = np.full(m, v_dual - 0.1 * delta)  # unsat, and thousands of boxes to bound
    one = bab.input_split(ws, bs, "relu", None, lo, hi, A, b, time.monotonic() + 600.0,
                          max_domains=100_000, batch=64, workers=1)
    assert not shared
    two = bab.input_split(ws, bs, "relu", None, lo, hi, A, b, time.monotonic() + 600.0,
                          max_domains=100_000, batch=64, workers=2)
    assert one.verdict == two.verdict == "unsat"
    assert two.domains == one.domains and two.splits == one.splits
    assert len(shared) > 3 and max(shared) >= bab.PARALLEL_MIN // 2
    res = bab.input_split(ws, bs, "relu", None, lo, hi, A, np.full(m, v_at + delta),
                          time.monotonic() + 600.0, max_domains=100_000, workers=2)
    assert res.verdict == "sat"
    assert np.all(A @ mlp_forward(ws, bs, "relu", res.x) <= v_at + delta)


def test_a_parent_without_a_finite_score_splits_where_a_half_is_bounded():
    # BoxSearch._kept, one box, two candidate dimensions, the parent's score -inf (a graph
    # bound through an unbounded operation): the split that bounds its halves is taken, the
    # first candidate when none does, and no NaN is formed on the way (fuzz_verify printed
    # "invalid value encountered in multiply" here)
    from crown_cli.verification.bab.input_split import BoxSearch

    used, live, ok = np.ones(4, bool), np.ones(4, bool), np.ones((1, 2), bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = np.array([-np.inf, -np.inf, -1.0, -2.0])
        kept, pick, best = BoxSearch._kept(s, used, live, np.array([-np.inf]), ok)
        assert best.tolist() == [1] and pick.tolist() == [[2, 3]]
        _, _, best = BoxSearch._kept(np.full(4, -np.inf), used, live, np.array([-np.inf]), ok)
        assert best.tolist() == [0]
        # a finite parent as before: a split no better than it is no split (candidate 0)
        _, _, best = BoxSearch._kept(np.array([-3.0, -3.0, -1.0, -1.0]), used, live,
                                     np.array([-0.5]), ok)
        assert best.tolist() == [0]
        _, _, best = BoxSearch._kept(np.array([-3.0, -3.0, 0.1, -0.1]), used, live,
                                     np.array([-0.5]), ok)
        assert best.tolist() == [1]
