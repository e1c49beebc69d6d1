"""ONNX graphs as real files write them: normalisation, scaling, MatMul on either side, every
Gemm form, reshapes, symbolic batch, Constant nodes, a ReLU on the logits, and a published
ACAS Xu network (VNN-COMP 2021). Every accepted graph's outputs are compared with onnx's own
reference evaluator (onnx.reference.ReferenceEvaluator) on random inputs; the graphs compute
in float32 like real files, the loader in float64.
"""
import os

import numpy as np
import pytest
from click.testing import CliRunner

import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from crown_cli.cli import cli
from crown_cli.errors import InputError
from crown_cli.graph.network import Graph
from crown_cli.graph.onnx_file import graph_feeds
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.graph.ops import Dense
from crown_cli.io.networks import load_network
from crown_cli.io.results import read_rows
from crown_cli.network import MLP

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
ACASXU = os.path.join(FIXTURES, "ACASXU_run2a_1_1_batch_2000.onnx")
RTOL = 1e-5


def f32(a):
    return np.asarray(a, dtype=np.float32)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def const_node(name, array):
    return helper.make_node("Constant", [], [name], name=f"const_{name}",
                            value=numpy_helper.from_array(np.asarray(array), f"{name}_value"))


def save(path, nodes, inits, in_shape, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def assert_matches_reference(path, n=6, seed=0, scale=1.0):
    """Loads ``path`` (an MLP), compares forward on n random inputs with the reference
    evaluator."""
    mlp = load_network(path).dense
    assert isinstance(mlp, MLP)
    x = np.random.default_rng(seed).uniform(-scale, scale, size=(n, mlp.input_size))
    ref = ReferenceEvaluator(onnx.load(path))
    expected = np.stack([np.asarray(ref.run(None, feed)[0], dtype=np.float64).reshape(-1)
                         for feed in graph_feeds(path, x, mlp.input_order)])
    got = mlp.forward(x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=RTOL * np.abs(expected).max())
    # not trivially equal: the outputs vary with the input
    assert np.ptp(expected, axis=0).max() > 1e-3
    return mlp


def rand(shape, seed):
    return f32(np.random.default_rng(seed).normal(size=shape) / np.sqrt(shape[-1]))


# ------------------------------------------------------------------- published network


def test_acasxu_network_loads_and_matches_the_reference():
    model = onnx.load(ACASXU)
    inits = {i.name for i in model.graph.initializer}
    assert len(model.graph.input) > 1 and inits <= {i.name for i in model.graph.input}  # old style
    assert [n.op_type for n in model.graph.node][:4] == ["Sub", "Flatten", "MatMul", "Add"]
    mlp = assert_matches_reference(ACASXU, n=20, scale=0.5)
    assert mlp.sizes == [5] + [50] * 6 + [5] and mlp.activation == "relu"
    assert mlp.output_activation is None and mlp.weights[0].dtype == np.float64


def test_acasxu_certify_runs(tmp_path):
    mlp = load_network(ACASXU).dense
    x = np.random.default_rng(1).uniform(-0.3, 0.3, size=(3, 5))
    np.savez(tmp_path / "pts.npz", x=x, y=np.argmax(mlp.forward(x), axis=1))
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", ACASXU, "--images", str(tmp_path / "pts.npz"),
                                   "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = read_rows(out)
    assert len(rows) == 3 and all(float(r["eps"]) > 0 for r in rows)


# ------------------------------------------------------------------- operator forms


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta,bias", [
    (0, 0, 1.0, 1.0, "vector"), (0, 1, 1.0, 1.0, "vector"), (1, 0, 0.5, 2.0, "row"),
    (1, 1, -1.5, 0.25, "scalar"), (0, 1, 2.0, 1.0, None), (1, 1, 1.0, 0.0, "vector"),
])
@pytest.mark.parametrize("data_as", ["A", "B"])
def test_gemm_attribute_forms(tmp_path, trans_a, trans_b, alpha, beta, bias, data_as):
    """The data as A (Y = op(x) op(W) ...) or as B (Y = op(W) op(x) ...), both layers."""
    w0, w1 = rand((6, 4), 1), rand((3, 6), 2)
    nodes, inits, cur = [], [], "x"
    if (data_as == "A" and trans_a) or (data_as == "B" and not trans_b):
        # the data enters as a column (features, batch)
        nodes.append(helper.make_node("Transpose", [cur], ["xt"], name="to_column", perm=[1, 0]))
        cur = "xt"
    if data_as == "A":  # op(x) @ op(B): B is (in, out), transposed when transB
        b_mat = w0 if trans_b else w0.T
        ins = [cur, "W0"]
        out_shape = (1, 6)
    else:  # op(A) @ op(x): A is (out, in), transposed when transA
        b_mat = w0.T if trans_a else w0
        ins = ["W0", cur]
        out_shape = (6, 1)
    inits.append(init("W0", b_mat))
    if bias is not None:
        c = {"vector": f32(np.linspace(-1, 1, 6)), "row": f32(np.linspace(-1, 1, 6)).reshape(out_shape),
             "scalar": f32(0.3)}[bias]
        if bias == "vector" and data_as == "B":
            c = c.reshape(6, 1)
        inits.append(init("C0", c))
        ins.append("C0")
    nodes.append(helper.make_node("Gemm", ins, ["z0"], name="gemm0", transA=trans_a, transB=trans_b,
                                  alpha=alpha, beta=beta))
    nodes.append(helper.make_node("Relu", ["z0"], ["a0"], name="relu0"))
    cur = "a0"
    if data_as == "B":
        nodes.append(helper.make_node("Transpose", [cur], ["a0t"], name="to_row"))
        cur = "a0t"
    inits += [init("W1", w1), init("C1", f32([0.1, -0.2, 0.3]))]
    nodes.append(helper.make_node("Gemm", [cur, "W1", "C1"], ["y"], name="gemm1", transB=1))
    path = save(tmp_path / "g.onnx", nodes, inits, [1, 4])
    mlp = assert_matches_reference(path)
    assert mlp.sizes == [4, 6, 3] and mlp.layer_names == ["gemm0", "gemm1"]


