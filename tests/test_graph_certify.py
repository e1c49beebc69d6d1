"""`crown certify` on graph networks (crown_cli.certification.graph_certifier): the radius of
a convolutional network equals the dense engine's radius of the same network written as an
MLP (each convolution as its dense matrix); no sampled or attacked point inside a certified
ball flips the decision; images in the model's own layout; methods not on graphs refused."""
import csv
import io
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import crown_cli
from crown_cli.certification.certifier import Certifier
from crown_cli.certification.graph_certifier import GraphCertifier, depth, to_graph_layout
from crown_cli.cli import cli
from crown_cli.graph.onnx_graph import load_graph
from crown_cli.io.results import read_rows
from crown_cli.verification.graph_verifier import graph_counterexample
from graph_models import BUILDERS, G
from graph_oracles import dense_of, onnx_outputs


def conv_chain(rng, channels=3):
    """Conv (stride 2, padding) -> ReLU -> Conv (dilation) -> ReLU -> Flatten -> Gemm, on a
    (1, channels, 7, 6) input."""
    g = G(rng)
    x = g.op("Conv", ["x", g.rand(4, channels, 3, 3), g.rand(4)], strides=[2, 1],
             pads=[1, 1, 0, 1])
    x = g.op("Relu", [x])
    x = g.op("Conv", [x, g.rand(3, 4, 2, 2), g.rand(3)], dilations=[1, 2])
    x = g.op("Relu", [x])
    x = g.op("Flatten", [x])
    x = g.op("Gemm", [x, g.rand(4, 3 * 2 * 4), g.rand(4)], transB=1)
    return g.model([("x", (1, channels, 7, 6))], [x])


MODELS = {"conv_chain": conv_chain, "conv": BUILDERS["conv"],
          "normalised": BUILDERS["normalised"]}


def load(tmp_path, kind, seed=0):
    model = MODELS[kind](np.random.default_rng(seed))
    path = os.path.join(str(tmp_path), f"{kind}.onnx")
    onnx.save(model, path)
    return model, path, load_graph(path)


def as_mlp(graph):
    """The chain graph as dense layers (weights, biases, activation): consecutive affine
    nodes multiplied out (a convolution, a pooling, a scaling as its dense matrix)."""
    M, c = np.eye(graph.input_size), np.zeros(graph.input_size)
    ws, bs, acts = [], [], set()
    for n in graph.nodes[1:]:
        if n.kind == "activation":
            ws.append(M)
            bs.append(c)
            acts.add(n.op.name)
            M, c = np.eye(n.size), np.zeros(n.size)
        else:
            assert n.kind == "affine" and len(n.inputs) == 1
            (A,), b = dense_of(n.op, [graph.nodes[n.inputs[0]].size])
            M, c = A @ M, A @ c + b
    assert len(acts) == 1
    return ws + [M], bs + [c], acts.pop()


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("norm,method", [("inf", "crown"), ("2", "crown"), ("1", "crown"),
                                         ("inf", "fast-lin"), ("2", "crown-paper")])
def test_radius_equals_dense_engine(tmp_path, kind, norm, method):
    """GraphCertifier with CROWN's bounds of every neuron (ibp=False) gives the dense engine's
    radius (float64 search) within 1e-6 relative. The default (intersected with interval
    arithmetic) may differ either way: CROWN's and Fast-Lin's lines are not monotone in the
    intervals (its soundness: test_certified_balls_hold)."""
    _, _, g = load(tmp_path, kind)
    ws, bs, act = as_mlp(g)
    assert depth(g) == depth(g, shortest=True) == len(ws) - 1  # a chain: the same search
    dense = Certifier(ws, bs, act, norm=norm, method=method, precision="float64")
    exact = GraphCertifier(g, norm=norm, method=method, ibp=False, precision="float64")
    exact.START_FRACTION = dense.START_FRACTION  # the same search path: the same radius
    exact.UP_POWER = dense.UP_POWER
    default = GraphCertifier(g, norm=norm, method=method)
    rng = np.random.default_rng(1)
    for _ in range(2):
        x0 = rng.uniform(-1, 1, g.input_size)
        y = g.forward(x0)
        np.testing.assert_allclose(dense.logits(x0), y, rtol=1e-10, atol=1e-10)
        c = int(np.argmax(y))
        t = int(np.argsort(y)[-2])
        want = dense.certify(x0, c, [t])
        got = exact.certify(x0, c, [t])
        assert want.status == got.status == "certified"
        assert got.eps == pytest.approx(want.eps, rel=1e-6)
        assert default.certify(x0, c, [t]).status == "certified"


