"""Tensor-core forward convolutions of bf16 (or, on TF32, float32) channels-last activations (implicit
GEMM on mma.sync, float32 sums), and `choose`, which times them against cuDNN's plan once per shape and remembers the
faster."""

import json
import os
from dataclasses import dataclass

import numpy as np

from frost import backends
from frost.accel.conv_common import capturing, faster_than_cudnn
from frost.accel.conv_wgrad_mma import smem_budget
from frost.backend import cuda
from frost.backend.remembered import RememberedTable
from frost.kernel import (Array, Const, bf16, bx, by, cdiv, cp_async16, cp_commit, cp_wait, device, dynamic_shared, f32,
                          gdx, kernel, lane, launch_bounds, ldmatrix_x2, ldmatrix_x4, local, mma, shared, shfl_xor,
                          static_range, syncthreads, tx, warp)
from frost.kernel.compile import device_arch, has_mma
from frost.layout import empty_like_format, flat_view, is_channels_last

# y[p, co] = sum over taps (kh, kw) and input channels ci of x[pixel p shifted by the tap, ci] * w[co, kh, kw, ci]: a
# GEMM with M = output pixels (16-row mma tiles), N = Cout (8-column tiles) and K = taps x Cin (steps of 16 bf16 or
# 8 f32 channels of one tap). Block (t, nb) computes the tile of R output rows of one image (every column) for output
# channels nb*BN ... (nb+1)*BN - 1. It stages the x rows the tile needs (the halo, zeros outside the image) as
# [pixel][ci] and its BN weight rows (KRSC: taps x Cin contiguous per output channel) as [co][k] in shared memory with
# cp.async; warp w owns m-tiles w, w + WARPS, ... and every n-tile of the block. ldmatrix reads A with each lane naming
# its own pixel's halo row for the tap (the im2col gather costs nothing) and B straight from the weight rows.

PAD_BYTES = 16   # after each shared row: the 8 rows an ldmatrix reads fall in 8 bank groups
STATS_SLOTS = 4 * 64   # the tile statistics' shared sums: one per (warp of group 0 (at most 4), channel (at most 64))
# what batch norm saves per layer when its statistics come from our epilogue (so `choose` credits ours with it): its
# normalize kernels took 98.6 us (44679b0) instead of 135.6 (d5bdced) for the seed ResNet's 21 layers (H200,
# step_time.py --breakdown)
STATS_SAVING_US = 1.8


@device
def _tile_channel_sums(acc, center, sums, wm, write, MT, tile_pixels, SQUARES: Const[int], MTW: Const[int],
                       NTB: Const[int], WARPS: Const[int]):
    """sums[wm * BN + n] = the sum over this warp's pixels of the tile of y (SQUARES=0) or of (y - center[n])^2
    (SQUARES=1) for each of the block's BN = NTB * 8 channels n, y = acc: the lanes of one channel (those of equal
    lane % 4) meet by shuffles; lanes 0..3 write, when `write` (the warps of group 0, which hold the sums)."""
    g = lane // 4
    t = lane % 4
    for j in static_range(NTB):
        for b in static_range(2):
            n = j * 8 + 2 * t + b
            s = 0.0
            for i in static_range(MTW):
                mt = wm + i * WARPS
                for h in static_range(2):
                    p = mt * 16 + g + 8 * h
                    if mt < MT and p < tile_pixels:
                        v = acc[i, j, 2 * h + b]
                        if SQUARES:
                            v = (v - center[n]) * (v - center[n])
                        s += v
            s += shfl_xor(s, 4)
            s += shfl_xor(s, 8)
            s += shfl_xor(s, 16)
            if write and g == 0:
                sums[wm * NTB * 8 + n] = s


