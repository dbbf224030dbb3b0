"""Named barriers (bar_sync / bar_arrive) and register reallocation (setmaxnreg_inc / _dec): the pieces of a
warp-specialized kernel, where producer warps fill shared buffers and consumer warps read them, each group waiting
only for the other. The simulator runs them (the race detector ordering exactly what a named barrier orders), the
code generator writes PTX's bar.sync / bar.arrive / setmaxnreg, and NVRTC compiles it for sm_90a."""
import numpy as np
import pytest

from frost.kernel import (Array, Const, KernelError, SimulationError, bar_arrive, bar_sync, device, f32, i32, kernel,
                          launch_bounds, setmaxnreg_dec, setmaxnreg_inc, shared, shfl_xor, syncthreads, tx, warp)
from frost.kernel.simulate import SharedMemoryRaceError

FULL, EMPTY = 1, 2   # barrier ids: the buffer holds a tile / the buffer may be refilled


@kernel
def hand_over(x: Array[f32], y: Array[f32]):
    """Warps 0-1 write s, warps 2-3 read it reversed: one named barrier of all 128 threads, arrive and sync."""
    s = shared(f32, 64)
    if tx < 64:
        s[tx] = x[tx] * 2.0
        bar_arrive(FULL, 128)
    else:
        bar_sync(FULL, 128)
        y[tx - 64] = s[127 - tx]


@kernel
def hand_over_unordered(x: Array[f32], y: Array[f32]):
    s = shared(f32, 64)
    if tx < 64:
        s[tx] = x[tx] * 2.0
    else:
        y[tx - 64] = s[127 - tx]


@kernel
def write_after_arrive(x: Array[f32], y: Array[f32]):
    """The producers arrive first and write after: the barrier orders nothing of those writes."""
    s = shared(f32, 64)
    if tx < 64:
        bar_arrive(FULL, 128)
        s[tx] = x[tx] * 2.0
    else:
        bar_sync(FULL, 128)
        y[tx - 64] = s[127 - tx]


def _pipeline(EMPTY_WAIT):
    @kernel
    def pipeline(x: Array[f32], y: Array[f32], tiles: i32, EMPTY_WAIT: Const[bool]):
        """Producer warps 0-1 copy tile t of x into one buffer, consumer warps 2-3 add it into y reversed: FULL
        hands a tile over, EMPTY hands the buffer back (FlashAttention-3's producer / consumer loop, one stage)."""
        s = shared(f32, 64)
        acc = 0.0
        for t in range(tiles):
            if tx < 64:
                if EMPTY_WAIT and t > 0:
                    bar_sync(EMPTY, 128)
                s[tx] = x[t * 64 + tx]
                bar_arrive(FULL, 128)
            else:
                bar_sync(FULL, 128)
                acc += s[127 - tx]
                bar_arrive(EMPTY, 128)
        if tx >= 64:
            y[tx - 64] = acc
    return pipeline


@kernel
def short_of_threads(y: Array[f32]):
    if tx < 64:
        bar_sync(FULL, 128)   # 128 expected, 64 ever arrive
    y[tx] = 1.0


@kernel
def runtime_barrier_id(y: Array[f32], bar: i32):
    bar_sync(bar, 32)
    y[tx] = 1.0


@kernel
def reallocating(x: Array[f32], y: Array[f32]):
    """Warpgroup 0 gives registers away, warpgroup 1 takes them (as FlashAttention-3's producer and consumers)."""
    launch_bounds(256, 1)   # ptxas needs the register count at entry, or it drops setmaxnreg
    if tx < 128:
        setmaxnreg_dec(40)
    else:
        setmaxnreg_inc(232)
    y[tx] = x[tx] + 1.0


def test_a_named_barrier_hands_a_buffer_from_producer_to_consumer_warps():
    x = np.arange(64, dtype=np.float32)
    y = np.full(64, np.nan, np.float32)
    hand_over.simulate[1, 128](x, y)
    np.testing.assert_array_equal(y, 2.0 * x[::-1])


