"""Frost makes no CUDA stream it later drops, and launches no uncaptured work on its timing stream."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[2]

# A fresh process with empty caches, as at a start-up that chooses kernels: every stream made goes through a
# counting stand-in for cupy.cuda.Stream, and every one made must be one of the kept streams.
CHURN_CHECK = """
import numpy as np, cupy as cp
made = []
make_stream = cp.cuda.Stream
cp.cuda.Stream = lambda *a, **k: made.append(k) or make_stream(*a, **k)
import frost, frost.nn as nn
from frost.bench.resnet_cifar10 import training_step
from frost.backend import cuda, cudnn
from frost.data import DataLoader, TensorDataset
x = frost.randn(8, 16, 16, 16, device="cuda").contiguous(frost.channels_last)
y = frost.tensor(np.arange(8) % 10, device="cuda")
for width in (16, 24):  # two models, two jitted steps: two captures
    model = nn.Sequential(nn.Conv2d(16, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10)).to(
        "cuda", memory_format=frost.channels_last)
    step = frost.jit(training_step(model, frost.optim.AdamW(model.parameters()), "fp32"))
    for _ in range(5):
        step(x, y)
    frost.cuda.synchronize()
a = cp.zeros(1 << 16, cp.float32)
for _ in range(20):
    cuda.graph_time_us(lambda: a.__imul__(1.0), calls=2, repeats=2, warmup=1)
data = TensorDataset(frost.tensor(np.arange(64 * 3, dtype=np.float32).reshape(64, 3)), frost.tensor(np.arange(64)))
for epoch in range(3):
    for xb, yb in DataLoader(data, batch_size=8, shuffle=True, seed=epoch, num_workers=2, device="cuda"):
        pass
frost.cuda.synchronize()
print(cudnn.stats["tune_seconds"] > 0, len(made), len(cuda._kept_streams), sorted(k[1:3] for k in cuda._kept_streams))
"""


def test_no_stream_is_made_and_dropped(tmp_path):
    env = dict(os.environ, FROST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CHURN_CHECK], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    tuned, made, kept, keys = done.stdout.strip().splitlines()[-1].split(" ", 3)
    assert tuned == "True", "cuDNN timed no plan: the check did not exercise plan timing"
    assert made == kept, f"{made} streams made, {kept} kept ({keys}): some stream was made and dropped"
    assert int(kept) <= 5, keys   # timing, graph, gradient branch, two copy streams


def test_kept_stream_is_one_per_purpose_index_and_thread():
    import threading

    from frost.backend import cuda
    assert cuda.kept_stream("timing") is cuda.kept_stream("timing")
    assert cuda.kept_stream("copy", 1) is not cuda.kept_stream("copy", 0)
    assert cuda.kept_stream("graph") is not cuda.kept_stream("timing")
    assert cuda.kept_stream("graph").ptr != 0   # not the legacy default stream: a graph can be captured on it
    other = []
    worker = threading.Thread(target=lambda: other.append(cuda.kept_stream("timing")))
    worker.start()
    worker.join()
    assert other[0] is not cuda.kept_stream("timing")   # two threads timing at once must not share a stream


def test_graph_time_us_runs_the_uncaptured_call_on_the_callers_stream():
    # kernels launched outside a capture on a side stream leave the process's later graphs slower to replay
    # (frost.backend.cuda.graph_time_us): only captured work may go to the timing stream
    from frost.backend import cuda
    cp = cuda.cupy()
    x = cp.zeros(1024, cp.float32)
    seen = []

    def fn():
        seen.append((cp.cuda.get_current_stream().ptr, cp.cuda.get_current_stream().is_capturing()))
        x.__iadd__(1.0)
    caller = cp.cuda.Stream(non_blocking=True)
    with caller:
        us = cuda.graph_time_us(fn, calls=3, repeats=2, warmup=1)
    assert us > 0
    assert seen[0] == (caller.ptr, False)
    timing = cuda.kept_stream("timing").ptr
    assert seen[1:] == [(timing, True)] * 3
    # one eager call, then three captured calls replayed 1 + 2 times
    np.testing.assert_array_equal(cp.asnumpy(x), np.full(1024, 1 + 3 * 3, np.float32))
