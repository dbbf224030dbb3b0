"""Our own convolution weight-gradient kernels (float32 or bf16 operands, float32 sums and dW; split-K over many
blocks, then a fixed-order sum) for the small shapes where cuDNN's weight gradient is slow, and `choose`, which times
them against cuDNN per shape."""

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from frost import backends
from frost.accel import conv_wgrad_mma
from frost.accel.conv_common import FINAL_WARPS, SplitPlan, capturing, faster_than_cudnn, sum_splits
from frost.autograd import defer_gradient_completion
from frost.backend import cuda
from frost.backend.remembered import RememberedTable
from frost.kernel import (Array, Const, bf16, bx, by, bz, cdiv, dynamic_shared, f32, i32, kernel, launch_bounds, local,
                          shared, static_range, syncthreads, tx)
from frost.kernel.compile import device_arch, has_mma, multiprocessor_count
from frost.layout import empty_like_format, flat_view, is_channels_last
from frost.ops.conv import int_pair

# dW[co, ci, kh, kw] = sum over (n, ho, wo) of dy[n, co, ho, wo] * x[n, ci, ho*SH + kh - PH, wo*SW + kw - PW]: a GEMM
# with M = Cout, N = Cin*KH*KW small and K = n*Ho*Wo huge. K is cut into chunks (one image, R output rows, WT
# output columns); block (s, m, c) of the partial kernel sums chunks s*cpb ... (s+1)*cpb - 1 for the output tile
# (BM output channels, BC input channels, every tap). Per chunk the block stages dy's rows and the x rows they need
# (with the halo, zero outside x) in shared memory; each thread then owns TM output channels x TC input channels x
# all KH*KW taps in registers, walks the chunk's rows (position group p takes rows p, p + P, ...) and slides a
# KH x KW window of x along each row, so that one new x value per tap row and TM dy values feed TM*TC*KH*KW FFMAs.
# The P position groups' sums meet in shared memory (fixed order) and the block writes one partial; a second
# kernel sums the S partials of each output in a fixed order: deterministic, no float atomics.
# Layouts (compile-time flags): x and dy both NCHW or both channels-last (NHWC memory; the staging loops then take
# channels fastest across threads, so reads stay coalesced), dW in KCRS or channels-last KRSC memory; the shared
# memory tiles and the FFMA loop are the same for all, so every layout gives bit-identical sums.

MAX_SMEM = 48 * 1024    # bytes of shared memory a partial block may use (more would cost resident blocks)


