"""Certified lower bounds of the minimum adversarial distortion for one image at a time.

:class:`Certifier` binds a network, a norm and a method; :meth:`Certifier.certify` takes an
input x0 (d,), its predicted class and a list of target classes and returns the largest radius
at which CROWN proves ``f_c(x) - f_t(x) > 0`` for every listed target over the l_p ball.
Arrays in, results out: no files and no printing.
"""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from crown_cli.activations import ACTIVATIONS, apply_activation, default_alpha, derivative, forward, supporting
from crown_cli.engine.dense_crown import Network, first_layer_center, margin_lower_bound
from crown_cli.engine.input_sets import NORMS
from crown_cli.engine.kernels import kernels_backend
from crown_cli.errors import InputError
from crown_cli.certification.methods import bind_method, names as other_method_names
from crown_cli.engine.deadline import DeadlineExceeded
from crown_cli.engine.relaxations import get_interval_free, get_relaxation
from crown_cli.engine.radius_search import (SEARCHES, SearchResult, certified_radius,
                                            mixed_search, refine_bracket)
from crown_cli.engine.stability import StableFromFloat32

# The paper's starting radii (reference-setup.md): MNIST-sized and CIFAR-sized inputs.
EPS0 = {784: {"inf": 0.01, "2": 0.2, "1": 0.3}, 3072: {"inf": 0.002, "2": 0.2, "1": 0.3}}


PRECISIONS = ("mixed", "float64")
# alpha-CROWN's optimiser defaults: docs/methods.md (alpha-CROWN, "Where the defaults come
# from") has the measurements that chose them.
ALPHA_ITERS = 25
ALPHA_LR = 0.5
# Stopping rule (patience steps without a gain of tol x the margin at x0): thorough on networks
# of at most ALPHA_SMALL hidden neurons, where a step costs little; quicker on larger ones.
ALPHA_PATIENCE, ALPHA_TOL = 6, 1e-6
ALPHA_PATIENCE_LARGE, ALPHA_TOL_LARGE = 3, 1e-5
ALPHA_SMALL = 1024
# tanh / sigmoid / arctan: the bound is smooth in the tangent points with interior optima (a
# ReLU's is linear in each slope, optima at the ends), where lr 0.5 oscillates
ALPHA_LR_SMOOTH = 0.05
# and their objective rises, dips for several steps (Adam overshooting) and rises again: an
# early stop must outlast the dip (patience at least this many steps)
ALPHA_PATIENCE_SMOOTH = 10
ALPHA_METHODS = ("alpha-crown",)
# free lower slopes (ReLU-type) or free tangent points (S-shaped): crown_cli/engine/alpha_crown.py


def method_names():
    """Every ``--method`` of ``crown certify``, in the order its messages list them."""
    return ("crown", "crown-paper", "fast-lin", "crown-quad") + ALPHA_METHODS + \
        tuple(other_method_names())


def margin_rows(c: int, targets: Sequence[int], n_classes: int) -> np.ndarray:
    """C (r, n_classes) with rows e_c - e_t, one per target t."""
    C = np.zeros((len(targets), n_classes))
    for r, t in enumerate(targets):
        C[r, c] += 1.0
        C[r, t] -= 1.0
    return C


def first_order_start(J: np.ndarray, g0, norm: str, fraction: float, n_hidden: int,
                      eps_max: float, eps0: float) -> float:
    """The search's first radius: ``fraction / n_hidden`` of the first-order distance
    min_r g0_r / ||J_r||_q to the decision boundary (J: the margins' input gradients, q the
    dual norm), at most eps_max; ``eps0`` when that is not a positive finite number."""
    q = {"inf": 1, "2": 2, "1": np.inf}[norm]
    with np.errstate(divide="ignore", invalid="ignore"):
        lin = np.min(g0 / np.linalg.norm(J, ord=q, axis=1))
    eps = lin * fraction / max(1, n_hidden)
    return float(min(eps, eps_max)) if np.isfinite(eps) and eps > 1e-12 else eps0


