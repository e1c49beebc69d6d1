"""Keras files to :class:`crown_cli.graph.network.Graph`: ``model.save()`` HDF5 (Keras 2 and
Keras 3's legacy ``.h5``: the ``model_config`` JSON attribute and
``model_weights/<layer>/.../<weight>``) and Keras 3 ``.keras`` archives (``config.json`` and
``model.weights.h5``), Sequential or functional. No Keras is needed.

Layers (the handlers of :mod:`crown_cli.graph.keras_layers`): ``InputLayer``, ``Dense``,
``Conv2D``, ``BatchNormalization``, ``AveragePooling2D``, ``MaxPooling2D``, ``ZeroPadding2D``,
``Flatten``, ``Reshape``, ``Add``, ``Subtract``, ``Average``, ``Concatenate``, ``Activation``,
``ReLU``, ``LeakyReLU``, ``ELU``, ``Softmax`` (only on an output), ``Dropout`` and the other
inference-time identities, an arctan ``Lambda`` named ``arctan_<i>``. Anything else: one
InputError naming the layer, its class and the file.

Layout: Keras images are channels-last. The graph's input is the model's own input layout
(an input (H, W, C) is the flat vector in (H, W, C) order, crown's image order, so VNN-LIB's
X_i are the Keras input's elements in row-major order). Inside, an image tensor is kept as a
view in channel-first order (:mod:`crown_cli.graph.tensors`) so the convolutions and pools
are the ONNX loader's; ``Flatten`` and ``Reshape`` take Keras' (H, W, C) element order, and the
permutation is folded into the next ``Dense`` layer's columns (no node). An order-preserving
activation on an output (softmax, sigmoid, tanh, arctan) is dropped, as for Keras MLPs: the
logits are certified (``crown inspect`` lists it among the node's folded layers).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from crown_cli.errors import InputError, read_header
from crown_cli.io.models import MODEL_CLASSES  # a model used as a layer: inlined

NESTED = "__layers__"  # a model layer's weights: {inner layer name: its weights}
ALIAS = "__alias__"  # an identity layer naming an inlined model's input or output
OPS_CLASSES = ("Add", "Subtract", "Multiply", "Divide", "TrueDivide", "Negative")
# the Keras 2 API's TFOpLambda functions read as Keras 3's ops (keras_layers._op)
TF_OPS = {"__operators__.add": "ops.Add", "math.add": "ops.Add",
          "math.subtract": "ops.Subtract", "math.multiply": "ops.Multiply",
          "math.truediv": "ops.TrueDivide", "math.divide": "ops.Divide",
          "math.negative": "ops.Negative"}
# weight roles of a layer's variables in the order Keras 3 stores them (``vars/0, 1, ...``)
_VAR_ROLES = {"Dense": ("kernel", "bias"), "Conv2D": ("kernel", "bias"),
              "Conv1D": ("kernel", "bias"), "Conv2DTranspose": ("kernel", "bias"),
              "PReLU": ("alpha",), "LayerScale": ("gamma",),
              "DepthwiseConv2D": ("depthwise_kernel", "bias"),
              "SeparableConv2D": ("depthwise_kernel", "pointwise_kernel", "bias"),
              "Normalization": ("mean", "variance", "count")}


class KerasLayer:
    """One layer of the model: name, class, config, the tensors it reads
    ((layer, node index, tensor index) each) and its weights by role."""

    def __init__(self, name: str, cls: str, conf: dict, inbound, weights: Dict[str, np.ndarray]):
        self.name, self.cls, self.conf = name, cls, conf
        self.inbound: List[Tuple[str, int, int]] = inbound
        self.weights = weights


def _decode(v) -> str:
    from crown_cli.io.models import _decode as dec

    return dec(v)


def _roles(cls: str, conf: dict, n: int) -> List[str]:
    """Roles of a layer's n variables, in Keras 3's storage order."""
    if cls in ("BatchNormalization", "LayerNormalization", "GroupNormalization"):
        roles = (["gamma"] if conf.get("scale", True) else []) + \
                (["beta"] if conf.get("center", True) else []) + \
                (["moving_mean", "moving_variance"] if cls == "BatchNormalization" else [])
    else:
        roles = list(_VAR_ROLES.get(cls, ()))
    return roles[:n] + [f"var{k}" for k in range(len(roles), n)]


def _history(obj, out: list) -> None:
    """The (layer, node, tensor) of every Keras 3 ``__keras_tensor__`` in a call's args, in
    order."""
    if isinstance(obj, dict):
        if obj.get("class_name") == "__keras_tensor__":
            h = (obj.get("config") or {}).get("keras_history") or []
            if len(h) >= 3:
                out.append((str(h[0]), int(h[1]), int(h[2])))
            return
        for v in obj.values():
            _history(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _history(v, out)


def _inbound(path: str, layer: dict, name: str) -> List[Tuple[str, int, int]]:
    """The tensors a functional model's layer reads: Keras 2 ``[[[name, node, tensor,
    kwargs], ...]]`` or Keras 3 ``[{"args": [...], "kwargs": {...}}]``."""
    nodes = layer.get("inbound_nodes") or []
    if len(nodes) > 1:
        raise InputError(f"{path}: layer '{name}' is called {len(nodes)} times; a shared "
                         "layer is not supported")
    if not nodes:
        return []
    node = nodes[0]
    out: List[Tuple[str, int, int]] = []
    if isinstance(node, dict):
        _history(node.get("args", []), out)
        args = node.get("args", [])
        consts = [_constant(a) for a in args] if isinstance(args, list) else []
        if any(v is not None for v in consts):
            # a Keras 3 op of tensors and numbers (``x + 3.0``): the numbers in place
            layer.setdefault("config", {})["__args__"] = [
                ("const", v) if v is not None else ("tensor", None) for v in consts]
    else:
        if node and isinstance(node[0], str):  # a TFOpLambda's node: the one entry itself
            node = [node]
        for entry in node:
            if not (isinstance(entry, list) and entry and isinstance(entry[0], str)):
                continue
            # a Keras 2 TFOpLambda calls its function with x (a tensor, or a number as
            # ["_CONSTANT_VALUE", -1, value]) and y among the kwargs (a number or a tensor)
            kwargs = entry[3] if len(entry) > 3 and isinstance(entry[3], dict) else {}
            args = []
            if entry[0] == "_CONSTANT_VALUE":
                args.append(("const", _constant(entry[2])))
            else:
                out.append((entry[0], int(entry[1]), int(entry[2])))
                args.append(("tensor", None))
            y = kwargs.get("y")
            if isinstance(y, list) and len(y) == 3 and isinstance(y[0], str):
                out.append((y[0], int(y[1]), int(y[2])))
                args.append(("tensor", None))
            elif (c := _constant(y)) is not None:
                args.append(("const", c))
            if len(args) > 1 or args[0][0] == "const":
                layer.setdefault("config", {})["__args__"] = args
    return out


def _constant(a):
    """A number or a (nested) list of numbers among an op's args, as an array; else None."""
    if isinstance(a, bool):
        return None
    if isinstance(a, dict) and a.get("class_name") == "__numpy__":  # Keras 3's numpy array
        a = (a.get("config") or {}).get("value")
    if isinstance(a, (int, float)):
        return np.asarray(float(a))
    if isinstance(a, list) and a and not any(isinstance(v, dict) for v in a):
        try:
            return np.asarray(a, dtype=np.float64)
        except (TypeError, ValueError):
            return None
    return None


