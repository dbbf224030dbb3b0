"""frost.dispatch: fast paths register for (op, device, dtypes, layouts, predicate) and the ops find them; with the
table emptied the core alone gives PyTorch's answers (the acceleration layer only makes it faster)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import frost
from frost import dispatch
from frost.accel import batch_norm as accel_bn
from frost.accel import conv as accel_conv
from frost.accel import cross_entropy as accel_xent
from frost.accel import head as accel_head
from frost.backend import cudnn
from frost.layout import as_channels_last
from frost.ops import conv as conv_ops
from frost.ops.head import avg_pool_linear
from frost.ops.loss import cross_entropy
from frost.ops.norm import batch_norm_act

BF16 = frost.bfloat16.np


@pytest.fixture
def table(monkeypatch):
    """An empty dispatch table for the test (the real one comes back afterwards)."""
    monkeypatch.setattr(dispatch, "_table", {})
    return dispatch._table


def as_if_on_the_gpu(monkeypatch, with_cudnn: bool = False) -> None:
    """dispatch takes NumPy arrays for CuPy ones: the CUDA registrations answer for CPU operands; with_cudnn: and
    cuDNN says it is there."""
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    if with_cudnn:
        monkeypatch.setattr(cudnn, "available", lambda: True)


def fast_path(name: str):
    def fn(*args, **kwargs):
        return name
    fn.__name__ = name
    return fn


# ------------------------------------------------------------------ the table itself

def test_lookup_matches_device_dtype_and_layout(table):
    on_cpu = dispatch.register("op", device="cpu", dtypes=("float32",), layouts=("channels_last",))(fast_path("a"))
    x = np.zeros((2, 3, 4, 5), np.float32)
    assert dispatch.lookup("op", as_channels_last(x)) is on_cpu
    assert dispatch.lookup("op", frost.Tensor(as_channels_last(x))) is on_cpu   # a Tensor asks by its array
    assert dispatch.lookup("op", x) is None                                      # contiguous
    assert dispatch.lookup("op", as_channels_last(x.astype(np.float64))) is None
    assert dispatch.lookup("other_op", as_channels_last(x)) is None


def test_disabled_ops_find_no_fast_path_until_the_block_ends(table):
    path = dispatch.register("op", device="cpu")(fast_path("a"))
    other = dispatch.register("other_op", device="cpu")(fast_path("b"))
    x = np.zeros(3, np.float32)
    with dispatch.disabled("op"):
        assert dispatch.lookup("op", x) is None
        assert dispatch.lookup("other_op", x) is other
        with dispatch.disabled("op", "other_op"):  # nested: the outer block's op stays off after the inner ends
            assert dispatch.lookup("other_op", x) is None
        assert dispatch.lookup("op", x) is None and dispatch.lookup("other_op", x) is other
    assert dispatch.lookup("op", x) is path
    with pytest.raises(TypeError, match="names"):
        with dispatch.disabled(dispatch.lookup):
            pass


def test_has_paths_answers_for_the_arrays_device_and_an_op_switched_on(table):
    x = np.zeros(3, np.float32)
    assert not dispatch.has_paths("add", x)
    dispatch.register("add", device="cuda")(fast_path("gpu"))
    assert not dispatch.has_paths("add", x)  # a CUDA path does not answer for a NumPy array
    dispatch.register("add", device="cpu", applies=lambda a, b, dtype: True)(lambda a, b, dtype: (a + b + 100))
    assert dispatch.has_paths("add", x)
    with dispatch.disabled("add"):
        assert not dispatch.has_paths("add", x)
    a = frost.ones(3)
    np.testing.assert_array_equal((a + a).numpy(), [102.0] * 3)  # the op asks the table once a path is there
    with dispatch.disabled("add"):
        np.testing.assert_array_equal((a + a).numpy(), [2.0] * 3)


def test_layouts_are_contiguous_channels_last_or_strided():
    x = np.zeros((2, 3, 4, 5), np.float32)
    assert [dispatch.layout_of(a) for a in (x, as_channels_last(x), x[:, :, ::2], x.transpose(1, 0, 2, 3))] == \
        ["contiguous", "channels_last", "strided", "strided"]
    assert dispatch.layout_of(np.zeros((1, 3, 1, 1), np.float32)) == "contiguous"  # both: counts as NCHW


def test_a_cuda_path_does_not_answer_for_numpy_arrays(table):
    dispatch.register("op")(fast_path("gpu"))                     # device="cuda" by default
    assert dispatch.lookup("op", np.zeros(3, np.float32)) is None
    assert dispatch.device_of(np.zeros(3)) == "cpu"


def test_the_predicate_sees_operands_and_params(table):
    seen = []

    def applies(x, y, *, scale):
        seen.append((x.shape, y, scale))
        return scale > 1

    fn = dispatch.register("op", device="cpu", applies=applies)(fast_path("a"))
    x = np.ones((2, 2))
    assert dispatch.lookup("op", x, None, scale=1) is None
    assert dispatch.lookup("op", x, None, scale=2) is fn
    assert seen == [((2, 2), None, 1), ((2, 2), None, 2)]


def test_priority_then_registration_order(table):
    first = dispatch.register("op", device="cpu")(fast_path("first"))
    dispatch.register("op", device="cpu")(fast_path("second"))
    best = dispatch.register("op", device="cpu", priority=5, applies=lambda x: x.size > 3)(fast_path("best"))
    assert dispatch.lookup("op", np.zeros(4)) is best
    assert dispatch.lookup("op", np.zeros(2)) is first   # best declines; ties keep registration order
    assert [p.fn.__name__ for p in dispatch.registered("op")] == ["best", "first", "second"]


def test_dtypes_take_frost_or_numpy_names(table):
    fn = dispatch.register("op", device="cpu", dtypes=(frost.bfloat16, "float16"))(fast_path("half"))
    assert dispatch.lookup("op", np.zeros(2, BF16)) is fn
    assert dispatch.lookup("op", np.zeros(2, np.float16)) is fn
    assert dispatch.lookup("op", np.zeros(2, np.float32)) is None


def test_bad_registrations_are_named(table):
    with pytest.raises(ValueError, match=r"dispatch.register\('op'\): device must be one of \('cpu', 'cuda'\), "
                                         r"got 'gpu'"):
        dispatch.register("op", device="gpu")
    with pytest.raises(ValueError, match=r"dispatch.register\('op'\): unknown layouts \['nhwc'\]"):
        dispatch.register("op", layouts=("nhwc",))
    with pytest.raises(TypeError, match=r"dispatch.register\('op'\): layouts must be a sequence of names, got the "
                                        r"string 'channels_last'"):
        dispatch.register("op", layouts="channels_last")
    with pytest.raises(TypeError, match="unknown dtype name 'float99'"):
        dispatch.register("op", dtypes=("float99",))
    assert table == {}


# ------------------------------------------------------------------ what the acceleration layer registers

def test_the_layer_registers_batch_norm_and_cross_entropy_on_cuda():
    paths = {(p.op, p.fn.__name__, p.device) for p in dispatch.registered()}
    assert {("batch_norm_act", "batch_norm_act_kernels", "cuda"),
            ("batch_norm_act", "batch_norm_act_in_float32", "cuda"),
            ("cross_entropy", "cross_entropy_kernels", "cuda")} <= paths
    ours = dispatch.registered("batch_norm_act") + dispatch.registered("cross_entropy")
    assert all(p.device == "cuda" for p in ours)


def bn_lookup(x: np.ndarray, training: bool = True, residual=None):
    C = x.shape[1]
    return dispatch.lookup("batch_norm_act", frost.Tensor(x), frost.zeros(C), frost.ones(C), frost.ones(C),
                           frost.zeros(C), training=training, residual=residual)


def test_batch_norm_act_picks_its_kernels_by_dtype_layout_and_call(monkeypatch):
    as_if_on_the_gpu(monkeypatch)
    x = np.ones((2, 3, 4, 4), np.float32)
    assert bn_lookup(x) is bn_lookup(as_channels_last(x)) is accel_bn.batch_norm_act_kernels
    assert bn_lookup(as_channels_last(x.astype(BF16))) is accel_bn.batch_norm_act_kernels
    assert bn_lookup(x.astype(BF16)) is bn_lookup(as_channels_last(x.astype(np.float16))) \
        is accel_bn.batch_norm_act_in_float32                    # no kernels of their dtype and layout: float32
    assert bn_lookup(x, training=False) is None                  # evaluation: the reference path
    assert bn_lookup(x.astype(np.float64)) is None
    assert bn_lookup(x, residual=frost.ones(3, 4, 4)) is None    # a broadcast residual
    assert bn_lookup(np.ones((0, 3, 4, 4), np.float32)) is None  # nothing to launch


def test_cross_entropy_picks_its_kernels_for_plain_mean_or_sum(monkeypatch):
    as_if_on_the_gpu(monkeypatch)
    x, t = frost.randn(4, 5), frost.tensor([0, 1, 2, 3])

    def found(x=x, t=t, weight=None, reduction="mean", label_smoothing=0.0):
        return dispatch.lookup("cross_entropy", x, t, weight, reduction=reduction, label_smoothing=label_smoothing)
    assert found() is found(reduction="sum") is accel_xent.cross_entropy_kernels
    assert found(reduction="none") is found(label_smoothing=0.1) is found(weight=frost.ones(5)) is None
    assert found(t=frost.tensor([0, 1, 2, 3], dtype="int32")) is found(x=x.double()) is None


def test_the_layer_registers_avg_pool_linear_on_cuda():
    assert [(p.fn, p.device) for p in dispatch.registered("avg_pool_linear")] == \
        [(accel_head.avg_pool_linear_kernels, "cuda")]


def test_avg_pool_linear_picks_its_kernels_by_dtype_layout_and_size(monkeypatch):
    as_if_on_the_gpu(monkeypatch)
    x, w = np.ones((2, 3, 4, 4), np.float32), frost.ones(5, 3)

    def found(x=x, w=w):
        return dispatch.lookup("avg_pool_linear", frost.Tensor(x), w)
    assert found() is found(as_channels_last(x)) is found(x.astype(BF16)) is accel_head.avg_pool_linear_kernels
    assert found(x.astype(np.float64)) is found(x.astype(np.float16)) is None     # no kernels of that dtype
    assert found(x[:, :, ::2]) is None                                            # strided
    assert found(w=frost.ones(5, 3, dtype="float64")) is None                     # the weight must be float32
    assert found(np.ones((0, 3, 4, 4), np.float32)) is None                       # nothing to launch
    wide = np.ones((1, accel_head.HEAD_MAX_FEATURES + 1, 1, 1), np.float32)       # more than shared memory holds
    assert found(wide, frost.ones(5, wide.shape[1])) is None


# ------------------------------------------------------------------ the core without the layer

def torch_batch_norm_act(x, w, b, res):
    xt, wt, bt, rt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b, res))
    rm, rv = torch.zeros(x.shape[1], dtype=torch.float64), torch.ones(x.shape[1], dtype=torch.float64)
    out = torch.relu(TF.batch_norm(xt, rm, rv, wt, bt, training=True, momentum=0.1, eps=1e-5) + rt)
    return out, (xt, wt, bt, rt), (rm, rv)


@pytest.mark.parametrize("gpu_like", [False, True])
def test_without_the_layer_batch_norm_act_gives_pytorchs_answer(table, monkeypatch, gpu_like):
    if gpu_like:  # even where the layer would take the call, the core alone answers
        as_if_on_the_gpu(monkeypatch)
    rng = np.random.default_rng(0)
    x, res, g = (rng.standard_normal((4, 3, 5, 5)) for _ in range(3))
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    tensors = [frost.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w, b, res)]
    rm, rv, counter = frost.zeros(3), frost.ones(3), frost.tensor(0, dtype="int64")
    out = batch_norm_act(tensors[0], rm, rv, tensors[1], tensors[2], training=True, residual=tensors[3], relu=True,
                         num_batches_tracked=counter)
    out.backward(frost.tensor(g.astype(np.float32)))
    want, leaves, (want_rm, want_rv) = torch_batch_norm_act(x, w, b, res)
    want.backward(torch.tensor(g))
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for got, leaf in zip(tensors, leaves):
        np.testing.assert_allclose(got.grad.numpy(), leaf.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rm.numpy(), want_rm.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.numpy(), want_rv.numpy(), rtol=1e-5, atol=1e-6)
    assert counter.item() == 1


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("gpu_like", [False, True])
def test_without_the_layer_cross_entropy_gives_pytorchs_answer(table, monkeypatch, gpu_like, reduction):
    if gpu_like:
        as_if_on_the_gpu(monkeypatch)
    rng = np.random.default_rng(1)
    logits, targets = rng.standard_normal((6, 7)), np.array([0, 6, 2, -100, 3, 3])
    x = frost.tensor(logits.astype(np.float32), requires_grad=True)
    out = cross_entropy(x, frost.tensor(targets), reduction=reduction)
    out.backward()
    xt = torch.tensor(logits, requires_grad=True)
    want = TF.cross_entropy(xt, torch.tensor(targets), reduction=reduction)
    want.backward()
    np.testing.assert_allclose(out.item(), want.item(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("gpu_like", [False, True])
def test_without_the_layer_avg_pool_linear_gives_pytorchs_answer(table, monkeypatch, gpu_like, channels_last):
    if gpu_like:
        as_if_on_the_gpu(monkeypatch)
    rng = np.random.default_rng(6)
    x, w, b, g = (rng.standard_normal(shape) for shape in ((3, 5, 4, 2), (7, 5), (7,), (3, 7)))
    tensors = [frost.tensor(x.astype(np.float32), requires_grad=True)] + \
        [frost.tensor(a.astype(np.float32), requires_grad=True) for a in (w, b)]
    if channels_last:
        tensors[0] = frost.Tensor(as_channels_last(tensors[0].data), requires_grad=True)
    out = avg_pool_linear(*tensors)
    out.backward(frost.tensor(g.astype(np.float32)))
    leaves = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    want = TF.linear(TF.adaptive_avg_pool2d(leaves[0], 1).flatten(1), leaves[1], leaves[2])
    want.backward(torch.tensor(g))
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    for got, leaf in zip(tensors, leaves):
        np.testing.assert_allclose(got.grad.numpy(), leaf.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert dispatch.layout_of(tensors[0].grad.data) == ("channels_last" if channels_last else "contiguous")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_the_layers_avg_pool_linear_matches_the_core_alone(monkeypatch, dtype):
    rng = np.random.default_rng(7)
    x, w, g = rng.standard_normal((16, 64, 8, 8)), rng.standard_normal((10, 64)), rng.standard_normal((16, 10))

    def run():
        xt = frost.tensor(x, dtype=dtype, device="cuda", requires_grad=True).contiguous(frost.channels_last)
        xt.retain_grad()
        wt = frost.tensor(w, dtype="float32", device="cuda", requires_grad=True)
        out = avg_pool_linear(xt, wt)
        out.backward(frost.tensor(g, dtype="float32", device="cuda"))
        return [a.float().cpu().numpy().astype(np.float64) for a in (out.detach(), xt.grad, wt.grad)]
    layer = run()
    monkeypatch.setattr(dispatch, "_table", {})
    core = run()
    for a, b in zip(layer, core):
        assert np.abs(a - b).max() <= (2 ** -6 if dtype == "bfloat16" else 2 ** -9) * np.abs(b).max()  # TF32 dW


# ------------------------------------------------------------------ convolution: cuDNN or our kernels, chosen per shape

CONV_OPS = ("conv2d_forward", "conv2d_backward_input", "conv2d_backward_weight", "conv2d_prepare_backward")


@pytest.fixture
def with_cudnn(monkeypatch):
    """CPU operands answered as if they were on a GPU with cuDNN: the conv registrations take them."""
    as_if_on_the_gpu(monkeypatch, with_cudnn=True)


def test_the_layer_registers_the_convolutions_array_functions_on_cuda():
    paths = {(p.op, p.fn, p.device) for p in dispatch.registered() if p.op in CONV_OPS}
    assert paths == {("conv2d_forward", accel_conv.conv2d_forward_cuda, "cuda"),
                     ("conv2d_backward_input", accel_conv.conv2d_backward_input_cuda, "cuda"),
                     ("conv2d_backward_weight", accel_conv.conv2d_backward_weight_cuda, "cuda"),
                     ("conv2d_prepare_backward", accel_conv.conv2d_prepare_backward_cuda, "cuda")}


def conv_lookup(op: str, groups: int = 1, padding=1, kernel: int = 3) -> object:
    x, w = np.zeros((2, 4, 8, 8), np.float32), np.zeros((6, 4 // groups, kernel, kernel), np.float32)
    return dispatch.lookup(op, x, w, geo=conv_ops.geometry(x.shape, w.shape, 1, padding, 1, groups))


@pytest.mark.parametrize("op", CONV_OPS)
def test_the_conv_paths_take_what_cudnn_runs(with_cudnn, monkeypatch, op):
    assert conv_lookup(op) is not None and conv_lookup(op, padding=(0, 2)) is not None
    assert conv_lookup(op, groups=2) is None                       # grouped: the reference
    assert conv_lookup(op, padding="same", kernel=4) is None       # one more row at the end than at the top
    monkeypatch.setattr(cudnn, "available", lambda: False)
    assert conv_lookup(op) is None                                 # no cuDNN frontend installed


def test_without_a_gpu_the_conv_paths_are_not_asked():
    assert all(conv_lookup(op) is None for op in CONV_OPS)


def recorder(calls: list, name: str, result=None):
    def record(*args, **kwargs):
        calls.append((name, args, kwargs))
        return result(*args) if callable(result) else result
    return record


@pytest.fixture
def cudnn_only(with_cudnn, monkeypatch):
    """cuDNN's calls recorded (returning fixed arrays), our kernels never chosen."""
    calls = []
    monkeypatch.setattr(accel_conv.conv_fprop_mma, "supported", lambda *a, **k: False)
    monkeypatch.setattr(accel_conv.conv_wgrad, "supported", lambda *a, **k: False)
    for name, function in (("fprop", "conv2d_forward"), ("dgrad", "conv2d_backward_input"),
                           ("wgrad", "conv2d_backward_weight")):
        monkeypatch.setattr(cudnn, function, recorder(calls, name, lambda a, b, shape, *args: np.ones(shape, a.dtype)))
    return calls


