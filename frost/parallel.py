"""Structured concurrency for CPU-side work: Channel, finish, spawn and split.

Tasks are Python threads. Be honest about what that buys: threads run Python bytecode one at a
time under the GIL, so pure-Python loops (like the prime counter in examples/primes.py) are
*concurrent*, not faster. They run truly in parallel for work that releases the GIL (NumPy, image
decoding in Pillow, file reads, zlib, GPU copies and synchronization) and on free-threaded
(no-GIL) Python builds, where the same code scales with the cores.

    def count_primes(numbers, ch):
        ch << sum(1 for n in numbers if is_prime(n))

    ch = Channel(10)
    with finish():
        spawn(count_primes, split(range(250_000), 10), ch)
    print(ch.sum())   # 22044

Semantics chosen so that this reads naturally:

- A `finish()` block waits for every task spawned inside it (also tasks spawned by those tasks).
  When the block ends, every Channel that was passed as an argument to one of its tasks (or
  whose bound method is the task, as in `spawn(ch.send, x)`) is closed: all its senders are
  done, so consumers after the block (`ch.sum()`, `for x in ch`) see the end of the stream.
  Consume *inside* the block only with a known count of `recv()`s. The channel must hold what
  the tasks send (capacity >= number of sends) when nobody receives until the block ends.
- A task waiting on any channel (to send on a full one, or to receive from an empty open one), one it was
  given or one it captured in a closure, for longer than `finish(stuck_warning_s=)` seconds (by default
  STUCK_WARNING_S) makes finish warn, once per task, naming the task and the channel; when every running
  task waits so, one warning says the whole block is stuck. Only waits without a timeout count (a wait with
  one ends by itself). Finish closes only the channels its tasks were given: a captured channel stays open
  at the end and on a failure, so a task waiting on one can wait for ever; pass channels as arguments.
- On the first failure in a task (or in the block's own body), the finish block cancels the rest:
  it closes those channels at once, so that tasks blocked on them wake up (their `send`/`recv`
  raise `ChannelClosed`), waits for every task to end, and re-raises that first exception in the
  caller (also when the body itself then fails on a channel the cancellation closed). Tasks that
  compute without touching a channel cannot be interrupted; they may poll
  `cancelled()`. After a failure, no task waits forever on a channel it was given.
- `spawn` outside a finish block starts a detached task and returns a handle; `handle.join()`
  waits and re-raises the task's exception.
"""
from __future__ import annotations

import collections
import threading
import time
import warnings
from typing import Any, Callable, Iterator

__all__ = ["Channel", "ChannelClosed", "finish", "spawn", "split", "Split", "Task", "cancelled"]


class ChannelClosed(RuntimeError):
    """Raised by send() on a closed Channel, and by recv() on a closed and drained one."""


