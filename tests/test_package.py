"""Packaging conventions: the licence, one version source, py.typed, the public names, and dependencies that match
the imports of frost/."""
import ast
import fnmatch
import importlib.metadata
import importlib.resources
import pydoc
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import frost

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
DISTRIBUTION = PROJECT["name"]

# import name -> (distribution, the group of pyproject that must declare it: "runtime" or an extra's name)
DISTRIBUTION_OF_IMPORT = {
    "numpy": ("numpy", "runtime"),
    "ml_dtypes": ("ml-dtypes", "runtime"),
    "PIL": ("pillow", "runtime"),
    "tqdm": ("tqdm", "runtime"),
    "cupy": ("cupy-cuda13x", "cuda"),
    "cupyx": ("cupy-cuda13x", "cuda"),
    "cuda": ("cuda-bindings", "cuda"),
    "cudnn": ("nvidia-cudnn-frontend", "cuda"),
    "matplotlib": ("matplotlib", "plot"),
    "regex": ("regex", "text"),
    "numba": ("numba", "text"),
    "mpi4py": ("mpi4py", "mpi"),
}
NEVER_IMPORTED = {"torch": "PyTorch is the tests' oracle only"}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them (ml_dtypes == ml-dtypes)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalized(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))


def declared() -> dict[str, set[str]]:
    """group ("runtime" or an extra) -> the distributions it requires."""
    groups = {"runtime": {requirement_name(r) for r in PROJECT["dependencies"]}}
    for extra, requirements in PROJECT["optional-dependencies"].items():
        groups[extra] = {requirement_name(r) for r in requirements}
    return groups


def third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level name of every module imported by a .py file under root (not the standard library, not frost) ->
    the files importing it."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "frost":
                    found.setdefault(top, set()).add(str(path.relative_to(root.parent)))
    return found


def test_import_scan_sees_every_form_of_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("import os\nimport numpy as np\nfrom PIL import Image\nfrom . import b\n"
                                  "def f():\n    import matplotlib.pyplot\n    from frost import nn\n")
    assert third_party_imports(package) == {"numpy": {"pkg/a.py"}, "PIL": {"pkg/a.py"},
                                            "matplotlib": {"pkg/a.py"}}


def test_license_file_is_mit_and_pyproject_names_it():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 The Frost authors" in text
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert "LICENSE" in importlib.metadata.metadata(DISTRIBUTION).get_all("License-File")


def test_version_has_one_source_frost_dunder_version():
    assert "version" not in PROJECT, "pyproject.toml writes the version; frost.__version__ is its one source"
    assert "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "frost.__version__"}
    installed = importlib.metadata.version(DISTRIBUTION)
    assert installed == frost.__version__, (f"installed {DISTRIBUTION} {installed} but frost.__version__ is "
                                            f"{frost.__version__}: reinstall (pip install -e .)")


def test_py_typed_ships_as_package_data():
    assert importlib.resources.files("frost").joinpath("py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["frost"]


def test_every_data_file_in_the_package_is_package_data():
    """A non-Python file under frost/ (py.typed, an embedded data sample) that no package-data pattern names would
    be missing from a wheel, although an editable install finds it."""
    package_data = PYPROJECT["tool"]["setuptools"]["package-data"]
    unlisted = []
    for path in sorted((ROOT / "frost").rglob("*")):
        if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(ROOT)
        if not any(fnmatch.fnmatch(str(relative.relative_to(package.replace(".", "/"))), pattern)
                   for package, patterns in package_data.items() if relative.is_relative_to(package.replace(".", "/"))
                   for pattern in patterns):
            unlisted.append(str(relative))
    assert not unlisted, f"add these to [tool.setuptools.package-data] in pyproject.toml: {unlisted}"


def test_all_lists_names_that_exist_once_each():
    assert len(frost.__all__) == len(set(frost.__all__))
    missing = [name for name in frost.__all__ if not hasattr(frost, name)]
    assert not missing, f"frost.__all__ names {missing}, which frost does not define"
    for name in ("tensor", "zeros", "Tensor", "no_grad", "manual_seed", "float32", "nn", "optim", "kernel", "save"):
        assert name in frost.__all__


def test_star_import_binds_the_public_names():
    namespace: dict = {}
    exec("from frost import *", namespace)
    assert namespace["zeros"] is frost.zeros and namespace["nn"] is frost.nn
    assert set(namespace) - {"__builtins__"} == set(frost.__all__)


def test_help_lists_the_functions_and_classes():
    text = pydoc.render_doc(frost, renderer=pydoc.plaintext)
    functions = text[text.index("\nFUNCTIONS\n"):text.index("\nDATA\n")]
    for name in ("tensor", "zeros", "matmul", "softmax", "manual_seed", "save", "load"):
        assert re.search(rf"^    {name}\(", functions, re.M), f"help(frost) does not list {name}()"
    assert re.search(r"^    class Tensor\b", text, re.M)


def test_every_third_party_import_of_frost_is_declared_in_its_group():
    groups = declared()
    problems = []
    for module, files in sorted(third_party_imports(ROOT / "frost").items()):
        if module in NEVER_IMPORTED:
            problems.append(f"{module} is imported by {sorted(files)}: {NEVER_IMPORTED[module]}")
        elif module not in DISTRIBUTION_OF_IMPORT:
            problems.append(f"{module} (imported by {sorted(files)}) is unknown: declare its distribution in "
                            f"pyproject.toml and map it in DISTRIBUTION_OF_IMPORT")
        else:
            distribution, group = DISTRIBUTION_OF_IMPORT[module]
            if normalized(distribution) not in groups.get(group, set()):
                problems.append(f"{module} (imported by {sorted(files)}) needs {distribution} in pyproject's "
                                f"{'dependencies' if group == 'runtime' else f'{group!r} extra'}")
    assert not problems, "\n".join(problems)


def test_every_runtime_dependency_is_imported_by_frost():
    imported = {normalized(DISTRIBUTION_OF_IMPORT[m][0]) for m in third_party_imports(ROOT / "frost")
                if m in DISTRIBUTION_OF_IMPORT}
    unused = sorted(declared()["runtime"] - imported)
    assert not unused, f"runtime dependencies that frost/ never imports: {unused} (drop them or move them to an extra)"
