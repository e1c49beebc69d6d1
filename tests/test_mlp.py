"""crown_cli.network.MLP: the output activation, verify_layers and the margin layers certify uses."""
import numpy as np
import pytest

from conftest import random_network
from crown_cli.errors import InputError
from crown_cli.network import MLP
from crown_cli.io.models import validate


def _net(out=None, act="relu", sizes=(5, 4, 3), seed=0):
    ws, bs = random_network(list(sizes), seed=seed)
    return validate(MLP(ws, bs, act, "net.npz", output_activation=out), "net.npz")


def test_forward_applies_the_output_activation_after_the_logits():
    x = np.random.default_rng(1).normal(size=(7, 5))
    plain = _net()
    z = plain.forward(x)
    assert np.array_equal(_net("relu").forward(x), np.maximum(z, 0.0))
    assert np.allclose(_net("tanh").forward(x), np.tanh(z))
    p = _net("softmax").forward(x)
    assert np.allclose(p, np.exp(z) / np.exp(z).sum(axis=1, keepdims=True))
    assert np.allclose(_net("log_softmax").forward(x), np.log(p))
    assert _net("linear").output_activation is None


def test_verify_layers_appends_an_identity_layer_after_the_output_activation():
    from crown_cli.activations import forward

    mlp = _net("relu")
    ws, bs = mlp.verify_layers()
    assert len(ws) == 3 and np.array_equal(ws[2], np.eye(3)) and np.array_equal(bs[2], np.zeros(3))
    x = np.random.default_rng(2).normal(size=(9, 5))
    assert np.array_equal(forward(ws, bs, mlp.activation, x), mlp.forward(x))
    assert len(mlp.weights) == 2  # the MLP itself is unchanged
    assert [len(l) for l in _net().verify_layers()] == [2, 2]


def test_verify_layers_refuses_a_second_activation_and_softmax():
    with pytest.raises(InputError, match=r"^net.npz: output activation relu differs from the "
                                         r"hidden activation tanh"):
        _net("relu", act="tanh").verify_layers()
    with pytest.raises(InputError, match="^net.npz: the output softmax is not an elementwise"):
        _net("softmax").verify_layers()


def test_without_hidden_layers_the_output_activation_is_the_activation():
    mlp = _net("tanh", act="relu", sizes=(5, 3))
    assert mlp.activation == "tanh"
    ws, bs = mlp.verify_layers()
    assert len(ws) == 2
    x = np.random.default_rng(3).normal(size=(4, 5))
    assert np.allclose(np.tanh(x @ ws[0].T + bs[0]), mlp.forward(x))


def test_margin_layers_skip_only_strictly_increasing_outputs():
    for out in (None, "tanh", "sigmoid", "softmax", "log_softmax"):
        assert len(_net(out).margin_layers()[0]) == 2, out
    assert len(_net("relu").margin_layers()[0]) == 3


def test_unknown_output_activation_is_refused():
    with pytest.raises(InputError, match="net.npz: output activation: unknown activation 'swish'"):
        _net("swish")
