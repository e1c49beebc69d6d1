"""Input-splitting branch and bound on a graph network (few inputs):
:func:`graph_input_split_steps`.

The graph engine bounds one box at a time (:class:`~crown_cli.engine.graph_bounds.GraphBounds`,
then :func:`~crown_cli.engine.graph_alpha.alpha_lower` on the case's rows), so this is the
dense engine's input splitting (:mod:`crown_cli.verification.bab.input_split`) without its
batches: the open box with the worst bound is taken, bounded, tried at its centre and at the
minimising corners of its rows' linear bounds, and split in two at the midpoint of the
dimension along which the graph's output rows change most over the box (the gradient at the
centre times the box's width, :meth:`Graph.vjp`). A box is closed when some row has a
float64-verified lower bound of ``A_i f(x)`` above ``b_i`` rounded up one ulp; ``sat`` needs
a point of the box whose float64 forward pass satisfies every row
(:func:`crown_cli.verification.outcome.violations_of`).

Arrays in, result out: no files and no printing.
"""
from __future__ import annotations

import heapq
import time

import numpy as np

from crown_cli.engine.graph_alpha import alpha_lower
from crown_cli.engine.graph_bounds import GraphBounds
from crown_cli.engine.input_sets import Box
from crown_cli.verification.outcome import BabResult, finish, violations_of

MAX_OPEN = 100_000  # more open boxes than this: unknown


def graph_input_split(graph, lo, hi, A, b, deadline: float, **options) -> BabResult:
    """:func:`graph_input_split_steps` run to its end."""
    return finish(graph_input_split_steps(graph, lo, hi, A, b, deadline, **options))


def graph_input_split_steps(graph, lo, hi, A, b, deadline: float, max_domains: int = MAX_OPEN,
                            alpha: bool = True, progress=None):
    """As a generator (yields the share of the box proven after every box, returns the
    :class:`BabResult`): is there an x in [lo, hi] with ``A f(x) <= b`` (every row)?

    ``unsat``: every sub-box has a row proven above its b; ``sat``: a checked point;
    ``unknown``: more than ``max_domains`` open boxes, or a box too small to split;
    ``timeout``: ``deadline`` (time.monotonic()) passed. ``alpha``: bound with
    :func:`alpha_lower` (else CROWN's rows only). ``progress(domains, open, worst)`` after
    every box."""
    lo0 = np.asarray(lo, dtype=np.float64).ravel()
    hi0 = np.asarray(hi, dtype=np.float64).ravel()
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    b = np.asarray(b, dtype=np.float64).ravel()
    b_up = np.nextafter(b, np.inf)
    stats = {"domains": 0, "peak": 1, "splits": 0}

    def result(verdict, x=None, heap=(), note=""):
        worst = min((h[0] for h in heap), default=np.nan)
        return BabResult(verdict, x, stats["domains"], stats["peak"], worst,
                         splits=stats["splits"], note=note)

    def score(L, H):
        """The box's best row bound minus b (> 0: closed)."""
        gb = GraphBounds(graph, *Box(L, H).args(), deadline=deadline)
        lb = alpha_lower(gb, graph.output, A) if alpha else gb.lower(graph.output, A)
        stats["domains"] += 1
        lb = np.where(np.isnan(lb), -np.inf, lb - b_up)
        return float(np.max(lb))

    def probe(L, H):
        """(a counterexample among the box's centre and each row's descent corner, or None;
        the rows' gradients at the centre (rows, d), kept for the box's split)."""
        c = 0.5 * L + 0.5 * H
        _, vals = graph.forward(c[None], return_all=True)
        G = graph.vjp(vals, A)  # rows of A at the one centre point
        X = np.clip(np.array([c] + [np.where(g > 0.0, L, H) for g in G]), lo0, hi0)
        hit = violations_of(graph.forward, lo0, hi0, A, b, X)
        return (X[np.argmax(hit)].copy() if hit.any() else None), G

    x, G = probe(lo0, hi0)
    if x is not None:
        return result("sat", x)
    s = score(lo0, hi0)
    if s > 0.0:
        return result("unsat")
    # (score, tie-break, lo, hi, share of the whole box, the rows' gradients at its centre)
    heap = [(s, 0, lo0, hi0, 1.0, G)]
    count, proven = 1, 0.0
    while heap:
        if time.monotonic() >= deadline:
            return result("timeout", heap=heap)
        if len(heap) > max_domains:
            return result("unknown", heap=heap, note="domain cap")
        s, _, L, H, share, G = heapq.heappop(heap)
        mid = 0.5 * L + 0.5 * H
        ok = (mid > L) & (mid < H)
        if not ok.any():
            count += 1  # a fresh tie-break: heap entries never compare their arrays
            heapq.heappush(heap, (s, count, L, H, share, G))
            return result("unknown", heap=heap, note="box too small to split")
        # |d (A f) / dx| at the centre, summed over the rows, times the box's width
        sens = np.where(ok, np.abs(G).sum(axis=0) * (H - L), -1.0)
        if not np.any(sens > 0.0):  # flat: the widest splittable dimension
            sens = np.where(ok, H - L, -1.0)
        d = int(np.argmax(sens))
        stats["splits"] += 1
        for half in (0, 1):
            L2, H2 = L.copy(), H.copy()
            if half == 0:
                H2[d] = mid[d]
            else:
                L2[d] = mid[d]
            x, G2 = probe(L2, H2)
            if x is not None:
                return result("sat", x)
            s2 = max(score(L2, H2), s)  # the parent's bound holds on the half too
            if s2 > 0.0:
                proven += 0.5 * share
            else:
                count += 1
                heapq.heappush(heap, (s2, count, L2, H2, 0.5 * share, G2))
        stats["peak"] = max(stats["peak"], len(heap))
        if progress is not None:
            progress(stats["domains"], len(heap), heap[0][0] if heap else np.inf)
        yield proven
    return result("unsat")
