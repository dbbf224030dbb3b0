"""Built-in warp operations: shuffles, ballot, ldmatrix and the tensor cores' mma. All 32 lanes of the warp take
part; in the simulator each lane yields a request that the scheduler resolves once the whole warp waits on it."""
from __future__ import annotations

import math

from frost.kernel.builtin_defs.base import BuiltinDef, Checking, CudaBuilding, SimBuilding, array_any
from frost.kernel.types import ArrayType, Scalar, Weak, arith_type, bf16, f16, f32, i32, strong, u32


class Shuffle(BuiltinDef):
    """shfl_xor(v, mask), shfl_down(v, k), shfl_up(v, k), shfl_idx(v, lane): v of another lane of the warp (a lane
    outside the warp keeps its own value)."""

    def __init__(self, name: str, c_fn: str) -> None:
        super().__init__(name)
        self.c_fn = c_fn

    def check(self, ck: Checking, node):
        name = self.name
        v, k = ck.args(node, 2, name)
        ck.scalar(v, node.args[0])
        if not (isinstance(k, (Scalar, Weak)) and k.is_int):
            raise ck.src.error(node.args[1], f"{name}() lane argument must be an integer, got {k}")
        ck.out.has_yield = True
        t = strong(arith_type(v))
        return t

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"{self.c_fn}(0xffffffffu, {g.ex(node.args[0], t)}, {g.ex(node.args[1], i32)})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"(yield ({self.name!r}, {g.ex(node.args[0], t)}, int({g.ex(node.args[1])})))"


class Ballot(BuiltinDef):
    """ballot(cond): a u32 with bit k set when lane k's condition holds."""

    def check(self, ck: Checking, node):
        if len(node.args) != 1:
            raise ck.src.error(node, f"ballot() takes 1 arguments, got {len(node.args)}")
        ck.condition(node.args[0])
        ck.out.has_yield = True
        return u32

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"__ballot_sync(0xffffffffu, {g.truth(node.args[0])})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"(yield ('ballot', {g.ex(node.args[0])}, 0))"


class Ldmatrix(BuiltinDef):
    """ldmatrix_x4 / _x2 [_trans](frag, smem, (row, col)): 4 or 2 8x8 matrices of 16-bit elements from shared memory
    into the warp's registers (lanes 8m..8m+7 give the rows of matrix m); without .trans also 32-bit elements."""

    def __init__(self, name: str, regs: int, trans: bool) -> None:
        super().__init__(name)
        self.regs, self.trans = regs, trans

    def check(self, ck: Checking, node):
        name, regs = self.name, self.regs
        if len(node.args) != 3:
            raise ck.src.error(node, f"{name}(frag, smem, (row, col)) takes 3 arguments")
        ft = ck.expr(node.args[0])
        st = array_any(ck, node, node.args[1], node.args[2], name)
        wide = st.space == "shared" and st.elem is f32 and not name.endswith("_trans")
        if st.space != "shared" or not (st.elem.np.itemsize == 2 or wide):
            raise ck.src.error(node.args[1], f"{name}() reads 16-bit elements of a shared array (or, without "
                                             f".trans, f32 ones), got {st}")
        if not (isinstance(ft, ArrayType) and ft.space == "local" and ft.kind == "native"
                and (ft.elem in (bf16, f16) and math.prod(ft.shape) == 2 * regs
                     or wide and ft.elem is f32 and math.prod(ft.shape) == regs)):
            raise ck.src.error(node.args[0], f"{name}() writes a local bf16 or f16 fragment of {2 * regs} "
                                             f"elements (or, from a shared f32 array, an f32 one of {regs}), "
                                             f"got {ft}")
        ck.out.has_yield = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        regs = self.regs
        frag = g.array_ref(node.args[0])
        addr = g.elem_ptr(node.args[1], node.args[2])
        outs = ", ".join(f"%{k}" for k in range(regs))
        cons = ", ".join(f'"=r"(reinterpret_cast<unsigned*>({frag})[{k}])' for k in range(regs))
        tr = ".trans" if self.trans else ""
        return (f'asm volatile("ldmatrix.sync.aligned.m8n8.x{regs}{tr}.shared.b16 {{{outs}}}, [%{regs}];" '
                f': {cons} : "r"(frost_smem_addr({addr})) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        return (f"(yield ('ldmatrix', ({g.ex(node.args[0])}, {g.ex(node.args[1])}, "
                f"{g.index_tuple(node.args[2])}, {self.regs}, {self.trans})))")


