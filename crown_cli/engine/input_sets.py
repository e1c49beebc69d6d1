"""Input sets: an l_p ball around x0 or a box [lo, hi], and the concretisation of a linear
function over them (its minimum/maximum ``Lam x0 -/+ eps * ||Lam_row||_q``; for a box the
dual norm is the support ``|Lam| @ radius``).
"""
from __future__ import annotations

import numpy as np

from crown_cli.engine.kernels import kernels
from crown_cli.engine.rounding import ERR_SAFETY, widen

# norm name -> code of the dual norm used on the rows of Lam: 0: l1 (inf-ball), 1: l2, 2: l_inf (1-ball)
NORMS = {"inf": 0, "2": 1, "1": 2}


def centre_radius(lo: np.ndarray, hi: np.ndarray):
    """Centre and radius of a box (elementwise; any shape, e.g. one box per row) such that
    ``centre +/- radius`` contains [lo, hi] despite rounding: the radius is rounded up one ulp
    after the float64 subtraction; degenerate coordinates (lo == hi) get radius 0 when the
    centre is exact."""
    c = 0.5 * lo + 0.5 * hi  # no overflow; c lies in [lo, hi]
    r = np.maximum(hi - c, c - lo)
    exact = (c - lo == r) & (hi - c == r) & (r == 0.0)
    return c, np.where(exact, 0.0, np.nextafter(r, np.inf))


class Box:
    """The input set ``[lo, hi]`` (elementwise), usable wherever the engine takes a ball.

    Every engine function bounds over the set given by ``(x0, eps, qcode)``; a box is passed
    as ``x0 = box.center``, ``eps = 1.0``, ``qcode = box``: then ``Lam x0 +/- eps * |Lam| r``
    is the exact range of ``Lam x`` over the box (the role of ``||Lam||_q`` is played by the
    weighted l1 norm ``|Lam| @ r``, the box's support function). :meth:`args` gives the triple.

    ``center +/- radius`` contains ``[lo, hi]`` despite rounding: the radius is rounded up by
    one ulp after the float64 subtraction (:func:`centre_radius`).
    """

    __slots__ = ("lo", "hi", "center", "radius")

    def __init__(self, lo, hi):
        lo = np.ascontiguousarray(lo, dtype=np.float64)
        hi = np.ascontiguousarray(hi, dtype=np.float64)
        if lo.shape != hi.shape or lo.ndim != 1:
            raise ValueError("Box: lo and hi must be vectors of one shape")
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo <= hi)):
            raise ValueError("Box: bounds must be finite with lo <= hi")
        self.lo, self.hi = lo, hi
        self.center, self.radius = centre_radius(lo, hi)

    def args(self):
        """``(x0, eps, qcode)`` for the engine's functions."""
        return self.center, 1.0, self


def dual_norms(A, qcode):
    """Row-wise dual norm of A (r, n): l1 for qcode 0, l2 for 1, l_inf for 2; for a
    :class:`Box` the support ``|A| @ radius``."""
    if isinstance(qcode, Box):
        return np.abs(np.asarray(A, dtype=np.float64)) @ qcode.radius
    return kernels().dual_norms(A, qcode)


def input_terms(A, x0, qcode):
    """For each row a of A: (a.x0, ||a||_q, sum |a_i x0_i|) (for a :class:`Box`, |a| @ radius
    in place of the norm)."""
    if isinstance(qcode, Box):
        lin, _, mag = kernels().input_terms(A, x0, 0)
        return lin, dual_norms(A, qcode), mag
    return kernels().input_terms(A, x0, qcode)


def input_abs_bound(x0, eps, qcode) -> np.ndarray:
    """A bound on |x| over the input set: |x0| + eps on every l_p ball (|x_k - x0_k| <=
    ||x - x0||_p), |centre| + eps * radius on a :class:`Box` (max(|lo|, |hi|) for eps = 1)."""
    if isinstance(qcode, Box):
        return np.abs(x0) + eps * qcode.radius
    return np.abs(x0) + eps


def box_lower(Lam, const, mag, charge, c, r, rtol):
    """The float64-verified minimum of each row's ``Lam x + const`` over a box ``c +/- r``:
    ``Lam c - |Lam| r + const`` widened by the allowance of
    :mod:`crown_cli.engine.rounding` (``rtol`` of the magnitude sum ``|Lam| |c| + |Lam| r +
    mag``, and ``ERR_SAFETY * charge`` for the products' rounding the chain charged).

    ``Lam`` (N, d) with one box (``c``, ``r`` (d,)), or (N, k, d) with a box per leading
    index (``c``, ``r`` (N, d)); ``const``, ``mag``, ``charge`` of Lam's leading shape. Every
    batched caller (input splitting's boxes, ReLU splitting's domains and their hidden-layer
    bounds) concretises here."""
    absL = np.abs(Lam)
    if Lam.ndim == 2:
        lin, nrm, xm = Lam @ c, absL @ r, absL @ np.abs(c)
    else:
        lin = np.matmul(Lam, c[:, :, None])[..., 0]
        nrm = np.matmul(absL, r[:, :, None])[..., 0]
        xm = np.matmul(absL, np.abs(c)[:, :, None])[..., 0]
    return widen(lin - nrm + const, xm + nrm + mag, -1.0, rtol, ERR_SAFETY * charge)
