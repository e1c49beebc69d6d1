"""ConvTranspose and Upsample / Resize in the graph loader (crown_cli.graph.onnx_ops,
onnx_moves, onnx_resize): a transposed convolution is read as an element move (the input
spread by the strides, zeros between, padded or cropped) and a stride-1 Conv with the kernel
flipped and its channels swapped per group; a nearest resize by whole scales as an element
move; a linear resize as an affine node of interpolation weights. Checked
against the definition (each input element adds its weighted kernel into the output, written
out here) and onnx's reference evaluator, CROWN bounds against sampling, and the refusals.
The "generator" model of tests/graph_models.py (ConvTranspose, Resize) also runs through
tests/test_graph_forward.py and tests/test_graph_bounds.py with every other model kind.
"""
import os

import numpy as np
import pytest

import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from crown_cli.engine.graph_bounds import graph_bounds
from crown_cli.errors import InputError
from crown_cli.graph.onnx_graph import load_graph


def _save(tmp_path, nodes, inits, in_shape, opset=17, name="m"):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = os.path.join(str(tmp_path), name + ".onnx")
    onnx.save(model, path)
    return path, model


def transposed_conv(x, w, bias, strides, pads, dil, outpad, group):
    """ConvTranspose by its definition: input element (c, i, j) adds x * W[c, o] at output
    (i * stride + a * dilation - pad_top, j * stride + b * dilation - pad_left) of each output
    channel o of its group and kernel offset (a, b); output_padding extends the end."""
    C, H, W = x.shape
    Og, kh, kw = w.shape[1:]
    full = [strides[0] * (H - 1) + outpad[0] + (kh - 1) * dil[0] + 1,
            strides[1] * (W - 1) + outpad[1] + (kw - 1) * dil[1] + 1]
    y = np.zeros((Og * group, full[0], full[1]))
    Cg = C // group
    for c in range(C):
        g = c // Cg
        for i in range(H):
            for j in range(W):
                for a in range(kh):
                    for b in range(kw):
                        y[g * Og:(g + 1) * Og, i * strides[0] + a * dil[0],
                          j * strides[1] + b * dil[1]] += x[c, i, j] * w[c, :, a, b]
    y = y[:, pads[0]:full[0] - pads[2], pads[1]:full[1] - pads[3]]
    return y + bias[:, None, None]


# (C, O, H, W, kernel, group, strides, pads, dilations, output_padding)
CASES = [
    (2, 3, 3, 4, (3, 3), 1, (1, 1), (0, 0, 0, 0), (1, 1), (0, 0)),
    (2, 3, 3, 4, (4, 4), 1, (2, 2), (0, 0, 0, 0), (1, 1), (0, 0)),  # the cgan layers
    (2, 3, 3, 4, (4, 4), 1, (2, 2), (1, 1, 1, 1), (1, 1), (0, 0)),  # cgan "padding 1"
    (2, 3, 3, 4, (3, 2), 1, (2, 3), (1, 0, 2, 1), (1, 1), (1, 2)),
    (2, 3, 3, 4, (4, 3), 1, (2, 2), (3, 3, 3, 3), (1, 1), (0, 0)),  # pads crop the spread input
    (4, 6, 3, 4, (3, 3), 2, (2, 1), (0, 0, 0, 0), (2, 1), (0, 0)),
    (6, 3, 3, 4, (2, 3), 3, (3, 2), (3, 2, 1, 4), (2, 2), (1, 1)),
    (4, 4, 2, 3, (2, 2), 4, (1, 2), (0, 1, 1, 0), (1, 3), (0, 1)),  # depthwise
]


