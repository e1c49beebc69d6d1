"""`crown verify`'s file side: instance lists, loading networks and properties, result rows.

An instance list is the competition's CSV: one line per instance, ``onnx,vnnlib,timeout``
(paths relative to ``--root``, by default the list's own directory). Each instance becomes one
row of :data:`crown_cli.io.result_files.VERIFY_COLUMNS`.
"""
from __future__ import annotations

import csv
import hashlib
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from crown_cli.errors import InputError, interrupted


@dataclass
class Instance:
    index: int  # 0-based line of the instance list
    onnx: str  # as written in the list
    vnnlib: str
    timeout: float
    root: str

    @property
    def name(self) -> str:
        return f"{os.path.splitext(os.path.basename(self.onnx))[0]}:" \
               f"{os.path.splitext(os.path.basename(self.vnnlib))[0]}"

    def path(self, which: str) -> str:
        p = getattr(self, which)
        return p if os.path.isabs(p) else os.path.join(self.root, p)


def read_instances(path: str, root: Optional[str] = None) -> List[Instance]:
    """The instances of a competition CSV; InputError naming file and line for a bad line."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: instance list not found")
    root = root if root is not None else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(root):
        raise InputError(f"--root: {root} is not a directory")
    out: List[Instance] = []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            lines = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: cannot read instance list ({exc})") from None
    for n, fields in enumerate(lines, start=1):
        if not fields or all(not f.strip() for f in fields) or fields[0].lstrip().startswith("#"):
            continue
        if len(fields) != 3:
            raise InputError(f"{path}: line {n}: expected onnx,vnnlib,timeout, got {len(fields)} fields")
        onnx_file, spec, t = (f.strip() for f in fields)
        try:
            timeout = float(t)
        except ValueError:
            raise InputError(f"{path}: line {n}: timeout '{t}' is not a number") from None
        if not timeout > 0 or not np.isfinite(timeout):
            raise InputError(f"{path}: line {n}: timeout must be > 0, got {t}")
        out.append(Instance(len(out), onnx_file, spec, timeout, root))
    if not out:
        raise InputError(f"{path}: no instances")
    return out


def instances_sha256(path: str, instances: Sequence[Instance]) -> str:
    """One hash over the list and every file it names (missing files count as such)."""
    from crown_cli.io.provenance import file_sha256

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read())
    seen = set()
    for inst in instances:
        for p in (inst.path("onnx"), inst.path("vnnlib")):
            if p in seen:
                continue
            seen.add(p)
            h.update(p.encode())
            h.update(file_sha256(p).encode() if os.path.isfile(p) else b"missing")
    return h.hexdigest()


_WARMED: set = set()  # (verifier type, activation) whose kernels this process has loaded


def warm_up(verifier) -> float:
    """Load the kernels ``verifier`` can call (its ``warm_up``: graphs, dense chains), once
    per verifier type, activation and process, before an instance's clock starts: on a cold
    numba cache the first call of each kernel compiles it (seconds each), which no deadline
    check can interrupt. Returns the seconds it took, which the callers leave out of the
    instance's time and timeout."""
    kind = (type(verifier), getattr(verifier, "activation", None))
    if kind in _WARMED or not hasattr(verifier, "warm_up"):
        return 0.0
    t0 = time.perf_counter()
    verifier.warm_up()
    _WARMED.add(kind)
    return time.perf_counter() - t0


class Loader:
    """Networks and properties of instances, loaded once each (small LRU caches)."""

    def __init__(self, size: int = 8):
        self._models: "OrderedDict[str, object]" = OrderedDict()
        self._props: "OrderedDict[tuple, object]" = OrderedDict()
        self.size = size

    def _cached(self, cache, key, make):
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        value = make()
        cache[key] = value
        while len(cache) > self.size:
            cache.popitem(last=False)
        return value

    def verifier(self, model_path: str, **options):
        """The verifier of a network file, any number of outputs
        (:func:`~crown_cli.verification.graph_verifier.graph_verifier`: the dense engine's
        :class:`~crown_cli.verification.pipeline.Verifier` for a chain of dense layers, a
        graph lowered to one, else the graph engine's). ``options['memory_budget']`` (GiB,
        optional) goes to :func:`~crown_cli.io.networks.load_network`, the rest to the
        verifier."""
        from crown_cli.io.networks import load_network
        from crown_cli.verification.graph_verifier import graph_verifier

        def make():
            opts = dict(options)
            budget = opts.pop("memory_budget", None)  # GiB, for graphs (--memory-budget)
            net = load_network(model_path, min_outputs=1, memory_budget=budget)
            return graph_verifier(net, **opts)

        return self._cached(self._models, (model_path, tuple(sorted(options.items()))), make)

    def property(self, spec_path: str, n_inputs: int, n_outputs: int):
        from crown_cli.io.vnnlib import parse_vnnlib

        return self._cached(self._props, (spec_path, n_inputs, n_outputs),
                            lambda: parse_vnnlib(spec_path, n_inputs, n_outputs))


def counterexample_text(x: Optional[np.ndarray], exact: Optional[dict] = None) -> str:
    """The X values of a counterexample, space-separated, each exact (repr round-trips; an
    input in ``exact``, pinned to a decimal no float holds, as that decimal)."""
    if x is None:
        return ""
    from crown_cli.io.vnnlib import decimal_text

    exact = exact or {}
    return " ".join(decimal_text(exact[i]) if i in exact else repr(float(v))
                    for i, v in enumerate(x))


