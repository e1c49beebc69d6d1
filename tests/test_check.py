"""crown check (crown_cli/check): its readers, its bounds against exact and LP oracles, and
certificates written by hand (tests/check_certs.py) accepted, or rejected once tampered with."""
import ast
import glob
import hashlib
import json
import os
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner

import check_certs as cc
from conftest import ROOT, random_network
from crown_cli.check import Reject, check, load_model, load_property
from crown_cli.check.certificate import State, _bound, _colsets, update
from crown_cli.cli import cli



def test_the_checker_imports_no_other_crown_module_nor_onnx():
    files = glob.glob(os.path.join(ROOT, "crown_cli", "check", "*.py"))
    assert len(files) >= 5
    for path in files:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            else:
                continue
            for name in names:
                assert not name.startswith(("crown_cli", "onnx", "scipy")), (path, name)


# ---- networks and files

def write_npz(path, ws, bs):
    np.savez(path, **{f"W{i}": w for i, w in enumerate(ws)}, **{f"b{i}": b for i, b in enumerate(bs)})
    return str(path)


def reference(ws, bs, x):
    for k, (w, b) in enumerate(zip(ws, bs)):
        x = (np.maximum(x, 0) if k else x) @ w.T + b
    return x


def write_property(path, lo, hi, rows):
    """rows: (coefficients, b) meaning sum c_j Y_j <= b; values written with repr (exact)."""
    n_in, n_out = len(lo), len(rows[0][0])
    lines = [f"(declare-const X_{i} Real)" for i in range(n_in)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    lines += [f"(assert (>= X_{i} {lo[i]!r}))\n(assert (<= X_{i} {hi[i]!r}))" for i in range(n_in)]
    for coefs, b in rows:
        terms = " ".join(f"(* {c!r} Y_{j})" for j, c in enumerate(coefs) if c)
        lines.append(f"(assert (<= (+ {terms}) {b!r}))")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def small(tmp_path):
    """A 2-4-4-1 ReLU net, the property y >= t on [-1, 1]^2 (t above its maximum) and an
    input-split certificate of it."""
    ws, bs = random_network([2, 4, 4, 1], seed=3)
    model = write_npz(tmp_path / "net.npz", ws, bs)
    g = np.linspace(-1, 1, 201)
    top = reference(ws, bs, np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)).max()
    t = float(top) + 0.05
    spec = write_property(tmp_path / "p.vnnlib", [-1.0, -1.0], [1.0, 1.0], [([-1.0], -t)])
    net = load_model(model)
    tree = cc.bisection_tree(net, [-1, -1], [1, 1], [[-1.0]], [-t])
    arrays = cc.tree_arrays(tree, [[-1.0]], [-t], [-1, -1], [1, 1])
    proof = str(tmp_path / "p.proof")
    cc.save(proof, cc.header(model, spec, net, 1), [arrays])
    return dict(model=model, spec=spec, proof=proof, net=net, arrays=arrays, ws=ws, bs=bs, t=t,
                tmp=tmp_path)


def rejected(small, arrays=None, head=None, spec=None, model=None):
    """The reason a tampered certificate is rejected."""
    model, spec = model or small["model"], spec or small["spec"]
    proof = str(small["tmp"] / "tampered.proof")
    cc.save(proof, head or cc.header(model, spec, small["net"], 1), [arrays or small["arrays"]])
    with pytest.raises(Reject) as exc:
        check(model, spec, proof)
    return str(exc.value)


# ---- readers

def onnx_chain(ws, bs, raw=True, dtype=np.float32):
    """An ONNX chain written by the test's protobuf writer: Sub of a mean, Flatten, Gemm
    (transB, alpha, beta), Relu, MatMul + Add (constant first), Reshape by a Constant node,
    Identity, then c - x by Sub."""
    mean = np.array([[0.25, -0.5]], dtype)
    nodes = [cc.node("Sub", ["x", "mean"], ["s"]), cc.node("Flatten", ["s"], ["f"], axis=1),
             cc.node("Gemm", ["f", "W0", "b0"], ["g"], transB=1, alpha=0.5, beta=2.0),
             cc.node("Relu", ["g"], ["r"]), cc.node("MatMul", ["r", "W1t"], ["m"]),
             cc.node("Add", ["b1", "m"], ["a"]),
             cc.node("Constant", [], ["shape"], name="c"), cc.node("Reshape", ["a", "shape"], ["h"]),
             cc.node("Identity", ["h"], ["i"]), cc.node("Sub", ["c1", "i"], ["y"])]
    shape = cc.tensor("v", np.array([1, -1], np.int64), raw=False)
    nodes[6] = nodes[6] + cc._ld(5, cc._s(1, "value") + cc._ld(5, shape) + cc._key(20, 0) + cc._varint(4))
    inits = [cc.tensor("mean", mean, raw), cc.tensor("W0", ws[0].astype(dtype), raw),
             cc.tensor("b0", bs[0].astype(dtype), raw), cc.tensor("W1t", ws[1].T.astype(dtype), raw),
             cc.tensor("b1", bs[1].astype(dtype), raw),
             cc.tensor("c1", np.full(len(bs[1]), 0.125, dtype), raw)]
    data = cc.model(nodes, inits, ("x", [None, 2]), ("y", [1, len(bs[1])]))

    def forward(x):
        z = 0.5 * ((x - mean.astype(float)) @ ws[0].astype(dtype).astype(float).T) \
            + 2.0 * bs[0].astype(dtype).astype(float)
        z = np.maximum(z, 0) @ ws[1].astype(dtype).astype(float).T + bs[1].astype(dtype).astype(float)
        return 0.125 - z

    return data, forward


