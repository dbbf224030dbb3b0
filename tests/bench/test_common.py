"""frost.bench.common: result files written atomically, output paths checked up front, the PNG copy's cache."""
from __future__ import annotations

import numpy as np
import pytest

from frost.bench import common


def test_write_json_leaves_no_temporary_file_when_it_fails(tmp_path):
    (tmp_path / "result.json").mkdir()  # os.replace cannot put a file over a folder
    with pytest.raises(IsADirectoryError):
        common.write_json(tmp_path / "result.json", {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
    common.write_json(tmp_path / "new" / "r.json", {"a": 1})  # the parent is created
    assert (tmp_path / "new" / "r.json").read_text() == '{\n "a": 1\n}\n'
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["r.json"]


def test_check_output_path(tmp_path):
    common.check_output_path("--out", None)
    common.check_output_path("--out", tmp_path / "r.json")
    common.check_output_path("--out", tmp_path / "not" / "yet" / "r.json")  # folders write_json will create
    with pytest.raises(SystemExit, match=f"--plot {tmp_path} is a folder; give a file path"):
        common.check_output_path("--plot", tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit, match=f"--out {tmp_path}/f/a/r.json: {tmp_path}/f is a file, not a folder"):
        common.check_output_path("--out", tmp_path / "f" / "a" / "r.json")


def _arrays(n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n),
            rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 4))


def _train_image(folder, i: int) -> np.ndarray:
    from PIL import Image
    (path,) = (folder / "train").glob(f"{i}_*.png")
    return np.asarray(Image.open(path))


def test_the_png_copy_is_written_again_when_the_data_at_its_path_changed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FROST_CACHE", str(tmp_path / "cache"))
    data_root = tmp_path / "cifar"
    data_root.mkdir()
    first = common.png_folder_for(data_root, *_arrays(8, 0))
    more = _arrays(16, 1)
    assert common.png_folder_for(data_root, *more) == first  # one copy per --data path...
    assert len(common.read_png_index(first, "train")) == 16  # ...holding the new data, not the old 8 images
    np.testing.assert_array_equal(_train_image(first, 15), more[0][15])
    one_pixel = (more[0].copy(), *more[1:])
    one_pixel[0][3, 5, 7, 1] ^= 1
    common.png_folder_for(data_root, *one_pixel)
    np.testing.assert_array_equal(_train_image(first, 3), one_pixel[0][3])
    fewer = _arrays(8, 2)
    common.png_folder_for(data_root, *fewer)
    assert len(common.read_png_index(first, "train")) == 8  # the longer copy's extra images are gone
    assert capsys.readouterr().out.count("writing the PNG layout") == 4
    common.png_folder_for(data_root, *fewer)  # the same data: reused
    assert "writing" not in capsys.readouterr().out


def test_a_png_copy_without_a_digest_is_written_again(tmp_path, monkeypatch, capsys):
    # copies written before the digest was recorded cannot say which data they hold
    monkeypatch.setenv("FROST_CACHE", str(tmp_path / "cache"))
    folder = common.png_folder_for(tmp_path, *_arrays(8, 0))
    (folder / "COMPLETE").write_text("written by frost.bench.common.write_png_folder\n")
    common.png_folder_for(tmp_path, *_arrays(8, 0))
    assert capsys.readouterr().out.count("writing the PNG layout") == 2
    assert common.png_copy_digest(folder) == common.arrays_digest(
        dict(zip(("train", "test"), [_arrays(8, 0)[:2], _arrays(8, 0)[2:]])))