def test_matmul_with_the_constant_on_either_side(tmp_path):
    """W @ x on a (1, 784-like, 1) column input, then x @ W after a Squeeze."""
    w0, w1, w2 = rand((5, 8), 3), rand((4, 5), 4), rand((3, 4), 5)
    nodes = [helper.make_node("MatMul", ["W0", "x"], ["m0"], name="w_at_x"),  # (1, 5, 1)
             helper.make_node("Add", ["m0", "b0"], ["z0"], name="bias0"),
             helper.make_node("Tanh", ["z0"], ["a0"], name="tanh0"),
             helper.make_node("Squeeze", ["a0", "axes"], ["s0"], name="squeeze"),  # (1, 5)
             helper.make_node("MatMul", ["s0", "W1"], ["m1"], name="x_at_w"),
             helper.make_node("Tanh", ["m1"], ["a1"], name="tanh1"),
             helper.make_node("MatMul", ["a1", "W2"], ["y"], name="out")]
    inits = [init("W0", w0), init("b0", f32(np.arange(5).reshape(5, 1) * 0.1)),
             init("axes", np.array([2], dtype=np.int64)), init("W1", w1.T), init("W2", w2.T)]
    mlp = assert_matches_reference(save(tmp_path / "m.onnx", nodes, inits, [1, 8, 1]))
    assert mlp.sizes == [8, 5, 4, 3] and mlp.activation == "tanh"


def _normalised_chain(tmp_path, mean, std, w0, b0, w1):
    """(x - mean) / std on a (1, 1, 2, 3) input, Flatten, Gemm(W0, b0), Relu, Gemm(W1): the
    ONNX file's path."""
    nodes = [helper.make_node("Sub", ["x", "mean"], ["c"], name="centre"),
             helper.make_node("Div", ["c", "std"], ["n"], name="scale"),
             helper.make_node("Flatten", ["n"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "W0", "b0"], ["z"], name="dense0", transB=1),
             helper.make_node("Relu", ["z"], ["a"], name="relu"),
             helper.make_node("Gemm", ["a", "W1"], ["y"], name="dense1", transB=1)]
    inits = [init("mean", mean), init("std", std), init("W0", w0), init("b0", b0), init("W1", w1)]
    return save(tmp_path / "n.onnx", nodes, inits, [1, 1, 2, 3])