def _refs(obj) -> List[Tuple[str, int, int]]:
    """``input_layers`` / ``output_layers``: [name, node, tensor] or a list of them."""
    if not obj:
        return []
    if isinstance(obj, list) and obj and isinstance(obj[0], str):
        obj = [obj]
    return [(str(r[0]), int(r[1]), int(r[2])) for r in obj]


def _shape_of(conf: dict) -> Optional[list]:
    for key in ("batch_shape", "batch_input_shape"):
        if conf.get(key) is not None:
            return list(conf[key])
    return None


def read_keras(path: str, budget: float) -> Optional[Tuple[List[KerasLayer], list, list, bool]]:
    """(layers in the config's order, inputs [(layer, shape)], outputs [(layer, node,
    tensor)], keras3) of a Keras model file, or None when the file has no model config (a
    weights-only file, NPZ, plain HDF5). ``budget``: bytes a weight may take as float64."""
    path = os.fspath(path)
    magic = read_header(path, "model", 8)
    if magic.startswith(b"PK"):
        from crown_cli.io.models import _is_keras_zip, read_keras_zip

        if not _is_keras_zip(path):
            return None
        config, layers, keras3, arrays = read_keras_zip(path)
        cls = config.get("class_name", "")
        weights = _zip_weights(layers, arrays)
    elif magic == b"\x89HDF\r\n\x1a\n":
        config, layers, weights, keras3 = _read_h5(path, budget)
        if config is None:
            return None
        cls = config.get("class_name", "")
    else:
        return None
    _check_sizes(path, layers, weights, budget)
    return _topology(path, config, cls, layers, weights) + (keras3,)