@pytest.mark.parametrize("raw,dtype", [(True, np.float32), (False, np.float32), (False, np.float64)])
def test_onnx_reader_keeps_each_operation(tmp_path, raw, dtype):
    ws, bs = random_network([2, 5, 3], seed=1)
    data, forward = onnx_chain(ws, bs, raw, dtype)
    path = tmp_path / "n.onnx"
    path.write_bytes(data)
    net = load_model(str(path))
    assert net.sizes == [2, 5, 3] and net.K == 1
    assert [op[0] for op in net.layers[0]] == ["add", "mat", "scale", "add"]
    assert [op[0] for op in net.layers[1]] == ["mat", "add", "scale", "add"]
    x = np.random.default_rng(0).uniform(-1, 1, (7, 2))
    np.testing.assert_allclose(net.forward(x), forward(x), rtol=1e-12, atol=1e-12)
    import onnx
    from onnx.reference import ReferenceEvaluator

    ev = ReferenceEvaluator(onnx.load_from_string(data))
    ref = np.concatenate([ev.run(None, {"x": r[None].astype(dtype)})[0] for r in x])
    np.testing.assert_allclose(net.forward(x), ref, rtol=1e-5, atol=1e-6)


def test_onnx_reader_rejects_an_operator_outside_the_scope(tmp_path):
    nodes = [cc.node("MatMul", ["x", "W"], ["m"]), cc.node("Sigmoid", ["m"], ["y"], name="act")]
    data = cc.model(nodes, [cc.tensor("W", np.eye(2))], ("x", [1, 2]), ("y", [1, 2]))
    (tmp_path / "s.onnx").write_bytes(data)
    with pytest.raises(Reject, match="Sigmoid node act: operator Sigmoid is outside"):
        load_model(str(tmp_path / "s.onnx"))


@pytest.mark.parametrize("mode", [None, False, True])
def test_onnx_reader_takes_an_inference_dropout_as_the_identity(tmp_path, mode):
    """Dropout (as PyTorch exports a model in eval mode, e.g. collins_rul_cnn's, whose
    `crown verify --proof` certificates the checker rejected for it): the identity where its
    training_mode is absent or a constant false (an older opset's `ratio` attribute too),
    the same network as without it; refused where it is true."""
    ws, bs = random_network([3, 4, 2], seed=2)
    extra = [] if mode is None else ["ratio", "train"]
    nodes = [cc.node("Gemm", ["x", "W0", "b0"], ["g"], transB=1), cc.node("Relu", ["g"], ["r"]),
             cc.node("Dropout", ["r"] + extra, ["d"], name="drop",
                     **({"ratio": 0.25} if mode is None else {})),
             cc.node("Gemm", ["d", "W1", "b1"], ["y"], transB=1)]
    inits = [cc.tensor("W0", ws[0]), cc.tensor("b0", bs[0]), cc.tensor("W1", ws[1]),
             cc.tensor("b1", bs[1])]
    if mode is not None:
        inits += [cc.tensor("ratio", np.array(0.5)), cc.tensor("train", np.array(mode))]
    path = tmp_path / "d.onnx"
    path.write_bytes(cc.model(nodes, inits, ("x", [1, 3]), ("y", [1, 2])))
    if mode:
        with pytest.raises(Reject, match="Dropout node drop: a Dropout whose training_mode"):
            load_model(str(path))
        return
    net = load_model(str(path))
    assert net.sizes == [3, 4, 2]
    x = np.random.default_rng(0).uniform(-1, 1, (5, 3))
    np.testing.assert_allclose(net.forward(x), np.maximum(x @ ws[0].T + bs[0], 0) @ ws[1].T
                               + bs[1], rtol=1e-12, atol=1e-12)


def test_npz_reader_matches_the_layers(tmp_path):
    ws, bs = random_network([3, 6, 2], seed=2)
    net = load_model(write_npz(tmp_path / "n.npz", ws, bs))
    x = np.random.default_rng(1).normal(size=(5, 3))
    np.testing.assert_allclose(net.forward(x), reference(ws, bs, x), rtol=1e-13)


def test_vnnlib_reader_exact_cases_in_dnf(tmp_path):
    text = """; a comment
(declare-const X_0 Real) (declare-const X_1 Real) (declare-const Y_0 Real) (declare-const Y_1 Real)
(assert (and (>= X_0 0.1) (< X_0 (* 2 0.15)) (= X_1 -1e-1)))
(assert (or (and (<= (- Y_0 Y_1) 0.3)) (> (* 0.5 Y_1) (+ 1 Y_0)) (<= X_0 0.05)))
"""
    cases = load_property(str(tmp_path / "x"), 2, 2, text.encode())
    assert len(cases) == 2  # the third term's box is empty (X_0 <= 0.05 < 0.1): dropped
    (lo, hi, rows), (lo2, hi2, rows2) = cases
    assert lo == [Fraction(1, 10), Fraction(-1, 10)] and hi == [Fraction(3, 10), Fraction(-1, 10)]
    assert rows == [((Fraction(1), Fraction(-1)), Fraction(3, 10))]
    assert rows2 == [((Fraction(1), Fraction(-1, 2)), Fraction(-1))]
    bad = text.replace("(<= X_0 0.05)", "(<= (+ X_0 Y_0) 0.05)")
    with pytest.raises(Reject, match="inputs and outputs together"):
        load_property("x", 2, 2, bad.encode())
    with pytest.raises(Reject, match="declares 2 Y variables, the network has 3"):
        load_property("x", 2, 3, text.encode())


