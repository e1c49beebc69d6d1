"""Chain-shaped graphs lowered to the dense engine (crown_cli.graph.lower): the lowered MLP's
weights equal the exact (rational) composition of the graph's operations; its forward pass
equals the graph's and onnx.reference's; its CROWN bound equals the graph engine's; verify
verdicts on lowered conv graphs (alpha-CROWN, branch and bound) equal an exact MILP; graphs
that must not be lowered (max pool, a residual Add, several activation types, an inexact
composition) are not; the CLI and the API route lowered graphs to the dense engine."""
import os
from fractions import Fraction

import numpy as np
import onnx
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

from conftest import slow_if
from crown_cli.cli import cli
from crown_cli.graph.lower import NotExact, compose, lower, lowered, power_of_two
from crown_cli.graph.network import Graph
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.io.networks import load_network
from crown_cli.io.vnnlib import parse_vnnlib_text
from crown_cli.network import MLP
from crown_cli.verification.graph_verifier import (GraphVerifier, LoweredVerifier,
                                                   graph_box_lower_bounds, graph_verifier)
from graph_models import BUILDERS, G
from graph_oracles import graph_min, onnx_outputs


def pool_chain(rng, kernel=2, stride=2, bias_before_pool=False):
    """Conv (pads) -> BatchNorm (folded) -> Relu -> AveragePool -> Flatten -> Gemm -> Relu ->
    Gemm on a (1, 1, 6, 6) input; ``bias_before_pool``: the pool reads the convolution
    directly (its bias goes through the pool: sums)."""
    g = G(rng)
    x = g.op("Conv", ["x", g.rand(2, 1, 3, 3), g.rand(2)], pads=[1, 1, 1, 1])
    x = g.op("BatchNormalization", [x, g.const(rng.uniform(0.5, 1.5, 2)), g.rand(2),
                                    g.rand(2), g.const(rng.uniform(0.5, 2.0, 2))])
    if not bias_before_pool:
        x = g.op("Relu", [x])
    x = g.op("AveragePool", [x], kernel_shape=[kernel, kernel], strides=[stride, stride])
    if bias_before_pool:
        x = g.op("Relu", [x])
    x = g.op("Flatten", [x])
    side = (6 - kernel) // stride + 1
    x = g.op("Gemm", [x, g.rand(5, 2 * side * side), g.rand(5)], transB=1)
    x = g.op("Relu", [x])
    x = g.op("Gemm", [x, g.rand(3, 5), g.rand(3)], transB=1)
    return g.model([("x", (1, 1, 6, 6))], [x])


def pad_chain(rng, relu_out=False):
    """Pad (zeros) -> Conv (stride 2, dilation) -> Relu -> Conv (groups) -> Relu -> Flatten ->
    Gemm [-> Relu] on a (1, 2, 5, 4) input."""
    g = G(rng)
    x = g.op("Pad", ["x", g.const([0, 0, 1, 0, 0, 0, 1, 2], np.int64), g.const(0.0)])  # 7x6
    x = g.op("Conv", [x, g.rand(4, 2, 3, 2), g.rand(4)], strides=[2, 1], dilations=[1, 2])
    x = g.op("Relu", [x])
    x = g.op("Conv", [x, g.rand(4, 2, 2, 2), g.rand(4)], group=2)
    x = g.op("Relu", [x])
    x = g.op("Flatten", [x])
    x = g.op("Gemm", [x, g.rand(3, 4 * 2 * 3), g.rand(3)], transB=1)
    if relu_out:
        x = g.op("Relu", [x])
    return g.model([("x", (1, 2, 5, 4))], [x])


LOWERED = {"pool": pool_chain, "pad": pad_chain,
           "pad_relu_out": lambda rng: pad_chain(rng, relu_out=True),
           "normalised": BUILDERS["normalised"]}
