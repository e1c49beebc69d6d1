"""Deadlines inside the graph engine: a bound given a deadline stops at its next node past it
(crown_cli/engine/deadline.py), and `crown verify`'s graph verifier ends within its timeout
plus a small margin where its stages once ran on (alpha-CROWN's intermediate bounds of a
residual conv net: minutes)."""
import time

import numpy as np
import pytest

from conftest import slow_if
from crown_cli.engine.deadline import DeadlineExceeded
from crown_cli.engine.graph_alpha import alpha_lower
from crown_cli.engine.graph_bounds import GraphBounds
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


def unsafe_property(v, width=0.02, up=0.2):
    """A box and a margin row of the verifier ``v``'s network that nothing proves or attacks
    quickly: the margin at most b, between CROWN's bound and the least sampled margin
    (``up`` of the way up)."""
    from crown_cli.io.vnnlib import parse_vnnlib_text
    from test_graph_verify import spec

    n, m = v.n_inputs, v.n_outputs
    x0 = np.random.default_rng(4).uniform(0, 1, n)
    lo, hi = x0 - width, x0 + width
    y = v.outputs(x0[None])[0]
    c, t = int(np.argmax(y)), int(np.argsort(y)[-2])
    row = np.zeros(m)
    row[c], row[t] = 1.0, -1.0
    crown = v.box_lower_bounds("crown", lo, hi, row[None], np.zeros(1))[0]
    rng = np.random.default_rng(5)
    samples = v.outputs(np.where(rng.uniform(size=(256, n)) < 0.5, lo, hi)) @ row
    b = crown + up * (samples.min() - crown)
    return parse_vnnlib_text(spec(lo, hi, m, [(row, b)]), "p", n, m)


@pytest.mark.parametrize("timeout", [2.0, slow_if(True, 4.0)])
def test_graph_verify_ends_at_its_timeout(timeout):
    """A CIFAR-sized residual net and a box nothing proves: the attack, CROWN and the
    alpha-CROWN stage (whose intermediate bounds alone took minutes here before they
    checked the deadline) end in `timeout` within 1.5 s of it. The kernels are loaded
    first, as `crown verify` does before an instance's clock starts (on a cold numba cache
    their compilation alone ran 1.7 s past this deadline). The property's b half way up:
    at a fifth, branch and bound proved it in 7 domains within 1.2 s in one fresh-clone run
    (idle machine); half way, 869 domains were still open after 20 s."""
    from crown_cli.verification.graph_verifier import GraphVerifier
    from crown_cli.verification.runner import warm_up

    verifier = GraphVerifier(resnet(np.random.default_rng(3), c=8, s=32), attack_restarts=4,
                             attack_steps=5)
    prop = unsafe_property(verifier, up=0.5)
    warm_up(verifier)
    t0 = time.monotonic()
    v = verifier.verify(prop, timeout)
    elapsed = time.monotonic() - t0
    assert v.result == "timeout", v
    assert elapsed <= timeout + 1.5, elapsed


WARM_CHECK = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from crown_cli.engine.kernels import graph_kernels
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.verification.graph_verifier import GraphVerifier
from crown_cli.verification.pipeline import Verifier
from crown_cli.verification.runner import warm_up
from graph_models import attention
from oracles import random_mlp
from test_deadlines import unsafe_property
from test_graph_kernels import resnet
import onnx

graph_kernels()
def dense(sizes, act="relu"):
    return Verifier(*random_mlp(sizes, 4), act, 0.1 if act == "leaky_relu" else None,
                    attack_restarts=4, attack_steps=5)
if {kind!r} == "graph":
    p = {path!r}
    onnx.save(attention(np.random.default_rng(0)), p)
    first = GraphVerifier(resnet(np.random.default_rng(0)))
    nets = [(GraphVerifier(g, attack_restarts=4, attack_steps=5), 0.02) for g in
            (resnet(np.random.default_rng(3), c=4, s=8), load_graph(p))]
else:
    first = dense([3, 7, 2], {act!r})
    nets = [(dense(s, {act!r}), 0.2) for s in ([8, 30, 30, 3], [6, 40, 3], [6, 20, 20, 20, 3],
                                              [70, 40, 40, 3])]
if {warm!r}:
    warm_up(first)
from crown_cli.engine.kernels import box_steps, dense_steps, graph_steps, hull, relu_split
mods = [box_steps, dense_steps, graph_steps, hull, relu_split]
def signatures(mods):
    return {{(getattr(m, "__name__", "SERIAL"), k): len(f.signatures) for m in mods
             for k, f in vars(m).items() if hasattr(f, "signatures")}}
