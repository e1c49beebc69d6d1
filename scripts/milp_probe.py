"""HiGHS MILP on VNN-LIB instances of a dense ReLU network: a cross-check and a measurement,
not a verifier (the solver's tolerances make its answer no proof; `crown verify` never uses
it).

For each chosen instance (its first input box and its first output row ``A y <= b``) this
builds the big-M MILP of the network over the box, with every hidden neuron's bounds from
the engine's batched CROWN (:func:`crown_cli.engine.dense_boxes.batch_lower_bounds`), and
minimises ``A_0 y - b_0``: above 0 means the property most likely holds. It prints the
minimum, HiGHS's dual bound, its node count and the time, single-threaded.

    OPENBLAS_NUM_THREADS=1 python scripts/milp_probe.py \\
        ../shared/data/vnncomp2024/safenlp_medical/instances.csv 2 106 127

(row numbers of the instance list, counted from 0). docs/bab.md has what it showed.
"""
from __future__ import annotations

import argparse
import csv
import os
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from crown_cli.engine.dense_boxes import BatchNet, batch_lower_bounds
from crown_cli.io.networks import load_network
from crown_cli.io.vnnlib import parse_vnnlib


def margin_milp(weights, biases, lo, hi, a_row, b0, time_limit):
    """min over [lo, hi] of a_row . f(x) - b0 for a ReLU MLP f, by HiGHS's MILP."""
    _, info = batch_lower_bounds(BatchNet(weights, biases), lo[None], hi[None], a_row[None])
    bounds = [(l[0], u[0]) for l, u in info["bounds"]]
    d = lo.size
    sizes = [w.shape[0] for w in weights[:-1]]
    nvar = d + 2 * sum(sizes)  # x, then per hidden layer its values a and indicators s
    M = lil_matrix((3 * sum(sizes), nvar))
    rlo, rhi = [], []
    vlo, vhi = list(lo), list(hi)
    prev, at, row = np.arange(d), d, 0
    for k, n in enumerate(sizes):
        l, u = bounds[k]
        a = np.arange(at, at + n)
        s = a + n
        vlo += [0.0] * n + [0.0] * n
        vhi += list(np.maximum(u, 0.0)) + [1.0] * n
        for j in range(n):
            # a >= z;  a <= z - l (1 - s);  a <= u s
            M[row, a[j]] = 1.0
            M[row, prev] = -weights[k][j]
            rlo.append(biases[k][j])
            rhi.append(np.inf)
            M[row + 1, a[j]] = 1.0
            M[row + 1, prev] = -weights[k][j]
            M[row + 1, s[j]] = -l[j]
            rlo.append(-np.inf)
            rhi.append(biases[k][j] - l[j])
            M[row + 2, a[j]] = 1.0
            M[row + 2, s[j]] = -max(u[j], 0.0)
            rlo.append(-np.inf)
            rhi.append(0.0)
            row += 3
        prev, at = a, at + 2 * n
    cost = np.zeros(nvar)
    cost[prev] = a_row @ weights[-1]
    integ = np.zeros(nvar)
    for k, n in enumerate(sizes):
        start = d + 2 * sum(sizes[:k]) + n
        integ[start:start + n] = 1
    t = time.perf_counter()
    res = milp(cost, constraints=LinearConstraint(M.tocsr(), rlo, rhi), integrality=integ,
               bounds=Bounds(vlo, vhi), options={"time_limit": time_limit})
    shift = float(a_row @ biases[-1] - b0)
    value = None if res.x is None else float(res.fun + shift)
    dual = getattr(res, "mip_dual_bound", None)
    return value, None if dual is None else float(dual + shift), \
        getattr(res, "mip_node_count", None), time.perf_counter() - t, res.message


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instances", help="instances.csv (onnx,vnnlib,timeout)")
    ap.add_argument("rows", nargs="+", type=int, help="row numbers (from 0)")
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    base = os.path.dirname(os.path.abspath(args.instances))
    table = list(csv.reader(open(args.instances)))
    for r in args.rows:
        onnx_path, spec, _ = table[r][:3]
        net = load_network(os.path.join(base, onnx_path), min_outputs=1)
        prop = parse_vnnlib(os.path.join(base, spec), net.input_size, net.num_classes)
        case = prop.cases[0]
        A = np.atleast_2d(case.A)
        value, dual, nodes, secs, msg = margin_milp(net.weights, net.biases, case.lo, case.hi,
                                                    A[0], float(np.ravel(case.b)[0]),
                                                    args.time_limit)
        print(f"{spec}: min {value}, dual bound {dual}, nodes {nodes}, {secs:.1f} s ({msg})",
              flush=True)


if __name__ == "__main__":
    main()
