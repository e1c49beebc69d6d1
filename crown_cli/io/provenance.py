"""Provenance sidecar ``<output>.json`` of a result file, and the checks built on it.

The sidecar records what produced the rows: the model's and images' SHA-256, every option, the
rows and images the file covers, and per run (a resumed file has several) the kernels used
(numba or numpy), versions, thread counts, host and start/end times. It is written
atomically (temporary file, then ``os.replace``) when a run starts and again when it ends.
``--resume`` and ``merge`` compare the ``settings`` block (everything that can change a row's
values) and refuse a mismatch.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys
from typing import Dict, List, Optional

from crown_cli.errors import InputError

SIDECAR_VERSION = 1
# Options that do not change the rows' values (file names are compared by content hash).
# --kernels changes only the order of float64 sums inside the bounds (the kernels used are
# recorded per run, "kernels"), which may move an eps within --rtol.
# --memory-budget only chunks a graph bound's rows (the same bounds, up to the order of sums).
# --proof (certify) only writes certificates beside the rows.
# --workers: certify's images in one or two processes (the same rows); verify's branch and
# bound shared with a second process (the same search, at another speed).
NOT_SETTINGS = {"--output", "--overwrite", "--resume", "--quiet", "--verbose", "--debug", "--model",
                "--images", "--labels", "--start", "--num-images", "--shard", "--kernels",
                "--memory-budget", "--proof", "--workers"}
# Options renamed so that one name means one thing in every command (issue 24): sidecars written
# before keep the old names; they are read under the new ones, so --resume and merge still match.
RENAMED = {"certify": {"--seed": "--target-seed"},
           "verify": {"--seed": "--attack-seed", "--method": "--stages"}}
COVERAGE = ("--start", "--num-images", "--shard")
THREAD_ENV = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "BLIS_NUM_THREADS")


def sidecar_path(output: str) -> str:
    return output + ".json"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _jsonable(value):
    """JSON round trip, so values compare equal to what a sidecar file gives back."""
    return json.loads(json.dumps(value))


def option_values(ctx) -> Dict[str, object]:
    """Every option of the click command as {'--long-name': value}."""
    out = {}
    for p in ctx.command.params:
        if p.name not in ctx.params or p.name.startswith("deprecated_"):
            continue  # a deprecated spelling: its value is recorded under the new name
        longs = [o for o in getattr(p, "opts", []) if o.startswith("--")]
        out[longs[0] if longs else p.name] = ctx.params[p.name]
    return _jsonable(out)


def settings_of(options: Dict[str, object], model_sha: str, images_sha: str,
                labels_sha: Optional[str], activation: str, alpha) -> Dict[str, object]:
    """The result-affecting settings: hashes of the inputs, then every option that changes rows."""
    s = {"model SHA-256": model_sha, "images SHA-256": images_sha, "labels SHA-256": labels_sha,
         "activation used": activation, "activation parameter": alpha}
    s.update({k: v for k, v in options.items() if k not in NOT_SETTINGS})
    return _jsonable(s)


def _version(module: str, dist: str) -> str:
    """The version of a loaded module, else of its installed distribution (without importing
    it: numba and scipy cost ~0.3 s each to import); 'unavailable' if neither is known."""
    loaded = sys.modules.get(module)
    if loaded is not None and hasattr(loaded, "__version__"):
        return str(loaded.__version__)
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unavailable"


def versions() -> Dict[str, str]:
    from crown_cli import __version__

    out = {"crown_cli": __version__, "python": platform.python_version()}
    for mod in ("numpy", "numba", "scipy", "onnx"):
        if mod == "onnx" and mod not in sys.modules:
            continue
        out[mod] = _version(mod, mod)
    return out


def threads() -> Dict[str, object]:
    """Thread counts: numba's, BLAS's (threadpoolctl), the thread env vars, the CPU count.

    numba's count is recorded only when numba is loaded or the numba kernels are selected
    (``crown.kernels_backend()``), which load it anyway; with the numpy kernels it is None,
    so that writing the sidecar does not import numba (~1 s of a short run).
    """
    from crown_cli.engine.kernels import kernels_backend

    info: Dict[str, object] = {"numba": None}
    if "numba" in sys.modules or kernels_backend() == "numba":
        try:
            import numba

            info["numba"] = int(numba.get_num_threads())
        except Exception:  # noqa: BLE001 - a thread count is informative only
            pass
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [{k: d.get(k) for k in ("internal_api", "num_threads", "version")}
                        for d in threadpool_info()]
    except Exception:  # noqa: BLE001 - threadpoolctl is optional; the env vars say the rest
        info["blas"] = None
    info["env"] = {k: os.environ[k] for k in THREAD_ENV if k in os.environ}
    info["cpu_count"] = os.cpu_count()
    return info


def new_run(rows_before: int) -> Dict[str, object]:
    from crown_cli.engine.kernels import kernels_backend

    return {"started": now(), "ended": None, "host": platform.node(), "pid": os.getpid(),
            "command": sys.argv[:], "rows_before": rows_before, "rows_written": 0,
            "skipped_rows": 0, "failed_rows": 0, "complete": False,
            "kernels": kernels_backend(), "versions": versions(), "threads": threads()}


def write_sidecar(path: str, data: Dict[str, object]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_sidecar(path: str, what: str) -> Dict[str, object]:
    """The sidecar of result file ``what``; InputError if missing or unreadable."""
    if not os.path.exists(path):
        raise InputError(f"{what}: no provenance sidecar {path} (needed to check the settings)")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read provenance sidecar ({exc})") from None
    if not isinstance(data, dict) or "settings" not in data:
        raise InputError(f"{path}: not a crown provenance sidecar (no 'settings')")
    return renamed_options(data)


def renamed_options(data: Dict[str, object]) -> Dict[str, object]:
    """``data`` (a sidecar) with option names of earlier versions under today's (RENAMED)."""
    renames = RENAMED.get(str(data.get("kind") or "certify"), {})
    for block in ("settings", "options"):
        old = data.get(block)
        if isinstance(old, dict) and any(k in old for k in renames):
            data[block] = {renames.get(k, k): v for k, v in old.items()}
    return data


def first_difference(expected: Dict[str, object], got: Dict[str, object]) -> Optional[str]:
    """'<setting>: <a> vs <b>' for the first key whose values differ, or None."""
    for key in list(expected) + [k for k in got if k not in expected]:
        a, b = expected.get(key, "(absent)"), got.get(key, "(absent)")
        if a != b:
            return f"{key} {json.dumps(a)} vs {json.dumps(b)}"
    return None


def check_resume(side: Dict[str, object], settings: Dict[str, object],
                 coverage: Dict[str, object], output: str) -> None:
    """Refuse to resume ``output`` if its settings or covered images differ from this run's."""
    diff = first_difference(side.get("settings", {}), settings)
    if diff is None:
        diff = first_difference(side.get("coverage", {}).get("options", {}), coverage["options"])
    if diff is not None:
        raise InputError(f"--resume: {output} was made with other settings: {diff} "
                         "(file vs this run); use the same options or another --output")


def coverage_of(options: Dict[str, object], indices: List[int]) -> Dict[str, object]:
    return {"options": {k: options.get(k) for k in COVERAGE}, "images": len(indices),
            "first_image": indices[0] if indices else None,
            "last_image": indices[-1] if indices else None}
