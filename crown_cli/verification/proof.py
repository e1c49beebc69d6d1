"""Recording the proof of an ``unsat`` case as the searches go, and writing certificates.

A search given a :class:`ProofTree` numbers its domains as tree nodes: the root is node 0,
an input split or a ReLU split turns an open node into an internal one with two new children,
and a proven domain becomes a leaf of each case it proves (the row, and the slopes and
multipliers of its float64 bound), or an empty leaf (a neuron whose bounds cross there).
:meth:`ProofTree.case_arrays` lays a case's tree out in preorder as docs/proofs.md specifies;
:func:`save` writes the certificate. Arrays in, arrays out, but for :func:`save`.
"""
from __future__ import annotations

import hashlib
import json
from typing import Dict, List, Optional, Sequence

import numpy as np

FORMAT, VERSION = "crown-proof", 1
OPEN, LEAF, INPUT, RELU, EMPTY, HULL = -1, 0, 1, 2, 3, 4


class ProofError(Exception):
    """A tree that does not prove its case (a bug of the recording, never of the user)."""


class ProofTree:
    """The domain tree of one search over one box (several cases share it in a joint
    ReLU-splitting search). Nodes are numbered in creation order; ``cols`` are the flat
    hidden-neuron indices that slopes and multipliers are given over."""

    def __init__(self, cols: Optional[np.ndarray] = None):
        self.kind: List[int] = [OPEN]
        self.arg: List[int] = [-1]
        self.value: List[float] = [float("nan")]
        self.refresh: List[int] = [1]
        self.kids: List[int] = [-1]  # the first child's number (the second is the next one)
        self.leaves: Dict[tuple, tuple] = {}  # (node, case) -> (row, alpha, beta)
        self.cols = None if cols is None else np.asarray(cols, np.int64)
        self.layer_slopes: Dict[int, tuple] = {}  # 1-based layer -> (rows flat, slopes)
        self.rowmul: List[tuple] = []  # (nodes, neurons, sides, counts, columns, values)
        self._rm = None  # their arrays, built once

    def __len__(self):
        return len(self.kind)

    def _children(self, node: int, kind: int, arg: int, value: float, refresh: int) -> int:
        if self.kind[node] != OPEN:
            raise ProofError(f"node {node} split twice")
        first = len(self.kind)
        self.kind[node], self.arg[node], self.value[node] = kind, int(arg), float(value)
        self.kids[node] = first
        self.kind += [OPEN, OPEN]
        self.arg += [-1, -1]
        self.value += [float("nan")] * 2
        self.refresh += [int(refresh)] * 2
        self.kids += [-1, -1]
        return first

    def split_input(self, nodes, dims, values) -> np.ndarray:
        """Each node halved on input dimension dims[i] at values[i]: (n, 2) children (the
        lower half, then the upper)."""
        return np.array([[f, f + 1] for f in (
            self._children(int(n), INPUT, int(d), float(v), 1)
            for n, d, v in zip(nodes, dims, values))], np.int64).reshape(-1, 2)

    def split_relu(self, nodes, neurons, refresh) -> np.ndarray:
        """Each node split on flat neuron neurons[i]: (n, 2) children (inactive, active);
        ``refresh`` (n,): the first layer (1-based) the children recompute."""
        return np.array([[f, f + 1] for f in (
            self._children(int(n), RELU, int(j), float("nan"), int(r))
            for n, j, r in zip(nodes, neurons, refresh))], np.int64).reshape(-1, 2)

    def prove(self, node: int, case: int, row: int, alpha=None, beta=None) -> None:
        """Node ``node`` proves case ``case`` by row ``row`` with these slopes and
        multipliers over ``cols`` (None: the defaults), each exactly a float32."""
        self.leaves.setdefault((int(node), int(case)), (
            int(row), None if alpha is None else _exact32(alpha),
            None if beta is None else _exact32(beta)))

    def prove_hull(self, node: int, case: int, row: int, s, theta) -> None:
        """Node ``node`` proves case ``case`` by row ``row`` with the hull lines ``s``
        (n_1,) and ``theta`` (n_1, n_in) of a one-hidden-layer network (each a float32)."""
        self.leaves.setdefault((int(node), int(case)), (int(row), HULL, (_exact32(s),
                                                                         _exact32(theta))))

    def row_multipliers(self, nodes, neurons, sides, cols, beta, alpha=None, free=None) -> None:
        """At tree node ``nodes[i]``, the bound of the row ``sides[i] * z_j`` (j = flat
        neuron ``neurons[i]``) of its hidden-layer bounds takes the multipliers ``beta[i]``
        (n, len(cols)), each exactly a float32 (zeros left out), on the flat neurons
        ``cols``, and (``alpha`` not None) the lower slopes ``alpha[i]`` (n, len(cols)), each
        exactly a float16, on the neurons where ``free[i]`` holds."""
        beta = _exact32(beta)
        r, c = np.nonzero(beta)
        n = len(beta)
        if alpha is None:
            sc, scol, sval = np.zeros(n, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float16)
        else:
            alpha = _exact16(alpha)
            sr, sj = np.nonzero(free)
            sc, scol, sval = np.bincount(sr, minlength=n), np.asarray(cols, np.int64)[sj], \
                alpha[sr, sj]
        self._rm = None
        self.rowmul.append((np.asarray(nodes, np.int64), np.asarray(neurons, np.int64),
                            np.asarray(sides, np.int8), np.bincount(r, minlength=n),
                            np.asarray(cols, np.int64)[c], beta[r, c], sc, scol, sval))

    def _rowmul_arrays(self) -> Dict[str, np.ndarray]:
        """The tree's row multipliers keyed by node number (docs/proofs.md), sorted by node;
        one dict (the same arrays) for every case of the tree."""
        if not self.rowmul:
            return {}
        if self._rm is None:
            node, neur, side, cnt, col, val, sc, scol, sval = (
                np.concatenate(a) for a in zip(*self.rowmul))
            keep = np.argsort(node, kind="stable")
            take, stake = _regroup(cnt, keep), _regroup(sc, keep)
            self._rm = dict(rm_node=_smallest(node[keep]), rm_neuron=_smallest(neur[keep]),
                            rm_side=side[keep], rm_count=_smallest(cnt[keep]),
                            rm_col=_smallest(col[take]), rm_value=val[take])
            if sc.any():
                self._rm.update(rm_scount=_smallest(sc[keep]), rm_scol=_smallest(scol[stake]),
                                rm_slope=sval[stake])
        return self._rm

    def empty(self, node: int, neuron: int) -> None:
        """Node ``node`` has no point: the bounds of flat neuron ``neuron`` cross there."""
        if self.kind[node] == OPEN:
            self.kind[node], self.arg[node] = EMPTY, int(neuron)

    def case_arrays(self, case: int = 0) -> Dict[str, np.ndarray]:
        """The arrays of docs/proofs.md for one case (without its box and rows), nodes in
        preorder; a node with no proof of the case and no children raises
        :class:`ProofError`."""
        kind, arg, value, refresh, a_at, b_at, h_at = [], [], [], [], [], [], []
        alphas, betas, hs, hts = [], [], [], []
        stack, pre = [0], {}
        while stack:
            n = stack.pop()
            pre[n] = len(kind)
            leaf = self.leaves.get((n, case))
            if leaf is not None and leaf[1] is HULL:
                kind.append(HULL)
                arg.append(leaf[0])
                value.append(np.nan)
                a_at.append(-1)
                b_at.append(-1)
                h_at.append(len(hs))
                hs.append(leaf[2][0])
                hts.append(leaf[2][1])
            elif leaf is not None:
                row, al, be = leaf
                kind.append(LEAF)
                arg.append(row)
                value.append(np.nan)
                a_at.append(-1 if al is None else len(alphas))
                b_at.append(-1 if be is None else len(betas))
                h_at.append(-1)
                if al is not None:
                    alphas.append(al)
                if be is not None:
                    betas.append(be)
            elif self.kind[n] in (INPUT, RELU, EMPTY):
                kind.append(self.kind[n])
                arg.append(self.arg[n])
                value.append(self.value[n])
                a_at.append(-1)
                b_at.append(-1)
                h_at.append(-1)
                if self.kind[n] != EMPTY:
                    f = self.kids[n]
                    stack += [f + 1, f]  # child 0 first
            else:
                raise ProofError(f"node {n} of case {case} is neither split nor proven")
            refresh.append(self.refresh[n])
        p = 0 if self.cols is None else self.cols.size
        out = dict(kind=np.array(kind, np.int8), arg=np.array(arg, np.int64),
                   value=np.array(value, np.float64), refresh=np.array(refresh, np.int16),
                   alpha_at=np.array(a_at, np.int64), beta_at=np.array(b_at, np.int64),
                   cols=np.zeros(0, np.int64) if self.cols is None else self.cols,
                   alpha=np.array(alphas, np.float32).reshape(len(alphas), p),
                   beta=np.array(betas, np.float32).reshape(len(betas), p))
        if hs:
            out.update(hull_at=np.array(h_at, np.int64), hull_s=np.stack(hs),
                       hull_theta=np.stack(hts))
        rm = self._rowmul_arrays()
        if rm:  # keyed by node number: each preorder node's number, and the tree's entries
            out["node_id"] = _smallest(np.fromiter(pre.keys(), np.int64, len(pre)))
            out.update(rm)
        for k, (rows, sl) in sorted(self.layer_slopes.items()):
            out[f"slopes_k{k}_rows"] = np.asarray(rows, np.int64)
            out[f"slopes_k{k}"] = np.asarray(sl, np.float32)
        return out


