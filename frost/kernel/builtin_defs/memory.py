"""Built-in memory operations: array allocation, atomics, vector and read-only loads, asynchronous copies."""
from __future__ import annotations

import ast

from frost.kernel.builtin_defs.base import BuiltinDef, Checking, CudaBuilding, SimBuilding, array_any
from frost.kernel.types import ArrayType, Scalar, TupleType, Weak, bf16, f32, i64


# -- allocation: shared(T, shape), local(T, shape), dynamic_shared(T[, shape[, byte_offset]]) --------------
def check_named_allocation(ck: Checking, node, name):
    """shared()/local() declare an array, which C cannot do inside an expression: only `name = shared(...)`."""
    if id(node) not in ck.named_allocations:
        raise ck.src.error(node, f"{name}() declares an array: assign it to a name first (scratch = {name}(...)) "
                                 f"and use the name")


class Allocation(BuiltinDef):
    """shared(T, shape) / local(T, shape): the C++ builder declares the array at the top of the function."""

    def check(self, ck: Checking, node):
        name = self.name
        if len(node.args) != 2:
            raise ck.src.error(node, f"{name}(type, shape) takes a type and a shape")
        check_named_allocation(ck, node, name)
        t = ck.scalar_type_arg(node.args[0])
        shape = ck.const_shape(node.args[1])
        if name == "shared":
            ck.out.shared_ids[id(node)] = len(ck.out.shared_ids)
        return ArrayType(t, len(shape), name, "native", shape)

    def sim(self, g: SimBuilding, node, t) -> str:
        return g.alloc(node, self.name)


class DynamicShared(BuiltinDef):
    """dynamic_shared(T) is the launch's dynamic shared memory as a 1-D view; with a shape, an array carved out of
    it at a byte offset (declared at the top of the function by the C++ builder, as shared() is)."""

    def check(self, ck: Checking, node):
        if not 1 <= len(node.args) <= 3:
            raise ck.src.error(node, "dynamic_shared(type[, shape[, byte_offset]]) takes 1 to 3 arguments")
        t = ck.scalar_type_arg(node.args[0])
        ck.out.uses_dyn_smem = True
        if len(node.args) == 1:
            return ArrayType(t, 1, "shared", "view")
        check_named_allocation(ck, node, "dynamic_shared")
        shape = ck.const_shape(node.args[1])
        offset = ck.const_int(node.args[2]) if len(node.args) == 3 else 0
        if offset % 16:
            raise ck.src.error(node, f"dynamic_shared() byte offset {offset} must be a multiple of 16")
        ck.out.dyn_arrays[id(node)] = offset
        return ArrayType(t, len(shape), "shared", "native", shape)

    def cuda_view(self, g: CudaBuilding, node, at) -> str:
        e = at.elem.c
        return (f"frost_view1<{e}>{{reinterpret_cast<{e}*>(frost_dynamic_smem), "
                f"(long long)(frost_dynamic_smem_size() / sizeof({e}))}}")

    def sim(self, g: SimBuilding, node, t) -> str:
        dtype = f"_np.dtype({t.elem.np.name!r})" if t.elem is not bf16 else "_BF16_DT"
        if t.shape is None:
            return f"_T.dynamic_shared({dtype})"
        return f"_T.dynamic_shared({dtype}, {t.shape}, {g.fn.dyn_arrays[id(node)]})"


# -- atomics ----------------------------------------------------------------------------------------------------
def array_index(ck: Checking, node, arr_node, idx_node, name):
    """The array of an atomic: a global or shared one, indexed by as many integers as it has dimensions."""
    at = ck.expr(arr_node)
    if not isinstance(at, ArrayType) or at.space == "local":
        raise ck.src.error(node, f"{name}() needs a global or shared array, got {at}")
    idx = idx_node.elts if isinstance(idx_node, ast.Tuple) else [idx_node]
    if len(idx) != at.ndim:
        raise ck.src.error(node, f"{name}() needs {at.ndim} indices into {at}")
    for i in idx:
        t = ck.expr(i)
        if not (isinstance(t, (Scalar, Weak)) and t.is_int):
            raise ck.src.error(i, f"an index must be an integer, got {t}")
    return at


