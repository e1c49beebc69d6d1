"""ReLU splitting on a graph network that does not lower to dense layers (max pools, residual
connections, branches, several activation types): :class:`GraphBounder`, the graph engine's
counterpart of :class:`~crown_cli.verification.bab.bounder.Bounder`, under the one search of
:mod:`crown_cli.verification.bab.relu_split` (:func:`graph_relu_split_steps`).

- The root: every node's bounds over the box (:class:`~crown_cli.engine.graph_bounds.GraphBounds`,
  CROWN intersected with interval arithmetic, or the caller's). The ReLU neurons unstable
  there are split, and the neurons of S-shaped activations whose root lines are apart
  (:data:`SMOOTH_SPLITS`: once each, at 0 or their interval's midpoint, each half with its own
  relaxation), numbered node by node (a "layer" of the search is one such node); every
  domain keeps the root's node bounds by default. With ``interm=True`` each child's split
  ReLU nodes below its new split are bounded again on it (:meth:`GraphBounder.tighten`):
  tighter per domain, but 3-8x fewer domains a second, which did not pay on the graphs
  measured (docs/bab.md), so it is not the default.
- A domain's rows (``A f(x) - b``, b rounded up one ulp) are bounded by one
  back-substitution with per-row lines (:meth:`GraphBounds.lower` with ``lines``): a
  split-active neuron is the identity, a split-inactive one 0 (exact on the domain), an open
  unstable one the root's chord above and a free lower slope alpha in [0, 1] below; other
  nodes (max pools, smooth activations) keep the root's lines, and products of data the
  planes of each row's mix optimised once at the root (:func:`root_mixes`). The splits enter by
  multipliers beta >= 0 (beta-CROWN, Wang et al., NeurIPS 2021) as ``extra`` = -s beta on
  the neuron's input coefficient: the row bounds ``margin + sum_j beta_j s_j z_j`` with
  ``s_j z_j <= 0`` on the domain (s = -1 active, +1 inactive), a lower bound of the margin
  there for every beta >= 0. The search's steering evaluations (``dtype`` float32) run the
  engine's numpy path in float32; its proofs are float64 evaluations with every rounding
  charged by the engine (as the dense bounder's).
- The gradient in alpha and beta is :mod:`crown_cli.engine.graph_alpha`'s: a row's bound is
  linear in each coefficient, its derivative the coefficient's node value under the row's
  lines at the row's minimiser over the box (a forward pass of the relaxed graph).
- A domain with every unstable neuron split is affine on a graph of ReLUs without max pools
  (:func:`exact_when_split`): :meth:`GraphBounder.affine` gives its affine form for the
  search's leaf linear program; on other graphs such a domain stays open (the search ends
  ``unknown`` instead of ``unsat``).

Arrays in, result out: no files and no printing.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Dict, List, Optional

import numpy as np

from crown_cli.engine.batch_steps import Lines
from crown_cli.engine.graph_alpha import _minimiser, _relaxed_forward
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.node_rules import line_gap
from crown_cli.engine.input_sets import Box
from crown_cli.verification.bab.domains import CaseRows, tighten_layers
from crown_cli.verification.bab.relu_split import ReluSplitOptions, _Search
from crown_cli.graph.sign_check import decided_outputs
from crown_cli.verification.outcome import BabResult, finish, violations_of

# The graph search's settings where they differ from the dense defaults (docs/bab.md has
# the measurements): no per-domain intermediate bounds (interm: GraphBounder.tighten measured
# slower to a verdict on sri_resnet_a and on a trained residual MNIST MLP), branching
# anywhere, the root's node
# bounds as given, no PGD attack (the graph pipeline attacks before its bound stages); 64
# domains a batch since the steering runs in float32 (the tapes' memory of 32 in float64),
# 5 Adam steps a batch (10 before: twice the domains for a better worst bound on sri_resnet_a);
# each batch shared with a second process (shared_batches: a thread each)
GRAPH_OPTIONS = ReluSplitOptions(batch=64, iters=5, root_iters=30, branching="babsr",
                                 score="chords", interm=False, layer_window=0, tighten_root=False,
                                 attack_restarts=0, workers=2)


# S-shaped activations whose neurons are split too: at 0 where their input's interval holds it
# (each half then convex or concave, where the lines are tight), else at its midpoint
SMOOTH_SPLITS = ("sigmoid", "tanh", "arctan", "erf")
# a smooth neuron is a split candidate where its root lines are apart by more than this
SMOOTH_MIN_GAP = 1e-6


def splittable_nodes(graph) -> List[int]:
    """The activation nodes whose neurons can be split: ReLU, and the S-shaped activations
    (:data:`SMOOTH_SPLITS`)."""
    return [i for i, n in enumerate(graph.nodes)
            if n.kind == "activation" and (n.op.name == "relu" or n.op.name in SMOOTH_SPLITS)]


def exact_when_split(graph) -> bool:
    """True when a domain with every unstable neuron split is affine: ReLU activations only,
    no max pool (whose lines stay loose)."""
    return all(n.kind != "maxpool" for n in graph.nodes) and all(
        n.op.name == "relu" for n in graph.nodes if n.kind == "activation")


class GraphBounder(CaseRows):
    """Batched bounds of the rows ``A f(x) - b_up`` on ReLU-split subdomains of one box of a
    graph, with the interface the search (:class:`~crown_cli.verification.bab.relu_split._Search`),
    its optimiser and its branching use of a :class:`Bounder`: the unstable neurons numbered
    0..nU-1 node by node (``offsets``, ``ucols``, ``bounds`` (l, u) of each node's input,
    ``layer_of``), per domain ``split`` (B, nU) and per (domain, row) ``alpha``, ``beta``
    (B, m, nU). ``gb``: the box's :class:`GraphBounds`; ``groups``: the case of each row, as
    :class:`CaseRows` takes them."""

    leak = 0.0
    tightens = True  # per-domain bounds of the split ReLU nodes' inputs (:meth:`tighten`)
    # bytes of rows (and their lines) per back-substitution pass of :meth:`tighten`
    TIGHTEN_BYTES = 2 ** 26
    weights = ()  # (the dense bounder's layers, from which the search sizes its defaults)

    def __init__(self, graph, gb: GraphBounds, lo, hi, A, b, groups=None):
        self.graph, self.gb = graph, gb
        self.box = Box(lo, hi)
        self._rows(A, b, groups)
        self.mixes = root_mixes(gb, graph.output, self.A)
        self.exact = exact_when_split(graph)
        self.nodes, self.ucols, self.bounds, self.offsets = [], [], [], [0]
        self.halves = []  # per node: None (ReLU), or a smooth node's lines on both halves
        costs = []  # per node: what BaBSR scores (ReLU: the chord's intercept; smooth: the gap)
        ats = []  # per node: where its neurons split (ReLU 0)
        for i in splittable_nodes(graph):
            p, n = graph.nodes[i].inputs[0], graph.nodes[i].size
            l, u = gb.lo[p], gb.hi[p]
            if graph.nodes[i].op.name == "relu":
                idx = np.flatnonzero((l < 0.0) & (u > 0.0))
                half = None
                cost = np.broadcast_to(np.asarray(self._root(i).upper_icpt, np.float64),
                                       (n,))[idx]
            else:
                root = [np.broadcast_to(np.asarray(getattr(self._root(i), k), np.float64), (n,))
                        for k in ("upper", "upper_icpt", "lower", "lower_icpt")]
                gap = line_gap(l, u, *root)
                idx = np.flatnonzero(np.isfinite(l) & np.isfinite(u) & (gap > SMOOTH_MIN_GAP))
                half = self._halves(graph.nodes[i].op, l[idx], u[idx])
                cost = gap[idx]
            if idx.size:
                self.nodes.append(i)
                self.ucols.append(idx)
                self.bounds.append((l, u))
                self.halves.append(half)
                ats.append(np.zeros(idx.size) if half is None else half[2])
                costs.append(cost)
                self.offsets.append(self.offsets[-1] + idx.size)
        self.L, self.nU = len(self.nodes), self.offsets[-1]
        self.layer_of = np.repeat(np.arange(self.L), np.diff(self.offsets))
        # BaBSR's costs: the root chords' intercepts (the upper lines'), or a smooth neuron's
        # largest gap, which counts for rows of either sign (``two_sided``)
        self.chord_t = np.concatenate(costs) if self.nU else np.zeros(0)
        # each split neuron's threshold: -1 is ``z <= split_at``, +1 is ``z >= split_at``
        self.split_at = np.concatenate(ats) if self.nU else np.zeros(0)
        self.two_sided = np.concatenate(
            [np.full(c.size, h is not None) for c, h in zip(costs, self.halves)]) \
            if self.nU else np.zeros(0, bool)
        # below[k, j]: split node j lies on a path into split node k (a split at j can move
        # k's bounds)
        anc = [set() for _ in graph.nodes]
        for i, n in enumerate(graph.nodes):
            for j in n.inputs:
                anc[i] |= anc[j] | {j}
        self.below = np.array([[j in anc[i] for j in self.nodes] for i in self.nodes],
                              bool).reshape(self.L, self.L)

    @staticmethod
    def _halves(op, l, u):
        """A smooth node's lines (aU, bU, aL, bL) on the lower half [l, t] and on the upper
        half [t, u] of each neuron's interval, and t: 0 where l < 0 < u, else the
        midpoint."""
        from crown_cli.engine.relaxations import get_relaxation

        t = np.where((l < 0.0) & (u > 0.0), 0.0, l + 0.5 * (u - l))
        relax = get_relaxation(op.name, "crown", op.alpha)
        return relax(l.copy(), t.copy()), relax(t.copy(), u.copy()), t

    def _root(self, i) -> Lines:
        return self.gb.lines[i]

    def initial_alpha(self) -> np.ndarray:
        """CROWN's lower slopes of the unstable ReLU neurons, (nU,) float32 (0 for smooth
        neurons, whose lines have no free slope here)."""
        if self.nU == 0:
            return np.zeros(0, np.float32)
        return np.concatenate([
            np.broadcast_to(np.asarray(self._root(i).lower, np.float64),
                            (self.graph.nodes[i].size,))[idx] if h is None else
            np.zeros(idx.size)
            for i, idx, h in zip(self.nodes, self.ucols, self.halves)]).astype(np.float32)

    def lines(self, split, alpha, beta, dtype=np.float64, chords=None,
              upto=None) -> Dict[int, Lines]:
        """Per split node (ReLU, or smooth: :meth:`_smooth_lines`), the rows' lines:
        ``split`` (R, nU) int8 per row, ``alpha``, ``beta`` (R, nU); the ReLU nodes' lines
        as ``dtype`` (float32 for a steering pass). ``chords`` (slopes, intercepts), each
        (R, nU): the upper lines of the unsplit ReLU neurons from the rows' domain bounds
        (:meth:`chords`), else the root's. ``upto``: only the first ``upto`` split nodes."""
        out = {}
        R = split.shape[0]
        for k, (i, idx) in enumerate(zip(self.nodes[:upto], self.ucols)):
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            base, n = self._root(i), self.graph.nodes[i].size
            sp = split[:, o0:o1]
            if self.halves[k] is not None:
                out[i] = self._smooth_lines(base, n, idx, sp, self.halves[k])
                continue
            lower = np.broadcast_to(np.asarray(base.lower, dtype), (R, n)).copy()
            fixed = np.where(sp > 0, 1.0, 0.0)
            lower[:, idx] = np.where(sp == 0, alpha[:, o0:o1], fixed)
            if not sp.any() and chords is None:  # the root's upper lines, shared, no beta
                out[i] = Lines(base.cols, lower, base.upper, upper_icpt=base.upper_icpt)
                continue
            upper = np.broadcast_to(np.asarray(base.upper, dtype), (R, n)).copy()
            ui = np.zeros((R, n), dtype) if base.upper_icpt is None else \
                np.broadcast_to(np.asarray(base.upper_icpt, dtype), (R, n)).copy()
            if chords is not None:
                upper[:, idx], ui[:, idx] = chords[0][:, o0:o1], chords[1][:, o0:o1]
            upper[:, idx] = np.where(sp == 0, upper[:, idx], fixed)
            ui[:, idx] = np.where(sp == 0, ui[:, idx], 0.0)
            extra = None
            if sp.any():
                extra = np.zeros((R, n), dtype)
                extra[:, idx] = -sp * beta[:, o0:o1]
            out[i] = Lines(base.cols, lower, upper, upper_icpt=ui, extra=extra)
        return out

    @staticmethod
    def _smooth_lines(base, n, idx, sp, halves):
        """A smooth node's per-row lines: a neuron split to the lower half (-1) takes its
        lines on [l, t], to the upper half (+1) those on [t, u], else the root's. Each holds
        on its domain (where the neuron's input lies in that half), so no multiplier is
        needed; none is added."""
        R = sp.shape[0]
        (lU, lbU, lL, lbL), (uU, ubU, uL, ubL), _ = halves
        cols = {}
        for name, lo_v, up_v in (("upper", lU, uU), ("upper_icpt", lbU, ubU),
                                 ("lower", lL, uL), ("lower_icpt", lbL, ubL)):
            full = np.broadcast_to(np.asarray(getattr(base, name), np.float64), (R, n)).copy()
            full[:, idx] = np.where(sp > 0, up_v, np.where(sp < 0, lo_v, full[:, idx]))
            cols[name] = full
        return Lines(base.cols, cols["lower"], cols["upper"], upper_icpt=cols["upper_icpt"],
                     lower_icpt=cols["lower_icpt"])

    def evaluate(self, split, alpha, beta, dtype=np.float64, keep=False, charge=None,
                 chords=None, rows=None):
        """Lower bounds of ``A_i f(x) - b_up_i`` on the subdomains, (B, m) (NaN as -inf):
        verified float64 ones, or with ``dtype`` float32 the engine's float32 steering
        estimate (not verified: the search checks a domain's proof in float64; the dense
        bounder's contract). ``split`` (B, nU) int8; ``alpha``, ``beta``
        (B, m, nU), used as given (the caller clips them); ``rows`` (B,): only that row of
        each domain (alpha, beta (B, 1, nU)), (B, 1). ``keep``: also the state of
        :meth:`gradient`, :meth:`corners` and the branching scores: (per node the tape entry
        (rows reaching it, side taken, ...), the rows carried to the input (N, d), the
        per-row splits (N, nU), the root chords' intercepts (N, nU), the engine's tape).
        ``chords``: per domain the upper lines of the unsplit ReLU neurons from its own
        bounds (:meth:`chords`), else the root's. No ``charge`` hook."""
        if charge is not None:
            raise ValueError("GraphBounder.evaluate: no charge hook")
        B, m = split.shape[0], (self.m if rows is None else 1)
        N = B * m
        sp = np.repeat(split, m, axis=0) if m > 1 else split
        steer = np.float32 if dtype == np.float32 else None
        dt = np.float64 if steer is None else steer
        al = alpha.reshape(N, self.nU).astype(dt)
        be = beta.reshape(N, self.nU).astype(dt)
        if chords is not None and m > 1:
            chords = tuple(np.repeat(c, m, axis=0) for c in chords)
        if rows is None:
            Lam, b_up = np.tile(self.A, (B, 1)), np.tile(self.b_up, B)
        else:
            Lam, b_up = self.A[rows], self.b_up[rows]
        tape = {} if keep else None
        free = {i: (np.tile(v, (B, 1)) if rows is None else v[rows])
                for i, v in self.mixes.items()} or None
        val = self.gb.lower(self.graph.output, Lam, free=free, tape=tape,
                            lines=self.lines(sp, al, be, dt, chords), steer=steer)
        out = np.where(np.isnan(val), -np.inf, val - b_up).reshape(B, m)
        if not keep:
            return out
        Lx = tape.pop("Lx")
        per = [tape.get(i) or (np.zeros((N, self.graph.nodes[i].size)),)
               for i in self.nodes]
        cost = np.broadcast_to(self.chord_t, (N, self.nU))
        if chords is not None:  # BaBSR's cost of a ReLU neuron: its domain's chord
            cost = np.where(self.two_sided, cost, chords[1])
        return out, (per, Lx, sp, cost, tape)

    def root_domain_bounds(self):
        """The root's bounds (l, u) of every unstable neuron's input, each (nU,)."""
        if self.nU == 0:
            return np.zeros(0), np.zeros(0)
        return tuple(np.concatenate([b[j][idx] for b, idx in zip(self.bounds, self.ucols)])
                     for j in (0, 1))

    def chords(self, dl, du):
        """The upper lines (slope, intercept), each (B, nU) float64, of the unstable ReLU
        neurons from per-domain bounds ``dl``, ``du`` (B, nU): CROWN's ReLU relaxation of
        the domain's interval (sound in float64; a neuron the bounds make stable takes that
        side's line). The smooth neurons' entries are the root's (their lines are the
        halves')."""
        from crown_cli.engine.relaxations import get_relaxation

        dl = np.asarray(dl, np.float64)
        if dl.size == 0:
            return np.zeros(dl.shape), np.zeros(dl.shape)
        aU, bU, _, _ = get_relaxation("relu", "crown")(np.ascontiguousarray(dl).ravel(),
                                                       np.ascontiguousarray(du, np.float64).ravel())
        return aU.reshape(dl.shape), bU.reshape(dl.shape)

    def tighten(self, split, dl, du, start, max_bytes=None, deadline=None, max_width=None):
        """Per-domain bounds of the unstable ReLU neurons' inputs after new splits (the
        dense :meth:`Bounder.tighten`'s contract): ``split`` (B, nU) int8, ``dl``, ``du``
        (B, nU) bounds valid on each domain (its parent's), ``start`` (B,): the split node
        (index into ``nodes``) of the domain's new split. Each later split ReLU node that a
        path from it reaches gets, per domain, the float64 lower bounds of the rows ``z_j``
        and ``-z_j`` of its unstable neurons' inputs (:meth:`GraphBounds.lower` under the
        domain's lines: split neurons exact, the others CROWN's adaptive lower line and the
        chord of their domain bounds), intersected with ``dl``, ``du``; a neuron they prove
        stable becomes an implied split (exact there). A split neuron's bounds take its
        side of its threshold. Smooth nodes keep their bounds. Returns (split, dl, du,
        empty): ``empty`` (B,) marks domains with some l > u (no point of the box meets
        their splits). Past ``deadline`` the remaining passes are skipped (bounds valid,
        only looser). ``max_width`` is not used."""
        budget = self.TIGHTEN_BYTES if max_bytes is None else max_bytes

        def reach(k, start):  # smooth nodes keep their bounds
            return None if self.halves[k] is not None else self.below[k][start]

        def layer(k, doms, split, dl, du):
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            R, p = o1 - o0, self.graph.nodes[self.nodes[k]].inputs[0]
            width = max(self.graph.nodes[i].size for i in self.nodes[:k] + [p])
            chunk = max(1, int(budget // (8 * 2 * R * (width * (4 + 4 * k) + 3 * self.nU))))
            for c0 in range(0, doms.size, chunk):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                dd = doms[c0:c0 + chunk]
                low = self._node_rows(k, p, split[dd], dl[dd], du[dd]).reshape(dd.size, 2 * R)
                dl[dd, o0:o1] = np.maximum(dl[dd, o0:o1], low[:, :R])
                du[dd, o0:o1] = np.minimum(du[dd, o0:o1], -low[:, R:])

        return tighten_layers(split, dl, du, start, self.offsets, layer, reach,
                              at=self.split_at)

    def _node_rows(self, k, p, split, dl, du):
        """Verified float64 lower bounds of the rows ``z_j``, then ``-z_j``, of split node k's
        unstable neurons' inputs (node p), on each domain of ``split``, ``dl``, ``du`` (D, ...):
        (D * 2R,)."""
        idx, D = self.ucols[k], split.shape[0]
        R = idx.size
        E = np.zeros((2 * R, self.graph.nodes[p].size))
        E[np.arange(R), idx] = 1.0
        E[R + np.arange(R), idx] = -1.0
        # each domain's lines (CROWN's adaptive lower line of a free neuron on the domain's
        # interval, the chord above), then one copy per row of the domain
        al = np.where(du >= -dl, 1.0, 0.0)
        lines = self.lines(split, al, np.zeros_like(al), np.float64, self.chords(dl, du), upto=k)
        lines = {i: _repeat_rows(ln, 2 * R) for i, ln in lines.items()}
        return self.gb.lower(p, np.tile(E, (D, 1)), lines=lines)

    def gradient(self, state, dtype=None):
        """d(sum of all bounds)/d alpha and d/d beta, each (N, nU) float64, at the state of
        :meth:`evaluate`: a coefficient times its node's value under the row's lines at the
        row's minimiser (only free neurons on the lower side have an alpha gradient, only
        split ones a beta gradient)."""
        _, Lx, sp, _, tape = state
        with np.errstate(over="ignore", invalid="ignore"):  # float32 may overflow: 0 below
            return self._gradient(Lx, sp, tape)

    def _gradient(self, Lx, sp, tape):
        g = self.graph
        x = _minimiser(self.gb, Lx).astype(Lx.dtype, copy=False)  # float32 when steering
        vals = _relaxed_forward(self.gb, g.output, x, tape)
        gA, gB = np.zeros((Lx.shape[0], self.nU)), np.zeros((Lx.shape[0], self.nU))
        for k, (i, idx) in enumerate(zip(self.nodes, self.ucols)):
            if tape.get(i) is None:
                continue
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            L, pos = tape[i][0][:, idx], tape[i][1][:, idx]
            z = vals[g.nodes[i].inputs[0]][:, idx]
            if self.halves[k] is not None:  # smooth: no alpha, no beta
                continue
            s = sp[:, o0:o1]
            gA[:, o0:o1] = np.where(pos & (s == 0), L * z, 0.0)
            gB[:, o0:o1] = np.where(s != 0, -s * z, 0.0)
        return np.nan_to_num(gA, posinf=0.0, neginf=0.0), np.nan_to_num(gB, posinf=0.0,
                                                                          neginf=0.0)

    def corners(self, state) -> np.ndarray:
        """Per evaluated row: the point of the box minimising its final linear function."""
        return _minimiser(self.gb, state[1])

    def violated(self, X):
        """The first row of X (N, d), clipped into the box, that the graph's float64 forward
        pass confirms as a counterexample of some case, or None."""
        X = np.clip(X, self.box.lo, self.box.hi)
        hit = violations_of(lambda Z: decided_outputs(self.graph, Z), self.box.lo, self.box.hi, self.A, self.b, X,
                            self.gstart)
        return X[int(np.argmax(hit))].copy() if hit.any() else None

    def attack(self, restarts, steps, seed, deadline):
        """No attack here: the graph pipeline attacks the box before its bound stages."""
        return None

    def affine(self, split_row):
        """On a fully split domain of an :func:`exact_when_split` graph the graph is affine:
        (G, H) with f(x) = G x + H there (the split lines' forward pass at 0 and at the unit
        vectors), and (C, e) with C x <= e the domain's sign conditions."""
        g, nU, d = self.graph, self.nU, self.graph.input_size
        sp = split_row[None].astype(np.int8)
        tape = {}
        self.gb.lower(g.output, self.A[:1], tape=tape,
                      lines=self.lines(sp, np.zeros((1, nU)), np.zeros((1, nU))))
        tape.pop("Lx")
        vals = _relaxed_forward(self.gb, g.output, np.vstack([np.zeros(d), np.eye(d)]), tape)
        F0 = vals[g.output][0]
        C, e = [], []
        for k, (i, idx) in enumerate(zip(self.nodes, self.ucols)):
            z = vals[g.nodes[i].inputs[0]][:, idx]
            s = split_row[self.offsets[k]:self.offsets[k + 1]].astype(np.float64)
            C.append(-s[:, None] * (z[1:] - z[0]).T)  # s z >= 0 <=> -s (Jz x + z0) <= 0
            e.append(s * z[0])
        C = np.concatenate(C) if C else np.zeros((0, d))
        e = np.concatenate(e) if e else np.zeros(0)
        return (vals[g.output][1:] - F0).T, F0, C, e


def _repeat_rows(lines: Lines, r: int) -> Lines:
    """``lines`` with each per-row array (B, n) repeated r times row by row (B * r, n)."""
    def rep(a):
        return a if a is None or np.ndim(a) < 2 else np.repeat(a, r, axis=0)

    return Lines(lines.cols, rep(lines.lower), rep(lines.upper), upper_icpt=rep(lines.upper_icpt),
                 lower_icpt=rep(lines.lower_icpt), stable=lines.stable, extra=rep(lines.extra))


def root_mixes(gb, target: int, A) -> Dict[int, np.ndarray]:
    """Per product node with a free mix of McCormick's planes, each row's mix (m, size)
    optimised at the root by :func:`~crown_cli.engine.graph_alpha.alpha_lower` (with the
    ReLU slopes, which the search optimises per domain instead); {} without such products.
    The planes the mixes give use the factors' root bounds, which hold on every subdomain
    (per-domain bounds, ``interm``, narrow only ReLU nodes' inputs)."""
    from crown_cli.engine.graph_alpha import alpha_lower, free_mixes

    mixes = free_mixes(gb, target)
    if not mixes or not len(A):
        return {}
    _, params = alpha_lower(gb, target, A, patience=2, keep=True)
    return {i: params[i] for i in mixes if i in params}


def graph_relu_split(graph, lo, hi, A, b, deadline: float, **options) -> BabResult:
    """:func:`graph_relu_split_steps` run to its end."""
    return finish(graph_relu_split_steps(graph, lo, hi, A, b, deadline, **options))


def graph_relu_split_steps(graph, lo, hi, A, b, deadline: float,
                           options: Optional[ReluSplitOptions] = None, *, bounds=None,
                           groups=None, **settings):
    """The ReLU-splitting search of :mod:`~crown_cli.verification.bab.relu_split` on a graph,
    as a generator (yields the share of the domain tree proven after every batch, returns
    the :class:`BabResult`): is there an x in [lo, hi] with ``A_g f(x) <= b_g`` (every row
    of some case g; ``groups`` the case of each row, default one case)?

    ``unsat``: every domain has, in every case, a row whose verified bound is above its b
    (rounded up one ulp); ``sat``: a point the graph's float64 forward pass confirms;
    ``unknown``: more open domains than ``max_domains`` (lowered so that their stored state
    stays within ``max_memory``), or a fully split domain that stays open; ``timeout``:
    ``deadline`` (``time.monotonic()``) passed. ``options``: the
    :class:`ReluSplitOptions`, default :data:`GRAPH_OPTIONS`; ``settings`` (keywords named
    like its fields) override them. ``bounds``: the box's :class:`GraphBounds` when the
    caller has it (e.g. from the bound stages). ``log`` and ``progress`` (keywords among
    ``settings``): as :func:`~crown_cli.verification.bab.relu_split.relu_split_steps`."""
    t0 = time.monotonic()
    log, progress = settings.pop("log", None), settings.pop("progress", None)
    lo = np.asarray(lo, dtype=np.float64).ravel()
    hi = np.asarray(hi, dtype=np.float64).ravel()
    gb = GraphBounds(graph, *Box(lo, hi).args()) if bounds is None else bounds
    bd = GraphBounder(graph, gb, lo, hi, A, b, groups)
    o = replace(options or GRAPH_OPTIONS, **settings)
    return (yield from _Search(bd, deadline, o, None, log, progress, t0).run())
