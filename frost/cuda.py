"""Public CUDA utilities: frost.cuda.is_available(), synchronize(), memory_allocated(), get_rng_state() and
set_rng_state() (a GPU's Philox seed and offset: frost.random)."""
from frost.backend.cuda import (CudaUnavailableError, is_available, synchronize, memory_allocated,  # noqa: F401
                                device_name)
from frost.random import get_cuda_rng_state as get_rng_state, set_cuda_rng_state as set_rng_state  # noqa: F401
