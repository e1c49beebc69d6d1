"""Certificates of unsat verdicts (crown_cli/verification/proof.py, docs/proofs.md): the tree a
search records, and what `crown check` (crown_cli/check, which shares no code with the
engine) says of them, before and after tampering."""
import numpy as np
import pytest

from conftest import slow_if
from crown_cli.verification.proof import EMPTY, HULL, INPUT, LEAF, RELU, ProofError, ProofTree


def test_tree_laid_out_in_preorder():
    t = ProofTree(np.array([3, 7]))
    (a, b), = t.split_input([0], [1], [0.5])
    (c, d), = t.split_relu([b], [7], [2])
    t.prove(a, 0, 2)
    t.prove(c, 0, 1, alpha=np.array([0.25, 1.0]), beta=np.array([0.0, 0.5]))
    t.empty(d, 3)
    out = t.case_arrays(0)
    assert out["kind"].tolist() == [INPUT, LEAF, RELU, LEAF, EMPTY]
    assert out["arg"].tolist() == [1, 2, 7, 1, 3]
    assert out["value"][0] == 0.5 and np.isnan(out["value"][1:]).all()
    assert out["refresh"].tolist() == [1, 1, 1, 2, 2]
    assert out["alpha_at"].tolist() == [-1, -1, -1, 0, -1]
    assert out["beta_at"].tolist() == [-1, -1, -1, 0, -1]
    assert out["alpha"].tolist() == [[0.25, 1.0]] and out["cols"].tolist() == [3, 7]


def test_a_case_proven_above_a_split_is_a_leaf_there():
    # a joint search: case 0 proven at the root, case 1 only on both children
    t = ProofTree(np.zeros(0, np.int64))
    (a, b), = t.split_relu([0], [4], [3])
    t.prove(0, 0, 0)
    t.prove(a, 1, 0)
    t.prove(b, 1, 1)
    assert t.case_arrays(0)["kind"].tolist() == [LEAF]
    assert t.case_arrays(1)["kind"].tolist() == [RELU, LEAF, LEAF]


def test_hull_leaves_and_open_nodes():
    t = ProofTree()
    (a, b), = t.split_input([0], [0], [0.0])
    t.prove_hull(a, 0, 1, np.array([0.5, 1.0]), np.ones((2, 3)))
    with pytest.raises(ProofError, match="neither split nor proven"):
        t.case_arrays(0)  # b is open
    t.prove(b, 0, 0)
    out = t.case_arrays(0)
    assert out["kind"].tolist() == [INPUT, HULL, LEAF]
    assert out["hull_at"].tolist() == [-1, 0, -1]
    assert out["hull_theta"].shape == (1, 2, 3)
    with pytest.raises(ProofError, match="split twice"):
        t.split_input([0], [0], [1.0])
    with pytest.raises(ProofError, match="float32"):
        t.prove(a, 1, 0, alpha=np.array([0.1]))  # 0.1 is no float32: not what was verified


# ---- certificates crown writes, checked by crown check

from test_check import write_npz, write_property  # noqa: E402

from crown_cli.check import Reject, check  # noqa: E402
from crown_cli.io.vnnlib import parse_vnnlib  # noqa: E402
from crown_cli.verification.pipeline import Verifier  # noqa: E402
from crown_cli.verification.proof import write_verdict_proof  # noqa: E402


def _net(seed, sizes):
    rng = np.random.default_rng(seed)
    ws = [rng.normal(size=(o, i)) / np.sqrt(i) for i, o in zip(sizes[:-1], sizes[1:])]
    bs = [0.1 * rng.normal(size=o) for o in sizes[1:]]
    return ws, bs


def _forward(ws, bs, X):
    for k, (w, b) in enumerate(zip(ws, bs)):
        X = (np.maximum(X, 0.0) if k else X) @ w.T + b
    return X


