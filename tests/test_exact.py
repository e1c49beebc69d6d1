"""CROWN / Fast-Lin against exact MILP answers on small ReLU networks (l_inf).

For each instance (network, x0, predicted class c, target t) the MILP oracle in
tests/oracles.py gives the exact minimum l_inf distortion that makes f_t >= f_c, together with
an adversarial point at that distance, and the exact minimum margin f_c - f_t over a box.
Certified radii are lower bounds of the minimum distortion (paper, Section 3), so they must
not exceed the exact value; lower bounds of the margin must not exceed its exact minimum.

Networks: the paper's small MNIST shapes 2x[20] and 3x[20] (784 -> 20 -> 10 and
784 -> 20 -> 20 -> 10), both the trained models in models/ and random weights (Gaussian /
sqrt(fan-in), biases 0.1 N(0,1)), with x0 from the shipped MNIST file; plus 10-input versions
at random x0. The random-network instances are fixed; the MNIST ones were chosen among images
0-3 so that HiGHS proves optimality within a few seconds each (the cost of exact verification
grows quickly with the radius and depth: some 3x[20] instances need minutes). The trained
models are checked on their first 5 correctly classified shipped images: against the exact
distortion for the runner-up target, and against the exact minimum margin at 1.25 x CROWN's
radius for the third-ranked target (first 3 images; the distortion MILPs for that target cost
up to 20 s each). The balls are not clipped to the pixel range.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

from conftest import slow_if
from crown_cli.certification.certifier import Certifier
from oracles import (
    MilpResult,
    exact_margin_min,
    exact_min_linf_distortion,
    mlp_forward,
    random_mlp,
)

METHODS = ("crown", "fast-lin")
EXACT_RTOL = 1e-6  # solver tolerance allowed when comparing radii with the MILP optimum
FLIP_ATOL = 1e-6  # the MILP optimum must flip the decision up to this margin
FP_SLACK = 1e-9  # float64 evaluation slack when comparing lower bounds with real margins
TIME_LIMIT = 60.0  # seconds per MILP query; far above what the instances below need
TRAINED_TIME_LIMIT = 30.0  # per distortion query on the trained models (see below)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST_FILE = os.path.join(ROOT, "crown_cli", "data", "mnist_test_100.npz")

MNIST_2x20, MNIST_3x20 = (784, 20, 10), (784, 20, 20, 10)
# (layer sizes, weight seed, image index, target): 'runner-up' or 'random' (another class
# drawn with rng seed 100 * seed + image among the remaining classes)
MNIST_CASES = (
    [(MNIST_2x20, 2, i, kind) for i in range(2) for kind in ("runner-up", "random")]
    + [(MNIST_3x20, 1, i, "runner-up") for i in (0, 2)]
)
# 10-input networks at random x0 = N(0, I) (seed 10 * seed + k)
SMALL_CASES = [
    (sizes, seed, k, kind)
    for sizes in ((10, 20, 10), (10, 20, 20, 10))
    for seed in (0, 1)
    for k in (0, 1)
    for kind in ("runner-up", "random")
]
ALL_CASES = MNIST_CASES + SMALL_CASES
# trained models (scripts/train_mlp.py): (file, k, target) = the k-th correctly classified
# shipped image, target 'runner-up' or 'third' (the third-largest logit)
TRAINED_MODELS = ("mnist_2x20.h5", "mnist_3x20.h5")
N_TRAINED_IMAGES = 5
TRAINED_CASES = [(name, k, kind) for name in TRAINED_MODELS for kind in ("runner-up", "third")
                 for k in range(N_TRAINED_IMAGES)]


def _case_id(case):
    if isinstance(case[0], str):
        name, k, kind = case
        return f"{name[:-3]}_correct{k}_{kind}"
    sizes, seed, k, kind = case
    where = f"img{k}" if sizes[0] == 784 else f"x{k}"
    return f"{'-'.join(map(str, sizes))}_s{seed}_{where}_{kind}"


@dataclass
class Instance:
    weights: list
    biases: list
    x0: np.ndarray
    c: int
    t: int
    eps: dict  # method -> certified radius
    exact: Optional[MilpResult]  # None if the exact distortion was not asked for
    certifiers: dict  # method -> Certifier


@functools.lru_cache(maxsize=None)
def _mnist_images():
    with np.load(MNIST_FILE) as data:
        return np.asarray(data["x"], dtype=np.float64), np.asarray(data["y"])


@functools.lru_cache(maxsize=None)
def instance(case) -> Instance:
    """Certify with both methods and solve the exact distortion MILP (cached per case)."""
    sizes, seed, k, kind = case
    weights, biases = random_mlp(list(sizes), seed)
    if sizes[0] == 784:
        x0 = _mnist_images()[0][k]
        rng = np.random.default_rng(100 * seed + k)
    else:
        x0 = np.random.default_rng(10 * seed + k).standard_normal(sizes[0])
        rng = np.random.default_rng(1000 + 10 * seed + k)
    order = [int(j) for j in np.argsort(-mlp_forward(weights, biases, "relu", x0))]
    c = order[0]
    t = order[1] if kind == "runner-up" else int(rng.choice(order[2:]))
    return _solve_instance(weights, biases, x0, c, t)


@functools.lru_cache(maxsize=None)
def _trained(name):
    """(weights, biases, indices of the correctly classified shipped images) of a model."""
    from crown_cli.io.models import load_model

    path = os.path.join(ROOT, "models", name)
    assert os.path.exists(path), f"trained model {path} is missing (scripts/train_mlp.py)"
    model = load_model(path)
    assert model.activation == "relu", model.activation
    x, y = _mnist_images()
    pred = np.argmax(mlp_forward(model.weights, model.biases, "relu", x), axis=1)
    return model.weights, model.biases, np.flatnonzero(pred == y)


@functools.lru_cache(maxsize=None)
def trained_instance(case, with_exact) -> Instance:
    name, k, kind = case
    weights, biases, correct = _trained(name)
    x0 = _mnist_images()[0][correct[k]]
    order = [int(j) for j in np.argsort(-mlp_forward(weights, biases, "relu", x0))]
    return _solve_instance(weights, biases, x0, order[0],
                           order[1] if kind == "runner-up" else order[2], with_exact,
                           time_limit=TRAINED_TIME_LIMIT)


def _solve_instance(weights, biases, x0, c, t, with_exact=True,
                    time_limit=TIME_LIMIT) -> Instance:
    certifiers = {m: Certifier(weights, biases, activation="relu", norm="inf", method=m)
                  for m in METHODS}
    eps = {}
    for m, cert in certifiers.items():
        res = cert.certify(x0, c, [t])
        assert res.status == "certified", (m, res)
        eps[m] = res.eps
    exact = None
    if with_exact:
        exact = exact_min_linf_distortion(weights, biases, x0, c, t, time_limit=time_limit)
    return Instance(weights, biases, x0, c, t, eps, exact, certifiers)


def check_against_exact_distortion(inst: Instance, label: str, require_optimal=True):
    """Certified radii <= exact minimum distortion; the MILP optimum really flips.

    require_optimal=False accepts a MILP stopped by its time limit: its point is still a real
    adversarial example, so its distance still upper-bounds every certified radius.
    """
    ex = inst.exact
    ok = ("optimal",) if require_optimal else ("optimal", "time-limit")
    assert ex.status in ok and ex.x is not None, f"{label}: MILP oracle did not finish: {ex}"
    dist = float(np.max(np.abs(ex.x - inst.x0)))
    assert dist <= ex.value * (1 + 1e-12), f"{label}: witness at {dist} > reported {ex.value}"
    f = mlp_forward(inst.weights, inst.biases, "relu", ex.x)
    assert f[inst.t] >= f[inst.c] - FLIP_ATOL, (
        f"{label}: MILP optimum does not flip: f_c - f_t = {f[inst.c] - f[inst.t]:.3e}")
    for m, eps in inst.eps.items():
        assert eps <= ex.value * (1 + EXACT_RTOL), (
            f"{label}: {m} certified l_inf radius {eps:.8g} exceeds the exact minimum "
            f"distortion {ex.value:.8g} (ratio {eps / ex.value:.6f})")


def check_lower_bounds(inst: Instance, radii, label: str):
    """lower_bound at fixed radii <= exact minimum margin over the box (MILP)."""
    C = inst.certifiers["crown"].margin_rows(inst.c, [inst.t])
    for name, eps in radii:
        mm = exact_margin_min(inst.weights, inst.biases, inst.x0, inst.c, inst.t, eps,
                              time_limit=TIME_LIMIT)
        assert mm.x is not None, f"{label}: margin MILP failed at eps={eps}: {mm}"
        assert np.max(np.abs(mm.x - inst.x0)) <= eps * (1 + 1e-12)
        for m, cert in inst.certifiers.items():
            lb = float(cert.lower_bound(inst.x0, eps, C)[0])
            # mm.value is the numpy margin of a point inside the box: >= the true minimum
            assert lb <= mm.value + FP_SLACK, (
                f"{label}: {m} lower bound {lb:.8g} at eps={eps:.6g} ({name}) exceeds the "
                f"exact minimum margin {mm.value:.8g} (MILP status {mm.status})")
        if name == "exact distortion":  # the oracles agree: the optimum flips at this radius
            assert mm.value <= FLIP_ATOL, f"{label}: min margin {mm.value} at exact radius"


# the slow tier takes the random targets and the second seed of the two-hidden-layer small
# networks, and mnist_3x20's third image
ALL_PARAMS = [slow_if((len(c[0]) == 4 and c[0][0] == 10 and (c[3] == "random" or c[1] == 1))
                      or (c[0][0] == 784 and len(c[0]) == 4 and c[2] == 2), c)
              for c in ALL_CASES]


@pytest.mark.parametrize("case", ALL_PARAMS, ids=_case_id)
def test_certified_radius_at_most_exact_distortion(case):
    check_against_exact_distortion(instance(case), _case_id(case))


@pytest.mark.parametrize("case", ALL_PARAMS, ids=_case_id)
def test_lower_bound_at_most_exact_min_margin(case):
    inst = instance(case)
    ec, ex = inst.eps["crown"], inst.exact.value
    radii = [("between certified and exact", 0.5 * (ec + ex))]
    if case in SMALL_CASES:  # cheap MILPs: also at both ends
        radii += [("certified", ec), ("exact distortion", ex)]
    check_lower_bounds(inst, radii, _case_id(case))


# the default tier keeps mnist_2x20's first two images, the slow tier adds the others and
# mnist_3x20's
@pytest.mark.parametrize("case", [slow_if(c[0] == "mnist_3x20.h5" or c[1] >= 2, c)
                                  for c in TRAINED_CASES if c[2] == "runner-up"], ids=_case_id)
def test_trained_model_certified_radius_at_most_exact_distortion(case):
    # the models may be retrained: a hard instance must not fail the test, only weaken it
    check_against_exact_distortion(trained_instance(case, True), _case_id(case),
                                   require_optimal=False)


@pytest.mark.parametrize("case", [slow_if(c[0] == "mnist_3x20.h5", c) for c in TRAINED_CASES
                                  if c[2] == "third" and c[1] < 3], ids=_case_id)
def test_trained_model_lower_bound_at_most_exact_min_margin(case):
    """Third-ranked target, at 1.25 x CROWN's certified radius (no distortion MILP here)."""
    inst = trained_instance(case, False)
    check_lower_bounds(inst, [("1.25 x certified", 1.25 * inst.eps["crown"])], _case_id(case))


