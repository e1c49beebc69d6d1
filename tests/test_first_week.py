"""Issue 39, "the first week": the remaining crashes get one line and the documented exit code
with nothing half-written, the help texts match the tool, and the suite fits its budget. One
test (at least) per item of the issue, each asserting the message."""
import contextlib
import csv
import io
import json
import os
import re
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, error_line, interrupt_row_writes, model_path
from crown_cli.cli import cli

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from graph_models import G, dense_chain, residual  # noqa: E402

SMALL = model_path("mnist_2x20.h5")
CIFAR_MODEL = model_path("cifar_base_kw.onnx")
README = os.path.join(ROOT, "README.md")
TESTING_DOC = os.path.join(ROOT, "docs", "testing.md")
GiB = 2 ** 30


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@contextlib.contextmanager
def address_space_limit(extra=2 * GiB):
    """At most ``extra`` more bytes of address space for this process while inside, so that a
    loader that does allocate a huge tensor gets a MemoryError at once instead of exhausting
    the machine (Linux; elsewhere nothing is limited)."""
    try:
        import resource

        with open("/proc/self/status") as fh:
            vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, StopIteration):
        yield
        return
    limit = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def save(model, path):
    onnx.save(model, str(path))
    return path


# ------------------------------------------------------------------------ 1: one output


def test_onnx_with_one_output_is_refused_before_any_file(tmp_path):
    """A 4-8-1 ONNX chain is lowered to an MLP with one output; it was certified until an
    IndexError, leaving a header-only CSV and a sidecar."""
    model = save(dense_chain(np.random.default_rng(0), sizes=(4, 8, 1)), tmp_path / "one.onnx")
    images = tmp_path / "img.npz"
    np.savez(images, x=np.random.default_rng(1).uniform(-0.5, 0.5, (3, 4)), y=np.zeros(3, int))
    out = tmp_path / "r.csv"
    res = run("certify", "--model", model, "--images", images, "-o", out)
    assert res.exit_code == 2, res.output
    assert f"{model}: the output has 1 value, need >= 2 classes" in error_line(res)
    assert not out.exists() and not (tmp_path / "r.csv.json").exists()


# ------------------------------------------------------------------------ 2: memory budget


def constant_of_shape_model(n=100000):
    """MatMul by a weight that ConstantOfShape builds at n x n: 178 bytes on disk."""
    g = G(np.random.default_rng(0))
    shape = g.const(np.array([n, n]), np.int64)
    w = g.op("ConstantOfShape", [shape],
             value=numpy_helper.from_array(np.array([0.5], np.float32)))
    return g.model([("x", (1, n))], [g.op("MatMul", ["x", w])])


def test_constant_of_shape_is_held_to_the_budget_before_it_is_filled(tmp_path):
    import crown_cli

    path = save(constant_of_shape_model(), tmp_path / "cos.onnx")
    with address_space_limit():
        res = run("inspect", "--model", path)
        with pytest.raises(crown_cli.InputError) as err:
            crown_cli.load_model(path)
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert re.search(r"cos\.onnx: ConstantOfShape node '[^']+': the constant of shape "
                     r"\(100000, 100000\) would take 74\.5 GiB as float64, over the memory "
                     r"budget of 4 GiB \(--memory-budget\)", line), line
    assert "ConstantOfShape" in str(err.value) and "memory_budget" in str(err.value)


def test_budget_also_holds_for_expand_and_range(tmp_path):
    g = G(np.random.default_rng(0))
    big = g.op("Expand", [g.const(np.ones((1, 1), np.float32)),
                          g.const(np.array([60000, 60000]), np.int64)])
    y = g.op("Add", ["x", big])
    path = save(g.model([("x", (1, 4))], [y]), tmp_path / "expand.onnx")
    with address_space_limit():
        res = run("inspect", "--model", path)
    assert res.exit_code == 2
    assert "the result of shape (60000, 60000) would take 26.8 GiB" in error_line(res)

    g = G(np.random.default_rng(0))
    rng_ = g.op("Range", [g.const(np.array(0, np.int64)), g.const(np.array(10 ** 10, np.int64)),
                          g.const(np.array(1, np.int64))])
    y = g.op("Add", ["x", g.op("Cast", [rng_], to=TensorProto.FLOAT)])
    path = save(g.model([("x", (1, 4))], [y]), tmp_path / "range.onnx")
    with address_space_limit():
        res = run("inspect", "--model", path, "--memory-budget", "1")
    assert res.exit_code == 2
    assert re.search(r"Range node '[^']+': the range of shape \(10000000000,\) would take "
                     r"74\.5 GiB as float64, over the memory budget of 1 GiB", error_line(res))


