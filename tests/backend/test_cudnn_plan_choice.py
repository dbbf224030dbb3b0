"""How _Graph.tune chooses a plan: cuDNN's run-time-compiled plans are timed only when no precompiled one runs,
except, for attention graphs, the heuristics' first plan (cuDNN's fused attention kernels are compiled at run time,
and the precompiled plans left can be an order of magnitude slower)."""
import json

import numpy as np
import pytest

from frost.backend import cudnn


class FakeGraph(cudnn._Graph):
    """A graph of plans with given times (microseconds) and run-time compilation flags; no cuDNN."""

    def __init__(self, times, compiled_at_run_time, first_plan_always=False):
        self.times, self.flags = times, compiled_at_run_time
        self.plan_count = len(times)
        self.first_plan_always = first_plan_always
        self.timed, self.selected = [], None

    def pack(self, arrays):
        return {}

    def _compiled_at_run_time(self, index):
        return self.flags[index]

    def _time_plan(self, index, pack):
        self.timed.append(index)
        return self.times[index]

    def _select(self, index):
        self.selected = index
        return True


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))


def test_a_convolution_passes_over_a_first_plan_compiled_at_run_time():
    g = FakeGraph([100.0, 900.0, 800.0], [True, False, False])
    g.tune("conv", ())
    assert g.timed == [1, 2] and g.selected == 2


def test_an_attention_graph_times_the_heuristics_first_plan_even_when_compiled_at_run_time():
    g = FakeGraph([100.0, 900.0, 800.0], [True, False, True], first_plan_always=True)
    g.tune("attention", ())
    assert g.timed == [0, 1] and g.selected == 0
    assert cudnn._AttentionGraph.first_plan_always and cudnn._AttentionBackwardGraph.first_plan_always
    assert not cudnn._Graph.first_plan_always


def test_run_time_compiled_plans_are_timed_when_no_precompiled_one_runs():
    g = FakeGraph([float("inf"), 300.0, 200.0], [False, True, True])
    g.tune("only compiled", ())
    assert g.timed == [0, 0, 1, 2] and g.selected == 2   # the first pass timed the precompiled one: it cannot run


def test_a_remembered_choice_is_reused_and_attention_keys_carry_the_rule():
    g = FakeGraph([100.0, 50.0], [False, False])
    g.tune("remembered", ())
    again = FakeGraph([100.0, 50.0], [False, False])
    again.tune("remembered", ())
    assert g.selected == again.selected == 1 and again.timed == []
    arrays = tuple(np.zeros((1, 2, 8, 64), np.float16) for _ in range(5))
    key, _ = cudnn._attention("attention", arrays, 0.125, True, 0.0)
    assert json.loads(key)[-1] == cudnn.ATTENTION_PLAN_RULE   # choices made under an earlier rule are not reused
