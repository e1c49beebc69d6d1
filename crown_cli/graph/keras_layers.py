"""One handler per Keras layer class for :func:`crown_cli.graph.keras_graph.load_keras_graph`.

The graph is built with the ONNX loader's :class:`~crown_cli.graph.onnx_graph.Builder` (nodes,
index-map views, folding of scalings) and its ``Conv`` and pooling handlers. A Keras tensor is
held as a :class:`~crown_cli.graph.tensors.Data` view with a batch axis of 1; an image
tensor (Keras (1, H, W, C)) in channel-first order (1, C, H, W), every other tensor in Keras'
own order. ``handler(b, node, layer, ins)`` returns the layer's output view.
"""
from __future__ import annotations

from typing import List

import numpy as np

from crown_cli.errors import InputError
from crown_cli.graph import tensors as T
from crown_cli.graph.network import Graph
from crown_cli.graph.onnx_graph import Builder, _pruned
from crown_cli.graph.ops import ActivationOp, Dense, InputOp, Scale, Sum
from crown_cli.graph.tensors import Const, Data

# order-preserving output activations: dropped on a model output (the logits are certified)
DROPPED_OUTPUTS = ("softmax", "sigmoid", "tanh", "arctan")
# Keras activations that are graph nodes only (engine/relaxations/self_gated.py): gelu (Keras'
# default, approximate=False: the erf form), swish / silu, mish, hard_swish / hard_silu
# (Keras 3: z relu6(z + 3) / 6)
GRAPH_ACTIVATIONS = {"gelu": "gelu", "swish": "silu", "silu": "silu", "mish": "mish",
                     "hard_swish": "hardswish", "hard_silu": "hardswish"}
IDENTITY_LAYERS = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "GaussianNoise",
                   "GaussianDropout", "AlphaDropout", "ActivityRegularization",
                   # data augmentation (Keras' preprocessing layers): the identity outside
                   # training
                   "RandomFlip", "RandomRotation", "RandomZoom", "RandomTranslation",
                   "RandomContrast", "RandomBrightness",
                   "StochasticDepth")  # (ConvNeXt's: a residual branch dropped in training)


class KNode:
    """What the ONNX handlers need of a node: name, op_type (the ONNX operator the handler
    plays), input (tensor names); ``cls`` the Keras class for messages."""

    def __init__(self, name: str, cls: str, inputs: List[str], op_type: str = ""):
        self.name, self.cls, self.input, self.op_type = name, cls, inputs, op_type or cls


class KerasBuilder(Builder):
    def __init__(self, path: str, uses, outputs, keras3: bool):
        super().__init__(path, None, None, 0, uses)
        self.outputs, self.keras3 = outputs, keras3

    def fail(self, node, problem: str):
        raise InputError(f"{self.path}: layer '{node.name}' ({node.cls}): {problem}")


def to_keras(d: Data) -> Data:
    """A view in Keras' element order (an image back to channels-last)."""
    return T.view(d, lambda a: a.transpose(0, 2, 3, 1)) if len(d.shape) == 4 else d


def to_inner(d: Data) -> Data:
    """A view in Keras' element order in the builder's order (an image channel-first)."""
    return T.view(d, lambda a: a.transpose(0, 3, 1, 2)) if len(d.shape) == 4 else d


def _pair(v, what, b, node):
    v = [v, v] if isinstance(v, (int, float)) else list(v)
    if len(v) != 2:
        b.fail(node, f"{what} {v}: expected two values")
    return [int(a) for a in v]


def _channels_last(b, node, conf):
    fmt = conf.get("data_format") or "channels_last"
    if fmt != "channels_last":
        b.fail(node, f"data_format {fmt} is not supported (channels_last only)")


def _inner_axis(axis: int, rank: int) -> int:
    """A Keras axis (0 the batch) in the builder's order: an image's (H, W, C) is held
    (C, H, W)."""
    return {1: 2, 2: 3, 3: 1}.get(axis, axis) if rank == 4 else axis


def _image(b, node, d):
    if len(d.shape) != 4:
        b.fail(node, f"needs an image input (H, W, C), got shape {to_keras(d).shape[1:]}")


def _padding(b, node, conf, hw, kernel, strides, dil):
    """(top, left, bottom, right) of Keras' ``valid`` or ``same`` padding (TensorFlow's:
    the extra row or column at the bottom / right)."""
    mode = str(conf.get("padding", "valid")).lower()
    if mode == "valid":
        return [0, 0, 0, 0]
    if mode != "same":
        b.fail(node, f"padding '{mode}' is not supported (valid, same)")
    (t, bt), (left, r) = (_same(hw[ax], kernel[ax], strides[ax], dil[ax]) for ax in range(2))
    return [t, left, bt, r]


def _same(n, k, s, dil):
    """TensorFlow's ``same`` padding of one axis of n values, kernel k, stride s, dilation
    dil: (before, after), the extra one after."""
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * dil + 1 - n, 0)
    return total // 2, total - total // 2


def _weight(b, node, layer, role, required=True):
    w = layer.weights.get(role)
    if w is None and required:
        b.fail(node, f"no '{role}' weights in the file (found: "
                     f"{', '.join(layer.weights) or 'none'})")
    if w is not None:
        w = np.asarray(w, dtype=np.float64)
        if not np.all(np.isfinite(w)):
            b.fail(node, f"'{role}' contains NaN or infinite values")
    return w


def _activation_name(conf):
    from crown_cli.io.models import _raw_activation

    return _raw_activation(conf)


def _capped(b, node, d: Data, low: Data, top: float) -> Data:
    """``low - relu(d - top)``: an activation of d capped at ``top`` (Keras ReLU's
    ``max_value``, ``relu6``; exact, as ONNX Clip: graph/onnx_relu_forms.py)."""
    from crown_cli.graph import onnx_relu_forms as forms

    if not (np.isfinite(top) and top > 0.0):
        b.fail(node, f"max_value {top:g} is not supported (a positive number)")
    high = forms._relu(b, node, d, 1.0, -top, "relu_max")
    return forms._sum(b, node, [low, high], (1.0, -1.0), "capped")