def test_normalisation_before_the_first_layer_is_folded(tmp_path):
    """(x - mean) / std on an image-shaped input (ACAS Xu / VNN style), then Flatten."""
    mean, std = f32([[0.5, -0.25, 1.0]]), f32([2.0, 0.5, 4.0])
    w0, w1 = rand((6, 6), 6), rand((3, 6), 7)
    path = _normalised_chain(tmp_path, mean, std, w0, f32(np.ones(6) * 0.1), w1)
    mlp = assert_matches_reference(path)
    assert mlp.sizes == [6, 6, 3]
    # the fold is the math: W0 / std (per column), b0 - W0 (mean / std)
    cols = np.tile(std.astype(np.float64), 2)
    assert np.allclose(mlp.weights[0], w0 / cols, rtol=1e-12)
    assert np.allclose(mlp.biases[0], 0.1 - (w0 / cols) @ np.tile(mean[0].astype(np.float64), 2),
                       rtol=1e-6)


def test_a_normalised_chain_loads_as_the_graphs_float64_fold(tmp_path):
    """One ONNX reader: the MLP of a chain is the exact dense form of the graph load_graph
    reads, whose loader folds (x - mean) / std into the first Gemm in float64: the same
    weights, bit for bit, as that composition computed here."""
    mean, std = f32([[0.5, -0.25, 1.0]]), f32([2.0, 0.5, 3.0])
    w0, w1, b0 = rand((6, 6), 6), rand((3, 6), 7), f32(np.linspace(-0.3, 0.2, 6))
    path = _normalised_chain(tmp_path, mean, std, w0, b0, w1)
    mlp = assert_matches_reference(path)
    a = np.tile(1.0 / std.astype(np.float64), 2)
    c = a * -np.tile(mean[0].astype(np.float64), 2)
    W0 = w0.astype(np.float64)
    assert np.array_equal(mlp.weights[0], W0 * a[None, :])
    assert np.array_equal(mlp.biases[0], W0 @ c + b0.astype(np.float64))
    assert np.array_equal(mlp.weights[1], w1.astype(np.float64)) and not mlp.biases[1].any()
    g = load_graph(path)  # the graph engine's nodes hold the same arrays
    dense = [n.op for n in g.nodes if isinstance(n.op, Dense)]
    assert [n.kind for n in g.nodes] == ["input", "affine", "activation", "affine"]
    for k, op in enumerate(dense):
        assert np.array_equal(mlp.weights[k], op.W)
    assert np.array_equal(mlp.biases[0], dense[0].bias)


def test_constant_minus_x_is_a_negation_and_scaling_after_a_layer_is_folded(tmp_path):
    w0, w1 = rand((5, 4), 8), rand((3, 5), 9)
    nodes = [helper.make_node("Sub", ["k", "x"], ["nx"], name="c_minus_x"),
             helper.make_node("MatMul", ["nx", "W0"], ["m"], name="dense0"),
             helper.make_node("Mul", ["m", "gain"], ["g"], name="gain"),  # vector scaling
             helper.make_node("Add", ["shift", "g"], ["z"], name="shift"),
             helper.make_node("Relu", ["z"], ["a"], name="relu"),
             helper.make_node("MatMul", ["a", "W1"], ["m1"], name="dense1"),
             helper.make_node("Mul", ["two", "m1"], ["y"], name="times_two")]  # scalar, first
    inits = [init("k", f32(0.75)), init("W0", w0.T), init("gain", f32([1, -2, 0.5, 3, 0.1])),
             init("shift", f32(0.2)), init("W1", w1.T), init("two", f32(2.0))]
    mlp = assert_matches_reference(save(tmp_path / "s.onnx", nodes, inits, ["N", 4]))
    assert mlp.sizes == [4, 5, 3] and mlp.layer_names == ["dense0", "dense1"]


