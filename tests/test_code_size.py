"""The README states the size of the core and of the acceleration layer; these tests keep the statement true and the
core from growing past its budget unnoticed."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "frost"

# the core: what a reader needs to follow a training step on the CPU (ARCHITECTURE.md's reference core)
CORE = ["tensor.py", "tensor_methods.py", "autograd.py", "dtype.py", "autocast.py", "dispatch.py", "ops", "nn",
        "optim", "data", "parallel.py"]
# the acceleration layer: kernels, plans, bindings and capture, registered with the core
LAYER = ["accel", "kernel", "backend", "jit.py"]
CORE_BUDGET = 16_000  # raise it on purpose, with the README's figure, or fold something


def lines_of(parts: list[str]) -> int:
    """Non-blank lines of the .py files under the given parts of frost/."""
    total = 0
    for part in parts:
        path = PACKAGE / part
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        total += sum(1 for f in files for line in f.read_text().splitlines() if line.strip())
    return total


def stated(label: str) -> int:
    """The README's 'about N lines' for the bullet that starts with **label**."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"\*\*" + re.escape(label) + r"\*\*, about ([\d,]+) lines", text)
    assert match, f"README.md: no '**{label}**, about N lines' bullet"
    return int(match.group(1).replace(",", ""))


def test_the_core_stays_within_its_budget():
    assert lines_of(CORE) <= CORE_BUDGET, (f"the core has {lines_of(CORE)} non-blank lines, over its budget of "
                                           f"{CORE_BUDGET}: fold what repeats, or move a speed path into frost/accel")


def test_the_readme_states_both_sizes_to_within_ten_percent():
    for label, parts in (("The core", CORE), ("The acceleration layer", LAYER)):
        actual = lines_of(parts)
        assert abs(stated(label) - actual) <= 0.1 * actual, \
            f"README.md says {label.lower()} is about {stated(label)} lines; it has {actual} non-blank lines"

