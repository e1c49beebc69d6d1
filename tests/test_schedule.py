"""The race of branch-and-bound strategies (crown_cli.verification.schedule): time by measured
progress, a case proven by either strategy is proven, the later strategy joins on time."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from crown_cli.verification.outcome import BabResult
from crown_cli.verification.schedule import FLOOR, RaceSettings, Run, race, shares


def _run(members, strategy, verdict, steps, rate, pause=0.002, log=None):
    """A fake search: ``steps`` steps of ``pause`` seconds, each proving ``rate`` more of
    its space (capped at 1), then ``verdict`` (None: endless)."""
    def start(progress):
        def gen():
            if log is not None:
                log.append((strategy, time.monotonic()))
            i = 0
            while steps is None or i < steps:
                i += 1
                time.sleep(pause)
                progress(i, 2, -0.5)
                yield min(1.0, i * rate)
            return BabResult(verdict, np.zeros(2) if verdict == "sat" else None, steps, 2,
                             np.inf if verdict == "unsat" else -0.5, 0.0)
        return gen()
    return Run(list(members), strategy, start)


def _race(runs, n_cases, timeout=5.0, **kw):
    cases = [SimpleNamespace(A=np.zeros((1, 2)), b=np.array([0.0])) for _ in range(n_cases)]

    def done(result, stage, margin, proven, **extra):
        return dict(extra, result=result, stage=stage, margin=margin, proven=proven)

    opts = dict(first_slice=0.02, max_slice=0.05)
    opts.update(kw)
    t0 = time.monotonic()
    out = race(runs, n_cases, 0, {}, t0 + timeout, done, lambda x: np.zeros(2), cases,
               RaceSettings(kinds={"a": "boxes", "b": "domains"}, worst=lambda m: None, **opts))
    return out, time.monotonic() - t0


def test_searches_left_unfinished_are_closed_when_the_race_ends():
    """A run still going when the race returns (timeout, or another run's verdict) has its
    generator closed before race returns: its cleanup (a ReLU splitting's helper process)
    runs then, not at interpreter exit (where it printed "Exception ignored in: <generator
    graph_relu_split_steps>" with an OSError)."""
    closed, started = [], []

    def endless(strategy):
        def start(progress):
            def gen():
                started.append(strategy)
                try:
                    while True:
                        time.sleep(0.002)
                        progress(1, 1, -0.5)
                        yield 0.0
                finally:
                    closed.append(strategy)
            return gen()
        return Run([0], strategy, start)

    out, _ = _race([endless("a"), endless("a")], 1, timeout=0.3)
    assert out["result"] == "timeout" and closed == started == ["a", "a"]
    closed.clear()
    started.clear()
    out, _ = _race([endless("a"), _run([0], "a", "unsat", 20, 0.05)], 1)
    assert out["result"] == "unsat" and closed == started == ["a"]


def test_shares_follow_the_measured_rate_with_a_floor():
    fast = Run([0], "a", None, closed=0.5, spent=1.0)
    slow = Run([0], "b", None, closed=0.01, spent=1.0)
    s = shares([fast, slow], ["a", "b"])
    assert s["b"] == pytest.approx(FLOOR / (FLOOR + 0.5 / 0.51)) and s["a"] > 0.85
    nothing = Run([0], "b", None, closed=0.0, spent=2.0)
    assert shares([nothing, Run([0], "a", None, spent=1.0)], ["a", "b"]) == {"a": 0.5,
                                                                            "b": 0.5}
    # a strategy whose runs are all over has no share
    assert shares([fast, Run([0], "b", None, over=True)], ["a", "b"]) == {"a": 1.0}


def test_a_case_proven_by_either_strategy_is_proven_and_the_other_stops():
    out, t = _race([_run([0], "a", "unsat", 40, 0.02), _run([0], "b", None, None, 0.0)], 1)
    assert out["result"] == "unsat" and out["proven"] == 1 and t < 2.0
    # the other way round: the endless one first, the second strategy decides
    out, t = _race([_run([0], "a", None, None, 0.0), _run([0], "b", "unsat", 40, 0.02)], 1)
    assert out["result"] == "unsat" and out["proven"] == 1 and t < 2.0


def test_the_faster_strategy_gets_most_of_the_time():
    spent = {}
    runs = [_run([0], "a", None, None, 0.0), _run([0], "b", None, None, 0.001)]
    out, t = _race(runs, 1, timeout=2.0)
    assert out["result"] == "timeout"
    for r in runs:
        spent[r.strategy] = r.spent
    # "a" proves nothing: it keeps about FLOOR of the time after its probe
    assert spent["a"] < 0.3 * (spent["a"] + spent["b"])
    assert spent["a"] > 0.5 * FLOOR * (spent["a"] + spent["b"])


def test_the_second_strategy_joins_after_its_delay():
    seen = []
    runs = [_run([0], "a", "unsat", 100, 0.005, log=seen), _run([0], "b", None, None, 0.0,
                                                               log=seen)]
    out, t = _race(runs, 1, join_after=10.0)
    assert out["result"] == "unsat" and [s for s, _ in seen] == ["a"]  # decided before it
    seen.clear()
    runs = [_run([0], "a", None, None, 0.001, log=seen), _run([0], "b", None, None, 0.0,
                                                               log=seen)]
    out, t = _race(runs, 1, timeout=1.0, join_after=0.4)
    started = dict(seen)
    assert started["b"] - started["a"] >= 0.39


def test_a_sat_run_ends_the_race_and_unknown_leaves_the_case_open():
    out, _ = _race([_run([0], "a", None, None, 0.0), _run([0], "b", "sat", 5, 0.0)], 1)
    assert out["result"] == "sat" and out["case"] == 0
    out, _ = _race([_run([0], "a", "unknown", 5, 0.0), _run([0], "b", "unknown", 5, 0.0)], 1)
    assert out["result"] == "unknown" and out["proven"] == 0 and out["margin"] == -0.5
    # one strategy unknown, the other proves the case: unsat
    out, _ = _race([_run([0], "a", "unknown", 5, 0.0), _run([0], "b", "unsat", 9, 0.1)], 1)
    assert out["result"] == "unsat" and out["proven"] == 1


def test_the_second_strategy_stays_out_while_the_first_is_about_to_finish():
    seen = []
    # "a" proves 10% per step: past half its space at the join time, it finishes alone
    runs = [_run([0], "a", "unsat", 10, 0.1, pause=0.05, log=seen),
            _run([0], "b", None, None, 0.0, log=seen)]
    out, _ = _race(runs, 1, join_after=0.3)
    assert out["result"] == "unsat" and [s for s, _ in seen] == ["a"]


def test_a_stalled_first_strategy_lets_the_second_join_after_its_projected_finish():
    """The first strategy proves 60% of its space at once and then nothing: past half its
    space at the join time, it is projected to finish by elapsed / 0.6; once twice that has
    passed the second joins and decides the case."""
    seen = []

    def stalls(progress):
        def gen():
            seen.append(("a", time.monotonic()))
            i = 0
            while True:
                i += 1
                time.sleep(0.002)
                progress(i, 2, -0.5)
                yield 0.6
        return gen()

    runs = [Run([0], "a", stalls), _run([0], "b", "unsat", 5, 0.2, log=seen)]
    out, t = _race(runs, 1, timeout=5.0, join_after=0.3)
    started = dict(seen)
    assert out["result"] == "unsat" and "b" in started
    assert 2 * 0.3 / 0.6 - 0.05 <= started["b"] - started["a"] < 3.0


def test_a_bound_cut_by_the_deadline_ends_the_race_in_timeout_with_its_domains():
    """A search whose bound raises DeadlineExceeded (the graph engine's searches do, from
    inside a GraphBounds) ends the race in ``timeout`` with the domains its runs reported so
    far, not 0."""
    from crown_cli.engine.deadline import DeadlineExceeded

    def start(progress):
        def gen():
            for i in range(1, 4):
                progress(10 * i, 3, -0.25)
                yield 0.0
            raise DeadlineExceeded("past the deadline")
        return gen()

    out, _ = _race([Run([0], "a", start)], 1)
    assert out["result"] == "timeout" and out["stage"] == "bab"
    assert out["domains"] == 30 and out["margin"] == -0.25
