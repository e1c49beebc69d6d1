"""Keras convolutional and branched models as graphs (crown_cli/graph/keras_graph.py): files
written in Keras' own layouts by tests/keras_models.py (no Keras needed), the graph's forward
pass against an independent numpy implementation of the same layers, CROWN bounds and
`crown certify` radii checked by sampling inside them, refusals, `crown inspect`."""
from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import keras_models as km
from crown_cli.cli import cli
from crown_cli.errors import InputError
from crown_cli.graph.network import Graph
from crown_cli.io.networks import load_network
from crown_cli.network import MLP

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = {"branched": km.branched, "mnist_conv": km.mnist_conv, "reshaped": km.reshaped,
          "merges": km.merges, "gated": km.gated, "mobile": km.mobile,
          "tutorial": km.tutorial, "efficient": km.efficient,
          "sequence": km.sequence, "sequence_chain": km.sequence_chain, "decoder": km.decoder}
WRITERS = {"h5": km.save_h5, "keras": km.save_keras3}


def _write(tmp_path, model, ext, sequential=False, seed=0):
    layers, inputs, outputs = MODELS[model](np.random.default_rng(seed))
    path = tmp_path / f"{model}{'_seq' if sequential else ''}.{ext}"
    WRITERS[ext](path, layers, inputs, outputs, sequential=sequential)
    return str(path), (layers, inputs, outputs)


@pytest.mark.parametrize("ext", ["h5", "keras"])
@pytest.mark.parametrize("model,sequential", [("branched", False), ("mnist_conv", False),
                                              ("mnist_conv", True), ("reshaped", False),
                                              ("reshaped", True), ("merges", False),
                                              ("gated", True), ("mobile", False),
                                              ("tutorial", True), ("tutorial", False),
                                              ("efficient", False), ("sequence", False),
                                              ("sequence_chain", True), ("decoder", True)])
def test_forward_equals_an_independent_numpy_network(tmp_path, model, sequential, ext):
    path, (layers, inputs, outputs) = _write(tmp_path, model, ext, sequential)
    g = load_network(path)
    assert isinstance(g, Graph)
    shape = next(iter(inputs.values()))
    assert g.input_size == sum(int(np.prod(s)) for s in inputs.values())
    # the graph's input is the Keras input's own (H, W, C) layout
    assert tuple(g.nodes[g.inputs[0]].shape) == (1,) + tuple(shape)
    assert g.channels_last == (len(shape) == 3)
    x = np.random.default_rng(1).normal(size=(6, g.input_size))
    want = km.reference(layers, inputs, outputs, x, drop_output_act=True)
    np.testing.assert_allclose(g.forward(x), want, rtol=1e-12, atol=1e-12)


REAL = sorted((FIXTURES / "keras_graphs").glob("*.expected.npz"))


def _real_files(npz):
    name, tag = npz.name[:-len(".expected.npz")].rsplit(".", 1)
    return [npz.parent / f"{name}.{tag}.h5"] + ([npz.parent / f"{name}.keras"] if tag == "k3"
                                                 else [])


@pytest.mark.parametrize("npz", REAL, ids=[p.name[:-len(".expected.npz")] for p in REAL])
def test_forward_equals_keras_own_predictions_on_files_keras_wrote(npz):
    """Files written by Keras itself (scripts/make_keras_graph_fixtures.py: Keras 3's .keras
    and .h5, the Keras 2 API's .h5) with the layers of MobileNet-, EfficientNet-, sequence and
    decoder models, against ``model.predict`` (float32)."""
    want = np.load(npz)
    assert len(REAL) >= 16  # (8 models, each by Keras 3 and by tf_keras)
    for path in _real_files(npz):
        g = load_network(str(path))
        assert isinstance(g, Graph)
        got = g.forward(want["x"])
        scale = max(1.0, float(np.abs(want["logits"]).max()))
        np.testing.assert_allclose(got, want["logits"], rtol=0, atol=2e-6 * scale,
                                   err_msg=f"{path.name} ({want['writer']})")


def test_a_model_used_as_a_layer_must_have_one_output(tmp_path):
    import shutil

    import h5py

    path = tmp_path / "two.h5"
    shutil.copy(FIXTURES / "keras_graphs" / "nested.k3.h5", path)
    with h5py.File(path, "r+") as f:
        cfg = json.loads(f.attrs["model_config"])
        base = next(l for l in cfg["config"]["layers"] if l["config"].get("name") == "base")
        base["config"]["output_layers"] = [["relu", 0, 0], ["bn", 0, 0]]
        f.attrs["model_config"] = json.dumps(cfg)
    assert "layer 'base' (Functional) has 2 outputs; a model used as a layer must have one" \
        in _bad(path)


