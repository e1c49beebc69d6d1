"""Result rows: a CSV table written one flushed row at a time."""
from __future__ import annotations

import csv
import math
import os
import sys
from typing import Dict

from .errors import InputError

COLUMNS = (
    "image", "label", "predicted", "target", "target_type", "norm", "method", "eps", "time_s",
    "evaluations", "status", "margin", "lower_bound", "search", "precision", "rtol",
    "attack_eps", "attack_time_s",
)


def format_value(value) -> str:
    """Exact text for floats (repr round-trips, so a verified eps is never rounded up)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


class CsvWriter:
    """Writes COLUMNS rows to ``path`` ('-' for stdout), flushing after every row."""

    def __init__(self, path: str, overwrite: bool = False):
        self.path = path
        if path == "-":
            self._fh = sys.stdout
            self._close = False
        else:
            if os.path.exists(path) and not overwrite:
                raise InputError(f"{path}: output file exists; pass --overwrite to replace it")
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise InputError(f"{path}: output directory {parent} does not exist")
            try:
                self._fh = open(path, "w", newline="", encoding="utf-8")
            except OSError as exc:
                raise InputError(f"{path}: cannot open for writing ({exc.strerror})") from None
            self._close = True
        self._writer = csv.writer(self._fh, lineterminator="\n")
        self._writer.writerow(COLUMNS)
        self._fh.flush()

    def write(self, row: Dict[str, object]) -> None:
        self._writer.writerow([format_value(row.get(c)) for c in COLUMNS])
        self._fh.flush()

    def close(self) -> None:
        if self._close:
            self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_rows(path: str) -> list:
    """Rows of a result CSV as dicts of strings (for tests and reports)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))
