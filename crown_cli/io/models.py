"""Loading and saving MLP weights: NPZ, plain HDF5 and Keras ``model.save()`` HDF5.

Every loader returns an :class:`MLP` whose weights follow the engine's convention:
``weights[k]`` has shape (outputs, inputs) and ``biases[k]`` shape (outputs,), float64,
C-contiguous. All checks on a model file happen here, once; the engine trusts its inputs.
"""
from __future__ import annotations

import json
import os
import re
from typing import List, Optional, Sequence

import numpy as np

from crown_cli.activations import ACTIVATIONS, supporting
from crown_cli.errors import InputError, read_header
from crown_cli.network import MLP, VECTOR_OUTPUTS

__all__ = ["MLP", "load_model", "save_npz", "save_keras_h5", "normalize_activation", "validate"]

# Activations the loaders accept (crown_cli.activations); the engine decides which it can bound.
KNOWN_ACTIVATIONS = supporting("mlp")
_ALIASES = {"atan": "arctan", "logistic": "sigmoid", "identity": "linear", "leakyrelu": "leaky_relu",
            "leaky-relu": "leaky_relu", "hard-sigmoid": "hard_sigmoid"}


def normalize_activation(name: str, where: str) -> str:
    """Canonical activation name, or an InputError naming ``where`` it came from."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in KNOWN_ACTIVATIONS:
        raise InputError(
            f"{where}: unknown activation '{name}' (known: {', '.join(KNOWN_ACTIVATIONS)})"
        )
    return key


def validate(mlp: MLP, where: str, min_outputs: int = 2) -> MLP:
    """Check shapes chain and values are finite; convert to contiguous float64. A classifier
    (``certify``) needs ``min_outputs`` = 2; ``verify`` takes any number (1)."""
    if len(mlp.weights) == 0:
        raise InputError(f"{where}: the model has no Dense layers")
    if len(mlp.weights) != len(mlp.biases):
        raise InputError(
            f"{where}: {len(mlp.weights)} weight matrices but {len(mlp.biases)} bias vectors"
        )
    ws, bs = [], []
    for k, (w, b) in enumerate(zip(mlp.weights, mlp.biases)):
        w = np.asarray(w)
        b = np.asarray(b)
        if w.dtype.kind not in "fiu" or b.dtype.kind not in "fiu":
            raise InputError(f"{where}: layer {k} weights are not numeric (dtype {w.dtype}/{b.dtype})")
        if w.ndim != 2:
            raise InputError(f"{where}: layer {k} weight has shape {w.shape}, expected 2-D")
        if b.ndim != 1 or b.shape[0] != w.shape[0]:
            raise InputError(
                f"{where}: layer {k} bias has shape {b.shape}, expected ({w.shape[0]},) "
                f"to match weight {w.shape}"
            )
        if k > 0 and w.shape[1] != ws[-1].shape[0]:
            raise InputError(
                f"{where}: layer {k} weight expects {w.shape[1]} inputs but layer {k - 1} "
                f"has {ws[-1].shape[0]} outputs"
            )
        if w.size == 0:
            raise InputError(f"{where}: layer {k} weight is empty, shape {w.shape}")
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(b))):
            raise InputError(f"{where}: layer {k} contains NaN or infinite values")
        ws.append(np.ascontiguousarray(w, dtype=np.float64))
        bs.append(np.ascontiguousarray(b, dtype=np.float64))
    if ws[-1].shape[0] < min_outputs:
        raise InputError(f"{where}: the last layer has {ws[-1].shape[0]} output, need >= 2 classes")
    act = normalize_activation(mlp.activation, where)
    out = mlp.output_activation
    if out is not None:
        key = str(out).strip().lower().replace("logsoftmax", "log_softmax")
        out = key if key in VECTOR_OUTPUTS else normalize_activation(out, f"{where}: output activation")
        if out == "linear":
            out = None
        elif len(ws) == 1 and out not in VECTOR_OUTPUTS:
            act = out  # no hidden layers: the only activation is the output's
    alpha = _check_alpha(act, mlp.alpha, where)
    return MLP(ws, bs, act, mlp.source or where, list(mlp.layer_names), alpha, out,
               input_order=mlp.input_order)


def _check_alpha(act: str, alpha, where: str) -> Optional[float]:
    """The activation's parameter (default filled in), checked against its valid range."""
    from crown_cli.activations import default_alpha, param_ok, param_range, range_text

    prange = ACTIVATIONS[act].param_range if act in ACTIVATIONS else None
    if prange is None:
        return None
    alpha = default_alpha(act) if alpha is None else float(alpha)
    lo, hi, lo_ok = prange
    if not np.isfinite(alpha) or alpha > hi or alpha < lo or (alpha == lo and not lo_ok):
        rng = f"{'[' if lo_ok else '('}{lo}, {hi}{']' if np.isfinite(hi) else ')'}"
        graph = param_range(act, graph=True)
        also = f" (as a node of an ONNX graph: {range_text(graph)})" \
            if graph != prange and param_ok(graph, alpha) else ""
        raise InputError(f"{where}: {act} parameter alpha={alpha} outside the supported range "
                         f"{rng}{also}")
    return alpha