def test_the_search_takes_a_residual_networks_shortest_path_as_its_depth(tmp_path):
    """The radius search's depth (first radius, power law) on a branched graph is the fewest
    activations on a path from the input to the output: relu_residual's slice of its first
    ReLU layer reaches the output past the other two."""
    from graph_models import relu_residual

    path = os.path.join(str(tmp_path), "rr.onnx")
    onnx.save(relu_residual(np.random.default_rng(0)), path)
    g = load_graph(path)
    assert (depth(g), depth(g, shortest=True)) == (3, 1)
    assert GraphCertifier(g, norm="inf", method="crown").num_hidden == 1


@pytest.mark.parametrize("kind", ["conv", "conv_chain"])
def test_certified_balls_hold(tmp_path, kind):
    """Inside the certified l_inf ball the attack (graph_counterexample, every other class
    as a case) finds nothing and 3000 samples (vertices included) keep the decision; inside
    certified l_2 and l_1 balls samples on the sphere keep it. The attack does flip the
    decision in a ball 20 times larger (the check can fail)."""
    _, _, g = load(tmp_path, kind, seed=2)
    rng = np.random.default_rng(3)
    x0 = rng.uniform(-1, 1, g.input_size)
    y0 = g.forward(x0)
    c = int(np.argmax(y0))
    others = [t for t in range(g.output_size) if t != c]
    cases = [(np.eye(g.output_size)[c] - np.eye(g.output_size)[t], np.zeros(1)) for t in others]
    for norm in ("inf", "2", "1"):
        res = GraphCertifier(g, norm=norm).certify(x0, c, others)
        assert res.status == "certified" and res.eps > 0
        eps, d = res.eps, g.input_size
        if norm == "inf":
            lo, hi = x0 - eps, x0 + eps
            assert graph_counterexample(g, lo, hi, [(A[None], b) for A, b in cases],
                                        restarts=32, steps=50, seed=4) is None
            pts = x0 + eps * rng.uniform(-1, 1, size=(3000, d))
            pts[:1000] = x0 + eps * rng.choice([-1.0, 1.0], size=(1000, d))
            big = graph_counterexample(g, x0 - 20 * eps, x0 + 20 * eps,
                                       [(A[None], b) for A, b in cases], restarts=32, steps=50)
            assert big is not None
        else:
            dirs = rng.normal(size=(3000, d)) if norm == "2" else rng.laplace(size=(3000, d))
            dirs /= np.linalg.norm(dirs, ord=int(norm), axis=1, keepdims=True)
            pts = x0 + eps * dirs
        assert np.all(np.argmax(g.forward(pts), axis=1) == c)