def test_huge_external_data_is_refused_before_it_is_read(tmp_path):
    """A 40 GB external-data initializer (a sparse file: no disk space, no memory) is
    refused from its declared shape, not read into memory."""
    n = 100000
    w = TensorProto()
    w.name, w.data_type = "W", TensorProto.FLOAT
    w.dims.extend([n, n])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(4 * n * n))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = save(model, tmp_path / "ext.onnx")
    with open(tmp_path / "w.bin", "wb") as fh:
        fh.truncate(4 * n * n)
    with address_space_limit():
        res = run("inspect", "--model", path)
    assert res.exit_code == 2, res.output
    assert (f"{path}: tensor 'W' (shape [100000, 100000], external data in w.bin) needs "
            "37.3 GiB to read, over the memory budget of 4 GiB (--memory-budget)"
            ) in error_line(res)


def test_memory_error_reading_onnx_has_a_reason(tmp_path, monkeypatch):
    """What no size check foresees: a MemoryError inside onnx.load (whose message is empty)."""
    import crown_cli

    path = save(dense_chain(np.random.default_rng(0)), tmp_path / "net.onnx")

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(onnx, "load", no_memory)
    res = run("inspect", "--model", path)
    assert res.exit_code == 2
    assert (f"{path}: cannot read ONNX file (out of memory: its tensors do not fit in the "
            "free memory)") in error_line(res)
    with pytest.raises(crown_cli.InputError, match="out of memory: its tensors"):
        crown_cli.load_model(path)


def test_load_model_turns_any_memory_error_into_input_error(monkeypatch):
    """An NPZ whose arrays do not fit: crown_cli.load_model raises InputError, not MemoryError."""
    import crown_cli
    from crown_cli.io import models

    def no_memory(path):
        raise MemoryError("Unable to allocate 40 GiB")

    monkeypatch.setattr(models, "_load_hdf5", no_memory)
    with pytest.raises(crown_cli.InputError,
                       match=re.escape(f"{SMALL}: not enough memory to load the model "
                                       "(Unable to allocate 40 GiB)")):
        crown_cli.load_model(SMALL)


# ------------------------------------------------------------------------ 3: test tiers


def _pyproject_addopts():
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    return re.search(r"^addopts = (.*)$", text, re.M).group(1)


def test_default_test_command_leaves_out_the_slow_tier_and_ci_runs_both():
    assert "-m 'not slow'" in _pyproject_addopts()
    readme = open(README, encoding="utf-8").read()
    assert "python -m pytest -q -n 2\n" in readme
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().splitlines()
    runs = [line for line in ci if "pytest" in line]
    assert runs == ["python3 -m pytest -q -n 2", "python3 -m pytest -q -n 2 -m slow"]
    doc = open(TESTING_DOC, encoding="utf-8").read()
    assert "python -m pytest -q -n 2 -m slow" in doc
    assert "python -m pytest -q -m 'slow or not slow'" in doc
    # the tiers' measured times, and what the slow one holds, are in the doc
    tiers = doc.split("## Test tiers", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"default tier.*\d+ min", tiers, re.S | re.I)
    assert re.search(r"slow tier.*\d+ min", tiers, re.S | re.I)


