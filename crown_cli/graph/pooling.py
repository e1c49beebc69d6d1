"""Pooling: the windows of a 2-D pool, and the max pool node (an average pool is a sparse
:class:`crown_cli.graph.ops.Dense`)."""
from __future__ import annotations

from typing import Tuple

import numpy as np


class MaxPool:
    """Max over windows: ``windows`` (m, K) indices into the input, -1 where a window reaches
    into the padding (ignored). The bound engine relaxes it per window
    (:class:`crown_cli.engine.node_rules.PoolLines`). ``geometry`` (optional, a 2-D pool of
    :func:`pool_windows`): (input (C, H, W), kernel, strides, pads (top, left), dilations),
    with which rows on windows pass it on windows (``PoolRule.back_win``)."""

    kind = "maxpool"

    def __init__(self, windows, n_in: int, label: str = "", geometry=None):
        self.windows = np.asarray(windows, dtype=np.int64)
        self.size = self.windows.shape[0]
        self.n_in = [int(n_in)]
        self.label = label
        self.geometry = geometry

    def forward(self, xs):
        x = xs[0]
        vals = x[:, np.maximum(self.windows, 0)]
        vals[:, self.windows < 0] = -np.inf
        return vals.max(axis=2)

    def vjp(self, L, xs, relu_leak=None):
        """The rows L (N, size) routed to each window's largest input at the points xs[0]
        (the first of ties; values of one point serve several rows)."""
        x = xs[0]
        N = L.shape[0]
        win = self.windows
        w = np.where(win[None] < 0, -np.inf, x[:, np.maximum(win, 0)])
        src = win[np.arange(win.shape[0])[None], np.argmax(w, axis=2)]  # (N, m)
        src = np.broadcast_to(src, L.shape)
        P = np.zeros((N, x.shape[1]))
        np.add.at(P, (np.repeat(np.arange(N), src.shape[1]), src.reshape(-1)), L.reshape(-1))
        return [P]

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


def maxpool_as_relus(graph, max_relus=None):
    """An equivalent graph whose max pools are trees of ReLUs (``max(a, b) = b + relu(a -
    b)``, exact in real arithmetic), or ``graph`` itself when it has no max pool or the trees
    would need more than ``max_relus`` ReLUs (a window of K inputs needs K - 1). Each level
    of a pool's tree halves its windows' candidates: a sparse ``Dense`` of the pairs'
    differences, a ReLU, a sparse ``Dense`` of the pairs' second members, their ``Sum`` (an
    odd candidate is carried with a zero difference). On such a graph ReLU splitting is
    complete: a fully split domain is affine
    (:mod:`crown_cli.verification.bab.graph_bounder`)."""
    import scipy.sparse as sp

    from crown_cli.graph.network import Graph, Node
    from crown_cli.graph.ops import ActivationOp, Dense, Sum

    pools = [n for n in graph.nodes if n.kind == "maxpool"]
    need = sum(int(np.sum(np.maximum(np.sum(n.op.windows >= 0, axis=1) - 1, 0))) for n in pools)
    if not pools or (max_relus is not None and need > max_relus):
        return graph
    nodes, remap = [], {}

    def add(name, op, ins, shape):
        nodes.append(Node(name, op, tuple(ins), tuple(shape)))
        return len(nodes) - 1

    for i, n in enumerate(graph.nodes):
        ins = [remap[j] for j in n.inputs]
        if n.kind != "maxpool":
            remap[i] = add(n.name, n.op, ins, n.shape)
            nodes[-1].folded = list(n.folded)
            continue
        win = n.op.windows
        cand = [list(w[w >= 0]) for w in win]
        cur, size, level = ins[0], n.op.n_in[0], 0
        while level == 0 or any(len(c) > 1 for c in cand):
            a, bb, nxt = [], [], []
            for c in cand:
                nc = []
                for t in range(0, len(c) - 1, 2):
                    a.append(c[t])
                    bb.append(c[t + 1])
                    nc.append(len(bb) - 1)
                if len(c) % 2:
                    a.append(-1)
                    bb.append(c[-1])
                    nc.append(len(bb) - 1)
                nxt.append(nc)
            p, a, bb = len(bb), np.array(a), np.array(bb)
            pair = np.flatnonzero(a >= 0)
            diff = sp.csr_matrix((np.r_[np.ones(pair.size), -np.ones(pair.size)],
                                  (np.r_[pair, pair], np.r_[a[pair], bb[pair]])), shape=(p, size))
            second = sp.csr_matrix((np.ones(p), (np.arange(p), bb)), shape=(p, size))
            last = all(len(c) == 1 for c in nxt)
            shape = n.shape if last else (1, p)
            tag = f"{n.name}/max{level}"
            d = add(tag + "/diff", Dense(diff, label="max pool as ReLUs"), [cur], (1, p))
            r = add(tag + "/relu", ActivationOp("relu"), [d], (1, p))
            s = add(tag + "/second", Dense(second, label="max pool as ReLUs"), [cur], (1, p))
            cur = add(tag, Sum([1.0, 1.0], p), [s, r], shape)
            cand, size, level = nxt, p, level + 1
        remap[i] = cur
    out = Graph(nodes, remap[graph.output], graph.source, graph.output_shapes)
    out.channels_last, out.row_budget = graph.channels_last, graph.row_budget
    return out