NOT_LOWERED = {"conv_maxpool": ("maxpool", BUILDERS["conv_maxpool"]),
               "residual": ("is read by 3 nodes", BUILDERS["residual"]),
               "two_inputs": ("2 input tensors", BUILDERS["two_inputs"]),
               # a 2x2 pool of stride 1 overlaps: a Gemm after it sums products
               "pool_overlap": ("not exact", lambda rng: pool_chain(rng, 2, 1)),
               # the convolution's bias through the pool: sums of 4 biases
               "bias_pooled": ("not exact", lambda rng: pool_chain(rng, bias_before_pool=True)),
               # an overlapping average pool (stride 1) into a convolution: sums of products
               "conv": ("not exact", BUILDERS["conv"])}


def scale_reorder_chain(rng):
    """Gemm -> Relu -> BatchNormalization (a scaling by gamma / sqrt(var + eps), 53 bits) ->
    a Transpose that reorders the features -> Gemm on a (1, 4) input: the scaling stays a
    node (it folds into a Gemm across reshapes, not across a reordering)."""
    g = G(rng)
    x = g.op("Gemm", ["x", g.rand(6, 4), g.rand(6)], transB=1)
    x = g.op("Relu", [x])
    x = g.op("BatchNormalization", [x, g.const(rng.uniform(0.5, 1.5, 6)), g.rand(6),
                                    g.rand(6), g.const(rng.uniform(0.5, 2.0, 6))])
    x = g.op("Reshape", [x, g.const([1, 2, 3], np.int64)])
    x = g.op("Transpose", [x], perm=[0, 2, 1])
    x = g.op("Flatten", [x])
    x = g.op("Gemm", [x, g.rand(3, 6), g.rand(3)], transB=1)
    return g.model([("x", (1, 4))], [x])


def save_load(tmp_path, name, model):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(model, path)
    return path, load_graph(path)


def shape_of(model):
    return [tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)]


def exact_composition(graph):
    """The segments' (W, b) by rational arithmetic (fractions) on each operation's matrix,
    read through its bias-free ``linear`` map on unit vectors."""
    def frac(a):
        return [[Fraction(float(v)) for v in row] for row in np.atleast_2d(a)]

    def matmul(A, B):
        return [[sum((A[i][k] * B[k][j] for k in range(len(B)) if A[i][k] and B[k][j]),
                     Fraction(0)) for j in range(len(B[0]))] for i in range(len(A))]

    out, M, c = [], None, None
    for n in graph.nodes[1:]:
        if n.kind == "activation":
            out.append((M, c))
            M = c = None
            continue
        size_in = graph.nodes[n.inputs[0]].size
        A = frac(n.op.linear([np.eye(size_in)]).T)
        a = [Fraction(0)] * n.size if n.op.bias is None else [Fraction(float(v)) for v in n.op.bias]
        if M is None:
            M, c = A, a
        else:
            M = matmul(A, M)
            c = [sum(A[i][k] * c[k] for k in range(len(c)) if A[i][k] and c[k]) + a[i]
                 for i in range(len(a))]
    if M is not None:
        out.append((M, c))
    return out


@pytest.mark.parametrize("kind", sorted(LOWERED))
def test_lowered_weights_are_the_exact_composition(tmp_path, kind):
    """Every lowered weight and bias is exactly (as a rational number) the composition of the
    graph's operations; forward passes agree with the graph (1e-12) and onnx.reference."""
    model = LOWERED[kind](np.random.default_rng(11))
    _, g = save_load(tmp_path, kind, model)
    mlp, why = lower(g)
    assert mlp is not None, why
    exact = exact_composition(g)
    assert len(exact) == len(mlp.weights)
    for (M, c), W, b in zip(exact, mlp.weights, mlp.biases):
        assert W.shape == (len(M), len(M[0]))
        assert all(Fraction(float(W[i, j])) == M[i][j] for i in range(W.shape[0])
                   for j in range(W.shape[1]))
        assert all(Fraction(float(b[i])) == c[i] for i in range(b.size))
    assert (mlp.output_activation == "relu") == (kind == "pad_relu_out")
    X = np.random.default_rng(12).uniform(-1, 1, (20, g.input_size))
    np.testing.assert_allclose(mlp.forward(X), g.forward(X), rtol=1e-12, atol=1e-12)
    for x in X[:3]:
        np.testing.assert_allclose(onnx_outputs(model, x, shape_of(model)), mlp.forward(x),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(NOT_LOWERED))
