"""The graph back-substitution's fast path: :meth:`GraphBounds.lower
<crown_cli.engine.graph_bounds.GraphBounds.lower>` with the relaxation's own lines, on the
numba kernels of :mod:`crown_cli.engine.kernels.graph_steps`.

Rows are held transposed and on their live elements only: over a node of n elements,
``(idx, Lt)`` with ``Lt`` (k, r) the coefficients of the k elements ``idx`` (every other
element's coefficient is 0 in every row; ``idx`` None: all n). A row of an intermediate
neuron's bound touches only that neuron's receptive field, and
:meth:`GraphBounds.node_bounds` groups neurons by position, so that a chunk's rows stay on a
small part of each node below. Every step is then a loop over the live elements whose body
runs along the r rows (contiguous, vectorised):

- a convolution's transpose gathers, for each input position its live outputs reach, the
  products of those outputs for every channel at once (at most (O / group) kh kw per
  element);
- an activation applies its lines element by element, and rows are kept only on the elements
  it hands on (:func:`needed`: lines not all 0; through elementwise sums and scalings), which
  the convolution above it computes alone; a sum passes the rows on (negated);
- a dense layer is one BLAS product; other nodes (element moves, scales, pools) take the
  whole rows and run their numpy steps.

Rows that start on single neurons of an image-shaped node (an intermediate bound's
``[I; -I]``) are first held on windows of their own (:class:`Win`): each row's coefficients
on a (C, h, w) window at its own place, which a convolution's transpose grows by the kernel
and a residual sum merges. A window is the row's receptive field, where a chunk's live
elements are the union of its rows' fields; rows leave their windows for the live elements
once a window would cover :data:`WIN_SHARE` of that union, and at every node that is not a
convolution, an activation or a sum of image-shaped values.

Each node's step is its rule's ``back_t`` (rows on live elements) or ``back_win`` (on
windows) in :mod:`crown_cli.engine.node_rules`, beside the numpy path's ``back`` (this path's
twin, ``GraphBounds._rows``): the same products, the sums in another order, which no charge
depends on; the charges are the same functions; a dead element contributes 0 to every sum
and charge.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple, Union

import numpy as np

from crown_cli.engine.deadline import check_deadline
from crown_cli.engine.rounding import U64
from crown_cli.graph.ops import Conv, Dense, IndexMap, Scale, Sum, typed

Rows = Tuple[Optional[np.ndarray], np.ndarray]  # (live element indices or None, Lt (k, r))
# rows leave their windows when a window would cover this share of the chunk's bounding box
WIN_SHARE = 0.75
# rows on more than this share of a node's elements are held on all of them (idx None)
LIVE_SHARE = 0.75
# rows given to an activation are kept on the elements whose lines are not all 0 (a ReLU
# inactive on the whole set hands on rows of exact zeros and adds nothing to any sum) when
# those it drops are at least this share of its elements (fewer: the copy costs more than the
# smaller steps save); node_rules drops elements of slope 0 by the same share
DEAD_SHARE = 0.1
# a dense node of at least this many outputs starts its bounds' rows from its weight's rows;
# a smaller one from [I; -I] taken through it (a product that small costs little, and on
# 2 cores the small nets measured faster that way: docs/benchmarks.md, graph-dense)
WEIGHT_ROWS_MIN = 256
# rows that are pairs share their products on a dense node's elements where both lines of
# the activation before it have one slope, when there are at least this many (each share
# costs a second product call and two sums per result)
PAIRED_MIN = 32
# a dense node's transpose of at most this many rows on a third of its elements or more: the
# rows written out over every element (zeros elsewhere), the weight read once in place,
# rather than its live rows gathered (a copy, then read again)
FEW_ROWS_SCATTER = 8


class Win(NamedTuple):
    """Rows on windows of an image-shaped node (C, H, W): ``Pt`` (C, h, w, r), row q's
    window at (oy[q], ox[q]) in the node's (H, W) coordinates (it may reach past the border,
    where every coefficient is 0). ``runs``: :func:`window_runs` of the rows, made once per
    chunk (every step moves all origins by one injective map, so equal places stay equal)."""
    oy: np.ndarray
    ox: np.ndarray
    Pt: np.ndarray
    runs: Optional[np.ndarray] = None


def _full(rows: Rows, n: int) -> np.ndarray:
    idx, Lt = rows
    if idx is None:
        return Lt
    out = np.zeros((n, Lt.shape[1]), Lt.dtype)
    out[idx] = Lt
    return out


def _take(vec, idx):
    return vec if idx is None else np.ascontiguousarray(vec[idx])


class _Need(NamedTuple):
    """What rows given to a node carry to the input (:func:`needed`), worked out once."""
    mask: Optional[np.ndarray]  # the elements, whatever their share; None: every element
    keep: Optional[np.ndarray]  # their indices where they leave DEAD_SHARE out; else None
    nothing: bool  # no element at all


def _need(gb, j) -> _Need:
    """Node j's :class:`_Need`, kept on ``gb`` (the lines of a bound's activations are set
    once, with their intervals)."""
    cache = gb.__dict__.setdefault("_need", {})
    if j in cache:
        return cache[j]
    node = gb.g.nodes[j]
    mask = None
    ln = gb.lines.get(j)
    if ln is not None:
        mask = np.zeros(node.size, bool)
        for a in (ln.lower, ln.upper, ln.lower_icpt, ln.upper_icpt):
            if a is not None:
                mask |= np.broadcast_to(np.asarray(a) != 0, mask.shape)
    elif isinstance(node.op, (Scale, Sum)) and node.inputs and \
            all(gb.g.nodes[k].size == node.size for k in node.inputs):
        parts = [_need(gb, k).mask for k in node.inputs]
        if all(m is not None for m in parts):
            mask = np.logical_or.reduce(parts)
            if getattr(node.op, "bias", None) is not None:
                mask = mask | (node.op.bias != 0)
    keep = None if mask is None else np.flatnonzero(mask)
    if keep is not None and keep.size > (1.0 - DEAD_SHARE) * mask.size:
        keep = None
    cache[j] = _Need(mask, keep, mask is not None and not mask.any())
    return cache[j]


def needed(gb, j) -> Optional[np.ndarray]:
    """The elements of node j (sorted flat indices) that rows given to it carry to the input,
    when the others are at least :data:`DEAD_SHARE` of the node; else None (every element).
    An activation hands on nothing from an element whose lines are all 0 (a ReLU inactive on
    the whole set: the step multiplies its rows by 0 and adds 0 to every sum and charge); an
    elementwise sum or scaling hands element e to element e of its inputs, and a scaling's
    constant at e counts (a clipped ReLU's ``relu(x) - relu(x - 6)``)."""
    return _need(gb, j).keep


def needed_mask(gb, j) -> Optional[np.ndarray]:
    """:func:`needed`'s elements as a mask, whatever their share (None: every element)."""
    return _need(gb, j).mask


def hands_nothing(gb, j) -> bool:
    """Whether no element of node j is :func:`needed` (the second branch of a clipped ReLU
    that never reaches its clip on the set: rows given to it are dropped, windows too)."""
    return _need(gb, j).nothing


def restrict(gb, j, rows: Rows) -> Rows:
    """The rows given to node j on its :func:`needed` elements only."""
    keep = needed(gb, j)
    if keep is None:
        return rows
    idx, Lt = rows
    if idx is None:
        return keep, Lt[keep]
    on = _need(gb, j).mask[idx]
    return rows if on.all() else (idx[on], Lt[on])


def _union(ia, ib, n: int):
    """The union of two rows' live elements (sorted flat indices, None: all n) and, per
    element of it, its row in each (-1 where that one has none)."""
    idx = None
    if ia is not None and ib is not None:
        mask = np.zeros(n, bool)
        mask[ia] = True
        mask[ib] = True
        idx = np.flatnonzero(mask)

    def rows_of(own):
        at = np.full(n, -1, np.int64)
        at[slice(None) if own is None else own] = np.arange(n if own is None else own.size)
        return at if idx is None else at[idx]
    return idx, rows_of(ia), rows_of(ib)


def _conv_live(op: Conv, idx):
    """(the input elements (flat indices, sorted) a convolution's transpose reaches from the
    output elements ``idx``, every channel of each input position, or None for (nearly) all;
    those positions (flat (H, W) indices, sorted))."""
    if idx is None:
        return None, np.arange(op.in_shape[1] * op.in_shape[2])
    hit = op.reach(idx)
    in_idx = _every_channel(hit, op.in_shape[0])
    return in_idx, np.flatnonzero(hit.reshape(-1)) if in_idx is not None else np.arange(hit.size)


def _every_channel(hit, C: int):
    """The elements (flat (C, H, W) indices, sorted) of every channel at the positions
    ``hit`` (H, W) marks; None when they pass :data:`LIVE_SHARE` of the node."""
    spatial = np.flatnonzero(hit.reshape(-1))
    if spatial.size > LIVE_SHARE * hit.size:
        return None
    return (np.arange(C)[:, None] * hit.size + spatial[None, :]).reshape(-1)


def _image(node) -> Optional[Tuple[int, int, int]]:
    """(C, H, W) of an image-shaped node (ONNX shape (1, C, H, W)), else None."""
    sh = node.shape
    return (int(sh[1]), int(sh[2]), int(sh[3])) if len(sh) == 4 and sh[0] == 1 else None


def unit_windows(node, idx, dtype, sign) -> Optional[Win]:
    """The rows ``sign[k] e_idx[k]`` over an image-shaped node on 1 x 1 windows (None for a
    node of another shape)."""
    chw = _image(node)
    if chw is None:
        return None
    C, H, W = chw
    Pt = np.zeros((C, 1, 1, idx.size), dtype)
    c, pos = idx // (H * W), idx % (H * W)
    Pt[c, 0, 0, np.arange(idx.size)] = sign
    oy, ox = pos // W, pos % W
    return Win(oy, ox, Pt, _runs(oy, ox))


def window_runs(win: Win) -> np.ndarray:
    """The rows of ``win`` as runs of consecutive rows whose windows lie at one place, each
    at most ROW_BLOCK rows (the windows kernels' unit of work: a place's values are read once
    for its run): the runs' starts and, last, the row count. Rows of one neuron position
    are consecutive (:meth:`GraphBounds._signed_bounds` orders them so); rows in any other
    order only make shorter runs."""
    return _runs(win.oy, win.ox) if win.runs is None else win.runs


def _runs(oy, ox) -> np.ndarray:
    from crown_cli.engine.kernels.graph_steps import ROW_BLOCK

    r = oy.size
    cuts = np.flatnonzero((oy[1:] != oy[:-1]) | (ox[1:] != ox[:-1])) + 1
    starts = np.concatenate([[0], cuts])
    pieces = -(-(np.append(cuts, r) - starts) // ROW_BLOCK)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    sub = np.repeat(starts, pieces) + (np.arange(first.size) - first) * ROW_BLOCK
    return np.append(sub, r).astype(np.int64)


def _unwin(win: Win, node, kernels) -> Rows:
    """Rows on windows as rows on their live elements (every channel of each position some
    row's window covers)."""
    return _unwin_chw(win, _image(node), kernels)


def _unwin_chw(win: Win, chw, kernels) -> Rows:
    """:func:`_unwin` over an image of shape ``chw`` (C, H, W)."""
    C, H, W = chw
    h, w = win.Pt.shape[1:3]
    hit = np.zeros((H, W), bool)
    for y, x in set(zip(win.oy.tolist(), win.ox.tolist())):
        hit[max(0, y):max(0, y + h), max(0, x):max(0, x + w)] = True
    idx = _every_channel(hit, C)
    if idx is None:
        where = np.arange(C * H * W)
    else:
        where = np.full(C * H * W, -1, np.int64)
        where[idx] = np.arange(idx.size)
    Lt = np.zeros((C * H * W if idx is None else idx.size, win.Pt.shape[3]), win.Pt.dtype)
    kernels.win_scatter_t(win.Pt, win.oy, win.ox, where, H, W, Lt)
    return idx, Lt


def _fits(oy, ox, h, w, H, W) -> bool:
    """Whether windows of h x w at (oy, ox) cover less than :data:`WIN_SHARE` of their
    bounding box inside the (H, W) image (and hold no more than whole rows would, which
    the memory budget counts)."""
    bh = min(H, int(oy.max()) + h) - max(0, int(oy.min()))
    bw = min(W, int(ox.max()) + w) - max(0, int(ox.min()))
    return min(h, H) * min(w, W) < WIN_SHARE * bh * bw and h * w <= H * W


def _win_sum(a: Win, b: Win) -> Optional[Win]:
    """``a + b`` on one window per row (the union of theirs); None when the two do not lie
    alike in every row."""
    dy, dx = b.oy - a.oy, b.ox - a.ox  # b's windows relative to a's
    if np.any(dy != dy[0]) or np.any(dx != dx[0]):
        return None
    dy, dx = int(dy[0]), int(dx[0])
    C, ha, wa, r = a.Pt.shape
    hb, wb = b.Pt.shape[1:3]
    y0, x0 = min(0, dy), min(0, dx)  # the union's origin, relative to a's
    h, w = max(ha, dy + hb) - y0, max(wa, dx + wb) - x0
    St = np.zeros((C, h, w, r), a.Pt.dtype)
    St[:, -y0:-y0 + ha, -x0:-x0 + wa] = a.Pt
    St[:, dy - y0:dy - y0 + hb, dx - x0:dx - x0 + wb] += b.Pt
    return Win(a.oy + y0, a.ox + x0, St, a.runs)  # b's places are a's moved alike


def _typed(gb, key, make, dtype):
    """``make()`` as ``dtype``: itself for float64, else a copy kept on ``gb`` per key (the
    lines, magnitudes and weights of a float32 pass, made once per bound)."""
    if dtype == np.float64:
        return make()
    cache = gb.__dict__.setdefault("_typed", {})
    if key not in cache:
        with np.errstate(over="ignore"):  # beyond float32's range: inf, which steers only
            cache[key] = np.ascontiguousarray(make(), dtype)
    return cache[key]


def fused_rows(gb, target: int, Lam, kernels, dtype=np.float64):
    """The rows ``Lam`` (r, size) over node ``target`` (or rows on windows, :class:`Win`)
    carried to the input with the relaxation's own lines: (rows over the flat input (r, d),
    constant, magnitude, charge) per row, as ``GraphBounds._rows`` accumulates them.
    ``dtype`` float32 (the rows of :class:`Win` given their own): the rows and every product
    in float32, the sums in float64 (a steering pass: the charges do not cover float32)."""
    g = gb.g
    start = Lam if isinstance(Lam, WeightRows) else None
    if start is not None:  # rows over the dense node's input, its bias taken
        target, first = start.node, start.rows
        if start.paired and not gb.plan[target].reads_pairs:
            first = (None, np.hstack([first[1], -first[1]]))  # [E; -E] written out
            start = start._replace(paired=False)
    elif isinstance(Lam, Win):
        first = Lam
    else:
        Lam = np.asarray(Lam, dtype)
        live = np.flatnonzero(np.any(Lam != 0, axis=0))
        idx0 = None if live.size > LIVE_SHARE * Lam.shape[1] else live
        first = (idx0, np.ascontiguousarray((Lam if idx0 is None else Lam[:, idx0]).T))
    r = first.Pt.shape[3] if isinstance(first, Win) else first[1].shape[1]
    if start is not None and start.paired:
        r *= 2  # E's rows held, [E; -E] meant
    acc = np.zeros((3, r))  # constant, magnitude, charge
    if start is not None:
        acc[0], acc[1] = start.const, start.mag
    pending: Dict[int, Union[Rows, Win]] = {target: first}
    pre: Dict[int, np.ndarray] = {}  # an affine node's sums taken by its activation
    # rows that are pairs (row k + r/2 = -row k): -1 at the node whose rows are exactly so,
    # n_a at a dense node whose first n_a live elements' rows are (PAIRED_MIN or more)
    paired: Dict[int, int] = {target: -1} if start is not None and start.paired else {}

    def give(j, rows):
        if hands_nothing(gb, j):
            return  # nothing reaches the input through j
        if not isinstance(rows, Win):
            rows = restrict(gb, j, rows)
            if rows[0] is not None and rows[0].size == 0:
                return
        if j not in pending:
            pending[j] = rows
            return
        pre.pop(j, None)  # sums an activation took over the first rows no longer cover them
        paired.pop(j, None)  # nor are the sum's rows pairs
        a, b = pending[j], rows
        if isinstance(a, Win) and isinstance(b, Win):
            S = _win_sum(a, b)
            if S is not None:
                if S.Pt.dtype == np.float64:  # the sum's rounding charge (a float32 steering
                    C, H, W = _image(g.nodes[j])  # pass is verified by none: no charge)
                    z = _typed(gb, ("absval", j), lambda: gb.absval[j],
                               S.Pt.dtype).reshape(C, H, W)
                    sums = np.empty((r, 3))
                    kernels.win_sums_t(S.Pt, S.oy, S.ox, window_runs(S), z, z, z, sums)
                    acc[2] += 2.0 * U64 * sums[:, 2]
                pending[j] = S
                return
        n = g.nodes[j].size
        a = _unwin(a, g.nodes[j], kernels) if isinstance(a, Win) else a
        b = _unwin(b, g.nodes[j], kernels) if isinstance(b, Win) else b
        idx, ma, mb = _union(a[0], b[0], n)
        St = np.empty((n if idx is None else idx.size, r), a[1].dtype)
        sums = np.zeros(r)
        z = _typed(gb, ("absval", j), lambda: gb.absval[j], St.dtype)
        kernels.merge_rows_t(np.ascontiguousarray(a[1]), ma, np.ascontiguousarray(b[1]), mb,
                             _take(z, idx), St, sums)
        acc[2] += 2.0 * U64 * sums
        pending[j] = (idx, St)

    steer = (first.Pt if isinstance(first, Win) else first[1]).dtype != np.float64
    walk = _FastWalk(acc, give, kernels, r, g.input_size, pending, pre, paired, steer)
    for i in range(target, -1, -1):
        rows = pending.pop(i, None)
        if rows is None:
            continue
        check_deadline(gb.deadline)
        node, rule = g.nodes[i], gb.plan[i]
        if isinstance(rows, Win):
            if rule.back_win(gb, i, node, rows, walk):
                continue
            rows = _unwin(rows, node, kernels)
        rule.back_t(gb, i, node, rows, walk)
    return walk.rows_over_input(), acc[0], acc[1], acc[2]


class WeightRows(NamedTuple):
    """Rows ``+-e_j`` over a dense node already taken through it: its weight's rows ``+-W_j``
    over its input ``node`` (held transposed), and the bias's ``+-b_j`` as constants with
    their magnitudes. Exact: a product by 1 and sums of one term take no rounding, so the
    step has no charge. ``paired``: the rows are ``[E; -E]`` (both sides of each neuron,
    :func:`paired_signs`) and ``rows`` holds E's alone, which an activation's step reads
    for both (``activation_step_t``) and whose products on the next dense layer it shares
    (``ActivationRule.back_t``, :func:`_transpose`); ``fused_rows`` writes both out for
    any other node."""
    node: int
    rows: Rows
    const: np.ndarray
    mag: np.ndarray
    paired: bool = False


def paired_signs(idx: np.ndarray, sign) -> bool:
    """Whether the rows ``sign[k] e_idx[k]`` are ``[E; -E]``: the same neurons twice, +1
    then -1."""
    h = idx.size // 2
    sign = np.asarray(sign)
    return h > 0 and idx.size == 2 * h and np.array_equal(idx[:h], idx[h:]) and \
        bool(np.all(sign[:h] == 1.0)) and bool(np.all(sign[h:] == -1.0))


def weight_rows(gb, target: int, idx: np.ndarray, dtype, sign,
                kernels) -> Optional[WeightRows]:
    """:class:`WeightRows` of the rows ``sign[k] e_idx[k]`` over node ``target`` when it is a
    dense (not sparse) layer of one input and :data:`WEIGHT_ROWS_MIN` outputs or more, else
    None."""
    node = gb.g.nodes[target]
    op = node.op
    if not isinstance(op, Dense) or op.sparse or len(node.inputs) != 1 \
            or op.size < WEIGHT_ROWS_MIN:
        return None
    W = _weight(gb, target, dtype)
    paired = paired_signs(idx, sign)
    first = idx[:idx.size // 2] if paired else idx  # rows [E; -E]: E alone
    Lt = np.empty((W.shape[1], first.size), dtype)
    kernels.weight_rows_t(W, np.asarray(first, np.int64),
                          np.asarray(sign[:first.size], dtype), Lt)
    b, absb = _bias(gb, target, np.float64)
    return WeightRows(node.inputs[0], (None, Lt), sign * b[idx], absb[idx], paired)


class _FastWalk:
    """One fast-path back-substitution's state as the node rules' ``back_t`` and
    ``back_win`` take it: ``acc`` (3, r) constant, magnitude, charge per row; ``give(j,
    rows)``; the numba kernels; the rows over the flat input (:meth:`to_input`)."""

    def __init__(self, acc, give, kernels, r: int, d: int, pending, pre, paired, steer: bool):
        # give, pending and pre are the walk's (fused_rows); give does not refer to the walk
        # (a reference cycle would keep the rows alive until the garbage collector runs)
        self.acc, self.give, self.kernels = acc, give, kernels
        self.r, self.d = r, d
        self.Lx = None
        self.pending = pending  # the rows given to each node not yet visited
        self.pre = pre  # an affine node's sums taken by its activation (input_terms_fused)
        self.paired = paired  # rows that are pairs (fused_rows)
        self.steer = steer  # float32 rows: a steering pass, its constants alone summed

    def to_input(self, offset: int, rows: Rows, size: int) -> None:
        """The rows over the input elements ``offset .. offset + size``: a graph of one input
        keeps them on their live elements (:class:`InputRows`); else they go into place."""
        if offset == 0 and size == self.d:
            self.Lx = InputRows(rows[0], rows[1], self.d)
            return
        if self.Lx is None:
            self.Lx = np.zeros((self.r, self.d), rows[1].dtype)
        self.Lx[:, offset:offset + size] = _full(rows, size).T

    def rows_over_input(self):
        """The rows over the flat input: an (r, d) array or :class:`InputRows`."""
        return np.zeros((self.r, self.d)) if self.Lx is None else self.Lx


class InputRows(NamedTuple):
    """Rows over the flat input held transposed on their live elements: ``Lt`` (k, r) the
    coefficients of the elements ``idx`` (None: all d)."""
    idx: Optional[np.ndarray]
    Lt: np.ndarray
    d: int

    def full(self) -> np.ndarray:
        """(r, d), C-ordered."""
        return np.ascontiguousarray(_full((self.idx, self.Lt), self.d).T)

    def terms(self, x0, qcode, kernels):
        """``input_sets.input_terms`` of the rows: (a . x0, dual norm, sum |a_k x0_k|) per
        row a, over the live elements only (the others are 0)."""
        from crown_cli.engine.input_sets import Box

        box = isinstance(qcode, Box)
        out = np.empty((self.Lt.shape[1], 3))
        kernels.input_terms_t(np.ascontiguousarray(self.Lt), _take(x0, self.idx),
                              0 if box else qcode, out)
        nrm = _take(qcode.radius, self.idx) @ np.abs(self.Lt) if box else out[:, 1]
        return out[:, 0], nrm, out[:, 2]


class WinInputRows(NamedTuple):
    """Rows over the flat input of a graph whose one input is an image (C, H, W), still on
    their windows (:class:`Win`): concretised from the windows, no rows over the whole
    input written first."""
    win: Win
    chw: Tuple[int, int, int]
    d: int

    def full(self) -> np.ndarray:
        """(r, d), C-ordered."""
        from crown_cli.engine.kernels import graph_kernels

        return InputRows(*_unwin_chw(self.win, self.chw, graph_kernels()), self.d).full()

    def terms(self, x0, qcode, kernels):
        """:meth:`InputRows.terms` from the windows, for an l_inf ball (``qcode`` 0, the dual
        norm l1) or a :class:`~crown_cli.engine.input_sets.Box` (:func:`concretes_windows`):
        per row (a . x0, sum |a_k| w_k, sum |a_k x0_k|) with w 1 or the box's radius."""
        from crown_cli.engine.input_sets import Box

        x = np.asarray(x0, np.float64).reshape(self.chw)
        w = qcode.radius.reshape(self.chw) if isinstance(qcode, Box) else np.ones(self.chw)
        out = np.empty((self.win.Pt.shape[3], 3))
        kernels.win_sums_t(self.win.Pt, self.win.oy, self.win.ox, window_runs(self.win), x,
                           np.abs(x), w, out)
        return out[:, 0], out[:, 2], out[:, 1]


def concretes_windows(gb) -> bool:
    """Whether rows reaching the input on windows are concretised from them
    (:class:`WinInputRows`): a graph of one image input, over an l_inf ball or a box."""
    from crown_cli.engine.input_sets import Box

    return isinstance(gb.qcode, Box) or gb.qcode == 0


FastInput = (InputRows, WinInputRows)  # what the fast path leaves over the input


def _bias(gb, i, dtype):
    """Affine node i's bias and its magnitude (zeros without one) as ``dtype``, kept on
    ``gb``."""
    cache = gb.__dict__.setdefault("_bias_cache", {})
    if (i, dtype) not in cache:
        op = gb.g.nodes[i].op
        b = np.zeros(gb.g.nodes[i].size) if op.bias is None else op.bias
        cache[i, dtype] = (np.asarray(b, dtype), np.asarray(np.abs(b), dtype))
    return cache[i, dtype]


def _lines(gb, i, p, dtype):
    """Activation node i's lines and its input p's magnitudes, as ``dtype``."""
    ln = gb.lines[i]
    return [_typed(gb, (name, i), lambda a=getattr(ln, name): a, dtype)
            for name in ("lower", "upper", "lower_icpt", "upper_icpt")] + \
        [_typed(gb, ("absval", p), lambda: gb.absval[p], dtype)]


def input_terms_fused(gb, i, p, walk) -> bool:
    """Whether activation node i's step also takes the sums of its input p, a convolution or
    a dense layer that has no rows yet: p's step takes the sums i computed (``_FastWalk.pre``)
    instead of reading its rows again, unless another of p's readers gives p rows too (then
    ``fused_rows``' ``give`` drops the sums). Where i reads p alone that cannot
    happen; where p has other readers they often hand nothing on (the branch of a clipped
    ReLU ``relu(x) - relu(x - 6)`` that never reaches its clip on the set)."""
    return isinstance(gb.g.nodes[p].op, (Conv, Dense)) and p not in walk.pending


def affine_terms(gb, i, dtype) -> np.ndarray:
    """Affine node i's (bias, |bias|, forward magnitude) as one (3, n) array of ``dtype``:
    what its step sums over the rows (``affine_terms_t``), kept on ``gb``."""
    cache = gb.__dict__.setdefault("_affine_terms", {})
    if (i, dtype) not in cache:
        b, absb = _bias(gb, i, dtype)
        absfwd = _typed(gb, ("absfwd", i), lambda: gb.absfwd[i], dtype)
        cache[i, dtype] = np.ascontiguousarray(np.stack([b, absb, absfwd]))
    return cache[i, dtype]


def _weight(gb, i, dtype):
    """Affine node i's weights as ``dtype`` (a float32 copy kept on the operation)."""
    op = gb.g.nodes[i].op
    return typed(op, "weight" if isinstance(op, Conv) else "W", dtype)


def _paired_product(Wk, Lt, n_a: int, kernels=None) -> np.ndarray:
    """``Wk^T Lt`` for rows that are pairs on the first ``n_a`` elements (``Lt[:n_a, h:] ==
    -Lt[:n_a, :h]``, h = r/2): those elements' products once, ``A = Wk[:n_a]^T Lt[:n_a, :h]``,
    added to the first half and taken from the second (``kernels.add_pairs_t``, else numpy).
    The same products in another order, one more sum per element: within the step's charge
    (gamma_{T+1})."""
    h = Lt.shape[1] // 2
    A = Wk[:n_a].T @ Lt[:n_a, :h]
    P = Wk[n_a:].T @ Lt[n_a:]
    if kernels is not None:
        kernels.add_pairs_t(P, A)
    else:
        P[:, :h] += A
        P[:, h:] -= A
    return P


def _transpose(gb, i, rows: Rows, kernels, shared: Optional[int] = None):
    """The rows pulled back through affine node i: one (idx, Lt) per input. ``shared``
    (a dense node): the rows are pairs, ``Lt[:shared, r/2:] == -Lt[:shared, :r/2]``, whose
    products on those elements are made once (``ActivationRule.back_t``)."""
    op = gb.g.nodes[i].op
    idx, Lt = rows
    dt = Lt.dtype
    if isinstance(op, Conv):
        in_idx, pos = _conv_live(op, idx)
        j = gb.g.nodes[i].inputs[0]
        if needed(gb, j) is None:
            return [(in_idx, op.transpose_t(Lt, idx, pos, _weight(gb, i, dt), kernels))]
        # only the elements the input hands on (an activation's, or a sum's of activations)
        elements = op.elements(pos)
        on = needed_mask(gb, j)[elements]
        return [(elements[on], op.transpose_t(Lt, idx, pos, _weight(gb, i, dt), kernels, on))]
    if isinstance(op, Dense) and not op.sparse:  # W^T Lt: one BLAS product
        W = _weight(gb, i, dt)
        if shared and idx is not None:
            return [(None, _paired_product(W[idx], Lt, shared, kernels))]
        if idx is not None and Lt.shape[1] <= FEW_ROWS_SCATTER and 3 * idx.size >= W.shape[0]:
            return [(None, W.T @ _full(rows, W.shape[0]))]  # W read once, not copied
        return [(None, (W if idx is None else W[idx]).T @ Lt)]
    if isinstance(op, Scale):  # elementwise: each live element's rows times its factor
        a = typed(op, "a", dt)
        return [(idx, Lt * (a if idx is None else a[idx])[:, None])]
    if isinstance(op, IndexMap):  # a move: the rows go to the sources they reach
        return op.transpose_t(Lt, idx)
    if hasattr(op, "transpose_t") and not isinstance(op, Conv):  # sparse Dense
        return [(None, P) for P in op.transpose_t(Lt, idx)]
    L = np.ascontiguousarray(_full(rows, op.size).T)
    return [(None, np.ascontiguousarray(P.T, dt)) for P in op.transpose(L)]
