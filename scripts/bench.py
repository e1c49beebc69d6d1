"""Benchmark: per-image certification time and bound evaluations.

Default case (issue 2): MNIST 3x[1024] ReLU (models/mnist_3x1024.h5), l_inf, runner-up target,
the first 20 correctly classified shipped MNIST test images, both cores. Also times a warm
``crown certify`` of one image end to end (start-up included).

    python scripts/bench.py [--model models/mnist_3x1024.h5] [--images N] [--norm inf]
                            [--search interp] [--compare-bisect] [--no-cli]

The published implementation takes about 0.5 s/image on this 2-core machine with ~12 bound
evaluations (reference-setup.md); the ratio printed is against that figure.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from crown_cli.certify import Certifier  # noqa: E402
from crown_cli.images import load_images  # noqa: E402
from crown_cli.model_io import load_model  # noqa: E402
from crown_cli.targets import select_all  # noqa: E402

PUBLISHED_S_PER_IMAGE = 0.5


def run_case(mlp, x, y, n, norm, method, search, rtol, precision="mixed"):
    cert = Certifier(mlp.weights, mlp.biases, mlp.activation, norm=norm, method=method,
                     search=search, rtol=rtol, precision=precision)
    sel = select_all(cert.logits(x))
    cert.certify(x[0], sel[0]["predicted"], [sel[0]["runner-up"]])  # warm-up (JIT cache load)
    times, evals, eps = [], [], []
    for i in range(x.shape[0]):
        if len(times) == n:
            break
        if sel[i]["predicted"] != y[i]:
            continue
        res = cert.certify(x[i], sel[i]["predicted"], [sel[i]["runner-up"]])
        times.append(res.time_s)
        evals.append(res.evaluations)
        eps.append(res.eps)
    return np.array(times), np.array(evals), np.array(eps)


def report(label, times, evals, eps):
    print(f"{label:<28} images {len(times):3d}  mean {times.mean():.4f} s/image  "
          f"median {statistics.median(times):.4f}  evaluations {evals.mean():5.2f}  "
          f"mean eps {eps.mean():.6f}  speed-up vs published {PUBLISHED_S_PER_IMAGE / times.mean():.1f}x")


def warm_cli_seconds(model):
    cmd = [sys.executable, "-m", "crown_cli", "certify", "--model", model, "-n", "1", "-q"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(cmd, env=env, capture_output=True, check=True)  # make sure the cache is warm
    best = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        best.append(time.perf_counter() - t)
    return min(best), statistics.median(best)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "mnist_3x1024.h5"))
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--norm", default="inf")
    ap.add_argument("--method", default="crown")
    ap.add_argument("--search", default="interp")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--precision", default="mixed", choices=["mixed", "float64"])
    ap.add_argument("--compare-bisect", action="store_true", help="also run plain bisection")
    ap.add_argument("--no-cli", action="store_true", help="skip the warm-CLI timing")
    args = ap.parse_args()

    mlp = load_model(args.model)
    x, y = load_images(None)
    print(f"model {os.path.relpath(args.model, ROOT)} ({'-'.join(map(str, mlp.sizes))}, {mlp.activation}), "
          f"norm {args.norm}, method {args.method}, runner-up target, rtol {args.rtol}, "
          f"{os.cpu_count()} cores")
    t, e, eps = run_case(mlp, x, y, args.images, args.norm, args.method, args.search, args.rtol,
                         args.precision)
    report(f"{args.method}/{args.search}/{args.precision}", t, e, eps)
    if args.compare_bisect:
        # the plain reference: float64 bisection to 1e-5
        tb, eb, epsb = run_case(mlp, x, y, args.images, args.norm, args.method, "bisect", 1e-5,
                                "float64")
        report(f"{args.method}/bisect/float64 rtol 1e-5", tb, eb, epsb)
        rel = np.abs(eps - epsb) / epsb
        print(f"max relative eps difference to the plain bisection {rel.max():.2e}, "
              f"time ratio {tb.mean() / t.mean():.2f}x")
    if not args.no_cli:
        best, med = warm_cli_seconds(args.model)
        print(f"warm `crown certify -n 1` wall-clock: best {best:.2f} s, median {med:.2f} s")


if __name__ == "__main__":
    main()
