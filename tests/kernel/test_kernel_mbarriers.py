"""mbarriers and bulk copies (mbarrier_init / _arrive / _arrive_expect_tx / _wait, cp_async_bulk): one producer
thread feeds shared-memory stages through the copy engine and consumer warps wait for each stage's phase, the
pipeline of FlashAttention-3. The simulator lands a bulk copy when its barrier's phase completes and orders, for its
race detector, exactly what the barrier orders; the code generator writes PTX's mbarrier and cp.async.bulk, which
NVRTC compiles for sm_90a."""
import numpy as np
import pytest

from frost.kernel import (Array, Const, KernelError, SimulationError, cp_async_bulk, device, f32, i32, i64, kernel,
                          mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait, shared,
                          syncthreads, tx)
from frost.kernel.simulate import SharedMemoryRaceError

TILE = 64            # f32 elements a stage holds
TILE_BYTES = 4 * TILE
CONSUMERS = 64       # warps 1-2


def _pipeline(STAGES, EMPTY_WAIT=True):
    @kernel
    def bulk_pipeline(x: Array[f32], y: Array[f32], tiles: i32, STAGES: Const[int], EMPTY_WAIT: Const[bool]):
        """Thread 0 copies tile t of x into stage t % STAGES (its FULL barrier counts the bytes); warps 1-2 add the
        stage into y reversed and release it on its EMPTY barrier, which the producer waits on before refilling."""
        buf = shared(f32, STAGES * TILE)
        full = shared(i64, STAGES)
        empty = shared(i64, STAGES)
        if tx == 0:
            for stage in range(STAGES):
                mbarrier_init(full, stage, 1)
                mbarrier_init(empty, stage, CONSUMERS)
        syncthreads()
        if tx == 0:
            for t in range(tiles):
                s = t % STAGES
                if EMPTY_WAIT and t >= STAGES:
                    mbarrier_wait(empty, s, (t // STAGES - 1) % 2)   # the consumers released use t // STAGES - 1
                mbarrier_arrive_expect_tx(full, s, TILE_BYTES)
                cp_async_bulk(buf, s * TILE, x, t * TILE, TILE_BYTES, full, s)
        elif tx >= 32:
            c = tx - 32
            acc = 0.0
            for t in range(tiles):
                s = t % STAGES
                mbarrier_wait(full, s, (t // STAGES) % 2)
                acc += buf[s * TILE + TILE - 1 - c]
                mbarrier_arrive(empty, s)
            y[c] = acc
    return bulk_pipeline


def _want(x: np.ndarray, tiles: int) -> np.ndarray:
    want = np.zeros(TILE, np.float32)
    for t in range(tiles):   # the consumer's float32 sums in the kernel's order
        want += x[t * TILE:(t + 1) * TILE][::-1]
    return want


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_the_bulk_copy_pipeline_matches_numpy(stages):
    tiles = 7
    x = np.random.default_rng(stages).standard_normal(TILE * tiles).astype(np.float32)
    y = np.full(TILE, np.nan, np.float32)
    _pipeline(stages).simulate[1, 96](x, y, tiles, STAGES=stages, EMPTY_WAIT=True)
    np.testing.assert_array_equal(y, _want(x, tiles))


def test_refilling_a_stage_without_waiting_for_its_release_fails():
    """The producer runs ahead: a stage's second fill is in flight with its first (two asynchronous copies are
    unordered; on the GPU the consumers would read the wrong tile or wait for a phase that has passed)."""
    x = np.arange(TILE * 5, dtype=np.float32)
    with pytest.raises(SharedMemoryRaceError, match=r"bulk_pipeline: .*data race on shared array 'buf' at index 0: "
                                                    r"the cp_async_bulk block \(0, 0, 0\) thread \(0, 0, 0\) issued "
                                                    r"at .*:\d+ lands on it, and the cp_async_bulk .* landed on it"):
        _pipeline(1).simulate[1, 96](x, np.zeros(TILE, np.float32), 5, STAGES=1, EMPTY_WAIT=False)


@device
def ready(full):
    """Barrier full[0] set up for one arrival, seen by every thread."""
    if tx == 0:
        mbarrier_init(full, 0, 1)
    syncthreads()


@kernel
def read_before_wait(x: Array[f32], y: Array[f32]):
    buf = shared(f32, TILE)
    full = shared(i64, 1)
    ready(full)
    if tx == 0:
        mbarrier_arrive_expect_tx(full, 0, TILE_BYTES)
        cp_async_bulk(buf, 0, x, 0, TILE_BYTES, full, 0)
    else:
        y[tx] = buf[tx]   # no mbarrier_wait(full, 0, 0)


def test_reading_a_stage_before_waiting_for_its_phase_races_with_the_copy():
    with pytest.raises(SharedMemoryRaceError, match=r"read_before_wait: block \(0, 0, 0\) thread \(1, 0, 0\).*data "
                                                    r"race on shared array 'buf' at index 1: this thread reads it, and "
                                                    r"the cp_async_bulk block \(0, 0, 0\) thread \(0, 0, 0\) issued "
                                                    r"at .*test_kernel_mbarriers.py:\d+ landed on it"):
        read_before_wait.simulate[1, TILE](np.ones(TILE, np.float32), np.zeros(TILE, np.float32))


def _release(READ_FIRST):
    @kernel
    def release(x: Array[f32], y: Array[f32], READ_FIRST: Const[bool]):
        """Consumers release the buffer on `ready` and the producer refills it once they have: reading after
        releasing races with the refill."""
        buf = shared(f32, TILE)
        ready = shared(i64, 1)
        full = shared(i64, 1)
        if tx == 0:
            mbarrier_init(ready, 0, 32)
            mbarrier_init(full, 0, 1)
        syncthreads()
        if tx < 32:
            c = tx
            v = 0.0
            if READ_FIRST:
                v = buf[c]
            mbarrier_arrive(ready, 0)
            if not READ_FIRST:
                v = buf[c]
            mbarrier_wait(full, 0, 0)
            y[c] = buf[c]
            y[c + 32] = v
        elif tx == 32:
            mbarrier_wait(ready, 0, 0)
            mbarrier_arrive_expect_tx(full, 0, TILE_BYTES)
            cp_async_bulk(buf, 0, x, 0, TILE_BYTES, full, 0)
    return release


def test_a_copy_overwriting_reads_its_barrier_does_not_order_is_a_race():
    x = np.arange(TILE, dtype=np.float32)
    y = np.zeros(TILE, np.float32)
    _release(True).simulate[1, 64](x, y, READ_FIRST=True)
    np.testing.assert_array_equal(y[:32], x[:32])
    with pytest.raises(SharedMemoryRaceError, match=r"data race on shared array 'buf' at index \d+: the "
                                                    r"cp_async_bulk block \(0, 0, 0\) thread \(32, 0, 0\) issued at "
                                                    r".*:\d+ lands on it, and block \(0, 0, 0\) thread \(\d+, 0, 0\) "
                                                    r"read it"):
        _release(False).simulate[1, 64](x, np.zeros(TILE, np.float32), READ_FIRST=False)


@kernel
def too_many_bytes(x: Array[f32], y: Array[f32]):
    buf = shared(f32, TILE)
    full = shared(i64, 1)
    ready(full)
    if tx == 0:
        mbarrier_arrive_expect_tx(full, 0, 2 * TILE_BYTES)   # one copy of TILE_BYTES follows
        cp_async_bulk(buf, 0, x, 0, TILE_BYTES, full, 0)
    mbarrier_wait(full, 0, 0)
    y[tx] = buf[tx]


def test_a_phase_waiting_for_bytes_no_copy_brings_is_a_deadlock_naming_the_barrier():
    with pytest.raises(SimulationError, match=r"(?s)too_many_bytes: deadlock: .*\(mbarrier full\[0\]: its phase of "
                                              r"parity 0 waits for 0 of 1 arrivals and 256 bytes, 1 bulk copy not "
                                              r"landed\).*"
                                              r"test_kernel_mbarriers.py:\d+ \(mbar\)"):
        too_many_bytes.simulate[1, 32](np.ones(TILE, np.float32), np.zeros(32, np.float32))


@kernel
def copy_never_awaited(x: Array[f32]):
    buf = shared(f32, TILE)
    full = shared(i64, 1)
    if tx == 0:
        mbarrier_init(full, 0, 1)
        cp_async_bulk(buf, 0, x, 0, TILE_BYTES, full, 0)   # its bytes never announced: the phase never completes


def test_a_block_exiting_with_copies_in_flight_is_an_error():
    with pytest.raises(SimulationError, match=r"copy_never_awaited: the block exited with cp_async_bulk copies in "
                                              r"flight \(the first issued by block \(0, 0, 0\) thread \(0, 0, 0\) at "
                                              r".*test_kernel_mbarriers.py:\d+; mbarrier full\[0\]: its phase of "
                                              r"parity 0 waits for 1 of 1 arrivals and -256 bytes"):
        copy_never_awaited.simulate[1, 32](np.ones(TILE, np.float32))


@kernel
def bulk_args(x: Array[f32], y: Array[f32], dst: i32, src: i32, nbytes: i32, parity: i32, INIT: Const[bool],
              SYNC: Const[bool], ARRIVALS: Const[int]):
    buf = shared(f32, 2 * TILE)
    full = shared(i64, 1)
    if tx == 0 and INIT:
        mbarrier_init(full, 0, 1)
    if SYNC:
        syncthreads()
    if tx == 0:
        mbarrier_arrive_expect_tx(full, 0, nbytes)
        for _ in range(ARRIVALS - 1):
            mbarrier_arrive(full, 0)   # the phase is still waiting for the copy's bytes: one arrival too many
        cp_async_bulk(buf, dst, x, src, nbytes, full, 0)
    mbarrier_wait(full, 0, parity)
    y[tx] = buf[dst + tx]


@pytest.mark.parametrize("change, message", [
    (dict(dst=2), r"cp_async_bulk: buf\[2\] is not 16-byte aligned in shared memory"),
    (dict(src=1), r"cp_async_bulk: x\[1\] is not 16-byte aligned in global memory"),
    (dict(nbytes=-16), r"mbarrier_arrive_expect_tx: -16 bytes is not in 0..1048575"),
    (dict(nbytes=100), r"cp_async_bulk: 100 bytes is not a positive multiple of 16"),
    (dict(nbytes=1024), r"256 elements from index 0 run past the end of array 'buf' of shape \(128,\)"),
    (dict(parity=2), r"mbarrier_wait: parity 2 is not 0 or 1"),
    (dict(INIT=False), r"mbarrier_arrive_expect_tx: full\[0\] is not an initialized mbarrier"),
    (dict(SYNC=False), r"data race on shared array 'full' at index 0"),
    (dict(ARRIVALS=2), r"mbarrier full\[0\]: more than its count of 1 arrivals in one phase"),
])
def test_bad_bulk_copies_and_barrier_uses_are_errors_naming_the_thread_and_line(change, message):
    args = dict(dst=0, src=0, nbytes=TILE_BYTES, parity=0, INIT=True, SYNC=True, ARRIVALS=1)
    args.update(change)
    consts = {k: args.pop(k) for k in ("INIT", "SYNC", "ARRIVALS")}
    x = np.arange(2 * TILE, dtype=np.float32)
    with pytest.raises(SimulationError, match=r"bulk_args: block \(0, 0, 0\) thread \(\d+, 0, 0\) at "
                                              r".*test_kernel_mbarriers.py:\d+: .*" + message):
        bulk_args.simulate[1, 32](x, np.zeros(32, np.float32), *args.values(), **consts)


def _refused(name: str):
    """A kernel the front end refuses: made here, not at module level, where every kernel must generate its code."""
    @kernel
    def f32_barrier(x: Array[f32]):
        bars = shared(f32, 2)
        mbarrier_init(bars, 0, 1)

    @kernel
    def odd_size(x: Array[f32]):
        buf = shared(f32, 8)
        bars = shared(i64, 1)
        cp_async_bulk(buf, 0, x, 0, 24, bars, 0)

    @kernel
    def wrong_way(x: Array[f32]):
        buf = shared(f32, 8)
        bars = shared(i64, 1)
        cp_async_bulk(x, 0, buf, 0, 32, bars, 0)

    @kernel
    def no_arrivals(x: Array[f32]):
        bars = shared(i64, 1)
        mbarrier_init(bars, 0, 0)
    return locals()[name]


@pytest.mark.parametrize("bad, message", [
    ("f32_barrier", r"mbarrier_init\(\) needs its mbarrier as an element of a 1-D shared array of i64"),
    ("odd_size", r"cp_async_bulk: 24 bytes is not a positive multiple of 16"),
    ("wrong_way", r"cp_async_bulk\(\) copies from a 1-D global array to a 1-D shared one"),
    ("no_arrivals", r"mbarrier_init: count 0 is not in 1..1048575"),
])
def test_the_arguments_are_checked_when_the_kernel_is_built(bad, message):
    with pytest.raises(KernelError, match=message):
        _refused(bad).simulate[1, 32](np.zeros(32, np.float32))


def test_mbarriers_become_ptx_and_compile_for_sm_90a():
    pipeline = _pipeline(2)
    source = pipeline.source_for(STAGES=2, EMPTY_WAIT=True)
    for ptx in ("mbarrier.init.shared::cta.b64 [%0], %1; fence.proxy.async.shared::cta;",
                "mbarrier.arrive.expect_tx.shared::cta.b64",
                "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"):
        assert ptx in source
    info = pipeline.inspect("sm_90", STAGES=2, EMPTY_WAIT=True)
    assert "for 'sm_90a'" in info["log"]
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in info["ptx"]
    # the wait loop's asm, inlined at both waits (and unrolled copies of them): ptxas takes the repeated label
    assert info["ptx"].count("FROST_MBAR_WAIT:") >= 2 and pipeline.compile("sm_90", STAGES=2, EMPTY_WAIT=True)
    with pytest.raises(KernelError, match=r"bulk_pipeline: .*mbarriers or bulk copies need a Hopper GPU \(sm_90a\); "
                                          r"cannot compile for sm_80"):
        pipeline.compile("sm_80", STAGES=2, EMPTY_WAIT=True)


@pytest.mark.cuda
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_gpu_the_bulk_copy_pipeline_matches_numpy(stages):
    import cupy as cp
    tiles = 9
    x = np.random.default_rng(stages).standard_normal(TILE * tiles).astype(np.float32)
    want = _want(x, tiles)
    pipeline = _pipeline(stages)
    for _ in range(20):   # a missing ordering would show as a wrong sum now and then
        y = cp.full(TILE, cp.nan, cp.float32)
        pipeline[1, 96](cp.asarray(x), y, tiles, STAGES=stages, EMPTY_WAIT=True)
        np.testing.assert_array_equal(cp.asnumpy(y), want)


def test_what_the_issuing_thread_writes_after_the_copy_is_not_ordered_by_the_phase():
    """The phase may complete as soon as the copy lands, before the issuing thread's later writes."""
    @kernel
    def late_note(x: Array[f32], y: Array[f32]):
        buf = shared(f32, TILE)
        note = shared(f32, 1)
        full = shared(i64, 1)
        if tx == 0:
            mbarrier_init(full, 0, 1)
        syncthreads()
        if tx == 0:
            mbarrier_arrive_expect_tx(full, 0, TILE_BYTES)
            cp_async_bulk(buf, 0, x, 0, TILE_BYTES, full, 0)
            note[0] = 2.0
        else:
            mbarrier_wait(full, 0, 0)
            y[tx] = buf[tx] * note[0]
    with pytest.raises(SharedMemoryRaceError, match=r"late_note: block \(0, 0, 0\) thread \(1, 0, 0\).*data race on "
                                                    r"shared array 'note' at index 0: this thread reads it, and block "
                                                    r"\(0, 0, 0\) thread \(0, 0, 0\) wrote it"):
        late_note.simulate[1, 32](np.ones(TILE, np.float32), np.zeros(32, np.float32))


def _unordered(KIND):
    @kernel
    def unordered(x: Array[f32], y: Array[f32], KIND: Const[int]):
        """Each KIND a way of using a bulk copy's bytes or the issuer's writes that the barrier does not order."""
        buf = shared(f32, TILE)
        note = shared(f32, 1)
        bars = shared(i64, 2)
        if tx == 0:
            mbarrier_init(bars, 0, 1)
            mbarrier_init(bars, 1, 1)
        syncthreads()
        if KIND == 0:     # the issuer writes, then issues; another thread announces the bytes
            if tx == 0:
                note[0] = 3.0
                cp_async_bulk(buf, 0, x, 0, TILE_BYTES, bars, 0)
            elif tx == 32:
                mbarrier_arrive_expect_tx(bars, 0, TILE_BYTES)
            elif tx == 33:
                mbarrier_wait(bars, 0, 0)
                y[0] = note[0] + buf[0]
        elif KIND == 1:   # syncthreads() instead of mbarrier_wait
            if tx == 0:
                mbarrier_arrive_expect_tx(bars, 0, TILE_BYTES)
                cp_async_bulk(buf, 0, x, 0, TILE_BYTES, bars, 0)
            syncthreads()
            y[tx] = buf[tx]
        else:             # two copies into one buffer in flight together
            if tx == 0:
                mbarrier_arrive_expect_tx(bars, 0, TILE_BYTES)
                cp_async_bulk(buf, 0, x, 0, TILE_BYTES, bars, 0)
                mbarrier_arrive_expect_tx(bars, 1, TILE_BYTES)
                cp_async_bulk(buf, 0, x, TILE, TILE_BYTES, bars, 1)
            mbarrier_wait(bars, 0, 0)
            mbarrier_wait(bars, 1, 0)
            y[tx] = buf[tx]
    return unordered


@pytest.mark.parametrize("kind, message", [
    (0, r"'note' at index 0: this thread reads it, and block \(0, 0, 0\) thread \(0, 0, 0\) wrote it"),
    (1, r"'buf' at index 0: this thread reads it, and the cp_async_bulk block \(0, 0, 0\) thread \(0, 0, 0\) "
        r"issued at .*:\d+ landed on it"),
    (2, r"'buf' at index 0: the cp_async_bulk .* lands on it, and the cp_async_bulk .* landed on it"),
])
def test_what_a_phase_does_not_order_is_a_race(kind, message):
    """PTX: a copy's completion orders the waiter after the landing only, not after the issuing thread's earlier
    writes; syncthreads() does not wait for the copy engine; two copies in flight are unordered."""
    with pytest.raises(SharedMemoryRaceError, match=r"unordered: .*data race on shared array " + message):
        _unordered(kind).simulate[1, 64](np.arange(2 * TILE, dtype=np.float32), np.zeros(64, np.float32), KIND=kind)


def test_initializing_a_barrier_twice_is_an_error():
    @kernel
    def init_twice(y: Array[f32]):
        bars = shared(i64, 1)
        if tx == 0:
            mbarrier_init(bars, 0, 1)
            mbarrier_init(bars, 0, 1)   # PTX: mbarrier.init of a valid mbarrier is undefined
        y[tx] = 1.0
    with pytest.raises(SimulationError, match=r"init_twice: block \(0, 0, 0\) thread \(0, 0, 0\) at .*: "
                                              r"mbarrier_init: bars\[0\] is already an initialized mbarrier"):
        init_twice.simulate[1, 32](np.zeros(32, np.float32))
