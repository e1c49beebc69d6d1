"""Certificates of unsat verdicts (crown_cli/verification/proof.py, docs/proofs.md): the tree a
search records, and what `crown check` (crown_cli/check, which shares no code with the
engine) says of them, before and after tampering."""
import numpy as np
import pytest

from crown_cli.verification.proof import EMPTY, HULL, INPUT, LEAF, RELU, ProofError, ProofTree


def test_tree_laid_out_in_preorder():
    t = ProofTree(np.array([3, 7]))
    (a, b), = t.split_input([0], [1], [0.5])
    (c, d), = t.split_relu([b], [7], [2])
    t.prove(a, 0, 2)
    t.prove(c, 0, 1, alpha=np.array([0.25, 1.0]), beta=np.array([0.0, 0.5]))
    t.empty(d, 3)
    out = t.case_arrays(0)
    assert out["kind"].tolist() == [INPUT, LEAF, RELU, LEAF, EMPTY]
    assert out["arg"].tolist() == [1, 2, 7, 1, 3]
    assert out["value"][0] == 0.5 and np.isnan(out["value"][1:]).all()
    assert out["refresh"].tolist() == [1, 1, 1, 2, 2]
    assert out["alpha_at"].tolist() == [-1, -1, -1, 0, -1]
    assert out["beta_at"].tolist() == [-1, -1, -1, 0, -1]
    assert out["alpha"].tolist() == [[0.25, 1.0]] and out["cols"].tolist() == [3, 7]


def test_a_case_proven_above_a_split_is_a_leaf_there():
    # a joint search: case 0 proven at the root, case 1 only on both children
    t = ProofTree(np.zeros(0, np.int64))
    (a, b), = t.split_relu([0], [4], [3])
    t.prove(0, 0, 0)
    t.prove(a, 1, 0)
    t.prove(b, 1, 1)
    assert t.case_arrays(0)["kind"].tolist() == [LEAF]
    assert t.case_arrays(1)["kind"].tolist() == [RELU, LEAF, LEAF]


def test_hull_leaves_and_open_nodes():
    t = ProofTree()
    (a, b), = t.split_input([0], [0], [0.0])
    t.prove_hull(a, 0, 1, np.array([0.5, 1.0]), np.ones((2, 3)))
    with pytest.raises(ProofError, match="neither split nor proven"):
        t.case_arrays(0)  # b is open
    t.prove(b, 0, 0)
    out = t.case_arrays(0)
    assert out["kind"].tolist() == [INPUT, HULL, LEAF]
    assert out["hull_at"].tolist() == [-1, 0, -1]
    assert out["hull_theta"].shape == (1, 2, 3)
    with pytest.raises(ProofError, match="split twice"):
        t.split_input([0], [0], [1.0])
    with pytest.raises(ProofError, match="float32"):
        t.prove(a, 1, 0, alpha=np.array([0.1]))  # 0.1 is no float32: not what was verified
