"""The public Python API (crown_cli.api, docs/api.md): the same radii and verdicts as the CLI,
input checks at the edge, cheap import, and docs/api.md's example run as a test."""
import contextlib
import dataclasses
import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import crown_cli
from crown_cli import InputError
from crown_cli.cli import cli
from crown_cli.io.results import format_value, read_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SMALL = os.path.join(ROOT, "models", "mnist_2x20.h5")
DOC = os.path.join(ROOT, "docs", "api.md")


def run_cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def model():
    return crown_cli.load_model(SMALL)


@pytest.fixture(scope="module")
def images():
    return crown_cli.load_images()


# ----------------------------------------------------------------------- public names, import


def test_public_names():
    for name in ("load_model", "load_images", "certify", "verify", "Certification",
                 "InputError", "__version__"):
        assert hasattr(crown_cli, name), name
    assert crown_cli.InputError is __import__("crown_cli.errors").errors.InputError
    assert set(crown_cli.__all__) >= {"load_model", "load_images", "certify", "verify",
                                      "Certification", "InputError"}


def test_import_is_cheap():
    code = ("import sys, crown_cli; "
            "print(sorted(m for m in ('numba', 'numpy', 'click', 'crown_cli.engine.dense_crown') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ----------------------------------------------------------------------- certify == crown certify


def _cli_rows(tmp_path, *args):
    out = tmp_path / "rows.csv"
    r = run_cli("certify", "--model", SMALL, "-o", out, "-q", *args)
    assert r.exit_code == 0, r.output
    return read_rows(str(out))


def _same_as_row(rec, row, label):
    assert format_value(rec.eps) == row["eps"]
    assert rec.status == row["status"]
    assert rec.predicted == int(row["predicted"]) and rec.label == label == int(row["label"])
    assert format_value(rec.target) == row["target"]
    assert rec.target_type == row["target_type"]
    assert rec.norm == row["norm"] and rec.method == row["method"]
    assert rec.evaluations == int(row["evaluations"])
    assert format_value(rec.margin) == row["margin"]
    assert format_value(rec.lower_bound) == row["lower_bound"]


def test_certify_gives_the_cli_radius(tmp_path, model, images):
    # 3 images x 3 targets x 2 norms x 2 methods: the CLI's --kernels auto picks numpy for this
    # job as certify's auto does for one row (a 2x20 network)
    rows = _cli_rows(tmp_path, "-n", 3, "--target", "runner-up,least,untargeted",
                     "--norm", "inf,2", "--method", "crown,fast-lin")
    assert len(rows) == 36
    x, y = images
    recs = {}
    for row in rows:
        i = int(row["image"])
        rec = crown_cli.certify(model, x[i], label=int(y[i]), target=row["target_type"],
                                norm=row["norm"], method=row["method"])
        assert rec.kernels == "numpy"
        assert rec.status == "certified" and rec.eps > 0
        recs[i, row["norm"], row["method"], row["target_type"]] = rec
    for row in rows:
        i = int(row["image"])
        rec = recs[i, row["norm"], row["method"], row["target_type"]]
        floor = recs[i, row["norm"], row["method"], "untargeted"]
        if floor.eps > rec.eps:  # the run also certified untargeted: a floor for its targets
            rec = dataclasses.replace(rec, eps=floor.eps, status=floor.status,
                                      lower_bound=floor.lower_bound)
        _same_as_row(rec, row, int(y[i]))


def test_certify_options_and_kernels_as_the_cli(tmp_path, model, images):
    x, y = images
    # the random target of image 0 (the CLI's stream starts there), other options, numba
    rows = _cli_rows(tmp_path, "-n", 1, "--target", "random", "--norm", "1", "--method",
                     "alpha-crown", "--alpha-iters", 5, "--rtol", 1e-6, "--precision", "float64",
                     "--search", "bisect", "--eps0", 0.05, "--seed", 7, "--kernels", "numba")
    rec = crown_cli.certify(model, x[0], label=int(y[0]), target="random", norm=1,
                            method="alpha-crown", alpha_iters=5, rtol=1e-6, precision="float64",
                            search="bisect", eps0=0.05, seed=7, kernels="numba")
    assert rec.kernels == "numba"
    _same_as_row(rec, rows[0], int(y[0]))
    # a class index as target: the runner-up's radius
    ru = crown_cli.certify(model, x[0])
    assert crown_cli.certify(model, x[0], target=ru.target).eps == ru.eps
    # a model path, and x of another shape with 784 values
    assert crown_cli.certify(SMALL, x[0].reshape(28, 28), target=ru.target).eps == ru.eps


@pytest.mark.parametrize("a,b", [("2", 2.0), ("1", 1.0), ("inf", float("inf")), ("2", 2)])
def test_a_norm_as_a_number_is_the_norm(model, images, a, b):
    """norm=2.0 and 1.0 (floats, as float('inf') is) name the l_2 and l_1 norms (they were
    refused as "unknown norm '2.0'")."""
    x = images[0][0]
    assert crown_cli.certify(model, x, norm=b).eps == crown_cli.certify(model, x, norm=a).eps


def test_misclassified_like_the_cli(tmp_path, model, images):
    x, y = images
    pred = np.argmax(model.forward(x), axis=1)
    wrong = int(np.flatnonzero(pred != y)[0])
    row = _cli_rows(tmp_path, "--start", wrong, "-n", 1)[0]
    rec = crown_cli.certify(model, x[wrong], label=int(y[wrong]))
    assert rec.status == row["status"] == "misclassified"
    assert rec.eps is None and row["eps"] == ""
    assert rec.predicted == int(row["predicted"]) == pred[wrong]
    assert format_value(rec.target) == row["target"] and rec.evaluations == 0
    # without a label the predicted class is certified
    assert crown_cli.certify(model, x[wrong]).status == "certified"


def test_certification_is_frozen(model, images):
    rec = crown_cli.certify(model, images[0][0])
    with pytest.raises(Exception):
        rec.eps = 1.0


def test_subprocess_one_liner_gives_the_cli_eps(tmp_path):
    row = _cli_rows(tmp_path, "--start", 4, "-n", 1, "--norm", "2")[0]
    code = ("import crown_cli; x, y = crown_cli.load_images(); "
            "print(repr(crown_cli.certify(crown_cli.load_model('models/mnist_2x20.h5'), x[4], "
            "label=int(y[4]), norm='2').eps))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), cwd=ROOT, check=True).stdout
    assert out.strip() == row["eps"]


# ----------------------------------------------------------------------- certify input checks


@pytest.mark.parametrize("kwargs, message", [
    (dict(x=np.zeros(100)), "x: has 100 values (shape (100,)) but the model expects 784 inputs"),
    (dict(x=np.full(784, np.nan)), "x: contains NaN or infinite values"),
    (dict(x=np.zeros(784, complex)), "x: expected real numbers, got complex values"),
    (dict(x="abc"), "x: expected an array of numbers"),
    (dict(target="second"), "target: unknown target 'second' (choose from runner-up, random, "
                            "least, untargeted)"),
    (dict(target="least,random"), "target: one target per call, got 'least,random'"),
    (dict(target=10), "target: 10 is not a class of the model (0..9)"),
    (dict(target=7), "target: 7 is the predicted class; choose another class"),
    (dict(target=1.5), "target: expected one of runner-up, random, least, untargeted or a "
                       "class index, got 1.5"),
    (dict(norm="l3"), "norm: unknown norm 'l3' (choose from inf, 2, 1)"),
    (dict(method="deeppoly"), "method: unknown method 'deeppoly' (choose from crown, crown-paper, "
                              "fast-lin, "
                              "crown-quad, alpha-crown,"),
    (dict(label=12), "label: 12 is not a class of the model (0..9)"),
    (dict(label=-1), "label: -1 is not a class of the model (0..9)"),
    (dict(label=7.0), "label: must be an integer class index, got 7.0"),
    (dict(rtol=2.0), "rtol: must lie in (0, 1), got 2.0"),
    (dict(eps0=0.0), "eps0: must be > 0, got 0.0"),
    (dict(max_eps=-1), "max_eps: must be > 0, got -1"),
    (dict(eps0=0.01, max_eps=0.001), "eps0: must be at most max_eps (0.001), got 0.01"),
    (dict(timeout=0), "timeout: must be > 0, got 0"),
    (dict(alpha_iters=3), "alpha_iters/alpha_lr: need method alpha-crown"),
    (dict(method="alpha-crown", alpha_iters=-1), "alpha_iters: must be an integer >= 0, got -1"),
    (dict(method="alpha-crown", alpha_lr=0), "alpha_lr: must be > 0, got 0"),
    (dict(search="golden"), "search: unknown search 'golden' (choose from interp, bisect)"),
    (dict(precision="half"), "precision: unknown precision 'half' (choose from mixed, float64)"),
    (dict(seed=1.5), "seed: must be an integer, got 1.5"),
    (dict(kernels="cuda"), "kernels: unknown kernels 'cuda' (choose from auto, numba, numpy)"),
])
def test_certify_input_errors(model, images, kwargs, message):
    args = dict(x=images[0][0])
    args.update(kwargs)
    with pytest.raises(InputError) as err:
        crown_cli.certify(model, **args)
    text = str(err.value)
    assert "\n" not in text and "--" not in text
    assert text.startswith(message)


def test_certify_errors_for_models(tmp_path):
    x = np.zeros(784)
    with pytest.raises(InputError, match=r"^model: expected a network from crown_cli.load_model"):
        crown_cli.certify([1, 2], x)
    with pytest.raises(InputError, match=r"nope\.h5: model file not found$"):
        crown_cli.certify(str(tmp_path / "nope.h5"), x)
    # a method the network's activation does not support: the Certifier's message
    tanh = crown_cli.load_model(SMALL, activation="tanh")
    with pytest.raises(InputError, match=r"^method fast-lin is defined for ReLU-type networks "
                                         r"only, not 'tanh'$"):
        crown_cli.certify(tanh, x, method="fast-lin")
    # a 3-class network: no random target
    path = tmp_path / "three.npz"
    np.savez(path, W0=np.eye(3, 784), b0=np.zeros(3), W1=np.eye(3), b1=np.zeros(3))
    with pytest.raises(InputError,
                       match=r"^target random: needs at least 4 classes \(the model has 3\)"):
        crown_cli.certify(str(path), x + 0.1 * np.arange(784) / 784, target="random")


def test_load_images_names_its_parameters():
    """load_images' messages name the Python parameter (labels), not the CLI option."""
    import crown_cli

    shipped = crown_cli.__file__.replace("__init__.py", "data/mnist_test_100.npz")
    with pytest.raises(InputError) as err:
        crown_cli.load_images(shipped, labels=shipped)
    assert str(err.value).startswith("labels: only used with IDX image files, not ")


def test_load_model_messages_are_the_clis(tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not a model at all")
    for path in (tmp_path / "missing.h5", bad, tmp_path):
        with pytest.raises(InputError) as err:
            crown_cli.load_model(path)
        r = run_cli("inspect", "--model", path)
        assert r.exit_code == 2
        assert r.output.strip() == f"crown: error: {err.value}"
    with pytest.raises(InputError, match=r"^activation: "):
        crown_cli.load_model(SMALL, activation="swishy")
    m = crown_cli.load_model(SMALL, activation="tanh")
    assert m.activation == "tanh"


# ----------------------------------------------------------------------- verify


def tiny_network(tmp_path):
    """2 inputs -> 3 ReLUs -> 2 outputs: y0 = |x0 - x1|, y1 = relu(x0 + x1)."""
    path = tmp_path / "tiny.npz"
    np.savez(path, W0=np.array([[1.0, -1.0], [-1.0, 1.0], [1.0, 1.0]]), b0=np.zeros(3),
             W1=np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), b1=np.zeros(2))
    return str(path)


def vnnlib_text(lo, hi, A, b):
    out = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    out += [f"(declare-const Y_{j} Real)" for j in range(A.shape[1])]
    for i in range(len(lo)):
        out += [f"(assert (>= X_{i} {float(lo[i])!r}))", f"(assert (<= X_{i} {float(hi[i])!r}))"]
    for row, bj in zip(A, b):
        terms = " ".join(f"(* {float(c)!r} Y_{j})" for j, c in enumerate(row) if c != 0)
        out.append(f"(assert (<= (+ {terms}) {float(bj)!r}))")
    return "\n".join(out) + "\n"


LO, HI = np.zeros(2), np.ones(2)
# y0 >= 1.5 somewhere on [0, 1]^2? No: |x0 - x1| <= 1 (CROWN's bound is exactly 1)
UNSAT = (LO, HI, np.array([[-1.0, 0.0]]), np.array([-1.5]))
# y0 >= 0.9 and y1 <= 1.2: yes, x = (1, 0)
SAT = (LO, HI, np.array([[-1.0, 0.0], [0.0, 1.0]]), np.array([-0.9, 1.2]))


def forward64(x):
    h = np.maximum(np.array([[1.0, -1.0], [-1.0, 1.0], [1.0, 1.0]]) @ x, 0.0)
    return np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]) @ h


