"""The number of threads of the BLAS libraries loaded in this process, set for a block of code:
:func:`blas_threads`; with numba's too: :func:`one_thread`; one BLAS thread for a
convolutional graph's bounds where OpenBLAS spins long: :func:`quiet_blas`.

The products of a small network's branch and bound (a few hundred neurons, boxes in batches)
are too small to share between threads: on the 2-core machine of docs/benchmarks.md OpenBLAS's
second thread made them 1.3-3x slower, the more so when another process was running. numpy and
scipy (whose BLAS the numba kernels call) each load their own OpenBLAS; every loaded one is
set. Where none is found (another BLAS, or not Linux), nothing changes.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
import sys
from typing import Dict, List, Tuple

# (set, get) symbol pairs of OpenBLAS builds: plain, 64-bit integer, and scipy-openblas
_SYMBOLS = (("openblas_set_num_threads", "openblas_get_num_threads"),
            ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
            ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
            ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"))
_LOADED: Dict[str, Tuple] = {}


# the last scan of /proc/self/maps (about 1 ms): reused while no module has been imported
# since (a new OpenBLAS arrives with an import: numpy's, scipy's)
_SCAN: Dict[str, object] = {"modules": -1, "libs": []}


def _openblas() -> List[Tuple]:
    """(set, get) functions of every OpenBLAS mapped into this process (Linux's
    /proc/self/maps), loaded once per library path."""
    if len(sys.modules) == _SCAN["modules"]:
        return list(_SCAN["libs"])
    _SCAN["modules"] = len(sys.modules)
    _SCAN["libs"] = out = _scan()
    return list(out)


def _scan() -> List[Tuple]:
    try:
        with open("/proc/self/maps") as f:
            paths = set(re.findall(r"(/\S*openblas\S*\.so[\w.\-]*)", f.read()))
    except OSError:
        return []
    out = []
    for path in sorted(paths):
        if path not in _LOADED:
            _LOADED[path] = ()
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for set_name, get_name in _SYMBOLS:
                if hasattr(lib, set_name) and hasattr(lib, get_name):
                    setter, getter = getattr(lib, set_name), getattr(lib, get_name)
                    setter.argtypes, setter.restype = [ctypes.c_int], None
                    getter.argtypes, getter.restype = [], ctypes.c_int
                    _LOADED[path] = (setter, getter)
                    break
        if _LOADED[path]:
            out.append(_LOADED[path])
    return out


def get_blas_threads() -> List[int]:
    """The thread count of each loaded OpenBLAS (empty when none is found)."""
    return [int(get()) for _, get in _openblas()]


@contextlib.contextmanager
def blas_threads(n: int):
    """Run the block with every loaded OpenBLAS on ``n`` threads; restore the counts after."""
    libs = _openblas()
    saved = [int(get()) for _, get in libs]
    for setter, _ in libs:
        setter(int(n))
    try:
        yield
    finally:
        for (setter, _), k in zip(libs, saved):
            setter(k)


@contextlib.contextmanager
def one_thread():
    """Run the block on one thread: every loaded OpenBLAS, and numba's kernels where numba is
    loaded (a search shared by two processes on two cores: a second thread in each made a
    round 2x slower instead of 2x faster, docs/bab.md)."""
    numba = sys.modules.get("numba")
    saved = numba.get_num_threads() if numba is not None else None
    if numba is not None:
        numba.set_num_threads(1)
    try:
        with blas_threads(1):
            yield
    finally:
        if numba is not None:
            numba.set_num_threads(saved)


def quiet_blas(graph):
    """:func:`blas_threads` (1) for a graph with a convolution where OpenBLAS keeps its threads
    spinning about 0.1 s after each product (numpy loaded it before ``crown_cli`` could
    shorten that: :data:`crown_cli.runtime.BLAS_SPINS`), else nothing. Such a graph's bounds
    are numba kernels on both cores with small products between them, and OpenBLAS's spinning
    second thread took the core numba's second thread needed: the bench ResNet's CROWN bound
    took 0.13 s against 0.08-0.11 s on one BLAS thread, certify 1.25-1.55x
    (docs/benchmarks.md). A chain of dense layers keeps both BLAS threads (its large products
    are most of its time: 1.45x slower on one)."""
    from crown_cli import runtime
    from crown_cli.graph.ops import Conv

    if not runtime.BLAS_SPINS or not any(isinstance(n.op, Conv) for n in graph.nodes):
        return contextlib.nullcontext()
    return blas_threads(1)
