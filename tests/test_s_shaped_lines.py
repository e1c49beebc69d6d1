"""The default lines of tanh, sigmoid and arctan (least-area tangents where l < 0 < u)
against the paper's (``--method crown-paper``) and an independent implementation's radii, and
the soundness of certified radii on 2-input networks by a dense grid (no MILP exists for these
activations)."""
import csv
import os

import numpy as np
import pytest

from crown_cli.activations import forward
from crown_cli.certification.certifier import Certifier
from crown_cli.io.images import load_images
from crown_cli.io.models import load_model
from conftest import model_path, slow_if

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "fixtures", "reference")  # see its README


def _reference(act):
    path = os.path.join(REFERENCE, f"auto_lirpa_crown__mnist_3x1024_{act}__inf__runner-up.csv")
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        return {int(r["image"]): (int(r["label"]), int(r["target"]), float(r["eps"]))
                for r in csv.DictReader(fh)}


@pytest.mark.slow
@pytest.mark.parametrize("act", ["tanh", "sigmoid", "arctan"])
def test_default_lines_certify_at_least_the_papers_and_auto_lirpas_radius(act):
    """Per image of the shipped 3x[1024] network: crown >= crown-paper, and crown >= the
    reference radius of auto_LiRPA's plain CROWN (float64, bisection to 1e-5) within the
    search tolerance."""
    mlp = load_model(model_path(f"mnist_3x1024_{act}.h5"))
    x, y = load_images(None)
    new = Certifier(mlp.weights, mlp.biases, act, norm="inf", method="crown", rtol=1e-5)
    old = Certifier(mlp.weights, mlp.biases, act, norm="inf", method="crown-paper", rtol=1e-5)
    ref = _reference(act)
    z = new.logits(x[:6])
    checked = gained = 0
    for i in range(6):
        order = np.argsort(z[i])
        c, t = int(order[-1]), int(order[-2])
        if c != y[i]:
            continue
        e_new = new.certify(x[i], c, [t]).eps
        e_old = old.certify(x[i], c, [t]).eps
        assert e_new >= e_old * (1 - 1e-5), (i, e_new, e_old)
        gained += e_new > e_old * 1.001
        if i in ref:
            label, target, eps = ref[i]
            assert (label, target) == (c, t)
            assert e_new >= eps * (1 - 1e-4), (i, e_new, eps)
        checked += 1
    assert checked >= 4 and gained >= 3
    if act != "arctan":
        assert ref, "reference radii missing from tests/fixtures/reference"


def _two_input_net(act, seed):
    rng = np.random.default_rng(seed)
    sizes = [2, 12, 12, 3]
    ws = [rng.normal(size=(o, i)) * 1.5 / np.sqrt(i) for i, o in zip(sizes[:-1], sizes[1:])]
    bs = [0.3 * rng.normal(size=o) for o in sizes[1:]]
    return ws, bs


@pytest.mark.parametrize("act", ["tanh", "sigmoid", "arctan"])
@pytest.mark.parametrize("method", ["crown", "crown-paper", "alpha-crown"])
@pytest.mark.parametrize("seed", [0, 1, slow_if(True, 2)])
def test_certified_boxes_hold_on_a_dense_grid(act, method, seed):
    """A certified l_inf radius of a 2-input network: on a 401 x 401 grid over the certified
    box (and its boundary) the predicted class never ties or loses to the target."""
    ws, bs = _two_input_net(act, seed)
    x0 = np.random.default_rng(100 + seed).uniform(-0.5, 0.5, 2)
    z = forward(ws, bs, act, x0)
    order = np.argsort(z)
    c, t = int(order[-1]), int(order[-2])
    cert = Certifier(ws, bs, act, norm="inf", method=method)
    eps = cert.certify(x0, c, [t]).eps
    assert eps > 0
    g = np.linspace(-eps, eps, 401)
    X = x0 + np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2)
    Y = forward(ws, bs, act, X)
    assert np.all(Y[:, c] > Y[:, t]), (act, method, eps)
