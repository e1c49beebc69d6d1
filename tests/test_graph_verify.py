"""`crown verify` on graph networks (crown_cli.verification.graph_verifier): verdicts against
an exact MILP of the graph (ReLU, max pool) or sampling (tanh, sigmoid, softplus, ELU); every
sat verdict's counterexample re-checked by a float64 forward pass and by onnx.reference;
Graph.vjp against finite differences; several input tensors, one output, the CLI."""
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from conftest import slow_if
from crown_cli.cli import cli
from crown_cli.engine.graph_bounds import graph_bounds
from crown_cli.engine.input_sets import Box
from crown_cli.graph.network import Graph
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.io.networks import load_network
from crown_cli.io.vnnlib import parse_vnnlib_text
from crown_cli.network import MLP
from crown_cli.verification.bab.graph_bounder import exact_when_split
from crown_cli.verification.graph_verifier import (NO_BAB, GraphVerifier, graph_box_lower_bounds,
                                                   graph_counterexample)
from crown_cli.verification.outcome import violations_of
from graph_models import BUILDERS, G, dense_chain
from graph_oracles import graph_min, onnx_outputs


def save(tmp_path, name, model):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(model, path)
    return path


def model_and_graph(tmp_path, kind, seed=0):
    model = BUILDERS[kind](np.random.default_rng(seed))
    return model, load_graph(save(tmp_path, kind, model))


def input_shapes(model):
    return [tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in model.graph.input]


def spec(lo, hi, n_out, rows):
    """VNN-LIB: x in [lo, hi] and every (coefs, b) of ``rows``: coefs . Y <= b is unsafe."""
    out = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    out += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    for i, (a, z) in enumerate(zip(lo, hi)):
        out += [f"(assert (>= X_{i} {float(a)!r}))", f"(assert (<= X_{i} {float(z)!r}))"]
    for coefs, b in rows:
        terms = " ".join(f"(* {float(c)!r} Y_{j})" for j, c in enumerate(coefs) if c != 0)
        out.append(f"(assert (<= (+ {terms}) {float(b)!r}))")
    return "\n".join(out) + "\n"


def decide(graph, lo, hi, row, b, timeout=20.0, **options):
    prop = parse_vnnlib_text(spec(lo, hi, graph.output_size, [(row, b)]), "p",
                             graph.input_size, graph.output_size)
    options.setdefault("attack_restarts", 32)
    options.setdefault("attack_steps", 40)
    return GraphVerifier(graph, **options).verify(prop, timeout)


def check_counterexample(model, graph, lo, hi, row, b, v):
    """A sat verdict's x: inside the box, violating by a float64 forward pass, and the ONNX
    model itself (onnx.reference, float32) agrees within float32 rounding. The parsed box is
    the decimal box widened by one ulp where a literal is not a float (crown_cli.io.vnnlib)."""
    assert v.x is not None and v.x.shape == lo.shape
    lo, hi = np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf)
    assert np.all(v.x >= lo) and np.all(v.x <= hi)
    y = graph.forward(v.x)
    assert row @ y <= b
    assert violations_of(graph.forward, lo, hi, row[None], np.array([b]), v.x)[0]
    np.testing.assert_array_equal(v.y, y)
    ref = onnx_outputs(model, v.x, input_shapes(model))
    np.testing.assert_allclose(ref, y, rtol=1e-4, atol=1e-4)


def test_vjp_matches_finite_differences(tmp_path):
    # every graph but the one with Floor, whose vjp is the attacks' surrogate (the identity)
    for kind in sorted(set(BUILDERS) - {"floors"}):
        _, g = model_and_graph(tmp_path, kind)
        rng = np.random.default_rng(1)
        X = rng.uniform(-1, 1, (2, g.input_size))
        Gy = rng.normal(size=(2, g.output_size))
        _, vals = g.forward(X, return_all=True)
        dx = g.vjp(vals, Gy)
        h, num = 1e-6, np.zeros_like(dx)
        for i in range(g.input_size):
            e = np.zeros(g.input_size)
            e[i] = h
            num[:, i] = ((g.forward(X + e) - g.forward(X - e)) * Gy).sum(axis=1) / (2 * h)
        np.testing.assert_allclose(dx, num, atol=1e-6 * (1 + np.abs(num).max()), err_msg=kind)


