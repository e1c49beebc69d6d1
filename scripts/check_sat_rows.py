"""Re-check every ``sat`` row of a ``crown verify --instances`` result file against the ONNX
model itself, in float64, with onnx's reference evaluator.

Usage (from the repository root; needs the ``onnx`` package)::

    python scripts/check_sat_rows.py RESULTS.csv [--root DIR]

For each row whose verdict is ``sat``: the counterexample (the row's ``counterexample``
column, X values in VNN-LIB order) must lie inside the input box of some case of the row's
VNN-LIB property (the real box of its decimals: ``Case.exact()``, the floats inside it), and
the model's outputs at it, computed by
``onnx.reference.ReferenceEvaluator`` on a float64 copy of the model (every float32
initializer, constant and tensor type widened to float64), must satisfy every row
``A y <= b`` of that case (b rounded down where the decimal is no float). An input the case
pins to a decimal no float holds must be written as that decimal (crown confirmed the
violation there by a float64-verified bound); the reference evaluator then runs at its
nearest float. Models below opset 15 are converted to 15 first (the reference evaluator's
opset-9 BatchNormalization uses batch statistics). One line per sat row (``ok`` or
``FAILED``), then a summary; exit
code 1 when a row failed. ``--root``: the directory the instance paths are relative to
(default: the result file's ``.json`` sidecar's instance list directory, else the CSV's).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # this checkout's crown_cli


def float64_model(path):
    """The ONNX model at ``path`` with float32 initializers, constants and types as float64."""
    import onnx
    from onnx import TensorProto, numpy_helper

    m = onnx.load(path)
    g = m.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).astype(np.float64), init.name))
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64),
                                                     a.t.name))
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    opset = max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 15:  # the reference evaluator's opset-9 BatchNormalization uses batch statistics
        from onnx import version_converter

        try:
            m = version_converter.convert_version(m, 15)
        except Exception:  # noqa: BLE001 - keep the file's opset when it does not convert
            pass
    return m


def _in_case(tokens, x, c) -> bool:
    """Whether the counterexample lies in case c's real box: an input the case pins to a
    decimal no float holds (``Case.pinned``) must be written as that decimal; the others
    must be floats inside the real box (``Case.exact()``)."""
    from fractions import Fraction

    lo, hi, _ = c.exact()
    pinned = c.pinned or {}
    for i, (t, v) in enumerate(zip(tokens, x)):
        if i in pinned:
            if Fraction(t) != pinned[i]:
                return False
        elif not lo[i] <= v <= hi[i]:
            return False
    return True


def outputs(model, x):
    from onnx.reference import ReferenceEvaluator

    consts = {i.name for i in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in consts]
    feeds, at = {}, 0
    for inp in ins:
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in inp.type.tensor_type.shape.dim]
        size = int(np.prod(shape))
        feeds[inp.name] = np.asarray(x[at:at + size], np.float64).reshape(shape)
        at += size
    outs = ReferenceEvaluator(model).run(None, feeds)
    return np.concatenate([np.asarray(o, np.float64).reshape(-1) for o in outs])


def main(argv=None) -> int:
    from crown_cli.io.vnnlib import parse_vnnlib

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--root", default=None)
    args = ap.parse_args(argv)
    root = args.root or os.path.dirname(os.path.abspath(args.results))
    models, failed, n = {}, 0, 0
    csv.field_size_limit(sys.maxsize)  # a counterexample of 10k inputs is one long field
    with open(args.results, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["verdict"] == "sat"]
    for r in rows:
        n += 1
        onnx_path = os.path.join(root, r["onnx"])
        if onnx_path not in models:
            models[onnx_path] = float64_model(onnx_path)
        tokens = r["counterexample"].split()
        x = np.array([float(v) for v in tokens])
        y = outputs(models[onnx_path], x)
        prop = parse_vnnlib(os.path.join(root, r["vnnlib"]), x.size, y.size)
        # the exact set: the real box, right-hand sides rounded down
        hits = [j for j, c in enumerate(prop.cases)
                if _in_case(tokens, x, c) and np.all(c.A @ y <= c.exact()[2])]
        ok = bool(hits)
        failed += not ok
        worst = min(float(np.max(c.A @ y - c.b)) for c in prop.cases)
        pinned = " at the nearest floats of its pinned decimals" if hits and \
            prop.cases[hits[0]].pinned else ""
        print(f"{'ok' if ok else 'FAILED'} {r['instance']}: case {hits[0] if hits else '-'}, "
              f"max(A y - b) = {worst:.6g} (float64 onnx.reference{pinned})")
    print(f"{n} sat rows, {n - failed} confirmed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
