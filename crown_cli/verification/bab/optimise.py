"""The alpha/beta optimiser of ReLU splitting: projected Adam ascent of domains' bounds in
float32 (:func:`optimise`, :func:`optimise_open`, :func:`_optimise_rows`), keeping each
domain's best iterate. Nothing here proves: the caller evaluates the final (alpha, beta) in
float64.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from crown_cli.verification.bab.bounder import Bounder


_B1, _B2, _EPS = 0.9, 0.999, 1e-8  # Adam's moment decays and denominator guard


def _adam_ascent(x, g, m, v, t, lr):
    """One Adam ascent step (step ``t`` >= 1) on the float32 parameters x, in place, with
    gradient g and moments m, v; returns the new moments (the caller stores them and
    projects x)."""
    m = _B1 * m + (1 - _B1) * g
    v = _B2 * v + (1 - _B2) * g * g
    c = lr * np.sqrt(1 - _B2 ** t) / (1 - _B1 ** t)
    x += (c * m / (np.sqrt(v) + _EPS)).astype(np.float32)
    return m, v


def _optimise_rows(bd: Bounder, split, alpha0, rows, chords, iters, lr_alpha, lr_beta,
                   deadline=None, beta0=None):
    """Projected Adam ascent of single-row bounds: entry i is row ``rows[i]`` of ``bd`` on
    the domain ``split[i]`` with upper lines ``chords`` (each (N, nU)), from slopes
    ``alpha0`` (N, nU) and beta 0. Returns the best iterate's (alpha, beta) (N, nU) float64,
    clipped to [leak, 1] and >= 0 (beta 0 on unsplit neurons)."""
    N, nU = alpha0.shape
    a = np.array(alpha0, np.float32)
    be = np.zeros((N, nU), np.float32) if beta0 is None else \
        np.array(beta0, np.float32) * (split != 0)
    best = np.full(N, -np.inf)
    best_a, best_b = a.copy(), be.copy()
    ma = np.zeros_like(a); va = np.zeros_like(a)
    mb = np.zeros_like(be); vb = np.zeros_like(be)
    splitted = split != 0
    lo_a = np.float32(bd.leak)
    for t in range(1, iters + 1):
        if nU == 0:
            break
        val, state = bd.evaluate(split, a[:, None], be[:, None], np.float32, keep=True,
                                 chords=chords, rows=rows)
        val = val[:, 0]
        imp = val > best
        best[imp] = val[imp]
        best_a[imp] = a[imp]
        best_b[imp] = be[imp]
        if t == iters or (deadline is not None and time.monotonic() >= deadline):
            break
        gA, gB = bd.gradient(state)
        ma, va = _adam_ascent(a, gA, ma, va, t, lr_alpha)
        np.clip(a, lo_a, 1.0, out=a)
        mb, vb = _adam_ascent(be, gB, mb, vb, t, lr_beta)
        np.maximum(be, 0.0, out=be)
        be *= splitted
    return (np.clip(best_a.astype(np.float64), bd.leak, 1.0),
            np.maximum(best_b.astype(np.float64), 0.0))


def optimise(bd: Bounder, split, alpha, beta, iters=20, lr_alpha=0.1, lr_beta=0.05,
             stop=True, chords=None, deadline=None):
    """Projected Adam ascent of the float32 bounds over alpha, beta (B, m, nU) float32, in
    place; keeps per (domain, row) the best iterate. A domain leaves the batch once its
    :meth:`Bounder.score` is above 0 by a float32 margin (the float64 check decides later).
    Returns (best bounds (B, m) float32 estimate, the tape of a final evaluation of all
    domains at the best iterate). ``chords``: the domains' upper lines, as :meth:`Bounder.evaluate`.
    ``deadline`` (a ``time.monotonic()`` instant): no further step after it (the first
    evaluation always runs; the best iterate so far is kept, as at the last step)."""
    B, m, nU = alpha.shape
    best = np.full((B, m), -np.inf)
    best_a, best_b = alpha.copy(), beta.copy()
    ma = np.zeros_like(alpha); va = np.zeros_like(alpha)
    mb = np.zeros_like(beta); vb = np.zeros_like(beta)
    splitted = (split != 0)[:, None, :]
    lo_a = np.float32(bd.leak)
    act = np.arange(B)
    for t in range(1, iters + 1):
        if nU == 0 or act.size == 0:
            break
        a, be = alpha[act], beta[act]
        ch = None if chords is None else (chords[0][act], chords[1][act])
        val, state = bd.evaluate(split[act], a, be, np.float32, keep=True, chords=ch)
        imp = val > best[act]
        if imp.any():
            d, r = np.nonzero(imp)
            best[act[d], r] = val[d, r]
            best_a[act[d], r] = a[d, r]
            best_b[act[d], r] = be[d, r]
        done = bd.score(best[act]) > 1e-4 * (1.0 + np.abs(val).max()) if stop else \
            np.zeros(act.size, bool)
        if t == iters or (deadline is not None and time.monotonic() >= deadline):
            break
        gA, gB = bd.gradient(state)
        gA = gA.reshape(a.shape)
        gB = gB.reshape(be.shape)
        ma[act], va[act] = _adam_ascent(a, gA, ma[act], va[act], t, lr_alpha)
        np.clip(a, lo_a, 1.0, out=a)
        mb[act], vb[act] = _adam_ascent(be, gB, mb[act], vb[act], t, lr_beta)
        np.maximum(be, 0.0, out=be)
        be *= splitted[act]
        alpha[act] = a
        beta[act] = be
        act = act[~done]
    alpha[...] = best_a
    beta[...] = best_b
    val, state = bd.evaluate(split, alpha, beta, np.float32, keep=True, chords=chords)
    best = np.maximum(best, val)
    return best, state


def optimise_open(bd: Bounder, split, alpha, beta, done, iters=20, lr_alpha=0.1,
                  lr_beta=0.05, chords=None, deadline=None):
    """:func:`optimise` for searches over several cases (``bd.gstart``): only the rows of
    cases not yet proven on a domain (``done`` (B, G) bool, float64-proven on an ancestor)
    are optimised, and a case's rows leave once one of them is above 0 by a float32 margin.
    Returns (best bounds (B, m), +inf on rows of done cases; the tape of a final evaluation
    of one row per domain; that row (B,), :meth:`Bounder.score_row` of the best bounds).
    With one case it is :func:`optimise` (tape of every row)."""
    B, m, nU = alpha.shape
    if bd.gstart.size <= 1:
        best, state = optimise(bd, split, alpha, beta, iters, lr_alpha, lr_beta,
                               chords=chords, deadline=deadline)
        return best, state, bd.score_row(best)
    frozen = done[:, bd.group_of]
    best = np.where(frozen, np.inf, -np.inf)
    best_a, best_b = alpha.copy(), beta.copy()
    ma = np.zeros_like(alpha); va = np.zeros_like(alpha)
    mb = np.zeros_like(beta); vb = np.zeros_like(beta)
    lo_a = np.float32(bd.leak)
    d, r = np.nonzero(~frozen)
    for t in range(1, iters + 1):
        if nU == 0 or d.size == 0:
            break
        a, be = alpha[d, r], beta[d, r]
        sp = split[d]
        ch = None if chords is None else (chords[0][d], chords[1][d])
        val, state = bd.evaluate(sp, a[:, None], be[:, None], np.float32, keep=True, chords=ch,
                                 rows=r)
        val = val[:, 0]
        imp = val > best[d, r]
        if imp.any():
            best[d[imp], r[imp]] = val[imp]
            best_a[d[imp], r[imp]] = a[imp]
            best_b[d[imp], r[imp]] = be[imp]
        gmax = np.maximum.reduceat(best, bd.gstart, axis=1)
        leave = gmax[d, bd.group_of[r]] > 1e-4 * (1.0 + np.abs(val).max())
        if t == iters or (deadline is not None and time.monotonic() >= deadline):
            break
        gA, gB = bd.gradient(state)
        ma[d, r], va[d, r] = _adam_ascent(a, gA, ma[d, r], va[d, r], t, lr_alpha)
        np.clip(a, lo_a, 1.0, out=a)
        mb[d, r], vb[d, r] = _adam_ascent(be, gB, mb[d, r], vb[d, r], t, lr_beta)
        np.maximum(be, 0.0, out=be)
        be *= sp != 0
        alpha[d, r] = a
        beta[d, r] = be
        d, r = d[~leave], r[~leave]
    alpha[...] = best_a
    beta[...] = best_b
    rows = bd.score_row(best)
    ar = np.arange(B)
    val, state = bd.evaluate(split, alpha[ar, rows][:, None], beta[ar, rows][:, None],
                             np.float32, keep=True, chords=chords, rows=rows)
    best[ar, rows] = np.maximum(best[ar, rows], val[:, 0])
    return best, state, rows