def test_cli_images_in_the_models_layout(tmp_path):
    """crown certify on a 3-channel convolutional ONNX chain (lowered to the dense engine):
    the image file's (H, W, C) vectors are fed in the model's (C, H, W) order (the logits
    onnx.reference gives), rows carry the dense Certifier's radius on the lowered MLP at those
    vectors; -o and --resume; alpha-crown and --attack pgd run on it. On a graph that is not
    lowered (a max pool) alpha-crown and --attack pgd run on the graph engine (the attack's
    distortions at least the certified radii, its points verified by the forward pass); lp-full
    is refused in one line naming the method."""
    from crown_cli.graph.lower import lowered

    model, path, g = load(tmp_path, "conv_chain", seed=5)
    mlp = lowered(g)
    assert mlp is not None
    rng = np.random.default_rng(6)
    hwc = rng.uniform(-1, 1, size=(3, 7, 6, 3))
    chw = hwc.transpose(0, 3, 1, 2).reshape(3, -1)
    np.testing.assert_array_equal(to_graph_layout(g, hwc.reshape(3, -1)), chw)
    y = np.argmax(g.forward(chw), axis=1)
    for k in range(3):
        ref = onnx_outputs(model, chw[k], [(1, 3, 7, 6)])
        np.testing.assert_allclose(ref, g.forward(chw[k]), rtol=1e-4, atol=1e-4)
    images = os.path.join(str(tmp_path), "im.npz")
    np.savez(images, x=hwc, y=y)
    out = os.path.join(str(tmp_path), "rows.csv")
    args = ["certify", "--model", path, "--images", images, "--norm", "inf,2", "-o", out, "-q",
            "--kernels", "numpy"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    rows = read_rows(out)
    assert len(rows) == 6 and all(row["status"] == "certified" for row in rows)
    from crown_cli.engine.kernels import using_kernels

    for row in rows:
        k = int(row["image"])
        t = int(row["target"])
        with using_kernels("numpy"):
            res = Certifier(mlp.weights, mlp.biases, mlp.activation,
                            norm=row["norm"]).certify(chw[k], int(y[k]), [t])
        assert float(row["eps"]) == res.eps
        # the graph engine's radius agrees to its search tolerance
        ref = GraphCertifier(g, norm=row["norm"]).certify(chw[k], int(y[k]), [t])
        assert float(row["eps"]) == pytest.approx(ref.eps, rel=1e-3)
        assert row["precision"] == "mixed"
    r = CliRunner().invoke(cli, args + ["--resume"])
    assert r.exit_code == 0, r.output
    assert len(read_rows(out)) == 6
    for extra in (["--method", "fast-lin"], ["--method", "alpha-crown"], ["--attack", "pgd"]):
        r = CliRunner().invoke(cli, ["certify", "--model", path, "--images", images, "-q"] + extra)
        assert r.exit_code == 0, r.output
    pool_path = os.path.join(str(tmp_path), "pool.onnx")
    onnx.save(BUILDERS["conv_maxpool"](np.random.default_rng(5)), pool_path)
    pool_g = load_graph(pool_path)
    assert lowered(pool_g) is None
    pool_images = os.path.join(str(tmp_path), "pool.npz")
    np.savez(pool_images, x=rng.uniform(-1, 1, size=(2, 6 * 7 * 2)), y=np.zeros(2, int))
    r = CliRunner().invoke(cli, ["certify", "--model", pool_path, "--images", pool_images,
                                 "--method", "alpha-crown", "-q"])
    assert r.exit_code == 0, r.output  # the graph engine's alpha-crown (last stage)
    r = CliRunner().invoke(cli, ["certify", "--model", pool_path, "--images", pool_images,
                                 "--method", "lp-full"])
    assert r.exit_code == 2
    assert "not available on graph networks yet" in r.output and "lp-full" in r.output
    assert len(r.output.strip().splitlines()) == 1
    # --attack pgd on the graph: the smallest distortion found is at least the certified
    # radius, and the attack's point (re-run here) is verified by the graph's forward pass
    from crown_cli.certification.graph_certifier import GraphPGDAttack

    out = os.path.join(str(tmp_path), "pool_rows.csv")
    x_pool = np.load(pool_images)["x"]
    y_pool = np.argmax(pool_g.forward(to_graph_layout(pool_g, x_pool)), axis=1)
    np.savez(pool_images, x=x_pool, y=y_pool)
    r = CliRunner().invoke(cli, ["certify", "--model", pool_path, "--images", pool_images,
                                 "--attack", "pgd", "--norm", "inf,2", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    rows = read_rows(out)
    assert len(rows) == 4 and all(row["attack_eps"] != "" for row in rows)
    for row in rows:
        assert float(row["attack_eps"]) >= float(row["eps"])
        k, t = int(row["image"]), int(row["target"])
        x0 = to_graph_layout(pool_g, x_pool[k:k + 1])[0]
        res = GraphPGDAttack(pool_g, row["norm"]).min_distortion(x0, int(y_pool[k]), [t])
        assert res.eps is not None and res.eps >= float(row["eps"])
        f = pool_g.forward(res.x_adv)
        assert f[int(y_pool[k])] - f[t] <= 0.0


SHIPPED_CONV = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "models", "cifar_base_kw.onnx")


@pytest.mark.slow
def test_shipped_cifar_conv_model_against_dense_references():
    """models/cifar_base_kw.onnx (scripts/bench.py's conv case: oval21's CIFAR network with its
    normalisation in front) on the shipped CIFAR-10 images. The images as crown loads them
    (pixel/255 - 0.5, put channel-first) give the network's accuracy: 73 of the first 100 (the
    (H, W, C) vectors as they are: 11; without the normalisation: 35). `crown certify --method
    crown` on image 0 gives the radius of the same network written as a dense MLP through the
    dense engine (float64) within 1e-4 relative, and the plain numpy twin of CROWN
    (tests/reference_crown.py, dense matrices) certifies that radius and fails 2e-4 above it.
    At that radius the graph engine's bound with CROWN's bounds of every neuron (ibp=False)
    equals the dense engine's (1e-9 of the margin) and lies at most 1e-7 of the margin below
    the twin's (the engines charge their float64 rounding errors, the twin does not). (The radius search with ibp=False on this network
    takes ~12 s; the radius equality within 1e-6 with ibp off is test_radius_equals_dense_engine
    on small graphs.)"""
    from crown_cli.io.images import load_images
    from reference_crown import reference_bounds

    cifar = os.path.join(os.path.dirname(crown_cli.__file__), "data", "cifar10_test_100.npz")
    g = load_graph(SHIPPED_CONV)
    x, y = load_images(cifar)
    xg = to_graph_layout(g, x)
    assert np.sum(np.argmax(g.forward(xg), axis=1) == y) == 73
    r = CliRunner().invoke(cli, ["certify", "--model", SHIPPED_CONV, "--images", cifar, "-n", "1",
                                 "--method", "crown", "-q"])
    assert r.exit_code == 0, r.output
    (row,) = list(csv.DictReader(io.StringIO(r.output)))
    assert row["status"] == "certified" and int(row["predicted"]) == int(y[0])
    x0, c, t = xg[0], int(row["predicted"]), int(row["target"])
    eps_cli = float(row["eps"])

    ws, bs, act = as_mlp(g)
    dense = Certifier(ws, bs, act, method="crown", precision="float64")
    np.testing.assert_allclose(dense.logits(x0), g.forward(x0), rtol=1e-9, atol=1e-9)
    want = dense.certify(x0, c, [t])
    assert want.status == "certified"
    assert eps_cli == pytest.approx(want.eps, rel=1e-4)

    C = (np.eye(10)[c] - np.eye(10)[t])[None]
    twin = [float(reference_bounds(ws, bs, x0, e, C=C)[-1][0][0])
            for e in (want.eps, want.eps * (1 + 2e-4))]
    assert twin[0] > 0 > twin[1]
    graph_lb = GraphCertifier(g, ibp=False).lower_bound(x0, want.eps, C)[0]
    dense_lb = dense.lower_bound(x0, want.eps, C)[0]
    scale = float(C[0] @ g.forward(x0))  # the margin at the centre
    assert graph_lb == pytest.approx(dense_lb, abs=1e-9 * scale)
    # the engines charge every float64 rounding error, the twin none: below it, by little
    assert 0 <= twin[0] - graph_lb <= 1e-7 * scale


def test_alpha_crown_on_graphs_takes_its_iterations_and_stays_sound(tmp_path):
    """alpha-crown on a graph the dense engine cannot take (a residual ReLU network):
    ``alpha_iters=0`` is CROWN's radius exactly; the default (slopes of the intermediate
    bounds and of the margin rows optimised) certifies at least CROWN's radius, more on some
    image; no attack finds a counterexample inside its l_inf ball."""
    from crown_cli.graph.lower import lowered

    path = os.path.join(str(tmp_path), "res.onnx")
    onnx.save(BUILDERS["relu_residual"](np.random.default_rng(0)), path)
    g = load_graph(path)
    assert lowered(g) is None
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(4, g.input_size))
    y = np.argmax(g.forward(X), axis=1)
    crown = GraphCertifier(g, method="crown", precision="float64")  # as alpha-crown searches
    off = GraphCertifier(g, method="alpha-crown", alpha_iters=0)
    alpha = GraphCertifier(g, method="alpha-crown")
    gained = 0
    for k in range(X.shape[0]):
        t = int(np.argsort(g.forward(X[k]))[-2])
        c = crown.certify(X[k], int(y[k]), [t]).eps
        assert off.certify(X[k], int(y[k]), [t]).eps == c
        a = alpha.certify(X[k], int(y[k]), [t]).eps
        assert a >= c * (1 - 2e-4)  # both within the search's rtol of their own radius
        gained += a > c * 1.01
        A = np.zeros((1, g.output_size))
        A[0, int(y[k])], A[0, t] = 1.0, -1.0  # unsafe: f_y - f_t <= 0
        found = graph_counterexample(g, X[k] - a, X[k] + a, [(A, np.zeros(1))],
                                     restarts=32, steps=200, seed=k)
        assert found is None
    assert gained, "alpha-crown never beat crown: the test would show nothing"
    with pytest.raises(crown_cli.InputError, match="alpha-iters"):
        GraphCertifier(g, method="alpha-crown", alpha_iters=-1)


def test_alpha_crown_starts_next_to_crowns_radius(tmp_path, monkeypatch):
    """alpha-crown's search on a graph first finds CROWN's radius by a float32 search to
    1e-2 and starts at ALPHA_START times it (alpha-CROWN's radius lies within a few percent
    above); its certificate counts those evaluations too. With --eps0 given, or no
    iterations, the search starts where it is told."""
    path = os.path.join(str(tmp_path), "res.onnx")
    onnx.save(BUILDERS["relu_residual"](np.random.default_rng(0)), path)
    g = load_graph(path)
    rng = np.random.default_rng(2)
    x0 = rng.uniform(-1, 1, g.input_size)
    y = g.forward(x0)
    c, t = int(np.argmax(y)), int(np.argsort(y)[-2])
    calls = []
    real = GraphCertifier.lower_bound

    def spy(self, x, eps, C, dtype=np.float64, balls=None, deadline=None, crown=False):
        low = real(self, x, eps, C, dtype, balls, deadline, crown)
        calls.append((eps, np.dtype(dtype) == np.float32, crown, float(np.min(low))))
        return low

    monkeypatch.setattr(GraphCertifier, "lower_bound", spy)
    alpha = GraphCertifier(g, method="alpha-crown")
    got = alpha.certify(x0, c, [t])
    start = [k for k, call in enumerate(calls) if not call[2]][0]
    assert start > 0 and all(f32 and crown for _, f32, crown, _ in calls[:start])
    lo = max(e for e, _, _, v in calls[:start] if v > 0)  # the float32 search's radius
    assert calls[start][0] == pytest.approx(alpha.ALPHA_START * lo, rel=1e-12)
    assert not any(crown for _, _, crown, _ in calls[start:])
    assert got.evaluations == len(calls) and got.eps > 0
    crown = GraphCertifier(g, method="crown", precision="float64").certify(x0, c, [t])
    assert got.eps >= crown.eps * (1 - 2e-4)
    for kw in ({"eps0": 0.01}, {"alpha_iters": 0}):
        calls.clear()
        GraphCertifier(g, method="alpha-crown", **kw).certify(x0, c, [t])
        assert not any(crown for _, _, crown, _ in calls)


def test_alpha_crown_moves_tangents_on_an_s_shaped_residual_graph(tmp_path):
    """alpha-crown on a residual tanh graph (not lowered; a sigmoid output): before, only
    ReLU-type lines were free on graphs and its radius was CROWN's; the tangent points
    (engine.graph_alpha.Tangents) certify more on some image, never less, and no attack
    finds a counterexample inside the ball."""
    from crown_cli.graph.lower import lowered

    path = os.path.join(str(tmp_path), "res_tanh.onnx")
    onnx.save(BUILDERS["residual"](np.random.default_rng(2), act="Tanh"), path)
    g = load_graph(path)
    assert lowered(g) is None and "relu" not in g.activations()
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(4, g.input_size))
    y = np.argmax(g.forward(X), axis=1)
    crown = GraphCertifier(g, method="crown", precision="float64")
    alpha = GraphCertifier(g, method="alpha-crown")
    gained = 0
    for k in range(X.shape[0]):
        t = int(np.argsort(g.forward(X[k]))[-2])
        c = crown.certify(X[k], int(y[k]), [t]).eps
        a = alpha.certify(X[k], int(y[k]), [t]).eps
        assert a >= c * (1 - 2e-4)
        gained += a > c * 1.01
        A = np.zeros((1, g.output_size))
        A[0, int(y[k])], A[0, t] = 1.0, -1.0
        found = graph_counterexample(g, X[k] - a, X[k] + a, [(A, np.zeros(1))],
                                     restarts=32, steps=200, seed=k)
        assert found is None
    assert gained, "alpha-crown never beat crown: the test would show nothing"


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("norm", ["inf", "2"])
def test_mixed_precision_radius_is_float64_verified(tmp_path, kind, norm):
    """The default search steers with float32 bounds (GraphBounds dtype=float32) and returns
    only a radius whose float64 bound is > 0: the radius is certified by a float64 bound of
    its own, within the search's rtol of the float64 search's, and the float32 steering bound
    is close to the float64 one."""
    from crown_cli.engine.graph_bounds import GraphBounds

    _, _, g = load(tmp_path, kind)
    mixed = GraphCertifier(g, norm=norm, rtol=1e-4)
    plain = GraphCertifier(g, norm=norm, rtol=1e-4, precision="float64")
    assert mixed.precision == "mixed" and plain.precision == "float64"
    rng = np.random.default_rng(4)
    x0 = rng.uniform(-1, 1, g.input_size)
    y = g.forward(x0)
    c, t = int(np.argmax(y)), int(np.argsort(y)[-2])
    got, want = mixed.certify(x0, c, [t]), plain.certify(x0, c, [t])
    assert got.status == want.status == "certified"
    assert got.eps == pytest.approx(want.eps, rel=3e-4)
    C = mixed.margin_rows(c, [t])
    assert mixed.lower_bound(x0, got.eps, C)[0] > 0.0  # float64, every rounding charged
    qcode = {"inf": 0, "2": 1}[norm]
    b32 = GraphBounds(g, x0, got.eps, qcode, dtype=np.float32).lower(g.output, C)
    b64 = GraphBounds(g, x0, got.eps, qcode).lower(g.output, C)
    assert b32[0] == pytest.approx(b64[0], rel=1e-3, abs=1e-5)


