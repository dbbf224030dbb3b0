"""The import layers of ARCHITECTURE.md, checked on frost/'s source: no import circles beyond the allow-list below,
and the floors' contracts (a module imports only from its own floor or below). Imports at module level and inside
functions both count: an import moved into a function to dodge a circle is still a circle."""
import ast
import shutil
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "frost"

# The circles that remain, each as its exact set of modules: a module joining one, or a new circle, fails the test; a
# module leaving one fails it too, so that the entry shrinks with the code. None remain: the tensor's op methods live
# in frost/tensor_methods.py, above the ops (the ops build Tensors, so frost.tensor cannot import them).
ALLOWED_CIRCLES: list[frozenset[str]] = []

# (importer, forbidden targets): a module in or under an importer package must not import from a target package
LAYER_CONTRACTS = [
    # the tensor, the tape and the autocast region sit below every op; Tensor's op methods are added from above
    (("frost.tensor", "frost.autograd", "frost.autocast", "frost.dtype"),
     ("frost.ops", "frost.tensor_methods", "frost.numpy_interop", "frost.dlpack", "frost.nn", "frost.optim",
      "frost.accel", "frost.jit", "frost.data")),
    (("frost.dtype", "frost.layout", "frost.backend"),
     ("frost.ops", "frost.nn", "frost.optim", "frost.data", "frost.models", "frost.bench", "frost.cli",
      "frost.distributed")),
    (("frost.kernel",), ("frost.ops", "frost.nn", "frost.optim", "frost.data", "frost.models")),
    # the kernel language runs on raw arrays (NumPy, CuPy): it must not need the tensor or autograd to load
    (("frost.kernel",), ("frost.tensor", "frost.autograd")),
    (("frost.nn",), ("frost.data", "frost.bench", "frost.cli", "frost.models")),
    (("frost.ops",), ("frost.nn", "frost.optim", "frost.data", "frost.models", "frost.bench", "frost.cli")),
    # the core never imports the acceleration layer: the layer imports the core and registers its fast paths with
    # frost.dispatch, which any core module may ask (so it imports none of them)
    (("frost.ops", "frost.tensor", "frost.autograd", "frost.dispatch"), ("frost.accel",)),
    # whole-step capture asks the layer's pending kernel choices through sources the layer registers with it
    (("frost.jit",), ("frost.accel",)),
    # convolution's math asks the table: cuDNN and our kernels are the layer's (frost/accel/conv.py)
    (("frost.ops.conv",), ("frost.backend.cudnn", "frost.backend.cuda", "frost.kernel")),
    # so do matmul's (cuDNN and the plain float32 kernel: frost/accel/matmul.py) and attention's (flash attention)
    (("frost.ops.matmul", "frost.ops.attention"), ("frost.backend.cudnn", "frost.backend.cuda", "frost.kernel")),
    # and the classifier head's (frost/accel/head.py); pooling asks frost.backend only for its arrays' module
    (("frost.ops.head", "frost.ops.pool"), ("frost.backend.cudnn", "frost.backend.cuda", "frost.kernel")),
    (("frost.dispatch",), ("frost.ops", "frost.tensor", "frost.autograd", "frost.nn", "frost.optim")),
    # hand kernels live in the layer; the optimizers alone keep their fused update kernels beside the update rule
    # (one optimizer per file, frost/optim/lion.py the model)
    (("frost.ops", "frost.nn", "frost.data", "frost.tensor", "frost.autograd", "frost.dispatch", "frost.generator",
      "frost.random", "frost.parallel"), ("frost.kernel",)),
]

