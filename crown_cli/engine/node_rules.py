"""The bound engine's rules for each kind of node of a graph network, one class per kind.

A node's rules are, in one place: its interval (from its inputs' intervals, rounded
outward), its back-substitution step with its own float64 rounding charge (on rows as numpy
arrays: :meth:`GraphBounds._rows <crown_cli.engine.graph_bounds.GraphBounds>`; on rows held
transposed on live elements or on windows: the fast path of :mod:`crown_cli.engine.graph_rows`),
its relaxed forward pass (its value under the lines a row took: the gradients of
:mod:`crown_cli.engine.graph_alpha`) and its free parameters. :func:`plan` gives a graph's
rules, one per node; the engine visits the nodes and calls them. A new operation of
:mod:`crown_cli.graph` gets its class here.

- :class:`InputRule`: the input set's interval; rows reaching it become columns of the rows
  over the flat input.
- :class:`AffineRule` (every :class:`~crown_cli.graph.ops.Affine`), with :class:`ConvRule` and
  :class:`SumRule` for what the fast path does on windows: ``y = A(x_1..x_k) + b``;
  ``const += Lam b`` and each input receives ``Lam A_j`` (the operation's ``transpose``), with
  gamma_{T+1} of the products' magnitudes charged (T = ``op.terms``).
- :class:`ActivationRule`: the relaxation's lines (:mod:`crown_cli.engine.relaxations`, chosen
  per row by sign), ``D = Lam * slope`` charged 2u |D|; free lower slopes on ReLU and leaky
  ReLU.
- :class:`PoolRule`: a max pool's lines (:class:`PoolLines`); free weights of the lower line.
- :class:`ProductRule`: the product of two data nodes, McCormick's planes averaged; a free
  mix of them per row.

The rounding argument is in :mod:`crown_cli.engine.graph_bounds`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from crown_cli.engine.batch_steps import Lines, relax
from crown_cli.engine import graph_rows
from crown_cli.engine.graph_rows import (LIVE_SHARE, Win, WinInputRows, _bias, _fits, _full,
                                         _image, _lines, _take, _transpose, _typed, _weight,
                                         affine_terms, concretes_windows, hands_nothing,
                                         input_terms_fused, needed_mask, restrict,
                                         window_runs)
from crown_cli.engine.input_sets import Box
from crown_cli.engine.kernels import graph_kernels
from crown_cli.engine.rounding import ERR_SAFETY, TINY64, U64, gamma_n
from crown_cli.graph.ops import (ActivationOp, Affine, Conv, Dense, IndexMap, InputOp, Product,
                                  Scale, Sum, steer_dtype, typed)
from crown_cli.graph.pooling import MaxPool


# Ranges every value of the activation lies in (intersected with the lines' interval)
_RANGES = {"relu": (0.0, np.inf), "sigmoid": (0.0, 1.0), "tanh": (-1.0, 1.0),
           "arctan": (-1.5707963267948970, 1.5707963267948970), "hard_sigmoid": (0.0, 1.0),
           "erf": (-1.0, 1.0),
           "softplus": (0.0, np.inf), "softplus_t": (0.0, np.inf), "sign": (-1.0, 1.0), "sin": (-1.0, 1.0),
           "cos": (-1.0, 1.0), "square": (0.0, np.inf)}


def outward(lo, hi, err):
    """[lo - err, hi + err] with the rounding of these operations covered (4u of the
    magnitudes, then one ulp)."""
    pad = err + 4.0 * U64 * (np.abs(lo) + np.abs(hi) + err)
    return np.nextafter(lo - pad, -np.inf), np.nextafter(hi + pad, np.inf)


def affine_interval(op, los, his):
    """Rigorous interval of an affine operation's output for inputs in [los[j], his[j]]
    (each (size_j,), or (n, size_j) on n input sets):
    centre and radius through :meth:`forward` and :meth:`forward_abs`, widened by
    gamma_{T+1} of the magnitudes (T = ``op.terms_fwd``) and underflow."""
    cs = [0.5 * l + 0.5 * h for l, h in zip(los, his)]
    rs = [np.nextafter(np.maximum(h - c, c - l), np.inf) for c, l, h in zip(cs, los, his)]
    lead = cs[0].shape[:-1]  # () on one input set, (n,) on n boxes

    def rows(f, xs):
        out = f([x.reshape(-1, x.shape[-1]) for x in xs])
        return out.reshape(*lead, out.shape[-1])

    yc = rows(op.forward, cs)
    yr = rows(op.forward_abs, rs)
    mag = rows(op.forward_abs, [np.abs(c) for c in cs]) + yr
    if op.bias is not None:
        mag = mag + np.abs(op.bias)
    T = op.terms_fwd
    err = ERR_SAFETY * (gamma_n(T + 1, U64) * mag + TINY64 * (T + 1))
    return outward(yc - yr, yc + yr, err)


def line_gap(l, u, aU, bU, aL, bL):
    """The largest distance between an upper and a lower line over [l, u] (at an end)."""
    return np.maximum((aU - aL) * l + (bU - bL), (aU - aL) * u + (bU - bL))


def activation_interval(op, method: str, l, u, z):
    """An activation's relaxation on its input's interval [l, u] (arrays of any one shape;
    ``z`` >= max(|l|, |u|)): its lines ``(aU, bU, aL, bL)`` (each l's shape, or broadcastable
    to it) and the interval of its output: the lines' range on [l, u], rounded outward and
    intersected with the function's range (relu: exact; the end-points' values of exp, ELU,
    the reciprocal, the square and the cube)."""
    from crown_cli.engine.relaxations import get_relaxation

    shape = l.shape
    l, u, z = (np.ascontiguousarray(a).reshape(-1) for a in (l, u, z))
    name, alpha = op.name, op.alpha
    lines = get_relaxation(name, method, alpha)(l, u)
    back = tuple(v.reshape(shape) if isinstance(v, np.ndarray) and v.size == l.size else v
                 for v in lines)
    aU, bU, aL, bL = lines
    if name == "relu":  # exact: relu is monotone and max(., 0) does not round
        return back, np.maximum(l, 0.0).reshape(shape), np.maximum(u, 0.0).reshape(shape)
    lo = np.minimum(aL * l, aL * u) + bL
    hi = np.maximum(aU * l, aU * u) + bU
    err = 2.0 * U64 * (np.maximum(np.abs(aL), np.abs(aU)) * z + np.abs(bL) + np.abs(bU)) \
        + TINY64
    lo, hi = outward(lo, hi, err)
    rng = _RANGES.get(name) or ((-alpha, np.inf) if name == "elu" else None)
    if rng is not None:
        lo, hi = np.clip(lo, *rng), np.clip(hi, *rng)
    if name in ("exp", "reciprocal", "square", "cube", "elu", "sqrt"):  # end-points, 4 ulps out
        lo, hi = _monotone_range(name, l, u, lo, hi, alpha)
    if name == "floor":  # exact: floor is monotone and does not round
        lo, hi = np.fmax(lo, np.floor(l)), np.fmin(hi, np.floor(u))
    if name in ("gelu", "silu", "hardswish", "mish", "gelu_tanh"):  # the exact range, out
        from crown_cli.engine.relaxations import self_gated as sg

        tanh_form = name == "gelu_tanh"  # its alpha: an allowance (activations.py)
        glo, ghi = sg.value_range(getattr(sg, name.upper()), l, u,
                                  1.0 if alpha is None or tanh_form else float(alpha))
        if tanh_form and alpha:
            sg._widen(glo, ghi, float(alpha))
        lo, hi = np.fmax(lo, glo), np.fmin(hi, ghi)
    return back, lo.reshape(shape), hi.reshape(shape)


def _corners(l1, u1, l2, u2):
    return ((l1, l2), (l1, u2), (u1, l2), (u1, u2))


def _plane_gaps(l1, u1, l2, u2, a, b):
    """``x1 x2 - a x1 - b x2`` at the four corners of the box (its extremes: the function
    is bilinear) as an array (4, ...), and the largest error of their evaluation."""
    gs, errs = [], []
    for x, y in _corners(l1, u1, l2, u2):
        xy = x * y
        gs.append(xy - a * x - b * y)
        errs.append(4.0 * U64 * (np.abs(xy) + np.abs(a * x) + np.abs(b * y)) + 4.0 * TINY64)
    return np.array(gs), np.max(errs, axis=0)


def product_planes(l1, u1, l2, u2):
    """A product ``x1 * x2``'s lines on the box [l1, u1] x [l2, u2] (arrays of one shape;
    :class:`ProductRule`): ``(a, b, icL, icU)`` and the product's interval (lo, hi)."""
    finite = np.isfinite(l1) & np.isfinite(u1) & np.isfinite(l2) & np.isfinite(u2)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.where(finite, 0.5 * l2 + 0.5 * u2, 0.0)
        b = np.where(finite, 0.5 * l1 + 0.5 * u1, 0.0)
        P = np.array([x * y for x, y in _corners(l1, u1, l2, u2)])
        G, E = _plane_gaps(l1, u1, l2, u2, a, b)
        lo = np.where(finite, P.min(axis=0), -np.inf)
        hi = np.where(finite, P.max(axis=0), np.inf)
        icL = np.where(finite, G.min(axis=0) - E, -np.inf)
        icU = np.where(finite, G.max(axis=0) + E, np.inf)
    lo, hi = outward(lo, hi, np.where(finite, U64 * np.maximum(np.abs(lo), np.abs(hi))
                                      + TINY64, 0.0))
    return (a, b, icL, icU), lo, hi


