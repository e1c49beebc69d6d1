"""Input-splitting branch and bound on a graph network (few inputs):
:func:`graph_input_split_steps`.

The search is the dense engine's (:mod:`crown_cli.verification.bab.input_split`: rounds on
the worst open boxes, the "trial" split rule, the candidate points, the shares proven); only
its bounds are the graph engine's (:class:`GraphBoxes`). On graphs that take forward
intermediate bounds (:func:`~crown_cli.engine.graph_forward.prefer_forward`: at most 32
inputs, no max pool) every box of a round is bounded at once
(:class:`~crown_cli.engine.graph_forward.ForwardBoxes`: the same bounds as one box's
``GraphBounds(intermediate="forward")``, in chunks of :data:`BATCH_BYTES`), and where a box
is small, rounds are wide (:data:`WIDE_BATCH` boxes); other
graphs bound one box at a time (a :class:`~crown_cli.engine.graph_bounds.GraphBounds`
each, :data:`GRAPH_BATCH` boxes a round) and tighten the open boxes' best row by
:func:`~crown_cli.engine.graph_alpha.alpha_lower`. The rows are carried to the input for
the split rule and the candidate corners. A box is closed when some row has a
float64-verified lower bound of ``A_i f(x)`` above ``b_i`` rounded up one ulp, or a
combination of its two best rows does (:func:`pair_weights`, :func:`combined_score`: a
point violating the case meets both rows, so it meets any combination of them with
nonnegative weights; the VNN-LIB conjunctions of lsnc's controllers, where one row bounds a
Lyapunov level and the other a step). ``sat`` needs a point of the box whose float64 forward
pass satisfies every row (:func:`crown_cli.verification.outcome.violations_of`). The search
runs in one process.

Arrays in, result out: no files and no printing.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from crown_cli.engine.graph_alpha import ITERS, LR, alpha_lower
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.graph_forward import ForwardBoxes
from crown_cli.engine.input_sets import Box
from crown_cli.verification.bab.input_split import InputSplitOptions, BoxSearch
from crown_cli.graph.sign_check import decided_outputs
from crown_cli.verification.outcome import BabResult, finish, violations_of

MAX_OPEN = 100_000  # more open boxes than this: unknown
COMBOS = 64  # a pair of rows is combined with a weight j / COMBOS (exact on small integers)
BATCH_BYTES = 256 * 2 ** 20  # boxes bounded at once (ForwardBoxes) within about this much
WIDE_CHUNK = 256  # boxes that must fit in BATCH_BYTES for wide rounds:
WIDE_BATCH = 256  # their open boxes per round
GRAPH_BATCH = 16  # open boxes per round (each bounds its halves along 4 candidate dimensions)


class GraphBoxes:
    """Input splitting's bounds on a graph (:class:`~crown_cli.verification.bab.
    input_split.DenseBoxes`' methods): per box a :class:`GraphBounds`, the rows' bounds and
    their coefficients over the input; ``alpha_iters`` steps of alpha-CROWN on an open box's
    best row (0: none). No hidden bounds are inherited (every box's are its own)."""

    inherit = False

    def __init__(self, graph, search, deadline: float, alpha_iters: int):
        self.graph, self.search = graph, search  # its arrays: lo0, hi0, A, b, b_up
        self.deadline, self.alpha_iters = deadline, alpha_iters
        from crown_cli.engine.graph_forward import prefer_forward

        # few inputs: every box's intermediate bounds by the forward pass; small boxes all
        # at once (ForwardBoxes), large ones (a generator's) one by one on the fused kernels
        self.intermediate = "forward" if prefer_forward(graph) else "crown"
        self.batched = at_once(graph)

    def bound(self, L, H, PB=None):
        """Per box: the rows' bounds lb - b_up, their input coefficients (n, rows, d), the
        score, and the boxes' GraphBounds or their :class:`~crown_cli.engine.graph_forward.
        ForwardBoxes` (for :meth:`refine`)."""
        q = self.search
        n, m = L.shape[0], q.A.shape[0]
        if self.batched:  # the boxes at once, in chunks within BATCH_BYTES
            step = max(1, int(BATCH_BYTES // ForwardBoxes.box_bytes(self.graph)))
            chunks = [(k, ForwardBoxes(self.graph, L[k:k + step], H[k:k + step],
                                       deadline=self.deadline)) for k in range(0, n, step)]
            outs = [fb.lower(q.A) for _, fb in chunks]
            lb = np.concatenate([o[0] for o in outs]) - q.b_up
            Lam = np.concatenate([o[1] for o in outs])
            s = np.max(lb, axis=1) if m else np.full(n, -np.inf)
            return lb, Lam, s, {"batch": chunks, "Lam": Lam}
        lb, Lam, gbs = np.empty((n, m)), np.empty((n, m, L.shape[1])), []
        for i in range(n):
            gb = GraphBounds(self.graph, *Box(L[i], H[i]).args(), deadline=self.deadline,
                             intermediate=self.intermediate)
            lb[i], Lam[i] = gb.lower(self.graph.output, q.A, rows=True)
            gbs.append(gb)
        lb = np.where(np.isnan(lb), -np.inf, lb - q.b_up)  # a NaN bound proves nothing
        s = np.max(lb, axis=1) if m else np.full(n, -np.inf)
        return lb, Lam, s, {"bounds": gbs, "Lam": Lam}

    def refine(self, L, H, lb, s, info, idx):
        """The boxes idx (unproven): their two best rows combined (:func:`pair_weights`),
        then alpha-CROWN on the best row of those still open; their scores raised."""
        if not idx.size:
            return s
        q = self.search
        s = s.copy()
        t, i, k = pair_weights(L[idx], H[idx], lb[idx], info["Lam"][idx])
        pairs = [(j, c) for j in np.flatnonzero(t > 0.0)
                 if (c := combination_row(q.A, t[j], i[j], k[j])) is not None]
        if pairs:
            pick, rows = np.array([j for j, _ in pairs]), [c for _, c in pairs]
            if "batch" in info:
                low = _chunked_lower(info["batch"], np.stack(rows)[:, None, :], idx[pick])
            else:
                low = [float(info["bounds"][idx[j]].lower(self.graph.output, c[None])[0])
                       for j, c in zip(pick, rows)]
            for j, v in zip(pick, low):
                box = idx[j]
                s[box] = max(s[box], combined_score(v, q.b_up, t[j], i[j], k[j]))
        if not self.alpha_iters:
            return s
        idx = idx[s[idx] <= 0.0]
        for i, row in zip(idx, np.argmax(lb[idx], axis=1)):
            la = alpha_lower(info["bounds"][i], self.graph.output, q.A[row][None],
                             self.alpha_iters, LR)[0]
            s[i] = np.fmax(s[i], la - q.b_up[row])  # a NaN bound proves nothing
        return s

    def hits(self, X):
        """Which points of X (n, d) violate the property (the graph's float64 forward pass)."""
        q = self.search
        return violations_of(lambda Z: decided_outputs(self.graph, Z), q.lo0, q.hi0, q.A, q.b, X)


def at_once(graph) -> bool:
    """Whether a round's boxes are bounded at once (:class:`ForwardBoxes`) in wide rounds:
    graphs that take forward intermediate bounds whose box is small (:data:`WIDE_CHUNK`
    boxes within :data:`BATCH_BYTES`)."""
    from crown_cli.engine.graph_forward import prefer_forward

    return prefer_forward(graph) and ForwardBoxes.box_bytes(graph) * WIDE_CHUNK <= BATCH_BYTES


def _chunked_lower(chunks, C, boxes):
    """ForwardBoxes.lower of per-box rows C (k, 1, out) on the boxes ``boxes`` (indices of
    the round) held by ``chunks`` [(first box, ForwardBoxes)]: (k,)."""
    low = np.empty(boxes.size)
    for n, (k0, fb) in enumerate(chunks):
        end = chunks[n + 1][0] if n + 1 < len(chunks) else np.inf
        at = np.flatnonzero((boxes >= k0) & (boxes < end))
        if at.size:
            low[at] = fb.lower(C[at], sel=boxes[at] - k0)[0][:, 0]
    return low


def pair_weights(L, H, lb, Lam):
    """Per box (L, H: (n, d); lb: its rows' bounds minus b_up, (n, m); Lam: their input
    coefficients, (n, m, d)): the weight t of the two best rows i, k (t of row i, 1 - t of
    row k, t in {1, ..., COMBOS - 1} / COMBOS) whose combination the rows' own linear bounds
    say is best, when that estimate beats both rows; t = 0 where none does (fewer than two
    finite rows). The estimate, min over the box of t (Lam_i x + d_i) + (1 - t)(Lam_k x +
    d_k) with d_r read back from lb_r, only chooses t: :func:`combined_score` proves."""
    n, m = lb.shape
    t = np.zeros(n)
    i = np.zeros(n, np.int64)
    k = np.zeros(n, np.int64)
    if m < 2 or not n:
        return t, i, k
    order = np.argsort(-lb, axis=1)
    i, k = order[:, 0], order[:, 1]
    rows = np.arange(n)
    li, lk = lb[rows, i], lb[rows, k]
    ok = np.isfinite(li) & np.isfinite(lk)
    rad = 0.5 * (H - L)
    Li, Lk = Lam[rows, i], Lam[rows, k]  # (n, d)
    base_i = li + np.sum(np.abs(Li) * rad, axis=1)  # the linear bound's value at the centre
    base_k = lk + np.sum(np.abs(Lk) * rad, axis=1)
    w = np.arange(1, COMBOS) / COMBOS  # (W,)
    with np.errstate(invalid="ignore"):
        g = w[None, :] * base_i[:, None] + (1.0 - w[None, :]) * base_k[:, None] - np.sum(
            np.abs(w[None, :, None] * Li[:, None] + (1.0 - w[None, :, None]) * Lk[:, None])
            * rad[:, None], axis=2)
    g = np.where(np.isnan(g), -np.inf, g)
    best = np.argmax(g, axis=1)
    gain = g[rows, best] > np.maximum(li, lk) + 1e-9 * (1.0 + np.abs(li))
    t = np.where(ok & gain, w[best], 0.0)
    return t, i, k


def combination_row(A, t: float, i: int, k: int):
    """The row ``c = t A_i + (1 - t) A_k`` when its floats are that combination exactly
    (t dyadic, rows of small integers: VNN-LIB's), else None (it would prove nothing)."""
    c = t * A[i] + (1.0 - t) * A[k]
    ft = Fraction(t)
    if any(Fraction(float(v)) != ft * Fraction(float(a)) + (1 - ft) * Fraction(float(e))
           for v, a, e in zip(c, A[i], A[k]) if v or a or e):
        return None
    return c


def combined_score(low: float, b_up, t: float, i: int, k: int) -> float:
    """A lower bound of ``max_r (A_r f(x) - b_r)`` over a box from a verified lower bound
    ``low`` of ``c f(x)`` there, c = :func:`combination_row` (t in (0, 1)):
    ``max(A_i f - b_i, A_k f - b_k) >= t (A_i f - b_i) + (1 - t)(A_k f - b_k) >= low -
    t b_i - (1 - t) b_k`` (b_r <= b_up_r). Positive only when that is proven in exact
    arithmetic; -inf where the bound is not finite."""
    if not np.isfinite(low):
        return -np.inf
    ft = Fraction(t)
    rhs = ft * Fraction(float(b_up[i])) + (1 - ft) * Fraction(float(b_up[k]))
    value = low - (t * b_up[i] + (1.0 - t) * b_up[k])
    if Fraction(float(low)) > rhs:
        return max(value, np.finfo(np.float64).tiny)
    return min(value, 0.0)


def graph_input_split(graph, lo, hi, A, b, deadline: float, **options) -> BabResult:
    """:func:`graph_input_split_steps` run to its end."""
    return finish(graph_input_split_steps(graph, lo, hi, A, b, deadline, **options))


def graph_input_split_steps(graph, lo, hi, A, b, deadline: float, max_domains: int = MAX_OPEN,
                            alpha: bool = True, progress=None, workers: int = 1):
    """As a generator (yields the share of the box proven after every round, returns the
    :class:`BabResult`): is there an x in [lo, hi] with ``A f(x) <= b`` (every row)?
    :func:`~crown_cli.verification.bab.input_split.input_split_steps`' search ("trial"
    splits, :data:`GRAPH_BATCH` boxes a round, or :data:`WIDE_BATCH` where they are bounded
    at once) on :class:`GraphBoxes`; ``workers`` 2: rounds of at least
    :data:`~crown_cli.verification.bab.input_split.PARALLEL_MIN` boxes (the wide ones)
    shared with a forked second process, each on one thread, as on dense networks.

    ``unsat``: every sub-box has a row proven above its b; ``sat``: a checked point;
    ``unknown``: more than ``max_domains`` open boxes, or a box too small to split;
    ``timeout``: ``deadline`` (time.monotonic()) passed (a bound cut by it raises
    :class:`~crown_cli.engine.deadline.DeadlineExceeded`, which the caller's race counts as
    the timeout). ``alpha``: the open boxes' best row also by alpha-CROWN (not on graphs with
    forward intermediate bounds: :func:`~crown_cli.engine.graph_forward.prefer_forward`).
    ``progress(domains,
    open, worst)`` after every round."""
    from crown_cli.engine.graph_forward import prefer_forward

    # few inputs: many small boxes do better than alpha-CROWN on each (lsnc's quadrotor2d
    # state 0, case 0, 30 s: 3307 boxes, worst open bound -1.57, against 667 and -3.52)
    alpha = alpha and not prefer_forward(graph)
    # boxes bounded at once, each small: wide rounds (lsnc's quadrotor2d state 0, case 0,
    # 40 s: worst open bound -0.447 with 16 boxes a round, -0.283 with 256). Every dimension
    # a candidate did better there (-0.206) but split state 2's case 11 into slivers of one
    # dimension (the halves' deficit preferred it each time; ranked by sensitivity times
    # width it drops out): the 3 candidates and the widest stay
    o = InputSplitOptions(max_domains=max_domains,
                          batch=WIDE_BATCH if at_once(graph) else GRAPH_BATCH,
                          workers=workers, one_thread=True, inherit=False,
                          alpha_iters=ITERS if alpha else 0)
    search = BoxSearch(lo, hi, A, b, o,
                       lambda q: GraphBoxes(graph, q, deadline, o.alpha_iters))
    return (yield from search.run(deadline, progress))
