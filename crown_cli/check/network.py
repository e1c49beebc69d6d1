"""The network as the checker reads it: affine operations per layer, ReLUs between layers.

``layers[k]`` (k = 0..K) is the list of operations of G_{k+1}, each kept as the file wrote it:
``("mat", W)`` y = x @ W (W: (n_in, n_out) float64; a convolution's has a third item, its
weight and taps, which bounds.py takes rows back with), ``("scale", a)`` y = a x (a a float, or
(n,) elementwise), ``("div", d)`` y = x / d (d (n,), elementwise, no 0), ``("take", idx, n)``
y_i = x_{idx_i} for x of n elements (0 where idx_i = -1: an element move, a
concatenation's part), ``("divr", lo, hi)`` y = x / d for a real d known to lie in
[lo, hi] (a batch normalisation's sqrt(var + eps)), ``("add", c, s)``
y = x + s c (c: (n,) float64, s a float), ``("maxpool", windows)`` y_i = max of x over the
indices windows[i] (int64, (n_out, K); -1 for none). Values read from float32 are converted
exactly; every operation is one of real numbers (the float64 arithmetic of bounds.py charges
its rounding).
"""
import numpy as np

MAX_WIDTH = 2 ** 20  # the widest vector the error bounds of bounds.py allow (bounds.up)


def window_values(x, win):
    """x (B, n) gathered over a max pool's windows (m, K): (B, m, K), -inf where a window has
    no input (an index -1)."""
    return np.where(win < 0, -np.inf, x[:, np.maximum(win, 0)])


class CheckError(Exception):
    """Bad input: a missing or unreadable file (one line, naming the file)."""


class Reject(Exception):
    """A certificate, model or property outside what the checker accepts (one-line reason)."""


class Network:
    """y = the last of z_1, .., z_{K+1}, each a sum of terms: ``terms[k]`` (k = 0..K) lists
    z_{k+1}'s terms (src, ops), the operations ``ops`` applied to a_src (a_0 = x, a_j =
    relu(z_j), or z_j for the layers ``identity``, src <= k), so that a residual connection
    is a term from an earlier layer.
    ``sizes`` = [n_0, n_1, .., n_{K+1}]; ``chain``: every z_{k+1} is one term of a_k, and
    ``layers[k]`` its operations (None for another network); ``input_shape``: an ONNX
    model's input shape (None for other files)."""

    input_shape = None

    def __init__(self, layers, sizes, terms=None, identity=()):
        self.terms = terms if terms is not None else [[(k, ops)] for k, ops in enumerate(layers)]
        # hidden layers (1-based) whose a_j is z_j itself: a max pool's input that is no
        # ReLU's output (the pool's lines take its neurons' bounds, which step 1b computes)
        self.identity = frozenset(identity)
        self.chain = all(len(t) == 1 and t[0][0] == k for k, t in enumerate(self.terms))
        self.layers = [t[0][1] for t in self.terms] if self.chain else None
        self.sizes = sizes
        self.K = len(self.terms) - 1
        # hidden layers whose ReLU output a max pool reads (a term's first operation)
        self.pool_fed = {src for terms in self.terms for src, ops in terms
                         if src > 0 and ops and ops[0][0] == "maxpool"}
        self.hidden = sizes[1:-1]
        self.offsets = np.concatenate([[0], np.cumsum(self.hidden)]).astype(np.int64)
        self.relu_neuron = np.ones(int(self.offsets[-1]), bool)  # (a ReLU split's neurons)
        for j in self.identity:
            self.relu_neuron[self.offsets[j - 1]:self.offsets[j]] = False
        if max(sizes) > MAX_WIDTH:
            raise Reject(f"a layer of {max(sizes)} values is wider than {MAX_WIDTH}")
        for terms in self.terms:
            for _, ops in terms:
                for op in ops:
                    vals = op[1:2] if op[0] == "mat" else op[1:]  # (a conv's taps: indices)
                    if op[0] not in ("maxpool", "take") and \
                            not all(np.all(np.isfinite(v)) for v in vals):
                        raise Reject("a weight is NaN or infinite")

    def entry(self) -> dict:
        """The ``network`` a certificate's header must give for this model (docs/proofs.md)."""
        return {"inputs": int(self.sizes[0]), "hidden": [int(h) for h in self.hidden],
                "outputs": int(self.sizes[-1]), "activation": "relu"}

    def forward(self, x):
        """Float64 outputs (B, n_out) for inputs (B, n_in) (not used by the check)."""
        a = [np.asarray(x, dtype=np.float64)]
        for k, terms in enumerate(self.terms):
            z = sum(_apply_ops(ops, a[src]) for src, ops in terms)
            a.append(z if k + 1 in self.identity else np.maximum(z, 0.0))
        return z


def _apply_ops(ops, x):
    for op in ops:
        if op[0] == "mat":
            x = x @ op[1]
        elif op[0] == "maxpool":
            x = window_values(x, op[1]).max(axis=2)
        elif op[0] == "scale":
            x = op[1] * x
        elif op[0] == "div":
            x = x / op[1]
        elif op[0] == "divr":  # (a real in [lo, hi]: its midpoint, for this float pass)
            x = x / (0.5 * (op[1] + op[2]))
        elif op[0] == "take":
            x = np.where(op[1] >= 0, x[:, np.maximum(op[1], 0)], 0.0)
        else:
            x = x + op[2] * op[1]
    return x


def load_arrays(path, what):
    """Every array of an NPZ archive (no pickles), or CheckError naming the file and ``what``."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:
        raise CheckError(f"{path}: cannot read {what} ({type(exc).__name__}: {exc})") from None


def read_npz(path):
    """crown's NPZ layout (docs/formats.md): W0..W{m-1} (out, in), b0..b{m-1}, activation relu."""
    arrays = load_arrays(path, "NPZ archive")
    act = arrays.pop("activation", np.array("relu")).ravel()[:1].tolist() or ["?"]
    act = (act[0].decode() if isinstance(act[0], bytes) else str(act[0])).strip().lower()
    if act != "relu":
        raise Reject(f"activation {act}: the checker takes ReLU networks only")
    arrays.pop("alpha", None)
    m = sum(1 for k in arrays if k.startswith("W"))
    if m == 0 or sorted(arrays) != sorted([f"W{i}" for i in range(m)] + [f"b{i}" for i in range(m)]):
        raise Reject(f"arrays W0..W{m - 1}, b0..b{m - 1} expected, found {sorted(arrays)}")
    layers, sizes = [], []
    for i in range(m):
        w, b = _exact(arrays[f"W{i}"], f"W{i}"), _exact(arrays[f"b{i}"], f"b{i}")
        if w.ndim != 2 or b.shape != (w.shape[0],) or (sizes and sizes[-1] != w.shape[1]):
            raise Reject(f"W{i} {w.shape} / b{i} {b.shape} do not chain")
        sizes = sizes or [w.shape[1]]
        sizes.append(w.shape[0])
        layers.append([("mat", np.ascontiguousarray(w.T)), ("add", b, 1.0)])
    return Network(layers, sizes)


def _exact(a, name):
    """float64 copy of a numeric array, refused where the conversion would round."""
    if a.dtype.kind not in "fiu":
        raise Reject(f"{name}: dtype {a.dtype} is not numeric")
    out = a.astype(np.float64)
    if a.dtype.kind in "iu" and not np.array_equal(out.astype(a.dtype), a):
        raise Reject(f"{name}: integers beyond float64's exact range")
    return out
