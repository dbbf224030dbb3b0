"""The README: set-up first, the two commands as CI runs them, a quick start that runs as written, one short results
table, and links that exist."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"
SECTIONS = ["Install", "The two commands", "Quick start", "Results", "How the code is laid out", "More"]
TABLE_RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$", re.M)  # the |---|---| line under a table's header


def sections(text: str) -> dict[str, str]:
    """Level-2 heading -> that section's text."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def code_lines(text: str) -> list[str]:
    """The lines of every fenced code block that is not Python (the shell commands), without comments."""
    blocks = re.findall(r"^```\n(.*?)^```", text, re.S | re.M)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_quick_start_runs_as_written_and_learns(tmp_path):
    blocks = re.findall(r"^```python\n(.*?)^```", sections(README.read_text())["Quick start"], re.S | re.M)
    assert len(blocks) == 1, "the quick start is one python block"
    script = tmp_path / "quick_start.py"
    script.write_text(blocks[0])
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    accuracy = float(re.search(r"accuracy ([\d.]+)%", out.stdout).group(1))
    assert accuracy > 90, out.stdout


def test_readme_starts_with_set_up_in_the_newcomers_order():
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == SECTIONS, f"README sections {headings}, expected {SECTIONS}"
    lines = text.splitlines()
    install_line = next(i for i, line in enumerate(lines) if line.startswith("pip install -e .")) + 1
    assert install_line <= 40, f"the install command is on line {install_line}; set-up belongs near the top"
    assert len(text.split("\n## ")[0].strip().split("\n\n")) == 2, "the introduction is a title and one paragraph"


def test_one_short_results_table_with_its_command():
    text = README.read_text()
    tables = TABLE_RULE.findall(text)
    assert len(tables) == 1, f"the README has {len(tables)} tables; the long ones belong in benchmarks/RESULTS.md"
    results = sections(text)["Results"]
    assert TABLE_RULE.search(results), "the table is in the Results section"
    rows = [line for line in results.splitlines() if line.startswith("|")]
    assert len(rows) <= 2 + 6, f"{len(rows) - 2} rows: keep the README's table short"
    assert any("Frost" in row for row in rows) and any("PyTorch" in row for row in rows)
    assert "frost bench resnet-cifar10" in "\n".join(code_lines(results))
    assert "benchmarks/RESULTS.md" in results


def test_the_two_commands_are_the_main_job_and_the_tests():
    commands = code_lines(sections(README.read_text())["The two commands"])
    assert "frost bench resnet-cifar10" in commands
    assert 'pip install -e ".[dev]"' in commands
    assert 'pytest -m "not cuda"' in commands
    install = code_lines(sections(README.read_text())["Install"])
    assert "pip install -e ." in install and 'pip install -e ".[cuda]"' in install


def test_ci_installs_and_runs_what_the_readme_says_then_lints():
    readme_commands = code_lines(sections(README.read_text())["The two commands"])
    ci = [line.strip() for line in CI.read_text().splitlines() if line.strip() and not line.startswith("#")]
    install = 'pip install -e ".[dev]"'
    assert install in readme_commands and install in ci
    installs = [line for line in ci if "pip install" in line]
    assert installs == [install], f"CI installs {installs}; the README says {install}"
    tests = [i for i, line in enumerate(ci) if shlex.split(line)[:3] == ["pytest", "-m", "not cuda"]]
    assert len(tests) == 1, "CI runs the README's test command, pytest -m \"not cuda\""
    lint = [i for i, line in enumerate(ci) if line.startswith("ruff check")]
    assert lint and lint[0] > tests[0], "the lint step runs after the tests"
    assert shlex.split(ci[lint[0]])[2:] == ["frost", "tests", "benchmarks", "examples"]
    assert "==" not in "\n".join(ci), "CI pins nothing: the versions are pyproject's"


def test_readme_links_point_at_files_that_exist():
    prose = re.sub(r"`[^`\n]*`", "", README.read_text())  # `k[grid, block](...)` in code is no link
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose)
    assert links
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
