"""alpha-CROWN's last stage on graphs (crown_cli.engine.graph_alpha): never below CROWN, never
above the exact minimum (MILP) on small graphs of each kind, equal to the LP of the triangle
relaxation (its optimum) on a one-hidden-layer chain, and sound under sampling on l_2 and
l_1 balls too."""
import os

import numpy as np
import onnx
import pytest
from scipy.optimize import linprog

from conftest import slow_if
from crown_cli.engine.graph_alpha import alpha_lower, free_slopes
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.graph.onnx_graph import load_graph
from graph_models import BUILDERS, dense_chain
from graph_oracles import graph_min


def graph_of(tmp_path, kind, seed):
    model = BUILDERS[kind](np.random.default_rng(seed))
    path = os.path.join(str(tmp_path), f"{kind}{seed}.onnx")
    onnx.save(model, path)
    return load_graph(path)


@pytest.mark.parametrize("kind,eps,seed", [("dense", 0.3, 1), ("dense", 0.3, 3),
                                           ("conv", 0.05, 0), slow_if(True, "conv", 0.05, 1),
                                           ("conv_maxpool", 0.05, 1)])
def test_between_crown_and_the_exact_minimum(tmp_path, kind, eps, seed):
    g = graph_of(tmp_path, kind, seed)
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(-1.0, 1.0, g.input_size)
    lo, hi = x0 - eps, x0 + eps
    gb = GraphBounds(g, *Box(lo, hi).args())
    assert free_slopes(gb), "no unstable ReLU: the test would show nothing"
    rows = rng.standard_normal((3, g.output_size))
    crown = gb.lower(g.output, rows)
    alpha = alpha_lower(gb, g.output, rows)
    assert np.all(alpha >= crown)
    for r, row in enumerate(rows):
        exact, _ = graph_min(g, lo, hi, row)
        assert alpha[r] <= exact + 1e-7 * (1 + abs(exact))
    assert np.any(alpha > crown + 1e-3 * (1 + np.abs(crown)))  # it does move


def _triangle_lp(W1, b1, W2, lo, hi, l, u, row):
    """min over [lo, hi] of row . (W2 relu(W1 x + b1)) under the triangle relaxation with
    pre-activation bounds [l, u]: the optimum of last-stage alpha-CROWN."""
    n, d = W1.shape
    m = row @ W2
    A_ub, b_ub, A_eq, b_eq, bounds = [], [], [], [], [(a, b) for a, b in zip(lo, hi)]
    for j in range(n):
        e = np.zeros(d + n)
        if l[j] >= 0:
            e[d + j], e[:d] = 1.0, -W1[j]
            A_eq.append(e)
            b_eq.append(b1[j])
            bounds.append((None, None))
        elif u[j] <= 0:
            bounds.append((0.0, 0.0))
        else:
            e[d + j], e[:d] = -1.0, W1[j]  # a >= z
            A_ub.append(e)
            b_ub.append(-b1[j])
            s = u[j] / (u[j] - l[j])
            e = np.zeros(d + n)
            e[d + j], e[:d] = 1.0, -s * W1[j]  # a <= s (z - l)
            A_ub.append(e)
            b_ub.append(s * (b1[j] - l[j]))
            bounds.append((0.0, None))
    res = linprog(np.r_[np.zeros(d), m], A_ub=np.array(A_ub), b_ub=b_ub,
                  A_eq=np.array(A_eq) if A_eq else None, b_eq=b_eq if A_eq else None,
                  bounds=bounds)
    assert res.status == 0
    return res.fun


