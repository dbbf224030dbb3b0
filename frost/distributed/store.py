"""A small key-value store over TCP, served by rank 0, for what processes must agree on before they can talk
(NCCL's unique id; the launcher's nodes). Keys and values are bytes; nothing read from the socket is unpickled.

Wire format, both directions: a 1-byte command, then length-prefixed fields (4-byte big-endian length, bytes).
    S key value -> b"ok"        set
    G key       -> value        get, waiting until some process sets the key
"""
from __future__ import annotations

import socket
import struct
import threading
import time

MAX_FIELD = 1 << 20  # keys and values are ids and small messages: a larger length is a stray or hostile peer


class StoreError(RuntimeError):
    pass


def _send(sock: socket.socket, *fields: bytes) -> None:
    sock.sendall(b"".join(struct.pack(">I", len(f)) + f for f in fields))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("store: peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv_field(sock: socket.socket) -> bytes:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_FIELD:
        raise StoreError(f"store: a field of {n} bytes (at most {MAX_FIELD}); not a frost store peer?")
    return _recv_exact(sock, n)


def connect_with_retries(host: str, port: int, timeout: float, poll_s: float) -> socket.socket:
    """A connection to host:port, tried every poll_s seconds until `timeout` seconds have passed (the listening side
    may start later); then the last attempt's OSError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=min(5.0, timeout))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(poll_s)


class _Server:
    """Rank 0's side: one thread per connection; get() waits on a condition until the key is set."""

    def __init__(self, host: str, port: int) -> None:
        self.values: dict[bytes, bytes] = {}
        self.changed = threading.Condition()
        self.closed = False
        self.connections: set[socket.socket] = set()
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="frost-store").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.changed:
                if self.closed:
                    conn.close()
                    return
                self.connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    command = conn.recv(1)
                    if not command:
                        return
                    key = _recv_field(conn)
                    if command == b"S":
                        self.set(key, _recv_field(conn))
                        _send(conn, b"ok")
                    elif command == b"G":
                        _send(conn, self.get(key, timeout=None))
                    else:
                        return  # not our protocol: drop the peer
            except (ConnectionError, StoreError, OSError):
                return
            finally:
                with self.changed:
                    self.connections.discard(conn)

    def set(self, key: bytes, value: bytes) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def get(self, key: bytes, timeout: float | None) -> bytes:
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values or self.closed, timeout):
                raise StoreError(f"store: key {key.decode(errors='replace')!r} not set within {timeout} s")
            if key not in self.values:
                raise StoreError(f"store: closed while waiting for key {key.decode(errors='replace')!r}")
            return self.values[key]

    def close(self) -> None:
        """Stop serving: the port is free again at once and every client's pending get() fails now, not at
        its timeout. (Closing alone would leave the accept() of the serving thread listening on the port.)"""
        with self.changed:
            self.closed = True
            self.changed.notify_all()
            connections = list(self.connections)
        for sock in [self.listener, *connections]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected (any more)
            sock.close()


class TCPStore:
    """set(key, value) / get(key) shared by all ranks; the master (rank 0) serves it on host:port.

    Clients retry the connection until `timeout` seconds have passed (rank 0 may start later than the others);
    get() waits at most `timeout` seconds for a key."""

    def __init__(self, host: str, port: int, is_master: bool, timeout: float = 300.0) -> None:
        self.timeout, self._host = timeout, host
        self._server = _Server(host, port) if is_master else None
        self.port = self._server.port if self._server else port
        self._sock = None if is_master else self._connect(host, port, timeout)
        self._lock = threading.Lock()

    @staticmethod
    def _connect(host: str, port: int, timeout: float) -> socket.socket:
        try:
            sock = connect_with_retries(host, port, timeout, poll_s=0.1)
        except OSError as e:
            raise StoreError(f"store: could not reach rank 0's store at {host}:{port} within {timeout} s "
                             f"({e}); is MASTER_ADDR/MASTER_PORT right and rank 0 running?") from e
        sock.settimeout(timeout)
        return sock

    def set(self, key: str, value: bytes) -> None:
        if self._server is not None:
            self._server.set(key.encode(), value)
            return
        with self._lock:
            self._sock.sendall(b"S")
            _send(self._sock, key.encode(), value)
            _recv_field(self._sock)

    def get(self, key: str) -> bytes:
        if self._server is not None:
            return self._server.get(key.encode(), self.timeout)
        with self._lock:
            self._sock.sendall(b"G")
            _send(self._sock, key.encode())
            try:
                return _recv_field(self._sock)
            except socket.timeout as e:
                # the server still owes this answer: on this connection it would be read as the next request's
                self._sock.close()
                self._sock = self._connect(self._host, self.port, self.timeout)
                raise StoreError(f"store: key {key!r} not set within {self.timeout} s") from e

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._sock is not None:
            self._sock.close()
