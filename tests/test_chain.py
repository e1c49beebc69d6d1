"""The batched back-substitution step (crown_cli.engine.batch_steps) against a plain-loop twin:
every coefficient's side, slope, intercept and split term, and the sums a step adds."""
import numpy as np
import pytest

from crown_cli.engine.batch_steps import Lines, Rows, relax


def _loop_relax(Lam, cols, stable, lower, upper, upper_icpt, lower_icpt, extra):
    """One coefficient at a time: Lam (N, r, n); line arrays (N, r, c) already broadcast."""
    N, r, n = Lam.shape
    D = np.zeros((N, r, n)) if stable is not None else np.zeros((N, r, len(cols)))
    icpt = np.zeros((N, r, len(cols)))
    for a in range(N):
        for b in range(r):
            if stable is not None:
                for j in range(n):
                    D[a, b, j] = Lam[a, b, j] * stable[j]
            for q, j in enumerate(cols):
                v = Lam[a, b, j]
                if v >= 0.0:
                    s, t = lower[a, b, q], (0.0 if lower_icpt is None else lower_icpt[a, b, q])
                else:
                    s, t = upper[a, b, q], (0.0 if upper_icpt is None else upper_icpt[a, b, q])
                d = v * s + (0.0 if extra is None else extra[a, b, q])
                D[a, b, j if stable is not None else q] = d
                icpt[a, b, q] = v * t
    return D, icpt


@pytest.mark.parametrize("with_stable", [True, False])
@pytest.mark.parametrize("with_icpts", [True, False])
def test_relax_matches_a_loop(with_stable, with_icpts):
    rng = np.random.default_rng(3)
    N, r, n = 4, 3, 9
    Lam = rng.normal(size=(N, r, n))
    Lam[0, 0, :3] = 0.0  # a zero coefficient takes the lower line
    cols = np.array([1, 4, 5, 8])
    shape = (N, r, cols.size)
    lower, upper = rng.uniform(0, 1, shape), rng.uniform(0, 1, shape)
    up_i = rng.normal(size=shape) if with_icpts else None
    lo_i = rng.normal(size=shape) if with_icpts else None
    extra = rng.normal(size=shape)
    stable = rng.choice([0.0, 0.2, 1.0], size=n) if with_stable else None
    D, icpt, pos, slope = relax(Lam, Lines(cols, lower, upper, up_i, lo_i, stable, extra))
    D_ref, icpt_ref = _loop_relax(Lam, cols, stable, lower, upper, up_i, lo_i, extra)
    np.testing.assert_array_equal(D, D_ref)
    np.testing.assert_array_equal(icpt, icpt_ref)
    np.testing.assert_array_equal(pos, Lam[..., cols] >= 0.0)
    np.testing.assert_array_equal(slope, np.where(pos, lower, upper))
    assert D.flags["C_CONTIGUOUS"]


def test_relax_of_a_broadcast_batch_gives_contiguous_rows():
    """A batch of one matrix broadcast over its domains (input splitting's first rows)."""
    rng = np.random.default_rng(4)
    M = rng.normal(size=(5, 7))
    Lam = np.broadcast_to(M[None], (6, 5, 7))
    cols = np.arange(7)
    lines = Lines(cols, rng.uniform(size=(6, 1, 7)), rng.uniform(size=(6, 1, 7)))
    D, _, _, _ = relax(Lam, lines)
    assert D.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(D, np.ascontiguousarray(Lam) * np.where(Lam >= 0, lines.lower,
                                                                           lines.upper))


@pytest.mark.parametrize("shared_v", [True, False])
def test_rows_step_adds_the_constant_magnitude_and_rounding_charge(shared_v):
    rng = np.random.default_rng(5)
    N, r, c, m = 3, 2, 6, 4
    D = rng.normal(size=(N, r, c))
    icpt = rng.normal(size=(N, r, c))
    bias, W = rng.normal(size=c), rng.normal(size=(c, m))
    v = rng.uniform(size=c) if shared_v else rng.uniform(size=(N, c))
    t = 1e-20 if shared_v else rng.uniform(size=N) * 1e-20
    const0, mag0, ch0 = rng.normal(size=(N, r)), rng.uniform(size=(N, r)), rng.uniform(size=(N, r))
    rows = Rows(np.zeros((N, r, c)), const0.copy(), mag0.copy(), ch0.copy())
    rows.step(D, icpt, bias, W, (v, t))
    for a in range(N):
        for b in range(r):
            d, ic = D[a, b], icpt[a, b]
            vv = v if shared_v else v[a]
            tt = t if shared_v else t[a]
            assert rows.const[a, b] == pytest.approx(const0[a, b] + ic.sum() + d @ bias, rel=1e-12)
            assert rows.mag[a, b] == pytest.approx(
                mag0[a, b] + np.abs(ic).sum() + np.abs(d) @ np.abs(bias), rel=1e-12)
            assert rows.charge[a, b] == pytest.approx(ch0[a, b] + np.abs(d) @ vv + tt, rel=1e-12)
            np.testing.assert_allclose(rows.Lam[a, b], d @ W, rtol=1e-12, atol=1e-12)


def test_float32_rows_carry_no_magnitude():
    rng = np.random.default_rng(6)
    D = rng.normal(size=(4, 5)).astype(np.float32)
    rows = Rows(np.zeros((4, 5), np.float32), np.zeros(4))
    rows.step(D, np.zeros((4, 2), np.float32), np.ones(5, np.float32), np.eye(5, dtype=np.float32))
    assert rows.mag is None and rows.charge is None
    assert rows.Lam.dtype == np.float32
    np.testing.assert_allclose(rows.const, D.sum(axis=1), rtol=1e-6)