def mixed_planes(l1, u1, l2, u2, t, pos):
    """Per row the plane a row takes at mix ``t`` (r, n) in [0, 1] on the box (the inputs'
    bounds (n,), finite): where ``pos`` (the row's coefficient >= 0) the lower plane
    ``t P1 + (1 - t) P2`` of McCormick's ``P1 = l2 x1 + l1 x2 - l1 l2`` and
    ``P2 = u2 x1 + u1 x2 - u1 u2``, else the upper ``t P3 + (1 - t) P4`` of
    ``P3 = u2 x1 + l1 x2 - l1 u2`` and ``P4 = l2 x1 + u1 x2 - u1 l2``; t = 1/2 is CROWN's
    averaged plane. Only the slopes are taken from the mix; the intercept is the min (lower)
    or max (upper) of ``x1 x2 - a x1 - b x2`` over the corners, rounded outward: valid
    whatever the float slopes are. Returns ``(a, b, ic, c1, c2)`` with (c1, c2) the corner
    attaining the intercept (the intercept's derivative in the slopes is ``-(c1, c2)``)."""
    a = np.where(pos, t * l2 + (1.0 - t) * u2, t * u2 + (1.0 - t) * l2)
    b = t * l1 + (1.0 - t) * u1
    G, E = _plane_gaps(l1, u1, l2, u2, a, b)
    k = np.where(pos, np.argmin(G, axis=0), np.argmax(G, axis=0))
    ic = np.take_along_axis(G, k[None], axis=0)[0]
    ic = np.where(pos, ic - E, ic + E)
    c1 = np.where(k < 2, l1, u1)
    c2 = np.where(k % 2 == 0, l2, u2)
    return a, b, ic, c1, c2


def mix_gradient(l1, u1, l2, u2, L, z1, z2, c1, c2):
    """The derivative in the mix t of a row's term ``L (a x1 + b x2 + ic)`` at the inputs'
    values (z1, z2) and the intercept's corner (c1, c2) (:func:`mixed_planes`)."""
    da = np.where(L >= 0.0, l2 - u2, u2 - l2)
    return L * (da * (z1 - c1) + (l1 - u1) * (z2 - c2))


class Rule:
    """A node kind's rules (stateless: the node and the :class:`GraphBounds` ``gb`` are
    passed in). ``refines_input``: the node's input gets CROWN bounds before the node's
    interval is taken; ``exact_interval``: CROWN cannot tighten the node's interval;
    ``held``: floats the bounds hold per neuron besides its interval and magnitude;
    ``reads_pairs``: ``back_t`` takes rows ``[E; -E]`` held as E alone
    (``graph_rows.WeightRows``)."""

    refines_input = False
    exact_interval = False
    held = 0
    reads_pairs = False

    def interval(self, gb, i, node) -> Tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def refined_inputs(self, node) -> Tuple[int, ...]:
        """The inputs that get CROWN bounds before the node's interval is taken."""
        return tuple(node.inputs[:1]) if self.refines_input else ()

    def back(self, gb, i, node, L, walk) -> None:
        """The rows ``L`` (r, size) through the node (the numpy path): constants, magnitudes
        and charges added to ``walk``, rows given to the inputs by ``walk.give``."""
        raise NotImplementedError

    def back_t(self, gb, i, node, rows, walk) -> None:
        """The same on rows held transposed on live elements, ``(idx, Lt)`` (the fast path:
        ``walk.acc`` (3, r) of constant, magnitude, charge; ``walk.kernels``;
        ``walk.to_input``)."""
        raise NotImplementedError

    def back_win(self, gb, i, node, win: Win, walk) -> bool:
        """The same on rows held on windows (:class:`~crown_cli.engine.graph_rows.Win`);
        False (nothing done) where the node takes rows on live elements."""
        return False

    def relaxed(self, gb, i, node, vals, x, tape, free):
        """The node's value at the points x (r, d) under the lines each row took (``tape``;
        ``free``: the rows' free parameters, as :meth:`GraphBounds.lower
        <crown_cli.engine.graph_bounds.GraphBounds.lower>` takes them), from its inputs'
        values ``vals``."""
        raise NotImplementedError

    def sign_stable(self, node) -> bool:
        """Whether the node is an activation whose lines do not depend on its input's
        bounds where their sign is fixed (ReLU, leaky ReLU)."""
        return False

    def free_slopes(self, gb, i, node) -> Optional[Tuple[np.ndarray, float]]:
        """(mask of the neurons whose lower slope is free, the least slope), or None."""
        return None

    def free_mix(self, gb, i, node) -> Optional[np.ndarray]:
        """Mask of the neurons whose lines have a free mix of two planes in [0, 1] (a
        product's McCormick planes), or None."""
        return None