# ---- the bounds against oracles

def state_of(net, lo, hi):
    H = int(net.offsets[-1])
    st = State(np.array([lo], float), np.array([hi], float), np.full((1, H), -np.inf),
               np.full((1, H), np.inf), np.zeros((1, H), np.int8))
    update(net, st, np.ones(1, np.int64), {})
    return st


def leaf_bound(net, st, row, alpha=None):
    cols = np.arange(int(net.offsets[-1]))
    S = np.zeros((0, 0)) if alpha is None else np.asarray([alpha], float)
    srow = np.array([-1 if alpha is None else 0])
    return _bound(net, st, np.asarray([row], float), net.K + 1, np.zeros(1, np.int64),
                  _colsets(net, cols), srow, S)[0]


def exact_bound(ws, bs, lo, hi, ls, us, row):
    """The linear bound of docs/proofs.md in Fractions, given the hidden bounds ls, us
    (default slopes), for a net of crown's NPZ layout."""
    F = np.vectorize(Fraction, otypes=[object])
    lam, c = F(np.asarray(row, float)), Fraction(0)
    for k in range(len(ws) - 1, -1, -1):
        c += sum(lam * F(bs[k]))
        lam = F(ws[k]).T @ lam
        if k == 0:
            break
        lam, dc = exact_relax(lam, ls[k - 1], us[k - 1])
        c += dc
    return c + sum(min(a * Fraction(x), a * Fraction(y)) for a, x, y in zip(lam, lo, hi))


def exact_relax(lam, l, u):
    """Rows ``lam`` (Fractions) over relu(z) as rows over z and a constant, with CROWN's
    default lines at the float bounds l, u, in exact rationals."""
    F = np.vectorize(Fraction, otypes=[object])
    mu, c = [], Fraction(0)
    for j, (lj, uj) in enumerate(zip(F(l), F(u))):
        if lj >= 0:
            mu.append(lam[j])
        elif uj <= 0:
            mu.append(Fraction(0))
        elif lam[j] >= 0:
            mu.append(lam[j] * (1 if uj >= -lj else 0))
        else:
            s = uj / (uj - lj)
            mu.append(lam[j] * s)
            c += lam[j] * (-s * lj)
    return np.array(mu, dtype=object), c


def test_float_bound_is_below_the_exact_one_and_close():
    ws, bs = random_network([3, 5, 4, 2], seed=7)
    ws = [w * 1e3 for w in ws]  # large magnitudes: visible rounding
    net = _npz_net(ws, bs)
    lo, hi = [-0.3, -1.0, 0.2], [0.7, 0.5, 0.9]
    st = state_of(net, lo, hi)
    ls = [st.l[0, :5], st.l[0, 5:]]
    us = [st.u[0, :5], st.u[0, 5:]]
    for j in range(5):  # layer 1's bounds: e_j through G_1 only
        ex = sum(min(a * Fraction(x), a * Fraction(y)) for a, x, y in
                 zip(map(Fraction, ws[0][j]), lo, hi)) + Fraction(bs[0][j])
        assert Fraction(ls[0][j]) <= ex and float(ex) - ls[0][j] < 1e-12 * abs(float(ex))
    for row in ([1.0, -1.0], [-0.5, 2.0]):
        v = leaf_bound(net, st, row)
        ex = exact_bound(ws, bs, lo, hi, ls, us, row)
        assert Fraction(v) <= ex, (v, float(ex))
        assert float(ex) - v < 1e-9 * max(1.0, abs(float(ex))), (v, float(ex))


def _npz_net(ws, bs):
    from crown_cli.check.network import Network

    return Network([[("mat", w.T.copy()), ("add", b.copy(), 1.0)] for w, b in zip(ws, bs)],
                   [ws[0].shape[1]] + [w.shape[0] for w in ws])


def test_one_hidden_layer_bound_equals_its_lp_and_lies_below_the_network():
    from scipy.optimize import linprog

    ws, bs = random_network([2, 8, 1], seed=11)
    net = _npz_net(ws, bs)
    lo, hi = np.array([-1.0, -0.5]), np.array([0.5, 1.0])
    st = state_of(net, lo, hi)
    l, u = st.l[0], st.u[0]
    alpha = np.random.default_rng(0).uniform(0, 1, 8)
    for row, al in (([1.0], None), ([-1.0], alpha)):
        v = leaf_bound(net, st, row, al)
        # the LP of the same lines: variables x (2), a (8); min row * (W2 a + b2)
        c2 = row[0] * ws[1][0]
        A_ub, b_ub, fixed = [], [], {}
        for j in range(8):
            w1, b1 = ws[0][j], bs[0][j]
            if l[j] >= 0:
                fixed[j] = (w1, b1)
            elif u[j] <= 0:
                fixed[j] = (np.zeros(2), 0.0)
            elif c2[j] >= 0:  # a_j >= slope (w1 x + b1)
                s = (1.0 if u[j] >= -l[j] else 0.0) if al is None else al[j]
                A_ub.append(np.r_[s * w1, -np.eye(8)[j]])
                b_ub.append(-s * b1)
            else:  # a_j <= u (z - l) / (u - l)
                s = u[j] / (u[j] - l[j])
                A_ub.append(np.r_[-s * w1, np.eye(8)[j]])
                b_ub.append(s * b1 - s * l[j])
        A_eq = [np.r_[-w1, np.eye(8)[j]] for j, (w1, b1) in fixed.items()]
        b_eq = [b1 for w1, b1 in fixed.values()]
        res = linprog(np.r_[0, 0, c2], A_ub=np.array(A_ub).reshape(-1, 10), b_ub=b_ub,
                      A_eq=np.array(A_eq).reshape(-1, 10) if A_eq else None,
                      b_eq=b_eq or None, bounds=list(zip(lo, hi)) + [(None, None)] * 8,
                      method="highs")
        lp = res.fun + row[0] * bs[1][0]
        assert res.status == 0 and v <= lp + 1e-9 and lp - v < 1e-7, (v, lp)
        g = np.stack(np.meshgrid(np.linspace(lo[0], hi[0], 301), np.linspace(lo[1], hi[1], 301)),
                     -1).reshape(-1, 2)
        assert v <= (row[0] * reference(ws, bs, g)).min()


