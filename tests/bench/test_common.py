"""frost.bench.common: result files written atomically, output paths checked up front, the PNG copy's cache,
progress as plain lines off a terminal, the embedded sample as arrays."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from tqdm import tqdm

from frost.bench import common
from frost.data import cifar


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


class Stream(io.StringIO):
    """A text stream that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_off_a_terminal_is_a_few_whole_lines():
    # 400 steps logged one by one into a log file: tqdm wrote 404 carriage returns and one newline; plain progress
    # writes the first step, the last, and a line every every_s seconds (none here), whole lines only
    stream = Stream(tty=False)
    bar = common.progress_bar(400, "seed 0", stream=stream)
    assert isinstance(bar, common.PlainProgress)
    bar.every_s = 3600.0
    for i in range(400):
        bar.set_postfix(loss=f"{2 - i / 400:.4f}", img_s="1,000", refresh=False)
        bar.update(i + 1 - bar.n)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("seed 0: step 1/400 (0%), loss 2.0000, img_s 1,000, ")
    assert lines[1].startswith("seed 0: step 400/400 (100%), loss 1.0025, img_s 1,000, ") and len(lines) == 2


def test_progress_lines_follow_the_clock_and_a_stopped_run_says_where():
    stream = Stream(tty=False)
    bar = common.PlainProgress(100, "lion seed 1", stream=stream, every_s=0.0)  # a line at every update
    for step in (10, 20, 30):
        bar.update(step - bar.n)
    bar.close()
    assert [line.split(",")[0] for line in stream.getvalue().splitlines()] == [
        "lion seed 1: step 10/100 (10%)", "lion seed 1: step 20/100 (20%)", "lion seed 1: step 30/100 (30%)"]
    stream = Stream(tty=False)
    bar = common.PlainProgress(100, "x", stream=stream, every_s=3600.0)
    bar.update(1)
    bar.update(6)  # within the interval: not printed now...
    bar.close()  # ...but closing a run stopped early prints where it stopped
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["x: step 1/100 (1%)", "x: step 7/100 (7%)"]
    quiet = Stream(tty=False)
    bar = common.progress_bar(10, "x", disable=True, stream=quiet)
    bar.update(10)
    bar.close()
    assert quiet.getvalue() == ""


def test_progress_on_a_terminal_is_tqdms_bar():
    bar = common.progress_bar(10, "seed 0", stream=Stream(tty=True))
    assert isinstance(bar, tqdm)
    bar.close()


def test_keep_result_writes_only_where_told(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common.keep_result(None, {"a": 1})
    assert "not written: pass --out FILE.json" in capsys.readouterr().out and list(tmp_path.iterdir()) == []
    common.keep_result(tmp_path / "r.json", {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}


def test_load_cifar10_arrays_reads_the_embedded_sample_for_no_root():
    images, labels = common.load_cifar10_arrays(None, train=False)
    expected = cifar.load_sample(False)
    np.testing.assert_array_equal(images, expected[0])
    np.testing.assert_array_equal(labels, expected[1])


def test_seconds_per_call_times_only_the_timed_calls_between_two_synchronizations(monkeypatch):
    events, clock = [], iter([10.0, 16.0])
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(clock))
    seconds = common.seconds_per_call(lambda: events.append("call"), lambda: events.append("sync"), iters=3,
                                      warmup=2)
    assert events == ["call", "call", "sync", "call", "call", "call", "sync"]
    assert seconds == 2.0  # (16 - 10) / 3: the warm-up calls are not in the mean


def test_steady_seconds_per_call_leaves_out_what_a_timed_loop_pays_once(monkeypatch):
    """A call costs 1 s of device time and each synchronization 0.5 s (as the first call's host time before the
    device has work would): seconds_per_call reads 1 + 0.5 / iters, the steady time exactly 1."""
    now, events = [0.0], []

    def call():
        events.append("call")
        now[0] += 1.0

    def sync():
        events.append("sync")
        now[0] += 0.5
    monkeypatch.setattr(common.time, "perf_counter", lambda: now[0])
    assert common.seconds_per_call(call, sync, iters=4, warmup=1) == 1.125
    events.clear()
    assert common.steady_seconds_per_call(call, sync, iters=4, warmup=1, repeats=1) == 1.0
    assert events == ["call"] + ["sync"] + ["call"] * 4 + ["sync"] * 2 + ["call"] * 8 + ["sync"]


def test_steady_seconds_per_call_is_the_median_of_its_differences(monkeypatch):
    """One host pause of 100 s inside the first shorter run would make that difference (T(8) - T(4)) / 4 negative;
    the median of three differences is the call's 1 s."""
    now, calls = [0.0], [0]

    def call():
        calls[0] += 1
        now[0] += 101.0 if calls[0] == 2 else 1.0   # the first timed call (after one warm-up) is held up
    monkeypatch.setattr(common.time, "perf_counter", lambda: now[0])
    assert common.steady_seconds_per_call(call, lambda: None, iters=4, warmup=1, repeats=1) == -24.0
    calls[0] = 0
    assert common.steady_seconds_per_call(call, lambda: None, iters=4, warmup=1) == 1.0
    assert calls[0] == 1 + 3 * (4 + 8)


@pytest.mark.parametrize("timer", [common.seconds_per_call, common.steady_seconds_per_call])
def test_timing_without_a_timed_call_is_refused_by_name(timer):
    calls = []
    with pytest.raises(ValueError, match=rf"{timer.__name__}: iters .*--iters.* at least 1, got 0"):
        timer(lambda: calls.append(1), lambda: None, iters=0, warmup=2)
    assert calls == []   # refused before any warm-up call
