"""CROWN on graphs (crown_cli.engine.graph_bounds): (a) sound on random small graphs of every
operator kind, by sampling inside l_inf, l_2, l_1 balls and boxes (vertices included);
(b) on a plain dense chain, the same bounds as the dense engine (crown_cli.engine.dense_crown);
(c) a convolution's bound equals the bound of the same network with the convolution written
as its dense matrix; intermediate bounds, several consumers, MaxPool refused."""
import os

import numpy as np
import pytest

import onnx

from crown_cli.engine import dense_crown
from crown_cli.engine.graph_bounds import GraphBounds, graph_bounds
from crown_cli.engine.input_sets import Box
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.graph.network import Graph, Node
from crown_cli.graph.ops import ActivationOp, Conv, Dense, InputOp
from crown_cli.graph.onnx_graph import load_graph

from graph_models import BUILDERS

KINDS = sorted(BUILDERS)
QCODES = {"inf": 0, "2": 1, "1": 2}


def _graph(tmp_path, kind, seed=0):
    path = os.path.join(str(tmp_path), f"{kind}.onnx")
    onnx.save(BUILDERS[kind](np.random.default_rng(seed)), path)
    return load_graph(path)


def _samples(rng, x0, eps, norm, n=3000):
    d = x0.size
    if norm == "inf":
        pts = rng.uniform(-1, 1, size=(n, d))
        pts[: n // 3] = np.sign(pts[: n // 3])  # vertices
    else:
        dirs = rng.normal(size=(n, d)) if norm == "2" else rng.laplace(size=(n, d))
        dirs /= np.linalg.norm(dirs, ord=int(norm), axis=1, keepdims=True)
        pts = dirs * rng.uniform(0, 1, size=(n, 1)) ** (1.0 / d)
        pts[: n // 3] = dirs[: n // 3]  # on the sphere
        if norm == "1":  # the vertices of the l1 ball
            k = rng.integers(0, d, size=n // 6)
            pts[:k.size] = 0.0
            pts[np.arange(k.size), k] = rng.choice([-1.0, 1.0], size=k.size)
    return x0 + eps * pts


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_sound_by_sampling(tmp_path, kind, norm):
    g = _graph(tmp_path, kind, seed=1)
    rng = np.random.default_rng(2)
    x0 = rng.uniform(-1, 1, g.input_size)
    eps = {"inf": 0.15, "2": 0.4, "1": 0.6}[norm]
    gb = GraphBounds(g, x0, eps, QCODES[norm])
    lo, hi = gb.bounds()
    C = rng.normal(size=(4, g.output_size))
    clo, chi = gb.bounds(C)
    xs = _samples(rng, x0, eps, norm)
    y, vals = g.forward(xs, return_all=True)
    assert np.all(y >= lo) and np.all(y <= hi)
    assert np.all(y @ C.T >= clo) and np.all(y @ C.T <= chi)
    for i, v in enumerate(vals):  # every node's interval encloses its values
        assert np.all(v >= gb.lo[i]) and np.all(v <= gb.hi[i]), g.nodes[i].name
    # not vacuous: the bounds are within a few times the sampled range
    assert np.all(hi - lo <= 50 * (y.max(0) - y.min(0)) + 1e-9)


@pytest.mark.parametrize("kind", ["conv", "residual", "two_inputs"])
def test_sound_on_a_box(tmp_path, kind):
    g = _graph(tmp_path, kind, seed=2)
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, g.input_size)
    box = Box(a - rng.uniform(0, 0.3, a.size), a + rng.uniform(0, 0.3, a.size))
    lo, hi = graph_bounds(g, *box.args())
    xs = rng.uniform(box.lo, box.hi, size=(3000, a.size))
    xs[:1000] = np.where(rng.random((1000, a.size)) < 0.5, box.lo, box.hi)
    y = g.forward(xs)
    assert np.all(y >= lo) and np.all(y <= hi)


@pytest.mark.parametrize("act", ["Relu", "Tanh", "Sigmoid"])
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_dense_chain_equals_dense_engine(tmp_path, act, norm):
    """The graph of a Gemm chain bounds like crown_cli.engine.dense_crown (its hidden-layer
    bounds and the margins' lower bounds, to 1e-8 relative: the first layer's bounds are its
    interval, widened by gamma_{T+1} of their magnitude where the dense engine widens by
    FP_RTOL, 2**-32)."""
    path = os.path.join(str(tmp_path), "chain.onnx")
    onnx.save(BUILDERS["dense"](np.random.default_rng(7), sizes=(6, 12, 10, 9, 4), act=act), path)
    g = load_graph(path)
    dense = [n.op for n in g.nodes if isinstance(n.op, Dense)]
    net = dense_crown.Network([d.W for d in dense], [d.bias for d in dense])
    rng = np.random.default_rng(8)
    x0 = rng.uniform(-1, 1, 6)
    eps, q = 0.3, QCODES[norm]
    relax_fn = get_relaxation(act.lower(), "crown")
    C = np.eye(4)[[0, 0, 0]] - np.eye(4)[[1, 2, 3]]
    want, hidden = dense_crown.margin_lower_bound(net, x0, eps, q, relax_fn, C, return_bounds=True)
    gb = GraphBounds(g, x0, eps, q, ibp=False)
    got = gb.bounds(C)[0]
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)
    pre = [n.inputs[0] for n in g.nodes if n.kind == "activation"]
    for (l, u), p in zip(hidden, pre):
        np.testing.assert_allclose(gb.lo[p], l, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(gb.hi[p], u, rtol=1e-8, atol=1e-10)


def _conv_net(rng, as_dense: bool):
    conv = Conv(rng.normal(size=(4, 2, 3, 3)), rng.normal(size=4), (2, 6, 5), strides=(2, 1),
                pads=(1, 1, 0, 1), dilations=(1, 1), group=1)
    conv2 = Conv(rng.normal(size=(4, 1, 2, 2)), rng.normal(size=4), conv.out_shape, group=4)
    head = Dense(rng.normal(size=(3, conv2.size)), rng.normal(size=3))

    def dense_of(op):
        A = (op.forward([np.eye(op.n_in[0])]) - op.bias).T
        return Dense(A, op.bias)

    ops = [conv, conv2] if not as_dense else [dense_of(conv), dense_of(conv2)]
    nodes = [Node("x", InputOp(0, 0, 60), (), (1, 2, 6, 5)),
             Node("c1", ops[0], (0,), (1,) + conv.out_shape),
             Node("r1", ActivationOp("relu"), (1,), (1,) + conv.out_shape),
             Node("c2", ops[1], (2,), (1,) + conv2.out_shape),
             Node("t2", ActivationOp("tanh"), (3,), (1,) + conv2.out_shape),
             Node("fc", head, (4,), (1, 3))]
    return Graph(nodes, 5)


@pytest.mark.parametrize("norm", ["inf", "2"])
def test_conv_equals_its_dense_matrix(norm):
    a, b = _conv_net(np.random.default_rng(9), False), _conv_net(np.random.default_rng(9), True)
    x0 = np.random.default_rng(10).uniform(-1, 1, 60)
    eps = 0.05 if norm == "inf" else 0.3
    C = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
    la, ua = graph_bounds(a, x0, eps, QCODES[norm], C)
    lb, ub = graph_bounds(b, x0, eps, QCODES[norm], C)
    np.testing.assert_allclose(la, lb, rtol=1e-9)
    np.testing.assert_allclose(ua, ub, rtol=1e-9)
    assert np.all(la < ua)


def test_crown_tightens_intervals_and_interval_mode(tmp_path):
    g = _graph(tmp_path, "conv_tanh", seed=4)
    x0 = np.random.default_rng(5).uniform(-1, 1, g.input_size)
    lo, hi = graph_bounds(g, x0, 0.1, 0)
    li, hi_i = graph_bounds(g, x0, 0.1, 0, intermediate="interval")
    assert np.all(lo >= li) and np.all(hi <= hi_i) and np.sum(hi - lo) < np.sum(hi_i - li)


def test_maxpool_lines():
    """A window whose largest lower bound passes every other upper bound is exact; else
    y >= x_k* and y <= max u, and the bounds hold on every point of the box's vertices."""
    from crown_cli.engine.node_rules import PoolLines

    win = np.array([[0, 1, 2], [2, 3, -1], [1, 3, 0]])
    lo, hi = np.array([0.0, 1.0, -1.0, 1.5]), np.array([0.5, 2.0, 0.9, 3.0])
    pl = PoolLines(win, lo, hi)
    assert list(pl.src) == [1, 3, 3] and list(pl.exact) == [True, True, False]
    L = np.array([[1.0, -2.0, 0.5], [-1.0, 1.0, -3.0]])
    D, c, m, T = pl.back(L)
    assert T == 2
    grid = np.stack(np.meshgrid(*[[a, b] for a, b in zip(lo, hi)]), -1).reshape(-1, 4)
    y = np.stack([np.max(np.where(win >= 0, x[np.maximum(win, 0)], -np.inf), axis=1)
                  for x in grid])
    assert np.all(y @ L.T >= grid @ D.T + c - 1e-12)


@pytest.mark.parametrize("residual", [False, True])
def test_rounding_charged_against_exact_arithmetic(residual):
    """All-active ReLU networks whose margin rows are orthogonal to the network's linear map
    (so every computed coefficient is rounding noise) and inputs of order 1e5: the bounds lie
    outside the exact rational range on every row (without the product and sum charges, half
    of these 180 checks fail). With ``residual`` the rows also flow back through a Sum node
    and are added up at the ReLU node."""
    from fractions import Fraction as F

    from crown_cli.graph.ops import Sum

    for seed in range(30):
        rng = np.random.default_rng(seed)
        W1 = rng.uniform(0.5, 2.0, size=(6, 3))
        W2 = rng.normal(size=(6, 6))
        M = (W2 + np.eye(6) if residual else W2) @ W1
        C = np.linalg.svd(M.T)[2][3:]  # rows orthogonal to M's columns
        x0 = rng.uniform(1e5, 2e5, 3)
        nodes = [Node("x", InputOp(0, 0, 3), (), (1, 3)), Node("d1", Dense(W1, None), (0,), (1, 6)),
                 Node("r", ActivationOp("relu"), (1,), (1, 6)), Node("d2", Dense(W2, None), (2,), (1, 6))]
        if residual:
            nodes.append(Node("s", Sum([1.0, 1.0], 6), (3, 2), (1, 6)))
        lo, hi = graph_bounds(Graph(nodes, len(nodes) - 1), x0, 1.0, 0, C)
        W1f = [[F(v) for v in r] for r in W1]
        W2f = [[F(v) + (1 if residual and i == j else 0) for j, v in enumerate(r)]
               for i, r in enumerate(W2)]
        for k, row in enumerate(C):
            cw2 = [sum(F(row[i]) * W2f[i][j] for i in range(6)) for j in range(6)]
            lam = [sum(cw2[j] * W1f[j][t] for j in range(6)) for t in range(3)]
            val = sum(lv * F(x) for lv, x in zip(lam, x0))
            spread = sum(abs(lv) for lv in lam)
            assert F(lo[k]) <= val - spread and F(hi[k]) >= val + spread, (seed, k)


def test_conv_pool_rounding_charged_against_exact_arithmetic():
    """The same cancellation through a Conv (padded), an AveragePool (sparse Dense), a
    duplicating IndexMap and a grouped Conv: rows orthogonal to the network's linear map,
    inputs of order 1e4, all ReLUs active; the bounds lie outside the exact rational range."""
    from fractions import Fraction as F

    import scipy.sparse as sp

    from crown_cli.graph.ops import IndexMap
    from crown_cli.graph.pooling import pool_windows

    for seed in range(3):
        rng = np.random.default_rng(seed)
        c1 = Conv(rng.uniform(0.5, 2.0, size=(4, 2, 2, 2)), None, (2, 4, 4), pads=(1, 1, 0, 0))
        out, win, _ = pool_windows(c1.out_shape, (2, 2), (1, 1), (0, 0, 0, 0), (1, 1))
        valid = win >= 0
        rows = np.repeat(np.arange(win.shape[0]), valid.sum(1))
        pool = Dense(sp.csr_matrix((np.full(valid.sum(), 0.25), (rows, win[valid])),
                                   shape=(win.shape[0], c1.size)), None, "average pool")
        dup = IndexMap(np.concatenate([np.arange(pool.size), np.arange(0, pool.size, 3)]),
                       [pool.size])
        c2 = Conv(rng.normal(size=(6, 2, 1, 1)), None, out, group=2)
        head = Dense(rng.normal(size=(100, c2.size + dup.size - pool.size)), None)
        nodes = [Node("x", InputOp(0, 0, 32), (), (1, 2, 4, 4)),
                 Node("c1", c1, (0,), (1,) + c1.out_shape),
                 Node("r", ActivationOp("relu"), (1,), (1,) + c1.out_shape),
                 Node("p", pool, (2,), (1,) + out),
                 Node("d", dup, (3,), (1, dup.size)),
                 Node("c2", c2, (3,), (1,) + c2.out_shape),
                 Node("cat", IndexMap(np.concatenate([np.arange(c2.size), c2.size + np.arange(
                     pool.size, dup.size)]), [c2.size, dup.size]), (5, 4), (1, head.W.shape[1])),
                 Node("h", head, (6,), (1, 100))]
        g = Graph(nodes, 7)
        mats = {}
        for i, n in enumerate(nodes[1:], 1):
            if n.kind == "affine":
                parts = n.op.transpose(np.eye(n.op.size))  # exact: products by 1 and 0
                mats[i] = [[[F(v) for v in row] for row in P] for P in parts]
        ncat = head.W.shape[1]
        lin = head.W @ (nodes[6].op.transpose(np.eye(ncat))[0] @
                        c2.transpose(np.eye(c2.size))[0] @ pool.W.toarray() @
                        c1.transpose(np.eye(c1.size))[0])
        lin = lin + head.W @ nodes[6].op.transpose(np.eye(ncat))[1] @ dup.transpose(
            np.eye(dup.size))[0] @ pool.W.toarray() @ c1.transpose(np.eye(c1.size))[0]
        C = np.linalg.svd(lin.T)[2][32:35]
        x0 = rng.uniform(1e4, 2e4, 32)
        lo, hi = graph_bounds(g, x0, 1.0, 0, C)

        def back(rows, i):  # exact rows over node i's value pulled back to the input
            if i == 0:
                return rows
            if nodes[i].kind == "activation":  # active everywhere: the identity
                return back(rows, nodes[i].inputs[0])
            total = None
            for j, M in zip(nodes[i].inputs, mats[i]):
                part = back([[sum(r[k] * M[k][t] for k in range(len(r)) if r[k])
                              for t in range(len(M[0]))] for r in rows], j)
                total = part if total is None else [[a + b for a, b in zip(p, q)]
                                                    for p, q in zip(total, part)]
            return total

        exact = back([[F(v) for v in row] for row in C], 7)
        for k, lam in enumerate(exact):
            val = sum(lv * F(x) for lv, x in zip(lam, x0))
            spread = sum(abs(lv) for lv in lam)
            assert F(lo[k]) <= val - spread and F(hi[k]) >= val + spread, (seed, k)


def test_acasxu_graph_equals_dense_engine():
    """A published network (VNN-COMP 2021 ACAS Xu, the test fixture) read as a graph bounds
    like the MLP load_network makes of it, through the dense engine."""
    from crown_cli.io.networks import load_network

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                        "ACASXU_run2a_1_1_batch_2000.onnx")
    g, mlp = load_graph(path), load_network(path)
    assert g.is_chain() and len(g.activations()) == 6
    box = Box(np.array([0.6, -0.5, -0.5, 0.45, -0.5]), np.array([0.68, 0.5, 0.5, 0.5, -0.45]))
    C = np.eye(5)[[0, 0, 0, 0]] - np.eye(5)[[1, 2, 3, 4]]
    want = dense_crown.margin_lower_bound(dense_crown.Network(mlp.weights, mlp.biases), *box.args(),
                                      get_relaxation("relu", "crown"), C)
    got = GraphBounds(g, *box.args(), ibp=False).bounds(C)[0]
    np.testing.assert_allclose(got, want, rtol=1e-9)
    xs = np.random.default_rng(0).uniform(box.lo, box.hi, size=(2000, 5))
    assert np.all(g.forward(xs) @ C.T >= got)
    np.testing.assert_allclose(g.forward(xs), mlp.forward(xs), rtol=1e-12, atol=1e-12)


def test_split_multipliers_rounding_charged_against_exact_arithmetic():
    """GraphBounds.lower with per-row lines whose ``extra`` (ReLU splitting's multiplier
    terms) nearly cancels the rows' coefficients: all-active ReLUs at inputs of order 1e5
    given the lines ``0.7 z`` (any lines: the bound is of the rows through them), the extra
    close to minus the rows' coefficients there, a small box. The bound of the rows plus
    ``extra . z`` lies below the exact rational minimum over the box on every row. (The
    product's rounding here is within the dense node's charge, which is computed from the
    rows' magnitude before the cancellation; the extra's own charge is a margin on top.)"""
    from fractions import Fraction as F

    from crown_cli.engine.batch_steps import Lines
    from crown_cli.engine.graph_bounds import GraphBounds

    for seed in range(30):
        rng = np.random.default_rng(seed)
        W1 = rng.uniform(0.5, 2.0, size=(6, 3))
        W2 = rng.normal(size=(6, 6))
        C = rng.normal(size=(3, 6))
        x0 = rng.uniform(1e5, 2e5, 3)
        nodes = [Node("x", InputOp(0, 0, 3), (), (1, 3)), Node("d1", Dense(W1, None), (0,), (1, 6)),
                 Node("r", ActivationOp("relu"), (1,), (1, 6)), Node("d2", Dense(W2, None), (2,), (1, 6))]
        eps = 1e-6  # a small box: the rounding, not the box, decides the bound
        gb = GraphBounds(Graph(nodes, 3), x0, eps, 0)
        extra = -(C @ W2) * 0.7 * (1.0 + 1e-9 * rng.normal(size=(3, 6)))
        s7 = np.full((3, 6), 0.7)
        lines = {2: Lines(np.arange(6), s7, s7, upper_icpt=np.zeros((3, 6)), extra=extra)}
        lo = gb.lower(3, C, lines=lines)
        W1f = [[F(v) for v in r] for r in W1]
        for k, row in enumerate(C):
            coef = [sum(F(row[i]) * F(W2[i][j]) for i in range(6)) * F(0.7) + F(extra[k][j])
                    for j in range(6)]
            lam = [sum(coef[j] * W1f[j][t] for j in range(6)) for t in range(3)]
            val = sum(lv * F(x) for lv, x in zip(lam, x0))
            spread = sum(abs(lv) for lv in lam) * F(eps)
            assert F(lo[k]) <= val - spread, (seed, k)


@pytest.mark.parametrize("total", [1.0, 0.97, 1.05])
def test_maxpool_weighted_lines_hold_everywhere(total):
    """Weighted lower lines ``y >= sum_k w_k x_k`` (random weights on each window, summing to
    ``total``: off the simplex the deficit is charged as ``delta * max|y|``) hold on the
    box's vertices and on random points; dominated windows stay exact; with one-hot weights
    on k* the bound equals the unweighted one up to the charges."""
    from crown_cli.engine.node_rules import PoolLines

    rng = np.random.default_rng(3)
    win = np.array([[0, 1, 2], [2, 3, -1], [1, 3, 0], [0, 2, 3], [0, 2, -1]])
    lo, hi = np.array([-0.5, 1.0, -1.0, -2.0]), np.array([0.5, 2.0, 0.9, 3.0])
    pl = PoolLines(win, lo, hi)
    L = rng.standard_normal((6, 5))
    L[:, 4] = np.abs(L[:, 4])
    w = rng.uniform(0.0, 1.0, (6,) + win.shape) * (win >= 0)[None]
    w *= total / w.sum(axis=-1, keepdims=True)
    D, c, m, T, ch = pl.back(L, w, np.maximum(np.abs(lo), np.abs(hi)))
    assert T == 4 and np.all(ch > 0.0)  # input 0 (and 2) sits in 4 windows
    grid = np.stack(np.meshgrid(*[[a, b] for a, b in zip(lo, hi)]), -1).reshape(-1, 4)
    X = np.concatenate([grid, lo + (hi - lo) * rng.uniform(size=(20000, 4))])
    X[-5000:, 2] = X[-5000:, 0]  # the last window's inputs equal: where a sum off 1 shows
    y = np.max(np.where(win[None] >= 0, X[:, np.maximum(win, 0)], -np.inf), axis=2)
    gap = (y @ L.T) - (X @ D.T + c)
    assert gap.min() >= -ch.max() - 1e-12
    if total != 1.0:  # without the deficit term the line fails somewhere
        use = (L >= 0) | pl.exact
        raw = np.where(use, 0.0, L * pl.hi).sum(axis=1)
        assert ((y @ L.T) - (X @ D.T + raw)).min() < -1e-6
    D1, c1, _, _, _ = pl.back(L, pl.one_hot(6), np.maximum(np.abs(lo), np.abs(hi)))
    D2, c2, _, _ = pl.back(L)
    np.testing.assert_allclose(D1, D2, atol=1e-15)
    np.testing.assert_allclose(c1, c2, atol=1e-12)


def test_maxpool_weighted_lines_charge_covers_exact_rounding():
    """The weighted lines' coefficients per input, summed in float64 over overlapping windows,
    differ from the exact rational sums by no more than the charge returned (times the
    inputs' magnitudes), on coefficients spread over 12 orders of magnitude."""
    from fractions import Fraction as F

    from crown_cli.engine.node_rules import PoolLines

    rng = np.random.default_rng(11)
    n_in, m, K = 12, 9, 4
    win = rng.integers(0, n_in, (m, K))
    win[rng.uniform(size=(m, K)) < 0.15] = -1
    win[:, 0] = np.arange(m)  # every window has an input
    lo, hi = -rng.uniform(0.5, 1.0, n_in), rng.uniform(0.5, 1.0, n_in)
    pl = PoolLines(win, lo, hi)
    L = rng.standard_normal((5, m)) * 10.0 ** rng.uniform(-6, 6, (5, m))
    w = rng.uniform(size=(5, m, K)) * (win >= 0)[None]
    w /= w.sum(axis=-1, keepdims=True)
    absval = np.maximum(np.abs(lo), np.abs(hi))
    D, c, mag, T, charge = pl.back(L, w, absval)
    we = pl.effective(w)
    use = (L >= 0) | pl.exact[None]
    errs = []
    for r in range(5):
        exact = [F(0)] * n_in
        for j in range(m):
            if not use[r, j]:
                continue
            for k in range(K):
                if win[j, k] >= 0:
                    exact[win[j, k]] += F(L[r, j]) * F(we[r, j, k])
        errs.append(sum(abs(F(D[r, i]) - exact[i]) * F(absval[i]) for i in range(n_in)))
        assert errs[-1] <= F(charge[r]), r
    assert max(errs) > 0  # the sums do round here: without the charge the bound would not hold


def test_mirrored_rows_are_found_exactly():
    """`Dense.mirrors`: an output whose row and bias are exactly another's negated points to
    the earlier one; duplicates, near-negations and zero rows get none."""
    import scipy.sparse as sp

    W = np.array([[1.0, -2.0, 0.0], [-1.0, 2.0, 0.0], [1.0, -2.0, 0.0], [0.0, 0.0, 0.0],
                  [-1.0, 2.0, 1e-300], [0.5, 0.0, 3.0], [-0.5, 0.0, -3.0]])
    b = np.array([0.25, -0.25, 0.25, 0.0, -0.25, 1.0, -1.0])
    expect = [-1, 0, -1, -1, -1, -1, 5]
    for M in (W, sp.csr_matrix(W)):
        assert list(Dense(M, b).mirrors()) == expect
    b2 = b.copy()
    b2[6] = -1.0 + 2 ** -52  # the bias not exactly negated: no mirror
    assert Dense(W, b2).mirrors()[6] == -1


def test_mirrored_neurons_take_their_peers_bounds(tmp_path, monkeypatch):
    """Softmax's differences node (x_j - x_i beside x_i - x_j): CROWN bounds one neuron of
    each mirrored pair and gives the other its bounds negated and swapped. They enclose
    sampled values, and agree with the bounds computed row by row (no mirrors) up to the
    rounding of a differently chunked back-substitution."""
    g = _graph(tmp_path, "attention", seed=1)
    diff = [i for i, n in enumerate(g.nodes) if isinstance(n.op, Dense)
            and np.any(n.op.mirrors() >= 0)]
    assert diff, "the attention graph has a differences node"
    rng = np.random.default_rng(2)
    x0 = rng.uniform(-1, 1, g.input_size)
    gb = GraphBounds(g, x0, 0.1, 0)
    _, vals = g.forward(_samples(rng, x0, 0.1, "inf"), return_all=True)
    monkeypatch.setattr(Dense, "mirrors", lambda self: np.full(self.size, -1))
    plain = GraphBounds(g, x0, 0.1, 0)
    monkeypatch.undo()
    for i in diff:
        mirror = g.nodes[i].op.mirrors()
        dst, src = np.flatnonzero(mirror >= 0), mirror[mirror >= 0]
        assert np.array_equal(gb.lo[i][dst], -gb.hi[i][src])
        assert np.array_equal(gb.hi[i][dst], -gb.lo[i][src])
        assert np.all(vals[i] >= gb.lo[i]) and np.all(vals[i] <= gb.hi[i])
        scale = 1e-12 * (1.0 + np.abs(plain.lo[i]) + np.abs(plain.hi[i]))
        assert np.all(np.abs(gb.lo[i] - plain.lo[i]) <= scale)
        assert np.all(np.abs(gb.hi[i] - plain.hi[i]) <= scale)


def test_a_wide_fanout_node_is_bounded_through_its_input(tmp_path, monkeypatch):
    """An affine node FANOUT times wider than its input (softmax's differences) that needs
    FANOUT_MIN CROWN neurons or more takes its interval from its input, which is refined
    instead: the input's bounds are CROWN's (tighter than its interval), the node's are the
    interval of the refined input, and both enclose sampled values. Below the threshold the
    node is refined itself (so the rule, not the graph, decides)."""
    import crown_cli.engine.graph_bounds as gbm

    g = _graph(tmp_path, "attention", seed=1)
    diff = next(i for i, n in enumerate(g.nodes)
                if isinstance(n.op, Dense) and np.any(n.op.mirrors() >= 0))
    src = g.nodes[diff].inputs[0]
    assert g.nodes[diff].size >= gbm.FANOUT * g.nodes[src].size / 2  # 48 from 12 here
    rng = np.random.default_rng(2)
    x0 = rng.uniform(-1, 1, g.input_size)
    _, vals = g.forward(_samples(rng, x0, 0.1, "inf"), return_all=True)
    interval = GraphBounds(g, x0, 0.1, 0, intermediate="interval")
    own = GraphBounds(g, x0, 0.1, 0)
    monkeypatch.setattr(gbm, "FANOUT", g.nodes[diff].size // g.nodes[src].size)
    monkeypatch.setattr(gbm, "FANOUT_MIN", 1)
    via = GraphBounds(g, x0, 0.1, 0)
    for gb in (own, via):
        for i in (src, diff):
            assert np.all(vals[i] >= gb.lo[i]) and np.all(vals[i] <= gb.hi[i])
    # the input refined by CROWN (narrower than its interval), the node its interval
    assert np.sum(via.hi[src] - via.lo[src]) < np.sum(interval.hi[src] - interval.lo[src])
    lo, hi = via.plan[diff].interval(via, diff, g.nodes[diff])
    assert np.array_equal(via.lo[diff], lo) and np.array_equal(via.hi[diff], hi)
    # refined itself (below the threshold), the node is narrower than through its input
    assert np.sum(own.hi[diff] - own.lo[diff]) < np.sum(via.hi[diff] - via.lo[diff])


def test_maxpool_step_on_transposed_rows_charges_its_sums():
    """The fast path's max pool step (``PoolRule.back_t``, rows held transposed) on
    overlapping windows, where one input is the chosen input k* of several windows: its rows
    over the input equal the exact rational sums of the windows' coefficients within the
    charge it adds (times the inputs' magnitudes), on coefficients spread over 12 orders of
    magnitude; and its constants are the upper lines' terms, as the numpy step's."""
    from fractions import Fraction as F

    from crown_cli.engine.node_rules import plan
    from crown_cli.graph.pooling import MaxPool, pool_windows

    rng = np.random.default_rng(4)
    out, win, _ = pool_windows((2, 5, 5), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    nodes = [Node("x", InputOp(0, 0, 50), (), (1, 2, 5, 5)),
             Node("p", MaxPool(win, 50), (0,), (1,) + out)]
    x0 = rng.uniform(-1, 1, 50)
    x0[[12, 37]] = 5.0  # the centres dominate every window that holds them
    gb = GraphBounds(Graph(nodes, 1), x0, 0.1, 0)
    pool = gb.pools[1]
    assert pool.terms > 1
    m, r = pool.src.size, 6
    Lt = rng.standard_normal((m, r)) * 10.0 ** rng.uniform(-6, 6, (m, r))

    class Walk:
        acc = np.zeros((3, r))
        given = {}

        def give(self, j, rows):
            self.given[j] = rows

    walk = Walk()
    plan(gb.g)[1].back_t(gb, 1, nodes[1], (None, Lt), walk)
    idx, Dt = walk.given[0]
    D = np.zeros((50, r))
    D[np.arange(50) if idx is None else idx] = Dt
    use = (Lt >= 0) | pool.exact[:, None]
    errs = []
    for q in range(r):
        exact = [F(0)] * 50
        for j in range(m):
            if use[j, q]:
                exact[pool.src[j]] += F(Lt[j, q])
        errs.append(sum(abs(F(D[e, q]) - exact[e]) * F(gb.absval[0][e]) for e in range(50)))
        assert errs[-1] <= F(walk.acc[2, q]), q
    assert max(errs) > 0  # the sums do round here: without the charge the bound would not hold
    _, const, mag, _ = type(plan(gb.g)[1]).step(gb, 1, Lt.T)
    np.testing.assert_allclose(walk.acc[0], const, rtol=1e-12)
    np.testing.assert_allclose(walk.acc[1], mag, rtol=1e-12)


@pytest.mark.parametrize("one_sided", [False, True])
def test_dense_node_bounds_from_weight_rows_against_exact_arithmetic(monkeypatch, one_sided):
    """A dense node's bounds started from its weight's rows (graph_rows.weight_rows, no
    charge for that exact step) and, with ``one_sided``, one side per neuron first: on a
    net whose second layer's rows are orthogonal to the first layer's columns (every
    computed coefficient is rounding noise) and inputs of order 1e5, all first-layer ReLUs
    active, the node's bounds lie outside the exact rational range of its value."""
    from fractions import Fraction as F

    import crown_cli.engine.graph_bounds as graph_bounds
    import crown_cli.engine.graph_rows as graph_rows

    monkeypatch.setattr(graph_rows, "WEIGHT_ROWS_MIN", 1)
    monkeypatch.setattr(graph_bounds, "ONE_SIDED_MIN", 1 if one_sided else 10 ** 9)
    starts = []
    weight_rows = graph_rows.weight_rows

    def spy(*args):
        out = weight_rows(*args)
        starts.append(out is not None)
        return out

    monkeypatch.setattr(graph_bounds, "weight_rows", spy)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        W1 = rng.uniform(0.5, 2.0, size=(6, 3))
        W2 = np.linalg.svd(W1.T)[2][3:]  # (3, 6): rows orthogonal to W1's columns
        b2 = rng.normal(0.0, 1e-6, 3)
        x0 = rng.uniform(1e5, 2e5, 3)
        nodes = [Node("x", InputOp(0, 0, 3), (), (1, 3)),
                 Node("d1", Dense(W1, None), (0,), (1, 6)),
                 Node("r1", ActivationOp("relu"), (1,), (1, 6)),
                 Node("d2", Dense(W2, b2), (2,), (1, 3)),
                 Node("r2", ActivationOp("relu"), (3,), (1, 3)),
                 Node("d3", Dense(rng.normal(size=(2, 3)), None), (4,), (1, 2))]
        gb = GraphBounds(Graph(nodes, 5), x0, 1.0, 0, ibp=False)
        for j in range(3):
            lam = [sum(F(W2[j, i]) * F(W1[i, t]) for i in range(6)) for t in range(3)]
            val = sum(lv * F(x) for lv, x in zip(lam, x0)) + F(b2[j])
            spread = sum(abs(lv) for lv in lam)
            assert F(gb.lo[3][j]) <= val - spread and F(gb.hi[3][j]) >= val + spread, (seed, j)
    assert starts and all(starts)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_active_relus_read_by_a_max_pool_take_their_crown_bounds(tmp_path, monkeypatch, seed):
    """A ReLU read by a max pool hands the pool its intervals, so its input's active neurons
    (not only the unstable ones) get CROWN bounds (``_rows_to_refine``); a ReLU read by
    affine nodes only keeps the unstable ones. Against the unstable-only rule for both (the
    rule before session 38, which left active neurons at their interval): every output bound
    as tight or tighter and some tighter, sampled points inside."""
    from graph_models import G, _shape

    rng = np.random.default_rng(seed)
    g = G(rng)
    x = g.op("Conv", ["x", g.rand(4, 2, 3, 3), g.rand(4)], pads=[1, 1, 1, 1])
    x = g.op("Relu", [x])
    x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Conv", [x, g.rand(4, 4, 3, 3), g.rand(4)], pads=[1, 1, 1, 1])
    x = g.op("Relu", [x])
    x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Flatten", [x])
    n = int(np.prod(_shape(g, "x", (1, 2, 12, 12), x)[1:]))
    x = g.op("Gemm", [x, g.rand(3, n), g.rand(3)], transB=1)
    path = str(tmp_path / "pools.onnx")
    onnx.save(g.model([("x", (1, 2, 12, 12))], [x]), path)
    graph = load_graph(path)
    x0 = rng.uniform(-1, 1, graph.input_size)
    eps = 0.05
    gb = GraphBounds(graph, x0, eps, 0)
    new = gb.bounds()
    convs = [i for i, nd in enumerate(graph.nodes) if isinstance(nd.op, Conv)]
    # the first convolution's ReLU feeds a pool: its active neurons are refined too
    p = convs[0]
    assert gb._rows_to_refine(p).size == int(np.count_nonzero(gb.hi[p] > 0.0))

    def unstable_only(self, q):
        if all(self.plan[c].sign_stable(self.g.nodes[c]) for c in self.g.consumers[q]):
            return np.flatnonzero((self.lo[q] < 0.0) & (self.hi[q] > 0.0))
        return None

    # a ReLU read by affine nodes alone (a residual network's): the unstable neurons only
    res_path = str(tmp_path / "residual.onnx")
    onnx.save(BUILDERS["residual"](np.random.default_rng(seed)), res_path)
    res = load_graph(res_path)
    rb = GraphBounds(res, rng.uniform(-1, 1, res.input_size), eps, 0)
    read = [q for q, nd in enumerate(res.nodes) if nd.inputs and res.consumers[q]
            and all(res.nodes[c].kind == "activation" and res.nodes[c].op.name == "relu"
                    for c in res.consumers[q])]
    assert read
    for q in read:
        want = np.flatnonzero((rb.lo[q] < 0.0) & (rb.hi[q] > 0.0))
        assert np.array_equal(rb._rows_to_refine(q), want)
    monkeypatch.setattr(GraphBounds, "_rows_to_refine", unstable_only)
    old = GraphBounds(graph, x0, eps, 0).bounds()
    assert np.all(new[0] >= old[0] - 1e-12) and np.all(new[1] <= old[1] + 1e-12)
    assert np.max(np.concatenate([new[0] - old[0], old[1] - new[1]])) > 1e-6
    pts = x0[None] + rng.uniform(-eps, eps, (4000, graph.input_size))
    pts[:2000] = x0[None] + eps * np.sign(pts[:2000] - x0[None])
    y = graph.forward(pts)
    assert np.all(y >= new[0] - 1e-12) and np.all(y <= new[1] + 1e-12)
