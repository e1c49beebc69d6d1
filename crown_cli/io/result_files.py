"""Batch work on result files: CSV/JSONL row writers, ``--resume``, ``--shard`` and ``merge``.

A result file is a CSV (header line, then one line per row) or a JSONL file (one JSON object
per line, keys as the CSV columns). Every row is written with a single ``write`` of one
complete line and flushed, so a killed run leaves at most one partial last line; resuming cuts
that line away before appending. The provenance sidecar lives in :mod:`crown_cli.io.provenance`.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from crown_cli.errors import InputError
from crown_cli.io.results import COLUMNS, format_value
from crown_cli.io.results import FAILED_STATUSES, check_last_line

FORMATS = ("csv", "jsonl")
EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl"}


def format_for(output: str, fmt: Optional[str]) -> str:
    """The result-file format of ``output``: ``fmt`` (--format) when given, else from the file
    name's extension (.jsonl: jsonl, anything else: csv). InputError when --format contradicts
    the extension (.csv or .jsonl)."""
    ext = os.path.splitext(output)[1].lower() if output != "-" else ""
    implied = EXTENSIONS.get(ext)
    if fmt is None:
        return implied or "csv"
    if fmt not in FORMATS:
        raise InputError(f"--format: unknown format '{fmt}' (choose from {', '.join(FORMATS)})")
    if implied is not None and implied != fmt:
        raise InputError(f"{output}: --format {fmt} but the name ends in {ext}; "
                         f"drop --format or name the file *.{fmt}")
    return fmt


def check_output(path: str, overwrite: bool = False, resume: bool = False,
                 resumable: bool = True, what: str = "output file") -> None:
    """Refuse, before anything is computed or written, an output ``path`` that cannot be
    written: a directory, an existing file without ``overwrite``/``resume``, a parent directory
    that does not exist or where no file can be created (a probe file is created and removed).
    '-' (stdout) is always fine."""
    if path == "-":
        return
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory; give a file name for the {what}")
    if os.path.exists(path) and not (overwrite or resume):
        raise InputError(f"{path}: {what} exists; pass --overwrite to replace it"
                         + (" or --resume to continue it" if resumable else ""))
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(f"{path}: output directory {parent} does not exist")
    probe = os.path.join(parent, f".{os.path.basename(path)}.probe{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise InputError(f"{path}: cannot create files in {parent} ({exc.strerror})") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


@dataclass(frozen=True)
class RowKind:
    """What the rows of one kind of result file are: `crown certify` rows (one per image and
    target) or `crown verify --instances` rows (one per instance)."""

    name: str
    columns: Tuple[str, ...]
    key_columns: Tuple[str, ...]  # the identity of a row within a file
    order_column: str  # integer column: merged files are sorted by it
    failed: Callable[[Dict[str, str]], bool]  # rows that make the command exit with code 3
    command: str  # the command that writes and resumes such files

    def key(self, row: Dict[str, object]) -> Tuple[str, ...]:
        return tuple(format_value(row.get(k)) for k in self.key_columns)


CERTIFY_ROWS = RowKind("certify", tuple(COLUMNS), ("image", "target_type", "target", "norm", "method"),
                       "image", lambda r: r.get("status") in FAILED_STATUSES, "crown certify")
VERIFY_COLUMNS = ("index", "instance", "onnx", "vnnlib", "timeout", "verdict", "time_s", "stage",
                  "margin", "cases", "cases_proven", "domains", "peak_domains", "counterexample")
VERIFY_ROWS = RowKind("verify", VERIFY_COLUMNS, ("index", "onnx", "vnnlib"), "index",
                      lambda r: r.get("verdict") == "error", "crown verify --instances")
ROW_KINDS = (CERTIFY_ROWS, VERIFY_ROWS)


def kind_of(path: str, columns: Sequence[str]) -> RowKind:
    """The kind of result file whose header (CSV) or keys (JSONL) are ``columns``."""
    for kind in ROW_KINDS:
        if all(c in columns for c in kind.key_columns):
            return kind
    raise InputError(f"{path}: line 1 is not a crown result header (neither certify nor verify rows)")


# --------------------------------------------------------------------------- shards


def parse_shard(spec: Optional[str]) -> Optional[Tuple[int, int]]:
    """'K/N' (1 <= K <= N) -> (K, N); None stays None."""
    if spec is None:
        return None
    parts = str(spec).strip().split("/")
    try:
        k, n = (int(p) for p in parts)
        if len(parts) != 2:
            raise ValueError
    except ValueError:
        raise InputError(f"--shard: expected K/N with whole numbers, e.g. 2/8, got '{spec}'") from None
    if not (n >= 1 and 1 <= k <= n):
        raise InputError(f"--shard: need 1 <= K <= N, got {k}/{n}")
    return k, n


def shard_indices(indices: Sequence[int], shard: Optional[Tuple[int, int]]) -> List[int]:
    """Round-robin split: the j-th selected image (j = 0, 1, ...) goes to shard K iff j % N == K-1."""
    indices = list(indices)
    if shard is None:
        return indices
    k, n = shard
    return [i for j, i in enumerate(indices) if j % n == k - 1]


# --------------------------------------------------------------------------- row lines


def _json_value(value):
    if value is None or value == "":
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
        value = value.item()
    return value


def csv_line(row: Dict[str, object], columns: Sequence[str] = COLUMNS) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([format_value(row.get(c)) for c in columns])
    return buf.getvalue()


def jsonl_line(row: Dict[str, object], columns: Sequence[str] = COLUMNS) -> str:
    # json writes floats with repr, which round-trips exactly (a verified eps is never rounded)
    return json.dumps({c: _json_value(row.get(c)) for c in columns}, separators=(",", ":")) + "\n"


@contextlib.contextmanager
def _sigint_held():
    """SIGINT noted, not acted on, inside the block, and handled as before when it ends (in
    the main thread; elsewhere nothing is held). A handler swap, not a signal mask: any
    other thread (numba's, BLAS's) may be the one the signal is delivered to."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if got and callable(previous):
            previous(signal.SIGINT, got[0])  # Python's own handler: KeyboardInterrupt
        elif got and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