def _zip_weights(layers, arrays) -> List[dict]:
    """Per layer, its weights by role (:func:`_roles`); a model used as a layer:
    ``{NESTED: {inner layer name: its weights}}``."""
    out = []
    for layer, (_, found) in zip(layers, arrays):
        cls = layer.get("class_name", "")
        conf = layer.get("config", {}) or {}
        if cls in MODEL_CLASSES:
            inner = conf.get("layers") if isinstance(conf.get("layers"), list) else []
            out.append({NESTED: {_layer_name(lay): w for lay, w in
                                 zip(inner, _zip_weights(inner, found))}})
        else:
            out.append(dict(zip(_roles(cls, conf, len(found)), found)))
    return out


def _check_sizes(path, layers, weights, budget) -> None:
    for layer, w in zip(layers, weights):
        for role, a in w.items():
            if role == NESTED:
                for inner, iw in a.items():
                    _check_sizes(path, [{"config": {"name": f"{_layer_name(layer)}/{inner}"}}],
                                 [iw], budget)
            else:
                _check_size(path, f"{_layer_name(layer)}/{role}", a.shape, budget)


def _layer_name(layer: dict) -> str:
    return (layer.get("config", {}) or {}).get("name") or layer.get("name") or ""


def _check_size(path: str, what: str, shape, budget: float) -> None:
    need = int(np.prod(shape, dtype=np.int64)) * 8
    if need > budget:
        raise InputError(f"{path}: weight '{what}' of shape {tuple(shape)} needs "
                         f"{need / 2 ** 30:.3g} GiB as float64, over the memory budget of "
                         f"{budget / 2 ** 30:g} GiB (--memory-budget)")


