"""A snapshot of the kernel language's generated code, to show that a change of the front end or of the builders
(the CUDA C++ generator, the simulator's) leaves every generated source byte for byte as it was.

Each specialization of a kernel is recorded as a hash of its CUDA C++ (`Spec.source`) and a hash of the simulator's
Python for it and its device functions (`Checked.sim_code`), or of the KernelError it raised, under the kernel's
file, line and name. Two ways to collect them:
- `static_snapshot()`: every `@kernel` that importing Frost's packages, frost.kernel.lib, examples/kernels and the
  kernel tests defines (module level or made by a factory as a module loads), specialized with its Consts' defaults
  and, for the kernels without defaults, with the representative values of REPRESENTATIVE (below).
- this file as a pytest plugin: every specialization that a test run makes, factories and kernels inside test
  functions included, as the tests make them:

    PYTHONPATH=tests/kernel FROST_CODEGEN_SNAPSHOT=/tmp/before.json \
        pytest -p codegen_snapshot -p no:cacheprovider -m "not cuda" tests/kernel tests/accel ...
    python tests/kernel/codegen_snapshot.py compare /tmp/before.json /tmp/after.json

The repository's directory is hashed as a placeholder, so the "before" run may be made in a copy of the repository
with the code before the change (PYTHONPATH=COPY:COPY/tests/kernel, from COPY).
"""
from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.util
import json
import os
import pkgutil
import sys
from pathlib import Path

from frost.kernel import api
from frost.kernel.frontend import KernelError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("frost.accel", "frost.optim", "frost.ops", "frost.data", "frost.kernel.lib")
SCRIPT_DIRS = ("examples/kernels", "tests/kernel")

# Consts for the module-level kernels that have no defaults for them: values the library itself launches with
REPRESENTATIVE: dict[str, list[dict]] = {
    "layer_norm_forward": [dict(WEIGHT=True, BIAS=True, RMS=False), dict(WEIGHT=False, BIAS=False, RMS=True)],
    "layer_norm_forward_vec4": [dict(WEIGHT=True, BIAS=True, RMS=False)],
    "layer_norm_backward": [dict(K=4, WEIGHT=True, RMS=False), dict(K=1, WEIGHT=False, RMS=True)],
    "layer_norm_param_grads": [dict(WEIGHT=True, BIAS=True)],
    "layer_norm_forward_vec8": [dict(WEIGHT=True, BIAS=True, RMS=False)],
    "layer_norm_backward_vec8": [dict(K=2, WEIGHT=True, RMS=False), dict(K=1, WEIGHT=False, RMS=True)],
    "dropout_apply": [dict(VECTOR=True), dict(VECTOR=False)],
    "batch_norm_stats_partial": [dict(U=4)],
    "batch_norm_stats_partial_nhwc": [dict(U=4)],
    "batch_norm_apply": [dict(relu=True, add_residual=True, fused=True), dict(relu=False, add_residual=False,
                                                                              fused=False)],
    "batch_norm_apply_nhwc": [dict(relu=True, add_residual=True, fused=True, U=4)],
    "batch_norm_backward_partial": [dict(relu=True, U=4)],
    "batch_norm_backward_partial_nhwc": [dict(relu=True, U=4)],
    "batch_norm_backward_input": [dict(relu=True, add_residual=True, fused=True)],
    "batch_norm_backward_input_nhwc": [dict(relu=True, add_residual=True, fused=True, U=4)],
    "gelu_forward": [dict(TANH=True), dict(TANH=False)],
    "gelu_backward": [dict(TANH=True), dict(TANH=False)],
    "gelu_forward_vec4": [dict(TANH=True)],
    "gelu_backward_vec4": [dict(TANH=True)],
    "gelu_forward_vec8": [dict(TANH=True)],
    "gelu_backward_vec8": [dict(TANH=True)],
}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _where(filename: str) -> tuple[str, str]:
    """(the file as the snapshot names it, the directory to hide): files outside the repository (a test's tmp_path)
    are named by their base name, so that two runs agree."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(ROOT)), ""
    except ValueError:
        return path.name, str(path.parent)


def _normal(text: str, hide: str) -> str:
    """text with the repository's directory (in #line directives and messages) and `hide` made placeholders, so
    that a copy of the repository elsewhere (the code before a change) records the same hashes."""
    text = text.replace(hide, "<outside>") if hide else text
    return text.replace(str(ROOT), "<repository>")


def kernel_key(k: api.Kernel) -> str:
    name, _ = _where(k.src.filename)
    return f"{name}:{k.src.offset + 1}:{k.__name__}"


def spec_record(spec: api.Spec, consts: dict, hide: str) -> str:
    """'consts cuda=HASH sim=HASH' of one specialization (the simulator's code built here if not yet built)."""
    try:
        spec.sim  # noqa: B018 (builds the simulator's functions, which sets sim_code)
        sim = _digest("\n".join(f.sim_code for f in spec.devices + [spec.checked]))
    except Exception as exc:  # the simulator refuses what the C++ generator took: that is part of the record
        sim = "error " + _digest(_normal(f"{type(exc).__name__}: {exc}", hide))
    return f"{sorted(consts.items())!r} cuda={_digest(_normal(spec.source, hide))} sim={sim}"


def error_record(consts: dict, exc: Exception, hide: str) -> str:
    return f"{sorted(consts.items())!r} error={_digest(_normal(f'{type(exc).__name__}: {exc}', hide))}"


class Recorder:
    """Records every Spec made (a pytest plugin while FROST_CODEGEN_SNAPSHOT names the output file)."""

    def __init__(self) -> None:
        self.records: dict[str, set] = {}
        self.original = api.Spec.__init__

    def install(self) -> None:
        recorder, original = self, self.original

        def init(spec, kernel, consts):
            key = kernel_key(kernel)
            _, hide = _where(kernel.src.filename)
            try:
                original(spec, kernel, consts)
            except Exception as exc:
                recorder.records.setdefault(key, set()).add(error_record(consts, exc, hide))
                raise
            recorder.records.setdefault(key, set()).add(spec_record(spec, consts, hide))
        api.Spec.__init__ = init

    def uninstall(self) -> None:
        api.Spec.__init__ = self.original

    def as_json(self) -> dict:
        return {k: sorted(v) for k, v in sorted(self.records.items())}


_recorder: Recorder | None = None


def pytest_configure(config) -> None:
    global _recorder
    if os.environ.get("FROST_CODEGEN_SNAPSHOT"):
        _recorder = Recorder()
        _recorder.install()


def pytest_unconfigure(config) -> None:
    if _recorder is not None:
        _recorder.uninstall()
        static = static_snapshot()
        records = _recorder.as_json()
        for key, entries in static.items():
            records[key] = sorted(set(records.get(key, [])) | set(entries))
        Path(os.environ["FROST_CODEGEN_SNAPSHOT"]).write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


# -- the kernels that importing the repository defines -------------------------------------------------------
def _import_everything() -> None:
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), pkg + "."):
            importlib.import_module(info.name)
    for d in SCRIPT_DIRS:
        for path in sorted((ROOT / d).glob("*.py")):
            if path.name in ("conftest.py", Path(__file__).name):
                continue
            name = f"frost_snapshot_{d.replace('/', '_')}_{path.stem}"
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)


