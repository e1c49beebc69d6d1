"""Benchmark: certification time per image, bound evaluations, achieved GFLOP/s and peak memory.

Every case runs in its own subprocess (so its peak RSS is its own) on both cores:

    relu3    MNIST 3x[1024] ReLU (models/mnist_3x1024.h5), l_inf, runner-up target, the first
             N correctly classified shipped MNIST test images
    relu4    the same for MNIST 4x[1024] ReLU (models/mnist_4x1024.h5)
    tanh, sigmoid, arctan   models/mnist_3x1024_<act>.h5, as relu3 (ratio to relu3 printed)
    relu3-plain  relu3 without the ReLU-only shortcut of reusing neurons proven stable (on a
             larger ball, or from float32 in the verification): the work per evaluation a
             smooth activation cannot avoid; the smooth cases print their ratio to it too
    cifar7   CIFAR-shaped 7x[1024] ReLU with seeded random weights (He normal, seed 0), l_inf,
             runner-up of the predicted class, the shipped first CIFAR-10 test images
    mem6     CIFAR-shaped 6x[2048] ReLU, seeded random weights, l_2, 2 images: peak RSS
    conv     the CIFAR convolutional network models/cifar_base_kw.onnx (VNN-COMP 2021 oval21's
             cifar_base_kw with its input normalisation in front, so it takes crown's
             pixel/255 - 0.5 images: scripts/make_oval21_model.py), crown certify's graph path
             (GraphCertifier, --method crown, float64), l_inf, runner-up target, the first
             --conv-images correctly classified shipped CIFAR-10 images: s/image, mean eps, peak
             RSS, and the tracemalloc peak of one more certification (the first image, run
             after the timed ones, so tracing does not slow them). No --check; with --before a
             checkout without graph networks prints "no before"
    resnet   a small CIFAR ResNet the project builds itself (scripts/resnet_model.py: two
             residual blocks, 73k parameters, seeded random weights), crown certify's graph
             path (GraphCertifier, --method crown), l_inf, runner-up of the predicted class,
             the first --conv-images shipped CIFAR-10 images: s/image and evaluations, and
             seconds per CROWN bound of the margin at the certified eps (best of 5, float64).
             With --lirpa DIR (an auto_LiRPA checkout; needs torch) auto_LiRPA's CROWN on the
             same network in float64, in its own process: seconds per bound at the same eps
             (best of 5), the ratio, and whether its bound agrees with the radius (its margin
             bound > 0 at eps (1 - 1e-3) and < 0 at eps (1 + 1e-3)); peak RSS of each
             process. Then alpha-CROWN of the first image's margin at its eps, float64, 20
             iterations on both sides (crown: GraphBounds(intermediate="alpha") and
             alpha_lower; auto_LiRPA: CROWN-Optimized, each with its own step size): seconds
             and bounds; crown's alpha-crown radius of that image (GraphCertifier, --method
             alpha-crown) and, with --lirpa, whether auto_LiRPA's CROWN-Optimized bound
             agrees with it (> 0 at eps (1 - 1e-3), < 0 at eps (1 + 1e-3))
    graph-dense  the one-engine gap: one float64 CROWN bound of the runner-up margin of relu3's
             model (its graph form, every neuron refined: the dense engine's bounds) by the
             graph engine (GraphBounds, ibp=False) against the dense engine
             (Certifier.lower_bound), the first --images shipped images at eps 0.005 and
             0.01, best of 3 each: mean ms per bound of each, their ratio, and the largest
             difference of the two bounds (the same numbers to rounding)
    cli      a warm `crown certify -n 1` of relu3's model, wall-clock, start-up included
    alpha3   relu3 with --method alpha-crown (default settings): s/image, and the mean eps gain
             over crown on the same images (crown's own time is not counted)
    bab      the batched input-split bounds (batch_lower_bounds) on --bab-boxes random boxes
             (width 0.02 per input in [-0.5, 0.5]^5) of a random 5-50x6-5 ReLU net (ACAS Xu's shape), 4 margin rows,
             in blocks of 128 as input_split uses it: boxes/second, all rows back-substituted
             and with skip_stable
    bab-relu ReLU-splitting branch and bound (relu_split, verify's settings)
             on mnist-net_256x4 of VNN-COMP 2021 mnistfc, property prop_3_0.03 (CROWN leaves
             all 9 cases open; the first stays open for minutes, so the rate is that of a
             long search): its cases in order for --bab-seconds in all, the root bounds
             of the box (computed once, as verify does) not counted: domains/second. Needs the
             benchmark folder (--vnncomp, default ../shared/data/vnncomp2021 beside the repo)
    bab-relu-joint  the same property as verify runs it on networks of 3+ hidden layers: one
             search over all 9 cases (groups), each domain bounded in the rows of the cases
             still open on it, for --bab-seconds: domains/second and the worst open bound
             (a domain here does the work of up to 9 of bab-relu's)

    hull     convex-hull input splitting (verification/bab/hull_split.py) on the 9 instances
             of VNN-COMP 2024 safenlp (medical) that input splitting left open at 20 s
             (--vnncomp's sibling vnncomp2024/safenlp_medical): per instance the boxes and
             seconds to its verdict (20 s each at most), and their sum; with --before a
             checkout without it prints "no before"

    python scripts/bench.py [--cases relu3,relu4,...] [--images 20] [--cifar-images 20]
                            [--conv-images 5] [--lirpa DIR]
                            [--bab-boxes 4096] [--bab-seconds 30] [--vnncomp DIR]
                            [--check] [--before DIR]

For each case it prints images, mean and median s/image, mean evaluations, achieved GFLOP/s
of the bound computation against a float32 GEMM peak measured on the spot, and peak RSS.
``--check`` also runs the plain reference (float64 bisection to rtol 1e-5) on the same images
and prints the largest relative eps difference and the largest excess over it (the reference
lies within 1e-5 below the plain method's limit; for this checkout only). ``--before DIR`` runs the same cases with the
crown_cli package of another checkout (e.g. ``git worktree add /tmp/before <rev>``) and prints
the before/after time ratios measured in this one run.
"""
import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
CIFAR = os.path.join(ROOT, "crown_cli", "data", "cifar10_test_100.npz")
CASES = ("relu3", "relu4", "tanh", "sigmoid", "arctan", "relu3-plain", "cifar7", "mem6", "cli",
         "alpha3", "bab", "bab-relu", "bab-relu-joint", "conv", "resnet", "hull", "graph-dense")