@pytest.mark.parametrize("kind", ["conv", slow_if(True, "conv_maxpool"), "normalised", "dense"])
def test_verdicts_agree_with_milp(tmp_path, kind):
    """Per model: the exact minimum m of a random output row over a box (MILP); b far below
    m (by twice the range over the box) is unsat and must be proven; b just below m (1e-6
    relative) must be proven by branch and bound on graphs of ReLUs without max pools, and
    must not be sat on the others, where b 1e-3 of the range below m must be proven (max
    pools searched as trees of ReLUs); b above m (a violating region exists) must be sat with a
    confirmed counterexample, never unsat."""
    model, g = model_and_graph(tmp_path, kind, seed=3)
    assert all(n.kind != "activation" or n.op.name == "relu" for n in g.nodes)
    rng = np.random.default_rng(4)
    x0 = rng.uniform(-1, 1, g.input_size)
    eps = 0.02 if kind != "dense" else 0.1
    lo, hi = x0 - eps, x0 + eps
    row = rng.normal(size=g.output_size)
    m, xm = graph_min(g, lo, hi, row)
    assert row @ g.forward(xm) == pytest.approx(m, abs=1e-6 * (1 + abs(m)))
    spread = float(row @ g.forward(x0)) - m
    assert spread > 0
    v = decide(g, lo, hi, row, m - 2.0 * spread)  # the max pool's upper line is loose
    assert v.result == "unsat", (kind, v)
    if exact_when_split(g):  # ReLU splitting is complete there: just true is proven
        v = decide(g, lo, hi, row, m - 1e-6 * (1 + abs(m)))
        assert v.result == "unsat", (kind, v)
    else:  # max pools are searched as trees of ReLUs: complete, but at 1e-6 below the
        # minimum (ties in a window at the minimiser) it may take longer than a short run
        v = decide(g, lo, hi, row, m - 1e-6 * (1 + abs(m)), timeout=3.0)
        assert v.result in ("unsat", "timeout"), (kind, v)
        v = decide(g, lo, hi, row, m - 1e-3 * spread)  # ended unknown before the rewrite
        assert v.result == "unsat", (kind, v)
    b = m + 0.3 * spread
    v = decide(g, lo, hi, row, b)
    assert v.result == "sat", (kind, v)
    check_counterexample(model, g, lo, hi, row, b, v)


@pytest.mark.parametrize("kind", ["residual", "two_inputs", "conv_tanh", "shapes", "broadcast"])
def test_smooth_graphs_against_sampling(tmp_path, kind):
    """Graphs the MILP cannot encode: b at the 5% quantile of sampled values is truly
    violated (sat, confirmed; never unsat); b far below the sampled minimum by more than
    the sampled range is proven unsat, and every unsat agrees with the samples."""
    model, g = model_and_graph(tmp_path, kind, seed=5)
    rng = np.random.default_rng(6)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.05, x0 + 0.05
    row = rng.normal(size=g.output_size)
    X = lo + rng.uniform(size=(4000, g.input_size)) * (hi - lo)
    X[:500] = np.where(rng.integers(0, 2, size=(500, g.input_size)) == 1, hi, lo)
    vals = g.forward(X) @ row
    b = float(np.quantile(vals, 0.05))
    v = decide(g, lo, hi, row, b)
    assert v.result == "sat", (kind, v)
    check_counterexample(model, g, lo, hi, row, b, v)
    b = float(vals.min() - (vals.max() - vals.min()) - 1e-3)
    v = decide(g, lo, hi, row, b)
    assert v.result == "unsat", (kind, v)
    assert np.all(vals > b)


def test_disjunction_and_multiple_boxes(tmp_path):
    """Two cases on one box (mnistfc style, one row each): unsat needs both proven; a
    violating case is found and named."""
    model, g = model_and_graph(tmp_path, "conv_maxpool", seed=7)
    rng = np.random.default_rng(8)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.01, x0 + 0.01
    y0 = g.forward(x0)
    c = int(np.argmax(y0))
    ors = " ".join(f"(and (>= Y_{j} Y_{c}))" for j in range(g.output_size) if j != c)
    head = spec(lo, hi, g.output_size, [])
    prop = parse_vnnlib_text(head + f"(assert (or {ors}))\n", "p", g.input_size, g.output_size)
    v = GraphVerifier(g, attack_restarts=16, attack_steps=20).verify(prop, 20.0)
    samples = g.forward(lo + rng.uniform(size=(2000, g.input_size)) * (hi - lo))
    if v.result == "unsat":
        assert np.all(np.argmax(samples, axis=1) == c)
        assert v.cases_proven == v.cases == g.output_size - 1
    # the other way round: some class other than the runner-up... unsafe when Y_c is the max
    others = [j for j in range(g.output_size) if j != c]
    ors = " ".join(f"(and (>= Y_{c} Y_{j}))" for j in others)
    prop = parse_vnnlib_text(head + f"(assert (or {ors}))\n", "p", g.input_size, g.output_size)
    v = GraphVerifier(g, attack_restarts=16, attack_steps=20).verify(prop, 20.0)
    assert v.result == "sat"
    y = g.forward(v.x)
    assert y[c] >= y[others[v.case]]


