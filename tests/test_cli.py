"""The `crown` command through click's CliRunner and as a real subprocess."""
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, model_path
from crown_cli.engine.kernels import using_kernels
from crown_cli.certification.certifier import Certifier
from crown_cli.cli import cli
from crown_cli.io.models import load_model, save_npz
from crown_cli.io.results import COLUMNS

SMALL = model_path("mnist_2x20.h5")
BIG = model_path("mnist_3x1024.h5")
HEADER = "image,label,predicted,target,target_type,norm,method,eps,time_s,evaluations,status"


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result


def rows_of(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_certify_writes_the_documented_csv(tmp_path):
    out = tmp_path / "r.csv"
    res = run("certify", "--model", SMALL, "-n", 8, "--target", "runner-up,random,least,untargeted",
              "-o", out)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.startswith(HEADER + ",") and text.splitlines()[0].split(",") == list(COLUMNS)
    rows = rows_of(text)
    assert len(rows) == 8 * 4
    assert [int(r["image"]) for r in rows] == [i for i in range(8) for _ in range(4)]
    mlp = load_model(SMALL)
    # the same kernels as the run (--kernels auto), as recorded in its sidecar
    kernels = json.loads((tmp_path / "r.csv.json").read_text())["runs"][-1]["kernels"]
    with using_kernels(kernels):
        cert = Certifier(mlp.weights, mlp.biases, mlp.activation)
    from crown_cli.io.images import load_images

    x, y = load_images(None)
    by_type = {}
    for r in rows:
        by_type.setdefault(int(r["image"]), {})[r["target_type"]] = r
        if r["status"] == "misclassified":
            assert r["eps"] == "" and int(r["label"]) != int(r["predicted"])
            continue
        assert r["status"] == "certified" and float(r["eps"]) > 0
        assert int(r["evaluations"]) > 0 and float(r["time_s"]) >= 0
        assert r["norm"] == "inf" and r["method"] == "crown"
    # the CSV holds exactly what the engine certifies for that target, or the untargeted
    # radius where that is larger (an untargeted certificate holds for every target)
    for i in range(3):
        r = by_type[i]["runner-up"]
        if r["status"] == "certified":
            with using_kernels(kernels):
                direct = cert.certify(x[i], int(r["predicted"]), [int(r["target"])])
                untargeted = cert.certify(x[i], int(r["predicted"]),
                                          [t for t in range(10) if t != int(r["predicted"])])
            assert float(by_type[i]["untargeted"]["eps"]) == untargeted.eps
            assert float(r["eps"]) == max(direct.eps, untargeted.eps)


def test_start_replays_the_random_target_stream(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert run("certify", "--model", SMALL, "-n", 12, "--target", "random", "-o", a, "-q").exit_code == 0
    assert run("certify", "--model", SMALL, "--start", 7, "-n", 5, "--target", "random", "-o", b,
               "-q").exit_code == 0
    ra, rb = rows_of(a.read_text()), rows_of(b.read_text())
    strip = lambda r: {k: v for k, v in r.items() if k != "time_s"}  # noqa: E731
    assert [strip(r) for r in ra[7:]] == [strip(r) for r in rb]


def test_several_norms_and_methods(tmp_path):
    out = tmp_path / "r.csv"
    res = run("certify", "--model", SMALL, "-n", 3, "--norm", "inf,2,1", "--method", "crown,fast-lin",
              "-o", out, "-q")
    assert res.exit_code == 0 and res.output == ""
    rows = rows_of(out.read_text())
    assert {(r["norm"], r["method"]) for r in rows} == {
        (n, m) for n in ("inf", "2", "1") for m in ("crown", "fast-lin")}


def test_summary_goes_to_stderr_and_csv_to_stdout():
    res = CliRunner(mix_stderr=False).invoke(cli, ["certify", "--model", SMALL, "-n", 2]) \
        if "mix_stderr" in CliRunner.__init__.__code__.co_varnames \
        else CliRunner().invoke(cli, ["certify", "--model", SMALL, "-n", 2])
    assert res.exit_code == 0
    assert res.stdout.startswith(HEADER)
    assert "crown: " in res.stderr and "rows for 2 images" in res.stderr


def test_inspect():
    res = run("inspect", "--model", BIG)
    assert res.exit_code == 0
    assert "activation:  relu" in res.output and "input size:  784" in res.output
    assert "784-1024-1024-10" in res.output
    assert f"parameters:  {784 * 1024 + 1024 + 1024 * 1024 + 1024 + 10240 + 10:,}" in res.output


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def bad_files(tmp_path):
    W = [np.ones((4, 784)), np.ones((10, 4))]
    b = [np.zeros(4), np.zeros(10)]
    W[0][0, 0] = np.nan
    save_npz(tmp_path / "nan.npz", W, b)
    save_npz(tmp_path / "small.npz", [np.ones((4, 9)), np.ones((10, 4))], b)
    (tmp_path / "corrupt.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"garbage" * 10)
    np.savez(tmp_path / "imgs.npz", x=np.zeros((3, 100)), y=np.zeros(3, int))
    return tmp_path


@pytest.mark.parametrize("args,message", [
    (["--model", "{t}/missing.h5"], "{t}/missing.h5: model file not found"),
    (["--model", "{t}/corrupt.h5"], "{t}/corrupt.h5: cannot read HDF5 file"),
    (["--model", "{t}/nan.npz"], "{t}/nan.npz: layer 0 contains NaN or infinite values"),
    (["--model", "{t}/small.npz"], "default MNIST images: images have 784 values each but the model "
                                   "{t}/small.npz expects 9 inputs"),
    (["--model", SMALL, "--images", "{t}/imgs.npz"], "{t}/imgs.npz: images have 100 values each"),
    (["--model", SMALL, "--images", "{t}/none.csv"], "{t}/none.csv: image file not found"),
    (["--model", SMALL, "--norm", "3"], "--norm: unknown value '3'"),
    (["--model", SMALL, "--method", "lp"], "--method: unknown value 'lp'"),
    (["--model", SMALL, "--target", "second"], "--target: unknown target 'second'"),
    (["--model", SMALL, "--activation", "swish"], "--activation: unknown activation 'swish'"),
    (["--model", SMALL, "--rtol", "0"], "--rtol: must lie in (0, 1), got 0.0"),
    (["--model", SMALL, "--eps0", "-1"], "--eps0: must be > 0 and at most --max-eps (10000), got -1.0"),
    (["--model", SMALL, "--start", "100"], "--start: 100 is past the last image (100 images"),
    (["--model", model_path("mnist_3x1024_tanh.h5"), "--method", "fast-lin"],
     "--method fast-lin is defined for ReLU-type networks only, not 'tanh'"),
    (["--model", model_path("mnist_3x1024_tanh.h5"), "--kernels", "numpy"],
     "--kernels numpy: the tanh relaxation needs numba (numpy has relu, leaky_relu, sign, floor); "
     "use --kernels numba or auto"),
])
def test_bad_input_one_line_exit_2(bad_files, args, message):
    t = str(bad_files)
    out = bad_files / "out.csv"
    out.write_text("precious\n")
    res = run("certify", *[a.format(t=t) for a in args], "-o", out, "--overwrite")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crown: error: ")
    assert message.format(t=t) in lines[0]
    assert "Traceback" not in res.output
    assert out.read_text() == "precious\n"  # nothing already written is lost


def test_existing_output_is_not_replaced_without_overwrite(tmp_path):
    out = tmp_path / "out.csv"
    out.write_text("precious\n")
    res = run("certify", "--model", SMALL, "-n", 1, "-o", out)
    assert res.exit_code == 2 and f"{out}: output file exists; pass --overwrite" in res.output
    assert out.read_text() == "precious\n"


def test_usage_errors_exit_2():
    assert run("certify").exit_code == 2  # --model missing
    assert run("certify", "--model", SMALL, "--num-images", "0").exit_code == 2


def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path):
    """--debug on bad input: the traceback, then the same one-line message and exit code 2
    (before: exit code 1, the code of an internal error)."""
    res = run("certify", "--model", str(tmp_path / "missing.h5"), "--debug")
    assert res.exit_code == 2
    err = res.stderr
    assert "Traceback (most recent call last)" in err and "InputError" in err
    assert err.strip().splitlines()[-1].startswith("crown: error: ")
    assert "model file not found" in err.strip().splitlines()[-1]
    plain = run("certify", "--model", str(tmp_path / "missing.h5"))
    assert plain.exit_code == 2 and "Traceback" not in plain.stderr


# ----------------------------------------------------------------------------- subprocess


def crown_cmd():
    return [sys.executable, "-m", "crown_cli"]


def test_real_subprocess_run_and_error(tmp_path):
    out = tmp_path / "r.csv"
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run(crown_cmd() + ["certify", "--model", SMALL, "-n", "3", "-o", str(out)],
                        capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert out.read_text().startswith(HEADER) and len(out.read_text().splitlines()) == 4
    assert "rows for 3 images" in ok.stderr
    bad = subprocess.run(crown_cmd() + ["certify", "--model", "nope.h5"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == "crown: error: nope.h5: model file not found\n"


# Runs crown certify in a fresh interpreter, then reports which heavy modules it imported.
IMPORTS_AFTER = """
import json, sys
from crown_cli.cli import cli
cli(sys.argv[1:], standalone_mode=False)
print(json.dumps({m: m in sys.modules for m in ("numba", "scipy")}))
"""


def _imports_of_certify(tmp_path, model, *extra):
    out = tmp_path / "r.csv"
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", IMPORTS_AFTER, "certify", "--model", model,
                          "-n", "1", "-q", "-o", str(out), "--overwrite", *extra],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(out.read_text().splitlines()) == 2
    side = json.loads((tmp_path / "r.csv.json").read_text())
    return json.loads(res.stdout.splitlines()[-1]), side["runs"][-1]


def test_one_image_of_a_relu_model_runs_without_numba(tmp_path):
    # the default --kernels auto picks numpy for one image: no numba, no scipy at all
    imported, run = _imports_of_certify(tmp_path, BIG)
    assert imported == {"numba": False, "scipy": False}
    assert run["kernels"] == "numpy" and run["threads"]["numba"] is None
    assert run["versions"]["numba"] and run["versions"]["scipy"]  # read without importing
    # the same run with the numba kernels does import numba (the check above can fail)
    imported, run = _imports_of_certify(tmp_path, SMALL, "--kernels", "numba")
    assert imported["numba"] and run["kernels"] == "numba"
    assert isinstance(run["threads"]["numba"], int)


def test_auto_kernels_rule():
    from crown_cli.certification.runner import choose_kernels

    relu3 = [w.shape for w in load_model(BIG).weights]
    relu4 = [w.shape for w in load_model(model_path("mnist_4x1024.h5")).weights]
    small = [w.shape for w in load_model(SMALL).weights]
    assert choose_kernels("auto", "relu", relu3, 1) == "numpy"
    assert choose_kernels("auto", "relu", relu4, 1) == "numpy"
    assert choose_kernels("auto", "relu", relu4, 3) == "numba"
    assert choose_kernels("auto", "leaky_relu", relu3, 2) == "numpy"
    assert choose_kernels("auto", "relu", relu3, 100) == "numba"
    assert choose_kernels("auto", "relu", small, 100) == "numpy"
    assert choose_kernels("auto", "relu", small, 10000) == "numba"
    assert choose_kernels("auto", "tanh", small, 1) == "numba"  # no numpy relaxation
    assert choose_kernels("numba", "relu", small, 1) == "numba"
    assert choose_kernels("numpy", "relu", relu3, 10000) == "numpy"


@pytest.mark.slow
def test_killed_run_keeps_every_finished_row(tmp_path):
    out = tmp_path / "r.csv"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(crown_cmd() + ["certify", "--model", BIG, "-n", "100", "--norm", "2",
                                           "--rtol", "1e-8", "-o", str(out), "-q"],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines = out.read_text().splitlines()
    assert len(lines) >= 4 and out.read_text().endswith("\n")
    rows = rows_of(out.read_text())
    assert len(rows) == len(lines) - 1 < 101
    assert all(len(r) == len(COLUMNS) and r["status"] for r in rows)


def test_progress_bar_only_on_a_terminal(tmp_path, monkeypatch):
    """certify's bar (images done, last eps) goes to stderr on a terminal only: a file or
    pipe (cron, logs) gets the summary line alone."""
    from crown_cli.io import progress

    res = run("certify", "--model", SMALL, "-n", 3, "-o", tmp_path / "a.csv")
    assert res.exit_code == 0 and "img" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    res = run("certify", "--model", SMALL, "-n", 3, "-o", tmp_path / "b.csv")
    assert res.exit_code == 0, res.output
    frames = res.stderr.replace("\r", "\n").splitlines()
    assert any(f.startswith("certify: 100%") and "3/3" in f and "img" in f and "eps=" in f
               for f in frames), res.stderr


def test_the_crown_command_tunes_glibcs_allocator(monkeypatch):
    """crown_cli/runtime.py: on Linux with glibc both mallopt calls succeed, and the crown
    group calls it before any command."""
    import platform

    from crown_cli import runtime

    ok = runtime.tune_allocator()
    assert ok == (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc")
    calls = []
    monkeypatch.setattr(runtime, "tune_allocator", lambda: calls.append(1) or True)
    r = CliRunner().invoke(cli, ["inspect", "--model", "nothing.npz"])
    assert r.exit_code == 2 and calls == [1], r.output
