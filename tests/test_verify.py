"""crown verify's pipeline: verdicts against an exact MILP, counterexamples re-checked."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import random_network
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.input_sets import Box
from crown_cli.activations import forward
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.verification.outcome import BabResult
from crown_cli.verification.outcome import format_result
from crown_cli.verification.pipeline import Verifier
from crown_cli.verification.status import BabStatus
from crown_cli.verification.schedule import RaceSettings, Run, race
from crown_cli.io.vnnlib import parse_vnnlib_text
from oracles import exact_margin_min


def box_property(lo, hi, c, t, b, n_out):
    """VNN-LIB text: x in [lo, hi] and Y_c - Y_t <= b is unsafe."""
    lines = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    lines += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    for i, (a, z) in enumerate(zip(lo, hi)):
        lines += [f"(assert (>= X_{i} {float(a)!r}))", f"(assert (<= X_{i} {float(z)!r}))"]
    lines.append(f"(assert (<= (- Y_{c} Y_{t}) {float(b)!r}))")
    return "\n".join(lines) + "\n"


def margin_property(lo, hi, c, n_out):
    """mnistfc-style: unsafe when some other output is >= Y_c."""
    lines = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    lines += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    for i, (a, z) in enumerate(zip(lo, hi)):
        lines += [f"(assert (>= X_{i} {float(a)!r}))", f"(assert (<= X_{i} {float(z)!r}))"]
    ors = " ".join(f"(and (>= Y_{j} Y_{c}))" for j in range(n_out) if j != c)
    lines.append(f"(assert (or {ors}))")
    return "\n".join(lines) + "\n"


def check_sat(ws, bs, prop, verdict):
    case = prop.cases[verdict.case]
    x = verdict.x
    assert np.all(x >= case.lo) and np.all(x <= case.hi)
    y = forward(ws, bs, "relu", x)
    assert np.array_equal(y, verdict.y)
    assert np.all(case.A @ y <= case.b)


def milp_case(sizes, net_seed, seed, eps):
    """A random ReLU network, a point x0 (around which the l_inf ball of radius eps is the
    box), its predicted class c, the next class t, and the exact minimum of y_c - y_t over the
    box (HiGHS MILP, asserted optimal)."""
    ws, bs = random_network(sizes, net_seed)
    x0 = np.random.default_rng(seed).normal(size=sizes[0])
    c = int(np.argmax(forward(ws, bs, "relu", x0)))
    t = (c + 1) % sizes[-1]
    res = exact_margin_min(ws, bs, x0, c, t, eps, "inf", time_limit=60.0)
    assert res.status == "optimal"
    return ws, bs, x0, c, t, res.value


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_verdicts_never_contradict_the_milp(seed):
    """Properties built just true / just false around the exact minimum (HiGHS MILP): branch
    and bound gives the MILP's verdict; clearly true ones CROWN proves already."""
    eps = 0.3
    ws, bs, x0, c, t, m = milp_case([4, 12, 12, 3], seed, seed, eps)
    gap = 1e-3 * (1.0 + abs(m))
    v = Verifier(ws, bs, "relu", attack_restarts=32, attack_steps=60, seed=seed)
    lo, hi = x0 - eps, x0 + eps
    # just false: the unsafe set contains the minimiser's outputs
    prop = parse_vnnlib_text(box_property(lo, hi, c, t, m + gap, 3), "false", 4, 3)
    out = v.verify(prop, timeout=20.0)
    assert out.result == "sat"  # branch and bound (4 inputs: input splitting) decides it
    check_sat(ws, bs, prop, out)
    # without the attack, branch and bound finds the counterexample itself
    out = Verifier(ws, bs, "relu", attack_time=0.0).verify(prop, timeout=20.0)
    assert out.result == "sat" and out.stage == "bab" and out.domains > 0
    check_sat(ws, bs, prop, out)
    # just true: below the exact minimum
    prop = parse_vnnlib_text(box_property(lo, hi, c, t, m - gap, 3), "true", 4, 3)
    out = v.verify(prop, timeout=20.0)
    assert out.result == "unsat"
    # clearly true: below CROWN's own bound over the box
    lb = crown.margin_lower_bound(crown.Network(ws, bs), *Box(lo, hi).args(),
                                  get_relaxation("relu", "crown"),
                                  np.eye(3)[[c]] - np.eye(3)[[t]])[0]
    prop = parse_vnnlib_text(box_property(lo, hi, c, t, lb - gap, 3), "easy", 4, 3)
    out = v.verify(prop, timeout=20.0)
    assert out.result == "unsat" and out.stage == "crown" and out.margin > 0