@pytest.mark.slow  # a collection of 13 files in a subprocess: about 20 s
def test_the_soundness_backbone_keeps_fast_tests_in_the_default_tier():
    """The slow tier takes only the larger cases: each file of the soundness backbone (MILP
    oracles, attacks in certified balls, exact arithmetic, golden files) keeps tests in the
    default tier, as pytest itself selects them."""
    import subprocess

    files = ["test_exact.py", "test_soundness.py", "test_attack.py", "test_golden.py",
             "test_fp64_rounding.py", "test_methods.py", "test_bab_relu.py", "test_verify.py",
             "test_graph_verify.py", "test_graph_relu_split.py", "test_lower.py",
             "test_alpha.py", "test_hull.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *[os.path.join("tests", f) for f in files]],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    default = {line.split("::")[0] for line in out.splitlines() if "::" in line}
    assert default == {f"tests/{f}" for f in files}, out[-500:]
    assert re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", out), out[-500:]


# ------------------------------------------------------------------------ 4: onnxscript


def test_readme_says_the_pytorch_route_needs_onnxscript():
    readme = open(README, encoding="utf-8").read()
    line = next(line for line in readme.splitlines() if "torch.onnx.export" in line
                and "onnxscript" in line)
    assert "pip install onnxscript" in line


# ------------------------------------------------------------------------ 5: CIFAR images


def test_cifar_model_on_the_default_images_points_at_the_shipped_cifar_images(tmp_path):
    import crown_cli

    shipped = os.path.join(os.path.dirname(crown_cli.__file__), "data", "cifar10_test_100.npz")
    res = run("certify", "--model", CIFAR_MODEL, "-n", 1, "-o", tmp_path / "r.csv")
    assert res.exit_code == 2
    line = error_line(res)
    assert ("default MNIST images: images have 784 values each but the model "
            f"{CIFAR_MODEL} expects 3072 inputs; for 32x32x3 inputs, the shipped CIFAR-10 "
            "images: --images ") in line
    named = line.rsplit("--images ", 1)[1]
    assert os.path.samefile(named, shipped)
    assert not (tmp_path / "r.csv").exists()


def test_max_eps_below_the_default_start_caps_every_norm(tmp_path):
    """--max-eps below the search's default first radius (the paper's, by norm: 0.01 for
    l_inf on MNIST, 0.2 for l_2, 0.3 for l_1) is the largest radius reported: each row
    certified at most there, or capped at it (before: the cap rose to the default start,
    rows capped at 0.01 / 0.2 / 0.3 or certified above 0.001); on a graph network too (the
    API, a residual ONNX net)."""
    import crown_cli

    out = tmp_path / "r.csv"
    res = run("certify", "--model", SMALL, "-n", 2, "--norm", "inf,2,1", "--max-eps", 0.001,
              "-o", out)
    assert res.exit_code == 0, res.output
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and {r["norm"] for r in rows} == {"inf", "2", "1"}
    for r in rows:
        assert float(r["eps"]) <= 0.001 and (r["status"] == "capped") == (float(r["eps"]) == 0.001)
    assert all(r["status"] == "capped" for r in rows)  # every image holds 0.001 on this net
    path = save(residual(np.random.default_rng(0)), tmp_path / "res.onnx")
    model = crown_cli.load_model(str(path))
    assert model.dense is None  # the graph engine's certifier
    x = np.random.default_rng(1).uniform(0, 1, 4)
    for norm in ("inf", "2", "1"):
        r = crown_cli.certify(model, x, norm=norm, max_eps=1e-3)
        assert r.eps <= 1e-3 and r.status in ("capped", "certified"), (norm, r)


def test_float_images_in_pixel_units_get_a_note(tmp_path, mnist100):
    """A float NPZ whose x holds 0..255 pixel values is taken in the model's own units (only
    uint8 x is scaled): a note says so (before: silent, radii 255x the intended ones); the
    same images as uint8, scaled, get none."""
    x, y = mnist100
    pix = np.round((x[:2] + 0.5) * 255)
    for name, arr, noted in (("f.npz", pix, True), ("u.npz", pix.astype(np.uint8), False)):
        np.savez(tmp_path / name, x=arr, y=y[:2])
        res = run("certify", "--model", SMALL, "--images", tmp_path / name, "-n", 1, "-q",
                  "-o", tmp_path / (name + ".csv"))
        assert res.exit_code == 0
        assert ("image values reach 255; they are taken in the model's own units" in
                res.stderr) == noted


# ------------------------------------------------------------------------ 6: input scaling


def _shifted_model(tmp_path):
    """mnist_2x20.h5 as if trained on [0, 1] inputs: f'(u) = f(u - 0.5)."""
    from crown_cli.io.models import load_model, save_npz

    mlp = load_model(SMALL)
    mlp.biases[0] = mlp.biases[0] - mlp.weights[0] @ np.full(mlp.input_size, 0.5)
    path = tmp_path / "unit_scale.npz"
    save_npz(str(path), mlp.weights, mlp.biases, mlp.activation)
    return path, mlp


def test_all_images_misclassified_hints_at_the_input_scaling(tmp_path, mnist100):
    from crown_cli.io.models import load_model

    path, mlp = _shifted_model(tmp_path)
    x, y = mnist100
    # images the shifted model gets wrong and the original right (forward passes, not crown's)
    right = np.argmax(load_model(SMALL).forward(x), axis=1) == y
    wrong = np.flatnonzero(right & (np.argmax(mlp.forward(x), axis=1) != y))[:5]
    assert wrong.size == 5
    images = tmp_path / "wrong.npz"
    np.savez(images, x=x[wrong], y=y[wrong])
    res = run("certify", "--model", path, "--images", images)
    assert res.exit_code == 0, res.output
    assert ("crown: warning: all 5 images are misclassified; check the input scaling: these "
            f"images lie in [{x[wrong].min():.3g}, {x[wrong].max():.3g}] (crown scales pixels "
            "to pixel / 255 - 0.5); a model trained on [0, 1]") in res.stderr
    # in the model's own scale the same images are classified: no hint
    np.savez(images, x=x[wrong] + 0.5, y=y[wrong])
    res = run("certify", "--model", path, "--images", images, "--overwrite")
    assert res.exit_code == 0 and "input scaling" not in res.stderr


# ------------------------------------------------------------------------ 7: help texts


def test_help_texts_say_what_the_tool_does():
    top = run("--help").output
    assert "MLP classifiers" not in top and "neural-network classifiers" in top
    assert "per (image, norm, method, target)" in " ".join(run("certify", "--help").output.split())
    pyproject = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    description = re.search(r'^description = "(.*)"$', pyproject, re.M).group(1)
    assert "MLP classifiers" not in description and "neural-network classifiers" in description


# ------------------------------------------------------------------------ 8: resume summary


def test_summary_after_resume_averages_the_whole_file(tmp_path, monkeypatch):
    from crown_cli.io import result_files

    real = interrupt_row_writes(monkeypatch)
    out = tmp_path / "r.csv"
    assert run("certify", "--model", SMALL, "-n", 5, "-o", out).exit_code == 130
    monkeypatch.setattr(result_files.RowWriter, "write", real)
    res = run("certify", "--model", SMALL, "-n", 5, "-o", out, "--resume")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(open(out)))
    eps = [float(r["eps"]) for r in rows if r["eps"]]
    assert len(rows) == 5 and rows[0]["eps"] and rows[1]["eps"]  # the first run's rows count
    assert (f"mean certified eps l_inf crown {np.mean(eps):.5g} over {len(eps)} rows"
            in res.stderr), res.stderr
    assert "3 rows for 5 images" in res.stderr and "2 rows already there (resumed)" in res.stderr