CONV_ARGS = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))
CUDNN_ARGS = ((2, 1), (1, 2), (1, 2))


def test_the_conv_paths_call_cudnn_with_stride_padding_and_dilation(cudnn_only):
    x, w = np.zeros((2, 4, 9, 9), np.float32), np.zeros((6, 4, 3, 3), np.float32)
    y, stats = conv_ops.conv2d_forward_stats(x, w, **CONV_ARGS, bias=np.full(6, 2.0))
    g = np.zeros(y.shape, np.float32)
    dx = conv_ops.conv2d_backward_input(g, w, x.shape, **CONV_ARGS)
    out = np.zeros(w.shape, np.float32)
    dw = conv_ops.conv2d_backward_weight(g, x, w.shape, **CONV_ARGS, out=out)
    assert y.shape == (2, 6, 5, 9) and (y == 3.0).all() and stats is None   # cuDNN's y, then + bias
    assert dx.shape == x.shape and dw.shape == w.shape
    assert [(name, args[2:]) for name, args, _ in cudnn_only] == [
        ("fprop", ((2, 6, 5, 9), *CUDNN_ARGS)), ("dgrad", ((2, 4, 9, 9), *CUDNN_ARGS)),
        ("wgrad", ((6, 4, 3, 3), *CUDNN_ARGS))]
    assert cudnn_only[2][2] == {"out": out}                        # straight into the given buffer


