"""The kernels the engine calls: a process-wide switch between the numba kernels
(:mod:`crown_cli.engine.kernels.dense_steps`, compiled, cached on disk) and their numpy twins
(:mod:`crown_cli.engine.kernels.dense_steps_numpy`, no start-up cost). The float32 steps of ReLU
splitting have numba kernels of their own (:mod:`crown_cli.engine.kernels.relu_split`) whose
twin is the numpy code in :mod:`crown_cli.verification.bab.bounder`.
"""
import os
from contextlib import contextmanager
from importlib import import_module

from crown_cli.runtime import tune_allocator

# glibc's allocator tuned for the bound loops' arrays (crown_cli/runtime.py); OpenMP's and
# OpenBLAS's thread waits were shortened when crown_cli was imported.
MALLOC_TUNED = tune_allocator()

KERNELS = ("numba", "numpy")
_BACKEND = "numba"
_KERNELS = None
_SERIAL = False  # the graph kernels' serial twins (use_serial_kernels)


def set_kernels(backend: str) -> None:
    """Choose the kernels the engine calls: "numba" (compiled, the default; importing numba
    and loading its cache costs ~1 s once per process) or "numpy" (vectorised, no start-up
    cost, slower per evaluation). Process-wide; takes effect at the next kernel call. The
    relaxation registry reads it when a relaxation is looked up (a Certifier is built): the
    ReLU-type ones then come from plain numpy too (the activations with ``numpy_twin``)."""
    global _BACKEND, _KERNELS
    if backend not in KERNELS:
        raise ValueError(f"unknown kernels '{backend}' (choose from {', '.join(KERNELS)})")
    if backend != _BACKEND:
        _BACKEND, _KERNELS = backend, None


@contextmanager
def using_kernels(backend: str):
    """:func:`set_kernels` for the duration of a ``with`` block, then the previous backend."""
    previous = _BACKEND
    set_kernels(backend)
    try:
        yield
    finally:
        set_kernels(previous)


def kernels_backend() -> str:
    """The backend :func:`kernels` returns: "numba" or "numpy"."""
    return _BACKEND


def kernels():
    """The module holding the kernels of the chosen backend (imported on first use: the
    numba one imports numba)."""
    global _KERNELS
    if _KERNELS is None:
        if _BACKEND == "numpy":
            from crown_cli.engine.kernels import dense_steps_numpy as module
        else:
            from crown_cli.engine.kernels import dense_steps as module

        _KERNELS = module
    return _KERNELS


def use_serial_kernels() -> None:
    """From now on this process runs the graph kernels' serial twins (the same code compiled
    without numba's threads: ``graph_steps.SERIAL``). Every forked child calls it (crown's
    helpers, a user's process pool): whatever threading layer numba chose (GNU OpenMP here,
    whose threads a forked child cannot use once the parent started them: the child ends at
    its first parallel kernel; the workqueue layer costs 60-130 us a parallel call, 1-2 us
    on OpenMP), a child that starts no parallel kernel is safe."""
    global _SERIAL
    _SERIAL = True


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=use_serial_kernels)


@contextmanager
def serial_kernels():
    """:func:`use_serial_kernels` for the duration of a ``with`` block (a warm-up loading the
    twins before a helper is forked, which then inherits them compiled)."""
    global _SERIAL
    previous, _SERIAL = _SERIAL, True
    try:
        yield
    finally:
        _SERIAL = previous


def _numba_module(name: str):
    """The numba kernel module ``name`` of this package, or None under the numpy kernels
    (the caller's numpy twin then runs)."""
    if _BACKEND == "numpy":
        return None
    return import_module(f"{__name__}.{name}")


def relu_split_kernels():
    """The numba kernels of ReLU splitting's float32 steps (:mod:`.relu_split`), or None."""
    return _numba_module("relu_split")


def box_step_kernels():
    """The numba kernel of the box engine's slope scaling (:mod:`.box_steps`), or None."""
    return _numba_module("box_steps")


def hull_kernels():
    """The numba kernel of the convex-hull bound's optimiser (:mod:`.hull`), or None."""
    return _numba_module("hull")


def graph_kernels():
    """The numba kernels of the graph back-substitution's steps (:mod:`.graph_steps`; their
    serial twins ``graph_steps.SERIAL`` after :func:`use_serial_kernels`), or None."""
    module = _numba_module("graph_steps")
    return module.SERIAL if module is not None and _SERIAL else module
