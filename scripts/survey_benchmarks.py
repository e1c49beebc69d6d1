#!/usr/bin/env python3
"""Which VNN-COMP benchmarks crown reads, and what it says on their first instances.

    python scripts/survey_benchmarks.py --root BENCHMARKS [--timeout 30] [--per-net 1]
        [--networks 3] [--output survey.csv]

BENCHMARKS holds one folder per benchmark, each with the competition's ``instances.csv``
(paths relative to the folder; ``.gz`` suffixes are dropped, so unpack the files first).
For every network the list names: ``crown inspect --model`` in a subprocess (loads, or the
one-line error, or ``missing`` for a file that is not there or is a Git LFS pointer); then
``crown verify --instances`` on the first ``--per-net`` instances of the first ``--networks``
networks that load, with ``--timeout`` as a cap on each instance's own timeout. One CSV row
per network (benchmark, network, loads, error, verdicts) and a summary per benchmark on
stdout. docs/benchmarks.md ("Every 2022-2024 benchmark") was made with it.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile


def _networks(folder):
    """(network, [instance rows]) in the order the list names them."""
    nets = {}
    with open(os.path.join(folder, "instances.csv"), newline="") as fh:
        for row in csv.reader(fh):
            if len(row) < 3:
                continue
            row = [c.strip().removesuffix(".gz") for c in row]
            nets.setdefault(row[0], []).append(row)
    return list(nets.items())


def _missing(path):
    if not os.path.isfile(path):
        return True
    with open(path, "rb") as fh:
        return fh.read(40).startswith(b"version https://git-lfs")


def _inspect(path, limit):
    try:
        r = subprocess.run([sys.executable, "-m", "crown_cli", "inspect", "--model", path],
                           capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return "no", f"inspect took over {limit} s"
    if r.returncode == 0:
        return "yes", ""
    lines = r.stderr.strip().splitlines()
    return "no", (lines[-1] if lines else f"exit code {r.returncode}").replace(path + ": ", "")


def _verify(folder, rows, timeout):
    """{instance row's (onnx, vnnlib): verdict} of one crown verify --instances run."""
    with tempfile.TemporaryDirectory() as tmp:
        lst, out = os.path.join(tmp, "list.csv"), os.path.join(tmp, "out.csv")
        with open(lst, "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
        subprocess.run([sys.executable, "-m", "crown_cli", "verify", "--instances", lst,
                        "--root", folder, "--timeout", str(timeout), "--output", out],
                       capture_output=True, text=True,
                       timeout=len(rows) * (timeout + 120))
        if not os.path.exists(out):
            return {}
        with open(out, newline="") as fh:
            return {(r["onnx"], r["vnnlib"]): f"{r['verdict']} ({float(r['time_s']):.1f} s)"
                    for r in csv.DictReader(fh)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--per-net", type=int, default=1)
    ap.add_argument("--networks", type=int, default=3)
    ap.add_argument("--inspect-limit", type=float, default=300.0)
    ap.add_argument("--output", default="survey.csv")
    a = ap.parse_args()
    with open(a.output, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["benchmark", "network", "loads", "error", "verdicts"])
        for bench in sorted(os.listdir(a.root)):
            folder = os.path.join(a.root, bench)
            if not os.path.isfile(os.path.join(folder, "instances.csv")):
                continue
            loaded, rows = [], []
            for net, inst in _networks(folder):
                path = os.path.join(folder, net)
                loads, err = ("missing", "") if _missing(path) else _inspect(path, a.inspect_limit)
                rows.append([bench, net, loads, err])
                if loads == "yes" and len(loaded) < a.networks:
                    loaded += inst[:a.per_net]
            verdicts = _verify(folder, loaded, a.timeout) if loaded else {}
            for row in rows:
                mine = [v for (o, _), v in verdicts.items() if o == row[1]]
                w.writerow(row + ["; ".join(mine)])
            fh.flush()
            counts = {k: sum(r[2] == k for r in rows) for k in ("yes", "no", "missing")}
            errors = sorted({r[3] for r in rows if r[2] == "no"})
            print(f"{bench}: {len(rows)} networks, {counts['yes']} load, {counts['no']} refused,"
                  f" {counts['missing']} missing; first instances: "
                  f"{', '.join(verdicts.values()) or '-'}"
                  + (f"; refused: {errors[0]}" if errors else ""), flush=True)


if __name__ == "__main__":
    main()
