"""Gradients written straight into a zeroed .grad buffer (frost.autograd.grad_destination) equal the add path."""
import numpy as np
import pytest
import torch

import frost
import frost.nn as nn
import frost.nn.functional as F
from frost import autograd
from frost.autograd import forget_zero_grads, grad_destination, mark_grad_zero
from frost.optim.flat import FlatGroup
from frost.tensor import Tensor, from_op


def _leaf(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def _zeroed(t):
    t.grad = Tensor(np.zeros(t.shape, dtype=t.data.dtype))
    mark_grad_zero(t)
    return t


def _probe(x, w, seen, write=None):
    """x * sum(w): an op whose backward asks for w's destination (twice), records the answers and writes
    w's gradient into it when one is given (returning None for w instead when write == 'none')."""
    out = x.data * w.data.sum()

    def backward(g):
        dest = grad_destination(w)
        seen.append(dest)
        seen.append(grad_destination(w))  # a second ask in the same backward: already claimed
        gw = np.full(w.shape, (g * x.data).sum(), dtype=w.data.dtype)
        if dest is not None:
            dest[...] = gw
            gw = dest
        if write == "raise":
            raise RuntimeError("probe: failing after the claim")
        return g * w.data.sum(), (None if write == "none" else gw)

    return from_op(out, (x, w), backward, "probe")


# ------------------------------------------------------------ grad_destination's semantics


def test_destination_is_the_zeroed_grad_claimed_once_inside_backward_only():
    x, w = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2))
    assert grad_destination(w) is None  # outside backward()
    seen = []
    _probe(x, w, seen).sum().backward()
    assert seen[0] is w.grad.data and seen[1] is None
    expected = np.full((2, 2), x.data.sum())
    np.testing.assert_allclose(w.grad.numpy(), expected)
    # the mark is used up: the next backward asks in vain and adds
    seen = []
    _probe(x, w, seen).sum().backward()
    assert seen[0] is None and seen[1] is None
    np.testing.assert_allclose(w.grad.numpy(), 2 * expected)


@pytest.mark.parametrize("case", ["non-leaf", "no grad", "unmarked", "wrong dtype", "non-contiguous",
                                  "wrong shape", "grad replaced", "requires_grad off", "voided", "written +=",
                                  "written copy_", "written item"])
def test_no_destination_when_the_buffer_cannot_be_trusted(case):
    x, w = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2))
    target = w
    if case == "non-leaf":
        target = w * 1.0
        target.grad = Tensor(np.zeros((2, 2)))
        mark_grad_zero(target)
    elif case == "no grad":
        w.grad = None
        mark_grad_zero(w)
    elif case == "unmarked":
        w._zero_grad_mark = None
    elif case == "wrong dtype":
        w.grad = Tensor(np.zeros((2, 2), dtype=np.float32))
        mark_grad_zero(w)
    elif case == "non-contiguous":
        w.grad = Tensor(np.zeros((2, 2)).T)
        mark_grad_zero(w)
    elif case == "wrong shape":
        w.grad = Tensor(np.zeros((1, 2, 2)))
        mark_grad_zero(w)
    elif case == "grad replaced":
        w.grad = Tensor(np.zeros((2, 2)))
    elif case == "requires_grad off":
        w.requires_grad = False
    elif case == "voided":
        forget_zero_grads()
    elif case == "written +=":  # the zeros are gone: backward() must add to what was written
        w.grad += 1.0
    elif case == "written copy_":
        w.grad.copy_(np.ones((2, 2)))
    elif case == "written item":
        w.grad[0, 0] = 1.0
    seen = []
    _probe(x, target, seen).sum().backward()
    assert seen[0] is None and seen[1] is None


def test_any_backward_ends_the_marks():
    x, w = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2))
    (x * 2).sum().backward()  # a backward that never touches w
    seen = []
    _probe(x, w, seen).sum().backward()
    assert seen[0] is None and seen[1] is None


def test_claimed_buffer_is_zeroed_again_when_backward_fails_or_drops_it():
    x, w = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2))
    with pytest.raises(RuntimeError, match="probe: failing after the claim"):
        _probe(x, w, [], write="raise").sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((2, 2)))
    _zeroed(w)
    seen = []
    _probe(x, w, seen, write="none").sum().backward()
    assert seen[0] is not None
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((2, 2)))