def _read_h5(path: str, budget: float):
    """(model config, config layers, weights by role per layer, keras3) of a ``model.save()``
    HDF5 file, or (None, ...) when it has no ``model_config``."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get("model_config")
            if raw is None:
                return None, [], [], False
            config = json.loads(_decode(raw))
            g = f["model_weights"] if "model_weights" in f else f
            version = _decode(f.attrs.get("keras_version", g.attrs.get("keras_version", "2")))
            layers = (config.get("config") or {}).get("layers")
            if not isinstance(layers, list):
                raise InputError(f"{path}: model_config holds no list of layers")
            weights = []
            for layer in layers:
                conf = layer.get("config", {}) or {}
                name = conf.get("name") or layer.get("name") or ""
                found = {}
                nested = layer.get("class_name", "") in MODEL_CLASSES
                if name in g:
                    lg = g[name]
                    for wn in (_decode(n) for n in lg.attrs.get("weight_names", [])):
                        ds = lg[wn]
                        _check_size(path, wn, ds.shape, budget)  # before reading it
                        parts = wn.split("/")
                        role = parts[-1].split(":")[0]
                        if nested:  # "<inner layer>/<role>": one dict per inner layer
                            inner = parts[-2] if len(parts) > 1 else ""
                            found.setdefault(inner, {})[role] = np.asarray(ds[()])
                        else:
                            found[role] = np.asarray(ds[()])
                weights.append({NESTED: found} if nested else found)
    except InputError:
        raise
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: cannot read the Keras model config ({type(exc).__name__}: "
                         f"{exc})") from None
    except Exception as exc:  # noqa: BLE001 - HDF5 errors of a corrupt file
        raise InputError(f"{path}: cannot read HDF5 file ({type(exc).__name__}: {exc})") from None
    return config, layers, weights, version.startswith("3")


def _topology(path: str, config: dict, cls: str, layers: list, weights: list):
    """Layers with their inbound tensors, the inputs with their shapes, the outputs. A model
    used as a layer (transfer learning's base, a Sequential of augmentation layers) is
    inlined: its layers named ``<model>/<layer>``, its inputs identities of the tensors the
    model layer reads, and an identity named as the model layer reading its output."""
    conf_all = config.get("config") or {}
    if cls not in MODEL_CLASSES:
        raise InputError(f"{path}: the model is a {cls or 'unknown class'}; expected a "
                         "Sequential or functional model")
    out_layers: List[KerasLayer] = []
    inputs, outputs = _model(path, cls, conf_all, layers, weights, "", None, out_layers)
    if cls == "Sequential":
        if not inputs[0][1]:
            inputs = [(inputs[0][0], conf_all.get("build_input_shape"))]
        if not out_layers:
            raise InputError(f"{path}: the Sequential model has no layers")
    elif not inputs or not outputs:
        raise InputError(f"{path}: the functional model config lists no input_layers or "
                         "output_layers")
    return out_layers, inputs, outputs


def _model(path, cls, conf_all, layers, weights, prefix, feeds, out_layers):
    """Append the KerasLayers of one model's ``layers`` (names prefixed by ``prefix``) to
    ``out_layers``; ``feeds``: the refs its inputs read (None: the file's own inputs).
    Returns (inputs [(name, shape)], outputs [refs])."""
    def named(n):
        return prefix + n

    models = {_layer_name(lay) for lay in layers if lay.get("class_name", "") in MODEL_CLASSES}

    def ref(r):  # a model layer's output is its alias, whichever call of the model made it
        return (named(r[0]), 0 if r[0] in models else r[1], r[2])

    def add(name, lcls, conf, inbound, w):
        if lcls in MODEL_CLASSES:
            inner = conf.get("layers") if isinstance(conf.get("layers"), list) else []
            found = w.get(NESTED, {})
            inner_w = [found.get(_layer_name(lay)) or {NESTED: found} if
                       lay.get("class_name", "") in MODEL_CLASSES else
                       found.get(_layer_name(lay), {}) for lay in inner]
            _, outs = _model(path, lcls, conf, inner, inner_w, named(name) + "/", inbound,
                             out_layers)
            if len(outs) != 1:
                raise InputError(f"{path}: layer '{named(name)}' ({lcls}) has {len(outs)} "
                                 "outputs; a model used as a layer must have one")
            out_layers.append(KerasLayer(named(name), ALIAS, {}, outs, {}))
        else:
            out_layers.append(KerasLayer(named(name), lcls, conf, inbound, w))

    inputs = []
    if cls == "Sequential":
        shape, prev = None, None
        for layer, w in zip(layers, weights):
            lcls = layer.get("class_name", "")
            conf = layer.get("config", {}) or {}
            name = _layer_name(layer)
            if shape is None:
                shape = _shape_of(conf)
            if lcls == "InputLayer":
                continue
            if prev is None:
                prev = feeds[0] if feeds else ("__input__", 0, 0)
            add(name, lcls, conf, [prev], w)
            prev = (named(name), 0, 0)
        if prev is None:
            raise InputError(f"{path}: the Sequential model {prefix or ''}has no layers")
        return [("__input__", shape)], [prev]
    by_name = {}
    for layer, w in zip(layers, weights):
        lcls = layer.get("class_name", "")
        if str(layer.get("module", "")).startswith("keras.src.ops"):
            lcls = "ops." + lcls  # a Keras 3 op on tensors (``x + 3.0``), not a layer
        elif lcls == "TFOpLambda":  # the Keras 2 API's op on tensors
            fn = str((layer.get("config") or {}).get("function", ""))
            lcls = TF_OPS.get(fn, f"TFOpLambda {fn}")
        name = _layer_name(layer)
        if lcls == "InputLayer":
            by_name[name] = (lcls, layer.get("config", {}) or {})
            continue
        refs = [ref(r) for r in _inbound(path, layer, name)]  # (an op's numbers into config)
        conf = layer.get("config", {}) or {}
        by_name[name] = (lcls, conf)
        if lcls in OPS_CLASSES and (lcls in ("TrueDivide", "Negative", "Divide") or
                                    "__args__" in conf):
            lcls = "ops." + lcls  # an op with a number (a legacy .h5 has no module)
        add(name, lcls, conf, refs, w)
    for k, (name, _, _) in enumerate(_refs(conf_all.get("input_layers"))):
        lcls, conf = by_name.get(name, ("", {}))
        if lcls != "InputLayer":
            raise InputError(f"{path}: model input '{named(name)}' is not an InputLayer")
        if feeds is None:
            inputs.append((name, _shape_of(conf)))
        elif k < len(feeds):  # an inlined model's input: what the model layer reads
            out_layers.append(KerasLayer(named(name), ALIAS, {}, [feeds[k]], {}))
        else:
            raise InputError(f"{path}: layer '{prefix[:-1]}' reads {len(feeds)} tensors; its "
                             "model has more inputs")
    return inputs, [ref(r) for r in _refs(conf_all.get("output_layers"))]


def load_keras_graph(path: str, memory_budget: Optional[float] = None):
    """The :class:`~crown_cli.graph.network.Graph` of a Keras model file, or None when the
    file has no model config (not a ``model.save()`` file). InputError for a layer or
    setting this loader does not read (one line naming the layer and the file)."""
    from crown_cli.graph.keras_layers import build
    from crown_cli.graph.onnx_graph import MEMORY_BUDGET

    budget = MEMORY_BUDGET if memory_budget is None else float(memory_budget)
    read = read_keras(path, budget)
    if read is None:
        return None
    layers, inputs, outputs, keras3 = read
    return build(path, layers, inputs, outputs, keras3)
