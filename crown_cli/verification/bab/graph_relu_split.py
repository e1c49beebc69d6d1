"""ReLU-splitting branch and bound on a graph network that does not lower to dense layers
(max pools, residual connections, branches, several activation types):
:func:`graph_relu_split_steps`.

The graph engine's counterpart of :mod:`crown_cli.verification.bab.relu_split`, smaller:

- The root: every node's bounds over the box (:class:`~crown_cli.engine.graph_bounds.GraphBounds`,
  CROWN intersected with interval arithmetic). The ReLU neurons unstable there are the only
  ones split; every domain keeps the root's node bounds (valid on each subdomain).
- A domain is a set of decisions, neuron -> active (z >= 0) or inactive (z <= 0). Its rows
  (the case's rows of ``A f(x) - b``) are bounded by one back-substitution with per-row lines
  (:meth:`GraphBounds.lower` with ``lines``): a split-active neuron is the identity, a
  split-inactive one 0 (exact on the domain), an open unstable one the root's chord above and
  a free lower slope alpha in [0, 1] below; other nodes (max pools, smooth activations) keep
  the root's lines. The splits enter by multipliers beta >= 0 (beta-CROWN, Wang et al.,
  NeurIPS 2021): the row bounds ``margin + sum_j beta_j s_j z_j`` with ``s_j z_j <= 0`` on the
  domain (s = -1 active, +1 inactive), a lower bound of the margin there for every beta >= 0.
- alpha and beta are optimised by projected Adam (:mod:`crown_cli.engine.optim`) on the
  verified float64 bound itself, with the gradient of :mod:`crown_cli.engine.graph_alpha`
  (a row's bound is linear in each coefficient: its derivative is the coefficient's node
  value under the lines the row took, at the row's minimiser over the box), warm-started
  from the parent; the best iterate per row is kept. Every bound that closes a domain is a
  float64 evaluation with every rounding charged, whatever the optimiser did.
- A child's score is the larger of its bound and its parent's (the parent's holds on it).
- Branching: the open neuron whose upper line costs the domain's rows most (BaBSR: a
  negative coefficient times the chord's intercept; ties broken by |coefficient| times the
  neuron's width). Scoring positive coefficients by their lower line's gap as well took 10
  to 65 times more domains on the residual test graph.
- ``sat``: the minimisers of the domains' rows are checked by the graph's float64 forward pass.
  A domain with every unstable neuron split is affine on a graph of ReLUs without max pools:
  a linear program (scipy HiGHS) gives a candidate point or multipliers that a float64
  bound checks. One that stays open (a max pool's lines stay loose) is set aside; the search
  goes on (it may still find a counterexample) and ends ``unknown`` instead of ``unsat``.

Arrays in, result out: no files and no printing.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

import numpy as np

from crown_cli.engine.chain import Lines
from crown_cli.engine.graph_alpha import _minimiser, _relaxed_forward
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.engine.optim import Adam, AdamSettings, BestIterate
from crown_cli.verification.outcome import BabResult, finish, violations_of

MAX_OPEN = 100_000
MAX_MEMORY = 2.0 ** 31  # bytes the open domains' slopes and multipliers may take
STEER = AdamSettings(eps=1e-12)


def splittable_nodes(graph) -> List[int]:
    """The activation nodes whose neurons can be split: ReLU."""
    return [i for i, n in enumerate(graph.nodes)
            if n.kind == "activation" and n.op.name == "relu"]


class _Space:
    """The root's unstable ReLU neurons, numbered 0..nU-1 node by node, and the per-row lines
    of a batch of domains."""

    def __init__(self, gb: GraphBounds):
        self.gb = gb
        self.nodes: List[Tuple[int, np.ndarray, int]] = []  # (node, neurons, offset)
        off = 0
        for i in splittable_nodes(gb.g):
            p = gb.g.nodes[i].inputs[0]
            idx = np.flatnonzero((gb.lo[p] < 0.0) & (gb.hi[p] > 0.0))
            if idx.size:
                self.nodes.append((i, idx, off))
                off += idx.size
        self.nU = off
        self.l = np.concatenate([self.gb.lo[gb.g.nodes[i].inputs[0]][idx]
                                 for i, idx, _ in self.nodes]) if off else np.zeros(0)
        self.u = np.concatenate([self.gb.hi[gb.g.nodes[i].inputs[0]][idx]
                                 for i, idx, _ in self.nodes]) if off else np.zeros(0)

    def lines(self, split, alpha, beta) -> Dict[int, Lines]:
        """Per splittable node, the rows' lines: ``split`` (R, nU) int8 per row, ``alpha``,
        ``beta`` (R, nU)."""
        out = {}
        R = split.shape[0]
        for i, idx, off in self.nodes:
            base = self.gb.lines[i]
            n = self.gb.g.nodes[i].size
            sp = split[:, off:off + idx.size]
            lower = np.broadcast_to(np.asarray(base.lower, np.float64), (R, n)).copy()
            upper = np.broadcast_to(np.asarray(base.upper, np.float64), (R, n)).copy()
            ui = np.zeros((R, n)) if base.upper_icpt is None else \
                np.broadcast_to(np.asarray(base.upper_icpt, np.float64), (R, n)).copy()
            fixed = np.where(sp > 0, 1.0, 0.0)
            lower[:, idx] = np.where(sp == 0, alpha[:, off:off + idx.size], fixed)
            upper[:, idx] = np.where(sp == 0, upper[:, idx], fixed)
            ui[:, idx] = np.where(sp == 0, ui[:, idx], 0.0)
            extra = np.zeros((R, n))
            extra[:, idx] = -sp * beta[:, off:off + idx.size]
            out[i] = Lines(base.cols, lower, upper, upper_icpt=ui, extra=extra)
        return out

    def initial_alpha(self) -> np.ndarray:
        """CROWN's lower slopes of the unstable neurons (nU,)."""
        if self.nU == 0:
            return np.zeros(0)
        return np.concatenate([np.asarray(np.broadcast_to(self.gb.lines[i].lower,
                                                          (self.gb.g.nodes[i].size,)))[idx]
                               for i, idx, _ in self.nodes]).astype(np.float64)


