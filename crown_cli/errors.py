"""Errors raised for bad user input; the CLI turns them into one-line messages and exit code 2."""


class InputError(Exception):
    """A problem with a user-supplied file or option.

    The message must name the file (or option) and the problem in one line.
    """
