"""Node patterns fused into one node at load, where one node has a much tighter relaxation than
its parts.

GELU: PyTorch exports ``nn.GELU()`` (before ONNX opset 20 has ``Gelu``) as
``Mul(Mul(h, Add(Erf(Div(h, c)), 1)), 0.5)`` with c = float32(sqrt 2) (or ``Mul(h, s)`` in
place of the division; either operand order of each ``Add`` and ``Mul``). Bounded as written,
the product of h with ``1 + erf(h / c)`` takes McCormick's planes: on h in [-1, 2] the output's
interval is [-1.42, 2.11] where GELU's range is [-0.17, 1.95]. Fused, it is one ``Gelu``
node, ``h (1 + erf(s h)) / 2`` with s = 1 / c (or the multiplier) as a float64
(engine/relaxations/self_gated.py; 1 / c rounded moves erf's argument by half an ulp, within the
lines' slack). SiLU: PyTorch exports ``nn.SiLU()`` as ``Mul(h, Sigmoid(h))`` (a product of data, McCormick's
planes again); fused, one ``Swish`` node, ``h sigmoid(h)`` (ONNX opset 24's operator of that
name, whose ``alpha`` it also reads). Mish: PyTorch's TorchScript exporter writes
``Mul(h, Tanh(Softplus(h)))``; fused, one ``Mish`` node. A pattern whose intermediate values
are read elsewhere (or are graph outputs) stays as written. Softplus: torch's default
exporter writes ``Where(Greater(h, 20), h, Softplus(h))`` (its threshold); fused, one node
whose relaxation allows for the jump at 20 (engine/relaxations/extra.py). GELU's tanh form:
torch's TorchScript exporter (opset < 20) writes ``nn.GELU(approximate='tanh')`` as
``Mul(Mul(h, Add(1, Tanh(Mul(k, Add(h, Mul(c, Mul(h, Mul(h, h)))))))), 0.5)`` with k and c
float32's sqrt(2 / pi) and 0.044715 (``Pow(h, 3)`` for the cube and ``Mul(Mul(h, 0.5), ...)``
are taken too, either operand order); fused, one ``Gelu`` with approximate='tanh' whose
attribute ``allowance`` (text) bounds how far the chain with the file's k and c is from the
tanh form with the true ones (:func:`gelu_tanh_allowance`, about 1e-8): the lines and the
range are widened by it. Only where k and c are within one float32 ulp of the true
constants.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import math

import numpy as np

from crown_cli.graph.onnx_ops import FUSED_DOMAIN  # nodes that are no ONNX operator

STANDARD = ("", "ai.onnx")
# GELU's tanh form's constants, as engine/relaxations/self_gated.py has them
SQRT_2_OVER_PI = 0.7978845608028654
CUBE = 0.044715
FLOAT32_ULP = 2.0 ** -23  # float32's relative spacing, at most


def gelu_tanh_allowance(k: float, c: float) -> float:
    """A bound on ``|z sigmoid(2 k (z + c z^3)) - z sigmoid(2 K (z + C z^3))|`` over every
    real z (K, C: SQRT_2_OVER_PI, CUBE; k, c > 0 near them). With y, y' the two arguments
    (z's sign, |y|, |y'| >= 2 min(k, K) |z|) and sigmoid' <= e^-|t|, the difference is at
    most ``|z| |y' - y| e^(-q |z|)``, q = 2 min(k, K), and ``|y' - y| <= 2 d1 |z| + 2 d3
    |z|^3`` (d1 = |k - K|, d3 = |k c - K C|); r^2 e^(-q r) peaks at (2 / q)^2 e^-2 and
    r^4 e^(-q r) at (4 / q)^4 e^-4. The float arithmetic's errors (and the float K and C's
    from the real constants, 1e-17) are covered by 1e-15 added to d1, d3 and a relative
    1e-9 on the sum."""
    d1 = abs(k - SQRT_2_OVER_PI) + 1e-15
    d3 = abs(k * c - SQRT_2_OVER_PI * CUBE) + 1e-15
    q = 2.0 * min(k, SQRT_2_OVER_PI)
    peak2 = (2.0 / q) ** 2 * math.exp(-2.0)
    peak4 = (4.0 / q) ** 4 * math.exp(-4.0)
    return 2.0 * (d1 * peak2 + d3 * peak4) * (1.0 + 1e-9)


def _near(v: Optional[float], true: float) -> bool:
    return v is not None and abs(v - true) <= FLOAT32_ULP * true


def _scalars(graph, numpy_helper) -> Dict[str, float]:
    """The one-element constants (initializers and Constant nodes) by tensor name."""
    vals: Dict[str, float] = {}
    for init in graph.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) == 1:
            vals[init.name] = float(numpy_helper.to_array(init).reshape(-1)[0])
    for node in graph.node:
        if node.op_type != "Constant" or len(node.output) != 1:
            continue
        for a in node.attribute:
            if a.name == "value" and int(np.prod(a.t.dims, dtype=np.int64)) == 1:
                vals[node.output[0]] = float(numpy_helper.to_array(a.t).reshape(-1)[0])
            elif a.name == "value_float":
                vals[node.output[0]] = float(a.f)
    return vals


def fuse_activations(onnx, numpy_helper, graph) -> int:
    """Replace, in place, every PyTorch GELU pattern of ``graph`` (a GraphProto) by one node
    ``Gelu`` (attribute ``scale``: s as text, since float attributes are float32) at the
    final ``Mul``'s place, every SiLU and Mish pattern by one ``Swish`` or ``Mish`` node
    at its ``Mul``'s, and GELU's tanh chain by one ``Gelu`` with approximate='tanh' (and
    ``allowance``) at its last ``Mul``'s. Returns how many."""
    nodes = list(graph.node)
    outputs = {o.name for o in graph.output}
    readers: Dict[str, List[int]] = {}
    producer: Dict[str, int] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            readers.setdefault(name, []).append(i)
        for name in n.output:
            producer[name] = i
    consts = _scalars(graph, numpy_helper)

    def only_reader(name: str) -> Optional[int]:
        r = readers.get(name, [])
        return r[0] if len(r) == 1 and name not in outputs else None

    def split(node, known: str):
        """The input of a two-input node that is not ``known`` (None if neither or both)."""
        if len(node.input) != 2 or node.domain not in STANDARD:
            return None
        a, b = node.input
        if a == known and b != known:
            return b
        if b == known and a != known:
            return a
        return None

    def scalar_operand(node):
        """(data input, constant) of a two-input node with one scalar constant operand."""
        if len(node.input) != 2 or node.domain not in STANDARD:
            return None, None
        a, b = node.input
        if b in consts and a not in consts:
            return a, consts[b]
        if a in consts and b not in consts and node.op_type != "Div":
            return b, consts[a]
        return None, None

    drop, fused = set(), {}
    for i, erf in enumerate(nodes):
        if erf.op_type != "Erf" or erf.domain not in STANDARD or erf.input[0] not in producer:
            continue
        j = producer[erf.input[0]]
        pre = nodes[j]
        if pre.op_type not in ("Div", "Mul") or only_reader(pre.output[0]) != i:
            continue
        h, c = scalar_operand(pre)
        if h is None or not np.isfinite(c) or c <= 0.0:
            continue
        s = 1.0 / c if pre.op_type == "Div" else c
        k = only_reader(erf.output[0])
        if k is None or nodes[k].op_type != "Add":
            continue
        one = split(nodes[k], erf.output[0])
        if consts.get(one) != 1.0:
            continue
        m1 = only_reader(nodes[k].output[0])
        if m1 is None or nodes[m1].op_type != "Mul" or split(nodes[m1], nodes[k].output[0]) != h:
            continue
        m2 = only_reader(nodes[m1].output[0])
        if m2 is None or nodes[m2].op_type != "Mul":
            continue
        if consts.get(split(nodes[m2], nodes[m1].output[0])) != 0.5:
            continue
        drop.update((j, i, k, m1))
        fused[m2] = onnx.helper.make_node("Gelu", [h], [nodes[m2].output[0]],
                                          name=(nodes[m2].name or f"node{m2}") + "/gelu",
                                          scale=repr(float(s)))  # float64: as text

    for i, sig in enumerate(nodes):  # SiLU: Mul(h, Sigmoid(h))
        if sig.op_type != "Sigmoid" or sig.domain not in STANDARD or i in drop:
            continue
        m = only_reader(sig.output[0])
        if m is None or m in fused or m in drop or nodes[m].op_type != "Mul" or \
                split(nodes[m], sig.output[0]) != sig.input[0]:
            continue
        drop.add(i)
        fused[m] = onnx.helper.make_node("Swish", [sig.input[0]], [nodes[m].output[0]],
                                         name=(nodes[m].name or f"node{m}") + "/silu")
    for i, tanh in enumerate(nodes):  # Mish: Mul(h, Tanh(Softplus(h)))
        if tanh.op_type != "Tanh" or tanh.domain not in STANDARD or i in drop or \
                tanh.input[0] not in producer:
            continue
        j = producer[tanh.input[0]]
        sp = nodes[j]
        if sp.op_type != "Softplus" or sp.domain not in STANDARD or only_reader(sp.output[0]) != i:
            continue
        m = only_reader(tanh.output[0])
        if m is None or m in fused or m in drop or nodes[m].op_type != "Mul" or \
                split(nodes[m], tanh.output[0]) != sp.input[0]:
            continue
        drop.update((i, j))
        fused[m] = onnx.helper.make_node("Mish", [sp.input[0]], [nodes[m].output[0]],
                                         name=(nodes[m].name or f"node{m}") + "/mish")
    for i, tanh in enumerate(nodes):  # GELU's tanh form (module docstring)
        if tanh.op_type != "Tanh" or tanh.domain not in STANDARD or i in drop:
            continue
        hit = _gelu_tanh_chain(nodes, i, producer, only_reader, split, scalar_operand, consts)
        if hit is None or any(j in drop or j in fused for j in hit[1]):
            continue
        h, parts, last, k, c = hit
        drop.update(parts)
        fused[last] = onnx.helper.make_node(
            "Gelu", [h], [nodes[last].output[0]], name=(nodes[last].name or f"node{last}")
            + "/gelu_tanh", approximate="tanh", allowance=repr(gelu_tanh_allowance(k, c)))
    for i, where in enumerate(nodes):  # torch's Softplus: Where(Greater(h, T), h, Softplus(h))
        if where.op_type != "Where" or where.domain not in STANDARD or len(where.input) != 3 \
                or i in drop:
            continue
        cond, h, other = where.input
        if cond not in producer or other not in producer:
            continue
        gi, si = producer[cond], producer[other]
        gt, sp = nodes[gi], nodes[si]
        if gt.op_type != "Greater" or sp.op_type != "Softplus" or list(sp.input) != [h] or \
                len(gt.input) != 2 or gt.input[0] != h or gt.input[1] not in consts or \
                only_reader(cond) != i or only_reader(other) != i or gi in drop or si in drop:
            continue
        T = consts[gt.input[1]]
        if not (np.isfinite(T) and T >= 0.0):
            continue
        drop.update((gi, si))
        fused[i] = onnx.helper.make_node("SoftplusThreshold", [h], [where.output[0]],
                                         name=(where.name or f"node{i}") + "/softplus",
                                         domain=FUSED_DOMAIN, threshold=repr(float(T)))
    if not fused:
        return 0
    kept = [fused.get(i, n) for i, n in enumerate(nodes) if i not in drop]
    del graph.node[:]
    graph.node.extend(kept)
    return len(fused)


