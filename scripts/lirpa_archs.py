"""CROWN on PyTorch architectures the project does not ship, against auto_LiRPA.

Each architecture is a small PyTorch module with seeded random weights (BatchNorm with
random running statistics, in eval mode), exported to ONNX (float32, as users export
theirs) and read by ``crown_cli.load_model``; auto_LiRPA bounds the same module with the same
weights in float64. For one random input in [0, 1] and the nine margin rows of its predicted
class, at each radius (l_inf):

- ``rel``: the largest relative difference of the two CROWN lower bounds, and how many of
  crown's are tighter / looser by more than 1e-9 relative (crown charges float64 rounding;
  auto_LiRPA does not);
- ``sampled``: rows whose crown bound lies above the smallest margin of 500 points of the
  ball (half of them corners): must be 0;
- seconds per bound, best of ``--repeat`` (crown: ``GraphBounds(...).bounds(C)`` from the
  input set; auto_LiRPA: ``compute_bounds(method="CROWN")``), and their ratio.

With ``--nodes`` also every ReLU input's bounds at the larger radius on both sides, and the
sampled values each leaves out (``--conv-mode`` sets auto_LiRPA's mode for every network).
With ``--alpha`` also alpha-CROWN at the larger radius, 20 iterations on both sides (crown:
``GraphBounds(intermediate="alpha")`` and ``alpha_lower``; auto_LiRPA: ``CROWN-Optimized``):
the smallest bound of each, the rows where each is tighter, and their times (vgg skipped:
auto_LiRPA's optimised max pool asks for ``conv_mode="matrix"``, and in float64 that mode
fails at the commit measured; mobile skipped: auto_LiRPA's alpha-CROWN fails on it in
patches mode and in matrix mode grew past 17 GB in 11 minutes).

    python scripts/lirpa_archs.py --lirpa DIR [--archs resbn,vgg,...] [--repeat 3] [--alpha]

Needs torch and an auto_LiRPA checkout (``--lirpa``). The numbers go in docs/benchmarks.md
with the commit that produced them.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np


def _modules(nn, torch):
    """{name: (module class, input shape, radii)}."""
    F = nn.functional

    def bn(c, g):
        b = nn.BatchNorm2d(c)
        with torch.no_grad():
            b.running_mean.uniform_(-0.2, 0.2, generator=g)
            b.running_var.uniform_(0.5, 2.0, generator=g)
            b.weight.uniform_(0.5, 1.5, generator=g)
            b.bias.uniform_(-0.2, 0.2, generator=g)
        return b

    class Block(nn.Module):  # a basic residual block, a 1x1 shortcut where the shape changes
        def __init__(self, cin, cout, stride, g):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), bn(cout, g)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), bn(cout, g)
            self.sc = None if cin == cout and stride == 1 else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), bn(cout, g))

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (x if self.sc is None else self.sc(x)))

    class ResBN(nn.Module):  # CIFAR ResNet: stem, two blocks, global average pool
        def __init__(self, g, widths=(8, 16)):
            super().__init__()
            self.c, self.b = nn.Conv2d(3, widths[0], 3, 1, 1), bn(widths[0], g)
            blocks, cin = [], widths[0]
            for k, w in enumerate(widths):
                blocks.append(Block(cin, w, 1 if k == 0 else 2, g))
                cin = w
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, 10)

        def forward(self, x):
            x = self.blocks(torch.relu(self.b(self.c(x))))
            return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

    class ResBig(ResBN):  # three stages of 16, 32, 64 channels
        def __init__(self, g):
            super().__init__(g, (16, 32, 64))

    class VGG(nn.Module):  # two max pools, dropout (eval: the identity)
        def __init__(self, g):
            super().__init__()
            self.f = nn.Sequential(
                nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, 1, 1), nn.ReLU(),
                nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(), nn.Linear(16 * 8 * 8, 64), nn.ReLU(), nn.Dropout(0.5),
                nn.Linear(64, 10))

        def forward(self, x):
            return self.f(x)

    class Inception(nn.Module):  # 1x1, 3x3 and average-pool branches, concatenated
        def __init__(self, g):
            super().__init__()
            self.c = nn.Conv2d(3, 8, 3, 2, 1)
            self.b1, self.b3 = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, 1, 1)
            self.ap = nn.AvgPool2d(3, 1, 1)
            self.d, self.fc = nn.Conv2d(24, 16, 3, 2, 1), nn.Linear(16 * 8 * 8, 10)

        def forward(self, x):
            x = torch.relu(self.c(x))
            x = torch.relu(torch.cat([self.b1(x), self.b3(x), self.ap(x)], 1))
            return self.fc(torch.relu(self.d(x)).flatten(1))

    class Smooth(nn.Module):  # MNIST-shaped, tanh and sigmoid convolutions
        def __init__(self, g):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(1, 8, 4, 2, 1), nn.Conv2d(8, 16, 4, 2, 1)
            self.fc1, self.fc2 = nn.Linear(16 * 7 * 7, 100), nn.Linear(100, 10)

        def forward(self, x):
            x = torch.sigmoid(self.c2(torch.tanh(self.c1(x))))
            return self.fc2(torch.tanh(self.fc1(x.flatten(1))))

    class Leaky(nn.Module):  # leaky ReLU, a convolution without bias, global average pool
        def __init__(self, g):
            super().__init__()
            self.c1 = nn.Conv2d(3, 16, 3, 2, 1, bias=False)
            self.c2, self.fc = nn.Conv2d(16, 32, 3, 2, 1), nn.Linear(32, 10)

        def forward(self, x):
            x = F.leaky_relu(self.c2(F.leaky_relu(self.c1(x), 0.1)), 0.1)
            return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

    class Inverted(nn.Module):  # MobileNetV2's block: 1x1 expansion, depthwise 3x3, 1x1 projection
        def __init__(self, cin, cout, stride, g, expand=3):
            super().__init__()
            h = cin * expand
            self.e, self.be = nn.Conv2d(cin, h, 1, bias=False), bn(h, g)
            self.d, self.bd = nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), bn(h, g)
            self.p, self.bp = nn.Conv2d(h, cout, 1, bias=False), bn(cout, g)
            self.skip = cin == cout and stride == 1

        def forward(self, x):
            y = torch.relu(self.bd(self.d(torch.relu(self.be(self.e(x))))))
            y = self.bp(self.p(y))
            return x + y if self.skip else y

    class Mobile(nn.Module):  # stem, four inverted residual blocks, global average pool
        def __init__(self, g):
            super().__init__()
            self.c, self.b = nn.Conv2d(3, 8, 3, 2, 1, bias=False), bn(8, g)
            self.blocks = nn.Sequential(Inverted(8, 8, 1, g), Inverted(8, 16, 2, g),
                                        Inverted(16, 16, 1, g), Inverted(16, 24, 2, g))
            self.fc = nn.Linear(24, 10)

        def forward(self, x):
            x = self.blocks(torch.relu(self.b(self.c(x))))
            return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

    cifar = (3, 32, 32)
    return {"resbn": (ResBN, cifar, (0.001, 0.004)), "resbig": (ResBig, cifar, (0.0005,)),
            "vgg": (VGG, cifar, (0.001, 0.004)), "inception": (Inception, cifar, (0.001, 0.004)),
            "smooth": (Smooth, (1, 28, 28), (0.001, 0.004)), "leaky": (Leaky, cifar, (0.001, 0.004)),
            "mobile": (Mobile, cifar, (0.001, 0.004))}


MATRIX_MODE = ("mobile",)  # auto_LiRPA's conv_mode for these: "matrix"


def _best(f, repeat):
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return out, best


def _nodes(graph, bm, torch, x, eps, pts, xt, Ct):
    """Per ReLU node: crown's bounds of its input against auto_LiRPA's (the BoundRelu's
    input's ``lower`` / ``upper`` after a CROWN bound of the margins; nodes matched by their
    values at the centre), and how many values of the sampled points ``pts`` each side's
    bounds leave out."""
    from crown_cli.engine.graph_bounds import GraphBounds

    relus = [n for n in bm.nodes() if type(n).__name__ == "BoundRelu"]
    with torch.no_grad():
        bm(torch.tensor(x))
    centre = {n.name: n.inputs[0].forward_value.detach().numpy().reshape(-1).copy()
              for n in relus}
    bm.compute_bounds(x=(xt,), C=Ct, method="CROWN", bound_upper=False)
    gb = GraphBounds(graph, x.reshape(-1), eps, 0)
    gb.bounds()
    _, at_centre = graph.forward(x.reshape(1, -1), return_all=True)
    _, sampled = graph.forward(pts, return_all=True)
    for i, node in enumerate(graph.nodes):
        if node.kind != "activation" or node.op.name != "relu":
            continue
        p = node.inputs[0]
        v0 = np.asarray(at_centre[p]).reshape(-1)
        match = [n for n in relus if centre[n.name].size == v0.size
                 and np.max(np.abs(centre[n.name] - v0)) < 1e-5]
        if len(match) != 1:
            continue
        lo = match[0].inputs[0].lower.detach().numpy().reshape(-1)
        hi = match[0].inputs[0].upper.detach().numpy().reshape(-1)
        v = np.asarray(sampled[p]).reshape(len(pts), -1)
        tol = 1e-6 * max(1.0, float(np.abs(v).max()))  # the two forward passes' difference
        out_ours = int(np.sum((v < gb.lo[p] - tol) | (v > gb.hi[p] + tol)))
        out_theirs = int(np.sum((v < lo - tol) | (v > hi + tol)))
        print(f"    node {p} {tuple(node.shape)}: largest difference "
              f"{max(np.abs(lo - gb.lo[p]).max(), np.abs(hi - gb.hi[p]).max()):.1e}; "
              f"sampled values outside crown's {out_ours}, auto_LiRPA's {out_theirs} "
              f"of {v.size}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lirpa", required=True, help="an auto_LiRPA checkout")
    ap.add_argument("--archs", default="resbn,resbig,vgg,inception,smooth,leaky,mobile")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--alpha", action="store_true")
    ap.add_argument("--conv-mode", choices=("patches", "matrix"), default=None,
                    help="auto_LiRPA's conv_mode for every network (default: matrix for "
                         "MATRIX_MODE, else patches)")
    ap.add_argument("--nodes", action="store_true",
                    help="also each ReLU input's bounds on both sides at the larger radius: "
                         "the largest difference, and the sampled values outside each")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.lirpa))
    import torch
    import torch.nn as nn
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    import crown_cli
    from crown_cli.engine.graph_alpha import alpha_lower
    from crown_cli.engine.graph_bounds import GraphBounds

    archs = _modules(nn, torch)
    tmp = tempfile.mkdtemp()
    print(f"crown lirpa_archs: torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.archs.split(","):
        cls, shape, radii = archs[name]
        k = list(archs).index(name)  # each architecture's seeds, whatever the list
        torch.set_default_dtype(torch.float32)
        g = torch.Generator().manual_seed(100 + k)
        torch.manual_seed(100 + k)
        model = cls(g).eval()
        path = os.path.join(tmp, f"{name}.onnx")
        torch.onnx.export(model, torch.zeros((1,) + shape), path, opset_version=13,
                          dynamo=False)
        graph = crown_cli.load_model(path)
        model = model.double()
        torch.set_default_dtype(torch.float64)
        rng = np.random.default_rng(k)
        x = rng.uniform(0, 1, (1,) + shape)
        with torch.no_grad():
            z = model(torch.tensor(x)).numpy()[0]
        c = int(np.argmax(z))
        C = np.eye(10)[[c] * 9] - np.eye(10)[[t for t in range(10) if t != c]]
        # grouped convolutions in auto_LiRPA's default "patches" mode gave bounds that the
        # network's own value at the centre breaks (a050a3d; docs/benchmarks.md): "matrix"
        mode = args.conv_mode or ("matrix" if name in MATRIX_MODE else "patches")
        bm = BoundedModule(model, torch.zeros((1,) + shape), device="cpu",
                           bound_opts={"conv_mode": mode})
        bm.eval()
        model.eval()  # (BoundedModule leaves the module it traced in training mode)
        fwd = float(np.max(np.abs(graph.forward(x.reshape(1, -1))[0] - z)))
        print(f"{name:<10} {graph.input_size} inputs, {len(graph.nodes)} nodes; forward "
              f"difference {fwd:.1e}; auto_LiRPA conv_mode {mode}")
        Ct = torch.tensor(C[None])
        for eps in radii:
            ours, t_ours = _best(lambda: GraphBounds(graph, x.reshape(-1), eps, 0).bounds(C)[0],
                                 args.repeat)
            xt = BoundedTensor(torch.tensor(x), PerturbationLpNorm(norm=np.inf, eps=eps))
            theirs, t_theirs = _best(lambda: bm.compute_bounds(
                x=(xt,), C=Ct, method="CROWN", bound_upper=False)[0].detach().numpy()[0],
                args.repeat)
            pts = x.reshape(1, -1) + rng.uniform(-eps, eps, (500, x.size))
            pts[:250] = x.reshape(1, -1) + eps * np.sign(pts[:250] - x.reshape(1, -1))
            with torch.no_grad():
                margins = (model(torch.tensor(pts.reshape((-1,) + shape))).numpy() @ C.T).min(0)
            rel = np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-12)
            tol = 1e-9 * np.maximum(np.abs(theirs), 1.0)
            print(f"  eps {eps:g}: min bound {ours.min():+.6f} (auto_LiRPA {theirs.min():+.6f}), "
                  f"rel {rel.max():.1e}, tighter {int(np.sum(ours > theirs + tol))} looser "
                  f"{int(np.sum(ours < theirs - tol))}, sampled {int(np.sum(ours > margins))}; "
                  f"{t_ours:.3f} s against {t_theirs:.3f} s ({t_theirs / t_ours:.2f}x)")
            if args.nodes and eps == radii[-1]:
                _nodes(graph, bm, torch, x, eps, pts, xt, Ct)
        if args.alpha and name not in ("vgg", "mobile"):
            eps = radii[-1]
            t0 = time.perf_counter()
            gb = GraphBounds(graph, x.reshape(-1), eps, 0, intermediate="alpha", alpha_iters=20)
            ours = alpha_lower(gb, graph.output, C, 20)
            t_ours = time.perf_counter() - t0
            bm.set_bound_opts({"optimize_bound_args": {"iteration": 20}})
            xt = BoundedTensor(torch.tensor(x), PerturbationLpNorm(norm=np.inf, eps=eps))
            t0 = time.perf_counter()
            theirs = bm.compute_bounds(x=(xt,), C=Ct, method="CROWN-Optimized",
                                       bound_upper=False)[0].detach().numpy()[0]
            t_theirs = time.perf_counter() - t0
            print(f"  alpha-CROWN eps {eps:g}: min bound {ours.min():+.6f} (auto_LiRPA "
                  f"{theirs.min():+.6f}), rows tighter {int(np.sum(ours > theirs + 1e-9))} "
                  f"looser {int(np.sum(ours < theirs - 1e-9))}; {t_ours:.2f} s against "
                  f"{t_theirs:.2f} s")


if __name__ == "__main__":
    main()
