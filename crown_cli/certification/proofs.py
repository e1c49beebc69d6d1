"""``crown certify --proof DIR``: a certificate of each certified radius (docs/proofs.md,
"Certificates of radii"), checked by ``crown check`` before it is kept.

A row's certificate holds the image as the engine bounded it (``x0``), the reported eps and
per target one case: the l_inf box of radius eps rounded outward (which holds the row's l_p
ball), the row ``y_c - y_t`` and a
one-leaf tree proving it > 0 there: CROWN's default slopes (``--method crown``, or
alpha-crown rows whose radius is CROWN's), or the slopes alpha-CROWN's float64 bound was
verified at (the leaf's over ``cols``, the intermediate rows' as layer slopes). Every
certificate is checked by the checker (``crown_cli.check``, which shares no code with the
engine) before it is written; one it rejects is not written and the row gets a warning.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from crown_cli.errors import InputError
from crown_cli.verification.proof import file_entry as _file
from crown_cli.verification.proof import write_archive as _save

PROOF_NORMS = ("inf", "2", "1")
PROOF_METHODS = ("crown", "alpha-crown")


def proof_file(image: int, norm: str, method: str, target_type: str, target) -> str:
    """``{image:05d}_l{norm}_{method}_{target_type}_{target}.proof``; untargeted rows:
    ``{image:05d}_l{norm}_{method}_untargeted.proof`` (one file per row of a run over
    several norms, methods and targets)."""
    stem = f"{image:05d}_l{norm}_{method}_{target_type}"
    if target_type == "untargeted" or target in ("", None) or isinstance(target, list):
        return f"{stem}.proof"
    return f"{stem}_{int(target)}.proof"


def check_scope(norms: Sequence[str], methods: Sequence[str], model_path: str, mlp, graph,
                weights, images_path: Optional[str]):
    """InputError (one line) naming what ``--proof`` does not cover; else the model as
    ``crown check`` reads it (its :class:`crown_cli.check.Network`, which
    :class:`ProofWriter` takes)."""
    bad = [n for n in norms if n not in PROOF_NORMS]
    if bad:
        raise InputError(f"--proof: certificates of radii cover --norm inf, 2 and 1, not {bad[0]}")
    bad = [m for m in methods if m not in PROOF_METHODS]
    if bad:
        raise InputError(f"--proof: certificates of radii cover --method crown and alpha-crown "
                         f"only, not {bad[0]}")
    with open(model_path, "rb") as fh:
        head = fh.read(8)
    onnx = not (head[:2] == b"PK" or head == b"\x89HDF\r\n\x1a\n")
    if onnx and graph is not None:  # the graph engine: CROWN's default slopes only
        bad = [m for m in methods if m != "crown"]
        if bad:
            raise InputError(f"--proof: certificates of radii of ONNX models on the graph "
                             f"engine cover --method crown only, not {bad[0]} ({model_path})")
    else:
        if graph is not None or mlp is None:
            raise InputError(f"--proof: certificates of radii of Keras and NPZ models cover dense "
                             f"ReLU networks, not the graph network {model_path}")
        if mlp.activation != "relu":
            raise InputError(f"--proof: certificates of radii cover ReLU networks, not "
                             f"{mlp.activation} ({model_path})")
        if len(weights) != len(mlp.weights):
            raise InputError(f"--proof: certificates of radii cover networks whose last layer has "
                             f"no activation or an order-preserving one ({model_path})")
    from crown_cli import check as checker

    try:
        net = checker.load_model(model_path)
    except (checker.Reject, checker.CheckError) as exc:
        raise InputError(f"--proof: crown check cannot read {model_path}: {exc}") from None
    if onnx:
        n_in = graph.input_size if graph is not None else mlp.weights[0].shape[1]
        n_out = graph.output_size if graph is not None else mlp.weights[-1].shape[0]
        if (net.sizes[0], net.sizes[-1]) != (n_in, n_out):
            raise InputError(f"--proof: crown check reads {model_path} as {net.sizes[0]} inputs "
                             f"and {net.sizes[-1]} outputs, crown as {n_in} and {n_out}")
        # on the dense engine alpha-CROWN's slopes are numbered by the chain's hidden
        # neurons, which are the ONNX ReLUs' inputs in their own element order
        hidden = [w.shape[0] for w in weights[:-1]] if graph is None else None
        if "alpha-crown" in methods and (hidden != list(net.hidden) or not net.chain or
                                         net.identity):
            raise InputError(f"--proof: crown check reads {model_path} with hidden layers "
                             f"{list(net.hidden)}, the dense engine's are {hidden}: "
                             "alpha-crown's certificates need the same")
    else:
        sizes = [weights[0].shape[1]] + [w.shape[0] for w in weights]
        if list(net.sizes) != sizes:
            raise InputError(f"--proof: crown check reads {model_path} as layers {net.sizes}, "
                             f"crown as {sizes}")
    if images_path is not None:
        with open(images_path, "rb") as fh:
            head = fh.read(2)
        if head not in (b"PK", b"\x1f\x8b", b"\x00\x00"):
            raise InputError(f"--proof: certificates of radii cover NPZ and IDX image files, not "
                             f"{images_path}")
    return net


class ProofWriter:
    """Writes (and checks) the certificate of each certified row into ``folder``."""

    def __init__(self, folder: str, model_path: str, images_path: Optional[str],
                 labels_path: Optional[str], checker_net, warn: Callable[[str], None]):
        from crown_cli.io.images import DEFAULT_IMAGES, _labels_path_for

        self.folder, self.model_path, self.warn = folder, model_path, warn
        self.images_path = images_path or DEFAULT_IMAGES
        self.labels_path = labels_path
        with open(self.images_path, "rb") as fh:
            idx = fh.read(2) in (b"\x1f\x8b", b"\x00\x00")
        if idx and labels_path is None:
            self.labels_path = _labels_path_for(self.images_path)
        self.files = {"model": _file(model_path), "images": _file(self.images_path)}
        if idx:
            self.files["labels"] = _file(self.labels_path)
        # the model as crown check reads it (check_scope's): the sizes of the certificates'
        # network entry, and an ONNX model's input layout
        self.checker_net = checker_net
        self.network = checker_net.entry()
        self.offsets = checker_net.offsets  # each hidden layer's first flat neuron
        self.written = self.rejected = 0
        self.check_s = 0.0
        self.bytes = 0

    def write(self, row: Dict[str, object], method: str, x0, c: int, src_targets: List[int],
              res, targets: List[int]) -> Optional[str]:
        """The certificate of ``row`` (eps ``row["eps"]``) from the verified bound of ``res``
        (a Certificate over ``src_targets``, the rows of its C) for ``targets`` (a subset);
        returns the file written, or None (a warning says why)."""
        eps = float(row["eps"])
        where = (f"image {row['image']} {row['target_type']} {row['target']} "
                 f"{row['method']} eps {eps!r}")
        if res.proof is None:
            self.warn(f"crown: warning: {where}: no certificate (the bound's slopes were not "
                      "recorded)")
            return None
        x0 = self._model_layout(np.asarray(x0, np.float64), int(row["image"]))
        if x0 is None:
            self.warn(f"crown: warning: {where}: no certificate (the image the engine bounded "
                      "is not the file's image in the model's layout)")
            return None
        arrays = self._arrays(x0, c, src_targets, res.proof, targets, eps)
        header = {"format": "crown-proof", "version": 1, "kind": "certify",
                  **{k: v for k, v in self.files.items()},
                  "network": self.network, "index": int(row["image"]), "class": int(c),
                  "target_type": row["target_type"], "targets": [int(t) for t in targets],
                  "norm": str(row["norm"]), "method": method, "eps": eps,
                  "cases": len(targets)}
        path = os.path.join(self.folder, proof_file(row["image"], str(row["norm"]), method,
                                                    row["target_type"], row["target"]))
        os.makedirs(self.folder, exist_ok=True)
        _save(path, header, arrays)
        from crown_cli import check as checker

        t0 = time.perf_counter()
        try:
            checker.check_certify(self.model_path, self.images_path, path, self.labels_path)
        except checker.Reject as exc:
            self.check_s += time.perf_counter() - t0
            os.remove(path)
            self.rejected += 1
            lb = res.lower_bound
            self.warn(f"crown: warning: {where}: no certificate: crown check would reject it "
                      f"({exc}); the engine's float64 bound there is {lb!r}")
            return None
        self.check_s += time.perf_counter() - t0
        self.written += 1
        self.bytes += os.path.getsize(path)
        return path

    def _model_layout(self, x0, index: int):
        """The image as the certificate holds it: in the ONNX model's own layout
        (``crown_cli.check.model_layout``). An ONNX chain of dense layers runs on the dense
        engine in crown's (H, W, C) order (its first layer's columns permuted alike: the
        same function of the same image); its x0 is the file's image transposed. None
        where the engine's image is neither."""
        from crown_cli import check as checker
        from crown_cli.check.images_reader import read_image

        if self.checker_net.input_shape is None:  # (NPZ, Keras: crown's own order)
            return x0
        x_file = read_image(self.images_path, index, self.labels_path)[0]
        x_model = checker.model_layout(self.checker_net, x_file)
        if np.array_equal(x0, x_model):
            return x0
        return x_model if np.array_equal(x0, x_file) else None

    def _arrays(self, x0, c, src_targets, proof, targets, eps):
        from crown_cli.check import ball_box

        lo, hi = ball_box(x0, eps)
        n_out = self.network["outputs"]
        out = {"x0": x0}
        rec = proof.get("record") if proof.get("kind") == "alpha" else None
        cols, layer = (np.zeros(0, np.int64), {}) if rec is None else self._layer_slopes(rec)
        for k, t in enumerate(targets):
            r = src_targets.index(t)
            A = np.zeros((1, n_out))
            A[0, c], A[0, t] = 1.0, -1.0
            case = dict(lo=lo, hi=hi, A=A, b=np.zeros(1), kind=np.zeros(1, np.int8),
                        arg=np.zeros(1, np.int64), value=np.full(1, np.nan),
                        refresh=np.ones(1, np.int16), alpha_at=np.full(1, -1, np.int64),
                        beta_at=np.full(1, -1, np.int64), cols=cols,
                        alpha=np.zeros((0, cols.size), np.float32),
                        beta=np.zeros((0, cols.size), np.float32))
            if rec is not None:
                al, lower, crown_lb = rec["margin"]
                if lower[r] >= crown_lb[r]:  # alpha-CROWN's bound, not CROWN's, was the larger
                    row = np.zeros((1, cols.size), np.float32)
                    for i, A_i in enumerate(al):
                        if A_i is not None and A_i.shape[1]:
                            row[0, self._pos(cols, i, rec["unst"][i])] = A_i[r]
                    case["alpha"], case["alpha_at"] = row, np.zeros(1, np.int64)
                case.update(layer)
            for name, a in case.items():
                out[f"c{k}_{name}"] = a
        return out

    def _pos(self, cols, i, unst):
        return np.searchsorted(cols, self.offsets[i] + np.asarray(unst, np.int64))

    def _layer_slopes(self, rec):
        """cols (every unstable neuron, flat) and the layer-slope arrays of the record."""
        unst = rec["unst"]
        cols = np.concatenate([self.offsets[i] + np.asarray(u, np.int64)
                               for i, u in enumerate(unst)]).astype(np.int64)
        out = {}
        for k, (rows, alphas, capL, capU) in sorted(rec.get("layers", {}).items()):
            n = len(rows)
            keep = ~(capL & capU)  # both of CROWN's bounds kept: default slopes (left out)
            if not keep.any():
                continue
            ck = int(np.sum(cols < self.offsets[k]))
            S = np.zeros((2 * n, ck), np.float32)
            for i, A_i in enumerate(alphas):
                if A_i is None or not A_i.shape[1]:
                    continue
                pos = self._pos(cols, i, unst[i])
                S[:, pos] = A_i
                l, u = rec["bounds"][i]
                default = np.where(u[unst[i]] >= -l[unst[i]], 1.0, 0.0).astype(np.float32)
                # a row whose CROWN bound was kept: CROWN's slopes at the bounds below
                S[np.ix_(np.flatnonzero(capL), pos)] = default
                S[np.ix_(n + np.flatnonzero(capU), pos)] = default
            sel = np.concatenate([np.flatnonzero(keep), n + np.flatnonzero(keep)])
            out[f"slopes_k{k + 1}_rows"] = (self.offsets[k] + np.asarray(rows)[keep]).astype(np.int64)
            out[f"slopes_k{k + 1}"] = S[sel]
        return cols, out

    def summary(self) -> str:
        return (f"crown: {self.written} certificates written to {self.folder} "
                f"({self.bytes / 1e6:.2f} MB, checked in {self.check_s:.1f} s)"
                + (f"; {self.rejected} rows without one (crown check would reject)"
                   if self.rejected else ""))


