"""Tensor-core weight gradients of bf16 (or, on TF32, float32) channels-last convolutions (implicit GEMM on mma.sync,
float32 sums): a candidate that conv_wgrad.choose times against its FFMA kernel and cuDNN's plan."""

from dataclasses import dataclass


from frost.accel.conv_common import SplitPlan, sum_splits
from frost.kernel import (Array, Const, bf16, bx, by, cdiv, cp_async16, cp_commit, cp_wait, device, dynamic_shared, f32,
                          gdx, i32, kernel, lane, launch_bounds, ldmatrix_x2_trans, ldmatrix_x4_trans, local, mma,
                          static_range, syncthreads, tx, warp)

# dW[co, (kh, kw, ci)] = sum over pixels k = (n, ho, wo) of dy[k, co] * x[n, ho*SH + kh - PH, wo*SW + kw - PW, ci]: a
# GEMM with M = Cout (16-row mma tiles), N = taps x Cin (8-column tiles: 8 channels of one tap) and K = the pixels. A
# chunk of K is R output rows of one image (R * WO pixels, padded to a multiple of 16 with zero rows of dy). Block (s,
# g) sums chunks s*cpb ... (s+1)*cpb - 1 for the n-tiles g*NTB ... (g+1)*NTB - 1, every m-tile; warp w owns n-tiles w, w
# + WARPS, ... of those. Per chunk the block stages dy's rows as [k][co] and the x pixels the chunk needs (its halo,
# zero outside the image, and one zero row) as [pixel][ci] in shared memory with cp.async, in two buffers: the next
# chunk loads while this one multiplies. ldmatrix.trans (bf16; f32: element loads) reads A (dy transposed) and B,
# each lane naming the row of its own k: B's row for pixel k = (r, wo) and tap (kh, kw) is halo pixel
# (r*SH + kh, wo*SW + kw), so the im2col gather costs nothing. Partials go to part[s] in dW's flat order;
# conv_wgrad's finalize kernel sums them in a fixed order
# (deterministic, no float atomics), or with one split the block writes dW itself.

PAD = 8   # elements after each shared row: 8 consecutive rows an ldmatrix reads (bf16), or the 4 rows x 8 columns of
#           a TF32 fragment's element loads (f32), fall in distinct banks


# The fragments of one k step: bf16 through ldmatrix.trans (16 deep), f32 element by element as the m16n8k8 TF32
# layout says (8 deep: a0 = A[g, t], a1 = A[g + 8, t], a2 = A[g, t + 4], a3 = A[g + 8, t + 4]; b0 = B[t, g],
# b1 = B[t + 4, g]; g = lane // 4, t = lane % 4), A = dy transposed (ds is [k][co]), B = x's halo rows (xs [pixel][ci])

