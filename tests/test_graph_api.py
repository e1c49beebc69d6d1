"""The public API on graph networks (crown_cli.load_model / certify / verify): the same radii
and verdicts as `crown certify` / `crown verify` on small convolutional models, Keras
(channels-last) and ONNX (channel-first, 3 channels)."""
from __future__ import annotations

import csv
import io
import os

import numpy as np
import onnx
import pytest

from conftest import slow_if
from click.testing import CliRunner

import crown_cli
import keras_models as km
from crown_cli import InputError
from crown_cli.cli import cli
from crown_cli.graph.network import Graph
from graph_models import G

CIFAR = os.path.join(os.path.dirname(crown_cli.__file__), "data", "cifar10_test_100.npz")


def run_cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def keras_conv(tmp_path):
    layers, inputs, outputs = km.mnist_conv(np.random.default_rng(0))
    path = tmp_path / "conv.keras"
    km.save_keras3(path, layers, inputs, outputs, sequential=True)
    return str(path)


def onnx_cifar_conv(tmp_path):
    """(1, 3, 32, 32) -> Conv 3->2 5x5 stride 4 -> Relu -> Flatten -> Gemm 10."""
    g = G(np.random.default_rng(2))
    x = g.op("Conv", ["x", g.rand(2, 3, 5, 5, scale=0.3), g.rand(2, scale=0.1)], strides=[4, 4])
    x = g.op("Flatten", [g.op("Relu", [x])])
    x = g.op("Gemm", [x, g.rand(10, 98, scale=0.3), g.rand(10, scale=0.1)], transB=1)
    path = str(tmp_path / "cifar_conv.onnx")
    onnx.save(g.model([("x", (1, 3, 32, 32))], [x]), path)
    return path


def labelled(tmp_path, net, x, name):
    """An NPZ of images x labelled with the network's predictions (nothing misclassified)."""
    from crown_cli.certification.graph_certifier import to_graph_layout

    y = np.argmax(net.forward(to_graph_layout(net, x)), axis=1)
    path = tmp_path / f"{name}.npz"
    np.savez(path, x=x, y=y)
    return str(path), y


def cli_rows(model, images, *opts):
    r = run_cli("certify", "--model", model, "--images", images, "-q", *opts)
    assert r.exit_code == 0, r.output
    return list(csv.DictReader(io.StringIO(r.output)))


@pytest.mark.parametrize("kind", [slow_if(True, "keras"), "onnx"])
def test_certify_equals_the_cli_on_a_conv_model(tmp_path, kind):
    if kind == "keras":
        model, (x, _) = keras_conv(tmp_path), crown_cli.load_images()
    else:
        with np.load(CIFAR) as data:
            x = (data["x"][:2].reshape(2, -1) / 255.0 - 0.5)
        model = onnx_cifar_conv(tmp_path)
    net = crown_cli.load_model(model)
    assert isinstance(net, Graph)
    x = x[:2]
    images, y = labelled(tmp_path, net, x, kind)
    for norm in ("inf", "2"):
        rows = cli_rows(model, images, "--norm", norm, "--method", "crown")
        assert len(rows) == 2
        for i, row in enumerate(rows):
            r = crown_cli.certify(net, x[i], label=int(y[i]), norm=norm, method="crown")
            assert r.status == row["status"] == "certified"
            assert r.eps == float(row["eps"]) and r.eps > 0
            assert r.target == int(row["target"]) and r.predicted == int(row["predicted"])
            assert r.evaluations == int(row["evaluations"])
    # a path works the same; fast-lin too; methods not on graphs are refused by name
    assert crown_cli.certify(model, x[0], method="fast-lin").eps == \
        float(cli_rows(model, images, "--method", "fast-lin", "-n", "1")[0]["eps"])
    if kind == "keras":  # a max pool: the graph engine (alpha-crown's last stage only)
        assert net.lowering[0] is None
        with pytest.raises(InputError, match=r"^method lp-full: not available on graph"):
            crown_cli.certify(net, x[0], method="lp-full")
        crown = crown_cli.certify(net, x[0], method="crown")
        alpha = crown_cli.certify(net, x[0], method="alpha-crown")
        assert alpha.status == "certified" and alpha.eps >= crown.eps * (1 - 1e-3)
    else:  # a chain: lowered to the dense engine, which has every method
        assert net.lowering[0] is not None
        crown = crown_cli.certify(net, x[0], method="crown")
        alpha = crown_cli.certify(net, x[0], method="alpha-crown")
        assert alpha.status == "certified" and alpha.eps >= crown.eps * (1 - 1e-3)


def vnnlib(lo, hi, n_out, row, b):
    out = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    out += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    out += [f"(assert (>= X_{i} {float(a)!r}))\n(assert (<= X_{i} {float(z)!r}))"
            for i, (a, z) in enumerate(zip(lo, hi))]
    terms = " ".join(f"(* {float(c)!r} Y_{j})" for j, c in enumerate(row) if c != 0)
    out.append(f"(assert (<= (+ {terms}) {float(b)!r}))")
    return "\n".join(out) + "\n"


