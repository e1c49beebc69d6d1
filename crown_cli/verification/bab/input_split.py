"""Input-splitting branch and bound for low-dimensional inputs: :func:`input_split`.

Open sub-boxes are bounded in batches by the batched engine (:mod:`crown_cli.engine.dense_boxes`);
a sub-box is closed when some row of ``A f(x) <= b`` has a float64-verified lower bound above
``b`` (rounded up one ulp); for the others a few candidate points (centre, minimising corners
of the linear bounds) are checked by :func:`crown_cli.verification.outcome.violations`; the
rest are split in two along one input dimension.

Arrays in, result out: no files and no printing here.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import numpy as np

from crown_cli.engine.dense_boxes import BatchNet, _bound_blocked, _take_info, alpha_row_bound
from crown_cli.engine.threads import one_thread
from crown_cli.verification.bab.domains import BoxPool, halve, splittable
from crown_cli.verification.bab.workers import Helper, HelperLost, can_fork
from crown_cli.verification.outcome import BabResult, finish, violations

SPLIT_RULES = ("sensitivity", "trial")
FLAT = 0.0  # "trial": a split no better than its parent by this share counts as no split
# boxes bounded at a time: as many as keep one back-substitution product's temporaries (per
# box: the widest layer's rows times the widest layer before it) within BLOCK_ELEMS numbers,
# between BLOCK_MIN and BLOCK_MAX (docs/bab.md: 204 on ACAS Xu, 2048 on safenlp's 30-128-2)
BLOCK_ELEMS = 512_000
BLOCK_MIN, BLOCK_MAX = 32, 2048
# workers > 1: a round of at least this many boxes is shared with the helper process (a
# smaller one costs less than the round trip)
PARALLEL_MIN = 64
CHUNKS = 6  # a shared round in about this many chunks


def auto_block(widths, n_rows: int) -> int:
    """Boxes per block for a network of layer widths ``widths`` (inputs first, outputs last)
    and ``n_rows`` bounded rows: hidden layer k > 1 back-substitutes its n_k rows through
    layers of up to max(widths[1:k]) neurons, the rows through every hidden layer."""
    hidden = list(widths[1:-1])
    per_box = max([n_rows * max(hidden, default=1)] +
                  [hidden[k] * max(hidden[:k]) for k in range(1, len(hidden))])
    return int(min(BLOCK_MAX, max(BLOCK_MIN, BLOCK_ELEMS // max(per_box, 1))))


def shared_round(helper, expand, fields, n: int):
    """``expand`` over the ``n`` boxes of ``fields`` in chunks, taken in turn by this process
    and by ``helper`` (a :class:`~crown_cli.verification.bab.workers.Helper` running the same
    ``expand``): the helper gets a chunk whenever it is free, this process works through the
    rest, so a helper slowed by other work on its core takes fewer. The outcomes in chunk
    order (the same whoever ran each), or None when the helper was lost (nothing of this
    round is kept then)."""
    size = max(PARALLEL_MIN // 2, -(-n // CHUNKS))
    parts = [tuple(a[i:i + size] for a in fields) for i in range(0, n, size)]
    outs = [None] * len(parts)
    todo = list(range(len(parts)))
    busy = None
    try:
        while todo or busy is not None:
            if busy is None and todo:
                busy = todo.pop()  # the helper takes from the end, this process from the front
                helper.send(parts[busy])
            if busy is not None and (not todo or helper.poll()):
                outs[busy] = helper.recv()
                busy = None
                continue
            i = todo.pop(0)
            outs[i] = expand(*parts[i])
    except HelperLost:
        return None
    return outs


@dataclass(frozen=True)
class InputSplitOptions:
    """The settings of an input-splitting search (see :func:`input_split` for what each does;
    docs/bab.md for the measurements behind the defaults)."""

    max_domains: int = 200_000  # more open sub-boxes than this: unknown
    batch: int = 256  # open sub-boxes taken per round
    split: str = "trial"  # split rule: "trial" or "sensitivity"
    block: Optional[int] = None  # boxes bounded at a time (None: auto_block)
    adaptive: bool = True  # CROWN's adaptive lower slopes (False: Fast-Lin's)
    skip_stable: bool = True  # an interval step first; only its unstable rows back-substituted
    trial_dims: int = 3  # "trial": candidate dimensions ranked by sensitivity
    alpha_iters: int = 10  # ReLU: Adam steps on the open boxes' best row (0: off)
    widest: float = 4.0  # "trial": the relatively widest dimension as one more candidate
    inherit: bool = True  # "trial": halves intersect their bounds with their parent's
    workers: int = 1  # "trial": processes sharing each round's boxes (2: one forked helper)
    # workers 2: each process runs a shared round on one thread (numba's, BLAS's): the graph
    # engine's threaded kernels made a round of two processes 2x slower instead of 2x faster
    # with two threads each; a small dense network's rounds were 10% faster with them
    one_thread: bool = False


@dataclass(frozen=True, eq=False)
class InputSplitProblem:
    """Some x in the box [lo, hi] with ``A f(x) <= b`` (every row)? f: the network of
    ``weights``, ``biases`` with ``activation`` (its parameter ``alpha``, None: the default)
    after every layer but the last."""

    weights: Sequence[np.ndarray]
    biases: Sequence[np.ndarray]
    activation: str
    alpha: Optional[float]
    lo: np.ndarray
    hi: np.ndarray
    A: np.ndarray
    b: np.ndarray


def input_split(weights, biases, activation, alpha, lo, hi, A, b, deadline: float,
                **settings) -> BabResult:
    """:func:`input_split_steps` on the :class:`InputSplitProblem` of the first eight
    arguments, run to its end: the :class:`BabResult`. ``settings``: the keywords of
    :func:`input_split_steps`."""
    problem = InputSplitProblem(weights, biases, activation, alpha, lo, hi, A, b)
    return finish(input_split_steps(problem, deadline, **settings))


def input_split_steps(problem: InputSplitProblem, deadline: float,
                      options: Optional[InputSplitOptions] = None,
                      progress: Optional[Callable[[int, int, float], None]] = None,
                      proof=None, **settings):
    """As a generator (it yields the share of the box proven so far, a float in [0, 1], after
    every round, and returns the :class:`BabResult`): decide the ``problem``, whether some x
    in [lo, hi] has ``A f(x) <= b`` (all rows), by input splitting.

    ``unsat``: every sub-box has some row i with a float64-verified lower bound of
    ``A_i f(x)`` (CROWN's, or alpha-CROWN's on the last layer) above ``b_i`` rounded up one
    ulp. ``sat``: a point x of [lo, hi] (checked exactly) whose float64 forward pass
    satisfies every row. ``unknown``: more than ``max_domains`` open sub-boxes, or a sub-box
    that can no longer be split. ``timeout``: ``deadline`` (time.monotonic()) passed.

    Each round takes the ``batch`` open sub-boxes with the lowest score (worst bound first),
    bounds them at once, drops the proven ones, tries candidate points of the rest (centre and,
    per row, the corner minimising the row's linear bound) and splits them in two at the
    midpoint of one input dimension chosen by ``split``:

    - ``"sensitivity"``: the dimension maximising ``sum_i |Lam_i,j| (hi_j - lo_j)`` over the
      unproven rows i (how much the linear bound's range over the box owes to dimension j);
    - ``"trial"``: bound both halves for each of the ``trial_dims`` dimensions ranked first by
      the sensitivity rule and for one more, the dimension widest relative to [lo, hi], when
      it is not ranked and at least ``widest`` times as wide (relative) as every ranked one
      (0: never), all in the same batch; keep the split maximising ``min(s1, 0) + min(s2,
      0)`` for the halves' scores ``s = max_i (lb_i - b_i)`` (each at least its parent's), or
      when no split improves on the parent the sensitivity rule's first choice; the halves
      kept are already bounded. (Without the widest candidate, ACAS Xu 3_3 prop_2 halved X_1
      down to 2**-19 of its range while X_2, which the bounds needed split, stayed at 2**-5;
      trying it at every split instead cost about 1.5x the time on the easier instances.)

    ``alpha_iters`` (ReLU only; 0: off): the boxes left open (with "trial" the halves kept,
    with "sensitivity" the boxes bounded) get their best row re-bounded with the unstable
    neurons' lower slopes optimised (:func:`alpha_row_bound`, that many steps) before they
    are split, the score raised to the better bound.
    ``inherit`` ("trial"): every open box keeps its hidden layers' bounds, and its halves'
    are intersected with them (``parent_bounds`` of :func:`batch_lower_bounds`).
    ``skip_stable``: see :func:`batch_lower_bounds` (``block`` boxes are bounded at a time).

    ``progress(domains, open, worst)``: called after every round with the sub-boxes bounded so
    far, the open sub-boxes and the lowest open score (inf when none is open). ``options``:
    the :class:`InputSplitOptions`; ``settings`` (keywords named like its fields) override
    them. ``proof``: a :class:`~crown_cli.verification.proof.ProofTree` that records the
    boxes' tree and each proven box's row and slopes (one process then).
    """
    o = replace(options or InputSplitOptions(), **settings)
    search = BoxSearch(problem.lo, problem.hi, problem.A, problem.b, o,
                       lambda q: DenseBoxes(problem, q), proof=proof)
    return (yield from search.run(deadline, progress))


class DenseBoxes:
    """The bounds input splitting takes of a dense network: its boxes bounded in blocks by
    the batched engine (:func:`~crown_cli.engine.dense_boxes.batch_lower_bounds`), the open
    boxes' best row by alpha-CROWN (:func:`alpha_row_bound`), candidate points checked by
    the network's float64 forward pass (:func:`violations`), and (``inherit``) each box's
    hidden-layer bounds kept for its halves. :class:`BoxSearch` takes any object with these
    methods (the graph engine's: :class:`~crown_cli.verification.bab.graph_input_split.
    GraphBoxes`)."""

    def __init__(self, p: InputSplitProblem, search: "BoxSearch"):
        o, A = search.o, search.A
        self.o, self.search = o, search
        self.weights = [np.asarray(w, dtype=np.float64) for w in p.weights]
        self.biases = [np.asarray(v, dtype=np.float64) for v in p.biases]
        self.activation, self.alpha = p.activation, p.alpha
        self.net = net = BatchNet(self.weights, self.biases, p.activation, p.alpha, o.adaptive)
        self.block = o.block if o.block is not None else auto_block(
            [self.weights[0].shape[1]] + [w.shape[0] for w in self.weights], A.shape[0])
        self.widths = [w.shape[0] for w in net.W[:-1]]
        # one hidden layer: a sub-box's interval bounds of it are already within its parent's
        # (an affine map of the box), so there is nothing to inherit but a few ulps
        self.inherit = o.inherit and o.split == "trial" and net.num_hidden > 1
        self.use_alpha = o.alpha_iters > 0 and p.activation == "relu" and \
            net.num_hidden > 0 and A.shape[0]

    def bound(self, L, H, PB=None):
        """Per box: the rows' bounds lb - b_up, the rows' input coefficients, the score, the
        info of batch_lower_bounds."""
        pb = None if PB is None else self.unpack(PB)
        lb, info = _bound_blocked(self.net, L, H, self.search.A, self.block, parent_bounds=pb,
                                  skip_stable=self.o.skip_stable)
        lb = np.where(np.isnan(lb), -np.inf, lb - self.search.b_up)  # NaN proves nothing
        s = np.max(lb, axis=1) if lb.shape[1] else np.full(lb.shape[0], -np.inf)
        return lb, info["Lam"], s, info

    @staticmethod
    def pack(bounds):  # per hidden layer (l, u) -> (N, 2 sum n_k)
        return np.concatenate([v for lu in bounds for v in lu], axis=1)

    def unpack(self, P):
        out, at = [], 0
        for n_k in self.widths:
            out.append((P[:, at:at + n_k], P[:, at + n_k:at + 2 * n_k]))
            at += 2 * n_k
        return out

    def refine(self, L, H, lb, s, info, idx):
        """alpha-CROWN on the best row of the boxes idx (unproven): their scores raised."""
        self.search.slopes = None
        if not self.use_alpha or not idx.size:
            return s
        rows = np.argmax(lb[idx], axis=1)
        la, _, relax = alpha_row_bound(self.net, _take_info(info, idx), L[idx], H[idx],
                                       self.search.A, rows, iters=self.o.alpha_iters)
        if self.search.proof is not None:  # the slopes of each box's row, all hidden neurons
            self.search.slopes = (idx, rows, np.concatenate([r[2] for r in relax], axis=1))
        s = s.copy()
        s[idx] = np.fmax(s[idx], la - self.search.b_up[rows])  # a NaN bound proves nothing
        return s

    def hits(self, X):
        """Which points of X (n, d) violate the property (float64 forward pass)."""
        q = self.search
        return violations(self.weights, self.biases, self.activation, self.alpha, q.lo0, q.hi0,
                          q.A, q.b, X)


class BoxSearch:
    """One input-splitting search of some x in [lo, hi] with ``A f(x) <= b``: the arrays in
    float64, the settings, the counters and the bounds (``boxes(search)`` makes them from
    this search's arrays: :class:`DenseBoxes`, or the graph engine's); :meth:`run` is the search, :meth:`expand`
    one "trial" round on some boxes (run by this process or by the forked helper)."""

    def __init__(self, lo, hi, A, b, o: InputSplitOptions, boxes, proof=None):
        self.o = o
        self.proof, self.slopes = proof, None
        self.workers = max(1, min(2, int(o.workers))) if o.split == "trial" and can_fork() \
            and proof is None else 1
        if o.split not in SPLIT_RULES:
            raise ValueError(f"input_split: unknown split rule '{o.split}'")
        self.lo0 = np.asarray(lo, dtype=np.float64).ravel()
        self.hi0 = np.asarray(hi, dtype=np.float64).ravel()
        self.A = np.atleast_2d(np.asarray(A, dtype=np.float64))
        self.b = np.asarray(b, dtype=np.float64).ravel()
        self.b_up = np.nextafter(self.b, np.inf)
        self.boxes = boxes(self)
        self.d = self.lo0.size
        self.span = np.where(self.hi0 > self.lo0, self.hi0 - self.lo0, 1.0)
        self.stats = {"domains": 0, "peak": 1, "splits": 0}
        self.inherit = self.boxes.inherit
        self.helper = None  # the second process (workers > 1), forked at the first large round

    def run(self, deadline, progress):
        """Rounds on the worst open boxes until none is open (``unsat``), a counterexample,
        the deadline or the domain cap."""
        o = self.o
        pool = self._start()
        if isinstance(pool, BabResult):
            return pool
        try:
            while len(pool):
                if time.monotonic() >= deadline:
                    return self.result("timeout", open_scores=pool.view("score"))
                if len(pool) > o.max_domains:
                    return self.result("unknown", open_scores=pool.view("score"),
                                       note="domain cap")
                t = pool.pop_worst(o.batch * self.workers if o.split == "trial" else o.batch)
                if o.split == "sensitivity":
                    live = self._bound_round(t)
                    if live is None:  # every box of the round proven
                        continue
                    out = self._split_sensitive(pool, *live)
                else:
                    out = self._trial_round(pool, t)
                if out is not None:
                    return out
                yield pool.round_end(self.stats, progress)
            return self.result("unsat")
        finally:
            if self.helper is not None:
                self.helper.close()

    def result(self, res, x=None, open_scores=None, note=""):
        worst = np.nan
        if open_scores is not None and open_scores.size:
            worst = float(np.min(open_scores))
        return BabResult(res, x, self.stats["domains"], self.stats["peak"], worst,
                         splits=self.stats["splits"], note=note)

    def bound(self, L, H, PB=None):
        return self.boxes.bound(L, H, PB)

    def refine(self, L, H, lb, s, info, idx):
        return self.boxes.refine(L, H, lb, s, info, idx)

    def attack(self, L, H, lb, Lam):
        """Candidate points of the boxes: centres and each row's minimising corner."""
        pts = [0.5 * L + 0.5 * H]
        for i in range(self.A.shape[0]):
            pts.append(np.where(Lam[:, i, :] > 0.0, L, H))
        X = np.clip(np.concatenate(pts), self.lo0, self.hi0)
        hit = self.boxes.hits(X)
        return X[np.argmax(hit)].copy() if hit.any() else None

    @staticmethod
    def sensitivity(lb, Lam):  # sum over the unproven rows of |Lam_i,j|: (n, d)
        return np.sum(np.abs(Lam) * (lb <= 0.0)[:, :, None], axis=1)

    def _start(self):
        """The open boxes at the start, a :class:`BoxPool` of the case's box (with "trial"
        bounded first, so that open boxes carry their own score; else their parent's), or
        the result when that bound decides."""
        d = self.d
        Lo, Hi = self.lo0[None].copy(), self.hi0[None].copy()
        S = np.full(1, -np.inf)
        G = np.zeros((1, d))  # trial: each open box's sensitivity (the fallback split rule)
        P = np.zeros((1, 0))  # inherit: each open box's hidden bounds (packed)
        V = np.ones(1)  # each open box's share of the case's box (2**-splits)
        if self.o.split == "trial":
            lb, Lam, S, info = self.bound(Lo, Hi)
            self.stats["domains"] += 1
            if self.inherit:
                P = self.boxes.pack(info["bounds"])
            S = self.refine(Lo, Hi, lb, S, info, np.flatnonzero(S <= 0.0))
            G = self.sensitivity(lb, Lam)
            x = self.attack(Lo, Hi, lb, Lam)
            if x is not None:
                return self.result("sat", x)
            if S[0] > 0.0:
                self._prove(np.zeros(1, np.int64), lb, S, np.zeros(1, np.int64))
                return self.result("unsat")
        return BoxPool(lo=Lo, hi=Hi, score=S, sens=G, parent=P, share=V,
                       node=np.zeros(1, np.int64))

    def _prove(self, nodes, lb, s, pos):
        """Record (``proof``) the boxes at positions ``pos`` of a bounded batch as proven
        leaves: the row CROWN proved (lb: the rows' bounds minus b_up), else the row the
        slopes of :meth:`refine` proved, with those slopes."""
        if self.proof is None or not pos.size:
            return
        ref = {} if self.slopes is None else {int(i): j for j, i in enumerate(self.slopes[0])}
        for i in pos.tolist():
            if lb.shape[1] and lb[i].max() > 0.0:
                self.proof.prove(nodes[i], 0, int(np.argmax(lb[i])))
            else:
                j = ref[i]  # proven by the refined row alone
                self.proof.prove(nodes[i], 0, int(self.slopes[1][j]), alpha=self.slopes[2][j])

    def _bound_round(self, t):
        """"sensitivity": the round's boxes bounded; those left open (boxes, bounds, input
        coefficients, scores, splittable dimensions, shares, nodes), or None when none is."""
        L, H, Vb, Nb = t["lo"], t["hi"], t["share"], t["node"]
        ok = splittable(L, H)
        lb, Lam, s, info = self.bound(L, H)
        self.stats["domains"] += L.shape[0]
        s = self.refine(L, H, lb, s, info, np.flatnonzero(s <= 0.0))
        live = s <= 0.0
        self._prove(Nb, lb, s, np.flatnonzero(~live))
        L, H, lb, Lam, s, ok = L[live], H[live], lb[live], Lam[live], s[live], ok[live]
        Vb, Nb = Vb[live], Nb[live]
        if not L.shape[0]:
            return None
        return L, H, lb, Lam, s, ok, Vb, Nb

    def _split_sensitive(self, pool, L, H, lb, Lam, s, ok, Vb, Nb):
        """"sensitivity": the open boxes tried for counterexamples, then halved along their
        most sensitive splittable dimension into the pool. The result when that decides."""
        d = self.d
        x = self.attack(L, H, lb, Lam)
        if x is not None:
            return self.result("sat", x)
        if not ok.any(axis=1).all():
            return self.result("unknown", open_scores=np.r_[pool.view("score"), s],
                               note="box too small to split")
        sens = self.sensitivity(lb, Lam) * (H - L)
        sens = np.where(ok, sens, -1.0)
        dim = np.argmax(sens, axis=1)
        l1, h1, l2, h2 = halve(L, H, dim)
        self.stats["splits"] += L.shape[0]
        kids = np.zeros((s.size, 2), np.int64)
        if self.proof is not None:
            kids = self.proof.split_input(Nb, dim, h1[np.arange(s.size), dim])
        pool.push(lo=np.concatenate([l1, l2]), hi=np.concatenate([h1, h2]),
                  score=np.concatenate([s, s]), sens=np.zeros((2 * s.size, d)),
                  parent=np.zeros((2 * s.size, 0)), share=np.concatenate([Vb, Vb]) * 0.5,
                  node=np.concatenate([kids[:, 0], kids[:, 1]]))
        return None

    def _trial_round(self, pool, t):
        """"trial": :meth:`expand` on the round's boxes (shared with the helper process on a
        large round), the halves kept pushed into the pool. The result when that decides."""
        L, H, Sb, Gb, Pb, Vb = t["lo"], t["hi"], t["score"], t["sens"], t["parent"], t["share"]
        Nb = t["node"]
        n = L.shape[0]
        if self.helper is None and self.workers > 1 and n >= PARALLEL_MIN:
            self.helper = Helper(self.expand, single=self.o.one_thread)
        fields = (L, H, Sb, Gb, Pb, Vb, Nb)
        if self.helper is not None and n >= PARALLEL_MIN:
            # one_thread: a core each (the helper's rounds run on one thread too)
            with one_thread() if self.o.one_thread else contextlib.nullcontext():
                outs = shared_round(self.helper, self.expand, fields, n)
            if outs is None:  # the second process is gone: alone from now
                self.helper.close()
                self.helper, self.workers = None, 1
                outs = [self.expand(*fields)]
        else:
            outs = [self.expand(*fields)]
        self.stats["domains"] += sum(o[2] for o in outs)
        for verdict, x, _ in outs:
            if verdict == "sat":
                return self.result("sat", x)
        if any(o[0] == "unknown" for o in outs):
            return self.result("unknown", open_scores=np.r_[pool.view("score"), Sb],
                               note="box too small to split")
        self.stats["splits"] += n
        for _, kept, _ in outs:
            pool.push(**kept)
        return None

    def expand(self, L, H, Sb, Gb, Pb, Vb, Nb):
        """One "trial" round on the boxes given (rows): ("sat", x, boxes bounded) when a
        candidate point violates the property, ("unknown", None, 0) when some box can no
        longer be split, else ("open", the halves kept as BoxPool fields, boxes bounded)."""
        ok = splittable(L, H)
        if not ok.any(axis=1).all():
            return "unknown", None, 0
        cand, use = self._trial_dims(L, H, Gb, ok)
        k = cand.shape[1]
        cand_ok = np.take_along_axis(ok, cand, axis=1) & use
        KL, KH, used = self._halves(L, H, cand, use)
        PK = np.repeat(Pb, 2 * k, axis=0)[used] if self.inherit else None
        lb, Lam, s, info = self.bound(KL, KH, PK)
        domains = KL.shape[0]
        live = s <= 0.0
        if live.any():
            x = self.attack(KL[live], KH[live], lb[live], Lam[live])
            if x is not None:
                return "sat", x, domains
        pick, pairs, best = self._kept(s, used, live, Sb, cand_ok)
        # the halves kept: alpha-CROWN on those still open
        s = self.refine(KL, KH, lb, s, info, pick)
        pick = pick[s[pick] <= 0.0]
        kid_of = np.zeros(KL.shape[0], np.int64)
        if self.proof is not None:  # the chosen split of each box, its proven halves
            dims = cand[np.arange(L.shape[0]), best]
            kids = self.proof.split_input(Nb, dims, KH[pairs[:, 0], dims])
            kid_of[pairs.ravel()] = kids.ravel()
            both = pairs.ravel()
            self._prove(kid_of, lb, s, both[s[both] > 0.0])
        return "open", dict(lo=KL[pick], hi=KH[pick], score=s[pick],
                            sens=self.sensitivity(lb[pick], Lam[pick]),
                            parent=self.boxes.pack([(l[pick], u[pick]) for l, u in info["bounds"]])
                            if self.inherit else np.zeros((pick.size, 0)),
                            share=0.5 * np.repeat(Vb, 2 * k)[used][pick],
                            node=kid_of[pick]), domains

    def _trial_dims(self, L, H, Gb, ok):
        """Per box the candidate dimensions (n, k): the k most sensitive splittable ones (all
        when k >= d), and the relatively widest one when it is much wider than each of them;
        and which candidates are bounded (n, k)."""
        o, d = self.o, self.d
        n = L.shape[0]
        sens = np.where(ok, Gb * (H - L), -1.0)
        extra = o.widest > 0.0 and o.trial_dims < d
        k = min(d, o.trial_dims) + extra
        cand = np.argsort(-sens, axis=1, kind="stable")[:, :k]  # (n, k)
        use = np.ones((n, k), bool)  # the candidates bounded
        if extra:
            # one more candidate when some dimension is much wider (relative to the
            # case's box) than every one ranked: that one
            rel = np.where(ok, (H - L) / self.span, -1.0)
            wd = np.argmax(rel, axis=1)
            top = np.take_along_axis(rel, cand[:, :k - 1], axis=1).max(axis=1)
            ranked = np.any(cand[:, :k - 1] == wd[:, None], axis=1)
            use[:, k - 1] = ~ranked & (rel[np.arange(n), wd] >= o.widest * top)
            cand[:, k - 1] = np.where(use[:, k - 1], wd, cand[:, 0])
        return cand, use

    def _halves(self, L, H, cand, use):
        """Both halves of each box along each of its candidates bounded (box-major, then
        candidate, then half), and the mask of those (per box, candidate and half)."""
        n, k = cand.shape
        d = self.d
        kids_lo, kids_hi = [], []
        for t in range(k):
            l1, h1, l2, h2 = halve(L, H, cand[:, t])
            kids_lo += [l1, l2]
            kids_hi += [h1, h2]
        used = np.repeat(use.ravel(), 2)  # per (box, cand, half)
        KL = np.stack(kids_lo, axis=1).reshape(n * 2 * k, d)[used]  # box-major
        KH = np.stack(kids_hi, axis=1).reshape(n * 2 * k, d)[used]
        return KL, KH, used

    @staticmethod
    def _kept(s, used, live, Sb, cand_ok):
        """The halves kept (indices into the bounded ones, open only), both halves of the
        split chosen per box (n, 2) and its candidate (n,): per box the split
        leaving the least total deficit (a proven half counts 0; the worse half alone would
        prefer a dimension that changes nothing over one that proves a half), or the first
        candidate when no split improves on the parent's score ``Sb``."""
        n, k = cand_ok.shape
        sf = np.full(n * 2 * k, -np.inf)
        sf[used] = s
        # A half is never worse than its parent (the parent's bound holds on it).
        s2 = np.maximum(sf.reshape(n, k, 2), Sb[:, None, None])
        deficit = np.where(cand_ok, np.minimum(s2, 0.0).sum(axis=2), -np.inf)
        best = np.argmax(deficit, axis=1)
        # no split improves (all tie with the parent): the most sensitive dimension, else
        # argmax's first index could halve one dimension forever
        # (a parent without a finite score, e.g. a graph bound through an unbounded operation:
        # flat when no split bounds a half either)
        top, fin = deficit.max(axis=1), np.isfinite(Sb)
        S = np.where(fin, Sb, 0.0)
        flat = np.where(fin, top - 2.0 * np.minimum(S, 0.0) <= FLAT * np.abs(S), top == -np.inf)
        best[flat] = 0
        pick = (np.arange(n)[:, None] * 2 * k + best[:, None] * 2 + np.arange(2)[None]).ravel()
        pick = (np.cumsum(used) - 1)[pick]  # candidate 0 is always bounded
        return pick[live[pick]], pick.reshape(n, 2), best
