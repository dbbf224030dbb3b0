"""How Frost drives the cuDNN frontend: what it must not cost (a torch import at the first convolution)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[2]


def test_convolutions_and_matmuls_through_cudnn_do_not_import_torch(tmp_path):
    # Handed an array, the frontend asks whether it is a torch tensor, importing torch where it is installed: seconds
    # of a cold start-up. Frost hands it bare device addresses. A fresh process, as at a start-up, with empty caches:
    # no kernel choice remembered by earlier tests, so the convolution's first calls run cuDNN's graphs.
    code = ("import sys, frost, frost.nn.functional as F\n"
            "x = frost.randn(2, 3, 8, 8, device='cuda', requires_grad=True)\n"
            "w = frost.randn(4, 3, 3, 3, device='cuda', requires_grad=True)\n"
            "y = F.conv2d(x, w, padding=1)\n"
            "(y.sum() + (x.reshape(2, 192) @ x.reshape(2, 192).T).sum()).backward()\n"
            "frost.cuda.synchronize()\n"
            "from frost.backend import cudnn\n"
            "assert cudnn.stats['graphs'] >= 3, cudnn.stats\n"
            "print('torch' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               FROST_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False", "the cuDNN path imported torch"


def test_matmul_of_broadcast_matrices_and_sums_gradient():
    # sum()'s gradient is a broadcast array (stride 0 along rows and columns): cuDNN has no plan for it as it is
    import numpy as np

    import frost
    from frost.backend import cuda, cudnn
    cp = cuda.cupy()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 192)).astype(np.float32), rng.standard_normal((192, 3)).astype(np.float32)
    ones = cp.broadcast_to(cp.ones((1, 1), cp.float32), (5, 2))
    np.testing.assert_allclose(cp.asnumpy(cudnn.matmul(ones, cp.asarray(a))), np.ones((5, 2)) @ a, rtol=2e-3, atol=2e-3)
    x = frost.tensor(a, device="cuda", requires_grad=True)
    (x @ x.T).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.ones((2, 2)) @ a, rtol=2e-3, atol=2e-3)
    w = frost.tensor(b, device="cuda", requires_grad=True)
    (x @ w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), a.T @ np.ones((2, 3)), rtol=2e-3, atol=2e-3)