def parse_norm(norm: str) -> str:
    key = str(norm).strip().lower().lstrip("l").replace("_", "")
    key = {"infinity": "inf", "i": "inf", "2.0": "2", "1.0": "1"}.get(key, key)  # (2.0: a float)
    if key not in NORMS:
        raise InputError(f"--norm: unknown norm '{norm}' (choose from inf, 2, 1)")
    return key


def default_eps0(norm: str, input_size: int) -> float:
    return EPS0.get(input_size, EPS0[784])[norm]


@dataclass
class Certificate:
    """Result of one certified-radius search."""

    eps: Optional[float]  # certified radius (verified: lower bound > 0 there), 0.0 if none;
    # method exact: the minimum distortion, None on timeout
    lower_bound: Optional[float]  # margin lower bound at eps (None if the method has none)
    margin: float  # f_c(x0) - f_t(x0), minimum over the targets
    evaluations: int  # bound evaluations spent by the search
    status: str  # certified | capped | not-certified (exact: optimal | timeout | capped)
    time_s: float
    # with Certifier.record_proof (crown_cli/certification/proofs.py): how the bound at eps
    # was verified: {"kind": "crown"} (CROWN's default slopes) or {"kind": "alpha", "record":
    # AlphaBounds.evaluate's record}; None otherwise
    proof: Optional[dict] = None


def check_alpha_options(alpha_iters, alpha_lr) -> None:
    """``--alpha-iters`` an integer >= 0 and ``--alpha-lr`` > 0 (either may be None: its
    default), else :class:`InputError`."""
    if alpha_iters is not None and not (isinstance(alpha_iters, (int, np.integer))
                                        and alpha_iters >= 0):
        raise InputError(f"--alpha-iters: must be an integer >= 0, got {alpha_iters}")
    if alpha_lr is not None and not (np.isfinite(alpha_lr) and alpha_lr > 0):
        raise InputError(f"--alpha-lr: must be > 0, got {alpha_lr}")


@dataclass(frozen=True)
class CertifySettings:
    """A certifier's settings: ``crown certify``'s options of the same names (``eps_max`` is
    ``--max-eps``). ``alpha_iters``, ``alpha_lr`` (alpha-crown): None for the certifier's
    defaults."""

    norm: str = "inf"
    method: str = "crown"
    search: str = "interp"
    rtol: float = 1e-4
    eps0: Optional[float] = None
    eps_max: float = 1e4
    precision: str = "mixed"
    timeout: Optional[float] = None
    alpha_iters: Optional[int] = None
    alpha_lr: Optional[float] = None


