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

    from crown_cli.engine.threads import one_thread

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


def test_every_parallel_graph_kernel_has_a_serial_twin_that_gives_the_same_arrays():
    """graph_steps.SERIAL: each parallel kernel compiled without threads (what a forked
    helper runs), the plain functions calling twins; graph_kernels() hands them out after
    use_serial_kernels (serial_kernels for a block) and the threaded ones otherwise."""
    from numba.core.registry import CPUDispatcher

    from crown_cli.engine import kernels
    from crown_cli.engine.kernels import graph_steps

    parallel = [k for k, f in vars(graph_steps).items()
                if isinstance(f, CPUDispatcher) and f.targetoptions.get("parallel")]
    assert len(parallel) >= 10
    for k in parallel:
        twin = getattr(graph_steps.SERIAL, k)
        assert isinstance(twin, CPUDispatcher) and not twin.targetoptions.get("parallel"), k
    assert graph_steps.SERIAL.transpose_rows.__globals__["conv_transpose"] is \
        graph_steps.SERIAL.conv_transpose
    rng = np.random.default_rng(0)
    L, w = rng.normal(size=(5, 4, 6, 6)), rng.normal(size=(4, 3, 3, 3))
    args = ((1, 1), (1, 1), (1, 1, 1, 1), 1, (3, 6, 6))
    with kernels.serial_kernels():
        assert kernels.graph_kernels() is graph_steps.SERIAL
        G = kernels.graph_kernels().transpose_rows(L, w, *args)
    assert kernels.graph_kernels() is graph_steps
    np.testing.assert_array_equal(G, graph_steps.transpose_rows(L, w, *args))
    St, Pt = rng.normal(size=(2, 40, 7))
    a, b = np.empty_like(St), np.empty_like(St)
    ca, cb = np.zeros(7), np.zeros(7)
    m = np.arange(40)
    graph_steps.merge_rows_t(St, m, Pt, m, np.abs(St[:, 0]), a, ca)
    graph_steps.SERIAL.merge_rows_t(St, m, Pt, m, np.abs(St[:, 0]), b, cb)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ca, cb)


HELPER_AFTER_THREADS = """
import numba, numpy as np
from crown_cli.engine.kernels import graph_kernels
from crown_cli.verification.bab.workers import Helper
def step(St, Pt):
    S, c, m = np.empty_like(St), np.zeros(St.shape[1]), np.arange(St.shape[0])
    graph_kernels().merge_rows_t(St, m, Pt, m, np.ones(St.shape[0]), S, c)
    return S, c
rng = np.random.default_rng(0)
St, Pt = rng.normal(size=(2, 300, 64))
here = step(St, Pt)  # numba's threads start in this process, then a helper is forked
h = Helper(step, single=True)
h.send((St, Pt))
there = h.recv()
h.close()
assert all(np.array_equal(a, b) for a, b in zip(here, there))
import os  # a plain fork too (a user's process pool): the child's kernels are the twins
pid = os.fork()
if pid == 0:
    os._exit(0 if all(np.array_equal(a, b) for a, b in zip(here, step(St, Pt))) else 3)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
print(numba.threading_layer())
"""


