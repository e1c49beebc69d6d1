"""CROWN on a graph network (:class:`crown_cli.graph.network.Graph`): back-substitution in
reverse topological order, float64, every rounding charged.

Rows ``Lam`` over a node's value are carried down the graph. Visiting the nodes from the
target down to the inputs, a node's rows are the sum of what its consumers sent it, and its
kind's rule (:mod:`crown_cli.engine.node_rules`, one class per kind) takes them through it:

- an affine node ``y = A(x_1..x_k) + b``: ``const += Lam b``, each input j receives
  ``Lam A_j`` (:meth:`transpose` of the operation: a transposed convolution, a scatter-add,
  a sparse product, never a dense matrix of a convolution);
- an activation node ``a = act(z)``: its linear relaxation (:mod:`crown_cli.engine.relaxations`,
  chosen per row by sign through :func:`crown_cli.engine.batch_steps.relax`), the intercepts go to
  ``const`` and ``D = Lam * slope`` to z;
- a max pool: per window, ``y >= x_k*`` (k* the input with the largest lower bound) for
  rows >= 0, ``y <= max_k u_k`` for rows < 0, ``y = x_k*`` when k* dominates the window
  (:class:`PoolLines`);
- an input node: its rows become columns of the rows over the flat input x, concretised over
  the input set (an l_p ball or a :class:`~crown_cli.engine.input_sets.Box`) by
  :func:`~crown_cli.engine.input_sets.input_terms`.

Every activation's pre-activation gets bounds first, in topological order: interval
arithmetic over the graph, tightened by CROWN (rows ``[I; -I]`` back-substituted from that
node) unless ``intermediate="interval"``; with ``intermediate="alpha"`` the neurons CROWN leaves
unstable are then tightened by alpha-CROWN (:func:`crown_cli.engine.graph_alpha.alpha_lower`
on their rows, the lower slopes of the nodes below optimised per row), as the dense engine's
alpha-CROWN does layer by layer.

Rounding (float64, unit u = 2**-53; :mod:`crown_cli.engine.rounding` has the dense chain's
version of the same argument). The computed bound is the exact bound of the computed rows, so
each rounded quantity is charged against a bound on what it multiplies over the input set
(``absval``: max(|lo|, |hi|) of each node's interval):

- a transpose ``Lam A`` with at most T products per sum errs by at most
  ``gamma_{T+1} |Lam| |A|`` per element; acting on the input's values this is at most
  ``gamma_{T+1} |Lam| @ (|A| absval_in)`` per row (``absfwd``: the operation's
  :meth:`forward_abs` of the inputs' absval), plus ``T * 2**-1074 * sum(absval_in)`` for
  products that underflow; an exact transpose (permutation, negation) has T = 0;
- an activation's ``D = fl(Lam * slope)``: ``2u |D| @ absval_z`` plus underflow;
- a node receiving rows from several consumers: each sum ``fl(P + Q)`` errs by at most
  ``2u |fl(P + Q)|``, charged against the node's absval;
- the constant terms (``Lam b``, intercepts) and the final sums: ``rtol`` of the magnitude
  sum, as in the dense chain (:func:`~crown_cli.engine.rounding.sum_rtol`: N counts the
  graph's nodes and widest node).

Interval arithmetic is rounded outward the same way (:func:`affine_interval`). The charges
sum to ``charge``; the bound is widened by ``ERR_SAFETY * charge`` (which also covers the
rounding of the charges' own non-negative computation) and the ``rtol`` allowance.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from crown_cli.engine.batch_steps import Lines
from crown_cli.engine.deadline import check_deadline
from crown_cli.engine.graph_rows import FastInput, fused_rows, unit_windows, weight_rows
from crown_cli.engine.input_sets import Box, input_terms
from crown_cli.engine.kernels import graph_kernels
from crown_cli.engine.node_rules import (AffineRule, InputRule, PoolLines, activation_interval,
                                         line_gap, plan)
from crown_cli.graph.ops import Dense, IndexMap, steer_dtype
from crown_cli.engine.rounding import ERR_SAFETY, U64, steering_quiet, sum_rtol, widen
from crown_cli.engine.threads import quiet_blas
ROW_BUDGET = 256 * 2 ** 20  # bytes of rows per back-substitution pass (identity rows chunked)
ROW_COPIES = 4  # per neuron: its two rows of [I; -I] as wide as the widest node, twice
# The peak memory of a back-substitution pass, as a multiple of its row budget: the rows'
# temporaries (a convolution's padded transpose, the relaxation's masks, |rows| for the
# charges). Measured with tracemalloc on scripts/graph_cost.py's net at 32x32: 4.1x at row
# budgets of 32 and 128 MiB, 8.0x at 8 MiB (the fixed part weighs more when chunks are small).
ROW_PEAK = 8
# intermediate="alpha": the optimisation of each node's rows stops early after this many steps
# without gaining 1e-3 of the rows' summed bound (graph_alpha.alpha_lower's patience)
INTERMEDIATE_PATIENCE = 2
# ... and a neuron read by activations that are not sign-stable (tanh, sigmoid, GELU, ...) is
# optimised only where its readers' CROWN lines lie at least this far apart over its
# interval: tighter bounds can only narrow that gap (docs/benchmarks.md: on residual tanh and
# sigmoid MNIST CNNs half the time, radii 0.04-0.15% lower)
ALPHA_GAP_MIN = 0.01
# bytes per row and product neuron of alpha-CROWN's mixed planes (node_rules.mixed_planes: the
# corners' gaps and errors, the slopes, intercepts and corners, the gradient)
MIX_BYTES = 128
# bytes per row and tanh / sigmoid / arctan neuron of alpha-CROWN's tangent points
# (graph_alpha.Tangents: the variable, its moments and best iterate, four float32 steering
# lines, four float64 lines of the verified pass)
TANGENT_BYTES = 64
# An affine node that would need at least FANOUT_MIN CROWN neurons and FANOUT times as many as
# its input has elements (softmax's differences x_j - x_i of every pair: 14,739 from 867 on
# vit ibp_3_3_8) is bounded through its input instead: the input refined, the node's interval
# from it. On ibp_3_3_8_4495 the three differences nodes' own rows took 60% of the
# intermediate bounds' time and moved the output bound by 0.0003 (docs/benchmarks.md).
FANOUT, FANOUT_MIN = 8, 4096


def row_bytes(graph, upto: Optional[int] = None) -> int:
    """Bytes a back-substitution pass takes per row of ``[I; -I]`` (one neuron): ROW_COPIES
    float64 arrays as wide as the widest node (up to node ``upto``)."""
    nodes = graph.nodes if upto is None else graph.nodes[:upto + 1]
    return 8 * ROW_COPIES * max(1, max(n.size for n in nodes))


def fixed_bytes(graph) -> int:
    """Bytes a :class:`GraphBounds` holds whatever its rows: interval, magnitude and forward
    magnitude per node, four lines per activation neuron, and every weight twice as float64
    (the weight and its absolute value)."""
    total = sum(n.size for n in graph.nodes)
    held = sum(rule.held * n.size for rule, n in zip(plan(graph), graph.nodes))
    return 8 * (3 * total + held) + 16 * graph.num_parameters


def row_budget_for(graph, budget: float) -> Optional[int]:
    """The row budget (bytes) of a bound within ``budget`` bytes in all: what the fixed part
    leaves, divided by :data:`ROW_PEAK`, at most :data:`ROW_BUDGET`; None when not even one
    neuron's rows fit."""
    left = (int(budget) - fixed_bytes(graph)) // ROW_PEAK
    if left < row_bytes(graph):
        return None
    return min(ROW_BUDGET, left)


