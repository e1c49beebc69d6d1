"""Deciding VNN-LIB properties on a graph network (:class:`crown_cli.graph.network.Graph`):
the attack, then CROWN and alpha-CROWN bounds of each case's box (the alpha stage optimises
ReLU slopes and max pool lower lines for the intermediate bounds and the output rows:
:mod:`crown_cli.engine.graph_alpha`), then on graphs of at most
``INPUT_SPLIT_MAX_DIM`` inputs branch and bound by input splitting
(:mod:`crown_cli.verification.bab.graph_input_split`) and on graphs with ReLU nodes by ReLU
splitting (the dense engine's search over :mod:`crown_cli.verification.bab.graph_bounder`),
raced.

The same verdicts and the same rules as :mod:`crown_cli.verification.pipeline`:

- ``sat`` only with a point inside the case's box whose float64 forward pass
  (:meth:`Graph.forward`) satisfies every row of ``A f(x) <= b``
  (:func:`crown_cli.verification.outcome.violations_of`);
- ``unsat`` only when every case has a row i with a float64-verified lower bound of
  ``A_i f(x)`` over the box (:class:`crown_cli.engine.graph_bounds.GraphBounds`, every rounding
  charged) above ``b_i`` rounded up one ulp;
- ``unknown`` otherwise (on graphs of more inputs and no ReLU or S-shaped node after more
  attack starts, with a note that branch and bound does not run there; after a search that
  could not decide, with its reason); ``timeout`` when the deadline passed first.

The attack is the MLP pipeline's sign-gradient descent
(:func:`crown_cli.verification.attack.descend`) on the graph's float64 forward pass and its
gradient (:meth:`Graph.vjp`). Any number of outputs; several input tensors are one flat input,
VNN-LIB's X_i in the graph's order. Arrays in, verdicts out: no files and no printing.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from crown_cli.engine.deadline import DeadlineExceeded
from crown_cli.engine.graph_forward import prefer_forward
from crown_cli.engine.input_sets import Box
from crown_cli.engine.rounding import round_up
from crown_cli.errors import InputError
from crown_cli.graph.sign_check import decided_outputs
from crown_cli.verification.attack import _as_case, descend
from crown_cli.verification.bab.graph_bounder import splittable_nodes
from crown_cli.verification.outcome import confirm_sat, violations_of
from crown_cli.verification.pipeline import (BOUND_STAGES, INPUT_SPLIT_MAX_DIM, WARM_ATTACK,
                                             StagedVerifier, Verdict, Verifier, VerifyOptions,
                                             _by_box, _worst)

# Bound stages available on graphs (alpha-crown: ReLU slopes, max pool lower lines, products'
# planes and tanh / sigmoid / arctan tangent points optimised for the output rows and for
# every unstable intermediate neuron's bounds: crown_cli.engine.graph_alpha)
GRAPH_STAGES = ("crown", "alpha-crown")
# after the bounds, at most this many more attack runs with fresh starts on the open cases
MORE_ATTACKS = 3
# ReLU splitting searches a graph's max pools as trees of ReLUs (complete) only up to this
# many ReLUs in the trees: on verivital's Convnet_maxpool (1152 windows of 16: 17,280) the
# rewritten graph's root bounds took 58 s against 0.33 s and were looser (prop_4's box
# widened 3x: worst row -0.877 against -0.568), while on the 40 windows of 4 of the test
# graphs a case 1e-3 of the range below the exact minimum, left unknown before, is proven
# in 1-19 domains (docs/bab.md)
POOL_RELUS_MAX = 4096
# alpha-CROWN's intermediate bounds are built only when this many times the box's CROWN
# intermediate bounds' time is left before the deadline (they take 4-23x as long)
ALPHA_COST = 4.0

NO_BAB = (f"no branch and bound on graphs of more than {INPUT_SPLIT_MAX_DIM} inputs without "
          "ReLU or S-shaped (sigmoid, tanh, arctan, erf) nodes")


def graph_counterexample(graph, lo, hi, cases, *, restarts: int = 64, steps: int = 100,
                         seed: int = 0, deadline: Optional[float] = None):
    """(j, x): a verified x in [lo, hi] with ``A_j f(x) <= b_j`` for one of the cases
    [(A_j, b_j), ...] sharing this box, or None. Float64 passes; on graphs with ReLU nodes
    the starts take turns at the surrogate slopes of the inactive side, as on MLPs."""
    if restarts < 1 or steps < 0:
        raise ValueError("graph_counterexample: restarts >= 1 and steps >= 0 required")
    parsed = [_as_case(lo, hi, A_, b_) for A_, b_ in cases]
    if not parsed:
        return None
    lo, hi = parsed[0][0], parsed[0][1]
    if lo.shape != (graph.input_size,) or hi.shape != lo.shape or np.any(lo > hi):
        raise ValueError("graph_counterexample: need lo <= hi of the graph's input size")
    A = np.concatenate([p[2] for p in parsed])

    def passes(X):
        return graph.forward(X, return_all=True)

    def gradient(vals, j, leaks):
        return graph.vjp(vals, A[j], relu_leak=leaks)

    def check(X, A_j, b_j):
        return violations_of(lambda Z: decided_outputs(graph, Z), lo, hi, A_j, b_j, X)

    relu = any(n.kind == "activation" and n.op.name == "relu" for n in graph.nodes)
    return descend(passes, gradient, check, parsed, restarts, steps, seed, deadline,
                   surrogate=relu, dtype=np.float64)


def graph_box_lower_bounds(graph, lo, hi, A, b, method: str = "crown", bounds=None,
                           deadline=None) -> np.ndarray:
    """Per row of A: a float64-verified lower bound of ``A_i f(x) - b_i`` over the box
    [lo, hi] (b rounded up one ulp first). A row > 0 proves every case holding it empty.
    ``method``: ``crown`` (or another relaxation family) or ``alpha-crown`` (each row's ReLU
    slopes optimised, :func:`~crown_cli.engine.graph_alpha.alpha_lower`, over intermediate
    bounds optimised the same way: ``GraphBounds(intermediate="alpha")``). ``bounds``: a
    :class:`GraphBounds` of this box to reuse (for ``alpha-crown`` preferably one built with
    ``intermediate="alpha"``). ``deadline``: as :class:`GraphBounds` takes it (raises
    :class:`~crown_cli.engine.deadline.DeadlineExceeded` past it)."""
    from crown_cli.engine.graph_alpha import alpha_lower
    from crown_cli.engine.graph_bounds import GraphBounds

    A = np.ascontiguousarray(A, dtype=np.float64)
    alpha = method == "alpha-crown"
    gb = bounds if bounds is not None else GraphBounds(
        graph, *Box(lo, hi).args(), method="crown" if alpha else method,
        intermediate="alpha" if alpha else "crown", deadline=deadline)
    lb = alpha_lower(gb, graph.output, A) if alpha else gb.lower(graph.output, A)
    return lb - round_up(b)  # fl(lb - b_up) > 0 exactly when lb > b_up


def alpha_can_tighten(gb) -> bool:
    """Whether ``GraphBounds(intermediate="alpha")`` can differ from the CROWN bounds ``gb``:
    some activation, max pool or product reads a node with free parameters below it (lower
    slopes, pool weights, products' planes; on verivital's Convnet_maxpool, one ReLU layer,
    nothing does)."""
    from crown_cli.engine.graph_alpha import free_below

    return any(free_below(gb, j) for n in gb.g.nodes
               if n.kind in ("activation", "maxpool", "product") for j in n.inputs)


def graph_verifier(graph, **options):
    """The verifier of a loaded network (``crown verify``'s and the API's): the dense
    engine's :class:`Verifier` on a chain of dense layers (``Graph.dense``, or an MLP itself;
    its first layer in the file's input order, ``MLP.vnnlib_layers``), a
    :class:`LoweredVerifier` (the dense engine, every stage and branch and bound) when the
    graph has a lowered MLP (:func:`crown_cli.graph.lower.lowered`), else a
    :class:`GraphVerifier`."""
    from crown_cli.graph.lower import lowered
    from crown_cli.network import MLP

    dense = graph if isinstance(graph, MLP) else graph.dense
    if dense is not None:
        weights, biases = dense.vnnlib_layers()  # the property's X_i: the file's order
        return Verifier(weights, biases, dense.activation, dense.alpha, **options)
    mlp = lowered(graph)
    if mlp is None:
        return GraphVerifier(graph, **options)
    return LoweredVerifier(mlp, graph, **options)


def forward_cost(graph) -> int:
    """Multiply-adds of one forward pass of the graph's affine operations (a convolution's
    kernel work, a sparse weight's nonzeros), for choosing the attack's network."""
    from crown_cli.graph.ops import Conv, Dense

    cost = 0
    for n in graph.nodes:
        op = n.op
        if isinstance(op, Conv):
            cost += op.size * (op.terms_fwd - 1)
        elif isinstance(op, Dense):
            cost += op.W.nnz if op.sparse else op.W.size
        elif n.kind != "input":
            cost += n.size
    return int(cost)


def order_only(graph, prop) -> None:
    """Refuse (InputError naming the file and the node) a property that a graph's final
    Softmax/LogSoftmax (``Graph.vector_output``, which the graph's output leaves off) could
    decide differently from the logits: every row of every case must be ``c (y_i - y_j) <= 0``
    with c > 0. Both functions are strictly increasing in each logit against the others
    (softmax_i / softmax_j = exp(z_i - z_j), log_softmax_i - log_softmax_j = z_i - z_j), so
    such a row holds for the outputs exactly when it holds for the logits."""
    if graph.vector_output is None:
        return
    for case in prop.cases:
        A, b = np.asarray(case.A, np.float64), np.asarray(case.b, np.float64)
        for row, rhs in zip(A, b):
            nz = np.flatnonzero(row)
            if rhs == 0.0 and nz.size == 2 and row[nz[0]] == -row[nz[1]]:
                continue
            kind, where = graph.vector_output
            raise InputError(f"{graph.source}: {where}: {kind} at the output is supported only "
                             "for properties comparing two outputs (Y_i <= Y_j); this one has "
                             "another constraint")


class LoweredVerifier(Verifier):
    """:class:`Verifier` on a graph's lowered MLP (the same function, exactly): the bound
    stages and branch and bound of the dense engine. The attack runs on whichever form has
    the cheaper forward pass: the graph's (:func:`graph_counterexample`; a convolution's
    dense matrix is mostly zeros: verivital's 2x2 convolution is 93k multiply-adds as a
    convolution, 18M as a 23328 x 784 matrix) or the MLP's. A ``sat`` point is also checked by
    the graph's own float64 forward pass (:func:`violations_of` on :meth:`Graph.forward`); one
    the graph's pass does not confirm (within rounding of the boundary) ends ``unknown``."""

    def __init__(self, mlp, graph, **options):
        weights, biases = mlp.vnnlib_layers()
        super().__init__(weights, biases, mlp.activation, mlp.alpha, **options)
        self.graph, self.mlp = graph, mlp
        dense = sum(int(w.size) for w in self.weights)
        self.graph_attack = forward_cost(graph) < dense

    def _crown_lower(self, lo, hi, A, b) -> np.ndarray:
        """CROWN on the graph itself (the file's network, not its lowered MLP, whose folded
        weights are rounded)."""
        return graph_box_lower_bounds(self.graph, lo, hi, A, b, "crown")

    def _box_attack(self, lo, hi, problems, restarts: int, seed: int, deadline: float):
        if not self.graph_attack:
            return Verifier._box_attack(self, lo, hi, problems, restarts, seed, deadline)
        return GraphVerifier._box_attack(self, lo, hi, problems, restarts, seed, deadline)

    def verify(self, prop, timeout: float, log: Optional[Callable[[str], None]] = None,
               status: Optional[Callable[[str], None]] = None) -> Verdict:
        v = super().verify(prop, timeout, log=log, status=status)  # confirmed on the MLP
        if v.result != "sat" or v.exact is not None:
            return v  # (a pinned point is proven by a bound on the graph: _crown_lower)
        v = confirm_sat(v, prop.cases, lambda Z: decided_outputs(self.graph, Z))
        if v.result != "sat":
            if log is not None:
                log("lowered network: the counterexample is not confirmed by the graph's "
                    "forward pass")
            v.note = "a counterexample not confirmed by the graph's forward pass"
        return v


