"""The status line of a running branch and bound (``crown verify -v`` and its progress bar):
the case, domains bounded and their rate, open domains, the worst open bound."""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

# branch and bound status (open domains, worst open bound, domains/s): at most this often, in
# seconds, to a progress bar and to the -v log
STATUS_EVERY_BAR_S, STATUS_EVERY_LOG_S = 0.5, 2.0


def bab_status_for(status, log) -> Optional["BabStatus"]:
    """The branch and bound's status line: to ``status`` (a progress bar) every
    :data:`STATUS_EVERY_BAR_S` seconds, else to ``log`` every :data:`STATUS_EVERY_LOG_S`;
    None when neither is given."""
    if status is not None:
        return BabStatus(status, STATUS_EVERY_BAR_S)
    if log is not None:
        return BabStatus(log, STATUS_EVERY_LOG_S)
    return None


class BabStatus:
    """The status of a running branch and bound as one line of text, handed to ``emit`` at
    most every ``every`` seconds: the case, domains bounded and their rate over the whole
    branch and bound so far, open domains, and the worst open domain's bound minus b (its best
    row; a float32 estimate for ReLU splitting)."""

    def __init__(self, emit: Callable[[str], None], every: float,
                 clock: Callable[[], float] = time.monotonic):
        self.emit, self.every, self.clock = emit, every, clock
        self.t0 = None
        self.last = -np.inf
        self.kind = self.unit = ""
        self.case = self.proven = self.cases = self.before = 0

    def begin(self, kind: str, unit: str, case: int, proven: int, cases: int,
              before: int) -> None:
        """A new case starts; ``before``: domains the earlier cases bounded."""
        if self.t0 is None:  # the first line after ``every`` seconds, with a meaningful rate
            self.t0 = self.last = self.clock()
        self.kind, self.unit, self.case = kind, unit, case
        self.proven, self.cases, self.before = proven, cases, before

    def text(self, domains: int, open_: int, worst: float) -> str:
        total = self.before + domains
        rate = total / max(self.clock() - self.t0, 1e-9)
        worst_s = f"{worst:.4g}" if np.isfinite(worst) else "-"
        return (f"bab ({self.kind}): case {self.case} ({self.proven} of {self.cases} proven): "
                f"{total} {self.unit}, {open_} open, worst bound {worst_s}, "
                f"{rate:.0f} {self.unit}/s")

    def update(self, domains: int, open_: int, worst: float) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        self.emit(self.text(domains, open_, worst))
