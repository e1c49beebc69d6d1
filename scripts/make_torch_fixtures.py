"""Write ONNX test fixtures with PyTorch's own exporter (``torch.onnx.export``).

Three small PyTorch models, the shapes users export, with fixed seeded weights, in eval mode:

* ``mnist_conv``: input (1, 1, 28, 28) (crown's shipped MNIST images) -> Conv2d(1, 4, 3,
  stride 2, padding 1) -> BatchNorm2d -> ReLU -> MaxPool2d(2) -> Flatten -> Linear(196, 16)
  -> BatchNorm1d -> ReLU -> Dropout -> Linear(16, 10);
* ``residual``: input (1, 3, 8, 8) -> Conv2d(3, 6, 3, padding 1) -> ReLU -> AvgPool2d(2) ->
  a pre-activation residual block ``x + conv(relu(bn(conv(relu(bn(x))))))`` -> ReLU ->
  AdaptiveAvgPool2d(1) -> Flatten -> Linear(6, 5);
* ``normalised``: input (1, 3, 4, 4); ``forward`` computes ``(x - mean) / std`` (buffers),
  ``x.view(x.size(0), -1)``, Linear(48, 12) -> Tanh -> Linear(12, 8) -> LeakyReLU(0.1) ->
  Linear(8, 3) -> Sigmoid (mixed activations, a sigmoid output). Exported with a dynamic
  batch axis, so the exporters write the view's shape arithmetic (Shape, Gather, Unsqueeze,
  Concat or their like) instead of a constant shape;
* ``relu6``: input (1, 4) -> Linear(4, 6) -> ReLU6 -> Linear(6, 3): exported as ``Clip``
  (once refused; now read as ReLU nodes);
* ``gated``: input (1, 2, 6, 6) -> Conv2d(2, 4, 3, padding 1) -> GELU -> Conv2d(4, 4, 3,
  stride 2, padding 1) -> SiLU -> Flatten -> Linear(36, 12) -> Hardswish -> Linear(12, 8) ->
  Mish -> Linear(8, 6) -> PReLU(6) (slopes 0.25, -0.3, 0.1, 1.4, 0, 0.6) -> Linear(6, 3):
  the exporters write ``Gelu`` or the ``Erf`` pattern, ``Sigmoid`` and ``Mul``,
  ``HardSwish``, ``Mish`` or ``Softplus``, ``Tanh`` and ``Mul``, ``PRelu`` (added with
  torch 2.14.1: ``--only gated``);
* ``softplus``: input (1, 4) -> Linear(4, 6) (three biases near 20) -> Softplus ->
  Linear(6, 3): the default exporter writes ``Where(Greater(z, 20), z, Softplus(z))``
  (torch's threshold), the TorchScript one ``Softplus`` (torch 2.14.1: ``--only softplus``);
* ``selu_celu``: input (1, 4) -> Linear(4, 8) -> SELU -> Linear(8, 8) -> CELU(alpha=0.7) ->
  Linear(8, 6) -> GELU(approximate='tanh') -> Linear(6, 3): both exporters write ``Selu``
  and ``Celu``; the default one ``Gelu`` (approximate='tanh'), the TorchScript one (opset 17)
  its chain of ``Mul``, ``Add`` and ``Tanh`` (torch 2.14.1: ``--only selu_celu``).

* ``tiny_vit``: input (1, 1, 8, 8) -> a vision transformer in miniature (patch embedding,
  positions, a pre-norm block with ``nn.LayerNorm``, ``nn.MultiheadAttention`` and a GELU
  MLP, the tokens' mean, a linear head): the exporters write ``LayerNormalization`` or its
  ``ReduceMean`` / ``Pow`` / ``Sqrt`` / ``Div`` chain, attention's ``MatMul`` of data and
  ``Softmax``, and a ``Mod`` of shape constants (torch 2.13: ``--only tiny_vit``).

Each model is exported twice into ``tests/fixtures/torch/``:

* ``<name>.onnx``: the default exporter of torch 2.x (``dynamo=True``, needs ``onnxscript``),
  opset :data:`DYNAMO_OPSET`, ``external_data=False`` (weights inside the file);
* ``<name>_legacy.onnx``: the TorchScript exporter (``dynamo=False``), opset
  :data:`LEGACY_OPSET`, as older tutorials and torch < 2.9 write them;

and ``<name>.expected.npz`` beside them with

* ``x``  :data:`NUM_INPUTS` random inputs, float32, shape (N, *input shape without batch 1);
* ``y``  torch's outputs for ``x``, float32 (the model as exported: float32 weights, eval
  mode), one row per input;
* ``writer``  e.g. ``torch 2.13.0+cpu, onnxscript 0.7.2``.

torch is NOT a dependency of crown_cli; run this in a separate venv (the CPU wheel; a torch
without the version pin may pull a CUDA build of several GB)::

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0 onnx onnxscript numpy
    /tmp/torchenv/bin/python scripts/make_torch_fixtures.py --regenerate

Without ``--regenerate`` the script refuses to overwrite fixtures that exist (the committed
ones are what tests/test_torch_export.py checks; a new torch writes other bytes); ``--out DIR``
writes elsewhere (to look at what another torch exports). The tests read the files with
``onnx`` only, no torch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:
    sys.exit("make_torch_fixtures.py needs PyTorch (pip install torch==2.13.0 onnx onnxscript "
             "in a separate venv; see the module docstring)")

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "torch"
DYNAMO_OPSET = 20  # torch 2.13's default for both exporters
LEGACY_OPSET = 17
NUM_INPUTS = 8


class MnistConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.flat = nn.Flatten()
        self.fc1 = nn.Linear(4 * 7 * 7, 16)
        self.bn1 = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc2(self.drop(torch.relu(self.bn1(self.fc1(self.flat(x))))))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv1 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.stem(x)))
        f = self.conv2(torch.relu(self.bn2(self.conv1(torch.relu(self.bn1(x))))))
        x = torch.relu(x + f)
        return self.fc(torch.flatten(self.gap(x), 1))


class Normalised(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.49, 0.48, 0.45]).reshape(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.25, 0.24, 0.26]).reshape(1, 3, 1, 1))
        self.fc1 = nn.Linear(48, 12)
        self.fc2 = nn.Linear(12, 8)
        self.fc3 = nn.Linear(8, 3)
        self.leaky = nn.LeakyReLU(0.1)

    def forward(self, x):
        x = (x - self.mean) / self.std
        x = x.view(x.size(0), -1)
        x = self.leaky(self.fc2(torch.tanh(self.fc1(x))))
        return torch.sigmoid(self.fc3(x))


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(36, 12)
        self.fc2 = nn.Linear(12, 8)
        self.fc3 = nn.Linear(8, 6)
        self.fc4 = nn.Linear(6, 3)
        self.prelu = nn.PReLU(6)
        with torch.no_grad():  # per-channel slopes, one negative and one above 1
            self.prelu.weight.copy_(torch.tensor([0.25, -0.3, 0.1, 1.4, 0.0, 0.6]))
            for m in (self.conv1, self.conv2, self.fc1, self.fc2, self.fc3, self.fc4):
                m.weight.mul_(2.0)  # default init x 2: outputs that vary with the input

    def forward(self, x):
        x = nn.functional.silu(self.conv2(nn.functional.gelu(self.conv1(x))))
        x = nn.functional.hardswish(self.fc1(torch.flatten(x, 1)))
        x = self.prelu(self.fc3(nn.functional.mish(self.fc2(x))))
        return self.fc4(x)


class SoftplusNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)
        with torch.no_grad():  # pre-activations on both sides of torch's threshold, 20
            self.fc1.weight.mul_(4.0)
            self.fc1.bias[:3] = torch.tensor([19.5, 20.0, 20.5])

    def forward(self, x):
        return self.fc2(nn.functional.softplus(self.fc1(x)))


class Relu6(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(nn.functional.relu6(self.fc1(x)))


class SeluCelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 6)
        self.fc4 = nn.Linear(6, 3)
        with torch.no_grad():
            for m in (self.fc1, self.fc2, self.fc3):
                m.weight.mul_(2.0)  # pre-activations on both sides of 0

    def forward(self, x):
        x = nn.functional.celu(self.fc2(nn.functional.selu(self.fc1(x))), alpha=0.7)
        return self.fc4(nn.functional.gelu(self.fc3(x), approximate="tanh"))


class TinyViT(nn.Module):
    """A vision transformer in miniature: 4x4 patches of an 8x8 image embedded by a
    convolution, learned positions, one pre-norm block (LayerNorm, two-head attention
    (``nn.MultiheadAttention``), LayerNorm, a GELU MLP), a final LayerNorm, the tokens'
    mean, a linear head."""

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.patch = nn.Conv2d(1, d, 4, 4)
        self.pos = nn.Parameter(0.1 * torch.randn(1, 4, d))
        self.n1, self.n2, self.norm = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, 4)
        with torch.no_grad():
            for n in (self.n1, self.n2, self.norm):
                n.weight.uniform_(0.5, 1.5)
                n.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        y = self.n1(t)
        t = t + self.att(y, y, y, need_weights=False)[0]
        t = self.norm(t + self.mlp(self.n2(t)))
        return self.head(t.mean(1))


# name, class, input shape, input range (low, high), dynamic batch axis
MODELS = [
    ("mnist_conv", MnistConv, (1, 1, 28, 28), (-0.5, 0.5), False),
    ("residual", Residual, (1, 3, 8, 8), (-1.0, 1.0), False),
    ("normalised", Normalised, (1, 3, 4, 4), (0.0, 1.0), True),
    ("relu6", Relu6, (1, 4), (-1.0, 1.0), False),
    ("gated", Gated, (1, 2, 6, 6), (-2.0, 2.0), False),
    ("softplus", SoftplusNet, (1, 4), (-1.0, 1.0), False),
    ("selu_celu", SeluCelu, (1, 4), (-2.0, 2.0), False),
    ("tiny_vit", TinyViT, (1, 1, 8, 8), (0.0, 1.0), False),
]


def build(cls, seed: int) -> nn.Module:
    """The model with seeded random weights and BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    model = cls()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def export(model, shape, path: Path, dynamo: bool, dynamic: bool) -> None:
    x = torch.zeros(shape)
    kw = dict(input_names=["input"], output_names=["output"])
    if dynamo:
        kw.update(opset_version=DYNAMO_OPSET, external_data=False)
        if dynamic:
            kw["dynamic_shapes"] = {"x": {0: torch.export.Dim("batch")}}
    else:
        kw.update(opset_version=LEGACY_OPSET)
        if dynamic:
            kw["dynamic_axes"] = {"input": {0: "batch"}, "output": {0: "batch"}}
    torch.onnx.export(model, (x,), str(path), dynamo=dynamo, **kw)


