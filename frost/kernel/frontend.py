"""The front end: parse a kernel's Python source and infer and check the type of every expression."""
from __future__ import annotations

import ast
import inspect
import math
import operator
import sys
import textwrap
import threading
import types as pytypes
from typing import Callable

from frost.kernel import builtins as B
from frost.kernel.builtin_defs import DEFINITIONS
from frost.kernel.types import (WEAK_FLOAT, WEAK_INT, Array, ArrayType, Const, ConstType, Scalar, TensorMap,
                                TensorMapType, TupleType, Weak, _ArrayAnnotation, _ConstAnnotation,
                                _TensorMapAnnotation, arith_type, bf16, boolean, c_div, c_mod, f16, f32, f64, i32, i64,
                                promote, strong, u32, u8)


# CPython 3.11's conversions between its parser's tree and Python's ast objects are not safe in two threads at once
# (gh-106905: "SystemError: AST constructor recursion depth mismatch"): every ast.parse and compile(tree) in Frost
# takes this lock, NumPy's .npy header parsing (ast.literal_eval) in frost.io too
PARSE_LOCK = threading.Lock()


class KernelError(Exception):
    """A kernel that does not type-check or compile; the message names the Python file, line and expression."""


class Source:
    """A Python function's parsed source, with the offset that maps its lines back to the file; scope holds the
    defining function's locals (enclosing_scope)."""

    def __init__(self, fn, scope: dict | None = None) -> None:
        self.fn = fn
        self.scope = scope or {}
        try:
            self.filename = inspect.getsourcefile(fn) or "<unknown>"
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as exc:
            raise KernelError(f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({exc}); "
                              "kernels must be defined in a file") from None
        self.text = textwrap.dedent("".join(lines))
        with PARSE_LOCK:
            self.tree = ast.parse(self.text).body[0]
        if not isinstance(self.tree, ast.FunctionDef):
            raise KernelError(f"{self.filename}:{first}: a kernel must be a plain function (def)")
        self.offset = first - 1
        self.lines = self.text.splitlines()

    def line(self, node) -> int:
        return getattr(node, "lineno", 1) + self.offset

    def segment(self, node) -> str:
        seg = ast.get_source_segment(self.text, node)
        return seg if seg is not None else ast.unparse(node)

    def error(self, node, message: str) -> KernelError:
        return KernelError(f"{self.filename}:{self.line(node)}: in {self.fn.__name__}: {message}\n"
                           f"    {self.segment(node)}")


class Local:
    def __init__(self, name, type_, line, kind="local") -> None:
        self.name, self.type, self.line, self.kind = name, type_, line, kind


class Checked:
    """A function after type checking: the types of its expressions and the facts code generators need."""

    def __init__(self, src: Source, cname: str, is_kernel: bool, consts: dict) -> None:
        self.src, self.cname, self.is_kernel, self.consts = src, cname, is_kernel, consts
        self.types: dict[int, object] = {}   # id(node) -> type
        self.values: dict[int, object] = {}  # id(node) -> folded constant (for literal-typed expressions)
        self.params: list[Local] = []
        self.param_positions: list[int] = []  # which call arguments are runtime parameters (not Const)
        self.locals: dict[str, Local] = {}
        self.callees: dict[int, "Checked"] = {}  # id(call node) -> device function
        self.casts: set[int] = set()  # id(call node) of casts, whatever name the type has there (T(x) in a factory)
        self.ret = None
        self.has_yield = False       # uses barriers or warp operations (the simulator's generators)
        self.uses_dyn_smem = False
        self.attr_names: dict[int, str] = {}  # id(attribute node) -> the index name it means (frost.kernel.tx)
        self.dyn_locals: dict[str, int] = {}  # local name -> byte offset in dynamic shared memory
        self.dyn_arrays: dict[int, int] = {}  # id(dynamic_shared call with a shape) -> byte offset
        self.shared_ids: dict[int, int] = {}
        self.launch_bounds: tuple | None = None  # (max threads per block, min blocks per SM) from launch_bounds()
        self.vector_params: dict[str, int] = {}  # array parameter -> bytes per vector access (load4 of f32: 16)
        self.uses_wgmma = False  # uses a Hopper warpgroup instruction: compiled for sm_90a
        self.wgmma_desc_from_bases = False  # wgmma_descriptors_from_bases(): a tile's descriptor = its array's + offset
        self.uses_tensor_maps = False  # cp_async_bulk_tensor: dynamic shared memory on a 1024-byte boundary
        self.needs_sm90a = False  # other Hopper-only instructions (setmaxnreg, mbarrier waits, bulk copies): sm_90a too
        self.uses_grid_sync = False  # waits for the whole grid (grid_sync): the simulator runs all blocks at once
        self.uses_named_barriers = False  # named barriers, mbarriers: the race detector orders partially
        self.wgmma_accs: dict[str, int] = {}  # accumulator local -> floats, fenced at wgmma_fence/wgmma_wait

    def type(self, node):
        return self.types[id(node)]


INDEX_C = {"tx": "threadIdx.x", "ty": "threadIdx.y", "tz": "threadIdx.z", "bx": "blockIdx.x", "by": "blockIdx.y",
           "bz": "blockIdx.z", "bdx": "blockDim.x", "bdy": "blockDim.y", "bdz": "blockDim.z", "gdx": "gridDim.x",
           "gdy": "gridDim.y", "gdz": "gridDim.z", "warp": "(threadIdx.x >> 5)", "lane": "(threadIdx.x & 31)"}
SCALAR_BY_NAME = {"f32": f32, "f16": f16, "bf16": bf16, "f64": f64, "i32": i32, "i64": i64, "u32": u32, "u8": u8,
                  "bool": boolean}
WARP_OPS = ("shfl_xor", "shfl_down", "shfl_up", "shfl_idx", "ballot", "ldmatrix_x4", "ldmatrix_x2",
            "ldmatrix_x4_trans", "ldmatrix_x2_trans", "mma_16x8x16", "mma")


_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
            ast.NotEq: operator.ne}
