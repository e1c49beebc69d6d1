"""Forward linear bounds (engine/graph_forward.py, ``GraphBounds(intermediate="forward")``):
every node's interval encloses its sampled values on the shared test graphs, and the
rounding allowance covers the float arithmetic, checked in exact rational arithmetic."""
import itertools
import os
from fractions import Fraction as F

import numpy as np
import onnx
import pytest

from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.graph_forward import ForwardPass, supported
from crown_cli.engine.input_sets import Box
from crown_cli.graph.onnx_graph import load_graph
from graph_models import BUILDERS, G

KINDS = sorted(k for k in BUILDERS if k != "conv_maxpool")


def _graph(tmp_path, model, name="m"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(model, path)
    return load_graph(path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("qcode", [0, 1, "box"])
def test_forward_intervals_enclose_sampled_values(tmp_path, kind, qcode):
    g = _graph(tmp_path, BUILDERS[kind](np.random.default_rng(1)), kind)
    assert supported(g)
    rng = np.random.default_rng(2)
    x0 = rng.uniform(-1, 1, g.input_size)
    if qcode == "box":
        box = Box(x0 - rng.uniform(0, 0.2, x0.size), x0 + rng.uniform(0, 0.2, x0.size))
        gb = GraphBounds(g, *box.args(), intermediate="forward")
        xs = rng.uniform(box.lo, box.hi, size=(2000, x0.size))
        xs[:500] = np.where(rng.random((500, x0.size)) < 0.5, box.lo, box.hi)
    else:
        eps = 0.15 if qcode == 0 else 0.3
        gb = GraphBounds(g, x0, eps, qcode, intermediate="forward")
        dirs = rng.uniform(-1, 1, size=(2000, x0.size))
        if qcode == 1:
            dirs /= np.maximum(1.0, np.linalg.norm(dirs, axis=1, keepdims=True))
        xs = x0 + eps * dirs
    y, vals = g.forward(xs, return_all=True)
    for i, v in enumerate(vals):
        assert np.all(v >= gb.lo[i]) and np.all(v <= gb.hi[i]), g.nodes[i].name
    lo, hi = gb.bounds()
    assert np.all(y >= lo) and np.all(y <= hi)
    # not vacuous: within a few times the bounds with back-substituted intermediate bounds
    args = box.args() if qcode == "box" else (x0, eps, qcode)
    clo, chi = GraphBounds(g, *args).bounds()
    assert np.all(hi - lo <= 3 * (chi - clo) + 1e-9)


def test_max_pool_graphs_have_no_forward_rule(tmp_path):
    g = _graph(tmp_path, BUILDERS["conv_maxpool"](np.random.default_rng(1)))
    with pytest.raises(ValueError, match="forward rule"):
        GraphBounds(g, np.zeros(g.input_size), 0.1, 0, intermediate="forward")


def _exact_functions(g, fp):
    """The forward functions in exact arithmetic, node by node, with the same lines and
    planes (their float values taken as exact): per node (L, U) lists of rows of Fractions."""
    from crown_cli.graph.ops import ActivationOp, Dense, InputOp, Product

    d, out = g.input_size, {}
    for i, n in enumerate(g.nodes):
        if isinstance(n.op, InputOp):
            rows = [[F(int(k == n.op.offset + j)) for k in range(d + 1)] for j in range(n.size)]
            out[i] = (rows, rows)
        elif isinstance(n.op, Dense):
            W, b = np.asarray(n.op.W), n.op.bias
            Li, Ui = out[n.inputs[0]]
            L, U = [], []
            for r in range(W.shape[0]):
                lo = [F(0)] * (d + 1)
                up = [F(0)] * (d + 1)
                for c in range(W.shape[1]):
                    w = F(float(W[r, c]))
                    a, bb = (Li[c], Ui[c]) if w >= 0 else (Ui[c], Li[c])
                    lo = [x + w * y for x, y in zip(lo, a)]
                    up = [x + w * y for x, y in zip(up, bb)]
                lo[d] += F(float(b[r]))
                up[d] += F(float(b[r]))
                L.append(lo)
                U.append(up)
            out[i] = (L, U)
        elif isinstance(n.op, ActivationOp):
            ln = fp.gb.lines[i]
            Li, Ui = out[n.inputs[0]]
            L, U = [], []
            for k in range(n.size):
                aL, aU = F(float(ln.lower[k])), F(float(ln.upper[k]))
                bL = F(0) if ln.lower_icpt is None else F(float(ln.lower_icpt[k]))
                bU = F(0) if ln.upper_icpt is None else F(float(ln.upper_icpt[k]))
                lo = [aL * x for x in (Li[k] if aL >= 0 else Ui[k])]
                up = [aU * x for x in (Ui[k] if aU >= 0 else Li[k])]
                lo[d] += bL
                up[d] += bU
                L.append(lo)
                U.append(up)
            out[i] = (L, U)
        else:
            assert isinstance(n.op, Product)
            a, b, icL, icU = fp.gb.planes[i]
            (Lx, Ux), (Ly, Uy) = out[n.inputs[0]], out[n.inputs[1]]
            L, U = [], []
            for k in range(n.size):
                ak, bk = F(float(a[k])), F(float(b[k]))
                lo = [ak * p + bk * q for p, q in zip(Lx[k] if ak >= 0 else Ux[k],
                                                        Ly[k] if bk >= 0 else Uy[k])]
                up = [ak * p + bk * q for p, q in zip(Ux[k] if ak >= 0 else Lx[k],
                                                        Uy[k] if bk >= 0 else Ly[k])]
                lo[d] += F(float(icL[k]))
                up[d] += F(float(icU[k]))
                L.append(lo)
                U.append(up)
            out[i] = (L, U)
    return out


def _awkward_graph(tmp_path, mix):
    """x (3) -> Gemm h (4) -> Relu -> Gemm k (4) -> mix(g, k, h) (4) -> Gemm (2): weights and
    biases of awkward floats (seed 5), for the exact-arithmetic allowance tests."""
    rng = np.random.default_rng(5)
    g = G(rng)
    h = g.op("Gemm", ["x", g.const(rng.normal(size=(4, 3)) / 3), g.const(rng.normal(size=4) / 7)],
             transB=1)
    r = g.op("Relu", [h])
    k = g.op("Gemm", [r, g.const(rng.normal(size=(4, 4)) / 3), g.const(rng.normal(size=4) / 7)],
             transB=1)
    m = mix(g, k, h)
    out = g.op("Gemm", [m, g.const(rng.normal(size=(2, 4)) / 3), g.const(rng.normal(size=2))],
               transB=1)
    return _graph(tmp_path, g.model([("x", (1, 3))], [out]))


def test_rounding_allowance_covers_the_float_arithmetic(tmp_path):
    """At every corner of the box, each node's float lower function minus its allowance lies
    below the exact-arithmetic function with the same lines (and the upper one above): what
    makes the intervals sound whatever the rounding. Gemm layers of awkward weights, a Relu, a
    product of data; without the allowance most corners fail."""
    graph = _awkward_graph(tmp_path, lambda g, k, h: g.op("Mul", [k, h]))
    box = Box(np.array([-0.3, 0.1, -1.1]) / 3, np.array([0.7, 0.9, 0.2]) / 3)
    gb = GraphBounds(graph, *box.args(), intermediate="forward")
    fp = ForwardPass(gb)
    for i, n in enumerate(graph.nodes):  # the same steps again, kept
        fp.step(i, n)
    exact = _exact_functions(graph, fp)
    assert graph.input_size == 3  # the corners below are those of the whole input
    for corner in itertools.product(*zip(box.lo, box.hi)):
        x = [F(float(v)) for v in corner] + [F(1)]
        for i in range(len(graph.nodes)):
            L, U, eL, eU = fp.fn[i]
            for k in range(L.shape[0]):
                fl = sum(F(float(a)) * v for a, v in zip(L[k], x)) - F(float(eL[k]))
                fu = sum(F(float(a)) * v for a, v in zip(U[k], x)) + F(float(eU[k]))
                el = sum(a * v for a, v in zip(exact[i][0][k], x))
                eu = sum(a * v for a, v in zip(exact[i][1][k], x))
                assert fl <= el and eu <= fu, (graph.nodes[i].name, k, corner)


# ------------------------------------------------------------ many boxes at once (ForwardBoxes)


def _boxes(rng, d, n, width=0.3):
    c = rng.uniform(-1, 1, (n, d))
    return c - rng.uniform(0, width, (n, d)), c + rng.uniform(0, width, (n, d))


@pytest.mark.parametrize("kind", KINDS)
def test_boxes_at_once_equal_the_forward_pass_box_by_box(tmp_path, kind):
    """ForwardBoxes' node intervals and output rows' bounds are GraphBounds(intermediate=
    "forward")'s on each box (to the summation order's last bits), and the bounds lie below
    every sampled value of the rows (corners included)."""
    from crown_cli.engine.graph_forward import ForwardBoxes

    g = _graph(tmp_path, BUILDERS[kind](np.random.default_rng(1)), kind)
    rng = np.random.default_rng(3)
    L, H = _boxes(rng, g.input_size, 5)
    fb = ForwardBoxes(g, L, H)
    C = rng.normal(size=(3, g.output_size))
    low, Lam = fb.lower(C)
    assert low.shape == (5, 3) and Lam.shape == (5, 3, g.input_size)
    for j in range(5):
        gb = GraphBounds(g, *Box(L[j], H[j]).args(), intermediate="forward")
        for i in range(len(g.nodes)):
            for ours, theirs in ((fb.lo[i][j], gb.lo[i]), (fb.hi[i][j], gb.hi[i])):
                assert np.allclose(ours, theirs, rtol=1e-12, atol=1e-12), (kind, i)
        assert np.allclose(low[j], gb.lower(g.output, C), rtol=1e-12, atol=1e-12), kind
        xs = rng.uniform(L[j], H[j], size=(3000, g.input_size))
        xs[:500] = np.where(rng.random((500, g.input_size)) < 0.5, L[j], H[j])
        assert np.all(g.forward(xs) @ C.T >= low[j]), (kind, j)
    assert np.all(np.isfinite(low))


def test_boxes_back_substitution_charges_as_one_box(tmp_path):
    """ForwardBoxes' back-substitution of output rows on each box: the rows over the input,
    constant, magnitude and rounding charge of GraphBounds' numpy path on that box (a dropped
    or halved charge shows here, where the bounds themselves would hide it under the final
    sums' allowance), and the bound below the exact-arithmetic minimum of the float rows'
    function plus the exact constant. Gemm layers of awkward weights, Relu, Tanh, a product
    of data, a sum of two branches."""
    from crown_cli.engine.graph_forward import ForwardBoxes
    from crown_cli.engine.kernels import using_kernels

    graph = _awkward_graph(tmp_path, lambda g, k, h: g.op("Add", [g.op("Mul", [k, h]),
                                                                  g.op("Tanh", [k])]))
    L, H = _boxes(np.random.default_rng(6), 3, 4, width=0.4)
    fb = ForwardBoxes(graph, L, H)
    C = np.array([[1.0 / 3, -0.7], [-1.1, 0.3]])
    Lx, const, mag, charge = fb.terms(C, np.arange(4))
    low, _ = fb.lower(C)
    assert np.all(charge > 0.0)
    for j in range(4):
        with using_kernels("numpy"):
            gb = GraphBounds(graph, *Box(L[j], H[j]).args(), intermediate="forward")
            ref = gb._rows(graph.output, C, None, None, None)
        for ours, theirs in zip((Lx[j], const[j], mag[j], charge[j]), ref):
            assert np.allclose(ours, theirs, rtol=1e-9, atol=0.0), j
        for row in range(2):
            least = min(sum(F(float(a)) * F(float(v)) for a, v in zip(Lx[j, row], corner))
                        for corner in itertools.product(*zip(L[j], H[j])))
            assert F(float(low[j, row])) <= least + F(float(const[j, row])) \
                - F(float(charge[j, row])), (j, row)


def test_boxes_at_once_stop_at_the_deadline(tmp_path):
    """ForwardBoxes checks its deadline at every node, building and bounding."""
    import time

    from crown_cli.engine.deadline import DeadlineExceeded
    from crown_cli.engine.graph_forward import ForwardBoxes

    g = _graph(tmp_path, BUILDERS["relu_residual"](np.random.default_rng(1)))
    L, H = _boxes(np.random.default_rng(3), g.input_size, 4)
    with pytest.raises(DeadlineExceeded):
        ForwardBoxes(g, L, H, deadline=time.monotonic() - 1.0)
    fb = ForwardBoxes(g, L, H, deadline=time.monotonic() + 60.0)
    fb.deadline = time.monotonic() - 1.0
    with pytest.raises(DeadlineExceeded):
        fb.lower(np.eye(g.output_size))