def all_kernels() -> list[api.Kernel]:
    """Every Kernel object alive after importing the repository's kernel modules (those made by a factory
    included), but the ones a test function defines for itself (a test run's snapshot has those)."""
    _import_everything()
    gc.collect()  # a kernel an earlier test dropped is no kernel of the repository
    seen, out = set(), []
    for obj in gc.get_objects():
        if type(obj) is api.Kernel and id(obj) not in seen:  # type(): isinstance would ask every object
            seen.add(id(obj))
            in_test = _where(obj.src.filename)[0].startswith("tests/") and "<locals>" in obj.fn.__qualname__
            if not in_test:
                out.append(obj)
    return sorted(out, key=kernel_key)


def specializations(k: api.Kernel) -> list[dict]:
    """The Consts to specialize a kernel with: its defaults, or REPRESENTATIVE's values; [] for neither."""
    required = [n for n in k.const_names() if n not in k.defaults]
    if not required:
        return [{}]
    return REPRESENTATIVE.get(k.__name__, [])


def snapshot_kernel(k: api.Kernel) -> list[str]:
    """The records of a kernel's specializations, made afresh (not the kernel's cached ones)."""
    _, hide = _where(k.src.filename)
    out = []
    for consts in specializations(k):
        full = {n: v for n, v in k.defaults.items() if n in k.const_names()}
        full.update(consts)
        full = {n: t.value(full[n], n) for n, t in k.params if n in full}
        try:
            spec = api.Spec(k, full)
        except KernelError as exc:
            out.append(error_record(full, exc, hide))
            continue
        out.append(spec_record(spec, full, hide))
    return out


def static_snapshot() -> dict[str, list[str]]:
    records: dict[str, set] = {}
    for k in all_kernels():
        records.setdefault(kernel_key(k), set()).update(snapshot_kernel(k))
    return {key: sorted(v) for key, v in records.items() if v}


def compare(before: dict, after: dict) -> list[str]:
    """The differences between two snapshots: changed records of a kernel found in both, and kernels in one only."""
    out = []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            out.append(f"only before: {key}")
        elif key not in before:
            out.append(f"only after: {key}")
        elif set(before[key]) != set(after[key]):
            gone = sorted(set(before[key]) - set(after[key]))
            new = sorted(set(after[key]) - set(before[key]))
            out.append(f"changed: {key}\n  before: {gone}\n  after:  {new}")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["write"] and len(argv) == 2:
        records = static_snapshot()
        Path(argv[1]).write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        print(f"{len(records)} kernels, {sum(map(len, records.values()))} specializations -> {argv[1]}")
        return 0
    if argv[:1] == ["compare"] and len(argv) == 3:
        before, after = (json.loads(Path(p).read_text()) for p in argv[1:])
        diffs = compare(before, after)
        print("\n".join(diffs) or f"identical: {len(before)} kernels, {sum(map(len, before.values()))} records")
        return 1 if any(d.startswith("changed") for d in diffs) else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