def test_anomaly_mode_sees_gradients_written_in_place():
    x, w = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2))
    x.data[0] = np.nan  # w's gradient, sum(g * x), is NaN while the incoming gradient is finite
    out = _probe(x, w, []).sum()
    with frost.autograd.detect_anomaly(), pytest.raises(frost.autograd.AnomalyError, match="backward of 'probe'"):
        out.backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((2, 2)))  # nothing accumulated, as before


# ------------------------------------------------------------ against PyTorch (float64)


class _Spy:
    """Records, per leaf, how _accumulate got its gradient: 'claimed' (written in place, nothing added),
    'assigned' (a claimed buffer replaced by a sum), 'added' (the += path) or 'new' (no .grad yet)."""

    def __init__(self, monkeypatch):
        self.how = {}
        original = autograd._accumulate

        def spy(Tensor, t, g, claimed=None, owned=False):
            if claimed is not None:
                self.how[id(t)] = "claimed" if g is claimed else "assigned"
            else:
                self.how[id(t)] = "new" if t.grad is None else "added"
            return original(Tensor, t, g, claimed, owned)
        monkeypatch.setattr(autograd, "_accumulate", spy)

    def of(self, t):
        return self.how.get(id(t))


def _conv_twice_frost(x_np, w_np, b_np, fc_np):
    x, w, b = Tensor(x_np), Tensor(w_np, requires_grad=True), Tensor(b_np, requires_grad=True)
    fc = Tensor(fc_np, requires_grad=True)
    return x, (w, b, fc)


def _loss_frost(x, w, b, fc):
    h = F.conv2d(F.conv2d(x, w, b, padding=1).relu(), w, b, padding=1)  # the same weight and bias twice
    flat = h.reshape(h.shape[0], -1)
    z = F.linear(flat, fc)
    return (z @ fc).sum() + (flat @ fc.T).square().mean()  # fc used three times, in linear and matmuls


def _loss_torch(x, w, b, fc):
    h = torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, w, b, padding=1).relu(), w, b, padding=1)
    flat = h.reshape(h.shape[0], -1)
    z = torch.nn.functional.linear(flat, fc)
    return (z @ fc).sum() + (flat @ fc.T).square().mean()


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, 3, 5, 5)), 0.3 * rng.standard_normal((3, 3, 3, 3)),
            rng.standard_normal(3), 0.1 * rng.standard_normal((75, 75)))


def _torch_grads(arrays, times=1):
    x, *params = [torch.tensor(a, requires_grad=i > 0) for i, a in enumerate(arrays)]
    for _ in range(times):
        _loss_torch(x, *params).backward()
    return [p.grad.numpy() for p in params]


def test_parameters_used_twice_equal_pytorch_and_take_the_assign_path(monkeypatch):
    arrays = _inputs()
    x, params = _conv_twice_frost(*arrays)
    opt = frost.optim.SGD(params, lr=0.1)
    for p in params:
        p.grad = Tensor(np.full(p.shape, 7.0))  # stale values that zero_grad must clear
    opt.zero_grad(set_to_none=False)
    spy = _Spy(monkeypatch)
    _loss_frost(x, *params).backward()
    for p, expected in zip(params, _torch_grads(arrays)):
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert [spy.of(p) for p in params] == ["assigned", "assigned", "assigned"]


