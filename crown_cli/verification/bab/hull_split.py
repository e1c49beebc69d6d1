"""Input splitting with convex-hull bounds, for ReLU networks of one hidden layer:
:func:`hull_split_steps`.

The same search as :mod:`crown_cli.verification.bab.input_split` (open sub-boxes, worst
first, halved along one input dimension), with a tighter and costlier bound per sub-box:
each hidden neuron's convex hull over the sub-box
(:mod:`crown_cli.engine.hull`), its lines optimised per sub-box and started from the
parent's, the bound verified in float64. On a network of one hidden layer the neurons' inputs
are the box's own coordinates, where the hull is much tighter than CROWN's triangle (docs/bab.md
has the measurements), so far fewer sub-boxes are needed.

Arrays in, result out: no files and no printing here.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from crown_cli.engine import hull
from crown_cli.verification.bab.domains import BoxPool, halve, splittable
from crown_cli.verification.outcome import BabResult, finish, violations

ROOT_STEPS, ROOT_LR = 200, 0.1  # the whole box: lines from CROWN's
KID_STEPS, KID_LR = 50, 0.1  # a half: lines from its parent's
DECAY = 0.98
BATCH = 32  # open sub-boxes split per round
MAX_OPEN = 20_000  # open sub-boxes held (each keeps its lines: rows x (n + nnz(W1)) float32)
MAX_MEMORY = 2.0 ** 31  # ... and fewer when their lines would take more bytes than this


def stage_applies(weights, activation: str) -> bool:
    """Whether the hull bound (:mod:`crown_cli.engine.hull`) holds for the network: ReLU with
    one hidden layer (any number of inputs): ``crown verify``'s ``hull`` stage."""
    return activation == "relu" and len(weights) == 2


def applies(weights, activation: str, n_inputs: int, max_dim: int) -> bool:
    """Whether :func:`hull_split_steps` runs in ``crown verify``'s branch and bound: the hull
    bound holds and the input has at most ``max_dim`` dimensions to split."""
    return stage_applies(weights, activation) and n_inputs <= max_dim


def hull_split(weights, biases, lo, hi, A, b, deadline: float, **options) -> BabResult:
    """:func:`hull_split_steps` run to its end."""
    return finish(hull_split_steps(weights, biases, lo, hi, A, b, deadline, **options))


