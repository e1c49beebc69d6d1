"""Input-splitting branch and bound on graphs (crown_cli.verification.bab.graph_input_split):
verdicts against the MILP on a ReLU graph, against dense sampling on a branched graph of mixed
activations, and through GraphVerifier (where the bound stages alone leave a case open)."""
import os
import time

import numpy as np
import onnx
import pytest

from crown_cli.graph.onnx_graph import load_graph
from crown_cli.verification.bab.graph_input_split import graph_input_split
from graph_models import BUILDERS
from graph_oracles import graph_min


def graph_of(tmp_path, kind, seed):
    model = BUILDERS[kind](np.random.default_rng(seed))
    path = os.path.join(str(tmp_path), f"{kind}{seed}.onnx")
    onnx.save(model, path)
    return load_graph(path)


@pytest.mark.parametrize("seed", [0, 1])
def test_verdicts_against_milp(tmp_path, seed):
    g = graph_of(tmp_path, "dense", seed)
    rng = np.random.default_rng(10 + seed)
    lo = rng.uniform(-1.0, 0.0, g.input_size)
    hi = lo + 0.8
    row = rng.standard_normal(g.output_size)
    m, _ = graph_min(g, lo, hi, row)
    spread = float(row @ g.forward(0.5 * (lo + hi))) - m
    assert spread > 0
    deadline = time.monotonic() + 120
    res = graph_input_split(g, lo, hi, row[None], [m - 0.01 * spread], deadline)
    assert res.verdict == "unsat", res
    assert res.domains > 1  # the bounds alone do not prove it: splits were needed
    res = graph_input_split(g, lo, hi, row[None], [m + 0.01 * spread], deadline)
    assert res.verdict == "sat", res
    assert np.all(res.x >= lo) and np.all(res.x <= hi)
    assert row @ g.forward(res.x) <= m + 0.01 * spread


def sampled_case(tmp_path):
    """The branched graph of mixed activations, a box, a row, and the row's smallest value
    and spread over 400,000 samples of the box."""
    g = graph_of(tmp_path, "residual", 4)
    rng = np.random.default_rng(4)
    lo = rng.uniform(-1.0, 0.0, g.input_size)
    hi = lo + 1.0
    row = rng.standard_normal(g.output_size)
    v = g.forward(rng.uniform(lo, hi, (400_000, g.input_size))) @ row
    return g, lo, hi, row, float(v.min()), float(v.max() - v.min())


def test_mixed_activations_against_sampling(tmp_path):
    g, lo, hi, row, m, spread = sampled_case(tmp_path)
    deadline = time.monotonic() + 120
    res = graph_input_split(g, lo, hi, row[None], [m - 0.02 * spread], deadline)
    assert res.verdict == "unsat", res
    res = graph_input_split(g, lo, hi, row[None], [m + 0.02 * spread], deadline)
    assert res.verdict == "sat", res
    assert row @ g.forward(res.x) <= m + 0.02 * spread


def test_graph_verifier_splits_what_the_bounds_leave_open(tmp_path):
    """A property on a branched graph that the crown and alpha-crown stages leave open (and
    the attack cannot violate) is proven by the branch and bound; --no-bab leaves it open."""
    from crown_cli.io.vnnlib import parse_vnnlib_text
    from crown_cli.verification.graph_verifier import GraphVerifier
    from test_graph_verify import spec

    g, lo, hi, row, m, spread = sampled_case(tmp_path)
    b = m - 0.02 * spread
    prop = parse_vnnlib_text(spec(lo, hi, g.output_size, [(row, b)]), "p", g.input_size,
                             g.output_size)
    opts = dict(attack_restarts=8, attack_steps=20)
    off = GraphVerifier(g, bab=False, **opts).verify(prop, 60)
    assert off.result == "unknown"
    on = GraphVerifier(g, **opts).verify(prop, 60)
    assert on.result == "unsat" and on.stage == "bab" and on.domains > 1, on


# ---------------------------------------------------------------- two rows of a case combined


def _two_sided(tmp_path):
    """y = (x0 + relu(x1) - relu(x1), -x0) on [-1, 1]^2: a case y0 <= -1/4 and y1 <= -1/4
    (x0 <= -1/4 and x0 >= 1/4) is empty, but neither row alone is proven on the whole box."""
    from graph_models import G

    g = G(np.random.default_rng(0))
    r = g.op("Relu", [g.op("Gemm", ["x", g.const(np.array([[0.0, 1.0]])), g.const([0.0])],
                           transB=1)])
    y = g.op("Gemm", [g.op("Concat", ["x", r], axis=1),
                      g.const(np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])), g.const([0.0, 0.0])],
             transB=1)
    path = os.path.join(str(tmp_path), "two_sided.onnx")
    onnx.save(g.model([("x", (1, 2))], [y]), path)
    return load_graph(path)