_OPS = {"Add": "+", "Sub": "-", "Mult": "*", "Div": "/", "FloorDiv": "//", "Mod": "%", "Pow": "**", "LShift": "<<",
        "RShift": ">>", "BitAnd": "&", "BitOr": "|", "BitXor": "^"}


# Names the code generators invent (frost_t1, frost_i_end, frost_x_len, the simulator's _fk_t1) start with these;
# SIM_NAMES (filled by simulate.py) holds the simulator's helpers (_np, _T, _idiv, ...), which a local would shadow.
RESERVED_PREFIXES = ("frost_", "_fk_")
SIM_NAMES: set = set()


class Checker:
    """Type-checks one function (a kernel, or a device function for one tuple of argument types)."""

    def __init__(self, src: Source, cname: str, is_kernel: bool, consts: dict, device_cache: dict) -> None:
        self.src = src
        self.out = Checked(src, cname, is_kernel, consts)
        self.device_cache = device_cache  # shared by a kernel and all device functions it calls
        self.loop_depth = 0
        self.loopvars: set[str] = set()
        self.returns: list = []  # (return statement, type of its value or None) of a device function
        # shared()/local() declare an array, which C cannot do inside an expression: only `name = shared(...)`
        self.named_allocations = {id(n.value) for n in ast.walk(src.tree)
                                  if isinstance(n, (ast.Assign, ast.AnnAssign)) and _is_allocation(n.value)}
        self.globals = src.fn.__globals__
        self.closure = dict(src.scope)
        for var, cell in zip(src.fn.__code__.co_freevars, src.fn.__closure__ or ()):
            try:
                self.closure[var] = cell.cell_contents
            except ValueError:  # a closure variable not yet assigned
                pass

    # -- entry -------------------------------------------------------------------------------------------
    def check(self, arg_types=None):
        fdef = self.src.tree
        a = fdef.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
            raise self.src.error(fdef, "kernels take plain positional parameters only")
        for k, arg in enumerate(a.args):
            self.check_new_name(arg, arg.arg, "parameter")
            t = self._annotation(arg.annotation, arg) if arg.annotation is not None else None
            if isinstance(t, ConstType):
                if arg.arg not in self.out.consts:
                    raise self.src.error(arg, f"compile-time constant {arg.arg!r} has no value")
                continue
            if arg_types is not None:
                t = arg_types[k]  # a device function is checked for the types of one call
            if t is None:
                raise self.src.error(arg, f"parameter {arg.arg!r} needs a type annotation (e.g. {arg.arg}: f32)")
            loc = Local(arg.arg, t, self.src.line(arg), "param")
            self.out.params.append(loc)
            self.out.param_positions.append(k)
            self.out.locals[arg.arg] = loc
        if fdef.returns is not None and not self.out.is_kernel:
            self.out.ret = self._return_annotation(fdef.returns)
        self.block(fdef.body)
        if not self.out.is_kernel:
            self.out.ret = self.return_type(fdef)
        return self.out

    def check_new_name(self, node, name, what):
        """A parameter, local or loop variable may not take a built-in index's name (the simulator sets those on
        entry to every function) nor a name reserved for generated code."""
        if name in B.INDEX_NAMES:
            raise self.src.error(node, f"{what} {name!r} has the name of the built-in index {name}; rename it")
        if name.startswith(RESERVED_PREFIXES) or name in SIM_NAMES:
            raise self.src.error(node, f"{what} {name!r}: names starting with {' or '.join(RESERVED_PREFIXES)} (and "
                                       f"the simulator's helpers such as _np, _T) are reserved for generated code; "
                                       f"rename it")

    def _resolve_object(self, node):
        """The Python object a Name/Attribute in an annotation or call target refers to (or None)."""
        if isinstance(node, ast.Name):
            for scope in (self.closure, self.globals):
                if node.id in scope:
                    obj = scope[node.id]
                    if _meaningful(obj) or node.id not in B.BUILTINS:
                        return obj
                    break
            if node.id in B.BUILTINS:
                return B.BUILTINS[node.id]
            if node.id in B.LIBRARY:
                return B.LIBRARY[node.id]
            if node.id in SCALAR_BY_NAME:
                return SCALAR_BY_NAME[node.id]
            if node.id == "Array":
                return Array
            if node.id == "Const":
                return Const
            return None
        if isinstance(node, ast.Attribute):
            base = self._resolve_object(node.value)
            if base is not None:
                return getattr(base, node.attr, None)
        return None

    def _annotation(self, node, where):
        # a parameter's annotation as Python evaluated it: a kernel made inside a factory function may use the
        # factory's arguments (x: Array[T]) without naming them in its body (they are no closure cells then)
        value = getattr(self.src.fn, "__annotations__", {}).get(getattr(where, "arg", None))
        if value is None or isinstance(value, str):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                with PARSE_LOCK:
                    node = ast.parse(node.value, mode="eval").body
            try:
                with PARSE_LOCK:
                    code = compile(ast.Expression(node), self.src.filename, "eval")
                value = eval(code, {**_annotation_namespace(), **self.globals, **self.closure})
            except Exception as exc:
                raise self.src.error(where, f"cannot read the type annotation: {exc}") from None
        if value is int:
            return i32
        if value is float:
            return f32
        if value is bool:
            return boolean
        if isinstance(value, (Scalar, ArrayType, ConstType, TensorMapType)):
            return value
        raise self.src.error(where, f"{value!r} is not a kernel type (use f32, i32, Array[f32], Const[int], ...)")

    def _return_annotation(self, node):
        if isinstance(node, ast.Tuple):
            return TupleType(self._annotation(e, node) for e in node.elts)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("tuple", "Tuple"):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return TupleType(self._annotation(e, node) for e in elts)
        return self._annotation(node, node)

    # -- statements -------------------------------------------------------------------------------------
    def block(self, stmts):
        for s in stmts:
            self.stmt(s)

    def stmt(self, s):
        m = getattr(self, "stmt_" + type(s).__name__, None)
        if m is None:
            raise self.src.error(s, f"{type(s).__name__} statements are not part of the kernel language")
        m(s)

    def stmt_Pass(self, s):
        pass

    def stmt_Expr(self, s):
        if isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
            return  # a docstring
        if not isinstance(s.value, ast.Call):
            raise self.src.error(s, "an expression statement must be a call")
        self.expr(s.value)

    def stmt_Assign(self, s):
        if len(s.targets) != 1:
            raise self.src.error(s, "chained assignment (a = b = c) is not supported")
        target = s.targets[0]
        if isinstance(target, ast.Tuple):
            vt = None if isinstance(s.value, ast.Tuple) else self.expr(s.value)
            if isinstance(s.value, ast.Tuple):  # `a, b = x, y`: every value is read before any is assigned
                items = [self.expr(e) for e in s.value.elts]
                for e, it in zip(s.value.elts, items):
                    self.scalar(it, e)
            elif isinstance(vt, TupleType):
                items = list(vt.items)
            else:
                raise self.src.error(s, f"cannot unpack a value of type {vt} into {len(target.elts)} names")
            if len(items) != len(target.elts):
                raise self.src.error(s, f"unpacking {len(items)} values into {len(target.elts)} names")
            for t, it in zip(target.elts, items):
                if isinstance(t, ast.Subscript):  # `a[i], b[i] = f(...)`: element stores, converted as stores are
                    tt = self.lvalue_type(t)
                    self.check_convertible(it, tt, t)
                    self.check_store(it, tt, t)
                    continue
                if not isinstance(t, ast.Name):
                    raise self.src.error(t, "only names and array elements can be unpacked into")
                self.assign_name(t, it, s)
            return
        vt = self.expr(s.value)
        self.assign_target(target, vt, s)
        if isinstance(target, ast.Name) and id(s.value) in self.out.dyn_arrays:
            self.out.dyn_locals[target.id] = self.out.dyn_arrays[id(s.value)]

    def stmt_AnnAssign(self, s):
        t = self._annotation(s.annotation, s)
        if not isinstance(s.target, ast.Name) or s.value is None:
            raise self.src.error(s, "an annotated assignment must be `name: type = value`")
        if isinstance(t, ConstType):  # `N: Const[int] = BM * 2`: a named compile-time constant
            self.expr(s.value)
            v = self.out.values.get(id(s.value))
            is_condition = t.py_type is bool and self.type(s.value) is boolean
            if is_condition and v is None:
                v = self.folded_condition(s.value)
            if v is None or not (isinstance(self.type(s.value), Weak) or is_condition):
                raise self.src.error(s, f"{s.target.id!r} is a Const; its value must be a compile-time constant")
            if s.target.id in self.out.locals or s.target.id in self.out.consts:
                raise self.src.error(s, f"{s.target.id!r} is already defined")
            self.check_new_name(s, s.target.id, "constant")
            self.out.consts = dict(self.out.consts, **{s.target.id: t.py_type(v)})
            return
        self.expr(s.value)
        self.check_convertible(self.type(s.value), t, s.value)
        self.check_store(self.type(s.value), t, s.value, f"local {s.target.id!r}")
        self.declare(s.target, t, s)
        self.out.types[id(s.target)] = t

    def stmt_AugAssign(self, s):
        if isinstance(s.op, ast.Add) and isinstance(s.value, ast.BinOp) and isinstance(s.value.op, ast.MatMult):
            call = matmul_call(s)
            self.expr(call)
            return
        vt = self.expr(s.value)
        tt = self.lvalue_type(s.target)
        rt = self.binop_type(s.op, tt, vt, s)
        if isinstance(s.target, ast.Name) and rt != tt and arith_type(tt) != rt:
            loc = self.out.locals[s.target.id]
            raise self.src.error(s, f"local {s.target.id!r} has type {tt} (from line {loc.line}) but this "
                                    f"{_OPS.get(type(s.op).__name__, '')}= gives a {rt}; give it that type where it "
                                    f"is first assigned, or cast")
        self.check_store(rt, tt, s)
        self.out.types[id(s)] = rt

    def assign_target(self, target, vt, s):
        if isinstance(target, ast.Name):
            self.assign_name(target, vt, s)
        elif isinstance(target, ast.Subscript):
            tt = self.lvalue_type(target)
            self.check_convertible(vt, tt, s.value if hasattr(s, "value") else s)
            self.check_store(vt, tt, s)
        else:
            raise self.src.error(target, "can only assign to a name or an array element")

    def assign_name(self, target, vt, s):
        name = target.id
        if name in self.loopvars:
            raise self.src.error(s, f"cannot assign to loop variable {name!r} inside its loop")
        if isinstance(vt, TupleType):
            raise self.src.error(s, f"cannot assign a tuple {vt} to the single name {name!r}")
        if isinstance(vt, ArrayType) and vt.kind != "view" and not _is_allocation(getattr(s, "value", None)):
            raise self.src.error(s, f"cannot give the array {vt} a second name; index it where it is")
        if name in B.INDEX_NAMES or name in self.out.consts:
            raise self.src.error(s, f"cannot assign to the built-in name {name!r}")
        loc = self.out.locals.get(name)
        self.check_not_after_loop(s, loc)
        if loc is None:
            if vt is None:
                raise self.src.error(s, f"{name!r} would have no type")
            self.declare(target, strong(vt), s)
        else:
            if isinstance(loc.type, ArrayType) or isinstance(vt, ArrayType):
                if loc.type != vt or loc.type.kind == "native":
                    raise self.src.error(s, f"local {name!r} was assigned a {loc.type} at line {loc.line}; "
                                            f"cannot assign it again (here a {vt})")
            elif not isinstance(vt, Weak) and vt != loc.type:
                raise self.src.error(s, f"local {name!r} has type {loc.type} from its first assignment at line "
                                        f"{loc.line}, but is assigned a {vt} here (cast with {loc.type}(...))")
            elif isinstance(vt, Weak) and vt.kind == "float" and not loc.type.is_float:
                raise self.src.error(s, f"local {name!r} has type {loc.type} (line {loc.line}) but is assigned "
                                        "a float literal")
        self.out.types[id(target)] = self.out.locals[name].type

    def check_not_after_loop(self, s, loc):
        """A loop variable lives in its loop only (C++ declares it in the for statement): no assignment after it."""
        if loc is not None and loc.kind == "loop" and loc.name not in self.loopvars:
            raise self.src.error(s, f"{loc.name!r} is the loop variable of the loop at line {loc.line} and cannot be "
                                    f"assigned after that loop; use another name")

    def declare(self, target, t, s):
        name = target.id
        if name in self.out.locals:
            loc = self.out.locals[name]
            self.check_not_after_loop(s, loc)
            if loc.type != t:
                raise self.src.error(s, f"local {name!r} has type {loc.type} from line {loc.line}, "
                                        f"but is declared {t} here")
            return
        self.check_new_name(s, name, "local")
        self.out.locals[name] = Local(name, t, self.src.line(s))

    def lvalue_type(self, target):
        if isinstance(target, ast.Name):
            loc = self.out.locals.get(target.id)
            if loc is None:
                raise self.src.error(target, f"{target.id!r} is used before it is assigned")
            if target.id in self.loopvars:
                raise self.src.error(target, f"cannot assign to loop variable {target.id!r} inside its loop")
            self.check_not_after_loop(target, loc)
            self.out.types[id(target)] = loc.type
            return loc.type
        if isinstance(target, ast.Subscript):
            t = self.expr(target)
            if isinstance(t, ArrayType):
                raise self.src.error(target, "cannot assign to a whole row; index every dimension")
            return t
        raise self.src.error(target, "can only assign to a name or an array element")

    def check_store(self, src_t, dst_t, node, what="element"):
        """Stores convert implicitly (f32 into a bf16 array), except a float into an integer: that needs a cast. The
        same rule holds for annotated locals, device-function parameters and declared return types."""
        if isinstance(src_t, (Scalar, Weak)) and isinstance(dst_t, Scalar) and src_t.is_float and not dst_t.is_float:
            raise self.src.error(node, f"storing a {src_t} into a {dst_t} {what} truncates; cast with {dst_t}(...)")

    def check_convertible(self, src_t, dst_t, node):
        if isinstance(src_t, (ArrayType, TupleType)) or isinstance(dst_t, (ArrayType, TupleType)) or src_t is None:
            if src_t != dst_t:
                raise self.src.error(node, f"cannot convert {src_t} to {dst_t}")

    def stmt_If(self, s):
        self.condition(s.test)
        self.block(s.body)
        self.block(s.orelse)

    def stmt_While(self, s):
        if s.orelse:
            raise self.src.error(s, "while ... else is not supported")
        self.condition(s.test)
        self.loop_depth += 1
        self.block(s.body)
        self.loop_depth -= 1

    def stmt_For(self, s):
        if s.orelse:
            raise self.src.error(s, "for ... else is not supported")
        it = s.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                and it.func.id in ("range", "grid", "static_range")):
            raise self.src.error(it, "a kernel loops over range(...), static_range(...) or grid(...)")
        kind = it.func.id
        for a in it.args:
            t = self.expr(a)
            if not (isinstance(t, (Scalar, Weak)) and (t.is_int or t is boolean)):
                raise self.src.error(a, f"{kind}() takes integers, got {t}")
        if kind == "grid":
            if not isinstance(s.target, ast.Tuple) or len(s.target.elts) != len(it.args):
                raise self.src.error(s, f"grid() with {len(it.args)} extents needs as many loop variables")
            names = s.target.elts
            vt = [strong(self.type(a)) for a in it.args]
        else:
            if not 1 <= len(it.args) <= 3:
                raise self.src.error(it, f"{kind}() takes 1 to 3 arguments")
            if not isinstance(s.target, ast.Name):
                raise self.src.error(s, f"{kind}() gives one loop variable")
            names = [s.target]
            t = self.type(it.args[0])
            for a in it.args[1:]:
                t = promote(t, self.type(a))
            vt = [strong(t)]
            if kind == "static_range":
                for a in it.args:
                    if id(a) not in self.out.values:
                        raise self.src.error(a, "static_range() needs compile-time constant bounds")
            if len(it.args) == 3 and id(it.args[2]) in self.out.values and self.out.values[id(it.args[2])] == 0:
                raise self.src.error(it, "range() step must not be zero")
            step = self.out.values.get(id(it.args[2])) if len(it.args) == 3 else None
            if step is not None and step < -1 and vt[0].kind == "uint":
                # C++ counts down with `i > end; i += step` in unsigned arithmetic: a step past zero wraps around
                raise self.src.error(it, f"range() with step {step} on a {vt[0]} loop variable can step below zero "
                                         f"and wrap around; loop over i32/i64 bounds (cast them)")
        added = []
        for n, t in zip(names, vt):
            if not isinstance(n, ast.Name):
                raise self.src.error(n, "loop variables must be names")
            loc = self.out.locals.get(n.id)
            if loc is not None and loc.kind != "loop":
                raise self.src.error(s, f"loop variable {n.id!r} is also a local (line {loc.line}); use another name")
            if n.id in self.loopvars:
                raise self.src.error(s, f"loop variable {n.id!r} is already used by an enclosing loop")
            self.check_new_name(n, n.id, "loop variable")
            self.out.locals[n.id] = Local(n.id, t, self.src.line(s), "loop")
            self.out.types[id(n)] = t
            self.loopvars.add(n.id)
            added.append(n.id)
        self.loop_depth += 1
        self.block(s.body)
        self.loop_depth -= 1
        for n in added:
            self.loopvars.discard(n)

    def stmt_Break(self, s):
        if not self.loop_depth:
            raise self.src.error(s, "break outside a loop")

    stmt_Continue = stmt_Break

    def stmt_Return(self, s):
        if self.out.is_kernel:
            if s.value is not None:
                raise self.src.error(s, "a kernel cannot return a value; write results to an array")
            return
        if s.value is None:
            if self.out.ret is not None:
                raise self.src.error(s, f"this device function returns {self.out.ret}; return a value")
            self.returns.append((s, None))
            return
        if isinstance(s.value, ast.Tuple):
            items = [self.expr(e) for e in s.value.elts]
            for e, it in zip(s.value.elts, items):
                self.scalar(it, e)
            t = TupleType(items)
            self.out.types[id(s.value)] = TupleType(strong(it) for it in items)
        else:
            t = self.expr(s.value)
        if self.out.ret is not None:
            self.check_return(s, t, self.out.ret)
        self.returns.append((s, t))

    def check_return(self, s, t, ret):
        """A return against the declared return type: same shape, and no float into an integer without a cast."""
        if isinstance(ret, TupleType):
            if not isinstance(t, TupleType) or len(t.items) != len(ret.items):
                raise self.src.error(s, f"returns {t} but the function returns {ret}")
            nodes = s.value.elts if isinstance(s.value, ast.Tuple) else [s.value] * len(t.items)
            for e, it, rt in zip(nodes, t.items, ret.items):
                self.check_store(it, rt, e, "return value")
        elif isinstance(t, (TupleType, ArrayType)) or isinstance(ret, ArrayType):
            if t != ret:
                raise self.src.error(s, f"returns {t} but the function returns {ret}")
        else:
            self.check_store(t, ret, s.value, "return value")

    def return_type(self, fdef):
        """A device function's return type: its annotation, or the one type all its returns agree on (a literal
        adopts the others' type: `return 0` beside `return x` with x: f32 returns f32). A function that returns a
        value must return one on every path (C++ would fall off the end of a non-void function)."""
        valued = [(s, t) for s, t in self.returns if t is not None]
        ret = self.out.ret
        if ret is None and valued:
            s0, ret = valued[0]
            for s, t in valued[1:]:
                ret = self.unify_return(s0, ret, s, t)
            ret = TupleType(strong(it) for it in ret.items) if isinstance(ret, TupleType) else strong(ret)
            bare = [s for s, t in self.returns if t is None]
            if bare:
                raise self.src.error(bare[0], f"a bare return in {self.src.fn.__name__}, which returns a {ret} at "
                                              f"line {self.src.line(s0)}; return a value")
        if ret is not None and not _always_returns(fdef.body):
            raise self.src.error(fdef, f"device function {self.src.fn.__name__} returns a {ret} but can reach its end "
                                       f"without a return; return a value on every path (e.g. a final return)")
        return ret

    def unify_return(self, s0, a, s, b):
        """The common type of two returns' values (a from statement s0, b from s), or an error naming both lines."""
        def clash():
            return self.src.error(s, f"returns a {b} here but a {a} at line {self.src.line(s0)}; make every return "
                                     f"of {self.src.fn.__name__} the same type (cast), or annotate its return type")
        if isinstance(a, TupleType) or isinstance(b, TupleType):
            if not (isinstance(a, TupleType) and isinstance(b, TupleType)) or len(a.items) != len(b.items):
                raise clash()
            return TupleType(self.unify_return(s0, x, s, y) for x, y in zip(a.items, b.items))
        if isinstance(a, ArrayType) or isinstance(b, ArrayType):
            if a != b:
                raise clash()
            return a
        if isinstance(a, Weak) and isinstance(b, Weak):
            return promote(a, b)
        strong_t, weak_t = (b, a) if isinstance(a, Weak) else (a, b)
        if isinstance(weak_t, Weak):  # a literal adopts the other's type; a float literal beside an integer: f32
            return f32 if weak_t.is_float and not strong_t.is_float else strong_t
        if a != b:
            raise clash()
        return a

    def condition(self, node):
        """A value used for its truth (if, while, not, a ternary's test, ballot): any scalar, and `and`/`or` of any
        scalars (their truth is Python's whichever operand they give)."""
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self.condition(v)
            self.out.types[id(node)] = boolean
            return boolean
        t = self.expr(node)
        if not isinstance(t, (Scalar, Weak)):
            raise self.src.error(node, f"a condition must be a scalar, got {t}")
        return t

    # -- expressions ------------------------------------------------------------------------------------
    def type(self, node):
        return self.out.types[id(node)]

    def expr(self, node):
        m = getattr(self, "expr_" + type(node).__name__, None)
        if m is None:
            raise self.src.error(node, f"{type(node).__name__} expressions are not part of the kernel language")
        t = m(node)
        self.out.types[id(node)] = t
        return t

    def const(self, node, value):
        self.out.values[id(node)] = value
        if isinstance(value, bool):
            return boolean
        return WEAK_INT if isinstance(value, int) else WEAK_FLOAT

    def expr_Constant(self, node):
        v = node.value
        if isinstance(v, bool) or isinstance(v, (int, float)):
            return self.const(node, v)
        raise self.src.error(node, f"{v!r} is not a number")

    def expr_Name(self, node):
        name = node.id
        loc = self.out.locals.get(name)
        if loc is not None:
            if loc.kind == "loop" and name not in self.loopvars:
                raise self.src.error(node, f"loop variable {name!r} is used after its loop")
            return loc.type
        if name in self.out.consts:
            return self.const(node, self.out.consts[name])
        if name in B.INDEX_NAMES:
            return i32
        if name == "inf":
            return self.const(node, math.inf)
        if name == "nan":
            return self.const(node, math.nan)
        obj = self._resolve_object(node)
        if isinstance(obj, bool):
            return self.const(node, obj)
        if isinstance(obj, (int, float)):
            return self.const(node, obj)
        if obj is not None and getattr(obj, "__module__", "").startswith("numpy") and hasattr(obj, "item"):
            return self.const(node, obj.item())
        raise self.src.error(node, f"unknown name {name!r} (not a local, parameter, built-in or global number)")

    def expr_Attribute(self, node):
        obj = self._resolve_object(node)
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            return self.const(node, obj)
        if isinstance(obj, B.Builtin) and obj.name in ("inf", "nan"):
            return self.const(node, math.inf if obj.name == "inf" else math.nan)
        if isinstance(obj, B.Builtin) and obj.name in B.INDEX_NAMES:  # e.g. frost.kernel.tx
            self.out.attr_names[id(node)] = obj.name
            return i32
        raise self.src.error(node, "attributes are supported only as a.shape[k] and a.tile(...)")

    def expr_UnaryOp(self, node):
        t = self.condition(node.operand) if isinstance(node.op, ast.Not) else self.expr(node.operand)
        if id(node.operand) in self.out.values:
            v = self.out.values[id(node.operand)]
            if isinstance(node.op, ast.Invert) and not isinstance(v, int):
                raise self.src.error(node, f"~ needs an integer, got {t}")
            folded = {ast.USub: lambda x: -x, ast.UAdd: lambda x: x, ast.Not: lambda x: not x,
                      ast.Invert: lambda x: ~x}[type(node.op)](v)
            if isinstance(node.op, ast.Not):
                self.out.values[id(node)] = folded
                return boolean
            return self.const(node, folded)
        self.scalar(t, node.operand)
        if isinstance(node.op, ast.Not):
            return boolean
        if isinstance(node.op, ast.Invert) and not (t.is_int or t is boolean):
            raise self.src.error(node, f"~ needs an integer, got {t}")
        return arith_type(t)

    def scalar(self, t, node):
        if not isinstance(t, (Scalar, Weak)):
            raise self.src.error(node, f"expected a number, got {t}")

    def binop_type(self, op, a, b, node):
        self.scalar(a, node)
        self.scalar(b, node)
        name = type(op).__name__
        if name == "MatMult":
            raise self.src.error(node, "@ is not supported on scalars")
        if name in ("LShift", "RShift", "BitAnd", "BitOr", "BitXor"):
            for t in (a, b):
                if not (t.is_int or t is boolean):
                    raise self.src.error(node, f"bitwise operator needs integers, got {a} and {b}")
            return promote(a, b)
        t = promote(a, b)
        if name == "Div" and not isinstance(t, Weak) and not t.is_float:
            return f32
        if name == "Pow" and not isinstance(t, Weak) and not t.is_float:
            return f32
        return t

    def expr_BinOp(self, node):
        a = self.expr(node.left)
        b = self.expr(node.right)
        t = self.binop_type(node.op, a, b, node)
        va, vb = self.out.values.get(id(node.left)), self.out.values.get(id(node.right))
        if isinstance(t, Weak) and va is not None and vb is not None:
            return self.const(node, fold_binop(node.op, va, vb, t, self.src, node))
        return t

    def expr_BoolOp(self, node):
        """`a and b` / `a or b` as a value: Python gives one of the operands, C++ a bool; they agree on bools only."""
        word = "and" if isinstance(node.op, ast.And) else "or"
        for v in node.values:
            t = self.condition(v)
            if t is not boolean:
                raise self.src.error(v, f"`{word}` on a {t}: Python gives one of the operands, a kernel a bool; use "
                                        f"bool operands (comparisons such as x != 0) or a conditional expression "
                                        f"(a if a != 0 else b)")
        return boolean

    def folded_condition(self, node: ast.expr) -> object:
        """The value of a condition on compile-time constants (`BIG > 4`, `A and not B`), or None. The code generators
        write comparisons as they are, so they are folded only where a Const[bool] needs their value."""
        if id(node) in self.out.values:
            return self.out.values[id(node)]
        if isinstance(node, ast.Compare):
            values = [self.folded_condition(e) for e in (node.left, *node.comparators)]
            if any(v is None for v in values):
                return None
            return all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, values, values[1:]))
        if isinstance(node, ast.BoolOp):
            values = [self.folded_condition(e) for e in node.values]
            if any(v is None for v in values):
                return None
            return all(values) if isinstance(node.op, ast.And) else any(values)
        return None

    def expr_Compare(self, node):
        left = self.expr(node.left)
        for op, right in zip(node.ops, node.comparators):
            rt = self.expr(right)
            if isinstance(op, (ast.In, ast.NotIn, ast.Is, ast.IsNot)):
                raise self.src.error(node, "only <, <=, >, >=, ==, != compare numbers in a kernel")
            self.scalar(left, node)
            self.scalar(rt, node)
            left = rt
        return boolean

    def expr_IfExp(self, node):
        self.condition(node.test)
        a, b = self.expr(node.body), self.expr(node.orelse)
        self.scalar(a, node.body)
        self.scalar(b, node.orelse)
        test = self.folded_condition(node.test)
        va, vb = self.out.values.get(id(node.body)), self.out.values.get(id(node.orelse))
        if test is not None and va is not None and vb is not None and isinstance(a, Weak) and isinstance(b, Weak):
            return self.const(node, va if test else vb)   # `16 if RS else BR` is a constant too
        t = a if (a == b and not isinstance(a, Weak)) else promote(a, b)
        return strong(t)

    def expr_Tuple(self, node):
        raise self.src.error(node, "tuples appear only in `return a, b`, `a, b = ...` and index lists")

    def expr_Subscript(self, node):
        # a.shape[k]
        if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            at = self.expr(node.value.value)
            if not isinstance(at, ArrayType):
                raise self.src.error(node, "only arrays have a shape")
            k = self.const_int(node.slice)
            if not 0 <= k < at.ndim:
                raise self.src.error(node, f"{at} has {at.ndim} dimension(s); shape[{k}] does not exist")
            if at.shape is not None:
                return self.const(node, at.shape[k])
            return i64
        at = self.expr(node.value)
        if not isinstance(at, ArrayType):
            raise self.src.error(node, f"cannot index a value of type {at}")
        idx = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for i in idx:
            if isinstance(i, ast.Slice):
                raise self.src.error(i, "slices are not supported; use a.tile((rows, cols), (i, j))")
            t = self.expr(i)
            if not (isinstance(t, (Scalar, Weak)) and (t.is_int or t is boolean)):
                raise self.src.error(i, f"an index must be an integer, got {t}")
        if len(idx) > at.ndim:
            raise self.src.error(node, f"{len(idx)} indices for a {at.ndim}-dimensional array")
        if len(idx) < at.ndim:
            if at.kind != "native":
                raise self.src.error(node, f"{at} needs {at.ndim} indices")
            return ArrayType(at.elem, at.ndim - len(idx), at.space, "native", at.shape[len(idx):])
        return at.elem

    def const_int(self, node):
        self.expr(node)
        v = self.out.values.get(id(node))
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.src.error(node, "expected a compile-time integer constant")
        return v

    def const_shape(self, node):
        if isinstance(node, ast.Tuple):
            shape = tuple(self.const_int(e) for e in node.elts)
        else:
            shape = (self.const_int(node),)
        if not shape or any(d <= 0 for d in shape):
            raise self.src.error(node, f"array shape {shape} must have positive, compile-time sizes")
        return shape

    def scalar_type_arg(self, node):
        obj = self._resolve_object(node)
        if not isinstance(obj, Scalar):
            raise self.src.error(node, "expected a scalar type such as f32")
        return obj

    def expr_Call(self, node):
        if node.keywords:
            raise self.src.error(node, "keyword arguments are not supported in kernel calls")
        f = node.func
        # method calls: a.tile(shape, index)
        if isinstance(f, ast.Attribute) and f.attr == "tile":
            at = self.expr(f.value)
            if not isinstance(at, ArrayType) or at.ndim != 2:
                raise self.src.error(node, "tile() needs a 2-D array")
            if len(node.args) != 2:
                raise self.src.error(node, "tile((rows, cols), (i, j)) takes a shape and a tile index")
            shape = self.const_shape(node.args[0])
            if len(shape) != 2 or not isinstance(node.args[1], ast.Tuple) or len(node.args[1].elts) != 2:
                raise self.src.error(node, "tile((rows, cols), (i, j)) takes a 2-D shape and a 2-D tile index")
            for e in node.args[1].elts:
                t = self.expr(e)
                if not (isinstance(t, (Scalar, Weak)) and t.is_int):
                    raise self.src.error(e, f"a tile index must be an integer, got {t}")
            return ArrayType(at.elem, 2, at.space, "view", shape)
        obj = self._resolve_object(f)
        name = None
        if isinstance(obj, B.Builtin):
            name = obj.name
        elif isinstance(f, ast.Name) and f.id in B.BUILTINS and not _is_device(obj) and not isinstance(obj, Scalar):
            name = f.id
        if isinstance(obj, Scalar):
            return self.call_cast(node, obj)
        if _is_device(obj):
            return self.call_device(node, obj)
        if name is None:
            what = ast.unparse(f)
            raise self.src.error(node, f"unknown function {what!r} (not a built-in or a @kernel.device function)")
        definition = DEFINITIONS.get(name)
        if definition is None:
            raise self.src.error(node, f"{name}() cannot be used here")
        return definition.check(self, node)

    def args(self, node, n, name):
        if isinstance(n, int):
            n = (n,)
        if len(node.args) not in n:
            raise self.src.error(node, f"{name}() takes {' or '.join(map(str, n))} arguments, got {len(node.args)}")
        return [self.expr(a) for a in node.args]

    def call_cast(self, node, t):
        self.out.casts.add(id(node))
        (a,) = self.args(node, 1, t.name)
        self.scalar(a, node.args[0])
        v = self.out.values.get(id(node.args[0]))
        if isinstance(v, float) and t.is_int and not math.isfinite(v):
            raise self.src.error(node, f"{t.name}({v}) of a constant has no integer value")
        if v is not None and not t.is_float and t is not boolean:
            self.out.values[id(node)] = v
        return t

    # -- device functions -----------------------------------------------------------------------------
    def call_device(self, node, dev):
        arg_types, values = [], []
        for a in node.args:
            t = self.expr(a)
            if isinstance(t, TupleType) or t is None:
                raise self.src.error(a, f"cannot pass {t} to a device function")
            arg_types.append(strong(t) if isinstance(t, Weak) else t)
            values.append(self.out.values.get(id(a)) if isinstance(t, Weak) or t is boolean else None)
        checked = dev.check(arg_types, self.device_cache, node_err=lambda m: self.src.error(node, m),
                            values=values)
        self.out.callees[id(node)] = checked
        params = {p.name for p in self.out.params}
        for k, p in zip(checked.param_positions, checked.params):
            a = node.args[k]
            if p.name in checked.vector_params and isinstance(a, ast.Name) and a.id in params:
                need = max(self.out.vector_params.get(a.id, 0), checked.vector_params[p.name])
                self.out.vector_params[a.id] = need  # the launch checks the pointer's alignment
            if p.name in checked.wgmma_accs and isinstance(a, ast.Name) and a.id in self.out.locals:
                # a wgmma issued in the callee writes this array: the caller's wgmma_wait and wgmma_fence fence it
                self.out.wgmma_accs[a.id] = checked.wgmma_accs[p.name]
        if checked.has_yield:
            self.out.has_yield = True
        if checked.uses_dyn_smem:
            self.out.uses_dyn_smem = True
        if checked.uses_wgmma:
            self.out.uses_wgmma = True
        if checked.uses_tensor_maps:
            self.out.uses_tensor_maps = True
        if checked.needs_sm90a:
            self.out.needs_sm90a = True
        if checked.uses_named_barriers:
            self.out.uses_named_barriers = True
        if checked.uses_grid_sync:
            raise self.src.error(node, f"grid_sync() must be called in the kernel itself, not in device function "
                                       f"{checked.cname}")
        return checked.ret


