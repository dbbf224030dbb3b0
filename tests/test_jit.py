"""frost.jit: CPU pass-through, and on the GPU capture + replay equal to eager execution."""
import sys
import warnings

import numpy as np
import pytest

import frost
from frost.accel import conv_common
from frost.jit import HostSyncInCaptureError, register_pending_choices

JIT_MODULE = sys.modules["frost.jit"]   # frost.jit is the function; its module holds the registered sources


def test_jit_on_cpu_just_calls_the_function():
    calls = []

    @frost.jit
    def step(x):
        calls.append(1)
        return (x * 2).sum()

    for _ in range(4):
        assert step(frost.ones(3)).item() == 6.0
    assert len(calls) == 4


def test_a_step_called_without_a_tensor_runs_eagerly_and_says_so_once():
    """Its batch would come from a closure, which a replay could not see change: never captured, one warning."""
    x = frost.ones(3)

    @frost.jit
    def step_from_closure():
        return (x * 2).sum()

    with pytest.warns(UserWarning, match=r"step_from_closure\(\) was called without a tensor argument"):
        assert step_from_closure().item() == 6.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert step_from_closure().item() == 6.0


def test_pending_choices_are_the_union_of_the_registered_sources(monkeypatch):
    monkeypatch.setattr(JIT_MODULE, "_pending_sources", [])
    assert JIT_MODULE._pending() == frozenset()
    first, second = {"conv a"}, set()
    source = lambda: frozenset(first)   # noqa: E731
    assert register_pending_choices(source) is source
    register_pending_choices(lambda: frozenset(second))
    assert JIT_MODULE._pending() == {"conv a"}
    second.add(("wgrad", 3))
    first.clear()
    assert JIT_MODULE._pending() == {("wgrad", 3)}   # asked anew at each call
    with pytest.raises(TypeError, match="register_pending_choices: source must be callable, got set"):
        register_pending_choices(first)


def test_the_convolution_layer_registers_its_undecided_shapes(monkeypatch):
    assert conv_common.pending_choices in JIT_MODULE._pending_sources
    monkeypatch.setattr(conv_common, "_undecided", {("fprop", "shape")})
    assert ("fprop", "shape") in JIT_MODULE._pending()


def _seed_model_and_data(device, memory_format=None):
    from frost.models.resnet import cifar_resnet
    frost.manual_seed(0)
    model = cifar_resnet().to(device, memory_format=memory_format)
    rng = np.random.default_rng(0)
    xs = rng.random((60, 32, 3, 32, 32), dtype=np.float32)
    ys = rng.integers(0, 10, (60, 32))
    return model, xs, ys


def _optimizer_step(model, opt):
    """step(x, y): zero_grad, the model's cross-entropy, backward, opt.step(); returns the loss."""
    import frost.nn.functional as F

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _train(device, use_jit, steps, memory_format=None):
    model, xs, ys = _seed_model_and_data(device, memory_format)
    opt = frost.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
    step = _optimizer_step(model, opt)
    if use_jit:
        step = frost.jit(step)
    losses = []
    for i in range(steps):
        x = frost.tensor(xs[i], device=device)
        x = x if memory_format is None else x.contiguous(memory_format)
        y = frost.tensor(ys[i], device=device)
        losses.append(float(step(x, y).item()))
    return losses, {k: v.numpy() if device == "cpu" else v.cpu().numpy() for k, v in model.state_dict().items()}