def writer() -> str:
    try:
        import onnxscript
        return f"torch {torch.__version__}, onnxscript {onnxscript.__version__}"
    except ImportError:
        return f"torch {torch.__version__}"


def make(out: Path, name: str, cls, shape, rng_range, dynamic: bool, seed: int) -> None:
    model = build(cls, seed)
    rng = np.random.default_rng(seed)
    x = rng.uniform(*rng_range, size=(NUM_INPUTS,) + shape[1:]).astype(np.float32)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy()
    paths = [out / f"{name}.onnx", out / f"{name}_legacy.onnx"]
    export(model, shape, paths[0], dynamo=True, dynamic=dynamic)
    export(model, shape, paths[1], dynamo=False, dynamic=dynamic)
    np.savez(out / f"{name}.expected.npz", x=x, y=y, writer=np.array(writer()))
    for p in paths:
        print(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}  ({p.stat().st_size} bytes)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT_DIR,
                    help="output folder (default: tests/fixtures/torch)")
    ap.add_argument("--regenerate", action="store_true",
                    help="overwrite fixtures that exist in the output folder")
    ap.add_argument("--only", default=None, help="write this model's fixtures only")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    models = [m for m in MODELS if args.only in (None, m[0])]
    existing = sorted(p.name for name, *_ in models
                      for p in (args.out / f"{name}.onnx", args.out / f"{name}_legacy.onnx",
                                args.out / f"{name}.expected.npz") if p.exists())
    if existing and not args.regenerate:
        print(f"make_torch_fixtures.py: {args.out} already has {', '.join(existing)}; "
              "pass --regenerate to overwrite them", file=sys.stderr)
        return 2
    for seed, (name, cls, shape, rng_range, dynamic) in enumerate(MODELS, start=2300):
        if args.only in (None, name):
            make(args.out, name, cls, shape, rng_range, dynamic, seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