def test_graphs_that_must_not_be_lowered(tmp_path, kind):
    why_expected, build = NOT_LOWERED[kind]
    _, g = save_load(tmp_path, kind, build(np.random.default_rng(13)))
    mlp, why = lower(g)
    assert mlp is None and why_expected in why, why


def test_compose_refuses_every_inexact_entry():
    """compose returns the exact product or raises NotExact: sums of products, two factors
    that are not powers of two, underflow, subnormal results, rounded bias sums; an exact
    case (a product by 1/16, a bias sum without rounding) is returned to the last bit."""
    def csr(a):
        return sp.csr_matrix(np.array(a, dtype=np.float64))

    third = 1.0 / 3.0
    M, b = csr([[third, 0.0], [0.0, 3.0]]), np.array([0.1, 0.0])
    P, s = compose(csr([[0.0625, 0.0], [0.0, 1.0]]), np.array([0.0, 2.0]), M, b)
    assert Fraction(float(P.toarray()[0, 0])) == Fraction(third) / 16
    assert P.toarray()[1, 1] == 3.0 and P.nnz == 2
    assert Fraction(float(s[0])) == Fraction(0.0625) * Fraction(0.1) and s[1] == 2.0
    cases = [
        (csr([[1.0, 1.0]]), None, csr([[third], [third]]), "sum of several"),  # two paths
        (csr([[0.1]]), None, csr([[third]]), "neither"),  # 0.1 * (1/3): rounded
        (csr([[2.0 ** -600]]), None, csr([[2.0 ** -600]]), "underflows"),
        (csr([[0.5]]), None, csr([[3 * 2.0 ** -1023]]), "subnormal"),
    ]
    for A, a, M_, why in cases:
        with pytest.raises(NotExact, match=why):
            compose(A, np.zeros(A.shape[0]) if a is None else a, M_, np.zeros(M_.shape[0]))
    with pytest.raises(NotExact, match="bias sum"):  # 1 + 2^-60 is rounded
        compose(csr([[1.0]]), np.array([1.0]), csr([[1.0]]), np.array([2.0 ** -60]))
    with pytest.raises(NotExact, match="bias element"):
        compose(csr([[1.0, 1.0]]), np.zeros(1), csr(np.eye(2)), np.array([0.1, 0.2]))
    assert list(power_of_two(np.array([1.0, -0.25, 3.0, 0.0, np.inf, 2.0 ** -1070]))) == \
        [True, True, False, False, False, True]


def naive_composition(graph):
    """The segments' matrices as a float64 product of the operations' matrices (what a
    lowering without the exactness check would build)."""
    out, M = [], None
    for n in graph.nodes[1:]:
        if n.kind == "activation":
            out.append(M)
            M = None
            continue
        A = n.op.linear([np.eye(graph.nodes[n.inputs[0]].size)]).T
        M = A if M is None else A @ M
    return out + ([] if M is None else [M])


def test_inexact_composition_is_not_lowered_silently(tmp_path):
    """A BatchNormalization after a Relu (a scaling by gamma / sqrt(var + eps), 53 bits), a
    reordering, then a Gemm: the float64 product differs from the exact composition in some
    entry, and the lowering refuses it (this test fails if a check lets it through)."""
    _, g = save_load(tmp_path, "scaled", scale_reorder_chain(np.random.default_rng(14)))
    assert [n.kind for n in g.nodes] == ["input", "affine", "activation", "affine", "affine",
                                         "affine"]
    assert lowered(g) is None and "not exact" in g.lowering[1]
    differs = False
    for M, (E, _) in zip(naive_composition(g), exact_composition(g)):
        differs |= any(Fraction(float(M[i, j])) != E[i][j]
                       for i in range(M.shape[0]) for j in range(M.shape[1]))
    assert differs


