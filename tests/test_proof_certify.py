"""Certificates of certified radii (``crown certify --proof``, docs/proofs.md "Certificates of
radii"): written for every certified row, accepted by ``crown check --images``, rejected once
tampered with (a radius beyond an adversarial example, another image, changed weights), and
the scope's refusals."""
import gzip
import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, error_line
from crown_cli.check import Reject, ball_box, check_certify, load_model
from crown_cli.cli import cli

MODEL = os.path.join(ROOT, "models", "mnist_3x20.h5")
IMAGES = os.path.join(ROOT, "crown_cli", "data", "mnist_test_100.npz")


def _certify(tmp_path, *args, model=MODEL, images=IMAGES):
    out = tmp_path / "proofs"
    res = CliRunner().invoke(cli, [
        "certify", "--model", str(model), "--images", images, "-q", "--overwrite",
        "-o", str(tmp_path / "rows.csv"), "--proof", str(out), *args])
    assert res.exit_code == 0, res.output + res.stderr
    import csv

    with open(tmp_path / "rows.csv") as fh:
        rows = list(csv.DictReader(fh))
    return out, rows, res


def _read(path):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(arrays.pop("header").tobytes().decode()), arrays


def _write(path, header, arrays):
    arrays = dict(arrays, header=np.frombuffer(json.dumps(header).encode(), np.uint8))
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    return str(path)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cert")
    return tmp, *_certify(tmp, "-n", "3", "--method", "crown,alpha-crown",
                          "--target", "runner-up,untargeted")


