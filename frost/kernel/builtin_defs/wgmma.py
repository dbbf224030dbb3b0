"""Built-in Hopper warpgroup MMA (a kernel using any of these compiles for sm_90a): wgmma_desc, wgmma_bf16,
wgmma_fence, wgmma_commit, wgmma_wait, fence_proxy_async. Encodings from the PTX ISA ("Asynchronous Warpgroup Level
Matrix Instructions": wgmma.mma_async, the shared memory matrix descriptor) and CUTLASS
cute/arch/mma_sm90_desc.hpp; the simulator performs a committed group when wgmma_wait retires it."""
from __future__ import annotations

import ast
import math

from frost.kernel.builtin_defs.base import BuiltinDef, Checking, CudaBuilding, SimBuilding, array_any, kernel_statement
from frost.kernel.types import ArrayType, Scalar, Weak, bf16, boolean, f32, i32, i64

WGMMA_SWIZZLES = {0: 0, 128: 1, 64: 2, 32: 3}  # bytes -> the descriptor's 2-bit swizzle mode (PTX ISA)


def _desc_offsets(values: dict, node, swz: int) -> tuple[int, int]:
    """(LBO, SBO) of a checked wgmma_desc call: given, or the defaults of a tile with SWIZZLE-byte rows."""
    if len(node.args) == 5:
        return values[id(node.args[3])], values[id(node.args[4])]
    return 16, 8 * swz


class WgmmaDesc(BuiltinDef):
    def check(self, ck: Checking, node):
        """wgmma_desc(tile, (row, col), SWIZZLE[, LBO, SBO]) -> i64: the shared-memory matrix descriptor of the
        K-major operand that starts at tile[row, col] (PTX ISA, "Matrix Descriptor Format"). SWIZZLE is 128, 64, 32
        (bytes) or 0; LBO and SBO are byte offsets, defaulting for a swizzled row-major tile whose rows are SWIZZLE
        bytes long (LBO unused = 16, SBO = 8 rows = 8 * SWIZZLE)."""
        if len(node.args) not in (3, 5):
            raise ck.src.error(node, "wgmma_desc(tile, (row, col), SWIZZLE[, LBO, SBO]) takes 3 or 5 arguments")
        at = array_any(ck, node, node.args[0], node.args[1], "wgmma_desc")
        if at.space != "shared":
            raise ck.src.error(node, f"wgmma_desc() describes a tile in shared memory, got {at}")
        swz = ck.const_int(node.args[2])
        if swz not in WGMMA_SWIZZLES:
            raise ck.src.error(node, f"wgmma_desc(): SWIZZLE must be 128, 64, 32 or 0 bytes, got {swz}")
        if len(node.args) == 5:
            lbo, sbo = ck.const_int(node.args[3]), ck.const_int(node.args[4])
        else:
            pitch = at.shape[-1] * at.elem.np.itemsize if at.shape is not None else None
            if swz == 0 or pitch != swz:
                raise ck.src.error(node, f"wgmma_desc() without LBO and SBO needs a swizzled tile whose rows are "
                                         f"SWIZZLE={swz} bytes long, got {at}" + (f" ({pitch}-byte rows)" if pitch
                                                                                  else "") + "; pass LBO, SBO")
            lbo, sbo = 16, 8 * swz
        for what, v in (("LBO", lbo), ("SBO", sbo)):
            if v < 0 or v % 16 or v >> 4 >= 1 << 14:
                raise ck.src.error(node, f"wgmma_desc(): {what}={v} must be a multiple of 16 below 2^18 bytes")
        ck.out.uses_wgmma = True
        return i64

    def cuda(self, g: CudaBuilding, node, t) -> str:
        swz = g.fn.values[id(node.args[2])]
        lbo, sbo = _desc_offsets(g.fn.values, node, swz)
        mode = WGMMA_SWIZZLES[swz]
        elem = g.elem_ptr(node.args[0], node.args[1])
        root = node.args[0]
        while isinstance(root, ast.Subscript) and g.type(root.value).kind == "native":
            root = root.value   # a panel of a shared array: its offset counts from the whole array
        if g.type(root).kind != "native":
            return f"frost_wgmma_desc({elem}, {lbo}u, {sbo}u, {mode}u)"
        return f"frost_wgmma_desc_in({g.array_ref(root)}, {elem}, {lbo}u, {sbo}u, {mode}u)"

    def sim(self, g: SimBuilding, node, t) -> str:
        swz = g.fn.values[id(node.args[2])]
        lbo, sbo = _desc_offsets(g.fn.values, node, swz)
        return f"_T.wgmma_desc({g.ex(node.args[0])}, {g.index_tuple(node.args[1])}, {lbo}, {sbo}, {swz})"


