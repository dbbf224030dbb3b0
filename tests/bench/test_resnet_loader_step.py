"""`frost bench resnet-cifar10 --pipeline loader` trains on the numbers the resident pipeline trains on: its step takes
the loader's uint8 NHWC batch and scales it inside (the resident gather's kernel on the GPU), so the same images give
the same losses and weights, eager and captured."""
import argparse

import numpy as np
import pytest

import frost
import frost.backends
from frost.bench import resnet_cifar10 as bench
from frost.jit import jit
from frost.tensor import Tensor


def _train_both(device: str, channels_last: bool, use_jit: bool, steps: int = 5) -> tuple[list, list, dict, dict]:
    rng = np.random.default_rng(3)
    batch = 32
    images = rng.integers(0, 256, (steps * batch, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, steps * batch)
    resident = images if channels_last else np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    x_all = frost.tensor(resident, device=device).data
    y_all = frost.tensor(labels, device=device).data
    wrap = jit if use_jit else None
    model_r, opt_r = bench.build(0, device, channels_last)
    model_l, opt_l = bench.build(0, device, channels_last)
    step_r = bench.make_step(model_r, opt_r, "fp32", wrap, x_all, y_all, channels_last)
    step_l = bench.make_step(model_l, opt_l, "fp32", wrap, nhwc=channels_last, loader=True)
    losses_r, losses_l = [], []
    for i in range(steps):
        rows = slice(i * batch, (i + 1) * batch)
        losses_r.append(float(step_r(frost.arange(rows.start, rows.stop, device=device)).item()))
        x = frost.tensor(images[rows], device=device)  # a loader's batch: uint8 NHWC
        losses_l.append(float(step_l(x, Tensor(y_all[rows])).item()))
    weights = [{k: v.numpy() for k, v in m.state_dict().items()} for m in (model_r, model_l)]
    return losses_r, losses_l, weights[0], weights[1]


def test_the_loader_step_trains_as_the_resident_step_on_the_cpu():
    losses_r, losses_l, w_r, w_l = _train_both("cpu", channels_last=False, use_jit=False, steps=3)
    assert losses_r == losses_l
    for k in w_r:
        np.testing.assert_array_equal(w_r[k], w_l[k], err_msg=k)


def test_the_loader_step_takes_uint8_nhwc_images():
    model, opt = bench.build(0, "cpu")
    step = bench.make_step(model, opt, "fp32", None, loader=True)
    images = np.full((2, 32, 32, 3), 255, np.uint8)
    seen = {}
    step_inner = bench.on_loader_batches(lambda x, y: seen.update(x=x.numpy()) or 0.0)
    step_inner(frost.tensor(images), frost.tensor(np.zeros(2, np.int64)))
    assert seen["x"].shape == (2, 3, 32, 32) and seen["x"].dtype == np.float32 and np.all(seen["x"] == 1.0)
    assert np.isfinite(float(step(frost.tensor(images), frost.tensor(np.array([1, 2]))).item()))


@pytest.mark.cuda
@pytest.mark.parametrize("channels_last", [True, False])
def test_the_loader_step_trains_as_the_resident_step_on_the_gpu(channels_last, monkeypatch):
    # plain float32: under TF32 the two models' convolutions, planned apart, parted by up to 5e-4 of the loss (H100)
    monkeypatch.setattr(frost.backends, "allow_tf32", False)
    w_0 = {k: v.numpy() for k, v in bench.build(0, "cpu")[0].state_dict().items()}
    losses_r, losses_l, w_r, w_l = _train_both("cuda", channels_last, use_jit=True)
    # the same kernels on the same numbers; only a plan timed apart (cuDNN's choice per capture) may sum otherwise
    np.testing.assert_allclose(losses_l, losses_r, rtol=1e-5)
    for k in w_r:
        # AdamW moves a weight by about lr a step whatever its gradient's size, so where a gradient is near zero or
        # its steps cancel, rounding changes the move (2.7e-5 in one weight of 36,864, 1 % of a batch norm gain's
        # travel, H100): compare each tensor's difference with the distance it travelled, which other batches would
        # make of the same order
        travelled = np.linalg.norm(w_r[k] - w_0[k])
        assert np.linalg.norm(w_l[k] - w_r[k]) <= 0.1 * travelled + 1e-7, k


def _parsed(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(list(argv))


def test_the_worker_type_follows_the_decode_and_refuses_processes_for_the_gpu_decode():
    for argv, device, want in (((), "cuda", "process"), (("--decode", "device"), "cuda", "thread"),
                               (("--worker-type", "thread"), "cuda", "thread"),
                               (("--decode", "device"), "cpu", "process")):   # on the CPU the workers decode
        args = _parsed("--pipeline", "loader", *argv)
        bench.resolve_worker_type(args, device)
        assert args.worker_type == want, (argv, device)
    args = _parsed("--pipeline", "loader", "--decode", "device", "--worker-type", "process")
    with pytest.raises(SystemExit, match="--decode device needs --worker-type thread"):
        bench.resolve_worker_type(args, "cuda")
    bench.resolve_worker_type(_parsed("--pipeline", "resident", "--decode", "device", "--worker-type", "process"),
                              "cuda")   # no loader: nothing to refuse
    assert 1 <= _parsed().workers <= bench.LOADER_WORKERS
