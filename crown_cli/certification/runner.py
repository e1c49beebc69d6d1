"""The batch loop: images in index order -> targets -> certificates -> rows handed to a sink."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from crown_cli.certification.certifier import Certifier
from crown_cli.certification.targets import TARGET_TYPES, TargetSelector
from crown_cli.engine.kernels import serial_kernels
from crown_cli.errors import InputError, interrupted
from crown_cli.io.results import FAILED_STATUSES

if TYPE_CHECKING:  # only --attack pgd runs need the module
    from crown_cli.certification.attack import PGDAttack


@dataclass
class Summary:
    images: int = 0
    misclassified: int = 0
    rows: int = 0
    certified_eps: List[float] = field(default_factory=list)
    # (norm, method) -> certified eps of its rows: radii of different norms are not comparable
    eps_by: Dict[Tuple[str, str], List[float]] = field(default_factory=dict)
    exact_eps: List[float] = field(default_factory=list)  # --method exact: distortions, not certificates
    exact_by: Dict[str, List[float]] = field(default_factory=dict)  # norm -> exact distortions
    times: List[float] = field(default_factory=list)
    evaluations: List[int] = field(default_factory=list)
    skipped: int = 0  # rows already in the output (--resume)
    failed: int = 0  # rows with status error or timeout
    timed_out: int = 0  # of them, with status timeout
    errors: List[str] = field(default_factory=list)  # one line per row whose certification raised

    def line(self, wall_s: float, output: str) -> str:
        if self.eps_by:
            mean_eps = ", ".join(
                f"{_NORM_TEXT.get(norm, norm)} {method} {np.mean(eps):.5g} over {len(eps)} rows"
                for (norm, method), eps in self.eps_by.items())
        else:
            mean_eps = "n/a over 0 rows"
        per_row = f"{np.mean(self.times):.3f}" if self.times else "n/a"
        evals = f"{np.mean(self.evaluations):.1f}" if self.evaluations else "n/a"
        dest = "stdout" if output == "-" else output
        exact = ("mean exact distortion " + ", ".join(
            f"{_NORM_TEXT.get(norm, norm)} {np.mean(eps):.5g} over {len(eps)} rows"
            for norm, eps in self.exact_by.items()) + "; ") if self.exact_by else ""
        return (
            f"crown: {self.rows} rows for {self.images} images ({self.misclassified} misclassified); "
            f"mean certified eps {mean_eps}; {exact}{per_row} s/row, "
            f"{evals} evaluations/row; "
            f"{wall_s:.1f} s total -> {dest}"
            + (f"; {self.skipped} rows already there (resumed)" if self.skipped else "")
            + (f"; {self.failed - self.timed_out} rows FAILED (status error)"
               if self.failed > self.timed_out else "")
            + (f"; {self.timed_out} rows timed out (status timeout)" if self.timed_out else "")
        )


_NORM_TEXT = {"inf": "l_inf", "2": "l_2", "1": "l_1"}


def row_key(row: Dict[str, object]) -> Tuple[str, str, str, str, str]:
    """(image, target_type, target, norm, method) as text: the identity of a row in a file."""
    from crown_cli.io.results import format_value

    return tuple(format_value(row.get(k)) for k in ("image", "target_type", "target", "norm", "method"))


@dataclass(frozen=True)
class AttackRuns:
    """``--attack pgd``: the PGD attack per norm, the seed of its random starts, and where a
    certified radius above the attack's distortion is reported (an unsound certificate)."""

    by_norm: Mapping[str, "PGDAttack"]
    seed: int = 0
    warn: Optional[Callable[[str], None]] = None


@dataclass(frozen=True)
class RunOptions:
    """:func:`certify_images`'s settings: a progress bar; ``skip(row_key)``, the row a
    resumed file already holds (or None); the attack runs; the processes (1 or 2)."""

    progress: bool = True
    skip: Optional[Callable[[Tuple[str, ...]], Optional[Dict[str, object]]]] = None
    attacks: Optional["AttackRuns"] = None
    workers: int = 1