def fence_accs(g: CudaBuilding, only: list[str] | None = None) -> list[str]:
    """CUTLASS's warpgroup_fence_operand: an empty asm that reads and writes every accumulator register (or those of
    the accumulators named in `only`), so the compiler neither reads an accumulator before wgmma_wait nor writes one
    after wgmma_fence."""
    out = []
    for name, n in g.fn.wgmma_accs.items():
        if only is not None and name not in only:
            continue
        at = g.fn.locals[name].type
        flat = g.cname(name) if at.ndim == 1 else f"reinterpret_cast<float*>({g.cname(name)})"
        out += [f'asm volatile("" : "+f"({flat}[{k}]) :: "memory")' for k in range(n)]
    return out


class WgmmaSync(BuiltinDef):
    """wgmma_fence(), wgmma_commit(), fence_proxy_async(): no arguments, one PTX instruction; wgmma_fence (as
    wgmma_wait after its instruction) also fences the accumulators."""

    def __init__(self, name: str, ptx: str, sim_code: str, fences_accs: bool = False) -> None:
        super().__init__(name)
        self.ptx, self.sim_code, self.fences_accs = ptx, sim_code, fences_accs

    def check(self, ck: Checking, node):
        ck.args(node, 0, self.name)
        ck.out.uses_wgmma = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        asm = f'asm volatile("{self.ptx};" ::: "memory")'
        return "; ".join(fence_accs(g) + [asm]) if self.fences_accs else asm

    def sim(self, g: SimBuilding, node, t) -> str:
        return self.sim_code


class WgmmaWait(BuiltinDef):
    def check(self, ck: Checking, node):
        """wgmma_wait(n[, acc, ...]): wait until n groups remain in flight, then fence the accumulators named (by
        default every accumulator of the function). Naming only those of the groups it retires keeps the others'
        registers free where they are dead (S and dP between the backward's steps): the fence reads and writes
        each accumulator it names, so the compiler keeps it live across."""
        if not node.args:
            raise ck.src.error(node, "wgmma_wait(n[, acc, ...]) takes the number of wgmma groups left in flight")
        n = ck.const_int(node.args[0])
        if not 0 <= n <= 7:
            raise ck.src.error(node, f"wgmma_wait({n}): n must be 0..7")
        for a in node.args[1:]:
            t = ck.expr(a)
            if not (isinstance(a, ast.Name) and isinstance(t, ArrayType) and t.space == "local" and t.elem is f32):
                raise ck.src.error(a, f"wgmma_wait(): the accumulators to fence are local f32 arrays named by a "
                                      f"variable, got {t}")
            if a.id not in ck.out.wgmma_accs:
                raise ck.src.error(a, f"wgmma_wait(): {a.id!r} is not the accumulator of a wgmma issued before it")
        ck.out.uses_wgmma = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        n = int(g.fn.values[id(node.args[0])])
        only = [a.id for a in node.args[1:]] if len(node.args) > 1 else None
        return "; ".join([f'asm volatile("wgmma.wait_group.sync.aligned {n};" ::: "memory")'] + fence_accs(g, only))

    def sim(self, g: SimBuilding, node, t) -> str:
        named = "".join(f", {g.ex(a)}" for a in node.args[1:])
        return f"_T.wgmma_wait({int(g.fn.values[id(node.args[0])])}{named})"


def wgmma_asm(g: CudaBuilding, node, a_operand: str, a_inputs: list[str], transposes: str) -> str:
    """The asm of wgmma.mma_async m64nNk16 f32 += bf16 x bf16 for a call (acc, A, desc_b, N[, scale_d[, B_MAJOR[,
    A_MAJOR]]]): the
    accumulator's N/2 registers read and written, then A's inputs (a_operand names them from %{r} on), B's
    descriptor and scale-d, a predicate operand (D = A*B + D when true, A*B when false); imm-scale-a/b = 1."""
    acc = g.array_ref(node.args[0])
    n = g.fn.values[id(node.args[3])]
    regs = n // 2
    flat = acc if g.type(node.args[0]).ndim == 1 else f"reinterpret_cast<float*>({acc})"
    scale = g.ex(node.args[4], i32) if len(node.args) >= 5 else "1"
    outs = ", ".join(f"%{k}" for k in range(regs))
    a_op = a_operand.format(r=regs, r1=regs + 1, r2=regs + 2, r3=regs + 3)
    b_at = regs + len(a_inputs)
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{b_at + 1}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{outs}}}, {a_op}, %{b_at}, '
            f'p, 1, 1, {transposes};\\n}}" : '
            + ", ".join(f'"+f"({flat}[{k}])' for k in range(regs))
            + " : " + ", ".join(a_inputs) + f', "l"({g.ex(node.args[2])}), "r"((int)({scale})) : "memory")')


