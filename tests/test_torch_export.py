"""ONNX files written by PyTorch's own exporter (``torch.onnx.export``), no torch needed here.

The fixtures in tests/fixtures/torch/ were made by scripts/make_torch_fixtures.py in a
separate venv (torch 2.13.0 CPU, onnxscript 0.7.2): three small models (a convolutional MNIST
net with BatchNorm and MaxPool, a residual block with AvgPool and a global average pool, an MLP
with its input normalisation in ``forward``, ``x.view(x.size(0), -1)``, mixed activations and
a sigmoid output) and ReLU6 (exported as ``Clip``; refused before Clip was read as ReLU
nodes), each exported by the
default exporter (``<name>.onnx``, dynamo, opset 20) and by the TorchScript one
(``<name>_legacy.onnx``, ``dynamo=False``, opset 17), with ``<name>.expected.npz``: random
inputs ``x`` and torch's float32 outputs ``y`` for them.

Checked: crown's float64 forward equals torch's outputs and onnx.reference; ``crown inspect``
names what the loader folded; ``crown certify --method crown`` on the MNIST net gives radii
that sampling and the attack cannot break (and both exporters' files the same radius);
``crown verify`` on VNN-LIB properties written here gives verdicts an attack agrees with;
ReLU6's Clip loads as ReLU nodes with the same forward pass; GELU, SiLU, HardSwish, Mish and
PReLU (``gated``), and SELU, CELU and GELU's tanh form (``selu_celu``, torch 2.14.1) load,
fused where the exporter splits them, with bounds that hold.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx.reference import ReferenceEvaluator

import crown_cli
from crown_cli.certification.graph_certifier import GraphCertifier
from crown_cli.cli import cli
from crown_cli.graph.network import Graph
from crown_cli.io.networks import load_network
from crown_cli.verification.graph_verifier import graph_counterexample
from test_verify import box_property

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "torch"
NAMES = ["mnist_conv", "residual", "normalised", "gated", "selu_celu", "tiny_vit"]
# softplus_legacy (a plain Softplus) loads as an MLP: test_softplus_exports
FILES = [f"{name}{suffix}" for name in NAMES for suffix in ("", "_legacy")] + ["softplus"]

# operators each export must contain: what the fixture is there to cover
COVERS = {
    "mnist_conv": {"Conv", "Relu", "MaxPool", "Gemm"},
    "mnist_conv_legacy": {"Conv", "MaxPool", "Flatten", "Gemm", "BatchNormalization"},
    "residual": {"Conv", "AveragePool", "BatchNormalization", "Add", "ReduceMean"},
    "residual_legacy": {"Conv", "AveragePool", "BatchNormalization", "Add", "GlobalAveragePool"},
    "normalised": {"Sub", "Div", "Reshape", "Tanh", "LeakyRelu", "Sigmoid"},
    "normalised_legacy": {"Sub", "Div", "Shape", "Gather", "Unsqueeze", "Concat", "Reshape",
                          "Tanh", "LeakyRelu", "Sigmoid"},
    "gated": {"Gelu", "Sigmoid", "Mul", "HardSwish", "Mish", "PRelu"},
    "gated_legacy": {"Div", "Erf", "Add", "Mul", "Sigmoid", "HardSwish", "Softplus", "Tanh",
                     "PRelu"},
    "softplus": {"Softplus", "Greater", "Where"},
    "selu_celu": {"Selu", "Celu", "Gelu"},
    "selu_celu_legacy": {"Selu", "Celu", "Mul", "Add", "Tanh"},
    "tiny_vit": {"LayerNormalization", "MatMul", "Softmax", "Gelu", "Transpose"},
    "tiny_vit_legacy": {"LayerNormalization", "MatMul", "Softmax", "Erf", "Mod", "Sqrt", "Div"},
}
# what `crown inspect` must show: the loader's folds and the nodes the operators became
INSPECT = {
    "mnist_conv": ["conv 1 -> 4, kernel 3x3", "max pool 784 -> 196 (2x2)", "dense 196 -> 16"],
    "mnist_conv_legacy": ["/fc1/Gemm", "(folded: /bn1/BatchNormalization)",
                          "max pool 784 -> 196 (2x2)"],
    "residual": ["average pool 2x2", "scale 96", "sum of 2 inputs (a + b)",
                 "mean over axes 2,3 96 -> 6"],
    "residual_legacy": ["/bn1/BatchNormalization scale 96", "sum of 2 inputs (a + b)",
                        "/gap/GlobalAveragePool average pool 4x4 96 -> 6"],
    "normalised": ["node_linear          dense 48 -> 12", "(folded: node_sub, node_div)",
                   "activations: leaky_relu, sigmoid, tanh"],
    "normalised_legacy": ["(folded: /Div)", "activations: leaky_relu, sigmoid, tanh"],
    # GELU, SiLU and Mish fused into one node each, PReLU's per-channel slopes as ReLUs
    "gated": ["activations: gelu, hardswish, mish, relu, silu", "node_silu/silu",
              "node_prelu/relu_neg"],
    "gated_legacy": ["activations: gelu, hardswish, mish, relu, silu", "/Mul_1/gelu",
                     "/Mul_3/mish"],
    # the default exporter's Where(Greater(z, 20), z, Softplus(z)): one node
    "softplus": ["activations: softplus_t", "softplus_t (alpha=20)"],
    # Selu: ELU of scale 1.67 (its gamma, Celu's 1 / 0.7 and 0.7 folded into the Gemms);
    # the TorchScript exporter's GELU tanh chain: one node
    "selu_celu": ["activations: elu, gelu_tanh", "elu (alpha=1.67326)", "elu (alpha=1)",
                  "(folded: node_celu)"],
    "selu_celu_legacy": ["activations: elu, gelu_tanh", "/Mul_5/gelu_tanh",
                         "gelu_tanh (allowance 9.96e-09)", "(folded: /Selu, /Celu)"],
    # layer normalisation: a square, sqrt, a division (reciprocal and product); attention's
    # softmax (exp, a reciprocal) and products of data
    "tiny_vit": ["activations: exp, gelu, reciprocal, sqrt, square", "node_layer_norm/std",
                 "product of two data tensors"],
    "tiny_vit_legacy": ["activations: exp, gelu, reciprocal, sqrt, square",
                        "product of two data tensors"],
}


def path_of(name: str) -> str:
    return str(FIXTURES / f"{name}.onnx")


def expected(name: str):
    e = np.load(FIXTURES / f"{name.replace('_legacy', '')}.expected.npz")
    x = e["x"]
    return x, x.reshape(len(x), -1).astype(np.float64), e["y"].reshape(len(x), -1)


def reference(model, x):
    """onnx.reference's outputs for the (N, ...) float32 inputs x, one row each."""
    ref = ReferenceEvaluator(model)
    name = model.graph.input[0].name
    return np.concatenate([np.asarray(ref.run(None, {name: row[None]})[0], np.float64)
                           .reshape(1, -1) for row in x])


