"""``crown check``: an independent checker of ``crown verify`` and ``crown certify``
certificates (docs/proofs.md).

It imports nothing else from crown_cli: its own ONNX, NPZ, Keras HDF5, image and VNN-LIB
readers, its own bounds.
"""
import hashlib
import json
import os
from fractions import Fraction

import numpy as np

from .certificate import case_arrays, structure, walk
from .images_reader import read_image
from .keras_reader import read_keras_h5
from .network import CheckError, Network, Reject, load_arrays, read_npz
from .onnx_reader import read_onnx
from .vnnlib_reader import read_vnnlib

__all__ = ["CheckError", "Reject", "Network", "check", "check_certify", "ball_box",
           "load_model", "load_property", "model_layout", "proof_name"]


def _bytes(path, what):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise CheckError(f"{path}: cannot read {what} file ({exc.strerror})") from None


def load_model(path, data=None):
    """The Network of an ONNX or NPZ file (CheckError: unreadable; Reject: outside the scope)."""
    data = _bytes(path, "model") if data is None else data
    if data[:2] == b"PK":
        return read_npz(path)
    if data[:8] == b"\x89HDF\r\n\x1a\n":
        return read_keras_h5(path)
    try:
        return read_onnx(data)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise CheckError(f"{path}: cannot parse the ONNX file ({type(exc).__name__}: {exc})") from None


def model_layout(net, x):
    """An image of an image file (row-major (H, W, C), crown's order) as the model takes it:
    channel-first where the model is an ONNX file whose input is (1, C, H, W) with C > 1 and
    the image has C H W values, unless the input is channel-last (at most 4 in its last
    dimension, more than 4 in its second; docs/proofs.md); else as it is."""
    shape = net.input_shape
    if shape is None or len(shape) != 4 or shape[0] != 1 or shape[1] == 1 or \
            x.size != int(np.prod(shape)) or shape[3] <= 4 < shape[1]:
        return x
    C, H, W = shape[1:]
    return np.ascontiguousarray(x.reshape(H, W, C).transpose(2, 0, 1).reshape(-1))


def load_property(path, n_in, n_out, data=None):
    """The property's cases with a nonempty box (vnnlib_reader.read_vnnlib)."""
    data = _bytes(path, "property") if data is None else data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckError(f"{path}: not UTF-8 text") from None
    return read_vnnlib(text, n_in, n_out)


def proof_name(index, onnx_path, vnnlib_path):
    """The certificate file of instance ``index`` of an instance list (docs/proofs.md)."""
    stem = lambda p: os.path.splitext(os.path.basename(p))[0]  # noqa: E731
    return f"{index:04d}_{stem(onnx_path)}_{stem(vnnlib_path)}.proof"


def _float_below(q):
    """The largest float64 <= the Fraction q (-inf below the float range)."""
    try:
        f = float(q)
    except OverflowError:
        f = np.inf if q > 0 else -np.inf
    if np.isinf(f):
        return np.finfo(np.float64).max if f > 0 else -np.inf
    return f if Fraction(f) <= q else float(np.nextafter(f, -np.inf))


def _read_proof(path):
    arrays = load_arrays(path, "the certificate")
    try:
        header = json.loads(arrays.pop("header").astype(np.uint8).tobytes().decode("utf-8"))
        assert isinstance(header, dict)
    except Exception:
        raise Reject("no readable JSON header") from None
    return header, arrays


def _expect(header, want, files):
    """Reject unless the header has the ``want`` values and binds ``files`` ((key, bytes))
    by their SHA-256."""
    for key, value in want.items():
        if header.get(key) != value:
            raise Reject(f"header {key} is {header.get(key)!r}, expected {value!r}")
    for key, data in files:
        if (header.get(key) or {}).get("sha256") != hashlib.sha256(data).hexdigest():
            raise Reject(f"the {key} file's sha256 differs from the certificate's")


_LAST = {}  # the last model read: (sha256 of its bytes, its Network)