class DeviceFunction:
    """A function callable from kernels, written in the kernel language; checked per argument types."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._scope = enclosing_scope(fn)  # read now: src is parsed at the first call, when the frame is gone
        self._src = None

    @property
    def src(self) -> Source:
        if self._src is None:
            self._src = Source(self.fn, self._scope)
        return self._src

    def check(self, arg_types, cache: dict, node_err, values=None):
        fdef = self.src.tree
        n = len(fdef.args.args)
        if n != len(arg_types):
            raise node_err(f"{self.__name__}() takes {n} arguments, got {len(arg_types)}")
        values = values or [None] * n
        probe = Checker(self.src, self.__name__, False, {}, cache)
        given, consts = [], {}
        for arg, t, v in zip(fdef.args.args, arg_types, values):
            want = probe._annotation(arg.annotation, arg) if arg.annotation is not None else None
            if isinstance(want, ConstType):
                if v is None:
                    raise node_err(f"{self.__name__}(): parameter {arg.arg!r} is a Const; pass a compile-time "
                                   f"constant")
                try:
                    consts[arg.arg] = want.value(v, f"{self.__name__}(): parameter {arg.arg!r}")
                except TypeError as exc:
                    raise node_err(str(exc)) from None
                given.append(None)
            elif isinstance(want, ArrayType):
                if not isinstance(t, ArrayType) or (t.elem, t.ndim) != (want.elem, want.ndim):
                    raise node_err(f"{self.__name__}(): parameter {arg.arg!r} is {want}, got {t}")
                given.append(t)
            elif isinstance(want, Scalar):
                if isinstance(t, ArrayType):
                    raise node_err(f"{self.__name__}(): parameter {arg.arg!r} is {want}, got {t}")
                if t.is_float and not want.is_float:  # the rule of array stores: float into integer needs a cast
                    raise node_err(f"{self.__name__}(): passing a {t} to parameter {arg.arg!r} ({want}) truncates; "
                                   f"cast with {want}(...)")
                given.append(want)
            else:
                given.append(t)
        key = (id(self), tuple(t.key() if isinstance(t, ArrayType) else getattr(t, "name", None) for t in given),
               tuple(sorted(consts.items())))
        hit = cache.get(key)
        if hit == "busy":
            raise node_err(f"device function {self.__name__} calls itself; recursion is not supported")
        if hit is not None:
            return hit
        cache[key] = "busy"
        cname = f"{self.__name__}_{sum(1 for v in cache.values() if v != 'busy')}"
        checked = Checker(self.src, cname, False, consts, cache).check(given)
        del cache[key]
        cache[key] = checked
        return checked

    def __call__(self, *args):
        raise RuntimeError(f"{self.__name__} is a @kernel.device function: call it from inside a kernel")


def enclosing_scope(fn: Callable) -> dict:
    """The locals of the function that defines fn, read from its frame while fn is decorated.

    A name that only fn's annotations use is no closure cell: under `from __future__ import annotations`,
    `x: Array[T]` in a factory over T is the string 'Array[T]' and `acc: T = 0` is never evaluated, so without this
    the front end would not see T. Only values a kernel can use are kept (types, numbers, device functions), so that
    a kernel does not hold on to its factory's arrays."""
    outer, nested, _ = getattr(fn, "__qualname__", "").rpartition(".<locals>.")  # no name: Source refuses fn
    if not nested:
        return {}
    frame = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code.co_qualname == outer and frame.f_globals is getattr(fn, "__globals__", None):
                return {name: value for name, value in frame.f_locals.items()
                        if _meaningful(value) or isinstance(value, ArrayType)}
            frame = frame.f_back
        return {}
    finally:
        del frame  # a frame held here would keep the factory's locals alive


