"""Tests of frost/nn/module.py: registration, iteration, state dicts, modes, device/dtype moves, repr."""
import copy
import pickle

import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import to_frost_state


def _build(self, lib):
    self.conv = lib.Conv2d(3, 4, 3, padding=1, bias=False)
    self.bn = lib.BatchNorm2d(4)
    self.block = lib.Sequential(lib.Linear(4, 5), lib.ReLU(), lib.Linear(5, 2))
    self.head = lib.Linear(2, 2)


def _forward(self, x):
    x = self.bn(self.conv(x)).mean((2, 3))
    return self.head(self.block(x))


class Net(nn.Module):
    """A small model (module-level, so that it pickles)."""

    def __init__(self):
        super().__init__()
        _build(self, nn)

    forward = _forward


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _build(self, torch.nn)

    forward = _forward

    def _get_name(self):
        return "Net"


def make_net(lib):
    """The same small architecture in frost (lib=frost.nn) or PyTorch (lib=torch.nn)."""
    return Net() if lib is nn else TorchNet()


# ---------------------------------------------------------------- Parameter

def test_parameter_is_a_leaf_tensor_that_requires_grad():
    p = nn.Parameter(frost.ones(3))
    assert isinstance(p, frost.Tensor) and p.requires_grad and p.is_leaf
    assert not nn.Parameter(frost.ones(3), requires_grad=False).requires_grad
    assert nn.Parameter().shape == (0,)


def test_parameter_shares_memory_with_its_tensor():
    t = frost.zeros(2)
    p = nn.Parameter(t)
    t.data[0] = 5
    assert p.detach().numpy()[0] == 5


def test_parameter_repr_matches_torch():
    values = [1.0, 2.5, -3.0]
    assert repr(nn.Parameter(frost.tensor(values))) == repr(torch.nn.Parameter(torch.tensor(values)))


def test_parameter_of_integers_cannot_require_grad():
    with pytest.raises(RuntimeError, match="floating-point"):
        nn.Parameter(frost.tensor([1, 2]))


def test_parameter_deepcopy_and_pickle_keep_values_not_memory():
    p = nn.Parameter(frost.tensor([1.0, 2.0]))
    for q in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert isinstance(q, nn.Parameter) and q.requires_grad
        np.testing.assert_array_equal(q.detach().numpy(), p.detach().numpy())
        assert q.data is not p.data


# ---------------------------------------------------------------- registration

def test_attributes_register_parameters_modules_and_buffers_in_order():
    net = make_net(nn)
    assert list(net._modules) == ["conv", "bn", "block", "head"]
    names = [n for n, _ in net.named_parameters()]
    assert names == ["conv.weight", "bn.weight", "bn.bias", "block.0.weight", "block.0.bias",
                     "block.2.weight", "block.2.bias", "head.weight", "head.bias"]
    assert [n for n, _ in net.named_buffers()] == ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert [n for n, _ in net.named_children()] == ["conv", "bn", "block", "head"]
    assert [n for n, _ in net.named_modules()] == ["", "conv", "bn", "block", "block.0", "block.1", "block.2", "head"]
    assert len(list(net.parameters(recurse=False))) == 0
    assert len(list(net.head.parameters())) == 2
    assert net.get_submodule("block.2") is net.block[2]
    assert net.get_parameter("block.2.bias") is net.block[2].bias


def test_named_parameters_prefix_and_non_recursive():
    lin = nn.Linear(2, 3)
    assert [n for n, _ in lin.named_parameters(prefix="fc")] == ["fc.weight", "fc.bias"]
    seq = nn.Sequential(nn.Linear(2, 2))
    assert list(seq.named_parameters(recurse=False)) == []


def test_reassigning_keeps_order_and_type_checks():
    lin = nn.Linear(2, 3)
    lin.weight = nn.Parameter(frost.zeros(3, 2))
    assert list(lin._parameters) == ["weight", "bias"]
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'weight'"):
        lin.weight = frost.zeros(3, 2)
    lin.bias = None
    assert lin.bias is None and [n for n, _ in lin.named_parameters()] == ["weight"]
    seq = nn.Sequential(nn.ReLU())
    with pytest.raises(TypeError, match="child module '0'"):
        setattr(seq, "0", 3)


def test_plain_attributes_and_deletion():
    m = nn.Module()
    m.alpha = 3
    m.w = nn.Parameter(frost.ones(2))
    m.register_buffer("b", frost.zeros(2))
    m.sub = nn.ReLU()
    assert m.alpha == 3 and "alpha" not in m._parameters
    del m.w, m.b, m.sub
    assert list(m.parameters()) == [] and list(m.buffers()) == [] and list(m.children()) == []
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'w'"):
        m.w


