"""The PyTorch idioms frost answers: compile, optimizer flags, pin_memory, format, backends switches, frost.cuda on a
machine without CUDA, frost.device, inference_mode, the default dtype, numel and gradient hooks (against PyTorch)."""
import numpy as np
import pytest

import frost
from frost.backend import cuda as cuda_backend

torch = pytest.importorskip("torch")

_NO_CUDA = not cuda_backend.is_available()


# ---------------------------------------------------------------- compile


def _step(x):
    return (x * 2).sum()


def test_compile_returns_the_function_or_module_where_it_cannot_capture():
    model = frost.nn.Linear(2, 3)
    assert frost.compile(model) is model
    assert frost.compile(_step, disable=True) is _step
    if _NO_CUDA:
        assert frost.compile(_step, mode="max-autotune", fullgraph=True, dynamic=False) is _step


def test_compile_as_a_decorator():
    @frost.compile
    def plain(x):
        return x + 1

    @frost.compile(mode="reduce-overhead")
    def with_options(x):
        return x * 3

    assert plain(frost.tensor(1.0)).item() == 2.0
    assert with_options(frost.tensor(2.0)).item() == 6.0


def test_compile_refuses_what_is_not_callable():
    with pytest.raises(TypeError, match="frost.compile: expected a function or a Module, got int"):
        frost.compile(3)


@pytest.mark.cuda
def test_compile_captures_a_step_on_the_gpu():
    compiled = frost.compile(_step)
    assert isinstance(compiled, frost.jit(_step).__class__)
    x = frost.randn(8, device="cuda")
    results = [compiled(x).item() for _ in range(4)]  # eager, eager, capture, replay
    assert results == pytest.approx([_step(x).item()] * 4, rel=1e-6)


# ---------------------------------------------------------------- optimizer flags


def test_optimizers_accept_and_ignore_torch_speed_flags():
    def run(**flags):
        w = frost.tensor([1.0, -2.0, 3.0], requires_grad=True)
        optimizer = frost.optim.AdamW([w], lr=0.1, **flags)
        for _ in range(3):
            optimizer.zero_grad()
            (w * w).sum().backward()
            optimizer.step()
        return w.detach().numpy()

    plain = run()
    np.testing.assert_array_equal(run(fused=True, foreach=False, capturable=True, differentiable=False), plain)
    np.testing.assert_array_equal(run(foreach=True, maximize=False), plain)


