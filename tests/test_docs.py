"""The documents' Python code runs as written: every python block, in order, in one namespace, in a subprocess."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOCUMENTS = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md")),
             *sorted((ROOT / "examples").rglob("*.md"))]

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


def test_kernel_language_reference_runs_in_the_simulator(tmp_path):
    stdout = run_document("kernels.md", tmp_path)
    assert "adamw_update: matches NumPy" in stdout
    assert "// and % truncate: [3, -3, -3, 3] [1, -1, 1, -1]" in stdout
    assert "row_stats: three specializations match NumPy" in stdout
    assert re.search(r"simulator: off_by_one: block \(0, 0, 0\) thread \(31, 0, 0\) at "
                     r".*kernels_block\d+_line\d+.py:\d+: index 31 is out of bounds for array 'x'", stdout), stdout
    assert re.search(r"type checker: .*: in accumulates_in_an_integer: local 'acc' has type i32", stdout), stdout
    assert "cuda_source parameters: [('x', 'float*'), ('y', 'float*'), ('n', 'int')]" in stdout
    assert "generated: " in stdout and "sqrt" in stdout


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_github_anchor_drops_punctuation():
    assert github_anchor("Optimizers (20,000 steps; a.json)") == "optimizers-20000-steps-ajson"


def test_every_link_of_the_documents_reaches_a_file_and_heading():
    broken = []
    for document in DOCUMENTS:
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", document.read_text(), flags=re.S | re.M))
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", prose):
            if target.startswith(("http://", "https://")):
                continue
            path = (document.parent / target).resolve() if target else document
            if not path.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in {
                    github_anchor(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}:
                broken.append(f"{document.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, f"broken links: {broken}"


def test_every_markdown_file_the_code_names_exists():
    """Docstrings and comments that send the reader to a .md file (a path, or a bare name found in the tree)."""
    named = {path.name for path in ROOT.rglob("*.md") if ".venv" not in path.parts}
    sources = [*ROOT.glob("frost/**/*.py"), *ROOT.glob("examples/**/*.py"), *ROOT.glob("benchmarks/*.py"),
               *DOCUMENTS]
    missing = []
    for source in sources:
        for reference in re.findall(r"(?<![\w/.-])(?:\.{1,2}/|[\w-]+/)*[\w-]+\.md\b", source.read_text()):
            found = ((ROOT / reference).exists() or (source.parent / reference).exists()) if "/" in reference \
                else reference in named
            if not found:
                missing.append(f"{source.relative_to(ROOT)}: {reference}")
    assert not missing, f"references to missing documents: {missing}"


def test_text_guide_runs_as_written(tmp_path):
    stdout = run_document("text.md", tmp_path)
    assert "299 hear me speak<|endoftext|>" in stdout
    assert "(4, 32) True" in stdout


def test_gpt_guide_runs_as_written(tmp_path):
    stdout = run_document("gpt.md", tmp_path)
    assert "(1, 25) (1, 25)" in stdout


def test_distributed_guide_trains_on_two_processes(tmp_path):
    pytest.importorskip("mpi4py")
    stdout = run_document("distributed.md", tmp_path)
    assert "weights [1.0, -2.0, 0.5, 3.0]" in stdout, stdout
