"""`crown verify` end to end on the shipped ACAS Xu network (VNN-COMP 2021): result files,
instance lists with resume, shards and merge, counterexamples re-checked with onnx.reference,
and bad input."""
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from crown_cli.cli import cli
from crown_cli.io.networks import load_network
from crown_cli.io.results import read_rows

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
ACASXU = os.path.join(FIXTURES, "ACASXU_run2a_1_1_batch_2000.onnx")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def spec_text(lo, hi, rows):
    """x in [lo, hi] and every (coefs, b) row: coefs . Y <= b is unsafe."""
    out = [f"(declare-const X_{i} Real)" for i in range(5)]
    out += [f"(declare-const Y_{j} Real)" for j in range(5)]
    for i in range(5):
        out += [f"(assert (>= X_{i} {float(lo[i])!r}))", f"(assert (<= X_{i} {float(hi[i])!r}))"]
    for coefs, b in rows:
        terms = " ".join(f"(* {float(c)!r} Y_{j})" for j, c in enumerate(coefs) if c != 0)
        out.append(f"(assert (<= (+ {terms}) {float(b)!r}))")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def acas():
    return load_network(ACASXU).dense


@pytest.fixture
def specs(tmp_path, acas):
    """Three properties on the ACAS network: sat (wide box, outputs above what they reach at
    the centre), unsat (tiny box, far below what any point reaches), and a margin-style one."""
    x0 = np.array([0.1, -0.2, 0.05, 0.3, -0.1])
    y0 = acas.forward(x0)
    wide_lo, wide_hi = x0 - 0.05, x0 + 0.05
    tiny_lo, tiny_hi = x0 - 1e-4, x0 + 1e-4
    e0 = np.eye(5)[0]
    files = {
        "sat": spec_text(wide_lo, wide_hi, [(e0, y0[0] + 1e-3)]),
        "unsat": spec_text(tiny_lo, tiny_hi, [(e0, y0[0] - 0.5 * abs(y0[0]) - 0.1)]),
        "two": spec_text(tiny_lo, tiny_hi, [(e0, y0[0] - 1.0), (-e0, -y0[0] - 1.0)]),
    }
    paths = {}
    for name, text in files.items():
        p = tmp_path / f"{name}.vnnlib"
        p.write_text(text)
        paths[name] = p
    return paths


def parse_result(text):
    lines = text.strip().split("\n")
    pairs = [tok.strip().strip("()").split() for tok in lines[1:] if tok.strip()]
    return lines[0], {name: float(val) for name, val in pairs}


def reference_outputs(x):
    from onnx.reference import ReferenceEvaluator

    import onnx
    from crown_cli.graph.onnx_file import graph_feeds

    ev = ReferenceEvaluator(onnx.load(ACASXU))
    return np.asarray(ev.run(None, graph_feeds(ACASXU, x[None, :])[0])[0], dtype=np.float64).ravel()


def test_single_sat_counterexample_rechecked_with_onnx_reference(tmp_path, specs, acas):
    out = tmp_path / "res.txt"
    r = run("verify", "--model", ACASXU, "--spec", specs["sat"], "--timeout", 30, "-o", out)
    assert r.exit_code == 0, r.output
    verdict, vals = parse_result(out.read_text())
    assert verdict == "sat"
    x = np.array([vals[f"X_{i}"] for i in range(5)])
    y = np.array([vals[f"Y_{j}"] for j in range(5)])
    text = specs["sat"].read_text()
    from crown_cli.io.vnnlib import parse_vnnlib
    case = parse_vnnlib(str(specs["sat"]), 5, 5).cases[0]
    assert np.all(x >= case.lo) and np.all(x <= case.hi)
    assert np.all(case.A @ y <= case.b)
    assert np.array_equal(acas.forward(x), y)
    y_ref = reference_outputs(x)  # an implementation independent of crown's loader
    assert np.allclose(y_ref, y, rtol=1e-5, atol=1e-5)
    assert np.all(case.A @ y_ref <= case.b + 1e-5 * (1 + np.abs(case.b)))
    assert "X_0" in text  # the spec we wrote is the one parsed


def test_single_unsat_to_stdout(specs):
    r = run("verify", "--model", ACASXU, "--spec", specs["unsat"], "--timeout", 30)
    assert r.exit_code == 0, r.output
    assert r.stdout.split("\n")[0] == "unsat"
    assert "crown: unsat (crown; 1 of 1 cases proven" in r.stderr