def certify_images(
    certifiers: Sequence[Certifier],
    x: np.ndarray,
    y: np.ndarray,
    indices: Iterable[int],
    target_types: Sequence[str],
    seed: int,
    emit: Callable[[Dict[str, object]], None],
    **options,
) -> Summary:
    """Certify x[i] for i in ``indices`` (ascending) with every certifier and target type;
    ``options`` the fields of :class:`RunOptions` (keywords).

    The random-target stream is replayed from image 0, so image i gets the same random target
    whatever ``--start`` is. The rows of an image and certifier go to ``emit`` as soon as
    they are done, in the order of ``target_types``. A row for whose :func:`row_key` ``skip``
    returns a row (already written, ``--resume``) is not computed again; its radius counts in
    the summary's means, which so cover the whole file. A certification that raises gives a
    row with status ``error`` and the run goes on.

    With ``untargeted`` among ``target_types``, the untargeted row is computed first and each
    targeted row of the same image, norm and method gets at least its radius
    (:func:`_raise_to_floor`; not for ``exact``, whose distortions are no certificates).

    ``attacks`` adds the attack's distortion to every certified row of a norm it has; the
    attack runs once per (image, norm, target type) and is shared by the methods. A certified
    eps above it is reported through ``attacks.warn`` (it would mean an unsound certificate).

    A certifier with a ``proof_writer`` (a :class:`~crown_cli.certification.proofs.ProofWriter`,
    ``--proof``; the certifier records its proofs) hands it every certified row's certificate;
    a targeted row raised to the untargeted radius gets the untargeted certificate's case of
    its target.

    ``workers`` 2: images are taken in pairs, the second one's certifications run in a forked
    helper process (:class:`~crown_cli.verification.bab.workers.Helper`) while this process
    certifies the first, each on one thread; everything else (the rows, their order, the
    floors, attacks, resume, the summary) stays here, so each row is the one certification
    of its image (a radius may move in its last digits, within the search's tolerance, as
    BLAS on one thread sums in another order). Not with ``--proof`` (its certificates are
    written by this process's certifiers); alone where no second core or fork is available.
    """
    o = RunOptions(**options)
    progress, skip, attacks, workers = o.progress, o.skip, o.attacks, o.workers
    indices = list(indices)
    first = certifiers[0]
    logits = first.logits(x[: indices[-1] + 1]) if indices else np.zeros((0, 0))
    selector = TargetSelector(seed)
    choices = [selector.select(z) for z in logits]  # advance the stream in index order
    summary = Summary()
    for cert in certifiers:  # kernel loading is start-up, not the first image's time
        cert.warm_up()
    rows = _Rows(x, summary, skip, attacks)
    # the untargeted row first: its radius is a floor for the targeted ones (_raise_to_floor)
    order = sorted(target_types, key=lambda t: t != "untargeted")
    bar = _progress(len(indices), progress)
    pair = _Pairs(certifiers, x, y, choices, order, skip, workers, len(indices))

    def image(i):
        sel = choices[i]
        c = int(sel["predicted"])
        label = int(y[i])
        summary.images += 1
        base = {"image": i, "label": label, "predicted": c}
        misclassified = c != label
        summary.misclassified += misclassified
        for cert in certifiers:
            done = rows.of(cert, base, sel, order, misclassified)
            for ttype in target_types:  # in the order asked for
                if ttype in done:
                    emit(done[ttype])
                    summary.rows += 1
        if bar is not None:
            bar.update(1)
            if summary.certified_eps:
                bar.set_postfix(eps=f"{summary.certified_eps[-1]:.4g}", refresh=False)

    try:
        with pair.threads():
            for k in range(0, len(indices), pair.step):
                group = indices[k:k + pair.step]
                if len(group) > 1:
                    pair.send(group[1])
                image(group[0])
                if len(group) > 1:
                    rows.ready = pair.recv()
                    image(group[1])
                    rows.ready = {}
    finally:
        pair.close()
        if bar is not None:
            bar.close()
    return summary


