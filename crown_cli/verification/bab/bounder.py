"""The bounds of ReLU-split subdomains of one box: :class:`Bounder`.

A batch of domains, each a set of split decisions with its own lower slopes alpha, split
multipliers beta and (optionally) its own hidden-layer bounds, is bounded in one pass per layer
with a leading (domain x row) axis: float32 for the optimiser's steering (numba kernels of
:mod:`crown_cli.engine.kernels.relu_split`, or the numpy code here), float64 with the rounding
charges of :mod:`crown_cli.engine.rounding` for anything that proves. The per-domain
hidden-layer bounds are the :class:`~crown_cli.verification.bab.domain_bounds.DomainBounds`
part. The search that uses it is :mod:`crown_cli.verification.bab.relu_split`.
"""
from __future__ import annotations

import math

import numpy as np

from crown_cli.activations import default_alpha, supporting
from crown_cli.engine.dense_crown import Network, hidden_layer_bounds
from crown_cli.engine.batch_steps import Lines, Rows, relax
from crown_cli.engine.input_sets import Box, box_lower, input_abs_bound
from crown_cli.engine.kernels import relu_split_kernels as _kern
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.engine.rounding import (FP_RTOL, U64, margin_rows_rounding, rounding_weights,
                                      steering_quiet)
from crown_cli.verification.bab.cuts import evaluate_cuts, gradient_cuts
from crown_cli.graph.ops import sparse_enough
from crown_cli.verification.bab.domain_bounds import DomainBounds
from crown_cli.verification.bab.domains import CaseRows, ReluSplitProblem
from crown_cli.verification.outcome import violations

# a layer's products skip its dead neurons (Bounder._live_rows) when at most this share of
# its neurons is alive (oval21's CIFAR networks: about 40% alive on their first two layers)
LIVE_MAX_SHARE = 0.9


class _Relax:
    __slots__ = ("aU", "bU", "aL", "bL")

    def __init__(self, aU, bU, aL, bL):
        self.aU, self.bU, self.aL, self.bL = aU, bU, aL, bL


