"""Certified radii on graph networks (:class:`crown_cli.graph.network.Graph`): the certify
search of :class:`crown_cli.certification.certifier.Certifier` with each bound evaluation a
float64 :class:`crown_cli.engine.graph_bounds.GraphBounds` (every rounding charged).

Methods: ``crown``, ``crown-paper`` and ``fast-lin`` (the relaxation family of every
activation node; fast-lin on ReLU-type activations only), and ``alpha-crown``: the ReLU and
leaky ReLU lower slopes, max pool lower lines, products' planes and the tangent points of
tanh, sigmoid and arctan optimised for the margin rows and, as in the dense engine's
alpha-CROWN, for every unstable intermediate neuron's bounds
(:mod:`crown_cli.engine.graph_alpha`; other activations keep CROWN's lines). Every other method is
refused by name (InputError) until it runs on graphs. With ``precision="mixed"`` (the default,
as the dense engine's) the search of ``crown``, ``crown-paper`` and ``fast-lin`` steers with
float32 bounds (:class:`~crown_cli.engine.graph_bounds.GraphBounds` ``dtype=float32``) and
verifies its answer in float64 (:func:`~crown_cli.engine.radius_search.mixed_search`, the
dense certifier's); ``alpha-crown`` and ``precision="float64"`` evaluate in float64 only,
``alpha-crown`` from next to CROWN's radius (:meth:`GraphCertifier._crown_start`).
The dense engine's stable-neuron reuse is not there yet.

Images: crown's image vectors are row-major (height, width, channel); :func:`to_graph_layout`
puts them in the graph's own input layout (an ONNX input (1, C, H, W) is channel-first), a
permutation, so l_p radii are unchanged. Arrays in, results out: no files, no printing.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from crown_cli.certification.attack import DEFAULT_RESTARTS, DEFAULT_STEPS, PGDAttack
from crown_cli.certification.certifier import (Certificate, CertifySettings, RadiusSearch,
                                               check_alpha_options, first_order_start,
                                               parse_norm)
from crown_cli.engine.deadline import DeadlineExceeded
from crown_cli.engine.input_sets import NORMS
from crown_cli.errors import InputError

GRAPH_METHODS = ("crown", "crown-paper", "fast-lin", "alpha-crown")


def check_graph_method(method: str, where: str = "graph network") -> None:
    if method not in GRAPH_METHODS:
        raise InputError(f"--method {method}: not available on graph networks yet ({where}; "
                         f"graphs take {', '.join(GRAPH_METHODS)})")


def depth(graph, shortest: bool = False) -> int:
    """The most activation and max-pool nodes on one path from an input to the output (the
    number of hidden layers of a chain); with ``shortest`` the fewest (a residual network's
    skip connections make a path with fewer)."""
    pick = min if shortest else max
    d = [0] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        below = pick((d[j] for j in n.inputs), default=0)
        d[i] = below + (n.kind in ("activation", "maxpool"))
    return d[graph.output]


def channel_first(graph) -> Optional[tuple]:
    """(C, H, W) when the graph has one input of shape (1, C, H, W) with C > 1 (its flat
    order is not crown's (H, W, C) image order), else None: also for a Keras graph, whose
    image input (1, H, W, C) is crown's order, and for an ONNX input that is channel-last
    (1, H, W, C): at most 4 in its last dimension and more than 4 in its second (a
    TensorFlow export's (1, 32, 32, 3) or (1, 28, 28, 1))."""
    if len(graph.inputs) != 1 or getattr(graph, "channels_last", False):
        return None
    shape = tuple(graph.nodes[graph.inputs[0]].shape)
    if len(shape) != 4 or shape[1] == 1 or (shape[3] <= 4 < shape[1]):
        return None
    return shape[1:]


def to_graph_layout(graph, x: np.ndarray) -> np.ndarray:
    """crown's image vectors x (N, n), row-major (H, W, C), in the graph's input order."""
    chw = channel_first(graph)
    x = np.asarray(x, dtype=np.float64)
    if chw is None or x.shape[1] != graph.input_size:
        return x
    C, H, W = chw
    return np.ascontiguousarray(x.reshape(-1, H, W, C).transpose(0, 3, 1, 2).reshape(x.shape[0], -1))


class GraphCertifier(RadiusSearch):
    """One graph network, one norm and method: :meth:`certify` per image (in the graph's
    input layout), predicted class and targets, as :class:`Certifier` (the same radius
    search, :class:`RadiusSearch`), its ``settings`` the fields of :class:`CertifySettings`.
    ``ibp``: intersect CROWN's intermediate bounds with interval arithmetic, refining only
    the neurons it leaves unstable (sound; ``False``: CROWN's bounds of every neuron, as the
    dense engine)."""

    # the first radius: the whole first-order distance over the search's depth (the dense
    # certifier takes half): an evaluation below one already made takes that ball's bounds
    # (Balls) and costs about half, so starting nearer the root, or above it, pays
    # (docs/benchmarks.md, the resnet case)
    START_FRACTION = 1.0
    # going up from a certified radius, the drop's power law of degree 1.5 whatever the depth
    # (the dense certifier's half of it is 2.5 on the bench ResNet): measured from the first
    # radius to the root, 1.06-2.07 (per-network medians) on five convolutional and residual
    # networks, so that 2.5 kept landing below the root, and each step up, with no larger
    # ball's bounds, costs about twice one down (docs/benchmarks.md, session 39)
    UP_POWER = 1.5
    record_proof = False  # crown certify --proof (method crown): say the bound is CROWN's
    proof_writer = None  # crown certify --proof: the ProofWriter its certified rows go to
    ALPHA_START = 1.02  # alpha-crown's search starts at this times CROWN's radius ...
    CROWN_START_RTOL = 1e-2  # ... which a float32 search finds to this tolerance

    def __init__(self, graph, ibp: bool = True, **settings):
        from crown_cli.engine.graph_alpha import ITERS, LR
        from crown_cli.engine.relaxations import get_relaxation

        o = CertifySettings(**settings)
        check_graph_method(o.method, graph.source or "graph network")
        self.graph, self.method, self.ibp, self.timeout = graph, o.method, ibp, o.timeout
        self.family = "crown" if o.method == "alpha-crown" else o.method
        for n in graph.nodes:  # the registry names an activation without this method
            if n.kind == "activation":
                get_relaxation(n.op.name, self.family, n.op.alpha)
        # alpha-crown: steps and step size of every optimisation (intermediate bounds and
        # margin rows); None: the graph engine's own (engine.graph_alpha.ITERS, LR)
        check_alpha_options(o.alpha_iters, o.alpha_lr)
        self.alpha_iters = ITERS if o.alpha_iters is None else int(o.alpha_iters)
        self.alpha_lr = LR if o.alpha_lr is None else float(o.alpha_lr)
        self.norm = parse_norm(o.norm)
        self.qcode = NORMS[self.norm]
        # the search's depth (its first radius and power law, as a chain's hidden layers):
        # the shortest path's, along which the margin's bound falls like a shallower
        # network's (measured: docs/benchmarks.md, the resnet case; a chain's is its depth)
        self.num_hidden, self.n_classes = depth(graph, shortest=True), graph.output_size
        self._search_settings(o, graph.input_size, float64_only=o.method == "alpha-crown")

    def warm_up(self) -> None:
        """Load the graph kernels this certifier uses, so the first image's time is its own:
        one certification of a tiny convolutional network with a residual sum (numba loads
        or compiles each kernel at its first call per type: float32 and float64 here)."""
        from crown_cli.engine.kernels import graph_kernels

        if graph_kernels() is None or self.method == "alpha-crown":
            return  # the numpy kernels; alpha-crown's evaluations take the numpy path
        rng = np.random.default_rng(0)
        tiny = GraphCertifier(_tiny_graph(rng), method=self.method, norm=self.norm,
                              search=self.search, precision=self.precision)
        x0 = rng.uniform(0.0, 1.0, tiny.graph.input_size)
        c = int(np.argmax(tiny.logits(x0)))
        tiny.certify(x0, c, [1 - c])

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self.graph.forward(x)

    def lower_bound(self, x0: np.ndarray, eps: float, C: np.ndarray,
                    dtype=np.float64, balls: Optional["Balls"] = None,
                    deadline: Optional[float] = None, crown: bool = False) -> np.ndarray:
        """Verified float64 lower bounds of C @ f(x) over the eps-ball around x0, (r,)
        (``dtype`` float32: a steering estimate, not verified). ``balls``: the node bounds of
        the search's earlier evaluations around x0 (:class:`Balls`): a float32 pass takes
        the nearest larger ball's as known; every pass adds its own. ``crown``: CROWN's
        bound whatever the method (where alpha-crown's search starts)."""
        from crown_cli.engine.graph_alpha import alpha_lower
        from crown_cli.engine.graph_bounds import GraphBounds

        alpha = self.method == "alpha-crown" and not crown
        iters, lr = self.alpha_iters, self.alpha_lr
        # only a steering pass takes them: a verified bound is the ball's own, whatever the
        # search's path (CROWN is not monotone in its intervals, and alpha-CROWN's stop is not)
        steer = np.dtype(dtype) == np.float32
        known = balls.nearest(eps) if balls is not None and steer else None
        # without them, the closest ball's bounds guess which neurons need both sides
        hints = balls.closest(eps) if balls is not None and known is None else None
        gb = GraphBounds(self.graph, x0, float(eps), self.qcode, method=self.family,
                         ibp=self.ibp, intermediate="alpha" if alpha and iters else "crown",
                         alpha_iters=iters, alpha_lr=lr, dtype=dtype, known=known,
                         hints=hints, deadline=deadline)
        if balls is not None:
            balls.add(eps, gb)
        if alpha:
            return alpha_lower(gb, self.graph.output, C, iters, lr)
        return gb.lower(self.graph.output, C)

    def start_radius(self, x0: np.ndarray, C: np.ndarray, g0: np.ndarray) -> float:
        """:meth:`Certifier.start_radius`: a fraction of the first-order distance
        g0 / ||J||_q (J from :meth:`Graph.vjp`), shrinking with depth."""
        if not self.auto_eps0 or self.search != "interp":
            return self.eps0
        _, vals = self.graph.forward(x0[None], return_all=True)
        return first_order_start(self.graph.vjp(vals, C), g0, self.norm, self.START_FRACTION,
                                 self.num_hidden, self.eps_max, self.eps0)

    def certify(self, x0: np.ndarray, c: int, targets: Sequence[int]) -> Certificate:
        """Largest eps such that f_c > f_t on the whole ball for every t in ``targets``."""
        from crown_cli.engine.threads import quiet_blas

        with quiet_blas(self.graph):  # its forward passes' products too
            return self._certify(x0, c, targets)

    def _certify(self, x0: np.ndarray, c: int, targets: Sequence[int]) -> Certificate:
        t0 = time.perf_counter()
        x0 = np.ascontiguousarray(x0, dtype=np.float64)
        C = self.margin_rows(c, targets)
        margins = C @ self.logits(x0)
        g0 = float(np.min(margins))
        eps0 = self.start_radius(x0, C, margins) if g0 > 0 else self.eps0
        balls = Balls(self.graph)
        deadline = None if self.timeout is None else time.monotonic() + float(self.timeout)
        proven = [0.0, g0, 0]  # the largest eps a float64 bound proved, its bound; evaluations

        def bound(dtype, crown=False):
            def fn(eps):
                proven[2] += 1
                low = float(np.min(self.lower_bound(x0, eps, C, dtype, balls, deadline,
                                                    crown)))
                if dtype == np.float64 and low > 0.0 and eps > proven[0]:
                    proven[0], proven[1] = eps, low
                return low
            return fn

        try:
            if self.method == "alpha-crown" and self.alpha_iters and g0 > 0 \
                    and self.auto_eps0 and self.search == "interp":
                eps0 = self._crown_start(bound(np.float32, crown=True), g0, eps0)
            res = self._radius(bound, g0, eps0)
        except DeadlineExceeded:  # the largest radius proven so far: still a certificate
            return Certificate(proven[0], proven[1], g0, proven[2], "timeout",
                               time.perf_counter() - t0)
        # (every evaluation, alpha-crown's float32 CROWN start among them)
        proof = {"kind": "crown"} if self.record_proof and self.method == "crown" else None
        return Certificate(res.eps, res.lower_bound, g0, proven[2], res.status,
                           time.perf_counter() - t0, proof)

    def _crown_start(self, crown32, g0: float, eps0: float) -> float:
        """alpha-crown's first radius: :data:`ALPHA_START` times CROWN's, found by a float32
        search to :data:`CROWN_START_RTOL` (``crown32``: CROWN's float32 bound as a function
        of eps), or ``eps0`` where CROWN certifies nothing. alpha-CROWN's radius is at
        least CROWN's and mostly within a few percent of it (1.001-1.047 on the bench
        ResNet, cifar_base_kw and Convnet_maxpool), so its search starts next to its root."""
        est = self._search(crown32, g0, eps0, self.CROWN_START_RTOL)
        return min(est.eps * self.ALPHA_START, self.eps_max) if est.eps > 0 else eps0


class Balls:
    """The node bounds of one certify search's evaluations (balls of one centre and norm):
    a bound on a ball holds on every smaller one, so a float32 steering evaluation at eps
    takes, as known, those of the smallest ball evaluated at eps or above (a ReLU neuron
    stable there takes no rows; its bounds tighten the others'). The certifier gives none to
    a float64 evaluation, whose bound is then its ball's own whatever the search's path.
    An evaluation without them takes the closest ball's as guesses of where both sides of a
    neuron are needed (:meth:`closest`). Kept: the nodes the engine refines before a
    relaxation reads them (``refined_inputs`` of the node rules: the inputs of activations,
    max pools, products)."""

    def __init__(self, graph):
        from crown_cli.engine.node_rules import plan

        rules = plan(graph)
        self.nodes = sorted({p for i, n in enumerate(graph.nodes)
                             for p in rules[i].refined_inputs(n)})
        self.entries = []  # (eps, {node: (lo, hi)})

    def nearest(self, eps: float):
        fits = [(e, b) for e, b in self.entries if e >= eps]
        return min(fits, key=lambda f: f[0])[1] if fits else None

    def closest(self, eps: float):
        """The bounds of the ball evaluated nearest to eps (by ratio), or None: guesses of
        which neurons are stable (``GraphBounds``' ``hints``), never bounds."""
        if not self.entries:
            return None
        # (every ball's eps > 0: the search never evaluates at 0)
        return min(self.entries, key=lambda e: abs(np.log(e[0] / eps)))[1]

    def add(self, eps: float, gb) -> None:
        self.entries.append((float(eps), {p: (gb.lo[p], gb.hi[p]) for p in self.nodes}))


def _tiny_graph(rng):
    """conv -> relu -> conv + skip -> relu -> conv -> relu -> dense (2 outputs) on a 2 x 6 x 6
    input: every kernel of the graph fast path, windows and live elements both (three 3 x 3
    convolutions: a row's window outgrows the image, also in one tile)."""
    from crown_cli.graph.network import Graph, Node
    from crown_cli.graph.ops import ActivationOp, Conv, Dense, InputOp, Sum

    def conv(i):
        return Conv(rng.normal(0, 0.5, (2, i, 3, 3)), rng.normal(0, 0.1, 2), (i, 6, 6),
                    (1, 1), (1, 1, 1, 1))

    sh = (1, 2, 6, 6)
    nodes = [Node("x", InputOp(0, 0, 72), (), sh), Node("c1", conv(2), (0,), sh),
             Node("r1", ActivationOp("relu"), (1,), sh), Node("c2", conv(2), (2,), sh),
             Node("s", Sum([1.0, 1.0], 72), (3, 2), sh),
             Node("r2", ActivationOp("relu"), (4,), sh), Node("c3", conv(2), (5,), sh),
             Node("r3", ActivationOp("relu"), (6,), sh),
             Node("f", Dense(rng.normal(0, 0.2, (2, 72)), np.zeros(2)), (7,), (1, 2))]
    return Graph(nodes, 8)


class GraphPGDAttack(PGDAttack):
    """``certify --attack pgd`` on a graph network: :class:`PGDAttack`'s minimum-distortion
    search with the graph's float64 forward pass (every reported point is verified by it)
    and its input gradient (:meth:`Graph.vjp`, the margin row of the target attaining the
    minimum) in place of the MLP's."""

    def __init__(self, graph, norm: str = "inf", steps: Optional[int] = None,
                 restarts: Optional[int] = None, eps_max: float = 1e4):
        # the MLP attack's option checks and search settings, with no layers of its own
        super().__init__([], [], "relu", norm=norm, steps=steps or DEFAULT_STEPS,
                         restarts=restarts or DEFAULT_RESTARTS, eps_max=eps_max)
        self.graph = graph

    def margins(self, X: np.ndarray, c: int, targets: np.ndarray) -> np.ndarray:
        f = self.graph.forward(np.asarray(X, dtype=np.float64))
        return f[:, [c]] - f[:, targets]

    def margin_and_grad(self, X: np.ndarray, c: int, targets: np.ndarray):
        self.grad_evals += X.shape[0]
        f, vals = self.graph.forward(np.asarray(X, dtype=np.float64), return_all=True)
        M = f[:, [c]] - f[:, targets]
        j = np.argmin(M, axis=1)
        rows = np.arange(X.shape[0])
        G = np.zeros((X.shape[0], f.shape[1]))
        G[:, c] = 1.0
        G[rows, targets[j]] -= 1.0
        return M[rows, j], self.graph.vjp(vals, G)
