"""DeviceDataset: every sample once per epoch, a new order each epoch, exact gathers and augmentation."""
import numpy as np
import pytest

import frost
from frost.data import DeviceDataset
from frost.data.transforms import augment


def _data(n=50):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), rng.integers(0, 10, n)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_each_epoch_visits_every_sample_once_in_a_new_order(device):
    images, labels = _data()
    ds = DeviceDataset(images, labels, device=device)
    frost.manual_seed(0)
    epochs = [np.concatenate([i.cpu().numpy() for i in ds.epoch_indices(8, drop_last=False)]) for _ in range(2)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(50))
    assert not np.array_equal(epochs[0], epochs[1])
    assert sum(1 for _ in ds.epoch_indices(8)) == 6  # drop_last: 50 // 8


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_batch_and_augment_match_the_host_arrays(device):
    images, labels = _data()
    ds = DeviceDataset(images, labels, device=device)
    index = frost.tensor(np.array([3, 7, 7, 0]), device=device)
    x, y = ds.batch(index)
    np.testing.assert_array_equal(x.cpu().numpy(), images[[3, 7, 7, 0]].transpose(0, 3, 1, 2) / np.float32(255))
    np.testing.assert_array_equal(y.cpu().numpy(), labels[[3, 7, 7, 0]])
    oy, ox, flips = np.array([0, 2, 4, 1]), np.array([4, 0, 3, 2]), np.array([1, 0, 1, 1])
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    xa, _ = ds.augment(index, frost.tensor(oy, device=device), frost.tensor(ox, device=device),
                       frost.tensor(flips, device=device), 8, 2, mean, std) if device == "cuda" else \
        ds.augment(index, oy, ox, flips, 8, 2, mean, std)
    ref = augment(images[[3, 7, 7, 0]], oy, ox, flips.astype(bool), 8, 2, mean, std).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(xa.cpu().numpy(), ref)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"DeviceDataset: images must be uint8 \(N, H, W, C\), got float32"):
        DeviceDataset(np.zeros((2, 4, 4, 3), np.float32), [0, 1], device="cpu")
    with pytest.raises(ValueError, match="2 images but 3 labels"):
        DeviceDataset(np.zeros((2, 4, 4, 3), np.uint8), [0, 1, 2], device="cpu")


def test_an_index_that_is_not_integers_is_refused():
    # a bool mask gathered as indices 0 and 1 while the labels took the mask (found in review)
    ds = DeviceDataset(*_data(4), device="cpu")
    for bad in (np.array([False, True, False, True]), np.array([1.0, 2.0])):
        message = f"DeviceDataset.batch: index must be a 1-D integer tensor, got {bad.dtype}"
        with pytest.raises(TypeError, match=message):
            ds.batch(frost.tensor(bad))
    with pytest.raises(TypeError, match="DeviceDataset.augment: index must be a 1-D integer tensor, got bool"):
        ds.augment(frost.tensor(np.array([True, False])), [0, 0], [0, 0], [0, 0], 8, 0, (0, 0, 0), (1, 1, 1))
