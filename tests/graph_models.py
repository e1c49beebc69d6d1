"""Small ONNX models of every operator kind the graph loader reads, built with onnx.helper
(tests/test_graph_forward.py, tests/test_graph_bounds.py). Each builder takes a seeded numpy
generator and returns an onnx ModelProto with float32 weights."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class G:
    """A model under construction: initializers, nodes, fresh tensor names."""

    def __init__(self, rng):
        self.rng, self.nodes, self.inits, self.k = rng, [], [], 0

    def name(self, stem="t"):
        self.k += 1
        return f"{stem}{self.k}"

    def const(self, array, dtype=np.float32):
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), n))
        return n

    def rand(self, *shape, scale=0.5):
        return self.const(self.rng.normal(0.0, scale, size=shape))

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.name() for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name(op_type),
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, inputs, outputs, opset=17):
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in outputs]
        graph = helper.make_graph(self.nodes, "g", ins, outs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def dense_chain(rng, sizes=(5, 8, 7, 3), act="Relu"):
    g = G(rng)
    x = "x"
    for k in range(len(sizes) - 1):
        x = g.op("Gemm", [x, g.rand(sizes[k + 1], sizes[k]), g.rand(sizes[k + 1])], transB=1)
        if k < len(sizes) - 2:
            x = g.op(act, [x])
    return g.model([("x", (1, sizes[0]))], [x])


def conv_net(rng, act="Relu", bn=True, pool="AveragePool"):
    """Conv (stride, pads, dilation, groups) -> BatchNorm (folded) -> act -> pool -> Conv ->
    BN after a Relu (folded into the Gemm, across the Flatten) -> flatten -> Gemm."""
    g = G(rng)
    x = g.op("Conv", ["x", g.rand(4, 2, 3, 3), g.rand(4)], strides=[1, 2], pads=[1, 0, 1, 1],
             dilations=[1, 1])
    if bn:
        x = g.op("BatchNormalization", [x, g.const(rng.uniform(0.5, 1.5, 4)), g.rand(4),
                                        g.rand(4), g.const(rng.uniform(0.5, 2.0, 4))])
    x = g.op(act, [x])
    if pool == "AveragePool":
        x = g.op("AveragePool", [x], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 1, 1, 0],
                 count_include_pad=0)
    elif pool == "MaxPool":
        x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[1, 1])
    x = g.op("Conv", [x, g.rand(4, 2, 2, 2), g.rand(4)], group=2, dilations=[2, 1])
    x = g.op("Relu", [x])
    x = g.op("BatchNormalization", [x, g.const(rng.uniform(0.5, 1.5, 4)), g.rand(4),
                                    g.rand(4), g.const(rng.uniform(0.5, 2.0, 4))])
    x = g.op("Flatten", [x])
    n = int(np.prod(_shape(g, "x", (1, 2, 6, 7), x)[1:]))
    x = g.op("Gemm", [x, g.rand(3, n), g.rand(3)], transB=1)
    return g.model([("x", (1, 2, 6, 7))], [x])


def _shape(g, name, in_shape, out):
    """The shape of tensor ``out`` of the nodes built so far (by running them once)."""
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph(g.nodes, "s", [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, [])],
                              initializer=g.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(m).run(None, {name: np.zeros(in_shape, np.float32)})[0].shape


def residual(rng, act="Relu"):
    """Dense layer, then two branches (a dense + act, and a Slice/Concat/Mul-scaled copy)
    summed (Add of tensors), Sub of tensors, mixed activations, a sigmoid output."""
    g = G(rng)
    h = g.op("Gemm", ["x", g.rand(6, 4), g.rand(6)], transB=1)
    a = g.op(act, [h])
    b1 = g.op(act, [g.op("MatMul", [a, g.rand(6, 6)])])
    s1 = g.op("Slice", [a, g.const([0, 4], np.int64), g.const([2, 6], np.int64),
                        g.const([0, 1], np.int64)], )
    s2 = g.op("Slice", [a, g.const([0, 0], np.int64), g.const([1, 4], np.int64),
                        g.const([0, 1], np.int64)])
    cat = g.op("Concat", [s2, s1], axis=1)
    b2 = g.op("Div", [g.op("Mul", [cat, g.rand(6)]), g.const(np.full(6, 2.0))])
    sm = g.op("Add", [b1, b2])
    d = g.op("Sub", [sm, a])
    t = g.op("Tanh", [d])
    out = g.op("Gemm", [t, g.rand(3, 6), g.rand(3)], transB=1)
    out = g.op("Sigmoid", [out])
    return g.model([("x", (1, 4))], [out])


def relu_residual(rng, n_in=70):
    """ReLUs only, branched: Gemm -> Relu (a); a residual block Relu(Gemm(a)) + a; a Relu
    layer on that, concatenated with a slice of a; Gemm to 3 outputs. More than 64 inputs."""
    g = G(rng)
    a = g.op("Relu", [g.op("Gemm", ["x", g.rand(12, n_in), g.rand(12)], transB=1)])
    b = g.op("Relu", [g.op("Gemm", [a, g.rand(12, 12), g.rand(12)], transB=1)])
    s = g.op("Add", [b, a])
    c = g.op("Relu", [g.op("Gemm", [s, g.rand(8, 12), g.rand(8)], transB=1)])
    part = g.op("Slice", [a, g.const([0, 3], np.int64), g.const([1, 9], np.int64),
                          g.const([0, 1], np.int64)])
    cat = g.op("Concat", [c, part], axis=1)
    out = g.op("Gemm", [cat, g.rand(3, 14), g.rand(3)], transB=1)
    return g.model([("x", (1, n_in))], [out])


def shapes_net(rng):
    """PyTorch-style shape arithmetic (Shape, Gather, Unsqueeze, Concat, Reshape), Transpose,
    Squeeze/Unsqueeze, Split, Gather with constant indices, Pad, Identity, Dropout, Sub with
    the constant first, Neg, and a LeakyRelu."""
    g = G(rng)
    x = g.op("Identity", ["x"])
    x = g.op("Pad", [x, g.const([0, 0, 1, 0, 0, 0, 0, 2], np.int64), g.const(0.25)])  # (1,2,4,5)
    x = g.op("Transpose", [x], perm=[0, 2, 3, 1])  # (1, 4, 5, 2)
    sh = g.op("Shape", [x])
    b = g.op("Gather", [sh, g.const(0, np.int64)], axis=0)
    bu = g.op("Unsqueeze", [b, g.const([0], np.int64)])
    shape = g.op("Concat", [bu, g.const([-1], np.int64)], axis=0)
    f = g.op("Reshape", [x, shape])  # (1, 40)
    f = g.op("Dropout", [f])
    parts = g.op("Split", [f, g.const([15, 25], np.int64)], n_out=2, axis=1)
    p0 = g.op("Gather", [parts[0], g.const([3, 1, 1, 14, 0], np.int64)], axis=1)  # (1, 5)
    p1 = g.op("MatMul", [parts[1], g.rand(25, 5)])
    y = g.op("Sub", [g.const(np.linspace(-1, 1, 5)), g.op("Add", [p0, p1])])
    y = g.op("Neg", [g.op("LeakyRelu", [y], alpha=0.1)])
    y = g.op("Unsqueeze", [g.op("Squeeze", [y, g.const([0], np.int64)]), g.const([0], np.int64)])
    y = g.op("Gemm", [y, g.rand(5, 4), g.rand(4)])
    return g.model([("x", (1, 2, 3, 3))], [y])


def two_inputs(rng):
    """Two input tensors, concatenated and summed, two outputs."""
    g = G(rng)
    a = g.op("Gemm", ["u", g.rand(3, 4), g.rand(3)], transB=1)
    b = g.op("MatMul", ["v", g.rand(2, 3)])
    s = g.op("Relu", [g.op("Add", [a, b])])
    c = g.op("Concat", [s, g.op("Softplus", [b])], axis=1)
    y1 = g.op("Gemm", [c, g.rand(6, 2)])
    y2 = g.op("Elu", [g.op("Gemm", [s, g.rand(3, 2)])], alpha=0.5)
    return g.model([("u", (1, 4)), ("v", (1, 2))], [y1, y2])


def broadcast_net(rng):
    """MatMul by a constant over leading dimensions (a repeated, sparse layer), the constant
    on the left, Expand, Atan and HardSigmoid."""
    g = G(rng)
    x = g.op("Reshape", ["x", g.const([1, 3, 4], np.int64)])
    x = g.op("MatMul", [x, g.rand(4, 5)])  # (1, 3, 5)
    x = g.op("Atan", [x])
    x = g.op("MatMul", [g.rand(2, 3), x])  # (1, 2, 5)
    x = g.op("Expand", [g.op("Unsqueeze", [x, g.const([1], np.int64)]), g.const([1, 2, 1, 1], np.int64)])
    x = g.op("HardSigmoid", [x], alpha=0.2, beta=0.5)
    x = g.op("Flatten", [x])
    x = g.op("Gemm", [x, g.rand(20, 3), g.rand(3)])
    return g.model([("x", (1, 12))], [x])


def normalised(rng):
    """Input normalisation per channel (Sub, Div) folded into a Conv without padding, a
    scaling after a Relu folded into the next Gemm."""
    g = G(rng)
    x = g.op("Sub", ["x", g.const(rng.normal(size=(1, 2, 1, 1)))])
    x = g.op("Div", [x, g.const(rng.uniform(0.5, 2.0, size=(1, 2, 1, 1)))])
    x = g.op("Relu", [g.op("Conv", [x, g.rand(4, 1, 2, 2), g.rand(4)], group=2)])
    x = g.op("Mul", [g.op("Flatten", [x]), g.const(rng.uniform(0.5, 2.0, size=(1, 48)))])
    x = g.op("Gemm", [x, g.rand(3, 48), g.rand(3)], transB=1)
    return g.model([("x", (1, 2, 4, 5))], [x])


def elementary(rng):
    """sin, cos, exp, products and a quotient of data tensors, a constant subgraph with an
    activation (folded at load), a ReduceSum: x (1, 4) -> 3 outputs."""
    g = G(rng)

    def lin(n_out, scale=0.5):
        return g.op("Gemm", ["x", g.rand(n_out, 4, scale=scale), g.rand(n_out)], transB=1)

    s = g.op("Sin", [lin(5, 1.0)])
    c = g.op("Cos", [lin(5, 1.0)])
    p = g.op("Mul", [s, c])
    e = g.op("Exp", [lin(5, 0.3)])
    q = g.op("Div", [p, e])
    r = g.op("Relu", [lin(5)])
    k = g.op("Relu", [g.rand(1, 5)])  # constants only: folded
    m = g.op("Mul", [g.op("Add", [q, k]), r])
    t = g.op("ReduceSum", [g.op("Mul", [m, m]), g.const(np.array([1], np.int64), np.int64)],
             keepdims=1)
    h = g.op("Concat", [m, t], axis=1)
    return g.model([("x", (1, 4))], [g.op("Gemm", [h, g.rand(3, 6), g.rand(3)], transB=1)])


def powers(rng):
    """Pow by 2 and 3 (power-flow and throughput models: VNN-COMP 2023 ml4acopf, nn4sys) and
    a 1-D convolution: x (1, 2, 6) -> Conv1d (3 channels, kernel 3, stride 2, pads 1 and 0)
    -> Relu -> Flatten -> Gemm -> Pow 2 and Pow 3 (intervals across 0), Pow 3 of a Relu,
    Pow 1 -> Concat -> Gemm (2 outputs)."""
    g = G(rng)
    c = g.op("Relu", [g.op("Conv", ["x", g.rand(3, 2, 3), g.rand(3)], strides=[2],
                           pads=[1, 0])])
    h = g.op("Gemm", [g.op("Flatten", [c]), g.rand(4, 9), g.rand(4)], transB=1)
    two = g.op("Pow", [h, g.const(np.array(2.0))])
    three = g.op("Pow", [h, g.const(np.array(3.0))])
    pos = g.op("Pow", [g.op("Relu", [h]), g.const(np.array(3.0))])
    one = g.op("Pow", [h, g.const(np.array(1.0))])
    cat = g.op("Concat", [two, three, pos, one], axis=1)
    return g.model([("x", (1, 2, 6))], [g.op("Gemm", [cat, g.rand(2, 16), g.rand(2)], transB=1)])


def gelu(rng):
    """GELU and SiLU as PyTorch exports them (x -> Div sqrt 2 -> Erf -> Add 1 -> Mul x -> Mul
    0.5; ONNX has no Gelu before opset 20; Mul(x, Sigmoid(x))), fused at load, and a bare Erf:
    x (1, 4) -> Gemm -> GELU -> Gemm -> Erf, -> Gemm -> SiLU, -> Gemm -> HardSwish, and ->
    Gemm -> Mish (torch's legacy pattern) -> Concat -> Gemm (2 outputs)."""
    g = G(rng)
    h = g.op("Gemm", ["x", g.rand(6, 4, scale=1.0), g.rand(6)], transB=1)
    e = g.op("Erf", [g.op("Div", [h, g.const(np.array(1.4142135381698608))])])
    act = g.op("Mul", [g.op("Mul", [h, g.op("Add", [e, g.const(np.array(1.0))])]),
                       g.const(np.array(0.5))])
    k = g.op("Erf", [g.op("Gemm", [act, g.rand(3, 6, scale=1.0), g.rand(3)], transB=1)])
    q = g.op("Gemm", [act, g.rand(3, 6, scale=1.0), g.rand(3)], transB=1)
    silu = g.op("Mul", [g.op("Sigmoid", [q]), q])
    hs = g.op("HardSwish", [g.op("Gemm", [act, g.rand(3, 6, scale=3.0), g.rand(3)], transB=1)])
    r = g.op("Gemm", [act, g.rand(3, 6, scale=2.0), g.rand(3)], transB=1)
    mish = g.op("Mul", [r, g.op("Tanh", [g.op("Softplus", [r])])])
    cat = g.op("Concat", [k, silu, hs, mish], axis=1)
    return g.model([("x", (1, 4))], [g.op("Gemm", [cat, g.rand(2, 12), g.rand(2)], transB=1)])


def relu_forms(rng):
    """ReLUs in disguise (graph/onnx_relu_forms.py): x (1, 2, 4, 4) -> Conv -> Clip(0, 6)
    (ReLU6) -> Conv -> PRelu with per-channel slopes (one negative, one above 1) -> Flatten ->
    Gemm -> Abs -> Gemm -> Max with a constant and Min with another branch -> Gemm
    (2 outputs)."""
    g = G(rng)
    c = g.op("Conv", ["x", g.rand(3, 2, 3, 3, scale=1.0), g.rand(3)], pads=[1, 1, 1, 1])
    r6 = g.op("Clip", [c, g.const(np.array(0.0)), g.const(np.array(0.6))])
    c2 = g.op("Conv", [r6, g.rand(3, 3, 3, 3, scale=1.0), g.rand(3)], pads=[1, 1, 1, 1])
    p = g.op("PRelu", [c2, g.const(np.array([0.1, -0.4, 1.5]).reshape(3, 1, 1))])
    h = g.op("Gemm", [g.op("Flatten", [p]), g.rand(6, 48), g.rand(6)], transB=1)
    a = g.op("Abs", [h])
    k1 = g.op("Gemm", [a, g.rand(4, 6), g.rand(4)], transB=1)
    k2 = g.op("Gemm", [h, g.rand(4, 6), g.rand(4)], transB=1)
    m = g.op("Min", [g.op("Max", [k1, g.const(np.array([0.1, -0.2, 0.0, 0.3]))]), k2])
    return g.model([("x", (1, 2, 4, 4))], [g.op("Gemm", [m, g.rand(2, 4), g.rand(2)],
                                                transB=1)])


def floors(rng):
    """Floor of data (VNN-COMP 2024 ml4acopf's range reduction): x (1, 4) -> Gemm -> Floor of
    3 times it, and the range reduction ``h - 2 floor(h / 2)`` -> Concat with h -> Gemm."""
    g = G(rng)
    h = g.op("Gemm", ["x", g.rand(4, 4, scale=1.0), g.rand(4)], transB=1)
    steps = g.op("Floor", [g.op("Mul", [h, g.const(np.array(3.0))])])
    period = g.op("Mul", [g.op("Floor", [g.op("Div", [h, g.const(np.array(2.0))])]),
                          g.const(np.array(2.0))])
    cat = g.op("Concat", [steps, g.op("Sub", [h, period]), h], axis=1)
    return g.model([("x", (1, 4))], [g.op("Gemm", [cat, g.rand(2, 12), g.rand(2)], transB=1)])


def generator(rng):
    """A small image generator as the VNN-COMP cgan networks: Gemm -> Reshape to an image ->
    ConvTranspose (stride 2, uneven pads, output_padding) -> BatchNorm (folded) -> Relu ->
    Resize nearest x2 along the height -> dilated ConvTranspose -> Relu -> Gemm."""
    g = G(rng)
    x = g.op("Gemm", ["x", g.rand(8, 4), g.rand(8)], transB=1)
    x = g.op("Reshape", [x, g.const([1, 2, 2, 2], np.int64)])
    x = g.op("ConvTranspose", [x, g.rand(2, 4, 3, 3), g.rand(4)], strides=[2, 2],
             pads=[1, 0, 0, 1], output_padding=[1, 0])  # (1, 4, 5, 4)
    x = g.op("BatchNormalization", [x, g.const(rng.uniform(0.5, 1.5, 4)), g.rand(4),
                                    g.rand(4), g.const(rng.uniform(0.5, 2.0, 4))])
    x = g.op("Relu", [x])
    x = g.op("Resize", [x, "", g.const([1, 1, 2, 1])], mode="nearest")  # (1, 4, 10, 4)
    x = g.op("ConvTranspose", [x, g.rand(4, 2, 2, 2), g.rand(2)], dilations=[2, 1],
             strides=[1, 2], pads=[1, 1, 1, 0])  # (1, 2, 10, 7)
    x = g.op("Relu", [x])
    x = g.op("Gemm", [g.op("Flatten", [x]), g.rand(3, 140, scale=0.1), g.rand(3)], transB=1)
    return g.model([("x", (1, 4))], [x])


def attention(rng):
    """One self-attention head on 4 tokens of 3 features: Q K^T (a MatMul of two data
    tensors), Softmax along the last axis inside the graph, times V, a residual, a Gemm."""
    g = G(rng)
    q, k, v = (g.op("MatMul", ["x", g.rand(3, 3)]) for _ in range(3))
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 2, 1])])
    a = g.op("Softmax", [s], axis=-1)
    o = g.op("Add", [g.op("MatMul", [a, v]), "x"])
    f = g.op("Flatten", [o], axis=1)
    return g.model([("x", (1, 4, 3))], [g.op("Gemm", [f, g.rand(2, 12), g.rand(2)], transB=1)])


