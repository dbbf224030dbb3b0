"""frost.dispatch: fast paths register for (op, device, dtypes, layouts, predicate) and the ops find them; with the
table emptied the core alone gives PyTorch's answers (the acceleration layer only makes it faster)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import frost
from frost import dispatch
from frost.accel import batch_norm as accel_bn
from frost.accel import cross_entropy as accel_xent
from frost.layout import as_channels_last
from frost.ops.loss import cross_entropy
from frost.ops.norm import batch_norm_act

BF16 = frost.bfloat16.np


@pytest.fixture
def table(monkeypatch):
    """An empty dispatch table for the test (the real one comes back afterwards)."""
    monkeypatch.setattr(dispatch, "_table", {})
    return dispatch._table


def as_if_on_the_gpu(monkeypatch) -> None:
    """dispatch takes NumPy arrays for CuPy ones: the CUDA registrations answer for CPU operands."""
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")


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
