"""Public CUDA utilities: frost.cuda.is_available(), synchronize(), memory_allocated()."""
from frost.backend.cuda import (CudaUnavailableError, is_available, synchronize, memory_allocated,  # noqa: F401
                                device_name)