def test_sat_found_by_attack_and_rechecked():
    ws, bs = random_network([5, 16, 16, 4], 3)
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=5)
    y0 = forward(ws, bs, "relu", x0)
    c = int(np.argmax(y0))
    lo, hi = x0 - 2.0, x0 + 2.0
    prop = parse_vnnlib_text(margin_property(lo, hi, c, 4), "wide", 5, 4)
    out = Verifier(ws, bs, "relu").verify(prop, timeout=20.0)
    assert out.result == "sat" and out.stage == "attack"
    check_sat(ws, bs, prop, out)
    text = format_result(out)
    assert text.startswith("sat\n((X_0 ")
    pairs = [tok.strip().strip("()").split() for tok in text.split("\n")[1:] if tok.strip()]
    vals = {name: float(val) for name, val in pairs}
    assert np.array_equal([vals[f"X_{i}"] for i in range(5)], out.x)
    assert np.array_equal([vals[f"Y_{j}"] for j in range(4)], out.y)


def test_every_case_must_be_proven():
    """A disjunction of two boxes: one provably safe, one not -> never unsat."""
    ws, bs = random_network([3, 10, 10, 2], 5)
    x0 = np.zeros(3)
    y = forward(ws, bs, "relu", x0)
    c, t = int(np.argmax(y)), 1 - int(np.argmax(y))
    m = y[c] - y[t]
    head = "".join(f"(declare-const X_{i} Real)\n" for i in range(3))
    head += "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
    tiny = " ".join(f"(>= X_{i} -1e-6) (<= X_{i} 1e-6)" for i in range(3))
    far = " ".join(f"(>= X_{i} 5.0) (<= X_{i} 6.0)" for i in range(3))
    text = head + f"(assert (or (and {tiny}) (and {far})))\n" \
        + f"(assert (<= (- Y_{c} Y_{t}) {float(m - 0.5 * abs(m))!r}))\n"
    prop = parse_vnnlib_text(text, "two", 3, 2)
    out = Verifier(ws, bs, "relu", attack_time=0.2).verify(prop, timeout=5.0)
    assert out.cases == 2
    assert out.result != "unsat" or out.cases_proven == 2
    # with only the tiny box the property is proven
    prop1 = parse_vnnlib_text(head + f"(assert (and {tiny}))\n"
                              + f"(assert (<= (- Y_{c} Y_{t}) {float(m - 0.5 * abs(m))!r}))\n", "one", 3, 2)
    assert Verifier(ws, bs, "relu").verify(prop1, timeout=5.0).result == "unsat"


def test_timeout_verdict():
    ws, bs = random_network([3, 10, 2], 1)
    text = "".join(f"(declare-const X_{i} Real)\n(assert (>= X_{i} -1))\n(assert (<= X_{i} 1))\n"
                   for i in range(3)) + "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n" \
        + "(assert (<= Y_0 -1000))\n"
    prop = parse_vnnlib_text(text, "t", 3, 2)
    out = Verifier(ws, bs, "relu", attack_time=0.0).verify(prop, timeout=0.0)
    assert out.result == "timeout"


def test_sizes_must_match():
    from crown_cli.errors import InputError

    ws, bs = random_network([3, 10, 2], 1)
    text = "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (>= X_0 0))\n" \
           "(assert (<= X_0 1))\n(assert (<= Y_0 0))\n"
    prop = parse_vnnlib_text(text, "small")
    with pytest.raises(InputError, match="property has 1 inputs and 1 outputs but the network has 3 and 2"):
        Verifier(ws, bs, "relu").verify(prop, timeout=1.0)


