"""One record per activation: what it computes and what the tool can do with it.

Every activation the loaders accept has one :class:`Activation` in :data:`ACTIVATIONS`:
its function and derivative (numpy, float64, for forward passes and attacks), its default
parameter (the negative-side slope of leaky ReLU, the scale of ELU's negative side, the slope
of hard sigmoid's linear piece) with the range the relaxations rely on, and the methods that
support it. The linear relaxations themselves are the engine's
(:mod:`crown_cli.engine.relaxations`, keyed by the same names). Code that asks "does this
activation support X" asks its record (:func:`supporting`), never a list of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from crown_cli.errors import InputError


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free form of 1 / (1 + exp(-z))


def _elu(z, a):
    return np.where(z > 0, z, a * np.expm1(np.minimum(z, 0.0)))


def _elu_grad(z, a):
    return np.where(z > 0, 1.0, a * np.exp(np.minimum(z, 0.0)))


def _softplus(z):
    return np.logaddexp(0.0, z)  # log(1 + e^z) without overflow


_TWO_OVER_SQRT_PI = 1.1283791670955126  # erf'(0)


def _erf(z):
    from scipy.special import erf  # imported on first use (the CLI's start stays quick)

    return erf(z)


def _self_gated(kind, scaled=True):
    """GELU's or SiLU's (function, derivative): crown_cli.engine.relaxations.self_gated (GELU
    as z erfc(-s z) / 2, without the cancellation of 1 + erf); the parameter is the scale s
    (``scaled``) or not the function's (GELU's tanh form: an allowance of the lines)."""
    def function(z, s):
        from crown_cli.engine.relaxations import self_gated as sg

        return sg.values(getattr(sg, kind), z, 1.0 if s is None or not scaled else s)

    def derivative(z, s):
        from crown_cli.engine.relaxations import self_gated as sg

        return sg.derivatives(getattr(sg, kind), z, 1.0 if s is None or not scaled else s)

    return function, derivative


def _reciprocal(z):
    with np.errstate(divide="ignore"):
        return 1.0 / z


def _sqrt(z):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(z)


def _sign_surrogate(z, a):
    # a straight-through estimator at the scale of the layer: 1 / (1 + (z / s)^2) with s the
    # mean |z| of the point's layer (per row), so that the neurons nearest their jump carry
    # the gradient. Sign's own derivative is 0 almost everywhere (no descent direction); the
    # identity form makes the network linear to the attack (every start heads for one corner),
    # and a fixed window (1 where |z| <= 1) misses layers far from unit scale (a convolution
    # of raw pixels) and stops at Larq's sign(sign(z) + 0.1), whose inner values are -0.9,
    # 0.1 and 1.1
    z = np.asarray(z, dtype=np.float64)
    s = np.mean(np.abs(z), axis=-1, keepdims=True) + 1e-300
    return 1.0 / (1.0 + (z / s) ** 2)


def _hard_sigmoid_grad(z, a):
    y = a * z + 0.5
    return np.where((y > 0.0) & (y < 1.0), a, 0.0)


@dataclass(frozen=True)
class Activation:
    """An elementwise activation and what supports it.

    ``function(z, param)`` and ``derivative(z, param)`` are numpy, elementwise; at a kink the
    derivative is one value of the subdifferential (an attack only needs a descent direction).
    ``param`` is the activation's parameter (``default_param`` when the file gives none;
    None for parameter-free activations); ``param_range`` = (low, high, low included) is the
    range the relaxations are valid for (high included) in an MLP file, ``graph_param_range``
    the same for a graph's activation node where it is wider (None: ``param_range``; see
    :func:`param_range`).
    Capabilities:
    ``bound``: the engine has a CROWN relaxation (every activation but ``linear``);
    ``fast_lin``: the non-adaptive methods (``fast-lin``, the comparison methods);
    ``sign_stable``: piecewise linear with one kink at 0, so a stable neuron's relaxation is
    fixed by the sign of z and an unstable neuron's is valid on every sub-interval
    (:mod:`crown_cli.engine.stability` relies on both);
    ``alpha_crown``: optimised lower slopes (ReLU-type) or tangent points (``smooth``);
    ``smooth``: S-shaped (tanh, sigmoid, arctan): tangent-line relaxations;
    ``bab``: branch and bound in ``crown verify`` (input and ReLU splitting);
    ``numpy_twin``: a plain-numpy relaxation exists (bounds without importing numba);
    ``mlp``: an MLP file (NPZ, HDF5, Keras) may name it as its activation (the elementary
    functions of ONNX graphs, sin to cube, are graph nodes only);
    ``surrogate``: for an activation whose derivative is 0 almost everywhere (sign), the
    gradient the attacks descend on instead (:func:`attack_derivative`); None: ``derivative``.
    Attacks only nominate points, which the float64 forward pass then confirms, so any
    surrogate is sound.
    """

    name: str
    function: Callable[[np.ndarray, Optional[float]], np.ndarray]
    derivative: Callable[[np.ndarray, Optional[float]], np.ndarray]
    default_param: Optional[float] = None
    param_range: Optional[Tuple[float, float, bool]] = None
    graph_param_range: Optional[Tuple[float, float, bool]] = None
    bound: bool = True
    fast_lin: bool = False
    sign_stable: bool = False
    alpha_crown: bool = False
    smooth: bool = False
    bab: bool = False
    numpy_twin: bool = False
    mlp: bool = True
    surrogate: Optional[Callable[[np.ndarray, Optional[float]], np.ndarray]] = None


_RELU_TYPE = dict(fast_lin=True, sign_stable=True, alpha_crown=True, bab=True, numpy_twin=True)
_S_SHAPED = dict(alpha_crown=True, smooth=True)

ACTIVATIONS: Dict[str, Activation] = {a.name: a for a in (
    Activation("relu", lambda z, a: np.maximum(z, 0.0), lambda z, a: (z > 0).astype(np.float64),
               **_RELU_TYPE),
    # Keras' leaky_relu activation uses 0.2 (its LeakyReLU layer 0.3, read from the file);
    # slope at most 1: the relaxations take the chord above and a line below
    Activation("leaky_relu", lambda z, a: np.where(z >= 0, z, a * z),
               lambda z, a: np.where(z >= 0, 1.0, a), default_param=0.2,
               param_range=(0.0, 1.0, True), **_RELU_TYPE),
    Activation("tanh", lambda z, a: np.tanh(z), lambda z, a: 1.0 - np.tanh(z) ** 2, **_S_SHAPED),
    Activation("sigmoid", lambda z, a: _sigmoid(z),
               lambda z, a: _sigmoid(z) * (1.0 - _sigmoid(z)), **_S_SHAPED),
    Activation("arctan", lambda z, a: np.arctan(z), lambda z, a: 1.0 / (1.0 + z * z), **_S_SHAPED),
    # ONNX Erf (PyTorch exports GELU as x * (1 + erf(x / sqrt 2)) / 2): graph nodes only
    # (so no MLP's alpha-CROWN: the graph engine's has no tangent points)
    Activation("erf", lambda z, a: _erf(z), lambda z, a: _TWO_OVER_SQRT_PI * np.exp(-z * z),
               mlp=False, smooth=True),
    # GELU, z (1 + erf(s z)) / 2 (s = 1 / sqrt 2; ONNX Gelu, or PyTorch's exported pattern
    # fused at load): graph nodes only
    Activation("gelu", *_self_gated("GELU"), default_param=0.7071067811865476,
               param_range=(0.0, float("inf"), False), mlp=False),
    # SiLU (swish), z sigmoid(s z) (s = 1; ONNX has no SiLU: PyTorch's Mul(x, Sigmoid(x))
    # is fused at load): graph nodes only
    Activation("silu", *_self_gated("SILU"), default_param=1.0,
               param_range=(0.0, float("inf"), False), mlp=False),
    # ONNX HardSwish, z clip(z / 6 + 1 / 2, 0, 1) (MobileNetV3): graph nodes only
    Activation("hardswish", *_self_gated("HARDSWISH"), mlp=False),
    # ONNX Mish, z tanh(softplus(z)) (YOLOv4): graph nodes only
    Activation("mish", *_self_gated("MISH"), mlp=False),
    # ONNX Gelu with approximate='tanh' (GPT-2's GELU): graph nodes only. Its parameter (None:
    # 0) is no part of the function: a bound on |g - gelu_tanh| where the node stands for a
    # g with other constants (torch's exported chain with float32 ones, fused at load:
    # graph/onnx_fusion.py), by which the lines and the range are widened
    Activation("gelu_tanh", *_self_gated("GELU_TANH", scaled=False), mlp=False),
    Activation("linear", lambda z, a: z, lambda z, a: np.ones_like(z), bound=False),
    # ELU: an MLP's scale in (0, 1] (convex); a graph node's any scale > 0 (ONNX Selu's is
    # 1.6733: convex on z <= 0 with a concave kink at 0, engine/relaxations/extra.py)
    Activation("elu", _elu, _elu_grad, default_param=1.0, param_range=(0.0, 1.0, False),
               graph_param_range=(0.0, float("inf"), False)),
    Activation("softplus", lambda z, a: _softplus(z), lambda z, a: _sigmoid(z)),
    # torch's Softplus from its default exporter, Where(Greater(z, T), z, Softplus(z)), fused
    # at load (graph/onnx_fusion.py): a jump of at most log1p(exp(-T)) at T (graph nodes only)
    Activation("softplus_t", lambda z, a: np.where(z > a, z, _softplus(z)),
               lambda z, a: np.where(z > a, 1.0, _sigmoid(z)), default_param=20.0,
               param_range=(0.0, float("inf"), True), mlp=False),
    # Keras 2: clip(0.2 z + 0.5, 0, 1); Keras 3 uses slope 1/6 (relu6(z + 3) / 6)
    Activation("hard_sigmoid", lambda z, a: np.clip(a * z + 0.5, 0.0, 1.0), _hard_sigmoid_grad,
               default_param=0.2, param_range=(0.0, float("inf"), False)),
    # elementary functions of the competitions' graphs (ONNX Sin, Cos, Exp, Reciprocal and
    # division by data, Pow): crown_cli.engine.relaxations.elementary
    Activation("sin", lambda z, a: np.sin(z), lambda z, a: np.cos(z), mlp=False),
    Activation("cos", lambda z, a: np.cos(z), lambda z, a: -np.sin(z), mlp=False),
    Activation("exp", lambda z, a: np.exp(z), lambda z, a: np.exp(z), mlp=False),
    Activation("reciprocal", lambda z, a: _reciprocal(z), lambda z, a: -_reciprocal(z) ** 2,
               mlp=False),
    # ONNX Pow of data by the constant 2 or 3
    Activation("square", lambda z, a: np.square(z), lambda z, a: 2.0 * z, mlp=False),
    Activation("cube", lambda z, a: z * z * z, lambda z, a: 3.0 * z * z, mlp=False),
    # ONNX Sqrt of data (layer normalisation's 1 / sqrt(variance + eps)); NaN below 0, as numpy
    Activation("sqrt", lambda z, a: _sqrt(z), lambda z, a: 0.5 / _sqrt(z), mlp=False),
    # ONNX Sign: -1, 0, 1 (binarised networks); a jump at 0, so bounds only (engine/relaxations/
    # sign.py: numpy) and a surrogate gradient for the attacks
    Activation("sign", lambda z, a: np.sign(z), lambda z, a: np.zeros_like(z, dtype=np.float64),
               numpy_twin=True, surrogate=_sign_surrogate),
    # ONNX Floor of data (range reductions): steps of 1 (engine/relaxations/floor.py: numpy);
    # the attacks descend through it as through the identity
    Activation("floor", lambda z, a: np.floor(z), lambda z, a: np.zeros_like(z, dtype=np.float64),
               numpy_twin=True, mlp=False, surrogate=lambda z, a: np.ones_like(z, dtype=np.float64)),
)}


def get(name: str) -> Activation:
    """The record of ``name``, or an InputError listing the known ones."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise InputError(f"unknown activation '{name}' (known: {', '.join(ACTIVATIONS)})") from None