class Atomic(BuiltinDef):
    """atomic_add / atomic_max / atomic_min(array, index, value): the old value. On f32, max and min ignore a NaN
    value and replace a stored NaN (frost_atomic_max in the C++ prelude, np.fmax in the simulator)."""

    def __init__(self, name: str, c_fn: str, op: str, kinds: tuple) -> None:
        super().__init__(name)
        self.c_fn, self.op, self.kinds = c_fn, op, kinds

    def check(self, ck: Checking, node):
        name, kinds = self.name, self.kinds
        if len(node.args) != 3:
            raise ck.src.error(node, f"{name}(array, index, value) takes 3 arguments")
        at = array_index(ck, node, node.args[0], node.args[1], name)
        if at.elem.name not in kinds:
            raise ck.src.error(node, f"{name}() supports {', '.join(kinds)} arrays, not {at.elem}")
        ck.scalar(ck.expr(node.args[2]), node.args[2])
        return at.elem

    def cuda(self, g: CudaBuilding, node, t) -> str:
        fn = self.c_fn
        ptr = g.elem_ptr(node.args[0], node.args[1])
        v = g.ex(node.args[2], t)
        if t is i64:
            if fn == "atomicAdd":
                return f"(long long){fn}((unsigned long long*){ptr}, (unsigned long long)({v}))"
            return f"{fn}({ptr}, {v})"
        if t is f32 and fn in ("atomicMax", "atomicMin"):
            return f"frost_atomic_{fn[6:].lower()}({ptr}, {v})"
        return f"{fn}({ptr}, {v})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"{g.ex(node.args[0])}.atomic({g.index_tuple(node.args[1])}, {self.op!r}, {g.ex(node.args[2], t)})"


class AtomicCas(BuiltinDef):
    def check(self, ck: Checking, node):
        if len(node.args) != 4:
            raise ck.src.error(node, "atomic_cas(array, index, compare, value) takes 4 arguments")
        at = array_index(ck, node, node.args[0], node.args[1], "atomic_cas")
        if at.elem.name not in ("i32", "u32", "f32", "i64"):
            raise ck.src.error(node, f"atomic_cas() supports i32, u32, i64 and f32 arrays, not {at.elem}")
        for a in node.args[2:]:
            ck.scalar(ck.expr(a), a)
        return at.elem

    def cuda(self, g: CudaBuilding, node, t) -> str:
        ptr = g.elem_ptr(node.args[0], node.args[1])
        c, v = g.ex(node.args[2], t), g.ex(node.args[3], t)
        if t is f32:
            return f"frost_atomic_cas({ptr}, {c}, {v})"
        if t is i64:
            return (f"(long long)atomicCAS((unsigned long long*){ptr}, (unsigned long long)({c}), "
                    f"(unsigned long long)({v}))")
        return f"atomicCAS({ptr}, {c}, {v})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return (f"{g.ex(node.args[0])}.atomic({g.index_tuple(node.args[1])}, 'cas', {g.ex(node.args[2], t)}, "
                f"{g.ex(node.args[3], t)})")


# -- vector and read-only loads: loadN/storeN move N elements in one access of N x the element's bytes ---------
WORD_ELEMS = ("f32", "i32", "u32")  # 4-byte elements: load2/store2 (8 bytes), load4/store4 (16)
HALF_ELEMS = ("bf16", "f16")        # 2-byte elements: load2/store2 (4 bytes), load4/store4 (8), load8/store8 (16)


def vector_elems(width: int) -> tuple:
    return HALF_ELEMS if width == 8 else WORD_ELEMS + HALF_ELEMS