def test_an_output_softmax_is_dropped_and_a_hidden_one_refused(tmp_path):
    path, (layers, inputs, outputs) = _write(tmp_path, "branched", "h5")
    g = load_network(path)
    assert any("softmax (output, dropped" in f for n in g.nodes for f in n.folded)
    layers[-3].config["activation"] = "softmax"  # d1, a hidden Dense
    km.save_h5(tmp_path / "hidden.h5", layers, inputs, outputs)
    msg = _bad(tmp_path / "hidden.h5")
    assert "layer 'd1' (Dense): softmax is supported only on a model output" in msg


def test_flatten_takes_keras_channels_last_order(tmp_path):
    """A Flatten of a 2-channel image feeding a Dense that reads one element: the graph must
    pick the element Keras' (H, W, C) order puts there."""
    rng = np.random.default_rng(3)
    kernel = np.zeros((18, 2))
    kernel[1, 0] = 1.0  # (h=0, w=0, c=1): the second channel of the first pixel
    kernel[2, 1] = 1.0  # (h=0, w=1, c=0)
    layers = [km.L("InputLayer", "x"),
              km.L("Conv2D", "c", ["x"], filters=2, kernel_size=[1, 1], padding="valid",
                   activation="linear", use_bias=False, weights={"kernel": np.eye(2)[None, None]}),
              km.L("Flatten", "f", ["c"]),
              km.L("Dense", "d", ["f"], units=2, activation="linear", use_bias=False,
                   weights={"kernel": kernel})]
    km.save_keras3(tmp_path / "f.keras", layers, {"x": (3, 3, 2)}, ["d"])
    g = load_network(str(tmp_path / "f.keras"))
    x = rng.normal(size=18)
    np.testing.assert_array_equal(g.forward(x), [x[1], x[2]])


@pytest.mark.parametrize("model", ["branched", "gated", "mobile", "tutorial", "efficient",
                                   "sequence", "decoder"])
def test_crown_bounds_hold_on_sampled_inputs(tmp_path, model):
    from crown_cli.engine.graph_bounds import GraphBounds

    path, _ = _write(tmp_path, model, "keras")
    g = load_network(path)
    rng = np.random.default_rng(5)
    x0 = rng.normal(size=g.input_size)
    eps = 0.05
    lo, hi = GraphBounds(g, x0, eps, 0).bounds()
    xs = x0 + rng.uniform(-eps, eps, size=(3000, g.input_size))
    xs[:500] = x0 + eps * np.sign(rng.normal(size=(500, g.input_size)))
    y = g.forward(xs)
    assert np.all(y >= lo) and np.all(y <= hi)
    assert np.all(hi - lo < 10.0)  # not vacuous


def _images(tmp_path, g, n=3):
    import crown_cli

    x, _ = crown_cli.load_images()
    x = x[:n]
    y = np.argmax(g.forward(x), axis=1)  # the model's own classes: nothing misclassified
    path = tmp_path / "imgs.npz"
    np.savez(path, x=x, y=y)
    return str(path), x


def _rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_certify_crown_on_a_keras_conv_model_is_sound_by_sampling(tmp_path):
    path, (layers, inputs, outputs) = _write(tmp_path, "mnist_conv", "keras", sequential=True)
    g = load_network(path)
    images, x = _images(tmp_path, g)
    res = CliRunner().invoke(cli, ["certify", "--model", path, "--images", images, "--method",
                                   "crown", "-q"])
    assert res.exit_code == 0, res.output
    rows = _rows(res.output)
    assert len(rows) == 3 and {r["status"] for r in rows} == {"certified"}
    rng = np.random.default_rng(0)
    for r in rows:
        i, c, t, eps = int(r["image"]), int(r["predicted"]), int(r["target"]), float(r["eps"])
        assert eps > 1e-4
        pts = x[i] + eps * rng.uniform(-1, 1, size=(1500, 784))
        pts[:500] = x[i] + eps * np.sign(rng.normal(size=(500, 784)))  # corners of the ball
        logits = g.forward(pts)  # the reference's on some of them (it loops: slow)
        np.testing.assert_allclose(logits[::100], km.reference(layers, inputs, outputs, pts[::100],
                                                               drop_output_act=True), atol=1e-12)
        assert np.all(logits[:, c] > logits[:, t])