def _activate(b, node, d: Data, act, alpha=None) -> Data:
    """``act`` applied to d: an activation node, nothing for linear, dropped on an output
    when it keeps the logits' order."""
    from crown_cli.io.models import normalize_activation

    if act is None or act == "linear":
        return d
    key = str(act).lower()
    if key in DROPPED_OUTPUTS + ("log_softmax",) and node.name in b.outputs \
            and b.uses.get(node.name, 0) == 1:
        nid = b.identity_of(d)
        if nid is not None:
            b.nodes[nid].folded.append(f"{key} (output, dropped: logits certified)")
        return d
    if key in ("softmax", "log_softmax"):
        b.fail(node, f"{key} is supported only on a model output (dropped there)")
    if key == "relu6":  # Keras 3: min(relu(z), 6)
        return _capped(b, node, d, _activate(b, node, d, "relu"), 6.0)
    name = GRAPH_ACTIVATIONS.get(key) or normalize_activation(key, f"{b.path}: layer "
                                                                   f"'{node.name}'")
    if name == "hard_sigmoid" and b.keras3 and alpha is None:
        alpha = 1.0 / 6.0  # Keras 3: relu6(z + 3) / 6
    if alpha is not None:
        from crown_cli.activations import param_ok, param_range

        if not param_ok(param_range(name, graph=True), alpha):
            b.fail(node, f"{name} parameter {alpha:g} is outside the range the bounds hold for")
    nid = b.node_of(d, node.name)
    return b.add(node.name, ActivationOp(name, alpha), (nid,), d.shape)


# -- layers with weights ---------------------------------------------------------------------

def _unpadded(b, d: Data):
    """(the node's own image, (top, left, bottom, right)) where ``d`` is a node's whole
    image (1, C, H, W) padded with zeros (a ZeroPadding2D before a convolution), else None:
    the convolution then pads it itself (no element move between them)."""
    if len(d.sources) != 1 or len(d.shape) != 4:
        return None
    src = d.sources[0]
    idx = d.idx[0]
    C = idx.shape[0]
    inside = np.argwhere(idx >= 0)
    if inside.size == 0:
        return None
    (_, t, left), (_, bottom, right) = inside.min(axis=0), inside.max(axis=0)
    H, W = int(bottom - t + 1), int(right - left + 1)
    core = idx[:, t:t + H, left:left + W]  # the source's every element, in its own order
    if C * H * W != b.nodes[src].size or \
            not np.array_equal(core.reshape(-1), np.arange(C * H * W)):
        return None
    shape = (1, C, H, W)
    border = np.ones(idx.shape, bool)
    border[:, t:t + H, left:left + W] = False
    consts = idx[border]  # every one a constant 0
    if np.any(consts >= 0) or np.any(d.table[-1 - consts] != 0.0):
        return None
    pads = [int(t), int(left), int(idx.shape[1] - t - H), int(idx.shape[2] - left - W)]
    return Data.of_node(src, shape), pads


def _fold_padding(b, d: Data, pads):
    """``d`` and the convolution's ``pads``, a zero padding of a node's image taken into
    them (:func:`_unpadded`)."""
    u = _unpadded(b, d)
    if u is None:
        return d, pads
    return u[0], [p + q for p, q in zip(pads, u[1])]


def _layer_bias(b, node, layer):
    """The layer's bias weight; None where it has none (``use_bias`` False, or no weight)."""
    if not layer.conf.get("use_bias", True):
        return None
    return _weight(b, node, layer, "bias", required=False)


def _conv_of(b, node, d, W, bias, attrs, name=None):
    """The ONNX handler's convolution of ``d`` by ``W`` (O, C / groups, kh, kw) plus ``bias``
    (None: none), its node named ``name`` (default the layer's)."""
    from crown_cli.graph.onnx_ops import _conv

    ins = [d, Const(W)] + ([Const(bias)] if bias is not None else [])
    return _conv(b, KNode(name or node.name, node.cls, node.input, "Conv"), ins, attrs)[0]


def _conv2d(b, node, layer, ins):
    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    K = _weight(b, node, layer, "kernel")
    if K.ndim != 4:
        b.fail(node, f"kernel of shape {K.shape}, expected (kh, kw, C / groups, filters)")
    bias = _layer_bias(b, node, layer)
    strides = _pair(conf.get("strides", 1), "strides", b, node)
    dil = _pair(conf.get("dilation_rate", 1), "dilation_rate", b, node)
    pads = _padding(b, node, conf, d.shape[2:], K.shape[:2], strides, dil)
    d, pads = _fold_padding(b, d, pads)
    W = K.transpose(3, 2, 0, 1)  # (kh, kw, C/g, O) -> (O, C/g, kh, kw)
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "group": int(conf.get("groups", 1))}
    out = _conv_of(b, node, d, W, bias, attrs)
    return _activate(b, node, out, _activation_name(conf))


# -- sequences (Keras (1, steps, C), held in Keras' order): 1-D layers run as 2-D ones on the
# image (1, C, 1, steps), their activation applied there, and the result viewed back

def _seq(b, node, d):
    if len(d.shape) != 3:
        b.fail(node, f"needs a sequence input (steps, C), got shape {to_keras(d).shape[1:]}")


def _seq_image(d: Data) -> Data:
    """A sequence (1, steps, C) as the image (1, C, 1, steps)."""
    return T.view(d, lambda a: a.transpose(0, 2, 1)[:, :, None, :])


def _image_seq(d: Data) -> Data:
    """An image (1, C, 1, steps) as the sequence (1, steps, C)."""
    return T.view(d, lambda a: a[:, :, 0, :].transpose(0, 2, 1))


