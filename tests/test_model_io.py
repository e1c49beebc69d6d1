"""Model files: NPZ, plain HDF5, Keras layout; every bad input gets a one-line message."""
import json

import h5py
import numpy as np
import pytest

from conftest import random_network
from crown_cli.errors import InputError
from crown_cli.io.models import load_model, save_keras_h5, save_npz


@pytest.fixture
def net():
    return random_network([12, 7, 5, 4], seed=0)


def _h5_plain(path, W, b, activation=None):
    with h5py.File(path, "w") as f:
        for k, (w, bb) in enumerate(zip(W, b)):
            f[f"W{k}"] = w
            f[f"b{k}"] = bb
        if activation:
            f.attrs["activation"] = activation


def _same(mlp, W, b, tol=0.0):
    return all(np.allclose(x, y, atol=tol, rtol=0) for x, y in zip(mlp.weights + mlp.biases, W + b))


def test_npz_roundtrip(tmp_path, net):
    W, b = net
    save_npz(tmp_path / "m.npz", W, b, "tanh")
    mlp = load_model(str(tmp_path / "m.npz"))
    assert mlp.activation == "tanh" and mlp.sizes == [12, 7, 5, 4] and _same(mlp, W, b)
    assert mlp.num_parameters == sum(w.size + v.size for w, v in zip(W, b))


def test_npz_without_activation_defaults_to_relu(tmp_path, net):
    W, b = net
    np.savez(tmp_path / "m.npz", **{f"W{k}": w for k, w in enumerate(W)},
             **{f"b{k}": v for k, v in enumerate(b)})
    assert load_model(str(tmp_path / "m.npz")).activation == "relu"


def test_plain_hdf5_roundtrip(tmp_path, net):
    W, b = net
    _h5_plain(tmp_path / "m.h5", W, b, "sigmoid")
    mlp = load_model(str(tmp_path / "m.h5"))
    assert mlp.activation == "sigmoid" and _same(mlp, W, b)


@pytest.mark.parametrize("dense_activation", [False, True])
@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid", "arctan"])
def test_keras_layout_writer_roundtrip(tmp_path, net, act, dense_activation):
    W, b = net
    p = tmp_path / "k.h5"
    save_keras_h5(str(p), W, b, act, input_shape=(12,), dense_activation=dense_activation and act != "arctan")
    mlp = load_model(str(p))
    assert mlp.activation == act and _same(mlp, W, b, tol=1e-6)  # Keras stores float32
    assert mlp.layer_names == ["dense_1", "dense_2", "dense_3"]


def test_activation_override(tmp_path, net):
    W, b = net
    save_npz(tmp_path / "m.npz", W, b, "relu")
    assert load_model(str(tmp_path / "m.npz"), activation="tanh").activation == "tanh"
    with pytest.raises(InputError, match="--activation: unknown activation 'swish'"):
        load_model(str(tmp_path / "m.npz"), activation="swish")


# ----------------------------------------------------------------------------- bad input


def _bad(tmp_path, net, kind):
    W, b = [w.copy() for w in net[0]], [v.copy() for v in net[1]]
    p = tmp_path / "bad.npz"
    if kind == "nan":
        W[1][0, 0] = np.nan
    elif kind == "inf_bias":
        b[0][2] = np.inf
    elif kind == "chain":
        W[1] = W[1][:, :-1]
    elif kind == "bias_shape":
        b[2] = b[2][:-1]
    elif kind == "missing_bias":
        b = b[:-1]
    elif kind == "activation":
        save_npz(p, W, b, "swish")
        return p
    elif kind == "gap":
        np.savez(p, W0=W[0], b0=b[0], W2=W[2], b2=b[2])
        return p
    save_npz(p, W, b, "relu")
    return p


@pytest.mark.parametrize("kind,message", [
    ("nan", "layer 1 contains NaN or infinite values"),
    ("inf_bias", "layer 0 contains NaN or infinite values"),
    ("chain", "layer 1 weight expects 6 inputs but layer 0 has 7 outputs"),
    ("bias_shape", r"layer 2 bias has shape \(3,\), expected \(4,\)"),
    ("missing_bias", "3 weight matrices but 2 bias vectors"),
    ("activation", "unknown activation 'swish'"),
    ("gap", r"arrays W0..W1 expected, found \[0, 2\]"),
])
def test_bad_models_name_file_and_problem(tmp_path, net, kind, message):
    p = _bad(tmp_path, net, kind)
    with pytest.raises(InputError, match=message) as err:
        load_model(str(p))
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="model file not found"):
        load_model(str(tmp_path / "nope.h5"))


