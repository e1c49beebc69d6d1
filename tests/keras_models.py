"""Keras convolutional models written without Keras, in the layouts Keras writes
(tests/test_keras_graphs.py, tests/test_graph_api.py), and an independent numpy forward pass.

A model is a list of :class:`L` (class name, config, the layers it reads, weights by role).
:func:`save_h5` writes Keras 2's ``model.save('m.h5')`` layout (the ``model_config`` JSON
attribute; ``model_weights/<layer>`` with ``weight_names`` and datasets
``<layer>/<layer>/kernel:0``), :func:`save_keras3` Keras 3's ``.keras`` zip (``config.json``
with ``__keras_tensor__`` inbound nodes, ``metadata.json``, ``model.weights.h5`` with
``layers/<snake-case class key>/vars/0, 1, ...``), as in the real files of
tests/fixtures/keras and tests/fixtures/keras3. :func:`reference` computes the model in
float64 straight from its layer list, channels-last, convolutions and pools by loops over
output positions (no code shared with crown's graph).
"""
from __future__ import annotations

import io
import json
import re
import zipfile

import h5py
import numpy as np

ROLES = {"Dense": ["kernel", "bias"], "Conv2D": ["kernel", "bias"], "Conv1D": ["kernel", "bias"],
         "Conv2DTranspose": ["kernel", "bias"], "PReLU": ["alpha"],
         "DepthwiseConv2D": ["depthwise_kernel", "bias"],
         "SeparableConv2D": ["depthwise_kernel", "pointwise_kernel", "bias"],
         "Normalization": ["mean", "variance", "count"],
         "BatchNormalization": ["gamma", "beta", "moving_mean", "moving_variance"]}


class L:
    def __init__(self, cls, name, inputs=(), weights=None, **config):
        self.cls, self.name, self.inputs = cls, name, list(inputs)
        self.weights = weights or {}
        self.config = dict(config, name=name)


# -- the reference forward pass (channels-last, batch of one) -------------------------------

def _act(name, z, alpha=None):
    if name in (None, "linear"):
        return z
    if name == "relu":
        return np.maximum(z, 0)
    if name == "tanh":
        return np.tanh(z)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-z))
    if name == "leaky_relu":
        return np.where(z > 0, z, alpha * z)
    if name == "softmax":
        e = np.exp(z - z.max())
        return e / e.sum()
    if name == "gelu":  # Keras' default, approximate=False
        from scipy.special import erf
        return 0.5 * z * (1 + erf(z / np.sqrt(2)))
    if name in ("swish", "silu"):
        return z / (1 + np.exp(-z))
    if name == "mish":
        return z * np.tanh(np.log1p(np.exp(z)))
    if name in ("hard_swish", "hard_silu"):
        return z * np.clip(z + 3, 0, 6) / 6
    if name == "relu6":
        return np.clip(z, 0, 6)
    raise ValueError(name)


def _pads(n, k, s, d, same):
    if not same:
        return 0, 0
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2