@device
def _a_fragment_bf16(af, ds, ks, i):
    ldmatrix_x4_trans(af, ds, (ks * 16 + lane % 8 + lane // 16 * 8, i * 16 + lane // 8 % 2 * 8))


@device
def _a_fragment_tf32(af, ds, ks, i):
    k = ks * 8 + lane % 4
    co = i * 16 + lane // 4
    af[0] = ds[k, co]
    af[1] = ds[k, co + 8]
    af[2] = ds[k + 4, co]
    af[3] = ds[k + 4, co + 8]


@device
def _halo_row(k, tap, ho0, HO: Const[int], WO: Const[int], KC: Const[int], SH: Const[int], SW: Const[int],
              KW: Const[int], XC: Const[int], ZERO: Const[int]):
    """The xs row that pixel k of the chunk reads for `tap`: halo pixel (r*SH + kh, wo*SW + kw), or the zero row for a
    k past the chunk or the image."""
    if k < KC and ho0 + k // WO < HO:
        return (k // WO * SH + tap // KW) * XC + k % WO * SW + tap % KW
    return ZERO


@device
def _b_fragment_bf16(bf, xs, ks, tap, ci0, ho0, HO: Const[int], WO: Const[int], KC: Const[int], SH: Const[int],
                     SW: Const[int], KW: Const[int], XC: Const[int], ZERO: Const[int]):
    ldmatrix_x2_trans(bf, xs, (_halo_row(ks * 16 + lane % 16, tap, ho0, HO, WO, KC, SH, SW, KW, XC, ZERO), ci0))


@device
def _b_fragment_tf32(bf, xs, ks, tap, ci0, ho0, HO: Const[int], WO: Const[int], KC: Const[int], SH: Const[int],
                     SW: Const[int], KW: Const[int], XC: Const[int], ZERO: Const[int]):
    for h in static_range(2):
        bf[h] = xs[_halo_row(ks * 8 + lane % 4 + 4 * h, tap, ho0, HO, WO, KC, SH, SW, KW, XC, ZERO), ci0 + lane // 4]


def _wgrad_kernel(T):
    """conv_wgrad_mma for dy and x of element type T: bf16 (mma m16n8k16) or f32 (m16n8k8 on TF32)."""
    ITEM = T.np.itemsize
    VEC = 16 // ITEM             # elements per 16-byte copy
    KSTEP = 2 * VEC              # k per mma step
    a_fragment, b_fragment = (_a_fragment_bf16, _b_fragment_bf16) if T is bf16 else (_a_fragment_tf32,
                                                                                        _b_fragment_tf32)

    @kernel
    def conv_wgrad_mma(x: Array[T], dy: Array[T], part: Array[f32], chunks_per_block: i32, total_chunks: i32,
                       fin_part: Array[f32], fin_out: Array[f32], fin_n: i32, fin_splits: i32, groups: i32,
                       CIN: Const[int], COUT: Const[int], H: Const[int], W: Const[int], HO: Const[int],
                       WO: Const[int], KH: Const[int], KW: Const[int], SH: Const[int], SW: Const[int],
                       PH: Const[int], PW: Const[int], R: Const[int], NTB: Const[int], WARPS: Const[int],
                       KRSC: Const[int] = 1):
        """Block (s, g): the partial weight gradient of n-tiles g*NTB ... over chunks s*chunks_per_block ...,
        written to part[s * Cout*Cin*KH*KW + flat output index] (KRSC: channels-last weights ((co*KH + kh)*KW +
        kw)*CIN + ci, else KCRS). x and dy are channels-last (NHWC memory), COUT a multiple of 16; CIN not a
        multiple of 8 (the stem's 3) is padded with zero channels in shared memory.

        Blocks past the first `groups` rows of the grid carry another convolution's finalize instead
        (conv_wgrad.launch with defer): block b of them sums that one's fin_splits partials of outputs 32b .. 32b +
        31 into fin_out (fin_n outputs; conv_wgrad.sum_splits, the same order as its own finalize kernel)."""
        THREADS: Const[int] = WARPS * 32
        XR: Const[int] = (R - 1) * SH + KH           # x rows a chunk needs
        XC: Const[int] = (WO - 1) * SW + KW          # x columns a chunk needs
        ZERO: Const[int] = XR * XC                   # the zero row (B's row for a padding k)
        KC: Const[int] = R * WO                      # pixels of a chunk
        KS: Const[int] = cdiv(KC, 16)                # 16-row blocks of a chunk's pixels
        MT: Const[int] = COUT // 16
        CT: Const[int] = cdiv(CIN, 8)                # n-tiles per tap (8 channels each, zeros past CIN)
        NT: Const[int] = KH * KW * CT
        NTW: Const[int] = cdiv(NTB, WARPS)
        ROW_TILES: Const[int] = cdiv(HO, R)
        OUT: Const[int] = COUT * CIN * KH * KW
        O_C: Const[int] = KRSC + (1 - KRSC) * KH * KW
        O_KW: Const[int] = KRSC * CIN + 1 - KRSC
        launch_bounds(THREADS)
        xs = dynamic_shared(T, (2, ZERO + 1, CT * 8 + PAD))
        ds = dynamic_shared(T, (2, KS * 16, COUT + PAD), 2 * (ZERO + 1) * (CT * 8 + PAD) * ITEM)
        if by >= groups:   # the carried finalize's blocks use the start of xs's memory for their sums
            fin_sums = dynamic_shared(f32, (8, 32))
            sum_splits(fin_part, fin_out, fin_sums, fin_n, fin_splits, (by - groups) * gdx + bx, WARPS)
            return
        acc = local(f32, (MT, NTW, 4))
        af = local(T, (MT, KSTEP // 2))
        bf = local(T, KSTEP // 4)
        for i in static_range(MT):
            for j in static_range(NTW):
                for q in static_range(4):
                    acc[i, j, q] = 0.0
        first = bx * chunks_per_block
        last = min(first + chunks_per_block, total_chunks)
        if first < last:
            _stage(x, dy, xs[0], ds[0], first, CIN, COUT, H, W, HO, WO, SH, PH, PW, R, XR, XC, KS, ROW_TILES,
                   THREADS, VEC)
        cp_commit()
        for chunk in range(first, last):
            if chunk + 1 < last:   # the next chunk loads while this one multiplies
                nb = (chunk + 1 - first) % 2
                _stage(x, dy, xs[nb], ds[nb], chunk + 1, CIN, COUT, H, W, HO, WO, SH, PH, PW, R, XR, XC, KS,
                       ROW_TILES, THREADS, VEC)
            cp_commit()
            cp_wait(1)             # this chunk's copies have landed (for this thread) ...
            syncthreads()          # ... and for every thread
            b = (chunk - first) % 2
            ho0 = chunk % ROW_TILES * R
            for ks in static_range(KS * 16 // KSTEP):
                for i in static_range(MT):
                    a_fragment(af[i], ds[b], ks, i)
                for j in static_range(NTW):
                    jl = warp + j * WARPS
                    nt = by * NTB + jl
                    if jl < NTB and nt < NT:   # the same for the whole warp
                        b_fragment(bf, xs[b], ks, nt // CT, nt % CT * 8, ho0, HO, WO, KC, SH, SW, KW, XC, ZERO)
                        for i in static_range(MT):
                            mma(acc[i, j], af[i], bf)
            syncthreads()          # every warp is done with buffer b before the next iteration reloads it
        g = lane // 4
        t = lane % 4
        for j in static_range(NTW):
            jl = warp + j * WARPS
            nt = by * NTB + jl
            if jl < NTB and nt < NT:
                tap = nt // CT
                for i in static_range(MT):
                    for q in static_range(4):
                        co = i * 16 + g + 8 * (q // 2)
                        ci = nt % CT * 8 + 2 * t + q % 2
                        if ci < CIN:
                            part[bx * OUT + co * (CIN * KH * KW) + ci * O_C + tap * O_KW] = acc[i, j, q]
    return conv_wgrad_mma


@device
def _stage(x, dy, xs, ds, chunk, CIN: Const[int], COUT: Const[int], H: Const[int], W: Const[int], HO: Const[int],
           WO: Const[int], SH: Const[int], PH: Const[int], PW: Const[int], R: Const[int], XR: Const[int],
           XC: Const[int], KS: Const[int], ROW_TILES: Const[int], THREADS: Const[int], VEC: Const[int]):
    """Start copying a chunk's x halo (zeros outside the image and past CIN, then the zero row) into xs and its dy rows
    (zeros past the chunk or the image) into ds, 16 bytes (VEC channels) per cp.async."""
    img = chunk // ROW_TILES
    ho0 = chunk % ROW_TILES * R
    for e in range(tx, (XR * XC + 1) * (cdiv(CIN, 8) * 8 // VEC), THREADS):
        p = e // (cdiv(CIN, 8) * 8 // VEC)
        c = e % (cdiv(CIN, 8) * 8 // VEC) * VEC
        hi = ho0 * SH - PH + p // XC
        wi = p % XC - PW
        inside = p < XR * XC and hi >= 0 and hi < H and wi >= 0 and wi < W
        if inside and CIN % 8 == 0:
            cp_async16(xs, (p, c), x, ((img * H + hi) * W + wi) * CIN + c)
        else:   # zeros outside the image, and the channels past CIN (an element at a time: rows not 16-byte aligned)
            for u in static_range(VEC):
                xs[p, c + u] = f32(x[((img * H + hi) * W + wi) * CIN + c + u]) if inside and c + u < CIN else 0.0
    for e in range(tx, KS * 16 * (COUT // VEC), THREADS):
        k = e // (COUT // VEC)
        c = e % (COUT // VEC) * VEC
        ho = ho0 + k // WO
        if k < R * WO and ho < HO:
            cp_async16(ds, (k, c), dy, ((img * HO + ho) * WO + k % WO) * COUT + c)
        else:
            for u in static_range(VEC):
                ds[k, c + u] = 0.0


KERNELS = {"bfloat16": _wgrad_kernel(bf16), "float32": _wgrad_kernel(f32)}
conv_wgrad_mma = KERNELS["bfloat16"]


MAX_SMEM = 48 * 1024   # bytes of shared memory a bf16 block may use (without opting in)


def smem_budget(item: int) -> int:
    """Shared-memory bytes a block of `item`-byte elements may use: float32 (TF32) tiles get twice bf16's, so that
    they take the same tile shapes (the launch opts in above 48 KiB)."""
    return MAX_SMEM * item // 2


@dataclass(frozen=True)
class MmaPlan(SplitPlan):
    """A launch of conv_wgrad_mma for one geometry: n-tile groups on the grid's second axis."""
    groups: int = 1

    carries = True

    @property
    def grid(self) -> tuple:
        return (self.splits, self.groups)

    def launch_args(self, part, carried) -> tuple[tuple, tuple]:
        """(grid, conv_wgrad_mma's finalize arguments): `carried` (a conv_wgrad.PendingFinalize, or None) adds rows of
        blocks that sum its partials."""
        if carried is None:
            return self.grid, (part, part, 0, 0, self.groups)
        rows = cdiv(cdiv(carried.n_out, 32), self.splits)
        return ((self.splits, self.groups + rows),
                (carried.part, carried.out, carried.n_out, carried.splits, self.groups))

    def tiles(self) -> dict:
        """What `choose` remembers: enough for mma_plan to rebuild the plan."""
        c = self.consts
        return {"kernel": "mma", "R": c["R"], "groups": self.groups, "WARPS": c["WARPS"], "splits": self.splits}

    def kernel(self, dtype: str):
        return KERNELS[dtype]

    def specialization(self, nhwc: bool, krsc: bool) -> dict:
        if not nhwc:
            raise ValueError("conv_wgrad_mma: dy and x must be channels-last")
        return dict(self.consts, KRSC=int(krsc))


def supports(geo: dict, item: int = 2) -> bool:
    """Whether the tensor-core kernel takes this geometry with elements of `item` bytes (its operands must also be
    channels-last, and bf16, or float32 where TF32 is allowed)."""
    return geo["COUT"] % 16 == 0 and _smem_bytes(geo, 1, item) <= smem_budget(item)


def _smem_bytes(geo: dict, R: int, item: int = 2) -> int:
    xr, xc = (R - 1) * geo["SH"] + geo["KH"], (geo["WO"] - 1) * geo["SW"] + geo["KW"]
    return 2 * item * ((xr * xc + 1) * (cdiv(geo["CIN"], 8) * 8 + PAD)
                    + cdiv(R * geo["WO"], 16) * 16 * (geo["COUT"] + PAD))


def mma_plan(geo: dict, n: int, R: int | None = None, groups: int | None = None, WARPS: int | None = None,
             splits: int | None = None, blocks: int = 264, item: int = 2) -> MmaPlan:
    """A launch plan: R output rows per chunk (default: about 64 pixels), `groups` n-tile groups (default: at most
    about 32 mma tiles per warp step), WARPS warps, `splits` over K (default: about `blocks` blocks); item: bytes
    per element (2: bf16, 4: float32 on TF32)."""
    if not supports(geo, item):
        raise ValueError(f"conv_wgrad_mma: needs Cout % 16 == 0 and a chunk in {smem_budget(item)} bytes of shared "
                         f"memory, got Cin {geo['CIN']}, Cout {geo['COUT']}")
    ho, wo = geo["HO"], geo["WO"]
    R = min(ho, R or max(1, 64 // wo))
    while R > 1 and _smem_bytes(geo, R, item) > smem_budget(item):
        R //= 2
    mt, nt = geo["COUT"] // 16, geo["KH"] * geo["KW"] * cdiv(geo["CIN"], 8)
    WARPS = WARPS or min(8, nt)
    groups = groups or cdiv(nt, WARPS * max(1, 8 // mt))
    ntb = cdiv(nt, groups)
    total = n * cdiv(ho, R)
    S = splits or max(1, min(total, blocks // groups))
    cpb = cdiv(total, S)
    S = cdiv(total, cpb)
    consts = dict(geo, R=R, NTB=ntb, WARPS=min(WARPS, ntb))
    return MmaPlan(consts, S, cpb, total, 32 * consts["WARPS"], _smem_bytes(geo, R, item), cdiv(nt, ntb))


def candidate_tiles(geo: dict, n: int, sms: int, item: int = 2) -> list[dict]:
    """The default plan for `sms` SMs and three neighbours (half the splits; chunks twice as long; half as long with
    twice the splits), deduplicated: on the H200 the fastest at each of the seed ResNet's 8 shapes was one of these
    (conv_wgrad_bf16_h200_a77e54a.json; a quarter of the blocks, twice the splits alone and one tap per block never
    won), and each candidate costs a compile at a cold start."""
    if not supports(geo, item):
        return []
    base = mma_plan(geo, n, blocks=2 * sms, item=item)
    options = [base.tiles(), mma_plan(geo, n, blocks=sms, item=item).tiles(),
               mma_plan(geo, n, R=2 * base.consts["R"], blocks=2 * sms, item=item).tiles(),
               mma_plan(geo, n, R=max(1, base.consts["R"] // 2), blocks=4 * sms, item=item).tiles()]
    unique = []
    for o in options:
        if o not in unique:
            unique.append(o)
    return unique