def _summary(group):
    """Certified radii (crown, fast-lin) and exact distortions (nan if not computed)."""
    if group == "trained":
        insts = [trained_instance(c, c[2] == "runner-up") for c in TRAINED_CASES]
    else:
        insts = [instance(c) for c in (MNIST_CASES if group == "mnist-random" else SMALL_CASES)]
    crown = np.array([i.eps["crown"] for i in insts])
    fast = np.array([i.eps["fast-lin"] for i in insts])
    exact = np.array([i.exact.value if i.exact is not None else np.nan for i in insts])
    return crown, fast, exact


# "trained" solves every trained case's MILP (the slow tier's too)
@pytest.mark.parametrize("group", [slow_if(True, "trained"), "mnist-random",
                                   slow_if(True, "small")])
def test_crown_at_least_fastlin_on_average(group):
    """The paper's claim (Sections 3.2, 4): CROWN-Ada certifies larger radii than Fast-Lin."""
    crown, fast, exact = _summary(group)
    has = ~np.isnan(exact)
    msg = (f"{group} ({len(crown)} instances): mean CROWN eps {crown.mean():.6g} vs Fast-Lin "
           f"{fast.mean():.6g} (ratio of means {crown.mean() / fast.mean():.4f}; mean of "
           f"ratios {np.mean(crown / fast):.4f}); mean certified/exact over {has.sum()}: CROWN "
           f"{np.mean(crown[has] / exact[has]):.4f}, "
           f"Fast-Lin {np.mean(fast[has] / exact[has]):.4f}")
    assert crown.mean() >= fast.mean(), msg
    print(msg)


@pytest.mark.parametrize("case", [slow_if(c[3] == "random" and len(c[0]) == 4, c) for c in SMALL_CASES
                                  if c[1] == 0 and c[2] == 0], ids=_case_id)
def test_distortion_oracle_formulations_agree(case):
    """The region-refinement oracle equals the single 'direct' MILP (min delta) on small nets."""
    inst = instance(case)
    direct = exact_min_linf_distortion(inst.weights, inst.biases, inst.x0, inst.c, inst.t,
                                       eps_hi=inst.exact.value * 1.5, method="direct",
                                       time_limit=TIME_LIMIT)
    assert direct.status == "optimal", direct
    assert abs(direct.value - inst.exact.value) <= 1e-6 * inst.exact.value, (
        f"{_case_id(case)}: direct MILP {direct.value:.10g} vs region {inst.exact.value:.10g}")