# ---- certificates: accepted, and rejected once tampered with

def test_input_split_certificate_accepted(small):
    stats = check(small["model"], small["spec"], small["proof"])
    assert stats["cases"] == 1 and stats["nodes"] == len(small["arrays"]["kind"]) > 1
    res = CliRunner().invoke(cli, ["check", "--model", small["model"], "--spec", small["spec"],
                                   "--proof", small["proof"]])
    assert res.exit_code == 0 and "accepted" in res.output, res.output


def test_changed_weight_rejected_by_sha_then_by_its_bound(small):
    bs = [b.copy() for b in small["bs"]]
    bs[-1][0] += 1.0  # the output 1 higher: y >= t is met somewhere
    other = write_npz(small["tmp"] / "other.npz", small["ws"], bs)
    head = cc.header(small["model"], small["spec"], small["net"], 1)
    assert "model file's sha256 differs" in rejected(small, head=head, model=other)
    why = rejected(small, model=other)
    assert "lower bound" in why and "is not > b_i" in why and "missed by" in why


def test_tampered_tree_rejected_with_its_reason(small):
    a = small["arrays"]
    splits = np.nonzero(a["kind"] == 1)[0]
    t = {k: v.copy() for k, v in a.items()}
    t["value"][splits[0]] = 5.0
    assert f"node {splits[0]}: input split value 5.0" in rejected(small, t)
    t = {k: v.copy() for k, v in a.items()}
    leaf = int(np.nonzero(a["kind"] == 0)[0][-1])
    for k in ("kind", "arg", "value", "refresh", "alpha_at", "beta_at"):
        t[k] = np.delete(t[k], leaf)
    assert "missing (preorder arrays end early)" in rejected(small, t)
    t = {k: (np.r_[v, v[-1:]] if k in ("kind", "arg", "value", "refresh", "alpha_at", "beta_at")
             else v) for k, v in a.items()}
    assert "extra node after the tree's last leaf" in rejected(small, t)
    t = {k: v.copy() for k, v in a.items()}
    t["kind"][leaf] = 3
    assert f"node {leaf}: leaf of kind 3 (empty) but no neuron has l > u" in rejected(small, t)


def test_changed_threshold_rejected(small, tmp_path):
    spec = write_property(tmp_path / "q.vnnlib", [-1.0, -1.0], [1.0, 1.0], [([-1.0], -small["t"] + 0.2)])
    head = cc.header(small["model"], small["spec"], small["net"], 1)
    assert "property file's sha256 differs" in rejected(small, head=head, spec=spec)
    assert "is not > b_i" in rejected(small, spec=spec)
    wider = write_property(tmp_path / "w.vnnlib", [-1.0, -1.5], [1.0, 1.0], [([-1.0], -small["t"])])
    assert "no certificate case has a root box containing" in rejected(small, spec=wider)


def easy(small):
    """The property y >= t with t 0.5 above the root's own bound of y: (spec, t)."""
    st = state_of(small["net"], [-1, -1], [1, 1])
    t = float(0.5 - leaf_bound(small["net"], st, [-1.0]))
    spec = write_property(small["tmp"] / "easy.vnnlib", [-1.0, -1.0], [1.0, 1.0], [([-1.0], -t)])
    small.update(spec=spec, t=t)
    return st


def relu_tree_case(small, beta=1.0, slope=0.5, where=None):
    """Root split on an unstable layer-1 neuron: child 0 a leaf, child 1 a leaf with a slope row
    and a multiplier on that neuron (known sign there) or on ``where``."""
    net, t = small["net"], small["t"]
    st = state_of(net, [-1, -1], [1, 1])
    j = int(np.nonzero((st.l[0] < 0) & (st.u[0] > 0))[0][0])
    H = int(net.offsets[-1])
    al, be = np.full(H, slope), np.zeros(H)
    be[j if where is None else where] = beta
    margin = leaf_bound(net, st, [-1.0]) + t
    tree = ("relu", j, ("leaf", 0), ("refresh", 2, ("leaf", 0, al, be)))
    return cc.tree_arrays(tree, [[-1.0]], [-t], [-1, -1], [1, 1], cols=range(H)), j, margin


def test_relu_split_with_slopes_and_multipliers(small):
    easy(small)
    arrays, j, margin = relu_tree_case(small, beta=1e-3)
    assert margin > 0
    cc.save(small["proof"], cc.header(small["model"], small["spec"], small["net"], 1), [arrays])
    assert check(small["model"], small["spec"], small["proof"])["nodes"] == 3
    bad = dict(arrays, alpha=arrays["alpha"] * 3)
    assert "slope 1.5 of neuron 0 outside [0, 1]" in rejected(small, bad)
    bad = dict(arrays, beta=-arrays["beta"])
    assert f"multiplier -0.001 of neuron {j} outside [0, inf)" in rejected(small, bad)
    st = state_of(small["net"], [-1, -1], [1, 1])
    other = int(np.nonzero((st.l[0] < 0) & (st.u[0] > 0))[0][-1])
    assert other != j
    bad, _, _ = relu_tree_case(small, beta=1e-3, where=other)
    assert f"node 2: multiplier 0.001 on neuron {other} whose sign is not known" in rejected(small, bad)
    big, _, _ = relu_tree_case(small, beta=1e6)
    assert "node 2: row 0: lower bound" in rejected(small, big)