def _fprop_kernel(T):
    """conv_fprop_mma for element type T of x, w and y: bf16 (mma m16n8k16) or f32 (m16n8k8 on TF32, the same
    ldmatrix addresses: a 16-byte row piece is 4 f32 values instead of 8 bf16 ones, and a 32-bit register one f32)."""
    ITEM = T.np.itemsize
    VEC = 16 // ITEM             # elements per 16-byte copy and row pad
    KSTEP = 2 * VEC              # k per mma step: 16 bf16 or 8 f32 channels of one tap

    @kernel
    def conv_fprop_mma(x: Array[T], w: Array[T], y: Array[T], part_mean: Array[f32], part_m2: Array[f32],
                       CIN: Const[int], COUT: Const[int], H: Const[int], W: Const[int], HO: Const[int],
                       WO: Const[int], KH: Const[int], KW: Const[int], PH: Const[int], PW: Const[int], R: Const[int],
                       BN: Const[int], WARPS: Const[int], FLIP: Const[int] = 0, SH: Const[int] = 1,
                       SW: Const[int] = 1, UP: Const[int] = 1, YH: Const[int] = 0, YW: Const[int] = 0,
                       KSPLIT: Const[int] = 1, STATS: Const[int] = 0, DOWN: Const[int] = 1):
        """Block (t, nb): y for output rows (t % ceil(HO/R))*R ... of image t // ceil(HO/R), output channels nb*BN
        ...; x, y channels-last (NHWC memory), w channels-last (KRSC memory), stride (SH, SW), BN a multiple of 8;
        CIN any (a multiple of 16 bf16 or 8 f32 channels reads whole rows by cp.async; others, such as a stem's 3,
        are read an element at a time and padded with zeros to CP channels per tap in shared memory).

        FLIP=1: the input gradient of a stride-1 convolution as a forward one: x is dy, y is dx, and w is the
        original (COUT = its Cin, CIN = its Cout) weight, read turned by 180 degrees with its channel axes swapped.
        UP > 1 (with FLIP, a 1x1 kernel and no padding: the input gradient of a 1x1 convolution of stride UP): output
        pixel (ho, wo) goes to (ho*UP, wo*UP) of the YH x YW dx, whose other pixels no tap reaches (zeros).
        DOWN > 1 (with FLIP: the input gradient of a convolution of stride DOWN): x is read as the H x W dy spread
        DOWN apart, zeros between (dy's pixel (i, j) at (i*DOWN, j*DOWN); x holds H/DOWN x W/DOWN pixels); the rows
        and columns of y past YH x YW are not stored.
        KSPLIT > 1: KSPLIT groups of WARPS warps share the taps (group q takes taps q, q + KSPLIT, ...: a shorter chain
        of dependent mma steps per warp) and group 0 adds the others' sums, in group order, before it stores.
        STATS=1 (HO a multiple of R: every pixel of a tile is in the image): the block also stores the mean and the
        sum of squared deviations (M2) of each of its channels over its R * WO pixels, of y as stored (rounded to T),
        at part_mean / part_m2[channel * gdx + bx]: batch norm's partial statistics, an exact two-pass."""
        THREADS: Const[int] = WARPS * 32 * KSPLIT
        XR: Const[int] = (R - 1) * SH + KH           # x rows the tile needs
        XC: Const[int] = (WO - 1) * SW + KW          # x columns the tile needs
        MT: Const[int] = cdiv(R * WO, 16)            # m-tiles (pixels past the tile are computed, not stored)
        MTW: Const[int] = cdiv(MT, WARPS)
        NTB: Const[int] = BN // 8
        K: Const[int] = KH * KW * CIN
        CP: Const[int] = cdiv(CIN, KSTEP) * KSTEP   # channels per tap in shared memory: CIN, or CIN padded with zeros
        ROW_TILES: Const[int] = cdiv(HO, R)
        launch_bounds(THREADS)
        xs = dynamic_shared(T, (XR * XC, CP + VEC))
        ws = dynamic_shared(T, (BN, KH * KW * CP + VEC), XR * XC * (CP + VEC) * ITEM)
        wm = warp % WARPS   # this warp's m-tiles: wm, wm + WARPS, ...
        part = warp // WARPS
        img = bx // ROW_TILES
        ho0 = bx % ROW_TILES * R
        co0 = by * BN
        for e in range(tx, XR * XC * (CP // VEC), THREADS):
            p = e // (CP // VEC)
            c = e % (CP // VEC) * VEC
            hi = ho0 * SH - PH + p // XC
            wi = p % XC - PW
            at = ((img * (H // DOWN) + hi // DOWN) * (W // DOWN) + wi // DOWN) * CIN + c
            inside = hi >= 0 and hi < H and wi >= 0 and wi < W and hi % DOWN == 0 and wi % DOWN == 0
            if CP == CIN and inside:
                cp_async16(xs, (p, c), x, at)
            else:   # outside the image, or channels past CIN (a row of CIN < CP channels: not 16-byte aligned)
                for u in static_range(VEC):
                    xs[p, c + u] = x[at + u] if inside and c + u < CIN else 0.0
        if FLIP:   # ws[n, (tap, c)] = w[c, KH-1-kh, KW-1-kw, co0 + n]: an element at a time (a strided gather)
            for e in range(tx, BN * K, THREADS):   # neighbouring threads: neighbouring channels n (coalesced)
                n = e % BN
                k = e // BN
                turned = KH * KW - 1 - k // CIN   # the tap this one reads, turned by 180 degrees
                ws[n, k] = f32(w[((k % CIN * KH + turned // KW) * KW + turned % KW) * COUT + co0 + n]) \
                    if co0 + n < COUT else 0.0   # (via f32: exact, and a store rounds nothing back)
        elif CP == CIN:
            for e in range(tx, BN * (K // VEC), THREADS):
                n = e // (K // VEC)
                k = e % (K // VEC) * VEC
                if co0 + n < COUT:
                    cp_async16(ws, (n, k), w, (co0 + n) * K + k)
                else:
                    for u in static_range(VEC):
                        ws[n, k + u] = 0.0
        else:   # ws[n, tap * CP + c] = w[co0 + n, tap, c] for c < CIN, zeros up to CP
            for e in range(tx, BN * KH * KW * CP, THREADS):
                n = e // (KH * KW * CP)
                k = e % (KH * KW * CP)
                ws[n, k] = w[(co0 + n) * K + k // CP * CIN + k % CP] if co0 + n < COUT and k % CP < CIN else 0.0
        cp_commit()
        cp_wait(0)
        syncthreads()
        acc = local(f32, (MTW, NTB, 4))
        af = local(T, KSTEP // 2)
        bq = local(T, (NTB, KSTEP // 4))
        for i in static_range(MTW):
            for j in static_range(NTB):
                for q in static_range(4):
                    acc[i, j, q] = 0.0
        for tap in static_range(KH * KW):
            if tap % KSPLIT == part:   # the same for the whole warp
                for kc in static_range(CP // KSTEP):
                    for j in static_range(NTB):
                        ldmatrix_x2(bq[j], ws, (j * 8 + lane % 8, tap * CP + kc * KSTEP + lane // 8 % 2 * VEC))
                    for i in static_range(MTW):
                        mt = wm + i * WARPS
                        if mt < MT:   # the same for the whole warp
                            p = min(mt * 16 + lane % 16, R * WO - 1)   # rows past the tile repeat its last pixel
                            ldmatrix_x4(af, xs, ((p // WO * SH + tap // KW) * XC + p % WO * SW + tap % KW,
                                                 kc * KSTEP + lane // 16 * VEC))
                            for j in static_range(NTB):
                                mma(acc[i, j], af, bq[j])
        if KSPLIT > 1:   # the other groups' sums into group 0's, in group order
            sums = dynamic_shared(f32, (KSPLIT, WARPS * 32, MTW * NTB * 4),
                                  (XR * XC * (CP + VEC) + BN * (KH * KW * CP + VEC)) * ITEM)
            for i in static_range(MTW):
                for j in static_range(NTB):
                    for q in static_range(4):
                        sums[part, wm * 32 + lane, (i * NTB + j) * 4 + q] = acc[i, j, q]
            syncthreads()
            for i in static_range(MTW):
                for j in static_range(NTB):
                    for q in static_range(4):
                        for o in static_range(1, KSPLIT):
                            acc[i, j, q] += sums[o, wm * 32 + lane, (i * NTB + j) * 4 + q]
        if STATS:
            for i in static_range(MTW):
                for j in static_range(NTB):
                    for q in static_range(4):
                        acc[i, j, q] = f32(T(acc[i, j, q]))   # y's values as stored
            tile_sums = shared(f32, STATS_SLOTS)
            center = shared(f32, STATS_SLOTS // 4)
            _tile_channel_sums(acc, center, tile_sums, wm, part == 0, MT, R * WO, 0, MTW, NTB, WARPS)
            syncthreads()
            if tx < BN:
                total = 0.0
                for wk in static_range(WARPS):
                    total += tile_sums[wk * BN + tx]
                center[tx] = total / f32(R * WO)
            syncthreads()
            _tile_channel_sums(acc, center, tile_sums, wm, part == 0, MT, R * WO, 1, MTW, NTB, WARPS)
            syncthreads()
            if tx < BN and co0 + tx < COUT:
                m2 = 0.0
                for wk in static_range(WARPS):
                    m2 += tile_sums[wk * BN + tx]
                part_mean[(co0 + tx) * gdx + bx] = center[tx]
                part_m2[(co0 + tx) * gdx + bx] = m2
        g = lane // 4
        t = lane % 4
        for i in static_range(MTW):
            mt = wm + i * WARPS
            for j in static_range(NTB):
                for q in static_range(4):
                    p = mt * 16 + g + 8 * (q // 2)
                    co = co0 + j * 8 + 2 * t + q % 2
                    if part == 0 and mt < MT and p < R * WO and ho0 + p // WO < HO and co < COUT:
                        for a in static_range(UP):
                            for b in static_range(UP):
                                oh = (ho0 + p // WO) * UP + a
                                ow = p % WO * UP + b
                                if oh < YH and ow < YW:
                                    y[((img * YH + oh) * YW + ow) * COUT + co] = acc[i, j, q] if a + b == 0 else 0.0
    return conv_fprop_mma


KERNELS = {"bfloat16": _fprop_kernel(bf16), "float32": _fprop_kernel(f32)}
conv_fprop_mma = KERNELS["bfloat16"]


@dataclass(frozen=True)
class FpropPlan:
    """One launch of conv_fprop_mma: its Const values, grid and block."""
    consts: dict
    grid: tuple
    threads: int
    smem: int

    def tiles(self) -> dict:
        c = self.consts
        return {"R": c["R"], "BN": c["BN"], "WARPS": c["WARPS"]} | ({"KSPLIT": c["KSPLIT"]} if c["KSPLIT"] > 1 else {})


def geometry(x_shape: tuple, w_shape: tuple, padding, flip: bool = False, stride=(1, 1), out_hw=None) -> dict:
    """The Const values of a convolution of x (N, C, H, W) by w (Cout, C, KH, KW) with `padding` (ph, pw) and
    `stride` (sh, sw). flip: of the input gradient of that convolution, given x = dy (N, Cout, HO, WO): a forward
    convolution of dy by the turned weight (C, Cout, KH, KW) with padding (KH - 1 - ph, KW - 1 - pw), stride 1, into
    the out_hw = (H, W) of dx; where stride s > 1, a 1x1 kernel without padding spreads its output s apart (UP),
    another reads dy spread s apart with zeros between (DOWN: s*HO x s*WO)."""
    n, cin, h, wd = (int(a) for a in x_shape)
    cout, _, kh, kw = (int(a) for a in w_shape)
    ph, pw = (int(p) for p in padding)
    sh, sw = (int(s) for s in stride)
    up = down = 1
    if flip:
        spread = (sh, sw) != (1, 1)
        pointwise = (kh, kw, ph, pw) == (1, 1, 0, 0)
        up, down = (sh if spread and pointwise else 1), (sh if spread and not pointwise else 1)
        cout, ph, pw, sh, sw, h, wd = int(w_shape[1]), kh - 1 - ph, kw - 1 - pw, 1, 1, h * down, wd * down
    ho, wo = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    yh, yw = (int(a) for a in out_hw) if out_hw is not None else (ho * up, wo * up)
    return dict(CIN=cin, COUT=cout, H=h, W=wd, HO=ho, WO=wo, KH=kh, KW=kw, PH=ph, PW=pw, SH=sh, SW=sw, UP=up, YH=yh,
                YW=yw, DOWN=down)


def padded_channels(cin: int, item: int) -> int:
    """The channels per tap the kernel keeps in shared memory (CP): cin rounded up to one mma step (16 bf16, 8 f32)."""
    step = 32 // item
    return cdiv(cin, step) * step   # the kernel's CP


def _smem_bytes(geo: dict, R: int, BN: int, item: int = 2) -> int:
    """Shared memory of a block for elements of `item` bytes (bf16 2, f32 4): the halo and the weight rows, each row
    padded by 16 bytes."""
    halo = ((R - 1) * geo["SH"] + geo["KH"]) * ((geo["WO"] - 1) * geo["SW"] + geo["KW"])
    pad, cp = PAD_BYTES // item, padded_channels(geo["CIN"], item)
    return item * (halo * (cp + pad) + BN * (geo["KH"] * geo["KW"] * cp + pad))


def fprop_plan(geo: dict, n: int, R: int | None = None, BN: int | None = None, WARPS: int | None = None,
               flip: bool = False, item: int = 2, KSPLIT: int = 1) -> FpropPlan:
    """A launch plan: R output rows per block (default: about 64 pixels), BN output channels per block (default: all
    that fit in shared memory, at most 64), WARPS warps (default: one per m-tile, at most 4); flip: an input
    gradient (geo is then that of the forward convolution it runs as: geometry(..., flip=True)); item: bytes per
    element (2: bf16, 4: f32 on TF32); KSPLIT groups of warps share the taps."""
    ho, wo = geo["HO"], geo["WO"]
    R = min(ho, R or max(1, 64 // wo))
    BN = BN or min(64, cdiv(geo["COUT"], 8) * 8)
    while BN > 8 and _smem_bytes(geo, R, BN, item) > smem_budget(item):
        BN //= 2
    while R > 1 and _smem_bytes(geo, R, BN, item) > smem_budget(item):
        R //= 2
    mt = cdiv(R * wo, 16)
    WARPS = min(WARPS or 4, mt)
    consts = dict(geo, R=R, BN=BN, WARPS=WARPS, FLIP=int(flip), KSPLIT=KSPLIT)
    sums = 4 * KSPLIT * WARPS * 32 * cdiv(mt, WARPS) * (BN // 8) * 4 if KSPLIT > 1 else 0   # the groups' sums
    return FpropPlan(consts, (n * cdiv(ho, R), cdiv(geo["COUT"], BN)), 32 * WARPS * KSPLIT,
                     _smem_bytes(geo, R, BN, item) + sums)


def candidate_tiles(geo: dict, n: int, flip: bool = False, item: int = 2) -> list[dict]:
    """The default plan and neighbours (shorter or longer tiles; shorter ones with the same channels per block; for
    16 or more output channels per block, half of them; where a warp would chain 18 or more mma steps, the taps
    shared by 2 or 3 groups of warps), deduplicated: each is compiled and timed at a cold start."""
    base = fprop_plan(geo, n, flip=flip, item=item)
    r, bn = base.consts["R"], base.consts["BN"]
    plans = [base, fprop_plan(geo, n, R=max(1, r // 2), flip=flip, item=item),
             fprop_plan(geo, n, R=2 * r, flip=flip, item=item),
             fprop_plan(geo, n, R=max(1, r // 2), BN=bn, flip=flip, item=item)]
    if bn >= 16:   # wide outputs: also half the channels per block (twice the blocks)
        plans.append(fprop_plan(geo, n, BN=bn // 2, flip=flip, item=item))
    steps = geo["KH"] * geo["KW"] * padded_channels(geo["CIN"], item) * item // 32   # mma steps per warp (16 or 8 deep)
    if steps >= 18:
        plans += [fprop_plan(geo, n, flip=flip, item=item, KSPLIT=k) for k in (2, 3)]
    unique = []
    for plan in plans:
        if plan.tiles() not in unique and plan.smem <= smem_budget(item):
            unique.append(plan.tiles())
    return unique


def supported(x, w, stride, padding, dilation, groups: int, flip: bool = False) -> bool:
    """Whether conv_fprop_mma computes this call: bf16 x and w on the GPU (or float32 ones, on TF32 tensor cores,
    when frost.backends.allow_tf32), both channels-last, any stride, dilation 1, groups 1, any Cin
    (a multiple of 16 reads whole rows; fewer, as a stem's 3, are padded in shared memory), padding smaller than the
    kernel; FROST_CONV_FPROP_MMA=0 switches it off.
    flip: the input gradient (x = dy, whose channels must be a multiple of 16; equal strides); FROST_CONV_DGRAD_MMA=0
    switches that off alone (`choose` still runs it only where it times faster than cuDNN's input gradient)."""
    if os.environ.get("FROST_CONV_FPROP_MMA", "1") == "0":
        return False
    if flip and os.environ.get("FROST_CONV_DGRAD_MMA", "1") == "0":
        return False
    if str(x.dtype) != str(w.dtype) or not _kernel_dtype(str(x.dtype)) or groups != 1 or x.ndim != 4:
        return False
    if not has_mma(x):   # before Ampere: no bf16 or TF32 mma.sync
        return False
    if min(stride) < 1 or tuple(dilation) != (1, 1) or (flip and stride[0] != stride[1]):
        return False
    krsc = is_channels_last(w) or (w.shape[2] == w.shape[3] == 1 and w.flags.c_contiguous)   # 1x1: one memory order
    if not (is_channels_last(x) and krsc):
        return False
    cin, kh, kw = int(w.shape[0] if flip else w.shape[1]), int(w.shape[2]), int(w.shape[3])
    geo = geometry(x.shape, w.shape, padding, flip, stride)
    return ((cin % 16 == 0 or not flip) and 0 <= geo["PH"] < kh and 0 <= geo["PW"] < kw and geo["HO"] > 0
            and geo["WO"] > 0 and _smem_bytes(geo, 1, 8, x.dtype.itemsize) <= smem_budget(x.dtype.itemsize)
            and x.size < 2**31)


def _kernel_dtype(dtype: str) -> bool:
    """bf16 always; float32 as TF32 only where float32 convolutions may round like that (as cuDNN's do then)."""
    return dtype == "bfloat16" or (dtype == "float32" and backends.allow_tf32)


@dataclass(frozen=True)
class ChannelStats:
    """Batch norm's partial statistics of a convolution's output y, made by the convolution's epilogue: the mean and
    the sum of squared deviations (M2) of channel c over split s (`chunk` values of y: a block's tile) at
    part_mean / part_m2[c * splits + s] (float32)."""
    y: object
    part_mean: object
    part_m2: object
    splits: int
    chunk: int


_unused: dict = {}


def _no_stats(y):
    """A float32 array for part_mean / part_m2 of a launch without STATS (never touched)."""
    if isinstance(y, np.ndarray):
        return np.empty(1, np.float32)
    key = y.device.id
    if key not in _unused:
        _unused[key] = cuda.cupy().empty(1, np.float32)
    return _unused[key]


def makes_stats(plan: FpropPlan) -> bool:
    """Whether `plan` can make batch norm's partial statistics: a forward whose tiles are whole (HO a multiple of R)
    and whose warps and channels fit the shared sums (STATS_SLOTS)."""
    c = plan.consts
    return (not c["FLIP"] and c["HO"] % c["R"] == 0 and c["WARPS"] * c["BN"] <= STATS_SLOTS
            and c["BN"] <= STATS_SLOTS // 4)


def channel_stats_for(plan: FpropPlan, y) -> ChannelStats | None:
    """Buffers for the statistics of y that `plan` makes (None where it cannot: makes_stats)."""
    c = plan.consts
    if not makes_stats(plan):
        return None
    xp = np if isinstance(y, np.ndarray) else cuda.cupy()
    splits = plan.grid[0]
    return ChannelStats(y, xp.empty(c["COUT"] * splits, xp.float32), xp.empty(c["COUT"] * splits, xp.float32),
                        splits, c["R"] * c["WO"])


def launch(plan: FpropPlan, x, w, y, simulate: bool = False, stats: ChannelStats | None = None) -> None:
    """y (channels-last, x's dtype, written) = the convolution of x by w on the current stream (or in the
    simulator); stats (from channel_stats_for): their partials written too."""
    kern = KERNELS[str(x.dtype)].simulate if simulate else KERNELS[str(x.dtype)]
    parts = (stats.part_mean, stats.part_m2) if stats is not None else (_no_stats(y),) * 2
    kern[plan.grid, plan.threads, plan.smem](flat_view(x, True), flat_view(w, True), flat_view(y, True), *parts,
                                             **plan.consts, STATS=int(stats is not None))


def conv2d_forward_gpu(x, w, padding, out, tiles: dict | None = None, simulate: bool = False, flip: bool = False,
                       stride=(1, 1)):
    """The convolution (with `stride`) of channels-last x by channels-last w (both bf16, or both float32: TF32) into
    `out` (channels-last, their dtype, the output's shape); tiles: a plan's choices (default: what `choose`
    remembered, else the default plan). flip: the input gradient of the convolution by w with `padding` and `stride`
    instead, from x = dy, into out (x's original shape)."""
    return conv2d_forward_gpu_stats(x, w, padding, out, tiles, simulate, flip, stride, stats=False)[0]


def conv2d_forward_gpu_stats(x, w, padding, out, tiles: dict | None = None, simulate: bool = False,
                             flip: bool = False, stride=(1, 1), stats: bool = True) -> tuple:
    """conv2d_forward_gpu, returning (out, ChannelStats of out or None): stats (a forward only) asks for batch norm's
    partial statistics of out from the epilogue, made where the plan's tiles allow (channel_stats_for)."""
    geo = geometry(x.shape, w.shape, padding, flip, stride, out.shape[2:])
    if tiles is None and not simulate:
        hit = _choices.load().get(_key(x, w, padding, flip, stride, out.shape[2:]))
        tiles = hit.get("tiles") if hit else None
    plan = fprop_plan(geo, int(x.shape[0]), flip=flip, item=x.dtype.itemsize, **(tiles or {}))
    made = channel_stats_for(plan, out) if stats and not flip else None
    launch(plan, x, w, out, simulate=simulate, stats=made)
    return out, made


# ------------------------------------------------------------------ choosing between ours and cuDNN, remembered
_choices = RememberedTable("conv_fprop.json")   # next to cuDNN's tuned plans
stats = {"choices": 0, "choose_seconds": 0.0}  # shapes decided, seconds spent (compiles and timings)


def _key(x, w, padding, flip: bool = False, stride=(1, 1), out_hw=None) -> str:
    strided = [[int(s) for s in stride]] if tuple(stride) != (1, 1) else []
    strided += [[int(a) for a in out_hw]] if flip and strided else []   # dx of a strided convolution: its size
    return json.dumps([list(x.shape), list(w.shape), [int(p) for p in padding], str(x.dtype)] + strided
                      + (["dgrad"] if flip else []))


def _candidate_specs(geo: dict, n: int, tile_choices: list, flip: bool, dtype, with_stats: bool = False) -> list:
    """The kernel specializations of the candidates, queued on the background compile threads."""
    arch = device_arch()
    item, kern = dtype.itemsize, KERNELS[str(dtype)]
    plans = [fprop_plan(geo, n, flip=flip, item=item, **t) for t in tile_choices]
    specs = [kern.specialize(**p.consts, STATS=int(with_stats and makes_stats(p))) for p in plans]
    for spec in specs:
        spec.prefetch(arch)
    return specs


def _compile_side_by_side(geo: dict, n: int, tile_choices: list, flip: bool, dtype, with_stats: bool = False) -> None:
    """Compile the candidates on the background compile threads, all at once, before they are timed."""
    arch = device_arch()
    for spec in _candidate_specs(geo, n, tile_choices, flip, dtype, with_stats):
        spec.cubin(arch)


def choose(x, w, padding, cudnn_fn, flip: bool = False, stride=(1, 1), out_hw=None, with_stats: bool = False) -> bool:
    """True when our kernel is faster than cuDNN's forward (or, flip, input gradient into an out_hw dx) at this shape
    (cudnn_fn() runs cuDNN's plan): every candidate of ours (compiled side by side, written into a scratch output;
    with_stats: making batch norm's partial statistics too, as it will run, and credited with what that saves batch
    norm, STATS_SAVING_US) against cuDNN, once per shape, remembered (conv_common.faster_than_cudnn). A shape's first
    ask only queues the candidates' compiles (cuDNN runs that call) and the next one decides: a step's shapes then
    compile side by side, while the rest of its first call runs."""
    with_stats = with_stats and not flip

    def candidates() -> tuple:
        geo = geometry(x.shape, w.shape, padding, flip, stride, out_hw)
        return geo, candidate_tiles(geo, int(x.shape[0]), flip, x.dtype.itemsize)

    def time_ours():
        geo, tile_choices = candidates()
        out = empty_like_format((int(x.shape[0]), geo["COUT"], geo["YH"], geo["YW"]), x)
        _compile_side_by_side(geo, int(x.shape[0]), tile_choices, flip, x.dtype, with_stats)

        def credit(t):
            plan = fprop_plan(geo, int(x.shape[0]), item=x.dtype.itemsize, **t)
            return STATS_SAVING_US if with_stats and makes_stats(plan) else 0.0
        return min(((cuda.graph_time_us(lambda: conv2d_forward_gpu_stats(x, w, padding, out, tiles=t, flip=flip,
                                                                          stride=stride, stats=with_stats))
                     - credit(t), t) for t in tile_choices), key=lambda timed: timed[0])

    def prefetch():
        geo, tile_choices = candidates()
        _candidate_specs(geo, int(x.shape[0]), tile_choices, flip, x.dtype, with_stats)
    return faster_than_cudnn(_choices, _key(x, w, padding, flip, stride, out_hw), time_ours, cudnn_fn, stats,
                             prefetch)


def prefetch_input_gradient(y, w, stride, padding, dilation, x_shape) -> None:
    """Start compiling the input-gradient candidates of this shape on the background compile threads, where `choose`
    has not decided it: conv2d's forward calls it (y standing in for dy: its shape, dtype and layout), so that the
    backward finds them compiled, the shapes' compiles overlapping the forward pass. Seen calls return at once."""
    seen = (y.shape, y.strides, str(y.dtype), w.shape, w.strides, tuple(padding), tuple(stride), tuple(dilation),
            tuple(x_shape))
    if seen in _looked_at or capturing():
        return
    _looked_at.add(seen)
    if not supported(y, w, stride, padding, dilation, 1, flip=True):
        return
    if _key(y, w, padding, True, stride, x_shape[2:]) in _choices.load():
        return
    arch, n = device_arch(), int(y.shape[0])
    geo = geometry(y.shape, w.shape, padding, True, stride, x_shape[2:])
    for t in candidate_tiles(geo, n, True, y.dtype.itemsize):
        KERNELS[str(y.dtype)].specialize(**fprop_plan(geo, n, flip=True, item=y.dtype.itemsize, **t).consts,
                                         STATS=0).prefetch(arch)


_looked_at: set = set()  # the calls prefetch_input_gradient has looked at: queued or not needed
