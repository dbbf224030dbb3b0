"""Built-in asynchronous barriers and bulk copies (Hopper): mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx,
mbarrier_wait, cp_async_bulk; and bulk reductions into global memory, tracked by bulk groups instead of a barrier:
cp_reduce_async_bulk_add, cp_async_bulk_commit, cp_async_bulk_wait, cp_async_bulk_wait_read. An mbarrier is a 64-bit
object in shared memory (an element of a shared Array[i64]) whose phase completes when `count` threads have arrived
and every byte it was told to expect has landed; the copy engine (cp.async.bulk) lands bytes on it without any thread
waiting, so one producer thread can feed warps that each wait only for their own tile: the pipeline of
FlashAttention-3 and CUTLASS's warp-specialized GEMMs.

PTX from the ISA's "Parallel Synchronization and Communication Instructions: mbarrier" and "Data Movement and
Conversion Instructions: cp.async.bulk"; the wait loop is CUTLASS's ClusterBarrier::wait."""
from __future__ import annotations

import ast

from frost.kernel.builtin_defs.base import BuiltinDef, Checking, CudaBuilding, SimBuilding
from frost.kernel.types import ArrayType, Scalar, TensorMapType, Weak

MAX_COUNT = (1 << 20) - 1    # PTX: an mbarrier's expected arrivals and its pending transaction bytes fit 20 bits
BULK_ALIGN = 16              # cp.async.bulk: both addresses and the size are multiples of 16 bytes


def barrier_array(ck: Checking, node, arr_node, idx_node, name: str) -> None:
    """The mbarrier of `name(bars, i, ...)`: element i of a 1-D shared Array[i64]."""
    at = ck.expr(arr_node)
    if not (isinstance(at, ArrayType) and at.space == "shared" and at.ndim == 1 and at.elem.name == "i64"):
        raise ck.src.error(node, f"{name}() needs its mbarrier as an element of a 1-D shared array of i64 "
                                 f"(bars = shared(i64, STAGES)), got {at}")
    integer_arg(ck, idx_node, name, "barrier index")


def integer_arg(ck: Checking, node, name: str, what: str) -> int | None:
    """Check an integer argument; its value when it is a compile-time constant."""
    t = ck.expr(node)
    if not (isinstance(t, (Scalar, Weak)) and t.is_int):
        raise ck.src.error(node, f"{name}(): the {what} must be an integer, got {t}")
    value = ck.out.values.get(id(node))
    return value if isinstance(value, int) else None


def uses_mbarriers(ck: Checking) -> None:
    """The kernel orders threads through mbarriers (the simulator's race detector follows them, as it does named
    barriers) and needs sm_90a (try_wait, expect_tx and cp.async.bulk are Hopper's)."""
    ck.out.uses_named_barriers = True
    ck.out.needs_sm90a = True


def smem_addr(g: CudaBuilding, arr, idx) -> str:
    return f"frost_smem_addr({g.elem_ptr(arr, idx)})"


