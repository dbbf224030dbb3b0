"""Public CUDA utilities: frost.cuda.is_available(), synchronize(), memory_allocated(), branch()."""
from frost.autograd import branch  # noqa: F401
from frost.backend.cuda import is_available, synchronize, memory_allocated, device_name  # noqa: F401
