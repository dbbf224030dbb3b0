"""benchmarks/*.py write results only where told (--out), never into the tracked benchmarks/results/ by default."""
from __future__ import annotations

import ast
import re
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def output_options(tree: ast.AST) -> list[ast.Call]:
    """The add_argument calls that declare --out or --out-dir."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "attr", None) ==
            "add_argument" and node.args and isinstance(node.args[0], ast.Constant) and
            str(node.args[0].value).startswith("--out")]


def code_strings(tree: ast.AST) -> list[str]:
    """String constants outside docstrings (a path the code could write to)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_script_writes_into_the_results_folder_by_default(script):
    tree = ast.parse(script.read_text())
    for call in output_options(tree):
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        required = any(k.arg == "required" and getattr(k.value, "value", False) for k in call.keywords)
        made_by_hand = script.name == "cifar10_sample.py"  # writes the package's sample file, its one product
        assert required or made_by_hand or default is None or getattr(default, "value", 0) is None, (
            f"{script.name}: {call.args[0].value} has a default; results go only where --out says")
    assert not [s for s in code_strings(tree) if s == "results" or "results/" in s], (
        f"{script.name} names the results folder in its code")


def test_the_results_folder_check_finds_a_default_path(tmp_path):
    # the check above must catch the pattern it replaced
    old = ('p.add_argument("--out", type=Path, default=HERE / "results" / "cpu_step.json")\n')
    tree = ast.parse(old)
    (call,) = output_options(tree)
    assert next(k for k in call.keywords if k.arg == "default").value is not None
    assert "results" in code_strings(tree)


def test_cpu_step_writes_json_only_with_out(tmp_path):
    pytest.importorskip("torch")
    cpu_step = load_script("cpu_step")
    assert cpu_step.parse_args([]).out is None
    assert cpu_step.parse_args(["--out", str(tmp_path / "r.json")]).out == tmp_path / "r.json"
    with pytest.raises(SystemExit, match="is a folder"):  # refused before minutes of timing
        cpu_step.parse_args(["--out", str(tmp_path)])


def test_report_needs_its_output_folder(capsys):
    report = load_script("report")
    with pytest.raises(SystemExit) as exit_info:
        report.main(["some.json"])
    assert exit_info.value.code == 2 and "--out-dir" in capsys.readouterr().err


def test_launch_overhead_times_a_kernel_that_adds_one_and_needs_a_gpu(capsys, monkeypatch):
    import numpy as np
    from frost.backend import cuda
    script = load_script("launch_overhead")
    x = np.arange(1030, dtype=np.float32)
    script.add_one_kernel().simulate[5, 256](x, 1024)   # the timed launch, on the simulator
    np.testing.assert_array_equal(x, np.r_[np.arange(1024) + 1.0, np.arange(1024, 1030)].astype(np.float32))
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["launch_overhead.py"])
    assert script.main() == 1 and "needs a CUDA GPU" in capsys.readouterr().err


def sanitized_test_files() -> list[Path]:
    """The test files benchmarks/gpu_sanitize.sh runs when given none."""
    script = (BENCHMARKS / "gpu_sanitize.sh").read_text()
    block = script[script.index("files=(tests"):]
    block = block[:block.index(")")]
    return [BENCHMARKS.parent / name for name in re.findall(r"tests/\S+?\.py", block)]


def kernel_modules() -> list[str]:
    """The dotted names of frost's modules that define a kernel (a line `@kernel`, at any indentation)."""
    package = BENCHMARKS.parent / "frost"
    return [".".join(path.relative_to(package.parent).with_suffix("").parts) for path in sorted(package.rglob("*.py"))
            if path.parent.name != "kernel" and re.search(r"^\s*@kernel\b", path.read_text(), re.M)]


def test_the_sanitizer_script_runs_a_test_of_every_kernel_module():
    files = sanitized_test_files()
    assert files and all(f.is_file() for f in files), [str(f) for f in files if not f.is_file()]
    texts = [f.read_text() for f in files]
    modules = kernel_modules()
    assert "frost.accel.augment" in modules and "frost.optim.lion" in modules
    untested = [m for m in modules
                if not any(m in t or re.search(rf"from {m.rpartition('.')[0]} import [^\n]*\b{m.rpartition('.')[2]}\b",
                                               t) for t in texts)]
    assert not untested, f"benchmarks/gpu_sanitize.sh runs no test file that imports {untested}"