def b_major(g, node) -> int:
    """The call's B_MAJOR argument: 0 (K-major, the default) or 1 (MN-major), PTX's imm-trans-b."""
    return int(g.fn.values[id(node.args[5])]) if len(node.args) >= 6 else 0


def a_major(g, node) -> int:
    """wgmma_bf16's A_MAJOR argument: 0 (K-major, the default) or 1 (MN-major), PTX's imm-trans-a."""
    return int(g.fn.values[id(node.args[6])]) if len(node.args) == 7 else 0


class WgmmaBf16(BuiltinDef):
    def check(self, ck: Checking, node, operands=None):
        """wgmma_bf16(acc, desc_a, desc_b, N[, scale_d[, B_MAJOR[, A_MAJOR]]]): acc (local f32, N/2 per thread) +=
        A[64, 16] @ B[N, 16]^T (wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16), both in shared memory, B K-major
        (B_MAJOR = K_MAJOR = 0, the default) or MN-major (MN_MAJOR = 1: B's N elements contiguous, so that a
        row-major [K, N] tile such as attention's V serves without a transpose), A likewise (A_MAJOR = MN_MAJOR: A's
        64 M elements contiguous, so that a tile stored transposed, such as the backward's dS^T, serves as dS);
        scale_d 0 ignores acc."""
        most = 7 if operands is None else 6
        if not 4 <= len(node.args) <= most:
            raise ck.src.error(node, f"{self.name}(acc, {'desc_a' if most == 7 else 'a_frag'}, desc_b, N[, scale_d"
                                     f"[, B_MAJOR{'[, A_MAJOR]' if most == 7 else ''}]]) takes 4 to {most} arguments")
        for at, what in ((5, "B_MAJOR"), (6, "A_MAJOR")):
            if len(node.args) > at and ck.const_int(node.args[at]) not in (0, 1):
                raise ck.src.error(node.args[at], f"{self.name}(): {what} is K_MAJOR (0) or MN_MAJOR (1), got "
                                                  f"{ck.const_int(node.args[at])}")
        n = ck.const_int(node.args[3])
        if not (8 <= n <= 256 and n % 8 == 0):
            raise ck.src.error(node, f"wgmma_bf16(): N={n} is not a wgmma shape (m64nNk16 has N = 8, 16, ..., 256)")
        acc = ck.expr(node.args[0])
        if not (isinstance(acc, ArrayType) and acc.space == "local" and acc.kind == "native" and acc.elem is f32):
            raise ck.src.error(node.args[0], f"wgmma_bf16() accumulates into a local f32 array, got {acc}")
        if math.prod(acc.shape) != n // 2:
            raise ck.src.error(node.args[0], f"wgmma_bf16() with N={n} needs an accumulator of N/2 = {n // 2} f32 "
                                             f"per thread, got {acc}")
        for d in operands if operands is not None else node.args[1:3]:
            if ck.expr(d) is not i64:
                raise ck.src.error(d, f"{self.name}() takes descriptors made by wgmma_desc() (i64), got "
                                      f"{ck.type(d)}")
        if len(node.args) >= 5:
            t = ck.expr(node.args[4])
            if not (isinstance(t, (Scalar, Weak)) and (t.is_int or t is boolean)):
                raise ck.src.error(node.args[4], f"wgmma_bf16(): scale_d is an integer (0 or 1), got {t}")
        if isinstance(node.args[0], ast.Name):
            ck.out.wgmma_accs[node.args[0].id] = n // 2
        ck.out.uses_wgmma = True
        ck.out.has_yield = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        # A by descriptor; imm-trans-a = A_MAJOR, imm-trans-b = B_MAJOR
        return wgmma_asm(g, node, "%{r}", [f'"l"({g.ex(node.args[1])})'], f"{a_major(g, node)}, {b_major(g, node)}")

    def sim(self, g: SimBuilding, node, t) -> str:
        acc, da, db = (g.ex(x) for x in node.args[:3])
        n = g.fn.values[id(node.args[3])]
        scale = f"int({g.ex(node.args[4])})" if len(node.args) >= 5 else "1"
        return f"(yield ('wgmma', ({acc}, {da}, {db}, {n}, {scale}, {b_major(g, node)}, {a_major(g, node)})))"