def _smallest(a) -> np.ndarray:
    """Nonnegative integers in the smallest unsigned dtype that holds them."""
    a = np.asarray(a, np.int64)
    top = int(a.max(initial=0))
    for t in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(t).max:
            return a.astype(t)
    return a


def _regroup(cnt, order) -> np.ndarray:
    """The positions of the items of entries ``order`` (each entry e owning the next
    ``cnt[e]`` items, in entry order), one entry's after another's."""
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    return np.repeat(start[order] - np.concatenate([[0], np.cumsum(cnt[order])[:-1]]),
                     cnt[order]) + np.arange(int(cnt.sum()))


def _exact16(a) -> np.ndarray:
    """``a`` as float16, which must hold it exactly (the bound was verified at these values)."""
    a = np.asarray(a)
    out = a.astype(np.float16)
    if not np.array_equal(out.astype(a.dtype), a):
        raise ProofError("a certificate slope is not a float16")
    return out


def _exact32(a) -> np.ndarray:
    """``a`` as float32, which must hold it exactly (the bound was verified at these values)."""
    a = np.asarray(a)
    out = a.astype(np.float32)
    if a.dtype != np.float32 and not np.array_equal(out.astype(a.dtype), a):
        raise ProofError("a certificate parameter is not a float32")
    return out