@pytest.mark.cuda
@pytest.mark.parametrize("memory_format", [None, frost.channels_last])
def test_jit_replay_equals_eager_for_50_resnet_steps(exact_gpu_math, memory_format):
    eager_losses, eager_state = _train("cuda", False, 50, memory_format)
    jit_losses, jit_state = _train("cuda", True, 50, memory_format)
    np.testing.assert_allclose(jit_losses, eager_losses, rtol=1e-4, atol=1e-5)
    for k in eager_state:
        np.testing.assert_allclose(jit_state[k], eager_state[k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_channels_last_resnet_trains_like_nchw_on_the_cpu():
    nchw_losses, nchw_state = _train("cpu", False, 3)
    cl_losses, cl_state = _train("cpu", False, 3, frost.channels_last)
    np.testing.assert_allclose(cl_losses, nchw_losses, rtol=1e-5)
    for k in nchw_state:
        np.testing.assert_allclose(cl_state[k], nchw_state[k], rtol=1e-4, atol=1e-6, err_msg=k)


@pytest.mark.cuda
def test_jit_memory_stays_flat_over_2000_replays():
    import frost.nn as nn
    from frost.backend import cuda
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to("cuda")
    opt = frost.optim.AdamW(model.parameters(), lr=1e-3)
    step = frost.jit(_optimizer_step(model, opt))
    x = frost.randn(32, 64, device="cuda")
    y = frost.randint(0, 10, (32,), device="cuda")
    for _ in range(10):
        step(x, y)
    cuda.synchronize()
    before = cuda.memory_allocated()
    for _ in range(2000):
        step(x, y)
    cuda.synchronize()
    assert cuda.memory_allocated() <= before


@pytest.mark.cuda
def test_host_sync_during_capture_names_the_call():
    @frost.jit
    def step(x):
        y = (x * 2).sum()
        print(y.item())
        return y

    x = frost.ones(4, device="cuda")
    step(x)
    step(x)
    with pytest.raises(HostSyncInCaptureError, match=r"Tensor.item\(\)"):
        step(x)


@pytest.mark.cuda
def test_new_shape_captures_a_new_graph():
    @frost.jit
    def f(x):
        return x * 3 + 1

    for n in (4, 4, 4, 4, 7, 7, 7, 7):
        out = f(frost.ones(n, device="cuda"))
        np.testing.assert_allclose(out.cpu().numpy(), np.full(n, 4.0))
    assert len(f.captures) == 2


@pytest.mark.cuda
def test_replays_in_order_on_the_callers_stream():
    # the replay runs on the caller's stream, after the work the caller queued before the call and before the work
    # it queues after (a non-blocking stream, so that nothing else orders them), its output read there at once
    from frost.backend import cuda
    cp = cuda.cupy()
    step = frost.jit(lambda x: x * 2 + 1)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = frost.zeros(1 << 22, device="cuda")
        got = []
        for i in range(6):
            x.data.fill(i)
            got.append(step(x).data.copy())
        assert [float(g[-1]) for g in got] == [2.0 * i + 1 for i in range(6)]
        assert all(bool((g == g[0]).all()) for g in got)


@pytest.mark.cuda
def test_capture_copies_static_inputs_on_the_callers_stream(monkeypatch):
    # an uncaptured kernel on the graph stream slows every graph captured after it (docs/gpu.md): the graph stream
    # only captures and replays; the static copies of the inputs run on the caller's stream
    import sys

    from frost.backend import cuda
    from frost.tensor import Tensor
    cp = cuda.cupy()
    copied_on = []
    init = Tensor.__init__

    def recording_init(self, *args, **kwargs):
        if sys._getframe(1).f_code.co_name == "make_static":
            copied_on.append(cp.cuda.get_current_stream().ptr)
        init(self, *args, **kwargs)
    monkeypatch.setattr(Tensor, "__init__", recording_init)
    step = frost.jit(lambda x, y: (x * y).sum())
    x, y = frost.arange(8, device="cuda").float(), frost.ones(8, device="cuda")
    results = [step(x, y).item() for _ in range(4)]   # two eager calls, the capture, a replay
    assert results == [28.0] * 4
    assert copied_on == [cp.cuda.get_current_stream().ptr] * 2
    assert cuda.kept_stream("graph", priority="greatest").ptr not in copied_on


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_captured_weight_gradients_on_a_side_branch_equal_one_stream(monkeypatch, precision):
    """The seed ResNet's captured step (channels-last, TF32 or bf16 autocast, our kernels) computes its 22 weight
    gradients on a branch beside the input gradients: bit for bit what one stream computes."""
    import frost.nn.functional as F
    from frost import autograd
    branch_sizes = []
    real_join = autograd._join_gradient_branch

    def join():
        branch_sizes.append(len(autograd._state.branch["reads"]))
        real_join()
    monkeypatch.setattr(autograd, "_join_gradient_branch", join)
    deterministic, frost.backends.deterministic = frost.backends.deterministic, True
    try:
        runs = {}
        for switch in ("0", "1", "0"):  # the first settles the kernel choices (its first eager step may not use ours)
            monkeypatch.setenv("FROST_GRADIENT_BRANCH", switch)
            model, xs, ys = _seed_model_and_data("cuda", frost.channels_last)
            opt = frost.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)

            @frost.jit
            def step(x, y):
                opt.zero_grad()
                with frost.autocast(frost.bfloat16, enabled=precision == "bf16"):
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
                loss.backward()
                opt.step()
                return loss
            losses = [float(step(frost.tensor(xs[i], device="cuda").contiguous(frost.channels_last),
                                 frost.tensor(ys[i], device="cuda")).item()) for i in range(12)]
            runs[switch] = losses, {k: v.cpu().numpy() for k, v in model.state_dict().items()}
    finally:
        frost.backends.deterministic = deterministic
    # one branch in the capture: the 21 convolutions and the head (avg_pool_linear keeps its float32 weight and
    # sums in float32 under autocast too, so its weight gradient goes straight into the .grad buffer in both)
    assert branch_sizes == [22]
    assert runs["1"][0] == runs["0"][0]
    for k, v in runs["0"][1].items():
        np.testing.assert_array_equal(runs["1"][1][k], v, err_msg=k)


@pytest.mark.cuda
@pytest.mark.parametrize("memory_format", [None, frost.channels_last])
def test_captured_gradients_with_cudnn_on_both_streams_equal_eager_ones(memory_format):
    """A captured NCHW step runs cuDNN weight gradients on the side branch while cuDNN input gradients run on the
    capturing stream, with plans that use a workspace (default math, not deterministic): each stream needs its own
    (one shared workspace gave gradients off by 1e13 and an optimizer benchmark that did not learn)."""
    import frost.nn.functional as F
    model, xs, ys = _seed_model_and_data("cuda", memory_format)
    opt = frost.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0)  # the weights stay as they are
    x = frost.tensor(xs[0], device="cuda").contiguous(memory_format or frost.contiguous_format)
    y = frost.tensor(ys[0], device="cuda")
    step = frost.jit(_optimizer_step(model, opt))
    for _ in range(6):  # eager calls (kernel choices settle, the flat group packs), the capture, replays
        step(x, y)
    captured = {name: p.grad.cpu().numpy() for name, p in model.named_parameters()}
    reference, _, _ = _seed_model_and_data("cuda", memory_format)
    F.cross_entropy(reference(x), y).backward()  # fresh .grad arrays, one stream, the same kernel choices
    for name, p in reference.named_parameters():
        want = p.grad.cpu().numpy()
        np.testing.assert_allclose(captured[name], want, rtol=0, atol=1e-3 * float(np.abs(want).max()),
                                   err_msg=name)