def least_bytes(graph) -> int:
    """The least memory a bound of the graph takes: the fixed part and one neuron's pass."""
    return fixed_bytes(graph) + ROW_PEAK * row_bytes(graph)


TILES = 2  # an image-shaped node's neurons are bounded in up to TILES x TILES spatial groups
# ... on a float32 steering pass in STEER_TILES x STEER_TILES: fewer, larger walks (each walk's
# Python work per node does not grow with its rows), whose rows keep their windows longer;
# measured on the bench ResNet a float32 pass's kernels took 35 against 29-33 ms and the rest
# 17-19 against 27-32 ms, certify 8-12% faster (a float64 pass's window kernels grew by more
# than its walks saved: 90 against 79 ms, so it keeps TILES; docs/benchmarks.md, session 38)
STEER_TILES = 1
FEW_ROWS = 256  # a second pass of at most this many rows runs as one group, not per tile
# one side per neuron first (GraphBounds._one_sided) from this many neurons to refine: below
# it a second walk costs more than the rows it saves
ONE_SIDED_MIN = 256
# ... and the other side too where the interval's lies more than this many times as far from the
# centre as the side computed
OTHER_SIDE_RATIO = 1000.0


def _tiles(rows, shape, grid: int = TILES):
    """The neurons ``rows`` of a node in groups whose rows back-substitute together: on an
    image-shaped node (1, C, H, W) under the numba kernels, one group per tile of a
    ``grid`` x ``grid`` grid over (H, W) (every channel), so that each group's rows stay on
    few live elements of each node below (:mod:`crown_cli.engine.graph_rows`), its neurons
    position by position (the channels of one position consecutive: their rows' windows lie
    at one place, which the windows kernels read once for them, ``graph_rows.window_runs``);
    else one group."""
    if len(shape) != 4 or graph_kernels() is None or rows.size == 0:
        return [rows]
    H, W = int(shape[2]), int(shape[3])
    th, tw = -(-H // grid), -(-W // grid)
    pos = rows % (H * W)
    tile = (pos // W) // th * grid + (pos % W) // tw
    order = np.lexsort((rows // (H * W), pos, tile))
    cuts = np.flatnonzero(np.diff(tile[order])) + 1
    return np.split(rows[order], cuts)


def _both_sides(idx):
    """The rows ``[I; -I]`` of the neurons ``idx`` as (neuron, sign) per row."""
    return np.concatenate([idx, idx]), np.repeat([1.0, -1.0], idx.size)


def _sides(idx, sign):
    """The rows of the neurons ``idx`` as (neuron, sign) per row: one row of sign ``sign[k]``
    per neuron, two next to each other (+1, -1) where it is 0."""
    n = np.where(sign == 0.0, 2, 1)
    if n.size == 0 or n.max() == 1:
        return idx, sign
    out, sg = np.repeat(idx, n), np.repeat(sign, n)
    second = np.cumsum(n)[n == 2] - 1  # each pair's second row
    sg[second - 1], sg[second] = 1.0, -1.0
    return out, sg


def _unit_rows(idx, m, sign):
    """The rows ``sign[k] e_idx[k]`` over an m-neuron node: (len(idx), m)."""
    rows = np.zeros((idx.size, m))
    rows[np.arange(idx.size), idx] = sign
    return rows


@dataclass(frozen=True)
class BoundSettings:
    """:class:`GraphBounds`' settings, given to it as keywords (its docstring says what each
    does)."""

    method: str = "crown"
    intermediate: str = "crown"
    ibp: bool = True
    row_budget: Optional[int] = None
    alpha_iters: Optional[int] = None
    alpha_lr: Optional[float] = None
    deadline: Optional[float] = None
    dtype: Any = np.float64
    known: Optional[Dict[int, Tuple[np.ndarray, np.ndarray]]] = None
    hints: Optional[Dict[int, Tuple[np.ndarray, np.ndarray]]] = None


class GraphBounds:
    """Bounds of every node of ``graph`` over one input set, and CROWN bounds of linear
    functions of any node's value.

    ``x0``, ``eps``, ``qcode``: the input set as everywhere in the engine (an l_p ball:
    qcode 0 for l_inf, 1 for l_2, 2 for l_1; or ``Box.args()``). Keywords
    (:class:`BoundSettings`): ``method``: the relaxation
    family (``crown``, ``crown-paper``, ``fast-lin``). ``intermediate``: ``crown`` (CROWN
    bounds of every activation's input, intersected with interval arithmetic when ``ibp``;
    either way a node CROWN cannot tighten, :meth:`_exact`, keeps its interval)
    or ``interval``, or ``alpha`` (CROWN's, then each unstable neuron's bounds optimised
    over the lower slopes and max pool weights below it: at most ``alpha_iters`` steps of
    size ``alpha_lr``, default :data:`~crown_cli.engine.graph_alpha.ITERS` and ``LR``).
    ``deadline`` (``time.monotonic()``, None: none): the construction and every later
    :meth:`lower` raise :class:`~crown_cli.engine.deadline.DeadlineExceeded` at their next
    node past it. After construction ``lo[i]``, ``hi[i]`` enclose node i's value on the set.
    ``dtype`` float32: the fast path's rows and products in float32 (the interval arithmetic,
    the numpy path and the sums stay float64): a steering bound, **not verified** (a
    search's answer is checked by a float64 bound).
    ``known`` ({node: (lo, hi)}, optional): bounds of nodes' values already known to hold on
    this input set (e.g. a float64 bound's of a larger ball with the same centre): every
    node's bounds are intersected with them as they are set, so a ReLU neuron they prove
    stable takes no rows. The caller answers for them: bounds of a float32 pass only steer
    another float32 pass.
    ``hints`` ({node: (lo, hi)}, optional): bounds of another pass on a nearby set, taken
    only as guesses (never as bounds): where a node's neurons are bounded one side first
    (:meth:`node_bounds`), a neuron they leave unstable has both sides in the first walk
    instead of one side per walk.
    """

    def __init__(self, graph, x0, eps, qcode, **settings):
        with quiet_blas(graph):
            self._build(graph, x0, eps, qcode, BoundSettings(**settings))

    def _build(self, graph, x0, eps, qcode, o):
        intermediate, deadline = o.intermediate, o.deadline
        self.deadline = deadline
        self.dtype = np.dtype(o.dtype).type
        self.known = o.known or {}
        self.hints = o.hints or {}
        self._centre_vals = None  # every node's value at x0 (_centre), when first needed

        if intermediate not in ("crown", "interval", "alpha", "forward"):
            raise ValueError("intermediate must be 'crown', 'interval', 'alpha' or 'forward', "
                             f"not {intermediate!r}")
        self.g, self.x0, self.eps, self.qcode = graph, np.asarray(x0, np.float64), float(eps), qcode
        self.rtol = sum_rtol(graph)
        self.method_name = o.method
        # the graph's own (set by --memory-budget), else the default
        self.row_budget = o.row_budget if o.row_budget is not None else \
            getattr(graph, "row_budget", None) or ROW_BUDGET
        n = len(graph.nodes)
        self.lo: List[Optional[np.ndarray]] = [None] * n
        self.hi: List[Optional[np.ndarray]] = [None] * n
        self.absval: List[Optional[np.ndarray]] = [None] * n
        self.absfwd: Dict[int, np.ndarray] = {}
        self.lines: Dict[int, Lines] = {}
        self.pools: Dict[int, PoolLines] = {}
        self.planes: Dict[int, Tuple[np.ndarray, ...]] = {}  # products' (a, b, icL, icU)
        self.plan = plan(graph)  # the rules of each node (crown_cli.engine.node_rules)
        if intermediate == "forward":
            self._forward_intervals()
            return
        refined = set()
        how = (intermediate, o.ibp, o.alpha_iters, o.alpha_lr)
        for i, node in enumerate(graph.nodes):
            check_deadline(deadline)
            if intermediate != "interval":
                for p in self.plan[i].refined_inputs(node):
                    self._refine(p, refined, how)
            self._set(i, *self._interval(i, node))

    def _forward_intervals(self):
        """Every node's interval: its rule's, intersected with its forward linear bounds'
        range (:mod:`crown_cli.engine.graph_forward`)."""
        from crown_cli.engine.graph_forward import ForwardPass, supported

        if not supported(self.g):
            raise ValueError("intermediate='forward': the graph has nodes without a forward "
                             "rule (max pools)")
        fw = ForwardPass(self)
        for i, node in enumerate(self.g.nodes):
            check_deadline(self.deadline)
            self._set(i, *self._interval(i, node))
            with np.errstate(invalid="ignore", over="ignore"):  # nan: no bound (fmax)
                lo, hi = fw.step(i, node)
            self._set(i, np.fmax(lo, self.lo[i]), np.fmin(hi, self.hi[i]))

    def _refine(self, p, refined, how):
        """Node p's CROWN (or alpha-CROWN) bounds in place of its interval. An index map that
        takes some element more than once (a broadcast: attention's factors) takes its
        sources' refined bounds through its interval, which copies them exactly, instead of
        rows of its own (as many as its elements)."""
        intermediate, ibp, alpha_iters, alpha_lr = how
        if p in refined or self._exact(p):
            return
        node = self.g.nodes[p]
        if isinstance(node.op, IndexMap) and node.inputs and not node.op.unique:
            for s in node.inputs:
                self._refine(s, refined, how)
            self._set(p, *self._interval(p, node))
            refined.add(p)
            return
        rows = self._rows_to_refine(p) if ibp else None
        if self._through_input(p, node.size if rows is None else rows.size):
            self._refine(node.inputs[0], refined, how)
            self._set(p, *self._interval(p, node))
            refined.add(p)
            return
        if self._one_sided(p, rows):
            l, u = self.node_bounds(p, rows, self._centre(p), self._unstable_hint(p))
        else:
            l, u = self.node_bounds(p, rows)
        if ibp:
            l, u = np.maximum(l, self.lo[p]), np.minimum(u, self.hi[p])
        self._set(p, l, u)
        if intermediate == "alpha":
            self._set(p, *self._alpha_bounds(p, alpha_iters, alpha_lr))
        refined.add(p)

    def _one_sided(self, p, rows) -> bool:
        """Whether node p's neurons need only the side of their bounds that proves their
        sign (:meth:`node_bounds` with a guess): sign-stable activations read p (``rows``
        not None: their lines need no more once the sign is proven), and only affine nodes
        read those activations (nothing takes lines from their intervals: a max pool or a
        product would, and their upper bounds stay the interval's), at least
        :data:`ONE_SIDED_MIN` neurons to refine, and no bounds of p known already (those a
        certify search takes from a larger ball leave mostly the neurons unstable there).
        The neuron's value at the centre is the guess: a neuron stable on the set has its
        sign there."""
        if rows is None or rows.size < ONE_SIDED_MIN or p in self.known:
            return False
        return self._readers_affine(p)

    def _unstable_hint(self, p):
        """Node p's neurons that :attr:`hints` leave of unknown sign (a mask), or None."""
        if p not in self.hints:
            return None
        lo, hi = self.hints[p]
        return ~((lo > 0.0) | (hi < 0.0))

    def _readers_affine(self, p) -> bool:
        """Whether only affine nodes read the nodes that read p (no max pool or product
        takes lines from their intervals)."""
        g = self.g
        return all(g.consumers[a] and all(isinstance(self.plan[c], AffineRule)
                                          for c in g.consumers[a])
                   for a in g.consumers[p])

    def _centre(self, p) -> np.ndarray:
        """Node p's value at the input set's centre (``x0``; a box's centre), float64."""
        if self._centre_vals is None:
            with np.errstate(all="ignore"):
                self._centre_vals = self.g.forward(self.x0[None], return_all=True)[1]
        return np.asarray(self._centre_vals[p]).reshape(-1)

    def _through_input(self, p, n_rows: int) -> bool:
        """Whether node p (``n_rows`` neurons to refine) is bounded through its input
        (:data:`FANOUT`, :data:`FANOUT_MIN`): an affine node of one data input that many
        times its size."""
        node = self.g.nodes[p]
        if not (isinstance(self.plan[p], AffineRule) and len(node.inputs) == 1):
            return False
        src = self.g.nodes[node.inputs[0]]
        return n_rows >= FANOUT_MIN and n_rows >= FANOUT * src.size and \
            not isinstance(self.plan[node.inputs[0]], InputRule)

    def _alpha_bounds(self, p, iters, lr):
        """Node p's bounds with the neurons CROWN left unstable (when a reader is not a
        sign-stable activation: those whose readers' lines are apart, :meth:`_loose`)
        tightened by :func:`~crown_cli.engine.graph_alpha.alpha_lower` on their rows
        ``[I; -I]``, in chunks: each row keeps per node below p its lines and values
        (about 3 floats per neuron, :data:`MIX_BYTES` more per product neuron,
        :data:`TANGENT_BYTES` more per tanh, sigmoid or arctan neuron)."""
        from crown_cli.engine.graph_alpha import ITERS, LR, TANGENT_KINDS, alpha_lower, \
            free_below

        l, u = self.lo[p].copy(), self.hi[p].copy()
        rows = self._rows_to_refine(p)
        rows = self._loose(p) if rows is None else rows[(l[rows] < 0.0) & (u[rows] > 0.0)]
        if rows.size == 0 or not free_below(self, p):
            return l, u
        below = self.g.nodes[:p + 1]
        per_row = 24 * sum(n.size for n in below) + row_bytes(self.g, p) \
            + MIX_BYTES * sum(n.size for n in below if n.kind == "product") \
            + TANGENT_BYTES * sum(n.size for n in below if n.kind == "activation"
                                  and n.op.name in TANGENT_KINDS)
        chunk = max(1, int(self.row_budget // per_row) // 2)
        for s in range(0, rows.size, chunk):
            idx = rows[s:s + chunk]
            # l and u are verified bounds of these rows already (CROWN's, with the interval)
            both, sign = _both_sides(idx)
            low = alpha_lower(self, p, _unit_rows(both, l.size, sign),
                              ITERS if iters is None else iters,
                              LR if lr is None else lr, patience=INTERMEDIATE_PATIENCE,
                              crown=np.concatenate([l[idx], -u[idx]]))
            l[idx], u[idx] = np.fmax(l[idx], low[:idx.size]), np.fmin(u[idx], -low[idx.size:])
        return l, u

    def _loose(self, p):
        """The neurons of node p whose readers' CROWN lines lie at least
        :data:`ALPHA_GAP_MIN` apart somewhere on its interval (every neuron when a reader is
        not an activation): where every reader's lines are closer, the neuron's bounds,
        however tight, change those lines by less (later nodes see the neuron only through
        them and through intervals)."""
        l, u = self.lo[p], self.hi[p]
        readers = [self.g.nodes[a] for a in self.g.consumers[p]]
        if not readers or any(n.kind != "activation" for n in readers):
            return np.arange(l.size)
        gap = np.zeros(l.size)
        with np.errstate(invalid="ignore", over="ignore"):
            for n in readers:
                lines, _, _ = activation_interval(n.op, self.method_name, l, u, self.absval[p])
                gap = np.maximum(gap, line_gap(l, u, *(np.broadcast_to(a, l.shape)
                                                        for a in lines)))
        return np.flatnonzero(~(gap < ALPHA_GAP_MIN))  # an unbounded neuron stays (nan, inf)

    def _rows_to_refine(self, p):
        """The neurons of node p whose CROWN bounds can change a relaxation: when only
        sign-stable activations (ReLU, leaky ReLU) read p, those its interval leaves
        unstable (a stable one's lines do not depend on the interval), where only affine
        nodes read those activations; where another node reads them (a max pool, a product:
        their lines come from the activations' intervals, which an active neuron's bounds
        are), also the active ones (a ReLU's inactive neurons give 0 whatever their bounds);
        else None (all)."""
        g = self.g
        acts = g.consumers[p]
        if not all(self.plan[c].sign_stable(g.nodes[c]) for c in acts):
            return None
        if self._readers_affine(p):
            return np.flatnonzero((self.lo[p] < 0.0) & (self.hi[p] > 0.0))
        if all(g.nodes[a].op.name == "relu" for a in acts):
            return np.flatnonzero(self.hi[p] > 0.0)
        return None

    def _exact(self, p) -> bool:
        """True when CROWN cannot tighten node p's interval: an input, an activation (its
        interval is its lines' range on its input's bounds, which is what CROWN would give),
        or one affine operation of the inputs over a box or an l_inf ball."""
        if self.plan[p].exact_interval:
            return True
        box_like = isinstance(self.qcode, Box) or self.qcode == 0
        return box_like and isinstance(self.plan[p], AffineRule) and all(
            isinstance(self.plan[j], InputRule) for j in self.g.nodes[p].inputs)

    def _interval(self, i, node):
        """Node i's interval by its rule. Past an unbounded node the arithmetic meets inf - inf
        or inf * 0: nan, which :meth:`_set` takes as no bound, so numpy's warnings are off."""
        with np.errstate(invalid="ignore", over="ignore"):
            return self.plan[i].interval(self, i, node)

    def _set(self, i, lo, hi):
        # nan (an infinite bound met a zero slope: a node past an unbounded one) is no bound
        if np.isnan(lo).any() or np.isnan(hi).any():
            lo, hi = np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)
        if i in self.known:  # bounds that hold on this set already: the tighter of each
            lo, hi = np.maximum(lo, self.known[i][0]), np.minimum(hi, self.known[i][1])
        self.lo[i], self.hi[i] = lo, hi
        self.absval[i] = np.maximum(np.abs(lo), np.abs(hi))

    # -- bounds ------------------------------------------------------------------------------
    def node_bounds(self, target: int, rows=None, guess=None, both=None):
        """CROWN bounds (l, u) of node ``target``'s value: rows [I; -I], chunked to the row
        budget. With ``rows`` (indices) only those neurons are computed; the others keep
        their interval. With ``guess`` (per neuron of the node, e.g. its value at the
        centre), one side per neuron first: the lower bound where the guess is > 0, the
        upper elsewhere (the side that can prove the sign, the only one a ReLU's lines need
        once it is stable), and both sides at once for the neurons of the mask ``both``
        (optional: those a nearby set's bounds leave unstable); the other side only for the
        neurons that side left unproven (their other bound stays the interval's), or whose
        interval side lies more than :data:`OTHER_SIDE_RATIO` times as far from the guess as
        the side computed."""
        m = self.g.nodes[target].size
        if rows is None:
            rows = np.arange(m)
        if self.lo[target] is not None:
            l, u = self.lo[target].copy(), self.hi[target].copy()
        else:
            l, u = np.full(m, -np.inf), np.full(m, np.inf)
        op = self.g.nodes[target].op
        mirror = op.mirrors()[rows] if isinstance(op, Dense) else None
        paired = None if mirror is None else (mirror >= 0) & np.isin(mirror, rows)
        if paired is not None and paired.any():
            # a neuron whose affine function is the negation of one bounded here takes
            # that one's bounds, negated and swapped: its rows are that one's rows
            lo_k, hi_k = self.node_bounds(target, rows[~paired], guess, both)
            src, dst = mirror[paired], rows[paired]
            l[rows[~paired]], u[rows[~paired]] = lo_k[rows[~paired]], hi_k[rows[~paired]]
            l[dst], u[dst] = -hi_k[src], -lo_k[src]
            return l, u
        if guess is None:
            self._signed_bounds(target, rows, None, l, u)
            return l, u
        centre = np.asarray(guess)[rows]
        sign = np.where(centre > 0.0, 1.0, -1.0)
        if both is not None:
            sign[both[rows]] = 0.0
        self._signed_bounds(target, rows, sign, l, u)
        # unproven: the side computed leaves the sign open (l <= 0 or u >= 0); or too wide:
        # the other side, still the interval's, lies more than OTHER_SIDE_RATIO times as far
        # from the centre as the side computed (intervals compound with depth: on deep
        # networks the magnitudes they give the rounding charges and later intervals grow
        # without bound, docs/benchmarks.md)
        near = np.where(sign > 0.0, centre - l[rows], u[rows] - centre)
        far = np.where(sign > 0.0, u[rows] - centre, centre - l[rows])
        left = (np.where(sign > 0.0, l[rows] <= 0.0, u[rows] >= 0.0) |
                (far > OTHER_SIDE_RATIO * np.maximum(near, 0.0))) & (sign != 0.0)
        if left.any():  # (few rows: one group, not one per tile)
            self._signed_bounds(target, rows[left], -sign[left], l, u,
                                tiles=left.sum() > FEW_ROWS)
        return l, u

    def _signed_bounds(self, target: int, rows, sign, l, u, tiles: bool = True) -> None:
        """One CROWN bound per (neuron, side) into ``l`` / ``u``: the lower bound of neuron
        ``rows[k]`` where ``sign[k]`` is +1, its upper where -1, both where 0 (``sign``
        None: both for every neuron). Both sides of a neuron are two rows of one walk: on an
        image-shaped node next to each other (their windows at one place), else as the
        pairs ``[I; -I]`` of a walk of their own (a dense node's products shared)."""
        node = self.g.nodes[target]
        m = node.size
        both = sign is not None and bool((sign == 0.0).any())
        if both and len(node.shape) != 4:
            self._signed_bounds(target, rows[sign == 0.0], None, l, u, tiles)
            rows, sign, both = rows[sign != 0.0], sign[sign != 0.0], False
            if rows.size == 0:
                return
        side = None if sign is None else np.zeros(m)
        if side is not None:
            side[rows] = sign
        chunk = max(1, int(self.row_budget // row_bytes(self.g, target)))
        if both:
            chunk = max(1, chunk // 2)  # each neuron up to two rows
        fused = graph_kernels()
        grid = TILES if self.dtype == np.float64 else STEER_TILES
        for group in _tiles(rows, node.shape, grid if tiles else 1):
            for s in range(0, group.size, chunk):
                idx = group[s:s + chunk]
                idx, sg = _both_sides(idx) if side is None else _sides(idx, side[idx])
                win = None if fused is None else (
                    unit_windows(self.g.nodes[target], idx, self.dtype, sg)
                    or weight_rows(self, target, idx, self.dtype, sg, fused))
                if win is None:
                    low = self.lower(target, _unit_rows(idx, m, sg))
                else:  # the fast path, its rows on windows from the start
                    low = self._concretise(*fused_rows(self, target, win, fused, self.dtype))
                up = sg > 0.0
                l[idx[up]], u[idx[~up]] = low[up], -low[~up]

    def bounds(self, C=None, target: Optional[int] = None):
        """Lower and upper CROWN bounds of ``C @ value(target)`` (default: the output node,
        C the identity) over the input set."""
        target = self.g.output if target is None else target
        if C is None:
            return self.node_bounds(target)
        C = np.atleast_2d(np.asarray(C, np.float64))
        low = self.lower(target, np.vstack([C, -C]))
        return low[:C.shape[0]], -low[C.shape[0]:]

    def lower(self, target: int, Lam: np.ndarray, free=None, tape=None, lines=None,
              rows: bool = False, steer=None) -> np.ndarray:
        """Verified float64 lower bounds of ``Lam @ value(target)`` (rows (r, size));
        ``rows``: ``(bounds, the rows carried to the flat input (r, d))``.
        ``free`` (optional, {node: per-row parameters}): each row's own choice among a node's
        valid lines, in place of the relaxation's (:mod:`crown_cli.engine.graph_alpha`): for
        a ReLU or leaky ReLU node (r, size) lower-line slopes (lines through 0); for a max
        pool (r, m, K) weights of the lower line ``y >= sum_k w_k x_k`` per window
        (:meth:`PoolLines.back`); for a product (r, size) the mix in [0, 1] of McCormick's
        planes (:func:`~crown_cli.engine.node_rules.mixed_planes`).
        ``lines`` (optional, {activation node: :class:`Lines` over all its neurons, arrays
        (r, size) or broadcastable}): each row's own lines at those nodes, in place of the
        relaxation's and of ``free``, with ``extra`` (r, size) added to the coefficients of
        the node's input (ReLU splitting's split multipliers,
        :mod:`crown_cli.verification.bab.graph_bounder`). They must be valid wherever the
        caller claims the bound (e.g. on a subdomain); the arithmetic is charged as always.
        ``tape`` (optional dict) receives what a gradient in the parameters needs: per
        visited node i, for an activation (rows reaching it, the side each took (>= 0: lower
        line), the slope and intercept of the line taken), for a max pool the rows reaching
        it, for a product (rows, intercepts taken, slopes, the mix's corners or None), else
        None; under ``"Lx"`` the rows carried back to the input.
        ``steer`` (np.float32): the numpy path's rows and products in that dtype, a steering
        estimate, **not verified** (alpha-CROWN's iterations; the answer is bounded again
        in float64)."""
        with quiet_blas(self.g):
            return self._lower(target, Lam, free, tape, lines, rows, steer)

    def _lower(self, target, Lam, free, tape, lines, rows, steer):
        fused = graph_kernels()  # None under the numpy kernels: the twin below runs
        # float32 may overflow where float64 does not: that iterate only steers worse
        with steering_quiet(steer is not None):
            if fused is not None and free is None and tape is None and lines is None \
                    and steer is None:
                Lx, const, mag, charge = fused_rows(self, target, Lam, fused, self.dtype)
            else:
                Lam = np.asarray(Lam, np.float64 if steer is None else steer)
                Lx, const, mag, charge = self._rows(target, Lam, free, tape, lines)
            low = self._concretise(Lx, const, mag, charge)
        if rows and isinstance(Lx, FastInput):
            Lx = Lx.full()
        return (low, Lx) if rows else low

    def _concretise(self, Lx, const, mag, charge):
        """Verified lower bounds of the rows ``Lx`` over the flat input (an (r, d) array or
        the fast path's :class:`~crown_cli.engine.graph_rows.InputRows` or ``WinInputRows``)
        plus ``const``, over the input set, widened by the rounding allowance and the
        charges."""
        if isinstance(Lx, FastInput):
            lin, nrm, xm = Lx.terms(self.x0, self.qcode, graph_kernels())
        else:
            lin, nrm, xm = input_terms(Lx, self.x0, self.qcode)
        eps = self.eps
        low = widen(lin - eps * nrm + const, xm + eps * nrm + mag, -1.0, self.rtol,
                    ERR_SAFETY * charge)
        # nan: an unbounded term (a division by an interval holding 0) met a zero: no bound
        return np.where(np.isnan(low), -np.inf, low)

    def _rows(self, target, Lam, free, tape, lines):
        """:meth:`lower`'s back-substitution in numpy, any lines (the twin of
        :func:`crown_cli.engine.graph_rows.fused_rows`): (rows over the input, constant,
        magnitude, charge) per row. Each node's step is its rule's ``back``
        (:mod:`crown_cli.engine.node_rules`)."""
        walk = _Walk(self, target, Lam, free, tape, lines)
        for i in range(target, -1, -1):
            L = walk.pending.pop(i, None)
            if L is None:
                continue
            check_deadline(self.deadline)
            if tape is not None:
                tape[i] = None  # an activation's or a max pool's rule records its own
            self.plan[i].back(self, i, self.g.nodes[i], L, walk)
        if tape is not None:
            tape["Lx"] = walk.Lx
        return walk.Lx, walk.const, walk.mag, walk.charge


class _Walk:
    """One numpy back-substitution's state: per row the constant, its magnitude and the
    rounding charge; the rows pending at each node, the rows over the flat input; the
    caller's per-row lines and free parameters, and the tape."""

    def __init__(self, gb, target, Lam, free, tape, lines):
        r = Lam.shape[0]
        self.gb = gb
        self.const, self.mag, self.charge = np.zeros(r), np.zeros(r), np.zeros(r)
        dt = steer_dtype(Lam)  # float32: a steering pass
        self.pending: Dict[int, np.ndarray] = {target: np.ascontiguousarray(Lam, dtype=dt)}
        # a steering pass (float32) needs only the constant: no magnitudes, no charges
        self.steer = dt != np.float64
        self.Lx = np.zeros((r, gb.g.input_size), dt)
        self.free, self.tape, self.lines = free, tape, lines

    def give(self, j, P):
        """Rows P for node j, added to what it has (the sum's rounding charged)."""
        if j not in self.pending:
            self.pending[j] = P
            return
        A = self.pending[j]
        if self.steer:
            self.pending[j] = A + P
            return
        kernels = graph_kernels()
        if kernels is not None and A.flags.c_contiguous and P.flags.c_contiguous \
                and A.dtype == P.dtype == np.float64:
            S, ch = np.empty_like(A), np.empty(A.shape[0])
            kernels.add_rows(A, P, self.gb.absval[j], S, ch)
        else:
            S = A + P
            ch = np.abs(S) @ self.gb.absval[j]
        self.charge = self.charge + 2.0 * U64 * ch
        self.pending[j] = S


def graph_bounds(graph, x0, eps, qcode, C=None, **options):
    """Lower and upper CROWN bounds of ``C @ output`` (C None: each output) over the input
    set; ``options`` as :class:`GraphBounds`."""
    return GraphBounds(graph, x0, eps, qcode, **options).bounds(C)