def _unsat_instance(tmp_path, seed, sizes, eps, stages=("crown",)):
    """A network (NPZ), a property ``y_0 - y_1 <= t`` over a box just below the margin's
    sampled minimum (so crown proves it only by splitting), its certificate; the arrays."""
    ws, bs = _net(seed, sizes)
    rng = np.random.default_rng(seed + 1)
    x0 = rng.uniform(-0.5, 0.5, sizes[0])
    lo, hi = x0 - eps, x0 + eps
    X = rng.uniform(lo, hi, (20000, sizes[0]))
    m = _forward(ws, bs, X)
    margin = m[:, 0] - m[:, 1]
    sign = 1.0 if np.median(margin) > 0 else -1.0  # the side the box mostly lies on
    t = float(np.min(sign * margin)) - 0.05 * float(np.ptp(margin))
    model = write_npz(tmp_path / "net.npz", ws, bs)
    coefs = [0.0] * sizes[-1]
    coefs[0], coefs[1] = sign, -sign  # the unsafe set: sign * margin <= t
    spec = write_property(tmp_path / "p.vnnlib", [float(v) for v in lo], [float(v) for v in hi],
                          [(coefs, t)])
    v = Verifier(ws, bs, "relu", stages=stages, proof=True, attack_time=0.2)
    prop = parse_vnnlib(spec, sizes[0], sizes[-1])
    verdict = v.verify(prop, 60.0)
    proof = str(tmp_path / "p.proof")
    assert verdict.result == "unsat", verdict
    assert write_verdict_proof(verdict, v, model, spec, proof) == ""
    return dict(ws=ws, bs=bs, model=model, spec=spec, proof=proof, lo=lo, hi=hi, t=t,
                coefs=coefs, verdict=verdict)


def _arrays(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _resave(path, arrays):
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)


@pytest.mark.parametrize("sizes, eps, stages", [
    ((3, 12, 12, 12, 2), 0.3, ("crown",)),  # input splitting
    ((3, 24, 2), 0.4, ("crown",)),  # one hidden layer: convex-hull input splitting
])
def test_certificates_of_each_search_accepted(tmp_path, sizes, eps, stages):
    inst = _unsat_instance(tmp_path, 5, sizes, eps, stages)
    out = check(inst["model"], inst["spec"], inst["proof"])
    kinds = _arrays(inst["proof"])["c0_kind"]
    assert out["nodes"] == kinds.size and kinds.size > 1  # a tree, not one bound


