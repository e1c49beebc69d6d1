"""The benchmark's residual network (scripts/bench.py, case ``resnet``), built by the project
itself with seeded random weights, as a crown graph and, for the comparison with auto_LiRPA,
as a PyTorch module with the same float64 weights.

CIFAR-shaped (3x32x32 input): conv 3->8 3x3 stride 2 -> ReLU -> residual block (two 3x3 convs
8->8, ReLU between, the block's input added, ReLU) -> conv 8->16 3x3 stride 2 -> ReLU ->
residual block of 16 -> flatten 1024 -> dense 64 -> ReLU -> dense 10. Every conv pads 1.
Weights He-normal (seed 0), biases N(0, 0.05^2): about 73k parameters, the shape of the ResNet
of issue 35.
"""
import numpy as np

CONVS = (("conv1", 8, 3, 2), ("b1a", 8, 8, 1), ("b1b", 8, 8, 1),
         ("conv2", 16, 8, 2), ("b2a", 16, 16, 1), ("b2b", 16, 16, 1))


def parameters(seed: int = 0):
    """{layer: (weight, bias)} as float64 arrays (conv weights (O, C, 3, 3), dense (m, n))."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, o, c, _ in CONVS:
        p[name] = (rng.normal(0, np.sqrt(2.0 / (9 * c)), (o, c, 3, 3)), rng.normal(0, 0.05, o))
    p["fc1"] = (rng.normal(0, np.sqrt(2.0 / 1024), (64, 1024)), rng.normal(0, 0.05, 64))
    p["fc2"] = (rng.normal(0, np.sqrt(1.0 / 64), (10, 64)), rng.normal(0, 0.05, 10))
    return p


def graph(p):
    """The network as a :class:`crown_cli.graph.network.Graph` (input (1, 3, 32, 32))."""
    from crown_cli.graph.network import Graph, Node
    from crown_cli.graph.ops import ActivationOp, Conv, Dense, InputOp, Sum

    nodes = []

    def add(name, op, ins, shape):
        nodes.append(Node(name, op, tuple(ins), (1,) + tuple(shape)))
        return len(nodes) - 1

    def conv(name, src, stride):
        w, b = p[name]
        op = Conv(w, b, nodes[src].shape[1:], (stride, stride), (1, 1, 1, 1))
        return add(name, op, (src,), op.out_shape)

    def relu(src):
        return add(f"relu{len(nodes)}", ActivationOp("relu"), (src,), nodes[src].shape[1:])

    def block(h, a, b):
        y = conv(b, relu(conv(a, h, 1)), 1)
        return relu(add(f"add{len(nodes)}", Sum([1.0, 1.0], nodes[y].size), (y, h),
                        nodes[y].shape[1:]))

    h = add("x", InputOp(0, 0, 3 * 32 * 32), (), (3, 32, 32))
    h = block(relu(conv("conv1", h, 2)), "b1a", "b1b")
    h = block(relu(conv("conv2", h, 2)), "b2a", "b2b")
    for name in ("fc1", "fc2"):
        w, b = p[name]
        h = add(name, Dense(w, b), (h,), (w.shape[0],))
        if name == "fc1":
            h = relu(h)
    return Graph(nodes, h, source="resnet (scripts/resnet_model.py)")


def torch_module(p):
    """The same network as a float64 torch module (needs torch)."""
    import torch
    from torch import nn

    def conv(name, stride):
        w, b = p[name]
        m = nn.Conv2d(w.shape[1], w.shape[0], 3, stride, 1).double()
        m.weight.data, m.bias.data = torch.tensor(w), torch.tensor(b)
        return m

    def dense(name):
        w, b = p[name]
        m = nn.Linear(w.shape[1], w.shape[0]).double()
        m.weight.data, m.bias.data = torch.tensor(w), torch.tensor(b)
        return m

    class Block(nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.a, self.b = conv(a, 1), conv(b, 1)

        def forward(self, x):
            return torch.relu(self.b(torch.relu(self.a(x))) + x)

    return nn.Sequential(conv("conv1", 2), nn.ReLU(), Block("b1a", "b1b"), conv("conv2", 2),
                         nn.ReLU(), Block("b2a", "b2b"), nn.Flatten(), dense("fc1"), nn.ReLU(),
                         dense("fc2")).double()