def proof_shape(graph) -> Optional[dict]:
    """The network of a certificate (docs/proofs.md) of ``graph``: inputs, hidden sizes,
    outputs, as ``crown check`` reads the graph's ONNX file (its ReLUs' inputs, and the
    identity layers it makes of max pools' inputs: a residual network, a pool after a
    convolution); for a graph without such a file, the sizes of its ReLU nodes where it is
    one chain of affine, ReLU and max pool nodes; else None."""
    from crown_cli.graph.lower import chain_order

    shape = _checker_shape(graph)
    if shape is not None:
        return shape
    order, _ = chain_order(graph, kinds=("affine", "activation", "maxpool"))
    if order is None:
        return None
    acts = [graph.nodes[i] for i in order if graph.nodes[i].kind == "activation"]
    if any(n.op.name != "relu" for n in acts):
        return None
    return {"inputs": int(graph.input_size), "hidden": [int(n.size) for n in acts],
            "outputs": int(graph.output_size), "activation": "relu"}


_CHECKER_SIZES: dict = {}  # the last model _checker_shape read: its key and sizes


def _checker_shape(graph) -> Optional[dict]:
    """:func:`proof_shape` from the graph's ONNX file: the sizes ``crown check`` reads it
    with (None where it does not read it, or sees other sizes)."""
    import os

    from crown_cli import check as checker

    path = getattr(graph, "source", None)
    if not path or not os.path.isfile(path) or \
            any(n.kind == "activation" and n.op.name != "relu" for n in graph.nodes):
        return None
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if _CHECKER_SIZES.get("key") != key:  # (an instance list's properties share a model)
        try:
            entry = checker.load_model(path).entry()
        except (checker.Reject, checker.CheckError):
            entry = None
        _CHECKER_SIZES.update(key=key, entry=entry)
    entry = _CHECKER_SIZES["entry"]
    if entry is None or (entry["inputs"], entry["outputs"]) != (graph.input_size,
                                                                graph.output_size):
        return None
    return dict(entry)


