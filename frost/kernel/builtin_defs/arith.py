"""Built-in arithmetic: the math functions, abs/min/max/fma/pow/mulhi, cdiv, len, and the loop iterables."""
from __future__ import annotations

from frost.kernel.builtin_defs.base import BuiltinDef, Checking, CudaBuilding, SimBuilding
from frost.kernel.types import ArrayType, Scalar, Weak, arith_type, c_div, f32, i32, i64, promote, strong, u32


class Math1(BuiltinDef):
    """sqrt(x), exp(x), ...: one float argument (an integer computes in f32); CUDA's function and NumPy's."""

    def __init__(self, name: str, c: str, py: str) -> None:
        super().__init__(name)
        self.c, self.py = c, py

    def check(self, ck: Checking, node):
        (a,) = ck.args(node, 1, self.name)
        ck.scalar(a, node.args[0])
        t = arith_type(a)
        return t if (not isinstance(t, Weak) and t.is_float) else f32

    def cuda(self, g: CudaBuilding, node, t) -> str:
        sfx = "f" if t is f32 else ""
        return f"{self.c}{sfx}({g.ex(node.args[0], t)})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"{self.py}({g.ex(node.args[0], t)})"


MATH_1 = [Math1(name, name, "_" + name) for name in ("sqrt", "rsqrt", "exp", "exp2", "log", "log2", "tanh", "sin",
                                                      "cos", "floor", "ceil", "erf")]


class FastExp2(BuiltinDef):
    """fast_exp2(x): 2^x in f32 by one ex2.approx.ftz.f32 (a special-function-unit instruction, relative error
    about 2^-22), subnormal inputs and results flushed to zero. exp2 keeps subnormals at the cost of a few more
    instructions around the same one; an online softmax, whose weights below 2^-126 do not count, takes this."""

    def check(self, ck: Checking, node):
        (a,) = ck.args(node, 1, self.name)
        ck.scalar(a, node.args[0])
        if isinstance(a, Scalar) and a.is_float and a is not f32:
            raise ck.src.error(node.args[0], f"fast_exp2() computes in f32, got {a}; use exp2()")
        return f32

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"frost_fast_exp2({g.ex(node.args[0], f32)})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_fast_exp2({g.ex(node.args[0], f32)})"


class Abs(BuiltinDef):
    def check(self, ck: Checking, node):
        (a,) = ck.args(node, 1, "abs")
        ck.scalar(a, node.args[0])
        return strong(arith_type(a))

    def cuda(self, g: CudaBuilding, node, t) -> str:
        a = g.ex(node.args[0], t)
        if t.is_float:
            return f"fabs{'f' if t is f32 else ''}({a})"
        return a if t is u32 else (f"llabs({a})" if t is i64 else f"abs({a})")

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_abs({g.ex(node.args[0], t)})"


class MinMax(BuiltinDef):
    """min(a, b[, c[, d]]) / max(...): fmin/fmax on floats (a NaN operand gives the other)."""

    def check(self, ck: Checking, node):
        name = self.name
        ts = ck.args(node, (2, 3, 4), name)
        t = ts[0]
        for n, x in zip(node.args, ts):
            ck.scalar(x, n)
        for x in ts[1:]:
            t = promote(t, x)
        vals = [ck.out.values.get(id(a)) for a in node.args]
        if isinstance(t, Weak) and all(v is not None for v in vals):
            return ck.const(node, min(vals) if name == "min" else max(vals))
        return strong(t)

    def cuda(self, g: CudaBuilding, node, t) -> str:
        args = [g.ex(a, t) for a in node.args]
        if t.is_float:
            fn = ("fmin" if self.name == "min" else "fmax") + ("f" if t is f32 else "")
        else:
            fn = self.name
        code = args[0]
        for a in args[1:]:
            code = f"{fn}({code}, {a})"
        return code

    def sim(self, g: SimBuilding, node, t) -> str:
        fn = ("_fmin" if self.name == "min" else "_fmax") if t.is_float else ("_" + self.name)
        code = g.ex(node.args[0], t)
        for a in node.args[1:]:
            code = f"{fn}({code}, {g.ex(a, t)})"
        return code


