"""The training example runs as written (on a small generated CIFAR-10 in the official binary layout)."""
import subprocess
import sys
from pathlib import Path

from test_cli import write_cifar_binary

ROOT = Path(__file__).resolve().parents[1]


def test_train_cifar_example_runs_and_learns_the_generated_task(tmp_path):
    data = write_cifar_binary(tmp_path / "cifar", per_batch=100, n_test=200)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_cifar.py"), "--data", str(data),
                          "--steps", "60", "--workers", "2"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    accuracy = float(out.stdout.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 30.0, out.stdout  # 10 classes: chance is 10 %
