"""Build the bundled MNIST sample ``crown_cli/data/mnist_test_100.npz``.

Reads the gzip-compressed MNIST test IDX files (``t10k-images-idx3-ubyte.gz`` and
``t10k-labels-idx1-ubyte.gz``) and writes the first 100 test images with

* ``x``: float64, shape (100, 784), images flattened row-major, scaled ``pixel/255 - 0.5``;
* ``y``: int64, shape (100,), the labels.

Run from the repository root::

    python3 scripts/make_data.py [--mnist-dir ../shared/data/mnist] [--out crown_cli/data/mnist_test_100.npz]

The IDX reader and :func:`load_mnist` here are also used by ``scripts/train_mlp.py``.
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MNIST_DIR = os.path.join(REPO_ROOT, "..", "shared", "data", "mnist")
DEFAULT_OUT = os.path.join(REPO_ROOT, "crown_cli", "data", "mnist_test_100.npz")

IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


class IdxError(ValueError):
    """A file is missing or is not the IDX file it was expected to be."""


def read_idx(path: str, expected_magic: int) -> np.ndarray:
    """Read an unsigned-byte IDX file (gzip-compressed if the name ends in ``.gz``).

    The header is a big-endian uint32 magic number (``0x08`` = uint8 data in the third byte,
    the number of dimensions in the fourth) followed by one big-endian uint32 per dimension.
    Returns a uint8 array of that shape; raises :class:`IdxError` on any mismatch.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise IdxError(f"{path}: file not found") from None
    except (OSError, EOFError) as e:
        raise IdxError(f"{path}: cannot read ({e})") from None

    if len(raw) < 4:
        raise IdxError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expected_magic:
        raise IdxError(f"{path}: magic number 0x{magic:08x}, expected 0x{expected_magic:08x}")
    ndim = magic & 0xFF
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise IdxError(f"{path}: truncated header ({len(raw)} bytes, need {header_len})")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    n_values = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header_len != n_values:
        raise IdxError(
            f"{path}: header declares shape {shape} ({n_values} bytes of data) "
            f"but the file holds {len(raw) - header_len}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(shape)


def load_mnist(mnist_dir: str, split: str = "test"):
    """Return ``(x, y)`` for ``split`` ('train' or 'test').

    ``x`` is float64 (N, 784), flattened row-major and scaled ``pixel/255 - 0.5``;
    ``y`` is int64 (N,).
    """
    images_name, labels_name = MNIST_FILES[split]
    images = read_idx(os.path.join(mnist_dir, images_name), IDX_IMAGES_MAGIC)
    labels = read_idx(os.path.join(mnist_dir, labels_name), IDX_LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise IdxError(
            f"{mnist_dir}: {split} split has {images.shape[0]} images but {labels.shape[0]} labels"
        )
    x = images.reshape(images.shape[0], -1).astype(np.float64) / 255.0 - 0.5
    y = labels.astype(np.int64)
    return x, y


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
