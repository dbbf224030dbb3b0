"""Philox4x32-10 counter-based random numbers for CUDA, whose offset lives on the device so graph replays draw anew.

Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps a
128-bit counter and a 64-bit key to 128 random bits by ten rounds of multiply-high/xor. Frost's CUDA generator
(`frost.backend.cuda.generator()`) is a `PhiloxGenerator`:

- Key = the seed (low word, high word); `frost.manual_seed(s)` sets key = s mod 2^64 and offset = 0.
- State on the device: a uint32 array [key_lo, key_hi, offset_lo, offset_hi]. A draw of n values uses the
  counters offset + j for j = 0 .. ceil(n / 4) - 1 (as (lo, hi, 0, 0)); value i is word i % 4 of block i // 4.
  Every draw kernel reads key and offset from device memory, and a one-thread kernel launched after it adds
  ceil(n / 4) to the offset. The host never reads the offset, so a step captured by frost.jit reads and
  advances the same state on every replay and draws new numbers each time, the same sequence as eager calls.
- Outputs: uint32 bits; uniform float32 in [0, 1) = (bits >> 8) * 2^-24; uniform float64 from two words
  ((a >> 5) * 2^26 + (b >> 6)) * 2^-53; normal float32 by Box-Muller computed in float64 from the pairs (w0, w1)
  and (w2, w3) of a block (radius from (w + 1) * 2^-32 in (0, 1], angle from w * 2^-32), rounded to float32
  (float64 normals are those, widened); integers in [low, high) as low + (bits * r) >> 32 for r = high - low
  <= 2^32 (Lemire's multiply-shift without rejection, so each value's probability is within a factor
  1 +- r / 2^32 of 1 / r) and low + (64 bits) % r beyond (bias below r / 2^64); permutations argsort 64-bit
  draws; Bernoulli masks compare float32 uniforms with p (dropout keeps u >= p).
- State save/restore: `g = frost.backend.cuda.generator()`; `g.get_state()` returns (seed, offset) as Python
  ints (it reads the device, so not inside a captured step); `g.set_state((seed, offset))` writes both with a
  kernel, in place (no host-to-device copy, no new array), as does `frost.manual_seed`, so graphs captured
  earlier follow a reseed. The generator (its state array) has to exist before a capture starts: any eager
  draw or jit's warm-up calls create it.

The NumPy twin (`philox4x32`, `bits_numpy`, `uniform_numpy`, `normal_numpy`, ...) computes the same values on the
CPU bit for bit; the tests compare the kernels (simulated and on the GPU) with it. The CPU generator stays NumPy's.
"""
from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from frost.backend import cuda
from frost.kernel import (Array, bdx, bx, cdiv, cos, f32, f64, i32, i64, kernel, log, mulhi, sin, sqrt, static_range,
                          tx, u32)

M0, M1 = 0xD2511F53, 0xCD9E8D57   # the round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85   # the Weyl key increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10
BLOCK = 256

__all__ = ["PhiloxGenerator", "philox4x32", "counters_for", "bits_numpy", "uniform_numpy", "uniform64_numpy",
           "normal_numpy", "integers_numpy", "seed_key"]


# ---------------------------------------------------------------- the NumPy twin
def philox4x32(ctr, key, rounds: int = ROUNDS) -> np.ndarray:
    """Philox4x32-`rounds` of counters ctr (4, ...) under key (2, ...) in uint64 math; returns (4, ...) uint32."""
    mask = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in ctr)
    k0, k1 = (np.asarray(k, dtype=np.uint64) for k in key)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + np.uint64(W0)) & mask, (k1 + np.uint64(W1)) & mask
        p0, p1 = c0 * np.uint64(M0), c2 * np.uint64(M1)
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask
    return np.stack(np.broadcast_arrays(c0, c1, c2, c3)).astype(np.uint32)


def seed_key(seed: int) -> tuple[int, int]:
    """The key (lo, hi) of a seed: seed mod 2^64 split into two 32-bit words."""
    seed = int(seed) % (1 << 64)
    return seed & 0xFFFFFFFF, seed >> 32