def test_instances_resume_shards_merge(tmp_path, specs):
    inst = tmp_path / "list.csv"
    inst.write_text("".join(f"{os.path.relpath(ACASXU, tmp_path)},{specs[k].name},20\n"
                            for k in ("sat", "unsat", "two")))
    out = tmp_path / "all.csv"
    r = run("verify", "--instances", inst, "-o", out, "-q")
    assert r.exit_code == 0, r.output
    rows = read_rows(str(out))
    assert [r_["verdict"] for r_ in rows] == ["sat", "unsat", "unsat"]
    assert [r_["index"] for r_ in rows] == ["0", "1", "2"]
    assert rows[0]["counterexample"] and not rows[1]["counterexample"]
    assert float(rows[1]["margin"]) > 0 and rows[1]["stage"] == "crown"
    assert rows[0]["stage"] == "attack"
    x = np.array([float(v) for v in rows[0]["counterexample"].split()])
    y_ref = reference_outputs(x)
    from crown_cli.io.vnnlib import parse_vnnlib
    case = parse_vnnlib(str(specs["sat"]), 5, 5).cases[0]
    assert np.all(case.A @ y_ref <= case.b + 1e-5 * (1 + np.abs(case.b)))
    side = json.loads((tmp_path / "all.csv.json").read_text())
    assert side["kind"] == "verify" and side["complete"] and side["rows"] == 3
    # resume: cut the file after the first row (plus a partial line), continue
    lines = out.read_text().split("\n")
    out.write_text("\n".join(lines[:2]) + "\n" + lines[2][:7])
    r = run("verify", "--instances", inst, "-o", out, "--resume", "-q")
    assert r.exit_code == 0, r.output
    again = read_rows(str(out))
    assert [r_["verdict"] for r_ in again] == ["sat", "unsat", "unsat"]
    assert again[0] == rows[0]  # the kept row is untouched
    # resume with other settings is refused
    r = run("verify", "--instances", inst, "-o", out, "--resume", "--seed", 5)
    assert r.exit_code == 2 and "other settings" in r.output
    # shards and merge
    parts = []
    for k in (1, 2):
        p = tmp_path / f"part{k}.csv"
        r = run("verify", "--instances", inst, "-o", p, "--shard", f"{k}/2", "-q")
        assert r.exit_code == 0, r.output
        parts.append(p)
    merged = tmp_path / "merged.csv"
    r = run("merge", *parts, "-o", merged)
    assert r.exit_code == 0, r.output
    assert "3 instances" in r.output
    m = read_rows(str(merged))
    assert [r_["index"] for r_ in m] == ["0", "1", "2"]
    assert [r_["verdict"] for r_ in m] == ["sat", "unsat", "unsat"]


def test_instance_errors_fail_only_their_row(tmp_path, specs):
    bad = tmp_path / "bad.vnnlib"
    bad.write_text("(declare-const X_0 Real)\n(assert (>= X_0 (exp 1)))\n")
    inst = tmp_path / "list.csv"
    inst.write_text(f"{ACASXU},{specs['unsat']},20\n{ACASXU},{bad},20\n{ACASXU},missing.vnnlib,5\n")
    out = tmp_path / "out.csv"
    r = run("verify", "--instances", inst, "-o", out, "-q")
    assert r.exit_code == 3
    rows = read_rows(str(out))
    assert [r_["verdict"] for r_ in rows] == ["unsat", "error", "error"]
    assert "bad.vnnlib: line 2" in r.stderr
    assert "missing.vnnlib" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", ACASXU], "give --model and --spec, or --instances"),
    (["--model", ACASXU, "--spec", "nope.vnnlib"], "nope.vnnlib"),
    (["--model", "nope.onnx", "--spec", "x.vnnlib"], "nope.onnx: model file not found"),
    (["--instances", "nope.csv"], "nope.csv: instance list not found"),
    (["--model", ACASXU, "--spec", "x", "--timeout", "0"], "--timeout: must be > 0"),
    (["--model", ACASXU, "--spec", "x", "--stages", "magic"], "--stages: unknown value 'magic'"),
    (["--model", ACASXU, "--spec", "x", "--shard", "1/2"], "--shard: only with --instances"),
])
def test_bad_input_one_line_exit_2(args, message, tmp_path):
    r = run("verify", *args)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip().split("\n")
    assert len(err) == 1 and err[0].startswith("crown: error:") and message in err[0]