@pytest.mark.parametrize("act,seed", [("tanh", 0), ("sigmoid", 1), ("arctan", 2)])
def test_alpha_stage_smooth_between_crown_and_sampled_minimum(act, seed):
    """tanh / sigmoid / arctan: the alpha-crown stage (free tangent points) gives verified row
    bounds at least CROWN's, above CROWN's somewhere, and below the minimum over sampled
    points and the corners of the box."""
    ws, bs = random_network([4, 16, 16, 3], 30 + seed)
    rng = np.random.default_rng(seed)
    x0, eps = rng.normal(size=4), 0.5
    c = int(np.argmax(forward(ws, bs, act, x0)))
    ts = [t for t in range(3) if t != c]
    A = np.array([np.eye(3)[c] - np.eye(3)[t] for t in ts])
    v = Verifier(ws, bs, act, stages=("crown", "alpha-crown"))
    assert v.stages == ["crown", "alpha-crown"]
    lo, hi = x0 - eps, x0 + eps
    crown_lb = v.box_lower_bounds("crown", lo, hi, A, np.zeros(2))
    alpha_lb = v.box_lower_bounds("alpha-crown", lo, hi, A, np.zeros(2))
    assert np.all(alpha_lb >= crown_lb)
    assert np.any(alpha_lb > crown_lb + 1e-6)
    X = np.concatenate([rng.uniform(lo, hi, (20000, 4)), np.array(np.meshgrid(
        *[[a, z] for a, z in zip(lo, hi)])).reshape(4, -1).T])
    sampled = (forward(ws, bs, act, X) @ A.T).min(axis=0)
    assert np.all(alpha_lb <= sampled)


