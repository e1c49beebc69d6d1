"""ONNX models written here by the real onnx package: same network as NPZ, same eps.

The forward pass of every accepted graph is checked against onnx's own reference evaluator
(onnx.reference.ReferenceEvaluator), an implementation independent of crown's loader.
"""
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from conftest import random_network
from crown_cli.cli import cli
from crown_cli.errors import InputError
from crown_cli.graph.network import Graph
from crown_cli.io.models import load_model, save_npz
from crown_cli.io.networks import load_network
from crown_cli.io.results import read_rows
from crown_cli.network import MLP


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def write_onnx(path, nodes, inits, in_shape, out_name="logits", out_dim=None, elem=TensorProto.FLOAT):
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", elem, in_shape)],
        [helper.make_tensor_value_info(out_name, elem, [in_shape[0], out_dim])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return model


def gemm_mlp(path, ws, bs, act="Relu", in_shape=None, flatten=False, dtype=np.float32):
    """Gemm(transB=1) layers with ``act`` between them, optionally a Flatten at the input."""
    nodes, inits, cur = [], [], "x"
    if flatten:
        nodes.append(helper.make_node("Flatten", [cur], ["flat"], name="flatten", axis=1))
        cur = "flat"
    for k, (w, b) in enumerate(zip(ws, bs)):
        last = k == len(ws) - 1
        out = "logits" if last else f"z{k}"
        inits += [_init(f"W{k}", w.astype(dtype)), _init(f"b{k}", b.astype(dtype))]
        nodes.append(helper.make_node("Gemm", [cur, f"W{k}", f"b{k}"], [out], name=f"dense_{k}",
                                      transB=1))
        cur = out
        if not last:
            nodes.append(helper.make_node(act, [cur], [f"a{k}"], name=f"act_{k}"))
            cur = f"a{k}"
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    return write_onnx(path, nodes, inits, in_shape or ["N", ws[0].shape[1]], out_dim=ws[-1].shape[0],
                      elem=elem)


def reference_logits(model, x):
    dtype = np.float32 if model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT \
        else np.float64
    return ReferenceEvaluator(model).run(None, {"x": x.astype(dtype)})[0]


def test_onnx_gives_the_same_eps_as_the_npz_of_the_same_weights(tmp_path, mnist100):
    rng = np.random.default_rng(3)
    ws, bs = random_network([784, 24, 16, 10], seed=5)
    ws = [w.astype(np.float32) for w in ws]  # the ONNX file stores float32; so does the NPZ
    bs = [b.astype(np.float32) for b in bs]
    gemm_mlp(tmp_path / "m.onnx", ws, bs, act="Relu", in_shape=["N", 1, 28, 28], flatten=True)
    save_npz(tmp_path / "m.npz", ws, bs, "relu")
    a, b = load_network(str(tmp_path / "m.onnx")).dense, load_model(tmp_path / "m.npz")
    for wa, wb in zip(a.weights + a.biases, b.weights + b.biases):
        assert np.array_equal(wa, wb)
    x = rng.uniform(-0.5, 0.5, size=(5, 784))
    model = onnx.load(str(tmp_path / "m.onnx"))
    ref = reference_logits(model, x.reshape(5, 1, 28, 28))
    assert np.allclose(a.forward(x), ref, rtol=1e-5, atol=1e-5)
    imgs = mnist100[0][:6]  # labelled with the random network's own predictions
    np.savez(tmp_path / "imgs.npz", x=imgs, y=np.argmax(b.forward(imgs), axis=1))
    out = {}
    for name in ("m.onnx", "m.npz"):
        res = CliRunner().invoke(cli, ["certify", "--model", str(tmp_path / name), "-n", "6",
                                       "--images", str(tmp_path / "imgs.npz"),
                                       "--norm", "inf,2", "--target", "runner-up,least", "-q",
                                       "-o", str(tmp_path / f"{name}.csv")])
        assert res.exit_code == 0, res.output
        out[name] = read_rows(tmp_path / f"{name}.csv")
    keys = ("image", "target", "norm", "status", "eps", "lower_bound", "margin")
    certified = [r for r in out["m.npz"] if r["status"] == "certified"]
    assert len(certified) >= 8
    assert [[r[k] for k in keys] for r in out["m.onnx"]] == [[r[k] for k in keys] for r in out["m.npz"]]


def _matmul_add_model(path, ws, bs, act, bias_first=False):
    nodes, inits, cur = [], [], "x"
    nodes.append(helper.make_node("Reshape", [cur, "shape"], ["flat"], name="reshape"))
    inits.append(_init("shape", np.array([-1, ws[0].shape[1]], dtype=np.int64)))
    cur = "flat"
    for k, (w, b) in enumerate(zip(ws, bs)):
        last = k == len(ws) - 1
        inits += [_init(f"M{k}", w.T.astype(np.float64)), _init(f"c{k}", b.astype(np.float64))]
        nodes.append(helper.make_node("MatMul", [cur, f"M{k}"], [f"m{k}"], name=f"matmul_{k}"))
        out = "pre" if last else f"z{k}"
        ins = [f"c{k}", f"m{k}"] if bias_first else [f"m{k}", f"c{k}"]
        nodes.append(helper.make_node("Add", ins, [out], name=f"bias_{k}"))
        cur = out
        if not last:
            nodes.append(helper.make_node(act, [cur], [f"a{k}"], name=f"act_{k}"))
            cur = f"a{k}"
    nodes.append(helper.make_node("Softmax", [cur], ["logits"], name="softmax", axis=1))
    return write_onnx(path, nodes, inits, ["N", 2, 3], out_dim=ws[-1].shape[0],
                      elem=TensorProto.DOUBLE)


@pytest.mark.parametrize("act,expected", [("Tanh", "tanh"), ("Sigmoid", "sigmoid"), ("Relu", "relu")])
@pytest.mark.parametrize("bias_first", [False, True])
def test_matmul_add_reshape_and_softmax(tmp_path, act, expected, bias_first):
    ws, bs = random_network([6, 5, 4, 3], seed=11)
    model = _matmul_add_model(tmp_path / "m.onnx", ws, bs, act, bias_first)
    mlp = load_network(str(tmp_path / "m.onnx")).dense
    assert mlp.activation == expected and mlp.sizes == [6, 5, 4, 3]
    for w, w0 in zip(mlp.weights, ws):
        assert np.array_equal(w, w0)
    assert mlp.output_activation == "softmax" and mlp.keeps_logit_order()
    x = np.random.default_rng(0).normal(size=(7, 6))
    probs = reference_logits(model, x.reshape(7, 2, 3))
    assert np.allclose(mlp.forward(x), probs, rtol=1e-12, atol=1e-14)  # forward ends in softmax


def test_gemm_attributes_alpha_beta_transb_and_broadcast_bias(tmp_path):
    rng = np.random.default_rng(2)
    B0 = rng.normal(size=(4, 5))  # (in, out): transB = 0
    C0 = rng.normal(size=(1, 5))
    B1 = rng.normal(size=(3, 5))  # (out, in): transB = 1
    C1 = np.array(0.25)  # scalar bias, broadcast
    nodes = [
        helper.make_node("Identity", ["x"], ["xi"], name="id"),
        helper.make_node("Gemm", ["xi", "B0", "C0"], ["z0"], name="g0", alpha=0.5, beta=2.0),
        helper.make_node("Tanh", ["z0"], ["a0"], name="t0"),
        helper.make_node("Gemm", ["a0", "B1", "C1"], ["logits"], name="g1", transB=1, alpha=1.5,
                         beta=-1.0),
    ]
    inits = [_init("B0", B0), _init("C0", C0), _init("B1", B1), _init("C1", C1)]
    model = write_onnx(tmp_path / "g.onnx", nodes, inits, ["N", 4], out_dim=3, elem=TensorProto.DOUBLE)
    mlp = load_network(str(tmp_path / "g.onnx")).dense
    assert mlp.activation == "tanh" and mlp.layer_names == ["g0", "g1"]
    x = rng.normal(size=(6, 4))
    assert np.allclose(mlp.forward(x), reference_logits(model, x), rtol=1e-12, atol=1e-13)


def test_channel_first_input_is_reordered_to_crowns_hwc_vectors(tmp_path):
    """A (N, 3, 2, 2) input flattened by the graph: crown's image vectors are (H, W, C)."""
    ws, bs = random_network([12, 6, 4], seed=1)
    model = gemm_mlp(tmp_path / "c.onnx", ws, bs, in_shape=["N", 3, 2, 2], flatten=True,
                     dtype=np.float64)
    mlp = load_network(str(tmp_path / "c.onnx")).dense
    img = np.random.default_rng(4).normal(size=(5, 2, 2, 3))  # (N, H, W, C) as crown reads images
    ref = reference_logits(model, img.transpose(0, 3, 1, 2))
    assert np.allclose(mlp.forward(img.reshape(5, -1)), ref, rtol=1e-12, atol=1e-13)


def test_certify_and_verify_on_a_channel_first_onnx_mlp(tmp_path):
    """certify reads crown's (H, W, C) image vectors: the same rows as the NPZ of the same
    network whose first layer takes them; verify's layers take the file's (C, H, W) order
    (VNN-LIB's X_i)."""
    ws, bs = random_network([12, 8, 4], seed=2)
    gemm_mlp(tmp_path / "c.onnx", ws, bs, in_shape=["N", 3, 2, 2], flatten=True,
             dtype=np.float64)
    chw = np.arange(12).reshape(3, 2, 2)  # the file's element of channel k, pixel (i, j)
    hwc = chw.transpose(1, 2, 0).reshape(-1)
    save_npz(tmp_path / "c.npz", [ws[0][:, hwc], ws[1]], bs, "relu")
    mlp = load_network(str(tmp_path / "c.onnx")).dense
    assert np.array_equal(mlp.input_order, hwc)
    assert np.array_equal(mlp.vnnlib_layers()[0][0], ws[0])
    x = np.random.default_rng(7).uniform(-0.5, 0.5, size=(5, 12))
    np.savez(tmp_path / "imgs.npz", x=x, y=np.argmax(mlp.forward(x), axis=1))
    rows = {}
    for name in ("c.onnx", "c.npz"):
        res = CliRunner().invoke(cli, ["certify", "--model", str(tmp_path / name), "-q",
                                       "--images", str(tmp_path / "imgs.npz"), "--norm", "inf,2",
                                       "-o", str(tmp_path / f"{name}.csv")])
        assert res.exit_code == 0, res.output
        rows[name] = read_rows(tmp_path / f"{name}.csv")
    keys = ("image", "target", "norm", "status", "eps", "lower_bound", "margin")
    assert sum(r["status"] == "certified" for r in rows["c.npz"]) >= 5
    assert [[r[k] for k in keys] for r in rows["c.onnx"]] == \
        [[r[k] for k in keys] for r in rows["c.npz"]]


def test_activation_option_on_an_onnx_chain(tmp_path):
    ws, bs = random_network([4, 6, 3], seed=3)
    gemm_mlp(tmp_path / "m.onnx", ws, bs, dtype=np.float64)
    g = load_network(str(tmp_path / "m.onnx"), activation="tanh")
    mlp = g.dense
    assert isinstance(mlp, MLP) and mlp.activation == "tanh" and np.array_equal(mlp.weights[0], ws[0])
    # the graph is the network the option made: its forward pass is the dense form's
    assert [n.op.name for n in g.nodes if n.kind == "activation"] == ["tanh"]
    x = np.random.default_rng(0).normal(size=(5, 4))
    np.testing.assert_allclose(g.forward(x), mlp.forward(x), rtol=1e-13, atol=1e-13)
    assert g.lowering is None or g.lowering[0] is None or g.lowering[0].activation == "tanh"
    with pytest.raises(InputError, match="^--activation: unknown activation 'nope'"):
        load_network(str(tmp_path / "m.onnx"), activation="nope")


def _bad(path, nodes, inits, in_shape=("N", 4), out_dim=3):
    write_onnx(path, nodes, inits, list(in_shape), out_dim=out_dim, elem=TensorProto.DOUBLE)
    with pytest.raises(InputError) as info:
        load_network(str(path))
    return str(info.value)


def test_unsupported_operator_is_named(tmp_path):
    rng = np.random.default_rng(0)
    inits = [_init("B0", rng.normal(size=(5, 4))), _init("B1", rng.normal(size=(3, 5)))]
    nodes = [helper.make_node("Gemm", ["x", "B0"], ["z0"], name="g0", transB=1),
             helper.make_node("Hardmax", ["z0"], ["a0"], name="my_hardmax"),
             helper.make_node("Gemm", ["a0", "B1"], ["logits"], name="g1", transB=1)]
    msg = _bad(tmp_path / "u.onnx", nodes, inits)
    assert msg == (f"{tmp_path / 'u.onnx'}: Hardmax node 'my_hardmax': unsupported operator Hardmax "
                   "(docs/formats.md lists the supported operators)")


def test_mixed_activations_and_two_linear_layers_in_a_row_run_on_the_graph_engine(tmp_path):
    """Not chains the dense engine takes exactly: a graph (the one MLP loader of old folded
    two Gemms in a row into one layer in float64; composing them is not exact)."""
    rng = np.random.default_rng(0)
    inits = [_init("B0", rng.normal(size=(5, 4))), _init("B1", rng.normal(size=(5, 5))),
             _init("B2", rng.normal(size=(3, 5)))]
    nodes = [helper.make_node("Gemm", ["x", "B0"], ["z0"], name="g0", transB=1),
             helper.make_node("Relu", ["z0"], ["a0"], name="r"),
             helper.make_node("Gemm", ["a0", "B1"], ["z1"], name="g1", transB=1),
             helper.make_node("Tanh", ["z1"], ["a1"], name="t"),
             helper.make_node("Gemm", ["a1", "B2"], ["logits"], name="g2", transB=1)]
    model = write_onnx(tmp_path / "m.onnx", nodes, inits, ["N", 4], out_dim=3, elem=TensorProto.DOUBLE)
    g = load_network(str(tmp_path / "m.onnx"))
    assert isinstance(g, Graph) and g.lowering == (None, "activations of several types (relu, tanh)")
    x = rng.normal(size=(6, 4))
    assert np.allclose(g.forward(x), reference_logits(model, x), rtol=1e-12, atol=1e-12)
    nodes = [helper.make_node("Gemm", ["x", "B0"], ["z0"], name="g0", transB=1),
             helper.make_node("Gemm", ["z0", "B1"], ["z1"], name="g1", transB=1),
             helper.make_node("Relu", ["z1"], ["a1"], name="r"),
             helper.make_node("Gemm", ["a1", "B2"], ["logits"], name="g2", transB=1)]
    model = write_onnx(tmp_path / "l.onnx", nodes, inits, ["N", 4], out_dim=3, elem=TensorProto.DOUBLE)
    g = load_network(str(tmp_path / "l.onnx"))
    assert isinstance(g, Graph) and g.lowering[0] is None
    assert g.lowering[1].startswith("composing g0+g1 is not exact")
    assert np.allclose(g.forward(x), reference_logits(model, x), rtol=1e-12, atol=1e-12)


def test_flatten_between_layers_is_a_reshape(tmp_path):
    rng = np.random.default_rng(0)
    inits = [_init("B0", rng.normal(size=(5, 4))), _init("B1", rng.normal(size=(3, 5)))]
    nodes = [helper.make_node("Gemm", ["x", "B0"], ["z0"], name="g0", transB=1),
             helper.make_node("Relu", ["z0"], ["a0"], name="r"),
             helper.make_node("Flatten", ["a0"], ["f0"], name="late_flatten"),
             helper.make_node("Gemm", ["f0", "B1"], ["logits"], name="g1", transB=1)]
    model = write_onnx(tmp_path / "f.onnx", nodes, inits, ["N", 4], out_dim=3, elem=TensorProto.DOUBLE)
    x = rng.normal(size=(6, 4))
    assert np.allclose(load_network(str(tmp_path / "f.onnx")).forward(x), reference_logits(model, x),
                       rtol=1e-12, atol=1e-12)


def test_a_branching_graph_loads_as_a_graph(tmp_path):
    rng = np.random.default_rng(0)
    inits = [_init("B0", rng.normal(size=(3, 4))), _init("B1", rng.normal(size=(3, 4)))]
    nodes = [helper.make_node("Gemm", ["x", "B0"], ["z0"], name="g0", transB=1),
             helper.make_node("Gemm", ["x", "B1"], ["z1"], name="g1", transB=1),
             helper.make_node("Add", ["z0", "z1"], ["logits"], name="sum")]
    model = write_onnx(tmp_path / "b.onnx", nodes, inits, ["N", 4], out_dim=3,
                       elem=TensorProto.DOUBLE)
    g = load_network(str(tmp_path / "b.onnx"))
    assert isinstance(g, Graph) and not g.is_chain()
    x = rng.normal(size=(6, 4))
    assert np.allclose(g.forward(x), reference_logits(model, x), rtol=1e-12, atol=1e-12)


def test_missing_onnx_package_gives_the_install_hint(tmp_path, monkeypatch):
    ws, bs = random_network([4, 3, 3], seed=0)
    gemm_mlp(tmp_path / "m.onnx", ws, bs)
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    res = CliRunner().invoke(cli, ["inspect", "--model", str(tmp_path / "m.onnx")])
    assert res.exit_code == 2
    assert res.output == (f"crown: error: {tmp_path / 'm.onnx'}: reading ONNX models needs the onnx "
                          "package; install it with pip install 'crown-cli[onnx]'\n")


def test_corrupt_onnx_file(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage not protobuf \xff\xff")
    with pytest.raises(InputError, match="bad.onnx: cannot read ONNX file"):
        load_network(str(tmp_path / "bad.onnx"))
