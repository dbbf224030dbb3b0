"""What the two builders share: the walk over a checked function's expressions. cgen.CGen writes CUDA C++ and
simulate.PyGen the simulator's Python; each supplies the words of its language (literal, convert, binop, negation,
AND), its statements, and the code of array accesses and calls; the built-in functions' code comes from their
definitions (builtin_defs), the `cuda` or the `sim` of each."""
from __future__ import annotations

import ast

from frost.kernel.builtin_defs import DEFINITIONS
from frost.kernel.frontend import Checked, check_literal
from frost.kernel.types import ArrayType, Scalar, TupleType, Weak, promote, strong

CMPOPS = {"Lt": "<", "LtE": "<=", "Gt": ">", "GtE": ">=", "Eq": "==", "NotEq": "!="}  # alike in C++ and Python
SIGNS = {"USub": "-", "UAdd": "+", "Invert": "~"}


class Builder:
    """Writes one checked function (kernel or device function) in a target language. A subclass names its builtin
    emission (TARGET: a BuiltinDef's "cuda" or "sim"), the conjunction of chained comparisons (AND), its
    temporaries' prefix (TMP) and the message for a builtin it cannot write (UNSUPPORTED), and defines
    literal(value, t), convert(code, src, dst), binop(name, a, b, t), negation(operand), tile(call),
    call_device(call, callee) and e_<node> for the other expressions."""

    TARGET = AND = TMP = UNSUPPORTED = ""

    def __init__(self, fn: Checked) -> None:
        self.fn = fn
        self.src = fn.src
        self.indent = 1
        self.tmp = 0

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