def matmul_call(s):
    """`acc += a @ b` on register tiles is `mma_tile(acc, a, b)` (one call node per statement, made once)."""
    call = getattr(s, "_frost_call", None)
    if call is None:
        call = ast.Call(func=ast.Name(id="mma_tile", ctx=ast.Load()),
                        args=[_as_load(s.target), s.value.left, s.value.right], keywords=[])
        ast.copy_location(call, s)
        ast.fix_missing_locations(call)
        s._frost_call = call
    return call


def _as_load(node):
    if isinstance(node, ast.Name):
        return ast.copy_location(ast.Name(id=node.id, ctx=ast.Load()), node)
    return node


def _meaningful(obj) -> bool:
    """Whether a global means something in a kernel (else a built-in of the same name wins)."""
    return (isinstance(obj, (B.Builtin, Scalar, int, float, pytypes.ModuleType, _ArrayAnnotation, _ConstAnnotation,
                             ConstType, _TensorMapAnnotation)) or _is_device(obj))


def _is_allocation(node) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("shared", "local", "dynamic_shared"))


def _is_device(obj) -> bool:
    return isinstance(obj, DeviceFunction)


def _annotation_namespace():
    ns = dict(SCALAR_BY_NAME)
    ns.update(Array=Array, Const=Const, TensorMap=TensorMap)
    return ns


