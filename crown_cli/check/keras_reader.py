"""Keras HDF5 (``model.save()``, Keras 2 or 3 ``.h5``) Sequential models of Dense layers, read
with h5py for the checker (docs/proofs.md, "Certificates of radii").

Scope: the ``model_config`` attribute a Sequential model of layers ``InputLayer``, ``Flatten``,
``Dropout`` (no change at inference), ``Dense`` (activation ``linear`` or ``relu``; the last
one ``linear`` or ``softmax``, which keeps the order of the logits) and ``Activation``
(``relu`` after a linear hidden ``Dense``, ``linear``, or ``softmax`` after the last one). The
weights come from ``model_weights/<layer>`` by its ``weight_names`` (kernel (in, out), bias
(out,)). Every hidden Dense must be followed by a ReLU; anything else is rejected naming it.
The network is the logits: a softmax on them is left out (y_c > y_t iff softmax_c > softmax_t).
"""
import json

import numpy as np

from .network import CheckError, Network, Reject, _exact

_PASS = ("InputLayer", "Flatten", "Dropout")


def _text(v):
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _act(conf):
    a = conf.get("activation", "linear")
    if isinstance(a, dict):  # Keras 3 may serialise an activation as a dict
        a = (a.get("config") or {}).get("name") or a.get("class_name")
    return str(a).strip().lower()


def read_keras_h5(path):
    """The Network of a Keras HDF5 file (CheckError: unreadable; Reject: outside the scope)."""
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency of crown
        raise CheckError(f"{path}: reading HDF5 needs h5py") from None
    try:
        f = h5py.File(path, "r")
    except Exception as exc:
        raise CheckError(f"{path}: cannot read the HDF5 file ({type(exc).__name__}: {exc})") from None
    with f:
        raw = f.attrs.get("model_config")
        if raw is None:
            raise Reject("HDF5 model without a model_config attribute (a Keras model.save() "
                         "file is expected)")
        try:
            cfg = json.loads(_text(raw))
        except ValueError:
            raise Reject("model_config is not JSON") from None
        if cfg.get("class_name") != "Sequential":
            raise Reject(f"model class {cfg.get('class_name')!r}: only Sequential models")
        layers = cfg.get("config")
        layers = layers.get("layers") if isinstance(layers, dict) else layers
        if not isinstance(layers, list):
            raise Reject("model_config has no layer list")
        g = f["model_weights"] if "model_weights" in f else f
        dense = []  # [kernel (in, out), bias, activation after it]
        for layer in layers:
            cls, conf = layer.get("class_name"), layer.get("config") or {}
            name = conf.get("name", "?")
            if cls in _PASS:
                continue
            if cls == "Activation":
                act = _act(conf)
                if act == "linear":
                    continue
                if not dense or dense[-1][2] != "linear" or act not in ("relu", "softmax"):
                    raise Reject(f"layer {name}: activation {act} not directly after a linear "
                                 "Dense layer")
                dense[-1][2] = act
                continue
            if cls != "Dense":
                raise Reject(f"layer {name}: class {cls} is outside the checker's scope "
                             "(Dense, Activation relu, Flatten, Dropout, InputLayer)")
            act = _act(conf)
            if act not in ("linear", "relu", "softmax"):
                raise Reject(f"layer {name}: activation {act}: the checker takes ReLU networks only")
            try:
                lg = g[name]
                names = [_text(n) for n in lg.attrs["weight_names"]]
                arrays = [np.asarray(lg[n][()]) for n in names]
            except Exception as exc:
                raise Reject(f"layer {name}: weights unreadable ({type(exc).__name__}: {exc})") from None
            kern = [a for a in arrays if a.ndim == 2]
            bias = [a for a in arrays if a.ndim == 1]
            use_bias = conf.get("use_bias", True)
            if len(kern) != 1 or len(bias) != (1 if use_bias else 0) or len(arrays) != len(kern) + len(bias):
                raise Reject(f"layer {name}: weights {[a.shape for a in arrays]} are not a "
                             "kernel and a bias")
            k = _exact(kern[0], f"{name} kernel")
            b = _exact(bias[0], f"{name} bias") if bias else np.zeros(k.shape[1])
            if b.shape != (k.shape[1],):
                raise Reject(f"layer {name}: bias {b.shape} for kernel {k.shape}")
            dense.append([k, b, act])
    if not dense:
        raise Reject("no Dense layer")
    for i, (_, _, act) in enumerate(dense):
        last = i == len(dense) - 1
        if (not last and act != "relu") or (last and act == "relu"):
            raise Reject(f"Dense layer {i + 1} of {len(dense)} has activation {act}: the checker "
                         "reads a ReLU after every hidden Dense layer and none after the last")
    layers, sizes = [], [dense[0][0].shape[0]]
    for k, b, _ in dense:
        if k.shape[0] != sizes[-1]:
            raise Reject(f"kernel {k.shape} does not chain after {sizes[-1]} values")
        sizes.append(k.shape[1])
        layers.append([("mat", np.ascontiguousarray(k)), ("add", b, 1.0)])
    return Network(layers, sizes)