def hull_split_steps(weights, biases, lo, hi, A, b, deadline: float,
                     max_domains: Optional[int] = None,
                     progress: Optional[Callable[[int, int, float], None]] = None,
                     proof=None):
    """As a generator (yields the share of the box proven after every round, returns the
    :class:`BabResult`): decide whether some x in [lo, hi] has ``A f(x) <= b`` (all rows) for
    the ReLU network ``f(x) = W2 relu(W1 x + b1) + b2``.

    ``unsat``: every sub-box has some row i whose proven lower bound of ``A_i f(x) - b_i``
    (:func:`crown_cli.engine.hull.hull_bounds`) is above 0. ``sat``: a point of [lo, hi]
    (checked exactly) whose float64 forward pass satisfies every row (the candidates: each
    sub-box's centre and the corner minimising each row's linear bound). ``unknown``: more
    than ``max_domains`` open sub-boxes (default: ``MAX_OPEN``, fewer when their stored lines
    would pass ``MAX_MEMORY`` bytes), or one that can no longer be split. ``timeout``:
    ``deadline`` (time.monotonic()) passed.

    A sub-box is split at the midpoint of the input that causes most of its best row's loss
    at the bound's minimiser (:func:`crown_cli.engine.hull.split_scores`); its halves start
    from its lines. ``proof``: a :class:`~crown_cli.verification.proof.ProofTree` that records
    the boxes' tree and each proven box's row and lines."""
    W1, W2 = (np.asarray(w, dtype=np.float64) for w in weights)
    b1, b2 = (np.asarray(v, dtype=np.float64) for v in biases)
    net = hull.HullNet(W1, b1)
    lo0 = np.asarray(lo, dtype=np.float64).ravel()
    hi0 = np.asarray(hi, dtype=np.float64).ravel()
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    bb = np.asarray(b, dtype=np.float64).ravel()
    v, c, v_err, c_err = hull.margin_rows(W2, b2, A, bb)
    R, n, nnz = A.shape[0], net.n, net.nnz
    if max_domains is None:
        max_domains = max(1, min(MAX_OPEN, int(MAX_MEMORY // (4 * R * (n + nnz)))))
    stats = {"domains": 0, "peak": 1, "splits": 0}

    def result(res, x=None, scores=None, note=""):
        worst = float(np.min(scores)) if scores is not None and scores.size else np.nan
        return BabResult(res, x, stats["domains"], stats["peak"], worst,
                         splits=stats["splits"], note=note)

    def bound(L, H, S, T, steps, lr):
        """Boxes (N, d), lines (N, R, n), (N, R, nnz) to start from (None: CROWN's):
        optimised lines, proven bounds per row (N, R), the split scores of the best row
        (N, d), the candidate points."""
        N = L.shape[0]
        Lr, Hr = np.repeat(L, R, axis=0), np.repeat(H, R, axis=0)
        vr, cr = np.tile(v, (N, 1)), np.tile(c, N)
        pre = hull.pre_bounds(net, Lr, Hr)
        fixed = hull.stable(net, Lr, Hr, pre)
        s0, t0 = hull.initial(net, vr, Lr, Hr, pre)
        if S is not None:
            # neurons stable on the box take their exact lines; the others keep what they had
            s0 = np.where(fixed, s0, S.reshape(N * R, n))
            t0 = np.where(fixed[:, net.r], t0, T.reshape(N * R, nnz))
        s1, T1, _, xs = hull.hull_optimise(net, vr, cr, Lr, Hr, s0, t0,
                                           hull.Ascent(steps, lr, decay=DECAY), fixed=fixed)
        # the lines as float32 values (any lines hold): what a certificate stores
        s1 = s1.astype(np.float32).astype(np.float64)
        T1 = T1.astype(np.float32).astype(np.float64)
        lb = hull.hull_bounds(net, vr, cr, np.tile(v_err, (N, 1)), np.tile(c_err, N),
                              Lr, Hr, s1, T1).reshape(N, R)
        pick = np.arange(N) * R + np.argmax(lb, axis=1)
        G = hull.split_scores(net, vr[pick], cr[pick], L, H, s1[pick], T1[pick], xs[pick])
        pts = np.concatenate([0.5 * (L + H), xs])
        return (s1.reshape(N, R, n).astype(np.float32), T1.reshape(N, R, nnz).astype(np.float32),
                lb, G, pts)

    def record(nodes, lb, S, T):
        """``proof``: the boxes of ``nodes`` whose bound is above 0 as hull leaves."""
        if proof is None:
            return
        for i in np.flatnonzero(lb.max(axis=1) > 0.0):
            r = int(np.argmax(lb[i]))
            theta = np.zeros((n, lo0.size), np.float32)
            theta[net.r, net.q] = T[i, r]
            proof.prove_hull(int(nodes[i]), 0, r, np.clip(S[i, r], 0.0, 1.0), theta)

    def attack(pts):
        X = np.clip(pts, lo0, hi0)
        hit = violations([W1, W2], [b1, b2], "relu", None, lo0, hi0, A, bb, X)
        return X[np.argmax(hit)].copy() if hit.any() else None

    L0, H0 = lo0[None], hi0[None]
    S, T, lb, G, pts = bound(L0, H0, None, None, ROOT_STEPS, ROOT_LR)
    stats["domains"] += 1
    x = attack(pts)
    if x is not None:
        return result("sat", x)
    score = lb.max(axis=1)
    if score[0] > 0.0:
        record(np.zeros(1, np.int64), lb, S, T)
        return result("unsat")
    pool = BoxPool(lo=L0.copy(), hi=H0.copy(), score=score, grad=G, s=S, theta=T, share=np.ones(1),
                   node=np.zeros(1, np.int64))
    while len(pool):
        if time.monotonic() >= deadline:
            return result("timeout", scores=pool.view("score"))
        if len(pool) > max_domains:
            return result("unknown", scores=pool.view("score"), note="domain cap")
        t = pool.pop_worst(BATCH)
        L, H, Sb, Gb, Vb = t["lo"], t["hi"], t["score"], t["grad"], t["share"]
        ok = splittable(L, H)
        if not ok.any(axis=1).all():
            return result("unknown", scores=np.r_[pool.view("score"), Sb],
                          note="box too small to split")
        k = L.shape[0]
        dims = np.argmax(np.where(ok, Gb, -1.0), axis=1)
        L1, H1, L2, H2 = halve(L, H, dims)
        kids = np.zeros((k, 2), np.int64)
        if proof is not None:
            kids = proof.split_input(t["node"], dims, H1[np.arange(k), dims])
        knodes = np.concatenate([kids[:, 0], kids[:, 1]])
        KL, KH = np.concatenate([L1, L2]), np.concatenate([H1, H2])
        S2, T2, lb, G, pts = bound(KL, KH, np.concatenate([t["s"], t["s"]]),
                                   np.concatenate([t["theta"], t["theta"]]), KID_STEPS, KID_LR)
        stats["domains"] += KL.shape[0]
        stats["splits"] += k
        x = attack(pts)
        if x is not None:
            return result("sat", x)
        # a half is never worse than its parent (the parent's bound holds on it)
        score = np.maximum(lb.max(axis=1), np.concatenate([Sb, Sb]))
        live = score <= 0.0
        record(knodes[~live], lb[~live], S2[~live], T2[~live])
        pool.push(lo=KL[live], hi=KH[live], score=score[live], grad=G[live], s=S2[live],
                  theta=T2[live], share=0.5 * np.concatenate([Vb, Vb])[live],
                  node=knodes[live])
        yield pool.round_end(stats, progress)
    return result("unsat")
