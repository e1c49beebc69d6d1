"""The public Python API of crown-cli: load a network, certify one image, verify a property.

The names here (re-exported from :mod:`crown_cli`) are the stable part of the package:
:func:`load_model`, :func:`load_images`, :func:`certify`, :func:`verify`, :class:`Certification`
and :class:`crown_cli.InputError`; docs/api.md describes them with an example. Everything
else in ``crown_cli`` (the certifier, the engine, the verification pipeline) may change.

:func:`certify` builds the same :class:`~crown_cli.certification.certifier.Certifier` with the
same options and the same kernels as ``crown certify`` and chooses targets with the same code,
so it returns exactly the radius ``crown certify`` writes for that image and those options.
:func:`verify` builds the same :class:`~crown_cli.verification.pipeline.Verifier` as
``crown verify --model --spec`` with the same defaults (the timeout excepted: 60 s here).

Importing this module is cheap: numpy, the engine and numba are imported inside the functions.
"""
from __future__ import annotations

import math
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Optional, Union

from crown_cli.errors import InputError

__all__ = ["Certification", "InputError", "certify", "load_images", "load_model", "verify"]

# `crown certify` defaults (crown_cli/cli.py)
CERTIFY_TIMEOUT = 600.0
DEFAULT_SEED = 1215  # crown_cli.certification.targets.DEFAULT_SEED, kept here for the signature
VERIFY_TIMEOUT = 60.0
VERIFY_METHODS = "crown,alpha-crown,hull"  # `crown verify --stages` default


@dataclass(frozen=True)
class Certification:
    """The result of :func:`certify` for one image: one row of ``crown certify``'s CSV.

    Attributes:
        eps: certified radius, in the units of the network's inputs (for the shipped MNIST
            images: of ``pixel/255 - 0.5``, so an l_inf radius of 0.01 is 2.55 grey levels).
            The margin ``f_c(x') - f_t(x')`` is proven > 0 (in float64) for every x' with
            ``||x' - x||_norm <= eps``. 0.0 when nothing is certified; None when the image is
            misclassified (status ``misclassified``) or the method ran out of time
            (``timeout``). For ``method="exact"`` the exact minimum distortion instead.
        status: ``certified``; ``capped`` (certified at ``max_eps``, the largest radius
            searched); ``not-certified`` (no radius > 0); ``misclassified`` (``label`` given
            and the network predicts another class: nothing certified); ``timeout``
            (exact and lp-full, and a graph network's search, after ``timeout`` seconds);
            ``optimal`` (exact).
        label: the true class passed in, or None.
        predicted: the class the network predicts for x (argmax of its logits); the class
            whose decision is certified.
        target: the target class (eps certifies ``predicted`` against it), or None for
            ``target_type == "untargeted"`` (against every other class at once).
        target_type: ``runner-up``, ``least``, ``random``, ``untargeted``, or ``class`` for a
            target given as a class index.
        norm: ``inf``, ``2`` or ``1``: the l_p ball.
        method: the bound used (``crown``, ``fast-lin``, ``alpha-crown``, ...).
        lower_bound: lower bound of the margin over the ball of radius eps (None if the
            method has none, or misclassified).
        margin: ``f_c(x) - f_t(x)`` at x itself (the minimum over the targets), logits'
            units; None if misclassified.
        evaluations: bound evaluations the radius search spent (0 if misclassified).
        time_s: seconds the certification took (the first call in a process also loads the
            numba kernels, ~1 s, unless the numpy kernels are used).
        kernels: ``numpy`` or ``numba``: the bound kernels used (see ``kernels`` of
            :func:`certify`; the two agree to ~rtol, not bit for bit).
    """

    eps: Optional[float]
    status: str
    label: Optional[int]
    predicted: int
    target: Optional[int]
    target_type: str
    norm: str
    method: str
    lower_bound: Optional[float]
    margin: Optional[float]
    evaluations: int
    time_s: float
    kernels: str


# ------------------------------------------------------------------------------ errors