def test_single_use_parameters_are_written_in_place(monkeypatch):
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((2, 3, 6, 6)))
    conv = nn.Conv2d(3, 4, 3, padding=1).to(frost.float64)
    fc = nn.Linear(4 * 36, 5).to(frost.float64)
    m = nn.Linear(5, 5, bias=False).to(frost.float64)
    params = list(conv.parameters()) + list(fc.parameters()) + list(m.parameters())
    opt = frost.optim.SGD(params, lr=0.1)

    def loss():
        z = fc(conv(x).relu().reshape(2, -1))
        return (z @ m.weight).square().sum()  # a plain matmul with a leaf operand too

    loss().backward()
    first = [p.grad.numpy().copy() for p in params]
    opt.zero_grad(set_to_none=False)
    spy = _Spy(monkeypatch)
    loss().backward()
    assert [spy.of(p) for p in params] == ["claimed"] * len(params)
    for p, expected in zip(params, first):
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-12, atol=1e-14)

    tx = torch.tensor(x.numpy())
    tp = [torch.tensor(p.detach().numpy(), requires_grad=True) for p in params]
    tz = torch.nn.functional.linear(torch.nn.functional.conv2d(tx, tp[0], tp[1], padding=1).relu().reshape(2, -1),
                                    tp[2], tp[3])
    (tz @ tp[4]).square().sum().backward()
    for p, t in zip(params, tp):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_two_backwards_without_zero_grad_accumulate_like_pytorch(monkeypatch):
    arrays = _inputs(1)
    x, params = _conv_twice_frost(*arrays)
    opt = frost.optim.SGD(params, lr=0.1)
    _loss_frost(x, *params).backward()
    opt.zero_grad(set_to_none=False)
    spy = _Spy(monkeypatch)
    _loss_frost(x, *params).backward()
    _loss_frost(x, *params).backward()
    assert [spy.of(p) for p in params] == ["added"] * 3  # the second backward adds to the first
    for p, expected in zip(params, _torch_grads(arrays, times=2)):
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_seed_resnet_gradients_equal_the_add_path(monkeypatch):
    from frost.models.resnet import cifar_resnet
    frost.manual_seed(0)
    model = cifar_resnet()
    rng = np.random.default_rng(0)
    x = frost.tensor(rng.random((4, 3, 32, 32), dtype=np.float32))
    y = frost.tensor(rng.integers(0, 10, 4))
    opt = frost.optim.AdamW(model.parameters(), lr=1e-3)

    def grads(set_to_none):
        opt.zero_grad(set_to_none=set_to_none)
        F.cross_entropy(model(x), y).backward()
        return {name: p.grad.numpy().copy() for name, p in model.named_parameters()}

    first = grads(True)  # no .grad yet: every gradient is a fresh copy (the old path)
    spy = _Spy(monkeypatch)
    second = grads(False)  # zero-filled and marked: written in place where the op can
    for name in first:
        np.testing.assert_allclose(second[name], first[name], rtol=1e-6, atol=1e-7, err_msg=name)
    how = {name: spy.of(p) for name, p in model.named_parameters()}
    # conv and linear weights (and the linear bias) are written in place; the CPU batch norm adds
    assert all(how[name] == "claimed" for name, p in model.named_parameters() if p.ndim in (2, 4)), how
    assert set(how.values()) == {"claimed", "added"}, how
    third = grads(True)
    for name in first:
        np.testing.assert_allclose(third[name], first[name], rtol=1e-6, atol=1e-7, err_msg=name)


# ------------------------------------------------------------ flat groups


def test_flat_group_aligns_parameters_and_marks_them_on_zero_grad():
    params = [Tensor(np.arange(n, dtype=np.float32).reshape(shape), requires_grad=True)
              for n, shape in ((6, (2, 3)), (70, (70,)), (1, (1,)))]
    for p in params:
        p.grad = Tensor(np.ones(p.shape, dtype=np.float32))
    state = {}
    flat = FlatGroup(params, state, ("exp_avg",), 2)
    assert flat.numel == 64 + 128 + 64
    for p in params:
        offset = (p.data.__array_interface__["data"][0] - flat.params.__array_interface__["data"][0]) // 4
        assert offset % FlatGroup.ALIGN == 0
        np.testing.assert_array_equal(p.detach().numpy().reshape(-1), np.arange(p.numel(), dtype=np.float32))
    assert np.count_nonzero(flat.params) == 6 - 1 + 70 - 1  # the gaps hold zeros
    flat.zero_grad()
    assert not flat.grads.any()
    seen = []
    _probe(Tensor(np.ones(3, dtype=np.float32)), params[0], seen).sum().backward()
    assert seen[0] is params[0].grad.data
    assert np.shares_memory(seen[0], flat.grads)


# ------------------------------------------------------------ GPU (the lead runs these)