def _network(header, model_path, data):
    """The model's Network, which the header's ``network`` must describe (the last one read
    is kept: an instance list checks many properties of one model, and a convolution's
    matrices and their cached parts take seconds to build). Called after :func:`_expect`
    has bound ``data`` to the header's model sha256, the key of that cache."""
    key = header["model"]["sha256"]
    if _LAST.get("sha256") != key:
        _LAST.clear()
        _LAST.update(sha256=key, net=load_model(model_path, data))
    net = _LAST["net"]
    shape = net.entry()
    if header.get("network") != shape:
        raise Reject(f"header network {header.get('network')} is not the model's {shape}")
    return net


def check(model_path, spec_path, proof_path):
    """Check a certificate; returns {"cases": .., "nodes": ..} or raises Reject (the reason) or
    CheckError (a file missing or unreadable)."""
    model, spec = _bytes(model_path, "model"), _bytes(spec_path, "property")
    header, z = _read_proof(proof_path)
    _expect(header, {"format": "crown-proof", "version": 1, "kind": "verify", "result": "unsat"},
            [("model", model), ("property", spec)])
    net = _network(header, model_path, model)
    cases = load_property(spec_path, net.sizes[0], net.sizes[-1], spec)
    n_cert = header.get("cases")
    if not isinstance(n_cert, int) or n_cert < 0:
        raise Reject(f"header cases {n_cert!r}")
    cert = [_case_key(z, c, net.sizes[0], net.sizes[-1]) for c in range(n_cert)]
    done, nodes, cache, memo = {}, 0, {}, {}
    for p, (lo, hi, rows) in enumerate(cases):
        thresholds = {}
        for coefs, b in rows:
            thresholds[coefs] = min(b, thresholds.get(coefs, b))
        first = None
        for c, key in enumerate(cert):
            if key is None:
                continue
            clo, chi, crows = key
            if not (all(x <= y for x, y in zip(clo, lo)) and all(y <= x for x, y in zip(chi, hi))
                    and all(r in thresholds for r in crows)):
                continue
            b_exact = [thresholds[r] for r in crows]
            key = (c, tuple(b_exact))
            if key not in done:
                try:
                    a = case_arrays(z, c, net, memo)
                    child1 = structure(a, net, len(crows))
                    bf = np.array([_float_below(b) for b in b_exact] or [0.0])
                    done[key] = walk(net, a, child1, bf, b_exact, cache=cache)
                    nodes += done[key]
                except Reject as exc:
                    done[key] = f"case {p} (certificate case {c}): {exc}"
            if not isinstance(done[key], str):
                break
            first = first or done[key]
        else:
            raise Reject(first or f"case {p} of the property: no certificate case has a root box "
                                  "containing its box and only its rows")
    return {"cases": len(cases), "nodes": nodes}


def _case_key(z, c, n_in, n_out):
    """(root lo, root hi, rows) of certificate case c as exact values; None if they are not
    finite arrays of the network's sizes (then the case covers nothing)."""
    try:
        lo, hi, A = (np.asarray(z[f"c{c}_{k}"], dtype=np.float64) for k in ("lo", "hi", "A"))
    except (KeyError, ValueError, TypeError):
        raise Reject(f"certificate case {c}: lo, hi or A missing or not numbers") from None
    if lo.shape != (n_in,) or hi.shape != (n_in,) or A.ndim != 2 or A.shape[1] != n_out \
            or not all(np.all(np.isfinite(v)) for v in (lo, hi, A)):
        return None
    rows = [tuple(Fraction(x) for x in r) for r in A]
    return [Fraction(x) for x in lo], [Fraction(x) for x in hi], rows