class InputRule(Rule):
    exact_interval = True

    def interval(self, gb, i, node):
        op = node.op
        sl = slice(op.offset, op.offset + op.size)
        if isinstance(gb.qcode, Box):
            if gb.eps != 1.0:
                raise ValueError("a Box is passed as Box.args(): (centre, 1.0, box)")
            return gb.qcode.lo[sl], gb.qcode.hi[sl]
        x = gb.x0[sl]  # |x_k - x0_k| <= ||x - x0||_p <= eps on every l_p ball
        return outward(x - gb.eps, x + gb.eps, 0.0)

    def back(self, gb, i, node, L, walk):
        walk.Lx[:, node.op.offset:node.op.offset + node.op.size] = L

    def back_t(self, gb, i, node, rows, walk):
        walk.to_input(node.op.offset, rows, node.size)

    def back_win(self, gb, i, node, win, walk):
        # the graph's one input, an image: its rows stay on their windows until concretised
        chw = _image(node)
        if chw is None or node.op.offset != 0 or node.size != walk.d or walk.Lx is not None \
                or not concretes_windows(gb):
            return False
        walk.Lx = WinInputRows(win, chw, walk.d)
        return True

    def relaxed(self, gb, i, node, vals, x, tape, free):
        return x[:, node.op.offset:node.op.offset + node.op.size]


class AffineRule(Rule):
    # the forward magnitude absfwd; on the fast path its bias and |bias| (graph_rows._bias)
    # and the three stacked (graph_rows.affine_terms), and float32 copies of them (the
    # steering passes: three floats' worth)
    held = 9

    def interval(self, gb, i, node):
        ins = node.inputs
        lo, hi = affine_interval(node.op, [gb.lo[j] for j in ins], [gb.hi[j] for j in ins])
        gb.absfwd[i] = node.op.forward_abs([gb.absval[j][None] for j in ins])[0]
        return lo, hi

    @staticmethod
    def charge(gb, i, wsum):
        """The transpose's rounding: T products per sum err by gamma_{T+1} of their
        magnitudes, ``wsum`` = |L| @ absfwd per row, plus underflow (0 when exact)."""
        node = gb.g.nodes[i]
        T = node.op.terms
        if not T:
            return 0.0
        ain = sum(float(gb.absval[j].sum()) for j in node.inputs)
        return gamma_n(T + 1, U64) * wsum + TINY64 * T * ain

    def back(self, gb, i, node, L, walk):
        op = node.op
        kernels = graph_kernels()
        if walk.steer:  # a steering pass: the constant only (no magnitude, no charge)
            if op.bias is not None:
                walk.const = walk.const + L @ typed(op, "bias", L.dtype)
        elif kernels is not None and L.flags.c_contiguous and L.dtype == np.float64:
            b, absb = _bias(gb, i, np.float64)
            sums = np.empty((L.shape[0], 3))
            kernels.affine_terms_rows(L, b, absb, gb.absfwd[i], sums)
            if op.bias is not None:
                walk.const = walk.const + sums[:, 0]
                walk.mag = walk.mag + sums[:, 1]
            wsum = sums[:, 2]
            walk.charge = walk.charge + self.charge(gb, i, wsum)
        else:
            if op.bias is not None:
                walk.const = walk.const + L @ op.bias
                walk.mag = walk.mag + np.abs(L) @ np.abs(op.bias)
            wsum = np.abs(L) @ gb.absfwd[i]
            walk.charge = walk.charge + self.charge(gb, i, wsum)
        for j, P in zip(node.inputs, op.transpose(L)):
            walk.give(j, P)

    def win_terms(self, gb, i, win, shape, walk):
        """The node's constant, its magnitude and the product rounding's charge per row of
        the windows ``win`` over its (C, H, W) output ``shape`` (``back_t``'s sums on
        windows), into ``walk.acc``."""
        dt = win.Pt.dtype
        sums = walk.pre.pop(i, None)  # taken by the activation that reads this node
        if sums is None:
            b, absb = _bias(gb, i, dt)
            absfwd = _typed(gb, ("absfwd", i), lambda: gb.absfwd[i], dt)
            sums = np.empty((win.Pt.shape[3], 1 if walk.steer else 3))
            walk.kernels.win_sums_t(win.Pt, win.oy, win.ox, window_runs(win), b.reshape(shape),
                                    absb.reshape(shape), absfwd.reshape(shape), sums)
        self._add_sums(gb, i, sums, walk)

    def _add_sums(self, gb, i, sums, walk):
        """The node's sums over the rows (constant, its magnitude, the product rounding's
        weight; a steering pass's constant alone) into ``walk.acc``."""
        walk.acc[0] += sums[:, 0]
        if not walk.steer:
            walk.acc[1] += sums[:, 1]
            walk.acc[2] += self.charge(gb, i, sums[:, 2])

    def back_t(self, gb, i, node, rows, walk):
        idx, Lt = rows
        Lt = np.ascontiguousarray(Lt)
        r, dt = Lt.shape[1], Lt.dtype
        sums = walk.pre.pop(i, None)  # taken by the activation that reads this node
        if sums is None:
            sums = np.empty((r, 1 if walk.steer else 3))
            b, absb = _bias(gb, i, dt)
            absfwd = _typed(gb, ("absfwd", i), lambda: gb.absfwd[i], dt)
            walk.kernels.affine_terms_t(Lt, _take(b, idx), _take(absb, idx),
                                        _take(absfwd, idx), sums)
        self._add_sums(gb, i, sums, walk)
        moved = _transpose(gb, i, (idx, Lt), walk.kernels, walk.paired.pop(i, None))
        for j, P in zip(node.inputs, moved):
            walk.give(j, P)

    def relaxed(self, gb, i, node, vals, x, tape, free):
        return node.op.forward([vals[j] for j in node.inputs])


class SumRule(AffineRule):
    """A signed sum: its transpose is a negation at most (exact); rows on windows pass on
    as they are."""

    def back_t(self, gb, i, node, rows, walk):
        for j, s in zip(node.inputs, node.op.signs):
            if hands_nothing(gb, j):
                continue
            idx, Lt = restrict(gb, j, rows)  # (before a negation's copy)
            walk.give(j, (idx, Lt if s == 1.0 else -Lt))

    def back_win(self, gb, i, node, win, walk):
        shape = _image(node)
        if any(_image(gb.g.nodes[j]) != shape for j in node.inputs):
            return False
        for j, s in zip(node.inputs, node.op.signs):
            if not hands_nothing(gb, j):
                walk.give(j, win if s == 1.0 else win._replace(Pt=-win.Pt))
        return True


class IndexMapRule(AffineRule):
    """Element moves: on windows, a concatenation of images along their channels (the
    identity over the inputs' values in order, every input of the node's height and width)
    hands each input its channels of the rows' windows; every other move takes rows on
    live elements."""

    def back_win(self, gb, i, node, win, walk):
        shape = _image(node)
        ins = [_image(gb.g.nodes[j]) for j in node.inputs]
        if not node.op.in_order or any(s is None or s[1:] != shape[1:] for s in ins):
            return False
        c0 = 0
        for j, s in zip(node.inputs, ins):
            walk.give(j, win._replace(Pt=win.Pt[c0:c0 + s[0]]))
            c0 += s[0]
        return True