def _small_cnn(device, head: str = "linear"):
    """A conv/BN/ReLU stack with a Linear head, or (head="conv") an 8x8 convolution as the head: no matmul, so
    every GPU op is exact with TF32 off (cuDNN's float32 matmul is not: tests/ops/test_matmul.py)."""
    frost.manual_seed(0)
    top = [nn.Flatten(), nn.Linear(5 * 64, 10)] if head == "linear" else [nn.Conv2d(5, 10, 8), nn.Flatten()]
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 5, 3, padding=1, bias=False), nn.BatchNorm2d(5), nn.ReLU(), *top)
    return model.to(device)


@pytest.mark.cuda
# the Linear head needs the exact float32 matmul kernel (cuDNN's float32 matmul rounds like TF32)
@pytest.mark.parametrize("head", ["linear", "conv"])
def test_gpu_flat_adamw_gradients_are_written_in_place_and_equal_the_cpu(monkeypatch, exact_gpu_math, head):
    rng = np.random.default_rng(0)
    xs = rng.random((3, 4, 3, 8, 8), dtype=np.float32)
    ys = rng.integers(0, 10, (3, 4))
    cpu, gpu = _small_cnn("cpu", head), _small_cnn("cuda", head)
    opt_cpu = frost.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_gpu = frost.optim.AdamW(gpu.parameters(), lr=1e-2)
    spy = _Spy(monkeypatch)
    for i in range(3):
        # both runs start each step from the same weights: AdamW's m / sqrt(v) turns a 1e-7 float32 gradient
        # difference in a near-zero coordinate into a weight change of up to lr (seen on the H200), so weights
        # left to drift apart would not test the gradients
        for p, q in zip(cpu.parameters(), gpu.parameters()):
            q.data[...] = q.xp.asarray(p.detach().numpy())
        for model, opt, dev in ((cpu, opt_cpu, "cpu"), (gpu, opt_gpu, "cuda")):
            opt.zero_grad()
            F.cross_entropy(model(frost.tensor(xs[i], device=dev)), frost.tensor(ys[i], device=dev)).backward()
            if dev == "cuda" and i > 0:  # the flat group exists from the first step() on
                assert opt._flat
                how = [spy.of(p) for p in model.parameters()]
                assert how == ["claimed"] * len(how), how
        for (name, p), q in zip(cpu.named_parameters(), gpu.parameters()):
            np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
        opt_cpu.step()
        opt_gpu.step()