@pytest.mark.slow  # slow tier since 2026-11-29 (default tier near 10 min cold)
def test_verify_sat_and_unsat_as_the_cli(tmp_path):
    net = tiny_network(tmp_path)
    for name, case, want in (("unsat", UNSAT, "unsat"), ("sat", SAT, "sat")):
        spec = tmp_path / f"{name}.vnnlib"
        spec.write_text(vnnlib_text(*case))
        r = run_cli("verify", "--model", net, "--spec", spec, "--timeout", 20, "-q")
        assert r.exit_code == 0, r.output
        cli_result = r.output.splitlines()[0]
        for s in (case, [case], str(spec), spec):
            v = crown_cli.verify(net, s, timeout=20)
            assert v.result == cli_result == want
            if want == "sat":
                lo, hi, A, b = case
                assert np.all((lo <= v.x) & (v.x <= hi))
                y = forward64(np.asarray(v.x, dtype=np.float64))
                assert np.all(A @ y <= b)
                assert np.array_equal(v.y, y)
                assert v.case == 0
            else:
                assert v.x is None and v.cases_proven == v.cases == 1
    # several cases: violated when one is; the loaded network works the same
    v = crown_cli.verify(crown_cli.load_model(net), [UNSAT, SAT], timeout=20)
    assert v.result == "sat" and v.case == 1
    assert crown_cli.verify(net, [UNSAT, UNSAT], timeout=20, method="crown").result == "unsat"


