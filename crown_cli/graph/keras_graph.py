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

# weight roles of a layer's variables in the order Keras 3 stores them (``vars/0, 1, ...``)
_VAR_ROLES = {"Dense": ("kernel", "bias"), "Conv2D": ("kernel", "bias"),
              "Conv1D": ("kernel", "bias"), "Conv2DTranspose": ("kernel", "bias"),
              "PReLU": ("alpha",),
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
    if cls == "BatchNormalization":
        roles = (["gamma"] if conf.get("scale", True) else []) + \
                (["beta"] if conf.get("center", True) else []) + ["moving_mean", "moving_variance"]
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
    else:
        for entry in node:
            if isinstance(entry, list) and entry and isinstance(entry[0], str):
                out.append((entry[0], int(entry[1]), int(entry[2])))
    return out


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
        weights = []
        for layer, (name, found) in zip(layers, arrays):
            conf = layer.get("config", {}) or {}
            weights.append(dict(zip(_roles(layer.get("class_name", ""), conf, len(found)), found)))
    elif magic == b"\x89HDF\r\n\x1a\n":
        config, layers, weights, keras3 = _read_h5(path, budget)
        if config is None:
            return None
        cls = config.get("class_name", "")
    else:
        return None
    for layer, w in zip(layers, weights):
        for role, a in w.items():
            _check_size(path, f"{_layer_name(layer)}/{role}", a.shape, budget)
    return _topology(path, config, cls, layers, weights) + (keras3,)


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
                if name in g:
                    lg = g[name]
                    for wn in (_decode(n) for n in lg.attrs.get("weight_names", [])):
                        ds = lg[wn]
                        _check_size(path, wn, ds.shape, budget)  # before reading it
                        role = wn.split("/")[-1].split(":")[0]
                        found[role] = np.asarray(ds[()])
                weights.append(found)
    except InputError:
        raise
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: cannot read the Keras model config ({type(exc).__name__}: "
                         f"{exc})") from None
    except Exception as exc:  # noqa: BLE001 - HDF5 errors of a corrupt file
        raise InputError(f"{path}: cannot read HDF5 file ({type(exc).__name__}: {exc})") from None
    return config, layers, weights, version.startswith("3")


def _topology(path: str, config: dict, cls: str, layers: list, weights: list):
    """Layers with their inbound tensors, the inputs with their shapes, the outputs."""
    conf_all = config.get("config") or {}
    out_layers: List[KerasLayer] = []
    if cls == "Sequential":
        shape = None
        prev: Optional[str] = None
        for layer, w in zip(layers, weights):
            lcls = layer.get("class_name", "")
            conf = layer.get("config", {}) or {}
            name = conf.get("name") or layer.get("name") or ""
            if shape is None:
                shape = _shape_of(conf)
            if lcls == "InputLayer":
                continue
            if prev is None:
                prev = "__input__"
            out_layers.append(KerasLayer(name, lcls, conf, [(prev, 0, 0)], w))
            prev = name
        if shape is None:
            shape = conf_all.get("build_input_shape")
        if not out_layers:
            raise InputError(f"{path}: the Sequential model has no layers")
        return out_layers, [("__input__", shape)], [(prev, 0, 0)]
    if cls not in ("Functional", "Model"):
        raise InputError(f"{path}: the model is a {cls or 'unknown class'}; expected a "
                         "Sequential or functional model")
    inputs = []
    by_name = {}
    for layer, w in zip(layers, weights):
        lcls = layer.get("class_name", "")
        conf = layer.get("config", {}) or {}
        name = conf.get("name") or layer.get("name") or ""
        by_name[name] = (lcls, conf)
        if lcls == "InputLayer":
            continue
        out_layers.append(KerasLayer(name, lcls, conf, _inbound(path, layer, name), w))
    for name, _, _ in _refs(conf_all.get("input_layers")):
        lcls, conf = by_name.get(name, ("", {}))
        if lcls != "InputLayer":
            raise InputError(f"{path}: model input '{name}' is not an InputLayer")
        inputs.append((name, _shape_of(conf)))
    outputs = _refs(conf_all.get("output_layers"))
    if not inputs or not outputs:
        raise InputError(f"{path}: the functional model config lists no input_layers or "
                         "output_layers")
    return out_layers, inputs, outputs


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
