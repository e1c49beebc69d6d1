"""Deciding VNN-LIB properties on an MLP: attack first, then bounds from cheap to strong.

A property (:mod:`crown_cli.io.vnnlib`) is a list of cases ``x in [lo, hi] and A f(x) <= b``; it
is violated (``sat``) when some case has such an x, and holds (``unsat``) when none has.
:func:`verify_property` answers with a :class:`Verdict`:

- ``sat`` only with a concrete x inside the case's box whose float64 forward pass satisfies
  every row of ``A f(x) <= b`` (:func:`crown_cli.verification.attack.check_counterexample`);
- ``unsat`` only when every case is proven empty by a float64 bound of the engine: some row i
  of the case has ``min over the box of A_i f(x) > b_i`` (the case's conjunction then fails
  everywhere), the lower bound computed in float64 with the engine's rounding allowance and
  compared with ``b_i`` rounded up by one ulp (covering the rounding of a decimal literal);
- ``unknown`` when neither, ``timeout`` when the deadline passed first.

Arrays in, verdicts out: no files and no printing here.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

from crown_cli.activations import ACTIVATIONS, forward
from crown_cli.engine.dense_crown import Network, margin_lower_bound
from crown_cli.engine.deadline import DeadlineExceeded
from crown_cli.engine.input_sets import Box
from crown_cli.engine.rounding import round_up
from crown_cli.engine.threads import blas_threads
from crown_cli.errors import InputError
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.verification.bab.hull_split import applies as hull_applies
from crown_cli.verification.bab.hull_split import stage_applies as hull_stage_applies
from crown_cli.verification.outcome import confirm_sat
from crown_cli.verification.schedule import RaceSettings, Run, race
from crown_cli.verification.status import bab_status_for

# Bound stages, cheap to strong; a stage is used when the activation has that method.
BOUND_STAGES = ("crown", "alpha-crown", "hull")
# alpha-crown (crown_cli.engine.alpha_crown): optimised lower slopes (ReLU, leaky ReLU) or tangent points
# (tanh, sigmoid, arctan)
# the hull stage's Adam steps on the whole box (it stops early once every row is positive),
# within this share of the time left when the stage starts (a large dense hidden layer makes
# each step costly); docs/bab.md has the measurements
HULL_STEPS = 200
HULL_SHARE = 0.25
ALPHA_ITERS = 50  # one box per case: more steps than certify's search spends (its step sizes)
# alpha-crown within the deadline: its steps stop where the next one (the first estimated as
# ALPHA_FIRST_COST x the crown stage's time on the box) would leave less than ALPHA_VERIFY_COST x
# that time for the float64-verified evaluation (which recomputes CROWN's intermediate bounds).
# cifar_wide_kw img4356: crown stage 2.26 s, first step 3.6 s, later steps 2.2 s, the verified
# evaluation 3.9 s (docs/benchmarks.md, "Deadlines")
ALPHA_FIRST_COST, ALPHA_VERIFY_COST = 2.0, 2.0
# Complete stage after the bounds (docs/bab.md, "Which branch and bound"): input splitting
# competes on networks of at most INPUT_SPLIT_MAX_DIM inputs (ACAS Xu: 5, safenlp: 30; on
# images a split halves one of hundreds of dimensions), ReLU splitting on every network with
# hidden layers; input splitting runs first, ReLU splitting joins after JOIN_SHARE of the
# timeout (at least JOIN_MIN_S), then each gets time by its measured progress
# (crown_cli.verification.schedule).
INPUT_SPLIT_MAX_DIM = 64
JOIN_SHARE, JOIN_MIN_S = 0.05, 0.5
RACE_SLICE, RACE_MAX_SLICE = 0.25, 2.0
# a 64x wider attack before branch and bound on networks of at most this many inputs
WIDE_ATTACK_MAX_DIM = 16
# BLAS on one thread for networks of at most this many neurons per layer (docs/bab.md: its
# products are too small to share; safenlp's 30-128-2 ran 1.3-3x faster, ACAS Xu the same or
# faster; MNIST 256x2 about the same, so the deeper 256-wide ones keep both threads)
ONE_THREAD_WIDTH = 128
# warm_up's attack: a few short runs (its case is one the attack should not decide)
WARM_ATTACK = dict(attack_restarts=2, attack_steps=5, attack_time=0.05)
WARM_SHARE = 0.1  # of the way from the stages' bound to the least sampled margin
ATTACK_SHARE = 0.1  # of the timeout for the first attack (before any bound)
# a quick opening (graph networks of image size: ``quick_opening``) runs 1/QUICK_SHARE of the
# attack's starts before the crown stage, the others after it on the cases it left open
QUICK_SHARE = 4
ATTACK_MIN_S = 0.5
# the crown stage bounds the boxes of a property with at least this many input boxes several
# at a time where the network allows it (``many_boxes``: ReLU-type MLPs; nn4sys' lindex
# properties list 400-120,000 one-input boxes), at most MANY_CHUNK in one call
MANY_BOXES = 64
MANY_CHUNK = 4096


@dataclass
class Verdict:
    result: str  # one of outcome.ROW_RESULTS ("error" from the instance runner only)
    stage: str  # the stage that decided ("attack", "crown", ...) or the last one tried
    margin: Optional[float]  # min over open cases of the best row's (lower bound - b); > 0 proves
    time_s: float
    x: Optional[np.ndarray] = None  # counterexample input (sat)
    y: Optional[np.ndarray] = None  # its float64 outputs
    case: Optional[int] = None  # index of the violated case (sat)
    cases_proven: int = 0
    cases: int = 0
    domains: int = 0  # branch and bound: domains bounded
    peak_domains: int = 0  # branch and bound: most open domains at once
    note: str = ""  # what was left out (graphs: no branch and bound yet), for the log
    # sat at a point no float can hold (inputs pinned to decimals between two floats): those
    # inputs' exact values (index -> Fraction); x holds them rounded to nearest
    exact: Optional[dict] = None
    # unsat with ``proof``: per case the arrays of its certificate tree (docs/proofs.md), or
    # None where none could be recorded in time (``note`` says so)
    proof: Optional[list] = None


def check_sizes(prop, n_inputs: int, n_outputs: int, where: str) -> None:
    if prop.n_inputs != n_inputs or prop.n_outputs != n_outputs:
        raise InputError(f"{where}: the property has {prop.n_inputs} inputs and {prop.n_outputs} "
                         f"outputs but the network has {n_inputs} and {n_outputs}")


@dataclass(frozen=True)
class VerifyOptions:
    """The settings of a :class:`Verifier` (``crown verify``'s options)."""

    stages: Sequence[str] = BOUND_STAGES  # bound stages asked for (those that apply run)
    attack_restarts: int = 64  # PGD starting points per case
    attack_steps: int = 100  # steps per run
    seed: int = 0  # of the attack's random starts
    attack_time: Optional[float] = None  # seconds per attack stage (None: a share of the timeout)
    bab: bool = True  # branch and bound after the bound stages
    max_domains: int = 200_000  # cap on the open domains of branch and bound
    workers: Optional[int] = None  # input splitting's processes (None: by the network's size)
    proof: bool = False  # record a certificate of every unsat (dense ReLU chains)


class StagedVerifier:
    """What every verifier shares, whatever bounds its network: the attack on every input
    box, the bound stages on every case (each calling the verifier's
    ``box_lower_bounds``), the opening that runs them, and a ``sat`` point confirmed in the
    property's exact set. A verifier sets ``stages``, the attack settings and ``bab``, and
    gives ``n_inputs``, ``n_outputs``, ``outputs``, ``box_lower_bounds``, ``_box_attack``
    and ``_verify`` (what runs after the opening); :class:`Verifier` (dense chains) and
    :class:`~crown_cli.verification.graph_verifier.GraphVerifier` (graphs) are the two."""

    def _settings(self, o: VerifyOptions) -> None:
        self.attack_restarts, self.attack_steps, self.seed = o.attack_restarts, o.attack_steps, \
            o.seed
        self.attack_time = o.attack_time
        self.max_domains = o.max_domains

    def verify(self, prop, timeout: float, log: Optional[Callable[[str], None]] = None,
               status: Optional[Callable[[str], None]] = None) -> Verdict:
        """Run the pipeline on a parsed property within ``timeout`` seconds; a ``sat`` point
        is confirmed in the property's exact set (:func:`confirm_sat`)."""
        return confirm_sat(self._verify(prop, timeout, log, status), prop.cases, self.outputs,
                           log, prove=self.proves_violation)

    def _warm_on(self, rng, width: float, timeout: float):
        """Verify, within ``timeout``, one case on this (tiny) network that its stages
        leave open: a margin row (largest output minus smallest at a random point) at most
        b over a box of half-width ``width``, b ``WARM_SHARE`` of the way from the stages'
        best bound to the least margin of 64 corners, so the attack, every stage and the
        search run (``warm_up``: every kernel loaded before an instance's clock). The
        verdict."""
        from crown_cli.io.vnnlib import Case, Property

        x0 = rng.uniform(0.0, 1.0, self.n_inputs)
        lo, hi = x0 - width, x0 + width
        y = self.outputs(x0[None])[0]
        A = np.zeros((1, self.n_outputs))
        A[0, int(np.argmax(y))], A[0, int(np.argmin(y))] = 1.0, -1.0
        low = max([float(self.box_lower_bounds(s, lo, hi, A, np.zeros(1))[0])
                   for s in self.stages] or [-1.0])
        X = np.where(rng.uniform(size=(64, self.n_inputs)) < 0.5, lo, hi)
        top = float(np.min(self.outputs(X) @ A[0]))
        b = np.array([low + WARM_SHARE * (top - low)])
        return self.verify(Property(self.n_inputs, self.n_outputs, [Case(lo, hi, A, b)]),
                           timeout)

    def proves_violation(self, lo, hi, A, b) -> bool:
        """Whether a float64-verified bound shows ``A f(x) <= b`` (every row) on all of the
        box [lo, hi]: a sat point's proof where no float can hold the point
        (:func:`~crown_cli.verification.outcome.confirm_sat`). CROWN on the rows ``-A``."""
        A = np.asarray(A, dtype=np.float64)
        if A.shape[0] == 0:
            return True
        return bool(np.all(self._crown_lower(lo, hi, -A, -np.asarray(b, np.float64)) >= 0.0))

    def _attack(self, cases, groups, deadline: float, budget: float, seed: int,
                scale: int = 1, restarts: Optional[int] = None):
        """(case index, x) of a verified counterexample, or None. One descent per input box
        on all its cases at once (:meth:`_box_attack`), ``scale`` times the restarts (or
        ``restarts``)."""
        stop = min(deadline, time.monotonic() + budget)
        runs = scale * self.attack_restarts if restarts is None else restarts
        for g, members in enumerate(groups):
            if time.monotonic() >= stop:
                break
            c0 = cases[members[0]]
            found = self._box_attack(c0.lo, c0.hi, [(cases[j].A, cases[j].b) for j in members],
                                     runs, seed + g, stop)
            if found is not None:
                return members[found[0]], found[1]
        return None

    def _bound_stages(self, cases, deadline: float, done, log, stages=None, opened=None):
        """The bound stages (``stages``, default all) in turn on every open case (one
        back-substitution per input box); ``opened``: (open cases, margins, stage) left by
        earlier stages. Returns (the verdict if they decided or the deadline passed, else
        None; the open cases; each case's best row margin; the last stage run)."""
        n = len(cases)
        open_cases, margins, stage = opened or (list(range(n)), {}, "attack")
        if log is not None and opened is None:
            for name, why in getattr(self, "skipped", ()):
                log(f"{name}: skipped ({why})")
        for stage in self.stages if stages is None else stages:
            still = []
            boxes = _by_box(cases, open_cases)
            if stage == "crown" and len(boxes) >= MANY_BOXES and \
                    getattr(self, "many_boxes", None) is not None:
                still, boxes = self._bound_many(cases, boxes, margins, deadline)
            for members in boxes:
                if time.monotonic() >= deadline:
                    return (done("timeout", stage, _worst(margins), n - len(open_cases)),
                            open_cases, margins, stage)
                still += self._bound_cases(stage, cases, members, margins, deadline)
            open_cases = sorted(still)
            if log is not None:
                log(f"{stage}: {n - len(open_cases)} of {n} cases proven")
            if not open_cases:
                return done("unsat", stage, _worst(margins), n), open_cases, margins, stage
        return None, open_cases, margins, stage

    def _bound_many(self, cases, boxes, margins, deadline):
        """The crown stage on many input boxes at once (:meth:`many_boxes`): the boxes whose
        cases stack the same rows A, in chunks of :data:`MANY_CHUNK` boxes, each box's rows
        against its own b. Returns the cases left open and the boxes not bounded here (those
        of a rows class with a single box, or past the deadline), for the box-by-box loop."""
        classes = {}
        for members in boxes:
            A = np.concatenate([cases[j].A for j in members])
            classes.setdefault((A.shape, A.tobytes()), []).append(members)
        still, rest = [], []
        for group in classes.values():
            if len(group) < 2 or sum(cases[j].A.shape[0] for j in group[0]) == 0:
                rest += group
                continue
            A = np.concatenate([cases[j].A for j in group[0]])
            for k in range(0, len(group), MANY_CHUNK):
                chunk = group[k:k + MANY_CHUNK]
                if time.monotonic() >= deadline:
                    rest += group[k:]
                    break
                L = np.stack([cases[m[0]].lo for m in chunk])
                H = np.stack([cases[m[0]].hi for m in chunk])
                lb = self.many_boxes(L, H, A)
                for members, row in zip(chunk, lb):
                    b = np.concatenate([cases[j].b for j in members])
                    still += self._record_bounds("crown", cases, members, margins,
                                                 row - round_up(b))
        return still, rest

    def _bound_cases(self, stage, cases, members, margins, deadline=None):
        """Bound the cases ``members`` (one input box) in one back-substitution; returns those
        not proven and records each case's best row margin."""
        c0 = cases[members[0]]
        A = np.concatenate([cases[j].A for j in members])
        b = np.concatenate([cases[j].b for j in members])
        diff = self.box_lower_bounds(stage, c0.lo, c0.hi, A, b, deadline) if A.shape[0] \
            else np.zeros(0)
        return self._record_bounds(stage, cases, members, margins, diff)

    def _record_bounds(self, stage, cases, members, margins, diff):
        """Each case's best row margin recorded from ``diff`` (its rows' bounds minus b, the
        members' rows stacked); returns the cases not proven."""
        still, at = [], 0
        for j in members:
            m = cases[j].A.shape[0]
            d = diff[at:at + m]
            at += m
            # the best row margin any stage reached (a stage cut by the deadline gives -inf)
            margins[j] = max(float(np.max(d)) if m else -np.inf, margins.get(j, -np.inf))
            if not np.any(d > 0.0):
                still.append(j)
            elif stage == "crown" and getattr(self, "proof", False):
                # CROWN over the case's box proved row i: a one-leaf certificate tree
                from crown_cli.verification.proof import leaf_only

                self._trees[j] = leaf_only(int(np.argmax(d))).case_arrays(0)
        return still

    def _opening(self, prop, timeout, log):
        """What every verifier does first (this one and the graph verifier): the sizes
        checked, the attack on every box, the bound stages on every case. Returns the
        verdict when they decide (``timeout`` when the deadline has passed), else ``(cases, open_cases, margins, stage, deadline,
        budget, done)`` for the rest: ``done(result, stage, margin, proven, **kw)`` makes the
        verdict, timed from the start."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        check_sizes(prop, self.n_inputs, self.n_outputs, "property")
        cases = list(prop.cases)
        n = len(cases)

        def done(result, stage, margin, proven, **kw):
            return Verdict(result, stage, margin, time.monotonic() - t0, cases_proven=proven,
                           cases=n, **kw)

        if n == 0:  # every case had an empty box: nothing can violate the property
            return done("unsat", "parse", None, 0)
        budget = self.attack_time if self.attack_time is not None else max(ATTACK_MIN_S,
                                                                            ATTACK_SHARE * timeout)
        # a verifier with a quick opening: 1/QUICK_SHARE of the starts, then the crown stage,
        # then the other starts on the cases left open before the other stages; else the
        # whole attack first. Each phase: (starts, seed, stages)
        quick = getattr(self, "quick_opening", False) and "crown" in self.stages[:1] \
            and self.attack_restarts >= QUICK_SHARE
        first = self.attack_restarts // QUICK_SHARE
        phases = [(first, self.seed, self.stages[:1]),
                  (self.attack_restarts - first, self.seed + 1, self.stages[1:])] if quick \
            else [(self.attack_restarts, self.seed, self.stages)]
        open_cases, opened = range(n), None
        for starts, seed, stages in phases:
            found = self._attack(cases, _by_box(cases, open_cases), deadline, budget, seed,
                                 restarts=starts)
            if found is not None:
                j, x = found
                margins = opened[1] if opened else {}
                return done("sat", "attack", _worst(margins), n - len(open_cases), x=x,
                            y=self.outputs(x), case=j)
            ended, open_cases, margins, stage = self._bound_stages(cases, deadline, done, log,
                                                                   stages, opened)
            if ended is not None:
                return ended
            opened = (open_cases, margins, stage)
        if time.monotonic() >= deadline:
            return done("timeout", stage, _worst(margins), n - len(open_cases))
        return cases, open_cases, margins, stage, deadline, budget, done


class Verifier(StagedVerifier):
    """One network, the stages to run, and the attack settings; :meth:`verify` per property.
    ``settings``: the fields of :class:`VerifyOptions` (keywords)."""

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                 activation: str, alpha=None, **settings):
        o = VerifyOptions(**settings)
        stages = o.stages
        self.weights = [np.asarray(w, dtype=np.float64) for w in weights]
        self.biases = [np.asarray(b, dtype=np.float64) for b in biases]
        self.activation, self.alpha = activation, alpha
        self.net = Network(self.weights, self.biases)
        why_not = {"alpha-crown": None if ACTIVATIONS[activation].alpha_crown else
                   f"not defined for {activation} networks",
                   "hull": None if hull_stage_applies(self.weights, activation) else
                   "ReLU networks of one hidden layer only"}
        self.stages = [s for s in stages if s in BOUND_STAGES and why_not.get(s) is None]
        # stages asked for that do not apply to this network, with the reason (logged)
        self.skipped = [(s, why_not[s]) for s in stages if s in BOUND_STAGES
                        and why_not.get(s) is not None]
        self.relax = {s: get_relaxation(activation, "crown" if s == "alpha-crown" else s, alpha)
                      for s in self.stages if s != "hull"}
        self._hull_net = None  # the hull stage's view of the hidden layer, built once
        self._crown_s = 0.0  # the last crown stage's seconds on one box (alpha-crown's budget)
        self._settings(o)
        self.bab = o.bab and ACTIVATIONS[activation].bab
        # small networks: the BLAS on one thread, and (one hidden layer) input splitting in
        # two processes unless ``workers`` says otherwise (see verify)
        self.small = max(w.shape[0] for w in self.weights) <= ONE_THREAD_WIDTH
        self.workers = o.workers if o.workers is not None else \
            2 if self.small and len(self.weights) == 2 else 1
        self.proof = o.proof and activation == "relu"
        self._trees = {}  # proof: case index -> its recorded tree's arrays
        # the crown stage on many boxes at once (StagedVerifier._bound_many): ReLU-type MLPs
        self.many_boxes = self._many_boxes if activation in ("relu", "leaky_relu") else None
        self._batch_net = None

    def _many_boxes(self, L, H, A) -> np.ndarray:
        """CROWN lower bounds of ``A f(x)`` over each box [L[j], H[j]], (N, rows): the batched
        engine (:func:`~crown_cli.engine.dense_boxes.batch_lower_bounds`, float64, every
        rounding charged as by the box-by-box bound), in blocks its temporaries fit."""
        from crown_cli.engine.dense_boxes import BatchNet, _bound_blocked
        from crown_cli.verification.bab.input_split import auto_block

        if self._batch_net is None:
            self._batch_net = BatchNet(self.weights, self.biases, self.activation, self.alpha)
        A = np.ascontiguousarray(A, dtype=np.float64)
        widths = [self.weights[0].shape[1]] + [w.shape[0] for w in self.weights]
        lb, _ = _bound_blocked(self._batch_net, L, H, A, auto_block(widths, A.shape[0]))
        return np.where(np.isnan(lb), -np.inf, lb)  # a NaN bound proves nothing

    def warm_up(self, timeout: float = 60.0):
        """Load (or, on a cold numba cache, compile) the kernels a verification of this
        activation can call, so that an instance's deadline is its own: this verifier's
        stages and searches on three tiny networks (one hidden layer: the hull stage and its
        search; three, of 5 inputs: input splitting raced with ReLU splitting; three, of more
        inputs than input splitting takes: ReLU splitting alone, with per-domain bounds),
        :meth:`StagedVerifier._warm_on`. The last verdict."""
        rng = np.random.default_rng(1)
        stages = list(self.stages) + [s for s, _ in self.skipped]
        v = None
        for sizes in ((5, 16, 2), (5, 10, 10, 10, 2), (INPUT_SPLIT_MAX_DIM + 2, 10, 10, 10, 2)):
            ws = [rng.normal(0.0, 1.0 / np.sqrt(n), (m, n)) for n, m in zip(sizes, sizes[1:])]
            bs = [rng.normal(0.0, 0.1, m) for m in sizes[1:]]
            tiny = Verifier(ws, bs, self.activation, self.alpha, stages=stages, bab=self.bab,
                            **WARM_ATTACK)
            v = tiny._warm_on(rng, 0.1, timeout)
        return v

    @property
    def proof_shape(self) -> dict:
        """The certificate's ``network`` entry (a lowered graph's too: its dense layers)."""
        from crown_cli.verification.proof import dense_shape

        return dense_shape(self.weights)

    @property
    def n_inputs(self) -> int:
        return int(self.weights[0].shape[1])

    @property
    def n_outputs(self) -> int:
        return int(self.weights[-1].shape[0])

    def outputs(self, x: np.ndarray) -> np.ndarray:
        return forward(self.weights, self.biases, self.activation, x, self.alpha)

    # ------------------------------------------------------------------ stages

    def box_lower_bounds(self, stage: str, lo, hi, A, b, deadline=None) -> np.ndarray:
        """Per row of A: a float64-verified lower bound of ``A_i f(x) - b_i`` over [lo, hi]
        (b rounded up one ulp first). A row > 0 proves every case holding it empty.
        ``deadline`` (time.monotonic()): the verify's, which caps the hull stage's time and
        alpha-CROWN's steps (past it every row is -inf: not proven)."""
        box = Box(lo, hi)
        A = np.ascontiguousarray(A, dtype=np.float64)
        if stage == "hull":
            return self._hull_lower_bound(lo, hi, A, b, deadline)
        if stage == "alpha-crown":
            try:
                lb = self._alpha_lower_bound(box, A, deadline)
            except DeadlineExceeded:
                return np.full(A.shape[0], -np.inf)
        else:
            t0 = time.monotonic()
            lb = margin_lower_bound(self.net, *box.args(), self.relax[stage], A)
            if stage == "crown":
                self._crown_s = time.monotonic() - t0
        # fl(lb - b_up) > 0 exactly when lb > b_up: a rounded difference keeps its sign
        return lb - round_up(b)

    def _crown_lower(self, lo, hi, A, b) -> np.ndarray:
        """CROWN's :meth:`box_lower_bounds` whatever stages were asked for."""
        relax = get_relaxation(self.activation, "crown", self.alpha)
        return margin_lower_bound(self.net, *Box(lo, hi).args(), relax,
                                  np.ascontiguousarray(A)) - round_up(b)

    def _alpha_lower_bound(self, box: Box, A: np.ndarray, deadline=None) -> np.ndarray:
        """alpha-CROWN over the box: slopes (or, for tanh/sigmoid/arctan, tangent points)
        optimised for the sum of the rows' bounds, then the float64-verified bound at them
        (each row the larger of alpha-CROWN's and CROWN's, both sound)."""
        from crown_cli.engine.alpha_crown import AlphaBounds
        from crown_cli.certification.certifier import ALPHA_LR, ALPHA_LR_SMOOTH
        from crown_cli.engine.dense_crown import first_layer_center

        leak = float(self.alpha) if self.activation == "leaky_relu" else 0.0
        x0, eps, qcode = box.args()
        ab = AlphaBounds(self.net, self.relax["alpha-crown"], leak, x0, qcode, A,
                         first_layer_center(self.net, x0), activation=self.activation)
        lr = ALPHA_LR_SMOOTH if ACTIVATIONS[self.activation].smooth else ALPHA_LR
        crown_s = self._crown_s
        _, steps, _ = ab.optimise(eps, ALPHA_ITERS, lr, patience=3, deadline=deadline,
                                  reserve=ALPHA_VERIFY_COST * crown_s,
                                  first_step=ALPHA_FIRST_COST * crown_s)
        if steps == 0:  # no step fitted: CROWN's slopes, whose bound the crown stage has
            raise DeadlineExceeded("no alpha-CROWN step fits before the deadline")
        return ab.evaluate(eps, verify=True)

    def _hull_lower_bound(self, lo, hi, A, b, deadline=None) -> np.ndarray:
        """Each neuron's convex hull over the box (:mod:`crown_cli.engine.hull`; ReLU networks
        of one hidden layer): per row the float64-verified lower bound of ``A_i f(x) - b_i``,
        the lines optimised per row."""
        from crown_cli.engine import hull

        if self._hull_net is None:
            self._hull_net = hull.HullNet(self.weights[0], self.biases[0])
        stop = None
        if deadline is not None:
            now = time.monotonic()
            stop = now + HULL_SHARE * max(0.0, deadline - now)
        return hull.lower_bounds(self._hull_net, self.weights[1], self.biases[1], lo, hi, A, b,
                                 steps=HULL_STEPS, deadline=stop)

    def _box_attack(self, lo, hi, problems, restarts: int, seed: int, deadline: float):
        """(j, x): a verified x in [lo, hi] violating case j of ``problems`` [(A, b), ...],
        or None: the MLP's descent."""
        from crown_cli.verification.attack import find_counterexample_any

        return find_counterexample_any(self.weights, self.biases, self.activation, self.alpha,
                                       lo, hi, problems, restarts=restarts,
                                       steps=self.attack_steps, seed=seed, deadline=deadline)

    def _input_split_runs(self, cases, open_cases, deadline) -> List[Run]:
        """One input-splitting search
        (:func:`crown_cli.verification.bab.input_split.input_split_steps`) per open case."""
        from crown_cli.verification.bab.input_split import InputSplitProblem, input_split_steps
        from crown_cli.verification.proof import ProofTree

        def start(progress, j):
            c = cases[j]
            tree = ProofTree(np.arange(sum(w.shape[0] for w in self.weights[:-1]))) \
                if self.proof else None
            steps = input_split_steps(
                InputSplitProblem(self.weights, self.biases, self.activation, self.alpha, c.lo,
                                  c.hi, c.A, c.b),
                deadline, max_domains=self.max_domains, progress=progress,
                workers=self.workers, proof=tree)
            return self._recording(steps, tree, [j]) if self.proof else steps

        return [Run([j], "input split", lambda progress, j=j: start(progress, j))
                for j in open_cases]

    def _hull_split_runs(self, cases, open_cases, deadline) -> List[Run]:
        """One convex-hull input-splitting search
        (:func:`crown_cli.verification.bab.hull_split.hull_split_steps`) per open case."""
        from crown_cli.verification.bab.hull_split import hull_split_steps
        from crown_cli.verification.proof import ProofTree

        def start(progress, j):
            c = cases[j]
            tree = ProofTree() if self.proof else None
            steps = hull_split_steps(self.weights, self.biases, c.lo, c.hi, c.A, c.b, deadline,
                                     progress=progress, proof=tree)
            return self._recording(steps, tree, [j]) if self.proof else steps

        return [Run([j], "hull split", lambda progress, j=j: start(progress, j))
                for j in open_cases]

    def _relu_split_runs(self, cases, open_cases, margins, deadline) -> List[Run]:
        """ReLU-splitting searches
        (:func:`crown_cli.verification.bab.relu_split.relu_split_steps`), the hidden layers'
        root bounds tightened once per input box (when its first search starts). On networks
        of ``JOINT_LAYERS`` or more hidden layers one search per box decides all its open cases
        together: there each domain's hidden-layer bounds, recomputed after every split and
        most of the cost, serve every case. On shallower networks one search per case (each
        branches for its own case). The root's optimised slopes serve every domain's
        recomputed hidden-layer bounds. docs/bab.md has the measurements behind both
        choices."""
        from crown_cli.verification.bab.relu_split import (ReluSplitProblem, relu_split_steps,
                                                           root_layer_bounds)
        from crown_cli.verification.proof import ProofTree

        leak = None if self.activation == "relu" else self.alpha
        joint = len(self.weights) - 1 >= JOINT_LAYERS
        runs = []
        for members in _by_box(cases, open_cases):
            c0 = cases[members[0]]
            root = {}

            def root_bounds(c0=c0, root=root):
                if "b" not in root:
                    root["b"] = (None, None) if len(self.weights) <= 2 else root_layer_bounds(
                        self.weights, self.biases, c0.lo, c0.hi, self.activation, leak,
                        deadline=deadline, slopes=True)
                return root["b"]

            # jointly: one search for the box's cases; else one per case, best bound first
            parts = [members] if joint else \
                [[j] for j in sorted(members, key=lambda j: -margins.get(j, -np.inf))]
            for part in parts:
                A = np.concatenate([cases[j].A for j in part])
                b = np.concatenate([cases[j].b for j in part])
                groups = np.concatenate([np.full(cases[j].A.shape[0], g)
                                         for g, j in enumerate(part)])

                def start(progress, c0=c0, A=A, b=b, groups=groups, root_bounds=root_bounds,
                          seed=self.seed + part[0], part=part):
                    lb, ls = root_bounds()
                    problem = ReluSplitProblem(self.weights, self.biases, c0.lo, c0.hi, A, b,
                                               self.activation, leak, layer_bounds=lb,
                                               groups=groups, layer_slopes=ls)

                    def search(until, tree=None):
                        return relu_split_steps(problem, until, max_domains=self.max_domains,
                                                seed=seed, attack_restarts=0,
                                                progress=progress, proof=tree)

                    if not self.proof:
                        return search(deadline)
                    tree = ProofTree()
                    return self._recording(search(deadline, tree), tree, part)
                runs.append(Run(list(part), "ReLU split", start))
        return runs

    def _branch_and_bound(self, cases, open_cases, margins, deadline, timeout, done, log,
                          status):
        """Input splitting (networks of at most ``INPUT_SPLIT_MAX_DIM`` inputs; on ReLU
        networks of one hidden layer, first with convex-hull bounds) and ReLU splitting
        (networks with hidden layers) on the open cases, raced
        (:func:`crown_cli.verification.schedule.race`): the first strategy alone, the others
        from ``JOIN_SHARE`` of the timeout on, then the time by measured progress."""
        runs = []
        if hull_applies(self.weights, self.activation, self.n_inputs, INPUT_SPLIT_MAX_DIM):
            runs += self._hull_split_runs(cases, open_cases, deadline)
        if self.n_inputs <= INPUT_SPLIT_MAX_DIM:
            runs += self._input_split_runs(cases, open_cases, deadline)
        if len(self.weights) > 1:
            runs += self._relu_split_runs(cases, open_cases, margins, deadline)
        if not runs:  # no hidden layer and too many inputs to split: input splitting
            runs = self._input_split_runs(cases, open_cases, deadline)
        settings = RaceSettings(
            kinds={"hull split": "boxes", "input split": "boxes", "ReLU split": "domains"},
            log=log, status=status, first_slice=RACE_SLICE, max_slice=RACE_MAX_SLICE,
            join_after=max(JOIN_MIN_S, JOIN_SHARE * timeout), worst=_worst)
        return race(runs, len(cases), len(cases) - len(open_cases), margins, deadline, done,
                    self.outputs, cases, settings)

    def verify(self, prop, timeout: float, log: Optional[Callable[[str], None]] = None,
               status: Optional[Callable[[str], None]] = None) -> Verdict:
        """Run the pipeline on a parsed property within ``timeout`` seconds.

        ``log``: receives a line per stage (and, without ``status``, the branch and bound's
        status every :data:`STATUS_EVERY_LOG_S` seconds); ``status``: receives the branch and
        bound's status text (open domains, worst open bound, domains/s) every
        :data:`STATUS_EVERY_BAR_S` seconds, e.g. for a progress bar.

        On networks of at most :data:`ONE_THREAD_WIDTH` neurons per layer the BLAS runs on
        one thread (:func:`crown_cli.engine.threads.blas_threads`); on those with one hidden
        layer input splitting also shares its rounds with a second process when the machine
        has a second core (``workers`` None; an int sets it: 1 alone, 2 with a helper
        process). docs/bab.md has the measurements: safenlp's 30-128-2 bounds 1.84x the boxes,
        ACAS Xu's six layers of 50 gain nothing (most of its instances end in rounds too small
        to share)."""
        t0 = time.monotonic()
        self._trees = {}
        with blas_threads(1) if self.small else contextlib.nullcontext():
            v = self._verify(prop, timeout, log, status)
            if self.proof and v.result == "unsat":
                v = self._certify(v, list(prop.cases), t0 + timeout, log)
        return confirm_sat(v, prop.cases, self.outputs, log, prove=self.proves_violation)

    def _recording(self, steps, tree, members):
        """``steps`` (a search's generator) passed through; on ``unsat`` the recorded
        ``tree``'s arrays kept for the cases ``members`` (tree case g is members[g])."""
        from crown_cli.verification.proof import ProofError

        res = yield from steps
        if self.proof and res.verdict == "unsat":
            for g, j in enumerate(members):
                try:
                    self._trees[j] = tree.case_arrays(g)
                except ProofError:  # (a recording bug: the case gets a search of its own)
                    self._trees.pop(j, None)
        return res

    def _certify(self, v: Verdict, cases, deadline: float, log) -> Verdict:
        """The unsat verdict ``v`` with its certificate trees: the recorded ones, and for
        the cases a bound stage proved a proof search of its own (convex-hull input splitting
        on one hidden layer, input splitting on at most ``INPUT_SPLIT_MAX_DIM`` inputs, else
        ReLU splitting) within the deadline."""
        from dataclasses import replace as _replace

        from crown_cli.verification.bab.hull_split import hull_split_steps
        from crown_cli.verification.bab.input_split import input_split_steps, InputSplitProblem
        from crown_cli.verification.bab.relu_split import ReluSplitProblem, relu_split_steps
        from crown_cli.verification.outcome import finish
        from crown_cli.verification.proof import ProofTree, case_tree

        trees, missing = [], 0
        n_hidden = sum(w.shape[0] for w in self.weights[:-1])
        for j, c in enumerate(cases):
            t = self._trees.get(j)
            if t is None and time.monotonic() < deadline:
                if hull_stage_applies(self.weights, self.activation):
                    # (any number of inputs: a case the hull or an alpha stage proved is
                    # proven at the root, the hull being the tightest per-neuron relaxation)
                    tree = ProofTree()
                    res = finish(hull_split_steps(self.weights, self.biases, c.lo, c.hi, c.A,
                                                  c.b, deadline, proof=tree))
                elif self.n_inputs <= INPUT_SPLIT_MAX_DIM or len(self.weights) == 1:
                    tree = ProofTree(np.arange(n_hidden))
                    res = finish(input_split_steps(InputSplitProblem(
                        self.weights, self.biases, self.activation, self.alpha, c.lo, c.hi,
                        c.A, c.b), deadline, proof=tree, workers=1))
                else:
                    tree = ProofTree()
                    res = finish(relu_split_steps(ReluSplitProblem(
                        self.weights, self.biases, c.lo, c.hi, c.A, c.b), deadline,
                        max_domains=self.max_domains, attack_restarts=0, proof=tree))
                if res.verdict == "unsat":
                    t = tree.case_arrays(0)
            t = case_tree(t, c)
            missing += t is None
            trees.append(t)
        note = v.note
        if missing:
            note = (note + "; " if note else "") + \
                f"no certificate for {missing} case(s) within the timeout"
            if log is not None:
                log(f"proof: {missing} of {len(cases)} case(s) without a certificate")
        return _replace(v, proof=trees, note=note)

    def _verify(self, prop, timeout, log, status) -> Verdict:
        bab_status = bab_status_for(status, log)
        opened = self._opening(prop, timeout, log)
        if isinstance(opened, Verdict):
            return opened
        cases, open_cases, margins, stage, deadline, budget, done = opened
        n = len(cases)
        if self.bab and self.n_inputs <= WIDE_ATTACK_MAX_DIM:
            # few inputs: a forward pass is cheap, so a 64x wider attack first (ACAS Xu 2_9
            # prop_8, sat: missed by 64 starts and by the branch and bound's box centres and
            # corners; 4096 starts x 100 steps found it with 5 of 8 seeds, 0.9 s each)
            found = self._attack(cases, _by_box(cases, open_cases), deadline, budget,
                                 self.seed + 7919, scale=64)
            if found is not None:
                j, x = found
                return done("sat", "attack", _worst(margins), n - len(open_cases), x=x,
                            y=self.outputs(x), case=j)
        if self.bab:
            return self._branch_and_bound(cases, open_cases, margins, deadline, timeout, done,
                                          log, bab_status)
        # the bounds could not decide: an attack with other starts on the open cases
        found = self._attack(cases, _by_box(cases, open_cases), deadline, budget,
                             self.seed + 7919)
        if found is not None:
            j, x = found
            return done("sat", "attack", _worst(margins), n - len(open_cases), x=x,
                        y=self.outputs(x), case=j)
        return done("unknown", stage, _worst(margins), n - len(open_cases))


JOINT_LAYERS = 3  # hidden layers from which verify's ReLU splitting decides cases jointly


def _by_box(cases, indices) -> List[List[int]]:
    """The case indices grouped by identical input box, in order of first appearance."""
    out = {}
    for j in indices:
        key = (cases[j].lo.tobytes(), cases[j].hi.tobytes())
        out.setdefault(key, []).append(j)
    return list(out.values())


def _worst(margins) -> Optional[float]:
    return min(margins.values()) if margins else None
