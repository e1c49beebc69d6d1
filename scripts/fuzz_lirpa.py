"""Random convolutional and residual PyTorch networks, exported to ONNX as users export theirs,
bounded by crown and by auto_LiRPA (float64, CROWN on both sides).

Each network is drawn from a seed: a stem of 1-3 input channels and 5-12 pixels a side, then
2-5 blocks among convolutions (kernel 1-5, stride 1-3, padding 0-2, dilation 1-2, grouped or
depthwise, with or without bias), batch norm with random statistics, activations (ReLU, leaky
ReLU, tanh, sigmoid), average and max pools, transposed convolutions, residual blocks,
channel concatenations and flattening reshapes, and a dense head. For one random input and
the margin rows of its predicted class, at two l_inf radii:

- ``viol``: rows where crown's lower bound lies above the smallest margin of points of the
  ball (random points, corners and the end of a short PGD in torch): must be 0;
- ``looser``: rows where crown's CROWN bound is below auto_LiRPA's by more than 1e-5
  relative, and so is crown's bound without its intersection with interval bounds (the
  intersection moves CROWN's adaptive lower slopes, which can lower a row as well as raise
  it); flagged ``LOOSER`` on a network of ReLUs, convolutions, average pools and sums,
  where the two relax alike: should not happen; rows where auto_LiRPA's bound lies above a sampled margin are reported
  as ``auto_LiRPA unsound`` instead (at the commit measured: a dilated convolution followed
  by batch norm);
- ``crash``: crown fails to load or bound a network auto_LiRPA bounds, or the two forward
  passes differ by more than 1e-5.

And ``crown_cli.certify`` (crown, mixed precision) on the same input: its radius must not be
contradicted by PGD at that radius. One line per network; a summary; exit 1 on any
violation or crash.

With ``--proofs``, networks of ReLUs and the layers ``crown check`` reads (residual blocks,
batch norm, concatenations among them); where it reads the exported file: ``crown certify --proof`` (method crown, l_inf or
l_2, runner-up and untargeted), every certificate written must be accepted, and the first
moved to 4 times its radius, where the attack finds a margin below 0, must be rejected.

    python scripts/fuzz_lirpa.py --lirpa DIR [--nets 50] [--seed 0] [--big] [--exotic]
        [--dense] [--dynamo] [--proofs]

Needs torch and an auto_LiRPA checkout (``--lirpa``).
"""
import argparse
import os
import sys
import tempfile
import traceback
import warnings

import numpy as np

# relaxed differently by the two: tanh and sigmoid's tangent lines; leaky ReLU's lower slope
# (crown takes 1 where u >= -l, the smaller area; auto_LiRPA where its chord's slope > 0.5)
APPROX = ("tanh", "sigmoid", "leaky")


EXOTIC = ("pad", "up", "conv_mode", "same", "act2", "gap", "pool_pad", "avg_excl", "res_proj",
          "ln")


