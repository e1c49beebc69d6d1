"""The open domains of a ReLU-splitting search (:class:`_Pool`): split decisions, slopes,
multipliers, per-domain bounds and candidates in preallocated arrays, with a heap on the
score (worst bound first).
"""
from __future__ import annotations

import heapq

import numpy as np



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