def verify_row(inst: Instance, verdict=None, error: Optional[str] = None,
               time_s: float = 0.0, timeout: Optional[float] = None) -> Dict[str, object]:
    row = {"index": inst.index, "instance": inst.name, "onnx": inst.onnx, "vnnlib": inst.vnnlib,
           "timeout": timeout if timeout is not None else inst.timeout}
    if verdict is None:
        row.update(verdict="error", time_s=time_s, stage=error or "")
        return row
    row.update(verdict=verdict.result, time_s=time_s, stage=verdict.stage,
               margin=verdict.margin, cases=verdict.cases, cases_proven=verdict.cases_proven,
               domains=verdict.domains, peak_domains=verdict.peak_domains,
               counterexample=counterexample_text(verdict.x, getattr(verdict, "exact", None)))
    return row


@dataclass
class VerifySummary:
    counts: Counter = field(default_factory=Counter)
    rows: int = 0
    skipped: int = 0
    failed: int = 0
    time_s: float = 0.0
    errors: List[str] = field(default_factory=list)

    def line(self, wall_s: float, output: str) -> str:
        dest = "stdout" if output == "-" else output
        parts = ", ".join(f"{self.counts.get(v, 0)} {v}"
                          for v in ("unsat", "sat", "unknown", "timeout", "error"))
        return (f"crown: {self.rows} instances: {parts}; {self.time_s:.1f} s in instances, "
                f"{wall_s:.1f} s total -> {dest}"
                + (f"; {self.skipped} instances already there (resumed)" if self.skipped else ""))


def run_instances(instances: Sequence[Instance], write: Callable[[Dict[str, object]], None],
                  skip: Callable[[tuple], bool], key: Callable[[Dict[str, object]], tuple],
                  timeout_cap: Optional[float] = None, progress: bool = True,
                  verifier_options: Optional[dict] = None,
                  log: Optional[Callable[[str], None]] = None,
                  warn: Optional[Callable[[str], None]] = None,
                  proof_dir: Optional[str] = None) -> VerifySummary:
    """Verify each instance in order and hand one row per instance to ``write``.

    A bad network or property file fails only its own instance (verdict ``error``, the message
    in the summary's errors); the run goes on. A property's warnings (an empty input box) go
    to ``warn``, once per instance. ``proof_dir``: the certificate of each unsat verdict is
    written there (:func:`~crown_cli.verification.proof.proof_name`).
    """
    loader = Loader()
    summary = VerifySummary()
    options = verifier_options or {}
    bar = _Progress(len(instances), progress, log)
    try:
        for inst in instances:
            probe = verify_row(inst)
            if skip(key(probe)):
                summary.skipped += 1
                bar.update(1)
                continue
            timeout = inst.timeout if timeout_cap is None else min(inst.timeout, timeout_cap)
            t0 = time.perf_counter()
            try:
                v = loader.verifier(inst.path("onnx"), **options)
                t0 += warm_up(v)
                prop = loader.property(inst.path("vnnlib"), v.n_inputs, v.n_outputs)
                for message in prop.warnings if warn is not None else ():
                    warn(message)  # names the property file
                verdict = v.verify(prop, max(0.0, timeout - (time.perf_counter() - t0)),
                                   log=log, status=bar.status if bar.bar is not None else None)
                row = verify_row(inst, verdict, time_s=time.perf_counter() - t0, timeout=timeout)
                if proof_dir is not None:
                    from crown_cli.verification.proof import proof_name, write_verdict_proof

                    why = write_verdict_proof(verdict, v, inst.path("onnx"), inst.path("vnnlib"),
                                              os.path.join(proof_dir, proof_name(inst)))
                    if why and warn is not None:
                        warn(f"{inst.name}: {why}")
            except InputError as exc:
                summary.errors.append(f"{inst.name}: {exc}")
                row = verify_row(inst, None, "input error", time.perf_counter() - t0, timeout)
            except Exception as exc:  # noqa: BLE001 - one instance's bug must not end the run
                if interrupted(exc):
                    raise KeyboardInterrupt from exc
                summary.errors.append(f"{inst.name}: internal error: {type(exc).__name__}: {exc}")
                row = verify_row(inst, None, "internal error", time.perf_counter() - t0, timeout)
            write(row)
            if log is not None:
                note = f"; {verdict.note}" if row["verdict"] != "error" and verdict.note else ""
                log(f"crown: {inst.name}: {row['verdict']} ({row['stage']}{note}) in "
                    f"{row['time_s']:.2f} s")
            summary.rows += 1
            summary.time_s += row["time_s"]
            summary.counts[row["verdict"]] += 1
            summary.failed += row["verdict"] == "error"
            bar.update(1)
            bar.set_postfix_str(" ".join(f"{k}={summary.counts[k]}" for k in
                                         ("unsat", "sat", "unknown", "timeout", "error")
                                         if summary.counts[k]))
    finally:
        bar.close()
    return summary


class _Progress:
    """A tqdm bar on a terminal (instances done, verdict counts, the running branch and
    bound's status), else nothing."""

    def __init__(self, total: int, enabled: bool, log):
        from crown_cli.io.progress import terminal_bar

        self.counts = ""
        self.bar = terminal_bar(enabled and log is None, total=total, unit="inst",
                                desc="verify")

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_postfix_str(self, text: str) -> None:
        self.counts = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def status(self, text: str) -> None:
        """The running instance's branch and bound status after the verdict counts."""
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.counts} | {text}" if self.counts else text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
