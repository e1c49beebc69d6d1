"""Golden CSVs for the shipped models: any change in a certified bound shows up here.

After an intended change in the bounds, rewrite them with
``python -m pytest tests/test_golden.py --regen-golden`` and review the diff.
"""
import csv
import io
import os
import shutil

import pytest
from click.testing import CliRunner

from conftest import HERE, model_path
from crown_cli.cli import cli

GOLDEN_DIR = os.path.join(HERE, "golden")
CASES = {
    "mnist_2x20": ["--model", model_path("mnist_2x20.h5"), "-n", "20", "--norm", "inf,2,1",
                   "--method", "crown,fast-lin", "--target", "runner-up,random,least,untargeted"],
    "mnist_3x20": ["--model", model_path("mnist_3x20.h5"), "-n", "20", "--norm", "inf,2,1",
                   "--method", "crown,fast-lin", "--target", "runner-up,random,least"],
    "mnist_3x1024": ["--model", model_path("mnist_3x1024.h5"), "-n", "4", "--norm", "inf,2",
                     "--target", "runner-up,random"],
}
FLOATS = ("eps", "margin", "lower_bound")


def _rows(text):
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name, tmp_path, regen_golden):
    out = tmp_path / f"{name}.csv"
    # float64 throughout: float32 products could round differently on another CPU's BLAS kernels
    res = CliRunner().invoke(cli, ["certify", *CASES[name], "--precision", "float64", "-o", str(out),
                                   "-q"])
    assert res.exit_code == 0, res.output
    golden = os.path.join(GOLDEN_DIR, f"{name}.csv")
    if regen_golden:
        shutil.copyfile(out, golden)
    assert os.path.exists(golden), f"{golden} missing: run pytest with --regen-golden"
    got, want = _rows(out.read_text()), _rows(open(golden).read())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key in w:
            if key == "time_s":
                continue
            if key in FLOATS and w[key]:
                # BLAS may sum in another order on another machine: allow rounding-level drift
                assert float(g[key]) == pytest.approx(float(w[key]), rel=1e-6, abs=1e-9), (key, w)
            else:
                assert g[key] == w[key], (key, w)