Graph = dict[str, dict[str, tuple[str, int]]]  # module -> {imported module: (file, line of its first import)}


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package (a package is its __init__.py)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement may load: the module, and for `from m import a` also m.a (a
    submodule, or a name defined in m)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        base = base[:len(base) - node.level + (1 if is_package else 0)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def owning_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest module name that `name` (a module or a name inside one) falls under, or None outside."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(package_dir: Path) -> Graph:
    """Every import of the package's modules into the package, at any depth in the file. An import of a module's
    own enclosing package (its __init__, which re-exports the package) is left out: every module would otherwise
    sit in a circle with the package face."""
    modules = module_files(package_dir)
    graph: Graph = {m: {} for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        file = path.relative_to(package_dir.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in imported_names(module, is_package, node):
                target = owning_module(name, modules)
                own_package = target is not None and modules[target].name == "__init__.py" and \
                    module.startswith(target + ".")
                if target is None or target == module or own_package:
                    continue
                first = graph[module].get(target)
                if first is None or node.lineno < first[1]:
                    graph[module][target] = (file, node.lineno)
    return graph


def circles(graph: Graph) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(frozenset(group))
    return found


def describe_edges(graph: Graph, group: frozenset[str], involving: frozenset[str] | None = None) -> str:
    """The imports that hold a circle together (those touching `involving` when given), as file:line lines."""
    lines = []
    for module in sorted(group):
        for target, (file, line) in sorted(graph[module].items()):
            if target in group and (involving is None or module in involving or target in involving):
                lines.append(f"  {file}:{line}: {module} imports {target}")
    return "\n".join(lines)


def circle_problems(graph: Graph, allowed: list[frozenset[str]]) -> list[str]:
    """What differs between the graph's circles and the allow-list, one message each."""
    found = circles(graph)
    problems = []
    for group in found:
        if group in allowed:
            continue
        overlapping = [a for a in allowed if a & group]
        if len(overlapping) == 1 and group < overlapping[0]:
            problems.append(f"modules left an allowed import circle: remove {sorted(overlapping[0] - group)} from "
                            f"its ALLOWED_CIRCLES entry in tests/test_layers.py")
        elif len(overlapping) == 1 and group > overlapping[0]:
            joined = group - overlapping[0]
            problems.append(f"modules joined an allowed import circle: {sorted(joined)}; their imports in it:\n"
                            f"{describe_edges(graph, group, joined)}")
        else:
            problems.append(f"import circle not in the allow-list ({len(group)} modules):\n"
                            f"{describe_edges(graph, group)}")
    for group in allowed:
        if not any(group & found_group for found_group in found):
            problems.append(f"an allowed import circle is gone: remove its ALLOWED_CIRCLES entry from "
                            f"tests/test_layers.py ({', '.join(sorted(group)[:3])}, ...)")
    return problems


def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_violations(graph: Graph, contracts: list) -> list[str]:
    """Each import that breaks a contract, as file:line and the rule it breaks."""
    violations = []
    for importers, forbidden in contracts:
        for module in sorted(m for m in graph if within(m, importers)):
            for target, (file, line) in sorted(graph[module].items()):
                if within(target, forbidden):
                    violations.append(f"{file}:{line}: {module} imports {target}; "
                                      f"{' / '.join(importers)} must not import from {', '.join(forbidden)}")
    return violations


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(PACKAGE_DIR)


def test_no_import_circles_beyond_the_allowed_ones(graph):
    problems = circle_problems(graph, ALLOWED_CIRCLES)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_each_floor_imports_only_from_its_own_floor_or_below(graph):
    violations = layer_violations(graph, LAYER_CONTRACTS)
    if violations:
        pytest.fail("imports against ARCHITECTURE.md's floors:\n" + "\n".join(violations), pytrace=False)


def function_level_imports(package_dir: Path) -> list[str]:
    """Each import of the package's own modules made inside a function or method, as file:line: such an import
    hides a dependency from the reader of the file's head (and once hid circles)."""
    found = []
    root = package_dir.name
    for path in sorted(package_dir.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                if node is not function and (any(n == root or n.startswith(root + ".") for n in names)
                                             or getattr(node, "level", 0)):
                    found.append(f"{path.relative_to(package_dir.parent)}:{node.lineno}")
    return sorted(set(found))


def test_frost_modules_are_imported_at_the_head_of_a_file_only():
    offenders = function_level_imports(PACKAGE_DIR)
    if offenders:
        pytest.fail("imports of frost inside functions (move them to the file's head):\n" + "\n".join(offenders),
                    pytrace=False)


def test_a_planted_function_level_import_is_reported(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "", "a.py": "import os\n\n\ndef f():\n    import pkg.b\n    from . import c\n    import json\n",
        "b.py": "from pkg import a\n", "c.py": ""})
    assert function_level_imports(package) == ["pkg/a.py:5", "pkg/a.py:6"]


# GPU kernel modules that moved from the core to the acceleration layer: a copy left behind (or put back) in the
# core would be imported by neither and drift
MOVED_TO_THE_LAYER = {"conv_common", "conv_fprop_mma", "conv_wgrad", "conv_wgrad_mma", "flash_attention"}


def test_the_gpu_kernel_modules_live_in_the_layer_not_in_the_core():
    assert {name for name in MOVED_TO_THE_LAYER if (PACKAGE_DIR / "ops" / f"{name}.py").exists()} == set()
    assert {name for name in MOVED_TO_THE_LAYER if (PACKAGE_DIR / "accel" / f"{name}.py").exists()} == \
        MOVED_TO_THE_LAYER


def test_a_planted_import_of_an_op_into_the_tensor_fails_the_check(tmp_path):
    """The check as CI runs it, on a copy of frost/ whose tensor.py imports an op: the circle and the floor are both
    reported, with the planted line."""
    copy = tmp_path / "frost"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    tensor_file = copy / "tensor.py"
    lines = tensor_file.read_text().count("\n")
    tensor_file.write_text(tensor_file.read_text() + "from frost.ops import elementwise  # planted\n")
    planted = import_graph(copy)
    problems = circle_problems(planted, ALLOWED_CIRCLES)
    assert len(problems) == 1 and f"frost/tensor.py:{lines + 1}: frost.tensor imports frost.ops.elementwise" in \
        problems[0]
    assert any(v.startswith(f"frost/tensor.py:{lines + 1}: frost.tensor imports frost.ops.elementwise")
               for v in layer_violations(planted, LAYER_CONTRACTS))


# ---------------------------------------------------------------- the checker itself, on small made-up packages
def write_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under tmp_path with the given files (relative path -> source)."""
    for rel, source in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path / "pkg"


def test_an_import_inside_a_function_closes_a_circle_and_is_reported_with_its_line(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "from pkg import a\n",
        "a.py": "from pkg.b import f\n",
        "b.py": "def f():\n    from pkg import a\n    return a\n",
        "c.py": "from . import a\n",
    })
    graph = import_graph(package)
    assert circles(graph) == [frozenset({"pkg.a", "pkg.b"})]
    assert graph["pkg.b"]["pkg.a"][1] == 2 and "pkg" not in graph["pkg.a"]   # own package face left out
    assert graph["pkg.c"] == {"pkg.a": ("pkg/c.py", 1)}                       # relative import resolved


def test_circle_problems_name_a_new_circle_a_shrunk_one_and_a_gone_one(tmp_path):
    graph = import_graph(write_package(tmp_path, {
        "__init__.py": "", "a.py": "import pkg.b\n", "b.py": "import pkg.a\n", "c.py": "import pkg.a\n"}))
    ab = frozenset({"pkg.a", "pkg.b"})
    assert circle_problems(graph, [ab]) == []
    new = circle_problems(graph, [])
    assert len(new) == 1 and "not in the allow-list" in new[0] and "pkg/b.py:1: pkg.b imports pkg.a" in new[0]
    shrunk = circle_problems(graph, [ab | {"pkg.c"}])
    assert shrunk == ["modules left an allowed import circle: remove ['pkg.c'] from its ALLOWED_CIRCLES entry in "
                      "tests/test_layers.py"]
    gone = circle_problems(graph, [ab, frozenset({"pkg.c", "pkg.d"})])
    assert len(gone) == 1 and "is gone" in gone[0] and "pkg.c, pkg.d" in gone[0]
    joined = circle_problems(graph, [frozenset({"pkg.a"})])
    assert len(joined) == 1 and "joined an allowed import circle: ['pkg.b']" in joined[0]


def test_layer_violations_name_the_file_line_and_rule(tmp_path):
    graph = import_graph(write_package(tmp_path, {
        "__init__.py": "", "low/__init__.py": "", "high.py": "",
        "low/x.py": "import os\n\ndef f():\n    from pkg import high\n", "lowish.py": "import pkg.high\n"}))
    violations = layer_violations(graph, [(("pkg.low",), ("pkg.high",))])
    assert len(violations) == 1 and violations[0].startswith("pkg/low/x.py:4: pkg.low.x imports pkg.high")
    # the importer prefix matches whole package names: pkg.lowish is not under pkg.low
