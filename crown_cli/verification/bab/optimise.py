"""The alpha/beta optimiser of ReLU splitting: projected Adam ascent of domains' bounds in
float32 (:func:`optimise`, :func:`optimise_open`, :func:`_optimise_rows`), keeping each
domain's best iterate. Nothing here proves: the caller evaluates the final (alpha, beta) in
float64.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from crown_cli.engine.optim import Adam, AdamSettings, BestIterate

# ``bd`` below is a :class:`crown_cli.verification.bab.bounder.Bounder` (not imported: the
# bounder imports this module through its per-domain bounds)


# Adam's settings for the slopes and multipliers (the step size folded with the bias corrections)
ADAM = AdamSettings(folded=True)

# Adam's step sizes: the slopes, the split multipliers, the cuts' multipliers
LR_ALPHA, LR_BETA, LR_MU = 0.1, 0.05, 0.01


@dataclass
class CutParams:
    """The cuts' multipliers of a batch, ``mu`` (B, m, nC) float32 (optimised in place), and
    the domains' (l, u) (B, nU) of the unstable neurons (None: the root's); ``mask`` (B, m,
    nC) bool: only these multipliers move (the rest stay at their value, 0), None: all."""

    mu: np.ndarray
    bounds: Optional[tuple] = None
    mask: Optional[np.ndarray] = None


def _optimise_rows(bd, split, alpha0, rows, chords, iters, lr_alpha, lr_beta,
                   deadline=None, beta0=None):
    """Projected Adam ascent of single-row bounds: entry i is row ``rows[i]`` of ``bd`` on
    the domain ``split[i]`` with upper lines ``chords`` (each (N, nU)), from slopes
    ``alpha0`` (N, nU) (kept with ``lr_alpha`` 0) and beta 0. Returns the best iterate's
    (alpha, beta) (N, nU) float64, clipped to [leak, 1] and >= 0 (beta 0 on unsplit
    neurons)."""
    N, nU = alpha0.shape
    a = np.array(alpha0, np.float32)
    be = np.zeros((N, nU), np.float32) if beta0 is None else \
        np.array(beta0, np.float32) * (split != 0)
    best = BestIterate(N, a, be)
    opt_a = Adam(a, ADAM, lo=np.float32(bd.leak), hi=1.0)
    opt_b = Adam(be, ADAM, lo=0.0)
    splitted = split != 0
    for t in range(1, iters + 1):
        if nU == 0:
            break
        val, state = bd.evaluate(split, a[:, None], be[:, None], np.float32, keep=True,
                                 chords=chords, rows=rows)
        best.offer(val[:, 0], a, be)
        if t == iters or (deadline is not None and time.monotonic() >= deadline):
            break
        gA, gB = bd.gradient(state)
        if lr_alpha > 0.0:  # 0: the slopes stay as given (a certificate's layer slopes)
            opt_a.ascend(a, gA, t, lr_alpha)
        opt_b.ascend(be, gB, t, lr_beta)
        be *= splitted
    best_a, best_b = best.params
    return (np.clip(best_a.astype(np.float64), bd.leak, 1.0),
            np.maximum(best_b.astype(np.float64), 0.0))


class StepClock:
    """The deadline of a loop of steps, checked once per step: :meth:`ends` is True where the
    next step, taking as long as the last one did, would end past the deadline (or None: no
    deadline), so a loop stops before it rather than one step after."""

    def __init__(self):
        self.last = None
        self.span = 0.0

    def ends(self, deadline) -> bool:
        now = time.monotonic()
        if self.last is not None:
            self.span = now - self.last
        self.last = now
        return deadline is not None and now + self.span >= deadline


def optimise(bd, split, alpha, beta, iters=20, stop=True, chords=None, deadline=None,
             cut=None):
    """Projected Adam ascent of the float32 bounds over alpha, beta (B, m, nU) float32, in
    place; keeps per (domain, row) the best iterate. A domain leaves the batch once its
    :meth:`Bounder.score` is above 0 by a float32 margin (the float64 check decides later).
    Returns (best bounds (B, m) float32 estimate, the tape of a final evaluation of all
    domains at the best iterate). ``chords``: the domains' upper lines, as :meth:`Bounder.evaluate`.
    ``deadline`` (a ``time.monotonic()`` instant): no further step that would end after it
    (:class:`StepClock`; the first evaluation always runs; the best iterate so far is kept,
    as at the last step). ``cut`` (:class:`CutParams`): the cuts' multipliers, optimised
    with the slopes in place; the final tape is then the bound without the cuts (for
    branching)."""
    B, m, nU = alpha.shape
    mu, bounds, mask = (None, None, None) if cut is None else (cut.mu, cut.bounds, cut.mask)
    cut = _with_cuts(bd, mu)
    extra = (mu,) if cut else ()
    best = BestIterate((B, m), alpha, beta, *extra)
    opt_a = Adam(alpha, ADAM, lo=np.float32(bd.leak), hi=1.0)
    opt_b = Adam(beta, ADAM, lo=0.0)
    opt_m = Adam(mu, ADAM, lo=0.0) if cut else None
    splitted = (split != 0)[:, None, :]
    act = np.arange(B)
    clock = StepClock()
    for t in range(1, iters + 1):
        if nU == 0 or act.size == 0:
            break
        a, be = alpha[act], beta[act]
        ch = None if chords is None else (chords[0][act], chords[1][act])
        if cut:
            mk = mu[act]
            val, state = bd.evaluate(split[act], a, be, np.float32, keep=True, chords=ch,
                                     mu=mk, bounds=_take(bounds, act))
            best.offer(val, a, be, mk, index=act)
        else:
            val, state = bd.evaluate(split[act], a, be, np.float32, keep=True, chords=ch)
            best.offer(val, a, be, index=act)
        done = bd.score(best.best[act]) > 1e-4 * (1.0 + np.abs(val).max()) if stop else \
            np.zeros(act.size, bool)
        if t == iters or clock.ends(deadline):
            break
        grads = bd.gradient(state)
        opt_a.ascend(a, grads[0].reshape(a.shape), t, LR_ALPHA, index=act)
        opt_b.ascend(be, grads[1].reshape(be.shape), t, LR_BETA, index=act)
        be *= splitted[act]
        alpha[act] = a
        beta[act] = be
        if cut:
            opt_m.ascend(mk, grads[2].reshape(mk.shape), t, LR_MU, index=act)
            if mask is not None:
                mk *= mask[act]
            mu[act] = mk
        act = act[~done]
    alpha[...], beta[...] = best.params[:2]
    if cut:
        mu[...] = best.params[2]
    val, state = bd.evaluate(split, alpha, beta, np.float32, keep=True, chords=chords)
    return np.maximum(best.best, val), state


def _with_cuts(bd, mu) -> bool:
    cuts = getattr(bd, "cuts", None)
    return mu is not None and cuts is not None and len(cuts) > 0 and mu.shape[-1] == len(cuts)


def _take(bounds, index):
    return None if bounds is None else (bounds[0][index], bounds[1][index])


def optimise_open(bd, split, alpha, beta, done, iters=20, chords=None, deadline=None,
                  cut=None):
    """:func:`optimise` for searches over several cases (``bd.gstart``): only the rows of
    cases not yet proven on a domain (``done`` (B, G) bool, float64-proven on an ancestor)
    are optimised, and a case's rows leave once one of them is above 0 by a float32 margin.
    Returns (best bounds (B, m), +inf on rows of done cases; the tape of a final evaluation
    of one row per domain; that row (B,), :meth:`Bounder.score_row` of the best bounds).
    With one case it is :func:`optimise` (tape of every row). ``cut``: as :func:`optimise`."""
    B, m, nU = alpha.shape
    if bd.gstart.size <= 1:
        best, state = optimise(bd, split, alpha, beta, iters, chords=chords,
                               deadline=deadline, cut=cut)
        return best, state, bd.score_row(best)
    mu, bounds, mask = (None, None, None) if cut is None else (cut.mu, cut.bounds, cut.mask)
    cut = _with_cuts(bd, mu)
    frozen = done[:, bd.group_of]
    track = BestIterate((B, m), alpha, beta, *((mu,) if cut else ()),
                        start=np.where(frozen, np.inf, -np.inf))
    best = track.best
    opt_a = Adam(alpha, ADAM, lo=np.float32(bd.leak), hi=1.0)
    opt_b = Adam(beta, ADAM, lo=0.0)
    opt_m = Adam(mu, ADAM, lo=0.0) if cut else None
    d, r = np.nonzero(~frozen)
    clock = StepClock()
    for t in range(1, iters + 1):
        if nU == 0 or d.size == 0:
            break
        a, be = alpha[d, r], beta[d, r]
        sp = split[d]
        ch = None if chords is None else (chords[0][d], chords[1][d])
        if cut:
            mk = mu[d, r]
            val, state = bd.evaluate(sp, a[:, None], be[:, None], np.float32, keep=True,
                                     chords=ch, rows=r, mu=mk[:, None],
                                     bounds=_take(bounds, d))
            val = val[:, 0]
            track.offer(val, a, be, mk, index=(d, r))
        else:
            val, state = bd.evaluate(sp, a[:, None], be[:, None], np.float32, keep=True,
                                     chords=ch, rows=r)
            val = val[:, 0]
            track.offer(val, a, be, index=(d, r))
        gmax = np.maximum.reduceat(best, bd.gstart, axis=1)
        leave = gmax[d, bd.group_of[r]] > 1e-4 * (1.0 + np.abs(val).max())
        if t == iters or clock.ends(deadline):
            break
        grads = bd.gradient(state)
        opt_a.ascend(a, grads[0], t, LR_ALPHA, index=(d, r))
        opt_b.ascend(be, grads[1], t, LR_BETA, index=(d, r))
        be *= sp != 0
        alpha[d, r] = a
        beta[d, r] = be
        if cut:
            opt_m.ascend(mk, grads[2], t, LR_MU, index=(d, r))
            if mask is not None:
                mk *= mask[d, r]
            mu[d, r] = mk
        d, r = d[~leave], r[~leave]
    alpha[...], beta[...] = track.params[:2]
    if cut:
        mu[...] = track.params[2]
    rows = bd.score_row(best)
    ar = np.arange(B)
    val, state = bd.evaluate(split, alpha[ar, rows][:, None], beta[ar, rows][:, None],
                             np.float32, keep=True, chords=chords, rows=rows)
    best[ar, rows] = np.maximum(best[ar, rows], val[:, 0])
    return best, state, rows
