"""Counterexamples on graphs with jumps (Sign and Floor nodes): is the float64 forward pass's
value of each jump node the one exact arithmetic gives it?

A counterexample is confirmed by the float64 forward pass (:mod:`crown_cli.verification.outcome`).
For a continuous network a rounding error moves the outputs by about as much; Sign jumps by 2
at 0 and Floor by 1 at each integer, so an input within rounding of a jump may take the other
value exactly and change the output by the full jump. :func:`decided_outputs` is the forward
pass the counterexample checks of graphs use: on a graph with jump nodes, a point where some
jump's input is not decided gets NaN outputs (NaN satisfies no row of ``A y <= b``, so the
point is refused).

Per node and point, the forward pass carries a bound e on |exact value - float value|:
the input 0; an affine node with k products summed per element (``terms_fwd``, the bias
counted) ``|W| e_in`` plus its own rounding ``gamma_k (|W| |x| + |b|)`` (any summation
order), or nothing when it is exact: every input and coefficient an integer, no input error,
and ``|W| |x| + |b| < 2^53`` (binarised layers on -1/+1 values: their sums are exact integers,
0 included); a max pool the window's largest e; a product ``x y`` of data
``|x| e_y + |y| e_x + e_x e_y`` plus one rounding of ``|x y|``; Sign 0 where ``|z| > e`` or
``z = e = 0``, Floor 0 where z's distance to the nearest integer exceeds e or is 0 with
e = 0, else the point is refused; any other activation its Lipschitz constant on
``[z - e, z + e]`` times e plus 16 ulps of its value and of 1 (libm's error; sigmoid's
0.5 (1 + tanh)), plus a fused GELU tanh chain's allowance (its float32 constants). Each
bound is rounded up by a relative 2 gamma_{k+2}.
"""
from __future__ import annotations

import numpy as np

U = 2.0 ** -53
TINY = 2.0 ** -1074
EXACT_INTS = 2.0 ** 53


def _gamma(k: int) -> float:
    return k * U / (1.0 - k * U)


def _lipschitz(op, z, e):
    """The activation's Lipschitz constant on [z - e, z + e] (elementwise)."""
    a, name = op.alpha, op.name
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        far = np.abs(z) + e
        if name == "exp":
            return np.exp(z + e)
        if name == "square":
            return 2.0 * far
        if name == "cube":
            return 3.0 * far * far
        if name == "reciprocal":
            near = np.abs(z) - e
            return np.where(near > 0.0, 1.0 / (near * near), np.inf)
        if name == "sqrt":  # 1 / (2 sqrt t), largest at the interval's lower end
            near = z - e
            return np.where(near > 0.0, 0.5 / np.sqrt(near), np.inf)
    return {"relu": 1.0, "leaky_relu": max(1.0, abs(a or 0.0)), "tanh": 1.0, "sigmoid": 0.25,
            "arctan": 1.0, "erf": 1.1283791670955128, "gelu": 1.1289041451851549,
            "silu": 1.0998393201288670, "hardswish": 1.5, "softplus_t": 1.0, "mish": 1.0884981612517280,
            "gelu_tanh": 1.128993068658772, "elu": max(1.0, abs(a or 0.0)), "softplus": 1.0,
            "hard_sigmoid": abs(a or 0.0), "linear": 1.0, "sin": 1.0, "cos": 1.0}[name]


STEPS = ("sign", "floor")  # piecewise constant: exact where the input's side is decided
JUMPS = STEPS + ("softplus_t",)  # softplus_t: Where(z > T, z, softplus(z))


def _jump_decided(name, z, e):
    """Per point: whether every element's jump takes its float value in exact arithmetic."""
    if name == "sign":
        return np.all((np.abs(z) > e) | ((z == 0.0) & (e == 0.0)), axis=1)
    d = np.abs(z - np.round(z))  # exact below 2^52; above, every float is an integer (d = 0)
    return np.all((d > e) | ((d == 0.0) & (e == 0.0)), axis=1)


def _ints(a) -> bool:
    a = getattr(a, "data", a)  # a scipy.sparse matrix's nonzeros
    return a is None or bool(np.all(np.asarray(a, np.float64) == np.round(a)))


