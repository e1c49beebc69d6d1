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

import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

from crown_cli.activations import ACTIVATIONS, forward
from crown_cli.engine.backsub import Network, margin_lower_bound
from crown_cli.engine.input_sets import Box
from crown_cli.engine.rounding import round_up
from crown_cli.errors import InputError
from crown_cli.engine.relaxations import get_relaxation

# Bound stages, cheap to strong; a stage is used when the activation has that method.
BOUND_STAGES = ("crown", "alpha-crown")
# alpha-crown (crown_cli.engine.alpha_crown): optimised lower slopes (ReLU, leaky ReLU) or tangent points
# (tanh, sigmoid, arctan)
ALPHA_ITERS = 50  # one box per case: more steps than certify's search spends (its step sizes)
# Complete stage after the bounds: branch and bound by input splitting for networks with at
# most this many inputs (ACAS Xu: 5), where bisecting the box shrinks every neuron's interval
# quickly; wider inputs (images) need ReLU splitting instead.
INPUT_SPLIT_MAX_DIM = 16
ATTACK_SHARE = 0.1  # of the timeout for the first attack (before any bound)
ATTACK_MIN_S = 0.5
# branch and bound status (open domains, worst open bound, domains/s): at most this often, in
# seconds, to a progress bar and to the -v log
STATUS_EVERY_BAR_S, STATUS_EVERY_LOG_S = 0.5, 2.0


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


def check_sizes(prop, n_inputs: int, n_outputs: int, where: str) -> None:
    if prop.n_inputs != n_inputs or prop.n_outputs != n_outputs:
        raise InputError(f"{where}: the property has {prop.n_inputs} inputs and {prop.n_outputs} "
                         f"outputs but the network has {n_inputs} and {n_outputs}")


