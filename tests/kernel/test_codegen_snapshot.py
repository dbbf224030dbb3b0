"""The built-in functions are defined once (frost/kernel/builtin_defs), and every kernel the repository defines
generates its CUDA C++ and its simulator Python, the same each time. With FROST_CODEGEN_SNAPSHOT_BEFORE naming a
snapshot written before a change (`python tests/kernel/codegen_snapshot.py write PATH`), every kernel's generated
code must be byte for byte what it was."""
import json
import os
from pathlib import Path

import codegen_snapshot as snap

from frost.kernel import builtins as B
from frost.kernel.builtin_defs import DEFINITIONS

def test_every_callable_builtin_has_one_definition_with_both_builders():
    assert set(DEFINITIONS) == set(B.FUNCTIONS) | set(B.MATH_1) | set(B.MATH_OTHER)
    statements_only = {"range", "grid", "static_range", "shared", "local", "dynamic_shared", "launch_bounds",
                       "wgmma_descriptors_from_bases"}
    assert {n for n, d in DEFINITIONS.items() if d.cuda is None} == statements_only
    assert {n for n, d in DEFINITIONS.items() if d.sim is None} == {"range", "grid", "static_range"}


def test_every_kernel_of_the_repository_generates_its_code_deterministically():
    records = snap.static_snapshot()
    assert len(records) >= 80, sorted(records)
    failed = [f"{key}: {r}" for key, rs in records.items() for r in rs if "error" in r]
    assert not failed, failed
    assert snap.static_snapshot() == records


def test_generated_code_matches_the_snapshot_before_a_change():
    before = os.environ.get("FROST_CODEGEN_SNAPSHOT_BEFORE")
    if not before:
        return  # nothing to compare with: the check is for a change of the front end or the builders
    changed = [d for d in snap.compare(json.loads(Path(before).read_text()), snap.static_snapshot())
               if d.startswith("changed")]
    assert not changed, "\n".join(changed)