def test_without_the_barrier_the_consumers_read_races_with_the_producers_write():
    with pytest.raises(SharedMemoryRaceError, match=r"hand_over_unordered: block \(0, 0, 0\) thread \(64, 0, 0\).*"
                                                    r"data race on shared array 's' at index 63.*thread \(63, 0, 0\) "
                                                    r"wrote it.*nor a named barrier"):
        hand_over_unordered.simulate[1, 128](np.ones(64, np.float32), np.zeros(64, np.float32))


def test_a_write_after_bar_arrive_is_not_ordered_before_the_consumer():
    with pytest.raises(SharedMemoryRaceError, match=r"write_after_arrive: .*data race on shared array 's'"):
        write_after_arrive.simulate[1, 128](np.ones(64, np.float32), np.zeros(64, np.float32))


def test_the_producer_consumer_loop_matches_numpy_and_needs_its_empty_barrier():
    tiles = 5
    x = np.random.default_rng(0).standard_normal(64 * tiles).astype(np.float32)
    y = np.full(64, np.nan, np.float32)
    _pipeline(True).simulate[1, 128](x, y, tiles, EMPTY_WAIT=True)
    want = np.zeros(64, np.float32)
    for t in range(tiles):   # the consumer's float32 sums in the kernel's order
        want += x[t * 64:(t + 1) * 64][::-1]
    np.testing.assert_array_equal(y, want)
    # refilling the buffer before the consumers are done with it: the second tile's writes race with their reads
    with pytest.raises(SharedMemoryRaceError, match=r"pipeline: .*data race on shared array 's'"):
        _pipeline(False).simulate[1, 128](x, np.zeros(64, np.float32), tiles, EMPTY_WAIT=False)


def test_a_barrier_its_count_never_reaches_is_a_deadlock():
    with pytest.raises(SimulationError, match=r"(?s)short_of_threads: deadlock: threads wait on a "
                                              r"barrier that others never reach \(named barrier 1: 64 of 128 threads "
                                              r"arrived\).*test_kernel_named_barriers.py:\d+ \(bar\)"):
        short_of_threads.simulate[1, 128](np.zeros(128, np.float32))


def test_barrier_ids_and_counts_are_checked():
    with pytest.raises(KernelError, match=r"bar_sync: barrier id 0 is not in 1..15 \(0 is syncthreads\(\)'s\)"):
        @kernel
        def on_barrier_zero(y: Array[f32]):
            bar_sync(0, 32)
        on_barrier_zero.simulate[1, 32](np.zeros(32, np.float32))
    with pytest.raises(KernelError, match=r"bar_arrive: 48 threads is not a multiple of 32"):
        @kernel
        def odd_count(y: Array[f32]):
            bar_arrive(1, 48)
        odd_count.simulate[1, 64](np.zeros(64, np.float32))
    with pytest.raises(SimulationError, match=r"runtime_barrier_id: block \(0, 0, 0\) thread \(0, 0, 0\) at .*: "
                                              r"bar_sync/bar_arrive: barrier id 16 is not in 1..15"):
        runtime_barrier_id.simulate[1, 32](np.zeros(32, np.float32), 16)
    y = np.zeros(32, np.float32)
    runtime_barrier_id.simulate[1, 32](y, 3)
    assert (y == 1.0).all()


def test_syncthreads_and_named_barriers_mix():
    @kernel
    def two_groups(x: Array[f32], y: Array[f32]):
        """Each half of the block hands over inside itself on its own barrier, then a full barrier joins them."""
        s = shared(f32, 128)
        half = tx // 64
        s[tx] = x[tx]
        bar_sync(1 + half, 64)
        t = s[half * 64 + (63 - tx % 64)]
        syncthreads()
        s[tx] = t
        syncthreads()
        y[tx] = s[127 - tx]
    x = np.arange(128, dtype=np.float32)
    y = np.zeros(128, np.float32)
    two_groups.simulate[1, 128](x, y)
    want = np.concatenate([x[:64][::-1], x[64:][::-1]])[::-1]
    np.testing.assert_array_equal(y, want)


