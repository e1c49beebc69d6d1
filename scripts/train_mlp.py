"""Train a fully connected MNIST classifier with numpy only and save it as a Keras HDF5 file.

The network is ``784 -> hidden -> ... -> hidden -> 10`` with ``--layers`` weight layers and the
chosen activation after every layer but the last. The saved model takes the 28x28 images
flattened row-major and scaled ``pixel/255 - 0.5`` (the same preprocessing as ``make_data.py``).

Training uses float32, softmax cross-entropy, Adam (learning rate multiplied by ``--lr-decay``
after every epoch) and shuffled mini-batches; the run is deterministic given ``--seed``.
Unless ``--no-center`` is given, the network is trained on inputs minus the per-pixel mean of
the training set and that shift is folded into the first-layer bias before saving, so the
saved model is exact for the ``pixel/255 - 0.5`` inputs. (Without centering, the ~600
background pixels at -0.5 make Adam's per-weight steps add up to large jumps in every hidden
pre-activation, and many ReLUs of narrow networks die.)

The per-epoch train loss and full test-set accuracy are printed; then the model is written
with :func:`crown_cli.io.models.save_keras_h5`, reloaded with
:func:`crown_cli.io.models.load_model`, and the reloaded model's test accuracy is printed.

Run from the repository root, e.g.::

    PYTHONPATH=. python3 scripts/train_mlp.py --layers 3 --hidden 1024 --activation relu \\
        --epochs 10 --batch-size 128 --lr 1e-3 --lr-decay 0.7 --seed 0 --out models/mnist_3x1024.h5
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from crown_cli.io.models import load_model, save_keras_h5
from make_data import DEFAULT_MNIST_DIR, IdxError, load_mnist  # scripts/ is on sys.path

NUM_CLASSES = 10


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


# name -> (activation(z), derivative d act/dz given (z, act(z)))
ACTIVATIONS = {
    "relu": (lambda z: np.maximum(z, 0.0), lambda z, a: (z > 0).astype(z.dtype)),
    "tanh": (np.tanh, lambda z, a: 1.0 - a * a),
    "sigmoid": (_sigmoid, lambda z, a: a * (1.0 - a)),
    "arctan": (np.arctan, lambda z, a: 1.0 / (1.0 + z * z)),
}


def init_params(sizes, activation, rng):
    """He-normal init for ReLU hidden layers, Glorot-uniform otherwise; zero biases.

    Weights are (outputs, inputs), float32.
    """
    weights, biases = [], []
    for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        hidden = k < len(sizes) - 2
        if hidden and activation == "relu":
            w = rng.normal(0.0, np.sqrt(2.0 / n_in), size=(n_out, n_in))
        else:
            limit = np.sqrt(6.0 / (n_in + n_out))
            w = rng.uniform(-limit, limit, size=(n_out, n_in))
        weights.append(w.astype(np.float32))
        biases.append(np.zeros(n_out, dtype=np.float32))
    return weights, biases


def forward(weights, biases, act, x):
    """Return the pre-activations ``zs`` and layer inputs ``inputs`` (inputs[0] = x).

    The last entry of ``zs`` is the logits.
    """
    inputs, zs = [x], []
    for k, (w, b) in enumerate(zip(weights, biases)):
        z = inputs[-1] @ w.T + b
        zs.append(z)
        if k < len(weights) - 1:
            inputs.append(act(z))
    return zs, inputs


def softmax_xent(logits, y):
    """Mean cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    sums = exp.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    loss = float(np.mean(np.log(sums[:, 0]) - shifted[np.arange(n), y]))
    grad = exp / sums
    grad[np.arange(n), y] -= 1.0
    grad /= n
    return loss, grad


def backward(weights, zs, inputs, dact, grad_logits):
    """Gradients ``(dW, db)`` for every layer, given the gradient of the loss at the logits."""
    m = len(weights)
    dws, dbs = [None] * m, [None] * m
    delta = grad_logits
    for k in range(m - 1, -1, -1):
        dws[k] = delta.T @ inputs[k]
        dbs[k] = delta.sum(axis=0)
        if k > 0:
            delta = (delta @ weights[k]) * dact(zs[k - 1], inputs[k])
    return dws, dbs