CONV_MODEL = os.path.join(MODELS, "cifar_base_kw.onnx")
TARGETS_S = {"relu3": 0.05, "relu4": 0.15, "cifar7": 0.7, "alpha3": 1.0}  # issue 5 targets, s/image


def gemm_peak(dtype, n=1024, reps=5):
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    a @ a
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def random_mlp(sizes, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal((o, i)) * np.sqrt(2.0 / i) for i, o in zip(sizes[:-1], sizes[1:])]
    bs = [0.01 * rng.standard_normal(o) for o in sizes[1:]]
    return ws, bs


def _module(*names):
    """The first of ``names`` that imports: the package's layout changed (issue 22), and
    ``--before`` may run a checkout of either layout. The old name comes first: an editable
    install of the new layout can serve its subpackages to a process whose PYTHONPATH points
    at an old checkout, which must not be measured as the old code."""
    for i, name in enumerate(names):
        try:
            return importlib.import_module(name)
        except ImportError:
            if i == len(names) - 1:
                raise


def _checkout_module(name):
    """The module ``name`` of the checkout this worker runs (its PYTHONPATH): ImportError when
    that checkout has none, also when an editable install of a newer layout serves it from
    elsewhere (so --before on an older checkout says "no before")."""
    pkg = os.path.abspath((os.environ.get("PYTHONPATH") or ROOT).split(os.pathsep)[0])
    mod = _module(name)
    if not os.path.abspath(mod.__file__).startswith(pkg + os.sep):
        raise ImportError(mod.__file__)
    return mod


