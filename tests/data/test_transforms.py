"""Tests for frost/data/transforms.py: explicit draws, crop/flip/normalize against loop and PyTorch oracles."""
import numpy as np
import pytest
import torch

from frost.data import transforms as T

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def batch(n=6, h=8, w=8, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def loop_crop_flip(x, oy, ox, flips, size, padding):
    out = []
    for img, y0, x0, f in zip(x, oy, ox, flips):
        padded = np.zeros((img.shape[0] + 2 * padding, img.shape[1] + 2 * padding, 3), np.uint8)
        padded[padding:padding + img.shape[0], padding:padding + img.shape[1]] = img
        window = padded[y0:y0 + size, x0:x0 + size]
        out.append(window[:, ::-1] if f else window)
    return np.stack(out)


def test_crop_and_flip_match_a_per_image_loop():
    x = batch()
    oy, ox = np.array([0, 8, 3, 1, 4, 2]), np.array([8, 0, 5, 4, 4, 0])
    flips = np.array([True, False, True, True, False, False])
    got = T.hflip(T.crop(x, oy, ox, 8, padding=4), flips)
    np.testing.assert_array_equal(got, loop_crop_flip(x, oy, ox, flips, 8, 4))
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(T.crop(x[0], [2], [1], 5, 0), x[0, 2:7, 1:6])  # one HWC image
    assert (T.crop(x, oy, ox, 8, 4)[1, :, :4] == 0).all()  # x offset 0 shows the zero padding


def test_crop_rejects_bad_offsets():
    with pytest.raises(ValueError, match=r"offsets out of range for 8x8 images padded by 4 and a 8x8 window"):
        T.crop(batch(), np.full(6, 9), np.zeros(6, int), 8, 4)
    with pytest.raises(ValueError, match="6 images but 2 y offsets"):
        T.crop(batch(), [0, 0], np.zeros(6, int), 8, 4)


def test_to_float_and_normalize_match_pytorch_exactly():
    x = batch()
    ours = T.normalize(T.to_float(x), MEAN, STD)
    ref = (torch.from_numpy(x).float() / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, ref.numpy())
    with pytest.raises(TypeError, match="expected uint8 pixels, got float32"):
        T.to_float(ours)
    with pytest.raises(ValueError, match="do not fit 3 channels"):
        T.normalize(ours, (0.5, 0.5), (1.0, 1.0))
    with pytest.raises(TypeError, match="normalize: x must be a floating-point array .* got uint8"):
        T.normalize(x, MEAN, STD)  # torchvision's rule: uint8 pixels would be normalized as 0..255
    with pytest.raises(ValueError, match="has a zero"):
        T.normalize(ours, MEAN, (0.2, 0.0, 0.2))


def test_augment_is_the_composition_of_its_parts():
    x = batch(n=5, h=32, w=32)
    rng = np.random.default_rng(3)
    oy, ox = T.RandomCrop(32, padding=4).draw(5, rng)
    flips = T.RandomHorizontalFlip().draw(5, rng)
    got = T.augment(x, oy, ox, flips, size=32, padding=4, mean=MEAN, std=STD)
    pixels = torch.from_numpy(loop_crop_flip(x, oy, ox, flips, 32, 4)).float() / 255
    ref = (pixels - torch.tensor(MEAN)) / torch.tensor(STD)
    np.testing.assert_array_equal(got, ref.numpy())


def test_random_transforms_draw_from_the_given_generator():
    x = batch(n=50, h=32, w=32)
    crop = T.RandomCrop(32, padding=4, rng=np.random.default_rng(9))
    oy, ox = T.RandomCrop(32, padding=4).draw(50, np.random.default_rng(9))
    assert oy.min() >= 0 and oy.max() <= 8 and {0, 8} <= set(oy.tolist()) | set(ox.tolist())
    np.testing.assert_array_equal(crop(x), T.crop(x, oy, ox, 32, 4))
    flip = T.RandomHorizontalFlip(p=0.5, rng=np.random.default_rng(1))
    flips = T.RandomHorizontalFlip(p=0.5).draw(50, np.random.default_rng(1))
    assert 10 < flips.sum() < 40
    np.testing.assert_array_equal(flip(x), T.hflip(x, flips))
    assert T.RandomHorizontalFlip(p=0.0).draw(10, np.random.default_rng(0)).sum() == 0


def test_compose_on_a_single_image():
    img = batch(n=1)[0]
    pipeline = T.Compose([T.RandomCrop(8, padding=2, rng=np.random.default_rng(0)),
                          T.RandomHorizontalFlip(p=1.0), T.ToFloat(), T.Normalize(MEAN, STD)])
    out = pipeline(img)
    assert out.shape == (8, 8, 3) and out.dtype == np.float32
    oy, ox = T.RandomCrop(8, padding=2).draw(1, np.random.default_rng(0))
    expected = T.normalize(T.to_float(T.crop(img, oy, ox, 8, 2)[:, ::-1]), MEAN, STD)
    np.testing.assert_array_equal(out, expected)
    assert repr(pipeline) == "Compose(RandomCrop, RandomHorizontalFlip, ToFloat, Normalize)"


def test_gather_scaled_rejects_bad_input_by_name():
    images = np.zeros((3, 2, 2, 1), np.uint8)
    with pytest.raises(ValueError, match="gather_scaled: dtype must be float32 or bfloat16, got 'float16'"):
        T.gather_scaled(images, np.array([0], np.int64), "float16")
    with pytest.raises(TypeError, match=r"gather_scaled: images must be uint8 .* got images float32"):
        T.gather_scaled(images.astype(np.float32), np.array([0], np.int64))
    for index in (np.array([0.0]), np.array([True, False, True])):   # a mask is not an index here
        with pytest.raises(TypeError, match=f"index 1-D integers, got .* index {index.dtype}"):
            T.gather_scaled(images, index)


def test_gather_scaled_takes_any_integer_index_and_lists():
    images = np.random.default_rng(9).integers(0, 256, (5, 2, 3, 3), dtype=np.uint8)
    want = images[[4, 1, 1]].astype(np.float32) / np.float32(255)
    for index in ([4, 1, 1], np.array([4, 1, 1], np.int32), np.array([4, 0, 1, 0, 1], np.uint8)[::2]):
        np.testing.assert_array_equal(T.gather_scaled(images, index), want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gather_scaled_on_the_cpu_is_to_float_of_the_gathered_images(dtype):
    from frost.dtype import to_dtype
    images = np.random.default_rng(2).integers(0, 256, (7, 4, 5, 3), dtype=np.uint8)
    index = np.array([6, 0, 3, 3, 1], np.int64)
    out = T.gather_scaled(images, index, dtype)
    assert out.dtype == to_dtype(dtype).np and out.shape == (5, 4, 5, 3)
    np.testing.assert_array_equal(out.astype(np.float32),
                                  (images[index].astype(np.float32) / np.float32(255)).astype(out.dtype)
                                  .astype(np.float32))


def test_gather_augmented_on_the_cpu_is_augment_in_nchw():
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    index, oy, ox = np.array([4, 0, 5]), np.array([0, 4, 2]), np.array([3, 1, 0])
    flips = np.array([1, 0, 1])
    out = T.gather_augmented(images, index, oy, ox, flips, 8, 2, MEAN, STD)
    assert out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, T.augment(images[index], oy, ox, flips.astype(bool), 8, 2, MEAN, STD)
                                  .transpose(0, 3, 1, 2))


def test_gather_augmented_takes_lists_and_tensors_on_the_cpu():
    import frost
    images = np.random.default_rng(6).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    want = T.gather_augmented(images, np.array([1, 3]), np.array([0, 4]), np.array([2, 1]), np.array([1, 0]), 8, 2,
                              MEAN, STD)
    np.testing.assert_array_equal(T.gather_augmented(images, [1, 3], [0, 4], (2, 1), [True, False], 8, 2, MEAN, STD),
                                  want)
    got = T.gather_augmented(frost.tensor(images), frost.tensor([1, 3]), frost.tensor([0, 4]), frost.tensor([2, 1]),
                             frost.tensor([1, 0]), 8, 2, MEAN, STD)
    np.testing.assert_array_equal(got, want)
    x = T.gather_scaled(frost.tensor(images), frost.tensor(np.array([4, 0])))
    np.testing.assert_array_equal(x, images[[4, 0]].astype(np.float32) / np.float32(255))


@pytest.mark.parametrize("change, message", [
    (dict(images=np.zeros((5, 8, 8), np.uint8)), r"images must be a uint8 \(N, H, W, C\) array, got uint8 \(5, 8, 8\)"),
    (dict(images=np.zeros((5, 8, 8, 3), np.float32)), "images must be a uint8 .* got float32"),
    (dict(offsets_x=[0, 1, 2]),
     r"index, offsets_y, offsets_x and flips must be 1-D of one length, got shapes .*'offsets_x': \(3,\)"),
    (dict(index=np.zeros((2, 1), np.int64), offsets_y=np.zeros((2, 1)), offsets_x=np.zeros((2, 1)),
          flips=np.zeros((2, 1))), "index, offsets_y, offsets_x and flips must be 1-D of one length"),
    (dict(mean=(0.5, 0.5)), r"mean and std need 3 values \(the images' channels\), got 2 and 3"),
    (dict(size=13), "a 13x13 window does not fit 8x8 images padded by 2"),
    (dict(flips=[0.5, 1.0]),
     r"index and offsets must be integers, flips integers or bools; got \{'flips': 'float64'\}"),
    (dict(index=[True, False]), r"index and offsets must be .* got \{'index': 'bool'\}"),
    (dict(offsets_y=np.zeros(2, np.float32)), r"index and offsets must be .* got \{'offsets_y': 'float32'\}"),
    (dict(std=(0.2, 0.0, 0.3)), r"std \[0.2, 0.0, 0.3\] has a zero"),
])
def test_gather_augmented_names_bad_arguments(change, message):
    args = dict(images=np.zeros((5, 8, 8, 3), np.uint8), index=[0, 1], offsets_y=[0, 0], offsets_x=[0, 0],
                flips=[0, 1], size=8, padding=2, mean=MEAN, std=STD)
    args.update(change)
    with pytest.raises((TypeError, ValueError), match="gather_augmented: " + message):
        T.gather_augmented(**args)


def test_gather_augmented_reads_zeros_outside_the_padded_image_for_any_offset():
    # what the GPU kernel does (it cannot check offsets without reading the device): checked against it in
    # tests/accel/test_augment_kernels.py
    images = np.random.default_rng(10).integers(1, 256, (3, 8, 8, 3), dtype=np.uint8)
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    out = T.gather_augmented(images, [0, 1, 2, 0], [6, -3, 40, 0], [0, 2, 0, -30], [0, 1, 0, 0], 8, 2, mean, std)
    # image 0, offsets (6, 0): window rows 0-3 are image rows 4-7, columns 2-7 image columns 0-5; the rest is outside
    np.testing.assert_array_equal(out[0, :, :4, 2:], images[0, 4:8, :6].transpose(2, 0, 1) / np.float32(255))
    assert (out[0, :, 4:] == 0).all() and (out[0, :, :4, :2] == 0).all()
    assert (out[1, :, :5] == 0).all() and (out[1, :, 5:] != 0).any()         # rows -5..-1 above image 1
    assert (out[2] == 0).all() and (out[3] == 0).all()                       # windows wholly outside
    in_range = T.gather_augmented(images, [0], [4], [2], [1], 8, 2, mean, std)
    np.testing.assert_array_equal(in_range, T.augment(images[[0]], [4], [2], [True], 8, 2, mean, std)
                                  .transpose(0, 3, 1, 2))


def test_random_crop_larger_than_the_padded_image_is_refused():
    with pytest.raises(ValueError, match=r"RandomCrop: the crop \(32, 32\) is larger than the image \(24, 24\) padded "
                                         r"by 2"):
        T.RandomCrop(32, padding=2)(np.zeros((24, 24, 3), np.uint8))
    assert T.RandomCrop(28, padding=2)(np.zeros((24, 24, 3), np.uint8)).shape == (28, 28, 3)


# ---------------------------------------------------------------- Resize, CenterCrop, RandomResizedCrop
def smooth_image(h, w, seed=0):
    """A smooth image (sums of low-frequency waves): resampling filters agree on it up to their rounding."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    waves = [np.sin(2 * np.pi * (rng.uniform(0.5, 3) * yy + rng.uniform(0.5, 3) * xx + rng.uniform()))
             for _ in range(3)]
    return np.clip(np.stack(waves, -1) * 100 + 128, 0, 255).astype(np.uint8)


def torch_resized_crop(x, top, left, h, w, size):
    window = torch.tensor(x[top:top + h, left:left + w]).permute(2, 0, 1)[None].double()
    out = torch.nn.functional.interpolate(window, size=size, mode="bilinear", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("box, size", [((0, 0, 300, 400), (150, 200)), ((17, 33, 211, 160), (224, 224)),
                                       ((5, 9, 40, 30), (120, 90)), ((0, 0, 300, 400), (256, 341))])
def test_resized_crop_matches_torch_antialiased_bilinear_to_rounding(box, size):
    x = smooth_image(300, 400)
    ours = T.resized_crop(x, *box, size).astype(np.float64)
    theirs = torch_resized_crop(x, *box, size)
    assert ours.shape == theirs.shape
    # Pillow resamples in 8-bit fixed point with its own coefficient rounding: a level or two, never a bias
    assert np.abs(ours - theirs).max() <= 2 and np.abs(ours - theirs).mean() < 0.5


def test_resize_keeps_the_aspect_ratio_as_torchvision_and_center_crop_takes_the_middle():
    x = smooth_image(300, 400)
    assert T.Resize(256)(x).shape == (256, 341, 3) and T.Resize(256)(x.transpose(1, 0, 2)).shape == (341, 256, 3)
    assert T.Resize((100, 50))(x).shape == (100, 50, 3)
    np.testing.assert_array_equal(T.CenterCrop((100, 101))(x), x[100:200, 150:251])
    with pytest.raises(ValueError, match=r"CenterCrop: the crop \(400, 400\) is larger than the image \(300, 400\)"):
        T.CenterCrop(400)(x)
    with pytest.raises(ValueError, match="Resize: expected a uint8 HWC image"):
        T.Resize(10)(x.astype(np.float32))


def test_random_resized_crop_windows_keep_to_scale_and_ratio_and_repeat_with_the_seed():
    t = T.RandomResizedCrop(64, scale=(0.2, 0.9), ratio=(0.5, 2.0))
    windows = [t.draw(300, 400, np.random.default_rng(s)) for s in range(300)]
    for top, left, h, w in windows:
        assert 0 <= top and top + h <= 300 and 0 <= left and left + w <= 400
        assert 0.2 * 0.98 <= h * w / (300 * 400) <= 0.9 * 1.02 and 0.5 * 0.97 <= w / h <= 2.0 * 1.03
    assert len(set(windows)) > 290  # they vary
    assert t.draw(300, 400, np.random.default_rng(7)) == windows[7]
    x = smooth_image(300, 400)
    top, left, h, w = windows[3]
    np.testing.assert_array_equal(
        T.RandomResizedCrop(64, scale=(0.2, 0.9), ratio=(0.5, 2.0), rng=np.random.default_rng(3))(x),
        T.resized_crop(x, top, left, h, w, (64, 64)))


def test_random_resized_crop_falls_back_to_the_central_crop_clamped_to_the_ratio():
    # no window of 90 % or more of a 10 x 1000 image has an aspect ratio within 3/4..4/3: ten tries fail
    t = T.RandomResizedCrop(8, scale=(0.9, 1.0))
    assert t.draw(10, 1000, np.random.default_rng(0)) == (0, (1000 - 13) // 2, 10, 13)  # w = round(10 * 4/3)
    assert t.draw(1000, 10, np.random.default_rng(0)) == ((1000 - 13) // 2, 0, 13, 10)  # h = round(10 / (3/4))
    with pytest.raises(ValueError, match="scale and ratio must be increasing positive pairs"):
        T.RandomResizedCrop(8, scale=(1.0, 0.5))
