"""The autograd engine: ordering, accumulation, leaves, grad mode, retain_graph, anomaly mode, clear errors."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import frost
from frost import autograd
from frost.autograd import AnomalyError, GradientPair, unbroadcast
from frost.tensor import from_op

RNG = np.random.default_rng(4)


def test_diamond_graph_ordering():
    # b depends on a, the root depends on both: a's gradient must be complete before it flows to x
    x = frost.tensor([1.5, -0.5], dtype=frost.float64, requires_grad=True)
    a = x * 3.0
    b = a.exp()
    y = (a * b + b).sum()
    y.backward()
    tx = torch.tensor([1.5, -0.5], dtype=torch.float64, requires_grad=True)
    ta = tx * 3.0
    tb = ta.exp()
    (ta * tb + tb).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("order", ["parent_first", "child_first"])
def test_diamond_where_a_parent_is_also_a_grandparent(order):
    # y = a + exp(a): the root's parents are a and a tensor made from a, in either order
    x = frost.tensor([0.5, -1.0], dtype=frost.float64, requires_grad=True)
    a = x * 3.0
    y = (a + a.exp()) if order == "parent_first" else (a.exp() + a)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3.0 * (1 + np.exp(3.0 * x.detach().numpy())), rtol=1e-12)


def test_chain_of_unequal_path_lengths():
    x = frost.tensor(2.0, dtype=frost.float64, requires_grad=True)
    a = x * x
    b = a * 2.0
    c = b + a
    d = c * a + x
    d.backward()
    # d = 3x^2 * x^2 + x = 3x^4 + x -> 12x^3 + 1
    assert x.grad.item() == pytest.approx(12 * 8 + 1)


def test_tensor_used_twice_and_many_times():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    y = x * x * x + x
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.array([1.0, 4.0]) + 1)
    z = frost.tensor(1.0, requires_grad=True)
    total = z
    for _ in range(50):
        total = total + z
    total.backward()
    assert z.grad.item() == 51


def test_grad_accumulates_across_backward_calls():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0])
    x.grad = None
    (x * 4).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])


def test_grad_is_a_fresh_array_not_shared_with_other_leaves():
    a = frost.tensor([1.0, 2.0], requires_grad=True)
    b = frost.tensor([3.0, 4.0], requires_grad=True)
    (a + b).sum().backward()
    a.grad.data += 10
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])


def _op_with_gradients(inputs: tuple, grads: tuple, fresh: bool):
    """A sum of `inputs` whose backward answers `grads` (arrays, one an input) and says fresh_gradients = fresh."""
    def backward(g):
        return grads

    backward.fresh_gradients = fresh
    return from_op(sum(t.data for t in inputs), inputs, backward, "test_op")


def test_a_fresh_gradient_becomes_the_leafs_grad_without_a_copy():
    """A backward that says fresh_gradients = True hands its arrays to empty leaf .grads as they are (PyTorch's
    AccumulateGrad steals such a gradient); any other gradient is copied, and a second contribution, a hook or a
    gradient with gaps keeps the copy (or the sum) as before."""
    a, b = (frost.tensor([1.0, 2.0], requires_grad=True) for _ in range(2))
    ga, gb = np.array([3.0, 4.0], np.float32), np.array([5.0, 6.0], np.float32)
    _op_with_gradients((a, b), (ga, gb), fresh=True).backward(frost.tensor([1.0, 1.0]))
    assert a.grad.data is ga and b.grad.data is gb
    a.grad = b.grad = None
    _op_with_gradients((a, b), (ga, gb), fresh=False).backward(frost.tensor([1.0, 1.0]))
    assert a.grad.data is not ga and not np.shares_memory(a.grad.data, ga)
    np.testing.assert_array_equal(a.grad.numpy(), ga)
    a.grad = None   # the same leaf twice: the sum of both contributions, a new array either way
    _op_with_gradients((a, a), (ga, gb), fresh=True).backward(frost.tensor([1.0, 1.0]))
    np.testing.assert_array_equal(a.grad.numpy(), ga + gb)
    assert not np.shares_memory(a.grad.data, ga) and not np.shares_memory(a.grad.data, gb)
    a.grad, seen = None, []
    a.register_hook(lambda g: seen.append(g))
    _op_with_gradients((a, b), (ga, gb), fresh=True).backward(frost.tensor([1.0, 1.0]))
    hooked = seen[0].data if isinstance(seen[0], frost.Tensor) else seen[0]
    assert not np.shares_memory(a.grad.data, ga) and not np.shares_memory(a.grad.data, hooked)
    c = frost.tensor([1.0, 2.0], requires_grad=True)
    wide = np.arange(4.0, dtype=np.float32)
    _op_with_gradients((c,), (wide[::2],), fresh=True).backward(frost.tensor([1.0, 1.0]))
    assert c.grad.data.flags.c_contiguous and not np.shares_memory(c.grad.data, wide)
    c.grad.data += 1   # accumulation in place must not reach the op's arrays
    np.testing.assert_array_equal(wide, np.arange(4.0))
    d = frost.tensor([1.0, 2.0], dtype=frost.float64, requires_grad=True)   # cast to the leaf's dtype: a new array
    _op_with_gradients((d,), (ga,), fresh=False).backward(frost.tensor([1.0, 1.0], dtype=frost.float64))
    assert d.grad.dtype == frost.float64 and not np.shares_memory(d.grad.data, ga)


def test_a_fresh_gradient_is_added_to_an_existing_grad_in_place():
    a = frost.tensor([1.0, 2.0], requires_grad=True)
    ga = np.array([3.0, 4.0], np.float32)
    _op_with_gradients((a,), (ga,), fresh=True).backward(frost.tensor([1.0, 1.0]))
    _op_with_gradients((a,), (np.array([1.0, 1.0], np.float32),), fresh=True).backward(frost.tensor([1.0, 1.0]))
    np.testing.assert_array_equal(a.grad.numpy(), [4.0, 5.0])
    assert a.grad.data is ga   # the first gradient, kept, then added to


def test_leaf_and_non_leaf_and_retain_grad():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2
    k = x * 3
    k.retain_grad()
    (h * k).sum().backward()
    assert x.is_leaf and not h.is_leaf
    assert h.grad is None
    np.testing.assert_array_equal(k.grad.numpy(), h.detach().numpy())
    assert h.grad_fn is not None and h.grad_fn.name == "mul"


def test_no_grad_context_and_decorator():
    x = frost.ones(2, requires_grad=True)
    with frost.no_grad():
        y = x * 2
        assert not frost.is_grad_enabled()
    assert frost.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None

    @frost.no_grad()
    def f(t):
        return t * 2
    assert not f(x).requires_grad
    assert frost.is_grad_enabled()
    with frost.no_grad():
        with frost.enable_grad():
            assert (x * 2).requires_grad
    with frost.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert frost.is_grad_enabled()


def test_no_grad_decorates_generators_and_works_without_parentheses():
    x = frost.ones(2, requires_grad=True)

    @frost.no_grad()
    def doubled(xs):
        for t in xs:
            assert not frost.is_grad_enabled()
            received = yield t * 2
            assert received is None or received == "ping"
        return "done"

    gen = doubled([x, x])
    first = next(gen)
    assert frost.is_grad_enabled()  # the caller's mode between the steps
    assert not first.requires_grad and not gen.send("ping").requires_grad
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "done"

    @frost.no_grad
    def bare(t):
        return t * 2

    @frost.enable_grad
    def inside(t):
        return t * 2
    assert not bare(x).requires_grad
    with frost.no_grad():
        assert inside(x).requires_grad
    assert frost.is_grad_enabled()


def test_backward_refuses_inputs_changed_in_place_after_their_op_read_them():
    """PyTorch's version counter: the op's backward would read the new values (a silently wrong gradient)."""
    x, w = frost.tensor([[1.0, 1.0]], requires_grad=True), frost.tensor([[2.0, 3.0]], requires_grad=True)
    y = (x * w).sum()
    with frost.no_grad():
        w.mul_(10.0)  # e.g. a weight clipped between forward and backward
    with pytest.raises(RuntimeError, match=r"backward of 'mul': its input 1 \(shape \(1, 2\), frost.float32\) was "
                                           r"changed in place after 'mul' used it \(version 1, used at version 0\)"):
        y.backward()
    a = frost.tensor([3.0, 4.0], requires_grad=True)
    b = frost.tensor([1.0, 1.0])
    z = (a * b).sum()
    b[0] = 100.0  # item assignment into an input that needs no gradient itself
    with pytest.raises(RuntimeError, match="changed in place"):
        z.backward()
    z2 = (a * b).sum()  # made after the change: the op read the new values
    z2.backward()
    np.testing.assert_array_equal(a.grad.numpy(), [100.0, 1.0])
    with frost.no_grad():
        b.add_(1.0)  # after backward(): nothing to refuse
    c = frost.tensor([1.0, 2.0])
    (a * 2).sum().backward()
    c.zero_()  # a tensor no recorded op read
    np.testing.assert_array_equal(a.grad.numpy(), [102.0, 3.0])


@pytest.mark.parametrize("change", ["base after a view was used", "view after its base was used", "detached alias",
                                    "view of a view", "reshaped view", "view as another dtype"])
def test_views_share_their_base_version_as_in_pytorch(change):
    """A change through a view is a change of its base and the other way round (one counter, as torch's)."""
    w = frost.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = frost.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    used, changed = {"base after a view was used": (x[0], x), "view after its base was used": (x, x[1]),
                     "detached alias": (x, x.detach()), "view of a view": (x, x[1:][0, 1:]),
                     "reshaped view": (x[1], x.reshape(6)), "view as another dtype": (x, x.view(frost.int32))}[change]
    y = (w * used).sum()
    changed.zero_() if changed.dtype == frost.float32 else changed.fill_(7)
    with pytest.raises(RuntimeError, match="changed in place after 'mul' used it"):
        y.backward()
    torch_w, torch_x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor([[1.0, 2.0, 3.0], [4., 5, 6]])
    torch_used, torch_changed = {"base after a view was used": (torch_x[0], torch_x),
                                 "view after its base was used": (torch_x, torch_x[1]),
                                 "detached alias": (torch_x, torch_x.detach()),
                                 "view of a view": (torch_x, torch_x[1:][0, 1:]),
                                 "reshaped view": (torch_x[1], torch_x.reshape(6)),
                                 "view as another dtype": (torch_x, torch_x.view(torch.int32))}[change]
    torch_y = (torch_w * torch_used).sum()
    torch_changed.zero_() if torch_changed.dtype == torch.float32 else torch_changed.fill_(7)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch_y.backward()


def test_copies_and_unrelated_tensors_keep_their_own_version():
    w = frost.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = frost.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    y = (w * x[0]).sum()
    for copy in (x[[0, 1]], x.clone(), x + 0, x.t().reshape(6), frost.tensor([1.0, 2.0, 3.0])):
        copy.zero_()
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0, 3.0])


