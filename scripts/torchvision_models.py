"""torchvision's classification architectures exported to ONNX as users export theirs, and
read by crown: does each load, does crown's forward pass equal PyTorch's, and does one CROWN
bound hold at sampled points of its ball?

Each architecture is built untrained (``torchvision.models.<name>(num_classes=10)``, seeded),
its batch normalisations given statistics away from the identity, put in eval mode and
exported in float32 (``torch.onnx.export``, opset 13, TorchScript exporter) to
``DIR/<name>_<size>.onnx``. For one random input in [0, 1]:

- ``fwd``: the largest difference between crown's logits and PyTorch's (the same module in
  float64), relative to their scale;
- one float64 CROWN bound of the nine margins of the predicted class at ``--eps`` (l_inf),
  its seconds, and ``gap``: the smallest margin of 64 points of the ball (half corners, half
  uniform; crown's own forward pass, the network it bounds) less the bound, which must not be
  negative (``viol`` counts the rows where it is).

    python scripts/torchvision_models.py DIR [names] [--eps 1e-4]

Needs torch and torchvision (not dependencies of crown_cli). Results: docs/testing.md
(Campaigns outside the suite).
"""
import argparse
import os
import sys
import time
import types

import crown_cli  # before numpy, whose OpenBLAS reads crown's setting (crown_cli/runtime.py)
import numpy as np

ARCHS = {  # name: input size (the smallest each takes, or CIFAR's)
    "resnet18": 32, "resnet50": 32, "resnext50_32x4d": 32, "wide_resnet50_2": 32,
    "mobilenet_v2": 32, "mobilenet_v3_small": 32, "mobilenet_v3_large": 32,
    "shufflenet_v2_x0_5": 32, "mnasnet0_5": 32, "squeezenet1_1": 64,
    "efficientnet_b0": 32, "regnet_x_400mf": 32, "regnet_y_400mf": 32, "googlenet": 32,
    "densenet121": 32, "convnext_tiny": 32,
}  # (alexnet, vgg: PyTorch exports their adaptive pooling only from inputs of 224 x 224 up)


def _torchvision():
    """torchvision; where its compiled operators do not match the installed torch (their
    registration fails at import), its models alone, which use none of them."""
    try:
        import torchvision
    except RuntimeError:
        for k in [k for k in sys.modules if k.startswith("torchvision")]:
            del sys.modules[k]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision_ops")
        import torchvision
    return torchvision


def _export(name, size, path, torch, models):
    """The architecture (float64, eval mode) and its float32 ONNX file at ``path``."""
    torch.manual_seed(0)
    kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    m = getattr(models, name)(num_classes=10, **kw)
    gen = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(0.2 * torch.rand(n, generator=gen) - 0.1)
            mod.running_var.copy_(0.5 + torch.rand(n, generator=gen))
            mod.weight.data.copy_(0.5 + torch.rand(n, generator=gen))
            mod.bias.data.copy_(0.2 * torch.rand(n, generator=gen) - 0.1)
    m.eval()
    if not os.path.exists(path):
        torch.onnx.export(m, torch.zeros(1, 3, size, size), path, opset_version=13,
                          dynamo=False)
    return m.double()


def check(name, size, args, torch, models):
    from crown_cli.engine.graph_bounds import GraphBounds

    path = os.path.join(args.dir, f"{name}_{size}.onnx")
    try:
        m = _export(name, size, path, torch, models)
    except Exception as exc:  # noqa: BLE001 - PyTorch's exporter, not crown
        return f"not exported by PyTorch ({type(exc).__name__}: {str(exc).splitlines()[0][:150]})"
    try:
        g = crown_cli.load_model(path)
    except crown_cli.InputError as exc:
        return f"refused: {str(exc)[:200]}"
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (1, 3 * size * size))
    with torch.no_grad():
        want = m(torch.tensor(x.reshape(1, 3, size, size))).numpy()
    z = g.forward(x)
    scale = max(1.0, float(np.abs(want).max()))
    fwd = float(np.abs(z - want).max()) / scale
    c = int(np.argmax(z[0]))
    C = np.eye(10)[[c] * 9] - np.eye(10)[[t for t in range(10) if t != c]]
    t0 = time.perf_counter()
    low = GraphBounds(g, x[0], args.eps, 0).bounds(C)[0]
    t = time.perf_counter() - t0
    pts = x + args.eps * rng.choice([-1.0, 1.0], (64, x.shape[1]))
    pts[32:] = x + args.eps * rng.uniform(-1, 1, (32, x.shape[1]))
    margins = np.vstack([g.forward(pts[k:k + 8]) for k in range(0, 64, 8)]) @ C.T
    gap = margins.min(axis=0) - low
    return (f"{len(g.nodes):4d} nodes, fwd {fwd:.1e}; CROWN bound {t:7.1f} s, "
            f"min {low.min():+.3e}, gap {gap.min():.1e}, viol {int((gap < 0).sum())}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("names", nargs="*", help="architectures (default: all)")
    ap.add_argument("--eps", type=float, default=1e-4)
    args = ap.parse_args(argv)
    import torch

    models = _torchvision().models
    os.makedirs(args.dir, exist_ok=True)
    for name in args.names or ARCHS:
        print(f"{name:20s} {check(name, ARCHS[name], args, torch, models)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
