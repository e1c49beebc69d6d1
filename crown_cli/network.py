"""The network type every loader returns: a fully connected MLP in the engine's convention.

Kept apart from the loaders so that ``io.models`` (NPZ, HDF5, Keras) and ``graph.lower``
(whose exact dense form of a chain-shaped graph is one) do not depend on each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from crown_cli.errors import InputError

# Output activations that are not elementwise; they keep the order of the logits.
VECTOR_OUTPUTS = ("softmax", "log_softmax")
# Output activations under which z_i > z_j exactly when act(z)_i > act(z)_j, so the sign of every
# class margin is that of the logits' margin: certifying the logits certifies the decision.
# (leaky ReLU too when its slope alpha > 0.)
STRICTLY_INCREASING = ("linear", "sigmoid", "tanh", "arctan", "erf", "elu", "softplus") + VECTOR_OUTPUTS


@dataclass
class MLP:
    """A fully connected network
    ``x -> out(W[m-1] act(... act(W[0] x + b[0]) ...) + b[m-1])``.

    weights[k]: (n_{k+1}, n_k) float64; biases[k]: (n_{k+1},) float64. ``activation`` is applied
    after every layer but the last; ``output_activation`` (None: none) after the last one, e.g.
    a ReLU some published ONNX networks put on their logits, or an order-preserving softmax.
    """

    weights: List[np.ndarray]
    biases: List[np.ndarray]
    activation: str = "relu"
    source: str = ""
    layer_names: List[str] = field(default_factory=list)
    alpha: Optional[float] = None  # activation parameter (leaky ReLU / ELU / hard sigmoid slope)
    output_activation: Optional[str] = None
    # for each column of weights[0], the column of the file's own flat input it reads, when
    # the loader reordered a channel-first image input to crown's (H, W, C) order
    # (io.networks.dense_chain); None: the file's order (see vnnlib_layers)
    input_order: Optional[np.ndarray] = None

    @property
    def input_size(self) -> int:
        return int(self.weights[0].shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.weights[-1].shape[0])

    @property
    def sizes(self) -> List[int]:
        return [self.input_size] + [int(w.shape[0]) for w in self.weights]

    @property
    def num_parameters(self) -> int:
        return int(sum(w.size + b.size for w, b in zip(self.weights, self.biases)))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Outputs for a batch ``x`` of shape (N, input_size) (or one input of shape
        (input_size,)), the output activation included."""
        from crown_cli.activations import apply_output_activation, forward

        z = forward(self.weights, self.biases, self.activation, x, self.alpha)
        if self.output_activation is None:
            return z
        return apply_output_activation(self.output_activation, z, self.alpha)

    def verify_layers(self) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """(weights, biases) of a network the engine can bound whose outputs are this MLP's
        outputs, with ``activation`` after every layer but the last.

        An output activation becomes a real hidden layer: an identity affine layer (W = I,
        b = 0) is appended after it. The engine has one activation per network, so it must be
        the hidden activation (with no hidden layers the loaders make the hidden activation the
        output activation). InputError otherwise, or for a softmax output.
        """
        ws, bs = list(self.weights), list(self.biases)
        out = self.output_activation
        if out is None:
            return ws, bs
        where = self.source or "model"
        if out in VECTOR_OUTPUTS:
            raise InputError(f"{where}: the output {out} is not an elementwise activation; it "
                             "cannot be bounded as a layer")
        if len(ws) > 1 and out != self.activation:
            raise InputError(f"{where}: output activation {out} differs from the hidden "
                             f"activation {self.activation}; crown bounds one activation per network")
        if len(ws) == 1 and out != self.activation:
            raise InputError(f"{where}: output activation {out} but activation {self.activation}; "
                             "a network without hidden layers must use the output activation")
        n = ws[-1].shape[0]
        ws.append(np.eye(n))
        bs.append(np.zeros(n))
        return ws, bs

    def keeps_logit_order(self) -> bool:
        """True when the output activation cannot change the sign of any class margin
        (none, or strictly increasing)."""
        out = self.output_activation
        if out is None or out in STRICTLY_INCREASING:
            return True
        return out == "leaky_relu" and self.alpha is not None and self.alpha > 0

    def vnnlib_layers(self) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """:meth:`verify_layers` taking the file's own flat input order (VNN-LIB's X_i, the
        order ``onnx.reference`` reads a flattened input in), not crown's image order: the
        first layer's columns put back where the loader took them from."""
        ws, bs = self.verify_layers()
        if self.input_order is not None:
            w = np.empty_like(ws[0])
            w[:, self.input_order] = ws[0]
            ws = [w] + list(ws[1:])
        return ws, bs

    def margin_layers(self) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """The layers whose outputs' pairwise margins decide the class: the logits when the
        output activation keeps their order (it is skipped), else :meth:`verify_layers`."""
        if self.keeps_logit_order():
            return list(self.weights), list(self.biases)
        return self.verify_layers()