class _Pairs:
    """:func:`certify_images`'s second process (``workers`` 2): each pair's second image's
    certifications, run by a forked :class:`~crown_cli.verification.bab.workers.Helper`
    (``step`` 2), or none (``step`` 1)."""

    def __init__(self, certifiers, x, y, choices, order, skip, workers: int, n: int):
        from crown_cli.verification.bab.workers import Helper, can_fork

        self.certifiers, self.x, self.y, self.choices = certifiers, x, y, choices
        self.order, self.skip = order, skip
        self.helper = None
        if workers > 1 and n > 1 and can_fork() and all(
                getattr(c, "proof_writer", None) is None for c in certifiers):
            with serial_kernels():  # what the helper runs: loaded here, inherited compiled
                for cert in certifiers:
                    cert.warm_up()
            try:
                self.helper = Helper(self._run, single=True)
            except OSError:  # no fork (process limits): alone
                self.helper = None
        self.step = 1 if self.helper is None else 2

    def threads(self):
        import contextlib

        from crown_cli.engine.threads import one_thread

        return one_thread() if self.helper is not None else contextlib.nullcontext()

    def _jobs(self, i):
        """Image i's certifications that :class:`_Rows` will ask for: (norm, method, target
        type) -> targets (none for a misclassified image or rows a resumed file holds)."""
        sel = self.choices[i]
        c = int(sel["predicted"])
        jobs = {}
        if c != int(self.y[i]):
            return c, jobs
        base = {"image": i, "label": int(self.y[i]), "predicted": c}
        for cert in self.certifiers:
            for ttype in self.order:
                row = _new_row(base, cert, ttype, sel[ttype])
                if self.skip is not None and self.skip(row_key(row)):
                    continue
                jobs[(cert.norm, cert.method, ttype)] = _target_list(sel[ttype])
        return c, jobs

    def _run(self, i, c, jobs):
        """(In the helper.) The certificates of image i, or the exception each raised."""
        by = {(cert.norm, cert.method): cert for cert in self.certifiers}
        out = {}
        for key, targets in jobs.items():
            try:
                out[key] = by[key[:2]].certify(self.x[i], c, targets)
            except Exception as exc:  # noqa: BLE001 - raised again where the row is made
                out[key] = exc
        return i, out

    def send(self, i):
        from crown_cli.verification.bab.workers import HelperLost

        if self.helper is None:  # (lost: this process certifies the pair)
            return
        c, jobs = self._jobs(i)
        try:
            self.helper.send((i, c, jobs))
        except HelperLost:
            self.close()  # lost: this process certifies the rest

    def recv(self):
        """The certificates of the image sent last, by (norm, method, target type); {} when
        the helper was lost (this process then certifies that image and the rest)."""
        from crown_cli.verification.bab.workers import HelperLost

        if self.helper is None:
            return {}
        try:
            i, out = self.helper.recv()
        except HelperLost:
            self.close()  # lost: this process certifies the rest
            return {}
        return {(i,) + key: res for key, res in out.items()}

    def close(self):
        if self.helper is not None:
            self.helper.close()
            self.helper = None


def _new_row(base, cert, ttype: str, target) -> Dict[str, object]:
    """The row of image ``base`` for ``cert`` and target type ``ttype`` before its
    certificate (``target`` the selector's: a class, or the list of every other class)."""
    return dict(base, target="" if ttype == "untargeted" else target, target_type=ttype,
                norm=cert.norm, method=cert.method, search=cert.search,
                precision=cert.precision, rtol=cert.rtol)


def _target_list(target) -> List[int]:
    """The targets a certification takes for the selector's ``target``."""
    return target if isinstance(target, list) else [target]


