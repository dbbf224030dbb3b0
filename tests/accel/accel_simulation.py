"""The acceleration layer's kernels on the CPU: a dispatch table holding only the fast paths a test names, registered
for NumPy arrays, their kernels run in the simulator."""
from frost import dispatch
from frost.kernel.api import Kernel


def simulate_only(monkeypatch, *paths) -> list:
    """An empty dispatch table with only `paths` ((op, applies, fn) triples) registered for CPU arrays, kernels run in
    the simulator (everything else stays NumPy's); returns the names of the kernels launched, in order."""
    launched = []
    monkeypatch.setattr(dispatch, "_table", {})
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: launched.append(self.__name__) or self.simulate[cfg])
    for op, applies, fn in paths:
        dispatch.register(op, device="cpu", applies=applies)(fn)
    return launched