_OPTION = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def _python_names(message: str) -> str:
    """A CLI message with its options written as this API's parameters:
    '--max-eps: must be > 0' -> 'max_eps: must be > 0'."""
    return _OPTION.sub(lambda m: m.group(1).replace("-", "_"), message)


@contextmanager
def _options():
    """Re-raise the InputError of an option check with Python parameter names."""
    try:
        yield
    except InputError as exc:
        raise InputError(_python_names(str(exc))) from None


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InputError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _integer(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise InputError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


# ------------------------------------------------------------------------------ loading

def load_model(path: Union[str, os.PathLike], activation: Optional[str] = None, *,
               memory_budget: Optional[float] = None):
    """Load a network from any model file ``crown`` reads.

    Args:
        path: NPZ (``W0``, ``b0``, ...), plain HDF5, a Keras ``model.save()`` HDF5 file
            (``.h5``), a Keras 3 ``.keras`` archive, or ONNX (``.onnx``, needs the onnx
            extra).
        activation: overrides the activation read from the file (``relu``, ``tanh``,
            ``sigmoid``, ``arctan``, ``leaky_relu``, ...), like ``--activation`` (chains of
            dense layers only).
        memory_budget: GiB, like ``--memory-budget`` (graph networks; default 4).

    Returns:
        The network, as ``crown`` loads it: a :class:`crown_cli.graph.network.Graph`
        (``input_size``, ``output_size``, ``num_classes``, ``summary()``; for a chain of
        dense layers with one activation also ``activation`` and ``weights``/``biases``
        (float64, W of shape (outputs, inputs)), its form on the dense engine). It has
        ``forward(x)`` for x of shape (N, input_size) or (input_size,), in the model's own
        input layout, giving its outputs before a final softmax. Pass it to
        :func:`certify` / :func:`verify`.

    Raises:
        InputError: the file is missing, unreadable or not a supported network, with the
            one-line message ``crown`` prints (an option named as the Python parameter:
            ``activation:`` for ``--activation:``).
    """
    from crown_cli.io.networks import load_network

    if memory_budget is not None and not _number(memory_budget, "memory_budget") > 0:
        raise InputError(f"memory_budget: must be > 0 (GiB), got {memory_budget}")
    try:
        return load_network(os.fspath(path), activation, memory_budget=memory_budget)
    except InputError as exc:
        msg = str(exc)
        if msg.startswith("--activation") or "(--memory-budget)" in msg \
                or "--activation applies" in msg:
            raise InputError(_python_names(msg)) from None
        raise
    except TypeError:
        raise InputError(f"model: expected a file path, got {type(path).__name__}") from None


def load_images(path: Optional[Union[str, os.PathLike]] = None,
                labels: Optional[Union[str, os.PathLike]] = None):
    """Test images and labels as ``crown certify --images`` reads them.

    Args:
        path: NPZ (``x``, ``y``), MNIST IDX (gzipped or raw) or CIFAR CSV; None: the first
            100 MNIST test images shipped with crown.
        labels: the labels IDX file of IDX images (default: the one beside them).

    Returns:
        ``(x, y)``: x of shape (N, d) float64 in the paper's scaling ``pixel/255 - 0.5``
        (values in [-0.5, 0.5]; NPZ files are taken as already scaled unless their x is
        uint8), y of shape (N,) int64, the labels.

    Raises:
        InputError: the one-line message ``crown`` prints for a bad image file.
    """
    from crown_cli.io.images import load_images as _load

    with _options():  # (--labels: labels)
        return _load(None if path is None else os.fspath(path),
                     None if labels is None else os.fspath(labels))


def _as_model(model):
    """A loaded network (MLP or Graph), or a path to load."""
    from crown_cli.graph.network import Graph
    from crown_cli.network import MLP

    if isinstance(model, (MLP, Graph)):
        return model
    if isinstance(model, (str, os.PathLike)):
        return load_model(model)
    raise InputError(f"model: expected a network from crown_cli.load_model or a model file "
                     f"path, got {type(model).__name__}")


# ------------------------------------------------------------------------------ certify

def certify(model, x, label: Optional[int] = None, target: Union[str, int] = "runner-up",
            norm: Union[str, int, float] = "inf", method: str = "crown", *,
            search: str = "interp", precision: str = "mixed", rtol: float = 1e-4,
            eps0: Optional[float] = None, max_eps: float = 1e4,
            timeout: float = CERTIFY_TIMEOUT, alpha_iters: Optional[int] = None,
            alpha_lr: Optional[float] = None, seed: int = DEFAULT_SEED,
            kernels: str = "auto") -> Certification:
    """Certified robustness radius of one input: ``crown certify`` for a single image.

    Args:
        model: a network from :func:`load_model`, or a model file path (loaded each call).
        x: one input: shape (d,) or any shape with d = ``model.input_size`` elements,
            flattened in C (row-major) order, e.g. a (28, 28) MNIST image. Values in the
            network's own input scaling: the shipped MNIST models take ``pixel/255 - 0.5``
            (in [-0.5, 0.5]), which is what :func:`load_images` returns.
        label: the true class, or None. None: the predicted class is certified. Given and
            not the predicted class: nothing is certified, status ``misclassified``.
        target: the class(es) the prediction is certified against: ``"runner-up"`` (the
            second largest logit), ``"least"`` (the smallest), ``"random"``, ``"untargeted"``
            (every class but the predicted one), or a class index.
            ``"random"`` draws with Python's ``random.Random(seed)`` exactly as
            ``crown certify`` does for the first image of a file; the CLI advances one
            stream over the images in file order, so for its image i > 0 pass the target
            class from its CSV instead.
        norm: the l_p ball: ``"inf"``, ``"2"`` or ``"1"`` (``2``, ``1``, ``"l2"``,
            ``"linf"``... accepted).
        method: ``crown``, ``crown-paper``, ``fast-lin``, ``crown-quad``, ``alpha-crown``,
            ``fast-lip``,
            ``op-norm``, ``lp-full`` or ``exact``, as ``crown certify --method``.

    Keyword-only options, as ``crown certify``'s (same defaults):
        search: ``interp`` or ``bisect`` (radius search).
        precision: ``mixed`` (float32 steers the search, the radius is verified in float64)
            or ``float64``.
        rtol: relative width of the search's final bracket, in (0, 1).
        eps0: first radius tried (None: derived from the image).
        max_eps: largest radius searched (status ``capped`` there).
        timeout: seconds for ``exact`` and ``lp-full`` (status ``timeout``, eps None) and
            for the radius search on a graph network (status ``timeout``, eps the largest
            radius a float64 bound proved before it).
        alpha_iters, alpha_lr: alpha-crown's optimiser steps and step size (None: its
            defaults); only with ``method="alpha-crown"``.
        seed: seed of the ``"random"`` target (``--target-seed``).
        kernels: ``auto``, ``numba`` or ``numpy``: the bound kernels. ``auto`` chooses as
            ``crown certify --kernels auto`` does for a job of one certification (numpy for
            small ReLU-type networks). The two kernels agree to about rtol, not bit for bit:
            to reproduce a CLI run exactly, use the kernels it used (its ``auto`` counts
            every image, target and norm of the job; give both the same explicit value).
            The choice is process-wide while the call runs (not thread-safe).

    Returns:
        A :class:`Certification` (eps, status, classes, margin, ...).

    Raises:
        InputError: bad x (size, NaN), label or target out of range, unknown norm, method,
            target or option value, a method the network does not support, or a model file
            that cannot be read. The message is one line naming the parameter.
    """
    from crown_cli.io.networks import engine_form

    net = _as_model(model)
    o = _checked(_CertifyOptions(norm, method, search, precision, rtol, eps0, max_eps, timeout,
                                 alpha_iters, alpha_lr, seed, kernels))
    mlp, graph, image_layout = engine_form(net)
    n = mlp.num_classes if graph is None else graph.output_size
    if n < 2:
        raise InputError(f"model: the output has {n} value, need >= 2 classes")
    from crown_cli.api_specs import as_input

    x0 = as_input(x, net.input_size)
    if label is not None:
        if isinstance(label, bool) or not isinstance(label, Integral):
            raise InputError(f"label: must be an integer class index, got {label!r}")
        if not 0 <= label < n:
            raise InputError(f"label: {label!r} is not a class of the model (0..{n - 1})")
        label = int(label)
    target_type, target_class = _target(target, n)
    from contextlib import nullcontext

    from crown_cli.engine.kernels import using_kernels

    cert, x0, backend = _certifier(mlp, graph, image_layout, x0, o)
    with nullcontext() if graph is not None else using_kernels(backend):
        return _certify_one(cert, x0, label, target_type, target_class, o, backend)


@dataclass(frozen=True)
class _CertifyOptions:
    """:func:`certify`'s options (its arguments of the same names; ``max_eps`` is the
    certifiers' ``eps_max``)."""

    norm: Union[str, int, float]
    method: str
    search: str
    precision: str
    rtol: float
    eps0: Optional[float]
    max_eps: float
    timeout: float
    alpha_iters: Optional[int]
    alpha_lr: Optional[float]
    seed: int
    kernels: str


def _checked(o: _CertifyOptions) -> _CertifyOptions:
    """The options checked as `crown certify` checks them, in its order; the norm and method
    normalised, ``alpha_iters`` an int."""
    from crown_cli.certification.certifier import PRECISIONS, method_names, parse_norm
    from crown_cli.engine.radius_search import SEARCHES
    from crown_cli.engine.kernels import KERNELS

    with _options():
        norm = parse_norm(o.norm)
    methods = method_names()
    method, alpha_iters, alpha_lr = o.method, o.alpha_iters, o.alpha_lr
    if not isinstance(method, str) or method.strip().lower() not in methods:
        raise InputError(f"method: unknown method {method!r} (choose from {', '.join(methods)})")
    method = method.strip().lower()
    if method != "alpha-crown" and (alpha_iters is not None or alpha_lr is not None):
        raise InputError("alpha_iters/alpha_lr: need method alpha-crown")
    if alpha_iters is not None:
        alpha_iters = _integer(alpha_iters, "alpha_iters", 0)
    if alpha_lr is not None and not (math.isfinite(_number(alpha_lr, "alpha_lr")) and alpha_lr > 0):
        raise InputError(f"alpha_lr: must be > 0, got {alpha_lr}")
    if not _number(o.timeout, "timeout") > 0:
        raise InputError(f"timeout: must be > 0, got {o.timeout}")
    if not (0 < _number(o.rtol, "rtol") < 1):
        raise InputError(f"rtol: must lie in (0, 1), got {o.rtol}")
    if o.eps0 is not None and not _number(o.eps0, "eps0") > 0:
        raise InputError(f"eps0: must be > 0, got {o.eps0}")
    if not _number(o.max_eps, "max_eps") > 0:
        raise InputError(f"max_eps: must be > 0, got {o.max_eps}")
    if o.eps0 is not None and o.eps0 > o.max_eps:
        raise InputError(f"eps0: must be at most max_eps ({o.max_eps:g}), got {o.eps0}")
    if o.search not in SEARCHES:
        raise InputError(f"search: unknown search {o.search!r} (choose from "
                         f"{', '.join(SEARCHES)})")
    if o.precision not in PRECISIONS:
        raise InputError(f"precision: unknown precision {o.precision!r} (choose from "
                         f"{', '.join(PRECISIONS)})")
    if o.kernels not in ("auto",) + KERNELS:
        raise InputError(f"kernels: unknown kernels {o.kernels!r} (choose from auto, "
                         f"{', '.join(KERNELS)})")
    if isinstance(o.seed, bool) or not isinstance(o.seed, Integral):
        raise InputError(f"seed: must be an integer, got {o.seed!r}")
    return replace(o, norm=norm, method=method, alpha_iters=alpha_iters)


def _target(target, n: int):
    """(target_type, target class or None) of ``target`` on a network of ``n`` classes."""
    from crown_cli.certification.targets import (TARGET_TYPES, check_random_possible,
                                                 parse_target_types)

    if isinstance(target, str):
        with _options():
            types = parse_target_types(target)
            if len(types) != 1:
                raise InputError(f"--target: one target per call, got '{target}'")
            target_type = types[0]
            check_random_possible(n, types)
        return target_type, None
    if isinstance(target, Integral) and not isinstance(target, bool):
        if not 0 <= target < n:
            raise InputError(f"target: {target} is not a class of the model (0..{n - 1})")
        return "class", int(target)
    raise InputError(f"target: expected one of {', '.join(TARGET_TYPES)} or a class "
                     f"index, got {target!r}")


def _certifier(mlp, graph, image_layout, x0, o: _CertifyOptions):
    """`crown certify`'s certifier (``certification.runner.certifier_for``), the image in the
    network's input layout (a graph's, or a lowered graph's: crown's (H, W, C) images go to
    the model's own order) and the kernels chosen (the dense engine's for one run)."""
    from contextlib import nullcontext

    from crown_cli.certification.graph_certifier import to_graph_layout
    from crown_cli.certification.runner import certifier_for, choose_kernels
    from crown_cli.engine.kernels import graph_kernels, using_kernels

    layout = graph if graph is not None else image_layout
    if layout is not None:
        x0 = to_graph_layout(layout, x0[None, :])[0]
    with _options():
        backend = ("numpy" if graph_kernels() is None else "numba") if graph is not None else \
            choose_kernels(o.kernels, mlp.activation, [w.shape for w in mlp.margin_layers()[0]],
                           1)
    # the graph engine reads graph_kernels() itself: only the dense engine's switch is set
    with (nullcontext() if graph is not None else using_kernels(backend)), _options():
        cert = certifier_for(mlp, graph, o.norm, o.method, o.alpha_iters, o.alpha_lr,
                             search=o.search, rtol=float(o.rtol), eps0=o.eps0,
                             eps_max=float(o.max_eps), precision=o.precision,
                             timeout=float(o.timeout))
    return cert, x0, backend


def _certify_one(cert, x0, label, target_type: str, target_class, o: _CertifyOptions,
                 backend: str) -> Certification:
    """The targets chosen as `crown certify` chooses them (runner.certify_images), then the
    certificate."""
    from crown_cli.certification.targets import TargetSelector

    sel = TargetSelector(int(o.seed)).select(cert.logits(x0[None, :])[0])
    c = int(sel["predicted"])
    if target_type == "class":
        if target_class == c:
            raise InputError(f"target: {target_class} is the predicted class; choose "
                             "another class")
        chosen = target_class
    else:
        chosen = sel[target_type]
    record = dict(label=label, predicted=c,
                  target=None if target_type == "untargeted" else int(chosen),
                  target_type=target_type, norm=cert.norm, method=o.method, kernels=backend)
    if label is not None and c != label:
        return Certification(eps=None, status="misclassified", lower_bound=None,
                             margin=None, evaluations=0, time_s=0.0, **record)
    targets = list(chosen) if isinstance(chosen, list) else [int(chosen)]
    res = cert.certify(x0, c, targets)
    return Certification(eps=None if res.eps is None else float(res.eps), status=res.status,
                         lower_bound=None if res.lower_bound is None else float(res.lower_bound),
                         margin=float(res.margin), evaluations=int(res.evaluations),
                         time_s=float(res.time_s), **record)


# ------------------------------------------------------------------------------ verify

def verify(model, spec, timeout: float = VERIFY_TIMEOUT, *,
           method: Union[str, tuple, list] = VERIFY_METHODS, attack_restarts: int = 64,
           attack_steps: int = 100, attack_time: Optional[float] = None, bab: bool = True,
           max_domains: int = 200_000, seed: int = 0, workers: Optional[int] = None,
           log=None):
    """Decide a property of a network: ``crown verify --model --spec`` in Python.

    The property asks: is there an input x in the box [lo, hi] whose outputs y = f(x)
    satisfy ``A y <= b`` (every row)? Such an x violates the property.

    Args:
        model: a network from :func:`load_model`, or a model file path.
        spec: one of
            - a VNN-LIB file path (``str`` or ``os.PathLike``);
            - a tuple ``(lo, hi, A, b)``: lo, hi of shape (n_inputs,) (or any shape with
              n_inputs elements), the input box in the network's own input units (no image
              scaling); A of shape (m, n_outputs) (or (n_outputs,) for one row), b of shape
              (m,) (or a number for one row), in the units of the network's outputs (the
              logits for a classifier);
            - a ``list`` of such tuples: several cases, violated when any case is;
            - a parsed ``crown_cli.io.vnnlib.Property``.
        timeout: seconds for the whole decision (loading a model path included).

    Keyword-only options, as ``crown verify``'s (same defaults):
        method: the bound stages after the attack, ``"crown,alpha-crown,hull"`` (a
            comma-separated string or a sequence; ``hull`` runs on ReLU networks of one
            hidden layer only).
        attack_restarts, attack_steps: PGD starting points per case, steps per run.
        attack_time: seconds for each attack stage (None: 10% of the timeout, >= 0.5).
        bab: branch and bound after the bound stages (ReLU and leaky ReLU networks).
        max_domains: cap on the open domains of the branch and bound.
        seed: seed of the attack's random starts.
        workers: branch and bound's processes, 1 or 2 (None: 2 on networks of one hidden
            layer of at most 128 neurons and on other graphs when the machine has two cores,
            else 1; ``--workers``).
        log: None, or a function receiving a text line per stage (``crown verify -v``).

    Returns:
        The verdict (today :class:`crown_cli.verification.pipeline.Verdict`) with fields
        ``result`` (``sat``: a violation found; ``unsat``: proven to hold; ``unknown``;
        ``timeout``), ``x`` (n_inputs,) and ``y`` (n_outputs,) the counterexample and its
        float64 outputs (sat only, else None), ``case`` (index of the violated case),
        ``stage``, ``margin``, ``cases``, ``cases_proven``, ``domains``, ``peak_domains``,
        ``time_s``. ``sat`` only with an x in the box whose float64 forward pass satisfies
        ``A y <= b`` (for a VNN-LIB file: x among the floats inside the real box of its
        decimals, b rounded down: :meth:`crown_cli.io.vnnlib.Case.exact`); ``unsat`` only
        when a float64-verified bound proves every case empty.

    Raises:
        InputError: a bad model or spec file, spec shapes that do not match the network,
            lo > hi, NaN values, or a bad option value; one line naming it.
    """
    from crown_cli.api_specs import _property, _stages
    from crown_cli.verification.pipeline import BOUND_STAGES

    t0 = time.perf_counter()
    if not _number(timeout, "timeout") > 0:
        raise InputError(f"timeout: must be > 0, got {timeout}")
    stages = _stages(method, BOUND_STAGES)
    if attack_time is not None and not _number(attack_time, "attack_time") >= 0:
        raise InputError(f"attack_time: must be >= 0, got {attack_time}")
    options = dict(stages=stages, attack_restarts=_integer(attack_restarts, "attack_restarts", 1),
                   attack_steps=_integer(attack_steps, "attack_steps", 1),
                   seed=_integer(seed, "seed", 0), attack_time=attack_time, bab=bool(bab),
                   max_domains=_integer(max_domains, "max_domains", 1))
    if workers is not None:
        options["workers"] = _integer(workers, "workers", 1)
        if options["workers"] > 2:
            raise InputError(f"workers: must be 1 or 2, got {workers}")
    if log is not None and not callable(log):
        raise InputError("log: expected a function of one string, or None")
    # as verification.runner.Loader.verifier builds it for `crown verify`
    from crown_cli.verification.graph_verifier import graph_verifier

    verifier = graph_verifier(_as_model(model), **options)
    from crown_cli.verification.runner import warm_up

    t0 += warm_up(verifier)  # kernels loaded (compiled on a cold cache) off the clock
    prop = _property(spec, verifier.n_inputs, verifier.n_outputs)
    return verifier.verify(prop, max(0.0, float(timeout) - (time.perf_counter() - t0)), log=log)
