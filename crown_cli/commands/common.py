"""What every ``crown`` command shares: the one-line error and its exit codes, the
``--debug`` wrapper, deprecated option spellings, comma-separated option lists, and running a
result-file job with Ctrl-C handling."""
from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from typing import List

import click

from crown_cli.errors import InputError


class CrownError(click.ClickException):
    """A one-line error with exit code 2 (bad input) or 1 (internal error)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None):
        click.echo(f"crown: error: {self.format_message()}", err=True)


# Exit code of a run stopped by Ctrl-C (SIGINT): 128 + 2, what a shell reports.
EXIT_INTERRUPTED = 130

# Exit code when stdout's reader has gone (`crown ... | head -1`): 128 + SIGPIPE, what a shell
# reports for a Unix tool killed by the signal.
EXIT_BROKEN_PIPE = 141


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush of the
    buffered stdout cannot fail again ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests' CliRunner)
        pass


def _handle_errors(fn):
    """Turn InputError into a one-line message and exit code 2 (``--debug``: after its
    traceback); any other exception into a one-line internal error, exit code 1 (``--debug``:
    raised, with its traceback)."""

    @click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
    @functools.wraps(fn)
    def wrapper(*args, debug=False, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            if debug:  # the traceback, then the same message and exit code 2 (bad input)
                traceback.print_exc()
            raise CrownError(str(exc)) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C before any row was written (see _run_job for after)
            click.echo("crown: interrupted", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:  # the reader of stdout has gone: stop quietly
            _stdout_to_devnull()
            raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
        except Exception as exc:  # a bug: keep it short unless asked
            if debug:
                raise
            raise CrownError(
                f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)",
                exit_code=1,
            ) from None

    return wrapper


def _deprecated(old: str, new: str, dest: str, **option_kw):
    """Keep the spelling ``old`` of option ``new`` (parameter ``dest``) working, hidden from
    --help, with a deprecation note on stderr; giving both is refused. The value is recorded
    under ``new`` (the sidecar's options)."""
    hidden = "deprecated_" + dest

    def decorate(fn):
        @click.option(old, hidden, default=None, hidden=True, **option_kw)
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            value = kwargs.pop(hidden)
            ctx = click.get_current_context()
            ctx.params.pop(hidden, None)
            if value is not None:
                source = ctx.get_parameter_source(dest)
                if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
                    raise InputError(f"{old}: is the old spelling of {new}; give only {new}")
                click.echo(f"crown: warning: {old} is deprecated in crown {ctx.info_name}; "
                           f"use {new}", err=True)
                kwargs[dest] = ctx.params[dest] = value
            return fn(*args, **kwargs)

        return wrapper

    return decorate


def _split(value: str, option: str, choices) -> List[str]:
    out = []
    for part in str(value).split(","):
        part = part.strip().lower()
        if part not in choices:
            raise InputError(f"{option}: unknown value '{part}' (choose from {', '.join(choices)})")
        if part not in out:
            out.append(part)
    return out


# Largest --eps0 / --max-eps: radii far beyond any image's size (inputs lie in [-0.5, 0.5]),
# and far from where the bounds' float32 and float64 products overflow (about 1e150 on the
# shipped networks: --eps0 1e200 gave eps 0.0 after 400 evaluations).
MAX_RADIUS = 1e30


def memory_budget_option(fn):
    """``--memory-budget GB`` (GiB, 2**30 bytes) of a command that loads graph networks."""
    return click.option(
        "--memory-budget", type=float, default=None, metavar="GB",
        help="Graph networks: the most memory (GiB) a weight may take as float64 and a CROWN "
             "bound may hold (rows are back-substituted in chunks that fit); a graph whose "
             "bound cannot fit is refused before anything is allocated. Default 4.")(fn)


def check_memory_budget(value) -> None:
    if value is not None and not value > 0:
        raise InputError(f"--memory-budget: must be > 0 (GiB), got {value}")


def _run_job(job, run, what: str, output: str, quiet: bool) -> None:
    """Open ``job``'s writer, ``run(write)`` -> summary, finish the sidecar even if the run
    raised, report failed rows and the summary line; exit 3 when rows failed."""
    t0 = time.perf_counter()
    summary = None
    interrupted = False
    writer = job.open()  # checks a resumed file's rows; raises before anything is written
    try:
        with writer:
            summary = run(job.counting(writer.write))
    except KeyboardInterrupt:  # Ctrl-C: the rows written stay; the sidecar says how many
        interrupted = True
    finally:
        failed = job.finish(summary, complete=summary is not None)
    if interrupted:
        def count(n):
            return f"{n} finished {what}" + ("" if n == 1 else "s")

        if output == "-":
            click.echo(f"crown: interrupted after {count(job.written)}", err=True)
        else:
            click.echo(f"crown: interrupted; {output} holds {count(job.rows_before + job.written)}"
                       f"; run the same command with --resume"
                       + (" (instead of --overwrite)" if job.overwrite else "")
                       + " to continue it", err=True)
        raise click.exceptions.Exit(EXIT_INTERRUPTED)
    for message in summary.errors:
        click.echo(f"crown: {what} failed: {message}", err=True)
    if not quiet:
        click.echo(summary.line(time.perf_counter() - t0, output), err=True)
    if failed:
        raise click.exceptions.Exit(3)