class Bounder(DomainBounds, CaseRows):
    """Batched bounds of the rows ``A f(x) - b_up`` on ReLU-split subdomains of one box.

    Unstable neurons (l < 0 < u at the root) are numbered globally 0..n_unstable-1 in layer
    order; a batch gives per domain ``split`` (B, nU) int8 in {-1, 0, +1} and per (domain,
    row) ``alpha``, ``beta`` (B, m, nU).

    The :class:`ReluSplitProblem` gives the network, the box and the rows. Its
    ``layer_bounds``: the hidden layers' (l, u), valid on the box (default: CROWN's, from
    ``crown.hidden_layer_bounds``; :func:`root_layer_bounds` gives tighter ones).

    ``groups`` (m,): the case of each row, rows of a case adjacent (default: one case). The
    unsafe set is the union over cases of ``{A_g f(x) <= b_g}`` (each a conjunction): a domain
    is proven when every case has a row whose lower bound is above 0 (:meth:`score` > 0).

    ``layer_slopes``: lower slopes for the per-domain hidden-layer bounds of :meth:`tighten`,
    as :func:`root_layer_bounds` returns them with ``slopes`` (given with its bounds): each
    layer's neuron keeps the slopes optimised for it at the root instead of CROWN's adaptive
    ones (any slope in [leak, 1] is a valid lower bound of an unstable neuron).
    """

    exact = True  # a fully split domain is affine (:meth:`affine`)
    tightens = True  # per-domain hidden-layer bounds (:meth:`tighten`)

    def __init__(self, problem: ReluSplitProblem):
        self._network(problem.weights, problem.biases, problem.activation, problem.leak)
        self.box = Box(problem.lo, problem.hi)
        self._rows(problem.A, problem.b, problem.groups)
        relax = self._root_bounds(problem.layer_bounds)
        self._unstable(relax)
        self._root_slopes(problem.layer_slopes)
        self.layer_slopes = problem.layer_slopes  # as given (a certificate's layer slopes)
        self._subs = {}  # per hidden layer k: :meth:`_sub`'s Bounder
        self._warm = {}  # per hidden layer k: tighten_opt's running start (alpha, beta)
        self.layer_of = np.zeros(self.nU, dtype=np.int64)
        for k in range(self.L):
            self.layer_of[self.offsets[k]:self.offsets[k + 1]] = k
        self._products()
        self._rounding_charges()
        self.cuts = None  # cuts.Cuts the search infers (ReLU only), used where mu is given

    def _network(self, weights, biases, activation, leak):
        """The weights (float64), the activation and its slope (0 for ReLU)."""
        if activation not in supporting("bab"):
            raise ValueError(f"relu_split: activation must be one of {', '.join(supporting('bab'))}")
        self.weights = [np.ascontiguousarray(w, dtype=np.float64) for w in weights]
        self.biases = [np.ascontiguousarray(v, dtype=np.float64) for v in biases]
        self.activation = activation
        if activation == "relu":
            leak = 0.0
        elif leak is None:
            leak = default_alpha("leaky_relu")
        leak = float(leak)
        if not 0.0 <= leak <= 1.0:
            raise ValueError("relu_split: leaky ReLU slope must lie in [0, 1]")
        self.leak = leak
        self.net = Network(self.weights, self.biases)

    def _root_bounds(self, layer_bounds):
        """The hidden layers' root bounds (given, else CROWN's); returns their relaxations."""
        relax_fn = get_relaxation(self.activation, "crown",
                                  None if self.activation == "relu" else self.leak)
        self.relax_fn = relax_fn
        self.L = self.net.num_hidden
        if layer_bounds is not None:
            self.bounds = [(np.asarray(l, np.float64), np.asarray(u, np.float64))
                           for l, u in layer_bounds]
            relax = [_Relax(*relax_fn(l, u)) for l, u in self.bounds]
        elif self.L:
            self.bounds, relax = hidden_layer_bounds(self.net, *self.box.args(), relax_fn)
        else:
            self.bounds, relax = [], []
        if len(self.bounds) != self.L:
            raise ValueError("layer_bounds: one (l, u) per hidden layer")
        return relax

    def _unstable(self, relax):
        """Per hidden layer: slope of stable neurons (0 on unstable ones), unstable columns,
        their chord slope/intercept and CROWN's lower slope (the initial alpha); the global
        numbering of the unstable neurons (``offsets``, ``nU``)."""
        self.stable_slope, self.ucols, self.chord_s, self.chord_t, self.alpha0 = [], [], [], [], []
        self.offsets = [0]
        for (l, u), r in zip(self.bounds, relax):
            unst = (l < 0.0) & (u > 0.0)
            cols = np.flatnonzero(unst)
            ss = np.where(unst, 0.0, r.aL)
            self.stable_slope.append(ss)
            self.ucols.append(cols)
            self.chord_s.append(r.aU[cols].copy())
            self.chord_t.append(r.bU[cols].copy())
            self.alpha0.append(r.aL[cols].copy())
            self.offsets.append(self.offsets[-1] + cols.size)
        self.nU = self.offsets[-1]

    def _root_slopes(self, layer_slopes):
        """Per hidden layer k >= 1: (2 R_k, offsets[k]) lower slopes of the rows z_j, -z_j of
        its unstable neurons over the unstable neurons before it, or None (adaptive)."""
        self.islopes = [None] * self.L
        for k, entry in enumerate(layer_slopes or ()):
            if entry is None or k == 0 or k >= self.L or self.ucols[k].size == 0:
                continue
            neur, a = np.asarray(entry[0]), np.asarray(entry[1], np.float64)
            pos = np.searchsorted(neur, self.ucols[k])
            if (a.shape != (2 * neur.size, self.offsets[k]) or np.any(pos >= neur.size)
                    or np.any(neur[np.minimum(pos, neur.size - 1)] != self.ucols[k])):
                raise ValueError(f"layer_slopes: layer {k} does not match the layer bounds")
            self.islopes[k] = np.ascontiguousarray(
                np.clip(np.concatenate([a[pos], a[neur.size + pos]]), self.leak, 1.0))

    def _products(self):
        """The weights as the products take them: float32 copies for the optimisation,
        mostly-zero ones as CSR matrices, the last layer folded into the rows."""
        self.W32 = [w.astype(np.float32) for w in self.weights]
        self.WT32 = [np.ascontiguousarray(w.T.astype(np.float32)) for w in self.weights]
        self.b32 = [v.astype(np.float32) for v in self.biases]
        self.ss32 = [s.astype(np.float32) for s in self.stable_slope]
        # the weights as the rows multiply them: mostly-zero ones (a convolution lowered to a
        # dense matrix by crown_cli.graph.lower) as CSR matrices, the same products with the
        # zeros skipped; a sum of fewer terms is within the dense sum's rounding charge
        self.Wmul, self.W32mul = list(self.weights), list(self.W32)
        self.WTmul, self.WT32mul = [w.T for w in self.weights], list(self.WT32)
        for k, w in enumerate(self.weights):
            if sparse_enough(w):
                import scipy.sparse as sps

                self.Wmul[k], self.W32mul[k] = sps.csr_matrix(w), sps.csr_matrix(self.W32[k])
                self.WTmul[k] = sps.csr_matrix(w.T)
                self.WT32mul[k] = sps.csr_matrix(self.WT32[k])
        self._live_rows()
        # the last layer folded into the rows (as crown.margin_lower_bound does)
        self.Lam_top = self.A @ self.weights[-1]
        self.const_top = self.A @ self.biases[-1] - self.b_up
        self.mag_top = np.abs(self.A) @ np.abs(self.biases[-1]) + np.abs(self.b_up)
        self.c = self.box.center
        self.r = self.box.radius
        self.c32, self.r32 = self.c.astype(np.float32), self.r.astype(np.float32)

    def _live_rows(self):
        """Per hidden layer, the neurons that are not dead (inactive on the whole box: stable
        slope 0 and not unstable), or None (all, or too few dead to pay): a dead neuron's
        entries of every row's D are exact zeros, so the products skip its row of W_k (the
        sums keep their other terms in order: the same values) and the forward products of
        the gradient its column (``live``, ``Wrow``/``W32row``, ``WTrow``/``WT32row``: the CSR
        weights restricted to them)."""
        import scipy.sparse as sps

        L = self.L
        self.live = [None] * L
        self.Wrow, self.W32row = list(self.Wmul[:L]), list(self.W32mul[:L])
        self.WTrow, self.WT32row = list(self.WTmul[:L]), list(self.WT32mul[:L])
        for k in range(L):
            alive = self.stable_slope[k] != 0.0
            alive[self.ucols[k]] = True
            if not sps.issparse(self.Wmul[k]) or alive.mean() > LIVE_MAX_SHARE:
                continue
            idx = np.flatnonzero(alive)
            self.live[k] = idx
            self.Wrow[k], self.W32row[k] = self.Wmul[k][idx], self.W32mul[k][idx]
            self.WTrow[k] = self.Wrow[k].T.tocsr()
            self.WT32row[k] = self.W32row[k].T.tocsr()

    def back_step(self, rows, k, D, icpt, f64, rounding=None, **kw):
        """``rows.step`` through hidden layer k (its bias and weights; the product skips the
        dead neurons' rows)."""
        bias = self.biases[k] if f64 else self.b32[k]
        W = (self.Wrow if f64 else self.W32row)[k]
        rows.step(D, icpt, bias, W, rounding, live=self.live[k], **kw)

    def forward_grad(self, G, k, f64):
        """``G @ W_k^T + b_k`` (the gradient's forward product into hidden layer k), 0 on the
        dead neurons (whose stable slope 0 zeroes them anyway)."""
        WT = (self.WTrow if f64 else self.WT32row)[k]
        bias = self.biases[k] if f64 else self.b32[k]
        live = self.live[k]
        if live is None:
            return G @ WT + bias
        gD = np.zeros((G.shape[0], bias.size), np.result_type(G.dtype, bias.dtype))
        gD[:, live] = G @ WT + bias[live]
        return gD

    def _rounding_charges(self):
        """The float64 rounding charges of the products (see :meth:`evaluate`)."""
        # float64 rounding charges, as crown.back_substitute applies them: per hidden layer k
        # the weights (v_k, t_k) of the step through it (rounding_weights, unit 2**-53)
        # from the layer's root interval (a split only narrows it on its subdomain) and the
        # previous layer's |a| bound (|relu(z)|, |leaky(z)| <= |z|; the input set's for k = 0),
        # and the rounding of A @ W[-1], A @ b[-1] as they act on the last layer
        self.rw = []
        a_prev = input_abs_bound(*self.box.args())
        for k, (l, u) in enumerate(self.bounds):
            Wa = self.net.abs_row_sums(k) * (float(np.max(a_prev)) if a_prev.size else 0.0)
            self.rw.append(rounding_weights(self.net, k, a_prev, l, u, Wa, unit=U64))
            a_prev = np.maximum(np.abs(l), np.abs(u))
        # split-inactive neurons' products Lu * leak round unless leak is 0 or a power of two:
        # their |z| bound over the box (see evaluate), per unstable column
        self.split_z = None
        if self.leak != 0.0 and math.frexp(self.leak)[0] != 0.5:
            self.split_z = [np.maximum(np.abs(l), np.abs(u))[c]
                            for (l, u), c in zip(self.bounds, self.ucols)]
        absA = np.abs(self.A)
        self.lam_err = margin_rows_rounding(
            self.A.shape[1], absA @ (self.net.abs_weights(self.L) @ a_prev),
            absA @ np.abs(self.biases[-1]))

    def initial_alpha(self) -> np.ndarray:
        """CROWN's lower slopes for every unstable neuron, (nU,) float32."""
        if self.nU == 0:
            return np.zeros(0, np.float32)
        return np.concatenate(self.alpha0).astype(np.float32)

    # ------------------------------------------------------------------ forward (bound)

    def root_chords(self):
        """The chords (slope, intercept) of the root bounds for every unstable neuron, each
        (nU,) float64."""
        if self.nU == 0:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(self.chord_s), np.concatenate(self.chord_t)

    def chords(self, dl, du):
        """Upper relaxation lines of the unstable neurons from per-domain bounds ``dl``, ``du``
        (B, nU) float64: (slope, intercept), each (B, nU) float64, by the relaxation the root
        uses (sound in float64). Where a domain's bounds make a neuron stable the line is the
        stable side's (such neurons are split-fixed by :meth:`tighten`)."""
        dl = np.asarray(dl, np.float64)
        if dl.size == 0:
            return np.zeros(dl.shape), np.zeros(dl.shape)
        aU, bU, _, _ = self.relax_fn(np.ascontiguousarray(dl).ravel(),
                                     np.ascontiguousarray(du, dtype=np.float64).ravel())
        return aU.reshape(dl.shape), bU.reshape(dl.shape)

    def _chords_rows(self, chords, B, m, dt):
        """Per evaluated (domain, row): chord slope and intercept (B*m, nU) in dtype ``dt``."""
        if chords is None:
            cs, ct = self.root_chords()
            cs, ct = (np.broadcast_to(c, (B * m, self.nU)) for c in (cs, ct))
        else:
            cs, ct = chords
            if m > 1:
                cs, ct = np.repeat(cs, m, axis=0), np.repeat(ct, m, axis=0)
        return (np.ascontiguousarray(cs, dtype=dt), np.ascontiguousarray(ct, dtype=dt))

    def _layer_parts(self, k, split, alpha, beta, dt, chords):
        """Per (domain, row) slopes of layer k's unstable columns: lower, upper, intercept mask
        and the beta coefficient added to z's coefficient."""
        o0, o1 = self.offsets[k], self.offsets[k + 1]
        sp = split[:, o0:o1]
        a = alpha[:, o0:o1]
        free = sp == 0
        fixed = np.where(sp > 0, 1.0, self.leak).astype(dt)
        cs = chords[0][:, o0:o1]
        ct = chords[1][:, o0:o1]
        sl = np.where(free, a, fixed)
        su = np.where(free, cs, fixed)
        tt = np.where(free, ct, dt(0.0))
        bc = (-sp).astype(dt) * beta[:, o0:o1]
        return sl, su, tt, bc

    def evaluate(self, split, alpha, beta, dtype=np.float64, keep=False, charge=None,
                 chords=None, rows=None, mu=None, bounds=None):
        """Lower bounds of ``A_i f(x) - b_up_i`` on the subdomains, (B, m).

        ``split`` (B, nU) int8; ``alpha``, ``beta`` (B, m, nU) (used as given: the caller
        clips them). float64: the sound bound (widened). float32: an estimate.
        ``chords``: per domain (slope, intercept) (B, nU) of the unstable neurons' upper
        lines (:meth:`chords` of the domain's bounds); default the root's.
        ``keep``: also return the tape for :meth:`gradient` and the per-layer coefficients.
        ``charge(k, absD)`` (float64 only) may return a per-row extra allowance (B*m,) for
        the step through hidden layer k whose scaled matrix is D.
        ``rows`` (B,): bound only this row of each domain (alpha, beta (B, 1, nU)); (B, 1).
        ``mu`` (B, m, nC): multipliers of the cuts ``self.cuts``: the bound of
        :func:`~crown_cli.verification.bab.cuts.evaluate_cuts` (then ``bounds``: the domains'
        (l, u) of the unstable neurons, as ``chords`` were made from; ``charge`` unused).
        A float32 evaluation may overflow where float64 does not (that estimate only steers
        worse): it runs under ``np.errstate``, as the graph bounder's does.
        """
        with steering_quiet(np.dtype(dtype) != np.float64):
            return self._bound(split, alpha, beta, dtype, keep, charge, chords, rows, mu, bounds)

    def _bound(self, split, alpha, beta, dtype, keep, charge, chords, rows, mu, bounds):
        """:meth:`evaluate`'s body."""
        if mu is not None and self.cuts is not None and len(self.cuts):
            return evaluate_cuts(self, split, alpha, beta, mu, dtype, keep, bounds, rows)
        dt = np.float64 if np.dtype(dtype) == np.float64 else np.float32
        B, m = split.shape[0], (self.m if rows is None else 1)
        N = B * m
        sp = np.repeat(split, m, axis=0) if m > 1 else split
        al = alpha.reshape(N, self.nU).astype(dt, copy=False)
        be = beta.reshape(N, self.nU).astype(dt, copy=False)
        ch = self._chords_rows(chords, B, m, dt)
        f64 = dt == np.float64
        tape = []
        rows = self.top_rows(B, rows, dt)
        hook = None
        for k in range(self.L - 1, -1, -1):
            cols = self.ucols[k]
            ss = self.stable_slope[k] if f64 else self.ss32[k]
            Lam = rows.Lam
            if not f64 and _kern() is not None:  # the fused float32 step (relax's twin)
                D, isum, pos, slope = _kern().step32(np.ascontiguousarray(Lam), ss, cols, sp, al,
                                                     be, ch[0], ch[1], self.leak,
                                                     self.offsets[k])
                self.back_step(rows, k, D, None, False, isum=isum)
                if keep:
                    tape.append((Lam, pos, slope, None))
                continue
            sl, su, tt, bc = self._layer_parts(k, sp, al, be, dt, ch)
            D, icpt, pos, slope = relax(Lam, Lines(cols, sl, su, tt, stable=ss, extra=bc))
            if f64 and self.split_z is not None:
                # a split-inactive neuron's D = fl(fl(Lu leak) + beta) rounds twice: the
                # sum by at most u |D| (in the step's 2u |D| Z charge), the product by
                # u |fl(Lu leak)|, which beta can cancel (D ~ 0, |Lu leak| large) and which
                # nothing proportional to |D| then covers: charged here against |z| <= Z
                # over the box (the multiplier's term is bounded over the whole box)
                o0, o1 = self.offsets[k], self.offsets[k + 1]
                twice = (sp[:, o0:o1] < 0) & (bc != 0.0)
                if twice.any():
                    P = np.where(twice, np.abs(Lam[:, cols] * self.leak), 0.0)
                    rows.charge = rows.charge + U64 * (P @ self.split_z[k])
            if charge is not None:
                hook = (lambda absD, k=k: np.asarray(charge(k, absD), dtype=np.float64)
                        / FP_RTOL)
            self.back_step(rows, k, D, icpt, f64, self.rw[k] if f64 else None, mag_hook=hook)
            if keep:
                tape.append((Lam, pos, slope, sl))
        Lam, const, mag, steps = rows.Lam, rows.const, rows.mag, rows.charge
        if f64:
            out = box_lower(Lam, const, mag, steps, self.c, self.r, self.net.fp_rtol)
        else:
            out = (Lam @ self.c32).astype(np.float64) - (np.abs(Lam) @ self.r32) + const
        out = out.reshape(B, m)
        if keep:
            tape.reverse()  # tape[k] for hidden layer k
            return out, (tape, Lam, sp, ch[1])
        return out

    def top_rows(self, B, rows, dt) -> Rows:
        """The rows over the last hidden layer for B domains (every row of each, or row
        ``rows[i]`` of domain i), the last layer folded in; in float64 with their magnitudes
        and the rounding charged so far."""
        if rows is None:
            m = self.m
            Lam = np.broadcast_to(self.Lam_top.astype(dt),
                                  (B, m, self.Lam_top.shape[1])).reshape(B * m, -1)
            const = np.tile(self.const_top, B)
        else:
            Lam = self.Lam_top[rows].astype(dt)
            const = self.const_top[rows]
        if dt != np.float64:
            return Rows(Lam, const)
        mag = np.tile(self.mag_top, B) if rows is None else self.mag_top[rows]
        steps = np.tile(self.lam_err, B) if rows is None else self.lam_err[rows]
        return Rows(Lam, const, mag, steps)

    def gradient(self, state, dtype=np.float32):
        """d(sum of all bounds)/d alpha and d/d beta, each (B*m, nU), from :meth:`evaluate`'s
        tape (float32 or float64 as evaluated). Only slopes of free unstable neurons on the
        lower side get a nonzero alpha gradient; only split neurons a beta gradient. A tape of
        the cuts' bound (``mu`` given) gives d/d mu (B*m, nC) too."""
        with np.errstate(over="ignore", invalid="ignore"):  # float32 may overflow: 0 there
            grads = gradient_cuts(self, state) if len(state) == 2 else self._gradient(state)
            return tuple(np.nan_to_num(g, posinf=0.0, neginf=0.0) for g in grads)

    def _gradient(self, state):
        """:meth:`gradient`'s body (the tape of a bound without cuts)."""
        tape, Lam_in, sp, ctr = state
        dt = Lam_in.dtype
        N = Lam_in.shape[0]
        c = self.c if dt == np.float64 else self.c32
        r = self.r if dt == np.float64 else self.r32
        G = c - np.sign(Lam_in) * r  # d bound / d Lam_{-1}
        gA = np.zeros((N, self.nU), dt)
        gB = np.zeros((N, self.nU), dt)
        fast = dt == np.float32 and _kern() is not None
        for k in range(self.L):
            gD = self.forward_grad(G, k, dt == np.float64)  # Lam_{k-1} = D_k W_k, + D_k . b_k
            Lam, pos, slope, sl = tape[k]
            if fast:
                G = _kern().back32(gD, Lam, self.ucols[k], sp, pos, slope, self.ss32[k],
                                   ctr, self.offsets[k], gA, gB, k + 1 < self.L)
                continue
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            cols = self.ucols[k]
            s = sp[:, o0:o1]
            free = s == 0
            gDu = gD[:, cols]
            Lu = Lam[:, cols]
            gA[:, o0:o1] = np.where(pos & free, gDu * Lu, 0.0)
            gB[:, o0:o1] = gDu * (-s).astype(dt)
            if k + 1 < self.L:
                ss = self.stable_slope[k] if dt == np.float64 else self.ss32[k]
                G = gD * ss
                ct = ctr[:, o0:o1]
                G[:, cols] = gDu * slope + np.where(~pos & free, ct, 0.0).astype(dt)
        return gA, gB

    def affine(self, split_row):
        """On a fully split domain (every unstable neuron split) the network is affine:
        returns (G, H) with f(x) = G x + H there, and the constraints (C, e) with C x <= e
        describing the domain's sign conditions (one row per unstable neuron)."""
        G, H = self.weights[0], self.biases[0]
        C, e = [], []
        for k in range(self.L):
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            s = split_row[o0:o1].astype(np.float64)
            cols = self.ucols[k]
            C.append(-s[:, None] * G[cols])  # s z >= 0  <=>  -s g x <= s h
            e.append(s * H[cols])
            slope = self.stable_slope[k].copy()
            slope[cols] = np.where(s > 0, 1.0, self.leak)
            G = self.weights[k + 1] @ (slope[:, None] * G)
            H = self.weights[k + 1] @ (slope * H) + self.biases[k + 1]
        d = G.shape[1]
        C = np.concatenate(C) if C else np.zeros((0, d))
        e = np.concatenate(e) if e else np.zeros(0)
        return G, H, C, e

    # ------------------------------------------------------------------ per-domain bounds

    def corners(self, state) -> np.ndarray:
        """Per evaluated (domain, row): the box corner minimising its final linear function."""
        Lam_in = state[1]
        return np.where(Lam_in > 0.0, self.box.lo, self.box.hi)

    def violated(self, X):
        """The first row of X (N, d), clipped into the box, that is a counterexample of some
        case (a float64 forward pass), or None."""
        X = np.clip(X, self.box.lo, self.box.hi)
        ok = violations(self.weights, self.biases, self.activation,
                        None if self.activation == "relu" else self.leak, self.box.lo,
                        self.box.hi, self.A, self.b, X, self.gstart)
        return X[int(np.argmax(ok))].copy() if ok.any() else None

    def attack(self, restarts, steps, seed, deadline):
        """The PGD attack on the box (:func:`find_counterexample_any`) for the cases: (case,
        x) or None."""
        from crown_cli.verification.attack import find_counterexample_any

        return find_counterexample_any(
            self.weights, self.biases, self.activation,
            None if self.activation == "relu" else self.leak, self.box.lo, self.box.hi,
            [(self.A[g0:g1], self.b[g0:g1]) for g0, g1 in self.case_rows()],
            restarts=restarts, steps=steps, seed=seed, deadline=deadline)
