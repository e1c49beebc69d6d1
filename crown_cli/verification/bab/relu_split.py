"""Branch and bound by ReLU splitting for one property case (beta-CROWN style).

A case is ``x in [lo, hi] and A f(x) <= b``; it is empty (``unsat``) when every point of the
box has some row with ``A_i f(x) > b_i``. :func:`relu_split` decides it by splitting unstable
ReLUs (Wang et al., "Beta-CROWN", NeurIPS 2021; implemented from the paper's idea). The
search (:class:`_Search`) takes its bounds from a bounder: :class:`Bounder` on a dense
chain (below), or on a graph network
:class:`~crown_cli.verification.bab.graph_bounder.GraphBounder` (the same interface: float64
throughout, the root's node bounds kept for every domain, no per-domain bounds):

- The pre-activation bounds (l, u) of every hidden layer are computed at the root, by CROWN
  over the whole box (tightened by alpha per layer by :func:`root_layer_bounds` unless
  ``tighten_root`` is off). A subdomain is a set of split decisions, neuron -> active
  (z >= 0) or inactive (z <= 0). Root bounds stay valid on every subdomain; the neurons
  unstable at the root are the only ones split.
- Per-domain bounds (``interm``, default on for 2 or more hidden layers): a child's bounds of
  every layer after the layer of its new split are recomputed (:meth:`Bounder.tighten`:
  float64 CROWN back-substitution with the domain's split neurons exact and its other
  unstable neurons relaxed by the domain's own bounds, widened like the final rows' bound,
  intersected with the parent's, which hold on the child). A neuron they prove stable is
  fixed like a split (implied split: exact, and its sign condition holds on the domain); a
  domain whose bounds cross (l > u somewhere: contradicting splits) is empty, hence proven.
  On 3 or more hidden layers branching then stays in the shallowest layer with open neurons
  (``layer_window``): an early split tightens every later layer. Without ``interm`` every
  domain keeps the root's bounds. The float64 rounding charges use the root intervals (a
  domain's lie inside them). On 3 or more hidden layers (``interm_iters``) the recomputed
  bounds are themselves optimised (:meth:`Bounder.tighten_opt`): each row z_j / -z_j with
  its own lower slopes and multipliers of the split constraints in the layers before it, a
  few Adam steps, then the float64 bound at the best iterate. On networks with a hidden
  layer wider than ``INTERM_MAX_WIDTH`` only the layers of at most that width are
  recomputed (``interm_max_width``), by CROWN, with branching anywhere.
- On a subdomain the final rows ``A_i f(x) - b_i`` are bounded by one back-substitution
  per (domain, row): a split-active neuron is the identity, split-inactive is the inactive
  slope (0 for ReLU), an unstable unsplit neuron has the chord of the domain's bounds above
  and a free lower slope alpha in [leak, 1] below (per domain, row and neuron). The split
  constraints enter by Lagrange multipliers beta >= 0: the bound of
  ``margin(x) + sum_j beta_j s_j z_j(x)`` with ``s_j z_j <= 0`` on the subdomain (s = -1
  active, +1 inactive) is a lower bound of the margin on the subdomain for every beta >= 0.
  All (domain, row) pairs share the weights, so a batch is one matrix product per layer with
  a leading (domain x row) axis.
- alpha and beta are optimised by projected Adam ascent on the bound in float32 (gradient by a
  hand-written reverse pass), warm-started from the parent domain, keeping the best iterate.
- Soundness: a domain counts as proven only by a float64 evaluation at its final (alpha, beta)
  (alpha clipped into [leak, 1], beta into [0, inf) in float64), widened outward like
  :func:`crown_cli.engine.dense_crown.back_substitute` (``FP_RTOL`` times the sum of the magnitudes of all
  terms), compared with ``b`` rounded up one ulp. Each step's |D| is available to a
  ``charge`` hook adding further per-step rounding allowance.
- Branching: a BaBSR-like score (|coefficient| of the neuron's activation in the domain's
  back-substitution times the largest gap of the relaxation side it uses; with ``score``
  "chords", the graphs' default, what the neuron's upper line costs), by default
  filtered (filtered smart branching: the top-3 candidates' children evaluated in one batch,
  the one with the best worse child taken); with ``layer_window`` the candidates come from
  the domain's shallowest layers with open neurons only.
- Attacks on the way: the box corner minimising each evaluated row's linear bound is checked
  by a float64 forward pass; a point of the box meeting every row is a counterexample.

Arrays in, result out: no files and no printing here (``log`` receives progress strings).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import numpy as np

from crown_cli.verification.outcome import BabResult, finish
from crown_cli.verification.bab.bounder import Bounder
from crown_cli.verification.bab.branching import _fsb_choice, branch_scores
from crown_cli.verification.bab.domains import DomainPool, Domains, ReluSplitProblem
from crown_cli.verification.bab.cut_search import CutSearch
from crown_cli.verification.bab.cuts import Cuts, value_offsets
from crown_cli.verification.bab.optimise import CutParams, optimise, optimise_open
from crown_cli.verification.bab.shared_batches import assess_shared, release, shares


def root_layer_bounds(weights, biases, lo, hi, activation="relu", leak=None, iters=20,
                      deadline=None, slopes=False):
    """Pre-activation bounds of every hidden layer over the box, tightened layer by layer by
    optimising the lower slopes (alpha-CROWN style, with this module's optimiser): layer k's
    bounds of z_j and -z_j are rows of a :class:`Bounder` on the network cut after W_k,
    given the (already tightened) bounds of the layers before it, checked in float64 and
    intersected with CROWN's. Returns [(l, u), ...] (float64); with ``slopes`` also the
    optimised lower slopes, per layer k None or (neurons (R,), alpha (2R, n) float64 in
    [leak, 1]): rows z_j then -z_j of those neurons, columns the unstable neurons of the
    layers before k (numbered as in a :class:`Bounder` given these bounds), for
    ``ReluSplitProblem(layer_slopes=...)``."""
    t0 = time.monotonic()
    bd = Bounder(ReluSplitProblem(weights, biases, lo, hi, np.zeros((0, weights[-1].shape[0])),
                                  np.zeros(0), activation, leak))
    # CROWN's bounds of every layer: a layer's tightening (a Bounder on the network cut after
    # it, its steps and a float64 evaluation) is started only while that much time is left
    crown_s = time.monotonic() - t0
    bounds = [(l.copy(), u.copy()) for l, u in bd.bounds]
    found = [None] * bd.L
    for k in range(1, bd.L):
        if deadline is not None and time.monotonic() + crown_s >= deadline:
            break
        l, u = bounds[k]
        rows = np.flatnonzero((l < 0.0) & (u > 0.0))
        if rows.size == 0:
            continue
        n = l.size
        A = np.zeros((2 * rows.size, n))
        A[np.arange(rows.size), rows] = 1.0
        A[rows.size + np.arange(rows.size), rows] = -1.0
        sub = Bounder(ReluSplitProblem(weights[:k + 1], biases[:k + 1], lo, hi, A,
                                       np.zeros(2 * rows.size), activation, leak,
                                       layer_bounds=bounds[:k]))
        split = np.zeros((1, sub.nU), np.int8)
        alpha = np.broadcast_to(sub.initial_alpha(), (1, sub.m, sub.nU)).copy()
        beta = np.zeros_like(alpha)
        optimise(sub, split, alpha, beta, iters, stop=False, deadline=deadline)
        if deadline is not None and time.monotonic() >= deadline:
            break  # the steps were cut short: CROWN's bounds stay (no float64 evaluation)
        a64 = np.clip(alpha.astype(np.float64), sub.leak, 1.0)
        v = sub.evaluate(split, a64, np.zeros(alpha.shape), np.float64)[0]
        # a row whose optimised bound is not better than the one held keeps CROWN's slopes
        # (what the bound held came from), so the slopes given reproduce every root bound
        worse = v <= np.concatenate([l[rows], -u[rows]])
        a64[0][worse] = np.broadcast_to(sub.initial_alpha(), a64[0].shape)[worse]
        found[k] = (rows, a64[0])
        # rows bound z_j - b_up and -z_j - b_up with b_up = 5e-324 > 0: v <= z_j (or -z_j)
        l, u = l.copy(), u.copy()
        l[rows] = np.maximum(l[rows], v[:rows.size])
        u[rows] = np.minimum(u[rows], -v[rows.size:])
        bounds[k] = (l, u)
    return (bounds, found) if slopes else bounds


def relu_split(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray], lo, hi, A, b,
               deadline: float, **options) -> BabResult:
    """Decide the case ``x in [lo, hi] and A f(x) <= b`` by ReLU-splitting branch and bound:
    :func:`relu_split_steps` run to its end. ``options``: the other fields of the
    :class:`ReluSplitProblem` (``activation``, ``leak``, ``layer_bounds``, ``groups``,
    ``layer_slopes``), and the keywords of :func:`relu_split_steps`."""
    given = {k: options.pop(k) for k in PROBLEM_FIELDS if k in options}
    problem = ReluSplitProblem(weights, biases, lo, hi, A, b, **given)
    return finish(relu_split_steps(problem, deadline, **options))


# the fields of a ReluSplitProblem beyond the network's arrays, the box and the rows
PROBLEM_FIELDS = ("activation", "leak", "layer_bounds", "groups", "layer_slopes")


# on networks with a hidden layer wider than this, per-domain hidden-layer bounds (interm)
# are by default recomputed only for the layers of at most this many neurons, by CROWN
# (interm_iters 0), with branching anywhere (layer_window 0): on oval21's lowered CIFAR
# networks that reached far better worst bounds than no per-domain bounds, while the
# settings of narrower networks (optimised rows, shallowest-layer branching) were far worse
# there (docs/bab.md)
INTERM_MAX_WIDTH = 1024

# cuts held on such wide networks by default (ReluSplitOptions.cuts): single-neuron cuts
# decided oval21's cifar_wide_kw img19 in 100 s, open at 720 s without them (docs/bab.md)
WIDE_CUTS = 16384
# Adam steps per batch where the search has cuts (their multipliers need more: oval21's
# cifar_deep_kw img5533 unsat in 54 s with 40, open at 150 s with 20; docs/bab.md)
CUT_ITERS = 40


@dataclass(frozen=True)
class ReluSplitOptions:
    """The settings of a ReLU-splitting search. docs/bab.md has the measurements behind the
    defaults."""

    max_domains: int = 200_000  # cap on open domains (hitting it gives unknown), lowered so
    max_memory: float = 2.0 ** 31  # that the open domains' stored state stays below this (bytes)
    batch: int = 256  # domains bounded per evaluation (children of batch/2 parents)
    # Adam steps on (alpha, beta, and the cuts' multipliers) per batch (default 20, CUT_ITERS
    # with cuts)
    iters: Optional[int] = None
    root_iters: int = 50  # Adam steps at the root
    # "babsr", or "fsb": filtered smart branching over the top fsb_k BaBSR candidates (their
    # children bounded in one batch, the best worse child taken); fsb_k default 3, 20 with interm
    branching: str = "fsb"
    fsb_k: Optional[int] = None
    # the BaBSR score (branching.branch_scores): "gaps" (|coefficient| times the gap of the
    # side of the relaxation used), or "chords" (what the upper line costs; ties by width):
    # on graphs "gaps" took 10-100x the domains of "chords" (docs/bab.md)
    score: str = "gaps"
    # a PGD attack (verification.attack) when the root is not proven; 0 restarts: none
    attack_restarts: int = 16
    attack_steps: int = 50
    seed: int = 0
    # the hidden layers' root bounds by root_layer_bounds (optimised slopes) instead of CROWN's
    tighten_root: bool = True
    # recompute each child's hidden-layer bounds after its new split (Bounder.tighten) instead
    # of keeping the root's; default: on for 2 or more hidden layers
    interm: Optional[bool] = None
    # with interm: Adam steps per row on the recomputed bounds' slopes and the split
    # multipliers (Bounder.tighten_opt; 0: Bounder.tighten); default 3 on 3+ hidden layers
    interm_iters: Optional[int] = None
    interm_min_splits: int = 0  # ... only on domains with at least this many decisions
    # each row's optimisation starts from a running mean of what earlier domains' rows ended
    # with, moved by this fraction after every chunk (0: the root's slopes and beta 0)
    interm_warm: float = 0.5
    # branch only on neurons of this many shallowest layers with open neurons (0: anywhere);
    # default 1 with interm on 3+ hidden layers, else 0
    layer_window: Optional[int] = None
    # with interm: recompute only the hidden layers of at most this many neurons (None: all);
    # default INTERM_MAX_WIDTH on networks with a wider hidden layer (they then also default
    # to interm_iters 0 and layer_window 0), else None
    interm_max_width: Optional[int] = None
    # cutting planes (cuts.py; ReLU, dense bounders, no proof recorded): at most this many
    # held at once (0: none; default WIDE_CUTS on networks of 2 or more hidden layers, one
    # wider than INTERM_MAX_WIDTH, else 0); their kinds, "neurons" (single-neuron convex-hull
    # inequalities separated at the open domains' relaxed points, neuron_cuts per batch),
    # "decisions" (inferred from proven domains, cut_checks sets proven per batch) or "both"
    cuts: Optional[int] = None
    cut_kinds: str = "neurons"
    neuron_cuts: int = 128
    cut_checks: int = 32
    # each domain is bounded with at most domain_cuts cuts of its own: those separated at
    # it or its ancestors (neuron_cuts at each of a batch's 16 worst open domains), from
    # their multipliers there (0: every held cut on every domain, from 0)
    domain_cuts: int = 256
    cut_domains: int = 16  # neuron cuts are separated at this many worst open domains a batch
    cut_round: bool = True  # ... which are then bounded again with them (domain_cuts only)
    # where neuron cuts are separated: "cuts", the relaxed point of the domain's bound with its
    # own cuts (a cutting-plane loop's next point: oval21 wide img6762 unsat in 32 s, open at
    # 720 s with "plain"), or "plain", of its bound without them (domain_cuts only)
    cut_point: str = "cuts"
    # 2: each batch shared with a forked helper process, a thread each (searches without
    # proof, cuts or per-domain bounds: graphs; shared_batches)
    workers: int = 1


def optimises_domain_bounds(weights) -> bool:
    """Whether the search's default optimises each domain's hidden-layer bounds
    (``interm_iters`` 3: 3 or more hidden layers, none wider than ``INTERM_MAX_WIDTH``; with
    ``proof`` each row that narrowed a bound recorded with its slopes and multipliers)."""
    return len(weights) - 1 >= 3 and all(w.shape[0] <= INTERM_MAX_WIDTH for w in weights[:-1])


def relu_split_steps(problem: ReluSplitProblem, deadline: float,
                     options: Optional[ReluSplitOptions] = None, *, charge=None,
                     log: Optional[Callable[[str], None]] = None,
                     progress: Optional[Callable[[int, int, float], None]] = None,
                     proof=None, **settings) -> BabResult:
    """Decide the ``problem``'s cases (some ``x in [lo, hi]`` with ``A f(x) <= b``) by
    ReLU-splitting branch and bound, as a generator: it yields the share of the domain tree
    proven so far (a domain after d branching decisions counts 2**-d) after every batch of
    domains, so a caller can run several cases in turn (:func:`finish` runs one to its end),
    and returns the :class:`BabResult`.

    ``problem``: the network (ReLU, or leaky ReLU with slope ``leak``), the box, the rows,
    and optionally the hidden layers' root bounds and slopes of :func:`root_layer_bounds`
    (e.g. computed once for several cases on one box) and ``groups``, several cases at once
    (:class:`Bounder`): every domain is bounded in all their rows (the per-domain
    hidden-layer bounds, most of the cost on deep networks, serve them all) and is proven
    when every case is; a counterexample may violate any one.
    ``deadline``: a ``time.monotonic()`` instant (then ``timeout``). ``options``: the
    search's :class:`ReluSplitOptions`; ``settings`` (keyword arguments named like its
    fields) override them. ``charge``: see :meth:`Bounder.evaluate`. ``log``: progress
    strings. ``progress(domains, open, worst)``: called after every batch with the domains
    bounded so far, the open domains and the worst open domain's score (the float32
    estimate of its best row's bound minus b). ``proof``: a
    :class:`~crown_cli.verification.proof.ProofTree` that records the domains' tree and each
    proven domain's row, slopes and multipliers per case (dense chains); optimised per-domain
    bounds then record the multipliers and slopes of each row that narrowed a bound
    (``DomainBounds.tighten_opt``'s ``record``).
    """
    t0 = time.monotonic()
    o = replace(options or ReluSplitOptions(), **settings)
    if not 0.0 <= o.interm_warm <= 1.0:
        raise ValueError(f"interm_warm must lie in [0, 1], not {o.interm_warm}")
    p = problem
    if p.layer_bounds is None and o.tighten_root and len(p.weights) > 2:
        bounds, slopes = root_layer_bounds(p.weights, p.biases, p.lo, p.hi, p.activation,
                                           p.leak, deadline=deadline, slopes=True)
        p = replace(p, layer_bounds=bounds, layer_slopes=slopes)
    search = _Search(Bounder(p), deadline, o, charge, log, progress, t0, proof)
    return (yield from search.run())


class _Search(CutSearch):
    """One ReLU-splitting search: its bounder (a dense :class:`Bounder`, or a graph's
    :class:`~crown_cli.verification.bab.graph_bounder.GraphBounder`: the same interface), its
    settings resolved for the network, its counters and its open domains. :meth:`run` is the
    search; ``t0``: when it started (its result's time counts from there)."""

    def __init__(self, bd, deadline, o: ReluSplitOptions, charge, log, progress, t0,
                 proof=None):
        self.t0 = t0
        self.bd = bd
        self.proof = proof
        if proof is not None:
            self._proof_columns()
        self.o, self.deadline, self.charge, self.log, self.progress = o, deadline, charge, \
            log, progress
        self._resolve(o, bd.weights)
        # closed: the share of the box's domain tree proven (a domain of d decisions: 2**-d)
        self.stats = dict(domains=0, peak=1, batches=0, proven=0, t_interm=0.0, empty=0,
                          closed=0.0)
        self.stuck = 0  # domains with nothing left to split and no proof
        # the second process bounding half of each batch (shared_batches), forked when needed
        self.workers, self.helper = int(o.workers), None
        self.pool = None  # the open domains, from the root on
        # cuts: on a dense ReLU bounder, when neither a proof nor a test's charge is taken
        self.cut_sets = []  # decision sets waiting to be proven as cuts
        if o.cut_kinds not in ("neurons", "decisions", "both"):
            raise ValueError("cut_kinds must be 'neurons', 'decisions' or 'both'")
        if self.n_cuts > 0 and hasattr(bd, "cuts") and bd.leak == 0.0 and proof is None \
                and charge is None and bd.nU > 0:
            bd.cuts = Cuts(bd.nU, self.n_cuts, n_terms=int(value_offsets(bd)[-1]))
            self.stats.update(cuts=0, cut_checks=0, cut_pruned=0, cut_rounds=0, cut_kept=0)
            # the domain's own cuts and their multipliers kept with it
            self.max_domains = int(min(self.max_domains, o.max_memory // (
                self.per_domain + 12 * bd.m * o.domain_cuts)))
        self.iters = int(o.iters) if o.iters is not None else \
            (CUT_ITERS if "cuts" in self.stats else 20)

    def _resolve(self, o: ReluSplitOptions, weights):
        """The settings left to the network (None in ``o``) decided, and the domain cap. A
        graph's bounder has no dense layers (``weights`` empty): its ``interm`` and
        ``layer_window`` are the options' (:data:`graph_bounder.GRAPH_OPTIONS`: off)."""
        bd = self.bd
        m, nU = bd.m, bd.nU
        # wide: a hidden layer too wide to recompute per domain at a useful rate (docs/bab.md)
        wide = any(w.shape[0] > INTERM_MAX_WIDTH for w in weights[:-1])
        max_width = o.interm_max_width
        if max_width is None and wide:
            max_width = INTERM_MAX_WIDTH
        # only layers 1.. are ever recomputed (layer 0's bounds depend on the box alone)
        some = any(max_width is None or w.shape[0] <= max_width for w in weights[1:-1])
        interm = o.interm
        if interm is None:
            interm = bd.L >= 2 and some
        interm = bool(interm) and bd.L > 1 and nU > 0 and bd.tightens
        interm_iters = o.interm_iters
        if interm_iters is None:
            interm_iters = 3 if interm and optimises_domain_bounds(weights) else 0
        fsb_k = o.fsb_k
        if fsb_k is None:
            fsb_k = 20 if interm else 3
        K = max(1, min(int(fsb_k), nU)) if o.branching == "fsb" else 1
        window = int(o.layer_window) if o.layer_window is not None and bd.tightens else \
            (1 if interm and bd.L >= 3 and not wide else 0)
        self.per_domain = nU * (1 + 8 * m + (16 if interm else 0)) + 8 * (K + 4)
        self.max_domains = int(min(o.max_domains, o.max_memory // self.per_domain))
        if o.branching not in ("babsr", "fsb"):
            raise ValueError("branching must be 'babsr' or 'fsb'")
        if o.score not in ("gaps", "chords"):
            raise ValueError("score must be 'gaps' or 'chords'")
        self.max_width, self.interm, self.interm_iters = max_width, interm, interm_iters
        self.n_cuts = int(o.cuts) if o.cuts is not None else \
            (WIDE_CUTS if wide and bd.L >= 2 else 0)
        self.K, self.window = K, window

    def _proof_columns(self):
        """The recorded tree's columns (the bounder's unstable neurons as flat hidden-neuron
        indices), its layer slopes, and each unstable neuron's flat index."""
        bd = self.bd
        first = np.cumsum([0] + [w.shape[0] for w in bd.weights[:-1]])
        self.flat = np.concatenate([first[k] + c for k, c in enumerate(bd.ucols)]).astype(
            np.int64) if bd.L else np.zeros(0, np.int64)
        self.proof.cols = self.flat
        # every row the root's bounds were optimised for, stable or not now (its bound may be
        # what made it stable)
        for k, entry in enumerate(getattr(bd, "layer_slopes", None) or ()):
            if entry is not None and k > 0:
                self.proof.layer_slopes[k + 1] = (first[k] + np.asarray(entry[0]),
                                                  np.asarray(entry[1], np.float64))

    def _record(self, nodes, split, alpha, beta, v64, newly):
        """``proof``: the cases ``newly`` (B, G) proven on the domains of ``nodes`` by the
        float64 bounds ``v64`` (B, m) at these slopes and multipliers (as verify64 used them),
        recorded with each case's best row."""
        bd = self.bd
        for d, g in zip(*np.nonzero(newly)):
            g0, g1 = bd.case_rows()[g]
            r = g0 + int(np.argmax(v64[d, g0:g1]))
            a = np.clip(alpha[d, r].astype(np.float64), bd.leak, 1.0)
            be = np.where(split[d] != 0, np.maximum(beta[d, r].astype(np.float64), 0.0), 0.0)
            self.proof.prove(int(nodes[d]), int(g), r - g0, a, be if be.any() else None)

    def _row_recorder(self, nodes):
        """``tighten_opt``'s ``record`` for the domains of tree nodes ``nodes``: each row's
        multipliers and slopes go to :meth:`ProofTree.row_multipliers`."""
        bd, flat = self.bd, self.flat

        def record(k, doms, rows, beta, alpha, free):
            o0, R = bd.offsets[k], bd.offsets[k + 1] - bd.offsets[k]
            self.proof.row_multipliers(nodes[doms], flat[o0 + rows % R],
                                       np.where(rows < R, 1, -1), flat[:o0], beta,
                                       alpha, free)
        return record

    def run(self):
        """The search: the root, then batches of the worst open domains' children, until
        none is open (``unsat``), a counterexample (``sat``), the deadline or the cap. Its
        helper process, if it has one, ends with it (also when the caller closes it)."""
        try:
            return (yield from self._run())
        finally:
            release(self)

    def _run(self):
        bd, stats = self.bd, self.stats
        if bd.m == 0:  # no output constraint: every point of the box violates
            return self.result("sat", bd.box.center.copy())
        x = self.violated(bd.box.center[None, :])
        if x is not None:
            return self.result("sat", x)
        decided = self._root()
        if decided is not None:
            return decided
        pool = self.pool
        while len(pool):
            if time.monotonic() >= self.deadline:
                return self.result("timeout", worst=pool.worst())
            if len(pool) > self.max_domains:
                return self.result("unknown", worst=pool.worst(), note="domain cap")
            kids, choice = self._branch(pool.pop(max(1, self.o.batch // 2)))
            kids = self._inside_cuts(kids)
            chords = None
            if self.interm and kids.split.shape[0]:
                kids = self._tighten(kids, choice)
                chords = bd.chords(kids.dl, kids.du)
            xv = self._bound(kids, self.iters, chords) if kids.split.shape[0] else None
            if xv is None and self.cut_sets:
                xv = self._check_cut_sets()
            if xv is not None:
                return self.result("sat", xv)
            stats["peak"] = max(stats["peak"], len(pool))
            if self.progress is not None:
                self.progress(stats["domains"], len(pool), float(pool.worst()))
            yield min(1.0, stats["closed"])
            self._log_batch()
        if self.stuck:
            return self.result("unknown", worst=np.nan, note=f"{self.stuck} domain(s) with "
                               "every unstable neuron split stayed open")
        return self.result("unsat", worst=np.inf)

    def result(self, verdict, x=None, worst=np.nan, note=""):
        s = self.stats
        if self.log is not None and "cuts" in s:
            self.log(f"cuts: {s['cuts']} added ({s['cut_checks']} decision sets tried, "
                     f"{s['cut_pruned']} domains inside a proven one, {s['cut_kept']} of "
                     f"whose bound did not improve kept their cuts as before, {s['cut_rounds']} "
                     f"domains bounded again with their new cuts)")
        return BabResult(verdict, x, s["domains"], s["peak"], float(worst),
                         time.monotonic() - self.t0, s["batches"], s["proven"], note=note)

    def violated(self, X):
        """The first row of X (N, d), clipped into the box, that is a counterexample (the
        bounder's float64 forward pass: :meth:`Bounder.violated`), or None."""
        return self.bd.violated(X)

    def _root(self):
        """The root domain bounded (``root_iters`` steps), then the attack: the search's
        result when that decides, else None with the root in the pool."""
        bd, o = self.bd, self.o
        m, nU = bd.m, bd.nU
        split = np.zeros((1, nU), np.int8)
        alpha = np.broadcast_to(bd.initial_alpha(), (1, m, nU)).copy()
        beta = np.zeros((1, m, nU), np.float32)
        done = np.zeros((1, max(1, bd.gstart.size)), bool)
        score, proven, row, state, xv = self.assess(split, alpha, beta, done, o.root_iters,
                                                    nodes=np.zeros(1, np.int64))
        if xv is not None:
            return self.result("sat", xv)
        if proven[0]:
            self.stats["proven"] += 1
            return self.result("unsat", worst=score[0])
        if self.log is not None:
            self.log(f"root: bound {score[0]:.5g}, {nU} unstable neurons")
        if o.attack_restarts > 0:
            xa = bd.attack(o.attack_restarts, o.attack_steps, o.seed, self.deadline)
            if xa is not None:
                return self.result("sat", xa[1])
        self.pool = DomainPool(nU, m, self.K, bounds=self.interm, cases=done.shape[1],
                               mu_keep=self.o.domain_cuts if self.bd_cuts() is not None else 0)
        if self.interm:
            rl, ru = bd.root_domain_bounds()
            dl, du = rl[None, :].copy(), ru[None, :].copy()
        else:
            dl = du = np.zeros((1, 0))
        root = Domains(split, alpha, beta, None, None, dl, du, done, np.zeros(1, np.int64),
                       np.zeros(1, np.int64))
        xv = self.enqueue(score, proven, row, state, root)
        if xv is not None:
            return self.result("sat", xv)
        return None

    def _branch(self, par: Domains):
        """Each parent's two children on its branching neuron (filtered smart branching
        among its candidates, else its first candidate): first all the active children (+1),
        then the inactive ones (-1). Returns them (no candidates yet) and the neurons."""
        bd = self.bd
        P = par.split.shape[0]
        if self.K > 1:
            choice = _fsb_choice(bd, par.split, par.alpha, par.beta, par.cand,
                                 bd.chords(par.dl, par.du) if self.interm else None,
                                 par.row if bd.gstart.size > 1 else None)
        else:
            choice = par.cand[:, 0]
        cs = np.concatenate([par.split, par.split])
        ar = np.arange(P)
        cs[ar, choice] = 1
        cs[P + ar, choice] = -1
        nodes = None
        if self.proof is not None:  # children (inactive, active): the active ones first here
            refresh = bd.layer_of[choice] + 2 if self.interm else np.full(P, bd.L + 1)
            two = self.proof.split_relu(par.node, self.flat[choice], refresh)
            nodes = np.concatenate([two[:, 1], two[:, 0]])
        # a case proven on the parent is on its children
        def twice(a):
            return None if a is None else np.concatenate([a, a])

        kids = Domains(cs, twice(par.alpha), twice(par.beta), None, None, twice(par.dl),
                       twice(par.du), twice(par.done), twice(par.depth) + 1, nodes,
                       twice(par.mu_val), twice(par.mu_ser))
        return kids, choice

    def _tighten(self, kids: Domains, choice):
        """The children's hidden-layer bounds recomputed from the layer of their new split on
        (:meth:`Bounder.tighten_opt` on those of at least ``interm_min_splits`` decisions
        with ``interm_iters`` > 0, else :meth:`Bounder.tighten`), in place; the children
        whose bounds cross are proven (empty) and dropped. Returns the children left."""
        bd, o, stats = self.bd, self.o, self.stats
        ti = time.monotonic()
        cs, cdl, cdu = kids.split, kids.dl, kids.du
        start = np.tile(bd.layer_of[choice], 2)
        deep = kids.depth >= o.interm_min_splits if self.interm_iters > 0 else \
            np.zeros(cs.shape[0], bool)
        empty = np.zeros(cs.shape[0], bool)
        for sel, opt in ((np.flatnonzero(~deep), False), (np.flatnonzero(deep), True)):
            if sel.size == 0:
                continue
            if opt:  # with proof: the rows that narrowed a bound recorded
                out = bd.tighten_opt(cs[sel], cdl[sel], cdu[sel], start[sel],
                                     deadline=self.deadline, max_width=self.max_width,
                                     iters=self.interm_iters, warm=o.interm_warm,
                                     record=None if self.proof is None else
                                     self._row_recorder(kids.node[sel]))
            else:
                out = bd.tighten(cs[sel], cdl[sel], cdu[sel], start[sel],
                                 deadline=self.deadline, max_width=self.max_width)
            cs[sel], cdl[sel], cdu[sel], empty[sel] = out
        stats["t_interm"] += time.monotonic() - ti
        if not empty.any():
            return kids
        # no point of the box meets the splits: proven
        if self.proof is not None:
            for i in np.flatnonzero(empty):
                j = int(np.argmax(cdl[i] > cdu[i]))
                self.proof.empty(int(kids.node[i]), int(self.flat[j]))
        stats["proven"] += int(empty.sum())
        stats["empty"] += int(empty.sum())
        stats["closed"] += float(np.sum(0.5 ** kids.depth[empty]))
        stats["domains"] += int(empty.sum())
        return kids.take(~empty)  # cs, cdl, cdu are kids' own arrays, updated in place

    def _bound(self, kids: Domains, iters, chords):
        """The children optimised, checked and pushed into the pool (the open ones): a
        counterexample found on the way, or None. Shared with a helper process where
        :func:`~crown_cli.verification.bab.shared_batches.shares` says so."""
        if shares(self, kids.split.shape[0]):
            self.stats["batches"] += 1
            for half, score, proven, row, top, xv in assess_shared(self, kids, iters):
                self.stats["domains"] += half.split.shape[0]
                if xv is None:
                    xv = self.enqueue(score, proven, row, None, half, top)
                if xv is not None:
                    return xv
            return None
        cuts = self.bd_cuts()
        if cuts is None:
            score, proven, row, state, xv = self.assess(
                kids.split, kids.alpha, kids.beta, kids.done, iters, chords, kids.node,
                (kids.dl, kids.du) if self.interm else None)
        else:
            score, proven, row, state, xv = self._assess_own_cuts(kids, iters, chords,
                                                                  kids.node)
        if xv is not None:
            return xv
        if cuts is not None:
            if self.o.cut_kinds != "neurons":
                self._propose_cuts(kids, proven)
            if self.o.cut_kinds != "decisions":
                before = None if kids.mu_val is None or not self.o.cut_round else \
                    (kids.mu_val.copy(), kids.mu_ser.copy())  # for the cut round
                got = self._neuron_cuts(state, kids, score, proven, row)
                if got.size and self.o.cut_round and time.monotonic() < self.deadline:
                    xv = self._cut_round(kids, got, score, proven, chords, before)
                    if xv is not None:
                        return xv
        return self.enqueue(score, proven, row, state, kids)

    def _log_batch(self):
        s = self.stats
        if self.log is not None and s["batches"] % 20 == 0:
            self.log(f"batch {s['batches']}: {s['domains']} domains, {len(self.pool)} open, "
                     f"worst {self.pool.worst():.4g}, {time.monotonic() - self.t0:.1f}s"
                     + (f" ({s['t_interm']:.1f}s interm, {s['empty']} empty)"
                        if self.interm else "")
                     + (f", {s['cuts']} cuts added" if "cuts" in s else ""))

    def verify64(self, split, alpha, beta, chords=None, cut=None):
        """The float64 bounds (B, m) at these slopes and multipliers (``cut``: with the
        cuts, :class:`CutParams`)."""
        bd = self.bd
        a = np.clip(alpha.astype(np.float64), bd.leak, 1.0)
        be = np.maximum(beta.astype(np.float64), 0.0)
        if cut is not None:
            return bd.evaluate(split, a, be, np.float64, chords=chords, mu=cut.mu,
                               bounds=cut.bounds)
        return bd.evaluate(split, a, be, np.float64, charge=self.charge, chords=chords)

    def assess(self, split, alpha, beta, done, n_iters, chords=None, nodes=None, bounds=None,
               count=True, start=None):
        """Optimise and classify a batch; ``done`` (B, G): the cases proven on each domain
        (updated in place by the float64 checks). Returns (score float64 per domain: the
        worst open case's best row, proven mask, row, state) and the attack's counterexample
        if any. ``bounds``: the domains' (l, u) of the unstable neurons (with the cuts);
        ``count`` False: not counted in the search's domains and batches; ``start``: (mu,
        mask), the cuts' first multipliers (B, m, len(cuts)) float32, optimised in place,
        only where ``mask`` (None: all) (default: all from 0)."""
        bd, stats = self.bd, self.stats
        cuts = self.bd_cuts()
        cut = None
        # past the deadline too: the step clock leaves one evaluation, from the domains' own
        # multipliers, so the bounds a timeout reports are those with the cuts (without them
        # the last batch's fell far below the rest: img6762 -0.026 against -0.003)
        if cuts is not None and len(cuts):
            mu, mask = start if start is not None else \
                (np.zeros((split.shape[0], bd.m, len(cuts)), np.float32), None)
            cut = CutParams(mu, bounds, mask)
        est, state, row = optimise_open(bd, split, alpha, beta, done, n_iters, chords=chords,
                                        deadline=self.deadline, cut=cut)
        if count:
            stats["domains"] += split.shape[0]
            stats["batches"] += 1
        gmax = np.maximum.reduceat(est, bd.gstart, axis=1)
        cand = np.flatnonzero(np.any((gmax > 0.0) & ~done, axis=1))
        if cut is not None and time.monotonic() >= self.deadline:
            # the float64 bound with cuts costs about a step per row of every case: past
            # the deadline the search ends anyway (timeout), so the batch stays unproven
            cand = cand[:0]
        if cand.size:
            sub = None if cut is None else CutParams(
                cut.mu[cand], None if bounds is None else (bounds[0][cand], bounds[1][cand]))
            v64 = self.verify64(split[cand], alpha[cand], beta[cand],
                                None if chords is None else (chords[0][cand], chords[1][cand]),
                                sub)
            g64 = np.maximum.reduceat(v64, bd.gstart, axis=1)
            if self.proof is not None:
                self._record(nodes[cand], split[cand], alpha[cand], beta[cand], v64,
                             (g64 > 0.0) & ~done[cand])
            done[cand] |= g64 > 0.0
            # a case the float32 estimate put above 0 keeps its float64 bound
            gmax[cand] = np.where(gmax[cand] > 0.0, g64, gmax[cand])
        gmax[done] = np.inf
        score = gmax.min(axis=1)
        proven = done.all(axis=1)
        # attack: the minimising corners of the rows of domains still open
        openi = np.flatnonzero(~proven)
        if openi.size:
            Xc = bd.corners(state).reshape(split.shape[0], -1, bd.box.lo.size)[openi]
            xv = self.violated(Xc.reshape(-1, bd.box.lo.size))
            if xv is not None:
                return score, proven, row, state, xv
        return score, proven, row, state, None

    def assess_part(self, d: Domains, iters):
        """:meth:`assess` of the domains ``d`` (without per-domain bounds, cuts or proof)
        and the branching candidates of the open ones: ``(d, score, proven, row, top, xv)``,
        ``d``'s slopes, multipliers and proven cases updated in place (what a helper process
        runs on its half of a batch: :mod:`~crown_cli.verification.bab.shared_batches`)."""
        score, proven, row, state, xv = self.assess(d.split, d.alpha, d.beta, d.done, iters,
                                                    count=False)
        openi = np.flatnonzero(~proven)
        top = None if xv is not None or openi.size == 0 else \
            self._candidates(state, d, row, openi)
        return d, score, proven, row, top, xv

    def enqueue(self, score, proven, row, state, d: Domains, top=None):
        """Count the proven domains of the batch ``d``, push the open ones with their
        branching candidates (``top``, else from ``state``); an open domain with none (fully
        split) is settled by :meth:`_leaf`. A counterexample found there, or None."""
        stats = self.stats
        openi = np.flatnonzero(~proven)
        stats["proven"] += int(proven.sum())
        stats["closed"] += float(np.sum(0.5 ** d.depth[proven]))
        if openi.size == 0:
            return None
        if top is None:
            top = self._candidates(state, d, row, openi)
        # no candidate column at all (nothing unstable to split): every open domain is a leaf
        keep = top[:, 0] >= 0 if top.shape[1] else np.zeros(top.shape[0], bool)
        for i in np.flatnonzero(~keep):
            j = openi[i]
            out = self._leaf(j, d.split, d.alpha, d.beta, d.done[j],
                             self.bd.chords(d.dl[j:j + 1], d.du[j:j + 1]) if self.interm
                             else None, None if d.node is None else int(d.node[j]))
            if isinstance(out, np.ndarray):
                return out
            if out:
                stats["proven"] += 1
                stats["closed"] += 0.5 ** float(d.depth[j])
            else:
                self.stuck += 1
        sel = openi[keep]
        if sel.size:
            out = d.take(sel)
            out.cand, out.row = top[keep], row[sel]
            self.pool.push(score[sel], out)
        return None

    def _candidates(self, state, d: Domains, row, openi):
        """The open domains' ``K`` best branching candidates by BaBSR score (-1: none left);
        with ``layer_window`` only from the shallowest layers with open neurons."""
        bd = self.bd
        sc = branch_scores(bd, state, d.split, d.alpha, row,
                           d.dl if self.interm else None, d.du if self.interm else None,
                           self.o.score)[openi]
        if self.window:  # only the shallowest `window` layers with open neurons
            fin = np.isfinite(sc)
            first = np.where(fin.any(axis=1), bd.layer_of[np.argmax(fin, axis=1)], bd.L)
            sc[bd.layer_of[None, :] >= first[:, None] + self.window] = -np.inf
        top = np.argsort(-sc, axis=1)[:, :self.K]
        topv = np.take_along_axis(sc, top, axis=1)
        top[~np.isfinite(topv)] = -1
        return top

    def _leaf(self, i, split, alpha, beta, done, chords=None, node=None):
        """A fully split open domain: a counterexample x, True (proven), or False. Every case
        not yet proven (``done`` (G,)) by linear programming; proven when each has
        multipliers (beta) a float64 evaluation confirms. On a bounder whose fully split
        domains are not affine (a graph with max pools: ``bd.exact`` False) False."""
        bd = self.bd
        if not bd.exact:
            return False
        be = np.zeros((1, bd.m, bd.nU))
        for g, (g0, g1) in enumerate(bd.case_rows()):
            if done[g]:
                continue
            out = _leaf_lp(bd, split[i], np.arange(g0, g1))
            if out[0] == "sat":
                return self.violated(out[1][None, :])
            if out[0] != "beta":
                return False
            be[0, out[1]] = out[2]
        for scale in (1.0, 1.0 + 1e-6, 1.01):
            b32 = (scale * be).astype(np.float32)  # any beta >= 0 holds: a certificate's
            v = self.verify64(split[i:i + 1], alpha[i:i + 1], b32, chords)
            if np.all((np.maximum.reduceat(v, bd.gstart, axis=1)[0] > 0.0) | done):
                if self.proof is not None:
                    self._record([node], split[i:i + 1], alpha[i:i + 1], b32, v,
                                 ~done[None, :])
                return True
        return False


def _leaf_lp(bd: Bounder, split_row, rows=None):
    """A fully split domain and one case (its ``rows`` of A, default all), by linear
    programming (scipy HiGHS): :func:`affine_leaf_lp` on the network's affine form there
    (:meth:`Bounder.affine`)."""
    rows = np.arange(bd.m) if rows is None else np.asarray(rows)
    G, H, C, e = bd.affine(split_row)
    return affine_leaf_lp(bd.A[rows] @ G, bd.A[rows] @ H - bd.b[rows], C, e, bd.box.lo,
                          bd.box.hi, rows)


def affine_leaf_lp(AG, AH, C, e, lo, hi, rows):
    """A case on a fully split domain, where the rows are ``AG x + AH`` (minus b) and the
    domain is ``{x in [lo, hi]: C x <= e}``, by linear programming (scipy HiGHS). Returns
    ("sat", x) with x a candidate point (the caller checks it in float64), ("beta", row,
    beta) with the LP's multipliers of the sign constraints for row ``rows[i]`` (the caller
    proves with a float64 evaluation; any beta >= 0 is valid), or ("open", None)."""
    from scipy.optimize import linprog

    d, m = AG.shape[1], AG.shape[0]
    bounds = list(zip(lo, hi))
    c_box, r_box = 0.5 * (np.asarray(lo) + np.asarray(hi)), 0.5 * (np.asarray(hi) - np.asarray(lo))
    # feasibility of the case on the domain: min t with A_i f(x) - b_i <= t
    c = np.zeros(d + 1)
    c[-1] = 1.0
    Aub = np.vstack([np.hstack([C, np.zeros((C.shape[0], 1))]), np.hstack([AG, -np.ones((m, 1))])])
    bub = np.concatenate([e, -AH])
    res = linprog(c, A_ub=Aub, b_ub=bub, bounds=bounds + [(None, None)], method="highs")
    if res.status == 2:  # t is free: the sign constraints alone are infeasible (empty domain)
        # phase 1: min s with C x - e <= s; its multipliers y (sum 1) have
        # min over the box of y.(C x - e) = s* > 0, so beta = T y proves any row for T large
        c1 = np.zeros(d + 1)
        c1[-1] = 1.0
        r1 = linprog(c1, A_ub=np.hstack([C, -np.ones((C.shape[0], 1))]), b_ub=e,
                     bounds=bounds + [(None, None)], method="highs")
        if r1.status != 0 or not r1.fun > 0.0:
            return ("open", None)
        y = np.maximum(-r1.ineqlin.marginals, 0.0)
        spread = np.abs(AG[0]) @ r_box + abs(AG[0] @ c_box + AH[0]) + 1.0
        return ("beta", int(rows[0]), y * (2.0 * spread / r1.fun))
    if res.status == 0 and res.x[-1] <= 0.0:
        return ("sat", res.x[:d])
    elif res.status != 0:
        return ("open", None)
    for i in range(m):
        r = linprog(AG[i], A_ub=C, b_ub=e, bounds=bounds, method="highs")
        if r.status == 0 and r.fun + AH[i] > 0.0:
            return ("beta", int(rows[i]), np.maximum(-r.ineqlin.marginals, 0.0))
    return ("open", None)
