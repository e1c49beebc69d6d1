"""Registry of activation relaxations.

``get_relaxation(activation, method, alpha)`` returns a function ``(l, u) -> (aU, bU, aL, bL)``
of float64 arrays with ``aL*z + bL <= act(z) <= aU*z + bU`` for every z in [l, u],
elementwise. Each activation family lives in its own module; adding an activation is adding
one entry to ``RELAXATIONS`` (and, if some neurons' relaxation does not depend on the exact
interval, one to ``INTERVAL_FREE``). Families are imported on first use, so a run imports
only its own activation's module (and, with the numpy kernels and a ReLU-type activation,
no numba at all).
"""
from importlib import import_module

import numpy as np

from crown_cli.activations import ACTIVATIONS
from crown_cli.errors import InputError

# "crown": the default lines; "crown-paper": the paper's (they differ for tanh, sigmoid and
# arctan only, where l < 0 < u: sigmoid_family); "fast-lin": non-adaptive ReLU-type lines
METHODS = ("crown", "crown-paper", "fast-lin")


def _numpy_kernels() -> bool:
    from crown_cli.engine.kernels import kernels_backend

    return kernels_backend() == "numpy"


def _relu(method, alpha):
    if _numpy_kernels():
        from crown_cli.engine.relaxations.relu_numpy import relu_relaxation
    else:
        from crown_cli.engine.relaxations.relu import relu_relaxation

    adaptive = method != "fast-lin"
    return lambda l, u: relu_relaxation(l, u, adaptive)


def _leaky_relu(method, alpha):
    if _numpy_kernels():
        from crown_cli.engine.relaxations.relu_numpy import leaky_relu_relaxation
    else:
        from crown_cli.engine.relaxations.extra import leaky_relu_relaxation

    adaptive = method != "fast-lin"
    return lambda l, u: leaky_relu_relaxation(l, u, alpha, adaptive)


def _fixed(module, name):
    """Factory for a parameter-free relaxation ``name`` in submodule ``module``."""
    return lambda method, alpha: getattr(import_module(f"{__name__}.{module}"), name)


def _with_param(module, name):
    """Factory for a relaxation ``name`` in submodule ``module`` that takes the activation's
    parameter after (l, u)."""
    def factory(method, alpha):
        fn = getattr(import_module(f"{__name__}.{module}"), name)
        return lambda l, u: fn(l, u, alpha)

    return factory


def _s_shaped(name):
    """Factory for tanh / sigmoid / arctan: the default lines, or the paper's for
    ``crown-paper``."""

    def factory(method, alpha):
        from crown_cli.engine.relaxations import sigmoid_family

        fn = getattr(sigmoid_family, name)
        if method == "crown-paper":
            return lambda l, u: fn(l, u, True)
        return fn

    return factory


# activation -> factory(method, alpha) -> relaxation function (l, u). Each factory imports
# only its own family's module; all of them are compiled with numba except, under the numpy
# kernels (set_kernels("numpy")), those with a ``numpy_twin`` (crown_cli.activations).
RELAXATIONS = {
    "relu": _relu,
    "leaky_relu": _leaky_relu,
    "tanh": _s_shaped("tanh_relaxation"),
    "sigmoid": _s_shaped("sigmoid_relaxation"),
    "arctan": _s_shaped("arctan_relaxation"),
    "erf": _s_shaped("erf_relaxation"),
    "gelu": _with_param("self_gated", "gelu_relaxation"),
    "silu": _with_param("self_gated", "silu_relaxation"),
    "hardswish": _fixed("self_gated", "hardswish_relaxation"),
    "mish": _fixed("self_gated", "mish_relaxation"),
    "gelu_tanh": lambda method, alpha: _with_param("self_gated", "gelu_tanh_relaxation")(
        method, 0.0 if alpha is None else float(alpha)),  # alpha: the allowance
    "elu": _with_param("extra", "elu_relaxation"),
    "softplus": _fixed("extra", "softplus_relaxation"),
    "softplus_t": _with_param("extra", "softplus_threshold_relaxation"),
    "hard_sigmoid": _with_param("extra", "hard_sigmoid_relaxation"),
    "sin": _fixed("elementary", "sin_relaxation"),
    "cos": _fixed("elementary", "cos_relaxation"),
    "exp": _fixed("elementary", "exp_relaxation"),
    "reciprocal": _fixed("elementary", "reciprocal_relaxation"),
    "square": _fixed("elementary", "square_relaxation"),
    "cube": _fixed("elementary", "cube_relaxation"),
    "sqrt": _fixed("elementary", "sqrt_relaxation"),
    "sign": _fixed("sign", "sign_relaxation"),  # numpy under either kernels
    "floor": _fixed("floor", "floor_relaxation"),  # likewise
}

# Neurons whose relaxation is the same on every sub-interval of [l, u] (the function is linear
# there): bounds proven for a larger ball can stand in for recomputed ones.
INTERVAL_FREE = {
    "relu": lambda l, u, alpha: (l >= 0.0) | (u <= 0.0),
    "leaky_relu": lambda l, u, alpha: (l >= 0.0) | (u <= 0.0),
    "elu": lambda l, u, alpha: l >= 0.0,
    # one linear piece of clip(alpha z + 0.5, 0, 1), decided on alpha z + 0.5 in float as the
    # relaxation itself does
    "hard_sigmoid": lambda l, u, alpha: ((alpha * u + 0.5 <= 0.0) | (alpha * l + 0.5 >= 1.0)
                                         | ((alpha * l + 0.5 >= 0.0) & (alpha * u + 0.5 <= 1.0))),
    "sign": lambda l, u, alpha: (l > 0.0) | (u < 0.0),  # a constant (l = 0: no, sign(0) = 0)
    "floor": lambda l, u, alpha: np.floor(l) == np.floor(u),  # a constant
}

def get_interval_free(activation: str, alpha=None):
    """Mask function (l, u) -> bool array, or None if the activation has none."""
    fn = INTERVAL_FREE.get(activation)
    return None if fn is None else (lambda l, u: fn(l, u, alpha))


def get_relaxation(activation: str, method: str, alpha=None):
    """The relaxation function for ``activation`` under ``method``, or an InputError."""
    if method not in METHODS:
        raise InputError(f"--method: unknown method '{method}' (choose from {', '.join(METHODS)})")
    if activation not in RELAXATIONS:
        raise InputError(
            f"activation '{activation}' has no bound (supported: {', '.join(sorted(RELAXATIONS))})"
        )
    if method == "fast-lin" and not ACTIVATIONS[activation].fast_lin:
        raise InputError(
            f"--method {method} is defined for ReLU-type networks only, not '{activation}'"
        )
    if alpha is None:  # the activation's own default parameter (ELU's 1.0, ...), as forward
        alpha = ACTIVATIONS[activation].default_param
    return RELAXATIONS[activation](method, alpha)