def test_register_errors():
    m = nn.Module()
    m.x = 1
    with pytest.raises(KeyError, match="attribute 'x' already exists"):
        m.register_parameter("x", nn.Parameter(frost.ones(1)))
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", frost.ones(1))
    with pytest.raises(KeyError, match="empty string"):
        m.add_module("", nn.ReLU())
    with pytest.raises(TypeError, match="frost.nn.Parameter or None required"):
        m.register_parameter("p", frost.ones(1))
    with pytest.raises(TypeError, match="frost.Tensor or None required"):
        m.register_buffer("q", np.ones(1))
    with pytest.raises(ValueError, match="non-leaf"):
        m.register_parameter("r", _non_leaf_param())


def _non_leaf_param():
    p = nn.Parameter(frost.ones(2))
    q = nn.Parameter(frost.ones(2))
    q._ctx = (p * 2)._ctx
    return q


def test_assigning_before_init_is_an_error():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(frost.ones(1))
            super().__init__()
    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()


def test_missing_forward_is_reported():
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        nn.Module()(frost.ones(1))


def test_shared_parameters_are_listed_once_but_saved_under_each_name():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    seq = nn.Sequential(a, b)
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "1.bias"]
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    shared = nn.ReLU()
    s2 = nn.Sequential(shared, shared)
    assert len(list(s2.modules())) == 2 and len(list(s2.children())) == 1


def test_non_persistent_buffers_are_not_saved():
    m = nn.Module()
    m.register_buffer("kept", frost.zeros(2))
    m.register_buffer("scratch", frost.zeros(2), persistent=False)
    assert [n for n, _ in m.named_buffers()] == ["kept", "scratch"]
    assert list(m.state_dict()) == ["kept"]


# ---------------------------------------------------------------- state dicts

def test_state_dict_keys_shapes_and_order_match_torch():
    f, t = make_net(nn).state_dict(), make_net(torch.nn).state_dict()
    assert list(f) == list(t)
    for k in t:
        assert f[k].shape == tuple(t[k].shape), k
        assert f[k].dtype.name == str(t[k].dtype).replace("torch.", ""), k
        assert not f[k].requires_grad


def test_state_dict_shares_memory_with_the_model():
    net = make_net(nn)
    sd = net.state_dict()
    sd["head.bias"].data[...] = 7
    assert np.all(net.head.bias.detach().numpy() == 7)
    assert net.state_dict(keep_vars=True)["head.bias"] is net.head.bias


def test_load_state_dict_from_torch_copies_every_value():
    tnet, fnet = make_net(torch.nn), make_net(nn)
    with torch.no_grad():
        tnet.bn.running_mean.uniform_()
        tnet.bn.num_batches_tracked.fill_(5)
    result = fnet.load_state_dict(to_frost_state(tnet))
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert repr(result) == "<All keys matched successfully>"
    for k, v in tnet.state_dict().items():
        np.testing.assert_array_equal(fnet.state_dict()[k].numpy(), v.numpy())
    assert fnet.bn.num_batches_tracked.dtype == frost.int64 and fnet.bn.num_batches_tracked.item() == 5


def test_load_state_dict_round_trip_and_independence():
    a, b = make_net(nn), make_net(nn)
    b.load_state_dict(a.state_dict())
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_array_equal(va.numpy(), vb.numpy())
    b.head.bias.data[...] = 123  # b copied values; it does not alias a
    assert not np.any(a.head.bias.detach().numpy() == 123)


def test_load_state_dict_keeps_parameter_identity_and_casts_dtype():
    lin = nn.Linear(2, 2)
    w = lin.weight
    lin.load_state_dict({"weight": np.ones((2, 2), dtype=np.float64), "bias": frost.zeros(2)})
    assert lin.weight is w and lin.weight.dtype == frost.float32
    np.testing.assert_array_equal(lin.weight.detach().numpy(), np.ones((2, 2)))


def test_load_state_dict_reports_missing_and_unexpected_keys():
    net = make_net(nn)
    sd = net.state_dict()
    del sd["head.bias"], sd["bn.running_var"]
    sd["extra.weight"] = frost.zeros(1)
    with pytest.raises(RuntimeError) as err:
        net.load_state_dict(sd)
    msg = str(err.value)
    assert msg.startswith("Error(s) in loading state_dict for Net:")
    assert 'Missing key(s) in state_dict: "bn.running_var", "head.bias".' in msg
    assert 'Unexpected key(s) in state_dict: "extra.weight".' in msg
    missing, unexpected = net.load_state_dict(sd, strict=False)
    assert missing == ["bn.running_var", "head.bias"] and unexpected == ["extra.weight"]


