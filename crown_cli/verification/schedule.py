"""Several branch-and-bound searches on one property, run in turn: :func:`race`.

Each search (a *run*) decides some cases of the property and belongs to a *strategy* (input
splitting, ReLU splitting). Runs take time slices and keep their open domains between slices,
so a violated case is reached early whatever the order and no work is repeated. When runs of
two strategies compete for the same cases, the time goes by measurement: every run reports
the share of its search space proven so far (its generator yields it), a strategy's rate is
that share per second it has run, and each strategy gets time in proportion to its rate, never
less than :data:`FLOOR` of it, so that the other is still watched and takes over when it
becomes the faster. docs/bab.md ("Which branch and bound") has the measurements behind it.

No files and no printing: the caller's ``log`` and ``status`` receive the text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from crown_cli.engine.deadline import DeadlineExceeded

# Each strategy that has run at least PROBE_S seconds is judged by its rate; before that it
# is run first (the probe). A strategy behind in rate keeps at least FLOOR of the time.
PROBE_S = 0.3
FLOOR = 0.1
# A later strategy joins after ``join_after`` seconds unless the strategies running have
# proven this share of their space (then, at their rate, they finish sooner than they began).
# That exemption ends at JOIN_SLACK times the finish it projected (elapsed / share, at the
# first check; the slack is for a rate that slows): a search that proved most of its space
# fast and stalls on the rest (a graph's input splitting stuck at one corner while ReLU
# splitting decides the case in 0.1 s) does not keep the others out for good
JOIN_UNLESS = 0.5
JOIN_SLACK = 2.0


@dataclass
class Run:
    """One search: the case indices it decides together, its strategy, and ``start(progress)``
    -> a generator that yields its proven share (a float in [0, 1]) and returns a
    :class:`crown_cli.verification.outcome.BabResult`."""

    members: List[int]
    strategy: str
    start: Callable
    gen: object = None
    closed: float = 0.0
    spent: float = 0.0
    stat: List[float] = field(default_factory=lambda: [0, 0, np.inf])  # domains, open, worst
    over: bool = False


def shares(runs: Sequence[Run], order: Sequence[str]) -> Dict[str, float]:
    """Target share of the time per strategy with runs still going: in proportion to each
    one's proven share per second (the mean over its runs), at least FLOOR each; equal while
    none has proven anything."""
    rate = {}
    for s in order:
        mine = [r for r in runs if r.strategy == s and not r.over]
        if mine:
            spent = sum(r.spent for r in runs if r.strategy == s)
            rate[s] = np.mean([r.closed for r in mine]) / max(spent, 1e-9)
    total = sum(rate.values())
    if not rate:
        return {}
    if total <= 0.0:
        return {s: 1.0 / len(rate) for s in rate}
    out = {s: max(FLOOR, v / total) for s, v in rate.items()}
    norm = sum(out.values())
    return {s: v / norm for s, v in out.items()}


@dataclass
class RaceSettings:
    """How :func:`race` shares the time and what it reports: ``kinds`` the log's unit per
    strategy ("boxes", "domains"); ``log(text)``, ``status`` (``begin``/``update``) receive
    the progress; each turn's slice grows from ``first_slice`` by half per turn of its
    strategy up to ``max_slice``; a later strategy joins after ``join_after`` seconds (see
    :func:`race`); ``worst(margins)``: the bound stages' worst margin (reported when no run
    has a bound)."""

    kinds: Dict[str, str]
    log: Optional[Callable] = None
    status: object = None
    first_slice: float = 1.0
    max_slice: float = 10.0
    join_after: float = 0.0
    worst: Optional[Callable] = None


def race(runs: Sequence[Run], n_cases: int, proven_before: int, margins, deadline: float,
         done, outputs, cases, settings: RaceSettings):
    """Run ``runs`` until every case they cover is proven (unsat), one finds a verified
    counterexample (sat), the deadline passes (timeout), or every run still needed has
    ended without deciding (unknown).

    Strategies start in the order of their first run; a later one joins once
    ``settings.join_after`` seconds have passed, unless the running ones have proven
    :data:`JOIN_UNLESS` of their space by then (checked again every turn) and
    :data:`JOIN_SLACK` times the finish that projects (elapsed time over the share, at the
    rate so far) has not passed. Each turn gives one run a slice (:class:`RaceSettings`),
    round robin within its strategy, the strategy picked as the one furthest behind its
    :func:`shares` (a strategy still in its probe first). A case proven by any run is
    proven; runs whose cases are all proven stop.

    ``done(result, stage, margin, proven, **kw)`` builds the verdict; ``outputs(x)`` the
    float64 outputs; ``cases`` the property's cases (a sat point's case is the one it
    violates)."""
    return _Race(runs, n_cases, proven_before, margins, deadline, done, outputs, cases,
                 settings).run()


class _Race:
    """The state of one :func:`race`: what is proven, the strategies joined, the slices."""

    def __init__(self, runs, n_cases, proven_before, margins, deadline, done, outputs, cases,
                 settings: RaceSettings):
        self.runs, self.n_cases, self.proven_before = runs, n_cases, proven_before
        self.margins, self.deadline, self.done = margins, deadline, done
        self.outputs, self.cases, self.o = outputs, cases, settings
        self.t0 = time.monotonic()
        self.order = []
        for r in runs:
            if r.strategy not in self.order:
                self.order.append(r.strategy)
        self.proven = set()
        self.joined = self.order[:1]
        self.peak = 0
        self.unknown = False
        self.notes = []  # why searches ended unknown (BabResult.note), for the verdict
        self.slice_s = {s: settings.first_slice for s in self.order}
        self.turn = {s: 0 for s in self.order}
        self.exempt_until = None  # the projected finish that keeps the next strategy out

    # -- reporting -------------------------------------------------------------------------
    def n_proven(self):
        return self.proven_before + len(self.proven)

    def totals(self):
        return sum(r.stat[0] for r in self.runs)

    def progress_for(self, r: Run):
        def update(domains, open_, worst_):
            r.stat = [domains, open_, worst_]
            going = [v.stat for v in self.runs if not v.over]
            self.peak = max(self.peak, sum(v[1] for v in going))
            if self.o.status is not None:
                self.o.status.update(domains, sum(v[1] for v in going),
                                     min(v[2] for v in going))
        return update

    def open_margin(self):
        """Over the open cases, the worst of each case's best bound among its runs (runs of
        several strategies bound the same case), else the bound stages' worst margin."""
        per_case = {}
        for r in self.runs:
            if np.isfinite(r.stat[2]):
                for j in r.members:
                    if j not in self.proven:
                        per_case[j] = max(per_case.get(j, -np.inf), r.stat[2])
        return min(per_case.values()) if per_case else self.o.worst(self.margins)

    def finish(self, result, **kw):
        return self.done(result, "bab", kw.pop("margin", None), self.n_proven(),
                         domains=self.totals(), peak_domains=self.peak, **kw)

    # -- the turns ---------------------------------------------------------------------------
    def run(self):
        try:
            return self._turns()
        finally:  # searches left unfinished end here (their helper processes and pools let
            for r in self.runs:  # go now, not when the interpreter collects them at exit)
                if r.gen is not None:
                    r.gen.close()

    def _turns(self):
        while True:
            for r in self.runs:  # runs whose cases another run proved
                if not r.over and all(j in self.proven for j in r.members):
                    r.over = True
                    r.stat[1] = 0
            live = [r for r in self.runs if not r.over]
            if not live:
                break
            if time.monotonic() >= self.deadline:
                return self.finish("timeout", margin=self.open_margin())
            s, probing = self.pick(live)
            mine = [r for r in live if r.strategy == s]
            r = mine[self.turn[s] % len(mine)]
            self.turn[s] += 1
            try:
                res = self.give_slice(r, s, probing)
            except DeadlineExceeded:  # a bound inside the search (its root, a domain) ran out
                return self.finish("timeout", margin=self.open_margin())
            if res is None:
                continue
            verdict = self.settle(r, s, res)
            if verdict is not None:
                return verdict
        covered = set(j for r in self.runs for j in r.members)
        if self.unknown and not covered <= self.proven:
            return self.finish("unknown", margin=self.open_margin(),
                               **({"note": "; ".join(self.notes)} if self.notes else {}))
        return self.finish("unsat")

    def pick(self, live):
        """The strategy to run next (a later one joins first when its time has come), and
        whether it is still in its probe."""
        now = time.monotonic()
        if len(self.joined) < len(self.order) and now - self.t0 >= self.o.join_after:
            # the next strategy joins unless the ones running are about to finish: at their
            # rate so far (half their space proven or more) they need less time than they had
            mine = [r.closed for r in self.runs if r.strategy in self.joined]
            closed = float(np.mean(mine)) if mine else 0.0
            if closed >= JOIN_UNLESS and self.exempt_until is None:
                self.exempt_until = self.t0 + JOIN_SLACK * (now - self.t0) / closed
            if closed < JOIN_UNLESS or now >= self.exempt_until:
                self.joined.append(self.order[len(self.joined)])
                self.exempt_until = None
        ready = [s for s in self.joined if any(r.strategy == s for r in live)]
        if not ready:  # only strategies that have not joined yet are left
            ready = [s for s in self.order if any(r.strategy == s for r in live)][:1]
        spent = {s: sum(r.spent for r in self.runs if r.strategy == s) for s in ready}
        probing = [s for s in ready if spent[s] < PROBE_S] if len(ready) > 1 else []
        if probing:
            return probing[0], True
        share = shares([r for r in self.runs if r.strategy in ready], ready)
        total = sum(spent.values())
        return max(ready, key=lambda k: share[k] * total - spent[k]), False

    def give_slice(self, r: Run, s: str, probing: bool):
        """Run ``r`` for its slice; its result when it ended, else None."""
        if self.o.status is not None:
            self.o.status.begin(s, self.o.kinds.get(s, "domains"), _label(r.members),
                                self.n_proven(), self.n_cases, self.totals() - r.stat[0])
        t1 = time.monotonic()
        stop = min(self.deadline, t1 + (PROBE_S if probing else self.slice_s[s]))
        if not probing:
            self.slice_s[s] = min(self.o.max_slice, 1.5 * self.slice_s[s])
        res = None
        if r.gen is None:
            r.gen = r.start(self.progress_for(r))
        try:
            while time.monotonic() < stop:
                share_ = next(r.gen)
                if share_ is not None:
                    r.closed = float(share_)
        except StopIteration as end:
            res = end.value
        r.spent += time.monotonic() - t1
        return res

    def settle(self, r: Run, s: str, res):
        """Take an ended run's result; the verdict when it decides the race, else None."""
        r.over = True
        r.stat = [res.domains, 0, np.inf]
        self.peak = max(self.peak, res.peak_open)
        if self.o.log is not None:
            self.o.log(f"bab ({s}): case {_label(r.members)}: {res.verdict} after "
                       f"{res.domains} {self.o.kinds.get(s, 'domains')} (peak "
                       f"{res.peak_open} open)")
        if res.verdict == "sat":
            y = self.outputs(res.x)
            hit = [j for j in r.members if np.all(self.cases[j].A @ y <= self.cases[j].b)]
            return self.finish("sat", margin=self.o.worst(self.margins), x=res.x, y=y,
                               case=hit[0] if hit else r.members[0])
        if res.verdict == "unsat":
            r.closed = 1.0
            for j in r.members:
                if j not in self.proven:
                    self.margins[j] = max(0.0, res.worst_bound) \
                        if np.isfinite(res.worst_bound) else 0.0
                    self.proven.add(j)
            return None
        r.stat[2] = res.worst_bound
        if res.verdict == "timeout":
            return self.finish("timeout", margin=self.open_margin())
        self.unknown = True
        if res.note and f"{s}: {res.note}" not in self.notes:
            self.notes.append(f"{s}: {res.note}")
        return None


def _label(members):
    return ",".join(str(j) for j in members)