def test_verify_equals_the_cli_on_a_keras_conv_model(tmp_path):
    model = keras_conv(tmp_path)
    net = crown_cli.load_model(model)
    x, _ = crown_cli.load_images()
    x0 = x[0]
    r = crown_cli.certify(net, x0, method="crown")
    c, t = r.predicted, r.target
    row = np.zeros(10)
    row[c], row[t] = 1.0, -1.0  # unsafe: f_c - f_t <= 0, X_i in the Keras input's own order
    for eps, b, want in ((0.5 * r.eps, 0.0, "unsat"), (0.3, 1e3, "sat")):
        lo, hi = x0 - eps, x0 + eps
        spec = tmp_path / f"{want}.vnnlib"
        spec.write_text(vnnlib(lo, hi, 10, row, b))
        res = run_cli("verify", "--model", model, "--spec", spec, "--timeout", 30, "-q")
        assert res.exit_code == 0, res.output
        assert res.output.splitlines()[0] == want
        for s in (str(spec), (lo, hi, row, b)):
            v = crown_cli.verify(net, s, timeout=30)
            assert v.result == want
            if want == "sat":
                assert np.all((lo <= v.x) & (v.x <= hi))
                y = net.forward(v.x)
                assert y[c] - y[t] <= b and np.array_equal(v.y, y)
            else:
                assert v.stage == "crown" and v.cases_proven == 1


def test_load_model_memory_budget(tmp_path):
    model = keras_conv(tmp_path)
    for budget, problem in ((1e-6, "weight 'dense/kernel' of shape (48, 10) needs 3.58e-06 GiB"),
                            (2e-5, "a CROWN bound of this graph needs at least")):
        with pytest.raises(InputError) as err:
            crown_cli.load_model(model, memory_budget=budget)
        msg = str(err.value)
        assert problem in msg and msg.endswith(f"budget of {budget:g} GiB (memory_budget)")
        r = run_cli("inspect", "--model", model, "--memory-budget", budget)
        assert r.exit_code == 2
        assert r.output.strip() == "crown: error: " + msg.replace("(memory_budget)",
                                                                  "(--memory-budget)")
    with pytest.raises(InputError, match=r"^memory_budget: must be > 0"):
        crown_cli.load_model(model, memory_budget=0)
    g = crown_cli.load_model(model, memory_budget=0.01)
    assert 0 < g.row_budget <= 0.01 * 2 ** 30


def test_every_model_file_loads_as_one_network_type(tmp_path):
    """One network type: NPZ, plain HDF5, Keras HDF5, Keras 3, an ONNX chain and an ONNX
    convolutional graph all load as a Graph. A chain of dense layers carries the MLP the
    dense engine runs (``dense``, chosen by ``engine_form``), whose function the graph's
    nodes compute; its documented attributes are the MLP's. A conv graph has none."""
    from crown_cli.io.models import save_npz
    from crown_cli.io.networks import engine_form, load_network
    from crown_cli.network import MLP
    from graph_models import dense_chain

    rng = np.random.default_rng(0)
    ws = [rng.normal(size=(6, 5)), rng.normal(size=(3, 6))]
    bs = [rng.normal(size=6), rng.normal(size=3)]
    save_npz(str(tmp_path / "m.npz"), ws, bs, "leaky_relu", alpha=0.2)
    fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
    chain = str(tmp_path / "chain.onnx")
    onnx.save(dense_chain(np.random.default_rng(1)), chain)
    models = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
    files = [str(tmp_path / "m.npz"), os.path.join(models, "mnist_2x20.h5"),
             os.path.join(fixtures, "keras", "k2_relu_activation_layers.h5"),
             os.path.join(fixtures, "keras3", "relu_784.keras"), chain]
    for path in files:
        net = crown_cli.load_model(path)
        assert isinstance(net, Graph) and isinstance(net.dense, MLP), path
        assert engine_form(net) == (net.dense, None, None)
        assert (net.weights, net.biases, net.activation) == \
            (net.dense.weights, net.dense.biases, net.dense.activation)
        assert net.num_classes == net.dense.num_classes == net.output_size
        x = np.random.default_rng(2).uniform(-0.5, 0.5, (7, net.input_size))
        np.testing.assert_allclose(net.forward(x), net.dense.forward(x), rtol=1e-12,
                                   atol=1e-12)
    npz = load_network(files[0])
    assert [(n.op.name, n.op.alpha) for n in npz.nodes if n.kind == "activation"] == \
        [("leaky_relu", 0.2)]
    conv = crown_cli.load_model(onnx_cifar_conv(tmp_path))
    assert isinstance(conv, Graph) and conv.dense is None and engine_form(conv)[1] is None
    with pytest.raises(AttributeError, match="belongs to a chain of dense layers"):
        conv.weights