def _bound(space: _Space, A, b_up, split, alpha, beta, iters: int, lr: float,
           fsb_k: int = 1):
    """Optimise and bound a batch: ``split`` (N, nU), ``alpha``, ``beta`` (N, m, nU) (updated
    in place to the best iterate). Returns (bounds (N, m) float64 verified, minimisers
    (N * m, d), the neuron to split next per domain (N,), -1 when none is open, and the
    coefficient each row gives that neuron's activation at the best iterate (N, m)).
    ``fsb_k`` > 1: the neuron by filtered smart branching over that many candidates
    (:func:`_fsb_choice`), else the best BaBSR score."""
    gb, g = space.gb, space.gb.g
    N, m, nU = alpha.shape
    R = N * m
    Lam = np.tile(A, (N, 1))
    sp = np.repeat(split, m, axis=0)
    al, be = alpha.reshape(R, nU).copy(), beta.reshape(R, nU).copy()
    free = sp == 0
    best = BestIterate(R, al, be)
    best_x = np.zeros((R, g.input_size))
    oa, ob = Adam(al, STEER, lo=0.0, hi=1.0), Adam(be, STEER, lo=0.0)
    for it in range(iters + 1):
        tape = {}
        val = gb.lower(g.output, Lam, tape=tape, lines=space.lines(sp, al, be)) - np.tile(b_up, N)
        x = _minimiser(gb, tape.pop("Lx"))
        imp = best.offer(np.where(np.isfinite(val), val, -np.inf), al, be)
        best_x[imp] = x[imp]
        if it == iters or space.nU == 0:
            break
        vals = _relaxed_forward(gb, g.output, x, tape)
        ga, gbeta = np.zeros((R, nU)), np.zeros((R, nU))
        for i, idx, off in space.nodes:
            if i not in tape:
                continue
            L, pos = tape[i][0][:, idx], tape[i][1][:, idx]
            z = vals[g.nodes[i].inputs[0]][:, idx]
            s = sp[:, off:off + idx.size]
            ga[:, off:off + idx.size] = np.where(pos & free[:, off:off + idx.size], L * z, 0.0)
            gbeta[:, off:off + idx.size] = np.where(s != 0, -s * z, 0.0)
        al = oa.propose(al, ga, it + 1, lr)
        be = ob.propose(be, gbeta, it + 1, lr)
        al = np.where(free, np.nan_to_num(al, nan=0.0), 0.0)
        be = np.where(free, 0.0, np.nan_to_num(be, nan=0.0))
    al, be = best.params
    alpha[...] = al.reshape(N, m, nU)
    beta[...] = be.reshape(N, m, nU)
    if nU == 0:
        return best.best.reshape(N, m), best_x, np.full(N, -1), np.zeros((N, m))
    # the coefficients at the best iterate: branching scores (BaBSR: what each open neuron's
    # upper line costs, a negative coefficient times the chord's intercept; ties, e.g. rows
    # reaching a layer with positive coefficients only, broken by |coefficient| times the
    # neuron's width) and the chosen neuron's coefficients; the last pass's tape is that
    # iterate's when every row's best came from it
    if not imp.all():
        tape = {}
        gb.lower(g.output, Lam, tape=tape, lines=space.lines(sp, al, be))
    Lall = np.zeros((R, nU))
    for i, idx, off in space.nodes:
        if i in tape:
            Lall[:, off:off + idx.size] = tape[i][0][:, idx]
    t = -space.u * space.l / (space.u - space.l)  # the chords' intercepts
    scores = np.maximum(-Lall, 0.0) * t + 1e-3 * np.abs(Lall) * (space.u - space.l)
    scores = np.where(sp == 0, scores, -np.inf).reshape(N, m, nU).max(axis=1)
    choice = np.where(np.isfinite(scores).any(axis=1), np.argmax(scores, axis=1), -1)
    Lall = Lall.reshape(N, m, nU)
    if fsb_k > 1 and np.any(choice >= 0):
        choice = _fsb_choice(space, A, b_up, split, alpha, beta, scores, Lall, fsb_k, choice)
    Lc = Lall[np.arange(N), :, np.maximum(choice, 0)]
    return best.best.reshape(N, m), best_x, choice, Lc


