"""Target selection as the paper's code does it (reference-setup.md, Targets)."""
import random

import numpy as np
import pytest

from crown_cli.errors import InputError
from crown_cli.certification.targets import TargetSelector, check_random_possible, parse_target_types, select_all


def paper_procedure(logits, seed=1215):
    """The reference procedure written out literally with the global random module."""
    random.seed(seed)
    out = []
    for z in logits:
        c = int(np.argmax(z))
        least = int(np.argmin(z))
        runner_up = int(np.argsort(z)[-2])
        r = c
        while r in (least, runner_up, c):
            r = random.randint(0, 9)
        out.append((c, runner_up, least, r))
    return out


def test_hand_example():
    z = np.array([0.1, 3.0, -2.0, 2.5, 0.0, 1.0, 0.2, 0.3, -1.0, 0.4])
    sel = TargetSelector().select(z)
    assert sel["predicted"] == 1 and sel["runner-up"] == 3 and sel["least"] == 2
    assert sel["untargeted"] == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert sel["random"] not in (1, 3, 2)


def test_matches_reference_procedure_over_many_images():
    logits = np.random.default_rng(0).normal(size=(500, 10))
    ref = paper_procedure(logits)
    got = select_all(logits)
    assert [(s["predicted"], s["runner-up"], s["least"], s["random"]) for s in got] == ref


@pytest.mark.parametrize("z", [[0.0, 0.0], [1.0, 1.0, 0.0], [2.0, 2.0, 2.0, 1.0],
                               [5.0] * 10, [0.3, 0.9, 0.9, 0.9, -1.0]])
def test_a_tie_with_the_predicted_class_never_targets_it(z):
    """Logits tied at the top (or all equal): runner-up and least are classes other than the
    predicted one (argsort's second last or argmin can be the predicted class itself on a
    tie: a row certifying the margin of a class against itself, eps 0); without a tie the
    paper's choice, as the reference procedure."""
    z = np.array(z)
    sel = TargetSelector().select(z)
    c = sel["predicted"]
    assert c == int(np.argmax(z))
    assert sel["runner-up"] != c and sel["least"] != c
    assert z[sel["runner-up"]] == max(z[t] for t in range(z.size) if t != c)
    assert z[sel["least"]] == min(z[t] for t in range(z.size) if t != c)


def test_seed_changes_random_targets_only():
    logits = np.random.default_rng(1).normal(size=(50, 10))
    a, b = select_all(logits, 1215), select_all(logits, 7)
    assert [s["runner-up"] for s in a] == [s["runner-up"] for s in b]
    assert [s["random"] for s in a] != [s["random"] for s in b]


def test_parse_target_types():
    assert parse_target_types("runner-up,random, least,untargeted") == [
        "runner-up", "random", "least", "untargeted"]
    assert parse_target_types("top2,runner-up") == ["runner-up"]
    with pytest.raises(InputError, match="--target: unknown target 'second'"):
        parse_target_types("second")


def test_random_target_needs_four_classes():
    with pytest.raises(InputError, match="at least 4 classes"):
        check_random_possible(3, ["random"])
    check_random_possible(3, ["runner-up"])
