"""What a ReLU-splitting search decides (:class:`ReluSplitProblem`; the rows and cases every
bounder holds, :class:`CaseRows`) and its domains: a batch of them (:class:`Domains`) and the
open ones (:class:`DomainPool`: preallocated arrays with a heap on the score, worst bound
first).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from crown_cli.engine.rounding import round_up


@dataclass(frozen=True, eq=False)
class ReluSplitProblem:
    """Some x in the box [lo, hi] with ``A f(x) <= b``? On the network of ``weights``,
    ``biases`` with ReLU, or leaky ReLU of slope ``leak`` (None: the default), after every
    layer but the last. ``groups`` (m,): the case of each row, rows of a case adjacent
    (default: one case); the unsafe set is the union over cases of ``{A_g f(x) <= b_g}``.
    ``layer_bounds``: the hidden layers' (l, u) valid on the box (default: CROWN's);
    ``layer_slopes``: lower slopes for the per-domain hidden-layer bounds, as
    :func:`~crown_cli.verification.bab.relu_split.root_layer_bounds` returns them with
    ``slopes`` (given with its bounds)."""

    weights: Sequence[np.ndarray]
    biases: Sequence[np.ndarray]
    lo: np.ndarray
    hi: np.ndarray
    A: np.ndarray
    b: np.ndarray
    activation: str = "relu"
    leak: Optional[float] = None
    layer_bounds: Optional[Sequence] = None
    groups: Optional[np.ndarray] = None
    layer_slopes: Optional[Sequence] = None


class CaseRows:
    """The rows ``A f(x) - b_up`` of a ReLU-splitting bounder (dense :class:`Bounder` or
    graph :class:`GraphBounder`) and the case of each: ``m`` rows, ``group_of`` (m,),
    ``gstart`` (the first row of each case). The unsafe set is the union over cases of
    ``{A_g f(x) <= b_g}``: a domain is proven when every case has a row whose lower bound is
    above 0 (:meth:`score` > 0)."""

    def _rows(self, A, b, groups):
        """The rows ``A f(x) - b_up`` and the case of each."""
        self.A = np.atleast_2d(np.asarray(A, dtype=np.float64))
        self.b = np.asarray(b, dtype=np.float64).reshape(-1)
        self.b_up = round_up(self.b)
        self.m = self.A.shape[0]
        g = np.zeros(self.m, np.int64) if groups is None else np.asarray(groups, np.int64)
        if g.shape != (self.m,) or (self.m and (g[0] != 0 or np.any(
                (np.diff(g) != 0) & (np.diff(g) != 1)))):
            raise ValueError("groups: one case number per row, 0, 1, ... with adjacent rows")
        self.group_of = g
        self.gstart = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if self.m else \
            np.zeros(0, np.int64)

    def score(self, v) -> np.ndarray:
        """Per domain, from row bounds v (B, m): the worst case's best row, (B,); > 0 proves
        the domain (NaN never does)."""
        if self.gstart.size <= 1:
            return v.max(axis=1)
        return np.maximum.reduceat(v, self.gstart, axis=1).min(axis=1)

    def score_row(self, v) -> np.ndarray:
        """Per domain the row :meth:`score` takes (the worst case's best row), (B,)."""
        if self.gstart.size <= 1:
            return v.argmax(axis=1)
        worst = np.maximum.reduceat(v, self.gstart, axis=1).argmin(axis=1)
        return np.where(self.group_of[None, :] == worst[:, None], v, -np.inf).argmax(axis=1)

    def case_rows(self):
        """The rows of each case: a list of (first, end) pairs, in case order."""
        return list(zip(self.gstart.tolist(), self.gstart[1:].tolist() + [self.m]))


@dataclass
class Domains:
    """A batch of B subdomains of one box, one entry per domain on the leading axis."""

    split: np.ndarray  # (B, nU) int8: +1 active, -1 inactive, 0 not split
    alpha: np.ndarray  # (B, m, nU) float32: lower slopes per row
    beta: np.ndarray  # (B, m, nU) float32: split multipliers per row
    cand: np.ndarray  # (B, K): branching candidates (unstable-neuron indices, -1: none)
    row: np.ndarray  # (B,): the row a joint search branches for
    dl: np.ndarray  # (B, nU) or (B, 0): the domain's own bounds of the unstable neurons
    du: np.ndarray
    done: np.ndarray  # (B, cases) bool: cases proven in float64 on an ancestor
    depth: np.ndarray  # (B,): branching decisions (not implied splits)
    node: Optional[np.ndarray] = None  # (B,): the node of a recorded proof tree
    # the cuts' multipliers the domain's children start from (cuts.sparse_multipliers):
    # (B, m, k) float32 values and int32 serials of their cuts, -1: none
    mu_val: Optional[np.ndarray] = None
    mu_ser: Optional[np.ndarray] = None

    def take(self, keep) -> "Domains":
        """The domains selected by ``keep`` (a mask or indices), without candidates or
        rows (as a batch is before it is bounded)."""
        def sel(a):
            return None if a is None else a[keep]

        return Domains(self.split[keep], self.alpha[keep], self.beta[keep], None, None,
                       self.dl[keep], self.du[keep], self.done[keep], self.depth[keep],
                       sel(self.node), sel(self.mu_val), sel(self.mu_ser))


class DomainPool:
    """Open domains: arrays indexed by slot, a heap of (score, slot) worst first."""

    _FIELDS = ("split", "alpha", "beta", "cand", "row", "dl", "du", "done", "depth", "node",
               "mu_val", "mu_ser")

    def __init__(self, nU, m, K, cap=1024, bounds=False, cases=1, mu_keep=0):
        self.nU, self.m, self.K = nU, m, K
        self.done = np.zeros((cap, cases), bool)  # per domain: cases proven (float64)
        self.split = np.zeros((cap, nU), np.int8)
        # per-domain bounds of the unstable neurons (only when tightened per domain)
        self.dl = np.zeros((cap, nU if bounds else 0))
        self.du = np.zeros((cap, nU if bounds else 0))
        self.alpha = np.zeros((cap, m, nU), np.float32)
        self.beta = np.zeros((cap, m, nU), np.float32)
        self.cand = np.zeros((cap, K), np.int64)
        self.row = np.zeros(cap, np.int64)
        self.depth = np.zeros(cap, np.int64)  # branching decisions (not implied splits)
        self.node = np.zeros(cap, np.int64)
        # the cuts' multipliers kept per domain (``mu_keep`` of each row's, Domains.mu_val)
        self.mu_val = np.zeros((cap, m, mu_keep), np.float32)
        self.mu_ser = np.full((cap, m, mu_keep), -1, np.int32)
        self.free = list(range(cap - 1, -1, -1))
        self.heap = []

    def _grow(self):
        cap = self.split.shape[0]
        for name in self._FIELDS:
            old = getattr(self, name)
            new = np.zeros((2 * cap,) + old.shape[1:], old.dtype)
            new[:cap] = old
            setattr(self, name, new)
        self.free.extend(range(2 * cap - 1, cap - 1, -1))

    def push(self, score, d: Domains):
        """Add the domains ``d`` with their scores (B,)."""
        n = d.split.shape[0]
        while len(self.free) < n:
            self._grow()
        slots = np.array([self.free.pop() for _ in range(n)], dtype=np.int64)
        self.split[slots] = d.split
        self.alpha[slots] = d.alpha
        self.beta[slots] = d.beta
        self.cand[slots] = d.cand
        self.row[slots] = d.row
        self.depth[slots] = d.depth
        self.done[slots] = d.done
        if d.node is not None:
            self.node[slots] = d.node
        if self.dl.shape[1]:
            self.dl[slots] = d.dl
            self.du[slots] = d.du
        if self.mu_val.shape[2]:
            if d.mu_val is None:
                self.mu_val[slots] = 0.0
                self.mu_ser[slots] = -1
            else:
                self.mu_val[slots] = d.mu_val
                self.mu_ser[slots] = d.mu_ser
        for s, slot in zip(score.tolist(), slots.tolist()):
            heapq.heappush(self.heap, (s, slot))

    def pop(self, n) -> Domains:
        """The (at most) n worst domains, removed from the pool."""
        items = [heapq.heappop(self.heap) for _ in range(min(n, len(self.heap)))]
        slots = np.array([s for _, s in items], dtype=np.int64)
        out = Domains(*(getattr(self, f)[slots].copy() for f in self._FIELDS))
        self.free.extend(slots.tolist())
        return out

    def __len__(self):
        return len(self.heap)

    def worst(self):
        return self.heap[0][0] if self.heap else np.inf


def halve(lo, hi, dim):
    """Children of each box (rows) halved along dim[j]: (lo1, hi1, lo2, hi2). The midpoint
    0.5 lo + 0.5 hi lies in [lo, hi], so the two halves cover the box exactly."""
    rows = np.arange(lo.shape[0])
    mid = 0.5 * lo[rows, dim] + 0.5 * hi[rows, dim]
    hi1 = hi.copy()
    hi1[rows, dim] = mid
    lo2 = lo.copy()
    lo2[rows, dim] = mid
    return lo, hi1, lo2, hi


def splittable(lo, hi):
    """Dimensions whose midpoint differs from both ends (a split makes progress)."""
    mid = 0.5 * lo + 0.5 * hi
    return (mid > lo) & (mid < hi)


class BoxPool:
    """The open sub-boxes of an input-splitting search: named arrays with one row per box,
    preallocated and grown by doubling, rows ``0 .. n-1`` live. Taking the worst boxes moves
    the last rows into the holes, so a round costs the rows it touches, not the whole pool."""

    def __init__(self, **first):
        self.n = 0
        self.arrays = {name: np.empty((max(16, 2 * len(v)),) + v.shape[1:], v.dtype)
                       for name, v in first.items()}
        self.push(**first)

    def push(self, **rows):
        """Append rows (one array per field, equal lengths)."""
        k = len(next(iter(rows.values())))
        cap = next(iter(self.arrays.values())).shape[0]
        if self.n + k > cap:
            cap = max(2 * cap, self.n + k)
            for name, a in self.arrays.items():
                new = np.empty((cap,) + a.shape[1:], a.dtype)
                new[:self.n] = a[:self.n]
                self.arrays[name] = new
        for name, v in rows.items():
            self.arrays[name][self.n:self.n + k] = v
        self.n += k

    def round_end(self, stats, progress=None) -> float:
        """After a round of an input-splitting search: record the peak of open boxes in
        ``stats["peak"]``, report ``progress(domains, open, worst score)``, and return the
        share of the case's box proven (1 - the open boxes' ``share``)."""
        stats["peak"] = max(stats["peak"], self.n)
        if progress is not None:
            sc = self.view("score")
            progress(stats["domains"], self.n, float(sc.min()) if sc.size else np.inf)
        return max(0.0, 1.0 - float(np.sum(self.view("share"))))

    def view(self, name):
        """The live rows of a field (a view: valid until the next push or pop)."""
        return self.arrays[name][:self.n]

    def pop_worst(self, k: int, key: str = "score"):
        """Remove and return (dict of copies) the ``k`` rows with the lowest ``key`` (all when
        ``k >= n``)."""
        n = self.n
        if n <= k:
            self.n = 0
            return {name: a[:n].copy() for name, a in self.arrays.items()}
        idx = np.argpartition(self.arrays[key][:n], k - 1)[:k]
        out = {name: a[idx] for name, a in self.arrays.items()}
        taken = np.zeros(n, bool)
        taken[idx] = True
        holes = idx[idx < n - k]
        movers = np.flatnonzero(~taken[n - k:]) + (n - k)
        for a in self.arrays.values():
            a[holes] = a[movers]
        self.n = n - k
        return out

    def __len__(self):
        return self.n


def tighten_layers(split, dl, du, start, offsets, layer, reach, at=0.0):
    """The frame of every bounder's per-domain bounds (``Bounder.tighten`` and
    ``tighten_opt``, ``GraphBounder.tighten``): ``split`` (B, nU) int8, ``dl``, ``du`` (B, nU)
    bounds valid on each domain, ``start`` (B,) the layer of each domain's new split. Split
    neurons' bounds first take their side of their threshold ``at`` (0 for ReLU; (nU,) or a
    number); then for each layer k >= 1 with unstable neurons (``offsets``) that
    ``reach(k, start)`` does not skip (None; else a mask over the domains, or True),
    ``layer(k, doms, split, dl, du)`` narrows in place the bounds of layer k's neurons on the
    domains ``doms`` (those with ``start < k``, in the mask, not yet empty), after which the
    neurons proven stable become implied splits and domains with crossing bounds are marked
    empty. Returns (split, dl, du, empty)."""
    split, dl, du = split.copy(), np.array(dl, np.float64), np.array(du, np.float64)
    dl = np.where(split > 0, np.maximum(dl, at), dl)
    du = np.where(split < 0, np.minimum(du, at), du)
    empty = np.any(dl > du, axis=1)
    start = np.asarray(start)
    for k in range(1, len(offsets) - 1):
        o0, o1 = offsets[k], offsets[k + 1]
        keep = reach(k, start) if o1 > o0 else None
        if keep is None:
            continue
        doms = np.flatnonzero((start < k) & ~empty & keep)
        if doms.size == 0:
            continue
        layer(k, doms, split, dl, du)
        sl, su, sp = dl[doms, o0:o1], du[doms, o0:o1], split[doms, o0:o1]
        sp[(sp == 0) & (sl >= 0.0)] = 1
        sp[(sp == 0) & (su <= 0.0)] = -1
        split[doms, o0:o1] = sp
        empty[doms] |= np.any(sl > su, axis=1)
    return split, dl, du, empty