def test_a_refused_in_place_op_changes_no_version():
    """An in-place op refused on a tensor that requires grad changed nothing: the backward must still run."""
    w = frost.tensor([2.0, 3.0], requires_grad=True)
    y = (w * w).sum()
    with pytest.raises(RuntimeError, match="a leaf tensor that requires grad is used in an in-place operation"):
        w.mul_(10.0)
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 6.0])


def test_set_grad_enabled_as_a_plain_call():
    try:
        frost.set_grad_enabled(False)
        assert not frost.is_grad_enabled()
        assert not (frost.ones(2, requires_grad=True) * 2).requires_grad
        frost.set_grad_enabled(True)
        assert frost.is_grad_enabled()
    finally:
        frost.autograd._set_grad_enabled(True)
    with frost.no_grad():
        with frost.set_grad_enabled(True):
            assert frost.is_grad_enabled()
        assert not frost.is_grad_enabled()
    assert frost.is_grad_enabled()
    g = frost.no_grad()  # making one (say, to decorate with) changes nothing until it is entered
    assert frost.is_grad_enabled()
    with g:
        assert not frost.is_grad_enabled()


def test_no_grad_decorator_on_recursive_function_restores_grad_mode():
    @frost.no_grad()
    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)
    assert depth(3) == 3
    assert frost.is_grad_enabled()


