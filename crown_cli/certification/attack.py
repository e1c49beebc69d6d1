"""Projected-gradient attack: an upper bound on the minimum adversarial distortion.

Certification gives a lower bound on the least l_p distortion that lets a target class reach
the predicted class's logit; an attack that finds a real adversarial example gives an upper
bound. :class:`PGDAttack` searches for the smallest one it can:

* PGD on the margin ``m(x) = min_t f_c(x) - f_t(x)`` over the listed targets (one target:
  targeted; all other classes: untargeted), with analytic gradients for every activation
  crown supports, several restarts run as one batch, steps in the norm's steepest-descent
  direction (sign for l_inf, normalised gradient for l_2, a sparse top-k coordinate step for
  l_1, k = 1 by default) and projection onto the ball (l_1 by sorting).
* A radius search, grow then bisect, a batch of radii at a time: a ladder of radii around
  the first-order estimate ``m(x0) / ||grad m(x0)||_q`` of the distance to the decision
  boundary, climbing until PGD succeeds, then evenly spaced radii between the largest failed
  radius and the distortion of the best example so far.
* Every candidate is verified on its own by a float64 forward pass (``activations.forward``):
  ``min_t f_c - f_t <= 0``, i.e. the decision flips to or ties with a target. The best point
  is finally pulled towards x0 along the segment [x0, x] while it stays adversarial, and
  verified again.

The reported distortion is ``||x_adv - x0||_p`` of that verified point, never a nominal
radius, so a certified radius above it would prove the certifier wrong. Arrays in, arrays out:
no files and no printing. Deterministic given the random generator passed in.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from crown_cli.activations import (ACTIVATIONS, apply_activation, attack_derivative, default_alpha,
                                   forward)
from crown_cli.errors import InputError

NORMS = ("inf", "2", "1")
DEFAULT_STEPS = 20
DEFAULT_RESTARTS = 2


def forward_with_preactivations(weights, biases, activation: str, X: np.ndarray, alpha):
    """Logits of the rows of X (R, d) and every hidden layer's pre-activations, in the dtype of
    the weights (float32 weights: a fast pass for gradients that only steer a search)."""
    dtype = weights[0].dtype
    zs = []
    a = X.astype(dtype)
    for k in range(len(weights) - 1):
        z = a @ weights[k].T + biases[k]
        zs.append(z)
        a = apply_activation(activation, z, alpha).astype(dtype)
    return a @ weights[-1].T + biases[-1], zs


def input_gradient(weights, zs, activation: str, g: np.ndarray, alpha) -> np.ndarray:
    """Back-propagate g (R, n_last_hidden), the gradient with respect to the last hidden
    layer's activations, to the inputs: (R, d). ``zs`` from :func:`forward_with_preactivations`."""
    dtype = weights[0].dtype
    for k in range(len(zs) - 1, -1, -1):
        g = (g * attack_derivative(activation, zs[k], alpha).astype(dtype)) @ weights[k]
    return g


def lp_norm(v: np.ndarray, norm: str) -> np.ndarray:
    """l_p norm of v (d,) or of every row of v (R, d)."""
    v = np.asarray(v, dtype=np.float64)
    if norm == "inf":
        return np.max(np.abs(v), axis=-1)
    if norm == "2":
        return np.sqrt(np.sum(v * v, axis=-1))
    return np.sum(np.abs(v), axis=-1)


def dual_norm(v: np.ndarray, norm: str) -> np.ndarray:
    """The l_q norm with 1/p + 1/q = 1 (bounds <g, delta> over the unit l_p ball)."""
    return lp_norm(v, {"inf": "1", "2": "2", "1": "inf"}[norm])


def project_l1_ball(D: np.ndarray, radius) -> np.ndarray:
    """Euclidean projection of each row of D (R, d) onto {||delta||_1 <= radius}.

    ``radius`` is a scalar or one value per row. A row outside its ball is soft-thresholded,
    |delta_i| -> max(|delta_i| - theta, 0) with the signs kept, where theta makes the l_1 norm
    equal to the radius: sorting |delta| in decreasing order as u_1 >= u_2 >= ...,
    theta = (u_1 + ... + u_k - radius) / k for the largest k with
    u_k > (u_1 + ... + u_k - radius) / k (Duchi et al., ICML 2008).
    """
    D = np.array(D, dtype=np.float64, ndmin=2)
    r = np.broadcast_to(np.asarray(radius, dtype=np.float64), (D.shape[0],))
    A = np.abs(D)
    outside = np.flatnonzero(A.sum(axis=1) > r)
    if outside.size == 0:
        return D
    ro = r[outside]
    U = np.sort(A[outside], axis=1)[:, ::-1]
    partial = np.cumsum(U, axis=1) - ro[:, None]
    k = np.arange(1, U.shape[1] + 1)
    keep = U * k > partial  # True on a prefix of each row
    count = keep.sum(axis=1)
    theta = partial[np.arange(outside.size), count - 1] / count
    # the sum may end a few ulps above the radius: harmless, distortions are always measured
    D[outside] = np.sign(D[outside]) * np.maximum(A[outside] - theta[:, None], 0.0)
    return D