def test_relu_split_certificate_accepted(tmp_path):
    from crown_cli.verification.bab.relu_split import ReluSplitProblem, relu_split_steps
    from crown_cli.verification.outcome import finish
    from crown_cli.verification.proof import ProofTree, save

    inst = _unsat_instance(tmp_path, 11, (4, 16, 16, 16, 2), 0.25)
    ws, bs = inst["ws"], inst["bs"]
    prop = parse_vnnlib(inst["spec"], 4, 2)
    c = prop.cases[0]
    tree = ProofTree()
    res = finish(relu_split_steps(ReluSplitProblem(ws, bs, c.lo, c.hi, c.A, c.b), 1e18,
                                  attack_restarts=0, proof=tree))
    assert res.verdict == "unsat"
    arrays = dict(tree.case_arrays(0), lo=c.lo, hi=c.hi, A=c.A, b=c.b)
    assert (arrays["kind"] == RELU).any() and arrays["beta"].shape[0] > 0
    save(inst["proof"], [arrays], {"inputs": 4, "hidden": [16, 16, 16], "outputs": 2,
                                   "activation": "relu"}, inst["model"], inst["spec"])
    assert check(inst["model"], inst["spec"], inst["proof"])["nodes"] == arrays["kind"].size
    # a multiplier grown a thousandfold: the leaf's bound no longer holds
    a = _arrays(inst["proof"])
    b = dict(a, c0_beta=a["c0_beta"] * np.float32(1000.0))
    _resave(inst["proof"], b)
    with pytest.raises(Reject, match="lower bound .* is not >"):
        check(inst["model"], inst["spec"], inst["proof"])
    # three hidden layers: each domain's hidden-layer bounds were optimised (multipliers of
    # its split constraints per row), and the certificate carries the rows that needed them
    assert (arrays["rm_value"] > 0).any() and arrays["rm_node"].size > 0
    _resave(inst["proof"], {k: v for k, v in a.items() if "_rm_" not in k})
    with pytest.raises(Reject, match="lower bound .* is not >"):  # without them: too loose
        check(inst["model"], inst["spec"], inst["proof"])
    for change, why in [
            (lambda b: b["c0_rm_value"].__setitem__(0, -1.0), "negative or not finite"),
            (lambda b: b["c0_rm_col"].__setitem__(0, b["c0_rm_neuron"][0]), "not below its row"),
            (lambda b: b["c0_rm_side"].__setitem__(0, 2), "out of range"),
            (lambda b: b["c0_rm_count"].__setitem__(0, b["c0_rm_count"][0] + 1),
             "inconsistent lengths")]:
        b = {k: v.copy() for k, v in a.items()}
        b["c0_rm_value"] = b["c0_rm_value"].astype(np.float32)
        b["c0_rm_side"] = b["c0_rm_side"].astype(np.int8)
        change(b)
        _resave(inst["proof"], b)
        with pytest.raises(Reject, match=why):
            check(inst["model"], inst["spec"], inst["proof"])
    # the rows' own slopes (the search optimised them too): without them, too loose; each
    # malformed one named
    assert arrays["rm_slope"].dtype == np.float16 and arrays["rm_scount"].sum() > 0
    _resave(inst["proof"], {k: v for k, v in a.items()
                            if k not in ("c0_rm_scount", "c0_rm_scol", "c0_rm_slope")})
    with pytest.raises(Reject, match="lower bound .* is not >"):
        check(inst["model"], inst["spec"], inst["proof"])
    for change, why in [
            (lambda b: b["c0_rm_slope"].__setitem__(0, 1.5), r"row slope outside \[0, 1\]"),
            (lambda b: b["c0_rm_scol"].__setitem__(0, b["c0_rm_neuron"][0]),
             "row slope on a neuron not below"),
            (lambda b: b["c0_rm_scount"].__setitem__(0, b["c0_rm_scount"][0] + 1),
             "row slope arrays of inconsistent lengths"),
            (lambda b: b["c0_rm_scol"].__setitem__(1, b["c0_rm_scol"][0]), "not on increasing"),
            (lambda b: b.pop("c0_rm_scol"), "row slopes need all of")]:
        b = {k: v.copy() for k, v in a.items()}
        change(b)
        _resave(inst["proof"], b)
        with pytest.raises(Reject, match=why):
            check(inst["model"], inst["spec"], inst["proof"])
    # one row given twice at a node
    b = dict(a)
    for n in ("node", "neuron", "side", "count"):
        b[f"c0_rm_{n}"] = np.insert(a[f"c0_rm_{n}"], 0, a[f"c0_rm_{n}"][0])
    first = int(a["c0_rm_count"][0])
    b["c0_rm_col"] = np.concatenate([a["c0_rm_col"][:first], a["c0_rm_col"]])
    b["c0_rm_value"] = np.concatenate([a["c0_rm_value"][:first], a["c0_rm_value"]])
    _resave(inst["proof"], b)
    with pytest.raises(Reject, match="twice"):
        check(inst["model"], inst["spec"], inst["proof"])


