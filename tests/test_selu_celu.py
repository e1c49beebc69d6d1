"""ELU with a scale above 1 (ONNX Selu's 1.6733: a concave kink at 0) and the ONNX operators
built on ELU: Selu (``gamma elu_alpha(x)``) and Celu (``alpha elu_1(x / alpha)``).

The ELU lines (engine/relaxations/extra.py) and the node's interval (engine/node_rules.py)
hold against 40-digit mpmath and on dense float grids, over intervals on either side of 0,
across it and out in the tails; the lines are the least-area ones (no valid line of another
slope has a smaller area); the loaders give onnx.reference's values and bounds that hold;
an MLP file with such an ELU is still refused (exit 2), and a graph with one is not lowered
to the MLP engine."""
import os

import numpy as np
import pytest
from click.testing import CliRunner

from crown_cli.activations import apply_activation
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.engine.node_rules import activation_interval
from crown_cli.engine.relaxations.extra import elu_relaxation
from crown_cli.errors import InputError
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.graph.ops import ActivationOp
from conftest import slow_if
from graph_models import G

SELU_ALPHA = 1.67326319217681884765625  # float32, as ONNX's default attribute
SELU_GAMMA = 1.05070102214813232421875
ALPHAS = [SELU_ALPHA, 1.05, 4.0]