# ------------------------------------------------------------------------ 9, 10: ONNX messages


def lstm_model(seq=2):
    g = G(np.random.default_rng(0))
    hidden = 3
    out = g.op("LSTM", ["x", g.rand(1, 4 * hidden, 4), g.rand(1, 4 * hidden, hidden)],
               n_out=3, hidden_size=hidden)[0]
    return g.model([("x", (seq, 1, 4))], [out])


def test_lstm_is_refused_for_its_operator_not_its_sequence_length(tmp_path):
    path = save(lstm_model(), tmp_path / "lstm.onnx")
    res = run("inspect", "--model", path)
    assert res.exit_code == 2
    line = error_line(res)
    assert "unsupported operator LSTM" in line and "batch dimension" not in line


def test_inspect_names_an_add_of_two_tensors(tmp_path):
    path = save(residual(np.random.default_rng(0)), tmp_path / "res.onnx")
    res = run("inspect", "--model", path)
    assert res.exit_code == 0, res.output
    assert "+ +" not in res.output and "+ -" not in res.output
    assert "sum of 2 inputs (a + b)" in res.output  # the Add
    assert "sum of 2 inputs (a - b)" in res.output  # the Sub


def test_unsupported_operator_message_is_short_and_names_an_unnamed_node(tmp_path):
    g = G(np.random.default_rng(0))
    h = g.op("Gemm", ["x", g.rand(5, 4), g.rand(5)], transB=1)
    g.nodes.append(helper.make_node("Hardmax", [h], ["e"]))  # no name: the 2nd node (#1)
    y = g.op("Gemm", ["e", g.rand(3, 5), g.rand(3)], transB=1)
    path = save(g.model([("x", (1, 4))], [y]), tmp_path / "hardmax.onnx")
    res = run("inspect", "--model", path)
    assert res.exit_code == 2
    line = error_line(res)
    assert line == (f"crown: error: {path}: Hardmax node #1: unsupported operator Hardmax "
                    "(docs/formats.md lists the supported operators)")
    assert len(line) - len(str(path)) < 120
    # and the place the message points at lists every operator the graph loader reads
    from crown_cli.graph.onnx_ops import HANDLERS

    doc = open(os.path.join(ROOT, "docs", "formats.md"), encoding="utf-8").read()
    listed = doc.split("**Supported operators**", 1)[1].split("\n- ", 1)[0]
    assert set(re.findall(r"`(\w+)`", listed)) >= set(HANDLERS)


