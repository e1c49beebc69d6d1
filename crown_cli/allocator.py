"""glibc's allocator tuned for crown's arrays (called once by the ``crown`` command).

The bound loops allocate and free arrays of 0.1-50 MB thousands of times a second. glibc
serves blocks above its mmap threshold (128 KiB at first, raised dynamically only after a
larger block is freed) with fresh ``mmap`` pages and unmaps them on ``free``, so every such
array costs its page faults again: on a ReLU-splitting certificate of mnistfc 256x2
(prop_1_0.03) ``crown check`` spent 11 of its 27 s in the kernel (7.9 million minor faults),
and ``crown verify`` 1.4 s of 6.1 s on that instance. A fixed threshold of 64 MiB keeps such
blocks in the heap, whose freed memory is reused; the heap's top is returned to the system
past 128 MiB. Elsewhere than glibc on Linux this does nothing.
"""
import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 64 * 2 ** 20
TRIM_THRESHOLD = 128 * 2 ** 20


def tune_allocator() -> bool:
    """Set glibc's mmap and trim thresholds for this process (and the workers it forks);
    True when both were set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