class RowWriter:
    """Writes rows as CSV or JSONL to ``path`` ('-': stdout), one flushed line per row.

    ``append=True`` continues an existing file (after :func:`read_for_resume` has cut any
    partial last line away); a CSV header is written only into an empty file.
    """

    def __init__(self, path: str, fmt: str = "csv", overwrite: bool = False, append: bool = False,
                 columns: Sequence[str] = COLUMNS):
        if fmt not in FORMATS:
            raise InputError(f"--format: unknown format '{fmt}' (choose from {', '.join(FORMATS)})")
        self.path, self.fmt, self.columns = path, fmt, tuple(columns)
        self._line = csv_line if fmt == "csv" else jsonl_line
        if path == "-":
            self._fh, self._close = sys.stdout, False
            self._raw = False
            empty = True
        else:
            check_output(path, overwrite, append)
            try:
                # unbuffered binary: each row reaches the file in one write() of a whole line
                self._fh = open(path, "ab" if append else "wb", buffering=0)
            except OSError as exc:
                raise InputError(f"{path}: cannot open for writing ({exc.strerror})") from None
            self._close, self._raw = True, True
            empty = self._fh.tell() == 0
        if fmt == "csv" and empty:
            self._write(csv_line(dict(zip(self.columns, self.columns)), self.columns))

    def _write(self, text: str) -> None:
        if self._raw:
            data = text.encode("utf-8")
            while data:
                n = self._fh.write(data)
                data = data[n:]
        else:
            self._fh.write(text)
            self._fh.flush()

    def write(self, row: Dict[str, object]) -> None:
        self._write(self._line(row, self.columns))

    def close(self) -> None:
        if self._close:
            self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------- reading files


