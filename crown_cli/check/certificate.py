"""A certificate case's tree (docs/proofs.md): its arrays checked, its nodes walked in batches."""
import hashlib

import numpy as np

from .bounds import lower_bound, pre_interval
from .hull import hull_float, hull_holds
from .network import Reject

CHUNK = 512  # nodes per batch
ROW_ELEMS = 2 ** 14  # row entries per back-substitution chunk
_INT = ("kind", "arg", "refresh", "alpha_at", "beta_at", "cols", "hull_at")


class State:
    """Per node of a batch: box lo, hi (B, n_in); bounds l, u (B, H); signs sg (B, H) in {-1, 0, 1};
    ``ball`` (x0, eps, p) for p "2" or "1": every node's set lies in that l_p ball too."""

    def __init__(self, lo, hi, l, u, sg, ball=None):
        self.lo, self.hi, self.l, self.u, self.sg = lo, hi, l, u, sg
        self.ball = ball

    def take(self, idx):
        return State(*(a[idx] for a in (self.lo, self.hi, self.l, self.u, self.sg)), ball=self.ball)

    @staticmethod
    def cat(states):
        return State(*(np.concatenate(a) for a in zip(*((s.lo, s.hi, s.l, s.u, s.sg) for s in states))),
                     ball=states[0].ball)


def case_arrays(z, c, net, memo=None):
    """The arrays of certificate case c, their dtypes and shapes checked (Reject naming one);
    ``memo``: a dict keeping each case's checked row multipliers for the cases that share
    them (``rm_same``)."""
    H, n_in, n_out = int(net.offsets[-1]), net.sizes[0], net.sizes[-1]
    a = {}
    for name in ("lo", "hi", "A", "kind", "arg", "value", "refresh", "alpha_at", "beta_at",
                 "cols", "alpha", "beta", "hull_at", "hull_s", "hull_theta"):
        key = f"c{c}_{name}"
        if key not in z:
            if name in ("alpha", "beta"):
                a[name] = np.zeros((0, len(a["cols"])))
                continue
            if name == "hull_at":
                a[name] = np.full(len(a["kind"]), -1)
                continue
            if name in ("hull_s", "hull_theta"):
                a[name] = np.zeros((0, net.sizes[1]) + ((n_in,) if name == "hull_theta" else ()))
                continue
            raise Reject(f"certificate case {c}: array {name} missing")
        v = z[key]
        if v.dtype.kind not in ("iu" if name in _INT else "f") or v.dtype.itemsize > 8:
            raise Reject(f"certificate case {c}: {name} has dtype {v.dtype}")
        a[name] = v.astype(np.int64 if name in _INT else np.float64)
    N, p = len(a["kind"]), len(a["cols"])
    want = {"lo": (n_in,), "hi": (n_in,), "A": (a["A"].shape[0], n_out), "alpha": (len(a["alpha"]), p),
            "beta": (len(a["beta"]), p), "hull_s": (len(a["hull_s"]), net.sizes[1]),
            "hull_theta": (len(a["hull_s"]), net.sizes[1], n_in),
            **{k: (N,) for k in ("arg", "value", "refresh", "alpha_at", "beta_at", "hull_at")}}
    for k, shape in want.items():
        if a[k].shape != shape or (a["A"].ndim != 2):
            raise Reject(f"certificate case {c}: {k} has shape {a[k].shape}, expected {shape}")
    cols = a["cols"]
    if p and (cols[0] < 0 or cols[-1] >= H or np.any(np.diff(cols) <= 0)):
        raise Reject(f"certificate case {c}: cols not increasing flat neuron indices < {H}")
    for k, what in (("alpha", "slope"), ("beta", "multiplier")):
        if not np.all((a[k] >= 0) & (a[k] <= (1 if k == "alpha" else np.inf))):
            r, j = np.argwhere(~((a[k] >= 0) & (a[k] <= (1 if k == "alpha" else np.inf))))[0]
            raise Reject(f"certificate case {c}: {k} row {r}: {what} {float(a[k][r, j])!r} of neuron "
                         f"{cols[j]} outside {'[0, 1]' if k == 'alpha' else '[0, inf)'}")
    a["layer_slopes"] = {}
    for k in range(1, net.K + 1):
        if f"c{c}_slopes_k{k}" not in z and f"c{c}_slopes_k{k}_rows" not in z:
            continue
        rows, S = z.get(f"c{c}_slopes_k{k}_rows"), z.get(f"c{c}_slopes_k{k}")
        ck = int(np.sum(cols < net.offsets[k - 1]))
        if (rows is None or S is None or rows.dtype.kind not in "iu" or S.dtype.kind != "f"
                or rows.ndim != 1 or S.shape != (2 * len(rows), ck)
                or np.any(rows < net.offsets[k - 1]) or np.any(rows >= net.offsets[k])
                or len(set(rows.tolist())) != len(rows)):
            raise Reject(f"certificate case {c}: layer slopes of layer {k} malformed")
        if not np.all((S >= 0) & (S <= 1)):
            raise Reject(f"certificate case {c}: a layer-{k} slope outside [0, 1]")
        pos = np.full(net.sizes[k], -1)
        pos[rows - net.offsets[k - 1]] = np.arange(len(rows))
        a["layer_slopes"][k] = (pos, S.astype(np.float64), cols[:ck])
    a["node_id"] = np.arange(N)
    if f"c{c}_node_id" in z:
        ids = z[f"c{c}_node_id"]
        if ids.dtype.kind not in "iu" or ids.shape != (N,) or (N and ids.min() < 0):
            raise Reject(f"certificate case {c}: node_id must be N nonnegative integers")
        a["node_id"] = ids.astype(np.int64)
    src = c
    if f"c{c}_rm_same" in z:
        src = z[f"c{c}_rm_same"]
        if src.dtype.kind not in "iu" or src.shape != () or not 0 <= int(src) < c \
                or f"c{int(src)}_rm_same" in z:
            raise Reject(f"certificate case {c}: rm_same must name an earlier case with its own "
                         "row multipliers")
        src = int(src)
        if f"c{src}_rm_node" not in z:
            raise Reject(f"certificate case {c}: rm_same names case {src}, which has none")
    memo = {} if memo is None else memo
    if src not in memo:
        memo[src] = row_multipliers(z, src, net)
    a["rm"] = memo[src]
    a["rm_source"] = src
    return a


