"""Public CUDA utilities: frost.cuda.is_available(), synchronize(), memory_allocated()."""
from frost.backend.cuda import is_available, synchronize, memory_allocated, device_name  # noqa: F401
