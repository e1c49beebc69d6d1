"""Keras 3 ``.keras`` archives written by the real Keras (scripts/make_keras3_fixture.py, jax
backend): crown reads config.json and model.weights.h5 from the zip and must reproduce the
weights and the logits Keras computed. No Keras is needed here."""
from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from crown_cli.cli import cli
from crown_cli.errors import InputError
from crown_cli.io.models import load_model

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "keras3"
NAMES = ["relu_784", "tanh_functional", "leaky_layers"]
SIZES = {"relu_784": [784, 20, 20, 10], "tanh_functional": [6, 8, 8, 3], "leaky_layers": [5, 7, 4]}


def _expected(name):
    with np.load(FIXTURES / f"{name}.expected.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("name", NAMES)
def test_keras_archive_matches_the_keras_weights_and_outputs(name):
    path = FIXTURES / f"{name}.keras"
    with zipfile.ZipFile(path) as zf:  # guard: the native Keras 3 format, written by Keras
        assert {"config.json", "metadata.json", "model.weights.h5"} <= set(zf.namelist())
        assert json.loads(zf.read("metadata.json"))["keras_version"].startswith("3.")
    exp = _expected(name)
    mlp = load_model(path)
    assert mlp.sizes == SIZES[name]
    assert mlp.activation == str(exp["activation"])
    if not np.isnan(exp["alpha"]):
        assert mlp.alpha == pytest.approx(float(exp["alpha"]))
    for k, (w, b) in enumerate(zip(mlp.weights, mlp.biases)):
        assert w.dtype == np.float64
        assert np.array_equal(w, exp[f"W{k}"]) and np.array_equal(b, exp[f"b{k}"])
    np.testing.assert_allclose(mlp.forward(exp["x"]), exp["logits"], rtol=0, atol=1e-5)


def test_functional_layer_names_come_from_the_config():
    assert load_model(FIXTURES / "tanh_functional.keras").layer_names == ["hidden_1", "hidden_2", "logits"]


def test_inspect_and_certify_on_a_keras_archive(tmp_path):
    path = str(FIXTURES / "relu_784.keras")
    res = CliRunner().invoke(cli, ["inspect", "--model", path])
    assert res.exit_code == 0, res.output
    assert "784-20-20-10" in res.output and "activation:  relu" in res.output
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["certify", "--model", path, "-n", "2", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == 3  # header + 2 rows


def _bad(path):
    with pytest.raises(InputError) as info:
        load_model(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    return msg


def test_corrupt_keras_archive(tmp_path):
    src = (FIXTURES / "leaky_layers.keras").read_bytes()
    path = tmp_path / "cut.keras"
    path.write_bytes(src[: len(src) // 2])  # truncated: no central directory
    assert "cannot read Keras archive (BadZipFile" in _bad(path)


def test_keras_archive_without_config(tmp_path):
    path = tmp_path / "noconf.keras"
    with zipfile.ZipFile(FIXTURES / "leaky_layers.keras") as src, zipfile.ZipFile(path, "w") as dst:
        for member in src.namelist():
            if member != "config.json":
                dst.writestr(member, src.read(member))
    assert _bad(path) == f"{path}: Keras archive without config.json (members: metadata.json, model.weights.h5)"


def test_keras_archive_with_a_branch_is_refused(tmp_path):
    path = tmp_path / "branch.keras"
    with zipfile.ZipFile(FIXTURES / "tanh_functional.keras") as src, zipfile.ZipFile(path, "w") as dst:
        for member in src.namelist():
            data = src.read(member)
            if member == "config.json":
                cfg = json.loads(data)
                layers = cfg["config"]["layers"]
                logits = [l for l in layers if l["config"]["name"] == "logits"][0]
                # feed the output layer from the first Dense instead of the second activation
                logits["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] = "hidden_1"
                data = json.dumps(cfg).encode()
            dst.writestr(member, data)
    msg = _bad(path)
    assert "layer 'logits' takes ['hidden_1'] as input, not only the previous layer" in msg


def test_npz_files_are_still_npz(tmp_path):
    """Both are zip archives: an NPZ without config.json still loads as NPZ."""
    exp = _expected("leaky_layers")
    np.savez(tmp_path / "m.npz", W0=exp["W0"], b0=exp["b0"], W1=exp["W1"], b1=exp["b1"])
    assert load_model(tmp_path / "m.npz").sizes == [5, 7, 4]
    shutil.copy(tmp_path / "m.npz", tmp_path / "m.keras")
    assert "Keras archive without config.json and model.weights.h5" in _bad(tmp_path / "m.keras")
