"""alpha-CROWN's tangent points on graphs (crown_cli.engine.graph_alpha.Tangents): tanh,
sigmoid and arctan nodes' lines move along the function. The float64 lines are valid on every
neuron's interval whatever the variables, the steering gradient is the derivative of the
steering bound, and the optimised bound lies between CROWN's and sampled values of the
network (and moves)."""
import os

import numpy as np
import onnx
import pytest

from crown_cli.engine.graph_alpha import Tangents, _relaxed_forward, _minimiser, alpha_lower, \
    free_tangents
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.graph.onnx_graph import load_graph
from graph_models import BUILDERS, dense_chain

ACTS = {"Tanh": np.tanh, "Sigmoid": lambda t: 0.5 * (1.0 + np.tanh(0.5 * t)), "Atan": np.arctan}


def _graph(tmp_path, act, seed, sizes=(5, 9, 8, 3)):
    path = os.path.join(str(tmp_path), f"{act}{seed}.onnx")
    onnx.save(dense_chain(np.random.default_rng(seed), sizes=sizes, act=act), path)
    return load_graph(path)


def _bounds(g, seed, eps):
    x0 = np.random.default_rng(seed).uniform(-1.0, 1.0, g.input_size)
    return x0, GraphBounds(g, *Box(x0 - eps, x0 + eps).args())


@pytest.mark.parametrize("act", sorted(ACTS))
def test_float64_tangent_lines_bound_the_function_at_any_variables(tmp_path, act):
    g = _graph(tmp_path, act, 1)
    _, gb = _bounds(g, 1, 0.8)
    tangents = free_tangents(gb)
    assert len(tangents) == 2, "both S-shaped layers have free lines"
    rng = np.random.default_rng(2)
    for i, t in tangents.items():
        theta = rng.uniform(0.0, 1.0, (5, t.cols.size))
        theta[0] = 0.0  # the ends of the ranges
        theta[1] = 1.0
        ln = t.lines(theta, sound=True)
        assert ln.lower.dtype == np.float64
        f = ACTS[act]
        l, u = gb.lo[g.nodes[i].inputs[0]], gb.hi[g.nodes[i].inputs[0]]
        for j in range(l.size):  # every neuron: CROWN's lines where no side is free
            z = np.linspace(l[j], u[j], 2001)
            fz = f(z)
            tol = 4e-16 * (1.0 + np.abs(fz))  # np's own rounding of f
            for q in range(5):
                assert np.all(ln.lower[q, j] * z + ln.lower_icpt[q, j] <= fz + tol), (i, j, q)
                assert np.all(ln.upper[q, j] * z + ln.upper_icpt[q, j] >= fz - tol), (i, j, q)


@pytest.mark.parametrize("act", sorted(ACTS))
def test_tangent_gradient_is_the_steering_bounds_derivative(tmp_path, act):
    """d bound / d theta from the tape and the relaxed forward pass (float64 steering
    pass) against central differences of the same bound."""
    g = _graph(tmp_path, act, 3)
    _, gb = _bounds(g, 3, 0.5)
    tangents = free_tangents(gb)
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((2, g.output_size))
    # away from theta = 1/2, where the map onto the range has a kink
    theta = {i: rng.choice([0.2, 0.35, 0.65, 0.8], (2, t.cols.size)) for i, t in
             tangents.items()}

    def bound(th, tape=None):
        lines = {i: t.lines(th[i], sound=False) for i, t in tangents.items()}
        return gb.lower(g.output, rows, lines=lines, tape=tape, steer=np.float64)

    tape = {}
    base = bound(theta, tape)
    x = _minimiser(gb, tape.pop("Lx"))
    vals = _relaxed_forward(gb, g.output, x, tape)
    checked = 0
    for i, t in tangents.items():
        grad = t.gradient(tape[i][0], tape[i][1], vals[g.nodes[i].inputs[0]], theta[i])
        for k in range(t.cols.size):
            h = 1e-6
            up = {j: v.copy() for j, v in theta.items()}
            dn = {j: v.copy() for j, v in theta.items()}
            up[i][:, k] += h
            dn[i][:, k] -= h
            fd = (bound(up) - bound(dn)) / (2 * h)
            assert np.allclose(grad[:, k], fd, rtol=1e-4, atol=1e-6 * (1 + np.abs(base))), \
                (i, k, grad[:, k], fd)
            checked += int(np.any(np.abs(fd) > 1e-6))
    assert checked >= 3, "the bound barely depends on the variables: the test shows nothing"


@pytest.mark.parametrize("kind,act,eps", [("dense", "Tanh", 0.6), ("dense", "Sigmoid", 1.0),
                                          ("dense", "Atan", 0.6), ("conv_tanh", None, 0.3)])
def test_tangent_alpha_lies_between_crown_and_the_network(tmp_path, kind, act, eps):
    if kind == "dense":
        g = _graph(tmp_path, act, 5, sizes=(4, 12, 10, 3))
    else:
        path = os.path.join(str(tmp_path), "conv_tanh.onnx")
        onnx.save(BUILDERS[kind](np.random.default_rng(0)), path)
        g = load_graph(path)
    x0, gb = _bounds(g, 5, eps)
    assert free_tangents(gb)
    rng = np.random.default_rng(6)
    rows = rng.standard_normal((4, g.output_size))
    crown = gb.lower(g.output, rows)
    alpha = alpha_lower(gb, g.output, rows, iters=30)
    assert np.all(alpha >= crown)
    X = rng.uniform(x0 - eps, x0 + eps, (20000, g.input_size))
    if g.input_size <= 10:  # every corner of the box among the samples
        corners = np.array(np.meshgrid(*[[-1.0, 1.0]] * g.input_size)).reshape(g.input_size, -1).T
        X[:corners.shape[0]] = x0 + eps * corners
    sampled = (g.forward(X) @ rows.T).min(axis=0)
    assert np.all(alpha <= sampled + 1e-9), (alpha, sampled)
    assert np.any(alpha > crown + 1e-4 * (1.0 + np.abs(crown))), "alpha never moved"


