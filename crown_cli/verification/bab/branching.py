"""Branching of ReLU splitting: which unstable neuron a domain splits on. BaBSR-like scores
(:func:`branch_scores`) and filtered smart branching (:func:`_fsb_choice`: the top candidates'
children bounded in one batch, the best worse child taken).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from crown_cli.verification.bab.bounder import Bounder


def branch_scores(bd: Bounder, state, split, alpha, rows, dl=None, du=None,
                  score: str = "gaps") -> np.ndarray:
    """BaBSR-like estimate per domain and unstable neuron of what splitting it gains, (B, nU)
    (-inf where already split), Lam_j the coefficient of the neuron's activation in row
    ``rows[d]``'s back-substitution. ``score`` "gaps": |Lam_j| times the largest gap of the
    side of the relaxation the domain's row uses (chord: its intercept; lower line alpha z:
    max(-alpha l, (1-alpha) u)); "chords": what the upper line costs, ``max(-Lam_j, 0)``
    times the chord's intercept, ties (e.g. rows reaching a node with positive coefficients
    only) broken by ``1e-3 |Lam_j| (u - l)``. ``dl``, ``du`` (B, nU): the domains' bounds
    (default: the root's)."""
    tape, ctr = state[0], state[3]
    B = split.shape[0]
    m = bd.m
    # the tape holds every row of each domain, or (optimise_open) one row per domain
    idx = np.arange(B) * m + rows if state[1].shape[0] == B * m else np.arange(B)
    out = np.full((B, bd.nU), -np.inf)
    for k in range(bd.L):
        o0, o1 = bd.offsets[k], bd.offsets[k + 1]
        if o1 == o0:
            continue
        cols = bd.ucols[k]
        Lu = tape[k][0][idx][:, cols].astype(np.float64)
        if dl is None:
            l, u = bd.bounds[k][0][cols], bd.bounds[k][1][cols]
        else:
            l, u = dl[:, o0:o1], du[:, o0:o1]
        a = alpha[np.arange(B), rows, o0:o1].astype(np.float64)
        gap_low = np.maximum(_times(bd.leak - a, l), _times(1.0 - a, u))
        gap_up = ctr[idx, o0:o1].astype(np.float64)
        if score == "chords":
            sc = np.maximum(-Lu, 0.0) * gap_up + 1e-3 * np.abs(Lu) * (u - l)
        else:
            sc = np.where(Lu >= 0.0, Lu * gap_low, -Lu * gap_up)
        two = getattr(bd, "two_sided", None)  # smooth neurons (graphs): the gap on both sides
        if two is not None and two[o0:o1].any():
            sc = np.where(two[o0:o1], np.abs(Lu) * gap_up, sc)
        sc[split[:, o0:o1] != 0] = -np.inf
        out[:, o0:o1] = sc
    return out


def _times(f, b):
    """``f * b`` with 0 where the factor f is 0 (a neuron's bound may be infinite, where the
    gap of a line that does not reach that side is 0, not NaN: NaN scores sort last and the
    neuron would never be split)."""
    with np.errstate(invalid="ignore"):
        return np.where(f == 0.0, 0.0, f * b)


def _fsb_choice(bd: Bounder, split, alpha, beta, cand, chords=None, prow=None):
    """Filtered smart branching: for each parent, the candidate whose two children (parent's
    alpha, beta and chords, one float32 evaluation) have the best worse child; with ``prow``
    (P,) the children are bounded in that row of each parent only (the row it branches
    for), else by :meth:`Bounder.score` over all rows."""
    P, K = cand.shape
    reps = np.repeat(np.arange(P), K)
    c = cand.reshape(-1)
    valid = c >= 0
    cc = np.where(valid, c, 0)
    s1 = split[reps].copy()
    s2 = split[reps].copy()
    ar = np.arange(P * K)
    s1[ar, cc] = 1
    s2[ar, cc] = -1
    S = np.concatenate([s1, s2])
    Ch = None if chords is None else tuple(np.concatenate([c[reps], c[reps]]) for c in chords)
    if prow is None:
        Al = np.concatenate([alpha[reps], alpha[reps]])
        Be = np.concatenate([beta[reps], beta[reps]])
        v = bd.score(bd.evaluate(S, Al, Be, np.float32, chords=Ch))
    else:
        r = prow[reps]
        Al = np.concatenate([alpha[reps, r], alpha[reps, r]])[:, None, :]
        Be = np.concatenate([beta[reps, r], beta[reps, r]])[:, None, :]
        v = bd.evaluate(S, Al, Be, np.float32, chords=Ch, rows=np.concatenate([r, r]))[:, 0]
    worse = np.minimum(v[:P * K], v[P * K:])
    worse[~valid] = -np.inf
    best = np.argmax(worse.reshape(P, K), axis=1)
    return cand[np.arange(P), best]
