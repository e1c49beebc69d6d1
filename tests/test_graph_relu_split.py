"""ReLU splitting on graph networks (the one search of crown_cli.verification.bab.relu_split
over crown_cli.verification.bab.graph_bounder's GraphBounder): subdomain
bounds below the sampled minimum over each subdomain (any slopes, any multipliers), the
multipliers' and slopes' gradient against finite differences, fully split domains decided
exactly (LP multipliers checked by a float64 bound), verdicts equal to an exact MILP of the
graph, and the search's own ends (a max pool leaves fully split domains open: unknown, not
unsat)."""
import os
import time

import numpy as np
import onnx
import pytest

from conftest import slow_if
from crown_cli.engine.graph_alpha import _minimiser, _relaxed_forward
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.verification.bab import graph_bounder as grs
from crown_cli.verification.bab.relu_split import _leaf_lp
from graph_models import BUILDERS
from graph_oracles import graph_min


def graph_of(tmp_path, kind, seed):
    path = os.path.join(str(tmp_path), f"{kind}{seed}.onnx")
    onnx.save(BUILDERS[kind](np.random.default_rng(seed)), path)
    return load_graph(path)


def setup(tmp_path, kind, seed, eps=0.1):
    g = graph_of(tmp_path, kind, seed)
    rng = np.random.default_rng(seed + 100)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - eps, x0 + eps
    gb = GraphBounds(g, *Box(lo, hi).args())
    return g, gb, space_of(g, gb, lo, hi), lo, hi, rng


class space_of(grs.GraphBounder):
    """The bounder of the box with one zero row, with ``nodes`` as (node, neurons, offset)."""

    def __init__(self, g, gb, lo, hi, A=None, b=None):
        super().__init__(g, gb, lo, hi, np.zeros((1, g.output_size)) if A is None else A,
                         np.zeros(1) if b is None else b)
        self.triples = [(i, idx, off) for i, idx, off in
                        zip(self.nodes, self.ucols, self.offsets)]


def signs_at(g, space, x):
    """The side (+1 / -1) of every split neuron's threshold (ReLU 0; a smooth neuron its
    ``split_at``) at the point x: a split met by x."""
    _, vals = g.forward(x[None], return_all=True)
    return np.concatenate([np.where(vals[g.nodes[i].inputs[0]][0, idx]
                                    >= space.split_at[off:off + idx.size], 1, -1)
                           for i, idx, off in space.triples]).astype(np.int8)


def in_domain(g, space, vals, split):
    """The sampled points meeting every split decision; ``vals``: every node's values at the
    points (``g.forward(X, return_all=True)[1]``, computed once for all splits)."""
    ok = np.ones(vals[g.output].shape[0], bool)
    for i, idx, off in space.triples:
        z = vals[g.nodes[i].inputs[0]][:, idx]
        s, t = split[off:off + idx.size], space.split_at[off:off + idx.size]
        ok &= np.all(np.where(s > 0, z >= t, np.where(s < 0, z <= t, True)), axis=1)
    return ok


@pytest.mark.parametrize("kind", ["conv", "conv_maxpool", "dense", "conv_tanh"])
def test_subdomain_bounds_hold_for_any_slopes_and_multipliers(tmp_path, kind):
    g, gb, space, lo, hi, rng = setup(tmp_path, kind, 1, eps=0.1 if kind != "dense" else 0.4)
    assert space.nU >= 3
    rows = rng.normal(size=(2, g.output_size))
    X = lo + rng.uniform(size=(20000, g.input_size)) * (hi - lo)
    X[:2000] = np.where(rng.integers(0, 2, size=(2000, g.input_size)) == 1, hi, lo)
    Y, vals = g.forward(X, return_all=True)
    tested = 0
    for trial in range(30):  # splits met by a sampled point, on a random share of neurons
        split = signs_at(g, space, X[rng.integers(X.shape[0])])
        split[rng.uniform(size=space.nU) < rng.uniform(0.2, 0.9)] = 0
        ok = in_domain(g, space, vals, split)
        if ok.sum() < 20:
            continue
        R = rows.shape[0]
        alpha = rng.uniform(0, 1, (R, space.nU))
        beta = rng.exponential(1.0, (R, space.nU)) * (split != 0)
        lines = space.lines(np.repeat(split[None], R, axis=0), alpha, beta)
        lb = gb.lower(g.output, rows, lines=lines)
        sampled = (Y[ok] @ rows.T).min(axis=0)
        assert np.all(lb <= sampled), (trial, lb, sampled)
        tested += 1
    assert tested >= 5