class _Rows:
    """The rows of one image and certifier: resumed from the file, misclassified, or
    certified (with the untargeted floor and the attack), each counted in the summary."""

    def __init__(self, x, summary: Summary, skip, attacks: Optional[AttackRuns]):
        self.x, self.summary, self.skip, self.attacks = x, summary, skip, attacks
        # certificates made by the second process, by (image, norm, method, target type)
        self.ready: Dict[tuple, object] = {}
        self.attack_cache: Dict[tuple, object] = {}
        self.floor_src = None  # (Certificate, targets) of this image's untargeted row

    def of(self, cert, base, sel, order, misclassified) -> Dict[str, Dict[str, object]]:
        """The rows of the image ``base`` with ``cert`` for the target types ``order``
        (untargeted first), by target type (a row the resumed file holds is left out)."""
        summary = self.summary
        rows: Dict[str, Dict[str, object]] = {}
        floor = None  # the untargeted row of this image, norm and method
        self.floor_src = None
        for ttype in order:
            target = sel[ttype]
            row = _new_row(base, cert, ttype, target)
            there = self.skip(row_key(row)) if self.skip is not None else None
            if there:  # already in the resumed file: counted, not computed
                summary.skipped += 1
                _count_eps(summary, cert, _parsed(there))
                if ttype == "untargeted":
                    floor = _parsed(there)
                continue
            if misclassified:
                row.update(status="misclassified", time_s=0.0, evaluations=0)
            else:
                floor = self._certify(row, cert, ttype, target, floor)
            summary.failed += row.get("status") in FAILED_STATUSES
            summary.timed_out += row.get("status") == "timeout"
            rows[ttype] = row
        return rows

    def _certify(self, row, cert, ttype, target, floor):
        """Fill ``row`` with its certificate (or the error it raised); returns the untargeted
        floor from here on."""
        summary, i, c = self.summary, row["image"], row["predicted"]
        targets = _target_list(target)
        t_row = time.perf_counter()
        try:
            res = self.ready.pop((i, cert.norm, cert.method, row["target_type"]), None)
            if res is None:
                res = cert.certify(self.x[i], c, targets)
            elif isinstance(res, Exception):
                raise res
        except Exception as exc:  # noqa: BLE001 - recorded, the batch goes on
            if interrupted(exc):
                raise KeyboardInterrupt from exc
            row.update(status="error", evaluations=0,
                       time_s=round(time.perf_counter() - t_row, 6))
            summary.errors.append(
                f"image {i}, target {row['target_type']} {row['target']}, "
                f"norm {cert.norm}, method {cert.method}: {type(exc).__name__}: {exc}")
            return floor
        row.update(eps=res.eps, time_s=round(res.time_s, 6),
                   evaluations=res.evaluations, status=res.status,
                   margin=res.margin, lower_bound=res.lower_bound)
        if ttype == "untargeted":
            floor = row
        elif floor is not None and cert.method != "exact":
            _raise_to_floor(row, floor)
        if getattr(cert, "proof_writer", None) is not None:
            self._proof(row, cert, ttype, targets, res, c)
        attacks = self.attacks
        if attacks is not None and attacks.by_norm and cert.norm in attacks.by_norm:
            _add_attack(row, attacks.by_norm[cert.norm], self.attack_cache, attacks.seed,
                        self.x[i], i, c, ttype, targets, attacks.warn)
        _count_eps(summary, cert, row)
        summary.times.append(res.time_s)
        summary.evaluations.append(res.evaluations)
        return floor


    def _proof(self, row, cert, ttype, targets, res, c) -> None:
        """The certificate of a certified row (``--proof``)."""
        if ttype == "untargeted":
            self.floor_src = (res, list(targets))
        if row.get("status") not in CERTIFIED_STATUSES or not row.get("eps"):
            return
        if row["eps"] == res.eps:
            src = (res, list(targets))
        elif self.floor_src is not None and row["eps"] == self.floor_src[0].eps:
            src = self.floor_src  # raised to the untargeted radius: that certificate's case
        else:
            cert.proof_writer.warn(f"crown: warning: image {row['image']} {ttype}: no "
                                   "certificate (its radius is the untargeted row's of a "
                                   "resumed file)")
            return
        cert.proof_writer.write(row, cert.method, self.x[row["image"]], c, src[1], src[0],
                                list(targets))


