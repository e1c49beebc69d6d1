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
from typing import Callable, Dict, List, Sequence

import numpy as np

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


def race(runs: Sequence[Run], n_cases: int, proven_before: int, margins, deadline: float,
         done, outputs, cases, *, kinds: Dict[str, str], log=None, status=None,
         first_slice: float = 1.0, max_slice: float = 10.0, join_after: float = 0.0,
         worst=None):
    """Run ``runs`` until every case they cover is proven (unsat), one finds a verified
    counterexample (sat), the deadline passes (timeout), or every run still needed has
    ended without deciding (unknown).

    Strategies start in the order of their first run; a later one joins once ``join_after``
    seconds have passed, unless the running ones have proven :data:`JOIN_UNLESS` of their
    space by then (checked again every turn) and :data:`JOIN_SLACK` times the finish that
    projects (elapsed time over the share, at the rate so far) has not passed. Each turn
    gives one run a slice (growing from ``first_slice`` by half per turn of its strategy, up
    to ``max_slice``), round robin within its strategy, the strategy picked as the one furthest behind its :func:`shares` (a strategy still in its
    probe first). A case proven by any run is proven; runs whose cases are all proven stop.

    ``done(result, stage, margin, proven, **kw)`` builds the verdict; ``outputs(x)`` the
    float64 outputs; ``kinds``: the log's unit per strategy ("boxes", "domains");
    ``worst(margins)``: the bound stages' worst margin (reported when no run has a bound)."""
    t0 = time.monotonic()
    order = []
    for r in runs:
        if r.strategy not in order:
            order.append(r.strategy)
    proven = set()
    joined = order[:1]
    peak = [0]
    unknown = False
    notes = []  # why searches ended unknown (BabResult.note), for the verdict
    slice_s = {s: first_slice for s in order}
    turn = {s: 0 for s in order}
    exempt_until = None  # the projected finish that keeps the next strategy out

    def label(members):
        return ",".join(str(j) for j in members)

    def n_proven():
        return proven_before + len(proven)

    def totals():
        return sum(r.stat[0] for r in runs)

    def progress_for(r: Run):
        def update(domains, open_, worst_):
            r.stat = [domains, open_, worst_]
            going = [v.stat for v in runs if not v.over]
            peak[0] = max(peak[0], sum(v[1] for v in going))
            if status is not None:
                status.update(domains, sum(v[1] for v in going), min(v[2] for v in going))
        return update

    def open_margin():
        """Over the open cases, the worst of each case's best bound among its runs (runs of
        several strategies bound the same case), else the bound stages' worst margin."""
        per_case = {}
        for r in runs:
            if np.isfinite(r.stat[2]):
                for j in r.members:
                    if j not in proven:
                        per_case[j] = max(per_case.get(j, -np.inf), r.stat[2])
        return min(per_case.values()) if per_case else worst(margins)

    def finish(result, **kw):
        return done(result, "bab", kw.pop("margin", None), n_proven(), domains=totals(),
                    peak_domains=peak[0], **kw)

    while True:
        for r in runs:  # runs whose cases another run proved
            if not r.over and all(j in proven for j in r.members):
                r.over = True
                r.stat[1] = 0
        live = [r for r in runs if not r.over]
        if not live:
            break
        now = time.monotonic()
        if now >= deadline:
            return finish("timeout", margin=open_margin())
        if len(joined) < len(order) and now - t0 >= join_after:
            # the next strategy joins unless the ones running are about to finish: at their
            # rate so far (half their space proven or more) they need less time than they had
            mine = [r.closed for r in runs if r.strategy in joined]
            closed = float(np.mean(mine)) if mine else 0.0
            if closed >= JOIN_UNLESS and exempt_until is None:
                exempt_until = t0 + JOIN_SLACK * (now - t0) / closed
            if closed < JOIN_UNLESS or now >= exempt_until:
                joined.append(order[len(joined)])
                exempt_until = None
        ready = [s for s in joined if any(r.strategy == s for r in live)]
        if not ready:  # only strategies that have not joined yet are left
            ready = [s for s in order if any(r.strategy == s for r in live)][:1]
        spent = {s: sum(r.spent for r in runs if r.strategy == s) for s in ready}
        probing = [s for s in ready if spent[s] < PROBE_S] if len(ready) > 1 else []
        if probing:
            s = probing[0]
        else:
            share = shares([r for r in runs if r.strategy in ready], ready)
            total = sum(spent.values())
            s = max(ready, key=lambda k: share[k] * total - spent[k])
        mine = [r for r in live if r.strategy == s]
        r = mine[turn[s] % len(mine)]
        turn[s] += 1
        if status is not None:
            status.begin(s, kinds.get(s, "domains"), label(r.members), n_proven(), n_cases,
                         totals() - r.stat[0])
        t1 = time.monotonic()
        stop = min(deadline, t1 + (PROBE_S if s in probing else slice_s[s]))
        if s not in probing:
            slice_s[s] = min(max_slice, 1.5 * slice_s[s])
        res = None
        if r.gen is None:
            r.gen = r.start(progress_for(r))
        try:
            while time.monotonic() < stop:
                share_ = next(r.gen)
                if share_ is not None:
                    r.closed = float(share_)
        except StopIteration as end:
            res = end.value
        r.spent += time.monotonic() - t1
        if res is None:
            continue
        r.over = True
        r.stat = [res.domains, 0, np.inf]
        peak[0] = max(peak[0], res.peak_open)
        if log is not None:
            log(f"bab ({s}): case {label(r.members)}: {res.verdict} after {res.domains} "
                f"{kinds.get(s, 'domains')} (peak {res.peak_open} open)")
        if res.verdict == "sat":
            y = outputs(res.x)
            hit = [j for j in r.members if np.all(cases[j].A @ y <= cases[j].b)]
            return finish("sat", margin=worst(margins), x=res.x, y=y,
                          case=hit[0] if hit else r.members[0])
        if res.verdict == "unsat":
            r.closed = 1.0
            for j in r.members:
                if j not in proven:
                    margins[j] = max(0.0, res.worst_bound) \
                        if np.isfinite(res.worst_bound) else 0.0
                    proven.add(j)
        elif res.verdict == "timeout":
            r.stat[2] = res.worst_bound
            return finish("timeout", margin=open_margin())
        else:
            r.stat[2] = res.worst_bound
            unknown = True
            if res.note and f"{s}: {res.note}" not in notes:
                notes.append(f"{s}: {res.note}")
    covered = set(j for r in runs for j in r.members)
    if unknown and not covered <= proven:
        return finish("unknown", margin=open_margin(), **({"note": "; ".join(notes)}
                                                         if notes else {}))
    return finish("unsat")
