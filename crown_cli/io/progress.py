"""Progress bars: a tqdm bar on stderr when it is a terminal, else none."""
from __future__ import annotations

import sys


def terminal_bar(enabled: bool = True, **kwargs):
    """A tqdm bar on stderr (``kwargs`` go to tqdm), or None when ``enabled`` is false or stderr
    is not a terminal (files, pipes, cron: no bar lines in logs)."""
    if not enabled or not _is_terminal(sys.stderr):
        return None
    from tqdm import tqdm

    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(file=sys.stderr, **kwargs)


def _is_terminal(stream) -> bool:
    return stream.isatty()
