"""Tests for frost/data/folder.py (ImageFolder, ImageList) and frost/data/text.py (TokenDataset)."""
import os

import numpy as np
import pytest
from PIL import Image

import frost
from frost.data import DataLoader, DataLoaderWorkerError, ImageFolder, ImageList, TokenDataset, decode_image


def make_folder(root, corrupt=None):
    rng = np.random.default_rng(0)
    images = {}
    for c, name in enumerate(["cat", "dog"]):
        (root / name).mkdir()
        for k in range(3):
            img = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
            path = root / name / f"{k}.png"
            Image.fromarray(img).save(path)
            images[str(path)] = (img, c)
    Image.fromarray(np.full((5, 4, 3), 128, np.uint8)).save(root / "dog" / "z.jpg", quality=95)
    (root / "dog" / "notes.txt").write_text("not an image")
    if corrupt:
        (root / "cat" / corrupt).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    return images


def test_image_folder_reads_png_and_jpeg(tmp_path):
    images = make_folder(tmp_path)
    ds = ImageFolder(tmp_path)
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    assert len(ds) == 7 and ds.targets.tolist() == [0, 0, 0, 1, 1, 1, 1]
    for i, (path, label) in enumerate(ds.samples[:6]):
        img, y = ds[i]
        np.testing.assert_array_equal(img, images[path][0])  # PNG is lossless
        assert y == label == images[path][1]
    jpeg, y = ds[6]
    assert jpeg.shape == (5, 4, 3) and jpeg.dtype == np.uint8 and y == 1
    assert np.abs(jpeg.astype(int) - 128).max() <= 3  # lossy but close


@pytest.mark.parametrize("written", ["~/data/pets", "$PETS_ROOT/pets", "${PETS_ROOT}/pets", "~/data/$PETS_NAME"])
def test_image_folder_expands_home_and_environment_variables(tmp_path, monkeypatch, written):
    (tmp_path / "data").mkdir()
    root = tmp_path / "data" / "pets"
    root.mkdir()
    images = make_folder(root)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PETS_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("PETS_NAME", "pets")
    ds = ImageFolder(written)
    assert ds.root == root and len(ds) == 7
    np.testing.assert_array_equal(ds[0][0], images[ds.samples[0][0]][0])


def test_grayscale_images_become_rgb(tmp_path):
    Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4), mode="L").save(tmp_path / "g.png")
    img = decode_image(tmp_path / "g.png")
    assert img.shape == (3, 4, 3)
    np.testing.assert_array_equal(img[..., 1], np.arange(12).reshape(3, 4))


def test_corrupt_png_names_the_file(tmp_path):
    make_folder(tmp_path, corrupt="bad.png")
    ds = ImageFolder(tmp_path)
    bad = [i for i, (p, _) in enumerate(ds.samples) if p.endswith("bad.png")][0]
    with pytest.raises(RuntimeError, match=r"cannot decode .*cat[/\\]bad\.png"):
        ds[bad]
    with pytest.raises(DataLoaderWorkerError, match=r"cannot decode .*bad\.png") as info:
        list(DataLoader(ds, batch_size=2, num_workers=3))
    assert "bad.png" in str(info.value.__cause__)


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        ImageFolder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"class folder\(s\) \['empty'\] .* hold no .png/.jpg/.jpeg files"):
        ImageFolder(tmp_path)


def test_image_folder_walks_class_folders_as_torchvision(tmp_path):
    """Images in subfolders count, folders named like images do not, in torchvision's order."""
    make_folder(tmp_path)
    (tmp_path / "cat" / "part2").mkdir()
    Image.fromarray(np.zeros((5, 4, 3), np.uint8)).save(tmp_path / "cat" / "part2" / "b.png")
    (tmp_path / "dog" / "d.png").mkdir()
    ds = ImageFolder(tmp_path)
    names = [os.path.relpath(p, tmp_path) for p, _ in ds.samples]
    assert names == ["cat/0.png", "cat/1.png", "cat/2.png", "cat/part2/b.png", "dog/0.png", "dog/1.png",
                     "dog/2.png", "dog/z.jpg"]
    assert [t for _, t in ds.samples] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_image_list_through_the_loader(tmp_path):
    images = make_folder(tmp_path)
    paths = sorted(p for p in images)
    ds = ImageList(paths, [images[p][1] for p in paths], transform=lambda x: x[:4])
    for w in (0, 2):
        (x, y), = [(x.numpy().copy(), y.numpy().copy()) for x, y in DataLoader(ds, batch_size=6, num_workers=w)]
        np.testing.assert_array_equal(x, np.stack([images[p][0][:4] for p in paths]))
        assert y.tolist() == [images[p][1] for p in paths]
    with pytest.raises(ValueError, match="2 paths but 1 targets"):
        ImageList(paths[:2], [0])


def test_token_dataset_windows():
    tokens = np.arange(10, dtype=np.uint16)
    ds = TokenDataset(tokens, block_size=4)
    assert len(ds) == 6
    x, y = ds[2]
    assert x.tolist() == [2, 3, 4, 5] and y.tolist() == [3, 4, 5, 6]
    assert x.dtype == np.int64
    assert ds[-1][1].tolist() == [6, 7, 8, 9]
    with pytest.raises(IndexError, match="index 6 out of range for 6 windows"):
        ds[6]
    xb, yb = next(iter(DataLoader(TokenDataset(frost.arange(20), 3), batch_size=4, shuffle=True, seed=0)))
    np.testing.assert_array_equal(yb.numpy()[:, :-1], xb.numpy()[:, 1:])
    with pytest.raises(ValueError, match="10 tokens are too few for block_size 10"):
        TokenDataset(tokens, 10)
    with pytest.raises(TypeError, match="tokens must be integers"):
        TokenDataset(np.zeros(5), 2)


def test_token_dataset_from_files(tmp_path):
    np.arange(8, dtype=np.uint16).tofile(tmp_path / "t.bin")
    np.save(tmp_path / "t.npy", np.arange(8, dtype=np.int32))
    for name in ("t.bin", "t.npy"):
        ds = TokenDataset.from_file(tmp_path / name, block_size=3)
        assert ds[4][0].tolist() == [4, 5, 6]


def test_token_dataset_get_batch_matches_getitem():
    ds = TokenDataset(np.arange(50, dtype=np.uint16) * 3, block_size=5)
    idx = np.array([0, 44, 7, 7])
    x, y = ds.get_batch(idx)
    np.testing.assert_array_equal(x, np.stack([ds[i][0] for i in idx]))
    np.testing.assert_array_equal(y, np.stack([ds[i][1] for i in idx]))
    assert x.dtype == np.int64
    negative = np.array([-1, -45])  # from the end, as ds[-1]
    np.testing.assert_array_equal(ds.get_batch(negative)[0], np.stack([ds[i][0] for i in negative]))
    with pytest.raises(IndexError, match="index 45 out of range for 45 windows"):
        ds.get_batch(np.array([0, 45]))