class Verifier:
    """One network, the stages to run, and the attack settings; :meth:`verify` per property."""

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                 activation: str, alpha=None, stages: Sequence[str] = BOUND_STAGES,
                 attack_restarts: int = 64, attack_steps: int = 100, seed: int = 0,
                 attack_time: Optional[float] = None, bab: bool = True,
                 max_domains: int = 200_000):
        self.weights = [np.asarray(w, dtype=np.float64) for w in weights]
        self.biases = [np.asarray(b, dtype=np.float64) for b in biases]
        self.activation, self.alpha = activation, alpha
        self.net = Network(self.weights, self.biases)
        self.stages = [s for s in stages if s in BOUND_STAGES
                       and (s != "alpha-crown" or ACTIVATIONS[activation].alpha_crown)]
        self.relax = {s: get_relaxation(activation, "crown" if s == "alpha-crown" else s, alpha)
                      for s in self.stages}
        self.attack_restarts, self.attack_steps, self.seed = attack_restarts, attack_steps, seed
        self.attack_time = attack_time
        self.bab = bab and ACTIVATIONS[activation].bab
        self.max_domains = max_domains

    @property
    def n_inputs(self) -> int:
        return int(self.weights[0].shape[1])

    @property
    def n_outputs(self) -> int:
        return int(self.weights[-1].shape[0])

    def outputs(self, x: np.ndarray) -> np.ndarray:
        return forward(self.weights, self.biases, self.activation, x, self.alpha)

    # ------------------------------------------------------------------ stages

    def box_lower_bounds(self, stage: str, lo, hi, A, b) -> np.ndarray:
        """Per row of A: a float64-verified lower bound of ``A_i f(x) - b_i`` over [lo, hi]
        (b rounded up one ulp first). A row > 0 proves every case holding it empty."""
        box = Box(lo, hi)
        A = np.ascontiguousarray(A, dtype=np.float64)
        if stage == "alpha-crown":
            lb = self._alpha_lower_bound(box, A)
        else:
            lb = margin_lower_bound(self.net, *box.args(), self.relax[stage], A)
        # fl(lb - b_up) > 0 exactly when lb > b_up: a rounded difference keeps its sign
        return lb - round_up(b)

    def _alpha_lower_bound(self, box: Box, A: np.ndarray) -> np.ndarray:
        """alpha-CROWN over the box: slopes (or, for tanh/sigmoid/arctan, tangent points)
        optimised for the sum of the rows' bounds, then the float64-verified bound at them
        (each row the larger of alpha-CROWN's and CROWN's, both sound)."""
        from crown_cli.engine.alpha_crown import AlphaBounds
        from crown_cli.certification.certifier import ALPHA_LR, ALPHA_LR_SMOOTH
        from crown_cli.engine.backsub import first_layer_center

        leak = float(self.alpha) if self.activation == "leaky_relu" else 0.0
        x0, eps, qcode = box.args()
        ab = AlphaBounds(self.net, self.relax["alpha-crown"], leak, x0, qcode, A,
                         first_layer_center(self.net, x0), activation=self.activation)
        lr = ALPHA_LR_SMOOTH if ACTIVATIONS[self.activation].smooth else ALPHA_LR
        ab.optimise(eps, ALPHA_ITERS, lr, patience=3)
        return ab.evaluate(eps, verify=True)

    def _attack(self, cases, groups, deadline: float, budget: float, seed: int,
                scale: int = 1):
        """(case index, x) of a verified counterexample, or None. One descent per input box
        on all its cases at once."""
        from crown_cli.verification.attack import find_counterexample_any

        stop = min(deadline, time.monotonic() + budget)
        for g, members in enumerate(groups):
            if time.monotonic() >= stop:
                break
            c0 = cases[members[0]]
            found = find_counterexample_any(self.weights, self.biases, self.activation,
                                            self.alpha, c0.lo, c0.hi,
                                            [(cases[j].A, cases[j].b) for j in members],
                                            restarts=scale * self.attack_restarts,
                                            steps=self.attack_steps,
                                            seed=seed + g, deadline=stop)
            if found is not None:
                return members[found[0]], found[1]
        return None

    def _bound_cases(self, stage, cases, members, margins):
        """Bound the cases ``members`` (one input box) in one back-substitution; returns those
        not proven and records each case's best row margin."""
        c0 = cases[members[0]]
        A = np.concatenate([cases[j].A for j in members])
        b = np.concatenate([cases[j].b for j in members])
        diff = self.box_lower_bounds(stage, c0.lo, c0.hi, A, b) if A.shape[0] else np.zeros(0)
        still, at = [], 0
        for j in members:
            m = cases[j].A.shape[0]
            d = diff[at:at + m]
            at += m
            margins[j] = float(np.max(d)) if m else -np.inf
            if not np.any(d > 0.0):
                still.append(j)
        return still

    def _input_split(self, cases, open_cases, margins, deadline, done, log, status):
        """Branch and bound by input splitting (:func:`crown_cli.verification.bab.input_split.input_split`) on each open
        case in turn."""
        from crown_cli.verification.bab.input_split import input_split

        def runs():
            for j in open_cases:
                c = cases[j]

                def run(progress, c=c):
                    r = input_split(self.weights, self.biases, self.activation, self.alpha,
                                    c.lo, c.hi, c.A, c.b, deadline,
                                    max_domains=self.max_domains, progress=progress)
                    worst = None if np.isnan(r.worst_bound) else r.worst_bound
                    return r.verdict, r.x, r.domains, r.peak_open, worst
                yield j, run

        return self._branch_and_bound("input split", "boxes", runs(), cases, open_cases,
                                      margins, deadline, done, log, status)

    def _relu_split(self, cases, open_cases, margins, deadline, done, log, status):
        """Branch and bound over ReLU splits
        (:func:`crown_cli.verification.bab.relu_split.relu_split_steps`), the hidden layers'
        root bounds tightened once per input box, the searches interleaved
        (:meth:`_interleave`). On networks of ``JOINT_LAYERS`` or more hidden layers one
        search per box decides all its open cases together: there each domain's hidden-layer
        bounds, recomputed after every split and most of the cost, serve every case. On
        shallower networks one search per case (each branches for its own case). The root's
        optimised slopes serve every domain's recomputed hidden-layer bounds. docs/bab.md
        has the measurements behind both choices."""
        from crown_cli.verification.bab.relu_split import relu_split_steps, root_layer_bounds

        leak = None if self.activation == "relu" else self.alpha
        joint = len(self.weights) - 1 >= JOINT_LAYERS
        runs = []
        for members in _by_box(cases, open_cases):
            c0 = cases[members[0]]
            layer_bounds = slopes = None
            if len(self.weights) > 2:
                layer_bounds, slopes = root_layer_bounds(
                    self.weights, self.biases, c0.lo, c0.hi, self.activation, leak,
                    deadline=deadline, slopes=True)
            # jointly: one search for the box's cases; else one per case, best bound first
            parts = [members] if joint else \
                [[j] for j in sorted(members, key=lambda j: -margins.get(j, -np.inf))]
            for part in parts:
                A = np.concatenate([cases[j].A for j in part])
                b = np.concatenate([cases[j].b for j in part])
                groups = np.concatenate([np.full(cases[j].A.shape[0], g)
                                         for g, j in enumerate(part)])
                runs.append((part, lambda progress, c0=c0, A=A, b=b, groups=groups,
                             lb=layer_bounds, ls=slopes,
                             seed=self.seed + part[0]: relu_split_steps(
                                 self.weights, self.biases, c0.lo, c0.hi, A, b, deadline,
                                 max_domains=self.max_domains, activation=self.activation,
                                 leak=leak, layer_bounds=lb, layer_slopes=ls,
                                 groups=groups, seed=seed,
                                 attack_restarts=0, progress=progress)))
        return self._interleave("ReLU split", "domains", runs, cases, open_cases, margins,
                                deadline, done, log, status)

    def _interleave(self, kind, unit, runs, cases, open_cases, margins, deadline, done, log,
                    status, first_slice: float = 1.0, max_slice: float = 10.0):
        """Run several branch and bounds in turn, a time slice each (growing from
        ``first_slice`` by half each round up to ``max_slice`` seconds), each keeping its open
        domains between its slices, so a violated one is reached early whatever the order,
        and no work is repeated. ``runs``: (the case indices a run decides together,
        start(progress) -> a :func:`crown_cli.verification.bab.relu_split.relu_split_steps` generator).

        Ends at the first verified counterexample (sat), when every run is proven (unsat), at
        the deadline (timeout); a run ending in ``unknown`` (domain cap, a leaf it cannot
        decide) leaves the others running, for a counterexample, then gives ``unknown``."""
        proven = len(cases) - len(open_cases)
        stat = [[0, 0, np.inf] for _ in runs]  # domains, open, worst bound per run
        peak = [0]  # the most open domains at once, over all runs
        unknown = False

        def label(members):
            return ",".join(str(j) for j in members)

        def progress_for(r):
            def update(domains, open_, worst):
                stat[r] = [domains, open_, worst]
                peak[0] = max(peak[0], sum(v[1] for v in stat))
                if status is not None:
                    status.update(domains, sum(v[1] for v in stat),
                                  min(v[2] for v in stat))
            return update

        active = [(r, members, start(progress_for(r)))
                  for r, (members, start) in enumerate(runs)]
        slice_s = first_slice
        while active:
            still = []
            for r, members, gen in active:
                if time.monotonic() >= deadline:
                    return done("timeout", "bab", _worst_open(margins, stat), proven,
                                domains=sum(v[0] for v in stat), peak_domains=peak[0])
                if status is not None:
                    status.begin(kind, unit, label(members), proven, len(cases),
                                 sum(v[0] for i, v in enumerate(stat) if i != r))
                stop = min(deadline, time.monotonic() + slice_s)
                res = None
                try:
                    while time.monotonic() < stop:
                        next(gen)
                except StopIteration as end:
                    res = end.value
                if res is None:
                    still.append((r, members, gen))
                    continue
                stat[r] = [res.domains, 0, np.inf]
                peak[0] = max(peak[0], res.peak_open)
                visited = sum(v[0] for v in stat)
                if log is not None:
                    log(f"bab ({kind}): case {label(members)}: {res.verdict} after "
                        f"{res.domains} {unit} (peak {res.peak_open} open)")
                if res.verdict == "sat":
                    y = self.outputs(res.x)
                    hit = [j for j in members if np.all(cases[j].A @ y <= cases[j].b)]
                    return done("sat", "bab", _worst(margins), proven, x=res.x, y=y,
                                case=hit[0] if hit else members[0], domains=visited,
                                peak_domains=peak[0])
                if res.verdict == "unsat":
                    for j in members:
                        margins[j] = max(0.0, res.worst_bound) \
                            if np.isfinite(res.worst_bound) else 0.0
                    proven += len(members)
                elif res.verdict == "timeout":
                    stat[r][2] = res.worst_bound
                    return done("timeout", "bab", _worst_open(margins, stat), proven,
                                domains=visited, peak_domains=peak[0])
                else:
                    stat[r][2] = res.worst_bound
                    unknown = True
            active = still
            slice_s = min(max_slice, 1.5 * slice_s)
        visited = sum(v[0] for v in stat)
        if unknown:
            return done("unknown", "bab", _worst_open(margins, stat), proven, domains=visited,
                        peak_domains=peak[0])
        return done("unsat", "bab", None, proven, domains=visited, peak_domains=peak[0])

    def _branch_and_bound(self, kind, unit, runs, cases, open_cases, margins, deadline, done,
                          log, status):
        """Run ``runs`` (case index, run(progress) -> (verdict, x, domains, peak open, worst
        bound or None)) one case after another until every case is proven (unsat), one yields
        a verified counterexample (sat), the deadline passes (timeout) or a domain cap is hit
        (unknown). ``status``: a :class:`BabStatus` (or None) the runs report progress to."""
        proven = len(cases) - len(open_cases)
        visited = peak = 0
        for j, run in runs:
            if time.monotonic() >= deadline:
                return done("timeout", "bab", _worst(margins), proven, domains=visited,
                            peak_domains=peak)
            progress = None
            if status is not None:
                status.begin(kind, unit, j, proven, len(cases), visited)
                progress = status.update
            verdict, x, domains, peak_open, worst = run(progress)
            visited += domains
            peak = max(peak, peak_open)
            if log is not None:
                log(f"bab ({kind}): case {j}: {verdict} after {domains} {unit} "
                    f"(peak {peak_open} open)")
            if verdict == "sat":
                return done("sat", "bab", _worst(margins), proven, x=x, y=self.outputs(x),
                            case=j, domains=visited, peak_domains=peak)
            if verdict != "unsat":
                return done(verdict, "bab", _worst(margins) if worst is None else worst,
                            proven, domains=visited, peak_domains=peak)
            margins[j] = 0.0 if worst is None else max(0.0, worst)
            proven += 1
        return done("unsat", "bab", None, proven, domains=visited, peak_domains=peak)

    def verify(self, prop, timeout: float, log: Optional[Callable[[str], None]] = None,
               status: Optional[Callable[[str], None]] = None) -> Verdict:
        """Run the pipeline on a parsed property within ``timeout`` seconds.

        ``log``: receives a line per stage (and, without ``status``, the branch and bound's
        status every :data:`STATUS_EVERY_LOG_S` seconds); ``status``: receives the branch and
        bound's status text (open domains, worst open bound, domains/s) every
        :data:`STATUS_EVERY_BAR_S` seconds, e.g. for a progress bar."""
        t0 = time.monotonic()
        bab_status = None
        if status is not None:
            bab_status = BabStatus(status, STATUS_EVERY_BAR_S)
        elif log is not None:
            bab_status = BabStatus(log, STATUS_EVERY_LOG_S)
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
        groups = _by_box(cases, range(n))
        found = self._attack(cases, groups, deadline, budget, self.seed)
        if found is not None:
            j, x = found
            return done("sat", "attack", None, 0, x=x, y=self.outputs(x), case=j)
        open_cases = list(range(n))
        margins = {}
        stage = "attack"
        for stage in self.stages:
            still = []
            for members in _by_box(cases, open_cases):
                if time.monotonic() >= deadline:
                    return done("timeout", stage, _worst(margins), n - len(open_cases))
                still += self._bound_cases(stage, cases, members, margins)
            open_cases = sorted(still)
            if log is not None:
                log(f"{stage}: {n - len(open_cases)} of {n} cases proven")
            if not open_cases:
                return done("unsat", stage, _worst(margins), n)
        if time.monotonic() >= deadline:
            return done("timeout", stage, _worst(margins), n - len(open_cases))
        if self.bab and self.n_inputs <= INPUT_SPLIT_MAX_DIM:
            # few inputs: a forward pass is cheap, so a 64x wider attack first (ACAS Xu 2_9
            # prop_8, sat: missed by 64 starts and by the branch and bound's box centres and
            # corners; 4096 starts x 100 steps found it with 5 of 8 seeds, 0.9 s each)
            found = self._attack(cases, _by_box(cases, open_cases), deadline, budget,
                                 self.seed + 7919, scale=64)
            if found is not None:
                j, x = found
                return done("sat", "attack", _worst(margins), n - len(open_cases), x=x,
                            y=self.outputs(x), case=j)
            return self._input_split(cases, open_cases, margins, deadline, done, log,
                                     bab_status)
        if self.bab:
            return self._relu_split(cases, open_cases, margins, deadline, done, log, bab_status)
        # the bounds could not decide: an attack with other starts on the open cases
        found = self._attack(cases, _by_box(cases, open_cases), deadline, budget,
                             self.seed + 7919)
        if found is not None:
            j, x = found
            return done("sat", "attack", _worst(margins), n - len(open_cases), x=x,
                        y=self.outputs(x), case=j)
        return done("unknown", stage, _worst(margins), n - len(open_cases))


