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
