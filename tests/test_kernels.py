"""The numpy kernels (crown_cli/kernels_numpy.py) and relaxations (relaxations/relu_numpy.py)
against their numba originals, and the engine's switch between the two."""
import numpy as np
import pytest

from conftest import random_network
from crown_cli.engine import dense_crown as crown
from crown_cli.engine.kernels import KERNELS, kernels, kernels_backend, set_kernels, using_kernels
from crown_cli.engine.kernels import dense_steps as nb
from crown_cli.engine.kernels import dense_steps_numpy as vn
from crown_cli.certification.certifier import Certifier
from crown_cli.engine.relaxations import get_relaxation
from crown_cli.engine.relaxations import extra
from crown_cli.engine.relaxations import relu
from crown_cli.engine.relaxations import relu_numpy

# Every D entry and every constant term is the same float64 product in both; only the order
# of the float64 sums differs, by ~n * 2**-53 of the magnitude sum at most.
REL = 1e-12


def _sums_agree(a, b, mag):
    """Sums of the same terms in another order: equal up to REL of their magnitude sum."""
    assert a.dtype == b.dtype == np.float64 and a.shape == b.shape
    assert np.all(np.abs(a - b) <= REL * mag + 1e-300), np.max(np.abs(a - b) / (mag + 1e-300))


def _relaxation(rng, n):
    """Slopes/intercepts with equal, different and zero slopes and zero intercepts mixed."""
    aU = rng.uniform(0.0, 2.0, n)
    aL = np.where(rng.random(n) < 0.5, aU, rng.uniform(-1.0, 1.0, n))
    aU[rng.random(n) < 0.15] = 0.0
    aL[rng.random(n) < 0.15] = 0.0
    bU = np.where(rng.random(n) < 0.5, rng.normal(size=n), 0.0)
    bL = np.where(rng.random(n) < 0.5, rng.normal(size=n), 0.0)
    rl = crown.Relaxation(aU, bU, aL, bL)
    return aU, bU, aL, bL, rl


# (rows, columns): zero rows, zero columns, one of each, and blocks of rows (see BLOCK below)
SHAPES = [(0, 7), (5, 0), (0, 0), (1, 1), (6, 13), (40, 90), (300, 37)]


@pytest.fixture(params=[None, 64], ids=["block-default", "block-64"])
def block(request, monkeypatch):
    """Run each case with the default row blocks and with tiny ones (many blocks per call)."""
    if request.param is not None:
        monkeypatch.setattr(vn, "BLOCK", request.param)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("r,n", SHAPES)
def test_relax_kernels_match_numba(block, r, n, dtype):
    rng = np.random.default_rng(r * 1000 + n)
    for trial in range(4):
        Lam = rng.normal(size=(r, n)).astype(dtype)
        Lam[rng.random((r, n)) < 0.1] = 0.0  # v = 0 takes the v >= 0 side in both
        aU, bU, aL, bL, rl = _relaxation(rng, n)
        if trial == 1:  # every column agrees
            aL, rl = aU.copy(), crown.Relaxation(aU, bU, aU.copy(), bL)
        if trial == 2:  # every slope and intercept 0: empty column sets
            z = np.zeros(n)
            aU, bU, aL, bL, rl = z, z, z, z, crown.Relaxation(z, z, z, z)
        bias = rng.normal(size=n)
        args = (aU, bU, aL, bL, bias, rl.agree, rl.diff, rl.icols)
        want, got = nb.relax_shared(Lam, *args), vn.relax_shared(Lam, *args)
        for w, g in zip(want[:3], got[:3]):  # DS, DU, DL: bit-identical, in Lam's dtype
            assert g.dtype == w.dtype == dtype and g.shape == w.shape
            assert np.array_equal(g, w)
        cU, cL, mU, mL = want[3:]
        _sums_agree(got[3], cU, mU)
        _sums_agree(got[4], cL, mL)
        _sums_agree(got[5], mU, mU)
        _sums_agree(got[6], mL, mL)
        for side in ((aU, bU, aL, bL), (aL, bL, aU, bU)):
            args = (*side, bias, rl.cols, rl.icols)
            (D, c, m), (gD, gc, gm) = nb.relax_chain(Lam, *args), vn.relax_chain(Lam, *args)
            assert gD.dtype == D.dtype == dtype and np.array_equal(gD, D)
            _sums_agree(gc, c, m)
            _sums_agree(gm, m, m)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("r,n", SHAPES)
@pytest.mark.parametrize("qcode", [0, 1, 2])
def test_input_terms_and_norms_match_numba(block, r, n, dtype, qcode):
    rng = np.random.default_rng(r + 7 * n + qcode)
    A = rng.normal(size=(r, n)).astype(dtype)
    x0 = rng.uniform(-0.5, 0.5, n)
    (lin, nrm, mag), (glin, gnrm, gmag) = nb.input_terms(A, x0, qcode), vn.input_terms(A, x0, qcode)
    _sums_agree(glin, lin, mag)
    _sums_agree(gmag, mag, mag)
    _sums_agree(gnrm, nrm, nrm)  # l2 squares in A's dtype in both; the max is exact
    _sums_agree(vn.dual_norms(A, qcode), nb.dual_norms(A, qcode), nrm)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("r,n", SHAPES)
