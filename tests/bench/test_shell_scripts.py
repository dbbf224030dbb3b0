"""The GPU rounds under benchmarks/ (*.sh) parse as bash: a typo fails here, not in a device call."""
import shutil
import subprocess
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.sh")), ids=lambda p: p.name)
def test_the_script_parses(script):
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
