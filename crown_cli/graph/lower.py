"""Chain-shaped graphs lowered to the dense engine: a :class:`~crown_cli.network.MLP` equal to a
:class:`~crown_cli.graph.network.Graph`, so every method of the dense engine (alpha-CROWN,
branch and bound, the whole ``crown verify`` pipeline, every ``certify`` method) runs on it.

**Which graphs.** One input tensor, nodes in one chain (every node read by the next one only,
no branches, no max pool), the activation nodes all of one type and parameter. The affine
nodes between two activations (a *segment*: Conv, Gemm, an average pool, index maps such as
Flatten or Pad, scalings) are one linear map, written as a dense matrix; the weights of all
segments together must take at most :data:`BUDGET_SHARE` of the memory budget as float64
(``--memory-budget``, default :data:`crown_cli.graph.onnx_file.MEMORY_BUDGET`). Otherwise
:func:`lower` returns None with the reason, and the graph stays on the graph engine.

**Exactness (the lowering is sound because it changes no number).** The MLP computes exactly
the graph's function as loaded (real arithmetic on the same float64 coefficients):

- One operation's matrix is read off the operation: a ``Dense`` weight is copied, an index
  map's is its 0/1 selection, a scaling's its diagonal, any other operation's (a Conv) comes
  from pushing unit vectors through its bias-free ``linear`` map (or identity rows through its
  ``transpose``, whichever side is smaller, in chunks). With one nonzero input, every output
  element is one product ``w * 1`` plus exact zeros: a copy of a weight. Its bias is copied.
- Two operations of a segment are composed only where every composed entry is **one product**
  (the sparse path count is at most 1: no sums of products) of which **one factor is a power
  of two** (an average pool's 1/16, an index map's 1), with a nonzero, finite, **normal**
  result: such a product only shifts the exponent, so it is exact. The bias ``A b_1 + b_2``
  likewise: each element at most one product of that kind, and the sum with ``b_2`` checked
  exact by TwoSum (its rounding error computed exactly, required 0).
- Anything else (a sum of two products, e.g. an overlapping average pool followed by a Gemm,
  a convolution's bias through an average pool, a 1/9 pool, a normalisation into a padded
  convolution, an underflow) is not lowered: :class:`NotExact`, and the graph keeps the graph
  engine, whose bounds charge the rounding of every operation. No allowance is carried.

The graph loader's own folding (a BatchNormalization into a Conv, an input normalisation into
the first layer) is float64 arithmetic on the weights, as before; the lowering is exact with
respect to the loaded graph, which the graph engine bounds too.

The MLP's input is the graph's flat input (VNN-LIB's X_i order: an ONNX (1, C, H, W) input
channel-first), not crown's (H, W, C) image order: ``certify`` converts images with
:func:`crown_cli.certification.graph_certifier.to_graph_layout`, as on the graph engine.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import scipy.sparse as sp

from crown_cli.activations import ACTIVATIONS, param_ok, param_range, range_text
from crown_cli.graph.ops import Dense, IndexMap, Scale

# the lowered weights (float64) may take at most this share of the memory budget: the dense
# engine keeps float32 copies, transposes and per-batch rows beside them
BUDGET_SHARE = 0.25
# bytes of one chunk of unit vectors (or identity rows) pushed through an operation
CHUNK_BYTES = 64 * 2 ** 20
TINY = np.finfo(np.float64).tiny  # the smallest normal float64


class NotExact(Exception):
    """A composition of two operations whose entries are not all proven exact."""


def lower(graph, memory_budget: Optional[float] = None):
    """``(mlp, None)``: an :class:`~crown_cli.network.MLP` whose function is exactly the
    graph's, or ``(None, reason)`` when the graph is not a chain of affine segments between
    activations of one type, a composition is not proven exact, or the dense weights pass
    :data:`BUDGET_SHARE` of ``memory_budget`` (bytes; None: the default budget)."""
    from crown_cli.graph.onnx_file import MEMORY_BUDGET
    from crown_cli.network import MLP

    budget = MEMORY_BUDGET if memory_budget is None else float(memory_budget)
    order, why = chain_order(graph)
    if order is None:
        return None, why
    acts = [i for i in order if graph.nodes[i].kind == "activation"]
    kinds = {(graph.nodes[i].op.name, graph.nodes[i].op.alpha) for i in acts}
    if len(kinds) > 1:
        return None, "activations of several types (" + ", ".join(
            sorted({k[0] for k in kinds})) + ")"
    graph_only = sorted(k[0] for k in kinds if not ACTIVATIONS[k[0]].mlp)
    if graph_only:
        return None, f"{graph_only[0]} is a graph node only (no MLP activation)"
    for name, alpha in kinds:  # e.g. ELU with scale above 1 (ONNX Selu): graph nodes only
        rng = param_range(name)
        if rng is not None and alpha is not None and not param_ok(rng, float(alpha)):
            return None, (f"{name} with alpha {float(alpha):g} is a graph node only (an MLP's "
                          f"alpha is in {range_text(rng)})")
    # segments: the affine nodes before the first activation, between two, after the last
    segs: List[List[int]] = [[]]
    for i in order[1:]:
        if graph.nodes[i].kind == "activation":
            segs.append([])
        else:
            segs[-1].append(i)
    ends_in_activation = graph.nodes[graph.output].kind == "activation"
    if ends_in_activation:
        segs.pop()  # the output activation follows the last layer
    sizes = [graph.input_size]
    for k in range(len(segs)):
        sizes.append(graph.nodes[segs[k][-1]].size if segs[k] else sizes[-1])
    dense_bytes = 8 * sum(sizes[k] * sizes[k + 1] for k in range(len(segs)))
    if dense_bytes > BUDGET_SHARE * budget:
        return None, (f"its dense layers ({'-'.join(map(str, sizes))}) would take "
                      f"{dense_bytes / 2 ** 30:.3g} GiB, over {BUDGET_SHARE:g} of the memory "
                      f"budget of {budget / 2 ** 30:g} GiB (--memory-budget)")
    weights, biases, names = [], [], []
    for k, seg in enumerate(segs):
        try:
            W, b = segment_matrix(graph, seg, sizes[k])
        except NotExact as exc:
            names_k = "+".join(graph.nodes[i].name for i in seg)
            return None, f"composing {names_k} is not exact ({exc})"
        if not (np.all(np.isfinite(W)) and np.all(np.isfinite(b))):
            return None, f"segment {k} has non-finite coefficients"
        weights.append(W)
        biases.append(b)
        dense = [i for i in seg if isinstance(graph.nodes[i].op, Dense)]
        names.append(graph.nodes[(dense or seg)[0]].name if seg else "identity")
    name, alpha = next(iter(kinds)) if kinds else ("relu", None)
    return MLP(weights, biases, activation=name, source=graph.source, layer_names=names,
               alpha=alpha, output_activation=name if ends_in_activation else None), None


def lowered(graph, memory_budget: Optional[float] = None):
    """The graph's lowered MLP or None, computed once (:func:`lower`; ``memory_budget`` in
    bytes, used by the first call) and kept in ``graph.lowering`` with the reason."""
    if getattr(graph, "lowering", None) is None:
        graph.lowering = lower(graph, memory_budget)
    return graph.lowering[0]


def chain_order(graph, kinds=("affine", "activation")) -> Tuple[Optional[List[int]], str]:
    """The node ids from the input to the output when the graph is one chain of nodes of
    ``kinds`` (default: affine and activation nodes), else ``(None, reason)``."""
    if len(graph.inputs) != 1:
        return None, f"{len(graph.inputs)} input tensors"
    cur = graph.inputs[0]
    order = [cur]
    while cur != graph.output:
        readers = graph.consumers[cur]
        if len(readers) != 1:
            return None, f"node {cur} ({graph.nodes[cur].name}) is read by {len(readers)} nodes"
        nxt = readers[0]
        if tuple(graph.nodes[nxt].inputs) != (cur,):
            return None, f"node {nxt} ({graph.nodes[nxt].name}) reads several values"
        cur = nxt
        order.append(cur)
    if graph.consumers[cur] or len(order) != len(graph.nodes):
        return None, "not one chain from the input to the output"
    for i in order[1:]:
        n = graph.nodes[i]
        if n.kind not in kinds:
            return None, f"node {i} ({n.name}) is a {n.kind}"
    return order, ""


def segment_matrix(graph, seg: List[int], n_in: int) -> Tuple[np.ndarray, np.ndarray]:
    """(W, b) float64, dense: the affine map of the nodes ``seg`` in order (the identity when
    empty), each entry proven exact (:class:`NotExact` otherwise)."""
    if not seg:
        return np.eye(n_in), np.zeros(n_in)
    if len(seg) == 1:
        W, b = op_matrix(graph.nodes[seg[0]].op, n_in)
        return (W.toarray() if sp.issparse(W) else np.array(W, dtype=np.float64)), b
    M, b = op_matrix(graph.nodes[seg[0]].op, n_in)
    M = _csr(M)
    for i in seg[1:]:
        A, a = op_matrix(graph.nodes[i].op, M.shape[0])
        M, b = compose(_csr(A), a, M, b)
    return M.toarray(), b


def op_matrix(op, n_in: int):
    """(matrix, bias) of one affine operation of one input: an ndarray or a scipy CSR matrix
    (m, n_in) whose entries are copies of the operation's coefficients, and the bias (m,)
    (zeros when it has none)."""
    m = int(op.size)
    bias = np.zeros(m) if op.bias is None else np.array(op.bias, dtype=np.float64)
    if isinstance(op, Dense):
        return (op.W.copy() if op.sparse else np.array(op.W)), bias
    if isinstance(op, IndexMap):
        rows = np.flatnonzero(op.valid)
        return sp.csr_matrix((np.ones(rows.size), (rows, op.cols)), shape=(m, n_in)), bias
    if isinstance(op, Scale):
        return sp.diags(op.a).tocsr(), bias
    if len(op.n_in) != 1:
        raise NotExact(f"{type(op).__name__} reads several values")
    return _pushed(op, n_in, m), bias


def _pushed(op, n_in: int, m: int) -> np.ndarray:
    """The dense matrix of a linear map from unit vectors through ``op.linear`` (columns) or
    identity rows through ``op.transpose`` (rows), the smaller side, in chunks."""
    W = np.empty((m, n_in))
    if n_in <= m:
        step = max(1, CHUNK_BYTES // (8 * (m + n_in)))
        for s in range(0, n_in, step):
            e = min(n_in, s + step)
            E = np.zeros((e - s, n_in))
            E[np.arange(e - s), np.arange(s, e)] = 1.0
            W[:, s:e] = op.linear([E]).T
    else:
        step = max(1, CHUNK_BYTES // (8 * (m + n_in)))
        for s in range(0, m, step):
            e = min(m, s + step)
            R = np.zeros((e - s, m))
            R[np.arange(e - s), np.arange(s, e)] = 1.0
            W[s:e] = op.transpose(R)[0]
    return W


def _csr(M) -> sp.csr_matrix:
    M = sp.csr_matrix(M, dtype=np.float64)
    M.eliminate_zeros()
    M.sum_duplicates()
    return M


def _pattern(M: sp.csr_matrix, which=None) -> sp.csr_matrix:
    """1 (int64) at the stored entries of M (``which``: a mask over M.data, else all)."""
    keep = np.ones(M.data.size, bool) if which is None else which
    P = sp.csr_matrix((keep.astype(np.int64), M.indices.copy(), M.indptr.copy()), shape=M.shape)
    P.eliminate_zeros()
    return P


def power_of_two(v: np.ndarray) -> np.ndarray:
    """True where v is +-2^k (finite, nonzero)."""
    v = np.asarray(v, dtype=np.float64)
    mant, _ = np.frexp(v)
    return np.isfinite(v) & (np.abs(mant) == 0.5)


def compose(A: sp.csr_matrix, a: np.ndarray, M: sp.csr_matrix, b: np.ndarray):
    """``(A @ M, A @ b + a)`` with every entry proven exact, or :class:`NotExact`: each entry
    of the products is at most one product, one of whose factors is a power of two, with a
    normal result; each ``(A b)_i + a_i`` exact by TwoSum."""
    count = _pattern(A) @ _pattern(M)
    if count.nnz and count.data.max() > 1:
        raise NotExact("an entry is a sum of several products")
    both = _pattern(A, ~power_of_two(A.data)) @ _pattern(M, ~power_of_two(M.data))
    if both.nnz:
        raise NotExact("a product of two factors neither of which is a power of two")
    P = _csr(A @ M)
    if P.nnz != count.nnz:
        raise NotExact("a product underflows to zero")
    if P.nnz and not (np.all(np.isfinite(P.data)) and np.abs(P.data).min() >= TINY):
        raise NotExact("a product overflows or is subnormal")
    b = np.asarray(b, dtype=np.float64)
    nz = b != 0
    terms = _pattern(A) @ nz.astype(np.int64)
    if terms.size and terms.max() > 1:
        raise NotExact("a bias element is a sum of several products")
    odd = _pattern(A, ~power_of_two(A.data)) @ (nz & ~power_of_two(b)).astype(np.int64)
    if odd.size and odd.max() > 0:
        raise NotExact("a bias product of two factors neither of which is a power of two")
    t = A @ b
    hit = terms == 1
    if np.any(hit) and not (np.all(np.isfinite(t[hit])) and np.abs(t[hit]).min() >= TINY):
        raise NotExact("a bias product underflows, overflows or is subnormal")
    s = t + a
    bp = s - t
    err = (t - (s - bp)) + (a - bp)  # TwoSum: the exact rounding error of t + a
    if not (np.all(np.isfinite(s)) and np.all(err == 0)):
        raise NotExact("a bias sum is rounded")
    return P, s


def describe(mlp) -> str:
    """``lowered to 3072-2048-1024-100-10`` (for ``crown inspect`` and logs)."""
    return "lowered to " + "-".join(map(str, mlp.sizes))

