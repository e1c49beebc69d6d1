"""A slow, plain-numpy twin of the CROWN engine, used only by the tests.

It follows Theorem 3.2 literally with dense matrices: no column skipping, no shared chains,
no floating-point widening. Its results must match crown_cli.engine.dense_crown to rounding.
"""
import numpy as np

DUAL = {"inf": lambda A: np.abs(A).sum(1), "2": lambda A: np.sqrt((A * A).sum(1)),
        "1": lambda A: np.abs(A).max(1)}


def relu_relaxation_numpy(l, u, method="crown"):
    """(aU, bU, aL, bL) for ReLU on [l, u], as in the paper's Section 3.1."""
    unstable = (l < 0) & (u > 0)
    active = l >= 0
    s = np.where(unstable, u / np.where(unstable, u - l, 1.0), 0.0)
    aU = np.where(active, 1.0, s)
    bU = np.where(unstable, -s * l, 0.0)
    if method == "crown":
        aL = np.where(active, 1.0, np.where(unstable & (u >= -l), 1.0, 0.0))
    else:
        aL = aU.copy()
    return aU, bU, aL, np.zeros_like(l)


def _bound(Lam, const, weights, biases, relax, x0, eps, norm, upper):
    """Upper (or lower) bound of Lam @ a_h + const, h = len(relax) - 1, over the ball."""
    Lam = Lam.copy()
    const = const.copy()
    for i in range(len(relax) - 1, -1, -1):
        aU, bU, aL, bL = relax[i]
        pos = Lam >= 0
        if upper:
            slope, inter = np.where(pos, aU, aL), np.where(pos, bU, bL)
        else:
            slope, inter = np.where(pos, aL, aU), np.where(pos, bL, bU)
        const = const + (Lam * inter).sum(1)
        D = Lam * slope
        const = const + D @ biases[i]
        Lam = D @ weights[i]
    sign = 1.0 if upper else -1.0
    return Lam @ x0 + sign * eps * DUAL[norm](Lam) + const


def reference_bounds(weights, biases, x0, eps, norm="inf", method="crown", C=None, relaxation=None):
    """Pre-activation bounds [(l, u), ...] of every layer; the last layer is C @ logits if C given.

    ``relaxation(l, u) -> (aU, bU, aL, bL)`` replaces the ReLU relaxation for other activations.
    """
    weights = [np.asarray(w, float) for w in weights]
    biases = [np.asarray(b, float) for b in biases]
    if C is not None:
        weights[-1] = C @ weights[-1]
        biases[-1] = C @ biases[-1]
    relax, out = [], []
    for k in range(len(weights)):
        if k == 0:
            c = weights[0] @ x0 + biases[0]
            r = eps * DUAL[norm](weights[0])
            l, u = c - r, c + r
        else:
            l = _bound(weights[k], biases[k], weights, biases, relax, x0, eps, norm, False)
            u = _bound(weights[k], biases[k], weights, biases, relax, x0, eps, norm, True)
        out.append((l, u))
        if k < len(weights) - 1:
            relax.append(relu_relaxation_numpy(l, u, method) if relaxation is None
                         else relaxation(l, u))
    return out
