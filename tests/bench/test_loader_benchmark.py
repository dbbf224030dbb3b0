"""benchmarks/loader.py's JPEG mode on a tiny folder: the ImageNet-style JPEG folder it makes (CIFAR-10 upscaled to
224 x 224), the training transform's batches, and a row for each loader in its JSON."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from PIL import Image

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_loader_script():
    spec = importlib.util.spec_from_file_location("benchmarks_loader", BENCHMARKS / "loader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_jpeg_mode_reads_a_224_pixel_jpeg_folder_with_each_loader(tmp_path):
    loader = load_loader_script()
    folder, out = tmp_path / "jpegs", tmp_path / "loader.json"
    result = loader.main(["--jpeg", "--n", "20", "--threads", "1", "--repeats", "1", "--batch", "10",
                          "--dir", str(folder), "--out", str(out)])
    files = sorted(folder.glob("*/*.jpg"))
    assert len(files) == 20 and {f.parent.name for f in files} <= set(loader.CLASSES)
    with Image.open(files[0]) as image:
        assert (image.format, image.size) == ("JPEG", (224, 224))
    x, y = loader.jpeg_dataset(folder).get_batch(np.arange(10))
    assert x.shape == (10, 224, 224, 3) and x.dtype == np.uint8 and y.shape == (10,)
    written = json.loads(out.read_text())
    assert written["format"] == result["format"] == "jpeg" and "RandomResizedCrop(224)" in written["transform"]
    (row,) = written["rows"]
    assert all(row[f"{name}_images_per_s"] > 0 for name in ("frost", "frost_process", "torch"))
    assert row["torch_pillow_images_per_s"] is None and row["frost_gpu_decode_images_per_s"] is None


def test_only_names_known_paths(capsys):
    loader = load_loader_script()
    try:
        loader.main(["--only", "frost,torhc"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("--only accepted an unknown path")
    assert "--only: unknown path(s) torhc" in capsys.readouterr().err
