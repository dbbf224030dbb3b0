"""What a built-in function of the kernel language is: one object holding its type rule and what each of the two
builders (CUDA C++, the CPU simulator's Python) writes for a call, and the interfaces those three sides offer it."""
from __future__ import annotations

import ast
from typing import Protocol

from frost.kernel.types import ArrayType, Scalar, Weak


class Checking(Protocol):
    """What a type rule may use of the front end (frontend.Checker)."""

    src: object       # frontend.Source: .error(node, message) makes the KernelError to raise
    out: object       # frontend.Checked: the facts the builders read (has_yield, uses_wgmma, vector_params, ...)
    loop_depth: int
    named_allocations: set

    def expr(self, node): ...

    def type(self, node): ...

    def args(self, node, n, name) -> list: ...

    def scalar(self, t, node) -> None: ...

    def condition(self, node): ...

    def const(self, node, value): ...

    def const_int(self, node) -> int: ...

    def const_shape(self, node) -> tuple: ...

    def scalar_type_arg(self, node) -> Scalar: ...

    def check_store(self, src_t, dst_t, node, what: str = "element") -> None: ...


class Building(Protocol):
    """What an emission may use of either builder (cgen.CGen, simulate.PyGen, both builder.Builder): each writes an
    expression of its own language for a checked node. (Protocols, not the classes: the builders import this.)"""

    fn: object  # frontend.Checked: .values holds the folded constants

    def type(self, node): ...

    def ex(self, node, want=None) -> str: ...


class CudaBuilding(Building, Protocol):
    def array_ref(self, node) -> str: ...

    def elem_ptr(self, arr, idx) -> str: ...

    def truth(self, node) -> str: ...

    def cname(self, name: str) -> str: ...

    def len_name(self, ref: str) -> str: ...


class SimBuilding(Building, Protocol):
    def index_tuple(self, node) -> str: ...

    def const(self, value, t) -> str: ...

    def alloc(self, call, name) -> str: ...


class BuiltinDef:
    """One built-in function: `check` is its type rule (the call's type, or None for a statement; it records in
    ck.out what the builders need), `cuda` and `sim` write the call as a C++ and as a Python expression of type t.
    A builtin that is no expression (range, shared: the statements around it are written for it) leaves them None;
    one whose value is an array view for the C++ builder (dynamic_shared(T)) has cuda_view instead."""

    cuda = None
    sim = None
    cuda_view = None

    def __init__(self, name: str) -> None:
        self.name = name

    def check(self, ck: Checking, node: ast.Call):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<kernel builtin definition {self.name}>"


def kernel_statement(ck: Checking, node, name: str) -> None:
    """A builtin that configures its kernel (launch_bounds, wgmma_descriptors_from_bases) is a statement of the
    kernel's own body, at its top level."""
    if not ck.out.is_kernel or ck.loop_depth or node not in [getattr(x, "value", None) for x in ck.src.tree.body]:
        raise ck.src.error(node, f"{name}() must be a statement in the body of a kernel (not nested)")


def array_any(ck: Checking, node, arr_node, idx_node, name):
    """The array of `name(arr, (i, j), ...)`: any array, indexed by as many integers as it has dimensions."""
    at = ck.expr(arr_node)
    if not isinstance(at, ArrayType):
        raise ck.src.error(node, f"{name}() needs an array, got {at}")
    idx = idx_node.elts if isinstance(idx_node, ast.Tuple) else [idx_node]
    if len(idx) != at.ndim:
        raise ck.src.error(idx_node, f"{name}() needs {at.ndim} indices into {at}")
    for i in idx:
        t = ck.expr(i)
        if not (isinstance(t, (Scalar, Weak)) and t.is_int):
            raise ck.src.error(i, f"an index must be an integer, got {t}")
    return at
