"""Keras' own application architectures (``keras.applications``: MobileNet V1-V3,
EfficientNet V1-V2, ResNet, DenseNet, NASNet, VGG, Xception, Inception, ConvNeXt) written by
Keras and read by crown: does each load, and does crown's forward pass equal Keras' logits?

Two steps in two environments (TensorFlow is not a dependency of crown_cli)::

    /tmp/kvenv/bin/python scripts/keras_applications.py write DIR [--legacy] [--float64]
    python scripts/keras_applications.py check DIR [--legacy] [--float64]

``write`` (a venv with ``tensorflow-cpu tf-keras``) builds every architecture untrained
(``weights=None``, 10 classes, the smallest input each accepts), gives its batch
normalisations statistics away from the identity, makes the last layer's activation linear
(the logits, which crown certifies) and saves ``DIR/<name>.keras`` (``--legacy``: the Keras 2
API's ``DIR/<name>.k2.h5``; ``--float64``: built in float64, ``<name>.f64.keras``) beside
``<name>.npz`` (3 inputs in [0, 1] and Keras' predictions). ``check`` loads each file with
``crown_cli.io.networks.load_network`` and prints the largest difference of the logits
relative to their scale, or the one-line reason a model is refused. Results:
docs/testing.md (Campaigns outside the suite).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ARCHS = {  # name: (constructor, keyword arguments)
    "MobileNet": dict(input_shape=(32, 32, 3), alpha=0.25),
    "MobileNetV2": dict(input_shape=(32, 32, 3), alpha=0.35),
    "MobileNetV3Small": dict(input_shape=(32, 32, 3), alpha=0.75),
    "EfficientNetB0": dict(input_shape=(32, 32, 3)),
    "EfficientNetV2B0": dict(input_shape=(32, 32, 3)),
    "ResNet50": dict(input_shape=(32, 32, 3)),
    "ResNet50V2": dict(input_shape=(32, 32, 3)),
    "DenseNet121": dict(input_shape=(32, 32, 3)),
    "NASNetMobile": dict(input_shape=(32, 32, 3)),
    "VGG16": dict(input_shape=(32, 32, 3)),
    "Xception": dict(input_shape=(71, 71, 3)),
    "InceptionV3": dict(input_shape=(75, 75, 3)),
    "ConvNeXtTiny": dict(input_shape=(32, 32, 3)),
}


def _suffix(args):
    return ".k2.h5" if args.legacy else (".f64.keras" if args.float64 else ".keras")


def write(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.legacy:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tf_keras as keras
    else:
        import keras
        if args.float64:
            keras.config.set_floatx("float64")
    dt = "float64" if args.float64 else "float32"
    os.makedirs(args.dir, exist_ok=True)
    for name in args.names or ARCHS:
        rng = np.random.default_rng(0)
        try:
            model = getattr(keras.applications, name)(weights=None, classes=10, **ARCHS[name])
        except Exception as exc:  # noqa: BLE001 - an architecture this Keras does not have
            print(f"{name}: not built ({type(exc).__name__}: {str(exc)[:150]})", flush=True)
            continue
        for layer in model.layers:
            if type(layer).__name__ != "BatchNormalization":
                continue
            ws = []
            for w, v in zip(layer.get_weights(), layer.weights):
                path = getattr(v, "path", None) or v.name
                if "moving_variance" in path:
                    ws.append(0.5 + np.abs(rng.normal(0, 0.3, w.shape)))
                elif "gamma" in path:
                    ws.append(1 + 0.2 * rng.normal(size=w.shape))
                else:
                    ws.append(0.2 * rng.normal(size=w.shape))
            layer.set_weights([w.astype(dt) for w in ws])
        if getattr(model.layers[-1], "activation", None) is not None:
            model.layers[-1].activation = keras.activations.linear
        x = rng.uniform(0, 1, size=(3,) + tuple(model.input_shape[1:])).astype(dt)
        logits = model.predict(x, verbose=0)
        model.save(os.path.join(args.dir, name + _suffix(args)))
        np.savez(os.path.join(args.dir, name + _suffix(args) + ".npz"),
                 x=x.reshape(3, -1).astype(np.float64), logits=np.asarray(logits, np.float64))
        print(f"{name}: {model.count_params()} parameters", flush=True)


def check(args):
    from crown_cli.errors import InputError
    from crown_cli.io.networks import load_network

    for name in args.names or ARCHS:
        path = os.path.join(args.dir, name + _suffix(args))
        if not os.path.exists(path):
            continue
        want = np.load(path + ".npz")
        t0 = time.perf_counter()
        try:
            g = load_network(path)
        except InputError as exc:
            print(f"{name:18s} refused: {str(exc)[:200]}", flush=True)
            continue
        t = time.perf_counter() - t0
        got = g.forward(want["x"])
        scale = max(1.0, float(np.abs(want["logits"]).max()))
        err = float(np.abs(got - want["logits"]).max()) / scale
        print(f"{name:18s} loads in {t:4.1f} s, {len(g.nodes):4d} nodes; logits differ by "
              f"{err:.1e} of their scale ({scale:.3g})", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("write", "check"))
    ap.add_argument("dir")
    ap.add_argument("names", nargs="*", help="architectures (default: all)")
    ap.add_argument("--legacy", action="store_true", help="the Keras 2 API (tf_keras), .h5")
    ap.add_argument("--float64", action="store_true", help="Keras 3 in float64")
    args = ap.parse_args(argv)
    (write if args.step == "write" else check)(args)


if __name__ == "__main__":
    sys.exit(main())