def test_a_float32_weight_gradient_of_bf16_operands_is_cudnns_converted(cudnn_only):
    x, g = np.ones((2, 4, 6, 6), BF16), np.ones((2, 6, 6, 6), BF16)
    out = np.zeros((6, 4, 3, 3), np.float32)
    dw = conv_ops.conv2d_backward_weight(g, x, out.shape, padding=1, out=out, defer=True)
    assert dw is out and (out == 1.0).all() and cudnn_only[0][2] == {}   # cuDNN's bf16 dW, widened into out


def test_our_kernels_get_the_stats_out_and_defer_they_are_asked_for(with_cudnn, monkeypatch):
    calls = []
    fm, cw = accel_conv.conv_fprop_mma, accel_conv.conv_wgrad
    for module in (fm, cw):
        monkeypatch.setattr(module, "supported", lambda *a, **k: True)
        monkeypatch.setattr(module, "choose", lambda *a, **k: True)
    monkeypatch.setattr(fm, "conv2d_forward_gpu_stats",
                        recorder(calls, "fprop", lambda x, w, pad, y: (np.zeros(y.shape), "stats")))
    monkeypatch.setattr(fm, "conv2d_forward_gpu", recorder(calls, "dgrad", lambda g, w, pad, dx: dx))
    monkeypatch.setattr(cw, "conv2d_backward_weight_gpu", recorder(calls, "wgrad", lambda g, x, shape, *a: "dw"))
    x, w = as_channels_last(np.zeros((2, 4, 8, 8), np.float32)), np.zeros((6, 4, 3, 3), np.float32)
    assert conv_ops.conv2d_forward_stats(x, w, padding=1, stats=True)[1] == "stats"
    assert conv_ops.conv2d_forward_stats(x, w, padding=1, bias=np.zeros(6), stats=True)[1] == "stats"
    out = np.zeros(w.shape, np.float32)
    g = as_channels_last(np.zeros((2, 6, 8, 8), np.float32))
    conv_ops.conv2d_backward_input(g, w, x.shape, padding=1)
    assert conv_ops.conv2d_backward_weight(g, x, w.shape, padding=1, out=out, defer=True) == "dw"
    (_, (_, _, _, y), fprop), (_, (_, _, _, y_bias), fprop_bias), (_, (_, _, _, dx), dgrad), (_, _, wgrad) = calls
    assert fprop == {"stride": (1, 1), "stats": True} and fprop_bias == {"stride": (1, 1), "stats": False}
    assert y.shape == (2, 6, 8, 8) and dispatch.layout_of(y) == "channels_last"   # in x's memory format
    assert dgrad == {"flip": True, "stride": (1, 1)} and dispatch.layout_of(dx) == "channels_last"
    assert wgrad == {"out": out, "defer": True}


