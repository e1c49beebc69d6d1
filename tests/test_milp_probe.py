"""scripts/milp_probe.py: its MILP minimum lies between the batched CROWN bound and the
smallest sampled value, and on a 2-input network within 1% of 200,000 samples' minimum."""
import importlib.util
import os

import numpy as np

from conftest import ROOT
from crown_cli.engine.dense_boxes import BatchNet, batch_lower_bounds
from oracles import mlp_forward, random_mlp


def _probe():
    spec = importlib.util.spec_from_file_location(
        "milp_probe", os.path.join(ROOT, "scripts", "milp_probe.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_milp_minimum_between_crown_and_samples():
    probe = _probe()
    rng = np.random.default_rng(3)
    for seed, sizes in enumerate([[2, 10, 3], [4, 8, 8, 2]]):
        ws, bs = random_mlp(sizes, seed)
        d = sizes[0]
        lo = rng.uniform(-1.0, 0.0, d)
        hi = lo + rng.uniform(0.3, 1.0, d)
        a = rng.standard_normal(sizes[-1])
        value, dual, _, _, _ = probe.margin_milp(ws, bs, lo, hi, a, 0.25, 60.0)
        lb, _ = batch_lower_bounds(BatchNet(ws, bs), lo[None], hi[None], a[None])
        X = rng.uniform(lo, hi, (200_000 if d == 2 else 20_000, d))
        sampled = float(np.min(mlp_forward(ws, bs, "relu", X) @ a)) - 0.25
        assert lb[0, 0] - 0.25 <= value + 1e-7
        assert value <= sampled + 1e-7
        if d == 2:  # a fine grid comes within a hair of the true minimum
            assert sampled - value < 1e-2 * (1 + abs(value))
