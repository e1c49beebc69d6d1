"""Deadlines inside the engine: a computation given a ``deadline`` (``time.monotonic()``
seconds, None: no limit) raises :class:`DeadlineExceeded` at its next check past it, so a
caller's ``--timeout`` holds within one check's work (the bound passes check before each
node of the graph, the optimisers before each step)."""
import time


class DeadlineExceeded(Exception):
    """A computation ran past its deadline (``time.monotonic()``)."""


def check_deadline(deadline) -> None:
    """Raise :class:`DeadlineExceeded` if ``deadline`` (or None: no limit) has passed."""
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded()
