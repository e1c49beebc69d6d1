"""The one optimiser: projected Adam ascent with best-iterate tracking.

Every loop that optimises relaxation parameters (alpha-CROWN's slopes and tangent points in
:mod:`crown_cli.engine.alpha_crown`, input splitting's last-layer slopes in
:mod:`crown_cli.engine.dense_boxes`, ReLU splitting's slopes and split multipliers in
:mod:`crown_cli.verification.bab.optimise`) takes its steps here. Nothing here proves: the
objective is a float32 (or unchecked float64) estimate that steers; callers evaluate the best
iterate in float64 before anything is reported.

Two equivalent-in-exact-arithmetic forms of the bias-corrected step are in use and kept as a
parameter (``folded``), so that every caller takes the same steps it always took:

- ``folded=False``: ``lr * m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1 - b1^t)``,
  ``v_hat = v / (1 - b2^t)`` (Kingma & Ba, Algorithm 1);
- ``folded=True``: ``lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`` (the same
  paper's Section 2 variant: the corrections folded into the step size, eps not rescaled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class AdamSettings:
    """Adam's constants: moment decays, denominator guard, step form (see module docstring)."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    folded: bool = False


def adam_moments(m, v, g, s: AdamSettings):
    """The moments after gradient g: (b1 m + (1 - b1) g, b2 v + (1 - b2) g^2)."""
    return s.b1 * m + (1 - s.b1) * g, s.b2 * v + (1 - s.b2) * g * g


def adam_increment(m, v, t: int, lr, s: AdamSettings):
    """The ascent increment of step t >= 1 from the updated moments (m, v)."""
    if s.folded:
        c = lr * np.sqrt(1 - s.b2 ** t) / (1 - s.b1 ** t)
        return c * m / (np.sqrt(v) + s.eps)
    mh = m / (1 - s.b1 ** t)
    vh = v / (1 - s.b2 ** t)
    return lr * mh / (np.sqrt(vh) + s.eps)


class Adam:
    """Projected Adam ascent on one parameter array: moments of the array's shape, steps on
    any subset of its entries (``index``: whatever numpy indexing the caller uses for the
    entries still being optimised), the result clipped to [lo, hi]."""

    def __init__(self, like: np.ndarray, settings: AdamSettings = AdamSettings(),
                 lo=None, hi=None):
        self.m = np.zeros_like(like)
        self.v = np.zeros_like(like)
        self.s, self.lo, self.hi = settings, lo, hi

    def _project(self, x, out=None):
        if self.lo is not None and self.hi is not None:
            return np.clip(x, self.lo, self.hi, out=out)
        if self.lo is not None:
            return np.maximum(x, self.lo, out=out)
        if self.hi is not None:
            return np.minimum(x, self.hi, out=out)
        return x

    def _moments(self, g, index):
        m, v = adam_moments(self.m[index], self.v[index], g, self.s)
        self.m[index], self.v[index] = m, v
        return m, v

    def ascend(self, x: np.ndarray, g: np.ndarray, t: int, lr, index=Ellipsis) -> np.ndarray:
        """Step t >= 1 on ``x`` (the current values of the entries ``index``, updated in
        place, in x's dtype) along the gradient g, projected; returns x."""
        m, v = self._moments(g, index)
        x += adam_increment(m, v, t, lr, self.s).astype(x.dtype, copy=False)
        self._project(x, out=x)
        return x

    def propose(self, x: np.ndarray, g: np.ndarray, t: int, lr, index=Ellipsis) -> np.ndarray:
        """:meth:`ascend` without touching x: the projected new values (the moments do
        advance), for callers that accept the step only where it is finite."""
        m, v = self._moments(g, index)
        return self._project(x + adam_increment(m, v, t, lr, self.s))


def _same_index(a, b) -> bool:
    """Whether two numpy indices (tuples of slices and integer arrays) select the same
    entries (``a`` may be None: never)."""
    if a is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, slice) or isinstance(y, slice):
            if not (isinstance(x, slice) and isinstance(y, slice) and x == y):
                return False
        elif x.shape != y.shape or not np.array_equal(x, y):
            return False
    return True


class KeyedAdam:
    """Projected Adam on several dense parameter stores, each with its own moments and step
    count, keyed by the caller (alpha-CROWN: one store per (bounded layer, relaxed layer)).

    A key's moments of the entries stepped last are kept gathered: while the next step takes
    the same entries (the usual case, an optimisation whose unstable neurons do not change),
    no gather or scatter of the moments is needed; on other entries the kept ones are written
    back first. The arithmetic is :class:`Adam`'s, so the steps are the same to the bit."""

    def __init__(self, settings: AdamSettings = AdamSettings()):
        self.s = settings
        self.opt, self.t = {}, {}  # per key: an Adam over the store, its step count
        self.kept = {}  # per key: (index, gathered m, gathered v)

    def step(self, key, value: np.ndarray, grad: np.ndarray, idx, lr, lo, hi,
             current: Optional[np.ndarray] = None) -> None:
        """Update ``value[idx]`` (the store, in place) by one ascent step along ``grad``,
        clipped to [lo, hi] (a key's bounds are those of its first step). ``current``: the
        values to step from, if not ``value[idx]`` (the caller's gather, with its fills)."""
        if key not in self.opt:
            self.opt[key] = Adam(value, self.s, lo, hi)
            self.t[key] = 0
        self.t[key] += 1
        opt, s = self.opt[key], self.s
        idx = idx if isinstance(idx, tuple) else (idx,)
        last, m, v = self.kept.get(key, (None, None, None))
        if not _same_index(last, idx):
            if last is not None:
                opt.m[last], opt.v[last] = m, v
            m, v = opt.m[idx], opt.v[idx]
        m, v = adam_moments(m, v, grad, s)
        self.kept[key] = (idx, m, v)
        x = value[idx] if current is None else current
        value[idx] = opt._project(x + adam_increment(m, v, self.t[key], lr, s))


class BestIterate:
    """The best objective seen per entry and the parameters that gave it.

    ``best`` (shape of the objective) starts at -inf (or ``start``); ``params`` are copies of
    the parameter arrays, indexed like the objective on their leading axes."""

    def __init__(self, shape, *params: np.ndarray, start: Optional[np.ndarray] = None):
        self.best = np.full(shape, -np.inf) if start is None else start
        self.params = [p.copy() for p in params]

    def offer(self, value: np.ndarray, *params: np.ndarray, index=Ellipsis) -> np.ndarray:
        """Keep the entries of ``value`` that improve on the best, with their ``params``;
        returns the improvement mask (value's shape). ``index`` says where value's entries
        are: Ellipsis (everywhere), an index array over the leading axis (value's first axis
        runs over it), or a tuple of index arrays (one entry of value per index tuple)."""
        best_here = self.best[index]
        imp = value > best_here
        if not imp.any():
            return imp
        if index is Ellipsis:
            sel = src = imp
        elif isinstance(index, tuple):
            sel = tuple(np.asarray(ix)[imp] for ix in index)
            src = imp
        else:
            src = np.nonzero(imp)
            sel = (np.asarray(index)[src[0]],) + src[1:]
        self.best[sel] = value[src]
        for kept, p in zip(self.params, params):
            kept[sel] = p[src]
        return imp