def test_one_hidden_layer_reaches_the_lp(tmp_path):
    model = dense_chain(np.random.default_rng(5), sizes=(6, 24, 3))
    path = os.path.join(str(tmp_path), "one.onnx")
    onnx.save(model, path)
    g = load_graph(path)
    dense = [n for n in g.nodes if n.kind == "affine"]
    rng = np.random.default_rng(5)
    lo = rng.uniform(-1.0, 0.0, 6)
    hi = lo + 0.8
    gb = GraphBounds(g, *Box(lo, hi).args())
    assert sum(m.sum() for m, _ in free_slopes(gb).values()) >= 5
    act = [i for i, n in enumerate(g.nodes) if n.kind == "activation"][0]
    p = g.nodes[act].inputs[0]
    W1, b1 = _dense(dense[0])
    W2, b2 = _dense(dense[1])
    rows = rng.standard_normal((4, 3))
    alpha = alpha_lower(gb, g.output, rows, iters=200)
    for r, row in enumerate(rows):
        lp = _triangle_lp(W1, b1, W2, lo, hi, gb.lo[p], gb.hi[p], row) + row @ b2
        assert alpha[r] <= lp + 1e-7 * (1 + abs(lp))
        assert alpha[r] >= lp - 1e-3 * (1 + abs(lp))


def _dense(node):
    W = node.op.W
    return (W.toarray() if hasattr(W, "toarray") else W), node.op.bias


@pytest.mark.parametrize("qcode,norm", [(0, np.inf), (1, 2), (2, 1)])
def test_sound_on_balls_under_sampling(tmp_path, qcode, norm):
    g = graph_of(tmp_path, "residual", 3)
    rng = np.random.default_rng(7)
    x0 = rng.uniform(-0.5, 0.5, g.input_size)
    eps = {0: 0.1, 1: 0.6, 2: 1.5}[qcode]
    gb = GraphBounds(g, x0, eps, qcode)
    rows = rng.standard_normal((2, g.output_size))
    alpha = alpha_lower(gb, g.output, rows)
    assert np.all(alpha >= gb.lower(g.output, rows))
    d = g.input_size
    V = rng.standard_normal((20000, d))
    if qcode == 2:
        V = rng.laplace(size=(20000, d))
    V *= eps * rng.uniform(0, 1, (20000, 1)) / np.linalg.norm(V, ord=norm, axis=1)[:, None]
    Y = g.forward(x0 + V) @ rows.T
    assert np.all(Y.min(axis=0) >= alpha - 1e-9)


def _crown_alpha_gap(tmp_path):
    """A max-pool graph and a property whose threshold lies between CROWN's bound and alpha's
    (from the MILP test's case): (graph, its CROWN bounds on the box, the property)."""
    from crown_cli.io.vnnlib import parse_vnnlib_text
    from test_graph_verify import spec

    g = graph_of(tmp_path, "conv_maxpool", 1)
    rng = np.random.default_rng(1)
    x0 = rng.uniform(-1.0, 1.0, g.input_size)
    lo, hi = x0 - 0.05, x0 + 0.05
    row = rng.standard_normal((3, g.output_size))[0]
    gb = GraphBounds(g, *Box(lo, hi).args())
    crown = gb.lower(g.output, row[None])[0]
    alpha = alpha_lower(gb, g.output, row[None])[0]
    assert crown < alpha - 0.1
    b = 0.5 * (crown + alpha)  # row . y <= b is the unsafe set: empty, and only alpha sees it
    prop = parse_vnnlib_text(spec(lo, hi, g.output_size, [(row, b)]), "p", g.input_size,
                             g.output_size)
    return g, gb, prop


def test_verify_alpha_stage_proves_what_crown_cannot(tmp_path):
    """The crown stage leaves the gap's property open (without branch and bound), the
    alpha-crown stage proves it, and so does ReLU splitting after the crown stage."""
    from crown_cli.verification.graph_verifier import GraphVerifier

    g, _, prop = _crown_alpha_gap(tmp_path)
    v = GraphVerifier(g, stages=("crown",), attack_restarts=8, attack_steps=20,
                      bab=False).verify(prop, 60)
    assert v.result == "unknown"
    # ReLU splitting after the crown stage proves it too
    v = GraphVerifier(g, stages=("crown",), attack_restarts=8, attack_steps=20).verify(prop, 60)
    assert v.result == "unsat" and v.stage == "bab", v
    v = GraphVerifier(g, attack_restarts=8, attack_steps=20).verify(prop, 60)
    assert v.result == "unsat" and v.stage == "alpha-crown", v


