"""Per-domain hidden-layer bounds of ReLU splitting (:class:`DomainBounds`, a part of
:class:`~crown_cli.verification.bab.bounder.Bounder`).

A child's bounds of every layer after its new split are recomputed by float64 CROWN
back-substitution with the domain's split neurons exact and its other unstable neurons
relaxed by the domain's own bounds, intersected with the parent's (:meth:`tighten`); on
deeper networks each row is first optimised (its lower slopes and the split constraints'
multipliers, a few Adam steps from a running warm start, :meth:`tighten_opt`). A neuron they
prove stable is fixed like a split; a domain whose bounds cross is empty, hence proven.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from crown_cli.engine.batch_steps import Lines, Rows, relax
from crown_cli.engine.input_sets import box_lower
from crown_cli.engine.kernels import relu_split_kernels as _kern
from crown_cli.graph.ops import sparse_enough
from crown_cli.verification.bab.domains import ReluSplitProblem, tighten_layers
from crown_cli.verification.bab.optimise import _optimise_rows


@dataclass(frozen=True)
class TightenSettings:
    """The settings of :meth:`DomainBounds.tighten_opt`."""

    iters: int = 3  # projected Adam steps per row
    lr_alpha: float = 0.3  # step sizes of the slopes and of the split multipliers
    lr_beta: float = 0.3
    max_bytes: float = 2.0 ** 27  # the rows optimised at once keep their state within this
    warm: float = 0.0  # in (0, 1]: rows start from a running mean moved by this much


class DomainBounds:
    """The per-domain hidden-layer bounds of a :class:`~crown_cli.verification.bab.bounder.Bounder` (its
    attributes: weights, root bounds, unstable columns, rounding weights)."""

    def root_domain_bounds(self):
        """The root bounds (l, u) of the unstable neurons, each (nU,) float64: a domain's
        bounds before any tightening."""
        if self.nU == 0:
            return np.zeros(0), np.zeros(0)
        return (np.concatenate([l[c] for (l, _), c in zip(self.bounds, self.ucols)]),
                np.concatenate([u[c] for (_, u), c in zip(self.bounds, self.ucols)]))

    def _interm_setup(self):
        """Per hidden layer j, the neurons whose activation is not identically 0 on the box
        (ReLU: root u > 0; leaky ReLU: all), and the weights, biases, stable slopes and
        rounding weights restricted to them (the others contribute exactly 0)."""
        if getattr(self, "_keep", None) is not None:
            return
        keep = []
        for l, u in self.bounds:
            keep.append(np.flatnonzero(u > 0.0) if self.leak == 0.0 else np.arange(l.size))
        self._keep = keep
        self._upos = [np.searchsorted(kp, c) for kp, c in zip(keep, self.ucols)]
        # rows of layer k over the kept neurons of layer k-1; steps through kept columns only
        self._Wrow = [None] + [np.ascontiguousarray(self.weights[k][:, keep[k - 1]])
                               for k in range(1, self.L)]
        self._Wstep = [np.ascontiguousarray(self.weights[0][keep[0]])] + [
            np.ascontiguousarray(self.weights[j][keep[j]][:, keep[j - 1]])
            for j in range(1, self.L)]

        for j, w in enumerate(self._Wstep):  # a lowered convolution: the zeros skipped
            if sparse_enough(w):
                import scipy.sparse as sps

                self._Wstep[j] = sps.csr_matrix(w)
        self._bk = [self.biases[j][kp] for j, kp in enumerate(keep)]
        self._ssk = [self.stable_slope[j][kp] for j, kp in enumerate(keep)]
        self._vk = [self.rw[j][0][kp] for j, kp in enumerate(keep)]

    def _rows_lower(self, k, dd, split, dl, du):
        """float64 lower bounds of ``z_kj`` and ``-z_kj`` (rows (n, 2R): first z, then -z)
        for the domains ``dd`` (n,) and layer k's R unstable neurons, over each domain (box
        and split constraints): CROWN back-substitution through layers k-1..0 with the split
        neurons fixed (identity / inactive slope), the others relaxed by the domain's bounds
        (chord above; below the row's root-optimised slope of ``layer_slopes``, else CROWN's
        adaptive one), widened like :meth:`evaluate` (final-sum allowance and per-step product
        rounding)."""
        n, R = dd.size, self.ucols[k].size
        neur = self.ucols[k]
        Wr = np.broadcast_to(self._Wrow[k][neur], (n, R, self._Wrow[k].shape[1]))
        br = np.broadcast_to(self.biases[k][neur], (n, R))
        rows = 2 * R
        isl = self.islopes[k]
        Lam = np.concatenate([Wr, -Wr], axis=1)
        const = np.concatenate([br, -br], axis=1).reshape(-1)
        acc = Rows(Lam, const, np.abs(const), np.zeros(n * rows))
        for j in range(k - 1, -1, -1):
            o0, o1 = self.offsets[j], self.offsets[j + 1]
            sp = split[dd, o0:o1]
            l, u = dl[dd, o0:o1], du[dd, o0:o1]
            cs, ct = self.chords(l, u)
            alo = None if isl is None else isl[:, o0:o1]
            Lam = acc.Lam
            if _kern() is not None:  # the fused step (relax and the sums; its twin below)
                D, dc, dm, st = _kern().interm_step64(
                    np.ascontiguousarray(Lam), self._ssk[j], self._upos[j],
                    np.ascontiguousarray(sp), np.ascontiguousarray(l), np.ascontiguousarray(u),
                    cs, ct, self.leak, self._bk[j], np.abs(self._bk[j]), self._vk[j],
                    float(self.rw[j][1]),
                    np.zeros((0, 0)) if alo is None else np.ascontiguousarray(alo))
                acc.add(dc, dm, st)
                acc.product(D, self._Wstep[j])
            else:
                fixed = np.where(sp > 0, 1.0, self.leak)
                free = sp == 0
                if alo is None:
                    s_lo = np.where(free, np.where(u >= -l, 1.0, self.leak), fixed)[:, None, :]
                else:
                    s_lo = np.where(free[:, None, :], alo[None, :, :], fixed[:, None, :])
                s_up = np.where(free, cs, fixed)[:, None, :]
                t_up = np.where(free, ct, 0.0)[:, None, :]
                D, icpt, _, _ = relax(Lam, Lines(self._upos[j], s_lo, s_up, t_up,
                                                 stable=self._ssk[j]))
                acc.step(D.reshape(n * rows, -1), icpt.reshape(n * rows, -1), self._bk[j],
                         self._Wstep[j], (self._vk[j], self.rw[j][1]))
            acc.Lam = acc.Lam.reshape(n, rows, -1)
        Lam, const, mag, steps = acc.Lam, acc.const, acc.mag, acc.charge
        out = box_lower(Lam.reshape(n * rows, -1), const, mag, steps, self.c, self.r,
                        self.net.fp_rtol)
        return out.reshape(n, rows)

    def tighten(self, split, dl, du, start, max_bytes: float = 2.0 ** 26, deadline=None,
                max_width=None):
        """Per-domain bounds of the unstable neurons after new splits.

        ``split`` (B, nU) int8, ``dl``, ``du`` (B, nU) float64 bounds valid on each domain
        (e.g. its parent's), ``start`` (B,): every layer after ``start[d]`` is recomputed for
        domain d (the shallowest layer whose splits changed). Layer by layer, the bounds of
        the domain's unstable neurons are computed by :meth:`_rows_lower` (float64, sound on
        the whole subdomain) and intersected with ``dl``, ``du``; a neuron they prove stable is
        fixed (split +1 / -1: exact there, and its sign condition holds on the domain), so
        later layers see it exact. A split neuron's bounds take its sign (l >= 0 active,
        u <= 0 inactive). Returns (split, dl, du, empty): ``empty`` (B,) marks domains with
        some l > u, i.e. no point of the box meets their split constraints. ``max_bytes``
        caps the temporaries (domains are processed in chunks). Past ``deadline`` (a
        ``time.monotonic()`` instant) the remaining chunks are skipped: their bounds stay the
        ones given (valid, only looser). ``max_width``: only hidden layers of at most this
        many neurons are recomputed (the others keep the bounds given)."""
        def layer(k, doms, split, dl, du):
            self._crown_layer(k, doms, split, dl, du, max_bytes, deadline)

        return self._tighten_layers(split, dl, du, start, layer, max_width)

    def _crown_layer(self, k, doms, split, dl, du, max_bytes, deadline, free_only=False):
        """:meth:`tighten`'s step of layer k: the bounds of its unstable neurons on the
        domains ``doms`` narrowed (in place) by :meth:`_rows_lower`. Every unstable neuron of
        the layer: the split ones' bounds (taking their sign) find domains whose splits
        contradict each other. ``free_only``: only the neurons of unknown sign on the domain
        (those a checker bounds by itself)."""
        self._interm_setup()
        widest = max([self.box.lo.size] + [kp.size for kp in self._keep])
        o0, R = self.offsets[k], self.ucols[k].size
        chunk = max(1, int(max_bytes // (8 * 8 * 2 * R * widest)))
        for c0 in range(0, doms.size, chunk):
            if deadline is not None and time.monotonic() >= deadline:
                break
            dd = doms[c0:c0 + chunk]
            low = self._rows_lower(k, dd, split, dl, du)
            rr, cc = dd[:, None], o0 + np.arange(R)[None, :]
            if free_only:
                known = split[rr, cc] != 0
                low[:, :R][known], low[:, R:][known] = -np.inf, -np.inf
            dl[rr, cc] = np.maximum(dl[rr, cc], low[:, :R])
            du[rr, cc] = np.minimum(du[rr, cc], -low[:, R:])

    def _tighten_layers(self, split, dl, du, start, layer, max_width=None):
        """The frame of :meth:`tighten` and :meth:`tighten_opt`
        (:func:`~crown_cli.verification.bab.domains.tighten_layers`), hidden layers wider
        than ``max_width`` (if given) skipped. Returns (split, dl, du, empty)."""
        def reach(k, start):
            wide = max_width is not None and self.weights[k].shape[0] > max_width
            return None if wide else True

        return tighten_layers(split, dl, du, start, self.offsets, layer, reach)

    def _sub(self, k):
        """The :class:`Bounder` of the rows ``z_kj`` and ``-z_kj`` of hidden layer k's R
        unstable neurons (first the R rows z, then -z) over the network's first k hidden
        layers, with the same root bounds: its unstable neurons are this one's first
        ``offsets[k]``, numbered alike. Cached."""
        cache = self._subs
        if k not in cache:
            cols = self.ucols[k]
            E = np.zeros((cols.size, self.weights[k].shape[0]))
            E[np.arange(cols.size), cols] = 1.0
            cache[k] = type(self)(ReluSplitProblem(
                self.weights[:k + 1], self.biases[:k + 1], self.box.lo, self.box.hi,
                np.vstack([E, -E]), np.zeros(2 * cols.size), self.activation, self.leak,
                self.bounds[:k]))
        return cache[k]

    def tighten_opt(self, split, dl, du, start, deadline=None, max_width=None, record=None,
                    **settings):
        """:meth:`tighten` with optimised multipliers (beta-CROWN for the hidden layers), its
        ``settings`` the fields of :class:`TightenSettings` (keywords): the
        bounds of every layer k after ``start[d]`` come from ``iters`` projected Adam steps
        on each row ``z_kj`` / ``-z_kj`` (:meth:`_sub`) over its lower slopes (from
        ``layer_slopes``, else CROWN's) and multipliers beta >= 0 of the domain's split
        constraints ``s_i z_i >= 0`` in the layers before k. On deep domains these
        constraints narrow later layers far more than the split neurons' exact relaxation
        alone. Each bound is the float64 evaluation at the best iterate (sound on the
        subdomain for any slopes in [leak, 1] and any beta >= 0), intersected with ``dl``,
        ``du``. Only the rows that can change something are bounded: both of a neuron still
        free on the domain, and of one whose sign is known (split, or stable on the domain)
        the side that could contradict it (an empty domain). ``warm`` in (0, 1]: each row
        starts from this Bounder's running start of layer k instead (slopes, and beta per
        split sign), which after every chunk moves by ``warm`` towards the mean of what
        the chunk's entries of that row ended with (:func:`_blend`); any start is sound,
        only the float64 bound counts. ``lr_alpha`` 0: the slopes stay the layer slopes (or,
        without them, CROWN's adaptive ones at the domain's bounds). ``record(k, doms, rows,
        beta, alpha, free)``: each layer's bounds are first :meth:`tighten`'s (the rows a
        checker bounds by itself), then ``record`` is called with each row whose optimised
        bound narrowed them further: its domain, its row as ``rows`` above, its multipliers
        (n, offsets[k]) float64, each a float32, and its slopes (n, offsets[k]), each a
        float16 (the bound is evaluated at those), with the mask ``free`` of the neurons they
        act on (unsplit, of unknown sign on the domain).
        ``max_width`` and the return value (split, dl, du, empty) as :meth:`tighten`."""
        o = TightenSettings(**settings)
        iters, lr_alpha, lr_beta, warm = o.iters, o.lr_alpha, o.lr_beta, o.warm

        def layer(k, doms, split, dl, du):
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            sb, R = self._sub(k), o1 - o0
            if record is not None:  # first the rows a checker bounds by itself (step 1b)
                self._crown_layer(k, doms, split, dl, du, 2.0 ** 26, deadline, free_only=True)
            widest = max([self.box.lo.size] + [w.shape[0] for w in self.weights[:k]])
            # per row: alpha, beta, their moments and float64 copies, the tape
            per = 16 * 4 * max(o0, 1) + 8 * 3 * widest
            chunk = max(1, int(o.max_bytes // per))
            fixed = lr_alpha == 0.0
            a0 = self.islopes[k] if self.islopes[k] is not None else \
                None if fixed else np.broadcast_to(sb.initial_alpha(), (2 * R, o0))
            sg = split[doms, o0:o1].astype(np.int64)
            sg = np.where(sg != 0, sg, np.where(dl[doms, o0:o1] >= 0.0, 1,
                                                np.where(du[doms, o0:o1] <= 0.0, -1, 0)))
            pd, pj = np.nonzero(np.concatenate([sg <= 0, sg >= 0], axis=1))
            tab = None
            if warm > 0.0:
                tab = self._warm.get(k)
                if tab is None:
                    tab = self._warm[k] = (None if a0 is None else np.array(a0, np.float32),
                                           np.zeros((2, 2 * R, o0), np.float32))
            for c0 in range(0, pd.size, chunk):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                dom = doms[pd[c0:c0 + chunk]]
                rows = pj[c0:c0 + chunk]
                sp = np.ascontiguousarray(split[dom, :o0])
                ch = self.chords(dl[dom, :o0], du[dom, :o0])
                if a0 is not None:
                    start_a = a0[rows] if tab is None or fixed else tab[0][rows]
                else:  # CROWN's adaptive slopes at the domain's bounds (the checker's default)
                    start_a = np.where(du[dom, :o0] >= -dl[dom, :o0], 1.0, self.leak)
                b0 = None if tab is None else np.where(sp > 0, tab[1][0][rows], tab[1][1][rows])
                al, be = _optimise_rows(sb, sp, start_a, rows, ch, iters, lr_alpha, lr_beta,
                                        deadline, beta0=b0)
                if record is not None:  # the slopes a certificate holds
                    al = al.astype(np.float16).astype(np.float64)
                if tab is not None:
                    # running per-row means of the optimised multipliers: the next
                    # domains' starting point (any start is sound: only the bound counts)
                    if not fixed:
                        _blend(tab[0], rows, al, None, warm)
                    _blend(tab[1][0], rows, be, sp > 0, warm)
                    _blend(tab[1][1], rows, be, sp < 0, warm)
                low = sb.evaluate(sp, al[:, None], be[:, None], np.float64, chords=ch,
                                  rows=rows)[:, 0]
                lower = rows < R
                dlo, clo = dom[lower], o0 + rows[lower]
                dup, cup = dom[~lower], o0 + rows[~lower] - R
                if record is not None:
                    gain = np.empty(rows.size, bool)
                    gain[lower] = low[lower] > dl[dlo, clo]
                    gain[~lower] = -low[~lower] < du[dup, cup]
                    if gain.any():
                        # the slopes of the neurons the row relaxes (unsplit, of unknown sign)
                        free = (sp[gain] == 0) & (dl[dom[gain], :o0] < 0.0) \
                            & (du[dom[gain], :o0] > 0.0)
                        record(k, dom[gain], rows[gain], be[gain], al[gain], free)
                dl[dlo, clo] = np.maximum(dl[dlo, clo], low[lower])
                du[dup, cup] = np.minimum(du[dup, cup], -low[~lower])

        return self._tighten_layers(split, dl, du, start, layer, max_width)


def _blend(tab, rows, X, mask, w):
    """``tab[r] <- (1 - w) tab[r] + w mean_i X[i]`` over the entries i with ``rows[i] == r``
    (elementwise, only over the entries where ``mask`` holds; entries no ``mask`` covers
    keep their value), in place."""
    order = np.argsort(rows, kind="stable")
    r = rows[order]
    first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    Xs = X[order] if mask is None else (X * mask)[order]
    tot = np.add.reduceat(Xs, first, axis=0)
    cnt = np.diff(np.r_[first, r.size])[:, None] if mask is None else \
        np.add.reduceat(mask[order].astype(np.float64), first, axis=0)
    u = r[first]
    has = cnt > 0
    cur = tab[u]
    new = (1 - w) * cur + w * (tot / np.where(has, cnt, 1))
    tab[u] = np.where(has, new, cur)