class WgmmaBf16Registers(WgmmaBf16):
    """wgmma_bf16_rs(acc, a, desc_b, N[, scale_d[, B_MAJOR]]): wgmma_bf16 with A from registers: each thread's
    local bf16 fragment a (8 values: mma.sync m16n8k16's A fragment for its warp's 16 rows of the 64), B in shared
    memory as for wgmma_bf16. Scores computed by one wgmma feed the next without a trip through shared memory
    (FlashAttention-3's P V). a must not change until wgmma_wait has retired the operation."""

    def check(self, ck: Checking, node):
        if len(node.args) < 4:
            return super().check(ck, node, operands=())   # raises the message that names the arguments
        a = ck.expr(node.args[1])
        if not (isinstance(a, ArrayType) and a.space == "local" and a.elem is bf16 and a.shape is not None
                and math.prod(a.shape) == 8):
            raise ck.src.error(node.args[1], f"wgmma_bf16_rs() takes A as a local bf16 fragment of 8 values, got {a}")
        return super().check(ck, node, operands=(node.args[2],))

    def cuda(self, g: CudaBuilding, node, t) -> str:
        # A from registers (four 32-bit words of two bf16 each): no imm-trans-a; imm-trans-b = B_MAJOR
        a = g.array_ref(node.args[1])
        return wgmma_asm(g, node, "{{%{r}, %{r1}, %{r2}, %{r3}}}",
                         [f'"r"(reinterpret_cast<const unsigned*>({a})[{k}])' for k in range(4)],
                         str(b_major(g, node)))


class WgmmaDiscard(BuiltinDef):
    """wgmma_discard(acc, ...): the values of these local f32 arrays are dead here; the compiler may have used their
    registers for anything before. For an accumulator that the next wgmma overwrites (scale_d 0) in a loop: without
    it, the fence before that wgmma reads the last iteration's values, which then stay live through the whole loop
    (a kernel-wide array keeps them; CUTLASS declares such accumulators inside the loop instead). An empty asm that
    writes each register; the simulator fills the arrays with NaN, so a read of a discarded value shows."""

    def check(self, ck: Checking, node):
        if not node.args:
            raise ck.src.error(node, "wgmma_discard(acc, ...) takes the local f32 arrays whose values are dead")
        for a in node.args:
            t = ck.expr(a)
            if not (isinstance(a, ast.Name) and isinstance(t, ArrayType) and t.space == "local" and t.elem is f32
                    and t.kind == "native"):
                raise ck.src.error(a, f"wgmma_discard() takes local f32 arrays named by a variable, got {t}")
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        out = []
        for a in node.args:
            at = g.type(a)
            flat = g.cname(a.id) if at.ndim == 1 else f"reinterpret_cast<float*>({g.cname(a.id)})"
            out += [f'asm volatile("" : "=f"({flat}[{k}]))' for k in range(math.prod(at.shape))]
        return "; ".join(out)

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_T.wgmma_discard({', '.join(g.ex(a) for a in node.args)})"


class WgmmaDescriptorsFromBases(BuiltinDef):
    """wgmma_descriptors_from_bases(): a statement at the top of a kernel: every wgmma_desc of a tile of a shared
    array, in the kernel and the device functions it calls, is computed as the array's descriptor plus the tile's
    byte offset / 16 (the compiler keeps the arrays' descriptors in registers and adds one offset a tile) instead of
    encoding the tile's address each time. Fewer instructions a descriptor, more registers held: a kernel's choice
    (docs/kernels.md has what it did to the flash kernels)."""

    def check(self, ck: Checking, node):
        kernel_statement(ck, node, self.name)
        ck.args(node, 0, self.name)
        ck.out.wgmma_desc_from_bases = True
        return None

    def sim(self, g: SimBuilding, node, t) -> str:
        return "None"   # the same descriptors either way


DEFINITIONS = [
    WgmmaDesc("wgmma_desc"), WgmmaDescriptorsFromBases("wgmma_descriptors_from_bases"), WgmmaDiscard("wgmma_discard"),
    WgmmaBf16("wgmma_bf16"), WgmmaBf16Registers("wgmma_bf16_rs"), WgmmaWait("wgmma_wait"),
    WgmmaSync("wgmma_fence", "wgmma.fence.sync.aligned", "_T.wgmma_fence()", fences_accs=True),
    WgmmaSync("wgmma_commit", "wgmma.commit_group.sync.aligned", "_T.wgmma_commit()"),
    WgmmaSync("fence_proxy_async", "fence.proxy.async.shared::cta", "None"),
]