@pytest.mark.slow  # slow tier since 2026-11-29
def test_certify_alpha_crown_on_a_residual_graph(tmp_path):
    """certify --method alpha-crown on a branched graph (not lowered): a radius at least
    CROWN's, and no sampled point inside it changes the decision."""
    from crown_cli.certification.graph_certifier import GraphCertifier

    g = graph_of(tmp_path, "residual", 2)
    rng = np.random.default_rng(2)
    for k in range(3):
        x0 = rng.uniform(-1.0, 1.0, g.input_size)
        c = int(np.argmax(g.forward(x0)))
        t = (c + 1) % g.output_size
        r_crown = GraphCertifier(g, method="crown").certify(x0, c, [t])
        r_alpha = GraphCertifier(g, method="alpha-crown").certify(x0, c, [t])
        assert r_alpha.eps >= r_crown.eps * (1 - 1e-3)
        X = x0 + rng.uniform(-1, 1, (20000, g.input_size)) * r_alpha.eps
        Y = g.forward(X)
        assert np.all(Y[:, c] > Y[:, t])


def test_simplex_ascent_stays_on_the_simplex_and_climbs():
    """A step keeps each window's weights nonnegative, summing to 1, 0 on padding, and never
    lowers the linear objective ``g . w`` it ascends (an exponential tilt raises the mean)."""
    from crown_cli.engine.graph_alpha import simplex_ascent

    rng = np.random.default_rng(0)
    valid = rng.uniform(size=(200, 5)) < 0.7
    valid[:, 0] = True
    w = rng.uniform(size=(200, 5)) * valid
    w /= w.sum(axis=1, keepdims=True)
    w[:50] = np.where(np.arange(5) == 0, 1.0, 0.0)  # one-hot starts (CROWN's)
    g = rng.normal(size=(200, 5))
    for lr in (0.1, 3.0):
        v = simplex_ascent(w, g, valid, lr)
        assert np.all(v >= 0.0) and np.all(v[~valid] == 0.0)
        np.testing.assert_allclose(v.sum(axis=1), 1.0, atol=1e-12)
        assert np.all(np.sum(g * v, axis=1) >= np.sum(g * w, axis=1) - 1e-5)


@pytest.mark.slow  # slow tier since 2026-11-29
def test_maxpool_weights_alone_tighten_and_stay_sound(tmp_path, monkeypatch):
    """With the ReLU slopes held at CROWN's, optimising only the max pools' lower-line
    weights raises some row's bound above CROWN's, never above the exact minimum (MILP),
    and no sampled point of the box lies below it."""
    import crown_cli.engine.graph_alpha as ga

    g = graph_of(tmp_path, "conv_maxpool", 1)
    rng = np.random.default_rng(1)
    x0 = rng.uniform(-1.0, 1.0, g.input_size)
    lo, hi = x0 - 0.05, x0 + 0.05
    gb = GraphBounds(g, *Box(lo, hi).args())
    assert ga.free_pools(gb, g.output)
    monkeypatch.setattr(ga, "free_slopes", lambda gb, upto=None: {})
    rows = rng.standard_normal((6, g.output_size))
    crown = gb.lower(g.output, rows)
    alpha = ga.alpha_lower(gb, g.output, rows, iters=30)
    assert np.all(alpha >= crown)
    assert np.any(alpha > crown + 1e-4 * (1 + np.abs(crown)))
    for r, row in enumerate(rows):
        exact, _ = graph_min(g, lo, hi, row)
        assert alpha[r] <= exact + 1e-7 * (1 + abs(exact))
    X = lo + (hi - lo) * rng.uniform(size=(20000, g.input_size))
    assert np.all((g.forward(X) @ rows.T).min(axis=0) >= alpha - 1e-9)