def test_memory_budget_keeps_the_graph_engine(tmp_path):
    _, g = save_load(tmp_path, "pad", pad_chain(np.random.default_rng(0)))
    mlp, why = lower(g, memory_budget=1000.0)
    assert mlp is None and "memory budget" in why
    assert lower(g)[0] is not None


@pytest.mark.parametrize("kind", ["pool", "pad"])
def test_crown_bound_equals_graph_engine(tmp_path, kind):
    """The dense engine's CROWN bound of the lowered MLP over a box equals the graph
    engine's (every neuron refined by CROWN: ibp off) to 1e-9 of the margin, for the same
    rows; both are float64-verified."""
    from crown_cli.engine.graph_bounds import GraphBounds
    from crown_cli.engine.input_sets import Box
    from crown_cli.verification.pipeline import Verifier

    _, g = save_load(tmp_path, kind, LOWERED[kind](np.random.default_rng(15)))
    mlp = lowered(g)
    rng = np.random.default_rng(16)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.03, x0 + 0.03
    A = rng.normal(size=(4, g.output_size))
    v = Verifier(mlp.weights, mlp.biases, mlp.activation)
    dense = v.box_lower_bounds("crown", lo, hi, A, np.zeros(4))
    graph = GraphBounds(g, *Box(lo, hi).args(), method="crown", ibp=False).lower(g.output, A)
    scale = np.abs(A @ g.forward(x0)) + 1.0
    np.testing.assert_allclose(dense, graph, rtol=0, atol=1e-9 * scale.max())
    assert np.all(dense <= A @ g.forward(x0))
    # the graph engine with interval refinement is never looser here than it claims
    assert np.all(graph_box_lower_bounds(g, lo, hi, A, np.zeros(4)) <= A @ g.forward(x0))


def spec_text(lo, hi, n_out, row, b):
    out = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    out += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    for i, (a, z) in enumerate(zip(lo, hi)):
        out += [f"(assert (>= X_{i} {float(a)!r}))", f"(assert (<= X_{i} {float(z)!r}))"]
    terms = " ".join(f"(* {float(c)!r} Y_{j})" for j, c in enumerate(row) if c != 0)
    out.append(f"(assert (<= (+ {terms}) {float(b)!r}))")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("kind,seed", [("pool", 3), slow_if(True, "pad", 3)])
def test_verdicts_equal_milp(tmp_path, kind, seed):
    """On lowered conv graphs the full pipeline (alpha-CROWN, branch and bound) decides
    what the exact MILP of the graph says: b just below the minimum is unsat, b above it sat
    (the counterexample confirmed by the graph's float64 forward pass and onnx.reference)."""
    model = LOWERED[kind](np.random.default_rng(seed))
    _, g = save_load(tmp_path, kind, model)
    verifier = graph_verifier(g, attack_restarts=16, attack_steps=30)
    assert isinstance(verifier, LoweredVerifier)
    rng = np.random.default_rng(seed + 1)
    x0 = rng.uniform(-1, 1, g.input_size)
    lo, hi = x0 - 0.15, x0 + 0.15
    row = rng.normal(size=g.output_size)
    m, xm = graph_min(g, lo, hi, row)
    spread = float(row @ g.forward(x0)) - m
    assert spread > 0
    crown_only = GraphVerifier(g, attack_restarts=16, attack_steps=30, bab=False)
    b = m - 1e-6 * (1 + abs(m))
    prop = parse_vnnlib_text(spec_text(lo, hi, g.output_size, row, b), "p", g.input_size,
                             g.output_size)
    v = verifier.verify(prop, 30.0)
    assert v.result == "unsat", (kind, v)
    # the property needs more than the bounds: branch and bound proved it
    assert crown_only.verify(prop, 30.0).result == "unknown"
    b = m + 0.2 * spread
    prop = parse_vnnlib_text(spec_text(lo, hi, g.output_size, row, b), "p", g.input_size,
                             g.output_size)
    v = verifier.verify(prop, 30.0)
    assert v.result == "sat", (kind, v)
    assert np.all(v.x >= np.nextafter(lo, -np.inf)) and np.all(v.x <= np.nextafter(hi, np.inf))
    assert row @ g.forward(v.x) <= b
    np.testing.assert_array_equal(v.y, g.forward(v.x))
    np.testing.assert_allclose(onnx_outputs(model, v.x, shape_of(model)), v.y, rtol=1e-4,
                               atol=1e-4)


