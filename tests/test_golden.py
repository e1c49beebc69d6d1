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

from conftest import HERE, model_path, slow_if
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


def _rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def _recomputed_lower_bound(row, x, certifiers, floored=False):
    """The margin lower bound at the golden row's eps, recomputed without any search; for a
    targeted row that took the untargeted row's radius (``floored``), the untargeted bound
    it took with it (docs/cli.md, crown certify)."""
    from crown_cli.certification.certifier import Certifier
    from crown_cli.io.models import load_model

    key = (row["norm"], row["method"])
    if key not in certifiers:
        mlp = certifiers.setdefault("mlp", load_model(certifiers["path"]))
        certifiers[key] = Certifier(mlp.weights, mlp.biases, mlp.activation, norm=row["norm"],
                                    method=row["method"], alpha=mlp.alpha)
    cert = certifiers[key]
    c = int(row["predicted"])
    classes = cert.net.W[-1].shape[0]
    targets = [int(row["target"])] if row["target"] and not floored else \
        [t for t in range(classes) if t != c]
    i = int(row["image"])
    return float(cert.lower_bound(x[i], float(row["eps"]), cert.margin_rows(c, targets)).min())


# the 20-neuron networks in the default tier, the 1024-neuron ones in the slow tier
@pytest.mark.parametrize("name", [slow_if("1024" in n, n) for n in sorted(CASES)])
def test_golden(name, tmp_path, regen_golden, mnist100):
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
    certifiers = {"path": CASES[name][1]}
    untargeted = {(w["image"], w["norm"], w["method"]): w["eps"] for w in want
                  if w["target_type"] == "untargeted"}
    for g, w in zip(got, want):
        for key in ("image", "label", "predicted", "target", "target_type", "norm", "method",
                    "status"):
            assert g[key] == w[key], (key, w)
        if w["status"] != "certified":
            continue
        # the searched radius may land anywhere within the search tolerance of the limit ...
        assert float(g["eps"]) == pytest.approx(float(w["eps"]), rel=2 * float(w["rtol"])), w
        assert float(g["margin"]) == pytest.approx(float(w["margin"]), rel=1e-12)
        # ... but the bound at a given radius is deterministic: any change in it shows here
        floored = w["target"] != "" and \
            untargeted.get((w["image"], w["norm"], w["method"])) == w["eps"]
        lb = _recomputed_lower_bound(w, mnist100[0], certifiers, floored)
        assert lb == pytest.approx(float(w["lower_bound"]), rel=1e-7, abs=1e-10 * float(w["margin"])), w
