"""Build the bundled MNIST sample ``crown_cli/data/mnist_test_100.npz``.

Reads the gzip-compressed MNIST test IDX files (``t10k-images-idx3-ubyte.gz`` and
``t10k-labels-idx1-ubyte.gz``) and writes the first 100 test images with

* ``x``: float64, shape (100, 784), images flattened row-major, scaled ``pixel/255 - 0.5``;
* ``y``: int64, shape (100,), the labels.

Run from the repository root::

    python3 scripts/make_data.py [--mnist-dir ../shared/data/mnist] [--out crown_cli/data/mnist_test_100.npz]

:func:`load_mnist` here (built on ``crown_cli.images``) is also used by ``scripts/train_mlp.py``.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from crown_cli.errors import InputError  # noqa: E402
from crown_cli.images import load_images  # noqa: E402

DEFAULT_MNIST_DIR = os.path.join(REPO_ROOT, "..", "shared", "data", "mnist")
DEFAULT_OUT = os.path.join(REPO_ROOT, "crown_cli", "data", "mnist_test_100.npz")

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

# the project's own IDX reader; its InputError names the file and the problem
IdxError = InputError


def load_mnist(mnist_dir: str, split: str = "test"):
    """Return ``(x, y)`` for ``split`` ('train' or 'test').

    ``x`` is float64 (N, 784), flattened row-major and scaled ``pixel/255 - 0.5``;
    ``y`` is int64 (N,).
    """
    images_name, labels_name = MNIST_FILES[split]
    return load_images(os.path.join(mnist_dir, images_name), os.path.join(mnist_dir, labels_name))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mnist-dir", default=DEFAULT_MNIST_DIR,
                        help="directory holding the MNIST IDX .gz files (default: %(default)s)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output .npz path (default: %(default)s)")
    parser.add_argument("-n", "--count", type=int, default=100,
                        help="number of leading test images to keep (default: %(default)s)")
    args = parser.parse_args(argv)

    try:
        x, y = load_mnist(args.mnist_dir, "test")
    except IdxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not 0 < args.count <= x.shape[0]:
        print(f"error: --count must be in 1..{x.shape[0]}, got {args.count}", file=sys.stderr)
        return 1
    x, y = x[: args.count], y[: args.count]

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.savez_compressed(args.out, x=x, y=y)
    print(f"wrote {args.out}: x {x.shape} {x.dtype}, y {y.shape} {y.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
