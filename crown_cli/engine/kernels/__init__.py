"""The kernels the engine calls: a process-wide switch between the numba kernels
(:mod:`crown_cli.engine.kernels.dense_steps`, compiled, cached on disk) and their numpy twins
(:mod:`crown_cli.engine.kernels.dense_steps_numpy`, no start-up cost). The float32 steps of ReLU
splitting have numba kernels of their own (:mod:`crown_cli.engine.kernels.relu_split`) whose
twin is the numpy code in :mod:`crown_cli.verification.bab.bounder`.
"""
import os
from contextlib import contextmanager
from importlib import import_module

# GNU OpenMP (numba's threading layer here) keeps its threads spinning after a parallel kernel,
# by default ~300,000 times (about a millisecond), which on 2 cores took the cores of the BLAS
# products between kernels (the CIFAR conv case 2x slower); 1000 spins still catch the next
# kernel of a run of them (docs/benchmarks.md). Set before numba loads the layer (at its
# first parallel kernel); a user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY stands.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000"


# glibc's malloc hands freed blocks of a few MB back to the system and takes them again at the
# next step, which then faults every page of its new arrays in anew: 18,000 page faults and
# about 15% of the time of one float64 CROWN bound of the ResNet bench case (docs/benchmarks.md).
# A fixed mmap threshold of 32 MB (blocks below it from the heap) and a trim threshold of 64 MB
# (free memory the heap keeps) end that. Process-wide and Linux glibc only; a user's own
# MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or MALLOC_TOP_PAD_ stands.
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TRIM_THRESHOLD = 64 << 20


def _tune_malloc() -> bool:
    """Set glibc's thresholds (above); True where they were set."""
    import sys

    if not sys.platform.startswith("linux") or any(
            k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                      "MALLOC_TOP_PAD_")):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.gnu_get_libc_version and libc.mallopt(-3, MALLOC_MMAP_THRESHOLD)
                    and libc.mallopt(-1, MALLOC_TRIM_THRESHOLD))  # M_MMAP_, M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        return False


MALLOC_TUNED = _tune_malloc()

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