class ScaleRule(AffineRule):
    """An elementwise scaling ``a * x + c`` (Rescaling, an unfolded normalisation, a ReLU6's
    shift): on windows, each row's window times ``a`` at the row's own positions (0 outside
    the image), its constant and charge by the window sums of a convolution's bias."""

    def back_win(self, gb, i, node, win, walk):
        shape = _image(node)
        if shape is None or _image(gb.g.nodes[node.inputs[0]]) != shape:
            return False
        C, H, W = shape
        dt = win.Pt.dtype
        h, w = win.Pt.shape[1:3]
        self.win_terms(gb, i, win, shape, walk)
        yy = win.oy[None, :] + np.arange(h)[:, None]  # (h, r): each row's image rows
        xx = win.ox[None, :] + np.arange(w)[:, None]  # (w, r)
        a = typed(node.op, "a", dt).reshape(shape)
        A = a[:, np.clip(yy, 0, H - 1)[:, None, :], np.clip(xx, 0, W - 1)[None, :, :]]
        inside = ((yy >= 0) & (yy < H))[:, None, :] & ((xx >= 0) & (xx < W))[None, :, :]
        walk.give(node.inputs[0], win._replace(Pt=np.where(inside, win.Pt * A, 0.0)
                                               .astype(dt, copy=False)))
        return True


class ConvRule(AffineRule):
    """A convolution: on windows, its transpose grows each row's window by the kernel."""

    def back_win(self, gb, i, node, win, walk):
        op, kernels = node.op, walk.kernels
        shape = _image(node)
        if _image(gb.g.nodes[node.inputs[0]]) != op.in_shape:
            return False
        r, dt = win.Pt.shape[3], win.Pt.dtype
        (sh, sw), (dh, dw) = op.strides, op.dilations
        kh, kw = op.weight.shape[2:]
        _, h, w, _ = win.Pt.shape
        h2, w2 = (h - 1) * sh + (kh - 1) * dh + 1, (w - 1) * sw + (kw - 1) * dw + 1
        oy, ox = win.oy * sh - op.pads[0], win.ox * sw - op.pads[1]
        _, IH, IW = op.in_shape
        if not _fits(oy, ox, h2, w2, IH, IW):
            return False
        self.win_terms(gb, i, win, shape, walk)
        Gt = np.empty((op.in_shape[0], h2, w2, r), dt)
        strides, dilations, _, group = kernels.conv_args(op.strides, op.dilations, op.pads,
                                                         op.group)
        kernels.win_conv_transpose_t(np.ascontiguousarray(win.Pt), oy, ox, _weight(gb, i, dt),
                                     strides, dilations, group, np.asarray((IH, IW), np.int64),
                                     Gt)
        walk.give(node.inputs[0], Win(oy, ox, Gt, window_runs(win)))  # places moved alike
        return True