@pytest.mark.parametrize("kind,seed,eps", [("relu_residual", 0, 0.05),
                                           slow_if(True, "conv", 0, 0.2)])
def test_optimised_intermediate_bounds_hold_the_exact_ranges(tmp_path, kind, seed, eps):
    """``GraphBounds(intermediate="alpha")``: every intermediate neuron CROWN leaves unstable
    gets bounds from alpha-CROWN rows. They contain the neuron's exact range (MILP on the
    graph cut at that node), some are strictly tighter than CROWN's, and the output rows'
    alpha bounds over them stay below the exact minimum."""
    import copy

    g = graph_of(tmp_path, kind, seed)
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(-1.0, 1.0, g.input_size)
    lo, hi = x0 - eps, x0 + eps
    crown = GraphBounds(g, *Box(lo, hi).args())
    opt = GraphBounds(g, *Box(lo, hi).args(), intermediate="alpha")
    readers = [i for i, n in enumerate(g.nodes) if n.kind == "activation"]
    tighter = 0
    for p in sorted({g.nodes[i].inputs[0] for i in readers})[1:]:  # the first is exact
        cut = copy.copy(g)
        cut.output = p
        unstable = np.flatnonzero((crown.lo[p] < 0.0) & (crown.hi[p] > 0.0))
        assert unstable.size
        tighter += int(np.sum((opt.lo[p][unstable] > crown.lo[p][unstable] + 1e-6)
                              | (opt.hi[p][unstable] < crown.hi[p][unstable] - 1e-6)))
        for j in unstable[:4]:
            e = np.zeros(g.nodes[p].size)
            e[j] = 1.0
            low, _ = graph_min(cut, lo, hi, e)
            high = -graph_min(cut, lo, hi, -e)[0]
            assert opt.lo[p][j] <= low + 1e-7 * (1 + abs(low))
            assert opt.hi[p][j] >= high - 1e-7 * (1 + abs(high))
    assert tighter > 0, "no intermediate bound moved: the test would show nothing"
    rows = rng.standard_normal((3, g.output_size))
    alpha = alpha_lower(opt, g.output, rows)
    for r, row in enumerate(rows):
        exact, _ = graph_min(g, lo, hi, row)
        assert alpha[r] <= exact + 1e-7 * (1 + abs(exact))
    X = lo + (hi - lo) * rng.uniform(size=(20000, g.input_size))
    _, vals = g.forward(X, return_all=True)
    for i, v in enumerate(vals):
        assert np.all(v >= opt.lo[i] - 1e-9) and np.all(v <= opt.hi[i] + 1e-9)


def test_alpha_stage_skips_intermediate_optimisation_when_the_rows_suffice(tmp_path, monkeypatch):
    """The alpha-crown stage on a graph first optimises the rows' slopes over CROWN's
    intermediate bounds; a property that proves there stops there: the intermediate bounds'
    optimisation (minutes on a CIFAR ResNet), which this graph admits, never runs."""
    from crown_cli.verification.graph_verifier import GraphVerifier, alpha_can_tighten

    g, gb, prop = _crown_alpha_gap(tmp_path)  # the rows' alpha over CROWN's bounds proves it
    assert alpha_can_tighten(gb)
    calls = []
    real = GraphBounds._alpha_bounds
    monkeypatch.setattr(GraphBounds, "_alpha_bounds",
                        lambda self, *a: calls.append(1) or real(self, *a))
    v = GraphVerifier(g, attack_restarts=8, attack_steps=20).verify(prop, 60)
    assert v.result == "unsat" and v.stage == "alpha-crown" and not calls, (v, calls)


@pytest.mark.parametrize("kind,seed,eps", [("conv", 0, 0.05), ("relu_residual", 0, 0.05),
                                           ("conv_maxpool", 1, 0.05)])