def test_a_forked_helper_runs_graph_kernels_after_this_process_started_numbas_threads():
    """A helper forked after numba's threads started here, and a child of a plain fork,
    compute what this process does, on numba's default layer and, where it loads, on
    OpenMP's (whose threads a forked child cannot use: it ended at its first parallel kernel
    before forked children ran the serial twins)."""
    import importlib.util
    import subprocess
    import sys

    layers = [None]
    try:  # the OpenMP layer needs the system's libgomp
        if importlib.util.find_spec("numba.np.ufunc.omppool"):
            importlib.import_module("numba.np.ufunc.omppool")
            layers.append("omp")
    except ImportError:
        pass
    for layer in layers:
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
        if layer:
            env["NUMBA_THREADING_LAYER"] = layer
        out = subprocess.run([sys.executable, "-c", HELPER_AFTER_THREADS],
                             capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, (layer, out.stderr)
        assert layer is None or out.stdout.strip() == layer


def _fresh(code, args=(), drop=(), **extra):
    """stdout of ``python -c code *args`` in a fresh process whose environment lacks every
    variable ``drop`` names (a name ending in ``*``: every one it starts), plus ``extra``;
    the run must succeed."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if not any(k == d or (d.endswith("*") and k.startswith(d[:-1])) for d in drop)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=dict(env, **extra), timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_openmp_spinning_is_shortened_unless_the_user_chose():
    """Importing crown_cli sets GOMP_SPINCOUNT=30000 (OpenMP's default spinning, with
    OpenBLAS's, took the BLAS products' cores), or 1000 where numpy (so OpenBLAS, with its own
    long spin) was loaded first, unless GOMP_SPINCOUNT or OMP_WAIT_POLICY is already set."""
    code = ("import os, sys\n"
            "if sys.argv[1] == 'numpy first':\n"
            "    import numpy\n"
            "import crown_cli.engine.kernels\n"
            "print(os.environ.get('GOMP_SPINCOUNT'))\n")
    drop = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")
    for first, extra, want in (("crown_cli", {}, "30000"), ("numpy first", {}, "1000"),
                               ("numpy first", {"OPENBLAS_THREAD_TIMEOUT": "20"}, "30000"),
                               ("crown_cli", {"GOMP_SPINCOUNT": "7"}, "7"),
                               ("numpy first", {"GOMP_SPINCOUNT": "7"}, "7"),
                               ("crown_cli", {"OMP_WAIT_POLICY": "PASSIVE"}, "None")):
        out = _fresh(code, [first], drop, **extra)
        assert out.strip() == want, (first, extra, out)


def test_openblas_spinning_is_shortened_before_numpy_loads_it():
    """Importing crown_cli sets OPENBLAS_THREAD_TIMEOUT=20 (OpenBLAS's default spinning took
    numba's second thread) before anything of crown_cli imports numpy, whose OpenBLAS reads it
    once when it loads; a user's own value stands."""
    code = ("import os, sys\n"
            "seen = []\n"
            "class Watch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'numpy' and not seen:\n"
            "            seen.append(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))\n"
            "sys.meta_path.insert(0, Watch())\n"
            "import crown_cli.cli\n"
            "print(seen, 'numpy' in sys.modules)\n")
    for extra, want in (({}, "['20'] True"), ({"OPENBLAS_THREAD_TIMEOUT": "6"}, "['6'] True")):
        out = _fresh(code, (), ("OPENBLAS_THREAD_TIMEOUT",), **extra)
        assert out.strip() == want, (extra, out)


def test_malloc_keeps_freed_blocks_for_the_next_step_unless_the_user_chose():
    """Importing the kernels fixes glibc's mmap and trim thresholds: arrays of a few MB made and
    freed step after step then reuse the heap's pages instead of faulting fresh ones in (20,000
    page faults below without it); a user's own MALLOC_TOP_PAD_ leaves malloc alone."""
    import platform

    if platform.libc_ver()[0] != "glibc":  # the setting is glibc's; elsewhere nothing changes
        import crown_cli.engine.kernels as k
        assert not k.MALLOC_TUNED
        return
    code = ("import resource, sys, numpy as np\n"
            "if sys.argv[1] == '1':\n"
            "    import crown_cli.engine.kernels as k\n"
            "    print(k.MALLOC_TUNED)\n"
            "def faults():\n"
            "    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "    for n in (3_000_000, 1_000_000, 2_500_000, 700_000) * 5:\n"
            "        a = np.ones(n); b = np.zeros(n); b += a; del a, b\n"
            "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0\n"
            "faults()\n"
            "print(faults())\n")

    def run(arg, **extra):
        return _fresh(code, [arg], ("MALLOC_*",), **extra).split()

    tuned, plain, chosen = run("1"), run("0"), run("1", MALLOC_TOP_PAD_="0")
    assert tuned[0] == "True" and int(tuned[1]) < 500, tuned
    assert int(plain[0]) > 5000, plain  # the case the setting is for
    assert chosen[0] == "False" and int(chosen[1]) > 5000, chosen


def test_quiet_blas_runs_a_convolutional_graphs_bounds_on_one_blas_thread(monkeypatch):
    """Where numpy loaded OpenBLAS with its long spin (``runtime.BLAS_SPINS``), a graph with a
    convolution is bounded (construction, ``lower``) and certified on one BLAS thread and the
    counts are restored after; a chain of dense layers keeps them, and so does every graph
    where OpenBLAS's spin was shortened."""
    from crown_cli import runtime
    from crown_cli.certification.graph_certifier import GraphCertifier, _tiny_graph
    from crown_cli.engine import graph_bounds as gbm
    from crown_cli.graph.network import dense_graph
    from crown_cli.network import MLP

    before = get_blas_threads()
    seen = []
    build, lower = gbm.GraphBounds._build, gbm.GraphBounds._lower

    def spy_build(self, *args):
        seen.append(("build", get_blas_threads()))
        return build(self, *args)

    def spy_lower(self, *args):
        seen.append(("lower", get_blas_threads()))
        return lower(self, *args)

    monkeypatch.setattr(gbm.GraphBounds, "_build", spy_build)
    monkeypatch.setattr(gbm.GraphBounds, "_lower", spy_lower)
    rng = np.random.default_rng(0)
    conv = _tiny_graph(rng)
    x0 = rng.uniform(0, 1, conv.input_size)
    dense = dense_graph(MLP([rng.normal(size=(6, 4)), rng.normal(size=(2, 6))],
                            [np.zeros(6), np.zeros(2)], "relu"))
    for spins in (True, False):
        monkeypatch.setattr(runtime, "BLAS_SPINS", spins)
        for g, x in ((conv, x0), (dense, rng.uniform(0, 1, 4))):
            seen.clear()
            gbm.GraphBounds(g, x, 0.01, 0).bounds(np.eye(2)[:1] - np.eye(2)[1:])
            want = [1] * len(before) if spins and g is conv else before
            assert seen and all(t == want for _, t in seen), (spins, seen)
            assert {k for k, _ in seen} == {"build", "lower"}
            assert get_blas_threads() == before
    monkeypatch.setattr(runtime, "BLAS_SPINS", True)
    seen.clear()
    cert = GraphCertifier(conv, norm="inf", method="crown")
    c = int(np.argmax(conv.forward(x0[None])[0]))
    assert cert.certify(x0, c, [1 - c]).eps > 0
    assert seen and all(t == [1] * len(before) for _, t in seen)
    assert get_blas_threads() == before
