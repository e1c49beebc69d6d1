"""Writing crown-proof certificates for the checker's tests (docs/proofs.md), and a tiny
protobuf writer for ONNX chains of dense layers (no onnx package needed)."""
import hashlib
import json
import struct

import numpy as np

from crown_cli.check.certificate import State, _bound, _colsets, update


def header(model, prop, net, cases):
    sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    return {"format": "crown-proof", "version": 1, "kind": "verify",
            "model": {"file": str(model).split("/")[-1], "sha256": sha(model)},
            "property": {"file": str(prop).split("/")[-1], "sha256": sha(prop)},
            "network": {"inputs": net.sizes[0], "hidden": list(net.hidden),
                        "outputs": net.sizes[-1], "activation": "relu"},
            "result": "unsat", "cases": cases}


def save(path, head, cases):
    """Write a certificate: ``cases`` a list of dicts of arrays (without the c{c}_ prefix)."""
    arrays = {"header": np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)}
    for c, arr in enumerate(cases):
        arrays.update({f"c{c}_{k}": v for k, v in arr.items()})
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def tree_arrays(nodes, A, b, lo, hi, cols=()):
    """Preorder arrays of a tree given as nested tuples: ("in", d, v, t0, t1), ("relu", j, t0, t1),
    ("leaf", i) or ("leaf", i, alpha_row, beta_row), ("empty", j) (j the neuron whose bounds
    cross, 0 if left out); refresh 1 everywhere unless a
    node carries ("refresh", r, t)."""
    out = {k: [] for k in ("kind", "arg", "value", "refresh", "alpha_at", "beta_at")}
    alphas, betas = [], []
    stack = [nodes]
    while stack:
        t = stack.pop()
        r = 1
        if t[0] == "refresh":
            r, t = t[1], t[2]
        kind = {"leaf": 0, "in": 1, "relu": 2, "empty": 3}[t[0]]
        arg = t[1] if kind in (0, 1, 2) else (t[1] if len(t) > 1 else 0)
        out["kind"].append(kind)
        out["arg"].append(arg)
        out["value"].append(t[2] if kind == 1 else np.nan)
        out["refresh"].append(r)
        at = [-1, -1]
        if kind == 0:
            for pos, (store, extra) in enumerate(((alphas, 2), (betas, 3))):
                if len(t) > extra and t[extra] is not None:
                    store.append(t[extra])
                    at[pos] = len(store) - 1
        out["alpha_at"].append(at[0])
        out["beta_at"].append(at[1])
        if kind == 1:
            stack += [t[4], t[3]]
        elif kind == 2:
            stack += [t[3], t[2]]
    p = len(cols)
    return {"lo": np.asarray(lo, float), "hi": np.asarray(hi, float), "A": np.asarray(A, float),
            "b": np.asarray(b, float), "kind": np.array(out["kind"], np.int8),
            "arg": np.array(out["arg"], np.int64), "value": np.array(out["value"], float),
            "refresh": np.array(out["refresh"], np.int16),
            "alpha_at": np.array(out["alpha_at"], np.int64),
            "beta_at": np.array(out["beta_at"], np.int64), "cols": np.array(cols, np.int64),
            "alpha": np.array(alphas, float).reshape(len(alphas), p),
            "beta": np.array(betas, float).reshape(len(betas), p)}


def leaf_bounds(net, los, his, A):
    """Default-slope lower bounds of every row of A over each box (B, m), refresh 1."""
    B, H = len(los), int(net.offsets[-1])
    st = State(np.array(los, float), np.array(his, float), np.full((B, H), -np.inf),
               np.full((B, H), np.inf), np.zeros((B, H), np.int8))
    update(net, st, np.ones(B, np.int64), {})
    m = len(A)
    nodes = np.repeat(np.arange(B), m)
    L = np.tile(np.asarray(A, float), (B, 1))
    v = _bound(net, st, L, net.K + 1, nodes, _colsets(net, np.zeros(0, np.int64)),
               np.full(len(nodes), -1), np.zeros((0, 0)))
    return v.reshape(B, m)


