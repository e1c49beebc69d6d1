"""Image files: shipped MNIST sample, NPZ, IDX (raw and gzipped), CIFAR CSV, and bad input."""
import gzip
import struct

import numpy as np
import pytest

from crown_cli.errors import InputError
from crown_cli.io.images import load_images, read_idx


def write_idx(path, arr, compress=False):
    arr = np.asarray(arr)
    code = {np.dtype(np.uint8): 0x08}[arr.dtype]
    data = struct.pack(">BBBB", 0, 0, code, arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
    data += arr.tobytes()
    if compress:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        with open(path, "wb") as fh:
            fh.write(data)


def test_shipped_default_images(mnist100):
    x, y = mnist100
    assert x.shape == (100, 784) and y.shape == (100,)
    assert x.min() == -0.5 and x.max() == 0.5
    # the scaling pixel/255 - 0.5 leaves exactly 256 possible values
    assert np.allclose((x + 0.5) * 255, np.round((x + 0.5) * 255), atol=1e-9)
    assert list(y[:10]) == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the MNIST test set's first labels


@pytest.mark.parametrize("compress", [False, True])
def test_idx_images_with_labels_beside_them(tmp_path, compress):
    rng = np.random.default_rng(0)
    pix = rng.integers(0, 256, size=(6, 5, 4), dtype=np.uint8)
    lab = rng.integers(0, 10, size=6).astype(np.uint8)
    sfx = ".gz" if compress else ""
    write_idx(tmp_path / f"t10k-images-idx3-ubyte{sfx}", pix, compress)
    write_idx(tmp_path / f"t10k-labels-idx1-ubyte{sfx}", lab, compress)
    x, y = load_images(str(tmp_path / f"t10k-images-idx3-ubyte{sfx}"))
    assert x.shape == (6, 20)
    assert np.array_equal(x, pix.reshape(6, -1) / 255.0 - 0.5) and np.array_equal(y, lab)


def test_idx_with_explicit_labels_and_mismatch(tmp_path):
    pix = np.zeros((3, 2, 2), np.uint8)
    write_idx(tmp_path / "imgs.idx", pix)
    write_idx(tmp_path / "labs.idx", np.zeros(4, np.uint8))
    with pytest.raises(InputError, match="labs.idx: 4 labels for 3 images"):
        load_images(str(tmp_path / "imgs.idx"), str(tmp_path / "labs.idx"))
    with pytest.raises(InputError, match="no labels file found beside it; pass --labels"):
        load_images(str(tmp_path / "imgs.idx"))


def test_idx_truncated(tmp_path):
    p = tmp_path / "t10k-images-idx3-ubyte"
    write_idx(p, np.zeros((3, 4, 4), np.uint8))
    p.write_bytes(p.read_bytes()[:-5])
    with pytest.raises(InputError, match="truncated IDX data"):
        read_idx(str(p))


def test_idx_header_with_a_wrong_dims_count_names_the_header(tmp_path):
    """An images file whose magic number gives 4 dims for a 3-dim file (0x0804 for 0x0803):
    its last size reads as 0; the message names the header (it said "images have 0 values
    each but the model expects 784 inputs")."""
    p = tmp_path / "t10k-images-idx3-ubyte"
    write_idx(p, np.zeros((5, 28, 28), np.uint8))
    data = bytearray(p.read_bytes())
    data[3] = 4
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"not an IDX file of data \(magic number 0x00000804: 4 "
                                         r"dims, sizes \(5, 28, 28, 0\)\)"):
        read_idx(str(p))


def test_cifar_csv(tmp_path):
    rng = np.random.default_rng(1)
    pix = rng.integers(0, 256, size=(3, 3072))
    lab = [3, 8, 0]
    p = tmp_path / "cifar.csv"
    p.write_text("\n".join(",".join(map(str, [l, *row])) for l, row in zip(lab, pix)) + "\n")
    x, y = load_images(str(p))
    assert x.shape == (3, 3072) and list(y) == lab
    assert np.array_equal(x, pix / 255.0 - 0.5)


@pytest.mark.parametrize("content,message", [
    ("3,1,2\n4,1\n", "line 2 has 2 values, line 1 has 3"),
    ("3,1,abc\n", "line 1 is not comma-separated numbers"),
    ("3,1,300\n", "pixel values must lie in 0..255"),
    ("-1,1,3\n", "first column must hold integer labels"),
    ("\n\n", "contains no images"),
])
def test_bad_csv(tmp_path, content, message):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(InputError, match=message) as err:
        load_images(str(p))
    assert "bad.csv" in str(err.value)


def test_npz_images(tmp_path):
    x = np.random.default_rng(0).uniform(-0.5, 0.5, size=(4, 2, 3))
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(4))
    gx, gy = load_images(str(tmp_path / "a.npz"))
    assert gx.shape == (4, 6) and np.array_equal(gx, x.reshape(4, 6)) and list(gy) == [0, 1, 2, 3]
    pix = np.full((2, 3), 255, np.uint8)
    np.savez(tmp_path / "b.npz", x=pix, y=np.zeros(2, int))
    assert np.all(load_images(str(tmp_path / "b.npz"))[0] == 0.5)  # uint8 gets the paper's scaling


@pytest.mark.parametrize("arrays,message", [
    ({"x": np.zeros((2, 3))}, "needs arrays 'x' and 'y'"),
    ({"x": np.zeros((2, 3)), "y": np.zeros(3, int)}, "2 images but 3 labels"),
    ({"x": np.full((2, 3), np.nan), "y": np.zeros(2, int)}, "NaN or infinite"),
    ({"x": np.zeros((2, 3)), "y": np.zeros(2)}, "'y' must be a 1-D integer array"),
])
def test_bad_npz_images(tmp_path, arrays, message):
    p = tmp_path / "imgs.npz"
    np.savez(p, **arrays)
    with pytest.raises(InputError, match=message) as err:
        load_images(str(p))
    assert "imgs.npz" in str(err.value)


def test_missing_images(tmp_path):
    with pytest.raises(InputError, match="image file not found"):
        load_images(str(tmp_path / "none.npz"))