def test_layer_slopes_used_and_checked(small):
    net = small["net"]
    arrays = dict(small["arrays"])
    n1 = net.sizes[1]
    arrays["cols"] = np.arange(n1)
    arrays["alpha"] = np.zeros((0, n1))
    arrays["beta"] = np.zeros((0, n1))
    arrays["slopes_k2_rows"] = np.arange(n1, n1 + net.sizes[2])
    arrays["slopes_k2"] = np.full((2 * net.sizes[2], n1), 0.5)
    cc.save(small["proof"], cc.header(small["model"], small["spec"], net, 1), [arrays])
    check(small["model"], small["spec"], small["proof"])
    arrays["slopes_k2"] = np.full((2 * net.sizes[2], n1), 1.5)
    assert "a layer-2 slope outside [0, 1]" in rejected(small, arrays)
    arrays["slopes_k2"] = np.zeros((1, n1))
    assert "layer slopes of layer 2 malformed" in rejected(small, arrays)


def test_empty_leaf_accepted_where_bounds_cross(small):
    st = easy(small)
    net, t = small["net"], small["t"]
    j = int(np.nonzero(st.l[0] > 0)[0][0]) if (st.l[0] > 0).any() else None
    if j is None:  # an unstable neuron split twice: inactive then active with z_j <= 0 and >= 0
        j = int(np.nonzero((st.l[0] < 0) & (st.u[0] > 0))[0][0])
    tree = ("relu", j, ("relu", j, ("leaf", 0), ("leaf", 0)), ("leaf", 0))
    arrays = cc.tree_arrays(tree, [[-1.0]], [-t], [-1, -1], [1, 1])
    cc.save(small["proof"], cc.header(small["model"], small["spec"], net, 1), [arrays])
    check(small["model"], small["spec"], small["proof"])
    # a box of one point where z_j < 0, the neuron forced active: l > u, empty
    ws, bs = small["ws"], small["bs"]
    g = np.stack(np.meshgrid(np.linspace(-1, 1, 9), np.linspace(-1, 1, 9)), -1).reshape(-1, 2)
    x = g[np.argmin((g @ ws[0].T + bs[0]).min(1))]
    z = ws[0] @ x + bs[0]
    j = int(np.argmin(z))
    assert z[j] < -0.01
    tree = ("relu", j, ("leaf", 0), ("empty", j))
    arrays = cc.tree_arrays(tree, [[-1.0]], [-t], x, x)
    proof = str(small["tmp"] / "e.proof")
    cc.save(proof, cc.header(small["model"], small["spec"], net, 1), [arrays])
    with pytest.raises(Reject, match="no certificate case has a root box"):  # point box
        check(small["model"], small["spec"], proof)
    spec = write_property(small["tmp"] / "pt.vnnlib", [float(v) for v in x], [float(v) for v in x], [([-1.0], -t)])
    cc.save(proof, cc.header(small["model"], spec, net, 1), [arrays])
    assert check(small["model"], spec, proof)["nodes"] == 3


def runner():
    """stderr apart from stdout (click < 8.2 needs mix_stderr=False for it)."""
    if "mix_stderr" in CliRunner.__init__.__code__.co_varnames:
        return CliRunner(mix_stderr=False)
    return CliRunner()