def test_plain_dense_keras_files_keep_their_dense_form(tmp_path):
    for name in ("keras/k2_relu_activation_layers.h5", "keras3/relu_784.keras"):
        g = load_network(str(FIXTURES / name))  # a graph, its dense form the MLP reader's
        assert isinstance(g, Graph) and isinstance(g.dense, MLP) and g.lowering[0] is g.dense
        x = np.random.default_rng(0).uniform(-0.5, 0.5, (4, g.input_size))
        np.testing.assert_array_equal(g.forward(x), g.dense.forward(x))


def _bad(path, **kw):
    with pytest.raises(InputError) as info:
        load_network(str(path), **kw)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    return msg


def _bad_edited(tmp_path, build, edit, ext):
    """``_bad`` of the model ``build`` makes, written as ``ext`` after ``edit`` (on its layers
    by name) changed it; each call a file of its own."""
    layers, inputs, outputs = build(np.random.default_rng(0))
    edit({l.name: l for l in layers})
    path = tmp_path / f"{build.__name__}{len(list(tmp_path.iterdir()))}.{ext}"
    WRITERS[ext](path, layers, inputs, outputs)
    return _bad(path)


@pytest.mark.parametrize("ext", ["h5", "keras"])
def test_unknown_layer_is_refused_in_one_line(tmp_path, ext):
    layers, inputs, outputs = km.mnist_conv(np.random.default_rng(0))
    layers.insert(2, km.L("Conv3D", "vol", ["conv"], filters=2))
    layers[3].inputs = ["vol"]
    path = tmp_path / f"m.{ext}"
    WRITERS[ext](path, layers, inputs, outputs)
    msg = _bad(path)
    assert "layer 'vol' (Conv3D) is not supported; supported: " in msg and "Conv2D" in msg


def test_unsupported_settings_name_the_layer(tmp_path):
    layers, inputs, outputs = km.mnist_conv(np.random.default_rng(0))
    layers[1].config["data_format"] = "channels_first"
    km.save_h5(tmp_path / "cf.h5", layers, inputs, outputs)
    assert "layer 'conv' (Conv2D): data_format channels_first is not supported" in _bad(tmp_path / "cf.h5")
    layers[1].config["data_format"] = "channels_last"
    layers[1].config["padding"] = "causal"
    km.save_h5(tmp_path / "causal.h5", layers, inputs, outputs)
    assert "padding 'causal' is not supported" in _bad(tmp_path / "causal.h5")


def test_unsupported_settings_of_the_mobile_layers_name_the_layer(tmp_path):
    def bad(edit, ext="keras"):
        return _bad_edited(tmp_path, km.mobile, edit, ext)

    assert "layer 'up' (UpSampling2D): interpolation 'bilinear' is not supported" in bad(
        lambda L: L["up"].config.update(interpolation="bilinear"))
    assert "layer 'crop' (Cropping2D): cropping [[10, 0], [2, 1]] does not fit" in bad(
        lambda L: L["crop"].config.update(cropping=[[10, 0], [2, 1]]))
    assert "layer 'scale' (Rescaling): scale of 3 values for 2 channels" in bad(
        lambda L: L["scale"].config.update(scale=[1.0, 2.0, 3.0]))
    assert "layer 'dw' (DepthwiseConv2D): depthwise kernel of shape (3, 3, 3, 2)" in bad(
        lambda L: L["dw"].weights.update(depthwise_kernel=np.ones((3, 3, 3, 2))))
    assert "layer 'sep' (SeparableConv2D): no 'pointwise_kernel' weights" in bad(
        lambda L: L["sep"].weights.pop("pointwise_kernel"), "h5")  # (a .keras file's
    # variables are positional: there the bias would stand in the pointwise kernel's place)
    assert "layer 'sep' (SeparableConv2D): pointwise kernel of shape (3,)" in bad(
        lambda L: L["sep"].weights.pop("pointwise_kernel"))