@pytest.mark.parametrize("batched", ["at once", "one box a chunk", "box by box"])
def test_a_case_whose_two_rows_are_proven_together(tmp_path, monkeypatch, batched):
    """The two best rows of an open box combined (t y0 + (1 - t) y1 > t b0 + (1 - t) b1, in
    exact arithmetic) prove the root box; without the combination the search splits. On
    boxes bounded at once (ForwardBoxes; also in chunks of one box) and box by box
    (GraphBounds)."""
    from crown_cli.engine import graph_forward
    from crown_cli.verification.bab import graph_input_split as gis

    if batched == "box by box":
        monkeypatch.setattr(graph_forward, "prefer_forward", lambda graph: False)
    if batched == "one box a chunk":
        monkeypatch.setattr(gis, "BATCH_BYTES", 1)
    g = _two_sided(tmp_path)
    lo, hi, A, b = -np.ones(2), np.ones(2), np.eye(2), np.full(2, -0.25)
    res = graph_input_split(g, lo, hi, A, b, time.monotonic() + 60)
    assert res.verdict == "unsat" and res.domains == 1, res
    monkeypatch.setattr(gis, "pair_weights", lambda L, H, lb, Lam: (
        np.zeros(len(L)), np.zeros(len(L), np.int64), np.zeros(len(L), np.int64)))
    res = graph_input_split(g, lo, hi, A, b, time.monotonic() + 60)
    assert res.verdict == "unsat" and res.domains > 1, res
    # and where the case is not empty (x0 in [-1/4, 1/4] meets both rows), a point of it
    monkeypatch.undo()
    res = graph_input_split(g, lo, hi, A, np.full(2, 0.25), time.monotonic() + 60)
    assert res.verdict == "sat" and np.all(A @ g.forward(res.x[None])[0] <= 0.25), res


def test_combined_rows_prove_only_in_exact_arithmetic():
    """combination_row refuses weights whose floats are not the exact combination; the
    combined score is positive only when the bound exceeds the exact right-hand side."""
    from fractions import Fraction

    from crown_cli.verification.bab.graph_input_split import combination_row, combined_score

    A = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 2.0]])
    c = combination_row(A, 0.25, 0, 1)
    assert c is not None and np.array_equal(c, [0.25, 0.75, 1.25])
    assert combination_row(np.array([[0.1, 0.0], [0.3, 1.0]]), 21 / 64, 0, 1) is None
    b_up = np.array([1.0, 0.1])
    rhs = Fraction(1, 2) + Fraction(1, 2) * Fraction(0.1)  # 0.55000000000000000277...
    above, below = 0.55, np.nextafter(0.55, -np.inf)
    assert Fraction(above) > rhs > Fraction(below)
    assert combined_score(above, b_up, 0.5, 0, 1) > 0.0
    assert combined_score(below, b_up, 0.5, 0, 1) <= 0.0
    assert combined_score(-np.inf, b_up, 0.5, 0, 1) == -np.inf


def test_two_workers_share_the_wide_rounds_and_bound_the_same_boxes(tmp_path, monkeypatch):
    """A graph of few inputs (its boxes bounded at once, in wide rounds) with workers=2:
    rounds go half to a forked helper, each process on one thread, and the search bounds
    the same boxes to the same verdict as one process (each box's fate is its own)."""
    from crown_cli.verification.bab import graph_input_split as gis
    from crown_cli.verification.bab import input_split
    from graph_models import dense_chain

    shared, singles = [], []

    class Counting(input_split.Helper):
        def __init__(self, fn, single=False):
            singles.append(single)
            super().__init__(fn, single)

        def send(self, args):
            shared.append(args[0].shape[0])
            super().send(args)


    monkeypatch.setattr(input_split, "Helper", Counting)
    monkeypatch.setattr(input_split, "can_fork", lambda: True)  # also where one core is allowed
    path = os.path.join(str(tmp_path), "eight.onnx")
    onnx.save(dense_chain(np.random.default_rng(3), sizes=(8, 20, 20, 2)), path)
    g = load_graph(path)
    assert gis.at_once(g)
    rng = np.random.default_rng(10)
    lo = rng.uniform(-1.0, 0.0, g.input_size)
    hi = lo + 1.0
    row = rng.standard_normal(g.output_size)
    m, _ = graph_min(g, lo, hi, row)
    spread = float(row @ g.forward(0.5 * (lo + hi))) - m
    b = [m - 0.05 * spread]  # unsat after some 25k boxes
    one = graph_input_split(g, lo, hi, row[None], b, time.monotonic() + 300, workers=1)
    assert not shared
    two = graph_input_split(g, lo, hi, row[None], b, time.monotonic() + 300, workers=2)
    assert one.verdict == two.verdict == "unsat"
    assert two.domains == one.domains and two.splits == one.splits
    assert len(shared) > 3 and max(shared) >= input_split.PARALLEL_MIN // 2
    assert singles == [True]  # the helper on one thread (and this process for the round)
