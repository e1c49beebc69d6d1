"""The cutting planes' part of a ReLU-splitting search (:class:`CutSearch`, a base of
:class:`~crown_cli.verification.bab.relu_split._Search`): single-neuron cuts separated after
each batch, decision sets inferred from proven domains and proven as cuts, children inside a
proven set. The cuts themselves and their bound are :mod:`crown_cli.verification.bab.cuts`.
"""
from __future__ import annotations

import time

import numpy as np

from crown_cli.verification.bab import cuts as _cuts
from crown_cli.verification.bab.cuts import (dense_multipliers, merge_new_cuts,
                                              relaxed_point_state, sparse_multipliers,
                                              weaker_sets)
from crown_cli.verification.bab.domains import Domains


class CutSearch:
    """The search's cut methods; the search holds ``bd``, ``o`` (its options), ``stats``
    (with "cuts" when it uses cuts), ``deadline``, ``interm``, ``max_width``, ``cut_sets``
    and :meth:`assess`."""

    def _neuron_cuts(self, state, kids: Domains, score, proven, row=None):
        """Single-neuron cuts most violated at the relaxed points of the batch's worst open
        domains (``cut_domains`` of them; :func:`separate_neuron_cuts`), ``neuron_cuts`` of
        them, added to the bounder's (``cut_point`` "cuts": at the points of the domains'
        bounds with their own cuts, ``row`` the batch's rows as :meth:`assess` returns them).
        Not past the deadline. Returns the domains that got cuts of their own
        (``domain_cuts``; none otherwise)."""
        openi = np.flatnonzero(~proven)
        if openi.size == 0 or time.monotonic() >= self.deadline:
            return openi[:0]
        N, B = state[1].shape[0], kids.split.shape[0]
        per = N // B
        worst = openi[np.argsort(score[openi], kind="stable")[:self.o.cut_domains]]
        bounds = None
        if self.interm:
            bounds = (np.repeat(kids.dl, per, axis=0), np.repeat(kids.du, per, axis=0))
        cuts = self.bd.cuts
        if not self.o.domain_cuts:  # the best over those domains, for every domain
            rows = (worst[:, None] * per + np.arange(per)[None, :]).ravel()
            found = _cuts.separate_neuron_cuts(self.bd, state, bounds, self.o.neuron_cuts,
                                               rows)
            for p, kz, e, key in found:
                self.stats["cuts"] += int(cuts.add_general(p, kz, e, key))
            return openi[:0]
        at = np.arange(N // per)  # where each domain's rows are in the separation's tape
        if self.o.cut_point == "cuts":  # the relaxed point of the bound with the cuts
            cut_state = self._cut_point_state(kids, worst, row, per)
            if cut_state is not None:
                state, at = cut_state, np.zeros(B, np.int64)
                at[worst] = np.arange(worst.size)
                if bounds is not None:
                    bounds = (np.repeat(kids.dl[worst], per, axis=0),
                              np.repeat(kids.du[worst], per, axis=0))
        # over the cap the pool drops first the cuts no open domain holds
        cuts.in_use = lambda: self._cuts_in_use(kids)
        try:
            got = [i for i in worst if self._own_cuts(state, bounds, kids, i, at[i] * per, per)]
        finally:
            cuts.in_use = None
        return np.array(got, np.int64)

    def _own_cuts(self, state, bounds, kids: Domains, i, r0, per) -> bool:
        """Cuts separated at the rows ``r0 .. r0 + per - 1`` of ``state`` join the pool and
        domain ``i``'s own set; whether any was found (none past the deadline)."""
        if time.monotonic() >= self.deadline:
            return False
        cuts = self.bd.cuts
        found = _cuts.separate_neuron_cuts(self.bd, state, bounds, self.o.neuron_cuts,
                                           r0 + np.arange(per))
        self._adding_from = cuts.serial  # this domain's new cuts: not dropped yet
        for p, kz, e, key in found:
            self.stats["cuts"] += int(cuts.add_general(p, kz, e, key))
        new = [cuts.serial_of(key) for *_, key in found]
        merge_new_cuts(kids.mu_val[i], kids.mu_ser[i], [s for s in new if s is not None])
        return bool(found)

    def _cuts_in_use(self, kids: Domains):
        """The serials of the cuts the open domains and the batch ``kids`` hold, and of
        those being added (from ``_adding_from``)."""
        pool = self.pool
        live = np.array([slot for _, slot in pool.heap], np.int64)
        held = [pool.mu_ser[live].ravel(), kids.mu_ser.ravel(),
                np.arange(self._adding_from, self.bd.cuts.serial)]
        return np.unique(np.concatenate(held))

    def _cut_point_state(self, kids: Domains, idx, row, per):
        """The separation's tape at the relaxed points of the domains ``idx`` bounded with
        their own cuts (:func:`relaxed_point_state`; ``per`` rows each: every row, or the
        one of ``row``), or None when they hold no cut."""
        bd = self.bd
        d = kids.take(idx)
        sub, _, mu, _ = self._batch_cuts(d)
        if len(sub) == 0:
            return None
        a, be = d.alpha.astype(np.float32), d.beta.astype(np.float32)
        rows = None
        if per != bd.m:  # one row per domain
            ar = np.arange(idx.size)
            rows = np.asarray(row)[idx]
            a, be, mu = a[ar, rows][:, None], be[ar, rows][:, None], mu[ar, rows][:, None]
        cuts = bd.cuts
        bd.cuts = sub
        try:
            _, st = bd.evaluate(d.split, a, be, np.float32, keep=True, rows=rows, mu=mu,
                                bounds=(d.dl, d.du) if self.interm else None)
        finally:
            bd.cuts = cuts
        return relaxed_point_state(bd, st, d.split)

    def _cut_round(self, kids: Domains, idx, score, proven, chords, before=None):
        """The domains ``idx`` of the batch bounded again, with the cuts just separated at
        them: the proven ones marked in ``proven``, the others' ``score``, slopes and
        multipliers updated (all in place) where the bound improved; where it did not, each
        keeps its cut set as ``before`` (the batch's ``(mu_val, mu_ser)`` before the new cuts
        joined it), so that its children do not inherit a worse one. A counterexample found
        on the way, or None."""
        sub = kids.take(idx)
        ch = None if chords is None else (chords[0][idx], chords[1][idx])
        sc, pr, _, _, xv = self._assess_own_cuts(sub, self.iters, ch, None, count=False)
        if xv is not None:
            return xv
        self.stats["cut_rounds"] += idx.size
        up = pr | (sc > score[idx]) if before is not None else np.ones(idx.size, bool)
        self.stats["cut_kept"] += int(np.sum(~up))
        j, u = idx[up], np.flatnonzero(up)
        kids.alpha[j], kids.beta[j], kids.done[j] = sub.alpha[u], sub.beta[u], sub.done[u]
        kids.mu_val[j], kids.mu_ser[j] = sub.mu_val[u], sub.mu_ser[u]
        if before is not None:
            n = idx[~up]
            kids.mu_val[n], kids.mu_ser[n] = before[0][n], before[1][n]
        proven[idx] |= pr
        score[idx] = np.maximum(score[idx], sc)
        return None

    def _assess_own_cuts(self, d: Domains, iters, chords, nodes, count=True):
        """:meth:`assess` of the domains ``d`` with their cuts (:meth:`_batch_cuts`; the
        bounder holds only those meanwhile); with ``domain_cuts`` the multipliers they end
        at kept in ``d.mu_val``/``mu_ser``. Returns what :meth:`assess` does."""
        cuts = self.bd.cuts
        sub, serials, mu, mask = self._batch_cuts(d)
        self.bd.cuts = sub
        try:
            out = self.assess(d.split, d.alpha, d.beta, d.done, iters, chords, nodes,
                              (d.dl, d.du) if self.interm else None, count=count,
                              start=(mu, mask))
        finally:
            self.bd.cuts = cuts
        if self.o.domain_cuts:
            d.mu_val, d.mu_ser = sparse_multipliers(mu, serials, self.o.domain_cuts, mask)
        return out

    def _batch_cuts(self, kids: Domains):
        """The cuts a batch is bounded with: (those cuts, their serials, the multipliers they
        start from (B, m, nC), the mask of those that move or None). With ``domain_cuts``
        each domain's own (kept in ``kids.mu_val``/``mu_ser``), else every held cut from 0."""
        cuts = self.bd.cuts
        B, m = kids.split.shape[0], self.bd.m
        if not self.o.domain_cuts:
            return (cuts, cuts.held(), np.zeros((B, m, len(cuts)), np.float32), None)
        ser = kids.mu_ser
        serials = np.unique(ser[np.isin(ser, cuts.held())]) if ser is not None else \
            np.zeros(0, np.int64)
        mu, mask = dense_multipliers(serials, kids.mu_val, ser, B, m)
        return cuts.subset(cuts.positions(serials)), serials, mu, mask

    def bd_cuts(self):
        """The bounder's cuts when this search infers them, else None."""
        return getattr(self.bd, "cuts", None) if "cuts" in self.stats else None

    def _propose_cuts(self, kids: Domains, proven):
        """From each domain of the batch proven by its bound: the decisions its rows' split
        multipliers used, queued to be proven as a cut of their own (:mod:`.cuts`)."""
        for i in np.flatnonzero(proven & (kids.depth >= 2)):
            for cand in weaker_sets(kids.split[i], np.max(kids.beta[i], axis=0)):
                self.cut_sets.append(cand)
        if len(self.cut_sets) > 8 * self.o.cut_checks:  # the newest kept
            del self.cut_sets[:len(self.cut_sets) - 8 * self.o.cut_checks]

    def _check_cut_sets(self):
        """Up to ``cut_checks`` queued decision sets bounded as domains of their own (with
        their hidden-layer bounds when the search recomputes them); each proven one becomes a
        cut. A counterexample found on the way, or None."""
        bd, stats = self.bd, self.stats
        sets = np.stack(self.cut_sets[-self.o.cut_checks:])
        del self.cut_sets[-self.o.cut_checks:]
        sets = sets[~bd.cuts.contains(sets)]
        B = sets.shape[0]
        if B == 0:
            return None
        stats["cut_checks"] += B
        m, nU = bd.m, bd.nU
        alpha = np.broadcast_to(bd.initial_alpha(), (B, m, nU)).copy()
        beta = np.zeros((B, m, nU), np.float32)
        done = np.zeros((B, max(1, bd.gstart.size)), bool)
        chords = bounds = None
        proven = np.zeros(B, bool)
        given = sets.copy()  # tighten adds the decisions the sets imply; the cut is the set's
        if self.interm:
            rl, ru = bd.root_domain_bounds()
            dl, du = np.tile(rl, (B, 1)), np.tile(ru, (B, 1))
            sets, dl, du, proven = bd.tighten(sets, dl, du, np.zeros(B, np.int64),
                                              deadline=self.deadline, max_width=self.max_width)
            chords, bounds = bd.chords(dl, du), (dl, du)
        open_ = np.flatnonzero(~proven)
        if open_.size:
            _, pr, _, _, xv = self.assess(
                sets[open_], alpha[open_], beta[open_], done[open_], self.iters,
                None if chords is None else (chords[0][open_], chords[1][open_]), None,
                None if bounds is None else (bounds[0][open_], bounds[1][open_]), count=False)
            if xv is not None:
                return xv
            proven[open_] = pr
        for s in given[proven]:
            stats["cuts"] += int(bd.cuts.add(s))
        return None

    def _inside_cuts(self, kids: Domains) -> Domains:
        """The children that hold every decision of a cut are inside a proven domain: counted
        proven and dropped."""
        cuts = self.bd_cuts()
        if cuts is None or len(cuts) == 0:
            return kids
        inside = cuts.contains(kids.split)
        if not inside.any():
            return kids
        s = self.stats
        s["proven"] += int(inside.sum())
        s["cut_pruned"] += int(inside.sum())
        s["closed"] += float(np.sum(0.5 ** kids.depth[inside]))
        return kids.take(~inside)