def _one(v, what, b, node):
    v = [v] if isinstance(v, (int, float)) else list(v)
    if len(v) != 1:
        b.fail(node, f"{what} {v}: expected one value")
    return int(v[0])


def _padding1d(b, node, conf, n, k, s, dil, causal_ok=True):
    """(left, right) of Keras' 1-D ``valid``, ``same`` (TensorFlow's: the extra one at the
    right) or ``causal`` padding ((k - 1) dilation zeros on the left)."""
    mode = str(conf.get("padding", "valid")).lower()
    if mode == "causal" and causal_ok:
        return (k - 1) * dil, 0
    if mode == "valid":
        return 0, 0
    if mode != "same":
        b.fail(node, f"padding '{mode}' is not supported (valid, same"
                     f"{', causal' if causal_ok else ''})")
    return _same(n, k, s, dil)


def _conv1d(b, node, layer, ins):
    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _seq(b, node, d)
    K = _weight(b, node, layer, "kernel")
    if K.ndim != 3:
        b.fail(node, f"kernel of shape {K.shape}, expected (k, C / groups, filters)")
    bias = _layer_bias(b, node, layer)
    s = _one(conf.get("strides", 1), "strides", b, node)
    dil = _one(conf.get("dilation_rate", 1), "dilation_rate", b, node)
    left, right = _padding1d(b, node, conf, d.shape[1], K.shape[0], s, dil)
    attrs = {"strides": [1, s], "pads": [0, left, 0, right], "dilations": [1, dil],
             "group": int(conf.get("groups", 1))}
    W = K.transpose(2, 1, 0)[:, :, None, :]  # (k, C/g, F) -> (F, C/g, 1, k)
    out = _conv_of(b, node, _seq_image(d), W, bias, attrs)
    return _image_seq(_activate(b, node, out, _activation_name(conf)))


def _pool1d(b, node, layer, ins):
    from crown_cli.graph.onnx_ops import _pool as onnx_pool

    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _seq(b, node, d)
    p = _one(conf.get("pool_size", 2), "pool_size", b, node)
    s = conf.get("strides")
    s = p if s is None else _one(s, "strides", b, node)
    left, right = _padding1d(b, node, conf, d.shape[1], p, s, 1, causal_ok=False)
    op = "MaxPool" if layer.cls == "MaxPooling1D" else "AveragePool"
    attrs = {"kernel_shape": [1, p], "strides": [1, s], "pads": [0, left, 0, right],
             "count_include_pad": 0}
    return _image_seq(onnx_pool(b, KNode(node.name, node.cls, node.input, op),
                                [_seq_image(d)], attrs)[0])


def _global_pool1d(b, node, layer, ins):
    from crown_cli.graph.onnx_ops import _global_pool as onnx_global

    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _seq(b, node, d)
    op = "GlobalMaxPool" if layer.cls == "GlobalMaxPooling1D" else "GlobalAveragePool"
    out = onnx_global(b, KNode(node.name, node.cls, node.input, op), [_seq_image(d)], {})[0]
    return _image_seq(out) if conf.get("keepdims", False) else \
        T.view(out, lambda a: a.reshape(1, -1))


def _moves1d(b, node, layer, ins):
    """ZeroPadding1D, Cropping1D, UpSampling1D: moves of a sequence's steps."""
    d, conf = ins[0], layer.conf
    _seq(b, node, d)
    n = d.shape[1]
    if layer.cls == "UpSampling1D":
        k = _one(conf.get("size", 2), "size", b, node)
        if k < 1:
            b.fail(node, f"size {k}: a positive integer needed")
        return T.view(d, lambda a: np.repeat(a, k, axis=1))
    key = "padding" if layer.cls == "ZeroPadding1D" else "cropping"
    v = conf.get(key, 1 if key == "padding" else 0)
    lo, hi = (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
    if min(lo, hi) < 0 or (key == "cropping" and lo + hi >= n):
        b.fail(node, f"{key} {[lo, hi]} does not fit a sequence of {n} steps")
    if key == "padding":
        return T.onnx_pad(d, [lo, hi], "constant", 0.0, axes=[1])
    return T.view(d, lambda a: a[:, lo:n - hi])


def _depthwise_weight(b, node, layer, C):
    """A depthwise kernel (kh, kw, C, depth multiplier) as the ONNX weight of a convolution
    of C groups, (C * multiplier, 1, kh, kw): output channel c * multiplier + m reads input
    channel c (TensorFlow's order)."""
    K = layer.weights.get("depthwise_kernel")
    K = _weight(b, node, layer, "kernel" if K is None else "depthwise_kernel")
    if K.ndim != 4 or K.shape[2] != C:
        b.fail(node, f"depthwise kernel of shape {K.shape}, expected (kh, kw, {C}, "
                     "depth_multiplier)")
    kh, kw, _, dm = K.shape
    return K.transpose(2, 3, 0, 1).reshape(C * dm, 1, kh, kw)


def _depthwise(b, node, layer, ins):
    """DepthwiseConv2D, and SeparableConv2D (its depthwise step, then a 1 x 1 convolution
    by the pointwise kernel): convolutions of the ONNX handler."""
    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    C = d.shape[1]
    W = _depthwise_weight(b, node, layer, C)
    sep = layer.cls == "SeparableConv2D"
    bias = _layer_bias(b, node, layer)
    strides = _pair(conf.get("strides", 1), "strides", b, node)
    dil = _pair(conf.get("dilation_rate", 1), "dilation_rate", b, node)
    pads = _padding(b, node, conf, d.shape[2:], W.shape[2:], strides, dil)
    d, pads = _fold_padding(b, d, pads)
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "group": C}
    out = _conv_of(b, node, d, W, None if sep else bias, attrs,
                   node.name + "/depthwise" if sep else None)
    if sep:
        P = _weight(b, node, layer, "pointwise_kernel")
        if P.ndim != 4 or P.shape[:3] != (1, 1, W.shape[0]):
            b.fail(node, f"pointwise kernel of shape {P.shape}, expected (1, 1, "
                         f"{W.shape[0]}, filters)")
        out = _conv_of(b, node, out, P.transpose(3, 2, 0, 1), bias, {})
    return _activate(b, node, out, _activation_name(conf))


