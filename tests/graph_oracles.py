"""Exact oracles on small graph networks (tests only): the minimum of a linear function of the
output over a box by MILP (ReLU and max pool nodes, big-M; every affine operation as the dense
matrix its forward map gives on the unit vectors), and the graph as an onnx.reference run."""
import numpy as np

from oracles import _Builder


def dense_of(op, n_in):
    """The matrices [A_1, ..., A_k] (m, n_j) and bias (m,) of an affine operation."""
    mats = []
    for j, n in enumerate(n_in):
        eye = [np.zeros((n, n_)) for n_ in n_in]  # n points: unit vectors of input j
        eye[j] = np.eye(n)
        zero = op.forward([np.zeros((1, n_)) for n_ in n_in])[0]
        mats.append((op.forward(eye) - zero).T)
    bias = op.forward([np.zeros((1, n_)) for n_ in n_in])[0]
    return mats, bias


def _intervals(graph, lo, hi):
    """Interval bounds of every node (float64, widened by 1e-9 relative: an oracle's bounds)."""
    L, U = [None] * len(graph.nodes), [None] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        if n.kind == "input":
            sl = slice(n.op.offset, n.op.offset + n.op.size)
            L[i], U[i] = lo[sl].copy(), hi[sl].copy()
        elif n.kind == "activation":
            assert n.op.name == "relu", "the MILP oracle encodes ReLU and max pool only"
            p = n.inputs[0]
            L[i], U[i] = np.maximum(L[p], 0.0), np.maximum(U[p], 0.0)
        elif n.kind == "maxpool":
            p = n.inputs[0]
            w = n.op.windows
            lw = np.where(w < 0, -np.inf, L[p][np.maximum(w, 0)])
            uw = np.where(w < 0, -np.inf, U[p][np.maximum(w, 0)])
            L[i], U[i] = lw.max(axis=1), uw.max(axis=1)
        else:
            mats, bias = dense_of(n.op, [graph.nodes[j].size for j in n.inputs])
            c = bias.copy()
            r = np.zeros_like(bias)
            for A, j in zip(mats, n.inputs):
                c += A @ (0.5 * (L[j] + U[j]))
                r += np.abs(A) @ (0.5 * (U[j] - L[j]))
            pad = 1e-9 * (np.abs(c) + r + 1.0)
            L[i], U[i] = c - r - pad, c + r + pad
    return L, U


def graph_min(graph, lo, hi, row, time_limit=60.0):
    """(minimum, x) of ``row @ f(x)`` over the box [lo, hi] by MILP (HiGHS), or raises when
    the solver did not prove optimality. ``minimum`` is the solver's optimum (tolerance ~1e-7
    relative); x its input point."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    L, U = _intervals(graph, lo, hi)
    B = _Builder()
    var = [None] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        var[i] = B.add_vars(L[i], U[i])
        if n.kind == "input":
            continue
        if n.kind == "activation":
            p = n.inputs[0]
            for k in range(n.size):
                a, z, l, u = var[i][k], var[p][k], L[p][k], U[p][k]
                if u <= 0:
                    B.add_row([a], [1.0], 0.0, 0.0)
                elif l >= 0:
                    B.add_row([a, z], [1.0, -1.0], 0.0, 0.0)
                else:
                    s = B.add_vars(0.0, 1.0, integer=True)[0]
                    B.add_row([a, z], [1.0, -1.0], 0.0, np.inf)  # a >= z
                    B.add_row([a, s], [1.0, -u], -np.inf, 0.0)  # a <= u s
                    B.add_row([a, z, s], [1.0, -1.0, -l], -np.inf, -l)  # a <= z - l (1 - s)
        elif n.kind == "maxpool":
            p = n.inputs[0]
            for k, win in enumerate(n.op.windows):
                win = win[win >= 0]
                y = var[i][k]
                ss = B.add_vars(np.zeros(win.size), np.ones(win.size), integer=True)
                for q, s in zip(win, ss):
                    B.add_row([y, var[p][q]], [1.0, -1.0], 0.0, np.inf)  # y >= x_q
                    M = U[i][k] - L[p][q]  # y <= x_q + M (1 - s)
                    B.add_row([y, var[p][q], s], [1.0, -1.0, M], -np.inf, M)
                B.add_row(ss, np.ones(win.size), 1.0, 1.0)
        else:
            mats, bias = dense_of(n.op, [graph.nodes[j].size for j in n.inputs])
            for k in range(n.size):
                cols, coefs = [var[i][k]], [1.0]
                for A, j in zip(mats, n.inputs):
                    nz = np.flatnonzero(A[k])
                    cols += list(var[j][nz])
                    coefs += list(-A[k][nz])
                B.add_row(cols, coefs, bias[k], bias[k])
    cost = np.zeros(B.nvar)
    cost[var[graph.output]] = row
    res = B.solve_milp(cost, time_limit)
    if res.status != 0:
        raise RuntimeError(f"MILP not solved: {res.message}")
    xs = np.concatenate([res.x[var[i]] for i in graph.inputs])
    return float(res.fun), np.clip(xs, lo, hi)


def onnx_outputs(model, x, input_shapes):
    """The ONNX model's outputs at the flat input x (inputs in order, each row-major),
    concatenated, by onnx.reference (float32)."""
    from onnx.reference import ReferenceEvaluator

    feeds, at = {}, 0
    for inp, shape in zip(model.graph.input, input_shapes):
        size = int(np.prod(shape))
        feeds[inp.name] = np.asarray(x[at:at + size], np.float32).reshape(shape)
        at += size
    outs = ReferenceEvaluator(model).run(None, feeds)
    return np.concatenate([np.asarray(o, np.float64).reshape(-1) for o in outs])
