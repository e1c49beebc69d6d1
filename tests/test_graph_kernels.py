"""The numba kernels of the graph back-substitution (crown_cli/engine/kernels/graph_steps.py)
against their numpy twins: a convolution's transpose (every stride, padding, dilation and
group layout, sparse and dense rows), the per-row sums fused into it, and whole CROWN bounds
of convolutional and residual graphs under both kernel sets."""
import numpy as np
import pytest

from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.kernels import graph_kernels, using_kernels
from crown_cli.graph.network import Graph, Node
from crown_cli.graph.ops import ActivationOp, Conv, Dense, InputOp, Scale, Sum

LAYOUTS = [  # weight shape, input shape, strides, pads (t, l, b, r), dilations, group
    ((4, 2, 3, 3), (2, 7, 6), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((4, 2, 3, 3), (2, 7, 6), (2, 1), (1, 0, 0, 2), (1, 1), 1),
    ((6, 1, 2, 3), (3, 8, 9), (2, 3), (0, 1, 1, 0), (2, 1), 3),
    ((4, 3, 1, 1), (3, 5, 5), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 2, 4, 2), (4, 9, 6), (3, 2), (2, 2, 2, 2), (1, 2), 2),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("density", [0.02, 0.3, 1.0])
def test_conv_transpose_kernel_equals_numpy_twin(layout, density):
    wshape, in_shape, strides, pads, dil, group = layout
    rng = np.random.default_rng(len(LAYOUTS) * int(100 * density) + wshape[0])
    conv = Conv(rng.normal(size=wshape), rng.normal(size=wshape[0]), in_shape, strides, pads,
                dil, group)
    L = rng.normal(size=(7, conv.size)) * (rng.uniform(size=(7, conv.size)) < density)
    want = conv._transpose_numpy(L)[0]
    got = conv.transpose(L)[0]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13 * np.abs(want).max())
    # the transpose is the adjoint of the forward map: <L, A x> = <A^T L, x>
    x = rng.normal(size=(1, conv.n_in[0]))
    np.testing.assert_allclose(L @ conv.linear([x])[0], got @ x[0], rtol=1e-10)
    # rows held transposed on their live elements (the fast path's form)
    from types import SimpleNamespace

    from crown_cli.engine.graph_rows import _transpose

    live = np.flatnonzero(np.any(L != 0.0, axis=0))
    gb = SimpleNamespace(g=SimpleNamespace(nodes=[SimpleNamespace(op=conv, inputs=(1,)),
                                                  SimpleNamespace(op=None, inputs=())]),
                         lines={})
    (idx, Gt), = _transpose(gb, 0, (live, np.ascontiguousarray(L[:, live].T)), graph_kernels())
    full = np.zeros((conv.n_in[0], 7))
    full[np.arange(conv.n_in[0]) if idx is None else idx] = Gt
    np.testing.assert_allclose(full.T, want, rtol=1e-13, atol=1e-13 * np.abs(want).max())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conv_transpose_kernels_skip_zero_weights(layout):
    """Kernels with half the weights 0 (the four-products pass falls back to one product at
    a time wherever one of its four weights is 0): rows held transposed and rows on windows
    equal the numpy twin; and a row whose only coefficients meet zero weights gives exact
    zeros (a zero weight's product is skipped, never 0 * inf)."""
    from types import SimpleNamespace

    from crown_cli.engine.graph_rows import Win, _unwin

    wshape, in_shape, strides, pads, dil, group = layout
    rng = np.random.default_rng(wshape[0] + 29)
    weight = rng.normal(size=wshape) * (rng.uniform(size=wshape) < 0.5)
    conv = Conv(weight, None, in_shape, strides, pads, dil, group)
    L = rng.normal(size=(6, conv.size))
    want = conv._transpose_numpy(L)[0]
    np.testing.assert_allclose(conv.transpose(L)[0], want, rtol=1e-13,
                               atol=1e-13 * np.abs(want).max())
    kernels = graph_kernels()
    O, OH, OW = conv.out_shape
    Pt = np.ascontiguousarray(L.reshape(6, O, OH, OW).transpose(1, 2, 3, 0))
    (sh, sw), (dh, dw) = conv.strides, conv.dilations
    kh, kw = wshape[2:]
    h2, w2 = (OH - 1) * sh + (kh - 1) * dh + 1, (OW - 1) * sw + (kw - 1) * dw + 1
    iy, ix = np.full(6, -conv.pads[0]), np.full(6, -conv.pads[1])
    Gt = np.empty((in_shape[0], h2, w2, 6))
    st, di, _, gr = kernels.conv_args(conv.strides, conv.dilations, conv.pads, conv.group)
    kernels.win_conv_transpose_t(Pt, iy, ix, conv.weight, st, di, gr,
                                 np.asarray(in_shape[1:], np.int64), Gt)
    idx, got = _unwin(Win(iy, ix, Gt), SimpleNamespace(shape=(1,) + tuple(in_shape)), kernels)
    full = np.zeros((conv.n_in[0], 6))
    full[np.arange(conv.n_in[0]) if idx is None else idx] = got
    np.testing.assert_allclose(full.T, want, rtol=1e-13, atol=1e-13 * np.abs(want).max())
    # an output channel all of whose weights are 0, its rows inf: nothing reaches the input
    dead = conv.weight.copy()
    dead[0] = 0.0
    zero = Conv(dead, None, in_shape, strides, pads, dil, group)
    L = np.zeros((2, conv.size))
    L[:, :OH * OW] = np.inf  # output channel 0's elements
    assert np.all(zero.transpose(L)[0] == 0.0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_conv_transpose_by_blas_equals_numpy_twin(layout, dtype):
    """Conv.transpose_blas_t (one product per kernel offset and group) on rows held
    transposed, all output elements live or a subset, against the numpy twin; and the
    dispatch: BLAS from 32 channels where the kernel would take most of its products (live
    outputs, inputs asked for, offsets inside the image), the kernel otherwise, the same
    numbers either way."""
    wshape, in_shape, strides, pads, dil, group = layout
    rng = np.random.default_rng(wshape[0] + 10 * group)
    conv = Conv(rng.normal(size=wshape), None, in_shape, strides, pads, dil, group)
    for live in (None, np.sort(rng.choice(conv.size, conv.size // 3, replace=False))):
        L = rng.normal(size=(5, conv.size))
        if live is not None:
            L[:, np.setdiff1d(np.arange(conv.size), live)] = 0.0
        want = conv._transpose_numpy(L)[0]
        Lt = np.ascontiguousarray((L if live is None else L[:, live]).T, dtype)
        targets = np.sort(rng.choice(conv.n_in[0], conv.n_in[0] // 2, replace=False))
        got = conv.transpose_blas_t(Lt, live, targets, conv.weight.astype(dtype))
        assert got.dtype == dtype and got.shape == (targets.size, 5)
        tol = 1e-13 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(got, want.T[targets], rtol=tol, atol=tol * np.abs(want).max())
    wide = Conv(rng.normal(size=(32, 32, 3, 3)), None, (32, 6, 6), (1, 1), (1, 1, 1, 1))
    assert wide.blas_pays(None) and not wide.blas_pays(np.arange(wide.size // 2))
    assert not conv.blas_pays(None)
    # BLAS takes every offset at every input element: not where the kernel's share is small
    every = np.arange(36)
    assert wide._inside() == pytest.approx((16 / 18) ** 2)  # 2 of 18 pairs a side in the pad
    assert wide.blas_pays(None, every, np.ones(32 * 36, bool))
    assert not wide.blas_pays(None, every, np.arange(32 * 36) % 2 == 0)  # half the inputs
    assert not wide.blas_pays(None, every[:18])  # half the positions
    point = Conv(rng.normal(size=(32, 32, 3, 3)), None, (32, 1, 1), (1, 1), (1, 1, 1, 1))
    assert point._inside() == pytest.approx(1 / 9) and not point.blas_pays(None)
    Lt = rng.normal(size=(wide.size, 4))
    every = np.arange(wide.in_shape[1] * wide.in_shape[2])  # every position
    np.testing.assert_allclose(wide.transpose_t(Lt, None, every, wide.weight, graph_kernels()),
                               wide._transpose_numpy(np.ascontiguousarray(Lt.T))[0].T,
                               rtol=1e-12, atol=1e-12)


def resnet(rng, c=4, s=8):
    """A small residual network: conv (stride 2) -> relu -> [conv -> relu -> conv] + skip
    -> relu -> dense -> relu -> dense."""
    def conv(o, i, shape, stride=1):
        return Conv(rng.normal(0, np.sqrt(2 / (9 * i)), (o, i, 3, 3)), rng.normal(0, 0.1, o),
                    shape, (stride, stride), (1, 1, 1, 1))

    c1 = conv(c, 3, (3, s, s), 2)
    sh = c1.out_shape
    a, b = conv(c, c, sh), conv(c, c, sh)
    n = c1.size
    nodes = [Node("x", InputOp(0, 0, 3 * s * s), (), (1, 3, s, s)),
             Node("c1", c1, (0,), (1,) + sh), Node("r1", ActivationOp("relu"), (1,), (1,) + sh),
             Node("a", a, (2,), (1,) + sh), Node("ra", ActivationOp("relu"), (3,), (1,) + sh),
             Node("b", b, (4,), (1,) + sh), Node("s", Sum([1.0, 1.0], n), (5, 2), (1,) + sh),
             Node("rs", ActivationOp("relu"), (6,), (1,) + sh),
             Node("f1", Dense(rng.normal(0, np.sqrt(2 / n), (16, n)), rng.normal(0, 0.1, 16)),
                  (7,), (1, 16)),
             Node("r3", ActivationOp("relu"), (8,), (1, 16)),
             Node("f2", Dense(rng.normal(0, 0.25, (5, 16)), rng.normal(0, 0.1, 5)), (9,), (1, 5))]
    return Graph(nodes, 10)


@pytest.mark.parametrize("qcode, eps", [(0, 0.05), (1, 0.5), (2, 1.0)])
def test_graph_bounds_kernels_equal_numpy_and_hold(qcode, eps):
    """CROWN bounds of a residual conv net, every intermediate node and the output: the numba
    kernels' equal the numpy twin's to rounding, and sampled points of the ball lie inside."""
    rng = np.random.default_rng(qcode)
    g = resnet(rng)
    x0 = rng.uniform(0, 1, g.input_size)
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, eps, qcode)
        ref_out = ref.bounds()
    with using_kernels("numba"):
        gb = GraphBounds(g, x0, eps, qcode)
        out = gb.bounds()
    unstable = 0
    for i, n in enumerate(g.nodes):
        np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-12)
        if n.kind == "activation":
            p = n.inputs[0]
            unstable += int(np.sum((gb.lo[p] < 0) & (gb.hi[p] > 0)))
    assert unstable > 10  # the rows of the intermediate bounds went through every kernel
    for a, b in zip(out, ref_out):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    d = rng.normal(size=(4000, g.input_size))
    if qcode == 0:  # half at corners of the box, half inside
        d = rng.uniform(-eps, eps, d.shape)
        d[:2000] = np.sign(d[:2000]) * eps
    else:
        p = 2 if qcode == 1 else 1
        d *= eps / np.linalg.norm(d, ord=p, axis=1, keepdims=True) * rng.uniform(size=(4000, 1))
    y = g.forward(x0[None] + d)
    assert np.all(y >= out[0] - 1e-12) and np.all(y <= out[1] + 1e-12)
    assert np.all(out[1] - out[0] > 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conv_forward_kernel_equals_numpy_twin(layout):
    wshape, in_shape, strides, pads, dil, group = layout
    rng = np.random.default_rng(wshape[0] + 7)
    w = rng.normal(size=wshape)
    w[0, 0, 0, 0] = 0.0  # the kernel skips zero weights
    conv = Conv(w, rng.normal(size=wshape[0]), in_shape, strides, pads, dil, group)
    for n in (1, 5, 40):
        X = rng.normal(size=(n, conv.n_in[0]))
        want = conv._conv_numpy(X, conv.weight)
        got = conv.linear([X])
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13 * np.abs(want).max())
    np.testing.assert_allclose(conv.forward_abs([np.abs(X)]), conv._conv_numpy(np.abs(X), np.abs(w)),
                               rtol=1e-13)


@pytest.mark.parametrize("kind", ["conv", "residual", "relu_residual", "shapes", "broadcast",
                                  "normalised", "two_inputs", "conv_maxpool", "conv_tanh",
                                  "inception"])
def test_graph_bounds_kernels_equal_numpy_on_every_operator(tmp_path, kind):
    """The fast path (rows held transposed, numba) against the numpy path on the test graphs
    of every operator kind: every node's bounds and the output's."""
    from test_graph_bounds import _graph

    g = _graph(tmp_path, kind, seed=2)
    x0 = np.random.default_rng(3).uniform(-1, 1, g.input_size)
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, 0.1, 0)
        ref_out = ref.bounds()
    gb = GraphBounds(g, x0, 0.1, 0)
    for i in range(len(g.nodes)):
        np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-12)
    for a, b in zip(gb.bounds(), ref_out):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)



def _windows_in_place(Pt, oy, ox, H, W):
    """What rows on windows (``Pt`` (C, h, w, r) at (oy, ox)) are over the whole (C, H, W)
    node, by plain loops: (r, C, H, W). ``Pt``'s coefficients outside the node are set to 0
    (the windows' rule)."""
    C, h, w, r = Pt.shape
    L = np.zeros((r, C, H, W))
    for q in range(r):
        for a in range(h):
            for b in range(w):
                y, x = oy[q] + a, ox[q] + b
                if 0 <= y < H and 0 <= x < W:
                    L[q, :, y, x] = Pt[:, a, b, q]
                else:
                    Pt[:, a, b, q] = 0.0
    return L


@pytest.mark.parametrize("layout", LAYOUTS)
def test_window_conv_transpose_equals_numpy_twin(layout):
    """Rows on windows of their own (the fast path's form for an intermediate bound's rows,
    graph_rows.Win) through a convolution's transpose: scattered onto the whole input, the
    numpy transpose of the same rows, for every stride, padding, dilation and group layout;
    windows reaching past every border of the output included."""
    from crown_cli.engine.graph_rows import Win, _unwin

    wshape, in_shape, strides, pads, dil, group = layout
    rng = np.random.default_rng(wshape[0] + 11)
    conv = Conv(rng.normal(size=wshape), rng.normal(size=wshape[0]), in_shape, strides, pads,
                dil, group)
    O, OH, OW = conv.out_shape
    kernels = graph_kernels()
    for h, w in ((1, 1), (2, 3), (OH + 2, OW + 1)):
        r = 9
        oy, ox = rng.integers(-h, OH, r), rng.integers(-w, OW, r)
        Pt = rng.normal(size=(O, h, w, r))
        L = _windows_in_place(Pt, oy, ox, OH, OW)
        want = conv._transpose_numpy(L.reshape(r, -1))[0]
        (sh, sw), (dh, dw) = conv.strides, conv.dilations
        kh, kw = wshape[2:]
        h2, w2 = (h - 1) * sh + (kh - 1) * dh + 1, (w - 1) * sw + (kw - 1) * dw + 1
        iy, ix = oy * sh - conv.pads[0], ox * sw - conv.pads[1]
        Gt = np.empty((in_shape[0], h2, w2, r))
        st, di, _, gr = kernels.conv_args(conv.strides, conv.dilations, conv.pads, conv.group)
        kernels.win_conv_transpose_t(Pt, iy, ix, conv.weight, st, di, gr,
                                     np.asarray(in_shape[1:], np.int64), Gt)

        C, H, W = in_shape  # the windows' rule holds for the result: 0 outside the input
        ys, xs = iy[:, None] + np.arange(h2), ix[:, None] + np.arange(w2)  # (r, h2), (r, w2)
        outside = ((ys < 0) | (ys >= H))[:, :, None] | ((xs < 0) | (xs >= W))[:, None, :]
        assert np.all(np.transpose(Gt, (3, 1, 2, 0))[outside] == 0.0)

        class _Node:
            shape = (1,) + tuple(in_shape)

        idx, Lt = _unwin(Win(iy, ix, Gt), _Node, kernels)
        got = np.zeros((conv.n_in[0], r))
        got[np.arange(conv.n_in[0]) if idx is None else idx] = Lt
        np.testing.assert_allclose(got.T, want, rtol=1e-13, atol=1e-13 * np.abs(want).max())


def test_graph_bounds_on_windows_equal_numpy(monkeypatch):
    """A residual network on an image large enough that the intermediate bounds' rows go
    through convolutions, activations and the residual sum on windows of their own (each
    branch's window merged at the sum): every node's bounds equal the numpy twin's, and
    sampled points lie inside."""
    import crown_cli.engine.graph_rows as graph_rows

    calls = {"conv": 0, "merge": 0}
    merge = graph_rows._win_sum

    def counted_merge(a, b):
        out = merge(a, b)
        calls["merge"] += out is not None and a.Pt.shape != b.Pt.shape
        return out

    monkeypatch.setattr(graph_rows, "_win_sum", counted_merge)
    kernels = graph_kernels()
    conv_t = kernels.win_conv_transpose_t

    def counted_conv(*args):
        calls["conv"] += 1
        return conv_t(*args)

    monkeypatch.setattr(kernels, "win_conv_transpose_t", counted_conv)
    rng = np.random.default_rng(5)
    g = resnet(rng, c=3, s=28)
    x0 = rng.uniform(0, 1, g.input_size)
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, 0.02, 0)
        ref_out = ref.bounds()
    gb = GraphBounds(g, x0, 0.02, 0)
    assert calls["conv"] > 0 and calls["merge"] > 0
    for i in range(len(g.nodes)):
        np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-12)
    out = gb.bounds()
    for a, b in zip(out, ref_out):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    y = g.forward(x0[None] + rng.uniform(-0.02, 0.02, (2000, g.input_size)))
    assert np.all(y >= out[0] - 1e-12) and np.all(y <= out[1] + 1e-12)


@pytest.mark.parametrize("qcode", [0, 1, 2, "box"])
@pytest.mark.parametrize("live", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_input_rows_terms_equal_input_terms(qcode, live, dtype):
    """The fast path's rows over the input stay transposed on their live elements
    (graph_rows.InputRows): their concretisation's three sums (x0 . a, the dual norm,
    sum |a_k x0_k|) equal input_sets.input_terms of the full rows (numpy kernels)."""
    from crown_cli.engine.graph_rows import InputRows
    from crown_cli.engine.input_sets import Box, input_terms

    rng = np.random.default_rng(11)
    d, r = 300, 70
    idx = np.sort(rng.choice(d, 90, replace=False)) if live else None
    Lt = rng.normal(size=(d if idx is None else idx.size, r)).astype(dtype)
    x0 = rng.normal(size=d)
    q = Box(x0 - rng.uniform(0, 1, d), x0 + rng.uniform(0, 1, d)) if qcode == "box" else qcode
    rows = InputRows(idx, Lt, d)
    full = rows.full()
    assert full.shape == (r, d) and full.flags.c_contiguous
    with using_kernels("numpy"):
        want = input_terms(full.astype(np.float64), x0, q)
    got = rows.terms(x0, q, graph_kernels())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("qcode", [0, "box"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_window_input_rows_terms_equal_input_terms(qcode, dtype):
    """Rows that reach an image input on their windows are concretised from the windows
    (graph_rows.WinInputRows): the three sums equal input_sets.input_terms of the rows
    written out in full, and ``full()`` writes each window into its place (windows reaching
    past the border hold 0 there, as the fast path's do)."""
    from crown_cli.engine.graph_rows import Win, WinInputRows
    from crown_cli.engine.input_sets import Box, input_terms

    rng = np.random.default_rng(12)
    C, H, W, h, w, r = 3, 9, 7, 4, 3, 50
    oy, ox = rng.integers(-2, H - 1, r), rng.integers(-1, W - 1, r)
    Pt = rng.normal(size=(C, h, w, r))
    want_full = _windows_in_place(Pt, oy, ox, H, W)
    Pt = Pt.astype(dtype)
    d = C * H * W
    x0 = rng.normal(size=d)
    q = Box(x0 - rng.uniform(0, 1, d), x0 + rng.uniform(0, 1, d)) if qcode == "box" else qcode
    rows = WinInputRows(Win(oy, ox, Pt), (C, H, W), d)
    full = rows.full()
    np.testing.assert_array_equal(full, want_full.reshape(r, d).astype(dtype))
    with using_kernels("numpy"):
        want = input_terms(full.astype(np.float64), x0, q)
    got = rows.terms(x0, q, graph_kernels())
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-12)


def test_sums_taken_by_an_activation_are_dropped_when_another_reader_adds_rows():
    """A convolution read by a ReLU and by a scaling, both summed: the ReLU's step (visited
    first) takes the convolution's sums over its rows, and the scaling's rows, given after,
    make them incomplete; the convolution's step must sum its merged rows again. Every
    node's bounds equal the numpy twin's (which sums once, over the merged rows)."""
    rng = np.random.default_rng(13)
    s = 8
    conv = Conv(rng.normal(0, 0.5, (4, 3, 3, 3)), rng.normal(0, 0.5, 4), (3, s, s), (1, 1),
                (1, 1, 1, 1))
    sh, n = (1,) + conv.out_shape, conv.size
    nodes = [Node("x", InputOp(0, 0, 3 * s * s), (), (1, 3, s, s)),
             Node("c", conv, (0,), sh),
             Node("scaled", Scale(rng.uniform(0.5, 1.5, n), rng.normal(0, 0.3, n)), (1,), sh),
             Node("r", ActivationOp("relu"), (1,), sh),
             Node("s", Sum([1.0, -1.0], n), (2, 3), sh),
             Node("rs", ActivationOp("relu"), (4,), sh),
             Node("f", Dense(rng.normal(0, 0.2, (5, n)), rng.normal(0, 0.1, 5)), (5,), (1, 5))]
    g = Graph(nodes, 6)
    x0 = rng.uniform(0, 1, g.input_size)
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, 0.05, 0)
        ref_out = ref.bounds()
    gb = GraphBounds(g, x0, 0.05, 0)
    out = gb.bounds()
    p = g.nodes[3].inputs[0]
    assert np.sum((gb.lo[p] < 0) & (gb.hi[p] > 0)) > 10
    for i in range(len(g.nodes)):
        np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-12)
    for a, b in zip(out, ref_out):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["residual", "relu_residual", "conv_maxpool", "conv_tanh"])