def _intervals(seed, n):
    """n intervals: on the negative side, the positive side, across 0 (both sides longer),
    tiny around 0, and wide ones reaching -700 and 300."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=n) * rng.choice([0.01, 1.0, 3.0, 12.0, 40.0], size=n)
    w = np.abs(rng.normal(size=n)) * rng.choice([0.0, 1e-9, 0.1, 1.0, 5.0, 30.0], size=n)
    l, u = c - w, c + w
    k = n // 5  # across 0 with either side the longer one, and around 0 only
    l[:k] = -10.0 ** rng.uniform(-8, 2.5, k)
    u[:k] = 10.0 ** rng.uniform(-8, 2.5, k)
    l[k:k + 4], u[k:k + 4] = [-700.0, -1e-300, -3.0, -1.0], [300.0, 1e-300, 0.0, 1.0]
    return np.ascontiguousarray(l), np.ascontiguousarray(u)


def _interval(alpha, l, u):
    z = np.maximum(np.abs(l), np.abs(u))
    return activation_interval(ActivationOp("elu", alpha), "crown", l, u, z)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_elu_above_one_lines_and_range_hold_in_exact_arithmetic(alpha):
    """At 33 points of each interval, and where the lines touch ELU (the end-points, 0, the
    point where alpha e^t is the lower slope) with their float neighbours, the real ELU
    (mpmath, 40 digits, with the float alpha) lies between the lines and inside the node's
    interval."""
    import mpmath

    mpmath.mp.dps = 40
    l, u = _intervals(int(alpha * 100), 200)
    aU, bU, aL, bL = elu_relaxation(l, u, alpha)
    (_, lo, hi) = _interval(alpha, l, u)
    A = mpmath.mpf(alpha)
    for i in range(l.size):
        touch = [l[i], u[i], 0.0]
        if 0.0 < aL[i] < alpha:
            touch.append(np.log(aL[i] / alpha))
        touch = np.array(touch)
        zs = np.concatenate([np.linspace(l[i], u[i], 33), touch, np.nextafter(touch, -np.inf),
                             np.nextafter(touch, np.inf)])
        for z in zs[(zs >= l[i]) & (zs <= u[i])]:
            Z = mpmath.mpf(float(z))
            f = Z if Z > 0 else A * mpmath.expm1(Z)
            assert mpmath.mpf(aL[i]) * Z + mpmath.mpf(bL[i]) <= f, (l[i], u[i], z)
            assert f <= mpmath.mpf(aU[i]) * Z + mpmath.mpf(bU[i]), (l[i], u[i], z)
            assert mpmath.mpf(lo[i]) <= f <= mpmath.mpf(hi[i]), (l[i], u[i], z)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_elu_above_one_lines_hold_on_a_dense_grid_and_the_range_is_exact(alpha):
    """On 2001 float points of each interval plus 0 and its neighbours, against the forward
    pass's ELU: no crossing (exact float comparison); the node's interval is [f(l), f(u)]
    within 8 ulps (the exact range, rounded outward)."""
    l, u = _intervals(7, 800)
    aU, bU, aL, bL = elu_relaxation(l, u, alpha)
    (_, lo, hi) = _interval(alpha, l, u)
    fl, fu = apply_activation("elu", l, alpha), apply_activation("elu", u, alpha)
    ulp = 8 * np.finfo(float).eps
    assert np.all(lo <= fl) and np.all(fl - lo <= ulp * np.abs(fl) + 1e-300)
    assert np.all(hi >= fu) and np.all(hi - fu <= ulp * np.abs(fu) + 1e-300)
    for i in range(l.size):
        z = np.concatenate([np.linspace(l[i], u[i], 2001), [0.0, 5e-324, -5e-324]])
        z = z[(z >= l[i]) & (z <= u[i])]
        f = apply_activation("elu", z, alpha)
        assert np.all(aL[i] * z + bL[i] <= f) and np.all(f <= aU[i] * z + bU[i]), (l[i], u[i])


def _least_offset(f, z, k, upper):
    """The tightest intercept of a line of slope k above (below) the sampled f."""
    return np.max(f - k * z) if upper else np.min(f - k * z)


@pytest.mark.parametrize("alpha", [SELU_ALPHA, slow_if(True, 4.0)])
def test_elu_above_one_lines_are_least_area(alpha):
    """Across 0 each line's area (its value at the midpoint) is, up to sampling, the least of
    any valid line of 400 slopes spanning [0, alpha] (the lines' intercepts taken on a grid
    that holds the kink and the candidates' touch points only approximately, so 1e-6 of
    slack)."""
    rng = np.random.default_rng(1)
    l = -10.0 ** rng.uniform(-2, 1.5, 120)
    u = 10.0 ** rng.uniform(-2, 1.5, 120)
    aU, bU, aL, bL = elu_relaxation(l, u, alpha)
    slopes = np.linspace(0.0, alpha, 400)
    for i in range(l.size):
        z = np.concatenate([np.linspace(l[i], u[i], 20001), [0.0]])
        f = apply_activation("elu", z, alpha)
        m = 0.5 * (l[i] + u[i])
        best_up = min(k * m + _least_offset(f, z, k, True) for k in slopes)
        best_lo = max(k * m + _least_offset(f, z, k, False) for k in slopes)
        tol = 1e-6 * (1.0 + abs(u[i]) + abs(l[i]))
        assert aU[i] * m + bU[i] <= best_up + tol, (l[i], u[i])
        assert aL[i] * m + bL[i] >= best_lo - tol, (l[i], u[i])


# ----------------------------------------------------------------------------- the loaders

def _one_op(op, attrs, scale=2.0, seed=0):
    """Gemm (4 -> 5) -> op -> Gemm (5 -> 3)."""
    g = G(np.random.default_rng(seed))
    h = g.op("Gemm", ["x", g.rand(5, 4, scale=scale), g.rand(5)], transB=1)
    e = g.op(op, [h], **attrs)
    y = g.op("Gemm", [e, g.rand(3, 5), g.rand(3)], transB=1)
    return g.model([("x", (1, 4))], [y]), h


def _save(tmp_path, model, name="m.onnx"):
    import onnx

    path = os.path.join(tmp_path, name)
    onnx.save(model, path)
    return path


def _formula(op, attrs, z):
    """ONNX's definitions of Selu and Celu, float64."""
    z = np.asarray(z, np.float64)
    if op == "Selu":
        a, g = attrs.get("alpha", SELU_ALPHA), attrs.get("gamma", SELU_GAMMA)
        return np.where(z > 0.0, g * z, g * a * np.expm1(np.minimum(z, 0.0)))
    a = attrs.get("alpha", 1.0)
    return np.maximum(0.0, z) + np.minimum(0.0, a * np.expm1(z / a))