class RadiusSearch:
    """What every certifier shares, whatever bounds its network: the radius search's
    settings (checked once, :meth:`_search_settings`), the margin rows and the search itself
    (:meth:`_radius`: float64, or float32 steering with a float64 proof). A certifier sets
    ``norm``, ``num_hidden`` (the search's power law) and ``n_classes`` and gives the
    bounds; :class:`Certifier` (dense chains) and
    :class:`~crown_cli.certification.graph_certifier.GraphCertifier` (graphs) are the two."""

    F32_RTOL = 0.5
    START_FRACTION = 0.5  # start_radius: this / (hidden layers) of the first-order distance
    POWER_PER_LAYER = 1.0  # the search's power law for the first step down, per hidden layer
    UP_POWER = None  # ... and for the steps up (None: half of it, at least 1.5)

    def _search_settings(self, o: CertifySettings, input_size: int,
                         float64_only: bool = False) -> None:
        """The radius search's settings, checked: search, rtol, precision (``float64_only``:
        a method that ignores it), eps0, eps_max."""
        search, rtol, precision, eps0 = o.search, o.rtol, o.precision, o.eps0
        if search not in SEARCHES:
            raise InputError(f"--search: unknown search '{search}' (choose from {', '.join(SEARCHES)})")
        if not (0 < rtol < 1):
            raise InputError(f"--rtol: must lie in (0, 1), got {rtol}")
        self.search = search
        if precision not in PRECISIONS:
            raise InputError(f"--precision: unknown precision '{precision}' (choose from {', '.join(PRECISIONS)})")
        self.precision = "float64" if float64_only else precision
        self.rtol = rtol
        # no --eps0: the CROWN search starts from each image's first-order estimate (see
        # start_radius); the paper's fixed start remains for the other methods
        self.auto_eps0 = eps0 is None
        self.eps_max = float(o.eps_max)
        if not self.eps_max > 0:
            raise InputError(f"--max-eps: must be > 0, got {o.eps_max}")
        if eps0 is None:  # the paper's start, at most the largest radius searched
            self.eps0 = min(default_eps0(self.norm, input_size), self.eps_max)
        else:
            self.eps0 = float(eps0)
            if not (self.eps0 > 0 and self.eps0 <= self.eps_max):
                raise InputError(f"--eps0: must be > 0 and at most --max-eps "
                                 f"({self.eps_max:g}), got {eps0}")

    def margin_rows(self, c: int, targets: Sequence[int]) -> np.ndarray:
        """C (r, classes) with rows e_c - e_t."""
        return margin_rows(c, targets, self.n_classes)

    def _search(self, fn, g0, eps0, rtol, stop_at_estimate=False) -> SearchResult:
        power = max(2.0, self.POWER_PER_LAYER * self.num_hidden)
        return certified_radius(fn, g0, eps0, rtol=rtol, eps_max=self.eps_max, method=self.search,
                                power=power if self.UP_POWER is None else (power, self.UP_POWER),
                                stop_at_estimate=stop_at_estimate)

    def _radius(self, bound, g0: float, eps0: float) -> SearchResult:
        """The certified radius with ``bound(dtype)``, the margin's lower bound as a
        function of eps: a float64 search, or (``precision`` mixed) float32 steering and a
        float64 proof (:func:`~crown_cli.engine.radius_search.mixed_search`)."""
        if self.precision == "float64":
            return self._search(bound(np.float64), g0, eps0, self.rtol)
        return mixed_search(bound, self._search, g0, eps0, self.rtol, self.F32_RTOL,
                            self.search == "interp")


