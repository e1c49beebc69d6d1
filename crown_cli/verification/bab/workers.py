"""A second process for branch and bound's rounds: :class:`Helper`.

A search whose rounds bound hundreds of boxes at a time (input splitting) can give half of
each round to another process, which runs the same function on it while this process runs
the other half: on two cores a round then takes about half the time. The helper is forked,
so it starts with everything the search holds (network, property, compiled kernels) and only
the boxes and what becomes of them cross the pipe; like every forked child it runs the graph
kernels' serial twins (:func:`crown_cli.engine.kernels.use_serial_kernels`). Nothing it
returns is trusted more than this process's own work: it runs the same code on the same
float64 arrays.

The helper ignores SIGINT (Ctrl-C is this process's to handle) and ends when it is closed,
when the pipe closes, or with this process (it is a daemon).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import warnings
from typing import Callable

from crown_cli.engine.threads import one_thread


class HelperLost(RuntimeError):
    """The helper process ended before it answered."""


def can_fork() -> bool:
    """True where a helper can be forked and a second core is there for it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores >= 2 and "fork" in multiprocessing.get_all_start_methods()


def _serve(conn, fn: Callable, single: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # single: its own core, on one thread (the caller runs its half on one thread too)
    with one_thread() if single else contextlib.nullcontext():
        _answer(conn, fn)


def _answer(conn, fn: Callable) -> None:
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            break
        if args is None:
            break
        try:
            out = fn(*args)
        except Exception as error:  # noqa: BLE001 - handed back to the caller, raised there
            out = error
        conn.send(out)


class Helper:
    """A forked process that runs ``fn(*args)`` for each ``send(args)``; ``recv()`` returns
    the result (or raises what ``fn`` raised, or :class:`HelperLost`). One call at a time.
    ``single``: it runs on one thread (numba's and BLAS's)."""

    def __init__(self, fn: Callable, single: bool = False):
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, fn, single), daemon=True)
        with warnings.catch_warnings():  # Python 3.12+: fork of a process with BLAS threads
            warnings.simplefilter("ignore", DeprecationWarning)
            self.proc.start()
        child.close()

    def send(self, args: tuple) -> None:
        try:
            self.conn.send(args)
        except (OSError, ValueError) as error:
            raise HelperLost(str(error)) from None

    def poll(self) -> bool:
        """True when an answer (or the end of the pipe) is waiting."""
        try:
            return self.conn.poll()
        except (OSError, ValueError):
            return True  # recv() reports it

    def recv(self):
        try:
            out = self.conn.recv()
        except (EOFError, OSError) as error:
            raise HelperLost(str(error) or "the helper process ended") from None
        if isinstance(out, BaseException):
            raise out
        return out

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(1.0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(1.0)
        try:
            self.conn.close()
        except OSError:  # its descriptor already gone (a close at interpreter exit)
            pass
