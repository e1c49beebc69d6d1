"""Write Keras 3 ``.keras`` test fixtures with the real Keras writer (``model.save('m.keras')``).

Keras 3's native format is a zip archive of ``config.json``, ``metadata.json`` and
``model.weights.h5``. This script builds small Dense networks with fixed, seeded weights and
saves each into ``tests/fixtures/keras3/<name>.keras`` with ``<name>.expected.npz`` beside it:

* ``W0, W1, ...`` the Dense kernels transposed to (outputs, inputs), float32 as Keras holds them;
* ``b0, b1, ...`` the Dense biases;
* ``activation``  the hidden activation crown should read; ``alpha`` its parameter (or NaN);
* ``x``           random inputs, flattened to (N, inputs);
* ``logits``      what Keras computes for ``x`` up to the last Dense layer (pre-softmax);
* ``writer``      e.g. ``keras 3.15.1 (jax)``.

Networks:

* ``relu_784``: Sequential, Input (28, 28, 1) -> Flatten -> Dense(20, relu) -> Dense(20, relu)
  -> Dense(10): takes the shipped MNIST images, so ``crown certify`` can run on it;
* ``tanh_functional``: functional, Input (6,) -> Dense(8) -> Activation(tanh) -> Dense(8) ->
  Activation(tanh) -> Dense(3) -> Activation(softmax);
* ``leaky_layers``: Sequential, Input (5,) -> Dense(7) -> LeakyReLU(0.1) -> Dropout -> Dense(4).

Keras is NOT a dependency of crown_cli; run this in a separate venv (jax is the light
backend)::

    python -m venv /tmp/kvenv
    /tmp/kvenv/bin/pip install keras jax jaxlib h5py numpy
    KERAS_BACKEND=jax /tmp/kvenv/bin/python scripts/make_keras3_fixture.py

The test suite (tests/test_keras3_files.py) reads the committed fixtures without Keras.
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "keras3"


def _seeded_weights(model, seed):
    """Overwrite every Dense layer's weights with seeded values (scaled like Glorot)."""
    import keras

    rng = np.random.default_rng(seed)
    dense = [l for l in model.layers if isinstance(l, keras.layers.Dense)]
    for layer in dense:
        kernel, bias = layer.get_weights()
        n_in = kernel.shape[0]
        layer.set_weights([
            (rng.normal(size=kernel.shape) / np.sqrt(n_in)).astype(np.float32),
            (0.1 * rng.normal(size=bias.shape)).astype(np.float32),
        ])
    return dense


def build(name):
    import keras
    from keras import layers

    if name == "relu_784":
        model = keras.Sequential([keras.Input((28, 28, 1)), layers.Flatten(),
                                  layers.Dense(20, activation="relu"),
                                  layers.Dense(20, activation="relu"), layers.Dense(10)])
        return model, model, "relu", None, (28, 28, 1)
    if name == "tanh_functional":
        inp = keras.Input((6,))
        h = layers.Activation("tanh")(layers.Dense(8, name="hidden_1")(inp))
        h = layers.Activation("tanh")(layers.Dense(8, name="hidden_2")(h))
        logits = layers.Dense(3, name="logits")(h)
        model = keras.Model(inp, layers.Activation("softmax")(logits))
        return model, keras.Model(inp, logits), "tanh", None, (6,)
    if name == "leaky_layers":
        model = keras.Sequential([keras.Input((5,)), layers.Dense(7), layers.LeakyReLU(negative_slope=0.1),
                                  layers.Dropout(0.5), layers.Dense(4)])
        return model, model, "leaky_relu", 0.1, (5,)
    raise ValueError(name)


def main():
    import keras

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for seed, name in enumerate(("relu_784", "tanh_functional", "leaky_layers")):
        keras.utils.set_random_seed(seed)
        model, logits_model, act, alpha, in_shape = build(name)
        dense = _seeded_weights(model, 100 + seed)
        path = OUT_DIR / f"{name}.keras"
        model.save(path)
        x = np.random.default_rng(200 + seed).uniform(-0.5, 0.5, size=(5,) + in_shape).astype(np.float32)
        logits = np.asarray(logits_model.predict(x, verbose=0))
        arrays = {}
        for k, layer in enumerate(dense):
            kernel, bias = layer.get_weights()
            arrays[f"W{k}"], arrays[f"b{k}"] = kernel.T, bias
        np.savez(OUT_DIR / f"{name}.expected.npz", **arrays, activation=np.array(act),
                 alpha=np.array(np.nan if alpha is None else alpha), x=x.reshape(len(x), -1),
                 logits=logits, writer=np.array(f"keras {keras.__version__} ({keras.backend.backend()})"))
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