# --------------------------------------------------------------------------- loading


def load_model(path: str, activation: Optional[str] = None, min_outputs: int = 2) -> MLP:
    """Load an MLP from NPZ, plain HDF5, Keras HDF5 or a Keras 3 ``.keras`` archive (ONNX
    files: :func:`crown_cli.io.networks.load_network`); ``activation`` and ``min_outputs``
    as :func:`checked`."""
    path = os.fspath(path)
    magic = read_header(path, "model", 8)
    if path.lower().endswith(".onnx"):
        raise InputError(f"{path}: an ONNX file; crown_cli.io.networks.load_network reads it")
    if magic.startswith(b"PK"):
        mlp = _load_keras_zip(path) if _is_keras_zip(path) else _load_npz(path)
    elif magic == b"\x89HDF\r\n\x1a\n":
        mlp = _load_hdf5(path)
    else:
        raise InputError(f"{path}: not an NPZ or HDF5 file (unrecognised header; ONNX models need the .onnx suffix)")
    return checked(mlp, path, activation, min_outputs)


def checked(mlp: MLP, path: str, activation: Optional[str] = None, min_outputs: int = 2) -> MLP:
    """A loaded MLP with its activation overridden by ``activation`` (``--activation``),
    checked by :func:`validate` (``min_outputs`` as there)."""
    if activation is not None:
        new = normalize_activation(activation, "--activation")
        if new != mlp.activation:
            mlp.alpha = None  # the file's parameter belongs to the file's activation
        mlp.activation = new
    return validate(mlp, path, min_outputs)


def _numbered(keys: Sequence[str], prefix: str, path: str) -> List[str]:
    found = sorted(
        (int(m.group(1)), k) for k in keys for m in [re.fullmatch(prefix + r"(\d+)", k)] if m
    )
    idx = [i for i, _ in found]
    if idx != list(range(len(idx))):
        raise InputError(f"{path}: arrays {prefix}0..{prefix}{len(idx) - 1} expected, found {idx}")
    return [k for _, k in found]


def _decode(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        if value.shape == ():
            return _decode(value.item())
        if value.size == 1:
            return _decode(value.reshape(-1)[0])
    return str(value)


def _load_npz(path: str) -> MLP:
    try:
        with np.load(path, allow_pickle=False) as data:
            keys = list(data.keys())
            wk = _numbered(keys, "W", path)
            bk = _numbered(keys, "b", path)
            if not wk:
                raise InputError(f"{path}: no weight arrays W0, W1, ... found (keys: {keys})")
            ws = [data[k] for k in wk]
            bs = [data[k] for k in bk]
            act = _decode(data["activation"]) if "activation" in keys else "relu"
            alpha = float(data["alpha"]) if "alpha" in keys else None
    except InputError:
        raise
    except Exception as exc:  # zipfile/pickle errors from a corrupt archive
        raise InputError(f"{path}: cannot read NPZ archive ({type(exc).__name__}: {exc})") from None
    return MLP(ws, bs, act, path, alpha=alpha)


def _load_hdf5(path: str) -> MLP:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if "model_weights" in f or "layer_names" in f.attrs:
                return _load_keras(f, path)
            keys = list(f.keys())
            wk = _numbered(keys, "W", path)
            bk = _numbered(keys, "b", path)
            if not wk:
                raise InputError(
                    f"{path}: HDF5 file has neither Keras 'model_weights' nor datasets W0, b0, ..."
                )
            ws = [f[k][()] for k in wk]
            bs = [f[k][()] for k in bk]
            act = _decode(f["activation"][()]) if "activation" in f else _decode(
                f.attrs.get("activation", "relu")
            )
            alpha = f["alpha"][()] if "alpha" in f else f.attrs.get("alpha")
            return MLP(ws, bs, act, path, alpha=None if alpha is None else float(alpha))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{path}: cannot read HDF5 file ({type(exc).__name__}: {exc})") from None


def _activation_from_name(layer_name: str) -> Optional[str]:
    """'tanh_1' -> 'tanh'; the paper's code names Activation/Lambda layers ``<act>_<i>``."""
    base = re.sub(r"_\d+$", "", layer_name.lower())
    base = _ALIASES.get(base, base)
    return base if base in KNOWN_ACTIVATIONS else None


def _config_layers(f) -> dict:
    """Map layer name -> (class_name, config) from the ``model_config`` JSON attribute, if any."""
    raw = f.attrs.get("model_config")
    if raw is None:
        return {}
    try:
        cfg = json.loads(_decode(raw))
    except (ValueError, TypeError):
        return {}
    layers = cfg.get("config", {})
    if isinstance(layers, dict):
        layers = layers.get("layers", [])
    out = {}
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict):
            conf = layer.get("config", {}) or {}
            name = conf.get("name") or layer.get("name")
            if name:
                out[name] = (layer.get("class_name", ""), conf)
    return out