def test_load_state_dict_size_mismatch_raises_even_when_not_strict_and_copies_nothing():
    net = make_net(nn)
    before = net.conv.weight.detach().numpy().copy()
    sd = {k: v.numpy() + 1 if v.dtype.is_floating_point else v for k, v in net.state_dict().items()}
    sd["head.weight"] = np.zeros((3, 2), dtype=np.float32)
    sd["block.0.bias"] = np.zeros(4, dtype=np.float32)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"size mismatch for head.weight: copying a param with shape "
                                               r"\(3, 2\) from checkpoint, the shape in current model is \(2, 2\)"):
            net.load_state_dict(sd, strict=strict)
    with pytest.raises(RuntimeError, match=r"size mismatch for block.0.bias"):
        net.load_state_dict(sd)
    np.testing.assert_array_equal(net.conv.weight.detach().numpy(), before)


def test_batch_norm_loads_checkpoints_without_its_counter_or_with_a_1_element_one():
    """PyTorch checkpoints from before BatchNorm's num_batches_tracked (and converted weights) load as torch does."""
    for lib in (nn, torch.nn):
        bn = lib.BatchNorm2d(3)
        state = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
        bn.num_batches_tracked.fill_(5)
        assert not bn.load_state_dict(state, strict=True).missing_keys
        assert bn.num_batches_tracked.item() == 5, lib  # kept
        bn.load_state_dict({**state, "num_batches_tracked": np.array([7]) if lib is nn else torch.tensor([7])})
        assert bn.num_batches_tracked.item() == 7 and tuple(bn.num_batches_tracked.shape) == (), lib
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"running_var\""):
        nn.BatchNorm2d(3).load_state_dict({k: v for k, v in state.items() if k != "running_var"})


def test_load_state_dict_rejects_non_mappings():
    with pytest.raises(TypeError, match="dict-like"):
        nn.Linear(1, 1).load_state_dict([1, 2])


# ---------------------------------------------------------------- modes and gradients

def test_train_and_eval_propagate_to_every_submodule():
    net = make_net(nn)
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError, match="boolean"):
        net.train("yes")


def test_train_calls_each_childs_own_train():
    """The frozen-BatchNorm pattern of fine-tuning: a child's train() that keeps it in eval mode is honoured."""
    for lib in (nn, torch.nn):
        class FrozenBN(lib.BatchNorm2d):
            def train(self, mode=True):
                return super().train(False)

        net = lib.Sequential(lib.Conv2d(3, 4, 3), FrozenBN(4), lib.ReLU())
        net.train()
        assert net.training and net[0].training and not net[1].training, lib
        before = net[1].running_mean.detach().numpy().copy()
        net(frost.ones(2, 3, 6, 6) if lib is nn else torch.ones(2, 3, 6, 6))
        np.testing.assert_array_equal(net[1].running_mean.detach().numpy(), before)


def test_zero_grad_and_requires_grad():
    net = make_net(nn)
    net(frost.randn(2, 3, 4, 4)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.numpy() == 0) for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_apply_visits_children_first_then_self():
    net = make_net(nn)
    seen = []
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    assert seen == ["Conv2d", "BatchNorm2d", "Linear", "ReLU", "Linear", "Sequential", "Linear", "Net"]


# ---------------------------------------------------------------- to()

def test_to_dtype_keeps_parameter_identity_and_integer_buffers():
    net = make_net(nn)
    params = list(net.parameters())
    net(frost.randn(2, 3, 4, 4)).sum().backward()
    assert net.to(frost.float64) is net
    assert [id(p) for p in net.parameters()] == [id(p) for p in params]
    assert all(p.dtype == frost.float64 and p.grad.dtype == frost.float64 for p in params)
    assert net.bn.running_mean.dtype == frost.float64
    assert net.bn.num_batches_tracked.dtype == frost.int64
    out = net(frost.randn(2, 3, 4, 4, dtype="float64"))
    assert out.dtype == frost.float64
    net.float()
    assert all(p.dtype == frost.float32 for p in params)
    net.to("cpu", dtype="bfloat16")
    assert net.head.weight.dtype == frost.bfloat16


def test_to_rejects_integer_dtypes():
    with pytest.raises(TypeError, match="floating point"):
        nn.Linear(2, 2).to(frost.int64)


def test_to_keeps_an_existing_reference_in_sync():
    # what an optimizer built before .to() relies on: the same Parameter objects see the new arrays
    lin = nn.Linear(2, 2)
    held = [lin.weight, lin.bias]
    lin.double()
    assert held[0] is lin.weight and held[0].dtype == frost.float64


# ---------------------------------------------------------------- copying and printing