def test_row_multipliers_count_only_where_the_sign_is_known():
    """The checker's step 1b: a row multiplier on a neuron of unknown sign at the node takes
    no part; on one of known sign (a constraint, or bounds on one side of 0) it enters as
    beta * s."""
    from crown_cli.check.certificate import State, _row_betas

    class Net:
        offsets, sizes = np.array([0, 3, 5]), [2, 3, 2, 1]

    # two nodes; layer 1's neurons: 0 split active at node 0, 1 with l >= 0, 2 unstable
    l = np.array([[-1.0, 0.5, -1.0, -1, -1], [-1.0, -2.0, -1.0, -1, -1]])
    u = np.array([[1.0, 2.0, 1.0, 1, 1], [1.0, -0.5, 1.0, 1, 1]])
    sg = np.zeros((2, 5), np.int8)
    sg[0, 0] = 1
    st = State(np.zeros((2, 2)), np.ones((2, 2)), l, u, sg)
    rm = dict(count=np.array([3, 3]), start=np.array([0, 3]), col=np.array([0, 1, 2, 0, 1, 2]),
              value=np.array([2.0, 3.0, 5.0, 2.0, 3.0, 5.0]))
    beta = _row_betas(Net, st, rm, np.array([0, 1, -1]))
    bs = beta(slice(0, 3), 1, np.array([0, 1, 1]))
    assert bs.tolist() == [[2.0, 3.0, 0.0], [0.0, -3.0, 0.0], [0.0, 0.0, 0.0]]


def test_row_slopes_replace_the_rows_defaults_only_where_given():
    """The checker's step 1b: a row with row-multiplier slopes takes them on the neurons its
    entry names (of the layer asked for); its other neurons, and rows without an entry, keep
    the slopes they had."""
    from crown_cli.check.certificate import _row_slopes

    class Net:
        offsets, sizes = np.array([0, 3, 5]), [2, 3, 2, 1]

    rm = dict(scount=np.array([2, 1]), sstart=np.array([0, 2]), scol=np.array([0, 2, 3]),
              slope=np.array([0.25, 0.5, 0.75]))
    own = _row_slopes(Net, rm, np.array([-1, 0, 1]))
    al = own(slice(0, 3), 1, np.ones((3, 3)))
    assert al.tolist() == [[1.0, 1.0, 1.0], [0.25, 1.0, 0.5], [1.0, 1.0, 1.0]]
    al = own(slice(0, 3), 2, np.zeros((3, 2)))
    assert al.tolist() == [[0.0, 0.0], [0.0, 0.0], [0.75, 0.0]]
    al = own(slice(1, 3), 2, np.zeros((2, 2)))  # a chunk's rows: entries 0 and 1
    assert al.tolist() == [[0.0, 0.0], [0.75, 0.0]]