def _monotone_range(name, l, u, lo, hi, alpha=None):
    """[lo, hi] intersected with exp's [e^l, e^u], ELU's [f(l), f(u)] (increasing for any
    scale ``alpha`` > 0), the reciprocal's [1/u, 1/l] where [l, u] lies on one side of 0,
    the cube's [l^3, u^3] or the square's range (0 where [l, u] holds it, else the nearer
    end-point's square; the farther one's above), each end-point's value moved out by 4
    ulps (numpy's exp, expm1 and the division err by at most 1, the cube's two products and
    ELU's alpha expm1 by 2), sqrt's [sqrt(l), sqrt(u)] where l >= 0: a quotient's
    denominator then keeps its sign."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if name == "elu":
            a, b = (np.where(v > 0.0, v, alpha * np.expm1(np.minimum(v, 0.0))) for v in (l, u))
        elif name == "exp":
            a, b = np.exp(l), np.exp(u)
        elif name == "cube":
            a, b = l * l * l, u * u * u
        elif name == "sqrt":  # below 0 (NaN in the network) no bound
            a = np.where(l >= 0.0, np.sqrt(np.maximum(l, 0.0)), -np.inf)
            b = np.where(l >= 0.0, np.sqrt(np.maximum(u, 0.0)), np.inf)
        elif name == "square":
            near = np.where(l > 0.0, l, np.where(u < 0.0, u, 0.0))
            a, b = near * near, np.maximum(l * l, u * u)
        else:
            side = (l > 0.0) | (u < 0.0)
            a, b = np.where(side, 1.0 / u, -np.inf), np.where(side, 1.0 / l, np.inf)
        a = a - 4.0 * U64 * np.abs(a) - TINY64
        b = b + 4.0 * U64 * np.abs(b) + TINY64
    return np.fmax(lo, a), np.fmin(hi, b)


def _widths(fuse: bool, steer: bool) -> int:
    """Columns of an activation step's sums (``activation_step_t``): the intercept terms,
    their magnitude and charge weight, with ``fuse`` the affine input's three sums after
    them; a steering pass's intercept terms and the input's constant alone."""
    return (2 if fuse else 1) if steer else (6 if fuse else 3)


def _fused(sums, steer: bool) -> np.ndarray:
    """The affine input's sums an activation step took (``_widths``' last columns), as
    ``AffineRule._add_sums`` reads them."""
    return sums[:, 1:] if steer else sums[:, 3:]


class ActivationRule(Rule):
    refines_input = True
    exact_interval = True  # its lines' range on its input's bounds, what CROWN would give
    held = 5  # four lines and the input's magnitude
    reads_pairs = True

    def interval(self, gb, i, node):
        """The relaxation from the input's interval (kept in ``gb.lines``), and the interval
        of the output (:func:`activation_interval`)."""
        p = node.inputs[0]
        l, u = np.ascontiguousarray(gb.lo[p]), np.ascontiguousarray(gb.hi[p])
        (aU, bU, aL, bL), lo, hi = activation_interval(node.op, gb.method_name, l, u,
                                                       gb.absval[p])
        gb.lines[i] = Lines(np.arange(l.size), aL, aU, bU, bL)
        return lo, hi

    @staticmethod
    def charge(dz, z):
        """The step's rounding: ``D = fl(L * slope)`` errs by u |D|, charged against the
        input's magnitudes z as ``2u |D| @ z`` (``dz``, per row) plus underflow."""
        return 2.0 * U64 * dz + TINY64 * (z.sum() + z.size)

    def back(self, gb, i, node, L, walk):
        """The relaxation's lines, or the caller's per-row ``walk.lines`` (with ``extra``
        added to the input's coefficients) or lower slopes (``walk.free``)."""
        p = node.inputs[0]
        ln = gb.lines[i]
        if walk.lines is not None and i in walk.lines:
            ln = walk.lines[i]
        elif walk.free is not None and i in walk.free:
            ln = Lines(ln.cols, walk.free[i], ln.upper, ln.upper_icpt, ln.lower_icpt)
        kernels = graph_kernels()
        if kernels is not None and L.dtype in (np.float32, np.float64) and ln.stable is None \
                and ln.cols.size == L.shape[1]:
            self._back_kernel(gb, i, p, np.ascontiguousarray(L), ln, walk, kernels)
            return
        D, icpt, pos, slope = relax(L, ln)
        if ln.extra is not None:  # D = fl(fl(L slope) + extra): two roundings
            walk.charge = walk.charge + 2.0 * U64 * ((np.abs(L * slope) + np.abs(ln.extra))
                                                     @ gb.absval[p])
        if walk.tape is not None:
            lo_i = 0.0 if ln.lower_icpt is None else ln.lower_icpt
            up_i = 0.0 if ln.upper_icpt is None else ln.upper_icpt
            walk.tape[i] = (L, pos, slope, np.where(pos, lo_i, up_i))
        walk.const = walk.const + icpt.sum(axis=-1)
        walk.mag = walk.mag + np.abs(icpt).sum(axis=-1)
        z = gb.absval[p]
        walk.charge = walk.charge + self.charge(np.abs(D) @ z, z)
        walk.give(p, D)

    def _back_kernel(self, gb, i, p, L, ln, walk, kernels):
        """:meth:`back` in one pass of the kernel ``activation_rows`` (lines on every column,
        per row or shared): the same products, the sums in another order."""
        r, n = L.shape
        dt = L.dtype  # float32 on a steering pass

        def rows2(a):  # (r, n) per row or (1, n) shared; None: 0
            a = np.zeros(1, dt) if a is None else np.asarray(a, dt)
            if a.size == 1:
                return np.full((1, n), float(a.reshape(-1)[0]), dt)
            if a.ndim <= 2 and a.shape[-1] == n and a.size in (n, r * n):
                return np.ascontiguousarray(a.reshape(-1, n))
            return np.ascontiguousarray(np.broadcast_to(a, (r, n)))

        keep = walk.tape is not None
        shape = (r, n) if keep else (1, 1)
        pos, slope, icv = np.empty(shape, bool), np.empty(shape, dt), np.empty(shape, dt)
        extra = None if ln.extra is None else rows2(ln.extra)
        D, sums = np.empty((r, n), dt), np.empty((r, 4))
        lines = (rows2(ln.lower), rows2(ln.upper), rows2(ln.lower_icpt), rows2(ln.upper_icpt),
                 np.zeros((1, 1), dt) if extra is None else extra)
        kernels.activation_rows(L, lines, extra is not None, gb.absval[p], D, keep,
                                (pos, slope, icv), sums)
        if extra is not None:  # D = fl(fl(L slope) + extra): two roundings
            walk.charge = walk.charge + 2.0 * U64 * sums[:, 3]
        if keep:
            walk.tape[i] = (L, pos, slope, icv)
        walk.const = walk.const + sums[:, 0]
        walk.mag = walk.mag + sums[:, 1]
        walk.charge = walk.charge + self.charge(sums[:, 2], gb.absval[p])
        walk.give(p, D)

    def back_t(self, gb, i, node, rows, walk):
        idx, Lt = rows
        p = node.inputs[0]
        r, dt = walk.r, Lt.dtype  # Lt of r / 2 columns: rows [E; -E] as E alone
        arrays = [_take(a, idx) for a in _lines(gb, i, p, dt)]
        # elements whose lines are all 0, slopes and intercepts (a ReLU inactive on the whole
        # set), add nothing to any sum or charge and hand on rows of exact zeros: not read
        read = np.flatnonzero(_take(needed_mask(gb, i), idx))
        shared = self._shared(gb, p, walk.paired.pop(i, None), arrays, read)
        if shared is not None:  # rows that are pairs: the elements both lines agree on first
            read, n_a, n_live = shared
            arrays = [a[read] for a in arrays]
            idx = read if idx is None else idx[read]
            walk.paired[p] = n_a
        elif read.size > (1.0 - graph_rows.DEAD_SHARE) * Lt.shape[0]:
            read = np.arange(Lt.shape[0])
        else:
            arrays = [a[read] for a in arrays]
            idx = read if idx is None else idx[read]
        fuse = input_terms_fused(gb, i, p, walk)
        terms = np.empty((3, 0), dt)
        if fuse:
            terms = affine_terms(gb, p, dt)
            terms = terms if idx is None else np.ascontiguousarray(terms[:, idx])
        Dt, sums = np.empty((read.size, r), dt), np.empty((r, _widths(fuse, walk.steer)))
        walk.kernels.activation_step_t(np.ascontiguousarray(Lt), read, *arrays, terms, Dt,
                                       sums)
        self._add_sums(sums, lambda: _take(gb.absval[p], idx), walk)
        # elements whose both lines have slope 0 (a ReLU inactive on the whole set, a
        # clipped one saturated) hand on rows of exact zeros: dropped, so the products
        # below skip them (as the dense engine drops inactive columns)
        dead = (arrays[0] == 0) & (arrays[1] == 0)
        if shared is not None:  # the elements of slope 0 came last: their rows are not handed on
            idx, Dt = idx[:n_live], Dt[:n_live]
        elif np.count_nonzero(dead) >= graph_rows.DEAD_SHARE * dead.size:
            keep = np.flatnonzero(~dead)
            idx, Dt = (keep if idx is None else idx[keep]), np.ascontiguousarray(Dt[keep])
        walk.give(p, (idx, Dt))
        if fuse and p in walk.pending:  # p's rows are these alone (it had none before)
            walk.pre[p] = _fused(sums, walk.steer)

    def _add_sums(self, sums, absval, walk):
        """The step's sums (intercept terms, their magnitude, sum |D| times ``absval()``; a
        steering pass's intercept terms alone) into ``walk.acc``."""
        walk.acc[0] += sums[:, 0]
        if not walk.steer:
            walk.acc[1] += sums[:, 1]
            walk.acc[2] += self.charge(sums[:, 2], absval())

    @staticmethod
    def _shared(gb, p, paired, arrays, read):
        """For rows that are pairs (``paired`` -1: row k + r/2 is -row k) and an input p that
        is a dense layer: the elements to read, those whose two lines have one nonzero slope
        first (their rows stay pairs: ``-c s`` is ``-(c s)`` exactly), then the others of
        some nonzero slope, then those whose lines both have slope 0 (read for their
        intercepts, a saturated neuron's, but their rows of zeros not handed on); how many
        come first, and how many are handed on. None where that does not apply or the first
        are fewer than :data:`graph_rows.PAIRED_MIN`."""
        op = gb.g.nodes[p].op
        if paired != -1 or not isinstance(op, Dense) or op.sparse:
            return None
        lower, upper = arrays[0][read], arrays[1][read]
        live = (lower != 0) | (upper != 0)
        first = read[(lower == upper) & live]
        if first.size < graph_rows.PAIRED_MIN:
            return None
        rest, dead = read[(lower != upper) & live], read[~live]
        return np.concatenate([first, rest, dead]), first.size, first.size + rest.size

    def back_win(self, gb, i, node, win, walk):
        p = node.inputs[0]
        shape = _image(node)
        if _image(gb.g.nodes[p]) != shape:
            return False
        r, dt = win.Pt.shape[3], win.Pt.dtype
        arrays = _lines(gb, i, p, dt)
        fuse = input_terms_fused(gb, i, p, walk)
        terms = affine_terms(gb, p, dt).reshape((3,) + shape) if fuse else \
            np.empty((3, 0, 0, 0), dt)
        Dt, sums = np.empty_like(win.Pt), np.empty((r, _widths(fuse, walk.steer)))
        walk.kernels.win_activation_t(win.Pt, win.oy, win.ox, window_runs(win),
                                      *[a.reshape(shape) for a in arrays], terms, Dt, sums)
        self._add_sums(sums, lambda: gb.absval[p], walk)
        walk.give(p, win._replace(Pt=Dt))
        if fuse and p in walk.pending:  # p's rows are these alone (it had none before)
            walk.pre[p] = _fused(sums, walk.steer)
        return True

    def relaxed(self, gb, i, node, vals, x, tape, free):
        _, _, slope, icpt = tape[i]
        return slope * vals[node.inputs[0]] + icpt

    def sign_stable(self, node):
        from crown_cli.activations import ACTIVATIONS

        return ACTIVATIONS[node.op.name].sign_stable

    def free_slopes(self, gb, i, node):
        """ReLU and leaky ReLU with slope <= 1 (above 1 the free line is the upper one):
        the unstable neurons whose lower line passes through 0, and the leak."""
        from crown_cli.activations import default_alpha

        if node.op.name not in ("relu", "leaky_relu"):
            return None
        leak = 0.0 if node.op.name == "relu" else float(
            default_alpha("leaky_relu") if node.op.alpha is None else node.op.alpha)
        if not 0.0 <= leak <= 1.0:
            return None
        p = node.inputs[0]
        unst = (gb.lo[p] < 0.0) & (gb.hi[p] > 0.0)
        icpt = gb.lines[i].lower_icpt
        if icpt is not None:  # a free slope keeps the line through 0: only where it is one
            unst &= np.asarray(icpt) == 0.0
        return (unst, leak) if unst.any() else None