# statuses whose eps is a certified radius (the untargeted floor of _raise_to_floor)
CERTIFIED_STATUSES = ("certified", "capped")


def _raise_to_floor(row: Dict[str, object], floor: Dict[str, object]) -> None:
    """A targeted row's radius at least the untargeted row's (same image, norm, method): the
    untargeted certificate holds for every target, so a targeted search that stopped below it
    (alpha-CROWN's optimisation differs per objective and radius) takes its radius, its
    status and its margin lower bound (the minimum over all targets, so also a lower bound
    of this target's margin there)."""
    eps = floor.get("eps")
    if floor.get("status") not in CERTIFIED_STATUSES or eps is None or row.get("eps") is None:
        return
    if row.get("status") in CERTIFIED_STATUSES + ("not-certified",) and eps > row["eps"]:
        row.update(eps=eps, status=floor["status"], lower_bound=floor.get("lower_bound"))


def _parsed(row: Dict[str, object]) -> Dict[str, object]:
    """A row read back from a result file (text values) with eps and lower_bound as floats
    (None when empty)."""
    out = dict(row)
    for key in ("eps", "lower_bound"):
        v = out.get(key)
        out[key] = None if v is None or v == "" else float(v)
    return out


def _count_eps(summary: Summary, cert, row: Dict[str, object]) -> None:
    """Add a row's radius (or exact distortion) to the summary's means."""
    eps = row.get("eps")
    if eps is None:  # misclassified, error, timed out
        return
    if cert.method == "exact":
        summary.exact_eps.append(eps)
        summary.exact_by.setdefault(cert.norm, []).append(eps)
    else:
        summary.certified_eps.append(eps)
        summary.eps_by.setdefault((cert.norm, cert.method), []).append(eps)


def _add_attack(row, attack, cache, seed, x0, i, c, ttype, targets, warn) -> None:
    """Fill attack_eps / attack_time_s of a certified row; warn if eps exceeds attack_eps."""
    key = (i, attack.norm, ttype)
    if key not in cache:
        if cache and next(iter(cache))[0] != i:
            cache.clear()  # earlier images are not needed again
        # one stream per (image, norm, target type): results do not depend on --start or order
        rng = np.random.default_rng([seed, i, ("inf", "2", "1").index(attack.norm),
                                     TARGET_TYPES.index(ttype)])
        cache[key] = attack.min_distortion(x0, c, targets, rng)
    res = cache[key]
    row.update(attack_eps=res.eps, attack_time_s=round(res.time_s, 6))
    eps = row.get("eps")
    if res.eps is not None and eps is not None and eps > res.eps and warn is not None:
        warn(f"crown: warning: image {i}: certified eps {eps!r} exceeds attack distortion "
             f"{res.eps!r}")


def _progress(total: int, enabled: bool):
    from crown_cli.io.progress import terminal_bar

    return terminal_bar(enabled, total=total, unit="img", desc="certify")


# --kernels auto: the numpy kernels while their estimated extra time stays below what loading
# numba costs. Measured on the shipped ReLU networks (2 cores, idle; docs/benchmarks.md):
# numba's one-off cost ~1.05 s; the numpy kernels' extra time per certification (image x
# target type x norm x method) 68-112 ms for mnist_3x1024 (l_inf..l_1), 229-272 ms for
# mnist_4x1024, 1-3.4 ms for the 20-neuron networks: about 0.085-0.11 s per 10**6 of
# substitution_size, plus ~3 ms (NUMPY_BASE in the same unit) of per-call overhead.
# NUMPY_BUDGET is ~2/3 of the break-even point at the slower rate (under load the ratio of the
# two was ~1.5x less favourable: about break-even there).
NUMPY_BASE = 30_000
NUMPY_BUDGET = 6_000_000