def test_intermediate_alpha_takes_tangents_and_stays_sound(tmp_path):
    """GraphBounds(intermediate="alpha") tightens an S-shaped network's intermediate
    bounds with tangents (before, only ReLU-type nodes had free lines: the same bounds as
    CROWN's); each stays within the sampled range. (Not each tighter than CROWN's: the
    lines of a later node follow its own interval, and CROWN is not monotone in those.)"""
    g = _graph(tmp_path, "Tanh", 7, sizes=(4, 12, 10, 8, 3))
    x0 = np.random.default_rng(7).uniform(-1.0, 1.0, g.input_size)
    box = Box(x0 - 0.7, x0 + 0.7)
    crown = GraphBounds(g, *box.args())
    alpha = GraphBounds(g, *box.args(), intermediate="alpha")
    X = np.random.default_rng(8).uniform(box.lo, box.hi, (20000, g.input_size))
    _, vals = g.forward(X, return_all=True)
    moved = 0
    for i, node in enumerate(g.nodes):
        if alpha.lo[i] is None:
            continue
        v = np.asarray(vals[i]).reshape(X.shape[0], -1)
        assert np.all(alpha.lo[i] <= v.min(axis=0) + 1e-9) and \
            np.all(alpha.hi[i] >= v.max(axis=0) - 1e-9)
        moved += int(np.sum(alpha.lo[i] > crown.lo[i] + 1e-6))
    assert moved, "no intermediate bound moved"
    # the second layer: the same intervals below it in both (the first layer's are exact)
    second = [i for i in range(len(g.nodes)) if g.nodes[i].kind == "activation"][1]
    p = g.nodes[second].inputs[0]
    assert np.all(alpha.lo[p] >= crown.lo[p]) and np.all(alpha.hi[p] <= crown.hi[p])
    assert np.any(alpha.lo[p] > crown.lo[p] + 1e-6)


def test_intermediate_alpha_skips_neurons_whose_lines_are_already_close(tmp_path, monkeypatch):
    """Intermediate alpha-CROWN on a node read by tanh optimises only the neurons whose tanh
    lines lie ALPHA_GAP_MIN apart or more somewhere on their interval (GraphBounds._loose):
    the others keep CROWN's bounds, the bounds stay sound, and with the threshold 0 every
    neuron is optimised (the rows handed to alpha_lower counted)."""
    import crown_cli.engine.graph_alpha as graph_alpha
    import crown_cli.engine.graph_bounds as graph_bounds
    from crown_cli.engine.node_rules import activation_interval, line_gap

    g = _graph(tmp_path, "Tanh", 7, sizes=(4, 12, 10, 8, 3))
    x0 = np.random.default_rng(7).uniform(-1.0, 1.0, g.input_size)
    box = Box(x0 - 0.15, x0 + 0.15)  # the second layer's gaps 0.003-0.06
    rows = []
    alpha_lower = graph_alpha.alpha_lower

    def spy(gb, p, Lam, *args, **kw):
        rows.append((p, np.flatnonzero(np.abs(Lam).sum(axis=0))))
        return alpha_lower(gb, p, Lam, *args, **kw)

    monkeypatch.setattr(graph_alpha, "alpha_lower", spy)
    crown = GraphBounds(g, *box.args())
    alpha = GraphBounds(g, *box.args(), intermediate="alpha")
    X = np.random.default_rng(8).uniform(box.lo, box.hi, (20000, g.input_size))
    _, vals = g.forward(X, return_all=True)
    second = [i for i in range(len(g.nodes)) if g.nodes[i].kind == "activation"][1]
    p = g.nodes[second].inputs[0]
    lines, _, _ = activation_interval(g.nodes[second].op, "crown", crown.lo[p], crown.hi[p],
                                      crown.absval[p])
    gap = line_gap(crown.lo[p], crown.hi[p], *lines)
    close = gap < graph_bounds.ALPHA_GAP_MIN
    assert close.any() and (~close).any()  # the case has both kinds
    took = np.concatenate([r for q, r in rows if q == p])
    assert set(took.tolist()) == set(np.flatnonzero(~close).tolist())
    assert np.array_equal(alpha.lo[p][close], crown.lo[p][close])
    assert np.array_equal(alpha.hi[p][close], crown.hi[p][close])
    for i in range(len(g.nodes)):
        if alpha.lo[i] is not None:
            v = np.asarray(vals[i]).reshape(X.shape[0], -1)
            assert np.all(alpha.lo[i] <= v.min(axis=0) + 1e-9)
            assert np.all(alpha.hi[i] >= v.max(axis=0) - 1e-9)
    rows.clear()
    monkeypatch.setattr(graph_bounds, "ALPHA_GAP_MIN", 0.0)
    GraphBounds(g, *box.args(), intermediate="alpha")
    assert set(np.concatenate([r for q, r in rows if q == p]).tolist()) == set(range(gap.size))


def test_tangents_are_not_offered_where_no_line_is_free(tmp_path):
    g = _graph(tmp_path, "Tanh", 9)
    x0 = np.random.default_rng(9).uniform(-1.0, 1.0, g.input_size)
    gb = GraphBounds(g, *Box(x0, x0).args())  # a point: every interval degenerate
    assert free_tangents(gb) == {}
    t = free_tangents(_bounds(g, 9, 0.5)[1])
    assert all(isinstance(v, Tangents) and v.cols.size for v in t.values())