class Channel:
    """A bounded multi-producer multi-consumer queue with blocking send and recv."""

    def __init__(self, capacity: int = 1) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"Channel: capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._closed = False

    # ------------------------------------------------------------ sending
    def send(self, item: Any, timeout: float | None = None) -> None:
        """Put item in the channel, waiting while it is full; TimeoutError after `timeout` seconds."""
        with self._not_full:
            room = self._wait(self._not_full, lambda: self._closed or len(self._items) < self.capacity, timeout,
                              "send on")
            if not room:
                raise TimeoutError(f"Channel.send: still full (capacity {self.capacity}) after {timeout} s")
            if self._closed:
                raise ChannelClosed("Channel.send: the channel is closed")
            self._items.append(item)
            self._not_empty.notify()

    def __lshift__(self, item: Any) -> "Channel":
        self.send(item)
        return self

    # ------------------------------------------------------------ receiving
    def recv(self, timeout: float | None = None) -> Any:
        """Take the oldest item, waiting while the channel is empty.

        Raises ChannelClosed once the channel is closed and drained, TimeoutError after `timeout` s."""
        with self._not_empty:
            ready = self._wait(self._not_empty, lambda: self._closed or self._items, timeout, "receive from")
            if not ready:
                raise TimeoutError(f"Channel.recv: still empty after {timeout} s")
            if not self._items:
                raise ChannelClosed("Channel.recv: the channel is closed and empty")
            item = self._items.popleft()
            self._not_full.notify()
            return item

    def __iter__(self) -> Iterator[Any]:
        """Yield items until the channel is closed and drained."""
        while True:
            try:
                yield self.recv()
            except ChannelClosed:
                return

    def sum(self, start: Any = 0) -> Any:
        """Receive everything until the channel is closed and drained; return the total."""
        total = start
        for item in self:
            total = total + item
        return total

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        """Close the channel and wake every blocked sender and receiver. Idempotent."""
        with self._lock:
            self._closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        """Items waiting in the channel now."""
        return len(self._items)

    def __bool__(self) -> bool:
        return True  # a channel is a channel even when empty (len() alone would make it falsy)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Channel(capacity={self.capacity}, items={len(self._items)}, {state})"

    def _wait(self, cond: threading.Condition, ready: Callable[[], Any], timeout: float | None, action: str) -> bool:
        if timeout is not None:
            return cond.wait_for(ready, timeout)
        if ready():
            return True
        me = threading.get_ident()
        _waiting[me] = _Wait(self, action, time.monotonic())  # finish() reads it: a task that may wait for ever
        try:
            while not ready():
                cond.wait()
        finally:
            del _waiting[me]
        return True


class _Wait:
    """A thread waiting on a channel without a timeout: which channel, to do what ('send on', 'receive from'),
    since when (time.monotonic())."""

    __slots__ = ("channel", "action", "since")

    def __init__(self, channel: Channel, action: str, since: float) -> None:
        self.channel, self.action, self.since = channel, action, since


_waiting: dict[int, _Wait] = {}  # thread ident -> its wait on a channel, while it waits (single dict ops: atomic)


# ---------------------------------------------------------------- split
class Split:
    """A sequence cut into n contiguous chunks (made by split()); spawn runs one task per chunk."""

    def __init__(self, seq: Any, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"split: n must be a positive int, got {n!r}")
        self.seq, self.n = seq, n
        self.length = len(seq)

    def bounds(self, i: int) -> tuple[int, int]:
        """[start, stop) of chunk i: the first length % n chunks hold one extra item."""
        size, extra = divmod(self.length, self.n)
        start = i * size + min(i, extra)
        return start, start + size + (1 if i < extra else 0)

    def __getitem__(self, i: int) -> Any:
        if not -self.n <= i < self.n:
            raise IndexError(f"split: chunk {i} out of range for {self.n} chunks")
        start, stop = self.bounds(i % self.n)
        return self.seq[start:stop]

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(self.n))

    def __repr__(self) -> str:
        return f"split({type(self.seq).__name__} of {self.length}, {self.n})"


def split(seq: Any, n: int) -> Split:
    """Cut seq (list, range, NumPy array, frost Tensor: anything with len and slicing) into n
    contiguous chunks; sizes differ by at most one, and some are empty when len(seq) < n."""
    return Split(seq, n)


# ---------------------------------------------------------------- tasks
class Task:
    """A handle on spawned thread(s); join() waits for them and re-raises the first failure."""

    def __init__(self, threads: list[threading.Thread], errors: list[BaseException]) -> None:
        self._threads, self._errors = threads, errors

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise TimeoutError(f"Task.join: {t.name} still running after {timeout} s")
        if self._errors:
            raise self._errors[0]

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)