def test_deepcopy_and_pickle_of_a_module():
    net = make_net(nn)
    x = frost.randn(2, 3, 4, 4)
    net.eval()
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        np.testing.assert_array_equal(clone(x).detach().numpy(), net(x).detach().numpy())
        assert clone.head.weight is not net.head.weight
        assert [n for n, _ in clone.named_parameters()] == [n for n, _ in net.named_parameters()]


def test_repr_matches_torch():
    assert repr(make_net(nn)) == repr(make_net(torch.nn))


def test_extra_repr_with_several_lines_is_indented():
    class Two(nn.Module):
        def extra_repr(self):
            return "a=1\nb=2"
    assert repr(Two()) == "Two(\n  a=1\n  b=2\n)"
    assert repr(nn.Module()) == "Module()"


def test_to_same_dtype_does_not_copy_and_shared_parameters_convert_once():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    seq = nn.Sequential(a, b)
    array = a.bias.data
    seq.float()
    assert a.bias.data is array  # views into an optimizer's flat buffer would stay views
    seq.double()
    assert a.weight is b.weight and a.weight.dtype == frost.float64


def test_forward_hooks_see_and_may_replace_inputs_and_outputs():
    lin = nn.Linear(2, 2)
    seen = []
    h1 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    h2 = lin.register_forward_hook(lambda m, args, out: seen.append((m, out.shape)))
    out = lin(frost.ones(3, 2))
    np.testing.assert_allclose(out.detach().numpy(), np.broadcast_to(lin.bias.detach().numpy(), (3, 2)))
    assert seen == [(lin, (3, 2))]
    h1.remove()
    with h2:
        pass
    lin(frost.ones(1, 2))
    assert len(seen) == 1 and not lin._forward_hooks and not lin._forward_pre_hooks
    with lin.register_forward_hook(lambda m, args, out: out * 2):
        expected = 2 * (lin.weight.detach().numpy().sum(1) + lin.bias.detach().numpy())
        np.testing.assert_allclose(lin(frost.ones(1, 2)).detach().numpy()[0], expected, rtol=1e-6)


def test_an_optimizer_built_before_to_still_updates_the_model():
    optim = pytest.importorskip("frost.optim")
    lin = nn.Linear(3, 1)
    opt = optim.SGD(lin.parameters(), lr=0.1)
    lin.double()
    before = lin.weight.detach().numpy().copy()
    lin(frost.ones(2, 3, dtype="float64")).sum().backward()
    opt.step()
    np.testing.assert_allclose(lin.weight.detach().numpy(), before - 0.1 * 2.0, rtol=1e-12)
    assert lin.weight.dtype == frost.float64


def test_load_state_dict_between_forward_and_backward_is_caught_as_in_pytorch():
    """New weights under a graph that read the old ones: the backward would mix them; it refuses instead."""
    layer = nn.Linear(2, 1, bias=False)
    x = frost.ones(1, 2, requires_grad=True)
    y = layer(x).sum()
    layer.load_state_dict({"weight": frost.full((1, 2), 5.0)})
    with pytest.raises(RuntimeError, match="changed in place after 'linear' used it"):
        y.backward()


def test_get_parameter_refuses_a_parameter_registered_as_none():
    with pytest.raises(AttributeError, match="`bias` is not an nn.Parameter"):
        nn.Linear(2, 2, bias=False).get_parameter("bias")
    assert nn.Linear(2, 2).get_parameter("bias").shape == (2,)


def test_deepcopy_copies_leaves_and_refuses_tensors_made_by_ops():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    copied = copy.deepcopy(x)
    assert copied is not x and copied.requires_grad and copied.tolist() == [1.0, 2.0]
    copied.data[0] = 9.0
    assert x.tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="only tensors created by the user .* not one made by 'mul'"):
        copy.deepcopy(x * 2)
    with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user"):
        copy.deepcopy(torch.ones(2, requires_grad=True) * 2)
    p = nn.Parameter(frost.ones(2))
    p.grad = frost.ones(2)
    q = copy.deepcopy(p)
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.grad is None  # torch's Parameter drops .grad


def test_load_state_dict_writes_nothing_unless_every_value_converts():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    state = {k: frost.full(v.shape, 7.0) for k, v in model.state_dict().items()}
    state["1.num_batches_tracked"] = None  # the right key, a value of no number type
    with pytest.raises(TypeError, match="value for '1.num_batches_tracked' is None"):
        model.load_state_dict(state)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)
    with pytest.raises(TypeError, match=r"t.detach\(\).float\(\).cpu\(\) where NumPy has no dtype for it"):
        nn.Linear(2, 2).load_state_dict({"weight": torch.ones(2, 2, dtype=torch.bfloat16), "bias": torch.ones(2)})