def project_ball(D: np.ndarray, radius, norm: str) -> np.ndarray:
    """Perturbations D (R, d) projected onto the l_p ball around 0; radius scalar or (R,)."""
    r = np.broadcast_to(np.asarray(radius, dtype=np.float64), (D.shape[0],))
    if norm == "inf":
        return np.clip(D, -r[:, None], r[:, None])
    if norm == "2":
        n = lp_norm(D, "2")
        scale = np.where(n > r, r / np.maximum(n, 1e-300), 1.0)
        return D * scale[:, None]
    return project_l1_ball(D, r)


def descent_direction(G: np.ndarray, norm: str, l1_coords: int) -> np.ndarray:
    """A unit-l_p step direction for each row of gradients G (R, d) (to be subtracted).

    l_inf: sign(G); l_2: G / ||G||_2; l_1: the sign of G spread evenly over the l1_coords
    coordinates of largest |G| (1 gives the exact l_1 steepest step, a vertex of the ball).
    """
    if norm == "inf":
        return np.sign(G)
    if norm == "2":
        n = lp_norm(G, "2")
        return G / np.maximum(n, 1e-300)[:, None]
    k = max(1, min(l1_coords, G.shape[1]))
    top = np.argpartition(np.abs(G), G.shape[1] - k, axis=1)[:, G.shape[1] - k:]
    S = np.zeros_like(G)
    rows = np.arange(G.shape[0])[:, None]
    S[rows, top] = np.sign(G[rows, top]) / k
    return S


def random_perturbations(radius: np.ndarray, d: int, norm: str,
                         rng: np.random.Generator) -> np.ndarray:
    """One random starting perturbation (d,) inside the l_p ball of each radius: (n, d).

    Not uniform in the ball: l_inf uniform in the box; l_2 and l_1 a random direction (Gaussian
    or Laplace) scaled to between half and all of the radius.
    """
    radius = np.asarray(radius, dtype=np.float64)
    n = radius.size
    if n == 0:
        return np.zeros((0, d))
    if norm == "inf":
        return rng.uniform(-1.0, 1.0, size=(n, d)) * radius[:, None]
    if norm == "2":
        V = rng.standard_normal((n, d))
    else:
        V = rng.laplace(size=(n, d))
    V /= np.maximum(lp_norm(V, norm), 1e-300)[:, None]
    return V * (radius * rng.uniform(0.5, 1.0, size=n))[:, None]


@dataclass
class AttackResult:
    """Smallest verified adversarial example found for one (image, targets) query."""

    eps: Optional[float]  # ||x_adv - x0||_p of the verified example; None if none was found
    x_adv: Optional[np.ndarray]  # (d,) the example
    margin: float  # min_t f_c(x_adv) - f_t(x_adv) (<= 0), or the margin at x0 if none found
    target: Optional[int]  # the target class reached at x_adv
    runs: int  # PGD runs spent
    gradients: int  # gradient evaluations (one per point and step)
    time_s: float


@dataclass(frozen=True)
class PGDSettings:
    """The settings of a :class:`PGDAttack`: ``steps`` gradient steps per PGD run;
    ``restarts`` starting points per radius; ``eps_max`` the radius at which the search gives
    up; ``ladder`` radii attacked together in one run; ``rounds`` refining runs after the
    first success; ``l1_coords`` coordinates moved by an l_1 step (1, the exact steepest
    step, found the smallest l_1 distortions on mnist_3x1024.h5: about 18% below 8
    coordinates)."""

    steps: int = DEFAULT_STEPS
    restarts: int = DEFAULT_RESTARTS
    eps_max: float = 1e4
    ladder: int = 8
    rounds: int = 2
    l1_coords: int = 1


