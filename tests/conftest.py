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


def pytest_addoption(parser):
    parser.addoption("--poison-gpu-memory", action="store_true",
                     help="fill every CuPy allocation with 0xFF bytes (NaN in float32, bf16 and fp16) before use, so "
                          "that an element a kernel leaves unwritten fails its test instead of holding an earlier "
                          "result (compute-sanitizer's initcheck misses some stores)")


def _poisoning_allocator():
    """The default pool's malloc, each new block filled with 0xFF and the fill finished before the block is used
    (a kernel on another stream may write it next); left as it is while a stream is being captured, where neither
    may run."""
    import cupy as cp
    pool = cp.get_default_memory_pool()

    def malloc(size: int):
        memory = pool.malloc(size)
        if size and not capturing():
            memory.memset(0xFF, size)
            cp.cuda.runtime.deviceSynchronize()
        return memory

    def capturing() -> bool:
        try:
            return cp.cuda.get_current_stream().is_capturing()
        except cp.cuda.runtime.CUDARuntimeError:   # the legacy stream, with a capture elsewhere in the process
            return True
    return malloc


def pytest_configure(config):
    if config.getoption("--poison-gpu-memory") and _cuda_available():
        import cupy as cp
        cp.cuda.set_allocator(_poisoning_allocator())
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
