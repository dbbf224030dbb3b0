"""cuDNN's warm-up: the first convolution on a background thread, waited for by the first convolution of another."""
import threading
import time

import numpy as np
import pytest

import frost
from frost import nn
from frost.backend import cudnn
from frost.ops.conv import conv2d


@pytest.fixture
def no_warm_up_yet(monkeypatch):
    monkeypatch.setattr(cudnn, "_warm_up_thread", None)


def test_handle_users_wait_for_the_warm_up_thread(no_warm_up_yet):
    done = []
    thread = threading.Thread(target=lambda: (time.sleep(0.2), done.append(True)))
    cudnn._warm_up_thread = thread
    thread.start()
    cudnn._wait_for_warm_up()
    assert done == [True]


@pytest.mark.parametrize("available, switch", [(False, "1"), (True, "0")])
def test_warm_up_does_nothing_without_cudnn_or_when_switched_off(monkeypatch, no_warm_up_yet, available, switch):
    monkeypatch.setattr(cudnn, "available", lambda: available)
    monkeypatch.setenv("FROST_CUDNN_WARM_UP", switch)
    cudnn.warm_up()
    assert cudnn._warm_up_thread is None


def test_moving_a_model_with_convolutions_to_the_gpu_starts_the_warm_up(monkeypatch):
    calls = []
    monkeypatch.setattr(cudnn, "warm_up", lambda: calls.append(1))
    monkeypatch.setattr(frost.nn.module.backend, "to_device", lambda array, device: array)  # no GPU needed
    nn.Sequential(nn.Linear(4, 4)).to("cuda")
    nn.Sequential(nn.Conv2d(3, 4, 3)).to("cpu")
    assert calls == []
    nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).to("cuda")
    assert calls == [1]


@pytest.mark.cuda
def test_convolution_after_the_warm_up_matches_the_cpu(no_warm_up_yet):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 8, 8)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    cudnn.warm_up()
    warm = cudnn._warm_up_thread
    assert warm is not None
    out = conv2d(frost.tensor(x, device="cuda"), frost.tensor(w, device="cuda"), padding=1)
    assert not warm.is_alive()
    want = conv2d(frost.tensor(x), frost.tensor(w), padding=1).numpy()
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=2e-3, atol=2e-3)  # TF32 on the GPU
    assert len({key[1] for key in cudnn._handles}) >= 2  # the warm-up thread's handle is its own