def _partial_kernel(T):
    """The partial kernel for operands (x, dy) of element type T (f32, or bf16 under autocast: loads convert to
    f32, the staging tiles, sums and partials are f32 for every T)."""
    @kernel
    def conv_wgrad_partial(x: Array[T], dy: Array[T], part: Array[f32], chunks_per_block: i32, total_chunks: i32,
                           CIN: Const[int], COUT: Const[int], H: Const[int], W: Const[int], HO: Const[int],
                           WO: Const[int], KH: Const[int], KW: Const[int], SH: Const[int], SW: Const[int],
                           PH: Const[int], PW: Const[int], TM: Const[int], TC: Const[int], BM: Const[int],
                           BC: Const[int], P: Const[int], RP: Const[int], WT: Const[int], NHWC: Const[int] = 0,
                           KRSC: Const[int] = 0):
        """Block (s, m, c): the partial weight gradient of output channels m*BM.., input channels c*BC.. over
        chunks s*chunks_per_block ..., written to part[s * Cout*Cin*KH*KW + flat output index].

        NHWC: x and dy are channels-last (NHWC memory) instead of NCHW. KRSC: the flat output index is that of
        channels-last weights, ((co * KH + kh) * KW + kw) * CIN + ci, instead of KCRS ((co * CIN + ci) * KH + kh) * KW
        + kw."""
        G: Const[int] = BM // TM                 # output-channel groups (threads along M)
        GC: Const[int] = BC // TC                # input-channel groups (threads along N)
        TPT: Const[int] = G * GC                 # threads of one position group
        R: Const[int] = P * RP                   # output rows per chunk
        XR: Const[int] = (R - 1) * SH + KH       # x rows a chunk needs
        XC: Const[int] = (WT - 1) * SW + KW      # x columns a chunk needs
        XPLANE: Const[int] = XR * XC + 1 - XR * XC % 2   # odd plane strides: the planes a warp reads fall in
        DPLANE: Const[int] = R * WT + 1 - R * WT % 2     # different banks
        COL_TILES: Const[int] = cdiv(WO, WT)
        TILES: Const[int] = cdiv(HO, R) * COL_TILES      # chunks per image
        DS_OFFSET: Const[int] = cdiv(BC * XPLANE * 4, 16) * 16
        A: Const[int] = TM * TC * KH * KW        # accumulators per thread
        RED: Const[int] = max(P - 1, 1) * TPT * A
        OUT: Const[int] = COUT * CIN * KH * KW
        # element strides of x (per image, channel, row, column), of dy, and of the output (per channel, tap row, tap)
        X_C: Const[int] = NHWC + (1 - NHWC) * H * W
        X_W: Const[int] = NHWC * CIN + 1 - NHWC
        DY_C: Const[int] = NHWC + (1 - NHWC) * HO * WO
        DY_W: Const[int] = NHWC * COUT + 1 - NHWC
        O_C: Const[int] = KRSC + (1 - KRSC) * KH * KW
        O_KW: Const[int] = KRSC * CIN + 1 - KRSC
        launch_bounds(TPT * P)
        xs = dynamic_shared(f32, (BC, XPLANE))
        ds = dynamic_shared(f32, (BM, DPLANE), DS_OFFSET)
        red = dynamic_shared(f32, RED)           # the position groups' sums, over the staging buffers at the end
        tl = tx % TPT
        cg = tl % G
        cl = tl // G
        p = tx // TPT
        co0 = by * BM
        ci0 = bz * BC
        acc = local(f32, (TM, TC, KH, KW))
        win = local(f32, (TC, KH, KW))
        d = local(f32, TM)
        for i in static_range(TM):
            for j in static_range(TC):
                for kh in static_range(KH):
                    for kw in static_range(KW):
                        acc[i, j, kh, kw] = 0.0
        first = bx * chunks_per_block
        last = min(first + chunks_per_block, total_chunks)
        for chunk in range(first, last):
            img = chunk // TILES
            tile = chunk % TILES
            ho0 = tile // COL_TILES * R
            wo0 = tile % COL_TILES * WT
            hi0 = ho0 * SH - PH
            wi0 = wo0 * SW - PW
            syncthreads()   # every thread is done with the previous chunk
            for e in range(tx, BC * XR * XC, TPT * P):   # NHWC: channels fastest across threads (coalesced reads)
                c = e % BC if NHWC else e // (XR * XC)
                rc = e // BC if NHWC else e % (XR * XC)
                hi = hi0 + rc // XC
                wi = wi0 + rc % XC
                v = 0.0
                if ci0 + c < CIN and hi >= 0 and hi < H and wi >= 0 and wi < W:
                    v = f32(x[img * (CIN * H * W) + (ci0 + c) * X_C + (hi * W + wi) * X_W])
                xs[c, rc] = v
            for e in range(tx, BM * R * WT, TPT * P):
                m = e % BM if NHWC else e // (R * WT)
                rc = e // BM if NHWC else e % (R * WT)
                ho = ho0 + rc // WT
                wo = wo0 + rc % WT
                v = 0.0
                if co0 + m < COUT and ho < HO and wo < WO:
                    v = f32(dy[img * (COUT * HO * WO) + (co0 + m) * DY_C + (ho * WO + wo) * DY_W])
                ds[m, rc] = v
            syncthreads()
            for rr in range(RP):
                r = rr * P + p
                for col in static_range(WT):
                    for j in static_range(TC):
                        for kh in static_range(KH):
                            for kw in static_range(KW):
                                if col > 0 and kw + SW < KW:   # still in the window: slide it
                                    win[j, kh, kw] = win[j, kh, min(kw + SW, KW - 1)]
                                else:
                                    win[j, kh, kw] = xs[cl + j * GC, (r * SH + kh) * XC + col * SW + kw]
                    for i in static_range(TM):
                        d[i] = ds[cg + i * G, r * WT + col]
                    for i in static_range(TM):
                        for j in static_range(TC):
                            for kh in static_range(KH):
                                for kw in static_range(KW):
                                    acc[i, j, kh, kw] += d[i] * win[j, kh, kw]
        if P > 1:
            syncthreads()   # the staging buffers become `red`
            if p > 0:
                for i in static_range(TM):
                    for j in static_range(TC):
                        for kh in static_range(KH):
                            for kw in static_range(KW):
                                red[((p - 1) * A + ((i * TC + j) * KH + kh) * KW + kw) * TPT + tl] = acc[i, j, kh, kw]
            syncthreads()
            if p == 0:
                for q in range(P - 1):
                    for i in static_range(TM):
                        for j in static_range(TC):
                            for kh in static_range(KH):
                                for kw in static_range(KW):
                                    acc[i, j, kh, kw] += red[(q * A + ((i * TC + j) * KH + kh) * KW + kw) * TPT + tl]
        if p == 0:
            for i in static_range(TM):
                co = co0 + cg + i * G
                for j in static_range(TC):
                    ci = ci0 + cl + j * GC
                    if co < COUT and ci < CIN:
                        for kh in static_range(KH):
                            for kw in static_range(KW):
                                part[bx * OUT + co * (CIN * KH * KW) + ci * O_C + (kh * KW + kw) * O_KW] = acc[
                                    i, j, kh, kw]
    return conv_wgrad_partial


