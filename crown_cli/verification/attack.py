"""Counterexample search for one VNN-LIB case: a point x in [lo, hi] with ``A f(x) <= b``.

Projected sign-gradient descent (PGD for an l_inf box) on ``m(x) = max_i (A_i f(x) - b_i)``,
whose value is <= 0 exactly at violations. The gradient is that of a row attaining the max (a
subgradient), computed in float32 by the attack module's forward/backward passes; on ReLU
networks most starts pass a small slope back through inactive neurons instead of 0
(``SURROGATE_LEAKS``), so that neurons off around a start still steer it. Many starts
run as one batch: the box's centre, a few random corners, the rest uniform in the box. The
step size decays linearly from half to a fiftieth of the box's width (per coordinate), and
every step is clipped back into the box.

Float32 values only nominate candidates: a point is returned only after
:func:`check_counterexample` accepts it (inside the box exactly, and ``A f(x) <= b`` for every
row by a float64 forward pass, ``activations.forward``). The check is in float64 arithmetic,
not exact: a point with ``A_i f(x) - b_i`` within rounding of 0 may be accepted or refused.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from crown_cli.activations import ACTIVATIONS, default_alpha
from crown_cli.certification.attack import forward_with_preactivations, input_gradient
from crown_cli.errors import InputError
from crown_cli.verification.outcome import violations

DEFAULT_RESTARTS = 16
DEFAULT_STEPS = 50
# ReLU networks: the starts take turns at these backward slopes for inactive neurons (the
# forward pass stays exact). With the true gradient (0) a neuron that is off everywhere near
# the start never shows in the gradient: on mnistfc's 256x6 network, where a deep layer has a
# single active neuron, no start of 100 got nearer than +0.73 to a violation with it, while
# slopes 0.02-0.05 found violations (-0.9) of a property other tools had found violated.
SURROGATE_LEAKS = (0.0, 0.05, 0.02, 0.1)


def _gradient(weights, zs, activation, g, alpha, leaks):
    """input_gradient, but for ReLU with per-row slopes ``leaks`` (R,) on the inactive side."""
    if leaks is None:
        return input_gradient(weights, zs, activation, g, alpha)
    for k in range(len(zs) - 1, -1, -1):
        g = (g * np.where(zs[k] > 0, np.float32(1.0), leaks[:, None])) @ weights[k]
    return g


def _as_case(lo, hi, A, b):
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    A = np.asarray(A, dtype=np.float64)
    if A.ndim == 1:
        A = A[None, :]
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if A.ndim != 2 or A.shape[0] != b.size:
        raise ValueError("A must be (m, n_outputs) and b (m,)")
    return lo, hi, A, b


def check_counterexample(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                         activation: str, alpha, lo, hi, A, b, x) -> bool:
    """True iff lo <= x <= hi (exactly, x finite) and ``A f(x) <= b`` in every row, with f the
    float64 forward pass ``activations.forward``."""
    lo, hi, A, b = _as_case(lo, hi, A, b)
    x = np.asarray(x, dtype=np.float64)
    if x.shape != lo.shape:
        return False
    return bool(violations(weights, biases, activation, alpha, lo, hi, A, b, x)[0])


def _starts(lo, hi, n, rng):
    """n starting points (n, d): the centre, up to 4 random corners, then uniform points."""
    d = lo.size
    X = lo + rng.uniform(size=(n, d)) * (hi - lo)
    X[0] = 0.5 * lo + 0.5 * hi
    corners = min(4, n - 1)
    if corners > 0:
        X[1:1 + corners] = np.where(rng.integers(0, 2, size=(corners, d)) == 1, hi, lo)
    return np.clip(X, lo, hi)


@dataclass(frozen=True)
class AttackSettings:
    """The settings of a counterexample search: ``restarts`` starting points run as one batch
    for ``steps`` sign-gradient steps each, drawn from ``seed``."""

    restarts: int = DEFAULT_RESTARTS
    steps: int = DEFAULT_STEPS
    seed: int = 0


def find_counterexample(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                        activation: str, alpha, lo, hi, A, b, *,
                        deadline: Optional[float] = None, **settings) -> Optional[np.ndarray]:
    """A verified x in [lo, hi] with ``A f(x) <= b`` (every row), or None if none was found.

    ``settings``: the fields of :class:`AttackSettings` (keywords); ``deadline`` is a
    ``time.monotonic()`` instant after which the search stops (checked once per step). None
    never proves anything: the property may still be violated.
    """
    found = find_counterexample_any(weights, biases, activation, alpha, lo, hi, [(A, b)],
                                    deadline=deadline, **settings)
    return None if found is None else found[1]


def find_counterexample_any(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                            activation: str, alpha, lo, hi, cases, *,
                            deadline: Optional[float] = None, **settings):
    """(j, x): a verified x in [lo, hi] with ``A_j f(x) <= b_j`` for one of the output
    conjunctions ``cases`` = [(A_j, b_j), ...] sharing this box, or None. ``settings``: the
    fields of :class:`AttackSettings` (keywords).

    One batch of starts descends on ``min_j max_i (A_j f(x) - b_j)_i``: the gradient is that
    of the row attaining the max in the case attaining the min, so each start heads for the
    case it is nearest to violating (one run instead of one per case: mnistfc's properties
    have nine single-row cases on one box).
    """
    o = AttackSettings(**settings)
    restarts, steps, seed = o.restarts, o.steps, o.seed
    if activation not in ACTIVATIONS:
        raise InputError(f"no gradient for activation '{activation}'")
    if restarts < 1 or steps < 0:
        raise ValueError("find_counterexample: restarts >= 1 and steps >= 0 required")
    parsed = [_as_case(lo, hi, A_, b_) for A_, b_ in cases]
    if not parsed:
        return None
    lo, hi = parsed[0][0], parsed[0][1]
    if lo.shape != hi.shape or np.any(lo > hi):
        raise ValueError("find_counterexample: need lo <= hi of one shape")
    if alpha is None:
        alpha = default_alpha(activation)
    W64 = [np.asarray(w, dtype=np.float64) for w in weights]
    b64 = [np.asarray(v, dtype=np.float64) for v in biases]
    W32 = [w.astype(np.float32) for w in W64]
    B32 = [v.astype(np.float32) for v in b64]
    A = np.concatenate([p[2] for p in parsed])
    G_out = A.astype(np.float32) @ W32[-1]  # d (A f) / d a_last, one row per constraint

    def passes(X):
        return forward_with_preactivations(W32, B32, activation, X, alpha)

    def gradient(zs, j, leaks):
        return _gradient(W32, zs, activation, G_out[j], alpha, leaks)

    def check(X, A_j, b_j):
        return violations(W64, b64, activation, alpha, lo, hi, A_j, b_j, X)

    return descend(passes, gradient, check, parsed, restarts, steps, seed, deadline,
                   surrogate=activation == "relu", dtype=np.float32)


def descend(passes, gradient, check, parsed, restarts: int, steps: int, seed: int,
            deadline: Optional[float], surrogate: bool, dtype=np.float32):
    """The search of :func:`find_counterexample_any` for any network, given as functions:
    ``passes(X)`` -> (outputs (N, n_out) in ``dtype``, state for the gradient);
    ``gradient(state, j, leaks)`` -> input gradients (N, d) of the rows ``j`` (N,) of the
    concatenated A at each point (``leaks``: per point, the ReLU surrogate slope, or None);
    ``check(X, A_j, b_j)`` -> the float64 counterexample check
    (:func:`crown_cli.verification.outcome.violations`) of each row of X for one case.
    ``parsed``: the cases [(lo, hi, A_j, b_j)] of one box. ``surrogate``: use
    ``SURROGATE_LEAKS`` (ReLU networks)."""
    lo, hi = parsed[0][0], parsed[0][1]
    A = np.concatenate([p[2] for p in parsed])
    b = np.concatenate([p[3] for p in parsed])
    case_of = np.concatenate([np.full(p[2].shape[0], j) for j, p in enumerate(parsed)])
    n_cases = len(parsed)

    def verified(X, order=None):
        for j, (_, _, A_j, b_j) in enumerate(parsed) if order is None else \
                ((j, parsed[j]) for j in order):
            ok = check(X, A_j, b_j)
            if ok.any():
                return j, X[int(np.argmax(ok))].copy()
        return None

    rng = np.random.default_rng(seed)
    X = _starts(lo, hi, int(restarts), rng)
    if any(p[2].shape[0] == 0 for p in parsed):  # no output constraint: every point violates
        return verified(X[:1])
    A32, b32 = A.astype(dtype), b.astype(dtype)
    leaks = None
    if surrogate:  # per start its backward slope of the inactive side
        leaks = np.resize(np.asarray(SURROGATE_LEAKS, dtype), X.shape[0])
    # the search's float32 passes and gradients may overflow (an Exp node far out, a
    # reciprocal near 0): such a start only searches worse (a NaN step is no step); every
    # candidate is decided by the float64 check
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _descend_steps(passes, gradient, verified, (A32, b32, case_of, n_cases),
                              (X, lo, hi, leaks), steps, deadline)


def _descend_steps(passes, gradient, verified, rows, state, steps: int, deadline):
    """:func:`descend`'s sign-gradient steps from the starts X: ``rows`` = (A, b as float32,
    each row's case, the case count), ``state`` = (X, lo, hi, leaks)."""
    A32, b32, case_of, n_cases = rows
    X, lo, hi, leaks = state
    width = hi - lo
    for k in range(int(steps) + 1):
        f, zs = passes(X)
        # an output beyond float32 (inf) that a row does not read must not make it NaN
        R = np.nan_to_num(f) @ A32.T - b32  # (N, rows of all cases)
        if n_cases == 1:
            j = np.argmax(R, axis=1)
            m = R[np.arange(X.shape[0]), j]
            best = np.zeros(X.shape[0], dtype=int)
        else:  # per case its worst row; per start the case nearest to violation
            worst = np.full((X.shape[0], n_cases), -np.inf, dtype=R.dtype)
            arg = np.zeros((X.shape[0], n_cases), dtype=int)
            for c in range(n_cases):
                cols = np.flatnonzero(case_of == c)
                k_ = np.argmax(R[:, cols], axis=1)
                arg[:, c] = cols[k_]
                worst[:, c] = R[np.arange(X.shape[0]), cols[k_]]
            best = np.argmin(worst, axis=1)
            j = arg[np.arange(X.shape[0]), best]
            m = worst[np.arange(X.shape[0]), best]
        # float32 values only nominate candidates; the float64 check decides
        near = np.flatnonzero(m <= 1e-5 * (1.0 + np.abs(R).max()))
        if near.size:
            srt = near[np.argsort(m[near])]
            found = verified(X[srt], order=list(dict.fromkeys(best[srt].tolist())))
            if found is not None:
                return found
        if k == steps or (deadline is not None and time.monotonic() > deadline):
            break
        G = np.nan_to_num(gradient(zs, j, leaks), nan=0.0)  # a NaN step is no step
        step = (0.02 + 0.48 * (1.0 - k / max(steps, 1))) * width
        X = np.clip(X - step * np.sign(G).astype(np.float64), lo, hi)
    return None
