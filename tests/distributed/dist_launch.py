"""Starting `frost run` from the tests."""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def frost_run(*args, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m frost.distributed.run ARGS` from the repository root, its output captured."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "frost.distributed.run", *map(str, args)], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=timeout)