def counters_for(n: int) -> int:
    """How many counters (128-bit blocks) a draw of n 32-bit values consumes."""
    return -(-int(n) // 4)


def bits_numpy(seed: int, offset: int, n: int) -> np.ndarray:
    """The n uint32 values a draw makes at `offset` under `seed` (the twin of philox_bits_kernel)."""
    j = np.arange(counters_for(n), dtype=np.uint64) + np.uint64(offset)
    zero = np.zeros_like(j)
    block = philox4x32((j & np.uint64(0xFFFFFFFF), j >> np.uint64(32), zero, zero), seed_key(seed))
    return block.T.reshape(-1)[:n]


def sort_keys_numpy(words: np.ndarray) -> np.ndarray:
    """The twin of philox_sort_keys: each pair of uint32 words (high, low) as its 64-bit draw minus 2^63, an int64."""
    draws = (words[0::2].astype(np.uint64) << np.uint64(32)) | words[1::2]
    return (draws ^ np.uint64(1 << 63)).view(np.int64)


def uniform_numpy(seed: int, offset: int, n: int) -> np.ndarray:
    """Uniform float32 in [0, 1): the top 24 bits of each word times 2^-24."""
    return (bits_numpy(seed, offset, n) >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def uniform64_numpy(seed: int, offset: int, n: int) -> np.ndarray:
    """Uniform float64 in [0, 1) with 53 random bits from two words per value."""
    w = bits_numpy(seed, offset, 2 * n).astype(np.uint64)
    return _uniform53(w[0::2], w[1::2], np)


def _uniform53(a, b, xp):
    top = (a >> xp.uint64(5)) * xp.uint64(1 << 26) + (b >> xp.uint64(6))
    return top.astype(xp.float64) * (2.0 ** -53)


def normal_numpy(seed: int, offset: int, n: int) -> np.ndarray:
    """Standard normal float32 by Box-Muller in float64 (the twin of philox_normal_kernel)."""
    w = bits_numpy(seed, offset, 4 * counters_for(n)).astype(np.float64).reshape(-1, 2)
    radius = np.sqrt(-2.0 * np.log((w[:, 0] + 1.0) / 4294967296.0))
    theta = 6.283185307179586 * (w[:, 1] / 4294967296.0)
    pairs = np.stack([(radius * np.cos(theta)).astype(np.float32), (radius * np.sin(theta)).astype(np.float32)], 1)
    return pairs.reshape(-1)[:n]


def integers_numpy(seed: int, offset: int, low: int, high: int, n: int) -> np.ndarray:
    """Integers in [low, high) as int64 (the twin of PhiloxGenerator.integers)."""
    span = int(high) - int(low)
    if span <= 1 << 32:
        return _small_range(bits_numpy(seed, offset, n), low, span, np)
    return _large_range(bits_numpy(seed, offset, 2 * n), low, span, np)


def _small_range(bits, low: int, span: int, xp):
    # (bits * span) >> 32 < span; bits < 2^32 and span <= 2^32, so the product fits in uint64
    return ((bits.astype(xp.uint64) * xp.uint64(span)) >> xp.uint64(32)).astype(xp.int64) + low


def _large_range(words, low: int, span: int, xp):
    w = words.astype(xp.uint64)
    wide = (w[0::2] << xp.uint64(32)) | w[1::2]
    return (wide % xp.uint64(span)).astype(xp.int64) + low


# ---------------------------------------------------------------- the kernels
@kernel.device
def philox_block(c0: u32, c1: u32, c2: u32, c3: u32, k0: u32, k1: u32) -> (u32, u32, u32, u32):
    """Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1)."""
    for r in static_range(ROUNDS):
        hi0 = mulhi(c0, u32(M0))
        lo0 = c0 * u32(M0)
        hi1 = mulhi(c2, u32(M1))
        lo1 = c2 * u32(M1)
        c0 = hi1 ^ c1 ^ k0
        c1 = lo1
        c2 = hi0 ^ c3 ^ k1
        c3 = lo0
        k0 += u32(W0)  # the bump after the last round is unused
        k1 += u32(W1)
    return c0, c1, c2, c3


@kernel.device
def draw_block(state, j: i32) -> (u32, u32, u32, u32):
    """The four words of counter offset + j, with key and offset read from the device state."""
    lo = state[2] + u32(j)
    hi = state[3]
    if lo < state[2]:  # the low word wrapped: carry into the high word
        hi += u32(1)
    # unpacked and repacked: the kernel language cannot yet return another device function's tuple directly
    w0, w1, w2, w3 = philox_block(lo, hi, u32(0), u32(0), state[0], state[1])
    return w0, w1, w2, w3


@kernel.device
def store_block(out, j: i32, n: i32, v0, v1, v2, v3):
    """Block j's four values into out[4j:4j+4], the ones at n or beyond left out (the draw's last block)."""
    i = j * 4
    out[i] = v0
    if i + 1 < n:
        out[i + 1] = v1
    if i + 2 < n:
        out[i + 2] = v2
    if i + 3 < n:
        out[i + 3] = v3


@kernel.warm
@kernel
def philox_bits_kernel(state: Array[u32], out: Array[u32], n: i32, blocks: i32):
    j = bx * bdx + tx
    if j < blocks:
        w0, w1, w2, w3 = draw_block(state, j)
        store_block(out, j, n, w0, w1, w2, w3)


@kernel.device
def to_unit(w: u32) -> f32:
    """The top 24 bits as a float32 in [0, 1) (exact)."""
    return f32(w >> u32(8)) / 16777216.0


@kernel
def philox_uniform_kernel(state: Array[u32], out: Array[f32], n: i32, blocks: i32):
    j = bx * bdx + tx
    if j < blocks:
        w0, w1, w2, w3 = draw_block(state, j)
        store_block(out, j, n, to_unit(w0), to_unit(w1), to_unit(w2), to_unit(w3))


@kernel.device
def box_muller(a: u32, b: u32) -> (f32, f32):
    """Two standard normals from two words, computed in float64 and rounded (so the GPU matches NumPy)."""
    radius = sqrt(-2.0 * log((f64(a) + 1.0) / 4294967296.0))
    theta = 6.283185307179586 * (f64(b) / 4294967296.0)
    return f32(radius * cos(theta)), f32(radius * sin(theta))


@kernel
def philox_normal_kernel(state: Array[u32], out: Array[f32], n: i32, blocks: i32):
    j = bx * bdx + tx
    if j < blocks:
        w0, w1, w2, w3 = draw_block(state, j)
        z0, z1 = box_muller(w0, w1)
        z2, z3 = box_muller(w2, w3)
        store_block(out, j, n, z0, z1, z2, z3)


@kernel.device
def advance_offset(state, blocks: u32):
    """state's 64-bit offset (words 2 and 3) moved past `blocks` counters."""
    lo = state[2] + blocks
    if lo < blocks:
        state[3] += u32(1)
    state[2] = lo


@kernel.warm
@kernel
def philox_advance(state: Array[u32], blocks: u32):
    """Move the offset past the counters a draw used (launched once, after the draw, on the same stream)."""
    if bx == 0 and tx == 0:
        advance_offset(state, blocks)


@kernel.warm
@kernel
def philox_reserve(state: Array[u32], snapshot: Array[u32], blocks: u32, stream: u32):
    """snapshot = state with `stream` xor-ed into the key's high word, then the offset moved past `blocks` counters:
    reserve's copy and advance in one launch."""
    if bx == 0 and tx == 0:
        for w in range(4):
            snapshot[w] = state[w]
        snapshot[1] = state[1] ^ stream
        advance_offset(state, blocks)


@kernel.warm
@kernel
def philox_set_state(state: Array[u32], k0: u32, k1: u32, lo: u32, hi: u32):
    """Write key and offset: a kernel rather than a host copy, so that it is legal anywhere a launch is."""
    if bx == 0 and tx == 0:
        state[0] = k0
        state[1] = k1
        state[2] = lo
        state[3] = hi


@kernel.warm
@kernel
def philox_sort_keys(words: Array[u32], keys: Array[i64], n: i32):
    """keys[i]: the 64-bit draw words[2i] * 2^32 + words[2i + 1] minus 2^63, an int64 that sorts as the unsigned
    draw does (permutation's sort keys, made in one launch)."""
    i = bx * bdx + tx
    if i < n:
        keys[i] = (i64(words[2 * i]) - 2147483648) * 4294967296 + i64(words[2 * i + 1])


# ---------------------------------------------------------------- the generator
class PhiloxGenerator:
    """Frost's CUDA generator on one device: the draws of a CuPy Generator that frost uses, from Philox4x32-10."""

    def __init__(self, seed: int = 0, device: int | None = None) -> None:
        cp = cuda.cupy()
        self.device = cp.cuda.Device().id if device is None else int(device)
        if _capturing(cp):
            raise RuntimeError("PhiloxGenerator: the CUDA generator has to exist before a step is captured by "
                               "frost.jit: draw once eagerly first (or call frost.backend.cuda.generator())")
        with cp.cuda.Device(self.device):
            self.state = cp.zeros(4, dtype=cp.uint32)
        self.seed(seed)

    # state
    def seed(self, seed: int) -> None:
        """Reset to key = seed, offset = 0 (in place, so captured graphs that hold the state follow)."""
        self.set_state((seed, 0))

    def set_state(self, state: tuple[int, int]) -> None:
        """Restore (seed, offset) as returned by get_state()."""
        seed, offset = state
        offset = int(offset) % (1 << 64)
        with self._on_device():
            philox_set_state[1, 32](self.state, *seed_key(seed), offset & 0xFFFFFFFF, offset >> 32)

    def get_state(self) -> tuple[int, int]:
        """(seed, offset): the key as one 64-bit seed and the next unused counter (reads the device)."""
        k0, k1, lo, hi = (int(v) for v in self.state.get())
        return k0 | (k1 << 32), lo | (hi << 32)

    # draws
    def bits(self, shape: int | tuple) -> Any:
        """Random uint32 words of the given shape (a CuPy array)."""
        return self._draw(philox_bits_kernel, shape, "uint32")

    def random(self, shape: int | tuple | None = None, dtype: str = "float32") -> Any:
        """Uniform values in [0, 1): float32 from 24 bits, float64 from 53 bits (two words each)."""
        shape = _shape(shape)
        if np.dtype(dtype) == np.float64:
            cp = self._cp()
            w = self.bits((2 * _numel(shape),)).astype(cp.uint64)
            return _uniform53(w[0::2], w[1::2], cp).reshape(shape)
        return self._draw(philox_uniform_kernel, shape, "float32").astype(dtype, copy=False)

    def standard_normal(self, shape: int | tuple | None = None, dtype: str = "float32") -> Any:
        """Standard normal values (float32 Box-Muller; other dtypes are those values converted)."""
        return self._draw(philox_normal_kernel, _shape(shape), "float32").astype(dtype, copy=False)

    def integers(self, low: int, high: int | None = None, size: int | tuple | None = None,
                 dtype: str = "int64") -> Any:
        """Integers in [low, high) (or [0, low) when high is None), like numpy.random.Generator.integers."""
        if high is None:
            low, high = 0, low
        span = int(high) - int(low)
        if span <= 0:
            raise ValueError(f"PhiloxGenerator.integers: empty range [{low}, {high})")
        shape = _shape(size)
        n = _numel(shape)
        cp = self._cp()
        if span <= 1 << 32:
            out = _small_range(self.bits((n,)), int(low), span, cp)
        else:
            out = _large_range(self.bits((2 * n,)), int(low), span, cp)
        return out.reshape(shape).astype(dtype, copy=False)

    def permutation(self, n: int) -> Any:
        """A random permutation of range(n) (int64): the order that sorts n 64-bit draws."""
        cp, n = self._cp(), int(n)
        words = self.bits((2 * n,))
        with self._on_device():
            keys = cp.empty(n, cp.int64)
            if n > 0:
                philox_sort_keys[cdiv(n, 256), 256](words, keys, n)
            return cp.argsort(keys).astype(cp.int64, copy=False)

    def reserve(self, blocks: int, stream: int = 0) -> Any:
        """A copy of the state (4 uint32 words) for a kernel that draws `blocks` counters from it itself, the
        generator moved past them: one launch that copies and advances (philox_reserve), no host read, so a captured
        step reserves new counters on every replay (frost/accel/dropout.py, frost/accel/flash_attention.py).
        `stream`, xor-ed into the copy's key (high word), keeps a consumer with its own counter scheme (cuDNN's
        attention dropout) off the counters of the generator's own draws."""
        with self._on_device():
            snapshot = self._cp().empty(4, np.uint32)
            philox_reserve[1, 32](self.state, snapshot, blocks, stream)
        return snapshot

    def bernoulli_mask(self, shape: int | tuple, p: float) -> Any:
        """A boolean mask, True with probability p (uniform float32 draws below p)."""
        return self.random(shape) < np.float32(p)

    # helpers
    def _cp(self):
        return cuda.cupy()

    def _on_device(self):
        cp = self._cp()
        return contextlib.nullcontext() if cp.cuda.Device().id == self.device else cp.cuda.Device(self.device)

    def _draw(self, k, shape, dtype: str):
        cp = self._cp()
        shape = _shape(shape)
        n = _numel(shape)
        if n >= 1 << 31:
            raise ValueError(f"PhiloxGenerator: a draw of shape {shape} has {n} values; at most 2^31 - 1 per draw")
        with self._on_device():
            out = cp.empty(shape, dtype=dtype)
            if n:
                blocks = counters_for(n)
                k[cdiv(blocks, BLOCK), BLOCK](self.state, out.reshape(-1), n, blocks)
                philox_advance[1, 32](self.state, blocks)
        return out


def _capturing(cp) -> bool:
    try:
        return bool(cp.cuda.get_current_stream().is_capturing())
    except Exception:  # an older CuPy without is_capturing(): the allocation below reports a capture itself
        return False


def _shape(shape) -> tuple:
    if shape is None:
        return ()
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# frost.backend.cuda sits below the kernel language this generator is written in, so it asks for the generator
# through this registration instead of importing this module
cuda.register_generator_factory(PhiloxGenerator)