def _raw_activation(conf_entry) -> Optional[str]:
    """The activation name a config entry (Dense or Activation layer) applies, or None."""
    act = conf_entry.get("activation")
    if isinstance(act, dict):  # Keras 3 may serialise functions as dicts
        act = act.get("config", {}).get("name") or act.get("class_name")
    return None if act is None else str(act).strip().lower()


# Weightless layers that do not change the function of a flattened MLP at inference.
_PASSTHROUGH = ("Flatten", "InputLayer", "Dropout", "Reshape")
_PASSTHROUGH_NAMES = re.compile(r"^(flatten|input|dropout|reshape)(_\d+)?$")
# Strictly increasing output activations keep the order of the logits, hence every margin's
# sign: certifying the pre-activation logits certifies the model's decision.
_ORDER_PRESERVING = ("linear", "softmax", "sigmoid", "tanh", "arctan")


# Layer classes that are an activation with a parameter: class -> (activation, config keys)
_PARAM_LAYERS = {"LeakyReLU": ("leaky_relu", ("alpha", "negative_slope")), "ELU": ("elu", ("alpha",))}
_PARAM_DEFAULTS = {"LeakyReLU": 0.3, "ELU": 1.0}  # the Keras layers' defaults


def _layer_alpha(cls: str, conf: dict) -> Optional[float]:
    for key in _PARAM_LAYERS[cls][1]:
        if conf.get(key) is not None:
            return float(conf[key])
    return _PARAM_DEFAULTS[cls]


def _layer_activation(cls: str, conf: dict, name: str, path: str) -> Optional[str]:
    """Activation applied by a weightless layer, None for a pass-through; errors otherwise."""
    if cls in _PASSTHROUGH or (not cls and _PASSTHROUGH_NAMES.match(name)):
        return None
    if cls in _PARAM_LAYERS:
        return _PARAM_LAYERS[cls][0]
    if cls == "Activation" or (not cls and _activation_from_name(name)):
        return _raw_activation(conf) or _activation_from_name(name)
    if cls == "Lambda" or (not cls and name.lower().startswith("lambda")):
        act = _activation_from_name(name)
        if act is None:
            raise InputError(
                f"{path}: Lambda layer '{name}' is not a known activation (expected a name like arctan_1)"
            )
        return act
    raise InputError(
        f"{path}: layer '{name}' ({cls or 'unknown type'}) is not supported; "
        "only Dense, Flatten, Dropout, Activation and arctan Lambda layers are"
    )


def _load_keras(f, path: str) -> MLP:
    g = f["model_weights"] if "model_weights" in f else f
    if "layer_names" not in g.attrs:
        raise InputError(f"{path}: Keras file without a 'layer_names' attribute")
    names = [_decode(n) for n in g.attrs["layer_names"]]
    config = _config_layers(f)
    keras3 = _decode(f.attrs.get("keras_version", g.attrs.get("keras_version", "2"))).startswith("3")
    entries = []
    for name in names:
        if name not in g:
            raise InputError(f"{path}: layer '{name}' listed in layer_names but missing")
        cls, conf = config.get(name, ("", {}))
        lg = g[name]
        wnames = [_decode(n) for n in lg.attrs.get("weight_names", [])]
        entries.append((name, cls, conf, [np.asarray(lg[wn][()]) for wn in wnames]))
    return _keras_mlp(entries, path, keras3)