def _integer_coefficients(op) -> bool:
    """Whether every coefficient and bias of an affine operation is an integer (cached)."""
    hit = getattr(op, "_integer_coefficients", None)
    if hit is None:
        arrays = [getattr(op, name, None) for name in ("W", "weight", "a", "bias")]
        arrays.append(np.asarray(getattr(op, "signs", []), np.float64))
        hit = all(_ints(a) for a in arrays)
        op._integer_coefficients = hit
    return hit


def _affine_error(op, xs, es, exact_in):
    """(e_out, exact_out): the error bound of an affine node's values and, per point, whether
    they are exact integers."""
    k = int(op.terms_fwd)
    e = op.forward_abs(es) if any(np.any(v) for v in es) else 0.0
    if k == 0:  # an index map: a gather and constants, no arithmetic
        return e + np.zeros((xs[0].shape[0], op.size)), exact_in
    mag = op.forward_abs([np.abs(x) for x in xs])
    if op.bias is not None:
        mag = mag + np.abs(op.bias)
    rounding = _gamma(k) * mag + k * TINY
    exact = exact_in & _integer_coefficients(op) & (mag.max(axis=1) < EXACT_INTS)
    rounding[exact] = 0.0
    e = (e + rounding) * (1.0 + 2.0 * _gamma(k + 2))
    return e, exact


def decided(graph, vals) -> np.ndarray:
    """Per point (N,) of the forward pass ``vals`` (:meth:`Graph.forward` with
    ``return_all``): whether every jump node's input has the float value's side of its jumps
    in exact arithmetic."""
    N = vals[0].shape[0] if vals[0] is not None else 1
    ok = np.ones(N, bool)
    err, exact = [None] * len(graph.nodes), [None] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        if n.kind == "input":
            v = vals[i]
            err[i] = np.zeros_like(v)
            exact[i] = np.all(v == np.round(v), axis=1)
            continue
        xs = [vals[j] for j in n.inputs]
        es = [err[j] for j in n.inputs]
        ex = np.logical_and.reduce([exact[j] for j in n.inputs])
        if n.kind == "affine":
            err[i], exact[i] = _affine_error(n.op, xs, es, ex)
        elif n.kind == "maxpool":
            err[i], exact[i] = n.op.forward(es), ex
        elif n.kind == "product":
            (x, y), (ex_, ey) = xs, es
            with np.errstate(over="ignore", invalid="ignore"):
                e = np.abs(x) * ey + np.abs(y) * ex_ + ex_ * ey + U * np.abs(vals[i])
            err[i], exact[i] = e * (1.0 + 4.0 * U) + TINY, np.zeros(N, bool)
        elif n.op.name in STEPS:
            ok &= _jump_decided(n.op.name, xs[0], es[0])
            err[i], exact[i] = np.zeros_like(xs[0]), np.ones(N, bool)
        else:
            if n.op.name == "softplus_t":  # the side of T decided, then 1-Lipschitz
                ok &= np.all(np.abs(xs[0] - n.op.alpha) > es[0], axis=1)
            with np.errstate(over="ignore", invalid="ignore"):
                e = _lipschitz(n.op, xs[0], es[0]) * es[0] * (1.0 + 4.0 * U) \
                    + 16.0 * U * (np.abs(vals[i]) + 1.0)
                if n.op.name == "gelu_tanh" and n.op.alpha:  # the fused chain's allowance
                    e = e + n.op.alpha
            err[i], exact[i] = e + 8.0 * TINY, np.zeros(N, bool)
    return ok


def has_jumps(graph) -> bool:
    return any(n.kind == "activation" and n.op.name in JUMPS for n in graph.nodes)


def decided_outputs(graph, X) -> np.ndarray:
    """:meth:`Graph.forward` of a batch X (N, inputs), with NaN outputs at the points where
    some jump node's input is not decided (:func:`decided`); the plain forward pass on graphs
    without jump nodes."""
    if not has_jumps(graph):
        return graph.forward(X)
    X = np.asarray(X, np.float64)
    one = X.ndim == 1
    Y, vals = graph.forward(np.atleast_2d(X), return_all=True)
    Y = np.array(Y, dtype=np.float64)
    Y[~decided(graph, vals)] = np.nan
    return Y[0] if one else Y
