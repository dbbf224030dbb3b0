"""Tests for frost/parallel.py: Channel, finish, spawn, split."""
import importlib.util
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import frost
from frost.parallel import Channel, ChannelClosed, cancelled, finish, spawn, split

pytestmark = pytest.mark.timeout(20)


# ---------------------------------------------------------------- Channel
def test_send_recv_fifo_and_lshift():
    ch = Channel(3)
    ch << 1 << 2
    ch.send(3)
    assert len(ch) == 3
    assert [ch.recv(), ch.recv(), ch.recv()] == [1, 2, 3]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        Channel(0)


def test_timeouts():
    ch = Channel(1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="still empty"):
        ch.recv(timeout=0.05)
    ch.send("x")
    with pytest.raises(TimeoutError, match=r"still full \(capacity 1\)"):
        ch.send("y", timeout=0.05)
    assert time.monotonic() - t0 < 2
    assert ch.recv(timeout=0.05) == "x"


def test_close_semantics():
    ch = Channel(4)
    ch << 1 << 2
    ch.close()
    assert ch.closed
    with pytest.raises(ChannelClosed, match="send: the channel is closed"):
        ch.send(3)
    assert list(ch) == [1, 2]  # drains what was sent before close
    with pytest.raises(ChannelClosed, match="closed and empty"):
        ch.recv()
    ch.close()  # idempotent


def test_sum_consumes_until_close():
    ch = Channel(2)

    def produce():
        for i in range(100):
            ch.send(i)
        ch.close()

    t = spawn(produce)
    assert ch.sum() == sum(range(100))
    t.join()


def test_many_producers_and_consumers_lose_and_duplicate_nothing():
    ch = Channel(3)
    producers, consumers, per_producer = 8, 6, 500
    received = [[] for _ in range(consumers)]

    def produce(p):
        for i in range(per_producer):
            ch.send((p, i))

    def consume(k):
        for item in ch:
            received[k].append(item)

    cons = [threading.Thread(target=consume, args=(k,)) for k in range(consumers)]
    prods = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in cons + prods:
        t.start()
    for t in prods:
        t.join()
    ch.close()
    for t in cons:
        t.join(5)
        assert not t.is_alive()
    everything = [x for r in received for x in r]
    counts = Counter(everything)
    assert len(everything) == producers * per_producer
    assert set(counts.values()) == {1}
    assert set(counts) == {(p, i) for p in range(producers) for i in range(per_producer)}
    # each consumer sees each producer's items in the order they were sent
    for r in received:
        for p in range(producers):
            seq = [i for q, i in r if q == p]
            assert seq == sorted(seq)