def test_unsupported_settings_of_normalization_and_merges_name_the_layer(tmp_path):
    def bad(edit, ext="h5"):
        return _bad_edited(tmp_path, km.efficient, edit, ext)

    assert "layer 'norm' (Normalization): invert=True is not supported" in bad(
        lambda L: L["norm"].config.update(invert=True))
    assert "layer 'norm' (Normalization): axis 1: only the last (channel) axis" in bad(
        lambda L: L["norm"].config.update(axis=1))
    assert "layer 'norm' (Normalization): no mean and variance" in bad(
        lambda L: L["norm"].weights.clear())
    assert "layer 'norm' (Normalization): a negative variance" in bad(
        lambda L: L["norm"].weights.update(variance=-np.ones(3)))
    assert "layer 'excite' (Multiply): inputs of shapes" in bad(
        lambda L: setattr(L["excite"], "inputs", ["dw", "se_reduce"]), "keras")


def test_unsupported_settings_of_the_1d_layers_name_the_layer(tmp_path):
    def bad(edit):
        return _bad_edited(tmp_path, km.sequence, edit, "h5")

    assert "layer 'c1' (Conv1D): padding 'full' is not supported (valid, same, causal)" in bad(
        lambda L: L["c1"].config.update(padding="full"))
    assert "layer 'mp' (MaxPooling1D): padding 'causal' is not supported (valid, same)" in bad(
        lambda L: L["mp"].config.update(padding="causal"))
    assert "layer 'cr' (Cropping1D): cropping [5, 4] does not fit a sequence of 9 steps" in bad(
        lambda L: L["cr"].config.update(cropping=[5, 4]))
    assert "layer 'c1' (Conv1D): kernel of shape (3, 3, 4, 1), expected (k, C / groups" in bad(
        lambda L: L["c1"].weights.update(kernel=np.ones((3, 3, 4, 1))))
    layers, inputs, outputs = km.mobile(np.random.default_rng(0))
    layers.insert(2, km.L("Conv1D", "c1d", ["scale"], filters=2, kernel_size=[3],
                          weights={"kernel": np.ones((3, 2, 2))}))
    layers[3].inputs = ["c1d"]
    km.save_h5(tmp_path / "img.h5", layers, inputs, outputs)
    assert "layer 'c1d' (Conv1D): needs a sequence input (steps, C), got shape (8, 7, 2)" in \
        _bad(tmp_path / "img.h5")


def test_unsupported_settings_of_transposed_convolutions_prelu_permute_name_the_layer(
        tmp_path):
    def bad(edit):
        return _bad_edited(tmp_path, km.decoder, edit, "h5")

    assert "layer 't1' (Conv2DTranspose): kernel of shape (3, 3, 3, 3), expected (kh, kw, " \
        "filters, 2)" in bad(lambda L: L["t1"].weights.update(kernel=np.ones((3, 3, 3, 3))))
    assert "layer 'p1' (PReLU): alpha of shape (1, 1, 2) does not fit the input's (6, 4, 3)" \
        in bad(lambda L: L["p1"].weights.update(alpha=np.ones((1, 1, 2))))
    assert "layer 'perm' (Permute): dims [1, 1, 3] are not a permutation of 1..3" in bad(
        lambda L: L["perm"].config.update(dims=[1, 1, 3]))


def test_a_normalization_given_its_statistics_in_the_config_loads(tmp_path):
    layers, inputs, outputs = km.efficient(np.random.default_rng(0))
    norm = next(l for l in layers if l.name == "norm")
    norm.config.update(mean=[0.1, -0.2, 0.3], variance=[4.0, 0.25, 1.0])
    norm.weights = {}
    path = tmp_path / "given.keras"
    km.save_keras3(path, layers, inputs, outputs)
    g = load_network(str(path))
    x = np.random.default_rng(1).normal(size=(4, g.input_size))
    want = km.reference(layers, inputs, outputs, x, drop_output_act=True)
    np.testing.assert_allclose(g.forward(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(4, 4), (3, 4), (2, 3, 4, 4)])
