"""Floating-point rounding allowances: everything a reported bound is widened by.

Every float64 bound the tool reports is widened outward by (1) per back-substitution step,
the rounding of its products charged a posteriori (``|D| @ v_i``, :func:`rounding_weights` /
:func:`step_weights` with unit 2**-53, for the matrix D the step formed: those errors are
relative to |D| |W|, not to the final coefficients, and cancellation makes them arbitrarily
larger than the latter); (2) the rounding of the margin rows C @ W[-1]
(:func:`margin_rows_rounding`); (3) ``FP_RTOL`` times the sum of
the absolute values of the terms of the final sums (constant terms, input terms, dual norm),
which covers gamma_N of those sums for N <= 2**20 roundings per term (larger networks get
N * 2**-52: :func:`final_sum_rtol`); (4) a threshold compared with a bound is rounded up one
ulp first (:func:`round_up`: a decimal literal rounded to nearest may lie below its value).
docs/soundness.md has the whole argument. Arrays in, arrays out.
"""
from __future__ import annotations

import contextlib

import numpy as np

FP_RTOL = 2.0 ** -32  # ~2.3e-10, relative allowance of the final sums (see module docstring)
FP_ATOL = 1e-300
U32 = 2.0 ** -24  # unit roundoff of float32
U64 = 2.0 ** -53  # unit roundoff of float64
ERR_SAFETY = 1.0 + 2.0 ** -20  # covers the float64 rounding of the error bounds themselves
TINY32 = 2.0 ** -149  # smallest float32 subnormal: the absolute error of a product that underflows
TINY64 = 2.0 ** -1074  # the same for float64
_TINY = {U32: TINY32, U64: TINY64}


def gamma_n(n: int, unit: float) -> float:
    """gamma_n = n u / (1 - n u): the relative rounding of a sum or product chain of n
    operations in the format of unit roundoff u."""
    nu = n * unit
    return nu / (1.0 - nu)


def steering_quiet(steer: bool):
    """A context for a pass: for a float32 steering pass (``steer``) numpy's overflow and
    invalid-operation warnings off (float32 may overflow where float64 does not; such a pass
    only steers worse, and proves nothing), for a float64 pass nothing changed."""
    return np.errstate(over="ignore", invalid="ignore") if steer else contextlib.nullcontext()


def round_up(b) -> np.ndarray:
    """b moved one ulp towards +inf (float64): a decimal literal rounded to nearest lies below
    it, so ``bound > round_up(b)`` proves ``bound > b``."""
    return np.nextafter(np.asarray(b, dtype=np.float64), np.inf)


def final_sum_rtol(weights) -> float:
    """The relative allowance of a network's final sums (see the module docstring).

    The longest chain of roundings of one term of a bound is N = max(d, 2 n + L + 5) + 3
    (d inputs, n the widest hidden layer, L weight layers: a product, a sum over at most 2n
    constant terms, L accumulations, the last three additions). Its rounding is at most
    gamma_N = N u / (1 - N u) (u = 2**-53) of the sum of the terms' magnitudes; the
    allowance must also cover the rounding of the widening itself (a few u). FP_RTOL = 2**-32
    does for N <= 2**20 (gamma_N <= 2**-33 (1 + 2**-32)); beyond that N * 2**-52 (= 2 gamma_N
    roughly) is used, which leaves the same margin.
    """
    d = weights[0].shape[1]
    widest = max((w.shape[0] for w in weights[:-1]), default=0)
    n = max(d, 2 * widest + len(weights) + 5) + 3
    return max(FP_RTOL, n * 2.0 ** -52)


def sum_rtol(graph) -> float:
    """The relative allowance of the final sums: gamma_N of N = max(d, 2 w + L + 5) + 3
    roundings per term (d inputs, w the widest node, L nodes), as
    :func:`final_sum_rtol` for a chain."""
    widest = max(n.size for n in graph.nodes)
    n = max(graph.input_size, 2 * widest + len(graph.nodes) + 5) + 3
    return max(FP_RTOL, n * 2.0 ** -52)