@pytest.mark.cuda
def test_gpu_jit_with_zero_grad_outside_the_step_still_accumulates(exact_gpu_math):
    """A zero_grad() before the capture must not let the graph overwrite .grad on every replay."""
    rng = np.random.default_rng(1)
    xs = rng.random((8, 4, 3, 8, 8), dtype=np.float32)
    ys = rng.integers(0, 10, (8, 4))
    results = []
    for use_jit in (False, True):
        model = _small_cnn("cuda")
        # the first convolution's bias feeds BatchNorm, which subtracts it again: its gradient is rounding noise,
        # which Adam's normalization turns into lr-sized steps that differ with any summation order (eager products
        # run on cuBLAS, captured ones on other kernels); frozen, every compared weight has a real gradient
        model[0].bias.requires_grad_(False)
        opt = frost.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

        def accumulate(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        fn = frost.jit(accumulate) if use_jit else accumulate
        for i in range(0, 8, 2):  # two micro-batches per optimizer step
            opt.zero_grad()
            fn(frost.tensor(xs[i], device="cuda"), frost.tensor(ys[i], device="cuda"))
            fn(frost.tensor(xs[i + 1], device="cuda"), frost.tensor(ys[i + 1], device="cuda"))
            opt.step()
        results.append([p.detach().cpu().numpy() for p in model.parameters()])
    for eager, jitted in zip(*results):
        np.testing.assert_allclose(jitted, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_gpu_flat_views_are_aligned():
    model = _small_cnn("cuda")
    opt = frost.optim.AdamW(model.parameters(), lr=1e-2)
    F.cross_entropy(model(frost.randn(2, 3, 8, 8, device="cuda")), frost.tensor([1, 2], device="cuda")).backward()
    opt.step()
    (flat,) = opt._flat.values()
    for p in model.parameters():
        assert p.data.data.ptr % 256 == 0 and p.grad.data.data.ptr % 256 == 0
    assert flat.numel == sum(-(-p.numel() // 64) * 64 for p in model.parameters())


def test_cast_of_a_leaf_writes_the_gradient_into_its_buffer(monkeypatch):
    """autocast casts float32 weights to bfloat16 on every call; the cast's backward converts the gradient back
    straight into the weight's zeroed .grad (here float32 -> float64 stands in for the cast)."""
    w = _leaf((3, 4), np.float32, seed=5)
    x = np.random.default_rng(6).standard_normal((2, 3))
    opt = frost.optim.SGD([w], lr=0.1)

    def loss():
        return (Tensor(x) @ w.to(frost.float64)).square().sum()

    loss().backward()
    first = w.grad.numpy().copy()
    opt.zero_grad(set_to_none=False)
    spy = _Spy(monkeypatch)
    loss().backward()
    assert spy.of(w) == "claimed" and w.grad.dtype == frost.float32
    np.testing.assert_array_equal(w.grad.numpy(), first)
    tw = torch.tensor(w.detach().numpy().astype(np.float64), requires_grad=True)
    (torch.tensor(x) @ tw).square().sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)


# ------------------------------------------------------------ gradients completed by a later launch


def _deferring_probe(x, w, log, claim=None):
    """x * sum(w) whose backward claims w's .grad, writes nothing yet and leaves the write to a deferred completion
    (as the convolution weight gradient's finalize rides with the next launch). `claim`: the leaf whose .grad is
    claimed instead, returned as w's gradient (autocast's product into the master's .grad, w standing for the
    cast that passes it on)."""
    out = x.data * w.data.sum()

    def backward(g):
        dest = grad_destination(w if claim is None else claim)
        value = (g * x.data).sum()

        def complete():
            log.append("completed")
            dest[...] = value
        log.append("deferred")
        autograd.defer_gradient_completion(complete)
        return g * w.data.sum(), dest

    return from_op(out, (x, w), backward, "deferring probe")


def test_a_deferred_gradient_is_complete_when_backward_returns():
    x, w, log = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2)), []
    _deferring_probe(x, w, log).sum().backward()
    assert log == ["deferred", "completed"]
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 2), x.data.sum()))


def test_a_deferred_gradient_is_completed_before_a_second_contribution_is_added():
    x, w, log = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2)), []
    (_deferring_probe(x, w, log).sum() + (w * 3.0).sum()).backward()   # w used twice: the sum reads the first
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 2), x.data.sum() + 3.0))
    assert log == ["deferred", "completed"]


def test_a_claimed_buffer_passed_on_is_completed_before_a_second_contribution_to_its_carrier_is_added():
    x, w, log = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2)), []
    v = w * 1.0
    (_deferring_probe(x, v, log, claim=w).sum() + (v * 3.0).sum()).backward()   # v used twice: the sum reads the buffer
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 2), x.data.sum() + 3.0))
    assert log == ["deferred", "completed"]


def test_anomaly_mode_sees_a_deferred_gradient_completed():
    x, w, log = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2)), []
    x.data[0] = np.nan
    with autograd.detect_anomaly(), pytest.raises(autograd.AnomalyError, match="deferring probe"):
        _deferring_probe(x, w, log).sum().backward()
    assert log == ["deferred", "completed"]
    np.testing.assert_array_equal(w.grad.numpy(), 0)   # claimed, not accumulated: handed back as the zeros it was


def test_a_failing_backward_completes_and_then_zeroes_what_it_claimed():
    x, w, log = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2)), []

    def fail(g):
        raise RuntimeError("an earlier op's backward fails")
    upstream = from_op(x.data.copy(), (x,), fail, "failing")   # its backward runs after the probe's
    with pytest.raises(RuntimeError, match="an earlier op's backward fails"):
        _deferring_probe(upstream, w, log).sum().backward()
    assert log == ["deferred", "completed"] and not autograd._deferred()
    np.testing.assert_array_equal(w.grad.numpy(), 0)


# ------------------------------------------------------------ gradients on a branch of a captured step


class _FakeStream:
    """Logs what frost.autograd.gradient_branch asks of a CUDA stream (fork, work on it, join)."""

    def __init__(self, name, log):
        self.name, self.log, self.ptr = name, log, 1

    def record(self):
        self.log.append(f"{self.name} records")
        return self.name

    def wait_event(self, event):
        self.log.append(f"{self.name} waits for {event}")

    def __enter__(self):
        self.log.append(f"on {self.name}")
        return self

    def __exit__(self, *exc):
        self.log.append(f"off {self.name}")