def test_close_wakes_every_blocked_sender_and_receiver():
    empty, full = Channel(1), Channel(1)
    full.send(0)
    outcomes = []
    lock = threading.Lock()

    def wait(fn):
        try:
            fn()
            outcome = "returned"
        except ChannelClosed:
            outcome = "closed"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=wait, args=(empty.recv,)) for _ in range(5)]
    threads += [threading.Thread(target=wait, args=(lambda: full.send(1),)) for _ in range(5)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert len(outcomes) == 0  # all blocked
    empty.close()
    full.close()
    for t in threads:
        t.join(2)
        assert not t.is_alive()
    assert outcomes == ["closed"] * 10


# ---------------------------------------------------------------- split
def test_split_list_range_numpy_tensor():
    chunks = list(split(list(range(10)), 3))
    assert chunks == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [list(c) for c in split(range(5), 5)] == [[0], [1], [2], [3], [4]]
    assert [len(c) for c in split(range(2), 4)] == [1, 1, 0, 0]
    arr = np.arange(11)
    parts = list(split(arr, 4))
    np.testing.assert_array_equal(np.concatenate(parts), arr)
    assert [len(p) for p in parts] == [3, 3, 3, 2]
    assert np.shares_memory(parts[0], arr)  # views, no copies
    t = frost.arange(7)
    tparts = list(split(t, 2))
    assert isinstance(tparts[0], frost.Tensor)
    assert [p.tolist() for p in tparts] == [[0, 1, 2, 3], [4, 5, 6]]
    with pytest.raises(ValueError, match="n must be a positive int"):
        split([1], 0)


# ---------------------------------------------------------------- finish / spawn
def test_spawn_split_runs_each_chunk_on_its_own_thread():
    ch = Channel(4)
    with finish():
        spawn(lambda chunk, out: out.send((threading.get_ident(), list(chunk))), split(range(10), 4), ch)
    got = list(ch)
    assert sorted(c for _, c in got) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert len({tid for tid, _ in got}) == 4 or len(got) == 4


def test_finish_closes_its_channels_at_the_end():
    ch = Channel(3)
    with finish():
        spawn(ch.send, 5)
        spawn(ch.send, 6)
    assert ch.closed
    assert ch.sum() == 11


def test_finish_waits_for_nested_spawns():
    results = []

    def parent():
        time.sleep(0.05)
        spawn(lambda: (time.sleep(0.1), results.append("child")))

    with finish():
        spawn(parent)
    assert results == ["child"]


def test_finish_reraises_first_failure_and_cancels_blocked_tasks():
    ch = Channel(1)
    woke = []

    def blocked_receiver():
        try:
            ch.recv()
        except ChannelClosed:
            woke.append(True)
            raise

    def failing():
        time.sleep(0.05)
        raise ValueError("boom in task")

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="boom in task") as info:
        with finish():
            for _ in range(3):
                spawn(blocked_receiver)
            spawn(ch.send, 1)  # fills the channel
            spawn(ch.send, 2)  # blocks: nobody... (one receiver takes 1)
            spawn(failing)
    assert time.monotonic() - t0 < 5
    assert ch.closed
    assert "failing" in "".join(getattr(info.value, "__notes__", []))
    # the cancellation's ChannelClosed in woken tasks is not reported instead of the real error
    assert not isinstance(info.value, ChannelClosed)


def test_finish_body_exception_cancels_tasks():
    ch = Channel(1)
    with pytest.raises(KeyError):
        with finish():
            spawn(ch.recv)  # would block forever without cancellation
            raise KeyError("body")
    assert ch.closed


def test_cancelled_is_visible_to_computing_tasks():
    seen = []

    def poller():
        while not cancelled():
            time.sleep(0.01)
        seen.append("stopped")

    with pytest.raises(RuntimeError, match="stop everyone"):
        with finish():
            spawn(poller)
            spawn(lambda: (_ for _ in ()).throw(RuntimeError("stop everyone")))
    assert seen == ["stopped"]


def test_standalone_spawn_join_reraises():
    def bad(x):
        raise ZeroDivisionError(f"bad {x}")

    task = spawn(bad, 3)
    with pytest.raises(ZeroDivisionError, match="bad 3"):
        task.join()
    ok = spawn(time.sleep, 0.01)
    ok.join(timeout=5)
    assert ok.done()


def test_split_arguments_must_agree():
    with pytest.raises(ValueError, match="disagree on the number of chunks"):
        spawn(print, split([1, 2], 2), split([1, 2, 3], 3))