# the partial kernel by operand dtype name (str(x.dtype))
PARTIAL = {"float32": _partial_kernel(f32), "bfloat16": _partial_kernel(bf16)}
conv_wgrad_partial = PARTIAL["float32"]


@kernel.warm
@kernel
def conv_wgrad_finalize(part: Array[f32], out: Array[f32], n_out: i32, splits: i32):
    """out[o] = sum over s of part[s * n_out + o], for outputs 32b .. 32b + 31 of block b (see sum_splits)."""
    sums = shared(f32, (FINAL_WARPS, 32))
    sum_splits(part, out, sums, n_out, splits, bx, FINAL_WARPS)


# ------------------------------------------------------------------ launch plans
@dataclass(frozen=True)
class Plan(SplitPlan):
    """A launch of the FFMA partial kernel for one convolution geometry: tiles of output and input channels."""
    tiles_m: int = 1
    tiles_c: int = 1

    @property
    def grid(self) -> tuple:
        return (self.splits, self.tiles_m, self.tiles_c)

    def tiles(self) -> dict:
        """The tile choices alone (what `choose` remembers)."""
        return {k: self.consts[k] for k in TILE_KEYS} | {"splits": self.splits}

    def kernel(self, dtype: str):
        return PARTIAL[dtype]

    def specialization(self, nhwc: bool, krsc: bool) -> dict:
        return dict(self.consts, NHWC=int(nhwc), KRSC=int(krsc))