def _fsb_choice(space: _Space, A, b_up, split, alpha, beta, scores, Lall, k: int, choice):
    """Filtered smart branching (the dense search's rule): per domain its ``k`` best
    candidates by the BaBSR score, each candidate's two children bounded once at the
    domain's slopes and multipliers (the new split's multiplier as :func:`_children` sets
    it), the candidate with the best worse child taken. Domains with no open neuron keep
    ``choice`` (-1)."""
    gb = space.gb
    N, m, nU = alpha.shape
    K = min(k, nU)
    cand = np.argsort(-scores, axis=1, kind="stable")[:, :K]  # (N, K)
    valid = np.isfinite(np.take_along_axis(scores, cand, axis=1)).ravel()
    reps, c = np.repeat(np.arange(N), K), cand.ravel()
    cs, ca, cb = _children(split[reps], alpha[reps], beta[reps], c, Lall[reps, :, c])
    R = cs.shape[0] * m
    val = gb.lower(gb.g.output, np.tile(A, (cs.shape[0], 1)),
                   lines=space.lines(np.repeat(cs, m, axis=0), ca.reshape(R, nU),
                                     cb.reshape(R, nU))) - np.tile(b_up, cs.shape[0])
    v = np.where(np.isfinite(val), val, -np.inf).reshape(-1, m).max(axis=1)
    P = N * K
    worse = np.where(valid, np.minimum(v[:P], v[P:]), -np.inf).reshape(N, K)
    best = cand[np.arange(N), np.argmax(worse, axis=1)]
    return np.where(choice >= 0, best, -1)


