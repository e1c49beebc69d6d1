"""The helper process of branch and bound's rounds (crown_cli.verification.bab.workers)."""
import os

import numpy as np
import pytest

from crown_cli.verification.bab.workers import Helper, HelperLost


def test_helper_runs_the_function_on_what_it_is_sent():
    base = np.arange(5.0)  # held before the fork: the helper sees it

    def fn(x, k):
        return os.getpid(), base * k + x

    h = Helper(fn)
    try:
        for k in range(3):
            h.send((np.ones(5), k))
            pid, out = h.recv()
            assert pid != os.getpid()
            np.testing.assert_array_equal(out, base * k + 1.0)
    finally:
        h.close()
    assert not h.proc.is_alive()


def test_helper_raises_what_the_function_raised():
    def fn(x):
        raise ValueError(f"bad {x}")

    h = Helper(fn)
    try:
        h.send((3,))
        with pytest.raises(ValueError, match="bad 3"):
            h.recv()
    finally:
        h.close()


def test_a_lost_helper_is_reported_not_waited_for():
    h = Helper(lambda: os._exit(1))  # the process ends without answering
    h.send(())
    with pytest.raises(HelperLost):
        h.recv()
    h.close()