def test_cli_instances_folder_and_exit_codes(small):
    tmp = small["tmp"]
    (tmp / "list.csv").write_text("net.npz,p.vnnlib,60\nnet.npz,p.vnnlib,60\n")
    proofs = tmp / "proofs"
    proofs.mkdir()
    name = proofs / "0001_net_p.proof"
    name.write_bytes(open(small["proof"], "rb").read())
    res = runner().invoke(
        cli, ["check", "--instances", str(tmp / "list.csv"), "--proof", str(proofs)])
    assert res.exit_code == 0 and res.stdout.count("accepted") == 1, res.output
    assert "1 of 2 instances have no certificate" in res.stderr
    head = json.loads(bytes(np.load(name)["header"]).decode())
    head["model"]["sha256"] = hashlib.sha256(b"other").hexdigest()
    z = dict(np.load(name))
    z["header"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
    np.savez_compressed(open(name, "wb"), **z)
    res = runner().invoke(
        cli, ["check", "--instances", str(tmp / "list.csv"), "--proof", str(proofs)])
    assert res.exit_code == 1 and "rejected: the model file's sha256 differs" in res.stdout
    res = runner().invoke(
        cli, ["check", "--model", str(tmp / "none.npz"), "--spec", small["spec"], "--proof",
              small["proof"]])
    assert res.exit_code == 2 and res.stderr.startswith("crown: error: ") and "none.npz" in res.stderr


# ---- a real network: ACAS Xu 1_1, shipped in tests/fixtures (the same bytes as VNN-COMP 2021's)

ACAS = os.path.join(ROOT, "tests", "fixtures", "ACASXU_run2a_1_1_batch_2000.onnx")
# VNN-COMP 2021 ACAS Xu property 1 (its box and its one row)
PROP_1 = "\n".join([f"(declare-const X_{i} Real)" for i in range(5)]
                   + [f"(declare-const Y_{j} Real)" for j in range(5)]
                   + ["(assert (<= X_0 0.679857769))", "(assert (>= X_0 0.6))",
                      "(assert (<= X_1 0.5))", "(assert (>= X_1 -0.5))",
                      "(assert (<= X_2 0.5))", "(assert (>= X_2 -0.5))",
                      "(assert (<= X_3 0.5))", "(assert (>= X_3 0.45))",
                      "(assert (<= X_4 -0.45))", "(assert (>= X_4 -0.5))",
                      "(assert (>= Y_0 3.991125645861615))"]) + "\n"


def test_acas_network_matches_the_reference_evaluator():
    import onnx
    from onnx.reference import ReferenceEvaluator

    net = load_model(ACAS)
    m = onnx.load(ACAS)
    inits = {i.name for i in m.graph.initializer}
    inp = [i for i in m.graph.input if i.name not in inits][0]
    dims = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).uniform(-1, 1, (6, net.sizes[0]))
    ev = ReferenceEvaluator(m)
    ref = np.stack([ev.run(None, {inp.name: r.reshape(dims).astype(np.float32)})[0].ravel() for r in x])
    np.testing.assert_allclose(net.forward(x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_acasxu_input_split_certificate(tmp_path):
    spec = str(tmp_path / "prop_1.vnnlib")
    with open(spec, "w") as fh:
        fh.write(PROP_1)
    net = load_model(ACAS)
    (lo, hi, rows), = load_property(spec, 5, 5)
    A = [[float(c) for c in rows[0][0]]]
    b = [float(rows[0][1])]
    lo = np.nextafter([float(x) for x in lo], -np.inf)
    hi = np.nextafter([float(x) for x in hi], np.inf)
    arrays = cc.tree_arrays(cc.bisection_tree(net, lo, hi, A, b), A, b, lo, hi)
    proof = str(tmp_path / "a.proof")
    cc.save(proof, cc.header(ACAS, spec, net, 1), [arrays])
    assert check(ACAS, spec, proof)["nodes"] == len(arrays["kind"]) > 50


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_hull_float_bound_below_the_exact_one_and_close(tmp_path, scale):
    from fractions import Fraction

    from crown_cli.check.bounds import interval
    from crown_cli.check.hull import hull_exact, hull_float
    from crown_cli.check.network import read_npz

    rng = np.random.default_rng(3)
    for trial in range(4):
        ws = [rng.normal(size=(12, 4)) * scale ** (rng.uniform(-1, 1, (12, 4))),
              rng.normal(size=(3, 12))]
        bs = [rng.normal(size=12), rng.normal(size=3)]
        net = read_npz(write_npz(tmp_path / f"h{trial}.npz", ws, bs))
        lo = rng.uniform(-1, 0, 4)
        hi = lo + rng.uniform(0.1, 1, 4)
        l1, u1 = interval(net.layers[0], lo[None], hi[None])
        s = rng.uniform(0, 1, 12).astype(np.float32).astype(np.float64)
        theta = rng.uniform(-0.5, 1.5, (12, 4))
        row = rng.normal(size=3)
        f = hull_float(net, lo, hi, l1[0], u1[0], row, s, theta)
        e = hull_exact(net, lo, hi, row, 0, s, theta)
        assert Fraction(f) <= e
        assert float(e) - f <= 1e-9 * (1 + abs(float(e)))


def _conv_model(rng, pool=("AveragePool", {"kernel_shape": [2, 2], "strides": [1, 1],
                                           "pads": [0, 1, 1, 0], "count_include_pad": 0})):
    """Conv (strides, pads, dilations) -> Relu -> Pad of zero width -> pool -> grouped Conv ->
    Relu -> Flatten -> Gemm, float32 weights (onnx.helper)."""
    from graph_models import G, _shape

    g = G(rng)
    x = g.op("Conv", ["x", g.rand(4, 2, 3, 3), g.rand(4)], strides=[1, 2], pads=[1, 0, 1, 1],
             dilations=[1, 1])
    x = g.op("Relu", [x])
    x = g.op("Pad", [x, g.const(np.zeros(8), np.int64)], mode="constant")
    x = g.op(pool[0], [x], **pool[1])
    x = g.op("Conv", [x, g.rand(4, 2, 2, 2), g.rand(4)], group=2, dilations=[2, 1])
    x = g.op("Flatten", [g.op("Relu", [x])])
    n = int(np.prod(_shape(g, "x", (1, 2, 6, 7), x)[1:]))
    return g.model([("x", (1, 2, 6, 7))], [g.op("Gemm", [x, g.rand(3, n), g.rand(3)], transB=1)])


@pytest.mark.parametrize("pool", [
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 1, 1, 0],
                     "count_include_pad": 0}),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 1, 1, 0],
                     "count_include_pad": 1}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 1, 1, 0]}),  # overlapping
    # windows of 3 x 3 = 9 values, and 4 or 6 at the padded borders: the sum, then / count
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                     "count_include_pad": 0}),
])
def test_onnx_reader_convolutions_and_pools_match_two_other_readers(tmp_path, pool):
    """The checker's dense matrices of Conv / AveragePool / Pad and its max pool windows
    against onnx's reference evaluator (float32) and the engine's own graph loader and forward
    pass (float64)."""
    from onnx.reference import ReferenceEvaluator

    from crown_cli.graph.onnx_graph import load_graph

    m = _conv_model(np.random.default_rng(4), pool)
    path = tmp_path / "c.onnx"
    path.write_bytes(m.SerializeToString())
    net = load_model(str(path))
    assert net.K == 2 and net.sizes[0] == 84  # hidden layers: the two Relus' inputs
    x = np.random.default_rng(1).uniform(-1, 1, (5, 84))
    ev = ReferenceEvaluator(m)
    ref = np.concatenate([ev.run(None, {"x": r.reshape(1, 2, 6, 7).astype(np.float32)})[0]
                          for r in x])
    np.testing.assert_allclose(net.forward(x), ref, rtol=1e-5, atol=1e-5)
    graph = load_graph(str(path))
    np.testing.assert_allclose(net.forward(x), graph.forward(x).reshape(5, -1), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("pool, pads, match", [
    ("LpPool", [0, 0, 0, 0, 0, 0, 0, 0], "LpPool is outside the checker's scope"),
    ("AveragePool", [0, 0, -1, 0, 0, 0, 0, 0], "only a constant Pad of nonnegative widths"),
])
def test_onnx_reader_rejects_what_it_cannot_write_exactly(tmp_path, pool, pads, match):
    from graph_models import G

    g = G(np.random.default_rng(0))
    x = g.op("Relu", [g.op("Conv", ["x", g.rand(2, 1, 2, 2), g.rand(2)])])
    x = g.op("Pad", [x, g.const(pads, np.int64)], mode="constant")
    x = g.op(pool, [x], kernel_shape=[3, 3], strides=[3, 3])
    x = g.op("Gemm", [g.op("Flatten", [x]), g.rand(2, 2 * 2 * 2)], transB=1)
    (tmp_path / "r.onnx").write_bytes(g.model([("x", (1, 1, 7, 7))], [x]).SerializeToString())
    with pytest.raises(Reject, match=match):
        load_model(str(tmp_path / "r.onnx"))


@pytest.mark.parametrize("first", ["add", "mat", "take"])
def test_one_hot_rows_take_the_short_path_to_the_same_numbers(first):
    """Step 1b's rows +-e_j given as (j, v, n) through a layer: the same rows, constants and
    charges as the full products of the rows written out (and as the rows themselves when
    the layer has no product)."""
    from crown_cli.check import bounds

    rng = np.random.default_rng(2)
    ops = [("add", rng.normal(size=6), 1.0), ("mat", rng.normal(size=(6, 9))),
           ("add", rng.normal(size=9), 1.0), ("scale", -0.75), ("add", rng.normal(size=9), -1.0)]
    if first == "add":  # no product: the rows come back written out
        ops = [("add", rng.normal(size=9), 1.0), ("scale", 3.0), ("add", rng.normal(size=9), -1.0)]
    if first == "take":  # an element move first (no product): the rows over its input
        ops = [("take", np.array([4, 0, 6, -1, 2, 5, 1, 3, -1]), 7), ("scale", 3.0),
               ("add", rng.normal(size=9), -1.0)]
    j, v = np.array([0, 3, 3, 8, 2]), np.array([1.0, -1.0, 1.0, -1.0, 0.0])
    L = np.zeros((5, 9))
    L[np.arange(5), j] = v
    n_in = ops[0][2] if first == "take" else ops[0][1].size
    M = bounds._sizes(ops, -np.ones((2, n_in)), np.ones((2, n_in)))
    at = np.array([0, 1, 1, 0, 1])
    short = bounds._through(ops, (j, v, 9), np.zeros(5), np.zeros(5), M, at)
    full = bounds._through(ops, L, np.zeros(5), np.zeros(5), M, at)
    for a, b in zip(short, full):
        np.testing.assert_array_equal(a, b)
    assert np.all(short[2] > 0)  # charges were made


def test_zero_columns_left_out_of_a_product_change_no_number_beyond_the_charge():
    """Rows whose columns are zero in every row (inactive neurons) through a product: the
    short product's rows differ from the exact ones by less than the charge (the variables
    on [-1, 1])."""
    from crown_cli.check import bounds

    rng = np.random.default_rng(5)
    W = rng.normal(size=(7, 40))
    L = rng.normal(size=(6, 40))
    L[:, rng.permutation(40)[:25]] = 0.0  # 25 of 40 columns zero: the short product
    M = bounds._sizes([("mat", W)], -np.ones((1, 7)), np.ones((1, 7)))
    at = np.zeros(6, np.int64)
    Lb, _, q = bounds._through([("mat", W)], L, np.zeros(6), np.zeros(6), M, at)
    F = np.vectorize(Fraction, otypes=[object])
    err = np.abs(F(Lb) - F(L) @ F(W.T)).astype(float).sum(1)  # in exact arithmetic
    assert np.all(err <= q) and np.all(q < 1e-12)


@pytest.mark.parametrize("strides", [(2, 2), (1, 1)])  # windows apart, and overlapping
def test_max_pool_rows_bound_every_sampled_point(strides):
    """Rows through a max pool (its lines: y >= x_k*, y <= max hi, y = x_k* where k*
    dominates), a product and an addition, then minimised over the input box: below the
    minimum of the same rows at sampled points of the box, and not far below (nearly exact
    where every window has a dominating input)."""
    from crown_cli.check import bounds
    from crown_cli.check.onnx_reader import _window

    rng = np.random.default_rng(6)
    ops = []
    shape = _window("MaxPool", [], {"kernel_shape": [2, 2], "strides": list(strides)},
                    (1, 2, 4, 4), ops, "MaxPool node p")
    n_out = int(np.prod(shape))
    ops += [("mat", rng.normal(size=(n_out, 3))), ("add", rng.normal(size=3), 1.0)]
    for spread in (0.3, 3.0):  # wide boxes (no window decided), then decided windows
        lo = rng.uniform(-1, 1, (1, 32)) * spread
        hi = lo + rng.uniform(0, 1.0 if spread < 1 else 0.2, (1, 32))
        L = rng.normal(size=(4, 3))
        Lin, c, q = bounds._through(ops, L, np.zeros(4), np.zeros(4), bounds._sizes(ops, lo, hi),
                                    np.zeros(4, np.int64))
        bound = np.minimum(Lin * lo, Lin * hi).sum(1) + c - q
        X = rng.uniform(lo, hi, (20000, 32))
        X[::2] = np.where(rng.random((10000, 32)) < 0.5, lo, hi)  # and vertices of the box
        Y = X[:, np.maximum(ops[0][1], 0)].max(axis=2) @ ops[1][1] + ops[2][1]
        sampled = (Y @ L.T).min(axis=0)
        assert np.all(bound <= sampled), (bound, sampled)
        if spread == 3.0 and strides == (2, 2):
            assert np.all(sampled - bound < 0.05 * (1 + np.abs(sampled)))


def test_residual_network_float_bound_below_the_exact_one_and_close():
    """A network with residual terms (z3 = W3 a2 + b3 + a1, y = W4 a3 + b4 + D x): the
    hidden bounds hold at sampled points, and the leaf's float bound (rows summed where two
    terms reach one source, each sum's rounding charged) lies below the same linear bound
    in exact rationals, and close to it; large weights make the rounding visible."""
    from crown_cli.check.network import Network

    rng = np.random.default_rng(11)
    W = [rng.normal(size=s) * 1e3 for s in ((3, 5), (5, 5), (5, 5), (5, 2))]  # x @ W
    b = [rng.normal(size=s[1]) for s in ((3, 5), (5, 5), (5, 5), (5, 2))]
    D = rng.normal(size=(3, 2)) * 1e3
    T = lambda k: [("mat", W[k]), ("add", b[k], 1.0)]  # noqa: E731
    terms = [[(0, T(0))], [(1, T(1))], [(2, T(2)), (1, [])], [(3, T(3)), (0, [("mat", D)])]]
    net = Network(None, [3, 5, 5, 5, 2], terms)
    assert not net.chain
    lo, hi = np.array([-0.3, -1.0, 0.2]), np.array([0.7, 0.5, 0.9])
    st = state_of(net, lo, hi)
    X = rng.uniform(lo, hi, (5000, 3))
    a = [X]
    for k, ts in enumerate(terms[:-1]):
        z = sum(net_ops(ops, a[s]) for s, ops in ts)
        sl = slice(net.offsets[k], net.offsets[k + 1])
        assert np.all(st.l[0, sl] <= z) and np.all(z <= st.u[0, sl])
        a.append(np.maximum(z, 0.0))
    F = np.vectorize(Fraction, otypes=[object])
    ls = [st.l[0, net.offsets[k]:net.offsets[k + 1]] for k in range(3)]
    us = [st.u[0, net.offsets[k]:net.offsets[k + 1]] for k in range(3)]
    for row in ([1.0, -1.0], [-0.5, 2.0]):
        v = leaf_bound(net, st, row)
        pend, c, lam = {}, Fraction(0), F(np.asarray(row))
        for m in range(4, 0, -1):
            if m < 4:  # rows over a_m -> z_m, the default slopes at the bounds
                lam, dc = exact_relax(pend.pop(m), ls[m - 1], us[m - 1])
                c += dc
            for src, ops in terms[m - 1]:
                r = lam
                for op in reversed(ops):
                    if op[0] == "mat":
                        r = F(op[1]).dot(r)
                    else:
                        c += r.dot(F(op[1]))
                pend[src] = pend[src] + r if src in pend else r
        ex = c + sum(min(q * Fraction(x), q * Fraction(y)) for q, x, y in zip(pend[0], lo, hi))
        assert Fraction(v) <= ex, (v, float(ex))
        assert float(ex) - v < 1e-9 * max(1.0, abs(float(ex))), (v, float(ex))
        assert v <= np.min(net.forward(X) @ np.asarray(row))


def net_ops(ops, x):
    for op in ops:
        x = x @ op[1] if op[0] == "mat" else x + op[2] * op[1]
    return x


@pytest.mark.parametrize("kw", [dict(), dict(strides=[2, 1], pads=[1, 0, 1, 2]),
                                dict(dilations=[2, 2], pads=[2, 2, 2, 2]), dict(group=2)])
def test_convolution_rows_back_by_kernel_position_equal_the_matrix_product(tmp_path, kw):
    """A convolution's rows taken back a kernel position at a time (Taps.back, what the
    linear bound runs) equal the product by its dense matrix, up to the order of the sums."""
    import onnx
    import graph_models as gm

    from crown_cli.check import load_model

    g = gm.G(np.random.default_rng(12))
    w = g.rand(6, 4 // kw.get("group", 1), 3, 3)
    out = g.op("Conv", ["x", w, g.rand(6)], **kw)
    onnx.save(g.model([("x", (1, 4, 7, 8))], [out]), str(tmp_path / "c.onnx"))
    op = load_model(str(tmp_path / "c.onnx")).terms[0][0][1][0]
    assert op[0] == "mat" and len(op) == 3
    L = np.random.default_rng(13).normal(size=(5, op[1].shape[1]))
    want = L @ op[1].T
    assert np.allclose(op[2].back(L), want, rtol=0, atol=1e-13 * np.abs(want).max())