def fold_binop(op, a, b, t, src, node):
    name = type(op).__name__
    try:
        if name == "Add":
            return a + b
        if name == "Sub":
            return a - b
        if name == "Mult":
            return a * b
        if name == "Div":
            return a / b
        if name == "FloorDiv":
            return c_div(a, b) if t.kind == "int" else float(math.trunc(a / b))
        if name == "Mod":
            return c_mod(a, b) if t.kind == "int" else math.fmod(a, b)
        if name == "Pow":
            return a ** b
        if name == "LShift":
            return a << b
        if name == "RShift":
            return a >> b
        if name == "BitAnd":
            return a & b
        if name == "BitOr":
            return a | b
        if name == "BitXor":
            return a ^ b
    except ZeroDivisionError:
        raise src.error(node, "division by zero in a constant expression") from None
    except (ArithmeticError, ValueError, TypeError) as exc:  # 1 << -1, 2.0 ** 2000, inf // 2
        raise src.error(node, f"the constant expression cannot be computed ({exc}); change its operands") from None
    raise src.error(node, f"operator {name} is not supported")


def check_literal(src, node, value, t) -> None:
    """A literal takes the type of where it is used (`x < 3000000000` with x: i32 makes it an i32): it must fit in
    that type, else C++ would type it long long (or round it to an f32 inf) while the simulator wraps it."""
    t = strong(t)
    if t is boolean or not isinstance(t, Scalar):
        return
    if t.is_float:
        try:  # beyond f32's range (1e39 as an f32) it is inf, in C++ and NumPy alike (cgen.literal writes inf)
            float(value)
        except OverflowError:
            raise src.error(node, f"the literal {value} is beyond the range of {t}") from None
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise src.error(node, f"the constant {value} has no {t} value")
    bits = 8 * t.np.itemsize
    lo, hi = -(1 << (bits - 1)), (1 << bits) if t.kind == "uint" else (1 << (bits - 1))
    if not lo <= int(value) < hi:
        raise src.error(node, f"the literal {value} takes the type {t} here (a literal adopts the other operand's "
                              f"type; alone it is i32) and does not fit in it; write i64({value}) or use wider "
                              f"operands")



def _always_returns(stmts) -> bool:
    """Whether every path through stmts ends in a return."""
    for s in stmts:
        if isinstance(s, ast.Return):
            return True
        if isinstance(s, ast.If) and _always_returns(s.body) and _always_returns(s.orelse):
            return True
    return False
