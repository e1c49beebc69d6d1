"""What a verification ends with: the verdict vocabulary, the result of a branch-and-bound
search, and the one check that makes a point a counterexample.

A ``sat`` verdict is only as good as its counterexample: :func:`violations` accepts a point
when it is finite, lies in the box exactly, and a float64 forward pass
(:func:`crown_cli.activations.forward`, or a graph's :meth:`Graph.forward` through
:func:`violations_of`) puts its outputs in the unsafe set. Every search
(attack, input splitting, ReLU splitting) hands its candidates to this function and nothing
else. The check is float64 arithmetic, not exact: a point with ``A_i f(x) - b_i`` within
rounding of 0 may be accepted or refused.

The searches run on a case's float box, which contains the real box of the VNN-LIB decimals
(rounded outward by one ulp where inexact). Before a ``sat`` verdict leaves a verifier,
:func:`confirm_sat` checks its point against the exact set (``Case.exact``: the floats inside
the real box, the right-hand sides rounded down), clipping it into the box first; a point it
cannot confirm turns the verdict into ``unknown``. Where the real box holds no float
(inputs pinned to decimals between two floats), the point is confirmed at the exact decimals
by a float64-verified bound instead (:func:`_confirm_pinned`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from crown_cli.activations import forward
from crown_cli.io.vnnlib import decimal_text

# The verdict of a property, a case or a search. A result row of an instance list may also
# say "error" (ROW_RESULTS).
VERDICTS = ("sat", "unsat", "unknown", "timeout")
ROW_RESULTS = VERDICTS + ("error",)


def finish(steps):
    """Run a search generator (``relu_split_steps``, ``input_split_steps``) to its end;
    returns its :class:`BabResult`."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


@dataclass
class BabResult:
    """The end of one branch-and-bound search (input splitting or ReLU splitting)."""

    verdict: str  # one of VERDICTS
    x: Optional[np.ndarray]  # counterexample (sat): accepted by violations(), else None
    domains: int  # domains (sub-boxes, or ReLU-split subdomains) bounded; the root counts one
    peak_open: int  # most open domains held at once
    # min over the open domains of the best row's (lower bound - b) (b rounded up); nan when
    # none is open. Input splitting: float64 bounds (with split="sensitivity" the parents');
    # ReLU splitting: the float32 estimates that order its queue
    worst_bound: float
    time_s: float = 0.0
    batches: int = 0  # batches of domains bounded (ReLU splitting)
    proven: int = 0  # domains proven empty (ReLU splitting leaves)
    splits: int = 0  # sub-boxes split (input splitting)
    note: str = ""  # why a search ended in unknown


def violations(weights, biases, activation: str, alpha, lo, hi, A, b, X,
               gstart: Optional[np.ndarray] = None) -> np.ndarray:
    """For each row of X (N, d): is it a verified counterexample? (N,) bool.

    A row is one when it is finite, ``lo <= x <= hi`` exactly, and its float64 outputs y
    satisfy every row of ``A y <= b``; with ``gstart`` (the first row of each case, rows of A
    grouped by case) every row of some one case. ``alpha``: the activation's parameter
    (None: its default)."""
    return violations_of(lambda Z: forward(weights, biases, activation, Z, alpha),
                         lo, hi, A, b, X, gstart)