def test_a_relu_on_the_logits_is_kept_as_output_activation(tmp_path):
    w0, w1 = rand((6, 4), 10), rand((3, 6), 11)
    nodes = [helper.make_node("Gemm", ["x", "W0", "b0"], ["z0"], name="dense0", transB=1),
             helper.make_node("Relu", ["z0"], ["a0"], name="relu0"),
             helper.make_node("Gemm", ["a0", "W1", "b1"], ["z1"], name="dense1", transB=1),
             helper.make_node("Relu", ["z1"], ["y"], name="relu_logits")]
    inits = [init("W0", w0), init("b0", f32(np.zeros(6))), init("W1", w1),
             init("b1", f32([0.5, -0.5, 0.0]))]
    path = save(tmp_path / "r.onnx", nodes, inits, ["N", 4])
    mlp = assert_matches_reference(path, n=40)
    assert mlp.output_activation == "relu" and mlp.sizes == [4, 6, 3]
    assert not mlp.keeps_logit_order()
    ws, bs = mlp.verify_layers()
    assert len(ws) == 3 and np.array_equal(ws[2], np.eye(3))
    x = np.random.default_rng(0).normal(size=(40, 4))
    assert np.any(mlp.forward(x) == 0) and np.all(mlp.forward(x) >= 0)


def test_certify_bounds_a_relu_on_the_logits_as_a_layer(tmp_path):
    """certify's margins are the post-ReLU outputs': sampled points inside every certified
    l_inf ball keep the label strictly above the target."""
    w0, w1 = rand((8, 4), 12), rand((3, 8), 13)
    nodes = [helper.make_node("Gemm", ["x", "W0"], ["z0"], name="dense0", transB=1),
             helper.make_node("Relu", ["z0"], ["a0"], name="relu0"),
             helper.make_node("Gemm", ["a0", "W1", "b1"], ["z1"], name="dense1", transB=1),
             helper.make_node("Relu", ["z1"], ["y"], name="relu_logits")]
    path = save(tmp_path / "r.onnx", nodes, [init("W0", w0), init("W1", w1), init("b1", f32([1, 1, 1]))],
                ["N", 4])
    mlp = load_network(path).dense
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 4))
    out = mlp.forward(x)
    keep = np.sort(out, axis=1)[:, -1] > np.sort(out, axis=1)[:, -2]  # a strict winner
    x = x[keep]
    np.savez(tmp_path / "pts.npz", x=x, y=np.argmax(mlp.forward(x), axis=1))
    res = CliRunner().invoke(cli, ["certify", "--model", path, "--images", str(tmp_path / "pts.npz"),
                                   "--target", "runner-up,least", "-q", "-o", str(tmp_path / "r.csv")])
    assert res.exit_code == 0, res.output
    rows = read_rows(tmp_path / "r.csv")
    assert rows and any(float(r["eps"]) > 0 for r in rows)
    for r in rows:
        i, label, target, eps = int(r["image"]), int(r["label"]), int(r["target"]), float(r["eps"])
        pts = x[i] + rng.uniform(-eps, eps, size=(2000, 4))
        pts[:4] = x[i] + eps * np.sign(rng.normal(size=(4, 4)))
        o = mlp.forward(pts)
        assert np.all(o[:, label] > o[:, target])