TILE_KEYS = ("TM", "TC", "BM", "BC", "P", "RP", "WT")


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _smem_bytes(BM, BC, TM, TC, P, RP, WT, KH, KW, SH, SW) -> int:
    R = P * RP
    xr, xc = (R - 1) * SH + KH, (WT - 1) * SW + KW
    xplane = xr * xc + 1 - xr * xc % 2
    dplane = R * WT + 1 - R * WT % 2
    staging = -(-BC * xplane * 4 // 16) * 16 + BM * dplane * 4
    tpt = (BM // TM) * (BC // TC)
    reduction = (P - 1) * tpt * TM * TC * KH * KW * 4
    return max(staging, reduction)


def geometry(g_shape: tuple, x_shape: tuple, w_shape: tuple, stride, padding) -> dict:
    """The Const values of the shape (CIN, COUT, H, W, HO, WO, KH, KW, SH, SW, PH, PW), checked."""
    if len(x_shape) != 4 or len(w_shape) != 4 or len(g_shape) != 4:
        raise ValueError(f"conv2d_backward_weight_gpu: expected 4-D x, w and dy, got x {tuple(x_shape)}, "
                         f"w {tuple(w_shape)}, dy {tuple(g_shape)}")
    n, cin, h, w = (int(a) for a in x_shape)
    cout, wcin, kh, kw = (int(a) for a in w_shape)
    (sh, sw), (ph, pw) = int_pair(stride, "stride"), int_pair(padding, "padding")
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    if wcin != cin or tuple(g_shape) != (n, cout, ho, wo) or min(sh, sw, kh, kw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"conv2d_backward_weight_gpu: dy of shape {tuple(g_shape)} does not fit x {tuple(x_shape)}, "
                         f"weight {tuple(w_shape)}, stride {(sh, sw)}, padding {(ph, pw)} (expected dy of shape "
                         f"{(n, cout, ho, wo)})")
    if n * max(cin, cout) * max(h * w, ho * wo) >= 2**31:
        raise ValueError(f"conv2d_backward_weight_gpu: x {tuple(x_shape)} is too large for 32-bit indices")
    return dict(CIN=cin, COUT=cout, H=h, W=w, HO=ho, WO=wo, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw)


def make_plan(geo: dict, n: int, TM: int | None = None, TC: int | None = None, BM: int | None = None,
              BC: int | None = None, P: int | None = None, RP: int | None = None, WT: int | None = None,
              blocks: int = 264, splits: int | None = None) -> Plan:
    """A launch plan; tiles not given are chosen for about `blocks` blocks of at most 256 threads and 48 KiB."""
    cin, cout, ho, wo = geo["CIN"], geo["COUT"], geo["HO"], geo["WO"]
    taps = geo["KH"] * geo["KW"]
    TC = TC or (1 if taps > 1 else min(4, cin))
    TM = TM or max(1, min(8, cout, 36 // (TC * taps)))
    BM = BM or TM * cdiv(min(cout, 64), TM)
    G = BM // TM
    BC = BC or TC * min(cdiv(cin, TC), max(1, 128 // G))
    GC = BC // TC
    if BM % TM or BC % TC or G * GC > 1024:
        raise ValueError(f"conv2d_backward_weight_gpu: tiles BM={BM}, BC={BC} must be multiples of TM={TM}, "
                         f"TC={TC} with at most 1024 threads")
    tpt = G * GC
    WT = WT or min(wo, 32)
    P = P or min(_pow2_at_most(max(1, 256 // tpt)), _pow2_at_most(ho))
    RP = RP or max(1, min(cdiv(ho, P), 64 // (P * WT)))
    size = dict(KH=geo["KH"], KW=geo["KW"], SH=geo["SH"], SW=geo["SW"])
    while _smem_bytes(BM, BC, TM, TC, P, RP, WT, **size) > MAX_SMEM and (RP > 1 or P > 1 or WT > 1):
        if RP > 1:
            RP //= 2
        elif P > 1:
            P //= 2
        else:
            WT = cdiv(WT, 2)
    threads = tpt * P
    if threads > 1024:
        raise ValueError(f"conv2d_backward_weight_gpu: {threads} threads per block (at most 1024)")
    total = n * cdiv(ho, P * RP) * cdiv(wo, WT)
    tiles_m, tiles_c = cdiv(cout, BM), cdiv(cin, BC)
    S = splits or max(1, min(total, blocks // (tiles_m * tiles_c)))
    cpb = cdiv(total, S)
    S = cdiv(total, cpb)
    consts = dict(geo, TM=TM, TC=TC, BM=BM, BC=BC, P=P, RP=RP, WT=WT)
    return Plan(consts, S, cpb, total, threads, _smem_bytes(BM, BC, TM, TC, P, RP, WT, **size), tiles_m, tiles_c)


# ------------------------------------------------------------------ memory layouts
def _nhwc_dense(a) -> bool:
    """Whether a 4-D array's memory is a C-contiguous (N, H, W, C) array (channels-last, or both layouts at once)."""
    return a.ndim == 4 and a.transpose(0, 2, 3, 1).flags.c_contiguous


def input_layout(g, x) -> str | None:
    """"nchw" when dy and x are both C-contiguous, "nhwc" when both have channels-last memory, else None (mixed or
    strided: not handled). Arrays dense in both layouts (C == 1, or H == W == 1) go with the other one."""
    if g.flags.c_contiguous and x.flags.c_contiguous:
        return "nchw"
    if _nhwc_dense(g) and _nhwc_dense(x):
        return "nhwc"
    return None


def launch(plan: SplitPlan, g, x, out, part=None, simulate: bool = False, defer: bool = False) -> None:
    """Run the partial kernel (straight into `out` when there is one split) and the finalize kernel.

    g, x: float32 arrays, both C-contiguous (NCHW) or both channels-last (NHWC memory); out: float32, C-contiguous
    (KCRS) or channels-last (KRSC memory); CuPy arrays, or NumPy with simulate=True. part: scratch of
    splits * n_out floats in out's flat order (made here when None and there is more than one split).

    defer (inside backward(), `out` a claimed .grad buffer): a kernel that can carry a finalize (plan.carries) leaves
    its own to the next such launch, which sums those partials in extra blocks (one launch fewer per convolution),
    and carries the one left before it; autograd completes what is left before anything reads a gradient.
    FROST_CONV_WGRAD_CARRY=0 (read at each call) turns the carrying off."""
    layout = input_layout(g, x)
    if layout is None or not (out.flags.c_contiguous or is_channels_last(out)):
        raise ValueError(f"conv2d_backward_weight_gpu: unsupported memory layouts: dy strides {g.strides}, "
                         f"x strides {x.strides}, out strides {out.strides}")
    nhwc, krsc = layout == "nhwc", is_channels_last(out)
    xp = np if simulate else _cupy()
    kern = plan.kernel(str(x.dtype))
    partial = kern.simulate if simulate else kern
    flat_out = flat_view(out, krsc)
    if plan.splits == 1:
        part = flat_out
    elif part is None:
        part = xp.empty(plan.splits * plan.n_out, dtype=xp.float32)
    defer = defer and plan.carries and os.environ.get("FROST_CONV_WGRAD_CARRY", "1") != "0"
    carried = _take_pending(part) if defer else None
    grid, extra = plan.launch_args(part, carried)
    partial[grid, plan.threads, plan.smem](flat_view(x, nhwc), flat_view(g, nhwc), part, plan.chunks_per_block,
                                           plan.total_chunks, *extra, **plan.specialization(nhwc, krsc))
    if plan.splits > 1:
        pending = PendingFinalize(part, flat_out, plan.n_out, plan.splits, simulate)
        if defer:
            _pending().append(pending)
            defer_gradient_completion(finalize_pending)
        else:
            pending.run()


@dataclass
class PendingFinalize:
    """A weight gradient's partials (splits x n_out floats) still to be summed into out (flat)."""
    part: Any
    out: Any
    n_out: int
    splits: int
    simulate: bool

    def run(self) -> None:
        finalize = conv_wgrad_finalize.simulate if self.simulate else conv_wgrad_finalize
        finalize[cdiv(self.n_out, 32), 32 * FINAL_WARPS](self.part, self.out, self.n_out, self.splits)


def finalize_pending() -> None:
    """Sum every partial left by deferred launches on this thread (autograd calls it before reading gradients)."""
    pending = _pending()
    while pending:
        pending.pop(0).run()


def _take_pending(part) -> "PendingFinalize | None":
    """The finalize the last deferred launch left, for the launch about to run to carry: only one on the same device
    (`part`'s array module and device); whatever else is left runs now, in a launch of its own."""
    pending = _pending()
    carried = pending.pop() if pending and _same_place(pending[-1].part, part) else None
    finalize_pending()
    return carried


def _same_place(a, b) -> bool:
    return type(a) is type(b) and getattr(a, "device", None) == getattr(b, "device", None)


_local = threading.local()


def _pending() -> list:
    if not hasattr(_local, "pending"):
        _local.pending = []
    return _local.pending


# ------------------------------------------------------------------ the entry point on CuPy arrays
def _cupy():
    return cuda.cupy()


def _check_arrays(g, x, out, w_shape) -> None:
    if str(g.dtype) != str(x.dtype) or str(x.dtype) not in PARTIAL:
        raise TypeError(f"conv2d_backward_weight_gpu: dy and x must both be float32 or both bfloat16 arrays, got dy "
                        f"{g.dtype} and x {x.dtype}")
    if len(g.shape) == 4 and len(x.shape) == 4 and input_layout(g, x) is None:
        raise ValueError(f"conv2d_backward_weight_gpu: dy and x must both be C-contiguous (NCHW) or both "
                         f"channels-last (NHWC memory), got dy {tuple(g.shape)} with strides {g.strides} and x "
                         f"{tuple(x.shape)} with strides {x.strides}")
    if out is not None and (tuple(out.shape) != tuple(w_shape) or str(out.dtype) != "float32"
                            or not (out.flags.c_contiguous or is_channels_last(out))):
        raise ValueError(f"conv2d_backward_weight_gpu: out must be a float32 array of shape {tuple(w_shape)}, "
                         f"C-contiguous or channels-last, got {out.dtype} {tuple(out.shape)} with strides "
                         f"{out.strides}")


def plan_for(g, x, w_shape, stride, padding, tiles: dict | None = None, sms: int | None = None) -> SplitPlan:
    """The plan `choose` remembered for this shape, else `tiles`, else the default one (for `sms` SMs: the
    current GPU's when None). Tiles with "kernel": "mma" make a plan of the tensor-core kernel (conv_wgrad_mma)."""
    geo = geometry(g.shape, x.shape, w_shape, stride, padding)
    if tiles is None:
        hit = _choices.load().get(_key(g, x, w_shape, stride, padding))
        tiles = hit.get("tiles") if hit else None
    if sms is None:
        sms = multiprocessor_count(_cupy().cuda.runtime.getDevice())
    tiles = {"blocks": 2 * sms} | (tiles or {})
    if tiles.pop("kernel", None) == "mma":
        return conv_wgrad_mma.mma_plan(geo, int(x.shape[0]), item=x.dtype.itemsize, **tiles)
    return make_plan(geo, int(x.shape[0]), **tiles)


def conv2d_backward_weight_gpu(g, x, w_shape: tuple, stride, padding, out=None, tiles: dict | None = None,
                               simulate: bool = False, defer: bool = False) -> Any:
    """dW (float32) of a convolution (groups 1, dilation 1) from dy `g` and input `x` (CuPy arrays, both float32 or
    both bf16, both NCHW or both channels-last), on the current stream, written into `out` (w_shape, C-contiguous or
    channels-last) when given, else into a new array in x's memory format; returns out. No host sync: capturable.

    tiles: a launch plan's tile choices (make_plan's keywords; default: what `choose` remembered, else
    make_plan's). simulate=True runs the same launches in the kernel simulator on NumPy arrays (for tests). defer:
    inside backward(), into a claimed .grad buffer, the last sum may ride with the next launch (see `launch`)."""
    _check_arrays(g, x, out, w_shape)
    if simulate:   # a small pretend GPU, and never the tiles remembered for the real one
        plan = plan_for(g, x, w_shape, stride, padding, tiles or {}, sms=2)
    else:
        plan = plan_for(g, x, w_shape, stride, padding, tiles)
    xp = np if simulate else _cupy()
    if out is None:
        out = empty_like_format(tuple(w_shape), x, dtype=xp.float32)
    launch(plan, g, x, out, simulate=simulate, defer=defer)
    return out


def supported(g, x, w_shape, stride, padding, dilation=1, groups: int = 1) -> bool:
    """True when conv2d_backward_weight_gpu handles this call (dy and x both float32 or both bf16, groups 1,
    dilation 1, dy and x both C-contiguous or both channels-last)."""
    if groups != 1 or int_pair(dilation, "dilation") != (1, 1):
        return False
    if str(g.dtype) != str(x.dtype) or str(x.dtype) not in PARTIAL:
        return False
    if len(g.shape) != 4 or len(x.shape) != 4 or input_layout(g, x) is None:
        return False
    try:
        geometry(g.shape, x.shape, w_shape, stride, padding)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ choosing between ours and cuDNN, remembered
_choices = RememberedTable("conv_wgrad.json")  # next to cuDNN's tuned plans
# what a start-up spends choosing (read by benchmarks/step_time.py): shapes decided, seconds (compiles and timings)
stats = {"choices": 0, "choose_seconds": 0.0}


# 2: the tensor-core kernel joined the candidates, 3: its TF32 twin (older choices are not reused)
CANDIDATES_VERSION = 3


def _key(g, x, w_shape, stride, padding) -> str:
    return json.dumps([CANDIDATES_VERSION, list(g.shape), list(x.shape), list(w_shape),
                       list(int_pair(stride, "stride")), list(int_pair(padding, "padding")), str(x.dtype),
                       input_layout(g, x), backends.allow_tf32, backends.deterministic])


def _candidate_specs(g, x, w_shape, stride, padding, tile_choices: list, out) -> list:
    """The partial kernel's specializations for the candidates (dy and x layouts, dW's layout from out)."""
    nhwc, krsc = input_layout(g, x) == "nhwc", is_channels_last(out)
    plans = [plan_for(g, x, w_shape, stride, padding, tiles) for tiles in tile_choices]
    return [plan.kernel(str(x.dtype)).specialize(**plan.specialization(nhwc, krsc)) for plan in plans]


def prefetch(g, x, w_shape, stride, padding, dilation=1, *, out) -> None:
    """Start compiling the candidates of a shape that `choose` has not decided yet on the background compile
    threads: conv2d's forward pass calls it (with its output standing in for dy, which has its shape, dtype and
    layout), so that the backward's `choose` finds them compiled, all shapes' compiles overlapping (a cold start-up
    compiles some thirty of these unrolled kernels). A call it has seen before returns at once: it runs in every
    eager forward."""
    seen = (g.shape, g.strides, x.shape, x.strides, str(x.dtype), tuple(w_shape), stride, padding, dilation,
            backends.allow_tf32, backends.deterministic)
    if seen in _looked_at or capturing():
        return
    _looked_at.add(seen)
    if not supported(g, x, w_shape, stride, padding, dilation):
        return
    if _key(g, x, w_shape, stride, padding) in _choices.load():  # decided (this process or a remembered run)
        return
    arch = device_arch()
    for spec in _candidate_specs(g, x, w_shape, stride, padding, candidates(g, x, w_shape, stride, padding), out):
        spec.prefetch(arch)


_looked_at: set = set()  # the calls prefetch has looked at (shapes, strides, dtype, switches): queued or not needed


def _compile_side_by_side(g, x, w_shape, stride, padding, tile_choices: list, out) -> None:
    """Compile the candidates' partial kernels (those prefetch queued, the others queued now) before they are timed,
    the compiles overlapping on the background threads."""
    arch = device_arch()
    specs = _candidate_specs(g, x, w_shape, stride, padding, tile_choices, out)
    for spec in specs:
        spec.prefetch(arch)
    for spec in specs:
        spec.cubin(arch)


def candidates(g, x, w_shape, stride, padding) -> list[dict]:
    """Tile choices `choose` times at this shape on the current GPU: the tensor-core kernel's for channels-last
    operands it supports, bf16 or float32 with TF32 allowed (on the H200 they beat the FFMA kernel's at every seed
    shape, bf16 by about 2x, TF32 by 1.6x per step, so those are not compiled and timed too) on a GPU that has
    them (Ampere or newer), else the FFMA kernel's."""
    geo = geometry(g.shape, x.shape, w_shape, stride, padding)
    sms = multiprocessor_count(_cupy().cuda.runtime.getDevice())
    tensor_cores = str(x.dtype) == "bfloat16" or (str(x.dtype) == "float32" and backends.allow_tf32)
    if tensor_cores and input_layout(g, x) == "nhwc" and has_mma(x):
        tiles = conv_wgrad_mma.candidate_tiles(geo, int(x.shape[0]), sms, item=x.dtype.itemsize)
        if tiles:
            return tiles
    return candidate_tiles(geo, int(x.shape[0]), sms)


def candidate_tiles(geo: dict, n: int, sms: int) -> list[dict]:
    """The default tiles for `sms` SMs and a few neighbours (fewer or more splits, longer chunks, more output
    channels per thread), deduplicated."""
    base = make_plan(geo, n, blocks=2 * sms).tiles()
    options = [base, make_plan(geo, n, blocks=sms).tiles(), make_plan(geo, n, blocks=4 * sms).tiles(),
               make_plan(geo, n, RP=2 * base["RP"], blocks=2 * sms).tiles(),
               make_plan(geo, n, RP=max(1, base["RP"] // 2), blocks=4 * sms).tiles()]
    if base["TM"] < geo["COUT"]:
        options.append(make_plan(geo, n, TM=2 * base["TM"], blocks=2 * sms).tiles())
    unique = []
    for o in options:
        if o not in unique:
            unique.append(o)
    return unique


def choose(g, x, w_shape, stride, padding, cudnn_fn) -> bool:
    """True when our kernel is faster than cuDNN's weight gradient (cudnn_fn(): runs cuDNN's plan) at this shape.

    Timed once per shape (key: shapes, stride, padding, dtype, memory layout of dy and x, TF32 and determinism
    switches; ours writes into an out in x's memory format), remembered (faster_than_cudnn)."""
    if not supported(g, x, w_shape, stride, padding):
        return False

    def time_ours():
        out = empty_like_format(tuple(w_shape), x, dtype=_cupy().float32)
        tile_choices = candidates(g, x, w_shape, stride, padding)
        _compile_side_by_side(g, x, w_shape, stride, padding, tile_choices, out)
        return min(((cuda.graph_time_us(lambda: conv2d_backward_weight_gpu(g, x, w_shape, stride, padding, out=out,
                                                                           tiles=t)), t) for t in tile_choices),
                   key=lambda timed: timed[0])

    return faster_than_cudnn(_choices, _key(g, x, w_shape, stride, padding), time_ours, cudnn_fn, stats)


def remembered(g, x, w_shape, stride, padding) -> dict | None:
    """What `choose` recorded for this shape (ours, tiles, ours_us, cudnn_us), or None."""
    return _choices.load().get(_key(g, x, w_shape, stride, padding))


def forget() -> None:
    """Drop the in-memory choices (the next `choose` reads the disk cache again); for tests."""
    _choices.forget()