def _children(split, alpha, beta, choice, Lc):
    """The two children of each parent (first all active, then all inactive), warm-started
    from the parent's slopes and multipliers; the new split's multiplier is set so that the
    child's first bound is its parent's (the neuron's lower line a z, taken where its
    coefficient L >= 0, is what the child's exact line plus the multiplier term gives: active
    ``z - beta z`` with beta = L (1 - a), inactive ``0 + beta z`` with beta = L a; where L < 0
    the exact line alone is at least the parent's chord on the domain)."""
    P = split.shape[0]
    ar = np.arange(P)
    cs = np.concatenate([split, split])
    cs[ar, choice] = 1
    cs[P + ar, choice] = -1
    ca = np.concatenate([alpha, alpha])
    cb = np.concatenate([beta, beta])
    a = alpha[ar, :, choice]  # (P, m)
    pos = np.maximum(Lc, 0.0)
    cb[ar, :, choice] = pos * (1.0 - a)
    cb[P + ar, :, choice] = pos * a
    return cs, ca, cb


def exact_when_split(graph) -> bool:
    """True when a domain with every unstable neuron split is affine: ReLU activations only,
    no max pool (whose lines stay loose)."""
    return all(n.kind != "maxpool" for n in graph.nodes) and all(
        n.op.name == "relu" for n in graph.nodes if n.kind == "activation")


def _leaf(space: _Space, A, b, b_up, split_row, check):
    """A fully split open domain of an :func:`exact_when_split` graph: a counterexample x,
    True (proven), or False. The graph is affine on the domain; its affine form (the lines'
    forward pass at 0 and the unit vectors) gives a linear program
    (:func:`~crown_cli.verification.bab.relu_split.affine_leaf_lp`) whose multipliers of the
    sign constraints are checked as beta by a float64 bound."""
    from crown_cli.verification.bab.relu_split import affine_leaf_lp

    gb, g = space.gb, space.gb.g
    m, nU, d = A.shape[0], space.nU, g.input_size
    sp = split_row[None].astype(np.int8)
    tape = {}
    gb.lower(g.output, A[:1], tape=tape, lines=space.lines(sp, np.zeros((1, nU)),
                                                           np.zeros((1, nU))))
    tape.pop("Lx")
    X = np.vstack([np.zeros(d), np.eye(d)])
    vals = _relaxed_forward(gb, g.output, X, tape)
    F0 = vals[g.output][0]
    J = vals[g.output][1:] - F0  # (d, outputs)
    C, e = [], []
    for i, idx, off in space.nodes:
        z = vals[g.nodes[i].inputs[0]][:, idx]
        s = split_row[off:off + idx.size].astype(np.float64)
        C.append(-s[:, None] * (z[1:] - z[0]).T)  # s z >= 0 <=> -s (Jz x + z0) <= 0
        e.append(s * z[0])
    C = np.concatenate(C) if C else np.zeros((0, d))
    e = np.concatenate(e) if e else np.zeros(0)
    out = affine_leaf_lp(A @ J.T, A @ F0 - b, C, e, gb.qcode.lo, gb.qcode.hi, np.arange(m))
    if out[0] == "sat":
        return check(out[1][None, :])
    if out[0] != "beta":
        return False
    for scale in (1.0, 1.0 + 1e-6, 1.01):
        be = np.zeros((m, nU))
        be[out[1]] = scale * out[2]
        val = gb.lower(g.output, A, lines=space.lines(np.repeat(sp, m, axis=0),
                                                       np.zeros((m, nU)), be)) - b_up
        if np.any(val > 0.0):
            return True
    return False


@dataclass(frozen=True)
class GraphReluSplitOptions:
    """The settings of a graph ReLU-splitting search (:func:`graph_relu_split_steps`)."""

    max_domains: int = MAX_OPEN  # more open domains: unknown (lowered to fit MAX_MEMORY)
    batch: int = 16  # parents split per round
    iters: int = 10  # Adam steps on alpha and beta per domain
    root_iters: int = 30  # ... at the root
    lr: float = 0.1  # Adam's step size
    fsb_k: int = 1  # > 1: filtered smart branching over that many BaBSR candidates


