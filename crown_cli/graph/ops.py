"""The operations of a graph network: affine maps with their transposes, activations, MaxPool.

Every value is a batch of flat vectors (N, n): a node's tensor flattened in row-major order
of its ONNX shape. An affine operation maps its inputs' values to ``A(x_1, ..., x_k) + b``
and offers four things:

- ``forward(xs)``: ``A(xs) + b`` for a batch (float64); ``linear(xs)``: ``A(xs)``, no bias
  (:mod:`crown_cli.graph.lower` reads an operation's matrix from it);
- ``forward_abs(xs)``: ``|A|(xs)``, the same map with every coefficient replaced by its
  absolute value and no bias (for interval radii and rounding allowances; xs >= 0);
- ``transpose(Lam)``: the rows ``Lam`` (r, m) over the output pulled back to each input,
  ``[Lam A_1, ..., Lam A_k]`` (a convolution's is a transposed convolution, a gather's a
  scatter-add; no operation builds the dense matrix of a convolution);
- ``terms``, ``terms_fwd``: the largest number of products summed into one element of
  ``transpose`` and of ``forward`` (0: exact, no rounding), for the rounding charges of
  :mod:`crown_cli.engine.graph_bounds` (gamma_terms of the products' magnitudes).

``bias`` is the constant vector b (m,) or None. The max pool is in
:mod:`crown_cli.graph.pooling`.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

import numpy as np


# Conv.transpose runs row by row (skipping zeros) where the rows fill less than this share of
# the output elements they touch together, else along the rows on those elements: the row-wise
# kernel runs at about a fifth of the speed per product (measured on 3x3 convolutions of
# 16-64 channels, 8x8 to 32x32, 9 to 256 rows)
ROW_BY_ROW = 0.2
# Conv.transpose_t by BLAS (Conv.blas_pays) from this many channels in and out per group,
# where the kernel would do at least this share of BLAS's products
BLAS_MIN_CHANNELS = 32
BLAS_MIN_LIVE = 0.75


def is_sparse(w) -> bool:
    # a scipy sparse matrix exists only once scipy.sparse is imported: a dense network's
    # graph (one network type) is built without importing scipy, which a warm CLI skips
    sp = sys.modules.get("scipy.sparse")
    return sp is not None and sp.issparse(w)


# The one sparse policy: a weight of at least SPARSE_MIN_SIZE entries is kept sparse by the
# loader (graph/onnx_ops.py) at most SPARSE_LOAD_DENSITY nonzero, and multiplied as a CSR
# matrix by ReLU splitting's per-domain bounds (verification/bab/domain_bounds.py) at most
# SPARSE_PRODUCT_DENSITY nonzero (verivital's lowered 2x2 convolution: 23328 x 784, 0.5%
# nonzero; oval21's second convolution 1024 x 2048, 5.5%: 512 float32 rows in 4 ms sparse,
# 11 ms dense)
SPARSE_MIN_SIZE = 2 ** 20
SPARSE_LOAD_DENSITY, SPARSE_PRODUCT_DENSITY = 0.1, 0.12


def sparse_enough(w, density: Optional[float] = None) -> bool:
    """Whether ``w`` has at least :data:`SPARSE_MIN_SIZE` entries, at most ``density``
    (default :data:`SPARSE_PRODUCT_DENSITY`) of them nonzero."""
    density = SPARSE_PRODUCT_DENSITY if density is None else density
    return w.size >= SPARSE_MIN_SIZE and np.count_nonzero(w) <= density * w.size


def _owned(x) -> np.ndarray:
    """``x`` as a C-ordered, writable float64 array (a copy where it is not one: an ONNX
    tensor's array is read-only, and numba compiles a kernel once per such array type)."""
    return np.require(x, np.float64, ["C", "W"])


class Affine:
    kind = "affine"
    bias: Optional[np.ndarray] = None
    terms = 0
    terms_fwd = 0

    def parameters(self) -> int:
        return 0

    def describe(self) -> str:
        return type(self).__name__.lower()

    def vjp(self, L, xs, relu_leak=None):
        """The rows L (N, size) times the operation's Jacobian, per input (linear: its
        transpose)."""
        return self.transpose(L)


class Dense(Affine):
    """``y = W x + b``; W an ndarray (m, n) or a scipy.sparse matrix (kept sparse: CSR for the
    forward map and CSR of W^T for the transpose)."""

    def __init__(self, W, b=None, label: str = ""):
        self.label = label  # what the loader made it of (e.g. an average pool), for inspect
        self._absW = None
        if is_sparse(W):
            import scipy.sparse as sp

            self.W = sp.csr_matrix(W, dtype=np.float64)
            self.W.sum_duplicates()
            self._WT = self.W.T.tocsr()  # (n, m): rows of the transpose
            nnz_rows = np.diff(self.W.indptr)
            nnz_cols = np.diff(self._WT.indptr)
            self.terms_fwd = int(nnz_rows.max(initial=0)) + 1
            self.terms = int(nnz_cols.max(initial=0))
        else:
            self.W = _owned(W)
            self.terms_fwd = self.W.shape[1] + 1
            self.terms = self.W.shape[0]
        self.bias = None if b is None else _owned(b).reshape(-1)
        self.n_in = [int(self.W.shape[1])]
        self.size = int(self.W.shape[0])

    @property
    def sparse(self) -> bool:
        return is_sparse(self.W)

    def linear(self, xs):
        return _right(xs[0], typed(self, "W", steer_dtype(xs[0])))

    def forward(self, xs):
        y = self.linear(xs)
        return y if self.bias is None else y + typed(self, "bias", steer_dtype(xs[0]))

    def forward_abs(self, xs):
        if self._absW is None:  # made when first needed: a dense network's graph form (one
            self._absW = abs(self.W)  # network type) need not hold |W| beside its W
        return _right(xs[0], self._absW)

    def transpose(self, Lam):
        if self.sparse:  # (W^T Lam^T)^T with W^T in CSR
            return [np.ascontiguousarray((self._WT @ Lam.T).T, dtype=steer_dtype(Lam))]
        return [Lam @ typed(self, "W", steer_dtype(Lam))]

    def transpose_t(self, Lt, idx):
        """The transpose on rows held transposed (a sparse W): ``W^T Lt`` (n_in, r), where
        ``Lt`` holds the coefficients of the outputs ``idx`` (None: all)."""
        WT = self._WT if idx is None else self.W[idx].T
        return [np.ascontiguousarray(WT @ Lt, dtype=Lt.dtype)]

    def mirrors(self) -> np.ndarray:
        """Per output k, an earlier output k' whose affine function is exactly the negation
        of k's (``W[k'] = -W[k]``, ``b[k'] = -b[k]``: softmax's ``x_j - x_i`` beside
        ``x_i - x_j``), else -1 (a zero row too). Bounds of k are then those of k' negated and
        swapped (negation is exact). Cached."""
        if getattr(self, "_mirrors", None) is None:
            m = self.size
            out = np.full(m, -1, np.int64)
            W = self.W if self.sparse else None
            b = np.zeros(m) if self.bias is None else self.bias
            seen = {}
            for k in range(m):
                if W is not None:
                    lo, hi = W.indptr[k], W.indptr[k + 1]
                    idx, val = W.indices[lo:hi], W.data[lo:hi]
                    order = np.argsort(idx, kind="stable")
                    idx, val = idx[order], val[order]
                else:
                    idx, val = np.flatnonzero(self.W[k]), self.W[k][self.W[k] != 0.0]
                if idx.size == 0:
                    continue
                key = (idx.tobytes(), val.tobytes(), float(b[k]))
                neg = (idx.tobytes(), (-val).tobytes(), float(-b[k]))
                if neg in seen:
                    out[k] = seen[neg]
                else:
                    seen.setdefault(key, k)
            self._mirrors = out
        return self._mirrors

    def parameters(self) -> int:
        if self.label:  # a fixed map the loader made (an average pool): nothing learned
            return 0
        nb = 0 if self.bias is None else self.bias.size
        return int((self.W.nnz if self.sparse else self.W.size) + nb)

    def describe(self) -> str:
        m, n = self.W.shape
        text = f"{self.label or 'dense'} {n} -> {m}"
        return text + (f" (sparse, {self.W.nnz} nonzeros)" if self.sparse else "")

    def scaled(self, a, c):
        """This layer followed by ``a * y + c`` (elementwise), as one layer."""
        if self.sparse:
            import scipy.sparse as sp

            W = sp.diags(a) @ self.W
        else:
            W = self.W * a[:, None]
        b = c if self.bias is None else a * self.bias + c
        return Dense(W, b, self.label)


def after_scale(op, a, c):
    """``a * x + c`` followed by the affine ``op`` (Dense with a dense matrix, or Conv) as
    one operation, or None where that is not possible."""
    if isinstance(op, Conv):
        return op.after_scale(a, c)
    if isinstance(op, Dense) and not op.sparse and not op.label:
        b = op.W @ c if op.bias is None else op.W @ c + op.bias
        return Dense(op.W * a[None, :], b)
    return None


def _right(x, W):
    """x (N, n) times W^T for a dense or sparse W (m, n)."""
    if is_sparse(W):
        return np.ascontiguousarray((W @ x.T).T)
    return x @ W.T


def typed(op, name: str, dtype):
    """The array ``op.<name>`` as ``dtype``: itself for float64, else a copy kept on the op
    (a float32 steering pass's weights and biases, made once)."""
    a = getattr(op, name)
    if a is None or np.dtype(dtype) == np.float64 or is_sparse(a):
        return a
    cache = op.__dict__.setdefault("_typed", {})
    if (name, dtype) not in cache:
        cache[name, dtype] = np.ascontiguousarray(a, dtype)
    return cache[name, dtype]


def steer_dtype(x):
    """The dtype rows and values keep through a step: float32 for a float32 array (a steering
    pass), else float64."""
    return np.float32 if getattr(x, "dtype", None) == np.float32 else np.float64


class Conv(Affine):
    """2-D convolution (cross-correlation, as ONNX's Conv) of an input (C, H, W) with weights
    (O, C / group, kh, kw), strides, pads (top, left, bottom, right), dilations, groups.

    The forward map runs as BLAS products on the input's windows (im2col, in chunks of
    rows), its transpose as numba kernels (which skip zero coefficients); their numpy twins
    loop over the kh * kw kernel offsets, each offset a product over channels added into a
    strided window. None forms the convolution's dense matrix."""

    def __init__(self, weight, bias, in_shape, strides=(1, 1), pads=(0, 0, 0, 0),
                 dilations=(1, 1), group=1, label: str = ""):
        self.weight = _owned(weight)
        self.label = label  # what the loader made it of (an average pool), for inspect
        O, Cg, kh, kw = self.weight.shape
        C, H, W = (int(v) for v in in_shape)
        if C != Cg * group or O % group:
            raise ValueError(f"weights {self.weight.shape} do not fit {C} input channels "
                             f"in {group} groups")
        self.in_shape = (C, H, W)
        self.strides, self.pads = tuple(map(int, strides)), tuple(map(int, pads))
        self.dilations, self.group = tuple(map(int, dilations)), int(group)
        sh, sw = self.strides
        dh, dw = self.dilations
        pt, pl, pb, pr = self.pads
        OH = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
        OW = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
        if OH < 1 or OW < 1:
            raise ValueError(f"kernel {kh}x{kw} does not fit the padded input {H}x{W}")
        self.out_shape = (O, OH, OW)
        self.channel_bias = None if bias is None else np.asarray(bias, np.float64).reshape(O)
        self.bias = None if bias is None else np.repeat(self.channel_bias, OH * OW)
        self.n_in = [C * H * W]
        self.size = O * OH * OW
        self.terms_fwd = Cg * kh * kw + 1
        self.terms = (O // group) * kh * kw
        self._abs = None

    def _windows(self):
        """For each kernel offset (i, j): the slices of the padded input it reads."""
        O, OH, OW = self.out_shape
        sh, sw = self.strides
        dh, dw = self.dilations
        kh, kw = self.weight.shape[2:]
        for i in range(kh):
            for j in range(kw):
                yield i, j, (slice(i * dh, i * dh + sh * (OH - 1) + 1, sh),
                             slice(j * dw, j * dw + sw * (OW - 1) + 1, sw))

    def _groups(self):
        O, Cg = self.weight.shape[:2]
        Og = O // self.group
        for g in range(self.group):
            yield slice(g * Og, (g + 1) * Og), slice(g * Cg, (g + 1) * Cg)

    def _conv(self, x, weight):
        """The convolution of the batch x (N, C * H * W) with ``weight``, no bias, in x's
        dtype: BLAS products on the input's windows (:meth:`_conv_gemm`), in chunks of rows
        whose windows take at most :data:`GEMM_BYTES`; under the numpy kernels, or where
        one row's windows take more, the offset-by-offset twin :meth:`_conv_numpy`."""
        from crown_cli.engine.kernels import graph_kernels

        step = GEMM_BYTES // self.window_bytes()
        if graph_kernels() is None or step < 1:  # (one row's windows past the budget)
            return self._conv_numpy(x, weight)
        N = x.shape[0]
        if N <= step:
            return self._conv_gemm(x, weight)
        return np.concatenate([self._conv_gemm(x[s:s + step], weight)
                               for s in range(0, N, step)])

    def window_bytes(self) -> int:
        """The bytes of one row's windows (im2col) as float64."""
        O, OH, OW = self.out_shape
        return 8 * self.in_shape[0] * OH * OW * self.weight.shape[2] * self.weight.shape[3]

    def _conv_gemm(self, x, weight):
        """The convolution of the rows x as BLAS products, in x's dtype: the input's windows
        gathered by strides (im2col) times the kernel, per group. With at least
        :data:`GEMM_MIN_PLACES` output positions the windows are held (N, C kh kw, OH OW) and
        the kernel multiplies each row's (the output comes out in place); with fewer, one
        product of all rows' windows (N OH OW, C kh kw), then transposed. Each output is the
        sum of its Cg * kh * kw products (in BLAS's order). Measured on 64 rows, float32 and
        float64, mixed with other BLAS work: 1.3-3x the loop kernel it replaced
        (docs/benchmarks.md)."""
        N, C = x.shape[0], self.in_shape[0]
        xp = self._padded(x)
        O, OH, OW = self.out_shape
        kh, kw = weight.shape[2:]
        (sh, sw), (dh, dw) = self.strides, self.dilations
        sN, sC, sH, sW = xp.strides
        dt = np.result_type(xp.dtype, weight.dtype)
        if OH * OW >= GEMM_MIN_PLACES:
            win = np.lib.stride_tricks.as_strided(
                xp, (N, C, kh, kw, OH, OW), (sN, sC, sH * dh, sW * dw, sH * sh, sW * sw),
                writeable=False)
            out = np.empty((N, O, OH * OW), dt)
            for go, gc in self._groups():
                cols = np.ascontiguousarray(win[:, gc]).reshape(N, -1, OH * OW)
                np.matmul(weight[go].reshape(weight[go].shape[0], -1), cols, out=out[:, go])
            return out.reshape(N, -1)
        win = np.lib.stride_tricks.as_strided(
            xp, (N, OH, OW, C, kh, kw), (sN, sH * sh, sW * sw, sC, sH * dh, sW * dw),
            writeable=False)
        out = np.empty((N, OH * OW, O), dt)
        for go, gc in self._groups():
            cols = np.ascontiguousarray(win[:, :, :, gc]).reshape(N * OH * OW, -1)
            out[:, :, go] = (cols @ weight[go].reshape(weight[go].shape[0], -1).T).reshape(
                N, OH * OW, -1)
        return np.ascontiguousarray(out.transpose(0, 2, 1)).reshape(N, -1)

    def _padded(self, x):
        """The batch x (N, C * H * W) as images (N, C, H', W') with the zero padding, in x's
        dtype."""
        N = x.shape[0]
        C, H, W = self.in_shape
        pt, pl, pb, pr = self.pads
        xp = np.zeros((N, C, H + pt + pb, W + pl + pr), steer_dtype(x))
        xp[:, :, pt:pt + H, pl:pl + W] = x.reshape(N, C, H, W)
        return xp

    def _conv_numpy(self, x, weight):
        N = x.shape[0]
        xp = self._padded(x)
        O, OH, OW = self.out_shape
        out = np.zeros((N, O, OH, OW), np.result_type(xp.dtype, weight.dtype))
        for i, j, (si, sj) in self._windows():
            for go, gc in self._groups():
                patch = xp[:, gc, si, sj]  # (N, Cg, OH, OW)
                out[:, go] += np.einsum("oc,nchw->nohw", weight[go, :, i, j], patch, optimize=True)
        return out.reshape(N, -1)

    def linear(self, xs):
        return self._conv(xs[0], typed(self, "weight", steer_dtype(xs[0])))

    def forward(self, xs):
        y = self.linear(xs)
        return y if self.bias is None else y + typed(self, "bias", steer_dtype(xs[0]))

    def forward_abs(self, xs):
        if self._abs is None:
            self._abs = np.abs(self.weight)
        return self._conv(xs[0], self._abs)

    def transpose(self, Lam):
        """The transposed convolution of the rows Lam (r, O * OH * OW): the numba kernel of
        :mod:`crown_cli.engine.kernels.graph_steps` on the rows held transposed (the loop
        along the rows vectorised), on the output elements some row touches and the input
        elements they reach; row by row, skipping zeros, where the rows fill less than
        :data:`ROW_BY_ROW` of the elements they touch together (an intermediate neuron's
        rows, each on its own receptive field); or under the numpy kernels its twin
        :meth:`_transpose_numpy`."""
        from crown_cli.engine.kernels import graph_kernels

        kernels = graph_kernels()
        if kernels is None:
            return self._transpose_numpy(Lam)
        dt = steer_dtype(Lam)  # a float32 steering pass stays float32
        Lam = np.asarray(Lam, dt)
        weight = typed(self, "weight", dt)
        r, n_in = Lam.shape[0], self.n_in[0]
        nz = Lam != 0.0
        live = np.flatnonzero(np.any(nz, axis=0))
        if np.count_nonzero(nz) < ROW_BY_ROW * r * live.size:  # rows sparse on the union
            G = kernels.transpose_rows(Lam.reshape((r,) + self.out_shape), weight,
                                       self.strides, self.dilations, self.pads, self.group,
                                       self.in_shape)
            return [G.reshape(r, -1)]
        spatial = np.flatnonzero(self.reach(live).reshape(-1))
        targets = self.elements(spatial)
        Gt = self.transpose_t(np.ascontiguousarray(Lam[:, live].T), live, spatial,
                              weight, kernels)
        if targets.size == n_in:
            return [np.ascontiguousarray(Gt.T)]
        G = np.zeros((r, n_in), dt)
        G[:, targets] = Gt.T
        return [G]

    def transpose_t(self, Lt, idx, pos, weight, kernels, on=None) -> np.ndarray:
        """The transposed convolution of rows held transposed on the output elements ``idx``
        (None: all), ``Lt`` (k, r), on every channel of the input positions ``pos`` (flat
        (H, W) indices, sorted; every position their products reach), the elements
        :meth:`elements` gives, or those of them ``on`` (bool, one per element) marks:
        (elements, r), by the numba kernel ``conv_transpose_t`` with ``weight`` (this
        convolution's, in Lt's dtype), or by BLAS (:meth:`transpose_blas_t`) where that is
        faster (:meth:`blas_pays`)."""
        if self.blas_pays(idx, pos, on):
            targets = self.elements(pos)
            return self.transpose_blas_t(Lt, idx, targets if on is None else targets[on],
                                         weight)
        src = np.full(self.size, -1, np.int64)
        if idx is None:
            src[:] = np.arange(self.size)
        else:
            src[idx] = np.arange(idx.size)
        n = self.in_shape[0] * pos.size
        if on is None:
            dst = np.arange(n, dtype=np.int64)
        else:
            dst = np.where(on, np.cumsum(on) - 1, -1).astype(np.int64)
            n = int(np.count_nonzero(on))
        Gt = np.empty((n, Lt.shape[1]), Lt.dtype)
        kernels.conv_transpose_t(Lt, src, np.asarray(pos, np.int64), dst, weight,
                                 np.asarray(self.in_shape, np.int64),
                                 np.asarray(self.out_shape, np.int64),
                                 *kernels.conv_args(self.strides, self.dilations, self.pads,
                                                    self.group), Gt)
        return Gt

    def elements(self, pos) -> np.ndarray:
        """The input elements (flat (C, H, W) indices) of every channel at the positions
        ``pos`` (flat (H, W) indices), channel by channel."""
        C, H, W = self.in_shape
        return (np.arange(C)[:, None] * (H * W) + np.asarray(pos)[None, :]).reshape(-1)

    def blas_pays(self, idx, pos=None, on=None) -> bool:
        """Whether the BLAS transpose beats the kernel on the output elements ``idx`` (None:
        all) and the input elements of :meth:`transpose_t` (``pos``, ``on``; None: all):
        both channel counts (per group) at least :data:`BLAS_MIN_CHANNELS` (below, its
        strided additions dominate), and the kernel's products at least
        :data:`BLAS_MIN_LIVE` of BLAS's. BLAS takes every kernel offset at every output
        position and every input element; the kernel only the live outputs, the input
        elements asked for, and the offsets that land inside the input (:meth:`_inside`:
        1/9 of a 3x3 kernel's on a 1 x 1 input). Measured on one core: BLAS 1.1-4x the
        kernel's speed per product at 32-128 channels, 0.8x at 3-16 channels; on real rows
        (inputs of inactive ReLUs not asked for, small images) the kernel 2.5x BLAS on
        torchvision's ResNet-18 where only the outputs' share was counted
        (docs/benchmarks.md)."""
        O, Cg = self.weight.shape[:2]
        if min(Cg, O // self.group) < BLAS_MIN_CHANNELS:
            return False
        share = (1.0 if idx is None else idx.size / self.size) * self._inside()
        C, H, W = self.in_shape
        if on is not None:
            share *= np.count_nonzero(on) / (C * H * W)
        elif pos is not None:
            share *= len(pos) / (H * W)
        return share >= BLAS_MIN_LIVE

    def _inside(self) -> float:
        """The share of (kernel offset, output position) pairs whose input lies inside the
        image (not in the padding)."""
        if getattr(self, "_inside_share", None) is None:
            share = 1.0
            for k, n, o, s, d, p in zip(self.weight.shape[2:], self.in_shape[1:],
                                        self.out_shape[1:], self.strides, self.dilations,
                                        self.pads[:2]):
                at = np.arange(o)[:, None] * s - p + np.arange(k)[None, :] * d
                share *= np.count_nonzero((at >= 0) & (at < n)) / at.size
            self._inside_share = share
        return self._inside_share

    def transpose_blas_t(self, Lt, idx, targets, weight) -> np.ndarray:
        """:meth:`transpose_t` by BLAS: per kernel offset and group one matrix product
        (Cg, Og) x (Og, OH * OW * r) added into a strided window of the padded input (the
        numpy twin's scheme on rows held transposed), then the ``targets`` read out. The same
        sums in another order: each is still at most ``terms`` products."""
        r, dt = Lt.shape[1], Lt.dtype
        C, H, W = self.in_shape
        O, OH, OW = self.out_shape
        pt, pl, pb, pr = self.pads
        if idx is None:
            G = np.ascontiguousarray(Lt, dt).reshape(O, OH * OW * r)
        else:
            G = np.zeros((self.size, r), dt)
            G[idx] = Lt
            G = G.reshape(O, OH * OW * r)
        buf = np.zeros((C, H + pt + pb, W + pl + pr, r), dt)
        for i, j, (si, sj) in self._windows():
            for go, gc in self._groups():
                P = np.ascontiguousarray(weight[go, :, i, j].T) @ G[go]
                buf[gc, si, sj] += P.reshape(-1, OH, OW, r)
        t = np.asarray(targets, np.int64)
        return buf[t // (H * W), (t // W) % H + pt, t % W + pl]

    def reach(self, out_idx) -> np.ndarray:
        """The input positions (H, W) bool that the transpose of rows on the output elements
        ``out_idx`` (flat (O, OH, OW) indices) reaches, in any channel."""
        if len(out_idx) == self.size:  # every output element (most rows of a search): kept
            if getattr(self, "_reach_all", None) is None:
                self._reach_all = self._reach(np.arange(self.size))
                self._reach_all.setflags(write=False)
            return self._reach_all
        return self._reach(out_idx)

    def _reach(self, out_idx) -> np.ndarray:
        O, OH, OW = self.out_shape
        C, H, W = self.in_shape
        pt, pl, pb, pr = self.pads
        live = np.zeros(OH * OW, bool)
        live[np.asarray(out_idx) % (OH * OW)] = True
        live = live.reshape(OH, OW)
        hit = np.zeros((H + pt + pb, W + pl + pr), bool)  # on the padded input
        for _, _, (si, sj) in self._windows():
            hit[si, sj] |= live
        return np.ascontiguousarray(hit[pt:pt + H, pl:pl + W])

    def _transpose_numpy(self, Lam):
        """:meth:`transpose` offset by offset: per kernel offset one product over channels
        added into a strided window (numpy; the numba kernel's twin)."""
        r = Lam.shape[0]
        C, H, W = self.in_shape
        pt, pl, pb, pr = self.pads
        O, OH, OW = self.out_shape
        L = Lam.reshape(r, O, OH, OW)
        g = np.zeros((r, C, H + pt + pb, W + pl + pr))
        for i, j, (si, sj) in self._windows():
            for go, gc in self._groups():
                g[:, gc, si, sj] += np.einsum("oc,rohw->rchw", self.weight[go, :, i, j], L[:, go],
                                              optimize=True)
        return [np.ascontiguousarray(g[:, :, pt:pt + H, pl:pl + W]).reshape(r, -1)]

    def parameters(self) -> int:
        if self.label:  # a fixed map the loader made (an average pool): nothing learned
            return 0
        return int(self.weight.size + (0 if self.channel_bias is None else self.channel_bias.size))

    def describe(self) -> str:
        O, Cg, kh, kw = self.weight.shape
        if self.label:
            return f"{self.label}, {self.in_shape[0]} channels"
        extra = [f"stride {self.strides}" if self.strides != (1, 1) else "",
                 f"pads {self.pads}" if any(self.pads) else "",
                 f"dilation {self.dilations}" if self.dilations != (1, 1) else "",
                 f"groups {self.group}" if self.group != 1 else ""]
        extra = ", ".join(e for e in extra if e)
        return f"conv {self.in_shape[0]} -> {O}, kernel {kh}x{kw}" + (f" ({extra})" if extra else "")

    def scaled(self, a, c):
        """This convolution followed by ``a * y + c`` with a, c constant per output channel
        (a BatchNormalization), or None when they are not."""
        O, OH, OW = self.out_shape
        A, Cc = a.reshape(O, -1), c.reshape(O, -1)
        if not (np.all(A == A[:, :1]) and np.all(Cc == Cc[:, :1])):
            return None
        ao, co = A[:, 0], Cc[:, 0]
        b = co if self.channel_bias is None else ao * self.channel_bias + co
        return Conv(self.weight * ao[:, None, None, None], b, self.in_shape, self.strides,
                    self.pads, self.dilations, self.group, self.label)

    def after_scale(self, a, c):
        """``a * x + c`` (elementwise on the input) followed by this convolution, as one
        convolution, or None: needs no padding (a padded zero is not scaled) and a, c
        constant per input channel."""
        C = self.in_shape[0]
        A, Cc = a.reshape(C, -1), c.reshape(C, -1)
        if self.label or any(self.pads) or not (np.all(A == A[:, :1]) and np.all(Cc == Cc[:, :1])):
            return None
        O, Cg = self.weight.shape[:2]
        ach, cch = A[:, 0].reshape(self.group, Cg), Cc[:, 0].reshape(self.group, Cg)
        grp = np.arange(O) // (O // self.group)
        w = self.weight * ach[grp][:, :, None, None]
        shift = np.einsum("ocij,oc->o", self.weight, cch[grp])
        b = shift if self.channel_bias is None else self.channel_bias + shift
        return Conv(w, b, self.in_shape, self.strides, self.pads, self.dilations, self.group)


# a convolution's rows run as BLAS products on their windows in chunks of at most GEMM_BYTES of
# windows, each row's windows multiplied by the kernel where the output has at least
# GEMM_MIN_PLACES positions (Conv._conv_gemm)
GEMM_BYTES, GEMM_MIN_PLACES = 64 * 2 ** 20, 16


class IndexMap(Affine):
    """``y_j = x[src_j]`` over the concatenation of the inputs' values, or the constant
    ``table[-1 - src_j]`` where src_j < 0: every reshape, transpose, slice, gather, split,
    concat, pad and broadcast of the loader. Its transpose is a scatter-add (exact when no
    element is taken twice)."""

    def __init__(self, src, n_in: Sequence[int], table=None):
        self.src = np.ascontiguousarray(src, dtype=np.int64).reshape(-1)
        self.n_in = [int(n) for n in n_in]
        self.size = int(self.src.size)
        table = np.zeros(0) if table is None else np.asarray(table, np.float64)
        self.valid = self.src >= 0
        self.cols = self.src[self.valid]
        total = sum(self.n_in)
        counts = np.bincount(self.cols, minlength=total) if self.cols.size else np.zeros(total, int)
        self.unique = bool(counts.max(initial=0) <= 1)
        # the inputs' values in order, all of them (a concatenation): the identity
        self.in_order = self.size == total and bool(np.all(self.src == np.arange(total)))
        self.terms = 0 if self.unique else int(counts.max())
        self.terms_fwd = 0
        if self.valid.all():
            self.bias = None
        else:
            self.bias = np.zeros(self.size)
            self.bias[~self.valid] = table[-1 - self.src[~self.valid]]
        if not self.unique:
            import scipy.sparse as sp

            self._P = sp.csr_matrix((np.ones(self.cols.size), (self.cols, np.flatnonzero(self.valid))),
                                    shape=(total, self.size))

    def _gather(self, xs):
        x = xs[0] if len(xs) == 1 else np.concatenate(xs, axis=1)
        y = np.zeros((x.shape[0], self.size), steer_dtype(x))
        y[:, self.valid] = x[:, self.cols]
        return y

    def linear(self, xs):
        return self._gather(xs)

    def forward(self, xs):
        y = self._gather(xs)
        return y if self.bias is None else y + typed(self, "bias", y.dtype)

    def forward_abs(self, xs):
        return self._gather(xs)

    def transpose(self, Lam):
        r = Lam.shape[0]
        if self.unique:
            g = np.zeros((r, sum(self.n_in)), steer_dtype(Lam))
            g[:, self.cols] = Lam[:, self.valid]
        else:
            g = np.ascontiguousarray((self._P @ Lam.T).T, dtype=steer_dtype(Lam))
        return _split(g, self.n_in)

    def transpose_t(self, Lt, idx):
        """The transpose on rows held transposed: the rows of ``Lt`` (the coefficients of the
        outputs ``idx``; None: all) scattered (added, where an element is taken twice) onto
        the input elements they reach, and only those: per input, (its elements reached,
        sorted, or None when all of them; their rows (k_j, r))."""
        out = np.arange(self.size) if idx is None else np.asarray(idx)
        live = self.valid[out]
        src, rows = self.src[out[live]], Lt[live]
        if self.unique:
            order = np.argsort(src, kind="stable")
            src, rows = src[order], rows[order]
        else:
            import scipy.sparse as sp

            src, inv = np.unique(src, return_inverse=True)
            P = sp.csr_matrix((np.ones(inv.size), (inv, np.arange(inv.size))),
                              shape=(src.size, inv.size))
            rows = np.asarray(P @ rows, dtype=Lt.dtype)
        moved, at = [], 0
        for n in self.n_in:
            lo, hi = np.searchsorted(src, [at, at + n])
            sub = src[lo:hi] - at
            moved.append((None if sub.size == n else sub, np.ascontiguousarray(rows[lo:hi])))
            at += n
        return moved

    def describe(self) -> str:
        kind = "permutation" if self.unique and self.valid.all() and self.size == sum(self.n_in) \
            else "gather"
        return f"index map ({kind}) {sum(self.n_in)} -> {self.size}"


class Scale(Affine):
    """``y = a * x + c`` elementwise (Mul/Div/Add/Sub by constants, an unfolded
    BatchNormalization)."""

    terms = 1
    terms_fwd = 2

    def __init__(self, a, c=None):
        self.a = _owned(a).reshape(-1)
        self.size = self.a.size
        self.n_in = [self.size]
        self.bias = None if c is None else _owned(c).reshape(-1)
        self._abs = np.abs(self.a)

    def linear(self, xs):
        return xs[0] * self.a

    def forward(self, xs):
        dt = steer_dtype(xs[0])
        y = xs[0] * typed(self, "a", dt)
        return y if self.bias is None else y + typed(self, "bias", dt)

    def forward_abs(self, xs):
        return xs[0] * self._abs

    def transpose(self, Lam):
        return [Lam * typed(self, "a", steer_dtype(Lam))]

    def parameters(self) -> int:
        return int(self.a.size + (0 if self.bias is None else self.bias.size))

    def describe(self) -> str:
        return f"scale {self.size}"

    def scaled(self, a, c):
        b = c if self.bias is None else a * self.bias + c
        return Scale(a * self.a, b)


class Sum(Affine):
    """``y = sum_k s_k x_k`` with signs s_k = +1 or -1 (Add/Sub of tensors of one shape)."""

    terms = 0  # the transpose only negates

    def __init__(self, signs: Sequence[float], size: int):
        self.signs = [float(s) for s in signs]
        self.size = int(size)
        self.n_in = [self.size] * len(self.signs)
        self.terms_fwd = len(self.signs)

    def linear(self, xs):
        return self.forward(xs)

    def forward(self, xs):
        y = self.signs[0] * xs[0]
        for s, x in zip(self.signs[1:], xs[1:]):
            y = y + s * x
        return y

    def forward_abs(self, xs):
        y = xs[0]
        for x in xs[1:]:
            y = y + x
        return y

    def transpose(self, Lam):
        return [Lam if s == 1.0 else -Lam for s in self.signs]

    def describe(self) -> str:
        # "sum of 2 inputs (a - b)": the inputs named a, b, ... in the node's order
        n = len(self.signs)
        if n > 4:
            return f"sum of {n} inputs ({sum(s < 0 for s in self.signs)} subtracted)"
        terms = ("-" if self.signs[0] < 0 else "") + "a"
        for k in range(1, n):
            terms += (" + " if self.signs[k] > 0 else " - ") + "abcd"[k]
        return f"sum of {n} inputs ({terms})"


def _split(g, sizes) -> List[np.ndarray]:
    if len(sizes) == 1:
        return [g]
    cuts = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(g, cuts, axis=1)]


class ActivationOp:
    """An elementwise activation of :data:`crown_cli.activations.ACTIVATIONS`."""

    kind = "activation"

    def __init__(self, name: str, alpha=None):
        from crown_cli.activations import get

        self.name = name
        self.alpha = get(name).default_param if alpha is None else alpha

    def forward(self, xs):
        from crown_cli.activations import apply_activation

        return apply_activation(self.name, xs[0], self.alpha)

    def vjp(self, L, xs, relu_leak=None):
        """The rows L (N, size) times the derivative at the points xs[0] (N, size) (an
        activation's ``surrogate`` where it has one: sign); ``relu_leak`` (N,): a ReLU's
        slope on its inactive side per point (0: the derivative)."""
        from crown_cli.activations import attack_derivative as derivative

        z = xs[0]
        if self.name == "relu" and relu_leak is not None:
            d = np.where(z > 0, 1.0, np.asarray(relu_leak, np.float64)[:, None])
        else:
            d = derivative(self.name, z, self.alpha)
        return [L * d]

    def parameters(self) -> int:
        return 0

    def describe(self) -> str:
        if self.name == "gelu_tanh" and self.alpha is not None:  # no part of the function
            return f"{self.name} (allowance {self.alpha:.3g})"
        return self.name + ("" if self.alpha is None else f" (alpha={self.alpha:g})")


class Product:
    """``y = x1 * x2`` elementwise, both inputs data of y's size (ONNX Mul of two data
    tensors, broadcast by index maps before it; division by data is a product with the
    reciprocal). Its bounds: :class:`crown_cli.engine.node_rules.ProductRule`."""

    kind = "product"

    def __init__(self, size: int):
        self.size = int(size)
        self.n_in = [self.size, self.size]

    def forward(self, xs):
        return xs[0] * xs[1]

    def vjp(self, L, xs, relu_leak=None):
        return [L * xs[1], L * xs[0]]

    def parameters(self) -> int:
        return 0

    def describe(self) -> str:
        return f"product of two data tensors ({self.size})"


class InputOp:
    """Graph input ``index``: the elements ``offset .. offset + size`` of the flat input
    vector (VNN-LIB's X_i, inputs in order, each flattened row-major)."""

    kind = "input"

    def __init__(self, index: int, offset: int, size: int):
        self.index, self.offset, self.size = index, offset, size
        self.n_in: List[int] = []

    def parameters(self) -> int:
        return 0

    def describe(self) -> str:
        return f"input {self.index} (X_{self.offset}..X_{self.offset + self.size - 1})"
