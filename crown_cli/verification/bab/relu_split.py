"""Branch and bound by ReLU splitting for one property case (beta-CROWN style).

A case is ``x in [lo, hi] and A f(x) <= b``; it is empty (``unsat``) when every point of the
box has some row with ``A_i f(x) > b_i``. :func:`relu_split` decides it by splitting unstable
ReLUs (Wang et al., "Beta-CROWN", NeurIPS 2021; implemented from the paper's idea):

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
  few Adam steps, then the float64 bound at the best iterate.
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
  :func:`crown_cli.engine.backsub.back_substitute` (``FP_RTOL`` times the sum of the magnitudes of all
  terms), compared with ``b`` rounded up one ulp. Each step's |D| is available to a
  ``charge`` hook adding further per-step rounding allowance.
- Branching: a BaBSR-like score (|coefficient| of the neuron's activation in the domain's
  back-substitution times the largest gap of the relaxation side it uses), by default
  filtered (filtered smart branching: the top-3 candidates' children evaluated in one batch,
  the one with the best worse child taken); with ``layer_window`` the candidates come from
  the domain's shallowest layers with open neurons only.
- Attacks on the way: the box corner minimising each evaluated row's linear bound is checked
  by a float64 forward pass; a point of the box meeting every row is a counterexample.

Arrays in, result out: no files and no printing here (``log`` receives progress strings).
"""
from __future__ import annotations

import heapq
import time
from typing import Callable, Optional, Sequence

import numpy as np

from crown_cli.activations import default_alpha, supporting
from crown_cli.engine.backsub import Network, hidden_layer_bounds
from crown_cli.engine.input_sets import Box, input_abs_bound
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.verification.outcome import BabResult, violations
from crown_cli.engine.rounding import (ERR_SAFETY, FP_RTOL, U64, margin_rows_rounding, round_up,
                                       rounding_weights, widen)

def _kern():
    """The numba kernels of the float32 steps, or None under set_kernels("numpy")."""
    from crown_cli.engine.kernels import kernels_backend

    if kernels_backend() == "numpy":
        return None
    from crown_cli.engine.kernels import relu_split as bab_relu_kernels

    return bab_relu_kernels