def _conv(x, K, bias, strides, same, dil, groups):
    H, W, C = x.shape
    kh, kw, cg, O = K.shape
    (pt, pb), (pl, pr) = _pads(H, kh, strides[0], dil[0], same), _pads(W, kw, strides[1], dil[1], same)
    xp = np.zeros((H + pt + pb, W + pl + pr, C))
    xp[pt:pt + H, pl:pl + W] = x
    OH = (xp.shape[0] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    OW = (xp.shape[1] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((OH, OW, O))
    og = O // groups
    for i in range(OH):
        for j in range(OW):
            for o in range(O):
                g = o // og
                acc = 0.0
                for a in range(kh):
                    for c in range(kw):
                        pix = xp[i * strides[0] + a * dil[0], j * strides[1] + c * dil[1],
                                 g * cg:(g + 1) * cg]
                        acc += float(np.dot(pix, K[a, c, :, o]))
                out[i, j, o] = acc + (0.0 if bias is None else bias[o])
    return out


def _deconv_length(n, k, s, d, same, output_padding):
    """Keras' ``deconv_output_length``."""
    k = k + (k - 1) * (d - 1)
    if output_padding is None:
        return n * s + (0 if same else max(k - s, 0))
    return (n - 1) * s + k - 2 * (k // 2 if same else 0) + output_padding


def _conv_transpose(x, K, bias, strides, same, dil, output_padding):
    """TensorFlow's conv2d_transpose: every input pixel's products spread into the full output
    ((n - 1) s + k), then TensorFlow's SAME placement: the excess over Keras' output length
    cut off half (rounded down) at the start, the rest at the end; a shortfall zeros at the
    end."""
    H, W, C = x.shape
    kh, kw, F, _ = K.shape
    full = [(H - 1) * strides[0] + (kh - 1) * dil[0] + 1, (W - 1) * strides[1] + (kw - 1) * dil[1] + 1]
    y = np.zeros((full[0], full[1], F))
    for i in range(H):
        for j in range(W):
            for a in range(kh):
                for c in range(kw):
                    y[i * strides[0] + a * dil[0], j * strides[1] + c * dil[1]] += K[a, c] @ x[i, j]
    op = [None, None] if output_padding is None else _two(output_padding)
    out = [_deconv_length(n, k, st, dl, same, o)
           for n, k, st, dl, o in ((H, kh, strides[0], dil[0], op[0]), (W, kw, strides[1], dil[1], op[1]))]
    res = np.zeros((out[0], out[1], F))
    start = [max(f - o, 0) // 2 for f, o in zip(full, out)]
    part = y[start[0]:start[0] + out[0], start[1]:start[1] + out[1]]
    res[:part.shape[0], :part.shape[1]] = part
    return res + (0.0 if bias is None else bias)


def _pool(x, size, strides, same, kind):
    H, W, C = x.shape
    (pt, pb), (pl, pr) = _pads(H, size[0], strides[0], 1, same), _pads(W, size[1], strides[1], 1, same)
    OH = (H + pt + pb - size[0]) // strides[0] + 1
    OW = (W + pl + pr - size[1]) // strides[1] + 1
    out = np.zeros((OH, OW, C))
    for i in range(OH):
        for j in range(OW):
            r0, c0 = i * strides[0] - pt, j * strides[1] - pl
            win = x[max(r0, 0):min(r0 + size[0], H), max(c0, 0):min(c0 + size[1], W)]
            out[i, j] = win.max(axis=(0, 1)) if kind == "max" else win.mean(axis=(0, 1))
    return out


def _two(v):
    return [v, v] if isinstance(v, int) else list(v)


def reference(layers, inputs, outputs, xs, drop_output_act=False):
    """Outputs (the model's outputs concatenated, flat) for each flat input vector of xs;
    ``inputs`` {name: shape}. ``drop_output_act``: leave the activation of each output
    layer out (crown certifies the logits before a softmax)."""
    rows = []
    for x in np.atleast_2d(xs):
        vals, off = {}, 0
        for name, shape in inputs.items():
            n = int(np.prod(shape))
            vals[name] = np.asarray(x[off:off + n], np.float64).reshape(shape)
            off += n
        for l in layers:
            if l.cls == "InputLayer":
                continue
            ins = [vals[i] for i in l.inputs]
            c, w = l.config, l.weights
            act = c.get("activation")
            if drop_output_act and l.name in outputs:
                act = None
            if l.cls == "Conv2D":
                y = _act(act, _conv(ins[0], w["kernel"], w.get("bias"), _two(c.get("strides", 1)),
                                    c.get("padding") == "same", _two(c.get("dilation_rate", 1)),
                                    c.get("groups", 1)))
            elif l.cls in ("DepthwiseConv2D", "SeparableConv2D"):
                # TensorFlow's depthwise order: output channel c * multiplier + m reads c
                K = w["depthwise_kernel"]
                kh, kw, C, dm = K.shape
                sep = l.cls == "SeparableConv2D"
                y = _conv(ins[0], K.reshape(kh, kw, 1, C * dm), None if sep else w.get("bias"),
                          _two(c.get("strides", 1)), c.get("padding") == "same",
                          _two(c.get("dilation_rate", 1)), C)
                if sep:  # then the pointwise 1 x 1 convolution, its bias
                    y = y @ w["pointwise_kernel"][0, 0] + w.get("bias", 0.0)
                y = _act(act, y)
            elif l.cls in ("GlobalAveragePooling2D", "GlobalMaxPooling2D"):
                fn = np.max if l.cls == "GlobalMaxPooling2D" else np.mean
                y = fn(ins[0], axis=(0, 1), keepdims=bool(c.get("keepdims", False)))
            elif l.cls == "Conv2DTranspose":
                y = _act(act, _conv_transpose(ins[0], w["kernel"], w.get("bias"),
                                              _two(c.get("strides", 1)), c.get("padding") == "same",
                                              _two(c.get("dilation_rate", 1)),
                                              c.get("output_padding")))
            elif l.cls == "PReLU":
                y = np.maximum(ins[0], 0) + w["alpha"] * np.minimum(ins[0], 0)
            elif l.cls == "Permute":
                y = ins[0].transpose([d - 1 for d in c["dims"]])
            elif l.cls == "Conv1D":  # a 2-D convolution of height 1; causal: zeros first
                pad = c.get("padding")
                seq = ins[0]
                k, dil = w["kernel"].shape[0], _two(c.get("dilation_rate", 1))[0]
                if pad == "causal":
                    seq = np.concatenate([np.zeros(((k - 1) * dil, seq.shape[1])), seq])
                y = _conv(seq[None], w["kernel"][None], w.get("bias"),
                          [1, _two(c.get("strides", 1))[0]], pad == "same", [1, dil],
                          c.get("groups", 1))[0]
                y = _act(act, y)
            elif l.cls in ("MaxPooling1D", "AveragePooling1D"):
                p = _two(c["pool_size"])[0]
                st = _two(c.get("strides") or p)[0]
                y = _pool(ins[0][None], [1, p], [1, st], c.get("padding") == "same",
                          "max" if l.cls == "MaxPooling1D" else "avg")[0]
            elif l.cls in ("GlobalAveragePooling1D", "GlobalMaxPooling1D"):
                fn = np.max if l.cls == "GlobalMaxPooling1D" else np.mean
                y = fn(ins[0], axis=0, keepdims=bool(c.get("keepdims", False)))
            elif l.cls == "ZeroPadding1D":
                y = np.pad(ins[0], (tuple(c["padding"]), (0, 0)))
            elif l.cls == "Cropping1D":
                lo, hi = c["cropping"]
                y = ins[0][lo:ins[0].shape[0] - hi]
            elif l.cls == "UpSampling1D":
                y = np.repeat(ins[0], c.get("size", 2), axis=0)
            elif l.cls in ("Multiply", "Maximum", "Minimum"):
                fn = {"Multiply": np.multiply, "Maximum": np.maximum, "Minimum": np.minimum}[l.cls]
                y = ins[0]
                for v in ins[1:]:
                    y = fn(y, v)  # numpy's broadcasting, Keras' (without the batch axis)
            elif l.cls == "Normalization":
                mean = w.get("mean", c.get("mean"))
                var = w.get("variance", c.get("variance"))
                y = (ins[0] - np.asarray(mean)) / np.maximum(np.sqrt(np.asarray(var)), 1e-7)
            elif l.cls == "Rescaling":
                y = ins[0] * np.asarray(c["scale"]) + np.asarray(c.get("offset", 0.0))
            elif l.cls == "UpSampling2D":
                sh, sw = _two(c.get("size", 2))
                y = np.repeat(np.repeat(ins[0], sh, axis=0), sw, axis=1)
            elif l.cls == "Cropping2D":
                (t, b_), (lf, r) = c["cropping"]
                y = ins[0][t:ins[0].shape[0] - b_, lf:ins[0].shape[1] - r]
            elif l.cls == "Dense":
                y = _act(act, ins[0] @ w["kernel"] + w.get("bias", 0.0))
            elif l.cls == "BatchNormalization":
                y = (ins[0] - w["moving_mean"]) / np.sqrt(w["moving_variance"] + c["epsilon"]) \
                    * w["gamma"] + w["beta"]
            elif l.cls in ("MaxPooling2D", "AveragePooling2D"):
                size = _two(c["pool_size"])
                y = _pool(ins[0], size, _two(c.get("strides") or size), c.get("padding") == "same",
                          "max" if l.cls == "MaxPooling2D" else "avg")
            elif l.cls == "Flatten":
                y = ins[0].reshape(-1)
            elif l.cls == "Reshape":
                y = ins[0].reshape(c["target_shape"])
            elif l.cls == "Add":
                y = sum(ins)
            elif l.cls == "Subtract":
                y = ins[0] - ins[1]
            elif l.cls == "Average":
                y = sum(ins) / len(ins)
            elif l.cls == "ZeroPadding2D":
                (t, b_), (lf, r) = c["padding"]
                y = np.pad(ins[0], ((t, b_), (lf, r), (0, 0)))
            elif l.cls == "Concatenate":
                y = np.concatenate(ins, axis=c.get("axis", -1) - 1 if c.get("axis", -1) > 0 else -1)
            elif l.cls == "Activation":
                y = _act(None if l.name in outputs and drop_output_act else act, ins[0])
            elif l.cls == "ReLU":
                y = np.maximum(ins[0], 0)
                if c.get("max_value") is not None:
                    y = np.minimum(y, c["max_value"])
            elif l.cls == "LeakyReLU":
                y = _act("leaky_relu", ins[0], c.get("negative_slope", c.get("alpha")))
            elif l.cls == "Dropout":
                y = ins[0]
            else:
                raise ValueError(l.cls)
            vals[l.name] = y
        rows.append(np.concatenate([vals[o].reshape(-1) for o in outputs]))
    return np.array(rows)


# -- writers -------------------------------------------------------------------------------

def _shape_rules(layers, inputs):
    shapes = {k: tuple(v) for k, v in inputs.items()}
    for l in layers:
        if l.cls == "InputLayer":
            continue
        c = l.config
        s = [shapes[i] for i in l.inputs]
        if l.cls == "Conv2D":
            H, W, _ = s[0]
            kh, kw, _, O = l.weights["kernel"].shape
            st, dl = _two(c.get("strides", 1)), _two(c.get("dilation_rate", 1))
            same = c.get("padding") == "same"
            dims = []
            for n, k, a, d in ((H, kh, st[0], dl[0]), (W, kw, st[1], dl[1])):
                p = sum(_pads(n, k, a, d, same))
                dims.append((n + p - d * (k - 1) - 1) // a + 1)
            shapes[l.name] = (dims[0], dims[1], O)
        elif l.cls in ("MaxPooling2D", "AveragePooling2D"):
            H, W, C = s[0]
            size = _two(c["pool_size"])
            st = _two(c.get("strides") or size)
            same = c.get("padding") == "same"
            dims = [(n + sum(_pads(n, k, a, 1, same)) - k) // a + 1
                    for n, k, a in ((H, size[0], st[0]), (W, size[1], st[1]))]
            shapes[l.name] = (dims[0], dims[1], C)
        elif l.cls in ("DepthwiseConv2D", "SeparableConv2D"):
            H, W, C = s[0]
            kh, kw, _, dm = l.weights["depthwise_kernel"].shape
            st, dl = _two(c.get("strides", 1)), _two(c.get("dilation_rate", 1))
            same = c.get("padding") == "same"
            dims = [(n + sum(_pads(n, k, a, d, same)) - d * (k - 1) - 1) // a + 1
                    for n, k, a, d in ((H, kh, st[0], dl[0]), (W, kw, st[1], dl[1]))]
            out = c["filters"] if l.cls == "SeparableConv2D" else C * dm
            shapes[l.name] = (dims[0], dims[1], out)
        elif l.cls in ("GlobalAveragePooling2D", "GlobalMaxPooling2D"):
            shapes[l.name] = (1, 1, s[0][2]) if c.get("keepdims") else (s[0][2],)
        elif l.cls == "UpSampling2D":
            sh, sw = _two(c.get("size", 2))
            shapes[l.name] = (s[0][0] * sh, s[0][1] * sw, s[0][2])
        elif l.cls == "Cropping2D":
            (t, b_), (lf, r) = c["cropping"]
            shapes[l.name] = (s[0][0] - t - b_, s[0][1] - lf - r, s[0][2])
        elif l.cls == "Conv2DTranspose":
            H, W, _ = s[0]
            kh, kw, F, _ = l.weights["kernel"].shape
            st, dl = _two(c.get("strides", 1)), _two(c.get("dilation_rate", 1))
            op = c.get("output_padding")
            op = [None, None] if op is None else _two(op)
            shapes[l.name] = (_deconv_length(H, kh, st[0], dl[0], c.get("padding") == "same", op[0]),
                              _deconv_length(W, kw, st[1], dl[1], c.get("padding") == "same", op[1]), F)
        elif l.cls == "Permute":
            shapes[l.name] = tuple(s[0][d - 1] for d in c["dims"])
        elif l.cls == "Conv1D":
            n, k = s[0][0], l.weights["kernel"].shape[0]
            st, dl = _two(c.get("strides", 1))[0], _two(c.get("dilation_rate", 1))[0]
            pad = c.get("padding")
            p = (k - 1) * dl if pad == "causal" else sum(_pads(n, k, st, dl, pad == "same"))
            shapes[l.name] = ((n + p - dl * (k - 1) - 1) // st + 1, l.weights["kernel"].shape[2])
        elif l.cls in ("MaxPooling1D", "AveragePooling1D"):
            n, p = s[0][0], _two(c["pool_size"])[0]
            st = _two(c.get("strides") or p)[0]
            shapes[l.name] = ((n + sum(_pads(n, p, st, 1, c.get("padding") == "same")) - p)
                              // st + 1, s[0][1])
        elif l.cls in ("GlobalAveragePooling1D", "GlobalMaxPooling1D"):
            shapes[l.name] = (1, s[0][1]) if c.get("keepdims") else (s[0][1],)
        elif l.cls == "ZeroPadding1D":
            shapes[l.name] = (s[0][0] + sum(c["padding"]), s[0][1])
        elif l.cls == "Cropping1D":
            shapes[l.name] = (s[0][0] - sum(c["cropping"]), s[0][1])
        elif l.cls == "UpSampling1D":
            shapes[l.name] = (s[0][0] * c.get("size", 2), s[0][1])
        elif l.cls in ("Multiply", "Maximum", "Minimum"):
            try:
                shapes[l.name] = tuple(np.broadcast_shapes(*s))
            except ValueError:  # (a file crown must refuse)
                shapes[l.name] = s[0]
        elif l.cls == "Dense":
            shapes[l.name] = s[0][:-1] + (l.weights["kernel"].shape[1],)
        elif l.cls == "Flatten":
            shapes[l.name] = (int(np.prod(s[0])),)
        elif l.cls == "ZeroPadding2D":
            (t, b_), (lf, r) = c["padding"]
            shapes[l.name] = (s[0][0] + t + b_, s[0][1] + lf + r, s[0][2])
        elif l.cls == "Reshape":
            shapes[l.name] = tuple(c["target_shape"])
        elif l.cls == "Concatenate":
            ax = c.get("axis", -1)
            ax = ax - 1 if ax > 0 else len(s[0]) + ax
            out = list(s[0])
            out[ax] = sum(t[ax] for t in s)
            shapes[l.name] = tuple(out)
        else:
            shapes[l.name] = s[0]
    return shapes


def _weight_list(l):
    roles = ROLES.get(l.cls, [])
    return [(r, np.asarray(l.weights[r], np.float32)) for r in roles if r in l.weights]


def save_h5(path, layers, inputs, outputs, sequential=False, version="2.15.0"):
    """Keras 2 ``model.save('m.h5')``: functional (``input_layers``, ``output_layers``,
    ``inbound_nodes`` as [[[layer, 0, 0, {}], ...]]) or Sequential (an InputLayer first)."""
    cfg_layers = []
    for l in layers:
        entry = {"class_name": l.cls, "config": dict(l.config)}
        if l.cls == "InputLayer":
            entry["config"]["batch_input_shape"] = [None] + list(inputs[l.name])
            entry["config"]["dtype"] = "float32"
        if not sequential:
            entry["name"] = l.name
            entry["inbound_nodes"] = [] if l.cls == "InputLayer" else \
                [[[src, 0, 0, {}] for src in l.inputs]]
        cfg_layers.append(entry)
    config = {"name": "model", "layers": cfg_layers}
    if not sequential:
        config["input_layers"] = [[n, 0, 0] for n in inputs]
        config["output_layers"] = [[n, 0, 0] for n in outputs]
    model_config = {"class_name": "Sequential" if sequential else "Functional", "config": config}
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = version
        f.attrs["backend"] = "tensorflow"
        f.attrs["model_config"] = json.dumps(model_config)
        g = f.create_group("model_weights")
        names = [l.name for l in layers if not (sequential and l.cls == "InputLayer")]
        g.attrs["layer_names"] = np.array([n.encode() for n in names])
        g.attrs["backend"] = "tensorflow"
        g.attrs["keras_version"] = version
        for l in layers:
            if l.name not in names:
                continue
            lg = g.create_group(l.name)
            ws = _weight_list(l)
            lg.attrs["weight_names"] = np.array([f"{l.name}/{r}:0".encode() for r, _ in ws])
            for r, a in ws:
                lg.create_dataset(f"{l.name}/{r}:0", data=a)


def _snake(name):
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def save_keras3(path, layers, inputs, outputs, sequential=False):
    """Keras 3 ``model.save('m.keras')``: config.json (functional: ``inbound_nodes`` as
    [{"args": [tensor or [tensors]], "kwargs": {}}] of ``__keras_tensor__`` dicts),
    metadata.json, model.weights.h5 (``layers/<key>/vars/<i>``, ``vars`` named)."""
    shapes = _shape_rules(layers, inputs)

    def tensor(src):
        return {"class_name": "__keras_tensor__",
                "config": {"shape": [None] + list(shapes[src]), "dtype": "float32",
                           "keras_history": [src, 0, 0]}}

    cfg_layers = []
    for l in layers:
        conf = dict(l.config)
        if l.cls == "InputLayer":
            conf.update(batch_shape=[None] + list(inputs[l.name]), dtype="float32",
                        sparse=False, ragged=False, optional=False)
        entry = {"module": "keras.layers", "class_name": l.cls, "config": conf,
                 "registered_name": None}
        if not sequential:
            entry["name"] = l.name
            if l.cls == "InputLayer":
                entry["inbound_nodes"] = []
            else:
                args = [tensor(s) for s in l.inputs]
                entry["inbound_nodes"] = [{"args": [args] if len(args) > 1 else args,
                                           "kwargs": {}}]
        cfg_layers.append(entry)
    config = {"name": "model", "trainable": True, "layers": cfg_layers}
    if not sequential:
        refs = lambda names: [[n, 0, 0] for n in names] if len(names) > 1 else [names[0], 0, 0]  # noqa: E731
        config["input_layers"] = refs(list(inputs))
        config["output_layers"] = refs(list(outputs))
    cls = "Sequential" if sequential else "Functional"
    model = {"module": "keras.src.models." + cls.lower(), "class_name": cls, "config": config,
             "registered_name": None}
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        top = f.create_group("layers")
        used = {}
        for l in layers:
            if sequential and l.cls == "InputLayer":
                continue
            base = _snake(l.cls)
            used[base] = used.get(base, -1) + 1
            key = base if used[base] == 0 else f"{base}_{used[base]}"
            vg = top.create_group(key).create_group("vars")
            vg.attrs["name"] = l.name
            for i, (_, a) in enumerate(_weight_list(l)):
                vg.create_dataset(str(i), data=a)
        f.create_group("vars").attrs["name"] = "model"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": "3.6.0",
                                                 "date_saved": "2026-01-01@00:00:00"}))
        zf.writestr("config.json", json.dumps(model))
        zf.writestr("model.weights.h5", buf.getvalue())


# -- models --------------------------------------------------------------------------------

def _w(rng, *shape, scale=0.5):
    """Weights that float32 stores exactly (the files hold float32)."""
    return rng.normal(0.0, scale, size=shape).astype(np.float32).astype(np.float64)


def _bn(rng, name, src, c):
    return L("BatchNormalization", name, [src], axis=-1, epsilon=1e-3, weights={
        "gamma": _f32(1.0 + _w(rng, c, scale=0.2)), "beta": _w(rng, c, scale=0.2),
        "moving_mean": _w(rng, c, scale=0.2), "moving_variance": _f32(1.0 + np.abs(_w(rng, c)))})


def _f32(a):
    return np.asarray(a, np.float32).astype(np.float64)


def branched(rng):
    """A functional conv net with every layer kind: (layers, {input: shape}, [outputs])."""
    x = "image"
    layers = [
        L("InputLayer", x),
        L("Conv2D", "c1", [x], filters=4, kernel_size=[3, 3], strides=[1, 1], padding="same",
          activation="relu", use_bias=True, dilation_rate=[1, 1],
          weights={"kernel": _w(rng, 3, 3, 2, 4), "bias": _w(rng, 4)}),
        _bn(rng, "bn1", "c1", 4),
        L("Conv2D", "skip", [x], filters=4, kernel_size=[1, 1], strides=[1, 1], padding="valid",
          activation="linear", use_bias=False, weights={"kernel": _w(rng, 1, 1, 2, 4)}),
        L("Add", "add", ["bn1", "skip"]),
        L("ReLU", "relu1", ["add"]),
        L("MaxPooling2D", "mp", ["relu1"], pool_size=[2, 2], strides=[2, 2], padding="same"),
        L("AveragePooling2D", "ap", ["relu1"], pool_size=[3, 3], strides=[2, 2], padding="same"),
        L("Concatenate", "cat", ["mp", "ap"], axis=-1),
        L("Conv2D", "cg", ["cat"], filters=4, kernel_size=[2, 2], strides=[1, 1], padding="valid",
          activation="tanh", use_bias=True, dilation_rate=[1, 1], groups=2,
          weights={"kernel": _w(rng, 2, 2, 4, 4), "bias": _w(rng, 4)}),
        L("Conv2D", "cd", ["cg"], filters=3, kernel_size=[2, 2], strides=[1, 1], padding="same",
          activation="linear", use_bias=True, dilation_rate=[2, 2],
          weights={"kernel": _w(rng, 2, 2, 4, 3), "bias": _w(rng, 3)}),
        L("LeakyReLU", "leaky", ["cd"], negative_slope=0.1),
        L("Flatten", "flat", ["leaky"]),
        L("Dense", "d1", ["flat"], units=6, activation="relu", use_bias=True,
          weights={"kernel": _w(rng, 27, 6), "bias": _w(rng, 6)}),
        L("Dropout", "drop", ["d1"], rate=0.5),
        L("Dense", "logits", ["drop"], units=3, activation="softmax", use_bias=True,
          weights={"kernel": _w(rng, 6, 3), "bias": _w(rng, 3)}),
    ]
    return layers, {x: (7, 7, 2)}, ["logits"]


def mnist_conv(rng):
    """A small Sequential conv net on 28x28x1 images (crown's shipped MNIST), 10 classes."""
    layers = [
        L("InputLayer", "input"),
        L("Conv2D", "conv", ["input"], filters=3, kernel_size=[5, 5], strides=[3, 3],
          padding="valid", activation="relu", use_bias=True, dilation_rate=[1, 1],
          weights={"kernel": _w(rng, 5, 5, 1, 3, scale=0.3), "bias": _w(rng, 3, scale=0.1)}),
        _bn(rng, "bn", "conv", 3),
        L("MaxPooling2D", "pool", ["bn"], pool_size=[2, 2], strides=[2, 2], padding="valid"),
        L("Flatten", "flatten", ["pool"]),
        L("Dense", "dense", ["flatten"], units=10, activation="softmax", use_bias=True,
          weights={"kernel": _w(rng, 48, 10, scale=0.3), "bias": _w(rng, 10, scale=0.1)}),
    ]
    return layers, {"input": (28, 28, 1)}, ["dense"]


def gated(rng):
    """Dense layers with Keras' graph-only activations: gelu, swish, mish, hard_silu, relu6,
    and a ReLU layer with max_value."""
    layers = [L("InputLayer", "v")]
    src, width = "v", 5
    for k, act in enumerate(("gelu", "swish", "mish", "hard_silu", "relu6")):
        layers.append(L("Dense", f"d{k}", [src], units=6, activation=act, use_bias=True,
                        weights={"kernel": _w(rng, width, 6, scale=3.0), "bias": _w(rng, 6)}))
        src, width = f"d{k}", 6
    layers.append(L("ReLU", "capped", [src], max_value=0.5))  # MobileNetV2's ReLU(6.)
    src = "capped"
    layers.append(L("Dense", "out", [src], units=3, activation="linear", use_bias=True,
                    weights={"kernel": _w(rng, 6, 3), "bias": _w(rng, 3)}))
    return layers, {"v": (5,)}, ["out"]


def reshaped(rng):
    """Features reshaped to an image: Dense -> Reshape -> Dense on the channels (a 1x1
    convolution) -> Conv2D -> Flatten -> Dense; a BatchNormalization on features."""
    layers = [
        L("InputLayer", "v"),
        L("Dense", "d0", ["v"], units=16, activation="relu", use_bias=True,
          weights={"kernel": _w(rng, 12, 16), "bias": _w(rng, 16)}),
        L("Reshape", "img", ["d0"], target_shape=[2, 2, 4]),
        L("Dense", "mix", ["img"], units=5, activation="sigmoid", use_bias=True,
          weights={"kernel": _w(rng, 4, 5), "bias": _w(rng, 5)}),
        L("Conv2D", "c", ["mix"], filters=2, kernel_size=[2, 2], strides=[1, 1], padding="valid",
          activation="linear", use_bias=True, dilation_rate=[1, 1],
          weights={"kernel": _w(rng, 2, 2, 5, 2), "bias": _w(rng, 2)}),
        L("Flatten", "f", ["c"]),
        _bn(rng, "bnf", "f", 2),
        L("Activation", "act", ["bnf"], activation="tanh"),
        L("Dense", "out", ["act"], units=3, activation="linear", use_bias=True,
          weights={"kernel": _w(rng, 2, 3), "bias": _w(rng, 3)}),
    ]
    return layers, {"v": (12,)}, ["out"]


def merges(rng):
    """Two inputs (an image and a vector), ZeroPadding2D, Subtract, Average, Concatenate on
    features, two outputs."""
    layers = [
        L("InputLayer", "img"), L("InputLayer", "vec"),
        L("ZeroPadding2D", "pad", ["img"], padding=[[1, 0], [0, 2]]),
        L("Conv2D", "ca", ["pad"], filters=2, kernel_size=[2, 2], strides=[2, 1], padding="valid",
          activation="relu", use_bias=True, dilation_rate=[1, 1],
          weights={"kernel": _w(rng, 2, 2, 1, 2), "bias": _w(rng, 2)}),
        L("Conv2D", "cb", ["pad"], filters=2, kernel_size=[2, 2], strides=[2, 1], padding="valid",
          activation="linear", use_bias=False, dilation_rate=[1, 1],
          weights={"kernel": _w(rng, 2, 2, 1, 2)}),
        L("Subtract", "sub", ["ca", "cb"]),
        L("Average", "avg", ["ca", "cb", "sub"]),
        L("Flatten", "flat", ["avg"]),
        L("Dense", "dv", ["vec"], units=3, activation="tanh", use_bias=True,
          weights={"kernel": _w(rng, 4, 3), "bias": _w(rng, 3)}),
        L("Concatenate", "cat", ["flat", "dv"], axis=-1),
        L("Dense", "o1", ["cat"], units=2, activation="linear", use_bias=True,
          weights={"kernel": _w(rng, 23, 2), "bias": _w(rng, 2)}),
        L("Dense", "o2", ["dv"], units=2, activation="sigmoid", use_bias=True,
          weights={"kernel": _w(rng, 3, 2), "bias": _w(rng, 2)}),
    ]
    return layers, {"img": (3, 4, 1), "vec": (4,)}, ["o1", "o2"]


def mobile(rng):
    """The layers of MobileNet-style and Keras-tutorial models: Rescaling (per channel and
    plain), DepthwiseConv2D (depth multiplier 2, strides, same padding), SeparableConv2D,
    UpSampling2D, Cropping2D, GlobalAveragePooling2D (and with keepdims), GlobalMaxPooling2D."""
    x = "image"
    layers = [
        L("InputLayer", x),
        L("Rescaling", "scale", [x], scale=[0.5, -0.25], offset=[0.1, 0.0]),
        L("DepthwiseConv2D", "dw", ["scale"], kernel_size=[3, 3], strides=[2, 2],
          padding="same", depth_multiplier=2, activation="relu", use_bias=True,
          dilation_rate=[1, 1], weights={"depthwise_kernel": _w(rng, 3, 3, 2, 2),
                                         "bias": _w(rng, 4)}),
        L("SeparableConv2D", "sep", ["dw"], filters=3, kernel_size=[2, 2], strides=[1, 1],
          padding="valid", depth_multiplier=1, activation="linear", use_bias=True,
          dilation_rate=[1, 1], weights={"depthwise_kernel": _w(rng, 2, 2, 4, 1),
                                         "pointwise_kernel": _w(rng, 1, 1, 4, 3),
                                         "bias": _w(rng, 3)}),
        L("ReLU", "r", ["sep"]),
        L("UpSampling2D", "up", ["r"], size=[2, 3], interpolation="nearest"),
        L("Cropping2D", "crop", ["up"], cropping=[[1, 0], [2, 1]]),
        L("GlobalAveragePooling2D", "gap", ["crop"], keepdims=False),
        L("GlobalMaxPooling2D", "gmp", ["crop"], keepdims=False),
        L("GlobalAveragePooling2D", "gapk", ["r"], keepdims=True),
        L("Flatten", "fk", ["gapk"]),
        L("Concatenate", "cat", ["gap", "gmp", "fk"], axis=-1),
        L("Rescaling", "half", ["cat"], scale=0.5, offset=0.0),
        L("Dense", "out", ["half"], units=3, activation="softmax", use_bias=True,
          weights={"kernel": _w(rng, 9, 3), "bias": _w(rng, 3)}),
    ]
    return layers, {x: (8, 7, 2)}, ["out"]


def tutorial(rng):
    """A Sequential image classifier as Keras' tutorials write it: Rescaling(1 / 255) first,
    convolutions, SeparableConv2D, GlobalAveragePooling2D, Dense."""
    layers = [
        L("InputLayer", "input"),
        L("Rescaling", "rescale", ["input"], scale=1.0 / 255.0, offset=0.0),
        L("Conv2D", "c1", ["rescale"], filters=4, kernel_size=[3, 3], strides=[2, 2],
          padding="same", activation="relu", use_bias=True, dilation_rate=[1, 1],
          weights={"kernel": _w(rng, 3, 3, 3, 4), "bias": _w(rng, 4, scale=0.1)}),
        L("DepthwiseConv2D", "dw", ["c1"], kernel_size=[3, 3], strides=[1, 1], padding="valid",
          depth_multiplier=1, activation="relu6", use_bias=False, dilation_rate=[1, 1],
          weights={"depthwise_kernel": _w(rng, 3, 3, 4, 1)}),
        L("SeparableConv2D", "sep", ["dw"], filters=5, kernel_size=[3, 3], strides=[1, 1],
          padding="same", depth_multiplier=2, activation="relu", use_bias=True,
          dilation_rate=[1, 1], weights={"depthwise_kernel": _w(rng, 3, 3, 4, 2),
                                         "pointwise_kernel": _w(rng, 1, 1, 8, 5),
                                         "bias": _w(rng, 5)}),
        L("GlobalAveragePooling2D", "gap", ["sep"], keepdims=False),
        L("Dense", "logits", ["gap"], units=4, activation="linear", use_bias=True,
          weights={"kernel": _w(rng, 5, 4), "bias": _w(rng, 4)}),
    ]
    return layers, {"input": (9, 10, 3)}, ["logits"]


def efficient(rng):
    """EfficientNet's layers: Rescaling, an adapted Normalization, swish convolutions, a
    squeeze-and-excitation block (GlobalAveragePooling2D with keepdims, 1x1 convolutions,
    Multiply of (1, 1, C) by (H, W, C)), a Multiply of (C,) by (H, W, C) (ranks differ), Add,
    Maximum and Minimum of data."""
    x = "image"
    conv = lambda name, src, k, cin, cout, act, **kw: L(  # noqa: E731
        "Conv2D", name, [src], filters=cout, kernel_size=[k, k], strides=[1, 1],
        padding=kw.get("padding", "same"), activation=act, use_bias=True, dilation_rate=[1, 1],
        weights={"kernel": _w(rng, k, k, cin, cout), "bias": _w(rng, cout, scale=0.2)})
    layers = [
        L("InputLayer", x),
        L("Rescaling", "rescale", [x], scale=0.5, offset=0.0),
        L("Normalization", "norm", ["rescale"], axis=-1, invert=False,
          weights={"mean": _w(rng, 3, scale=0.2), "variance": _f32(0.5 + np.abs(_w(rng, 3))),
                   "count": np.float32(100.0)}),
        conv("stem", "norm", 3, 3, 4, "swish"),
        L("DepthwiseConv2D", "dw", ["stem"], kernel_size=[3, 3], strides=[1, 1],
          padding="same", depth_multiplier=1, activation="swish", use_bias=True,
          dilation_rate=[1, 1], weights={"depthwise_kernel": _w(rng, 3, 3, 4, 1),
                                         "bias": _w(rng, 4, scale=0.2)}),
        L("GlobalAveragePooling2D", "squeeze", ["dw"], keepdims=True),
        conv("se_reduce", "squeeze", 1, 4, 2, "swish"),
        conv("se_expand", "se_reduce", 1, 2, 4, "sigmoid"),
        L("Multiply", "excite", ["dw", "se_expand"]),
        conv("project", "excite", 1, 4, 4, "linear"),
        L("Add", "residual", ["project", "stem"]),
        L("GlobalAveragePooling2D", "gate_vec", ["residual"], keepdims=False),
        L("Activation", "gate", ["gate_vec"], activation="sigmoid"),
        L("Multiply", "gated", ["residual", "gate"]),
        L("Maximum", "hi", ["gated", "project"]),
        L("Minimum", "lo", ["gated", "stem", "dw"]),
        L("Concatenate", "both", ["hi", "lo"], axis=-1),
        L("GlobalAveragePooling2D", "pool", ["both"], keepdims=False),
        L("Dense", "logits", ["pool"], units=3, activation="softmax", use_bias=True,
          weights={"kernel": _w(rng, 8, 3), "bias": _w(rng, 3)}),
    ]
    return layers, {x: (5, 6, 3)}, ["logits"]


def sequence(rng):
    """A 1-D convolutional model on a sequence (steps, channels): Conv1D (same, causal with
    dilation, valid with strides), MaxPooling1D, AveragePooling1D (same), ZeroPadding1D,
    Cropping1D, UpSampling1D, a BatchNormalization and a Dense on the sequence's channels,
    GlobalAveragePooling1D and GlobalMaxPooling1D (keepdims)."""
    x = "signal"

    def conv(name, src, k, cin, cout, act, **kw):
        return L("Conv1D", name, [src], filters=cout, kernel_size=[k], activation=act,
                 use_bias=True, strides=[kw.get("strides", 1)], padding=kw.get("padding", "same"),
                 dilation_rate=[kw.get("dilation", 1)], groups=1,
                 weights={"kernel": _w(rng, k, cin, cout), "bias": _w(rng, cout, scale=0.2)})

    layers = [
        L("InputLayer", x),
        conv("c1", x, 3, 3, 4, "relu"),
        conv("c2", "c1", 2, 4, 4, "tanh", padding="causal", dilation=2),
        L("MaxPooling1D", "mp", ["c2"], pool_size=[2], strides=[2], padding="valid"),
        L("AveragePooling1D", "ap", ["mp"], pool_size=[2], strides=[1], padding="same"),
        _bn(rng, "bn", "ap", 4),
        L("ZeroPadding1D", "zp", ["bn"], padding=[1, 2]),
        L("Cropping1D", "cr", ["zp"], cropping=[1, 0]),
        L("UpSampling1D", "up", ["cr"], size=2),
        conv("c3", "up", 3, 4, 3, "relu", padding="valid", strides=2),
        L("Dense", "mix", ["c3"], units=3, activation="sigmoid", use_bias=True,
          weights={"kernel": _w(rng, 3, 3), "bias": _w(rng, 3)}),
        L("GlobalAveragePooling1D", "gap", ["mix"], keepdims=False),
        L("GlobalMaxPooling1D", "gmp", ["c3"], keepdims=True),
        L("Flatten", "fl", ["gmp"]),
        L("Flatten", "fseq", ["mix"]),
        L("Concatenate", "cat", ["gap", "fl", "fseq"], axis=-1),
        L("Dense", "out", ["cat"], units=2, activation="linear", use_bias=True,
          weights={"kernel": _w(rng, 27, 2), "bias": _w(rng, 2)}),
    ]
    return layers, {x: (12, 3)}, ["out"]


def sequence_chain(rng):
    """A Sequential 1-D model as written for time series: Conv1D, MaxPooling1D, Conv1D
    (causal), GlobalAveragePooling1D, Dense."""
    layers = [
        L("InputLayer", "input"),
        L("Conv1D", "c1", ["input"], filters=5, kernel_size=[4], strides=[2], padding="valid",
          dilation_rate=[1], activation="relu", use_bias=True, groups=1,
          weights={"kernel": _w(rng, 4, 2, 5), "bias": _w(rng, 5, scale=0.2)}),
        L("MaxPooling1D", "mp", ["c1"], pool_size=[3], strides=[1], padding="same"),
        L("Conv1D", "c2", ["mp"], filters=3, kernel_size=[3], strides=[1], padding="causal",
          dilation_rate=[1], activation="relu", use_bias=False, groups=1,
          weights={"kernel": _w(rng, 3, 5, 3)}),
        L("GlobalAveragePooling1D", "gap", ["c2"]),
        L("Dense", "out", ["gap"], units=4, activation="softmax", use_bias=True,
          weights={"kernel": _w(rng, 3, 4), "bias": _w(rng, 4)}),
    ]
    return layers, {"input": (15, 2)}, ["out"]


def decoder(rng):
    """Conv2DTranspose (same with strides, valid with dilation, valid with output_padding,
    a 1x1 kernel under stride 2: zeros at the end), PReLU (shared over the image, and per
    element), Permute."""
    def convt(name, src, k, cin, cout, act, **kw):
        return L("Conv2DTranspose", name, [src], filters=cout, kernel_size=[k, k],
                 strides=kw.get("strides", [1, 1]), padding=kw.get("padding", "valid"),
                 output_padding=kw.get("output_padding"), dilation_rate=kw.get("dil", [1, 1]),
                 activation=act, use_bias=True,
                 weights={"kernel": _w(rng, k, k, cout, cin), "bias": _w(rng, cout, scale=0.2)})

    layers = [
        L("InputLayer", "z"),
        convt("t1", "z", 3, 2, 3, "linear", strides=[2, 2], padding="same"),
        L("PReLU", "p1", ["t1"], shared_axes=[1, 2],
          weights={"alpha": _w(rng, 1, 1, 3, scale=0.3)}),
        convt("t2", "p1", 2, 3, 2, "relu", dil=[2, 1]),
        convt("t3", "t2", 3, 2, 2, "tanh", strides=[2, 1], output_padding=[1, 0]),
        convt("t4", "t3", 1, 2, 2, "linear", strides=[2, 2]),
        L("Permute", "perm", ["t4"], dims=[2, 1, 3]),
        L("PReLU", "p2", ["perm"], weights={"alpha": _w(rng, 14, 36, 2, scale=0.5)}),
        L("Conv2D", "down", ["p2"], filters=2, kernel_size=[4, 4], strides=[4, 4],
          padding="valid", activation="relu", use_bias=True, dilation_rate=[1, 1],
          weights={"kernel": _w(rng, 4, 4, 2, 2), "bias": _w(rng, 2)}),
        L("Flatten", "f", ["down"]),
        L("Dense", "out", ["f"], units=3, activation="linear", use_bias=True,
          weights={"kernel": _w(rng, 54, 3), "bias": _w(rng, 3)}),
    ]
    return layers, {"z": (3, 2, 2)}, ["out"]
