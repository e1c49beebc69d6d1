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
``A y <= b`` of that case (b rounded down where the decimal is no float). One line per sat row (``ok`` or ``FAILED``), then a summary; exit
code 1 when a row failed. ``--root``: the directory the instance paths are relative to
(default: the result file's ``.json`` sidecar's instance list directory, else the CSV's).
"""
from __future__ import annotations

import argparse
import csv
import json
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
    return m


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
    with open(args.results, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["verdict"] == "sat"]
    for r in rows:
        n += 1
        onnx_path = os.path.join(root, r["onnx"])
        if onnx_path not in models:
            models[onnx_path] = float64_model(onnx_path)
        x = np.array([float(v) for v in r["counterexample"].split()])
        y = outputs(models[onnx_path], x)
        prop = parse_vnnlib(os.path.join(root, r["vnnlib"]), x.size, y.size)
        # the exact set: the floats inside the real box, right-hand sides rounded down
        hits = [j for j, c in enumerate(prop.cases)
                if np.all((x >= c.exact()[0]) & (x <= c.exact()[1]))
                and np.all(c.A @ y <= c.exact()[2])]
        ok = bool(hits)
        failed += not ok
        worst = min(float(np.max(c.A @ y - c.b)) for c in prop.cases)
        print(f"{'ok' if ok else 'FAILED'} {r['instance']}: case {hits[0] if hits else '-'}, "
              f"max(A y - b) = {worst:.6g} (float64 onnx.reference)")
    print(f"{n} sat rows, {n - failed} confirmed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
