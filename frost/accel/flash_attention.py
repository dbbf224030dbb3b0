"""Flash attention: the op `flash_attention`, registered with frost.dispatch for scaled_dot_product_attention
(frost/ops/attention.py) on CUDA where `supported` says it applies (FROST_FLASH_ATTENTION=0 switches it off; the
composed path, matmul, softmax, matmul, runs wherever it declines), and the host side of its kernels: the problem's
shapes and layouts (`Problem`), which kernel runs with which tiles (each default measured, the numbers beside it),
the launches.

The kernels are written in the kernel language, one family a file, each checked against float64 and against the
mma.sync kernels in the simulator (tests/accel/test_flash_attention_kernels.py):
- flash_common.py: the device functions every family shares (a block's rows, masks, the online softmax, dropout's
  stream, writing O and the log-sum-exp);
- flash_mma.py: FlashAttention-2 on mma.sync (sm_80 on, bf16 and f16), forward and a two-kernel backward;
- flash_hopper.py: warpgroup MMA (wgmma) on 128-byte-swizzled shared panels, for the three below (sm_90, bf16);
- flash_wgmma.py: the forward and the two-kernel backward on wgmma;
- flash_bulk.py: the warp-specialized forward fed by the copy engine (FlashAttention-3's), the default forward;
- flash_fused_backward.py: FlashAttention-3's backward, one kernel for dQ, dK and dV, the default from 1024 queries.

Layout. q, k, v, o and their gradients are rows of D values (D, the head dim, 64 or 128, a compile-time constant),
bf16 or f16: (batch b, head h, position t) is row b * sb + h * sh + t * st of its tensor's layout, so heads sliced
out of one (B, T, 3 x C) projection are read where they lie, O is written (B, T, H, D) (as PyTorch's flash
attention writes it: transpose(1, 2).reshape(B, T, C) is then a view), and the gradients of q, k and v sliced
out of one tensor are written into one buffer of that tensor's layout (the backward of the split a view too).
Every kernel's grid is (tiles, heads, batch), a head's tiles side by side in launch order (query_head), but the
persistent forward's (flash_bulk.py).

Masking: key j is visible to query i when j < Lk, the key-padding mask keeps j, and (causal) j <= i: top-left
aligned also when Lq != Lk, as PyTorch's is_causal and the composed path (tril of an Lq x Lk matrix of ones). Rows
with no visible key give zeros (as the composed path), and their log-sum-exp is -inf.

Dropout (on the attention weights, as PyTorch's dropout_p): element (bh, query, key) is kept when the uniform from
word 2 (query % 2) + key % 2 of Philox4x32-10 at counter (key // 2, query // 2, bh, offset) under the key (seed_lo,
seed_hi ^ STREAM) is >= p, and kept weights are scaled by 1 / (1 - p). One block covers two queries by two keys,
so every kernel draws one block for two weights (the forward and dQ kernels hold pairs of keys, the dK/dV kernels
pairs of queries). The forward reads seed and offset from a 4-word snapshot of the CUDA generator's state
(frost/accel/philox.py) taken at the call, after which the generator's offset advances by one; the backward
regenerates the same mask from the snapshot, so nothing L x S is stored. The row sums (and the saved
log-sum-exp) are those of the undropped weights; D = rowsum(dO * O) holds as without dropout. `dropout_keep_numpy` is
the NumPy twin of the mask.

Not yet (each falls back to the composed path): float32 inputs, other head dims, float or general boolean
masks, scales that are not positive (check_scale)."""
import math
import os
from dataclasses import dataclass

import numpy as np

from frost import backends, dispatch, layout
from frost.backend import cpu, cuda
from frost.kernel import cdiv
from frost.kernel.compile import device_arch, has_mma, multiprocessor_count
from frost.kernel.tma import tensor_map
from frost.accel.philox import philox4x32
from frost.accel.flash_common import LOG2E, STREAM
from frost.accel.flash_mma import PAD, kernels_for
from frost.accel.flash_wgmma import wgmma_backward, wgmma_forward
from frost.accel.flash_bulk import bulk_forward
from frost.accel.flash_fused_backward import fused_backward, fused_smem
from frost.tensor import Tensor, capturing, from_op

HOPPER_SHARED_BYTES = 227 * 1024   # a block's dynamic shared memory on sm_90
HEAD_DIMS = (64, 128)
DTYPES = ("bfloat16", "float16")
# (BR, BC) per head dim, untuned (to be measured on the H200). The dK/dV kernel takes the backward's tiles swapped:
# its blocks own BC keys (4 warps) and step over BR queries, so at head dim 128 both backward kernels hold 32-column
# score tiles (64-column ones spill there: dK, dV and the K, V fragments already take ~190 registers a thread).
FORWARD_TILES = {64: dict(BR=64, BC=64), 128: dict(BR=64, BC=64)}
BACKWARD_TILES = {64: dict(BR=64, BC=64), 128: dict(BR=64, BC=32)}


# the Hopper forward's (warpgroups of 64 query rows, keys a tile), untimed. S and O take BC / 2 + D / 2 registers a
# thread: at head dim 128 BC is 64; at 64, with dropout's Philox on top, BC = 128 spills (12 bytes), so 64 there too
WGMMA_TILES = {64: dict(WGS=2, BC=128), 128: dict(WGS=2, BC=64)}


# the Hopper backward's: dQ blocks of 64 WGS queries stepping over BC keys, dK/dV blocks of 64 WGS keys stepping over
# BR queries. At head dim 128 the dK/dV kernel's steps of 64 spill (S^T, dP^T and two D-wide accumulators pass 255
# registers a thread), steps of 32 (half a 64-column panel) fit; the dQ kernel's steps of 64 fit (187 registers) and
# made the backward 7 % faster than 32 on an H100 (4 x 16 x 4096 x 128: 5.24 against 5.63 ms, tree 5a9727e)
WGMMA_BACKWARD_TILES = {64: dict(WGS=2, BC=64, BR=64), 128: dict(WGS=2, BC=64, BR=32)}


