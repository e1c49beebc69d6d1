"""The graph loader (crown_cli.graph.onnx_graph) and the graph's float64 forward pass: every
operator kind, on small ONNX models built here (tests/graph_models.py), against onnx's own
reference evaluator on random inputs; each operation's transpose against its forward map
(the adjoint identity); the refusals (unknown operator, non-affine products, the memory
budget)."""
import os

import numpy as np
import pytest

import onnx
from onnx.reference import ReferenceEvaluator

from crown_cli.errors import InputError
from crown_cli.graph import onnx_graph, onnx_ops
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.graph.ops import Conv, Dense, IndexMap, Scale, Sum

from graph_models import BUILDERS, G


def save(tmp_path, model, name="m"):
    path = os.path.join(str(tmp_path), name + ".onnx")
    onnx.save(model, path)
    return path


def reference_outputs(model, x):
    """The reference evaluator's outputs for flat inputs x (N, d), inputs numbered in order
    (VNN-LIB's X_i), outputs concatenated flat."""
    ref = ReferenceEvaluator(model)
    rows = []
    for row in x:
        feeds, off = {}, 0
        for vi in model.graph.input:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            n = int(np.prod(shape))
            feeds[vi.name] = row[off:off + n].reshape(shape).astype(np.float32)
            off += n
        outs = ref.run(None, feeds)
        rows.append(np.concatenate([np.asarray(o, np.float64).reshape(-1) for o in outs]))
    return np.array(rows)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_forward_equals_onnx_reference(tmp_path, kind):
    model = BUILDERS[kind](np.random.default_rng(3))
    g = load_graph(save(tmp_path, model))
    x = np.random.default_rng(4).uniform(-1.5, 1.5, size=(5, g.input_size))
    got = g.forward(x)
    want = reference_outputs(model, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    # one input without the batch axis gives the same row
    np.testing.assert_allclose(g.forward(x[0]), got[0], rtol=1e-12, atol=1e-12)


def test_folds_and_views(tmp_path):
    """BatchNormalization after a Conv is folded into it; after a Relu into the next Gemm,
    across the Flatten between them; reshapes, transposes and PyTorch's shape arithmetic
    create no node of their own."""
    g = load_graph(save(tmp_path, BUILDERS["conv"](np.random.default_rng(0))))
    kinds = [type(n.op).__name__ for n in g.nodes]
    assert kinds == ["InputOp", "Conv", "ActivationOp", "Dense", "Conv", "ActivationOp", "Dense"]
    assert any("BatchNormalization" in f for f in g.nodes[1].folded)
    assert any("BatchNormalization" in f for f in g.nodes[6].folded)
    assert g.nodes[3].op.sparse and g.nodes[3].op.label.startswith("average pool")
    s = load_graph(save(tmp_path, BUILDERS["shapes"](np.random.default_rng(0)), "s"))
    assert not any(n.name.startswith(("Shape", "Reshape", "Transpose", "Concat"))
                   for n in s.nodes)
    assert s.input_size == 18 and s.output_size == 4


def test_inputs_numbered_in_order(tmp_path):
    model = BUILDERS["two_inputs"](np.random.default_rng(0))
    g = load_graph(save(tmp_path, model))
    assert [(g.nodes[i].op.offset, g.nodes[i].op.size) for i in g.inputs] == [(0, 4), (4, 2)]
    assert g.output_shapes == [(1, 2), (1, 2)]


@pytest.mark.parametrize("mode,pads", [
    ("constant", [0, 0, 1, 2, 0, 0, 2, 1]), ("reflect", [0, 0, 1, 2, 0, 0, 2, 1]),
    ("edge", [0, 0, 1, 2, 0, 0, 2, 1]), ("wrap", [0, 0, 1, 2, 0, 0, 2, 1]),
    ("wrap", [0, 0, 4, 5, 0, 0, 0, 6])])  # (wrap: pads beyond the size go round again)
def test_pad_modes(tmp_path, mode, pads):
    """Every Pad mode against the reference evaluator (wrap: opset 19, the dynamo exporter's
    form of PyTorch's circular padding)."""
    g = G(np.random.default_rng(0))
    y = g.op("Pad", ["x", g.const(pads, np.int64)]
             + ([g.const(np.float32(-0.5))] if mode == "constant" else []), mode=mode)
    y = g.op("Conv", [y, g.rand(2, 3, 2, 2)])
    model = g.model([("x", (1, 3, 4, 4))], [y], opset=19 if mode == "wrap" else 17)
    gr = load_graph(save(tmp_path, model))
    x = np.random.default_rng(1).normal(size=(3, 48))
    np.testing.assert_allclose(gr.forward(x), reference_outputs(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value,mode,pads,fold", [
    (0.0, "constant", [0, 0, 1, 1, 0, 0, 1, 0], True),
    (0.0, "constant", [0, 0, 1, 2, 0, 0, 2, 1], False),  # a window would lie in the padding
    (-0.5, "constant", [0, 0, 1, 1, 0, 0, 1, 0], False),
    (0.0, "reflect", [0, 0, 1, 1, 0, 0, 1, 0], False)])
def test_zero_padding_before_a_convolution_is_its_own(tmp_path, value, mode, pads, fold):
    """A Pad of zeros between an image node and a convolution becomes the convolution's
    padding (no element-moving node in between: rows on windows cross it) where no window
    then lies wholly in the padding; the same function as the reference evaluator's; a pad
    of another value or mode, or a wider one, stays a node."""
    g = G(np.random.default_rng(2))
    y = g.op("Conv", ["x", g.rand(3, 2, 3, 3)], pads=[1, 1, 1, 1])
    y = g.op("Relu", [y])
    y = g.op("Pad", [y, g.const(pads, np.int64), g.const(np.float32(value))], mode=mode)
    y = g.op("Conv", [y, g.rand(2, 3, 3, 3)], strides=[2, 2], pads=[0, 1, 0, 0])
    model = g.model([("x", (1, 2, 6, 6))], [y])
    gr = load_graph(save(tmp_path, model))
    convs = [n for n in gr.nodes if type(n.op).__name__ == "Conv"]
    assert (gr.nodes[convs[1].inputs[0]].kind == "activation") == fold
    if fold:
        assert tuple(convs[1].op.pads) == (1, 2, 1, 0)
    x = np.random.default_rng(1).normal(size=(3, 72))
    np.testing.assert_allclose(gr.forward(x), reference_outputs(model, x), rtol=1e-5, atol=1e-5)
    from crown_cli.engine.graph_bounds import GraphBounds
    from crown_cli.engine.kernels import using_kernels

    with using_kernels("numpy"):
        ref = GraphBounds(gr, x[0], 0.1, 0).bounds()
    for a, b in zip(GraphBounds(gr, x[0], 0.1, 0).bounds(), ref):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def _adjoint(op, rng, r=3):
    xs = [rng.normal(size=(1, n)) for n in op.n_in]
    Lam = rng.normal(size=(r, op.size))
    y = op.forward(xs) - (0.0 if op.bias is None else op.bias)
    parts = op.transpose(Lam)
    lhs = Lam @ y[0]
    rhs = sum(P @ x[0] for P, x in zip(parts, xs))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-10, atol=1e-10)
    # |A| x >= |A x| elementwise and |A|^T is the transpose of the abs map
    absx = [np.abs(x) for x in xs]
    assert np.all(op.forward_abs(absx) >= np.abs(y) - 1e-12)