def test_every_fixture_is_there_and_written_by_torch():
    for name in NAMES + ["relu6", "softplus"]:
        e = np.load(FIXTURES / f"{name}.expected.npz")
        assert str(e["writer"]).startswith("torch 2."), str(e["writer"])
    for name in FILES + ["relu6", "relu6_legacy", "softplus_legacy"]:
        producer = onnx.load(path_of(name)).producer_name
        assert producer == "pytorch", (name, producer)


@pytest.mark.parametrize("name", FILES)
def test_forward_equals_torch_and_onnx_reference(name):
    """crown's float64 forward pass of the exported file equals torch's float32 outputs within
    float32 rounding (1e-5 relative) and onnx.reference's; the files cover the operators
    they are meant to (shape arithmetic, BatchNorm left for the loader, global pools, ...)."""
    model = onnx.load(path_of(name))
    assert COVERS[name] <= {n.op_type for n in model.graph.node}
    g = load_network(path_of(name))
    assert isinstance(g, Graph)
    x, flat, y = expected(name)
    got = g.forward(flat)
    assert got.shape == y.shape
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, reference(model, x), rtol=1e-5, atol=1e-6)
    assert np.ptp(y, axis=0).max() > 1e-2  # the inputs tell the outputs apart


def test_dynamic_batch_axis():
    """The normalised net was exported with a dynamic batch axis; the loader takes it as 1
    (and onnx.reference runs the file on the whole batch at once, as torch did)."""
    for name in ("normalised", "normalised_legacy"):
        model = onnx.load(path_of(name))
        dim = model.graph.input[0].type.tensor_type.shape.dim[0]
        assert dim.dim_param and not dim.dim_value
        x, flat, y = expected(name)
        batch = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x})[0]
        np.testing.assert_allclose(load_network(path_of(name)).forward(flat), batch,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["relu6", "relu6_legacy"])