@pytest.mark.parametrize("kind", ["conv", "conv_chain"])
def test_a_search_reuses_larger_balls_bounds_soundly(tmp_path, kind, monkeypatch):
    """The certify search hands each float32 steering evaluation the node bounds of the
    smallest larger ball it evaluated (graph_certifier.Balls), and a float64 evaluation none
    (its bound is its ball's own); an evaluation without them takes the closest ball's as
    hints (guesses of which neurons need both sides). With them every bound holds on the
    ball (sampled), and the radius holds against the attack and at the ball's corners."""
    import crown_cli.engine.graph_bounds as graph_bounds
    from crown_cli.certification.graph_certifier import Balls

    _, _, g = load(tmp_path, kind)
    rng = np.random.default_rng(6)
    x0 = rng.uniform(-1, 1, g.input_size)
    y = g.forward(x0)
    c, t = int(np.argmax(y)), int(np.argsort(y)[-2])
    seen = []  # (eps, float32?, the eps of the ball its known bounds came from or None)
    real = graph_bounds.GraphBounds

    def spy(graph, x, eps, qcode, **kw):
        gb = real(graph, x, eps, qcode, **kw)
        gb.spied = (eps, np.dtype(kw.get("dtype", np.float64)) == np.float32, kw.get("known"),
                    kw.get("hints"))
        seen.append(gb)
        return gb

    monkeypatch.setattr(graph_bounds, "GraphBounds", spy)
    cert = GraphCertifier(g, norm="inf")
    got = cert.certify(x0, c, [t])
    assert got.status == "certified"
    balls = {id(gb.lo[p]): (gb.spied[0], gb.spied[1]) for gb in seen for p in Balls(g).nodes}
    reused = hinted = 0
    for gb in seen:
        eps, f32, known, hints = gb.spied
        for p, (lo, hi) in (known or {}).items():
            src_eps, src_f32 = balls[id(lo)]
            assert src_eps >= eps and f32  # a larger ball's, and only for steering
            reused += 1
        # an evaluation without them takes an evaluated ball's bounds as guesses (hints)
        assert known is None or hints is None
        hinted += all(id(lo) in balls for lo, _ in (hints or {}).values()) and bool(hints)
    assert reused, "no evaluation took a larger ball's bounds: the test would show nothing"
    assert hinted, "no evaluation took hints"
    seen.clear()  # a float64 search: its evaluations have larger float64 balls, and take none
    assert GraphCertifier(g, norm="inf", precision="float64").certify(x0, c, [t]).eps > 0
    assert len(seen) > 2 and all(gb.spied[2] is None for gb in seen)
    # with a larger ball's float64 bounds: every node's bounds and the margin's hold on the
    # ball (sampled, corners included); fewer neurons refined where the larger ball proved
    # them stable (CROWN is not monotone in its intervals: a bound may move either way)
    C = cert.margin_rows(c, [t])
    big = real(g, x0, got.eps * 1.05, 0)
    tight = real(g, x0, got.eps, 0, known={p: (big.lo[p], big.hi[p]) for p in Balls(g).nodes})
    low = tight.lower(g.output, C)[0]
    pts = x0 + got.eps * rng.uniform(-1, 1, size=(3000, g.input_size))
    pts[:1500] = x0 + got.eps * rng.choice([-1.0, 1.0], size=(1500, g.input_size))
    out, vals = g.forward(pts, return_all=True)
    for i in range(len(g.nodes)):
        assert np.all(vals[i] >= tight.lo[i] - 1e-12) and np.all(vals[i] <= tight.hi[i] + 1e-12)
    assert np.all(out @ C[0] >= low) and low > 0
    A = np.zeros((1, g.output_size))
    A[0, c], A[0, t] = 1.0, -1.0
    assert graph_counterexample(g, x0 - got.eps, x0 + got.eps, [(A, np.zeros(1))],
                                restarts=16, steps=100, seed=1) is None
    assert np.all(out[:, c] > out[:, t])


