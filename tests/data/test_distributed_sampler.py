import pytest

from frost.data import DataLoader, DistributedSampler, TensorDataset
import frost


@pytest.mark.parametrize("n, world", [(10, 3), (12, 4), (5, 2), (2, 3)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_are_disjoint_equal_and_cover_the_dataset(n, world, shuffle):
    shards = [list(DistributedSampler(range(n), world, r, shuffle=shuffle, seed=7)) for r in range(world)]
    per = -(-n // world)
    assert all(len(s) == per for s in shards)
    everything = [i for s in shards for i in s]
    assert set(everything) == set(range(n))  # complete
    assert len(everything) - len(set(everything)) == per * world - n  # only the padding repeats


@pytest.mark.parametrize("n, world", [(10, 3), (12, 4), (5, 2)])
def test_drop_last_drops_the_tail_and_nothing_repeats(n, world):
    shards = [list(DistributedSampler(range(n), world, r, drop_last=True)) for r in range(world)]
    assert all(len(s) == n // world for s in shards)
    everything = [i for s in shards for i in s]
    assert len(set(everything)) == len(everything) == n // world * world


def test_set_epoch_changes_the_order_the_same_way_everywhere():
    samplers = [DistributedSampler(range(100), 2, r, seed=3) for r in range(2)]
    first = [list(s) for s in samplers]
    for s in samplers:
        s.set_epoch(1)
    second = [list(s) for s in samplers]
    assert first != second
    assert sorted(first[0] + first[1]) == sorted(second[0] + second[1]) == list(range(100))
    assert [list(s) for s in samplers] == second  # same epoch, same order


def test_a_dataloader_reads_its_shard():
    data = TensorDataset(frost.arange(10))
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, 2, 1, shuffle=False))
    assert [b[0].tolist() for b in loader] == [[1, 3], [5, 7], [9]]


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="rank 2 for num_replicas 2"):
        DistributedSampler(range(4), 2, 2)
