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

from conftest import ROOT, model_path
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


def error_line(res):
    """The one stderr line of a refused command, without a traceback."""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("crown: error: "), lines[0]
    assert "Traceback" not in res.output
    return lines[0]


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
    g.nodes.append(helper.make_node("Erf", [h], ["e"]))  # no name: the 2nd node (#1)
    y = g.op("Gemm", ["e", g.rand(3, 5), g.rand(3)], transB=1)
    path = save(g.model([("x", (1, 4))], [y]), tmp_path / "erf.onnx")
    res = run("inspect", "--model", path)
    assert res.exit_code == 2
    line = error_line(res)
    assert line == (f"crown: error: {path}: Erf node #1: unsupported operator Erf "
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
    g.nodes.append(helper.make_node("Mul", [h, h], ["m"]))  # data times data: not affine
    path = save(g.model([("x", (1, 4))], ["m"]), tmp_path / "mul.onnx")
    res = run("inspect", "--model", path)
    assert res.exit_code == 2
    assert (f"{path}: Mul node #1: Mul of two data tensors is not affine" in error_line(res))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