def bisection_tree(net, lo, hi, A, b, max_nodes=200_000, min_depth=0):
    """An input-split tree (nested tuples) whose leaves prove some row (bound > b + 1e-9):
    boxes bisected on their widest dimension, level by level (every box above ``min_depth``)."""
    b = np.asarray(b, float)
    level = [(np.asarray(lo, float), np.asarray(hi, float), [])]
    done, count = {}, 0
    while level:
        count += len(level)
        assert count <= max_nodes, "tree too large"
        v = leaf_bounds(net, [x[0] for x in level], [x[1] for x in level], A) - b
        nxt = []
        for (l, h, path), row in zip(level, v):
            if row.max() > 1e-9 and len(path) >= min_depth:
                done[tuple(path)] = ("leaf", int(np.argmax(row)))
                continue
            d = int(np.argmax(h - l))
            mid = 0.5 * (l[d] + h[d])
            done[tuple(path)] = ("in", d, mid)
            h0, l1 = h.copy(), l.copy()
            h0[d], l1[d] = mid, mid
            nxt += [(l, h0, path + [0]), (l1, h, path + [1])]
        level = nxt

    def build(path):
        t = done[tuple(path)]
        return t if t[0] == "leaf" else t + (build(path + [0]), build(path + [1]))

    import sys
    sys.setrecursionlimit(100_000)
    return build([])


# ---- a tiny ONNX writer (protobuf wire format) for tests without the onnx package

def _key(field, wire):
    return _varint(field << 3 | wire)


def _varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def _ld(field, payload):
    return _key(field, 2) + _varint(len(payload)) + payload


def _s(field, text):
    return _ld(field, text.encode())


def tensor(name, a, raw=True):
    a = np.asarray(a)
    dt = {np.dtype(np.float32): 1, np.dtype(np.float64): 11, np.dtype(np.int64): 7,
          np.dtype(bool): 9}[a.dtype]
    msg = b"".join(_key(1, 0) + _varint(d) for d in a.shape) + _key(2, 0) + _varint(dt) + _s(8, name)
    if raw:
        return msg + _ld(9, a.astype(a.dtype.newbyteorder("<")).tobytes())
    if dt == 7:
        return msg + _ld(7, b"".join(_varint(int(x)) for x in a.ravel()))
    fmt = "<f" if dt == 1 else "<d"
    return msg + b"".join(_key(4 if dt == 1 else 10, 5 if dt == 1 else 1) + struct.pack(fmt, x)
                          for x in a.ravel())


def node(op, ins, outs, name="", **attrs):
    msg = b"".join(_s(1, i) for i in ins) + b"".join(_s(2, o) for o in outs) + _s(3, name) + _s(4, op)
    for k, v in attrs.items():
        if isinstance(v, float):
            a = _s(1, k) + _key(2, 5) + struct.pack("<f", v) + _key(20, 0) + _varint(1)
        else:
            a = _s(1, k) + _key(3, 0) + _varint(v) + _key(20, 0) + _varint(2)
        msg += _ld(5, a)
    return msg


def value_info(name, dims):
    dim = b"".join(_ld(1, _s(2, "N") if d is None else _key(1, 0) + _varint(d)) for d in dims)
    return _s(1, name) + _ld(2, _ld(1, _key(1, 0) + _varint(1) + _ld(2, dim)))


def model(nodes, inits, inp, out):
    """ModelProto bytes: ``nodes`` node() messages, ``inits`` tensor() messages, ``inp``/``out``
    (name, dims)."""
    g = b"".join(_ld(1, n) for n in nodes) + _s(2, "g") + b"".join(_ld(5, t) for t in inits)
    g += _ld(11, value_info(*inp)) + _ld(12, value_info(*out))
    opset = _s(1, "") + _key(2, 0) + _varint(13)
    return _key(1, 0) + _varint(8) + _ld(8, opset) + _ld(7, g)