def test_tampered_certificates_rejected(tmp_path):
    inst = _unsat_instance(tmp_path, 5, (3, 12, 12, 12, 2), 0.3)
    a = _arrays(inst["proof"])
    # a leaf dropped
    k = a["c0_kind"]
    leaf = int(np.flatnonzero(k == LEAF)[-1])
    b = {n: (np.delete(v, leaf) if n.startswith("c0_") and v.shape == k.shape else v)
         for n, v in a.items()}
    _resave(inst["proof"], b)
    with pytest.raises(Reject, match="preorder arrays end early"):
        check(inst["model"], inst["spec"], inst["proof"])
    # an input split moved: one child now covers less, the other more than it was proven on
    b = dict(a)
    b["c0_value"] = a["c0_value"].copy()
    first = int(np.flatnonzero(k == INPUT)[0])
    d = int(a["c0_arg"][first])
    b["c0_value"][first] = inst["hi"][d] + 1.0
    _resave(inst["proof"], b)
    with pytest.raises(Reject, match="input split value"):
        check(inst["model"], inst["spec"], inst["proof"])
    # the property's threshold raised where the network reaches it: no certificate may pass
    _resave(inst["proof"], a)
    X = np.random.default_rng(0).uniform(inst["lo"], inst["hi"], (20000, 3))
    y = _forward(inst["ws"], inst["bs"], X)
    worst = float(np.min(y @ np.array(inst["coefs"])))
    spec = write_property(tmp_path / "q.vnnlib", [float(v) for v in inst["lo"]],
                          [float(v) for v in inst["hi"]],
                          [(inst["coefs"], worst + 0.01)])
    a2 = dict(a)
    import hashlib
    import json

    head = json.loads(bytes(a["header"]))
    head["property"]["sha256"] = hashlib.sha256(open(spec, "rb").read()).hexdigest()
    a2["header"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
    _resave(inst["proof"], a2)
    with pytest.raises(Reject, match="is not >"):
        check(inst["model"], spec, inst["proof"])
    # one weight changed so that the property fails at a sampled point: rejected (the sha
    # first, then with the sha updated by the bound)
    ws = [w.copy() for w in inst["ws"]]
    ws[-1][0] -= 3.0 * np.sign(inst["coefs"][0]) * np.abs(ws[-1][0])  # moves y_0 a lot
    model = write_npz(tmp_path / "net2.npz", ws, inst["bs"])
    y = _forward(ws, inst["bs"], X) @ np.array(inst["coefs"])
    assert y.min() <= inst["t"]  # the changed network violates the property
    _resave(inst["proof"], a)
    with pytest.raises(Reject, match="sha256"):
        check(model, inst["spec"], inst["proof"])
    head = json.loads(bytes(a["header"]))
    head["model"]["sha256"] = hashlib.sha256(open(model, "rb").read()).hexdigest()
    a2 = dict(a)
    a2["header"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
    _resave(inst["proof"], a2)
    with pytest.raises(Reject):
        check(model, inst["spec"], inst["proof"])


def test_cli_writes_and_checks_certificates(tmp_path):
    from click.testing import CliRunner

    from crown_cli.cli import cli as main

    inst = _unsat_instance(tmp_path, 5, (3, 12, 12, 12, 2), 0.3)
    proof = str(tmp_path / "cli.proof")
    r = CliRunner().invoke(main, ["verify", "--model", inst["model"], "--spec", inst["spec"],
                                  "--timeout", "60", "--proof", proof, "-q"])
    assert r.exit_code == 0 and r.output.startswith("unsat"), r.output
    r = CliRunner().invoke(main, ["check", "--model", inst["model"], "--spec", inst["spec"],
                                  "--proof", proof])
    assert r.exit_code == 0 and "accepted" in r.output, r.output
    # an instance list: one certificate per unsat line, named by the line
    (tmp_path / "list.csv").write_text("net.npz,p.vnnlib,60\nnet.npz,p.vnnlib,60\n")
    r = CliRunner().invoke(main, ["verify", "--instances", str(tmp_path / "list.csv"),
                                  "--proof", str(tmp_path / "proofs"), "-o",
                                  str(tmp_path / "out.csv"), "-q"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "proofs").iterdir()) == \
        ["0000_net_p.proof", "0001_net_p.proof"]
    r = CliRunner().invoke(main, ["check", "--instances", str(tmp_path / "list.csv"),
                                  "--proof", str(tmp_path / "proofs")])
    assert r.exit_code == 0 and r.output.count("accepted") == 2, r.output


def test_no_certificate_for_a_graph_on_the_graph_engine(tmp_path):
    from types import SimpleNamespace

    v = SimpleNamespace(result="unsat", proof=None)
    graph_only = SimpleNamespace(weights=[np.zeros((2, 2))])
    assert "graphs lowered to them" in write_verdict_proof(v, graph_only, "m", "s",
                                                           str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()
    assert write_verdict_proof(SimpleNamespace(result="sat"), graph_only, "m", "s", "x") == ""


def _conv_onnx(seed, pool="AveragePool"):
    """Conv 1->4 (3x3, pad 1) -> Relu -> ``pool`` 2x2 stride 2 -> Flatten -> Gemm 36->8 ->
    Relu -> Gemm 8->3 on a (1, 1, 6, 6) input. With an average pool a graph crown lowers to
    dense layers exactly (the pool's 1/4 composed with the Gemm); with a max pool one the
    graph engine verifies. The checker reads either as it is written."""
    from graph_models import G

    g = G(np.random.default_rng(seed))
    x = g.op("Relu", [g.op("Conv", ["x", g.rand(4, 1, 3, 3), g.rand(4, scale=0.1)],
                          pads=[1, 1, 1, 1])])
    x = g.op("Flatten", [g.op(pool, [x], kernel_shape=[2, 2], strides=[2, 2])])
    x = g.op("Relu", [g.op("Gemm", [x, g.rand(8, 36), g.rand(8, scale=0.1)], transB=1)])
    x = g.op("Gemm", [x, g.rand(3, 8), g.const([0.5, 0.0, 0.0])], transB=1)
    return g.model([("x", (1, 1, 6, 6))], [x])


@pytest.mark.parametrize("pool", [slow_if(True, "AveragePool"), "MaxPool"])
def test_convolutional_graph_certificate_accepted_then_tampered(tmp_path, pool):
    """An unsat the crown stage proves on a convolutional graph (lowered to dense layers, or
    on the graph engine with its max pool): the certificate is accepted; the model changed
    (and the certificate's hash with it), rejected by the bound."""
    import hashlib
    import json

    from click.testing import CliRunner
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    from crown_cli.cli import cli as main

    m = _conv_onnx(3, pool)
    model = tmp_path / "conv.onnx"
    model.write_bytes(m.SerializeToString())
    rng = np.random.default_rng(0)
    x0 = rng.uniform(0.0, 1.0, 36)
    lo, hi = x0 - 0.05, x0 + 0.05
    ev = ReferenceEvaluator(m)
    X = rng.uniform(lo, hi, (3000, 36))
    y = np.concatenate([ev.run(None, {"x": r.reshape(1, 1, 6, 6).astype(np.float32)})[0]
                        for r in X])
    sign = 1.0 if np.median(y[:, 0] - y[:, 1]) > 0 else -1.0
    margin = sign * (y[:, 0] - y[:, 1])
    t = float(margin.min()) - 2.0 * float(np.ptp(margin))  # unsafe: margin <= t
    spec = write_property(tmp_path / "p.vnnlib", lo.tolist(), hi.tolist(),
                          [([sign, -sign, 0.0], t)])
    proof = str(tmp_path / "c.proof")
    r = CliRunner().invoke(main, ["verify", "--model", str(model), "--spec", spec, "--timeout",
                                  "60", "--proof", proof, "-v"])
    assert r.exit_code == 0 and "unsat (crown;" in r.output, r.output
    r = CliRunner().invoke(main, ["inspect", "--model", str(model)])
    assert ("runs on the graph engine" in r.output) == (pool == "MaxPool"), r.output
    args = ["check", "--model", str(model), "--spec", spec, "--proof", proof]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "accepted" in r.output, r.output
    head = _arrays(proof)["header"]
    assert b'"hidden": [144, 8]' in bytes(head)  # the Relus' inputs: conv output, Gemm
    # tampered: the margin's first output moved by 10 against the property (which then fails
    # at every point), the certificate's model hash updated to the new file
    bias = next(i for i in m.graph.initializer if i.name == m.graph.node[-1].input[2])
    moved = np.array([0.5 - 10.0 * sign, 0.0, 0.0], np.float32)
    bias.CopyFrom(numpy_helper.from_array(moved, bias.name))
    model.write_bytes(m.SerializeToString())
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "sha256" in r.output, r.output
    a = _arrays(proof)
    head = json.loads(bytes(a["header"]))
    head["model"]["sha256"] = hashlib.sha256(model.read_bytes()).hexdigest()
    a["header"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
    _resave(proof, a)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "rejected" in r.output and "is not > b_i" in r.output, r.output


def test_proof_mode_records_the_usual_search_for_the_whole_time(monkeypatch, tmp_path):
    """--proof where ReLU splitting optimises per-domain bounds (3+ hidden layers): one
    search, the usual one (slopes and multipliers optimised, each row that narrowed a bound
    recorded), given a tree and the whole time; its unsat gets the recorded certificate."""
    import time

    from crown_cli.verification.bab import relu_split
    from crown_cli.verification.outcome import BabResult

    calls = []

    def fake(problem, until, max_domains=None, seed=0, attack_restarts=0, progress=None,
             proof=None):
        calls.append((proof is not None, until - time.monotonic()))
        proof.prove(0, 0, 0)
        yield 0.5
        return BabResult("unsat", None, 1, 1, np.inf)

    monkeypatch.setattr(relu_split, "relu_split_steps", fake)
    sizes = (70, 16, 16, 16, 3)
    assert relu_split.optimises_domain_bounds(_net(1, sizes)[0])
    ws, bs = _net(1, sizes)
    x0 = np.random.default_rng(2).uniform(-0.5, 0.5, 70)
    spec = write_property(tmp_path / "p.vnnlib", (x0 - 0.01).tolist(), (x0 + 0.01).tolist(),
                          [([1.0, -1.0, 0.0], -1e6)])  # unsat: y_0 - y_1 never that low
    prop = parse_vnnlib(spec, 70, 3)
    v = Verifier(ws, bs, "relu", stages=(), proof=True, attack_time=0.1).verify(prop, 20.0)
    assert v.result == "unsat" and "no certificate" not in v.note, v
    assert len(calls) == 1 and calls[0][0] and calls[0][1] > 0.9 * 20.0
    assert v.proof is not None and v.proof[0]["kind"].tolist() == [0]


def test_graph_certificates_only_where_the_checker_reads_the_graph(tmp_path):
    """proof_shape: a chain of affine, ReLU and max pool nodes gets a certificate network (its
    ReLU nodes' sizes); a residual graph or another activation none (GraphVerifier records
    nothing, and write_verdict_proof says why)."""
    from graph_models import conv_net, residual

    from crown_cli.graph.onnx_graph import load_graph
    from crown_cli.verification.graph_verifier import GraphVerifier, proof_shape

    shapes = {}
    for name, m in [("maxpool", _conv_onnx(3, "MaxPool")),
                    ("residual", residual(np.random.default_rng(0))),
                    ("tanh", conv_net(np.random.default_rng(0), act="Tanh", bn=False))]:
        (tmp_path / f"{name}.onnx").write_bytes(m.SerializeToString())
        g = load_graph(str(tmp_path / f"{name}.onnx"))
        shapes[name] = proof_shape(g)
        assert GraphVerifier(g, proof=True).proof == (shapes[name] is not None)
    assert shapes == {"maxpool": {"inputs": 36, "hidden": [144, 8], "outputs": 3,
                                  "activation": "relu"},
                      "residual": None, "tanh": None}


def test_node_bounds_shared_across_cases_only_along_equal_paths(tmp_path):
    """crown check copies a node's bounds to another case of the certificate only where the
    whole path agrees: a second walk with one ReLU split moved to another neuron (same node
    ids, a warm cache) is checked afresh and rejected."""
    from crown_cli.check import certificate as cert, load_model

    from crown_cli.verification.bab.relu_split import ReluSplitProblem, relu_split_steps
    from crown_cli.verification.outcome import finish
    from crown_cli.verification.proof import ProofTree, save

    inst = _unsat_instance(tmp_path, 11, (4, 16, 16, 16, 2), 0.25)
    c = parse_vnnlib(inst["spec"], 4, 2).cases[0]
    tree = ProofTree()
    finish(relu_split_steps(ReluSplitProblem(inst["ws"], inst["bs"], c.lo, c.hi, c.A, c.b),
                            1e18, attack_restarts=0, proof=tree))
    save(inst["proof"], [dict(tree.case_arrays(0), lo=c.lo, hi=c.hi, A=c.A, b=c.b)],
         {"inputs": 4, "hidden": [16, 16, 16], "outputs": 2, "activation": "relu"},
         inst["model"], inst["spec"])
    net = load_model(inst["model"], open(inst["model"], "rb").read())
    with np.load(inst["proof"]) as z:
        a = cert.case_arrays(z, 0, net)
    child1 = cert.structure(a, net, 1)
    bf = np.array([np.nextafter(inst["t"], -np.inf)])
    from fractions import Fraction
    cache = {}
    n = cert.walk(net, a, child1, bf, [Fraction(inst["t"])], cache=cache)
    assert n == a["kind"].size and len(cache) == n  # every node's bounds kept
    assert cert.walk(net, a, child1, bf, [Fraction(inst["t"])], cache=cache) == n
    relu = np.flatnonzero(a["kind"] == RELU)
    assert relu.size
    b = dict(a, arg=a["arg"].copy())
    b["arg"][relu[0]] = (a["arg"][relu[0]] + 7) % int(net.offsets[-1])
    with pytest.raises(Reject):
        cert.walk(net, b, child1, bf, [Fraction(inst["t"])], cache=cache)


@pytest.mark.parametrize("conv", [False, True])
def test_residual_graph_verify_certificate_accepted(tmp_path, conv):
    """An unsat the crown stage proves on a residual network (identity and projected skips,
    a Sub of two data tensors; on the graph engine): the certificate is written and
    accepted, its network the sizes the checker numbers its layers with; a property the
    network violates at a point of the box gets no certificate the checker would accept."""
    from click.testing import CliRunner

    import hashlib
    import json

    from crown_cli.check import load_model as checker_model
    from crown_cli.cli import cli as main
    from crown_cli.io.networks import load_network
    from test_proof_certify import _residual_onnx

    m, n_in = _residual_onnx(np.random.default_rng(5), conv)
    model = tmp_path / "res.onnx"
    model.write_bytes(m.SerializeToString())
    graph = load_network(str(model))
    rng = np.random.default_rng(0)
    x0 = rng.uniform(0.0, 1.0, n_in)
    lo, hi = x0 - 0.01, x0 + 0.01
    y = graph.forward(rng.uniform(lo, hi, (3000, n_in)))
    margin = y[:, 0] - y[:, 1]
    t = float(margin.min()) - 2.0 * float(np.ptp(margin)) - 0.1  # unsafe: margin <= t
    spec = write_property(tmp_path / "p.vnnlib", lo.tolist(), hi.tolist(),
                          [([1.0, -1.0, 0.0], t)])
    proof = str(tmp_path / "c.proof")
    r = CliRunner().invoke(main, ["verify", "--model", str(model), "--spec", spec, "--timeout",
                                  "60", "--proof", proof, "-v"])
    assert r.exit_code == 0 and "unsat (crown;" in r.output, r.output
    r = CliRunner().invoke(main, ["check", "--model", str(model), "--spec", spec, "--proof",
                                  proof])
    assert r.exit_code == 0 and "accepted" in r.output, r.output
    head = json.loads(bytes(_arrays(proof)["header"]))
    assert head["network"]["hidden"] == [int(h) for h in checker_model(str(model)).hidden]
    # the same certificate for a property the network violates (its threshold above a
    # margin of the box's centre): rejected
    t_bad = float(graph.forward(x0[None])[0, 0] - graph.forward(x0[None])[0, 1]) + 0.01
    bad_spec = write_property(tmp_path / "q.vnnlib", lo.tolist(), hi.tolist(),
                              [([1.0, -1.0, 0.0], t_bad)])
    a = _arrays(proof)
    head["property"]["sha256"] = hashlib.sha256(open(bad_spec, "rb").read()).hexdigest()
    a["header"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
    a["c0_b"] = np.array([t_bad])
    _resave(proof, a)
    r = CliRunner().invoke(main, ["check", "--model", str(model), "--spec", bad_spec,
                                  "--proof", proof])
    assert r.exit_code == 1 and "rejected" in r.output and "is not > b_i" in r.output, r.output
