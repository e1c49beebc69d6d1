"""Comparison methods of the paper beyond CROWN and Fast-Lin, behind a small registry.

Two kinds of method:

- ``bound``: a lower bound of the margins over a ball. ``bind(...)`` returns
  ``fn(x0, eps, C, deadline=None) -> (r,) array`` (lower bounds of ``C @ f(x)`` over the l_p
  ball of radius eps around x0), searched for the certified radius by
  :func:`crown_cli.engine.radius_search.certified_radius` exactly like CROWN's bound. A slow one may take
  a keyword ``deadline`` and raise :class:`crown_cli.engine.deadline.DeadlineExceeded` once
  time.monotonic() passes it (``--timeout``; the row gets status ``timeout``; lp-full does).
  (fast-lip, lp-full.)
- ``radius``: the radius directly. ``bind(...)`` returns
  ``fn(x0, c, targets, C, g0, eps0, eps_max, timeout) -> RadiusOutcome``. (op-norm, exact.)

CROWN-Quad (``quad``, quadratic ReLU bounds for 2-layer networks, paper Section 3.3) is wired
into :class:`crown_cli.certification.certifier.Certifier` directly: it runs CROWN's search first and starts
its own float64 search from CROWN's radius.

Adding a method is one :func:`register` call with a :class:`Method`: its name, kind, a
``check(activation, alpha, norm, weights)`` returning None or the reason the model/norm is
not supported, and ``bind(weights, biases, activation, alpha, norm)``. For example a bound
function ``my_lower_bound(weights, biases, x0, eps, norm, C)`` registers as
``Method("my-method", "bound", check, lambda w, b, act, alpha, norm:
lambda x0, eps, C: my_lower_bound(w, b, x0, eps, norm, C))``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np

from crown_cli.errors import InputError


@dataclass(frozen=True)
class Method:
    name: str
    kind: str  # "bound" or "radius"
    check: Callable  # (activation, alpha, norm, weights) -> Optional[str]
    bind: Callable  # (weights, biases, activation, alpha, norm) -> fn
    description: str = ""


@dataclass
class RadiusOutcome:
    eps: Optional[float]  # None when no radius is reported (timeout)
    lower_bound: Optional[float]  # the margin's lower bound at eps, if the method has one
    evaluations: int  # solver calls / bound evaluations
    status: str


REGISTRY: Dict[str, Method] = {}


def register(method: Method) -> None:
    REGISTRY[method.name] = method


def names():
    return tuple(REGISTRY)


def get_method(name: str) -> Method:
    try:
        return REGISTRY[name]
    except KeyError:
        raise InputError(f"--method: unknown method '{name}'") from None


# The comparison methods widen each float64 operation by FP_RTOL = 2^-32 of its magnitude,
# which covers the rounding gamma_N of a sum of N terms for N <= 2^20 (docs/soundness.md). The
# longest sum they form (LP-Full's dual bound: a term per constraint and per variable, l_1
# splitting each input in two) has fewer terms than 2 (inputs + hidden neurons) + 8.
MAX_TERMS = 2 ** 20


def _check_size(weights) -> Optional[str]:
    d = np.shape(weights[0])[1]
    n = 2 * (d + sum(np.shape(w)[0] for w in weights[:-1])) + 8
    if n > MAX_TERMS:
        return (f"the network is too large for this method's rounding allowance ({n} > 2^20 "
                "terms per sum, 2 x (inputs + hidden neurons)); use --method crown")
    return None


def bind_method(name: str, weights, biases, activation: str, alpha, norm: str):
    """(kind, fn) for ``name`` on this model and norm, or an InputError naming the method and
    what it does not support."""
    m = get_method(name)
    problem = m.check(activation, alpha, norm, weights) or _check_size(weights)
    if problem:
        raise InputError(f"--method {name}: {problem}")
    return m.kind, m.bind(weights, biases, activation, alpha, norm)


# --------------------------------------------------------------------------------------------
# the built-in methods
# --------------------------------------------------------------------------------------------

_NORM_NAMES = {"inf": "l_inf", "2": "l_2", "1": "l_1"}


def _relu_only(activation, allowed=("relu",)):
    if activation not in allowed:
        kinds = " and ".join(allowed)
        return f"activation '{activation}' is not supported ({kinds} networks only)"
    return None


def _check_fast_lip(activation, alpha, norm, weights):
    return _relu_only(activation, ("relu", "leaky_relu"))


def _bind_fast_lip(weights, biases, activation, alpha, norm):
    from crown_cli.engine.dense_crown import Network
    from crown_cli.certification.methods.fast_lip import fast_lip_lower_bound

    net = Network(weights, biases)
    return lambda x0, eps, C: fast_lip_lower_bound(net.W, net.b, x0, eps, norm, C, activation,
                                                   alpha, net=net)


def _check_op_norm(activation, alpha, norm, weights):
    from crown_cli.certification.methods._common import lipschitz_constant

    if lipschitz_constant(activation, alpha) is None:
        return f"activation '{activation}' has no known Lipschitz constant"
    return None


def _bind_op_norm(weights, biases, activation, alpha, norm):
    from crown_cli.certification.methods.op_norm import hidden_factor, lipschitz_bounds, lower_bound_at, op_norm_radius
    from crown_cli.certification.methods._common import center_margins

    W = [np.asarray(w, dtype=np.float64) for w in weights]
    b = [np.asarray(v, dtype=np.float64) for v in biases]
    hidden = hidden_factor(W, activation, alpha, norm)

    def fn(x0, c, targets, C, g0, eps0, eps_max, timeout):
        eps, lb = op_norm_radius(W, b, x0, norm, C, activation, alpha, hidden)
        if eps == 0.0:
            return RadiusOutcome(0.0, lb, 1, "not-certified")
        if eps > eps_max:
            _, g_low = center_margins(W, b, activation, alpha, C, x0)
            L = lipschitz_bounds(W, activation, alpha, C, norm, hidden)
            return RadiusOutcome(eps_max, lower_bound_at(g_low, L, eps_max), 1, "capped")
        return RadiusOutcome(eps, lb, 1, "certified")

    return fn


def _check_lp_full(activation, alpha, norm, weights):
    if norm == "2":
        return ("the l_2 ball makes the LP a second-order-cone program, and no conic solver "
                "is available; use --norm inf or 1")
    return _relu_only(activation)


def _bind_lp_full(weights, biases, activation, alpha, norm):
    from crown_cli.engine.dense_crown import Network
    from crown_cli.certification.methods.lp_full import lp_full_lower_bound

    net = Network(weights, biases)
    return lambda x0, eps, C, deadline=None: lp_full_lower_bound(net.W, net.b, x0, eps, norm, C,
                                                                 net=net, deadline=deadline)


def _check_exact(activation, alpha, norm, weights):
    if norm not in ("inf", "1"):
        return (f"norm {_NORM_NAMES[norm]} is not supported (the MILP needs a polyhedral ball: "
                "--norm inf or 1)")
    return _relu_only(activation)


def _bind_exact(weights, biases, activation, alpha, norm):
    from crown_cli.engine.dense_crown import Network
    from crown_cli.certification.methods.exact import min_distortion

    net = Network(weights, biases)

    def fn(x0, c, targets, C, g0, eps0, eps_max, timeout):
        if not g0 > 0:
            return RadiusOutcome(0.0, None, 0, "optimal")
        res = min_distortion(net, x0, c, targets, norm, timeout=timeout, eps_start=eps0,
                             eps_max=eps_max)
        return RadiusOutcome(res.eps, None, res.solves, res.status)

    return fn


register(Method("fast-lip", "bound", _check_fast_lip, _bind_fast_lip,
                "local Lipschitz bound from Fast-Lin's activation bounds (Weng et al. 2018)"))
register(Method("op-norm", "radius", _check_op_norm, _bind_op_norm,
                "global Lipschitz bound from per-layer operator norms"))
register(Method("lp-full", "bound", _check_lp_full, _bind_lp_full,
                "per-neuron LP relaxation bounds solved exactly (HiGHS)"))
register(Method("exact", "radius", _check_exact, _bind_exact,
                "minimum adversarial distortion by MILP (HiGHS)"))