def _warm_graph(rng):
    """A tiny graph of every node kind the graph engine's kernels step through: the
    certifier's warm-up graph (conv -> relu -> conv + skip -> relu, on a 2 x 6 x 6 input) up
    to its last ReLU, then a 2x2 max pool, two dense layers, one through exp, their product
    -> relu -> dense (2 outputs)."""
    from crown_cli.certification.graph_certifier import _tiny_graph
    from crown_cli.graph.network import Graph, Node
    from crown_cli.graph.ops import ActivationOp, Dense, Product
    from crown_cli.graph.pooling import MaxPool

    def dense(n_out, n_in, scale=0.3):
        return Dense(rng.normal(0, scale, (n_out, n_in)), rng.normal(0, 0.1, n_out))

    head = _tiny_graph(rng).nodes[:6]  # x, c1, r1, c2, s, r2
    ch, y, x = np.meshgrid(np.arange(2), np.arange(3), np.arange(3), indexing="ij")
    base = (ch * 36 + 2 * y * 6 + 2 * x).reshape(-1, 1)
    windows = base + np.array([0, 1, 6, 7])[None]  # (18, 4): 2x2 windows, stride 2
    nodes = head + [Node("p", MaxPool(windows, 72), (5,), (1, 2, 3, 3)),
                    Node("d1", dense(8, 18), (6,), (1, 8)),
                    Node("d2", dense(8, 18), (6,), (1, 8)),
                    Node("e", ActivationOp("exp"), (7,), (1, 8)),
                    Node("m", Product(8), (9, 8), (1, 8)),
                    Node("r3", ActivationOp("relu"), (10,), (1, 8)),
                    Node("f", dense(2, 8, 1.0), (11,), (1, 2))]
    return Graph(nodes, 12)


