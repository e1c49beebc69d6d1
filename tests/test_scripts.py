"""The paper-reproduction scripts (scripts/paper_*.sh), run small with the methods crown and
fast-lin through `python -m crown_cli`."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPTS = os.path.join(ROOT, "scripts")


def _env(tmp_path, **extra):
    env = dict(os.environ, CROWN=f"{sys.executable} -m crown_cli", OUT=str(tmp_path / "out"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


@pytest.mark.parametrize("name", ["paper_table2.sh", "paper_table3.sh", "paper_figure3.sh"])
def test_scripts_parse(name):
    assert subprocess.run(["bash", "-n", os.path.join(SCRIPTS, name)]).returncode == 0


def test_keep_methods_drops_unsupported_methods(tmp_path):
    cmd = (f"source {SCRIPTS}/paper_lib.sh; "
           "keep_methods crown,crown-quad,lp-full,exact lp-full exact; "
           "echo \"[$(keep_methods exact exact)]\"")
    out = subprocess.run(["bash", "-c", cmd], env=_env(tmp_path), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "crown,crown-quad\n[]\n"


@pytest.mark.slow  # the paper script end to end; the default tier parses every script
def test_figure3_script_end_to_end(tmp_path):
    env = _env(tmp_path, METHODS="crown,fast-lin", NUM_IMAGES="2", TARGETS="runner-up")
    res = subprocess.run(["bash", os.path.join(SCRIPTS, "paper_figure3.sh")], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    parts = [f"mnist_{n}.{s}.csv" for n in ("2x20", "3x20") for s in ("l2", "poly")]
    sidecars = [p + ".json" for p in parts]  # provenance of each result file
    assert sorted(os.listdir(out)) == sorted(["figure3.md", "figure3.tex"] + parts + sidecars)
    md = (out / "figure3.md").read_text()
    rows = [line.split("|")[1:4] for line in md.splitlines() if line.startswith("| mnist")]
    assert [[c.strip() for c in r] for r in rows] == [
        [net, norm, "runner-up"] for net in ("mnist_2x20", "mnist_3x20")
        for norm in ("l_1", "l_2", "l_inf")]
    assert "PGD attack (upper bound)" in md and "CROWN vs Fast-Lin" in md
    assert res.stdout == md  # the script echoes the markdown table
    assert (out / "figure3.tex").read_text().startswith(r"\begin{tabular}")


def test_scripts_stop_on_a_failing_command(tmp_path):
    env = _env(tmp_path, METHODS="no-such-method", NUM_IMAGES="1")
    res = subprocess.run(["bash", os.path.join(SCRIPTS, "paper_table2.sh")], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2
    assert "crown: error: --method: unknown value 'no-such-method'" in res.stderr
    assert not (tmp_path / "out" / "table2.md").exists()


@pytest.mark.slow  # four crown processes; the default tier parses every shell script
def test_survey_benchmarks_reports_loads_refusals_and_missing_files(tmp_path):
    """scripts/survey_benchmarks.py on a made-up benchmark folder: a network that loads and
    its first instance's verdict, one refused by its operator (the one-line error, no
    traceback), a Git LFS pointer and an absent file reported missing."""
    import csv

    import numpy as np
    import onnx

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from graph_models import G, dense_chain

    bench = tmp_path / "bench" / "demo"
    (bench / "onnx").mkdir(parents=True)
    onnx.save(dense_chain(np.random.default_rng(0)), str(bench / "onnx" / "net.onnx"))
    g = G(np.random.default_rng(1))
    onnx.save(g.model([("x", (1, 5))], [g.op("Hardmax", ["x"])]), str(bench / "onnx" / "odd.onnx"))
    (bench / "onnx" / "lfs.onnx").write_text("version https://git-lfs.github.com/spec/v1\n")
    spec = "".join(f"(declare-const X_{i} Real)\n(assert (>= X_{i} -0.01))\n"
                   f"(assert (<= X_{i} 0.01))\n" for i in range(5))
    spec += "".join(f"(declare-const Y_{j} Real)\n" for j in range(3)) + \
        "(assert (<= Y_0 -1000.0))\n"  # far below any output: unsat
    (bench / "p.vnnlib").write_text(spec)
    (bench / "instances.csv").write_text("".join(
        f"onnx/{n}.onnx,p.vnnlib,20\n" for n in ("net", "odd", "lfs", "gone")))
    out = tmp_path / "survey.csv"
    res = subprocess.run([sys.executable, os.path.join(SCRIPTS, "survey_benchmarks.py"),
                          "--root", str(tmp_path / "bench"), "--timeout", "10",
                          "--output", str(out)], env=_env(tmp_path), capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    rows = {r["network"]: r for r in csv.DictReader(open(out))}
    assert rows["onnx/net.onnx"]["loads"] == "yes"
    assert rows["onnx/net.onnx"]["verdicts"].startswith("unsat (")
    assert rows["onnx/odd.onnx"]["loads"] == "no"
    assert "Hardmax" in rows["onnx/odd.onnx"]["error"]
    assert "Traceback" not in rows["onnx/odd.onnx"]["error"]
    assert rows["onnx/lfs.onnx"]["loads"] == rows["onnx/gone.onnx"]["loads"] == "missing"
    assert "demo: 4 networks, 1 load, 1 refused, 2 missing" in res.stdout