CASES = [("Selu", {}), ("Selu", {"alpha": 0.5, "gamma": 2.0}), ("Selu", {"alpha": 3.0}),
         ("Celu", {}), ("Celu", {"alpha": 0.7}), ("Celu", {"alpha": 2.5})]


@pytest.mark.parametrize("op,attrs", CASES, ids=[f"{o}-{sorted(a.items())}" for o, a in CASES])
def test_selu_and_celu_load_with_onnx_values_and_bounds_that_hold(tmp_path, op, attrs):
    """The forward pass equals ONNX's formula in float64 (to 1e-12) and onnx.reference's
    float32 values (to float32 rounding); one ELU node (scale alpha for Selu, 1 for Celu);
    CROWN's bounds on a box hold at 2000 sampled points and its corners; the graph is not
    lowered where alpha > 1 (the MLP engine takes ELU scales up to 1 only)."""
    import onnx.numpy_helper as nh
    from onnx.reference import ReferenceEvaluator

    from crown_cli.graph.lower import lowered

    attrs = {k: float(np.float32(v)) for k, v in attrs.items()}
    model, _ = _one_op(op, attrs)
    graph = load_graph(_save(tmp_path, model))
    acts = [n.op for n in graph.nodes if n.kind == "activation"]
    alpha = attrs.get("alpha", SELU_ALPHA) if op == "Selu" else 1.0
    assert [(a.name, a.alpha) for a in acts] == [("elu", alpha)]
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 4)) * 2.0
    inits = {t.name: nh.to_array(t).astype(np.float64) for t in model.graph.initializer}
    g1, g2 = model.graph.node[0], model.graph.node[2]
    h = x @ inits[g1.input[1]].T + inits[g1.input[2]]
    want = _formula(op, attrs, h) @ inits[g2.input[1]].T + inits[g2.input[2]]
    np.testing.assert_allclose(graph.forward(x), want, rtol=1e-12, atol=1e-12)
    assert (h < 0).any() and (h > 0).any()
    ref = ReferenceEvaluator(model)
    x32 = x.astype(np.float32)
    got32 = np.concatenate([ref.run(None, {"x": r[None]})[0] for r in x32])
    np.testing.assert_allclose(graph.forward(x32.astype(np.float64)), got32, rtol=1e-5,
                               atol=1e-5)
    lo, hi = x[0] - 0.7, x[0] + 0.7
    blo, bhi = GraphBounds(graph, *Box(lo, hi).args()).bounds()
    xs = rng.uniform(lo, hi, size=(2000, 4))
    xs[:16] = np.array(np.meshgrid(*zip(lo, hi))).reshape(4, -1).T
    ys = graph.forward(xs)
    assert np.all(ys >= blo) and np.all(ys <= bhi)
    assert np.all(bhi - blo <= 3.0 * np.ptp(ys, axis=0))  # not vacuous
    assert (lowered(graph) is None) == (alpha > 1.0)