def inception(rng):
    """An inception block: x (1, 2, 6, 6) -> Conv -> Relu -> three branches (a 1x1 Conv, a
    3x3 Conv, a 3x3 AveragePool counting the padding: a convolution by 1/9 per channel)
    concatenated along the channels -> Relu -> Conv stride 2 -> Relu -> Flatten -> Gemm."""
    g = G(rng)
    x = g.op("Relu", [g.op("Conv", ["x", g.rand(4, 2, 3, 3), g.rand(4)], pads=[1, 1, 1, 1])])
    b1 = g.op("Conv", [x, g.rand(3, 4, 1, 1), g.rand(3)])
    b3 = g.op("Conv", [x, g.rand(2, 4, 3, 3), g.rand(2)], pads=[1, 1, 1, 1])
    ap = g.op("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
              count_include_pad=1)
    x = g.op("Relu", [g.op("Concat", [b1, b3, ap], axis=1)])
    x = g.op("Relu", [g.op("Conv", [x, g.rand(4, 9, 3, 3), g.rand(4)], strides=[2, 2])])
    x = g.op("Gemm", [g.op("Flatten", [x]), g.rand(3, 16), g.rand(3)], transB=1)
    return g.model([("x", (1, 2, 6, 6))], [x])


def mobile(rng):
    """MobileNetV2's pieces, biased so that many ReLUs are inactive: x (1, 3, 8, 8) -> Conv ->
    Relu -> Add of a constant (a scaling with a constant: not folded into the padded Conv
    after it) -> Conv -> Clip(0, 6) -> depthwise Conv (group 6) -> Clip(0, 6) -> 1x1 Conv ->
    Add of the block's input (a residual without activation) -> Flatten -> Gemm."""
    g = G(rng)
    c = g.op("Conv", ["x", g.rand(4, 3, 3, 3, scale=0.3), g.const(rng.normal(-0.4, 0.3, 4))],
             pads=[1, 1, 1, 1])
    r = g.op("Add", [g.op("Relu", [c]), g.const(rng.normal(0.0, 0.2, (4, 1, 1)))])
    e = g.op("Conv", [r, g.rand(6, 4, 3, 3, scale=0.3), g.const(rng.normal(-0.5, 0.3, 6))],
             pads=[1, 1, 1, 1])
    e = g.op("Clip", [e, g.const(np.array(0.0)), g.const(np.array(0.6))])
    d = g.op("Conv", [e, g.rand(6, 1, 3, 3, scale=0.5), g.const(rng.normal(-0.3, 0.3, 6))],
             group=6, pads=[1, 1, 1, 1])
    d = g.op("Clip", [d, g.const(np.array(0.0)), g.const(np.array(0.6))])
    p = g.op("Conv", [d, g.rand(4, 6, 1, 1), g.rand(4)])
    h = g.op("Flatten", [g.op("Add", [p, r])])
    return g.model([("x", (1, 3, 8, 8))], [g.op("Gemm", [h, g.rand(3, 256, scale=0.1), g.rand(3)],
                                                transB=1)])


BUILDERS = {"dense": dense_chain, "conv": conv_net, "residual": residual, "shapes": shapes_net,
            "relu_residual": relu_residual,
            "two_inputs": two_inputs, "broadcast": broadcast_net, "normalised": normalised,
            "conv_maxpool": lambda rng: conv_net(rng, pool="MaxPool"),
            "conv_tanh": lambda rng: conv_net(rng, act="Tanh", bn=False),
            "elementary": elementary, "generator": generator, "attention": attention,
            "powers": powers, "floors": floors, "gelu": gelu, "relu_forms": relu_forms,
            "inception": inception, "mobile": mobile}
