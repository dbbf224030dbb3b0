"""benchmarks/inflate_nvcomp.py gives both GPU inflaters the streams it says: the PNGs' zlib streams for Frost's kernel
and their raw deflate data (no header, no Adler-32) for nvCOMP, both inflating to zlib's scanlines; the nvCOMP
library is looked for where its wheel installs it."""
import importlib.util
import zlib
from pathlib import Path

import numpy as np
import pytest

from frost.data.png import decode_bytes
from frost.data.png_device import raw_size

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
_spec = importlib.util.spec_from_file_location("benchmarks_inflate_nvcomp", BENCHMARKS / "inflate_nvcomp.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


def test_the_streams_are_the_pngs_zlib_streams_and_their_raw_deflate_data():
    files = script.png_files(6, seed=1)
    assert all(decode_bytes(f).shape == (32, 32, 3) for f in files)
    full, full_lengths = script.packed_streams(files)
    body, body_lengths = script.packed_streams(files, skip=2, trim=4)
    expected = script.expected_scanlines(files)
    assert expected.shape == (6, raw_size(32, 32, 3))
    assert full.shape[1] % 16 == 0 and body.shape[1] % 16 == 0
    np.testing.assert_array_equal(body_lengths, full_lengths - 6)
    for i in range(6):
        assert zlib.decompress(full[i, :full_lengths[i]].tobytes()) == expected[i].tobytes()
        assert zlib.decompressobj(-15).decompress(body[i, :body_lengths[i]].tobytes()) == expected[i].tobytes()


def test_the_pngs_compress_like_cifar_not_like_noise():
    # random pixels give stored blocks (about 3.1 kB); real images' PNGs are smaller, so the inflaters do real work
    _, lengths = script.packed_streams(script.png_files(50))
    assert lengths.mean() < 0.9 * raw_size(32, 32, 3)


def test_the_library_is_found_on_the_path_or_named(tmp_path, monkeypatch):
    lib = tmp_path / "nvidia" / "libnvcomp" / "lib64" / "libnvcomp.so.6"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.delenv("NVCOMP_LIBRARY", raising=False)
    monkeypatch.setattr(script.sys, "path", [str(tmp_path)])
    assert script.find_nvcomp() == lib
    monkeypatch.setattr(script.sys, "path", [])
    assert script.find_nvcomp() is None
    monkeypatch.setenv("NVCOMP_LIBRARY", "/elsewhere/libnvcomp.so.6")
    assert str(script.find_nvcomp()) == "/elsewhere/libnvcomp.so.6"


@pytest.mark.cuda
def test_frosts_inflate_gives_zlibs_scanlines_in_the_benchmark():
    import cupy as cp
    row = script.run_batch(cp, script.png_files(64), None, repeats=3)
    assert row["batch"] == 64 and row["frost_us"] > 0
