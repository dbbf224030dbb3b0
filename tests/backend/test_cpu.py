"""Tests for frost/backend/cpu.py: the global CPU generator and a thread's own (use_generator)."""
import threading

import numpy as np

import frost
from frost.backend import cpu


def test_use_generator_is_the_calling_threads_alone_and_restores_the_global_one():
    frost.manual_seed(3)
    own = np.random.default_rng(7)
    seen = {}

    def other_thread():
        seen["other"] = cpu.generator()

    with cpu.use_generator(own) as rng:
        assert rng is own and cpu.generator() is own
        np.testing.assert_array_equal(frost.rand(4).numpy(), np.random.default_rng(7).random(4, dtype=np.float32))
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        with cpu.use_generator(np.random.default_rng(8)):
            assert cpu.generator() is not own
        assert cpu.generator() is own  # nested blocks restore the outer one
    assert seen["other"] is cpu.generator() and cpu.generator() is not own
    # the global generator was not drawn from inside the block
    np.testing.assert_array_equal(frost.rand(4).numpy(), np.random.default_rng(3).random(4, dtype=np.float32))
