"""The training example runs as written (on a small generated CIFAR-10 in the official binary layout)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import write_cifar_binary

ROOT = Path(__file__).resolve().parents[1]


def test_train_cifar_example_runs_and_learns_the_generated_task(tmp_path):
    data = write_cifar_binary(tmp_path / "cifar", per_batch=100, n_test=200)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_cifar.py"), "--data", str(data),
                          "--steps", "60", "--workers", "2"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    accuracy = float(out.stdout.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 30.0, out.stdout  # 10 classes: chance is 10 %


@pytest.fixture(scope="module")
def train_cifar():
    """examples/train_cifar.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("train_cifar", ROOT / "examples" / "train_cifar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_cifar_example_is_reproducible_with_worker_threads(tmp_path, capsys, train_cifar):
    """Its random crops and flips run on the loader's worker threads: the same losses, bit for bit, run after run
    and with any number of workers (each batch draws from a generator of its own, seeded by the seed and the
    batch)."""
    data = write_cifar_binary(tmp_path / "cifar", per_batch=20, n_test=20)

    def last_loss(workers: int) -> str:
        train_cifar.main(["--data", str(data), "--steps", "6", "--workers", str(workers)])
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("train loss"))

    four = last_loss(4)
    assert last_loss(4) == four and last_loss(0) == four, four
