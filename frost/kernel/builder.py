"""What the two builders share: the walk over a checked function's statements and expressions. cgen.CGen writes
CUDA C++ and simulate.PyGen the simulator's Python; each supplies the words of its language (literal, convert, binop,
negation, AND, the heads and ends of its statements) and the code of array accesses and calls; the built-in
functions' code comes from their definitions (builtin_defs), the `cuda` or the `sim` of each."""
from __future__ import annotations

import ast
from typing import Callable, NamedTuple

from frost.kernel.builtin_defs import DEFINITIONS
from frost.kernel.frontend import Checked, check_literal, matmul_call
from frost.kernel.types import ArrayType, Scalar, TupleType, Weak, promote, strong

CMPOPS = {"Lt": "<", "LtE": "<=", "Gt": ">", "GtE": ">=", "Eq": "==", "NotEq": "!="}  # alike in C++ and Python
SIGNS = {"USub": "-", "UAdd": "+", "Invert": "~"}


class Bounds(NamedTuple):
    """A range loop's bounds as code in the loop variable's type (start None: from 0; step None: 1), the step's
    value where it is a constant, and whether every bound is one."""
    start: str | None
    stop: str
    step: str | None
    step_value: int | None
    constant: bool


class Builder:
    """Writes one checked function (kernel or device function) in a target language. A subclass names its builtin
    emission (TARGET: a BuiltinDef's "cuda" or "sim"), the conjunction of chained comparisons (AND), its
    temporaries' prefix (TMP) and the message for a builtin it cannot write (UNSUPPORTED), and defines
    literal(value, t), convert(code, src, dst), binop(name, a, b, t), negation(operand), tile(call),
    call_device(call, callee) and e_<node> for the other expressions; for the statements, w(text, node) and the
    words listed under "statements: the language's words" below."""

    TARGET = AND = TMP = UNSUPPORTED = ""

    def __init__(self, fn: Checked) -> None:
        self.fn = fn
        self.src = fn.src
        self.indent = 1
        self.tmp = 0
        # each enclosing loop's exit: None where a break leaves the loop, a label where it leaves a whole grid
        self.loops: list[str | None] = []

    def type(self, node):
        return self.fn.types[id(node)]

    def new_tmp(self) -> str:
        self.tmp += 1
        return f"{self.TMP}{self.tmp}"

    def ex(self, node, want=None) -> str:
        """Code for an expression, converted to type `want` (a literal is written in that type directly)."""
        t = self.type(node)
        if isinstance(t, Weak):
            lt = want if want is not None else t.strong
            check_literal(self.src, node, self.fn.values[id(node)], lt)
            return self.literal(self.fn.values[id(node)], lt)
        code = getattr(self, "e_" + type(node).__name__)(node)
        if want is None or isinstance(t, (ArrayType, TupleType)) or t is None:
            return code
        return self.convert(code, t, want)

    def e_Attribute(self, node):
        return self.fn.attr_names[id(node)]

    def e_BinOp(self, node):
        t = self.type(node)
        return self.binop(type(node.op).__name__, self.ex(node.left, t), self.ex(node.right, t), t)

    def e_UnaryOp(self, node):
        t = self.type(node)
        if isinstance(node.op, ast.Not):
            return self.negation(node.operand)
        return f"({SIGNS[type(node.op).__name__]}{self.ex(node.operand, t)})"

    def e_Compare(self, node):
        parts = []
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            ct = strong(promote(self.type(left), self.type(right)))
            parts.append(f"({self.ex(left, ct)} {CMPOPS[type(op).__name__]} {self.ex(right, ct)})")
            left = right
        return parts[0] if len(parts) == 1 else "(" + self.AND.join(parts) + ")"

    def e_Call(self, node):
        f = node.func
        if id(node) in self.fn.callees:
            return self.call_device(node, self.fn.callees[id(node)])
        if isinstance(f, ast.Attribute) and f.attr == "tile":
            return self.tile(node)
        name = f.id if isinstance(f, ast.Name) else f.attr
        t = self.type(node)
        if isinstance(t, Scalar) and id(node) in self.fn.casts:
            return self.ex(node.args[0], t)
        definition = DEFINITIONS.get(name)
        emit = getattr(definition, self.TARGET) if definition is not None else None
        if emit is None:
            raise self.src.error(node, self.UNSUPPORTED.format(name=name))
        return emit(self, node, t)


    # -- statements -------------------------------------------------------------------------------------
    def block(self, stmts) -> None:
        for s in stmts:
            getattr(self, "s_" + type(s).__name__)(s)

    def body(self, stmts) -> None:
        self.indent += 1
        self.block(stmts)
        self.indent -= 1

    def s_Pass(self, s):
        self.pass_stmt(s)

    def s_Expr(self, s):
        if isinstance(s.value, ast.Constant) or self.omitted(s.value):
            return
        self.w(self.end(self.ex(s.value)), s)

    def s_Assign(self, s):
        target = s.targets[0]
        if isinstance(target, ast.Tuple):
            self.unpack(s, target.elts)
            return
        tt = self.type(target)
        if not isinstance(target, ast.Name):
            self.w(self.element_store(target, lambda: self.ex(s.value, tt)), s)
            return
        code = self.array_value(s.value, target) if isinstance(tt, ArrayType) else self.ex(s.value, tt)
        if code is not None:  # None: a C++ array, declared at the top of the function
            self.w(self.assign(target, code), s)

    def unpack(self, s, targets) -> None:
        """targets = s.value: every value before any target is stored (a, b = b, a swaps)."""
        if isinstance(s.value, ast.Tuple):
            for t, tmp in zip(targets, self.bind_values(s, targets, s.value.elts)):
                self.w(self.assign(t, tmp), s)
            return
        tmp = self.new_tmp()
        self.w(self.bind(tmp, self.ex(s.value)), s)
        for k, (t, it) in enumerate(zip(targets, self.type(s.value).items)):
            self.w(self.assign(t, self.convert(self.item(tmp, k), it, self.type(t))), s)

    def s_AnnAssign(self, s):
        if s.target.id in self.fn.consts:
            return
        self.w(self.assign(s.target, self.ex(s.value, self.type(s.target))), s)

    def s_AugAssign(self, s):
        if isinstance(s.op, ast.Add) and isinstance(s.value, ast.BinOp) and isinstance(s.value.op, ast.MatMult):
            self.w(self.end(self.ex(matmul_call(s))), s)
            return
        tt, rt, op = self.type(s.target), self.fn.types[id(s)], type(s.op).__name__
        access = self.update(s, tt, rt, op)
        if access is None:  # written whole (C++'s x += v)
            return
        load, store = access
        value = self.binop(op, self.convert(load, tt, rt), self.ex(s.value, rt), rt)
        self.w(store(self.convert(value, rt, tt)), s)

    def s_If(self, s, first=True):
        self.w(self.if_head(s.test, first), s)
        self.body(s.body)
        if len(s.orelse) == 1 and isinstance(s.orelse[0], ast.If):
            self.s_If(s.orelse[0], first=False)
            return
        if s.orelse:
            self.else_head(s)
            self.body(s.orelse)
        self.close()

    def s_While(self, s):
        self.w(self.while_head(s.test), s)
        self.indent += 1
        self.loop_body(s, None, 1)

    def s_For(self, s):
        if s.iter.func.id == "grid":
            exit_label, levels = self.grid_head(s)
            self.loop_body(s, exit_label, levels)
            self.grid_end(s, exit_label)
            return
        self.range_head(s, s.iter.func.id, self.bounds(s))
        self.indent += 1
        self.loop_body(s, None, 1)

    def bounds(self, s) -> Bounds:
        """The bounds of `for i in range(...)` (or static_range), evaluated start, stop, step."""
        args, t, vals = s.iter.args, self.type(s.target), self.fn.values
        start, stop, step = (None, args[0], None) if len(args) == 1 else (
            args[0], args[1], args[2] if len(args) == 3 else None)
        start_c = None if start is None else self.ex(start, t)
        stop_c = self.ex(stop, t)
        step_c = None if step is None else self.ex(step, t)
        step_value = vals[id(step)] if step is not None and id(step) in vals else None
        constant = all(n is None or id(n) in vals for n in (start, step)) and id(stop) in vals
        return Bounds(start_c, stop_c, step_c, step_value, constant)

    def loop_body(self, loop, exit_label, levels: int) -> None:
        """The body of a loop whose head opened `levels` indented levels; it closes them."""
        self.count_iteration(loop)
        self.loops.append(exit_label)
        self.block(loop.body)
        self.loops.pop()
        for _ in range(levels):
            self.indent -= 1
            self.close()

    def s_Break(self, s):
        self.w(self.end(self.break_word(self.loops[-1] if self.loops else None)), s)

    def s_Continue(self, s):
        self.w(self.end("continue"), s)

    def s_Return(self, s):
        ret = self.fn.ret
        if s.value is None:
            code = None
        elif isinstance(ret, TupleType) and isinstance(s.value, ast.Tuple):
            code = self.tuple_value([self.ex(e, t) for e, t in zip(s.value.elts, ret.items)])
        elif isinstance(ret, TupleType):
            code = self.ex(s.value)
        else:
            code = self.ex(s.value, ret)
        self.w(self.return_stmt(code), s)

    # -- statements: the language's words (each subclass defines these) ---------------------------------
    def end(self, code: str) -> str:
        """A statement of an expression or a keyword (C++ ends it with a semicolon)."""
        raise NotImplementedError

    def pass_stmt(self, s) -> None:
        raise NotImplementedError

    def omitted(self, expr) -> bool:
        """Whether an expression statement writes nothing (launch_bounds() is a C++ attribute)."""
        raise NotImplementedError

    def assign(self, target, code: str) -> str:
        """`target = code` for a local or an array element (evaluated here)."""
        raise NotImplementedError

    def element_store(self, target, value: Callable[[], str]) -> str:
        """`arr[i] = value()`: the languages evaluate element and value in different orders, which numbers the
        simulator's constants, so the value comes as a function."""
        raise NotImplementedError

    def array_value(self, value, target) -> str | None:
        raise NotImplementedError

    def bind_values(self, s, targets, values) -> list[str]:
        """Temporaries holding `values` (in the targets' types), written before any target is assigned."""
        raise NotImplementedError

    def bind(self, tmp: str, code: str) -> str:
        raise NotImplementedError

    def item(self, tmp: str, k: int) -> str:
        raise NotImplementedError

    def update(self, s, tt, rt, op: str) -> tuple[str, Callable[[str], str]] | None:
        """For `target op= value`: code loading the target and a function storing a value into it, the target's
        index evaluated once (it may have side effects: atomic_add); or None where it wrote the statement."""
        raise NotImplementedError

    def if_head(self, test, first: bool) -> str:
        raise NotImplementedError

    def else_head(self, s) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """The end of an if statement or of a loop (a brace in C++)."""
        raise NotImplementedError

    def while_head(self, test) -> str:
        raise NotImplementedError

    def range_head(self, s, kind: str, bounds: Bounds) -> None:
        raise NotImplementedError

    def grid_head(self, s) -> tuple[str | None, int]:
        """Opens `for i, j in grid(m, n)`: the label a break jumps to (None where break leaves it) and the levels
        of indentation opened."""
        raise NotImplementedError

    def grid_end(self, s, exit_label) -> None:
        raise NotImplementedError

    def count_iteration(self, loop) -> None:
        """Code at the top of each iteration (the simulator's step budget)."""
        raise NotImplementedError

    def break_word(self, exit_label: str | None) -> str:
        raise NotImplementedError

    def tuple_value(self, codes: list[str]) -> str:
        raise NotImplementedError

    def return_stmt(self, code: str | None) -> str:
        raise NotImplementedError
