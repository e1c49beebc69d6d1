"""Pooling: the windows of a 2-D pool, and the max pool node (an average pool is a sparse
:class:`crown_cli.graph.ops.Dense`)."""
from __future__ import annotations

from typing import Tuple

import numpy as np


class MaxPool:
    """Max over windows: ``windows`` (m, K) indices into the input, -1 where a window reaches
    into the padding (ignored). The bound engine relaxes it per window
    (:class:`crown_cli.engine.graph_bounds.PoolLines`)."""

    kind = "maxpool"

    def __init__(self, windows, n_in: int, label: str = ""):
        self.windows = np.asarray(windows, dtype=np.int64)
        self.size = self.windows.shape[0]
        self.n_in = [int(n_in)]
        self.label = label

    def forward(self, xs):
        x = xs[0]
        vals = x[:, np.maximum(self.windows, 0)]
        vals[:, self.windows < 0] = -np.inf
        return vals.max(axis=2)

    def parameters(self) -> int:
        return 0

    def describe(self) -> str:
        return f"max pool {self.n_in[0]} -> {self.size} ({self.label})"


def pool_windows(in_shape: Tuple[int, int, int], kernel, strides, pads, dilations,
                 ceil_mode=False):
    """Output shape (C, OH, OW), the windows (C * OH * OW, kh * kw) of a 2-D pooling (flat
    input indices, -1 for positions in the padding or past it with ceil_mode) and, per window,
    how many of its positions lie in the padded input (AveragePool's count_include_pad)."""
    C, H, W = in_shape
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    pt, pl, pb, pr = pads
    rnd = (lambda a, b: -(-a // b)) if ceil_mode else (lambda a, b: a // b)
    OH = rnd(H + pt + pb - dh * (kh - 1) - 1, sh) + 1
    OW = rnd(W + pl + pr - dw * (kw - 1) - 1, sw) + 1
    if ceil_mode:  # the last window must start inside the input or its left padding
        OH -= int((OH - 1) * sh >= H + pt)
        OW -= int((OW - 1) * sw >= W + pl)
    rows = (np.arange(OH) * sh - pt)[:, None] + np.arange(kh) * dh  # (OH, kh)
    cols = (np.arange(OW) * sw - pl)[:, None] + np.arange(kw) * dw  # (OW, kw)
    r = rows[:, None, :, None]
    c = cols[None, :, None, :]
    inside = (r >= 0) & (r < H) & (c >= 0) & (c < W)  # (OH, OW, kh, kw)
    flat = r * W + c
    ch = (np.arange(C) * H * W)[:, None, None, None, None]
    win = np.where(inside[None], flat[None] + ch, -1)
    padded = ((r >= -pt) & (r < H + pb) & (c >= -pl) & (c < W + pr)).sum(axis=(2, 3))
    return (C, OH, OW), win.reshape(C * OH * OW, kh * kw), np.tile(padded.reshape(-1), C)