class MbarrierInit(BuiltinDef):
    """mbarrier_init(bars, i, count): set up bars[i] for phases of `count` arrivals. One thread does it, once, then a
    syncthreads() before any other thread uses the barrier. The fence after it makes the initialized barrier visible
    to the copy engine (the async proxy), as NVIDIA's TMA examples do."""

    def check(self, ck: Checking, node):
        if len(node.args) != 3:
            raise ck.src.error(node, "mbarrier_init(bars, i, count) takes 3 arguments")
        barrier_array(ck, node, node.args[0], node.args[1], self.name)
        count = integer_arg(ck, node.args[2], self.name, "arrival count")
        if count is not None and not 1 <= count <= MAX_COUNT:
            raise ck.src.error(node.args[2], f"mbarrier_init: count {count} is not in 1..{MAX_COUNT}")
        uses_mbarriers(ck)
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return (f'asm volatile("mbarrier.init.shared::cta.b64 [%0], %1; fence.proxy.async.shared::cta;" :: '
                f'"r"({smem_addr(g, *node.args[:2])}), "r"((int)({g.ex(node.args[2])})) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"_T.mbarrier_init({g.ex(node.args[0])}, {g.ex(node.args[1])}, {g.ex(node.args[2])})"


class MbarrierArrive(BuiltinDef):
    """mbarrier_arrive(bars, i): this thread arrives at bars[i]'s current phase and goes on.
    mbarrier_arrive_expect_tx(bars, i, nbytes): first raise the bytes the phase waits for by nbytes (the size of the
    cp_async_bulk copies that will land on it), then arrive: what the thread that issues the copies calls."""

    def __init__(self, name: str, expect_tx: bool) -> None:
        super().__init__(name)
        self.expect_tx = expect_tx

    def check(self, ck: Checking, node):
        n = 3 if self.expect_tx else 2
        if len(node.args) != n:
            raise ck.src.error(node, f"{self.name}(bars, i{', nbytes' if self.expect_tx else ''}) takes {n} "
                                     "arguments")
        barrier_array(ck, node, node.args[0], node.args[1], self.name)
        if self.expect_tx:
            nbytes = integer_arg(ck, node.args[2], self.name, "byte count")
            if nbytes is not None and not 0 <= nbytes <= MAX_COUNT:
                raise ck.src.error(node.args[2], f"{self.name}: {nbytes} bytes is not in 0..{MAX_COUNT}")
        uses_mbarriers(ck)
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        addr = smem_addr(g, *node.args[:2])
        if not self.expect_tx:
            return (f'asm volatile("{{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }}" :: "r"({addr}) '
                    ': "memory")')
        return (f'asm volatile("{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }}" :: '
                f'"r"({addr}), "r"((int)({g.ex(node.args[2])})) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        tx = g.ex(node.args[2]) if self.expect_tx else "0"
        return f"_T.mbarrier_arrive({g.ex(node.args[0])}, {g.ex(node.args[1])}, {tx}, {self.name!r})"


class MbarrierWait(BuiltinDef):
    """mbarrier_wait(bars, i, parity): wait until the phase of bars[i] with that parity (0 for its first phase, 1 for
    the next, ...) has completed; then this thread sees every write its arriving threads made before arriving and
    every byte its copies landed. A ring of S stages waits for tile t (in stage t % S) with parity (t // S) % 2."""

    def check(self, ck: Checking, node):
        if len(node.args) != 3:
            raise ck.src.error(node, "mbarrier_wait(bars, i, parity) takes 3 arguments")
        barrier_array(ck, node, node.args[0], node.args[1], self.name)
        parity = integer_arg(ck, node.args[2], self.name, "phase parity")
        if parity is not None and parity not in (0, 1):
            raise ck.src.error(node.args[2], f"mbarrier_wait: parity {parity} is not 0 or 1")
        uses_mbarriers(ck)
        ck.out.has_yield = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        # try_wait suspends the thread for a while in hardware; the loop retries until the phase completes (labels
        # inside { } are local to that scope, so the asm may be inlined any number of times)
        return (f'asm volatile("{{ .reg .pred done; FROST_MBAR_WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, '
                f'[%0], %1; @!done bra FROST_MBAR_WAIT; }}" :: "r"({smem_addr(g, *node.args[:2])}), '
                f'"r"((int)({g.ex(node.args[2])}) & 1) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"(yield _T.mbarrier_waiting({g.ex(node.args[0])}, {g.ex(node.args[1])}, {g.ex(node.args[2])}))"


class CpAsyncBulk(BuiltinDef):
    """cp_async_bulk(dst, dst_index, src, src_index, nbytes, bars, i): the copy engine moves nbytes contiguous bytes
    from global src[src_index:] to shared dst[dst_index:] and counts them against bars[i]'s phase (PTX
    cp.async.bulk ... mbarrier::complete_tx::bytes); one thread issues it, no thread waits for it but through the
    barrier. Both addresses and nbytes are multiples of 16 bytes. The data may be read after mbarrier_wait on that
    phase; the simulator lands it when the phase completes, so a read before the wait sees stale data and races."""

    def check(self, ck: Checking, node):
        if len(node.args) != 7:
            raise ck.src.error(node, "cp_async_bulk(dst_shared, dst_index, src_global, src_index, nbytes, bars, i) "
                                     "takes 7 arguments")
        dt, st = ck.expr(node.args[0]), ck.expr(node.args[2])
        if not (isinstance(dt, ArrayType) and isinstance(st, ArrayType) and dt.space == "shared"
                and st.space == "global" and dt.ndim == 1 and st.ndim == 1):
            raise ck.src.error(node, f"cp_async_bulk() copies from a 1-D global array to a 1-D shared one, got "
                                     f"{st} -> {dt}")
        if dt.elem.np.itemsize != st.elem.np.itemsize:
            raise ck.src.error(node, f"cp_async_bulk() between {st.elem} and {dt.elem} elements")
        integer_arg(ck, node.args[1], self.name, "destination index")
        integer_arg(ck, node.args[3], self.name, "source index")
        nbytes = integer_arg(ck, node.args[4], self.name, "byte count")
        if nbytes is not None and not (0 < nbytes <= MAX_COUNT and nbytes % BULK_ALIGN == 0):
            raise ck.src.error(node.args[4], f"cp_async_bulk: {nbytes} bytes is not a positive multiple of "
                                             f"{BULK_ALIGN} up to {MAX_COUNT}")
        barrier_array(ck, node, node.args[5], node.args[6], self.name)
        src = node.args[2]
        if getattr(src, "id", None) in {p.name for p in ck.out.params}:
            ck.out.vector_params[src.id] = max(ck.out.vector_params.get(src.id, 0), BULK_ALIGN)
        uses_mbarriers(ck)
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        dst = smem_addr(g, node.args[0], node.args[1])
        src = g.elem_ptr(node.args[2], node.args[3])
        bar = smem_addr(g, node.args[5], node.args[6])
        return ('asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, '
                f'[%3];" :: "r"({dst}), "l"({src}), "r"((int)({g.ex(node.args[4])})), "r"({bar}) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        a = [g.ex(x) for x in node.args]
        return f"_T.cp_async_bulk({a[0]}, {a[1]}, {a[2]}, {a[3]}, {a[4]}, {a[5]}, {a[6]})"


class CpAsyncBulkTensor(BuiltinDef):
    """cp_async_bulk_tensor(dst, dst_index, tmap, coords, bars, i): the copy engine (TMA) copies the box of the tensor
    map tmap (frost.kernel.tensor_map) whose first element is at coords (a tuple, one index per dimension of the
    global array, outermost first as in NumPy) to shared dst[dst_index:], laid out as the map's swizzle says, and
    counts the whole box's bytes against bars[i]'s phase (PTX cp.async.bulk.tensor.Nd ... mbarrier::complete_tx::bytes).
    Elements of the box outside the array land as zeros, so a tile past the end of a head needs no masking of its
    load. dst_index is on a 1024-byte boundary with a swizzle (the pattern repeats every 1024 bytes), 128 without.
    One thread issues it; the data may be read after mbarrier_wait on that phase, as cp_async_bulk's."""

    def check(self, ck: Checking, node):
        if len(node.args) != 6:
            raise ck.src.error(node, "cp_async_bulk_tensor(dst_shared, dst_index, tensor_map, coords, bars, i) "
                                     "takes 6 arguments")
        dt, mt = ck.expr(node.args[0]), ck.expr(node.args[2])
        if not (isinstance(dt, ArrayType) and dt.space == "shared" and dt.ndim == 1):
            raise ck.src.error(node, f"cp_async_bulk_tensor() copies into a 1-D shared array, got {dt}")
        if not isinstance(mt, TensorMapType):
            raise ck.src.error(node, f"cp_async_bulk_tensor() takes a TensorMap parameter as its third argument, "
                                     f"got {mt}")
        if dt.elem.np.itemsize != mt.elem.np.itemsize:
            raise ck.src.error(node, f"cp_async_bulk_tensor() from {mt} into {dt}: the element sizes differ")
        integer_arg(ck, node.args[1], self.name, "destination index")
        coords = node.args[3]
        if not isinstance(coords, ast.Tuple) or len(coords.elts) != mt.rank:
            raise ck.src.error(coords, f"cp_async_bulk_tensor(): coords is a tuple of {mt.rank} indices (one per "
                                       f"dimension of the {mt}, outermost first)")
        for c in coords.elts:
            integer_arg(ck, c, self.name, "coordinate")
        barrier_array(ck, node, node.args[4], node.args[5], self.name)
        uses_mbarriers(ck)
        ck.out.uses_tensor_maps = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        dst = smem_addr(g, node.args[0], node.args[1])
        bar = smem_addr(g, node.args[4], node.args[5])
        coords = [f'"r"((int)({g.ex(c)}))' for c in reversed(node.args[3].elts)]   # PTX: innermost first
        n = len(coords)
        places = ", ".join(f"%{k + 2}" for k in range(n))
        return (f'asm volatile("cp.async.bulk.tensor.{n}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes '
                f'[%0], [%1, {{{places}}}], [%{n + 2}];" :: "r"({dst}), '
                f'"l"(reinterpret_cast<unsigned long long>(&{g.ex(node.args[2])})), {", ".join(coords)}, '
                f'"r"({bar}) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        a = [g.ex(x) for x in node.args[:3]]
        coords = ", ".join(g.ex(c) for c in node.args[3].elts)
        return f"_T.cp_async_bulk_tensor({a[0]}, {a[1]}, {a[2]}, ({coords},), {g.ex(node.args[4])}, " \
               f"{g.ex(node.args[5])})"


class CpReduceAsyncBulkAdd(BuiltinDef):
    """cp_reduce_async_bulk_add(dst, dst_index, src, src_index, nbytes): the copy engine adds nbytes contiguous bytes
    of f32 from shared src[src_index:] into global dst[dst_index:], element by element and atomically with respect
    to other such adds (PTX cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32): how blocks that each own a
    part of a sum add it into one float32 accumulator without a thread-per-element atomic (FlashAttention-3's dQ).
    One thread issues it, after the threads that wrote src made their stores visible to the copy engine
    (fence_proxy_async, then a barrier); cp_async_bulk_commit() closes a group of them; cp_async_bulk_wait_read(n)
    waits until all but the n newest groups have read their source (src may then be written again),
    cp_async_bulk_wait(n) until their adds are done. The simulator reads src at the issue (a race without the
    barrier after the other threads' stores), raises if src changed before a wait retired the group, and lands
    the adds at cp_async_bulk_wait (or the thread's exit), so a read of dst after only cp_async_bulk_wait_read
    sees the old sum."""

    def check(self, ck: Checking, node):
        if len(node.args) != 5:
            raise ck.src.error(node, "cp_reduce_async_bulk_add(dst_global, dst_index, src_shared, src_index, nbytes) "
                                     "takes 5 arguments")
        dt, st = ck.expr(node.args[0]), ck.expr(node.args[2])
        if not (isinstance(dt, ArrayType) and isinstance(st, ArrayType) and dt.space == "global"
                and st.space == "shared" and dt.ndim == 1 and st.ndim == 1 and dt.elem.name == st.elem.name == "f32"):
            raise ck.src.error(node, f"cp_reduce_async_bulk_add() adds a 1-D shared f32 array into a 1-D global f32 "
                                     f"one, got {st} -> {dt}")
        integer_arg(ck, node.args[1], self.name, "destination index")
        integer_arg(ck, node.args[3], self.name, "source index")
        nbytes = integer_arg(ck, node.args[4], self.name, "byte count")
        if nbytes is not None and not (0 < nbytes and nbytes % BULK_ALIGN == 0):
            raise ck.src.error(node.args[4], f"cp_reduce_async_bulk_add: {nbytes} bytes is not a positive multiple "
                                             f"of {BULK_ALIGN}")
        dst = node.args[0]
        if getattr(dst, "id", None) in {p.name for p in ck.out.params}:
            ck.out.vector_params[dst.id] = max(ck.out.vector_params.get(dst.id, 0), BULK_ALIGN)
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        dst = g.elem_ptr(node.args[0], node.args[1])
        src = smem_addr(g, node.args[2], node.args[3])
        return ('asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" :: '
                f'"l"({dst}), "r"({src}), "r"((int)({g.ex(node.args[4])})) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        a = [g.ex(x) for x in node.args]
        return f"_T.cp_reduce_async_bulk_add({a[0]}, {a[1]}, {a[2]}, {a[3]}, {a[4]})"


class CpAsyncBulkGroup(BuiltinDef):
    """cp_async_bulk_commit(), cp_async_bulk_wait(n), cp_async_bulk_wait_read(n): the bulk groups of this thread's
    cp_reduce_async_bulk_add calls (PTX cp.async.bulk.commit_group / wait_group[.read] n)."""

    def __init__(self, name: str, ptx: str, sim_call: str, takes_n: bool) -> None:
        super().__init__(name)
        self.ptx, self.sim_call, self.takes_n = ptx, sim_call, takes_n

    def check(self, ck: Checking, node):
        if not self.takes_n:
            ck.args(node, 0, self.name)
            return None
        if len(node.args) != 1:
            raise ck.src.error(node, f"{self.name}(n) takes the number of bulk groups left in flight")
        n = ck.const_int(node.args[0])
        if not 0 <= n <= 63:
            raise ck.src.error(node, f"{self.name}({n}): n must be 0..63")
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        n = f" {int(g.fn.values[id(node.args[0])])}" if self.takes_n else ""
        return f'asm volatile("{self.ptx}{n};" ::: "memory")'

    def sim(self, g: SimBuilding, node, t) -> str:
        n = str(int(g.fn.values[id(node.args[0])])) if self.takes_n else ""
        return f"_T.{self.sim_call}({n})"


DEFINITIONS = [MbarrierInit("mbarrier_init"), MbarrierArrive("mbarrier_arrive", expect_tx=False),
               MbarrierArrive("mbarrier_arrive_expect_tx", expect_tx=True), MbarrierWait("mbarrier_wait"),
               CpAsyncBulk("cp_async_bulk"), CpAsyncBulkTensor("cp_async_bulk_tensor"),
               CpReduceAsyncBulkAdd("cp_reduce_async_bulk_add"),
               CpAsyncBulkGroup("cp_async_bulk_commit", "cp.async.bulk.commit_group", "bulk_commit", False),
               CpAsyncBulkGroup("cp_async_bulk_wait", "cp.async.bulk.wait_group", "bulk_wait", True),
               CpAsyncBulkGroup("cp_async_bulk_wait_read", "cp.async.bulk.wait_group.read", "bulk_wait_read", True)]
