"""Build the bundled samples ``crown_cli/data/mnist_test_100.npz`` and ``cifar10_test_100.npz``.

Reads the gzip-compressed MNIST test IDX files (``t10k-images-idx3-ubyte.gz`` and
``t10k-labels-idx1-ubyte.gz``) and writes the first 100 test images with

* ``x``: float64, shape (100, 784), images flattened row-major, scaled ``pixel/255 - 0.5``;
* ``y``: int64, shape (100,), the labels.

and, from the CIFAR-10 CSV (label then 3072 pixels 0..255 per line, height-width-channel
order), the first 100 CIFAR-10 test images as uint8 ``x`` (100, 3072) (crown scales uint8 NPZ
images by ``pixel/255 - 0.5`` when it loads them) and ``y``, used by ``scripts/bench.py``.
Run from the repository root::

    python3 scripts/make_data.py [--mnist-dir ../shared/data/mnist] [--out crown_cli/data/mnist_test_100.npz]
                                 [--cifar-csv ../shared/data/cifar10/cifar10_test_100.csv]

:func:`load_mnist` here (built on ``crown_cli.io.images``) is also used by ``scripts/train_mlp.py``.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from crown_cli.errors import InputError  # noqa: E402
from crown_cli.io.images import load_images  # noqa: E402

DEFAULT_MNIST_DIR = os.path.join(REPO_ROOT, "..", "shared", "data", "mnist")
DEFAULT_OUT = os.path.join(REPO_ROOT, "crown_cli", "data", "mnist_test_100.npz")
DEFAULT_CIFAR_CSV = os.path.join(REPO_ROOT, "..", "shared", "data", "cifar10", "cifar10_test_100.csv")
CIFAR_OUT = os.path.join(REPO_ROOT, "crown_cli", "data", "cifar10_test_100.npz")

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
    parser.add_argument("--cifar-csv", default=DEFAULT_CIFAR_CSV,
                        help="CIFAR-10 test CSV for the CIFAR sample ('' to skip; default: %(default)s)")
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
    if args.cifar_csv:
        try:
            table = np.loadtxt(args.cifar_csv, delimiter=",", dtype=np.int64, ndmin=2)
        except (OSError, ValueError) as e:
            print(f"error: {args.cifar_csv}: {e}", file=sys.stderr)
            return 1
        if table.shape[1] != 3073 or table.min() < 0 or table[:, 1:].max() > 255:
            print(f"error: {args.cifar_csv}: expected rows of a label and 3072 pixels 0..255",
                  file=sys.stderr)
            return 1
        cx, cy = table[:, 1:].astype(np.uint8), table[:, 0]
        np.savez_compressed(CIFAR_OUT, x=cx, y=cy)
        print(f"wrote {CIFAR_OUT}: x {cx.shape} {cx.dtype}, y {cy.shape} {cy.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