def supporting(capability: str) -> Tuple[str, ...]:
    """The names of the activations with ``capability`` (a boolean field of
    :class:`Activation`), in registry order."""
    return tuple(n for n, a in ACTIVATIONS.items() if getattr(a, capability))


def param_range(name: str, graph: bool = False) -> Optional[Tuple[float, float, bool]]:
    """(low, high, low included) of activation ``name``'s parameter: an MLP's, or (``graph``)
    a graph node's."""
    act = ACTIVATIONS[name]
    return (act.graph_param_range or act.param_range) if graph else act.param_range


def param_ok(rng: Tuple[float, float, bool], alpha: float) -> bool:
    """Whether ``alpha`` lies in the range ``rng`` (:func:`param_range`)."""
    low, high, closed = rng
    return (low <= alpha if closed else low < alpha) and alpha <= high


def range_text(rng: Tuple[float, float, bool]) -> str:
    low, high, closed = rng
    return f"{'[' if closed else '('}{low:g}, {high:g}{']' if high < float('inf') else ')'}"


def default_alpha(name: str):
    """The default parameter of activation ``name`` (None if it takes none)."""
    return ACTIVATIONS[name].default_param


def apply_activation(name: str, z: np.ndarray, alpha=None) -> np.ndarray:
    act = get(name)
    return act.function(z, act.default_param if alpha is None else alpha)


