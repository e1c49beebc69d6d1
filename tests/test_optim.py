"""The optimiser's keyed form (alpha-CROWN's stores) against plain :class:`Adam` on the whole
array, to the bit: the kept gathered moments must give the same steps whatever sequence of
entries (slices, fancy indices, repeats, changes) the caller steps."""
import numpy as np

from crown_cli.engine.optim import Adam, AdamSettings, KeyedAdam


def test_keyed_adam_equals_adam_on_any_sequence_of_entries():
    rng = np.random.default_rng(0)
    shape = (2, 7, 9)
    keyed_store = rng.uniform(0.0, 1.0, shape).astype(np.float32)
    plain_store = keyed_store.copy()
    keyed = KeyedAdam(AdamSettings())
    plain = Adam(plain_store, AdamSettings(), 0.0, 1.0)
    rows_a, cols_a = np.array([0, 2, 5])[:, None], np.array([1, 3, 4, 8])[None, :]
    rows_b, cols_b = np.array([1, 2, 6])[:, None], np.array([0, 3])[None, :]
    sequence = [(slice(None), rows_a, cols_a)] * 3 + [(slice(None), rows_b, cols_b)] * 2 + \
        [(slice(None), rows_a, cols_a), (slice(None), slice(None), slice(None))] * 2 + \
        [(slice(None), rows_a.copy(), cols_a.copy())] * 2
    for t, idx in enumerate(sequence, start=1):
        g = rng.normal(size=keyed_store[idx].shape).astype(np.float32)
        keyed.step("k", keyed_store, g, idx, 0.1, 0.0, 1.0)
        # plain Adam: moments over the whole array; its step count per key is the same t
        plain_store[idx] = plain.propose(plain_store[idx], g, t, 0.1, index=idx)
        assert np.array_equal(keyed_store, plain_store), t
