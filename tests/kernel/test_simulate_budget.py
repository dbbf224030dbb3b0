"""The simulator's step budget: an endless loop fails naming the kernel, the thread and the line; the limit is set
by frost.kernel.simulate.step_limit or FROST_KERNEL_STEP_LIMIT."""
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

from frost.kernel import Array, SimulationError, device, f32, i32, kernel, syncthreads, tx
from frost.kernel import simulate
from frost.kernel.simulate import StepLimitError


@kernel
def spin_until_flag(flag: Array[i32], out: Array[f32]):
    # thread 1 sets the flag that thread 0 waits for: the simulator runs thread 0 to its end first, so it spins
    if tx == 1:
        flag[0] = 1
    k = 0
    while flag[0] == 0:
        k += 1
    out[tx] = f32(k)


@kernel
def prefix_total(x: Array[f32], out: Array[f32], n: i32):
    acc = 0.0
    for i in range(n):
        acc += x[i]
    out[tx] = acc


@device
def wait_forever(flag: Array[i32]):
    while flag[0] == 0:
        syncthreads()


@kernel
def spin_at_barrier(flag: Array[i32]):
    wait_forever(flag)


def _line_of(kernel_or_device, text: str) -> int:
    """The file line of the first line of a kernel's (or device function's) source that contains text."""
    lines, first = inspect.getsourcelines(kernel_or_device.fn)
    return first + next(k for k, line in enumerate(lines) if text in line)


def test_endless_loop_fails_naming_kernel_thread_and_line(monkeypatch):
    monkeypatch.setattr(simulate, "step_limit", 20_000)
    line = _line_of(spin_until_flag, "while flag[0] == 0:")
    with pytest.raises(StepLimitError, match=rf"spin_until_flag: block \(0, 0, 0\) thread \(0, 0, 0\) at "
                                             rf".*test_simulate_budget.py:{line}: more than 20000 loop iterations"):
        spin_until_flag.simulate[1, 2](np.zeros(1, np.int32), np.zeros(2, np.float32))


def test_step_limit_error_is_a_simulation_error():
    assert issubclass(StepLimitError, SimulationError)


def test_endless_loop_with_barriers_in_a_device_function(monkeypatch):
    # the generator path (barriers): the loop is in a device function, every thread spins
    monkeypatch.setattr(simulate, "step_limit", 1_000)
    line = _line_of(wait_forever, "while flag[0] == 0:")
    with pytest.raises(StepLimitError, match=rf"spin_at_barrier: block \(0, 0, 0\) thread \(0, 0, 0\) at "
                                             rf".*test_simulate_budget.py:{line}: more than 1000 loop iterations"):
        spin_at_barrier.simulate[1, 32](np.zeros(1, np.int32))


def test_default_budget_stops_an_endless_loop():
    assert 10 ** 6 <= simulate.step_limit <= 10 ** 8


def test_low_budget_fails_a_long_loop_and_high_budget_passes(monkeypatch):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    out = np.zeros(4, np.float32)
    monkeypatch.setattr(simulate, "step_limit", 999)
    line = _line_of(prefix_total, "for i in range(n):")
    with pytest.raises(StepLimitError, match=rf"prefix_total: block \(0, 0, 0\) thread \(0, 0, 0\) at "
                                             rf".*test_simulate_budget.py:{line}: more than 999 loop"):
        prefix_total.simulate[1, 4](x, out, 1000)
    monkeypatch.setattr(simulate, "step_limit", 1000)  # per thread: 4 threads of 1000 iterations each fit
    prefix_total.simulate[1, 4](x, out, 1000)
    np.testing.assert_allclose(out, np.full(4, x.astype(np.float64).sum()), rtol=1e-4)


def test_budget_from_the_environment():
    env = dict(os.environ, FROST_KERNEL_STEP_LIMIT="1234")
    code = "from frost.kernel import simulate; print(simulate.step_limit)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1234"