def graph_relu_split(graph, lo, hi, A, b, deadline: float, **options) -> BabResult:
    """:func:`graph_relu_split_steps` run to its end."""
    return finish(graph_relu_split_steps(graph, lo, hi, A, b, deadline, **options))


def graph_relu_split_steps(graph, lo, hi, A, b, deadline: float,
                           options: Optional[GraphReluSplitOptions] = None, *, progress=None,
                           bounds=None, **settings):
    """As a generator (yields the share of the domain tree proven after every batch, returns
    the :class:`BabResult`): is there an x in [lo, hi] with ``A f(x) <= b`` (every row)?

    ``unsat``: every domain has a row whose verified bound is above its b (rounded up one
    ulp); ``sat``: a point the graph's float64 forward pass confirms; ``unknown``: more than
    ``max_domains`` open domains (lowered so that their stored state stays within
    :data:`MAX_MEMORY`), or a fully split domain that stays open;
    ``timeout``: ``deadline`` (``time.monotonic()``) passed. ``options``: the
    :class:`GraphReluSplitOptions` (``batch``: parents split per round; ``iters``
    (``root_iters`` at the root): Adam steps on alpha and beta per domain); ``settings``
    (keywords named like its fields) override them.
    ``progress(domains, open, worst)`` after every round. ``bounds``: the box's
    :class:`GraphBounds` when the caller has it (e.g. from the bound stages)."""
    search = _GraphSearch(graph, lo, hi, A, b, replace(options or GraphReluSplitOptions(),
                                                       **settings))
    return (yield from search.run(deadline, progress, bounds))