def _build(seed, nn, torch, exotic=False, big=False, dense=False, relu=False):
    """(module, input shape, description, approx) of network ``seed``; approx: it has a node
    crown and auto_LiRPA relax differently (APPROX, max pool). ``exotic``: also the layers
    of :data:`EXOTIC` (paddings, upsampling, padding modes, "same" convolutions, other
    activations, global average pooling, padded and ceil-mode pools, projected residuals,
    layer normalisation).
    ``big``: 16-32 pixels a side, up to 16 channels and 16,000 values a layer, where the
    engine's paths for wide nodes (one side per neuron first, tiles, fused kernels) run.
    ``dense``: two hidden dense layers of 256-512 outputs after the convolutions, where a
    dense node's bounds start from its weight's rows and both sides of its neurons are
    pairs (``graph_rows.WeightRows``). ``relu``: ReLU activations and the layers ``crown
    check`` reads (convolutions, batch norm, pools, residual blocks with identity and
    projected shortcuts, channel concatenations): the networks of ``--proofs``."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    C, H = int(rng.integers(1, 4)), int(rng.integers(16, 33) if big else rng.integers(5, 13))
    wide, cap, side = (17, 16000, 40) if big else (9, 1500, 16)
    shape, desc, approx = (C, H, H), [f"in{C}x{H}"], False

    def bn(c):
        b = nn.BatchNorm2d(c)
        with torch.no_grad():
            b.running_mean.uniform_(-0.3, 0.3, generator=g)
            b.running_var.uniform_(0.3, 2.0, generator=g)
            b.weight.uniform_(-1.5, 1.5, generator=g)
            b.bias.uniform_(-0.3, 0.3, generator=g)
        return b

    def act():
        nonlocal approx
        name = "relu" if relu else str(rng.choice(["relu", "relu", "leaky", "tanh", "sigmoid"]))
        approx |= name in APPROX
        return name, {"relu": nn.ReLU(), "leaky": nn.LeakyReLU(float(rng.choice([0.01, 0.2]))),
                      "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid()}[name]

    def out_size(h, k, s, p, d=1):
        return (h + 2 * p - d * (k - 1) - 1) // s + 1

    class Res(nn.Module):
        def __init__(self, c, a):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(c, c, 3, 1, 1), nn.Conv2d(c, c, 3, 1, 1, bias=False)
            self.b, self.a = bn(c), a

        def forward(self, x):
            return x + self.b(self.c2(self.a(self.c1(x))))

    class Cat(nn.Module):
        def __init__(self, c, c1, c2):
            super().__init__()
            self.p, self.q = nn.Conv2d(c, c1, 1), nn.Conv2d(c, c2, 3, 1, 1)

        def forward(self, x):
            return torch.cat([self.p(x), self.q(x)], 1)

    class ResProj(nn.Module):  # a strided residual block with a 1x1 projection shortcut
        def __init__(self, c, cout):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(c, cout, 3, 2, 1), nn.Conv2d(cout, cout, 3, 1, 1)
            self.sc = nn.Conv2d(c, cout, 1, 2, bias=False)

        def forward(self, x):
            return torch.relu(self.c2(torch.relu(self.c1(x))) + self.sc(x))

    kinds = ["conv", "conv", "bn", "act", "avgpool", "maxpool", "convT", "res", "cat"]
    layers = []
    for _ in range(int(rng.integers(2, 6))):
        c, h = shape[0], shape[1]
        kind = str(rng.choice(kinds + list(EXOTIC) if exotic else
                              ["conv", "bn", "act", "avgpool", "maxpool", "res", "res_proj",
                               "cat"] if relu
                              else kinds))
        if kind in EXOTIC:
            got = _exotic(kind, rng, nn, c, h, side)
            if got is None:
                continue
            layer, shape, text, rough = got
            layers.append(layer if kind != "res_proj" else ResProj(c, shape[0]))
            desc.append(text)
            approx |= rough
        elif kind == "conv":
            k, s, p = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(0, 3))
            d = int(rng.choice([1, 1, 2]))
            p = min(p, (k - 1) * d)  # (padding beyond the kernel's reach: pure zeros)
            cout = int(rng.integers(2, wide))
            groups = 1
            if rng.random() < 0.25:
                groups = c if rng.random() < 0.5 else int(np.gcd(c, cout))
                cout = cout if groups != c else c * int(rng.integers(1, 3))
                if cout % groups:
                    groups = 1
            if out_size(h, k, s, p, d) < 1:
                continue
            bias = bool(rng.random() < 0.7)
            layers.append(nn.Conv2d(c, cout, k, s, p, dilation=d, groups=groups, bias=bias))
            shape = (cout, out_size(h, k, s, p, d), out_size(h, k, s, p, d))
            desc.append(f"conv{k}s{s}p{p}d{d}g{groups}{'' if bias else 'nb'}->{cout}")
        elif kind == "bn":
            layers.append(bn(c))
            desc.append("bn")
        elif kind == "act":
            name, a = act()
            layers.append(a)
            desc.append(name)
        elif kind in ("avgpool", "maxpool"):
            k, s = int(rng.integers(2, 4)), int(rng.integers(1, 3))
            p = int(rng.integers(0, 2)) if kind == "avgpool" and k == 3 else 0
            if out_size(h, k, s, p) < 1:
                continue
            layers.append(nn.AvgPool2d(k, s, p) if kind == "avgpool" else nn.MaxPool2d(k, s))
            approx |= kind == "maxpool"
            shape = (c, out_size(h, k, s, p), out_size(h, k, s, p))
            desc.append(f"{kind}{k}s{s}p{p}")
        elif kind == "convT":
            k, s = int(rng.integers(2, 4)), int(rng.integers(1, 3))
            p = int(rng.integers(0, 2))
            cout = int(rng.integers(2, 6))
            ho = (h - 1) * s - 2 * p + k
            if ho < 1 or ho > side:
                continue
            layers.append(nn.ConvTranspose2d(c, cout, k, s, p))
            shape = (cout, ho, ho)
            desc.append(f"convT{k}s{s}p{p}->{cout}")
        elif kind == "res":
            name, a = act()
            layers.append(Res(c, a))
            desc.append(f"res({name})")
        else:
            c1, c2 = int(rng.integers(1, 5)), int(rng.integers(1, 5))
            layers.append(Cat(c, c1, c2))
            shape = (c1 + c2, h, h)
            desc.append(f"cat{c1}+{c2}")
        if shape[0] * shape[1] * shape[2] > cap:
            break
    name, a = act()
    hidden = int(rng.integers(256, 513)) if dense else int(rng.integers(4, 65 if big else 33))
    layers += [a, nn.Flatten(), nn.Linear(int(np.prod(shape)), hidden)]
    if dense:  # a second wide dense layer: its bounds start from its weight's rows
        name3, a3 = act()
        wide2 = int(rng.integers(256, 401))
        layers += [a3, nn.Linear(hidden, wide2)]
        desc += [name, f"fc{hidden}"]
        name, hidden = name3, wide2
    name2, a2 = act()
    layers += [a2, nn.Linear(hidden, 10)]
    desc += [name, f"fc{hidden}", name2, "fc10"]
    model = nn.Sequential(*layers)
    with torch.no_grad():  # weights of a trained network's size, not torch's 1/sqrt(fan_in)
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                m.weight.normal_(0, float(rng.uniform(0.5, 1.5)) / np.sqrt(m.weight[0].numel()),
                                 generator=g)
                if m.bias is not None:
                    m.bias.uniform_(-0.2, 0.2, generator=g)
    return model.eval(), (C, H, H), " ".join(desc), approx


def _exotic(kind, rng, nn, c, h, side=16):
    """One layer of the exotic kinds on a (c, h, h) input: (layer, output shape, text,
    relaxed differently from auto_LiRPA), or None where it does not fit."""
    if kind == "pad":
        pads = tuple(int(v) for v in rng.integers(0, 3, 4))
        mode = str(rng.choice(["zero", "reflect", "replicate"]))
        if mode != "zero":
            pads = tuple(min(v, h - 1) for v in pads)
        layer = {"zero": nn.ZeroPad2d, "reflect": nn.ReflectionPad2d,
                 "replicate": nn.ReplicationPad2d}[mode](pads)
        ho, wo = h + pads[2] + pads[3], h + pads[0] + pads[1]
        if ho != wo:  # (the draw keeps images square)
            return None
        return layer, (c, ho, ho), f"pad{mode[0]}{''.join(map(str, pads))}", False
    if kind == "up":
        if 2 * h > side:
            return None
        mode = str(rng.choice(["nearest", "bilinear"]))
        layer = nn.Upsample(scale_factor=2, mode=mode) if mode == "nearest" else \
            nn.Upsample(scale_factor=2, mode=mode, align_corners=bool(rng.random() < 0.5))
        return layer, (c, 2 * h, 2 * h), f"up{mode[0]}", False
    if kind == "conv_mode":
        mode = str(rng.choice(["reflect", "replicate", "circular"]))
        cout = int(rng.integers(2, 7))
        if h < 2:
            return None
        return nn.Conv2d(c, cout, 3, 1, 1, padding_mode=mode), (cout, h, h), \
            f"conv3{mode[:4]}->{cout}", False
    if kind == "same":
        k, cout = int(rng.integers(2, 6)), int(rng.integers(2, 7))
        return nn.Conv2d(c, cout, k, 1, "same"), (cout, h, h), f"conv{k}same->{cout}", False
    if kind == "act2":
        name = str(rng.choice(["elu", "gelu", "silu", "softplus", "hardtanh", "relu6", "prelu",
                               "hardswish", "mish", "hardsigmoid", "selu", "celu"]))
        layer = {"elu": nn.ELU(), "gelu": nn.GELU(), "silu": nn.SiLU(), "softplus": nn.Softplus(),
                 "hardtanh": nn.Hardtanh(), "relu6": nn.ReLU6(), "prelu": nn.PReLU(c),
                 "hardswish": nn.Hardswish(), "mish": nn.Mish(), "hardsigmoid": nn.Hardsigmoid(),
                 "selu": nn.SELU(), "celu": nn.CELU()}[name]
        return layer, (c, h, h), name, True
    if kind == "gap":
        return nn.AdaptiveAvgPool2d(1), (c, 1, 1), "gap", False
    if kind in ("pool_pad", "avg_excl"):  # 3x3, stride 2, padding 1, maybe ceil mode
        ceil = bool(rng.random() < 0.5)
        ho = -(-(h + 2 - 3) // 2) + 1 if ceil else (h + 2 - 3) // 2 + 1
        if ceil and (ho - 1) * 2 >= h + 1:  # (PyTorch: no window starting in the padding)
            ho -= 1
        if ho < 1:
            return None
        tag = "c" if ceil else ""
        if kind == "pool_pad":
            return nn.MaxPool2d(3, 2, 1, ceil_mode=ceil), (c, ho, ho), f"maxpool3s2p1{tag}", True
        return nn.AvgPool2d(3, 2, 1, ceil_mode=ceil, count_include_pad=False), (c, ho, ho), \
            f"avgpool3s2p1x{tag}", False
    if kind == "ln":  # layer normalisation over the whole (c, h, h) image: means, a square,
        # sqrt and a division by data (products)
        return nn.LayerNorm([c, h, h], eps=float(rng.choice([1e-5, 1e-2]))), (c, h, h), "ln", \
            True
    if kind == "res_proj":
        cout = int(rng.integers(2, 9))
        return None if h < 2 else (None, (cout, (h - 1) // 2 + 1, (h - 1) // 2 + 1),
                                   f"resproj->{cout}", False)
    raise ValueError(kind)


def _attack(model, torch, x, eps, C, norm="inf", steps=30, starts=4, seed=0):
    """Points of the l_norm ball of radius eps around x where an attack on the torch model
    ends, for each margin row of C: (points, rows, input size). l_inf and l_2: PGD (sign and
    normalised gradient steps, projected); l_1: the ball's 2n vertices (the extreme points,
    where a linear piece of the network takes its minimum)."""
    n = x.size
    if norm == "1":
        V = np.concatenate([np.eye(n), -np.eye(n)]) * eps + x.reshape(1, -1)
        return np.repeat(V[:, None, :], C.shape[0], axis=1)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.tensor(x)
    Ct = torch.tensor(C)
    found = []

    def project(d):
        if norm == "inf":
            return d.clamp_(-eps, eps)
        nrm = d.flatten(1).norm(dim=1).clamp(min=eps).view(-1, *([1] * (d.dim() - 1)))
        return d.mul_(eps / nrm)

    for _ in range(starts):
        d = (torch.rand(x0.shape, generator=gen, dtype=torch.float64) * 2 - 1) * eps
        d = project(d.expand((C.shape[0],) + x0.shape[1:]).clone()).requires_grad_(True)
        for _ in range(steps):
            m = (model(x0 + d) * Ct).sum(1)
            g, = torch.autograd.grad(m.sum(), d)
            with torch.no_grad():
                if norm == "inf":
                    d -= eps / 4 * g.sign()
                else:
                    gn = g.flatten(1).norm(dim=1).clamp(min=1e-30).view(-1, *([1] * (g.dim() - 1)))
                    d -= eps / 4 * g / gn
                project(d)
        found.append((x0 + d).detach().numpy().reshape(C.shape[0], -1))
    return np.stack(found)


def _attack_margins(graph, model, torch, x, eps, C, **kw):
    """The smallest margin of each row of C at the attack's points, by crown's own forward
    pass of the ONNX file (the file is what is bounded: the export folds batch norm into the
    convolutions in float32, so torch's float64 model differs from it by ~1e-7)."""
    P = _attack(model, torch, x, eps, C, **kw)
    return np.stack([np.einsum("rk,rk->r", graph.forward(p), C) for p in P]).min(0)


def _cross_check(crown_cli, graph, model, torch, x, c, seed):
    """crown_cli.certify with this network's norm and method; its radius r attacked; for
    l_inf, crown_cli.verify of "the runner-up reaches the predicted class" on the boxes of
    radius 0.9 r (must not be sat: r is certified) and 3 r (sat must hold at its point;
    unsat must survive the attack). Returns (text, violations)."""
    norm = ("inf", "2", "1")[seed // 2 % 3]
    method = ("crown", "alpha-crown")[seed % 2]
    cert = crown_cli.certify(graph, x[0].transpose(1, 2, 0).reshape(-1), norm=norm,
                             method=method)  # (certify takes crown's (H, W, C) image order)
    r, text = cert.eps, f"certify l{norm} {method} {cert.eps:.5g}"
    if cert.predicted != c:
        return f"{text}: predicted {cert.predicted}, torch {c}", 1
    t = int(cert.target)
    row = (np.eye(10)[c] - np.eye(10)[t])[None]
    if not r:
        return text, 0
    if np.any(_attack_margins(graph, model, torch, x, r, row, norm=norm, steps=50,
                              seed=seed) < 0):
        return f"{text} VIOLATED", 1
    if norm != "inf" or r >= 1:
        return text, 0
    bad = 0
    for k in (0.9, 3.0):
        lo, hi = x - k * r, x + k * r
        v = crown_cli.verify(graph, (lo, hi, row, np.zeros(1)), timeout=10, workers=1)
        text += f"; verify {k:g}r {v.result}"
        if v.result == "sat":
            xv = np.asarray(v.x).reshape(1, -1)
            inside = np.all((lo.reshape(1, -1) <= xv) & (xv <= hi.reshape(1, -1)))
            if k < 1 or not inside or float(graph.forward(xv)[0] @ row[0]) > 0:
                text, bad = text + " WRONG", bad + 1
        elif v.result == "unsat":
            if np.any(_attack_margins(graph, model, torch, x, k * r, row, steps=50,
                                      starts=8, seed=seed) <= 0):
                text, bad = text + " WRONG", bad + 1
    return text, bad


def _proof_check(path, graph, model, torch, x, c, seed, tmp):
    """``crown certify --proof`` (method crown) of this network where ``crown check`` reads
    its ONNX file: every certificate written must be accepted; the first moved to 4 times
    its radius, where the attack finds a point of the margin below 0, must be rejected.
    Returns (text, violations)."""
    import json

    from click.testing import CliRunner

    from crown_cli import check as checker
    from crown_cli.cli import cli

    try:
        checker.load_model(path)
    except checker.Reject as e:
        return f"proof: unread ({str(e)[:40]})", 0
    norm = ("inf", "2")[seed % 2]
    images = os.path.join(tmp, f"im{seed}.npz")
    np.savez(images, x=x[0].transpose(1, 2, 0).reshape(1, -1), y=np.array([c]))
    out = os.path.join(tmp, f"proofs{seed}")
    res = CliRunner().invoke(cli, ["certify", "--model", path, "--images", images, "-q",
                                   "--norm", norm, "--target", "runner-up,untargeted",
                                   "-o", os.path.join(tmp, f"r{seed}.csv"), "--proof", out])
    if res.exit_code != 0:
        return f"proof: certify exit {res.exit_code} {res.output[-200:]} WRONG", 1
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    rejected = res.stderr.count("crown check would reject")
    bad, text = 0, f"proof l{norm}: {len(names)} written, {rejected} rejected"
    if rejected:  # (not wrong: the checker's bound is below the engine's there)
        why = res.stderr.split("crown check would reject it (", 1)[1].split("\n", 1)[0]
        text += f" ({why[:200]})"
    for n in names:
        try:
            checker.check_certify(path, images, os.path.join(out, n))
        except checker.Reject as e:
            bad, text = bad + 1, text + f" {n} REJECTED ({str(e)[:80]}) WRONG"
    if not names:
        return text, bad
    with np.load(os.path.join(out, names[0]), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays.pop("header").tobytes().decode())
    eps = 4 * header["eps"]
    C = np.zeros((1, 10))
    C[0, c], C[0, header["targets"][0]] = 1.0, -1.0
    if np.any(_attack_margins(graph, model, torch, x, eps, C, norm=norm, steps=50,
                              seed=seed) < 0):
        lo, hi = checker.ball_box(arrays["x0"], eps)
        arrays.update(c0_lo=lo, c0_hi=hi, header=np.frombuffer(
            json.dumps(dict(header, eps=eps)).encode(), np.uint8))
        far = os.path.join(tmp, f"far{seed}.proof")
        with open(far, "wb") as fh:
            np.savez(fh, **arrays)
        try:
            checker.check_certify(path, images, far)
            bad, text = bad + 1, text + " 4r ACCEPTED past an attack WRONG"
        except checker.Reject:
            text += "; 4r rejected"
    return text, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lirpa", required=True, help="an auto_LiRPA checkout")
    ap.add_argument("--nets", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-certify", action="store_true", help="bounds only")
    ap.add_argument("--big", action="store_true", help="16-32 pixels a side, wider layers")
    ap.add_argument("--dense", action="store_true",
                    help="two hidden dense layers of 256-512 outputs (a weight's rows, pairs)")
    ap.add_argument("--dynamo", action="store_true",
                    help="export with torch's dynamo exporter (needs onnxscript)")
    ap.add_argument("--exotic", action="store_true",
                    help="also paddings, upsampling, other activations, ... (EXOTIC)")
    ap.add_argument("--proofs", action="store_true",
                    help="also crown certify --proof where crown check reads the network: "
                         "every certificate accepted, one moved past an attack rejected")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.lirpa))
    import torch
    import torch.nn as nn
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    import crown_cli
    from crown_cli.engine.graph_bounds import GraphBounds

    warnings.filterwarnings("ignore")  # (torch's notes on the legacy exporter, per network)
    tmp = tempfile.mkdtemp()
    bad = crashes = looser_nets = lirpa_wrong = lirpa_failed = refused = 0
    for seed in range(args.seed, args.seed + args.nets):
        torch.set_default_dtype(torch.float32)
        model, shape, desc, approx = _build(seed, nn, torch, args.exotic, args.big,
                                            args.dense, relu=args.proofs)
        path = os.path.join(tmp, f"net{seed}.onnx")
        try:
            if args.dynamo:  # torch's default exporter since 2.9 (needs onnxscript)
                torch.onnx.export(model, (torch.zeros((1,) + shape),), path, dynamo=True,
                                  verbose=False)
            else:
                torch.onnx.export(model, torch.zeros((1,) + shape), path, opset_version=13,
                                  dynamo=False)
        except Exception as e:  # (torch's exporter, not crown)
            print(f"net {seed:3d} {desc}: export failed: {type(e).__name__} {str(e)[:100]}")
            continue
        model = model.double()
        torch.set_default_dtype(torch.float64)
        rng = np.random.default_rng(seed)
        x = rng.uniform(0, 1, (1,) + shape)
        with torch.no_grad():
            z = model(torch.tensor(x)).numpy()[0]
        c = int(np.argmax(z))
        C = np.eye(10)[[c] * 9] - np.eye(10)[[t for t in range(10) if t != c]]
        try:
            bm = BoundedModule(model, torch.zeros((1,) + shape), device="cpu")
            bm.eval()
            model.eval()
        except Exception as e:  # auto_LiRPA cannot: crown alone, against sampling
            bm = None
            lirpa_failed += 2
            print(f"  (auto_LiRPA: {type(e).__name__}: {str(e)[:80]})")
        line = [f"net {seed:3d} {desc}:"]
        try:
            graph = crown_cli.load_model(path)
        except crown_cli.InputError as e:  # refused by name: not a crash, but counted
            refused += 1
            print(" ".join(line), "REFUSED:", str(e)[:300], flush=True)
            continue
        try:
            fwd = float(np.max(np.abs(graph.forward(x.reshape(1, -1))[0] - z)))
            if fwd > 1e-5 * max(1.0, np.abs(z).max()):
                raise RuntimeError(f"forward difference {fwd:.1e}")
        except Exception as e:
            crashes += 1
            print(" ".join(line), "CRASH load/forward:", type(e).__name__, str(e)[:200])
            continue
        for eps in (0.002, 0.02):
            try:
                ours = GraphBounds(graph, x.reshape(-1), eps, 0).bounds(C)[0]
            except Exception as e:
                crashes += 1
                line.append(f"CRASH bounds eps {eps}: {type(e).__name__} {str(e)[:200]}")
                traceback.print_exc()
                continue
            pts = x.reshape(1, -1) + rng.uniform(-eps, eps, (300, x.size))
            pts[:150] = x.reshape(1, -1) + eps * np.sign(pts[:150] - x.reshape(1, -1))
            margins = (graph.forward(pts) @ C.T).min(0)
            margins = np.minimum(margins, _attack_margins(graph, model, torch, x, eps, C, seed=seed))
            viol = int(np.sum(ours > margins))
            bad += viol
            msg = f"eps {eps:g} min {ours.min():+.4f} viol {viol}"
            if bm is not None:
                try:
                    xt = BoundedTensor(torch.tensor(x), PerturbationLpNorm(norm=np.inf, eps=eps))
                    theirs = bm.compute_bounds(x=(xt,), C=torch.tensor(C[None]), method="CROWN",
                                               bound_upper=False)[0].detach().numpy()[0]
                    tol = 1e-5 * np.maximum(np.abs(theirs), 1.0)
                    below = ours < theirs - tol
                    if below.any():  # (intersecting with interval bounds moves CROWN's adaptive
                        # slopes, which can lower a row: looser only if CROWN alone is too)
                        alone = GraphBounds(graph, x.reshape(-1), eps, 0, ibp=False).bounds(C)[0]
                        below &= alone < theirs - tol
                    looser = int(np.sum(below))
                    tighter = int(np.sum(ours > theirs + tol))
                    msg += f" lirpa {theirs.min():+.4f} looser {looser} tighter {tighter}"
                    wrong = int(np.sum(theirs > margins + tol))
                    if wrong:  # (auto_LiRPA's bound above a margin crown's forward pass found)
                        msg += f" (auto_LiRPA unsound on {wrong})"
                        lirpa_wrong += 1
                    elif looser and not approx:
                        looser_nets += 1
                        msg += " LOOSER"
                except Exception as e:
                    msg += f" (auto_LiRPA failed: {type(e).__name__})"
                    lirpa_failed += 1
            line.append(msg)
        checks = [("certify/verify", lambda: _cross_check(crown_cli, graph, model, torch, x,
                                                          c, seed))] if not args.no_certify else []
        if args.proofs:
            checks.append(("proof", lambda: _proof_check(path, graph, model, torch, x, c, seed,
                                                         tmp)))
        for what, check in checks:
            try:
                text, wrong = check()
                line.append(text)
                bad += wrong
            except Exception as e:
                crashes += 1
                line.append(f"CRASH {what}: {type(e).__name__} {str(e)[:200]}")
                traceback.print_exc()
        print(" ".join(line), flush=True)
    print(f"fuzz_lirpa: {args.nets} networks, {bad} violations, {crashes} crashes, "
          f"{refused} refused by name, "
          f"{looser_nets} bound pairs looser than auto_LiRPA (ReLU-type); auto_LiRPA failed on "
          f"{lirpa_failed} and was unsound on {lirpa_wrong} of {2 * args.nets} bound pairs")
    return 1 if bad or crashes else 0


if __name__ == "__main__":
    sys.exit(main())