def vector_array(ck: Checking, node, name, spaces=("global", "shared"), width=4, elems=None):
    """The array of loadN/storeN/ldg4(a, i, ...): 1-D, elements of a type that width allows, i an integer; an
    array parameter is noted with the alignment (the access's bytes) the launch checks its pointer for."""
    elems = elems or vector_elems(width)
    at = ck.expr(node.args[0])
    if not (isinstance(at, ArrayType) and at.ndim == 1 and at.space in spaces):
        where = " or ".join(spaces)
        raise ck.src.error(node, f"{name}() needs a 1-D {where} array of {', '.join(elems)}, got {at}")
    if at.elem.name not in elems:
        raise ck.src.error(node, f"{name}() moves {width} elements of {', '.join(elems)} in one access, "
                                 f"not {at.elem}")
    it = ck.expr(node.args[1])
    if not (isinstance(it, (Scalar, Weak)) and it.is_int):
        raise ck.src.error(node.args[1], f"{name}() index must be an integer, got {it}")
    if isinstance(node.args[0], ast.Name) and node.args[0].id in {p.name for p in ck.out.params}:
        name = node.args[0].id
        need = at.elem.np.itemsize * width
        ck.out.vector_params[name] = max(ck.out.vector_params.get(name, 0), need)
    return at


def vector_function(g: CudaBuilding, node, name: str) -> str:
    """The prelude's function for a vector access: 16-bit elements move as 32-bit words (frost_load8h, ...)."""
    return f"frost_{name}h" if g.type(node.args[0]).elem.np.itemsize == 2 else f"frost_{name}"


class VectorLoad(BuiltinDef):
    """a, b, c, d = load4(x, i): x[i:i+4] in one load of 4 elements (16 bytes of f32/i32/u32, 8 of bf16/f16;
    i % 4 == 0, x aligned to the access); ldg4 through the read-only cache (4-byte elements); load2 takes two
    elements, load8 eight of bf16/f16 (16 bytes)."""

    def __init__(self, name: str, spaces: tuple, width: int, sim_args: str, elems: tuple | None = None) -> None:
        super().__init__(name)
        self.spaces, self.width, self.sim_args, self.elems = spaces, width, sim_args, elems

    def check(self, ck: Checking, node):
        if len(node.args) != 2:
            raise ck.src.error(node, f"{self.name}(array, index) takes 2 arguments, got {len(node.args)}")
        at = vector_array(ck, node, self.name, self.spaces, self.width, self.elems)
        return TupleType((at.elem,) * self.width)

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"{vector_function(g, node, self.name)}({g.elem_ptr(node.args[0], node.args[1])})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"{g.ex(node.args[0])}.ld4({g.ex(node.args[1])}{self.sim_args})"


class VectorStore(BuiltinDef):
    """store4(x, i, a, b, c, d): x[i:i+4] = a, b, c, d in one store; store2 and store8 move 2 and 8 elements."""

    def __init__(self, name: str, width: int, sim_args: str) -> None:
        super().__init__(name)
        self.width, self.sim_args = width, sim_args

    def check(self, ck: Checking, node):
        name, width = self.name, self.width
        if len(node.args) != 2 + width:
            vals = ", ".join("abcdefgh"[:width])
            raise ck.src.error(node, f"{name}(array, index, {vals}) takes {2 + width} arguments, "
                                     f"got {len(node.args)}")
        at = vector_array(ck, node, name, width=width)
        for v in node.args[2:]:
            vt = ck.expr(v)
            ck.scalar(vt, v)
            ck.check_store(vt, at.elem, v)
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        elem = g.type(node.args[0]).elem
        vals = ", ".join(g.ex(v, elem) for v in node.args[2:])
        return f"{vector_function(g, node, self.name)}({g.elem_ptr(node.args[0], node.args[1])}, {vals})"

    def sim(self, g: SimBuilding, node, t) -> str:
        elem = g.type(node.args[0]).elem
        vals = ", ".join(g.ex(v, elem) for v in node.args[2:])
        return f"{g.ex(node.args[0])}.st4({g.ex(node.args[1])}, {vals}{self.sim_args})"


