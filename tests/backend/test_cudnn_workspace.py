"""cuDNN's workspace: one per device and stream (two streams of a captured step run cuDNN plans at once)."""
import types

import numpy as np

from frost.backend import cuda, cudnn


def fake_cupy(current: dict):
    """Enough of CuPy for _workspace_for: the current device and stream come from `current`."""
    class Buffer:
        def __init__(self, size):
            self.size = size
            self.data = types.SimpleNamespace(ptr=id(self))
    return types.SimpleNamespace(
        uint8=np.uint8, empty=lambda size, dtype: Buffer(size),
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=current["device"]),
                                   get_current_stream=lambda: types.SimpleNamespace(ptr=current["stream"])))


def test_each_stream_gets_its_own_workspace_and_keeps_it(monkeypatch):
    current = {"device": 0, "stream": 11}
    monkeypatch.setattr(cuda, "cupy", lambda: fake_cupy(current))
    monkeypatch.setattr(cudnn, "_workspace", {})
    monkeypatch.setattr(cudnn, "_outgrown_workspaces", [])
    first = cudnn._workspace_for(1024)
    assert cudnn._workspace_for(512) == first  # big enough: the same scratch, so captured graphs keep using it
    current["stream"] = 22
    side = cudnn._workspace_for(1024)
    assert side != first
    current["device"] = 1
    assert cudnn._workspace_for(1024) not in (first, side)
    current.update(device=0, stream=11)
    grown = cudnn._workspace_for(4096)
    assert grown != first and len(cudnn._outgrown_workspaces) == 1  # the old one stays allocated for old graphs
    assert cudnn._workspace_for(4096) == grown
    current["stream"] = 22
    assert cudnn._workspace_for(1024) == side
