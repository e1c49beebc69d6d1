"""Cutting planes for ReLU splitting, inferred from the search's own proofs (the BICCOS idea).

A domain of ReLU splitting is a set S of sign decisions (neuron j active, z_j = 1, or inactive,
z_j = 0). When a domain is proven, no counterexample of the box meets every decision of S: every
counterexample's neurons disagree with S somewhere, which on the indicators z reads

    sum_{j in S, active} (1 - z_j) + sum_{j in S, inactive} z_j >= 1,

a cut that holds at every counterexample of the whole box (the MILP's integer points), not only
on S's subtree. :class:`Cuts` holds them as ``K z + e <= 0`` (K: +1 on S's active neurons, -1
on its inactive ones; e = 1 - #active). Their multipliers mu >= 0 enter a domain's bound as
the Lagrangian term ``mu . (K z + e)`` (<= 0 at every counterexample), so the rows' lower bound
over the relaxation plus that term still bounds every counterexample from below.

The term gives each unstable neuron j a coefficient ``c_j = (mu K)_j`` on z_j besides the row's
coefficient ``a_j`` on y_j = relu(x_j). Over the big-M (for one neuron: exact) relaxation of
``l <= x <= u``, whose vertices are (x, y, z) = (l, 0, 0), (0, 0, 0), (0, 0, 1), (u, u, 1),
``h(x) = min a y + c z`` is convex and piecewise linear with h(l) = 0, h(u) = a u + c and

    h(0) = h0 = min(0, c, (a u + c) L / (u + L)),        L = -l,

so every line through (0, h0) with a slope between h0 / L and (a u + c - h0) / u lies below it
(:func:`cut_lines`; the slope's place in that range is the row's alpha). With c = 0 this is
CROWN's relaxation exactly: slope alpha * a for a >= 0, the chord for a < 0.

A proven domain with fewer decisions gives a stronger cut. :func:`weaker_sets` proposes, from a
proven domain, the decisions whose multipliers were used (and the deepest ones); the search
proves them as domains of their own before they become cuts.
"""
from __future__ import annotations

import numpy as np

from crown_cli.engine.input_sets import box_lower
from crown_cli.engine.rounding import U64, gamma_n

# absolute allowance per neuron line in float64 (underflow in its products)
_TINY = 1e-290