class Ldg(BuiltinDef):
    """ldg(x, i): x[i] through the read-only (non-coherent) data cache; x must not be written by the kernel."""

    def check(self, ck: Checking, node):
        if len(node.args) != 2:
            raise ck.src.error(node, f"ldg(array, index) takes 2 arguments, got {len(node.args)}")
        at = ck.expr(node.args[0])
        if not (isinstance(at, ArrayType) and at.ndim == 1 and at.space == "global"
                and at.elem.name in ("f32", "f64", "i32", "u32", "i64")):
            raise ck.src.error(node, f"ldg() needs a 1-D global array of f32, f64, i32, u32 or i64, got {at}")
        it = ck.expr(node.args[1])
        if not (isinstance(it, (Scalar, Weak)) and it.is_int):
            raise ck.src.error(node.args[1], f"ldg() index must be an integer, got {it}")
        return at.elem

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"__ldg({g.elem_ptr(node.args[0], node.args[1])})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"{g.ex(node.args[0])}.ld({g.ex(node.args[1])})"


# -- asynchronous copies (cp.async): the simulator performs a group's copies at the cp_wait that retires it --------
class CpAsync16(BuiltinDef):
    def check(self, ck: Checking, node):
        if len(node.args) != 4:
            raise ck.src.error(node, "cp_async16(dst_shared, dst_index, src_global, src_index) takes 4 arguments")
        dt = array_any(ck, node, node.args[0], node.args[1], "cp_async16")
        st = array_any(ck, node, node.args[2], node.args[3], "cp_async16")
        if dt.space != "shared" or st.space != "global":
            raise ck.src.error(node, f"cp_async16() copies from a global array to a shared one, got {st} -> {dt}")
        if dt.elem.np.itemsize != st.elem.np.itemsize:
            raise ck.src.error(node, f"cp_async16() between {st.elem} and {dt.elem} elements")
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        dst = g.elem_ptr(node.args[0], node.args[1])
        src = g.elem_ptr(node.args[2], node.args[3])
        return (f'asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(frost_smem_addr({dst})), '
                f'"l"({src}) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        return (f"_T.cp_async({g.ex(node.args[0])}, {g.index_tuple(node.args[1])}, {g.ex(node.args[2])}, "
                f"{g.index_tuple(node.args[3])})")


class CpCommit(BuiltinDef):
    def check(self, ck: Checking, node):
        ck.args(node, 0, "cp_commit")
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return 'asm volatile("cp.async.commit_group;" ::: "memory")'

    def sim(self, g: SimBuilding, node, t) -> str:
        return "_T.cp_commit()"


class CpWait(BuiltinDef):
    def check(self, ck: Checking, node):
        if len(node.args) != 1:
            raise ck.src.error(node, "cp_wait(n) takes the number of groups left in flight")
        ck.const_int(node.args[0])
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        n = g.fn.values[id(node.args[0])]
        return f'asm volatile("cp.async.wait_group {int(n)};" ::: "memory")'

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_T.cp_wait({int(g.fn.values[id(node.args[0])])})"


DEFINITIONS = [
    Allocation("shared"), Allocation("local"), DynamicShared("dynamic_shared"),
    Atomic("atomic_add", "atomicAdd", "add", ("f32", "f64", "i32", "u32", "i64")),
    Atomic("atomic_max", "atomicMax", "max", ("f32", "i32", "u32", "i64")),
    Atomic("atomic_min", "atomicMin", "min", ("f32", "i32", "u32", "i64")),
    AtomicCas("atomic_cas"),
    VectorLoad("load4", ("global", "shared"), 4, ""), VectorLoad("ldg4", ("global",), 4, ", 'ldg4'", WORD_ELEMS),
    VectorLoad("load2", ("global", "shared"), 2, ", 'load2', 2"),
    VectorLoad("load8", ("global", "shared"), 8, ", 'load8', 8"),
    VectorStore("store4", 4, ""), VectorStore("store2", 2, ", what='store2'"),
    VectorStore("store8", 8, ", what='store8'"),
    Ldg("ldg"), CpAsync16("cp_async16"), CpCommit("cp_commit"), CpWait("cp_wait"),
]
