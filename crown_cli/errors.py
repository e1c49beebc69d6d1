"""Errors raised for bad user input; the CLI turns them into one-line messages and exit code 2."""
import os


class InputError(Exception):
    """A problem with a user-supplied file or option.

    The message must name the file (or option) and the problem in one line.
    """


def read_header(path: str, kind: str, nbytes: int = 8) -> bytes:
    """First bytes of an existing regular file, or an InputError naming it ('model', 'image')."""
    if not os.path.exists(path):
        raise InputError(f"{path}: {kind} file not found")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a {kind} file")
    try:
        with open(path, "rb") as fh:
            return fh.read(nbytes)
    except OSError as exc:
        raise InputError(f"{path}: cannot read {kind} file ({exc.strerror})") from None


def interrupted(exc: BaseException) -> bool:
    """Is ``exc`` a Ctrl-C in disguise? A SIGINT that arrives while a numba kernel runs comes
    back as ``SystemError: ... returned a result with an exception set`` whose context is the
    KeyboardInterrupt; per-row error handlers re-raise it as the interrupt it is."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
