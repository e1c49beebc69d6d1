import os
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one pytest worker per core (pytest -n 2, the README's command): each worker's BLAS and
    # numba kernels on one thread, so the workers do not share the cores twice over
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # the tests' shared helpers (reference_crown, oracles)


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="Rewrite tests/golden/*.csv from the current code instead of comparing "
                          "(add -m 'slow or not slow': mnist_3x1024's is in the slow tier).")


@pytest.fixture
def regen_golden(request):
    return request.config.getoption("--regen-golden")


@pytest.fixture(scope="session")
def mnist100():
    """The shipped first 100 MNIST test images (x scaled to [-0.5, 0.5], y)."""
    from crown_cli.io.images import load_images

    return load_images(None)


def slow_if(condition, *values, id=None):
    """One parametrize case, in the slow tier (``-m slow``; docs/testing.md) when
    ``condition``: the larger cases of a check whose smaller ones stay in the default tier."""
    return pytest.param(*values, marks=[pytest.mark.slow] if condition else [], id=id)


def model_path(name):
    return os.path.join(ROOT, "models", name)


def random_network(sizes, seed, bias_scale=0.1):
    rng = np.random.default_rng(seed)
    ws = [rng.normal(size=(sizes[i + 1], sizes[i])) / np.sqrt(sizes[i]) for i in range(len(sizes) - 1)]
    bs = [bias_scale * rng.normal(size=sizes[i + 1]) for i in range(len(sizes) - 1)]
    return ws, bs


def error_line(res):
    """The one stderr line of a refused command (crown's own errors are one line), without a
    traceback."""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("crown: error: "), lines[0]
    assert "Traceback" not in res.output
    return lines[0]


def interrupt_row_writes(monkeypatch, at: int = 3):
    """Make the ``at``-th row write of a result file raise KeyboardInterrupt (Ctrl-C in the
    middle of a run); returns the real ``RowWriter.write`` to put back."""
    from crown_cli.io import result_files

    real = result_files.RowWriter.write
    calls = []

    def write(self, row):
        calls.append(row)
        if len(calls) == at:
            raise KeyboardInterrupt
        real(self, row)

    monkeypatch.setattr(result_files.RowWriter, "write", write)
    return real