def violations_of(outputs: Callable[[np.ndarray], np.ndarray], lo, hi, A, b, X,
                  gstart: Optional[np.ndarray] = None) -> np.ndarray:
    """:func:`violations` for any network: ``outputs`` its float64 forward pass of a batch
    (N, d) -> (N, outputs), e.g. :meth:`crown_cli.graph.network.Graph.forward`."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[None, :]
    inside = np.all(np.isfinite(X), axis=1) & np.all((X >= lo) & (X <= hi), axis=1)
    ok = np.zeros(X.shape[0], dtype=bool)
    if not inside.any():
        return ok
    rows = np.flatnonzero(inside)
    Y = np.asarray(outputs(X if rows.size == X.shape[0] else X[rows]), dtype=np.float64)
    R = Y @ np.asarray(A, dtype=np.float64).T <= b
    if gstart is None or len(gstart) <= 1:
        ok[rows] = np.all(R, axis=1)
    else:
        ok[rows] = np.logical_and.reduceat(R, gstart, axis=1).any(axis=1)
    return ok


def confirm_sat(v, cases, outputs: Callable[[np.ndarray], np.ndarray], log=None,
                prove: Optional[Callable] = None):
    """A ``sat`` verdict ``v`` (any object with ``result``, ``x``, ``y``, ``case``, ``note``,
    ``exact``) kept only if its point, clipped into the exact set of its case (or of another
    case: :meth:`crown_cli.io.vnnlib.Case.exact`), violates that case by the float64 forward
    pass ``outputs``; then ``x``, ``y`` and ``case`` are the confirmed ones. A case whose real
    box holds no float on some inputs (decimals pinned between two floats, ``Case.pinned``)
    is confirmed at the exact point instead (:func:`_confirm_pinned`, with ``prove``: a
    float64-verified bound). Else the verdict becomes ``unknown`` (with a note): the point lay
    on the ulp a box bound was widened by, and the real set may hold no counterexample there.
    Other verdicts pass unchanged."""
    if v.result != "sat" or v.x is None:
        return v
    cases = list(cases)
    order = ([v.case] if v.case is not None else []) + [
        j for j in range(len(cases)) if j != v.case]
    for j in order:
        c = cases[j]
        lo, hi, b = c.exact() if hasattr(c, "exact") else (c.lo, c.hi, c.b)
        if np.any(lo > hi):  # no float lies in this case's real box
            if _confirm_pinned(v, c, j, outputs, prove):
                return v
            continue
        x = np.clip(np.asarray(v.x, dtype=np.float64), lo, hi)
        if violations_of(outputs, lo, hi, c.A, b, x)[0]:
            v.x, v.y, v.case = x, np.asarray(outputs(x[None]), dtype=np.float64)[0], j
            v.exact = None
            return v
    if log is not None:
        log("the counterexample lies outside the property's exact input set (on a bound "
            "widened by one ulp) or misses its exact output rows: not confirmed")
    v.result, v.x, v.y, v.case = "unknown", None, None, None
    v.note = "a counterexample not confirmed in the exact set of the property"
    return v


def _confirm_pinned(v, c, j: int, outputs, prove) -> bool:
    """Confirm ``v.x`` in case ``c`` (index ``j``), whose real box holds no float on the
    inputs ``c.pinned``: the point x* takes those inputs at their exact decimals and the
    others at ``v.x`` clipped into the case's float box. No float64 forward pass can evaluate
    x*, so ``prove(lo, hi, A, b)`` (a float64-verified bound of the network over the box
    [lo, hi], True when every row ``A f(x) <= b`` holds on all of it) runs on the box that is
    x* on the other inputs and the two floats around each exact decimal: the real x* lies in
    it, so the bound shows x* violates the case in exact arithmetic. Then ``v.x`` is x*
    rounded to nearest, ``v.exact`` the pinned inputs' exact values (what the result file
    writes), ``v.y`` the float64 outputs at ``v.x``."""
    if prove is None or getattr(c, "pinned", None) is None:
        return False
    from fractions import Fraction

    lo, hi, b = c.exact()
    gap = lo > hi
    if set(np.flatnonzero(gap).tolist()) != set(c.pinned):
        return False
    x = np.asarray(v.x, dtype=np.float64).copy()
    x[~gap] = np.clip(x[~gap], lo[~gap], hi[~gap])
    xlo, xhi = x.copy(), x.copy()
    for i, p in c.pinned.items():
        f = float(p)
        x[i] = f
        if Fraction(f) < p:
            xlo[i], xhi[i] = f, np.nextafter(f, np.inf)
        else:
            xlo[i], xhi[i] = np.nextafter(f, -np.inf), f
    if not np.all(np.isfinite(x)) or not prove(xlo, xhi, np.asarray(c.A, np.float64), b):
        return False
    v.x, v.y, v.case = x, np.asarray(outputs(x[None]), dtype=np.float64)[0], j
    v.exact = dict(c.pinned)
    return True


def format_result(v) -> str:
    """The competition's result file of a verdict ``v`` (``result``, ``x``, ``y``,
    ``exact``): the verdict line, and for ``sat`` the counterexample ``((X_0 v) ... (Y_0 v)
    ...)`` with every value written exactly (repr round-trips; an input pinned to a decimal
    no float holds as that decimal, ``v.exact``: the Y values are then the float64 outputs at
    the nearest floats)."""
    if v.result != "sat":
        return v.result + "\n"
    exact = v.exact or {}
    items = [f"(X_{i} {decimal_text(exact[i]) if i in exact else repr(float(val))})"
             for i, val in enumerate(v.x)]
    items += [f"(Y_{i} {float(val)!r})" for i, val in enumerate(v.y)]
    return "sat\n(" + "\n ".join(items) + ")\n"
