#!/usr/bin/env python3
"""A convolution's transpose on rows held transposed: the numba kernel against the BLAS path
(crown_cli.graph.ops.Conv.transpose_t / transpose_blas_t), per layer shape, with the largest
difference between the two; and which one ``Conv.blas_pays`` picks.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python scripts/bench_conv_transpose.py

Figures: docs/benchmarks.md ("A convolution's transpose by BLAS")."""
import time

import numpy as np

from crown_cli.engine.kernels import graph_kernels
from crown_cli.graph.ops import Conv

# channels in, size, channels out, stride, rows, share of the output elements live
CASES = [(16, 32, 32, 2, 510, 1.0), (32, 16, 32, 1, 510, 1.0), (64, 8, 128, 2, 447, 1.0),
         (3, 32, 16, 1, 1251, 1.0), (32, 16, 32, 1, 64, 1.0), (32, 16, 32, 1, 16, 1.0),
         (32, 16, 32, 1, 4, 1.0), (32, 16, 32, 1, 510, 0.1)]


def main():
    kernels = graph_kernels()
    rng = np.random.default_rng(0)
    for C, H, O, s, r, live in CASES:
        conv = Conv(rng.normal(size=(O, C, 3, 3)), None, (C, H, H), (s, s), (1, 1, 1, 1))
        idx = None if live == 1.0 else np.sort(rng.choice(conv.size, int(live * conv.size),
                                                          replace=False))
        Lt = rng.normal(size=(conv.size if idx is None else idx.size, r))
        targets = np.arange(conv.n_in[0])  # every element: every channel of every position
        pos = np.arange(H * H)
        src = np.full(conv.size, -1, np.int64)
        src[np.arange(conv.size) if idx is None else idx] = np.arange(Lt.shape[0])

        def kernel():
            Gt = np.empty((targets.size, r))
            kernels.conv_transpose_t(Lt, src, pos, np.arange(targets.size), conv.weight,
                                     np.asarray(conv.in_shape, np.int64),
                                     np.asarray(conv.out_shape, np.int64),
                                     *kernels.conv_args(conv.strides, conv.dilations,
                                                        conv.pads, conv.group), Gt)
            return Gt

        def blas():
            return conv.transpose_blas_t(Lt, idx, targets, conv.weight)

        times = {}
        for name, fn in (("kernel", kernel), ("blas", blas)):
            fn()  # compiled / warm
            t = time.perf_counter()
            out = fn()
            times[name] = (time.perf_counter() - t, out)
        (tk, a), (tb, b) = times["kernel"], times["blas"]
        print(f"{C:3d} -> {O:3d}, {H}x{H}, stride {s}, {r:4d} rows, live {live:.2f}: kernel "
              f"{tk * 1e3:7.1f} ms, BLAS {tb * 1e3:7.1f} ms, ratio {tk / tb:4.1f}, picks "
              f"{'BLAS' if conv.blas_pays(idx) else 'kernel'}, max diff {np.abs(a - b).max():.1e}")


if __name__ == "__main__":
    main()