def test_attack_finds_only_true_violations(tmp_path):
    """graph_counterexample on a case no point satisfies returns None; on one that x0
    satisfies returns a point the float64 forward pass confirms."""
    _, g = model_and_graph(tmp_path, "conv", seed=9)
    rng = np.random.default_rng(10)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.05, x0 + 0.05
    y0 = g.forward(x0)
    A = np.eye(g.output_size)[:1]
    assert graph_counterexample(g, lo, hi, [(A, np.array([-1e9]))], restarts=8, steps=10) is None
    j, x = graph_counterexample(g, lo, hi, [(A, np.array([y0[0] + 1e-9]))], restarts=8, steps=10)
    assert j == 0 and g.forward(x)[0] <= y0[0] + 1e-9 and np.all((x >= lo) & (x <= hi))


def one_output_graph(rng):
    """A residual ReLU network with a single output (a regression network)."""
    g = G(rng)
    h = g.op("Relu", [g.op("Gemm", ["x", g.rand(5, 3), g.rand(5)], transB=1)])
    r = g.op("Relu", [g.op("Add", [g.op("MatMul", [h, g.rand(5, 5)]), h])])
    y = g.op("Gemm", [r, g.rand(1, 5), g.rand(1)], transB=1)
    return g.model([("x", (1, 3))], [y])


def test_one_output_networks_verify(tmp_path):
    """verify takes one-output networks, a graph and a dense chain (the MLP loader's
    '>= 2 classes' rule is for certify)."""
    from graph_models import dense_chain

    chain = save(tmp_path, "chain1", dense_chain(np.random.default_rng(0), sizes=(3, 6, 1)))
    res = save(tmp_path, "res1", one_output_graph(np.random.default_rng(0)))
    assert isinstance(load_network(chain, min_outputs=1).dense, MLP)
    assert isinstance(load_network(res, min_outputs=1), Graph)
    assert load_network(res, min_outputs=1).dense is None
    for path in (chain, res):
        net = load_network(path, min_outputs=1)
        y0 = net.forward(np.zeros(3)).reshape(-1)
        p = os.path.join(str(tmp_path), "p.vnnlib")
        with open(p, "w") as fh:  # unsafe: Y_0 <= y(0) + 0.1: x = 0 violates
            fh.write(spec(-np.ones(3), np.ones(3), 1, [([1.0], float(y0[0]) + 0.1)]))
        r = CliRunner().invoke(cli, ["verify", "--model", path, "--spec", p, "--timeout", "10",
                                     "-q"])
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith("sat\n")


