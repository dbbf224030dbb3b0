"""The documents' Python code runs as written: every python block, in order, in one namespace, in a subprocess."""
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"

# Each block is written to its own file, padded with blank lines so that its line numbers are the document's:
# a traceback (or a kernel compile error) then points at the line of the .md file. Executing the file (not a
# string) also lets @kernel read the function's source.
RUNNER = """
import sys
namespace = {"__name__": "__main__"}
for path in sys.argv[1:]:
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), namespace)
"""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block."""
    return [(text.count("\n", 0, match.start(1)) + 1, match.group(1))
            for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def test_block_extraction_finds_every_block():
    text = "intro\n```python\na = 1\n```\ntext\n```\nnot python\n```\n```python\nb = a + 1\nprint(b)\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (10, "b = a + 1\nprint(b)\n")]


def run_document(name: str, folder: Path) -> str:
    """Run every python block of docs/<name> in order in one fresh interpreter; returns what it printed."""
    text = (DOCS / name).read_text()
    blocks = python_blocks(text)
    assert blocks, f"{name} has no python block"
    assert text.count("```python") == len(blocks), f"{name}: a python block is not closed by ``` on its own line"
    paths = []
    for i, (line, code) in enumerate(blocks):
        path = folder / f"{Path(name).stem}_block{i:02d}_line{line}.py"
        path.write_text("\n" * (line - 1) + code)
        paths.append(str(path))
    out = subprocess.run([sys.executable, "-c", RUNNER, *paths], capture_output=True, text=True, timeout=300,
                         cwd=folder)
    assert out.returncode == 0, f"{name}: a code block failed\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_writing_an_optimizer_runs_trains_and_tests_its_optimizer(tmp_path):
    stdout = run_document("writing-an-optimizer.md", tmp_path)
    assert "signum: all tests pass" in stdout
    assert "anomaly: gradient of parameter '2.bias'" in stdout
    accuracy = int(re.search(r"accuracy (\d+)%", stdout).group(1))
    assert accuracy > 85, stdout


def test_differences_from_pytorch_runs_as_written(tmp_path):
    stdout = run_document("differences-from-pytorch.md", tmp_path)
    assert "refused: add_: an operand requires grad" in stdout
    assert "integer division by zero" in stdout
    assert "anomaly: forward of 'log' produced NaN" in stdout
    assert "refused: SGD: some parameters appear more than once" in stdout