_RM = ("node", "neuron", "side", "count", "col", "value")
_RS = ("scount", "scol", "slope")  # optional: the rows' own slopes


def row_multipliers(z, c, net):
    """Certificate case c's row multipliers (``rm_*``, docs/proofs.md) checked, as a dict
    with each entry's first multiplier (``start``) and its neuron's layer; None if absent."""
    have = [f"c{c}_rm_{n}" in z for n in _RM]
    if not any(have):
        return None
    if not all(have):
        raise Reject(f"certificate case {c}: row multipliers need all of rm_" + ", rm_".join(_RM))
    r = {n: z[f"c{c}_rm_{n}"] for n in _RM}
    for n, v in r.items():
        if v.ndim != 1 or v.dtype.kind not in ("f" if n == "value" else "iu") or v.dtype.itemsize > 8:
            raise Reject(f"certificate case {c}: rm_{n} has dtype {v.dtype}, shape {v.shape}")
        r[n] = v.astype(np.float64 if n == "value" else np.int64)
    E, H = len(r["node"]), int(net.offsets[-1])
    if any(len(r[n]) != E for n in ("neuron", "side", "count")) or np.any(r["count"] < 0) \
            or len(r["col"]) != r["count"].sum() or len(r["value"]) != len(r["col"]):
        raise Reject(f"certificate case {c}: row multiplier arrays of inconsistent lengths")
    node, neur = r["node"], r["neuron"]
    if E and (node[0] < 0 or np.any(np.diff(node) < 0)):
        raise Reject(f"certificate case {c}: rm_node not nondecreasing node ids")
    if np.any((neur < 0) | (neur >= H)) or np.any((r["col"] < 0) | (r["col"] >= H)) \
            or not np.all(np.isin(r["side"], (-1, 1))):
        raise Reject(f"certificate case {c}: a row multiplier's neuron or side out of range")
    r["layer"] = np.searchsorted(net.offsets, neur, side="right")
    r["start"] = np.cumsum(r["count"]) - r["count"]
    floor = np.asarray(net.offsets)[r["layer"] - 1]  # the first neuron of the row's layer
    if np.any(r["col"] >= np.repeat(floor, r["count"])):
        raise Reject(f"certificate case {c}: a row multiplier on a neuron not below its row's layer")
    if not np.all((r["value"] >= 0) & np.isfinite(r["value"])):
        raise Reject(f"certificate case {c}: a row multiplier negative or not finite")
    key = (node * H + neur) * 2 + (r["side"] > 0)
    if np.unique(key).size != E:
        raise Reject(f"certificate case {c}: a row given multipliers twice at one node")
    have = [f"c{c}_rm_{n}" in z for n in _RS]
    if any(have) and not all(have):
        raise Reject(f"certificate case {c}: row slopes need all of rm_" + ", rm_".join(_RS))
    r["scount"] = np.zeros(E, np.int64)
    r["scol"], r["slope"] = np.zeros(0, np.int64), np.zeros(0)
    if all(have):
        for n in _RS:
            v = z[f"c{c}_rm_{n}"]
            if v.ndim != 1 or v.dtype.kind not in ("f" if n == "slope" else "iu") \
                    or v.dtype.itemsize > 8:
                raise Reject(f"certificate case {c}: rm_{n} has dtype {v.dtype}, shape {v.shape}")
            r[n] = v.astype(np.float64 if n == "slope" else np.int64)
        if len(r["scount"]) != E or np.any(r["scount"] < 0) \
                or len(r["scol"]) != r["scount"].sum() or len(r["slope"]) != len(r["scol"]):
            raise Reject(f"certificate case {c}: row slope arrays of inconsistent lengths")
        if np.any(r["scol"] < 0) or np.any(r["scol"] >= np.repeat(floor, r["scount"])):
            raise Reject(f"certificate case {c}: a row slope on a neuron not below its row's layer")
        if not np.all((r["slope"] >= 0) & (r["slope"] <= 1)):
            raise Reject(f"certificate case {c}: a row slope outside [0, 1]")
    r["sstart"] = np.cumsum(r["scount"]) - r["scount"]
    first = np.zeros(len(r["scol"]), bool)  # each entry's first slope
    first[r["sstart"][r["scount"] > 0]] = True
    if np.any((np.diff(r["scol"]) <= 0) & ~first[1:]):
        raise Reject(f"certificate case {c}: an entry's row slopes not on increasing neurons")
    return r


