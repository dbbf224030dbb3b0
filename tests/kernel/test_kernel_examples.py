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
    assert runs[0] == {"nvrtc_compiles": 1, "disk_hits": 0}
    assert runs[1] == {"nvrtc_compiles": 0, "disk_hits": 1}