class Fma(BuiltinDef):
    def check(self, ck: Checking, node):
        ts = ck.args(node, 3, "fma")
        t = promote(promote(ts[0], ts[1]), ts[2])
        t = strong(t)
        return t if t.is_float else f32

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"fma{'f' if t is f32 else ''}({', '.join(g.ex(a, t) for a in node.args)})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_fma({', '.join(g.ex(a, t) for a in node.args)})"


class Pow(BuiltinDef):
    def check(self, ck: Checking, node):
        a, b = ck.args(node, 2, "pow")
        t = strong(promote(a, b))
        return t if t.is_float else f32

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"pow{'f' if t is f32 else ''}({g.ex(node.args[0], t)}, {g.ex(node.args[1], t)})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_pow({g.ex(node.args[0], t)}, {g.ex(node.args[1], t)})"


class Mulhi(BuiltinDef):
    """mulhi(a, b): the high 32 bits of the 64-bit product of two u32 (or two i32), CUDA's __umulhi/__mulhi."""

    def check(self, ck: Checking, node):
        a, b = ck.args(node, 2, "mulhi")
        for x, n in zip((a, b), node.args):
            if not (isinstance(x, (Scalar, Weak)) and x.is_int):
                raise ck.src.error(n, f"mulhi() takes u32 or i32 integers, got {x}")
        t = strong(promote(a, b))
        if t not in (i32, u32):
            raise ck.src.error(node, f"mulhi() takes u32 or i32 integers, got {a} and {b} (a {t} product); "
                                     "cast to u32 or i32")
        return t

    def cuda(self, g: CudaBuilding, node, t) -> str:
        a, b = (g.ex(x, t) for x in node.args)
        return f"__umulhi({a}, {b})" if t is u32 else f"__mulhi({a}, {b})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_mulhi({g.ex(node.args[0], t)}, {g.ex(node.args[1], t)})"


class Cdiv(BuiltinDef):
    """cdiv(a, b) = (a + b - 1) // b, folded when both are constants."""

    def check(self, ck: Checking, node):
        a, b = ck.args(node, 2, "cdiv")
        for x, n in zip((a, b), node.args):
            if not (isinstance(x, (Scalar, Weak)) and x.is_int):
                raise ck.src.error(n, f"cdiv() takes integers, got {x}")
        t = promote(a, b)
        va, vb = ck.out.values.get(id(node.args[0])), ck.out.values.get(id(node.args[1]))
        if isinstance(t, Weak) and va is not None and vb is not None:
            if vb == 0:
                raise ck.src.error(node, "division by zero in a constant expression")
            return ck.const(node, c_div(va + vb - 1, vb))  # as the runtime computes it: (a + b - 1) / b in C
        return t

    def cuda(self, g: CudaBuilding, node, t) -> str:
        a, b = (g.ex(x, t) for x in node.args)
        return f"(({a} + {b} - 1) / {b})"

    def sim(self, g: SimBuilding, node, t) -> str:
        a, b = (g.ex(x, t) for x in node.args)
        return f"_idiv({a} + {b} - {g.const(1, t)}, {b})"


class Len(BuiltinDef):
    def check(self, ck: Checking, node):
        (a,) = ck.args(node, 1, "len")
        if not isinstance(a, ArrayType):
            raise ck.src.error(node, f"len() needs an array, got {a}")
        if a.shape is not None:
            return ck.const(node, a.shape[0])
        return i64

    def cuda(self, g: CudaBuilding, node, t) -> str:
        at = g.type(node.args[0])
        ref = g.array_ref(node.args[0])
        return g.len_name(ref) if at.kind == "param" else f"{ref}.n0"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"{g.ex(node.args[0])}.len64"


class LoopIterable(BuiltinDef):
    """range, grid, static_range: only a for loop's iterable (the loop statement is written for them)."""

    def check(self, ck: Checking, node):
        raise ck.src.error(node, "range() can only be used as the iterable of a for loop")


DEFINITIONS = MATH_1 + [FastExp2("fast_exp2"), Abs("abs"), MinMax("min"), MinMax("max"), Fma("fma"), Pow("pow"),
                        Mulhi("mulhi"), Cdiv("cdiv"), Len("len"), LoopIterable("range"), LoopIterable("grid"),
                        LoopIterable("static_range")]
