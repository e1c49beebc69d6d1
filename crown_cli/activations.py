"""Elementwise activation functions (numpy), used to evaluate networks outside the bound engine.

Some activations take a parameter ``alpha``: the negative-side slope of leaky ReLU, the scale
of ELU's negative side, the slope of hard sigmoid's linear piece.
"""
from __future__ import annotations

import numpy as np

from crown_cli.errors import InputError


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free form of 1 / (1 + exp(-z))


def _elu(z, alpha):
    return np.where(z > 0, z, alpha * np.expm1(np.minimum(z, 0.0)))


def _softplus(z):
    return np.logaddexp(0.0, z)  # log(1 + e^z) without overflow


# name -> (function(z, alpha), default alpha or None)
FUNCTIONS = {
    "relu": (lambda z, a: np.maximum(z, 0.0), None),
    "tanh": (lambda z, a: np.tanh(z), None),
    "sigmoid": (lambda z, a: _sigmoid(z), None),
    "arctan": (lambda z, a: np.arctan(z), None),
    "linear": (lambda z, a: z, None),
    # Keras' leaky_relu activation uses 0.2 (its LeakyReLU layer 0.3, read from the file)
    "leaky_relu": (lambda z, a: np.where(z >= 0, z, a * z), 0.2),
    "elu": (_elu, 1.0),
    "softplus": (lambda z, a: _softplus(z), None),
    # Keras 2: clip(0.2 z + 0.5, 0, 1); Keras 3 uses slope 1/6 (relu6(z + 3) / 6)
    "hard_sigmoid": (lambda z, a: np.clip(a * z + 0.5, 0.0, 1.0), 0.2),
}


def default_alpha(name: str):
    return FUNCTIONS[name][1]


def apply_activation(name: str, z: np.ndarray, alpha=None) -> np.ndarray:
    try:
        fn, default = FUNCTIONS[name]
    except KeyError:
        raise InputError(f"unknown activation '{name}'") from None
    return fn(z, default if alpha is None else alpha)


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