def test_rows_with_any_lines_kernels_equal_numpy(tmp_path, kind):
    """GraphBounds._rows (any lines: per-row lines with split multipliers, per-row slopes,
    the tape of a gradient) under the numba kernels (row-major kernels affine_terms_rows,
    add_rows, activation_rows) against the numpy expressions: the constant, magnitude and
    rounding charge of each row, the rows over the input and every tape entry."""
    from crown_cli.engine.batch_steps import Lines
    from test_graph_bounds import _graph

    g = _graph(tmp_path, kind, seed=4)
    rng = np.random.default_rng(5)
    x0 = rng.uniform(-1, 1, g.input_size)
    acts = [i for i, n in enumerate(g.nodes) if n.kind == "activation"]
    C = rng.normal(size=(6, g.output_size))
    results = {}
    for backend in ("numba", "numpy"):
        with using_kernels(backend):
            gb = GraphBounds(g, x0, 0.05, 0)
            lines, slopes = {}, {}
            for i in acts:
                n, base = g.nodes[i].size, gb.lines[i]
                lower = np.broadcast_to(base.lower, (6, n)) * rng.uniform(0.5, 1.0, (6, n))
                extra = rng.normal(size=(6, n)) * (rng.uniform(size=(6, n)) < 0.3)
                if i == acts[0]:
                    lines[i] = Lines(base.cols, lower, base.upper, base.upper_icpt,
                                     base.lower_icpt, extra=extra)
                else:
                    slopes[i] = lower
            tape = {}
            Lx, const, mag, charge = gb._rows(g.output, C, slopes, tape, lines)
            results[backend] = ((const, mag, charge), Lx, tape)
            rng = np.random.default_rng(5)  # the same lines for both
            rng.uniform(-1, 1, g.input_size)
            rng.normal(size=(6, g.output_size))
    (a, ax, at), (b, bx, bt) = results["numba"], results["numpy"]
    assert np.all(b[1] > 0) and np.all(b[2] > 0)  # magnitudes and charges to compare
    for u, v in zip(a, b):  # constant, magnitude, rounding charge per row
        np.testing.assert_allclose(u, v, rtol=1e-9)
    np.testing.assert_allclose(ax, bx, rtol=1e-12, atol=1e-14)
    assert at.keys() == bt.keys()
    for k in at:
        if isinstance(at[k], tuple):
            for u, v in zip(at[k], bt[k]):
                np.testing.assert_allclose(np.broadcast_to(u, np.shape(v)), v, rtol=1e-12,
                                           atol=1e-14)
        elif at[k] is not None:
            np.testing.assert_allclose(at[k], bt[k], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("which", ["both", "a_all", "b_all", "same"])
def test_merge_rows_kernel_equals_numpy_sum(dtype, which):
    """``merge_rows_t`` (rows a node receives from a second consumer, on the union of their
    live elements, ``graph_rows._union``) against numpy: the rows written out over every
    element and added, on the union's elements; the charge sum |S| z per row (float64)
    over the union; a float32 sum stays float32, and an element that one side lacks takes
    the other's value exactly (-0.0 + 0 as the sum with a row of zeros)."""
    from crown_cli.engine.graph_rows import _union
    from crown_cli.engine.kernels import graph_steps

    rng = np.random.default_rng(7)
    n, r = 90, 70  # rows past one ROW_BLOCK (64)
    ia = np.sort(rng.choice(n, 40, replace=False))
    ib = np.sort(rng.choice(n, 55, replace=False))
    ia, ib = {"both": (ia, ib), "a_all": (None, ib), "b_all": (ia, None),
              "same": (ia, ia)}[which]
    La = rng.normal(size=(n if ia is None else ia.size, r)).astype(dtype)
    Lb = rng.normal(size=(n if ib is None else ib.size, r)).astype(dtype)
    La[0, :3] = -0.0
    z = rng.uniform(0, 2, n).astype(dtype)
    idx, ma, mb = _union(ia, ib, n)
    full = np.zeros((n, r), dtype)
    full[slice(None) if ia is None else ia] += La
    full[slice(None) if ib is None else ib] += Lb
    keep = np.arange(n) if idx is None else idx
    if ia is not None and ib is not None:
        np.testing.assert_array_equal(idx, np.union1d(ia, ib))
    St, charge = np.empty((keep.size, r), dtype), np.full(r, 0.5)
    zk = np.ascontiguousarray(z[keep])
    for k in (graph_steps, graph_steps.SERIAL):
        S, c = St.copy(), charge.copy()
        k.merge_rows_t(La, ma, Lb, mb, zk, S, c)
        assert S.dtype == dtype
        np.testing.assert_array_equal(S, full[keep])
        assert not np.signbit(S[S == 0.0]).any()
        want = 0.5 + (np.abs(full[keep]) * zk[:, None]).astype(np.float64).sum(axis=0)
        np.testing.assert_allclose(c, want, rtol=1e-12 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_product_step_kernel_equals_numpy_twin(dtype):
    """``product_step_t`` (a product node's step on rows held transposed) against the numpy
    lines of ``ProductRule.back_t``: the rows given to both factors and the per-row sums of
    intercept terms, their magnitudes and the charge weights."""
    rng = np.random.default_rng(11)
    n, r = 37, 150  # more rows than one ROW_BLOCK
    Lt = (rng.normal(size=(n, r)) * (rng.uniform(size=(n, r)) < 0.7)).astype(dtype)
    a, b = rng.normal(size=n), rng.normal(size=n)
    icL, icU = rng.normal(size=n) - 1.0, rng.normal(size=n) + 1.0
    z1, z2 = rng.uniform(0, 3, n), rng.uniform(0, 3, n)
    D1, D2, out = np.empty_like(Lt), np.empty_like(Lt), np.empty((r, 3))
    graph_kernels().product_step_t(Lt, a.astype(dtype), b.astype(dtype), icL, icU, z1, z2,
                                   D1, D2, out)
    L64 = Lt.astype(np.float64)
    a, b = a.astype(dtype), b.astype(dtype)  # the slopes as the rows' type
    np.testing.assert_array_equal(D1, Lt * a.astype(dtype)[:, None])
    np.testing.assert_array_equal(D2, Lt * b.astype(dtype)[:, None])
    pos = np.maximum(L64, 0.0)
    want = np.stack([icU @ L64 + (icL - icU) @ pos,
                     np.abs(icU) @ np.abs(L64) + (np.abs(icL) - np.abs(icU)) @ pos,
                     (np.abs(a.astype(np.float64)) * z1 + np.abs(b.astype(np.float64)) * z2)
                     @ np.abs(L64)], axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def _with_and_without_drop(monkeypatch, g, x0, eps, ref, ref_out, seen):
    """The fast path's bounds with the drop of elements that carry nothing
    (graph_rows.DEAD_SHARE as it is) and without it (above 1): per run (GraphBounds, its
    output bounds, what the spy appended to ``seen`` meanwhile), after checking that every
    node's bounds and the output's equal the numpy twin's (``ref``, ``ref_out``)."""
    from crown_cli.engine import graph_rows

    runs = []
    for share in (graph_rows.DEAD_SHARE, 2.0):
        monkeypatch.setattr(graph_rows, "DEAD_SHARE", share)
        seen.clear()
        with using_kernels("numba"):
            gb = GraphBounds(g, x0, eps, 0)
            runs.append((gb, gb.bounds(), list(seen)))
        for i in range(len(g.nodes)):
            np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-12)
        for a, c in zip(runs[-1][1], ref_out):
            np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-12)
    return runs


def test_rows_of_inactive_relus_are_dropped_with_the_same_bounds(monkeypatch):
    """The fast path hands on no rows for ReLUs inactive on the whole set (both slopes 0):
    on a dense chain where about half of them are, its bounds equal the numpy twin's and
    those of the fast path that keeps every element (graph_rows.DEAD_SHARE above 1), and
    the smaller products are the ones taken."""
    import crown_cli.engine.node_rules as node_rules
    from crown_cli.graph.network import dense_graph
    from crown_cli.network import MLP

    rng = np.random.default_rng(5)
    sizes = [12, 40, 40, 30, 4]
    ws = [rng.normal(0, 1 / np.sqrt(m), (n, m)) for m, n in zip(sizes, sizes[1:])]
    bs = [rng.normal(-0.3, 0.3, n) for n in sizes[1:]]  # biased towards inactive
    g = dense_graph(MLP(ws, bs, "relu"))
    x0 = rng.uniform(-1, 1, 12)
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, 0.05, 0)
        ref_out = ref.bounds()
    seen = []
    transpose = node_rules._transpose

    def spy(gb, i, rows, kernels, *shared):
        seen.append((i, rows[1].shape[0]))
        return transpose(gb, i, rows, kernels, *shared)

    monkeypatch.setattr(node_rules, "_transpose", spy)
    (gb, out, dropped), (_, _, kept) = _with_and_without_drop(monkeypatch, g, x0, 0.05, ref,
                                                              ref_out, seen)
    inactive = [int(np.sum(gb.hi[n.inputs[0]] <= 0)) for n in g.nodes if n.kind == "activation"]
    assert min(inactive) >= 0.1 * 30  # each ReLU node has inactive neurons to drop
    assert sum(k for _, k in dropped) < sum(k for _, k in kept)  # fewer elements multiplied
    y = g.forward(x0[None] + rng.uniform(-0.05, 0.05, (2000, 12)))
    assert np.all(y >= out[0] - 1e-12) and np.all(y <= out[1] + 1e-12)