def _conv2d_transpose(b, node, layer, ins):
    """Conv2DTranspose: ONNX's ConvTranspose (the adjoint of the convolution, kernel
    (kh, kw, filters, C) as (C, filters, kh, kw)) with Keras' output size (its
    ``deconv_output_length``: ``valid`` n s + max(k - s, 0), ``same`` n s, or with
    ``output_padding``) and TensorFlow's placement: of the full (n - 1) s + k the first half
    (rounded down) of the excess is cut off, a shortfall is zeros at the end."""
    from crown_cli.graph.onnx_ops import _conv_transpose

    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    K = _weight(b, node, layer, "kernel")
    if K.ndim != 4 or K.shape[3] != d.shape[1]:
        b.fail(node, f"kernel of shape {K.shape}, expected (kh, kw, filters, {d.shape[1]})")
    bias = _layer_bias(b, node, layer)
    strides = _pair(conf.get("strides", 1), "strides", b, node)
    dil = _pair(conf.get("dilation_rate", 1), "dilation_rate", b, node)
    mode = str(conf.get("padding", "valid")).lower()
    if mode not in ("valid", "same"):
        b.fail(node, f"padding '{mode}' is not supported (valid, same)")
    outpad = conf.get("output_padding")
    outpad = None if outpad is None else _pair(outpad, "output_padding", b, node)
    pads, extra = [0, 0, 0, 0], [0, 0]
    for a in (0, 1):
        n, s, k = d.shape[2 + a], strides[a], (K.shape[a] - 1) * dil[a] + 1
        if outpad is None:
            out = n * s + (max(k - s, 0) if mode == "valid" else 0)
        else:
            out = (n - 1) * s + k - 2 * (k // 2 if mode == "same" else 0) + outpad[a]
        excess = (n - 1) * s + k - out
        if excess >= 0:
            pads[a], pads[a + 2] = excess // 2, excess - excess // 2
        else:
            extra[a] = -excess
    attrs = {"strides": strides, "dilations": dil, "pads": pads, "output_padding": extra}
    conv_ins = [d, Const(K.transpose(3, 2, 0, 1))] + ([Const(bias)] if bias is not None else [])
    out = _conv_transpose(b, KNode(node.name, node.cls, node.input, "ConvTranspose"), conv_ins,
                          attrs)[0]
    return _activate(b, node, out, _activation_name(conf))


def _dense(b, node, layer, ins):
    d, conf = ins[0], layer.conf
    K = _weight(b, node, layer, "kernel")
    bias = _layer_bias(b, node, layer)
    if K.ndim != 2:
        b.fail(node, f"kernel of shape {K.shape}, expected (inputs, units)")
    if len(d.shape) == 4:  # on the channels of an image: a 1x1 convolution
        if d.shape[1] != K.shape[0]:
            b.fail(node, f"kernel of shape {K.shape} does not fit {d.shape[1]} channels")
        out = _conv_of(b, node, d, K.T[:, :, None, None], bias, {})
        return _activate(b, node, out, _activation_name(conf))
    if len(d.shape) == 3:  # on the channels of a sequence: a 1x1 convolution, too
        if d.shape[2] != K.shape[0]:
            b.fail(node, f"kernel of shape {K.shape} does not fit {d.shape[2]} channels")
        out = _conv_of(b, node, _seq_image(d), K.T[:, :, None, None], bias, {})
        return _image_seq(_activate(b, node, out, _activation_name(conf)))
    if len(d.shape) != 2 or d.shape[1] != K.shape[0]:
        b.fail(node, f"kernel of shape {K.shape} does not fit an input of shape "
                     f"{to_keras(d).shape[1:]} (Dense on features, sequences or image "
                     "channels only)")
    W = K.T
    src = _permuted_source(b, d)
    if src is None:
        nid = b.node_of(d, node.name)
    else:  # the input is a reordering of one node's output (a Flatten): fold it into W
        nid = src
        Wp = np.zeros((W.shape[0], b.nodes[src].size))
        Wp[:, d.idx.reshape(-1)] = W
        W = Wp
    out = b.add(node.name, Dense(W, bias), (nid,), (1, K.shape[1]))
    b.absorb_scale(b.fresh, node.input[0] if src is None or b.identity_of(d) == src else None)
    return _activate(b, node, out, _activation_name(conf))


def _permuted_source(b, d: Data):
    """The node of which d is a reordering of the whole output, or None."""
    if len(d.sources) != 1 or d.table.size or d.idx.size != b.nodes[d.sources[0]].size:
        return None
    flat = d.idx.reshape(-1)
    if flat.min() < 0 or np.unique(flat).size != flat.size:
        return None
    return d.sources[0]


def _channels(d: Data):
    """(C, the shape C values broadcast to) of a tensor's Keras last axis in the builder's
    order: an image's (1, C, H, W) holds it at axis 1, as features (1, C) do; a tensor of
    another rank is held in Keras' own order, its channels last."""
    rank = len(d.shape)
    if rank in (2, 4):
        return d.shape[1], (1, d.shape[1]) + (1,) * (rank - 2)
    return d.shape[-1], (1,) * (rank - 1) + (d.shape[-1],)


def _batchnorm(b, node, layer, ins):
    d, conf = ins[0], layer.conf
    axis = conf.get("axis", -1)
    axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
    rank = len(d.shape)
    if not isinstance(axis, int) or axis % rank != rank - 1:
        b.fail(node, f"axis {axis}: only the last (channel) axis is supported")
    C, bshape = _channels(d)
    mean = _weight(b, node, layer, "moving_mean")
    var = _weight(b, node, layer, "moving_variance")
    gamma = _weight(b, node, layer, "gamma", required=False)
    beta = _weight(b, node, layer, "beta", required=False)
    gamma = np.ones(C) if gamma is None else gamma
    beta = np.zeros(C) if beta is None else beta
    eps = float(conf.get("epsilon", 1e-3))
    if any(v.shape != (C,) for v in (mean, var, gamma, beta)) or np.any(var + eps <= 0):
        b.fail(node, f"needs {C} values per weight and moving_variance + epsilon > 0")
    a = gamma / np.sqrt(var + eps)
    c = beta - mean * a
    return b.scale(node, d, a.reshape(bshape), c.reshape(bshape), node.input[0])


# -- weightless layers -----------------------------------------------------------------------

def _pool(b, node, layer, ins):
    from crown_cli.graph.onnx_ops import _pool as onnx_pool

    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    size = _pair(conf.get("pool_size", 2), "pool_size", b, node)
    strides = conf.get("strides")
    strides = size if strides is None else _pair(strides, "strides", b, node)
    pads = _padding(b, node, conf, d.shape[2:], size, strides, [1, 1])
    op = "MaxPool" if layer.cls == "MaxPooling2D" else "AveragePool"
    attrs = {"kernel_shape": size, "strides": strides, "pads": pads, "count_include_pad": 0}
    return onnx_pool(b, KNode(node.name, node.cls, node.input, op), [d], attrs)[0]


def _global_pool(b, node, layer, ins):
    """GlobalAveragePooling2D / GlobalMaxPooling2D: a pool over the whole image, (1, C) or
    with ``keepdims`` (1, 1, 1, C)."""
    from crown_cli.graph.onnx_ops import _global_pool as onnx_global

    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    op = "GlobalMaxPool" if layer.cls == "GlobalMaxPooling2D" else "GlobalAveragePool"
    out = onnx_global(b, KNode(node.name, node.cls, node.input, op), [d], {})[0]
    return out if conf.get("keepdims", False) else T.view(out, lambda a: a.reshape(1, -1))


def _rescaling(b, node, layer, ins):
    """Rescaling: ``x * scale + offset`` (numbers, or one per channel of the last axis)."""
    d, conf = ins[0], layer.conf
    C, bshape = _channels(d)
    out = []
    for key, default in (("scale", 1.0), ("offset", 0.0)):
        v = conf.get(key, default)
        v = np.asarray(default if v is None else v, np.float64).reshape(-1)
        if v.size not in (1, C):
            b.fail(node, f"{key} of {v.size} values for {C} channels")
        out.append(np.broadcast_to(v, (C,)).reshape(bshape))
    return b.scale(node, d, out[0], out[1], node.input[0])


def _upsampling(b, node, layer, ins):
    """UpSampling2D, nearest: each pixel repeated (a move of elements)."""
    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    if str(conf.get("interpolation", "nearest")).lower() != "nearest":
        b.fail(node, f"interpolation '{conf.get('interpolation')}' is not supported "
                     "(nearest)")
    sh, sw = _pair(conf.get("size", 2), "size", b, node)
    if sh < 1 or sw < 1:
        b.fail(node, f"size {[sh, sw]}: positive integers needed")
    return T.view(d, lambda a: np.repeat(np.repeat(a, sh, axis=2), sw, axis=3))


def _cropping(b, node, layer, ins):
    """Cropping2D: rows and columns cut from the borders (a move of elements)."""
    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    c = conf.get("cropping", 0)
    if isinstance(c, int):
        (t, bt), (left, r) = (c, c), (c, c)
    elif all(isinstance(v, int) for v in c):
        (t, bt), (left, r) = (c[0], c[0]), (c[1], c[1])
    else:
        (t, bt), (left, r) = c
    H, W = d.shape[2:]
    if min(t, bt, left, r) < 0 or t + bt >= H or left + r >= W:
        b.fail(node, f"cropping {[[t, bt], [left, r]]} does not fit an image of {H} x {W}")
    return T.view(d, lambda a: a[:, :, t:H - bt, left:W - r])


def _zero_padding(b, node, layer, ins):
    d, conf = ins[0], layer.conf
    _channels_last(b, node, conf)
    _image(b, node, d)
    p = conf.get("padding", 1)
    if isinstance(p, int):
        (t, bt), (left, r) = (p, p), (p, p)
    elif all(isinstance(v, int) for v in p):
        (t, bt), (left, r) = (p[0], p[0]), (p[1], p[1])
    else:
        (t, bt), (left, r) = p
    return T.onnx_pad(d, [t, left, bt, r], "constant", 0.0, axes=[2, 3])


def _flatten(b, node, layer, ins):
    _channels_last(b, node, layer.conf)
    return T.view(to_keras(ins[0]), lambda a: a.reshape(1, -1))


def _reshape(b, node, layer, ins):
    target = [int(v) for v in layer.conf.get("target_shape", [])]
    try:
        return to_inner(T.view(to_keras(ins[0]), lambda a: a.reshape([1] + target)))
    except ValueError:
        b.fail(node, f"target_shape {target} does not fit the input of shape "
                     f"{to_keras(ins[0]).shape[1:]}")


def _merge_shapes(b, node, ins):
    if len(ins) < 2 or any(d.shape != ins[0].shape for d in ins):
        b.fail(node, f"needs two or more inputs of one shape, got "
                     f"{[to_keras(d).shape[1:] for d in ins]}")


def _add(b, node, layer, ins):
    _merge_shapes(b, node, ins)
    signs = [1.0, -1.0] if layer.cls == "Subtract" else [1.0] * len(ins)
    if layer.cls == "Subtract" and len(ins) != 2:
        b.fail(node, "needs exactly two inputs")
    ids = [b.node_of(d, node.name) for d in ins]
    out = b.add(node.name, Sum(signs, ins[0].idx.size), ids, ins[0].shape)
    if layer.cls == "Average":
        n = np.full(ins[0].idx.size, 1.0 / len(ins))
        out = b.add(node.name + "/mean", Scale(n), (b.fresh,), ins[0].shape)
    return out


def _elementwise(b, node, layer, ins):
    """Multiply (a product node of two data tensors, McCormick's planes), Maximum and Minimum
    (ReLU nodes, as ONNX Max / Min), with Keras' broadcasting over axes of size 1 (a
    squeeze-and-excitation's (1, 1, C) against (H, W, C)); inputs of two ranks broadcast in
    Keras' own order."""
    from crown_cli.graph import onnx_relu_forms as forms
    from crown_cli.graph.onnx_ops import _binary

    if len(ins) < 2:
        b.fail(node, "needs two or more inputs")
    op = {"Multiply": "Mul", "Maximum": "Max", "Minimum": "Min"}[layer.cls]
    try:
        np.broadcast_shapes(*[to_keras(d).shape for d in ins])
    except ValueError:
        b.fail(node, f"inputs of shapes {[to_keras(d).shape[1:] for d in ins]} do not "
                     "broadcast")
    out = ins[0]
    for k, d in enumerate(ins[1:]):
        label = node.name if k == len(ins) - 2 else f"{node.name}/{k}"
        kn = KNode(label, node.cls, node.input[:2], op)
        same = len(out.shape) == len(d.shape)
        pair = [out, d] if same else [to_keras(out), to_keras(d)]
        fn = _binary if op == "Mul" else forms.max_min
        out = fn(b, kn, pair, {})[0]
        if not same:
            out = to_inner(out)
    return out


def _layer_norm(b, node, layer, ins):
    """LayerNormalization over the config's axes (Keras' numbering; the last by default):
    ``(x - mean) / sqrt(var + epsilon) * gamma + beta``, the ONNX reader's construction
    (:func:`crown_cli.graph.onnx_ops.normalize`)."""
    from crown_cli.graph.onnx_ops import normalize

    d, conf = ins[0], layer.conf
    if conf.get("rms_scaling", False):
        b.fail(node, "rms_scaling=True is not supported")
    kshape = to_keras(d).shape
    rank = len(kshape)
    axes = conf.get("axis", -1)
    axes = [axes] if isinstance(axes, int) else list(axes)
    axes = sorted({int(a) % rank for a in axes})
    if 0 in axes:
        b.fail(node, f"axis {conf.get('axis')}: the batch axis is not normalised")
    inner = [_inner_axis(a, rank) for a in axes]
    norm_shape = tuple(kshape[a] for a in axes)
    params = []
    for role in ("gamma", "beta"):
        v = _weight(b, node, layer, role, required=False)
        if v is not None:
            if v.size != int(np.prod(norm_shape)):
                b.fail(node, f"{role} of shape {v.shape} does not fit the normalised axes' "
                             f"{norm_shape}")
            v = v.reshape([kshape[a] if a in axes else 1 for a in range(rank)])
            v = v.transpose(0, 3, 1, 2) if rank == 4 else v
        params.append(v)
    return normalize(b, node, d, inner, float(conf.get("epsilon", 1e-3)), *params)


def _group_norm(b, node, layer, ins):
    """GroupNormalization (channels last): the channels in ``groups`` consecutive groups,
    each group's values (its channels at every position) normalised together
    (:func:`crown_cli.graph.onnx_ops.normalize` on the view (groups, channels / groups,
    ...)), then ``gamma`` and ``beta`` per channel."""
    from crown_cli.graph.onnx_ops import normalize

    d, conf = ins[0], layer.conf
    axis = conf.get("axis", -1)
    rank = len(d.shape)
    if rank not in (2, 4) or not isinstance(axis, int) or axis % rank != rank - 1:
        b.fail(node, f"axis {axis} on shape {to_keras(d).shape[1:]}: the channels of features "
                     "or of an image only")
    C = d.shape[1]
    G = int(conf.get("groups", 32))
    if G < 1 or C % G:
        b.fail(node, f"groups {G} does not divide {C} channels")
    rest = d.shape[2:]
    grouped = T.view(d, lambda a: a.reshape((1, G, C // G) + tuple(rest)))
    y = normalize(b, node, grouped, range(2, 2 + 1 + len(rest)),
                  float(conf.get("epsilon", 1e-3)))
    y = T.view(y, lambda a: a.reshape(d.shape))
    bshape = (1, C) + (1,) * len(rest)
    gamma = _weight(b, node, layer, "gamma", required=False)
    beta = _weight(b, node, layer, "beta", required=False)
    for what, v in (("gamma", gamma), ("beta", beta)):
        if v is not None and v.size != C:
            b.fail(node, f"{what} of {v.size} values for {C} channels")
    if gamma is None and beta is None:
        return y
    a = np.ones(bshape) if gamma is None else gamma.reshape(bshape)
    return b.scale(node, y, a, None if beta is None else beta.reshape(bshape), None)


def _layer_scale(b, node, layer, ins):
    """ConvNeXt's LayerScale (keras.applications): the input times its ``gamma``, one value
    per channel (the last axis)."""
    d = ins[0]
    C, bshape = _channels(d)
    g = _weight(b, node, layer, "gamma")
    if g.size != C:
        b.fail(node, f"gamma of {g.size} values for {C} channels")
    return b.scale(node, d, g.reshape(bshape), None, node.input[0])


def _normalization(b, node, layer, ins):
    """Normalization (not inverted, on the last axis or on all): ``(x - mean) /
    max(sqrt(variance), 1e-7)`` (Keras' epsilon), the adapted weights or the config's."""
    d, conf = ins[0], layer.conf
    if conf.get("invert", False):
        b.fail(node, "invert=True is not supported")
    axis = conf.get("axis", -1)
    axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
    rank = len(d.shape)
    if axis is not None and (not isinstance(axis, int) or axis % rank != rank - 1):
        b.fail(node, f"axis {axis}: only the last (channel) axis or None is supported")
    C, bshape = _channels(d)
    stats = []
    for key in ("mean", "variance"):
        v = _weight(b, node, layer, key, required=False)
        if v is None and conf.get(key) is not None:
            v = np.asarray(conf[key], np.float64)
        if v is None:
            b.fail(node, "no mean and variance (an adapted layer's weights, or mean= and "
                         "variance= in its config)")
        v = v.reshape(-1)
        if v.size not in (1, C) or not np.all(np.isfinite(v)):
            b.fail(node, f"{key} of {v.size} values for {C} channels")
        stats.append(np.broadcast_to(v, (C,)))
    mean, var = stats
    if np.any(var < 0):
        b.fail(node, "a negative variance")
    a = 1.0 / np.maximum(np.sqrt(var), 1e-7)
    return b.scale(node, d, a.reshape(bshape), (-mean * a).reshape(bshape), node.input[0])


def _op(b, node, layer, ins):
    """A Keras 3 op on tensors and numbers, as a model's config records ``x + 3.0`` or
    ``x * (1 / 6)`` (MobileNetV3's hard sigmoid): ``ops.Add``, ``ops.Subtract``,
    ``ops.Multiply``, ``ops.Divide`` / ``ops.TrueDivide`` (by a constant), ``ops.Negative``;
    numbers broadcast in Keras' order."""
    from crown_cli.graph.onnx_ops import _binary, _neg

    op = {"ops.Add": "Add", "ops.Subtract": "Sub", "ops.Multiply": "Mul", "ops.Divide": "Div",
          "ops.TrueDivide": "Div", "ops.Negative": "Neg"}[layer.cls]
    tensors = iter(ins)
    args = layer.conf.get("__args__") or [("tensor", None)] * len(ins)
    vals = []
    for kind, v in args:
        if kind == "tensor":
            vals.append(next(tensors, None))
        else:
            vals.append(v)
    if any(v is None for v in vals) or len(vals) != (1 if op == "Neg" else 2):
        b.fail(node, f"takes {'one' if op == 'Neg' else 'two'} operands, got {len(vals)}")
    names = iter(node.input)
    kn = KNode(node.name, node.cls, [next(names, "") if isinstance(v, Data) else ""
                                     for v in vals], op)
    if op == "Neg":
        return _neg(b, kn, vals, {})[0]
    data = [v for v in vals if isinstance(v, Data)]
    if len(data) == 2 and len(data[0].shape) != len(data[1].shape):
        return to_inner(_binary(b, kn, [to_keras(v) for v in vals], {})[0])
    ref = data[0]
    ops = []
    for v in vals:
        if isinstance(v, Data):
            ops.append(v)
            continue
        c = np.asarray(v, np.float64)
        if c.ndim:  # a constant array: Keras' order, broadcast there, then the builder's
            try:
                c = np.broadcast_to(c, to_keras(ref).shape)
            except ValueError:
                b.fail(node, f"a constant of shape {c.shape} does not broadcast to "
                             f"{to_keras(ref).shape[1:]}")
            c = c.transpose(0, 3, 1, 2) if len(ref.shape) == 4 else c
        ops.append(Const(c))
    return _binary(b, kn, ops, {})[0]


def _concatenate(b, node, layer, ins):
    rank = len(ins[0].shape)
    if len(ins) < 2 or any(len(d.shape) != rank for d in ins):
        b.fail(node, "needs two or more inputs of one rank")
    axis = int(layer.conf.get("axis", -1))
    axis = axis % rank
    if axis == 0:
        b.fail(node, "cannot concatenate along the batch axis")
    inner = _inner_axis(axis, rank)
    sources, idxs, table = T.merge(ins, b.sizes())
    try:
        return Data(sources, np.concatenate(idxs, axis=inner), table)
    except ValueError:
        b.fail(node, f"inputs of shapes {[to_keras(d).shape[1:] for d in ins]} do not "
                     f"concatenate on axis {axis}")


def _act_layer(b, node, layer, ins):
    from crown_cli.io.models import _activation_from_name, _layer_alpha

    cls, conf = layer.cls, layer.conf
    if cls == "Activation":
        return _activate(b, node, ins[0], _activation_name(conf))
    if cls == "Softmax":
        return _activate(b, node, ins[0], "softmax")
    if cls == "Lambda":
        act = _activation_from_name(node.name)
        if act is None:
            b.fail(node, "a Lambda layer is read only as an activation named like arctan_1")
        return _activate(b, node, ins[0], act)
    if cls == "ReLU":
        if float(conf.get("threshold", 0.0) or 0.0) != 0.0:
            b.fail(node, "only threshold 0 is supported")
        slope = float(conf.get("negative_slope", 0.0) or 0.0)
        low = _activate(b, node, ins[0], "leaky_relu" if slope else "relu",
                        slope if slope else None)
        if conf.get("max_value") is None:
            return low
        return _capped(b, node, ins[0], low, float(conf["max_value"]))
    name = "leaky_relu" if cls == "LeakyReLU" else "elu"
    return _activate(b, node, ins[0], name, _layer_alpha(cls, conf))


def _prelu(b, node, layer, ins):
    """PReLU: ``max(x, 0) + alpha min(x, 0)`` with the layer's alpha (the input's shape, 1
    along ``shared_axes``), as ONNX PRelu (a leaky ReLU where one slope in [0, 1] serves
    every element)."""
    from crown_cli.graph import onnx_relu_forms as forms

    d = ins[0]
    a = _weight(b, node, layer, "alpha")
    keras_shape = to_keras(d).shape[1:]
    try:
        a = np.broadcast_to(a, keras_shape)
    except ValueError:
        b.fail(node, f"alpha of shape {a.shape} does not fit the input's {keras_shape}")
    a = a[None].transpose(0, 3, 1, 2) if len(d.shape) == 4 else a[None]
    return forms.prelu(b, KNode(node.name, node.cls, node.input, "PRelu"), [d, Const(a)],
                       {})[0]


def _permute(b, node, layer, ins):
    """Permute: the non-batch axes reordered (``dims`` numbered from 1)."""
    d = ins[0]
    dims = [int(v) for v in layer.conf.get("dims", [])]
    rank = len(d.shape)
    if sorted(dims) != list(range(1, rank)):
        b.fail(node, f"dims {dims} are not a permutation of 1..{rank - 1}")
    return to_inner(T.view(to_keras(d), lambda a: a.transpose([0] + dims)))


def _identity(b, node, layer, ins):
    return ins[0]


HANDLERS = {"Conv2D": _conv2d, "Dense": _dense, "BatchNormalization": _batchnorm,
            "DepthwiseConv2D": _depthwise, "SeparableConv2D": _depthwise,
            "AveragePooling2D": _pool, "MaxPooling2D": _pool, "ZeroPadding2D": _zero_padding,
            "GlobalAveragePooling2D": _global_pool, "GlobalMaxPooling2D": _global_pool,
            "Rescaling": _rescaling, "UpSampling2D": _upsampling, "Cropping2D": _cropping,
            "Conv2DTranspose": _conv2d_transpose, "PReLU": _prelu, "Permute": _permute,
            "Conv1D": _conv1d, "MaxPooling1D": _pool1d, "AveragePooling1D": _pool1d,
            "GlobalAveragePooling1D": _global_pool1d, "GlobalMaxPooling1D": _global_pool1d,
            "ZeroPadding1D": _moves1d, "Cropping1D": _moves1d, "UpSampling1D": _moves1d,
            "Normalization": _normalization, "LayerNormalization": _layer_norm,
            "LayerScale": _layer_scale, "GroupNormalization": _group_norm,
            "Multiply": _elementwise,
            **{f"ops.{k}": _op for k in ("Add", "Subtract", "Multiply", "Divide", "TrueDivide",
                                          "Negative")},
            "Maximum": _elementwise, "Minimum": _elementwise,
            "Flatten": _flatten, "Reshape": _reshape, "Add": _add, "Subtract": _add,
            "Average": _add, "Concatenate": _concatenate, "Activation": _act_layer,
            "Softmax": _act_layer, "Lambda": _act_layer, "ReLU": _act_layer,
            "LeakyReLU": _act_layer, "ELU": _act_layer,
            "__alias__": _identity,  # an inlined model's input or output (keras_graph)
            **{c: _identity for c in IDENTITY_LAYERS}}
SUPPORTED = ", ".join(["InputLayer", "Functional / Sequential (a model as a layer)"] +
                      sorted(h for h in HANDLERS if not h.startswith("__")))


def _tensor(ref) -> str:
    name, node_idx, tensor_idx = ref
    return name if (node_idx, tensor_idx) == (0, 0) else f"{name}:{node_idx}:{tensor_idx}"


def build(path: str, layers, inputs, outputs, keras3: bool) -> Graph:
    """The graph of the layers (:func:`crown_cli.graph.keras_graph.read_keras`)."""
    uses = {}
    for layer in layers:
        for ref in layer.inbound:
            uses[_tensor(ref)] = uses.get(_tensor(ref), 0) + 1
    out_names = [_tensor(r) for r in outputs]
    for name in out_names:
        uses[name] = uses.get(name, 0) + 1
    b = KerasBuilder(path, uses, set(out_names), keras3)
    offset = 0
    for k, (name, shape) in enumerate(inputs):
        if not shape or any(not isinstance(v, int) or v < 1 for v in shape[1:]):
            raise InputError(f"{path}: input '{name}' has shape {shape}; a fixed shape "
                             "(batch, ...) is needed")
        kshape = (1,) + tuple(shape[1:])
        size = int(np.prod(kshape))
        d = b.add(name if name != "__input__" else "input", InputOp(k, offset, size), (), kshape)
        b.tensors[name] = to_inner(d)
        offset += size
    pending = list(layers)
    while pending:  # in the config's order, a layer once every input it reads exists
        ready = [layer for layer in pending
                 if all(_tensor(r) in b.tensors for r in layer.inbound)]
        if not ready:
            missing = sorted({_tensor(r) for layer in pending for r in layer.inbound
                              if _tensor(r) not in b.tensors})
            raise InputError(f"{path}: layer '{pending[0].name}' reads {missing}, which no "
                             "layer produces")
        layer = ready[0]
        pending.remove(layer)
        handler = HANDLERS.get(layer.cls)
        if handler is None:
            raise InputError(f"{path}: layer '{layer.name}' ({layer.cls or 'unknown class'}) "
                             f"is not supported; supported: {SUPPORTED}")
        node = KNode(layer.name, layer.cls, [_tensor(r) for r in layer.inbound])
        if not layer.inbound:
            b.fail(node, "reads no tensor")
        if len(layer.inbound) > 1 and handler not in (_add, _concatenate, _elementwise, _op):
            b.fail(node, f"reads {len(layer.inbound)} tensors; it takes one")
        b.fresh = None
        out = handler(b, node, layer, [b.tensors[n] for n in node.input])
        b.tensors[layer.name] = out
        if b.fresh is not None and b.identity_of(out) == b.fresh:
            b.produced[b.fresh] = layer.name
    outs = [to_keras(b.tensors[n]) for n in out_names]
    shapes = [d.shape for d in outs]
    if len(outs) == 1:
        out_id = b.node_of(outs[0], "output")
    else:  # several outputs: one flat vector, in order
        sources, idxs, table = T.merge(outs, b.sizes())
        flat = np.concatenate([i.reshape(-1) for i in idxs])
        out_id = b.node_of(Data(sources, flat, table), "outputs")
    graph = _pruned(b.nodes, out_id, path, shapes)
    graph.channels_last = any(len(g.shape) == 4 for g in (graph.nodes[i] for i in graph.inputs))
    return graph


__all__ = ["build", "HANDLERS", "SUPPORTED"]
