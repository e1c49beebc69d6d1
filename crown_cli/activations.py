"""Elementwise activation functions (numpy), used to evaluate networks outside the bound engine."""
from __future__ import annotations

import numpy as np

from .errors import InputError


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free form of 1 / (1 + exp(-z))


FUNCTIONS = {
    "relu": lambda z: np.maximum(z, 0.0),
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "arctan": np.arctan,
    "linear": lambda z: z,
}


def apply_activation(name: str, z: np.ndarray) -> np.ndarray:
    try:
        fn = FUNCTIONS[name]
    except KeyError:
        raise InputError(f"unknown activation '{name}'") from None
    return fn(z)


def forward(weights, biases, activation: str, x: np.ndarray) -> np.ndarray:
    """Logits of the MLP for x (N, d) or (d,); weights[k] is (outputs, inputs)."""
    a = np.asarray(x, dtype=np.float64)
    last = len(weights) - 1
    for k, (w, b) in enumerate(zip(weights, biases)):
        z = a @ w.T + b
        a = z if k == last else apply_activation(activation, z)
    return a