def test_named_barriers_become_ptx_bar_instructions_and_compile():
    source = hand_over.source
    assert 'asm volatile("bar.arrive %0, %1;" :: "r"((int)(1)), "r"((int)(128)) : "memory")' in source
    assert 'asm volatile("bar.sync %0, %1;" :: "r"((int)(1)), "r"((int)(128)) : "memory")' in source
    assert hand_over.compile("sm_80")[:4] == b"\x7fELF"   # named barriers are older than Hopper


def test_setmaxnreg_compiles_for_sm_90a_and_runs_as_a_no_op_in_the_simulator():
    source = reallocating.source
    assert 'setmaxnreg.dec.sync.aligned.u32 40;' in source and 'setmaxnreg.inc.sync.aligned.u32 232;' in source
    info = reallocating.inspect("sm_90")
    assert "for 'sm_90a'" in info["log"] and "C7508" not in info["log"]   # C7508: "'setmaxnreg' ignored"
    assert "setmaxnreg.dec.sync.aligned.u32 40" in info["ptx"]
    with pytest.raises(KernelError, match=r"reallocating: wgmma \(warpgroup MMA\), setmaxnreg, mbarriers or bulk "
                                          r"copies need a Hopper GPU \(sm_90a\); cannot compile for sm_80"):
        reallocating.compile("sm_80")
    x = np.arange(256, dtype=np.float32)
    y = np.zeros(256, np.float32)
    reallocating.simulate[1, 256](x, y)
    np.testing.assert_array_equal(y, x + 1.0)


@pytest.mark.parametrize("registers", [16, 100, 264])
def test_setmaxnreg_takes_a_multiple_of_8_in_range(registers):
    with pytest.raises(KernelError, match=rf"setmaxnreg_inc\({registers}\): registers must be a multiple of 8 in "
                                          r"24..256"):
        @kernel
        def bad(y: Array[f32], R: Const[int]):
            launch_bounds(32, 1)
            setmaxnreg_inc(R)
        bad.simulate[1, 32](np.zeros(32, np.float32), R=registers)


@pytest.mark.cuda
def test_gpu_producer_and_consumer_warps_match_numpy():
    import cupy as cp
    tiles = 7
    x = np.random.default_rng(1).standard_normal(64 * tiles).astype(np.float32)
    y = cp.full(64, cp.nan, cp.float32)
    hand_over[1, 128](cp.asarray(x[:64]), y)
    np.testing.assert_array_equal(cp.asnumpy(y), 2.0 * x[:64][::-1])
    want = np.zeros(64, np.float32)
    for t in range(tiles):
        want += x[t * 64:(t + 1) * 64][::-1]
    pipeline = _pipeline(True)
    for _ in range(20):   # a missing ordering would show as a wrong sum now and then
        y = cp.full(64, cp.nan, cp.float32)
        pipeline[1, 128](cp.asarray(x), y, tiles, EMPTY_WAIT=True)
        np.testing.assert_array_equal(cp.asnumpy(y), want)


def test_setmaxnreg_needs_both_launch_bounds():
    """Without launch_bounds(MAX_THREADS, MIN_BLOCKS) ptxas cannot tell the register count at entry and drops the
    instruction with a warning (C7508): the language refuses such a kernel instead."""
    @kernel
    def unbounded(y: Array[f32]):
        setmaxnreg_dec(40)

    @kernel
    def threads_bound_only(y: Array[f32]):
        launch_bounds(256)
        setmaxnreg_dec(40)
    for k in (unbounded, threads_bound_only):
        with pytest.raises(KernelError, match=r"setmaxnreg_dec\(\) needs launch_bounds\(MAX_THREADS, MIN_BLOCKS\) "
                                              r".*C7508"):
            k.simulate[1, 32](np.zeros(32, np.float32))