class Adam:
    """Adam (Kingma & Ba) updating a list of float32 arrays in place."""

    def __init__(self, params, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.params = params
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads):
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        step_size = self.lr * np.sqrt(1.0 - b2 ** self.t) / (1.0 - b1 ** self.t)
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            v += (1.0 - b2) * (g * g)
            p -= np.float32(step_size) * m / (np.sqrt(v) + np.float32(self.eps))


def predict(weights, biases, act, x, batch=2000):
    out = []
    for i in range(0, x.shape[0], batch):
        zs, _ = forward(weights, biases, act, x[i : i + batch])
        out.append(zs[-1].argmax(axis=1))
    return np.concatenate(out)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mnist-dir", default=DEFAULT_MNIST_DIR,
                   help="directory holding the MNIST IDX .gz files (default: %(default)s)")
    p.add_argument("--layers", type=int, default=3, help="number of weight layers (3 = 784-h-h-10)")
    p.add_argument("--hidden", type=int, default=1024, help="neurons per hidden layer")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate of the first epoch")
    p.add_argument("--lr-decay", type=float, default=1.0,
                   help="factor applied to the learning rate after each epoch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-center", dest="center", action="store_false",
                   help="train on the raw inputs instead of inputs minus the training-set pixel mean")
    p.add_argument("--out", required=True, help="output Keras .h5 path")
    args = p.parse_args(argv)
    for name in ("layers", "hidden", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.lr > 0:
        p.error("--lr must be positive")
    if not 0 < args.lr_decay <= 1:
        p.error("--lr-decay must be in (0, 1]")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        x_train, y_train = load_mnist(args.mnist_dir, "train")
        x_test, y_test = load_mnist(args.mnist_dir, "test")
    except IdxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    shift = x_train.mean(axis=0) if args.center else np.zeros(x_train.shape[1])
    x_train = (x_train - shift).astype(np.float32)
    x_test_shifted = (x_test - shift).astype(np.float32)

    rng = np.random.default_rng(args.seed)
    sizes = [x_train.shape[1]] + [args.hidden] * (args.layers - 1) + [NUM_CLASSES]
    act, dact = ACTIVATIONS[args.activation]
    weights, biases = init_params(sizes, args.activation, rng)
    opt = Adam(weights + biases, args.lr)  # same array objects: updated in place
    print(f"network {'-'.join(map(str, sizes))} {args.activation}, "
          f"{sum(w.size + b.size for w, b in zip(weights, biases))} parameters", flush=True)

    n = x_train.shape[0]
    t_start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        t_epoch = time.perf_counter()
        opt.lr = args.lr * args.lr_decay ** (epoch - 1)
        order = rng.permutation(n)
        total_loss = 0.0
        for i in range(0, n, args.batch_size):
            idx = order[i : i + args.batch_size]
            zs, inputs = forward(weights, biases, act, x_train[idx])
            loss, grad_logits = softmax_xent(zs[-1], y_train[idx])
            total_loss += loss * idx.size
            dws, dbs = backward(weights, zs, inputs, dact, grad_logits)
            opt.step(dws + dbs)
        acc = np.mean(predict(weights, biases, act, x_test_shifted) == y_test)
        print(f"epoch {epoch:3d}/{args.epochs}  lr {opt.lr:.2e}  train loss {total_loss / n:.4f}  "
              f"test acc {100 * acc:.2f}%  ({time.perf_counter() - t_epoch:.1f}s)", flush=True)
    print(f"training time {time.perf_counter() - t_start:.1f}s")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    # W0 (x - shift) + b0 = W0 x + (b0 - W0 shift): the saved model takes unshifted inputs.
    biases[0] = biases[0] - weights[0].astype(np.float64) @ shift
    save_keras_h5(args.out, weights, biases, args.activation)
    saved = load_model(args.out)
    final_acc = np.mean(saved.forward(x_test).argmax(axis=1) == y_test)
    print(f"saved {args.out} ({os.path.getsize(args.out) / 1e6:.2f} MB)")
    print(f"final test accuracy {100 * final_acc:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