def test_bad_instance_list_line(tmp_path):
    inst = tmp_path / "list.csv"
    inst.write_text(f"{ACASXU},a.vnnlib,20\n{ACASXU},b.vnnlib\n")
    r = run("verify", "--instances", inst, "-o", tmp_path / "o.csv")
    assert r.exit_code == 2
    assert "list.csv: line 2: expected onnx,vnnlib,timeout" in r.stderr
    assert not (tmp_path / "o.csv").exists()


def test_wrong_sizes_named(tmp_path):
    spec = tmp_path / "p.vnnlib"
    spec.write_text("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (>= X_0 0))\n"
                    "(assert (<= X_0 1))\n(assert (<= Y_0 0))\n")
    r = run("verify", "--model", ACASXU, "--spec", spec)
    assert r.exit_code == 2
    assert "p.vnnlib" in r.stderr


@pytest.fixture
def bab_spec(tmp_path, acas):
    """A property on the ACAS network that needs branch and bound: on a box Y_0 - Y_1 stays
    above a threshold 0.05 under its sampled minimum, which CROWN and alpha-CROWN cannot show."""
    x0 = np.array([0.1, -0.2, 0.05, 0.3, -0.1])
    lo, hi = x0 - 0.08, x0 + 0.08
    X = np.random.default_rng(0).uniform(lo, hi, (2000, 5))
    m = min(float(y[0] - y[1]) for y in map(acas.forward, X))
    spec = tmp_path / "p.vnnlib"
    # unsafe: Y_0 - Y_1 <= m - 0.05
    spec.write_text(spec_text(lo, hi, [(np.eye(5)[0] - np.eye(5)[1], m - 0.05)]))
    return spec


@pytest.mark.slow  # the progress bar test keeps the default tier's check
def test_verbose_shows_branch_and_bound_status(tmp_path, bab_spec, monkeypatch):
    """-v: the stage lines, then the branch and bound's status lines (open domains, worst
    bound, rate) and the case's end; a list run passes them on too."""
    from crown_cli.verification import status as status_mod

    monkeypatch.setattr(status_mod, "STATUS_EVERY_LOG_S", 0.0)
    r = run("verify", "--model", ACASXU, "--spec", bab_spec, "--timeout", 20, "-v")
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert "alpha-crown: 0 of 1 cases proven" in lines, r.stderr
    status = [line for line in lines if line.startswith("bab (input split): case 0 (0 of 1 "
                                                        "proven): ")]
    assert status and all(" open, worst bound " in s and s.endswith(" boxes/s") for s in status)
    assert r.stdout.splitlines()[0] == "unsat"
    (tmp_path / "list.csv").write_text(f"{ACASXU},{bab_spec},20\n")
    r = run("verify", "--instances", tmp_path / "list.csv", "-o", tmp_path / "out.csv", "-v")
    assert r.exit_code == 0, r.output
    assert any(line.startswith("bab (input split): case 0") for line in r.stderr.splitlines())


@pytest.mark.parametrize("option,stage", [("--no-bab", "alpha-crown"),
                                          ("--max-domains=5", "bab")])
def test_without_branch_and_bound_or_over_the_cap_unknown(bab_spec, option, stage):
    """--no-bab stops after the bound stages; a domain cap that the search needs more than
    ends it with unknown (no crash, the worst open bound reported)."""
    r = run("verify", "--model", ACASXU, "--spec", bab_spec, "--timeout", 20, option)
    assert r.exit_code == 0, r.output
    assert r.stdout == "unknown\n"
    assert f"crown: unknown ({stage}; 0 of 1 cases proven, bound margin -" in r.stderr


def test_progress_bar_shows_branch_and_bound_status(tmp_path, bab_spec, monkeypatch):
    """On a terminal the bar carries the branch and bound's status (--spec: seconds of the
    timeout; --instances: instances and verdict counts); never in a log or a pipe."""
    from crown_cli.io import progress
    from crown_cli.verification import status as status_mod

    monkeypatch.setattr(status_mod, "STATUS_EVERY_BAR_S", 0.0)
    r = run("verify", "--model", ACASXU, "--spec", bab_spec, "--timeout", 20)
    assert r.exit_code == 0 and "bab (input split)" not in r.stderr  # not a terminal
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    r = run("verify", "--model", ACASXU, "--spec", bab_spec, "--timeout", 20)
    assert r.exit_code == 0, r.output
    assert r.stdout == "unsat\n"
    frames = r.stderr.replace("\r", "\n").splitlines()
    assert any(f.startswith("verify: ") and " s |" in f
               and "bab (input split): case 0 (0 of 1 proven): " in f and " open, " in f
               for f in frames), r.stderr
    (tmp_path / "list.csv").write_text(f"{ACASXU},{bab_spec},20\n")
    r = run("verify", "--instances", tmp_path / "list.csv", "-o", tmp_path / "out.csv")
    assert r.exit_code == 0, r.output
    frames = r.stderr.replace("\r", "\n").splitlines()
    assert any("inst" in f and "bab (input split): case 0" in f for f in frames), r.stderr
    assert any("unsat=1" in f for f in frames)