def test_optimizer_flags_it_cannot_honour_are_refused():
    w = frost.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="SGD: differentiable=True is not supported"):
        frost.optim.SGD([w], lr=0.1, differentiable=True)
    with pytest.raises(ValueError, match="Lion: maximize=True is not supported by this optimizer"):
        frost.optim.Lion([w], maximize=True)
    frost.optim.Lion([w], maximize=False, fused=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'fuzed'"):
        frost.optim.SGD([w], lr=0.1, fuzed=True)


# ---------------------------------------------------------------- tensors: pin_memory, format, numel


def test_pin_memory_returns_the_cpu_tensor_itself():
    t = frost.ones(3)
    assert t.pin_memory() is t and not t.is_pinned()


def test_format_of_a_0d_tensor_is_its_number_as_in_torch():
    for value, spec in [(3.14159, ".4f"), (2.5, ""), (1234.5, ",.1f"), (-0.000123, ".2e")]:
        assert format(frost.tensor(value, dtype=frost.float64), spec) == format(torch.tensor(value,
                                                                                         dtype=torch.float64), spec)
    assert f"{frost.tensor(7):>5d}" == f"{torch.tensor(7):>5d}"
    assert format(frost.tensor([1.0, 2.0]), "") == str(frost.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="unsupported format string passed to Tensor.__format__"):
        format(frost.tensor([1.0, 2.0]), ".2f")


def test_numel():
    assert frost.numel(frost.zeros(2, 3, 4)) == torch.numel(torch.zeros(2, 3, 4)) == 24
    assert frost.numel(frost.tensor(1.0)) == 1
    with pytest.raises(TypeError, match="frost.numel: expected a Tensor, got list"):
        frost.numel([1, 2])


# ---------------------------------------------------------------- backends and frost.cuda


@pytest.fixture
def tf32_restored():
    before = frost.backends.allow_tf32, frost.backends.deterministic
    yield
    frost.backends.allow_tf32, frost.backends.deterministic = before


def test_tf32_switches_are_one_switch(tf32_restored):
    frost.backends.cuda.matmul.allow_tf32 = False
    assert frost.backends.allow_tf32 is False and frost.backends.cudnn.allow_tf32 is False
    assert frost.get_float32_matmul_precision() == "highest"
    frost.backends.cudnn.allow_tf32 = True
    assert frost.backends.cuda.matmul.allow_tf32 is True and frost.get_float32_matmul_precision() == "high"
    frost.set_float32_matmul_precision("highest")
    assert frost.backends.allow_tf32 is False
    frost.set_float32_matmul_precision("medium")
    assert frost.backends.allow_tf32 is True
    frost.backends.cudnn.deterministic = True
    assert frost.backends.deterministic is True
    with pytest.raises(ValueError, match="set_float32_matmul_precision: precision must be one of"):
        frost.set_float32_matmul_precision("low")


@pytest.mark.skipif(not _NO_CUDA, reason="answers of a machine without CUDA")
def test_cuda_queries_answer_as_torch_does_without_cuda():
    assert frost.cuda.is_available() is False
    assert frost.cuda.device_count() == 0
    assert frost.cuda.is_bf16_supported() is False
    assert frost.cuda.memory_allocated() == 0 and frost.cuda.max_memory_allocated() == 0
    frost.cuda.reset_peak_memory_stats()
    frost.cuda.synchronize()
    frost.cuda.empty_cache()
    assert frost.backends.cudnn.is_available() in (True, False)


@pytest.mark.cuda
def test_cuda_memory_statistics_on_the_gpu():
    frost.cuda.reset_peak_memory_stats()
    before = frost.cuda.memory_allocated()
    x = frost.zeros(1 << 20, device="cuda")
    frost.cuda.synchronize("cuda:0")
    assert frost.cuda.memory_allocated() - before >= 4 << 20
    assert frost.cuda.max_memory_allocated() >= frost.cuda.memory_allocated()
    assert frost.cuda.device_count() >= 1
    del x


def test_device_takes_torch_forms():
    assert frost.device("cuda:0") == frost.device("cuda", 0) == frost.Device("cuda:0") == "cuda:0"
    assert str(frost.device("cuda", 1)) == str(torch.device("cuda", 1))
    assert frost.device("cpu") == "cpu"
    with pytest.raises(ValueError, match="only 'cuda' takes an index"):
        frost.device("cpu", 0)
    with pytest.raises(ValueError, match="index must be an integer >= 0, got -1"):
        frost.device("cuda", -1)


# ---------------------------------------------------------------- inference_mode and the default dtype


def test_inference_mode_as_context_and_decorators():
    x = frost.ones(2, requires_grad=True)
    with frost.inference_mode():
        assert not frost.is_grad_enabled()
        assert not (x * 2).requires_grad
    assert frost.is_grad_enabled()

    @frost.inference_mode
    def bare():
        return frost.is_grad_enabled()

    @frost.inference_mode()
    def called():
        return frost.is_grad_enabled()

    assert bare() is False and called() is False and frost.is_grad_enabled()
    with frost.no_grad(), frost.inference_mode(False):
        assert not frost.is_grad_enabled()  # inference_mode(False) changes nothing
    with frost.inference_mode(mode=False):
        assert frost.is_grad_enabled()


@pytest.fixture
def default_dtype_restored():
    before = frost.get_default_dtype()
    yield
    frost.set_default_dtype(before)


def test_default_dtype_reaches_constructors_and_python_floats(default_dtype_restored):
    assert frost.get_default_dtype() == frost.float32
    frost.set_default_dtype(frost.float64)
    assert frost.get_default_dtype() == frost.float64
    assert frost.tensor([1.0, 2.0]).dtype == frost.float64
    assert frost.ones(2).dtype == frost.zeros(1).dtype == frost.randn(3).dtype == frost.float64
    assert frost.tensor([1, 2]).dtype == frost.int64
    assert (frost.tensor([1, 2]) / 2).dtype == frost.float64  # int / int promotes to the default
    assert repr(frost.tensor([1.5])) == "tensor([1.5000])"  # the default dtype is not printed
    with pytest.raises(TypeError, match="set_default_dtype: only floating-point dtypes can be the default"):
        frost.set_default_dtype(frost.int32)


# ---------------------------------------------------------------- gradient hooks, against PyTorch


def _hooked_grads(lib, x_values, hook_on: str, hook):
    x = lib.tensor(x_values, dtype=lib.float64, requires_grad=True)
    y = x * x
    z = y.sin()
    (x if hook_on == "leaf" else y).register_hook(hook)
    (z.sum() + (y * 3).sum()).backward()  # y reaches the loss along two paths: the hook sees their sum
    return x.grad


@pytest.mark.parametrize("hook_on", ["leaf", "intermediate"])
def test_a_hook_replacing_the_gradient_matches_torch(hook_on):
    values = np.array([[0.5, -1.0, 2.0], [0.1, 0.2, -0.3]])[:, ::2]  # a strided (non-contiguous) leaf
    seen = {}

    def record(lib):
        def hook(g):
            seen[lib.__name__] = np.array(g.tolist())
            return g * 2 + 1
        return hook

    ours = _hooked_grads(frost, values.copy(), hook_on, record(frost))
    theirs = _hooked_grads(torch, values.copy(), hook_on, record(torch))
    np.testing.assert_allclose(seen["frost"], seen["torch"], rtol=1e-12)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)


