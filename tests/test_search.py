"""The certified-radius search on functions whose root is known."""
import math

import numpy as np
import pytest

from crown_cli.engine.radius_search import certified_radius

ROOTS = [1e-7, 3e-4, 0.0123, 0.7, 42.0]
SHAPES = {
    "linear": lambda r: (lambda e: 1.0 - e / r),
    "concave": lambda r: (lambda e: 1.0 - (e / r) ** 2),
    "convex": lambda r: (lambda e: math.exp(-3 * e / r) - math.exp(-3)),
    "step": lambda r: (lambda e: 1.0 if e < r else -1.0),
    "kinked": lambda r: (lambda e: 1.0 - e / r if e < 0.9 * r else 0.1 - 5 * (e - 0.9 * r) / r),
}


class Recorder:
    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, e):
        v = self.fn(e)
        self.calls.append((e, v))
        return v


@pytest.mark.parametrize("method", ["interp", "bisect"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("root", ROOTS)
def test_search_finds_root_within_rtol_and_reports_a_verified_radius(method, shape, root):
    rec = Recorder(SHAPES[shape](root))
    res = certified_radius(rec, 1.0, eps0=0.01, rtol=1e-4, method=method)
    assert res.status == "certified"
    assert res.evaluations == len(rec.calls)
    assert (res.eps, res.lower_bound) in rec.calls and res.lower_bound > 0  # verified, not guessed
    true_root = root if shape != "kinked" else 0.92 * root
    assert res.eps <= true_root
    assert res.eps >= true_root * (1 - 1e-4) * (1 - 1e-12)
    assert res.upper >= true_root and res.upper - res.eps <= 1e-4 * res.eps * (1 + 1e-12)


@pytest.mark.parametrize("eps0", [1e-9, 1e-3, 1.0, 1e3])
def test_bracketing_does_not_depend_on_a_lucky_start(eps0):
    root = 0.0123
    res = certified_radius(SHAPES["convex"](root), 1.0, eps0=eps0, rtol=1e-4)
    assert root * (1 - 1e-4) <= res.eps <= root
    assert res.evaluations <= 25


def test_interp_needs_few_evaluations_on_smooth_bounds():
    evals = []
    for root in ROOTS:
        for shape in ("linear", "concave", "convex"):
            evals.append(certified_radius(SHAPES[shape](root), 1.0, eps0=0.01).evaluations)
    bis = [certified_radius(SHAPES[s](r), 1.0, eps0=0.01, method="bisect").evaluations
           for r in ROOTS for s in ("linear", "concave", "convex")]
    assert np.mean(evals) < 0.75 * np.mean(bis), (np.mean(evals), np.mean(bis))


def test_capped_when_certified_everywhere():
    res = certified_radius(lambda e: 1.0, 1.0, eps0=0.01, eps_max=50.0)
    assert res.status == "capped" and res.eps == 50.0


def test_not_certified_when_margin_not_positive():
    res = certified_radius(lambda e: -1.0, 0.0, eps0=0.01)
    assert res.status == "not-certified" and res.eps == 0.0 and res.evaluations == 0


def test_not_certified_when_bound_fails_at_every_tried_radius():
    res = certified_radius(lambda e: -1.0, 1.0, eps0=0.01, eps_min=1e-9)
    assert res.status == "not-certified" and res.eps == 0.0


def test_nan_counts_as_not_certified():
    res = certified_radius(lambda e: float("nan") if e > 0.5 else 1.0, 1.0, eps0=0.01)
    assert 0.5 * (1 - 1e-4) <= res.eps <= 0.5


def test_non_monotone_bound_still_reports_a_verified_radius():
    # positive on (0, 0.3) and (0.5, 0.6) only: any answer must be a point where f > 0
    f = lambda e: 1.0 if (e < 0.3 or 0.5 < e < 0.6) else -1.0  # noqa: E731
    rec = Recorder(f)
    res = certified_radius(rec, 1.0, eps0=0.01)
    assert f(res.eps) > 0 and (res.eps, 1.0) in rec.calls


@pytest.mark.parametrize("power", [1, 3, 7])
@pytest.mark.parametrize("root", [2e-4, 3e-3, 0.05])
def test_interp_is_fast_on_power_law_drops(power, root):
    # the shape of a deep network's bound: the drop g0 - bound is linear near 0 and a high
    # power of eps once neurons turn unstable; the log-log interpolation follows it
    g0 = 0.4
    drop = lambda e: 0.1 * g0 * e / root + 0.9 * g0 * (e / root) ** power  # noqa: E731
    fast = Recorder(lambda e: g0 - drop(e))
    plain = Recorder(lambda e: g0 - drop(e))
    a = certified_radius(fast, g0, eps0=0.002, rtol=1e-4, power=3.0)
    b = certified_radius(plain, g0, eps0=0.002, rtol=1e-4, method="bisect")
    assert root * (1 - 1e-4) * (1 - 1e-12) <= a.eps <= root
    assert a.evaluations <= 10 and a.evaluations < b.evaluations


@pytest.mark.parametrize("start", [0.5, 0.7, 0.95])
def test_a_certified_start_steps_up_to_just_above_the_root(start):
    # below the root, deep networks' drops grow like a power of about half the degree the
    # search assumes going down (power = depth): the first step up aims at that power law's
    # root and lands a little above the true one, not at twice the start
    g0, root = 0.5, 0.01
    rec = Recorder(lambda e: g0 - g0 * (e / root) ** 3.5)
    certified_radius(rec, g0, eps0=start * root, rtol=1e-4, power=6.0)
    (e1, v1), (e2, v2) = rec.calls[:2]
    assert e1 == start * root and v1 > 0
    assert root < e2 <= 1.15 * root and v2 <= 0


@pytest.mark.parametrize("start", [0.5, 0.7, 0.95])
def test_a_pair_of_powers_sets_the_first_step_up(start):
    # power=(down, up): the step up from a certified start aims at the root of a drop
    # growing like eps^up (the graph certifier's 1.5, whatever its depth), the step down
    # keeps `down`
    g0, root = 0.5, 0.01
    rec = Recorder(lambda e: g0 - g0 * (e / root) ** 1.5)
    certified_radius(rec, g0, eps0=start * root, rtol=1e-4, power=(6.0, 1.5))
    assert rec.calls[1][0] == pytest.approx(root, rel=1e-9)
    rec = Recorder(lambda e: g0 - g0 * (e / root) ** 1.5)
    certified_radius(rec, g0, eps0=start * root, rtol=1e-4, power=6.0)  # up: 3 (half of 6)
    assert rec.calls[1][0] < root
    down = Recorder(lambda e: g0 - g0 * (e / root) ** 6.0)
    certified_radius(down, g0, eps0=2 * root, rtol=1e-4, power=(6.0, 1.5))
    assert down.calls[1][0] == pytest.approx(root, rel=1e-9)


@pytest.mark.parametrize("shape", ["linear", "concave", "convex", "kinked"])
@pytest.mark.parametrize("root", ROOTS)
def test_stop_at_estimate_returns_an_unevaluated_candidate_near_the_root(shape, root):
    rec = Recorder(SHAPES[shape](root))
    full = certified_radius(SHAPES[shape](root), 1.0, eps0=0.01, rtol=1e-4)
    res = certified_radius(rec, 1.0, eps0=0.01, rtol=1e-4, stop_at_estimate=True)
    assert res.evaluations == len(rec.calls) <= full.evaluations
    assert (res.eps, res.lower_bound) in rec.calls and res.lower_bound > 0  # lo stays verified
    true_root = root if shape != "kinked" else 0.92 * root
    if res.candidate is None:  # closed the bracket before the estimates settled
        assert res.upper - res.eps <= 1e-4 * res.eps * (1 + 1e-12)
    else:
        assert res.candidate not in [e for e, _ in rec.calls]
        assert res.eps < res.candidate < res.upper
        assert abs(res.candidate - true_root) <= 1e-4 * true_root
        assert res.evaluations <= full.evaluations - 1