def test_conv2d_offers_the_layer_a_head_start_on_the_gradients_it_will_need(table):
    asked = []
    dispatch.register("conv2d_prepare_backward", device="cpu")(recorder(asked, "prepare"))
    x, w = frost.randn(2, 3, 6, 6, requires_grad=True), frost.randn(4, 3, 3, 3)
    y = frost.nn.functional.conv2d(x, w, padding=1)
    [(_, (y_array, x_array, w_array, geo), flags)] = asked
    assert y_array.shape == y.shape and x_array is x.data and w_array is w.data and geo.ho == 6
    assert flags == {"weight_gradient": False, "input_gradient": True}
    with frost.no_grad():
        frost.nn.functional.conv2d(x, w, padding=1)
    assert len(asked) == 1                                          # no backward coming: nothing to prepare


def torch_conv2d(x, w, b, g, **kwargs):
    xt, wt, bt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    out = TF.conv2d(xt, wt, bt, **kwargs)
    out.backward(torch.tensor(g, dtype=torch.float64))
    return [out.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()]


def frost_conv2d(x, w, b, g, weight_grad: bool, **kwargs) -> list:
    tensors = [frost.tensor(x, requires_grad=True), frost.tensor(w, requires_grad=weight_grad),
               frost.tensor(b, requires_grad=True)]
    out = frost.nn.functional.conv2d(*tensors, **kwargs)
    out.backward(frost.tensor(g))
    return [out.detach().numpy()] + [None if t.grad is None else t.grad.numpy() for t in tensors]


