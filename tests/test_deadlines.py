"""Deadlines inside the graph engine: a bound given a deadline stops at its next node past it
(crown_cli/engine/deadline.py), and `crown verify`'s graph verifier ends within its timeout
plus a small margin where its stages once ran on (alpha-CROWN's intermediate bounds of a
residual conv net: minutes)."""
import time

import numpy as np
import pytest

from crown_cli.engine.deadline import DeadlineExceeded
from crown_cli.engine.graph_alpha import alpha_lower
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from test_graph_kernels import resnet


def test_graph_bounds_stop_past_their_deadline():
    g = resnet(np.random.default_rng(0))
    x0 = np.random.default_rng(1).uniform(0, 1, g.input_size)
    with pytest.raises(DeadlineExceeded):
        GraphBounds(g, x0, 0.05, 0, deadline=time.monotonic() - 1.0)
    gb = GraphBounds(g, x0, 0.05, 0, deadline=time.monotonic() + 600.0)
    row = np.eye(g.output_size)[:1]
    assert np.isfinite(gb.lower(g.output, row)).all()
    gb.deadline = time.monotonic() - 1.0  # later passes (a search's domains) check it too
    with pytest.raises(DeadlineExceeded):
        gb.lower(g.output, row)
    with pytest.raises(DeadlineExceeded):
        alpha_lower(gb, g.output, row)


@pytest.mark.parametrize("timeout", [2.0, 4.0])
def test_graph_verify_ends_at_its_timeout(timeout):
    """A CIFAR-sized residual net and a box nothing proves: the attack, CROWN and the
    alpha-CROWN stage (whose intermediate bounds alone took minutes here before they
    checked the deadline) end in `timeout` within 1.5 s of it."""
    from crown_cli.io.vnnlib import parse_vnnlib_text
    from crown_cli.verification.graph_verifier import GraphVerifier
    from test_graph_verify import spec

    g = resnet(np.random.default_rng(3), c=8, s=32)
    x0 = np.random.default_rng(4).uniform(0, 1, g.input_size)
    lo, hi = x0 - 0.02, x0 + 0.02
    y = g.forward(x0[None])[0]
    c, t = int(np.argmax(y)), int(np.argsort(y)[-2])
    row = np.zeros(g.output_size)
    row[c], row[t] = 1.0, -1.0
    # unsafe: the margin at most b, between CROWN's bound and the least sampled margin (a
    # fifth of the way up): CROWN does not prove it, the attack does not reach it
    crown = GraphBounds(g, *Box(lo, hi).args()).lower(g.output, row[None])[0]
    rng = np.random.default_rng(5)
    samples = g.forward(np.where(rng.uniform(size=(256, g.input_size)) < 0.5, lo, hi)) @ row
    b = crown + 0.2 * (samples.min() - crown)
    prop = parse_vnnlib_text(spec(lo, hi, g.output_size, [(row, b)]), "p", g.input_size,
                             g.output_size)
    t0 = time.monotonic()
    v = GraphVerifier(g, attack_restarts=4, attack_steps=5).verify(prop, timeout)
    elapsed = time.monotonic() - t0
    assert v.result == "timeout", v
    assert elapsed <= timeout + 1.5, elapsed


def test_dense_alpha_stage_stops_past_its_deadline():
    """The MLP verifier's alpha-crown stage checks the deadline before each optimisation
    step: past it every row is -inf (not proven), before it the rows are proven as usual."""
    from crown_cli.verification.pipeline import Verifier
    from oracles import random_mlp

    ws, bs = random_mlp([8, 30, 30, 3], 4)
    v = Verifier(ws, bs, "relu")
    lo, hi = -0.01 * np.ones(8), 0.01 * np.ones(8)
    y0 = v.outputs(np.zeros((1, 8)))[0]
    A = -np.eye(3)[:1]
    b = np.array([-y0[0] - 10.0])  # unsafe: y_0 >= y0_0 + 10, far outside the reach
    assert v.box_lower_bounds("alpha-crown", lo, hi, A, b, time.monotonic() + 600.0)[0] > 0.0
    got = v.box_lower_bounds("alpha-crown", lo, hi, A, b, time.monotonic() - 1.0)
    assert got[0] == -np.inf
