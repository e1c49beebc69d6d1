"""Write Keras graph-model test fixtures with the real Keras writers and Keras' own predictions.

The models use the layers of MobileNet-, EfficientNet-, Xception- and tutorial-style image
classifiers, 1-D sequence models and decoders (``mobile``, ``efficient``, ``sequence``,
``decoder`` below: DepthwiseConv2D, SeparableConv2D, global pools, Rescaling, Normalization,
Multiply, Maximum / Minimum, Conv1D with causal padding, 1-D pools and moves, Dense and
BatchNormalization on sequences, Conv2DTranspose, PReLU, Permute, UpSampling2D, Cropping2D)
models used as layers (``nested``, ``transfer``: a functional base, Sequential
augmentation and head), arithmetic on tensors (``arithmetic``) and layer normalisation
(``normalised``).
Each gets fixed, seeded weights and is saved into ``tests/fixtures/keras_graphs/`` by every
writer at hand:

* ``<name>.keras``      Keras 3's archive (``model.save('m.keras')``);
* ``<name>.k3.h5``      Keras 3's legacy HDF5 (``model.save('m.h5')``);
* ``<name>.k2.h5``      the Keras 2 API's HDF5 (``tf_keras``), when installed;

and ``<name>.expected.npz`` beside them with ``x`` (inputs, flattened row-major in the
model's own (H, W, C) / (steps, C) order), ``logits`` (``model.predict(x)``, float32 as Keras
computes them) and ``writer`` (the Keras versions). The test suite
(tests/test_keras_graphs.py) reads the committed files with h5py only and holds crown's
forward pass to Keras' predictions.

TensorFlow is NOT a dependency of crown_cli; this script needs a separate venv::

    python3 -m venv /tmp/kvenv
    /tmp/kvenv/bin/pip install tensorflow-cpu tf-keras

run from the repository root::

    /tmp/kvenv/bin/python scripts/make_keras_graph_fixtures.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                   "fixtures", "keras_graphs")


def mobile(k):
    L = k.layers
    x = k.Input((8, 7, 2), name="image")
    y = L.Rescaling(0.5, offset=0.1, name="scale")(x)
    y = L.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2, activation="relu",
                          name="dw")(y)
    y = L.SeparableConv2D(3, 2, padding="valid", name="sep")(y)
    r = L.ReLU(name="r")(y)
    up = L.UpSampling2D((2, 3), name="up")(r)
    crop = L.Cropping2D(((1, 0), (2, 1)), name="crop")(up)
    gap = L.GlobalAveragePooling2D(name="gap")(crop)
    gmp = L.GlobalMaxPooling2D(name="gmp")(crop)
    gapk = L.Flatten(name="fk")(L.GlobalAveragePooling2D(keepdims=True, name="gapk")(r))
    y = L.Concatenate(name="cat")([gap, gmp, gapk])
    y = L.Dense(3, name="out")(y)
    return k.Model(x, y), [(8, 7, 2)]


def efficient(k):
    L = k.layers
    x = k.Input((5, 6, 3), name="image")
    y = L.Rescaling(0.5, name="rescale")(x)
    norm = L.Normalization(axis=-1, name="norm")
    norm.adapt(np.random.default_rng(7).normal(0.2, 1.5, size=(64, 5, 6, 3)).astype("float32"))
    y = norm(y)
    stem = L.Conv2D(4, 3, padding="same", activation="swish", name="stem")(y)
    dw = L.DepthwiseConv2D(3, padding="same", activation="swish", name="dw")(stem)
    se = L.GlobalAveragePooling2D(keepdims=True, name="squeeze")(dw)
    se = L.Conv2D(2, 1, activation="swish", name="se_reduce")(se)
    se = L.Conv2D(4, 1, activation="sigmoid", name="se_expand")(se)
    y = L.Multiply(name="excite")([dw, se])
    proj = L.Conv2D(4, 1, name="project")(y)
    y = L.Add(name="residual")([proj, stem])
    hi = L.Maximum(name="hi")([y, proj])
    lo = L.Minimum(name="lo")([y, stem, dw])
    y = L.Concatenate(name="both")([hi, lo])
    y = L.GlobalAveragePooling2D(name="pool")(y)
    y = L.Dense(3, name="logits")(y)
    return k.Model(x, y), [(5, 6, 3)]


def sequence(k):
    L = k.layers
    x = k.Input((12, 3), name="signal")
    y = L.Conv1D(4, 3, padding="same", activation="relu", name="c1")(x)
    y = L.Conv1D(4, 2, padding="causal", dilation_rate=2, activation="tanh", name="c2")(y)
    y = L.MaxPooling1D(2, name="mp")(y)
    y = L.AveragePooling1D(2, strides=1, padding="same", name="ap")(y)
    y = L.BatchNormalization(name="bn")(y)
    y = L.ZeroPadding1D((1, 2), name="zp")(y)
    y = L.Cropping1D((1, 0), name="cr")(y)
    y = L.UpSampling1D(2, name="up")(y)
    c3 = L.Conv1D(3, 3, strides=2, activation="relu", name="c3")(y)
    mix = L.Dense(3, activation="sigmoid", name="mix")(c3)
    gap = L.GlobalAveragePooling1D(name="gap")(mix)
    gmp = L.Flatten(name="fl")(L.GlobalMaxPooling1D(keepdims=True, name="gmp")(c3))
    y = L.Concatenate(name="cat")([gap, gmp, L.Flatten(name="fseq")(mix)])
    y = L.Dense(2, name="out")(y)
    return k.Model(x, y), [(12, 3)]


def decoder(k):
    L = k.layers
    x = k.Input((3, 2, 2), name="z")
    y = L.Conv2DTranspose(3, 3, strides=2, padding="same", name="t1")(x)
    y = L.PReLU(shared_axes=[1, 2], name="p1")(y)
    y = L.Conv2DTranspose(2, 2, dilation_rate=2, activation="relu", name="t2")(y)
    y = L.Conv2DTranspose(2, 3, strides=(2, 1), output_padding=(1, 0), activation="tanh",
                          name="t3")(y)
    y = L.Conv2DTranspose(2, 1, strides=2, name="t4")(y)
    y = L.Conv2DTranspose(2, 3, strides=2, padding="same", output_padding=1, name="t5")(y)
    y = L.Permute((2, 1, 3), name="perm")(y)
    y = L.PReLU(name="p2")(y)
    y = L.Conv2D(2, 8, strides=8, activation="relu", name="down")(y)
    y = L.Flatten(name="f")(y)
    y = L.Dense(3, name="out")(y)
    return k.Model(x, y), [(3, 2, 2)]


def _base(k, name):
    L = k.layers
    inp = k.Input((6, 6, 2), name="img")
    y = L.Conv2D(3, 3, padding="same", name="conv")(inp)
    y = L.BatchNormalization(name="bn")(y)
    return k.Model(inp, L.ReLU(name="relu")(y), name=name)


def _augment(k):
    L = k.layers
    return k.Sequential([L.RandomFlip("horizontal", name="flip"),
                         L.RandomRotation(0.1, name="rot"), L.RandomZoom(0.1, name="zoom"),
                         L.RandomContrast(0.1, name="contrast")], name="augment")


def nested(k):
    """Models as layers: an augmentation Sequential, a functional base called on a new input
    (Keras 2 numbers that call node 1), a Sequential head."""
    L = k.layers
    x = k.Input((6, 6, 2), name="x")
    z = L.Rescaling(0.5, name="rescale")(_augment(k)(x))
    z = _base(k, "base")(z)
    head = k.Sequential([L.GlobalAveragePooling2D(name="gap"), L.Dense(3, name="out")],
                        name="head")
    return k.Model(x, head(z)), [(6, 6, 2)]


def transfer(k):
    """A Sequential as Keras' transfer-learning tutorials write it: augmentation, a base
    model, a pooling and a Dense head."""
    L = k.layers
    model = k.Sequential([k.Input((6, 6, 2)), _augment(k), _base(k, "base"),
                          L.GlobalAveragePooling2D(name="gap"), L.Dropout(0.2, name="drop"),
                          L.Dense(4, name="out")], name="transfer")
    return model, [(6, 6, 2)]


def arithmetic(k):
    """Arithmetic on tensors written as Python operators, which Keras records as ops
    (Keras 3: ``keras.src.ops.numpy`` Add, Multiply, ...; the Keras 2 API: TFOpLambda):
    MobileNetV3's hard sigmoid ``relu6(x + 3) * (1 / 6)``, a number minus a tensor, a
    division by a number, a negation, a per-channel constant."""
    L = k.layers
    x = k.Input((6, 6, 2), name="x")
    y = L.Conv2D(3, 3, padding="same", name="conv")(x)
    h = L.ReLU(6.0, name="relu6")(y + 3.0) * (1.0 / 6.0)
    y = L.Multiply(name="hswish")([y, h])
    z = -((1.5 - y) / 4.0)
    z = z * np.array([0.5, -1.0, 2.0], "float32") + np.array([0.1, 0.2, 0.3], "float32")
    y = L.Concatenate(name="cat")([y, z])
    y = L.GlobalAveragePooling2D(name="gap")(y)
    return k.Model(x, L.Dense(3, name="out")(y)), [(6, 6, 2)]


def normalised(k):
    """LayerNormalization as ConvNeXt uses it (an image's channels, epsilon 1e-6) and as
    transformers do (a sequence's features; over two axes), with and without its scale and
    centre, GELU between; GroupNormalization on an image's channels and on features."""
    L = k.layers
    img = k.Input((4, 5, 3), name="img")
    y = L.Conv2D(4, 2, name="conv")(img)
    y = L.LayerNormalization(epsilon=1e-6, name="ln_channels")(y)
    y = L.Activation("gelu", name="gelu")(y)
    y = L.Reshape((12, 4), name="tokens")(y)
    y = L.Dense(6, name="proj")(y)
    y = L.LayerNormalization(name="ln_features")(y)
    y = L.LayerNormalization(axis=[1, 2], center=False, name="ln_both")(y)
    y = L.LayerNormalization(scale=False, epsilon=0.1, name="ln_plain")(y)
    y = L.Flatten(name="flat")(y)
    z = L.Conv2D(6, 2, padding="same", name="conv6")(img)
    z = L.GroupNormalization(groups=3, name="gn")(z)
    z = L.GroupNormalization(groups=2, center=False, epsilon=0.01, name="gn2")(
        L.ReLU(name="relu")(z))
    z = L.GlobalAveragePooling2D(name="gap")(z)
    z = L.GroupNormalization(groups=6, scale=False, name="gn_features")(z)
    y = L.Concatenate(name="both")([y, z])
    return k.Model(img, L.Dense(3, name="out")(y)), [(4, 5, 3)]


MODELS = {"mobile": mobile, "efficient": efficient, "sequence": sequence, "decoder": decoder,
          "nested": nested, "transfer": transfer, "arithmetic": arithmetic,
          "normalised": normalised}


def seeded(model, seed):
    """Fixed weights: normal(0, 0.5); batch-norm variances positive; a Normalization keeps
    its adapted statistics."""
    rng = np.random.default_rng(seed)
    _seed_layers(model, rng)


def _seed_layers(model, rng):
    for layer in model.layers:
        if hasattr(layer, "layers"):  # a model used as a layer
            _seed_layers(layer, rng)
            continue
        if type(layer).__name__ == "Normalization":
            continue
        ws = []
        for w, v in zip(layer.get_weights(), layer.weights):
            name = getattr(v, "path", None) or v.name
            if "moving_variance" in name:
                ws.append((0.5 + np.abs(rng.normal(0, 0.5, w.shape))).astype(w.dtype))
            else:
                ws.append(rng.normal(0, 0.5, w.shape).astype(w.dtype))
        layer.set_weights(ws)


def write(keras, tag, writer):
    os.makedirs(OUT, exist_ok=True)
    for seed, (name, make) in enumerate(MODELS.items()):
        model, shapes = make(keras)
        seeded(model, seed)
        rng = np.random.default_rng(100 + seed)
        x = rng.normal(0, 1, size=(5,) + shapes[0]).astype("float32")
        logits = np.asarray(model.predict(x, verbose=0), np.float64)
        paths = [f"{name}.{tag}.h5"] + ([f"{name}.keras"] if tag == "k3" else [])
        for p in paths:
            model.save(os.path.join(OUT, p))
        npz = os.path.join(OUT, f"{name}.{tag}.expected.npz")
        np.savez(npz, x=x.reshape(5, -1).astype(np.float64), logits=logits, writer=writer)
        print(f"{name}: {', '.join(paths)} ({writer})")


def main():
    import keras

    write(keras, "k3", f"keras {keras.__version__}")
    try:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tf_keras
    except ImportError:
        print("tf_keras not installed: no Keras 2 files", file=sys.stderr)
        return
    write(tf_keras, "k2", f"tf_keras {tf_keras.__version__}")


if __name__ == "__main__":
    main()