def test_reads_before_the_first_named_barrier_still_count():
    """Warps 0 and 2 read s[0]; warp 1, ordered after warp 0 only, then writes it: a race with warp 2's reads, though
    they came before any named barrier ran."""
    @kernel
    def late_writer(y: Array[f32]):
        s = shared(f32, 1)
        if tx < 32 or tx >= 64:
            y[tx] = s[0]
        if tx < 32:
            bar_arrive(1, 64)
        elif tx < 64:
            bar_sync(1, 64)
            if tx == 32:
                s[0] = 5.0
    with pytest.raises(SharedMemoryRaceError, match=r"thread \(32, 0, 0\) .*data race on shared array 's' at index 0: "
                                                    r"this thread writes it, and block \(0, 0, 0\) thread \(6[4-9]"):
        late_writer.simulate[1, 96](np.zeros(96, np.float32))


def test_a_warp_arrives_whole_even_with_exited_lanes():
    """PTX counts a warp's arrival as 32 threads: two warps complete a 64-thread barrier after some lanes exit."""
    @kernel
    def partly_exited(y: Array[f32]):
        if tx >= 40:
            return
        bar_sync(1, 64)
        y[tx] = 1.0
    y = np.zeros(64, np.float32)
    partly_exited.simulate[1, 64](y)
    assert (y[:40] == 1.0).all() and (y[40:] == 0.0).all()


def test_a_barrier_only_some_lanes_of_a_warp_reach_is_an_error():
    @kernel
    def divergent(y: Array[f32]):
        if tx % 2 == 0:
            bar_sync(1, 64)
        else:
            bar_sync(2, 64)
        y[tx] = 1.0
    with pytest.raises(SimulationError, match=r"divergent: deadlock: the live lanes of warp 0 wait at different "
                                              r"barriers or operations \(bar.sync and bar.arrive are .aligned"):
        divergent.simulate[1, 64](np.zeros(64, np.float32))


@device
def _wait_for_tile():
    bar_sync(FULL, 128)


def test_a_named_barrier_in_a_device_function_orders_the_kernel_too():
    @kernel
    def hand_over_through_a_call(x: Array[f32], y: Array[f32]):
        s = shared(f32, 64)
        if tx < 64:
            s[tx] = x[tx]
            bar_arrive(FULL, 128)
        else:
            _wait_for_tile()
            y[tx - 64] = s[127 - tx]
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    hand_over_through_a_call.simulate[1, 128](x, y)
    np.testing.assert_array_equal(y, x[::-1])


@kernel
def taking_turns(y: Array[f32], tiles: i32):
    """Warps 0 and 1 take turns (barriers 1 and 2, the ping-pong schedule of two warpgroups); warp 0 is slower, so
    warp 1 already waits when warp 0 hands over."""
    v = f32(tx)
    if warp == 1 and tiles > 1:
        bar_arrive(1, 64)
    for jt in range(1, tiles):
        bar_sync(1 + warp, 64)
        if warp == 0:
            for _ in range(3):
                v = shfl_xor(v, 1)
        y[tx] += 1.0
        if not (warp == 1 and jt == tiles - 1):
            bar_arrive(2 - warp, 64)
    y[tx] += v - v


def test_waiters_released_by_a_lower_warp_are_not_counted_again():
    """A barrier completed by warp 0's arrival released warp 1's waiting lanes; the same pass must not count them
    as arriving anew (which completed a later instance without them, and deadlocked this schedule)."""
    y = np.zeros(64, np.float32)
    taking_turns.simulate[1, 64](y, 5)
    np.testing.assert_array_equal(y, np.full(64, 4.0, np.float32))