def detect_format(path: str, first_line: str) -> str:
    return "jsonl" if first_line.lstrip().startswith("{") else "csv"


def parse_rows(path: str, text: str, fmt: Optional[str] = None, kind: Optional[RowKind] = None):
    """(format, columns, rows as dicts of text, row lines) of a complete result file's ``text``.

    Values are normalised to the CSV text form (JSON null -> '', numbers via repr), so rows of
    either format compare equal. Raises InputError naming the first line that does not parse.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return fmt or "csv", list((kind or CERTIFY_ROWS).columns), [], []
    fmt = fmt or detect_format(path, lines[0])
    rows: List[Dict[str, str]] = []
    if fmt == "csv":
        columns = next(csv.reader([lines[0]]))
        kind_of(path, columns)
        for n, line in enumerate(lines[1:], start=2):
            try:
                values = next(csv.reader([line]))
            except (csv.Error, StopIteration):
                values = None
            if values is None or len(values) != len(columns):
                raise InputError(f"{path}: line {n} is malformed (expected {len(columns)} fields)")
            rows.append(dict(zip(columns, values)))
    else:
        columns = None
        for n, line in enumerate(lines, start=1):
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError
            except ValueError:
                raise InputError(f"{path}: line {n} is not a JSON object") from None
            if columns is None:
                columns = list(obj)
            elif list(obj) != columns:
                raise InputError(f"{path}: line {n} has keys {list(obj)}, expected {columns}")
            rows.append({k: format_value(v) for k, v in obj.items()})
        kind_of(path, columns)
    return fmt, columns, rows, (lines[1:] if fmt == "csv" else lines)


def read_for_resume(path: str, fmt: str, cut: bool = True,
                    kind: RowKind = CERTIFY_ROWS) -> List[Dict[str, str]]:
    """Rows already in ``path``; a partial last line (a run killed mid-write) is cut off the file
    (unless ``cut`` is False: then the file is only read).

    Refuses a file in another format or with other columns than this version writes.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read for --resume ({exc.strerror})") from None
    end = data.rfind(b"\n") + 1
    try:
        text = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 result file, cannot --resume it") from None
    rows: List[Dict[str, str]] = []
    if text:
        found, columns, rows, _ = parse_rows(path, text, kind=kind)
        if found != fmt:
            raise InputError(f"{path}: the file is {found} but --format is {fmt}; cannot --resume it")
        if tuple(columns) != tuple(kind.columns):
            raise InputError(f"{path}: columns {','.join(columns)} differ from this version's "
                             f"{','.join(kind.columns)}; cannot --resume it")
    if cut and end < len(data):  # only once the whole rows parse: cut the partial line of a killed run
        with open(path, "r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())
    return rows


def read_result_file(path: str):
    """(format, columns, rows, row lines) of a finished result file."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: result file not found")
    with open(path, "rb") as fh:
        data = fh.read()
    check_last_line(path, data[-1:])
    try:
        return parse_rows(path, data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 result file") from None


def count_failed(rows: Sequence[Dict[str, str]], kind: RowKind = CERTIFY_ROWS) -> int:
    return sum(bool(kind.failed(r)) for r in rows)


def duplicate_key(rows: Sequence[Dict[str, object]], kind: RowKind = CERTIFY_ROWS):
    seen = set()
    for r in rows:
        k = kind.key(r)
        if k in seen:
            return k
        seen.add(k)
    return None


def write_lines_atomic(path: str, fmt: str, columns: Sequence[str], lines: Sequence[str]) -> None:
    """Write a header (CSV) and complete row lines to ``path`` via a temporary file + os.replace."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        if fmt == "csv":
            fh.write(csv_line(dict(zip(columns, columns)), columns))
        for line in lines:
            fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- certify runs


def data_sha256(x, y) -> str:
    """SHA-256 of the loaded images (float64) and labels (int64), whatever their file format."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    h.update(np.ascontiguousarray(x, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class OutputFile:
    """Where a run's rows go: ``path`` ('-': stdout) in format ``fmt``, and whether an existing
    file is replaced (``--overwrite``) or continued (``--resume``)."""

    path: str
    fmt: str
    overwrite: bool = False
    resume: bool = False


class ResultJob:
    """The output side of one run writing result rows (to ``out``): resume checks, sidecar,
    bookkeeping.

    ``settings`` are the result-affecting settings (hashes of the inputs included): a resumed
    file must have been made with the same; ``inputs`` is recorded in the sidecar as it is.
    Construct it after all inputs are checked; it raises InputError (before touching any file)
    when ``--resume`` finds other settings. :meth:`open` then cuts a partial last line, opens
    the writer and writes the sidecar; :meth:`finish` rewrites the sidecar with the end time.
    """

    def __init__(self, options: Dict[str, object], out: OutputFile, settings: Dict[str, object],
                 inputs: Dict[str, object], coverage: Dict[str, object],
                 kind: RowKind = CERTIFY_ROWS):
        from crown_cli.io import provenance as pv

        output, fmt, overwrite, resume = out.path, out.fmt, out.overwrite, out.resume

        if fmt not in FORMATS:
            raise InputError(f"--format: unknown format '{fmt}' (choose from {', '.join(FORMATS)})")
        if resume and overwrite:
            raise InputError("--resume: cannot be combined with --overwrite (choose one)")
        if resume and output == "-":
            raise InputError("--resume: needs an --output file, not stdout")
        self.kind = kind
        self.output, self.fmt, self.overwrite = output, fmt, overwrite
        self.sidecar = None if output == "-" else pv.sidecar_path(output)
        self.append = bool(resume and os.path.exists(output))
        # every check on the output before the first file (the sidecar) is written
        check_output(output, overwrite, resume)
        if self.sidecar is not None and os.path.isdir(self.sidecar):
            raise InputError(f"{self.sidecar}: is a directory; the provenance sidecar of "
                             f"{output} goes there")
        self.done: Dict[tuple, Dict[str, object]] = {}  # key -> the row a resumed file holds
        self.rows_before = self.failed_before = 0
        # rows written, failed rows among them and rows skipped by this run, counted as they
        # happen (a run stopped by Ctrl-C has no summary, but its sidecar must be true)
        self.written = self.failed_written = self.skipped = 0
        self.data: Dict[str, object] = {}
        if self.sidecar is None:
            return
        previous_runs: List[Dict[str, object]] = []
        if self.append:
            side = pv.read_sidecar(self.sidecar, output)
            pv.check_resume(side, settings, coverage, output)
            previous_runs = list(side.get("runs", []))
        self.data = {
            "crown_result_sidecar": pv.SIDECAR_VERSION,
            "output": os.path.basename(output),
            "format": fmt,
            "kind": kind.name,
            "complete": False,
            **inputs,
            "settings": settings,
            "coverage": coverage,
            "options": options,
            "rows": 0,
            "failed_rows": 0,
            "runs": previous_runs,
        }

    def open(self) -> RowWriter:
        from crown_cli.io import provenance as pv

        if self.append:
            rows = read_for_resume(self.output, self.fmt, kind=self.kind)
            dup = duplicate_key(rows, self.kind)
            if dup is not None:
                raise InputError(f"{self.output}: row {dup} appears twice; cannot --resume it")
            self.done = {self.kind.key(r): r for r in rows}
            self.rows_before, self.failed_before = len(rows), count_failed(rows, self.kind)
        if self.sidecar is not None:  # before the rows: a result file never lacks its sidecar
            self.run = pv.new_run(self.rows_before)
            self.data["runs"].append(self.run)
            self.data["rows"], self.data["failed_rows"] = self.rows_before, self.failed_before
            pv.write_sidecar(self.sidecar, self.data)
        return RowWriter(self.output, self.fmt, overwrite=self.overwrite, append=self.append,
                         columns=self.kind.columns)

    def skip(self, key) -> Optional[Dict[str, object]]:
        """The row with this key that the resumed file already holds (as read: text values),
        or None (the row is to be computed)."""
        found = self.done.get(key)
        self.skipped += found is not None
        return found

    def counting(self, write: Callable[[Dict[str, object]], None]):
        """``write``, counting the rows (and failed rows) it has written. Ctrl-C is held
        back while a row is written and counted (it takes effect right after), so that the
        count the sidecar and the resume hint give is the file's."""
        def counted(row: Dict[str, object]) -> None:
            with _sigint_held():
                write(row)
                self.written += 1
                self.failed_written += bool(self.kind.failed(row))

        return counted

    def rows_present(self) -> int:
        """Rows a resumed file already holds (0 for a new file); reads, writes nothing."""
        return (len(read_for_resume(self.output, self.fmt, cut=False, kind=self.kind))
                if self.append else 0)

    def finish(self, summary, complete: bool) -> int:
        """Rewrite the sidecar with the end time and counts; return the number of failed rows."""
        from crown_cli.io import provenance as pv

        written = self.written if summary is None else summary.rows
        failed_now = self.failed_written if summary is None else summary.failed
        failed = self.failed_before + failed_now
        if self.sidecar is not None:
            self.run.update(ended=pv.now(), rows_written=written, complete=complete,
                            skipped_rows=self.skipped if summary is None else summary.skipped,
                            failed_rows=failed_now)
            self.data.update(complete=complete, rows=self.rows_before + written, failed_rows=failed)
            pv.write_sidecar(self.sidecar, self.data)
        return failed


class OutputJob(ResultJob):
    """The output side of one ``crown certify`` run (see :class:`ResultJob`)."""

    def __init__(self, options: Dict[str, object], out: OutputFile, model_path: str, mlp,
                 images_path: Optional[str], x, y, indices: Sequence[int]):
        from crown_cli.io import provenance as pv

        settings, inputs, coverage = {}, {}, {}
        if out.path != "-" and out.fmt in FORMATS:
            model_sha = pv.file_sha256(model_path)
            settings = pv.settings_of(options, model_sha, data_sha256(x, y), None,
                                      mlp.activation, mlp.alpha)
            settings.pop("labels SHA-256")  # the data hash covers the labels
            coverage = pv.coverage_of(options, list(indices))
            inputs = {"model": {"path": os.path.abspath(model_path), "sha256": model_sha},
                      "images": {"path": os.path.abspath(images_path) if images_path
                                 else "shipped MNIST", "count": int(len(y))}}
        super().__init__(options, out, settings, inputs, coverage, CERTIFY_ROWS)


# --------------------------------------------------------------------------- merge


def merge_files(parts: Sequence[str], output: str, overwrite: bool = False) -> Dict[str, object]:
    """Merge finished part files (``--shard`` runs) into ``output`` in image order.

    Refuses parts whose sidecars disagree on the settings (model hash included), that are
    incomplete, that overlap in rows, or that differ in format or columns. Returns the merged
    sidecar dict (also written beside ``output`` unless it is '-').
    """
    from crown_cli.io import provenance as pv

    if not parts:
        raise InputError("merge: no part files given")
    if len(set(map(os.path.abspath, parts))) != len(parts):
        raise InputError("merge: a part file is listed twice")
    if output != "-":
        if any(os.path.abspath(output) == os.path.abspath(p) for p in parts):
            raise InputError(f"{output}: the merged output cannot be one of the parts")
        check_output(output, overwrite, resumable=False)
    first = None
    owner: Dict[tuple, str] = {}
    keyed: List[Tuple[int, int, str]] = []  # (image, position, line)
    part_info: List[Dict[str, object]] = []
    runs: List[Dict[str, object]] = []
    failed = 0
    for part in parts:
        fmt, columns, rows, lines = read_result_file(part)
        kind = kind_of(part, columns)
        side = pv.read_sidecar(pv.sidecar_path(part), part)
        if not side.get("complete"):
            raise InputError(f"{part}: the run that wrote it did not finish; complete it with "
                             f"{kind.command} --resume first")
        if side.get("rows") != len(rows):
            raise InputError(f"{part}: holds {len(rows)} rows but its sidecar records "
                             f"{side.get('rows')}; the file was changed after the run")
        if first is None:
            first = (part, fmt, columns, side)
        else:
            if fmt != first[1]:
                raise InputError(f"{part}: is {fmt} but {first[0]} is {first[1]}")
            if list(columns) != list(first[2]):
                raise InputError(f"{part}: columns differ from those of {first[0]}")
            diff = pv.first_difference(first[3]["settings"], side["settings"])
            if diff is not None:
                raise InputError(f"{part}: made with other settings than {first[0]}: {diff}")
        for r, line in zip(rows, lines):
            k = kind.key(r)
            if k in owner:
                where = "twice in it" if owner[k] == part else f"also in {owner[k]}"
                raise InputError(f"{part}: row ({', '.join(kind.key_columns)}) = "
                                 f"{k} is {where}; parts must not overlap")
            owner[k] = part
            try:
                image = int(r[kind.order_column])
            except ValueError:
                raise InputError(f"{part}: {kind.order_column} '{r[kind.order_column]}' is not "
                                 "an index") from None
            keyed.append((image, len(keyed), line))
        failed += count_failed(rows, kind)
        part_info.append({"file": os.path.abspath(part), "sha256": pv.file_sha256(part),
                          "rows": len(rows), "coverage": side.get("coverage")})
        runs.extend(dict(run, part=os.path.basename(part)) for run in side.get("runs", []))
    keyed.sort()  # image order; within an image the rows keep the order they were written in
    _, fmt, columns, side0 = first
    merged = {
        "crown_result_sidecar": pv.SIDECAR_VERSION,
        "output": os.path.basename(output),
        "format": fmt,
        "complete": True,
        "model": side0.get("model"),
        "images": side0.get("images"),
        **{k: side0[k] for k in ("kind", "instances") if k in side0},
        "settings": side0["settings"],
        "coverage": {"merged_from": part_info, "images": len({k[0] for k in keyed})},
        "rows": len(keyed),
        "failed_rows": failed,
        "merged": {"at": pv.now(), "command": sys.argv[:], "versions": pv.versions()},
        "runs": runs,
    }
    gap = missing_shards(merged)
    if gap is not None:  # each part's run finished ("complete"), but not every shard is here
        merged["coverage"]["shards_missing"] = gap
    if output == "-":
        if fmt == "csv":
            sys.stdout.write(csv_line(dict(zip(columns, columns)), columns))
        for _, _, line in keyed:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    else:
        write_lines_atomic(output, fmt, columns, [line for _, _, line in keyed])
        pv.write_sidecar(pv.sidecar_path(output), merged)
    return merged


def missing_shards(merged: Dict[str, object]) -> Optional[str]:
    """A note when the parts are shards K/N of one run but some K are missing, else None."""
    covs = [p.get("coverage") or {} for p in merged["coverage"]["merged_from"]]
    opts = [c.get("options") or {} for c in covs]
    specs = [o.get("--shard") for o in opts]
    if not specs or any(s is None for s in specs):
        return None
    ns = {int(s.split("/")[1]) for s in specs}
    same_range = len({(o.get("--start"), o.get("--num-images")) for o in opts}) == 1
    if len(ns) != 1 or not same_range:
        return None
    n = ns.pop()
    missing = sorted(set(range(1, n + 1)) - {int(s.split("/")[0]) for s in specs})
    if not missing:
        return None
    return f"shards {', '.join(f'{k}/{n}' for k in missing)} are not among the parts"