def widen(value, mag, sign, rtol=FP_RTOL, extra=0.0):
    """Move ``value`` outward (sign +1: up, -1: down) by the floating-point allowance:
    ``rtol`` of the magnitude sum, FP_ATOL, and ``extra`` (>= 0, e.g. product rounding)."""
    return value + sign * ((rtol * mag + FP_ATOL) + extra)


def rounding_weights(net, i: int, a_prev: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     Wa=None, unit=U32):
    """Weights bounding the rounding of one back-substitution step through hidden layer i,
    with products in the format of unit roundoff ``unit`` (float32: 2**-24, the default;
    float64: 2**-53).

    The step scales a row by the relaxation slopes, D = fl(Lam * slope), and multiplies
    D @ fl(W_i) (inner dimension at most n_i, plus one addition of the two partial products).
    Replacing the exact step by the computed one changes the linear function by a residual
    whose value, at every point of the ball where |a_{i-1}| <= a_prev and z_i lies in
    [lo, hi], is at most |D| @ v + t with

        v = gamma_{n_i + 2} |W_i| a_prev + 2u |W_i| a_prev + 2u (|z_i| + |b_i|),   t per row,

    u = ``unit``: the rounded product (gamma |D| |W_i| against |a_{i-1}|), the rounded weights
    (u |W_i|; float64 weights are exact, the term is then spare), the rounding of D when
    stored (u |D|, against z_i - b_i = W_i a_{i-1}; in float64 D is rounded once and the
    constant uses the same D, so u |D| |z_i| would do). ``t`` covers products that underflow
    (the smallest subnormal each). Returns (v, t); v in float64, rounded up by ERR_SAFETY
    (which covers the float64 rounding of this computation: non-negative terms only).
    ``Wa`` may hold |W_i| a_prev if the caller has it.
    """
    if Wa is None:
        Wa = net.abs_weights(i) @ a_prev
    return step_weights(net.W[i].shape[0], Wa, np.abs(net.b[i]), float(np.sum(a_prev)), lo, hi,
                        unit)


def step_weights(n: int, Wa, absb, a_prev_sum, lo, hi, unit=U64):
    """The (v, t) of :func:`rounding_weights` from arrays, for one input set or a batch of
    them (leading axes): ``n`` the rows of W_i, ``Wa`` (..., n) a bound of |W_i| |a_{i-1}|,
    ``absb`` (n,) = |b_i|, ``a_prev_sum`` (...) the sum of the |a_{i-1}| bound, ``lo``,
    ``hi`` (..., n) the interval of z_i. Every caller's rounding charge is this formula."""
    try:
        tiny = _TINY[unit]
    except KeyError:
        raise ValueError(f"rounding_weights: unit must be 2**-24 or 2**-53, got {unit!r}") from None
    gamma = gamma_n(n + 2, unit) + 2.0 * unit
    z = np.maximum(np.abs(lo), np.abs(hi))
    v = ERR_SAFETY * (gamma * Wa + 2.0 * unit * (z + absb))
    t = ERR_SAFETY * tiny * (n * a_prev_sum + np.sum(z + absb, axis=-1) + n)
    return v, t


def margin_rows_rounding(m: int, CWa, Cb):
    """The rounding of ``C @ W[-1]`` and ``C @ b[-1]`` in float64 as it acts on the set:
    gamma_m (|C| |W[-1]| |a_h| + |C| |b[-1]|), from its two products, in any batch shape:
    ``CWa`` = |C| |W[-1]| |a_h|, ``Cb`` = |C| |b[-1]|, m the number of outputs (the inner
    dimension of C @ W[-1])."""
    return ERR_SAFETY * gamma_n(m, U64) * (CWa + Cb + m * TINY64)
