"""Result rows: the columns, exact float formatting, and reading a result CSV back.

Writing (CSV or JSON Lines, one flushed row at a time, resumable) is in :mod:`crown_cli.io.result_files`.
"""
from __future__ import annotations

import csv
import math


COLUMNS = (
    "image", "label", "predicted", "target", "target_type", "norm", "method", "eps", "time_s",
    "evaluations", "status", "margin", "lower_bound", "search", "precision", "rtol",
    "attack_eps", "attack_time_s",
)

# Statuses of rows that did not finish: they make `crown certify` exit with code 3.
FAILED_STATUSES = ("error", "timeout")


def check_last_line(path: str, last: bytes) -> None:
    """InputError when a result file's last byte ``last`` (b"" for an empty file) does not end
    a line: rows are written whole, so its last row was cut (a killed run)."""
    from crown_cli.errors import InputError

    if last and last != b"\n":
        raise InputError(f"{path}: last line is incomplete (a killed run); finish it with "
                         "crown certify --resume first")


def format_value(value) -> str:
    """Exact text for floats (repr round-trips, so a verified eps is never rounded up)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def read_rows(path: str) -> list:
    """Rows of a result CSV as dicts of strings (for tests and reports)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))