@pytest.mark.parametrize("seed", range(3))
def test_alpha_stage_between_crown_and_exact(seed):
    """Over a box, the alpha-crown stage's verified row bounds lie between CROWN's and the
    exact minimum (HiGHS MILP), and above CROWN's somewhere."""
    ws, bs = random_network([4, 16, 16, 3], 20 + seed)
    rng = np.random.default_rng(seed)
    x0, eps = rng.normal(size=4), 0.4
    c = int(np.argmax(forward(ws, bs, "relu", x0)))
    ts = [t for t in range(3) if t != c]
    A = np.array([np.eye(3)[c] - np.eye(3)[t] for t in ts])
    v = Verifier(ws, bs, "relu", stages=("crown", "alpha-crown"))
    lo, hi = x0 - eps, x0 + eps
    crown_lb = v.box_lower_bounds("crown", lo, hi, A, np.zeros(2))
    alpha_lb = v.box_lower_bounds("alpha-crown", lo, hi, A, np.zeros(2))
    assert np.all(alpha_lb >= crown_lb)
    for r, t in enumerate(ts):
        res = exact_margin_min(ws, bs, x0, c, t, eps, "inf", time_limit=60.0)
        assert res.status == "optimal"
        assert alpha_lb[r] <= res.value + 1e-9
    assert np.any(alpha_lb > crown_lb + 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_wide_inputs_relu_split_matches_the_milp(seed):
    """More than 16 inputs: the complete stage splits ReLUs. Just-true properties (exact
    MILP minimum minus a gap) come out unsat, just-false ones sat (rechecked)."""
    eps = 0.15
    ws, bs, x0, c, t, m = milp_case([20, 16, 16, 3], 40 + seed, seed, eps)
    gap = 1e-3 * (1.0 + abs(m))
    lo, hi = x0 - eps, x0 + eps
    v = Verifier(ws, bs, "relu", attack_time=0.0, seed=seed)
    out = v.verify(parse_vnnlib_text(box_property(lo, hi, c, t, m - gap, 3), "t", 20, 3), 30.0)
    assert out.result == "unsat"
    prop = parse_vnnlib_text(box_property(lo, hi, c, t, m + gap, 3), "f", 20, 3)
    out = v.verify(prop, 30.0)
    assert out.result == "sat"
    check_sat(ws, bs, prop, out)


STATUS_RE = (r"bab \((input|ReLU) split\): case ([\d,]+) \((\d+) of (\d+) proven\): (\d+) "
             r"(boxes|domains), (\d+) open, worst bound (\S+), (\d+) (boxes|domains)/s")


def test_status_lines_are_throttled():
    """BabStatus hands a line on at most every ``every`` seconds of its clock, the first one
    ``every`` seconds after the branch and bound began, with the rate over all cases."""

    now = [100.0]
    lines = []
    st = BabStatus(lines.append, 2.0, clock=lambda: now[0])
    st.begin("ReLU split", "domains", 3, 1, 9, 0)
    st.update(10, 5, -0.5)
    assert lines == []
    now[0] = 102.5
    st.update(500, 40, -0.25)
    now[0] = 103.0
    st.update(600, 41, -0.2)  # within 2 s of the last line
    assert lines == ["bab (ReLU split): case 3 (1 of 9 proven): 500 domains, 40 open, "
                     "worst bound -0.25, 200 domains/s"]
    st.begin("ReLU split", "domains", 4, 2, 9, 800)  # case 3 bounded 800 domains
    now[0] = 105.0
    st.update(200, 7, float("inf"))
    assert lines[-1] == ("bab (ReLU split): case 4 (2 of 9 proven): 1000 domains, 7 open, "
                         "worst bound -, 200 domains/s")


@pytest.mark.parametrize("sizes,seed", [([4, 12, 12, 3], 1), ([20, 16, 16, 3], 41)])
def test_branch_and_bound_reports_its_status(monkeypatch, sizes, seed):
    """Both branch-and-bound stages report open domains, the worst open bound and the rate
    while they run; the counts only grow and never exceed the verdict's."""
    import re

    from crown_cli.verification import status as status_mod

    monkeypatch.setattr(status_mod, "STATUS_EVERY_BAR_S", 0.0)
    ws, bs = random_network(sizes, seed)
    rng = np.random.default_rng(seed)
    d = sizes[0]
    x0, eps = rng.normal(size=d), 0.3 if d == 4 else 0.15
    c = int(np.argmax(forward(ws, bs, "relu", x0)))
    t = (c + 1) % 3
    m = exact_margin_min(ws, bs, x0, c, t, eps, "inf", time_limit=60.0).value
    prop = parse_vnnlib_text(box_property(x0 - eps, x0 + eps, c, t, m - 1e-3 * (1 + abs(m)), 3),
                             "t", d, 3)
    lines = []
    out = Verifier(ws, bs, "relu", attack_time=0.0).verify(prop, 30.0, status=lines.append)
    assert out.result == "unsat" and out.stage == "bab"
    assert lines
    counts = []
    kinds = []
    for line in lines:
        g = re.fullmatch(STATUS_RE, line)
        assert g is not None, line
        kinds.append(g.group(1))
        assert g.group(8) == "-" or float(g.group(8)) <= 0.0 or g.group(1) == "ReLU"
        counts.append(int(g.group(5)))
    # input splitting first (at most INPUT_SPLIT_MAX_DIM inputs); ReLU splitting may join
    assert kinds[0] == "input" and set(kinds) <= {"input", "ReLU"}
    assert counts == sorted(counts) and counts[-1] <= out.domains


# ------------------------------------------------------------- interleaved branch and bound


def _fake_run(verdict, steps, x=None, pause=0.0):
    """A stand-in for relu_split_steps: ``steps`` batches (reporting progress; each takes
    ``pause`` seconds), then ``verdict``; steps=None never ends."""
    def start(progress):
        def gen():
            i = 0
            while steps is None or i < steps:
                i += 1
                progress(i, 3, -0.5)
                time.sleep(pause)
                yield
            return BabResult(verdict, x, steps, 3, np.inf if verdict == "unsat" else -0.5,
                             0.0)
        return gen()
    return start


def _interleave(specs, timeout=5.0, status=None):
    ws, bs = random_network([3, 6, 2], 0)
    v = Verifier(ws, bs, "relu")
    # a case holds at every point iff its run is the sat one (0 <= 0), else never (0 <= -1)
    cases = [SimpleNamespace(A=np.zeros((1, 2)), b=np.array([0.0 if s[0] == "sat" else -1.0]))
             for s in specs]
    runs = [([j], _fake_run(*spec)) for j, spec in enumerate(specs)]

    def done(result, stage, margin, proven, **kw):
        return result, proven, dict(kw, margin=margin, stage=stage)

    t0 = time.monotonic()
    out = race([Run(m, "ReLU split", start) for m, start in runs], len(cases), 0, {},
               t0 + timeout, done, v.outputs, cases,
               RaceSettings(kinds={"ReLU split": "domains"}, status=status, first_slice=0.01,
                            max_slice=0.05, worst=lambda m: None))
    return out, time.monotonic() - t0


def test_interleaving_reaches_a_violated_case_behind_an_endless_one():
    x = np.array([0.1, 0.2, 0.3])
    # one case after another would wait for the endless first case until the deadline
    (result, proven, kw), _ = _interleave([("timeout", None), ("unsat", 4), ("sat", 20, x)])
    assert result == "sat" and kw["case"] == 2 and np.array_equal(kw["x"], x)
    assert proven == 1  # case 1 finished on the way


def test_interleaving_verdicts():
    assert _interleave([("unsat", 3), ("unsat", 7), ("unsat", 1)])[0][:2] == ("unsat", 3)
    # a case the search could not decide leaves the others running: a violation still counts
    assert _interleave([("unknown", 2), ("sat", 9, np.zeros(3))])[0][0] == "sat"
    result, proven, kw = _interleave([("unknown", 2), ("unsat", 9)])[0]
    assert (result, proven) == ("unknown", 1)
    (result, proven, kw), _ = _interleave([("unsat", 2), ("timeout", None)], timeout=0.3)
    assert (result, proven) == ("timeout", 1) and kw["domains"] > 2
    assert kw["margin"] == -0.5 and kw["stage"] == "bab"  # the open case's worst bound


def test_interleaving_status_counts_every_case():
    lines = []
    status = BabStatus(lines.append, every=0.0)
    # case 1 runs 0.12 s longer than case 0, more than a slice (0.05 s): it still reports
    # after case 0 has ended, whatever the slices' timing
    _interleave([("unsat", 60, None, 0.002), ("unsat", 120, None, 0.002)], status=status)
    assert lines and all("of 2 proven" in s for s in lines)
    # the totals add up the cases' domains and open domains while both run
    assert any("6 open" in s for s in lines)
    assert "180 domains, 3 open" in lines[-1] and "(1 of 2 proven)" in lines[-1]


def _two_case_property(lo, hi, c, ts, bs_, n_out):
    """x in [lo, hi] and (Y_c - Y_t1 <= b1 or Y_c - Y_t2 <= b2) is unsafe."""
    lines = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    lines += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    for i, (a, z) in enumerate(zip(lo, hi)):
        lines += [f"(assert (>= X_{i} {float(a)!r}))", f"(assert (<= X_{i} {float(z)!r}))"]
    ors = " ".join(f"(and (<= (- Y_{c} Y_{t}) {float(b)!r}))" for t, b in zip(ts, bs_))
    lines.append(f"(assert (or {ors}))")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_deep_wide_inputs_cases_decided_jointly_match_the_milp(seed):
    """3 hidden layers and more than 16 inputs: one ReLU-splitting search decides both cases
    of the property. Both just true: unsat; the second just false: sat, with a counterexample
    of that case."""
    ws, bs = random_network([20, 12, 12, 12, 3], 60 + seed)
    rng = np.random.default_rng(seed)
    x0, eps = rng.normal(size=20), 0.1
    c = int(np.argmax(forward(ws, bs, "relu", x0)))
    ts = [t for t in range(3) if t != c]
    mins = []
    for t in ts:
        res = exact_margin_min(ws, bs, x0, c, t, eps, "inf", time_limit=60.0)
        assert res.status == "optimal"
        mins.append(res.value)
    gaps = [1e-3 * (1.0 + abs(m)) for m in mins]
    lo, hi = x0 - eps, x0 + eps
    v = Verifier(ws, bs, "relu", attack_time=0.0, seed=seed)
    text = _two_case_property(lo, hi, c, ts, [m - g for m, g in zip(mins, gaps)], 3)
    out = v.verify(parse_vnnlib_text(text, "t", 20, 3), 60.0)
    assert out.result == "unsat" and out.cases_proven == 2 and out.stage == "bab"
    text = _two_case_property(lo, hi, c, ts, [mins[0] - gaps[0], mins[1] + gaps[1]], 3)
    prop = parse_vnnlib_text(text, "f", 20, 3)
    out = v.verify(prop, 60.0)
    assert out.result == "sat" and out.case == 1 and out.stage == "bab"
    check_sat(ws, bs, prop, out)


def test_interleaving_reports_the_peak_of_open_domains_on_timeout():
    # two endless searches with 3 open domains each: the peak counts both
    (result, proven, kw), _ = _interleave([("timeout", None), ("timeout", None)], timeout=1.0)
    assert result == "timeout" and kw["peak_domains"] == 6


@pytest.mark.parametrize("seed", range(3))
def test_one_hidden_layer_decided_by_hull_split_as_the_milp(seed):
    """A ReLU network of one hidden layer: branch and bound starts with convex-hull input
    splitting, which decides just-true and just-false properties as the MILP does."""
    eps = 0.4
    ws, bs, x0, c, t, m = milp_case([6, 24, 3], 10 + seed, seed, eps)
    gap = 1e-3 * (1.0 + abs(m))
    lo, hi = x0 - eps, x0 + eps
    lines = []
    v = Verifier(ws, bs, "relu", attack_time=0.0, stages=())
    prop = parse_vnnlib_text(box_property(lo, hi, c, t, m - gap, 3), "true", 6, 3)
    out = v.verify(prop, timeout=30.0, log=lines.append)
    assert out.result == "unsat" and out.stage == "bab"
    assert any(line.startswith("bab (hull split)") for line in lines), lines
    prop = parse_vnnlib_text(box_property(lo, hi, c, t, m + gap, 3), "false", 6, 3)
    out = v.verify(prop, timeout=30.0)
    assert out.result == "sat" and out.stage == "bab"
    check_sat(ws, bs, prop, out)


def test_hull_stage_on_one_hidden_layer_with_many_inputs():
    """80 inputs (no input splitting): the hull stage proves a property alpha-CROWN cannot,
    its bound lies below the MILP's exact minimum, and a verifier without it says unknown."""
    eps = 0.05
    ws, bs, x0, c, t, exact = milp_case([80, 30, 3], 4, 4, eps)
    lo, hi = x0 - eps, x0 + eps
    A = np.eye(3)[[c]] - np.eye(3)[[t]]  # y_c - y_t
    v = Verifier(ws, bs, "relu", attack_time=0.0, bab=False)
    assert v.stages == ["crown", "alpha-crown", "hull"]
    alpha = v.box_lower_bounds("alpha-crown", lo, hi, A, np.zeros(1))[0]
    hullb = v.box_lower_bounds("hull", lo, hi, A, np.zeros(1))[0]
    assert alpha < hullb <= exact + 1e-9
    b = 0.5 * (hullb + alpha)  # y_c - y_t <= b is unsafe: alpha's bound below b, the hull's above
    prop = parse_vnnlib_text(box_property(lo, hi, c, t, b, 3), "mid", 80, 3)
    lines = []
    out = v.verify(prop, timeout=30.0, log=lines.append)
    assert out.result == "unsat" and out.stage == "hull", (out, lines)
    out = Verifier(ws, bs, "relu", attack_time=0.0, bab=False,
                   stages=("crown", "alpha-crown")).verify(prop, timeout=30.0)
    assert out.result == "unknown"
    assert Verifier(random_network([5, 8, 8, 2], 0)[0], random_network([5, 8, 8, 2], 0)[1],
                    "relu").stages == ["crown", "alpha-crown"]


def test_stages_that_do_not_apply_are_logged_as_skipped():
    ws, bs = random_network([4, 8, 8, 2], 1)
    lines = []
    v = Verifier(ws, bs, "relu", stages=("crown", "hull"), bab=False, attack_time=0.0)
    assert v.stages == ["crown"]
    prop = parse_vnnlib_text(box_property(-np.ones(4), np.ones(4), 0, 1, -1e6, 2), "p", 4, 2)
    v.verify(prop, timeout=5.0, log=lines.append)
    assert "hull: skipped (ReLU networks of one hidden layer only)" in lines
    ws, bs = random_network([4, 8, 2], 1)
    lines = []
    v = Verifier(ws, bs, "elu", stages=("crown", "alpha-crown"), bab=False, attack_time=0.0)
    v.verify(prop, timeout=5.0, log=lines.append)
    assert "alpha-crown: skipped (not defined for elu networks)" in lines
    # a skipped stage is not reported as the one that ran last: only the attack ran here
    ws, bs = random_network([4, 8, 8, 2], 1)
    out = Verifier(ws, bs, "relu", stages=("hull",), bab=False, attack_time=0.0).verify(
        prop, timeout=5.0, log=lines.append)
    assert out.result == "unknown" and out.stage == "attack", out


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_many_boxes_bounded_at_once_as_one_by_one(monkeypatch, act):
    """A property of many input boxes (nn4sys' lindex lists up to 60,000): the crown stage
    bounds them in batches (``Verifier._many_boxes``: the batched engine, whose interval
    check of stable neurons can only tighten) with each case's margin at least the
    box-by-box bound's (to float summation order), so every case proven one by one is proven;
    every batched bound lies below the sampled minimum of its box."""
    import crown_cli.verification.pipeline as P
    from crown_cli.engine.rounding import round_up
    from crown_cli.io.vnnlib import Case, Property

    ws, bs = random_network([3, 12, 12, 2], 7)
    rng = np.random.default_rng(8)
    centres = rng.uniform(-1, 1, (80, 3))
    cases = []
    for k, c in enumerate(centres):
        lo, hi = c - 0.05, c + 0.05
        y = forward(ws, bs, act, c[None], 0.1 if act == "leaky_relu" else None)[0]
        for sign in (1.0, -1.0):  # Y_0 <= y0 - 0.3 (mostly unsat) and Y_0 >= y0 + t
            A = np.array([[sign, 0.0]])
            b = np.array([sign * y[0] - (0.3 if k % 3 else 0.02)])
            cases.append(Case(lo, hi, A, b))
    prop = Property(3, 2, cases)
    alpha = 0.1 if act == "leaky_relu" else None
    v = Verifier(ws, bs, act, alpha, stages=("crown",), bab=False, attack_time=0.0)
    calls = []
    real = v._many_boxes
    monkeypatch.setattr(v, "many_boxes", lambda L, H, A: calls.append(len(L)) or real(L, H, A))
    still = v._bound_stages(prop.cases, time.monotonic() + 60, lambda *a, **k: None, None)
    assert sum(calls) == 80 and len(calls) == 1  # one rows class, one batch
    monkeypatch.setattr(P, "MANY_BOXES", 10 ** 9)
    ref = v._bound_stages(prop.cases, time.monotonic() + 60, lambda *a, **k: None, None)
    assert set(still[1]) <= set(ref[1]) and 0 < len(still[1]) < len(cases)
    for j in range(len(cases)):
        assert still[2][j] >= ref[2][j] - 1e-9 * (1 + abs(ref[2][j])), j
    L, H = centres - 0.05, centres + 0.05
    lb = real(L, H, np.array([[1.0, 0.0], [-1.0, 0.0]]))
    for k in range(0, 80, 7):
        X = L[k] + rng.uniform(size=(2000, 3)) * (H[k] - L[k])
        Y = forward(ws, bs, act, X, alpha)[:, 0]
        assert lb[k, 0] <= Y.min() and lb[k, 1] <= -Y.max()
        for r, j in enumerate((2 * k, 2 * k + 1)):  # the recorded margin: bound - b
            c = cases[j]
            assert still[2][j] == lb[k, r] - round_up(c.b)[0], j
            assert still[2][j] <= (Y * c.A[0, 0]).min() - c.b[0], j