CONV_PARAMS = [
    dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1),
    dict(strides=(2, 1), pads=(1, 2, 0, 1), dilations=(1, 2), group=1),
    dict(strides=(1, 3), pads=(2, 1, 2, 1), dilations=(2, 1), group=2),
    dict(strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1), group=4),
]


@pytest.mark.parametrize("params", CONV_PARAMS)
def test_conv_transpose_is_the_adjoint(params):
    rng = np.random.default_rng(5)
    g = params["group"]
    op = Conv(rng.normal(size=(4, 4 // g, 3, 2)), rng.normal(size=4), (4, 7, 6), **params)
    _adjoint(op, rng)
    # the dense matrix of the map, column by column, equals the transpose's rows
    A = (op.forward([np.eye(op.n_in[0])]) - op.bias).T
    np.testing.assert_allclose(op.transpose(np.eye(op.size))[0], A, atol=1e-12)


@pytest.mark.parametrize("params", CONV_PARAMS)
@pytest.mark.parametrize("in_hw", [(7, 6), (4, 3)])
def test_conv_by_blas_in_chunks_equals_the_numpy_twin(params, in_hw, monkeypatch):
    """Conv._conv (im2col and BLAS products, chunks of rows of at most GEMM_BYTES of windows:
    here 3 rows a chunk; each row's windows times the kernel on a 7x6 input, one product of
    all windows on a 4x3 one) against the offset-by-offset numpy twin: float64 equal, float32
    kept float32. One row's windows past GEMM_BYTES take the twin."""
    import crown_cli.graph.ops as ops

    rng = np.random.default_rng(9)
    g = params["group"]
    op = Conv(rng.normal(size=(8, 8 // g, 3, 2)), rng.normal(size=8), (8,) + in_hw, **params)
    monkeypatch.setattr(ops, "GEMM_BYTES", 3 * op.window_bytes())
    X = rng.normal(size=(11, op.n_in[0]))
    twin = op._conv_numpy(X, op.weight)
    np.testing.assert_allclose(op._conv(X, op.weight), twin, rtol=1e-12, atol=1e-12)
    y32 = op.linear([X.astype(np.float32)])
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, twin, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(ops, "GEMM_BYTES", op.window_bytes() - 1)
    monkeypatch.setattr(Conv, "_conv_gemm", None)  # not called
    np.testing.assert_allclose(op._conv(X, op.weight), twin, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("params", CONV_PARAMS)
def test_conv_reach_is_where_the_transpose_of_live_outputs_lands(params):
    """Conv.reach (the input positions a transpose of rows on some outputs touches) against
    the transpose itself: positive weights, ones on the live outputs."""
    rng = np.random.default_rng(10)
    g = params["group"]
    op = Conv(rng.uniform(0.5, 1.0, size=(4, 4 // g, 3, 2)), None, (4, 7, 6), **params)
    for share in (0.05, 0.3, 1.0):
        live = np.flatnonzero(rng.random(op.size) < share)
        row = np.zeros((1, op.size))
        row[0, live] = 1.0
        landed = (op._transpose_numpy(row)[0][0] != 0.0).reshape(op.in_shape).any(axis=0)
        np.testing.assert_array_equal(op.reach(live), landed)


def test_other_ops_transpose_is_the_adjoint():
    import scipy.sparse as sp

    rng = np.random.default_rng(6)
    _adjoint(Dense(rng.normal(size=(5, 7)), rng.normal(size=5)), rng)
    _adjoint(Dense(sp.random(6, 9, density=0.3, random_state=1), rng.normal(size=6)), rng)
    _adjoint(IndexMap([3, -1, 0, 3, 5, 1, -2], [4, 2], [0.5, -1.0]), rng)  # duplicates, fill
    _adjoint(IndexMap([2, 0, 1, 4, 3], [3, 2]), rng)  # a permutation over two inputs
    _adjoint(Scale(rng.normal(size=4), rng.normal(size=4)), rng)
    _adjoint(Sum([1.0, -1.0, 1.0], 3), rng)
    assert IndexMap([3, -1, 0, 3], [4], [0.5]).terms == 2
    assert IndexMap([2, 0, 1], [3]).terms == 0


def _fails(tmp_path, model, *words):
    with pytest.raises(InputError) as exc:
        load_graph(save(tmp_path, model, "bad"))
    msg = str(exc.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_refusals_name_operator_and_node(tmp_path):
    g = G(np.random.default_rng(0))
    y = g.op("LRN", ["x"], size=3)
    _fails(tmp_path, g.model([("x", (1, 3, 4, 4))], [y]),
           "LRN node 'LRN2': unsupported operator LRN")
    g = G(np.random.default_rng(0))
    h = g.op("Reshape", [g.op("Relu", ["x"]), g.const([3], np.int64)])
    y = g.op("MatMul", [h, g.op("Reshape", ["x", g.const([3], np.int64)])])
    _fails(tmp_path, g.model([("x", (1, 3))], [y]), "MatMul node",
           "two data tensors of rank 1 is not supported")
    g = G(np.random.default_rng(0))
    y = g.op("Conv", ["x", g.rand(2, 3, 2, 2, 2)])  # 3-D
    _fails(tmp_path, g.model([("x", (1, 3, 4, 4, 4))], [y]), "Conv node",
           "only 1-D and 2-D convolutions are supported")
    g = G(np.random.default_rng(0))
    y = g.op("Conv", ["x", g.rand(2, 3, 3)])  # 1-D weights on an image
    _fails(tmp_path, g.model([("x", (1, 3, 5, 5))], [y]), "Conv node",
           "a 1-D convolution needs data of shape (1, C, L)")


def test_large_mostly_zero_weights_stay_sparse(tmp_path, monkeypatch):
    """A MatMul by a large mostly-zero constant is a sparse layer (never densified); one that
    would not fit the budget is refused in one line before anything is allocated."""
    rng = np.random.default_rng(0)
    W = np.zeros((300, 300), np.float32)
    W[rng.integers(0, 300, 500), rng.integers(0, 300, 500)] = rng.normal(size=500)
    g = G(rng)
    y = g.op("MatMul", [g.op("Mul", ["x", g.const(np.full(300, 2.0))]), g.const(W)])
    model = g.model([("x", (1, 300))], [y])
    monkeypatch.setattr(onnx_ops, "SPARSE_MIN_SIZE", 10_000)
    gr = load_graph(save(tmp_path, model))
    dense = [n.op for n in gr.nodes if isinstance(n.op, Dense)]
    assert len(dense) == 1 and dense[0].sparse and dense[0].W.nnz <= 500
    x = rng.normal(size=(2, 300))
    np.testing.assert_allclose(gr.forward(x), reference_outputs(model, x), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(onnx_graph, "MEMORY_BUDGET", 1000)
    _fails(tmp_path, model, "MatMul node", "GiB", "over the budget")


def test_load_network_keeps_mlps_and_inspect_shows_graphs(tmp_path):
    from click.testing import CliRunner

    from crown_cli.cli import cli
    from crown_cli.graph.network import Graph
    from crown_cli.io.networks import load_network
    from crown_cli.network import MLP

    chain = save(tmp_path, BUILDERS["dense"](np.random.default_rng(0)), "chain")
    assert isinstance(load_network(chain).dense, MLP)  # every network a graph, a chain
    g = G(np.random.default_rng(0))  # with its dense form; a Softmax output is the MLP's
    y = g.op("Softmax", [g.op("Gemm", ["x", g.rand(3, 4)], transB=1)], axis=-1)
    sm = load_network(save(tmp_path, g.model([("x", (1, 4))], [y]), "sm"))
    assert sm.dense.output_activation == "softmax" and sm.vector_output[0] == "softmax"
    conv = save(tmp_path, BUILDERS["conv"](np.random.default_rng(0)), "conv")
    assert isinstance(load_network(conv), Graph) and load_network(conv).dense is None
    out = CliRunner().invoke(cli, ["inspect", "--model", conv])
    assert out.exit_code == 0, out.output
    assert "graph:       7 nodes" in out.output and "input size:  84 (1x2x6x7)" in out.output
    assert "conv 2 -> 4, kernel 3x3" in out.output and "(folded: BatchNormalization" in out.output
    assert "average pool 2x2" in out.output
    out = CliRunner().invoke(cli, ["inspect", "--model", chain])
    assert out.exit_code == 0 and "layers:      3 weight layers (5-8-7-3)" in out.output


def test_scalings_fold_into_the_next_layer(tmp_path):
    g = load_graph(save(tmp_path, BUILDERS["normalised"](np.random.default_rng(0))))
    kinds = [type(n.op).__name__ for n in g.nodes]
    assert kinds == ["InputOp", "Conv", "ActivationOp", "Dense"]
    assert [f[:3] for f in g.nodes[1].folded] == ["Sub", "Div"]
    assert [f[:3] for f in g.nodes[3].folded] == ["Mul"]


@pytest.mark.parametrize("op,attrs", [
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2, 3], auto_pad="SAME_UPPER")),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER")),
    # the spec's SAME_LOWER pads for this dilated kernel (onnx.reference 1.17 computes them
    # for the undilated kernel, which the spec does not say)
    ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 1], pads=[1, 1, 1, 0])),
])
def test_pool_variants(tmp_path, op, attrs):
    g = G(np.random.default_rng(0))
    y = g.op(op, ["x"], **attrs)
    model = g.model([("x", (1, 2, 5, 6))], [y], opset=19)
    gr = load_graph(save(tmp_path, model))
    x = np.random.default_rng(1).normal(size=(3, 60))
    want = reference_outputs(model, x)
    assert gr.output_size == want.shape[1]
    np.testing.assert_allclose(gr.forward(x), want, rtol=1e-5, atol=1e-5)


def _pool_loop(x, kind, k, s, p, d, inc):
    """A pool of x (C, H, W) by the ONNX/PyTorch definition, one window at a time, with
    ceil_mode: output size ceil((n + pads - d (k - 1) - 1) / s) + 1, less one when the last
    window would start past the input and its leading padding; padding and positions past the
    padded input never enter a max or a sum; count_include_pad divides by the window's part
    inside the padded input."""
    C, H, W = x.shape

    def size(n, kk, ss, pb, pe, dd):
        o = -(-(n + pb + pe - dd * (kk - 1) - 1) // ss) + 1
        return o - 1 if (o - 1) * ss >= n + pb else o

    OH, OW = size(H, k[0], s[0], p[0], p[2], d[0]), size(W, k[1], s[1], p[1], p[3], d[1])
    y = np.empty((C, OH, OW))
    for i in range(OH):
        for j in range(OW):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            cells = [(hs + a * d[0], ws + b * d[1]) for a in range(k[0]) for b in range(k[1])]
            vals = [x[:, r, c] for r, c in cells if 0 <= r < H and 0 <= c < W]
            if kind == "MaxPool":
                y[:, i, j] = np.max(vals, axis=0)
            else:
                div = ((min(hs + k[0], H + p[2]) - hs) * (min(ws + k[1], W + p[3]) - ws)
                       if inc else len(vals))
                y[:, i, j] = np.sum(vals, axis=0) / div
    return y


def test_ceil_mode_pools_with_asymmetric_pads_equal_a_window_loop(tmp_path):
    """ceil_mode pools with asymmetric pads, strides, dilations and both count_include_pad
    equal :func:`_pool_loop` (onnx.reference 1.23 is no oracle here: it reads asymmetric pool
    pads in another order and sizes some ceil_mode outputs differently)."""
    rng = np.random.default_rng(0)
    for t in range(120):
        C, H, W = 2, int(rng.integers(3, 9)), int(rng.integers(3, 9))
        kind = "MaxPool" if t % 2 else "AveragePool"
        k = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
        s = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
        p = [int(rng.integers(0, k[i % 2])) for i in range(4)]
        d = [int(rng.integers(1, 3)), int(rng.integers(1, 3))] if kind == "MaxPool" else [1, 1]
        inc = int(rng.integers(0, 2))
        attrs = dict(kernel_shape=k, pads=p, strides=s, ceil_mode=1)
        if kind == "MaxPool":
            attrs["dilations"] = d
        else:
            attrs["count_include_pad"] = inc
        g = G(rng)
        y = g.op(kind, ["x"], **attrs)
        gr = load_graph(save(tmp_path, g.model([("x", (1, C, H, W))], [y])))
        x = rng.normal(size=(C, H, W))
        want = _pool_loop(x, kind, k, s, p, d, inc).reshape(-1)
        assert gr.output_size == want.size, (kind, k, s, p, d, (H, W))
        np.testing.assert_allclose(gr.forward(x.reshape(1, -1))[0], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("op,attrs,axes,opset", [
    ("GlobalAveragePool", {}, None, 17),
    ("GlobalMaxPool", {}, None, 17),
    ("ReduceMean", dict(keepdims=1), [2, 3], 18),  # PyTorch's AdaptiveAvgPool2d(1), dynamo
    ("ReduceMean", dict(keepdims=0), [-1, 2], 18),  # x.mean(dim=(2, 3))
    ("ReduceMean", dict(keepdims=0, axes=[1]), None, 13),  # axes as an attribute
    ("ReduceMean", dict(keepdims=1), None, 18),  # no axes: all of them
    ("ReduceMean", dict(keepdims=0, noop_with_empty_axes=1), None, 18),
])
def test_global_pools_and_reduce_mean(tmp_path, op, attrs, axes, opset):
    """The whole-image pools and ReduceMean (what torch.onnx.export writes for
    AdaptiveAvgPool2d(1) and x.mean(dim)) against onnx.reference; a ReLU before them so that
    the pooled tensor is a node's output, a Gemm after so that the layout matters."""
    g = G(np.random.default_rng(0))
    h = g.op("Relu", ["x"])
    ins = [h] if axes is None else [h, g.const(np.array(axes), np.int64)]
    y = g.op(op, ins, **attrs)
    model = g.model([("x", (1, 3, 4, 5))], [y], opset=opset)
    gr = load_graph(save(tmp_path, model))
    x = np.random.default_rng(1).normal(size=(3, 60))
    want = reference_outputs(model, x)
    assert gr.output_size == want.shape[1]
    np.testing.assert_allclose(gr.forward(x), want, rtol=1e-5, atol=1e-6)
    kinds = [n.kind for n in gr.nodes]
    if "noop_with_empty_axes" in attrs:
        assert kinds == ["input", "activation"] and gr.output_size == 60
    elif op != "GlobalMaxPool":
        assert kinds == ["input", "activation", "affine"]


def test_wrap_padding_is_the_torus(tmp_path):
    """Pad mode wrap, independently of numpy's and the reference evaluator's own np.pad: out
    element (c, i, j) is x's (c, (i - top) mod H, (j - left) mod W), also for pads larger
    than the image."""
    g = G(np.random.default_rng(0))
    top, left, bottom, right = 5, 1, 2, 7
    y = g.op("Pad", ["x", g.const([0, 0, top, left, 0, 0, bottom, right], np.int64)],
             mode="wrap")
    model = g.model([("x", (1, 2, 3, 4))], [y], opset=19)
    gr = load_graph(save(tmp_path, model))
    x = np.random.default_rng(2).normal(size=(2, 24))
    out = gr.forward(x).reshape(2, 2, 3 + top + bottom, 4 + left + right)
    X = x.reshape(2, 2, 3, 4)
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            np.testing.assert_array_equal(out[:, :, i, j], X[:, :, (i - top) % 3, (j - left) % 4])