def test_relu6_clip_loads_as_relu_nodes(name):
    """ReLU6 (and Hardtanh) export as Clip, read as lo + relu(x - lo) - relu(x - hi)
    (graph/onnx_relu_forms.py): the forward pass equals torch's outputs and onnx.reference's,
    and the graph has the two ReLU nodes (it was refused in one line before)."""
    path = path_of(name)
    model = onnx.load(path)
    assert "Clip" in {n.op_type for n in model.graph.node}
    g = load_network(path)
    assert isinstance(g, Graph)
    assert [n.op.name for n in g.nodes if n.kind == "activation"] == ["relu", "relu"]
    x, flat, y = expected(name)
    got = g.forward(flat)
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, reference(model, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", FILES)
def test_inspect_names_what_was_folded(name):
    res = CliRunner().invoke(cli, ["inspect", "--model", path_of(name)])
    assert res.exit_code == 0, res.output
    assert "graph:" in res.output
    for text in INSPECT[name]:
        assert text in res.output, (text, res.output)


def _images(tmp_path, g, n=2):
    """The first n shipped MNIST images (pixel/255 - 0.5) labelled with the model's own
    classes, written as an NPZ for `crown certify`."""
    x, _ = crown_cli.load_images()
    x = x[:n]
    y = np.argmax(g.forward(x), axis=1)
    path = tmp_path / "images.npz"
    np.savez(path, x=x, y=y)
    return str(path), x, y


def _certify(path, images):
    res = CliRunner().invoke(cli, ["certify", "--model", path, "--images", images, "--method",
                                   "crown", "--target", "untargeted", "-q"])
    assert res.exit_code == 0, res.output
    return list(csv.DictReader(io.StringIO(res.stdout)))


def test_certify_mnist_conv_is_sound_by_sampling_and_attack(tmp_path):
    """`crown certify --method crown --target untargeted` on the exported MNIST conv net: both
    images certified with a positive radius; inside each l_inf ball 3000 samples (a third of
    them corners) keep the decision and the attack (every other class a case) finds nothing;
    in a ball 20 times larger the attack flips the decision (the check can fail). The
    TorchScript export of the same torch model gives the same radii (1e-4 relative: the two
    exporters round the folded BatchNorm differently in float32)."""
    path = path_of("mnist_conv")
    g = load_network(path)
    images, x, y = _images(tmp_path, g)
    rows = _certify(path, images)
    assert len(rows) == 2
    rng = np.random.default_rng(0)
    n_out = g.output_size
    for r in rows:
        i, c, eps = int(r["image"]), int(r["predicted"]), float(r["eps"])
        assert r["status"] == "certified" and c == y[i] and eps > 1e-4, r
        assert float(r["eps"]) == GraphCertifier(g, norm="inf").certify(
            x[i], c, [t for t in range(n_out) if t != c]).eps
        pts = x[i] + eps * rng.uniform(-1, 1, size=(3000, x.shape[1]))
        pts[:1000] = x[i] + eps * rng.choice([-1.0, 1.0], size=(1000, x.shape[1]))
        assert np.all(np.argmax(g.forward(pts), axis=1) == c)
        cases = [((np.eye(n_out)[c] - np.eye(n_out)[t])[None], np.zeros(1))
                 for t in range(n_out) if t != c]
        assert graph_counterexample(g, x[i] - eps, x[i] + eps, cases, restarts=16,
                                    steps=50, seed=1) is None
        assert graph_counterexample(g, x[i] - 20 * eps, x[i] + 20 * eps, cases, restarts=16,
                                    steps=50, seed=1) is not None
    legacy = _certify(path_of("mnist_conv_legacy"), images)
    for a, b in zip(rows, legacy):
        assert a["predicted"] == b["predicted"] and b["status"] == "certified"
        assert float(b["eps"]) == pytest.approx(float(a["eps"]), rel=1e-4)


def _verify(tmp_path, path, lo, hi, n_out, c, t, tag):
    spec = tmp_path / f"{tag}.vnnlib"
    spec.write_text(box_property(lo, hi, c, t, 0.0, n_out))  # unsafe: Y_c - Y_t <= 0
    res = CliRunner().invoke(cli, ["verify", "--model", path, "--spec", str(spec),
                                   "--timeout", "30"])
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("name", ["residual", "normalised_legacy"])
def test_verify_verdicts_agree_with_the_attack(tmp_path, name):
    """`crown verify` on "can class t reach class c's output" around a stored input: in a box
    of half the certified radius the verdict is unsat and the attack finds nothing there; in a
    box 30 times the radius the verdict is sat with a counterexample inside the box that
    violates by crown's forward pass and by onnx.reference."""
    path = path_of(name)
    g = load_network(path)
    model = onnx.load(path)
    x, flat, y = expected(name)
    x0 = flat[0]
    c, t = int(np.argmax(y[0])), int(np.argsort(y[0])[-2])
    r = GraphCertifier(g, norm="inf").certify(x0, c, [t]).eps
    assert r > 0
    case = [((np.eye(g.output_size)[c] - np.eye(g.output_size)[t])[None], np.zeros(1))]
    small = _verify(tmp_path, path, x0 - r / 2, x0 + r / 2, g.output_size, c, t, "small")
    assert small.splitlines()[0] == "unsat", small
    assert graph_counterexample(g, x0 - r / 2, x0 + r / 2, case, restarts=16, steps=50) is None
    lo, hi = x0 - 30 * r, x0 + 30 * r
    big = _verify(tmp_path, path, lo, hi, g.output_size, c, t, "big")
    assert big.splitlines()[0] == "sat", big
    values = {}
    for line in big.splitlines()[1:]:
        key, val = line.strip(" ()").split()
        values[key] = float(val)
    cx = np.array([values[f"X_{i}"] for i in range(g.input_size)])
    assert np.all(cx >= np.nextafter(lo, -np.inf)) and np.all(cx <= np.nextafter(hi, np.inf))
    out = g.forward(cx)
    assert out[t] >= out[c]
    ref = reference(model, cx.reshape((1,) + x.shape[1:]).astype(np.float32))[0]
    np.testing.assert_allclose(ref, out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["gated", "gated_legacy", "softplus", "selu_celu",
                                  "selu_celu_legacy"])
def test_gated_activations_bounds_hold(name):
    """GELU, SiLU, HardSwish, Mish and PReLU as torch exports them: CROWN's output bounds on an
    l_inf ball of radius 0.1 around each expected input hold at its 2000 sampled points
    (corners included), and are finite and not vacuous (width below 25x the sampled one)."""
    from crown_cli.engine.graph_bounds import GraphBounds
    from crown_cli.engine.input_sets import Box

    g = load_network(path_of(name))
    _, flat, _ = expected(name)
    rng = np.random.default_rng(0)
    for x0 in flat[:3]:
        lo, hi = x0 - 0.1, x0 + 0.1
        blo, bhi = GraphBounds(g, *Box(lo, hi).args()).bounds()
        xs = rng.uniform(lo, hi, size=(2000, x0.size))
        xs[:200] = np.where(rng.random((200, x0.size)) < 0.5, lo, hi)
        y = g.forward(xs)
        assert np.all(y >= blo) and np.all(y <= bhi)
        assert np.all(np.isfinite(blo)) and np.all(np.isfinite(bhi))
        # sampling finds a fraction of the true range in 72 dimensions, CROWN through six
        # layers widens it: 5.7-12.9x measured where this was written (gated_legacy); with
        # the patterns left as products of data (no fusion), 39-105x
        assert np.all(bhi - blo <= 25.0 * (y.max(0) - y.min(0)))


def test_softplus_exports():
    """torch's Softplus: the TorchScript export (a plain Softplus) loads as an MLP, the default
    exporter's Where(Greater(z, 20), z, Softplus(z)) as one softplus_t node of a graph; both
    forward passes equal torch's outputs, with pre-activations on both sides of 20."""
    from crown_cli.io.models import MLP

    x, flat, y = expected("softplus")
    mlp = load_network(path_of("softplus_legacy")).dense
    assert isinstance(mlp, MLP) and mlp.activation == "softplus"
    g = load_network(path_of("softplus"))
    assert [n.op.name for n in g.nodes if n.kind == "activation"] == ["softplus_t"]
    z = g.forward(flat, return_all=True)[1][1]
    assert (z > 20.0).any() and (z < 20.0).any()
    for net in (mlp, g):
        np.testing.assert_allclose(net.forward(flat), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny_vit", "tiny_vit_legacy"])
def test_tiny_vit_certified_radius_holds_against_samples_and_the_attack(name):
    """The exported transformer (layer normalisation, attention, GELU): crown's CROWN radius
    on each input keeps the class on 2000 samples of the l_inf ball (vertices among them)
    and against the attack; the attack finds a change of class in a ball 30 times larger
    (the check can fail)."""
    g = load_network(path_of(name))
    _, flat, _ = expected(name)
    rng = np.random.default_rng(0)
    for x0 in flat[:2]:
        c = int(np.argmax(g.forward(x0)))
        others = [t for t in range(g.output_size) if t != c]
        res = GraphCertifier(g, norm="inf").certify(x0, c, others)
        assert res.status == "certified" and res.eps > 0
        cases = [((np.eye(g.output_size)[c] - np.eye(g.output_size)[t])[None], np.zeros(1))
                 for t in others]
        assert graph_counterexample(g, x0 - res.eps, x0 + res.eps, cases, restarts=16,
                                    steps=50, seed=1) is None
        pts = x0 + res.eps * rng.uniform(-1, 1, size=(2000, x0.size))
        pts[:500] = x0 + res.eps * rng.choice([-1.0, 1.0], size=(500, x0.size))
        assert np.all(np.argmax(g.forward(pts), axis=1) == c)
        big = 30 * res.eps
        assert graph_counterexample(g, x0 - big, x0 + big, cases, restarts=16, steps=50,
                                    seed=1) is not None