class _Relax:
    __slots__ = ("aU", "bU", "aL", "bL")

    def __init__(self, aU, bU, aL, bL):
        self.aU, self.bU, self.aL, self.bL = aU, bU, aL, bL


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
    ``Bounder(interm_slopes=...)``."""
    bd = Bounder(weights, biases, lo, hi, np.zeros((0, weights[-1].shape[0])), np.zeros(0),
                 activation, leak)
    bounds = [(l.copy(), u.copy()) for l, u in bd.bounds]
    found = [None] * bd.L
    for k in range(1, bd.L):
        if deadline is not None and time.monotonic() >= deadline:
            break
        l, u = bounds[k]
        rows = np.flatnonzero((l < 0.0) & (u > 0.0))
        if rows.size == 0:
            continue
        n = l.size
        A = np.zeros((2 * rows.size, n))
        A[np.arange(rows.size), rows] = 1.0
        A[rows.size + np.arange(rows.size), rows] = -1.0
        sub = Bounder(weights[:k + 1], biases[:k + 1], lo, hi, A, np.zeros(2 * rows.size),
                      activation, leak, layer_bounds=bounds[:k])
        split = np.zeros((1, sub.nU), np.int8)
        alpha = np.broadcast_to(sub.initial_alpha(), (1, sub.m, sub.nU)).copy()
        beta = np.zeros_like(alpha)
        optimise(sub, split, alpha, beta, iters, stop=False, deadline=deadline)
        a64 = np.clip(alpha.astype(np.float64), sub.leak, 1.0)
        v = sub.evaluate(split, a64, np.zeros(alpha.shape), np.float64)[0]
        found[k] = (rows, a64[0])
        # rows bound z_j - b_up and -z_j - b_up with b_up = 5e-324 > 0: v <= z_j (or -z_j)
        l, u = l.copy(), u.copy()
        l[rows] = np.maximum(l[rows], v[:rows.size])
        u[rows] = np.minimum(u[rows], -v[rows.size:])
        bounds[k] = (l, u)
    return (bounds, found) if slopes else bounds


class Bounder:
    """Batched bounds of the rows ``A f(x) - b_up`` on ReLU-split subdomains of one box.

    Unstable neurons (l < 0 < u at the root) are numbered globally 0..n_unstable-1 in layer
    order; a batch gives per domain ``split`` (B, nU) int8 in {-1, 0, +1} and per (domain,
    row) ``alpha``, ``beta`` (B, m, nU).

    ``layer_bounds``: the hidden layers' (l, u), valid on the box (default: CROWN's, from
    ``crown.hidden_layer_bounds``; :func:`root_layer_bounds` gives tighter ones).

    ``groups`` (m,): the case of each row, rows of a case adjacent (default: one case). The
    unsafe set is the union over cases of ``{A_g f(x) <= b_g}`` (each a conjunction): a domain
    is proven when every case has a row whose lower bound is above 0 (:meth:`score` > 0).

    ``interm_slopes``: lower slopes for the per-domain hidden-layer bounds of :meth:`tighten`,
    as :func:`root_layer_bounds` returns them with ``slopes`` (given with its bounds): each
    layer's neuron keeps the slopes optimised for it at the root instead of CROWN's adaptive
    ones (any slope in [leak, 1] is a valid lower bound of an unstable neuron).
    """

    def __init__(self, weights, biases, lo, hi, A, b, activation="relu", leak=None,
                 layer_bounds=None, groups=None, interm_slopes=None):
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
        self.box = Box(lo, hi)
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
        relax_fn = get_relaxation(activation, "crown", None if activation == "relu" else leak)
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
        # per hidden layer: slope of stable neurons (0 on unstable ones), unstable columns,
        # their chord slope/intercept and CROWN's lower slope (the initial alpha)
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
        # per hidden layer k >= 1: (2 R_k, offsets[k]) lower slopes of the rows z_j, -z_j of
        # its unstable neurons over the unstable neurons before it, or None (adaptive)
        self.islopes = [None] * self.L
        for k, entry in enumerate(interm_slopes or ()):
            if entry is None or k == 0 or k >= self.L or self.ucols[k].size == 0:
                continue
            neur, a = np.asarray(entry[0]), np.asarray(entry[1], np.float64)
            pos = np.searchsorted(neur, self.ucols[k])
            if (a.shape != (2 * neur.size, self.offsets[k]) or np.any(pos >= neur.size)
                    or np.any(neur[np.minimum(pos, neur.size - 1)] != self.ucols[k])):
                raise ValueError(f"interm_slopes: layer {k} does not match the layer bounds")
            self.islopes[k] = np.ascontiguousarray(
                np.clip(np.concatenate([a[pos], a[neur.size + pos]]), leak, 1.0))
        self._subs = {}  # per hidden layer k: :meth:`_sub`'s Bounder
        self._warm = {}  # per hidden layer k: tighten_opt's running start (alpha, beta)
        self.layer_of = np.zeros(self.nU, dtype=np.int64)
        for k in range(self.L):
            self.layer_of[self.offsets[k]:self.offsets[k + 1]] = k
        # float32 copies for the optimisation
        self.W32 = [w.astype(np.float32) for w in self.weights]
        self.WT32 = [np.ascontiguousarray(w.T.astype(np.float32)) for w in self.weights]
        self.b32 = [v.astype(np.float32) for v in self.biases]
        self.ss32 = [s.astype(np.float32) for s in self.stable_slope]
        # the last layer folded into the rows (as crown.margin_lower_bound does)
        self.Lam_top = self.A @ self.weights[-1]
        self.const_top = self.A @ self.biases[-1] - self.b_up
        self.mag_top = np.abs(self.A) @ np.abs(self.biases[-1]) + np.abs(self.b_up)
        self.c = self.box.center
        self.r = self.box.radius
        self.c32, self.r32 = self.c.astype(np.float32), self.r.astype(np.float32)
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
        absA = np.abs(self.A)
        self.lam_err = margin_rows_rounding(
            self.A.shape[1], absA @ (self.net.abs_weights(self.L) @ a_prev),
            absA @ np.abs(self.biases[-1]))

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
                 chords=None, rows=None):
        """Lower bounds of ``A_i f(x) - b_up_i`` on the subdomains, (B, m).

        ``split`` (B, nU) int8; ``alpha``, ``beta`` (B, m, nU) (used as given: the caller
        clips them). float64: the sound bound (widened). float32: an estimate.
        ``chords``: per domain (slope, intercept) (B, nU) of the unstable neurons' upper
        lines (:meth:`chords` of the domain's bounds); default the root's.
        ``keep``: also return the tape for :meth:`gradient` and the per-layer coefficients.
        ``charge(k, absD)`` (float64 only) may return a per-row extra allowance (B*m,) for
        the step through hidden layer k whose scaled matrix is D.
        ``rows`` (B,): bound only this row of each domain (alpha, beta (B, 1, nU)); (B, 1).
        """
        dt = np.float64 if np.dtype(dtype) == np.float64 else np.float32
        B, m = split.shape[0], (self.m if rows is None else 1)
        N = B * m
        sp = np.repeat(split, m, axis=0) if m > 1 else split
        al = alpha.reshape(N, self.nU).astype(dt, copy=False)
        be = beta.reshape(N, self.nU).astype(dt, copy=False)
        ch = self._chords_rows(chords, B, m, dt)
        if rows is None:
            Lam = np.broadcast_to(self.Lam_top.astype(dt),
                                  (B, m, self.Lam_top.shape[1])).reshape(N, -1)
            const = np.tile(self.const_top, B)
        else:
            Lam = self.Lam_top[rows].astype(dt)
            const = self.const_top[rows]
        f64 = dt == np.float64
        if f64:
            mag = np.tile(self.mag_top, B) if rows is None else self.mag_top[rows]
            steps = np.tile(self.lam_err, B) if rows is None else self.lam_err[rows]
        tape = []
        W = self.weights if f64 else self.W32
        for k in range(self.L - 1, -1, -1):
            cols = self.ucols[k]
            ss = self.stable_slope[k] if f64 else self.ss32[k]
            bias = self.biases[k] if f64 else self.b32[k]
            if not f64 and _kern() is not None:
                D, isum, pos, slope = _kern().step32(np.ascontiguousarray(Lam), ss, cols, sp, al,
                                                     be, ch[0], ch[1], self.leak,
                                                     self.offsets[k])
                const = const + isum + (D @ bias)
                if keep:
                    tape.append((Lam, pos, slope, None))
                Lam = D @ W[k]
                continue
            D = Lam * ss
            sl, su, tt, bc = self._layer_parts(k, sp, al, be, dt, ch)
            Lu = Lam[:, cols]
            pos = Lu >= 0.0
            slope = np.where(pos, sl, su)
            icpt = np.where(pos, dt(0.0), Lu * tt)
            D[:, cols] = Lu * slope + bc
            const = const + icpt.sum(axis=1, dtype=np.float64) + (D @ bias)
            if f64:
                absD = np.abs(D)
                mag = mag + np.abs(icpt).sum(axis=1) + absD @ np.abs(bias)
                v, t = self.rw[k]
                steps = steps + absD @ v + t
                if charge is not None:
                    mag = mag + np.asarray(charge(k, absD), dtype=np.float64) / FP_RTOL
            if keep:
                tape.append((Lam, pos, slope, sl))
            Lam = D @ W[k]
        if f64:
            lin = Lam @ self.c
            absL = np.abs(Lam)
            nrm = absL @ self.r
            val = lin - nrm + const
            mag = mag + absL @ np.abs(self.c) + nrm
            out = widen(val, mag, -1.0, self.net.fp_rtol, ERR_SAFETY * steps)
        else:
            out = (Lam @ self.c32).astype(np.float64) - (np.abs(Lam) @ self.r32) + const
        out = out.reshape(B, m)
        if keep:
            tape.reverse()  # tape[k] for hidden layer k
            return out, (tape, Lam, sp, ch[1])
        return out

    def gradient(self, state, dtype=np.float32):
        """d(sum of all bounds)/d alpha and d/d beta, each (B*m, nU), from :meth:`evaluate`'s
        tape (float32 or float64 as evaluated). Only slopes of free unstable neurons on the
        lower side get a nonzero alpha gradient; only split neurons a beta gradient."""
        tape, Lam_in, sp, ctr = state
        dt = Lam_in.dtype
        N = Lam_in.shape[0]
        c = self.c if dt == np.float64 else self.c32
        r = self.r if dt == np.float64 else self.r32
        G = c - np.sign(Lam_in) * r  # d bound / d Lam_{-1}
        gA = np.zeros((N, self.nU), dt)
        gB = np.zeros((N, self.nU), dt)
        WT = [w.T for w in self.weights] if dt == np.float64 else self.WT32
        bias = self.biases if dt == np.float64 else self.b32
        fast = dt == np.float32 and _kern() is not None
        for k in range(self.L):
            gD = G @ WT[k] + bias[k]  # Lam_{k-1} = D_k W_k, const += D_k . b_k
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
        self._bk = [self.biases[j][kp] for j, kp in enumerate(keep)]
        self._ssk = [self.stable_slope[j][kp] for j, kp in enumerate(keep)]
        self._vk = [self.rw[j][0][kp] for j, kp in enumerate(keep)]

    def _rows_lower(self, k, dd, split, dl, du):
        """float64 lower bounds of ``z_kj`` and ``-z_kj`` (rows (n, 2R): first z, then -z)
        for the domains ``dd`` (n,) and layer k's R unstable neurons, over each domain (box
        and split constraints): CROWN back-substitution through layers k-1..0 with the split
        neurons fixed (identity / inactive slope), the others relaxed by the domain's bounds
        (chord above; below the row's root-optimised slope of ``interm_slopes``, else CROWN's
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
        mag = np.abs(const)
        steps = np.zeros(n * rows)
        for j in range(k - 1, -1, -1):
            o0, o1 = self.offsets[j], self.offsets[j + 1]
            sp = split[dd, o0:o1]
            l, u = dl[dd, o0:o1], du[dd, o0:o1]
            cs, ct = self.chords(l, u)
            alo = None if isl is None else isl[:, o0:o1]
            if _kern() is not None:
                D, dc, dm, st = _kern().interm_step64(
                    np.ascontiguousarray(Lam), self._ssk[j], self._upos[j],
                    np.ascontiguousarray(sp), np.ascontiguousarray(l), np.ascontiguousarray(u),
                    cs, ct, self.leak, self._bk[j], np.abs(self._bk[j]), self._vk[j],
                    float(self.rw[j][1]),
                    np.zeros((0, 0)) if alo is None else np.ascontiguousarray(alo))
                const = const + dc
                mag = mag + dm
                steps = steps + st
                Lam = (D @ self._Wstep[j]).reshape(n, rows, -1)
                continue
            fixed = np.where(sp > 0, 1.0, self.leak)
            free = sp == 0
            if alo is None:
                s_lo = np.where(free, np.where(u >= -l, 1.0, self.leak), fixed)[:, None, :]
            else:
                s_lo = np.where(free[:, None, :], alo[None, :, :], fixed[:, None, :])
            s_up = np.where(free, cs, fixed)[:, None, :]
            t_up = np.where(free, ct, 0.0)[:, None, :]
            up = self._upos[j]
            Lu = Lam[:, :, up]
            pos = Lu >= 0.0
            icpt = np.where(pos, 0.0, Lu * t_up)
            D = Lam * self._ssk[j]
            D[:, :, up] = Lu * np.where(pos, s_lo, s_up)
            D = D.reshape(n * rows, -1)
            const = const + icpt.sum(axis=2).reshape(-1) + D @ self._bk[j]
            absD = np.abs(D)
            mag = mag + np.abs(icpt).sum(axis=2).reshape(-1) + absD @ np.abs(self._bk[j])
            steps = steps + absD @ self._vk[j] + self.rw[j][1]
            Lam = (D @ self._Wstep[j]).reshape(n, rows, -1)
        Lam = Lam.reshape(n * rows, -1)
        absL = np.abs(Lam)
        nrm = absL @ self.r
        val = Lam @ self.c - nrm + const
        mag = mag + absL @ np.abs(self.c) + nrm
        out = widen(val, mag, -1.0, self.net.fp_rtol, ERR_SAFETY * steps)
        return out.reshape(n, rows)

    def tighten(self, split, dl, du, start, max_bytes: float = 2.0 ** 26, deadline=None):
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
        ones given (valid, only looser)."""
        self._interm_setup()
        widest = max([self.box.lo.size] + [kp.size for kp in self._keep])

        def layer(k, doms, split, dl, du):
            # every unstable neuron of the layer: the split ones' bounds (taking their sign)
            # find domains whose splits contradict each other
            o0, R = self.offsets[k], self.ucols[k].size
            chunk = max(1, int(max_bytes // (8 * 8 * 2 * R * widest)))
            for c0 in range(0, doms.size, chunk):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                dd = doms[c0:c0 + chunk]
                low = self._rows_lower(k, dd, split, dl, du)
                rr, cc = dd[:, None], o0 + np.arange(R)[None, :]
                dl[rr, cc] = np.maximum(dl[rr, cc], low[:, :R])
                du[rr, cc] = np.minimum(du[rr, cc], -low[:, R:])

        return self._tighten_layers(split, dl, du, start, layer)

    def _tighten_layers(self, split, dl, du, start, layer):
        """The frame of :meth:`tighten` and :meth:`tighten_opt`: split neurons' bounds take
        their sign, then for each hidden layer k >= 1 ``layer(k, doms, split, dl, du)``
        narrows (in place) the bounds of layer k's unstable neurons on the domains ``doms``
        (those with ``start < k``, not yet empty), after which the neurons proven stable
        become implied splits and domains with crossing bounds are marked empty. Returns
        (split, dl, du, empty)."""
        split, dl, du = split.copy(), np.array(dl, np.float64), np.array(du, np.float64)
        dl = np.where(split > 0, np.maximum(dl, 0.0), dl)
        du = np.where(split < 0, np.minimum(du, 0.0), du)
        empty = np.any(dl > du, axis=1)
        start = np.asarray(start)
        for k in range(1, self.L):
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            if o1 == o0:
                continue
            doms = np.flatnonzero((start < k) & ~empty)
            if doms.size == 0:
                continue
            layer(k, doms, split, dl, du)
            sl, su, sp = dl[doms, o0:o1], du[doms, o0:o1], split[doms, o0:o1]
            sp[(sp == 0) & (sl >= 0.0)] = 1
            sp[(sp == 0) & (su <= 0.0)] = -1
            split[doms, o0:o1] = sp
            empty[doms] |= np.any(sl > su, axis=1)
        return split, dl, du, empty

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
            cache[k] = Bounder(self.weights[:k + 1], self.biases[:k + 1], self.box.lo,
                               self.box.hi, np.vstack([E, -E]), np.zeros(2 * cols.size),
                               self.activation, self.leak, self.bounds[:k])
        return cache[k]

    def tighten_opt(self, split, dl, du, start, iters: int = 3, lr_alpha: float = 0.3,
                    lr_beta: float = 0.3, max_bytes: float = 2.0 ** 27, deadline=None,
                    warm: float = 0.0):
        """:meth:`tighten` with optimised multipliers (beta-CROWN for the hidden layers): the
        bounds of every layer k after ``start[d]`` come from ``iters`` projected Adam steps
        on each row ``z_kj`` / ``-z_kj`` (:meth:`_sub`) over its lower slopes (from
        ``interm_slopes``, else CROWN's) and multipliers beta >= 0 of the domain's split
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
        only the float64 bound counts. Returns (split, dl, du, empty) as :meth:`tighten`."""

        def layer(k, doms, split, dl, du):
            o0, o1 = self.offsets[k], self.offsets[k + 1]
            sb, R = self._sub(k), o1 - o0
            widest = max([self.box.lo.size] + [w.shape[0] for w in self.weights[:k]])
            # per row: alpha, beta, their moments and float64 copies, the tape
            per = 16 * 4 * max(o0, 1) + 8 * 3 * widest
            chunk = max(1, int(max_bytes // per))
            a0 = self.islopes[k] if self.islopes[k] is not None else \
                np.broadcast_to(sb.initial_alpha(), (2 * R, o0))
            sg = split[doms, o0:o1].astype(np.int64)
            sg = np.where(sg != 0, sg, np.where(dl[doms, o0:o1] >= 0.0, 1,
                                                np.where(du[doms, o0:o1] <= 0.0, -1, 0)))
            pd, pj = np.nonzero(np.concatenate([sg <= 0, sg >= 0], axis=1))
            tab = None
            if warm > 0.0:
                tab = self._warm.get(k)
                if tab is None:
                    tab = self._warm[k] = (np.array(a0, np.float32),
                                           np.zeros((2, 2 * R, o0), np.float32))
            for c0 in range(0, pd.size, chunk):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                dom = doms[pd[c0:c0 + chunk]]
                rows = pj[c0:c0 + chunk]
                sp = np.ascontiguousarray(split[dom, :o0])
                ch = self.chords(dl[dom, :o0], du[dom, :o0])
                if tab is None:
                    al, be = _optimise_rows(sb, sp, a0[rows], rows, ch, iters, lr_alpha,
                                            lr_beta, deadline)
                else:
                    b0 = np.where(sp > 0, tab[1][0][rows], tab[1][1][rows])
                    al, be = _optimise_rows(sb, sp, tab[0][rows], rows, ch, iters, lr_alpha,
                                            lr_beta, deadline, beta0=b0)
                    # running per-row means of the optimised multipliers: the next
                    # domains' starting point (any start is sound: only the bound counts)
                    _blend(tab[0], rows, al, None, warm)
                    _blend(tab[1][0], rows, be, sp > 0, warm)
                    _blend(tab[1][1], rows, be, sp < 0, warm)
                low = sb.evaluate(sp, al[:, None], be[:, None], np.float64, chords=ch,
                                  rows=rows)[:, 0]
                lower = rows < R
                dlo, clo = dom[lower], o0 + rows[lower]
                dl[dlo, clo] = np.maximum(dl[dlo, clo], low[lower])
                dup, cup = dom[~lower], o0 + rows[~lower] - R
                du[dup, cup] = np.minimum(du[dup, cup], -low[~lower])

        return self._tighten_layers(split, dl, du, start, layer)

    def corners(self, state) -> np.ndarray:
        """Per evaluated (domain, row): the box corner minimising its final linear function."""
        Lam_in = state[1]
        return np.where(Lam_in > 0.0, self.box.lo, self.box.hi)


# ---------------------------------------------------------------------------------- optimiser

_B1, _B2, _EPS = 0.9, 0.999, 1e-8  # Adam's moment decays and denominator guard


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


def _adam_ascent(x, g, m, v, t, lr):
    """One Adam ascent step (step ``t`` >= 1) on the float32 parameters x, in place, with
    gradient g and moments m, v; returns the new moments (the caller stores them and
    projects x)."""
    m = _B1 * m + (1 - _B1) * g
    v = _B2 * v + (1 - _B2) * g * g
    c = lr * np.sqrt(1 - _B2 ** t) / (1 - _B1 ** t)
    x += (c * m / (np.sqrt(v) + _EPS)).astype(np.float32)
    return m, v


def _optimise_rows(bd: Bounder, split, alpha0, rows, chords, iters, lr_alpha, lr_beta,
                   deadline=None, beta0=None):
    """Projected Adam ascent of single-row bounds: entry i is row ``rows[i]`` of ``bd`` on
    the domain ``split[i]`` with upper lines ``chords`` (each (N, nU)), from slopes
    ``alpha0`` (N, nU) and beta 0. Returns the best iterate's (alpha, beta) (N, nU) float64,
    clipped to [leak, 1] and >= 0 (beta 0 on unsplit neurons)."""
    N, nU = alpha0.shape
    a = np.array(alpha0, np.float32)
    be = np.zeros((N, nU), np.float32) if beta0 is None else \
        np.array(beta0, np.float32) * (split != 0)
    best = np.full(N, -np.inf)
    best_a, best_b = a.copy(), be.copy()
    ma = np.zeros_like(a); va = np.zeros_like(a)
    mb = np.zeros_like(be); vb = np.zeros_like(be)
    splitted = split != 0
    lo_a = np.float32(bd.leak)
    for t in range(1, iters + 1):
        if nU == 0:
            break
        val, state = bd.evaluate(split, a[:, None], be[:, None], np.float32, keep=True,
                                 chords=chords, rows=rows)
        val = val[:, 0]
        imp = val > best
        best[imp] = val[imp]
        best_a[imp] = a[imp]
        best_b[imp] = be[imp]
        if t == iters or (deadline is not None and time.monotonic() >= deadline):
            break
        gA, gB = bd.gradient(state)
        ma, va = _adam_ascent(a, gA, ma, va, t, lr_alpha)
        np.clip(a, lo_a, 1.0, out=a)
        mb, vb = _adam_ascent(be, gB, mb, vb, t, lr_beta)
        np.maximum(be, 0.0, out=be)
        be *= splitted
    return (np.clip(best_a.astype(np.float64), bd.leak, 1.0),
            np.maximum(best_b.astype(np.float64), 0.0))


def optimise(bd: Bounder, split, alpha, beta, iters=20, lr_alpha=0.1, lr_beta=0.05,
             stop=True, chords=None, deadline=None):
    """Projected Adam ascent of the float32 bounds over alpha, beta (B, m, nU) float32, in
    place; keeps per (domain, row) the best iterate. A domain leaves the batch once its
    :meth:`Bounder.score` is above 0 by a float32 margin (the float64 check decides later).
    Returns (best bounds (B, m) float32 estimate, the tape of a final evaluation of all
    domains at the best iterate). ``chords``: the domains' upper lines, as :meth:`Bounder.evaluate`.
    ``deadline`` (a ``time.monotonic()`` instant): no further step after it (the first
    evaluation always runs; the best iterate so far is kept, as at the last step)."""
    B, m, nU = alpha.shape
    best = np.full((B, m), -np.inf)
    best_a, best_b = alpha.copy(), beta.copy()
    ma = np.zeros_like(alpha); va = np.zeros_like(alpha)
    mb = np.zeros_like(beta); vb = np.zeros_like(beta)
    splitted = (split != 0)[:, None, :]
    lo_a = np.float32(bd.leak)
    act = np.arange(B)
    for t in range(1, iters + 1):
        if nU == 0 or act.size == 0:
            break
        a, be = alpha[act], beta[act]
        ch = None if chords is None else (chords[0][act], chords[1][act])
        val, state = bd.evaluate(split[act], a, be, np.float32, keep=True, chords=ch)
        imp = val > best[act]
        if imp.any():
            d, r = np.nonzero(imp)
            best[act[d], r] = val[d, r]
            best_a[act[d], r] = a[d, r]
            best_b[act[d], r] = be[d, r]
        done = bd.score(best[act]) > 1e-4 * (1.0 + np.abs(val).max()) if stop else \
            np.zeros(act.size, bool)
        if t == iters or (deadline is not None and time.monotonic() >= deadline):
            break
        gA, gB = bd.gradient(state)
        gA = gA.reshape(a.shape)
        gB = gB.reshape(be.shape)
        ma[act], va[act] = _adam_ascent(a, gA, ma[act], va[act], t, lr_alpha)
        np.clip(a, lo_a, 1.0, out=a)
        mb[act], vb[act] = _adam_ascent(be, gB, mb[act], vb[act], t, lr_beta)
        np.maximum(be, 0.0, out=be)
        be *= splitted[act]
        alpha[act] = a
        beta[act] = be
        act = act[~done]
    alpha[...] = best_a
    beta[...] = best_b
    val, state = bd.evaluate(split, alpha, beta, np.float32, keep=True, chords=chords)
    best = np.maximum(best, val)
    return best, state


def optimise_open(bd: Bounder, split, alpha, beta, done, iters=20, lr_alpha=0.1,
                  lr_beta=0.05, chords=None, deadline=None):
    """:func:`optimise` for searches over several cases (``bd.gstart``): only the rows of
    cases not yet proven on a domain (``done`` (B, G) bool, float64-proven on an ancestor)
    are optimised, and a case's rows leave once one of them is above 0 by a float32 margin.
    Returns (best bounds (B, m), +inf on rows of done cases; the tape of a final evaluation
    of one row per domain; that row (B,), :meth:`Bounder.score_row` of the best bounds).
    With one case it is :func:`optimise` (tape of every row)."""
    B, m, nU = alpha.shape
    if bd.gstart.size <= 1:
        best, state = optimise(bd, split, alpha, beta, iters, lr_alpha, lr_beta,
                               chords=chords, deadline=deadline)
        return best, state, bd.score_row(best)
    frozen = done[:, bd.group_of]
    best = np.where(frozen, np.inf, -np.inf)
    best_a, best_b = alpha.copy(), beta.copy()
    ma = np.zeros_like(alpha); va = np.zeros_like(alpha)
    mb = np.zeros_like(beta); vb = np.zeros_like(beta)
    lo_a = np.float32(bd.leak)
    d, r = np.nonzero(~frozen)
    for t in range(1, iters + 1):
        if nU == 0 or d.size == 0:
            break
        a, be = alpha[d, r], beta[d, r]
        sp = split[d]
        ch = None if chords is None else (chords[0][d], chords[1][d])
        val, state = bd.evaluate(sp, a[:, None], be[:, None], np.float32, keep=True, chords=ch,
                                 rows=r)
        val = val[:, 0]
        imp = val > best[d, r]
        if imp.any():
            best[d[imp], r[imp]] = val[imp]
            best_a[d[imp], r[imp]] = a[imp]
            best_b[d[imp], r[imp]] = be[imp]
        gmax = np.maximum.reduceat(best, bd.gstart, axis=1)
        leave = gmax[d, bd.group_of[r]] > 1e-4 * (1.0 + np.abs(val).max())
        if t == iters or (deadline is not None and time.monotonic() >= deadline):
            break
        gA, gB = bd.gradient(state)
        ma[d, r], va[d, r] = _adam_ascent(a, gA, ma[d, r], va[d, r], t, lr_alpha)
        np.clip(a, lo_a, 1.0, out=a)
        mb[d, r], vb[d, r] = _adam_ascent(be, gB, mb[d, r], vb[d, r], t, lr_beta)
        np.maximum(be, 0.0, out=be)
        be *= sp != 0
        alpha[d, r] = a
        beta[d, r] = be
        d, r = d[~leave], r[~leave]
    alpha[...] = best_a
    beta[...] = best_b
    rows = bd.score_row(best)
    ar = np.arange(B)
    val, state = bd.evaluate(split, alpha[ar, rows][:, None], beta[ar, rows][:, None],
                             np.float32, keep=True, chords=chords, rows=rows)
    best[ar, rows] = np.maximum(best[ar, rows], val[:, 0])
    return best, state, rows


# ---------------------------------------------------------------------------------- branching


def branch_scores(bd: Bounder, state, split, alpha, rows, dl=None, du=None) -> np.ndarray:
    """BaBSR-like estimate per domain and unstable neuron of what splitting it gains, (B, nU)
    (-inf where already split): |Lam_j| times the largest gap of the side of the relaxation
    the domain's row uses (chord: its intercept; lower line alpha z: max(-alpha l, (1-alpha) u)),
    Lam_j the coefficient of the neuron's activation in row ``rows[d]``'s back-substitution.
    ``dl``, ``du`` (B, nU): the domains' bounds (default: the root's)."""
    tape, ctr = state[0], state[3]
    B = split.shape[0]
    m = bd.m
    # the tape holds every row of each domain, or (optimise_open) one row per domain
    idx = np.arange(B) * m + rows if state[1].shape[0] == B * m else np.arange(B)
    out = np.full((B, bd.nU), -np.inf)
    for k in range(bd.L):
        o0, o1 = bd.offsets[k], bd.offsets[k + 1]
        if o1 == o0:
            continue
        cols = bd.ucols[k]
        Lu = tape[k][0][idx][:, cols].astype(np.float64)
        if dl is None:
            l, u = bd.bounds[k][0][cols], bd.bounds[k][1][cols]
        else:
            l, u = dl[:, o0:o1], du[:, o0:o1]
        a = alpha[np.arange(B), rows, o0:o1].astype(np.float64)
        gap_low = np.maximum(-(a - bd.leak) * l, (1.0 - a) * u)
        gap_up = ctr[idx, o0:o1].astype(np.float64)
        sc = np.where(Lu >= 0.0, Lu * gap_low, -Lu * gap_up)
        sc[split[:, o0:o1] != 0] = -np.inf
        out[:, o0:o1] = sc
    return out


# ---------------------------------------------------------------------------------- search


class _Pool:
    """Open domains: arrays indexed by slot, a heap of (score, slot) worst first."""

    def __init__(self, nU, m, K, cap=1024, bounds=False, cases=1):
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
        self.free = list(range(cap - 1, -1, -1))
        self.heap = []

    def _grow(self):
        cap = self.split.shape[0]
        for name in ("split", "alpha", "beta", "cand", "row", "dl", "du", "done", "depth"):
            old = getattr(self, name)
            new = np.zeros((2 * cap,) + old.shape[1:], old.dtype)
            new[:cap] = old
            setattr(self, name, new)
        self.free.extend(range(2 * cap - 1, cap - 1, -1))

    def push(self, score, split, alpha, beta, cand, row, dl=None, du=None, done=None,
             depth=0):
        n = split.shape[0]
        while len(self.free) < n:
            self._grow()
        slots = np.array([self.free.pop() for _ in range(n)], dtype=np.int64)
        self.split[slots] = split
        self.alpha[slots] = alpha
        self.beta[slots] = beta
        self.cand[slots] = cand
        self.row[slots] = row
        self.depth[slots] = depth
        self.done[slots] = False if done is None else done
        if self.dl.shape[1]:
            self.dl[slots] = dl
            self.du[slots] = du
        for s, slot in zip(score.tolist(), slots.tolist()):
            heapq.heappush(self.heap, (s, slot))

    def pop(self, n):
        items = [heapq.heappop(self.heap) for _ in range(min(n, len(self.heap)))]
        slots = np.array([s for _, s in items], dtype=np.int64)
        out = (self.split[slots].copy(), self.alpha[slots].copy(), self.beta[slots].copy(),
               self.cand[slots].copy(), self.row[slots].copy(), self.dl[slots].copy(),
               self.du[slots].copy(), self.done[slots].copy(), self.depth[slots].copy())
        self.free.extend(slots.tolist())
        return out

    def __len__(self):
        return len(self.heap)

    def worst(self):
        return self.heap[0][0] if self.heap else np.inf


def relu_split(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray], lo, hi, A, b,
               deadline: float, **options) -> BabResult:
    """Decide the case ``x in [lo, hi] and A f(x) <= b`` by ReLU-splitting branch and bound:
    :func:`relu_split_steps` run to its end (see there for the options)."""
    return finish(relu_split_steps(weights, biases, lo, hi, A, b, deadline, **options))


def finish(steps):
    """Run a :func:`relu_split_steps` generator to its end; returns its :class:`BabResult`."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def relu_split_steps(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray], lo, hi, A,
                     b, deadline: float, *, max_domains: int = 200_000, batch: int = 256,
               iters: int = 20, root_iters: int = 50, branching: str = "fsb",
               fsb_k: Optional[int] = None,
               activation: str = "relu", leak=None, log: Optional[Callable[[str], None]] = None,
               charge=None, attack_restarts: int = 16, attack_steps: int = 50,
               seed: int = 0, tighten_root: bool = True, layer_bounds=None,
               max_memory: float = 2.0 ** 31, interm: Optional[bool] = None,
               layer_slopes=None, interm_iters: Optional[int] = None,
               interm_min_splits: int = 0, interm_warm: float = 0.5,
               layer_window: Optional[int] = None, groups=None,
               progress: Optional[Callable[[int, int, float], None]] = None) -> BabResult:
    """Decide the case ``x in [lo, hi] and A f(x) <= b`` by ReLU-splitting branch and bound,
    as a generator: it yields (nothing) after every batch of domains, so a caller can run
    several cases in turn (:func:`finish` runs one to its end), and returns the
    :class:`BabResult`.

    ``deadline``: a ``time.monotonic()`` instant (then ``timeout``). ``max_domains``: cap on
    open domains (hitting it gives ``unknown``), lowered so that the open domains' stored
    alpha/beta/splits stay below ``max_memory`` bytes. ``batch``: domains bounded per evaluation
    (children of batch/2 parents). ``branching``: "babsr" or "fsb" (filtered smart branching
    over the top ``fsb_k`` BaBSR candidates, default 3, 20 with ``interm``; on mnistfc 256x2
    it needed ~2.8x fewer domains than "babsr", on one 256x4 case 1.4x more: see the README;
    with ``interm`` and the layer window, 20 needed 2-4x fewer domains than 3 on mnistfc
    256x4 and 256x6, where the candidates' float32 evaluations cost little beside the
    per-domain bounds). ``iters``: Adam steps per
    batch (10 lost a 256x4 case that 20 proves). ``charge``: see :meth:`Bounder.evaluate`.
    ``attack_restarts``/``attack_steps``: a PGD attack (verify_attack.find_counterexample)
    when the root is not proven (0 restarts: none). ``tighten_root``: the hidden layers'
    bounds by :func:`root_layer_bounds` instead of CROWN's, its slopes serving the
    per-domain bounds; ``layer_bounds`` gives them, ``layer_slopes`` its slopes (e.g.
    computed once for several cases on one box). ``interm``: recompute each child
    domain's hidden-layer bounds after its new split (:meth:`Bounder.tighten`) instead of
    keeping the root's (default: on for 2 or more hidden layers). ``interm_iters``: with
    ``interm``, that many Adam steps per row on the recomputed bounds' slopes and the split
    constraints' multipliers (:meth:`Bounder.tighten_opt`; 0: :meth:`Bounder.tighten`, no
    multipliers; default 3 on 3 or more hidden layers, else 0): on mnistfc 256x4
    prop_4_0.05 a deep domain's bound went from -0.59 to +0.64 (the LP with split
    constraints on every hidden neuron: +0.93), at ~6x the cost per domain; 256x2
    prop_1_0.03 took 41 s with it, 11 s without. ``interm_min_splits``: only on domains
    with at least that many branching decisions (default 0). ``interm_warm`` (in [0, 1]):
    each row's optimisation starts from a running mean of the slopes and multipliers the
    rows of the domains bounded before ended with (:meth:`Bounder.tighten_opt`'s ``warm``,
    moved by that fraction after every chunk; 0: from the root's slopes and beta 0; default
    0.5): domains deep in one search share most of their splits, so the 3 steps continue
    rather than restart. On mnistfc 256x4 prop_3_0.03 it took 79 s (4.8k domains) instead
    of 203 s (15.9k); 256x4 prop_6_0.05 and prop_12_0.05, open at 300 s before, took 199 s
    and 217 s. ``layer_window``: branch
    only on neurons of the ``layer_window`` shallowest layers with open neurons in the
    domain (0: anywhere; default: 1 with ``interm`` on 3 or more hidden layers, else 0):
    with per-domain bounds an early split tightens every later layer. ``progress(domains, open, worst)``: called after every
    batch with the domains bounded so far, the open domains and the worst open domain's
    score (the float32 estimate of its best row's bound minus b). ``groups``: several cases
    at once (:class:`Bounder`): every domain is bounded in all their rows (the per-domain
    hidden-layer bounds, most of the cost on deep networks, serve them all) and is proven
    when every case is; a counterexample may violate any one.
    """
    t0 = time.monotonic()
    if not 0.0 <= interm_warm <= 1.0:
        raise ValueError(f"interm_warm must lie in [0, 1], not {interm_warm}")
    if layer_bounds is None and tighten_root and len(weights) > 2:
        layer_bounds, layer_slopes = root_layer_bounds(weights, biases, lo, hi, activation,
                                                       leak, deadline=deadline, slopes=True)
    bd = Bounder(weights, biases, lo, hi, A, b, activation, leak, layer_bounds, groups,
                 layer_slopes)
    m, nU = bd.m, bd.nU
    if interm is None:
        interm = bd.L >= 2
    interm = bool(interm) and bd.L > 1 and nU > 0
    if interm_iters is None:
        interm_iters = 3 if interm and bd.L >= 3 else 0
    if fsb_k is None:
        fsb_k = 20 if interm else 3
    K = max(1, min(int(fsb_k), nU)) if branching == "fsb" else 1
    window = int(layer_window) if layer_window is not None else \
        (1 if interm and bd.L >= 3 else 0)
    per_domain = nU * (1 + 8 * m + (16 if interm else 0)) + 8 * (K + 4)
    max_domains = int(min(max_domains, max_memory // per_domain))
    if branching not in ("babsr", "fsb"):
        raise ValueError("branching must be 'babsr' or 'fsb'")
    stats = dict(domains=0, peak=1, batches=0, proven=0, t_interm=0.0, empty=0)

    def result(verdict, x=None, worst=np.nan):
        return BabResult(verdict, x, stats["domains"], stats["peak"], float(worst),
                         time.monotonic() - t0, stats["batches"], stats["proven"])

    def violated(X):
        """The first row of X (N, d), clipped into the box, that is a counterexample, or None."""
        X = np.clip(X, bd.box.lo, bd.box.hi)
        ok = violations(bd.weights, bd.biases, bd.activation,
                        None if bd.activation == "relu" else bd.leak, bd.box.lo, bd.box.hi,
                        bd.A, bd.b, X, bd.gstart)
        return X[int(np.argmax(ok))].copy() if ok.any() else None

    if m == 0:  # no output constraint: every point of the box violates
        return result("sat", bd.box.center.copy())
    x = violated(bd.box.center[None, :])
    if x is not None:
        return result("sat", x)

    def verify64(split, alpha, beta, chords=None):
        a = np.clip(alpha.astype(np.float64), bd.leak, 1.0)
        be = np.maximum(beta.astype(np.float64), 0.0)
        return bd.evaluate(split, a, be, np.float64, charge=charge, chords=chords)

    def assess(split, alpha, beta, done, n_iters, chords=None):
        """Optimise and classify a batch; ``done`` (B, G): the cases proven on each domain
        (updated in place by the float64 checks). Returns (score float64 per domain: the
        worst open case's best row, proven mask, row, state) and the attack's counterexample
        if any."""
        est, state, row = optimise_open(bd, split, alpha, beta, done, n_iters, chords=chords,
                                        deadline=deadline)
        stats["domains"] += split.shape[0]
        stats["batches"] += 1
        gmax = np.maximum.reduceat(est, bd.gstart, axis=1)
        cand = np.flatnonzero(np.any((gmax > 0.0) & ~done, axis=1))
        if cand.size:
            v64 = verify64(split[cand], alpha[cand], beta[cand],
                           None if chords is None else (chords[0][cand], chords[1][cand]))
            g64 = np.maximum.reduceat(v64, bd.gstart, axis=1)
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
            xv = violated(Xc.reshape(-1, bd.box.lo.size))
            if xv is not None:
                return score, proven, row, state, xv
        return score, proven, row, state, None

    split = np.zeros((1, nU), np.int8)
    alpha = np.broadcast_to(bd.initial_alpha(), (1, m, nU)).copy()
    beta = np.zeros((1, m, nU), np.float32)
    done = np.zeros((1, max(1, bd.gstart.size)), bool)
    score, proven, row, state, xv = assess(split, alpha, beta, done, root_iters)
    if xv is not None:
        return result("sat", xv)
    if proven[0]:
        stats["proven"] += 1
        return result("unsat", worst=score[0])
    if log is not None:
        log(f"root: bound {score[0]:.5g}, {nU} unstable neurons")
    if attack_restarts > 0:
        from crown_cli.verification.attack import find_counterexample_any

        xa = find_counterexample_any(bd.weights, bd.biases, bd.activation,
                                     None if bd.activation == "relu" else bd.leak, bd.box.lo,
                                     bd.box.hi, [(bd.A[g0:g1], bd.b[g0:g1])
                                                 for g0, g1 in bd.case_rows()],
                                     restarts=attack_restarts, steps=attack_steps, seed=seed,
                                     deadline=deadline)
        if xa is not None:
            return result("sat", xa[1])
    pool = _Pool(nU, m, K, bounds=interm, cases=done.shape[1])
    stuck = 0  # domains with nothing left to split and no proof
    if interm:
        rl, ru = bd.root_domain_bounds()
        dl, du = rl[None, :].copy(), ru[None, :].copy()
    else:
        dl = du = np.zeros((1, 0))

    def enqueue(score, proven, row, state, split, alpha, beta, dl, du, done, depth):
        nonlocal stuck
        openi = np.flatnonzero(~proven)
        stats["proven"] += int(proven.sum())
        if openi.size == 0:
            return
        sc = branch_scores(bd, state, split, alpha, row,
                           dl if interm else None, du if interm else None)[openi]
        if window:  # only the shallowest `window` layers with open neurons
            fin = np.isfinite(sc)
            first = np.where(fin.any(axis=1), bd.layer_of[np.argmax(fin, axis=1)], bd.L)
            sc[bd.layer_of[None, :] >= first[:, None] + window] = -np.inf
        top = np.argsort(-sc, axis=1)[:, :K]
        topv = np.take_along_axis(sc, top, axis=1)
        top[~np.isfinite(topv)] = -1
        keep = top[:, 0] >= 0
        for i in np.flatnonzero(~keep):
            j = openi[i]
            out = _leaf(j, split, alpha, beta, done[j],
                        bd.chords(dl[j:j + 1], du[j:j + 1]) if interm else None)
            if isinstance(out, np.ndarray):
                return out
            if out:
                stats["proven"] += 1
            else:
                stuck += 1
        sel = openi[keep]
        if sel.size:
            pool.push(score[sel], split[sel], alpha[sel], beta[sel], top[keep], row[sel],
                      dl[sel], du[sel], done[sel], depth[sel])

    def _leaf(i, split, alpha, beta, done, chords=None):
        """A fully split open domain: a counterexample x, True (proven), or False. Every case
        not yet proven (``done`` (G,)) by linear programming; proven when each has
        multipliers (beta) a float64 evaluation confirms."""
        be = np.zeros((1, m, nU))
        for g, (g0, g1) in enumerate(bd.case_rows()):
            if done[g]:
                continue
            out = _leaf_lp(bd, split[i], np.arange(g0, g1))
            if out[0] == "sat":
                return violated(out[1][None, :])
            if out[0] != "beta":
                return False
            be[0, out[1]] = out[2]
        for scale in (1.0, 1.0 + 1e-6, 1.01):
            v = verify64(split[i:i + 1], alpha[i:i + 1], scale * be, chords)
            if np.all((np.maximum.reduceat(v, bd.gstart, axis=1)[0] > 0.0) | done):
                return True
        return False

    xv = enqueue(score, proven, row, state, split, alpha, beta, dl, du, done,
                 np.zeros(1, np.int64))
    if xv is not None:
        return result("sat", xv)
    while len(pool):
        if time.monotonic() >= deadline:
            return result("timeout", worst=pool.worst())
        if len(pool) > max_domains:
            return result("unknown", worst=pool.worst())
        psplit, palpha, pbeta, pcand, prow, pdl, pdu, pdone, pdepth = pool.pop(
            max(1, batch // 2))
        P = psplit.shape[0]
        if K > 1:
            choice = _fsb_choice(bd, psplit, palpha, pbeta, pcand,
                                 bd.chords(pdl, pdu) if interm else None,
                                 prow if bd.gstart.size > 1 else None)
        else:
            choice = pcand[:, 0]
        # children: first half active (+1), second half inactive (-1)
        cs = np.concatenate([psplit, psplit])
        ar = np.arange(P)
        cs[ar, choice] = 1
        cs[P + ar, choice] = -1
        ca = np.concatenate([palpha, palpha])
        cb = np.concatenate([pbeta, pbeta])
        cdl, cdu = np.concatenate([pdl, pdl]), np.concatenate([pdu, pdu])
        cdone = np.concatenate([pdone, pdone])  # a case proven on the parent is on its children
        cdepth = np.concatenate([pdepth, pdepth]) + 1
        chords = None
        if interm:
            ti = time.monotonic()
            start = np.tile(bd.layer_of[choice], 2)
            deep = cdepth >= interm_min_splits if interm_iters > 0 else \
                np.zeros(cs.shape[0], bool)
            empty = np.zeros(cs.shape[0], bool)
            for sel, opt in ((np.flatnonzero(~deep), False), (np.flatnonzero(deep), True)):
                if sel.size == 0:
                    continue
                if opt:
                    out = bd.tighten_opt(cs[sel], cdl[sel], cdu[sel], start[sel],
                                         interm_iters, deadline=deadline,
                                         warm=interm_warm)
                else:
                    out = bd.tighten(cs[sel], cdl[sel], cdu[sel], start[sel],
                                     deadline=deadline)
                cs[sel], cdl[sel], cdu[sel], empty[sel] = out
            stats["t_interm"] += time.monotonic() - ti
            if empty.any():  # no point of the box meets the splits: proven
                stats["proven"] += int(empty.sum())
                stats["empty"] += int(empty.sum())
                stats["domains"] += int(empty.sum())
                keep = ~empty
                cs, ca, cb, cdl, cdu = cs[keep], ca[keep], cb[keep], cdl[keep], cdu[keep]
                cdone, cdepth = cdone[keep], cdepth[keep]
                if cs.shape[0] == 0:
                    continue
            chords = bd.chords(cdl, cdu)
        score, proven, row, state, xv = assess(cs, ca, cb, cdone, iters, chords)
        if xv is not None:
            return result("sat", xv)
        xv = enqueue(score, proven, row, state, cs, ca, cb, cdl, cdu, cdone, cdepth)
        if xv is not None:
            return result("sat", xv)
        stats["peak"] = max(stats["peak"], len(pool))
        if progress is not None:
            progress(stats["domains"], len(pool), float(pool.worst()))
        yield
        if log is not None and stats["batches"] % 20 == 0:
            log(f"batch {stats['batches']}: {stats['domains']} domains, {len(pool)} open, "
                f"worst {pool.worst():.4g}, {time.monotonic() - t0:.1f}s"
                + (f" ({stats['t_interm']:.1f}s interm, {stats['empty']} empty)"
                   if interm else ""))
    if stuck:
        return result("unknown", worst=np.nan)
    return result("unsat", worst=np.inf)


def _leaf_lp(bd: Bounder, split_row, rows=None):
    """A fully split domain and one case (its ``rows`` of A, default all), by linear
    programming (scipy HiGHS). Returns ("sat", x) with x a candidate point (the caller checks
    it in float64), ("beta", row, beta) with the LP's multipliers of the sign constraints for
    row ``row`` (an index into A; the caller proves with a float64 evaluation; any beta >= 0
    is valid), or ("open", None)."""
    from scipy.optimize import linprog

    rows = np.arange(bd.m) if rows is None else np.asarray(rows)
    G, H, C, e = bd.affine(split_row)
    AG, AH = bd.A[rows] @ G, bd.A[rows] @ H - bd.b[rows]
    d, m = G.shape[1], rows.size
    bounds = list(zip(bd.box.lo, bd.box.hi))
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
        spread = np.abs(AG[0]) @ bd.r + abs(AG[0] @ bd.c + AH[0]) + 1.0
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


def _fsb_choice(bd: Bounder, split, alpha, beta, cand, chords=None, prow=None):
    """Filtered smart branching: for each parent, the candidate whose two children (parent's
    alpha, beta and chords, one float32 evaluation) have the best worse child; with ``prow``
    (P,) the children are bounded in that row of each parent only (the row it branches
    for), else by :meth:`Bounder.score` over all rows."""
    P, K = cand.shape
    m = bd.m
    reps = np.repeat(np.arange(P), K)
    c = cand.reshape(-1)
    valid = c >= 0
    cc = np.where(valid, c, 0)
    s1 = split[reps].copy()
    s2 = split[reps].copy()
    ar = np.arange(P * K)
    s1[ar, cc] = 1
    s2[ar, cc] = -1
    S = np.concatenate([s1, s2])
    Ch = None if chords is None else tuple(np.concatenate([c[reps], c[reps]]) for c in chords)
    if prow is None:
        Al = np.concatenate([alpha[reps], alpha[reps]])
        Be = np.concatenate([beta[reps], beta[reps]])
        v = bd.score(bd.evaluate(S, Al, Be, np.float32, chords=Ch))
    else:
        r = prow[reps]
        Al = np.concatenate([alpha[reps, r], alpha[reps, r]])[:, None, :]
        Be = np.concatenate([beta[reps, r], beta[reps, r]])[:, None, :]
        v = bd.evaluate(S, Al, Be, np.float32, chords=Ch, rows=np.concatenate([r, r]))[:, 0]
    worse = np.minimum(v[:P * K], v[P * K:])
    worse[~valid] = -np.inf
    best = np.argmax(worse.reshape(P, K), axis=1)
    return cand[np.arange(P), best]