def _convt(tmp_path, C, O, H, W, k, group, rng, **attrs):
    w = rng.normal(size=(C, O // group) + tuple(k)).astype(np.float32)
    bias = rng.normal(size=O).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", group=group,
                            **attrs)
    path, model = _save(tmp_path, [node], {"w": w, "b": bias}, [1, C, H, W])
    return path, model, w.astype(np.float64), bias.astype(np.float64)


@pytest.mark.parametrize("case", CASES)
def test_conv_transpose_equals_its_definition(tmp_path, case):
    C, O, H, W, k, group, strides, pads, dil, outpad = case
    rng = np.random.default_rng(CASES.index(case))
    path, model, w, bias = _convt(tmp_path, C, O, H, W, k, group, rng, strides=strides,
                                  pads=pads, dilations=dil, output_padding=outpad)
    g = load_graph(path)
    x = rng.normal(size=(3, C * H * W))
    want = np.stack([transposed_conv(r.reshape(C, H, W), w, bias, strides, pads, dil, outpad,
                                     group).reshape(-1) for r in x])
    got = g.forward(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if group == 1:  # onnx.reference's grouped ConvTranspose fails on its own reshape
        ref = ReferenceEvaluator(model).run(None, {"x": x[0].reshape(1, C, H, W).astype(np.float32)})[0]
        np.testing.assert_allclose(got[0], ref.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("auto_pad,k", [("SAME_UPPER", (3, 3)), ("SAME_LOWER", (4, 3)),
                                        ("VALID", (3, 2))])
def test_conv_transpose_auto_pad_and_output_shape(tmp_path, auto_pad, k):
    rng = np.random.default_rng(5)
    path, model, w, bias = _convt(tmp_path, 2, 3, 3, 4, k, 1, rng, strides=[2, 2],
                                  auto_pad=auto_pad)
    x = rng.normal(size=(1, 24))
    got = load_graph(path).forward(x)
    ref = ReferenceEvaluator(model).run(None, {"x": x.reshape(1, 2, 3, 4).astype(np.float32)})[0]
    if auto_pad != "VALID":
        assert ref.shape == (1, 3, 6, 8)
    np.testing.assert_allclose(got[0], ref.reshape(-1), rtol=1e-5, atol=1e-5)
    # an output_shape that agrees with the pads is taken, one that does not is refused
    path, *_ = _convt(tmp_path, 2, 3, 3, 4, (3, 3), 1, rng, strides=[2, 2], pads=[1, 1, 0, 0],
                      output_shape=[6, 8])
    assert load_graph(path).nodes[-1].shape == (1, 3, 6, 8)
    path, *_ = _convt(tmp_path, 2, 3, 3, 4, (3, 3), 1, rng, strides=[2, 2], pads=[1, 1, 0, 0],
                      output_shape=[7, 8])
    with pytest.raises(InputError, match=r"ConvTranspose node 'up': output_shape \[7, 8\] "
                                         r"differs from the output its pads give"):
        load_graph(path)


def test_conv_transpose_bounds_hold_on_samples(tmp_path):
    """CROWN through a strided, padded ConvTranspose, a Relu and a grouped ConvTranspose
    encloses the outputs of points sampled in the box (corners included)."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(2, 4, 3, 3)).astype(np.float32)
    w2 = rng.normal(size=(4, 1, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["h"], name="up1",
                              strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 0]),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("ConvTranspose", ["r", "w2"], ["y"], name="up2", group=2,
                              dilations=[1, 2], strides=[2, 1])]
    path, _ = _save(tmp_path, nodes, {"w1": w1, "b1": rng.normal(size=4).astype(np.float32),
                                      "w2": w2}, [1, 2, 3, 3])
    g = load_graph(path)
    x0 = rng.uniform(-1, 1, g.input_size)
    eps = 0.2
    lo, hi = graph_bounds(g, x0, eps, 0)
    xs = x0 + eps * rng.uniform(-1, 1, size=(3000, x0.size))
    xs[:1000] = x0 + eps * np.sign(xs[:1000] - x0)
    y = g.forward(xs)
    assert np.all(y >= lo) and np.all(y <= hi)
    # not vacuous: within a few times the sampled range (outputs of dead ReLUs only: the
    # rounding charged)
    assert np.all(hi - lo <= 50 * (y.max(0) - y.min(0)) + 1e-6)


# -------------------------------------------------------------------------- Upsample / Resize

RESIZE_MODES = [("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil"),
                ("asymmetric", "floor"), ("asymmetric", "round_prefer_floor"),
                ("align_corners", "round_prefer_ceil"), ("pytorch_half_pixel", "ceil"),
                ("half_pixel", "floor")]


@pytest.mark.parametrize("ctm,nearest", RESIZE_MODES)
@pytest.mark.parametrize("by", ["scales", "sizes"])
def test_resize_nearest_matches_the_reference(tmp_path, ctm, nearest, by):
    rng = np.random.default_rng(1)
    if by == "scales":
        inits = {"s": np.array([1, 1, 3, 2], np.float32)}
        ins = ["x", "", "s"]
    else:
        inits = {"z": np.array([1, 2, 9, 8], np.int64)}
        ins = ["x", "", "", "z"]
    node = helper.make_node("Resize", ins, ["y"], name="rs", mode="nearest",
                            coordinate_transformation_mode=ctm, nearest_mode=nearest)
    path, model = _save(tmp_path, [node], inits, [1, 2, 3, 4])
    g = load_graph(path)
    x = rng.normal(size=(2, 24))
    got = g.forward(x)
    for row, out in zip(x, got):
        ref = ReferenceEvaluator(model).run(None, {"x": row.reshape(1, 2, 3, 4).astype(np.float32)})[0]
        assert ref.shape == (1, 2, 9, 8)
        np.testing.assert_allclose(out, ref.reshape(-1), rtol=1e-6, atol=1e-6)
    assert not any(type(n.op).__name__ == "Dense" for n in g.nodes)  # an element move


@pytest.mark.parametrize("opset", [9, 10])
def test_upsample_and_resize10_repeat_each_element(tmp_path, opset):
    """Upsample (opset 9, scales as an input, as the cgan upsample network) and Resize-10:
    each element repeated by the scale, as np.repeat."""
    op = "Upsample" if opset == 9 else "Resize"
    node = helper.make_node(op, ["x", "s"], ["y"], name="up", mode="nearest")
    path, _ = _save(tmp_path, [node], {"s": np.array([1, 1, 2, 3], np.float32)}, [1, 2, 3, 2],
                    opset=opset)
    x = np.random.default_rng(2).normal(size=(1, 12))
    want = np.repeat(np.repeat(x.reshape(1, 2, 3, 2), 2, axis=2), 3, axis=3)
    np.testing.assert_array_equal(load_graph(path).forward(x), want.reshape(1, -1))


@pytest.mark.parametrize("attrs,scales,message", [
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 2, 2],
     "Resize node 'rs': mode 'linear' with coordinate_transformation_mode 'tf_crop_and_resize' "
     "is not supported"),
    ({"mode": "linear"}, [1, 1, 0.25, 2], r"scales \[1.0, 1.0, 0.25, 2.0\] for an input of "
                                          r"shape \(1, 2, 3, 4\): every axis must keep"),
    ({"mode": "cubic"}, [1, 1, 2, 2], "mode 'cubic' is not supported"),
    ({"mode": "nearest"}, [1, 1, 1.5, 2], r"scales \[1.0, 1.0, 1.5, 2.0\] for an input of shape "
                                          r"\(1, 2, 3, 4\): only whole scales of at least 1"),
    ({"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 2, 2],
     "coordinate_transformation_mode 'tf_crop_and_resize' with nearest_mode "
     "'round_prefer_floor' is not supported"),
])
def test_refused_resizes_are_named(tmp_path, attrs, scales, message):
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], name="rs", **attrs)
    path, _ = _save(tmp_path, [node], {"s": np.array(scales, np.float32)}, [1, 2, 3, 4])
    with pytest.raises(InputError, match=message) as err:
        load_graph(path)
    assert str(err.value).startswith(path + ": Resize node 'rs': ")
    assert "\n" not in str(err.value)


def test_refused_transposed_convolutions_are_named(tmp_path):
    rng = np.random.default_rng(3)
    path, *_ = _convt(tmp_path, 2, 3, 3, 4, (3, 3), 1, rng, auto_pad="SAME_SIDEWAYS")
    with pytest.raises(InputError, match="ConvTranspose node 'up': auto_pad SAME_SIDEWAYS"):
        load_graph(path)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up")
    path, _ = _save(tmp_path, [node], {"w": np.ones((2, 3, 3), np.float32)}, [1, 2, 5])
    with pytest.raises(InputError, match=r"ConvTranspose node 'up': needs data of shape "
                                         r"\(1, C, H, W\), got \(1, 2, 5\)"):
        load_graph(path)
    path, *_ = _convt(tmp_path, 2, 3, 2, 2, (2, 2), 1, rng, pads=[2, 2, 2, 2])
    with pytest.raises(InputError, match="ConvTranspose node 'up': pads .* leave no output"):
        load_graph(path)


def test_batchnorm_on_a_reshaped_gemm_folds_and_keeps_the_image_shape(tmp_path):
    """The cgan networks' start: Gemm -> Reshape to an image -> BatchNormalization ->
    ConvTranspose. The BatchNorm folds into the Gemm across the Reshape, and the
    ConvTranspose still reads the (1, 2, 2, 2) image (the fold once returned the Gemm's
    (1, 8))."""
    rng = np.random.default_rng(4)
    f = np.float32
    inits = {"w": rng.normal(size=(8, 3)).astype(f), "b": rng.normal(size=8).astype(f),
             "shape": np.array([-1, 2, 2, 2], np.int64), "s": rng.uniform(0.5, 1.5, 2).astype(f),
             "beta": rng.normal(size=2).astype(f), "mean": rng.normal(size=2).astype(f),
             "var": rng.uniform(0.5, 2, 2).astype(f), "wt": rng.normal(size=(2, 1, 4, 4)).astype(f)}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1),
             helper.make_node("Reshape", ["h", "shape"], ["img"], name="rs"),
             helper.make_node("BatchNormalization", ["img", "s", "beta", "mean", "var"], ["n"],
                              name="bn"),
             helper.make_node("ConvTranspose", ["n", "wt"], ["y"], name="up", strides=[2, 2])]
    path, model = _save(tmp_path, nodes, inits, [1, 3])
    g = load_graph(path)
    assert g.nodes[1].folded == ["bn"] and g.output_size == 36
    x = rng.normal(size=(1, 3))
    ref = ReferenceEvaluator(model).run(None, {"x": x.astype(np.float32)})[0]
    np.testing.assert_allclose(g.forward(x)[0], ref.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "align_corners",
                                  "asymmetric"])
@pytest.mark.parametrize("how,values", [("scales", [1, 1, 2, 2]), ("scales", [1, 1, 1.5, 0.5]),
                                        ("sizes", [1, 2, 7, 1]), ("sizes", [1, 2, 1, 9])])
def test_linear_resize_equals_the_reference_evaluator(tmp_path, mode, how, values):
    """Resize in mode linear (bilinear on the two spatial axes; up, down, non-whole scales,
    sizes, an axis of one element) equals onnx's reference evaluator on random inputs, is one
    affine node whose rows sum to 1, and CROWN's bounds enclose sampled outputs."""
    ins = ["x", "", "s"] if how == "scales" else ["x", "", "", "s"]
    dtype = np.float32 if how == "scales" else np.int64
    node = helper.make_node("Resize", ins, ["y"], name="rs", mode="linear",
                            coordinate_transformation_mode=mode)
    path, model = _save(tmp_path, [node], {"s": np.array(values, dtype)}, [1, 2, 3, 4])
    g = load_graph(path)
    assert [n.kind for n in g.nodes] == ["input", "affine"]
    rng = np.random.default_rng(4)
    X = rng.normal(size=(5, 24))
    ref = ReferenceEvaluator(model)
    for x in X:
        want = ref.run(None, {"x": x.reshape(1, 2, 3, 4).astype(np.float32)})[0]
        got = g.forward(x[None])
        assert got.size == want.size
        np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=1e-5, atol=1e-5)
    ones = g.forward(np.ones((1, 24)))
    np.testing.assert_allclose(ones, 1.0, rtol=1e-12)  # weights of each row sum to 1
    x0 = rng.normal(size=24)
    lo, hi = graph_bounds(g, x0, 0.1, 0)
    Y = g.forward(x0 + rng.uniform(-0.1, 0.1, size=(2000, 24)))
    assert np.all(Y >= lo) and np.all(Y <= hi)


def test_linear_resize_of_a_conv_map_bounds_hold(tmp_path):
    """Conv -> Relu -> bilinear Resize x2 (half_pixel, as nn.Upsample(mode='bilinear')) ->
    Conv: CROWN bounds over an l_inf ball enclose sampled outputs and are tighter than
    interval arithmetic."""
    rng = np.random.default_rng(5)
    w1 = rng.normal(0, 0.5, (3, 2, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.5, (2, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Resize", ["r", "", "s"], ["u"], name="up", mode="linear"),
             helper.make_node("Conv", ["u", "w2"], ["y"], strides=[2, 2])]
    path, model = _save(tmp_path, nodes, {"w1": w1, "w2": w2,
                                          "s": np.array([1, 1, 2, 2], np.float32)}, [1, 2, 4, 4])
    g = load_graph(path)
    x0 = rng.normal(size=32)
    ref = ReferenceEvaluator(model).run(None, {"x": x0.reshape(1, 2, 4, 4).astype(np.float32)})[0]
    np.testing.assert_allclose(g.forward(x0[None]).reshape(-1), ref.reshape(-1), rtol=1e-4,
                               atol=1e-4)
    lo, hi = graph_bounds(g, x0, 0.05, 0)
    Y = g.forward(x0 + rng.uniform(-0.05, 0.05, size=(4000, 32)))
    assert np.all(Y >= lo) and np.all(Y <= hi)
    from crown_cli.engine.graph_bounds import GraphBounds

    ibp = GraphBounds(g, x0, 0.05, 0, intermediate="interval")
    assert np.sum(hi - lo) < np.sum(ibp.hi[g.output] - ibp.lo[g.output])