@pytest.mark.parametrize("kwargs", [dict(stride=1, padding=1), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
                                    dict(padding=1, groups=2)])
@pytest.mark.parametrize("gpu_like", [False, True])
def test_without_the_layer_conv2d_gives_pytorchs_answer(table, monkeypatch, gpu_like, kwargs):
    if gpu_like:
        as_if_on_the_gpu(monkeypatch, with_cudnn=True)
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((3, 4, 9, 8)), rng.standard_normal((6, 4 // kwargs.get("groups", 1), 3, 3)), \
        rng.standard_normal(6)
    g = rng.standard_normal(TF.conv2d(torch.tensor(x), torch.tensor(w), **kwargs).shape)
    want = torch_conv2d(x, w, b, g, **kwargs)
    for weight_grad in (True, False):   # the CPU keeps im2col columns for dW; without dW it asks conv2d_forward
        got = frost_conv2d(x, w, b, g, weight_grad, **kwargs)
        assert (got[2] is None) != weight_grad
        for got_value, want_value in zip(got, want):
            if got_value is not None:
                np.testing.assert_allclose(got_value, want_value, rtol=1e-10, atol=1e-10)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_the_layers_conv2d_matches_the_core_alone(monkeypatch, dtype):
    rng = np.random.default_rng(3)
    x, w, g = rng.standard_normal((8, 16, 12, 12)), rng.standard_normal((32, 16, 3, 3)), \
        rng.standard_normal((8, 32, 12, 12))

    def run():
        xt = frost.tensor(x, dtype=dtype, device="cuda", requires_grad=True).contiguous(frost.channels_last)
        xt.retain_grad()
        wt = frost.tensor(w, dtype=dtype, device="cuda", requires_grad=True)
        out = frost.nn.functional.conv2d(xt, wt, padding=1)
        out.backward(frost.tensor(g, dtype=dtype, device="cuda"))
        return [a.float().cpu().numpy().astype(np.float64) for a in (out.detach(), xt.grad, wt.grad)]
    layer = run()
    monkeypatch.setattr(dispatch, "_table", {})
    core = run()
    for a, b in zip(layer, core):
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= (2 ** -6 if dtype == "bfloat16" else 2 ** -9) * scale


# ------------------------------------------------------------------ matmul and attention
def test_the_layer_registers_matmul_arrays_and_attention_on_cuda():
    paths = {(p.op, p.fn.__name__, p.device) for p in dispatch.registered()}
    assert {("matmul_arrays", "matmul_arrays_cuda", "cuda"),
            ("scaled_dot_product_attention", "scaled_dot_product_attention_flash", "cuda")} <= paths


def frost_matmul_and_attention(tensors: list, causal: bool) -> list:
    """(a @ b, sdpa(q, k, v)) of tensors (a, b, q, k, v) and their gradients, through frost."""
    for t in tensors:
        t.requires_grad = True
    a, b, q, k, v = tensors
    product = frost.matmul(a, b)
    attended = frost.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (product.sum() + (attended * attended).sum()).backward()
    return [product.detach(), attended.detach(), a.grad, b.grad, q.grad, k.grad, v.grad]


def torch_matmul_and_attention(arrays: list, causal: bool) -> list:
    a, b, q, k, v = (torch.tensor(x, requires_grad=True) for x in arrays)
    product = a @ b
    attended = TF.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (product.sum() + (attended * attended).sum()).backward()
    return [t.detach().numpy() for t in (product, attended, a.grad, b.grad, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gpu_like", [False, True])
def test_without_the_layer_matmul_and_attention_give_pytorchs_answer(table, monkeypatch, gpu_like, causal):
    if gpu_like:
        as_if_on_the_gpu(monkeypatch, with_cudnn=True)
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(shape) for shape in ((2, 3, 4, 5), (1, 3, 5, 6), (2, 2, 7, 64), (2, 2, 9, 64),
                                                       (2, 2, 9, 64))]
    got = frost_matmul_and_attention([frost.Tensor(x) for x in arrays], causal)
    for got_value, want_value in zip(got, torch_matmul_and_attention(arrays, causal)):
        np.testing.assert_allclose(got_value.numpy(), want_value, rtol=1e-10, atol=1e-10)


@pytest.mark.cuda
def test_on_the_gpu_the_layers_matmul_and_attention_match_the_core_alone(monkeypatch):
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(shape) for shape in ((2, 3, 64, 32), (1, 3, 32, 48), (2, 4, 100, 64),
                                                       (2, 4, 130, 64), (2, 4, 130, 64))]

    def run():
        tensors = [frost.tensor(x, dtype="bfloat16", device="cuda") for x in arrays]
        return [t.float().cpu().numpy().astype(np.float64) for t in frost_matmul_and_attention(tensors, causal=True)]
    layer = run()
    monkeypatch.setattr(dispatch, "_table", {})
    core = run()
    for a, b in zip(layer, core):
        assert np.abs(a - b).max() <= 2 ** -6 * np.abs(b).max()