def test_corrupt_files(tmp_path):
    p = tmp_path / "junk.h5"
    p.write_bytes(b"this is not a model")
    with pytest.raises(InputError, match="not an NPZ or HDF5 file"):
        load_model(str(p))
    q = tmp_path / "trunc.npz"
    q.write_bytes(b"PK\x03\x04" + b"\x00" * 20)
    with pytest.raises(InputError, match="cannot read NPZ archive"):
        load_model(str(q))
    good = tmp_path / "good.h5"
    save_keras_h5(str(good), [np.ones((3, 4)), np.ones((2, 3))], [np.zeros(3), np.zeros(2)], "relu")
    data = good.read_bytes()
    r = tmp_path / "trunc.h5"
    r.write_bytes(data[: len(data) // 3])
    with pytest.raises(InputError, match="trunc.h5: cannot read HDF5 file"):
        load_model(str(r))


def test_hdf5_without_weights(tmp_path):
    p = tmp_path / "empty.h5"
    with h5py.File(p, "w") as f:
        f["something"] = np.zeros(3)
    with pytest.raises(InputError, match="neither Keras 'model_weights' nor datasets W0"):
        load_model(str(p))


def test_keras_file_with_a_conv_layer_is_refused(tmp_path):
    p = tmp_path / "conv.h5"
    save_keras_h5(str(p), [np.ones((3, 4)), np.ones((2, 3))], [np.zeros(3), np.zeros(2)], "relu")
    with h5py.File(p, "a") as f:
        g = f["model_weights/dense_1"]
        g.attrs["weight_names"] = np.array([b"dense_1/kernel:0", b"dense_1/bias:0", b"dense_1/extra:0"])
        g["dense_1/extra:0"] = np.zeros((3, 3, 3))
    with pytest.raises(InputError, match="layer 'dense_1' is not a Dense layer"):
        load_model(str(p))


def test_keras_unknown_activation_layer(tmp_path):
    p = tmp_path / "swish.h5"
    save_keras_h5(str(p), [np.ones((3, 4)), np.ones((2, 3))], [np.zeros(3), np.zeros(2)], "relu")
    with h5py.File(p, "a") as f:
        cfg = f.attrs["model_config"]
        cfg = cfg.decode() if isinstance(cfg, bytes) else cfg
        f.attrs["model_config"] = cfg.replace('"activation": "relu"', '"activation": "swish"')
    with pytest.raises(InputError, match="layer 'relu_1': unknown activation 'swish'"):
        load_model(str(p))


def _edit_config(path, fn):
    with h5py.File(path, "a") as f:
        cfg = f.attrs["model_config"]
        cfg = json.loads(cfg.decode() if isinstance(cfg, bytes) else cfg)
        fn(cfg["config"]["layers"])
        f.attrs["model_config"] = json.dumps(cfg)


def test_keras_softmax_output_is_accepted_but_relu_output_refused(tmp_path, net):
    W, b = net
    p = tmp_path / "soft.h5"
    save_keras_h5(str(p), W, b, "tanh", input_shape=(12,))
    _edit_config(p, lambda layers: layers[-1]["config"].update(activation="softmax"))
    mlp = load_model(str(p))
    assert mlp.activation == "tanh" and len(mlp.weights) == 3
    _edit_config(p, lambda layers: layers[-1]["config"].update(activation="relu"))
    with pytest.raises(InputError, match="output activation 'relu' does not preserve the order"):
        load_model(str(p))


def _with_weightless_layer(tmp_path, net, name, position):
    """A Keras-layout file with an extra weightless layer ``name`` at ``position``."""
    W, b = net
    p = tmp_path / f"{name}.h5"
    save_keras_h5(str(p), W, b, "relu", input_shape=(12,))
    with h5py.File(p, "a") as f:
        g = f["model_weights"]
        g.create_group(name).attrs["weight_names"] = np.array([], dtype="S1")
        names = list(g.attrs["layer_names"])
        g.attrs["layer_names"] = np.array(names[:position] + [name.encode()] + names[position:])
    return p


def test_keras_pooling_layer_is_refused(tmp_path, net):
    p = _with_weightless_layer(tmp_path, net, "max_pooling2d_1", 0)
    with pytest.raises(InputError, match="layer 'max_pooling2d_1' \\(unknown type\\) is not supported"):
        load_model(str(p))


def test_keras_dropout_is_ignored(tmp_path, net):
    p = _with_weightless_layer(tmp_path, net, "dropout_1", 3)
    assert _same(load_model(str(p)), *net, tol=1e-6)


@pytest.mark.parametrize("act,alpha,expected", [
    ("leaky_relu", 0.1, 0.1), ("leaky_relu", None, 0.2), ("elu", 0.5, 0.5), ("elu", None, 1.0),
    ("softplus", None, None), ("hard_sigmoid", None, 0.2),
])
def test_parametrised_activations_roundtrip(tmp_path, net, act, alpha, expected):
    W, b = net
    save_npz(tmp_path / "m.npz", W, b, act, alpha)
    save_keras_h5(str(tmp_path / "k.h5"), W, b, act, input_shape=(12,), alpha=alpha)
    x = np.random.default_rng(0).normal(size=(5, 12))
    for p in ("m.npz", "k.h5"):
        mlp = load_model(str(tmp_path / p))
        assert mlp.activation == act and mlp.alpha == (None if expected is None else pytest.approx(expected))
        from crown_cli.activations import apply_activation

        a = apply_activation(act, x @ mlp.weights[0].T + mlp.biases[0], expected)
        a = apply_activation(act, a @ mlp.weights[1].T + mlp.biases[1], expected)
        assert np.allclose(mlp.forward(x), a @ mlp.weights[2].T + mlp.biases[2])


@pytest.mark.parametrize("act,alpha,message", [
    ("leaky_relu", 1.5, r"leaky_relu parameter alpha=1.5 outside the supported range \[0.0, 1.0\]"),
    ("elu", 2.0, r"elu parameter alpha=2.0 outside the supported range \(0.0, 1.0\]"),
    ("leaky_relu", float("nan"), "alpha=nan outside"),
])
def test_bad_activation_parameter(tmp_path, net, act, alpha, message):
    save_npz(tmp_path / "m.npz", *net, act, alpha)
    with pytest.raises(InputError, match=message):
        load_model(str(tmp_path / "m.npz"))


def test_keras3_hard_sigmoid_uses_slope_one_sixth(tmp_path, net):
    p = tmp_path / "hs.h5"
    save_keras_h5(str(p), *net, "hard_sigmoid", input_shape=(12,))
    with h5py.File(p, "a") as f:
        f.attrs["keras_version"] = "3.15.1"
    assert load_model(str(p)).alpha == pytest.approx(1 / 6)