def _abs_dot(D, z):
    """``|D| @ z`` per row where z may hold +inf (an input without a bound): a 0 coefficient
    contributes 0 there, not nan."""
    inf = ~np.isfinite(z)
    if not inf.any():
        return np.abs(D) @ z
    out = np.abs(D) @ np.where(inf, 0.0, z)
    return np.where(np.any(D[..., inf] != 0.0, axis=-1), np.inf, out)


class ProductRule(Rule):
    """``y = x1 * x2`` of two data nodes (:class:`~crown_cli.graph.ops.Product`). Lines: the
    average of McCormick's two planes on each side, which share their slopes: ``a = mid(x2)``
    on x1 and ``b = mid(x1)`` on x2 (the inputs' interval midpoints), with intercepts the min
    (lower plane) and max (upper plane) of ``x1 x2 - a x1 - b x2`` over the four corners of
    the inputs' box (a bilinear function takes its extremes there), each rounded outward by
    its evaluation's error: valid whatever the float slopes are. A row coefficient >= 0 takes
    the lower plane. ``D_1 = Lam a``, ``D_2 = Lam b`` are charged 2u |D| against each
    input's magnitudes, as an activation's step. Both inputs get CROWN bounds first."""

    held = 4  # the two slopes and two intercepts

    def refined_inputs(self, node):
        return tuple(node.inputs)

    def interval(self, gb, i, node):
        p, q = node.inputs
        gb.planes[i], lo, hi = product_planes(gb.lo[p], gb.hi[p], gb.lo[q], gb.hi[q])
        return lo, hi

    @staticmethod
    def _intercepts(L, icL, icU):
        """Each coefficient's intercept term: ``L * icL`` where L >= 0, ``L * icU`` where
        L < 0, 0 where L is 0 (an infinite intercept a row does not use)."""
        ic = np.where(L >= 0.0, icL, icU)
        with np.errstate(invalid="ignore"):
            return np.where(L != 0.0, L * ic, 0.0), ic

    def back(self, gb, i, node, L, walk):
        """CROWN's averaged planes, or on the neurons :meth:`free_mix` names each row's own
        mix of McCormick's planes (``walk.free``, (r, size) in [0, 1]: :func:`mixed_planes`)."""
        p, q = node.inputs
        a, b, icL, icU = gb.planes[i]
        icpt, ic = self._intercepts(L, icL, icU)
        corner = None
        if walk.free is not None and i in walk.free:
            on = self.free_mix(gb, i, node)
            ends = tuple(np.where(on, v, 0.0) for v in (gb.lo[p], gb.hi[p], gb.lo[q], gb.hi[q]))
            t = np.clip(walk.free[i], 0.0, 1.0)
            am, bm, icm, c1, c2 = mixed_planes(*ends, t, L >= 0.0)
            a, b, ic = np.where(on, am, a), np.where(on, bm, b), np.where(on, icm, ic)
            icpt = np.where(on, L * icm, icpt)
            corner = (ends, c1, c2)
        D1, D2 = L * a, L * b
        if walk.tape is not None:
            walk.tape[i] = (L, np.where(L != 0.0, ic, 0.0), a, b, corner)
        walk.const = walk.const + icpt.sum(axis=-1)
        walk.mag = walk.mag + np.abs(icpt).sum(axis=-1)
        for j, D in ((p, D1), (q, D2)):
            z = gb.absval[j]
            walk.charge = walk.charge + ActivationRule.charge(_abs_dot(D, z), z)
        walk.give(p, D1)
        walk.give(q, D2)

    def free_mix(self, gb, i, node):
        """The products whose factors both have finite bounds of positive width (else one
        factor is a constant, or no plane is finite, and the planes are fixed)."""
        p, q = node.inputs
        on = np.isfinite(gb.lo[p]) & np.isfinite(gb.hi[p]) & np.isfinite(gb.lo[q]) \
            & np.isfinite(gb.hi[q]) & (gb.lo[p] < gb.hi[p]) & (gb.lo[q] < gb.hi[q])
        return on if on.any() else None

    def back_t(self, gb, i, node, rows, walk):
        idx, Lt = rows
        p, q = node.inputs
        a, b, icL, icU = (_take(v, idx) for v in gb.planes[i])
        z1, z2 = _take(gb.absval[p], idx), _take(gb.absval[q], idx)
        dt = Lt.dtype
        if not (np.all(np.isfinite(icL)) and np.all(np.isfinite(icU)) and np.all(np.isfinite(z1))
                and np.all(np.isfinite(z2))):
            return self._back_t_unbounded(gb, i, node, rows, walk)
        # one numba pass (the fast path runs under the numba kernels only; its numpy twin is
        # :meth:`back` on the same rows, and tests/test_graph_kernels.py's sums)
        Lt = np.ascontiguousarray(Lt)
        D1t, D2t, sums = np.empty_like(Lt), np.empty_like(Lt), np.empty((Lt.shape[1], 3))
        walk.kernels.product_step_t(Lt, a.astype(dt), b.astype(dt), icL, icU, z1, z2, D1t, D2t,
                                    sums)
        walk.acc[0] += sums[:, 0]
        walk.acc[1] += sums[:, 1]
        # the two factors' steps' charge (ActivationRule.charge): 2u sum |L| (|a| z1 + |b| z2)
        walk.acc[2] += 2.0 * U64 * sums[:, 2] + TINY64 * (z1.sum() + z1.size + z2.sum()
                                                          + z2.size)
        walk.give(p, (idx, D1t))
        walk.give(q, (idx, D2t))

    def _back_t_unbounded(self, gb, i, node, rows, walk):
        """:meth:`back_t` where an intercept or an input's magnitude is infinite (a factor
        without a bound): a 0 coefficient contributes 0 there, not nan."""
        idx, Lt = rows
        p, q = node.inputs
        a, b, icL, icU = (_take(v, idx)[:, None] for v in gb.planes[i])
        dt = Lt.dtype
        D1t, D2t = Lt * a.astype(dt), Lt * b.astype(dt)
        icpt, _ = self._intercepts(Lt.astype(np.float64), icL, icU)
        walk.acc[0] += icpt.sum(axis=0)
        walk.acc[1] += np.abs(icpt).sum(axis=0)
        for j, Dt in ((p, D1t), (q, D2t)):
            z = _take(gb.absval[j], idx)
            walk.acc[2] += ActivationRule.charge(_abs_dot(Dt.astype(np.float64).T, z), z)
        walk.give(p, (idx, np.ascontiguousarray(D1t)))
        walk.give(q, (idx, np.ascontiguousarray(D2t)))

    def relaxed(self, gb, i, node, vals, x, tape, free):
        _, ic, a, b, _ = tape[i]
        p, q = node.inputs
        return a * vals[p] + b * vals[q] + ic