def test_no_grad_is_thread_local():
    x = frost.ones(2, requires_grad=True)
    entered, release, result = threading.Event(), threading.Event(), {}

    def other():
        with frost.no_grad():
            entered.set()
            release.wait(5)

    th = threading.Thread(target=other)
    th.start()
    entered.wait(5)
    result["req"] = (x * 2).requires_grad
    release.set()
    th.join()
    assert result["req"] is True


def test_no_grad_restores_after_exception():
    with pytest.raises(ValueError):
        with frost.no_grad():
            raise ValueError("boom")
    assert frost.is_grad_enabled()


def test_detach_shares_data_and_cuts_graph():
    x = frost.ones(3, requires_grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None
    assert np.shares_memory(d.numpy(), y.detach().numpy())
    (d * x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_backward_on_non_scalar_without_gradient_errors():
    x = frost.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"grad can be implicitly created only for scalar outputs.*\(2, 3\)"):
        (x * 2).backward()


def test_backward_with_explicit_gradient():
    x = frost.tensor(RNG.standard_normal((2, 3)), requires_grad=True)
    g = RNG.standard_normal((2, 3))
    (x * x).backward(frost.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy() * g)
    x.grad = None
    (x * 1.0).backward(g)  # a plain array works too
    np.testing.assert_allclose(x.grad.numpy(), g)
    with pytest.raises(RuntimeError, match=r"gradient shape \(3,\) does not match tensor shape \(2, 3\)"):
        (x * 1.0).backward(frost.ones(3, dtype=frost.float64))


def test_backward_gradient_of_other_dtype_is_cast():
    x = frost.ones(2, requires_grad=True)
    (x * 2).backward(np.ones(2, dtype=np.float64))
    assert x.grad.dtype == frost.float32


def test_retain_graph():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])
    with pytest.raises(RuntimeError, match="a second time.*retain_graph=True"):
        y.backward()