def test_cli_graph_instances(tmp_path):
    """crown verify --instances on a graph: one unsat, one sat row (the counterexample
    re-checked), the note in the single-property summary line when unknown."""
    model, g = model_and_graph(tmp_path, "conv", seed=11)
    path = save(tmp_path, "conv", model)
    rng = np.random.default_rng(12)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.01, x0 + 0.01
    row = np.eye(g.output_size)[0] - np.eye(g.output_size)[1]
    v0 = float(row @ g.forward(x0))
    specs = {"unsat": v0 - 100.0, "sat": v0 + 1e-9}
    lines = []
    for name, b in specs.items():
        with open(os.path.join(str(tmp_path), f"{name}.vnnlib"), "w") as fh:
            fh.write(spec(lo, hi, g.output_size, [(row, b)]))
        lines.append(f"conv.onnx,{name}.vnnlib,20")
    lst = os.path.join(str(tmp_path), "list.csv")
    with open(lst, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    out = os.path.join(str(tmp_path), "rows.csv")
    r = CliRunner().invoke(cli, ["verify", "--instances", lst, "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    from crown_cli.io.results import read_rows

    rows = read_rows(out)
    assert [row_["verdict"] for row_ in rows] == ["unsat", "sat"]
    x = np.array([float(t) for t in rows[1]["counterexample"].split()])
    assert row @ g.forward(x) <= specs["sat"]
    assert np.all((x >= np.nextafter(lo, -1e9)) & (x <= np.nextafter(hi, 1e9)))
    # b just below the true minimum (MILP): proven by ReLU splitting (84 inputs)
    m, _ = graph_min(g, lo, hi, row)
    p = os.path.join(str(tmp_path), "tight.vnnlib")
    with open(p, "w") as fh:
        fh.write(spec(lo, hi, g.output_size, [(row, m - 1e-7 * (1 + abs(m)))]))
    r = CliRunner().invoke(cli, ["verify", "--model", path, "--spec", p, "--timeout", "20",
                                 "--attack-time", "0.2"])
    assert r.exit_code == 0, r.output
    assert r.stdout == "unsat\n"
    # tanh neurons and one ReLU node, 84 inputs: ReLU splitting splits the ReLU neurons
    # (the tanh ones keep CROWN's lines) and proves a b that the crown stage cannot
    model, g = model_and_graph(tmp_path, "conv_tanh", seed=11)
    path = save(tmp_path, "conv_tanh", model)
    lo, hi = x0 - 0.3, x0 + 0.3  # a wide box: the bounds are far from the minimum
    X = lo + rng.uniform(size=(2000, g.input_size)) * (hi - lo)
    low = float((g.forward(X) @ row).min())
    crown = float(graph_bounds(g, *Box(lo, hi).args(), C=row[None])[0][0])
    with open(p, "w") as fh:  # above CROWN's bound, well below the sampled minimum
        fh.write(spec(lo, hi, g.output_size, [(row, crown + 0.2 * (low - crown))]))
    r = CliRunner().invoke(cli, ["verify", "--model", path, "--spec", p, "--timeout", "5",
                                 "--attack-time", "0.2", "--stages", "crown"])
    assert r.exit_code == 0, r.output
    assert r.stdout == "unsat\n"
    assert "bab" in r.stderr


def test_graph_without_splittable_nodes_says_why_it_stays_open(tmp_path):
    """A graph of more than 64 inputs and no ReLU or S-shaped node (here softplus) has no
    branch and bound: an open case ends unknown, with the reason in the verdict's note."""
    from graph_models import dense_chain

    g = load_graph(save(tmp_path, "softplus70", dense_chain(np.random.default_rng(2),
                                                            (70, 8, 3), act="Softplus")))
    rng = np.random.default_rng(3)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.3, x0 + 0.3
    row = rng.normal(size=g.output_size)
    X = lo + rng.uniform(size=(2000, g.input_size)) * (hi - lo)
    low = float((g.forward(X) @ row).min())
    crown = float(graph_bounds(g, *Box(lo, hi).args(), C=row[None])[0][0])
    assert crown < low
    v = decide(g, lo, hi, row, crown + 0.2 * (low - crown), timeout=5.0, stages=("crown",))
    assert v.result == "unknown", v
    assert NO_BAB in v.note


def test_relu_splitting_bounds_each_box_once_per_graph(tmp_path, monkeypatch):
    """Three cases on one box of the max-pool graph, all left to branch and bound: one CROWN
    GraphBounds of the graph (the bound stage) and one of its ReLU-tree form (shared by the
    three ReLU-splitting searches), and the property is proven."""
    import dataclasses

    import crown_cli.engine.graph_bounds as gbm

    model, g = model_and_graph(tmp_path, "conv_maxpool", seed=3)
    rng = np.random.default_rng(4)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.02, x0 + 0.02
    cases = []
    for _ in range(3):
        row = rng.normal(size=g.output_size)
        b = graph_min(g, lo, hi, row)[0] - 1e-3
        cases += parse_vnnlib_text(spec(lo, hi, g.output_size, [(row, b)]), "p",
                                   g.input_size, g.output_size).cases
    prop = dataclasses.replace(parse_vnnlib_text(spec(lo, hi, g.output_size, [(row, b)]), "p",
                                                 g.input_size, g.output_size), cases=cases)
    built = []
    init = gbm.GraphBounds.__init__

    def counted(self, graph, *a, **k):
        if k.get("intermediate") != "interval":  # (the crown stage's quick first pass)
            built.append(graph)
        init(self, graph, *a, **k)

    monkeypatch.setattr(gbm.GraphBounds, "__init__", counted)
    # 60 s: proven in a few seconds, but with the numba kernels compiling beside another
    # test worker it took 20 s once
    v = GraphVerifier(g, stages=("crown",)).verify(prop, 60.0)
    assert v.result == "unsat" and v.stage == "bab", v
    assert len(built) == 2 and built[0] is g and built[1] is not g


def test_alpha_bounds_reuse_crowns_when_nothing_is_free(tmp_path):
    """The alpha-crown stage's bounds are CROWN's object itself when no activation reads a
    node with free slopes below it (one ReLU layer), and their own, tighter, otherwise."""
    from crown_cli.verification.graph_verifier import alpha_can_tighten

    # 40 inputs: more than graph_forward.FORWARD_MAX_INPUTS (whose graphs take forward
    # intermediate bounds and no alpha-CROWN ones)
    one = dense_chain(np.random.default_rng(0), sizes=(40, 8, 3))
    deep = dense_chain(np.random.default_rng(0), sizes=(40, 8, 8, 3))
    for model, reuse in ((one, True), (deep, False)):
        path = os.path.join(str(tmp_path), "m.onnx")
        onnx.save(model, path)
        v = GraphVerifier(load_graph(path))
        lo, hi = -np.ones(40) * 0.2, np.ones(40) * 0.2
        crown, alpha = v._box_bounds(lo, hi), v._box_bounds(lo, hi, alpha=True)
        assert alpha_can_tighten(crown) is not reuse
        assert (alpha is crown) is reuse
        assert v._box_bounds(lo, hi, alpha=True) is alpha  # cached


def test_alpha_intermediate_bounds_only_where_they_fit_before_the_deadline():
    """`_box_bounds(alpha=True)` builds alpha-CROWN's intermediate bounds when ALPHA_COST
    times the box's CROWN pass is left before the deadline (or there is none), and hands
    back CROWN's otherwise (the stage and the search's root then take those; vit's
    ibp_3_3_8 spent its whole 100 s there)."""
    import time

    from crown_cli.verification import graph_verifier as gv
    from test_graph_kernels import resnet

    g = resnet(np.random.default_rng(0))
    x0 = np.random.default_rng(1).uniform(0, 1, g.input_size)
    lo, hi = x0 - 0.05, x0 + 0.05
    v = GraphVerifier(g)
    crown = v._box_bounds(lo, hi)
    assert gv.alpha_can_tighten(crown)
    spent = v._crown_s[id(g)]
    assert spent > 0.0
    near = time.monotonic() + 0.5 * gv.ALPHA_COST * spent  # not enough time left
    assert v._box_bounds(lo, hi, alpha=True, deadline=near) is crown
    for deadline in (None, time.monotonic() + 600.0):
        w = GraphVerifier(g)
        w._box_bounds(lo, hi)
        gb = w._box_bounds(lo, hi, alpha=True, deadline=deadline)
        assert gb is not w._box_bounds(lo, hi)
        assert np.sum(gb.hi[g.output] - gb.lo[g.output]) <= \
            np.sum(crown.hi[g.output] - crown.lo[g.output])


@pytest.mark.parametrize("kind,quick", [("relu_residual", True), ("dense", False)])
def test_image_sized_graphs_attack_briefly_before_the_crown_stage(tmp_path, monkeypatch, kind,
                                                                  quick):
    """A graph of more inputs than input splitting takes (relu_residual: 70) opens with a
    quarter of the attack's starts, then the crown stage, then the other starts on the
    cases left open, then the other stages; a small one (dense: 5 inputs) keeps the whole
    attack first. An easy property ends at the crown stage after the short attack only."""
    _, g = model_and_graph(tmp_path, kind, 3)
    rng = np.random.default_rng(3)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.05, x0 + 0.05
    row = rng.normal(size=g.output_size)
    m, _ = graph_min(g, lo, hi, row)
    events = []
    real = GraphVerifier.box_lower_bounds

    def bounds(self, stage, *args, **kw):
        events.append(stage)
        return real(self, stage, *args, **kw)

    monkeypatch.setattr(GraphVerifier, "_box_attack",
                        lambda self, lo, hi, problems, restarts, seed, deadline:
                        events.append(("attack", restarts)))
    monkeypatch.setattr(GraphVerifier, "box_lower_bounds", bounds)
    v = decide(g, lo, hi, row, m - 10 * (1 + abs(m)), bab=False, attack_restarts=64)
    assert v.result == "unsat" and v.stage == "crown"
    assert events == ([("attack", 16), "crown"] if quick else [("attack", 64), "crown"])
    events.clear()
    # b between the crown stage's bound and the exact minimum: every stage runs
    low = float(graph_box_lower_bounds(g, lo, hi, row[None], np.zeros(1))[0])
    decide(g, lo, hi, row, low + 0.2 * (m - low), bab=False, attack_restarts=64)
    head = events[:4]
    assert head == ([("attack", 16), "crown", ("attack", 48), "alpha-crown"] if quick else
                    [("attack", 64), "crown", "alpha-crown", ("attack", 64)])
