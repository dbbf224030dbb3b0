"""What Frost's convolution kernels share (frost/accel/conv_common.py, and frost.layout.flat_view): flat views of dense
arrays, the fixed-order sum of split partials (through conv_wgrad's finalize kernel in the simulator), and
`faster_than_cudnn`, the per-shape choice between our kernel and cuDNN's plan, remembered in memory and on disk."""
import json

import numpy as np
import pytest

from frost.accel import conv_common as cc
from frost.accel import conv_wgrad as cw
from frost.backend.remembered import RememberedTable
from frost.layout import flat_view


def test_flat_view_walks_the_memory_of_nchw_and_channels_last_arrays_without_copying():
    a = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    flat = flat_view(a, channels_last=False)
    assert np.shares_memory(flat, a) and flat.tolist() == a.reshape(-1).tolist()
    nhwc = np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)   # channels-last memory, NCHW shape
    flat = flat_view(nhwc, channels_last=True)
    assert np.shares_memory(flat, nhwc) and flat.tolist() == a.transpose(0, 2, 3, 1).reshape(-1).tolist()
    flat[0] = -1.0   # a view: writing through it reaches the array (an `out` written through a copy would be lost)
    assert nhwc[0, 0, 0, 0] == -1.0


def test_flat_view_of_a_strided_array_refuses_the_copy_it_would_make():
    a = np.zeros((2, 3, 4, 5), np.float32).transpose(0, 1, 3, 2)   # no flat view walks it in (n, c, h, w) order
    with pytest.raises(AssertionError, match="a flat view of an array copied it"):
        flat_view(a, channels_last=False)


@pytest.mark.parametrize("splits", [1, 3, 8, 13])
def test_the_finalize_kernel_sums_the_split_partials_of_every_output(splits):
    n_out = 70   # three blocks of 32 outputs, the last one partly past the end
    rng = np.random.default_rng(splits)
    part = rng.standard_normal(splits * n_out).astype(np.float32)
    out = np.full(n_out, np.nan, np.float32)
    finalize = cw.conv_wgrad_finalize.simulate
    finalize[-(-n_out // 32), 32 * cc.FINAL_WARPS](part, out, n_out, splits)
    want = part.astype(np.float64).reshape(splits, n_out).sum(0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_faster_than_cudnn_with_a_prefetch_queues_on_the_first_ask_and_decides_on_the_next(tmp_path, monkeypatch):
    # a forward pass's shapes compile side by side: the first ask of a shape only queues its candidates (cuDNN runs
    # that call), the next one times and decides; a capture neither queues nor decides; remembered shapes neither
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "_asked_once", set())
    monkeypatch.setattr(cc, "_undecided", set())
    table, counters, timed, queued = RememberedTable("defer_test.json"), {"choices": 0, "choose_seconds": 0.0}, [], []
    monkeypatch.setattr(cc.cuda, "graph_time_us", lambda fn: timed.append("cudnn") or 9.0)

    def ask(key):
        return cc.faster_than_cudnn(table, key, lambda: timed.append("ours") or (5.0, {"R": 2}), None, counters,
                                    lambda: queued.append(key))
    monkeypatch.setattr(cc, "capturing", lambda: True)
    assert ask("a") is False and queued == [] and timed == [] and not cc.pending_choices()   # capturing: cuDNN
    monkeypatch.setattr(cc, "capturing", lambda: False)
    assert ask("a") is False and ask("b") is False                       # first asks: queued, cuDNN runs
    assert queued == ["a", "b"] and timed == [] and cc.pending_choices() and counters["choices"] == 0
    assert ask("a") is True and timed == ["ours", "cudnn"] and cc.pending_choices()       # b still undecided
    assert ask("b") is True and not cc.pending_choices() and counters["choices"] == 2
    assert ask("a") is True and queued == ["a", "b"] and len(timed) == 4                  # remembered
    table.forget()
    monkeypatch.setattr(cc, "_asked_once", set())
    assert ask("a") is True and queued == ["a", "b"] and len(timed) == 4                  # from disk: not queued


def test_faster_than_cudnn_decides_once_remembers_on_disk_and_defers_during_capture(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    table, counters, timed = RememberedTable("choices_test.json"), {"choices": 0, "choose_seconds": 0.0}, []
    monkeypatch.setattr(cc.cuda, "graph_time_us", lambda fn: timed.append("cudnn") or 9.0)
    monkeypatch.setattr(cc, "capturing", lambda: True)
    assert cc.faster_than_cudnn(table, "k", lambda: timed.append("ours") or (5.0, {"R": 2}), None, counters) is False
    assert timed == [] and counters["choices"] == 0                       # unknown during a capture: cuDNN, no timing
    monkeypatch.setattr(cc, "capturing", lambda: False)
    assert cc.faster_than_cudnn(table, "k", lambda: timed.append("ours") or (5.0, {"R": 2}), None, counters)
    assert timed == ["ours", "cudnn"] and counters["choices"] == 1
    assert cc.faster_than_cudnn(table, "k", lambda: 1 / 0, None, counters)  # remembered: nothing timed again
    table.forget()
    assert json.loads((tmp_path / "choices_test.json").read_text())["k"] == {"ours": True, "tiles": {"R": 2},
                                                                             "ours_us": 5.0, "cudnn_us": 9.0}
    monkeypatch.setattr(cc, "capturing", lambda: True)
    assert cc.faster_than_cudnn(table, "k", lambda: 1 / 0, None, counters)  # from disk, also during a capture
