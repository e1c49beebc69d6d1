"""Write models/cifar_base_kw.onnx: VNN-COMP 2021 oval21's cifar_base_kw.onnx with its input
normalisation put in front, so that it takes crown's image scaling.

The oval21 networks (Wong and Kolter's convex outer adversarial polytope training, l_inf eps
2/255 on CIFAR-10) expect normalised inputs, ``(pixel / 255 - mean_c) / 0.225`` per channel
with mean (0.485, 0.456, 0.406), outside the graph: the benchmark's VNN-LIB boxes are in that
scale (their widths are 2 eps / 0.225 and they end at (1 - mean_c) / 0.225). crown's images
are ``pixel / 255 - 0.5``, so the shipped model starts with ``Sub (mean_c - 0.5)`` and
``Div 0.225`` (constants; the graph loader keeps them as an affine node). Its radii are then in
crown's pixel scale (``pixel / 255``), comparable with the training eps 2/255 = 0.0078.

    python scripts/make_oval21_model.py [--vnncomp ../shared/data/vnncomp2021]
"""
import argparse
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN = (0.485, 0.456, 0.406)
STD = 0.225


def with_normalisation(model):
    """``model`` (one input (1, 3, H, W)) preceded by (x - (MEAN - 0.5)) / STD."""
    g = model.graph
    old = g.input[0].name
    new = "image"  # crown scale: pixel / 255 - 0.5
    shift = numpy_helper.from_array(
        (np.array(MEAN) - 0.5).reshape(1, 3, 1, 1).astype(np.float32), "norm_shift")
    scale = numpy_helper.from_array(np.array(STD, dtype=np.float32), "norm_scale")
    nodes = [helper.make_node("Sub", [new, "norm_shift"], ["norm_centred"]),
             helper.make_node("Div", ["norm_centred", "norm_scale"], [old])]
    inp = onnx.ValueInfoProto()
    inp.CopyFrom(g.input[0])
    inp.name = new
    graph = helper.make_graph(nodes + list(g.node), g.name, [inp], list(g.output),
                              [shift, scale] + list(g.initializer))
    out = helper.make_model(graph, opset_imports=model.opset_import,
                            producer_name="crown-cli scripts/make_oval21_model.py")
    out.ir_version = model.ir_version
    onnx.checker.check_model(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vnncomp", default=os.path.join(ROOT, "..", "shared", "data", "vnncomp2021"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "cifar_base_kw.onnx"))
    args = ap.parse_args()
    src = os.path.join(args.vnncomp, "oval21", "nets", "cifar_base_kw.onnx")
    onnx.save(with_normalisation(onnx.load(src)), args.out)
    print(f"{src} -> {args.out}")


if __name__ == "__main__":
    main()
