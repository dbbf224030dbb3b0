"""Loads the scripts of examples/kernels as modules (they are not a package), for the kernel tests."""
import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kernels"


def load_example(name: str) -> ModuleType:
    """A fresh module of examples/kernels/<name>.py (each call executes the file again)."""
    spec = importlib.util.spec_from_file_location(f"frost_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