def _keras_mlp(entries, path: str, keras3: bool) -> MLP:
    """The MLP of a Keras model given as its layers in order: (name, class name or '' when the
    file has no config, config dict, weight arrays)."""
    alphas = set()
    ws, bs, dense_names = [], [], []
    acts: List[Optional[str]] = []  # the activation after each Dense layer, if any
    sources: List[str] = []  # the layer each activation came from
    for name, cls, conf, arrays in entries:
        if arrays:
            kernels = [a for a in arrays if a.ndim == 2]
            biases = [a for a in arrays if a.ndim == 1]
            if len(kernels) != 1 or len(biases) > 1 or len(arrays) > 2 or cls not in ("", "Dense"):
                shapes = [a.shape for a in arrays]
                raise InputError(
                    f"{path}: layer '{name}' is not a Dense layer ({cls or 'weights'} {shapes}); "
                    "only Dense, Flatten, Dropout, Activation and arctan Lambda layers are supported"
                )
            kernel = kernels[0]  # Keras stores (inputs, outputs)
            ws.append(kernel.T)
            bs.append(biases[0] if biases else np.zeros(kernel.shape[1]))
            dense_names.append(name)
            act = _raw_activation(conf)
            acts.append(None if act == "linear" else act)
            sources.append(name)
            continue
        act = _layer_activation(cls, conf, name, path)
        if cls in _PARAM_LAYERS:
            alphas.add(_layer_alpha(cls, conf))
        if act is not None and act != "linear" and acts:
            if acts[-1] is not None:
                raise InputError(f"{path}: layer '{name}' stacks a second activation on '{dense_names[-1]}'")
            acts[-1] = act
            sources[-1] = name
    if not ws:
        raise InputError(f"{path}: Keras file contains no Dense layers")
    out_act = acts[-1]
    if out_act is not None and out_act not in _ORDER_PRESERVING:
        raise InputError(
            f"{path}: output activation '{out_act}' does not preserve the order of the logits; "
            f"supported: {', '.join(_ORDER_PRESERVING)}"
        )
    hidden = acts[:-1]
    for name, act in zip(sources, hidden):
        if act is not None:
            normalize_activation(act, f"{path}: layer '{name}'")
    kinds = {normalize_activation(a, path) for a in hidden if a is not None}
    if len(kinds) > 1:
        raise InputError(f"{path}: mixed hidden activations {sorted(kinds)} are not supported")
    if kinds and any(a is None for a in hidden):
        missing = [n for n, a in zip(dense_names, hidden) if a is None]
        raise InputError(f"{path}: Dense layer(s) {missing} have no activation after them")
    activation = kinds.pop() if kinds else "relu"
    if len(alphas) > 1:
        raise InputError(f"{path}: {activation} layers with different parameters {sorted(alphas)}")
    alpha = alphas.pop() if alphas else None
    if activation == "hard_sigmoid" and keras3:
        alpha = 1.0 / 6.0  # Keras 3: relu6(z + 3) / 6
    return MLP(ws, bs, activation, path, dense_names, alpha)


