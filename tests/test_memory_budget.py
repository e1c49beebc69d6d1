"""--memory-budget (GiB) on graph networks: the loaders refuse a weight over it, a graph whose
CROWN bound cannot fit is refused in one line before any bound is computed, and a smaller
budget only chunks the rows (the same bounds, the same radii)."""
from __future__ import annotations

import csv
import io

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import crown_cli
import keras_models as km
from crown_cli.cli import cli
from crown_cli.engine.graph_bounds import (ROW_BUDGET, ROW_PEAK, GraphBounds, fixed_bytes,
                                           least_bytes, row_budget_for, row_bytes)
from crown_cli.errors import InputError
from crown_cli.io.networks import load_network
from graph_models import conv_net

GiB = 2 ** 30


def run_cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def model(tmp_path):
    layers, inputs, outputs = km.mnist_conv(np.random.default_rng(0))
    path = tmp_path / "conv.h5"
    km.save_h5(path, layers, inputs, outputs)
    return str(path)


def test_the_default_budget_keeps_the_default_row_budget(model):
    g = load_network(model)
    assert g.row_budget == ROW_BUDGET == row_budget_for(g, 4 * GiB)
    assert row_budget_for(g, least_bytes(g) - ROW_PEAK) is None
    assert row_budget_for(g, fixed_bytes(g) + 3 * ROW_PEAK * row_bytes(g)) == 3 * row_bytes(g)


def test_small_row_budgets_give_the_same_bounds(model):
    g = load_network(model)
    x0 = crown_cli.load_images()[0][0]
    full = GraphBounds(g, x0, 0.02, 0)
    tight = GraphBounds(g, x0, 0.02, 0, row_budget=row_bytes(g))  # one neuron per pass
    for a, b in zip(full.lo + full.hi, tight.lo + tight.hi):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(full.bounds(), tight.bounds(), rtol=1e-12, atol=1e-12)


def _eps(res):
    assert res.exit_code == 0, res.output
    return [float(r["eps"]) for r in csv.DictReader(io.StringIO(res.output))]


def test_a_bound_stays_within_the_budget(model):
    """tracemalloc's peak of one bound (intermediate bounds included) within the budget."""
    import tracemalloc

    g = load_network(model)
    x0 = crown_cli.load_images()[0][0]
    GraphBounds(g, x0, 0.05, 0).bounds()  # numba's kernels loaded outside the trace (its
    # cache's 34 MB otherwise land in the first traced bound when this test runs first)
    for neurons in (1, 16):
        budget = fixed_bytes(g) + neurons * ROW_PEAK * row_bytes(g)
        g.row_budget = row_budget_for(g, budget)
        tracemalloc.start()
        GraphBounds(g, x0, 0.05, 0).bounds()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak <= budget, (neurons, peak, budget)


def test_certify_within_a_small_budget_gives_the_same_radius(model, tmp_path):
    g = load_network(model)
    budget = (fixed_bytes(g) + 2 * ROW_PEAK * row_bytes(g)) / GiB  # two neurons per pass
    assert load_network(model, memory_budget=budget).row_budget == 2 * row_bytes(g)
    x = crown_cli.load_images()[0][:1]  # labelled with the model's predictions: certified
    images = tmp_path / "imgs.npz"
    np.savez(images, x=x, y=np.argmax(g.forward(x), axis=1))
    args = ["certify", "--model", model, "--images", images, "-q"]
    default = _eps(run_cli(*args))
    small = _eps(run_cli(*args, "--memory-budget", budget))
    assert len(default) == 1 and min(default) > 0
    np.testing.assert_allclose(small, default, rtol=1e-9)


@pytest.mark.parametrize("command", ["certify", "verify", "inspect"])
def test_a_graph_over_the_budget_is_refused_in_one_line(model, tmp_path, command):
    g = load_network(model)
    budget = least_bytes(g) / GiB / 2
    args = [command, "--model", model, "--memory-budget", f"{budget:.6g}"]
    if command == "verify":
        spec = tmp_path / "p.vnnlib"
        spec.write_text("".join(f"(declare-const X_{i} Real)\n(assert (>= X_{i} 0.0))\n"
                                f"(assert (<= X_{i} 0.1))\n" for i in range(784))
                        + "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
                        + "(assert (<= Y_0 Y_1))\n")
        args += ["--spec", spec]
    res = run_cli(*args)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"crown: error: {model}: a CROWN bound of this graph needs at "
                               "least ")
    assert lines[0].endswith("GiB (--memory-budget)")
    res = run_cli(command, "--model", model, "--memory-budget", "-1")
    assert res.exit_code == 2 and "--memory-budget: must be > 0" in res.output


def test_verify_within_a_budget(model, tmp_path):
    x0 = crown_cli.load_images()[0][0]
    g = load_network(model)
    y = g.forward(x0)
    c = int(np.argmax(y))
    t = int(np.argsort(y)[-2])
    lines = [f"(declare-const X_{i} Real)" for i in range(784)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(10)]
    lines += [f"(assert (>= X_{i} {v - 1e-4!r}))\n(assert (<= X_{i} {v + 1e-4!r}))"
              for i, v in enumerate(map(float, x0))]
    lines.append(f"(assert (<= Y_{c} Y_{t}))")
    spec = tmp_path / "p.vnnlib"
    spec.write_text("\n".join(lines) + "\n")
    budget = (fixed_bytes(g) + 4 * ROW_PEAK * row_bytes(g)) / GiB
    for extra in ([], ["--memory-budget", budget]):
        res = run_cli("verify", "--model", model, "--spec", spec, "--timeout", 30, "-q", *extra)
        assert res.exit_code == 0, res.output
        assert res.output.splitlines()[0] == "unsat"


def test_the_onnx_loader_refuses_a_weight_over_the_budget(tmp_path):
    path = str(tmp_path / "conv.onnx")
    onnx.save(conv_net(np.random.default_rng(0)), path)
    with pytest.raises(InputError) as err:
        load_network(path, memory_budget=1e-8)
    msg = str(err.value)
    assert "its weights need" in msg and msg.endswith("budget of 1e-08 GiB (--memory-budget)")
    assert load_network(path, memory_budget=4.0).row_budget == ROW_BUDGET
    g = load_network(path, memory_budget=1.0)  # the pass peaks at ROW_PEAK x its rows
    assert g.row_budget == (GiB - fixed_bytes(g)) // ROW_PEAK