before = signatures(mods)
for v, width in nets:
    print(v.verify(unsafe_property(v, width), 3.0).stage, file=sys.stderr)
after = signatures(mods)
new = [k for k in after if after[k] > before.get(k, 0)]
# what a forked helper runs: the serial twins, loaded by the warm-up (graphs: workers 2)
from crown_cli.engine.kernels import serial_kernels
before = signatures([graph_steps.SERIAL])
with serial_kernels():
    for v, width in nets:
        print(v.verify(unsafe_property(v, width), 3.0).stage, file=sys.stderr)
after = signatures([graph_steps.SERIAL])
print(sorted(new + [k for k in after if after[k] > before.get(k, 0)]))
"""


KINDS = [("graph", None), ("dense", "relu"), ("dense", "leaky_relu"), ("dense", "tanh")]


# in the default tier: graphs with and without the warm-up (the check finding late kernels),
# dense ReLU with it; the slow tier the rest
@pytest.mark.parametrize("kind,act,warm", [slow_if(a in ("leaky_relu", "tanh"), k, a, True)
                                           for k, a in KINDS] + [
    slow_if(k == "dense", k, a, False) for k, a in KINDS])
def test_warm_up_loads_every_kernel_a_verification_calls(tmp_path, kind, act, warm):
    """In a fresh process (numba's dispatchers empty, whatever its disk cache holds), after
    `warm_up` of a verifier, verifying other networks of its kind (graphs: a residual conv
    net and an attention graph; dense: one to three hidden layers, up to 70 inputs) with
    the attack, every stage and branch and bound calls no kernel signature not loaded yet,
    nor their serial twins (what a forked helper runs) when they run on those; without the
    warm-up they do (so the check can fail)."""
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    code = WARM_CHECK.format(tests=tests, path=str(tmp_path / "att.onnx"), kind=kind, act=act,
                             warm=warm)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    new = eval(out.stdout.strip().splitlines()[-1])
    assert (new == []) if warm else new, (new, out.stderr[-1000:])


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


def test_dense_alpha_steps_leave_time_for_the_verified_evaluation(monkeypatch):
    """AlphaBounds.optimise stops, without raising, where the next step (the longest so far,
    the first ``first_step``) would end later than ``reserve`` seconds before the deadline.
    On a clock that each evaluation moves by 100 s: 3 steps fit before base + 550 with 200 s
    reserved, 5 with none. The verifier's alpha-crown stage where not even its first step
    fits (the crown stage took 1000 s) is -inf without a step."""
    from crown_cli.engine import alpha_crown
    from crown_cli.engine.dense_crown import first_layer_center
    from crown_cli.verification.pipeline import Verifier
    from oracles import random_mlp

    ws, bs = random_mlp([8, 30, 30, 3], 4)
    v = Verifier(ws, bs, "relu")
    x0, eps = np.zeros(8), 0.05
    A = np.array([[1.0, -1.0, 0.0]])
    base = time.monotonic()
    clock = {"t": base}
    evaluate = alpha_crown.AlphaBounds.evaluate

    def slow_evaluate(self, *a, **k):
        clock["t"] += 100.0
        return evaluate(self, *a, **k)

    class FakeTime:
        @staticmethod
        def monotonic():
            return clock["t"]

    monkeypatch.setattr(alpha_crown.AlphaBounds, "evaluate", slow_evaluate)
    monkeypatch.setattr(alpha_crown, "time", FakeTime)
    for reserve, want in ((200.0, 3), (0.0, 5)):
        clock["t"] = base
        ab = alpha_crown.AlphaBounds(v.net, v.relax["alpha-crown"], 0.0, x0, 0, A,
                                     first_layer_center(v.net, x0))
        _, steps, _ = ab.optimise(eps, 50, 0.1, patience=50, tol=-1.0, deadline=base + 550.0,
                                  reserve=reserve, first_step=100.0)
        assert steps == want, (reserve, steps)
    monkeypatch.undo()
    v._crown_s = 1000.0
    lo, hi = -0.01 * np.ones(8), 0.01 * np.ones(8)
    t0 = time.monotonic()
    got = v.box_lower_bounds("alpha-crown", lo, hi, A, np.array([-100.0]), t0 + 600.0)
    assert got[0] == -np.inf and time.monotonic() - t0 < 60.0