def _is_keras_zip(path: str) -> bool:
    """A ``.keras`` file, or any zip archive holding Keras 3's ``config.json`` (NPZ files are
    zip archives too, of ``.npy`` members)."""
    import zipfile

    if path.lower().endswith(".keras"):
        return True
    try:
        with zipfile.ZipFile(path) as zf:
            return "config.json" in zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def _snake_case(name: str) -> str:
    """Keras' key for a layer class in the weights file: 'LeakyReLU' -> 'leaky_re_lu'."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _load_keras_zip(path: str) -> MLP:
    """A Keras 3 ``model.save('m.keras')`` archive as an MLP (:func:`read_keras_zip`); a
    functional model must be a chain of layers."""
    config, layers, keras3, arrays = read_keras_zip(path)
    cls = config.get("class_name", "")
    entries = []
    prev = None
    for layer, (name, found) in zip(layers, arrays):
        lcls = layer.get("class_name", "")
        if lcls == "InputLayer" and cls == "Sequential":
            continue  # not among a Sequential model's layers in the weights file
        if lcls == "Dense" and not found:
            raise InputError(f"{path}: Dense layer '{name}' has no weights in model.weights.h5")
        if lcls in MODEL_CLASSES:  # (the graph reader inlines it)
            raise InputError(f"{path}: layer '{name}' is a model ({lcls}), not a Dense layer")
        _check_chain(layer, prev, name, path)
        prev = name
        entries.append((name, lcls, layer.get("config", {}) or {}, found))
    return _keras_mlp(entries, path, keras3)


def read_keras_zip(path: str):
    """A Keras 3 ``model.save('m.keras')`` archive: ``config.json`` (the model's layers),
    ``metadata.json`` and ``model.weights.h5`` (``layers/<key>/vars/0, 1, ...``, the group
    ``vars`` carrying the layer's name; keys are the snake-case class names numbered
    ``dense, dense_1, ...`` in layer order). Returns (the model's config, its layers, True
    for Keras 3, per layer (its name, its weight arrays in order))."""
    import io
    import zipfile

    import h5py

    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.namelist()
            missing = [m for m in ("config.json", "model.weights.h5") if m not in members]
            if missing:
                raise InputError(f"{path}: Keras archive without {' and '.join(missing)} "
                                 f"(members: {', '.join(members) or 'none'})")
            config = json.loads(zf.read("config.json").decode("utf-8"))
            meta = json.loads(zf.read("metadata.json").decode("utf-8")) if "metadata.json" in members else {}
            weights_bytes = zf.read("model.weights.h5")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - zip, JSON or decoding errors of a corrupt file
        raise InputError(f"{path}: cannot read Keras archive ({type(exc).__name__}: {exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        raise InputError(f"{path}: config.json does not describe a Keras model")
    cls = config.get("class_name", "")
    layers = config["config"].get("layers")
    if cls not in ("Sequential", "Functional", "Model") or not isinstance(layers, list):
        raise InputError(f"{path}: config.json holds a {cls or 'unknown'} object, expected a "
                         "Sequential or functional model of layers")
    keras3 = str(meta.get("keras_version", "3")).startswith("3")
    try:
        with h5py.File(io.BytesIO(weights_bytes), "r") as f:
            out = _zip_layer_arrays(f["layers"] if "layers" in f else {}, layers, cls)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - HDF5 errors of a corrupt weights file
        raise InputError(f"{path}: cannot read model.weights.h5 in the Keras archive "
                         f"({type(exc).__name__}: {exc})") from None
    return config, layers, keras3, out


MODEL_CLASSES = ("Functional", "Model", "Sequential")  # a model used as a layer


def _zip_layer_arrays(groups, layers, cls: str):
    """Per layer of a model (its config's ``layers``), (name, its weight arrays in order) from
    the weights file's ``groups`` (``<key>/vars/0, 1, ...``); a model used as a layer gives
    (name, the same list of its own layers, from ``<key>/layers``)."""
    by_name = {}  # layer name -> its group of variables
    for key in groups:
        vg = groups[key]["vars"] if "vars" in groups[key] else None
        if vg is not None:
            by_name[_decode(vg.attrs.get("name", key))] = vg
    used = {}
    out = []
    for layer in layers:
        lcls = layer.get("class_name", "") if isinstance(layer, dict) else ""
        conf = (layer.get("config", {}) or {}) if isinstance(layer, dict) else {}
        name = conf.get("name") or layer.get("name") or ""
        if lcls == "InputLayer" and cls == "Sequential":
            out.append((name, []))  # not among a Sequential model's weight keys
            continue
        base = _snake_case(lcls)  # the key Keras gives this layer in the weights file
        used[base] = used.get(base, -1) + 1
        key = base if used[base] == 0 else f"{base}_{used[base]}"
        if lcls in MODEL_CLASSES:
            inner = conf.get("layers")
            sub = groups[key]["layers"] if key in groups and "layers" in groups[key] else {}
            out.append((name, _zip_layer_arrays(sub, inner if isinstance(inner, list) else [],
                                                lcls)))
            continue
        vg = by_name.get(name)
        if vg is None and key in groups and "vars" in groups[key]:
            vg = groups[key]["vars"]
        arrays = []
        if vg is not None:
            idx = sorted(int(k) for k in vg if k.isdigit())
            arrays = [np.asarray(vg[str(i)][()]) for i in idx]
        out.append((name, arrays))
    return out


def _check_chain(layer: dict, prev: Optional[str], name: str, path: str) -> None:
    """A functional model's layer must take exactly the previous layer's output."""
    nodes = layer.get("inbound_nodes")
    if not nodes or prev is None:
        return
    sources = []

    def collect(obj):
        if isinstance(obj, dict):
            hist = obj.get("config", {}).get("keras_history") if obj.get("class_name") == "__keras_tensor__" else None
            if hist:
                sources.append(hist[0])
            for v in obj.values():
                collect(v)
        elif isinstance(obj, list):
            for v in obj:
                collect(v)

    collect(nodes)
    if sources and (len(nodes) != 1 or sources != [prev]):
        raise InputError(f"{path}: layer '{name}' takes {sources} as input, not only the previous "
                         f"layer '{prev}'; only chains of layers are supported")


# --------------------------------------------------------------------------- saving


def save_npz(path: str, weights, biases, activation: str = "relu", alpha=None) -> None:
    """Write the NPZ format: W0.., b0.. with W of shape (outputs, inputs), string ``activation``,
    optional scalar ``alpha`` (the activation's parameter)."""
    arrays = {f"W{k}": np.asarray(w) for k, w in enumerate(weights)}
    arrays.update({f"b{k}": np.asarray(b) for k, b in enumerate(biases)})
    arrays["activation"] = np.array(activation)
    if alpha is not None:
        arrays["alpha"] = np.array(float(alpha))
    np.savez(path, **arrays)


def save_keras_h5(
    path: str,
    weights,
    biases,
    activation: str = "relu",
    *,
    input_shape=(28, 28, 1),
    dense_activation: bool = False,
    dtype=np.float32,
    alpha=None,
) -> None:
    """Write ``weights`` (outputs, inputs) in the HDF5 layout of Keras 2 ``model.save()``.

    A Sequential model: Flatten, then per hidden layer ``Dense`` followed by an ``Activation``
    layer named ``<act>_<i>`` (``Lambda`` for arctan; ``LeakyReLU`` / ``ELU`` layers carrying
    ``alpha`` when it is given), then the output ``Dense``. With ``dense_activation=True`` the
    activation is put in the hidden Dense layers' config instead.
    """
    import h5py

    layers_cfg = [
        {
            "class_name": "Flatten",
            "config": {"name": "flatten_1", "trainable": True, "batch_input_shape": [None, *input_shape],
                       "dtype": "float32", "data_format": "channels_last"},
        }
    ]
    layer_names = ["flatten_1"]
    weight_groups = {"flatten_1": []}
    m = len(weights)
    for k, (w, b) in enumerate(zip(weights, biases)):
        name = f"dense_{k + 1}"
        w = np.asarray(w)
        hidden = k < m - 1
        dense_act = activation if (hidden and dense_activation) else "linear"
        layers_cfg.append(
            {
                "class_name": "Dense",
                "config": {"name": name, "trainable": True, "dtype": "float32", "units": int(w.shape[0]),
                           "activation": dense_act, "use_bias": True},
            }
        )
        layer_names.append(name)
        weight_groups[name] = [
            (f"{name}/kernel:0", np.asarray(w, dtype=dtype).T),
            (f"{name}/bias:0", np.asarray(b, dtype=dtype)),
        ]
        if hidden and not dense_activation:
            aname = f"{activation}_{k + 1}"
            param_layer = {"leaky_relu": "LeakyReLU", "elu": "ELU"}.get(activation)
            if activation == "arctan":
                layers_cfg.append({"class_name": "Lambda", "config": {"name": aname, "trainable": True,
                                                                      "function": "arctan"}})
            elif param_layer and alpha is not None:
                layers_cfg.append({"class_name": param_layer, "config": {"name": aname, "trainable": True,
                                                                         "alpha": float(alpha)}})
            else:
                layers_cfg.append({"class_name": "Activation", "config": {"name": aname, "trainable": True,
                                                                          "activation": activation}})
            layer_names.append(aname)
            weight_groups[aname] = []
    model_config = {"class_name": "Sequential", "config": {"name": "sequential_1", "layers": layers_cfg}}
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = b"2.1.6"
        f.attrs["backend"] = b"tensorflow"
        f.attrs["model_config"] = json.dumps(model_config).encode("utf-8")
        g = f.create_group("model_weights")
        g.attrs["layer_names"] = np.array([n.encode("utf-8") for n in layer_names])
        g.attrs["backend"] = b"tensorflow"
        g.attrs["keras_version"] = b"2.1.6"
        for name in layer_names:
            lg = g.create_group(name)
            entries = weight_groups[name]
            lg.attrs["weight_names"] = np.array([wn.encode("utf-8") for wn, _ in entries], dtype="S")
            for wn, arr in entries:
                lg.create_dataset(wn, data=arr)