def test_backward_without_requires_grad_errors():
    with pytest.raises(RuntimeError, match="does not require grad"):
        frost.ones(2).sum().backward()


@pytest.mark.parametrize("dt", ["int32", "int64", "uint8", "bool"])
def test_requires_grad_on_integer_tensors_errors(dt):
    with pytest.raises(RuntimeError, match="only floating-point tensors can require gradients"):
        frost.zeros(2, dtype=dt, requires_grad=True)
    with pytest.raises(RuntimeError, match="only floating-point"):
        frost.zeros(2, dtype=dt).requires_grad_()
    with pytest.raises(RuntimeError, match="only floating-point"):
        frost.tensor([1, 2], requires_grad=True)


def test_requires_grad_false_on_non_leaf_errors():
    y = frost.ones(2, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="only allowed on leaf tensors"):
        y.requires_grad_(False)


def test_deep_graph_without_recursion_error():
    x = frost.tensor(1.0, dtype=frost.float64, requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0001 + 0.0
    y.backward()
    assert x.grad.item() == pytest.approx(1.0001 ** 5000, rel=1e-9)
    del y  # freeing a 10,000-node chain must not overflow the stack either


def test_inplace_on_leaf_requiring_grad_errors():
    w = frost.ones(3, requires_grad=True)
    for op in [lambda: w.add_(1), lambda: w.mul_(2), lambda: w.sub_(1), lambda: w.div_(2), lambda: w.zero_(),
               lambda: w.fill_(1), lambda: w.copy_(frost.zeros(3)), lambda: w.clamp_(0, 1),
               lambda: w.normal_(), lambda: w.uniform_()]:
        with pytest.raises(RuntimeError, match="leaf tensor that requires grad is used in an in-place operation"):
            op()
    with pytest.raises(RuntimeError, match="in-place"):
        w += 1


def test_inplace_on_leaf_under_no_grad_updates_in_place():
    w = frost.ones(3, requires_grad=True)
    w.grad = frost.ones(3)
    before = w
    with frost.no_grad():
        w -= 0.5 * w.grad
        w.mul_(2)
    assert w is before and w.requires_grad
    np.testing.assert_array_equal(w.detach().numpy(), [1.0, 1.0, 1.0])


def test_inplace_on_non_leaf_in_graph_errors_and_augmented_assignment_records():
    x = frost.ones(3, requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match=r"in-place operations on a tensor that is part of the autograd graph"):
        y.add_(1)
    y += x  # recorded out of place
    y *= 3
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [9.0, 9.0, 9.0])


