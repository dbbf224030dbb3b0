"""The GPU resized crops (frost/accel/resized_crop.py): the coefficients against a line-by-line transcription of
Pillow's precompute_coeffs and normalize_coeffs_8bpc, the kernels in the simulator against a NumPy twin of Pillow's
two passes (horizontal, then vertical) bit for bit, that twin against Pillow itself, the op `resized_crops` and its
rules, NVRTC compiles, and the kernels on the GPU."""
import math

import numpy as np
import PIL
import pytest

from frost import dispatch
from frost.accel import resized_crop as rc
from frost.backend import cuda
from frost.data.transforms import hflip, resized_crop, resized_crops

from accel_simulation import simulate_only

# (height, width) of an image, its (top, left, height, width) window, the output (height, width)
CASES = [((20, 30), (2, 3, 15, 20), (16, 16)),     # both axes shrink a little
         ((37, 25), (0, 0, 37, 25), (16, 16)),     # the whole image
         ((16, 16), (0, 0, 16, 16), (16, 16)),     # nothing to resample: an identity
         ((50, 41), (5, 1, 44, 40), (16, 16)),
         ((64, 70), (3, 9, 60, 58), (6, 5)),       # shrunk ~10x: 21 and 25 weights a pixel
         ((9, 12), (1, 2, 6, 7), (16, 20)),        # enlarged
         ((30, 24), (4, 0, 22, 24), (11, 24))]     # the window's full width at the output's: one pass only


def pillow_coefficients(in_size: int, in0: float, in1: float, out_size: int) -> tuple[list, list]:
    """Pillow's precompute_coeffs (bilinear) and normalize_coeffs_8bpc, transcribed line by line."""
    scale = filterscale = float(np.float32(in1) - np.float32(in0)) / out_size
    if filterscale < 1.0:
        filterscale = 1.0
    support = 1.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    bounds, kk = [], []
    for xx in range(out_size):
        center = in0 + (xx + 0.5) * scale
        ww, ss = 0.0, 1.0 / filterscale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = [0.0] * ksize
        for x in range(xmax):
            d = abs((x + xmin - center + 0.5) * ss)
            k[x] = 1.0 - d if d < 1.0 else 0.0
            ww += k[x]
        for x in range(xmax):
            if ww != 0.0:
                k[x] /= ww
        bounds.append((xmin, xmax))
        kk.append([int(0.5 + v * (1 << rc.PRECISION_BITS)) for v in k])
    return bounds, kk


def twin_pass(image: np.ndarray, bounds: np.ndarray, k: np.ndarray) -> np.ndarray:
    """One of Pillow's 8-bit passes along axis 1 of (rows, columns, 3): int64 sums of k-weighted pixels from the
    rounding half, shifted and clipped to uint8."""
    taps = bounds[:, :1] + np.arange(k.shape[1])[None, :]
    used = np.arange(k.shape[1])[None, :] < bounds[:, 1:]
    pixels = image[:, np.minimum(taps, image.shape[1] - 1)].astype(np.int64)   # (rows, out, ksize, 3)
    total = (1 << (rc.PRECISION_BITS - 1)) + (pixels * np.where(used, k, 0)[None, :, :, None]).sum(axis=2)
    return np.clip(total >> rc.PRECISION_BITS, 0, 255).astype(np.uint8)


def twin(image: np.ndarray, box: tuple, size: tuple) -> np.ndarray:
    """Pillow's resize of the window (as Pillow 12 and earlier order the passes): the horizontal pass over every row,
    then the vertical one (the rows Pillow skips are not read by it)."""
    top, left, height, width = box
    col_b, col_k = rc.coefficients(image.shape[1], left, left + width, size[1])
    row_b, row_k = rc.coefficients(image.shape[0], top, top + height, size[0])
    rows = twin_pass(image, col_b, col_k)
    return twin_pass(rows.transpose(1, 0, 2), row_b, row_k).transpose(1, 0, 2)


def _images(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for hw, _, _ in CASES]


@pytest.mark.parametrize("in_size, in0, in1, out_size", [(30, 3, 23, 16), (37, 0, 37, 16), (16, 0, 16, 16),
                                                         (70, 9, 67, 5), (12, 2, 9, 20), (500, 31, 412, 224)])
def test_coefficients_are_pillows(in_size, in0, in1, out_size):
    bounds, k = rc.coefficients(in_size, in0, in1, out_size)
    want_bounds, want_k = pillow_coefficients(in_size, in0, in1, out_size)
    np.testing.assert_array_equal(bounds, want_bounds)
    np.testing.assert_array_equal(k, want_k)


def test_the_twin_is_pillows_resize():
    """Exact where one axis is resampled (Pillow runs that pass alone); where both are, exact for Pillow 12 and
    earlier, and within one level for Pillow 13, which may run the vertical pass first."""
    for image, (_, box, size) in zip(_images(), CASES):
        top, left, height, width = box
        for out in [(size[0], width), (height, size[1]), size]:
            got = twin(image, box, out)
            want = resized_crop(image, top, left, height, width, out)
            one_axis = out[0] == height or out[1] == width
            if one_axis or int(PIL.__version__.split(".")[0]) < 13:
                np.testing.assert_array_equal(got, want, err_msg=f"{box} -> {out}")
            else:
                assert np.abs(got.astype(int) - want).max() <= 1, f"{box} -> {out}"