def test_verify_log_and_options(tmp_path):
    net = tiny_network(tmp_path)
    lines = []
    v = crown_cli.verify(net, UNSAT, timeout=20, method=("crown",), bab=False, log=lines.append)
    assert v.result == "unsat" and v.stage == "crown"
    assert lines == ["crown: 1 of 1 cases proven"]


@pytest.mark.parametrize("spec, message", [
    ((np.zeros(3), np.ones(3), np.ones((1, 2)), [0.0]),
     "spec: lo: has 3 values (shape (3,)) but the model expects 2 inputs"),
    ((np.zeros(2), np.ones(2), np.ones((1, 3)), [0.0]),
     "spec: A has shape (1, 3); expected (m, 2) for a network with 2 outputs"),
    ((np.zeros(2), np.ones(2), np.ones((2, 2)), [0.0]),
     "spec: b has shape (1,); expected (2,), one value per row of A"),
    ((np.array([0.0, 0.5]), np.array([1.0, 0.2]), np.ones((1, 2)), [0.0]),
     "spec: lo > hi at input 1 (0.5 > 0.2)"),
    ((np.array([0.0, np.nan]), np.ones(2), np.ones((1, 2)), [0.0]),
     "spec: lo: contains NaN or infinite values"),
    ((np.zeros(2), np.ones(2), np.ones((1, 2)), [np.nan]),
     "spec: A and b must be finite (no NaN or infinite values)"),
    ((np.zeros(2), np.ones(2), np.ones((1, 2))),
     "spec: expected a tuple (lo, hi, A, b), got a tuple of 3 items"),
    ([UNSAT, [LO, HI, UNSAT[2], UNSAT[3]]],
     "spec case 1: expected a tuple (lo, hi, A, b), got list"),
    ([], "spec: an empty list of cases"),
    (42, "spec: expected a VNN-LIB path, a tuple (lo, hi, A, b), a list of them or a "
         "Property, got int"),
    ("missing.vnnlib", "missing.vnnlib: spec file not found"),
])
def test_verify_input_errors(tmp_path, spec, message):
    with pytest.raises(InputError) as err:
        crown_cli.verify(tiny_network(tmp_path), spec)
    assert str(err.value) == message