class PoolRule(Rule):
    refines_input = True
    held = 5  # the window's chosen input, its bounds, the dominance mask

    def interval(self, gb, i, node):
        p = node.inputs[0]
        gb.pools[i] = PoolLines(node.op.windows, gb.lo[p], gb.hi[p])
        return gb.pools[i].lo, gb.pools[i].hi

    @staticmethod
    def step(gb, i, L):
        """The pool's default lines applied to the rows L (r, m): (rows over its input,
        constant, magnitude, rounding charge) per row."""
        p = gb.g.nodes[i].inputs[0]
        D, dconst, dmag, T = gb.pools[i].back(L)
        wsum = np.abs(L) @ gb.pools[i].absval_of(gb.absval[p]) if T > 1 else None
        return D, dconst, dmag, PoolRule.overlap_charge(gb, p, T, wsum)

    @staticmethod
    def overlap_charge(gb, p, T: int, wsum):
        """The rounding charge of a pool step's sums where windows overlap (T > 1: up to T
        coefficients summed per input; ``wsum`` per row, sum |coefficient| |chosen input|),
        else 0."""
        if T <= 1:
            return 0.0
        return gamma_n(T + 1, U64) * wsum + TINY64 * T * float(gb.absval[p].sum())

    def back(self, gb, i, node, L, walk):
        """The default lines, or the caller's per-row lower-line weights (``walk.free``)."""
        p = node.inputs[0]
        if walk.tape is not None:
            walk.tape[i] = L
        if walk.free is not None and i in walk.free:
            D, dconst, dmag, _, ch = gb.pools[i].back(L, walk.free[i], gb.absval[p])
        else:
            D, dconst, dmag, ch = self.step(gb, i, L)
        walk.const, walk.mag, walk.charge = walk.const + dconst, walk.mag + dmag, \
            walk.charge + ch
        walk.give(p, D)

    def back_win(self, gb, i, node, win, walk):
        """:meth:`step` on windows, for a pool of known geometry (``MaxPool.geometry``):
        each row's window over the output becomes one over the input (origin times the
        stride less the padding; size grown by the strides and the kernel), every
        coefficient at its window's chosen input or in the constant
        (``graph_steps.win_pool_t``)."""
        geo = getattr(node.op, "geometry", None)
        shape, p = _image(node), node.inputs[0]
        if geo is None or shape is None or _image(gb.g.nodes[p]) != tuple(geo[0]):
            return False
        (C, H, W), (kh, kw), (sh, sw), (pt, pl), (dh, dw) = geo
        chosen = self._chosen(gb, i, shape, geo)
        if chosen is None:
            return False
        h, w, r = win.Pt.shape[1], win.Pt.shape[2], win.Pt.shape[3]
        h2, w2 = (h - 1) * sh + (kh - 1) * dh + 1, (w - 1) * sw + (kw - 1) * dw + 1
        noy, nox = win.oy * sh - pt, win.ox * sw - pl
        if not _fits(noy, nox, h2, w2, H, W):  # windows as large as the rows: leave them
            return False
        Dt = np.zeros((C, h2, w2, r), win.Pt.dtype)
        sums = np.empty((r, 3))
        walk.kernels.win_pool_t(win.Pt, win.oy, win.ox, window_runs(win), *chosen,
                                np.stack([noy, nox]), Dt, sums)
        walk.acc[0] += sums[:, 0]
        walk.acc[1] += sums[:, 1]
        pool = gb.pools[i]
        if pool.terms > 1:
            walk.acc[2] += self.overlap_charge(gb, p, pool.terms, sums[:, 2])
        walk.give(p, Win(noy, nox, Dt, window_runs(win)))  # places moved alike
        return True

    @staticmethod
    def _chosen(gb, i, shape, geo):
        """What ``win_pool_t`` reads of pool i, kept on ``gb``: each output position's
        chosen input's (row, column), (2, C, OH, OW), and its lines (3, C, OH, OW): hi, 1
        where the window is exact, the chosen input's magnitude. None unless every chosen
        input lies in its own channel within the kernel's reach of the position (origin
        times the stride less the padding): what keeps the kernel's writes inside each
        row's window over the input."""
        cache = gb.__dict__.setdefault("_pool_chosen", {})
        if i not in cache:
            (C, H, W), (kh, kw), (sh, sw), (pt, pl), (dh, dw) = geo
            pool = gb.pools[i]
            src = pool.src.reshape(shape)
            within = src % (H * W)
            ys, xs = within // W, within % W
            dy = ys - (np.arange(shape[1]) * sh - pt)[None, :, None]
            dx = xs - (np.arange(shape[2]) * sw - pl)[None, None, :]
            ok = np.all(src // (H * W) == np.arange(C)[:, None, None]) and \
                dy.min() >= 0 and dy.max() <= (kh - 1) * dh and \
                dx.min() >= 0 and dx.max() <= (kw - 1) * dw
            absval = gb.absval[gb.g.nodes[i].inputs[0]]
            lines = np.stack([pool.hi, pool.exact.astype(np.float64), absval[pool.src]])
            cache[i] = (np.stack([ys, xs]), lines.reshape((3,) + shape)) if ok else None
        return cache[i]

    def back_t(self, gb, i, node, rows, walk):
        """:meth:`step` on rows held transposed, without leaving that layout: each window's
        coefficient goes to its input k* (the lower line) or into the constant (the upper);
        the rows handed on are on the inputs some live window takes."""
        import scipy.sparse as sp

        pool, p = gb.pools[i], node.inputs[0]
        idx, Lt = rows
        src, hi, exact = (pool.src, pool.hi, pool.exact) if idx is None else \
            (pool.src[idx], pool.hi[idx], pool.exact[idx])
        use = (Lt >= 0.0) | exact[:, None]
        c = np.where(use, 0.0, Lt * hi[:, None])  # (float64: a float32 pass's too)
        walk.acc[0] += c.sum(axis=0)
        walk.acc[1] += np.abs(c).sum(axis=0)
        if pool.terms > 1:
            walk.acc[2] += self.overlap_charge(gb, p, pool.terms,
                                               gb.absval[p][src] @ np.abs(Lt))
        live, where = np.unique(src, return_inverse=True)
        gather = sp.csr_matrix((np.ones(src.size, Lt.dtype), (where, np.arange(src.size))),
                               shape=(live.size, src.size))
        D = np.asarray(gather @ np.where(use, Lt, 0.0), Lt.dtype)
        if live.size > LIVE_SHARE * gb.g.nodes[p].size:
            live, D = None, _full((live, D), gb.g.nodes[p].size)
        walk.give(p, (live, np.ascontiguousarray(D)))

    def relaxed(self, gb, i, node, vals, x, tape, free):
        """The window's lower input (or the row's weighted sum of the window) where the row
        took the lower line, else the upper constant."""
        pool, L = gb.pools[i], tape[i]
        use = (L >= 0.0) | pool.exact
        xin = vals[node.inputs[0]]
        if free is not None and i in free:
            w = pool.effective(free[i])
            low = np.sum(w * xin[:, np.maximum(pool.windows, 0)], axis=-1)
        else:
            low = xin[:, pool.src]
        return np.where(use, low, pool.hi)


class PoolLines:
    """The linear bounds of a max pool on input intervals [lo, hi]: per window, the input
    k* with the largest lower bound; ``x_k* <= y`` (the lower line), and ``y <= max_k hi_k``
    (the upper line, a constant), or ``y = x_k*`` where k*'s lower bound is at least every
    other input's upper bound. ``lo``, ``hi``: the output's exact interval."""

    def __init__(self, windows, lo, hi):
        import scipy.sparse as sp

        pad = windows < 0
        w0 = np.maximum(windows, 0)
        lw = np.where(pad, -np.inf, lo[w0])
        hw = np.where(pad, -np.inf, hi[w0])
        best = np.argmax(lw, axis=1)
        rows = np.arange(windows.shape[0])
        self.src = windows[rows, best]
        self.lo, self.hi = lw[rows, best], hw.max(axis=1)
        others = hw.copy()
        others[rows, best] = -np.inf
        self.exact = self.lo >= others.max(axis=1)  # k* dominates: y = x_k*
        n_in = lo.size
        self.P = sp.csr_matrix((np.ones(rows.size), (self.src, rows)), shape=(n_in, rows.size))
        self.terms = int(np.bincount(self.src, minlength=n_in).max(initial=0))
        self.windows, self.best = windows, best
        # for weighted lower lines: window entry (j, k) -> its input (padding dropped)
        m, K = windows.shape
        flat = np.flatnonzero(~pad.reshape(-1))
        self.Pw = sp.csr_matrix((np.ones(flat.size), (w0.reshape(-1)[flat], flat)),
                                shape=(n_in, m * K))
        self.terms_w = int(np.bincount(w0.reshape(-1)[flat], minlength=n_in).max(initial=0))
        self.ymax = np.maximum(np.abs(self.lo), np.abs(self.hi))  # |y| <= ymax

    def absval_of(self, absval_in):
        return absval_in[self.src]

    def one_hot(self, r: int) -> np.ndarray:
        """Weights (r, m, K) of the default lower line: 1 on each window's input k*."""
        w = np.zeros((r,) + self.windows.shape)
        w[:, np.arange(self.windows.shape[0]), self.best] = 1.0
        return w

    def effective(self, weights) -> np.ndarray:
        """The weights a weighted lower line uses: ``weights`` (r, m, K) clipped at 0, 0 on
        padding, and 1 on k* where k* dominates its window (y = x_k* there)."""
        w = np.where(self.exact[None, :, None], self.one_hot(1), weights)
        return np.where(self.windows[None] >= 0, np.maximum(w, 0.0), 0.0)

    def back(self, L, weights=None, absval_in=None):
        """The rows L (r, m) over the output through the lines: (rows over the input,
        constant, its magnitude, most coefficients summed per input). ``weights`` (r, m, K),
        optional: per row and window a lower line ``y >= sum_k w_k x_k`` instead of
        ``y >= x_k*`` (w >= 0 on the window's inputs, summing to 1 up to rounding; where k*
        dominates the window the weights are not used). Returns then a fifth value: the
        rounding charge of the weighted sums, given ``absval_in`` (bounds of the inputs'
        magnitudes; the caller adds it)."""
        use = (L >= 0.0) | self.exact
        c = np.where(use, 0.0, L * self.hi)
        if weights is None:
            Lu = np.where(use, L, 0.0)
            return (np.ascontiguousarray((self.P @ Lu.T).T, dtype=steer_dtype(L)), c.sum(axis=-1),
                    np.abs(c).sum(axis=-1), self.terms)
        r, (m, K) = L.shape[0], self.windows.shape
        w = self.effective(weights)
        # sum_k w_k x_k <= S y with S = sum_k w_k (exact) > 0, and |S - 1| <= delta: the
        # line y >= sum_k w_k x_k - delta ymax holds for the weights as they are
        s = w.sum(axis=-1)
        delta = (np.abs(s - 1.0) + gamma_n(K + 1, U64) * s) * (1.0 + 4.0 * U64)
        delta = np.where(self.exact[None], 0.0, delta)
        Lu = np.where(use, L, 0.0)
        C = (Lu[:, :, None] * w).reshape(r, m * K)
        c = c - Lu * delta * self.ymax
        D = np.ascontiguousarray((self.Pw @ C.T).T, dtype=steer_dtype(L))
        valid = self.windows >= 0
        aw = np.where(valid, absval_in[np.maximum(self.windows, 0)], 0.0).reshape(-1)
        # each input's coefficient: up to terms_w rounded products summed
        charge = (gamma_n(self.terms_w + 1, U64) * (np.abs(C) @ aw)
                  + TINY64 * self.terms_w * float(absval_in.sum()))
        return D, c.sum(axis=-1), np.abs(c).sum(axis=-1), self.terms_w, charge


_RULES = [(InputOp, InputRule()), (ActivationOp, ActivationRule()), (MaxPool, PoolRule()),
          (Conv, ConvRule()), (Sum, SumRule()), (Product, ProductRule()),
          (IndexMap, IndexMapRule()), (Scale, ScaleRule())]
_AFFINE = AffineRule()


def rule_of(node) -> Rule:
    """The rules of a node, by its operation's type."""
    for cls, rule in _RULES:
        if isinstance(node.op, cls):
            return rule
    if isinstance(node.op, Affine):
        return _AFFINE
    raise ValueError(f"node {node.name}: no bound rules for {type(node.op).__name__}")


def plan(graph):
    """The rules of every node of ``graph``, in its order."""
    return [rule_of(n) for n in graph.nodes]