def test_warm_up_loads_every_graph_kernel_in_both_precisions(tmp_path):
    """GraphCertifier.warm_up (run before the first image's clock starts) calls every kernel
    of the graph fast path, windows and live elements, in float32 (the steering) and float64
    (the proof), so that the first image's time holds no kernel compilation or cache load.
    In a fresh process: this one's other tests have called the kernels already."""
    import subprocess
    import sys

    path = os.path.join(str(tmp_path), "conv.onnx")
    onnx.save(BUILDERS["conv"](np.random.default_rng(0)), path)
    code = f"""
from crown_cli.certification.graph_certifier import GraphCertifier
from crown_cli.engine.kernels import graph_kernels
from crown_cli.graph.onnx_graph import load_graph
k = graph_kernels()
names = ("conv_transpose_t", "activation_step_t", "affine_terms_t", "merge_rows_t",
         "input_terms_t", "win_conv_transpose_t", "win_activation_t", "win_sums_t",
         "win_scatter_t")
assert all(not getattr(k, n).signatures for n in names)
GraphCertifier(load_graph({path!r})).warm_up()
for n in names:
    print(n, sorted({{str(sig[0].dtype) for sig in getattr(k, n).signatures}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 9
    for line in lines:
        assert line.endswith("['float32', 'float64']"), line


@pytest.mark.parametrize("lose", [False, True])
def test_two_processes_write_the_rows_of_one(tmp_path, monkeypatch, lose):
    """crown certify on a graph network (a max pool: not lowered) with --workers 2 (every
    other image certified by a forked helper, a thread each; the graphs' default) writes the
    rows --workers 1 writes, in the same order, misclassified images, the untargeted floor
    and the attack's distortions included (all but the seconds); with the helper lost at
    its first answer the run finishes alone with the same rows."""
    from crown_cli.verification.bab import workers
    from crown_cli.verification.bab.workers import HelperLost, can_fork

    if not can_fork():
        pytest.skip("needs two cores and fork")
    if lose:
        def lost(self):
            raise HelperLost("simulated")
        monkeypatch.setattr(workers.Helper, "recv", lost)
    path = os.path.join(str(tmp_path), "pool.onnx")
    onnx.save(BUILDERS["conv_maxpool"](np.random.default_rng(5)), path)
    g = load_graph(path)
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=(5, g.input_size))
    y = np.argmax(g.forward(to_graph_layout(g, x)), axis=1)
    y[2] = (y[2] + 1) % g.output_size  # one misclassified image
    images = os.path.join(str(tmp_path), "im.npz")
    np.savez(images, x=x, y=y)
    rows = {}
    for w in ("1", "2"):
        out = os.path.join(str(tmp_path), f"rows{w}.csv")
        r = CliRunner().invoke(cli, ["certify", "--model", path, "--images", images, "--norm",
                                     "inf,2", "--target", "runner-up,untargeted", "--attack",
                                     "pgd", "--workers", w, "-o", out, "-q"])
        assert r.exit_code == 0, r.output
        rows[w] = [{k: v for k, v in row.items() if not k.endswith("time_s")}
                   for row in read_rows(out)]
    assert len(rows["1"]) == 20 and rows["1"] == rows["2"]
    assert sum(row["status"] == "misclassified" for row in rows["2"]) == 4
    assert all(row["attack_eps"] != "" for row in rows["2"] if row["status"] == "certified")


@pytest.mark.parametrize("precision", ["float64", "mixed"])
def test_a_search_past_its_timeout_reports_the_radius_proven_so_far(tmp_path, monkeypatch,
                                                                     precision):
    """GraphCertifier's timeout: evaluations made slow (50 ms each; the search takes 6), a 0.15 s budget. The
    search ends within the budget plus one evaluation with status ``timeout`` and the
    largest radius a float64 bound proved before it (0 when none did), which holds on
    samples and is not more than the full search's."""
    import time

    _, _, g = load(tmp_path, "conv", seed=2)
    rng = np.random.default_rng(3)
    x0 = rng.uniform(-1, 1, g.input_size)
    c = int(np.argmax(g.forward(x0)))
    others = [t for t in range(g.output_size) if t != c]
    full = GraphCertifier(g, norm="inf", precision=precision).certify(x0, c, others)
    slow = GraphCertifier.lower_bound

    def sleepy(self, *args, **kw):
        time.sleep(0.05)
        return slow(self, *args, **kw)

    monkeypatch.setattr(GraphCertifier, "lower_bound", sleepy)
    t0 = time.perf_counter()
    res = GraphCertifier(g, norm="inf", precision=precision, timeout=0.15).certify(
        x0, c, others)
    took = time.perf_counter() - t0
    assert res.status == "timeout" and took < 0.15 + 0.3, (res, took)
    assert 0.0 <= res.eps <= full.eps and res.evaluations >= 2
    assert res.eps == 0.0 or res.lower_bound > 0  # a radius only with its proof
    pts = x0 + res.eps * rng.uniform(-1, 1, size=(2000, g.input_size))
    assert np.all(np.argmax(g.forward(pts), axis=1) == c)
    assert GraphCertifier(g, norm="inf", precision=precision, timeout=60).certify(
        x0, c, others).status == "certified"


def test_cli_timeout_on_a_graph_writes_timeout_rows_and_exits_3(tmp_path):
    """crown certify --timeout on a graph network (a max pool: not lowered): a budget too
    short for any evaluation gives every row status timeout with eps 0 (nothing proven),
    exit code 3 (rows failed), the summary saying so; a long one certifies."""
    path = os.path.join(str(tmp_path), "pool.onnx")
    onnx.save(BUILDERS["conv_maxpool"](np.random.default_rng(5)), path)
    g = load_graph(path)
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, size=(2, g.input_size))
    images = os.path.join(str(tmp_path), "im.npz")
    np.savez(images, x=x, y=np.argmax(g.forward(to_graph_layout(g, x)), axis=1))
    out = os.path.join(str(tmp_path), "rows.csv")
    r = CliRunner().invoke(cli, ["certify", "--model", path, "--images", images, "-o", out,
                                 "--timeout", "1e-9"])
    assert r.exit_code == 3, r.output
    rows = read_rows(out)
    assert len(rows) == 2 and all(row["status"] == "timeout" for row in rows)
    assert all(float(row["eps"]) == 0.0 for row in rows)
    assert "2 rows timed out (status timeout)" in r.output and "FAILED" not in r.output
    r = CliRunner().invoke(cli, ["certify", "--model", path, "--images", images, "-q",
                                 "--timeout", "60"])
    assert r.exit_code == 0 and r.output.count(",certified,") == 2, r.output