def _branching_probe(x, w, log):
    """x * sum(w) whose backward writes w's claimed .grad inside gradient_branch and defers its last step."""
    out = x.data * w.data.sum()

    def backward(g):
        dest = grad_destination(w)
        with autograd.gradient_branch(g, x.data, when=dest is not None):
            value = (g * x.data).sum()
            if dest is None:
                return g * w.data.sum(), np.full(w.shape, value)

            def complete():
                log.append("completed")
                dest[...] = value
            log.append("deferred")
            autograd.defer_gradient_completion(complete)
        log.append("input gradient")
        return g * w.data.sum(), dest

    return from_op(out, (x, w), backward, "branching probe")


@pytest.fixture
def fake_capture(monkeypatch):
    """A capturing origin stream and the side stream, both fakes that log into the returned list."""
    from frost.backend import cuda
    log = []
    origin, side = _FakeStream("origin", log), _FakeStream("side", log)
    monkeypatch.setattr(autograd, "_capturing_stream", lambda arrays: origin)
    monkeypatch.setattr(cuda, "kept_stream", lambda purpose: side)
    return log


def _fork(log):
    return ["origin records", "side waits for origin", "on side", "deferred", "off side", "input gradient"]


def _two_branches(log):
    x, w1, w2 = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2)), _zeroed(_leaf((2, 2), seed=3))
    _branching_probe(_branching_probe(x, w1, log), w2, log).sum().backward()
    return w1.grad.numpy(), w2.grad.numpy()


def test_a_branch_forks_per_op_joins_once_before_the_completions_and_keeps_its_reads(fake_capture, monkeypatch):
    import weakref
    log, reads, alive_at_join = fake_capture, [], []
    real_branch, real_join = autograd.gradient_branch, autograd._join_gradient_branch

    def branch(*arrays, when=True):
        reads.append([weakref.ref(a) for a in arrays])
        return real_branch(*arrays, when=when)

    def join():
        alive_at_join.append([ref() is not None for refs in reads for ref in refs])
        real_join()
    monkeypatch.setattr(autograd, "gradient_branch", branch)
    monkeypatch.setattr(autograd, "_join_gradient_branch", join)
    grads = _two_branches(log)
    assert log == _fork(log) * 2 + ["side records", "origin waits for side", "completed", "completed"]
    assert alive_at_join == [[True] * 4]   # g and x of both ops, though backward dropped them as it went
    assert getattr(autograd._state, "branch", None) is None and not autograd._deferred()
    monkeypatch.setenv("FROST_GRADIENT_BRANCH", "0")
    for branched, plain in zip(grads, _two_branches([])):
        np.testing.assert_array_equal(branched, plain)


def test_a_leafs_second_contribution_joins_the_branch_before_completing_and_adding(fake_capture):
    log = fake_capture
    x, w = _leaf((3,), seed=1), _zeroed(_leaf((2, 2), seed=2))
    (_branching_probe(x, w, log).sum() + (w * 3.0).sum()).backward()
    assert log == _fork(log) + ["side records", "origin waits for side", "completed"]
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 2), x.data.sum() + 3.0))


@pytest.mark.parametrize("how", ["not capturing", "not claimed", "switched off"])
def test_no_branch_outside_a_capture_for_unclaimed_gradients_or_when_switched_off(fake_capture, monkeypatch, how):
    log = fake_capture
    x, w = _leaf((3,), seed=1), _leaf((2, 2), seed=2)
    if how == "not capturing":
        monkeypatch.setattr(autograd, "_capturing_stream", lambda arrays: None)
    if how == "switched off":
        monkeypatch.setenv("FROST_GRADIENT_BRANCH", "0")
    if how != "not claimed":
        w = _zeroed(w)
    _branching_probe(x, w, log).sum().backward()
    assert [line for line in log if "side" in line or "origin" in line] == []


def test_no_capture_is_seen_for_numpy_arrays():
    assert autograd._capturing_stream((np.zeros(3), np.ones(2))) is None