def test_rows_reach_only_what_activations_hand_on(tmp_path, monkeypatch):
    """On a MobileNet-style graph (clipped ReLUs as relu(x) - relu(x - 6), a depthwise
    convolution, a ReLU then a scaling with a constant, a residual sum), the fast path keeps
    rows only on the elements an activation hands on (lines not all 0), through sums and
    scalings, and the convolutions' transposes compute only those: every node's bounds equal
    the numpy twin's and those of the fast path that keeps every element
    (graph_rows.DEAD_SHARE above 1); fewer elements are computed; sampled points hold."""
    import onnx

    from crown_cli.graph.onnx_graph import load_graph
    from graph_models import mobile

    path = str(tmp_path / "mobile.onnx")
    onnx.save(mobile(np.random.default_rng(4)), path)
    g = load_graph(path)
    rng = np.random.default_rng(5)
    x0 = rng.uniform(-1, 1, g.input_size)
    eps = 0.01
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, eps, 0)
        ref_out = ref.bounds()
    computed = []
    transpose_t = Conv.transpose_t

    def spy(self, Lt, idx, pos, weight, kernels, on=None):
        out = transpose_t(self, Lt, idx, pos, weight, kernels, on)
        computed.append(out.shape[0])
        return out

    monkeypatch.setattr(Conv, "transpose_t", spy)
    (_, out, fewer), (_, _, every) = _with_and_without_drop(monkeypatch, g, x0, eps, ref,
                                                            ref_out, computed)
    fewer, every = sum(fewer), sum(every)
    assert fewer < 0.9 * every, (fewer, every)
    y = g.forward(x0[None] + rng.uniform(-eps, eps, (2000, x0.size)))
    assert np.all(y >= out[0] - 1e-12) and np.all(y <= out[1] + 1e-12)