def test_absdot_matches_numba_and_a_plain_sum(block, r, n, dtype):
    rng = np.random.default_rng(3 * r + n)
    D = rng.normal(size=(r, n)).astype(dtype)
    w = rng.uniform(0.0, 2.0, n)
    want, got = nb.absdot(D, w), vn.absdot(D, w)
    plain = np.array([sum(abs(float(d)) * float(x) for d, x in zip(row, w)) for row in D], float)
    assert want.dtype == got.dtype == np.float64 and want.shape == got.shape == (r,)
    _sums_agree(want, plain, plain)
    _sums_agree(got, plain, plain)


# ----------------------------------------------------------------------------- relaxations


def _intervals(rng, n=3000):
    l = rng.normal(size=n) * 3
    u = l + np.abs(rng.normal(size=n)) * 3 * (rng.random(n) < 0.9)  # some u == l
    edge_l = [-np.inf, -1e-300, 0.0, -0.0, -2.0, 1.0, -5.0, 0.0, -1.0, -1e300]
    edge_u = [-1.0, 1e-300, 0.0, 0.0, 2.0, 1.0, 0.0, 3.0, -0.0, 1e300]
    return np.concatenate([l, edge_l]), np.concatenate([u, edge_u])


@pytest.mark.parametrize("adaptive", [True, False])
def test_relu_twin_is_bit_identical(adaptive):
    l, u = _intervals(np.random.default_rng(3))
    for w, g in zip(relu.relu_relaxation(l, u, adaptive), relu_numpy.relu_relaxation(l, u, adaptive)):
        assert np.array_equal(g, w)


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.2, 1.0, 1.5, 3.0, -0.5])
@pytest.mark.parametrize("adaptive", [True, False])
def test_leaky_relu_twin_is_bit_identical(alpha, adaptive):
    l, u = _intervals(np.random.default_rng(4))
    want = extra.leaky_relu_relaxation(l, u, alpha, adaptive)
    for w, g in zip(want, relu_numpy.leaky_relu_relaxation(l, u, alpha, adaptive)):
        assert np.array_equal(g, w)
    with pytest.raises(ValueError, match="alpha must be finite"):
        relu_numpy.leaky_relu_relaxation(l, u, np.inf, adaptive)


def _closes_over(fn):
    return [c.cell_contents for c in fn.__closure__]


def test_registry_follows_the_kernels():
    l, u = np.array([-1.0, 0.5]), np.array([2.0, 1.0])
    with using_kernels("numpy"):
        assert kernels_backend() == "numpy" and kernels() is vn
        relu_fn = get_relaxation("relu", "crown")
        leaky_fn = get_relaxation("leaky_relu", "fast-lin", 0.1)
    assert kernels_backend() == "numba" and kernels() is nb
    assert relu_numpy.relu_relaxation in _closes_over(relu_fn)
    assert relu_numpy.leaky_relu_relaxation in _closes_over(leaky_fn)
    assert relu.relu_relaxation in _closes_over(get_relaxation("relu", "crown"))
    assert extra.leaky_relu_relaxation in _closes_over(get_relaxation("leaky_relu", "crown", 0.1))
    for a, b in zip(relu_fn(l, u), relu.relu_relaxation(l, u, True)):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="unknown kernels 'cuda'"):
        set_kernels("cuda")


# ----------------------------------------------------------------------------- certify


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
@pytest.mark.parametrize("precision", ["mixed", "float64"])
@pytest.mark.parametrize("norm", ["inf", "2", "1"])
def test_certify_gives_the_same_eps_with_either_kernels(activation, precision, norm):
    # Not bit-identical: the float64 sums run in another order, so the search (steered by
    # float32 bounds, refined by interpolation) can take other steps. Each answer is a
    # verified radius inside a final bracket of relative width rtol around the same limit,
    # so they agree within rtol (in practice to ~1e-8 or better).
    ws, bs = random_network([40, 32, 24, 16, 6], seed=11)
    x = np.random.default_rng(5).uniform(-0.5, 0.5, (6, 40))
    eps = {}
    for backend in KERNELS:
        with using_kernels(backend):
            cert = Certifier(ws, bs, activation, norm=norm, precision=precision, rtol=1e-4)
            out = []
            for x0 in x:
                order = np.argsort(cert.logits(x0))
                out.append(cert.certify(x0, int(order[-1]), [int(order[-2]), int(order[0])]).eps)
            eps[backend] = np.array(out)
    assert np.all(eps["numba"] > 0)
    assert np.allclose(eps["numpy"], eps["numba"], rtol=1e-4, atol=0)
