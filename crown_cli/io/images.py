"""Test-image files: the shipped MNIST sample, NPZ, MNIST IDX (raw or gzipped), CIFAR CSV.

Every loader returns ``(x, y)``: x (N, d) float64 in the paper's scaling ``pixel/255 - 0.5``
(NPZ files are taken as already scaled unless their x is uint8), y (N,) int64.
"""
from __future__ import annotations

import gzip
import os
import re
from typing import Optional, Tuple

import numpy as np

from crown_cli.errors import InputError, read_header

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
DEFAULT_IMAGES = os.path.join(DATA_DIR, "mnist_test_100.npz")
# the first 100 CIFAR-10 test images (32x32x3), shipped for models/cifar_base_kw.onnx
SHIPPED_CIFAR = os.path.join(DATA_DIR, "cifar10_test_100.npz")
CIFAR_INPUTS = 32 * 32 * 3


def shipped_images_hint(n_inputs: int) -> str:
    """For a model run on the default (MNIST) images: a pointer to the shipped images of its
    input size ("" when there are none)."""
    if n_inputs != CIFAR_INPUTS:
        return ""
    path = os.path.relpath(SHIPPED_CIFAR)
    if path.startswith(os.pardir):
        path = SHIPPED_CIFAR
    return f"; for 32x32x3 inputs, the shipped CIFAR-10 images: --images {path}"

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def scale_pixels(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels -> the paper's input domain [-0.5, 0.5]."""
    return np.asarray(pixels, dtype=np.float64) / 255.0 - 0.5


def _open_maybe_gzip(path: str) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(2)
    try:
        if head == b"\x1f\x8b":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        with open(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: cannot read file ({exc})") from None


def read_idx(path: str, ndim_expected: Optional[int] = None, kind: str = "IDX") -> np.ndarray:
    """Parse an IDX file (MNIST format), gzipped or raw, into an ndarray.

    ``ndim_expected`` (1 for a labels file) is checked against the magic number before the
    header is read, so a file of another kind is reported as such; ``kind`` names the file in
    messages ('labels IDX')."""
    data = _open_maybe_gzip(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise InputError(f"{path}: not an {kind} file (bad magic number)")
    code, ndim = data[2], data[3]
    magic = int.from_bytes(data[:4], "big")
    if code not in IDX_DTYPES or ndim == 0:
        raise InputError(f"{path}: not an {kind} file (magic number 0x{magic:08x}: type code "
                         f"0x{code:02x}, {ndim} dims)")
    if ndim_expected is not None and ndim != ndim_expected:
        raise InputError(f"{path}: not an {kind} file (magic number 0x{magic:08x} says {ndim} "
                         f"dimensions, expected {ndim_expected}"
                         + ("; is it an images file?" if ndim >= 2 else "") + ")")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise InputError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if 0 in dims[1:]:  # e.g. a wrong magic number whose dims count takes a 0 for a size
        raise InputError(f"{path}: not an {kind} file of data (magic number 0x{magic:08x}: "
                         f"{ndim} dims, sizes {dims})")
    dtype = np.dtype(IDX_DTYPES[code])
    count = int(np.prod(dims))
    if len(data) - header < count * dtype.itemsize:
        raise InputError(
            f"{path}: truncated IDX data ({len(data) - header} bytes for dims {dims})"
        )
    return np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(dims)


def _labels_path_for(images_path: str) -> Optional[str]:
    """t10k-images-idx3-ubyte[.gz] -> an existing t10k-labels-idx1-ubyte[.gz] beside it."""
    d, name = os.path.split(images_path)
    base = re.sub(r"images-idx3", "labels-idx1", name)
    if base == name:
        return None
    stem = base[:-3] if base.endswith(".gz") else base
    for cand in (stem, stem + ".gz"):
        p = os.path.join(d, cand)
        if os.path.exists(p):
            return p
    return None


def labels_source(path: Optional[str], labels: Optional[str] = None) -> str:
    """The file the labels of :func:`load_images` ``(path, labels)`` come from, for messages:
    the IDX labels file (given or found beside the images), else the image file itself."""
    if path is None:
        return "default MNIST images"
    if labels is not None:
        return labels
    return _labels_path_for(os.fspath(path)) or os.fspath(path)


def load_images(path: Optional[str] = None, labels: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Load test images and labels; ``path=None`` gives the first 100 MNIST test images."""
    path = DEFAULT_IMAGES if path is None else os.fspath(path)
    head = read_header(path, "image", 4)
    if head.startswith(b"PK"):
        x, y = _load_npz(path)
    elif head[:2] == b"\x1f\x8b" or head[:2] == b"\x00\x00":
        x, y = _load_idx(path, labels)
    else:
        x, y = _load_csv(path)
    if labels is not None and not (head[:2] == b"\x1f\x8b" or head[:2] == b"\x00\x00"):
        raise InputError(f"--labels: only used with IDX image files, not {path}")
    if x.shape[0] == 0:
        raise InputError(f"{path}: contains no images")
    if x.shape[0] != y.shape[0]:
        raise InputError(f"{path}: {x.shape[0]} images but {y.shape[0]} labels")
    if not np.all(np.isfinite(x)):
        raise InputError(f"{path}: images contain NaN or infinite values")
    return np.ascontiguousarray(x, dtype=np.float64), y.astype(np.int64)


def _load_npz(path: str):
    try:
        with np.load(path, allow_pickle=False) as data:
            keys = list(data.keys())
            if "x" not in keys or "y" not in keys:
                raise InputError(f"{path}: NPZ image file needs arrays 'x' and 'y' (found {keys})")
            x = data["x"]
            y = data["y"]
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{path}: cannot read NPZ archive ({type(exc).__name__}: {exc})") from None
    if x.ndim < 1 or x.dtype.kind not in "fiu":
        raise InputError(f"{path}: 'x' must be a numeric array, got dtype {x.dtype} shape {x.shape}")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise InputError(f"{path}: 'y' must be a 1-D integer array, got dtype {y.dtype} shape {y.shape}")
    if x.ndim >= 1 and x.shape[0] == 0:
        raise InputError(f"{path}: contains no images ('x' has shape {x.shape})")
    x = scale_pixels(x) if x.dtype == np.uint8 else x.astype(np.float64)
    return x.reshape(x.shape[0], -1), y


def _load_idx(path: str, labels: Optional[str]):
    arr = read_idx(path)
    if arr.ndim < 2:
        raise InputError(f"{path}: IDX file has {arr.ndim} dimension(s); expected images (N, H, W)")
    labels = labels or _labels_path_for(path)
    if labels is None:
        raise InputError(f"{path}: no labels file found beside it; pass --labels")
    read_header(labels, "labels", 4)
    y = read_idx(labels, 1, "IDX labels")
    if y.ndim != 1:
        raise InputError(f"{labels}: labels IDX file must be 1-D, has shape {y.shape}")
    if y.shape[0] != arr.shape[0]:
        raise InputError(f"{labels}: {y.shape[0]} labels for {arr.shape[0]} images in {path}")
    x = scale_pixels(arr) if arr.dtype == np.uint8 else arr.astype(np.float64)
    return x.reshape(arr.shape[0], -1), y.astype(np.int64)


def _load_csv(path: str):
    """CIFAR CSV: one image per line, label then pixel values 0..255."""
    rows = []
    try:
        with open(path, "r", encoding="ascii") as fh:
            for lineno, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(np.array(line.split(","), dtype=np.float64))
                except ValueError:
                    raise InputError(f"{path}: line {lineno} is not comma-separated numbers") from None
                if rows[-1].shape[0] != rows[0].shape[0]:
                    raise InputError(
                        f"{path}: line {lineno} has {rows[-1].shape[0]} values, line 1 has {rows[0].shape[0]}"
                    )
    except UnicodeDecodeError:
        raise InputError(f"{path}: not an NPZ, IDX or CSV image file") from None
    if not rows:
        raise InputError(f"{path}: contains no images")
    data = np.vstack(rows)
    if data.shape[1] < 2:
        raise InputError(f"{path}: CSV lines need a label followed by pixel values")
    y = data[:, 0]
    pix = data[:, 1:]
    if np.any(y != np.round(y)) or np.any(y < 0):
        raise InputError(f"{path}: first column must hold integer labels")
    if np.any(pix < 0) or np.any(pix > 255):
        raise InputError(f"{path}: pixel values must lie in 0..255")
    return scale_pixels(pix), y.astype(np.int64)
