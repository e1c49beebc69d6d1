"""The kernels the engine calls: a process-wide switch between the numba kernels
(:mod:`crown_cli.engine.kernels.backsub`, compiled, cached on disk) and their numpy twins
(:mod:`crown_cli.engine.kernels.backsub_numpy`, no start-up cost). The float32 steps of ReLU
splitting have numba kernels of their own (:mod:`crown_cli.engine.kernels.relu_split`) whose
twin is the numpy code in :mod:`crown_cli.verification.bab.bounder`.
"""
import os
from contextlib import contextmanager
from importlib import import_module

KERNELS = ("numba", "numpy")
_BACKEND = "numba"
_KERNELS = None


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
            from crown_cli.engine.kernels import backsub_numpy as module
        else:
            from crown_cli.engine.kernels import backsub as module

        _KERNELS = module
    return _KERNELS


def choose_threading_layer(numba) -> None:
    """numba's threading layer for crown's parallel kernels, set before numba first starts
    its threads (a kernel's first parallel run, or ``numba.set_num_threads`` /
    ``get_num_threads``; later it no longer changes): "workqueue". numba's default here is
    GNU OpenMP, whose threads a forked child cannot use once the parent has started them
    (branch and bound's helper processes are forked: the child then ends at its first
    kernel); the workqueue layer can. A user's own choice (NUMBA_THREADING_LAYER) stands."""
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"


def _numba_module(name: str):
    """The numba kernel module ``name`` of this package, or None under the numpy kernels
    (the caller's numpy twin then runs)."""
    if _BACKEND == "numpy":
        return None
    return import_module(f"{__name__}.{name}")


def relu_split_kernels():
    """The numba kernels of ReLU splitting's float32 steps (:mod:`.relu_split`), or None."""
    return _numba_module("relu_split")


def batched_kernels():
    """The numba kernel of the batched engine's slope scaling (:mod:`.batched`), or None."""
    return _numba_module("batched")


def hull_kernels():
    """The numba kernel of the convex-hull bound's optimiser (:mod:`.hull`), or None."""
    return _numba_module("hull")


def graph_kernels():
    """The numba kernels of the graph back-substitution's steps (:mod:`.graph_steps`), or None."""
    return _numba_module("graph_steps")