def test_augmented_assignment_on_plain_tensor_is_in_place():
    t = frost.zeros(3)
    before = t
    t += 1
    t *= 4
    assert t is before
    np.testing.assert_array_equal(t.numpy(), [4.0, 4.0, 4.0])


def test_unbroadcast():
    g = np.ones((2, 3, 4))
    np.testing.assert_array_equal(unbroadcast(g, (3, 1)), np.full((3, 1), 8.0))
    np.testing.assert_array_equal(unbroadcast(g, ()), np.array(24.0))
    assert unbroadcast(g, (2, 3, 4)) is g


# ------------------------------------------------------------------ anomaly mode

def test_anomaly_names_forward_op():
    x = frost.tensor([-1.0, 1.0], requires_grad=True)
    with frost.autograd.detect_anomaly():
        y = x * 2
        with pytest.raises(AnomalyError, match="forward of 'log' produced NaN"), \
                np.errstate(invalid="ignore"):
            frost.log(y)


def test_anomaly_names_backward_op():
    x = frost.tensor([0.0, 4.0], requires_grad=True)
    with frost.autograd.detect_anomaly():
        y = (frost.sqrt(x) * 0).sum()  # sqrt's backward at 0: 0 / 0
        with pytest.raises(AnomalyError, match="backward of 'sqrt' produced NaN in the gradient"), \
                np.errstate(divide="ignore", invalid="ignore"):
            y.backward()


def test_anomaly_mode_takes_infinities_as_pytorch_does():
    """-inf masks and sqrt's infinite gradient at 0 are not anomalies (torch's detect_anomaly looks for NaN)."""
    x = frost.tensor([0.0, 4.0], requires_grad=True)
    scores = frost.tensor([[1.0, 2.0]], requires_grad=True)
    with frost.autograd.detect_anomaly(), np.errstate(divide="ignore"):
        masked = scores.masked_fill(frost.tensor([[False, True]]), float("-inf")).softmax(-1)
        (frost.sqrt(x).sum() + masked.sum()).backward()
    assert x.grad.tolist()[0] == float("inf") and masked.tolist() == [[1.0, 0.0]]


def test_anomaly_is_off_by_default_and_decorator_works():
    assert not frost.autograd.is_anomaly_enabled() or os.environ.get("FROST_DETECT_ANOMALY")
    with np.errstate(invalid="ignore"):
        out = frost.log(frost.tensor([-1.0]))
    assert np.isnan(out.item())

    @frost.detect_anomaly()
    def f():
        return frost.log(frost.tensor([-1.0]))
    with pytest.raises(AnomalyError, match="'log'"), np.errstate(invalid="ignore"):
        f()
    assert not frost.autograd.is_anomaly_enabled()


def test_anomaly_does_not_blame_ops_that_pass_nan_through():
    with frost.autograd.detect_anomaly():
        x = frost.tensor([np.nan, 1.0])
        y = x * 2 + 1  # nan in, nan out: not this op's fault
        assert np.isnan(y.numpy()[0])


