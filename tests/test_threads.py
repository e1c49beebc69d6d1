"""The BLAS thread switch (crown_cli.engine.threads), the input split's block size and its pool of open boxes."""
import os

import numpy as np
import scipy.linalg  # noqa: F401  (loads scipy's own OpenBLAS, which the numba kernels call)

from crown_cli.engine.threads import blas_threads, get_blas_threads
from crown_cli.verification.bab.input_split import BLOCK_MAX, BLOCK_MIN, auto_block


def test_blas_threads_sets_and_restores_every_loaded_openblas():
    before = get_blas_threads()
    assert before, "numpy's OpenBLAS was not found in /proc/self/maps"
    with blas_threads(1):
        assert get_blas_threads() == [1] * len(before)
        a = np.arange(9.0).reshape(3, 3)
        assert np.array_equal(a @ np.eye(3), a)
    assert get_blas_threads() == before


def test_blas_threads_restores_after_an_error():
    before = get_blas_threads()
    try:
        with blas_threads(1):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert get_blas_threads() == before


def test_one_thread_sets_numba_and_blas_and_restores_them():
    import numba

    from crown_cli.engine.kernels import choose_threading_layer
    from crown_cli.engine.threads import one_thread

    choose_threading_layer(numba)  # (before its threads start: forked helpers need it)
    blas, nb = get_blas_threads(), numba.get_num_threads()
    try:
        with one_thread():
            assert numba.get_num_threads() == 1
            assert get_blas_threads() == [1] * len(blas)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert numba.get_num_threads() == nb and get_blas_threads() == blas


def test_auto_block_keeps_the_temporaries_bounded():
    assert auto_block([5] + [50] * 6 + [5], 1) == 204  # ACAS Xu
    assert auto_block([30, 128, 2], 1) == BLOCK_MAX  # safenlp
    assert auto_block([784, 1024, 1024, 10], 9) == BLOCK_MIN
    # more rows or wider layers: never more boxes
    assert auto_block([5, 50, 50, 5], 40) <= auto_block([5, 50, 50, 5], 1)


def test_box_pool_takes_the_worst_and_keeps_the_rest():
    from crown_cli.verification.bab.domains import BoxPool

    rng = np.random.default_rng(0)
    score = rng.normal(size=50)
    pool = BoxPool(score=score[:10], lo=np.arange(10.0)[:, None] * np.ones((1, 3)))
    pool.push(score=score[10:], lo=np.arange(10.0, 50.0)[:, None] * np.ones((1, 3)))
    assert len(pool) == 50
    got = pool.pop_worst(7)
    assert np.array_equal(np.sort(got["score"]), np.sort(score)[:7])
    assert np.array_equal(got["lo"][:, 0], [np.flatnonzero(score == v)[0] for v in got["score"]])
    rest = pool.view("score")
    assert np.array_equal(np.sort(rest), np.sort(score)[7:])
    # every row keeps its fields together
    assert np.array_equal(score[pool.view("lo")[:, 0].astype(int)], rest)
    assert len(pool.pop_worst(100)["score"]) == 43 and len(pool) == 0


def test_numba_threads_started_by_one_thread_are_on_the_workqueue_layer():
    """one_thread may be the first to start numba's threads (a dense search before any graph
    kernel): they start on the workqueue layer, which a forked helper can use (numba's
    OpenMP layer ends a forked child at its first parallel kernel)."""
    import subprocess
    import sys

    code = ("import numba, crown_cli.engine.kernels.backsub\n"
            "from crown_cli.engine.threads import one_thread\n"
            "with one_thread():\n    pass\n"
            "import crown_cli.engine.kernels.graph_steps\n"
            "print(numba.threading_layer())\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "workqueue"
