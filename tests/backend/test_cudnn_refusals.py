"""frost/backend/cudnn.py on the CPU: a product with its bias that cuDNN cannot run is refused once, remembered,
and answered None (the caller then adds the bias itself); a plain product's failure stands."""
import numpy as np
import pytest

from frost.backend import cuda, cudnn


@pytest.fixture
def graphs_on_numpy(monkeypatch):
    """NumPy as the array module and empty tables of graphs and refusals."""
    monkeypatch.setattr(cuda, "cupy", lambda: np)
    for table in ("_graphs", "_untuned", "_refused"):
        monkeypatch.setattr(cudnn, table, {})


def _operands():
    return np.ones((6, 8), np.float32), np.ones((8, 16), np.float32), np.ones(16, np.float32)


def test_a_bias_graph_cudnn_cannot_build_is_refused_once(graphs_on_numpy, monkeypatch):
    builds = []

    def refuse(arrays, activation=None):
        builds.append(len(arrays))
        raise RuntimeError("no engine")
    monkeypatch.setattr(cudnn, "_MatmulGraph", refuse)
    a, b, bias = _operands()
    assert cudnn.matmul(a, b, bias=bias) is None and cudnn.matmul(a, b, bias=bias) is None
    assert builds == [4] and list(cudnn.refusals().values()) == ["RuntimeError: no engine"]


def test_a_built_bias_graph_whose_plans_all_fail_is_refused_on_later_calls_too(graphs_on_numpy, monkeypatch):
    """The real sequence: the graph builds (kept untuned), its tuning finds no plan that runs, the call answers None;
    the next call is refused without building again."""
    builds = []

    class NoPlanRuns:
        def __init__(self, arrays, activation=None):
            builds.append(len(arrays))

        def tune(self, key, arrays, limit=None):
            raise RuntimeError("cuDNN has no usable plan")
    monkeypatch.setattr(cudnn, "_MatmulGraph", NoPlanRuns)
    a, b, bias = _operands()
    assert cudnn.matmul(a, b, bias=bias) is None and cudnn.matmul(a, b, bias=bias) is None
    assert builds == [4] and list(cudnn.refusals().values()) == ["cuDNN has no usable plan"]
    assert not cudnn._untuned and not cudnn._graphs


def test_a_bias_graph_no_plan_runs_is_refused_and_a_plain_products_error_stands(graphs_on_numpy, monkeypatch):
    monkeypatch.setattr(cudnn, "_buildable", lambda key, build: True)

    def no_plan(key, build, arrays, limit=None):
        raise RuntimeError("cuDNN has no usable plan")
    monkeypatch.setattr(cudnn, "_built", no_plan)
    a, b, bias = _operands()
    assert cudnn.matmul(a, b, bias=bias) is None
    assert list(cudnn.refusals().values()) == ["cuDNN has no usable plan"]
    with pytest.raises(RuntimeError, match="no usable plan"):
        cudnn.matmul(a, b)