# The fused backward's settings by head dim: WGS warpgroups (64 keys each), RS (P^T and dS^T from registers); its
# query steps are 64 (one wgmma's M for dQ), Q and dO come through tensor maps. On an H100 at 4 x 16 x 4096 x 128
# (tree 12caac9): RS=1 3.74 ms (2.28 causal), RS=0 3.97 (2.43); tree 05dcf19: RS=1 3.38 (2.16), OVERLAP_EXP=1 3.40
# (2.11) (05dcf19 had a race, fixed at 7f75e73: 3.31 ms at 6a7acae, another lease). Tensor maps made it 1.14x
# faster than every thread's cp.async (tree a1cdd95: 4.16 against 4.75 ms) and free of spills at head dim 128 (36
# bytes before); the queries-as-rows layout (5.31 at tree 6e25189) has gone. OVERLAP_EXP=1 (P^T's exponentials while
# dP^T multiplies) over two leases (trees 6501b32 and 015f5f3, flash_backward_h100_*.json): faster in 14 of 17 cells at
# 512-4096 queries, both head dims (by up to 6 %: causal 8 x 16 x 2048 x 128 1.475 -> 1.435 ms), within 1 % slower
# in the others
FUSED_BACKWARD_TILES = {64: dict(WGS=2, RS=1, OVERLAP_EXP=1), 128: dict(WGS=2, RS=1, OVERLAP_EXP=1)}


# where the fused backward is the default: head dim -> the shortest query length. On an H100 (tree 12caac9,
# flash_backward_h100_12caac9.json) it beat the two kernels at every shape timed from 2048 (3.74 against 5.21 ms at
# 4 x 16 x 4096 x 128); at tree 05dcf19 (flash_backward_h100_05dcf19_1024.json, _512.json) also at 1024 queries,
# head dim 128 (1.47 against 1.76 ms, causal 1.16 against 1.22) and at 512, head dim 64 (1.13 against 1.33, causal
# 1.00 against 1.06), but not at 512, head dim 128 causal (1.06 against 0.97)
FUSED_FROM_LENGTH = {64: 512, 128: 1024}


