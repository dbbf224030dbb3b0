"""Shared test setup: GPU tests are skipped where no GPU (or no CuPy) is present."""
import pytest


def _cuda_available() -> bool:
    try:
        from frost.backend import cuda
        return cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # The oracle's intra-op threads fight NumPy's BLAS threads on a 2-core CI machine; one thread each keeps
    # the suite's wall time predictable.
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass


@pytest.fixture
def exact_gpu_math():
    """float32 GPU math without TF32 and with deterministic cuDNN plans, for comparisons that must be tight."""
    import frost
    saved = frost.backends.allow_tf32, frost.backends.deterministic
    frost.backends.allow_tf32, frost.backends.deterministic = False, True
    yield
    frost.backends.allow_tf32, frost.backends.deterministic = saved
