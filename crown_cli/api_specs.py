"""The Python API's argument checks: an input vector (:func:`as_input`), and
:func:`crown_cli.verify`'s spec arguments (its stages, and a property given as a VNN-LIB path,
a tuple (lo, hi, A, b), a list of them or a parsed Property)."""
from __future__ import annotations

import os

from crown_cli.errors import InputError


def as_input(x, d: int, name: str = "x"):
    """x as a contiguous float64 vector of d finite values, or an InputError."""
    import numpy as np

    if np.iscomplexobj(x):  # (numpy would drop the imaginary parts with a warning only)
        raise InputError(f"{name}: expected real numbers, got complex values")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name}: expected an array of numbers") from None
    if arr.size != d:
        raise InputError(f"{name}: has {arr.size} values (shape {arr.shape}) but the model "
                         f"expects {d} inputs")
    arr = np.ascontiguousarray(arr.reshape(-1))
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{name}: contains NaN or infinite values")
    return arr


def _stages(method, choices) -> tuple:
    parts = method.split(",") if isinstance(method, str) else method
    try:
        parts = [str(p).strip().lower() for p in parts]
    except TypeError:
        raise InputError(f"method: expected a string or a sequence of stages, got "
                         f"{method!r}") from None
    out = []
    for part in parts:
        if part not in choices:
            raise InputError(f"method: unknown stage '{part}' (choose from {', '.join(choices)})")
        if part not in out:
            out.append(part)
    if not out:
        raise InputError(f"method: no stage given (choose from {', '.join(choices)})")
    return tuple(out)


def _property(spec, n_inputs: int, n_outputs: int):
    """The spec as a parsed Property of a network with these sizes."""
    from crown_cli.io.vnnlib import Property, parse_vnnlib

    if isinstance(spec, (str, os.PathLike)):
        # the CLI's Loader.property
        return parse_vnnlib(os.fspath(spec), n_inputs, n_outputs)
    if isinstance(spec, Property):
        from crown_cli.verification.pipeline import check_sizes

        check_sizes(spec, n_inputs, n_outputs, "spec")
        return spec
    if isinstance(spec, tuple):
        cases, single = [spec], True
    elif isinstance(spec, list):
        cases, single = spec, False
        if not cases:
            raise InputError("spec: an empty list of cases")
    else:
        raise InputError(f"spec: expected a VNN-LIB path, a tuple (lo, hi, A, b), a list of "
                         f"them or a Property, got {type(spec).__name__}")
    out = [_case(c, "spec" if single else f"spec case {k}", n_inputs, n_outputs)
           for k, c in enumerate(cases)]
    return Property(n_inputs, n_outputs, out)


def _case(case, where: str, n_inputs: int, n_outputs: int):
    """(lo, hi, A, b) checked and converted to a vnnlib Case."""
    import numpy as np

    from crown_cli.io.vnnlib import Case

    if not isinstance(case, tuple) or len(case) != 4:
        raise InputError(f"{where}: expected a tuple (lo, hi, A, b), got "
                         + (f"a tuple of {len(case)} items" if isinstance(case, tuple)
                            else type(case).__name__))
    lo = as_input(case[0], n_inputs, f"{where}: lo")
    hi = as_input(case[1], n_inputs, f"{where}: hi")
    bad = np.flatnonzero(lo > hi)
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{where}: lo > hi at input {i} ({float(lo[i])!r} > {float(hi[i])!r})")
    try:
        A = np.asarray(case[2], dtype=np.float64)
        b = np.asarray(case[3], dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where}: A and b must be arrays of numbers") from None
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2 or A.shape[1] != n_outputs:
        raise InputError(f"{where}: A has shape {A.shape}; expected (m, {n_outputs}) "
                         f"for a network with {n_outputs} outputs")
    b = b.reshape(-1) if b.ndim <= 1 else b
    if b.shape != (A.shape[0],):
        raise InputError(f"{where}: b has shape {np.shape(case[3])}; expected "
                         f"({A.shape[0]},), one value per row of A")
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(b))):
        raise InputError(f"{where}: A and b must be finite (no NaN or infinite values)")
    return Case(lo, hi, np.ascontiguousarray(A), np.ascontiguousarray(b))