def wgmma_dq_smem(d: int, br: int, bc: int) -> int:
    """Bytes of shared memory of flash_bwd_dq_wgmma: Q and dO, two K and two V tiles, and dS in panels of 64
    columns (a 32-key step uses half of one)."""
    panels = -(-bc // 64)
    return 4 * br * d + 8 * bc * d + panels * br * 128


def wgmma_dkdv_smem(d: int, bk: int, br: int) -> int:
    """Bytes of shared memory of flash_bwd_dkdv_wgmma: K and V, two Q and two dO tiles, P^T and dS^T (in panels of
    64 columns), and two buffers of the queries' log-sum-exp and delta."""
    panels = -(-br // 64)
    return 4 * bk * d + 8 * br * d + 2 * panels * bk * 128 + 16 * br


def wgmma_tiles(d: int, dropout: bool) -> dict:
    """The wgmma forward's default tiles for head dim d."""
    return dict(WGMMA_TILES[d], BC=64) if dropout else dict(WGMMA_TILES[d])


# ------------------------------------------------------------------ host side: shapes, launches
@dataclass(frozen=True)
class Problem:
    """One attention call's sizes: q (batch, heads, lq, d), k and v (batch, heads // group, lk, d)."""
    batch: int
    heads: int
    group: int
    lq: int
    lk: int
    d: int
    causal: bool
    scale: float
    masked: bool
    dropout_p: float = 0.0

    def consts(self, tiles: dict) -> dict:
        return dict(D=self.d, BR=tiles["BR"], BC=tiles["BC"], CAUSAL=int(self.causal), MASKED=int(self.masked),
                    DROPOUT=int(self.dropout_p > 0.0))

    def dropout_args(self) -> tuple:
        return dropout_args(self.dropout_p)

    def sizes(self) -> tuple:
        return self.lq, self.lk, self.heads, self.group


def dropout_args(p: float) -> tuple:
    """(p, 1 / (1 - p)) in float32 as the kernels take them; 1 / (1 - p) is 0 at p = 1, where nothing is kept."""
    return np.float32(p), np.float32(1.0 / (1.0 - p) if p < 1.0 else 0.0)


def _row_bytes(d: int) -> int:
    return (d + PAD) * 2


def check_tiles(tiles: dict, d: int) -> None:
    """BR and BC multiples of 16 (a warp's 16 rows; 16-column mma steps) whose tiles the block's threads copy in
    whole 16-byte chunks."""
    br, bc = tiles["BR"], tiles["BC"]
    if br % 16 or bc % 16 or br <= 0 or bc <= 0:
        raise ValueError(f"flash_attention: tiles BR={br} and BC={bc} must be positive multiples of 16")
    for rows, threads in ((br, br * 2), (bc, br * 2), (bc, bc * 2), (br, bc * 2)):
        if rows * d // 8 % threads:
            raise ValueError(f"flash_attention: a {rows}x{d} tile is {rows * d // 8} 16-byte chunks, not a multiple "
                             f"of the {threads} threads that copy it (BR={br}, BC={bc})")


def _launcher(kern, xp):
    """The kernel on the GPU for CuPy arrays, its simulator for NumPy ones (CPU tests)."""
    return kern.simulate if xp is np else kern


def _rows(xp, a, d: int):
    """a (..., L, d) as a contiguous 2-D array of rows."""
    return xp.ascontiguousarray(a).reshape(-1, d)


def _row_strides(a, d: int) -> tuple | None:
    """The (batch, head, position) strides of a (B, H, L, d) array in rows of d values (0 for a dim of size 1), or
    None where its rows are not whole, 16-byte aligned runs of d values the kernels can copy."""
    row = d * a.itemsize
    if a.size == 0 or a.strides[3] != a.itemsize or layout.data_ptr(a) % 16 or any(
            s < 0 or s % row for s, n in zip(a.strides[:3], a.shape[:3]) if n > 1):
        return None
    return tuple(s // row if n > 1 else 0 for s, n in zip(a.strides[:3], a.shape[:3]))


def _row_view(xp, a, d: int) -> tuple:
    """(rows, layout): a (B, H, L, d) array as the 2-D array of rows (d values each) from its first element to its
    last, and the (batch, head, position) strides of its rows; a layout the kernels cannot read is copied into
    C order first."""
    a = _readable(xp, a, d)
    strides = _row_strides(a, d)
    count = 1 + sum((n - 1) * s for n, s in zip(a.shape[:3], strides))
    return xp.lib.stride_tricks.as_strided(a, (count, d), (d * a.itemsize, a.itemsize)), strides


def _dense(shape: tuple, strides: tuple, item: int) -> bool:
    """Whether (shape, strides) covers one gap-free block of memory (C order up to a permutation of the dims)."""
    expected = item
    for s, n in sorted((s, n) for s, n in zip(strides, shape) if n > 1):
        if s != expected:
            return False
        expected *= n
    return True


def _output_like(xp, a):
    """An uninitialized array of a's shape, dtype and (where a covers a gap-free block) memory layout."""
    if _dense(a.shape, a.strides, a.itemsize) and all(s >= 0 for s in a.strides):
        return xp.lib.stride_tricks.as_strided(xp.empty(a.size, a.dtype), a.shape, a.strides)
    return xp.empty(a.shape, a.dtype)


def gradients_like(xp, arrays: tuple) -> tuple:
    """Uninitialized gradients for `arrays`, each in its array's layout. Arrays of one shape and strides at equal
    steps through memory that together cover one gap-free block (q, k and v split out of one projection) get views
    of one new block laid out alike: the gradient of the projection is then that block, no copy."""
    first = arrays[0]
    step = layout.data_ptr(arrays[1]) - layout.data_ptr(first) if len(arrays) > 1 else 0
    alike = all(a.shape == first.shape and a.strides == first.strides and a.dtype == first.dtype and
                layout.data_ptr(a) - layout.data_ptr(first) == i * step for i, a in enumerate(arrays))
    tiles = _dense((len(arrays), *first.shape), (step, *first.strides), first.itemsize)
    if alike and step > 0 and step % 16 == 0 and tiles and all(s >= 0 for s in first.strides):
        block = xp.empty(len(arrays) * first.size, first.dtype)
        return tuple(xp.lib.stride_tricks.as_strided(block[i * step // first.itemsize:], first.shape, first.strides)
                     for i in range(len(arrays)))
    return tuple(_output_like(xp, a) for a in arrays)


def output_blhd(xp, p: "Problem", dtype):
    """O's (B, H, L, D) array laid out (B, L, H, D)."""
    return xp.empty((p.batch, p.lq, p.heads, p.d), dtype).transpose(0, 2, 1, 3)


_constants: dict = {}   # (device, what) -> a small read-only array the kernels take where there is nothing to pass


def _constant(xp, what: str, make):
    """make(xp), made once a GPU (creating it launched a fill kernel at every attention call); NumPy's each time, and
    during a capture (whose memory is the graph's, freed with it)."""
    if xp is np or capturing():
        return make(xp)
    key = (xp.cuda.Device().id, what)
    a = _constants.get(key)
    if a is None:
        a = _constants[key] = make(xp)
    return a


def _kmask(xp, mask):
    if mask is None:   # no key-padding mask: a stub the kernels do not read (MASKED=0)
        return _constant(xp, "no mask", lambda xp: xp.ones(1, np.uint8))
    return xp.ascontiguousarray(mask).astype(np.uint8).reshape(-1)


def _rng(xp, p: Problem, rng):
    """The 4-word (key_lo, key_hi, offset_lo, offset_hi) uint32 state the dropout mask is drawn from."""
    if rng is None:
        if p.dropout_p > 0.0:
            raise ValueError("flash_attention: dropout needs the generator state its mask is drawn from (rng)")
        return _constant(xp, "no dropout", lambda xp: xp.zeros(4, np.uint32))
    if tuple(rng.shape) != (4,) or rng.dtype != np.uint32:
        raise ValueError(f"flash_attention: rng must be 4 uint32 words, got {rng.dtype} {tuple(rng.shape)}")
    return rng


VARIANTS = ("mma", "wgmma", "bulk")


def forward_variant(xp, q, variant: str | None) -> str:
    """Which forward kernel runs: "mma" (mma.sync, any GPU), "wgmma" (Hopper's warpgroup MMA) or "bulk" (wgmma fed
    by the copy engine, warp-specialized); asked for by name, or by default "bulk" for bf16 on a Hopper GPU (2.0x
    the mma forward at 4 x 16 x 4096 x 128 on an H100, flash_forward_tiles_h100_5a9727e.json) and "mma" elsewhere.
    FROST_FLASH_WGMMA=1 asks for "wgmma" there, FROST_FLASH_BULK=0 for "mma"."""
    if variant is not None:
        if variant not in VARIANTS:
            raise ValueError(f"flash_attention: variant must be one of {', '.join(map(repr, VARIANTS))}, got "
                             f"{variant!r}")
        return variant
    hopper = xp is not np and str(q.dtype) == "bfloat16" and device_arch(q.device.id).startswith("sm_90")
    if not hopper:
        return "mma"
    if os.environ.get("FROST_FLASH_WGMMA") == "1":
        return "wgmma"
    return "mma" if os.environ.get("FROST_FLASH_BULK") == "0" else "bulk"


def backward_variant(xp, q, p: "Problem", variant: str | None) -> str:
    """Which backward runs: "mma" (after the mma.sync forward), "wgmma" (the two warpgroup-MMA kernels) or "fused"
    (one kernel per key block, dQ added in float32). After the "bulk" and default forwards the fused one runs at the
    head dims and lengths of FUSED_FROM_LENGTH unless frost.backends.deterministic (its dQ sums in an order the GPU
    chooses); FROST_FLASH_FUSED_BACKWARD=1 asks for it everywhere, =0 for the two kernels."""
    if variant == "fused":
        return "fused"
    if not uses_wgmma(xp, q, variant):
        return "mma"
    if variant == "wgmma":
        return "wgmma"
    asked = os.environ.get("FROST_FLASH_FUSED_BACKWARD", "")
    long = p.lq >= FUSED_FROM_LENGTH.get(p.d, math.inf)
    fused = asked == "1" or (asked == "" and long and not backends.deterministic)
    return "fused" if fused else "wgmma"


def uses_wgmma(xp, q, variant: str | None) -> bool:
    """Whether attention runs the warpgroup-MMA kernels (the backward's for the "wgmma" and "bulk" forwards)."""
    return forward_variant(xp, q, variant) != "mma"


def _hopper_outputs(xp, q, p: Problem, variant: str) -> tuple:
    """O (its rows in C order) and the log-sum-exp a Hopper forward writes, for bf16 q (the only type they take)."""
    if str(q.dtype) != "bfloat16":
        raise ValueError(f"flash_attention: the {variant} forward takes bf16, got {q.dtype}")
    return xp.empty((p.batch * p.heads * p.lq, p.d), q.dtype), xp.empty(p.batch * p.heads * p.lq, np.float32)


def forward_wgmma(xp, q, k, v, p: Problem, kmask=None, tiles: dict | None = None, rng=None):
    """forward_arrays by flash_fwd_wgmma (bf16; tiles: {"WGS": warpgroups, "BC": keys a tile})."""
    o, lse = _hopper_outputs(xp, q, p, "wgmma")
    tiles = dict(wgmma_tiles(p.d, p.dropout_p > 0.0), **(tiles or {}))
    wgs, bc = tiles["WGS"], tiles["BC"]
    if wgs not in (1, 2) or bc not in (64, 128):
        raise ValueError(f"flash_attention: the wgmma forward takes WGS 1 or 2 and BC 64 or 128, got {tiles}")
    br = 64 * wgs
    smem = (br + 4 * bc) * p.d * 2 + br * bc * 2
    grid = (cdiv(p.lq, br), p.heads, p.batch)
    _launcher(wgmma_forward(), xp)[grid, 128 * wgs, smem](
        _rows(xp, q, p.d), _rows(xp, k, p.d), _rows(xp, v, p.d), o, lse, _kmask(xp, kmask),
        _rng(xp, p, rng), *p.sizes(), p.scale * LOG2E, *p.dropout_args(), D=p.d, WGS=wgs, BC=bc,
        CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0))
    return o.reshape(p.batch, p.heads, p.lq, p.d), lse.reshape(p.batch, p.heads, p.lq)


# The bulk forward's tiles by head dim, non-causal and causal. H100, the kernel alone, two leases (tree 015f5f3 and
# that tree with the persistent kernel: flash_forward_tiles_h100_015f5f3.json,
# flash_forward_tiles_persistent_d{128,64}_h100_015f5f3-persistent.json in benchmarks/results): at head dim 128, two
# warpgroups taking turns over 128-key tiles (PINGPONG) beat three over 64-key tiles at every length from 512 to 8192
# (4 x 16 x 4096 x 128: 0.899 against 0.990 ms, causal 0.535 against 0.604; 2 x 16 x 8192 x 128 1.686 against 1.944);
# at head dim 64 three warpgroups over 128-key tiles without causal masking (4 x 32 x 4096 x 64: 1.211 against 1.446
# for 64-key tiles), the turns with it (causal 0.712 against 0.781), each persistent (16 x 32 x 1024 x 64: 0.393
# against 0.448, causal 0.299 against 0.335)
BULK_TILES = {64: dict(WGS=3, BC=128, STAGES=2, PINGPONG=0, RS=1, PERSIST=1),
              128: dict(WGS=2, BC=128, STAGES=2, PINGPONG=1, RS=1, PERSIST=0)}


CAUSAL_BULK_TILES = {64: dict(WGS=2, BC=128, STAGES=2, PINGPONG=1, RS=1, PERSIST=1), 128: BULK_TILES[128]}


# with dropout: two warpgroups over 64-key tiles (three spill at head dim 128, 128 keys at 64), not persistent (the
# dropout masks are counted by the grid's heads)
DROPOUT_BULK_TILES = dict(WGS=2, BC=64, STAGES=2, PINGPONG=0, RS=1, PERSIST=0)


# At head dim 128 below PERSIST_BELOW queries the blocks are persistent (PERSIST=1): a block's start and end are a
# larger part of its work there (32 x 16 x 512 x 128: 0.247 -> 0.235 ms, causal 0.203 -> 0.199; 16 x 16 x 1024 x 128
# 0.337 -> 0.331, causal 0.242 -> 0.233; at 2048 and longer no faster, or slower)
PERSIST_BELOW = 2048


SIMULATED_SMS = 3


def bulk_tiles(d: int, dropout: bool, causal: bool = False, lq: int | None = None) -> dict:
    """The bulk forward's tiles (a new dict) for lq queries (None: a long sequence)."""
    if dropout:
        return dict(DROPOUT_BULK_TILES)
    tiles = dict(CAUSAL_BULK_TILES[d] if causal else BULK_TILES[d])
    if d == 128 and lq is not None and lq < PERSIST_BELOW:
        tiles["PERSIST"] = 1
    return tiles


def kv_tensor_map(xp, a, p: Problem, bc: int):
    """A tensor map over K or V (B, H // group, Lk, D) where they lie, boxes of bc keys x 64 columns: a layout the
    copy engine cannot read (rows not whole, a dimension repeated by a zero stride) is copied into C order first."""
    a = _readable(xp, a, p.d)
    if any(s <= 0 for s, n in zip(a.strides[:3], a.shape[:3]) if n > 1):
        a = xp.ascontiguousarray(a)
    strides = list(a.strides)
    for i in (2, 1, 0):   # a dimension of one element is never stepped over: give it the stride C order would
        if a.shape[i] == 1:
            strides[i] = a.shape[i + 1] * strides[i + 1]
    if tuple(strides) != a.strides:
        a = xp.lib.stride_tricks.as_strided(a, a.shape, tuple(strides))
    return tensor_map(a, (1, 1, bc, 64))


def _multiprocessors(xp) -> int:
    """The SMs a persistent grid fills: the GPU's, or SIMULATED_SMS in the simulator (a few blocks, so that tests
    see blocks take several tiles)."""
    return SIMULATED_SMS if xp is np else multiprocessor_count(xp.cuda.runtime.getDevice())


def forward_bulk(xp, q, k, v, p: Problem, kmask=None, tiles: dict | None = None, rng=None):
    """forward_arrays by flash_fwd_bulk (bf16; tiles: {"WGS": consumer warpgroups, "BC": keys a tile, "STAGES":
    tiles in flight, "PINGPONG": 1 for the two warpgroups taking turns at the tensor cores, "RS": 1 for P kept in
    registers}), K and V read where they lie through tensor maps."""
    o, lse = _hopper_outputs(xp, q, p, "bulk")
    # a setting asked for fills its gaps from the long-sequence defaults, whatever the length (its names keep their
    # meaning); only the default itself depends on the length
    tiles = dict(bulk_tiles(p.d, p.dropout_p > 0.0, p.causal, None if tiles else p.lq), **(tiles or {}))
    wgs, bc, stages, rs, persist = tiles["WGS"], tiles["BC"], tiles["STAGES"], tiles["RS"], tiles["PERSIST"]
    if wgs not in (1, 2, 3) or bc not in (64, 128, 176, 192) or (bc % 64 and not rs) or stages not in (1, 2, 3, 4) \
            or tiles["PINGPONG"] not in (0, 1) or rs not in (0, 1) or persist not in (0, 1):
        raise ValueError(f"flash_attention: the bulk forward takes WGS 1 to 3, BC 64 or 128 (176 and 192 with RS=1), "
                         f"STAGES 1 to 4 and PINGPONG, RS and PERSIST 0 or 1, got {tiles}")
    if persist and p.dropout_p > 0.0:
        raise ValueError(f"flash_attention: the persistent bulk forward (PERSIST=1) does not take dropout (its masks "
                         f"are counted by the grid's heads), got dropout_p={p.dropout_p} with {tiles}")
    br = 64 * wgs
    smem = (br + 2 * stages * bc) * p.d * 2 + (16 * 64 * 2 if rs else br * bc * 2)   # P's panels, or a stub
    if smem > HOPPER_SHARED_BYTES:
        raise ValueError(f"flash_attention: the bulk forward's tiles {tiles} need {smem} bytes of shared memory (at "
                         f"most {HOPPER_SHARED_BYTES}) and K, V padded to whole tiles below 2^31 elements, at head dim "
                         f"{p.d}, {p.lk} keys")
    kp, vp = kv_tensor_map(xp, k, p, bc), kv_tensor_map(xp, v, p, bc)
    grid = (cdiv(p.lq, br), p.heads, p.batch)
    if persist:
        grid = (min(math.prod(grid), _multiprocessors(xp)), 1, 1)
    _launcher(bulk_forward(), xp)[grid, 128 * wgs + 128, smem](
        _rows(xp, q, p.d), kp, vp, o, lse, _kmask(xp, kmask), _rng(xp, p, rng), *p.sizes(), p.batch,
        p.scale * LOG2E, *p.dropout_args(), D=p.d, WGS=wgs, BC=bc, STAGES=stages, PINGPONG=tiles["PINGPONG"], RS=rs,
        PERSIST=persist, CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0))
    return o.reshape(p.batch, p.heads, p.lq, p.d), lse.reshape(p.batch, p.heads, p.lq)


def forward_arrays(xp, q, k, v, p: Problem, kmask=None, tiles: dict | None = None, rng=None,
                   variant: str | None = None):
    """(O, log-sum-exp) of the attention of q (B, H, Lq, D) over k, v (B, H // group, Lk, D): O in q's dtype,
    the log-sum-exp float32 (B, H, Lq). kmask: a boolean (B, Lk) key-padding mask (True = attend) or None. rng:
    with p.dropout_p > 0, the generator state snapshot (4 uint32 words) the dropout mask comes from. variant:
    "mma" (mma.sync), "wgmma" or "bulk" for the forward kernel, None for the default (forward_variant)."""
    if variant is None and tiles is not None and "BR" in tiles:
        variant = "mma"   # tiles naming query rows (BR) are the mma.sync forward's
    chosen = forward_variant(xp, q, variant)
    if chosen == "bulk":
        return forward_bulk(xp, q, k, v, p, kmask, tiles, rng)
    if chosen == "wgmma":
        return forward_wgmma(xp, q, k, v, p, kmask, tiles, rng)
    tiles = dict(FORWARD_TILES[p.d], **(tiles or {}))
    check_tiles(tiles, p.d)
    kern = kernels_for(str(q.dtype)).forward
    o = output_blhd(xp, p, q.dtype)
    lse = xp.empty(p.batch * p.heads * p.lq, np.float32)
    smem = (tiles["BR"] + 2 * tiles["BC"]) * _row_bytes(p.d)
    grid = (cdiv(p.lq, tiles["BR"]), p.heads, p.batch)
    (q2, q_layout), (o2, o_layout) = _row_view(xp, q, p.d), _row_view(xp, o, p.d)
    k, v = _readable_pair(xp, k, v, p.d)
    (k2, k_layout), (v2, _) = _row_view(xp, k, p.d), _row_view(xp, v, p.d)
    _launcher(kern, xp)[grid, tiles["BR"] * 2, smem](
        q2, k2, v2, o2, lse, _kmask(xp, kmask), _rng(xp, p, rng), *p.sizes(), *q_layout, *k_layout, *o_layout,
        p.scale * LOG2E, *p.dropout_args(), **p.consts(tiles))
    return o, lse.reshape(p.batch, p.heads, p.lq)


def backward_arrays(xp, q, k, v, o, lse, do, p: Problem, kmask=None, tiles: dict | None = None, rng=None,
                    variant: str | None = None):
    """(dQ, dK, dV) in q's dtype, from the forward's O and log-sum-exp and the output's gradient dO. tiles: the dQ
    kernel's (BR queries a block, BC keys a step); the dK/dV kernel's are these swapped. rng: the forward's.
    variant: as forward_arrays'. Each gradient has its input's layout (gradients_like)."""
    tiles = dict(BACKWARD_TILES[p.d], **(tiles or {}))
    check_tiles(tiles, p.d)
    lse = xp.ascontiguousarray(lse).reshape(-1)
    chosen = backward_variant(xp, q, p, variant)
    if chosen != "mma":
        run = _backward_fused if chosen == "fused" else _backward_wgmma
        return run(xp, q, k, v, o, lse, do, p, _kmask(xp, kmask), _rng(xp, p, rng))
    kernels = kernels_for(str(q.dtype))
    br, bc = tiles["BR"], tiles["BC"]
    q, k, v = _readable(xp, q, p.d), *_readable_pair(xp, k, v, p.d)
    grads = gradients_like(xp, (q, k, v))
    q, k, v = (_in_layout_of(xp, a, g) for a, g in zip((q, k, v), grads))
    do = _in_layout_of(xp, do, o)
    (q2, q_layout), (o2, o_layout), (do2, _) = (_row_view(xp, a, p.d) for a in (q, o, do))
    (k2, k_layout), (v2, _) = _row_view(xp, k, p.d), _row_view(xp, v, p.d)
    dq2, dk2, dv2 = (_row_view(xp, g, p.d)[0] for g in grads)
    mask = _kmask(xp, kmask)
    state = _rng(xp, p, rng)
    rows = p.batch * p.heads * p.lq
    delta = xp.empty(rows, np.float32)
    _launcher(kernels.dot, xp)[cdiv(rows, 4), 128](o2, do2, delta, rows, p.lq, p.heads, *o_layout, D=p.d)
    layouts = (*q_layout, *k_layout, *o_layout)
    scales = (p.scale * LOG2E, p.scale)
    _launcher(kernels.dq, xp)[(cdiv(p.lq, br), p.heads, p.batch), br * 2, (2 * br + 2 * bc) * _row_bytes(p.d)](
        q2, k2, v2, do2, lse, delta, mask, state, dq2, *p.sizes(), *layouts, *scales, *p.dropout_args(),
        **p.consts(tiles))
    smem = (2 * br + 2 * bc) * _row_bytes(p.d) + 2 * bc * 4
    _launcher(kernels.dkdv, xp)[(cdiv(p.lk, br), p.heads // p.group, p.batch), br * 2, smem](
        q2, k2, v2, do2, lse, delta, mask, state, dk2, dv2, *p.sizes(), *layouts, *scales, *p.dropout_args(),
        **p.consts(dict(BR=bc, BC=br)))
    return grads


def _readable(xp, a, d: int):
    """a, or a copy in C order where the kernels cannot read its rows where they lie."""
    return a if _row_strides(a, d) is not None else xp.ascontiguousarray(a)


def _readable_pair(xp, k, v, d: int) -> tuple:
    """k and v readable with one layout (the kernels take one for both)."""
    k, v = _readable(xp, k, d), _readable(xp, v, d)
    if k.strides != v.strides:
        return xp.ascontiguousarray(k), xp.ascontiguousarray(v)
    return k, v


def _in_layout_of(xp, a, like):
    """a, or a copy of it laid out as `like` (whose rows the kernels read): an input and its gradient, O and dO,
    share their layout arguments."""
    if a.strides == like.strides:
        return a
    out = _output_like(xp, like)
    out[...] = a
    return out


def _row_deltas(xp, q, o2, do2, p: Problem):
    """D = rowsum(dO * O) of each query row (C-order rows)."""
    delta = xp.empty(o2.shape[0], np.float32)
    c_order = (p.heads * p.lq, p.lq, 1)
    _launcher(kernels_for(str(q.dtype)).dot, xp)[cdiv(o2.shape[0], 4), 128](o2, do2, delta, o2.shape[0], p.lq,
                                                                            p.heads, *c_order, D=p.d)
    return delta


def check_fused(xp, q, d: int, wgs: int) -> None:
    """A ValueError naming what the fused backward does not take: other than bf16, a GPU other than Hopper, or
    warpgroups whose dQ columns or shared memory do not fit."""
    if str(q.dtype) != "bfloat16":
        raise ValueError(f"flash_attention: the fused backward takes bfloat16, got {q.dtype}")
    if xp is not np and not device_arch(q.device.id).startswith("sm_90"):
        raise ValueError(f"flash_attention: the fused backward needs a Hopper GPU (sm_90), got "
                         f"{device_arch(q.device.id)}")
    if wgs not in (1, 2) or fused_smem(d, wgs) > HOPPER_SHARED_BYTES:
        raise ValueError(f"flash_attention: the fused backward takes 1 or 2 warpgroups within "
                         f"{HOPPER_SHARED_BYTES} bytes of shared memory, got WGS={wgs} at head dim {d} "
                         f"({fused_smem(d, wgs)} bytes)")


def _backward_fused(xp, q, k, v, o, lse, do, p: Problem, mask, state) -> tuple:
    """backward_arrays by the one-kernel Hopper backward (C-order rows throughout): dQ summed in float32 across the
    key blocks, then converted."""
    tiles = FUSED_BACKWARD_TILES[p.d]
    wgs = tiles["WGS"]
    check_fused(xp, q, p.d, wgs)
    q2, k2, v2, o2, do2 = (_rows(xp, a, p.d) for a in (q, k, v, o, do))
    fused, convert, tile_stats = fused_backward()
    tiles_per_head = cdiv(p.lq, 64)
    stats = xp.empty(p.batch * p.heads * tiles_per_head * 128, np.float32)
    _launcher(tile_stats, xp)[(tiles_per_head, p.heads, p.batch), 256](o2, do2, lse, stats, p.lq, D=p.d)
    dk, dv = xp.empty_like(k2), xp.empty_like(v2)
    dq_acc = xp.zeros(p.batch * p.heads * cdiv(p.lq, 64) * 64 * p.d, np.float32)
    flags = dict(D=p.d, WGS=wgs, CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0),
                 **{name: tiles.get(name, 0) for name in ("RS", "OVERLAP_EXP")})
    qs = tuple(tensor_map(a.reshape(-1, p.lq, p.d), (1, 64, 64)) for a in (q2, do2))
    _launcher(fused, xp)[(cdiv(p.lk, 64 * wgs), p.heads // p.group, p.batch), 128 * wgs, fused_smem(p.d, wgs)](
        qs[0], k2, v2, qs[1], stats, mask, state, dk, dv, dq_acc, *p.sizes(), p.scale * LOG2E, p.scale,
        *p.dropout_args(), **flags)
    dq = xp.empty_like(q2)
    _launcher(convert, xp)[(cdiv(p.lq, 64), p.heads, p.batch), 128 * wgs](dq_acc, dq, p.lq, p.scale, D=p.d, WGS=wgs)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _backward_wgmma(xp, q, k, v, o, lse, do, p: Problem, mask, state) -> tuple:
    """backward_arrays by the two warpgroup-MMA kernels (C-order rows throughout)."""
    q2, k2, v2, o2, do2 = (_rows(xp, a, p.d) for a in (q, k, v, o, do))
    delta = _row_deltas(xp, q, o2, do2, p)
    dq, dk, dv = xp.empty_like(q2), xp.empty_like(k2), xp.empty_like(v2)
    scales = (p.scale * LOG2E, p.scale)
    flags = dict(CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0))
    wt = WGMMA_BACKWARD_TILES[p.d]
    dq_wgmma, dkdv_wgmma = wgmma_backward()
    wbr, wbc = 64 * wt["WGS"], wt["BC"]
    smem = wgmma_dq_smem(p.d, wbr, wbc)
    _launcher(dq_wgmma, xp)[(cdiv(p.lq, wbr), p.heads, p.batch), 128 * wt["WGS"], smem](
        q2, k2, v2, do2, lse, delta, mask, state, dq, *p.sizes(), *scales, *p.dropout_args(),
        D=p.d, WGS=wt["WGS"], BC=wbc, **flags)
    bk, wbr = 64 * wt["WGS"], wt["BR"]
    smem = wgmma_dkdv_smem(p.d, bk, wbr)
    _launcher(dkdv_wgmma, xp)[(cdiv(p.lk, bk), p.heads // p.group, p.batch), 128 * wt["WGS"], smem](
        q2, k2, v2, do2, lse, delta, mask, state, dk, dv, *p.sizes(), *scales,
        *p.dropout_args(), D=p.d, WGS=wt["WGS"], BR=wbr, **flags)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


# ------------------------------------------------------------------ the op and when it applies
def problem(query: Tensor, key: Tensor, value: Tensor, is_causal: bool, scale: float | None, enable_gqa: bool,
            masked: bool, dropout_p: float = 0.0, op: str = "flash_attention") -> Problem:
    """The call's Problem, or a ValueError naming `op` and the shapes or dtypes it does not take."""
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(f"{op}: query, key and value must be 4-D (batch, heads, length, head dim), got shapes "
                         f"{query.shape}, {key.shape}, {value.shape}")
    (b, h, lq, d), (bk, hk, lk, dk) = query.shape, key.shape
    if key.shape != value.shape or bk != b or dk != d:
        raise ValueError(f"{op}: key {key.shape} and value {value.shape} must have one shape, with query "
                         f"{query.shape}'s batch and head dim")
    if hk == 0 or h % hk or (hk != h and not enable_gqa):
        raise ValueError(f"{op}: query heads {h} must equal the key/value heads {hk}, or be a multiple of them "
                         f"with enable_gqa=True")
    if d not in HEAD_DIMS or query.dtype.name not in DTYPES or len({t.dtype.name for t in (query, key, value)}) > 1:
        raise ValueError(f"{op}: needs one dtype of {DTYPES} (got {query.dtype.name}, {key.dtype.name}, "
                         f"{value.dtype.name}) and a "
                         f"head dim in {HEAD_DIMS} (got {d})")
    if lq == 0 or lk == 0:
        raise ValueError(f"{op}: empty sequences (query {query.shape}, key {key.shape}) are the composed path's")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{op}: dropout_p must be between 0 and 1, got {dropout_p}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return Problem(b, h, h // hk, lq, lk, d, bool(is_causal), scale, masked, float(dropout_p))


def check_scale(p: Problem) -> Problem:
    """p, or a ValueError: the flash kernels' online softmax scales each row's maximum of the raw scores, which is the
    maximum of the scaled ones only for a positive scale, and a masked score times a zero scale would be NaN; the
    kernels get scale * log2(e) as a float32, which must be normal."""
    with np.errstate(over="ignore"):
        scale_log2 = np.float32(p.scale * LOG2E)
    if not 2.0 ** -126 <= scale_log2 < math.inf:
        raise ValueError(f"flash_attention: scale must be positive and finite (a normal float32 in log2 units), got "
                         f"{p.scale}; scaled_dot_product_attention takes such scales on its composed path")
    return p


def dropout_keep_numpy(rng, bh: int, lq: int, lk: int, p: float) -> np.ndarray:
    """The kernels' dropout multipliers as a float32 (bh, lq, lk) array: 1 / (1 - p) where a weight is kept, else
    0, from the 4-word state snapshot `rng` (the twin of dropout_pair and dropout_pair_of_queries)."""
    key, query, head = np.arange(lk), np.arange(lq), np.arange(bh)
    counters = ((key // 2)[None, None, :], (query // 2)[None, :, None], head[:, None, None], np.uint64(rng[2]))
    words = philox4x32(counters, (np.uint64(rng[0]), np.uint64(rng[1]) ^ np.uint64(STREAM)))
    word = 2 * (query % 2)[:, None] + (key % 2)[None, :]   # which of the block's four words, per (query, key)
    w = np.choose(word[None], words)
    u = (w >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)
    drop_p, keep_scale = dropout_args(p)
    return np.where(u >= drop_p, keep_scale, np.float32(0.0))


def dropout_state(xp):
    """A snapshot of the generator's state to draw one call's dropout mask from, the generator then moved on by
    one offset: on CUDA a device-to-device copy of the Philox state and its advance kernel (no host read, so a
    captured step draws a new mask on each replay); on the CPU (the simulator) four words of NumPy's generator."""
    if xp is np:
        return cpu.generator().integers(0, 1 << 32, size=4, dtype=np.uint32)
    return cuda.generator().reserve(1)


def flash_attention(query: Tensor, key: Tensor, value: Tensor, is_causal: bool = False, scale: float | None = None,
                    enable_gqa: bool = False, key_padding_mask: Tensor | None = None,
                    tiles: dict | None = None, dropout_p: float = 0.0) -> Tensor:
    """dropout(softmax(query @ key^T * scale)) @ value by the fused kernels (on CUDA; in the kernel simulator for
    CPU tensors, which is slow: tests only). query (B, H, Lq, D), key and value (B, H // group, Lk, D), bf16 or
    f16, D 64 or 128. key_padding_mask: a boolean (B, Lk) tensor, True = attend. tiles: {"BR": ..., "BC": ...}.
    dropout_p: the probability of dropping each attention weight (the mask from Frost's generator)."""
    mask = None if key_padding_mask is None else key_padding_mask.data
    if mask is not None and tuple(mask.shape) != (query.shape[0], key.shape[-2]):
        raise ValueError(f"flash_attention: key_padding_mask must have shape (batch, key length) = "
                         f"{(query.shape[0], key.shape[-2])}, got {tuple(mask.shape)}")
    p = check_scale(problem(query, key, value, is_causal, scale, enable_gqa, mask is not None, dropout_p))
    xp = query.xp
    q, k, v = query.data, key.data, value.data
    rng = dropout_state(xp) if p.dropout_p > 0.0 else None
    o, lse = forward_arrays(xp, q, k, v, p, mask, tiles, rng)

    def backward(g):
        return backward_arrays(xp, q, k, v, o, lse, g, p, mask, tiles, rng)

    backward.fresh_gradients = True   # new arrays (gradients_like, the Hopper kernels' outputs): a leaf keeps them
    return from_op(o, (query, key, value), backward, "flash_attention")


def key_padding_mask(attn_mask: Tensor | None, query: Tensor, key: Tensor):
    """attn_mask as a (B, Lk) key-padding mask when it is one: boolean, shape (B, 1, 1, Lk) (or (B or 1 of it)
    broadcast over heads and queries); None for no mask; False when the mask is anything else."""
    if attn_mask is None:
        return None
    b, lk = query.shape[0], key.shape[-2]
    shape = tuple(attn_mask.shape)
    if attn_mask.dtype.name != "bool" or len(shape) != 4 or shape[1:3] != (1, 1) or shape[0] not in (1, b) \
            or shape[3] != lk:
        return False
    return Tensor(attn_mask.xp.broadcast_to(attn_mask.data.reshape(shape[0], lk), (b, lk)))


def supported(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> bool:
    """Whether flash_attention computes this scaled_dot_product_attention call: CUDA tensors on a GPU with bf16
    mma.sync (compute capability 8.0 or newer) for which `applies` holds. FROST_FLASH_ATTENTION=0 (read at each call)
    switches it off."""
    if os.environ.get("FROST_FLASH_ATTENTION", "1") == "0":
        return False
    if any(not isinstance(t, Tensor) or t.device.type != "cuda" for t in (query, key, value)):
        return False
    return has_mma(query.data) and applies(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def applies(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> bool:
    """The kernels' own rules, on any device: q, k and v 4-D of one dtype (bf16 or f16), head dim 64 or 128 for all
    three, dropout_p in [0, 1], a positive finite scale (the online softmax scales each row's maximum), no mask or a
    boolean key-padding mask ((B or 1, 1, 1, Lk)), non-empty sequences, equal heads or grouped ones with enable_gqa,
    fewer than 2^31 elements each."""
    tensors = (query, key, value)
    if not 0.0 <= dropout_p <= 1.0 or any(t.ndim != 4 or t.data.size >= 2**31 for t in tensors):
        return False
    if key_padding_mask(attn_mask, query, key) is False:
        return False
    try:
        check_scale(problem(query, key, value, is_causal, scale, enable_gqa, attn_mask is not None))
    except ValueError:
        return False
    return True


@dispatch.register("scaled_dot_product_attention", device="cuda", dtypes=DTYPES, applies=supported)
def scaled_dot_product_attention_flash(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                       dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                       enable_gqa: bool = False) -> Tensor:
    """scaled_dot_product_attention by the fused kernels: no L x S matrix in memory (a boolean key-padding
    attn_mask at most: `supported` has checked)."""
    mask = key_padding_mask(attn_mask, query, key)
    return flash_attention(query, key, value, is_causal, scale, enable_gqa, mask, dropout_p=dropout_p)