def test_symbolic_batch_constant_nodes_unsqueeze_and_identity(tmp_path):
    w0, w1 = rand((5, 6), 14), rand((3, 5), 15)
    nodes = [const_node("W0", w0), const_node("b0", f32(np.full(5, 0.05))), const_node("W1", w1),
             helper.make_node("Identity", ["x"], ["xi"], name="id"),
             helper.make_node("Reshape", ["xi", "shape"], ["f"], name="reshape"),  # (N, 6)
             helper.make_node("Gemm", ["f", "W0", "b0"], ["z"], name="dense0", transB=1),
             helper.make_node("Sigmoid", ["z"], ["a"], name="sig"),
             helper.make_node("Unsqueeze", ["a"], ["u"], name="unsq", axes=[1]),  # opset 11 attr
             helper.make_node("Flatten", ["u"], ["uf"], name="flat"),
             helper.make_node("Gemm", ["uf", "W1"], ["y"], name="dense1", transB=1)]
    inits = [init("shape", np.array([-1, 6], dtype=np.int64))]
    path = save(tmp_path / "b.onnx", nodes, inits, ["batch", 2, 3], opset=11)
    mlp = assert_matches_reference(path)
    assert mlp.sizes == [6, 5, 3] and mlp.activation == "sigmoid"
    x = np.random.default_rng(1).normal(size=(7, 6))  # a real batch of 7 at once
    ref = ReferenceEvaluator(onnx.load(path)).run(None, {"x": f32(x).reshape(7, 2, 3)})[0]
    np.testing.assert_allclose(mlp.forward(x), ref, rtol=RTOL, atol=RTOL)


def test_a_transpose_that_reorders_features_is_followed(tmp_path):
    w0, w1 = rand((4, 6), 16), rand((3, 4), 17)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="swap", perm=[0, 2, 1]),  # (1, 3, 2)
             helper.make_node("Flatten", ["t"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "W0"], ["z"], name="dense0", transB=1),
             helper.make_node("Relu", ["z"], ["a"], name="relu"),
             helper.make_node("Gemm", ["a", "W1"], ["y"], name="dense1", transB=1)]
    path = save(tmp_path / "t.onnx", nodes, [init("W0", w0), init("W1", w1)], [1, 2, 3])
    mlp = assert_matches_reference(path)
    order = np.arange(6).reshape(2, 3).T.reshape(-1)  # graph column j reads input element order[j]
    assert np.array_equal(mlp.weights[0][:, order], w0.astype(np.float64))


def test_a_final_softmax_after_a_reshape(tmp_path):
    w0, w1 = rand((5, 4), 18), rand((3, 5), 19)
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["z"], name="dense0"),
             helper.make_node("Relu", ["z"], ["a"], name="relu"),
             helper.make_node("MatMul", ["a", "W1"], ["l"], name="dense1"),
             helper.make_node("Softmax", ["l"], ["p"], name="softmax"),
             helper.make_node("Reshape", ["p", "shape"], ["y"], name="out")]
    inits = [init("W0", w0.T), init("W1", w1.T), init("shape", np.array([-1], dtype=np.int64))]
    mlp = assert_matches_reference(save(tmp_path / "p.onnx", nodes, inits, [1, 4]), scale=3.0)
    assert mlp.output_activation == "softmax" and mlp.keeps_logit_order()


# ------------------------------------------------------------------- refused graphs