def test_hooks_run_in_order_none_keeps_the_gradient_and_remove_works():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    calls = []
    first = x.register_hook(lambda g: calls.append("first"))
    x.register_hook(lambda g: g * 10)
    x.register_hook(lambda g: calls.append(g.tolist()))
    (x * 3).sum().backward()
    assert calls == ["first", [30.0, 30.0]] and x.grad.tolist() == [30.0, 30.0]
    first.remove()
    first.remove()
    x.grad = None
    calls.clear()
    (x * 3).sum().backward()
    assert calls == [[30.0, 30.0]]


def test_a_0d_hook_and_a_hook_after_zero_grad_match_torch():
    def run(lib):
        w = lib.tensor([1.0, 2.0, 3.0], dtype=lib.float64, requires_grad=True)
        optimizer = (frost if lib is frost else torch).optim.SGD([w], lr=0.5)
        w.register_hook(lambda g: g.clamp(-1.0, 1.0))
        for _ in range(2):
            optimizer.zero_grad(set_to_none=False)
            loss = (w * w * w).sum()
            loss.register_hook(lambda g: g * 0.5)
            loss.backward()
            optimizer.step()
        return w.detach().numpy()

    np.testing.assert_allclose(run(frost), run(torch), rtol=1e-12)


def test_bad_hooks_are_named():
    with pytest.raises(RuntimeError, match=r"register_hook: cannot register a hook on a tensor \(shape \(2,\)\) "
                                           r"that does not require grad"):
        frost.ones(2).register_hook(lambda g: g)
    x = frost.ones(2, requires_grad=True)
    with pytest.raises(TypeError, match="register_hook: the hook must be callable, got int"):
        x.register_hook(3)
    x.register_hook(lambda g: frost.ones(3))
    with pytest.raises(RuntimeError, match=r"a hook on a tensor of shape \(2,\) returned a gradient of shape \(3,\)"):
        (x * 2).sum().backward()
