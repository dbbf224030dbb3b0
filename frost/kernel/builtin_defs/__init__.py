"""The kernel language's built-in functions, each defined once: its type rule, its CUDA C++ and its simulator
Python (base.BuiltinDef), grouped by family. The front end (frontend.Checker) and the two builders (cgen.CGen,
simulate.PyGen) look a call's builtin up in DEFINITIONS; adding a builtin is adding a definition here and its name
to builtins.FUNCTIONS (docs/kernels.md, "Adding a built-in")."""
from __future__ import annotations

from frost.kernel import builtins as B
from frost.kernel.builtin_defs import arith, mbarrier, memory, sync, warp, wgmma
from frost.kernel.builtin_defs.base import BuiltinDef

DEFINITIONS: dict[str, BuiltinDef] = {d.name: d for family in (arith, sync, mbarrier, memory, warp, wgmma)
                                      for d in family.DEFINITIONS}

# every callable name of builtins.py has a definition, and every definition a name there: checked as this loads
_CALLABLE = set(B.FUNCTIONS) | set(B.MATH_1) | set(B.MATH_OTHER)
if set(DEFINITIONS) != _CALLABLE:
    raise ImportError(f"frost.kernel builtins without a definition: {sorted(_CALLABLE - set(DEFINITIONS))}; "
                      f"definitions without a name in builtins.py: {sorted(set(DEFINITIONS) - _CALLABLE)}")
