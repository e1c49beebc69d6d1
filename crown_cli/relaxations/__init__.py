"""Registry of activation relaxations: activation name -> function (l, u, method) -> slopes.

Each entry returns ``(aU, bU, aL, bL)`` arrays such that ``aL*z + bL <= act(z) <= aU*z + bU``
on ``[l, u]`` elementwise. Adding an activation is adding one entry to ``RELAXATIONS``.
"""
from ..errors import InputError
from .relu import relu_relaxation

METHODS = ("crown", "fast-lin")


def _relu(l, u, method):
    return relu_relaxation(l, u, method == "crown")


RELAXATIONS = {
    "relu": _relu,
}

# Neurons whose relaxation is the same on every sub-interval of [l, u]: bounds proven for a
# larger ball can stand in for recomputed ones (stable ReLUs are the identity or zero).
INTERVAL_FREE = {
    "relu": lambda l, u: (l >= 0.0) | (u <= 0.0),
}


def get_interval_free(activation: str):
    """Mask function (l, u) -> bool array, or None if the activation has none."""
    return INTERVAL_FREE.get(activation)


def get_relaxation(activation: str, method: str):
    """The relaxation function for ``activation`` under ``method``, or an InputError."""
    if method not in METHODS:
        raise InputError(f"--method: unknown method '{method}' (choose from {', '.join(METHODS)})")
    if activation not in RELAXATIONS:
        raise InputError(
            f"activation '{activation}' has no bound yet (supported: {', '.join(sorted(RELAXATIONS))})"
        )
    if method == "fast-lin" and activation != "relu":
        raise InputError(f"--method fast-lin is defined for ReLU networks only, not '{activation}'")
    return lambda l, u: RELAXATIONS[activation](l, u, method)