def derivative(name: str, z: np.ndarray, alpha=None) -> np.ndarray:
    act = get(name)
    return act.derivative(z, act.default_param if alpha is None else alpha)


def attack_derivative(name: str, z: np.ndarray, alpha=None) -> np.ndarray:
    """The gradient factor attacks use: the record's ``surrogate`` if it has one, else its
    derivative."""
    act = get(name)
    fn = act.surrogate or act.derivative
    return fn(z, act.default_param if alpha is None else alpha)


def forward(weights, biases, activation: str, x: np.ndarray, alpha=None) -> np.ndarray:
    """Logits of the MLP for x (N, d) or (d,); weights[k] is (outputs, inputs)."""
    a = np.asarray(x, dtype=np.float64)
    last = len(weights) - 1
    for k, (w, b) in enumerate(zip(weights, biases)):
        z = a @ w.T + b
        a = z if k == last else apply_activation(activation, z, alpha)
    return a


def apply_output_activation(name: str, z: np.ndarray, alpha=None) -> np.ndarray:
    """An output activation on logits z (N, classes) or (classes,): an elementwise activation,
    or ``softmax`` / ``log_softmax`` over the last axis."""
    if name in ("softmax", "log_softmax"):
        shifted = z - np.max(z, axis=-1, keepdims=True)
        log_sum = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
        return shifted - log_sum if name == "log_softmax" else np.exp(shifted - log_sum)
    return apply_activation(name, z, alpha)