def test_selu_celu_of_constants_are_folded():
    """Selu and Celu of a constant: a constant (ONNX's values), no node."""
    from onnx import TensorProto, helper, numpy_helper

    c = np.array([-3.0, -0.5, 0.0, 2.0], np.float32)
    nodes = [helper.make_node("Selu", ["c"], ["s"]), helper.make_node("Celu", ["c"], ["t"],
                                                                     alpha=0.5),
             helper.make_node("Add", ["s", "t"], ["st"]), helper.make_node("Add", ["x", "st"],
                                                                          ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4])], initializer=[numpy_helper.from_array(c, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        g = load_graph(_save(d, model))
    assert not [n for n in g.nodes if n.kind == "activation"]
    want = _formula("Selu", {}, c) + _formula("Celu", {"alpha": 0.5}, c)
    np.testing.assert_allclose(g.forward(np.zeros((1, 4)))[0], want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("op,attrs,words", [
    ("Celu", {"alpha": 0.0}, "alpha 0 is not supported (only alpha > 0)"),
    ("Celu", {"alpha": -1.0}, "alpha -1 is not supported (only alpha > 0)"),
    ("Selu", {"alpha": 0.0}, "alpha 0 is outside the range the bounds hold for (0, inf)"),
    ("Selu", {"alpha": -2.0}, "alpha -2 is outside the range"),
    ("Elu", {"alpha": -0.5}, "alpha -0.5 is outside the range"),
])
def test_selu_celu_bad_parameters_are_refused_in_one_line(tmp_path, op, attrs, words):
    model, _ = _one_op(op, attrs)
    with pytest.raises(InputError) as err:
        load_graph(_save(tmp_path, model))
    msg = str(err.value)
    assert words in msg and op in msg and "\n" not in msg


def test_mlp_file_with_elu_above_one_is_refused_with_exit_2(tmp_path):
    """The dense MLP path is unchanged: an NPZ MLP with ELU scale 1.67 is refused (exit 2,
    one line, naming the range and where such an ELU is taken)."""
    from crown_cli.cli import cli
    from crown_cli.io.models import save_npz

    rng = np.random.default_rng(0)
    path = str(tmp_path / "elu.npz")
    save_npz(path, [rng.normal(size=(5, 4)), rng.normal(size=(3, 5))], [np.zeros(5),
                                                                         np.zeros(3)],
             "elu", SELU_ALPHA)
    res = CliRunner().invoke(cli, ["certify", "--model", path])
    assert res.exit_code == 2, res.output
    line = [ln for ln in res.output.splitlines() if ln.startswith("crown: error:")]
    assert line == [f"crown: error: {path}: elu parameter alpha={SELU_ALPHA} outside the "
                    "supported range (0.0, 1.0] (as a node of an ONNX graph: (0, inf))"]


# ----------------------------------------------------------------------------- GELU's tanh chain

K32 = float(np.float32(0.7978845608028654))  # the exporters' float32 sqrt(2 / pi), 0.044715
C32 = float(np.float32(0.044715))


def _tanh_chain(g, h, form, k=K32, c=C32):
    """GELU's tanh form of h as exporters write it: ``torch`` (TorchScript, opset 17:
    Mul(h, h), Mul(h, .), Mul(c, .), Add(h, .), Mul(k, .), Tanh, Add(1, .), Mul(h, .),
    Mul(0.5, .)) or ``pow`` (Pow(h, 3), the other operand orders, Mul(Mul(h, 0.5), .))."""
    if form == "torch":
        cube = g.op("Mul", [h, g.op("Mul", [h, h])])
        inner = g.op("Add", [h, g.op("Mul", [g.const(np.array(c)), cube])])
        t = g.op("Tanh", [g.op("Mul", [g.const(np.array(k)), inner])])
        a1 = g.op("Add", [g.const(np.array(1.0)), t])
        return g.op("Mul", [g.const(np.array(0.5)), g.op("Mul", [h, a1])])
    cube = g.op("Pow", [h, g.const(np.array(3.0))])
    inner = g.op("Add", [g.op("Mul", [cube, g.const(np.array(c))]), h])
    t = g.op("Tanh", [g.op("Mul", [inner, g.const(np.array(k))])])
    a1 = g.op("Add", [t, g.const(np.array(1.0))])
    return g.op("Mul", [g.op("Mul", [h, g.const(np.array(0.5))]), a1])


def _chain_model(form, n=3, **kw):
    g = G(np.random.default_rng(5))
    h = g.op("Gemm", ["x", g.rand(n, 2, scale=1.5), g.rand(n)], transB=1)
    y = g.op("Gemm", [_tanh_chain(g, h, form, **kw), g.rand(2, n), g.rand(2)], transB=1)
    return g.model([("x", (1, 2))], [y]), g


def _file_gelu_tanh(z, k=K32, c=C32):
    """The chain's function with the file's constants, float64 (sigmoid form, no
    cancellation)."""
    with np.errstate(over="ignore"):
        return z / (1.0 + np.exp(-2.0 * k * (z + c * z ** 3)))


@pytest.mark.parametrize("form", ["torch", "pow"])
def test_torchscript_gelu_tanh_chain_fuses_into_one_node(tmp_path, form, monkeypatch):
    """The chain becomes one gelu_tanh node whose allowance (about 1e-8) bounds its distance
    to the chain's function with the file's float32 constants (checked on a dense grid to
    |z| = 40); the fused graph's forward pass equals the unfused one's within it; CROWN's
    output bounds hold at sampled points and are at least 2x tighter than the unfused
    graph's (products of data, McCormick's planes)."""
    import crown_cli.graph.onnx_graph as og

    model, _ = _chain_model(form)
    path = _save(tmp_path, model)
    fused = load_graph(path)
    acts = [n.op for n in fused.nodes if n.kind == "activation"]
    assert [a.name for a in acts] == ["gelu_tanh"] and 5e-9 < acts[0].alpha < 3e-8
    assert not [n for n in fused.nodes if n.kind == "product"]
    E = acts[0].alpha
    z = np.linspace(-40.0, 40.0, 400001)
    gap = np.abs(apply_activation("gelu_tanh", z) - _file_gelu_tanh(z))
    assert gap.max() <= E and gap.max() >= E / 20  # sound, and not loose by much
    monkeypatch.setattr(og, "fuse_activations", lambda *a: 0)
    plain = load_graph(path)
    names = [n.op.name for n in plain.nodes if n.kind == "activation"]
    assert "tanh" in names and "gelu_tanh" not in names  # (the cube: Pow's node, or products)
    x = np.random.default_rng(0).uniform(-3.0, 3.0, size=(500, 2))
    np.testing.assert_allclose(fused.forward(x), plain.forward(x), rtol=0, atol=3 * E)
    lo, hi = np.array([-0.4, 0.1]), np.array([0.6, 1.1])
    flo, fhi = GraphBounds(fused, *Box(lo, hi).args()).bounds()
    plo, phi = GraphBounds(plain, *Box(lo, hi).args()).bounds()
    xs = np.random.default_rng(1).uniform(lo, hi, size=(3000, 2))
    xs[:4] = np.array(np.meshgrid(*zip(lo, hi))).reshape(2, -1).T
    ys = plain.forward(xs)
    assert np.all(ys >= flo) and np.all(ys <= fhi)  # the file's function within the fused's
    assert np.all(ys >= plo) and np.all(ys <= phi)
    # 2.2-3.1x measured where this was written
    assert np.all(2.0 * (fhi - flo) <= phi - plo), (fhi - flo, phi - plo)


def test_gelu_tanh_allowance_widens_lines_and_range():
    """The allowance moves both intercepts and the node's interval out by at least itself,
    and the widened lines hold for the file's function (float32 constants, mpmath)."""
    import mpmath

    from crown_cli.engine.relaxations import self_gated as sg
    from crown_cli.graph.onnx_fusion import gelu_tanh_allowance

    E = gelu_tanh_allowance(K32, C32)
    assert gelu_tanh_allowance(0.7978845608028654, 0.044715) < 1e-14
    l, u = np.array([-3.0, -0.5, 0.2, -40.0]), np.array([-1.0, 0.7, 2.0, 40.0])
    aU, bU, aL, bL = sg.gelu_tanh_relaxation(l, u)
    wU, wbU, wL, wbL = sg.gelu_tanh_relaxation(l, u, E)
    assert np.array_equal(aU, wU) and np.array_equal(aL, wL)
    assert np.all(wbU - bU >= E) and np.all(bL - wbL >= E)
    z = np.maximum(np.abs(l), np.abs(u))
    _, lo, hi = activation_interval(ActivationOp("gelu_tanh"), "crown", l, u, z)
    _, wlo, whi = activation_interval(ActivationOp("gelu_tanh", E), "crown", l, u, z)
    assert np.all(lo - wlo >= E) and np.all(whi - hi >= E)
    mpmath.mp.dps = 40
    k, c = mpmath.mpf(K32), mpmath.mpf(C32)
    for i in range(l.size):
        for t in np.linspace(l[i], u[i], 41):
            T = mpmath.mpf(float(t))
            f = T / (1 + mpmath.exp(-2 * k * (T + c * T ** 3)))
            assert mpmath.mpf(wL[i]) * T + mpmath.mpf(wbL[i]) <= f <= \
                mpmath.mpf(wU[i]) * T + mpmath.mpf(wbU[i])
            assert mpmath.mpf(wlo[i]) <= f <= mpmath.mpf(whi[i])


@pytest.mark.parametrize("case", ["read_elsewhere", "wrong_constant", "cube_of_other"])
def test_gelu_tanh_chain_not_fused(tmp_path, case):
    """Left as written where the Tanh's output is also a graph output, where k is off by
    more than float32's rounding (1e-4 relative), or where the cube is not of h."""
    if case == "wrong_constant":
        model, _ = _chain_model("torch", k=K32 * (1.0 + 1e-4))
    else:
        g = G(np.random.default_rng(5))
        h = g.op("Gemm", ["x", g.rand(3, 2), g.rand(3)], transB=1)
        h2 = g.op("Gemm", ["x", g.rand(3, 2), g.rand(3)], transB=1)
        if case == "cube_of_other":
            cube = g.op("Mul", [h, g.op("Mul", [h2, h2])])
            inner = g.op("Add", [h, g.op("Mul", [g.const(np.array(C32)), cube])])
            t = g.op("Tanh", [g.op("Mul", [g.const(np.array(K32)), inner])])
            y = g.op("Mul", [g.const(np.array(0.5)), g.op("Mul", [h, g.op(
                "Add", [g.const(np.array(1.0)), t])])])
            outs = [y]
        else:
            y = _tanh_chain(g, h, "torch")
            t = next(n.output[0] for n in g.nodes if n.op_type == "Tanh")
            outs = [y, t]
        model = g.model([("x", (1, 2))], outs)
    graph = load_graph(_save(tmp_path, model))
    assert [n.op.name for n in graph.nodes if n.kind == "activation"] == ["tanh"]


@pytest.mark.parametrize("fused", [True, False], ids=["tanh_chain", "onnx_gelu"])
def test_sign_check_carries_the_allowance(tmp_path, fused):
    """graph/sign_check: a Sign after a fused tanh chain is undecided where its input is
    within the allowance (about 1e-8, times the Gemm's weights) of 0, decided farther out;
    after ONNX's own Gelu (no allowance) 1e-9 is far outside the forward pass's rounding."""
    from crown_cli.graph.sign_check import decided

    g = G(np.random.default_rng(5))
    h = g.op("Gemm", ["x", g.rand(3, 2), g.rand(3)], transB=1)
    act = _tanh_chain(g, h, "torch") if fused else g.op("Gelu", [h], approximate="tanh")
    s = g.op("Sign", [g.op("Gemm", [act, g.const(np.ones((1, 3))), g.const(np.zeros(1))],
                           transB=1)])
    graph = load_graph(_save(tmp_path, g.model([("x", (1, 2))], [s], opset=20)))
    acts = [n for n in graph.nodes if n.kind == "activation"]
    assert [n.op.name for n in acts] == ["gelu_tanh", "sign"]
    assert (acts[0].op.alpha is not None) == fused
    x = np.zeros((3, 2))
    _, vals = graph.forward(x, return_all=True)
    z = graph.nodes.index(acts[1])
    j = graph.nodes[z].inputs[0]
    vals = list(vals)
    vals[j] = np.array([[1e-9], [-1e-9], [1e-6]])  # the Sign's input, as if computed so
    assert decided(graph, vals).tolist() == ([False, False, True] if fused else [True] * 3)