JOINT_LAYERS = 3  # hidden layers from which verify's ReLU splitting decides cases jointly


class BabStatus:
    """The status of a running branch and bound as one line of text, handed to ``emit`` at
    most every ``every`` seconds: the case, domains bounded and their rate over the whole
    branch and bound so far, open domains, and the worst open domain's bound minus b (its best
    row; a float32 estimate for ReLU splitting)."""

    def __init__(self, emit: Callable[[str], None], every: float,
                 clock: Callable[[], float] = time.monotonic):
        self.emit, self.every, self.clock = emit, every, clock
        self.t0 = None
        self.last = -np.inf
        self.kind = self.unit = ""
        self.case = self.proven = self.cases = self.before = 0

    def begin(self, kind: str, unit: str, case: int, proven: int, cases: int,
              before: int) -> None:
        """A new case starts; ``before``: domains the earlier cases bounded."""
        if self.t0 is None:  # the first line after ``every`` seconds, with a meaningful rate
            self.t0 = self.last = self.clock()
        self.kind, self.unit, self.case = kind, unit, case
        self.proven, self.cases, self.before = proven, cases, before

    def text(self, domains: int, open_: int, worst: float) -> str:
        total = self.before + domains
        rate = total / max(self.clock() - self.t0, 1e-9)
        worst_s = f"{worst:.4g}" if np.isfinite(worst) else "-"
        return (f"bab ({self.kind}): case {self.case} ({self.proven} of {self.cases} proven): "
                f"{total} {self.unit}, {open_} open, worst bound {worst_s}, "
                f"{rate:.0f} {self.unit}/s")

    def update(self, domains: int, open_: int, worst: float) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        self.emit(self.text(domains, open_, worst))


def _by_box(cases, indices) -> List[List[int]]:
    """The case indices grouped by identical input box, in order of first appearance."""
    out = {}
    for j in indices:
        key = (cases[j].lo.tobytes(), cases[j].hi.tobytes())
        out.setdefault(key, []).append(j)
    return list(out.values())


def _worst(margins) -> Optional[float]:
    return min(margins.values()) if margins else None


def _worst_open(margins, stat) -> Optional[float]:
    """The worst open bound of the interleaved branch and bounds (``stat``: per run
    [domains, open, worst]) where one is known, else the bound stages' worst margin."""
    worst = [v[2] for v in stat if np.isfinite(v[2])]
    return min(worst) if worst else _worst(margins)


def format_result(v: Verdict) -> str:
    """The competition's result file: the verdict line, and for ``sat`` the counterexample
    ``((X_0 v) ... (Y_0 v) ...)`` with every value written exactly (repr round-trips)."""
    if v.result != "sat":
        return v.result + "\n"
    items = [f"(X_{i} {float(val)!r})" for i, val in enumerate(v.x)]
    items += [f"(Y_{i} {float(val)!r})" for i, val in enumerate(v.y)]
    return "sat\n(" + "\n ".join(items) + ")\n"
