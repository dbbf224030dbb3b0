"""`frost run`: torchrun's variables in every process, a failing process stops the rest (never a hang), two
"nodes" on loopback, and the MPI launcher."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from dist_launch import ROOT, frost_run
from frost import cli
from frost.distributed import run


def free_port() -> int:
    """A port p with p + 1 also free (the launchers' link uses MASTER_PORT + 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two free ports in a row")


def script(tmp_path, body: str):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


ENV_SCRIPT = """
    import json, os, sys
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "NCCL_NVLS_ENABLE"]
    sys.stdout.write(json.dumps({k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}) + "\\n")  # one write
"""


def test_every_process_gets_torchruns_variables(tmp_path):
    port = free_port()
    done = frost_run("--launcher", "native", "--nproc-per-node", 3, "--master-port", port,
                     script(tmp_path, ENV_SCRIPT), "--lr", "3e-4")
    assert done.returncode == 0, done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda e: int(e["RANK"]))
    assert seen == [{"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
                     "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                     "NCCL_NVLS_ENABLE": "0", "argv": ["--lr", "3e-4"]} for r in range(3)]


def test_the_mpi_launcher_sets_the_same_variables(tmp_path, needs_mpi):
    done = frost_run("--launcher", "mpi", "--nproc-per-node", 2, script(tmp_path, ENV_SCRIPT))
    assert done.returncode == 0, done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                  key=lambda e: int(e["RANK"]))
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in seen] == [("0", "0", "2"), ("1", "1", "2")]


FAILING = """
    import os, signal, time
    if os.environ["RANK"] == "1":
        time.sleep(0.5)
        {failure}
    time.sleep(600)  # the survivor would wait for ever (in a real job: in its next collective)
"""


@pytest.mark.parametrize("failure, status, message", [
    ("raise ValueError('rank one gives up')", 1, "ValueError: rank one gives up"),
    ("os.kill(os.getpid(), signal.SIGKILL)", 128 + 9, "signal SIGKILL")])
def test_a_failing_process_stops_the_others(tmp_path, failure, status, message):
    start = time.monotonic()
    done = frost_run("--launcher", "native", "--nproc-per-node", 3, "--master-port", free_port(),
                     script(tmp_path, FAILING.format(failure=failure)), timeout=60)
    assert time.monotonic() - start < 30
    assert done.returncode == status
    assert message in done.stderr
    assert "rank 1" in done.stderr


def test_a_failing_mpi_rank_stops_the_others(tmp_path, needs_mpi):
    body = """
        import frost.distributed as dist
        dist.init_process_group("mpi")
        if dist.get_rank() == 1:
            raise ValueError("rank one gives up")
        dist.barrier()  # never completes: rank 1 is gone
    """
    start = time.monotonic()
    done = frost_run("--launcher", "mpi", "--nproc-per-node", 3, script(tmp_path, body), timeout=90)
    assert time.monotonic() - start < 60
    assert done.returncode != 0
    assert "ValueError: rank one gives up" in done.stderr


def launch_node(job, node_rank: int, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "frost.distributed.run", "--launcher", "native", "--nnodes", "2",
                             "--node-rank", str(node_rank), "--nproc-per-node", "2", "--master-port", str(port),
                             str(job)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_nodes_on_loopback_meet_through_the_store(tmp_path):
    body = """
        import os
        import sys
        from frost.distributed import TCPStore
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=rank == 0, timeout=60)
        store.set(f"rank{rank}", os.environ["GROUP_RANK"].encode())
        # one write of the whole line: the launcher runs ranks unbuffered (PYTHONUNBUFFERED=1), where print's pieces
        # are separate writes that two ranks sharing the node's pipe interleave
        sys.stdout.write(f"{rank} {[store.get(f'rank{r}').decode() for r in range(world)]}\\n")
        store.set(f"done{rank}", b"1")
        if rank == 0:  # the server lives in rank 0: it stays until everybody has read
            [store.get(f"done{r}") for r in range(world)]
    """
    job, port = script(tmp_path, body), free_port()
    nodes = [launch_node(job, n, port) for n in (1, 0)]
    outputs = [node.communicate(timeout=90) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    lines = sorted(line for out, _ in outputs for line in out.splitlines())
    assert lines == [f"{r} ['0', '0', '1', '1']" for r in range(4)]


def test_a_failure_on_one_node_stops_the_other(tmp_path):
    body = """
        import os, time
        if os.environ["RANK"] == "3":
            time.sleep(1)
            raise ValueError("rank three gives up")
        time.sleep(600)
    """
    job, port = script(tmp_path, body), free_port()
    start = time.monotonic()
    nodes = [launch_node(job, n, port) for n in (0, 1)]
    outputs = [node.communicate(timeout=60) for node in nodes]
    assert time.monotonic() - start < 30
    assert all(node.returncode != 0 for node in nodes), outputs
    assert "ValueError: rank three gives up" in outputs[1][1]
    assert "another node failed" in outputs[0][1]


def test_sigterm_reaches_every_process(tmp_path):
    body = """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (sys.stdout.write(f"term {os.environ['RANK']}\\n"), sys.exit(0)))
        sys.stdout.write("up\\n")  # one write: print's two, unbuffered, can interleave with the other process's
        time.sleep(600)
    """
    launcher = subprocess.Popen([sys.executable, "-m", "frost.distributed.run", "--launcher", "native",
                                 "--nproc-per-node", "2", "--master-port", str(free_port()),
                                 str(script(tmp_path, body))], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert [launcher.stdout.readline().strip() for _ in range(2)] == ["up", "up"]
    launcher.send_signal(signal.SIGTERM)
    out, _ = launcher.communicate(timeout=30)
    assert sorted(out.split()) == ["0", "1", "term", "term"]
    assert launcher.returncode == 128 + signal.SIGTERM


def test_sigint_stops_every_process_and_blames_none(tmp_path):
    """Ctrl-C's KeyboardInterrupt ends each process with status 1: that is the signal, not a failing rank."""
    body = """
        import sys, time
        sys.stdout.write("up\\n")
        time.sleep(600)
    """
    launcher = subprocess.Popen([sys.executable, "-m", "frost.distributed.run", "--launcher", "native",
                                 "--nproc-per-node", "2", "--master-port", str(free_port()),
                                 str(script(tmp_path, body))], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    assert [launcher.stdout.readline().strip() for _ in range(2)] == ["up", "up"]
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + signal.SIGINT, err
    assert "KeyboardInterrupt" in err and "exited with" not in err


def process_state(pid: int) -> str | None:
    """Its state letter in /proc (Z: ended, not yet reaped), None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_to_the_mpi_launcher_stops_every_rank(tmp_path, needs_mpi):
    body = """
        import os, sys, time
        sys.stdout.write(f"pid {os.getpid()}\\n")
        time.sleep(600)
    """
    launcher = subprocess.Popen([sys.executable, "-m", "frost.distributed.run", "--launcher", "mpi",
                                 "--nproc-per-node", "2", str(script(tmp_path, body))], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = [int(launcher.stdout.readline().split()[1]) for _ in range(2)]
    launcher.send_signal(signal.SIGTERM)
    launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM
    deadline = time.monotonic() + 20
    while any(process_state(pid) not in (None, "Z") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in pids if process_state(pid) not in (None, "Z")]
    for pid in alive:  # not left behind by a failing test
        os.kill(pid, signal.SIGKILL)
    assert not alive, "ranks outlived frost run"


def test_frost_run_is_a_frost_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "--nproc-per-node" in capsys.readouterr().out


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit, match="node-rank"):
        run.main(["--nnodes", "2", "--node-rank", "2", "x.py"])