class Certifier(RadiusSearch):
    """CROWN certification of one network under one norm and method. ``alpha``: the
    activation's parameter (None: its default); ``settings``: the fields of
    :class:`CertifySettings` (keywords; ``alpha_iters`` defaults to ``ALPHA_ITERS``)."""

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                 activation: str, alpha=None, **settings):
        o = CertifySettings(**settings)
        self.net = Network(weights, biases)
        self.norm = parse_norm(o.norm)
        self.qcode = NORMS[self.norm]
        self.method = o.method
        if alpha is None and activation in ACTIVATIONS:
            alpha = default_alpha(activation)
        self._bind_method(weights, biases, activation, alpha)
        self.timeout = o.timeout
        alpha_iters = ALPHA_ITERS if o.alpha_iters is None else o.alpha_iters
        alpha_lr = o.alpha_lr
        if alpha_lr is None:
            alpha_lr = ALPHA_LR_SMOOTH if ACTIVATIONS[activation].smooth else ALPHA_LR
        check_alpha_options(alpha_iters, alpha_lr)
        self.alpha_iters, self.alpha_lr = int(alpha_iters), float(alpha_lr)
        self.interval_free = get_interval_free(activation, alpha)
        self.alpha = alpha
        self.num_hidden, self.n_classes = self.net.num_hidden, self.net.W[-1].shape[0]
        self._search_settings(o, self.net.W[0].shape[1], float64_only=self.other is not None)
        self.activation = activation

    def _bind_method(self, weights, biases, activation: str, alpha) -> None:
        """The method's bounds: CROWN-Quad's (``quad``), another method's function
        (``other``), or a relaxation of the activation (``relax_fn``)."""
        method = self.method
        self.quad = None
        self.other = None  # (kind, fn) of a method from crown_cli.certification.methods
        if method == "crown-quad":  # 2-layer ReLU only; bounds from crown_cli.certification.methods.quad
            from crown_cli.certification.methods.quad import QuadBound, check_applicable

            check_applicable(len(weights), activation)
            self.quad = QuadBound(weights, biases, self.norm)
            self.relax_fn = get_relaxation(activation, "crown", alpha)
        elif method in ALPHA_METHODS:
            if not ACTIVATIONS[activation].alpha_crown:
                raise InputError(f"--method {method}: activation '{activation}' is not supported "
                                 f"({', '.join(supporting('alpha_crown'))} networks only)")
            self.relax_fn = get_relaxation(activation, "crown", alpha)
        elif method in other_method_names():
            self.other = bind_method(method, weights, biases, activation, alpha, self.norm)
            self.relax_fn = None
        else:
            self.relax_fn = get_relaxation(activation, method, alpha)

    def warm_up(self) -> None:
        """Load the compiled kernels this certifier uses, so the first image's time is its own.

        Certifies one point of a tiny network with the same activation, norm, method and
        precision (numba loads its cached machine code at the first call of each kernel and
        type, about 0.7 s in all). Methods without numba kernels and the numpy kernels
        (``set_kernels("numpy")``: nothing to load) are left alone.
        """
        if self.other is not None or self.quad is not None or kernels_backend() == "numpy":
            return
        rng = np.random.default_rng(0)
        sizes = [4] + [3] * self.net.num_hidden + [2]
        ws = [rng.standard_normal((o, i)) for i, o in zip(sizes[:-1], sizes[1:])]
        bs = [rng.standard_normal(o) for o in sizes[1:]]
        tiny = Certifier(ws, bs, self.activation, norm=self.norm, method=self.method,
                         search=self.search, precision=self.precision, alpha=self.alpha)
        x0 = rng.standard_normal(4)
        c = int(np.argmax(tiny.logits(x0)))
        tiny.certify(x0, c, [1 - c])

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Network outputs for x (N, d) or (d,), float64."""
        return forward(self.net.W, self.net.b, self.activation, x, self.alpha)

    def start_radius(self, x0: np.ndarray, C: np.ndarray, g0: np.ndarray) -> float:
        """Where the CROWN search starts for x0: a fraction of the first-order distance.

        At small radii CROWN's bound is g0 - eps ||J||_q (J: gradient of the margin at x0), so
        g0 / ||J||_q is where a linear model of the network would flip. CROWN's radius is a
        fraction of it that shrinks with depth (measured eps / (g0/||J||_q): 0.19-0.30 on
        MNIST 3x[1024], 0.07-0.22 on 4x[1024], 0.06-0.09 on a random CIFAR 7x[1024]), so the
        search starts at 0.5 / (hidden layers) of it. Only the number of evaluations depends
        on this start. The paper's fixed radius stays for ``--search bisect`` (the paper's
        procedure), an explicit ``--eps0`` and a zero gradient.
        """
        if not self.auto_eps0 or self.search != "interp" or self.activation not in ACTIVATIONS:
            return self.eps0
        W, b = self.net.W, self.net.b
        zs, a = [], x0
        for k in range(len(W) - 1):
            zs.append(W[k] @ a + b[k])
            a = np.asarray(apply_activation(self.activation, zs[-1], self.alpha), dtype=np.float64)
        J = C @ W[-1]
        for k in range(len(zs) - 1, -1, -1):
            J = (J * derivative(self.activation, zs[k], self.alpha)) @ W[k]
        return first_order_start(J, g0, self.norm, self.START_FRACTION, self.net.num_hidden,
                                 self.eps_max, self.eps0)

    def lower_bound(self, x0: np.ndarray, eps: float, C: np.ndarray, first=None,
                    dtype=np.float64) -> np.ndarray:
        """Lower bounds of the margins C @ f(x) over the eps-ball around x0, shape (r,).

        Sound in float64 (the default); float32 gives a fast estimate for steering the search.
        alpha-crown (float64): the verified bound at slopes optimised at this radius.
        """
        if self.quad is not None:
            return self.quad.lower_bound(x0, float(eps), C, first)
        if self.method in ALPHA_METHODS and dtype == np.float64 and self.alpha_iters > 0 \
                and self.net.num_hidden > 0:  # no hidden layer: no slope, CROWN's is exact
            ab = self._alpha_bounds(np.ascontiguousarray(x0, dtype=np.float64), C, first)
            patience, tol = self._alpha_stopping()
            ab.optimise(float(eps), self.alpha_iters, self.alpha_lr, patience=patience, tol=tol)
            return ab.evaluate(float(eps), verify=True)
        return margin_lower_bound(self.net, x0, float(eps), self.qcode, self.relax_fn, C,
                                  first=first, dtype=dtype)

    def certify(self, x0: np.ndarray, c: int, targets: Sequence[int]) -> Certificate:
        """Largest eps such that f_c > f_t on the whole ball for every t in ``targets``."""
        if self.other is not None:
            return self._certify_other(x0, c, targets)
        t0 = time.perf_counter()
        x0 = np.ascontiguousarray(x0, dtype=np.float64)
        C = self.margin_rows(c, targets)
        margins = C @ self.logits(x0)
        g0 = float(np.min(margins))
        eps0 = self.start_radius(x0, C, margins) if g0 > 0 else self.eps0
        first = first_layer_center(self.net, x0)
        # (eps, hidden bounds, rows computed fresh per layer, float32 rounding bounds per
        # layer or None) of the evaluations so far
        done = {np.float32: [], np.float64: []}
        track = self._tracks_rounding()

        def bound(dtype):
            def fn(eps):
                errors = None
                if dtype == np.float32:
                    known, src = self._known_from_larger_ball(done[dtype], eps)
                    if track:
                        errors = ([e.copy() for e in src[3]] if src is not None else
                                  [np.zeros(w.shape[0]) for w in self.net.W[:-1]])
                else:
                    known = self._known_from_larger_ball(done, eps, x0)
                lb, bounds = margin_lower_bound(self.net, x0, float(eps), self.qcode, self.relax_fn,
                                                C, first=first, dtype=dtype, known=known,
                                                return_bounds=True, errors=errors,
                                                act_bound=self._act_bound)
                fresh = [np.ones(l.shape, bool) if known is None or callable(known) else ~known[k][0]
                         for k, (l, _) in enumerate(bounds)]
                done[dtype].append((eps, bounds, fresh, errors))
                return float(np.min(lb))
            return fn

        res = self._radius(bound, g0, eps0)
        proof = {"kind": "crown"} if self.record_proof else None
        if self.quad is not None:
            res = self._quad_search(x0, C, first, g0, res)
        if self.method in ALPHA_METHODS and self.net.num_hidden > 0:  # (none: affine, exact)
            res, rec = self._alpha_search(x0, C, first, g0, res)
            if rec is not None and proof is not None:
                proof = {"kind": "alpha", "record": rec}
        return Certificate(res.eps, res.lower_bound, g0, res.evaluations, res.status,
                           time.perf_counter() - t0, proof)

    def _quad_search(self, x0, C, first, g0, crown: SearchResult) -> SearchResult:
        """CROWN-Quad radius: a float64 search on the quadratic bound, started at CROWN's radius.

        The quadratic bound is never below CROWN's, so starting there the search only moves
        up; whichever verified radius is larger is returned (both are certificates).
        """
        if crown.status == "capped":
            return crown
        res = self._search(lambda eps: float(np.min(self.quad.lower_bound(x0, eps, C, first))),
                           g0, crown.eps if crown.eps > 0 else self.eps0, self.rtol)
        best = res if res.eps >= crown.eps else crown
        return SearchResult(best.eps, best.lower_bound, crown.evaluations + res.evaluations,
                            best.status, best.upper)

    record_proof = False  # crown certify --proof: keep how the reported bound was verified
    proof_writer = None  # crown certify --proof: the ProofWriter its certified rows go to

    ALPHA_START = 1.005  # first radius optimised: this times CROWN's
    # rounds of (optimise, root at fixed slopes). Another round runs only when the verified
    # radius ended more than ALPHA_REOPT above the radius the slopes were optimised at (it
    # pays for l_1, where the radius moves past the optimisation radius)
    ALPHA_ROUNDS = 2
    ALPHA_REOPT = 0.01
    ALPHA_NEXT = 0.5  # the next round optimises this fraction of the gain so far above it
    # tanh / sigmoid / arctan (free tangent points): one round, started higher
    ALPHA_START_SMOOTH = 1.03
    ALPHA_ROUNDS_SMOOTH = 1

    def _alpha_stopping(self):
        """(patience, tol) of the slope optimiser's early stop (see ALPHA_SMALL and
        ALPHA_PATIENCE_SMOOTH)."""
        if sum(w.shape[0] for w in self.net.W[:-1]) <= ALPHA_SMALL:
            patience, tol = ALPHA_PATIENCE, ALPHA_TOL
        else:
            patience, tol = ALPHA_PATIENCE_LARGE, ALPHA_TOL_LARGE
        if ACTIVATIONS[self.activation].smooth:
            patience = max(patience, ALPHA_PATIENCE_SMOOTH)
        return patience, tol

    def _alpha_bounds(self, x0, C, first=None):
        from crown_cli.engine.alpha_crown import AlphaBounds

        leak = self.alpha if self.activation == "leaky_relu" else 0.0
        # joint: every variable for the margin's bound (the smooth activations' default in
        # AlphaBounds is each intermediate bound for itself)
        return AlphaBounds(self.net, self.relax_fn, leak, x0, self.qcode, C,
                           first_layer_center(self.net, x0) if first is None else first,
                           act_bound=self._act_bound, activation=self.activation, joint=True)

    def _alpha_search(self, x0, C, first, g0, crown: SearchResult) -> SearchResult:
        """alpha-CROWN radius, searched upward from CROWN's verified radius.

        Each round optimises the slopes at a radius (float32, warm-started from the previous
        round), then with the slopes fixed (the bound is then monotone in eps) locates the
        largest radius whose float32 bound is > 0 and verifies it in float64: the verified
        bound is the larger of alpha-CROWN's and CROWN's, both sound, so the result is never
        below CROWN's radius (whichever verified radius is larger is returned). Returns
        (the result, the record of its verified bound when ``record_proof`` and alpha-CROWN's
        radius is returned, else None).
        """
        if crown.status == "capped" or not crown.eps > 0 or self.alpha_iters == 0:
            return crown, None
        best_rec = None
        ab = self._alpha_bounds(x0, C, first)
        f32 = lambda e: float(np.min(ab.evaluate(e)))  # noqa: E731
        best, evals = crown, crown.evaluations
        smooth = ACTIVATIONS[self.activation].smooth
        lo = crown.eps
        target = lo * (self.ALPHA_START_SMOOTH if smooth else self.ALPHA_START)
        tol = self.F32_RTOL * self.rtol
        for _ in range(self.ALPHA_ROUNDS_SMOOTH if smooth else self.ALPHA_ROUNDS):
            patience, stop_tol = self._alpha_stopping()
            _, steps, last = ab.optimise(target, self.alpha_iters, self.alpha_lr,
                                         patience=patience, tol=stop_tol, scale=g0)
            evals += steps
            hi, grow = target, target / lo - 1.0
            if last is not None:  # the optimiser's last evaluation was at the final slopes
                fhi = float(np.min(last))
            else:
                fhi = f32(hi)
                evals += 1
            if fhi > 0:
                flo = None
            else:
                flo = f32(lo)
                evals += 1
                if not flo > 0:
                    break
            while fhi > 0 and hi < self.eps_max:
                lo, flo = hi, fhi
                grow *= 2.0
                hi = min(lo * (1.0 + grow), self.eps_max)
                fhi = f32(hi)
                evals += 1
            if fhi > 0:  # certified up to eps_max in float32
                cand = hi
            else:
                ref = refine_bracket(f32, g0, lo, flo, hi, fhi, tol)
                evals += ref.evaluations
                cand, hi = ref.eps, ref.upper
            if not cand > best.eps * (1.0 + 0.5 * self.rtol):
                break
            for e in (cand, cand * (1.0 - 0.5 * self.rtol)):
                rec = {} if self.record_proof else None
                v = float(np.min(ab.evaluate(e, verify=True, record=rec)))
                evals += 1
                if v > 0:
                    status = "capped" if e >= self.eps_max else "certified"
                    best, best_rec = SearchResult(e, v, evals, status, hi), rec
                    break
            else:
                break
            if best.eps < target * (1.0 + self.ALPHA_REOPT):
                break
            lo, target = best.eps, best.eps * (1.0 + self.ALPHA_NEXT * (best.eps / crown.eps - 1.0))
        return SearchResult(best.eps, best.lower_bound, evals, best.status, best.upper), best_rec

    def _certify_other(self, x0: np.ndarray, c: int, targets: Sequence[int]) -> Certificate:
        """A method from crown_cli.certification.methods: a bound searched like CROWN's, or a radius."""
        t0 = time.perf_counter()
        x0 = np.ascontiguousarray(x0, dtype=np.float64)
        C = self.margin_rows(c, targets)
        g0 = float(np.min(C @ self.logits(x0)))
        kind, fn = self.other
        if kind == "bound":
            evals = [0]
            kwargs = {}
            if self.timeout is not None and "deadline" in inspect.signature(fn).parameters:
                kwargs["deadline"] = time.monotonic() + self.timeout

            def bound(eps):
                evals[0] += 1
                return float(np.min(fn(x0, float(eps), C, **kwargs)))

            try:
                res = self._search(bound, g0, self.eps0, self.rtol)
            except DeadlineExceeded:  # no radius: the search did not finish
                return Certificate(None, None, g0, evals[0], "timeout", time.perf_counter() - t0)
            return Certificate(res.eps, res.lower_bound, g0, res.evaluations, res.status,
                               time.perf_counter() - t0)
        out = fn(x0, c, list(targets), C, g0, self.eps0, self.eps_max, self.timeout)
        return Certificate(out.eps, out.lower_bound, g0, out.evaluations, out.status,
                           time.perf_counter() - t0)

    def _tracks_rounding(self) -> bool:
        """Do float32 evaluations bound their rounding (for :class:`StableFromFloat32`)?"""
        return (self.precision == "mixed" and self.interval_free is not None
                and self.net.num_hidden >= 2 and ACTIVATIONS[self.activation].sign_stable)

    def _act_bound(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """max |act(z)| over [lo, hi] elementwise: at an end of the interval for the
        activations that track rounding (ReLU, leaky ReLU: |act| grows with |z| on each side
        of 0) and for monotone ones."""
        return np.maximum(np.abs(apply_activation(self.activation, lo, self.alpha)),
                          np.abs(apply_activation(self.activation, hi, self.alpha)))

    def _known_from_larger_ball(self, done, eps, x0=None):
        """Known bounds for an evaluation at eps: (mask, l, u) per hidden layer, or a function.

        Bounds proven on a larger ball hold on this one; for neurons the relaxation treats
        the same on every sub-interval (stable ReLUs) they replace recomputation. Float32
        evaluations (``x0`` None, ``done`` their own list) take them from the smallest larger
        float32 ball, and get (known, that evaluation's record or None). Float64 evaluations
        take them from a larger float64 ball, or else from the float32 evaluations made
        rigorous layer by layer (:mod:`crown_cli.engine.stability`).
        """
        own = done[np.float64] if x0 is not None else done
        larger = [rec for rec in own if rec[0] >= eps] if self.interval_free is not None else []
        src = min(larger, key=lambda rec: rec[0]) if larger else None
        known = None if src is None else [(self.interval_free(l, u), l, u) for l, u in src[1]]
        if x0 is None:
            return known, src
        if known is not None or self.interval_free is None:
            return known
        if self.net.num_hidden < 2 or not ACTIVATIONS[self.activation].sign_stable:
            return None
        return StableFromFloat32(self.net, x0, eps, done[np.float32], self.relax_fn,
                                 self.interval_free, self.activation, self.alpha)