def test_float32_steering_pass_is_the_float64_bound_to_float32_accuracy(tmp_path, kind, seed,
                                                                       eps):
    """alpha-CROWN's iterations run :meth:`GraphBounds.lower` with ``steer=np.float32``: at
    the same free parameters and with its tape, that estimate is the float64 bound to float32
    accuracy (every product of the numpy path in float32, none silently in float64 or
    wrong), and the float32 tape's slopes are the float64 tape's."""
    import crown_cli.engine.graph_alpha as ga

    g = graph_of(tmp_path, kind, seed)
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(-1.0, 1.0, g.input_size)
    gb = GraphBounds(g, *Box(x0 - eps, x0 + eps).args())
    slopes = ga.free_slopes(gb, g.output)
    assert slopes
    rows = rng.standard_normal((4, g.output_size))
    free = {i: np.where(on, rng.uniform(0.0, 1.0, (4, on.size)), gb.lines[i].lower[None])
            for i, (on, _) in slopes.items()}
    t64, t32 = {}, {}
    b64 = gb.lower(g.output, rows, free=free, tape=t64)
    b32 = gb.lower(g.output, rows, free={i: f.astype(np.float32) for i, f in free.items()},
                   tape=t32, steer=np.float32)
    scale = np.abs(rows) @ np.abs(g.forward(x0[None])[0]) + 1.0
    assert np.all(np.abs(b32 - b64) <= 1e-4 * scale)
    assert t32["Lx"].dtype == np.float32
    for i in slopes:
        assert t32[i][2].dtype == np.float32
        assert np.allclose(t32[i][2], t64[i][2], rtol=1e-6, atol=1e-6)


def test_alpha_returns_the_float64_bound_at_the_parameters_it_keeps(tmp_path):
    """The iterations steer in float32; what alpha_lower returns is, per row, the larger of
    CROWN's and the float64 bound at the parameters it keeps (``keep=True``) -- not a
    float32 estimate."""
    g = graph_of(tmp_path, "conv", 0)
    rng = np.random.default_rng(0)
    x0 = rng.uniform(-1.0, 1.0, g.input_size)
    gb = GraphBounds(g, *Box(x0 - 0.05, x0 + 0.05).args())
    rows = rng.standard_normal((3, g.output_size))
    low, kept = alpha_lower(gb, g.output, rows, keep=True)
    assert kept and all(p.dtype == np.float64 for p in kept.values())
    again = np.fmax(gb.lower(g.output, rows), gb.lower(g.output, rows, free=kept))
    assert np.array_equal(low, again)


def test_kept_leaky_slopes_are_valid_lines_in_float64(tmp_path):
    # the slopes are stepped in float32, where the leak 0.01 rounds below itself: the
    # parameters the float64 bound is taken at must still be lines below a leaky ReLU,
    # slope >= leak wherever the input can be negative (also on stable neurons, whose
    # slopes alpha does not step) and <= 1 wherever it can be positive
    model = dense_chain(np.random.default_rng(7), sizes=(6, 40, 30, 3), act="LeakyRelu")
    path = os.path.join(str(tmp_path), "leaky.onnx")
    onnx.save(model, path)
    g = load_graph(path)
    rng = np.random.default_rng(7)
    lo = rng.uniform(-1.0, 0.0, 6)
    gb = GraphBounds(g, *Box(lo, lo + 0.6).args())
    slopes = free_slopes(gb)
    assert slopes and all(leak == np.float64(0.01) for _, leak in slopes.values())
    _, kept = alpha_lower(gb, g.output, rng.standard_normal((4, 3)), iters=30, keep=True)
    assert set(kept) == set(slopes)
    for i, (free, leak) in slopes.items():
        p = g.nodes[i].inputs[0]
        assert np.any(gb.hi[p] <= 0.0), "no stable negative neuron: the test would show less"
        k = kept[i]
        assert k.dtype == np.float64
        assert np.all(k[:, gb.lo[p] < 0.0] >= leak)
        assert np.all(k[:, gb.hi[p] > 0.0] <= 1.0)
        # alpha reached the least slope on some free neuron (the case float32 rounds)
        assert np.any(k[:, free] == leak)