def _stream_priority(stream) -> int:
    import ctypes
    from frost.backend.cuda import driver
    value = ctypes.c_int()
    assert driver().cuStreamGetPriority(ctypes.c_void_p(stream.ptr), ctypes.byref(value)) == 0
    return value.value


@pytest.mark.cuda
def test_captured_kernels_outrank_the_gradient_branch_and_keep_their_priority(monkeypatch):
    from frost.backend import cuda
    from frost.jit import _NodePriorityGraph
    for switch, kind in (("1", _NodePriorityGraph), ("0", cuda.cupy().cuda.graph.Graph)):
        monkeypatch.setenv("FROST_NODE_PRIORITY", switch)
        triple = frost.jit(lambda x: x * 3)
        outs = [triple(frost.full((8,), float(i), device="cuda")).cpu().numpy() for i in range(5)]
        (entry,) = triple.captures.values()
        assert type(entry.graph) is kind
        np.testing.assert_array_equal(outs, [np.full(8, 3.0 * i) for i in range(5)])
    # (asked after the captures: reading a stream's priority range needs the device's context, which they made)
    assert _stream_priority(cuda.kept_stream("graph", priority="greatest")) < 0
    assert _stream_priority(cuda.kept_stream("gradient branch")) == 0   # the lowest: CUDA's default


class _LooksLikeCuda(frost.Tensor):
    """A CPU tensor that says it lives on CUDA: enough for frost.jit to take its eager warm-up calls."""

    @property
    def device(self):
        return frost.backend.Device("cuda")


def test_warm_up_calls_say_so_to_the_acceleration_layer_and_nothing_else_does():
    """frost.jit.warming_up() is true inside a jitted step's eager warm-up calls only (the acceleration layer plans
    there what the capture will use: cuDNN's matmul rather than cuBLAS), also after a call that raised."""
    seen = []

    @frost.jit(warmup=2)
    def step(x, fail=False):
        seen.append(JIT_MODULE.warming_up())
        if fail:
            raise ValueError("a failing step")
        return x

    x = _LooksLikeCuda(np.ones(3, np.float32))
    assert not JIT_MODULE.warming_up()
    step(x)
    with pytest.raises(ValueError, match="a failing step"):
        step(x, fail=True)
    assert seen == [True, True] and not JIT_MODULE.warming_up()
