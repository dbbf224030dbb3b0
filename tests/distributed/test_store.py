import contextlib
import socket
import struct
import threading
import time

import pytest

from frost.distributed import StoreError, TCPStore


@contextlib.contextmanager
def _master_and_client(master_timeout: float, client_timeout: float):
    """A master store on a free port and one client of it, both closed at the end (also when the test fails)."""
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=master_timeout)
    client = TCPStore("127.0.0.1", master.port, is_master=False, timeout=client_timeout)
    try:
        yield master, client
    finally:
        client.close()
        master.close()


def test_a_value_set_by_one_process_reaches_the_others():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=10)
    clients = [TCPStore("127.0.0.1", master.port, is_master=False, timeout=10) for _ in range(2)]
    got = []
    waiter = threading.Thread(target=lambda: got.append(clients[0].get("id")))
    waiter.start()  # get() waits until somebody sets the key
    clients[1].set("id", b"\x00\xffunique")
    waiter.join(10)
    assert got == [b"\x00\xffunique"]
    assert master.get("id") == b"\x00\xffunique"
    master.set("other", b"x")
    assert clients[1].get("other") == b"x"
    for store in (*clients, master):
        store.close()


def test_a_key_nobody_sets_times_out_with_its_name():
    with _master_and_client(0.3, 0.3) as (master, client):
        with pytest.raises(StoreError, match="'never'"):
            client.get("never")
        with pytest.raises(StoreError, match="'never'"):
            master.get("never")


def test_no_master_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, is_master=False, timeout=0.5)


def test_a_stray_peer_cannot_make_the_server_allocate_much():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    with socket.create_connection(("127.0.0.1", master.port)) as stray:
        stray.sendall(b"S" + struct.pack(">I", 2 ** 31))  # claims a 2 GiB key
        stray.settimeout(5)
        assert stray.recv(1) == b""  # dropped, nothing allocated
    client = TCPStore("127.0.0.1", master.port, is_master=False, timeout=5)
    client.set("still", b"served")
    assert master.get("still") == b"served"
    client.close()
    master.close()


def test_close_frees_the_port_and_fails_pending_gets_at_once():
    failed = []
    with _master_and_client(30, 30) as (master, client):
        def wait_for_a_key_nobody_sets():
            start = time.monotonic()
            with pytest.raises((ConnectionError, StoreError)):
                client.get("never")
            failed.append(time.monotonic() - start)
        waiter = threading.Thread(target=wait_for_a_key_nobody_sets)
        waiter.start()
        time.sleep(0.3)  # the get is waiting on the server
        master.close()
        waiter.join(10)
        assert failed and failed[0] < 5  # not the 30 s timeout
    again = TCPStore("127.0.0.1", master.port, is_master=True, timeout=5)  # init, destroy, init on one port
    again.close()


def test_a_timed_out_get_does_not_answer_the_next_one():
    with _master_and_client(5, 0.3) as (master, client):
        with pytest.raises(StoreError, match="'late'"):
            client.get("late")
        master.set("late", b"late value")  # the server now answers the get that timed out
        master.set("next", b"next value")
        assert client.get("next") == b"next value"
