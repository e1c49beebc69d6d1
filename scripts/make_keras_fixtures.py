"""Write Keras HDF5 test fixtures with the real Keras writer (``model.save('x.h5')``).

For each small Sequential MLP below (input shape (4, 4, 1) -> Flatten -> 6 -> 5 -> 3 logits, the
last Dense linear) this script sets fixed, seeded weights, saves the model with Keras'
own ``model.save(path)`` in HDF5 into ``tests/fixtures/keras/<name>.h5`` and writes next to it
``<name>.expected.npz`` with:

* ``W0, W1, ...``  the Dense kernels transposed to (outputs, inputs), float32 as Keras holds them;
* ``b0, b1, ...``  the Dense biases;
* ``activation``   the hidden activation as a string (relu, tanh, sigmoid, arctan);
* ``x``            5 random inputs of shape (4, 4, 1), flattened to (5, 16);
* ``logits``       ``model.predict(x)`` computed by Keras (pre-softmax);
* ``writer``       which Keras wrote the file, e.g. ``tf_keras 2.21.0`` or ``keras 3.15.1``.

Models written with the Keras 2 API (``tf_keras``) are named ``k2_*``, those written with
Keras 3 (``keras``, legacy H5 format chosen by the ``.h5`` suffix) ``k3_*``. If ``tf_keras`` is
not installed the ``k2_*`` models are written with Keras 3 instead (a warning says so).

TensorFlow is NOT a dependency of crown_cli; this script needs an optional, separate venv::

    python3 -m venv /tmp/kvenv
    /tmp/kvenv/bin/pip install tensorflow-cpu tf-keras

and is run from the repository root::

    /tmp/kvenv/bin/python scripts/make_keras_fixtures.py

The test suite (tests/test_keras_files.py) reads the committed fixtures with h5py only.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

# Imported at module level on purpose: the Lambda's ``lambda z: tf.atan(z)`` must refer to the
# global ``tf``; a closure over a module object cannot be serialised into the H5 config.
try:
    import tensorflow as tf  # noqa: E402
except ImportError:  # pragma: no cover - explained in the docstring
    sys.exit("make_keras_fixtures.py needs TensorFlow: see the module docstring")

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "keras"
INPUT_SHAPE = (4, 4, 1)
HIDDEN = (6, 5)
NUM_CLASSES = 3
NUM_INPUTS = 5

# name, Keras API ("k2" = tf_keras, "k3" = keras 3), hidden activation, how it is expressed
#   "layers": Dense(linear) followed by an Activation layer named <act>_<i>
#   "dense":  Dense(..., activation=<act>)
#   "lambda": Dense(linear) followed by Lambda(lambda z: tf.atan(z), name='arctan_<i>')
SPECS = [
    ("k2_relu_activation_layers", "k2", "relu", "layers"),
    ("k2_tanh_dense_activation", "k2", "tanh", "dense"),
    ("k3_sigmoid_activation_layers", "k3", "sigmoid", "layers"),
    ("k3_relu_dense_activation", "k3", "relu", "dense"),
    ("k2_arctan_lambda", "k2", "arctan", "lambda"),
    # Not required; written only if Keras 3 agrees to put a Lambda into an H5 file.
    ("k3_arctan_lambda", "k3", "arctan", "lambda"),
]
OPTIONAL = {"k3_arctan_lambda"}


def _keras_modules():
    import keras as k3

    try:
        import tf_keras as k2
    except ImportError:
        print("warning: tf_keras is not installed; k2_* fixtures are written with Keras 3",
              file=sys.stderr)
        k2 = None
    return k2, k3


def _build(keras, api: str, activation: str, style: str):
    """A Sequential MLP in the requested style; layer names follow the paper's <act>_<i>."""
    L = keras.layers
    keras.backend.clear_session()  # default names (dense, dense_1, ...) as in a fresh session
    if api == "k2":
        layers = [L.Flatten(input_shape=INPUT_SHAPE)]
    else:
        layers = [keras.Input(shape=INPUT_SHAPE), L.Flatten()]
    for i, width in enumerate(HIDDEN, start=1):
        if style == "dense":
            layers.append(L.Dense(width, activation=activation))
            continue
        layers.append(L.Dense(width))
        if style == "layers":
            layers.append(L.Activation(activation, name=f"{activation}_{i}"))
        elif style == "lambda":
            layers.append(L.Lambda(lambda z: tf.atan(z), name=f"arctan_{i}"))
        else:
            raise ValueError(style)
    layers.append(L.Dense(NUM_CLASSES))  # linear logits
    return keras.Sequential(layers)


def _set_weights(model, rng):
    """Seeded weights for every Dense layer; returns [(W (out,in), b)] as set in the model."""
    dense = [layer for layer in model.layers if layer.get_weights()]
    sizes = [int(np.prod(INPUT_SHAPE)), *HIDDEN, NUM_CLASSES]
    assert len(dense) == len(sizes) - 1, [layer.name for layer in model.layers]
    for layer, n_in, n_out in zip(dense, sizes[:-1], sizes[1:]):
        kernel = rng.normal(0.0, 1.0 / np.sqrt(n_in), size=(n_in, n_out)).astype(np.float32)
        bias = rng.normal(0.0, 0.2, size=(n_out,)).astype(np.float32)
        layer.set_weights([kernel, bias])
    out = []
    for layer in dense:
        kernel, bias = layer.get_weights()
        out.append((np.ascontiguousarray(kernel.T), np.asarray(bias)))
    return out


def make(name: str, api: str, activation: str, style: str, seed: int, mods) -> Path:
    k2, k3 = mods
    keras = k2 if (api == "k2" and k2 is not None) else k3
    writer = f"{'tf_keras' if keras is k2 else 'keras'} {keras.__version__}"
    rng = np.random.default_rng(seed)
    model = _build(keras, api, activation, style)
    params = _set_weights(model, rng)
    x = rng.uniform(0.0, 1.0, size=(NUM_INPUTS, *INPUT_SHAPE)).astype(np.float32)
    logits = np.asarray(model.predict(x, verbose=0))

    path = OUT_DIR / f"{name}.h5"
    tmp = OUT_DIR / f"{name}.tmp.h5"  # Keras 3 wants the .h5 suffix to pick the legacy format
    if tmp.exists():
        tmp.unlink()
    model.save(str(tmp))
    os.replace(tmp, path)

    arrays = {}
    for k, (w, b) in enumerate(params):
        arrays[f"W{k}"] = w
        arrays[f"b{k}"] = b
    arrays["activation"] = np.array(activation)
    arrays["x"] = x.reshape(NUM_INPUTS, -1)
    arrays["logits"] = logits
    arrays["writer"] = np.array(writer)
    np.savez(OUT_DIR / f"{name}.expected.npz", **arrays)
    print(f"{path.relative_to(OUT_DIR.parent.parent.parent)}  ({path.stat().st_size} bytes, {writer})")
    return path


def main() -> int:
    mods = _keras_modules()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    failed = []
    for seed, (name, api, activation, style) in enumerate(SPECS, start=2018):
        try:
            make(name, api, activation, style, seed, mods)
        except Exception as exc:  # report and go on; only OPTIONAL fixtures may fail
            for leftover in (OUT_DIR / f"{name}.tmp.h5", OUT_DIR / f"{name}.h5",
                             OUT_DIR / f"{name}.expected.npz"):
                if leftover.exists():
                    leftover.unlink()
            print(f"{name}: not written: {type(exc).__name__}: {exc}", file=sys.stderr)
            if name not in OPTIONAL:
                failed.append(name)
    if failed:
        print(f"error: required fixtures failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