def structure(a, net, m):
    """Check the preorder arrays form one tree with valid arguments; child 1 of each split."""
    kind, arg, N = a["kind"], a["arg"], len(a["kind"])
    if N == 0:
        raise Reject("the tree has no node")
    limit = {0: m, 1: net.sizes[0], 2: int(net.offsets[-1]), 3: int(net.offsets[-1]), 4: m}
    child1, stack = np.full(N, -1), [(-1, 0)]
    for i in range(N):
        if not stack:
            raise Reject(f"node {i}: extra node after the tree's last leaf (preorder arrays too long)")
        parent, side = stack.pop()
        if side:
            child1[parent] = i
        k = int(kind[i])
        if k not in (0, 1, 2, 3, 4):
            raise Reject(f"node {i}: kind {k}")
        if not 0 <= arg[i] < limit[k]:
            raise Reject(f"node {i}: argument {arg[i]} out of range for kind {k}")
        if k == 2 and not net.relu_neuron[arg[i]]:
            raise Reject(f"node {i}: a ReLU split of neuron {arg[i]}, which is no ReLU's input")
        if k in (1, 2):
            stack += [(i, 1), (i, 0)]
    if stack:
        raise Reject(f"node {stack[-1][0]}: child {stack[-1][1]} missing (preorder arrays end early)")
    if a["refresh"][0] != 1 or np.any(a["refresh"] < 1):
        raise Reject("refresh must be 1 at the root and >= 1 everywhere")
    for at, name, leaf in (("alpha_at", "alpha", kind == 0), ("beta_at", "beta", kind == 0),
                           ("hull_at", "hull_s", kind == 4)):
        bad = ~((a[at] == -1) | (leaf & (a[at] >= 0) & (a[at] < len(a[name]))))
        if name == "hull_s":
            bad |= (kind == 4) & (a[at] < 0)
        if bad.any():
            raise Reject(f"node {int(np.argmax(bad))}: {at} {a[at][bad][0]} is not a row of {name}")
    return child1


def _colsets(net, cols):
    """Per hidden layer m: (positions in cols, neuron indices within layer m)."""
    out = {}
    for m in range(1, net.K + 1):
        idx = np.nonzero((cols >= net.offsets[m - 1]) & (cols < net.offsets[m]))[0]
        out[m] = (idx, cols[idx] - net.offsets[m - 1])
    return out