def ball_box(x0, eps):
    """The float64 box [lo, hi] a certificate of radius ``eps`` around ``x0`` bounds over:
    ``x0 - eps`` and ``x0 + eps`` rounded to nearest, then one float outward, so it contains
    the real l_inf ball [x0 - eps, x0 + eps] (docs/proofs.md, "Certificates of radii")."""
    x0 = np.asarray(x0, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.nextafter(x0 - eps, -np.inf), np.nextafter(x0 + eps, np.inf)


def check_certify(model_path, images_path, proof_path, labels_path=None):
    """Check a certificate of a certified radius (``crown certify --proof``): returns
    {"cases", "nodes", "image", "class", "targets", "eps"} or raises Reject or CheckError."""
    model, images = _bytes(model_path, "model"), _bytes(images_path, "images")
    header, z = _read_proof(proof_path)
    want = {"format": "crown-proof", "version": 1, "kind": "certify"}
    _expect(header, want, [])
    norm = header.get("norm")
    if norm not in ("inf", "2", "1"):
        raise Reject(f"header norm {norm!r}: 'inf', '2' or '1' expected")
    files = [("model", model), ("images", images)]
    idx = images[:2] in (b"\x1f\x8b", b"\x00\x00")
    if idx:
        from .images_reader import labels_beside

        labels_path = labels_path or labels_beside(images_path)
        if labels_path is None:
            raise CheckError(f"{images_path}: no labels file beside it (give --labels)")
        files.append(("labels", _bytes(labels_path, "labels")))
    elif "labels" in header:
        raise Reject("header names a labels file but the images file is no IDX file")
    _expect(header, {}, files)
    net = _network(header, model_path, model)
    n_in, n_out = net.sizes[0], net.sizes[-1]
    index, c, targets, eps = (header.get(k) for k in ("index", "class", "targets", "eps"))
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise Reject(f"header index {index!r}")
    x, label, _ = read_image(images_path, index, labels_path)
    x = model_layout(net, x)
    if x.shape != (n_in,):
        raise Reject(f"image {index} has {x.size} values, the model {n_in} inputs")
    if c != label or isinstance(c, bool):
        raise Reject(f"header class {c!r} is not the label {label} of image {index}")
    if (not isinstance(targets, list) or not targets or len(set(targets)) != len(targets)
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_out
                       and t != c for t in targets)):
        raise Reject(f"header targets {targets!r}: distinct classes other than {c} expected")
    if header.get("cases") != len(targets):
        raise Reject(f"header cases {header.get('cases')!r}, expected one per target "
                     f"({len(targets)})")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < np.inf:
        raise Reject(f"header eps {eps!r}")
    eps = float(eps)
    x0 = z.get("x0")
    if x0 is None or x0.dtype != np.float64 or x0.shape != (n_in,):
        raise Reject(f"x0 missing or not float64 ({n_in},)")
    if not np.array_equal(x0, x):
        j = int(np.argmax(~(x0 == x)))
        raise Reject(f"x0 is not image {index} of the images file (input {j}: {float(x0[j])!r} "
                     f"!= {float(x[j])!r})")
    lo, hi = ball_box(x, eps)
    nodes = 0
    for k, t in enumerate(targets):
        row = np.zeros((1, n_out))
        row[0, c], row[0, t] = 1.0, -1.0
        try:
            clo, chi, A = (np.asarray(z[f"c{k}_{n}"]) for n in ("lo", "hi", "A"))
        except KeyError:
            raise Reject(f"certificate case {k}: lo, hi or A missing") from None
        if not np.array_equal(A, row):
            raise Reject(f"certificate case {k}: A is not the row y_{c} - y_{t}")
        if not (np.array_equal(clo, lo) and np.array_equal(chi, hi)):
            raise Reject(f"certificate case {k}: its box is not the ball of radius {eps!r} "
                         "around x0 rounded outward")
        try:
            a = case_arrays(z, k, net)
            child1 = structure(a, net, 1)
            nodes += walk(net, a, child1, np.array([0.0]), [Fraction(0)],
                          None if norm == "inf" else (x, eps, norm))
        except Reject as exc:
            raise Reject(f"target {t} (certificate case {k}): {exc}") from None
    return {"cases": len(targets), "nodes": nodes, "image": index, "class": c,
            "targets": list(targets), "eps": eps}