def _gelu_tanh_chain(nodes, t, producer, only_reader, split, scalar_operand, consts):
    """``(h, parts, last, k, c)`` where the Tanh node ``t`` is the middle of GELU's tanh
    form of h (module docstring): the nodes to drop (``parts``), the one the fused node
    replaces (``last``) and the file's constants; None where it is not, or where a value
    in it is read elsewhere."""
    def made_by(name, op_type, reader):
        """The node producing ``name``, of ``op_type`` and read by ``reader`` only."""
        j = producer.get(name)
        if j is None or nodes[j].op_type != op_type or only_reader(name) != reader:
            return None
        return j

    tanh = nodes[t]
    p = made_by(tanh.input[0], "Mul", t)
    if p is None:
        return None
    inner, k = scalar_operand(nodes[p])
    if inner is None or not _near(k, SQRT_2_OVER_PI):
        return None
    a0 = made_by(inner, "Add", p)
    if a0 is None or len(nodes[a0].input) != 2:
        return None
    for h, m2_out in (tuple(nodes[a0].input), tuple(nodes[a0].input)[::-1]):
        m2 = made_by(m2_out, "Mul", a0)
        if m2 is None:
            continue
        cube_out, c = scalar_operand(nodes[m2])
        if cube_out is None or not _near(c, CUBE):
            continue
        cube = _cube_of(nodes, cube_out, h, m2, made_by, split, consts)
        if cube is not None:
            break
    else:
        return None
    # forward: Add(1, tanh), then h times it and 0.5 (either grouping)
    a1 = only_reader(tanh.output[0])
    if a1 is None or nodes[a1].op_type != "Add" or consts.get(split(nodes[a1],
                                                                     tanh.output[0])) != 1.0:
        return None
    m4 = only_reader(nodes[a1].output[0])
    if m4 is None or nodes[m4].op_type != "Mul":
        return None
    other = split(nodes[m4], nodes[a1].output[0])
    body = [p, a0, m2, a1, *cube]
    if other == h:  # Mul(Mul(h, a1), 0.5)
        m5 = only_reader(nodes[m4].output[0])
        if m5 is None or nodes[m5].op_type != "Mul" or \
                consts.get(split(nodes[m5], nodes[m4].output[0])) != 0.5:
            return None
        return h, body + [t, m4], m5, k, c
    half = made_by(other, "Mul", m4)  # Mul(Mul(h, 0.5), a1)
    if half is None or scalar_operand(nodes[half]) != (h, 0.5):
        return None
    return h, body + [t, half], m4, k, c


def _cube_of(nodes, name, h, reader, made_by, split, consts):
    """The nodes computing ``name`` = h^3 (``Pow(h, 3)``, ``Mul(h, Mul(h, h))`` in either
    order), each read only on the way, or None."""
    j = made_by(name, "Pow", reader)
    if j is not None:
        x, e = nodes[j].input if len(nodes[j].input) == 2 else (None, None)
        return [j] if x == h and consts.get(e) == 3.0 else None
    j = made_by(name, "Mul", reader)
    if j is None:
        return None
    sq_out = split(nodes[j], h)
    sq = None if sq_out is None else made_by(sq_out, "Mul", j)
    if sq is None or list(nodes[sq].input) != [h, h]:
        return None
    return [j, sq]
