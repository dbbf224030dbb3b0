"""Device functions in the kernel language itself: warp and block reductions, tile matmul, shared tiles' swizzle,
eight-value loads and stores (16 bytes of 16-bit data, 32 of float32)."""
from frost.kernel.api import device
from frost.kernel.builtins import (bdx, inf, lane, load4, load8, mma_16x8x16, register_library, shfl_xor,
                                   static_range, store4, store8, syncthreads, warp)
from frost.kernel.types import Const, f32


@device
def warp_sum(v):
    """The sum of v over the 32 lanes of a warp (every lane gets it): a butterfly of shuffles."""
    for k in static_range(5):
        v += shfl_xor(v, 16 >> k)
    return v


@device
def warp_max(v):
    """The maximum of v over the 32 lanes of a warp (every lane gets it)."""
    for k in static_range(5):
        v = max(v, shfl_xor(v, 16 >> k))
    return v


@device
def warp_min(v):
    """The minimum of v over the 32 lanes of a warp (every lane gets it)."""
    for k in static_range(5):
        v = min(v, shfl_xor(v, 16 >> k))
    return v


@device
def block_sum(v, scratch):
    """The sum of v over the block (every thread gets it); scratch is shared memory with a slot per warp."""
    v = warp_sum(v)
    if lane == 0:
        scratch[warp] = v
    syncthreads()
    v = scratch[lane] if lane < bdx // 32 else 0.0
    v = warp_sum(v)
    syncthreads()  # scratch may be reused right after
    return v


@device
def block_max(v, scratch):
    """The maximum of v over the block (every thread gets it); scratch as for block_sum."""
    v = warp_max(v)
    if lane == 0:
        scratch[warp] = v
    syncthreads()
    v = scratch[lane] if lane < bdx // 32 else -inf
    v = warp_max(v)
    syncthreads()
    return v


@device
def mma_tile(acc, a, b):
    """acc += a @ b on register tiles: acc is local(f32, (I, J, 4)) 16x8 accumulators, a is local(bf16, (I, 8))
    16x16 A fragments (ldmatrix_x4), b is local(bf16, (J // 2, 2, 4)) pairs of 16x8 B fragments
    (ldmatrix_x4_trans). In a kernel, `acc += a @ b` calls this."""
    for i in static_range(acc.shape[0]):
        for j in static_range(acc.shape[1]):
            mma_16x8x16(acc[i, j], a[i], b[j // 2, j % 2])


@device
def swizzle(row, col, COLS: Const[int]):
    """The column where element (row, col) of a shared tile of 16-bit elements with COLS columns is stored.

    The tile's 16-byte chunks (8 elements) are permuted within each 128-byte line: chunk index XOR row bits. Eight
    consecutive rows of one chunk (what ldmatrix reads, and what 16-byte cp.async writes land on) then fall in eight
    different bank groups with no padding. Use it for every access of the tile; COLS is a power of two (>= 8)."""
    CHUNKS: Const[int] = COLS // 8
    ROWS_PER_LINE: Const[int] = max(8 // CHUNKS, 1)
    KEYS: Const[int] = min(CHUNKS, 8)
    key = row // ROWS_PER_LINE % KEYS
    return ((col // 8) ^ key) * 8 + col % 8


@device
def load8_into(v, a, i):
    """v[0:8] = a[i:i + 8] in one 16-byte load of eight bf16/f16 values (i % 8 == 0), converted to v's elements:
    the unpacking that a kernel over 16-bit data writes for every chunk it reads."""
    v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7] = load8(a, i)


@device
def load8_f32_into(v, a, i):
    """v[0:8] = a[i:i + 8] of a float32 array in two 16-byte loads (i % 4 == 0): load8_into's float32 twin, for
    kernels that take either (chosen in Python, as the array's type is)."""
    v[0], v[1], v[2], v[3] = load4(a, i)
    v[4], v[5], v[6], v[7] = load4(a, i + 4)


@device
def store8_from(a, i, v):
    """a[i:i + 8] = v[0:8] rounded to a's bf16/f16, one 16-byte store (i % 8 == 0)."""
    store8(a, i, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])


@device
def store8_f32_from(a, i, v):
    """a[i:i + 8] = v[0:8] into a float32 array, two 16-byte stores (i % 4 == 0): store8_from's float32 twin."""
    store4(a, i, v[0], v[1], v[2], v[3])
    store4(a, i + 4, v[4], v[5], v[6], v[7])


def load8_of(T):
    """The eight-value load for arrays of element type T: load8_f32_into for float32, load8_into for bf16/f16."""
    return load8_f32_into if T is f32 else load8_into


def store8_of(T):
    """The eight-value store for arrays of element type T: store8_f32_from for float32, store8_from for bf16/f16."""
    return store8_f32_from if T is f32 else store8_from


# what a kernel may call without importing it (block_sum and block_max stay explicit imports)
register_library(warp_sum, warp_max, warp_min, mma_tile, swizzle, load8_into, load8_f32_into, store8_from,
                 store8_f32_from)