def test_a_failing_unnamed_node_is_named_by_its_position(tmp_path):
    g = G(np.random.default_rng(0))
    h = g.op("Gemm", ["x", g.rand(5, 4), g.rand(5)], transB=1)
    g.nodes.append(helper.make_node("LRN", [h], ["m"], size=3))  # no such operator here
    path = save(g.model([("x", (1, 4))], ["m"]), tmp_path / "lrn.onnx")
    res = run("inspect", "--model", path)
    assert res.exit_code == 2
    assert (f"{path}: LRN node #1: unsupported operator LRN" in error_line(res))


# ------------------------------------------------------------------------ 11: report format


@pytest.fixture(scope="module")
def result_csv(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "r.csv"
    assert run("certify", "--model", SMALL, "-n", 2, "-o", out, "-q").exit_code == 0
    return out


def test_report_output_format_follows_the_extension(result_csv, tmp_path):
    res = run("report", result_csv, "-o", tmp_path / "x.jsonl")
    assert res.exit_code == 2
    assert (f"{tmp_path / 'x.jsonl'}: crown report writes one table (markdown, latex, csv or "
            "json), not JSON Lines") in error_line(res)
    assert not (tmp_path / "x.jsonl").exists()
    res = run("report", result_csv, "-o", tmp_path / "x.csv", "--format", "latex")
    assert res.exit_code == 2
    assert (f"{tmp_path / 'x.csv'}: --format latex but the name ends in .csv"
            in error_line(res))
    assert not (tmp_path / "x.csv").exists()
    for name, check in (("x.csv", lambda t: t.splitlines()[0].startswith("network,")),
                        ("x.json", lambda t: "rows" in json.loads(t)),
                        ("x.tex", lambda t: "\\begin{tabular}" in t),
                        ("x.md", lambda t: t.startswith("|")),
                        ("x.txt", lambda t: t.startswith("|"))):
        res = run("report", result_csv, "-o", tmp_path / name)
        assert res.exit_code == 0, res.output
        assert check((tmp_path / name).read_text()), name


# ------------------------------------------------------------------------ 12: untargeted floor


class _StubCertifier:
    """A certifier whose targeted searches stop short of the untargeted radius."""

    norm, method, search, precision, rtol = "inf", "alpha-crown", "interp", "mixed", 1e-4

    def __init__(self, radii):
        self.radii = radii  # number of targets -> radius
        self.calls = []

    def warm_up(self):
        pass

    def logits(self, x):
        z = np.zeros((len(x), 10))
        z[:, 3], z[:, 5] = 2.0, 1.0  # predicted 3, runner-up 5, least 0
        return z

    def certify(self, x0, c, targets):
        from crown_cli.certification.certifier import Certificate

        self.calls.append(len(targets))
        eps = self.radii[len(targets)]
        return Certificate(eps, len(targets) / 1000, 1.0, 4, "certified", 0.01)


def test_targeted_radius_is_at_least_the_untargeted_one():
    from crown_cli.certification.runner import certify_images

    cert = _StubCertifier({9: 0.013102260, 1: 0.013098582})
    rows = []
    summary = certify_images([cert], np.zeros((1, 4)), np.array([3]), [0],
                             ["runner-up", "least", "untargeted"], 1215, rows.append,
                             progress=False)
    assert [r["target_type"] for r in rows] == ["runner-up", "least", "untargeted"]
    assert cert.calls == [9, 1, 1]  # the untargeted search first
    assert [r["eps"] for r in rows] == [0.013102260] * 3
    assert rows[0]["lower_bound"] == rows[2]["lower_bound"] == 0.009
    assert rows[0]["margin"] == 1.0 and rows[0]["status"] == "certified"
    assert summary.eps_by[("inf", "alpha-crown")] == [0.013102260] * 3
    # a targeted radius above the untargeted one stays as it is
    cert = _StubCertifier({9: 0.01, 1: 0.02})
    rows = []
    certify_images([cert], np.zeros((1, 4)), np.array([3]), [0], ["untargeted", "runner-up"],
                   1215, rows.append, progress=False)
    assert [r["eps"] for r in rows] == [0.01, 0.02]


def test_untargeted_floor_from_a_resumed_file():
    """The untargeted row already in the file (text values) is the floor of a targeted row
    this run computes."""
    from crown_cli.certification.runner import certify_images, row_key

    cert = _StubCertifier({9: 0.5, 1: 0.0131})
    there = {("0", "untargeted", "", "inf", "alpha-crown"):
             {"eps": "0.0132", "lower_bound": "0.009", "status": "certified"}}
    rows = []
    summary = certify_images([cert], np.zeros((1, 4)), np.array([3]), [0],
                             ["runner-up", "untargeted"], 1215, rows.append, progress=False,
                             skip=lambda key: there.get(key))
    assert cert.calls == [1] and len(rows) == 1
    assert row_key(rows[0])[1] == "runner-up" and rows[0]["eps"] == 0.0132
    assert summary.skipped == 1 and summary.eps_by[("inf", "alpha-crown")] == [0.0132, 0.0132]


def test_targeted_rows_never_below_untargeted_with_alpha_crown():
    res = run("certify", "--model", SMALL, "-n", 6, "--method", "alpha-crown",
              "--target", "runner-up,least,untargeted", "--alpha-iters", 5, "-q")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    by_image = {}
    for r in rows:
        if r["eps"]:
            by_image.setdefault(r["image"], {})[r["target_type"]] = float(r["eps"])
    assert by_image
    for radii in by_image.values():
        assert all(e >= radii["untargeted"] for e in radii.values()), radii


def test_docs_say_why_targeted_rows_may_equal_the_untargeted_radius():
    doc = open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()
    assert "at least the untargeted row's" in " ".join(doc.split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_inspect_lists_every_onnx_operator():
    """``crown inspect --operators`` (issue 36): one line per operator the loader reads, with
    how it is bounded; without --model or --operators a usage error."""
    from crown_cli.graph.onnx_ops import HANDLERS

    res = run("inspect", "--operators")
    assert res.exit_code == 0
    lines = res.output.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == sorted(HANDLERS)
    assert all(len(ln.split(None, 1)) == 2 for ln in lines)
    assert any(ln.startswith("Sin ") and "tangent" in ln for ln in lines)
    res = run("inspect")
    assert res.exit_code == 2 and "--operators" in res.output
