"""The README's Python code runs as written."""
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quick_start_runs_and_learns():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python code block"
    out = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    accuracy = float(re.search(r"accuracy ([\d.]+)%", out.stdout).group(1))
    assert accuracy > 90, out.stdout
