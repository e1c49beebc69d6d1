"""ReLU splitting's batches shared with a second process: half of each batch of children is
bounded by a forked :class:`~crown_cli.verification.bab.workers.Helper` running the same
search's :meth:`assess_part` while this process bounds the other half, each on one thread.

Why: on the 2-core machine a graph search's batch (64 domains, one row each) gains nothing
from a second numba or BLAS thread (sri_resnet_a idx_3612, 20 s: 6,463 domains with two
threads, 6,527 with one thread on one core), so two processes on a thread each double the
domains bounded per second. The helper is forked when a search first shares a batch, so it
holds the network, the bounder and the compiled kernels; only the domains' arrays and what
becomes of them cross the pipe. Nothing it returns is trusted more than this process's own
work: it runs the same code on the same arrays, and a domain still counts as proven only by
its float64 bound (computed in the helper as it would be here).

At most :data:`MAX_HELPERS` searches hold a helper at once (the verifier runs one search per
open case, in turns): the one used longest ago gives its helper up, and forks again when its
turn comes. A lost helper (its process ended) leaves its search alone from then on.
"""
from __future__ import annotations

from typing import List

import numpy as np

from crown_cli.engine.threads import one_thread
from crown_cli.verification.bab.workers import Helper, HelperLost, can_fork

# searches holding a helper process at once (least recently used first in _HOLDERS)
MAX_HELPERS = 2
# a batch of fewer children is bounded here alone
SHARE_MIN = 16

_HOLDERS: List = []


def shares(search, n: int) -> bool:
    """Whether a batch of ``n`` children is shared: the search asks for two workers, no
    proof is recorded, no charge hook, cuts or per-domain bounds are in use, and a second
    core can take a forked helper."""
    return (search.workers > 1 and n >= SHARE_MIN and search.proof is None
            and search.charge is None and not search.interm and search.bd_cuts() is None
            and can_fork())


def _helper(search) -> Helper:
    """The search's helper, forked if it has none (another search's given up when
    :data:`MAX_HELPERS` are held); the search becomes the most recently used."""
    if search in _HOLDERS:
        _HOLDERS.remove(search)
    elif len(_HOLDERS) >= MAX_HELPERS:
        release(_HOLDERS[0])
    if search.helper is None:
        search.helper = Helper(search.assess_part, single=True)
    _HOLDERS.append(search)
    return search.helper


def release(search) -> None:
    """The search's helper closed (it forks another when it next shares a batch)."""
    if search in _HOLDERS:
        _HOLDERS.remove(search)
    if search.helper is not None:
        search.helper.close()
        search.helper = None


def assess_shared(search, kids, iters):
    """The children ``kids`` bounded in two halves, this process and the helper at once, on
    one thread each: ``[search.assess_part(half, iters) for each half]`` in order, each
    ``(half, score, proven, row, top, xv)`` with the half's domains as they came back
    (their optimised slopes and multipliers, their proven cases). Without the helper (lost)
    both halves are bounded here."""
    n = kids.split.shape[0]
    halves = [kids.take(np.arange(n // 2)), kids.take(np.arange(n // 2, n))]
    outs = []
    with one_thread():
        try:
            helper = _helper(search)
        except OSError:  # no fork (process limits): alone from now
            search.workers = 1
            return [search.assess_part(h, iters) for h in halves]
        try:
            helper.send((halves[1], iters))  # (a copy: halves[1] stays as it is here)
            try:
                outs.append(search.assess_part(halves[0], iters))
            except BaseException:  # (past the deadline): no answer left unread in the pipe
                release(search)
                raise
            outs.append(helper.recv())
        except HelperLost:
            release(search)
            search.workers = 1
            outs += [search.assess_part(h, iters) for h in halves[len(outs):]]
    return outs
