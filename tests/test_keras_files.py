"""Load HDF5 files written by the real Keras ``model.save()`` and compare with Keras' own numbers.

The fixtures in tests/fixtures/keras/ were made by scripts/make_keras_fixtures.py in a separate
TensorFlow venv (tf_keras 2.x for ``k2_*``, Keras 3 legacy H5 for ``k3_*``). Each ``<name>.h5``
has a ``<name>.expected.npz`` with the weights as (outputs, inputs), the hidden activation, five
inputs ``x`` and the logits Keras' ``model.predict(x)`` gave. No TensorFlow is needed here.
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from crown_cli.io.models import KNOWN_ACTIVATIONS, load_model

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "keras"
REQUIRED = {
    "k2_relu_activation_layers",
    "k2_tanh_dense_activation",
    "k3_sigmoid_activation_layers",
    "k3_relu_dense_activation",
    "k2_arctan_lambda",
}
H5_FILES = sorted(FIXTURES.glob("*.h5"))
ATOL = 1e-5  # Keras computes in float32, MLP.forward in float64


def _expected(path: Path):
    with np.load(path.with_name(path.stem + ".expected.npz"), allow_pickle=False) as data:
        out = {k: data[k] for k in data.files}
    m = sum(1 for k in out if k.startswith("W") and k[1:].isdigit())
    out["W"] = [out[f"W{k}"] for k in range(m)]
    out["b"] = [out[f"b{k}"] for k in range(m)]
    out["activation"] = str(out["activation"])
    out["writer"] = str(out["writer"])
    return out


def _id(path: Path) -> str:
    return path.stem


def test_fixture_directory_is_complete():
    names = {p.stem for p in H5_FILES}
    missing = REQUIRED - names
    assert not missing, f"missing Keras fixtures {sorted(missing)} in {FIXTURES}"
    for p in H5_FILES:
        assert p.with_name(p.stem + ".expected.npz").is_file(), f"{p.name} has no .expected.npz"


@pytest.mark.parametrize("path", H5_FILES, ids=_id)
def test_written_by_real_keras(path):
    """Guard: the fixture came from Keras itself, of the major version its name says."""
    exp = _expected(path)
    with h5py.File(path, "r") as f:
        version = f.attrs["keras_version"]
        version = version.decode() if isinstance(version, bytes) else str(version)
        assert "model_weights" in f and "model_config" in f.attrs
    major = path.stem[1]  # "k2_..." / "k3_..."
    assert version.startswith(major + "."), (path.name, version)
    assert exp["writer"].split()[-1] == version


@pytest.mark.parametrize("path", H5_FILES, ids=_id)
def test_weights_and_activation(path):
    exp = _expected(path)
    mlp = load_model(path)
    assert mlp.activation == exp["activation"]
    assert len(mlp.weights) == len(exp["W"]) == 3
    for k, (w, b) in enumerate(zip(exp["W"], exp["b"])):
        assert mlp.weights[k].shape == w.shape, k
        assert mlp.weights[k].dtype == np.float64
        np.testing.assert_array_equal(mlp.weights[k], w.astype(np.float64))
        np.testing.assert_array_equal(mlp.biases[k], b.astype(np.float64))
    assert mlp.sizes == [16, 6, 5, 3]


@pytest.mark.parametrize("path", H5_FILES, ids=_id)
def test_forward_matches_keras_predict(path):
    exp = _expected(path)
    mlp = load_model(path)
    assert exp["x"].shape == (5, mlp.input_size)
    np.testing.assert_allclose(mlp.forward(exp["x"]), exp["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("path", H5_FILES, ids=_id)
def test_fixture_distinguishes_activations(path):
    """The logits pin the activation: every other activation gives clearly different logits."""
    exp = _expected(path)
    for other in KNOWN_ACTIVATIONS:
        if other == exp["activation"]:
            continue
        logits = load_model(path, activation=other).forward(exp["x"])
        assert np.abs(logits - exp["logits"]).max() > 100 * ATOL, other


@pytest.mark.parametrize("path", H5_FILES, ids=_id)
@pytest.mark.parametrize("override", ["tanh", "TANH", "atan", "relu"])
def test_activation_override(path, override):
    exp = _expected(path)
    canonical = {"TANH": "tanh", "atan": "arctan"}.get(override, override)
    mlp = load_model(path, activation=override)
    assert mlp.activation == canonical
    for k, (w, b) in enumerate(zip(exp["W"], exp["b"])):  # weights untouched by the override
        np.testing.assert_array_equal(mlp.weights[k], w.astype(np.float64))
        np.testing.assert_array_equal(mlp.biases[k], b.astype(np.float64))
    fn = {"tanh": np.tanh, "arctan": np.arctan, "relu": lambda z: np.maximum(z, 0.0)}[canonical]
    a = exp["x"].astype(np.float64)
    for k, (w, b) in enumerate(zip(exp["W"], exp["b"])):
        z = a @ w.astype(np.float64).T + b
        a = z if k == len(exp["W"]) - 1 else fn(z)
    np.testing.assert_allclose(mlp.forward(exp["x"]), a, rtol=1e-12, atol=1e-12)
    if canonical == exp["activation"]:
        np.testing.assert_allclose(mlp.forward(exp["x"]), exp["logits"], rtol=0, atol=ATOL)