def bab_worker(n_boxes):
    """The bab case: batched bounds per second on a random ACAS-shaped net."""
    import numpy as np

    bab = _module("crown_cli.bab", "crown_cli.engine.batched", "crown_cli.engine.dense_boxes")

    weights, biases = random_mlp([5] + [50] * 6 + [5], 0)
    net = bab.BatchNet(weights, biases)
    rng = np.random.default_rng(0)
    lo = rng.uniform(-0.5, 0.48, (n_boxes, 5))
    hi = lo + 0.02
    A = np.eye(5)[1:] - np.eye(5)[0]
    res = {"case": "bab", "boxes": n_boxes}
    for key, skip in (("full", False), ("skip", True)):
        bab._bound_blocked(net, lo[:128], hi[:128], A, 128, skip_stable=skip)  # warm-up
        t, c = time.perf_counter(), time.process_time()
        bab._bound_blocked(net, lo, hi, A, 128, skip_stable=skip)
        res[key] = n_boxes / (time.perf_counter() - t)
        res[key + "_cpu"] = n_boxes / (time.process_time() - c)
    res["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(res))


def bab_relu_worker(seconds, vnncomp, joint=False):
    """The bab-relu case: ReLU-splitting domains per second on mnist-net_256x4 (``joint``:
    all cases in one search)."""
    import numpy as np

    split_mod = _module("crown_cli.bab_relu", "crown_cli.verification.bab.relu_split")
    relu_split, root_layer_bounds = split_mod.relu_split, split_mod.root_layer_bounds
    # ONNX files: io.networks.load_network since the one ONNX reader; model_io / io.models
    # before
    io_mod = _module("crown_cli.model_io", "crown_cli.io.networks", "crown_cli.io.models")
    load_model = getattr(io_mod, "load_network", None) or io_mod.load_model
    parse_vnnlib = _module("crown_cli.vnnlib", "crown_cli.io.vnnlib").parse_vnnlib

    folder = os.path.join(vnncomp, "mnistfc")
    onnx_path = os.path.join(folder, "mnist-net_256x4.onnx")
    if not os.path.isfile(onnx_path):
        print(json.dumps({"case": "bab-relu-joint" if joint else "bab-relu",
                          "error": f"{onnx_path}: not found (--vnncomp)"}))
        return
    mlp = load_model(onnx_path)
    mlp = getattr(mlp, "dense", None) or mlp  # a graph's dense form (older checkouts: an MLP)
    weights, biases = mlp.verify_layers()
    prop = parse_vnnlib(os.path.join(folder, "prop_3_0.03.vnnlib"), 784, 10)
    c0 = prop.cases[0]
    try:  # the root's slopes serve the per-domain bounds, as in verify
        bounds, slopes = root_layer_bounds(weights, biases, c0.lo, c0.hi, slopes=True)
        extra = {"layer_slopes": slopes}
    except TypeError:  # a checkout before interm_slopes
        bounds, extra = root_layer_bounds(weights, biases, c0.lo, c0.hi), {}
    name = "bab-relu-joint" if joint else "bab-relu"
    res = {"case": name, "seconds": seconds, "domains": 0, "time_s": 0.0, "verdicts": []}
    end = time.monotonic() + seconds
    if joint:
        A = np.concatenate([c.A for c in prop.cases])
        b = np.concatenate([c.b for c in prop.cases])
        groups = np.concatenate([np.full(c.A.shape[0], g) for g, c in enumerate(prop.cases)])
        try:
            r = relu_split(weights, biases, c0.lo, c0.hi, A, b, end, layer_bounds=bounds,
                           groups=groups, attack_restarts=0, **extra)
        except TypeError:  # a checkout without joint searches
            print(json.dumps({"case": name, "error": "relu_split has no groups here"}))
            return
        res.update(domains=r.domains, time_s=r.time_s, verdicts=[r.verdict],
                   worst=r.worst_bound, rate=r.domains / r.time_s)
        res["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print(json.dumps(res))
        return
    for j, c in enumerate(prop.cases):
        if time.monotonic() >= end:
            break
        r = relu_split(weights, biases, c.lo, c.hi, c.A, c.b, end, layer_bounds=bounds,
                       seed=j, attack_restarts=0, **extra)
        res["domains"] += r.domains
        res["time_s"] += r.time_s
        res["verdicts"].append(r.verdict)
    res["rate"] = res["domains"] / res["time_s"]
    res["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(res))


def conv_worker(n_images):
    """The conv case: crown certify's graph path on the shipped CIFAR convolutional network."""
    import tracemalloc

    import numpy as np

    try:
        gc_mod = _checkout_module("crown_cli.certification.graph_certifier")
        load_graph = _module("crown_cli.graph.onnx_graph").load_graph
    except ImportError:
        print(json.dumps({"case": "conv", "error": "no before: this checkout cannot certify "
                                                   "convolutional (graph) networks"}))
        return
    load_images = _module("crown_cli.io.images").load_images
    graph = load_graph(CONV_MODEL)
    x, y = load_images(CIFAR)
    x = gc_mod.to_graph_layout(graph, x)  # (H, W, C) -> the model's (C, H, W)
    cert = gc_mod.GraphCertifier(graph, norm="inf", method="crown")
    z = cert.logits(x)
    order = np.argsort(z, axis=1)
    picks = [(i, int(order[i, -1]), int(order[i, -2])) for i in range(x.shape[0])
             if order[i, -1] == y[i]][:n_images]
    times, evals, eps = _certify_picks(cert, x, picks)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    tracemalloc.start()
    i, c, t = picks[0]
    cert.certify(x[i], c, [t])
    traced = tracemalloc.get_traced_memory()[1] / 2.0 ** 20
    tracemalloc.stop()
    print(json.dumps({"case": "conv", "images": len(picks), "mean_s": sum(times) / len(times),
                      "median_s": statistics.median(times), "evaluations": float(np.mean(evals)),
                      "mean_eps": float(np.mean(eps)), "rss_mb": rss, "traced_mb": traced,
                      "accuracy": float(np.mean(order[:, -1] == y))}))


def _certify_picks(cert, x, picks):
    """Each pick (image, class, target) certified, after one warm-up certification (the
    numba kernels' cache): per pick its time, evaluations and eps."""
    i, c, t = picks[0]
    cert.certify(x[i], c, [t])
    times, evals, eps = [], [], []
    for i, c, t in picks:
        r = cert.certify(x[i], c, [t])
        times.append(r.time_s)
        evals.append(r.evaluations)
        eps.append(float(r.eps))
    return times, evals, eps


def _resnet():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import resnet_model

    return resnet_model


def _resnet_picks(z, n_images):
    """The first images with the predicted class and its runner-up (random weights: whatever
    class the network predicts)."""
    import numpy as np

    order = np.argsort(z, axis=1)
    return [(i, int(order[i, -1]), int(order[i, -2])) for i in range(min(n_images, z.shape[0]))]


def resnet_worker(n_images):
    """The resnet case, crown's side: certify, then one margin bound at each radius."""
    import numpy as np

    try:
        gc_mod = _checkout_module("crown_cli.certification.graph_certifier")
        GraphBounds = _checkout_module("crown_cli.engine.graph_bounds").GraphBounds
    except ImportError:
        print(json.dumps({"case": "resnet", "error": "no before: this checkout cannot certify "
                                                     "graph networks"}))
        return
    graph = _resnet().graph(_resnet().parameters())
    x, _ = _module("crown_cli.io.images").load_images(CIFAR)
    x = gc_mod.to_graph_layout(graph, x)
    cert = gc_mod.GraphCertifier(graph, norm="inf", method="crown")
    picks = _resnet_picks(cert.logits(x), n_images)
    times, evals, eps = _certify_picks(cert, x, picks)
    per_bound = []
    for (i, c, t), e in zip(picks, eps):
        row = np.zeros((1, 10))
        row[0, c], row[0, t] = 1.0, -1.0
        best = np.inf
        for _ in range(BOUND_REPEATS):
            t0 = time.perf_counter()
            GraphBounds(graph, x[i], e, 0).bounds(row)
            best = min(best, time.perf_counter() - t0)
        per_bound.append(best)
    alpha = _resnet_alpha(graph, x, picks[0], eps[0])
    if alpha is not None:
        i, c, t = picks[0]
        try:
            r = gc_mod.GraphCertifier(graph, norm="inf", method="alpha-crown").certify(
                x[i], c, [t])
            alpha.update(radius=float(r.eps), radius_s=r.time_s,
                         radius_evaluations=r.evaluations)
        except Exception:  # a --before checkout whose graph certifier lacks alpha-crown
            pass
    print(json.dumps({"case": "resnet", "images": len(picks), "mean_s": sum(times) / len(times),
                      "median_s": statistics.median(times), "evaluations": float(np.mean(evals)),
                      "mean_eps": float(np.mean(eps)), "eps": eps, "bound_s": per_bound,
                      "alpha": alpha,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


ALPHA_ITERS = 20  # the resnet case's alpha-CROWN comparison: iterations on both sides
# the resnet case times each margin bound this many times on both sides and keeps the least
# (2 until session 40: one slow pass on a noisy machine moved a ratio by 2x)
BOUND_REPEATS = 5


def _resnet_alpha(graph, x, pick, eps):
    """crown's alpha-CROWN (float64) of the first image's margin at its certified eps: every
    unstable intermediate neuron's and the margin row's slopes optimised ALPHA_ITERS steps
    (the graph engine's step size); None on a checkout without it."""
    import numpy as np

    try:
        GraphBounds = _checkout_module("crown_cli.engine.graph_bounds").GraphBounds
        graph_alpha = _checkout_module("crown_cli.engine.graph_alpha")
        alpha_lower, lr = graph_alpha.alpha_lower, graph_alpha.LR
    except (ImportError, AttributeError):
        return None
    i, c, t = pick
    row = np.zeros((1, 10))
    row[0, c], row[0, t] = 1.0, -1.0
    crown = float(GraphBounds(graph, x[i], eps, 0).lower(graph.output, row)[0])
    # a warm-up of one step: numba compiles the steering passes' kernels at their first call
    # (every call in a --before worktree whose cache is new)
    alpha_lower(GraphBounds(graph, x[i], eps, 0), graph.output, row, 1, lr)
    t0 = time.perf_counter()
    gb = GraphBounds(graph, x[i], eps, 0, intermediate="alpha", alpha_iters=ALPHA_ITERS)
    lb = float(alpha_lower(gb, graph.output, row, ALPHA_ITERS, lr)[0])
    return {"s": time.perf_counter() - t0, "bound": lb, "crown_bound": crown}


def resnet_lirpa_worker(n_images, lirpa, eps_list, alpha_eps=None):
    """The resnet case, auto_LiRPA's side (float64 CROWN) at crown's radii."""
    import numpy as np

    sys.path.insert(0, os.path.abspath(lirpa))
    import torch
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    torch.set_default_dtype(torch.float64)
    model = _resnet().torch_module(_resnet().parameters())
    x, _ = _module("crown_cli.io.images").load_images(CIFAR)
    x = np.ascontiguousarray(x.reshape(-1, 32, 32, 3).transpose(0, 3, 1, 2))
    with torch.no_grad():
        z = model(torch.tensor(x)).numpy()
    picks = _resnet_picks(z, n_images)
    bm = BoundedModule(model, torch.zeros((1, 3, 32, 32)), device="cpu")

    def margin(i, c, t, eps):
        C = torch.zeros((1, 1, 10))
        C[0, 0, c], C[0, 0, t] = 1.0, -1.0
        xt = BoundedTensor(torch.tensor(x[i:i + 1]),
                           PerturbationLpNorm(norm=np.inf, eps=float(eps)))
        t0 = time.perf_counter()
        lb, _ = bm.compute_bounds(x=(xt,), C=C, method="CROWN", bound_upper=False)
        return float(lb.item()), time.perf_counter() - t0

    margin(*picks[0], eps_list[0])  # warm-up
    per_bound, agree = [], []
    for (i, c, t), eps in zip(picks, eps_list):
        per_bound.append(min(margin(i, c, t, eps)[1] for _ in range(BOUND_REPEATS)))
        agree.append(margin(i, c, t, eps * (1 - 1e-3))[0] > 0 > margin(i, c, t, eps * (1 + 1e-3))[0])
    i, c, t = picks[0]  # alpha-CROWN at the first image's eps, ALPHA_ITERS iterations
    C = torch.zeros((1, 1, 10))
    C[0, 0, c], C[0, 0, t] = 1.0, -1.0
    xt = BoundedTensor(torch.tensor(x[i:i + 1]), PerturbationLpNorm(norm=np.inf, eps=eps_list[0]))
    bm.set_bound_opts({"optimize_bound_args": {"iteration": ALPHA_ITERS}})
    t0 = time.perf_counter()
    lb, _ = bm.compute_bounds(x=(xt,), C=C, method="CROWN-Optimized", bound_upper=False)
    alpha = {"s": time.perf_counter() - t0, "bound": float(lb.item())}
    if alpha_eps is not None:  # its bound on each side of crown's alpha-crown radius
        near = []
        for e in (alpha_eps * (1 - 1e-3), alpha_eps * (1 + 1e-3)):
            xt = BoundedTensor(torch.tensor(x[i:i + 1]), PerturbationLpNorm(norm=np.inf, eps=e))
            near.append(float(bm.compute_bounds(x=(xt,), C=C, method="CROWN-Optimized",
                                                bound_upper=False)[0].item()))
        alpha.update(near=near, agree=near[0] > 0 > near[1])
    print(json.dumps({"case": "resnet-lirpa", "bound_s": per_bound, "agree": agree,
                      "alpha": alpha,
                      "threads": torch.get_num_threads(),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


HULL_ROWS = (2, 11, 67, 106, 109, 127, 131, 169, 249)  # safenlp's 9 former timeouts


def hull_worker(vnncomp):
    """The hull case: hull_split to a verdict on safenlp's 9 hardest instances."""
    import csv

    try:
        hs = _checkout_module("crown_cli.verification.bab.hull_split")
    except ImportError:
        print(json.dumps({"case": "hull", "error": "no before: this checkout has no convex-hull "
                                                   "input splitting"}))
        return
    load_network = _module("crown_cli.io.networks").load_network  # safenlp's MLP
    parse_vnnlib = _module("crown_cli.io.vnnlib").parse_vnnlib
    folder = os.path.join(os.path.dirname(vnncomp), "vnncomp2024", "safenlp_medical")
    listing = os.path.join(folder, "instances.csv")
    if not os.path.isfile(listing):
        print(json.dumps({"case": "hull", "error": f"{listing}: not found (--vnncomp)"}))
        return
    rows = list(csv.reader(open(listing)))
    res = {"case": "hull", "instances": [], "time_s": 0.0}
    nets = {}  # the list's instances share one network file: loaded once
    for k, r in enumerate(HULL_ROWS):
        if rows[r][0] not in nets:
            nets[rows[r][0]] = load_network(os.path.join(folder, rows[r][0]))
        net = nets[rows[r][0]]
        prop = parse_vnnlib(os.path.join(folder, rows[r][1]), net.input_size, net.num_classes)
        c = prop.cases[0]
        if k == 0:  # warm-up: the numba kernel's load
            hs.hull_split(net.weights, net.biases, c.lo, c.hi, c.A, c.b, time.monotonic() + 20)
        t = time.perf_counter()
        out = hs.hull_split(net.weights, net.biases, c.lo, c.hi, c.A, c.b,
                            time.monotonic() + 20.0)
        dt = time.perf_counter() - t
        res["instances"].append([os.path.basename(rows[r][1])[:-7], out.verdict, out.domains, dt])
        res["time_s"] += dt
    res["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(res))


def graph_dense_worker(n_images):
    """The graph-dense case: the graph engine against the dense engine on relu3's model."""
    import numpy as np

    try:
        dense_graph = _checkout_module("crown_cli.graph.network").dense_graph
        GraphBounds = _checkout_module("crown_cli.engine.graph_bounds").GraphBounds
    except (ImportError, AttributeError):
        print(json.dumps({"case": "graph-dense", "error": "no before: this checkout has no "
                                                          "graph form of a dense network"}))
        return
    Certifier = _module("crown_cli.certification.certifier").Certifier
    load_model = _module("crown_cli.io.models").load_model
    load_images = _module("crown_cli.io.images").load_images
    mlp = load_model(os.path.join(MODELS, "mnist_3x1024.h5"))
    graph = dense_graph(mlp)
    x, y = load_images(None)
    cert = Certifier(mlp.weights, mlp.biases, mlp.activation, norm="inf", method="crown",
                     precision="float64")
    dense_s, graph_s, diff = [], [], 0.0
    for i in range(n_images):
        z = mlp.forward(x[i])
        c, t = int(np.argmax(z)), int(np.argsort(z)[-2])
        C = np.zeros((1, z.size))
        C[0, c], C[0, t] = 1.0, -1.0
        for eps in (0.005, 0.01):
            best = [np.inf, np.inf]
            for _ in range(3):
                t0 = time.perf_counter()
                a = cert.lower_bound(x[i], eps, C)
                best[0] = min(best[0], time.perf_counter() - t0)
                t0 = time.perf_counter()
                b = GraphBounds(graph, x[i], eps, 0, ibp=False).lower(graph.output, C)
                best[1] = min(best[1], time.perf_counter() - t0)
            dense_s.append(best[0])
            graph_s.append(best[1])
            diff = max(diff, float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
    print(json.dumps({"case": "graph-dense", "images": n_images,
                      "dense_ms": 1e3 * float(np.mean(dense_s)),
                      "graph_ms": 1e3 * float(np.mean(graph_s)), "max_diff": diff,
                      "mean_s": float(np.mean(graph_s)),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


def worker(case, n_images, check, seconds=30.0, vnncomp=None):
    """Run one case in this process and print one JSON line."""
    import numpy as np

    if case == "graph-dense":
        return graph_dense_worker(n_images)
    if case == "conv":
        return conv_worker(n_images)
    if case == "resnet":
        return resnet_worker(n_images)
    if case == "resnet-lirpa":
        return resnet_lirpa_worker(n_images, vnncomp, json.loads(os.environ["BENCH_EPS"]),
                                   json.loads(os.environ.get("BENCH_ALPHA_EPS", "null")))
    if case == "bab":
        return bab_worker(n_images)
    if case == "hull":
        return hull_worker(vnncomp)
    if case in ("bab-relu", "bab-relu-joint"):
        return bab_relu_worker(seconds, vnncomp, joint=case == "bab-relu-joint")

    crown = _module("crown_cli.crown", "crown_cli.engine.backsub", "crown_cli.engine.dense_crown")
    Certifier = _module("crown_cli.certify", "crown_cli.certification.certifier").Certifier
    load_images = _module("crown_cli.images", "crown_cli.io.images").load_images
    load_model = _module("crown_cli.model_io", "crown_cli.io.models").load_model

    norm = "inf"
    if case in ("relu3", "relu4", "tanh", "sigmoid", "arctan", "relu3-plain", "alpha3"):
        name = {"relu3": "mnist_3x1024", "relu4": "mnist_4x1024", "alpha3": "mnist_3x1024",
                "relu3-plain": "mnist_3x1024"}.get(case, f"mnist_3x1024_{case}")
        mlp = load_model(os.path.join(MODELS, name + ".h5"))
        weights, biases, act = mlp.weights, mlp.biases, mlp.activation
        x, y = load_images(None)
        use_label = True
    else:
        sizes = [3072] + [1024] * 6 + [10] if case == "cifar7" else [3072] + [2048] * 5 + [10]
        weights, biases = random_mlp(sizes, 0)
        act = "relu"
        x, y = load_images(CIFAR)
        use_label = False  # random weights: certify whatever class the network predicts
        if case == "mem6":
            norm = "2"
    method = "alpha-crown" if case == "alpha3" else "crown"
    try:
        cert = Certifier(weights, biases, act, norm=norm, method=method)
    except Exception:  # a checkout without the method (--before)
        print(json.dumps({"case": case, "error": f"no --method {method} in this checkout"}))
        return
    if case == "relu3-plain":
        cert.interval_free = None  # no stable neuron is ever taken over: every row recomputed
    z = cert.logits(x)
    order = np.argsort(z, axis=1)
    picks = [i for i in range(x.shape[0]) if not use_label or order[i, -1] == y[i]][:n_images]
    res = {"case": case, "images": len(picks)}
    c0, t0 = int(order[picks[0], -1]), int(order[picks[0], -2])
    cert.certify(x[picks[0]], c0, [t0])  # warm-up: numba cache load, float32 weight copies
    flops_counter = getattr(crown, "GemmCount", None)
    f0 = flops_counter.flops if flops_counter else 0
    times, evals, eps = [], [], []
    for i in picks:
        r = cert.certify(x[i], int(order[i, -1]), [int(order[i, -2])])
        times.append(r.time_s)
        evals.append(r.evaluations)
        eps.append(r.eps)
    total = sum(times)
    if case == "alpha3":
        base = Certifier(weights, biases, act, norm=norm)
        gains = [e / base.certify(x[i], int(order[i, -1]), [int(order[i, -2])]).eps - 1.0
                 for i, e in zip(picks, eps)]
        res.update(mean_gain=float(np.mean(gains)), min_gain=float(np.min(gains)),
                   max_gain=float(np.max(gains)))
    res.update(mean_s=total / len(times), median_s=statistics.median(times),
               evaluations=float(np.mean(evals)), mean_eps=float(np.mean(eps)),
               gflops=(flops_counter.flops - f0) / total / 1e9 if flops_counter else None,
               peak_f32=gemm_peak(np.float32), peak_f64=gemm_peak(np.float64),
               rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    if check:
        ref = Certifier(weights, biases, act, norm=norm, search="bisect", rtol=1e-5,
                        precision="float64")
        rel = []
        for i, e in zip(picks, eps):
            r = ref.certify(x[i], int(order[i, -1]), [int(order[i, -2])])
            rel.append((e - r.eps) / r.eps if r.eps > 0 else e)
        res["max_rel_diff"] = max(abs(d) for d in rel)
        # the reference is within 1e-5 below the plain method's limit: more than that above
        # it would be a radius the plain method cannot certify
        res["max_above"] = max(rel)
    print(json.dumps(res))


def warm_cli(pkg):
    cmd = [sys.executable, "-m", "crown_cli", "certify", "--model",
           os.path.join(MODELS, "mnist_3x1024.h5"), "-n", "1", "-q"]
    env = dict(os.environ, PYTHONPATH=pkg)
    # cwd=pkg: `python -m` puts the working directory before PYTHONPATH on sys.path, so run
    # from elsewhere (e.g. the repository root with --before) it would time that checkout
    subprocess.run(cmd, env=env, cwd=pkg, capture_output=True, check=True)  # warm the numba cache
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=pkg, capture_output=True, check=True)
        runs.append(time.perf_counter() - t)
    return {"case": "cli", "best_s": min(runs), "median_s": statistics.median(runs)}


def run_case(case, pkg, args, check=False, eps=None):
    if case == "cli":
        return warm_cli(pkg)
    if case == "resnet" and args.lirpa:
        ours = run_case("resnet-crown", pkg, args)
        if "error" in ours:
            return ours
        lirpa = run_case("resnet-lirpa", pkg, args,
                         eps=(ours["eps"], (ours.get("alpha") or {}).get("radius")))
        ours["lirpa"] = lirpa
        return ours
    case = "resnet" if case == "resnet-crown" else case
    n = {"cifar7": args.cifar_images, "mem6": 2, "bab": args.bab_boxes,
         "conv": args.conv_images, "resnet": args.conv_images,
         "resnet-lirpa": args.conv_images}.get(case, args.images)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", case, "--images", str(n),
           "--bab-seconds", str(args.bab_seconds), "--vnncomp", os.path.abspath(args.vnncomp)]
    if check and case not in ("mem6", "alpha3", "bab", "conv", "resnet", "resnet-lirpa"):
        cmd.append("--check")
    env = dict(os.environ, PYTHONPATH=pkg)
    if case == "resnet-lirpa":  # the lirpa worker takes its checkout where others take --vnncomp
        cmd[cmd.index("--vnncomp") + 1] = os.path.abspath(args.lirpa)
        env["BENCH_EPS"], env["BENCH_ALPHA_EPS"] = json.dumps(eps[0]), json.dumps(eps[1])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return {"case": case, "error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(r, relu3=None, plain=None):
    if "error" in r:
        label = "" if r["error"].startswith("no before") else "error: "
        return f"{r['case']:<11} {label}{r['error']}"
    if r["case"] == "bab":
        return (f"{'bab':<11} boxes {r['boxes']}  all rows {r['full']:.0f} boxes/s "
                f"({r['full_cpu']:.0f} per CPU-s)  skip_stable {r['skip']:.0f} boxes/s "
                f"({r['skip_cpu']:.0f} per CPU-s)  peak RSS {r['rss_mb']:.0f} MB")
    if r["case"] == "bab-relu":
        return (f"{'bab-relu':<11} mnist-net_256x4 prop_3_0.03: {r['domains']} domains in "
                f"{r['time_s']:.1f} s: {r['rate']:.0f} domains/s (cases: "
                f"{' '.join(r['verdicts'])})  peak RSS {r['rss_mb']:.0f} MB")
    if r["case"] == "bab-relu-joint":
        return (f"{'bab-relu-joint':<11} mnist-net_256x4 prop_3_0.03, its 9 cases in one search: "
                f"{r['domains']} domains in {r['time_s']:.1f} s: {r['rate']:.0f} domains/s, "
                f"worst open bound {r['worst']:.4g} ({r['verdicts'][0]})  peak RSS "
                f"{r['rss_mb']:.0f} MB")
    if r["case"] == "conv":
        return (f"{'conv':<11} cifar_base_kw.onnx (CIFAR-10 accuracy {100 * r['accuracy']:.0f}% on the "
                f"shipped 100), images {r['images']:3d}  mean {r['mean_s']:.4f} s/image  median "
                f"{r['median_s']:.4f}  evaluations {r['evaluations']:5.2f}  mean eps "
                f"{r['mean_eps']:.6g}  peak RSS {r['rss_mb']:.0f} MB  tracemalloc peak of one "
                f"image {r['traced_mb']:.0f} MiB")
    if r["case"] == "resnet":
        s = (f"{'resnet':<11} scripts/resnet_model.py, images {r['images']:3d}  mean "
             f"{r['mean_s']:.4f} s/image  median {r['median_s']:.4f}  evaluations "
             f"{r['evaluations']:5.2f}  mean eps {r['mean_eps']:.6g}  one CROWN bound "
             f"{sum(r['bound_s']) / len(r['bound_s']):.3f} s  peak RSS {r['rss_mb']:.0f} MB")
        lp = r.get("lirpa")
        if lp is not None and "error" in lp:
            s += f"\n{'':<11} auto_LiRPA: error: {lp['error']}"
        elif lp is not None:
            ratios = [b / a for a, b in zip(r["bound_s"], lp["bound_s"])]
            s += (f"\n{'':<11} auto_LiRPA CROWN (float64, {lp['threads']} threads): "
                  f"{sum(lp['bound_s']) / len(lp['bound_s']):.3f} s per bound, crown "
                  f"{min(ratios):.1f}-{max(ratios):.1f}x faster (per image: "
                  f"{', '.join(f'{q:.1f}' for q in ratios)}); radius within 1e-3 of its "
                  f"bound's on {sum(lp['agree'])} of {len(lp['agree'])} images; peak RSS "
                  f"{lp['rss_mb']:.0f} MB")
        a = r.get("alpha")
        if a is not None:
            s += (f"\n{'':<11} alpha-CROWN ({ALPHA_ITERS} iterations, first image at its eps): "
                  f"{a['s']:.2f} s, margin bound {a['bound']:.5g} (CROWN {a['crown_bound']:.5g})")
            la = (lp or {}).get("alpha")
            if la is not None:
                s += (f"; auto_LiRPA CROWN-Optimized {la['s']:.2f} s, bound {la['bound']:.5g}: "
                      f"crown {la['s'] / a['s']:.1f}x faster")
            if a.get("radius") is not None:
                s += (f"\n{'':<11} alpha-crown radius (first image): {a['radius']:.6g} "
                      f"({a['radius_s']:.1f} s, {a['radius_evaluations']} evaluations)")
                if la is not None and "near" in la:
                    s += (f"; auto_LiRPA's CROWN-Optimized bound at it (1 -/+ 1e-3): "
                          f"{la['near'][0]:.3g} / {la['near'][1]:.3g}, "
                          f"{'agrees' if la['agree'] else 'DISAGREES'}")
        return s
    if r["case"] == "hull":
        each = ", ".join(f"{n} {v} {b} boxes {t:.2f} s" for n, v, b, t in r["instances"])
        return (f"{'hull':<11} safenlp's 9 hardest: {r['time_s']:.2f} s in all ({each})  "
                f"peak RSS {r['rss_mb']:.0f} MB")
    if r["case"] == "graph-dense":
        return (f"{'graph-dense':<11} mnist_3x1024 margin bound, {r['images']} images x eps "
                f"0.005, 0.01: graph engine {r['graph_ms']:.1f} ms, dense engine "
                f"{r['dense_ms']:.1f} ms ({r['graph_ms'] / r['dense_ms']:.1f}x), bounds apart by "
                f"at most {r['max_diff']:.1e}  peak RSS {r['rss_mb']:.0f} MB")
    if r["case"] == "cli":
        return f"{'cli':<11} warm `crown certify -n 1`: best {r['best_s']:.2f} s, median {r['median_s']:.2f} s"
    s = (f"{r['case']:<11} images {r['images']:3d}  mean {r['mean_s']:.4f} s/image  median "
         f"{r['median_s']:.4f}  evaluations {r['evaluations']:5.2f}  mean eps {r['mean_eps']:.6g}  ")
    if r.get("gflops") is not None:
        s += f"{r['gflops']:.0f} GFLOP/s ({100 * r['gflops'] / r['peak_f32']:.0f}% of f32 peak {r['peak_f32']:.0f})  "
    s += f"peak RSS {r['rss_mb']:.0f} MB"
    if r["case"] in TARGETS_S:
        s += f"  target {TARGETS_S[r['case']]} s"
    if relu3 is not None and r["case"] in ("tanh", "sigmoid", "arctan") and "mean_s" in relu3:
        s += f"  {r['mean_s'] / relu3['mean_s']:.2f}x relu3"
    if plain is not None and "mean_s" in plain and r["case"] in ("tanh", "sigmoid", "arctan"):
        s += f"  {r['mean_s'] / plain['mean_s']:.2f}x relu3-plain"
    if "mean_gain" in r:
        s += (f"  eps gain over crown mean {100 * r['mean_gain']:+.2f}% (min "
              f"{100 * r['min_gain']:+.2f}%, max {100 * r['max_gain']:+.2f}%)")
    if "max_rel_diff" in r:
        s += f"  max rel eps diff to plain {r['max_rel_diff']:.1e} (most above it {r['max_above']:+.1e})"
    return s


def unit_time(r):
    """Seconds per unit of work of a case's result (image, box, domain, CLI start)."""
    if r["case"] == "cli":
        return r["best_s"]
    if r["case"] == "bab":
        return 1.0 / r["skip"]
    if r["case"] in ("bab-relu", "bab-relu-joint"):
        return 1.0 / r["rate"]
    if r["case"] == "hull":
        return r["time_s"]
    return r["mean_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--cifar-images", type=int, default=20)
    ap.add_argument("--conv-images", type=int, default=5)
    ap.add_argument("--bab-boxes", type=int, default=4096)
    ap.add_argument("--bab-seconds", type=float, default=30.0)
    ap.add_argument("--vnncomp", default=os.path.join(ROOT, "..", "shared", "data", "vnncomp2021"),
                    help="VNN-COMP 2021 benchmark folder (bab-relu)")
    ap.add_argument("--lirpa", default=None,
                    help="auto_LiRPA checkout: compare the resnet case with its CROWN")
    ap.add_argument("--check", action="store_true", help="compare eps with plain float64 bisection")
    ap.add_argument("--before", default=None, help="checkout whose crown_cli is the 'before'")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.path.insert(0, os.environ.get("PYTHONPATH") or ROOT)
        if args.worker != "resnet-lirpa":  # as the crown command does: crown_cli before numpy
            importlib.import_module("crown_cli")  # its process settings (crown_cli/runtime.py)
        return worker(args.worker, args.images, args.check, args.bab_seconds, args.vnncomp)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    print(f"crown bench: {os.cpu_count()} cores, cases {', '.join(cases)}", flush=True)
    after = {}
    order = sorted(cases, key=lambda c: c not in ("relu3", "relu3-plain"))  # ratios need them first
    for case in order:
        after[case] = run_case(case, ROOT, args, check=args.check)
        print(line(after[case], after.get("relu3"), after.get("relu3-plain")), flush=True)
    if args.before:
        print(f"before: {args.before}", flush=True)
        for case in order:
            b = run_case(case, os.path.abspath(args.before), args)
            print(line(b, None), flush=True)
            a = after[case]
            if "error" not in a and "error" not in b:
                print(f"{'':<11} before/after time ratio {unit_time(b) / unit_time(a):.2f}x",
                      flush=True)


if __name__ == "__main__":
    main()
