"""The batched back-substitution: rows of linear functions carried down through the hidden
layers, for a batch of domains at once.

A batch holds rows ``Lam`` over the activations of hidden layer k (shape (N, n_k) or
(N, r, n_k): N domains, r rows each), their constants, and in float64 the magnitudes of every
term (for the final sums' allowance) and the product roundings charged so far
(:mod:`crown_cli.engine.rounding`). One step through layer k:

    D = Lam * slope          slope: the lower line's where Lam >= 0, the upper line's elsewhere
                             (:class:`Lines`: per domain or per row, on some columns; the
                             others a fixed slope), plus split multipliers' terms
    const += Lam * intercept + D @ b_k
    mag   += |Lam * intercept| + |D| @ |b_k|        (float64)
    charge += |D| @ v_k + t_k                       (float64: rounding_weights of the step)
    Lam <- D @ W_k

and at the input the rows are concretised over the input set
(:func:`crown_cli.engine.input_sets.box_lower`). float32 steers (ReLU splitting's optimiser);
float64 with the charges is what proves.

Callers: input splitting's boxes (:mod:`crown_cli.engine.dense_boxes`), ReLU splitting's domains
(:class:`crown_cli.verification.bab.bounder.Bounder`) and their per-domain hidden-layer
bounds (:mod:`crown_cli.verification.bab.domain_bounds`). Each chooses its lines (adaptive,
optimised slopes, split neurons fixed); the arithmetic is here. Their numba kernels
(:mod:`crown_cli.engine.kernels`) fuse :func:`relax` with the accumulation for one layout
each; the tests hold every kernel against this module. CROWN on one image
(:func:`crown_cli.engine.dense_crown.back_substitute`) is a measured fast path with the same
rounding code (two chains sharing their products, neurons inactive everywhere dropped).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np


@dataclass
class Lines:
    """One hidden layer's linear bounds for a batch: on the columns ``cols`` per domain or row
    (each array broadcastable to ``Lam[..., cols]``), elsewhere the fixed slope ``stable``
    (n,) of lines through 0 (ReLU-type neurons stable on every domain), or nothing
    (``stable`` None: D holds the columns ``cols`` only; the others contribute 0)."""

    cols: np.ndarray
    lower: Any  # slopes of the lower lines (taken where the row's coefficient is >= 0)
    upper: Any  # slopes of the upper lines (taken where it is < 0)
    upper_icpt: Any = None  # intercepts of the upper lines (None: 0)
    lower_icpt: Any = None  # intercepts of the lower lines (None: 0)
    stable: Optional[np.ndarray] = None
    extra: Any = None  # added to D's columns (split multipliers: -s beta)


def relax(Lam: np.ndarray, lines: Lines):
    """One layer's relaxation applied to the rows Lam (..., n): returns D (..., n, or
    ..., len(cols) when ``lines.stable`` is None), the intercept terms picked (..., len(cols)),
    and the side and slope each coefficient took (the tape of a gradient)."""
    # C order whatever Lam's strides (a broadcast batch's gather would not be): D's products
    Lu = np.ascontiguousarray(Lam[..., lines.cols])
    pos = Lu >= 0.0
    slope = np.where(pos, lines.lower, lines.upper)
    zero = Lu.dtype.type(0.0)
    lo = zero if lines.lower_icpt is None else Lu * lines.lower_icpt
    up = zero if lines.upper_icpt is None else Lu * lines.upper_icpt
    icpt = np.where(pos, lo, up)
    Du = Lu * slope if lines.extra is None else Lu * slope + lines.extra
    if lines.stable is None:
        return Du, icpt, pos, slope
    D = Lam * lines.stable
    D[..., lines.cols] = Du
    return D, icpt, pos, slope


class Rows:
    """Rows being back-substituted: ``Lam``, ``const``; in float64 also ``mag`` (sum of the
    magnitudes of every term so far) and ``charge`` (product roundings so far)."""

    def __init__(self, Lam, const, mag=None, charge=None):
        self.Lam, self.const, self.mag, self.charge = Lam, const, mag, charge

    @property
    def verified(self) -> bool:
        return self.mag is not None

    def step(self, D, icpt, bias, W, rounding=None, absbias=None, isum=None, iabs=None,
             mag_hook=None, live=None):
        """Account for one layer whose :func:`relax` gave D and ``icpt`` (both with the rows'
        leading shape), bias b_k and weights W_k (restricted to D's columns), then move the
        rows to layer k - 1. ``rounding`` (v, t) of the step (float64): v (n,) shared or
        (N, n) per domain. ``isum``, ``iabs``: the intercepts' sum and magnitude per row
        when the caller has them in place of ``icpt``. ``mag_hook(|D|)``: more magnitude to charge
        (float64). Rows of shape (N, r, .) are multiplied as one (N r, .) matrix. ``live``: the
        columns of D that W's rows are (the others are zero in D), or None (all)."""
        if isum is None:
            isum = icpt.sum(axis=-1, dtype=np.float64)
        flat = D.reshape(-1, D.shape[-1])  # one BLAS product for (N, r, .) rows too
        self.const = self.const + isum + (flat @ bias).reshape(D.shape[:-1])
        if self.verified:
            absD = np.abs(D)
            absb = np.abs(bias) if absbias is None else absbias
            if iabs is None:
                iabs = np.abs(icpt).sum(axis=-1)
            self.mag = self.mag + iabs + (absD.reshape(flat.shape) @ absb).reshape(D.shape[:-1])
            self.add_charge(absD, *rounding)
            if mag_hook is not None:
                self.mag = self.mag + mag_hook(absD)
        self.product(D if live is None else np.take(D, live, axis=-1), W)

    def add(self, dconst, dmag, dcharge):
        """Terms a fused kernel accumulated for one layer (its constant, magnitude and charge
        per row), before :meth:`product`."""
        self.const = self.const + dconst
        self.mag = self.mag + dmag
        self.charge = self.charge + dcharge

    def add_charge(self, absD, v, t):
        """charge += |D| @ v + t: v (n,) and t a number for every domain, or, with rows
        (N, r, n), v (N, n) and t (N,) one per domain."""
        if np.ndim(v) == 1:
            self.charge = self.charge + absD @ v + t
        else:
            self.charge = self.charge + np.matmul(absD, v[:, :, None])[..., 0] + t[:, None]

    def product(self, D, W):
        """Lam <- D @ W (rows of shape (N, r, .) as one (N r, .) matrix)."""
        if D.ndim == 3:
            N, r, c = D.shape
            self.Lam = _mm(D.reshape(N * r, c), W).reshape(N, r, W.shape[1])
        else:
            self.Lam = _mm(D, W)


class GemmCount:
    """Floating-point operations spent in the back-substitutions' matrix products (read by
    scripts/bench.py)."""

    flops = 0


def _mm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    GemmCount.flops += 2 * A.shape[0] * A.shape[1] * B.shape[1]
    return A @ B