def refused(tmp_path, nodes, inits, in_shape=("N", 4)):
    path = save(tmp_path / "bad.onnx", nodes, inits, list(in_shape))
    with pytest.raises(InputError) as info:
        load_network(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    return msg[len(path) + 2:]


def _two_layers(before=(), middle=(), after=()):
    return (list(before) + [helper.make_node("Gemm", ["x" if not before else before[-1].output[0], "W0"],
                                             ["z0"], name="dense0", transB=1)]
            + list(middle) + [helper.make_node("Gemm", [middle[-1].output[0] if middle else "z0", "W1"],
                                               ["y"], name="dense1", transB=1)] + list(after))


W_INITS = [init("W0", rand((5, 4), 20)), init("W1", rand((3, 5), 21))]


def test_constant_divided_by_x_is_a_graph_node_not_an_mlp(tmp_path):
    """1 / z (issue 36: a reciprocal node) loads, as a graph: the chain is not lowered to an
    MLP, whose activations are one type and MLP activations only."""
    from crown_cli.graph.lower import lowered

    nodes = _two_layers(middle=[helper.make_node("Div", ["one", "z0"], ["q"], name="inverse")])
    path = save(tmp_path / "inv.onnx", nodes, W_INITS + [init("one", f32(1.0))], ["N", 4])
    g = load_network(path)
    assert lowered(g) is None
    assert g.lowering[1] == "reciprocal is a graph node only (no MLP activation)"
    assert [n.op.name for n in g.nodes if n.kind == "activation"] == ["reciprocal"]


def test_an_unsupported_operator_is_named(tmp_path):
    nodes = _two_layers(middle=[helper.make_node("Hardmax", ["z0"], ["a"], name="one_hot")])
    msg = refused(tmp_path, nodes, W_INITS)
    assert msg == ("Hardmax node 'one_hot': unsupported operator Hardmax (docs/formats.md lists "
                   "the supported operators)")
    nodes = _two_layers(middle=[helper.make_node("Ceil", ["z0"], ["a"], name="ceiling")])
    msg = refused(tmp_path, nodes, W_INITS)  # read on constants only (shape arithmetic)
    assert msg == ("Ceil node 'ceiling': every input must be a constant (initializer, Constant "
                   "node or shape arithmetic)")


def test_an_activation_on_the_input_is_an_identity_first_layer(tmp_path):
    nodes = _two_layers(before=[helper.make_node("Relu", ["x"], ["rx"], name="input_relu")],
                        middle=[helper.make_node("Relu", ["z0"], ["a"], name="relu")])
    mlp = assert_matches_reference(save(tmp_path / "in.onnx", nodes, W_INITS, ["N", 4]))
    assert mlp.sizes == [4, 4, 5, 3] and np.array_equal(mlp.weights[0], np.eye(4))
    assert mlp.layer_names == ["identity", "dense0", "dense1"]


def test_softmax_between_layers_is_refused(tmp_path):
    nodes = _two_layers(middle=[helper.make_node("Softmax", ["z0"], ["a"], name="mid_softmax")])
    msg = refused(tmp_path, nodes, W_INITS)
    assert msg == "Gemm node 'dense1': Softmax is supported only at the output"


def test_a_softmax_only_on_the_logits_of_a_dense_chain_over_all_outputs(tmp_path):
    layers = [helper.make_node("Gemm", ["x", "W0"], ["z0"], name="dense0", transB=1),
              helper.make_node("Relu", ["z0"], ["a"], name="relu"),
              helper.make_node("Gemm", ["a", "W1"], ["z1"], name="dense1", transB=1)]
    nodes = layers + [helper.make_node("LogSoftmax", ["z1"], ["y"], name="sm", axis=0)]
    msg = refused(tmp_path, nodes, W_INITS, in_shape=(1, 4))
    assert msg == "LogSoftmax node 'sm': axis 0 does not run over all 3 outputs of shape (1, 3)"
    # a Softmax along another axis is a softmax inside the graph (here of one value: 1)
    nodes = layers + [helper.make_node("Softmax", ["z1"], ["y"], name="sm", axis=0)]
    g = load_network(save(tmp_path / "sm0.onnx", nodes, W_INITS, ["N", 4]))
    np.testing.assert_allclose(g.forward(np.array([0.3, -1.0, 2.0, 0.5])), 1.0)
    # after a Tanh on the logits: no MLP takes both; a graph whose output leaves the softmax
    # off (verify takes its pairwise properties only: tests/test_sign.py)
    nodes = layers + [helper.make_node("Tanh", ["z1"], ["t"], name="tanh"),
                      helper.make_node("LogSoftmax", ["t"], ["y"], name="lsm")]
    g = load_network(save(tmp_path / "tanh_lsm.onnx", nodes, W_INITS, ["N", 4]))
    assert isinstance(g, Graph) and g.vector_output == ("log_softmax", "LogSoftmax node 'lsm'")
    nodes = layers + [helper.make_node("LogSoftmax", ["z1"], ["y"], name="lsm")]
    mlp = assert_matches_reference(save(tmp_path / "lsm.onnx", nodes, W_INITS, ["N", 4]))
    assert mlp.output_activation == "log_softmax" and mlp.sizes == [4, 5, 3]


def test_data_times_data_is_a_product_node(tmp_path):
    """z0 * z0 (issue 36): a product node of the graph, bounds enclosing sampled values."""
    from crown_cli.engine.graph_bounds import graph_bounds
    from crown_cli.engine.input_sets import Box

    nodes = _two_layers(middle=[helper.make_node("Mul", ["z0", "z0"], ["sq"], name="square"),
                                helper.make_node("Relu", ["sq"], ["a"], name="relu")])
    g = load_network(save(tmp_path / "sq.onnx", nodes, W_INITS, ["N", 4]))
    assert [n.kind for n in g.nodes].count("product") == 1
    x = np.linspace(-1.0, 1.0, 4)
    lo, hi = graph_bounds(g, *Box(x - 0.2, x + 0.2).args())
    ys = g.forward(np.random.default_rng(0).uniform(x - 0.2, x + 0.2, size=(400, 4)))
    assert np.all(ys >= lo) and np.all(ys <= hi)


def test_a_fixed_batch_dimension_is_a_dimension_like_any_other(tmp_path):
    """(issue 36, nn4sys' batch of 12) an input of shape (2, 4) is 8 inputs, row-major, as
    VNN-LIB numbers them; the outputs (2, 3) are 6. A convolution of a batch above 1 is
    refused by name."""
    nodes = _two_layers(middle=[helper.make_node("Relu", ["z0"], ["a"], name="relu")])
    path = save(tmp_path / "b2.onnx", nodes, W_INITS, [2, 4])
    net = load_network(path)
    x = np.linspace(-1.0, 1.0, 8)
    want = ReferenceEvaluator(onnx.load(path)).run(None, {"x": x.reshape(2, 4).astype(np.float32)})
    np.testing.assert_allclose(net.forward(x[None])[0], np.asarray(want[0]).reshape(-1),
                               rtol=1e-5, atol=1e-6)
    conv = [helper.make_node("Conv", ["x", "K"], ["y"], name="conv")]
    msg = refused(tmp_path, conv, [init("K", rand((1, 1, 2, 2), 3))], in_shape=(2, 1, 3, 3))
    assert msg == "Conv node 'conv': needs data of shape (1, C, H, W), got (2, 1, 3, 3)"


def test_a_constant_that_broadcasts_the_data_larger_makes_a_graph(tmp_path):
    """Three copies of the data, each through the layers: not an MLP, a graph of 3 x 3
    outputs (VNN-LIB's Y_0..Y_8)."""
    nodes = _two_layers(before=[helper.make_node("Add", ["x", "big"], ["xb"], name="grow")],
                        middle=[helper.make_node("Relu", ["z0"], ["a"], name="relu")])
    big = f32(np.arange(12).reshape(3, 4) / 10)
    path = save(tmp_path / "big.onnx", nodes, W_INITS + [init("big", big)], [1, 4])
    g = load_network(path)
    assert isinstance(g, Graph) and g.output_size == 9
    x = np.random.default_rng(0).uniform(-1, 1, size=(3, 4))
    ref = ReferenceEvaluator(onnx.load(path))
    expected = np.stack([np.asarray(ref.run(None, feed)[0], np.float64).reshape(-1)
                         for feed in graph_feeds(path, x)])
    np.testing.assert_allclose(g.forward(x), expected, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("to, passes", [(TensorProto.DOUBLE, True), (TensorProto.FLOAT, True),
                                        (TensorProto.FLOAT16, False), (TensorProto.INT64, False)])
def test_casts_of_data_pass_only_when_they_keep_the_values(tmp_path, to, passes):
    nodes = _two_layers(middle=[helper.make_node("Cast", ["z0"], ["c"], name="cast", to=to),
                                helper.make_node("Relu", ["c"], ["a"], name="relu")])
    if passes:
        assert load_network(save(tmp_path / "c.onnx", nodes, W_INITS, ["N", 4])).dense.sizes == [4, 5, 3]
        return
    msg = refused(tmp_path, nodes, W_INITS)
    name = {TensorProto.FLOAT16: "float16", TensorProto.INT64: "int64"}[to]
    assert msg == (f"Cast node 'cast': casts data to {name}, which changes its values; only "
                   "casts to float32 and float64 pass")