class PGDAttack:
    """PGD minimum-distortion search for one network and norm; ``settings``: the fields of
    :class:`PGDSettings` (keywords)."""

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                 activation: str, norm: str = "inf", alpha=None, **settings):
        o = PGDSettings(**settings)
        steps, restarts = o.steps, o.restarts
        if activation not in ACTIVATIONS:
            raise InputError(f"--attack: no gradient for activation '{activation}'")
        if norm not in NORMS:
            raise InputError(f"--norm: unknown norm '{norm}' (choose from inf, 2, 1)")
        if steps < 1:
            raise InputError(f"--attack-steps: must be >= 1, got {steps}")
        if restarts < 1:
            raise InputError(f"--attack-restarts: must be >= 1, got {restarts}")
        self.W = [np.ascontiguousarray(w, dtype=np.float64) for w in weights]
        self.b = [np.ascontiguousarray(b, dtype=np.float64) for b in biases]
        # gradients only steer the search, so they are computed in float32 (about twice as
        # fast); every point reported is verified with the float64 weights
        self.W32 = [w.astype(np.float32) for w in self.W]
        self.b32 = [b.astype(np.float32) for b in self.b]
        self.grad_evals = 0
        self.activation = activation
        self.alpha = default_alpha(activation) if alpha is None else alpha
        self.norm = norm
        self.steps = int(steps)
        self.restarts = int(restarts)
        self.eps_max = float(o.eps_max)
        self.ladder = int(o.ladder)
        self.rounds = int(o.rounds)
        self.l1_coords = max(1, int(o.l1_coords))

    # -- network -------------------------------------------------------------------------------

    def margins(self, X: np.ndarray, c: int, targets: np.ndarray) -> np.ndarray:
        """f_c - f_t for rows of X (R, d) and every target: (R, T), by the package's forward."""
        f = forward(self.W, self.b, self.activation, X, self.alpha)
        return f[:, [c]] - f[:, targets]

    def margin_and_grad(self, X: np.ndarray, c: int, targets: np.ndarray):
        """m(x) = min_t f_c - f_t at the rows of X (R, d) and its gradient (R, d).

        The gradient is that of the target attaining the minimum (a subgradient of m).
        """
        self.grad_evals += X.shape[0]
        W = self.W32
        f, zs = forward_with_preactivations(W, self.b32, self.activation, X, self.alpha)
        M = f[:, [c]] - f[:, targets]
        j = np.argmin(M, axis=1)
        m = M[np.arange(X.shape[0]), j].astype(np.float64)
        g = W[-1][c][None, :] - W[-1][targets[j]]  # d m / d a_last, (R, n)
        return m, input_gradient(W, zs, self.activation, g, self.alpha).astype(np.float64)

    def _verified(self, x: np.ndarray, c: int, targets: np.ndarray):
        """(is adversarial, margin, reached target) from a single-row float64 forward pass."""
        M = self.margins(x[None, :], c, targets)[0]
        j = int(np.argmin(M))
        return bool(M[j] <= 0.0), float(M[j]), int(targets[j])

    # -- PGD ---------------------------------------------------------------------------------

    def pgd(self, x0: np.ndarray, c: int, targets: np.ndarray, radii: np.ndarray,
            rng: np.random.Generator, warm: Optional[np.ndarray] = None,
            best: float = np.inf):
        """PGD at several radii at once: ``restarts`` rows per radius, run as one batch.

        Of each radius' rows the first starts at x0, the second at ``warm`` projected into
        the ball (if given), the rest at random points. The step size decays linearly from
        radius/2 to radius/50. A row whose float32 margin gets near 0 is checked in float64;
        once a verified adversarial point at distortion ``dist`` is found, every row whose
        radius is >= dist stops (it could hardly do better), as does every row at a radius
        >= ``best``, a distortion already found.

        Returns (point, distortion) of the closest verified adversarial point found (or
        (None, inf)) and the radii whose rows all ran every step without success.
        """
        radii = np.asarray(radii, dtype=np.float64)
        d, R = x0.size, self.restarts
        rho = np.repeat(radii, R)
        D = random_perturbations(rho, d, self.norm, rng)
        D[0::R] = 0.0
        if warm is not None and R > 1:
            D[1::R] = project_ball(np.repeat((warm - x0)[None, :], radii.size, axis=0), radii,
                                   self.norm)
        active = rho < best
        stopped = np.zeros(rho.size, dtype=bool)  # stopped because something closer was found
        stopped[~active] = True
        found_x, found = None, np.inf
        for k in range(self.steps + 1):
            rows = np.flatnonzero(active)
            if rows.size == 0:
                break
            X = x0 + D[rows]
            m, G = self.margin_and_grad(X, c, targets)
            # float32 margins only nominate candidates; the float64 check decides
            near = np.flatnonzero(m <= 1e-5 * (1.0 + np.abs(m).max()))
            for i in near[np.argsort(rho[rows[near]])]:
                if not active[rows[i]] or not self._verified(X[i], c, targets)[0]:
                    continue
                dist = float(lp_norm(X[i] - x0, self.norm))
                if dist < found:
                    found_x, found = X[i].copy(), dist
                done = active & (rho >= min(found, rho[rows[i]]))
                stopped |= done
                active &= ~done
            if k == self.steps:
                break
            still = active[rows]
            rows, G = rows[still], G[still]
            step = (0.02 + 0.48 * (1.0 - k / self.steps)) * rho[rows]
            D[rows] = project_ball(
                D[rows] - step[:, None] * descent_direction(G, self.norm, self.l1_coords),
                rho[rows], self.norm)
        failed = ~stopped.reshape(radii.size, R).any(axis=1)
        return found_x, found, radii[failed]

    def shrink(self, x0: np.ndarray, x: np.ndarray, c: int, targets: np.ndarray,
               points: int = 16, rounds: int = 2) -> np.ndarray:
        """A verified adversarial point on the segment [x0, x] close to x0's end.

        x must be verified adversarial and x0 not. Each round evaluates ``points`` evenly
        spaced points of the current sub-segment in one batch and keeps the one nearest x0
        that is adversarial; the result is then re-verified on its own (falling back to x).
        """
        delta = x - x0
        lo, hi = 0.0, 1.0
        for _ in range(rounds):
            s = lo + (hi - lo) * np.arange(1, points + 1) / points
            adv = self.margins(x0 + s[:, None] * delta, c, targets).min(axis=1) <= 0.0
            j = int(np.argmax(adv))  # first adversarial (the last one, s = hi, always is)
            if not adv[j]:
                break
            lo, hi = (s[j - 1] if j > 0 else lo), s[j]
        p = x0 + hi * delta
        return p if self._verified(p, c, targets)[0] else x

    # -- minimum distortion --------------------------------------------------------------------

    def min_distortion(self, x0: np.ndarray, c: int, targets: Sequence[int],
                       rng: Optional[np.random.Generator] = None) -> AttackResult:
        """Smallest verified adversarial distortion found for f_t >= f_c, t in ``targets``.

        Radius search in batches of ``ladder`` radii: the first batch spans 0.5x to about 5.7x
        the first-order estimate m(x0) / ||grad m(x0)||_q, in steps of sqrt(2); while nothing
        is found the ladder climbs on (up to eps_max). Then ``rounds`` batches of evenly spaced
        radii between the largest failed radius and the best distortion refine it (each
        shrinks the bracket about ladder + 1 times), starting one restart per radius from the
        best point so far.
        """
        t_start = time.perf_counter()
        g_start = self.grad_evals
        rng = np.random.default_rng(0) if rng is None else rng
        x0 = np.ascontiguousarray(x0, dtype=np.float64)
        targets = np.asarray(list(targets), dtype=np.int64)
        adv0, m0, t0 = self._verified(x0, c, targets)
        if adv0:  # x0 itself ties with or is beaten by a target
            return AttackResult(0.0, x0.copy(), m0, t0, 0, 0, time.perf_counter() - t_start)
        _, g0 = self.margin_and_grad(x0[None, :], c, targets)
        q = float(dual_norm(g0[0], self.norm))
        guess = m0 / q if q > 0 else 1e-3
        L = self.ladder
        radii = np.minimum(max(guess, 1e-8) * np.sqrt(2.0) ** np.arange(-2, L - 2), self.eps_max)
        runs, lo = 0, 0.0
        best_x, best = None, np.inf
        while True:
            radii = np.unique(radii)
            x, dist, failed = self.pgd(x0, c, targets, radii, rng)
            runs += 1
            if x is not None:
                best_x, best = x, dist
                lo = max(failed[failed < best], default=0.0)
                break
            if radii[-1] >= self.eps_max:
                return AttackResult(None, None, m0, None, runs, self.grad_evals - g_start,
                                    time.perf_counter() - t_start)
            lo = radii[-1]
            radii = np.minimum(lo * np.sqrt(2.0) ** np.arange(1, L + 1), self.eps_max)
        for _ in range(self.rounds):
            radii = lo + (best - lo) * np.arange(1, L + 1) / (L + 1)
            x, dist, failed = self.pgd(x0, c, targets, radii, rng, warm=best_x, best=best)
            runs += 1
            if x is not None and dist < best:
                best_x, best = x, dist
            lo = max(lo, max(failed[failed < best], default=0.0))
        best_x = self.shrink(x0, best_x, c, targets)
        adv, m, t = self._verified(best_x, c, targets)
        if not adv:  # pgd and shrink only keep verified points; this would be a bug
            raise RuntimeError("attack: the best point found is not adversarial")
        return AttackResult(float(lp_norm(best_x - x0, self.norm)), best_x, m, t, runs,
                            self.grad_evals - g_start, time.perf_counter() - t_start)