def test_anomaly_env_var_in_subprocess():
    code = ("import numpy as np, frost\n"
            "np.seterr(all='ignore')\n"
            "x = frost.tensor([0.0, 1.0], requires_grad=True)\n"
            "try:\n"
            "    (frost.sqrt(x) * 0).sum().backward()\n"
            "except frost.autograd.AnomalyError as e:\n"
            "    print('CAUGHT', e)\n"
            "try:\n"
            "    frost.log(frost.tensor([-2.0]))\n"
            "except frost.autograd.AnomalyError as e:\n"
            "    print('CAUGHT', e)\n")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, FROST_DETECT_ANOMALY="1", PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    assert "backward of 'sqrt'" in lines[0]
    assert "forward of 'log'" in lines[1]


# ------------------------------------------------------------------ random graphs against PyTorch

def _random_program(rng):
    """A random sequence of ops as (name, args) that both frameworks can run on a (3, 4) input."""
    unary = ["exp_small", "tanh", "sigmoid", "square", "neg", "relu", "transpose_back", "softmax", "slice_add"]
    binary = ["add", "mul", "sub", "div_safe", "maximum", "matmul_t", "where"]
    prog = []
    for _ in range(int(rng.integers(3, 9))):
        if rng.random() < 0.5:
            prog.append((str(rng.choice(unary)), int(rng.integers(0, 10))))
        else:
            prog.append((str(rng.choice(binary)), int(rng.integers(0, 10))))
    return prog


def _run_program(prog, xs, lib):
    """Run `prog` on a pool of tensors; every op reads earlier results, so tensors are reused (diamonds)."""
    pool = list(xs)
    for name, k in prog:
        a, b = pool[k % len(pool)], pool[(k * 7 + 1) % len(pool)]
        if name == "exp_small":
            out = (a * 0.1).exp()
        elif name == "tanh":
            out = a.tanh()
        elif name == "sigmoid":
            out = a.sigmoid()
        elif name == "square":
            out = a * a
        elif name == "neg":
            out = -a
        elif name == "relu":
            out = a.relu()
        elif name == "transpose_back":
            out = a.T.reshape(4, 3).reshape(3, 4)
        elif name == "softmax":
            out = a.softmax(-1)
        elif name == "slice_add":
            out = a[:, 1:2] + a
        elif name == "add":
            out = a + b
        elif name == "mul":
            out = a * b
        elif name == "sub":
            out = a - b.sum(0, keepdim=True)
        elif name == "div_safe":
            out = a / (b * b + 1.0)
        elif name == "maximum":
            out = lib.maximum(a, b)
        elif name == "matmul_t":
            out = (a @ b.T) @ a * 0.1
        else:
            out = lib.where(a > b, a, b * 2.0)
        pool.append(out)
    return sum(p.sum() * (i + 1) for i, p in enumerate(pool[len(xs):])) + pool[-1].mean()


@pytest.mark.parametrize("seed", range(25))
def test_random_graphs_match_torch(seed):
    rng = np.random.default_rng(seed)
    prog = _random_program(rng)
    arrays = [rng.standard_normal((3, 4)) for _ in range(2)]
    fx = [frost.tensor(a, requires_grad=True) for a in arrays]
    tx = [torch.tensor(a, requires_grad=True) for a in arrays]
    fy, ty = _run_program(prog, fx, frost), _run_program(prog, tx, torch)
    np.testing.assert_allclose(fy.item(), ty.item(), rtol=1e-10)
    fy.backward()
    ty.backward()
    for f, t in zip(fx, tx):
        if t.grad is None:  # an input the program never read
            assert f.grad is None
            continue
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=str(prog))


