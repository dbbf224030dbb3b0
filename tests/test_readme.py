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


def test_every_readme_python_block_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3
    outputs = []
    for k, code in enumerate(blocks[1:]):  # the first is run (and its accuracy checked) above
        script = tmp_path / f"block{k}.py"  # a file: kernels read their own source
        script.write_text(code)
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{code}\n{out.stderr}"
        outputs.append(out.stdout)
    assert "out[i] = " in outputs[0]  # the kernel's generated CUDA C++ line
    assert outputs[1].strip() == "22044"