def test_workers_share_the_search_and_bad_values_are_refused(bab_spec):
    """--workers 2 (input splitting's rounds shared with a second process) bounds the same
    boxes to the same verdict as --workers 1; a count outside 1..2 is refused in one line."""
    ends = []
    for workers in ("1", "2"):
        r = run("verify", "--model", ACASXU, "--spec", bab_spec, "--timeout", 60, "-v",
                "--workers", workers)
        assert r.exit_code == 0, r.output
        assert r.stdout == "unsat\n"
        ends.append([line for line in r.stderr.splitlines()
                     if line.startswith("bab (input split): case 0: unsat after ")])
    assert ends[0] and ends[0] == ends[1]
    r = run("verify", "--model", ACASXU, "--spec", bab_spec, "--workers", "3")
    assert r.exit_code == 2
    assert "--workers" in r.output and "3" in r.output and "Traceback" not in r.output


def _channel_first_chain(tmp_path):
    """A dense ONNX chain on a (1, 3, 2, 2) image input (Flatten, Gemm, Relu, Gemm): the MLP
    loader reorders its first layer to crown's (H, W, C) image order."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    arrays = {"W1": rng.standard_normal((6, 12)), "b1": rng.standard_normal(6),
              "W2": rng.standard_normal((3, 6)), "b2": rng.standard_normal(3)}
    nodes = [helper.make_node("Flatten", ["x"], ["f"]),
             helper.make_node("Gemm", ["f", "W1", "b1"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 3, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 3])],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = os.path.join(str(tmp_path), "chw.onnx")
    onnx.save(model, path)
    return model, path


def test_verify_reads_x_i_in_the_files_order_on_channel_first_inputs(tmp_path):
    """VNN-LIB's X_i are the ONNX input flattened in its own (C, H, W) order, whatever order
    certify's images take: verify's network equals onnx.reference on them, and a sat
    counterexample (in X_i order) violates the property under onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    from crown_cli.activations import forward
    from crown_cli.io.networks import load_network
    from test_graph_verify import spec

    model, path = _channel_first_chain(tmp_path)
    ref = ReferenceEvaluator(model)
    net = load_network(path, min_outputs=1).dense
    assert net.input_order is not None  # the loader did reorder for images
    ws, bs = net.vnnlib_layers()
    X = np.random.default_rng(1).uniform(-1, 1, (5, 12))
    for x in X:
        y = ref.run(None, {"x": x.reshape(1, 3, 2, 2)})[0][0]
        np.testing.assert_allclose(forward(ws, bs, "relu", x), y, rtol=1e-12, atol=1e-12)
    x0 = X[0]
    y0 = ref.run(None, {"x": x0.reshape(1, 3, 2, 2)})[0][0]
    row = np.array([1.0, -1.0, 0.0])
    b = float(row @ y0) + 1e-3  # x0 itself violates: sat
    p = os.path.join(str(tmp_path), "p.vnnlib")
    with open(p, "w") as fh:
        fh.write(spec(x0 - 0.01, x0 + 0.01, 3, [(row, b)]))
    r = run("verify", "--model", path, "--spec", p, "--timeout", 20)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("sat")
    xs = np.array([float(line.split()[1].rstrip(")")) for line in r.stdout.splitlines()
                   if line.strip().lstrip("(").startswith("X_")])
    assert xs.size == 12
    y = ref.run(None, {"x": xs.reshape(1, 3, 2, 2)})[0][0]
    assert row @ y <= b
    # far below the minimum over the box: unsat, and no sampled point contradicts it
    lo, hi = x0 - 0.01, x0 + 0.01
    S = np.random.default_rng(2).uniform(lo, hi, (2000, 12))
    vals = [row @ ref.run(None, {"x": s.reshape(1, 3, 2, 2)})[0][0] for s in S[:200]]
    b = float(min(vals)) - 1.0
    with open(p, "w") as fh:
        fh.write(spec(lo, hi, 3, [(row, b)]))
    r = run("verify", "--model", path, "--spec", p, "--timeout", 20)
    assert r.exit_code == 0 and r.stdout == "unsat\n", r.output