class _GraphSearch:
    """One graph ReLU-splitting search: the case in float64, its settings and counters, the
    open domains (a heap of (score, tie-break, split, alpha, beta, neuron to split, its
    coefficients, depth)); :meth:`run` is the search."""

    def __init__(self, graph, lo, hi, A, b, o: GraphReluSplitOptions):
        self.graph, self.o = graph, o
        self.lo0 = np.asarray(lo, dtype=np.float64).ravel()
        self.hi0 = np.asarray(hi, dtype=np.float64).ravel()
        self.A = np.atleast_2d(np.asarray(A, dtype=np.float64))
        self.b = np.asarray(b, dtype=np.float64).ravel()
        self.b_up = np.nextafter(self.b, np.inf)
        self.m = self.A.shape[0]
        self.t0 = time.monotonic()
        self.stats = {"domains": 0, "peak": 1, "batches": 0, "proven": 0}
        self.count, self.closed = 1, 0.0  # heap entries pushed; share of the tree proven
        self.stuck = []  # fully split domains left open

    def result(self, verdict, x=None, heap=(), note=""):
        s = self.stats
        worst = min((h[0] for h in heap), default=np.nan)
        return BabResult(verdict, x, s["domains"], s["peak"], worst,
                         time.monotonic() - self.t0, s["batches"], s["proven"], note=note)

    def check(self, X):
        X = np.clip(X, self.lo0, self.hi0)
        hit = violations_of(self.graph.forward, self.lo0, self.hi0, self.A, self.b, X)
        return X[np.argmax(hit)].copy() if hit.any() else None

    def run(self, deadline, progress, bounds):
        """The root, then rounds on the worst open domains until none is open, a
        counterexample, the deadline or the domain cap."""
        heap = self._root(bounds)
        if isinstance(heap, BabResult):
            return heap
        stats = self.stats
        while heap:
            if time.monotonic() >= deadline:
                return self.result("timeout", heap=heap)
            if len(heap) > self.max_domains:
                return self.result("unknown", heap=heap, note="domain cap")
            par = [heapq.heappop(heap) for _ in range(min(self.o.batch, len(heap)))]
            par = self._settle_leaves(par)
            if isinstance(par, np.ndarray):
                return self.result("sat", par)
            if not par:
                continue
            x = self._round(par, heap)
            if x is not None:
                return self.result("sat", x)
            stats["peak"] = max(stats["peak"], len(heap))
            if progress is not None:
                progress(stats["domains"], len(heap), heap[0][0] if heap else np.inf)
            yield min(1.0, self.closed)
        if self.stuck:  # searched to the end, but some fully split domain could not be decided
            return self.result("unknown", heap=self.stuck, note=f"{len(self.stuck)} domain(s) "
                               "with every unstable neuron split stayed open")
        return self.result("unsat")

    def _root(self, bounds):
        """The box bounded (``root_iters`` steps): the result when that decides, else the
        heap of open domains (the root)."""
        lo0, hi0, A, m = self.lo0, self.hi0, self.A, self.m
        x = self.check(0.5 * lo0[None] + 0.5 * hi0[None])
        if x is not None:
            return self.result("sat", x)
        if m == 0:
            return self.result("sat", 0.5 * lo0 + 0.5 * hi0)
        gb = GraphBounds(self.graph, *Box(lo0, hi0).args()) if bounds is None else bounds
        self.space = space = _Space(gb)
        nU = space.nU
        # the open domains' stored state (split, slopes, multipliers, coefficients) within
        # MAX_MEMORY: reaching the lowered cap ends the search unknown ("domain cap")
        self.max_domains = int(min(self.o.max_domains,
                                   MAX_MEMORY // (nU * (1 + 16 * m) + 16 * m + 256)))
        split = np.zeros((1, nU), np.int8)
        alpha = np.broadcast_to(space.initial_alpha(), (1, m, nU)).copy()
        beta = np.zeros((1, m, nU))
        val, X, choice, Lc = _bound(space, A, self.b_up, split, alpha, beta, self.o.root_iters,
                                    self.o.lr, self.o.fsb_k)
        self.stats["domains"] += 1
        score = float(val.max())
        if score > 0.0:
            self.stats["proven"] += 1
            return self.result("unsat")
        x = self.check(X)
        if x is not None:
            return self.result("sat", x)
        self.exact = exact_when_split(self.graph)
        return [(score, 0, split[0], alpha[0], beta[0], int(choice[0]), Lc[0], 0)]

    def _settle_leaves(self, par):
        """The parents with every unstable neuron split (still open) decided by
        :func:`_leaf` (exact graphs), else set aside; returns the other parents, or a
        counterexample."""
        leaves = [p for p in par if p[5] < 0]
        if not leaves:
            return par
        for p in leaves:
            out = _leaf(self.space, self.A, self.b, self.b_up, p[2], self.check) \
                if self.exact else False
            if isinstance(out, np.ndarray):
                return out
            if out:
                self.stats["proven"] += 1
                self.closed += 0.5 ** p[7]
            else:
                self.stuck.append(p)
        return [p for p in par if p[5] >= 0]

    def _round(self, par, heap):
        """The parents' children bounded, the open ones pushed: a counterexample found at
        their minimisers, or None."""
        stats, P = self.stats, len(par)
        cs, ca, cb = _children(np.stack([p[2] for p in par]), np.stack([p[3] for p in par]),
                               np.stack([p[4] for p in par]), np.array([p[5] for p in par]),
                               np.stack([p[6] for p in par]))
        val, X, choice, Lc = _bound(self.space, self.A, self.b_up, cs, ca, cb, self.o.iters,
                                    self.o.lr, self.o.fsb_k)
        stats["domains"] += 2 * P
        stats["batches"] += 1
        x = self.check(X)
        if x is not None:
            return x
        parent = np.array([p[0] for p in par] * 2)
        depth = np.array([p[7] for p in par] * 2) + 1
        s = np.maximum(val.max(axis=1), parent)
        for k in range(2 * P):
            if s[k] > 0.0:
                stats["proven"] += 1
                self.closed += 0.5 ** depth[k]
            else:
                self.count += 1
                heapq.heappush(heap, (float(s[k]), self.count, cs[k], ca[k], cb[k],
                                      int(choice[k]), Lc[k], int(depth[k])))
        return None
