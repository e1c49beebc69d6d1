"""Input-splitting branch and bound on a graph network (few inputs):
:func:`graph_input_split_steps`.

The search is the dense engine's (:mod:`crown_cli.verification.bab.input_split`: rounds on
the worst open boxes, the "trial" split rule, the candidate points, the shares proven); only
its bounds are the graph engine's (:class:`GraphBoxes`): each box a
:class:`~crown_cli.engine.graph_bounds.GraphBounds` (CROWN, every rounding charged), its
rows carried to the input for the split rule and the candidate corners, the open boxes' best
row tightened by :func:`~crown_cli.engine.graph_alpha.alpha_lower`. A box is closed when some
row has a float64-verified lower bound of ``A_i f(x)`` above ``b_i`` rounded up one ulp;
``sat`` needs a point of the box whose float64 forward pass satisfies every row
(:func:`crown_cli.verification.outcome.violations_of`). The graph engine bounds one box at a
time, so rounds are smaller (:data:`GRAPH_BATCH` boxes) and run in one process.

Arrays in, result out: no files and no printing.
"""
from __future__ import annotations

import numpy as np

from crown_cli.engine.graph_alpha import ITERS, LR, alpha_lower
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.verification.bab.input_split import InputSplitOptions, BoxSearch
from crown_cli.graph.sign_check import decided_outputs
from crown_cli.verification.outcome import BabResult, finish, violations_of

MAX_OPEN = 100_000  # more open boxes than this: unknown
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

        # few inputs: every box's intermediate bounds by the forward pass
        self.intermediate = "forward" if prefer_forward(graph) else "crown"

    def bound(self, L, H, PB=None):
        """Per box: the rows' bounds lb - b_up, their input coefficients (n, rows, d), the
        score, and the boxes' GraphBounds (for :meth:`refine`)."""
        q = self.search
        n, m = L.shape[0], q.A.shape[0]
        lb, Lam, gbs = np.empty((n, m)), np.empty((n, m, L.shape[1])), []
        for i in range(n):
            gb = GraphBounds(self.graph, *Box(L[i], H[i]).args(), deadline=self.deadline,
                             intermediate=self.intermediate)
            lb[i], Lam[i] = gb.lower(self.graph.output, q.A, rows=True)
            gbs.append(gb)
        lb = np.where(np.isnan(lb), -np.inf, lb - q.b_up)  # a NaN bound proves nothing
        s = np.max(lb, axis=1) if m else np.full(n, -np.inf)
        return lb, Lam, s, {"bounds": gbs}

    def refine(self, L, H, lb, s, info, idx):
        """alpha-CROWN on the best row of the boxes idx (unproven): their scores raised."""
        if not self.alpha_iters or not idx.size:
            return s
        q = self.search
        s = s.copy()
        for i, row in zip(idx, np.argmax(lb[idx], axis=1)):
            la = alpha_lower(info["bounds"][i], self.graph.output, q.A[row][None],
                             self.alpha_iters, LR)[0]
            s[i] = np.fmax(s[i], la - q.b_up[row])  # a NaN bound proves nothing
        return s

    def hits(self, X):
        """Which points of X (n, d) violate the property (the graph's float64 forward pass)."""
        q = self.search
        return violations_of(lambda Z: decided_outputs(self.graph, Z), q.lo0, q.hi0, q.A, q.b, X)


def graph_input_split(graph, lo, hi, A, b, deadline: float, **options) -> BabResult:
    """:func:`graph_input_split_steps` run to its end."""
    return finish(graph_input_split_steps(graph, lo, hi, A, b, deadline, **options))


def graph_input_split_steps(graph, lo, hi, A, b, deadline: float, max_domains: int = MAX_OPEN,
                            alpha: bool = True, progress=None):
    """As a generator (yields the share of the box proven after every round, returns the
    :class:`BabResult`): is there an x in [lo, hi] with ``A f(x) <= b`` (every row)?
    :func:`~crown_cli.verification.bab.input_split.input_split_steps`' search ("trial"
    splits, :data:`GRAPH_BATCH` boxes a round, one process) on :class:`GraphBoxes`.

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
    o = InputSplitOptions(max_domains=max_domains, batch=GRAPH_BATCH, workers=1,
                          inherit=False, alpha_iters=ITERS if alpha else 0)
    search = BoxSearch(lo, hi, A, b, o,
                       lambda q: GraphBoxes(graph, q, deadline, o.alpha_iters))
    return (yield from search.run(deadline, progress))
