"""Tests of frost.data's SequentialSampler, RandomSampler and BatchSampler: the indices they give (against
PyTorch's where the order is defined), their lengths, seeding, and use in a DataLoader."""
import numpy as np
import pytest
import torch.utils.data as tud

import frost
from frost.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset


def test_sequential_and_batch_samplers_match_torch():
    data = list(range(10))
    assert list(SequentialSampler(data)) == list(tud.SequentialSampler(data))
    assert len(SequentialSampler(data)) == 10
    for drop_last in (False, True):
        ours = BatchSampler(SequentialSampler(data), 3, drop_last)
        theirs = tud.BatchSampler(tud.SequentialSampler(data), 3, drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_random_sampler_gives_a_permutation_each_epoch_fixed_by_the_seed():
    sampler = RandomSampler(range(20))
    frost.manual_seed(0)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == list(range(20)) and sorted(second) == list(range(20)) and first != second
    frost.manual_seed(0)
    assert list(sampler) == first


def test_random_sampler_with_its_own_generator_leaves_the_global_one_alone():
    g = frost.Generator().manual_seed(3)
    order = list(RandomSampler(range(8), generator=g))
    g.manual_seed(3)
    frost.manual_seed(1)
    before = frost.get_rng_state().numpy().copy()
    assert list(RandomSampler(range(8), generator=g)) == order
    np.testing.assert_array_equal(frost.get_rng_state().numpy(), before)


def test_random_sampler_num_samples_and_replacement():
    frost.manual_seed(2)
    with_replacement = list(RandomSampler(range(5), replacement=True, num_samples=50))
    assert len(with_replacement) == 50 and set(with_replacement) <= set(range(5)) and len(set(with_replacement)) == 5
    longer = list(RandomSampler(range(4), num_samples=10))
    assert len(longer) == 10 and sorted(longer[:4]) == [0, 1, 2, 3] and sorted(longer[4:8]) == [0, 1, 2, 3]
    assert len(RandomSampler(range(4), num_samples=10)) == 10 == len(tud.RandomSampler(range(4), num_samples=10))


def test_samplers_drive_a_dataloader():
    ds = TensorDataset(frost.arange(10))
    batches = [b[0].tolist() for b in DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, False))]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    frost.manual_seed(5)
    seen = [v for b in DataLoader(ds, batch_size=3, sampler=RandomSampler(ds)) for v in b[0].tolist()]
    assert sorted(seen) == list(range(10))


def test_bad_arguments_are_refused_as_torch():
    with pytest.raises(ValueError, match="RandomSampler: num_samples should be a positive integer"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(TypeError, match="RandomSampler: replacement should be a boolean"):
        RandomSampler(range(3), replacement=1)
    with pytest.raises(ValueError, match="BatchSampler: batch_size should be a positive integer"):
        BatchSampler(range(3), 0, False)
    with pytest.raises(TypeError, match="RandomSampler: generator must be a frost.Generator"):
        RandomSampler(range(3), generator=np.random.default_rng(0))