def test_a_dense_nodes_bounds_start_from_its_weights_rows(monkeypatch):
    """A dense node's bounds on the fast path start from its weight's rows over its input
    (``graph_rows.weight_rows``), not from rows ``[I; -I]`` taken through it by a product:
    no transpose of that node is taken, and the bounds equal the numpy twin's (which takes
    the product) to its charge, and hold on sampled points."""
    import crown_cli.engine.graph_rows as graph_rows
    import crown_cli.engine.node_rules as node_rules
    from crown_cli.graph.network import dense_graph
    from crown_cli.network import MLP

    monkeypatch.setattr(graph_rows, "WEIGHT_ROWS_MIN", 1)  # (a small layer)
    rng = np.random.default_rng(8)
    sizes = [10, 70, 90, 3]  # 90 rows: more than one tile of weight_rows_t
    ws = [rng.normal(0, 1 / np.sqrt(m), (n, m)) for m, n in zip(sizes, sizes[1:])]
    bs = [rng.normal(0, 0.5, n) for n in sizes[1:]]
    g = dense_graph(MLP(ws, bs, "relu"))
    x0 = rng.uniform(-1, 1, 10)
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, 0.1, 0, ibp=False)
    seen = []
    transpose = node_rules._transpose

    def spy(gb, i, rows, kernels, *shared):
        seen.append(i)
        return transpose(gb, i, rows, kernels, *shared)

    monkeypatch.setattr(node_rules, "_transpose", spy)
    with using_kernels("numba"):
        gb = GraphBounds(g, x0, 0.1, 0, ibp=False)
    hidden = [n.inputs[0] for n in g.nodes if n.kind == "activation"]
    assert hidden[1] not in seen and hidden[0] in seen  # the first product is not taken
    for i in hidden:
        np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-12)
    x = x0[None] + rng.uniform(-0.1, 0.1, (3000, 10))
    z = x
    for k, (W, b) in enumerate(zip(ws, bs)):
        z = z @ W.T + b
        if k == 1:
            assert np.all(z >= gb.lo[hidden[1]] - 1e-12) and np.all(z <= gb.hi[hidden[1]] + 1e-12)
        z = np.maximum(z, 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_weight_rows_kernel_equals_numpy_twin(dtype, layout):
    """``weight_rows_t``: a dense weight's rows (chosen, repeated, signed) held transposed,
    equal to numpy's ``(sign * W[idx]).T`` exactly, for weights in either memory order and
    sizes that are not whole tiles."""
    rng = np.random.default_rng(3)
    W = np.asarray(rng.normal(size=(77, 45)), dtype, order=layout)
    idx = np.concatenate([rng.permutation(77)[:40], rng.permutation(77)[:33]])
    sign = rng.choice([-1.0, 1.0], idx.size).astype(dtype)
    Lt = np.full((45, idx.size), np.nan, dtype)
    graph_kernels().weight_rows_t(W, idx, sign, Lt)
    np.testing.assert_array_equal(Lt, (sign[:, None] * W[idx]).T)


def test_inception_rows_stay_on_windows(tmp_path, monkeypatch):
    """An inception block's average pool (one divisor: count_include_pad) loads as a
    convolution by 1/9 per channel, and the channel concatenation hands each branch its
    channels of the rows' windows (IndexMapRule.back_win) rather than leaving them; the
    bounds equal the numpy twin's (the test above) and hold on sampled points."""
    import crown_cli.engine.node_rules as node_rules
    from test_graph_bounds import _graph

    g = _graph(tmp_path, "inception", seed=4)
    pools = [n.op for n in g.nodes if isinstance(n.op, Conv) and n.op.label]
    assert len(pools) == 1 and pools[0].group == pools[0].in_shape[0]
    assert np.all(pools[0].weight == 1.0 / 9.0) and pools[0].parameters() == 0
    taken = []
    back_win = node_rules.IndexMapRule.back_win

    def spy(self, gb, i, node, win, walk):
        done = back_win(self, gb, i, node, win, walk)
        taken.append(done)
        return done

    monkeypatch.setattr(node_rules.IndexMapRule, "back_win", spy)
    rng = np.random.default_rng(5)
    x0 = rng.uniform(-1, 1, g.input_size)
    gb = GraphBounds(g, x0, 0.2, 0)
    lo, hi = gb.bounds()
    assert taken and all(taken)
    y = g.forward(x0[None] + rng.uniform(-0.2, 0.2, (3000, g.input_size)))
    assert np.all(y >= lo - 1e-12) and np.all(y <= hi + 1e-12)


@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_one_side_per_stable_neuron_gives_the_same_bounds(monkeypatch, kernels):
    """Where only ReLUs read a node and only affine nodes read those ReLUs, its neurons
    first take the one bound that can prove their sign (the lower where the value at the
    centre is > 0, else the upper), and the other only where that one leaves the sign
    open: the residual net's output bounds equal those of rows [I; -I] to rounding, with
    fewer rows; every neuron CROWN leaves unstable has both of its CROWN bounds; the
    intervals hold on sampled points. Where a max pool reads the ReLUs, both sides (the
    test below); and where a larger ball's bounds are known (GraphBounds(known=...)) or
    fewer than ONE_SIDED_MIN neurons are refined, both sides at once."""
    import crown_cli.engine.graph_bounds as graph_bounds
    import crown_cli.engine.graph_rows as graph_rows
    from crown_cli.engine.graph_bounds import GraphBounds as GB

    monkeypatch.setattr(graph_bounds, "ONE_SIDED_MIN", 1)  # (a small net)
    monkeypatch.setattr(graph_rows, "WEIGHT_ROWS_MIN", 1)  # its dense nodes' signed rows too
    monkeypatch.setattr(graph_bounds, "FEW_ROWS", 4)  # its second passes per tile too
    rng = np.random.default_rng(3)
    g = resnet(rng)
    x0 = rng.uniform(0, 1, g.input_size)
    counts = {}
    signed, one_sided = GB._signed_bounds, GB._one_sided

    def spy(self, target, rows, sign, l, u, tiles=True):
        counts[self.mode] = counts.get(self.mode, 0) + (2 * rows.size if sign is None
                                                       else rows.size)
        return signed(self, target, rows, sign, l, u, tiles)

    monkeypatch.setattr(GB, "_signed_bounds", spy)
    out = {}
    with using_kernels(kernels):
        for mode in ("one", "both"):
            monkeypatch.setattr(GB, "mode", mode, raising=False)
            if mode == "both":
                monkeypatch.setattr(GB, "_one_sided", lambda self, p, rows: False)
            gb = GB(g, x0, 0.02, 0)
            out[mode] = (gb, gb.bounds())
    (one, (lo1, hi1)), (both, (lo2, hi2)) = out["one"], out["both"]
    np.testing.assert_allclose(lo1, lo2, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(hi1, hi2, rtol=1e-9, atol=1e-12)
    assert counts["one"] < 0.8 * counts["both"]
    relu_inputs = [n.inputs[0] for n in g.nodes if n.kind == "activation"]
    open_ = 0
    for p in relu_inputs:
        unst = (both.lo[p] < 0) & (both.hi[p] > 0)
        open_ += int(unst.sum())
        np.testing.assert_allclose(one.lo[p][unst], both.lo[p][unst], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(one.hi[p][unst], both.hi[p][unst], rtol=1e-9, atol=1e-12)
        assert np.array_equal(unst, (one.lo[p] < 0) & (one.hi[p] > 0))
    assert open_ > 0
    _, vals = g.forward(x0[None] + rng.uniform(-0.02, 0.02, (2000, g.input_size)),
                        return_all=True)
    for i in range(len(g.nodes)):
        assert np.all(vals[i] >= one.lo[i] - 1e-12) and np.all(vals[i] <= one.hi[i] + 1e-12)
    p = next(p for p in relu_inputs if one_sided(one, p, np.arange(5)))
    known = GB(g, x0, 0.02, 0, known={p: (both.lo[p], both.hi[p])})
    assert not one_sided(known, p, np.arange(5))
    monkeypatch.setattr(graph_bounds, "ONE_SIDED_MIN", 6)
    assert not one_sided(one, p, np.arange(5)) and one_sided(one, p, np.arange(6))


@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_hints_put_both_sides_of_unstable_neurons_in_the_first_walk(monkeypatch, kernels):
    """GraphBounds(hints=...): bounds of another pass, taken only as guesses. Where a node's
    neurons are bounded one side first, those the hints leave unstable get both sides in
    the first walk: with the ball's own bounds as hints no node needs a second walk (it
    does without them), and the bounds equal those without hints to rounding; with hints
    that are wrong (every neuron unstable, or each stable with a random sign) the output's
    bounds are the same and the nodes' sides that matter too."""
    import crown_cli.engine.graph_bounds as graph_bounds
    import crown_cli.engine.graph_rows as graph_rows
    from crown_cli.engine.graph_bounds import GraphBounds as GB, _sides

    idx, sg = _sides(np.array([3, 5, 7, 9]), np.array([1.0, 0.0, -1.0, 0.0]))
    assert idx.tolist() == [3, 5, 5, 7, 9, 9] and sg.tolist() == [1, 1, -1, -1, 1, -1]
    monkeypatch.setattr(graph_bounds, "ONE_SIDED_MIN", 1)  # (a small net)
    monkeypatch.setattr(graph_rows, "WEIGHT_ROWS_MIN", 1)  # its dense nodes' signed rows too
    rng = np.random.default_rng(5)
    g = resnet(rng)
    x0 = rng.uniform(0, 1, g.input_size)
    signed = GB._signed_bounds
    seconds = []

    def spy(self, target, rows, sign, l, u, tiles=True):
        if sign is not None:  # a walk of signed rows after another one: a second pass
            seconds.append(target in self.walked)
            self.walked.add(target)
        return signed(self, target, rows, sign, l, u, tiles)

    monkeypatch.setattr(GB, "_signed_bounds", spy)
    monkeypatch.setattr(GB, "walked", None, raising=False)
    relu_inputs = [n.inputs[0] for n in g.nodes if n.kind == "activation"]

    def run(hints):
        seconds.clear()
        with using_kernels(kernels):
            gb = GB.__new__(GB)
            gb.walked = set()
            gb.__init__(g, x0, 0.02, 0, hints=hints)
            return gb, gb.bounds(), any(seconds)

    ref, (lo, hi), second = run(None)
    assert second  # without hints some neuron needs its other side in a second walk
    own = {p: (ref.lo[p], ref.hi[p]) for p in relu_inputs}
    wide = {p: (np.full(ref.lo[p].shape, -1.0), np.full(ref.lo[p].shape, 1.0))
            for p in relu_inputs}
    flip = {p: (s, -s) for p in relu_inputs
            for s in [rng.choice([-1.0, 1.0], ref.lo[p].shape)]}
    for hints in (own, wide, flip):
        gb, (lo2, hi2), second = run(hints)
        assert second == (hints is flip)
        np.testing.assert_allclose(lo2, lo, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(hi2, hi, rtol=1e-9, atol=1e-12)
        for p in relu_inputs:  # the same where a side was computed both ways
            if hints is own:
                np.testing.assert_allclose(gb.lo[p], ref.lo[p], rtol=1e-9, atol=1e-12)
                np.testing.assert_allclose(gb.hi[p], ref.hi[p], rtol=1e-9, atol=1e-12)
            # wrong hints: a stable neuron's other side computed too (CROWN's, not the
            # interval's), which its ReLU's lines do not read
            assert np.all(gb.lo[p] >= ref.lo[p] - 1e-9) and np.all(gb.hi[p] <= ref.hi[p] + 1e-9)
            assert np.array_equal((gb.lo[p] < 0) & (gb.hi[p] > 0),
                                  (ref.lo[p] < 0) & (ref.hi[p] > 0))


@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_one_side_first_does_not_let_deep_intervals_compound(monkeypatch, kernels):
    """A neuron proven stable by its one CROWN side also takes the other where the
    interval's lies more than OTHER_SIDE_RATIO times as far from the centre: else intervals
    compound through the layers after it (torchvision's RegNetX: 1e12 wide at eps 1e-6, and
    its output bound -1.3e4 for a margin of 0.076, from the rounding charges on those
    magnitudes). On a deep chain at a tiny radius: no refined neuron keeps such an interval
    side, the widest node is several times narrower than with the ratio unbounded (the rule
    before), the output bounds equal those of both sides at once to rounding, and they hold
    on sampled points."""
    import crown_cli.engine.graph_bounds as graph_bounds
    from crown_cli.engine.graph_bounds import GraphBounds as GB
    from crown_cli.graph.network import dense_graph
    from crown_cli.network import MLP

    monkeypatch.setattr(graph_bounds, "ONE_SIDED_MIN", 1)  # (a small net)
    rng = np.random.default_rng(11)
    sizes = [8] + [32] * 20 + [4]
    ws = [rng.normal(0, 2 / np.sqrt(m), (n, m)) for m, n in zip(sizes, sizes[1:])]
    bs = [rng.normal(0, 0.5, n) for n in sizes[1:]]
    g = dense_graph(MLP(ws, bs, "relu"))
    x0, eps = rng.uniform(-1, 1, 8), 1e-9
    ratio = graph_bounds.OTHER_SIDE_RATIO
    out = {}
    with using_kernels(kernels):
        for mode, r in (("one", ratio), ("before", np.inf), ("both", np.inf)):
            monkeypatch.setattr(graph_bounds, "OTHER_SIDE_RATIO", r)
            if mode == "both":
                monkeypatch.setattr(GB, "_one_sided", lambda self, p, rows: False)
            gb = GB(g, x0, eps, 0)
            out[mode] = (gb, gb.bounds())
    one, (lo, hi) = out["one"]
    np.testing.assert_allclose(lo, out["both"][1][0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(hi, out["both"][1][1], rtol=1e-9, atol=1e-12)
    widest = {m: max(np.max(gb.hi[i] - gb.lo[i]) for i in range(len(g.nodes)))
              for m, (gb, _) in out.items()}
    assert widest["before"] > 3 * widest["one"], widest  # the case the rule is for
    _, centre = g.forward(x0[None], return_all=True)
    for p in (n.inputs[0] for n in g.nodes if n.kind == "activation"):
        c, lp, up = centre[p].reshape(-1), one.lo[p], one.hi[p]
        near, far = np.minimum(c - lp, up - c), np.maximum(c - lp, up - c)
        assert np.all(far <= ratio * near * (1 + 1e-9) + 1e-300), p
    z = g.forward(x0[None] + rng.uniform(-eps, eps, (500, 8)))
    assert np.all(z >= lo - 1e-12) and np.all(z <= hi + 1e-12)


def test_a_max_pool_reading_the_relus_keeps_both_sides(tmp_path):
    """A max pool's lines read its input's upper bounds: the ReLUs before it take both
    sides (their upper bounds are CROWN's, not the interval's)."""
    from test_graph_bounds import _graph

    g = _graph(tmp_path, "conv_maxpool", seed=2)
    x0 = np.random.default_rng(3).uniform(-1, 1, g.input_size)
    gb = GraphBounds(g, x0, 0.1, 0)
    before_pool = [n.inputs[0] for n in g.nodes if n.kind == "maxpool"]
    relus = [i for i in before_pool if g.nodes[i].kind == "activation"]
    assert relus
    assert not gb._one_sided(g.nodes[relus[0]].inputs[0], np.arange(1))


@pytest.mark.parametrize("name", ["mobile", "efficient", "decoder", "normalised", "arithmetic"])
def test_graph_bounds_kernels_equal_numpy_on_keras_written_models(name):
    """The fast path against the numpy path on the models Keras wrote
    (tests/fixtures/keras_graphs): scalings (Rescaling, unfolded normalisations, the shifts
    of ReLU6), element moves (paddings, croppings, upsampling, concatenations, permutations)
    carried on their live elements; every node's bounds, and the output's holding on
    sampled points."""
    from pathlib import Path

    from crown_cli.io.networks import load_network

    g = load_network(str(Path(__file__).parent / "fixtures" / "keras_graphs" / f"{name}.keras"))
    rng = np.random.default_rng(5)
    x0 = rng.uniform(0, 1, g.input_size)
    eps = 0.02
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, eps, 0)
        ref_out = ref.bounds()
    gb = GraphBounds(g, x0, eps, 0)
    for i in range(len(g.nodes)):
        np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-11)
    lo, hi = gb.bounds()
    for a, b in zip((lo, hi), ref_out):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
    pts = x0 + eps * rng.uniform(-1, 1, size=(2000, g.input_size))
    pts[:300] = x0 + eps * np.sign(rng.normal(size=(300, g.input_size)))
    y = g.forward(pts)
    assert np.all(y >= lo) and np.all(y <= hi)


def test_activation_step_reads_rows_that_are_pairs_from_their_first_half():
    """``activation_step_t`` given E alone (r / 2 columns) for the rows [E; -E] writes what
    it writes given both halves, bit for bit: the steps, the intercept sums, magnitudes and
    charges, and the fused affine sums (float64 and float32)."""
    from crown_cli.engine.kernels import graph_steps

    rng = np.random.default_rng(3)
    for dt in (np.float64, np.float32):
        for h in (5, 64, 97):  # within one row block, exactly blocks, and a ragged block
            E = rng.normal(size=(30, h)).astype(dt)
            read = np.sort(rng.choice(30, 21, replace=False)).astype(np.int64)
            lines = [rng.normal(size=21).astype(dt) for _ in range(4)]
            lines[1][:7] = lines[0][:7]  # some elements with one slope
            absval = rng.uniform(0, 2, 21).astype(dt)
            for terms in (np.empty((3, 0), dt), rng.uniform(0, 1, (3, 21)).astype(dt)):
                cols = 3 + 3 * (terms.shape[1] > 0)
                want_D, want = np.empty((21, 2 * h), dt), np.empty((2 * h, cols))
                graph_steps.activation_step_t(np.ascontiguousarray(np.hstack([E, -E])), read,
                                              *lines, absval, terms, want_D, want)
                got_D, got = np.empty((21, 2 * h), dt), np.empty((2 * h, cols))
                graph_steps.activation_step_t(E, read, *lines, absval, terms, got_D, got)
                np.testing.assert_array_equal(got_D, want_D)
                np.testing.assert_array_equal(got, want)


def test_steering_sums_are_the_charged_kernels_constants():
    """A steering pass's sums (``out`` of 1 column, 2 with an activation's fused affine
    sums) are the charged kernels' constants bit for bit, and the rows the same:
    ``activation_step_t``, ``win_activation_t``, ``affine_terms_t``, ``win_sums_t``."""
    from crown_cli.engine.kernels import graph_steps as ks
    from crown_cli.engine.node_rules import _widths

    rng = np.random.default_rng(8)

    def both(kernel, args, D, fuse, n_out):
        got = []
        for steer in (False, True):
            out = np.full((n_out, _widths(fuse, steer) if D is not None else
                           (1 if steer else 3)), np.nan)
            Dc = None if D is None else np.full_like(D, np.nan)
            kernel(*args, *([] if Dc is None else [Dc]), out)
            got.append((Dc, out))
        (D0, o0), (D1, o1) = got
        if D is not None:
            np.testing.assert_array_equal(D1, D0)
        np.testing.assert_array_equal(o1[:, 0], o0[:, 0])  # the constant
        if fuse:
            np.testing.assert_array_equal(o1[:, 1], o0[:, 3])  # the input's constant
        assert np.all(np.isfinite(o1))

    for dt in (np.float64, np.float32):
        for h in (5, 97):
            Lt = rng.normal(size=(30, h)).astype(dt)
            Lt[rng.uniform(size=Lt.shape) < 0.3] = 0.0
            read = np.sort(rng.choice(30, 21, replace=False)).astype(np.int64)
            lines = [rng.normal(size=21).astype(dt) for _ in range(4)]
            absval = rng.uniform(0, 2, 21).astype(dt)
            for terms in (np.empty((3, 0), dt), rng.uniform(0, 1, (3, 21)).astype(dt)):
                fuse = terms.shape[1] > 0
                both(ks.activation_step_t, (Lt, read, *lines, absval, terms),
                     np.empty((21, h), dt), fuse, h)
            b3 = [rng.normal(size=30).astype(dt) for _ in range(3)]
            both(ks.affine_terms_t, (Lt, *b3), None, False, h)
            Pt = rng.normal(size=(3, 4, 4, h)).astype(dt)
            Pt[rng.uniform(size=Pt.shape) < 0.3] = 0.0
            oy, ox = rng.integers(-2, 6, h), rng.integers(-2, 6, h)
            order = np.lexsort((ox, oy))
            oy, ox = oy[order], ox[order]
            runs = np.flatnonzero(np.r_[True, (np.diff(oy) != 0) | (np.diff(ox) != 0), True])
            img = [rng.normal(size=(3, 7, 7)).astype(dt) for _ in range(5)]
            for terms in (np.empty((3, 0, 0, 0), dt), rng.uniform(0, 1, (3, 3, 7, 7)).astype(dt)):
                fuse = terms.shape[1] > 0
                both(ks.win_activation_t, (Pt, oy, ox, runs, *img, terms), np.empty_like(Pt),
                     fuse, h)
            both(ks.win_sums_t, (Pt, oy, ox, runs, *img[:3]), None, False, h)


def test_paired_product_equals_the_plain_product():
    """``graph_rows._paired_product``: rows that are pairs on their first n_a elements give
    the plain product W^T Lt to rounding; its kernel (``add_pairs_t``) the twin's numbers."""
    from crown_cli.engine.graph_rows import _paired_product

    rng = np.random.default_rng(4)
    W = rng.normal(size=(50, 17))
    E = rng.normal(size=(50, 9))
    F = rng.normal(size=(50, 9))
    n_a = 20
    F[:n_a] = -E[:n_a]
    Lt = np.hstack([E, F])
    want = W.T @ Lt
    twin = _paired_product(W, Lt, n_a)
    np.testing.assert_allclose(twin, want, rtol=1e-13, atol=1e-13 * np.abs(want).max())
    np.testing.assert_array_equal(_paired_product(W, Lt, n_a, graph_kernels()), twin)


@pytest.mark.parametrize("act", ["relu", "hard_sigmoid"])
def test_both_sides_of_a_dense_node_share_their_products(monkeypatch, act):
    """Both sides of a dense node's neurons (rows [I; -I], ibp=False) on the fast path: the
    weight's rows are written once (E for [E; -E]), the next dense node's products on the
    elements where the activation's two lines have one slope are shared (``_transpose``
    told how many), and every node's bounds equal the numpy twin's to the charges' order
    and hold on sampled points. The first layer takes its interval (exact for an affine map
    of the input over an l_inf ball): no rows of its own. hard_sigmoid: saturated neurons
    have lines of slope 0 whose intercepts still count."""
    import crown_cli.engine.graph_rows as graph_rows
    import crown_cli.engine.node_rules as node_rules
    from crown_cli.graph.network import dense_graph
    from crown_cli.network import MLP

    monkeypatch.setattr(graph_rows, "WEIGHT_ROWS_MIN", 1)
    monkeypatch.setattr(graph_rows, "PAIRED_MIN", 4)
    rng = np.random.default_rng(9)
    sizes = [10, 60, 80, 50, 3]
    ws = [rng.normal(0, 1.5 / np.sqrt(m), (n, m)) for m, n in zip(sizes, sizes[1:])]
    bs = [rng.normal(0.2, 0.5, n) for n in sizes[1:]]
    if act == "hard_sigmoid":  # wide pre-activations: many neurons saturated on the set
        ws = [w * 4.0 for w in ws]
    g = dense_graph(MLP(ws, bs, act))
    x0 = rng.uniform(-1, 1, 10)
    eps = 0.08
    with using_kernels("numpy"):
        ref = GraphBounds(g, x0, eps, 0, ibp=False)
    shared, starts = [], []
    transpose, weight_rows = node_rules._transpose, graph_rows.weight_rows

    def spy(gb, i, rows, kernels, n_a=None):
        shared.append((i, n_a))
        return transpose(gb, i, rows, kernels, n_a)

    def spy_rows(*args):
        out = weight_rows(*args)
        starts.append((args[1], out.paired, out.rows[1].shape[1], args[2].size))
        return out

    import crown_cli.engine.graph_bounds as graph_bounds
    monkeypatch.setattr(node_rules, "_transpose", spy)
    monkeypatch.setattr(graph_bounds, "weight_rows", spy_rows)
    with using_kernels("numba"):
        gb = GraphBounds(g, x0, eps, 0, ibp=False)
    dense = [i for i, n in enumerate(g.nodes) if n.kind == "affine"]
    assert starts and all(p and 2 * w == k for _, p, w, k in starts)  # E alone
    assert dense[0] not in [t for t, _, _, _ in starts]  # the first layer: its interval
    assert any(n_a for _, n_a in shared)  # some products shared
    for i in range(len(g.nodes)):
        np.testing.assert_allclose(gb.lo[i], ref.lo[i], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gb.hi[i], ref.hi[i], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(gb.lo[dense[0]], GraphBounds(g, x0, eps, 0).lo[dense[0]])
    x = x0[None] + rng.uniform(-eps, eps, (4000, 10))
    x[:2000] = x0[None] + eps * np.sign(x[:2000] - x0[None])
    _, vals = g.forward(x, return_all=True)
    for p in dense:
        v = np.asarray(vals[p]).reshape(len(x), -1)
        assert np.all(v >= gb.lo[p] - 1e-12) and np.all(v <= gb.hi[p] + 1e-12)


POOLS = [  # kernel, strides, pads (t, l, b, r), dilations, ceil_mode
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 0),  # VGG's: windows apart
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),  # a ResNet stem's: overlapping, padded
    ((2, 2), (1, 1), (0, 0, 0, 0), (1, 1), 0),
    ((2, 3), (2, 1), (0, 1, 1, 0), (2, 1), 0),  # dilated, uneven
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # ceil mode on an odd side
]


@pytest.mark.parametrize("pool", POOLS)
def test_max_pools_pass_rows_on_windows(tmp_path, monkeypatch, pool):
    """Rows on windows cross a max pool on windows (``PoolRule.back_win``,
    ``win_pool_t``): every node's bounds and the output's equal those of rows written out
    over the pool's input (the pool without its geometry) and the numpy twin's, the windows
    step is taken, and sampled points hold."""
    import onnx

    from crown_cli.engine.kernels import graph_steps
    from crown_cli.graph.onnx_graph import load_graph
    from graph_models import G

    kernel, strides, pads, dil, ceil = pool
    rng = np.random.default_rng(sum(kernel) + 10 * strides[0] + ceil)
    g = G(rng)
    x = g.op("Conv", ["x", g.rand(4, 2, 3, 3), g.rand(4)], pads=[1, 1, 1, 1])
    x = g.op("Relu", [x])
    x = g.op("MaxPool", [x], kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
             dilations=list(dil), ceil_mode=ceil)
    x = g.op("Conv", [x, g.rand(3, 4, 3, 3), g.rand(3)], pads=[1, 1, 1, 1])
    x = g.op("Relu", [x])
    x = g.op("Flatten", [x])
    from graph_models import _shape
    n = int(np.prod(_shape(g, "x", (1, 2, 16, 16), x)[1:]))
    x = g.op("Gemm", [x, g.rand(3, n), g.rand(3)], transB=1)
    path = str(tmp_path / "pool.onnx")
    onnx.save(g.model([("x", (1, 2, 16, 16))], [x]), path)
    graph = load_graph(path)
    op = [n.op for n in graph.nodes if n.kind == "maxpool"][0]
    assert op.geometry is not None
    x0 = rng.uniform(-1, 1, graph.input_size)
    eps = 0.08
    calls = []
    kernel_fn = graph_steps.win_pool_t

    def spy(*args):
        calls.append(args[0].shape)
        return kernel_fn(*args)

    monkeypatch.setattr(graph_steps, "win_pool_t", spy)
    gb = GraphBounds(graph, x0, eps, 0)
    out = gb.bounds()
    assert calls  # the windows step ran
    geometry, op.geometry = op.geometry, None
    rows = GraphBounds(graph, x0, eps, 0)
    with using_kernels("numpy"):
        ref = GraphBounds(graph, x0, eps, 0)
    op.geometry = geometry
    for other in (rows, ref):
        for i in range(len(graph.nodes)):
            np.testing.assert_allclose(gb.lo[i], other.lo[i], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(gb.hi[i], other.hi[i], rtol=1e-9, atol=1e-12)
    for a, b in zip(out, rows.bounds()):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    pts = x0[None] + rng.uniform(-eps, eps, (3000, graph.input_size))
    pts[:1000] = x0[None] + eps * np.sign(pts[:1000] - x0[None])
    y, vals = graph.forward(pts, return_all=True)
    for i in range(len(graph.nodes)):
        v = np.asarray(vals[i]).reshape(len(pts), -1)
        assert np.all(v >= gb.lo[i] - 1e-9) and np.all(v <= gb.hi[i] + 1e-9)


def test_paired_product_and_pool_sums_err_within_their_charges():
    """Exact rationals: the shared product of rows that are pairs errs, element by element,
    by at most gamma_{T+1} of its products' magnitudes (T: the terms of a sum), the charge a
    dense step takes; and a max pool on windows hands each chosen input the exact sum of its
    coefficients within gamma_{T+1} of their magnitudes (overlapping windows, T > 1)."""
    from fractions import Fraction as F
    from types import SimpleNamespace

    from crown_cli.engine.graph_rows import _paired_product, _runs
    from crown_cli.engine.node_rules import PoolLines, PoolRule
    from crown_cli.engine.rounding import U64, gamma_n
    from crown_cli.graph.pooling import pool_windows

    rng = np.random.default_rng(11)
    W = rng.normal(size=(40, 7)) * np.exp(rng.uniform(-8, 8, (40, 7)))
    E, D = rng.normal(size=(40, 5)), rng.normal(size=(40, 5))
    n_a = 25
    D[:n_a] = -E[:n_a]
    Lt = np.hstack([E, D])
    P = _paired_product(W, Lt, n_a, graph_kernels())
    g = gamma_n(W.shape[0] + 1, U64)
    for j in range(W.shape[1]):
        for q in range(Lt.shape[1]):
            exact = sum(F(W[k, j]) * F(Lt[k, q]) for k in range(W.shape[0]))
            mag = sum(abs(F(W[k, j]) * F(Lt[k, q])) for k in range(W.shape[0]))
            assert abs(F(P[j, q]) - exact) <= F(g) * mag

    # a 3x3 / stride 1 pool (each input chosen by up to 9 windows) on windows
    C, H = 2, 7
    (_, OH, OW), win, _ = pool_windows((C, H, H), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    lo = rng.normal(size=C * H * H)
    lo[::5] += 3.0  # some inputs win many windows
    lines = PoolLines(win, lo, lo + rng.uniform(0.0, 0.1, lo.size))
    r = 4
    oy = np.zeros(r, np.int64)
    ox = np.zeros(r, np.int64)
    Pt = rng.normal(size=(C, OH, OW, r)) * np.exp(rng.uniform(-20, 20, (C, OH, OW, r)))
    gb = SimpleNamespace(pools={1: lines}, absval=[np.ones(C * H * H)], lines={},
                         g=SimpleNamespace(nodes=[SimpleNamespace(shape=(1, C, H, H)),
                                                  SimpleNamespace(inputs=(0,))]))
    geo = ((C, H, H), (3, 3), (1, 1), (1, 1), (1, 1))
    chosen = PoolRule._chosen(gb, 1, (C, OH, OW), geo)
    assert chosen is not None
    Dt = np.zeros((C, OH + 2, OW + 2, r))
    sums = np.empty((r, 3))
    graph_kernels().win_pool_t(Pt, oy, ox, _runs(oy, ox), *chosen,
                               np.stack([oy - 1, ox - 1]), Dt, sums)
    g = gamma_n(lines.terms + 1, U64)
    src = lines.src.reshape(C, OH, OW)
    use = (Pt >= 0) | lines.exact.reshape(C, OH, OW)[..., None]
    for q in range(r):
        want = {}
        for c, y, x in zip(*np.nonzero(use[..., q])):
            want.setdefault(int(src[c, y, x]), []).append(F(Pt[c, y, x, q]))
        for k, vs in want.items():
            c, y, x = k // (H * H), (k % (H * H)) // H, k % H
            got = F(Dt[c, y + 1, x + 1, q])
            assert abs(got - sum(vs)) <= F(g) * sum(abs(v) for v in vs)
        assert np.count_nonzero(Dt[..., q]) <= len(want)