class Cuts:
    """Cuts ``P v + K z + e <= 0`` over the indicators z of a bounder's ``nU`` unstable
    neurons and (with ``n_terms``, the input's size plus every hidden neuron's) the values v
    of the input and of every hidden neuron's output, in layer order; at most ``cap`` of them
    (a dropped cut only loosens bounds; see :meth:`_drop`). A proven domain's cut
    (:meth:`add`) has no v terms; :meth:`add_general` takes any cut the caller knows valid at
    every counterexample (e.g. a single neuron's convex-hull inequality). Each cut has a
    serial number (the count of cuts added before it): :meth:`held` lists those held, in
    order (a multiplier array's columns). Rows are kept sparse; ``K``, ``e``, ``P`` and ``decision`` are
    arrays built when asked for."""

    def __init__(self, nU: int, cap: int = 64, n_terms: int = 0):
        self.nU, self.cap, self.n_terms = nU, cap, n_terms
        self._k = []  # per cut: its K row as (columns, values)
        self._p = []  # per cut: its P row as (columns, values) (with n_terms)
        self._e = []
        self._dec = []  # per cut: from a proven domain's decisions
        self._key = []  # per cut: the key it was added with (or None)
        self._seen = set()  # the decision sets ever added
        self._held = {}  # key -> serial of the general cuts held
        self._ser = []  # per cut: its serial number
        # optional: () -> the serials something still refers to (dropped last)
        self.in_use = None
        self._arrays = {}
        self.serial = 0  # cuts ever added

    def __len__(self):
        return len(self._e)

    def held(self) -> np.ndarray:
        """The serial numbers of the cuts held, ascending (int64): column j of a multiplier
        array on every held cut is the cut ``held()[j]``."""
        return self._array("held", lambda: np.array(self._ser, np.int64))

    def positions(self, serials) -> np.ndarray:
        """The columns of the held cuts ``serials`` (each must be held)."""
        return np.searchsorted(self.held(), np.asarray(serials, np.int64))

    def _array(self, name, make):
        if name not in self._arrays:
            self._arrays[name] = make()
        return self._arrays[name]

    def _dense_k(self, rows):
        K = np.zeros((len(rows), self.nU))
        for i, (c, v) in enumerate(rows):
            K[i, c] = v
        return K

    @property
    def K(self) -> np.ndarray:
        """The cuts' terms on z, (nC, nU) float64."""
        return self._array("K", lambda: self._dense_k(self._k))

    def K_csr(self, dtype=np.float64):
        """K as a CSR matrix (nC, nU) of ``dtype`` (a single-neuron cut has one entry)."""
        return self._array(("K_csr", np.dtype(dtype).name),
                           lambda: _csr_rows(self._k, self.nU, dtype))

    def P_blocks(self, offsets, dtype=np.float64):
        """P's columns split at ``offsets`` (the values' layers, :func:`value_offsets`), each
        block transposed as a CSR matrix (n_block, nC) of ``dtype`` (a row's gradient on a
        layer's values times it gives d/d mu)."""
        cuts = np.r_[0, np.asarray(offsets, np.int64)]
        key = ("P_blocks", np.dtype(dtype).name, cuts.tobytes())

        def make():
            P = self.P.tocsc().astype(dtype)
            return [P[:, a:b].T.tocsr() for a, b in zip(cuts[:-1], cuts[1:])]
        return self._array(key, make)

    def P_as(self, dtype):
        """P (a CSR matrix) of ``dtype``."""
        if np.dtype(dtype) == np.float64:
            return self.P
        return self._array(("P", np.dtype(dtype).name), lambda: self.P.astype(dtype))

    @property
    def e(self) -> np.ndarray:
        return self._array("e", lambda: np.array(self._e, np.float64))

    @property
    def decision(self) -> np.ndarray:
        """Per cut: whether it is a proven domain's decisions (:meth:`add`)."""
        return self._array("decision", lambda: np.array(self._dec, bool))

    @property
    def P(self):
        """The cuts' terms on the values, a (nC, n_terms) CSR matrix (None without
        ``n_terms``)."""
        if not self.n_terms:
            return None
        return self._array("P", lambda: _csr_rows(self._p, self.n_terms, np.float64))

    def _append(self, p, k, e, decision, key=None):
        self._ser.append(self.serial)
        self.serial += 1
        k = np.asarray(k, np.float64)
        self._k.append((np.flatnonzero(k), k[k != 0.0]))
        self._e.append(float(e))
        self._dec.append(bool(decision))
        self._key.append(key)
        if self.n_terms:
            if p is None:
                p = (np.zeros(0, np.int64), np.zeros(0))
            elif not isinstance(p, tuple):
                p = np.asarray(p, np.float64)
                p = (np.flatnonzero(p), p[p != 0.0])
            self._p.append((np.asarray(p[0], np.int64), np.asarray(p[1], np.float64)))
        if key is not None and not decision:
            self._held[key] = self.serial - 1
        self._arrays.clear()
        if len(self._e) > self.cap:
            self._drop()

    _LISTS = ("_k", "_p", "_e", "_dec", "_key", "_ser")

    def _drop(self):
        """Over the cap: the oldest cuts dropped, those that ``in_use`` does not name first
        (down to 7/8 of the cap then, so that ``in_use`` runs once per cap/8 cuts added)."""
        n = len(self._e)
        if self.in_use is None:
            gone = range(n - self.cap)  # a prefix: deleted in place below
        else:
            want = n - (self.cap - self.cap // 8)
            used = np.isin(np.array(self._ser, np.int64),
                           np.asarray(self.in_use(), np.int64))
            order = np.r_[np.flatnonzero(~used), np.flatnonzero(used)]  # oldest first in each
            gone = np.sort(order[:want]).tolist()
        for i in gone:
            old = self._key[i]
            if old is not None and self._held.get(old) == self._ser[i]:
                del self._held[old]
        if isinstance(gone, range):
            for name in self._LISTS:
                del getattr(self, name)[:len(gone)]
        else:
            keep = np.ones(n, bool)
            keep[gone] = False
            for name in self._LISTS:
                lst = getattr(self, name)
                if lst:
                    setattr(self, name, [x for x, k in zip(lst, keep) if k])
        self._arrays.clear()

    def add_general(self, p, k, e, key=None):
        """The cut ``p . v + k . z + e <= 0`` (p: (n_terms,) or (columns, values); k: (nU,));
        False if ``key`` (any hashable) names a cut held now."""
        if not self.n_terms:
            raise ValueError("cuts: made without terms on the neurons' values (n_terms)")
        if key is not None and key in self._held:
            return False
        self._append(p, k, e, False, key)
        return True

    def serial_of(self, key):
        """The serial number of the held general cut added with ``key``, or None."""
        return self._held.get(key)

    def add(self, split_row) -> bool:
        """The cut of a proven domain's decisions ``split_row`` (nU,) in {-1, 0, +1}; False if
        it was added before or has no decision."""
        s = np.asarray(split_row, np.int8)
        key = s.tobytes()
        if not s.any() or key in self._seen:
            return False
        self._seen.add(key)
        self._append(None, s.astype(np.float64), 1.0 - float(np.sum(s > 0)), True)
        return True

    def subset(self, cols) -> "Cuts":
        """The held cuts of positions ``cols`` (ascending), as cuts of their own (for one
        batch's bound: its columns are the multipliers')."""
        out = Cuts(self.nU, max(1, len(cols)), self.n_terms)
        for c in np.asarray(cols, np.int64).tolist():
            out._k.append(self._k[c])
            out._e.append(self._e[c])
            out._dec.append(self._dec[c])
            out._key.append(None)
            if self.n_terms:
                out._p.append(self._p[c])
        out._ser = list(range(len(out._e)))
        out.serial = len(out._e)
        return out

    def contains(self, split) -> np.ndarray:
        """Per domain of ``split`` (B, nU): whether it holds every decision of some cut (it is
        then a subdomain of a proven domain: proven)."""
        if not any(self._dec) or split.shape[0] == 0:
            return np.zeros(split.shape[0], bool)
        K = self._array("K_decision", lambda: self._dense_k(
            [k for k, dec in zip(self._k, self._dec) if dec]))
        hits = (split.astype(np.float64) @ K.T)  # decisions agreeing minus disagreeing
        return np.any(hits >= np.abs(K).sum(axis=1)[None, :], axis=1)


def _csr_rows(rows, ncols, dtype):
    """Sparse rows [(columns, values), ...] as a CSR matrix (len(rows), ncols) of ``dtype``."""
    import scipy.sparse as sps

    ind = [c for c, _ in rows]
    ptr = np.cumsum([0] + [c.size for c in ind])
    return sps.csr_matrix(
        (np.concatenate([v for _, v in rows]).astype(dtype) if rows else np.zeros(0, dtype),
         np.concatenate(ind) if ind else np.zeros(0, np.int64), ptr), shape=(len(rows), ncols))


def sparse_multipliers(mu, serials, keep: int, mask=None):
    """The ``keep`` largest multipliers of each (domain, row) of ``mu`` (B, m, nC), whose
    columns are the cuts of ``serials`` (nC,): (values (B, m, keep) float32, serials (B, m,
    keep) int32, -1 where none), as a domain's children start from them
    (:func:`dense_multipliers`). Only positive ones are kept, or with ``mask`` (B, m, nC)
    the masked-in ones (positive first, then those at 0)."""
    B, m, nC = mu.shape
    val = np.zeros((B, m, keep), np.float32)
    ser = np.full((B, m, keep), -1, np.int32)
    k = min(keep, nC)
    if k == 0:
        return val, ser
    score = np.where(mask, mu, -1.0) if mask is not None else np.where(mu > 0.0, mu, -1.0)
    idx = np.argpartition(-score, k - 1, axis=2)[..., :k] if k < nC else \
        np.broadcast_to(np.arange(nC), (B, m, nC))
    sc = np.take_along_axis(score, idx, axis=2)
    v = np.take_along_axis(mu, idx, axis=2)
    val[..., :k] = np.where(sc >= 0.0, np.maximum(v, 0.0), 0.0)
    ser[..., :k] = np.where(sc >= 0.0, np.asarray(serials, np.int64)[idx], -1)
    return val, ser


def dense_multipliers(serials, val, ser, B: int, m: int):
    """Multipliers (B, m, nC) float32 on the cuts of ``serials`` (nC,) ascending, from
    sparse ones (:func:`sparse_multipliers`; None: zeros), and the mask (B, m, nC) of the
    entries given (a cut not among ``serials`` gets none)."""
    serials = np.asarray(serials, np.int64)
    mu = np.zeros((B, m, serials.size), np.float32)
    mask = np.zeros((B, m, serials.size), bool)
    if val is None or val.shape[-1] == 0 or serials.size == 0:
        return mu, mask
    col = np.minimum(np.searchsorted(serials, ser), serials.size - 1)
    ok = (ser >= 0) & (serials[col] == ser)
    b, r, _ = np.nonzero(ok)
    mu[b, r, col[ok]] = val[ok]
    mask[b, r, col[ok]] = True
    return mu, mask


def merge_new_cuts(val, ser, new):
    """A domain's sparse multipliers (m, keep) with the cuts of serials ``new`` added at 0
    to every row (in place): in the free slots first, then in place of those at 0, then of
    the smallest."""
    for r in range(ser.shape[0]):
        have = set(ser[r].tolist())
        fresh = np.array([c for c in new if c not in have], np.int64)  # in the given order
        if fresh.size == 0:
            continue
        used = np.flatnonzero(ser[r] >= 0)
        slots = np.r_[np.flatnonzero(ser[r] < 0), used[np.argsort(val[r, used], kind="stable")]]
        n = min(slots.size, fresh.size)
        ser[r, slots[:n]] = fresh[:n]
        val[r, slots[:n]] = 0.0


def cut_lines(a, c, t, l, u, verified: bool):
    """The lower line ``s x + b`` of ``min a y + c z`` over one unstable ReLU's relaxation
    (module docstring): per entry the row's coefficients ``a`` (on y) and ``c`` (on z), the
    place ``t`` in [0, 1] of the slope in its range, the bounds ``l < 0 < u``. Returns (s, b,
    piece, lo_slope, hi_slope): ``piece`` which term gave h0 (0: 0, 1: c, 2: the chord's).
    ``verified``: b is rounded so that the line is below h in exact arithmetic for the
    floats a, c, l, u and the returned s (float64); else b = h0 (an estimate)."""
    L = -l
    w = L / (u + L)
    au = a * u
    v3 = (au + c) * w
    zero = np.zeros_like(v3)
    h0 = np.minimum(np.minimum(zero, c), v3)
    piece = np.where(h0 == v3, 2, np.where(h0 == c, 1, 0)).astype(np.int8)
    # on the chord's piece h is linear: both ends are (a u + c) / (u + L), without the
    # cancellation of (a u + c - h0) / u
    chord = (au + c) / (u + L)
    lo_s = np.where(piece == 2, chord, h0 / L)
    hi_s = np.where(piece == 2, chord, (au + c - h0) / u)
    s = lo_s + t * (hi_s - lo_s)
    if not verified:
        return s, h0, piece, lo_s, hi_s
    # b <= min(s L, h0, a u + c - s u) exactly: each term's rounding (at most a few units of
    # the magnitudes below) taken off
    b = np.minimum(np.minimum(s * L, h0), au + c - s * u)
    mag = np.abs(au) + np.abs(c) + np.abs(s) * (u + L)
    return s, b - (8.0 * U64) * mag - _TINY, piece, lo_s, hi_s


def _unstable_bounds(bd, bounds, N, m):
    """Per evaluated (domain, row): the unstable neurons' (l, u) (N, nU) float64."""
    if bounds is None:
        lo, hi = bd.root_domain_bounds()
        return np.broadcast_to(lo, (N, bd.nU)), np.broadcast_to(hi, (N, bd.nU))
    dl, du = (np.asarray(x, np.float64) for x in bounds)
    if m > 1:
        dl, du = np.repeat(dl, m, axis=0), np.repeat(du, m, axis=0)
    return dl, du


def evaluate_cuts(bd, split, alpha, beta, mu, dtype=np.float64, keep=False, bounds=None,
                  rows=None, verified=True):
    """:meth:`Bounder.evaluate` with the cuts ``bd.cuts`` and their multipliers ``mu``
    (B, m, nC) (or (B, 1, nC) with ``rows``), ReLU only: lower bounds (B, m) of the rows on
    the subdomains' counterexamples. ``bounds``: per domain (l, u) (B, nU) of the unstable
    neurons (default the root's). ``keep``: also the tape for :func:`gradient_cuts`.
    ``verified`` False (tests of the gradient): the float64 lines' intercepts unrounded."""
    if bd.leak != 0.0:
        raise ValueError("cuts: ReLU networks only")
    cuts = bd.cuts
    f64 = np.dtype(dtype) == np.float64
    dt = np.float64 if f64 else np.float32
    B, m = split.shape[0], (bd.m if rows is None else 1)
    N = B * m
    sp = np.repeat(split, m, axis=0) if m > 1 else split
    al = alpha.reshape(N, bd.nU).astype(dt, copy=False)
    be = beta.reshape(N, bd.nU).astype(dt, copy=False)
    M = np.maximum(np.asarray(mu, dt).reshape(N, len(cuts)), 0.0)
    C = np.asarray(M @ cuts.K_csr(dt))  # each unstable neuron's coefficient on z
    P = cuts.P
    MP = None if P is None else np.asarray(M @ cuts.P_as(dt))  # the coefficients on v
    g = gamma_n(max(len(cuts), 1) + 1, U64)
    lo, hi = _unstable_bounds(bd, bounds, N, m)
    acc = bd.top_rows(B, rows, dt)
    Me = M @ cuts.e
    acc.const = acc.const + Me
    if f64:
        acc.mag = acc.mag + np.abs(Me)
        # C and M e as computed against their exact values: |z| <= 1
        absM = np.abs(M)
        acc.charge = acc.charge + g * (np.asarray(absM @ abs(cuts.K_csr())).sum(axis=1)
                                       + absM @ np.abs(cuts.e))
    tape = []
    hoff = value_offsets(bd)
    absMP = np.asarray(np.abs(M) @ abs(P)) if (f64 and P is not None) else None
    for k in range(bd.L - 1, -1, -1):
        cols = bd.ucols[k]
        o0, o1 = bd.offsets[k], bd.offsets[k + 1]
        if MP is not None:
            _add_terms(acc, MP[:, hoff[k]:hoff[k + 1]], absMP, hoff[k], hoff[k + 1],
                       _value_bound(bd, k), g, f64, dt)
        Lam = acc.Lam
        Lu = np.asarray(Lam[:, cols], dt)
        s_k = sp[:, o0:o1]
        free = s_k == 0
        ck = C[:, o0:o1]
        lk, uk = lo[:, o0:o1], hi[:, o0:o1]
        if f64 and np.any(free & ~((lk < 0.0) & (uk > 0.0))):
            raise ValueError("cuts: an unsplit neuron is not unstable on its domain")
        # float32 (steering): the lines in float32 too; float64: as verified
        lk = np.where(free, lk, -1.0).astype(dt, copy=False)
        uk = np.where(free, uk, 1.0).astype(dt, copy=False)
        s, b, piece, lo_s, hi_s = cut_lines(Lu, ck, al[:, o0:o1].astype(dt, copy=False), lk,
                                            uk, f64 and verified)
        Du = np.where(free, s, Lu * (s_k > 0) - s_k * be[:, o0:o1])
        icpt = np.where(free, b, np.where(s_k > 0, ck, 0.0))
        ss = bd.stable_slope[k] if f64 else bd.ss32[k]
        D = Lam * ss
        D[:, cols] = Du.astype(dt)
        bd.back_step(acc, k, D, icpt.astype(dt), f64, bd.rw[k] if f64 else None)
        if keep:
            tape.append((Lu, ck, al[:, o0:o1], lk, uk, piece, lo_s, hi_s, free, s_k))
    if MP is not None:
        _add_terms(acc, MP[:, :hoff[0]], absMP, 0, hoff[0],
                   np.maximum(np.abs(bd.box.lo), np.abs(bd.box.hi)), g, f64, dt)
    Lam, const = acc.Lam, acc.const
    if f64:
        out = box_lower(Lam, const, acc.mag, acc.charge, bd.c, bd.r, bd.net.fp_rtol)
    else:
        out = (Lam @ bd.c32).astype(np.float64) - (np.abs(Lam) @ bd.r32) + const
    out = out.reshape(B, m)
    if keep:
        tape.reverse()
        return out, (tape, Lam)
    return out


def _value_bound(bd, k):
    """|v| <= this on hidden layer k's outputs over the box (ReLU of the root bounds)."""
    return np.maximum(bd.bounds[k][1], 0.0)


def _add_terms(acc, MPk, absMP, c0, c1, vbound, g, f64, dt):
    """The cuts' terms on one layer's values (columns c0:c1 of P) added to the rows over
    them; in float64 the rounding of ``mu P`` (gamma of |mu| |P|) and of the sum (u of its
    result) charged against the values' bound."""
    Lam = acc.Lam + MPk.astype(dt)
    if f64:
        err = g * absMP[:, c0:c1] + U64 * np.abs(Lam)
        acc.charge = acc.charge + err @ vbound
    acc.Lam = Lam


def gradient_cuts(bd, state):
    """d(sum of the bounds)/d alpha, d beta (each (N, nU)) and d mu (N, nC) from
    :func:`evaluate_cuts`'s tape."""
    tape, Lam_in = state
    dt = Lam_in.dtype
    f64 = dt == np.float64
    N = Lam_in.shape[0]
    c, r = (bd.c, bd.r) if f64 else (bd.c32, bd.r32)
    G = (c - np.sign(Lam_in) * r).astype(dt)
    gA = np.zeros((N, bd.nU), dt)
    gB = np.zeros((N, bd.nU), dt)
    gC = np.zeros((N, bd.nU), dt)
    cuts = bd.cuts
    Pb = None if cuts.P is None else cuts.P_blocks(value_offsets(bd), dt)
    gM = np.zeros((N, len(cuts)), dt)
    if Pb is not None:  # d out / d (terms on the input) = G at the input
        gM += np.asarray(G @ Pb[0])
    for k in range(bd.L):
        gD = bd.forward_grad(G, k, f64)
        Lu, ck, t, lk, uk, piece, lo_s, hi_s, free, s_k = tape[k]
        o0, o1 = bd.offsets[k], bd.offsets[k + 1]
        cols = bd.ucols[k]
        t = t.astype(dt, copy=False)
        gDu = gD[:, cols]
        L = -lk
        w = L / (uk + L)
        dh_da = np.where(piece == 2, uk * w, 0.0)
        dh_dc = np.where(piece == 2, w, np.where(piece == 1, 1.0, 0.0))
        ds_da = (1.0 - t) * dh_da / L + t * (uk - dh_da) / uk
        ds_dc = (1.0 - t) * dh_dc / L + t * (1.0 - dh_dc) / uk
        gA[:, o0:o1] = np.where(free, gDu * (hi_s - lo_s), 0.0)
        gB[:, o0:o1] = gDu * (-s_k)
        gC[:, o0:o1] = np.where(free, dh_dc + gDu * ds_dc, (s_k > 0).astype(dt))
        if k + 1 < bd.L or Pb is not None:
            G = gD * (bd.stable_slope[k] if f64 else bd.ss32[k])
            G[:, cols] = np.where(free, dh_da + gDu * ds_da, gDu * (s_k > 0))
            if Pb is not None:  # G is d out / d (rows over layer k's values)
                gM += np.asarray(G @ Pb[k + 1])
    gM += np.asarray(gC @ cuts.K_csr(dt).T) + cuts.e.astype(dt)
    return gA, gB, gM


def weaker_sets(split_row, beta_row, depth_order=None, keep_last: int = 3):
    """Smaller decision sets to try as cuts, from a proven domain's decisions ``split_row``
    (nU,) and its proving row's split multipliers ``beta_row`` (nU,): the decisions whose
    multiplier is positive, and (with ``depth_order``, the decisions' neurons from first to
    last) the last ``keep_last``. Only sets smaller than the domain's and not empty."""
    s = np.asarray(split_row, np.int8)
    n = int(np.count_nonzero(s))
    out = []
    used = np.where((s != 0) & (np.asarray(beta_row) > 0.0), s, 0).astype(np.int8)
    if 0 < np.count_nonzero(used) < n:
        out.append(used)
    if depth_order is not None and n > keep_last:
        last = np.zeros_like(s)
        tail = np.asarray(depth_order)[-keep_last:]
        last[tail] = s[tail]
        if not any(np.array_equal(last, o) for o in out):
            out.append(last)
    return out


def value_offsets(bd) -> np.ndarray:
    """Where the layers' values lie among a cut's terms: the input's end at ``[0]``, hidden
    layer k's run from ``[k]`` to ``[k + 1]``."""
    return np.cumsum([bd.box.lo.size] + [w.shape[0] for w in bd.weights[:-1]])


def _hull_z_coefficient(w, Lb, Ub, inI, b):
    """The constants of the cut ``y - sum_I w_i v_i - C z + D <= 0`` rounded so that it holds
    in exact arithmetic for the floats w, b, Lb, Ub: it holds at z = 0 (y = 0) iff D <= sum_I
    w_i Lb_i, at z = 1 (y = w . v + b) iff C >= D + b + sum_{not I} w_i Ub_i; each sum is
    moved outward by gamma of its absolute terms. Returns (C, D)."""
    a = w[inI] * Lb[inI]
    D = float(np.sum(a))
    D -= gamma_n(a.size + 2, U64) * float(np.sum(np.abs(a))) + _TINY
    o = w[~inI] * Ub[~inI]
    C = D + b + float(np.sum(o))
    C += gamma_n(o.size + 4, U64) * (abs(D) + abs(b) + float(np.sum(np.abs(o)))) + _TINY
    return C, D


def _csr(bd, k):
    """Hidden layer k's weights as a CSR matrix (the bounder's own when it keeps one)."""
    import scipy.sparse as sps

    cache = bd.__dict__.setdefault("_cut_csr", {})
    if k not in cache:
        cache[k] = bd.Wmul[k] if sps.issparse(bd.Wmul[k]) else sps.csr_matrix(bd.weights[k])
    return cache[k]


def relaxed_point_state(bd, state, split):
    """:func:`evaluate_cuts`'s tape ``state`` (one row per domain ``split`` (N, nU)) as the
    tape :func:`separate_neuron_cuts` reads: the relaxed point of the bound *with* the cuts.
    The minimising corner of its input coefficients; an unstable free neuron on its upper
    chord where its line came from the chord's piece of ``min a y + c z`` (piece 2: with
    c = 0, a negative coefficient, CROWN's upper line), else on its lower slope; split
    neurons exact."""
    tape, Lam_in = state
    N = Lam_in.shape[0]
    sp = np.repeat(split, N // split.shape[0], axis=0) if N != split.shape[0] else split
    out, ctr = [], np.zeros((N, bd.nU))
    for k in range(bd.L):
        Lu, ck, al, lk, uk, piece, lo_s, hi_s, free, s_k = tape[k]
        o0, o1 = bd.offsets[k], bd.offsets[k + 1]
        Lam_k = np.zeros((N, bd.weights[k].shape[0]))
        Lam_k[:, bd.ucols[k]] = Lu
        upper = free & (piece == 2)
        lk, uk = np.asarray(lk, np.float64), np.asarray(uk, np.float64)
        chord = uk / (uk - lk)
        slope = np.where(free, np.where(upper, chord, np.asarray(al, np.float64)),
                         (s_k > 0).astype(np.float64))
        ctr[:, o0:o1] = np.where(upper, -chord * lk, 0.0)
        out.append((Lam_k, ~upper, slope))
    return out, np.asarray(Lam_in, np.float64), sp, ctr


def separate_neuron_cuts(bd, state, bounds, take: int, rows=None, chunk: int = 1 << 21):
    """Anderson et al.'s single-neuron inequalities ``y <= sum_{i in I} w_i (v_i - Lb_i (1 -
    z)) + (b + sum_{i not in I} w_i Ub_i) z`` (the convex hull of one ReLU over a box of its
    inputs, Lb/Ub the input's root bounds on the side w_i's sign picks: valid on every
    domain) most violated at the relaxed points of the evaluated rows of ``state`` (a
    :meth:`Bounder.evaluate` tape): the minimising corner pushed through each neuron's line,
    z on the chord's triangle point. Only free neurons whose row took the upper line. Returns
    up to ``take`` cuts as (p, k, e, key) for :meth:`Cuts.add_general`, the largest
    violation times the row's coefficient first. ``bounds``: per evaluated row the unstable
    neurons' (l, u) (N, nU), or None (the root's). ``rows``: only these evaluated rows.
    ``chunk``: weights gathered per step (the neurons' rows, as sparse entries)."""
    tape, Lam_in, sp, ctr = state
    N = Lam_in.shape[0]
    sel = np.arange(N) if rows is None else np.asarray(rows, np.int64)
    hoff = value_offsets(bd)
    v = np.where(Lam_in[sel] > 0.0, bd.box.lo, bd.box.hi).astype(np.float64)
    if bounds is None:
        lo_u, hi_u = _unstable_bounds(bd, None, sel.size, 1)
    else:
        lo_u, hi_u = bounds[0][sel], bounds[1][sel]
    found = []
    for k in range(bd.L):
        b = bd.biases[k]
        Wc = _csr(bd, k)
        pre = np.asarray(Wc @ v.T).T + b
        Lam_k = np.asarray(tape[k][0], np.float64)[sel]
        pos, slope = tape[k][1][sel], tape[k][2][sel]
        y = pre * bd.stable_slope[k]
        cols = bd.ucols[k]
        o0, o1 = bd.offsets[k], bd.offsets[k + 1]
        upper = (sp[sel, o0:o1] == 0) & ~pos
        y[:, cols] = slope * pre[:, cols] + np.where(upper, ctr[sel, o0:o1], 0.0)
        if k == 0:
            lo_in, hi_in, base = bd.box.lo, bd.box.hi, 0
        else:
            l0, u0 = bd.bounds[k - 1]
            lo_in, hi_in, base = np.maximum(l0, 0.0), np.maximum(u0, 0.0), hoff[k - 1]
        r_all, t_all = np.nonzero(upper)
        nnz_row = np.diff(Wc.indptr)
        start = 0
        while start < r_all.size:  # candidates in chunks of at most `chunk` weights
            sizes = np.cumsum(nnz_row[cols[t_all[start:]]])
            stop = start + max(1, int(np.searchsorted(sizes, chunk)))
            r_idx, t_idx = r_all[start:stop], t_all[start:stop]
            start = stop
            j = cols[t_idx]
            l, u = lo_u[r_idx, o0 + t_idx], hi_u[r_idx, o0 + t_idx]
            z = np.clip((pre[r_idx, j] - l) / (u - l), 0.0, 1.0)
            sub = Wc[j]  # (C, n_in) sparse: the neurons' weights
            owner = np.repeat(np.arange(j.size), np.diff(sub.indptr))
            ci, w = sub.indices, sub.data
            Lb = np.where(w >= 0.0, lo_in[ci], hi_in[ci])
            Ub = np.where(w >= 0.0, hi_in[ci], lo_in[ci])
            t_in = w * (v[r_idx[owner], ci] - Lb * (1.0 - z[owner]))
            t_out = w * Ub * z[owner]
            rhs = np.bincount(owner, np.minimum(t_in, t_out), minlength=j.size) + b[j] * z
            viol = y[r_idx, j] - rhs
            score = viol * np.abs(Lam_k[r_idx, j])
            ok = np.flatnonzero(viol > 1e-6 * (1.0 + np.abs(y[r_idx, j])))
            if ok.size > take:  # only the chunk's best can be among the best overall
                ok = ok[np.argpartition(-score[ok], take - 1)[:take]]
            inside = t_in < t_out
            for c in ok:
                e0, e1 = sub.indptr[c], sub.indptr[c + 1]
                # copies: views would keep the whole chunk's arrays alive
                found.append((score[c], k, j[c], o0 + t_idx[c], ci[e0:e1].copy(),
                              inside[e0:e1].copy(), w[e0:e1].copy(), Lb[e0:e1].copy(),
                              Ub[e0:e1].copy(), b[j[c]], base))
        found.sort(key=lambda f: -f[0])
        del found[take:]  # the best so far, largest first: at most `take` kept
        v = y
    out, seen = [], set()
    for _, k, j, g, ci, inI, w, Lb, Ub, bj, base in found:
        key = ("neuron", int(k), int(j), ci[inI].tobytes())
        if key in seen:
            continue
        seen.add(key)
        cols_ = np.r_[hoff[k] + j, base + ci[inI]]
        vals = np.r_[1.0, -w[inI]]
        C, D = _hull_z_coefficient(w, Lb, Ub, inI, bj)
        kz = np.zeros(bd.nU)
        kz[g] = -C
        out.append(((cols_, vals), kz, D, key))
        if len(out) == take:
            break
    return out