def fragment(t, n: int, elems: tuple) -> bool:
    """Whether t is a register fragment (a native local array) of n elements of one of the types elems."""
    return (isinstance(t, ArrayType) and t.space == "local" and t.kind == "native" and math.prod(t.shape) == n
            and t.elem in elems)


def cuda_mma(g: CudaBuilding, node, c, a, b, shape_types: str) -> str:
    au = [f'"r"(reinterpret_cast<const unsigned*>({a})[{k}])' for k in range(4)]
    bu = [f'"r"(reinterpret_cast<const unsigned*>({b})[{k}])' for k in range(2)]
    flat_c = c if g.type(node.args[0]).ndim == 1 else f"reinterpret_cast<float*>({c})"
    cf = [f'"+f"({flat_c}[{k}])' for k in range(4)]
    return (f'asm("mma.sync.aligned.{shape_types} '
            '{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" '
            f': {", ".join(cf)} : {", ".join(au + bu)})')


class Mma16x8x16(BuiltinDef):
    """mma_16x8x16(c, a, b): c (local f32, 4) += a (bf16 or f16, 8) @ b (4), mma.sync m16n8k16."""

    def check(self, ck: Checking, node):
        if len(node.args) != 3:
            raise ck.src.error(node, "mma_16x8x16(c_frag, a_frag, b_frag) takes 3 arguments")
        c, a, b = (ck.expr(x) for x in node.args)
        for t, n, elems, what in ((c, 4, (f32,), "f32"), (a, 8, (bf16, f16), "bf16 or f16"),
                                  (b, 4, (bf16, f16), "bf16 or f16")):
            if not fragment(t, n, elems):
                raise ck.src.error(node, f"mma_16x8x16() takes fragments local(f32, 4), local(bf16, 8) and "
                                         f"local(bf16, 4); got {c}, {a}, {b}")
        if a.elem != b.elem:
            raise ck.src.error(node, f"mma_16x8x16() needs a and b of one type, got {a.elem} and {b.elem}")
        ck.out.has_yield = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        c, a, b = (g.array_ref(x) for x in node.args)
        kind = "bf16" if g.type(node.args[1]).elem is bf16 else "f16"
        return cuda_mma(g, node, c, a, b, f"m16n8k16.row.col.f32.{kind}.{kind}.f32")

    def sim(self, g: SimBuilding, node, t) -> str:  # the scheduler's _mma reads the shape from the fragments' types
        c, a, b = (g.ex(x) for x in node.args)
        return f"(yield ('mma', ({c}, {a}, {b})))"


class Mma(Mma16x8x16):
    """mma(c, a, b): the tensor-core step the fragments' types name: bf16/f16 (8 and 4 elements) is
    mma_16x8x16; f32 (4 and 2) is m16n8k8 on TF32 (each operand's 10 leading mantissa bits)."""

    def check(self, ck: Checking, node):
        if len(node.args) != 3:
            raise ck.src.error(node, "mma(c_frag, a_frag, b_frag) takes 3 arguments")
        c, a, b = (ck.expr(x) for x in node.args)
        if fragment(a, 4, (f32,)) and fragment(b, 2, (f32,)) and fragment(c, 4, (f32,)):
            ck.out.has_yield = True
            return None
        if fragment(a, 8, (bf16, f16)) and fragment(b, 4, (a.elem,)) and fragment(c, 4, (f32,)):
            ck.out.has_yield = True
            return None
        raise ck.src.error(node, f"mma() takes fragments local(f32, 4) and either local(bf16 or f16, 8) and "
                                 f"local(bf16 or f16, 4) (m16n8k16) or local(f32, 4) and local(f32, 2) (m16n8k8 "
                                 f"on TF32); got {c}, {a}, {b}")

    def cuda(self, g: CudaBuilding, node, t) -> str:
        if g.type(node.args[1]).elem is not f32:
            return super().cuda(g, node, t)
        c, a, b = (g.array_ref(x) for x in node.args)
        return cuda_mma(g, node, c, a, b, "m16n8k8.row.col.f32.tf32.tf32.f32")


DEFINITIONS = [
    Shuffle("shfl_xor", "__shfl_xor_sync"), Shuffle("shfl_down", "__shfl_down_sync"),
    Shuffle("shfl_up", "__shfl_up_sync"), Shuffle("shfl_idx", "__shfl_sync"), Ballot("ballot"),
    Ldmatrix("ldmatrix_x4", 4, False), Ldmatrix("ldmatrix_x2", 2, False), Ldmatrix("ldmatrix_x4_trans", 4, True),
    Ldmatrix("ldmatrix_x2_trans", 2, True), Mma16x8x16("mma_16x8x16"), Mma("mma"),
]