@pytest.mark.parametrize("shape", [(1, 6, 5, 3), (1, 6, 5, 1), (1, 3, 6, 5)])
def test_images_reach_a_channel_last_onnx_input_in_their_own_order(tmp_path, shape):
    """crown's images are (H, W, C) vectors. An ONNX input that is channel-last (a
    TensorFlow export: (1, H, W, 3) or (1, H, W, 1)) takes them as they are, a channel-first
    one (1, C, H, W) transposed: in both the class certify reports is the class the ONNX
    reference evaluator gives the image in the file's layout (until session 41 a
    channel-last input was taken as channel-first, its pixels scrambled)."""
    import graph_models as gm
    from onnx.reference import ReferenceEvaluator

    g = gm.G(np.random.default_rng(23))
    last = shape[3] in (1, 3)
    C = shape[3] if last else shape[1]
    t = g.op("Transpose", ["x"], perm=[0, 3, 1, 2]) if last else "x"
    h = g.op("Relu", [g.op("Conv", [t, g.rand(4, C, 3, 3), g.rand(4)], pads=[1, 1, 1, 1])])
    out = g.op("Gemm", [g.op("Flatten", [h]), g.rand(5, 120), g.rand(5)], transB=1)
    m = g.model([("x", shape)], [out])
    path = str(tmp_path / "m.onnx")
    onnx.save(m, path)
    H, W = (shape[1], shape[2]) if last else (shape[2], shape[3])
    ev = ReferenceEvaluator(m)
    rng = np.random.default_rng(24)
    for _ in range(4):
        img = rng.uniform(0.0, 1.0, (H, W, C))  # crown's (H, W, C) image
        feed = img[None] if last else img.transpose(2, 0, 1)[None]
        want = int(np.argmax(ev.run(None, {"x": feed.astype(np.float32)})[0]))
        got = crown_cli.certify(path, img.reshape(-1))
        assert got.predicted == want