def substitution_size(shapes) -> int:
    """Rows x columns the relaxation kernels sweep in one bound evaluation of an MLP whose
    weight matrices have ``shapes`` (outputs, inputs): every hidden layer k >= 1 is
    back-substituted through the hidden layers below it (the margin's few rows are ignored)."""
    hidden = [s[0] for s in shapes[:-1]]
    return sum(n * sum(hidden[:k]) for k, n in enumerate(hidden) if k >= 1)


def choose_kernels(requested: str, activation: str, shapes, runs: int) -> str:
    """The kernels of a certify run: ``requested``, or for 'auto' numpy when the activation
    has a numpy relaxation and ``runs`` certifications fit NUMPY_BUDGET, else numba.
    InputError for numpy kernels on an activation whose relaxation needs numba."""
    from crown_cli.activations import supporting

    NUMPY_TWINS = supporting("numpy_twin")

    if requested == "numpy" and activation not in NUMPY_TWINS:
        raise InputError(f"--kernels numpy: the {activation} relaxation needs numba (numpy "
                         f"has {', '.join(NUMPY_TWINS)}); use --kernels numba or auto")
    if requested != "auto":
        return requested
    cheap = runs * (substitution_size(shapes) + NUMPY_BASE) <= NUMPY_BUDGET
    return "numpy" if activation in NUMPY_TWINS and cheap else "numba"


def certifier_for(mlp, graph, norm, method: str, alpha_iters=None, alpha_lr=None, **settings):
    """``crown certify``'s certifier of one norm and method (and the API's) on a loaded
    network's engine form (:func:`crown_cli.io.networks.engine_form`): a
    :class:`~crown_cli.certification.graph_certifier.GraphCertifier` on the graph engine,
    else a :class:`Certifier` on the MLP's margin layers (an order-preserving output
    activation skipped: the logits' margins decide the class; another one, such as a ReLU on
    the logits, a hidden layer the engine bounds). ``settings``: the other fields of
    :class:`~crown_cli.certification.certifier.CertifySettings`; ``alpha_iters`` None: each
    engine's own default (``alpha_lr`` None: the activation's)."""
    if graph is not None:
        from crown_cli.certification.graph_certifier import GraphCertifier

        return GraphCertifier(graph, norm=norm, method=method, alpha_iters=alpha_iters,
                              alpha_lr=alpha_lr, **settings)
    from crown_cli.certification.certifier import ALPHA_ITERS

    weights, biases = mlp.margin_layers()
    alpha = {} if method != "alpha-crown" else {
        "alpha_iters": ALPHA_ITERS if alpha_iters is None else alpha_iters, "alpha_lr": alpha_lr}
    return Certifier(weights, biases, mlp.activation, norm=norm, method=method, alpha=mlp.alpha,
                     **alpha, **settings)


def attack_for(mlp, graph, norm, steps=None, restarts=None, eps_max: float = 1e4):
    """``--attack pgd``'s minimum-distortion attack in one norm on the same form as
    :func:`certifier_for` (steps and restarts None: the attack's defaults)."""
    if graph is not None:
        from crown_cli.certification.graph_certifier import GraphPGDAttack

        return GraphPGDAttack(graph, norm, steps, restarts, eps_max)
    from crown_cli.certification.attack import DEFAULT_RESTARTS, DEFAULT_STEPS, PGDAttack

    weights, biases = mlp.margin_layers()
    return PGDAttack(weights, biases, mlp.activation, norm=norm, alpha=mlp.alpha,
                     steps=steps or DEFAULT_STEPS, restarts=restarts or DEFAULT_RESTARTS,
                     eps_max=eps_max)
