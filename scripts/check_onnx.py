"""Check crown's ONNX loader against onnx's reference evaluator on every ``.onnx`` file.

Usage (from the repository root; needs the ``onnx`` package)::

    python scripts/check_onnx.py DIR_OR_FILE [DIR_OR_FILE ...] [--inputs N] [--seed S]

For each ``.onnx`` file found (recursively) it loads the model with
``crown_cli.io.networks.load_network`` (a graph; a chain of dense layers is checked in its
dense form, the MLP the dense engine runs),
draws ``N`` random input vectors (uniform in [-1, 1]), evaluates them with the network's
``forward`` (float64) and with ``onnx.reference.ReferenceEvaluator`` on the graph itself (one
input per run, in the graph's dtype), and prints one line per file: ``ok`` with the layer sizes
and activation (an MLP) or the node count (a graph) and the largest difference, ``MISMATCH``
when the outputs differ by more than rtol 1e-5 (atol 1e-5 times the largest output magnitude,
at least 1e-5: the files compute in float32), or ``REFUSED`` with the loader's message. A
summary line follows; the exit code is 1 if any file failed, 2 if none was found.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

RTOL = 1e-5
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # this checkout's crown_cli, not another installed one


def find_onnx(paths):
    found = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                found += [os.path.join(root, f) for f in files if f.lower().endswith(".onnx")]
        elif p.lower().endswith(".onnx"):
            found.append(p)
    return sorted(found)


def check_file(path, n_inputs, seed):
    """(status, detail) for one file: status ok, MISMATCH or REFUSED."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    from crown_cli.errors import InputError
    from crown_cli.graph.onnx_file import graph_feeds
    from crown_cli.io.networks import load_network
    from crown_cli.network import MLP

    try:
        net = load_network(path, min_outputs=1)
    except InputError as exc:
        return "REFUSED", str(exc)
    net = getattr(net, "dense", None) or net  # the MLP of a chain (older checkouts: net)
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(n_inputs, net.input_size))
    ref = ReferenceEvaluator(onnx.load(path))
    order = net.input_order if isinstance(net, MLP) else None
    expected = np.stack([np.concatenate([np.asarray(y, dtype=np.float64).reshape(-1)
                                         for y in ref.run(None, feed)])
                         for feed in graph_feeds(path, x, order)])
    mine = net.forward(x)
    diff = float(np.max(np.abs(mine - expected))) if mine.shape == expected.shape else np.inf
    atol = RTOL * max(1.0, float(np.max(np.abs(expected))))
    if isinstance(net, MLP):
        out = f" -> {net.output_activation}" if net.output_activation else ""
        what = f"{'-'.join(map(str, net.sizes))} {net.activation}{out}"
    else:
        what = f"graph of {len(net.nodes)} nodes"
    detail = f"{what}, max |diff| {diff:.2e} over {n_inputs} inputs"
    ok = mine.shape == expected.shape and np.allclose(mine, expected, rtol=RTOL, atol=atol)
    return ("ok" if ok else "MISMATCH"), detail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="directories (searched recursively) or .onnx files")
    ap.add_argument("--inputs", type=int, default=20, help="random inputs per file (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    files = find_onnx(args.paths)
    if not files:
        print("no .onnx files found", file=sys.stderr)
        return 2
    counts = {"ok": 0, "MISMATCH": 0, "REFUSED": 0}
    for path in files:
        status, detail = check_file(path, args.inputs, args.seed)
        counts[status] += 1
        print(f"{status:<8} {path}: {detail}", flush=True)
    print(f"{len(files)} files: {counts['ok']} ok, {counts['MISMATCH']} mismatched, "
          f"{counts['REFUSED']} refused")
    return 0 if counts["ok"] == len(files) else 1


if __name__ == "__main__":
    sys.exit(main())