@pytest.mark.slow  # slow tier since 2026-11-29 (default tier near 10 min cold)
def test_load_network_cli_and_api_routes(tmp_path):
    """load_network: an MLP for a dense chain, a Graph with its lowered MLP for a conv chain,
    a Graph without for a max pool; inspect says which engine; verify runs alpha-crown and
    branch and bound on the lowered graph; a property of the wrong size is one line, exit 2."""
    import crown_cli
    from graph_models import dense_chain

    chain, _ = save_load(tmp_path, "chain", dense_chain(np.random.default_rng(0)))
    assert isinstance(load_network(chain).dense, MLP)
    path, _ = save_load(tmp_path, "pad", pad_chain(np.random.default_rng(1)))
    net = load_network(path)
    assert isinstance(net, Graph) and isinstance(net.lowering[0], MLP)
    pool, _ = save_load(tmp_path, "mp", BUILDERS["conv_maxpool"](np.random.default_rng(1)))
    assert load_network(pool).lowering[0] is None
    r = CliRunner().invoke(cli, ["inspect", "--model", path])
    assert r.exit_code == 0 and "runs on the dense engine: lowered to 40-48-24-3" in r.output
    r = CliRunner().invoke(cli, ["inspect", "--model", pool])
    assert r.exit_code == 0 and "runs on the graph engine (not lowered: node" in r.output
    rng = np.random.default_rng(2)
    x0 = rng.uniform(-1, 1, 40)
    row = rng.normal(size=3)
    m, _ = graph_min(net, x0 - 0.15, x0 + 0.15, row)
    spec = os.path.join(str(tmp_path), "p.vnnlib")
    with open(spec, "w") as fh:  # just below the exact minimum: needs branch and bound
        fh.write(spec_text(x0 - 0.15, x0 + 0.15, 3, row, m - 1e-6 * (1 + abs(m))))
    r = CliRunner().invoke(cli, ["verify", "--model", path, "--spec", spec, "--timeout", "30",
                                 "-v"])
    assert r.exit_code == 0, r.output
    assert "unsat" in r.output.splitlines() and "alpha-crown: 0 of 1" in r.output, r.output
    bad = os.path.join(str(tmp_path), "bad.vnnlib")
    with open(bad, "w") as fh:
        fh.write(spec_text(x0[:5] - 1e-3, x0[:5] + 1e-3, 3, row, 0.0))
    r = CliRunner().invoke(cli, ["verify", "--model", path, "--spec", bad, "--timeout", "5"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "bad.vnnlib" in r.output
    v = crown_cli.verify(path, spec, timeout=30)
    assert v.result == "unsat" and v.stage != "crown"
    hwc = x0.reshape(2, 5, 4).transpose(1, 2, 0).reshape(-1)  # crown's (H, W, C) image order
    cert = crown_cli.certify(path, hwc, method="alpha-crown")
    assert cert.status == "certified" and cert.predicted == int(np.argmax(net.forward(x0)))


def test_check_sat_rows_script(tmp_path):
    """scripts/check_sat_rows.py confirms a true counterexample of a result row with a float64
    onnx.reference run of the model and fails a point that does not violate."""
    import csv
    import importlib.util

    from conftest import ROOT

    spec_ = importlib.util.spec_from_file_location(
        "check_sat_rows", os.path.join(ROOT, "scripts", "check_sat_rows.py"))
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    model = pool_chain(np.random.default_rng(21))
    path, g = save_load(tmp_path, "pool", model)
    x0 = np.random.default_rng(22).uniform(-1, 1, g.input_size)
    row = np.eye(3)[0]
    y0 = float(g.forward(x0)[0])
    with open(os.path.join(str(tmp_path), "p.vnnlib"), "w") as fh:
        fh.write(spec_text(x0 - 0.01, x0 + 0.01, 3, row, y0 + 1e-6))
    for x, want in ((x0, 0), (x0 - 1.0, 1)):  # x0 - 1 lies outside the box
        out = os.path.join(str(tmp_path), "rows.csv")
        with open(out, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["instance", "onnx", "vnnlib", "verdict", "counterexample"])
            w.writerow(["pool:p", "pool.onnx", "p.vnnlib", "sat", " ".join(repr(float(v)) for v in x)])
        assert mod.main([out]) == want


def test_bounder_sparse_weights_give_the_dense_bounds(tmp_path, monkeypatch):
    """Branch and bound multiplies mostly-zero weights (lowered convolutions) as CSR matrices:
    the same float32 estimates (to float32 rounding) and float64 bounds (to 1e-12) as the dense
    products, their gradients, and the same per-domain hidden-layer bounds."""
    from crown_cli.verification.bab import bounder as bmod
    from crown_cli.graph import ops as dmod  # sparse_enough's thresholds

    _, g = save_load(tmp_path, "pad", pad_chain(np.random.default_rng(31)))
    mlp = lowered(g)
    rng = np.random.default_rng(32)
    x0 = rng.uniform(-1, 1, g.input_size)
    A = rng.normal(size=(2, g.output_size))
    out = {}
    for mode, size in (("dense", 2 ** 40), ("sparse", 0)):
        monkeypatch.setattr(dmod, "SPARSE_MIN_SIZE", size)
        monkeypatch.setattr(dmod, "SPARSE_PRODUCT_DENSITY", 0.9)
        bd = bmod.Bounder(bmod.ReluSplitProblem(mlp.weights, mlp.biases, x0 - 0.2, x0 + 0.2, A,
                                                  np.zeros(2)))
        assert bd.nU > 0
        assert (mode == "sparse") == any(not isinstance(w, np.ndarray) for w in bd.Wmul)
        split = rng.integers(-1, 2, size=(3, bd.nU)).astype(np.int8) if mode == "dense" \
            else out["dense"][0]
        alpha = np.full((3, 2, bd.nU), 0.5, np.float32)
        beta = np.full((3, 2, bd.nU), 0.1, np.float32)
        v64 = bd.evaluate(split, alpha, beta, np.float64)
        v32, state = bd.evaluate(split, alpha, beta, np.float32, keep=True)
        gA, gB = bd.gradient(state)
        # per-domain hidden-layer bounds: their steps through the layers are CSR too
        rl, ru = bd.root_domain_bounds()
        t = bd.tighten(split, np.tile(rl, (3, 1)), np.tile(ru, (3, 1)), np.zeros(3, np.int64))
        assert (mode == "sparse") == any(not isinstance(w, np.ndarray) for w in bd._Wstep)
        out[mode] = (split, v64, t[1], t[2], v32, gA, gB)
    d, s = out["dense"], out["sparse"]
    for a, b in zip(s[1:4], d[1:4]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert np.any(d[2] > rl) and np.any(d[3] < ru)  # the splits narrowed some bounds
    for a, b in zip(s[4:], d[4:]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