def test_backward_frees_the_graph_so_activations_can_be_collected():
    import gc
    import weakref
    x = frost.ones(1000, requires_grad=True)
    h = x * 2
    ref = weakref.ref(h)
    loss = (h * h).sum()
    del h
    loss.backward()
    gc.collect()
    alive = ref()
    holders = [type(r).__name__ + ":" + repr(r)[:200] for r in gc.get_referrers(alive)] if alive is not None else []
    del alive
    assert ref() is None, holders  # loss is still alive, but no longer holds the intermediate tensor
    with pytest.raises(RuntimeError, match="a second time"):
        loss.backward()


def test_retain_graph_keeps_the_graph():
    import weakref
    x = frost.ones(3, requires_grad=True)
    h = x * 2
    ref = weakref.ref(h)
    loss = (h * h).sum()
    del h
    loss.backward(retain_graph=True)
    assert ref() is not None
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [16.0, 16.0, 16.0])


def _pair_taking_op(x, seen):
    """y = 2x whose backward says it takes GradientPairs and records what it got."""
    def backward(g):
        seen.append(type(g).__name__)
        parts = tuple(g) if isinstance(g, GradientPair) else (g,)
        return (2 * sum(parts),)
    backward.takes_gradient_pairs = True
    return from_op(2 * x.data, (x,), backward, "double")


def test_two_gradient_contributions_reach_a_pair_taking_backward_unsummed():
    x = frost.tensor(np.arange(4.0), requires_grad=True)
    seen = []
    y = _pair_taking_op(x, seen)
    (y * 3.0 + y * 5.0).sum().backward()
    assert seen == ["GradientPair"]
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 16.0))


def test_gradient_pairs_are_summed_for_other_ops_retained_grads_and_a_third_contribution():
    x = frost.tensor(np.arange(4.0), requires_grad=True)
    seen = []
    y = _pair_taking_op(x, seen)
    y.retain_grad()
    (y * 3.0 + y * 5.0).sum().backward()
    assert seen == ["ndarray"]  # y keeps its .grad: the sum is made for it
    np.testing.assert_array_equal(y.grad.numpy(), np.full(4, 8.0))
    seen.clear()
    z = _pair_taking_op(x, seen)
    (z * 1.0 + z * 2.0 + z * 4.0).sum().backward()
    assert seen == ["ndarray"]
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 16.0 + 14.0))
    w = frost.tensor(np.arange(4.0), requires_grad=True)
    (w * 3.0 + w * 5.0).sum().backward()  # a leaf: summed into .grad as before
    np.testing.assert_array_equal(w.grad.numpy(), np.full(4, 8.0))


def test_gradients_of_slices_that_tile_a_dim_join_into_one_array():
    x = frost.Tensor(np.arange(24.0).reshape(2, 12), requires_grad=True)
    q, k, v = x.split(4, dim=1)
    (q * 1 + k * 2 + v * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.repeat([[1.0] * 4 + [2.0] * 4 + [3.0] * 4], 2, axis=0))


def test_gradients_of_overlapping_and_partial_slices_add_up_in_zeros():
    x = frost.Tensor(np.arange(24.0).reshape(2, 12), requires_grad=True)
    (x[:, :5].sum() + 2 * x[:, 3:].sum() + 4 * x[0, 1:2].sum()).backward()
    want = np.zeros((2, 12))
    want[:, :5] += 1
    want[:, 3:] += 2
    want[0, 1:2] += 4
    np.testing.assert_array_equal(x.grad.numpy(), want)


def test_placed_gradient_joins_contributions_lying_side_by_side_as_a_view():
    block = np.arange(24.0).reshape(2, 12)
    parts = [((slice(None), slice(4 * i, 4 * i + 4)), block[:, 4 * i:4 * i + 4]) for i in (2, 0, 1)]
    placed = autograd.PlacedGradient(np, (2, 12), block.dtype, parts[:1])
    for p in parts[1:]:
        placed = placed.joined(autograd.PlacedGradient(np, (2, 12), block.dtype, [p]))
    joined = placed.array()
    np.testing.assert_array_equal(joined, block)
    assert np.shares_memory(joined, block)   # the three pieces were one block: no copy