@pytest.mark.parametrize("kwargs, message", [
    (dict(timeout=0), "timeout: must be > 0, got 0"),
    (dict(method="crown,deeppoly"), "method: unknown stage 'deeppoly' (choose from crown, "
                                    "alpha-crown, hull)"),
    (dict(attack_time=-1), "attack_time: must be >= 0, got -1"),
    (dict(attack_restarts=0), "attack_restarts: must be an integer >= 1, got 0"),
    (dict(max_domains=1.5), "max_domains: must be an integer >= 1, got 1.5"),
    (dict(workers=0), "workers: must be an integer >= 1, got 0"),
    (dict(workers=3), "workers: must be 1 or 2, got 3"),
])
def test_verify_option_errors(tmp_path, kwargs, message):
    with pytest.raises(InputError) as err:
        crown_cli.verify(tiny_network(tmp_path), UNSAT, **kwargs)
    assert str(err.value) == message


def test_verify_property_of_the_wrong_size(tmp_path):
    from crown_cli.io.vnnlib import Case, Property

    prop = Property(3, 2, [Case(np.zeros(3), np.ones(3), np.ones((1, 2)), np.zeros(1))])
    with pytest.raises(InputError, match=r"^spec: the property has 3 inputs and 2 outputs but "
                                         r"the network has 2 and 2$"):
        crown_cli.verify(tiny_network(tmp_path), prop)