def test_primes_example_gives_22044():
    path = Path(__file__).parents[1] / "examples" / "primes.py"
    spec = importlib.util.spec_from_file_location("primes_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main() == 22044


def test_finish_warns_when_every_task_waits_on_a_full_channel(monkeypatch):
    import frost.parallel as parallel
    monkeypatch.setattr(parallel, "STUCK_WARNING_S", 0.2)
    ch = Channel(1)
    drained = []

    def drain_later():  # an outside consumer that frees the block after the warning
        time.sleep(1.0)
        drained.extend(ch.recv() for _ in range(3))

    helper = threading.Thread(target=drain_later)
    helper.start()
    with pytest.warns(RuntimeWarning, match=r"all \d running task\(s\) have waited 0.2 s on channels \(\d to send on a "
                                             r"full one, 0 to receive .*give a channel room"):
        with finish():
            for i in range(3):
                spawn(ch.send, i)
    helper.join()
    assert sorted(drained) == [0, 1, 2]


def test_finish_warns_when_every_task_waits_on_a_channel_the_body_never_closed(monkeypatch):
    """The fan-out whose body forgets jobs.close(): the workers wait to receive for ever; finish says so."""
    import frost.parallel as parallel
    monkeypatch.setattr(parallel, "STUCK_WARNING_S", 0.2)
    jobs, done = Channel(4), []

    def worker(jobs):
        done.extend(j * j for j in jobs)

    def close_later():  # frees the block after the warning, as the body should have
        time.sleep(1.0)
        jobs.close()

    helper = threading.Thread(target=close_later)
    with pytest.warns(RuntimeWarning, match=r"all 2 running task\(s\) have waited 0.2 s on channels \(0 to send on a "
                                             r"full one, 2 to receive from an empty open one\).*\(ch.close\(\)\)"):
        with finish():
            spawn(worker, jobs)
            spawn(worker, jobs)
            for j in range(3):
                jobs.send(j)
            helper.start()
    helper.join()
    assert sorted(done) == [0, 1, 4]


def test_a_task_failure_is_raised_when_the_body_then_fails_on_a_closed_channel():
    """The body receives from a channel whose producer failed: cancellation closes it, the body's recv raises
    ChannelClosed, and the caller gets the producer's error (with the ChannelClosed as its cause)."""
    def producer(ch):
        ch.send(1)
        raise ValueError("producer failed")

    ch = Channel(4)
    with pytest.raises(ValueError, match="producer failed") as caught:
        with finish():
            spawn(producer, ch)
            assert ch.recv() == 1
            ch.recv()  # the producer fails instead of sending a second item
    assert isinstance(caught.value.__cause__, ChannelClosed)


def test_finish_warns_about_a_task_waiting_on_a_channel_it_captured(monkeypatch):
    """The channel is not an argument, so finish neither closes it nor, before, saw the wait: the block waited for
    ever without a word. Another task runs on meanwhile, so the whole block is not stuck: the warning names the task."""
    import frost.parallel as parallel
    monkeypatch.setattr(parallel, "STUCK_WARNING_S", 0.2)
    gate, free = Channel(1), threading.Event()

    def waiter():
        gate.recv()

    def busy():
        free.wait()  # no channel: not a wait finish reports

    def release_later():
        time.sleep(1.0)
        free.set()
        gate.send("go")

    helper = threading.Thread(target=release_later)
    helper.start()
    with pytest.warns(RuntimeWarning, match=r"finish: task frost-task-\d+-waiter has waited 0.2 s to receive from "
                                             r"Channel\(capacity=1, items=0, open\) \(a channel it captured, not one "
                                             r"passed to spawn: .*\) while the block waits for it to end; send to a "
                                             r"channel that tasks read, or close it") as caught:
        with finish():
            spawn(waiter)
            spawn(busy)
    helper.join()
    assert len([w for w in caught if "finish:" in str(w.message)]) == 1  # once per task


def test_finish_warns_when_its_only_task_waits_on_a_captured_channel():
    """The issue's case: a task blocked on a channel it captured is the whole block; the warning names it."""
    results = Channel(1)
    results.send("full")

    def produce():
        results.send("second")  # nobody receives until the block ends, and the channel holds one

    def drain_later():
        time.sleep(1.0)
        results.recv()

    helper = threading.Thread(target=drain_later)
    helper.start()
    with pytest.warns(RuntimeWarning, match=r"all 1 running task\(s\) have waited 0.2 s on channels \(1 to send on a "
                                             r"full one, 0 to receive from an empty open one\) while the block waits "
                                             r"for them to end: frost-task-\d+-produce to send on Channel\(capacity=1, "
                                             r"items=1, open\) \(a channel it captured.*give a channel room"):
        with finish(stuck_warning_s=0.2):
            spawn(produce)
    helper.join()
    assert results.recv() == "second"


def test_finish_does_not_warn_about_a_pipeline_that_flows():
    """Each wait counts on its own: a consumer that waits often, but briefly, is not stuck."""
    items, got = Channel(1), []

    def produce():
        for i in range(40):  # 0.8 s in all, more than the threshold; each wait far less
            time.sleep(0.02)
            items.send(i)
        items.close()

    def consume():
        got.extend(items)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        with finish(stuck_warning_s=0.5):
            spawn(produce)
            spawn(consume)
    assert got == list(range(40))


@pytest.mark.parametrize("bad", [-1, "5", True])
def test_finish_stuck_warning_s_must_be_seconds(bad):
    with pytest.raises(ValueError, match=r"finish: stuck_warning_s must be a number of seconds >= 0"):
        finish(stuck_warning_s=bad)
