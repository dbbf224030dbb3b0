"""The kernel examples: every kernel compiles to sm_90, runs (simulated here, launched on a GPU) and matches NumPy;
a second process finds the compiled cubins in the disk cache."""
import json
import os
import subprocess
import sys

import pytest

from frost.kernel import Kernel

from examples_loader import EXAMPLES, load_example

NAMES = ["relu", "adamw", "block_reduce", "softmax"]


@pytest.mark.parametrize("name", NAMES)
def test_example_compiles_and_runs(name):
    mod = load_example(name)
    kernels = [v for v in vars(mod).values() if isinstance(v, Kernel)]
    assert kernels
    for k in kernels:
        assert k.compile("sm_90")[:4] == b"\x7fELF"
    mod.main()


SCRIPT = """
import json, sys
sys.path.insert(0, {examples!r})
import importlib.util
spec = importlib.util.spec_from_file_location("ex", {path!r})
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
from frost.kernel import compile_stats
mod.softmax_rows.compile("sm_90")
print(json.dumps(compile_stats))
"""


def test_second_process_loads_from_disk_cache(tmp_path):
    env = dict(os.environ, FROST_CACHE_DIR=str(tmp_path))
    code = SCRIPT.format(examples=str(EXAMPLES), path=str(EXAMPLES / "softmax.py"))
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for _ in range(2)]
    assert runs[0]["nvrtc_seconds"] > 0 and runs[1]["nvrtc_seconds"] == 0
    assert [(r["nvrtc_compiles"], r["disk_hits"]) for r in runs] == [(1, 0), (0, 1)]


def test_prefetch_compiles_in_the_background_and_launch_waits_for_it(tmp_path, monkeypatch):
    """Kernel.prefetch queues the NVRTC compile on the background threads; compile() then takes that cubin (one
    NVRTC run, no second compile) and a compile error raised in the background surfaces in the caller."""
    from frost.kernel import Array, f32, kernel, tx
    from frost.kernel import compile as kcompile
    from frost.kernel.frontend import KernelError
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))

    @kernel
    def scale_prefetched(x: Array[f32], a: f32):
        x[tx] *= a

    before, waits = kcompile.stats["nvrtc_compiles"], len(kcompile.waits)
    scale_prefetched.prefetch("sm_90")
    assert scale_prefetched.specialize()._pending  # queued, not yet taken
    assert scale_prefetched.compile("sm_90")[:4] == b"\x7fELF"
    assert kcompile.stats["nvrtc_compiles"] - before == 1
    assert not scale_prefetched.specialize()._pending
    # the wait for the cubin is recorded (a start-up's critical path): a prefetched one, then one compiled on asking
    assert kcompile.waits[waits:] == [(scale_prefetched.specialize().checked.cname, kcompile.waits[-1][1], True)]

    @kernel
    def scale_asked(x: Array[f32], a: f32):
        x[tx] *= a

    scale_asked.compile("sm_90")
    assert kcompile.waits[-1][0] == scale_asked.specialize().checked.cname and kcompile.waits[-1][2] is False
    assert kcompile.waits[-1][1] > 0 and kcompile.stats["launch_waits"] >= 2

    @kernel
    def shift_prefetched(x: Array[f32], a: f32):
        x[tx] += a

    def failing(*args):
        raise KernelError("NVRTC could not compile kernel 'shift_prefetched'")
    monkeypatch.setattr(kcompile, "_nvrtc_compile", failing)
    shift_prefetched.prefetch("sm_90")  # fails on a background thread: nothing raised yet
    with pytest.raises(KernelError, match="could not compile kernel 'shift_prefetched'"):
        shift_prefetched.compile("sm_90")