def test_the_kernels_match_the_twin_bit_for_bit(monkeypatch):
    launched = simulate_only(monkeypatch, ("resized_crops", rc.fits, rc.resized_crops_gpu))
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cpu")
    images = _images(1)
    for size in [(16, 16), (6, 5), (16, 20)]:
        boxes = [box for _, box, _ in CASES]
        flips = [i % 2 for i in range(len(images))]
        got = resized_crops(images, boxes, size, flips)
        want = hflip(np.stack([twin(image, box, size) for image, box in zip(images, boxes)]), np.array(flips, bool))
        assert got.shape == (len(images), *size, 3) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)
    assert launched == ["resample_rows", "resample_columns"] * 3


def test_without_the_kernels_each_window_is_pillows_resize_then_flipped():
    images = _images(2)
    boxes = [box for _, box, _ in CASES]
    flips = [1, 0, 0, 1, 1, 0, 1]
    got = resized_crops(images, boxes, (8, 9), flips)
    for i, (image, box) in enumerate(zip(images, boxes)):
        want = resized_crop(image, *box, (8, 9))
        np.testing.assert_array_equal(got[i], want[:, ::-1] if flips[i] else want)


def test_what_the_kernels_do_not_take_and_bad_calls():
    rgb = np.zeros((4, 4, 3), np.uint8)
    assert rc.fits(rgb, [rgb, rgb], [(0, 0, 4, 4)] * 2, (2, 2), [0, 0])
    assert not rc.fits(rgb, [rgb, np.zeros((4, 4, 4), np.uint8)], [(0, 0, 4, 4)] * 2, (2, 2), [0, 0])   # RGBA
    assert not rc.fits(rgb, [rgb, rgb[:, ::-1]], [(0, 0, 4, 4)] * 2, (2, 2), [0, 0])                     # strided
    assert not rc.fits(rgb, [rgb, rgb.astype(np.float32)], [(0, 0, 4, 4)] * 2, (2, 2), [0, 0])
    assert dispatch.lookup("resized_crops", rgb, [rgb], [(0, 0, 4, 4)], (2, 2), [0]) is None   # NumPy: Pillow's
    with pytest.raises(ValueError, match=r"resized_crops: 2 images, 1 boxes and 2 flips"):
        resized_crops([rgb, rgb], [(0, 0, 4, 4)], (2, 2), [0, 0])
    for box in [(1, 0, 4, 4), (0, -1, 2, 2), (0, 0, 0, 4)]:   # past the bottom, left of the image, empty
        with pytest.raises(ValueError, match=r"resized_crops: the window .* of image 1 is not inside its 4 x 4 pixels"):
            resized_crops([rgb, rgb], [(0, 0, 4, 4), box], (2, 2), [0, 0])
    with pytest.raises(ValueError, match=r"resized_crops: size must be a positive int"):
        resized_crops([rgb], [(0, 0, 4, 4)], (0, 2), [0])


@pytest.mark.parametrize("kern", [rc.resample_rows, rc.resample_columns], ids=["rows", "columns"])
def test_kernels_compile_for_sm90_without_spills(kern, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    cubin = kern.compile("sm_90")
    assert cubin[:4] == b"\x7fELF" and b".nv.local" not in cubin


@pytest.mark.cuda
def test_gpu_crops_match_the_twin():
    cupy = cuda.cupy()
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(375, 500), (500, 333), (224, 224)]]
    boxes = [(10, 40, 300, 420), (0, 0, 500, 333), (0, 0, 224, 224)]
    flips = [1, 0, 1]
    got = resized_crops([cupy.asarray(a) for a in images], boxes, (224, 224), flips)
    want = hflip(np.stack([twin(image, box, (224, 224)) for image, box in zip(images, boxes)]), np.array(flips, bool))
    np.testing.assert_array_equal(cupy.asnumpy(got), want)


def test_batch_coefficients_are_each_windows_own():
    """The batch's coefficients (a few NumPy calls for all windows) hold, bit for bit, each window's own from
    `coefficients`, padded with zero weights to the batch's widest ksize."""
    rng = np.random.default_rng(4)
    for _ in range(20):
        n, size = int(rng.integers(1, 30)), (int(rng.integers(1, 260)), int(rng.integers(1, 260)))
        heights, widths = rng.integers(1, 600, n), rng.integers(1, 600, n)
        tops, lefts = [int(rng.integers(0, h)) for h in heights], [int(rng.integers(0, w)) for w in widths]
        boxes = [(t, q, int(rng.integers(1, h - t + 1)), int(rng.integers(1, w - q + 1)))
                 for t, q, h, w in zip(tops, lefts, heights, widths)]
        plan = rc.batch_coefficients(heights, widths, boxes, size)
        for i, (h, w, (top, left, height, width)) in enumerate(zip(heights, widths, boxes)):
            row_b, row_k = rc.coefficients(int(h), top, top + height, size[0])
            col_b, col_k = rc.coefficients(int(w), left, left + width, size[1])
            assert plan["first_row"][i] == row_b[0, 0]
            assert plan["rows"][i] == row_b[-1, 0] + row_b[-1, 1] - row_b[0, 0]
            np.testing.assert_array_equal(plan["row_bounds"][i], row_b - np.array([row_b[0, 0], 0]))
            np.testing.assert_array_equal(plan["col_bounds"][i], col_b)
            np.testing.assert_array_equal(plan["row_k"][i, :, :row_k.shape[1]], row_k)
            np.testing.assert_array_equal(plan["col_k"][i, :, :col_k.shape[1]], col_k)
            assert not plan["row_k"][i, :, row_k.shape[1]:].any() and not plan["col_k"][i, :, col_k.shape[1]:].any()