def leaf_only(row: int) -> ProofTree:
    """The tree of a case proven over its whole box by row ``row`` with default slopes."""
    t = ProofTree()
    t.prove(0, 0, row)
    return t


def dense_shape(weights) -> dict:
    """A certificate's ``network`` entry for a chain of dense ReLU layers ``weights``
    ((out, in) each): inputs, hidden sizes, outputs, activation."""
    return {"inputs": int(weights[0].shape[1]), "hidden": [int(w.shape[0]) for w in weights[:-1]],
            "outputs": int(weights[-1].shape[0]), "activation": "relu"}


def case_tree(arrays, case):
    """A case's certificate arrays: its recorded tree's ``arrays`` with the case's box and
    rows (``lo``, ``hi``, ``A``, ``b``), or None without a tree."""
    if arrays is None:
        return None
    return dict(arrays, lo=np.asarray(case.lo, np.float64), hi=np.asarray(case.hi, np.float64),
                A=np.asarray(case.A, np.float64), b=np.asarray(case.b, np.float64))


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path) -> dict:
    """A header's entry of a file it binds: its name and SHA-256."""
    import os

    return {"file": os.path.basename(str(path)), "sha256": sha256(path)}


def write_archive(path, header: dict, arrays: Dict[str, np.ndarray]) -> None:
    """A certificate file: the arrays and the JSON ``header`` as compressed NPZ members,
    written to a temporary file first (a partial file never takes the name)."""
    import os

    arrays = dict(arrays, header=np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8))
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays)
    os.replace(tmp, path)


def save(path, cases: Sequence[Dict[str, np.ndarray]], network: dict, model_file,
         spec_file) -> None:
    """Write the certificate of an unsat verdict: per case its arrays (the tree's, box and
    rows), the network's shape, for these files."""
    arrays, owner = {}, {}
    for c, case in enumerate(cases):
        first = owner.setdefault(id(case.get("rm_node")), c)
        for name, a in case.items():
            if name.startswith("rm_") and first != c:  # a tree's entries, written once
                arrays[f"c{c}_rm_same"] = np.array(first, np.int64)
            else:
                arrays[f"c{c}_{name}"] = a
    header = {"format": FORMAT, "version": VERSION, "kind": "verify",
              "model": file_entry(model_file), "property": file_entry(spec_file),
              "network": network, "result": "unsat", "cases": len(cases)}
    write_archive(path, header, arrays)


def proof_name(inst) -> str:
    """The certificate file of an instance of a list: ``{index:04d}_{onnx}_{vnnlib}.proof``
    (the 0-based line, the files' names without their extension): the name ``crown check``
    looks for (:func:`crown_cli.check.proof_name`)."""
    from crown_cli.check import proof_name as checker_name

    return checker_name(inst.index, inst.onnx, inst.vnnlib)


def write_verdict_proof(verdict, verifier, model_path, spec_path, path) -> str:
    """Write the certificate of an unsat ``verdict``; returns why none was written ('' when
    one was, or when the verdict is not unsat)."""
    if verdict.result != "unsat":
        return ""
    trees = getattr(verdict, "proof", None)
    if trees is None:
        return ("no certificate written: certificates cover ReLU networks of dense layers, "
                "graphs lowered to them, chains of convolutions, max pools and ReLUs and "
                "residual ReLU networks crown check reads (docs/proofs.md)")
    if any(t is None for t in trees):
        return "no certificate written: some case has no recorded proof (within the timeout)"
    save(path, trees, verifier.proof_shape, model_path, spec_path)
    return ""