# ----------------------------------------------------------------------- docs/api.md


def doc_blocks():
    """(code, shown output or None) for each ```python block of docs/api.md."""
    text = open(DOC, encoding="utf-8").read()
    blocks = re.findall(r"```(python|text)\n(.*?)```", text, re.S)
    out = []
    for kind, body in blocks:
        if kind == "python":
            out.append([body, None])
        elif out and out[-1][1] is None:
            out[-1][1] = body
    return out


def test_doc_example_runs_and_prints_what_it_shows(tmp_path, monkeypatch):
    blocks = doc_blocks()
    assert len(blocks) >= 4
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository
    namespace = {"__name__": "docs_api"}
    for code, shown in blocks:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, DOC, "exec"), namespace)
        if shown is not None:
            assert buf.getvalue() == shown, code
    # the example's radii are crown certify's
    rows = _cli_rows(tmp_path, "-n", 2)
    x, y = namespace["x"], namespace["y"]
    for row in rows:
        i = int(row["image"])
        rec = crown_cli.certify(namespace["model"], x[i], label=y[i], target="runner-up")
        assert format_value(rec.eps) == row["eps"]
        shown = re.search(rf"image {i}: class \d+ vs \d+: eps (\S+)", blocks[1][1]).group(1)
        assert shown == f"{float(row['eps']):.6f}"
    assert namespace["v"].result == "sat"