def test_per_channel_layers_scale_the_last_axis_of_any_rank(tmp_path, shape):
    """BatchNormalization, Normalization and Rescaling on a sequence (steps, C) or a volume
    take their values per channel, Keras' last axis (they had taken a (4, 4) sequence's
    per-step values: wrong outputs, no error)."""
    rng = np.random.default_rng(0)
    layers = [km.L("InputLayer", "seq"), km._bn(rng, "bn", "seq", 4),
              km.L("Rescaling", "rs", ["bn"], scale=[0.5, -1.0, 2.0, 1.5], offset=0.25),
              km.L("Normalization", "nz", ["rs"], axis=-1,
                   weights={"mean": km._w(rng, 4), "variance": km._f32(1 + np.abs(km._w(rng, 4))),
                            "count": np.float32(10.0)}),
              km.L("Flatten", "f", ["nz"]),
              km.L("Dense", "out", ["f"], units=2, activation="linear", use_bias=True,
                   weights={"kernel": km._w(rng, int(np.prod(shape)), 2), "bias": km._w(rng, 2)})]
    inputs = {"seq": shape}
    for ext in ("h5", "keras"):
        path = tmp_path / f"s.{ext}"
        WRITERS[ext](path, layers, inputs, ["out"])
        g = load_network(str(path))
        x = rng.normal(size=(5, g.input_size))
        np.testing.assert_allclose(g.forward(x), km.reference(layers, inputs, ["out"], x),
                                   rtol=1e-12, atol=1e-12)


def test_a_shared_layer_is_refused(tmp_path):
    path, _ = _write(tmp_path, "branched", "keras")
    with zipfile.ZipFile(path) as zf:
        members = {m: zf.read(m) for m in zf.namelist()}
    cfg = json.loads(members["config.json"])
    add = [l for l in cfg["config"]["layers"] if l["name"] == "relu1"][0]
    add["inbound_nodes"] = add["inbound_nodes"] * 2
    members["config.json"] = json.dumps(cfg).encode()
    with zipfile.ZipFile(tmp_path / "shared.keras", "w") as zf:
        for m, data in members.items():
            zf.writestr(m, data)
    assert "layer 'relu1' is called 2 times" in _bad(tmp_path / "shared.keras")


def test_inspect_shows_a_keras_graph(tmp_path):
    path, _ = _write(tmp_path, "branched", "keras")
    res = CliRunner().invoke(cli, ["inspect", "--model", path])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "graph:       18 nodes" in out and "input size:  98 (1x7x7x2)" in out
    assert "conv 8 -> 4, kernel 2x2 (groups 2)" in out and "max pool 196 -> 64" in out
    assert "average pool 3x3" in out and "(folded: softmax (output, dropped" in out


def test_activation_option_is_refused_on_a_keras_graph(tmp_path):
    path, _ = _write(tmp_path, "mnist_conv", "h5")
    assert "--activation applies to chains of dense layers only" in _bad(path, activation="tanh")


def test_keras_graph_only_activations_load_as_their_nodes(tmp_path):
    """Keras' gelu, swish, mish, hard_silu and relu6 and a ReLU layer with max_value (a Dense
    chain the MLP loader refuses for them) load as a graph of gelu, silu, mish and hardswish
    nodes and ReLU pairs (relu6 and the cap: two each)."""
    path, _ = _write(tmp_path, "gated", "h5")
    g = load_network(path)
    assert isinstance(g, Graph)
    assert [n.op.name for n in g.nodes if n.kind == "activation"] == \
        ["gelu", "silu", "mish", "hardswish", "relu", "relu", "relu", "relu"]


def test_zero_padding_before_a_convolution_becomes_its_pads(tmp_path):
    """ZeroPadding2D read by convolutions only: the convolutions pad the image themselves
    (no element-move node between), with the same outputs as the reference; a padding
    read by a pooling layer stays a move."""
    from crown_cli.graph.ops import Conv, IndexMap

    path, (layers, inputs, outputs) = _write(tmp_path, "merges", "h5")
    g = load_network(path)
    convs = [n for n in g.nodes if isinstance(n.op, Conv)]
    assert len(convs) == 2 and all(g.nodes[n.inputs[0]].kind == "input" or
                                   not isinstance(g.nodes[n.inputs[0]].op, IndexMap)
                                   for n in convs), [g.nodes[n.inputs[0]].name for n in convs]
    assert all(tuple(n.op.pads) == (1, 0, 0, 2) for n in convs)
    layers.insert(3, km.L("MaxPooling2D", "mp", ["pad"], pool_size=[1, 1], strides=[1, 1],
                          padding="valid"))
    layers[4].inputs = ["mp"]  # ca reads the pooled padding
    km.save_h5(tmp_path / "pooled.h5", layers, inputs, outputs)
    g2 = load_network(str(tmp_path / "pooled.h5"))
    x = np.random.default_rng(2).normal(size=(4, g2.input_size))
    np.testing.assert_allclose(g2.forward(x), km.reference(layers, inputs, outputs, x,
                                                           drop_output_act=True),
                               rtol=1e-12, atol=1e-12)
