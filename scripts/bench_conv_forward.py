#!/usr/bin/env python3
"""A convolution's forward map on a batch of rows (crown_cli.graph.ops.Conv._conv_gemm): its
two BLAS layouts, each row's windows times the kernel ("per row", the choice from
``GEMM_MIN_PLACES`` output positions) and one product of all rows' windows ("all rows"),
against the offset-by-offset numpy twin, per layer shape and dtype, best of 4 alternated
runs, with the largest difference to the twin and the layout ``_conv`` picks. A BLAS product
runs between the timed calls, as in a search, where numpy's BLAS threads and the numba
kernels share the cores.

    python scripts/bench_conv_forward.py [--rows 64]

Figures: docs/benchmarks.md ("A convolution's forward map by BLAS")."""
import argparse
import time

import numpy as np

import crown_cli.graph.ops as ops
from crown_cli.graph.ops import Conv

# channels in, size, channels out, stride
CASES = [(3, 32, 16, 2), (8, 16, 8, 1), (16, 16, 16, 1), (16, 16, 32, 2), (32, 8, 32, 1),
         (32, 8, 64, 2), (64, 4, 64, 1), (64, 4, 128, 2), (128, 2, 128, 1)]


def mean_time(fn, between, repeat=10):
    """Mean seconds of ``fn``, ``between`` run (untimed) before each call."""
    fn()
    total = 0.0
    for _ in range(repeat):
        between()
        t = time.perf_counter()
        fn()
        total += time.perf_counter() - t
    return total / repeat


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    N = ap.parse_args().rows
    rng = np.random.default_rng(0)
    M = rng.normal(size=(256, 256))
    default = ops.GEMM_MIN_PLACES
    for C, H, O, s in CASES:
        conv = Conv(rng.normal(size=(O, C, 3, 3)), None, (C, H, H), (s, s), (1, 1, 1, 1))
        places = conv.out_shape[1] * conv.out_shape[2]
        for dt in (np.float32, np.float64):
            w = ops.typed(conv, "weight", dt)
            x = rng.normal(size=(N, conv.n_in[0])).astype(dt)
            twin = conv._conv_numpy(x, w)

            def layout(min_places):
                def run():
                    ops.GEMM_MIN_PLACES = min_places
                    return conv._conv_gemm(x, w)
                return run

            runs = {"per row": layout(1), "all rows": layout(10 ** 9),
                    "twin": lambda: conv._conv_numpy(x, w)}
            times = {k: [] for k in runs}
            for _ in range(4):
                for k, fn in runs.items():  # other BLAS work in between, as in a search
                    times[k].append(mean_time(fn, lambda: M @ M))
            diff = max(np.abs(runs[k]() - twin).max() for k in ("per row", "all rows"))
            ops.GEMM_MIN_PLACES = default
            pick = "per row" if places >= default else "all rows"
            print(f"{C:3d} -> {O:3d}, {H}x{H}, stride {s}, {dt.__name__}, {N} rows: "
                  + ", ".join(f"{k} {min(v) * 1e3:6.2f} ms" for k, v in times.items())
                  + f"; picks {pick}; max diff {diff:.1e}")


if __name__ == "__main__":
    main()
