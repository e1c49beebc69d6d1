"""``crown check``: an independent checker of ``crown verify`` certificates (docs/proofs.md).

It imports nothing else from crown_cli: its own ONNX, NPZ and VNN-LIB readers, its own bounds.
"""
import hashlib
import json
import os
from fractions import Fraction

import numpy as np

from .certificate import case_arrays, structure, walk
from .network import CheckError, Network, Reject, read_npz
from .onnx_reader import read_onnx
from .vnnlib_reader import read_vnnlib

__all__ = ["CheckError", "Reject", "Network", "check", "load_model", "load_property",
           "proof_name"]


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
    try:
        return read_onnx(data)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise CheckError(f"{path}: cannot parse the ONNX file ({type(exc).__name__}: {exc})") from None


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
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:
        raise CheckError(f"{path}: cannot read the certificate ({type(exc).__name__}: {exc})") from None
    try:
        header = json.loads(arrays.pop("header").astype(np.uint8).tobytes().decode("utf-8"))
        assert isinstance(header, dict)
    except Exception:
        raise Reject("no readable JSON header") from None
    return header, arrays


def check(model_path, spec_path, proof_path):
    """Check a certificate; returns {"cases": .., "nodes": ..} or raises Reject (the reason) or
    CheckError (a file missing or unreadable)."""
    model, spec = _bytes(model_path, "model"), _bytes(spec_path, "property")
    header, z = _read_proof(proof_path)
    want = {"format": "crown-proof", "version": 1, "kind": "verify", "result": "unsat"}
    for key, value in want.items():
        if header.get(key) != value:
            raise Reject(f"header {key} is {header.get(key)!r}, expected {value!r}")
    for key, data in (("model", model), ("property", spec)):
        if (header.get(key) or {}).get("sha256") != hashlib.sha256(data).hexdigest():
            raise Reject(f"the {key} file's sha256 differs from the certificate's")
    net = load_model(model_path, model)
    shape = {"inputs": net.sizes[0], "hidden": list(net.hidden), "outputs": net.sizes[-1],
             "activation": "relu"}
    if header.get("network") != shape:
        raise Reject(f"header network {header.get('network')} is not the model's {shape}")
    cases = load_property(spec_path, net.sizes[0], net.sizes[-1], spec)
    n_cert = header.get("cases")
    if not isinstance(n_cert, int) or n_cert < 0:
        raise Reject(f"header cases {n_cert!r}")
    cert = [_case_key(z, c, net.sizes[0], net.sizes[-1]) for c in range(n_cert)]
    done, nodes = {}, 0
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
                    a = case_arrays(z, c, net)
                    child1 = structure(a, net, len(crows))
                    bf = np.array([_float_below(b) for b in b_exact] or [0.0])
                    done[key] = walk(net, a, child1, bf, b_exact)
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
