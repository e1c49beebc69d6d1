"""The image files of ``crown certify`` for the checker (docs/proofs.md, "Certificates of
radii"): one image and its label, in crown's input scaling and layout.

- NPZ with arrays ``x`` (N, ...) and ``y`` (N,) integers: image i is ``x[i]`` flattened in row
  order; ``uint8`` values are scaled to ``float64(p) / 255 - 0.5`` (two float64 operations,
  each rounded to nearest), any other numeric dtype is converted to float64 as stored.
- MNIST IDX (gzipped or raw; types uint8, int8, >i2, >i4, >f4, >f8): the same per image, the
  labels from a 1-D IDX labels file (given, or the file beside the images whose name has
  ``labels-idx1`` for ``images-idx3``, without or with ``.gz``).
"""
import gzip
import os

import numpy as np

from .network import CheckError, Reject

_IDX = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def scaled(a):
    """crown's input values of stored image values ``a`` (float64)."""
    if a.dtype == np.uint8:
        return a.astype(np.float64) / 255.0 - 0.5
    if a.dtype.kind not in "fiu":
        raise Reject(f"image values of dtype {a.dtype}")
    return a.astype(np.float64)


def _read(path):
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise CheckError(f"{path}: cannot read the file ({exc})") from None
    return data


def _idx(path, ndim=None):
    data = _read(path)
    if len(data) < 4 or data[0] or data[1] or data[2] not in _IDX or not data[3]:
        raise CheckError(f"{path}: not an IDX file")
    n = data[3]
    if ndim is not None and n != ndim:
        raise CheckError(f"{path}: IDX file of {n} dimensions, expected {ndim}")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(n)]
    dt = np.dtype(_IDX[data[2]])
    count = int(np.prod(dims))
    if len(data) < 4 + 4 * n + count * dt.itemsize:
        raise CheckError(f"{path}: truncated IDX file")
    return np.frombuffer(data, dt, count, 4 + 4 * n).reshape(dims)


def labels_beside(images_path):
    """The IDX labels file beside an IDX images file, or None."""
    d, name = os.path.split(images_path)
    if "images-idx3" not in name:
        return None
    stem = name.replace("images-idx3", "labels-idx1")
    stem = stem[:-3] if stem.endswith(".gz") else stem
    for cand in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(d, cand)):
            return os.path.join(d, cand)
    return None


def read_image(path, index, labels=None):
    """(x (d,) float64, label, number of images) of image ``index`` of an NPZ or IDX file."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:2] == b"PK":
        try:
            with np.load(path, allow_pickle=False) as z:
                if "x" not in z.files or "y" not in z.files:
                    raise Reject(f"{path}: NPZ image file without arrays x and y")
                x, y = z["x"], z["y"]
        except (Reject, CheckError):
            raise
        except Exception as exc:
            raise CheckError(f"{path}: cannot read the NPZ file ({type(exc).__name__}: {exc})") from None
    elif head[:2] in (b"\x1f\x8b", b"\x00\x00"):
        x = _idx(path)
        labels = labels or labels_beside(path)
        if labels is None:
            raise CheckError(f"{path}: no labels file beside it (give --labels)")
        y = _idx(labels, 1)
    else:
        raise Reject(f"{path}: the checker reads NPZ and IDX image files only")
    if y.ndim != 1 or y.dtype.kind not in "iu" or x.ndim < 1 or len(x) != len(y):
        raise Reject(f"{path}: {x.shape} images and {y.shape} {y.dtype} labels")
    if not 0 <= index < len(x):
        raise Reject(f"image index {index} is outside the file's {len(x)} images")
    return scaled(x[index].reshape(-1)), int(y[index]), len(x)