class _Scope:
    """The bookkeeping of one finish() block."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.channels: dict[int, Channel] = {}
        self.error: BaseException | None = None
        self.cancelled = threading.Event()

    def add(self, thread: threading.Thread, channels: list[Channel]) -> None:
        with self.lock:
            self.threads.append(thread)
            for ch in channels:
                self.channels[id(ch)] = ch
            cancel_now = self.cancelled.is_set()
        if cancel_now:  # spawned after a failure: its channels must not stay open
            self.close_channels()

    def fail(self, error: BaseException) -> None:
        with self.lock:
            first = self.error is None and not self.cancelled.is_set()
            if first:
                self.error = error
            self.cancelled.set()
        if first:
            self.close_channels()

    def close_channels(self) -> None:
        with self.lock:
            channels = list(self.channels.values())
        for ch in channels:
            ch.close()

    def join_all(self, stuck_after: float) -> None:
        """Join every thread, including those spawned while joining; warn about tasks stuck on a channel."""
        watch = _StuckWatch(stuck_after)
        while True:
            with self.lock:
                pending = [t for t in self.threads if t.is_alive()]
                given = set(self.channels)
            if not pending:
                return
            pending[0].join(0.1)  # short waits keep Ctrl-C responsive in the main thread
            watch.check(pending, given)


class _StuckWatch:
    """The warnings of a finish block about its tasks waiting on channels for more than `after` seconds: one per
    task, or one for the whole block when every running task waits (and has waited that long)."""

    def __init__(self, after: float) -> None:
        self.after = after
        self.warned: set[threading.Thread] = set()
        self.warned_block = False

    def check(self, pending: list[threading.Thread], given: set[int]) -> None:
        now = time.monotonic()
        waits = {t: _waiting.get(t.ident) for t in pending}
        if all(waits.values()):  # every running task waits: the block cannot end unless someone outside acts
            if not self.warned_block and now - max(w.since for w in waits.values()) > self.after:
                self.warned_block = True
                self.warned.update(pending)
                warnings.warn(_block_stuck(waits, given, self.after), RuntimeWarning, stacklevel=4)
            return
        for task, wait in waits.items():
            if wait is not None and task not in self.warned and now - wait.since > self.after:
                self.warned.add(task)
                warnings.warn(f"finish: task {task.name} has waited {self.after:g} s to {wait.action} "
                              f"{wait.channel!r}{_captured(wait, given)} while the block waits for it to end; "
                              f"{_ADVICE[wait.action]}", RuntimeWarning, stacklevel=4)


_ADVICE = {"send on": "give a channel room for everything sent (Channel(capacity)) or receive from it",
           "receive from": "send to a channel that tasks read, or close it (ch.close()) once its last item is sent"}


def _captured(wait: _Wait, given: set[int]) -> str:
    """Words for a channel that no task of the block got as an argument: finish never closes it."""
    if id(wait.channel) in given:
        return ""
    return (" (a channel it captured, not one passed to spawn: finish does not close it at the end or on a failure; "
            "pass it as an argument)")


def _block_stuck(waits: dict[threading.Thread, _Wait], given: set[int], after: float) -> str:
    """The warning for a block whose running tasks all wait on channels, naming each task and its channel."""
    senders = sum(w.action == "send on" for w in waits.values())
    receivers = len(waits) - senders
    advice = [_ADVICE[action] for action, count in (("send on", senders), ("receive from", receivers)) if count]
    tasks = [f"{t.name} to {w.action} {w.channel!r}{_captured(w, given)}" for t, w in list(waits.items())[:4]]
    more = f" and {len(waits) - 4} more" if len(waits) > 4 else ""
    return (f"finish: all {len(waits)} running task(s) have waited {after:g} s on channels ({senders} to send on a "
            f"full one, {receivers} to receive from an empty open one) while the block waits for them to end: "
            f"{'; '.join(tasks)}{more}. To fix: " + "; ".join(advice))


STUCK_WARNING_S = 5.0
_local = threading.local()


def _current_scope() -> _Scope | None:
    stack = getattr(_local, "scopes", None)
    return stack[-1] if stack else None


class finish:
    """Context manager: wait for every task spawned inside; on the first failure cancel the rest
    (close the Channels passed to them) and re-raise that failure here. A task waiting on a channel for more
    than stuck_warning_s seconds (None: STUCK_WARNING_S) is reported by a RuntimeWarning. See the module
    docstring."""

    def __init__(self, stuck_warning_s: float | None = None) -> None:
        if stuck_warning_s is not None and (isinstance(stuck_warning_s, bool) or
                                            not isinstance(stuck_warning_s, (int, float)) or stuck_warning_s < 0):
            raise ValueError(f"finish: stuck_warning_s must be a number of seconds >= 0, got {stuck_warning_s!r}")
        self.stuck_warning_s = stuck_warning_s

    def __enter__(self) -> "finish":
        self._scope = _Scope()
        if not hasattr(_local, "scopes"):
            _local.scopes = []
        _local.scopes.append(self._scope)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        scope = self._scope
        try:
            if exc is not None:
                scope.fail(exc)
            try:
                scope.join_all(STUCK_WARNING_S if self.stuck_warning_s is None else self.stuck_warning_s)
            except BaseException as interrupt:  # Ctrl-C while waiting: cancel, then give up waiting
                scope.fail(interrupt)
                raise
        finally:
            _local.scopes.pop()
            scope.close_channels()
        if exc is not None:
            if isinstance(exc, ChannelClosed) and scope.error is not None and scope.error is not exc:
                raise scope.error from exc  # the body used a channel that a task's failure closed: that failure
            return False  # the body's own exception propagates
        if scope.error is not None:
            raise scope.error
        return False

    def cancelled(self) -> bool:
        return self._scope.cancelled.is_set()


def cancelled() -> bool:
    """True when the finish block the calling task belongs to has been cancelled by a failure."""
    scope = _current_scope()
    return scope is not None and scope.cancelled.is_set()


_task_counter = iter(range(1, 1 << 62))


def _channels_in(fn: Callable, args: tuple, kwargs: dict) -> list[Channel]:
    """The channels a task holds: its Channel arguments, and the channel of a bound `ch.send`."""
    owner = [fn.__self__] if isinstance(getattr(fn, "__self__", None), Channel) else []
    return owner + [a for a in (*args, *kwargs.values()) if isinstance(a, Channel)]


def spawn(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Task:
    """Run fn(*args, **kwargs) on a new thread. An argument made by split(seq, n) makes n threads,
    thread i getting chunk i (several split arguments must have the same n). Inside a finish block
    the threads belong to it; outside, join the returned Task."""
    splits = [a for a in (*args, *kwargs.values()) if isinstance(a, Split)]
    counts = {s.n for s in splits}
    if len(counts) > 1:
        raise ValueError(f"spawn: split arguments disagree on the number of chunks: {sorted(counts)}")
    n = counts.pop() if counts else 1

    def chunk_args(i: int) -> tuple[tuple, dict]:
        pick = lambda a: a[i] if isinstance(a, Split) else a  # noqa: E731
        return tuple(pick(a) for a in args), {k: pick(v) for k, v in kwargs.items()}

    scope = _current_scope()
    channels = _channels_in(fn, args, kwargs)
    errors: list[BaseException] = []
    threads = []
    for i in range(n):
        a, kw = chunk_args(i)
        name = f"frost-task-{next(_task_counter)}-{getattr(fn, '__name__', 'fn')}"
        threads.append(threading.Thread(target=_run_task, args=(fn, a, kw, scope, errors), name=name, daemon=True))
    for t in threads:
        if scope is not None:
            scope.add(t, channels)
        t.start()
    return Task(threads, errors)


def _run_task(fn: Callable, args: tuple, kwargs: dict, scope: _Scope | None, errors: list) -> None:
    _local.scopes = [scope] if scope is not None else []  # nested spawns join the same finish
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - re-raised in the caller of finish/join
        if scope is not None and scope.cancelled.is_set() and isinstance(e, ChannelClosed):
            return  # woken by the cancellation itself: not a new failure
        if hasattr(e, "add_note"):
            e.add_note(f"(raised in task {threading.current_thread().name})")
        errors.append(e)
        if scope is not None:
            scope.fail(e)