def _bound(net, st, L, top, nodes, colsets, srow, S, beta=None, own=None):
    """lower_bound in chunks of rows; rows with srow >= 0 take the slopes S[srow] over colsets,
    the others the default; ``beta(part, m, nodes)``: the rows ``part`` (a slice)'s beta * s
    (rows, n_m) on hidden layer m, or None (no multipliers); ``own(part, m, al)``: the rows'
    slopes ``al`` (rows, n_m) of layer m with those the rows give themselves put in."""
    out = np.empty(len(nodes))
    step = max(256, ROW_ELEMS // max(net.sizes))
    for a in range(0, len(nodes), step):
        sr, nd = srow[a:a + step], nodes[a:a + step]
        sel = np.nonzero(sr >= 0)[0]

        def slopes(m, l, u):
            al = np.where(u >= -l, 1.0, 0.0)
            idx, loc = colsets[m]
            if sel.size and idx.size:
                al[np.ix_(sel, loc)] = S[np.ix_(sr[sel], idx)]
            return al if own is None else own(part, m, al)

        part = slice(a, a + step)
        rows = (L[0][part], L[1][part], L[2]) if isinstance(L, tuple) else L[part]
        out[a:a + step] = lower_bound(
            net, st, rows, top, nd, slopes,
            None if beta is None else (lambda m, part=part, nd=nd: beta(part, m, nd)))
    return out


def _ranges(start, count):
    """The indices start[i] .. start[i] + count[i] - 1 of every i, one after another."""
    return np.repeat(start - np.cumsum(count) + count, count) + np.arange(count.sum())


def _signs(st, nodes, sl):
    """Each neuron's sign known at the nodes (B, n): its constraint, else +1 where l >= 0,
    -1 where u <= 0, else 0."""
    sg, l, u = st.sg[nodes, sl], st.l[nodes, sl], st.u[nodes, sl]
    return np.where(sg != 0, sg, np.where(l >= 0, 1, np.where(u <= 0, -1, 0)))


def _leaf_betas(net, colsets, br, B, sg):
    """``_bound``'s beta for leaves: row r takes B[br[r]] over colsets (none where -1),
    times the node signs sg (B_nodes, H)."""
    def beta(part, m, nd):
        b, (idx, loc) = br[part], colsets[m]
        bsel = np.nonzero(b >= 0)[0]
        bs = np.zeros((len(nd), net.sizes[m]))
        if bsel.size and idx.size:
            bs[np.ix_(bsel, loc)] = B[np.ix_(b[bsel], idx)]
        return bs * sg[nd, net.offsets[m - 1]:net.offsets[m]]
    return beta


def _entry_items(net, rm, e, m, keys):
    """The items on hidden layer m of the row-multiplier entries ``e`` (one per row, -1:
    none), ``keys`` naming their arrays (count, start, neuron, value): (row, neuron within
    layer m, value) each."""
    count, start, col, value = (rm[k] for k in keys)
    rows = np.nonzero(e >= 0)[0]
    cnt = count[e[rows]]
    where = _ranges(start[e[rows]], cnt)
    r, c, v = np.repeat(rows, cnt), col[where], value[where]
    o0, o1 = net.offsets[m - 1], net.offsets[m]
    inm = (c >= o0) & (c < o1)
    return r[inm], c[inm] - o0, v[inm]


def _row_betas(net, st, rm, ent):
    """``_bound``'s beta for step 1b's rows: row r takes the multipliers of row-multiplier
    entry ``ent[r]`` (none where -1), each times the sign of its neuron at the row's node
    (0 where the sign is not known there: the multiplier takes no part)."""
    def beta(part, m, nd):
        bs = np.zeros((len(nd), net.sizes[m]))
        r, j, v = _entry_items(net, rm, ent[part], m, ("count", "start", "col", "value"))
        np.add.at(bs, (r, j), v)
        return bs * _signs(st, nd, slice(net.offsets[m - 1], net.offsets[m]))
    return beta


def _row_slopes(net, rm, ent):
    """``_bound``'s ``own`` for step 1b's rows: row r takes the slopes of row-multiplier
    entry ``ent[r]`` (none where -1) on the neurons that entry names."""
    def own(part, m, al):
        r, j, v = _entry_items(net, rm, ent[part], m, ("scount", "sstart", "scol", "slope"))
        al[r, j] = v
        return al
    return own


def update(net, st, refresh, layer_slopes, rm=None, ids=None):
    """Steps 1-2 of docs/proofs.md for every node of the batch (node ids ``ids``), layers
    1..K; ``rm``: the case's row multipliers (:func:`row_multipliers`) or None."""
    ent = None
    if rm is not None and len(rm["node"]):  # the batch's entries: (batch position, entry)
        lo = np.searchsorted(rm["node"], ids, "left")
        num = np.searchsorted(rm["node"], ids, "right") - lo
        pos = np.repeat(np.arange(len(ids)), num)
        ent = (pos, _ranges(lo, num))
    for k in range(1, net.K + 1):
        sl = slice(net.offsets[k - 1], net.offsets[k])
        l, u, sg = st.l[:, sl], st.u[:, sl], st.sg[:, sl]
        again = np.nonzero(refresh == 1)[0]
        if again.size:  # 1a (the root, input splits): interval bounds from the layer below
            il, iu = pre_interval(net, k, st, again)
            l[again] = np.fmax(l[again], il)
            u[again] = np.fmin(u[again], iu)
        # 1b's neurons: those of unknown sign; of a layer whose ReLU output a max pool reads
        # (its lines take the window inputs' bounds), every one not proven inactive
        open_ = np.ones_like(u, bool) if k in net.identity else \
            (u > 0) if k in net.pool_fed else (l < 0) & (u > 0)
        nodes, js = np.nonzero(open_ & (refresh <= k)[:, None])
        rows = (np.concatenate([nodes, nodes]), np.concatenate([js, js]),
                np.repeat([1.0, -1.0], nodes.size), np.full(2 * nodes.size, -1))
        if ent is not None:  # rows with multipliers: instead of those rows' own
            here = (rm["layer"][ent[1]] == k) & (refresh[ent[0]] <= k)
            e = ent[1][here]
            if e.size:
                en, ej = ent[0][here], rm["neuron"][e] - net.offsets[k - 1]
                es = rm["side"][e].astype(np.float64)
                key = lambda n, j, sgn: (n * net.sizes[k] + j) * 2 + (sgn > 0)
                mine = ~np.isin(key(rows[0], rows[1], rows[2]), key(en, ej, es))
                rows = tuple(np.concatenate([r[mine], x]) for r, x in zip(rows, (en, ej, es, e)))
        if rows[0].size:  # 1b: the linear bounds of the neurons still unstable
            v = row_bounds(net, st, k, *rows, layer_slopes, rm)
            up_, n_, j_ = rows[2] > 0, rows[0], rows[1]
            l[n_[up_], j_[up_]] = np.fmax(l[n_[up_], j_[up_]], v[up_])
            u[n_[~up_], j_[~up_]] = np.fmin(u[n_[~up_], j_[~up_]], -v[~up_])
        np.maximum(l, 0.0, out=l, where=sg > 0)
        np.minimum(u, 0.0, out=u, where=sg < 0)


def row_bounds(net, st, k, nodes, js, sign, ent, layer_slopes, rm=None):
    """Lower bounds of the rows ``sign[r] * z_j`` (j = ``js[r]`` of layer k) at the batch's
    nodes ``nodes`` (step 1b), with the layer slopes where given and the multipliers of
    row-multiplier entry ``ent[r]`` (none where -1)."""
    n = net.sizes[k]
    pos, S, ck = layer_slopes.get(k, (np.full(n, -1), np.zeros((0, 0)), net.offsets[:0]))
    srow = pos[js]
    srow = np.where(srow < 0, -1, np.where(sign > 0, srow, srow + len(S) // 2))
    some = rm is not None and np.any(ent >= 0)
    beta = _row_betas(net, st, rm, ent) if some else None
    own = _row_slopes(net, rm, ent) if some and rm["scount"].any() else None
    return _bound(net, st, (js, sign, n), k, nodes, _colsets(net, ck), srow, S, beta, own)


def neuron_bounds(net, st, k, nodes, js, layer_slopes):
    """Lower bounds p of z_j and q of -z_j of layer k's neurons ``js`` at the batch's nodes
    ``nodes`` (step 1b, without multipliers), with the layer slopes where given."""
    R = nodes.size
    v = row_bounds(net, st, k, np.concatenate([nodes, nodes]), np.concatenate([js, js]),
                   np.repeat([1.0, -1.0], R), np.full(2 * R, -1), layer_slopes)
    return v[:R], v[R:]


CACHE_BYTES = 2 ** 28  # node bounds kept for the certificate's other cases


def _root_key(a, ball):
    """What a root node's state depends on besides the network: its box, the layer slopes,
    the row multipliers' source case and id, the ball."""
    h = hashlib.blake2b(digest_size=16)
    for v in (a["lo"], a["hi"], a["node_id"][:1], np.array([a["rm_source"]])):
        h.update(np.ascontiguousarray(v).tobytes())
    for k, (pos, S, ck) in sorted(a["layer_slopes"].items()):
        h.update(np.array([k]).tobytes() + pos.tobytes() + S.tobytes() + ck.tobytes())
    h.update(repr(None if ball is None else (ball[0].tobytes(), ball[1], ball[2])).encode())
    return h.digest()


def _child_key(parent, i, side, a, child):
    """A child's key: its parent's, the split (kind, argument, value, side), and the child's
    refresh and id: equal keys, equal paths, so equal node states."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.array([a["kind"][i], a["arg"][i], side, a["refresh"][child], a["node_id"][child]],
                      np.int64).tobytes() + np.float64(a["value"][i]).tobytes())
    return h.digest()


def _update_cached(net, st, a, ids, keys, cache):
    """:func:`update` on the batch's nodes whose path no other case has had (by key), the
    others' bounds copied from ``cache``; new ones stored while it holds under
    :data:`CACHE_BYTES`."""
    kk = [keys[int(i)] for i in ids]
    hit = np.array([k in cache for k in kk], bool)
    for r in np.nonzero(hit)[0]:
        st.l[r], st.u[r] = cache[kk[r]]
    miss = np.nonzero(~hit)[0]
    if miss.size == 0:
        return
    sub = st if miss.size == len(ids) else st.take(miss)
    update(net, sub, a["refresh"][ids[miss]], a["layer_slopes"], a["rm"], a["node_id"][ids[miss]])
    if sub is not st:
        st.l[miss], st.u[miss] = sub.l, sub.u
    size = 16 * st.l.shape[1]
    for r in miss:
        if (len(cache) + 1) * size > CACHE_BYTES:
            break
        cache[kk[r]] = (st.l[r].copy(), st.u[r].copy())


def walk(net, a, child1, bf, b_exact, ball=None, cache=None):
    """Walk the tree from its root box; Reject with the first failure found. ``bf[i]``: the
    largest float <= b_exact[i], the threshold of row i (a float V > b_i iff V > bf[i]).
    ``ball``: (x0, eps, p), the l_p ball (p "2" or "1") inside the box the tree is of (no
    input splits, no hull leaves then). ``cache``: a dict shared by the certificate's cases,
    node bounds by path (cases of one search repeat its tree's nodes)."""
    from fractions import Fraction

    kind, arg, value, H = a["kind"], a["arg"], a["value"], int(net.offsets[-1])
    if ball is not None and np.isin(kind, (1, 4)).any():
        raise Reject("a certificate of an l_p ball has no input splits and no hull leaves")
    colsets, nodes_done = _colsets(net, a["cols"]), 0
    root = State(a["lo"][None], a["hi"][None], np.full((1, H), -np.inf), np.full((1, H), np.inf),
                 np.zeros((1, H), dtype=np.int8), ball=ball)
    pool = [(np.array([0]), root)]
    cache = {} if cache is None else cache
    keys = {0: _root_key(a, ball)}
    while pool:
        ids, st = pool.pop()
        while pool and len(ids) < CHUNK:
            more, s2 = pool.pop()
            ids, st = np.concatenate([ids, more]), State.cat([st, s2])
        if len(ids) > CHUNK:
            pool.append((ids[CHUNK:], st.take(slice(CHUNK, None))))
            ids, st = ids[:CHUNK], st.take(slice(0, CHUNK))
        nodes_done += len(ids)
        _update_cached(net, st, a, ids, keys, cache)
        fails = []
        k = kind[ids]
        empty = (st.l > st.u).any(1)
        e3 = np.nonzero((k == 3) & ~empty)[0]
        if e3.size:  # the named neuron's own bounds at the node must cross its bounds
            j = arg[ids[e3]]
            lay = np.searchsorted(net.offsets, j, side="right")
            for m in np.unique(lay):
                sel = e3[lay == m]
                jj = arg[ids[sel]]
                p, q = neuron_bounds(net, st, m, sel, jj - net.offsets[m - 1], a["layer_slopes"])
                cross = np.fmax(st.l[sel, jj], p) > np.fmin(st.u[sel, jj], -q)
                for r in sel[~cross]:
                    fails.append((ids[r], f"leaf of kind 3 (empty) but no neuron has l > u, "
                                          f"neuron {arg[ids[r]]} included"))
        for r in np.nonzero(k == 4)[0]:
            row, h = arg[ids[r]], a["hull_at"][ids[r]]
            hs, ht = a["hull_s"][h], a["hull_theta"][h]
            if not (np.all((hs >= 0) & (hs <= 1)) and np.all(np.isfinite(ht))):
                fails.append((ids[r], f"row {row}: a hull slope outside [0, 1] or a line "
                                      "not finite"))
                continue
            sl1 = slice(0, int(net.offsets[1]))
            fb = hull_float(net, st.lo[r], st.hi[r], st.l[r, sl1], st.u[r, sl1], a["A"][row],
                            hs, ht)
            if fb is not None and fb > bf[row]:
                continue  # the float bound, every rounding charged, proves it
            why = hull_holds(net, st.lo[r], st.hi[r], a["A"][row], b_exact[row], hs, ht)
            if why:
                fails.append((ids[r], f"row {arg[ids[r]]}: {why}"))
        lv = np.nonzero(k == 0)[0]
        if lv.size:
            s = _signs(st, slice(None), slice(None))
            bat = a["beta_at"][ids[lv]]
            B = np.zeros((lv.size, len(a["cols"])))
            B[bat >= 0] = a["beta"][bat[bat >= 0]]
            unknown = (B > 0) & (s[lv][:, a["cols"]] == 0)
            for r, j in zip(*np.nonzero(unknown)):
                fails.append((ids[lv[r]], f"multiplier {float(B[r, j])!r} on neuron {a['cols'][j]} whose "
                             "sign is not known at the node"))
            rows = arg[ids[lv]]
            v = _bound(net, st, a["A"][rows], net.K + 1, lv, colsets, a["alpha_at"][ids[lv]],
                       a["alpha"], _leaf_betas(net, colsets, bat, a["beta"], s.astype(np.float64)))
            for r in np.nonzero(~(v > bf[rows]))[0]:
                miss = float(b_exact[rows[r]] - Fraction(v[r])) if np.isfinite(v[r]) else np.inf
                fails.append((ids[lv[r]], f"row {rows[r]}: lower bound {float(v[r])!r} of A_i y is not "
                             f"> b_i = {float(b_exact[rows[r]])!r} (missed by {miss:.3g})"))
        sp = np.nonzero((k == 1) | (k == 2))[0]
        if sp.size:
            i, d, val = ids[sp], arg[ids[sp]], value[ids[sp]]
            inp = k[sp] == 1
            dd = np.where(inp, d, 0)
            ok = ~inp | ((st.lo[sp, dd] <= val) & (val <= st.hi[sp, dd]))
            for r in np.nonzero(~ok)[0]:
                fails.append((i[r], f"input split value {float(val[r])!r} of dimension {d[r]} outside "
                             f"[{float(st.lo[sp[r], d[r]])!r}, {float(st.hi[sp[r], d[r]])!r}]"))
            ch = st.take(np.concatenate([sp, sp]))
            n2, two = len(sp), np.arange(len(sp))
            inp2, d2 = np.concatenate([inp, inp]), np.concatenate([d, d])
            lo_side = np.concatenate([np.zeros(n2, bool), np.ones(n2, bool)])
            rr = np.concatenate([two, two + n2])
            sel = inp2 & ~lo_side
            ch.hi[rr[sel], d2[sel]] = np.concatenate([val, val])[sel]
            sel = inp2 & lo_side
            ch.lo[rr[sel], d2[sel]] = np.concatenate([val, val])[sel]
            sel = ~inp2
            ch.sg[rr[sel], d2[sel]] = np.where(lo_side[sel], 1, -1)
            for r in range(n2):
                keys[i[r] + 1] = _child_key(keys[i[r]], i[r], 0, a, i[r] + 1)
                keys[child1[i[r]]] = _child_key(keys[i[r]], i[r], 1, a, child1[i[r]])
            pool.append((np.concatenate([i + 1, child1[i]]), ch))
        if fails:
            node, why = min(fails, key=lambda f: f[0])
            raise Reject(f"node {node}: {why}")
    return nodes_done
