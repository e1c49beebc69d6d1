"""Target-class selection exactly as in the paper's experiments (reference-setup.md, Targets).

For logits z: predicted c = argmax z, least = argmin z, runner-up = argsort(z)[-2] (where a tie
with c would make either c itself, the class next to it in that order that is not c); the random
target comes from Python's ``random`` seeded once (default 1215) and advanced for every image
in index order, misclassified ones included. ``untargeted`` stands for all classes but c.
"""
from __future__ import annotations

import random
from typing import Dict, List, Sequence

import numpy as np

from crown_cli.errors import InputError

TARGET_TYPES = ("runner-up", "random", "least", "untargeted")
DEFAULT_SEED = 1215


def parse_target_types(spec: str) -> List[str]:
    """'runner-up,random' -> ['runner-up', 'random']; aliases 'top2' and 'all' accepted."""
    aliases = {"top2": "runner-up", "runnerup": "runner-up", "all": "untargeted"}
    out = []
    for part in str(spec).split(","):
        key = aliases.get(part.strip().lower(), part.strip().lower())
        if key not in TARGET_TYPES:
            raise InputError(
                f"--target: unknown target '{part.strip()}' (choose from {', '.join(TARGET_TYPES)})"
            )
        if key not in out:
            out.append(key)
    return out


class TargetSelector:
    """Stateful selector; call :meth:`select` once per image, in index order, from image 0."""

    def __init__(self, seed: int = DEFAULT_SEED):
        self.rng = random.Random(seed)  # same stream as random.seed(seed); random.randint(...)

    def select(self, logits: np.ndarray) -> Dict[str, object]:
        """Targets for one image: {'runner-up': t, 'random': t, 'least': t, 'untargeted': [..]}."""
        z = np.asarray(logits, dtype=np.float64)
        n = z.shape[0]
        order = np.argsort(z)  # default kind, as the reference code used
        c = int(np.argmax(z))
        least = int(np.argmin(z))
        runner_up = int(order[-2])
        if runner_up == c or least == c:  # a tie with the predicted class: another class
            others = order[order != c]
            runner_up = int(others[-1]) if runner_up == c else runner_up
            least = int(others[0]) if least == c else least
        excluded = {least, runner_up, c}
        if n - len(excluded) < 1:
            rnd = None  # no class left for a random target (fewer than 4 classes)
        else:
            r = c
            while r in excluded:
                r = self.rng.randint(0, n - 1)
            rnd = r
        return {
            "predicted": c,
            "runner-up": runner_up,
            "least": least,
            "random": rnd,
            "untargeted": [t for t in range(n) if t != c],
        }


def select_all(logits: np.ndarray, seed: int = DEFAULT_SEED) -> List[Dict[str, object]]:
    """Targets for every row of ``logits`` (N, classes), in index order."""
    sel = TargetSelector(seed)
    return [sel.select(z) for z in logits]


def check_random_possible(num_classes: int, types: Sequence[str]) -> None:
    if "random" in types and num_classes < 4:
        raise InputError(
            f"--target random: needs at least 4 classes (the model has {num_classes}); "
            "the random target excludes the predicted, runner-up and least classes"
        )