def test_every_certified_row_has_a_certificate_crown_check_accepts(written):
    tmp, out, rows, _ = written
    names = sorted(os.listdir(out))
    certified = [r for r in rows if r["status"] == "certified"]
    assert len(certified) == 12 and len(names) == 12
    for r in certified:
        t = "untargeted" if r["target_type"] == "untargeted" else f"runner-up_{r['target']}"
        path = os.path.join(out, f"{int(r['image']):05d}_linf_{r['method']}_{t}.proof")
        st = check_certify(MODEL, IMAGES, path)
        assert st["eps"] == float(r["eps"]) and st["image"] == int(r["image"])
        assert st["class"] == int(r["label"]) and st["nodes"] == st["cases"]
        assert st["cases"] == (9 if r["target_type"] == "untargeted" else 1)
    header, z = _read(os.path.join(out, names[0]))
    assert header["kind"] == "certify" and header["norm"] == "inf"
    assert any("slopes_k2" in k for k in _read(os.path.join(out, [
        n for n in names if "alpha" in n][0]))[1])  # alpha-CROWN's intermediate slopes
    res = CliRunner().invoke(cli, ["check", "--model", MODEL, "--images", IMAGES,
                                                   "--proof", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.count(": accepted (image ") == 12


def test_a_radius_beyond_an_adversarial_example_is_rejected(written, tmp_path):
    from crown_cli.certification.attack import PGDAttack
    from crown_cli.io.models import load_model as crown_model

    _, out, rows, _ = written
    r = next(r for r in rows if r["method"] == "crown" and r["target_type"] == "runner-up")
    path = os.path.join(out, f"{int(r['image']):05d}_linf_crown_runner-up_{r['target']}.proof")
    header, z = _read(path)
    mlp = crown_model(MODEL)
    x0, c, t = z["x0"], header["class"], header["targets"][0]
    att = PGDAttack(mlp.weights, mlp.biases, "relu", "inf").min_distortion(
        x0, c, [t], np.random.default_rng(0))
    assert att.eps is not None and att.eps > header["eps"]
    big = att.eps * 1.001  # the ball holds the attack's point, where y_t >= y_c
    assert np.max(np.abs(att.x_adv - x0)) <= big and att.margin <= 0
    lo, hi = ball_box(x0, big)
    header["eps"] = big
    bad = _write(tmp_path / "big.proof", header, z)
    with pytest.raises(Reject, match="its box is not the ball"):
        check_certify(MODEL, IMAGES, bad)
    bad = _write(tmp_path / "big2.proof", header, dict(z, c0_lo=lo, c0_hi=hi))
    with pytest.raises(Reject, match=r"target \d \(certificate case 0\): node 0: row 0: lower "
                                     r"bound .* is not > b_i = 0.0"):
        check_certify(MODEL, IMAGES, bad)


def test_another_image_or_a_changed_x0_is_rejected(written, tmp_path):
    _, out, rows, _ = written
    path = os.path.join(out, sorted(n for n in os.listdir(out) if n.startswith("00000_linf_crown_r"))[0])
    header, z = _read(path)
    x0 = z["x0"].copy()
    x0[300] += 2.0 ** -20
    lo, hi = ball_box(x0, header["eps"])
    bad = _write(tmp_path / "x0.proof", header, dict(z, x0=x0, c0_lo=lo, c0_hi=hi))
    with pytest.raises(Reject, match=r"x0 is not image 0 of the images file \(input 300"):
        check_certify(MODEL, IMAGES, bad)
    with np.load(IMAGES) as d:
        y = d["y"]
    same = int(np.flatnonzero(y == y[0])[1])  # another image of the same label
    bad = _write(tmp_path / "index.proof", dict(header, index=same), z)
    with pytest.raises(Reject, match=f"x0 is not image {same} of the images file"):
        check_certify(MODEL, IMAGES, bad)
    other = int(np.flatnonzero(y != y[0])[0])
    bad = _write(tmp_path / "label.proof", dict(header, index=other), z)
    with pytest.raises(Reject, match=f"header class {y[0]} is not the label {y[other]}"):
        check_certify(MODEL, IMAGES, bad)
    bad = _write(tmp_path / "target.proof", dict(header, targets=[header["class"]]), z)
    with pytest.raises(Reject, match="header targets"):
        check_certify(MODEL, IMAGES, bad)


def test_changed_weights_rejected_by_sha_then_by_the_bound(tmp_path):
    from crown_cli.io.models import load_model as crown_model, save_npz

    mlp = crown_model(MODEL)
    npz = str(tmp_path / "net.npz")
    save_npz(npz, mlp.weights, mlp.biases, "relu")
    out, rows, _ = _certify(tmp_path, "-n", "1", model=npz)
    path = str(out / os.listdir(out)[0])
    assert check_certify(npz, IMAGES, path)["cases"] == 1
    header, z = _read(path)
    c, t = header["class"], header["targets"][0]
    ws, bs = [w.copy() for w in mlp.weights], [b.copy() for b in mlp.biases]
    ws[-1][c] = ws[-1][t]  # y_c - y_t = b_c - b_t = -1 everywhere
    bs[-1][c] = bs[-1][t] - 1.0
    save_npz(npz, ws, bs, "relu")
    with pytest.raises(Reject, match="the model file's sha256 differs"):
        check_certify(npz, IMAGES, path)
    from crown_cli.verification.proof import sha256

    header["model"]["sha256"] = sha256(npz)
    bad = _write(tmp_path / "w.proof", header, z)
    with pytest.raises(Reject, match=r"lower bound -1\.0.* is not > b_i = 0.0"):
        check_certify(npz, IMAGES, bad)


def test_keras_reader_matches_crowns_loader():
    from crown_cli.io.models import load_model as crown_model

    for name in ("mnist_2x20.h5", "mnist_3x20.h5"):
        path = os.path.join(ROOT, "models", name)
        net, mlp = load_model(path), crown_model(path)
        assert net.sizes == [784] + [w.shape[0] for w in mlp.weights]
        for ops, w, b in zip(net.layers, mlp.weights, mlp.biases):
            assert np.array_equal(ops[0][1], w.T) and np.array_equal(ops[1][1], b)
        x = np.load(IMAGES)["x"][:5]
        from crown_cli.activations import forward

        assert np.allclose(net.forward(x), forward(mlp.weights, mlp.biases, "relu", x), atol=1e-9)
    with pytest.raises(Reject, match="ReLU networks only|activation"):
        load_model(os.path.join(ROOT, "models", "mnist_3x1024_tanh.h5"))


def test_idx_images_read_as_crown_reads_them(tmp_path):
    from crown_cli.check.images_reader import read_image
    from crown_cli.io.images import load_images

    rng = np.random.default_rng(3)
    pix = rng.integers(0, 256, size=(4, 28, 28), dtype=np.uint8)
    lab = np.array([3, 1, 4, 1], np.uint8)
    img, lbl = tmp_path / "t10k-images-idx3-ubyte.gz", tmp_path / "t10k-labels-idx1-ubyte"
    with gzip.open(img, "wb") as fh:
        fh.write(bytes([0, 0, 8, 3]) + b"".join(int(d).to_bytes(4, "big") for d in pix.shape)
                 + pix.tobytes())
    lbl.write_bytes(bytes([0, 0, 8, 1]) + (4).to_bytes(4, "big") + lab.tobytes())
    x, y = load_images(str(img))
    for i in range(4):
        xi, yi, n = read_image(str(img), i)
        assert np.array_equal(xi, x[i]) and yi == y[i] and n == 4
    # and a whole certify/check round trip on them (labels found beside the images)
    shutil.copy(MODEL, tmp_path / "m.h5")
    res = CliRunner().invoke(cli, [
        "certify", "--model", str(tmp_path / "m.h5"), "--images", str(img), "-q",
        "-o", str(tmp_path / "r.csv"), "--proof", str(tmp_path / "p")])
    assert res.exit_code == 0, res.stderr
    res = CliRunner().invoke(cli, [
        "check", "--model", str(tmp_path / "m.h5"), "--images", str(img), "--proof",
        str(tmp_path / "p")])
    n = len(os.listdir(tmp_path / "p"))
    assert res.exit_code == 0 and res.output.count("accepted") == n, res.output


@pytest.mark.parametrize("args, message", [
    (["--method", "fast-lin"], "--proof: certificates of radii cover --method crown and "
                               "alpha-crown only, not fast-lin"),
    (["--model", os.path.join(ROOT, "models", "mnist_3x1024_tanh.h5")],
     "--proof: certificates of radii cover ReLU networks, not tanh"),
])
def test_proof_refused_outside_its_scope(tmp_path, args, message):
    base = {"--model": MODEL}
    if "--model" in args:
        base = {}
    res = CliRunner().invoke(cli, [
        "certify", *sum(base.items(), ()), "-n", "1", "-q", "-o", str(tmp_path / "r.csv"),
        "--proof", str(tmp_path / "p"), *args])
    assert res.exit_code == 2
    assert error_line(res).startswith(f"crown: error: {message}")
    assert not os.path.exists(tmp_path / "p")


@pytest.mark.parametrize("method", ["crown", "alpha-crown"])
def test_a_targeted_row_at_the_untargeted_radius_takes_that_certificates_case(tmp_path, method):
    # what a targeted row raised to the untargeted row's radius gets (runner._Rows._proof)
    from crown_cli.certification.certifier import Certifier
    from crown_cli.certification.proofs import ProofWriter
    from crown_cli.io.models import load_model as crown_model

    mlp = crown_model(MODEL)
    cert = Certifier(mlp.weights, mlp.biases, "relu", method=method)
    cert.record_proof = True
    x0 = np.load(IMAGES)["x"][2]
    c = int(np.argmax(cert.logits(x0)))
    others = [t for t in range(10) if t != c]
    res = cert.certify(x0, c, others)
    warnings = []
    w = ProofWriter(str(tmp_path), MODEL, IMAGES, None, load_model(MODEL), warnings.append)
    row = {"image": 2, "target_type": "least", "target": others[4], "method": method,
           "norm": "inf", "eps": res.eps}
    path = w.write(row, method, x0, c, others, res, [others[4]])
    assert path and not warnings
    st = check_certify(MODEL, IMAGES, path)
    assert st["targets"] == [others[4]] and st["eps"] == res.eps


def test_a_run_over_several_norms_keeps_one_certificate_per_row(tmp_path):
    """--proof with --norm inf,2,1: one file per certified row, each naming its norm (the
    file name had no norm before session 40: 12 certificates reported, 4 files left, every
    one the l_1 row's), each accepted by crown check with the row's norm and eps."""
    out, rows, res = _certify(tmp_path, "-n", "2", "--norm", "inf,2,1", "--target",
                              "runner-up,untargeted")
    certified = [r for r in rows if r["status"] == "certified"]
    names = sorted(os.listdir(out))
    assert len(certified) == 12 and len(names) == 12
    for r in certified:
        t = "untargeted" if r["target_type"] == "untargeted" else f"runner-up_{r['target']}"
        path = os.path.join(out, f"{int(r['image']):05d}_l{r['norm']}_crown_{t}.proof")
        assert _read(path)[0]["norm"] == r["norm"]
        assert check_certify(MODEL, IMAGES, path)["eps"] == float(r["eps"])


@pytest.mark.parametrize("norm", ["2", "1"])
def test_l2_and_l1_radii_certified_then_a_radius_beyond_an_attack_rejected(tmp_path, norm):
    """Certificates of l_2 and l_1 radii: the checker bounds over the ball itself (the rows'
    minimum L x0 - eps ||L||_dual, rounding charged); every certified row's is accepted, and
    none survives a radius beyond a PGD adversarial example of that norm, nor being read as
    an l_inf radius (whose box is far larger)."""
    from crown_cli.certification.attack import PGDAttack
    from crown_cli.io.models import load_model as crown_model

    out, rows, _ = _certify(tmp_path, "-n", "2", "--norm", norm, "--method", "crown,alpha-crown")
    certified = [r for r in rows if r["status"] == "certified"]
    assert len(certified) == 4 and len(os.listdir(out)) == 4
    for name in sorted(os.listdir(out)):
        st = check_certify(MODEL, IMAGES, os.path.join(out, name))
        assert _read(os.path.join(out, name))[0]["norm"] == norm and st["nodes"] == 1
    path = os.path.join(out, sorted(n for n in os.listdir(out) if "_crown_" in n)[0])
    header, z = _read(path)
    with pytest.raises(Reject, match="is not > b_i"):  # as an l_inf radius: the box fails
        check_certify(MODEL, IMAGES, _write(tmp_path / "inf.proof", dict(header, norm="inf"), z))
    mlp = crown_model(MODEL)
    x0, c, t = z["x0"], header["class"], header["targets"][0]
    att = PGDAttack(mlp.weights, mlp.biases, "relu", norm).min_distortion(
        x0, c, [t], np.random.default_rng(0))
    assert att.eps is not None and att.eps > header["eps"] and att.margin <= 0
    big = att.eps * 1.001  # the ball holds the attack's point, where y_t >= y_c
    assert np.linalg.norm(att.x_adv - x0, ord=float(norm)) <= big
    lo, hi = ball_box(x0, big)
    bad = _write(tmp_path / "big.proof", dict(header, eps=big), dict(z, c0_lo=lo, c0_hi=hi))
    with pytest.raises(Reject, match=r"node 0: row 0: lower bound .* is not > b_i = 0.0"):
        check_certify(MODEL, IMAGES, bad)


@pytest.mark.parametrize("p", ["2", "1"])
def test_ball_minimum_below_the_exact_one_and_close(p):
    """bounds._ball_min against the exact minimum over the ball (50-digit mpmath for the
    l_2 norm's square root, exact Fractions otherwise)."""
    from fractions import Fraction

    import mpmath

    from crown_cli.check.bounds import _ball_min

    rng = np.random.default_rng(3)
    L = rng.normal(size=(5, 30)) * 10.0 ** rng.uniform(-3, 3, (5, 1))
    x0, eps, c = rng.uniform(-1, 1, 30), 0.37, rng.normal(size=5)
    v = _ball_min(L, c, np.zeros(5), x0, eps, p)
    mpmath.mp.dps = 50
    for r in range(5):
        dot = sum(Fraction(a) * Fraction(b) for a, b in zip(L[r], x0)) + Fraction(c[r])
        if p == "2":
            norm = mpmath.sqrt(mpmath.fsum(mpmath.mpf(a) ** 2 for a in L[r]))
            exact = mpmath.mpf(dot.numerator) / dot.denominator - mpmath.mpf(eps) * norm
        else:
            exact = dot - Fraction(eps) * max(Fraction(abs(a)) for a in L[r])
            exact = mpmath.mpf(exact.numerator) / exact.denominator
        assert mpmath.mpf(v[r]) <= exact
        assert exact - mpmath.mpf(v[r]) <= 1e-12 * (1 + abs(exact))


# ---- ONNX chains: the graph engine's CROWN radii and a lowered chain's, crown's (H, W, C)
# images taken channel-first by both

CIFAR_MODEL = os.path.join(ROOT, "models", "cifar_base_kw.onnx")
CIFAR = os.path.join(ROOT, "crown_cli", "data", "cifar10_test_100.npz")


def test_onnx_conv_chain_on_the_graph_engine_gets_certificates_crown_check_accepts(tmp_path):
    """cifar_base_kw.onnx (an input normalisation Sub/Div, two convolutions, two dense
    layers; not lowered: the graph engine's radii): every certified row's certificate is
    accepted by ``crown check``, its x0 is the image channel-first, and the same certificate
    at three times its radius is rejected by the bound."""
    from crown_cli.check import model_layout
    from crown_cli.certification.graph_certifier import to_graph_layout
    from crown_cli.io.networks import engine_form, load_network

    graph = load_network(CIFAR_MODEL)
    assert engine_form(graph)[1] is graph  # the graph engine, not a lowered chain
    out, rows, _ = _certify(tmp_path, "-n", "2", "--norm", "inf,2", model=CIFAR_MODEL,
                          images=CIFAR)
    assert len(rows) == 4 and all(r["status"] == "certified" for r in rows)
    res = CliRunner().invoke(cli, ["check", "--model", CIFAR_MODEL, "--images", CIFAR,
                                   "--proof", str(out)])
    assert res.exit_code == 0 and res.output.count(": accepted (image ") == 4, res.output
    row, = [r for r in rows if r["image"] == "1" and r["norm"] == "inf"]
    path = os.path.join(out, f"00001_linf_crown_runner-up_{row['target']}.proof")
    header, z = _read(path)
    from crown_cli.io.images import load_images

    x1 = load_images(CIFAR)[0][1]  # (pixel / 255 - 0.5, crown's (H, W, C) order)
    assert np.array_equal(z["x0"], to_graph_layout(graph, x1[None])[0])
    assert np.array_equal(z["x0"], model_layout(load_model(CIFAR_MODEL), x1))
    assert not np.array_equal(z["x0"], x1)  # (channel-first is another order)
    assert header["network"] == {"inputs": 3072, "hidden": [2048, 1024, 100], "outputs": 10,
                                 "activation": "relu"}
    eps = 3 * header["eps"]
    lo, hi = ball_box(z["x0"], eps)
    bad = _write(tmp_path / "wide.proof", dict(header, eps=eps), dict(z, c0_lo=lo, c0_hi=hi))
    with pytest.raises(Reject, match="target"):
        check_certify(CIFAR_MODEL, CIFAR, bad)


def _certify_with_images(tmp_path, model, x, *args):
    """crown certify --proof of ``model`` on images x (N, n) labelled with the model's own
    classes (crown certifies correctly classified images only)."""
    from crown_cli.certification.graph_certifier import to_graph_layout
    from crown_cli.io.networks import load_network

    graph = load_network(str(model))
    y = np.argmax(graph.forward(to_graph_layout(graph, x)), axis=1)
    images = tmp_path / "images.npz"
    np.savez(images, x=x, y=y)
    out = tmp_path / "p"
    res = CliRunner().invoke(cli, ["certify", "--model", str(model), "--images", str(images),
                                   "-q", "-o", str(tmp_path / "r.csv"), "--proof", str(out),
                                   *args])
    assert res.exit_code == 0, res.output + res.stderr
    return images, out, res


def test_lowered_onnx_chain_with_mul_and_div_gets_certificates_crown_check_accepts(tmp_path):
    """An ONNX chain with a per-channel Sub and Div of its (1, 2, 4, 5) input and a Mul after
    a Relu, lowered to the dense engine: certificates of l_inf and l_2 radii, accepted; the
    checker reads Mul and Div as crown does (the same outputs at random points)."""
    import onnx
    import graph_models as gm
    from crown_cli.certification.graph_certifier import to_graph_layout
    from crown_cli.graph.lower import lowered
    from crown_cli.io.networks import load_network

    model = tmp_path / "normalised.onnx"
    onnx.save(gm.normalised(np.random.default_rng(1)), str(model))
    graph = load_network(str(model))
    assert lowered(graph) is not None
    x = np.random.default_rng(2).uniform(0.0, 1.0, (4, 40))
    net = load_model(str(model))
    assert [op[0] for op in net.layers[0]][:3] == ["add", "div", "mat"]
    assert np.allclose(net.forward(to_graph_layout(graph, x)),
                       graph.forward(to_graph_layout(graph, x)), rtol=1e-12, atol=1e-12)
    images, out, _ = _certify_with_images(tmp_path, model, x, "--norm", "inf,2")
    n = len(os.listdir(out))
    assert n == 8
    res = CliRunner().invoke(cli, ["check", "--model", str(model), "--images", str(images),
                                   "--proof", str(out)])
    assert res.exit_code == 0 and res.output.count(": accepted (image ") == n, res.output


def test_checker_intervals_of_mul_and_div_hold_their_points():
    """The checker's interval bounds through an elementwise Mul and Div (negative factors
    among them) contain the operations' values at random points of the box."""
    from crown_cli.check.bounds import interval

    rng = np.random.default_rng(3)
    a, d = rng.normal(size=6), rng.choice([-3.0, -0.7, 0.3, 7.0], size=6)
    lo = rng.normal(size=(1, 6))
    hi = lo + rng.uniform(0.0, 2.0, size=(1, 6))
    L, H = interval([("scale", a), ("div", d)], lo, hi)
    pts = rng.uniform(lo, hi, size=(2000, 6))
    vals = (a * pts) / d
    assert np.all(L <= vals) and np.all(vals <= H)
    assert np.all(H - L <= np.abs(a / d) * (hi - lo) * (1 + 1e-12) + 1e-300)


@pytest.mark.parametrize("make, args, message", [
    ("cifar", ["--method", "alpha-crown"], "--proof: certificates of radii of ONNX models on "
                                           "the graph engine cover --method crown only, not "
                                           "alpha-crown"),
    ("residual", [], "--proof: crown check cannot read "),  # (tanh and sigmoid)
])
def test_onnx_proof_refused_outside_the_checkers_scope(tmp_path, make, args, message):
    import onnx
    import graph_models as gm

    model = tmp_path / f"{make}.onnx"
    if make == "cifar":
        shutil.copy(CIFAR_MODEL, model)
    else:
        onnx.save(getattr(gm, make)(np.random.default_rng(4)), str(model))
    n_in = 3072 if make == "cifar" else 4
    np.savez(tmp_path / "im.npz", x=np.zeros((1, n_in)), y=np.zeros(1, np.int64))
    res = CliRunner().invoke(cli, [
        "certify", "--model", str(model), "--images", str(tmp_path / "im.npz"), "-q",
        "-o", str(tmp_path / "r.csv"), "--proof", str(tmp_path / "p"), *args])
    assert res.exit_code == 2, res.output
    assert error_line(res).startswith(f"crown: error: {message}")
    assert not os.path.exists(tmp_path / "p")


def _residual_onnx(rng, conv=False):
    """ReLUs and sums of data tensors only: a -> relu(W2 relu(W1 a) + a) (an identity skip),
    then a block with a projected skip (a Gemm on it) and a Sub of two data tensors, a Gemm
    to 3 outputs; ``conv``: the same blocks as 3x3 convolutions on (1, 2, 5, 5), flattened."""
    import graph_models as gm

    g = gm.G(rng)
    if conv:
        c = lambda x, ci, co: g.op("Conv", [x, g.rand(co, ci, 3, 3, scale=0.4), g.rand(co)],  # noqa: E731
                                   pads=[1, 1, 1, 1])
        a = g.op("Relu", [c("x", 2, 3)])
        b = g.op("Relu", [g.op("Add", [c(g.op("Relu", [c(a, 3, 3)]), 3, 3), a])])
        p = g.op("Conv", [b, g.rand(3, 3, 1, 1), g.rand(3)])
        d = g.op("Relu", [g.op("Sub", [c(g.op("Relu", [c(b, 3, 3)]), 3, 3), p])])
        out = g.op("Gemm", [g.op("Flatten", [d]), g.rand(3, 75, scale=0.3), g.rand(3)],
                   transB=1)
        return g.model([("x", (1, 2, 5, 5))], [out]), 50
    f = lambda x, i, o: g.op("Gemm", [x, g.rand(o, i), g.rand(o)], transB=1)  # noqa: E731
    a = g.op("Relu", [f("x", 6, 8)])
    b = g.op("Relu", [g.op("Add", [f(g.op("Relu", [f(a, 8, 8)]), 8, 8), a])])
    d = g.op("Relu", [g.op("Sub", [f(g.op("Relu", [f(b, 8, 8)]), 8, 8), f(b, 8, 8)])])
    out = f(g.op("Add", [d, b]), 8, 3)
    return g.model([("x", (1, 6))], [out]), 6


@pytest.mark.parametrize("conv", [False, True])
def test_residual_onnx_certificates_accepted_and_a_false_radius_rejected(tmp_path, conv):
    """Residual networks (identity and projected skips, a Sub of two data tensors, sums
    read by a Gemm): the checker reads them as crown does (the same outputs), accepts the
    certificate of every certified row (l_inf, l_2), and rejects a certificate moved to a
    radius where the margin's exact minimum (MILP; on the convolutional one a point of the
    box) is negative."""
    import onnx
    from graph_oracles import graph_min
    from crown_cli.io.networks import load_network

    m, n_in = _residual_onnx(np.random.default_rng(5), conv)
    model = tmp_path / "res.onnx"
    onnx.save(m, str(model))
    graph, net = load_network(str(model)), load_model(str(model))
    assert not net.chain and net.input_shape[0] == 1
    x = np.random.default_rng(6).uniform(0.0, 1.0, (4, n_in))
    from crown_cli.certification.graph_certifier import to_graph_layout

    xg = to_graph_layout(graph, x)
    assert np.allclose(net.forward(xg), graph.forward(xg), rtol=1e-12, atol=1e-12)
    images, out, _ = _certify_with_images(tmp_path, model, x, "--norm", "inf,2")
    names = sorted(os.listdir(out))
    import csv

    with open(tmp_path / "r.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "certified"]
    assert len(names) == len(rows) >= 6
    res = CliRunner().invoke(cli, ["check", "--model", str(model), "--images", str(images),
                                   "--proof", str(out)])
    assert res.exit_code == 0 and res.output.count(": accepted (image ") == len(rows), res.output
    # a false radius: where the exact minimum of the margin over the box is < 0
    path = os.path.join(out, [n for n in names if "_linf_" in n][0])
    header, z = _read(path)
    row = np.zeros(3)
    row[header["class"]], row[header["targets"][0]] = 1.0, -1.0
    rng = np.random.default_rng(8)
    for f in (1.5, 2, 4, 8, 16, 32, 64):
        lo, hi = ball_box(z["x0"], f * header["eps"])
        if conv:  # a concrete violation among random corners of the box (the MILP is slow)
            X = np.where(rng.random((4000, lo.size)) < 0.5, lo, hi)
            low = float(np.min(graph.forward(X) @ row))
        else:
            low, _ = graph_min(graph, lo, hi, row)
        if low < -1e-6:
            break
    assert low < -1e-6
    bad = _write(tmp_path / "far.proof", dict(header, eps=f * header["eps"]),
                 dict(z, c0_lo=lo, c0_hi=hi))
    with pytest.raises(Reject, match="target"):
        check_certify(str(model), str(images), bad)


def test_max_pools_of_affine_values_and_of_sums_certificates_accepted(tmp_path):
    """Max pools whose input is no ReLU's output (a convolution's, a residual sum's) and a
    pool two convolutions read: the checker reads each as an identity layer (every neuron
    bounded in step 1b, a pool's rows from all its readers relaxed once, as the engine
    does), computes what crown computes, and accepts the certificates of radii at the edge
    of the engine's bound."""
    import onnx
    import graph_models as gm
    from crown_cli.certification.graph_certifier import to_graph_layout
    from crown_cli.io.networks import load_network

    g = gm.G(np.random.default_rng(7))
    p1 = g.op("MaxPool", [g.op("Conv", ["x", g.rand(3, 2, 3, 3), g.rand(3)], pads=[1, 1, 1, 1])],
              kernel_shape=[2, 2], strides=[2, 2])
    a1 = g.op("Relu", [p1])
    s = g.op("Add", [g.op("Conv", [a1, g.rand(3, 3, 3, 3, scale=0.3), g.rand(3)],
                          pads=[1, 1, 1, 1]), a1])
    p2 = g.op("MaxPool", [s], kernel_shape=[2, 2], strides=[1, 1])
    b = g.op("Relu", [g.op("Conv", [p2, g.rand(2, 3, 1, 1), g.rand(2)])])
    c = g.op("Conv", [p2, g.rand(2, 3, 1, 1), g.rand(2)])
    d = g.op("Relu", [g.op("Add", [b, c])])
    out = g.op("Gemm", [g.op("Flatten", [d]), g.rand(3, 8), g.rand(3)], transB=1)
    model = tmp_path / "pools.onnx"
    onnx.save(g.model([("x", (1, 2, 6, 6))], [out]), str(model))
    net, graph = load_model(str(model)), load_network(str(model))
    assert len(net.identity) == 3  # the conv's pool input, the sum's, the pool read twice
    x = np.random.default_rng(8).uniform(0.0, 1.0, (4, 72))
    xg = to_graph_layout(graph, x)
    assert np.allclose(net.forward(xg), graph.forward(xg), rtol=1e-12, atol=1e-12)
    images, out_dir, res = _certify_with_images(tmp_path, model, x, "--norm", "inf,2")
    assert "would reject" not in res.stderr, res.stderr
    assert len(os.listdir(out_dir)) == 8


def test_max_pool_after_a_relu_certificates_accepted(tmp_path):
    """Conv -> Relu -> MaxPool -> Conv -> Relu -> Gemm on the graph engine: the engine bounds
    every neuron a max pool reads (the pool's lines take those bounds), and so does the
    checker (step 1b), so that a radius at the edge of the engine's bound is accepted
    (before, the checker kept the interval bounds of the pool's active inputs and rejected
    them)."""
    import onnx
    import graph_models as gm

    g = gm.G(np.random.default_rng(9))
    a = g.op("Relu", [g.op("Conv", ["x", g.rand(4, 2, 3, 3), g.rand(4)], pads=[1, 1, 1, 1])])
    p = g.op("MaxPool", [a], kernel_shape=[2, 2], strides=[2, 2])
    b = g.op("Relu", [g.op("Conv", [p, g.rand(4, 4, 3, 3, scale=0.3), g.rand(4)],
                           pads=[1, 1, 1, 1])])
    out = g.op("Gemm", [g.op("Flatten", [b]), g.rand(3, 36, scale=0.3), g.rand(3)], transB=1)
    model = tmp_path / "pool.onnx"
    onnx.save(g.model([("x", (1, 2, 6, 6))], [out]), str(model))
    assert load_model(str(model)).pool_fed == {1}
    x = np.random.default_rng(10).uniform(0.0, 1.0, (4, 72))
    images, out_dir, res = _certify_with_images(tmp_path, model, x, "--norm", "inf,2")
    assert "would reject" not in res.stderr, res.stderr
    assert len(os.listdir(out_dir)) == 8


def test_a_relu_split_of_an_identity_layers_neuron_is_rejected(tmp_path):
    """A tree may split only ReLU inputs: a split of a neuron of an identity layer (a max
    pool's input) is rejected by the structure check, one of a ReLU's is not."""
    import onnx
    import graph_models as gm
    from crown_cli.check.certificate import structure

    g = gm.G(np.random.default_rng(14))
    p = g.op("MaxPool", [g.op("Conv", ["x", g.rand(2, 1, 3, 3), g.rand(2)])],
             kernel_shape=[2, 2], strides=[2, 2])
    out = g.op("Gemm", [g.op("Flatten", [g.op("Relu", [p])]), g.rand(3, 8), g.rand(3)],
               transB=1)
    onnx.save(g.model([("x", (1, 1, 6, 6))], [out]), str(tmp_path / "m.onnx"))
    net = load_model(str(tmp_path / "m.onnx"))
    assert net.identity == {1} and net.hidden == [32, 8]
    a = dict(kind=np.array([2, 0, 0]), refresh=np.ones(3, np.int16),
             alpha_at=np.full(3, -1), beta_at=np.full(3, -1), hull_at=np.full(3, -1),
             alpha=np.zeros((0, 0)), beta=np.zeros((0, 0)), hull_s=np.zeros((0, 0)))
    with pytest.raises(Reject, match="a ReLU split of neuron 5, which is no ReLU's input"):
        structure(dict(a, arg=np.array([5, 0, 0])), net, 1)
    assert list(structure(dict(a, arg=np.array([33, 0, 0])), net, 1)) == [2, -1, -1]


def _moves_onnx(rng):
    """Element moves between ReLU layers: Split and Concat of channels (with a constant
    part), Transpose, a Pad of 0.5, a Slice, a Gather that takes elements twice, Unsqueeze
    and Squeeze; (1, 2, 4, 4) -> 3 outputs."""
    import graph_models as gm

    g = gm.G(rng)
    i64 = lambda v: g.const(v, np.int64)  # noqa: E731
    a = g.op("Relu", [g.op("Conv", ["x", g.rand(4, 2, 3, 3), g.rand(4)], pads=[1, 1, 1, 1])])
    b, c = g.op("Split", [a, i64([2, 2])], n_out=2, axis=1)
    d = g.op("Concat", [g.op("Conv", [b, g.rand(2, 2, 1, 1), g.rand(2)]), c,
                        g.const(np.full((1, 1, 4, 4), 0.25))], axis=1)
    e = g.op("Transpose", [d], perm=[0, 1, 3, 2])
    f = g.op("Pad", [e, i64([0, 0, 1, 1, 0, 0, 1, 1]), g.const(np.array(0.5))])
    h = g.op("Flatten", [g.op("Relu", [g.op("Conv", [f, g.rand(3, 5, 3, 3, scale=0.3),
                                                    g.rand(3)])])])
    h = g.op("Slice", [h, i64([0]), i64([48]), i64([1])])
    k = g.op("Gather", [h, i64([0, 1, 1, 5, 17, 17, 17, 30, 47])], axis=1)
    k = g.op("Squeeze", [g.op("Unsqueeze", [k, i64([0])]), i64([0])])
    out = g.op("Gemm", [k, g.rand(3, 9), g.rand(3)], transB=1)
    return g.model([("x", (1, 2, 4, 4))], [out], opset=13)


def test_element_moves_read_by_the_checker_and_certificates_accepted(tmp_path):
    """Split, Concat (a constant part among its inputs), Transpose, a Pad of a nonzero
    value, a Slice, a Gather that takes some elements twice (their rows summed, the sums charged),
    Unsqueeze and Squeeze: the checker computes what crown computes, accepts every
    certificate of the certified rows, and rejects one moved where a point of the box
    breaks the margin."""
    import onnx
    from crown_cli.certification.graph_certifier import to_graph_layout
    from crown_cli.io.networks import load_network

    model = tmp_path / "moves.onnx"
    onnx.save(_moves_onnx(np.random.default_rng(15)), str(model))
    net, graph = load_model(str(model)), load_network(str(model))
    assert any(op[0] == "take" for t in net.terms for _, ops in t for op in ops)
    x = np.random.default_rng(16).uniform(0.0, 1.0, (4, 32))
    xg = to_graph_layout(graph, x)
    assert np.allclose(net.forward(xg), graph.forward(xg), rtol=1e-12, atol=1e-12)
    images, out_dir, res = _certify_with_images(tmp_path, model, x, "--norm", "inf,2")
    assert "would reject" not in res.stderr, res.stderr
    names = sorted(os.listdir(out_dir))
    assert len(names) >= 6
    header, z = _read(os.path.join(out_dir, [n for n in names if "_linf_" in n][0]))
    row = np.zeros(3)
    row[header["class"]], row[header["targets"][0]] = 1.0, -1.0
    rng = np.random.default_rng(17)
    for f in (2, 4, 8, 16, 32, 64):
        lo, hi = ball_box(z["x0"], f * header["eps"])
        X = np.where(rng.random((4000, 32)) < 0.5, lo, hi)
        if np.min(graph.forward(X) @ row) < 0:
            break
    bad = _write(tmp_path / "far.proof", dict(header, eps=f * header["eps"]),
                 dict(z, c0_lo=lo, c0_hi=hi))
    with pytest.raises(Reject, match="target"):
        check_certify(str(model), str(images), bad)


def test_batch_norm_nodes_certificates_accepted(tmp_path):
    """BatchNormalization nodes left in the file (after a ReLU, and on a residual sum): the
    checker reads each as (x - mean) / d * scale + B with the real d = sqrt(var + eps)
    enclosed by two floats (checked exactly), charges the gap, computes what crown computes
    and accepts the certificates at the edge of the engine's bound."""
    import onnx
    import graph_models as gm
    from crown_cli.certification.graph_certifier import to_graph_layout
    from crown_cli.check.onnx_reader import sqrt_between
    from crown_cli.io.networks import load_network
    from fractions import Fraction

    rng = np.random.default_rng(18)
    g = gm.G(rng)

    def bn(x, c):
        return g.op("BatchNormalization", [x, g.const(rng.uniform(0.5, 1.5, c)), g.rand(c),
                                           g.rand(c), g.const(rng.uniform(0.3, 2.0, c))],
                    epsilon=1e-3)
    a = bn(g.op("Relu", [g.op("Conv", ["x", g.rand(3, 2, 3, 3), g.rand(3)], pads=[1, 1, 1, 1])]), 3)
    b = g.op("Relu", [g.op("Conv", [a, g.rand(3, 3, 3, 3, scale=0.3), g.rand(3)], pads=[1, 1, 1, 1])])
    s = bn(g.op("Add", [b, a]), 3)
    out = g.op("Gemm", [g.op("Flatten", [g.op("Relu", [s])]), g.rand(3, 48, scale=0.3),
                        g.rand(3)], transB=1)
    model = tmp_path / "bn.onnx"
    onnx.save(g.model([("x", (1, 2, 4, 4))], [out]), str(model))
    net, graph = load_model(str(model)), load_network(str(model))
    assert sum(op[0] == "divr" for t in net.terms for _, ops in t for op in ops) == 4  # (per term)
    for v in (Fraction(2), Fraction(1, 3) + Fraction(1, 1000), Fraction(10 ** 6 + 1)):
        lo, hi = sqrt_between(v)
        assert Fraction(lo) ** 2 <= v <= Fraction(hi) ** 2 and hi - lo <= 2 * np.spacing(hi)
    x = np.random.default_rng(19).uniform(0.0, 1.0, (4, 32))
    xg = to_graph_layout(graph, x)
    assert np.allclose(net.forward(xg), graph.forward(xg), rtol=1e-9, atol=1e-9)
    images, out_dir, res = _certify_with_images(tmp_path, model, x, "--norm", "inf,2")
    assert "would reject" not in res.stderr, res.stderr
    assert len(os.listdir(out_dir)) >= 6


def test_checker_interval_and_rows_over_a_real_divisor_hold():
    """("divr", lo, hi): y = x / d for a real d in [lo, hi]. Its interval bounds contain
    x / d for every sampled x and d; a row's bound through it (the charge of the divisor's
    gap) lies below the row's values at sampled points and d."""
    from crown_cli.check.bounds import _through, interval

    rng = np.random.default_rng(20)
    lo_d = rng.uniform(0.5, 2.0, 5)
    hi_d = lo_d * (1 + rng.uniform(0, 1e-3, 5))
    lo = rng.normal(size=(1, 5))
    hi = lo + rng.uniform(0.0, 1.0, (1, 5))
    L, H = interval([("divr", lo_d, hi_d)], lo, hi)
    X = rng.uniform(lo, hi, (3000, 5))
    D = rng.uniform(lo_d, hi_d, (3000, 5))
    assert np.all(L <= X / D) and np.all(X / D <= H)
    row = rng.normal(size=(1, 5))
    Lx, c, q = _through([("divr", lo_d, hi_d)], row, np.zeros(1), np.zeros(1),
                        [(lo, hi)], np.zeros(1, np.int64))
    bound = np.minimum(Lx * lo, Lx * hi).sum() + c[0] - q[0]
    assert q[0] > 0 and bound <= np.min((X / D) @ row[0])


def test_onnx_dense_chain_of_an_image_input_certificate_holds_the_image_channel_first(tmp_path):
    """An ONNX chain of dense layers whose input is an image (1, 3, 5, 5): crown runs it on
    the dense engine in its own (H, W, C) order (the first layer's columns permuted), the
    certificate holds the image in the model's (C, H, W) layout, and the checker accepts
    it (before, x0 was written in crown's order and every certificate was rejected)."""
    import onnx
    import graph_models as gm
    from crown_cli.io.networks import engine_form, load_network

    g = gm.G(np.random.default_rng(21))
    h = g.op("Relu", [g.op("Gemm", [g.op("Flatten", ["x"]), g.rand(20, 75, scale=0.3),
                                    g.rand(20)], transB=1)])
    out = g.op("Gemm", [h, g.rand(3, 20), g.rand(3)], transB=1)
    model = tmp_path / "mlp.onnx"
    onnx.save(g.model([("x", (1, 3, 5, 5))], [out]), str(model))
    mlp, graph, layout = engine_form(load_network(str(model)))
    assert mlp is not None and layout is None  # the dense form, in crown's (H, W, C) order
    x = np.random.default_rng(22).uniform(0.0, 1.0, (4, 75))
    images = tmp_path / "images.npz"
    np.savez(images, x=x, y=np.argmax(mlp.forward(x), axis=1))
    res = CliRunner().invoke(cli, ["certify", "--model", str(model), "--images", str(images),
                                   "-q", "-o", str(tmp_path / "r.csv"), "--proof",
                                   str(tmp_path / "p")])
    assert res.exit_code == 0 and "would reject" not in res.stderr, res.stderr
    names = os.listdir(tmp_path / "p")
    assert len(names) == 4
    _, z = _read(os.path.join(tmp_path / "p", names[0]))
    assert not np.array_equal(z["x0"], x[int(names[0][:5])])  # channel-first, not crown's


def test_alpha_crown_certificates_of_a_lowered_onnx_chain_accepted(tmp_path):
    """An ONNX chain lowered to the dense engine (its normalisation and a Mul folded):
    alpha-crown's certificates (slopes over the unstable neurons, numbered as the ONNX
    ReLUs' inputs are) accepted for every certified row."""
    import onnx
    import graph_models as gm

    model = tmp_path / "normalised.onnx"
    onnx.save(gm.normalised(np.random.default_rng(1)), str(model))
    x = np.random.default_rng(2).uniform(0.0, 1.0, (4, 40))
    images, out, res = _certify_with_images(tmp_path, model, x, "--method", "alpha-crown",
                                            "--norm", "inf,2")
    assert "would reject" not in res.stderr, res.stderr
    names = sorted(os.listdir(out))
    assert len(names) == 8
    assert any(len(_read(os.path.join(out, n))[1]["c0_cols"]) for n in names)
    res = CliRunner().invoke(cli, ["check", "--model", str(model), "--images", str(images),
                                   "--proof", str(out)])
    assert res.exit_code == 0 and res.output.count(": accepted (image ") == 8, res.output
