"""DistributedDataParallel on MPI with 2 and 3 processes equals one process trained on the concatenated batches
(float64, so that the comparison is of the math, not of summation orders): the seed's ResNet (with SyncBatchNorm)
and a small GPT, 20 AdamW steps, and gradient accumulation under no_sync()."""
import numpy as np
import pytest

import frost

import ddp_training as training
from dist_launch import HERE, frost_run


@pytest.mark.parametrize("model, world, accumulate", [("resnet", 3, 1), ("resnet", 2, 1), ("gpt", 1, 1), ("gpt", 2, 1),
                                                      ("gpt", 3, 1), ("gpt", 2, 3)])
def test_ddp_equals_one_process_on_the_whole_batch(tmp_path, needs_mpi, model, world, accumulate):
    done = frost_run("--launcher", "mpi", "--nproc-per-node", world, HERE / "ddp_training.py", model, tmp_path,
                     "--accumulate", accumulate)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_every_rank_equals(tmp_path, world, training.reference(model, world, accumulate))


def assert_every_rank_equals(out, world: int, expected: dict) -> None:
    for rank in range(world):
        got = np.load(out / f"rank{rank}.npz")
        assert sorted(got.files) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-10, atol=1e-12, err_msg=f"rank {rank}: {name}")


@pytest.mark.parametrize("model, world", [("gpt", 2), ("gpt", 3), ("resnet", 2)])
def test_zero1_equals_one_process_on_the_whole_batch(tmp_path, needs_mpi, model, world):
    done = frost_run("--launcher", "mpi", "--nproc-per-node", world, HERE / "ddp_training.py", model, tmp_path,
                     "--zero")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_every_rank_equals(tmp_path, world, training.reference(model, world))


@pytest.mark.parametrize("zero", [False, True])
def test_a_checkpoint_saved_by_rank_0_resumes_at_another_world_size(tmp_path, needs_mpi, zero):
    """10 steps on 2 processes, rank 0 saves; 10 more on 3 processes from the file: the 20 steps of one process.
    The global batch stays PER_PROCESS * 2 ... so the second part uses 3 processes on batches of 3 slices:
    the reference trains the same schedule."""
    checkpoint, flags = tmp_path / "ckpt.frost", ["--zero"] if zero else []
    first = frost_run("--launcher", "mpi", "--nproc-per-node", 2, HERE / "ddp_training.py", "gpt", tmp_path,
                      "--stop", 10, "--save", checkpoint, *flags)
    assert first.returncode == 0, first.stderr[-3000:]
    second = frost_run("--launcher", "mpi", "--nproc-per-node", 3, HERE / "ddp_training.py", "gpt", tmp_path,
                       "--start", 10, "--load", checkpoint, *flags)
    assert second.returncode == 0, second.stderr[-3000:]
    net = training.build("gpt")
    opt = frost.optim.AdamW(net.parameters(), **training.OPTIONS)
    training.train("gpt", net, opt, 2, None, steps=range(10))
    training.train("gpt", net, opt, 3, None, steps=range(10, 20))
    assert_every_rank_equals(tmp_path, 3, training.state_of(net))


def test_the_reference_differs_from_one_slice_alone():
    """The comparison above can fail: training on one process's slice alone ends elsewhere."""
    whole = training.reference("gpt", 2)
    net = training.build("gpt")
    training.train("gpt", net, frost.optim.AdamW(net.parameters(), **training.OPTIONS), 2, 0)
    alone = training.state_of(net)
    assert max(np.max(np.abs(alone[k] - whole[k])) for k in whole) > 1e-3


def test_collectives_on_three_processes(needs_mpi):
    done = frost_run("--launcher", "mpi", "--nproc-per-node", 3, HERE / "collectives_worker.py")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if "collectives ok" in line) == [
        f"rank {r} of 3: collectives ok" for r in range(3)]
