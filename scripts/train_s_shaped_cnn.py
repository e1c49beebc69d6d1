"""Train a small residual MNIST CNN with tanh or sigmoid activations and export it to ONNX:
a network the dense engine cannot take (the residual sum keeps it on the graph engine), for
measuring alpha-CROWN's tangent points on graphs (docs/benchmarks.md). Needs PyTorch (not a
crown-cli dependency). Run from the repository root::

    python scripts/train_s_shaped_cnn.py --act tanh -o mnist_res_tanh.onnx \
        [--mnist-dir ../shared/data/mnist] [--epochs 2] [--seed 0]

The network: conv 1->8 (4x4, stride 2) -> act -> h; h + act(conv 8->8 (3x3)) -> conv 8->16
(4x4, stride 2) -> act -> dense 784->100 -> act -> dense 100->10. Inputs (1, 1, 28, 28) in
crown's MNIST scaling, pixel/255 - 0.5. Adam (lr 1e-3), batches of 128.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))

from make_data import DEFAULT_MNIST_DIR, load_mnist  # noqa: E402


def network(act: str):
    import torch.nn as nn

    make = {"tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[act]

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(1, 8, 4, 2, 1), nn.Conv2d(8, 8, 3, 1, 1)
            self.c3 = nn.Conv2d(8, 16, 4, 2, 1)
            self.l1, self.l2 = nn.Linear(784, 100), nn.Linear(100, 10)
            self.act = make()

        def forward(self, x):
            h = self.act(self.c1(x))
            h = self.act(self.c2(h)) + h
            h = self.act(self.c3(h))
            return self.l2(self.act(self.l1(h.flatten(1))))

    return Residual()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--act", choices=("tanh", "sigmoid"), default="tanh")
    ap.add_argument("-o", "--out", required=True, help="the ONNX file to write")
    ap.add_argument("--mnist-dir", default=DEFAULT_MNIST_DIR)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import torch

    x, y = load_mnist(a.mnist_dir, "train")
    X = torch.tensor(x.reshape(-1, 1, 28, 28), dtype=torch.float32)
    Y = torch.tensor(y)
    torch.manual_seed(a.seed)
    net = network(a.act)
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    for epoch in range(a.epochs):
        perm = torch.randperm(X.shape[0])
        for s in range(0, X.shape[0], 128):
            b = perm[s:s + 128]
            loss = torch.nn.functional.cross_entropy(net(X[b]), Y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch}: last batch loss {loss.item():.4f}", flush=True)
    net.eval()
    xt, yt = load_mnist(a.mnist_dir, "test")
    with torch.no_grad():
        pred = net(torch.tensor(xt.reshape(-1, 1, 28, 28), dtype=torch.float32)).argmax(1)
    print(f"test accuracy {float(np.mean(pred.numpy() == yt)):.4f}")
    torch.onnx.export(net, X[:1], a.out, dynamo=False)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