class GraphVerifier(StagedVerifier):
    """:class:`crown_cli.verification.pipeline.Verifier`'s interface for a graph (the same
    opening, :class:`StagedVerifier`): one network, its stages and attack settings (the
    fields of :class:`VerifyOptions`; ``workers``: branch and bound's processes, default
    2: input splitting shares its wide rounds (graphs of few inputs, boxes bounded at once),
    ReLU splitting its batches of 16 domains or more with a second process);
    :meth:`verify` per property. ``bab`` and ``max_domains``: input
    splitting on graphs of at most ``INPUT_SPLIT_MAX_DIM`` inputs, ReLU splitting on graphs
    with ReLU nodes."""

    def __init__(self, graph, **settings):
        o = VerifyOptions(**settings)
        self.graph = graph
        self._settings(o)
        self.requested = [s for s in o.stages if s in BOUND_STAGES]
        self.stages = [s for s in self.requested if s in GRAPH_STAGES]
        self.bab = o.bab
        # images (more inputs than input splitting takes): the attack's passes cost more than
        # the crown stage, so a quarter of the starts, then the crown stage, then the other
        # starts (pipeline.QUICK_SHARE; docs/bab.md)
        self.quick_opening = graph.input_size > INPUT_SPLIT_MAX_DIM
        # branch and bound's processes: a second one shares input splitting's wide rounds
        # and ReLU splitting's batches, each process on one thread
        self.workers = 2 if o.workers is None else o.workers
        # per graph bounded (this one; ReLU splitting's, :meth:`_split_graph`) and kind of
        # intermediate bounds, keyed by (id, alpha): (the last box, its GraphBounds)
        self._last_bounds = {}
        self._crown_s = {}  # per graph bounded: seconds its last CROWN intermediate bounds took
        # few inputs: intermediate bounds by the forward pass (engine/graph_forward.py)
        self.intermediate = "forward" if prefer_forward(graph) else "crown"
        self._relu_graph = None  # :meth:`_split_graph`, once built
        # --proof: the certificate's network (:func:`proof_shape`); the cases the crown stage
        # proves get one-leaf trees (StagedVerifier._bound_cases), no other stage records
        self.proof_shape = proof_shape(graph) if o.proof else None
        self.proof = self.proof_shape is not None
        self._trees = {}

    def verify(self, prop, timeout: float, log: Optional[Callable[[str], None]] = None,
               status: Optional[Callable[[str], None]] = None) -> Verdict:
        """:meth:`StagedVerifier.verify`, on the logits of a graph with a final softmax for
        the properties :func:`order_only` lets through."""
        order_only(self.graph, prop)
        self._trees = {}
        v = super().verify(prop, timeout, log=log, status=status)
        if self.proof and v.result == "unsat":
            from dataclasses import replace

            from crown_cli.verification.proof import case_tree

            trees = [case_tree(self._trees.get(j), c) for j, c in enumerate(prop.cases)]
            missing = sum(t is None for t in trees)
            note = v.note if not missing else (v.note + "; " if v.note else "") + \
                f"no certificate for {missing} case(s) (graphs: crown-stage cases only)"
            v = replace(v, proof=trees, note=note)
        return v

    def warm_up(self, timeout: float = 60.0):
        """Load (or, on a cold numba cache, compile) the graph kernels a verification can
        call, so that an instance's deadline is its own: this verifier's stages and branch
        and bound on a tiny graph of every node kind (:func:`_warm_graph`,
        :meth:`StagedVerifier._warm_on`), with ``workers`` 2 their serial twins too (which a
        forked helper inherits loaded). Nothing with the numpy kernels."""
        from crown_cli.engine.kernels import graph_kernels, serial_kernels

        if graph_kernels() is None:
            return None
        rng = np.random.default_rng(1)
        tiny = GraphVerifier(_warm_graph(rng), stages=self.stages, bab=self.bab,
                             **WARM_ATTACK)
        verdict = tiny._warm_on(rng, 0.05, timeout)
        if self.workers > 1:  # a search's helper runs the serial twins: loaded before it forks
            with serial_kernels():
                tiny._warm_on(np.random.default_rng(1), 0.05, timeout)
        return verdict

    @property
    def n_inputs(self) -> int:
        return self.graph.input_size

    @property
    def n_outputs(self) -> int:
        return self.graph.output_size

    def outputs(self, x: np.ndarray) -> np.ndarray:
        """The float64 forward pass; NaN at a point where a Sign node's input is not decided
        (:func:`crown_cli.graph.sign_check.decided_outputs`): no counterexample there."""
        return decided_outputs(self.graph, x)

    def box_lower_bounds(self, stage: str, lo, hi, A, b, deadline=None) -> np.ndarray:
        """The stage's bounds, on the box's :class:`GraphBounds` (:meth:`_box_bounds`: CROWN's
        intermediate bounds for ``crown``, after a first pass on interval ones, alpha-CROWN's
        for ``alpha-crown``). ``deadline``:
        as :meth:`Verifier.box_lower_bounds` takes it: past it the bound stops at its next
        node and the rows it did not bound are -inf (not proven; the stage loop then ends in
        ``timeout``). ``alpha-crown`` first optimises the rows' slopes over CROWN's
        intermediate bounds, and only where that leaves a row unproven the intermediate
        bounds too (the larger of the two bounds per row)."""
        quick = np.full(np.shape(A)[0], -np.inf)
        try:
            if stage == "crown" and self.intermediate == "crown":
                # interval intermediate bounds first (a fraction of a second where CROWN's take
                # minutes: vit_2023's ibp_3_3_8 proves 8 of 9 rows so in 0.6 s): enough when
                # every row is proven
                from crown_cli.engine.graph_bounds import GraphBounds

                ibp = GraphBounds(self.graph, *Box(lo, hi).args(), intermediate="interval",
                                  deadline=deadline)
                quick = graph_box_lower_bounds(self.graph, lo, hi, A, b, stage, bounds=ibp,
                                               deadline=deadline)
                if np.all(quick > 0.0):
                    return quick
            if stage == "alpha-crown":
                # the rows' own slopes over CROWN's intermediate bounds first (seconds where
                # optimising the intermediate bounds too takes minutes): enough when every row
                # is proven
                crown = self._box_bounds(lo, hi, deadline=deadline)
                quick = graph_box_lower_bounds(self.graph, lo, hi, A, b, stage, bounds=crown,
                                               deadline=deadline)
                if np.all(quick > 0.0) or not alpha_can_tighten(crown):
                    return quick
            bounds = None
            if stage in ("crown", "alpha-crown"):
                bounds = self._box_bounds(lo, hi, alpha=stage == "alpha-crown", deadline=deadline)
            return np.fmax(quick, graph_box_lower_bounds(self.graph, lo, hi, A, b, stage,
                                                         bounds=bounds, deadline=deadline))
        except DeadlineExceeded:
            return quick

    def _crown_lower(self, lo, hi, A, b) -> np.ndarray:
        return graph_box_lower_bounds(self.graph, lo, hi, A, b, "crown")

    def _box_bounds(self, lo, hi, graph=None, alpha: bool = False, deadline=None):
        """The :class:`GraphBounds` of the box on ``graph`` (default: this verifier's), with
        CROWN's intermediate bounds or (``alpha``) alpha-CROWN's, kept for the last box asked
        per graph and kind: the bound stages and ReLU splitting's searches of the box's cases
        share them. ``deadline``: the construction's, and that of every later
        :meth:`GraphBounds.lower` on them (a kept one takes the caller's)."""
        from crown_cli.engine.graph_bounds import GraphBounds

        graph = self.graph if graph is None else graph
        key = (np.asarray(lo, np.float64).tobytes(), np.asarray(hi, np.float64).tobytes())
        last = self._last_bounds.get((id(graph), alpha))
        if last is None or last[0] != key:
            forward = self.intermediate == "forward" and graph is self.graph
            if alpha:
                crown = self._box_bounds(lo, hi, graph, deadline=deadline)
                # alpha-CROWN's intermediate bounds take several times CROWN's (4-10x on vit
                # pgd_2_3_16, 8-23x on max pools as ReLU trees): where that cannot end before
                # the deadline, CROWN's serve (the search gets the time instead)
                fits = deadline is None or time.monotonic() + ALPHA_COST * \
                    self._crown_s.get(id(graph), 0.0) < deadline
                gb = GraphBounds(graph, *Box(lo, hi).args(), intermediate="alpha",
                                 deadline=deadline) \
                    if alpha_can_tighten(crown) and not forward and fits else crown
            else:
                t0 = time.monotonic()
                gb = GraphBounds(graph, *Box(lo, hi).args(), deadline=deadline,
                                 intermediate="forward" if forward else "crown")
                self._crown_s[id(graph)] = time.monotonic() - t0
            last = self._last_bounds[(id(graph), alpha)] = (key, gb)
        last[1].deadline = deadline
        return last[1]

    def _box_attack(self, lo, hi, problems, restarts: int, seed: int, deadline: float):
        """:meth:`Verifier._box_attack` on the graph's forward pass
        (:func:`graph_counterexample`)."""
        return graph_counterexample(self.graph, lo, hi, problems, restarts=restarts,
                                    steps=self.attack_steps, seed=seed, deadline=deadline)

    def note(self) -> str:
        """What this verifier leaves out on graphs, for the verdict log."""
        # (hull is a stage of one-hidden-layer MLPs only, skipped silently as on the others)
        skipped = [s for s in self.requested if s not in GRAPH_STAGES and s != "hull"]
        parts = [NO_BAB if self.bab else "branch and bound off (--no-bab)"] + [
            f"{s} not on graphs yet" for s in skipped]
        return "; ".join(parts)

    # verify (StagedVerifier's): the attack and the bound stages, then input splitting on
    # graphs of at most INPUT_SPLIT_MAX_DIM inputs and ReLU splitting on graphs with ReLU
    # nodes (status/log receive its status, as Verifier.verify's); without branch and bound
    # more attack starts on the cases left open, and unknown (with note()) when they stay
    # open; a sat point confirmed in the property's exact set

    def _verify(self, prop, timeout, log, status) -> Verdict:
        opened = self._opening(prop, timeout, log)
        if isinstance(opened, Verdict):
            return opened
        cases, open_cases, margins, stage, deadline, budget, done = opened
        n = len(cases)
        if self.bab and (self.n_inputs <= INPUT_SPLIT_MAX_DIM
                         or splittable_nodes(self._split_graph())):
            return self._branch_and_bound(cases, open_cases, margins, deadline, timeout,
                                          done, log, status)
        for k in range(MORE_ATTACKS):  # no branch and bound: more starts instead
            if time.monotonic() >= deadline:
                return done("timeout", stage, _worst(margins), n - len(open_cases),
                            note=self.note())
            found = self._attack(cases, _by_box(cases, open_cases), deadline, budget,
                                 self.seed + 7919 * (k + 1))
            if found is not None:
                j, x = found
                return done("sat", "attack", _worst(margins), n - len(open_cases), x=x,
                            y=self.outputs(x), case=j)
        if log is not None:
            log(f"graph network: {self.note()}; {len(open_cases)} of {n} cases open")
        return done("unknown", stage, _worst(margins), n - len(open_cases), note=self.note())

    def _split_graph(self):
        """The graph ReLU splitting searches: this one, with its max pools rewritten as trees
        of ReLUs (:func:`~crown_cli.graph.pooling.maxpool_as_relus`, the same function) when
        that takes at most ``POOL_RELUS_MAX`` ReLUs, so that fully split domains are affine
        and the search is complete. Cached."""
        if self._relu_graph is None:
            from crown_cli.graph.pooling import maxpool_as_relus

            self._relu_graph = maxpool_as_relus(self.graph, POOL_RELUS_MAX)
        return self._relu_graph

    def _branch_and_bound(self, cases, open_cases, margins, deadline, timeout, done, log,
                          status):
        """Branch and bound on the graph engine, one search per open case, raced by measured
        progress (:func:`~crown_cli.verification.schedule.race`) as on MLPs: input splitting
        (:func:`~crown_cli.verification.bab.graph_input_split.graph_input_split_steps`) on
        graphs of at most ``INPUT_SPLIT_MAX_DIM`` inputs, ReLU splitting
        (:func:`~crown_cli.verification.bab.graph_bounder.graph_relu_split_steps`) on
        graphs with ReLU nodes."""
        from crown_cli.verification.bab.graph_bounder import graph_relu_split_steps
        from crown_cli.verification.bab.graph_input_split import graph_input_split_steps
        from crown_cli.verification.pipeline import (JOIN_MIN_S, JOIN_SHARE, RACE_MAX_SLICE,
                                                     RACE_SLICE)
        from crown_cli.verification.schedule import RaceSettings, Run, race
        from crown_cli.verification.status import bab_status_for

        runs = []
        if self.n_inputs <= INPUT_SPLIT_MAX_DIM:
            runs += [Run([j], "input split",
                         lambda progress, c=cases[j]: graph_input_split_steps(
                             self.graph, c.lo, c.hi, c.A, c.b, deadline,
                             max_domains=self.max_domains, progress=progress,
                             workers=self.workers))
                     for j in open_cases]
        sg = self._split_graph()
        # the root's bounds: the alpha stage's when it ran on this graph; on max pools rewritten
        # as ReLU trees CROWN's (alpha-CROWN's intermediate bounds of the trees' ReLUs cost
        # 8-23x CROWN's there: 18.7 s against 2.2 s with 3072 of them)
        alpha = "alpha-crown" in self.stages and sg is self.graph
        if splittable_nodes(sg):
            runs += [Run([j], "ReLU split",
                         lambda progress, c=cases[j]: graph_relu_split_steps(
                             sg, c.lo, c.hi, c.A, c.b, deadline,
                             max_domains=self.max_domains, progress=progress,
                             workers=self.workers,
                             bounds=self._box_bounds(c.lo, c.hi, sg, alpha, deadline)))
                     for j in sorted(open_cases, key=lambda j: -margins.get(j, -np.inf))]
        settings = RaceSettings(kinds={"input split": "boxes", "ReLU split": "domains"},
                                log=log, status=bab_status_for(status, log),
                                first_slice=RACE_SLICE, max_slice=RACE_MAX_SLICE,
                                join_after=max(JOIN_MIN_S, JOIN_SHARE * timeout), worst=_worst)
        try:
            return race(runs, len(cases), len(cases) - len(open_cases), margins, deadline,
                        done, self.outputs, cases, settings)
        except DeadlineExceeded:  # a bound inside a search (its root's, a domain's) ran out
            return done("timeout", "bab", _worst(margins), len(cases) - len(open_cases))

