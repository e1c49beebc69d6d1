"""Process-wide settings crown makes for speed, each one unless the user chose it first.

- Thread waits (:func:`shorten_thread_waits`, run when ``crown_cli`` is imported). GNU OpenMP
  (numba's threading layer here) keeps its threads spinning about a millisecond after a
  parallel kernel, and OpenBLAS (numpy's BLAS in the Linux wheels) its threads about 2^28
  cycles (~0.1 s) after a product. On 2 cores either one takes the core the other's next
  call needs: OpenMP's took the BLAS products' (the CIFAR conv case 2x slower), OpenBLAS's
  took numba's second thread between the graph engine's small products and its kernels (the
  bench ResNet's CROWN bound 20% slower, docs/benchmarks.md). ``OPENBLAS_THREAD_TIMEOUT=20``
  (2^20 cycles, well under a millisecond) still catches the next product of a run of them;
  with it, ``GOMP_SPINCOUNT=30000`` (about 0.1 ms) keeps numba's threads awake from one
  kernel to the next (the conv case 1.3x faster than at 1000; 10,000-300,000 alike). Where
  numpy was imported before ``crown_cli`` (and the user set no ``OPENBLAS_THREAD_TIMEOUT``),
  OpenBLAS keeps its long spin, and numba's threads kept awake beside it make things worse
  (the ResNet bound 0.39 -> 0.64 s): there OpenMP's spin stays short,
  ``GOMP_SPINCOUNT=1000``, and a convolutional graph's bounds run with OpenBLAS on one thread
  (``BLAS_SPINS``, :func:`crown_cli.engine.threads.quiet_blas`: the bench ResNet's bound
  0.13 -> 0.08-0.11 s). OpenMP reads its setting when numba loads its threading layer (at
  the first parallel kernel), OpenBLAS when numpy loads it: so the second acts only where
  ``crown_cli`` is imported before numpy (the ``crown`` command, and scripts that import it
  first). A user's own ``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY`` or ``OPENBLAS_THREAD_TIMEOUT``
  stands.
- glibc's allocator (:func:`tune_allocator`, run when the engine's kernels load and by the
  ``crown`` command). The bound loops allocate and free arrays of 0.1-50 MB thousands of
  times a second. glibc serves blocks above its mmap threshold (128 KiB at first, raised only
  after a larger block is freed) with fresh ``mmap`` pages and unmaps them on ``free``, so
  every such array costs its page faults again: on a ReLU-splitting certificate of mnistfc
  256x2 ``crown check`` spent 11 of its 27 s in the kernel (7.9 million minor faults), and
  one CROWN bound of the bench ResNet took 18,000 faults (about 15% of its time). A fixed
  threshold of 64 MiB keeps such blocks in the heap, whose freed memory is reused; the
  heap's top is returned to the system past 128 MiB. A user's own ``MALLOC_MMAP_THRESHOLD_``,
  ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_TOP_PAD_`` leaves malloc alone; elsewhere than glibc
  on Linux this does nothing.
"""
import ctypes
import os
import sys

GOMP_SPINCOUNT = "30000"
GOMP_SPINCOUNT_BESIDE_OPENBLAS = "1000"  # where OpenBLAS loaded with its own long spin
OPENBLAS_THREAD_TIMEOUT = "20"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 64 * 2 ** 20
TRIM_THRESHOLD = 128 * 2 ** 20
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


# whether numpy had loaded OpenBLAS with its long spin before crown_cli could shorten it
# (engine.threads.quiet_blas): set by shorten_thread_waits
BLAS_SPINS = False


def shorten_thread_waits() -> None:
    """Set OpenMP's and OpenBLAS's spinning after a call (above) in ``os.environ``, where the
    user has not."""
    global BLAS_SPINS
    blas_spins = "numpy" in sys.modules and "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    BLAS_SPINS = blas_spins
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = \
            GOMP_SPINCOUNT_BESIDE_OPENBLAS if blas_spins else GOMP_SPINCOUNT


def tune_allocator() -> bool:
    """Set glibc's mmap and trim thresholds for this process (and the workers it forks);
    True when both were set."""
    if not sys.platform.startswith("linux") or any(k in os.environ for k in _MALLOC_ENV):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