def test_multiplier_and_slope_gradient_matches_finite_differences(tmp_path):
    """The bound is piecewise linear in alpha and beta; at a generic point its derivative is
    the one GraphBounder.gradient gives (a coefficient times its node's value under the
    row's lines at the row's minimiser), which is checked to be that formula too."""
    g, gb, space, lo, hi, rng = setup(tmp_path, "conv", 2)
    row = rng.normal(size=(1, g.output_size))
    split = np.zeros(space.nU, np.int8)
    split[: space.nU // 2] = rng.choice([-1, 1], space.nU // 2)
    alpha = rng.uniform(0.2, 0.8, (1, space.nU))
    beta = rng.uniform(0.1, 1.0, (1, space.nU)) * (split != 0)
    sp = split[None]

    def value(a, b):
        return float(gb.lower(g.output, row, lines=space.lines(sp, a, b))[0])

    tape = {}
    gb.lower(g.output, row, tape=tape, lines=space.lines(sp, alpha, beta))
    x = _minimiser(gb, tape.pop("Lx"))
    vals = _relaxed_forward(gb, g.output, x, tape)
    bd = space_of(g, gb, lo, hi, row, np.zeros(1))
    _, state = bd.evaluate(sp, alpha[:, None], beta[:, None], keep=True)
    gA, gB = bd.gradient(state)
    checked = 0
    for i, idx, off in space.triples:
        L, pos = tape[i][0][0, idx], tape[i][1][0, idx]
        z = vals[g.nodes[i].inputs[0]][0, idx]
        for k in range(idx.size):
            j = off + k
            h = 1e-6
            if split[j] != 0:
                want = -split[j] * z[k]
                b2 = beta.copy()
                b2[0, j] += h
                b1 = beta.copy()
                b1[0, j] -= h
                got = (value(alpha, b2) - value(alpha, b1)) / (2 * h)
                assert gB[0, j] == pytest.approx(want, abs=1e-12 * (1 + abs(want)))
            elif pos[k]:
                want = L[k] * z[k]
                a2 = alpha.copy()
                a2[0, j] += h
                a1 = alpha.copy()
                a1[0, j] -= h
                got = (value(a2, beta) - value(a1, beta)) / (2 * h)
                assert gA[0, j] == pytest.approx(want, abs=1e-12 * (1 + abs(want)))
            else:
                continue
            assert got == pytest.approx(want, abs=1e-5 * (1 + abs(want))), (j, got, want)
            checked += 1
    assert checked >= 5


@pytest.mark.parametrize("kind,seed,branching", [
    slow_if(kind == "relu_residual" and (seed == 5 or branching == "babsr"), kind, seed, branching)
    for kind, seed in [("conv", 3), ("conv", 7), ("dense", 3), ("dense", 7), ("normalised", 3),
                       ("relu_residual", 3), ("relu_residual", 5)]
    for branching in ["babsr", "fsb"]])
def test_verdicts_equal_the_milp_on_both_sides_of_the_minimum(tmp_path, kind, seed, branching):
    """b 0.1% (relative) below the exact minimum: unsat; 0.1% above: sat, with a point the
    float64 forward pass confirms; branching by BaBSR and by filtered smart branching over
    3 candidates."""
    g = graph_of(tmp_path, kind, seed)
    assert grs.exact_when_split(g)
    verdicts_either_side(g, kind, seed, branching=branching, fsb_k=3)


def verdicts_either_side(g, kind, seed, **options):
    """b 0.1% (relative) below the exact minimum (MILP) of a random row over a box: unsat;
    0.1% above: sat, with a point in the box the float64 forward pass confirms."""
    rng = np.random.default_rng(seed + 1)
    x0 = rng.uniform(-1, 1, g.input_size)
    eps = {"dense": 0.2, "relu_residual": 0.1}.get(kind, 0.05)
    lo, hi = x0 - eps, x0 + eps
    row = rng.normal(size=g.output_size)
    m, _ = graph_min(g, lo, hi, row)
    for delta, want in ((-1e-3, "unsat"), (1e-3, "sat")):
        b = m + delta * (1 + abs(m))
        r = grs.graph_relu_split(g, lo, hi, row[None], np.array([b]), time.monotonic() + 60,
                                 **options)
        assert r.verdict == want, (kind, seed, delta, r)
        if want == "sat":
            assert np.all((r.x >= lo) & (r.x <= hi)) and row @ g.forward(r.x) <= b


def test_fully_split_domains_are_decided_by_the_lp(tmp_path):
    """Leaves (every unstable neuron split) of a small dense graph: the LP's multipliers prove
    each when b is below the exact minimum over the whole box (MILP), and never prove a leaf
    with a sampled point below b."""
    g, gb, space, lo, hi, rng = setup(tmp_path, "dense", 3, eps=0.4)
    row = rng.normal(size=(1, g.output_size))
    m, _ = graph_min(g, lo, hi, row[0])
    X = lo + rng.uniform(size=(40000, g.input_size)) * (hi - lo)
    out, vals = g.forward(X, return_all=True)
    Y = out @ row[0]
    seen = 0
    for trial in range(40):
        split = signs_at(g, space, X[rng.integers(X.shape[0])])
        ok = in_domain(g, space, vals, split)
        if ok.sum() < 50:
            continue
        low = float(Y[ok].min())
        below, above = np.array([m - 1e-3 * (1 + abs(m))]), np.array([low + 0.05])
        assert leaf(g, gb, lo, hi, row, below, split) is True, trial
        assert leaf(g, gb, lo, hi, row, above, split) is not True, trial
        seen += 1
    assert seen >= 3


def leaf(g, gb, lo, hi, row, b, split):
    """The search's leaf rule on the fully split domain ``split``: the LP
    (:func:`_leaf_lp` on :meth:`GraphBounder.affine`), then its multipliers checked by a
    float64 bound; a candidate point (True only if proven, else the point or False)."""
    bd = space_of(g, gb, lo, hi, row, b)
    out = _leaf_lp(bd, split)
    if out[0] == "sat":
        return out[1]
    if out[0] != "beta":
        return False
    for scale in (1.0, 1.0 + 1e-6, 1.01):
        be = np.zeros((1, 1, bd.nU))
        be[0, out[1]] = scale * out[2]
        v = bd.evaluate(split[None], np.zeros((1, 1, bd.nU)), be)
        if np.all(v > 0.0):
            return True
    return False


@pytest.mark.slow
def test_max_pool_graph_ends_unknown_not_unsat_when_leaves_stay_open(tmp_path):
    """On a max pool graph a fully split domain keeps the pool's loose lines: when b is just
    below the exact minimum, the search ends unsat (proven anyway) or unknown with the reason,
    never sat."""
    g = graph_of(tmp_path, "conv_maxpool", 3)
    assert not grs.exact_when_split(g)
    rng = np.random.default_rng(4)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.05, x0 + 0.05
    row = rng.normal(size=g.output_size)
    m, _ = graph_min(g, lo, hi, row)
    r = grs.graph_relu_split(g, lo, hi, row[None], np.array([m - 1e-3 * (1 + abs(m))]),
                             time.monotonic() + 4)
    assert r.verdict in ("unsat", "unknown", "timeout")
    if r.verdict == "unknown":
        assert "every unstable neuron split stayed open" in r.note


def test_open_domains_are_capped_by_memory(tmp_path):
    """The open domains' stored state is capped (max_memory): a search that would hold more
    ends unknown ("domain cap"), not out of memory."""
    g = graph_of(tmp_path, "relu_residual", 7)  # thousands of domains without the cap
    rng = np.random.default_rng(8)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.1, x0 + 0.1
    row = rng.normal(size=g.output_size)
    m, _ = graph_min(g, lo, hi, row)
    b = np.array([m - 1e-3 * (1 + abs(m))])
    r = grs.graph_relu_split(g, lo, hi, row[None], b, time.monotonic() + 30,
                             max_memory=2.0 ** 11)  # room for a couple of domains
    assert r.verdict == "unknown" and r.note == "domain cap", r
    assert r.peak_open <= 2 + grs.GRAPH_OPTIONS.batch  # the cap, plus one batch of children


def test_maxpool_as_relus_is_the_same_function_and_makes_splitting_complete(tmp_path):
    """The rewrite of max pools as ReLU trees: equal forward passes (windows of 1 to 5 inputs,
    with padding), a graph whose fully split domains are affine, the input graph itself
    when it has no max pool; and ReLU splitting on it proves a case 1e-3 of the range below
    the exact minimum (MILP) that the search on the pooled graph leaves unknown or open."""
    from crown_cli.graph.network import Graph, Node
    from crown_cli.graph.ops import Dense, InputOp
    from crown_cli.graph.pooling import MaxPool, maxpool_as_relus

    rng = np.random.default_rng(0)
    win = np.array([[0, 1, 2, 3, 4], [2, -1, 5, -1, -1], [6, -1, -1, -1, -1],
                    [7, 1, 3, -1, 0], [4, 5, 6, 7, -1]])
    nodes = [Node("x", InputOp(0, 0, 6), (), (1, 6)),
             Node("d", Dense(rng.normal(size=(8, 6)), rng.normal(size=8)), (0,), (1, 8)),
             Node("p", MaxPool(win, 8), (1,), (1, 5)),
             Node("o", Dense(rng.normal(size=(3, 5))), (2,), (1, 3))]
    g = Graph(nodes, 3)
    r = maxpool_as_relus(g)
    X = rng.uniform(-2, 2, (2000, 6))
    np.testing.assert_allclose(r.forward(X), g.forward(X), rtol=1e-12, atol=1e-12)
    assert grs.exact_when_split(r) and not grs.exact_when_split(g)
    assert maxpool_as_relus(g, max_relus=11) is not g  # 4 + 1 + 0 + 3 + 3 ReLUs
    assert maxpool_as_relus(g, max_relus=10) is g
    conv = graph_of(tmp_path, "conv", 1)
    assert maxpool_as_relus(conv) is conv
    g = graph_of(tmp_path, "conv_maxpool", 2)
    r = maxpool_as_relus(g)
    rng = np.random.default_rng(102)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.02, x0 + 0.02
    row = rng.normal(size=g.output_size)
    m, _ = graph_min(g, lo, hi, row)
    spread = float(row @ g.forward(x0)) - m
    b = np.array([m - 1e-3 * spread])
    res = grs.graph_relu_split(r, lo, hi, row[None], b, time.monotonic() + 30)
    assert res.verdict == "unsat", res
    old = grs.graph_relu_split(g, lo, hi, row[None], b, time.monotonic() + 3)
    assert old.verdict in ("unknown", "timeout"), old


def test_split_multiplier_cancelling_a_rounded_product_is_charged():
    """``GraphBounds.lower`` with lines whose ``extra`` (split multipliers) cancels the
    rounded product: a leaky ReLU neuron (slope 0.9) split inactive, row -1.2000079... on it,
    beta = -fl(row * 0.9), so D = fl(fl(row * 0.9) + beta) is exactly 0 and no charge
    proportional to |D| covers the product's rounding, which is the whole exact coefficient
    (0.89 u |row * 0.9|, rounded away from 0: the exact bound over z in [-1, 0.5] is
    -1.07e-16). The bound (-4.8e-16) must lie below the exact value of the same lines and
    multiplier: only the ``extra`` branch's charge, 2u (|L slope| + |extra|) Z, puts it there
    (without it the bound is -1e-300)."""
    from fractions import Fraction as F

    from crown_cli.engine.batch_steps import Lines
    from crown_cli.graph.network import Graph, Node
    from crown_cli.graph.ops import ActivationOp, Dense, InputOp

    leak, lam = 0.9, -1.2000079374165198
    nodes = [Node("x", InputOp(0, 0, 1), (), (1, 1)),
             Node("d", Dense(np.array([[1.0]]), None), (0,), (1, 1)),
             Node("r", ActivationOp("leaky_relu", leak), (1,), (1, 1))]
    g = Graph(nodes, 2)
    gb = GraphBounds(g, *Box(np.array([-1.0]), np.array([0.5])).args())
    beta = -(lam * leak)
    assert lam * leak + beta == 0.0
    kappa = F(lam) * F(leak) + F(beta)  # the exact coefficient of z: > 0, so min at z = -1
    assert kappa > 0
    lines = {2: Lines(np.array([0]), np.array([[leak]]), np.array([[leak]]),
                      extra=np.array([[beta]]))}
    lb = gb.lower(2, np.array([[lam]]), lines=lines)[0]
    assert F(float(lb)) <= -kappa, (lb, float(-kappa))


@pytest.mark.parametrize("act", ["Tanh", "Sigmoid"])
def test_smooth_neurons_split_to_close_a_gap_crown_leaves(tmp_path, act, monkeypatch):
    """S-shaped neurons are split (at 0 where their interval holds it, else at its middle),
    each half taking its own lines: on a one-hidden-layer tanh / sigmoid network, with the
    threshold a tenth of the way from CROWN's bound to the sampled minimum, the search
    proves unsat by splitting, where without smooth splits it has nothing to split; with
    the threshold just above a sampled point's value it never says unsat. (Each neuron is
    split once, and there are no per-domain intermediate bounds: wide gaps stay open.)"""
    from graph_models import dense_chain

    path = os.path.join(str(tmp_path), f"{act}.onnx")
    onnx.save(dense_chain(np.random.default_rng(5), (3, 12, 2), act=act), path)
    g = load_graph(path)
    rng = np.random.default_rng(6)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 1.0, x0 + 1.0
    row = rng.normal(size=g.output_size)
    X = lo + rng.uniform(size=(50000, g.input_size)) * (hi - lo)
    low = float((g.forward(X) @ row).min())
    crown = float(GraphBounds(g, *Box(lo, hi).args()).lower(g.output, row[None])[0])
    assert crown < low - 0.02 * (1 + abs(low))
    b = np.array([crown + 0.1 * (low - crown)])
    r = grs.graph_relu_split(g, lo, hi, row[None], b, time.monotonic() + 60)
    assert r.verdict == "unsat" and r.domains > 1, r
    for above in (low + 1e-9, low + 0.1 * (1 + abs(low))):
        r = grs.graph_relu_split(g, lo, hi, row[None], np.array([above]),
                                 time.monotonic() + 20)
        assert r.verdict != "unsat", r
    monkeypatch.setattr(grs, "SMOOTH_SPLITS", ())
    r = grs.graph_relu_split(g, lo, hi, row[None], b, time.monotonic() + 20)
    assert r.verdict != "unsat" and r.domains <= 1, r


def test_a_split_smooth_neuron_takes_lines_that_hold_on_its_half(tmp_path):
    """Per row, a tanh neuron split to its upper half (+1) takes lines that hold for every z
    in [t, u] (t its ``split_at``), to its lower half (-1) lines holding on [l, t], open (0)
    the root's lines on [l, u]: checked on a dense grid of each neuron's own interval."""
    from crown_cli.activations import apply_activation

    g, gb, space, lo, hi, rng = setup(tmp_path, "conv_tanh", 1, eps=0.3)
    k = next(k for k, h in enumerate(space.halves) if h is not None)
    i, idx, off = space.triples[k]
    l, u = (b[idx] for b in space.bounds[k])
    t = space.split_at[off:off + idx.size]
    assert np.all((l <= t) & (t <= u)) and np.any((l < 0) & (u > 0) & (t == 0))
    split = np.zeros((3, space.nU), np.int8)
    split[0, off:off + idx.size], split[1, off:off + idx.size] = 1, -1
    lines = space.lines(split, np.zeros((3, space.nU)), np.zeros((3, space.nU)))[i]
    for r, (a, z) in enumerate(((t, u), (l, t), (l, u))):
        grid = a[:, None] + (z - a)[:, None] * np.linspace(0.0, 1.0, 401)[None]
        f = apply_activation("tanh", grid)
        low = lines.lower[r, idx][:, None] * grid + lines.lower_icpt[r, idx][:, None]
        up = lines.upper[r, idx][:, None] * grid + lines.upper_icpt[r, idx][:, None]
        assert np.all(low <= f) and np.all(f <= up), r
    # the halves' lines are tighter than the root's somewhere
    assert np.any(lines.lower[0, idx] * u + lines.lower_icpt[0, idx]
                  > lines.lower[2, idx] * u + lines.lower_icpt[2, idx] + 1e-9)


def test_float32_steering_evaluation_and_gradient_track_the_float64_ones(tmp_path):
    """The search's float32 evaluations (``dtype`` float32) run the engine's float32 pass:
    their tape is float32, and the bound and the gradient in alpha and beta equal the
    float64 evaluation's to float32 accuracy at the same slopes and multipliers (a wrong
    product or line in the float32 pass would show here; the search proves nothing with
    them)."""
    g, gb, space, lo, hi, rng = setup(tmp_path, "conv", 2)
    rows = rng.normal(size=(2, g.output_size))
    bd = space_of(g, gb, lo, hi, rows, np.zeros(2))
    B = 3
    split = np.zeros((B, bd.nU), np.int8)
    split[:, : bd.nU // 2] = rng.choice([-1, 1], (B, bd.nU // 2))
    alpha = rng.uniform(0.0, 1.0, (B, 2, bd.nU)).astype(np.float32)
    beta = (rng.uniform(0.0, 1.0, (B, 2, bd.nU)) * (split[:, None] != 0)).astype(np.float32)
    v64, s64 = bd.evaluate(split, alpha, beta, np.float64, keep=True)
    v32, s32 = bd.evaluate(split, alpha, beta, np.float32, keep=True)
    assert s32[1].dtype == np.float32 and s64[1].dtype == np.float64
    scale = 1.0 + np.abs(v64)
    assert np.all(np.abs(v32 - v64) <= 1e-4 * scale)
    for g32, g64 in zip(bd.gradient(s32), bd.gradient(s64)):
        assert np.allclose(g32, g64, rtol=1e-3, atol=1e-4 * (1.0 + np.abs(g64).max()))


@pytest.mark.parametrize("kind", ["conv", "relu_residual", "conv_maxpool"])
def test_per_domain_bounds_hold_on_their_domain_and_only_narrow(tmp_path, kind):
    """GraphBounder.tighten: on a domain (splits met by a sampled point, on a random share
    of neurons) every unstable neuron's recomputed input bounds hold the values of the
    sampled points of the domain and lie inside the root's; the split neurons take their
    side, the implied splits it returns are met by those points, and somewhere a bound is
    strictly tighter than the root's (the rows under the domain's lines)."""
    g, gb, space, lo, hi, rng = setup(tmp_path, kind, 3, eps=0.1)
    assert space.L >= 2
    X = lo + rng.uniform(size=(20000, g.input_size)) * (hi - lo)
    X[:2000] = np.where(rng.integers(0, 2, size=(2000, g.input_size)) == 1, hi, lo)
    _, vals = g.forward(X, return_all=True)
    rl, ru = space.root_domain_bounds()
    tested, narrower = 0, 0
    for trial in range(30):
        split = signs_at(g, space, X[rng.integers(X.shape[0])])
        split[rng.uniform(size=space.nU) < rng.uniform(0.3, 0.9)] = 0
        ok = in_domain(g, space, vals, split)
        if ok.sum() < 20:
            continue
        sp, dl, du, empty = space.tighten(split[None], rl[None], ru[None], np.zeros(1, int))
        assert not empty[0]
        assert np.all(dl[0] >= rl) and np.all(du[0] <= ru)
        for i, idx, off in space.triples:
            z = vals[g.nodes[i].inputs[0]][ok][:, idx]
            assert np.all(z >= dl[0, off:off + idx.size]), (trial, i)
            assert np.all(z <= du[0, off:off + idx.size]), (trial, i)
        assert np.all(in_domain(g, space, vals, sp[0])[ok])
        narrower += int(np.sum(dl[0] > rl) + np.sum(du[0] < ru))
        tested += 1
    assert tested >= 5 and narrower > 0


@pytest.mark.parametrize("kind,seed", [("conv", 3), ("relu_residual", 3), ("normalised", 3)])
def test_verdicts_with_per_domain_bounds_equal_the_milp(tmp_path, kind, seed):
    """interm=True (each child's split ReLU nodes below its new split bounded again on it):
    b 0.1% below the exact minimum unsat, 0.1% above sat with a confirmed point."""
    verdicts_either_side(graph_of(tmp_path, kind, seed), kind, seed, interm=True, workers=1)


def residual_case(tmp_path):
    """A residual graph, a box and an output row with its exact minimum there (MILP): a
    search of about a thousand domains either side of the minimum."""
    g = graph_of(tmp_path, "relu_residual", 7)
    rng = np.random.default_rng(4)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.1, x0 + 0.1
    row = rng.normal(size=g.output_size)
    return (g, lo, hi, row) + (graph_min(g, lo, hi, row)[0],)


def test_batches_shared_with_a_helper_process(tmp_path, monkeypatch):
    """workers=2 (the graphs' default): batches of 16 children or more are bounded half here,
    half by a forked helper process; the verdicts stay the MILP's (unsat 0.1% below the
    exact minimum, sat above with a point the forward pass confirms), the helper ends with
    the search, and a helper lost mid-search leaves the search to finish alone."""
    from crown_cli.verification.bab import shared_batches
    from crown_cli.verification.bab.workers import Helper, HelperLost, can_fork

    if not can_fork():
        pytest.skip("needs two cores and fork")
    made = []

    class Counting(Helper):
        lose_at = None  # the recv() call that reports the process lost

        def __init__(self, fn, single=False):
            super().__init__(fn, single)
            self.sent = 0
            made.append(self)

        def send(self, args):
            self.sent += 1
            super().send(args)

        def recv(self):
            out = super().recv()
            if self.sent == self.lose_at:
                raise HelperLost("simulated")
            return out

    monkeypatch.setattr(shared_batches, "Helper", Counting)
    g, lo, hi, row, m = residual_case(tmp_path)  # 1211 domains to unsat, 1413 to sat
    for delta, want, lose in ((-1e-3, "unsat", None), (1e-3, "sat", None),
                              (-1e-3, "unsat", 2)):
        Counting.lose_at = lose
        made.clear()
        b = m + delta * (1 + abs(m))
        r = grs.graph_relu_split(g, lo, hi, row[None], np.array([b]), time.monotonic() + 60)
        assert r.verdict == want, (delta, r)
        if want == "sat":
            assert np.all((r.x >= lo) & (r.x <= hi)) and row @ g.forward(r.x) <= b
        else:
            assert made and made[0].sent >= (2 if lose else 3), (r, [h.sent for h in made])
            assert len(made) == 1  # lost: no second fork, the search went on alone
        assert shared_batches._HOLDERS == [] and all(not h.proc.is_alive() for h in made)
    r1 = grs.graph_relu_split(g, lo, hi, row[None], np.array([m - 1e-3 * (1 + abs(m))]),
                              time.monotonic() + 60, workers=1)
    assert r1.verdict == "unsat"


@pytest.mark.parametrize("lose", [False, True])
def test_a_shared_batch_is_what_its_halves_give_here(tmp_path, monkeypatch, lose):
    """shared_batches.assess_shared on a batch of children equals assess_part of its two
    halves run in this process, array for array (the helper runs the same code on the same
    data, a thread each); with the helper lost at the answer, the same again (both halves
    bounded here), and the search goes on alone."""
    from dataclasses import replace

    from crown_cli.verification.bab import shared_batches
    from crown_cli.verification.bab.relu_split import _Search
    from crown_cli.verification.bab.workers import Helper, HelperLost, can_fork

    if not can_fork():
        pytest.skip("needs two cores and fork")

    class Losing(Helper):
        def recv(self):
            super().recv()
            raise HelperLost("simulated")

    if lose:
        monkeypatch.setattr(shared_batches, "Helper", Losing)
    g, lo, hi, row, m = residual_case(tmp_path)
    gb = GraphBounds(g, *Box(lo, hi).args())
    bd = grs.GraphBounder(g, gb, lo, hi, row[None], np.array([m - 1e-3 * (1 + abs(m))]))
    search = _Search(bd, time.monotonic() + 60, replace(grs.GRAPH_OPTIONS, workers=1), None,
                     None, None, time.monotonic())
    steps = search.run()
    while search.pool is None or len(search.pool) < 32:
        next(steps)
    kids, _ = search._branch(search.pool.pop(32))
    n = kids.split.shape[0]
    halves = [kids.take(np.arange(n // 2)), kids.take(np.arange(n // 2, n))]
    want = [search.assess_part(h, 5) for h in halves]
    search.workers = 2
    got = shared_batches.assess_shared(search, kids, 5)
    assert len(got) == 2
    for w, o in zip(want, got):
        for a, b in zip((w[0].split, w[0].alpha, w[0].beta, w[0].done) + w[1:5],
                        (o[0].split, o[0].alpha, o[0].beta, o[0].done) + o[1:5]):
            np.testing.assert_array_equal(a, b)
        assert w[5] is None and o[5] is None
    assert (search.workers, search.helper is None) == ((1, True) if lose else (2, False))
    steps.close()
    assert search.helper is None and shared_batches._HOLDERS == []
